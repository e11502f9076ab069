//! A quota's arithmetic: what a charge, a peek or an adjustment answers
//! and writes. Plain `f64`/`i64` maths, repeated operation for operation
//! by the Lua library (`lua/tb.lua`), so both agree bit for bit.

use super::calendar::{window, Period, Window};
use crate::bucket::floor_i64;
use crate::contract::MAX_WAIT_MS;

/// A validated quota: its budget per period and the calendar it keeps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Quota {
    pub limit: f64,
    pub period: Period,
    /// Seconds ahead of UTC (OFFSET's minutes times 60).
    pub offset_s: i64,
}

/// What a quota hash stores.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stored {
    pub used: f64,
    /// The first second of the period `used` belongs to.
    pub start: i64,
}

/// What a call does to its key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Effect {
    Nothing,
    /// `HSET key used <used> start <start>` and `PEXPIREAT key <ms>`: the
    /// key goes when its period ends.
    Save {
        used: f64,
        start: i64,
        expire_at_ms: i64,
    },
    /// Nothing is used any more: the key goes (no key is a whole budget).
    Delete,
}

/// A call's answer and write.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    pub allowed: bool,
    /// Used in the period after the call.
    pub used: f64,
    pub remaining: i64,
    pub retry_after_ms: i64,
    pub reset_after_ms: i64,
    pub effect: Effect,
}

impl Outcome {
    /// `[allowed, remaining, retry_after_ms, reset_after_ms]`, as buckets.
    pub fn reply(&self) -> [i64; 4] {
        [
            i64::from(self.allowed),
            self.remaining,
            self.retry_after_ms,
            self.reset_after_ms,
        ]
    }
}

/// Whole ms from `now_us` until the second `end` (at least 1 before it).
fn ms_until(end: i64, now_us: i64) -> i64 {
    let us = i128::from(end) * 1_000_000 - i128::from(now_us);
    let ms = (us + 999).div_euclid(1000);
    ms.clamp(0, i128::from(MAX_WAIT_MS)) as i64
}

impl Quota {
    /// Keeps what is used inside `[0, 2 limit]`: a refund gives back no
    /// more than was used, and debt goes no deeper than a bucket's (a
    /// balance of `-limit`). A lowered limit clamps it too.
    fn clamp(&self, used: f64) -> f64 {
        used.max(0.0).min(2.0 * self.limit)
    }

    /// What is used at `now_us`, and in which period. A key of an earlier
    /// period counts as nothing used (it expires as its period ends). A
    /// key of a later period than the clock's (the clock stepped back
    /// across a boundary, or a failover to a node whose clock is behind)
    /// keeps its use until that period ends, so a step back never resets
    /// a budget.
    pub fn current(&self, stored: Option<Stored>, now_us: i64) -> (f64, Window) {
        let now = window(self.period, self.offset_s, now_us.div_euclid(1_000_000));
        match stored {
            Some(s) => {
                let kept = window(self.period, self.offset_s, s.start);
                if kept.start >= now.start {
                    (self.clamp(s.used), kept)
                } else {
                    (0.0, now)
                }
            }
            None => (0.0, now),
        }
    }

    /// Charges `cost` (`charge` true) or only looks (a peek). A denial,
    /// a cost of 0 or a peek writes nothing.
    pub fn consume(&self, stored: Option<Stored>, now_us: i64, cost: f64, charge: bool) -> Outcome {
        let (used, w) = self.current(stored, now_us);
        let allowed = self.limit - used >= cost;
        let writes = charge && allowed && cost > 0.0;
        let used = if writes { used + cost } else { used };
        // Denied: the cost passes once the period ends (it is at most
        // limit, and a new period has used nothing).
        self.settle(stored, now_us, w, allowed, used, writes, !allowed)
    }

    /// A refund (`delta > 0`) or a charge after the fact (`delta < 0`),
    /// within `[0, 2 limit]` used, in the current period only. The retry
    /// is for a request of cost 1 (or `limit`, if smaller).
    pub fn adjust(&self, stored: Option<Stored>, now_us: i64, delta: f64) -> Outcome {
        let (used, w) = self.current(stored, now_us);
        let used = self.clamp(used - delta);
        let short = self.limit - used < self.limit.min(1.0);
        self.settle(stored, now_us, w, true, used, true, short)
    }

    #[allow(clippy::too_many_arguments)]
    fn settle(
        &self,
        stored: Option<Stored>,
        now_us: i64,
        w: Window,
        allowed: bool,
        used: f64,
        writes: bool,
        waits: bool,
    ) -> Outcome {
        let until_end = ms_until(w.end, now_us);
        let effect = match (writes, used > 0.0) {
            (false, _) => Effect::Nothing,
            (true, true) => Effect::Save {
                used,
                start: w.start,
                expire_at_ms: w.end.saturating_mul(1000),
            },
            (true, false) if stored.is_some() => Effect::Delete,
            (true, false) => Effect::Nothing,
        };
        Outcome {
            allowed,
            used,
            remaining: floor_i64(self.limit - used),
            retry_after_ms: if waits { until_end } else { 0 },
            reset_after_ms: if used > 0.0 { until_end } else { 0 },
            effect,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2030-01-01T00:00:00Z.
    const T: i64 = 1_893_456_000;
    const DAY: Quota = Quota {
        limit: 3.0,
        period: Period::Day,
        offset_s: 0,
    };

    fn at(used: f64, start: i64) -> Option<Stored> {
        Some(Stored { used, start })
    }

    #[test]
    fn a_charge_at_the_last_millisecond_belongs_to_the_old_day() {
        let now = T * 1_000_000 - 1000;
        let o = DAY.consume(at(3.0, T - 86_400), now, 1.0, true);
        assert_eq!(o.reply(), [0, 0, 1, 1]);
        assert_eq!(o.effect, Effect::Nothing);
        let o = DAY.consume(at(3.0, T - 86_400), T * 1_000_000, 1.0, true);
        assert_eq!(o.reply(), [1, 2, 0, 86_400_000]);
        assert_eq!(
            o.effect,
            Effect::Save {
                used: 1.0,
                start: T,
                expire_at_ms: (T + 86_400) * 1000
            }
        );
    }

    #[test]
    fn a_clock_stepped_back_keeps_the_later_period() {
        // Charged at 00:00:00.5, then the clock steps back 1 s.
        let o = DAY.consume(at(3.0, T), T * 1_000_000 - 500_000, 1.0, true);
        assert!(!o.allowed);
        assert_eq!(o.retry_after_ms, 86_400_500);
        assert_eq!(o.remaining, 0);
    }

    #[test]
    fn adjust_refunds_within_the_period_and_debt_stops_at_twice_the_limit() {
        let now = T * 1_000_000 + 5;
        let o = DAY.adjust(at(2.0, T), now, 5.0);
        assert_eq!(o.effect, Effect::Delete);
        assert_eq!(o.reply(), [1, 3, 0, 0]);
        let o = DAY.adjust(None, now, -100.0);
        assert_eq!(o.used, 6.0);
        assert_eq!(o.reply(), [1, -3, 86_400_000, 86_400_000]);
        // An earlier period's use is not refunded into this one: that key
        // is a whole budget, and goes.
        let o = DAY.adjust(at(3.0, T - 86_400), now, 1.0);
        assert_eq!((o.reply(), o.effect), ([1, 3, 0, 0], Effect::Delete));
    }

    #[test]
    fn a_peek_and_a_cost_of_zero_write_nothing() {
        let now = T * 1_000_000;
        assert_eq!(DAY.consume(None, now, 1.0, false).effect, Effect::Nothing);
        let o = DAY.consume(at(1.0, T), now, 0.0, true);
        assert_eq!(o.reply(), [1, 2, 0, 86_400_000]);
        assert_eq!(o.effect, Effect::Nothing);
    }
}
