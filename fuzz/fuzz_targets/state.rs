//! (b) State decoding: arbitrary `tokens`/`ts` fields, and encode → decode
//! round trips of the first bytes read as an f64 and an i64.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (tokens, ts) = tb_fuzz::fields_from_bytes(data);
    tb_fuzz::check_state(tokens, ts);
    let mut word = [0u8; 8];
    let n = data.len().min(8);
    word[..n].copy_from_slice(&data[..n]);
    tb_fuzz::check_tokens_round_trip(f64::from_le_bytes(word));
    tb_fuzz::check_ts_round_trip(i64::from_le_bytes(word));
});
