//! The lease decisions against a brute-force reading of the hash, over
//! random calls whose leases expire in the middle: the summary's answers
//! are the whole key's, its list and numbers stay true after every write,
//! and a key of any size costs a call two field reads between passes (the
//! list field a third, only where the call needs a listed lease).

use std::cell::Cell;
use std::collections::BTreeMap;
use tb_core::bucket::{Effect, Limits, Stored};
use tb_core::charge::{self, Clause, State};
use tb_core::error::Error;
use tb_core::lease::stored::{self, Header};
use tb_core::lease::*;
use tb_core::state::KeyKind;
use testkit::{lease_summary_problem, write_leases, Rng};

/// TB.ACQUIRE of a lease alone (no clauses).
fn take(v: &mut Leases, limit: i64, lease_ms: i64, weight: i64) -> Result<Acquired, Unsure> {
    let call = Acquire {
        limit,
        lease_ms,
        weight,
        clauses: Vec::new(),
    };
    acquire(v, &call, &[])
}

const NOW: i64 = 1_764_513_600_000_000;

/// A lease key in memory, counting the fields its passes read and the
/// reads of its list field.
#[derive(Default)]
struct Key {
    hash: BTreeMap<Vec<u8>, Vec<u8>>,
    scanned: Cell<usize>,
    list_reads: Cell<usize>,
    /// Reads as if it had no summary: every call passes.
    ignore_summary: bool,
}

impl LeaseStore for Key {
    fn kind(&self) -> KeyKind {
        if self.hash.is_empty() {
            KeyKind::Missing
        } else {
            KeyKind::Hash(self.hash.len())
        }
    }
    fn with_summary<R>(
        &self,
        id: Option<&[u8]>,
        f: impl for<'x> FnOnce(Option<&'x [u8]>, Option<&'x [u8]>, ListField<'x>) -> R,
    ) -> R {
        let field = |name: &[u8]| {
            (!self.ignore_summary)
                .then(|| self.hash.get(name))
                .flatten()
                .map(|v| v.as_slice())
        };
        let list = Counted {
            value: field(LIST_FIELD),
            reads: &self.list_reads,
        };
        f(
            field(SUMMARY_FIELD),
            id.and_then(|id| self.hash.get(id)).map(|v| v.as_slice()),
            ListField(&list),
        )
    }
    fn scan(&self, mut visit: impl FnMut(&[u8], &[u8]) -> Result<(), Error>) -> Result<(), Error> {
        for (f, v) in &self.hash {
            self.scanned.set(self.scanned.get() + 1);
            visit(f, v)?;
        }
        Ok(())
    }
}

/// A list field that counts its reads.
struct Counted<'a> {
    value: Option<&'a [u8]>,
    reads: &'a Cell<usize>,
}

impl ListRead for Counted<'_> {
    fn read(&self) -> Option<&[u8]> {
        self.reads.set(self.reads.get() + 1);
        self.value
    }
}

impl Key {
    fn with_leases(leases: &[(&str, i64, i64)]) -> Key {
        let mut key = Key::default();
        for &(id, e, w) in leases {
            let lease = Lease {
                expires_us: e,
                weight: w,
            };
            key.hash.insert(id.as_bytes().to_vec(), lease.text());
        }
        key
    }

    /// The same hash, read by passes only.
    fn passing(&self) -> Key {
        Key {
            hash: self.hash.clone(),
            scanned: Cell::new(0),
            list_reads: Cell::new(0),
            ignore_summary: true,
        }
    }

    fn leases(&self) -> impl Iterator<Item = (&[u8], Lease)> {
        self.hash
            .iter()
            .filter(|(f, _)| f.as_slice() != SUMMARY_FIELD && f.as_slice() != LIST_FIELD)
            .filter_map(|(f, v)| Lease::parse(v).map(|l| (f.as_slice(), l)))
    }

    /// What a brute-force reading of the hash says at `now`: the live
    /// leases other than `id`'s, sorted by expiry, and `id`'s own.
    fn truth(&self, id: &[u8], now: i64) -> (Vec<Lease>, Option<Lease>) {
        let mut others: Vec<Lease> = self
            .leases()
            .filter(|(f, l)| *f != id && l.is_live(now))
            .map(|(_, l)| l)
            .collect();
        others.sort_by_key(|l| l.expires_us);
        let own = self
            .leases()
            .find(|(f, l)| *f == id && l.is_live(now))
            .map(|(_, l)| l);
        (others, own)
    }

    /// The summary's promises hold (testkit::lease_summary_problem).
    fn check_summary(&self, context: &str) {
        if let Some(problem) = lease_summary_problem(&self.hash) {
            panic!("{context}: {problem}");
        }
    }

    fn call<T>(
        &mut self,
        id: &[u8],
        now: i64,
        kind: Kind,
        op: impl FnMut(&mut Leases) -> Result<T, Unsure>,
    ) -> T {
        let (t, write) = decide(self, Some(id), now, kind, op).expect("a lease key");
        if let Some(write) = write {
            write_leases(&mut self.hash, id, &write);
        }
        t
    }
}

/// The exact wait until enough of `others` expire for `weight` to fit
/// under `limit`.
fn exact_wait(others: &[Lease], now: i64, limit: i64, weight: i64) -> i64 {
    let mut excess = others.iter().map(|l| l.weight).sum::<i64>() + weight - limit;
    if excess <= 0 {
        return 0;
    }
    for l in others {
        excess -= l.weight;
        if excess <= 0 {
            return ms_until(now, l.expires_us);
        }
    }
    0
}

/// Random acquires, releases, renewals and reads on one key, with short
/// leases expiring in the middle, the clock now and then stepping back;
/// every answer checked against the hash read by brute force, and
/// against a pass of the same hash.
/// Returns how many calls found a key of more than TRACKED + 1 fields,
/// and how many of those read no field but two.
fn random_calls(
    seed: u64,
    ids: usize,
    least_limit: i64,
    steps: usize,
    max_lease_ms: i64,
) -> (usize, usize) {
    let (mut large, mut fast) = (0, 0);
    let mut rng = Rng(seed);
    let mut key = Key::default();
    let limit = least_limit + rng.below(3 * ids as u64 / 2) as i64;
    let mut now = NOW;
    for step in 0..steps {
        // Often no time at all: leases of one lease time then tie.
        now += if rng.percent(30) {
            0
        } else {
            rng.below(2_000_000) as i64 - if rng.percent(3) { 3_000_000 } else { 0 }
        };
        let id = format!("id{}", rng.below(ids as u64)).into_bytes();
        let context = format!("seed {seed:#x} step {step}");
        let (others, own) = key.truth(&id, now);
        let live: i64 = others.iter().map(|l| l.weight).sum::<i64>() + own.map_or(0, |l| l.weight);
        let by_pass = key.passing();
        let scanned = key.scanned.get();
        match rng.below(10) {
            0..=4 => {
                let weight = 1 + rng.below(limit.min(3) as u64) as i64;
                let lease_ms = if rng.percent(50) {
                    max_lease_ms / 2
                } else {
                    1 + rng.below(max_lease_ms as u64) as i64
                };
                let op = |v: &mut Leases| take(v, limit, lease_ms, weight);
                let (reference, _) = decide(&by_pass, Some(&id), now, Kind::Acquire, op).unwrap();
                let got = key.call(&id, now, Kind::Acquire, op);
                // The hint may differ: each is bounded below.
                assert_eq!(
                    (got.acquired, &got.head[..2]),
                    (reference.acquired, &reference.head[..2]),
                    "{context}: acquire, the pass"
                );
                let other_weight = live - own.map_or(0, |l| l.weight);
                let fits = other_weight + weight <= limit;
                assert_eq!(got.acquired, fits, "{context}: acquire fits");
                if fits {
                    assert_eq!(got.head[1], other_weight + weight, "{context}");
                } else {
                    assert_eq!(got.head[1], live, "{context}");
                    let exact = exact_wait(&others, now, limit, weight);
                    // Never later than room appears by expiry; at least
                    // the next ms (no lease expires now).
                    for hint in [got.head[2], reference.head[2]] {
                        assert!(
                            (1..=exact).contains(&hint),
                            "{context}: hint {hint}, room in {exact}"
                        );
                    }
                    if by_pass.hash.len() <= TRACKED + 1 {
                        assert_eq!(got.head[2], exact, "{context}: a small key's hint");
                    }
                }
            }
            5..=6 => {
                let op = |v: &mut Leases| release(v);
                let (reference, _) = decide(&by_pass, Some(&id), now, Kind::Release, op).unwrap();
                let got = key.call(&id, now, Kind::Release, op);
                assert_eq!(got, reference, "{context}: release, the pass");
                let left = live - own.map_or(0, |l| l.weight);
                assert_eq!(got, [i64::from(own.is_some()), left], "{context}: release");
            }
            7..=8 => {
                let lease_ms = 1 + rng.below(max_lease_ms as u64) as i64;
                let op = |v: &mut Leases| renew(v, lease_ms);
                let (reference, _) = decide(&by_pass, Some(&id), now, Kind::Renew, op).unwrap();
                let got = key.call(&id, now, Kind::Renew, op);
                assert_eq!(got, reference, "{context}: renew, the pass");
                assert_eq!(got[0], i64::from(own.is_some()), "{context}: renew");
            }
            _ => {
                let got = key.call(&id, now, Kind::Inflight, |v| Ok(v.in_use()));
                assert_eq!(got, live, "{context}: inflight");
            }
        }
        if by_pass.hash.len() > TRACKED + 1 {
            large += 1;
            fast += usize::from(key.scanned.get() == scanned);
        }
        key.check_summary(&context);
    }
    (large, fast)
}

#[test]
fn random_calls_on_small_keys_answer_as_the_whole_key() {
    for seed in 0..40 {
        random_calls(0x0001_EA5E_0000 + seed, 12, 1, 600, 6_000);
    }
}

#[test]
fn random_calls_on_large_keys_answer_as_the_whole_key() {
    for seed in 0..12 {
        let (large, fast) = random_calls(0x0B16_0000 + seed, 80, 20, 3_000, 40_000);
        // Most calls on a large key are answered by its summary, though
        // every lease here is short and most expire.
        assert!(fast * 4 > large * 3, "seed {seed}: {fast} of {large}");
    }
}

fn fill(key: &mut Key, n: usize, until: i64) {
    for i in 0..n {
        key.hash.insert(
            format!("live{i}").into_bytes(),
            Lease {
                expires_us: until + i as i64,
                weight: 1,
            }
            .text(),
        );
    }
}

#[test]
fn a_large_key_costs_two_field_reads_between_passes() {
    let mut key = Key::default();
    // Written in the layout without a summary: the first call, a pass,
    // converts it, even when denied.
    fill(&mut key, 10_000, NOW + 3_600_000_000);
    let denied = key.call(b"x", NOW, Kind::Acquire, |v| take(v, 10_000, 30_000, 1));
    assert!(!denied.acquired);
    assert_eq!(denied.head, [0, 10_000, 3_600_000, 0]);
    assert_eq!(key.scanned.get(), 10_000);
    assert!(key.hash.contains_key(SUMMARY_FIELD));
    key.check_summary("converted");
    key.scanned.set(0);
    key.list_reads.set(0);
    let mut now = NOW;
    for i in 0..1_000 {
        now += 1_000;
        let id = format!("p{i}").into_bytes();
        let a = key.call(&id, now, Kind::Acquire, |v| take(v, 10_001, 30_000, 1));
        assert_eq!(a.head, [1, 10_001, 0, 30_000]);
        let denied = key.call(b"y", now, Kind::Acquire, |v| take(v, 10_001, 30_000, 1));
        assert_eq!(denied.head[..2], [0, 10_001]);
        // The earliest live lease is the one just taken.
        assert_eq!(denied.head[2], 30_000);
        let renewed = key.call(&id, now, Kind::Renew, |v| renew(v, 60_000));
        assert_eq!(renewed, [1, 60_000]);
        assert_eq!(key.call(&id, now, Kind::Release, release), [1, 10_000]);
        assert_eq!(
            key.call(&id, now, Kind::Inflight, |v| Ok(v.in_use())),
            10_000
        );
    }
    assert_eq!(key.scanned.get(), 0, "no call read the whole key");
    key.check_summary("after the pairs");
}

#[test]
fn a_call_reads_the_list_only_when_it_needs_a_listed_lease() {
    let mut key = Key::default();
    // 1,000 leases of 30 s, taken just before: a new lease of 30 s ends
    // after all of them, past the horizon.
    fill(&mut key, 1_000, NOW + 30_000_000);
    key.call(b"x", NOW, Kind::Release, release);
    key.check_summary("converted");
    key.list_reads.set(0);
    let mut now = NOW;
    for i in 0..100 {
        now += 1_000;
        let id = format!("p{i}").into_bytes();
        let a = key.call(&id, now, Kind::Acquire, |v| take(v, 1_001, 30_000, 1));
        assert!(a.acquired);
        assert_eq!(
            key.call(&id, now, Kind::Renew, |v| renew(v, 30_000)),
            [1, 30_000]
        );
        assert_eq!(
            key.call(&id, now, Kind::Inflight, |v| Ok(v.in_use())),
            1_001
        );
        assert_eq!(key.call(&id, now, Kind::Release, release), [1, 1_000]);
    }
    assert_eq!(key.list_reads.get(), 0, "pairs past the horizon");
    // A denial's wait is the list's: the earliest lease ends in 29.9 s.
    let denied = key.call(b"y", now, Kind::Acquire, |v| take(v, 1_000, 30_000, 1));
    assert_eq!(denied.head, [0, 1_000, 29_900, 0]);
    assert_eq!(key.list_reads.get(), 1, "a denial");
    // Once the first listed lease has ended, a call reads the list to
    // find which.
    let after = NOW + 30_000_000;
    assert_eq!(
        key.call(b"y", after, Kind::Inflight, |v| Ok(v.in_use())),
        999
    );
    assert_eq!(key.list_reads.get(), 2, "an expiry");
    key.check_summary("after");
}

#[test]
fn expiries_pass_once_per_tracked_leases_not_once_each() {
    // 1,000 leases one ms apart, all crashed: a call every ms passes only
    // when the listed leases have run out.
    let mut key = Key::default();
    fill(&mut key, 1_000, NOW + 1_000_000);
    key.call(b"x", NOW, Kind::Inflight, |v| Ok(v.in_use()));
    key.call(b"x", NOW, Kind::Release, release);
    let mut passes = 0;
    for step in 0..1_000 {
        let now = NOW + 1_000_000 + step;
        key.scanned.set(0);
        let left = key.call(b"x", now, Kind::Release, release);
        assert_eq!(left, [0, 999 - step], "step {step}");
        passes += usize::from(key.scanned.get() > 0);
        key.check_summary("expiring");
    }
    assert!(
        passes <= 1_000 / TRACKED + 1,
        "{passes} passes for 1,000 expiries"
    );
    assert!(key.hash.len() <= 1, "{} fields left", key.hash.len());
}

#[test]
fn a_retried_acquire_charges_its_buckets_once() {
    let bucket = Limits {
        max: 10.0,
        rate: 1.0,
    };
    let mut key = Key::default();
    let mut stored: Option<Stored> = None;
    for (i, now) in [NOW, NOW + 1].into_iter().enumerate() {
        let call = Acquire {
            limit: 3,
            lease_ms: 30_000,
            weight: 1,
            clauses: vec![Clause {
                key_index: 6,
                limit: charge::Limit::Bucket(bucket),
                cost: 4.0,
            }],
        };
        let states = [State::Bucket(stored)];
        let a = key.call(b"a", now, Kind::Acquire, |v| acquire(v, &call, &states));
        assert!(a.acquired);
        assert_eq!(a.head[1], 1, "counted once");
        let o = &a.items[0];
        if i == 0 {
            assert_eq!(o.reply, [1, 6, 0, 4000]);
            let charge::Effect::Bucket(Effect::Save { tokens, ts_us, .. }) = o.effect else {
                panic!("the first acquire charges");
            };
            stored = Some(Stored { tokens, ts_us });
        } else {
            // What TB.PEEK of cost 4 answers: the balance 6, not charged.
            assert_eq!(o.effect, charge::Effect::Bucket(Effect::Nothing));
            assert_eq!(o.reply, bucket.peek(stored, now, 4.0).reply());
            assert_eq!(o.reply[1], 6);
        }
    }
}

#[test]
fn a_summary_that_disagrees_is_rebuilt_by_a_pass() {
    let base = || {
        let mut key = Key::default();
        fill(&mut key, 20, NOW + 10_000_000);
        key.call(b"x", NOW, Kind::Release, release);
        key.check_summary("base");
        key
    };
    let good = base().hash[LIST_FIELD].clone();
    type Edit = Box<dyn Fn(&mut Key)>;
    let edits: Vec<(&str, Edit)> = vec![
        ("count off by one", Box::new(|k| edit(k, |h| h.count += 1))),
        (
            "weight below the count",
            Box::new(|k| edit(k, |h| h.weight = 3)),
        ),
        ("no leases", Box::new(|k| edit(k, |h| h.count = 0))),
        (
            "latest before the horizon",
            Box::new(|k| edit(k, |h| h.latest_us = 1)),
        ),
        ("garbage", Box::new(|k| set_summary(k, b"x:y"))),
        (
            "a list out of order",
            Box::new(move |k| {
                let h = Header::parse(&k.hash[SUMMARY_FIELD]).unwrap();
                let mut list = stored::tracked(&good).unwrap();
                list.reverse();
                set_header_and_list(k, h, &list);
            }),
        ),
        (
            "a lease missing from the list",
            Box::new(|k| {
                let h = Header::parse(&k.hash[SUMMARY_FIELD]).unwrap();
                let text = k.hash[LIST_FIELD].clone();
                let list = stored::tracked(&text).unwrap();
                set_header_and_list(k, h, &list[1..]);
            }),
        ),
        (
            "a first that is not the list's",
            Box::new(|k| edit(k, |h| h.first_us += 1)),
        ),
        (
            "a list shorter than listed",
            Box::new(|k| {
                let h = Header::parse(&k.hash[SUMMARY_FIELD]).unwrap();
                let text = k.hash[LIST_FIELD].clone();
                let list = stored::tracked(&text).unwrap();
                k.hash
                    .insert(LIST_FIELD.to_vec(), stored::list_text(&list[..1], b""));
                set_summary(k, &h.text());
            }),
        ),
        (
            "list removed",
            Box::new(|k| {
                k.hash.remove(LIST_FIELD);
            }),
        ),
        (
            "list garbage",
            Box::new(|k| {
                k.hash.insert(LIST_FIELD.to_vec(), b";x".to_vec());
            }),
        ),
        (
            "the caller's lease listed wrong",
            Box::new(|k| {
                k.hash.insert(
                    b"live0".to_vec(),
                    Lease {
                        expires_us: NOW + 10_000_000,
                        weight: 2,
                    }
                    .text(),
                );
                edit(k, |h| h.weight += 1);
            }),
        ),
        (
            "summary removed",
            Box::new(|k| {
                k.hash.remove(SUMMARY_FIELD);
            }),
        ),
    ];
    for (what, edit) in edits {
        // A call at each moment: before any expiry, and after some.
        for now in [NOW + 1, NOW + 10_000_005] {
            let mut key = base();
            edit(&mut key);
            let by_pass = key.passing();
            let op = |v: &mut Leases| take(v, 30, 1_000, 1);
            let (want, _) =
                decide(&by_pass, Some(b"live0".as_slice()), now, Kind::Acquire, op).unwrap();
            key.scanned.set(0);
            let got = key.call(b"live0", now, Kind::Acquire, op);
            assert_eq!(got, want, "{what}");
            assert!(key.scanned.get() > 0, "{what}: read whole");
            key.check_summary(what);
        }
    }
}

fn set_summary(key: &mut Key, text: &[u8]) {
    key.hash.insert(SUMMARY_FIELD.to_vec(), text.to_vec());
}

/// Writes a summary of `h`'s numbers that lists `list` (its count and
/// first as the list says).
fn set_header_and_list(key: &mut Key, mut h: Header, list: &[stored::Tracked]) {
    h.listed = list.len();
    h.first_us = list.first().map_or(h.horizon_us, |t| t.lease.expires_us);
    set_summary(key, &h.text());
    key.hash
        .insert(LIST_FIELD.to_vec(), stored::list_text(list, b""));
}

/// Changes the summary's numbers, keeping its list.
fn edit(key: &mut Key, change: impl Fn(&mut Header)) {
    let mut h = Header::parse(&key.hash[SUMMARY_FIELD]).unwrap();
    change(&mut h);
    set_summary(key, &h.text());
}

#[test]
fn a_small_key_keeps_no_summary_and_a_large_one_drops_it_when_small() {
    let mut key = Key::default();
    for i in 0..=TRACKED {
        let id = format!("a{i}").into_bytes();
        key.call(&id, NOW, Kind::Acquire, |v| take(v, 100, 1_000, 1));
        let has = key.hash.contains_key(SUMMARY_FIELD);
        assert_eq!(has, i == TRACKED, "after {} leases", i + 1);
        assert_eq!(key.hash.contains_key(LIST_FIELD), has);
        key.check_summary("growing");
    }
    key.call(b"a0", NOW, Kind::Release, release);
    assert!(!key.hash.contains_key(SUMMARY_FIELD));
    assert!(!key.hash.contains_key(LIST_FIELD));
    assert_eq!(key.hash.len(), TRACKED);
    // A lease field that holds anything else is an error, whatever the
    // summary: here the caller's own.
    key.hash.insert(b"a1".to_vec(), b"7".to_vec());
    let r = decide(&key, Some(b"a1".as_slice()), NOW, Kind::Release, release);
    assert_eq!(r.map(|(r, _)| r), Err(Error::NotALeaseKey));
}

#[test]
fn a_hint_is_exact_on_small_keys_and_never_late() {
    let key = Key::with_leases(&[
        ("a", NOW + 5_000_500, 2),
        ("b", NOW + 2_000_000, 1),
        ("old", NOW, 4),
    ]);
    let d = |limit, weight| {
        decide(&key, Some(b"me".as_slice()), NOW, Kind::Acquire, |v| {
            take(v, limit, 30_000, weight)
        })
        .unwrap()
    };
    // Two over: b (1) expires in 2 s, then a (2) in 5.0005 s.
    let (denied, write) = d(4, 3);
    assert_eq!(denied.head, [0, 3, 5001, 0]);
    assert_eq!(write, None, "a denial on a small key writes nothing");
    assert_eq!(d(4, 2).0.head, [0, 3, 2000, 0]);
    let (taken, write) = d(4, 1);
    assert_eq!(taken.head, [1, 4, 0, 30_000]);
    assert_eq!(
        write,
        Some(Write::Save {
            expire_first: false,
            own: Some(Lease {
                expires_us: NOW + 30_000_000,
                weight: 1
            }),
            summary: None,
            list: None,
            delete: vec![b"old".to_vec()],
            expire_at_ms: (NOW + 30_000_000) / 1000,
        })
    );
}
