//! (b) State decoding: never panics; `Ok` values are finite; what is
//! encoded decodes back to the same bits.

use super::args::reference_number;
use tb_core::bucket::Stored;
use tb_core::error::StateError;
use tb_core::number::Text;
use tb_core::state::decode;

/// Fuzzer bytes as the two hash fields: bit 0 of the first byte says
/// `tokens` is present, bit 1 that `ts` is (so seeds start with `3`), and
/// the rest is split at the first `\n` into `tokens` and `ts`.
pub fn fields_from_bytes(data: &[u8]) -> (Option<&[u8]>, Option<&[u8]>) {
    let (flags, rest) = data.split_first().map_or((0, data), |(f, r)| (*f, r));
    let (tokens, ts) = match rest.iter().position(|&b| b == b'\n') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &rest[rest.len()..]),
    };
    (
        (flags & 1 != 0).then_some(tokens),
        (flags & 2 != 0).then_some(ts),
    )
}

/// The `ts` grammar restated: an optional `-` and 1 to 16 digits.
pub fn reference_ts(bytes: &[u8]) -> Option<i64> {
    let digits = bytes.strip_prefix(b"-").unwrap_or(bytes);
    if digits.is_empty() || digits.len() > 16 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// Property (b) for one pair of fields.
pub fn check_state(tokens: Option<&[u8]>, ts: Option<&[u8]>) {
    let got = decode(tokens, ts);
    let (Some(t), Some(s)) = (tokens, ts) else {
        assert_eq!(got, Err(StateError::Fields));
        return;
    };
    let want = match (reference_number(t), reference_ts(s)) {
        (None, _) => Err(StateError::Tokens),
        (_, None) => Err(StateError::Ts),
        (Some(tokens), Some(ts_us)) => Ok(Stored { tokens, ts_us }),
    };
    assert_eq!(got, want, "tokens {t:?} ts {s:?}");
    if let Ok(stored) = got {
        assert!(stored.tokens.is_finite());
        check_tokens_round_trip(stored.tokens);
        check_ts_round_trip(stored.ts_us);
    }
}

/// Any finite balance encodes to a decimal that decodes to the same bits
/// (negative zero as zero), short enough for the balances the module
/// stores (|tokens| <= 1e12).
pub fn check_tokens_round_trip(tokens: f64) {
    if !tokens.is_finite() {
        return;
    }
    let text = String::from_utf8_lossy(Text::tokens(tokens).as_bytes()).into_owned();
    let back = decode(Some(text.as_bytes()), Some(b"0"))
        .unwrap_or_else(|e| panic!("{tokens:e} encoded as {text:?}: {e:?}"))
        .tokens;
    let want = if tokens == 0.0 { 0.0 } else { tokens };
    assert_eq!(back.to_bits(), want.to_bits(), "{tokens:e} -> {text:?}");
    // The text itself is Display's (`e` form below 1e-5), whichever
    // formatter the encoder used: stored hashes keep one spelling.
    let display = if want != 0.0 && want.abs() < 1e-5 {
        format!("{want:e}")
    } else {
        format!("{want}")
    };
    assert_eq!(text, display, "{tokens:e}");
    if tokens.abs() <= 1e12 {
        assert!(text.len() <= 24, "{tokens:e} encoded long: {text:?}");
    }
}

/// A `ts` of at most 16 digits (every real clock until the year 2286)
/// round-trips; longer ones are refused by the decoder, never misread.
pub fn check_ts_round_trip(ts_us: i64) {
    let text = String::from_utf8_lossy(Text::int(ts_us).as_bytes()).into_owned();
    let back = decode(Some(b"0"), Some(text.as_bytes())).map(|s| s.ts_us);
    if ts_us.unsigned_abs() < 10_000_000_000_000_000 {
        assert_eq!(back, Ok(ts_us), "{text}");
    } else {
        assert_eq!(back, Err(StateError::Ts), "{text}");
    }
}
