//! The lease handlers: TB.ACQUIRE, TB.RELEASE, TB.RENEW and TB.INFLIGHT.
//! Each parses its arguments (nothing is touched if they are wrong), opens
//! its key(s), reads the clock once, decides with `tb_core::lease` (and
//! `tb_core::charge` for TB.ACQUIRE's clauses), writes only what changed,
//! then replies.

use crate::charge::{self, open_clause};
use crate::commands::{key_at, reply_ints, MEMOS};
use crate::ffi::{log_warning, Args, Ctx};
use crate::keyspace::LeaseKey;
use crate::stats;
use tb_core::args::Argv;
use tb_core::error::{Error, Step};
use tb_core::lease::{self, Kind, Write, ACQUIRE_ID_INDEX, ID_INDEX};

/// Carries out a lease write, if any; a failed step is logged and becomes
/// the call's error reply, as for buckets.
fn write(key: &mut LeaseKey, write: Option<Write>) -> Result<(), Error> {
    let Some(write) = write else {
        return Ok(());
    };
    key.apply(&write).map_err(|step: Step| {
        log_warning(&format!(
            "tb: a lease write failed at {}; the call replied an error instead of its outcome",
            step.name()
        ));
        Error::WriteFailed(step)
    })
}

/// `TB.ACQUIRE key limit lease_ms id [weight] [BUCKET bkey max rate cost |
/// QUOTA qkey limit period cost [OFFSET minutes] ...]`: the lease and every
/// clause, or nothing.
pub fn acquire(ctx: &Ctx, args: &Args) -> Result<(), Error> {
    if ctx.wants_key_positions() {
        for pos in lease::acquire_key_positions(args) {
            ctx.key_at(pos);
        }
        return Ok(());
    }
    let call = lease::parse_acquire(args, MEMOS.get(args))?;
    let now = ctx.now_us();
    let id = key_at(args, ACQUIRE_ID_INDEX)?;
    let mut key = LeaseKey::open(ctx, key_at(args, 1)?, Some(id), true);
    let mut keys = Vec::with_capacity(call.clauses.len());
    let id_bytes = args.arg(ACQUIRE_ID_INDEX);
    let (taken, change) = lease::decide(&key, Some(id_bytes), now, Kind::Acquire, |leases| {
        // Clause by clause, as TB.CHARGE does, after the lease key: a bad
        // key stops the call before later keys are opened.
        keys.clear();
        let mut states = Vec::with_capacity(call.clauses.len());
        for (i, clause) in call.clauses.iter().enumerate() {
            match open_clause(ctx, args, clause) {
                Ok((state, opened)) => {
                    states.push(state);
                    keys.push(opened);
                }
                Err(e) => return Ok(Err(e.in_group(i + 1))),
            }
        }
        lease::acquire(leases, &call, &states).map(Ok)
    })?;
    let taken = taken?;
    // A denial writes only what a pass of a large key found.
    write(&mut key, change)?;
    if taken.acquired {
        for (opened, item) in keys.iter_mut().zip(&taken.items) {
            charge::apply(opened, &item.effect)?;
        }
        stats::ACQUIRED.incr();
    } else {
        stats::BUSY.incr();
    }
    ctx.reply_array(4 + taken.items.len());
    for v in taken.head {
        ctx.reply_int(v);
    }
    for item in &taken.items {
        reply_ints(ctx, &item.reply);
    }
    Ok(())
}

/// The steps TB.RELEASE, TB.RENEW and TB.INFLIGHT share: the lease key for
/// the id at `id_index` (none: TB.INFLIGHT), the decision, its write.
fn single<T>(
    ctx: &Ctx,
    args: &Args,
    id_index: Option<usize>,
    kind: Kind,
    op: impl FnMut(&mut lease::Leases) -> Result<T, lease::Unsure>,
) -> Result<T, Error> {
    let now = ctx.now_us();
    let id = id_index.map(|i| key_at(args, i)).transpose()?;
    let mut key = LeaseKey::open(ctx, key_at(args, 1)?, id, kind != Kind::Inflight);
    let id_bytes = id_index.map(|i| args.arg(i));
    let (result, change) = lease::decide(&key, id_bytes, now, kind, op)?;
    write(&mut key, change)?;
    Ok(result)
}

/// `TB.RELEASE key id`: `[released, in_use]`; an unknown or expired id
/// writes nothing (but what a pass of a large key found).
pub fn release(ctx: &Ctx, args: &Args) -> Result<(), Error> {
    lease::parse_release(args)?;
    let reply = single(ctx, args, Some(ID_INDEX), Kind::Release, lease::release)?;
    if reply[0] == 1 {
        stats::RELEASED.incr();
    }
    reply_ints(ctx, &reply);
    Ok(())
}

/// `TB.RENEW key id lease_ms`: `[renewed, expires_in_ms]`; a lease that is
/// not live is never recreated.
pub fn renew(ctx: &Ctx, args: &Args) -> Result<(), Error> {
    let lease_ms = lease::parse_renew(args)?;
    let reply = single(ctx, args, Some(ID_INDEX), Kind::Renew, |leases| {
        lease::renew(leases, lease_ms)
    })?;
    if reply[0] == 1 {
        stats::RENEWED.incr();
    }
    reply_ints(ctx, &reply);
    Ok(())
}

/// `TB.INFLIGHT key`: the live weight. Read-only.
pub fn inflight(ctx: &Ctx, args: &Args) -> Result<(), Error> {
    lease::parse_inflight(args)?;
    let in_use = single(
        ctx,
        args,
        None,
        Kind::Inflight,
        |leases| Ok(leases.in_use()),
    )?;
    stats::INFLIGHTS.incr();
    ctx.reply_int(in_use);
    Ok(())
}
