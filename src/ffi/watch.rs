//! The memory settings the module watches (`maxmemory-policy` and
//! `maxmemory`): read at load, and again after every `CONFIG SET` through
//! the server's config-change event where the server has it (Redis 7.0 and
//! later, Valkey), else by a timer once a second (Redis 6.2).

use super::api::Api;
use super::call;
use redis_module::raw::{self, RedisModuleCtx, RedisModuleEvent};
use std::ffi::c_void;
use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

/// The settings as the server answers CONFIG GET.
pub struct Memory {
    pub policy: String,
    /// Bytes; 0 is no limit.
    pub maxmemory: u64,
}

/// What runs when the settings may have changed.
type Watcher = fn(&Memory);
/// The watcher, and the function table its reads go through.
static WATCHER: OnceLock<(Watcher, &'static Api)> = OnceLock::new();
/// The fallback timer's id, 0 while none is armed (it must be stopped
/// before an unload: Redis refuses to unload a module holding a timer).
static TIMER: AtomicU64 = AtomicU64::new(0);
const TIMER_MS: i64 = 1000;

const CONFIG_EVENT: RedisModuleEvent = RedisModuleEvent {
    id: raw::REDISMODULE_EVENT_CONFIG,
    dataver: 1,
};

/// Reads the settings and hands them to the watcher; a panic in it is
/// caught (a callback from the server must not unwind into it).
fn check(ctx: *mut RedisModuleCtx) {
    let Some(&(watcher, api)) = WATCHER.get() else {
        return;
    };
    let policy = call::config_get(ctx, api, c"maxmemory-policy");
    let maxmemory = call::config_get(ctx, api, c"maxmemory");
    let (Some(policy), Some(maxmemory)) = (policy, maxmemory) else {
        return; // CONFIG renamed away, or refused: nothing to say
    };
    let memory = Memory {
        policy: String::from_utf8_lossy(&policy).into_owned(),
        maxmemory: std::str::from_utf8(&maxmemory)
            .ok()
            .and_then(|m| m.parse().ok())
            .unwrap_or(0),
    };
    let _ = catch_unwind(AssertUnwindSafe(|| watcher(&memory)));
}

extern "C" fn on_config(
    ctx: *mut RedisModuleCtx,
    _e: RedisModuleEvent,
    _sub: u64,
    _data: *mut c_void,
) {
    // Any change: the two settings are re-read, and the watcher decides.
    check(ctx);
}

extern "C" fn on_timer(ctx: *mut RedisModuleCtx, _data: *mut c_void) {
    check(ctx);
    arm_timer(ctx);
}

fn arm_timer(ctx: *mut RedisModuleCtx) {
    // SAFETY: a function pointer read after load.
    if let Some(create) = unsafe { raw::RedisModule_CreateTimer } {
        // SAFETY: a live context; the callback is a plain function and
        // takes no data.
        let id = unsafe { create(ctx, TIMER_MS, Some(on_timer), std::ptr::null_mut()) };
        TIMER.store(id, Relaxed);
    }
}

/// Runs `watcher` now and whenever the settings may have changed.
pub(super) fn watch(ctx: *mut RedisModuleCtx, api: &'static Api, watcher: Watcher) {
    if WATCHER.set((watcher, api)).is_err() {
        return; // a second MODULE LOAD in the same process keeps the first
    }
    check(ctx);
    // SAFETY: function pointers read after load.
    let (supported, subscribe) = unsafe {
        (
            raw::RedisModule_IsSubEventSupported,
            raw::RedisModule_SubscribeToServerEvent,
        )
    };
    let has_event = supported.is_some_and(|supported| {
        // SAFETY: a plain query of the server's event table.
        unsafe { supported(CONFIG_EVENT, raw::REDISMODULE_SUBEVENT_CONFIG_CHANGE) != 0 }
    });
    if let (true, Some(subscribe)) = (has_event, subscribe) {
        // SAFETY: OnLoad's context, a supported event and a plain callback.
        if unsafe { subscribe(ctx, CONFIG_EVENT, Some(on_config)) } == raw::REDISMODULE_OK as c_int
        {
            return;
        }
    }
    arm_timer(ctx);
}

/// Stops the fallback timer, for an unload.
pub(super) fn stop(ctx: *mut RedisModuleCtx) {
    let id = TIMER.swap(0, Relaxed);
    if id == 0 {
        return;
    }
    // SAFETY: a function pointer read after load.
    if let Some(stop) = unsafe { raw::RedisModule_StopTimer } {
        // SAFETY: a live context and a timer this module created; NULL: the
        // timer's data (none) is not wanted back.
        unsafe { stop(ctx, id, std::ptr::null_mut()) };
    }
}
