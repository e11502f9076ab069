//! A bucket is a plain Redis hash with exactly two fields:
//!
//! * `tokens`: a decimal that round-trips the f64 balance exactly;
//! * `ts`: integer microseconds since the Unix epoch (server clock).
//!
//! Plain hashes keep the data readable by a Redis without the module, by
//! the Lua library, and by RDB/AOF tooling. This is the rule that reads a
//! key as a bucket and decodes those fields; `crate::number` writes them.

use crate::bucket::Stored;
use crate::error::{Error, StateError};
use crate::number::{parse_decimal, parse_int16};

/// What a key holds, as far as reading a bucket goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    Missing,
    /// A hash of this many fields.
    Hash(usize),
    /// A string, list, set, ...: anything but a hash.
    Other,
}

/// A hash whose two bucket fields can be read, however it is stored (a key
/// in Redis, a test's map).
pub trait BucketFields {
    /// Calls `f` with the values of `tokens` and `ts` (`None`: absent).
    fn with_fields<R>(&self, f: impl FnOnce(Option<&[u8]>, Option<&[u8]>) -> R) -> R;
}

/// Reads a key as a bucket, by the one rule every form follows: a missing
/// key is a full bucket (`None`); anything but a hash is WRONGTYPE; a hash
/// must hold exactly the two fields, and both must decode. Only a hash of
/// two fields is read.
pub fn load(kind: KeyKind, hash: &impl BucketFields) -> Result<Option<Stored>, Error> {
    two_fields(
        kind,
        || {
            hash.with_fields(decode)
                .map_err(|why| Error::NotABucket(why, None))
        },
        Error::NotABucket(StateError::Fields, None),
    )
}

/// The rule of a key that must be a hash of exactly two fields (a
/// bucket's, a quota's): missing is `None`, anything but a hash is
/// WRONGTYPE, a hash of another size is `bad_fields`, and a hash of two
/// is what `decode` makes of it.
pub fn two_fields<T>(
    kind: KeyKind,
    decode: impl FnOnce() -> Result<T, Error>,
    bad_fields: Error,
) -> Result<Option<T>, Error> {
    match kind {
        KeyKind::Missing => Ok(None),
        KeyKind::Other => Err(Error::WrongType),
        KeyKind::Hash(2) => decode().map(Some),
        KeyKind::Hash(_) => Err(bad_fields),
    }
}

/// Decodes the two fields of a bucket hash. `None` means the field is absent.
pub fn decode(tokens: Option<&[u8]>, ts: Option<&[u8]>) -> Result<Stored, StateError> {
    let (tokens, ts) = match (tokens, ts) {
        (Some(a), Some(b)) => (a, b),
        _ => return Err(StateError::Fields),
    };
    Ok(Stored {
        tokens: parse_decimal(tokens).ok_or(StateError::Tokens)?,
        ts_us: parse_int16(ts).ok_or(StateError::Ts)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{TOKENS_FIELD, TS_FIELD};

    #[test]
    fn lua_formatting_is_accepted() {
        // What `string.format('%.17g', x)` writes in the Lua library.
        let s = decode(Some(b"0.10000000000000001"), Some(b"1764513600123456")).unwrap();
        assert_eq!(s.tokens, 0.1);
        assert_eq!(s.ts_us, 1_764_513_600_123_456);
        assert_eq!(
            decode(Some(b"1.0000000000000001e-05"), Some(b"1"))
                .unwrap()
                .tokens,
            1e-5
        );
    }

    /// A hash as a test holds it.
    struct Map<'a>(&'a [(&'a str, &'a str)]);

    impl BucketFields for Map<'_> {
        fn with_fields<R>(&self, f: impl FnOnce(Option<&[u8]>, Option<&[u8]>) -> R) -> R {
            let get = |name: &str| {
                self.0
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.as_bytes())
            };
            f(get(TOKENS_FIELD), get(TS_FIELD))
        }
    }

    #[test]
    fn load_follows_the_one_rule() {
        let fine = Map(&[("tokens", "2.5"), ("ts", "7")]);
        assert_eq!(load(KeyKind::Missing, &fine), Ok(None));
        assert_eq!(
            load(KeyKind::Hash(2), &fine),
            Ok(Some(Stored {
                tokens: 2.5,
                ts_us: 7
            }))
        );
        assert_eq!(load(KeyKind::Other, &fine), Err(Error::WrongType));
        let three = Map(&[("tokens", "1"), ("ts", "1"), ("x", "1")]);
        assert_eq!(
            load(KeyKind::Hash(3), &three),
            Err(Error::NotABucket(StateError::Fields, None))
        );
        let renamed = Map(&[("tokens", "1"), ("t", "1")]);
        assert_eq!(
            load(KeyKind::Hash(2), &renamed),
            Err(Error::NotABucket(StateError::Fields, None))
        );
        let nan = Map(&[("tokens", "nan"), ("ts", "1")]);
        let e = load(KeyKind::Hash(2), &nan).unwrap_err();
        assert_eq!(e, Error::NotABucket(StateError::Tokens, None));
        assert_eq!(
            e.in_group(2),
            Error::NotABucket(StateError::Tokens, Some(2))
        );
    }

    #[test]
    fn broken_fields_are_errors() {
        assert_eq!(decode(None, Some(b"1")), Err(StateError::Fields));
        assert_eq!(decode(Some(b"1"), None), Err(StateError::Fields));
        assert_eq!(decode(Some(b"nan"), Some(b"1")), Err(StateError::Tokens));
        assert_eq!(decode(Some(b"1"), Some(b"1.5")), Err(StateError::Ts));
        assert_eq!(decode(Some(b"1"), Some(b"")), Err(StateError::Ts));
    }
}
