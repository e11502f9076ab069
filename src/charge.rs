//! TB.CHARGE: buckets and quotas in one all-or-nothing call, with `WAIT`
//! for reservations. The steps of TB.MCONSUME (`commands`): parse, then
//! key by key open, read and check (a bad key stops the call before later
//! keys are opened), decide with `tb_core::charge`, write what changed,
//! reply `[allowed, retry_after_ms, each key's reply...]`.

use crate::commands::{self, key_at, reply_ints, MEMOS};
use crate::ffi::{Args, Ctx};
use crate::keyspace::{BucketKey, QuotaKey};
use crate::{quotas, stats};
use tb_core::charge::{self, charge_key_positions, parse_charge, Clause, Effect, Limit, State};
use tb_core::error::Error;

/// A clause's key, open by its kind.
pub enum Opened<'c> {
    Bucket(BucketKey<'c>),
    Quota(QuotaKey<'c>),
}

/// Opens a clause's key for writing and reads it by its clause's kind
/// (TB.CHARGE's and TB.ACQUIRE's).
pub fn open_clause<'c>(
    ctx: &'c Ctx,
    args: &'c Args,
    clause: &Clause,
) -> Result<(State, Opened<'c>), Error> {
    let name = key_at(args, clause.key_index)?;
    Ok(match clause.limit {
        Limit::Bucket(_) => {
            let key = BucketKey::open(ctx, name, true);
            (State::Bucket(key.load()?), Opened::Bucket(key))
        }
        Limit::Quota(_) => {
            let key = QuotaKey::open(ctx, name, true);
            (State::Quota(key.load()?), Opened::Quota(key))
        }
    })
}

/// Carries out a clause's effect on its key.
pub fn apply(key: &mut Opened, effect: &Effect) -> Result<(), Error> {
    match (key, effect) {
        (Opened::Bucket(key), Effect::Bucket(effect)) => commands::apply(key, effect),
        (Opened::Quota(key), Effect::Quota(effect)) => quotas::apply(key, effect),
        _ => Err(Error::Internal("a clause's effect is of another kind")),
    }
}

/// `TB.CHARGE numkeys key [key ...] [WAIT max_ms] BUCKET max rate cost |
/// QUOTA limit period cost [OFFSET minutes] ...`.
#[inline(never)]
pub fn charge(ctx: &Ctx, args: &Args) -> Result<(), Error> {
    if ctx.wants_key_positions() {
        for pos in charge_key_positions(args) {
            ctx.key_at(pos);
        }
        return Ok(());
    }
    let call = parse_charge(args, MEMOS.get(args))?;
    let now = ctx.now_us();
    let mut keys = Vec::with_capacity(call.clauses.len());
    let mut states = Vec::with_capacity(call.clauses.len());
    for (i, clause) in call.clauses.iter().enumerate() {
        let (state, opened) = open_clause(ctx, args, clause).map_err(|e| e.in_group(i + 1))?;
        states.push(state);
        keys.push(opened);
    }
    let (all, retry, items) = charge::decide(&call, &states, now);
    for (key, item) in keys.iter_mut().zip(&items) {
        apply(key, &item.effect)?;
    }
    if all {
        stats::ADMITTED.incr();
    } else {
        stats::DENIED.incr();
    }
    ctx.reply_array(2 + items.len());
    ctx.reply_int(i64::from(all));
    ctx.reply_int(retry);
    for item in &items {
        reply_ints(ctx, &item.reply);
    }
    Ok(())
}
