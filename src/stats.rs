//! Counters shown by `INFO tb` as `tb_*` fields (redis_exporter exports them
//! through contrib/prometheus/tb-collect.lua), with the module's version.

use redis_module::{InfoContext, RedisResult};
use redis_module_macros::info_command_handler;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// One counter per INFO field. Atomics only because statics must be Sync;
/// commands run on Redis's main thread.
pub struct Counter(AtomicU64);

impl Counter {
    const fn new() -> Self {
        Counter(AtomicU64::new(0))
    }
    pub fn incr(&self) {
        self.0.fetch_add(1, Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// Calls (TB.CONSUME or TB.MCONSUME) that were admitted.
pub static ADMITTED: Counter = Counter::new();
/// Calls (TB.CONSUME or TB.MCONSUME) that were denied.
pub static DENIED: Counter = Counter::new();
/// TB.PEEK calls answered.
pub static PEEKS: Counter = Counter::new();
/// TB.ADJUST calls applied.
pub static ADJUSTS: Counter = Counter::new();
/// Calls of any TB command that the module answered with an error.
pub static ERRORS: Counter = Counter::new();
/// Panics caught in a handler (each also counts as an error).
pub static PANICS: Counter = Counter::new();

/// The `INFO tb` section. Its empty name makes the section the module's
/// own (`# tb`), and Redis prefixes each field with `tb_`.
#[info_command_handler]
fn info(ctx: &InfoContext, _for_crash_report: bool) -> RedisResult<()> {
    ctx.builder()
        .add_section("")
        .field("version", env!("CARGO_PKG_VERSION"))?
        .field("admitted", ADMITTED.get())?
        .field("denied", DENIED.get())?
        .field("peeks", PEEKS.get())?
        .field("adjusts", ADJUSTS.get())?
        .field("errors", ERRORS.get())?
        .field("panics", PANICS.get())?
        .build_section()?
        .build_info()?;
    Ok(())
}
