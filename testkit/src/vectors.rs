//! `tests/vectors.json`: the contract cases that `core/tests/vectors.rs`
//! checks against tb-core and `tests/lua_vectors.rs` on real servers
//! (the module, the Lua library, the EVAL script), so that every form is
//! held to one list of expectations.

use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Deserialize, Debug)]
pub struct Vectors {
    pub base_ts_us: i64,
    pub cases: Vec<Case>,
}

#[derive(Deserialize, Debug)]
pub struct Case {
    pub name: String,
    /// `consume`, `peek`, `adjust`, `mconsume`, `charge`, a quota command
    /// (`quota`, `qpeek`, `qadjust`), or a lease command: `acquire`, `release`,
    /// `renew`, `inflight`.
    pub command: String,
    pub keys: Vec<String>,
    /// In the library's layout: the keys' arguments, in order.
    pub args: Vec<String>,
    pub state: BTreeMap<String, Before>,
    /// The call's clock, from `base_ts_us`.
    pub elapsed_us: i64,
    /// Either `reply` and `after`, or `error`.
    pub reply: Option<serde_json::Value>,
    pub error: Option<String>,
    pub after: Option<BTreeMap<String, After>>,
}

/// A key's value before the call.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "lowercase")]
pub enum Before {
    Hash(BTreeMap<String, String>),
    /// A key of another type: only the type matters to the commands.
    String(String),
}

/// A key after the call.
#[derive(Deserialize, Debug, PartialEq)]
#[serde(untagged)]
pub enum After {
    /// "unchanged" or "absent".
    Same(String),
    Bucket {
        tokens: String,
        ts: String,
        expire_at_ms: i64,
    },
    /// A quota key (TB.QUOTA and friends).
    Quota {
        used: String,
        start: String,
        expire_at_ms: i64,
    },
    /// A lease key: every field (id → `<expires_at_us>:<weight>`).
    Leases {
        leases: BTreeMap<String, String>,
        expire_at_ms: i64,
    },
}

/// Reads `tests/vectors.json`.
pub fn vectors() -> Vectors {
    let path = crate::root().join("tests/vectors.json");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).expect("parse tests/vectors.json")
}

impl Case {
    /// The module's arguments after the command name.
    pub fn module_args(&self) -> Vec<String> {
        module_args(&self.command, &self.keys, &self.args)
    }

    /// The key as the case stores it, for tb-core's rule.
    pub fn key(&self, key: &str) -> crate::KeyView<'_, String, String> {
        match self.state.get(key) {
            None => crate::KeyView::Missing,
            Some(Before::Hash(h)) => crate::KeyView::Hash(h),
            Some(Before::String(_)) => crate::KeyView::Other,
        }
    }
}

/// The module's arguments (after the command name) for `keys` and `args`
/// in the library's layout: each key followed by its arguments (TB.MCONSUME
/// interleaves its keys with groups of three), arguments left over at the
/// end. TB.ACQUIRE takes the lease key and its own arguments, then a
/// clause per further key, its key after its keyword; TB.CHARGE takes
/// `numkeys`, the keys, then ARGV.
pub fn module_args(command: &str, keys: &[String], args: &[String]) -> Vec<String> {
    if command == "acquire" {
        return acquire_args(keys, args);
    }
    if command == "charge" {
        // TB.CHARGE counts its keys first, as FCALL does.
        let mut out = vec![keys.len().to_string()];
        out.extend(keys.iter().chain(args).cloned());
        return out;
    }
    let per_key = if command == "mconsume" { 3 } else { args.len() };
    let mut args = args.iter();
    let mut out = Vec::new();
    for key in keys {
        out.push(key.clone());
        out.extend(args.by_ref().take(per_key).cloned());
    }
    out.extend(args.cloned());
    out
}

/// TB.ACQUIRE's arguments: the lease key, `limit lease_ms id [weight]`,
/// then a clause per further key. In the library's keyword form (a
/// `BUCKET` or `QUOTA` after the id or the weight) each clause's key goes
/// after its keyword; in the older form ARGV ends with three numbers per
/// bucket key, each made a `BUCKET bkey max rate cost` clause.
fn acquire_args(keys: &[String], args: &[String]) -> Vec<String> {
    let is_keyword =
        |a: &String| a.eq_ignore_ascii_case("BUCKET") || a.eq_ignore_ascii_case("QUOTA");
    let mut out: Vec<String> = keys.iter().take(1).cloned().collect();
    if let Some(first) = (3..args.len().min(5)).find(|&i| is_keyword(&args[i])) {
        out.extend(args[..first].iter().cloned());
        let mut clause_keys = keys.iter().skip(1);
        for a in &args[first..] {
            out.push(a.clone());
            if is_keyword(a) {
                out.extend(clause_keys.next().cloned());
            }
        }
        return out;
    }
    let buckets = keys.len().saturating_sub(1);
    let own = args.len().saturating_sub(3 * buckets);
    out.extend(args[..own].iter().cloned());
    let mut groups = args[own..].chunks(3);
    for key in keys.iter().skip(1) {
        out.extend(["BUCKET".to_string(), key.clone()]);
        out.extend(groups.next().into_iter().flatten().cloned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn mconsume_interleaves_groups_of_three_and_keeps_what_is_left() {
        let keys = strings(&["a", "b"]);
        let args = strings(&["1", "2", "3", "4", "5", "6", "7"]);
        assert_eq!(
            module_args("mconsume", &keys, &args),
            strings(&["a", "1", "2", "3", "b", "4", "5", "6", "7"])
        );
        assert_eq!(
            module_args("consume", &keys[..1], &args[..3]),
            strings(&["a", "1", "2", "3"])
        );
        assert_eq!(module_args("mconsume", &[], &args[..1]), strings(&["1"]));
    }

    #[test]
    fn acquire_puts_each_further_key_in_a_bucket_clause() {
        let keys = strings(&["l", "b", "c"]);
        let args = strings(&["8", "1000", "id", "2", "10", "1", "1", "5", "2", "3"]);
        assert_eq!(
            module_args("acquire", &keys, &args),
            strings(&[
                "l", "8", "1000", "id", "2", "BUCKET", "b", "10", "1", "1", "BUCKET", "c", "5",
                "2", "3"
            ])
        );
        assert_eq!(
            module_args("acquire", &keys[..1], &args[..3]),
            strings(&["l", "8", "1000", "id"])
        );
        let args = strings(&[
            "8", "1000", "id", "QUOTA", "5", "DAY", "1", "OFFSET", "60", "bucket", "10", "1", "1",
        ]);
        assert_eq!(
            module_args("acquire", &keys, &args),
            strings(&[
                "l", "8", "1000", "id", "QUOTA", "b", "5", "DAY", "1", "OFFSET", "60", "bucket",
                "c", "10", "1", "1"
            ])
        );
        assert_eq!(
            module_args("release", &keys[..1], &args[2..3]),
            strings(&["l", "id"])
        );
    }
}
