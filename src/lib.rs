//! redis-tokenbucket: the `tb` Redis module. This file only registers
//! things; each behaviour lives in the file named after it:
//!
//! * `registry`: the command table (flags, keys, ACL categories, docs) and
//!   `command_info`, which hands the docs and key specs to the server;
//! * `commands`: the TB.* handlers (open key, compute, write, replicate);
//! * `keyspace`: bucket hashes through the key API, effects replication;
//! * `reply`: replies and log lines;
//! * `clock`: the server clock;
//! * `guard`: panic containment;
//! * `stats`: the `INFO tb` counters;
//! * `hooks`: TB.PANIC and TB.FAULT, in `test-hooks` builds only;
//! * `tb_core` (crate in `core/`): arithmetic, argument parsing, encoding.

mod clock;
mod command_info;
mod commands;
mod guard;
#[cfg(feature = "test-hooks")]
mod hooks;
mod keyspace;
mod registry;
mod reply;
mod stats;

use redis_module::raw;
use redis_module::{redis_module, Context, RedisString, Status};
use std::os::raw::c_int;

fn init(ctx: &Context, _args: &[RedisString]) -> Status {
    if let Some(name) = keyspace::missing_api() {
        ctx.log_warning(&format!("tb: this server lacks {name}; not loading"));
        return Status::Err;
    }
    if let Some(name) = keyspace::missing_effect(ctx.ctx) {
        ctx.log_warning(&format!(
            "tb: this server has no {name} command (renamed or disabled by rename-command?); \
             the module replicates every write as HSET, PEXPIREAT and DEL, so it will not load"
        ));
        return Status::Err;
    }
    guard::install_panic_hook();
    // Writers open keys once, for writing, and signal a key as modified
    // only when they change it (see `keyspace::BucketKey::open`).
    if let Some(set) = unsafe { raw::RedisModule_SetModuleOptions } {
        unsafe {
            set(
                ctx.ctx,
                raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED as c_int,
            )
        };
    }
    for cmd in registry::COMMANDS {
        if let Err(e) = registry::register(ctx, cmd) {
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
