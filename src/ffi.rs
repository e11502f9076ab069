//! The wall around the Redis module API. Every raw call, and every
//! `unsafe` in the module, is in this file; everything else uses the safe
//! types below:
//!
//! * [`Api`]: the function table, resolved and checked once at load;
//! * [`Load`]: what `OnLoad` does (register commands, their docs and key
//!   specs, check the server);
//! * [`Ctx`] and [`Args`]: a command's context and arguments, made by the
//!   [`handler!`] trampoline;
//! * [`Key`], [`OwnedString`], [`Interned`]: RAII and static strings and
//!   keys, each freed or closed exactly once;
//! * [`log_warning`], for the panic hook.
//!
//! The safe methods rely on two invariants, set up here and nowhere else:
//! the table holds every function the commands call (`Api::resolve`), and a
//! `Ctx` exists only inside the command call Redis made (`Ctx::from_raw`).

// The one module where raw calls compile: Cargo.toml denies `unsafe_code`
// for the rest of the crate.
#![allow(unsafe_code)]

use redis_module::raw::{
    self, RedisModuleCallReply, RedisModuleCmdFunc, RedisModuleCommand, RedisModuleCtx,
    RedisModuleKey, RedisModuleString,
};
use std::ffi::{CStr, CString};
use std::marker::PhantomData;
use std::mem::{size_of, zeroed};
use std::os::raw::{c_char, c_int, c_long, c_longlong};
use std::ptr::{self, NonNull};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};
use tb_core::state::KeyKind;

/// What a command handler returns to Redis.
pub const OK: c_int = raw::REDISMODULE_OK as c_int;
pub const ERR: c_int = raw::REDISMODULE_ERR as c_int;

// ---- the function table -----------------------------------------------------

/// `RedisModule_*` functions the commands call, checked once at load.
pub struct Api {
    open_key: unsafe extern "C" fn(
        *mut RedisModuleCtx,
        *mut RedisModuleString,
        c_int,
    ) -> *mut RedisModuleKey,
    close_key: unsafe extern "C" fn(*mut RedisModuleKey),
    key_type: unsafe extern "C" fn(*mut RedisModuleKey) -> c_int,
    value_length: unsafe extern "C" fn(*mut RedisModuleKey) -> usize,
    hash_get: unsafe extern "C" fn(*mut RedisModuleKey, c_int, ...) -> c_int,
    hash_set: unsafe extern "C" fn(*mut RedisModuleKey, c_int, ...) -> c_int,
    set_abs_expire: unsafe extern "C" fn(*mut RedisModuleKey, raw::mstime_t) -> c_int,
    delete_key: unsafe extern "C" fn(*mut RedisModuleKey) -> c_int,
    string_dma: unsafe extern "C" fn(*mut RedisModuleKey, *mut usize, c_int) -> *mut c_char,
    replicate:
        unsafe extern "C" fn(*mut RedisModuleCtx, *const c_char, *const c_char, ...) -> c_int,
    create_string:
        unsafe extern "C" fn(*mut RedisModuleCtx, *const c_char, usize) -> *mut RedisModuleString,
    free_string: unsafe extern "C" fn(*mut RedisModuleCtx, *mut RedisModuleString),
    string_ptr_len: unsafe extern "C" fn(*const RedisModuleString, *mut usize) -> *const c_char,
    reply_with_array: unsafe extern "C" fn(*mut RedisModuleCtx, c_long) -> c_int,
    reply_with_long_long: unsafe extern "C" fn(*mut RedisModuleCtx, c_longlong) -> c_int,
    reply_with_error: unsafe extern "C" fn(*mut RedisModuleCtx, *const c_char) -> c_int,
    notify: unsafe extern "C" fn(
        *mut RedisModuleCtx,
        c_int,
        *const c_char,
        *mut RedisModuleString,
    ) -> c_int,
    signal_modified_key: unsafe extern "C" fn(*mut RedisModuleCtx, *mut RedisModuleString) -> c_int,
    /// Redis >= 7.2 and Valkey: the time the command started.
    cached_microseconds: Option<unsafe extern "C" fn() -> raw::ustime_t>,
}

static API: OnceLock<Api> = OnceLock::new();

impl Api {
    /// The table, or the name of the first function this server lacks.
    fn resolve() -> Result<Api, &'static str> {
        macro_rules! get {
            ($name:ident) => {
                // SAFETY: reading a function pointer that the module API
                // init (before OnLoad's body) wrote, on the main thread.
                unsafe { raw::$name }.ok_or(stringify!($name))?
            };
        }
        Ok(Api {
            open_key: get!(RedisModule_OpenKey),
            close_key: get!(RedisModule_CloseKey),
            key_type: get!(RedisModule_KeyType),
            value_length: get!(RedisModule_ValueLength),
            hash_get: get!(RedisModule_HashGet),
            hash_set: get!(RedisModule_HashSet),
            set_abs_expire: get!(RedisModule_SetAbsExpire),
            delete_key: get!(RedisModule_DeleteKey),
            string_dma: get!(RedisModule_StringDMA),
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
        })
    }
}

/// Logs at warning level through the Redis log, from anywhere (a NULL
/// context logs as the module).
pub fn log_warning(msg: &str) {
    // An interior NUL would truncate the message; none of ours has one.
    let text = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    // SAFETY: a function pointer read; Log takes a printf format, and "%s"
    // with one NUL-terminated string is well formed.
    if let Some(log) = unsafe { raw::RedisModule_Log } {
        unsafe {
            log(
                ptr::null_mut(),
                c"warning".as_ptr(),
                c"%s".as_ptr(),
                text.as_ptr(),
            )
        };
    }
}

// ---- strings ------------------------------------------------------------------

/// Anything that is a Redis string: a key name from argv, a string the
/// module made, an interned name. Sealed: only this file implements it.
pub trait RString: sealed::Sealed {
    #[doc(hidden)]
    fn ptr(&self) -> *mut RedisModuleString;
}

mod sealed {
    pub trait Sealed {}
}

/// A string made once and kept for the life of the process (the hash field
/// names): passing these instead of C strings spares HashGet, HashSet and
/// Replicate an allocation and a free per field.
pub struct Interned(NonNull<RedisModuleString>);

// SAFETY: Redis runs commands on its main thread only, and the string is
// never changed or freed after it is made.
unsafe impl Send for Interned {}
unsafe impl Sync for Interned {}

impl sealed::Sealed for Interned {}
impl RString for Interned {
    fn ptr(&self) -> *mut RedisModuleString {
        self.0.as_ptr()
    }
}

/// A string the module made during a command, freed on drop.
pub struct OwnedString<'c> {
    ptr: NonNull<RedisModuleString>,
    ctx: &'c Ctx,
}

impl OwnedString<'_> {
    pub fn bytes(&self) -> &[u8] {
        self.ctx.bytes_of(self.ptr.as_ptr())
    }
}

impl sealed::Sealed for OwnedString<'_> {}
impl RString for OwnedString<'_> {
    fn ptr(&self) -> *mut RedisModuleString {
        self.ptr.as_ptr()
    }
}

impl Drop for OwnedString<'_> {
    fn drop(&mut self) {
        // SAFETY: made by CreateString or handed over by HashGet in this
        // context, and freed only here.
        unsafe { (self.ctx.api.free_string)(self.ctx.raw, self.ptr.as_ptr()) }
    }
}

/// A key name from the command's argv, valid for the command.
#[derive(Clone, Copy)]
pub struct KeyName<'a> {
    ptr: NonNull<RedisModuleString>,
    _argv: PhantomData<&'a ()>,
}

impl sealed::Sealed for KeyName<'_> {}
impl RString for KeyName<'_> {
    fn ptr(&self) -> *mut RedisModuleString {
        self.ptr.as_ptr()
    }
}

// ---- commands ----------------------------------------------------------------

/// A command's context. Only `Ctx::from_raw` makes one, inside the call
/// Redis made, and handlers only ever borrow it, so it can't outlive the
/// call.
pub struct Ctx {
    raw: *mut RedisModuleCtx,
    api: &'static Api,
}

/// A command's arguments, read in place (no copies into `String`s).
pub struct Args<'a> {
    argv: &'a [*mut RedisModuleString],
    api: &'static Api,
}

/// The signature Redis calls a command with.
pub type RawHandler = RedisModuleCmdFunc;

/// Turns a safe handler, `fn(&Ctx, &Args) -> Result<(), String>`, into the
/// `extern "C"` function Redis calls, run under `guard::run`, which turns
/// an error or a panic into an error reply.
macro_rules! handler {
    ($body:path) => {{
        #[allow(unsafe_code)]
        extern "C" fn handler(
            ctx: *mut redis_module::raw::RedisModuleCtx,
            argv: *mut *mut redis_module::raw::RedisModuleString,
            argc: std::os::raw::c_int,
        ) -> std::os::raw::c_int {
            // SAFETY: Redis calls a command handler with its live context
            // and `argc` argument strings, valid until the handler returns.
            match unsafe { $crate::ffi::Ctx::from_raw(ctx, argv, argc) } {
                Some((ctx, args)) => {
                    $crate::guard::run(&ctx, || $body(&ctx, &args));
                    $crate::ffi::OK
                }
                None => $crate::ffi::ERR,
            }
        }
        let f: unsafe extern "C" fn(
            *mut redis_module::raw::RedisModuleCtx,
            *mut *mut redis_module::raw::RedisModuleString,
            std::os::raw::c_int,
        ) -> std::os::raw::c_int = handler;
        Some(f)
    }};
}
pub(crate) use handler;

impl Ctx {
    /// The context and arguments of a command call, `None` if the module
    /// did not load (no table).
    ///
    /// # Safety
    /// `raw` must be the live context Redis passed to a command handler,
    /// and `argv` must point to `argc` strings that stay valid for `'a`,
    /// which must not outlive the call.
    pub unsafe fn from_raw<'a>(
        raw: *mut RedisModuleCtx,
        argv: *mut *mut RedisModuleString,
        argc: c_int,
    ) -> Option<(Ctx, Args<'a>)> {
        let api = API.get()?;
        let len = usize::try_from(argc).unwrap_or(0);
        let argv = if argv.is_null() || len == 0 {
            &[][..]
        } else {
            // SAFETY: the caller's promise about argv and argc.
            unsafe { std::slice::from_raw_parts(argv, len) }
        };
        Some((Ctx { raw, api }, Args { argv, api }))
    }

    fn bytes_of(&self, s: *mut RedisModuleString) -> &[u8] {
        string_bytes(self.api, s)
    }

    /// Microseconds since the Unix epoch, from the server's own clock.
    ///
    /// Redis >= 7.2 and Valkey export `CachedMicroseconds`: the time the
    /// server took when the command started, so every key of one command
    /// sees the same instant. Redis 7.0 lacks it (and `Microseconds`), so
    /// there the module reads the wall clock itself; inside redis-server
    /// that is the same clock. (Not under LD_PRELOAD time fakers: Redis
    /// loads modules with RTLD_DEEPBIND, so only the server's own calls are
    /// faked, which is why the clock-step tests run on servers that have
    /// the API.) A clock before 1970 reads as 0.
    pub fn now_us(&self) -> i64 {
        if let Some(cached) = self.api.cached_microseconds {
            // SAFETY: a plain read of the server's cached time.
            return unsafe { cached() }.max(0);
        }
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
            .unwrap_or(0)
    }

    /// Opens `name` for reading, and for writing too if `write`.
    pub fn open_key<'c>(&'c self, name: KeyName<'c>, write: bool) -> Key<'c> {
        let mode = if write {
            raw::REDISMODULE_READ | raw::REDISMODULE_WRITE
        } else {
            raw::REDISMODULE_READ
        };
        // SAFETY: a live context and a key name from this call's argv.
        let key = unsafe { (self.api.open_key)(self.raw, name.ptr(), mode as c_int) };
        Key {
            key: NonNull::new(key),
            name,
            ctx: self,
        }
    }

    /// A new string holding `bytes`, freed when dropped.
    pub fn string(&self, bytes: &[u8]) -> Option<OwnedString<'_>> {
        // SAFETY: CreateString copies `len` bytes from `ptr`.
        let s = unsafe { (self.api.create_string)(self.raw, bytes.as_ptr().cast(), bytes.len()) };
        NonNull::new(s).map(|ptr| OwnedString { ptr, ctx: self })
    }

    /// Replicates `command` with one, two or five string arguments as an
    /// effect of this call. False if Redis refused (an unknown command) or
    /// another argument count was given.
    pub fn replicate(&self, command: &CStr, args: &[&dyn RString]) -> bool {
        let (ctx, c) = (self.raw, command.as_ptr());
        let f = self.api.replicate;
        // `s` only takes a reference to each string; `c` would copy it.
        // SAFETY: each format letter matches one live Redis string.
        let rc = unsafe {
            match *args {
                [a] => f(ctx, c, c"s".as_ptr(), a.ptr()),
                [a, b] => f(ctx, c, c"ss".as_ptr(), a.ptr(), b.ptr()),
                [a, b, d, e, g] => f(
                    ctx,
                    c,
                    c"sssss".as_ptr(),
                    a.ptr(),
                    b.ptr(),
                    d.ptr(),
                    e.ptr(),
                    g.ptr(),
                ),
                _ => ERR,
            }
        };
        rc == OK
    }

    /// A keyspace event for `key`, of the hash or the generic class (a
    /// no-op unless `notify-keyspace-events` asks for it).
    pub fn notify(&self, hash_class: bool, event: &CStr, key: &dyn RString) {
        let class = if hash_class {
            raw::REDISMODULE_NOTIFY_HASH
        } else {
            raw::REDISMODULE_NOTIFY_GENERIC
        };
        // SAFETY: a live context, a NUL-terminated event, a live key name.
        unsafe { (self.api.notify)(self.raw, class as c_int, event.as_ptr(), key.ptr()) };
    }

    /// Aborts WATCHes of `key` and invalidates client-side caches: what
    /// closing a written key does without NO_IMPLICIT_SIGNAL_MODIFIED.
    pub fn signal_modified(&self, key: &dyn RString) {
        // SAFETY: a live context and key name.
        unsafe { (self.api.signal_modified_key)(self.raw, key.ptr()) };
    }

    pub fn reply_array(&self, len: usize) {
        // SAFETY: a live context; the length fits (at most 2 + 10,000).
        unsafe {
            (self.api.reply_with_array)(self.raw, c_long::try_from(len).unwrap_or(c_long::MAX))
        };
    }

    pub fn reply_int(&self, v: i64) {
        // SAFETY: a live context.
        unsafe { (self.api.reply_with_long_long)(self.raw, v) };
    }

    /// An error reply; `msg` starts with its code (`ERR`, `WRONGTYPE`).
    pub fn reply_error(&self, msg: &str) {
        // An interior NUL would truncate the message; none of ours has one.
        let text = CString::new(msg.replace('\0', " ")).unwrap_or_default();
        // SAFETY: a live context and a NUL-terminated message.
        unsafe { (self.api.reply_with_error)(self.raw, text.as_ptr()) };
    }
}

/// Bytes of a Redis string, borrowed for as long as the string is.
fn string_bytes<'s>(api: &Api, s: *mut RedisModuleString) -> &'s [u8] {
    let mut len = 0usize;
    // SAFETY: `s` is a live string (callers tie `'s` to its owner).
    let p = unsafe { (api.string_ptr_len)(s, &mut len) };
    if p.is_null() {
        &[]
    } else {
        // SAFETY: StringPtrLen returns `len` readable bytes at `p`.
        unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }
    }
}

impl<'a> Args<'a> {
    /// The argument at `i` as a key name, `None` past the end.
    pub fn key(&self, i: usize) -> Option<KeyName<'a>> {
        let ptr = NonNull::new(*self.argv.get(i)?)?;
        Some(KeyName {
            ptr,
            _argv: PhantomData,
        })
    }
}

impl tb_core::args::Argv for Args<'_> {
    fn count(&self) -> usize {
        self.argv.len()
    }
    fn arg(&self, i: usize) -> &[u8] {
        match self.argv.get(i) {
            Some(&s) if !s.is_null() => string_bytes(self.api, s),
            _ => &[],
        }
    }
}

// ---- keys -------------------------------------------------------------------

/// An open key, closed on drop. A key that could not be opened reads as
/// missing and refuses every write.
pub struct Key<'c> {
    key: Option<NonNull<RedisModuleKey>>,
    name: KeyName<'c>,
    ctx: &'c Ctx,
}

impl<'c> Key<'c> {
    pub fn name(&self) -> KeyName<'c> {
        self.name
    }

    /// What the key holds.
    pub fn kind(&self) -> KeyKind {
        let Some(key) = self.key else {
            return KeyKind::Missing;
        };
        let api = self.ctx.api;
        // SAFETY: an open key.
        match unsafe { (api.key_type)(key.as_ptr()) } as isize {
            raw::REDISMODULE_KEYTYPE_EMPTY => KeyKind::Missing,
            // SAFETY: an open key holding a hash.
            raw::REDISMODULE_KEYTYPE_HASH => {
                KeyKind::Hash(unsafe { (api.value_length)(key.as_ptr()) })
            }
            _ => KeyKind::Other,
        }
    }

    /// The value of a key holding a string; `None` for any other key.
    pub fn string_value(&self) -> Option<&[u8]> {
        let key = self.key?;
        let api = self.ctx.api;
        // SAFETY: an open key.
        if unsafe { (api.key_type)(key.as_ptr()) } as isize != raw::REDISMODULE_KEYTYPE_STRING {
            return None;
        }
        let mut len = 0usize;
        // SAFETY: an open string key read in place; the bytes stay valid
        // while the key is open and unchanged, which the borrow of `self`
        // guarantees: every write takes `&mut self`.
        let p = unsafe { (api.string_dma)(key.as_ptr(), &mut len, raw::REDISMODULE_READ as c_int) };
        if p.is_null() {
            return Some(&[]);
        }
        // SAFETY: StringDMA returns `len` readable bytes at `p`.
        Some(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) })
    }

    /// The values of two fields of a hash (`None`: absent).
    pub fn hash_get(
        &self,
        a: &Interned,
        b: &Interned,
    ) -> (Option<OwnedString<'c>>, Option<OwnedString<'c>>) {
        let Some(key) = self.key else {
            return (None, None);
        };
        let (mut va, mut vb): (*mut RedisModuleString, *mut RedisModuleString) =
            (ptr::null_mut(), ptr::null_mut());
        // SAFETY: an open hash key, field/out-pointer pairs, NULL-terminated;
        // HashGet hands over new strings (or leaves NULL).
        unsafe {
            (self.ctx.api.hash_get)(
                key.as_ptr(),
                raw::REDISMODULE_HASH_NONE as c_int,
                a.ptr(),
                &mut va as *mut *mut RedisModuleString,
                b.ptr(),
                &mut vb as *mut *mut RedisModuleString,
                ptr::null::<c_char>(),
            )
        };
        let own = |p| NonNull::new(p).map(|ptr| OwnedString { ptr, ctx: self.ctx });
        (own(va), own(vb))
    }

    /// Sets two fields of a hash (creating it); true if both were written.
    pub fn hash_set(
        &mut self,
        a: &Interned,
        va: &dyn RString,
        b: &Interned,
        vb: &dyn RString,
    ) -> bool {
        let Some(key) = self.key else {
            return false;
        };
        // COUNT_ALL: the result counts inserted fields too, so 2 means
        // both fields were written.
        // SAFETY: a key open for writing, field/value pairs, NULL-terminated.
        let set = unsafe {
            (self.ctx.api.hash_set)(
                key.as_ptr(),
                raw::REDISMODULE_HASH_COUNT_ALL as c_int,
                a.ptr(),
                va.ptr(),
                b.ptr(),
                vb.ptr(),
                ptr::null::<c_char>(),
            )
        };
        set == 2
    }

    /// Sets the absolute expire time in ms; true if Redis did.
    pub fn set_abs_expire(&mut self, at_ms: i64) -> bool {
        // SAFETY: an open key.
        self.key
            .is_some_and(|key| unsafe { (self.ctx.api.set_abs_expire)(key.as_ptr(), at_ms) } == OK)
    }

    /// Deletes the key; true if Redis did.
    pub fn delete(&mut self) -> bool {
        // SAFETY: an open key.
        self.key
            .is_some_and(|key| unsafe { (self.ctx.api.delete_key)(key.as_ptr()) } == OK)
    }
}

impl Drop for Key<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            // SAFETY: opened by OpenKey, closed only here.
            unsafe { (self.ctx.api.close_key)(key.as_ptr()) }
        }
    }
}

// ---- loading ------------------------------------------------------------------

/// A command's docs, as `COMMAND DOCS` shows them, and its key spec.
pub struct Docs {
    pub summary: &'static CStr,
    pub complexity: &'static CStr,
    pub since: &'static CStr,
    /// TB.PEEK reads its key; the others read and update theirs.
    pub read_only: bool,
    /// The key spec's range from argument 1: (lastkey, keystep); `None`
    /// for a command without keys.
    pub key_range: Option<(c_int, c_int)>,
    pub args: &'static [ArgDoc],
}

/// One argument in the docs (redis-cli shows them as hints).
pub struct ArgDoc {
    pub name: &'static CStr,
    pub kind: ArgKind,
    pub optional: bool,
    /// Repeats (the groups of TB.MCONSUME).
    pub multiple: bool,
    pub subargs: &'static [ArgDoc],
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ArgKind {
    Key,
    Double,
    Integer,
    Block,
}

/// A command as `CreateCommand` takes it.
pub struct CommandDef {
    pub name: &'static CStr,
    pub handler: RawHandler,
    pub flags: &'static CStr,
    /// (first, last, step), for servers without key specs.
    pub keys: (c_int, c_int, c_int),
    /// ACL categories, set where the server supports them (>= 7.2).
    pub acl: &'static CStr,
    pub docs: Docs,
    /// Another module may own this name (CL.THROTTLE and redis-cell): if
    /// the server already has the command, log it and skip it.
    pub yield_to_existing: bool,
}

/// The module being loaded: `OnLoad`'s context.
pub struct Load<'a> {
    raw: *mut RedisModuleCtx,
    _onload: PhantomData<&'a ()>,
}

impl<'a> Load<'a> {
    /// Resolves the function table; `Err` names what this server lacks.
    pub fn start(ctx: &'a redis_module::Context) -> Result<Load<'a>, String> {
        let api = Api::resolve().map_err(|name| format!("this server lacks {name}"))?;
        // A second MODULE LOAD in the same process finds the table set,
        // with the same functions.
        let _ = API.set(api);
        Ok(Load {
            raw: ctx.ctx,
            _onload: PhantomData,
        })
    }

    /// Whether the server has `command` under that name (COMMAND INFO
    /// answers `[nil]` for one that `rename-command` removed or renamed).
    pub fn has_command(&self, command: &CStr) -> bool {
        // SAFETY: function pointer reads at load, on the main thread.
        let (Some(call), Some(kind), Some(len), Some(at), Some(free)) = (unsafe {
            (
                raw::RedisModule_Call,
                raw::RedisModule_CallReplyType,
                raw::RedisModule_CallReplyLength,
                raw::RedisModule_CallReplyArrayElement,
                raw::RedisModule_FreeCallReply,
            )
        }) else {
            return false;
        };
        // SAFETY: OnLoad's context; "cc" with two C strings; the reply is
        // read, then freed once.
        unsafe {
            let reply: *mut RedisModuleCallReply = call(
                self.raw,
                c"COMMAND".as_ptr(),
                c"cc".as_ptr(),
                c"INFO".as_ptr(),
                command.as_ptr(),
            );
            if reply.is_null() {
                return false;
            }
            let known = kind(reply) == raw::REDISMODULE_REPLY_ARRAY as c_int
                && len(reply) == 1
                && kind(at(reply, 0)) == raw::REDISMODULE_REPLY_ARRAY as c_int;
            free(reply);
            known
        }
    }

    /// Writers open keys once, for writing, and signal a key as modified
    /// only when they change it (`Ctx::signal_modified`).
    pub fn no_implicit_signal_modified(&self) {
        // SAFETY: OnLoad's context.
        if let Some(set) = unsafe { raw::RedisModule_SetModuleOptions } {
            unsafe {
                set(
                    self.raw,
                    raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED as c_int,
                )
            };
        }
    }

    /// A string for the life of the process.
    pub fn intern(&self, text: &str) -> Option<Interned> {
        let api = API.get()?;
        // SAFETY: a NULL context makes a string that is not freed when a
        // command returns; CreateString copies the bytes.
        let s = unsafe { (api.create_string)(ptr::null_mut(), text.as_ptr().cast(), text.len()) };
        NonNull::new(s).map(Interned)
    }

    /// Registers `cmd`; where the server has the APIs (detected now: 7.0
    /// has no ACL category API, 6.2 neither, nor SetCommandInfo) also its
    /// ACL categories, docs and key specs. Only a failed registration is an
    /// error; a refused extra is logged, and a command whose key specs could
    /// not be set keeps the stricter full-access one.
    pub fn register(&self, cmd: &CommandDef) -> Result<(), String> {
        if cmd.yield_to_existing && self.has_command(cmd.name) {
            log_warning(&format!(
                "tb: {} is already registered (redis-cell?); tb leaves it to that module",
                cmd.name.to_string_lossy()
            ));
            return Ok(());
        }
        let (first, last, step) = cmd.keys;
        // SAFETY: OnLoad's context, NUL-terminated name and flags, and a
        // handler made by `handler!`.
        let created = unsafe {
            raw::RedisModule_CreateCommand.map(|create| {
                create(
                    self.raw,
                    cmd.name.as_ptr(),
                    cmd.handler,
                    cmd.flags.as_ptr(),
                    first,
                    last,
                    step,
                )
            })
        };
        if created != Some(OK) {
            return Err(format!("tb: could not register {:?}", cmd.name));
        }
        // SAFETY: as above.
        let command = match unsafe { raw::RedisModule_GetCommand } {
            Some(get) => unsafe { get(self.raw, cmd.name.as_ptr()) },
            None => return Ok(()),
        };
        if command.is_null() {
            return Ok(());
        }
        // SAFETY: a command of this module, NUL-terminated categories.
        if let Some(set) = unsafe { raw::RedisModule_SetCommandACLCategories } {
            if unsafe { set(command, cmd.acl.as_ptr()) } != OK {
                log_warning(&format!(
                    "tb: could not set ACL categories of {:?}",
                    cmd.name
                ));
            }
        }
        if !set_command_info(command, &cmd.docs) {
            log_warning(&format!(
                "tb: could not set the key specs and docs of {:?}",
                cmd.name
            ));
        }
        Ok(())
    }
}

/// The arguments of `args` as a zero-terminated C array; nested blocks are
/// kept alive in `keep` until the server has copied them.
fn c_args(
    args: &[ArgDoc],
    keep: &mut Vec<Vec<raw::RedisModuleCommandArg>>,
) -> *mut raw::RedisModuleCommandArg {
    let mut out: Vec<raw::RedisModuleCommandArg> = args
        .iter()
        .map(|a| {
            // SAFETY: all zeros is the documented "unset" of every field.
            let mut c: raw::RedisModuleCommandArg = unsafe { zeroed() };
            c.name = a.name.as_ptr();
            c.type_ = match a.kind {
                ArgKind::Key => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
                ArgKind::Double => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_DOUBLE,
                ArgKind::Integer => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
                ArgKind::Block => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
            };
            // Every command has one key spec; other arguments name none.
            c.key_spec_index = if a.kind == ArgKind::Key { 0 } else { -1 };
            let mut flags = 0;
            if a.optional {
                flags |= raw::REDISMODULE_CMD_ARG_OPTIONAL;
            }
            if a.multiple {
                flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE;
            }
            c.flags = flags as c_int;
            if !a.subargs.is_empty() {
                c.subargs = c_args(a.subargs, keep);
            }
            c
        })
        .collect();
    // SAFETY: the zeroed element terminates the array.
    out.push(unsafe { zeroed() });
    let p = out.as_mut_ptr();
    keep.push(out);
    p
}

/// `SetCommandInfo`: false if the server refused; true also where it lacks
/// the API (Redis 6.2, which has no key specs).
fn set_command_info(command: *mut RedisModuleCommand, docs: &Docs) -> bool {
    // SAFETY: a function pointer read at load.
    let Some(set_info) = (unsafe { raw::RedisModule_SetCommandInfo }) else {
        return true;
    };
    let version = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: size_of::<raw::RedisModuleCommandArg>(),
    };
    let access = if docs.read_only {
        raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS
    } else {
        raw::REDISMODULE_CMD_KEY_RW
            | raw::REDISMODULE_CMD_KEY_ACCESS
            | raw::REDISMODULE_CMD_KEY_UPDATE
    };
    let mut specs: Vec<raw::RedisModuleCommandKeySpec> = Vec::new();
    if let Some((lastkey, keystep)) = docs.key_range {
        // SAFETY: zeroed key specs are the unset fields (and the terminator).
        let mut spec: raw::RedisModuleCommandKeySpec = unsafe { zeroed() };
        spec.flags = u64::from(access);
        spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
        spec.bs.index.pos = 1;
        spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
        spec.fk.range.lastkey = lastkey;
        spec.fk.range.keystep = keystep;
        spec.fk.range.limit = 0;
        specs.push(spec);
    }
    specs.push(unsafe { zeroed() });
    let mut keep = Vec::new();
    let args = c_args(docs.args, &mut keep);
    let info = raw::RedisModuleCommandInfo {
        version: &version,
        summary: docs.summary.as_ptr(),
        complexity: docs.complexity.as_ptr(),
        since: docs.since.as_ptr(),
        history: ptr::null_mut(),
        tips: ptr::null::<c_char>(),
        // 0: the handlers check the argument count themselves, so their
        // error replies (and `tb_errors`) stay as they are.
        arity: 0,
        key_specs: specs.as_mut_ptr(),
        args,
    };
    // SAFETY: `info` and all it points to live until the call returns, and
    // the server copies what it keeps.
    unsafe { set_info(command, &info) == OK }
}
