//! Properties of the bucket arithmetic over random schedules of calls and
//! random stored states.

use proptest::prelude::*;
use tb_core::bucket::{Limits, Stored};
use testkit::oracles::after;

fn limits() -> impl Strategy<Value = Limits> {
    (0.01f64..1e6, 0.001f64..1e5)
        .prop_filter("fill time bound", |(max, rate)| max / rate <= 1e10)
        .prop_map(|(max, rate)| Limits { max, rate })
}

const T0: i64 = 1_700_000_000_000_000;

/// Replays `steps` (µs since the previous call, cost as a fraction of max)
/// through consume → store, as the module does.
fn replay(l: Limits, steps: &[(u64, f64)]) -> (f64, i64, Vec<(f64, f64)>) {
    let mut stored: Option<Stored> = None;
    let mut now: i64 = T0;
    let mut admitted = 0.0;
    let mut balances = Vec::new();
    for &(dt, frac) in steps {
        now += dt as i64;
        let cost = l.max * frac;
        let current = l.current(stored, now);
        let out = l.consume(stored, now, cost);
        if out.allowed {
            admitted += cost;
        }
        stored = after(stored, out.effect);
        balances.push((current, out.tokens));
    }
    (admitted, now - T0, balances)
}

/// A stored state: a balance in [-max, max] and a `ts` up to `skew_us`
/// either side of `now` (ahead of it after a clock step back).
fn stored_state(l: Limits, frac: f64, skew: f64, skew_us: i64, now: i64) -> Stored {
    Stored {
        tokens: l.max * frac,
        ts_us: now + (skew * skew_us as f64) as i64,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(5000))]

    #[test]
    fn tokens_stay_within_zero_and_max(
        l in limits(),
        steps in prop::collection::vec((0u64..5_000_000, 0.0f64..=1.0), 1..200),
    ) {
        let (_, _, balances) = replay(l, &steps);
        for (before, after) in balances {
            prop_assert!((0.0..=l.max).contains(&before), "{before} outside [0, {}]", l.max);
            prop_assert!((0.0..=l.max).contains(&after), "{after} outside [0, {}]", l.max);
        }
    }

    #[test]
    fn admitted_cost_never_exceeds_burst_plus_refill(
        l in limits(),
        steps in prop::collection::vec((0u64..2_000_000, 0.0f64..=1.0), 1..300),
    ) {
        let (admitted, elapsed_us, _) = replay(l, &steps);
        let budget = l.max + l.rate * elapsed_us as f64 / 1e6;
        // A relative epsilon for the float sums of many costs.
        prop_assert!(admitted <= budget * (1.0 + 1e-9), "{admitted} > {budget}");
    }

    /// The contract of the hints, over stored states (ts behind or ahead
    /// of now, balances in debt or not): with no other traffic, the same
    /// call passes at `now + retry_after_ms` and not a millisecond before,
    /// and the bucket is full at `now + reset_after_ms` and not before.
    #[test]
    fn retry_and_reset_are_the_earliest_passing_millisecond(
        l in limits(),
        frac in -1.0f64..=1.0,
        cost_frac in 0.0f64..=1.0,
        skew in -1.0f64..=1.0,
        skew_us in prop::sample::select(vec![0i64, 999, 1_000_000, 60_000_000, 3_600_000_000]),
        sub_ms in 0i64..1000,
        peek in prop::bool::ANY,
    ) {
        let now = T0 + sub_ms;
        let stored = Some(stored_state(l, frac, skew, skew_us, now));
        let cost = l.max * cost_frac;
        let o = if peek { l.peek(stored, now, cost) } else { l.consume(stored, now, cost) };
        let left = after(stored, o.effect);
        let at = |ms: i64| now + ms * 1000;
        if o.allowed && !peek {
            prop_assert_eq!(o.retry_after_ms, 0);
        } else {
            let ms = o.retry_after_ms;
            prop_assert!(l.consume(left, at(ms), cost).allowed, "passes at retry");
            if ms > 0 {
                prop_assert!(!l.consume(left, at(ms - 1), cost).allowed, "not a ms earlier");
            }
        }
        let reset = o.reset_after_ms;
        prop_assert!(l.is_full(l.current(left, at(reset))), "full at reset");
        if reset > 0 {
            prop_assert!(!l.is_full(l.current(left, at(reset - 1))), "not full a ms earlier");
        }
        prop_assert!(o.retry_after_ms <= reset);
    }

    #[test]
    fn adjust_times_hold_for_the_state_it_writes(
        l in limits(),
        frac in -1.0f64..=1.0,
        skew in -1.0f64..=1.0,
        delta_frac in -2.0f64..=2.0,
    ) {
        let stored = Some(stored_state(l, frac, skew, 60_000_000, T0));
        let o = l.adjust(stored, T0, l.max * delta_frac);
        let left = after(stored, o.effect);
        let target = l.max.min(1.0);
        let ms = o.retry_after_ms;
        prop_assert!(l.current(left, T0 + ms * 1000) >= target);
        if ms > 0 {
            prop_assert!(l.current(left, T0 + (ms - 1) * 1000) < target);
        }
    }

    #[test]
    fn clock_going_backwards_never_mints(
        l in limits(),
        frac in 0.0f64..=1.0,
        back in 0i64..10_000_000_000,
    ) {
        let s = Stored { tokens: l.max * frac, ts_us: T0 };
        prop_assert_eq!(l.current(Some(s), s.ts_us - back), s.tokens);
    }

    #[test]
    fn adjust_stays_within_minus_max_and_max(
        l in limits(),
        frac in -1.0f64..=1.0,
        delta in -1e13f64..1e13,
    ) {
        let stored = Some(Stored { tokens: l.max * frac, ts_us: T0 });
        let out = l.adjust(stored, T0, delta);
        prop_assert!(out.tokens >= -l.max && out.tokens <= l.max);
        prop_assert!(out.allowed);
        // The debt bound: from the floor a cost-1 request waits at most
        // (max + min(1, max)) / rate, i.e. under 2 * max / rate.
        prop_assert!(out.retry_after_ms as f64 <= 2000.0 * l.max / l.rate + 1.0);
    }
}
