//! The contract cases of `tests/vectors.json`, checked against tb_core.
//!
//! The same file drives `tests/lua_vectors.rs` (the Lua library, the EVAL
//! scripts and the module on a real server), so the pure functions, the
//! module and the fallback are held to one list of expectations. Keys are
//! read by tb-core's rule (`state::load`, as `src/keyspace.rs` does); what
//! `src/commands.rs` does around it (save-or-delete, what is written when)
//! is repeated here in a few lines so that whole commands can be checked
//! without a server.

use std::collections::BTreeMap;
use tb_core::args::{parse_adjust, parse_consume, parse_mconsume};
use tb_core::bucket::{consume_all, Effect, Outcome};
use tb_core::error::{Error, StateError};
use tb_core::state::Text;
use testkit::vectors::{vectors, After, Case};

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
        other => panic!("{}: unknown command {other}", case.name),
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
    // checked in tb_core's unit tests and in tests/lua_contract.rs.
}
