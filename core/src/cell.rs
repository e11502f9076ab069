//! `CL.THROTTLE key max_burst count period [quantity]`, the command of
//! redis-cell, on this crate's token bucket.
//!
//! redis-cell's GCRA is a token bucket: capacity `max_burst + 1`, refilled
//! at `count / period` tokens per second, each call costing `quantity`
//! tokens. So `CL.THROTTLE k 15 30 60` and `TB.CONSUME k 16 0.5` act on the
//! same bucket, stored the same way. This module parses the arguments,
//! reads the text of a key redis-cell left behind (a string holding its
//! theoretical arrival time, TAT, in nanoseconds) as that bucket, and
//! shapes the reply.

use crate::args::Argv;
use crate::bucket::{Limits, Outcome, Stored};
use crate::contract::{MAX_CAPACITY, MAX_FILL_SECONDS, MAX_RATE};
use crate::error::{Arg, Error};
use crate::number::parse_i64;

/// A validated CL.THROTTLE call; its key is `argv[1]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Throttle {
    /// Capacity `max_burst + 1`, rate `count / period` per second.
    pub limits: Limits,
    /// `max_burst + 1`, the reply's second element.
    pub limit: i64,
    pub quantity: i64,
}

impl Throttle {
    /// The cost to charge, or `None` when the quantity is above the limit,
    /// which can never pass: redis-cell answers such a call limited, with
    /// a retry time of -1, and so does this module (writing nothing).
    pub fn cost(&self) -> Option<f64> {
        (self.quantity <= self.limit).then_some(self.quantity as f64)
    }
}

/// An integer as Rust's `i64` parser reads it (what redis-cell uses): an
/// optional sign and decimal digits, within range.
fn integer(bytes: &[u8], arg: Arg) -> Result<i64, Error> {
    parse_i64(bytes).ok_or(Error::NotAnInteger(arg))
}

fn at_least(v: i64, least: i64, arg: Arg) -> Result<i64, Error> {
    if v < least {
        Err(Error::TooSmall(arg, least))
    } else {
        Ok(v)
    }
}

/// `CL.THROTTLE key max_burst count period [quantity]`, checked left to
/// right: arity, `max_burst`, `count`, `period`, the bounds the TB commands
/// have (capacity, rate, fill time), then `quantity`.
pub fn parse_throttle(argv: &(impl Argv + ?Sized)) -> Result<Throttle, Error> {
    let n = argv.count();
    if !(5..=6).contains(&n) {
        return Err(Error::Arity(argv.command()));
    }
    let burst = at_least(integer(argv.arg(2), Arg::MaxBurst)?, 0, Arg::MaxBurst)?;
    let count = at_least(integer(argv.arg(3), Arg::Count)?, 1, Arg::Count)?;
    let period = at_least(integer(argv.arg(4), Arg::Period)?, 1, Arg::Period)?;
    let limit = burst.checked_add(1).ok_or(Error::BurstTooLarge)?;
    let max = limit as f64;
    if max > MAX_CAPACITY {
        return Err(Error::BurstTooLarge);
    }
    let rate = count as f64 / period as f64;
    if rate > MAX_RATE {
        return Err(Error::ThrottleRateTooHigh);
    }
    if max / rate > MAX_FILL_SECONDS {
        return Err(Error::ThrottleFillTooSlow);
    }
    let quantity = match n {
        6 => at_least(integer(argv.arg(5), Arg::Quantity)?, 0, Arg::Quantity)?,
        _ => 1,
    };
    Ok(Throttle {
        limits: Limits { max, rate },
        limit,
        quantity,
    })
}

/// redis-cell's TAT as text: the digits of a u64, as Rust writes it (no
/// sign, no leading zero). `None` for anything else, which is WRONGTYPE.
pub fn parse_tat(bytes: &[u8]) -> Option<u64> {
    let canonical = !bytes.is_empty()
        && bytes.len() <= 20
        && bytes.iter().all(u8::is_ascii_digit)
        && (bytes[0] != b'0' || bytes.len() == 1);
    if !canonical {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// The bucket a redis-cell key stands for at `now_us`: a TAT that many
/// nanoseconds ahead of now is that much refill missing from a full
/// bucket. `None` (a full bucket) when the TAT has passed.
///
/// The time ahead is computed as whole seconds and nanoseconds apart, in
/// that order of float operations, so the Lua library, which has no
/// integers past 2^53, gets the same bits.
pub fn stored_from_tat(tat_ns: u64, limits: &Limits, now_us: i64) -> Option<Stored> {
    let (tat_s, tat_frac) = (
        (tat_ns / 1_000_000_000) as i64,
        (tat_ns % 1_000_000_000) as i64,
    );
    let (now_s, now_frac) = (
        now_us.div_euclid(1_000_000),
        now_us.rem_euclid(1_000_000) * 1000,
    );
    let ahead_ns = (tat_s - now_s) as f64 * 1e9 + (tat_frac - now_frac) as f64;
    if ahead_ns <= 0.0 {
        return None;
    }
    Some(Stored {
        tokens: limits.max - ahead_ns / 1e9 * limits.rate,
        ts_us: now_us,
    })
}

/// The reply `[limited, limit, remaining, retry_after_s, reset_after_s]`
/// for an outcome of this call (`charged`: the quantity fit the limit).
///
/// Seconds are whole, any fraction rounded up (redis-cell rounds up only
/// fractions of at least a millisecond, so its retry time can be a
/// fraction of a millisecond early): the outcome's times are the earliest
/// passing whole millisecond, and the earliest passing second is the
/// smallest one that reaches it. `remaining` is never below 0, as in
/// redis-cell, even for a bucket TB.ADJUST put in debt.
pub fn reply(call: &Throttle, outcome: &Outcome, charged: bool) -> [i64; 5] {
    let seconds = |ms: i64| ms.div_euclid(1000) + i64::from(ms.rem_euclid(1000) != 0);
    let limited = !(charged && outcome.allowed);
    // Allowed, or a quantity that can never pass: -1.
    let retry = if limited && charged {
        seconds(outcome.retry_after_ms)
    } else {
        -1
    };
    [
        i64::from(limited),
        call.limit,
        outcome.remaining().max(0),
        retry,
        seconds(outcome.reset_after_ms),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::CL_THROTTLE;

    fn argv(s: &[&str]) -> Vec<Vec<u8>> {
        s.iter().map(|a| a.as_bytes().to_vec()).collect()
    }

    fn parse(s: &[&str]) -> Result<Throttle, Error> {
        parse_throttle(argv(s).as_slice())
    }

    #[test]
    fn arguments_as_redis_cell_takes_them() {
        let t = parse(&["cl.throttle", "k", "15", "30", "60"]).unwrap();
        assert_eq!(
            t,
            Throttle {
                limits: Limits {
                    max: 16.0,
                    rate: 0.5
                },
                limit: 16,
                quantity: 1
            }
        );
        assert_eq!(parse(&["c", "k", "0", "1", "1", "0"]).unwrap().quantity, 0);
        assert_eq!(parse(&["c", "k", "+3", "1", "1"]).unwrap().limit, 4);
        #[rustfmt::skip]
        let cases = [
            (vec!["cl.throttle", "k", "1", "1"], Error::Arity(CL_THROTTLE)),
            (vec!["CL.THROTTLE", "k", "1", "1", "1", "1", "1"], Error::Arity(CL_THROTTLE)),
            (vec!["c", "k", "1.5", "1", "1"], Error::NotAnInteger(Arg::MaxBurst)),
            (vec!["c", "k", "-1", "1", "1"], Error::TooSmall(Arg::MaxBurst, 0)),
            (vec!["c", "k", "1", "0", "1"], Error::TooSmall(Arg::Count, 1)),
            (vec!["c", "k", "1", "1", "0"], Error::TooSmall(Arg::Period, 1)),
            (vec!["c", "k", "1", "x", "1"], Error::NotAnInteger(Arg::Count)),
            (vec!["c", "k", "1", "1", " 1"], Error::NotAnInteger(Arg::Period)),
            (vec!["c", "k", "1", "1", "1", "-1"], Error::TooSmall(Arg::Quantity, 0)),
            (vec!["c", "k", "1", "1", "1", "1e3"], Error::NotAnInteger(Arg::Quantity)),
            (vec!["c", "k", "1000000000000", "1", "1"], Error::BurstTooLarge),
            (vec!["c", "k", "9223372036854775807", "1", "1"], Error::BurstTooLarge),
            (vec!["c", "k", "1", "9223372036854775807", "1"], Error::ThrottleRateTooHigh),
            (vec!["c", "k", "999999", "1", "100000"], Error::ThrottleFillTooSlow),
        ];
        for (args, e) in cases {
            assert_eq!(parse(&args), Err(e), "{args:?}");
        }
    }

    #[test]
    fn tat_text_is_a_canonical_u64() {
        assert_eq!(
            parse_tat(b"1764513600123456789"),
            Some(1_764_513_600_123_456_789)
        );
        assert_eq!(parse_tat(b"0"), Some(0));
        assert_eq!(parse_tat(b"18446744073709551615"), Some(u64::MAX));
        let bad = [
            "",
            "18446744073709551616",
            "-1",
            "+1",
            "01",
            "1.5",
            "12a",
            " 1",
        ];
        for bad in bad.map(str::as_bytes) {
            assert_eq!(parse_tat(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_tat_ahead_of_now_is_refill_missing_from_a_full_bucket() {
        let l = Limits {
            max: 16.0,
            rate: 0.5,
        };
        let now = 1_764_513_600_000_000;
        // 6 s ahead at 0.5/s: 3 tokens missing.
        let tat = (now as u64 + 6_000_000) * 1000;
        assert_eq!(
            stored_from_tat(tat, &l, now),
            Some(Stored {
                tokens: 13.0,
                ts_us: now
            })
        );
        assert_eq!(stored_from_tat((now as u64) * 1000, &l, now), None);
        assert_eq!(stored_from_tat(5, &l, now), None);
    }
}
