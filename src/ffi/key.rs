//! An open key: what it holds, its hash fields, its expire time. Closed on
//! drop; writes take `&mut self`, so nothing read in place outlives a change.

use super::api::{Api, OK};
use super::string::{Interned, KeyName, OwnedString, RString};
use redis_module::raw::{self, RedisModuleCtx, RedisModuleKey, RedisModuleString};
use std::os::raw::{c_char, c_int};
use std::ptr::{self, NonNull};
use tb_core::state::KeyKind;

/// An open key, closed on drop. A key that could not be opened reads as
/// missing and refuses every write.
pub struct Key<'c> {
    pub(super) key: Option<NonNull<RedisModuleKey>>,
    pub(super) name: KeyName<'c>,
    pub(super) ctx: *mut RedisModuleCtx,
    pub(super) api: &'static Api,
}

impl<'c> Key<'c> {
    pub fn name(&self) -> KeyName<'c> {
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
            (self.api.hash_get)(
                key.as_ptr(),
                raw::REDISMODULE_HASH_NONE as c_int,
                a.ptr(),
                &mut va as *mut *mut RedisModuleString,
                b.ptr(),
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
            (self.api.hash_set)(
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
