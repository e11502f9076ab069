//! Test hooks, only in builds with the `test-hooks` feature (never in a
//! release): `TB.PANIC` panics on purpose, so a test can prove panics are
//! contained; `TB.FAULT step` makes one step of the next write fail, so a
//! test can prove a failed effect is reported, counted and never leaves a
//! replica different from its primary.

use crate::guard;
use crate::keyspace::{Args, Step};
use crate::reply::reply_int;
use redis_module::raw::{RedisModuleCtx, RedisModuleString};
use std::os::raw::c_int;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use tb_core::args::Argv;

/// The armed step, 0 for none. Commands run on Redis's main thread.
static ARMED: AtomicU8 = AtomicU8::new(0);

fn code(step: Step) -> u8 {
    match step {
        Step::HashSet => 1,
        Step::Expire => 2,
        Step::Delete => 3,
        Step::Replicate => 4,
    }
}

/// True, once, when `step` was armed: the caller then behaves as if the
/// server's API call had failed.
pub fn injected(step: Step) -> bool {
    ARMED
        .compare_exchange(code(step), 0, Relaxed, Relaxed)
        .is_ok()
}

/// `TB.PANIC`: panics inside a handler.
pub extern "C" fn panic(
    ctx: *mut RedisModuleCtx,
    _argv: *mut *mut RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard::run(ctx, || panic!("TB.PANIC was called (test-hooks build)"))
}

/// `TB.FAULT hashset|expire|delete|replicate`: arms a one-shot failure;
/// replies 1.
pub extern "C" fn fault(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    guard::run(ctx, || {
        let args = Args::new(argv, argc);
        let step = match (
            args.count(),
            args.count().checked_sub(1).map(|i| args.arg(i)),
        ) {
            (2, Some(b"hashset")) => Step::HashSet,
            (2, Some(b"expire")) => Step::Expire,
            (2, Some(b"delete")) => Step::Delete,
            (2, Some(b"replicate")) => Step::Replicate,
            _ => return Err("ERR usage: TB.FAULT hashset|expire|delete|replicate".into()),
        };
        ARMED.store(code(step), Relaxed);
        reply_int(ctx, 1);
        Ok(())
    })
}
