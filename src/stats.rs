//! Counters shown by `INFO tb` as `tb_*` fields (scraped by redis_exporter).

use redis_module::raw::{self, RedisModuleInfoCtx};
use std::os::raw::c_int;
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
/// Calls of any TB command that returned an error.
pub static ERRORS: Counter = Counter::new();
/// Panics caught in a handler (each also counts as an error).
pub static PANICS: Counter = Counter::new();

/// `RedisModuleInfoFunc`: one section named after the module, so `INFO tb`
/// shows `tb_admitted:...` and so on.
pub extern "C" fn info(ctx: *mut RedisModuleInfoCtx, _for_crash_report: c_int) {
    let fields: [(&std::ffi::CStr, &Counter); 6] = [
        (c"admitted", &ADMITTED),
        (c"denied", &DENIED),
        (c"peeks", &PEEKS),
        (c"adjusts", &ADJUSTS),
        (c"errors", &ERRORS),
        (c"panics", &PANICS),
    ];
    unsafe {
        let (Some(section), Some(field)) = (
            raw::RedisModule_InfoAddSection,
            raw::RedisModule_InfoAddFieldULongLong,
        ) else {
            return;
        };
        section(ctx, std::ptr::null());
        for (name, counter) in fields {
            field(ctx, name.as_ptr(), counter.get());
        }
    }
}
