//! (d) Lease keys: any hash, summary bytes included, and any sequence of
//! calls on it never panics, and no reply shows a negative weight. From a
//! key of well-formed leases and no summary (as written before summaries
//! existed, or by the commands), every TB.ACQUIRE, TB.RELEASE and
//! TB.INFLIGHT answers the live weight a brute-force read of the hash
//! gives, and every write leaves a summary that holds (or none where none
//! is due).

use super::Reader;
use crate::key::{lease_summary_problem, live_weight, write_leases, KeyView};
use std::collections::BTreeMap;
use tb_core::error::Error;
use tb_core::lease::{
    acquire, decide, release, renew, Acquire, Kind, Lease, LIST_FIELD, SUMMARY_FIELD,
};

/// The clock at the start of a case, µs.
const NOW: i64 = 1_893_456_000_000_000;
/// The ids a case uses: few, so calls meet each other's leases.
const IDS: u8 = 24;

/// One call of a case.
#[derive(Clone, Debug)]
pub struct LeaseStep {
    /// 0 acquire, 1 release, 2 renew, 3 inflight.
    pub kind: u8,
    pub id: u8,
    /// The clock moves this many ms first (back, if negative).
    pub dt_ms: i16,
    pub lease_ms: u16,
    pub weight: u8,
    pub limit: u8,
}

/// A lease key and the calls made on it.
#[derive(Clone, Debug)]
pub struct LeaseCase {
    pub hash: BTreeMap<Vec<u8>, Vec<u8>>,
    /// No planted summary or list and no field that holds no lease: the exact
    /// properties apply.
    pub trusted: bool,
    pub steps: Vec<LeaseStep>,
}

fn id(n: u8) -> Vec<u8> {
    format!("i{}", n % IDS).into_bytes()
}

/// Fuzzer bytes as a lease case: a flags byte (bit 0: summary bytes
/// follow the leases; bit 1: some values are raw bytes; bit 2: list bytes
/// follow them), a lease count,
/// each lease as (id, expiry in ms from now as an i16, weight) or, with
/// bit 1 and an odd id byte, a raw value of up to 15 bytes; then the
/// summary and the list (each a length and bytes); then the calls, seven bytes each (kind,
/// id, the clock's step in ms as an i16, lease_ms as a u16, weight).
pub fn lease_case_from_bytes(data: &[u8]) -> LeaseCase {
    let mut r = Reader(data);
    let flags = r.u8();
    let mut hash = BTreeMap::new();
    let mut raw = false;
    for _ in 0..r.u8() % 40 {
        let idb = r.u8();
        let value = if flags & 2 != 0 && idb % 2 == 1 {
            raw = true;
            (0..r.u8() % 16).map(|_| r.u8()).collect()
        } else {
            let offset = r.i16();
            let lease = Lease {
                expires_us: NOW + i64::from(offset) * 1000,
                weight: 1 + i64::from(r.u8() % 4),
            };
            lease.text()
        };
        hash.insert(id(idb / 2), value);
    }
    let planted = flags & 1 != 0;
    if planted {
        let summary: Vec<u8> = (0..r.u8() % 64).map(|_| r.u8()).collect();
        hash.insert(SUMMARY_FIELD.to_vec(), summary);
    }
    if flags & 4 != 0 {
        let list: Vec<u8> = (0..r.u8() % 64).map(|_| r.u8()).collect();
        hash.insert(LIST_FIELD.to_vec(), list);
    }
    let mut steps = Vec::new();
    while !r.is_empty() {
        let (kind, id, dt_ms, lease_ms) = (r.u8() % 4, r.u8(), r.i16(), r.u16().max(1));
        let weight = 1 + r.u8() % 4;
        steps.push(LeaseStep {
            kind,
            id,
            dt_ms,
            lease_ms,
            weight,
            // At least the weight: a weight above the limit is an
            // argument error, never reaching the key.
            limit: weight + id % 40,
        });
    }
    LeaseCase {
        hash,
        trusted: !planted && flags & 4 == 0 && !raw,
        steps,
    }
}

/// Property (d) for one case.
pub fn check_leases(case: &LeaseCase) {
    let mut hash = case.hash.clone();
    let mut now = NOW;
    let mut written = false;
    for (i, step) in case.steps.iter().enumerate() {
        now += i64::from(step.dt_ms) * 1000;
        let id = id(step.id);
        let view = if hash.is_empty() {
            KeyView::Missing
        } else {
            KeyView::Hash(&hash)
        };
        let (limit, lease_ms, weight) = (
            i64::from(step.limit),
            i64::from(step.lease_ms),
            i64::from(step.weight),
        );
        let kind =
            [Kind::Acquire, Kind::Release, Kind::Renew, Kind::Inflight][usize::from(step.kind)];
        let result = decide(&view, Some(&id), now, kind, |v| {
            Ok(match kind {
                Kind::Acquire => {
                    let call = Acquire {
                        limit,
                        lease_ms,
                        weight,
                        clauses: Vec::new(),
                    };
                    let a = acquire(v, &call, &[])?;
                    assert!(a.head[2] >= 0, "step {i}: a negative wait {a:?}");
                    (a.head[0], Some(a.head[1]))
                }
                Kind::Release => {
                    let [done, in_use] = release(v)?;
                    (done, Some(in_use))
                }
                Kind::Renew => {
                    let [done, ms] = renew(v, lease_ms)?;
                    assert!(ms >= 0, "step {i}: renewed for {ms} ms");
                    (done, None)
                }
                Kind::Inflight => (1, Some(v.in_use())),
            })
        });
        let ((done, in_use), write) = match result {
            Ok(r) => r,
            Err(e) => {
                // A field or the caller's own value that holds no lease.
                assert_eq!(e, Error::NotALeaseKey, "step {i}");
                assert!(!case.trusted, "step {i}: {e} on well-formed leases");
                continue;
            }
        };
        assert!(done == 0 || done == 1, "step {i}: {done}");
        if let Some(in_use) = in_use {
            assert!(in_use >= 0, "step {i}: a negative weight {in_use}");
        }
        if let Some(write) = &write {
            write_leases(&mut hash, &id, write);
            written = true;
        }
        if case.trusted {
            if let Some(in_use) = in_use {
                assert_eq!(in_use, live_weight(&hash, now), "step {i}: {step:?}");
            }
            // A key as written before summaries has none until a write.
            if let Some(problem) = lease_summary_problem(&hash).filter(|_| written) {
                panic!("step {i}: {step:?}: {problem}");
            }
        }
    }
}
