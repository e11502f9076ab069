//! The quota handlers: TB.QUOTA, TB.QPEEK and TB.QADJUST. The same steps
//! as the bucket commands (`commands`): parse (nothing is touched if the
//! arguments are wrong), open the key, read the clock once, decide with
//! `tb_core::quota`, write only what changed, reply.

use crate::commands::{key_at, reply_ints};
use crate::ffi::{log_warning, Args, Ctx};
use crate::keyspace::QuotaKey;
use crate::stats;
use tb_core::error::Error;
use tb_core::quota::{parse_qadjust, parse_quota, Effect, Outcome, QuotaCall};

/// Opens the key of a parsed call, reads the clock and the quota, and
/// gives the decision.
fn decide<'c>(
    ctx: &'c Ctx,
    args: &Args<'c>,
    call: Result<QuotaCall, Error>,
    write: bool,
    decide: impl FnOnce(&QuotaCall, Option<tb_core::quota::Stored>, i64) -> Outcome,
) -> Result<(QuotaKey<'c>, Outcome), Error> {
    let call = call?;
    let key = QuotaKey::open(ctx, key_at(args, 1)?, write);
    let now = ctx.now_us();
    let stored = key.load()?;
    Ok((key, decide(&call, stored, now)))
}

/// Carries out `effect` on `key`; a step that fails is logged and becomes
/// the call's error reply, as for buckets.
pub fn apply(key: &mut QuotaKey, effect: &Effect) -> Result<(), Error> {
    key.apply(effect).map_err(|step| {
        log_warning(&format!(
            "tb: a quota write failed at {}; the call replied an error instead of its outcome",
            step.name()
        ));
        Error::WriteFailed(step)
    })
}

/// Writes the outcome's effect, then replies.
fn finish(ctx: &Ctx, key: &mut QuotaKey, outcome: &Outcome) -> Result<(), Error> {
    apply(key, &outcome.effect)?;
    reply_ints(ctx, &outcome.reply());
    Ok(())
}

/// `TB.QUOTA key limit period [cost] [OFFSET minutes]`. A denial, or a
/// cost of 0, writes nothing.
#[inline(never)]
pub fn quota(ctx: &Ctx, args: &Args) -> Result<(), Error> {
    let (mut key, outcome) = decide(ctx, args, parse_quota(args), true, |c, s, now| {
        c.quota.consume(s, now, c.amount, true)
    })?;
    finish(ctx, &mut key, &outcome)?;
    if outcome.allowed {
        stats::ADMITTED.incr();
    } else {
        stats::DENIED.incr();
    }
    Ok(())
}

/// `TB.QPEEK key limit period [cost] [OFFSET minutes]`: read-only.
#[inline(never)]
pub fn qpeek(ctx: &Ctx, args: &Args) -> Result<(), Error> {
    let (_key, outcome) = decide(ctx, args, parse_quota(args), false, |c, s, now| {
        c.quota.consume(s, now, c.amount, false)
    })?;
    stats::PEEKS.incr();
    reply_ints(ctx, &outcome.reply());
    Ok(())
}

/// `TB.QADJUST key limit period delta [OFFSET minutes]`: a refund (delta
/// > 0) or a charge after the fact, in the current period only.
#[inline(never)]
pub fn qadjust(ctx: &Ctx, args: &Args) -> Result<(), Error> {
    let (mut key, outcome) = decide(ctx, args, parse_qadjust(args), true, |c, s, now| {
        c.quota.adjust(s, now, c.amount)
    })?;
    finish(ctx, &mut key, &outcome)?;
    stats::ADJUSTS.incr();
    Ok(())
}
