//! Bucket hashes in the keyspace, through Redis's low-level key API, and
//! the replication of every write as effects (`HSET`, `PEXPIREAT`, `DEL`).
//!
//! Effects, never the command: a replica or an AOF replay, with or without
//! the module, then ends with the primary's exact hash and expire time
//! instead of recomputing with its own clock.
//!
//! Every function pointer used here is checked at load time
//! (`missing_api`), so the `None` branches are unreachable in a loaded
//! module; they degrade to harmless values rather than panicking.

use redis_module::raw::{self, RedisModuleCtx, RedisModuleKey, RedisModuleString};
use std::os::raw::{c_char, c_int};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering::Relaxed};
use tb_core::args::Argv;
use tb_core::bucket::{Limits, Outcome, Stored};
use tb_core::state::{self, StateError, Text};

/// The first module API function the handlers need that this server lacks.
/// Checked once at load, so a missing one stops the load instead of
/// surfacing in a command.
pub fn missing_api() -> Option<&'static str> {
    macro_rules! check {
        ($($name:ident),*) => {
            $(
                // Copy the Option out of the `static mut`; never borrow it.
                let f = unsafe { raw::$name };
                if f.is_none() {
                    return Some(stringify!($name));
                }
            )*
        };
    }
    check!(
        RedisModule_OpenKey,
        RedisModule_CloseKey,
        RedisModule_KeyType,
        RedisModule_ValueLength,
        RedisModule_HashGet,
        RedisModule_HashSet,
        RedisModule_SetAbsExpire,
        RedisModule_DeleteKey,
        RedisModule_Replicate,
        RedisModule_CreateString,
        RedisModule_FreeString,
        RedisModule_StringPtrLen,
        RedisModule_ReplyWithArray,
        RedisModule_ReplyWithLongLong,
        RedisModule_ReplyWithError,
        RedisModule_NotifyKeyspaceEvent,
        RedisModule_SignalModifiedKey,
        RedisModule_SetModuleOptions
    );
    None
}

/// Bytes of a Redis string, borrowed for as long as Redis keeps it.
fn bytes<'a>(s: *const RedisModuleString) -> &'a [u8] {
    let mut len = 0usize;
    match unsafe { raw::RedisModule_StringPtrLen } {
        Some(f) if !s.is_null() => {
            let p = unsafe { f(s, &mut len) };
            if p.is_null() {
                &[]
            } else {
                unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }
            }
        }
        _ => &[],
    }
}

/// A command's argv, read in place (no copies into `String`s).
pub struct Args {
    argv: *mut *mut RedisModuleString,
    argc: usize,
}

impl Args {
    pub fn new(argv: *mut *mut RedisModuleString, argc: c_int) -> Self {
        Args {
            argv,
            argc: usize::try_from(argc).unwrap_or(0),
        }
    }

    /// The Redis string at `i`, for use as a key name.
    pub fn raw(&self, i: usize) -> *mut RedisModuleString {
        if i < self.argc {
            unsafe { *self.argv.add(i) }
        } else {
            ptr::null_mut()
        }
    }
}

impl Argv for Args {
    fn count(&self) -> usize {
        self.argc
    }
    fn arg(&self, i: usize) -> &[u8] {
        bytes(self.raw(i))
    }
}

/// Why a key can't be used as a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyError {
    WrongType,
    State(StateError),
}

/// An open key that should hold a bucket. Closed on drop.
pub struct BucketKey {
    ctx: *mut RedisModuleCtx,
    key: *mut RedisModuleKey,
    name: *mut RedisModuleString,
}

/// The field names as Redis strings, made once and kept for the life of the
/// process (two small strings; not freed on MODULE UNLOAD). Passing them
/// instead of C strings (`REDISMODULE_HASH_CFIELDS`, format `c`) spares
/// HashGet, HashSet and Replicate an allocation and a free per field.
/// Only the main thread runs commands, so `Relaxed` is enough.
static TOKENS: AtomicPtr<RedisModuleString> = AtomicPtr::new(ptr::null_mut());
static TS: AtomicPtr<RedisModuleString> = AtomicPtr::new(ptr::null_mut());

fn field_names() -> (*mut RedisModuleString, *mut RedisModuleString) {
    let cached = |slot: &AtomicPtr<RedisModuleString>, name: &str| {
        let mut s = slot.load(Relaxed);
        if s.is_null() {
            // A NULL context: not freed when the command returns.
            s = create(ptr::null_mut(), name.as_bytes());
            slot.store(s, Relaxed);
        }
        s
    };
    (
        cached(&TOKENS, state::TOKENS_FIELD),
        cached(&TS, state::TS_FIELD),
    )
}

fn open_key(
    ctx: *mut RedisModuleCtx,
    name: *mut RedisModuleString,
    mode: u32,
) -> *mut RedisModuleKey {
    match unsafe { raw::RedisModule_OpenKey } {
        Some(f) if !name.is_null() => unsafe { f(ctx, name, mode as c_int) },
        _ => ptr::null_mut(),
    }
}

fn create(ctx: *mut RedisModuleCtx, text: &[u8]) -> *mut RedisModuleString {
    match unsafe { raw::RedisModule_CreateString } {
        Some(f) => unsafe { f(ctx, text.as_ptr().cast::<c_char>(), text.len()) },
        None => ptr::null_mut(),
    }
}

impl BucketKey {
    /// Opens `name` for reading (`write` false) or for reading and writing.
    ///
    /// A writer opens the key once, before it knows whether it will write:
    /// the module runs with `REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED`
    /// (set in `lib.rs`), so closing the key signals nothing by itself, and
    /// `save` signals it only after a real change. A denial therefore
    /// aborts no WATCH and sends no client-side cache invalidation.
    pub fn open(ctx: *mut RedisModuleCtx, name: *mut RedisModuleString, write: bool) -> Self {
        let mode = if write {
            raw::REDISMODULE_READ | raw::REDISMODULE_WRITE
        } else {
            raw::REDISMODULE_READ
        };
        BucketKey {
            ctx,
            key: open_key(ctx, name, mode),
            name,
        }
    }

    fn close(&mut self) {
        if let (Some(f), false) = (unsafe { raw::RedisModule_CloseKey }, self.key.is_null()) {
            unsafe { f(self.key) }
        }
        self.key = ptr::null_mut();
    }

    fn key_type(&self) -> c_int {
        match unsafe { raw::RedisModule_KeyType } {
            Some(f) if !self.key.is_null() => unsafe { f(self.key) },
            _ => raw::REDISMODULE_KEYTYPE_EMPTY as c_int,
        }
    }

    pub fn exists(&self) -> bool {
        self.key_type() != raw::REDISMODULE_KEYTYPE_EMPTY as c_int
    }

    /// The stored bucket, `None` for a missing key (a full bucket).
    pub fn load(&self) -> Result<Option<Stored>, KeyError> {
        match self.key_type() as isize {
            raw::REDISMODULE_KEYTYPE_EMPTY => return Ok(None),
            raw::REDISMODULE_KEYTYPE_HASH => {}
            _ => return Err(KeyError::WrongType),
        }
        let len = match unsafe { raw::RedisModule_ValueLength } {
            Some(f) => unsafe { f(self.key) },
            None => 0,
        };
        if len != 2 {
            return Err(KeyError::State(StateError::Fields));
        }
        let mut tokens: *mut RedisModuleString = ptr::null_mut();
        let mut ts: *mut RedisModuleString = ptr::null_mut();
        let (tokens_field, ts_field) = field_names();
        if let (Some(f), false, false) = (
            unsafe { raw::RedisModule_HashGet },
            tokens_field.is_null(),
            ts_field.is_null(),
        ) {
            unsafe {
                f(
                    self.key,
                    raw::REDISMODULE_HASH_NONE as c_int,
                    tokens_field,
                    &mut tokens as *mut *mut RedisModuleString,
                    ts_field,
                    &mut ts as *mut *mut RedisModuleString,
                    ptr::null::<c_char>(),
                );
            }
        }
        let field = |s: *mut RedisModuleString| (!s.is_null()).then(|| bytes(s));
        let decoded = state::decode(field(tokens), field(ts)).map_err(KeyError::State);
        self.free(tokens);
        self.free(ts);
        decoded.map(Some)
    }

    fn free(&self, s: *mut RedisModuleString) {
        if let (Some(f), false) = (unsafe { raw::RedisModule_FreeString }, s.is_null()) {
            unsafe { f(self.ctx, s) }
        }
    }

    /// Stores a bucket's new balance, or deletes the key if the bucket is
    /// full (a missing key *is* a full bucket, and takes no memory).
    pub fn save(&self, limits: &Limits, outcome: &Outcome, now_us: i64) {
        if limits.is_full(outcome.tokens) {
            if !self.exists() {
                // Full and already absent: nothing changes.
                return;
            }
            self.delete();
        } else {
            let at = Limits::expire_at_ms(now_us, outcome.reset_after_ms);
            self.write(outcome.tokens, now_us, at);
        }
        // What closing a written key would do without the module option:
        // abort WATCHes, invalidate client-side caches.
        if let Some(f) = unsafe { raw::RedisModule_SignalModifiedKey } {
            unsafe { f(self.ctx, self.name) };
        }
    }

    fn write(&self, tokens: f64, ts_us: i64, expire_at_ms: i64) {
        let (tokens_field, ts_field) = field_names();
        if tokens_field.is_null() || ts_field.is_null() {
            return;
        }
        let tok = create(self.ctx, Text::tokens(tokens).as_bytes());
        let ts = create(self.ctx, Text::int(ts_us).as_bytes());
        // Format `l` would build this with two allocations, not one.
        let at = create(self.ctx, Text::int(expire_at_ms).as_bytes());
        unsafe {
            if let Some(f) = raw::RedisModule_HashSet {
                f(
                    self.key,
                    raw::REDISMODULE_HASH_NONE as c_int,
                    tokens_field,
                    tok,
                    ts_field,
                    ts,
                    ptr::null::<c_char>(),
                );
            }
            if let Some(f) = raw::RedisModule_SetAbsExpire {
                f(self.key, expire_at_ms);
            }
            // The events a plain HSET + PEXPIREAT would raise, as replicas
            // and the Lua fallback raise them.
            self.notify(raw::REDISMODULE_NOTIFY_HASH, c"hset");
            self.notify(raw::REDISMODULE_NOTIFY_GENERIC, c"expire");
            if let Some(f) = raw::RedisModule_Replicate {
                // `s` only takes a reference; `c` would copy each name.
                f(
                    self.ctx,
                    c"HSET".as_ptr(),
                    c"sssss".as_ptr(),
                    self.name,
                    tokens_field,
                    tok,
                    ts_field,
                    ts,
                );
                f(
                    self.ctx,
                    c"PEXPIREAT".as_ptr(),
                    c"ss".as_ptr(),
                    self.name,
                    at,
                );
            }
        }
        self.free(tok);
        self.free(ts);
        self.free(at);
    }

    /// A keyspace notification for this key (a no-op unless the server's
    /// `notify-keyspace-events` asks for it).
    fn notify(&self, class: c_int, event: &std::ffi::CStr) {
        if let Some(f) = unsafe { raw::RedisModule_NotifyKeyspaceEvent } {
            unsafe { f(self.ctx, class, event.as_ptr(), self.name) };
        }
    }

    fn delete(&self) {
        unsafe {
            if let Some(f) = raw::RedisModule_DeleteKey {
                f(self.key);
            }
            self.notify(raw::REDISMODULE_NOTIFY_GENERIC, c"del");
            if let Some(f) = raw::RedisModule_Replicate {
                f(self.ctx, c"DEL".as_ptr(), c"s".as_ptr(), self.name);
            }
        }
    }
}

impl Drop for BucketKey {
    fn drop(&mut self) {
        self.close();
    }
}
