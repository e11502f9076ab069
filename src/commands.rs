//! The bucket command handlers: TB.CONSUME, TB.PEEK, TB.ADJUST,
//! TB.MCONSUME and CL.THROTTLE. Each one follows the same steps: parse the
//! arguments (nothing is touched if they are wrong), open the key(s), read
//! the clock once, compute with `tb_core::bucket`, carry out the effects
//! (only if something changed), then reply. The lease handlers
//! (`leases`) use its argument memos and its shared steps (`apply`,
//! `key_at`, the replies).
//!
//! Each handler stays a function of its own (`inline(never)`), even with
//! link-time optimisation: profiles, and `make bench`'s split of a call
//! into Redis's side and the module's, find a command by its symbol.

use crate::ffi::{log_warning, ArgString, Args, CommandLocal, Ctx};
use crate::keyspace::BucketKey;
use crate::stats;
use tb_core::args::{parse_adjust, parse_consume, parse_mconsume, Memos, Single};
use tb_core::bucket::{consume_all, Effect, Limits, Outcome, Stored};
use tb_core::cell::{self as cl, parse_throttle};
use tb_core::error::Error;

/// The argument memos of every command call, lent to each parser beside
/// the arguments (see `tb_core::args::Memos`).
pub static MEMOS: CommandLocal<Memos> = CommandLocal::new(Memos::new());

/// Carries out `effect` on `key`. A step that fails is logged and
/// becomes the call's error reply (counted in `tb_errors`).
pub fn apply(key: &mut BucketKey, effect: &Effect) -> Result<(), Error> {
    key.apply(effect).map_err(|step| {
        log_warning(&format!(
            "tb: a write failed at {}; the call replied an error instead of its outcome",
            step.name()
        ));
        Error::WriteFailed(step)
    })
}

/// Replies with an array of integers.
pub fn reply_ints(ctx: &Ctx, values: &[i64]) {
    ctx.reply_array(values.len());
    for &v in values {
        ctx.reply_int(v);
    }
}

/// Replies with `[allowed, remaining, retry_after_ms, reset_after_ms]`.
pub fn reply_outcome(ctx: &Ctx, outcome: &Outcome) {
    reply_ints(ctx, &outcome.reply());
}

/// The key at `argv[i]`, which the parser has already found there.
pub fn key_at<'a>(args: &Args<'a>, i: usize) -> Result<ArgString<'a>, Error> {
    args.string(i).ok_or(Error::Internal("no key argument"))
}

/// A single-key call after its shared first steps: arguments parsed, key
/// open (for writing too if `write`), clock read once, bucket loaded.
/// Nothing is written on any error. Inlined, so the parser is a known
/// call and its result is not moved through a returned tuple.
#[inline(always)]
fn open_single<'c>(
    ctx: &'c Ctx,
    args: &Args<'c>,
    parse: fn(&Args<'c>, &Memos) -> Result<Single, Error>,
    write: bool,
) -> Result<(Single, BucketKey<'c>, i64, Option<Stored>), Error> {
    let call = parse(args, MEMOS.get(args))?;
    let key = BucketKey::open(ctx, key_at(args, 1)?, write);
    let now = ctx.now_us();
    let stored = key.load()?;
    Ok((call, key, now, stored))
}

/// A writer's last steps: the effect, its counter, the reply.
fn finish(
    ctx: &Ctx,
    key: &mut BucketKey,
    effect: &Effect,
    counter: &stats::Counter,
    reply: &[i64; 4],
) -> Result<(), Error> {
    apply(key, effect)?;
    counter.incr();
    reply_ints(ctx, reply);
    Ok(())
}

/// `TB.CONSUME key max rate [cost] [WAIT max_ms]`. A denied call, or one
/// with cost 0, writes and replicates nothing; with `WAIT`, a bucket short
/// of `cost` may admit a reservation (`Limits::reserve`).
#[inline(never)]
pub fn consume(ctx: &Ctx, args: &Args) -> Result<(), Error> {
    let (call, mut key, now, stored) = open_single(ctx, args, parse_consume, true)?;
    // A new key: the tier's charge and reply were worked out with its
    // arguments; only the write's times are this call's.
    if let (None, Some(fresh)) = (stored, call.fresh) {
        if let Some(effect) = Limits::fresh_write(fresh, now) {
            return finish(ctx, &mut key, &effect, &stats::ADMITTED, &fresh.reply());
        }
    }
    let outcome = match call.wait_ms {
        None => call.limits.consume(stored, now, call.amount),
        Some(max_ms) => call.limits.reserve(stored, now, call.amount, max_ms, true),
    };
    let counter = if outcome.allowed {
        &stats::ADMITTED
    } else {
        &stats::DENIED
    };
    finish(ctx, &mut key, &outcome.effect, counter, &outcome.reply())
}

/// `TB.PEEK key max rate [cost] [WAIT max_ms]`: read-only, runs on
/// replicas.
#[inline(never)]
pub fn peek(ctx: &Ctx, args: &Args) -> Result<(), Error> {
    let (call, _key, now, stored) = open_single(ctx, args, parse_consume, false)?;
    stats::PEEKS.incr();
    let outcome = match call.wait_ms {
        None => call.limits.peek(stored, now, call.amount),
        Some(max_ms) => call.limits.reserve(stored, now, call.amount, max_ms, false),
    };
    reply_outcome(ctx, &outcome);
    Ok(())
}

/// `TB.ADJUST key max rate delta`: refund (delta > 0) or charge after the
/// fact (delta < 0, down to -max). Always applies.
#[inline(never)]
pub fn adjust(ctx: &Ctx, args: &Args) -> Result<(), Error> {
    let (call, mut key, now, stored) = open_single(ctx, args, parse_adjust, true)?;
    let outcome = call.limits.adjust(stored, now, call.amount);
    finish(
        ctx,
        &mut key,
        &outcome.effect,
        &stats::ADJUSTS,
        &outcome.reply(),
    )
}

/// `TB.MCONSUME key max rate cost [key max rate cost ...]`: all buckets are
/// charged, or none is.
#[inline(never)]
pub fn mconsume(ctx: &Ctx, args: &Args) -> Result<(), Error> {
    let groups = parse_mconsume(args, MEMOS.get(args))?;
    let now = ctx.now_us();
    // Group by group: open, read, check. Opening a key whose TTL has passed
    // deletes it (lazy expiry), so a bad group stops the call before any
    // later group's key is opened.
    let mut keys = Vec::with_capacity(groups.len());
    let mut buckets: Vec<(Limits, Option<Stored>, f64)> = Vec::with_capacity(groups.len());
    for (i, group) in groups.iter().enumerate() {
        let key = BucketKey::open(ctx, key_at(args, group.key_index)?, true);
        let stored = key.load().map_err(|e| e.in_group(i + 1))?;
        keys.push(key);
        buckets.push((group.limits, stored, group.cost));
    }
    let (all, retry, outcomes) = consume_all(&buckets, now);
    for (key, outcome) in keys.iter_mut().zip(&outcomes) {
        apply(key, &outcome.effect)?;
    }
    if all {
        stats::ADMITTED.incr();
    } else {
        stats::DENIED.incr();
    }
    ctx.reply_array(2 + outcomes.len());
    ctx.reply_int(i64::from(all));
    ctx.reply_int(retry);
    for outcome in &outcomes {
        reply_outcome(ctx, outcome);
    }
    Ok(())
}

/// `CL.THROTTLE key max_burst count period [quantity]`: redis-cell's
/// command and reply, on the same bucket as TB.CONSUME (capacity
/// `max_burst + 1`, `count / period` per second). A key redis-cell left is
/// read as that bucket and converted on the next write. A denial, a
/// quantity of 0 or one above the limit writes nothing.
#[inline(never)]
pub fn cl_throttle(ctx: &Ctx, args: &Args) -> Result<(), Error> {
    let call = parse_throttle(args)?;
    let mut key = BucketKey::open(ctx, key_at(args, 1)?, true);
    let now = ctx.now_us();
    let stored = key.load_cell(&call.limits, now)?;
    let (outcome, charged) = match call.cost() {
        Some(cost) => (call.limits.consume(stored, now, cost), true),
        // Above the limit: never passes; the bucket as it stands.
        None => (call.limits.peek(stored, now, 0.0), false),
    };
    apply(&mut key, &outcome.effect)?;
    if charged && outcome.allowed {
        stats::ADMITTED.incr();
    } else {
        stats::DENIED.incr();
    }
    reply_ints(ctx, &cl::reply(&call, &outcome, charged));
    Ok(())
}
