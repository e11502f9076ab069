//! Test hooks, only in builds with the `test-hooks` feature (never in a
//! release): `TB.PANIC` panics on purpose, so a test can prove panics are
//! contained; `TB.FAULT step` makes one step of the next write fail, so a
//! test can prove a failed effect is reported, counted and never leaves a
//! replica different from its primary.
//!
//! The write path (`keyspace`) knows nothing of this file: `install` hands
//! it the injector at load.

use crate::ffi::{Args, Ctx};
use crate::keyspace::{self, Fault};
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use tb_core::args::Argv;
use tb_core::error::{Arg, Error};

/// The armed step, 0 for none. Commands run on Redis's main thread.
static ARMED: AtomicU8 = AtomicU8::new(0);

const STEPS: [(&[u8], Fault); 5] = [
    (b"hashset", Fault::HashSet),
    (b"hdel", Fault::HashDelete),
    (b"expire", Fault::Expire),
    (b"delete", Fault::Delete),
    (b"replicate", Fault::Replicate),
];

fn code(fault: Fault) -> u8 {
    STEPS
        .iter()
        .position(|(_, f)| *f == fault)
        .map_or(0, |i| i as u8 + 1)
}

/// Gives the write path its injector.
pub fn install() {
    keyspace::set_fault_injector(injected);
}

/// True, once, when `fault` was armed: the caller then behaves as if the
/// server's API call had failed.
fn injected(fault: Fault) -> bool {
    ARMED
        .compare_exchange(code(fault), 0, Relaxed, Relaxed)
        .is_ok()
}

/// `TB.PANIC`: panics inside a handler.
pub fn panic(_ctx: &Ctx, _args: &Args) -> Result<(), Error> {
    panic!("TB.PANIC was called (test-hooks build)")
}

/// `TB.FAULT hashset|hdel|expire|delete|replicate`: arms a one-shot failure;
/// replies 1.
pub fn fault(ctx: &Ctx, args: &Args) -> Result<(), Error> {
    if args.count() != 2 {
        return Err(Error::Arity(args.command()));
    }
    let (_, fault) = STEPS
        .iter()
        .find(|(name, _)| args.arg(1) == *name)
        .ok_or(Error::OneOf(
            Arg::Step,
            "hashset, hdel, expire, delete, replicate",
        ))?;
    ARMED.store(code(*fault), Relaxed);
    ctx.reply_int(1);
    Ok(())
}
