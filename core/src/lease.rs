//! Concurrency leases: TB.ACQUIRE, TB.RELEASE, TB.RENEW and TB.INFLIGHT.
//!
//! A lease key is a hash with one field per lease: the field is the
//! holder's id, the value `<expires_at_us>:<weight>`. A lease is live while
//! the clock is before its expiry; expired ones count as absent and are
//! pruned by the next write. Everything here is pure: the module reads the
//! hash field by field into a [`Scan`], and gets back what to reply and
//! what to write.

use crate::args::{first_duplicate, parse_groups, Argv, Group};
use crate::contract::{MAX_GROUPS, MAX_LEASE_ID_BYTES, MAX_LEASE_LIMIT, MAX_LEASE_MS};
use crate::error::{Arg, Error};
use crate::number::{digit_run, parse_i64};

/// One lease as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Microseconds since the Unix epoch, server clock.
    pub expires_us: i64,
    pub weight: i64,
}

impl Lease {
    /// Reads a stored value, `<expires_at_us>:<weight>`: two integers, the
    /// weight one a lease can have (1 to MAX_LEASE_LIMIT, so sums of them
    /// can't overflow). `None` for anything else, which makes the key not
    /// a lease key.
    pub fn parse(value: &[u8]) -> Option<Lease> {
        // Every call reads every lease of its key: digits are summed in
        // place, with no UTF-8 check or general integer parser.
        // The expiry's digits run up to the colon, the first byte that is
        // no digit: one pass finds both.
        let (run, colon) = digit_run(value);
        if value.get(colon) != Some(&b':') {
            return None;
        }
        let expires_us = match colon {
            1..=19 => i64::try_from(run).ok()?,
            _ => digits(&value[..colon])?,
        };
        let lease = Lease {
            expires_us,
            weight: digits(&value[colon + 1..])?,
        };
        (1..=MAX_LEASE_LIMIT)
            .contains(&lease.weight)
            .then_some(lease)
    }

    /// The stored value, `<expires_at_us>:<weight>`.
    pub fn text(&self) -> Vec<u8> {
        format!("{}:{}", self.expires_us, self.weight).into_bytes()
    }

    pub fn is_live(&self, now_us: i64) -> bool {
        now_us < self.expires_us
    }
}

/// The value of 1 to 19 ASCII digits, if it fits an i64 (leading zeros
/// allowed, as Rust's parser takes them); `None` for anything else.
fn digits(s: &[u8]) -> Option<i64> {
    if s.is_empty() || s.len() > 19 {
        // 20 or more digits fit only with leading zeros: the slow path.
        return (s.len() > 19 && s.iter().all(u8::is_ascii_digit))
            .then(|| parse_i64(s))
            .flatten();
    }
    // Eight digits at a time; 19 digits fit a u64.
    let (v, read) = digit_run(s);
    if read != s.len() {
        return None;
    }
    i64::try_from(v).ok()
}

/// Whole milliseconds from `now_us` until `at_us`, rounded up: waiting that
/// long always reaches it. 0 if it has passed.
fn ms_until(now_us: i64, at_us: i64) -> i64 {
    let us = at_us.saturating_sub(now_us).max(0);
    us / 1000 + i64::from(us % 1000 != 0)
}

/// The absolute expiry in ms of a key whose latest lease ends at `at_us`,
/// rounded up so the key never goes before its last lease.
pub fn key_expire_at_ms(at_us: i64) -> i64 {
    at_us.div_euclid(1000) + i64::from(at_us.rem_euclid(1000) != 0)
}

// ---- arguments -------------------------------------------------------------

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
pub fn parse_acquire(argv: &(impl Argv + ?Sized)) -> Result<Acquire, Error> {
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
        weight = parse_i64(argv.arg(5)).ok_or(Error::NotAnInteger(Arg::Weight))?;
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
    let buckets = parse_groups(argv, (0..count).map(|g| first + 5 * g + 1))?;
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

// ---- the key ---------------------------------------------------------------

/// A lease key as one call sees it at `now_us`, read field by field
/// ([`Scan::visit`]): the caller's own lease (the id the call names) apart
/// from the others, which are only summed and listed, and the expired
/// fields, which the call's write prunes.
#[derive(Debug)]
pub struct Scan<'a> {
    id: Option<&'a [u8]>,
    now_us: i64,
    /// The caller's lease, if live.
    pub own: Option<Lease>,
    /// The other live leases: (expiry, weight).
    pub others: Vec<(i64, i64)>,
    /// Their total weight.
    pub others_weight: i64,
    /// The latest expiry among them (0: none).
    pub others_latest_us: i64,
    /// Fields whose lease has expired (the caller's own included).
    pub expired: Vec<Vec<u8>>,
}

impl<'a> Scan<'a> {
    /// A scan for a call about `id` (`None`: TB.INFLIGHT).
    pub fn new(id: Option<&'a [u8]>, now_us: i64) -> Self {
        Scan {
            id,
            now_us,
            own: None,
            others: Vec::new(),
            others_weight: 0,
            others_latest_us: 0,
            expired: Vec::new(),
        }
    }

    /// Reads one field of the hash. `Err` for a value that holds no lease:
    /// the key is not a lease key.
    pub fn visit(&mut self, field: &[u8], value: &[u8]) -> Result<(), Error> {
        let lease = Lease::parse(value).ok_or(Error::NotALeaseKey)?;
        if !lease.is_live(self.now_us) {
            self.expired.push(field.to_vec());
        } else if self.id == Some(field) {
            self.own = Some(lease);
        } else {
            self.others.push((lease.expires_us, lease.weight));
            // At most 1e6 leases of weight at most 1e6: no overflow.
            self.others_weight = self.others_weight.saturating_add(lease.weight);
            self.others_latest_us = self.others_latest_us.max(lease.expires_us);
        }
        Ok(())
    }

    /// The live weight: the others' and the caller's own.
    pub fn in_use(&self) -> i64 {
        self.others_weight + self.own.map_or(0, |l| l.weight)
    }

    /// How long until enough of the others expire for `weight` to fit
    /// beside them under `limit`: 0 if it fits now.
    fn wait_for_room(&self, limit: i64, weight: i64) -> i64 {
        let mut excess = self.others_weight + weight - limit;
        if excess <= 0 {
            return 0;
        }
        let mut by_expiry = self.others.clone();
        by_expiry.sort_unstable();
        for (expires_us, w) in by_expiry {
            excess -= w;
            if excess <= 0 {
                return ms_until(self.now_us, expires_us);
            }
        }
        // weight <= limit, so the others' expiry always makes room.
        0
    }
}

/// What a lease call writes to its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Nothing: a denial, an unknown id.
    Nothing,
    /// `HDEL key expired... [id]` (the id if `remove_own`: a release),
    /// `HSET key id lease` (if `set`), and `PEXPIREAT key expire_at_ms`.
    Save {
        set: Option<Lease>,
        remove_own: bool,
        expire_at_ms: i64,
    },
    /// No live lease is left: the key goes.
    Delete,
}

/// TB.ACQUIRE's lease half (the buckets are TB.MCONSUME's groups).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acquired {
    /// The lease fits beside the others.
    pub fits: bool,
    /// `in_use` if the lease is taken, and if not.
    pub in_use_if_taken: i64,
    pub in_use_if_not: i64,
    /// The lease's wait on a denial (0 when it fits).
    pub retry_after_ms: i64,
    /// The lease, if it is taken.
    pub lease: Lease,
    /// The write if it is taken.
    pub write: Write,
}

impl Acquired {
    /// `expires_in_ms` of the reply when taken.
    pub fn expires_in_ms(&self, now_us: i64) -> i64 {
        ms_until(now_us, self.lease.expires_us)
    }
}

/// The expiry a lease taken or renewed at `now_us` for `lease_ms` gets:
/// never earlier than it had (a clock that stepped back must not shorten
/// it, and a renewal never does).
fn extended(own: Option<Lease>, now_us: i64, lease_ms: i64) -> i64 {
    let new = now_us.saturating_add(lease_ms.saturating_mul(1000));
    own.map_or(new, |l| l.expires_us.max(new))
}

/// TB.ACQUIRE against the key `scan` read: whether the lease fits, and
/// what it becomes if the whole call is admitted. A live lease of the same
/// id is renewed with the new weight and counted once.
pub fn acquire(scan: &Scan, call: &Acquire) -> Acquired {
    let fits = scan.others_weight + call.weight <= call.limit;
    let lease = Lease {
        expires_us: extended(scan.own, scan.now_us, call.lease_ms),
        weight: call.weight,
    };
    Acquired {
        fits,
        in_use_if_taken: scan.others_weight + call.weight,
        in_use_if_not: scan.in_use(),
        retry_after_ms: scan.wait_for_room(call.limit, call.weight),
        write: Write::Save {
            set: Some(lease),
            remove_own: false,
            expire_at_ms: key_expire_at_ms(lease.expires_us.max(scan.others_latest_us)),
        },
        lease,
    }
}

/// TB.RELEASE: `(released, in_use, write)`.
pub fn release(scan: &Scan) -> (bool, i64, Write) {
    if scan.own.is_none() {
        return (false, scan.in_use(), Write::Nothing);
    }
    let write = if scan.others.is_empty() {
        Write::Delete
    } else {
        Write::Save {
            set: None,
            remove_own: true,
            expire_at_ms: key_expire_at_ms(scan.others_latest_us),
        }
    };
    (true, scan.others_weight, write)
}

/// TB.RENEW: `(renewed, expires_in_ms, write)`. A lease that is not live
/// is never recreated.
pub fn renew(scan: &Scan, lease_ms: i64) -> (bool, i64, Write) {
    let Some(own) = scan.own else {
        return (false, 0, Write::Nothing);
    };
    let lease = Lease {
        expires_us: extended(Some(own), scan.now_us, lease_ms),
        weight: own.weight,
    };
    let write = Write::Save {
        set: Some(lease),
        remove_own: false,
        expire_at_ms: key_expire_at_ms(lease.expires_us.max(scan.others_latest_us)),
    };
    (true, ms_until(scan.now_us, lease.expires_us), write)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::ACQUIRE;

    const NOW: i64 = 1_764_513_600_000_000;

    fn argv(s: &[&str]) -> Vec<Vec<u8>> {
        s.iter().map(|a| a.as_bytes().to_vec()).collect()
    }

    fn scan<'a>(id: &'a [u8], leases: &[(&str, &str)]) -> Scan<'a> {
        let mut s = Scan::new(Some(id), NOW);
        for (f, v) in leases {
            s.visit(f.as_bytes(), v.as_bytes()).unwrap();
        }
        s
    }

    fn lease(expires_us: i64, weight: i64) -> String {
        format!("{expires_us}:{weight}")
    }

    #[test]
    fn stored_values_read_as_the_integer_parser_reads_them() {
        let mut rng = testkit::Rng(0x5EED_1EA5);
        let mut samples: Vec<String> = vec![
            "0".into(),
            "9223372036854775807".into(),
            "9223372036854775808".into(),
            "18446744073709551615".into(),
            "00000000000000000000001".into(),
            "0009223372036854775807".into(),
            "1a".into(),
            "".into(),
            "+1".into(),
            "-1".into(),
            " 1".into(),
        ];
        for _ in 0..20_000 {
            let x = rng.next();
            samples.push((x >> (x % 64)).to_string());
            samples.push(format!("{:0width$}", x % 1000, width = (x % 25) as usize));
        }
        for s in samples {
            let want = s
                .bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| parse_i64(s.as_bytes()))
                .flatten()
                .filter(|_| !s.is_empty());
            assert_eq!(digits(s.as_bytes()), want, "{s:?}");
        }
    }

    #[test]
    fn stored_values_read_as_their_two_integers() {
        // The reading by parts: split at the first colon, each side as
        // `digits` reads it, the weight in range.
        let by_parts = |v: &[u8]| {
            let colon = v.iter().position(|&b| b == b':')?;
            let lease = Lease {
                expires_us: digits(&v[..colon])?,
                weight: digits(&v[colon + 1..])?,
            };
            (1..=MAX_LEASE_LIMIT)
                .contains(&lease.weight)
                .then_some(lease)
        };
        let mut rng = testkit::Rng(0xA54F_F53A_5F1D_36F1);
        let mut values: Vec<Vec<u8>> = vec![b"1:1".to_vec(), b":".to_vec(), b"0:1:1".to_vec()];
        for _ in 0..50_000 {
            let x = rng.next();
            let expires = format!("{:0width$}", x >> (x % 64), width = (x % 23) as usize);
            let mut v = format!("{expires}:{}", x % 7).into_bytes();
            // Now and then one byte of anything, anywhere.
            if x.is_multiple_of(3) {
                let at = rng.below(v.len() as u64) as usize;
                v[at] = rng.below(256) as u8;
            }
            values.push(v);
        }
        for v in values {
            assert_eq!(
                Lease::parse(&v),
                by_parts(&v),
                "{:?}",
                String::from_utf8_lossy(&v)
            );
        }
    }

    #[test]
    fn stored_values_round_trip_and_nothing_else_reads() {
        let l = Lease {
            expires_us: NOW,
            weight: 3,
        };
        assert_eq!(Lease::parse(&l.text()), Some(l));
        for bad in [
            &b""[..],
            b"1",
            b"1:",
            b":1",
            b"1:0",
            b"-1:1",
            b"1:-1",
            b"1:1:1",
            b"1.5:1",
            b" 1:1",
            b"99999999999999999999:1",
            b"9",
            b"1:1000001",
            b"1:9223372036854775807",
        ] {
            assert_eq!(Lease::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn acquire_arguments_in_order() {
        let ok = parse_acquire(
            argv(&[
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
            .as_slice(),
        )
        .unwrap();
        assert_eq!((ok.limit, ok.lease_ms, ok.weight), (8, 30000, 2));
        assert_eq!(ok.buckets.len(), 1);
        assert_eq!(ok.buckets[0].key_index, 7);
        let no_weight = parse_acquire(
            argv(&[
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
            .as_slice(),
        )
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
            (vec!["tb.acquire", "k", "8", "1", "id", "x"], Error::NotAnInteger(Arg::Weight)),
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
            assert_eq!(parse_acquire(argv(&a).as_slice()), Err(e), "{a:?}");
        }
        let long = "i".repeat(MAX_LEASE_ID_BYTES + 1);
        assert_eq!(
            parse_acquire(argv(&["tb.acquire", "k", "8", "1", &long]).as_slice()),
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

    #[test]
    fn acquire_counts_live_weight_and_waits_for_expiries() {
        let s = scan(
            b"me",
            &[
                ("a", &lease(NOW + 5_000_500, 2)),
                ("b", &lease(NOW + 2_000_000, 1)),
                ("old", &lease(NOW, 4)),
            ],
        );
        assert_eq!(s.others_weight, 3);
        assert_eq!(s.expired, vec![b"old".to_vec()]);
        let call = |weight| Acquire {
            limit: 4,
            lease_ms: 30_000,
            weight,
            buckets: vec![],
        };
        let a = acquire(&s, &call(1));
        assert!(a.fits);
        assert_eq!(a.in_use_if_taken, 4);
        assert_eq!(a.expires_in_ms(NOW), 30_000);
        assert_eq!(
            a.write,
            Write::Save {
                set: Some(a.lease),
                remove_own: false,
                expire_at_ms: (NOW + 30_000_000) / 1000
            }
        );
        // Two over: b (1) expires in 2 s, then a (2) in 5.0005 s.
        let d = acquire(&s, &call(3));
        assert!(!d.fits);
        assert_eq!(d.retry_after_ms, 5001);
        assert_eq!(d.in_use_if_not, 3);
        let one_over = acquire(&s, &call(2));
        assert_eq!(one_over.retry_after_ms, 2000);
    }

    #[test]
    fn an_id_already_live_is_renewed_and_counted_once() {
        let s = scan(
            b"me",
            &[
                ("me", &lease(NOW + 60_000_000, 2)),
                ("x", &lease(NOW + 1_000, 2)),
            ],
        );
        let a = acquire(
            &s,
            &Acquire {
                limit: 4,
                lease_ms: 10_000,
                weight: 2,
                buckets: vec![],
            },
        );
        assert!(a.fits);
        assert_eq!(a.in_use_if_taken, 4);
        // The later expiry stays: a renewal never shortens a lease.
        assert_eq!(a.lease.expires_us, NOW + 60_000_000);
    }

    #[test]
    fn release_and_renew() {
        let s = scan(
            b"me",
            &[
                ("me", &lease(NOW + 1_000, 1)),
                ("x", &lease(NOW + 9_000_001, 3)),
            ],
        );
        assert_eq!(
            release(&s),
            (
                true,
                3,
                Write::Save {
                    set: None,
                    remove_own: true,
                    expire_at_ms: (NOW + 9_000_001) / 1000 + 1
                }
            )
        );
        let alone = scan(b"me", &[("me", &lease(NOW + 1_000, 1))]);
        assert_eq!(release(&alone), (true, 0, Write::Delete));
        let gone = scan(b"me", &[("me", &lease(NOW, 1)), ("x", &lease(NOW + 1, 3))]);
        assert_eq!(release(&gone), (false, 3, Write::Nothing));
        assert_eq!(renew(&gone, 1000), (false, 0, Write::Nothing));
        let (renewed, ms, write) = renew(&s, 2000);
        assert!(renewed);
        assert_eq!(ms, 2000);
        assert_eq!(
            write,
            Write::Save {
                set: Some(Lease {
                    expires_us: NOW + 2_000_000,
                    weight: 1
                }),
                remove_own: false,
                expire_at_ms: (NOW + 9_000_001) / 1000 + 1
            }
        );
    }

    #[test]
    fn a_hash_of_other_values_is_not_a_lease_key() {
        let mut s = Scan::new(None, NOW);
        assert_eq!(s.visit(b"tokens", b"9"), Err(Error::NotALeaseKey));
    }
}
