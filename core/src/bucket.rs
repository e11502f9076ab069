//! Token-bucket arithmetic: refill, consume (one bucket, or several all or
//! nothing), peek and adjust, the reply times, and what a call writes.
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

/// One bucket's view after a command: the four integers of the reply, the
/// exact balance, and what the call changes in the keyspace.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    pub allowed: bool,
    /// Balance after the call (charged only when the call is admitted).
    pub tokens: f64,
    pub retry_after_ms: i64,
    pub reset_after_ms: i64,
    pub effect: Effect,
}

/// A charge against a missing bucket, but for its time (see
/// `Limits::fresh`): the same for every call of a tier on a new key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fresh {
    tokens: f64,
    /// The reply's `remaining`: the balance's floor.
    remaining: i64,
    reset_after_ms: i64,
}

impl Fresh {
    /// The reply of every call it stands for: admitted, its balance, no
    /// wait, its reset.
    pub fn reply(&self) -> [i64; 4] {
        [1, self.remaining, 0, self.reset_after_ms]
    }
}

/// The latest time `Limits::fresh_write` answers for itself: its probes
/// reach `MAX_WAIT_MS` ms beyond, well inside i64.
const FRESH_NOW_MAX: i64 = i64::MAX / 2;

/// What a call does to its key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Effect {
    /// Nothing is written: a denial, cost 0, a peek, or a full bucket whose
    /// key is already absent.
    Nothing,
    /// `HSET key tokens <tokens> ts <ts_us>` and `PEXPIREAT key <expire_at_ms>`.
    Save {
        tokens: f64,
        ts_us: i64,
        expire_at_ms: i64,
    },
    /// The bucket is full again: the key goes (no key is a full bucket).
    Delete,
}

impl Outcome {
    /// `remaining` in the reply: floor of the balance. May be negative in debt.
    pub fn remaining(&self) -> i64 {
        floor_i64(self.tokens)
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

// `ms_until` reports at most MAX_WAIT_MS (the contract): valid limits
// never need it (the fill time is at most 2e13 ms from `-max`, and a
// 16-digit `ts` lies at most 1e13 ms ahead); it only bounds the search.
pub use crate::contract::MAX_WAIT_MS;

impl Limits {
    /// Adds `elapsed_us` of refill to `tokens`, capped at `max`.
    pub fn refill(&self, tokens: f64, elapsed_us: f64) -> f64 {
        below(tokens + elapsed_us / 1_000_000.0 * self.rate, self.max)
    }

    /// Keeps a balance inside [-max, max]: a lowered `max` clamps stored
    /// tokens, and debt never goes below `-max`.
    pub fn clamp(&self, tokens: f64) -> f64 {
        below(above(tokens, -self.max), self.max)
    }

    /// The balance at `now_us` of a bucket stored as `stored`: the one
    /// function every call evaluates. A missing bucket is full. A `ts`
    /// ahead of `now_us` (the clock stepped back, or a failover to a node
    /// whose clock is behind) counts as no time elapsed, so it never mints
    /// tokens: the bucket refills nothing until the clock reaches `ts`.
    pub fn current(&self, stored: Option<Stored>, now_us: i64) -> f64 {
        match stored {
            None => self.max,
            Some(s) => self.refill(
                self.clamp(s.tokens),
                above(elapsed_us(now_us, s.ts_us), 0.0),
            ),
        }
    }

    /// Whole milliseconds from `now_us` until a call on `stored`, with no
    /// other traffic in between, sees at least `target`: the smallest `m`
    /// with `current(stored, now_us + 1000 m) >= target`, 0 if it already
    /// does. It includes the wait until a future `ts`.
    ///
    /// The search runs on `current` itself, the function the next call
    /// evaluates in one step, so no rounding can make the answer early or
    /// late: a closed form gives the first guess, and `current` being
    /// monotone in time lets a galloping search correct it (two
    /// evaluations when the guess is right or one off).
    pub fn ms_until(&self, stored: Option<Stored>, now_us: i64, target: f64) -> i64 {
        self.ms_from(stored, now_us, self.current(stored, now_us), target)
    }

    /// `ms_until` for a caller that already knows `current(stored, now_us)`.
    fn ms_from(&self, stored: Option<Stored>, now_us: i64, current: f64, target: f64) -> i64 {
        if current >= target {
            return 0;
        }
        let passes = |ms: i64| {
            self.current(stored, now_us.saturating_add(ms.saturating_mul(1000))) >= target
        };
        // A missing bucket is full, and every target is at most `max`.
        let Some(s) = stored else { return 0 };
        // The refill counts from `ts`, whether that is ahead of now (a wait
        // first) or behind it (some of the refill has already happened).
        let from_ts_us = -elapsed_us(now_us, s.ts_us);
        let refill_us = (target - self.clamp(s.tokens)) / self.rate * 1_000_000.0;
        let guess = ceil_i64((from_ts_us + refill_us) / 1000.0).clamp(1, MAX_WAIT_MS);
        first_passing(guess, passes)
    }

    /// Outcome of charging `cost` at `now_us` against the bucket `stored`.
    #[inline(always)]
    pub fn consume(&self, stored: Option<Stored>, now_us: i64, cost: f64) -> Outcome {
        self.charge(stored, now_us, self.current(stored, now_us), cost, true)
    }

    /// A reservation (`WAIT max_ms`): `consume`, but when the bucket is
    /// short of `cost` and its refill would cover the charge within
    /// `max_ms`, the call is admitted now, the charge goes into debt (no
    /// deeper than `-max`, the floor of every balance), and
    /// `retry_after_ms` is the wait before the caller may proceed: the time
    /// until the balance the call leaves is back at 0. Each reservation
    /// waits for the tokens of those before it, so callers are paced at the
    /// rate, in arrival order. Past `max_ms`, or past the floor, it is the
    /// denial `consume` gives. `charge` false: a peek, which says whether
    /// the reservation would be admitted and its wait, the balance as it
    /// stands (as `peek` does), and writes nothing.
    pub fn reserve(
        &self,
        stored: Option<Stored>,
        now_us: i64,
        cost: f64,
        max_ms: i64,
        charge: bool,
    ) -> Outcome {
        let current = self.current(stored, now_us);
        let tokens = current - cost;
        if current < cost && tokens >= -self.max {
            // The write's outcome: its retry is the wait (to a balance of 0).
            let reserved = self.settle(stored, now_us, true, tokens, true, Some(0.0));
            if reserved.retry_after_ms <= max_ms {
                if charge {
                    return reserved;
                }
                // A peek: admitted, its wait, and the bucket as it stands.
                return Outcome {
                    retry_after_ms: reserved.retry_after_ms,
                    ..self.settle(stored, now_us, true, current, false, None)
                };
            }
        }
        self.charge(stored, now_us, current, cost, charge)
    }

    /// A charge of `cost` against a missing bucket, worked out by
    /// `consume` itself, for `fresh_write`: `None` where that writes
    /// nothing (cost 0).
    pub fn fresh(&self, cost: f64) -> Option<Fresh> {
        let outcome = self.consume(None, 0, cost);
        match outcome.effect {
            Effect::Save { tokens, .. } => Some(Fresh {
                tokens,
                remaining: outcome.remaining(),
                reset_after_ms: outcome.reset_after_ms,
            }),
            _ => None,
        }
    }

    /// The write of `consume(None, now_us, cost)` for the `cost` that gave
    /// `fresh`, whose reply is `fresh.reply()`, without its search. A
    /// missing bucket is full, so the charge always passes and leaves the
    /// same balance; the reset is the refill from that write, which counts
    /// from `now_us`, so it is the same at every time whose probes (at
    /// most `MAX_WAIT_MS` ahead) stay within i64 (a test checks); `None`
    /// past those, where `consume` answers.
    #[inline(always)]
    pub fn fresh_write(fresh: Fresh, now_us: i64) -> Option<Effect> {
        (0..=FRESH_NOW_MAX).contains(&now_us).then(|| Effect::Save {
            tokens: fresh.tokens,
            ts_us: now_us,
            expire_at_ms: Self::expire_at_ms(now_us, fresh.reset_after_ms),
        })
    }

    /// What `consume` would answer, without charging.
    pub fn peek(&self, stored: Option<Stored>, now_us: i64, cost: f64) -> Outcome {
        self.charge(stored, now_us, self.current(stored, now_us), cost, false)
    }

    /// Applies a refund (`delta > 0`) or an after-the-fact charge
    /// (`delta < 0`). Always applies; the balance stays in [-max, max].
    /// `retry_after_ms` is for a request of cost 1 (or `max`, if smaller,
    /// since a cost above `max` never passes).
    pub fn adjust(&self, stored: Option<Stored>, now_us: i64, delta: f64) -> Outcome {
        let tokens = self.clamp(self.current(stored, now_us) + delta);
        self.settle(stored, now_us, true, tokens, true, Some(self.max.min(1.0)))
    }

    /// A consume (`charge` true) or a peek of `cost` against `current`,
    /// the balance of `stored` at `now_us`.
    fn charge(
        &self,
        stored: Option<Stored>,
        now_us: i64,
        current: f64,
        cost: f64,
        charge: bool,
    ) -> Outcome {
        let allowed = current >= cost;
        // A charge of 0 writes nothing: the bucket stays as stored.
        let writes = charge && allowed && cost > 0.0;
        let tokens = if writes { current - cost } else { current };
        // Admitted: retry 0. Denied: the wait until `cost` passes.
        let retry_for = (!allowed).then_some(cost);
        self.settle(stored, now_us, allowed, tokens, writes, retry_for)
    }

    /// The outcome of a call that leaves `tokens` (written at `now_us` if
    /// `writes`, else the bucket stays as `stored`); `retry_for` is the
    /// amount the retry time waits for (none: 0). Both times are
    /// measured on the state the call leaves, which is what the next call
    /// reads: an admitted write restarts the refill from `now_us`, a call
    /// that writes nothing leaves any wait until a future `ts` in place.
    #[inline(always)]
    fn settle(
        &self,
        stored: Option<Stored>,
        now_us: i64,
        allowed: bool,
        tokens: f64,
        writes: bool,
        retry_for: Option<f64>,
    ) -> Outcome {
        let after = match (writes, self.is_full(tokens)) {
            (false, _) => stored,
            (true, true) => None,
            (true, false) => Some(Stored {
                tokens,
                ts_us: now_us,
            }),
        };
        // `tokens` is the balance `after` holds at `now_us`: the call's
        // current balance if it wrote nothing, else what it just wrote.
        let retry_after_ms =
            retry_for.map_or(0, |target| self.ms_from(after, now_us, tokens, target));
        let reset_after_ms = self.ms_from(after, now_us, tokens, self.max);
        let effect = match (writes, after) {
            (false, _) => Effect::Nothing,
            (true, Some(s)) => Effect::Save {
                tokens: s.tokens,
                ts_us: now_us,
                expire_at_ms: Self::expire_at_ms(now_us, reset_after_ms),
            },
            (true, None) if stored.is_some() => Effect::Delete,
            (true, None) => Effect::Nothing,
        };
        Outcome {
            allowed,
            tokens,
            retry_after_ms,
            reset_after_ms,
            effect,
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

/// `x.min(limit)` for a `limit` that is a number (every `max` is): a NaN
/// `x` gives `limit`, as `f64::min` does, in one comparison rather than
/// `min`'s NaN handling on both sides.
#[inline(always)]
fn below(x: f64, limit: f64) -> f64 {
    if x < limit {
        x
    } else {
        limit
    }
}

/// `x.max(limit)` for a `limit` that is a number, as `below`.
#[inline(always)]
fn above(x: f64, limit: f64) -> f64 {
    if x > limit {
        x
    } else {
        limit
    }
}

/// `x.floor() as i64` (saturating, NaN to 0) without a call to libm's
/// floor, which baseline x86-64 has no instruction for: the conversion
/// truncates toward zero, one step down fixes a negative fraction.
pub fn floor_i64(x: f64) -> i64 {
    let t = x as i64;
    if (t as f64) > x && t != i64::MIN {
        t - 1
    } else {
        t
    }
}

/// `x.ceil() as i64` (saturating, NaN to 0), as `floor_i64`.
fn ceil_i64(x: f64) -> i64 {
    let t = x as i64;
    if (t as f64) < x && t != i64::MAX {
        t + 1
    } else {
        t
    }
}

/// `now_us - ts_us` as a float: in i64 where it fits (one instruction to
/// convert), else in i128, since a hostile `ts` can overflow i64. Both
/// round the exact difference once.
fn elapsed_us(now_us: i64, ts_us: i64) -> f64 {
    match now_us.checked_sub(ts_us) {
        Some(d) => d as f64,
        None => (i128::from(now_us) - i128::from(ts_us)) as f64,
    }
}

/// The smallest `m >= 1` with `passes(m)`, for a `passes` that is monotone
/// (false, then true forever) and false at 0, starting from `guess`:
/// gallop away from the guess until the answer is bracketed, then bisect.
/// Gives up at `MAX_WAIT_MS`.
fn first_passing(guess: i64, passes: impl Fn(i64) -> bool) -> i64 {
    // Invariant once bracketed: !passes(lo) and passes(hi).
    let (mut lo, mut hi);
    let mut step = 1i64;
    if passes(guess) {
        hi = guess;
        lo = guess - 1;
        while lo > 0 && passes(lo) {
            hi = lo;
            step = step.saturating_mul(2);
            lo = hi.saturating_sub(step).max(0);
        }
    } else {
        lo = guess;
        hi = guess.saturating_add(1);
        while !passes(hi) {
            if hi >= MAX_WAIT_MS {
                return MAX_WAIT_MS;
            }
            lo = hi;
            step = step.saturating_mul(2);
            hi = lo.saturating_add(step).min(MAX_WAIT_MS);
        }
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if passes(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// All-or-nothing charge of several buckets at `now_us`: `(limits, stored,
/// cost)` per bucket. Returns whether all were admitted, the largest retry
/// time, and each bucket's outcome (charged only if all were admitted).
pub fn consume_all(
    buckets: &[(Limits, Option<Stored>, f64)],
    now_us: i64,
) -> (bool, i64, Vec<Outcome>) {
    consume_all_if(buckets, now_us, true)
}

/// `consume_all` as part of a larger decision: the buckets are charged only
/// if they all could pay and `rest_admits` (TB.ACQUIRE's lease fits).
/// Returns whether the buckets alone could all pay.
pub fn consume_all_if(
    buckets: &[(Limits, Option<Stored>, f64)],
    now_us: i64,
    rest_admits: bool,
) -> (bool, i64, Vec<Outcome>) {
    let currents: Vec<f64> = buckets
        .iter()
        .map(|(limits, stored, _)| limits.current(*stored, now_us))
        .collect();
    let all = buckets
        .iter()
        .zip(&currents)
        .all(|((_, _, cost), current)| current >= cost);
    let outcomes: Vec<Outcome> = buckets
        .iter()
        .zip(&currents)
        .map(|((limits, stored, cost), current)| {
            limits.charge(*stored, now_us, *current, *cost, all && rest_admits)
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
    const NOW: i64 = 1_893_456_000_000_000;

    fn at(tokens: f64, ts_us: i64) -> Option<Stored> {
        Some(Stored { tokens, ts_us })
    }

    /// The write of a balance at `NOW`, expiring `reset_ms` later.
    fn saved_now(tokens: f64, reset_ms: i64) -> Effect {
        Effect::Save {
            tokens,
            ts_us: NOW,
            expire_at_ms: NOW / 1000 + reset_ms,
        }
    }

    #[test]
    fn fresh_bucket_reply_matches_contract_example() {
        let o = L10.consume(None, NOW, 1.0);
        assert_eq!(o.reply(), [1, 9, 0, 1000]);
        assert_eq!(o.effect, saved_now(9.0, 1000));
    }

    #[test]
    fn denied_call_reports_time_until_cost_passes() {
        let o = L10.consume(at(0.5, NOW), NOW, 2.0);
        assert_eq!(o.reply(), [0, 0, 1500, 9500]);
        assert_eq!(o.effect, Effect::Nothing);
    }

    #[test]
    fn times_are_found_on_the_refill_the_next_call_evaluates() {
        let l = Limits {
            max: 10.0,
            rate: 0.3,
        };
        // ceil(1000 * 0.6 / 0.3) is 2001 in floats, yet 2000 ms already pass.
        assert_eq!(l.ms_until(at(1.4, NOW), NOW, 2.0), 2000);
        assert!(l.current(at(1.4, NOW), NOW + 2_000_000) >= 2.0);
        // ceil gives 12000, where the refill still falls short by one ulp.
        assert_eq!(l.ms_until(at(-3.1, NOW), NOW, 0.5), 12001);
        assert!(l.current(at(-3.1, NOW), NOW + 12_000_000) < 0.5);
    }

    #[test]
    fn retry_is_measured_from_the_stored_state_not_the_balance_now() {
        // A bucket in debt (-0.453) written `e` us ago: refilling it for
        // `e` and then for m ms in two steps rounds differently from the
        // one step the next call takes, so only the latter is the truth.
        let l = Limits {
            max: 1.0,
            rate: 0.1,
        };
        let mut misleading = 0;
        for e in 0..20_000i64 {
            let stored = at(-0.453, NOW - e);
            let o = l.consume(stored, NOW, 0.5);
            assert!(!o.allowed);
            let m = o.retry_after_ms;
            assert!(l.consume(stored, NOW + 1000 * m, 0.5).allowed, "e {e}");
            assert!(
                !l.consume(stored, NOW + 1000 * (m - 1), 0.5).allowed,
                "e {e}"
            );
            // Two-step times: refill the balance now, then refill that
            // for m ms (two roundings).
            let current = l.current(stored, NOW);
            let two_steps = |m: i64| l.refill(current, m as f64 * 1_000_000.0 / 1000.0) >= 0.5;
            if two_steps(m) != l.consume(stored, NOW + 1000 * m, 0.5).allowed
                || two_steps(m - 1) != l.consume(stored, NOW + 1000 * (m - 1), 0.5).allowed
            {
                misleading += 1;
            }
        }
        // Two-step times would be wrong for some of these states.
        assert!(misleading > 0);
    }

    #[test]
    fn a_future_ts_is_waited_for_in_both_times() {
        // The clock stepped back 60 s: nothing refills until ts.
        let stored = at(0.0, NOW + 60_000_000);
        let o = L10.consume(stored, NOW, 1.0);
        assert_eq!(o.reply(), [0, 0, 61_000, 70_000]);
        let p = L10.peek(stored, NOW, 1.0);
        assert_eq!(p.reply(), [0, 0, 61_000, 70_000]);
        // Still frozen 1 ms before the retry time, and passing at it.
        assert!(!L10.consume(stored, NOW + 60_999_000, 1.0).allowed);
        assert!(L10.consume(stored, NOW + 61_000_000, 1.0).allowed);
    }

    #[test]
    fn an_admitted_write_under_a_future_ts_restarts_the_refill_now() {
        let stored = at(5.0, NOW + 60_000_000);
        let o = L10.consume(stored, NOW, 1.0);
        assert_eq!(o.reply(), [1, 4, 0, 6000]);
        assert_eq!(o.effect, saved_now(4.0, 6000));
        // A cost-0 call writes nothing, so its reset still waits for ts.
        assert_eq!(L10.consume(stored, NOW, 0.0).reply(), [1, 5, 0, 65_000]);
        // TB.ADJUST writes the bucket it changes, so its times start now.
        assert_eq!(L10.adjust(stored, NOW, -5.0).reply(), [1, 0, 1000, 10_000]);
    }

    #[test]
    fn reservations_queue_at_the_rate_down_to_the_floor() {
        // Empty, 1 token/s: each reservation waits for those before it.
        let mut stored = at(0.0, NOW);
        for k in 1..=10 {
            let o = L10.reserve(stored, NOW, 1.0, 60_000, true);
            assert_eq!(o.reply(), [1, -k, 1000 * k, 1000 * (10 + k)], "{k}");
            stored = match o.effect {
                Effect::Save { tokens, ts_us, .. } => Some(Stored { tokens, ts_us }),
                other => panic!("{other:?}"),
            };
        }
        // At -max the floor denies, as a plain call would, writing nothing.
        let o = L10.reserve(stored, NOW, 1.0, 60_000, true);
        assert_eq!(o.reply(), L10.consume(stored, NOW, 1.0).reply());
        assert_eq!(o.effect, Effect::Nothing);
        // A wait beyond max_ms is a denial too; a peek answers alike.
        let short = at(0.0, NOW);
        assert!(!L10.reserve(short, NOW, 3.0, 2_999, true).allowed);
        let peek = L10.reserve(short, NOW, 3.0, 3_000, false);
        assert_eq!(peek.reply(), [1, 0, 3000, 10_000]);
        assert_eq!(peek.effect, Effect::Nothing);
        // A bucket that has the tokens charges them as consume does.
        assert_eq!(
            L10.reserve(None, NOW, 1.0, 0, true),
            L10.consume(None, NOW, 1.0)
        );
    }

    #[test]
    fn clock_step_back_mints_nothing() {
        let s = at(3.0, 10_000_000);
        assert_eq!(L10.current(s, 9_000_000), 3.0);
        assert_eq!(L10.current(s, 11_500_000), 4.5);
        assert_eq!(L10.current(s, 10_000_000_000), 10.0);
    }

    #[test]
    fn lowered_max_clamps_stored_tokens_both_ways() {
        let l = Limits {
            max: 5.0,
            rate: 1.0,
        };
        assert_eq!(l.current(at(9.0, 0), 0), 5.0);
        assert_eq!(l.current(at(-9.0, 0), 0), -5.0);
    }

    #[test]
    fn hostile_timestamps_do_not_overflow() {
        assert_eq!(L10.current(at(1.0, i64::MIN), i64::MAX), 10.0);
        assert_eq!(L10.current(at(1.0, i64::MAX), i64::MIN), 1.0);
        // A ts beyond any wait: the search stops at its bound.
        assert_eq!(L10.ms_until(at(1.0, i64::MAX), 0, 2.0), MAX_WAIT_MS);
        let far = at(0.0, 9_999_999_999_999_999);
        let o = L10.peek(far, NOW, 1.0);
        // The wait until ts, rounded up to a whole ms, then one second.
        assert_eq!(
            o.retry_after_ms,
            (9_999_999_999_999_999 - NOW + 999) / 1000 + 1000
        );
    }

    #[test]
    fn adjust_caps_refund_and_floors_debt() {
        assert_eq!(L10.adjust(at(8.0, NOW), NOW, 5.0).tokens, 10.0);
        assert_eq!(L10.adjust(at(8.0, NOW), NOW, 5.0).effect, Effect::Delete);
        assert_eq!(L10.adjust(None, NOW, 5.0).effect, Effect::Nothing);
        let o = L10.adjust(at(2.0, NOW), NOW, -100.0);
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
        let (all, retry, out) = consume_all(&[(l1, None, 1.0), (l2, at(0.0, NOW), 1.0)], NOW);
        assert!(!all);
        assert_eq!(retry, 2000);
        assert_eq!(out[0].reply(), [1, 5, 0, 0]);
        assert_eq!(out[1].reply(), [0, 0, 2000, 10_000]);
        assert!(out.iter().all(|o| o.effect == Effect::Nothing));
        let (all, retry, out) = consume_all(&[(l1, None, 1.0), (l2, at(2.0, NOW), 1.0)], NOW);
        assert!(all);
        assert_eq!(retry, 0);
        assert_eq!(out[0].tokens, 4.0);
        assert_eq!(out[1].tokens, 1.0);
    }

    #[test]
    fn integer_floor_and_ceil_are_the_float_ones() {
        let mut values = vec![
            0.0,
            -0.0,
            0.5,
            -0.5,
            1.0,
            -1.0,
            1.5,
            -1.5,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MAX,
            f64::MIN,
            f64::MIN_POSITIVE,
            -f64::MIN_POSITIVE,
            9_223_372_036_854_775_807.0,
            -9_223_372_036_854_775_808.0,
            -9_223_372_036_854_777_856.0,
            4_503_599_627_370_496.5,
            -4_503_599_627_370_496.5,
        ];
        let mut rng = testkit::Rng(0xC0FF_EE00_1234_5678);
        for _ in 0..200_000 {
            let x = rng.next();
            values.push(f64::from_bits(x));
            values.push((x % 2_000_000) as f64 / 1000.0 - 1000.0);
            values.push(((x >> 12) as f64 - 2f64.powi(51)) / 2f64.powi((x % 60) as i32));
        }
        for x in values {
            assert_eq!(floor_i64(x), x.floor() as i64, "{x:?}");
            assert_eq!(ceil_i64(x), x.ceil() as i64, "{x:?}");
        }
    }

    #[test]
    fn below_and_above_are_min_and_max_for_a_number_limit() {
        let mut xs = vec![
            f64::NAN,
            -f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            0.0,
            -0.0,
            5e-324,
            -5e-324,
            f64::MIN_POSITIVE,
            f64::MAX,
            f64::MIN,
            1.0,
            -1.0,
            1e12,
            -1e12,
        ];
        let mut rng = testkit::Rng(0x1F12_3BB5_159A_55E5);
        for _ in 0..10_000 {
            let x = f64::from_bits(rng.next());
            xs.extend([x, x.next_up(), x.next_down()]);
        }
        let limits = [1e-9, 0.001, 1.0, 999_999.0, 1e12, -1e-9, -1.0, -1e12, 0.0];
        for &limit in &limits {
            for &x in xs.iter().chain(&limits) {
                // Zeros of both signs compare equal; either is min and max.
                if x == 0.0 && limit == 0.0 {
                    continue;
                }
                assert_eq!(
                    below(x, limit).to_bits(),
                    x.min(limit).to_bits(),
                    "{x:?} {limit:?}"
                );
                assert_eq!(
                    above(x, limit).to_bits(),
                    x.max(limit).to_bits(),
                    "{x:?} {limit:?}"
                );
            }
        }
    }

    #[test]
    fn a_fresh_charge_is_what_consume_answers_a_missing_bucket() {
        // Tiers of every scale, costs from the smallest to max, and times
        // from 0 through the clock's range to past FRESH_NOW_MAX.
        let mut rng = testkit::Rng(0x6A09_E667_F3BC_C909);
        let mut tiers = vec![
            (1.0, 1.0, 1.0),
            (10.0, 0.5, 3.0),
            (1e12, 1e12, 1e12),
            (1e12, 100.0, 0.001),
        ];
        for _ in 0..2_000 {
            let max = 10f64.powf(rng.below(2_400) as f64 / 100.0 - 12.0).max(1e-6);
            let rate = max / 10f64.powf(rng.below(1_000) as f64 / 100.0);
            let cost = match rng.below(4) {
                0 => max,
                1 => 1.0_f64.min(max),
                2 => 0.0,
                _ => max * rng.below(1_000_000) as f64 / 1e6,
            };
            tiers.push((max, rate, cost));
        }
        let times = [
            0,
            1,
            999,
            1_764_513_600_123_456,
            1 << 52,
            FRESH_NOW_MAX,
            FRESH_NOW_MAX + 1,
            i64::MAX,
        ];
        for (max, rate, cost) in tiers {
            let limits = Limits { max, rate };
            let fresh = limits.fresh(cost);
            for now in times
                .into_iter()
                .chain((0..5).map(|_| rng.below(1 << 53) as i64))
            {
                let want = limits.consume(None, now, cost);
                let at = format!("{max} {rate} {cost} {now}");
                match (fresh, fresh.and_then(|f| Limits::fresh_write(f, now))) {
                    (Some(f), Some(effect)) => {
                        assert_eq!(effect, want.effect, "{at}");
                        assert_eq!(f.reply(), want.reply(), "{at}");
                    }
                    // Past FRESH_NOW_MAX: consume answers.
                    (Some(_), None) => assert!(now > FRESH_NOW_MAX, "{at}"),
                    (None, _) => assert_eq!(want.effect, Effect::Nothing, "{at}"),
                }
            }
        }
    }

    #[test]
    fn first_passing_finds_the_boundary_from_any_guess() {
        for answer in [1i64, 2, 3, 17, 1000, 123_456_789] {
            for guess in [1i64, 2, answer - 1, answer, answer + 1, 5 * answer, 1 << 40] {
                let guess = guess.max(1);
                assert_eq!(first_passing(guess, |m| m >= answer), answer, "{guess}");
            }
        }
    }
}
