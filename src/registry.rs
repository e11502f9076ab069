//! The command table: each TB command's name, handler, flags, keys, ACL
//! categories and `COMMAND DOCS` text.
//!
//! Keys are declared twice. `CreateCommand`'s (first, last, step) is what
//! Redis 6.2 understands, and Redis turns it into a key spec with full
//! access, so a read-only ACL user (`%R~rl:*`) would get NOPERM on
//! TB.PEEK. Where `SetCommandInfo` exists (Redis >= 7.0, Valkey) the real
//! key specs replace it: read-only access for TB.PEEK, read-write update
//! for the writers.

use crate::commands;
use crate::ffi::{handler, ArgDoc, ArgKind, CommandDef, Docs, RawHandler};
use crate::version::TEXT as SINCE;
use std::ffi::CStr;
use tb_core::contract::{ADJUST, CL_THROTTLE, CONSUME, MCONSUME, PEEK};

const fn arg(name: &'static CStr, kind: ArgKind) -> ArgDoc {
    ArgDoc {
        name,
        kind,
        optional: false,
        multiple: false,
        subargs: &[],
    }
}

const KEY: ArgDoc = arg(c"key", ArgKind::Key);
const MAX: ArgDoc = arg(c"max", ArgKind::Double);
const RATE: ArgDoc = arg(c"rate", ArgKind::Double);
const COST: ArgDoc = arg(c"cost", ArgKind::Double);
const OPTIONAL_COST: ArgDoc = ArgDoc {
    optional: true,
    ..arg(c"cost", ArgKind::Double)
};
const DELTA: ArgDoc = arg(c"delta", ArgKind::Double);
const MAX_BURST: ArgDoc = arg(c"max_burst", ArgKind::Integer);
const COUNT: ArgDoc = arg(c"count", ArgKind::Integer);
const PERIOD: ArgDoc = arg(c"period", ArgKind::Integer);
const OPTIONAL_QUANTITY: ArgDoc = ArgDoc {
    optional: true,
    ..arg(c"quantity", ArgKind::Integer)
};

/// A command on one key (argument 1), owned by this module.
const fn single(
    name: &'static CStr,
    handler: RawHandler,
    flags: &'static CStr,
    acl: &'static CStr,
    read_only: bool,
    summary: &'static CStr,
    args: &'static [ArgDoc],
) -> CommandDef {
    CommandDef {
        name,
        handler,
        flags,
        keys: (1, 1, 1),
        acl,
        redis_cell: false,
        docs: Docs {
            summary,
            complexity: c"O(1)",
            since: SINCE,
            read_only,
            key_range: Some((0, 1)),
            args,
        },
    }
}

pub const COMMANDS: &[CommandDef] = &[
    single(
        CONSUME,
        handler!(CONSUME, commands::consume),
        c"write deny-oom fast",
        c"write fast",
        false,
        c"Charges cost (default 1) to a token bucket if it holds that many tokens; replies [allowed, remaining, retry_after_ms, reset_after_ms].",
        &[KEY, MAX, RATE, OPTIONAL_COST],
    ),
    single(
        PEEK,
        handler!(PEEK, commands::peek),
        c"readonly fast",
        c"read fast",
        true,
        c"Replies what TB.CONSUME would, without charging or writing anything.",
        &[KEY, MAX, RATE, OPTIONAL_COST],
    ),
    CommandDef {
        name: MCONSUME,
        handler: handler!(MCONSUME, commands::mconsume),
        flags: c"write deny-oom",
        keys: (1, -1, 4),
        acl: c"write",
        redis_cell: false,
        docs: Docs {
            summary: c"Charges several token buckets all-or-nothing; replies [allowed, retry_after_ms, bucket replies...].",
            complexity: c"O(N) where N is the number of buckets",
            since: SINCE,
            read_only: false,
            key_range: Some((-1, 4)),
            args: &[ArgDoc {
                multiple: true,
                subargs: &[KEY, MAX, RATE, COST],
                ..arg(c"bucket", ArgKind::Block)
            }],
        },
    },
    single(
        ADJUST,
        handler!(ADJUST, commands::adjust),
        c"write deny-oom fast",
        c"write fast",
        false,
        c"Refunds (delta > 0) or charges (delta < 0, down to -max) a token bucket after the fact.",
        &[KEY, MAX, RATE, DELTA],
    ),
    // redis-cell may own CL.THROTTLE: then it keeps it.
    CommandDef {
        redis_cell: true,
        ..single(
            CL_THROTTLE,
            handler!(CL_THROTTLE, commands::cl_throttle),
            c"write deny-oom fast",
            c"write fast",
            false,
            c"redis-cell's command on a token bucket: charges quantity (default 1); replies [limited, limit, remaining, retry_after_s, reset_after_s].",
            &[KEY, MAX_BURST, COUNT, PERIOD, OPTIONAL_QUANTITY],
        )
    },
    #[cfg(feature = "test-hooks")]
    test_hook(
        TB_PANIC,
        handler!(TB_PANIC, crate::hooks::panic),
        c"Panics on purpose (test-hooks builds only).",
    ),
    #[cfg(feature = "test-hooks")]
    test_hook(
        TB_FAULT,
        handler!(TB_FAULT, crate::hooks::fault),
        c"Makes one step of the next write fail (test-hooks builds only).",
    ),
];

#[cfg(feature = "test-hooks")]
const TB_PANIC: &CStr = c"tb.panic";
#[cfg(feature = "test-hooks")]
const TB_FAULT: &CStr = c"tb.fault";

/// A keyless command of a test-hooks build.
#[cfg(feature = "test-hooks")]
const fn test_hook(name: &'static CStr, handler: RawHandler, summary: &'static CStr) -> CommandDef {
    CommandDef {
        name,
        handler,
        flags: c"readonly",
        keys: (0, 0, 0),
        acl: c"read",
        redis_cell: false,
        docs: Docs {
            summary,
            complexity: c"O(1)",
            since: SINCE,
            read_only: true,
            key_range: None,
            args: &[],
        },
    }
}
