//! Whether the server's memory settings can evict the module's keys, and
//! what that does to the limits: the module reads `maxmemory-policy` and
//! `maxmemory`, and warns (once per setting) when its keys are at risk.
//!
//! Every limiter key is at risk under any policy but `noeviction` once a
//! `maxmemory` is set: an evicted bucket comes back full (it mints the
//! tokens it had spent), and an evicted lease key frees every slot of its
//! cap. The `volatile-*` policies pick among keys with a TTL, and every
//! bucket and lease key has one, usually shorter than a cache's entries.

use crate::contract::warn;

/// What the settings mean for the module's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Risk {
    /// `noeviction`, or no `maxmemory`: nothing is evicted (writes are
    /// refused with OOM at the limit, which the clients treat as Redis
    /// failing).
    None,
    /// Any key may go, limiter keys among them.
    AllKeys,
    /// Keys with a TTL may go: every bucket and lease key has one.
    Volatile,
}

impl Risk {
    /// The risk of `policy` (as CONFIG GET answers it) with `maxmemory`
    /// bytes (0: no limit). A policy this code does not know is taken as a
    /// risk: a new policy that evicts must not pass for a safe one.
    pub fn of(policy: &str, maxmemory: u64) -> Risk {
        if maxmemory == 0 || policy.eq_ignore_ascii_case("noeviction") {
            Risk::None
        } else if policy
            .as_bytes()
            .get(..9)
            .is_some_and(|p| p.eq_ignore_ascii_case(b"volatile-"))
        {
            Risk::Volatile
        } else {
            Risk::AllKeys
        }
    }

    /// INFO's flag: 1 where keys can be evicted.
    pub fn flag(self) -> u64 {
        u64::from(self != Risk::None)
    }

    /// The warning the module logs, or None where there is no risk.
    pub fn warning(self, policy: &str, maxmemory: u64) -> Option<String> {
        let what = match self {
            Risk::None => return None,
            Risk::AllKeys => warn::EVICTION_ALLKEYS,
            Risk::Volatile => warn::EVICTION_VOLATILE,
        };
        // The clients log the same line (contract.json's "warnings").
        Some(
            warn::EVICTION
                .replace("{policy}", policy)
                .replace("{maxmemory}", &maxmemory.to_string())
                .replace("{what}", what),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::Risk;

    #[test]
    fn no_maxmemory_or_noeviction_is_safe() {
        assert_eq!(Risk::of("allkeys-lru", 0), Risk::None);
        assert_eq!(Risk::of("noeviction", 1 << 30), Risk::None);
        assert_eq!(Risk::of("NoEviction", 1 << 30), Risk::None);
        assert_eq!(Risk::None.flag(), 0);
        assert_eq!(Risk::None.warning("noeviction", 1), None);
    }

    #[test]
    fn every_evicting_policy_is_a_risk() {
        for policy in ["allkeys-lru", "allkeys-lfu", "allkeys-random"] {
            assert_eq!(Risk::of(policy, 100), Risk::AllKeys, "{policy}");
        }
        for policy in [
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
        ] {
            assert_eq!(Risk::of(policy, 100), Risk::Volatile, "{policy}");
        }
        assert_eq!(Risk::AllKeys.flag(), 1);
        assert_eq!(Risk::Volatile.flag(), 1);
    }

    #[test]
    fn an_unknown_policy_counts_as_a_risk() {
        assert_eq!(Risk::of("some-future-policy", 100), Risk::AllKeys);
        assert_eq!(Risk::of("", 100), Risk::AllKeys);
        assert_eq!(Risk::of("volatile", 100), Risk::AllKeys);
    }

    #[test]
    fn the_warning_names_the_setting_and_what_it_costs() {
        let w = Risk::of("volatile-ttl", 1024).warning("volatile-ttl", 1024);
        let w = w.unwrap_or_default();
        for part in [
            "volatile-ttl",
            "1024",
            "TTL",
            "minting",
            "lease",
            "noeviction",
        ] {
            assert!(w.contains(part), "{part} missing from {w}");
        }
        let w = Risk::AllKeys.warning("allkeys-lru", 5).unwrap_or_default();
        assert!(w.contains("allkeys-lru") && w.contains("any key"), "{w}");
    }
}
