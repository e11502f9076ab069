//! The server clock, read once per command.

use redis_module::raw;
use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch, from the server's own clock.
///
/// Redis >= 7.2 and Valkey export `RedisModule_CachedMicroseconds`: the time
/// the server took when the command started, so every key of one command
/// sees the same instant. Redis 7.0 lacks it (and `Microseconds`), so there
/// the module reads the wall clock itself; inside redis-server that is the
/// same clock. (Not under LD_PRELOAD time fakers: Redis loads modules with
/// RTLD_DEEPBIND, so only the server's own calls are faked, which is why
/// the clock-step tests run on servers that have the API.)
///
/// A clock before 1970 reads as 0; a backwards step never mints tokens.
pub fn now_us() -> i64 {
    // Copy the Option out of the `static mut`; never borrow it.
    if let Some(cached) = unsafe { raw::RedisModule_CachedMicroseconds } {
        return unsafe { cached() }.max(0);
    }
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
