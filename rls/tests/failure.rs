//! The failure model against a real Redis made to fail: frozen with
//! SIGSTOP (the deadline), killed and restarted (the breaker's probe),
//! frozen under a tiny --max-in-flight (shedding).

mod common;

use common::{calls, codes, daily, descriptor, one, request, signal, start, OK, OVER};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use std::sync::mpsc;
use std::time::Duration;
use testkit::Server;

fn keyed(v: &str, zero: bool) -> RateLimitRequest {
    let mut descriptors = vec![descriptor(&[("k", v)])];
    if zero {
        descriptors.push(descriptor(&[("z", "x")]));
    }
    request("d", descriptors, 0)
}

const WITH_ZERO: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 10}\n  - key: z\n    rate_limit: {unit: day, requests_per_unit: 0}\n";

#[tokio::test]
async fn a_frozen_redis_hits_the_deadline_and_each_policy_holds() {
    let redis = Server::start();
    let args = ["--redis-timeout", "200ms", "--breaker-failures", "0"];
    let closed = start(WITH_ZERO, &redis, &args);
    let open = start(
        WITH_ZERO,
        &redis,
        &[&args[..], &["--on-redis-error", "open"]].concat(),
    );
    let (mut c, mut o) = (closed.client().await, open.client().await);
    let r = c.should_rate_limit(keyed("closed", false)).await.unwrap();
    assert_eq!(codes(&r.into_inner()), vec![(OK, 9)]);
    let r = o.should_rate_limit(keyed("open", false)).await.unwrap();
    assert_eq!(codes(&r.into_inner()), vec![(OK, 9)]);
    signal(&redis, "-STOP");
    let e = c
        .should_rate_limit(keyed("closed", false))
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (
            tonic::Code::Unavailable,
            "redis: no answer within 200 ms (--redis-timeout)"
        )
    );
    let r = o
        .should_rate_limit(keyed("open", false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.overall_code, codes(&r)), (OK, vec![(OK, 0)]));
    assert!(
        r.statuses[0].current_limit.is_none() && r.statuses[0].duration_until_reset.is_none(),
        "no numbers made up: {r:?}"
    );
    // A limit of 0 needs no Redis to deny, and still denies.
    let r = o
        .should_rate_limit(keyed("open", true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (r.overall_code, codes(&r)),
        (OVER, vec![(OK, 0), (OVER, 0)])
    );
    let e = c
        .should_rate_limit(keyed("closed", true))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable);
    signal(&redis, "-CONT");
    // A call past its deadline was written all the same: Redis charged it
    // on waking, before the next call on the same connection.
    let r = c.should_rate_limit(keyed("closed", false)).await.unwrap();
    assert_eq!(codes(&r.into_inner()), vec![(OK, 7)]);
    let r = o.should_rate_limit(keyed("open", false)).await.unwrap();
    assert_eq!(codes(&r.into_inner()), vec![(OK, 7)]);
    let (cause, _) = closed.wait_stderr("tb-rls: redis:");
    assert!(cause.contains("no answer within 200 ms"), "{cause}");
    closed.wait_stderr("tb-rls: redis answers again");
    assert!(
        closed.stderr_so_far().is_empty(),
        "the cause is logged once"
    );
}

#[tokio::test]
async fn an_open_breaker_answers_without_calling_redis() {
    let redis = Server::start();
    let rls = start(
        &daily(10),
        &redis,
        &[
            "--redis-timeout",
            "200ms",
            "--breaker-failures",
            "2",
            "--breaker-cooldown-ms",
            "600000",
        ],
    );
    let mut c = rls.client().await;
    assert_eq!(
        codes(&c.should_rate_limit(one()).await.unwrap().into_inner()),
        vec![(OK, 9)]
    );
    let before = calls(&redis, "tb.mconsume");
    signal(&redis, "-STOP");
    for _ in 0..2 {
        let e = c.should_rate_limit(one()).await.unwrap_err();
        assert!(e.message().contains("no answer within"), "{e:?}");
    }
    for _ in 0..5 {
        let e = c.should_rate_limit(one()).await.unwrap_err();
        assert_eq!(
            (e.code(), e.message()),
            (
                tonic::Code::Unavailable,
                "redis: not called: the breaker is open after 2 failures, for 600000 ms at a time"
            )
        );
    }
    signal(&redis, "-CONT");
    let mut ran = before;
    for _ in 0..200 {
        ran = calls(&redis, "tb.mconsume");
        if ran >= before + 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(ran, before + 2, "only the two calls before it opened");
    let (line, _) = rls.wait_stderr("breaker open");
    assert!(line.contains("2 redis failures within 10000 ms"), "{line}");
}

#[tokio::test]
async fn redis_killed_then_restarted_is_exact_as_soon_as_a_probe_finds_it() {
    let mut redis = Server::start();
    let rls = start(
        &daily(10),
        &redis,
        &[
            "--on-redis-error",
            "open",
            "--redis-timeout",
            "500ms",
            "--breaker-failures",
            "1",
            "--breaker-cooldown-ms",
            "200",
        ],
    );
    let mut c = rls.client().await;
    for left in [9, 8, 7] {
        let r = c.should_rate_limit(one()).await.unwrap().into_inner();
        assert_eq!(codes(&r), vec![(OK, left)]);
    }
    redis.kill9();
    for _ in 0..5 {
        let r = c.should_rate_limit(one()).await.unwrap().into_inner();
        assert_eq!(codes(&r), vec![(OK, 0)], "admitted, no numbers");
        assert!(r.statuses[0].current_limit.is_none());
    }
    let same = redis.config.clone();
    redis.restart_with(same);
    // Bounded: the next probe after a cooldown reaches the new server.
    let mut served = None;
    for _ in 0..200 {
        let r = c.should_rate_limit(one()).await.unwrap().into_inner();
        if r.statuses[0].current_limit.is_some() {
            served = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // A fresh server (no persistence): a full bucket, then exact counts.
    let r = served.expect("served by Redis again");
    assert_eq!(codes(&r), vec![(OK, 9)]);
    for left in [8, 7, 6] {
        let r = c.should_rate_limit(one()).await.unwrap().into_inner();
        assert_eq!(codes(&r), vec![(OK, left)]);
    }
    rls.wait_stderr("tb-rls: redis:");
    rls.wait_stderr("breaker open");
    let (_, between) = rls.wait_stderr("tb-rls: redis answers again");
    assert!(between.is_empty(), "one cause, one opening: {between:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_max_in_flight_a_call_is_shed_at_once() {
    let redis = Server::start();
    let rls = start(
        &daily(10),
        &redis,
        &[
            "--max-in-flight",
            "2",
            "--redis-timeout",
            "60s",
            "--breaker-failures",
            "0",
        ],
    );
    let c = rls.client().await;
    signal(&redis, "-STOP");
    let (tx, rx) = mpsc::channel();
    for _ in 0..10 {
        let (mut c, tx) = (c.clone(), tx.clone());
        tokio::spawn(async move {
            let r = c.should_rate_limit(one()).await;
            let _ = tx.send(r.map(|r| codes(&r.into_inner())).map_err(|e| e.code()));
        });
    }
    // Two wait on the frozen Redis; the other eight are answered meanwhile.
    for _ in 0..8 {
        let r = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(r, Err(tonic::Code::ResourceExhausted));
    }
    signal(&redis, "-CONT");
    let mut left = Vec::new();
    for _ in 0..2 {
        match rx.recv_timeout(Duration::from_secs(30)).unwrap() {
            Ok(v) => left.push(v[0].1),
            Err(code) => panic!("an admitted call answered {code:?}"),
        }
    }
    left.sort();
    assert_eq!(
        left,
        vec![8, 9],
        "the two admitted calls, nothing else charged"
    );
    let mut c = c.clone();
    let r = c.should_rate_limit(one()).await.unwrap().into_inner();
    assert_eq!(codes(&r), vec![(OK, 7)], "a slot is free again");
    let (line, _) = rls.wait_stderr("shedding");
    assert!(line.contains("2 decisions wait on Redis"), "{line}");
    assert!(
        !rls.stderr_so_far().iter().any(|l| l.contains("shedding")),
        "shedding is logged once, not per call"
    );
}

/// A library named tb whose tb_mconsume answers what no backend answers:
/// Redis is up, so each call is INTERNAL, never the open policy's made-up
/// OK, the breaker stays closed, and the cause is logged once.
#[tokio::test]
async fn a_reply_of_no_backends_shape_is_internal_not_an_outage() {
    let redis = Server::with(testkit::Config::without_module());
    let rls = start(
        &daily(10),
        &redis,
        &["--on-redis-error", "open", "--breaker-failures", "2"],
    );
    let mut c = rls.client().await;
    let r = c.should_rate_limit(one()).await.unwrap().into_inner();
    assert_eq!(codes(&r), vec![(OK, 9)]);
    let version: String = redis::cmd("FCALL_RO")
        .arg("tb_version")
        .arg(0)
        .query(&mut redis.conn())
        .unwrap();
    let odd = format!(
        "#!lua name=tb\n\
         redis.register_function{{function_name='tb_version', callback=function() return '{version}' end, flags={{'no-writes'}}}}\n\
         redis.register_function('tb_mconsume', function() return 'odd' end)\n"
    );
    let () = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(odd)
        .query(&mut redis.conn())
        .unwrap();
    for _ in 0..4 {
        let e = c.should_rate_limit(one()).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Internal, "{e:?}");
        assert!(e.message().contains("never answers"), "{e:?}");
    }
    // Bounded: the stderr reader thread has had time to pass every line on.
    std::thread::sleep(Duration::from_millis(200));
    let lines = rls.stderr_so_far();
    assert_eq!(
        lines.iter().filter(|l| l.contains("never answers")).count(),
        1,
        "{lines:?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("breaker open")),
        "{lines:?}"
    );
}
