//! TB.CHARGE's arguments: `numkeys key [key ...] [WAIT max_ms]` and one
//! clause per key, in order: `BUCKET max rate cost` or `QUOTA limit period
//! cost [OFFSET minutes]`. The keys come first, counted, so the key specs
//! declare them exactly whatever the clauses hold. Checked left to right
//! (the Lua library reports the same first error): `numkeys`, the count,
//! `WAIT`, each clause (its keyword, then its numbers, as TB.MCONSUME and
//! TB.QUOTA check theirs), the arguments left over, then keys that repeat.

use super::{Clause, Limit};
use crate::args::{first_duplicate_by, group_cost, group_limits, Argv, Memos};
use crate::contract::{MAX_GROUPS, MAX_WAIT_MS};
use crate::error::{Arg, Error};
use crate::number::parse_i64;
use crate::quota::{self, Quota};

/// A validated TB.CHARGE.
#[derive(Clone, Debug, PartialEq)]
pub struct Charge {
    /// `WAIT max_ms`: buckets may admit reservations.
    pub wait_ms: Option<i64>,
    pub clauses: Vec<Clause>,
}

/// Where the key count is; the keys follow it.
pub const NUMKEYS_INDEX: usize = 1;

/// Where TB.CHARGE's keys are, for any argv (Redis asks before the
/// arguments are checked): as many as `numkeys` says, as far as there are
/// arguments.
pub fn charge_key_positions(argv: &(impl Argv + ?Sized)) -> Vec<usize> {
    let n = argv.count();
    let count = (n > NUMKEYS_INDEX)
        .then(|| parse_i64(argv.arg(NUMKEYS_INDEX)))
        .flatten()
        .and_then(|c| usize::try_from(c).ok())
        .unwrap_or(0);
    let first = NUMKEYS_INDEX + 1;
    (first..n.min(first.saturating_add(count))).collect()
}

fn keyword(argv: &(impl Argv + ?Sized), at: usize, word: &[u8]) -> bool {
    at < argv.count() && argv.arg(at).eq_ignore_ascii_case(word)
}

/// Whether the argument at `at` starts a clause (`BUCKET` or `QUOTA`).
pub(crate) fn is_clause_keyword(argv: &(impl Argv + ?Sized), at: usize) -> bool {
    keyword(argv, at, b"BUCKET") || keyword(argv, at, b"QUOTA")
}

/// The clause (group `group`, on the key at `key_index`) whose keyword is
/// at `at` and whose three numbers start at `from`: TB.CHARGE's follow
/// the keyword, TB.ACQUIRE's its key. Its keyword, then its numbers, as
/// TB.MCONSUME and TB.QUOTA check theirs, then a quota's `OFFSET`. Returns
/// the clause and where the next one starts; the caller has checked that
/// the numbers are there.
pub(crate) fn clause_at(
    argv: &(impl Argv + ?Sized),
    at: usize,
    from: usize,
    key_index: usize,
    group: usize,
    memos: &Memos,
) -> Result<(Clause, usize), Error> {
    let label = Some(group);
    let mut next = from + 3;
    let (limit, cost) = if keyword(argv, at, b"BUCKET") {
        let limits = group_limits(argv, from, label, memos)?;
        let cost = group_cost(argv.arg(from + 2), &limits, label)?;
        (Limit::Bucket(limits), cost)
    } else if keyword(argv, at, b"QUOTA") {
        let limit = quota::args::limit(argv.arg(from), label)?;
        let period = quota::args::period(argv.arg(from + 1), label)?;
        let cost = quota::args::cost(argv.arg(from + 2), limit, label)?;
        let mut offset_s = 0;
        if keyword(argv, next, b"OFFSET") {
            if next + 1 >= argv.count() {
                return Err(Error::Arity(argv.command()));
            }
            offset_s = quota::args::offset(argv, next)?;
            next += 2;
        }
        let quota = Quota {
            limit,
            period,
            offset_s,
        };
        (Limit::Quota(quota), cost)
    } else {
        return Err(Error::ExpectedClause(at));
    };
    let clause = Clause {
        key_index,
        limit,
        cost,
    };
    Ok((clause, next))
}

/// `TB.CHARGE numkeys key [key ...] [WAIT max_ms] clause [clause ...]`.
pub fn parse_charge(argv: &(impl Argv + ?Sized), memos: &Memos) -> Result<Charge, Error> {
    let n = argv.count();
    if n < 4 {
        return Err(Error::Arity(argv.command()));
    }
    let count = parse_i64(argv.arg(NUMKEYS_INDEX)).ok_or(Error::NotAnInteger(Arg::Numkeys))?;
    if count < 1 {
        return Err(Error::TooSmall(Arg::Numkeys, 1));
    }
    let count = usize::try_from(count).map_err(|_| Error::TooManyGroups)?;
    if count > MAX_GROUPS {
        return Err(Error::TooManyGroups);
    }
    let mut at = NUMKEYS_INDEX + 1 + count;
    if at >= n {
        return Err(Error::Arity(argv.command()));
    }
    let mut wait_ms = None;
    if keyword(argv, at, b"WAIT") {
        if at + 1 >= n {
            return Err(Error::Arity(argv.command()));
        }
        let ms = parse_i64(argv.arg(at + 1)).ok_or(Error::NotAnInteger(Arg::MaxMs))?;
        if !(0..=MAX_WAIT_MS).contains(&ms) {
            return Err(Error::IntOutOfRange(Arg::MaxMs, 0, MAX_WAIT_MS));
        }
        wait_ms = Some(ms);
        at += 2;
    }
    let mut clauses = Vec::with_capacity(count);
    for g in 0..count {
        if at + 3 >= n {
            return Err(Error::Arity(argv.command()));
        }
        let (clause, next) = clause_at(argv, at, at + 1, NUMKEYS_INDEX + 1 + g, g + 1, memos)?;
        clauses.push(clause);
        at = next;
    }
    if at != n {
        return Err(Error::Arity(argv.command()));
    }
    if let Some((group, first)) = first_duplicate_by(argv, count, |g| clauses[g].key_index) {
        return Err(Error::DuplicateKey { group, first });
    }
    Ok(Charge { wait_ms, clauses })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::CHARGE;
    use crate::quota::Period;

    fn parse(s: &[&str]) -> Result<Charge, Error> {
        parse_charge(s, &Memos::new())
    }

    #[test]
    fn clauses_follow_the_keys_in_order() {
        let c = parse(&[
            "tb.charge",
            "2",
            "m",
            "q",
            "WAIT",
            "250",
            "BUCKET",
            "60",
            "1",
            "1",
            "quota",
            "1000",
            "MONTH",
            "7",
            "OFFSET",
            "60",
        ])
        .unwrap();
        assert_eq!(c.wait_ms, Some(250));
        assert_eq!(c.clauses[0].key_index, 2);
        assert!(matches!(c.clauses[0].limit, Limit::Bucket(l) if l.max == 60.0));
        assert_eq!(c.clauses[1].cost, 7.0);
        assert!(
            matches!(c.clauses[1].limit, Limit::Quota(q) if q.period == Period::Month && q.offset_s == 3600)
        );
        assert_eq!(
            charge_key_positions(&["tb.charge", "2", "m", "q", "WAIT"][..]),
            [2, 3]
        );
        assert_eq!(charge_key_positions(&["tb.charge", "9", "m"][..]), [2]);
        assert!(charge_key_positions(&["tb.charge", "x", "m"][..]).is_empty());
    }

    #[test]
    fn errors_name_the_argument_and_the_clause() {
        let cases: [(&[&str], Error); 9] = [
            (&["tb.charge", "1", "k"], Error::Arity(CHARGE)),
            (
                &["tb.charge", "x", "k", "BUCKET", "1", "1", "1"],
                Error::NotAnInteger(Arg::Numkeys),
            ),
            (
                &["tb.charge", "0", "k", "BUCKET", "1", "1", "1"],
                Error::TooSmall(Arg::Numkeys, 1),
            ),
            (
                &["tb.charge", "1", "k", "BUCKETS", "1", "1", "1"],
                Error::ExpectedClause(3),
            ),
            (
                &["tb.charge", "1", "k", "BUCKET", "1", "1", "1", "1"],
                Error::Arity(CHARGE),
            ),
            (
                &["tb.charge", "1", "k", "QUOTA", "5", "DAY", "6"],
                Error::CostAboveLimit(Some(1)),
            ),
            (
                &[
                    "tb.charge",
                    "2",
                    "a",
                    "b",
                    "BUCKET",
                    "1",
                    "1",
                    "1",
                    "QUOTA",
                    "0",
                    "DAY",
                    "1",
                ],
                Error::LimitOutOfRange(Some(2)),
            ),
            (
                &[
                    "tb.charge",
                    "2",
                    "a",
                    "a",
                    "BUCKET",
                    "1",
                    "1",
                    "1",
                    "QUOTA",
                    "1",
                    "DAY",
                    "1",
                ],
                Error::DuplicateKey { group: 2, first: 1 },
            ),
            (
                &["tb.charge", "1", "k", "WAIT", "x", "BUCKET", "1", "1", "1"],
                Error::NotAnInteger(Arg::MaxMs),
            ),
        ];
        for (argv, want) in cases {
            assert_eq!(parse(argv).err(), Some(want), "{argv:?}");
        }
    }
}
