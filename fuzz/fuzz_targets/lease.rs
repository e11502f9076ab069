//! (d) Lease keys: any hash, summary and list bytes included, and calls on it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use testkit::oracles;

fuzz_target!(|data: &[u8]| oracles::lease_target(data));
