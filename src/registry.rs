//! The command table: each command's name (the TB commands, CL.THROTTLE,
//! and the test hooks in `test-hooks` builds), handler, flags, keys, ACL
//! categories and `COMMAND DOCS` text.
//!
//! Keys are declared twice. `CreateCommand`'s (first, last, step) is what
//! Redis 6.2 understands, and Redis turns it into a key spec with full
//! access, so a read-only ACL user (`%R~rl:*`) would get NOPERM on
//! TB.PEEK. Where `SetCommandInfo` exists (Redis >= 7.0, Valkey) the real
//! key specs replace it: read-only access for TB.PEEK and TB.INFLIGHT,
//! read-write update for the writers, and TB.ACQUIRE's bucket keys after
//! each `BUCKET`.

use crate::commands;
use crate::ffi::{handler, ArgDoc, ArgKind, Begin, CommandDef, Docs, KeySpec, RawHandler};
use crate::leases;
use crate::version::TEXT as SINCE;
use std::ffi::CStr;
use tb_core::contract::{
    ACQUIRE, ADJUST, CL_THROTTLE, CONSUME, INFLIGHT, MCONSUME, PEEK, RELEASE, RENEW,
};

const fn arg(name: &'static CStr, kind: ArgKind) -> ArgDoc {
    ArgDoc {
        name,
        kind,
        token: None,
        optional: false,
        multiple: false,
        subargs: &[],
    }
}

const fn optional(a: ArgDoc) -> ArgDoc {
    ArgDoc {
        optional: true,
        ..a
    }
}

const KEY: ArgDoc = arg(c"key", ArgKind::Key(0));
const MAX: ArgDoc = arg(c"max", ArgKind::Double);
const RATE: ArgDoc = arg(c"rate", ArgKind::Double);
const COST: ArgDoc = arg(c"cost", ArgKind::Double);
const DELTA: ArgDoc = arg(c"delta", ArgKind::Double);
const MAX_BURST: ArgDoc = arg(c"max_burst", ArgKind::Integer);
const COUNT: ArgDoc = arg(c"count", ArgKind::Integer);
const PERIOD: ArgDoc = arg(c"period", ArgKind::Integer);
const QUANTITY: ArgDoc = arg(c"quantity", ArgKind::Integer);
const LIMIT: ArgDoc = arg(c"limit", ArgKind::Integer);
const LEASE_MS: ArgDoc = arg(c"lease_ms", ArgKind::Integer);
const ID: ArgDoc = arg(c"id", ArgKind::String);
const WEIGHT: ArgDoc = arg(c"weight", ArgKind::Integer);

/// The one key, argument 1, read and updated (`read_only`: only read).
const fn key_at_1(read_only: bool) -> KeySpec {
    KeySpec {
        read_only,
        begin: Begin::Index(1),
        last_key: 0,
        key_step: 1,
    }
}
const READS_KEY: &[KeySpec] = &[key_at_1(true)];
const WRITES_KEY: &[KeySpec] = &[key_at_1(false)];

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
            key_specs: if read_only { READS_KEY } else { WRITES_KEY },
            args,
        },
    }
}

/// A lease command: one key, O(1) amortized (a pass reads its N leases).
const fn lease(
    name: &'static CStr,
    handler: RawHandler,
    flags: &'static CStr,
    acl: &'static CStr,
    read_only: bool,
    summary: &'static CStr,
    args: &'static [ArgDoc],
) -> CommandDef {
    let mut def = single(name, handler, flags, acl, read_only, summary, args);
    def.docs.complexity =
        c"O(1) amortized; O(N) for a call that reads the key's N leases whole (a key of at most 9 fields, or past its summary's horizon)";
    def
}

pub const COMMANDS: &[CommandDef] = &[
    single(
        CONSUME,
        handler!(CONSUME, commands::consume),
        c"write deny-oom fast",
        c"write fast",
        false,
        c"Charges cost (default 1) to a token bucket if it holds that many tokens; replies [allowed, remaining, retry_after_ms, reset_after_ms].",
        &[KEY, MAX, RATE, optional(COST)],
    ),
    single(
        PEEK,
        handler!(PEEK, commands::peek),
        c"readonly fast",
        c"read fast",
        true,
        c"Replies what TB.CONSUME would, without charging or writing anything.",
        &[KEY, MAX, RATE, optional(COST)],
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
            key_specs: &[KeySpec {
                read_only: false,
                begin: Begin::Index(1),
                last_key: -1,
                key_step: 4,
            }],
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
            &[KEY, MAX_BURST, COUNT, PERIOD, optional(QUANTITY)],
        )
    },
    CommandDef {
        name: ACQUIRE,
        handler: handler!(ACQUIRE, leases::acquire),
        // getkeys-api: Cluster slot checks (and Redis 6.2's ACL) ask the
        // handler where the keys are; the key specs below say the same.
        flags: c"write deny-oom getkeys-api",
        keys: (1, 1, 1),
        acl: c"write",
        redis_cell: false,
        docs: Docs {
            summary: c"Takes a lease (a slot of limit) for lease_ms, and charges token buckets, all or nothing; replies [acquired, in_use, retry_after_ms, expires_in_ms, bucket replies...].",
            complexity: c"O(M) for M buckets, plus O(1) amortized for the lease key (O(N) for a call that reads its N leases whole)",
            since: SINCE,
            key_specs: &[
                key_at_1(false),
                // The key after each BUCKET (keyword search skips the id).
                KeySpec {
                    read_only: false,
                    begin: Begin::Keyword(c"BUCKET", 5),
                    last_key: -1,
                    key_step: 5,
                },
            ],
            args: &[
                KEY,
                LIMIT,
                LEASE_MS,
                ID,
                optional(WEIGHT),
                ArgDoc {
                    token: Some(c"BUCKET"),
                    optional: true,
                    multiple: true,
                    subargs: &[arg(c"bkey", ArgKind::Key(1)), MAX, RATE, COST],
                    ..arg(c"bucket", ArgKind::Block)
                },
            ],
        },
    },
    lease(
        RELEASE,
        handler!(RELEASE, leases::release),
        c"write",
        c"write",
        false,
        c"Gives a lease back; replies [released, in_use].",
        &[KEY, ID],
    ),
    lease(
        RENEW,
        handler!(RENEW, leases::renew),
        c"write",
        c"write",
        false,
        c"Extends a live lease to lease_ms from now; replies [renewed, expires_in_ms].",
        &[KEY, ID, LEASE_MS],
    ),
    lease(
        INFLIGHT,
        handler!(INFLIGHT, leases::inflight),
        c"readonly",
        c"read",
        true,
        c"Replies the weight of the key's live leases.",
        &[KEY],
    ),
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
            key_specs: &[],
            args: &[],
        },
    }
}
