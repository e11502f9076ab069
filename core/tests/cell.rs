//! CL.THROTTLE's reply shaping (`cell::reply`) and what it charges
//! (`Throttle::cost`), on buckets worked out by hand: a bucket in debt,
//! a quantity equal to the limit and above it, quantity 0, and the
//! rounding of milliseconds up to whole seconds.

use tb_core::bucket::{Effect, Limits, Outcome, Stored};
use tb_core::cell::{reply, Throttle};

const NOW: i64 = 1_893_456_000_000_000;

/// `CL.THROTTLE k <limit - 1> <count> <period> <quantity>`.
fn call(limit: i64, count: f64, period: f64, quantity: i64) -> Throttle {
    Throttle {
        limits: Limits {
            max: limit as f64,
            rate: count / period,
        },
        limit,
        quantity,
    }
}

/// What the module answers for `t` on `stored` at `NOW`, the way
/// `src/commands.rs` puts it together.
fn answer(t: &Throttle, stored: Option<Stored>) -> [i64; 5] {
    match t.cost() {
        Some(cost) => reply(t, &t.limits.consume(stored, NOW, cost), true),
        None => reply(t, &t.limits.peek(stored, NOW, 0.0), false),
    }
}

fn at(tokens: f64) -> Option<Stored> {
    Some(Stored { tokens, ts_us: NOW })
}

#[test]
fn the_cost_is_the_quantity_up_to_the_limit() {
    assert_eq!(call(5, 1.0, 1.0, 0).cost(), Some(0.0));
    assert_eq!(call(5, 1.0, 1.0, 1).cost(), Some(1.0));
    assert_eq!(call(5, 1.0, 1.0, 5).cost(), Some(5.0));
    assert_eq!(call(5, 1.0, 1.0, 6).cost(), None);
    assert_eq!(call(1, 1.0, 1.0, 2).cost(), None);
}

/// A quantity equal to the limit passes a full bucket and empties it; on a
/// bucket one token short it is limited, with the time that token takes.
#[test]
fn a_quantity_equal_to_the_limit() {
    // Limit 5 at 1/s.
    let t = call(5, 1.0, 1.0, 5);
    assert_eq!(answer(&t, None), [0, 5, 0, -1, 5]);
    assert_eq!(
        t.limits.consume(None, NOW, t.cost().unwrap()).effect,
        Effect::Save {
            tokens: 0.0,
            ts_us: NOW,
            expire_at_ms: NOW / 1000 + 5000
        }
    );
    assert_eq!(answer(&t, at(4.0)), [1, 5, 4, 1, 1]);
    // One above the limit never passes: limited, retry -1, nothing
    // charged, the bucket as it stands.
    let over = call(5, 1.0, 1.0, 6);
    assert_eq!(answer(&over, None), [1, 5, 5, -1, 0]);
    assert_eq!(answer(&over, at(2.5)), [1, 5, 2, -1, 3]);
    assert_eq!(
        over.limits.peek(at(2.5), NOW, 0.0).effect,
        Effect::Nothing,
        "a quantity above the limit writes nothing"
    );
}

/// A bucket TB.ADJUST put in debt: `remaining` is 0, never negative, and
/// the waits count the debt.
#[test]
fn a_bucket_in_debt() {
    // Limit 4 at 0.5/s (`CL.THROTTLE k 3 1 2`), 3 tokens in debt.
    let t = call(4, 1.0, 2.0, 1);
    let o = t.limits.consume(at(-3.0), NOW, 1.0);
    assert_eq!(o.reply(), [0, -3, 8000, 14000], "TB.CONSUME's view");
    assert_eq!(reply(&t, &o, true), [1, 4, 0, 8, 14]);
    // Quantity 0 asks whether the bucket is out of debt: not for 6 s.
    let check = call(4, 1.0, 2.0, 0);
    assert_eq!(answer(&check, at(-3.0)), [1, 4, 0, 6, 14]);
    assert_eq!(answer(&check, at(-0.25)), [1, 4, 0, 1, 9]);
    // Above the limit, in debt: still -1 and 0.
    assert_eq!(answer(&call(4, 1.0, 2.0, 9), at(-3.0)), [1, 4, 0, -1, 14]);
    // Out of debt, remaining is the floor of the balance.
    assert_eq!(answer(&check, at(2.75)), [0, 4, 2, -1, 3]);
}

/// Seconds are the milliseconds rounded up: any fraction of a second,
/// even one millisecond, is a whole second more.
#[test]
fn milliseconds_round_up_to_whole_seconds() {
    let t = call(10, 1.0, 1.0, 1);
    for (ms, s) in [
        (1, 1),
        (999, 1),
        (1000, 1),
        (1001, 2),
        (1999, 2),
        (2000, 2),
        (59_001, 60),
    ] {
        let denied = Outcome {
            allowed: false,
            tokens: 0.0,
            retry_after_ms: ms,
            reset_after_ms: ms,
            effect: Effect::Nothing,
        };
        assert_eq!(reply(&t, &denied, true), [1, 10, 0, s, s], "{ms} ms");
        let allowed = Outcome {
            allowed: true,
            retry_after_ms: 0,
            ..denied
        };
        assert_eq!(reply(&t, &allowed, true), [0, 10, 0, -1, s], "{ms} ms");
    }
    // A full bucket resets in 0 s.
    assert_eq!(answer(&call(10, 1.0, 1.0, 0), None), [0, 10, 10, -1, 0]);
    // From the arithmetic: 30 per 60 s is 2 s a token; 0.25 tokens left
    // wait 1.5 s for one, rounded up to 2; full in 31.5 s, rounded to 32.
    assert_eq!(
        answer(&call(16, 30.0, 60.0, 1), at(0.25)),
        [1, 16, 0, 2, 32]
    );
    // 1 ms short of a token: 1 s, never 0.
    let t = call(1, 1000.0, 1.0, 1);
    assert_eq!(answer(&t, at(0.0)), [1, 1, 0, 1, 1]);
    assert_eq!(t.limits.consume(at(0.0), NOW, 1.0).retry_after_ms, 1);
}
