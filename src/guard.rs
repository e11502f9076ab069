//! Panic containment. A panic unwinding into Redis would abort the server
//! and drop every client and all unsaved data, so each handler runs inside
//! `run` (through `ffi::handler!`), which turns a panic into an error
//! reply. The hook installed at load logs the panic through the Redis log
//! first.

use crate::ffi::{log_warning, Ctx};
use crate::stats;
use std::panic::{catch_unwind, AssertUnwindSafe};
use tb_core::error::Error;

/// Routes panic messages to the Redis log (stderr may go nowhere).
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        log_warning(&format!("tb: panic contained in a command handler: {info}"));
    }));
}

/// Runs a handler body. `Err(error)` becomes an error reply; so does a
/// panic. Handlers reply only after all fallible work, so a panic can't
/// leave a half-written reply behind.
pub fn run(ctx: &Ctx, body: impl FnOnce() -> Result<(), Error>) {
    let error = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return,
        Ok(Err(error)) => error,
        Err(_) => {
            stats::PANICS.incr();
            Error::Panic
        }
    };
    stats::ERRORS.incr();
    ctx.reply_error(&error);
}
