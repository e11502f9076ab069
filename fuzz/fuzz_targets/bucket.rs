//! (c) Bucket arithmetic: arbitrary f64 limits, balances, costs and deltas
//! (NaN and infinities included), i64 timestamps, and a schedule of calls.
#![no_main]

use libfuzzer_sys::fuzz_target;
use testkit::oracles;

fuzz_target!(|data: &[u8]| oracles::bucket_target(data));
