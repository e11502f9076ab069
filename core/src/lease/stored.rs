//! What a lease key stores, read and written: one field per lease, and on a
//! key of more than [`TRACKED`] leases the summary and list fields. The grammar is
//! contract.json's "stored" (see `crate::contract::LEASE_SUMMARY_FIELD`);
//! the Lua library reads and writes the same text.

use crate::contract::{
    LEASE_LIST_FIELD, LEASE_SUMMARY_FIELD, LEASE_TRACKED, MAX_LEASE_ID_BYTES, MAX_LEASE_LIMIT,
    MAX_STORED_INTEGER,
};
use crate::number::{digit_run, Text};
use std::borrow::Cow;

/// The summary's field name: empty, which no lease id can be.
pub const SUMMARY_FIELD: &[u8] = LEASE_SUMMARY_FIELD.as_bytes();

/// The list field's name: longer than any lease id can be.
pub const LIST_FIELD: &[u8] = &LEASE_LIST_FIELD;

/// The leases a summary lists.
pub const TRACKED: usize = LEASE_TRACKED;

/// A stored integer at the start of `s`: canonical decimal (`0`, or digits
/// with no leading zero, at most MAX_STORED_INTEGER, which a Lua number
/// holds exactly), and the bytes it takes. `None` if `s` starts with
/// anything else.
#[inline(always)]
fn int_at(s: &[u8]) -> Option<(i64, usize)> {
    let (v, n) = digit_run(s);
    // Past 19 digits the run's value has wrapped: refused by the count.
    if n == 0 || n > 16 || (n > 1 && s[0] == b'0') {
        return None;
    }
    let v = i64::try_from(v).ok()?;
    (v <= MAX_STORED_INTEGER).then_some((v, n))
}

/// A stored integer of at most `digits` digits at the start of `s`, read
/// a byte at a time (a weight, an id's length), and the bytes it takes.
#[inline(always)]
fn small_at(s: &[u8], digits: usize) -> Option<(i64, usize)> {
    let mut v = 0;
    let mut n = 0;
    while let Some(&c) = s.get(n).filter(|c| c.is_ascii_digit()) {
        if n == digits {
            return None;
        }
        v = v * 10 + i64::from(c - b'0');
        n += 1;
    }
    (n > 0 && (n == 1 || s[0] != b'0')).then_some((v, n))
}

/// A whole slice as one stored integer.
fn int(s: &[u8]) -> Option<i64> {
    int_at(s).and_then(|(v, n)| (n == s.len()).then_some(v))
}

/// One lease as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Microseconds since the Unix epoch, server clock.
    pub expires_us: i64,
    pub weight: i64,
}

impl Lease {
    /// Reads a lease field's value, `<expires_at_us>:<weight>`: two stored
    /// integers, the weight one a lease can have (1 to MAX_LEASE_LIMIT, so
    /// sums of them can't overflow). `None` for anything else, which makes
    /// the key not a lease key.
    pub fn parse(value: &[u8]) -> Option<Lease> {
        let (expires_us, n) = int_at(value)?;
        if value.get(n) != Some(&b':') {
            return None;
        }
        let weight = int(&value[n + 1..])?;
        (1..=MAX_LEASE_LIMIT)
            .contains(&weight)
            .then_some(Lease { expires_us, weight })
    }

    /// The stored value, `<expires_at_us>:<weight>`.
    pub fn text(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(24);
        out.extend_from_slice(Text::int(self.expires_us).as_bytes());
        out.push(b':');
        out.extend_from_slice(Text::int(self.weight).as_bytes());
        out
    }

    pub fn is_live(&self, now_us: i64) -> bool {
        now_us < self.expires_us
    }
}

/// A lease the summary lists, with its id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tracked<'a> {
    pub lease: Lease,
    pub id: Cow<'a, [u8]>,
    /// Its text in the summary it was read from (`;e:w:len:id`), which a
    /// new summary copies rather than writing it again.
    pub text: Option<&'a [u8]>,
}

impl<'a> Tracked<'a> {
    pub fn new(lease: Lease, id: Cow<'a, [u8]>) -> Self {
        Tracked {
            lease,
            id,
            text: None,
        }
    }
}

/// The summary's numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The total weight of the key's lease fields.
    pub weight: i64,
    /// How many lease fields the key holds.
    pub count: i64,
    /// How many leases the list holds (at most TRACKED).
    pub listed: usize,
    /// Every lease expiring before this is listed.
    pub horizon_us: i64,
    /// No lease expires after this.
    pub latest_us: i64,
    /// The first listed lease's expiry; the horizon if none is listed.
    pub first_us: i64,
}

impl Header {
    /// Reads a summary; `None` if it breaks the grammar or lists more than
    /// TRACKED leases.
    pub fn parse(text: &[u8]) -> Option<Header> {
        let mut at = 0;
        let mut next = |last: bool| {
            let (v, n) = int_at(&text[at..])?;
            at += n;
            match text.get(at) {
                Some(b':') if !last => at += 1,
                None if last => {}
                _ => return None,
            }
            Some(v)
        };
        let (weight, count, listed) = (next(false)?, next(false)?, next(false)?);
        let (horizon_us, latest_us, first_us) = (next(false)?, next(false)?, next(true)?);
        let listed = usize::try_from(listed).ok().filter(|&n| n <= TRACKED)?;
        Some(Header {
            weight,
            count,
            listed,
            horizon_us,
            latest_us,
            first_us,
        })
    }

    /// The summary's text.
    pub fn text(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(80);
        let numbers = [
            self.weight,
            self.count,
            self.listed as i64,
            self.horizon_us,
            self.latest_us,
            self.first_us,
        ];
        for (i, v) in numbers.into_iter().enumerate() {
            if i > 0 {
                out.push(b':');
            }
            out.extend_from_slice(Text::int(v).as_bytes());
        }
        out
    }
}

/// Every lease of a list field's text, in the order stored; `None` if one
/// breaks the grammar. The count, the order, the horizon and the totals
/// are the caller's to check.
pub fn tracked(mut list: &[u8]) -> Option<Vec<Tracked<'_>>> {
    let mut out = Vec::new();
    while !list.is_empty() {
        let (t, after) = entry(list)?;
        out.push(t);
        list = after;
    }
    Some(out)
}

/// The expiry of the first lease of a list's text, read without the rest;
/// `None` if it breaks the grammar.
pub fn first_expiry(list: &[u8]) -> Option<i64> {
    let (v, n) = int_at(list.strip_prefix(b";")?)?;
    (list.get(1 + n) == Some(&b':')).then_some(v)
}

/// The listed lease `text` starts with, `;<expires_at_us>:<weight>:<id
/// bytes>:<id>`, and the text after it; `None` if it breaks the grammar.
pub fn entry(text: &[u8]) -> Option<(Tracked<'_>, &[u8])> {
    let after = text.strip_prefix(b";")?;
    let mut at = 0;
    // The expiry, then the weight (at most 7 digits) and the id's length
    // (3), a byte at a time: longer ones are out of range.
    let mut next = |digits| {
        let (v, n) = if digits == 0 {
            int_at(&after[at..])?
        } else {
            small_at(&after[at..], digits)?
        };
        at += n;
        (after.get(at) == Some(&b':')).then(|| at += 1)?;
        Some(v)
    };
    let (expires_us, weight, len) = (next(0)?, next(7)?, next(3)?);
    let len = usize::try_from(len).ok()?;
    if !(1..=MAX_LEASE_LIMIT).contains(&weight) || !(1..=MAX_LEASE_ID_BYTES).contains(&len) {
        return None;
    }
    let id = after.get(at..at + len)?;
    let t = Tracked {
        lease: Lease { expires_us, weight },
        id: Cow::Borrowed(id),
        text: Some(&text[..1 + at + len]),
    };
    Some((t, &after[at + len..]))
}

/// The list field's text: the leases in `tracked`, then `rest`, the text
/// of more as stored.
pub fn list_text(tracked: &[Tracked], rest: &[u8]) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(rest.len() + tracked.iter().map(|t| 32 + t.id.len()).sum::<usize>());
    let int = |out: &mut Vec<u8>, sep: &[u8], v: i64| {
        out.extend_from_slice(sep);
        out.extend_from_slice(Text::int(v).as_bytes());
    };
    for t in tracked {
        if let Some(text) = t.text {
            out.extend_from_slice(text);
            continue;
        }
        int(&mut out, b";", t.lease.expires_us);
        int(&mut out, b":", t.lease.weight);
        int(&mut out, b":", t.id.len() as i64);
        out.push(b':');
        out.extend_from_slice(&t.id);
    }
    out.extend_from_slice(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::number::parse_i64;

    #[test]
    fn stored_integers_are_canonical_decimals_that_fit_an_i64() {
        let mut rng = testkit::Rng(0x5EED_1EA5);
        let mut samples: Vec<String> = [
            "0",
            "00",
            "01",
            "9007199254740991",
            "9007199254740992",
            "9223372036854775807",
            "9223372036854775808",
            "18446744073709551615",
            "00000000000000000000001",
            "1a",
            "",
            "+1",
            "-1",
            " 1",
            "1 ",
        ]
        .map(String::from)
        .to_vec();
        for _ in 0..20_000 {
            let x = rng.next();
            samples.push((x >> (x % 64)).to_string());
            samples.push(format!("{:0width$}", x % 1000, width = (x % 25) as usize));
        }
        for s in samples {
            let canonical = !s.is_empty()
                && s.bytes().all(|b| b.is_ascii_digit())
                && (s == "0" || !s.starts_with('0'));
            let want = parse_i64(s.as_bytes()).filter(|&v| canonical && v <= MAX_STORED_INTEGER);
            assert_eq!(int(s.as_bytes()), want, "{s:?}");
        }
    }

    #[test]
    fn stored_values_read_as_their_two_integers() {
        // The reading by parts: split at the first colon, each side a
        // stored integer, the weight in range.
        let by_parts = |v: &[u8]| {
            let colon = v.iter().position(|&b| b == b':')?;
            let lease = Lease {
                expires_us: int(&v[..colon])?,
                weight: int(&v[colon + 1..])?,
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
            let weight = format!("{:0width$}", x % 7, width = (x % 3) as usize);
            let mut v = format!("{expires}:{weight}").into_bytes();
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
            expires_us: 1_764_513_600_000_000,
            weight: 3,
        };
        assert_eq!(Lease::parse(&l.text()), Some(l));
        assert_eq!(
            Lease::parse(b"0:1"),
            Some(Lease {
                expires_us: 0,
                weight: 1
            })
        );
        for bad in [
            &b""[..],
            b"1",
            b"1:",
            b":1",
            b"1:0",
            b"1:01",
            b"01:1",
            b"1:0001",
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

    fn tracked(e: i64, w: i64, id: &str) -> Tracked<'static> {
        let lease = Lease {
            expires_us: e,
            weight: w,
        };
        Tracked::new(lease, Cow::Owned(id.as_bytes().to_vec()))
    }

    /// As read back: each with its text.
    fn read(list: &[Tracked<'static>]) -> Vec<(Lease, Vec<u8>)> {
        list.iter().map(|t| (t.lease, t.id.to_vec())).collect()
    }

    #[test]
    fn a_summary_reads_back_what_was_written() {
        let h = Header {
            weight: 40,
            count: 20,
            listed: 3,
            horizon_us: 13,
            latest_us: 99,
            first_us: 10,
        };
        assert_eq!(h.text(), b"40:20:3:13:99:10");
        assert_eq!(Header::parse(&h.text()), Some(h));
        let list = [
            tracked(10, 2, "a"),
            tracked(12, 1, "b;:7:x"),
            tracked(12, 5, "c"),
        ];
        let text = list_text(&list, b"");
        assert_eq!(text, b";10:2:1:a;12:1:6:b;:7:x;12:5:1:c");
        assert_eq!(first_expiry(&text), Some(10));
        let back = super::tracked(&text).unwrap();
        assert_eq!(
            read(
                &back
                    .iter()
                    .map(|t| Tracked::new(t.lease, t.id.to_vec().into()))
                    .collect::<Vec<_>>()
            ),
            read(&list)
        );
        // Written again from what was read: the same text, copied.
        assert!(back.iter().all(|t| t.text.is_some()));
        assert_eq!(list_text(&back, b""), text);
        // Two read, the third left as text.
        let (first, rest) = entry(&text).unwrap();
        let (second, rest) = entry(rest).unwrap();
        assert_eq!(first_expiry(rest), Some(12));
        assert_eq!(list_text(&[first, second], rest), text);
        assert_eq!(list_text(&[], b""), b"");
        assert_eq!(super::tracked(b""), Some(vec![]));
        assert_eq!(first_expiry(b""), None);
        let full: Vec<_> = (0..TRACKED as i64)
            .map(|i| tracked(i, 1, &"i".repeat(MAX_LEASE_ID_BYTES)))
            .collect();
        let text = list_text(&full, b"");
        let back = super::tracked(&text).unwrap();
        assert_eq!(list_text(&back, b""), text);
        assert_eq!(back.len(), full.len());
        // No id can be the list field's name.
        assert_eq!(LIST_FIELD.len(), MAX_LEASE_ID_BYTES + 1);
    }

    #[test]
    fn a_summary_that_breaks_the_grammar_reads_as_none() {
        for bad in [
            &b""[..],
            b"1:1:1",
            b"1:1:0:1:1",
            b"1:1:0:1:1:",
            b"1:1:0:1:1:1:",
            b"1:1:0:1:1:1:1",
            b"1:1:0:1:01:1",
            b"1:1:0:1:-1:1",
            b"1:1:0:1:1x:1",
            b"1:1:0:1:1:1;5:1:1:a",
            b"1:1:9:1:1:1",
            b"a:1:1:1:1:1",
        ] {
            assert_eq!(
                Header::parse(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        for bad_list in [
            &b";"[..],
            b";5",
            b";5:1",
            b";5:1:1",
            b";5:1:2:a",
            b";5:1:0:",
            b";5:0:1:a",
            b";5:1:257:a",
            b";5:1:1:ab",
            b";5:1:1:a;",
            b";05:1:1:a",
            b"5:1:1:a",
        ] {
            assert_eq!(
                super::tracked(bad_list),
                None,
                "{:?}",
                String::from_utf8_lossy(bad_list)
            );
        }
        for bad_first in [
            &b";x"[..],
            b";05:",
            b";5",
            b"5:1:1:a",
            b";99999999999999999:1",
        ] {
            assert_eq!(first_expiry(bad_first), None, "{bad_first:?}");
        }
    }
}
