//! The rule that reads a key as a quota: a missing key has used nothing;
//! anything but a hash is WRONGTYPE; a hash must hold exactly `used` (a
//! finite decimal) and `start` (a period's first second: canonical digits,
//! at most `MAX_QUOTA_START`). A bucket's hash is not a quota.

use super::budget::Stored;
use crate::contract::MAX_QUOTA_START;
use crate::error::{Error, QuotaStateError};
use crate::number::{parse_decimal, parse_i64};
use crate::state::{self, KeyKind};

/// A hash whose two quota fields can be read (a key in Redis, a test's map).
pub trait QuotaFields {
    /// Calls `f` with the values of `used` and `start` (`None`: absent).
    fn with_fields<R>(&self, f: impl FnOnce(Option<&[u8]>, Option<&[u8]>) -> R) -> R;
}

/// Reads a key as a quota (`None`: missing, nothing used).
pub fn load(kind: KeyKind, hash: &impl QuotaFields) -> Result<Option<Stored>, Error> {
    state::two_fields(
        kind,
        || {
            hash.with_fields(decode)
                .map_err(|why| Error::NotAQuota(why, None))
        },
        Error::NotAQuota(QuotaStateError::Fields, None),
    )
}

/// Decodes the two fields of a quota hash.
pub fn decode(used: Option<&[u8]>, start: Option<&[u8]>) -> Result<Stored, QuotaStateError> {
    let (Some(used), Some(start)) = (used, start) else {
        return Err(QuotaStateError::Fields);
    };
    Ok(Stored {
        used: parse_decimal(used).ok_or(QuotaStateError::Used)?,
        start: parse_start(start).ok_or(QuotaStateError::Start)?,
    })
}

/// Canonical digits (no sign, no leading zero) up to `MAX_QUOTA_START`.
fn parse_start(text: &[u8]) -> Option<i64> {
    let canonical = !text.is_empty()
        && text.len() <= 10
        && text.iter().all(u8::is_ascii_digit)
        && (text.len() == 1 || text[0] != b'0');
    canonical
        .then(|| parse_i64(text))
        .flatten()
        .filter(|&s| s <= MAX_QUOTA_START)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_two_quota_fields_decode() {
        assert_eq!(
            decode(Some(b"2.5"), Some(b"1893456000")),
            Ok(Stored {
                used: 2.5,
                start: 1_893_456_000
            })
        );
        assert_eq!(decode(None, Some(b"1")), Err(QuotaStateError::Fields));
        assert_eq!(decode(Some(b"x"), Some(b"1")), Err(QuotaStateError::Used));
        for bad in [&b"-1"[..], b"01", b"+1", b"", b"9007199255", b"1.0", b"1e3"] {
            assert_eq!(decode(Some(b"1"), Some(bad)), Err(QuotaStateError::Start));
        }
        assert!(decode(Some(b"1"), Some(b"0")).is_ok());
        assert!(decode(Some(b"1"), Some(b"9007199254")).is_ok());
    }
}
