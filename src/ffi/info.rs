//! The module's `INFO` section (`# tb`, fields prefixed `tb_` by Redis).

use redis_module::raw::{self, RedisModuleInfoCtx};
use std::ffi::CStr;
use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::OnceLock;

/// What `INFO` is being written into, while the section's function runs.
pub struct Info {
    raw: *mut RedisModuleInfoCtx,
}

impl Info {
    /// Starts the module's own section, named after the module.
    pub fn section(&mut self) {
        // SAFETY: a function pointer read after load; a live info context
        // and NULL for the module's default section name.
        if let Some(add) = unsafe { raw::RedisModule_InfoAddSection } {
            // SAFETY: as above.
            unsafe { add(self.raw, ptr::null_mut()) };
        }
    }

    pub fn text(&mut self, name: &CStr, value: &CStr) {
        // SAFETY: a function pointer read after load.
        if let Some(add) = unsafe { raw::RedisModule_InfoAddFieldCString } {
            // SAFETY: a live info context, two NUL-terminated strings.
            unsafe { add(self.raw, name.as_ptr(), value.as_ptr()) };
        }
    }

    pub fn count(&mut self, name: &CStr, value: u64) {
        // SAFETY: a function pointer read after load.
        if let Some(add) = unsafe { raw::RedisModule_InfoAddFieldULongLong } {
            // SAFETY: a live info context and a NUL-terminated name.
            unsafe { add(self.raw, name.as_ptr(), value) };
        }
    }
}

/// The function that writes the section, set once at load.
static SECTION: OnceLock<fn(&mut Info)> = OnceLock::new();

/// What Redis calls for `INFO`. A panic here would abort the server, so it
/// is caught (and the section is left as far as it got).
pub(super) extern "C" fn write_section(ctx: *mut RedisModuleInfoCtx, _for_crash_report: c_int) {
    if let Some(section) = SECTION.get() {
        let _ = catch_unwind(AssertUnwindSafe(|| section(&mut Info { raw: ctx })));
    }
}

/// Keeps `section` as the module's INFO writer; false if one was kept
/// before (a second MODULE LOAD in the same process keeps the first).
pub(super) fn set_section(section: fn(&mut Info)) {
    let _ = SECTION.set(section);
}
