//! (b) State decoding: arbitrary `tokens`/`ts` fields, and encode → decode
//! round trips of the first bytes read as an f64 and an i64.
#![no_main]

use libfuzzer_sys::fuzz_target;
use testkit::oracles;

fuzz_target!(|data: &[u8]| oracles::state_target(data));
