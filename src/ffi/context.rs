//! A command's context and arguments, made only inside a call Redis made
//! into the module (a command's, by the `handler!` trampoline, or
//! `RedisModule_OnUnload`): replies, replication, keyspace events, the
//! clock, keys and strings; and `CommandLocal`, state lent only against
//! them.

use super::api::{Api, ERR, OK};
use super::call;
use super::key::Key;
use super::string::{string_bytes, ArgString, Kept, OwnedString, RString};
use redis_module::raw::{self, RedisModuleCmdFunc, RedisModuleCtx, RedisModuleString};
use std::ffi::{CStr, CString};
use std::marker::PhantomData;
use std::os::raw::{c_int, c_long};
use std::ptr::{self, NonNull};

/// A command's context. Only `Ctx::from_raw` makes one, inside the call
/// Redis made, and handlers only ever borrow it, so it can't outlive the
/// call.
pub struct Ctx {
    raw: *mut RedisModuleCtx,
    api: &'static Api,
}

/// A command's arguments, read in place (no copies into `String`s), and
/// the command's name as the command table registered it.
pub struct Args<'a> {
    argv: &'a [*mut RedisModuleString],
    api: &'static Api,
    command: &'static CStr,
}

/// The signature Redis calls a command with.
pub type RawHandler = RedisModuleCmdFunc;

/// A value only command calls use, in a plain static: what a
/// thread-local would hold, without the look-up each use of one costs in
/// a library Redis loads (a call of `__tls_get_addr`). `get` lends it
/// against a `Ctx` or `Args` of the call in progress.
pub struct CommandLocal<T>(T);

// SAFETY: the value is only lent (`get`) for as long as a `Ctx` or an
// `Args` is borrowed. Those exist only inside a call Redis made into the
// module (a command, or OnUnload: `Ctx::from_raw`), and their raw pointers
// keep them on that call's thread (neither is Send or Sync). Redis makes
// those calls one at a time: on its main thread, or on a module thread
// that holds the server lock for `RedisModule_Call`. So no two threads
// ever use the value at once, which is all a thread-local would have
// guaranteed.
unsafe impl<T> Sync for CommandLocal<T> {}

/// What `CommandLocal::get` accepts as proof of a call in progress:
/// sealed, so no type above the wall can claim to be one.
pub trait InCall: in_call::Sealed {}
impl InCall for Ctx {}
impl InCall for Args<'_> {}

mod in_call {
    pub trait Sealed {}
    impl Sealed for super::Ctx {}
    impl Sealed for super::Args<'_> {}
}

impl<T> CommandLocal<T> {
    pub const fn new(value: T) -> Self {
        CommandLocal(value)
    }

    /// The value, for as long as `call` is borrowed.
    pub fn get<'c>(&'static self, _call: &'c impl InCall) -> &'c T {
        &self.0
    }
}

/// Turns a safe handler, `fn(&Ctx, &Args) -> Result<(), Error>`, into the
/// `extern "C"` function Redis calls for the command `$name` (a `&CStr`
/// of the contract), run under `guard::run`, which turns an error or a
/// panic into an error reply.
macro_rules! handler {
    ($name:expr, $body:path) => {{
        #[allow(unsafe_code)]
        extern "C" fn handler(
            ctx: *mut redis_module::raw::RedisModuleCtx,
            argv: *mut *mut redis_module::raw::RedisModuleString,
            argc: std::os::raw::c_int,
        ) -> std::os::raw::c_int {
            // SAFETY: Redis calls a command handler with its live context
            // and `argc` argument strings, valid until the handler returns.
            let call = unsafe { $crate::ffi::Ctx::from_raw(ctx, argv, argc, $name) };
            $crate::ffi::context::run(call, |ctx, args| {
                $crate::guard::run(ctx, || $body(ctx, args))
            })
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

/// What a trampoline returns to Redis: OK once the handler ran (it has
/// replied), ERR if the module never loaded.
pub fn run(call: Option<(Ctx, Args)>, body: impl FnOnce(&Ctx, &Args)) -> c_int {
    match call {
        Some((ctx, args)) => {
            body(&ctx, &args);
            OK
        }
        None => ERR,
    }
}

impl Ctx {
    /// The context and arguments of a call of `command`, `None` if the
    /// module did not load (no table).
    ///
    /// # Safety
    /// `raw` must be the live context Redis passed to a command handler
    /// (or to `RedisModule_OnUnload`, with no arguments), and `argv` must
    /// point to `argc` strings that stay valid for `'a`, which must not
    /// outlive the call.
    pub unsafe fn from_raw<'a>(
        raw: *mut RedisModuleCtx,
        argv: *mut *mut RedisModuleString,
        argc: c_int,
        command: &'static CStr,
    ) -> Option<(Ctx, Args<'a>)> {
        let api = Api::get()?;
        let len = usize::try_from(argc).unwrap_or(0);
        let argv = if argv.is_null() || len == 0 {
            &[][..]
        } else {
            // SAFETY: the caller's promise about argv and argc.
            unsafe { std::slice::from_raw_parts(argv, len) }
        };
        Some((Ctx { raw, api }, Args { argv, api, command }))
    }

    /// Whether Redis called the handler only to learn where the keys are
    /// (a command registered with `getkeys-api`): Cluster slot checks and,
    /// on Redis 6.2, ACL key patterns. The handler then reports them with
    /// `key_at` and does nothing else.
    pub fn wants_key_positions(&self) -> bool {
        // SAFETY: a live context.
        unsafe { (self.api.is_keys_position_request)(self.raw) != 0 }
    }

    /// Reports argument `pos` as a key that is read and updated, in a key
    /// position request.
    pub fn key_at(&self, pos: usize) {
        let Ok(pos) = c_int::try_from(pos) else {
            return;
        };
        // The flags the key specs give a written key (KeyAtPos alone would
        // claim full access, insert and delete too).
        const UPDATED: u32 = raw::REDISMODULE_CMD_KEY_RW
            | raw::REDISMODULE_CMD_KEY_ACCESS
            | raw::REDISMODULE_CMD_KEY_UPDATE;
        match self.api.key_at_pos_with_flags {
            // SAFETY: a live context in a key position request; the flags
            // are the API's own bits.
            Some(with_flags) => unsafe { with_flags(self.raw, pos, UPDATED as c_int) },
            // SAFETY: a live context in a key position request.
            None => unsafe { (self.api.key_at_pos)(self.raw, pos) },
        }
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
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes the timespec it is given.
        if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut now) } != 0 {
            return 0;
        }
        // time_t and c_long are i64 on 64-bit Linux, narrower elsewhere.
        #[allow(clippy::useless_conversion)]
        let (sec, nsec) = (i64::from(now.tv_sec), i64::from(now.tv_nsec));
        sec.checked_mul(1_000_000)
            .map_or(i64::MAX, |us| us + nsec / 1000)
            .max(0)
    }

    /// Opens `name` for reading, and for writing too if `write`.
    pub fn open_key<'c>(&'c self, name: ArgString<'c>, write: bool) -> Key<'c> {
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
            ctx: self.raw,
            api: self.api,
        }
    }

    /// The value of the string key `name`, read through `GET` so its
    /// encoding stays as it is; `None` if it holds no string.
    pub fn string_value(&self, name: ArgString) -> Option<Vec<u8>> {
        call::get(self.raw, self.api, name)
    }

    /// A new string holding `bytes`, freed when dropped.
    pub fn string(&self, bytes: &[u8]) -> Option<OwnedString<'_>> {
        // SAFETY: CreateString copies `len` bytes from `ptr`.
        let s = unsafe { (self.api.create_string)(self.raw, bytes.as_ptr().cast(), bytes.len()) };
        OwnedString::own(s, self.raw, self.api)
    }

    /// A string holding `bytes` that outlives this call: see `Kept`.
    pub fn keep(&self, bytes: &[u8]) -> Option<Kept> {
        // SAFETY: CreateString copies `len` bytes from `ptr`; with a NULL
        // context the string is not freed when the command returns.
        let s = unsafe {
            (self.api.create_string)(ptr::null_mut(), bytes.as_ptr().cast(), bytes.len())
        };
        NonNull::new(s).map(Kept)
    }

    /// Frees a string `keep` made. Redis counts references to its strings,
    /// so one that a pending replication still holds lives until that is
    /// done with it.
    pub fn release(&self, kept: Kept) {
        // SAFETY: made by CreateString with a NULL context, and consumed
        // here, so freed once.
        unsafe { (self.api.free_string)(ptr::null_mut(), kept.0.as_ptr()) }
    }

    /// Replicates `command` with these string arguments as an effect of
    /// this call. False if Redis refused (an unknown command).
    #[inline]
    pub fn replicate(&self, command: &CStr, args: &[&dyn RString]) -> bool {
        let (ctx, c) = (self.raw, command.as_ptr());
        let f = self.api.replicate;
        if !matches!(args.len(), 1 | 2 | 5) {
            // `v`: an array of strings and its length.
            let ptrs: Vec<*mut RedisModuleString> = args.iter().map(|a| a.ptr()).collect();
            // SAFETY: `v` takes a pointer to `len` live Redis strings.
            let rc = unsafe { f(ctx, c, c"v".as_ptr(), ptrs.as_ptr(), ptrs.len()) };
            return rc == OK;
        }
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
                _ => ERR, // ruled out above
            }
        };
        rc == OK
    }

    /// Replicates `command key bytes` as an effect of this call, the last
    /// argument copied from `bytes` by Redis: for a value only the
    /// replication needs, cheaper than a string made for it. False if
    /// Redis refused (an unknown command).
    pub fn replicate_key_bytes(&self, command: &CStr, key: &dyn RString, bytes: &[u8]) -> bool {
        // SAFETY: `s` takes one live Redis string, `b` a pointer and a
        // length (size_t) that Redis copies before returning.
        let rc = unsafe {
            (self.api.replicate)(
                self.raw,
                command.as_ptr(),
                c"sb".as_ptr(),
                key.ptr(),
                bytes.as_ptr(),
                bytes.len(),
            )
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
        let len = c_long::try_from(len).unwrap_or(c_long::MAX);
        // SAFETY: a live context.
        unsafe { (self.api.reply_with_array)(self.raw, len) };
    }

    pub fn reply_int(&self, v: i64) {
        // SAFETY: a live context.
        unsafe { (self.api.reply_with_long_long)(self.raw, v) };
    }

    /// An error reply: `error`'s text, which starts with its code (`ERR`,
    /// `WRONGTYPE`).
    pub fn reply_error(&self, error: &impl std::fmt::Display) {
        // An interior NUL would truncate the message; none of ours has one.
        let text = CString::new(error.to_string().replace('\0', " ")).unwrap_or_default();
        // SAFETY: a live context and a NUL-terminated message.
        unsafe { (self.api.reply_with_error)(self.raw, text.as_ptr()) };
    }
}

impl<'a> Args<'a> {
    /// The argument at `i` as a Redis string (a key name, a lease id),
    /// `None` past the end.
    pub fn string(&self, i: usize) -> Option<ArgString<'a>> {
        let ptr = NonNull::new(*self.argv.get(i)?)?;
        Some(ArgString {
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
    fn command(&self) -> &'static CStr {
        self.command
    }
}
