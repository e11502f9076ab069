//! Concurrency leases: TB.ACQUIRE, TB.RELEASE, TB.RENEW and TB.INFLIGHT.
//!
//! A lease key is a hash with one field per lease: the field is the
//! holder's id, the value `<expires_at_us>:<weight>`. A lease is live while
//! the clock is before its expiry; expired ones count as absent and are
//! pruned by a later write. A key of more than [`TRACKED`] leases also
//! keeps a summary under the empty field name, so that a call costs the
//! same at 10,000 live leases as at one (see [`view`]).
//!
//! * [`args`]: the commands' arguments;
//! * [`stored`]: the stored text of a lease and of the summary;
//! * [`view`]: the key as one call sees it, each command's decision, and
//!   what it writes.
//!
//! Everything here is pure: the module reads the hash through
//! [`LeaseStore`] and gets back what to reply and what to write.

pub mod args;
pub mod stored;
pub mod view;

pub use args::{
    acquire_key_positions, parse_acquire, parse_inflight, parse_release, parse_renew, Acquire,
    ACQUIRE_ID_INDEX, ID_INDEX,
};
pub use stored::{Lease, LIST_FIELD, SUMMARY_FIELD, TRACKED};
pub use view::{
    acquire, decide, key_expire_at_ms, ms_until, release, renew, Acquired, Kind, LeaseStore,
    Leases, ListField, ListRead, Part, Unsure, Write,
};
