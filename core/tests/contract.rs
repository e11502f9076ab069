//! tb-core against `contract/contract.json`, the one source of the
//! contract's numbers and messages: the generated constants hold the file's
//! values (`python3 contract/gen.py --check` checks every language's copy
//! as text; this checks what Rust reads), and every error reply the module
//! can give is one of the file's templates, filled in.

use serde_json::Value;
use std::collections::BTreeMap;
use tb_core::contract::{self, msg};
use tb_core::error::{Arg, Error, QuotaStateError, StateError, Step};

fn contract_json() -> Value {
    let path = testkit::root().join("contract/contract.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).expect("contract.json parses")
}

fn limit(c: &Value, name: &str) -> f64 {
    c["limits"][name]["value"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("limit {name}"))
}

/// The file's templates with the limits filled in, as gen.py writes them.
fn templates(c: &Value) -> BTreeMap<String, String> {
    let limits = c["limits"].as_object().expect("limits");
    c["errors"]
        .as_object()
        .expect("errors")
        .iter()
        .map(|(name, t)| {
            let mut t = t.as_str().expect("a template").to_string();
            for (limit, spec) in limits {
                t = t.replace(
                    &format!("{{{limit}}}"),
                    spec["value"].as_str().expect("value"),
                );
            }
            (name.clone(), t)
        })
        .collect()
}

#[test]
fn the_constants_are_the_files() {
    let c = contract_json();
    assert_eq!(contract::MAX_CAPACITY, limit(&c, "max_capacity"));
    assert_eq!(contract::MAX_RATE, limit(&c, "max_rate"));
    assert_eq!(contract::MAX_FILL_SECONDS, limit(&c, "max_fill_seconds"));
    assert_eq!(contract::MAX_GROUPS as f64, limit(&c, "max_groups"));
    assert_eq!(contract::MAX_WAIT_MS as f64, limit(&c, "max_wait_ms"));
    assert_eq!(
        contract::MAX_LEASE_LIMIT as f64,
        limit(&c, "max_lease_limit")
    );
    assert_eq!(contract::MAX_LEASE_MS as f64, limit(&c, "max_lease_ms"));
    assert_eq!(
        contract::MAX_LEASE_ID_BYTES as f64,
        limit(&c, "max_lease_id_bytes")
    );
    let mut commands: Vec<&str> = c["commands"]
        .as_object()
        .expect("commands")
        .values()
        .map(|v| v.as_str().expect("a name"))
        .collect();
    let mut ours: Vec<&str> = contract::COMMANDS
        .iter()
        .map(|c| c.to_str().expect("ASCII"))
        .collect();
    commands.sort_unstable();
    ours.sort_unstable();
    assert_eq!(ours, commands);
    assert_eq!(contract::TOKENS_FIELD, c["fields"]["tokens"]);
    assert_eq!(contract::TS_FIELD, c["fields"]["ts"]);
}

/// Fills a template's run-time marks the way the module's replies do.
fn fill(template: &str, values: &[(&str, &str)]) -> String {
    let mut out = template.to_string();
    for (name, value) in values {
        out = out.replace(&format!("{{{name}}}"), value);
    }
    out
}

#[test]
fn every_reply_is_a_template_of_the_file_filled_in() {
    let t = templates(&contract_json());
    let group = |g: &str| fill(&t["group"], &[("group", g)]);
    let cases: Vec<(Error, &str, String)> = vec![
        (
            Error::Arity(contract::PEEK),
            "arity",
            fill(&t["arity"], &[("command", "tb.peek")]),
        ),
        (
            Error::TooManyGroups,
            "too_many_groups",
            t["too_many_groups"].clone(),
        ),
        (
            Error::NotANumber(Arg::Cost, Some(2)),
            "not_a_number",
            fill(
                &t["not_a_number"],
                &[("arg", "cost"), ("in_group", &group("2"))],
            ),
        ),
        (
            Error::MaxOutOfRange(None),
            "max_out_of_range",
            fill(&t["max_out_of_range"], &[("in_group", "")]),
        ),
        (
            Error::RateOutOfRange(Some(7)),
            "rate_out_of_range",
            fill(&t["rate_out_of_range"], &[("in_group", &group("7"))]),
        ),
        (
            Error::FillTooSlow(None),
            "fill_too_slow",
            fill(&t["fill_too_slow"], &[("in_group", "")]),
        ),
        (
            Error::CostNegative(None),
            "cost_negative",
            fill(&t["cost_negative"], &[("in_group", "")]),
        ),
        (
            Error::CostAboveMax(Some(1)),
            "cost_above_max",
            fill(&t["cost_above_max"], &[("in_group", &group("1"))]),
        ),
        (
            Error::CostTooSmall(None),
            "cost_too_small",
            fill(&t["cost_too_small"], &[("in_group", "")]),
        ),
        (
            Error::DuplicateKey { group: 3, first: 1 },
            "duplicate_key",
            fill(&t["duplicate_key"], &[("group", "3"), ("first", "1")]),
        ),
        (
            Error::NotAnInteger(Arg::MaxBurst),
            "not_an_integer",
            fill(&t["not_an_integer"], &[("arg", "max_burst")]),
        ),
        (
            Error::TooSmall(Arg::Count, 1),
            "too_small",
            fill(&t["too_small"], &[("arg", "count"), ("least", "1")]),
        ),
        (
            Error::BurstTooLarge,
            "burst_too_large",
            t["burst_too_large"].clone(),
        ),
        (
            Error::ThrottleRateTooHigh,
            "throttle_rate_too_high",
            t["throttle_rate_too_high"].clone(),
        ),
        (
            Error::ThrottleFillTooSlow,
            "throttle_fill_too_slow",
            t["throttle_fill_too_slow"].clone(),
        ),
        (
            Error::IntOutOfRange(Arg::LeaseMs, 1, 86_400_000),
            "int_out_of_range",
            fill(
                &t["int_out_of_range"],
                &[("arg", "lease_ms"), ("least", "1"), ("most", "86400000")],
            ),
        ),
        (
            Error::WeightAboveLimit,
            "weight_above_limit",
            t["weight_above_limit"].clone(),
        ),
        (Error::BadId, "bad_id", t["bad_id"].clone()),
        (
            Error::BucketIsLeaseKey(2),
            "bucket_is_lease_key",
            fill(&t["bucket_is_lease_key"], &[("group", "2")]),
        ),
        (
            Error::NotALeaseKey,
            "not_a_lease_key",
            t["not_a_lease_key"].clone(),
        ),
        (Error::WrongType, "wrongtype", t["wrongtype"].clone()),
        (
            Error::NotABucket(StateError::Fields, Some(2)),
            "bad_fields",
            fill(&t["bad_fields"], &[("in_group", &group("2"))]),
        ),
        (
            Error::NotABucket(StateError::Tokens, None),
            "bad_tokens",
            fill(&t["bad_tokens"], &[("in_group", "")]),
        ),
        (
            Error::NotABucket(StateError::Ts, None),
            "bad_ts",
            fill(&t["bad_ts"], &[("in_group", "")]),
        ),
        (
            Error::WriteFailed(Step::ReplicateDelete),
            "write_failed",
            fill(&t["write_failed"], &[("step", "replicate DEL")]),
        ),
        (
            Error::OneOf(Arg::ClThrottle, "auto, off"),
            "one_of",
            fill(
                &t["one_of"],
                &[("arg", "cl-throttle"), ("values", "auto, off")],
            ),
        ),
        (
            Error::Internal("no key argument"),
            "internal",
            fill(&t["internal"], &[("what", "no key argument")]),
        ),
        (Error::Panic, "panic", t["panic"].clone()),
        (
            Error::LimitOutOfRange(None),
            "limit_out_of_range",
            fill(&t["limit_out_of_range"], &[("in_group", "")]),
        ),
        (
            Error::CostAboveLimit(Some(2)),
            "cost_above_limit",
            fill(&t["cost_above_limit"], &[("in_group", &group("2"))]),
        ),
        (
            Error::QuotaCostTooSmall(None),
            "quota_cost_too_small",
            fill(&t["quota_cost_too_small"], &[("in_group", "")]),
        ),
        (
            Error::BadPeriod(Some(1)),
            "bad_period",
            fill(&t["bad_period"], &[("in_group", &group("1"))]),
        ),
        (
            Error::ExpectedOffset(4),
            "expected_offset",
            fill(&t["expected_offset"], &[("position", "4")]),
        ),
        (
            Error::ExpectedWait(5),
            "expected_wait",
            fill(&t["expected_wait"], &[("position", "5")]),
        ),
        (
            Error::ExpectedClause(3),
            "expected_clause",
            fill(&t["expected_clause"], &[("position", "3")]),
        ),
        (
            Error::ExpectedWeight(5),
            "expected_weight",
            fill(&t["expected_weight"], &[("position", "5")]),
        ),
        (
            Error::NotAQuota(QuotaStateError::Fields, Some(2)),
            "quota_bad_fields",
            fill(&t["quota_bad_fields"], &[("in_group", &group("2"))]),
        ),
        (
            Error::NotAQuota(QuotaStateError::Used, None),
            "quota_bad_used",
            fill(&t["quota_bad_used"], &[("in_group", "")]),
        ),
        (
            Error::NotAQuota(QuotaStateError::Start, None),
            "quota_bad_start",
            fill(&t["quota_bad_start"], &[("in_group", "")]),
        ),
    ];
    let mut used = vec!["group"];
    for (error, template, want) in &cases {
        assert_eq!(&error.to_string(), want, "{error:?}");
        assert!(!want.contains('{'), "{template}: a mark left unfilled");
        used.push(template);
    }
    // Every template of the file is some reply: none is dead, none missing.
    let mut all: Vec<&str> = t.keys().map(String::as_str).collect();
    all.sort_unstable();
    used.sort_unstable();
    assert_eq!(used, all);
    // The generated module holds the same text.
    assert_eq!(msg::ARITY, t["arity"]);
    assert_eq!(msg::MAX_OUT_OF_RANGE, t["max_out_of_range"]);
}
