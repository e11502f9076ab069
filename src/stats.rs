//! Counters shown by `INFO tb` as `tb_*` fields (redis_exporter exports them
//! through contrib/prometheus/tb-collect.lua), with the module's version.

use crate::ffi::Info;
use crate::{eviction, version};
use std::ffi::CStr;
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

/// Calls (TB.CONSUME, TB.MCONSUME, TB.QUOTA, TB.CHARGE or CL.THROTTLE)
/// that were admitted.
pub static ADMITTED: Counter = Counter::new();
/// The same calls, denied.
pub static DENIED: Counter = Counter::new();
/// TB.PEEK and TB.QPEEK calls answered.
pub static PEEKS: Counter = Counter::new();
/// TB.ADJUST and TB.QADJUST calls applied.
pub static ADJUSTS: Counter = Counter::new();
/// Calls of any TB command that the module answered with an error.
pub static ERRORS: Counter = Counter::new();
/// Panics caught in a handler (each also counts as an error).
pub static PANICS: Counter = Counter::new();
/// TB.ACQUIRE calls that took their lease.
pub static ACQUIRED: Counter = Counter::new();
/// TB.ACQUIRE calls denied (no room, or a bucket could not pay).
pub static BUSY: Counter = Counter::new();
/// TB.RELEASE calls that gave a live lease back.
pub static RELEASED: Counter = Counter::new();
/// TB.RENEW calls that extended a live lease.
pub static RENEWED: Counter = Counter::new();
/// TB.INFLIGHT calls answered.
pub static INFLIGHTS: Counter = Counter::new();

/// The fields, in the order INFO shows them.
const COUNTERS: [(&CStr, &Counter); 11] = [
    (c"admitted", &ADMITTED),
    (c"denied", &DENIED),
    (c"peeks", &PEEKS),
    (c"adjusts", &ADJUSTS),
    (c"errors", &ERRORS),
    (c"panics", &PANICS),
    (c"acquired", &ACQUIRED),
    (c"busy", &BUSY),
    (c"released", &RELEASED),
    (c"renewed", &RENEWED),
    (c"inflights", &INFLIGHTS),
];

/// The `INFO tb` section: the module's own (`# tb`), and Redis prefixes
/// each field with `tb_`.
pub fn info(info: &mut Info) {
    info.section();
    info.text(c"version", version::TEXT);
    for (name, counter) in COUNTERS {
        info.count(name, counter.get());
    }
    info.text(c"maxmemory_policy", &eviction::policy());
    info.count(c"eviction_risk", eviction::risk());
}
