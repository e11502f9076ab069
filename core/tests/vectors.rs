//! The contract cases of `tests/vectors.json`, checked against tb_core.
//!
//! The same file drives `tests/lua_vectors.rs` (the Lua library, the EVAL
//! scripts and the module on a real server), so the pure functions, the
//! module and the fallback are held to one list of expectations. Keys are
//! read by tb-core's rule (`state::load`, as `src/keyspace.rs` does); what
//! `src/commands.rs` does around it (save-or-delete, what is written when)
//! is repeated here in a few lines so that whole commands can be checked
//! without a server. Lease keys likewise: decided by `tb_core::lease` as
//! `src/leases.rs` does, and written as `LeaseKey::apply` writes them
//! (`testkit::write_leases`).

use std::collections::BTreeMap;
use tb_core::args::{parse_adjust, parse_consume, parse_mconsume, Memos};
use tb_core::bucket::{consume_all, Effect, Outcome};
use tb_core::charge::{self, parse_charge, Limit, State};
use tb_core::error::{Error, StateError};
use tb_core::lease::{self, Kind};
use tb_core::number::Text;
use tb_core::quota::{self, parse_qadjust, parse_quota};
use testkit::vectors::{vectors, After, Before, Case};
use testkit::write_leases;

/// `BucketKey::apply`: the outcome's effect on the key.
fn save(after: &mut BTreeMap<String, After>, key: &str, o: &Outcome) {
    save_effect(after, key, o.effect);
}

/// A bucket effect on the key.
fn save_effect(after: &mut BTreeMap<String, After>, key: &str, effect: Effect) {
    let state = match effect {
        Effect::Nothing => return,
        Effect::Delete => After::Same("absent".to_string()),
        Effect::Save {
            tokens,
            ts_us,
            expire_at_ms,
        } => After::Bucket {
            tokens: String::from_utf8_lossy(Text::tokens(tokens).as_bytes()).into_owned(),
            ts: ts_us.to_string(),
            expire_at_ms,
        },
    };
    after.insert(key.to_string(), state);
}

/// `QuotaKey::apply`: a quota outcome's effect on the key.
fn save_quota(after: &mut BTreeMap<String, After>, key: &str, o: &quota::Outcome) {
    save_quota_effect(after, key, o.effect);
}

/// A quota effect on the key.
fn save_quota_effect(after: &mut BTreeMap<String, After>, key: &str, effect: quota::Effect) {
    let state = match effect {
        quota::Effect::Nothing => return,
        quota::Effect::Delete => After::Same("absent".to_string()),
        quota::Effect::Save {
            used,
            start,
            expire_at_ms,
        } => After::Quota {
            used: String::from_utf8_lossy(Text::tokens(used).as_bytes()).into_owned(),
            start: start.to_string(),
            expire_at_ms,
        },
    };
    after.insert(key.to_string(), state);
}

fn ints(o: &Outcome) -> serde_json::Value {
    serde_json::json!(o.reply())
}

type Run = Result<(serde_json::Value, BTreeMap<String, After>), String>;

/// One command as the module runs it (`src/commands.rs`).
fn run(case: &Case, now: i64) -> Run {
    let argv: Vec<String> = [format!("tb.{}", case.command)]
        .into_iter()
        .chain(case.module_args())
        .collect();
    let bad_args = |e: Error| e.to_string();
    // A store of its own: the answer without any earlier call's memo.
    let memos = Memos::new();
    // Keys the call does not write stay as they were.
    let mut after: BTreeMap<String, After> = case
        .keys
        .iter()
        .map(|k| {
            let same = if case.state.contains_key(k) {
                "unchanged"
            } else {
                "absent"
            };
            (k.clone(), After::Same(same.to_string()))
        })
        .collect();
    match case.command.as_str() {
        "consume" | "peek" | "adjust" => {
            let call = if case.command == "adjust" {
                parse_adjust(argv.as_slice(), &memos)
            } else {
                parse_consume(argv.as_slice(), &memos)
            }
            .map_err(bad_args)?;
            let key = &argv[1];
            let l = call.limits;
            let stored = case.key(key).load().map_err(|e| e.to_string())?;
            let o = match (case.command.as_str(), call.wait_ms) {
                ("peek", None) => l.peek(stored, now, call.amount),
                ("adjust", _) => l.adjust(stored, now, call.amount),
                (op, Some(max_ms)) => l.reserve(stored, now, call.amount, max_ms, op == "consume"),
                _ => l.consume(stored, now, call.amount),
            };
            save(&mut after, key, &o);
            Ok((ints(&o), after))
        }
        "mconsume" => {
            let groups = parse_mconsume(argv.as_slice(), &memos).map_err(bad_args)?;
            let mut buckets = Vec::new();
            for (i, g) in groups.iter().enumerate() {
                let stored = case
                    .key(&argv[g.key_index])
                    .load()
                    .map_err(|e| e.in_group(i + 1).to_string())?;
                buckets.push((g.limits, stored, g.cost));
            }
            let (all, retry, outcomes) = consume_all(&buckets, now);
            let mut reply = vec![serde_json::json!(i64::from(all)), serde_json::json!(retry)];
            for (g, o) in groups.iter().zip(&outcomes) {
                save(&mut after, &argv[g.key_index], o);
                reply.push(ints(o));
            }
            Ok((serde_json::Value::Array(reply), after))
        }
        "quota" | "qpeek" | "qadjust" => {
            let adjust = case.command == "qadjust";
            let call = if adjust {
                parse_qadjust(argv.as_slice())
            } else {
                parse_quota(argv.as_slice())
            }
            .map_err(bad_args)?;
            let key = &argv[1];
            let stored = case.key(key).load_quota().map_err(|e| e.to_string())?;
            let o = if adjust {
                call.quota.adjust(stored, now, call.amount)
            } else {
                call.quota
                    .consume(stored, now, call.amount, case.command == "quota")
            };
            save_quota(&mut after, key, &o);
            Ok((serde_json::json!(o.reply()), after))
        }
        "charge" => {
            let call = parse_charge(argv.as_slice(), &memos).map_err(bad_args)?;
            let states = clause_states(case, &argv, &call.clauses)?;
            let (all, retry, items) = charge::decide(&call, &states, now);
            let mut reply = vec![serde_json::json!(i64::from(all)), serde_json::json!(retry)];
            reply.extend(save_items(&mut after, &argv, &call.clauses, &items));
            Ok((serde_json::Value::Array(reply), after))
        }
        "acquire" | "release" | "renew" | "inflight" => run_lease(case, &argv, now, after, &memos),
        other => panic!("{}: unknown command {other}", case.name),
    }
}

/// Each clause's key, read by its kind, as `src/charge.rs` and
/// `src/leases.rs` read them: the first bad key's error, in its group.
fn clause_states(
    case: &Case,
    argv: &[String],
    clauses: &[charge::Clause],
) -> Result<Vec<State>, String> {
    let mut states = Vec::new();
    for (i, c) in clauses.iter().enumerate() {
        let key = case.key(&argv[c.key_index]);
        let in_group = |e: Error| e.in_group(i + 1).to_string();
        states.push(match c.limit {
            Limit::Bucket(_) => State::Bucket(key.load().map_err(in_group)?),
            Limit::Quota(_) => State::Quota(key.load_quota().map_err(in_group)?),
        });
    }
    Ok(states)
}

/// Each clause's write applied to `after`, and its reply.
fn save_items(
    after: &mut BTreeMap<String, After>,
    argv: &[String],
    clauses: &[charge::Clause],
    items: &[charge::Item],
) -> Vec<serde_json::Value> {
    clauses
        .iter()
        .zip(items)
        .map(|(c, item)| {
            let key = &argv[c.key_index];
            match item.effect {
                charge::Effect::Bucket(effect) => save_effect(after, key, effect),
                charge::Effect::Quota(effect) => save_quota_effect(after, key, effect),
            }
            serde_json::json!(item.reply)
        })
        .collect()
}

/// A lease call as `src/leases.rs` runs it: the key read as `LeaseKey`
/// reads it (`tb_core::lease::decide` on the case's hash), the decision,
/// and its write applied as `LeaseKey::apply` applies it.
fn run_lease(
    case: &Case,
    argv: &[String],
    now: i64,
    mut after: BTreeMap<String, After>,
    memos: &Memos,
) -> Run {
    let bad_args = |e: Error| e.to_string();
    let key = argv[1].as_str();
    let (kind, id) = match case.command.as_str() {
        "acquire" => (Kind::Acquire, Some(lease::ACQUIRE_ID_INDEX)),
        "release" => (Kind::Release, Some(lease::ID_INDEX)),
        "renew" => (Kind::Renew, Some(lease::ID_INDEX)),
        _ => (Kind::Inflight, None),
    };
    let id = id.and_then(|i| argv.get(i)).map(|a| a.as_bytes());
    let view = case.key(key);
    let (reply, write) = match kind {
        Kind::Acquire => {
            let call = lease::parse_acquire(argv, memos).map_err(bad_args)?;
            let (taken, write) =
                lease::decide(&view, id, now, kind, |leases| {
                    match clause_states(case, argv, &call.clauses) {
                        Ok(states) => lease::acquire(leases, &call, &states).map(Ok),
                        Err(e) => Ok(Err(e)),
                    }
                })
                .map_err(|e| e.to_string())?;
            let taken = taken?;
            let mut reply: Vec<serde_json::Value> =
                taken.head.iter().map(|n| serde_json::json!(n)).collect();
            reply.extend(save_items(&mut after, argv, &call.clauses, &taken.items));
            (serde_json::Value::Array(reply), write)
        }
        Kind::Release | Kind::Renew => {
            let lease_ms = if kind == Kind::Release {
                lease::parse_release(argv).map(|()| None)
            } else {
                lease::parse_renew(argv).map(Some)
            }
            .map_err(bad_args)?;
            let (r, write) = lease::decide(&view, id, now, kind, |leases| match lease_ms {
                None => lease::release(leases),
                Some(ms) => lease::renew(leases, ms),
            })
            .map_err(|e| e.to_string())?;
            (serde_json::json!(r), write)
        }
        Kind::Inflight => {
            lease::parse_inflight(argv).map_err(bad_args)?;
            let (n, write) = lease::decide(&view, None, now, kind, |l| Ok(l.in_use()))
                .map_err(|e| e.to_string())?;
            (serde_json::json!(n), write)
        }
    };
    if let Some(write) = write {
        let mut hash: BTreeMap<Vec<u8>, Vec<u8>> = match case.state.get(key) {
            Some(Before::Hash(h)) => h
                .iter()
                .map(|(f, v)| (f.as_bytes().to_vec(), v.as_bytes().to_vec()))
                .collect(),
            _ => BTreeMap::new(),
        };
        let state = match write_leases(&mut hash, id.unwrap_or_default(), &write) {
            None => After::Same("absent".to_string()),
            Some(expire_at_ms) => After::Leases {
                leases: hash
                    .into_iter()
                    .map(|(f, v)| {
                        let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
                        (text(f), text(v))
                    })
                    .collect(),
                expire_at_ms,
            },
        };
        after.insert(key.to_string(), state);
    }
    Ok((reply, after))
}

#[test]
fn every_vector_holds_for_tb_core() {
    let v = vectors();
    assert!(v.cases.len() >= 30, "only {} cases", v.cases.len());
    for case in &v.cases {
        let now = v.base_ts_us + case.elapsed_us;
        let got = run(case, now);
        match (&case.error, &case.reply, &case.after) {
            (Some(e), None, None) => {
                assert_eq!(got.err().as_ref(), Some(e), "{}", case.name);
            }
            (None, Some(reply), Some(after)) => {
                let (r, a) = got.unwrap_or_else(|e| panic!("{}: error {e}", case.name));
                assert_eq!(&r, reply, "{}: reply", case.name);
                assert_eq!(&a, after, "{}: keys after the call", case.name);
            }
            _ => panic!("{}: a case has an error, or a reply and after", case.name),
        }
    }
}

#[test]
fn vectors_cover_every_error_message() {
    let v = vectors();
    let errors: Vec<&str> = v.cases.iter().filter_map(|c| c.error.as_deref()).collect();
    for fragment in [
        "wrong number of arguments for 'tb.consume'",
        "wrong number of arguments for 'tb.peek'",
        "wrong number of arguments for 'tb.adjust'",
        "wrong number of arguments for 'tb.mconsume'",
        "ERR max must be a finite decimal number",
        "ERR max must be > 0 and <= 1e12",
        "ERR rate must be a finite decimal number",
        "ERR rate must be > 0 and <= 1e12",
        "ERR rate is too low for max",
        "ERR cost must be a finite decimal number",
        "ERR cost must be >= 0",
        "ERR cost must not exceed max",
        "ERR cost is too small to charge",
        "ERR delta must be a finite decimal number",
        "ERR duplicate key",
        "(group 2)",
        "wrong number of arguments for 'tb.acquire'",
        "wrong number of arguments for 'tb.release'",
        "wrong number of arguments for 'tb.renew'",
        "wrong number of arguments for 'tb.inflight'",
        "ERR limit must be an integer",
        "ERR limit must be >= 1 and <= 1000000",
        "ERR lease_ms must be an integer",
        "ERR lease_ms must be >= 1 and <= 86400000",
        "ERR weight must be an integer",
        "ERR weight must be >= 1",
        "ERR weight must not exceed limit",
        "ERR id must be 1 to 256 bytes",
        "ERR the key of group 2 is the lease key",
        "ERR key is not a lease key",
        "wrong number of arguments for 'tb.quota'",
        "wrong number of arguments for 'tb.qpeek'",
        "wrong number of arguments for 'tb.qadjust'",
        "ERR limit must be a finite decimal number",
        "ERR limit must be > 0",
        "ERR period must be DAY, WEEK, MONTH, YEAR",
        "ERR cost must not exceed limit",
        "ERR cost is too small to charge a quota",
        "expected OFFSET",
        "ERR offset must be an integer",
        "ERR offset must be >= -1439 and <= 1439",
        "ERR key is not a quota: the hash must hold exactly",
        "ERR key is not a quota: field used",
        "ERR key is not a quota: field start",
        "expected WAIT",
        "ERR max_ms must be an integer",
        "ERR max_ms must be >= 0",
        "wrong number of arguments for 'tb.charge'",
        "expected BUCKET or QUOTA",
        "ERR numkeys must be >= 1",
    ]
    .into_iter()
    .map(str::to_string)
    .chain(
        [
            Error::WrongType,
            Error::NotABucket(StateError::Fields, None),
            Error::NotABucket(StateError::Tokens, None),
            Error::NotABucket(StateError::Ts, None),
        ]
        .iter()
        .map(Error::to_string),
    ) {
        let fragment = fragment.as_str();
        assert!(
            errors.iter().any(|e| e.contains(fragment)),
            "no case for {fragment:?}"
        );
    }
    // The one message a file of vectors cannot hold (10001 groups) is
    // checked in tb_core's unit tests and in tests/lua_contract.rs; TB.ACQUIRE's
    // `expected BUCKET` has no library layout (its keys are the clauses).
}
