//! Which configured limit a request's descriptor meets, as
//! envoyproxy/ratelimit decides it: level by level, `key_value` before a
//! wildcard before `key` alone, and a limit only at the descriptor's last
//! entry.

use crate::config::{Config, Limit, Node};

/// The limit a descriptor meets, and for each entry matched through a
/// `share_threshold` wildcard, the pattern's value that its bucket is
/// keyed by instead of the request's value.
#[derive(Debug, PartialEq)]
pub struct Matched<'c> {
    pub limit: &'c Limit,
    pub shared: Vec<Option<String>>,
}

/// Whether `value` matches a pattern split on `*` (each `*` stands for
/// any run of characters, the empty one included).
pub fn wildcard_match(parts: &[String], value: &str) -> bool {
    let [first, middle @ .., last] = parts else {
        return parts.first().is_some_and(|p| p == value);
    };
    if value.len() < parts.iter().map(String::len).sum::<usize>() {
        return false;
    }
    let Some(rest) = value.strip_prefix(first.as_str()) else {
        return false;
    };
    let Some(mut rest) = rest.strip_suffix(last.as_str()) else {
        return false;
    };
    for part in middle {
        match rest.find(part.as_str()) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// The limit of `domain` that `entries` (key, value pairs) meet, if any.
pub fn find<'c>(
    config: &'c Config,
    domain: &str,
    entries: &[(String, String)],
) -> Option<Matched<'c>> {
    let mut node: &Node = config.domains.get(domain)?;
    let mut found = None;
    let mut shared = vec![None; entries.len()];
    for (i, (key, value)) in entries.iter().enumerate() {
        let composite = format!("{key}_{value}");
        let mut next = node.children.get(&composite);
        let mut via_wildcard = None;
        if next.is_none() {
            for (pattern, parts) in &node.wildcards {
                if wildcard_match(parts, &composite) {
                    next = node.children.get(pattern);
                    via_wildcard = Some(pattern);
                    break;
                }
            }
        }
        if next.is_none() {
            next = node.children.get(key);
        }
        let Some(next) = next else { break };
        if let Some(pattern) = via_wildcard {
            if next.share_threshold {
                let prefix = format!("{key}_");
                shared[i] = Some(pattern.strip_prefix(&prefix).unwrap_or(pattern).to_string());
            }
        }
        if i + 1 == entries.len() {
            found = next.limit.as_ref();
        }
        if next.children.is_empty() {
            break;
        }
        node = next;
    }
    found.map(|limit| Matched { limit, shared })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        let mut c = Config::default();
        c.add_str("t.yaml", text).unwrap();
        c
    }

    fn e(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn rpu(c: &Config, d: &str, pairs: &[(&str, &str)]) -> Option<u32> {
        find(c, d, &e(pairs)).map(|m| m.limit.requests_per_unit)
    }

    fn split(p: &str) -> Vec<String> {
        p.split('*').map(str::to_string).collect()
    }

    #[test]
    fn wildcards_match_as_the_peers() {
        assert!(wildcard_match(&split("k_value*"), "k_value1"));
        assert!(wildcard_match(&split("k_value*"), "k_value"));
        assert!(!wildcard_match(&split("k_value*"), "k_valu"));
        assert!(wildcard_match(&split("p_/a/*/c"), "p_/a/b/c"));
        assert!(!wildcard_match(&split("p_/a/*/c"), "p_/a/b/d"));
        assert!(wildcard_match(&split("p_a*b*c"), "p_axxbyyc"));
        assert!(!wildcard_match(&split("p_a*b*c"), "p_axxcyyb"));
        // Prefix and suffix must not overlap.
        assert!(!wildcard_match(&split("k_ab*ba"), "k_aba"));
        assert!(wildcard_match(&split("k_plain"), "k_plain"));
        assert!(!wildcard_match(&split("k_plain"), "k_plainer"));
    }

    const EXAMPLE_3: &str = "domain: edge_proxy_per_ip\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n  - key: remote_address\n    value: 50.0.0.5\n    rate_limit: {unit: second, requests_per_unit: 0}\n";

    #[test]
    fn key_value_is_tried_before_key() {
        let c = config(EXAMPLE_3);
        assert_eq!(
            rpu(&c, "edge_proxy_per_ip", &[("remote_address", "50.0.0.1")]),
            Some(10)
        );
        assert_eq!(
            rpu(&c, "edge_proxy_per_ip", &[("remote_address", "50.0.0.5")]),
            Some(0)
        );
        assert_eq!(rpu(&c, "edge_proxy_per_ip", &[("other", "x")]), None);
        assert_eq!(
            rpu(&c, "unknown_domain", &[("remote_address", "50.0.0.1")]),
            None
        );
        assert_eq!(rpu(&c, "edge_proxy_per_ip", &[]), None);
    }

    #[test]
    fn depth_must_equal_the_descriptors_length() {
        let flat = config("domain: example4\ndescriptors:\n  - key: key\n    value: value\n    rate_limit: {unit: second, requests_per_unit: 300}\n");
        assert_eq!(
            rpu(
                &flat,
                "example4",
                &[("key", "value"), ("subkey", "subvalue")]
            ),
            None
        );
        assert_eq!(rpu(&flat, "example4", &[("key", "value")]), Some(300));
        let nested = config("domain: example4\ndescriptors:\n  - key: key\n    value: value\n    descriptors:\n      - key: subkey\n        rate_limit: {unit: second, requests_per_unit: 300}\n");
        assert_eq!(
            rpu(
                &nested,
                "example4",
                &[("key", "value"), ("subkey", "subvalue")]
            ),
            Some(300)
        );
        assert_eq!(rpu(&nested, "example4", &[("key", "value")]), None);
    }

    #[test]
    fn a_literal_beats_a_wildcard_and_wildcards_go_in_file_order() {
        let c = config("domain: d\ndescriptors:\n  - key: p\n    value: /api/*\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: p\n    value: /api/v2*\n    rate_limit: {unit: second, requests_per_unit: 2}\n  - key: p\n    value: /api/v2/x\n    rate_limit: {unit: second, requests_per_unit: 3}\n  - key: p\n    rate_limit: {unit: second, requests_per_unit: 4}\n");
        assert_eq!(rpu(&c, "d", &[("p", "/api/v2/x")]), Some(3));
        assert_eq!(rpu(&c, "d", &[("p", "/api/v2/y")]), Some(1));
        assert_eq!(rpu(&c, "d", &[("p", "/other")]), Some(4));
    }

    #[test]
    fn a_shared_wildcard_keys_by_its_pattern() {
        let c = config("domain: d\ndescriptors:\n  - key: files\n    value: a/*\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: own\n    value: a/*\n    rate_limit: {unit: second, requests_per_unit: 1}\n");
        let m = find(&c, "d", &e(&[("files", "a/x.pdf")])).unwrap();
        assert_eq!(m.shared, vec![Some("a/*".to_string())]);
        let m = find(&c, "d", &e(&[("own", "a/x.pdf")])).unwrap();
        assert_eq!(m.shared, vec![None]);
    }

    #[test]
    fn nested_wildcards_descend() {
        let c = config("domain: d\ndescriptors:\n  - key: svc\n    value: auth*\n    descriptors:\n      - key: user\n        rate_limit: {unit: minute, requests_per_unit: 7}\n");
        assert_eq!(rpu(&c, "d", &[("svc", "auth-v2"), ("user", "u")]), Some(7));
        assert_eq!(rpu(&c, "d", &[("svc", "billing"), ("user", "u")]), None);
    }
}
