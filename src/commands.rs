//! The command handlers. Each one follows the same steps: parse the
//! arguments (nothing is touched if they are wrong), open the key(s), read
//! the clock once, compute with `tb_core::bucket`, carry out the effects
//! (only if something changed), then reply.

use crate::clock;
use crate::guard;
use crate::keyspace::{Args, BucketKey, KeyError};
use crate::reply::{log_warning, reply_array, reply_int, reply_outcome};
use crate::stats;
use redis_module::raw::{RedisModuleCtx, RedisModuleString};
use std::os::raw::c_int;
use tb_core::args::{parse_adjust, parse_consume, parse_mconsume, ArgError, Single};
use tb_core::bucket::{consume_all, Outcome, Stored};

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

fn key_error(e: KeyError, group: Option<usize>) -> String {
    match (e, group) {
        (KeyError::WrongType, _) => WRONGTYPE.to_string(),
        (KeyError::State(s), None) => s.message().to_string(),
        (KeyError::State(s), Some(g)) => format!("{} (group {g})", s.message()),
    }
}

/// Carries out `outcome`'s effect on `key`. A step that fails is logged
/// and becomes the call's error reply (counted in `tb_errors`).
fn apply(key: &BucketKey, outcome: &Outcome) -> Result<(), String> {
    key.apply(&outcome.effect).map_err(|step| {
        log_warning(&format!(
            "tb: a write failed at {step}; the call replied an error instead of its outcome"
        ));
        format!("ERR tb could not write the bucket: {step} failed, see the server log")
    })
}

/// A single-key call after its shared first steps: arguments parsed, key
/// open (for writing too if `write`), clock read once, bucket loaded.
struct SingleCall {
    call: Single,
    key: BucketKey,
    now: i64,
    stored: Option<Stored>,
}

/// Parses with `parse` (errors name `command`), opens `argv[1]` and loads
/// the bucket. Nothing is written on any error.
fn open_single(
    ctx: *mut RedisModuleCtx,
    args: &Args,
    command: &str,
    parse: fn(&Args) -> Result<Single, ArgError>,
    write: bool,
) -> Result<SingleCall, String> {
    let call = parse(args).map_err(|e| e.message(command))?;
    let key = BucketKey::open(ctx, args.raw(1), write);
    let now = clock::now_us();
    let stored = key.load().map_err(|e| key_error(e, None))?;
    Ok(SingleCall {
        call,
        key,
        now,
        stored,
    })
}

/// `TB.CONSUME key max rate [cost]`. A denied call, or one with cost 0,
/// writes and replicates nothing.
pub extern "C" fn consume(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    guard::run(ctx, || {
        let args = Args::new(argv, argc);
        let s = open_single(ctx, &args, "tb.consume", parse_consume, true)?;
        let outcome = s.call.limits.consume(s.stored, s.now, s.call.amount);
        apply(&s.key, &outcome)?;
        if outcome.allowed {
            stats::ADMITTED.incr();
        } else {
            stats::DENIED.incr();
        }
        reply_outcome(ctx, &outcome);
        Ok(())
    })
}

/// `TB.PEEK key max rate [cost]`: read-only, runs on replicas.
pub extern "C" fn peek(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    guard::run(ctx, || {
        let args = Args::new(argv, argc);
        let s = open_single(ctx, &args, "tb.peek", parse_consume, false)?;
        let outcome = s.call.limits.peek(s.stored, s.now, s.call.amount);
        stats::PEEKS.incr();
        reply_outcome(ctx, &outcome);
        Ok(())
    })
}

/// `TB.ADJUST key max rate delta`: refund (delta > 0) or charge after the
/// fact (delta < 0, down to -max). Always applies.
pub extern "C" fn adjust(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    guard::run(ctx, || {
        let args = Args::new(argv, argc);
        let s = open_single(ctx, &args, "tb.adjust", parse_adjust, true)?;
        let outcome = s.call.limits.adjust(s.stored, s.now, s.call.amount);
        apply(&s.key, &outcome)?;
        stats::ADJUSTS.incr();
        reply_outcome(ctx, &outcome);
        Ok(())
    })
}

/// `TB.MCONSUME key max rate cost [key max rate cost ...]`: all buckets are
/// charged, or none is.
pub extern "C" fn mconsume(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    guard::run(ctx, || {
        let args = Args::new(argv, argc);
        let groups = parse_mconsume(&args).map_err(|e| e.message("tb.mconsume"))?;
        let now = clock::now_us();
        // Group by group: open, read, check. Opening a key whose TTL has
        // passed deletes it (lazy expiry), so a bad group stops the call
        // before any later group's key is opened.
        let mut keys = Vec::with_capacity(groups.len());
        let mut buckets = Vec::with_capacity(groups.len());
        for (i, group) in groups.iter().enumerate() {
            let key = BucketKey::open(ctx, args.raw(group.key_index), true);
            let stored = key.load().map_err(|e| key_error(e, Some(i + 1)))?;
            keys.push(key);
            buckets.push((group.limits, stored, group.cost));
        }
        let (all, retry, outcomes) = consume_all(&buckets, now);
        for (key, outcome) in keys.iter().zip(&outcomes) {
            apply(key, outcome)?;
        }
        if all {
            stats::ADMITTED.incr();
        } else {
            stats::DENIED.incr();
        }
        reply_array(ctx, 2 + outcomes.len());
        reply_int(ctx, i64::from(all));
        reply_int(ctx, retry);
        for outcome in &outcomes {
            reply_outcome(ctx, outcome);
        }
        Ok(())
    })
}
