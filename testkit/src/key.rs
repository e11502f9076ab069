//! A key as a test holds it (a snapshot, a vectors case), read by
//! tb-core's one rule, `tb_core::state::load` (and `tb_core::lease::Scan`
//! for a lease key), so no test restates it.

use std::collections::BTreeMap;
use tb_core::bucket::Stored;
use tb_core::contract::{TOKENS_FIELD, TS_FIELD};
use tb_core::error::Error;
use tb_core::lease::Scan;
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

    /// Reads every lease into `scan`, as the lease commands read their key
    /// (src/keyspace.rs `LeaseKey::scan`): a missing key holds none, a hash
    /// must hold only leases, anything else is WRONGTYPE.
    pub fn scan_leases(&self, scan: &mut Scan) -> Result<(), Error> {
        match self {
            KeyView::Missing => Ok(()),
            KeyView::Other => Err(Error::WrongType),
            KeyView::Hash(h) => h
                .iter()
                .try_for_each(|(f, v)| scan.visit(f.as_ref(), v.as_ref())),
        }
    }
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
        let scan = |view: &KeyView<'_, Vec<u8>, Vec<u8>>| {
            let mut s = Scan::new(Some(b"me".as_slice()), 10);
            view.scan_leases(&mut s)
                .map(|()| (s.own, s.others_weight, s.expired))
        };
        let leases = hash(&[("me", "20:2"), ("x", "30:3"), ("old", "10:1")]);
        let (own, others, expired) = scan(&KeyView::Hash(&leases)).unwrap();
        assert_eq!(own.map(|l| l.weight), Some(2));
        assert_eq!((others, expired), (3, vec![b"old".to_vec()]));
        assert_eq!(scan(&KeyView::Missing), Ok((None, 0, vec![])));
        assert_eq!(scan(&KeyView::Other), Err(Error::WrongType));
        let bucket = hash(&[("tokens", "1"), ("ts", "1")]);
        assert_eq!(scan(&KeyView::Hash(&bucket)), Err(Error::NotALeaseKey));
    }
}
