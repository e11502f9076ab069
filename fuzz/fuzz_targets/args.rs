//! (a) Argument parsing: bytes split at `\n` into an argv for TB.CONSUME
//! (and TB.PEEK), TB.ADJUST, TB.MCONSUME or TB.ACQUIRE (picked by the end of
//! `argv[0]`; TB.ACQUIRE's bounds and key positions included), and every
//! argument through the number parser and the stored-lease reader (see
//! `testkit::oracles::check_args`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use testkit::oracles;

fuzz_target!(|data: &[u8]| oracles::args_target(data));
