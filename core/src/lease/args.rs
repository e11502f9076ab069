//! The lease commands' arguments: TB.ACQUIRE (with its `BUCKET` clauses,
//! TB.MCONSUME's groups), TB.RELEASE, TB.RENEW and TB.INFLIGHT, checked in
//! the contract's order, which the Lua library follows.

use crate::args::{first_duplicate, parse_groups, Argv, Group, Memos};
use crate::contract::{MAX_GROUPS, MAX_LEASE_ID_BYTES, MAX_LEASE_LIMIT, MAX_LEASE_MS};
use crate::error::{Arg, Error};
use crate::number::{parse_decimal, parse_i64};

/// A validated TB.ACQUIRE: the lease key is `argv[1]`, the id `argv[4]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Acquire {
    pub limit: i64,
    pub lease_ms: i64,
    pub weight: i64,
    /// The `BUCKET` clauses, as TB.MCONSUME's groups (key index, limits,
    /// cost).
    pub buckets: Vec<Group>,
}

/// Where the lease id is in the argv of every lease command.
pub const ID_INDEX: usize = 2;
/// ... except TB.ACQUIRE, where it comes after `limit` and `lease_ms`.
pub const ACQUIRE_ID_INDEX: usize = 4;

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

/// `TB.ACQUIRE key limit lease_ms id [weight] [BUCKET bkey max rate cost
/// ...]`, checked left to right: arity, `limit`, `lease_ms`, `id`,
/// `weight`, the clause count, each clause's keyword, then each clause as
/// TB.MCONSUME checks a group, then keys that repeat (a clause on the lease
/// key, then clauses on one key).
pub fn parse_acquire(argv: &(impl Argv + ?Sized), memos: &Memos) -> Result<Acquire, Error> {
    let n = argv.count();
    if n < 5 {
        return Err(Error::Arity(argv.command()));
    }
    let limit = int_in(argv.arg(2), Arg::Limit, 1, MAX_LEASE_LIMIT)?;
    let lease_ms = lease_ms(argv.arg(3))?;
    check_id(argv.arg(ACQUIRE_ID_INDEX))?;
    let mut first = 5;
    let mut weight = 1;
    if n > 5 && !argv.arg(5).eq_ignore_ascii_case(b"BUCKET") {
        weight = match parse_i64(argv.arg(5)) {
            Some(w) => w,
            // A number that is no integer is a bad weight; a word may have
            // been meant for either (`BUCKETS`), so the error names both.
            None if parse_decimal(argv.arg(5)).is_some() => {
                return Err(Error::NotAnInteger(Arg::Weight))
            }
            None => return Err(Error::ExpectedWeight(5)),
        };
        if weight < 1 {
            return Err(Error::TooSmall(Arg::Weight, 1));
        }
        if weight > limit {
            return Err(Error::WeightAboveLimit);
        }
        first = 6;
    }
    let rest = n - first;
    if !rest.is_multiple_of(5) {
        return Err(Error::Arity(argv.command()));
    }
    let count = rest / 5;
    if count > MAX_GROUPS {
        return Err(Error::TooManyGroups);
    }
    if let Some(at) = (0..count)
        .map(|g| first + 5 * g)
        .find(|&at| !argv.arg(at).eq_ignore_ascii_case(b"BUCKET"))
    {
        return Err(Error::ExpectedBucket(at));
    }
    let buckets = parse_groups(argv, (0..count).map(|g| first + 5 * g + 1), memos)?;
    if let Some(g) = buckets
        .iter()
        .position(|b| argv.arg(b.key_index) == argv.arg(1))
    {
        return Err(Error::BucketIsLeaseKey(g + 1));
    }
    if let Some((group, first)) = first_duplicate(argv, &buckets) {
        return Err(Error::DuplicateKey { group, first });
    }
    Ok(Acquire {
        limit,
        lease_ms,
        weight,
        buckets,
    })
}

/// Where TB.ACQUIRE's keys are, as its key specs say: the lease key, then
/// the argument after the first `BUCKET` from argument 5 on, and every
/// fifth argument after that. Any argv, valid or not (Redis asks before
/// the arguments are checked).
pub fn acquire_key_positions(argv: &(impl Argv + ?Sized)) -> Vec<usize> {
    let n = argv.count();
    let mut keys = Vec::new();
    if n > 1 {
        keys.push(1);
    }
    if let Some(keyword) =
        (ACQUIRE_ID_INDEX + 1..n).find(|&i| argv.arg(i).eq_ignore_ascii_case(b"BUCKET"))
    {
        keys.extend((keyword + 1..n).step_by(5));
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
        assert_eq!(ok.buckets.len(), 1);
        assert_eq!(ok.buckets[0].key_index, 7);
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
            (vec!["tb.acquire", "k", "8", "1", "id", "1", "BUCKETS", "b", "1", "1", "1"], Error::ExpectedBucket(6)),
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
        assert_eq!(at(&["tb.acquire"]), Vec::<usize>::new());
    }
}
