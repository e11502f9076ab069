//! The wall around the Redis module API. Every raw call, and every
//! `unsafe` in the module, is in this folder; everything above it uses the
//! safe types here:
//!
//! * [`api`]: the function table, resolved and checked once at load, and
//!   the server log;
//! * [`load`]: the module's entry points (`module!`), its arguments, and
//!   registration of commands with their docs and key specs;
//! * [`context`]: a command's [`Ctx`] and [`Args`], made by the
//!   [`handler!`] trampoline, with replies, replication and the clock,
//!   and [`CommandLocal`], state that only command calls use;
//! * [`string`]: RAII and interned Redis strings, and key names;
//! * [`key`]: an open key, closed on drop;
//! * [`call`]: `RedisModule_Call`, for a string key's value, whether a
//!   command exists, and a setting's value;
//! * [`info`]: the `INFO tb` section;
//! * [`watch`]: the memory settings, read at load and on every change.
//!
//! The safe methods rely on two invariants, set up here and nowhere else:
//! the table holds every function the commands call (`api::Api::resolve`),
//! and a `Ctx` exists only inside a call Redis made into the module, a
//! command's or `RedisModule_OnUnload` (`Ctx::from_raw`).

// The one module where raw calls compile: Cargo.toml denies `unsafe_code`
// for the rest of the crate.
#![allow(unsafe_code)]

mod api;
mod call;
pub mod context;
mod info;
mod key;
pub mod load;
mod string;
mod watch;

pub use api::log_warning;
pub use context::{Args, CommandLocal, Ctx, RawHandler};
pub use info::Info;
pub use key::Key;
pub use load::{ArgDoc, ArgKind, Begin, CommandDef, Docs, Find, KeySpec, Load};
pub use string::{ArgString, Interned, Kept, OwnedString, RString};
pub use watch::Memory;

pub(crate) use context::handler;
pub(crate) use load::module;
