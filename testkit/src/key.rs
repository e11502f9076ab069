//! A key as a test holds it (a snapshot, a vectors case), read by
//! tb-core's one rule, `tb_core::state::load` (and as a
//! `tb_core::lease::LeaseStore` for a lease key), so no test restates it;
//! and a lease call's write applied to such a hash, as the module applies
//! it ([`write_leases`]).

use std::collections::BTreeMap;
use tb_core::bucket::Stored;
use tb_core::contract::{START_FIELD, TOKENS_FIELD, TS_FIELD, USED_FIELD};
use tb_core::error::Error;
use tb_core::lease::stored::{self, Header};
use tb_core::lease::{
    Lease, LeaseStore, ListField, Part, Write, LIST_FIELD, SUMMARY_FIELD, TRACKED,
};
use tb_core::quota::{self, QuotaFields};
use tb_core::state::{load, BucketFields, KeyKind};

/// What a key holds: nothing, a hash (field → value), or another type.
#[derive(Debug)]
pub enum KeyView<'a, K, V> {
    Missing,
    Hash(&'a BTreeMap<K, V>),
    Other,
}

impl<K: AsRef<[u8]>, V: AsRef<[u8]>> KeyView<'_, K, V> {
    pub fn kind(&self) -> KeyKind {
        match self {
            KeyView::Missing => KeyKind::Missing,
            KeyView::Hash(h) => KeyKind::Hash(h.len()),
            KeyView::Other => KeyKind::Other,
        }
    }

    /// The bucket (`None`: missing, a full bucket), or why the key is
    /// none, as the commands reply it.
    pub fn load(&self) -> Result<Option<Stored>, Error> {
        load(self.kind(), self)
    }

    /// The quota (`None`: missing, nothing used), by `quota::load`.
    pub fn load_quota(&self) -> Result<Option<quota::Stored>, Error> {
        quota::load(self.kind(), self)
    }
}

impl<K: AsRef<[u8]>, V: AsRef<[u8]>> QuotaFields for KeyView<'_, K, V> {
    fn with_fields<R>(&self, f: impl FnOnce(Option<&[u8]>, Option<&[u8]>) -> R) -> R {
        f(
            self.field(USED_FIELD.as_bytes()),
            self.field(START_FIELD.as_bytes()),
        )
    }
}

impl<K: AsRef<[u8]>, V: AsRef<[u8]>> KeyView<'_, K, V> {
    fn field(&self, name: &[u8]) -> Option<&[u8]> {
        match self {
            KeyView::Hash(h) => h
                .iter()
                .find(|(k, _)| k.as_ref() == name)
                .map(|(_, v)| v.as_ref()),
            _ => None,
        }
    }
}

/// As the lease commands read their key (src/keyspace.rs `LeaseKey`).
impl<K: AsRef<[u8]>, V: AsRef<[u8]>> LeaseStore for KeyView<'_, K, V> {
    fn kind(&self) -> KeyKind {
        KeyView::kind(self)
    }

    fn with_summary<R>(
        &self,
        id: Option<&[u8]>,
        f: impl for<'x> FnOnce(Option<&'x [u8]>, Option<&'x [u8]>, ListField<'x>) -> R,
    ) -> R {
        let list = self.field(LIST_FIELD);
        f(
            self.field(SUMMARY_FIELD),
            id.and_then(|id| self.field(id)),
            ListField(&list),
        )
    }

    fn scan(&self, mut visit: impl FnMut(&[u8], &[u8]) -> Result<(), Error>) -> Result<(), Error> {
        match self {
            KeyView::Hash(h) => h
                .iter()
                .try_for_each(|(f, v)| visit(f.as_ref(), v.as_ref())),
            _ => Ok(()),
        }
    }
}

/// Applies a lease call's `write` for `id` to `hash`, as the module does
/// (`LeaseKey::apply`): the key's expire time in ms after it, `None` once
/// the key is deleted (the hash is then empty).
pub fn write_leases(
    hash: &mut BTreeMap<Vec<u8>, Vec<u8>>,
    id: &[u8],
    write: &Write,
) -> Option<i64> {
    match write {
        Write::Delete => {
            hash.clear();
            None
        }
        Write::Save {
            expire_first,
            own,
            summary,
            list,
            delete,
            expire_at_ms,
        } => {
            for part in Write::order(*expire_first) {
                match part {
                    Part::Set => {
                        if let Some(lease) = own {
                            hash.insert(id.to_vec(), Lease::text(lease));
                        }
                        if let Some(text) = summary {
                            hash.insert(SUMMARY_FIELD.to_vec(), text.clone());
                        }
                        if let Some(text) = list {
                            hash.insert(LIST_FIELD.to_vec(), text.clone());
                        }
                    }
                    Part::Remove => {
                        for field in delete {
                            hash.remove(field);
                        }
                    }
                    Part::Expire => {}
                }
            }
            Some(*expire_at_ms)
        }
    }
}

/// The live weight of a lease hash at `now_us`, read by brute force: every
/// field but the summary and list that holds a lease expiring after
/// `now_us`.
pub fn live_weight(hash: &BTreeMap<Vec<u8>, Vec<u8>>, now_us: i64) -> i64 {
    hash.iter()
        .filter(|(f, _)| f.as_slice() != SUMMARY_FIELD && f.as_slice() != LIST_FIELD)
        .filter_map(|(_, v)| Lease::parse(v))
        .filter(|l| l.is_live(now_us))
        .map(|l| l.weight)
        .sum()
}

/// What is wrong with a lease hash's summary, if anything: it must hold
/// the totals of every lease field, list exactly the leases expiring
/// before its horizon (as stored, in ascending expiry) in its list field,
/// name the first of them, and bound every expiry by its latest; a key of
/// more than TRACKED + 1 leases must have one. (A hash with a field that
/// holds no lease has no summary to check.)
pub fn lease_summary_problem(hash: &BTreeMap<Vec<u8>, Vec<u8>>) -> Option<String> {
    let mut leases = Vec::new();
    for (field, value) in hash {
        if field.as_slice() != SUMMARY_FIELD && field.as_slice() != LIST_FIELD {
            leases.push((field.as_slice(), Lease::parse(value)?));
        }
    }
    let (text, list_text) = match (hash.get(SUMMARY_FIELD), hash.get(LIST_FIELD)) {
        (Some(text), Some(list)) => (text, list),
        (None, None) if leases.len() > TRACKED + 1 => {
            return Some(format!("{} leases and no summary", leases.len()))
        }
        (None, None) => return None,
        (Some(_), None) => return Some("a summary with no list field".into()),
        (None, Some(_)) => return Some("a list field with no summary".into()),
    };
    let Some(h) = Header::parse(text) else {
        return Some("the summary's numbers break the grammar".into());
    };
    let Some(listed) = stored::tracked(list_text) else {
        return Some("the summary's list breaks the grammar".into());
    };
    let first = listed.first().map_or(h.horizon_us, |t| t.lease.expires_us);
    if listed.len() != h.listed || first != h.first_us {
        return Some("the summary's listed or first disagrees with its list".into());
    }
    let weight: i64 = leases.iter().map(|(_, l)| l.weight).sum();
    let latest = leases.iter().map(|(_, l)| l.expires_us).max().unwrap_or(0);
    let mut before: Vec<(i64, Vec<u8>, i64)> = leases
        .iter()
        .filter(|(_, l)| l.expires_us < h.horizon_us)
        .map(|(f, l)| (l.expires_us, f.to_vec(), l.weight))
        .collect();
    before.sort();
    let mut list: Vec<(i64, Vec<u8>, i64)> = listed
        .iter()
        .map(|t| (t.lease.expires_us, t.id.to_vec(), t.lease.weight))
        .collect();
    // In ascending expiry, then id: the one order both forms write.
    let ordered = list
        .windows(2)
        .all(|w| (w[0].0, &w[0].1) < (w[1].0, &w[1].1));
    list.sort();
    let problems = [
        (h.count as usize != leases.len(), "count"),
        (h.weight != weight, "weight"),
        (h.latest_us < latest, "latest"),
        (list != before, "the list"),
        (!ordered, "the list's order"),
    ];
    problems
        .iter()
        .find(|(wrong, _)| *wrong)
        .map(|(_, what)| format!("the summary's {what} disagrees with the fields"))
}

impl<K: AsRef<[u8]>, V: AsRef<[u8]>> BucketFields for KeyView<'_, K, V> {
    fn with_fields<R>(&self, f: impl FnOnce(Option<&[u8]>, Option<&[u8]>) -> R) -> R {
        let field = |name: &str| match self {
            KeyView::Hash(h) => h
                .iter()
                .find(|(k, _)| k.as_ref() == name.as_bytes())
                .map(|(_, v)| v.as_ref()),
            _ => None,
        };
        f(field(TOKENS_FIELD), field(TS_FIELD))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tb_core::error::StateError;

    fn hash(fields: &[(&str, &str)]) -> BTreeMap<Vec<u8>, Vec<u8>> {
        fields
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn reads_by_the_rule() {
        let fine = hash(&[("tokens", "2.5"), ("ts", "7")]);
        let stored = Stored {
            tokens: 2.5,
            ts_us: 7,
        };
        assert_eq!(KeyView::Hash(&fine).load(), Ok(Some(stored)));
        let none: KeyView<'_, String, String> = KeyView::Missing;
        assert_eq!(none.load(), Ok(None));
        let other: KeyView<'_, String, String> = KeyView::Other;
        assert_eq!(other.load(), Err(Error::WrongType));
        let extra = hash(&[("tokens", "1"), ("ts", "1"), ("x", "1")]);
        assert_eq!(
            KeyView::Hash(&extra).load(),
            Err(Error::NotABucket(StateError::Fields, None))
        );
        let bad_ts = hash(&[("tokens", "1"), ("ts", "1.5")]);
        assert_eq!(
            KeyView::Hash(&bad_ts).load(),
            Err(Error::NotABucket(StateError::Ts, None))
        );
    }

    #[test]
    fn reads_leases_by_the_rule() {
        use tb_core::lease::{decide, Kind};
        let in_use = |view: &KeyView<'_, Vec<u8>, Vec<u8>>| {
            decide(view, Some(b"me".as_slice()), 10, Kind::Inflight, |v| {
                Ok((v.own().map(|l| l.weight), v.in_use()))
            })
            .map(|(r, _)| r)
        };
        let leases = hash(&[("me", "20:2"), ("x", "30:3"), ("old", "10:1")]);
        assert_eq!(in_use(&KeyView::Hash(&leases)), Ok((Some(2), 5)));
        assert_eq!(in_use(&KeyView::Missing), Ok((None, 0)));
        assert_eq!(in_use(&KeyView::Other), Err(Error::WrongType));
        let bucket = hash(&[("tokens", "1"), ("ts", "1")]);
        assert_eq!(in_use(&KeyView::Hash(&bucket)), Err(Error::NotALeaseKey));
    }
}
