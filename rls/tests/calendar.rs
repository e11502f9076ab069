//! `calendar: true` limits against a real redis-server, with the module
//! and with the Lua library alone: calendar quotas beside buckets, in one
//! all-or-nothing call.

mod common;

use common::{ask, calls, codes, descriptor, request, start, OK, OVER};
use envoy_types::pb::google::protobuf::Duration;
use redis::Commands;
use tb_core::quota::{window, Period};
use testkit::{server_time_us, Config as ServerConfig, Server};

fn ms(d: &Duration) -> i64 {
    d.seconds * 1000 + i64::from(d.nanos) / 1_000_000
}

fn server_ms(redis: &Server) -> i64 {
    server_time_us(&mut redis.conn()) / 1000
}

/// The end of the day (or, `month`, the calendar month) holding `t_ms`,
/// on a calendar `offset_min` minutes from UTC, in ms since the epoch: the
/// core's calendar, which core/tests/calendar.rs checks against chrono.
fn period_end_ms(t_ms: i64, month: bool, offset_min: i64) -> i64 {
    let period = if month { Period::Month } else { Period::Day };
    window(period, offset_min * 60, t_ms.div_euclid(1000)).end * 1000
}

/// Runs `body` (given a fresh descriptor value) and returns the server
/// clock before and after it; run again, on a new value, when a period
/// ended meanwhile (its budget was whole again mid-run, as it should be,
/// so the counts don't hold).
async fn within_one_period<F, Fut, T>(
    redis: &Server,
    month: bool,
    offset: i64,
    body: F,
) -> (T, i64, i64)
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    for attempt in 0..3 {
        let before = server_ms(redis);
        let out = body(format!("run{attempt}")).await;
        let after = server_ms(redis);
        if period_end_ms(before, month, offset) == period_end_ms(after, month, offset) {
            return (out, before, after);
        }
    }
    panic!("a period ended during each of three runs");
}

/// The reported time until the reset is the period's end as the server saw
/// it during the call: between end - after and end - before (ms rounding
/// either way).
fn assert_until(d: &Duration, end: i64, before: i64, after: i64) {
    let got = ms(d);
    assert!(
        end - after - 1 <= got && got <= end - before + 1,
        "duration_until_reset {got} ms; the period ends {} to {} ms after the call",
        end - after,
        end - before
    );
}

const DAILY: &str = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 3, calendar: true}\n  - key: local\n    rate_limit: {unit: day, requests_per_unit: 1, calendar: true, utc_offset_minutes: 330}\n  - key: team\n    rate_limit: {unit: month, requests_per_unit: 2, calendar: true}\n  - key: ip\n    rate_limit: {unit: day, requests_per_unit: 100}\n";

async fn a_daily_limit_admits_exactly_n(redis: &Server, backend: &str) {
    let rls = start(DAILY, redis, &[]);
    assert!(rls.line.contains(backend), "{}", rls.line);
    let c = rls.client().await;
    let ((oks, over), before, after) = within_one_period(redis, false, 0, |v| {
        let mut c = c.clone();
        async move {
            let mut oks = Vec::new();
            for _ in 0..3 {
                oks.push(ask(&mut c, request("d", vec![descriptor(&[("user", &v)])], 0)).await);
            }
            let over = ask(&mut c, request("d", vec![descriptor(&[("user", &v)])], 0)).await;
            (oks, over)
        }
    })
    .await;
    let end = period_end_ms(before, false, 0);
    for (i, r) in oks.iter().enumerate() {
        assert_eq!(codes(r), vec![(OK, 2 - i as u32)]);
        assert_until(
            r.statuses[0].duration_until_reset.as_ref().unwrap(),
            end,
            before,
            after,
        );
        let limit = r.statuses[0].current_limit.as_ref().unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit), (3, 4)); // DAY
    }
    assert_eq!(over.overall_code, OVER);
    assert_eq!(codes(&over), vec![(OVER, 0)]);
    // The wait is the time to the next UTC midnight: no refill within the day.
    assert_until(
        over.statuses[0].duration_until_reset.as_ref().unwrap(),
        end,
        before,
        after,
    );

    // The quota's own key, not the bucket's.
    let mut conn = redis.conn();
    let keys: Vec<String> = conn.keys("rls:*user=run*").unwrap();
    assert!(
        !keys.is_empty() && keys.iter().all(|k| k.starts_with("rls:q:day:{d}:user=run")),
        "{keys:?}"
    );
    let fields: Vec<String> = conn.hkeys(&keys[0]).unwrap();
    assert_eq!(fields.len(), 2, "{fields:?}");
    assert!(fields.contains(&"used".into()) && fields.contains(&"start".into()));

    // At UTC+5:30 the day ends at local midnight.
    let mut c2 = c.clone();
    let ((first, second), before, after) = within_one_period(redis, false, 330, |v| {
        let mut c = c2.clone();
        async move {
            let a = ask(&mut c, request("d", vec![descriptor(&[("local", &v)])], 0)).await;
            let b = ask(&mut c, request("d", vec![descriptor(&[("local", &v)])], 0)).await;
            (a, b)
        }
    })
    .await;
    assert_eq!(
        (codes(&first), codes(&second)),
        (vec![(OK, 0)], vec![(OVER, 0)])
    );
    assert_until(
        second.statuses[0].duration_until_reset.as_ref().unwrap(),
        period_end_ms(before, false, 330),
        before,
        after,
    );

    // A calendar month ends on the 1st, not 30 days on.
    let ((first, second), before, after) = within_one_period(redis, true, 0, |v| {
        let mut c = c2.clone();
        async move {
            let a = ask(&mut c, request("d", vec![descriptor(&[("team", &v)])], 0)).await;
            let b = ask(&mut c, request("d", vec![descriptor(&[("team", &v)])], 0)).await;
            (a, b)
        }
    })
    .await;
    assert_eq!(
        (codes(&first), codes(&second)),
        (vec![(OK, 1)], vec![(OK, 0)])
    );
    assert_until(
        second.statuses[0].duration_until_reset.as_ref().unwrap(),
        period_end_ms(before, true, 0),
        before,
        after,
    );
    let third = ask(
        &mut c2,
        request("d", vec![descriptor(&[("team", "run0")])], 0),
    )
    .await;
    assert_eq!(third.overall_code, OVER);
}

/// A calendar limit and a bucket in one request: the one that denies
/// charges neither.
async fn a_mixed_request_denied_by_one_charges_neither(redis: &Server, backend: &str) {
    let config = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 2, calendar: true}\n  - key: ip\n    rate_limit: {unit: day, requests_per_unit: 100}\n  - key: big\n    rate_limit: {unit: year, requests_per_unit: 100, calendar: true}\n  - key: tight\n    rate_limit: {unit: day, requests_per_unit: 1}\n";
    let rls = start(config, redis, &[]);
    assert!(rls.line.contains(backend), "{}", rls.line);
    let c = rls.client().await;
    // Denied by the quota: the bucket keeps its tokens.
    let (rs, _, _) = within_one_period(redis, false, 0, |v| {
        let mut c = c.clone();
        async move {
            let both = || {
                request(
                    "d",
                    vec![descriptor(&[("user", &v)]), descriptor(&[("ip", &v)])],
                    0,
                )
            };
            let mut rs = Vec::new();
            for _ in 0..3 {
                rs.push(ask(&mut c, both()).await);
            }
            rs.push(ask(&mut c, request("d", vec![descriptor(&[("ip", &v)])], 0)).await);
            rs
        }
    })
    .await;
    let got: Vec<_> = rs.iter().map(|r| (r.overall_code, codes(r))).collect();
    assert_eq!(
        got,
        vec![
            (OK, vec![(OK, 1), (OK, 99)]),
            (OK, vec![(OK, 0), (OK, 98)]),
            (OVER, vec![(OVER, 0), (OK, 98)]),
            (OK, vec![(OK, 97)]),
        ]
    );
    // Denied by the bucket: the quota keeps its budget.
    let mut c = c.clone();
    let both = || {
        request(
            "d",
            vec![descriptor(&[("big", "b")]), descriptor(&[("tight", "t")])],
            0,
        )
    };
    let first = ask(&mut c, both()).await;
    assert_eq!(codes(&first), vec![(OK, 99), (OK, 0)]);
    let denied = ask(&mut c, both()).await;
    assert_eq!(
        (denied.overall_code, codes(&denied)),
        (OVER, vec![(OK, 99), (OVER, 0)])
    );
    let alone = ask(&mut c, request("d", vec![descriptor(&[("big", "b")])], 0)).await;
    assert_eq!(codes(&alone), vec![(OK, 98)]);
    // Each on its own kind of key: two charges of the quota, the bucket's hash.
    let mut conn = redis.conn();
    let used: String = conn.hget("rls:q:year:{d}:big=b", "used").unwrap();
    assert_eq!(used, "2");
    let exists: bool = conn.exists("rls:{d}:tight=t").unwrap();
    assert!(exists);
}

#[tokio::test]
async fn with_the_module_a_daily_calendar_limit_admits_exactly_n() {
    let redis = Server::start();
    a_daily_limit_admits_exactly_n(&redis, "backend=Module").await;
}

#[tokio::test]
async fn with_the_lua_library_a_daily_calendar_limit_admits_exactly_n() {
    let redis = Server::with(ServerConfig::without_module());
    a_daily_limit_admits_exactly_n(&redis, "backend=Functions").await;
}

#[tokio::test]
async fn with_the_module_a_mixed_request_denied_by_one_charges_neither() {
    let redis = Server::start();
    a_mixed_request_denied_by_one_charges_neither(&redis, "backend=Module").await;
}

#[tokio::test]
async fn with_the_lua_library_a_mixed_request_denied_by_one_charges_neither() {
    let redis = Server::with(ServerConfig::without_module());
    a_mixed_request_denied_by_one_charges_neither(&redis, "backend=Functions").await;
}

/// How many times Redis ran `command` (INFO commandstats).

#[tokio::test]
async fn only_a_request_with_a_calendar_limit_is_a_charge() {
    let redis = Server::start();
    let rls = start(DAILY, &redis, &[]);
    let mut c = rls.client().await;
    let mconsume = calls(&redis, "tb.mconsume");
    let r = ask(&mut c, request("d", vec![descriptor(&[("ip", "1")])], 0)).await;
    assert_eq!(codes(&r), vec![(OK, 99)]);
    assert_eq!(calls(&redis, "tb.charge"), 0);
    assert_eq!(calls(&redis, "tb.mconsume"), mconsume + 1);
    let r = ask(
        &mut c,
        request(
            "d",
            vec![descriptor(&[("ip", "1")]), descriptor(&[("team", "t")])],
            0,
        ),
    )
    .await;
    assert_eq!(codes(&r), vec![(OK, 98), (OK, 1)]);
    assert_eq!(calls(&redis, "tb.charge"), 1, "one call for both");
    assert_eq!(calls(&redis, "tb.mconsume"), mconsume + 1);
}

#[tokio::test]
async fn a_shadow_calendar_limit_answers_ok_and_never_stops_the_enforced_charge() {
    let redis = Server::start();
    let config = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 3}\n  - key: org\n    shadow_mode: true\n    rate_limit: {unit: month, requests_per_unit: 1, calendar: true}\n";
    let rls = start(config, &redis, &[]);
    let mut c = rls.client().await;
    let both = || {
        request(
            "d",
            vec![descriptor(&[("user", "u")]), descriptor(&[("org", "o")])],
            0,
        )
    };
    let r = ask(&mut c, both()).await;
    assert_eq!((r.overall_code, codes(&r)), (OK, vec![(OK, 2), (OK, 0)]));
    for left in [1, 0] {
        let r = ask(&mut c, both()).await;
        assert_eq!(
            (r.overall_code, codes(&r)),
            (OK, vec![(OK, left), (OK, 0)]),
            "the shadow quota is spent, and answers OK"
        );
    }
    let r = ask(&mut c, both()).await;
    assert_eq!(
        (r.overall_code, codes(&r)),
        (OVER, vec![(OVER, 0), (OK, 0)]),
        "the enforced bucket was charged all three times"
    );
    // The shadow quota was counted once (then denied), on its own key.
    let used: String = redis.conn().hget("rls:q:month:{d}:org=o", "used").unwrap();
    assert_eq!(used, "1");
}

#[test]
fn calendar_on_a_unit_below_a_day_stops_startup_with_path_line_and_reason() {
    let redis = Server::start();
    let (mut cmd, dir) = common::command(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      calendar: true\n",
        &redis,
    );
    let out = cmd.output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.trim(),
        format!(
            "tb-rls: {}:7: calendar needs unit day, week, month or year, not 'second'",
            dir.join("config.yaml").display()
        )
    );
    std::fs::remove_dir_all(dir).unwrap();
}
