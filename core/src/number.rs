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
    fast_decimal(bytes).or_else(|| parse_decimal_general(bytes))
}

/// The general path: grammar check, then the standard library's correctly
/// rounded parser.
fn parse_decimal_general(bytes: &[u8]) -> Option<f64> {
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
    // One pass, no float or string parser: this reads every stored `ts`.
    let (negative, digits) = match bytes.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, bytes),
    };
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    let mut v: i64 = 0;
    for &c in digits {
        if !c.is_ascii_digit() {
            return None;
        }
        // 16 digits stay far below i64::MAX.
        v = v * 10 + i64::from(c - b'0');
    }
    Some(if negative { -v } else { v })
}

/// The common case of `parse_decimal` (what the encoder writes, and most
/// arguments) without the general float parser:
/// `[-]digits[.digits]` whose digits, read as one integer m, stay below
/// 2^53. m and 10^k are then exact doubles, so one correctly rounded
/// division gives the correctly rounded value (Clinger's fast path).
/// `None` means "use the general path", never "invalid".
fn fast_decimal(b: &[u8]) -> Option<f64> {
    const POW10: [f64; 17] = [
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    ];
    let (negative, body) = match b.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, b),
    };
    if body.is_empty() || body.len() > 17 {
        return None;
    }
    let mut m: u64 = 0;
    let mut point = None;
    for (i, &c) in body.iter().enumerate() {
        match c {
            b'0'..=b'9' => m = m * 10 + u64::from(c - b'0'),
            // Digits must come first: ".5" takes the general path.
            b'.' if point.is_none() && i > 0 => point = Some(i),
            _ => return None,
        }
    }
    if m >= 1 << 53 {
        return None;
    }
    let scale = point.map_or(0, |p| body.len() - 1 - p);
    let v = m as f64 / POW10[scale];
    Some(if negative { -v } else { v })
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
    fn fast_paths_agree_with_the_general_parsers() {
        // '|'-separated, so the empty string and spaces can be cases.
        let mut cases: Vec<Vec<u8>> = concat!(
            "|-|.|-.|1.|-1.|.5|-.5|0|-0|-0.0|00012.500|1.2.3|1e5|+1|--1| 1|1 |",
            "9007199254740991|9007199254740992|9007199254740993|900719925474099.3|",
            "9007199254740.993|90071992547409.93|0.0000000000000001|0.00000000000000001|",
            "12345678901234567|1234567890123456.7|-1764513600123456|17645136001234567|",
            "999901.0004470622|0.047110999999997905|0.1|0.3|2.675|1.0000000000000002",
        )
        .split('|')
        .map(|s| s.as_bytes().to_vec())
        .collect();
        // Random strings over the grammar's alphabet.
        let alphabet = b"0123456789.-+e";
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 19) as usize;
            let mut y = x;
            cases.push(
                (0..len)
                    .map(|i| {
                        y = y.rotate_left(7) ^ (i as u64);
                        // Mostly digits, as real fields are.
                        if y.is_multiple_of(5) {
                            alphabet[(y / 5 % 14) as usize]
                        } else {
                            b'0' + (y / 5 % 10) as u8
                        }
                    })
                    .collect(),
            );
        }
        // Balances as the encoder writes them, for a spread of values.
        for i in 0..100_000u64 {
            let v = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 2_000_000_000_000) as f64 / 1e6
                - 1_000_000.0;
            cases.push(crate::state::Text::tokens(v).as_str().as_bytes().to_vec());
        }
        for c in &cases {
            assert_eq!(
                parse_decimal(c).map(f64::to_bits),
                parse_decimal_general(c).map(f64::to_bits),
                "{:?}",
                String::from_utf8_lossy(c)
            );
            let reference = std::str::from_utf8(c)
                .ok()
                .filter(|t| {
                    let d = t.strip_prefix('-').unwrap_or(t);
                    !d.is_empty() && d.len() <= 16 && d.bytes().all(|b| b.is_ascii_digit())
                })
                .and_then(|t| t.parse::<i64>().ok());
            assert_eq!(
                parse_int16(c),
                reference,
                "{:?}",
                String::from_utf8_lossy(c)
            );
        }
    }

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
