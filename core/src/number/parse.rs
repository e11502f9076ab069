//! Strict decimal parsing shared by arguments and stored state, and the
//! integers: a stored `ts` (`parse_int16`), and the integer arguments of
//! CL.THROTTLE and the lease commands (`parse_i64`).
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
    let (v, read) = digit_run(digits);
    if read != digits.len() {
        return None;
    }
    // 16 digits stay far below i64::MAX.
    let v = v as i64;
    Some(if negative { -v } else { v })
}

/// An integer as Rust's `i64` parser reads it: an optional sign and
/// decimal digits, within range (redis-cell's arguments, and the lease
/// commands' integers). `None` for anything else.
pub fn parse_i64(bytes: &[u8]) -> Option<i64> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// The value of the digits `b` starts with, and how many there are. Eight
/// bytes at a time: whole runs of eight digits (a stored `ts` is two), the
/// run's end within the next eight bytes (a balance's integer part), and
/// the last few digits of a slice of eight bytes or more from its last
/// eight bytes (a balance's fraction); a shorter slice from two reads of
/// four bytes, or a byte at a time below four.
/// Wraps past 19 digits: callers reject those by the count.
#[inline(always)]
pub(crate) fn digit_run(b: &[u8]) -> (u64, usize) {
    let mut v: u64 = 0;
    let mut i = 0;
    while let Some(chunk) = b.get(i..i + 8).and_then(|c| <[u8; 8]>::try_from(c).ok()) {
        let word = u64::from_le_bytes(chunk);
        let (values, not_digits) = digit_bytes(word);
        if not_digits != 0 {
            return run_ends_in(v, i, word);
        }
        v = v.wrapping_mul(100_000_000).wrapping_add(combine(values));
        i += 8;
    }
    let left = b.len() - i;
    if let Some(last) = b.len().checked_sub(8).and_then(|from| b.get(from..)) {
        if left == 0 {
            return (v, i);
        }
        // The bytes not read yet are the last `left` of the last eight:
        // moved down past the others, with zeros (no digit) above them.
        let mut eight = [0; 8];
        eight.copy_from_slice(last);
        return run_ends_in(v, i, u64::from_le_bytes(eight) >> (8 * (8 - left)));
    }
    // Four to seven bytes: two overlapping four-byte reads, which agree
    // where they overlap, and zeros above.
    if let (Some(head), Some(tail)) = (b.get(..4), b.len().checked_sub(4).and_then(|t| b.get(t..)))
    {
        let read = |w: &[u8]| w.iter().rev().fold(0u64, |v, &c| v << 8 | u64::from(c));
        return run_ends_in(0, 0, read(head) | read(tail) << (8 * (b.len() - 4)));
    }
    while let Some(&c) = b.get(i) {
        if !c.is_ascii_digit() {
            break;
        }
        v = v.wrapping_mul(10).wrapping_add(u64::from(c - b'0'));
        i += 1;
    }
    (v, i)
}

/// The end of a digit run that has `v` for its first `i` bytes and goes
/// on into `word` (the next bytes, the first the lowest), which holds a
/// byte that is no digit: the run's value and length.
#[inline(always)]
fn run_ends_in(v: u64, i: usize, word: u64) -> (u64, usize) {
    let (values, not_digits) = digit_bytes(word);
    let n = (not_digits.trailing_zeros() / 8) as usize;
    let value = v
        .wrapping_mul(POW10_INT[n] as u64)
        .wrapping_add(top_digits(values, n));
    (value, i + n)
}

/// Each byte of `word` less '0', and a mask with the top bit of every
/// byte that is no digit set (or of some byte above one). A byte is a
/// digit when subtracting '0' does not borrow and adding 0x46 does not
/// carry into its top bit; a borrow or a carry only runs upwards, so every
/// byte below the first non-digit is judged right.
#[inline(always)]
fn digit_bytes(word: u64) -> (u64, u64) {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let values = word.wrapping_sub(0x30 * ONES);
    let high = word.wrapping_add(0x46 * ONES);
    (values, (values | high) & (0x80 * ONES))
}

/// The value of the first `n` digit bytes of `values` (n < 8): moved to
/// the top bytes, the zeros below them read as leading zeros.
#[inline(always)]
fn top_digits(values: u64, n: usize) -> u64 {
    if n == 0 {
        return 0;
    }
    combine(values << (64 - 8 * n as u32))
}

/// The value of eight digit bytes (0..=9, the first the lowest): pairs of
/// digits, pairs of pairs and the two halves combine with one multiply
/// each (lane-wise arithmetic, no lane overflows).
#[inline(always)]
fn combine(digits: u64) -> u64 {
    // d0 + 10 d1 per 16-bit lane (d0 the first digit).
    let pairs = (digits.wrapping_mul(10) + (digits >> 8)) & 0x00FF_00FF_00FF_00FF;
    // 100 * pair0 + pair1 per 32-bit lane.
    let quads = (pairs.wrapping_mul(100) + (pairs >> 16)) & 0x0000_FFFF_0000_FFFF;
    // 10000 * quad0 + quad1.
    (quads & 0xFFFF).wrapping_mul(10_000) + (quads >> 32)
}

/// 10^k as integers, k <= 21 (10^19 < 2^64 < 10^20): the parser's scales
/// and the writer's (`super::write`).
pub(crate) const POW10_INT: [u128; 22] = {
    let mut t = [1u128; 22];
    let mut k = 1;
    while k < 22 {
        t[k] = t[k - 1] * 10;
        k += 1;
    }
    t
};

/// The common case of `parse_decimal` (what the encoder writes, and most
/// arguments) without the general float parser: `[-]digits[.digits]` with
/// at most 19 digits, read as one integer m < 10^19 scaled by 10^-k.
/// Below 2^53, m and 10^k are exact doubles, so one correctly rounded
/// division gives the correctly rounded value (Clinger's fast path); above
/// it (17-digit balances such as `0.30000000000000004`) `exact_ratio`
/// rounds m / 10^k exactly in integers. `None` means "use the general
/// path", never "invalid".
fn fast_decimal(b: &[u8]) -> Option<f64> {
    // 10^k is an exact double up to 10^22.
    const POW10: [f64; 20] = [
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
        1e17, 1e18, 1e19,
    ];
    let (negative, body) = match b.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, b),
    };
    // 19 digits and a point: m < 10^19 fits a u64.
    if body.is_empty() || body.len() > 20 {
        return None;
    }
    let (int, int_digits) = digit_run(body);
    // Digits must come first: ".5" takes the general path.
    if int_digits == 0 {
        return None;
    }
    let (m, scale) = match body.get(int_digits) {
        None => (int, 0),
        Some(b'.') => {
            let fraction = &body[int_digits + 1..];
            let (frac, frac_digits) = digit_run(fraction);
            if frac_digits != fraction.len() || int_digits + frac_digits > 19 {
                return None;
            }
            // 19 digits at most (checked above): 10^frac_digits fits a u64.
            let m = int
                .wrapping_mul(POW10_INT[frac_digits] as u64)
                .wrapping_add(frac);
            (m, frac_digits)
        }
        Some(_) => return None,
    };
    if int_digits > 19 {
        return None;
    }
    let v = if m < 1 << 53 {
        m as f64 / POW10[scale]
    } else {
        exact_ratio(m, scale, POW10[scale])?
    };
    Some(if negative { -v } else { v })
}

/// m / 10^k rounded to the nearest double (ties to even), for
/// 2^53 <= m < 10^19 and k <= 19, without the general parser: the double
/// division lands within two ulps of the true quotient (two roundings),
/// and exact integer comparisons with the midpoints between neighbouring
/// doubles move it to the right one. Only multiplications and shifts of
/// u128, no division. The quotient is at least 2^53 / 10^19 > 2^-11, so
/// every double involved is normal.
fn exact_ratio(m: u64, k: usize, pow10: f64) -> Option<f64> {
    let p10 = *POW10_INT.get(k)?;
    // Whether m / 10^k is above (Greater), at or below p * 2^f. Both sides
    // are near m * 2^-f, under 2^120.
    let against = |p: u64, f: i64| -> std::cmp::Ordering {
        let rhs = u128::from(p) * p10;
        if f >= 0 {
            u128::from(m).cmp(&(rhs << f))
        } else {
            (u128::from(m) << -f).cmp(&rhs)
        }
    };
    let mut c = m as f64 / pow10;
    for _ in 0..4 {
        let bits = c.to_bits();
        let mantissa = (bits & ((1 << 52) - 1)) | (1 << 52);
        let exp = ((bits >> 52) & 0x7ff) as i64 - 1075;
        let odd = mantissa & 1 == 1;
        // The midpoint to the next double up.
        match against(2 * mantissa + 1, exp - 1) {
            std::cmp::Ordering::Greater => {
                c = c.next_up();
                continue;
            }
            std::cmp::Ordering::Equal if odd => return Some(c.next_up()),
            _ => {}
        }
        // The midpoint to the next double down (closer below a power of two).
        let below = if mantissa == 1 << 52 {
            against(4 * mantissa - 1, exp - 2)
        } else {
            against(2 * mantissa - 1, exp - 1)
        };
        match below {
            std::cmp::Ordering::Less => c = c.next_down(),
            std::cmp::Ordering::Equal if odd => return Some(c.next_down()),
            _ => return Some(c),
        }
    }
    // Not reached: the first guess is within two ulps.
    None
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
            "999901.0004470622|0.047110999999997905|0.1|0.3|2.675|1.0000000000000002|",
            "0.30000000000000004|9.9999999999999982|1.0000000000000001e-05|9999999999999999999|",
            "99999999999999999999|1844674407370955161.5|-0.9007199254740993|9007199254740993.00|",
            "4503599627370496.5|4503599627370497.5|0.1000000000000000055511151231257827",
        )
        .split('|')
        .map(|s| s.as_bytes().to_vec())
        .collect();
        // Random strings over the grammar's alphabet.
        let alphabet = b"0123456789.-+e";
        let mut rng = testkit::Rng(0x2545_F491_4F6C_DD1D);
        for _ in 0..200_000 {
            let x = rng.next();
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
        // Balances as the encoder writes them, for a spread of values, and
        // as the Lua library writes them (17 significant digits).
        for i in 0..100_000u64 {
            let v = (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 2_000_000_000_000) as f64 / 1e6
                - 1_000_000.0;
            cases.push(crate::number::Text::tokens(v).as_bytes().to_vec());
            let w = f64::from_bits(i.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 2) % 1e12;
            cases.push(crate::number::Text::tokens(w).as_bytes().to_vec());
            cases.push(format!("{w:.17}").into_bytes());
            cases.push(format!("{:.18}", v / 1e6).into_bytes());
        }
        // Every digit count up to 19, with the point anywhere: the integer
        // path near 2^53 and 10^19, both sides of each boundary.
        for _ in 0..200_000 {
            let y = rng.next();
            let digits = 1 + (y % 19) as usize;
            let m = y % 10u64.pow(digits as u32);
            let text = format!("{m:0digits$}");
            let point = (y >> 40) as usize % (digits + 1);
            let with_point = if point == 0 {
                text
            } else {
                format!("{}.{}", &text[..point], &text[point..])
            };
            cases.push(with_point.into_bytes());
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

    /// The digits `b` starts with, one byte at a time (wrapping, as
    /// `digit_run` does past 19 digits).
    fn digits_one_by_one(b: &[u8]) -> (u64, usize) {
        let n = b.iter().take_while(|c| c.is_ascii_digit()).count();
        let v = b[..n].iter().fold(0u64, |v, c| {
            v.wrapping_mul(10).wrapping_add(u64::from(c - b'0'))
        });
        (v, n)
    }

    #[test]
    fn digit_runs_read_what_one_byte_at_a_time_reads() {
        // Every length to 25, every byte value (or none) stopping the run
        // at every position: whole words, a run ending inside a word, the
        // last word of a long slice, and a short slice.
        let mut rng = testkit::Rng(0x3C6E_F372_FE94_F82B);
        for len in 0..=25usize {
            for stop in 0..=len {
                for stopper in 0..=255u8 {
                    if stop == len && stopper > 0 {
                        break;
                    }
                    let mut b: Vec<u8> = (0..len).map(|_| b'0' + rng.below(10) as u8).collect();
                    if stop < len {
                        b[stop] = stopper;
                    }
                    assert_eq!(digit_run(&b), digits_one_by_one(&b), "{b:?}");
                }
            }
        }
        for b in [
            &b"99999999"[..],
            b"00000000",
            b"1764513600123456",
            b"999998.00000123456",
        ] {
            assert_eq!(digit_run(b), digits_one_by_one(b), "{b:?}");
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
