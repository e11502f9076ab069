//! (c) Bucket arithmetic: never panics on any f64/i64; with valid limits
//! the balance stays in range and reply times are exact to the
//! millisecond; a schedule never admits more than burst plus refill.

use super::Reader;
use tb_core::bucket::{consume_all, Effect, Limits, Outcome, Stored};
use tb_core::contract::{MAX_CAPACITY, MAX_FILL_SECONDS, MAX_RATE};
use tb_core::number::Text;
use tb_core::state::decode;

/// One call in a schedule, `dt_us` after the previous one.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    /// TB.CONSUME with `cost = frac * max`.
    Consume(f64),
    /// TB.PEEK with `cost = frac * max`.
    Peek(f64),
    /// TB.ADJUST with `delta = frac * max`, `frac` in [-2, 2].
    Adjust(f64),
}

#[derive(Clone, Debug)]
pub struct BucketCase {
    pub max: f64,
    pub rate: f64,
    /// Stored `tokens` and `ts`; `None` is a missing key.
    pub stored: Option<(f64, i64)>,
    pub now_us: i64,
    pub cost: f64,
    pub delta: f64,
    pub steps: Vec<(u32, Op)>,
}

/// Fuzzer bytes as a bucket case. A flags byte picks, per value, either
/// raw bits (any f64, NaN and infinities included; any i64) or a value
/// mapped into the valid domain, so both halves get explored:
///
/// ```text
/// flags u8 | max f64 | rate f64 | a u16 | b u16 | tokens f64 | t u16
/// | ts i64 | now i64 | dt i32 | cost f64 | c u16 | delta f64 | d u16
/// | steps: (kind u8, dt u32, frac u16)*
/// ```
pub fn bucket_case_from_bytes(data: &[u8]) -> BucketCase {
    let mut r = Reader(data);
    let flags = r.u8();
    let (raw_max, raw_rate, a, b) = (r.f64(), r.f64(), r.unit(), r.unit());
    let (max, rate) = if flags & 1 != 0 {
        (raw_max, raw_rate)
    } else {
        valid_limits_from(a, b)
    };
    let (raw_tokens, t) = (r.f64(), r.unit());
    let tokens = if flags & 2 != 0 {
        raw_tokens
    } else {
        max * (2.0 * t - 1.0)
    };
    let ts = r.i64();
    let (raw_now, dt) = (r.i64(), r.bytes::<4>());
    let now_us = if flags & 4 != 0 {
        raw_now
    } else {
        ts.saturating_add(i64::from(i32::from_le_bytes(dt)))
    };
    let stored = (flags & 8 == 0).then_some((tokens, ts));
    let (raw_cost, c) = (r.f64(), r.unit());
    let cost = if flags & 16 != 0 { raw_cost } else { max * c };
    let (raw_delta, d) = (r.f64(), r.unit());
    let delta = if flags & 32 != 0 {
        raw_delta
    } else {
        max * (4.0 * d - 2.0)
    };
    let mut steps = Vec::new();
    while !r.0.is_empty() && steps.len() < 256 {
        let kind = r.u8();
        let mut dt = r.u32();
        if kind & 0x80 != 0 {
            dt >>= 12; // mostly sub-second steps
        }
        let frac = r.unit();
        let op = match kind % 3 {
            0 => Op::Consume(frac),
            1 => Op::Peek(frac),
            _ => Op::Adjust(4.0 * frac - 2.0),
        };
        steps.push((dt, op));
    }
    BucketCase {
        max,
        rate,
        stored,
        now_us,
        cost,
        delta,
        steps,
    }
}

/// Valid limits from two fractions in [0, 1]: max log-uniform in
/// [1e-15, 1e12], fill time log-uniform in [1e-6, 1e10] s (rate <= 1e12).
pub fn valid_limits_from(a: f64, b: f64) -> (f64, f64) {
    let max = 10f64.powf(-15.0 + 27.0 * a).min(MAX_CAPACITY);
    let fill = 10f64.powf(-6.0 + 16.0 * b).min(MAX_FILL_SECONDS);
    let rate = (max / fill).min(MAX_RATE);
    (max, rate)
}

/// The limits if the argument parser would accept them.
pub fn valid(max: f64, rate: f64) -> Option<Limits> {
    (max > 0.0
        && max <= MAX_CAPACITY
        && rate > 0.0
        && rate <= MAX_RATE
        && max / rate <= MAX_FILL_SECONDS)
        .then_some(Limits { max, rate })
}

fn in_balance_range(l: &Limits, tokens: f64) -> bool {
    !tokens.is_nan() && tokens >= -l.max && tokens <= l.max
}

/// The stored state a call leaves behind, as the module applies `effect`.
pub fn after(stored: Option<Stored>, effect: Effect) -> Option<Stored> {
    match effect {
        Effect::Nothing => stored,
        Effect::Delete => None,
        Effect::Save { tokens, ts_us, .. } => Some(Stored { tokens, ts_us }),
    }
}

/// The longest reply time valid limits allow: the wait until a future `ts`,
/// then from -max to max.
fn longest_ms(l: &Limits, stored: Option<Stored>, now: i64) -> i64 {
    let wait_us = stored.map_or(0, |s| s.ts_us.saturating_sub(now).max(0));
    wait_us / 1000 + (2000.0 * l.max / l.rate).ceil() as i64 + 2
}

/// `ms` is the earliest whole millisecond at which a call on `left` at
/// `now + ms` sees at least `target` (0 when it already does): the
/// function the next call evaluates passes at `ms` and fails at `ms - 1`.
fn assert_earliest_ms(
    l: &Limits,
    left: Option<Stored>,
    now: i64,
    target: f64,
    ms: i64,
    what: &str,
) {
    assert!(ms >= 0, "{what}: negative {ms}");
    let at = |ms: i64| l.current(left, now + ms * 1000);
    assert!(
        at(ms) >= target,
        "{what}: {l:?} {left:?} not at {target:e} after {ms} ms"
    );
    if ms > 0 {
        assert!(
            at(ms - 1) < target,
            "{what}: {l:?} {left:?} already at {target:e} after {} ms",
            ms - 1
        );
    }
}

/// Checks an outcome of valid limits for a call at `now` on `stored`;
/// `target` is what the retry time waits for (`None`: an admitted
/// consume, whose retry is 0).
fn check_outcome(l: &Limits, stored: Option<Stored>, now: i64, target: Option<f64>, o: &Outcome) {
    assert!(
        in_balance_range(l, o.tokens),
        "{l:?}: balance {} outside [-max, max]",
        o.tokens
    );
    let (retry, reset) = (o.retry_after_ms, o.reset_after_ms);
    assert!(retry >= 0 && reset >= 0, "{l:?} {o:?}");
    assert!(retry <= reset, "{l:?}: retry {retry} after reset {reset}");
    assert!(
        reset <= longest_ms(l, stored, now),
        "{l:?}: reset {reset} ms too long"
    );
    assert!(o.remaining() <= l.max.floor() as i64, "{o:?}");
    let left = after(stored, o.effect);
    assert_earliest_ms(l, left, now, l.max, reset, "reset");
    match target {
        None => assert_eq!(retry, 0),
        Some(t) => assert_earliest_ms(l, left, now, t, retry, "retry"),
    }
    if let Effect::Save {
        tokens,
        ts_us,
        expire_at_ms,
    } = o.effect
    {
        assert_eq!((tokens.to_bits(), ts_us), (o.tokens.to_bits(), now));
        assert_eq!(expire_at_ms, check_expire_at(l, tokens, now, reset));
    }
}

/// The expire time the module sets for a bucket written at `now` (µs):
/// never before the bucket is full again, and at most a millisecond after
/// the reply's reset time. Returns it.
fn check_expire_at(l: &Limits, tokens: f64, now: i64, reset_ms: i64) -> i64 {
    let at = Limits::expire_at_ms(now, reset_ms);
    let full_at_us = i128::from(now) + i128::from(reset_ms) * 1000;
    let at_us = i128::from(at) * 1000;
    if at < i64::MAX {
        assert!(
            at_us >= full_at_us,
            "expires at {at} ms, before {full_at_us} us"
        );
        assert!(
            at_us < full_at_us + 1000,
            "expires late: {at} ms, full at {full_at_us} us"
        );
        let elapsed = (at_us - i128::from(now)) as f64;
        assert!(
            l.refill(tokens, elapsed) >= l.max,
            "expires before full: {l:?} {tokens:e}"
        );
    }
    at
}

/// The never-panics half of (c): every entry point with raw values.
fn exercise(l: &Limits, tokens: f64, cost: f64, delta: f64, now: i64, ts: i64) {
    let stored = Some(Stored { tokens, ts_us: ts });
    let c = l.current(stored, now);
    let _ = l.current(None, now);
    let _ = l.refill(tokens, now as f64);
    let _ = l.clamp(tokens);
    let _ = l.ms_until(stored, now, cost);
    let _ = l.is_full(c);
    for o in [
        l.consume(stored, now, cost),
        l.peek(stored, now, cost),
        l.adjust(stored, now, delta),
        l.consume(None, now, cost),
        l.reserve(stored, now, cost, now, true),
        l.reserve(stored, now, cost, i64::MAX, false),
    ] {
        let _ = (o.reply(), Limits::expire_at_ms(now, o.reset_after_ms));
    }
    let _ = consume_all(&[(*l, stored, cost), (*l, None, delta)], now);
    let _ = Limits::expire_at_ms(ts, i64::MAX);
    let _ = Limits::expire_at_ms(i64::MIN, i64::MIN);
}

/// Timestamps a key can hold and a server clock can read: at most 16
/// digits either way (`state::decode`), so a `ts` is at most 1e13 ms away.
fn decodable(us: i64) -> i64 {
    us % 10_000_000_000_000_000
}

/// Property (c) for one case.
pub fn check_bucket(case: &BucketCase) {
    let raw = Limits {
        max: case.max,
        rate: case.rate,
    };
    let (tokens, ts) = case.stored.unwrap_or((case.max, case.now_us));
    exercise(&raw, tokens, case.cost, case.delta, case.now_us, ts);
    let Some(l) = valid(case.max, case.rate) else {
        return;
    };
    let stored = case.stored.map(|(tokens, ts_us)| Stored {
        tokens,
        ts_us: decodable(ts_us),
    });
    let now = decodable(case.now_us).max(0);
    let current = l.current(stored, now);
    assert!(in_balance_range(&l, current), "{l:?}: current {current}");
    match stored {
        None => assert_eq!(current, l.max, "a missing key is a full bucket"),
        Some(s) if now <= s.ts_us => {
            assert_eq!(current, l.clamp(s.tokens), "minted");
        }
        Some(s) => assert!(current >= l.clamp(s.tokens), "refill lost tokens"),
    }

    if case.cost.is_finite() && case.cost >= 0.0 && case.cost <= l.max {
        let cost = case.cost;
        let o = l.consume(stored, now, cost);
        assert_eq!(o.allowed, current >= cost);
        if !o.allowed {
            assert_eq!(o.tokens.to_bits(), current.to_bits(), "denied but charged");
            assert_eq!(o.effect, Effect::Nothing, "denied but written");
        } else if cost > 0.0 && !tb_core::args::charges_nothing(cost, l.max) {
            assert!(
                o.tokens < current,
                "admitted without a charge: {l:?} {cost:e}"
            );
        }
        check_outcome(&l, stored, now, (!o.allowed).then_some(cost), &o);
        let p = l.peek(stored, now, cost);
        assert_eq!(
            (p.allowed, p.tokens.to_bits(), p.effect),
            (o.allowed, current.to_bits(), Effect::Nothing)
        );
        check_outcome(&l, stored, now, Some(cost), &p);
        check_reservations(&l, stored, now, cost, &o);
        // All-or-nothing over two buckets: a short one charges nobody.
        let other = Some(Stored {
            tokens: l.clamp(case.delta),
            ts_us: now,
        });
        let (all, retry, outs) = consume_all(&[(l, stored, cost), (l, other, cost)], now);
        let other_ok = l.current(other, now) >= cost;
        assert_eq!(all, current >= cost && other_ok);
        assert_eq!(retry, outs.iter().map(|o| o.retry_after_ms).max().unwrap());
        for (o, s) in outs.iter().zip([stored, other]) {
            if !all {
                assert_eq!(o.effect, Effect::Nothing, "partial charge");
                check_outcome(&l, s, now, Some(cost), o);
            }
        }
    }
    if case.delta.is_finite() {
        let o = l.adjust(stored, now, case.delta);
        assert!(o.allowed);
        check_outcome(&l, stored, now, Some(l.max.min(1.0)), &o);
        assert_eq!(o.tokens, l.clamp(current + case.delta));
    }
    check_schedule(&l, stored, now, &case.steps);
}

/// A reservation (`WAIT max_ms`) for every kind of `max_ms`: a bucket that
/// holds `cost` charges as `consume` (`plain`); a short one admits into
/// debt, never below `-max`, with the exact wait until the balance it
/// leaves is back at 0, within `max_ms`; anything else is `plain`'s
/// denial. A peek gives the same verdict and wait, the balance as it
/// stands, and writes nothing.
fn check_reservations(l: &Limits, stored: Option<Stored>, now: i64, cost: f64, plain: &Outcome) {
    let current = l.current(stored, now);
    let fill_ms = (2000.0 * l.max / l.rate).ceil() as i64;
    for max_ms in [
        0,
        1,
        999,
        fill_ms / 3,
        fill_ms,
        tb_core::contract::MAX_WAIT_MS,
    ] {
        let r = l.reserve(stored, now, cost, max_ms, true);
        let p = l.reserve(stored, now, cost, max_ms, false);
        let plain_peek = l.peek(stored, now, cost);
        if current >= cost || !r.allowed {
            assert_eq!(
                &r, plain,
                "{l:?} {cost:e} {max_ms}: not the plain call's answer"
            );
            assert_eq!(p, plain_peek, "{l:?} {cost:e} {max_ms}: not the plain peek");
            continue;
        }
        // The peek: admitted with the same wait, the bucket as it stands.
        assert_eq!(
            p,
            Outcome {
                allowed: true,
                retry_after_ms: r.retry_after_ms,
                ..plain_peek
            },
            "a peek of a reservation"
        );
        assert_eq!(r.tokens.to_bits(), (current - cost).to_bits(), "{l:?}");
        assert!(r.tokens >= -l.max, "{l:?}: below the floor");
        assert!(r.retry_after_ms <= max_ms, "{l:?}: waits past max_ms");
        assert!(matches!(r.effect, Effect::Save { .. }), "{r:?}");
        check_outcome(l, stored, now, Some(0.0), &r);
    }
}

/// Runs `steps` through load → compute → store as the module does, with
/// keys expiring as early as the expire time the module sets allows, and
/// checks the bucket never gives out more than its contract: what was
/// admitted plus what is left is at most the starting balance plus the
/// refill (`rate` × elapsed) plus the refunds.
fn check_schedule(l: &Limits, mut stored: Option<Stored>, start: i64, steps: &[(u32, Op)]) {
    let initial = l.current(stored, start);
    let mut expire_at_ms: Option<i64> = None;
    let mut now = start;
    let (mut admitted, mut refunds) = (0.0f64, 0.0f64);
    for &(dt, op) in steps {
        let Some(t) = now.checked_add(i64::from(dt)) else {
            break;
        };
        now = t;
        // Redis deletes a key once its expire time has passed; deleting it
        // already at that millisecond is stricter.
        if expire_at_ms.is_some_and(|at| now.div_euclid(1000) >= at) {
            stored = None;
            expire_at_ms = None;
        }
        let current = l.current(stored, now);
        assert!(in_balance_range(l, current), "{l:?}: current {current}");
        let out = match op {
            Op::Consume(frac) => {
                let cost = l.max * frac;
                let o = l.consume(stored, now, cost);
                check_outcome(l, stored, now, (!o.allowed).then_some(cost), &o);
                if o.allowed {
                    admitted += cost;
                }
                o
            }
            Op::Peek(frac) => {
                let cost = l.max * frac;
                let o = l.peek(stored, now, cost);
                check_outcome(l, stored, now, Some(cost), &o);
                o
            }
            Op::Adjust(frac) => {
                let delta = l.max * frac;
                refunds += delta.max(0.0);
                let o = l.adjust(stored, now, delta);
                check_outcome(l, stored, now, Some(l.max.min(1.0)), &o);
                o
            }
        };
        let elapsed_s = (now - start) as f64 / 1e6;
        let budget = initial + l.rate * elapsed_s + refunds;
        // Relative rounding of the sums, and an absolute floor for
        // subnormal limits, where every operation rounds by up to 5e-324.
        let slack = 1e-9 * (budget.abs() + l.max) + 1e-320;
        assert!(
            admitted + out.tokens <= budget + slack,
            "{l:?}: admitted {admitted:e} + left {:e} > budget {budget:e} after {elapsed_s} s",
            out.tokens
        );
        match out.effect {
            Effect::Nothing => {}
            Effect::Delete => {
                stored = None;
                expire_at_ms = None;
            }
            Effect::Save {
                tokens,
                ts_us,
                expire_at_ms: at,
            } => {
                // Through the hash encoding, as the module stores it.
                let (tok, ts) = (Text::tokens(tokens), Text::int(ts_us));
                let back = decode(Some(tok.as_bytes()), Some(ts.as_bytes()));
                if now.unsigned_abs() < 10_000_000_000_000_000 {
                    assert_eq!(back.map(|s| s.tokens), Ok(tokens));
                }
                stored = Some(Stored { tokens, ts_us });
                expire_at_ms = Some(at);
            }
        }
    }
}
