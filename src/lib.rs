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
    // Replaces the info callback the macro registered before `init` ran.
    raw::register_info_function(ctx.ctx, Some(stats::info));
    for cmd in registry::COMMANDS {
        if let Err(e) = registry::register(ctx, cmd) {
            ctx.log_warning(&e);
            return Status::Err;
        }
    }
    Status::Ok
}

redis_module! {
    name: "tb",
    version: 100,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [],
    init: init,
}
