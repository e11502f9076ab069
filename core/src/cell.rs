//! `CL.THROTTLE key max_burst count period [quantity]`, the command of
//! redis-cell, on this crate's token bucket.
//!
//! redis-cell's GCRA is a token bucket: capacity `max_burst + 1`, refilled
//! at `count / period` tokens per second, each call costing `quantity`
//! tokens. So `CL.THROTTLE k 15 30 60` and `TB.CONSUME k 16 0.5` act on the
//! same bucket, stored the same way. This module parses the arguments,
//! reads a key redis-cell left behind (a string holding its theoretical
//! arrival time, TAT, in nanoseconds), and shapes the reply.

use crate::args::{Argv, MAX_CAPACITY, MAX_FILL_SECONDS, MAX_RATE};
use crate::bucket::{Limits, Outcome, Stored};

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

/// Why a CL.THROTTLE call is refused before any key is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThrottleError {
    Arity,
    /// Not an integer (`max_burst`, `count`, `period`, `quantity`).
    NotAnInteger(&'static str),
    /// Below the argument's least value (0 for max_burst and quantity, 1
    /// for count and period).
    TooSmall(&'static str),
    /// `max_burst + 1` above the largest capacity (1e12).
    BurstTooLarge,
    /// `count / period` above the largest rate (1e12 per second).
    RateTooHigh,
    /// The bucket would take more than 1e10 seconds to fill.
    FillTooSlow,
}

impl ThrottleError {
    pub fn message(&self) -> String {
        match self {
            ThrottleError::Arity => {
                "ERR wrong number of arguments for 'cl.throttle' command".to_string()
            }
            ThrottleError::NotAnInteger(a) => format!("ERR {a} must be an integer"),
            ThrottleError::TooSmall(a) => {
                let least = if matches!(*a, "count" | "period") {
                    1
                } else {
                    0
                };
                format!("ERR {a} must be >= {least}")
            }
            ThrottleError::BurstTooLarge => "ERR max_burst must be < 1e12".to_string(),
            ThrottleError::RateTooHigh => {
                "ERR count/period must be <= 1e12 per second".to_string()
            }
            ThrottleError::FillTooSlow => {
                "ERR count/period is too low for max_burst: (max_burst+1)*period/count must be <= 1e10 seconds"
                    .to_string()
            }
        }
    }
}

/// An integer as Rust's `i64` parser reads it (what redis-cell uses): an
/// optional sign and decimal digits, within range.
fn integer(bytes: &[u8], name: &'static str) -> Result<i64, ThrottleError> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or(ThrottleError::NotAnInteger(name))
}

fn at_least(v: i64, least: i64, name: &'static str) -> Result<i64, ThrottleError> {
    if v < least {
        Err(ThrottleError::TooSmall(name))
    } else {
        Ok(v)
    }
}

/// `CL.THROTTLE key max_burst count period [quantity]`, checked left to
/// right: arity, `max_burst`, `count`, `period`, the bounds the TB commands
/// have (capacity, rate, fill time), then `quantity`.
pub fn parse_throttle(argv: &(impl Argv + ?Sized)) -> Result<Throttle, ThrottleError> {
    let n = argv.count();
    if !(5..=6).contains(&n) {
        return Err(ThrottleError::Arity);
    }
    let burst = at_least(integer(argv.arg(2), "max_burst")?, 0, "max_burst")?;
    let count = at_least(integer(argv.arg(3), "count")?, 1, "count")?;
    let period = at_least(integer(argv.arg(4), "period")?, 1, "period")?;
    let limit = burst.checked_add(1).ok_or(ThrottleError::BurstTooLarge)?;
    let max = limit as f64;
    if max > MAX_CAPACITY {
        return Err(ThrottleError::BurstTooLarge);
    }
    let rate = count as f64 / period as f64;
    if rate > MAX_RATE {
        return Err(ThrottleError::RateTooHigh);
    }
    if max / rate > MAX_FILL_SECONDS {
        return Err(ThrottleError::FillTooSlow);
    }
    let quantity = match n {
        6 => at_least(integer(argv.arg(5), "quantity")?, 0, "quantity")?,
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

    fn argv(s: &[&str]) -> Vec<Vec<u8>> {
        s.iter().map(|a| a.as_bytes().to_vec()).collect()
    }

    fn parse(s: &[&str]) -> Result<Throttle, ThrottleError> {
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
            (vec!["c", "k", "1", "1"], ThrottleError::Arity),
            (vec!["c", "k", "1", "1", "1", "1", "1"], ThrottleError::Arity),
            (vec!["c", "k", "1.5", "1", "1"], ThrottleError::NotAnInteger("max_burst")),
            (vec!["c", "k", "-1", "1", "1"], ThrottleError::TooSmall("max_burst")),
            (vec!["c", "k", "1", "0", "1"], ThrottleError::TooSmall("count")),
            (vec!["c", "k", "1", "1", "0"], ThrottleError::TooSmall("period")),
            (vec!["c", "k", "1", "x", "1"], ThrottleError::NotAnInteger("count")),
            (vec!["c", "k", "1", "1", " 1"], ThrottleError::NotAnInteger("period")),
            (vec!["c", "k", "1", "1", "1", "-1"], ThrottleError::TooSmall("quantity")),
            (vec!["c", "k", "1", "1", "1", "1e3"], ThrottleError::NotAnInteger("quantity")),
            (vec!["c", "k", "1000000000000", "1", "1"], ThrottleError::BurstTooLarge),
            (vec!["c", "k", "9223372036854775807", "1", "1"], ThrottleError::BurstTooLarge),
            (vec!["c", "k", "1", "9223372036854775807", "1"], ThrottleError::RateTooHigh),
            (vec!["c", "k", "999999", "1", "100000"], ThrottleError::FillTooSlow),
        ];
        for (args, e) in cases {
            assert_eq!(parse(&args), Err(e), "{args:?}");
        }
        assert_eq!(
            ThrottleError::TooSmall("period").message(),
            "ERR period must be >= 1"
        );
    }

    #[test]
    fn tat_text_is_a_canonical_u64() {
        assert_eq!(
            parse_tat(b"1764513600123456789"),
            Some(1_764_513_600_123_456_789)
        );
        assert_eq!(parse_tat(b"0"), Some(0));
        assert_eq!(parse_tat(b"18446744073709551615"), Some(u64::MAX));
        for bad in [
            &b""[..],
            b"18446744073709551616",
            b"-1",
            b"+1",
            b"01",
            b"1.5",
            b"12a",
            b" 1",
        ] {
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
