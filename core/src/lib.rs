//! The pure core of redis-tokenbucket: no Redis types, no I/O.
//!
//! * [`bucket`]: refill, consume, adjust and the reply times;
//! * [`args`]: parsing and validation of command arguments;
//! * [`cell`]: CL.THROTTLE, redis-cell's command, on the same bucket;
//! * [`lease`]: concurrency leases (TB.ACQUIRE and friends);
//! * [`state`]: the `tokens`/`ts` hash encoding, and the rule that reads a
//!   key as a bucket;
//! * [`number`]: the strict decimal grammar both of the above use;
//! * [`error`]: the one error type, whose `Display` is the reply text;
//! * [`contract`]: the contract's numbers and messages, generated from
//!   `contract/contract.json` (as are the Lua and client copies).

#![forbid(unsafe_code)]

pub mod args;
pub mod bucket;
pub mod cell;
// Generated (contract/gen.py), and kept as written.
#[rustfmt::skip]
pub mod contract;
pub mod error;
pub mod lease;
pub mod number;
pub mod state;
