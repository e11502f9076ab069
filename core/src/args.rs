//! The bucket commands' arguments: TB.CONSUME and TB.PEEK, TB.ADJUST, and
//! TB.MCONSUME, whose `key max rate cost` groups TB.ACQUIRE's `BUCKET`
//! clauses share. The lease commands' own arguments are in `lease::args`,
//! CL.THROTTLE's in `cell`. `Memos` remembers the last arguments that
//! validated.
//!
//! Works on raw byte slices read in place (`argv[0]` is the command name),
//! so keys and numbers are binary-safe. Validation order is part of the
//! contract, since the Lua library must report the same first error: arity
//! (and TB.MCONSUME's group count), then each group left to right (`max`,
//! `rate`, the fill-time bound, `cost`/`delta`), then duplicate keys.

use crate::bucket::{Fresh, Limits};
use crate::contract::{
    COMMANDS, CONSUME, MAX_CAPACITY, MAX_FILL_SECONDS, MAX_GROUPS, MAX_RATE, MAX_WAIT_MS,
};
use crate::error::{Arg, Error};
use crate::number::parse_decimal;
use std::cell::RefCell;
use std::ffi::CStr;

/// Whether a positive `cost` is too small to charge a bucket of this `max`:
/// subtracting it from some balance an admitted call can see (one in
/// `[cost, max]`) rounds back to that balance, so the call would be
/// admitted without charging anything, forever. That happens below about
/// `max * 1.1e-16`. The balances where rounding keeps the most are the top
/// two doubles up to `max` (the largest gaps, and one of them has an even
/// mantissa, which wins a tie), so checking those two is exact.
pub fn charges_nothing(cost: f64, max: f64) -> bool {
    let below = max.next_down();
    cost > 0.0 && (max - cost == max || below - cost == below)
}

/// Command arguments, `argv[0]` being the command name.
pub trait Argv {
    fn count(&self) -> usize;
    fn arg(&self, i: usize) -> &[u8];
    /// The command, as registered: what an arity error names. The module
    /// knows it from its command table; this default finds `argv[0]`
    /// among the contract's commands (any case), else names TB.CONSUME.
    fn command(&self) -> &'static CStr {
        let name = if self.count() > 0 { self.arg(0) } else { &[] };
        COMMANDS
            .into_iter()
            .find(|c| c.to_bytes().eq_ignore_ascii_case(name))
            .unwrap_or(CONSUME)
    }
}

impl<T: AsRef<[u8]>> Argv for [T] {
    fn count(&self) -> usize {
        self.len()
    }
    fn arg(&self, i: usize) -> &[u8] {
        self[i].as_ref()
    }
}

/// A validated single-bucket call; its key is `argv[1]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Single {
    pub limits: Limits,
    /// `cost` for CONSUME/PEEK, `delta` for ADJUST.
    pub amount: f64,
    /// TB.CONSUME's charge of a new key, worked out with the arguments
    /// (see `Limits::fresh`): the memo keeps it with them.
    pub fresh: Option<Fresh>,
    /// `WAIT max_ms`: a reservation's longest wait (see `Limits::reserve`).
    pub wait_ms: Option<i64>,
}

/// One validated TB.MCONSUME group.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Group {
    pub key_index: usize,
    pub limits: Limits,
    pub cost: f64,
}

fn number(bytes: &[u8], arg: Arg, group: Option<usize>) -> Result<f64, Error> {
    parse_decimal(bytes).ok_or(Error::NotANumber(arg, group))
}

/// `max` and `rate` at `argv[i]`, `argv[i + 1]`.
pub(crate) fn group_limits(
    argv: &(impl Argv + ?Sized),
    i: usize,
    g: Option<usize>,
    memos: &Memos,
) -> Result<Limits, Error> {
    let (max, rate) = (argv.arg(i), argv.arg(i + 1));
    let args = [Some(max), Some(rate)];
    if let Some(limits) = Memo::get(&memos.limits.borrow(), args) {
        return Ok(limits);
    }
    let limits = validate_limits(max, rate, g)?;
    *memos.limits.borrow_mut() = Memo::new(args, limits);
    Ok(limits)
}

/// The last arguments that validated, by their bytes, and what they gave.
/// A gateway calls with a handful of tiers, so most calls repeat the
/// previous call's numbers, and checking them again (decimals, the bounds,
/// a division) was the largest part of the module's own work. Validation
/// is a pure function of the bytes, so a memo can't change an answer; only
/// successes are kept.
#[derive(Clone, Copy)]
struct Memo<T: Copy, const N: usize> {
    slots: [Slot; N],
    value: T,
}

/// One remembered argument: its bytes, zero-padded, and its length
/// (`ABSENT` for an optional argument not given).
#[derive(Clone, Copy)]
struct Slot {
    len: u8,
    bytes: [u8; SLOT],
}

/// Longer arguments are validated every time.
const SLOT: usize = 16;

/// The length of an optional argument that was not given: no real one,
/// which is at most `SLOT`.
const ABSENT: u8 = u8::MAX;

impl Slot {
    fn new(arg: Option<&[u8]>) -> Option<Self> {
        let mut slot = Slot {
            len: ABSENT,
            bytes: [0; SLOT],
        };
        if let Some(arg) = arg {
            slot.bytes.get_mut(..arg.len())?.copy_from_slice(arg);
            slot.len = u8::try_from(arg.len()).ok()?;
        }
        Some(slot)
    }

    /// Whether `arg` is the remembered argument. An argument is a handful
    /// of bytes, so they compare as two words that overlap (a byte loop,
    /// or a call to memcmp, costs more than the comparison).
    #[inline(always)]
    fn holds(&self, arg: Option<&[u8]>) -> bool {
        let Some(arg) = arg else {
            return self.len == ABSENT;
        };
        let n = arg.len();
        if n != usize::from(self.len) {
            return false;
        }
        let kept = &self.bytes;
        match n {
            0 => true,
            1..=3 => {
                (arg[0] == kept[0]) & (arg[n / 2] == kept[n / 2]) & (arg[n - 1] == kept[n - 1])
            }
            4..=7 => {
                (word::<4>(arg, 0) == word(kept, 0)) & (word::<4>(arg, n - 4) == word(kept, n - 4))
            }
            _ => {
                (word::<8>(arg, 0) == word(kept, 0)) & (word::<8>(arg, n - 8) == word(kept, n - 8))
            }
        }
    }
}

/// The `W` bytes of `s` at `at` (zeros past its end, which callers rule out).
#[inline(always)]
fn word<const W: usize>(s: &[u8], at: usize) -> [u8; W] {
    s.get(at..at + W)
        .and_then(|w| <[u8; W]>::try_from(w).ok())
        .unwrap_or([0; W])
}

impl<T: Copy, const N: usize> Memo<T, N> {
    /// What `args` gave last time, if they are the memo's (`None`: an
    /// optional argument not given).
    #[inline(always)]
    fn get(last: &Option<Self>, args: [Option<&[u8]>; N]) -> Option<T> {
        let last = last.as_ref()?;
        let same = last
            .slots
            .iter()
            .zip(args)
            .all(|(slot, arg)| slot.holds(arg));
        same.then_some(last.value)
    }

    /// A memo of `args` giving `value`; `None` if one doesn't fit.
    fn new(args: [Option<&[u8]>; N], value: T) -> Option<Self> {
        let mut slots = [Slot::new(None)?; N];
        for (slot, arg) in slots.iter_mut().zip(args) {
            *slot = Slot::new(arg)?;
        }
        Some(Memo { slots, value })
    }
}

/// The last `max rate` and the last `max rate [cost]` that validated
/// (`Memo`), for one caller's calls in turn. The caller keeps the store and
/// lends it to each parse beside the arguments: the module keeps one for
/// every command call, in a static that needs no thread-local look-up (a
/// call of `__tls_get_addr` in a library Redis loads).
pub struct Memos {
    limits: RefCell<Option<Memo<Limits, 2>>>,
    single: RefCell<Option<Memo<Single, 3>>>,
}

impl Memos {
    pub const fn new() -> Self {
        Memos {
            limits: RefCell::new(None),
            single: RefCell::new(None),
        }
    }
}

impl Default for Memos {
    fn default() -> Self {
        Self::new()
    }
}

/// `max` and `rate` checked in the contract's order.
fn validate_limits(max: &[u8], rate: &[u8], g: Option<usize>) -> Result<Limits, Error> {
    let max = number(max, Arg::Max, g)?;
    if !(max > 0.0 && max <= MAX_CAPACITY) {
        return Err(Error::MaxOutOfRange(g));
    }
    let rate = number(rate, Arg::Rate, g)?;
    if !(rate > 0.0 && rate <= MAX_RATE) {
        return Err(Error::RateOutOfRange(g));
    }
    if max / rate > MAX_FILL_SECONDS {
        return Err(Error::FillTooSlow(g));
    }
    Ok(Limits { max, rate })
}

pub(crate) fn group_cost(bytes: &[u8], limits: &Limits, g: Option<usize>) -> Result<f64, Error> {
    let cost = number(bytes, Arg::Cost, g)?;
    if cost < 0.0 {
        return Err(Error::CostNegative(g));
    }
    if cost > limits.max {
        return Err(Error::CostAboveMax(g));
    }
    if charges_nothing(cost, limits.max) {
        return Err(Error::CostTooSmall(g));
    }
    Ok(cost)
}

/// `TB.CONSUME key max rate [cost] [WAIT max_ms]` and `TB.PEEK`, same
/// shape. `WAIT` is a keyword, so that its time can't be taken for the
/// cost.
pub fn parse_consume(argv: &(impl Argv + ?Sized), memos: &Memos) -> Result<Single, Error> {
    let n = argv.count();
    if !(4..=5).contains(&n) {
        return parse_reservation(argv, n, memos);
    }
    // The whole call's numbers at once: one look-up where most calls end.
    let cost = (n == 5).then(|| argv.arg(4));
    let args = [Some(argv.arg(2)), Some(argv.arg(3)), cost];
    if let Some(single) = Memo::get(&memos.single.borrow(), args) {
        return Ok(single);
    }
    let single = validate_consume(argv, n, memos)?;
    *memos.single.borrow_mut() = Memo::new(args, single);
    Ok(single)
}

/// `parse_consume` after the arity check, without its memo of the whole
/// call (`memos` still answers for `max rate`).
fn validate_consume(argv: &(impl Argv + ?Sized), n: usize, memos: &Memos) -> Result<Single, Error> {
    let limits = group_limits(argv, 2, None, memos)?;
    let amount = if n == 5 {
        group_cost(argv.arg(4), &limits, None)?
    } else if limits.max < 1.0 {
        // The default cost of 1 could never pass a bucket this small.
        return Err(Error::CostAboveMax(None));
    } else {
        1.0
    };
    Ok(Single {
        limits,
        amount,
        fresh: limits.fresh(amount),
        wait_ms: None,
    })
}

/// `parse_consume` of a call with `WAIT max_ms` (6 or 7 arguments),
/// checked left to right after the call it extends.
fn parse_reservation(
    argv: &(impl Argv + ?Sized),
    n: usize,
    memos: &Memos,
) -> Result<Single, Error> {
    if !(6..=7).contains(&n) {
        return Err(Error::Arity(argv.command()));
    }
    let at = n - 2;
    let single = validate_consume(argv, at, memos)?;
    if !argv.arg(at).eq_ignore_ascii_case(b"WAIT") {
        return Err(Error::ExpectedWait(at));
    }
    let max_ms =
        crate::number::parse_i64(argv.arg(at + 1)).ok_or(Error::NotAnInteger(Arg::MaxMs))?;
    if !(0..=MAX_WAIT_MS).contains(&max_ms) {
        return Err(Error::IntOutOfRange(Arg::MaxMs, 0, MAX_WAIT_MS));
    }
    Ok(Single {
        wait_ms: Some(max_ms),
        ..single
    })
}

/// `TB.ADJUST key max rate delta`.
pub fn parse_adjust(argv: &(impl Argv + ?Sized), memos: &Memos) -> Result<Single, Error> {
    if argv.count() != 5 {
        return Err(Error::Arity(argv.command()));
    }
    let limits = group_limits(argv, 2, None, memos)?;
    let amount = number(argv.arg(4), Arg::Delta, None)?;
    Ok(Single {
        limits,
        amount,
        fresh: None,
        wait_ms: None,
    })
}

/// `TB.MCONSUME key max rate cost [key max rate cost ...]`.
pub fn parse_mconsume(argv: &(impl Argv + ?Sized), memos: &Memos) -> Result<Vec<Group>, Error> {
    let n = argv.count();
    if n < 5 || !(n - 1).is_multiple_of(4) {
        return Err(Error::Arity(argv.command()));
    }
    let count = (n - 1) / 4;
    if count > MAX_GROUPS {
        return Err(Error::TooManyGroups);
    }
    let groups = parse_groups(argv, (0..count).map(|g| 1 + 4 * g), memos)?;
    if let Some((group, first)) = first_duplicate(argv, &groups) {
        return Err(Error::DuplicateKey { group, first });
    }
    Ok(groups)
}

/// Groups of `key max rate cost` whose keys are at `key_indices`, checked
/// in order (each group's `max`, `rate`, fill time, then `cost`), labelled
/// 1, 2, ... in their errors: TB.MCONSUME's groups and TB.ACQUIRE's
/// `BUCKET` clauses.
pub(crate) fn parse_groups(
    argv: &(impl Argv + ?Sized),
    key_indices: impl ExactSizeIterator<Item = usize>,
    memos: &Memos,
) -> Result<Vec<Group>, Error> {
    let mut groups = Vec::with_capacity(key_indices.len());
    for (g, key_index) in key_indices.enumerate() {
        let label = Some(g + 1);
        let limits = group_limits(argv, key_index + 1, label, memos)?;
        let cost = group_cost(argv.arg(key_index + 3), &limits, label)?;
        groups.push(Group {
            key_index,
            limits,
            cost,
        });
    }
    Ok(groups)
}

/// The earliest group (1-based) whose key appeared before, and that earlier
/// group: what a left-to-right scan would report, in O(n log n).
pub(crate) fn first_duplicate(
    argv: &(impl Argv + ?Sized),
    groups: &[Group],
) -> Option<(usize, usize)> {
    first_duplicate_by(argv, groups.len(), |g| groups[g].key_index)
}

/// `first_duplicate` for `count` groups whose keys are at `key_index(g)`.
pub(crate) fn first_duplicate_by(
    argv: &(impl Argv + ?Sized),
    count: usize,
    key_index: impl Fn(usize) -> usize,
) -> Option<(usize, usize)> {
    let mut order: Vec<usize> = (0..count).collect();
    order.sort_by(|&a, &b| {
        argv.arg(key_index(a))
            .cmp(argv.arg(key_index(b)))
            .then(a.cmp(&b))
    });
    let key = |p: usize| argv.arg(key_index(order[p]));
    // In a run of equal keys (sorted by position) the second member is that
    // key's earliest repeat and the first member is its original.
    (1..order.len())
        .filter(|&p| key(p) == key(p - 1) && (p < 2 || key(p - 2) != key(p - 1)))
        .map(|p| (order[p] + 1, order[p - 1] + 1))
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{ADJUST, MCONSUME};

    fn argv(s: &[&str]) -> Vec<Vec<u8>> {
        s.iter().map(|a| a.as_bytes().to_vec()).collect()
    }

    #[test]
    fn consume_defaults_cost_to_one() {
        let memos = Memos::new();
        let a = parse_consume(argv(&["tb.consume", "k", "10", "0.17"]).as_slice(), &memos).unwrap();
        assert_eq!(
            a.limits,
            Limits {
                max: 10.0,
                rate: 0.17
            }
        );
        assert_eq!(a.amount, 1.0);
        assert_eq!(
            parse_consume(argv(&["tb.consume", "k", "0.5", "1"]).as_slice(), &memos),
            Err(Error::CostAboveMax(None))
        );
    }

    #[test]
    fn arguments_are_remembered_where_their_caller_says() {
        let (own, another) = (Memos::new(), Memos::new());
        let call = argv(&["tb.consume", "k", "7", "0.25", "2"]);
        let single = parse_consume(call.as_slice(), &own).unwrap();
        assert!(own.single.borrow().is_some() && own.limits.borrow().is_some());
        // Another store saw nothing of it.
        assert!(another.single.borrow().is_none() && another.limits.borrow().is_none());
        // The lent memo answers the same call again.
        assert_eq!(parse_consume(call.as_slice(), &own), Ok(single));
        let other = argv(&["tb.consume", "k", "8", "0.25", "2"]);
        assert_eq!(
            parse_consume(other.as_slice(), &own).unwrap().limits.max,
            8.0
        );
        assert_eq!(
            own.single.borrow().as_ref().map(|m| m.value.limits.max),
            Some(8.0)
        );
    }

    #[test]
    fn errors_name_the_argument() {
        let cases = [
            (vec!["c", "k", "10"], Error::Arity(CONSUME)),
            (vec!["c", "k", "10", "1", "1", "1"], Error::ExpectedWait(4)),
            (
                vec!["c", "k", "10", "1", "1", "1", "1", "1"],
                Error::Arity(CONSUME),
            ),
            (
                vec!["c", "k", "10", "1", "1", "WAIT", "-1"],
                Error::IntOutOfRange(Arg::MaxMs, 0, MAX_WAIT_MS),
            ),
            (
                vec!["c", "k", "10", "1", "WAIT", "1.5"],
                Error::NotAnInteger(Arg::MaxMs),
            ),
            (vec!["c", "k", "x", "1"], Error::NotANumber(Arg::Max, None)),
            (
                vec!["c", "k", "nan", "1"],
                Error::NotANumber(Arg::Max, None),
            ),
            (vec!["c", "k", "0", "1"], Error::MaxOutOfRange(None)),
            (vec!["c", "k", "1e13", "1"], Error::MaxOutOfRange(None)),
            (
                vec!["c", "k", "10", "inf"],
                Error::NotANumber(Arg::Rate, None),
            ),
            (vec!["c", "k", "10", "-1"], Error::RateOutOfRange(None)),
            (vec!["c", "k", "1e12", "1"], Error::FillTooSlow(None)),
            (
                vec!["c", "k", "10", "1", "0x1"],
                Error::NotANumber(Arg::Cost, None),
            ),
            (vec!["c", "k", "10", "1", "-1"], Error::CostNegative(None)),
            (vec!["c", "k", "10", "1", "11"], Error::CostAboveMax(None)),
            (
                vec!["c", "k", "1e12", "1000", "0.00001"],
                Error::CostTooSmall(None),
            ),
        ];
        let memos = Memos::new();
        for (a, e) in cases {
            assert_eq!(parse_consume(argv(&a).as_slice(), &memos), Err(e), "{a:?}");
        }
        assert_eq!(
            Error::NotANumber(Arg::Rate, Some(2)).to_string(),
            "ERR rate must be a finite decimal number (group 2)"
        );
    }

    #[test]
    fn a_positive_cost_always_charges() {
        let mut rng = testkit::Rng(0x9E37_79B9_7F4A_7C15);
        let mut maxes = vec![1e12, 10.0, 1.0, 0.5, 3.0, f64::MIN_POSITIVE, 5e-324];
        // Just above a power of two: there the gap below max is twice the
        // gap below the next balance.
        maxes.extend([1.0f64.next_up(), 1024.0f64.next_up(), 0.5f64.next_up()]);
        for _ in 0..100_000 {
            maxes.push(f64::from_bits(rng.next() >> 2).min(MAX_CAPACITY));
        }
        for max in maxes {
            let l = Limits { max, rate: 1.0 };
            // Balances an admitted call can see, the largest first.
            let mut balances = vec![max];
            for _ in 0..4 {
                let b = balances[balances.len() - 1].next_down();
                balances.push(b);
            }
            balances.extend([max / 2.0, max / 3.0]);
            let half_gap = (max - max.next_down()) / 2.0;
            for c in [
                half_gap.next_down(),
                half_gap,
                half_gap.next_up(),
                half_gap * 2.0,
            ] {
                if c <= 0.0 || c > max {
                    continue;
                }
                let unchanged = balances.iter().any(|&b| b >= c && b - c == b);
                let parsed = group_cost(format!("{c:e}").as_bytes(), &l, None);
                if unchanged {
                    assert_eq!(
                        parsed,
                        Err(Error::CostTooSmall(None)),
                        "max {max:e} cost {c:e}"
                    );
                } else {
                    assert_eq!(parsed, Ok(c), "max {max:e} cost {c:e}");
                }
            }
            // The advice in the message: max/2^53 is accepted wherever it
            // is exact (it is not for max below 2^-969).
            let advice = max / 9_007_199_254_740_992.0;
            if advice >= f64::MIN_POSITIVE {
                assert_eq!(
                    group_cost(format!("{advice:e}").as_bytes(), &l, None),
                    Ok(advice)
                );
            }
        }
        assert_eq!(
            1e12 - 0.00001,
            1e12,
            "a cost of 1e-5 charges nothing at max 1e12"
        );
        assert_eq!(
            Error::CostTooSmall(Some(3)).to_string(),
            "ERR cost is too small to charge a bucket of this max: use 0 or at least max/2^53 (group 3)"
        );
    }

    #[test]
    fn a_slot_holds_exactly_its_argument() {
        // Every length the word comparisons treat differently, and a change
        // at every position: one differing byte is always seen, and a
        // given argument never matches an absent one.
        for len in 0..=SLOT {
            let arg: Vec<u8> = (0..len).map(|i| b'0' + (i % 10) as u8).collect();
            let slot = Slot::new(Some(&arg)).unwrap();
            assert!(slot.holds(Some(&arg)), "len {len}");
            assert!(!slot.holds(None), "len {len}");
            for at in 0..len {
                let mut other = arg.clone();
                other[at] ^= 0x01;
                assert!(!slot.holds(Some(&other)), "len {len}, byte {at}");
            }
            for other_len in [len.saturating_sub(1), len + 1] {
                if other_len != len {
                    assert!(!slot.holds(Some(&vec![b'0'; other_len])), "len {len}");
                }
            }
        }
        let absent = Slot::new(None).unwrap();
        assert!(absent.holds(None) && !absent.holds(Some(b"")));
        assert!(Slot::new(Some(&[b'1'; SLOT + 1])).is_none());
    }

    #[test]
    fn remembered_limits_answer_as_validation_does() {
        // Alternating valid and invalid limits, repeated and not: the memo
        // never turns an error into limits or changes them.
        let pairs = [
            ("10", "1"),
            ("10", "1"),
            ("10", "x"),
            ("10", "1"),
            ("1e12", "1"),
            ("10", "10"),
            ("1", "10"),
            ("10", "1"),
            ("0", "1"),
            ("10", "1"),
        ];
        let memos = Memos::new();
        for (max, rate) in pairs.iter().cycle().take(40) {
            let a = argv(&["c", "k", max, rate]);
            assert_eq!(
                group_limits(a.as_slice(), 2, None, &memos),
                validate_limits(max.as_bytes(), rate.as_bytes(), None),
                "{max} {rate}"
            );
        }
        let long = "1".repeat(40);
        let a = argv(&["c", "k", &long, "1e-30"]);
        assert_eq!(
            group_limits(a.as_slice(), 2, None, &memos),
            Err(Error::MaxOutOfRange(None))
        );
    }

    #[test]
    fn remembered_calls_answer_as_validation_does() {
        // Sequences of calls drawn from a small pool, so repeats (the memo's
        // hits) and changes of one argument are frequent: every answer is
        // the unremembered one. The pool has a cost argument that is given
        // but empty, which must never match a call without one.
        let pool: &[&[&str]] = &[
            &["10", "1"],
            &["10", "1", "1"],
            &["10", "1", ""],
            &["10", "1", "2"],
            &["0.5", "1"],
            &["0.5", "1", "0.5"],
            &["10", "x", "1"],
            &["1e12", "1000", "0.00001"],
            &["1e12", "1000", "1"],
            &["10", "1", "11"],
            &["10", "1", "-1"],
            &["1", "10"],
            &["1", "10", "1"],
            &["100", "0.01"],
            &["10", "1", "1", "9"],
            &["10", "1", "1", "WAIT", "9"],
            &["10", "1", "wait", "0"],
            &["10", "1", "WAIT", "x"],
            &["10"],
        ];
        let mut rng = testkit::Rng(0x0DDB_1A5E_5BAD_5EED);
        let memos = Memos::new();
        for _ in 0..20_000 {
            let pick = pool[rng.index(pool.len())];
            let mut words = vec!["tb.consume", "k"];
            words.extend_from_slice(pick);
            let a = argv(&words);
            let n = a.len();
            let expected = if (4..=5).contains(&n) {
                validate_consume(a.as_slice(), n, &Memos::new())
            } else {
                parse_reservation(a.as_slice(), n, &Memos::new())
            };
            assert_eq!(parse_consume(a.as_slice(), &memos), expected, "{pick:?}");
        }
        // Too long to remember: validated every time, still the same answer.
        let long = "1".repeat(SLOT + 1);
        let a = argv(&["c", "k", &long, "0.1", &long]);
        assert_eq!(
            parse_consume(a.as_slice(), &memos),
            Err(Error::MaxOutOfRange(None))
        );
    }

    #[test]
    fn adjust_takes_a_signed_delta() {
        let memos = Memos::new();
        let a = parse_adjust(argv(&["a", "k", "10", "1", "-25.5"]).as_slice(), &memos).unwrap();
        assert_eq!(a.amount, -25.5);
        assert_eq!(
            parse_adjust(argv(&["a", "k", "10", "1", "nan"]).as_slice(), &memos),
            Err(Error::NotANumber(Arg::Delta, None))
        );
        assert_eq!(
            parse_adjust(argv(&["TB.ADJUST", "k", "10", "1"]).as_slice(), &memos),
            Err(Error::Arity(ADJUST))
        );
    }

    #[test]
    fn mconsume_groups_and_duplicates() {
        let memos = Memos::new();
        let ok = argv(&["m", "a", "10", "1", "1", "b", "5", "2", "0"]);
        let g = parse_mconsume(ok.as_slice(), &memos).unwrap();
        assert_eq!(g.len(), 2);
        assert_eq!(g[1].key_index, 5);
        assert_eq!(g[1].cost, 0.0);
        for bad in [
            vec!["tb.mconsume"],
            vec!["tb.mconsume", "a", "1", "1"],
            vec!["Tb.MConsume", "a", "1", "1", "1", "b"],
        ] {
            assert_eq!(
                parse_mconsume(argv(&bad).as_slice(), &memos),
                Err(Error::Arity(MCONSUME))
            );
        }
        let dup = argv(&[
            "m", "b", "1", "1", "1", "a", "1", "1", "1", "c", "1", "1", "1", "a", "1", "1", "1",
            "b", "1", "1", "1",
        ]);
        assert_eq!(
            parse_mconsume(dup.as_slice(), &memos),
            Err(Error::DuplicateKey { group: 4, first: 2 })
        );
        let bad_cost = argv(&["m", "a", "1", "1", "1", "b", "1", "1", "2"]);
        assert_eq!(
            parse_mconsume(bad_cost.as_slice(), &memos),
            Err(Error::CostAboveMax(Some(2)))
        );
    }

    #[test]
    fn mconsume_group_limit() {
        let memos = Memos::new();
        let mut a = vec!["m".to_string()];
        for i in 0..=MAX_GROUPS {
            a.extend([format!("k{i}"), "1".into(), "1".into(), "1".into()]);
        }
        assert_eq!(
            parse_mconsume(a.as_slice(), &memos),
            Err(Error::TooManyGroups)
        );
        a.truncate(a.len() - 4);
        assert_eq!(
            parse_mconsume(a.as_slice(), &memos).map(|g| g.len()),
            Ok(MAX_GROUPS)
        );
    }
}
