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

use crate::charge;
use crate::commands;
use crate::ffi::{handler, ArgDoc, ArgKind, Begin, CommandDef, Docs, Find, KeySpec, RawHandler};
use crate::leases;
use crate::quotas;
use crate::version::TEXT as SINCE;
use std::ffi::CStr;
use std::os::raw::c_int;
use tb_core::contract::{
    ACQUIRE, ADJUST, CHARGE, CL_THROTTLE, CONSUME, INFLIGHT, MCONSUME, PEEK, QADJUST, QPEEK, QUOTA,
    RELEASE, RENEW,
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
/// A quota's budget per period, and the period: DAY, WEEK, MONTH, YEAR or
/// whole seconds.
const QUOTA_LIMIT: ArgDoc = arg(c"limit", ArgKind::Double);
const QUOTA_PERIOD: ArgDoc = arg(c"period", ArgKind::String);
/// A reservation's longest wait.
const WAIT: ArgDoc = ArgDoc {
    token: Some(c"WAIT"),
    optional: true,
    ..arg(c"max_ms", ArgKind::Integer)
};
const OFFSET: ArgDoc = ArgDoc {
    token: Some(c"OFFSET"),
    optional: true,
    ..arg(c"minutes", ArgKind::Integer)
};

/// The one key, argument 1, read and updated (`read_only`: only read).
const fn key_at_1(read_only: bool) -> KeySpec {
    KeySpec {
        read_only,
        incomplete: false,
        begin: Begin::Index(1),
        find: Find::Range {
            last_key: 0,
            key_step: 1,
        },
    }
}
const READS_KEY: &[KeySpec] = &[key_at_1(true)];
const WRITES_KEY: &[KeySpec] = &[key_at_1(false)];

/// How a command treats its keys: its flags, its ACL categories, and
/// whether it only reads them.
struct Access {
    flags: &'static CStr,
    acl: &'static CStr,
    read_only: bool,
}

const fn access(flags: &'static CStr, acl: &'static CStr, read_only: bool) -> Access {
    Access {
        flags,
        acl,
        read_only,
    }
}

/// O(1) on one bucket: "fast".
const FAST_WRITE: Access = access(c"write deny-oom fast", c"write fast", false);
const FAST_READ: Access = access(c"readonly fast", c"read fast", true);
/// Up to 10,000 buckets, or every lease of a key: not "fast".
const WRITE: Access = access(c"write deny-oom", c"write", false);
const READ: Access = access(c"readonly", c"read", true);
/// TB.ACQUIRE's keys are found by its handler: Cluster slot checks (and
/// Redis 6.2's ACL) ask it where they are; the key specs say the same.
const WRITE_FINDING_KEYS: Access = access(c"write deny-oom getkeys-api", c"write", false);
/// Giving a lease back or renewing it adds no lease: allowed under OOM.
const WRITE_UNDER_OOM: Access = access(c"write", c"write", false);

/// A command of this module on one key (argument 1), O(1).
const fn command(
    name: &'static CStr,
    handler: RawHandler,
    access: Access,
    args: &'static [ArgDoc],
    summary: &'static CStr,
) -> CommandDef {
    CommandDef {
        name,
        handler,
        flags: access.flags,
        keys: (1, 1, 1),
        acl: access.acl,
        redis_cell: false,
        docs: Docs {
            summary,
            complexity: c"O(1)",
            since: SINCE,
            key_specs: if access.read_only {
                READS_KEY
            } else {
                WRITES_KEY
            },
            args,
        },
    }
}

/// `def` at `complexity`.
const fn costs(def: CommandDef, complexity: &'static CStr) -> CommandDef {
    CommandDef {
        docs: Docs {
            complexity,
            ..def.docs
        },
        ..def
    }
}

/// `def` on the keys of `key_specs`, which (first, last, step) `keys`
/// declares for servers without key specs.
const fn on_keys(
    def: CommandDef,
    keys: (c_int, c_int, c_int),
    key_specs: &'static [KeySpec],
) -> CommandDef {
    CommandDef {
        keys,
        docs: Docs {
            key_specs,
            ..def.docs
        },
        ..def
    }
}

/// A lease command's cost: O(1) amortized (a pass reads its N leases).
const LEASES: &CStr = c"O(1) amortized; O(N) for a call that reads the key's N leases whole (a key of at most 9 fields, or past its summary's horizon)";

/// TB.MCONSUME's groups, and its keys: every fourth argument from 1.
const GROUPS: &[ArgDoc] = &[ArgDoc {
    multiple: true,
    subargs: &[KEY, MAX, RATE, COST],
    ..arg(c"bucket", ArgKind::Block)
}];
const EVERY_FOURTH: &[KeySpec] = &[KeySpec {
    read_only: false,
    incomplete: false,
    begin: Begin::Index(1),
    find: Find::Range {
        last_key: -1,
        key_step: 4,
    },
}];

/// TB.ACQUIRE's arguments, and its keys: the lease key, and the key after
/// each BUCKET or QUOTA (keyword search skips the id).
const ACQUIRE_ARGS: &[ArgDoc] = &[
    KEY,
    LIMIT,
    LEASE_MS,
    ID,
    optional(WEIGHT),
    ArgDoc {
        optional: true,
        multiple: true,
        subargs: &[
            ArgDoc {
                token: Some(c"BUCKET"),
                subargs: &[arg(c"bkey", ArgKind::Key(1)), MAX, RATE, COST],
                ..arg(c"bucket", ArgKind::Block)
            },
            ArgDoc {
                token: Some(c"QUOTA"),
                subargs: &[
                    arg(c"qkey", ArgKind::Key(2)),
                    QUOTA_LIMIT,
                    QUOTA_PERIOD,
                    COST,
                    OFFSET,
                ],
                ..arg(c"quota", ArgKind::Block)
            },
        ],
        ..arg(c"clause", ArgKind::OneOf)
    },
];
/// A clause is five arguments, or seven for a quota with `OFFSET`, so no
/// key spec can step through them: the specs name the first key after each
/// keyword and say they are incomplete, which makes Redis ask the handler
/// (`getkeys-api`) for every key.
const fn first_after(keyword: &'static CStr) -> KeySpec {
    KeySpec {
        read_only: false,
        incomplete: true,
        begin: Begin::Keyword(keyword, 5),
        find: Find::Range {
            last_key: 0,
            key_step: 1,
        },
    }
}
const LEASE_AND_CLAUSES: &[KeySpec] = &[
    key_at_1(false),
    first_after(c"BUCKET"),
    first_after(c"QUOTA"),
];

/// TB.CHARGE's arguments, and its keys: `numkeys`, then that many keys.
const CHARGE_ARGS: &[ArgDoc] = &[
    arg(c"numkeys", ArgKind::Integer),
    ArgDoc {
        multiple: true,
        ..KEY
    },
    WAIT,
    ArgDoc {
        multiple: true,
        subargs: &[
            ArgDoc {
                token: Some(c"BUCKET"),
                subargs: &[MAX, RATE, COST],
                ..arg(c"bucket", ArgKind::Block)
            },
            ArgDoc {
                token: Some(c"QUOTA"),
                subargs: &[QUOTA_LIMIT, QUOTA_PERIOD, COST, OFFSET],
                ..arg(c"quota", ArgKind::Block)
            },
        ],
        ..arg(c"clause", ArgKind::OneOf)
    },
];
const COUNTED_KEYS: &[KeySpec] = &[KeySpec {
    read_only: false,
    incomplete: false,
    begin: Begin::Index(1),
    find: Find::Counted {
        count_at: 0,
        first_key: 1,
        key_step: 1,
    },
}];

/// One command a row (two lines): its name and handler, access,
/// arguments, summary, and where it differs from an O(1) command on one
/// key. The test hooks, in `test-hooks` builds only, have no key.
#[rustfmt::skip]
pub const COMMANDS: &[CommandDef] = &[
    command(CONSUME, handler!(CONSUME, commands::consume), FAST_WRITE, &[KEY, MAX, RATE, optional(COST), WAIT],
        c"Charges cost (default 1) to a token bucket if it holds that many tokens, or with WAIT reserves them within max_ms; replies [allowed, remaining, retry_after_ms, reset_after_ms]."),
    command(PEEK, handler!(PEEK, commands::peek), FAST_READ, &[KEY, MAX, RATE, optional(COST), WAIT],
        c"Replies what TB.CONSUME would, without charging or writing anything."),
    costs(on_keys(command(MCONSUME, handler!(MCONSUME, commands::mconsume), WRITE, GROUPS,
        c"Charges several token buckets all-or-nothing; replies [allowed, retry_after_ms, bucket replies...]."),
        (1, -1, 4), EVERY_FOURTH), c"O(N) where N is the number of buckets"),
    command(ADJUST, handler!(ADJUST, commands::adjust), FAST_WRITE, &[KEY, MAX, RATE, DELTA],
        c"Refunds (delta > 0) or charges (delta < 0, down to -max) a token bucket after the fact."),
    // redis-cell may own CL.THROTTLE: then it keeps it.
    CommandDef { redis_cell: true, ..command(CL_THROTTLE, handler!(CL_THROTTLE, commands::cl_throttle), FAST_WRITE,
        &[KEY, MAX_BURST, COUNT, PERIOD, optional(QUANTITY)],
        c"redis-cell's command on a token bucket: charges quantity (default 1); replies [limited, limit, remaining, retry_after_s, reset_after_s].") },
    costs(on_keys(command(ACQUIRE, handler!(ACQUIRE, leases::acquire), WRITE_FINDING_KEYS, ACQUIRE_ARGS,
        c"Takes a lease (a slot of limit) for lease_ms, and charges token buckets and quotas, all or nothing; replies [acquired, in_use, retry_after_ms, expires_in_ms, clause replies...]."),
        (1, 1, 1), LEASE_AND_CLAUSES), c"O(M) for M buckets, plus O(1) amortized for the lease key (O(N) for a call that reads its N leases whole)"),
    costs(command(RELEASE, handler!(RELEASE, leases::release), WRITE_UNDER_OOM, &[KEY, ID],
        c"Gives a lease back; replies [released, in_use]."), LEASES),
    costs(command(RENEW, handler!(RENEW, leases::renew), WRITE_UNDER_OOM, &[KEY, ID, LEASE_MS],
        c"Extends a live lease to lease_ms from now; replies [renewed, expires_in_ms]."), LEASES),
    costs(command(INFLIGHT, handler!(INFLIGHT, leases::inflight), READ, &[KEY],
        c"Replies the weight of the key's live leases."), LEASES),
    command(QUOTA, handler!(QUOTA, quotas::quota), FAST_WRITE, &[KEY, QUOTA_LIMIT, QUOTA_PERIOD, optional(COST), OFFSET],
        c"Charges cost (default 1) to a quota that resets each period (DAY, WEEK, MONTH, YEAR or seconds, at UTC plus OFFSET); replies [allowed, remaining, retry_after_ms, reset_after_ms]."),
    command(QPEEK, handler!(QPEEK, quotas::qpeek), FAST_READ, &[KEY, QUOTA_LIMIT, QUOTA_PERIOD, optional(COST), OFFSET],
        c"Replies what TB.QUOTA would, without charging or writing anything."),
    command(QADJUST, handler!(QADJUST, quotas::qadjust), FAST_WRITE, &[KEY, QUOTA_LIMIT, QUOTA_PERIOD, DELTA, OFFSET],
        c"Refunds (delta > 0) or charges (delta < 0, down to -limit remaining) a quota after the fact, in its current period."),
    costs(on_keys(command(CHARGE, handler!(CHARGE, charge::charge), WRITE_FINDING_KEYS, CHARGE_ARGS,
        c"Charges token buckets and quotas all-or-nothing, with WAIT reserving bucket tokens within max_ms; replies [allowed, retry_after_ms, key replies...]."),
        (2, 2, 1), COUNTED_KEYS), c"O(N) where N is the number of keys"),
    #[cfg(feature = "test-hooks")]
    on_keys(command(TB_PANIC, handler!(TB_PANIC, crate::hooks::panic), READ, &[],
        c"Panics on purpose (test-hooks builds only)."), (0, 0, 0), &[]),
    #[cfg(feature = "test-hooks")]
    on_keys(command(TB_FAULT, handler!(TB_FAULT, crate::hooks::fault), READ, &[],
        c"Makes one step of the next write fail (test-hooks builds only)."), (0, 0, 0), &[]),
];

#[cfg(feature = "test-hooks")]
const TB_PANIC: &CStr = c"tb.panic";
#[cfg(feature = "test-hooks")]
const TB_FAULT: &CStr = c"tb.fault";
