//! (a) Argument parsing: never panics; the result is exactly what an
//! independent reference validator predicts, and any `Ok` is within the
//! documented bounds.

use tb_core::args::{parse_adjust, parse_consume, parse_mconsume, Argv, Memos};
use tb_core::bucket::Limits;
use tb_core::charge::Limit;
use tb_core::contract::{
    MAX_CAPACITY, MAX_FILL_SECONDS, MAX_GROUPS, MAX_LEASE_LIMIT, MAX_LEASE_MS, MAX_RATE,
};
use tb_core::error::{Arg, Error};
use tb_core::lease::{acquire_key_positions, parse_acquire, Lease};
use tb_core::number::parse_decimal;

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

/// What TB.CONSUME/TB.PEEK must answer: `(limits, cost, WAIT's max_ms)`
/// or the first error. `WAIT max_ms` comes last, after the cost if any.
pub fn reference_consume(argv: &[&[u8]]) -> Result<(Limits, f64, Option<i64>), Error> {
    let n = argv.len();
    if !(4..=7).contains(&n) {
        return Err(Error::Arity(argv.command()));
    }
    let waits = n >= 6;
    let cost_at = if waits { n - 3 } else { n - 1 };
    let l = reference_limits(argv[2], argv[3], None)?;
    let cost = match cost_at {
        4 => reference_cost(argv[4], l.max, None)?,
        _ if l.max < 1.0 => return Err(Error::CostAboveMax(None)),
        _ => 1.0,
    };
    if !waits {
        return Ok((l, cost, None));
    }
    if !argv[n - 2].eq_ignore_ascii_case(b"WAIT") {
        return Err(Error::ExpectedWait(n - 2));
    }
    let most = tb_core::contract::MAX_WAIT_MS;
    let ms: i64 = std::str::from_utf8(argv[n - 1])
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or(Error::NotAnInteger(Arg::MaxMs))?;
    if !(0..=most).contains(&ms) {
        return Err(Error::IntOutOfRange(Arg::MaxMs, 0, most));
    }
    Ok((l, cost, Some(ms)))
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

std::thread_local! {
    /// One store of argument memos for the calls a thread checks in turn,
    /// as the module keeps one for all its calls: an argv that repeats the
    /// last one's numbers is answered from it, and must still match.
    static MEMOS: Memos = const { Memos::new() };
}

/// Property (a) for one argv (`argv[0]` is the command name).
pub fn check_args(argv: &[&[u8]]) {
    MEMOS.with(|memos| check_args_with(argv, memos));
}

fn check_args_with(argv: &[&[u8]], memos: &Memos) {
    assert_eq!(MAX_GROUPS, 10_000, "documented group limit");
    match Command::of(argv.first().copied().unwrap_or_default()) {
        Command::Consume => {
            let got = parse_consume(argv, memos);
            let want = reference_consume(argv);
            assert_eq!(
                got.map(|s| (s.limits, s.amount, s.wait_ms)),
                want,
                "{argv:?}"
            );
            if let Ok(s) = got {
                assert_limits_in_bounds(&s.limits);
                assert_cost_in_bounds(s.amount, &s.limits);
            }
        }
        Command::Adjust => {
            let got = parse_adjust(argv, memos);
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
        Command::Acquire => check_acquire(argv, memos),
        Command::MConsume => {
            let got = parse_mconsume(argv, memos);
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
fn check_acquire(argv: &[&[u8]], memos: &Memos) {
    let positions = acquire_key_positions(argv);
    let Ok(call) = parse_acquire(argv, memos) else {
        return;
    };
    assert!((1..=MAX_LEASE_LIMIT).contains(&call.limit), "{argv:?}");
    assert!((1..=MAX_LEASE_MS).contains(&call.lease_ms), "{argv:?}");
    assert!((1..=call.limit).contains(&call.weight), "{argv:?}");
    assert!(call.clauses.len() <= MAX_GROUPS);
    let mut keys = vec![1];
    for c in &call.clauses {
        match c.limit {
            Limit::Bucket(l) => {
                assert_limits_in_bounds(&l);
                assert_cost_in_bounds(c.cost, &l);
            }
            Limit::Quota(q) => {
                assert!(q.limit > 0.0 && q.limit <= MAX_CAPACITY, "{argv:?}");
                assert!((0.0..=q.limit).contains(&c.cost), "{argv:?}");
            }
        }
        assert_ne!(argv[c.key_index], argv[1], "{argv:?}");
        keys.push(c.key_index);
    }
    assert_eq!(positions, keys, "{argv:?}");
}
