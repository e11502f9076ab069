//! The lease handlers: TB.ACQUIRE, TB.RELEASE, TB.RENEW and TB.INFLIGHT.
//! Each parses its arguments (nothing is touched if they are wrong), opens
//! its key(s), reads the clock once, decides with `tb_core::lease` (and
//! `tb_core::bucket` for TB.ACQUIRE's buckets), writes only what changed,
//! then replies.

use crate::commands::{apply, key_at, reply_ints, reply_outcome};
use crate::ffi::{log_warning, Args, Ctx};
use crate::keyspace::{BucketKey, LeaseKey};
use crate::stats;
use tb_core::bucket::{consume_all_if, Limits, Stored};
use tb_core::error::{Error, Step};
use tb_core::lease::{self, Scan, Write, ACQUIRE_ID_INDEX, ID_INDEX};

/// Carries out a lease write; a failed step is logged and becomes the
/// call's error reply, as for buckets.
fn write(
    key: &mut LeaseKey,
    write: &Write,
    args: &Args,
    id_index: usize,
    scan: &Scan,
) -> Result<(), Error> {
    let id = key_at(args, id_index)?;
    key.apply(write, &id, &scan.expired).map_err(|step: Step| {
        log_warning(&format!(
            "tb: a lease write failed at {}; the call replied an error instead of its outcome",
            step.name()
        ));
        Error::WriteFailed(step)
    })
}

/// `TB.ACQUIRE key limit lease_ms id [weight] [BUCKET bkey max rate cost
/// ...]`: the lease and every bucket, or nothing.
pub fn acquire(ctx: &Ctx, args: &Args) -> Result<(), Error> {
    if ctx.wants_key_positions() {
        for pos in lease::acquire_key_positions(args) {
            ctx.key_at(pos);
        }
        return Ok(());
    }
    let call = lease::parse_acquire(args)?;
    let now = ctx.now_us();
    let mut key = LeaseKey::open(ctx, key_at(args, 1)?, true);
    let id_bytes = tb_core::args::Argv::arg(args, ACQUIRE_ID_INDEX);
    let mut scan = Scan::new(Some(id_bytes), now);
    key.scan(&mut scan)?;
    // Bucket by bucket, as TB.MCONSUME does: a bad key stops the call
    // before later keys are opened.
    let mut keys = Vec::with_capacity(call.buckets.len());
    let mut buckets: Vec<(Limits, Option<Stored>, f64)> = Vec::with_capacity(call.buckets.len());
    for (i, group) in call.buckets.iter().enumerate() {
        let bucket = BucketKey::open(ctx, key_at(args, group.key_index)?, true);
        let stored = bucket.load().map_err(|e| e.in_group(i + 1))?;
        keys.push(bucket);
        buckets.push((group.limits, stored, group.cost));
    }
    let taken = lease::acquire(&scan, &call);
    let (buckets_pay, bucket_retry, outcomes) = consume_all_if(&buckets, now, taken.fits);
    let acquired = taken.fits && buckets_pay;
    if acquired {
        write(&mut key, &taken.write, args, ACQUIRE_ID_INDEX, &scan)?;
        for (bucket, outcome) in keys.iter_mut().zip(&outcomes) {
            apply(bucket, &outcome.effect)?;
        }
        stats::ACQUIRED.incr();
    } else {
        stats::BUSY.incr();
    }
    ctx.reply_array(4 + outcomes.len());
    ctx.reply_int(i64::from(acquired));
    if acquired {
        ctx.reply_int(taken.in_use_if_taken);
        ctx.reply_int(0);
        ctx.reply_int(taken.expires_in_ms(now));
    } else {
        ctx.reply_int(taken.in_use_if_not);
        ctx.reply_int(taken.retry_after_ms.max(bucket_retry));
        ctx.reply_int(0);
    }
    for outcome in &outcomes {
        reply_outcome(ctx, outcome);
    }
    Ok(())
}

/// `TB.RELEASE key id`: `[released, in_use]`; an unknown or expired id
/// writes nothing.
pub fn release(ctx: &Ctx, args: &Args) -> Result<(), Error> {
    lease::parse_release(args)?;
    let now = ctx.now_us();
    let mut key = LeaseKey::open(ctx, key_at(args, 1)?, true);
    let mut scan = Scan::new(Some(tb_core::args::Argv::arg(args, ID_INDEX)), now);
    key.scan(&mut scan)?;
    let (released, in_use, change) = lease::release(&scan);
    write(&mut key, &change, args, ID_INDEX, &scan)?;
    if released {
        stats::RELEASED.incr();
    }
    reply_ints(ctx, &[i64::from(released), in_use]);
    Ok(())
}

/// `TB.RENEW key id lease_ms`: `[renewed, expires_in_ms]`; a lease that is
/// not live is never recreated.
pub fn renew(ctx: &Ctx, args: &Args) -> Result<(), Error> {
    let lease_ms = lease::parse_renew(args)?;
    let now = ctx.now_us();
    let mut key = LeaseKey::open(ctx, key_at(args, 1)?, true);
    let mut scan = Scan::new(Some(tb_core::args::Argv::arg(args, ID_INDEX)), now);
    key.scan(&mut scan)?;
    let (renewed, expires_in_ms, change) = lease::renew(&scan, lease_ms);
    write(&mut key, &change, args, ID_INDEX, &scan)?;
    if renewed {
        stats::RENEWED.incr();
    }
    reply_ints(ctx, &[i64::from(renewed), expires_in_ms]);
    Ok(())
}

/// `TB.INFLIGHT key`: the live weight. Read-only.
pub fn inflight(ctx: &Ctx, args: &Args) -> Result<(), Error> {
    lease::parse_inflight(args)?;
    let now = ctx.now_us();
    let key = LeaseKey::open(ctx, key_at(args, 1)?, false);
    let mut scan = Scan::new(None, now);
    key.scan(&mut scan)?;
    stats::INFLIGHTS.incr();
    ctx.reply_int(scan.in_use());
    Ok(())
}
