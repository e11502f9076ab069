//! The Redis key of a descriptor's bucket: `rls:{<domain>}:<k>=<v>;<k>=<v>`,
//! and of its calendar quota: `rls:q:<period>:{<domain>}:...`.
//!
//! The domain is the hash tag, so all of a request's keys share a Cluster
//! slot and one TB.MCONSUME (or TB.CHARGE) decides them. Escaping (`\` before `\`, `}` in
//! the domain, and before `\`, `=`, `;` in entries) makes the layout
//! unambiguous: two different (domain, entries) never share a key.

fn escape(out: &mut String, text: &str, special: &[char]) {
    for c in text.chars() {
        if c == '\\' || special.contains(&c) {
            out.push('\\');
        }
        out.push(c);
    }
}

/// The key of `entries` (key, value as keyed) in `domain`.
pub fn bucket_key<'a>(
    domain: &str,
    entries: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> String {
    keyed(String::from("rls:{"), domain, entries)
}

/// The calendar quota's key of the same descriptor:
/// `rls:q:<period>[<offset>]:{<domain>}:...`, e.g. `rls:q:month:{d}:k=v`,
/// `rls:q:day+330:{d}:k=v`. A bucket key always has `{` right after `rls:`,
/// so the two never meet (a quota key used as a bucket is an error in
/// Redis); the hash tag is the same, so they share the request's slot.
/// The period and offset are in the key so that changing either in the
/// config starts a fresh budget rather than reading another calendar's.
pub fn quota_key<'a>(
    domain: &str,
    period: &str,
    utc_offset_minutes: i32,
    entries: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> String {
    let mut prefix = format!("rls:q:{}", period.to_ascii_lowercase());
    if utc_offset_minutes != 0 {
        prefix.push_str(&format!("{utc_offset_minutes:+}"));
    }
    prefix.push_str(":{");
    keyed(prefix, domain, entries)
}

fn keyed<'a>(
    mut key: String,
    domain: &str,
    entries: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> String {
    escape(&mut key, domain, &['}']);
    key.push_str("}:");
    for (i, (k, v)) in entries.into_iter().enumerate() {
        if i > 0 {
            key.push(';');
        }
        escape(&mut key, k, &['=', ';']);
        key.push('=');
        escape(&mut key, v, &['=', ';']);
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_readable() {
        assert_eq!(
            bucket_key(
                "messaging",
                [("message_type", "marketing"), ("to_number", "2061111111")]
            ),
            "rls:{messaging}:message_type=marketing;to_number=2061111111"
        );
    }

    #[test]
    fn a_quota_key_names_its_calendar_and_never_is_a_bucket_key() {
        assert_eq!(
            quota_key("d", "MONTH", 0, [("k", "v")]),
            "rls:q:month:{d}:k=v"
        );
        assert_eq!(
            quota_key("d", "DAY", 330, [("k", "v")]),
            "rls:q:day+330:{d}:k=v"
        );
        assert_eq!(
            quota_key("d", "DAY", -300, [("k", "v")]),
            "rls:q:day-300:{d}:k=v"
        );
        // No domain or entry makes a bucket key that reads as a quota key.
        for (domain, k) in [("d", "k"), ("q:month:{d", "k"), ("d", "q:month")] {
            let bucket = bucket_key(domain, [(k, "v")]);
            assert!(bucket.starts_with("rls:{"), "{bucket}");
            assert_ne!(bucket, quota_key("d", "MONTH", 0, [("k", "v")]));
        }
    }

    #[test]
    fn separators_in_values_cannot_collide() {
        let a = bucket_key("d", [("a", "b;c=d")]);
        let b = bucket_key("d", [("a", "b"), ("c", "d")]);
        assert_ne!(a, b);
        assert_ne!(
            bucket_key("d}:x", [("k", "v")]),
            bucket_key("d", [("x}:k", "v")])
        );
        assert_ne!(
            bucket_key("d", [("a\\", "b")]),
            bucket_key("d", [("a", "\\b")])
        );
    }

    #[test]
    fn every_key_of_a_domain_has_the_same_hash_tag() {
        // Redis hashes the text between the first `{` and the next `}`.
        fn tag(key: &str) -> &str {
            let open = key.find('{').unwrap();
            let close = key[open + 1..].find('}').unwrap();
            &key[open + 1..open + 1 + close]
        }
        for domain in ["plain", "with}brace", "with\\slash", "{"] {
            let a = bucket_key(domain, [("k", "v")]);
            let b = bucket_key(domain, [("other", "}{"), ("x", "y")]);
            let q = quota_key(domain, "WEEK", -60, [("k", "v")]);
            assert_eq!(tag(&a), tag(&b), "{domain}");
            assert_eq!(tag(&a), tag(&q), "{domain}");
        }
    }
}
