//! Redis strings: key names from argv, strings made during a command
//! (freed on drop), strings kept from one command to the next (freed by
//! `Ctx::release`), and strings interned for the life of the process.

use super::api::Api;
use redis_module::raw::{RedisModuleCtx, RedisModuleString};
use std::marker::PhantomData;
use std::ptr::NonNull;

/// Anything that is a Redis string: a key name from argv, a string the
/// module made, an interned name. Sealed: only this folder implements it.
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
pub struct Interned(pub(super) NonNull<RedisModuleString>);

// SAFETY: Redis runs commands on its main thread only, and the string is
// never changed or freed after it is made.
unsafe impl Send for Interned {}
// SAFETY: as above: shared only with the main thread, never mutated.
unsafe impl Sync for Interned {}

impl sealed::Sealed for Interned {}
impl RString for Interned {
    #[inline]
    fn ptr(&self) -> *mut RedisModuleString {
        self.0.as_ptr()
    }
}

/// A string made during a command but kept past it (made with no context,
/// so Redis does not free it when the command returns), until the module
/// hands it back to `Ctx::release`. Not freed on drop: it lives in a
/// `Cell` of a static (`CommandLocal`), which never drops what it holds.
pub struct Kept(pub(super) NonNull<RedisModuleString>);

impl sealed::Sealed for Kept {}
impl RString for Kept {
    #[inline]
    fn ptr(&self) -> *mut RedisModuleString {
        self.0.as_ptr()
    }
}

/// A string the module made (or HashGet handed over) during a command in
/// the context `'c`, freed on drop.
pub struct OwnedString<'c> {
    ptr: NonNull<RedisModuleString>,
    ctx: *mut RedisModuleCtx,
    api: &'static Api,
    _call: PhantomData<&'c ()>,
}

impl<'c> OwnedString<'c> {
    /// Takes ownership of `ptr`, a string made in the live context `ctx`.
    pub(super) fn own(
        ptr: *mut RedisModuleString,
        ctx: *mut RedisModuleCtx,
        api: &'static Api,
    ) -> Option<OwnedString<'c>> {
        NonNull::new(ptr).map(|ptr| OwnedString {
            ptr,
            ctx,
            api,
            _call: PhantomData,
        })
    }

    pub fn bytes(&self) -> &[u8] {
        string_bytes(self.api, self.ptr.as_ptr())
    }
}

impl sealed::Sealed for OwnedString<'_> {}
impl RString for OwnedString<'_> {
    #[inline]
    fn ptr(&self) -> *mut RedisModuleString {
        self.ptr.as_ptr()
    }
}

impl Drop for OwnedString<'_> {
    fn drop(&mut self) {
        // SAFETY: made by CreateString or handed over by HashGet in this
        // context, and freed only here.
        unsafe { (self.api.free_string)(self.ctx, self.ptr.as_ptr()) }
    }
}

/// An argument of the command (a key name, a lease id), valid for the
/// command.
#[derive(Clone, Copy)]
pub struct ArgString<'a> {
    pub(super) ptr: NonNull<RedisModuleString>,
    pub(super) _argv: PhantomData<&'a ()>,
}

impl sealed::Sealed for ArgString<'_> {}
impl RString for ArgString<'_> {
    #[inline]
    fn ptr(&self) -> *mut RedisModuleString {
        self.ptr.as_ptr()
    }
}

/// Bytes of a Redis string, borrowed for as long as the string is.
pub(super) fn string_bytes<'s>(api: &Api, s: *mut RedisModuleString) -> &'s [u8] {
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
