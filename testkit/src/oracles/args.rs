//! (a) Argument parsing: never panics; the result is exactly what an
//! independent reference validator predicts, any `Ok` is within the
//! documented bounds, and every error's text is one of the contract's.

use tb_core::args::{parse_adjust, parse_consume, parse_mconsume, Argv, Memos};
use tb_core::bucket::Limits;
use tb_core::charge::{charge_key_positions, parse_charge, Charge, Clause, Limit};
use tb_core::contract::{
    msg, MAX_CAPACITY, MAX_FILL_SECONDS, MAX_GROUPS, MAX_LEASE_LIMIT, MAX_LEASE_MS,
    MAX_OFFSET_MINUTES, MAX_PERIOD_SECONDS, MAX_RATE, MAX_WAIT_MS,
};
use tb_core::error::{Arg, Error};
use tb_core::lease::{acquire_key_positions, parse_acquire, Lease};
use tb_core::number::parse_decimal;
use tb_core::quota::{parse_qadjust, parse_quota, Period, Quota, QuotaCall};

/// Which parser an argv goes to (TB.PEEK shares TB.CONSUME's, TB.QPEEK
/// TB.QUOTA's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Consume,
    Adjust,
    MConsume,
    Acquire,
    Quota,
    QAdjust,
    Charge,
}

impl Command {
    /// Picks the parser from `argv[0]`: a name ending in `qadjust`,
    /// `adjust`, `mconsume`, `acquire`, `quota`, `qpeek` or `charge` (any
    /// case), else TB.CONSUME.
    pub fn of(name: &[u8]) -> Command {
        let lower = name.to_ascii_lowercase();
        let ends = |s: &[u8]| lower.ends_with(s);
        if ends(b"acquire") {
            Command::Acquire
        } else if ends(b"mconsume") {
            Command::MConsume
        } else if ends(b"qadjust") {
            Command::QAdjust
        } else if ends(b"adjust") {
            Command::Adjust
        } else if ends(b"quota") || ends(b"qpeek") {
            Command::Quota
        } else if ends(b"charge") {
            Command::Charge
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

/// Whether a positive cost fails to lower one of the five largest
/// balances up to `max` that it fits in (rounding keeps the most at the
/// top): a bucket's max, or a quota's limit, whose `limit - used` it is.
fn reference_too_small(cost: f64, max: f64) -> bool {
    let mut b = max;
    for _ in 0..5 {
        if cost > 0.0 && b >= cost && b - cost == b {
            return true;
        }
        b = b.next_down();
    }
    false
}

fn reference_cost(cost: &[u8], max: f64, g: Option<usize>) -> Result<f64, Error> {
    let cost = reference_number(cost).ok_or(Error::NotANumber(Arg::Cost, g))?;
    if cost < 0.0 {
        return Err(Error::CostNegative(g));
    }
    if cost > max {
        return Err(Error::CostAboveMax(g));
    }
    if reference_too_small(cost, max) {
        return Err(Error::CostTooSmall(g));
    }
    Ok(cost)
}

/// An integer argument as the docs have them: what `str::parse::<i64>`
/// reads (an optional sign, then digits), nothing else.
fn reference_int(bytes: &[u8]) -> Option<i64> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

fn reference_quota_limit(bytes: &[u8], g: Option<usize>) -> Result<f64, Error> {
    let limit = reference_number(bytes).ok_or(Error::NotANumber(Arg::Limit, g))?;
    if limit <= 0.0 || limit > MAX_CAPACITY {
        return Err(Error::LimitOutOfRange(g));
    }
    Ok(limit)
}

fn reference_period(bytes: &[u8], g: Option<usize>) -> Result<Period, Error> {
    let upper = bytes.to_ascii_uppercase();
    match &upper[..] {
        b"DAY" => Ok(Period::Day),
        b"WEEK" => Ok(Period::Week),
        b"MONTH" => Ok(Period::Month),
        b"YEAR" => Ok(Period::Year),
        _ => match reference_int(bytes) {
            Some(s) if (1..=MAX_PERIOD_SECONDS).contains(&s) => Ok(Period::Seconds(s)),
            _ => Err(Error::BadPeriod(g)),
        },
    }
}

fn reference_quota_cost(bytes: &[u8], limit: f64, g: Option<usize>) -> Result<f64, Error> {
    let cost = reference_number(bytes).ok_or(Error::NotANumber(Arg::Cost, g))?;
    if cost < 0.0 {
        return Err(Error::CostNegative(g));
    }
    if cost > limit {
        return Err(Error::CostAboveLimit(g));
    }
    if reference_too_small(cost, limit) {
        return Err(Error::QuotaCostTooSmall(g));
    }
    Ok(cost)
}

/// `OFFSET minutes` at `argv[at]`, as seconds.
fn reference_offset(argv: &[&[u8]], at: usize) -> Result<i64, Error> {
    if !argv[at].eq_ignore_ascii_case(b"OFFSET") {
        return Err(Error::ExpectedOffset(at));
    }
    let m = MAX_OFFSET_MINUTES;
    let minutes = reference_int(argv[at + 1]).ok_or(Error::NotAnInteger(Arg::Offset))?;
    if !(-m..=m).contains(&minutes) {
        return Err(Error::IntOutOfRange(Arg::Offset, -m, m));
    }
    Ok(minutes * 60)
}

/// What TB.QUOTA/TB.QPEEK (`key limit period [cost] [OFFSET minutes]`)
/// or TB.QADJUST (`key limit period delta [OFFSET minutes]`) must answer.
/// Past the key and the three fixed words, two more are OFFSET's; one
/// more is the amount.
pub fn reference_quota(argv: &[&[u8]], adjust: bool) -> Result<QuotaCall, Error> {
    let n = argv.len();
    let shapes: &[usize] = if adjust { &[5, 7] } else { &[4, 5, 6, 7] };
    if !shapes.contains(&n) {
        return Err(Error::Arity(argv.command()));
    }
    let with_offset = n >= 6;
    let with_amount = n - if with_offset { 2 } else { 0 } == 5;
    let limit = reference_quota_limit(argv[2], None)?;
    let period = reference_period(argv[3], None)?;
    let amount = if adjust {
        reference_number(argv[4]).ok_or(Error::NotANumber(Arg::Delta, None))?
    } else if with_amount {
        reference_quota_cost(argv[4], limit, None)?
    } else if limit < 1.0 {
        return Err(Error::CostAboveLimit(None));
    } else {
        1.0
    };
    let offset_s = if with_offset {
        reference_offset(argv, n - 2)?
    } else {
        0
    };
    Ok(QuotaCall {
        quota: Quota {
            limit,
            period,
            offset_s,
        },
        amount,
    })
}

/// What TB.CHARGE (`numkeys key... [WAIT max_ms] clause...`) must answer:
/// the count, the keys, WAIT, each clause left to right (a quota's
/// OFFSET when the word after its cost is OFFSET), nothing left over,
/// then duplicates by a plain scan.
pub fn reference_charge(argv: &[&[u8]]) -> Result<Charge, Error> {
    let n = argv.len();
    if n < 4 {
        return Err(Error::Arity(argv.command()));
    }
    let count = reference_int(argv[1]).ok_or(Error::NotAnInteger(Arg::Numkeys))?;
    if count < 1 {
        return Err(Error::TooSmall(Arg::Numkeys, 1));
    }
    if count > MAX_GROUPS as i64 {
        return Err(Error::TooManyGroups);
    }
    let count = count as usize;
    let mut at = 2 + count;
    if at >= n {
        return Err(Error::Arity(argv.command()));
    }
    let mut wait_ms = None;
    if argv[at].eq_ignore_ascii_case(b"WAIT") {
        let ms = argv.get(at + 1).ok_or(Error::Arity(argv.command()))?;
        let ms = reference_int(ms).ok_or(Error::NotAnInteger(Arg::MaxMs))?;
        if !(0..=MAX_WAIT_MS).contains(&ms) {
            return Err(Error::IntOutOfRange(Arg::MaxMs, 0, MAX_WAIT_MS));
        }
        wait_ms = Some(ms);
        at += 2;
    }
    let mut clauses = Vec::new();
    for g in 0..count {
        let label = Some(g + 1);
        if at + 4 > n {
            return Err(Error::Arity(argv.command()));
        }
        let word = argv[at];
        let (limit, cost) = if word.eq_ignore_ascii_case(b"BUCKET") {
            let l = reference_limits(argv[at + 1], argv[at + 2], label)?;
            (
                Limit::Bucket(l),
                reference_cost(argv[at + 3], l.max, label)?,
            )
        } else if word.eq_ignore_ascii_case(b"QUOTA") {
            let limit = reference_quota_limit(argv[at + 1], label)?;
            let period = reference_period(argv[at + 2], label)?;
            let cost = reference_quota_cost(argv[at + 3], limit, label)?;
            let mut offset_s = 0;
            if argv
                .get(at + 4)
                .is_some_and(|w| w.eq_ignore_ascii_case(b"OFFSET"))
            {
                if at + 6 > n {
                    return Err(Error::Arity(argv.command()));
                }
                offset_s = reference_offset(argv, at + 4)?;
                at += 2;
            }
            let q = Quota {
                limit,
                period,
                offset_s,
            };
            (Limit::Quota(q), cost)
        } else {
            return Err(Error::ExpectedClause(at));
        };
        clauses.push(Clause {
            key_index: 2 + g,
            limit,
            cost,
        });
        at += 4;
    }
    if at != n {
        return Err(Error::Arity(argv.command()));
    }
    for g in 1..count {
        if let Some(first) = (0..g).find(|&f| argv[2 + f] == argv[2 + g]) {
            return Err(Error::DuplicateKey {
                group: g + 1,
                first: first + 1,
            });
        }
    }
    Ok(Charge { wait_ms, clauses })
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
            match got {
                Ok(s) => {
                    assert_limits_in_bounds(&s.limits);
                    assert_cost_in_bounds(s.amount, &s.limits);
                }
                Err(e) => assert_contract_text(&e, argv),
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
        Command::Quota | Command::QAdjust => {
            let adjust = Command::of(argv[0]) == Command::QAdjust;
            let got = if adjust {
                parse_qadjust(argv)
            } else {
                parse_quota(argv)
            };
            assert_eq!(got, reference_quota(argv, adjust), "{argv:?}");
            match got {
                Ok(call) => assert_quota_in_bounds(&call.quota, call.amount, adjust),
                Err(e) => assert_contract_text(&e, argv),
            }
        }
        Command::Charge => check_charge(argv, memos),
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

fn assert_quota_in_bounds(q: &Quota, amount: f64, adjust: bool) {
    assert!(q.limit > 0.0 && q.limit <= MAX_CAPACITY, "{q:?}");
    if let Period::Seconds(s) = q.period {
        assert!((1..=MAX_PERIOD_SECONDS).contains(&s), "{q:?}");
    }
    let most = MAX_OFFSET_MINUTES * 60;
    assert!(
        (-most..=most).contains(&q.offset_s) && q.offset_s % 60 == 0,
        "{q:?}"
    );
    if adjust {
        assert!(amount.is_finite(), "delta {amount}");
    } else {
        assert!((0.0..=q.limit).contains(&amount), "cost {amount} of {q:?}");
    }
}

/// An error's text is one of the contract's messages (`contract/contract.json`,
/// generated into `tb_core::contract::msg`), its `{placeholders}` filled.
fn assert_contract_text(e: &Error, argv: &[&[u8]]) {
    let text = e.to_string();
    let templates = [
        msg::ARITY,
        msg::NOT_A_NUMBER,
        msg::MAX_OUT_OF_RANGE,
        msg::RATE_OUT_OF_RANGE,
        msg::FILL_TOO_SLOW,
        msg::COST_NEGATIVE,
        msg::COST_ABOVE_MAX,
        msg::COST_TOO_SMALL,
        msg::LIMIT_OUT_OF_RANGE,
        msg::COST_ABOVE_LIMIT,
        msg::QUOTA_COST_TOO_SMALL,
        msg::BAD_PERIOD,
        msg::EXPECTED_OFFSET,
        msg::EXPECTED_WAIT,
        msg::EXPECTED_CLAUSE,
        msg::TOO_MANY_GROUPS,
        msg::DUPLICATE_KEY,
        msg::NOT_AN_INTEGER,
        msg::TOO_SMALL,
        msg::INT_OUT_OF_RANGE,
    ];
    assert!(
        !text.contains('{') && templates.iter().any(|t| fills(t, &text)),
        "{text:?} is none of the contract's messages, for {argv:?}"
    );
}

/// Whether `text` is `template` with each `{name}` replaced by some run of
/// characters (maybe none): the first literal a prefix, the last a suffix,
/// the ones between found in order.
fn fills(template: &str, text: &str) -> bool {
    let mut literals = Vec::new();
    let mut rest = template;
    while let Some((literal, after)) = rest.split_once('{') {
        literals.push(literal);
        match after.split_once('}') {
            Some((_, r)) => rest = r,
            None => return false,
        }
    }
    literals.push(rest);
    let [first, middle @ .., last] = &literals[..] else {
        return text == rest;
    };
    let Some(mut body) = text.strip_prefix(first).and_then(|b| b.strip_suffix(last)) else {
        return false;
    };
    for literal in middle {
        match body.find(literal) {
            Some(at) => body = &body[at + literal.len()..],
            None => return false,
        }
    }
    true
}

/// TB.CHARGE: exactly the reference; what it accepts is within the
/// documented bounds of each clause, and its keys are the counted ones the
/// key specs declare, whatever the clauses hold.
fn check_charge(argv: &[&[u8]], memos: &Memos) {
    let positions = charge_key_positions(argv);
    assert!(
        positions.iter().all(|&p| p >= 2 && p < argv.len()),
        "{argv:?}"
    );
    let got = parse_charge(argv, memos);
    assert_eq!(got, reference_charge(argv), "{argv:?}");
    match got {
        Ok(call) => {
            assert!(!call.clauses.is_empty() && call.clauses.len() <= MAX_GROUPS);
            for c in &call.clauses {
                match c.limit {
                    Limit::Bucket(l) => {
                        assert_limits_in_bounds(&l);
                        assert_cost_in_bounds(c.cost, &l);
                    }
                    Limit::Quota(q) => assert_quota_in_bounds(&q, c.cost, false),
                }
            }
            let keys: Vec<usize> = call.clauses.iter().map(|c| c.key_index).collect();
            assert_eq!(positions, keys, "{argv:?}");
            if let Some(ms) = call.wait_ms {
                assert!((0..=MAX_WAIT_MS).contains(&ms), "{argv:?}");
            }
        }
        Err(e) => assert_contract_text(&e, argv),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_matches_a_template_and_nothing_else() {
        let t = msg::DUPLICATE_KEY;
        assert!(fills(
            t,
            "ERR duplicate key: group 3 repeats the key of group 1"
        ));
        assert!(!fills(t, "ERR duplicate key: group 3 repeats the key"));
        assert!(!fills(
            t,
            "ERR duplicate keys: group 3 repeats the key of group 1"
        ));
        assert!(fills(
            msg::BAD_PERIOD,
            &Error::BadPeriod(Some(2)).to_string()
        ));
        assert!(fills(msg::BAD_PERIOD, &Error::BadPeriod(None).to_string()));
        assert!(!fills(
            msg::LIMIT_OUT_OF_RANGE,
            &Error::BadPeriod(None).to_string()
        ));
        assert!(fills(msg::TOO_MANY_GROUPS, msg::TOO_MANY_GROUPS));
        assert!(!fills(msg::TOO_MANY_GROUPS, "ERR too many buckets"));
    }
}
