//! Properties of tb-core under hostile input, shared by the libFuzzer
//! targets (`fuzz/fuzz_targets/*.rs`, nightly) and their proptest
//! equivalents (`core/tests/fuzz_equivalents.rs`, stable). Only `std` and
//! `tb_core` may be used here: the fuzz build takes this crate without its
//! features.
//!
//! Each `check_*` function panics when a property fails; each `*_from_bytes`
//! function turns fuzzer bytes into that check's input.
//!
//! * (a) argument parsing: never panics; the result is exactly what an
//!   independent reference validator predicts, and any `Ok` is within the
//!   documented bounds (0 < max <= 1e12, 0 < rate <= 1e12, max/rate <= 1e10,
//!   0 <= cost <= max, all finite); TB.CONSUME's WAIT, the quota commands
//!   and TB.CHARGE likewise against references of their own (limit,
//!   period, OFFSET, the clauses, the counted keys), every error's text
//!   one of the contract's; TB.ACQUIRE's within its own (limit, lease_ms,
//!   weight, its BUCKET clauses), with its keys where the key specs say;
//!   lease values read back as written;
//! * (b) state decoding: never panics; `Ok` values are finite; what is
//!   encoded decodes back to the same bits;
//! * (c) bucket arithmetic: never panics on any f64/i64; with valid limits
//!   the balance is never NaN and stays in [-max, max], an admitted call had
//!   the tokens and changed the balance, reply times are non-negative,
//!   bounded and exact to the millisecond for the state the call leaves (a
//!   call at `now + retry_after_ms` passes, one a millisecond earlier does
//!   not), and a schedule of calls (with keys expiring at the time the
//!   module sets) never admits more than burst plus refill plus refunds;
//! * (d) lease keys: any hash (summary bytes included) and calls on it
//!   never panic or show a negative weight; from well-formed leases, every
//!   answer is the brute-force live weight and every summary written
//!   holds.

/// A fuzz target: its name (its directory under fuzz/corpus/) and what it
/// does with the bytes it is given.
pub type Target = (&'static str, fn(&[u8]));

/// What each fuzz target does with its bytes: the libFuzzer targets and the
/// replay of the checked-in seeds (`core/tests/fuzz_equivalents.rs`) both
/// call these, so a seed means the same thing to both.
pub const TARGETS: [Target; 4] = [
    ("args", args_target),
    ("state", state_target),
    ("bucket", bucket_target),
    ("lease", lease_target),
];

/// The `args` target: fuzzer bytes as an argv, property (a).
pub fn args_target(data: &[u8]) {
    check_args(&argv_from_bytes(data));
}

/// The `state` target: fuzzer bytes as two hash fields, and their first
/// eight bytes as a balance and a timestamp to round-trip, property (b).
pub fn state_target(data: &[u8]) {
    let (tokens, ts) = fields_from_bytes(data);
    check_state(tokens, ts);
    let mut word = [0u8; 8];
    let n = data.len().min(8);
    word[..n].copy_from_slice(&data[..n]);
    check_tokens_round_trip(f64::from_le_bytes(word));
    check_ts_round_trip(i64::from_le_bytes(word));
}

/// The `bucket` target: fuzzer bytes as a bucket case, property (c).
pub fn bucket_target(data: &[u8]) {
    check_bucket(&bucket_case_from_bytes(data));
}

/// The `lease` target: fuzzer bytes as a lease key and calls on it,
/// property (d).
pub fn lease_target(data: &[u8]) {
    check_leases(&lease_case_from_bytes(data));
}

/// Reads fixed-size values, zeros past the end of the input.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    pub(crate) fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
    pub(crate) fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub(crate) fn i16(&mut self) -> i16 {
        i16::from_le_bytes(self.bytes())
    }
    pub(crate) fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.bytes())
    }
    pub(crate) fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }
    pub(crate) fn i64(&mut self) -> i64 {
        i64::from_le_bytes(self.bytes())
    }
    pub(crate) fn f64(&mut self) -> f64 {
        f64::from_le_bytes(self.bytes())
    }
    /// A fraction in [0, 1].
    pub(crate) fn unit(&mut self) -> f64 {
        f64::from(self.u16()) / f64::from(u16::MAX)
    }
}

mod args;
mod bucket;
mod lease;
mod state;

pub use args::*;
pub use bucket::*;
pub use lease::*;
pub use state::*;
