//! GET /metrics of a real tb-rls after scripted calls: exact counts, no
//! series per request value, and text that parses as the exposition
//! format (a strict parser here, not a regex over a few lines).

mod common;

use common::{command, descriptor, signal, start, start_env, OK, OVER};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use testkit::Server;
use tonic::transport::Channel;

/// A series: its name and its labels, sorted.
type Series = (String, BTreeMap<String, String>);

fn name_ok(n: &str) -> bool {
    let mut cs = n.chars();
    cs.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `{a="x",b="y"}` (escapes `\\`, `\"`, `\n`) and the rest of the line.
fn labels(text: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut out = BTreeMap::new();
    let mut rest = text
        .strip_prefix('{')
        .ok_or_else(|| format!("no '{{' in {text:?}"))?;
    loop {
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((out, r));
        }
        let eq = rest
            .find('=')
            .ok_or_else(|| format!("no '=' in {rest:?}"))?;
        let name = &rest[..eq];
        if !name_ok(name) || name.contains(':') {
            return Err(format!("bad label name {name:?}"));
        }
        let mut chars = rest[eq + 1..].char_indices();
        if chars.next().map(|(_, c)| c) != Some('"') {
            return Err(format!("unquoted value in {rest:?}"));
        }
        let mut value = String::new();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next().map(|(_, c)| c) {
                    Some('\\') => value.push('\\'),
                    Some('"') => value.push('"'),
                    Some('n') => value.push('\n'),
                    other => return Err(format!("bad escape {other:?} in {rest:?}")),
                },
                '"' => {
                    end = Some(eq + 1 + i + 1);
                    break;
                }
                '\n' => return Err("a raw newline in a label value".into()),
                c => value.push(c),
            }
        }
        let end = end.ok_or_else(|| format!("unterminated value in {rest:?}"))?;
        if out.insert(name.to_string(), value).is_some() {
            return Err(format!("label {name} twice"));
        }
        rest = &rest[end..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

/// Parses the text format 0.0.4 as Prometheus reads it: HELP and TYPE at
/// most once per family and before its samples, a family's samples
/// together, valid names, quoted and escaped label values, float values,
/// no series twice.
fn parse(text: &str) -> Result<BTreeMap<Series, f64>, String> {
    let mut samples = BTreeMap::new();
    let mut typed: BTreeMap<String, String> = BTreeMap::new();
    let mut helped = BTreeSet::new();
    let mut done: BTreeSet<String> = BTreeSet::new();
    let mut current: Option<String> = None;
    if !text.ends_with('\n') {
        return Err("no final newline".into());
    }
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut words = rest.splitn(3, ' ');
            let (kind, name) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            if !name_ok(name) {
                return Err(format!("bad name in {line:?}"));
            }
            if done.contains(name) || current.as_deref() == Some(name) && kind == "TYPE" {
                return Err(format!("{line:?} after the family's samples"));
            }
            match kind {
                "TYPE" => {
                    let t = words.next().unwrap_or("");
                    if !["counter", "gauge", "untyped"].contains(&t) {
                        return Err(format!("bad type in {line:?}"));
                    }
                    if typed.insert(name.to_string(), t.to_string()).is_some() {
                        return Err(format!("TYPE twice for {name}"));
                    }
                }
                "HELP" if !helped.insert(name.to_string()) => {
                    return Err(format!("HELP twice for {name}"));
                }
                _ => {}
            }
            continue;
        }
        if line.is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).ok_or_else(|| format!("{line:?}"))?;
        let name = &line[..name_end];
        if !name_ok(name) {
            return Err(format!("bad metric name in {line:?}"));
        }
        let (ls, rest) = if line[name_end..].starts_with('{') {
            labels(&line[name_end..])?
        } else {
            (BTreeMap::new(), &line[name_end..])
        };
        let value = rest
            .strip_prefix(' ')
            .ok_or_else(|| format!("no value in {line:?}"))?;
        let value: f64 = value
            .parse()
            .map_err(|_| format!("bad value in {line:?}"))?;
        if current.as_deref() != Some(name) {
            if done.contains(name) {
                return Err(format!("{name}'s samples are not together"));
            }
            if let Some(c) = current.take() {
                done.insert(c);
            }
            current = Some(name.to_string());
        }
        if typed.get(name).is_some_and(|t| t == "counter") && value < 0.0 {
            return Err(format!("a negative counter: {line:?}"));
        }
        if samples.insert((name.to_string(), ls), value).is_some() {
            return Err(format!("a series twice: {line:?}"));
        }
    }
    Ok(samples)
}

fn get_metrics(http: &str) -> String {
    get(http, "/metrics")
}

fn get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let ask = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(ask.as_bytes()).unwrap();
    let mut all = String::new();
    s.read_to_string(&mut all).unwrap();
    let (head, body) = all.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    body.to_string()
}

/// The parsed /metrics of `http`.
fn scrape(http: &str) -> BTreeMap<Series, f64> {
    let text = get_metrics(http);
    parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn value(m: &BTreeMap<Series, f64>, name: &str, ls: &[(&str, &str)]) -> f64 {
    let key = (
        name.to_string(),
        ls.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    *m.get(&key)
        .unwrap_or_else(|| panic!("no {name} {ls:?} in {m:?}"))
}

/// The five stats of one descriptor path: total, within, near, over, shadow.
fn stats(m: &BTreeMap<Series, f64>, domain: &str, path: &str) -> [f64; 5] {
    [
        "total_hits",
        "within_limit",
        "near_limit",
        "over_limit",
        "shadow_mode",
    ]
    .map(|s| {
        value(
            m,
            &format!("ratelimit_service_rate_limit_{s}"),
            &[("domain", domain), ("descriptor", path)],
        )
    })
}

/// The descriptor labels of every per-descriptor series.
fn paths(m: &BTreeMap<Series, f64>) -> BTreeSet<String> {
    m.keys()
        .filter(|(n, _)| n.starts_with("ratelimit_service_rate_limit_"))
        .filter_map(|(_, ls)| ls.get("descriptor").cloned())
        .collect()
}

fn req(domain: &str, pairs: &[(&str, &str)], hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![descriptor(pairs)],
        hits_addend: hits,
    }
}

async fn code(c: &mut RateLimitServiceClient<Channel>, r: RateLimitRequest) -> i32 {
    c.should_rate_limit(r)
        .await
        .unwrap()
        .into_inner()
        .overall_code
}

// Hour units: a bucket refills too slowly to change a count while a test runs.
const API: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n  - key: path\n    value: \"/v1/*\"\n    descriptors:\n      - key: model\n        shadow_mode: true\n        rate_limit: {unit: hour, requests_per_unit: 2}\n  - key: zero\n    rate_limit: {unit: hour, requests_per_unit: 0}\n  - key: ldap\n    rate_limit: {unlimited: true}\n  - key: tenant\n    detailed_metric: true\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";

#[tokio::test]
async fn scripted_calls_show_their_exact_counts_and_values_add_no_series() {
    let redis = Server::start();
    let rls = start(API, &redis, &[]);
    let mut c = rls.client().await;
    let before = scrape(&rls.http);
    assert!(paths(&before).is_empty(), "{before:?}");
    assert_eq!(
        value(&before, "ratelimit_service_config_load_success", &[]),
        1.0
    );

    // 10 of 10 pass, the 9th and 10th above floor(10 * 0.8); the 11th is over.
    for i in 1..=11 {
        let want = if i <= 10 { OK } else { OVER };
        assert_eq!(
            code(&mut c, req("api", &[("user", "alice")], 0)).await,
            want
        );
    }
    let m = scrape(&rls.http);
    assert_eq!(stats(&m, "api", "user"), [11.0, 10.0, 2.0, 1.0, 0.0]);
    let series = paths(&m);
    // 50 users, 20 paths: the same series, one each.
    for i in 0..50 {
        let user = format!("u{i}");
        assert_eq!(code(&mut c, req("api", &[("user", &user)], 0)).await, OK);
    }
    for i in 0..20 {
        let path = format!("/v1/x{i}");
        let r = req("api", &[("path", &path), ("model", "m")], 0);
        assert_eq!(code(&mut c, r).await, OK);
    }
    let m = scrape(&rls.http);
    assert_eq!(stats(&m, "api", "user"), [61.0, 60.0, 2.0, 1.0, 0.0]);
    assert_eq!(
        stats(&m, "api", "path_/v1/*.model"),
        [20.0, 20.0, 0.0, 0.0, 0.0]
    );
    assert_eq!(
        paths(&m),
        series
            .iter()
            .cloned()
            .chain(["path_/v1/*.model".to_string()])
            .collect()
    );

    // Shadow, 2 an hour: OK thrice; the 2nd above floor(1.6), the 3rd over.
    for _ in 0..3 {
        let r = req("api", &[("path", "/v1/chat"), ("model", "m")], 0);
        assert_eq!(code(&mut c, r).await, OK);
    }
    // hits_addend: 4 (6 left), 5 (1 left: 9 used, 1 hit above 8), 3 over.
    for (hits, want) in [(4, OK), (5, OK), (3, OVER)] {
        assert_eq!(
            code(&mut c, req("api", &[("user", "carol")], hits)).await,
            want
        );
    }
    for _ in 0..2 {
        assert_eq!(code(&mut c, req("api", &[("zero", "z")], 0)).await, OVER);
    }
    assert_eq!(code(&mut c, req("api", &[("ldap", "x")], 0)).await, OK);
    for t in ["a", "a", "b"] {
        assert_eq!(code(&mut c, req("api", &[("tenant", t)], 0)).await, OK);
    }
    assert_eq!(code(&mut c, req("nope", &[("user", "x")], 0)).await, OK);
    let bad = c.should_rate_limit(req("", &[("user", "x")], 0)).await;
    assert_eq!(bad.unwrap_err().code(), tonic::Code::InvalidArgument);

    let m = scrape(&rls.http);
    assert_eq!(stats(&m, "api", "user"), [73.0, 69.0, 3.0, 4.0, 0.0]);
    assert_eq!(
        stats(&m, "api", "path_/v1/*.model"),
        [23.0, 22.0, 1.0, 1.0, 1.0]
    );
    assert_eq!(stats(&m, "api", "zero"), [2.0, 0.0, 0.0, 2.0, 0.0]);
    // detailed_metric: the request's value, as the peer names it.
    assert_eq!(stats(&m, "api", "tenant_a"), [2.0, 2.0, 0.0, 0.0, 0.0]);
    assert_eq!(stats(&m, "api", "tenant_b"), [1.0, 1.0, 0.0, 0.0, 0.0]);
    let want: BTreeSet<String> = ["user", "path_/v1/*.model", "zero", "tenant_a", "tenant_b"]
        .map(String::from)
        .into();
    assert_eq!(
        paths(&m),
        want,
        "no series for ldap, nope or a request value"
    );
    let domains: BTreeSet<&str> = m
        .keys()
        .filter_map(|(_, ls)| ls.get("domain").map(String::as_str))
        .collect();
    assert_eq!(domains, ["api"].into());
    let n = |name: &str| value(&m, name, &[]);
    assert_eq!(n("ratelimit_service_calls_total"), 95.0);
    assert_eq!(n("ratelimit_service_domain_not_found_total"), 1.0);
    assert_eq!(n("ratelimit_service_shed_total"), 0.0);
    assert_eq!(n("ratelimit_service_redis_in_flight"), 0.0);
    assert_eq!(n("ratelimit_service_breaker_open"), 0.0);
    let err = |code: &str| value(&m, "ratelimit_service_call_errors_total", &[("code", code)]);
    assert_eq!(err("INVALID_ARGUMENT"), 1.0);
    assert_eq!(err("UNAVAILABLE"), 0.0);
    let redis_error = value(
        &m,
        "ratelimit_service_should_rate_limit_error",
        &[("err_type", "redis_error")],
    );
    assert_eq!(redis_error, 0.0);
}

#[tokio::test]
async fn near_limit_ratio_is_read_from_the_environment() {
    let redis = Server::start();
    let rls = start_env(API, &redis, &[], &[("NEAR_LIMIT_RATIO", "0.5")]);
    let mut c = rls.client().await;
    for _ in 0..7 {
        assert_eq!(code(&mut c, req("api", &[("user", "a")], 0)).await, OK);
    }
    // 6th and 7th above floor(10 * 0.5).
    assert_eq!(
        stats(&scrape(&rls.http), "api", "user"),
        [7.0, 7.0, 2.0, 0.0, 0.0]
    );
    drop(rls);
    let (mut cmd, dir) = command(API, &redis);
    let out = cmd.env("NEAR_LIMIT_RATIO", "high").output().unwrap();
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "tb-rls: NEAR_LIMIT_RATIO 'high': expected a number from 0 to 1"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn redis_failures_and_reloads_are_counted() {
    let redis = Server::start();
    let args = [
        "--redis-timeout",
        "200ms",
        "--breaker-failures",
        "1",
        "--breaker-cooldown-ms",
        "600000",
        "--watch-interval-ms",
        "50",
    ];
    let rls = start(API, &redis, &args);
    let mut c = rls.client().await;
    signal(&redis, "-STOP");
    let failed = c.should_rate_limit(req("api", &[("user", "a")], 2)).await;
    // One failure opened the breaker: this one never reaches Redis.
    let skipped = c.should_rate_limit(req("api", &[("user", "a")], 1)).await;
    let zero = c.should_rate_limit(req("api", &[("zero", "z")], 0)).await;
    signal(&redis, "-CONT");
    assert_eq!(failed.unwrap_err().code(), tonic::Code::Unavailable);
    assert_eq!(skipped.unwrap_err().code(), tonic::Code::Unavailable);
    assert_eq!(zero.unwrap().into_inner().overall_code, OVER);
    let m = scrape(&rls.http);
    // Hit, not decided: total_hits only, as the peer counts it before Redis;
    // what needs no Redis is decided in full.
    assert_eq!(stats(&m, "api", "user"), [3.0, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!(stats(&m, "api", "zero"), [1.0, 0.0, 0.0, 1.0, 0.0]);
    let err = |code: &str| value(&m, "ratelimit_service_call_errors_total", &[("code", code)]);
    assert_eq!(err("UNAVAILABLE"), 2.0);
    let redis_error = value(
        &m,
        "ratelimit_service_should_rate_limit_error",
        &[("err_type", "redis_error")],
    );
    assert_eq!(redis_error, 1.0);
    let n = |name: &str| value(&m, name, &[]);
    assert_eq!(n("ratelimit_service_breaker_opened_total"), 1.0);
    assert_eq!(n("ratelimit_service_breaker_skipped_total"), 1.0);
    assert_eq!(n("ratelimit_service_breaker_open"), 1.0);

    std::fs::write(&rls.config, "domain: api\ndescriptors: [{key: k, rate_limit: {unit: fortnight, requests_per_unit: 1}}]\n").unwrap();
    rls.wait_stderr("config not reloaded");
    let m = scrape(&rls.http);
    assert_eq!(value(&m, "ratelimit_service_config_load_error", &[]), 1.0);
    assert_eq!(value(&m, "ratelimit_service_config_load_success", &[]), 1.0);
    std::fs::write(&rls.config, common::daily(3)).unwrap();
    rls.wait_stderr("config reloaded");
    let m = scrape(&rls.http);
    assert_eq!(value(&m, "ratelimit_service_config_load_success", &[]), 2.0);
    // The old config's series stay: a counter never goes back.
    assert_eq!(stats(&m, "api", "user")[0], 3.0);
}

#[tokio::test]
async fn a_shed_call_is_counted_and_the_one_in_flight_shows() {
    let redis = Server::start();
    let args = ["--redis-timeout", "60s", "--max-in-flight", "1"];
    let rls = start(API, &redis, &args);
    let mut c = rls.client().await;
    signal(&redis, "-STOP");
    let mut first = rls.client().await;
    let waiting = tokio::spawn(async move {
        first
            .should_rate_limit(req("api", &[("user", "a")], 0))
            .await
            .map(|r| r.into_inner().overall_code)
    });
    // Bounded: the first call takes the one slot within a few scrapes.
    let mut in_flight = 0.0;
    for _ in 0..200 {
        in_flight = value(&scrape(&rls.http), "ratelimit_service_redis_in_flight", &[]);
        if in_flight == 1.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(in_flight, 1.0);
    let shed = c.should_rate_limit(req("api", &[("user", "b")], 0)).await;
    signal(&redis, "-CONT");
    assert_eq!(shed.unwrap_err().code(), tonic::Code::ResourceExhausted);
    assert_eq!(waiting.await.unwrap().unwrap(), OK);
    let m = scrape(&rls.http);
    assert_eq!(stats(&m, "api", "user"), [2.0, 1.0, 0.0, 0.0, 0.0]);
    let n = |name: &str| value(&m, name, &[]);
    assert_eq!(n("ratelimit_service_shed_total"), 1.0);
    assert_eq!(n("ratelimit_service_redis_in_flight"), 0.0);
    let err = value(
        &m,
        "ratelimit_service_call_errors_total",
        &[("code", "RESOURCE_EXHAUSTED")],
    );
    assert_eq!(err, 1.0);
}

#[tokio::test]
async fn use_prometheus_serves_the_same_text_where_the_peer_does() {
    let redis = Server::start();
    let env = [
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", "127.0.0.1:0"),
        ("PROMETHEUS_PATH", "/stats/prometheus"),
    ];
    let rls = start_env(API, &redis, &[], &env);
    let prom = rls
        .line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("prometheus="))
        .unwrap_or_else(|| panic!("no prometheus= in {:?}", rls.line))
        .to_string();
    let mut c = rls.client().await;
    assert_eq!(code(&mut c, req("api", &[("user", "a")], 3)).await, OK);
    let text = get(&prom, "/stats/prometheus");
    let m = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(stats(&m, "api", "user"), [3.0, 3.0, 0.0, 0.0, 0.0]);
    assert_eq!(m, scrape(&rls.http));
    drop(rls);
    let plain = start(API, &redis, &[]);
    assert!(!plain.line.contains("prometheus="), "{}", plain.line);
}

#[test]
fn the_parser_refuses_what_prometheus_refuses() {
    let ok = "# HELP a_total x.\n# TYPE a_total counter\na_total{l=\"q\\\"\\\\\"} 1\na_total{l=\"r\"} 2\n";
    let m = parse(ok).unwrap();
    assert_eq!(value(&m, "a_total", &[("l", "q\"\\")]), 1.0);
    for bad in [
        "a 1",
        "a{l=\"x} 1\n",
        "a{l=x} 1\n",
        "a{l=\"x\",l=\"y\"} 1\n",
        "a 1\na 2\n",
        "a 1\nb 1\na 2\n",
        "# TYPE a counter\n# TYPE a counter\na 1\n",
        "a 1\n# TYPE a counter\n",
        "a one\n",
        "1a 1\n",
        "a{l=\"\\x\"} 1\n",
    ] {
        assert!(parse(bad).is_err(), "{bad:?}");
    }
}
