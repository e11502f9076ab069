//! redis-tokenbucket: the `tb` Redis module. This file only registers
//! things; each behaviour lives in the file named after it:
//!
//! * `registry`: the command table (flags, keys, ACL categories, docs);
//! * `commands`: the TB.* handlers (open key, compute, write, reply);
//! * `keyspace`: bucket hashes and effects replication;
//! * `ffi`: the wall around the module API (function table, keys, strings,
//!   replies, clock, registration), the one module allowed raw calls
//!   (Cargo.toml denies them everywhere else);
//! * `guard`: panic containment;
//! * `stats`: the `INFO tb` counters;
//! * `hooks`: TB.PANIC and TB.FAULT, in `test-hooks` builds only;
//! * `tb_core` (crate in `core/`): arithmetic, argument parsing, encoding.

mod commands;
mod ffi;
mod guard;
#[cfg(feature = "test-hooks")]
mod hooks;
mod keyspace;
mod registry;
mod stats;

use redis_module::{redis_module, Context, RedisString, Status};

fn init(ctx: &Context, _args: &[RedisString]) -> Status {
    let load = match ffi::Load::start(ctx) {
        Ok(load) => load,
        Err(e) => {
            ctx.log_warning(&format!("tb: {e}; not loading"));
            return Status::Err;
        }
    };
    if let Err(e) = keyspace::init(&load) {
        ctx.log_warning(&format!("tb: {e}"));
        return Status::Err;
    }
    guard::install_panic_hook();
    load.no_implicit_signal_modified();
    for cmd in registry::COMMANDS {
        if let Err(e) = load.register(cmd) {
            ctx.log_warning(&e);
            return Status::Err;
        }
    }
    Status::Ok
}

/// The version in Cargo.toml as `MODULE LIST` shows it: major * 10000 +
/// minor * 100 + patch (0.1.0 is 100).
const VERSION: i32 = {
    const fn part(s: &[u8], index: usize) -> i32 {
        let (mut i, mut n, mut v) = (0, 0, 0);
        while i < s.len() {
            match s[i] {
                b'.' | b'-' | b'+' => {
                    if n == index {
                        return v;
                    }
                    n += 1;
                    v = 0;
                }
                c => v = v * 10 + (c - b'0') as i32,
            }
            i += 1;
        }
        v
    }
    let v = env!("CARGO_PKG_VERSION").as_bytes();
    part(v, 0) * 10_000 + part(v, 1) * 100 + part(v, 2)
};

redis_module! {
    name: "tb",
    version: VERSION,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [],
    init: init,
}
