//! Properties of the bucket arithmetic over random schedules of calls.

use proptest::prelude::*;
use tb_core::bucket::{Limits, Stored};

fn limits() -> impl Strategy<Value = Limits> {
    (0.01f64..1e6, 0.001f64..1e5)
        .prop_filter("fill time bound", |(max, rate)| max / rate <= 1e10)
        .prop_map(|(max, rate)| Limits { max, rate })
}

/// Replays `steps` (µs since the previous call, cost as a fraction of max)
/// through current → consume → store, as the module does.
fn replay(l: Limits, steps: &[(u64, f64)]) -> (f64, i64, Vec<(f64, f64)>) {
    let mut stored: Option<Stored> = None;
    let mut now: i64 = 1_700_000_000_000_000;
    let mut admitted = 0.0;
    let mut balances = Vec::new();
    for &(dt, frac) in steps {
        now += dt as i64;
        let cost = l.max * frac;
        let current = l.current(stored, now);
        let out = l.consume(current, cost);
        if out.allowed {
            admitted += cost;
            if cost > 0.0 {
                stored = (!l.is_full(out.tokens)).then_some(Stored {
                    tokens: out.tokens,
                    ts_us: now,
                });
            }
        }
        balances.push((current, out.tokens));
    }
    (admitted, now - 1_700_000_000_000_000, balances)
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

    #[test]
    fn retry_after_is_the_earliest_passing_millisecond(
        l in limits(),
        deficit_frac in 0.0f64..=1.0,
        cost_frac in 0.0f64..=1.0,
        debt in prop::bool::ANY,
    ) {
        // Any balance in [-max, max] (debt included) and any legal cost.
        let tokens = if debt { -l.max * deficit_frac } else { l.max * deficit_frac };
        let cost = l.max * cost_frac;
        let out = l.consume(tokens, cost);
        if out.allowed {
            prop_assert_eq!(out.retry_after_ms, 0);
        } else {
            let ms = out.retry_after_ms;
            prop_assert!(ms >= 1);
            prop_assert!(l.refill(tokens, ms as f64 * 1000.0) >= cost, "passes at retry");
            prop_assert!(l.refill(tokens, (ms - 1) as f64 * 1000.0) < cost, "not a ms earlier");
        }
        let reset = out.reset_after_ms;
        prop_assert!(l.refill(out.tokens, reset as f64 * 1000.0) >= l.max);
        if reset > 0 {
            prop_assert!(l.refill(out.tokens, (reset - 1) as f64 * 1000.0) < l.max);
        }
    }

    #[test]
    fn clock_going_backwards_never_mints(
        l in limits(),
        frac in 0.0f64..=1.0,
        back in 0i64..10_000_000_000,
    ) {
        let s = Stored { tokens: l.max * frac, ts_us: 1_700_000_000_000_000 };
        prop_assert_eq!(l.current(Some(s), s.ts_us - back), s.tokens);
    }

    #[test]
    fn adjust_stays_within_minus_max_and_max(
        l in limits(),
        frac in -1.0f64..=1.0,
        delta in -1e13f64..1e13,
    ) {
        let out = l.adjust(l.max * frac, delta);
        prop_assert!(out.tokens >= -l.max && out.tokens <= l.max);
        prop_assert!(out.allowed);
        // The debt bound: from the floor a cost-1 request waits at most
        // (max + min(1, max)) / rate, i.e. under 2 * max / rate.
        prop_assert!(out.retry_after_ms as f64 <= 2000.0 * l.max / l.rate + 1.0);
    }
}
