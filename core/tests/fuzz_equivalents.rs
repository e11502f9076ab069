//! The four fuzz targets' properties as proptest suites, so they run on
//! stable in every `cargo test`. The properties themselves live in
//! `testkit::oracles` (shared with the libFuzzer targets); this file only
//! generates inputs, biased towards the hostile values that matter.

use proptest::collection::vec;
use proptest::prelude::*;
use testkit::oracles;
use testkit::oracles::{BucketCase, Op};

// ---- (a) argument parsing -----------------------------------------------------

/// Number-like arguments: valid and boundary values, the documented
/// rejects, and arbitrary bytes.
fn number_arg() -> impl Strategy<Value = Vec<u8>> {
    let special = prop::sample::select(vec![
        "1",
        "10",
        "0.17",
        "+2",
        "-2.5",
        "1.",
        ".5",
        "1e3",
        "1E-2",
        "2.5e+1",
        "0",
        "-0",
        "1e12",
        "1e10",
        "100",
        "1000000000000.0001",
        "0.99999",
        "5e-324",
        "1e-310",
        "1e-99999999",
        "1e99999999999999999999",
        "1e309",
        "nan",
        "NaN",
        "inf",
        "-inf",
        "infinity",
        "0x10",
        "1 0",
        " 10",
        "10 ",
        "",
        "10\0",
        "\u{0}1",
        "1_000",
        "１",
        "1e",
        ".",
        "+",
        "--1",
        "1,5",
    ])
    .prop_map(|s| s.as_bytes().to_vec());
    let formatted = prop_oneof![
        any::<f64>().prop_map(|v| format!("{v}")),
        any::<f64>().prop_map(|v| format!("{v:e}")),
        (-20i32..20, 1u32..1_000_000).prop_map(|(e, m)| format!("{m}e{e}")),
        (0.0f64..2e12).prop_map(|v| format!("{v}")),
    ]
    .prop_map(String::into_bytes);
    prop_oneof![
        4 => special,
        4 => formatted,
        2 => vec(prop::sample::select(b"0123456789+-.eE x\0".to_vec()), 0..12),
        1 => vec(any::<u8>(), 0..12),
    ]
}

fn key_arg() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::sample::select(vec!["a", "b", "c", "", "\0"]).prop_map(|s| s.as_bytes().to_vec()),
        vec(any::<u8>(), 0..4),
    ]
}

fn command_name() -> impl Strategy<Value = Vec<u8>> {
    prop::sample::select(vec!["TB.CONSUME", "tb.peek", "TB.ADJUST", "tb.mconsume"])
        .prop_map(|s| s.as_bytes().to_vec())
}

fn int_arg() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::sample::select(vec![
            "0",
            "1",
            "2",
            "8",
            "-1",
            "1000000",
            "1000001",
            "86400000",
            "86400001",
            "x",
            "",
            "9223372036854775808",
            "BUCKET",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        number_arg(),
    ]
}

/// TB.ACQUIRE's argv: the fixed arguments, maybe a weight, then BUCKET
/// clauses (sometimes misspelt, short, or on the lease key).
fn acquire_argv() -> impl Strategy<Value = Vec<Vec<u8>>> {
    (
        key_arg(),
        int_arg(),
        int_arg(),
        key_arg(),
        prop::option::of(int_arg()),
        vec(
            (
                prop::sample::select(vec!["BUCKET", "bucket", "BUCKETS"]),
                key_arg(),
                number_arg(),
                number_arg(),
                number_arg(),
            ),
            0..4,
        ),
        0..3usize,
    )
        .prop_map(|(key, limit, lease_ms, id, weight, clauses, cut)| {
            let mut a = vec![b"TB.ACQUIRE".to_vec(), key, limit, lease_ms, id];
            a.extend(weight);
            for (kw, k, m, r, c) in clauses {
                a.extend([kw.as_bytes().to_vec(), k, m, r, c]);
            }
            let keep = a.len().saturating_sub(cut);
            a.truncate(keep.max(1));
            a
        })
}

/// An argv of any length: a key, then number-like arguments, with MCONSUME
/// groups lined up so their keys (and duplicates) are exercised too.
fn argv() -> impl Strategy<Value = Vec<Vec<u8>>> {
    (command_name(), vec((key_arg(), number_arg()), 0..24)).prop_map(|(name, rest)| {
        let mut a = vec![name];
        for (i, (key, num)) in rest.into_iter().enumerate() {
            a.push(if i % 4 == 0 { key } else { num });
        }
        a
    })
}

/// Numbers that are mostly valid limits, costs and deltas, else anything
/// number-like.
fn biased_number() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "1", "2", "3", "5", "10", "60", "100", "0.5", "1000", "1e6", "0", "-3", "1e12",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        1 => number_arg(),
    ]
    .boxed()
}

/// A keyword as sent (any case), or a near miss: misspelt, or a number.
fn keyword(word: &'static str) -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        6 => Just(word.as_bytes().to_vec()),
        2 => Just(word.to_ascii_lowercase().into_bytes()),
        1 => Just(format!("{word}S").into_bytes()),
        1 => number_arg(),
    ]
    .boxed()
}

/// Integers around the documented bounds, and the usual rejects.
fn integer_among(values: Vec<&'static str>) -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        4 => prop::sample::select(values).prop_map(|s| s.as_bytes().to_vec()),
        1 => int_arg(),
    ]
    .boxed()
}

/// WAIT's `max_ms`: 0 to 1e14.
fn max_ms_arg() -> BoxedStrategy<Vec<u8>> {
    integer_among(vec![
        "0",
        "1",
        "250",
        "5000",
        "+5",
        "100000000000000",
        "100000000000001",
        "-1",
        "1.5",
        "1e3",
        "x",
        "",
    ])
    .boxed()
}

/// OFFSET's minutes: -1439 to 1439.
fn minutes_arg() -> BoxedStrategy<Vec<u8>> {
    integer_among(vec![
        "0", "60", "-300", "330", "1439", "-1439", "1440", "-1440", "+60", "-0", "1.5", "x", "",
    ])
    .boxed()
}

/// A quota's period: the four names in any case, or seconds from 1 to 1e10.
fn period_arg() -> BoxedStrategy<Vec<u8>> {
    integer_among(vec![
        "DAY",
        "day",
        "Week",
        "MONTH",
        "year",
        "FORTNIGHT",
        "DAYS",
        "3600",
        "1",
        "+60",
        "0",
        "-1",
        "10000000000",
        "10000000001",
        "1.5",
        "",
    ])
    .boxed()
}

/// Drops up to `cut` arguments from the end (never the name).
fn cut(mut a: Vec<Vec<u8>>, cut: usize) -> Vec<Vec<u8>> {
    let keep = a.len().saturating_sub(cut).max(1);
    a.truncate(keep);
    a
}

/// TB.CONSUME and TB.PEEK with `WAIT max_ms`, with or without the cost,
/// sometimes cut short or misspelt.
fn consume_wait_argv() -> BoxedStrategy<Vec<Vec<u8>>> {
    (
        prop::sample::select(vec!["TB.CONSUME", "tb.peek", "TB.PEEK"]),
        key_arg(),
        biased_number(),
        biased_number(),
        prop::option::of(biased_number()),
        keyword("WAIT"),
        max_ms_arg(),
        prop_oneof![6 => Just(0usize), 1 => 1..3usize],
    )
        .prop_map(|(name, key, max, rate, cost, wait, ms, n)| {
            let mut a = vec![name.as_bytes().to_vec(), key, max, rate];
            a.extend(cost);
            a.extend([wait, ms]);
            cut(a, n)
        })
        .boxed()
}

/// Mostly one of `valid` (so that calls of several arguments are often
/// accepted as a whole), else `other`: the near misses.
fn mostly(valid: Vec<&'static str>, other: BoxedStrategy<Vec<u8>>) -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        9 => prop::sample::select(valid).prop_map(|s| s.as_bytes().to_vec()),
        1 => other,
    ]
    .boxed()
}

fn good_limit() -> BoxedStrategy<Vec<u8>> {
    mostly(vec!["10", "60", "100", "1000", "1e6"], biased_number())
}

fn good_rate() -> BoxedStrategy<Vec<u8>> {
    mostly(vec!["1", "0.5", "40", "1000"], biased_number())
}

/// Costs no larger than any of `good_limit`'s.
fn good_cost() -> BoxedStrategy<Vec<u8>> {
    mostly(vec!["0", "1", "2", "0.5", "10"], biased_number())
}

fn good_period() -> BoxedStrategy<Vec<u8>> {
    mostly(
        vec!["DAY", "week", "MONTH", "Year", "3600", "60"],
        period_arg(),
    )
}

fn good_keyword(word: &'static str) -> BoxedStrategy<Vec<u8>> {
    mostly(vec![word], keyword(word))
}

/// OFFSET and its minutes, or nothing.
fn offset_clause() -> BoxedStrategy<Option<(Vec<u8>, Vec<u8>)>> {
    let minutes = mostly(
        vec!["60", "-300", "330", "-1439", "1439", "0"],
        minutes_arg(),
    );
    prop::option::of((good_keyword("OFFSET"), minutes)).boxed()
}

/// TB.QUOTA, TB.QPEEK and TB.QADJUST: `key limit period [amount] [OFFSET
/// minutes]`, sometimes with an argument too many or too few.
fn quota_argv() -> BoxedStrategy<Vec<Vec<u8>>> {
    (
        prop::sample::select(vec!["TB.QUOTA", "tb.qpeek", "TB.QADJUST", "tb.qadjust"]),
        key_arg(),
        good_limit(),
        good_period(),
        prop::option::of(prop_oneof![3 => good_cost(), 1 => biased_number()]),
        offset_clause(),
        prop_oneof![8 => Just(None), 1 => biased_number().prop_map(Some)],
        prop_oneof![6 => Just(0usize), 1 => 1..3usize],
    )
        .prop_map(|(name, key, limit, period, amount, offset, extra, n)| {
            let mut a = vec![name.as_bytes().to_vec(), key, limit, period];
            a.extend(amount);
            if let Some((word, minutes)) = offset {
                a.extend([word, minutes]);
            }
            a.extend(extra);
            cut(a, n)
        })
        .boxed()
}

/// One TB.CHARGE clause: `BUCKET max rate cost` or `QUOTA limit period
/// cost [OFFSET minutes]`, its keyword sometimes misspelt.
fn charge_clause() -> BoxedStrategy<Vec<Vec<u8>>> {
    prop_oneof![
        (
            good_keyword("BUCKET"),
            good_limit(),
            good_rate(),
            good_cost()
        )
            .prop_map(|(w, m, r, c)| vec![w, m, r, c]),
        (
            good_keyword("QUOTA"),
            good_limit(),
            good_period(),
            good_cost(),
            offset_clause()
        )
            .prop_map(|(w, l, p, c, offset)| {
                let mut a = vec![w, l, p, c];
                if let Some((word, minutes)) = offset {
                    a.extend([word, minutes]);
                }
                a
            }),
    ]
    .boxed()
}

/// Keys: mostly of a few hundred names (a repeat now and then), else the
/// short and odd ones, or spelt like TB.CHARGE's keywords.
fn charge_key() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        6 => (0u16..300).prop_map(|i| format!("k{i}").into_bytes()),
        2 => key_arg(),
        1 => prop::sample::select(vec!["WAIT", "BUCKET", "QUOTA", "OFFSET", "1"])
            .prop_map(|s| s.as_bytes().to_vec()),
    ]
    .boxed()
}

/// TB.CHARGE: `numkeys key... [WAIT max_ms] clause...`, as many clauses
/// as keys most of the time, `numkeys` right most of the time, and
/// sometimes cut short.
fn charge_argv() -> BoxedStrategy<Vec<Vec<u8>>> {
    (1usize..5)
        .prop_flat_map(|n| {
            (
                Just(n),
                prop_oneof![
                    8 => Just(n.to_string().into_bytes()),
                    1 => prop::sample::select(vec![n + 1, n - 1, 10_001])
                        .prop_map(|c| c.to_string().into_bytes()),
                    1 => int_arg(),
                ],
                vec(charge_key(), n),
                prop::option::of((good_keyword("WAIT"), max_ms_arg())),
                vec(charge_clause(), n),
                prop_oneof![8 => Just(None), 1 => charge_clause().prop_map(Some)],
                prop_oneof![6 => Just(0usize), 1 => 1..4usize],
            )
        })
        .prop_map(|(_, numkeys, keys, wait, clauses, extra, n)| {
            let mut a = vec![b"TB.CHARGE".to_vec(), numkeys];
            a.extend(keys);
            if let Some((word, ms)) = wait {
                a.extend([word, ms]);
            }
            a.extend(clauses.into_iter().flatten());
            a.extend(extra.into_iter().flatten());
            cut(a, n)
        })
        .boxed()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    #[test]
    fn args_match_the_reference_and_stay_in_bounds(a in argv()) {
        let refs: Vec<&[u8]> = a.iter().map(Vec::as_slice).collect();
        oracles::check_args(&refs);
    }

    #[test]
    fn args_at_the_bounds(
        name in command_name(),
        nums in vec(prop::sample::select(vec![
            "1e12", "1000000000000.0001", "999999999999.9999", "1e10", "10000000000.000002",
            "1", "0.99999999999999", "1.00000000000001", "100", "0.01", "0", "-0", "5e-324",
            "1e-300", "0.5", "1e-2", "1e2",
        ]), 3..4),
    ) {
        let mut a: Vec<&[u8]> = vec![&name, b"k"];
        a.extend(nums.iter().map(|n| n.as_bytes()));
        oracles::check_args(&a);
        a.pop();
        oracles::check_args(&a);
    }

    #[test]
    fn acquire_args_stay_in_bounds(a in acquire_argv()) {
        let refs: Vec<&[u8]> = a.iter().map(Vec::as_slice).collect();
        oracles::check_args(&refs);
    }

    #[test]
    fn consume_wait_args_match_the_reference(a in consume_wait_argv()) {
        let refs: Vec<&[u8]> = a.iter().map(Vec::as_slice).collect();
        oracles::check_args(&refs);
    }

    #[test]
    fn quota_args_match_the_reference(a in quota_argv()) {
        let refs: Vec<&[u8]> = a.iter().map(Vec::as_slice).collect();
        oracles::check_args(&refs);
    }

    #[test]
    fn charge_args_match_the_reference(a in charge_argv()) {
        let refs: Vec<&[u8]> = a.iter().map(Vec::as_slice).collect();
        oracles::check_args(&refs);
    }

    #[test]
    fn args_from_raw_bytes(data in vec(any::<u8>(), 0..64)) {
        oracles::check_args(&oracles::argv_from_bytes(&data));
    }
}

fn refs(a: &[String]) -> Vec<&[u8]> {
    a.iter().map(|s| s.as_bytes()).collect()
}

#[test]
fn mconsume_group_limit_and_late_duplicates() {
    let group = |k: String| [k, "10".into(), "1".into(), "1".into()];
    let mut a: Vec<String> = vec!["TB.MCONSUME".into()];
    for i in 0..10_000 {
        a.extend(group(format!("k{i}")));
    }
    oracles::check_args(&refs(&a));
    a.extend(group("k10000".into()));
    oracles::check_args(&refs(&a));
    // A duplicate in the last of 10,000 groups (the reference scan is
    // quadratic: keep this one smaller).
    let mut a: Vec<String> = vec!["TB.MCONSUME".into()];
    for i in 0..2_000 {
        a.extend(group(format!("k{i}")));
    }
    a.extend(group("k1234".into()));
    oracles::check_args(&refs(&a));
}

/// The generators above reach accepted calls as well as errors, so the
/// properties are checked on both (a generator that only made errors
/// would pass them trivially).
#[test]
fn the_command_generators_reach_accepted_calls_and_errors() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    use tb_core::args::{parse_consume, Memos};
    use tb_core::charge::parse_charge;
    use tb_core::quota::{parse_qadjust, parse_quota};

    fn accepted(strategy: impl Strategy<Value = Vec<Vec<u8>>>, ok: fn(&[&[u8]]) -> bool) -> usize {
        let mut runner = TestRunner::deterministic();
        (0..2_000)
            .filter(|_| {
                let a = strategy.new_tree(&mut runner).expect("a value").current();
                let refs: Vec<&[u8]> = a.iter().map(Vec::as_slice).collect();
                ok(&refs)
            })
            .count()
    }
    let waits = accepted(consume_wait_argv(), |a| {
        parse_consume(a, &Memos::new()).is_ok_and(|s| s.wait_ms.is_some())
    });
    let quotas = accepted(quota_argv(), |a| {
        let q = if a[0].eq_ignore_ascii_case(b"TB.QADJUST") {
            parse_qadjust(a)
        } else {
            parse_quota(a)
        };
        q.is_ok_and(|q| q.quota.offset_s != 0)
    });
    let charges = accepted(charge_argv(), |a| {
        parse_charge(a, &Memos::new()).is_ok_and(|c| c.clauses.len() > 1)
    });
    for (what, n) in [
        ("TB.CONSUME with WAIT", waits),
        ("a quota with OFFSET", quotas),
        ("TB.CHARGE of two keys or more", charges),
    ] {
        assert!(
            (100..1_900).contains(&n),
            "{what}: {n} of 2,000 generated calls accepted"
        );
    }
}

// ---- (b) state decoding ---------------------------------------------------------

fn field() -> impl Strategy<Value = Option<Vec<u8>>> {
    let text = prop_oneof![
        3 => number_arg(),
        2 => any::<i64>().prop_map(|v| v.to_string().into_bytes()),
        1 => (-99_999_999_999_999_999i64..99_999_999_999_999_999)
            .prop_map(|v| v.to_string().into_bytes()),
        1 => Just(b"+5".to_vec()),
    ];
    prop_oneof![9 => text.prop_map(Some), 1 => Just(None)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    #[test]
    fn state_decodes_like_the_reference(tokens in field(), ts in field()) {
        oracles::check_state(tokens.as_deref(), ts.as_deref());
    }

    #[test]
    fn state_from_raw_bytes(data in vec(any::<u8>(), 0..40)) {
        let (tokens, ts) = oracles::fields_from_bytes(&data);
        oracles::check_state(tokens, ts);
    }

    #[test]
    fn every_finite_balance_round_trips(bits in any::<u64>(), v in any::<f64>()) {
        oracles::check_tokens_round_trip(f64::from_bits(bits));
        oracles::check_tokens_round_trip(v);
    }

    #[test]
    fn every_timestamp_round_trips_or_is_refused(ts in any::<i64>(), small in -(1i64 << 53)..(1i64 << 53)) {
        oracles::check_ts_round_trip(ts);
        oracles::check_ts_round_trip(small);
    }
}

// ---- (c) bucket arithmetic ----------------------------------------------------------

/// Any f64 at all: NaN, infinities, zeros, subnormals, extremes.
fn wild() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>(),
        prop::num::f64::ANY,
        prop::sample::select(vec![
            0.0,
            -0.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MIN_POSITIVE,
            5e-324,
            1e12,
            1e13,
            -1e12,
            1e300,
            -1e300,
        ]),
    ]
}

fn op() -> impl Strategy<Value = (u32, Op)> {
    let dt = prop_oneof![0u32..2_000, 0u32..2_000_000, any::<u32>()];
    let op = prop_oneof![
        (0.0f64..=1.0).prop_map(Op::Consume),
        (0.0f64..=1.0).prop_map(Op::Peek),
        (-2.0f64..=2.0).prop_map(Op::Adjust),
    ];
    (dt, op)
}

/// The stored balance: a fraction of max, any value at all (a hostile
/// hash), or no key.
#[derive(Clone, Copy, Debug)]
enum Balance {
    Frac(f64),
    Raw(f64),
    Missing,
}

fn bucket_case() -> impl Strategy<Value = BucketCase> {
    // Valid limits most of the time (log-uniform), raw ones otherwise.
    let limits = prop_oneof![
        3 => (0.0f64..=1.0, 0.0f64..=1.0).prop_map(|(a, b)| oracles::valid_limits_from(a, b)),
        1 => (wild(), wild()),
    ];
    let balance = prop_oneof![
        3 => (-1.0f64..=1.0).prop_map(Balance::Frac),
        1 => wild().prop_map(Balance::Raw),
        1 => Just(Balance::Missing),
    ];
    let clock = (
        any::<i64>(),
        prop_oneof![-5_000_000i64..5_000_000, any::<i64>()],
    );
    // `raw` switches cost and delta from fractions of max to any value.
    let amounts = (any::<bool>(), 0.0f64..=1.0, wild(), -2.0f64..=2.0, wild());
    (limits, balance, clock, amounts, vec(op(), 0..40)).prop_map(
        |((max, rate), balance, (ts, dt), (raw, c, raw_cost, d, raw_delta), steps)| BucketCase {
            max,
            rate,
            stored: match balance {
                Balance::Frac(f) => Some((max * f, ts)),
                Balance::Raw(t) => Some((t, ts)),
                Balance::Missing => None,
            },
            now_us: ts.saturating_add(dt),
            cost: if raw { raw_cost } else { max * c },
            delta: if raw { raw_delta } else { max * d },
            steps,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    #[test]
    fn bucket_arithmetic_keeps_the_contract(case in bucket_case()) {
        oracles::check_bucket(&case);
    }

    #[test]
    fn bucket_from_raw_bytes(data in vec(any::<u8>(), 0..200)) {
        oracles::check_bucket(&oracles::bucket_case_from_bytes(&data));
    }
}

// ---- (d) lease keys -------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3_000))]

    #[test]
    fn lease_keys_from_raw_bytes(data in vec(any::<u8>(), 0..400)) {
        oracles::lease_target(&data);
    }

    /// Well-formed leases only (no planted summary, no raw value), so the
    /// exact properties hold at every step.
    #[test]
    fn lease_keys_of_well_formed_leases(
        leases in vec((any::<u8>(), -3000i16..30000, 1u8..5), 0..40),
        calls in vec((0u8..4, any::<u8>(), -2000i16..4000, 1u16..20000, 1u8..5), 0..60),
    ) {
        let mut data = vec![0, leases.len() as u8];
        for (id, offset, weight) in leases {
            data.push(id & !1);
            data.extend(offset.to_le_bytes());
            data.push(weight - 1);
        }
        for (kind, id, dt, lease_ms, weight) in calls {
            data.extend([kind, id]);
            data.extend(dt.to_le_bytes());
            data.extend(lease_ms.to_le_bytes());
            data.push(weight - 1);
        }
        let case = oracles::lease_case_from_bytes(&data);
        prop_assert!(case.trusted);
        oracles::check_leases(&case);
    }
}

/// The cases the fuzzer found while the harness was written, pinned.
#[test]
fn found_by_the_fuzzer() {
    // Subnormal limits, where one millisecond of refill is a few bits:
    // the times are still the earliest passing millisecond.
    let mut case = BucketCase {
        max: 5e-324,
        rate: 5e-324,
        stored: Some((-5e-324, 1_764_513_600_123_456)),
        now_us: 1_764_513_600_123_459,
        cost: 5e-324,
        delta: 5e-324,
        steps: vec![],
    };
    oracles::check_bucket(&case);
    // A bucket in debt that admits nothing.
    case = BucketCase {
        max: 30.181696555805246,
        rate: 1.4302538912705045,
        stored: Some((-30.181696555805246, 0)),
        now_us: 0,
        cost: 1.0,
        delta: 0.0,
        steps: vec![(1_000_263, Op::Peek(0.5)), (0, Op::Consume(0.1))],
    };
    oracles::check_bucket(&case);
}

/// Every seed checked in under fuzz/corpus/, through its target's
/// property, so the seeds are exercised on every machine, nightly or not.
#[test]
fn every_checked_in_seed_holds() {
    let corpus = testkit::root().join("fuzz/corpus");
    for (target, check) in oracles::TARGETS {
        let dir = corpus.join(target);
        let mut seeds = 0;
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a corpus entry").path();
            let data = std::fs::read(&path).expect("a seed");
            let replay = std::panic::catch_unwind(|| check(&data));
            assert!(replay.is_ok(), "{target}: seed {} fails", path.display());
            seeds += 1;
        }
        assert!(
            seeds >= 10,
            "{target}: only {seeds} seeds in {}",
            dir.display()
        );
    }
}
