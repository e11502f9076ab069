//! TB.CHARGE: buckets and quotas charged in one all-or-nothing decision,
//! and with `WAIT`, buckets that admit reservations (see
//! `Limits::reserve`), which TB.MCONSUME's fixed groups can't take.
//!
//! * [`args`]: the arguments;
//! * this file: the decision, from each key's stored state to each key's
//!   reply and write.

pub mod args;

pub use args::{charge_key_positions, parse_charge, Charge, NUMKEYS_INDEX};

use crate::bucket::{self, Limits};
use crate::quota::{self, Quota};

/// What one clause limits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limit {
    Bucket(Limits),
    Quota(Quota),
}

/// One validated clause: its key, what it limits, and the cost.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Clause {
    pub key_index: usize,
    pub limit: Limit,
    pub cost: f64,
}

/// A clause key's stored state, read by the rule of its kind.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum State {
    Bucket(Option<bucket::Stored>),
    Quota(Option<quota::Stored>),
}

/// What the call does to one key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Effect {
    Bucket(bucket::Effect),
    Quota(quota::Effect),
}

/// One key's reply and write.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Item {
    pub reply: [i64; 4],
    pub effect: Effect,
}

impl Clause {
    /// What this clause answers at `now_us` on `state`, charging only if
    /// `charge`. The handlers read each key by its clause's kind; a state
    /// of the other kind would read as a missing key.
    fn outcome(&self, state: State, now_us: i64, wait_ms: Option<i64>, charge: bool) -> Item {
        match self.limit {
            Limit::Bucket(l) => {
                let stored = match state {
                    State::Bucket(s) => s,
                    State::Quota(_) => None,
                };
                let o = match (wait_ms, charge) {
                    (Some(ms), _) => l.reserve(stored, now_us, self.cost, ms, charge),
                    (None, true) => l.consume(stored, now_us, self.cost),
                    (None, false) => l.peek(stored, now_us, self.cost),
                };
                Item {
                    reply: o.reply(),
                    effect: Effect::Bucket(o.effect),
                }
            }
            Limit::Quota(q) => {
                let stored = match state {
                    State::Quota(s) => s,
                    State::Bucket(_) => None,
                };
                let o = q.consume(stored, now_us, self.cost, charge);
                Item {
                    reply: o.reply(),
                    effect: Effect::Quota(o.effect),
                }
            }
        }
    }
}

/// Every clause's item at `now_us`, charging none unless `charge`.
fn items(
    clauses: &[Clause],
    states: &[State],
    now_us: i64,
    wait_ms: Option<i64>,
    charge: bool,
) -> Vec<Item> {
    clauses
        .iter()
        .zip(states)
        .map(|(c, s)| c.outcome(*s, now_us, wait_ms, charge))
        .collect()
}

fn all_admitted(items: &[Item]) -> bool {
    items.iter().all(|i| i.reply[0] == 1)
}

/// Every clause at `now_us`, all or nothing: whether all were admitted,
/// the call's retry (admitted: the longest reservation wait; denied: the
/// longest wait of a clause that can't pass now), and each key's item
/// (charged only if all were admitted).
pub fn decide(charge: &Charge, states: &[State], now_us: i64) -> (bool, i64, Vec<Item>) {
    let wait = charge.wait_ms;
    let tried = items(&charge.clauses, states, now_us, wait, false);
    let all = all_admitted(&tried);
    let items = if all {
        items(&charge.clauses, states, now_us, wait, true)
    } else {
        tried
    };
    let retry = items
        .iter()
        .filter(|i| all || i.reply[0] == 0)
        .map(|i| i.reply[2])
        .max()
        .unwrap_or(0);
    (all, retry, items)
}

/// The clauses as part of a larger decision (TB.ACQUIRE's, beside its
/// lease): charged only if they all could pay and `rest_admits`. Returns
/// whether the clauses alone could all pay, the longest wait among them
/// (0 for one that passes), and each key's item.
pub fn consume_all_if(
    clauses: &[Clause],
    states: &[State],
    now_us: i64,
    rest_admits: bool,
) -> (bool, i64, Vec<Item>) {
    let tried = items(clauses, states, now_us, None, false);
    let all = all_admitted(&tried);
    let items = if all && rest_admits {
        items(clauses, states, now_us, None, true)
    } else {
        tried
    };
    let retry = items.iter().map(|i| i.reply[2]).max().unwrap_or(0);
    (all, retry, items)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::Memos;

    const NOW: i64 = 1_893_456_000_000_000;

    fn call(s: &[&str]) -> Charge {
        parse_charge(s, &Memos::new()).unwrap()
    }

    #[test]
    fn a_spent_quota_charges_no_bucket() {
        let c = call(&[
            "tb.charge",
            "2",
            "m",
            "q",
            "BUCKET",
            "10",
            "1",
            "1",
            "QUOTA",
            "5",
            "DAY",
            "1",
        ]);
        let spent = Some(quota::Stored {
            used: 5.0,
            start: NOW / 1_000_000,
        });
        let (all, retry, items) = decide(&c, &[State::Bucket(None), State::Quota(spent)], NOW);
        assert!(!all);
        assert_eq!(retry, 86_400_000);
        assert_eq!(items[0].reply, [1, 10, 0, 0]);
        assert_eq!(items[0].effect, Effect::Bucket(bucket::Effect::Nothing));
        assert_eq!(items[1].effect, Effect::Quota(quota::Effect::Nothing));
        let (all, retry, items) = decide(&c, &[State::Bucket(None), State::Quota(None)], NOW);
        assert!(all && retry == 0);
        assert_eq!(items[0].reply, [1, 9, 0, 1000]);
        assert_eq!(items[1].reply, [1, 4, 0, 86_400_000]);
    }

    #[test]
    fn with_wait_the_call_waits_for_its_slowest_reservation() {
        let c = call(&[
            "tb.charge",
            "2",
            "a",
            "b",
            "WAIT",
            "5000",
            "BUCKET",
            "10",
            "1",
            "3",
            "BUCKET",
            "10",
            "2",
            "3",
        ]);
        let empty = Some(bucket::Stored {
            tokens: 0.0,
            ts_us: NOW,
        });
        let (all, retry, items) = decide(&c, &[State::Bucket(empty), State::Bucket(empty)], NOW);
        assert!(all);
        assert_eq!(retry, 3000);
        assert_eq!((items[0].reply[2], items[1].reply[2]), (3000, 1500));
        // One bucket past max_ms: nobody is charged, and the call's retry is
        // that bucket's time to pass outright.
        let c = call(&[
            "tb.charge",
            "2",
            "a",
            "b",
            "WAIT",
            "2000",
            "BUCKET",
            "10",
            "1",
            "3",
            "BUCKET",
            "10",
            "2",
            "3",
        ]);
        let (all, retry, items) = decide(&c, &[State::Bucket(empty), State::Bucket(empty)], NOW);
        assert!(!all);
        assert_eq!(retry, 3000);
        assert!(items
            .iter()
            .all(|i| matches!(i.effect, Effect::Bucket(bucket::Effect::Nothing))));
    }
}
