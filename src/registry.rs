//! The command table: each TB command's name, handler, flags, keys, ACL
//! categories and `COMMAND DOCS` text, and its registration.
//!
//! Keys are declared twice. `CreateCommand`'s (first, last, step) is what
//! Redis 6.2 understands, and Redis turns it into a key spec with full
//! access, so a read-only ACL user (`%R~rl:*`) would get NOPERM on
//! TB.PEEK. Where `SetCommandInfo` exists (Redis >= 7.0, Valkey) the real
//! key specs replace it: read-only access for TB.PEEK, read-write update
//! for the writers.

use crate::command_info;
use crate::commands;
use redis_module::raw::{self, RedisModuleCmdFunc};
use redis_module::Context;
use std::ffi::CStr;
use std::os::raw::c_int;

/// The module's version, for `since` in the command docs.
pub const SINCE: &CStr = c"0.1.0";

/// One TB command.
pub struct Command {
    pub name: &'static CStr,
    pub handler: RedisModuleCmdFunc,
    pub flags: &'static CStr,
    /// (first, last, step) for `CreateCommand`.
    pub keys: (c_int, c_int, c_int),
    /// ACL categories, set where the server supports them (>= 7.2).
    pub acl: &'static CStr,
    pub docs: Docs,
}

/// What `COMMAND DOCS` and `COMMAND INFO` show, and the key spec.
pub struct Docs {
    pub summary: &'static CStr,
    pub complexity: &'static CStr,
    /// TB.PEEK reads; the others read and update.
    pub read_only: bool,
    /// The key spec's range: (lastkey, keystep) from argument 1.
    pub key_range: (c_int, c_int),
    pub args: &'static [Arg],
}

/// One argument in the docs (redis-cli shows them as hints).
pub struct Arg {
    pub name: &'static CStr,
    pub kind: ArgKind,
    pub optional: bool,
    /// Repeats (the groups of TB.MCONSUME).
    pub multiple: bool,
    pub subargs: &'static [Arg],
}

#[derive(Clone, Copy)]
pub enum ArgKind {
    Key,
    Double,
    Block,
}

const fn arg(name: &'static CStr, kind: ArgKind) -> Arg {
    Arg {
        name,
        kind,
        optional: false,
        multiple: false,
        subargs: &[],
    }
}

const KEY: Arg = arg(c"key", ArgKind::Key);
const MAX: Arg = arg(c"max", ArgKind::Double);
const RATE: Arg = arg(c"rate", ArgKind::Double);
const COST: Arg = arg(c"cost", ArgKind::Double);
const OPTIONAL_COST: Arg = Arg {
    optional: true,
    ..arg(c"cost", ArgKind::Double)
};
const DELTA: Arg = arg(c"delta", ArgKind::Double);

pub const COMMANDS: &[Command] = &[
    Command {
        name: c"tb.consume",
        handler: Some(commands::consume),
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        acl: c"write fast",
        docs: Docs {
            summary: c"Charges cost (default 1) to a token bucket if it holds that many tokens; replies [allowed, remaining, retry_after_ms, reset_after_ms].",
            complexity: c"O(1)",
            read_only: false,
            key_range: (0, 1),
            args: &[KEY, MAX, RATE, OPTIONAL_COST],
        },
    },
    Command {
        name: c"tb.peek",
        handler: Some(commands::peek),
        flags: c"readonly fast",
        keys: (1, 1, 1),
        acl: c"read fast",
        docs: Docs {
            summary: c"Replies what TB.CONSUME would, without charging or writing anything.",
            complexity: c"O(1)",
            read_only: true,
            key_range: (0, 1),
            args: &[KEY, MAX, RATE, OPTIONAL_COST],
        },
    },
    Command {
        name: c"tb.mconsume",
        handler: Some(commands::mconsume),
        flags: c"write deny-oom",
        keys: (1, -1, 4),
        acl: c"write",
        docs: Docs {
            summary: c"Charges several token buckets all-or-nothing; replies [allowed, retry_after_ms, bucket replies...].",
            complexity: c"O(N) where N is the number of buckets",
            read_only: false,
            key_range: (-1, 4),
            args: &[Arg {
                multiple: true,
                subargs: &[KEY, MAX, RATE, COST],
                ..arg(c"bucket", ArgKind::Block)
            }],
        },
    },
    Command {
        name: c"tb.adjust",
        handler: Some(commands::adjust),
        flags: c"write deny-oom fast",
        keys: (1, 1, 1),
        acl: c"write fast",
        docs: Docs {
            summary: c"Refunds (delta > 0) or charges (delta < 0, down to -max) a token bucket after the fact.",
            complexity: c"O(1)",
            read_only: false,
            key_range: (0, 1),
            args: &[KEY, MAX, RATE, DELTA],
        },
    },
    #[cfg(feature = "test-hooks")]
    Command {
        name: c"tb.panic",
        handler: Some(crate::hooks::panic),
        flags: c"readonly",
        keys: (0, 0, 0),
        acl: c"read",
        docs: Docs {
            summary: c"Panics on purpose (test-hooks builds only).",
            complexity: c"O(1)",
            read_only: true,
            key_range: (0, 0),
            args: &[],
        },
    },
    #[cfg(feature = "test-hooks")]
    Command {
        name: c"tb.fault",
        handler: Some(crate::hooks::fault),
        flags: c"readonly",
        keys: (0, 0, 0),
        acl: c"read",
        docs: Docs {
            summary: c"Makes one step of the next write fail (test-hooks builds only).",
            complexity: c"O(1)",
            read_only: true,
            key_range: (0, 0),
            args: &[],
        },
    },
];

/// Registers `cmd`, then sets its ACL categories and its docs and key
/// specs where the server has those APIs (detected at runtime: 7.0 has
/// no ACL category API, 6.2 neither, nor SetCommandInfo). Only a failed
/// registration fails the load; the rest is logged, and a command whose
/// key specs could not be set keeps the stricter full-access one.
pub fn register(ctx: &Context, cmd: &Command) -> Result<(), String> {
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
        return Err(format!("tb: could not register {:?}", cmd.name));
    }
    let command = match unsafe { raw::RedisModule_GetCommand } {
        Some(get) => unsafe { get(ctx.ctx, cmd.name.as_ptr()) },
        None => return Ok(()),
    };
    if command.is_null() {
        return Ok(());
    }
    if let Some(set) = unsafe { raw::RedisModule_SetCommandACLCategories } {
        if unsafe { set(command, cmd.acl.as_ptr()) } != raw::REDISMODULE_OK as c_int {
            ctx.log_warning(&format!(
                "tb: could not set ACL categories of {:?}",
                cmd.name
            ));
        }
    }
    if !command_info::set(command, &cmd.docs) {
        ctx.log_warning(&format!(
            "tb: could not set the key specs and docs of {:?}",
            cmd.name
        ));
    }
    Ok(())
}
