//! `RedisModule_Call` for the things the module asks the server itself: a
//! string key's value without changing how it is stored, whether a command
//! exists, and a setting's value.

use super::api::Api;
use super::string::{ArgString, RString};
use redis_module::raw::{self, RedisModuleCallReply, RedisModuleCtx};
use std::ffi::CStr;
use std::os::raw::c_int;
use std::ptr::NonNull;

/// A reply of `RedisModule_Call`, freed on drop.
struct Reply {
    ptr: NonNull<RedisModuleCallReply>,
    api: &'static Api,
}

impl Reply {
    fn new(ptr: *mut RedisModuleCallReply, api: &'static Api) -> Option<Reply> {
        NonNull::new(ptr).map(|ptr| Reply { ptr, api })
    }

    fn kind(&self) -> c_int {
        // SAFETY: a live reply.
        unsafe { (self.api.call_reply_type)(self.ptr.as_ptr()) }
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        // SAFETY: a reply of RedisModule_Call, freed only here.
        unsafe { (self.api.free_call_reply)(self.ptr.as_ptr()) }
    }
}

/// `GET key`: the value of a string key, as the server stores it. Reading
/// it in place (StringDMA) would turn an int-encoded string into a raw one,
/// changing the key's OBJECT ENCODING although its value stays the same.
pub(super) fn get(ctx: *mut RedisModuleCtx, api: &'static Api, name: ArgString) -> Option<Vec<u8>> {
    // SAFETY: a live context, "s" with one live Redis string.
    let reply = Reply::new(
        unsafe { (api.call)(ctx, c"GET".as_ptr(), c"s".as_ptr(), name.ptr()) },
        api,
    )?;
    if reply.kind() != raw::REDISMODULE_REPLY_STRING as c_int {
        return None;
    }
    let mut len = 0usize;
    // SAFETY: a live string reply; the bytes live as long as the reply.
    let p = unsafe { (api.call_reply_string_ptr)(reply.ptr.as_ptr(), &mut len) };
    if p.is_null() {
        return Some(Vec::new());
    }
    // SAFETY: `len` readable bytes at `p`, copied before the reply is freed.
    Some(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }.to_vec())
}

/// Whether the server has `command` under that name (COMMAND INFO answers
/// `[nil]` for one that `rename-command` removed or renamed).
pub(super) fn command_exists(ctx: *mut RedisModuleCtx, api: &'static Api, command: &CStr) -> bool {
    // SAFETY: a live context, "cc" with two NUL-terminated strings.
    let Some(reply) = Reply::new(
        unsafe {
            (api.call)(
                ctx,
                c"COMMAND".as_ptr(),
                c"cc".as_ptr(),
                c"INFO".as_ptr(),
                command.as_ptr(),
            )
        },
        api,
    ) else {
        return false;
    };
    let array = raw::REDISMODULE_REPLY_ARRAY as c_int;
    if reply.kind() != array {
        return false;
    }
    // SAFETY: a live array reply.
    let len = unsafe { (api.call_reply_length)(reply.ptr.as_ptr()) };
    if len != 1 {
        return false;
    }
    // SAFETY: element 0 of a live one-element array, owned by it.
    let info = unsafe { (api.call_reply_array_element)(reply.ptr.as_ptr(), 0) };
    // SAFETY: a live element of a live reply (NULL checked first).
    !info.is_null() && unsafe { (api.call_reply_type)(info) } == array
}

/// `CONFIG GET name`: the setting's value, as CONFIG GET answers it (a
/// two-element array, the name then the value), or None if the server
/// has no such setting or refused.
pub(super) fn config_get(
    ctx: *mut RedisModuleCtx,
    api: &'static Api,
    name: &CStr,
) -> Option<Vec<u8>> {
    // SAFETY: a live context, "cc" with two NUL-terminated strings.
    let reply = Reply::new(
        unsafe {
            (api.call)(
                ctx,
                c"CONFIG".as_ptr(),
                c"cc".as_ptr(),
                c"GET".as_ptr(),
                name.as_ptr(),
            )
        },
        api,
    )?;
    if reply.kind() != raw::REDISMODULE_REPLY_ARRAY as c_int {
        return None;
    }
    // SAFETY: a live array reply.
    if unsafe { (api.call_reply_length)(reply.ptr.as_ptr()) } != 2 {
        return None;
    }
    // SAFETY: element 1 of a live two-element array, owned by it.
    let value = unsafe { (api.call_reply_array_element)(reply.ptr.as_ptr(), 1) };
    if value.is_null() {
        return None;
    }
    // SAFETY: a live element of a live reply, not NULL.
    if unsafe { (api.call_reply_type)(value) } != raw::REDISMODULE_REPLY_STRING as c_int {
        return None;
    }
    let mut len = 0usize;
    // SAFETY: a live string reply; the bytes live as long as the reply.
    let p = unsafe { (api.call_reply_string_ptr)(value, &mut len) };
    if p.is_null() {
        return Some(Vec::new());
    }
    // SAFETY: `len` readable bytes at `p`, copied before the reply is freed.
    Some(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }.to_vec())
}
