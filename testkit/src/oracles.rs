//! Properties of tb-core under hostile input, shared by the libFuzzer
//! targets (`fuzz/fuzz_targets/*.rs`, nightly) and their proptest
//! equivalents (`core/tests/fuzz_equivalents.rs`, stable). Only `std` and
//! `tb_core` may be used here: the fuzz build takes this crate without its
//! features.
//!
//! Each `check_*` function panics when a property fails; each `*_from_bytes`
//! function turns fuzzer bytes into that check's input.
//!
//! * (a) argument parsing: never panics; the result is exactly what an
//!   independent reference validator predicts, and any `Ok` is within the
//!   documented bounds (0 < max <= 1e12, 0 < rate <= 1e12, max/rate <= 1e10,
//!   0 <= cost <= max, all finite); TB.ACQUIRE's within its own (limit,
//!   lease_ms, weight, its BUCKET clauses), with its keys where the key
//!   specs say; lease values read back as written;
//! * (b) state decoding: never panics; `Ok` values are finite; what is
//!   encoded decodes back to the same bits;
//! * (c) bucket arithmetic: never panics on any f64/i64; with valid limits
//!   the balance is never NaN and stays in [-max, max], an admitted call had
//!   the tokens and changed the balance, reply times are non-negative,
//!   bounded and exact to the millisecond for the state the call leaves (a
//!   call at `now + retry_after_ms` passes, one a millisecond earlier does
//!   not), and a schedule of calls (with keys expiring at the time the
//!   module sets) never admits more than burst plus refill plus refunds.

/// A fuzz target: its name (its directory under fuzz/corpus/) and what it
/// does with the bytes it is given.
pub type Target = (&'static str, fn(&[u8]));

/// What each fuzz target does with its bytes: the libFuzzer targets and the
/// replay of the checked-in seeds (`core/tests/fuzz_equivalents.rs`) both
/// call these, so a seed means the same thing to both.
pub const TARGETS: [Target; 3] = [
    ("args", args_target),
    ("state", state_target),
    ("bucket", bucket_target),
];

/// The `args` target: fuzzer bytes as an argv, property (a).
pub fn args_target(data: &[u8]) {
    check_args(&argv_from_bytes(data));
}

/// The `state` target: fuzzer bytes as two hash fields, and their first
/// eight bytes as a balance and a timestamp to round-trip, property (b).
pub fn state_target(data: &[u8]) {
    let (tokens, ts) = fields_from_bytes(data);
    check_state(tokens, ts);
    let mut word = [0u8; 8];
    let n = data.len().min(8);
    word[..n].copy_from_slice(&data[..n]);
    check_tokens_round_trip(f64::from_le_bytes(word));
    check_ts_round_trip(i64::from_le_bytes(word));
}

/// The `bucket` target: fuzzer bytes as a bucket case, property (c).
pub fn bucket_target(data: &[u8]) {
    check_bucket(&bucket_case_from_bytes(data));
}

use tb_core::args::{parse_adjust, parse_consume, parse_mconsume, Argv};
use tb_core::bucket::{consume_all, Effect, Limits, Outcome, Stored};
use tb_core::contract::{
    MAX_CAPACITY, MAX_FILL_SECONDS, MAX_GROUPS, MAX_LEASE_LIMIT, MAX_LEASE_MS, MAX_RATE,
};
use tb_core::error::{Arg, Error, StateError};
use tb_core::lease::{acquire_key_positions, parse_acquire, Lease};
use tb_core::number::parse_decimal;
use tb_core::state::{decode, Text};

// ---- (a) argument parsing --------------------------------------------------

/// Which parser an argv goes to (TB.PEEK shares TB.CONSUME's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Consume,
    Adjust,
    MConsume,
    Acquire,
}

impl Command {
    /// Picks the parser from `argv[0]`: a name ending in `adjust`,
    /// `mconsume` or `acquire` (any case), else TB.CONSUME.
    pub fn of(name: &[u8]) -> Command {
        let lower = name.to_ascii_lowercase();
        if lower.ends_with(b"acquire") {
            Command::Acquire
        } else if lower.ends_with(b"mconsume") {
            Command::MConsume
        } else if lower.ends_with(b"adjust") {
            Command::Adjust
        } else {
            Command::Consume
        }
    }
}

/// Fuzzer bytes as an argv: split at `\n`, so seeds read like
/// `TB.CONSUME\nk\n10\n1`. Every other byte (NUL, spaces, 0xff...) can
/// appear inside an argument.
pub fn argv_from_bytes(data: &[u8]) -> Vec<&[u8]> {
    data.split(|&b| b == b'\n').collect()
}

/// The number grammar, restated independently of `tb_core::number`: only
/// the characters of a decimal, and Rust's float parser (which would also
/// take `inf`, `nan` and `infinity`, excluded by the character set) must
/// read it as a finite value.
pub fn reference_number(bytes: &[u8]) -> Option<f64> {
    if !bytes.iter().all(|b| b"0123456789+-.eE".contains(b)) {
        return None;
    }
    let v: f64 = std::str::from_utf8(bytes).ok()?.parse().ok()?;
    v.is_finite().then_some(v)
}

fn reference_limits(max: &[u8], rate: &[u8], g: Option<usize>) -> Result<Limits, Error> {
    let max = reference_number(max).ok_or(Error::NotANumber(Arg::Max, g))?;
    if max <= 0.0 || max > MAX_CAPACITY {
        return Err(Error::MaxOutOfRange(g));
    }
    let rate = reference_number(rate).ok_or(Error::NotANumber(Arg::Rate, g))?;
    if rate <= 0.0 || rate > MAX_RATE {
        return Err(Error::RateOutOfRange(g));
    }
    if max / rate > MAX_FILL_SECONDS {
        return Err(Error::FillTooSlow(g));
    }
    Ok(Limits { max, rate })
}

fn reference_cost(cost: &[u8], max: f64, g: Option<usize>) -> Result<f64, Error> {
    let cost = reference_number(cost).ok_or(Error::NotANumber(Arg::Cost, g))?;
    if cost < 0.0 {
        return Err(Error::CostNegative(g));
    }
    if cost > max {
        return Err(Error::CostAboveMax(g));
    }
    // A positive cost must lower each of the five largest balances up to
    // max that it fits in (rounding keeps the most at the top).
    let mut b = max;
    for _ in 0..5 {
        if cost > 0.0 && b >= cost && b - cost == b {
            return Err(Error::CostTooSmall(g));
        }
        b = b.next_down();
    }
    Ok(cost)
}

/// What TB.CONSUME/TB.PEEK must answer: `(limits, cost)` or the first error.
pub fn reference_consume(argv: &[&[u8]]) -> Result<(Limits, f64), Error> {
    if argv.len() != 4 && argv.len() != 5 {
        return Err(Error::Arity(argv.command()));
    }
    let l = reference_limits(argv[2], argv[3], None)?;
    let cost = match argv.get(4) {
        Some(c) => reference_cost(c, l.max, None)?,
        None if l.max < 1.0 => return Err(Error::CostAboveMax(None)),
        None => 1.0,
    };
    Ok((l, cost))
}

pub fn reference_adjust(argv: &[&[u8]]) -> Result<(Limits, f64), Error> {
    if argv.len() != 5 {
        return Err(Error::Arity(argv.command()));
    }
    let l = reference_limits(argv[2], argv[3], None)?;
    let delta = reference_number(argv[4]).ok_or(Error::NotANumber(Arg::Delta, None))?;
    Ok((l, delta))
}

/// `(key_index, limits, cost)` per group, or the first error; duplicates by
/// a plain left-to-right scan.
pub fn reference_mconsume(argv: &[&[u8]]) -> Result<Vec<(usize, Limits, f64)>, Error> {
    if argv.len() < 5 || !(argv.len() - 1).is_multiple_of(4) {
        return Err(Error::Arity(argv.command()));
    }
    if (argv.len() - 1) / 4 > MAX_GROUPS {
        return Err(Error::TooManyGroups);
    }
    let mut groups = Vec::new();
    for (g, chunk) in argv[1..].chunks(4).enumerate() {
        let label = Some(g + 1);
        let l = reference_limits(chunk[1], chunk[2], label)?;
        let cost = reference_cost(chunk[3], l.max, label)?;
        groups.push((1 + 4 * g, l, cost));
    }
    for g in 1..groups.len() {
        let key = argv[groups[g].0];
        if let Some(first) = (0..g).find(|&f| argv[groups[f].0] == key) {
            return Err(Error::DuplicateKey {
                group: g + 1,
                first: first + 1,
            });
        }
    }
    Ok(groups)
}

fn assert_limits_in_bounds(l: &Limits) {
    assert!(l.max.is_finite() && l.rate.is_finite(), "{l:?}");
    assert!(
        l.max > 0.0 && l.max <= MAX_CAPACITY,
        "max out of bounds: {l:?}"
    );
    assert!(
        l.rate > 0.0 && l.rate <= MAX_RATE,
        "rate out of bounds: {l:?}"
    );
    assert!(l.max / l.rate <= MAX_FILL_SECONDS, "fill time: {l:?}");
}

fn assert_cost_in_bounds(cost: f64, l: &Limits) {
    assert!(
        cost.is_finite() && cost >= 0.0 && cost <= l.max,
        "cost {cost} outside [0, {}]",
        l.max
    );
}

/// Property (a) for one argv (`argv[0]` is the command name).
pub fn check_args(argv: &[&[u8]]) {
    assert_eq!(MAX_GROUPS, 10_000, "documented group limit");
    match Command::of(argv.first().copied().unwrap_or_default()) {
        Command::Consume => {
            let got = parse_consume(argv);
            let want = reference_consume(argv);
            assert_eq!(got.map(|s| (s.limits, s.amount)), want, "{argv:?}");
            if let Ok(s) = got {
                assert_limits_in_bounds(&s.limits);
                assert_cost_in_bounds(s.amount, &s.limits);
            }
        }
        Command::Adjust => {
            let got = parse_adjust(argv);
            assert_eq!(
                got.map(|s| (s.limits, s.amount)),
                reference_adjust(argv),
                "{argv:?}"
            );
            if let Ok(s) = got {
                assert_limits_in_bounds(&s.limits);
                assert!(s.amount.is_finite(), "delta {}", s.amount);
            }
        }
        Command::Acquire => check_acquire(argv),
        Command::MConsume => {
            let got = parse_mconsume(argv);
            let simple = got
                .as_ref()
                .map(|gs| gs.iter().map(|g| (g.key_index, g.limits, g.cost)).collect())
                .map_err(|e| *e);
            assert_eq!(simple, reference_mconsume(argv), "{argv:?}");
            if let Ok(groups) = got {
                assert!(!groups.is_empty() && groups.len() <= MAX_GROUPS);
                assert_eq!(groups.len(), (argv.count() - 1) / 4);
                for g in &groups {
                    assert_limits_in_bounds(&g.limits);
                    assert_cost_in_bounds(g.cost, &g.limits);
                }
            }
        }
    }
    for arg in argv {
        let ours = parse_decimal(arg).map(f64::to_bits);
        assert_eq!(ours, reference_number(arg).map(f64::to_bits), "{arg:?}");
        // A lease value reads only as two integers, and writes back as read.
        if let Some(lease) = Lease::parse(arg) {
            assert!(lease.weight >= 1 && lease.expires_us >= 0, "{arg:?}");
            assert_eq!(Lease::parse(&lease.text()), Some(lease), "{arg:?}");
        }
    }
}

/// TB.ACQUIRE: never panics; what it accepts is within the documented
/// bounds, and its keys are where the key specs (and the key-position
/// answer) say they are.
fn check_acquire(argv: &[&[u8]]) {
    let positions = acquire_key_positions(argv);
    let Ok(call) = parse_acquire(argv) else {
        return;
    };
    assert!((1..=MAX_LEASE_LIMIT).contains(&call.limit), "{argv:?}");
    assert!((1..=MAX_LEASE_MS).contains(&call.lease_ms), "{argv:?}");
    assert!((1..=call.limit).contains(&call.weight), "{argv:?}");
    assert!(call.buckets.len() <= MAX_GROUPS);
    let mut keys = vec![1];
    for g in &call.buckets {
        assert_limits_in_bounds(&g.limits);
        assert_cost_in_bounds(g.cost, &g.limits);
        assert_ne!(argv[g.key_index], argv[1], "{argv:?}");
        keys.push(g.key_index);
    }
    assert_eq!(positions, keys, "{argv:?}");
}

// ---- (b) state decoding ------------------------------------------------------

/// Fuzzer bytes as the two hash fields: bit 0 of the first byte says
/// `tokens` is present, bit 1 that `ts` is (so seeds start with `3`), and
/// the rest is split at the first `\n` into `tokens` and `ts`.
pub fn fields_from_bytes(data: &[u8]) -> (Option<&[u8]>, Option<&[u8]>) {
    let (flags, rest) = data.split_first().map_or((0, data), |(f, r)| (*f, r));
    let (tokens, ts) = match rest.iter().position(|&b| b == b'\n') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &rest[rest.len()..]),
    };
    (
        (flags & 1 != 0).then_some(tokens),
        (flags & 2 != 0).then_some(ts),
    )
}

/// The `ts` grammar restated: an optional `-` and 1 to 16 digits.
pub fn reference_ts(bytes: &[u8]) -> Option<i64> {
    let digits = bytes.strip_prefix(b"-").unwrap_or(bytes);
    if digits.is_empty() || digits.len() > 16 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// Property (b) for one pair of fields.
pub fn check_state(tokens: Option<&[u8]>, ts: Option<&[u8]>) {
    let got = decode(tokens, ts);
    let (Some(t), Some(s)) = (tokens, ts) else {
        assert_eq!(got, Err(StateError::Fields));
        return;
    };
    let want = match (reference_number(t), reference_ts(s)) {
        (None, _) => Err(StateError::Tokens),
        (_, None) => Err(StateError::Ts),
        (Some(tokens), Some(ts_us)) => Ok(Stored { tokens, ts_us }),
    };
    assert_eq!(got, want, "tokens {t:?} ts {s:?}");
    if let Ok(stored) = got {
        assert!(stored.tokens.is_finite());
        check_tokens_round_trip(stored.tokens);
        check_ts_round_trip(stored.ts_us);
    }
}

/// Any finite balance encodes to a decimal that decodes to the same bits
/// (negative zero as zero), short enough for the balances the module
/// stores (|tokens| <= 1e12).
pub fn check_tokens_round_trip(tokens: f64) {
    if !tokens.is_finite() {
        return;
    }
    let text = String::from_utf8_lossy(Text::tokens(tokens).as_bytes()).into_owned();
    let back = decode(Some(text.as_bytes()), Some(b"0"))
        .unwrap_or_else(|e| panic!("{tokens:e} encoded as {text:?}: {e:?}"))
        .tokens;
    let want = if tokens == 0.0 { 0.0 } else { tokens };
    assert_eq!(back.to_bits(), want.to_bits(), "{tokens:e} -> {text:?}");
    // The text itself is Display's (`e` form below 1e-5), whichever
    // formatter the encoder used: stored hashes keep one spelling.
    let display = if want != 0.0 && want.abs() < 1e-5 {
        format!("{want:e}")
    } else {
        format!("{want}")
    };
    assert_eq!(text, display, "{tokens:e}");
    if tokens.abs() <= 1e12 {
        assert!(text.len() <= 24, "{tokens:e} encoded long: {text:?}");
    }
}

/// A `ts` of at most 16 digits (every real clock until the year 2286)
/// round-trips; longer ones are refused by the decoder, never misread.
pub fn check_ts_round_trip(ts_us: i64) {
    let text = String::from_utf8_lossy(Text::int(ts_us).as_bytes()).into_owned();
    let back = decode(Some(b"0"), Some(text.as_bytes())).map(|s| s.ts_us);
    if ts_us.unsigned_abs() < 10_000_000_000_000_000 {
        assert_eq!(back, Ok(ts_us), "{text}");
    } else {
        assert_eq!(back, Err(StateError::Ts), "{text}");
    }
}

// ---- (c) bucket arithmetic ---------------------------------------------------

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

/// Reads fixed-size values, zeros past the end of the input.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
    fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.bytes())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }
    fn i64(&mut self) -> i64 {
        i64::from_le_bytes(self.bytes())
    }
    fn f64(&mut self) -> f64 {
        f64::from_le_bytes(self.bytes())
    }
    /// A fraction in [0, 1].
    fn unit(&mut self) -> f64 {
        f64::from(self.u16()) / f64::from(u16::MAX)
    }
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
