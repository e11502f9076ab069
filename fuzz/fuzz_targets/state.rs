//! (b) State decoding: arbitrary `tokens`/`ts` fields, and encode → decode
//! round trips of the first bytes read as an f64 and an i64.
#![no_main]

use libfuzzer_sys::fuzz_target;
use testkit::oracles;

fuzz_target!(|data: &[u8]| {
    let (tokens, ts) = oracles::fields_from_bytes(data);
    oracles::check_state(tokens, ts);
    let mut word = [0u8; 8];
    let n = data.len().min(8);
    word[..n].copy_from_slice(&data[..n]);
    oracles::check_tokens_round_trip(f64::from_le_bytes(word));
    oracles::check_ts_round_trip(i64::from_le_bytes(word));
});
