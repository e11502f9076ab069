//! Strict decimal parsing shared by arguments and stored state.
//!
//! Rust's `f64::from_str` accepts `inf`, `NaN` and `infinity`; Lua's
//! `tonumber` accepts hex and surrounding spaces. Both sides of the project
//! first check this one grammar so they accept exactly the same strings:
//!
//! ```text
//! [+-]? ( digits [ "." digits* ] | "." digits ) [ (e|E) [+-]? digits ]
//! ```

/// Parses a decimal in the grammar above. `None` for anything else,
/// including values that overflow to infinity.
pub fn parse_decimal(bytes: &[u8]) -> Option<f64> {
    if !is_decimal(bytes) {
        return None;
    }
    // The grammar is ASCII, so this cannot fail; no unwrap on input paths.
    let text = std::str::from_utf8(bytes).ok()?;
    let value: f64 = text.parse().ok()?;
    value.is_finite().then_some(value)
}

/// Parses an optionally negative integer of at most 16 digits. Real
/// timestamps (below 2^53) are exact in a double too; beyond that the Lua
/// library splits the value to subtract it exactly, as this side does in
/// integers.
pub fn parse_int16(bytes: &[u8]) -> Option<i64> {
    let digits = match bytes.first() {
        Some(b'-') => &bytes[1..],
        _ => bytes,
    };
    if digits.is_empty() || digits.len() > 16 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

fn is_decimal(b: &[u8]) -> bool {
    let mut i = 0;
    if matches!(b.first(), Some(b'+' | b'-')) {
        i = 1;
    }
    let int_digits = count_digits(&b[i..]);
    i += int_digits;
    let mut frac_digits = 0;
    if b.get(i) == Some(&b'.') {
        i += 1;
        frac_digits = count_digits(&b[i..]);
        i += frac_digits;
    }
    if int_digits == 0 && frac_digits == 0 {
        return false;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let exp_digits = count_digits(&b[i..]);
        if exp_digits == 0 {
            return false;
        }
        i += exp_digits;
    }
    i == b.len()
}

fn count_digits(b: &[u8]) -> usize {
    b.iter().take_while(|c| c.is_ascii_digit()).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_decimal_grammar() {
        for (s, v) in [
            ("1", 1.0),
            ("0.17", 0.17),
            ("+2", 2.0),
            ("-2.5", -2.5),
            ("1.", 1.0),
            (".5", 0.5),
            ("1e3", 1000.0),
            ("1E-2", 0.01),
            ("2.5e+1", 25.0),
            ("0.10000000000000001", 0.1),
        ] {
            assert_eq!(parse_decimal(s.as_bytes()), Some(v), "{s}");
        }
    }

    #[test]
    fn rejects_everything_else() {
        for s in [
            "", " ", "1 ", " 1", "nan", "NaN", "inf", "-inf", "infinity", "0x10", "1e", "1e+", ".",
            "+", "-", "1..2", "1.2.3", "e5", "1e999", "1_000", "１", "1\0", "--1", "1,5",
        ] {
            assert_eq!(parse_decimal(s.as_bytes()), None, "{s:?}");
        }
        assert_eq!(parse_decimal(&[0xff, b'1']), None);
    }

    #[test]
    fn integers_are_plain_and_short() {
        assert_eq!(
            parse_int16(b"1764513600123456"),
            Some(1_764_513_600_123_456)
        );
        assert_eq!(parse_int16(b"-5"), Some(-5));
        assert_eq!(parse_int16(b"0"), Some(0));
        for s in [
            "",
            "-",
            "+5",
            "1.0",
            "1e3",
            "12345678901234567",
            " 1",
            "0x1",
        ] {
            assert_eq!(parse_int16(s.as_bytes()), None, "{s:?}");
        }
    }
}
