//! The shortest decimal that reads back exactly, written on the stack:
//! a bucket's `tokens` (as Rust's `Display` writes it, in integers where
//! it can), and its `ts` and expire times (groups of eight digits). The
//! module writes every field through these, so a write allocates nothing.

use super::parse::POW10_INT;
use std::cell::Cell;
use std::fmt::Write;

/// The text of one field value, on the stack: encoding a bucket on the
/// command path allocates nothing. Only texts longer than any balance the
/// module can store (|tokens| <= 1e12) spill to the heap.
pub struct Text {
    /// The text is `buf[start..end]`: integers are written from the right
    /// end and stay there, everything else from the left.
    start: usize,
    end: usize,
    buf: [u8; TEXT_CAP],
    spill: String,
}

/// Holds any i64, and any f64 below 2^53 in magnitude (at most 17
/// significant digits after at most 4 zeros, or 24 characters in exponent
/// form). Larger values, all integral, spill.
const TEXT_CAP: usize = 32;

/// 2^53: below it every integer is an exact f64 and every other finite
/// value has a fraction.
const TWO_POW_53: f64 = 9_007_199_254_740_992.0;

impl Text {
    fn new() -> Self {
        Text {
            start: 0,
            end: 0,
            buf: [0; TEXT_CAP],
            spill: String::new(),
        }
    }

    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        if self.spill.is_empty() {
            &self.buf[self.start..self.end]
        } else {
            self.spill.as_bytes()
        }
    }

    /// The shortest decimal that parses back to exactly `tokens`, `0`
    /// for negative zero so equal balances always look the same.
    #[inline(always)]
    pub fn tokens(tokens: f64) -> Self {
        // Made here, in the caller, and written in place: a text returned
        // from the writer would be copied out of its frame.
        let mut out = Text::new();
        out.write_tokens(tokens);
        out
    }

    /// `tokens`' text, written into this empty `Text`.
    fn write_tokens(&mut self, tokens: f64) {
        let t = if tokens == 0.0 { 0.0 } else { tokens };
        // Integral balances (every fresh bucket's first charge) print as
        // their integer: same text as Display, without the float
        // formatting machinery. Below 2^53 the i64 cast is exact, so the
        // balance is integral when it converts back unchanged.
        if t.abs() < TWO_POW_53 && (t as i64) as f64 == t {
            let int = Text::int(t as i64);
            let bytes = int.as_bytes();
            self.buf[..bytes.len()].copy_from_slice(bytes);
            self.end = bytes.len();
            return;
        }
        // A fraction: its shortest decimal found in integers, the text
        // Display writes; ties, and the tiniest magnitudes, go to Display.
        if let Some(decimal) = shortest_fraction(t) {
            if self.write_fraction(decimal) {
                return;
            }
        }
        self.write_displayed(t);
    }

    /// What Display writes for `t`, written into this empty `Text`. Out of
    /// line: the formatting machinery is seldom needed.
    #[cold]
    #[inline(never)]
    fn write_displayed(&mut self, t: f64) {
        let out = self;
        // Rust's Display is shortest-round-trip but never uses an exponent;
        // tiny magnitudes would print hundreds of zeros, so use `e` for those.
        let tiny = t != 0.0 && t.abs() < 1e-5;
        let fits = if tiny {
            write!(out, "{t:e}")
        } else {
            write!(out, "{t}")
        };
        if fits.is_err() {
            // Writing to a String cannot fail.
            let _ = if tiny {
                write!(out.spill, "{t:e}")
            } else {
                write!(out.spill, "{t}")
            };
        }
    }

    /// An integer in decimal, as Display writes it.
    #[inline(always)]
    pub fn int(v: i64) -> IntText {
        IntText::new(v)
    }

    /// `int(v)`, taking the digits above the lowest eight from `last`
    /// when they are the ones it holds, and leaving `v`'s there. Timestamps
    /// written one after another share those digits: a `ts` in µs changes
    /// them every 100 s, an expire time in ms every 28 hours.
    #[inline(always)]
    pub fn int_after(v: i64, last: &Cell<Upper>) -> IntText {
        let n = v as u64;
        let high = n / 100_000_000;
        // Below 10^8 (negatives too), or above 10^16: not two groups.
        if v < 100_000_000 || high >= 100_000_000 {
            return IntText::new(v);
        }
        let upper = last.get();
        if upper.high != high {
            // Another upper group: written in full, and kept.
            let out = IntText::new(v);
            let mut ascii = [0; 8];
            ascii.copy_from_slice(&out.buf[8..16]);
            last.set(Upper {
                high,
                ascii,
                start: out.start,
            });
            return out;
        }
        let mut out = IntText {
            start: upper.start,
            buf: [0; INT_CAP],
        };
        out.buf[8..16].copy_from_slice(&upper.ascii);
        let low = (n - high * 100_000_000) as u32;
        out.buf[16..24].copy_from_slice(&ascii(eight_digits(low)));
        out
    }
}

/// The upper group of the last two-group integer `Text::int_after` wrote.
#[derive(Clone, Copy, Debug)]
pub struct Upper {
    /// Its digits above the lowest eight, as a number: 0 for none yet (a
    /// two-group integer has at least one).
    high: u64,
    /// Those digits, zero-padded to eight, and where the first one is in
    /// an `IntText`.
    ascii: [u8; 8],
    start: usize,
}

impl Upper {
    pub const NONE: Upper = Upper {
        high: 0,
        ascii: [0; 8],
        start: 0,
    };
}

/// An integer's text (a `ts`, an expire time), on the stack: a plain
/// copyable buffer, so the write path neither copies nor drops more than
/// its bytes.
#[derive(Clone, Copy)]
pub struct IntText {
    /// The text is `buf[start..]`.
    start: usize,
    buf: [u8; INT_CAP],
}

/// A sign and the 20 digits of the largest magnitude, in three groups of 8.
const INT_CAP: usize = 24;

impl IntText {
    /// Inlined, so the text is written where the caller keeps it rather
    /// than copied there.
    #[inline(always)]
    fn new(v: i64) -> Self {
        let mut out = IntText {
            start: 0,
            buf: [0; INT_CAP],
        };
        // Groups of eight digits from the right end, where they stay: a
        // 16-digit timestamp is one division and two groups.
        let n = v.unsigned_abs();
        let (high, low) = (n / 100_000_000, (n % 100_000_000) as u32);
        let mut group = eight_digits(low);
        out.buf[16..24].copy_from_slice(&ascii(group));
        let mut first = 16;
        if high != 0 {
            let (top, middle) = (high / 100_000_000, (high % 100_000_000) as u32);
            group = eight_digits(middle);
            out.buf[8..16].copy_from_slice(&ascii(group));
            first = 8;
            if top != 0 {
                // u64::MAX / 10^16 < 10^4: one more group holds the rest.
                group = eight_digits(top as u32);
                out.buf[0..8].copy_from_slice(&ascii(group));
                first = 0;
            }
        }
        // The first group's leading zeros are its lowest zero bytes (its
        // first digit is in the lowest byte); zero itself keeps one digit.
        // A sign goes before the first digit: a number with a top group
        // has at most 4 digits there, so there is room.
        let zeros = (group.trailing_zeros() / 8).min(7) as usize;
        let mut start = first + zeros;
        if v < 0 {
            start -= 1;
            out.buf[start] = b'-';
        }
        out.start = start;
        out
    }

    #[inline(always)]
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

/// The eight decimal digits of `x` < 10^8 as byte values 0..=9, the first
/// digit in the lowest byte: lane-wise arithmetic on one u64 (two 4-digit
/// halves, then pairs, then digits), no division loop and no table. The
/// constants divide exactly in range: y * 10486 >> 20 is y / 100 for
/// y < 10^4, z * 103 >> 10 is z / 10 for z < 100 (tests check every value).
#[inline]
fn eight_digits(x: u32) -> u64 {
    let x = u64::from(x);
    // 32-bit lanes: the high half (printed first) in the low lane.
    let v = (x / 10_000) | ((x % 10_000) << 32);
    // 16-bit lanes: y / 100 below y % 100, in each 32-bit lane.
    let q = ((v * 10_486) >> 20) & 0x0000_007F_0000_007F;
    let v = q | ((v - q * 100) << 16);
    // Bytes: z / 10 below z % 10, in each 16-bit lane.
    let q = ((v * 103) >> 10) & 0x000F_000F_000F_000F;
    q | ((v - q * 10) << 8)
}

/// `eight_digits`' value as ASCII bytes, in print order.
#[inline]
fn ascii(digits: u64) -> [u8; 8] {
    (digits | 0x3030_3030_3030_3030).to_le_bytes()
}

/// The digits Display writes for a non-integral `t` with 2^-12 <= |t| <
/// 2^53 (every fractional balance but the tiniest), found in integers:
/// `None` for any other `t`, and where two shortest decimals are equally
/// close (which Display's rule then breaks). `t` is m / 2^s exactly.
///
/// For a precision p, the decimal of p significant digits nearest to t is
/// m * 10^k / 2^s rounded (k = p - 1 - E, E the decimal exponent), and the
/// remainder of that division says how far it is from t; it reads back as
/// t when that is within half of t's gap to its neighbouring doubles
/// (exactly half only if m is even, as parsing rounds ties to even). The
/// smallest p whose nearest decimal reads back is the shortest length: a
/// double's gap is below 2.3e-16 of it, so at most one decimal of 15
/// digits lies in reach, the nearest of 16 or 17 digits is the closest
/// one if any is, and one of 17 always is. Trailing zeros go.
///
/// Everything is scaled by 2^(64 - s), so the quotient is the high word of
/// a product and the remainder its low word: no shift by s per precision.
/// That needs s <= 64, hence the 2^-12; smaller balances go to Display.
fn shortest_fraction(t: f64) -> Option<Decimal> {
    let bits = t.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i64;
    let m = (bits & ((1 << 52) - 1)) | (1 << 52);
    // |t| = m / 2^s; 2^-12 <= |t| < 2^53 and a fraction mean 1 <= s <= 64.
    let s = 1075 - biased;
    if !(1..=64).contains(&s) {
        return None;
    }
    // m has 53 bits, so |t| is in [2^(52-s), 2^(53-s)): its decimal exponent
    // is floor((52 - s) log10 2) or one more (78913 / 2^18 is log10 2 to
    // well within this range), -4 ..= 15.
    let guess = ((52 - s) * 78_913) >> 18;
    let above = t.abs() >= DECADES[(guess + 1 - DECADES_FROM) as usize];
    let e10 = guess + i64::from(above);
    // Scaled by 2^(64 - s): t is m * unit / 2^64, and t's gap is unit / 2^64
    // (unit / 2^65 below a power of two, where the gap down is half).
    let shift = (64 - s) as u32 & 63;
    let (m, unit) = (u128::from(m) << shift, 1u128 << shift);
    let quarter_below = m == unit << 52;
    const HALF: u64 = 1 << 63;
    // The decimal of p significant digits nearest to t, if it reads back
    // as t: Err(true) for a tie that would (Display's rule decides).
    let nearest = |p: i64| -> Result<u64, bool> {
        let reach = POW10_INT[(p - 1 - e10) as usize];
        let r = m * reach;
        let (q, rem) = ((r >> 64) as u64, r as u64);
        // Half a gap, in the same units: 10^k * unit / 2.
        let reach = reach * unit;
        if rem == HALF {
            // Two decimals equally close: a tie if they read back as t,
            // else both are too far.
            return Err(1u128 << 64 <= reach);
        }
        // Twice the distance from t.
        let (digits, twice) = if rem > HALF {
            (q + 1, u128::from(rem.wrapping_neg()) << 1)
        } else {
            (q, u128::from(rem) << if quarter_below { 2 } else { 1 })
        };
        let fits = twice < reach || (twice == reach && bits & 1 == 0);
        if fits {
            Ok(digits)
        } else {
            Err(false)
        }
    };
    let at = |digits: u64, count: usize| {
        Some(Decimal {
            negative: t < 0.0,
            digits,
            count,
            e10,
        })
    };
    // 16 digits first: if none reads back, neither do 15 (a decimal of 15
    // digits is one of 16), and 17 decide; if one does, a 15-digit one
    // may too, and is shorter. Above 10^15 that one is a multiple of 10,
    // the nearest 16-digit decimal, whose zero goes.
    match nearest(16) {
        Ok(d16) if e10 >= 15 => at(d16, 16),
        Ok(d16) => match nearest(15) {
            Ok(d15) => at(d15, 15),
            Err(true) => None,
            Err(false) => at(d16, 16),
        },
        Err(false) => match nearest(17) {
            Ok(d17) => at(d17, 17),
            Err(_) => None,
        },
        Err(true) => None,
    }
}

/// 10^e for e from `DECADES_FROM`: the powers of ten that bound a
/// fraction's decimal exponent. Comparing a double with them is exact: the
/// non-negative ones are exact doubles, and 0.1, 0.01 and 0.001 round up,
/// to the first double above the power (a test checks), so no double lies
/// between the two.
const DECADES: [f64; 20] = [
    1e-3, 1e-2, 1e-1, 1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13,
    1e14, 1e15, 1e16,
];
const DECADES_FROM: i64 = -3;

/// `count` significant digits (at most 17), the first at 10^`e10`.
#[derive(Clone, Copy, Debug)]
struct Decimal {
    negative: bool,
    digits: u64,
    count: usize,
    e10: i64,
}

impl Text {
    /// Writes `d` with a sign, a point and no trailing zeros, as Display
    /// writes a non-integral value: the digits right-aligned in the buffer
    /// by groups of eight, around the point. False (nothing written) if
    /// they have no fraction.
    #[inline(always)]
    fn write_fraction(&mut self, d: Decimal) -> bool {
        let Decimal {
            negative,
            mut digits,
            mut count,
            mut e10,
        } = d;
        // Rounding may have carried into one more digit: 10^count.
        if digits == POW10_INT[count] as u64 {
            digits /= 10;
            e10 += 1;
        }
        while digits % 10 == 0 && count > 1 {
            digits /= 10;
            count -= 1;
        }
        let buf = &mut self.buf;
        let mut start = if e10 >= 0 {
            let int = e10 as usize + 1;
            if int >= count {
                return false;
            }
            // The fraction ends the buffer; the point and the integer part
            // go before it, the integer's groups over the fraction's
            // leading padding (a long integer leaves a short fraction).
            let places = count - int;
            let scale = POW10_INT[places] as u64;
            let (whole, fraction) = (digits / scale, digits % scale);
            buf[24..32].copy_from_slice(&ascii(eight_digits((fraction % 100_000_000) as u32)));
            buf[16..24].copy_from_slice(&ascii(eight_digits((fraction / 100_000_000) as u32)));
            let point = TEXT_CAP - 1 - places;
            buf[point - 8..point]
                .copy_from_slice(&ascii(eight_digits((whole % 100_000_000) as u32)));
            if int > 8 {
                buf[point - 16..point - 8]
                    .copy_from_slice(&ascii(eight_digits((whole / 100_000_000) as u32)));
            }
            buf[point] = b'.';
            point - int
        } else {
            // All the digits, after '0's: "0." and the zeros before the
            // digits are there but for the point.
            let (high, low) = (digits / 100_000_000, (digits % 100_000_000) as u32);
            buf[24..32].copy_from_slice(&ascii(eight_digits(low)));
            buf[16..24].copy_from_slice(&ascii(eight_digits((high % 100_000_000) as u32)));
            // At most 17 digits: the first group holds one.
            buf[8..16].copy_from_slice(&ascii(u64::from((high / 100_000_000) as u8) << 56));
            let start = TEXT_CAP - count - 1 - e10.unsigned_abs() as usize;
            buf[start + 1] = b'.';
            start
        };
        if negative {
            start -= 1;
            buf[start] = b'-';
        }
        self.start = start;
        self.end = TEXT_CAP;
        true
    }
}

impl std::fmt::Write for Text {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.end + s.len();
        match self.buf.get_mut(self.end..end) {
            Some(dst) => {
                dst.copy_from_slice(s.as_bytes());
                self.end = end;
                Ok(())
            }
            None => Err(std::fmt::Error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::number::parse_decimal;

    fn string(text: Text) -> String {
        String::from_utf8(text.as_bytes().to_vec()).unwrap()
    }

    fn int_string(text: IntText) -> String {
        String::from_utf8(text.as_bytes().to_vec()).unwrap()
    }

    #[test]
    fn tokens_round_trip_exactly() {
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
            let s = string(Text::tokens(t));
            let back = parse_decimal(s.as_bytes()).unwrap();
            assert_eq!(
                back.to_bits(),
                if t == 0.0 { 0 } else { t.to_bits() },
                "{t} -> {s}"
            );
        }
        assert_eq!(string(Text::tokens(-0.0)), "0");
        assert_eq!(string(Text::tokens(9.0)), "9");
    }

    /// The smallest magnitude the integer path writes (s <= 64).
    const LOWEST: f64 = 1.0 / 4096.0;

    /// The encoders before the stack-buffer fast paths, kept as the oracle.
    fn display(t: f64) -> String {
        let t = if t == 0.0 { 0.0 } else { t };
        if t != 0.0 && t.abs() < 1e-5 {
            format!("{t:e}")
        } else {
            format!("{t}")
        }
    }

    #[test]
    fn the_lane_divisions_are_exact_in_range() {
        for y in 0..10_000u64 {
            assert_eq!((y * 10_486) >> 20, y / 100, "{y}");
        }
        for z in 0..100u64 {
            assert_eq!((z * 103) >> 10, z / 10, "{z}");
        }
    }

    #[test]
    fn integers_write_what_display_writes() {
        let mut values: Vec<i64> = vec![0, i64::MAX, i64::MIN, i64::MIN + 1];
        // Both sides of every power of ten, and of the group boundaries.
        let mut p = 1i64;
        for _ in 0..19 {
            for d in [-1, 0, 1] {
                values.extend([p + d, -(p + d)]);
            }
            p = p.saturating_mul(10);
        }
        // Every magnitude, and every digit count with random digits.
        let mut rng = testkit::Rng(0x5851_F42D_4C95_7F2D);
        for _ in 0..300_000 {
            let x = rng.next();
            values.push(x as i64);
            values.push((x >> (x % 64)) as i64);
            values.push(-((x % 10_000_000_000_000_000) as i64));
        }
        values.extend(-100_000..100_000);
        for v in values {
            assert_eq!(int_string(Text::int(v)), v.to_string(), "{v}");
        }
        let mut rng = testkit::Rng(7);
        for x in (0..200_000u32).chain((0..200_000).map(|_| rng.below(100_000_000) as u32)) {
            assert_eq!(ascii(eight_digits(x)), *format!("{x:08}").as_bytes(), "{x}");
        }
    }

    #[test]
    fn integers_after_others_write_what_display_writes() {
        let last = Cell::new(Upper::NONE);
        let mut rng = testkit::Rng(0x9E37_79B9_7F4A_7C15);
        let mut v = 1_764_513_599_999_990i64;
        for i in 0..400_000u64 {
            // Mostly a clock's small steps (across group boundaries too),
            // and now and then any value: another magnitude, a negative,
            // a second clock in ms.
            v = match i % 97 {
                0 => rng.next() as i64,
                1 => (rng.next() >> (rng.next() % 64)) as i64,
                2 => -((rng.next() % 10_000_000_000_000_000) as i64),
                3 => 1_764_513_600_000 + (rng.next() % 100_000_000_000) as i64,
                4 => 100_000_000 * (1 + (rng.next() % 99_999_999) as i64) - 1,
                _ => v.wrapping_add((rng.next() % 3_000) as i64),
            };
            let want = v.to_string();
            assert_eq!(int_string(Text::int_after(v, &last)), want, "{v}");
            // Again, with `last` now holding v's upper digits.
            assert_eq!(int_string(Text::int_after(v, &last)), want, "{v}");
        }
        for v in [
            99_999_999,
            100_000_000,
            100_000_001,
            9_999_999_999_999_999,
            10_000_000_000_000_000,
            i64::MAX,
            i64::MIN,
            -100_000_000,
            0,
        ] {
            assert_eq!(int_string(Text::int_after(v, &last)), v.to_string(), "{v}");
        }
    }

    #[test]
    fn fast_paths_write_what_display_writes() {
        let mut values = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            999_999.0,
            999_998.5,
            1e-5,
            -1e-5,
            9.999999999999999e-6,
            0.1 + 0.2,
            1e12,
            -1e12,
            4503599627370496.5,
            9007199254740991.0,
            9007199254740992.0,
            9007199254740994.0,
            1e15,
            1e22,
            1e300,
            f64::MAX,
            -f64::MAX,
            f64::MIN_POSITIVE,
            -f64::MIN_POSITIVE,
            5e-324,
            123456.789012345,
            -0.000012345678901234567,
        ];
        // A deterministic spread over magnitudes and fractions.
        let mut rng = testkit::Rng(0x9E37_79B9_7F4A_7C15);
        for _ in 0..20_000 {
            let x = rng.next();
            let f = f64::from_bits(x);
            if f.is_finite() {
                values.push(f);
            }
            values.push((x % 2_000_000_000) as f64 / 1000.0 - 1_000_000.0);
            values.push((x % 10_000_000) as f64);
        }
        for t in values {
            assert_eq!(string(Text::tokens(t)), display(t), "{t:?}");
        }
        for v in [
            0,
            7,
            -7,
            10,
            1_764_513_600_123_456,
            -1_764_513_600_123_456,
            i64::MAX,
            i64::MIN,
            9,
            99,
            100,
            -100,
            1_000_000_000,
        ] {
            assert_eq!(int_string(Text::int(v)), v.to_string());
        }
        for v in (-100_000..100_000).chain((0..64).map(|b| 1i64 << b)) {
            assert_eq!(int_string(Text::int(v)), v.to_string());
        }
    }

    #[test]
    fn ties_between_two_shortest_decimals_are_written_as_display_writes_them() {
        // 1658206780088562.25 is exactly halfway between the two shortest
        // decimals ...62.2 and ...62.3; 549755813888.03125 (within the
        // module's 1e12 bound) between ...888.0312 and ...888.0313.
        // (Written as sums: each is exact, but longer than its shortest form.)
        // The integer path declines them, and Display's rule decides.
        let near_2_pow_50 = 1_658_206_780_088_562.0 + 0.25;
        let near_2_pow_39 = 549_755_813_888.0 + 0.031_25;
        for t in [near_2_pow_50, near_2_pow_39, -near_2_pow_39] {
            assert!(shortest_fraction(t).is_none(), "{t:?}");
            assert_eq!(string(Text::tokens(t)), display(t), "{t:?}");
        }
        assert_eq!(string(Text::tokens(0.1)), "0.1");
        assert!(shortest_fraction(0.1).is_some());
    }

    #[test]
    fn the_decimal_exponent_guess_is_floor_or_one_below() {
        // shortest_fraction's estimate of floor(log10 |t|) for |t| in
        // [2^(52-s), 2^(53-s)): exact at the bottom of each range.
        for s in 1..=64i64 {
            let guess = ((52 - s) * 78_913) >> 18;
            let low = 2f64.powi((52 - s) as i32);
            assert_eq!(guess, low.log10().floor() as i64, "s = {s}");
        }
    }

    #[test]
    fn the_decades_below_one_are_the_first_doubles_above_them() {
        // So that |t| >= DECADES[i] is |t| >= 10^e exactly: the double is
        // above the power and the next one down below it.
        for (d, power) in DECADES.iter().zip(DECADES_FROM..).filter(|(_, e)| *e < 0) {
            let exact = |x: f64| format!("{x:.80}").trim_end_matches('0').to_string();
            let digits = "0.".to_string() + &"0".repeat((-power - 1) as usize);
            assert!(exact(*d).len() > digits.len() + 1, "{d:e} is exact");
            assert!(exact(*d).starts_with(&(digits.clone() + "1")), "{d:e}");
            assert!(exact(d.next_down()).starts_with(&(digits + "0")), "{d:e}");
        }
        for (d, power) in DECADES.iter().zip(DECADES_FROM..).filter(|(_, e)| *e >= 0) {
            assert_eq!(*d, 10f64.powi(power as i32));
            assert_eq!(*d as u128, POW10_INT[power as usize], "10^{power} is exact");
        }
    }

    #[test]
    fn fractions_in_integers_write_what_display_writes() {
        // Every binade the integer path covers, random mantissas, and the
        // edges: powers of two (a narrower gap below), neighbours of
        // powers of ten, and the balances the module writes most.
        let mut values = vec![1e-5, 0.1, 0.3, 0.1 + 0.2, 999_999.000_123_456, 2.5, 0.5];
        let mut rng = testkit::Rng(0xB5AD_4ECE_DA1C_E2A9);
        for s in 1..=69i32 {
            let base = 2f64.powi(52 - s);
            values.push(base);
            values.push(base.next_up());
            values.push(base.next_down());
            for _ in 0..6_000 {
                let m = (rng.next() >> 11) | (1 << 52);
                values.push(m as f64 / 2f64.powi(s));
            }
        }
        for k in -5..=15 {
            let p = 10f64.powi(k);
            values.extend([p, p.next_up(), p.next_down(), p.next_up().next_up()]);
        }
        let mut declined = 0;
        for t in values.into_iter().flat_map(|t| [t, -t]) {
            if t.abs() < LOWEST || t.abs() >= TWO_POW_53 || t == t.trunc() {
                // Out of range, or an integer: no fraction is written.
                let written = shortest_fraction(t).map(|d| Text::new().write_fraction(d));
                assert_ne!(written, Some(true), "{t:?}");
                continue;
            }
            match shortest_fraction(t) {
                Some(decimal) => {
                    let mut text = Text::new();
                    assert!(text.write_fraction(decimal), "{t:?}");
                    assert_eq!(string(text), display(t), "{t:?}");
                }
                None => {
                    assert!(is_tie(t), "{t:?} declined, and is no tie");
                    declined += 1;
                }
            }
            assert_eq!(string(Text::tokens(t)), display(t), "{t:?}");
        }
        // Ties need few fraction bits: they are among the values of the
        // small binades' random mantissas, and happen there.
        assert!(declined > 0, "no tie was met");
    }

    /// Whether `t` lies exactly halfway between two decimals of the length
    /// of its shortest one: its exact expansion (a double of s fraction
    /// bits has s fraction digits) is one digit longer than Display's
    /// text and ends in 5.
    fn is_tie(t: f64) -> bool {
        let significant = |text: &str| {
            let digits: String = text.chars().filter(char::is_ascii_digit).collect();
            digits
                .trim_start_matches('0')
                .trim_end_matches('0')
                .to_string()
        };
        let exact = significant(&format!("{:.80}", t.abs()));
        let shortest = significant(&display(t));
        exact.len() == shortest.len() + 1 && exact.ends_with('5')
    }

    #[test]
    fn dyadic_fractions_write_what_display_writes() {
        // n / 2^j has j binary fraction bits: the values where a shortest
        // decimal can tie, in every magnitude up to 2^53.
        let mut rng = testkit::Rng(0x2545_F491_4F6C_DD1D);
        let mut ties = 0;
        for _ in 0..400_000 {
            let x = rng.next();
            let j = (x >> 58) as i32 + 1; // 1..=64
            let n = (x & ((1u64 << 53) - 1)) >> (x % 53);
            let t = n as f64 / 2f64.powi(j);
            let t = if x & 1 == 1 { -t } else { t };
            let text = Text::tokens(t);
            assert_eq!(string(text), display(t), "{t:?}");
            if t != t.trunc() && t.abs() >= LOWEST && shortest_fraction(t).is_none() {
                ties += 1;
            }
        }
        assert!(ties > 100, "the fallback was exercised only {ties} times");
    }
}
