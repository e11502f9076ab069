//! The function table: the `RedisModule_*` functions the commands call,
//! resolved once at load so a command never meets a missing one; and the
//! server log.

use redis_module::raw::{
    self, RedisModuleCallReply, RedisModuleCtx, RedisModuleKey, RedisModuleScanCursor,
    RedisModuleScanKeyCB, RedisModuleString,
};
use std::ffi::CString;
use std::os::raw::{c_char, c_int, c_long, c_longlong};
use std::ptr;
use std::sync::OnceLock;

/// What the module API's calls, and a command handler, return.
pub const OK: c_int = raw::REDISMODULE_OK as c_int;
pub const ERR: c_int = raw::REDISMODULE_ERR as c_int;

/// `RedisModule_*` functions the commands call, checked once at load.
pub struct Api {
    pub(super) open_key: unsafe extern "C" fn(
        *mut RedisModuleCtx,
        *mut RedisModuleString,
        c_int,
    ) -> *mut RedisModuleKey,
    pub(super) close_key: unsafe extern "C" fn(*mut RedisModuleKey),
    pub(super) key_type: unsafe extern "C" fn(*mut RedisModuleKey) -> c_int,
    pub(super) value_length: unsafe extern "C" fn(*mut RedisModuleKey) -> usize,
    pub(super) hash_get: unsafe extern "C" fn(*mut RedisModuleKey, c_int, ...) -> c_int,
    pub(super) hash_set: unsafe extern "C" fn(*mut RedisModuleKey, c_int, ...) -> c_int,
    pub(super) set_abs_expire: unsafe extern "C" fn(*mut RedisModuleKey, raw::mstime_t) -> c_int,
    pub(super) delete_key: unsafe extern "C" fn(*mut RedisModuleKey) -> c_int,
    pub(super) call: unsafe extern "C" fn(
        *mut RedisModuleCtx,
        *const c_char,
        *const c_char,
        ...
    ) -> *mut RedisModuleCallReply,
    pub(super) call_reply_type: unsafe extern "C" fn(*mut RedisModuleCallReply) -> c_int,
    pub(super) call_reply_length: unsafe extern "C" fn(*mut RedisModuleCallReply) -> usize,
    pub(super) call_reply_array_element:
        unsafe extern "C" fn(*mut RedisModuleCallReply, usize) -> *mut RedisModuleCallReply,
    pub(super) call_reply_string_ptr:
        unsafe extern "C" fn(*mut RedisModuleCallReply, *mut usize) -> *const c_char,
    pub(super) free_call_reply: unsafe extern "C" fn(*mut RedisModuleCallReply),
    pub(super) is_keys_position_request: unsafe extern "C" fn(*mut RedisModuleCtx) -> c_int,
    pub(super) key_at_pos: unsafe extern "C" fn(*mut RedisModuleCtx, c_int),
    pub(super) scan_cursor_create: unsafe extern "C" fn() -> *mut RedisModuleScanCursor,
    pub(super) scan_cursor_destroy: unsafe extern "C" fn(*mut RedisModuleScanCursor),
    pub(super) scan_key: unsafe extern "C" fn(
        *mut RedisModuleKey,
        *mut RedisModuleScanCursor,
        RedisModuleScanKeyCB,
        *mut std::os::raw::c_void,
    ) -> c_int,
    pub(super) replicate:
        unsafe extern "C" fn(*mut RedisModuleCtx, *const c_char, *const c_char, ...) -> c_int,
    pub(super) create_string:
        unsafe extern "C" fn(*mut RedisModuleCtx, *const c_char, usize) -> *mut RedisModuleString,
    pub(super) free_string: unsafe extern "C" fn(*mut RedisModuleCtx, *mut RedisModuleString),
    pub(super) string_ptr_len:
        unsafe extern "C" fn(*const RedisModuleString, *mut usize) -> *const c_char,
    pub(super) reply_with_array: unsafe extern "C" fn(*mut RedisModuleCtx, c_long) -> c_int,
    pub(super) reply_with_long_long: unsafe extern "C" fn(*mut RedisModuleCtx, c_longlong) -> c_int,
    pub(super) reply_with_error: unsafe extern "C" fn(*mut RedisModuleCtx, *const c_char) -> c_int,
    pub(super) notify: unsafe extern "C" fn(
        *mut RedisModuleCtx,
        c_int,
        *const c_char,
        *mut RedisModuleString,
    ) -> c_int,
    pub(super) signal_modified_key:
        unsafe extern "C" fn(*mut RedisModuleCtx, *mut RedisModuleString) -> c_int,
    /// Redis >= 7.2 and Valkey: the time the command started.
    pub(super) cached_microseconds: Option<unsafe extern "C" fn() -> raw::ustime_t>,
    /// Redis >= 7.0: a key position with its access flags.
    pub(super) key_at_pos_with_flags:
        Option<unsafe extern "C" fn(*mut RedisModuleCtx, c_int, c_int)>,
}

static API: OnceLock<Api> = OnceLock::new();

impl Api {
    /// The table, once `resolve` has set it: `None` before the module
    /// loaded (a command can't run then).
    pub(super) fn get() -> Option<&'static Api> {
        API.get()
    }

    /// Resolves the table, or names the first function this server lacks.
    /// A second MODULE LOAD in the same process finds it set, with the
    /// same functions.
    pub(super) fn resolve() -> Result<&'static Api, &'static str> {
        if let Some(api) = API.get() {
            return Ok(api);
        }
        macro_rules! get {
            ($name:ident) => {
                // SAFETY: reading a function pointer that the module API
                // init (before OnLoad's body) wrote, on the main thread.
                unsafe { raw::$name }.ok_or(stringify!($name))?
            };
        }
        let api = Api {
            open_key: get!(RedisModule_OpenKey),
            close_key: get!(RedisModule_CloseKey),
            key_type: get!(RedisModule_KeyType),
            value_length: get!(RedisModule_ValueLength),
            hash_get: get!(RedisModule_HashGet),
            hash_set: get!(RedisModule_HashSet),
            set_abs_expire: get!(RedisModule_SetAbsExpire),
            delete_key: get!(RedisModule_DeleteKey),
            call: get!(RedisModule_Call),
            call_reply_type: get!(RedisModule_CallReplyType),
            call_reply_length: get!(RedisModule_CallReplyLength),
            call_reply_array_element: get!(RedisModule_CallReplyArrayElement),
            call_reply_string_ptr: get!(RedisModule_CallReplyStringPtr),
            free_call_reply: get!(RedisModule_FreeCallReply),
            is_keys_position_request: get!(RedisModule_IsKeysPositionRequest),
            key_at_pos: get!(RedisModule_KeyAtPos),
            scan_cursor_create: get!(RedisModule_ScanCursorCreate),
            scan_cursor_destroy: get!(RedisModule_ScanCursorDestroy),
            scan_key: get!(RedisModule_ScanKey),
            replicate: get!(RedisModule_Replicate),
            create_string: get!(RedisModule_CreateString),
            free_string: get!(RedisModule_FreeString),
            string_ptr_len: get!(RedisModule_StringPtrLen),
            reply_with_array: get!(RedisModule_ReplyWithArray),
            reply_with_long_long: get!(RedisModule_ReplyWithLongLong),
            reply_with_error: get!(RedisModule_ReplyWithError),
            notify: get!(RedisModule_NotifyKeyspaceEvent),
            signal_modified_key: get!(RedisModule_SignalModifiedKey),
            // SAFETY: as above; absent on Redis 7.0, which is fine.
            cached_microseconds: unsafe { raw::RedisModule_CachedMicroseconds },
            // SAFETY: as above; absent on Redis 6.2, which has no key flags.
            key_at_pos_with_flags: unsafe { raw::RedisModule_KeyAtPosWithFlags },
        };
        Ok(API.get_or_init(|| api))
    }
}

/// Logs at warning level through the Redis log, from anywhere (a NULL
/// context logs as the module).
pub fn log_warning(msg: &str) {
    // An interior NUL would truncate the message; none of ours has one.
    let text = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    // SAFETY: a function pointer read, written by the module API init.
    let Some(log) = (unsafe { raw::RedisModule_Log }) else {
        return;
    };
    // SAFETY: Log takes a printf format; "%s" with one NUL-terminated
    // string is well formed, and a NULL context is allowed.
    unsafe {
        log(
            ptr::null_mut(),
            c"warning".as_ptr(),
            c"%s".as_ptr(),
            text.as_ptr(),
        )
    };
}
