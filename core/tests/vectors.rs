//! The contract cases of `tests/vectors.json`, checked against tb_core.
//!
//! The same file drives `tests/lua_vectors.rs` (the Lua library, the EVAL
//! scripts and the module on a real server), so the pure functions, the
//! module and the fallback are held to one list of expectations. Keys are
//! read by tb-core's rule (`state::load`, as `src/keyspace.rs` does); what
//! `src/commands.rs` does around it (save-or-delete, what is written when)
//! is repeated here in a few lines so that whole commands can be checked
//! without a server. Lease keys likewise: read field by field into
//! `tb_core::lease::Scan`, decided by `tb_core::lease`, and written as
//! `src/leases.rs` and `LeaseKey::apply` write them.

use std::collections::BTreeMap;
use tb_core::args::{parse_adjust, parse_consume, parse_mconsume};
use tb_core::bucket::{consume_all, consume_all_if, Effect, Outcome};
use tb_core::error::{Error, StateError};
use tb_core::lease::{self, Scan, Write};
use tb_core::state::Text;
use testkit::vectors::{vectors, After, Before, Case};

/// `BucketKey::apply`: the outcome's effect on the key.
fn save(after: &mut BTreeMap<String, After>, key: &str, o: &Outcome) {
    let state = match o.effect {
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
                parse_adjust(argv.as_slice())
            } else {
                parse_consume(argv.as_slice())
            }
            .map_err(bad_args)?;
            let key = &argv[1];
            let l = call.limits;
            let stored = case.key(key).load().map_err(|e| e.to_string())?;
            let o = match case.command.as_str() {
                "peek" => l.peek(stored, now, call.amount),
                "adjust" => l.adjust(stored, now, call.amount),
                _ => l.consume(stored, now, call.amount),
            };
            save(&mut after, key, &o);
            Ok((ints(&o), after))
        }
        "mconsume" => {
            let groups = parse_mconsume(argv.as_slice()).map_err(bad_args)?;
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
        "acquire" | "release" | "renew" | "inflight" => run_lease(case, &argv, now, after),
        other => panic!("{}: unknown command {other}", case.name),
    }
}

/// `LeaseKey::scan`: a missing key holds no lease, a hash is read field
/// by field, anything else is WRONGTYPE.
fn scan<'a>(case: &'a Case, key: &str, id: Option<&'a [u8]>, now: i64) -> Result<Scan<'a>, String> {
    let mut scan = Scan::new(id, now);
    match case.state.get(key) {
        None => {}
        Some(Before::String(_)) => return Err(Error::WrongType.to_string()),
        Some(Before::Hash(h)) => {
            for (field, value) in h {
                scan.visit(field.as_bytes(), value.as_bytes())
                    .map_err(|e| e.to_string())?;
            }
        }
    }
    Ok(scan)
}

/// `LeaseKey::apply`: the lease key after `write`.
fn write_leases(
    after: &mut BTreeMap<String, After>,
    case: &Case,
    key: &str,
    id: &str,
    scan: &Scan,
    write: &Write,
) {
    let state = match write {
        Write::Nothing => return,
        Write::Delete => After::Same("absent".to_string()),
        Write::Save {
            set,
            remove_own,
            expire_at_ms,
        } => {
            let mut leases = match case.state.get(key) {
                Some(Before::Hash(h)) => h.clone(),
                _ => BTreeMap::new(),
            };
            for field in &scan.expired {
                leases.remove(&String::from_utf8_lossy(field).into_owned());
            }
            if *remove_own {
                leases.remove(id);
            }
            if let Some(lease) = set {
                leases.insert(
                    id.to_string(),
                    String::from_utf8_lossy(&lease.text()).into_owned(),
                );
            }
            After::Leases {
                leases,
                expire_at_ms: *expire_at_ms,
            }
        }
    };
    after.insert(key.to_string(), state);
}

/// A lease command as `src/leases.rs` runs it.
fn run_lease(case: &Case, argv: &[String], now: i64, mut after: BTreeMap<String, After>) -> Run {
    let bad_args = |e: Error| e.to_string();
    let key = argv[1].as_str();
    match case.command.as_str() {
        "acquire" => {
            let call = lease::parse_acquire(argv).map_err(bad_args)?;
            let id = argv[lease::ACQUIRE_ID_INDEX].as_str();
            let scan = scan(case, key, Some(id.as_bytes()), now)?;
            let mut buckets = Vec::new();
            for (i, g) in call.buckets.iter().enumerate() {
                let stored = case
                    .key(&argv[g.key_index])
                    .load()
                    .map_err(|e| e.in_group(i + 1).to_string())?;
                buckets.push((g.limits, stored, g.cost));
            }
            let taken = lease::acquire(&scan, &call);
            let (pay, bucket_retry, outcomes) = consume_all_if(&buckets, now, taken.fits);
            let acquired = taken.fits && pay;
            let mut reply = if acquired {
                write_leases(&mut after, case, key, id, &scan, &taken.write);
                vec![1, taken.in_use_if_taken, 0, taken.expires_in_ms(now)]
            } else {
                let retry = taken.retry_after_ms.max(bucket_retry);
                vec![0, taken.in_use_if_not, retry, 0]
            }
            .into_iter()
            .map(|n| serde_json::json!(n))
            .collect::<Vec<_>>();
            for (g, o) in call.buckets.iter().zip(&outcomes) {
                save(&mut after, &argv[g.key_index], o);
                reply.push(ints(o));
            }
            Ok((serde_json::Value::Array(reply), after))
        }
        "release" | "renew" => {
            let lease_ms = if case.command == "release" {
                lease::parse_release(argv).map(|()| None)
            } else {
                lease::parse_renew(argv).map(Some)
            }
            .map_err(bad_args)?;
            let id = argv[lease::ID_INDEX].as_str();
            let scan = scan(case, key, Some(id.as_bytes()), now)?;
            let (done, n, write) = match lease_ms {
                None => lease::release(&scan),
                Some(ms) => lease::renew(&scan, ms),
            };
            write_leases(&mut after, case, key, id, &scan, &write);
            Ok((serde_json::json!([i64::from(done), n]), after))
        }
        _ => {
            lease::parse_inflight(argv).map_err(bad_args)?;
            let scan = scan(case, key, None, now)?;
            Ok((serde_json::json!(scan.in_use()), after))
        }
    }
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
