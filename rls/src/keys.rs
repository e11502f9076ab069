//! The Redis key of a descriptor's bucket: `rls:{<domain>}:<k>=<v>;<k>=<v>`.
//!
//! The domain is the hash tag, so all of a request's keys share a Cluster
//! slot and one TB.MCONSUME decides them. Escaping (`\` before `\`, `}` in
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
    let mut key = String::from("rls:{");
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
            assert_eq!(tag(&a), tag(&b), "{domain}");
        }
    }
}
