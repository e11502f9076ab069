//! (a) Argument parsing: bytes split at `\n` into an argv for TB.CONSUME
//! (and TB.PEEK, WAIT included), TB.ADJUST, TB.MCONSUME, TB.ACQUIRE,
//! TB.QUOTA (and TB.QPEEK), TB.QADJUST or TB.CHARGE (picked by the end of
//! `argv[0]`; TB.ACQUIRE's and TB.CHARGE's key positions included), and
//! every argument through the number parser and the stored-lease reader
//! (see `testkit::oracles::check_args`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use testkit::oracles;

fuzz_target!(|data: &[u8]| oracles::args_target(data));
