//! The lease commands' arguments: TB.ACQUIRE (with its `BUCKET` and
//! `QUOTA` clauses, TB.CHARGE's with their keys), TB.RELEASE, TB.RENEW and TB.INFLIGHT, checked in
//! the contract's order, which the Lua library follows.

use crate::args::{first_duplicate_by, Argv, Memos};
use crate::charge::args::{clause_at, is_clause_keyword};
use crate::charge::Clause;
use crate::contract::{MAX_GROUPS, MAX_LEASE_ID_BYTES, MAX_LEASE_LIMIT, MAX_LEASE_MS};
use crate::error::{Arg, Error};
use crate::number::{parse_decimal, parse_i64};

/// A validated TB.ACQUIRE: the lease key is `argv[1]`, the id `argv[4]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Acquire {
    pub limit: i64,
    pub lease_ms: i64,
    pub weight: i64,
    /// The `BUCKET` and `QUOTA` clauses, as TB.CHARGE's (key index, limit,
    /// cost).
    pub clauses: Vec<Clause>,
}

/// Where the lease id is in the argv of every lease command.
pub const ID_INDEX: usize = 2;
/// ... except TB.ACQUIRE, where it comes after `limit` and `lease_ms`.
pub const ACQUIRE_ID_INDEX: usize = 4;
/// Where TB.ACQUIRE's weight or first clause may stand.
const FIRST_CLAUSE: usize = ACQUIRE_ID_INDEX + 1;

fn int_in(bytes: &[u8], arg: Arg, least: i64, most: i64) -> Result<i64, Error> {
    let v = parse_i64(bytes).ok_or(Error::NotAnInteger(arg))?;
    if v < least || v > most {
        return Err(Error::IntOutOfRange(arg, least, most));
    }
    Ok(v)
}

fn check_id(id: &[u8]) -> Result<(), Error> {
    if id.is_empty() || id.len() > MAX_LEASE_ID_BYTES {
        return Err(Error::BadId);
    }
    Ok(())
}

fn lease_ms(bytes: &[u8]) -> Result<i64, Error> {
    int_in(bytes, Arg::LeaseMs, 1, MAX_LEASE_MS)
}

/// `TB.ACQUIRE key limit lease_ms id [weight] [BUCKET bkey max rate cost |
/// QUOTA qkey limit period cost [OFFSET minutes] ...]`, checked left to
/// right: arity, `limit`, `lease_ms`, `id`, `weight`, then clause by clause
/// its keyword and numbers (as TB.CHARGE checks its clauses), the count,
/// then keys that repeat (a clause on the lease key, then clauses on one
/// key).
pub fn parse_acquire(argv: &(impl Argv + ?Sized), memos: &Memos) -> Result<Acquire, Error> {
    let n = argv.count();
    if n < 5 {
        return Err(Error::Arity(argv.command()));
    }
    let limit = int_in(argv.arg(2), Arg::Limit, 1, MAX_LEASE_LIMIT)?;
    let lease_ms = lease_ms(argv.arg(3))?;
    check_id(argv.arg(ACQUIRE_ID_INDEX))?;
    let mut at = FIRST_CLAUSE;
    let mut weight = 1;
    if n > FIRST_CLAUSE && !is_clause_keyword(argv, FIRST_CLAUSE) {
        weight = match parse_i64(argv.arg(FIRST_CLAUSE)) {
            Some(w) => w,
            // A number that is no integer is a bad weight; a word may have
            // been meant for either (`BUCKETS`), so the error names all.
            None if parse_decimal(argv.arg(FIRST_CLAUSE)).is_some() => {
                return Err(Error::NotAnInteger(Arg::Weight))
            }
            None => return Err(Error::ExpectedWeight(FIRST_CLAUSE)),
        };
        if weight < 1 {
            return Err(Error::TooSmall(Arg::Weight, 1));
        }
        if weight > limit {
            return Err(Error::WeightAboveLimit);
        }
        at += 1;
    }
    let mut clauses = Vec::new();
    while at < n {
        if clauses.len() == MAX_GROUPS {
            return Err(Error::TooManyGroups);
        }
        // The keyword, the key and three numbers.
        if at + 4 >= n {
            return Err(Error::Arity(argv.command()));
        }
        let (clause, next) = clause_at(argv, at, at + 2, at + 1, clauses.len() + 1, memos)?;
        clauses.push(clause);
        at = next;
    }
    if let Some(g) = clauses
        .iter()
        .position(|c| argv.arg(c.key_index) == argv.arg(1))
    {
        return Err(Error::BucketIsLeaseKey(g + 1));
    }
    if let Some((group, first)) = first_duplicate_by(argv, clauses.len(), |g| clauses[g].key_index)
    {
        return Err(Error::DuplicateKey { group, first });
    }
    Ok(Acquire {
        limit,
        lease_ms,
        weight,
        clauses,
    })
}

/// Where TB.ACQUIRE's keys are, as its handler tells Redis: the lease key,
/// then the argument after each clause's keyword, from the first `BUCKET`
/// or `QUOTA` at argument 5 on. A clause is five arguments, seven for a
/// quota with `OFFSET`. Any argv, valid or not (Redis asks before the
/// arguments are checked): a word where a keyword should be counts as a
/// clause of five.
pub fn acquire_key_positions(argv: &(impl Argv + ?Sized)) -> Vec<usize> {
    let n = argv.count();
    let mut keys = Vec::new();
    if n > 1 {
        keys.push(1);
    }
    let Some(mut at) = (FIRST_CLAUSE..n).find(|&i| is_clause_keyword(argv, i)) else {
        return keys;
    };
    while at + 1 < n {
        keys.push(at + 1);
        let quota = argv.arg(at).eq_ignore_ascii_case(b"QUOTA");
        at += 5;
        if quota && at < n && argv.arg(at).eq_ignore_ascii_case(b"OFFSET") {
            at += 2;
        }
    }
    keys
}

/// `TB.RELEASE key id`.
pub fn parse_release(argv: &(impl Argv + ?Sized)) -> Result<(), Error> {
    if argv.count() != 3 {
        return Err(Error::Arity(argv.command()));
    }
    check_id(argv.arg(ID_INDEX))
}

/// `TB.RENEW key id lease_ms`: the lease time.
pub fn parse_renew(argv: &(impl Argv + ?Sized)) -> Result<i64, Error> {
    if argv.count() != 4 {
        return Err(Error::Arity(argv.command()));
    }
    check_id(argv.arg(ID_INDEX))?;
    lease_ms(argv.arg(3))
}

/// `TB.INFLIGHT key`.
pub fn parse_inflight(argv: &(impl Argv + ?Sized)) -> Result<(), Error> {
    if argv.count() != 2 {
        return Err(Error::Arity(argv.command()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::charge::Limit;
    use crate::contract::ACQUIRE;

    fn argv(s: &[&str]) -> Vec<Vec<u8>> {
        s.iter().map(|a| a.as_bytes().to_vec()).collect()
    }

    /// TB.ACQUIRE's arguments, parsed with a store of memos of their own.
    fn acquire(words: &[&str]) -> Result<Acquire, Error> {
        parse_acquire(argv(words).as_slice(), &Memos::new())
    }

    #[test]
    fn acquire_arguments_in_order() {
        let ok = acquire(&[
            "tb.acquire",
            "k",
            "8",
            "30000",
            "id",
            "2",
            "BUCKET",
            "b",
            "10",
            "1",
            "1",
        ])
        .unwrap();
        assert_eq!((ok.limit, ok.lease_ms, ok.weight), (8, 30000, 2));
        assert_eq!(ok.clauses.len(), 1);
        assert_eq!(ok.clauses[0].key_index, 7);
        let no_weight = acquire(&[
            "tb.acquire",
            "k",
            "8",
            "1",
            "id",
            "bucket",
            "b",
            "10",
            "1",
            "1",
        ])
        .unwrap();
        assert_eq!(no_weight.weight, 1);
        #[rustfmt::skip]
        let cases = [
            (vec!["tb.acquire", "k", "8", "1"], Error::Arity(ACQUIRE)),
            (vec!["tb.acquire", "k", "x", "1", "id"], Error::NotAnInteger(Arg::Limit)),
            (vec!["tb.acquire", "k", "0", "1", "id"], Error::IntOutOfRange(Arg::Limit, 1, MAX_LEASE_LIMIT)),
            (vec!["tb.acquire", "k", "1000001", "1", "id"], Error::IntOutOfRange(Arg::Limit, 1, MAX_LEASE_LIMIT)),
            (vec!["tb.acquire", "k", "8", "1.5", "id"], Error::NotAnInteger(Arg::LeaseMs)),
            (vec!["tb.acquire", "k", "8", "0", "id"], Error::IntOutOfRange(Arg::LeaseMs, 1, MAX_LEASE_MS)),
            (vec!["tb.acquire", "k", "8", "86400001", "id"], Error::IntOutOfRange(Arg::LeaseMs, 1, MAX_LEASE_MS)),
            (vec!["tb.acquire", "k", "8", "1", ""], Error::BadId),
            (vec!["tb.acquire", "k", "8", "1", "id", "x"], Error::ExpectedWeight(5)),
            (vec!["tb.acquire", "k", "8", "1", "id", "1.5"], Error::NotAnInteger(Arg::Weight)),
            (vec!["tb.acquire", "k", "8", "1", "id", "BUCKETS", "b", "1", "1", "1"], Error::ExpectedWeight(5)),
            (vec!["tb.acquire", "k", "8", "1", "id", "0"], Error::TooSmall(Arg::Weight, 1)),
            (vec!["tb.acquire", "k", "8", "1", "id", "9"], Error::WeightAboveLimit),
            (vec!["tb.acquire", "k", "8", "1", "id", "1", "BUCKET", "b", "1"], Error::Arity(ACQUIRE)),
            (vec!["tb.acquire", "k", "8", "1", "id", "1", "BUCKETS", "b", "1", "1", "1"], Error::ExpectedClause(6)),
            (vec!["tb.acquire", "k", "8", "1", "id", "BUCKET", "b", "0", "1", "1"], Error::MaxOutOfRange(Some(1))),
            (vec!["tb.acquire", "k", "8", "1", "id", "BUCKET", "b", "1", "1", "2"], Error::CostAboveMax(Some(1))),
            (vec!["tb.acquire", "k", "8", "1", "id", "BUCKET", "k", "1", "1", "1"], Error::BucketIsLeaseKey(1)),
            (vec!["tb.acquire", "k", "8", "1", "id", "BUCKET", "b", "1", "1", "1", "BUCKET", "b", "1", "1", "1"],
             Error::DuplicateKey { group: 2, first: 1 }),
        ];
        for (a, e) in cases {
            assert_eq!(acquire(&a), Err(e), "{a:?}");
        }
        let long = "i".repeat(MAX_LEASE_ID_BYTES + 1);
        assert_eq!(
            acquire(&["tb.acquire", "k", "8", "1", &long]),
            Err(Error::BadId)
        );
        assert_eq!(
            parse_renew(argv(&["tb.renew", "k", "id", "0"]).as_slice()),
            Err(Error::IntOutOfRange(Arg::LeaseMs, 1, MAX_LEASE_MS))
        );
        assert_eq!(
            parse_release(argv(&["tb.release", "k"]).as_slice()),
            Err(Error::Arity(crate::contract::RELEASE))
        );
    }

    #[test]
    fn key_positions_follow_the_key_specs() {
        let at = |s: &[&str]| acquire_key_positions(argv(s).as_slice());
        assert_eq!(at(&["tb.acquire", "k", "1", "1", "id"]), [1]);
        assert_eq!(
            at(&[
                "tb.acquire",
                "k",
                "1",
                "1",
                "BUCKET",
                "2",
                "BUCKET",
                "b",
                "1",
                "1",
                "1",
                "bucket",
                "c",
                "1",
                "1",
                "1"
            ]),
            [1, 7, 12]
        );
        assert_eq!(at(&["tb.acquire", "k", "1", "1", "id", "BUCKET"]), [1]);
        // A quota's OFFSET makes its clause seven arguments long.
        let mixed = [
            "tb.acquire",
            "k",
            "1",
            "1",
            "id",
            "QUOTA",
            "q",
            "5",
            "DAY",
            "1",
            "OFFSET",
            "60",
            "BUCKET",
            "b",
            "1",
            "1",
            "1",
            "quota",
            "r",
            "5",
            "3600",
            "1",
        ];
        assert_eq!(at(&mixed), [1, 6, 13, 18]);
        let call = acquire(&mixed).unwrap();
        let keys: Vec<usize> = call.clauses.iter().map(|c| c.key_index).collect();
        assert_eq!(keys, [6, 13, 18]);
        assert!(matches!(call.clauses[0].limit, Limit::Quota(q) if q.offset_s == 3600));
        assert!(matches!(call.clauses[1].limit, Limit::Bucket(_)));
        assert_eq!(
            acquire(&mixed[..11]),
            Err(Error::Arity(crate::contract::ACQUIRE))
        );
        assert_eq!(
            acquire(&[
                "tb.acquire",
                "k",
                "1",
                "1",
                "id",
                "QUOTA",
                "q",
                "0",
                "DAY",
                "1"
            ]),
            Err(Error::LimitOutOfRange(Some(1)))
        );
        assert_eq!(at(&["tb.acquire"]), Vec::<usize>::new());
    }
}
