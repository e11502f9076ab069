//! An open key: what it holds, its hash fields, its expire time. Closed on
//! drop; writes take `&mut self`, so nothing read in place outlives a change.

use super::api::{Api, OK};
use super::string::{string_bytes, ArgString, OwnedString, RString};
use redis_module::raw::{self, RedisModuleCtx, RedisModuleKey, RedisModuleString};
use std::os::raw::{c_char, c_int, c_void};
use std::ptr::{self, NonNull};
use tb_core::state::KeyKind;

/// An open key, closed on drop. A key that could not be opened reads as
/// missing and refuses every write.
pub struct Key<'c> {
    pub(super) key: Option<NonNull<RedisModuleKey>>,
    pub(super) name: ArgString<'c>,
    pub(super) ctx: *mut RedisModuleCtx,
    pub(super) api: &'static Api,
}

impl<'c> Key<'c> {
    pub fn name(&self) -> ArgString<'c> {
        self.name
    }

    /// The raw type of the open key, `None` for a key that is not open.
    fn key_type(&self) -> Option<isize> {
        let key = self.key?;
        // SAFETY: an open key.
        Some(unsafe { (self.api.key_type)(key.as_ptr()) } as isize)
    }

    /// What the key holds.
    pub fn kind(&self) -> KeyKind {
        let (Some(key), Some(kind)) = (self.key, self.key_type()) else {
            return KeyKind::Missing;
        };
        match kind {
            raw::REDISMODULE_KEYTYPE_EMPTY => KeyKind::Missing,
            raw::REDISMODULE_KEYTYPE_HASH => {
                // SAFETY: an open key holding a hash.
                let fields = unsafe { (self.api.value_length)(key.as_ptr()) };
                KeyKind::Hash(fields)
            }
            _ => KeyKind::Other,
        }
    }

    /// Whether the key holds a string.
    pub fn is_string(&self) -> bool {
        self.key_type() == Some(raw::REDISMODULE_KEYTYPE_STRING)
    }

    /// The values of two fields of a hash (`None`: absent).
    pub fn hash_get(
        &self,
        a: &(impl RString + ?Sized),
        b: &(impl RString + ?Sized),
    ) -> (Option<OwnedString<'c>>, Option<OwnedString<'c>>) {
        self.hash_get_two(a.ptr(), b.ptr())
    }

    /// The value of one field of a hash (`None`: absent).
    pub fn hash_get_field(&self, field: &(impl RString + ?Sized)) -> Option<OwnedString<'c>> {
        self.hash_get_two(field.ptr(), ptr::null_mut()).0
    }

    /// HashGet of the fields `a` and `b`, or of `a` alone if `b` is NULL
    /// (Redis reads fields up to the first NULL one).
    #[inline(always)]
    fn hash_get_two(
        &self,
        a: *mut RedisModuleString,
        b: *mut RedisModuleString,
    ) -> (Option<OwnedString<'c>>, Option<OwnedString<'c>>) {
        let Some(key) = self.key else {
            return (None, None);
        };
        let (mut va, mut vb): (*mut RedisModuleString, *mut RedisModuleString) =
            (ptr::null_mut(), ptr::null_mut());
        // SAFETY: an open hash key, field/out-pointer pairs, NULL-terminated;
        // HashGet hands over new strings (or leaves NULL).
        unsafe {
            (self.api.hash_get)(
                key.as_ptr(),
                raw::REDISMODULE_HASH_NONE as c_int,
                a,
                &mut va as *mut *mut RedisModuleString,
                b,
                &mut vb as *mut *mut RedisModuleString,
                ptr::null::<c_char>(),
            )
        };
        let own = |p| OwnedString::own(p, self.ctx, self.api);
        (own(va), own(vb))
    }

    /// Sets two fields of a hash (creating it); true if both were written.
    pub fn hash_set(
        &mut self,
        a: &(impl RString + ?Sized),
        va: &dyn RString,
        b: &(impl RString + ?Sized),
        vb: &dyn RString,
    ) -> bool {
        // COUNT_ALL: the result counts inserted fields too, so 2 means
        // both fields were written.
        let all = raw::REDISMODULE_HASH_COUNT_ALL;
        let pairs = [
            [a.ptr(), va.ptr()],
            [b.ptr(), vb.ptr()],
            [ptr::null_mut(); 2],
        ];
        self.hash_set_three(all, pairs) == Some(2)
    }

    /// Sets the field/value pairs of `pairs` (one to three) in a hash
    /// (creating it); true if all were written.
    pub fn hash_set_pairs(&mut self, pairs: &[(&dyn RString, &dyn RString)]) -> bool {
        let mut raw_pairs = [[ptr::null_mut(); 2]; 3];
        if pairs.is_empty() || pairs.len() > raw_pairs.len() {
            return false;
        }
        for (slot, (field, value)) in raw_pairs.iter_mut().zip(pairs) {
            *slot = [field.ptr(), value.ptr()];
        }
        // COUNT_ALL: the result counts inserted fields too, so it is the
        // number of pairs when every one was written.
        let all = raw::REDISMODULE_HASH_COUNT_ALL;
        self.hash_set_three(all, raw_pairs) == c_int::try_from(pairs.len()).ok()
    }

    /// HashSet with `flags` of up to three field/value pairs: those before
    /// the first NULL field (Redis reads pairs up to it): what Redis
    /// returns, `None` if the key could not be opened.
    #[inline(always)]
    fn hash_set_three(
        &mut self,
        flags: u32,
        [[a, va], [b, vb], [c, vc]]: [[*mut RedisModuleString; 2]; 3],
    ) -> Option<c_int> {
        let key = self.key?;
        // SAFETY: a key open for writing, field/value pairs, NULL-terminated.
        Some(unsafe {
            (self.api.hash_set)(
                key.as_ptr(),
                flags as c_int,
                a,
                va,
                b,
                vb,
                c,
                vc,
                ptr::null::<c_char>(),
            )
        })
    }

    /// Calls `visit(field, value)` for each field of a hash, until it
    /// returns `Err`, which is then the result. A key that holds no hash
    /// visits nothing.
    pub fn scan_hash<E>(
        &self,
        mut visit: impl FnMut(&[u8], &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let Some(key) = self.key else {
            return Ok(());
        };
        type Visit<'v, E> = dyn FnMut(&[u8], &[u8]) -> Result<(), E> + 'v;
        struct State<'v, E> {
            api: &'static Api,
            visit: &'v mut Visit<'v, E>,
            result: Result<(), E>,
        }
        extern "C" fn each<E>(
            _key: *mut RedisModuleKey,
            field: *mut RedisModuleString,
            value: *mut RedisModuleString,
            state: *mut c_void,
        ) {
            // SAFETY: `state` is the State that `scan_hash` below passed,
            // alive and not otherwise borrowed during ScanKey.
            let state = unsafe { &mut *state.cast::<State<E>>() };
            if state.result.is_ok() {
                let (f, v) = (
                    string_bytes(state.api, field),
                    string_bytes(state.api, value),
                );
                state.result = (state.visit)(f, v);
            }
        }
        let mut state = State {
            api: self.api,
            visit: &mut visit,
            result: Ok(()),
        };
        // SAFETY: a plain constructor.
        let cursor = unsafe { (self.api.scan_cursor_create)() };
        if cursor.is_null() {
            return Ok(());
        }
        let state_ptr: *mut State<E> = &mut state;
        // SAFETY: an open hash key, a live cursor, a callback of the right
        // type and its state, which outlives the loop; the fields and values
        // it sees are valid during each callback, where they are read.
        while unsafe {
            (self.api.scan_key)(key.as_ptr(), cursor, Some(each::<E>), state_ptr.cast())
        } != 0
        {
            if state.result.is_err() {
                break;
            }
        }
        // SAFETY: made above, destroyed once.
        unsafe { (self.api.scan_cursor_destroy)(cursor) };
        state.result
    }

    /// Deletes one field of a hash (Redis deletes the key with its last
    /// field); true if the field was there and Redis deleted it.
    pub fn hash_delete_field(&mut self, field: &dyn RString) -> bool {
        // The DELETE marker as the value.
        let delete = [field.ptr(), raw::REDISMODULE_HASH_DELETE.cast_mut()];
        let none = [ptr::null_mut(); 2];
        self.hash_set_three(raw::REDISMODULE_HASH_NONE, [delete, none, none]) == Some(1)
    }

    /// Sets the absolute expire time in ms; true if Redis did.
    pub fn set_abs_expire(&mut self, at_ms: i64) -> bool {
        let Some(key) = self.key else {
            return false;
        };
        // SAFETY: an open key.
        unsafe { (self.api.set_abs_expire)(key.as_ptr(), at_ms) == OK }
    }

    /// Deletes the key; true if Redis did.
    pub fn delete(&mut self) -> bool {
        let Some(key) = self.key else {
            return false;
        };
        // SAFETY: an open key.
        unsafe { (self.api.delete_key)(key.as_ptr()) == OK }
    }
}

impl Drop for Key<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            // SAFETY: opened by OpenKey, closed only here.
            unsafe { (self.api.close_key)(key.as_ptr()) }
        }
    }
}
