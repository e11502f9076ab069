//! redis-tokenbucket: the `tb` Redis module. This file only registers
//! things; each behaviour lives in the file named after it:
//!
//! * `commands`: the TB.* handlers (open key, compute, write, replicate);
//! * `keyspace`: bucket hashes through the key API, effects replication;
//! * `reply`: replies and log lines;
//! * `clock`: the server clock;
//! * `guard`: panic containment;
//! * `stats`: the `INFO tb` counters;
//! * `tb_core` (crate in `core/`): arithmetic, argument parsing, encoding.

mod clock;
mod commands;
mod guard;
mod keyspace;
mod reply;
mod stats;

use redis_module::raw::{self, RedisModuleCmdFunc};
use redis_module::{redis_module, Context, RedisString, Status};
use std::ffi::CStr;
use std::os::raw::c_int;

/// One TB command: name, handler, flags, key positions (first, last, step)
/// and the ACL categories set where the server supports them (>= 7.2).
struct Command {
    name: &'static CStr,
    handler: RedisModuleCmdFunc,
    flags: &'static CStr,
    keys: (c_int, c_int, c_int),
    acl: &'static CStr,
}

const COMMANDS: &[Command] = &[
    Command {
        name: c"tb.consume",
        handler: Some(commands::consume),
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        acl: c"write fast",
    },
    Command {
        name: c"tb.peek",
        handler: Some(commands::peek),
        flags: c"readonly fast",
        keys: (1, 1, 1),
        acl: c"read fast",
    },
    Command {
        name: c"tb.mconsume",
        handler: Some(commands::mconsume),
        flags: c"write deny-oom",
        keys: (1, -1, 4),
        acl: c"write",
    },
    Command {
        name: c"tb.adjust",
        handler: Some(commands::adjust),
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        acl: c"write fast",
    },
    #[cfg(feature = "panic-test")]
    Command {
        name: c"tb.panic",
        handler: Some(commands::panic),
        flags: c"readonly",
        keys: (0, 0, 0),
        acl: c"read",
    },
];

fn register(ctx: &Context, cmd: &Command) -> Status {
    let (first, last, step) = cmd.keys;
    let created = unsafe {
        raw::RedisModule_CreateCommand.map(|create| {
            create(
                ctx.ctx,
                cmd.name.as_ptr(),
                cmd.handler,
                cmd.flags.as_ptr(),
                first,
                last,
                step,
            )
        })
    };
    if created != Some(raw::REDISMODULE_OK as c_int) {
        ctx.log_warning(&format!("tb: could not register {:?}", cmd.name));
        return Status::Err;
    }
    // Runtime detection: 7.0 lacks the API, and must still load.
    unsafe {
        if let (Some(get), Some(set)) = (
            raw::RedisModule_GetCommand,
            raw::RedisModule_SetCommandACLCategories,
        ) {
            let command = get(ctx.ctx, cmd.name.as_ptr());
            if !command.is_null() && set(command, cmd.acl.as_ptr()) != raw::REDISMODULE_OK as c_int
            {
                ctx.log_warning(&format!(
                    "tb: could not set ACL categories of {:?}",
                    cmd.name
                ));
            }
        }
    }
    Status::Ok
}

fn init(ctx: &Context, _args: &[RedisString]) -> Status {
    if let Some(name) = keyspace::missing_api() {
        ctx.log_warning(&format!("tb: this server lacks {name}; not loading"));
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
    for cmd in COMMANDS {
        if register(ctx, cmd) == Status::Err {
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
