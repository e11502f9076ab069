//! A real tb-rls process against a real redis-server, called with a tonic
//! client built from the same envoy-types protos.

mod common;

use common::{ask, codes, command, descriptor, request, start, start_env, OK, OVER};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::UInt64Value;
use std::io::{Read, Write};
use testkit::{Config as ServerConfig, Server};
use tonic::transport::Channel;

// Day and hour units throughout: a bucket refills too slowly to change a
// count while a test runs.
const MESSAGING: &str = "domain: messaging\ndescriptors:\n  - key: message_type\n    value: marketing\n    descriptors:\n      - key: to_number\n        rate_limit:\n          unit: day\n          requests_per_unit: 5\n  - key: to_number\n    rate_limit:\n      unit: day\n      requests_per_unit: 100\n";

#[tokio::test]
async fn the_peers_example_2_request_by_request_and_a_denial_charges_nothing() {
    let redis = Server::start();
    let rls = start(MESSAGING, &redis, &[]);
    assert!(rls.line.contains("backend=Module"), "{}", rls.line);
    let mut c = rls.client().await;
    let both = || {
        request(
            "messaging",
            vec![
                descriptor(&[("message_type", "marketing"), ("to_number", "2061111111")]),
                descriptor(&[("to_number", "2061111111")]),
            ],
            0,
        )
    };
    for i in 1..=5u32 {
        let r = ask(&mut c, both()).await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(codes(&r), vec![(OK, 5 - i), (OK, 100 - i)]);
        let limit = r.statuses[0].current_limit.as_ref().unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit), (5, 4)); // DAY
        assert!(r.statuses[0].duration_until_reset.is_some());
    }
    let r = ask(&mut c, both()).await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(codes(&r), vec![(OVER, 0), (OK, 95)]);
    let wait = r.statuses[0].duration_until_reset.unwrap();
    assert!(
        wait.seconds > 0,
        "a denied bucket says when it passes: {wait:?}"
    );
    // The denial charged the per-number bucket nothing.
    let r = ask(
        &mut c,
        request(
            "messaging",
            vec![descriptor(&[("to_number", "2061111111")])],
            0,
        ),
    )
    .await;
    assert_eq!(codes(&r), vec![(OK, 94)]);
    // Another number has buckets of its own.
    let r = ask(
        &mut c,
        request(
            "messaging",
            vec![descriptor(&[
                ("message_type", "marketing"),
                ("to_number", "2062222222"),
            ])],
            0,
        ),
    )
    .await;
    assert_eq!(codes(&r), vec![(OK, 4)]);
}

#[tokio::test]
async fn the_peers_examples_3_5_and_7_zero_unlimited_and_replaces() {
    let redis = Server::start();
    let config = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 10}\n  - key: remote_address\n    value: 50.0.0.5\n    rate_limit: {unit: second, requests_per_unit: 0}\n  - key: ldap\n    rate_limit: {unlimited: true}\n  - key: key_1\n    value: value_1\n    descriptors:\n      - key: user\n        value: bkthomps\n        rate_limit: {name: specific_limit, requests_per_unit: 5, unit: day}\n  - key: key_2\n    value: value_2\n    descriptors:\n      - key: user\n        value: bkthomps\n        rate_limit:\n          replaces: [{name: specific_limit}]\n          requests_per_unit: 10\n          unit: day\n";
    let rls = start(config, &redis, &[]);
    let mut c = rls.client().await;
    let r = ask(
        &mut c,
        request(
            "edge",
            vec![descriptor(&[("remote_address", "50.0.0.1")])],
            0,
        ),
    )
    .await;
    assert_eq!(codes(&r), vec![(OK, 9)]);
    let r = ask(
        &mut c,
        request(
            "edge",
            vec![descriptor(&[("remote_address", "50.0.0.5")])],
            0,
        ),
    )
    .await;
    assert_eq!((r.overall_code, codes(&r)), (OVER, vec![(OVER, 0)]));
    let r = ask(
        &mut c,
        request(
            "edge",
            vec![
                descriptor(&[("ldap", "x")]),
                descriptor(&[("nothing", "x")]),
            ],
            0,
        ),
    )
    .await;
    assert_eq!(
        (r.overall_code, codes(&r)),
        (OK, vec![(OK, u32::MAX), (OK, 0)])
    );
    let one = descriptor(&[("key_1", "value_1"), ("user", "bkthomps")]);
    let two = descriptor(&[("key_2", "value_2"), ("user", "bkthomps")]);
    let r = ask(&mut c, request("edge", vec![one.clone(), two.clone()], 0)).await;
    assert_eq!(codes(&r), vec![(OK, 0), (OK, 9)]);
    assert!(
        r.statuses[0].current_limit.is_none(),
        "the replaced limit is not applied"
    );
    let r = ask(&mut c, request("edge", vec![one], 0)).await;
    assert_eq!(codes(&r), vec![(OK, 4)], "nor charged");
    // A zero-limit descriptor denies the request without charging the rest.
    let r = ask(
        &mut c,
        request(
            "edge",
            vec![two.clone(), descriptor(&[("remote_address", "50.0.0.5")])],
            0,
        ),
    )
    .await;
    assert_eq!(codes(&r), vec![(OK, 9), (OVER, 0)]);
    let r = ask(&mut c, request("edge", vec![two], 0)).await;
    assert_eq!(codes(&r), vec![(OK, 8)]);
}

#[tokio::test]
async fn hits_addend_is_the_cost_and_zero_only_checks() {
    let redis = Server::start();
    let rls = start(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 10}\n",
        &redis,
        &[],
    );
    let mut c = rls.client().await;
    let k = || descriptor(&[("k", "v")]);
    assert_eq!(
        codes(&ask(&mut c, request("d", vec![k()], 3)).await),
        vec![(OK, 7)]
    );
    let mut check = k();
    check.hits_addend = Some(UInt64Value { value: 0 });
    assert_eq!(
        codes(&ask(&mut c, request("d", vec![check], 5)).await),
        vec![(OK, 7)]
    );
    let mut own = k();
    own.hits_addend = Some(UInt64Value { value: 2 });
    assert_eq!(
        codes(&ask(&mut c, request("d", vec![own], 5)).await),
        vec![(OK, 5)]
    );
    assert_eq!(
        codes(&ask(&mut c, request("d", vec![k()], 6)).await),
        vec![(OVER, 0)]
    );
    let mut huge = k();
    huge.hits_addend = Some(UInt64Value { value: u64::MAX });
    assert_eq!(
        ask(&mut c, request("d", vec![huge], 0)).await.overall_code,
        OVER
    );
    assert_eq!(
        codes(&ask(&mut c, request("d", vec![k()], 5)).await),
        vec![(OK, 0)]
    );
}

#[tokio::test]
async fn shadow_mode_answers_ok_and_never_stops_the_enforced_charge() {
    let redis = Server::start();
    let config = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 3}\n  - key: ip\n    shadow_mode: true\n    rate_limit: {unit: day, requests_per_unit: 1}\n";
    let rls = start_env(
        config,
        &redis,
        &[],
        &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")],
    );
    let mut c = rls.client().await;
    let both = || {
        request(
            "d",
            vec![
                descriptor(&[("user", "u")]),
                descriptor(&[("ip", "1.2.3.4")]),
            ],
            0,
        )
    };
    let r = ask(&mut c, both()).await;
    assert_eq!((r.overall_code, codes(&r)), (OK, vec![(OK, 2), (OK, 0)]));
    for left in [1, 0] {
        let r = ask(&mut c, both()).await;
        assert_eq!(
            r.overall_code, OK,
            "the shadow limit is over, and answers OK"
        );
        assert_eq!(codes(&r), vec![(OK, left), (OK, 0)]);
    }
    let r = ask(&mut c, both()).await;
    assert_eq!(
        r.overall_code, OVER,
        "the enforced limit was charged all three times"
    );
    let headers: Vec<(String, String)> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect();
    assert_eq!(headers[0], ("RateLimit-Limit".to_string(), "3".to_string()));
    assert_eq!(
        headers[1],
        ("RateLimit-Remaining".to_string(), "0".to_string())
    );
    assert_eq!(headers[2].0, "RateLimit-Reset");
}

#[tokio::test]
async fn each_wildcard_value_has_its_bucket_unless_shared() {
    let redis = Server::start();
    let config = "domain: d\ndescriptors:\n  - key: path\n    value: /api/*\n    rate_limit: {unit: day, requests_per_unit: 2}\n  - key: files\n    value: a/*\n    share_threshold: true\n    rate_limit: {unit: day, requests_per_unit: 2}\n";
    let rls = start(config, &redis, &[]);
    let mut c = rls.client().await;
    for p in ["/api/a", "/api/b"] {
        for left in [1, 0] {
            let r = ask(&mut c, request("d", vec![descriptor(&[("path", p)])], 0)).await;
            assert_eq!(codes(&r), vec![(OK, left)], "{p}");
        }
    }
    let r = ask(
        &mut c,
        request("d", vec![descriptor(&[("path", "/other")])], 0),
    )
    .await;
    assert!(r.statuses[0].current_limit.is_none());
    assert_eq!(
        codes(
            &ask(
                &mut c,
                request("d", vec![descriptor(&[("files", "a/x")])], 0)
            )
            .await
        ),
        vec![(OK, 1)]
    );
    assert_eq!(
        codes(
            &ask(
                &mut c,
                request("d", vec![descriptor(&[("files", "a/y")])], 0)
            )
            .await
        ),
        vec![(OK, 0)]
    );
    assert_eq!(
        ask(
            &mut c,
            request("d", vec![descriptor(&[("files", "a/z")])], 0)
        )
        .await
        .overall_code,
        OVER
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_give_the_exact_budget() {
    let redis = Server::start();
    let config =
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 25}\n";
    let (a, b) = (start(config, &redis, &[]), start(config, &redis, &[]));
    let mut tasks = Vec::new();
    for rls in [&a, &b] {
        for _ in 0..4 {
            let mut c = rls.client().await;
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0;
                for _ in 0..10 {
                    let r = c
                        .should_rate_limit(request("d", vec![descriptor(&[("k", "v")])], 0))
                        .await
                        .unwrap();
                    admitted += usize::from(r.into_inner().overall_code == OK);
                }
                admitted
            }));
        }
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    assert_eq!(admitted, 25, "80 calls through two instances");
}

#[tokio::test]
async fn the_lua_library_alone_serves_the_same_answers() {
    let redis = Server::with(ServerConfig::without_module());
    let rls = start(MESSAGING, &redis, &[]);
    assert!(rls.line.contains("backend=Functions"), "{}", rls.line);
    let mut c = rls.client().await;
    let both = || {
        request(
            "messaging",
            vec![
                descriptor(&[("message_type", "marketing"), ("to_number", "1")]),
                descriptor(&[("to_number", "1")]),
            ],
            0,
        )
    };
    for i in 1..=5u32 {
        assert_eq!(
            codes(&ask(&mut c, both()).await),
            vec![(OK, 5 - i), (OK, 100 - i)]
        );
    }
    assert_eq!(codes(&ask(&mut c, both()).await), vec![(OVER, 0), (OK, 95)]);
    // FUNCTION FLUSH behind its back: found again and loaded, the call answered.
    let mut conn = redis.conn();
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query(&mut conn)
        .unwrap();
    assert_eq!(
        codes(
            &ask(
                &mut c,
                request("messaging", vec![descriptor(&[("to_number", "1")])], 0)
            )
            .await
        ),
        vec![(OK, 94)]
    );
}

#[tokio::test]
async fn bad_requests_get_a_clear_status_and_the_service_goes_on() {
    let redis = Server::start();
    let rls = start(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 10}\n",
        &redis,
        &[],
    );
    let mut c = rls.client().await;
    let refused = |r: Result<tonic::Response<RateLimitResponse>, tonic::Status>| {
        let e = r.unwrap_err();
        (e.code(), e.message().to_string())
    };
    let (code, msg) = refused(
        c.should_rate_limit(request("", vec![descriptor(&[("k", "v")])], 0))
            .await,
    );
    assert_eq!(
        (code, msg.as_str()),
        (
            tonic::Code::InvalidArgument,
            "rate limit domain must not be empty"
        )
    );
    let (code, msg) = refused(c.should_rate_limit(request("d", vec![], 0)).await);
    assert_eq!(
        (code, msg.as_str()),
        (
            tonic::Code::InvalidArgument,
            "rate limit descriptor list must not be empty"
        )
    );
    let many = vec![descriptor(&[("k", "v")]); 10_001];
    let (code, msg) = refused(c.should_rate_limit(request("d", many, 0)).await);
    assert_eq!(
        (code, msg.as_str()),
        (
            tonic::Code::InvalidArgument,
            "10001 descriptors in one request: at most 10000"
        )
    );
    let mut bad_unit = descriptor(&[("k", "v")]);
    bad_unit.limit = Some(rate_limit_descriptor::RateLimitOverride {
        requests_per_unit: 5,
        unit: 0,
    });
    let (code, _) = refused(c.should_rate_limit(request("d", vec![bad_unit], 0)).await);
    assert_eq!(code, tonic::Code::InvalidArgument);
    // An unknown domain limits nothing, as in the peer.
    let r = ask(
        &mut c,
        request("nobody", vec![descriptor(&[("k", "v")])], 0),
    )
    .await;
    assert_eq!((r.overall_code, codes(&r)), (OK, vec![(OK, 0)]));
    // A huge value, and thousands of distinct buckets in one call.
    let big = "x".repeat(1 << 20);
    assert_eq!(
        codes(&ask(&mut c, request("d", vec![descriptor(&[("k", &big)])], 0)).await),
        vec![(OK, 9)]
    );
    let thousands: Vec<_> = (0..5000)
        .map(|i| descriptor(&[("k", &i.to_string())]))
        .collect();
    let r = ask(&mut c, request("d", thousands, 0)).await;
    assert_eq!(r.overall_code, OK);
    assert!(r.statuses.iter().all(|s| s.limit_remaining == 9));
    // Still serving, and a denial wrote nothing.
    assert_eq!(
        codes(&ask(&mut c, request("d", vec![descriptor(&[("k", "v")])], 0)).await),
        vec![(OK, 9)]
    );
}

#[test]
fn a_bad_config_stops_startup_with_path_line_and_reason() {
    let redis = Server::start();
    let (mut cmd, dir) = command(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
        &redis,
    );
    let out = cmd.output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let path = dir.join("config.yaml");
    assert_eq!(
        err.trim(),
        format!(
            "tb-rls: {}:5: invalid rate limit unit 'fortnight'",
            path.display()
        )
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn http_healthcheck_and_grpc_health_answer() {
    let redis = Server::start();
    let rls = start(MESSAGING, &redis, &[]);
    let mut s = std::net::TcpStream::connect(&rls.http).unwrap();
    s.write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    assert!(
        body.starts_with("HTTP/1.1 200") && body.ends_with("OK"),
        "{body}"
    );
    let channel = Channel::from_shared(format!("http://{}", rls.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let r = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}

#[tokio::test]
async fn redis_gone_is_unavailable_and_back_is_served_again() {
    let mut redis = Server::start();
    let config =
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 10}\n";
    let mut rls = start(config, &redis, &[]);
    let mut c = rls.client().await;
    let one = || request("d", vec![descriptor(&[("k", "v")])], 0);
    assert_eq!(codes(&ask(&mut c, one()).await), vec![(OK, 9)]);
    redis.kill9();
    let e = c.should_rate_limit(one()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().starts_with("redis: "), "{e:?}");
    assert!(
        rls.child.try_wait().unwrap().is_none(),
        "tb-rls keeps running"
    );
    let same = redis.config.clone();
    redis.restart_with(same);
    // The connection manager reconnects in the background: a bounded wait.
    let mut answer = None;
    for _ in 0..100 {
        if let Ok(r) = c.should_rate_limit(one()).await {
            answer = Some(r.into_inner());
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let r = answer.expect("served again once Redis is back");
    // A fresh server without persistence: a full bucket.
    assert_eq!(codes(&r), vec![(OK, 9)]);
}
