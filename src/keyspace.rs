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
use std::ffi::CStr;
use std::os::raw::{c_char, c_int};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering::Relaxed};
use tb_core::args::Argv;
use tb_core::bucket::{Effect, Stored};
use tb_core::state::{self, StateError, Text};

/// The steps of a write that can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    HashSet,
    Expire,
    Delete,
    Replicate,
}

#[cfg(feature = "test-hooks")]
use crate::hooks::injected;

/// Release builds never fail a step on purpose (`test-hooks` builds can).
#[cfg(not(feature = "test-hooks"))]
#[inline(always)]
fn injected(_: Step) -> bool {
    false
}

/// The commands writes replicate as effects, in the order checked.
const EFFECTS: [&CStr; 3] = [c"HSET", c"PEXPIREAT", c"DEL"];

/// The first effect command this server can't run, because redis.conf
/// renamed or disabled it (`rename-command PEXPIREAT ""`). Replicating a
/// write needs all three by name, so a server without one would change
/// buckets its replicas and AOF never hear of: the module refuses to load.
pub fn missing_effect(ctx: *mut RedisModuleCtx) -> Option<&'static str> {
    // Each function pointer was checked by `missing_api` just before.
    let (Some(call), Some(kind), Some(len), Some(at), Some(free)) = (unsafe {
        (
            raw::RedisModule_Call,
            raw::RedisModule_CallReplyType,
            raw::RedisModule_CallReplyLength,
            raw::RedisModule_CallReplyArrayElement,
            raw::RedisModule_FreeCallReply,
        )
    }) else {
        return Some("the module API to look commands up");
    };
    for name in EFFECTS {
        // COMMAND INFO answers [nil] for a command the table lacks.
        let known = unsafe {
            let reply = call(
                ctx,
                c"COMMAND".as_ptr(),
                c"cc".as_ptr(),
                c"INFO".as_ptr(),
                name.as_ptr(),
            );
            let known = !reply.is_null()
                && kind(reply) == raw::REDISMODULE_REPLY_ARRAY as c_int
                && len(reply) == 1
                && kind(at(reply, 0)) == raw::REDISMODULE_REPLY_ARRAY as c_int;
            if !reply.is_null() {
                free(reply);
            }
            known
        };
        if !known {
            return name.to_str().ok();
        }
    }
    None
}

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
        RedisModule_SetModuleOptions,
        RedisModule_Call,
        RedisModule_CallReplyType,
        RedisModule_CallReplyLength,
        RedisModule_CallReplyArrayElement,
        RedisModule_FreeCallReply
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

    /// Carries out a call's effect on this key, and replicates it. `Err`
    /// names the step that failed; nothing else is attempted after it.
    ///
    /// Each local change is checked before it is replicated, so a failed
    /// HashSet or DeleteKey leaves both sides untouched, and a failed
    /// SetAbsExpire replicates the HSET alone. `RedisModule_Replicate`
    /// fails only for an unknown command, which `missing_effects` rules
    /// out at load; its result is checked all the same.
    pub fn apply(&self, effect: &Effect) -> Result<(), &'static str> {
        match *effect {
            Effect::Nothing => return Ok(()),
            Effect::Save {
                tokens,
                ts_us,
                expire_at_ms,
            } => self.write(tokens, ts_us, expire_at_ms)?,
            Effect::Delete => self.delete()?,
        }
        // What closing a written key would do without the module option:
        // abort WATCHes, invalidate client-side caches.
        if let Some(f) = unsafe { raw::RedisModule_SignalModifiedKey } {
            unsafe { f(self.ctx, self.name) };
        }
        Ok(())
    }

    fn write(&self, tokens: f64, ts_us: i64, expire_at_ms: i64) -> Result<(), &'static str> {
        let (tokens_field, ts_field) = field_names();
        if tokens_field.is_null() || ts_field.is_null() {
            return Err("HSET");
        }
        let tok = create(self.ctx, Text::tokens(tokens).as_bytes());
        let ts = create(self.ctx, Text::int(ts_us).as_bytes());
        // Format `l` would build this with two allocations, not one.
        let at = create(self.ctx, Text::int(expire_at_ms).as_bytes());
        let result = self.write_fields(tokens_field, tok, ts_field, ts, at, expire_at_ms);
        self.free(tok);
        self.free(ts);
        self.free(at);
        result
    }

    fn write_fields(
        &self,
        tokens_field: *mut RedisModuleString,
        tok: *mut RedisModuleString,
        ts_field: *mut RedisModuleString,
        ts: *mut RedisModuleString,
        at: *mut RedisModuleString,
        expire_at_ms: i64,
    ) -> Result<(), &'static str> {
        // COUNT_ALL: the result counts inserted fields too, so anything
        // but 2 means the hash was not written.
        let set = match unsafe { raw::RedisModule_HashSet } {
            Some(f) if !injected(Step::HashSet) => unsafe {
                f(
                    self.key,
                    raw::REDISMODULE_HASH_COUNT_ALL as c_int,
                    tokens_field,
                    tok,
                    ts_field,
                    ts,
                    ptr::null::<c_char>(),
                )
            },
            _ => 0,
        };
        if set != 2 {
            return Err("HSET");
        }
        // The events a plain HSET + PEXPIREAT would raise, as replicas
        // and the Lua fallback raise them.
        self.notify(raw::REDISMODULE_NOTIFY_HASH, c"hset");
        let expired = match unsafe { raw::RedisModule_SetAbsExpire } {
            Some(f) if !injected(Step::Expire) => unsafe { f(self.key, expire_at_ms) },
            _ => raw::REDISMODULE_ERR as c_int,
        };
        // `s` only takes a reference; `c` would copy each name.
        let hset = self.replicate(
            c"HSET",
            c"sssss",
            &[self.name, tokens_field, tok, ts_field, ts],
        );
        if hset.is_err() {
            return Err("replicate HSET");
        }
        if expired != raw::REDISMODULE_OK as c_int {
            // The hash changed here and, through the HSET above, on the
            // replicas: both keep the old expire time.
            return Err("PEXPIREAT");
        }
        self.notify(raw::REDISMODULE_NOTIFY_GENERIC, c"expire");
        self.replicate(c"PEXPIREAT", c"ss", &[self.name, at])
            .map_err(|()| "replicate PEXPIREAT")
    }

    fn delete(&self) -> Result<(), &'static str> {
        let deleted = match unsafe { raw::RedisModule_DeleteKey } {
            Some(f) if !injected(Step::Delete) => unsafe { f(self.key) },
            _ => raw::REDISMODULE_ERR as c_int,
        };
        if deleted != raw::REDISMODULE_OK as c_int {
            return Err("DEL");
        }
        self.notify(raw::REDISMODULE_NOTIFY_GENERIC, c"del");
        self.replicate(c"DEL", c"s", &[self.name])
            .map_err(|()| "replicate DEL")
    }

    /// `RedisModule_Replicate` of `command` with one to five string
    /// arguments (`format` is that many `s`).
    fn replicate(
        &self,
        command: &CStr,
        format: &CStr,
        args: &[*mut RedisModuleString],
    ) -> Result<(), ()> {
        let Some(f) = (unsafe { raw::RedisModule_Replicate }) else {
            return Err(());
        };
        // A test build can name a command that does not exist, which is
        // how Replicate really fails.
        let command = if injected(Step::Replicate) {
            c"TB-NO-SUCH-COMMAND"
        } else {
            command
        };
        let (ctx, c, fmt) = (self.ctx, command.as_ptr(), format.as_ptr());
        let rc = unsafe {
            match *args {
                [a] => f(ctx, c, fmt, a),
                [a, b] => f(ctx, c, fmt, a, b),
                [a, b, c3, d, e] => f(ctx, c, fmt, a, b, c3, d, e),
                _ => raw::REDISMODULE_ERR as c_int,
            }
        };
        if rc == raw::REDISMODULE_OK as c_int {
            Ok(())
        } else {
            Err(())
        }
    }

    /// A keyspace notification for this key (a no-op unless the server's
    /// `notify-keyspace-events` asks for it).
    fn notify(&self, class: c_int, event: &CStr) {
        if let Some(f) = unsafe { raw::RedisModule_NotifyKeyspaceEvent } {
            unsafe { f(self.ctx, class, event.as_ptr(), self.name) };
        }
    }
}

impl Drop for BucketKey {
    fn drop(&mut self) {
        self.close();
    }
}
