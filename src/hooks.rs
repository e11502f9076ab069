//! Test hooks, only in builds with the `test-hooks` feature (never in a
//! release): `TB.PANIC` panics on purpose, so a test can prove panics are
//! contained; `TB.FAULT step` makes one step of the next write fail, so a
//! test can prove a failed effect is reported, counted and never leaves a
//! replica different from its primary.

use crate::ffi::{Args, Ctx};
use crate::keyspace::Step;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use tb_core::args::Argv;

/// The armed step, 0 for none. Commands run on Redis's main thread.
static ARMED: AtomicU8 = AtomicU8::new(0);

const STEPS: [(&[u8], Step); 4] = [
    (b"hashset", Step::HashSet),
    (b"expire", Step::Expire),
    (b"delete", Step::Delete),
    (b"replicate", Step::Replicate),
];

fn code(step: Step) -> u8 {
    STEPS
        .iter()
        .position(|(_, s)| *s == step)
        .map_or(0, |i| i as u8 + 1)
}

/// True, once, when `step` was armed: the caller then behaves as if the
/// server's API call had failed.
pub fn injected(step: Step) -> bool {
    ARMED
        .compare_exchange(code(step), 0, Relaxed, Relaxed)
        .is_ok()
}

/// `TB.PANIC`: panics inside a handler.
pub fn panic(_ctx: &Ctx, _args: &Args) -> Result<(), String> {
    panic!("TB.PANIC was called (test-hooks build)")
}

/// `TB.FAULT hashset|expire|delete|replicate`: arms a one-shot failure;
/// replies 1.
pub fn fault(ctx: &Ctx, args: &Args) -> Result<(), String> {
    let step = STEPS
        .iter()
        .find(|(name, _)| args.count() == 2 && args.arg(1) == *name)
        .map(|(_, step)| *step)
        .ok_or("ERR usage: TB.FAULT hashset|expire|delete|replicate")?;
    ARMED.store(code(step), Relaxed);
    ctx.reply_int(1);
    Ok(())
}
