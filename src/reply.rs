//! Replies and log lines, through the module API.

use redis_module::raw::{self, RedisModuleCtx};
use std::ffi::{CStr, CString};
use std::os::raw::{c_long, c_longlong};
use std::ptr;
use tb_core::bucket::Outcome;

/// Replies with `[allowed, remaining, retry_after_ms, reset_after_ms]`.
pub fn reply_outcome(ctx: *mut RedisModuleCtx, outcome: &Outcome) {
    let values = outcome.reply();
    reply_array(ctx, values.len());
    for v in values {
        reply_int(ctx, v);
    }
}

pub fn reply_array(ctx: *mut RedisModuleCtx, len: usize) {
    if let Some(f) = unsafe { raw::RedisModule_ReplyWithArray } {
        unsafe { f(ctx, len as c_long) };
    }
}

pub fn reply_int(ctx: *mut RedisModuleCtx, v: i64) {
    if let Some(f) = unsafe { raw::RedisModule_ReplyWithLongLong } {
        unsafe { f(ctx, v as c_longlong) };
    }
}

/// Replies with an error; `msg` starts with its code (`ERR`, `WRONGTYPE`).
pub fn reply_error(ctx: *mut RedisModuleCtx, msg: &str) {
    // An interior NUL would truncate the message; none of ours has one.
    let text = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    if let Some(f) = unsafe { raw::RedisModule_ReplyWithError } {
        unsafe { f(ctx, text.as_ptr()) };
    }
}

/// Logs at warning level through the Redis log.
pub fn log_warning(msg: &str) {
    let text = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    if let Some(f) = unsafe { raw::RedisModule_Log } {
        let fmt: &CStr = c"%s";
        unsafe {
            f(
                ptr::null_mut(),
                c"warning".as_ptr(),
                fmt.as_ptr(),
                text.as_ptr(),
            )
        };
    }
}
