//! The pure core of redis-tokenbucket: no Redis types, no I/O.
//!
//! * [`bucket`]: refill, consume, peek, adjust and the reply times;
//! * [`args`]: parsing and validation of the bucket commands' arguments
//!   (the lease commands' are in `lease`, CL.THROTTLE's in `cell`);
//! * [`charge`]: TB.CHARGE, buckets and quotas in one all-or-nothing call;
//! * [`cell`]: CL.THROTTLE, redis-cell's command, on the same bucket;
//! * [`eviction`]: whether a `maxmemory-policy` can evict the module's
//!   keys, and the warning that says what that costs;
//! * [`lease`]: concurrency leases (TB.ACQUIRE and friends);
//! * [`state`]: the rule that reads a key as a bucket, and the decoding of
//!   its `tokens`/`ts` hash;
//! * [`quota`]: calendar quotas (TB.QUOTA and friends): budgets that
//!   reset each day, week, month, year or fixed period;
//! * [`number`]: decimals, parsed in the one strict grammar the above read
//!   and written as the shortest text that reads back exactly;
//! * [`error`]: the one error type, whose `Display` is the reply text;
//! * [`contract`]: the contract's numbers and messages, generated from
//!   `contract/contract.json` (as are the Lua and client copies).

#![forbid(unsafe_code)]

pub mod args;
pub mod bucket;
pub mod cell;
pub mod charge;
// Generated (contract/gen.py), and kept as written.
#[rustfmt::skip]
pub mod contract;
pub mod error;
pub mod eviction;
pub mod lease;
pub mod number;
pub mod quota;
pub mod state;
