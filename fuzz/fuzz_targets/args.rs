//! (a) Argument parsing: bytes split at `\n` into an argv for TB.CONSUME,
//! TB.ADJUST or TB.MCONSUME (picked by `argv[0]`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use testkit::oracles;

fuzz_target!(|data: &[u8]| oracles::args_target(data));
