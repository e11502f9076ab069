//! Encoding of a bucket as a plain Redis hash with exactly two fields:
//!
//! * `tokens`: a decimal that round-trips the f64 balance exactly;
//! * `ts`: integer microseconds since the Unix epoch (server clock).
//!
//! Plain hashes keep the data readable by a Redis without the module, by
//! the Lua library, and by RDB/AOF tooling.

use crate::bucket::Stored;
use crate::number::{parse_decimal, parse_int16};
use std::fmt::Write;

pub const TOKENS_FIELD: &str = "tokens";
pub const TS_FIELD: &str = "ts";

/// Why a key that holds a hash is not a usable bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateError {
    /// The hash has other fields than exactly `tokens` and `ts`.
    Fields,
    Tokens,
    Ts,
}

impl StateError {
    pub fn message(&self) -> &'static str {
        match self {
            StateError::Fields => {
                "ERR key is not a token bucket: the hash must hold exactly the fields tokens and ts"
            }
            StateError::Tokens => {
                "ERR key is not a token bucket: field tokens is not a finite decimal number"
            }
            StateError::Ts => {
                "ERR key is not a token bucket: field ts is not an integer of microseconds"
            }
        }
    }
}

/// Decodes the two fields of a bucket hash. `None` means the field is absent.
pub fn decode(tokens: Option<&[u8]>, ts: Option<&[u8]>) -> Result<Stored, StateError> {
    let (tokens, ts) = match (tokens, ts) {
        (Some(a), Some(b)) => (a, b),
        _ => return Err(StateError::Fields),
    };
    Ok(Stored {
        tokens: parse_decimal(tokens).ok_or(StateError::Tokens)?,
        ts_us: parse_int16(ts).ok_or(StateError::Ts)?,
    })
}

/// Shortest decimal that parses back to exactly `tokens`. Writes `0` for
/// negative zero so equal balances always look the same.
pub fn encode_tokens(tokens: f64, out: &mut String) {
    out.clear();
    let t = if tokens == 0.0 { 0.0 } else { tokens };
    // Rust's Display is shortest-round-trip but never uses an exponent;
    // tiny magnitudes would print hundreds of zeros, so use `e` for those.
    // Writing to a String cannot fail.
    let _ = if t != 0.0 && t.abs() < 1e-5 {
        write!(out, "{t:e}")
    } else {
        write!(out, "{t}")
    };
}

/// `ts` as a plain integer.
pub fn encode_ts(ts_us: i64, out: &mut String) {
    out.clear();
    let _ = write!(out, "{ts_us}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_exactly() {
        let mut s = String::new();
        for t in [
            0.0,
            -0.0,
            9.0,
            8.83,
            0.1 + 0.2,
            -10.0,
            1e12,
            1e-7,
            -3.5e-9,
            f64::MIN_POSITIVE,
            5e-324,
            123456.789012345,
        ] {
            encode_tokens(t, &mut s);
            let back = decode(Some(s.as_bytes()), Some(b"0")).unwrap().tokens;
            assert_eq!(
                back.to_bits(),
                if t == 0.0 { 0 } else { t.to_bits() },
                "{t} -> {s}"
            );
        }
        encode_tokens(-0.0, &mut s);
        assert_eq!(s, "0");
        encode_tokens(9.0, &mut s);
        assert_eq!(s, "9");
    }

    #[test]
    fn lua_formatting_is_accepted() {
        // What `string.format('%.17g', x)` writes in the Lua library.
        let s = decode(Some(b"0.10000000000000001"), Some(b"1764513600123456")).unwrap();
        assert_eq!(s.tokens, 0.1);
        assert_eq!(s.ts_us, 1_764_513_600_123_456);
        assert_eq!(
            decode(Some(b"1.0000000000000001e-05"), Some(b"1"))
                .unwrap()
                .tokens,
            1e-5
        );
    }

    #[test]
    fn broken_fields_are_errors() {
        assert_eq!(decode(None, Some(b"1")), Err(StateError::Fields));
        assert_eq!(decode(Some(b"1"), None), Err(StateError::Fields));
        assert_eq!(decode(Some(b"nan"), Some(b"1")), Err(StateError::Tokens));
        assert_eq!(decode(Some(b"1"), Some(b"1.5")), Err(StateError::Ts));
        assert_eq!(decode(Some(b"1"), Some(b"")), Err(StateError::Ts));
    }
}
