//! Token-bucket arithmetic: refill, consume, adjust, and the reply times.
//!
//! Everything here is plain `f64`/`i64` maths with no I/O, so the module and
//! the tests (and the Lua library, which repeats these steps operation for
//! operation) agree bit for bit. Keep the order of floating-point operations
//! in sync with `lua/tb.lua`.

/// Validated bucket parameters (see `args` for the bounds).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    /// Capacity: the burst a full bucket allows.
    pub max: f64,
    /// Tokens refilled per second.
    pub rate: f64,
}

/// What a bucket hash stores.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stored {
    pub tokens: f64,
    /// Microseconds since the Unix epoch, server clock, at the last write.
    pub ts_us: i64,
}

/// One bucket's view after a command: the four integers of the reply plus
/// the exact token balance that would be stored.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    pub allowed: bool,
    /// Balance after the call (charged only when the call is admitted).
    pub tokens: f64,
    pub retry_after_ms: i64,
    pub reset_after_ms: i64,
}

impl Outcome {
    /// `remaining` in the reply: floor of the balance. May be negative in debt.
    pub fn remaining(&self) -> i64 {
        self.tokens.floor() as i64
    }

    /// The reply array `[allowed, remaining, retry_after_ms, reset_after_ms]`.
    pub fn reply(&self) -> [i64; 4] {
        [
            i64::from(self.allowed),
            self.remaining(),
            self.retry_after_ms,
            self.reset_after_ms,
        ]
    }
}

impl Limits {
    /// Adds `elapsed_us` of refill to `tokens`, capped at `max`.
    pub fn refill(&self, tokens: f64, elapsed_us: f64) -> f64 {
        (tokens + elapsed_us / 1_000_000.0 * self.rate).min(self.max)
    }

    /// Keeps a balance inside [-max, max]: a lowered `max` clamps stored
    /// tokens, and debt never goes below `-max`.
    pub fn clamp(&self, tokens: f64) -> f64 {
        tokens.max(-self.max).min(self.max)
    }

    /// The balance now. A missing bucket is full. A clock that stepped back
    /// counts as no time elapsed, so it never mints tokens.
    pub fn current(&self, stored: Option<Stored>, now_us: i64) -> f64 {
        match stored {
            None => self.max,
            Some(s) => {
                // i128: a hostile `ts` must not overflow the subtraction.
                let elapsed = (i128::from(now_us) - i128::from(s.ts_us)).max(0) as f64;
                self.refill(self.clamp(s.tokens), elapsed)
            }
        }
    }

    /// Whole milliseconds until `tokens` has refilled to `target` (0 if it
    /// already has). This is the earliest millisecond at which `refill`
    /// reaches the target: the closed form `ceil(1000 * (target - tokens) /
    /// rate)` can be off by one either way through rounding, so it is checked
    /// against `refill` itself and nudged.
    pub fn ms_until(&self, tokens: f64, target: f64) -> i64 {
        if tokens >= target {
            return 0;
        }
        let mut ms = (1000.0 * (target - tokens) / self.rate).ceil();
        if self.refill(tokens, ms * 1000.0) < target {
            ms += 1.0;
        } else if ms > 1.0 && self.refill(tokens, (ms - 1.0) * 1000.0) >= target {
            ms -= 1.0;
        }
        ms as i64
    }

    /// Outcome of charging `cost` against a balance of `current`.
    pub fn consume(&self, current: f64, cost: f64) -> Outcome {
        let allowed = current >= cost;
        let tokens = if allowed { current - cost } else { current };
        Outcome {
            allowed,
            tokens,
            retry_after_ms: if allowed {
                0
            } else {
                self.ms_until(current, cost)
            },
            reset_after_ms: self.ms_until(tokens, self.max),
        }
    }

    /// What `consume` would answer, without charging.
    pub fn peek(&self, current: f64, cost: f64) -> Outcome {
        let allowed = current >= cost;
        Outcome {
            allowed,
            tokens: current,
            retry_after_ms: self.ms_until(current, cost),
            reset_after_ms: self.ms_until(current, self.max),
        }
    }

    /// Applies a refund (`delta > 0`) or an after-the-fact charge
    /// (`delta < 0`). Always applies; the balance stays in [-max, max].
    /// `retry_after_ms` is for a request of cost 1 (or `max`, if smaller,
    /// since a cost above `max` never passes).
    pub fn adjust(&self, current: f64, delta: f64) -> Outcome {
        let tokens = self.clamp(current + delta);
        Outcome {
            allowed: true,
            tokens,
            retry_after_ms: self.ms_until(tokens, self.max.min(1.0)),
            reset_after_ms: self.ms_until(tokens, self.max),
        }
    }

    /// True when a balance is a full bucket, which is the same as no key.
    pub fn is_full(&self, tokens: f64) -> bool {
        tokens >= self.max
    }

    /// Absolute expiry in ms for a bucket written at `now_us` whose reply
    /// said `reset_after_ms`. Rounds `now` up so the key never expires before
    /// the bucket is really full.
    pub fn expire_at_ms(now_us: i64, reset_after_ms: i64) -> i64 {
        now_us
            .div_euclid(1000)
            .saturating_add(i64::from(now_us.rem_euclid(1000) != 0))
            .saturating_add(reset_after_ms)
    }
}

/// All-or-nothing charge of several buckets: `(limits, current, cost)` per
/// bucket. Returns whether all were admitted, the largest retry time, and
/// each bucket's outcome (charged only if all were admitted).
pub fn consume_all(buckets: &[(Limits, f64, f64)]) -> (bool, i64, Vec<Outcome>) {
    let all = buckets.iter().all(|(_, current, cost)| current >= cost);
    let outcomes: Vec<Outcome> = buckets
        .iter()
        .map(|(limits, current, cost)| {
            if all {
                limits.consume(*current, *cost)
            } else {
                limits.peek(*current, *cost)
            }
        })
        .collect();
    let retry = outcomes.iter().map(|o| o.retry_after_ms).max().unwrap_or(0);
    (all, retry, outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const L10: Limits = Limits {
        max: 10.0,
        rate: 1.0,
    };

    #[test]
    fn fresh_bucket_reply_matches_contract_example() {
        let o = L10.consume(L10.current(None, 5), 1.0);
        assert_eq!(o.reply(), [1, 9, 0, 1000]);
    }

    #[test]
    fn denied_call_reports_time_until_cost_passes() {
        let o = L10.consume(0.5, 2.0);
        assert_eq!(o.reply(), [0, 0, 1500, 9500]);
    }

    #[test]
    fn retry_is_corrected_where_the_closed_form_rounds_wrong() {
        let l = Limits {
            max: 10.0,
            rate: 0.3,
        };
        // ceil(1000 * 0.6 / 0.3) is 2001 in floats, yet 2000 ms already pass.
        assert_eq!(l.ms_until(1.4, 2.0), 2000);
        assert!(l.refill(1.4, 2000.0 * 1000.0) >= 2.0);
        // ceil gives 12000, where refill still falls short by one ulp.
        assert_eq!(l.ms_until(-3.1, 0.5), 12001);
        assert!(l.refill(-3.1, 12000.0 * 1000.0) < 0.5);
    }

    #[test]
    fn clock_step_back_mints_nothing() {
        let s = Stored {
            tokens: 3.0,
            ts_us: 10_000_000,
        };
        assert_eq!(L10.current(Some(s), 9_000_000), 3.0);
        assert_eq!(L10.current(Some(s), 11_500_000), 4.5);
        assert_eq!(L10.current(Some(s), 10_000_000_000), 10.0);
    }

    #[test]
    fn lowered_max_clamps_stored_tokens_both_ways() {
        let l = Limits {
            max: 5.0,
            rate: 1.0,
        };
        let full = Stored {
            tokens: 9.0,
            ts_us: 0,
        };
        let debt = Stored {
            tokens: -9.0,
            ts_us: 0,
        };
        assert_eq!(l.current(Some(full), 0), 5.0);
        assert_eq!(l.current(Some(debt), 0), -5.0);
    }

    #[test]
    fn hostile_timestamps_do_not_overflow() {
        let s = Stored {
            tokens: 1.0,
            ts_us: i64::MIN,
        };
        assert_eq!(L10.current(Some(s), i64::MAX), 10.0);
        let s = Stored {
            tokens: 1.0,
            ts_us: i64::MAX,
        };
        assert_eq!(L10.current(Some(s), i64::MIN), 1.0);
    }

    #[test]
    fn adjust_caps_refund_and_floors_debt() {
        assert_eq!(L10.adjust(8.0, 5.0).tokens, 10.0);
        let o = L10.adjust(2.0, -100.0);
        assert_eq!(o.tokens, -10.0);
        // From -10 a cost-1 request needs 11 tokens of refill at 1/s.
        assert_eq!(o.reply(), [1, -10, 11_000, 20_000]);
    }

    #[test]
    fn expire_rounds_now_up_to_the_next_millisecond() {
        assert_eq!(Limits::expire_at_ms(1_000_000, 5), 1_005);
        assert_eq!(Limits::expire_at_ms(1_000_001, 5), 1_006);
        assert_eq!(Limits::expire_at_ms(1_000_999, 0), 1_001);
    }

    #[test]
    fn all_or_nothing_charges_nobody_when_one_is_short() {
        let l1 = Limits {
            max: 5.0,
            rate: 1.0,
        };
        let l2 = Limits {
            max: 5.0,
            rate: 0.5,
        };
        let (all, retry, out) = consume_all(&[(l1, 5.0, 1.0), (l2, 0.0, 1.0)]);
        assert!(!all);
        assert_eq!(retry, 2000);
        assert_eq!(out[0].reply(), [1, 5, 0, 0]);
        assert_eq!(out[1].reply(), [0, 0, 2000, 10_000]);
        let (all, retry, out) = consume_all(&[(l1, 5.0, 1.0), (l2, 2.0, 1.0)]);
        assert!(all);
        assert_eq!(retry, 0);
        assert_eq!(out[0].tokens, 4.0);
        assert_eq!(out[1].tokens, 1.0);
    }
}
