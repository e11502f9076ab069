//! Config reload under load: the file rewritten while calls run, a bad
//! file among the rewrites; no call fails and each new limit takes over.

mod common;

use common::{daily, one, start};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use testkit::Server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_load_fails_no_call_and_a_bad_file_keeps_the_old_one() {
    let redis = Server::start();
    let rls = start(&daily(100_000), &redis, &["--watch-interval-ms", "50"]);
    // The limit the latest answer was decided on.
    let seen = Arc::new(AtomicU32::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let mut c = rls.client().await;
        let (seen, stop) = (Arc::clone(&seen), Arc::clone(&stop));
        tasks.push(tokio::spawn(async move {
            let mut limits = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let r = c.should_rate_limit(one()).await.unwrap().into_inner();
                assert_eq!(r.overall_code, Code::Ok as i32);
                let n = r.statuses[0]
                    .current_limit
                    .as_ref()
                    .unwrap()
                    .requests_per_unit;
                seen.fetch_max(n, Ordering::Relaxed);
                limits.push(n);
            }
            limits
        }));
    }
    let wait_for = |n: u32| {
        let seen = Arc::clone(&seen);
        async move {
            for _ in 0..400 {
                if seen.load(Ordering::Relaxed) == n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            panic!("limit {n} never served");
        }
    };
    wait_for(100_000).await;
    std::fs::write(&rls.config, daily(200_000)).unwrap();
    rls.wait_stderr("config reloaded: domains=1");
    wait_for(200_000).await;
    // A bad file: logged once, with its path and line; the old limit serves on.
    let bad = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n";
    std::fs::write(&rls.config, bad).unwrap();
    let (line, _) = rls.wait_stderr("config not reloaded");
    assert!(
        line.ends_with(&format!(
            "{}:4: invalid rate limit unit 'fortnight'",
            rls.config.display()
        )),
        "{line}"
    );
    std::fs::write(&rls.config, daily(300_000)).unwrap();
    let (_, between) = rls.wait_stderr("config reloaded: domains=1");
    assert!(between.is_empty(), "the bad file logged once: {between:?}");
    wait_for(300_000).await;
    std::fs::write(&rls.config, daily(400_000)).unwrap();
    rls.wait_stderr("config reloaded: domains=1");
    wait_for(400_000).await;
    stop.store(true, Ordering::Relaxed);
    let mut calls = 0;
    for t in tasks {
        let limits = t.await.unwrap();
        calls += limits.len();
        assert!(
            limits.windows(2).all(|w| w[0] <= w[1]),
            "a call never plans on a config older than the one before it"
        );
        assert!(limits
            .iter()
            .all(|n| [100_000, 200_000, 300_000, 400_000].contains(n)));
    }
    assert!(calls > 8, "{calls} calls");
}

#[tokio::test]
async fn without_a_watch_the_file_is_read_once() {
    let redis = Server::start();
    let rls = start(&daily(5), &redis, &["--watch-interval-ms", "0"]);
    let mut c = rls.client().await;
    std::fs::write(&rls.config, daily(50)).unwrap();
    // Past two polls of the default 1 s watch: a 0 read as "the default"
    // would have reloaded by the second call.
    for left in [4, 3] {
        let r = c.should_rate_limit(one()).await.unwrap().into_inner();
        assert_eq!(common::codes(&r), vec![(Code::Ok as i32, left)]);
        tokio::time::sleep(Duration::from_millis(1250)).await;
    }
    assert!(rls.stderr_so_far().is_empty());
}

/// The peer's layout, RUNTIME_ROOT a symlink swapped to publish (as a
/// Kubernetes ConfigMap does): each swap is served, the old target may go.
#[tokio::test]
async fn a_symlink_swap_of_runtime_root_is_served() {
    let redis = Server::start();
    let dir = common::scratch("root");
    let publish = |version: u32, limit: u32| {
        let target = dir.join(format!("v{version}"));
        std::fs::create_dir_all(target.join("ratelimit/config")).unwrap();
        std::fs::write(target.join("ratelimit/config/limits.yaml"), daily(limit)).unwrap();
        let next = dir.join("next");
        std::os::unix::fs::symlink(&target, &next).unwrap();
        std::fs::rename(&next, dir.join("current")).unwrap();
    };
    publish(1, 5);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tb-rls"));
    cmd.args(["--watch-interval-ms", "50"])
        .env("RUNTIME_ROOT", dir.join("current"))
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("RUNTIME_WATCH_ROOT", "true");
    let config = dir.join("current/ratelimit/config");
    let rls = common::launch(cmd, &redis, dir.clone(), config);
    let mut c = rls.client().await;
    let limit = |r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit
    };
    assert_eq!(
        limit(&c.should_rate_limit(one()).await.unwrap().into_inner()),
        5
    );
    for (version, n) in [(2, 50), (3, 500)] {
        publish(version, n);
        std::fs::remove_dir_all(dir.join(format!("v{}", version - 1))).unwrap();
        rls.wait_stderr("config reloaded: domains=1");
        assert_eq!(
            limit(&c.should_rate_limit(one()).await.unwrap().into_inner()),
            n
        );
    }
    assert!(
        !rls.stderr_so_far()
            .iter()
            .any(|l| l.contains("not reloaded")),
        "no swap was read half done"
    );
}
