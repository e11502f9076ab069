//! The module warns where the server may evict its keys: a
//! `maxmemory-policy` other than `noeviction` with a `maxmemory` set is
//! logged once as a warning naming the risk, at load and after each
//! `CONFIG SET` (the config-change event on 7.0 and later, a timer on 6.2),
//! and `INFO tb` shows the policy and `tb_eviction_risk` (0 or 1).

use std::time::{Duration, Instant};
use testkit::{info_field, pypi_server, Config, Pypi, Server};

const WARNING: &str = "an evicted bucket comes back full";

fn risk(c: &mut redis::Connection) -> String {
    info_field(c, "tb", "tb_eviction_risk")
}

fn policy(c: &mut redis::Connection) -> String {
    info_field(c, "tb", "tb_maxmemory_policy")
}

fn config_set(c: &mut redis::Connection, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", name, value])
        .query(c)
        .expect("CONFIG SET");
}

fn warnings(s: &Server, policy: &str) -> usize {
    let named = format!("tb: maxmemory-policy {policy} with");
    s.log()
        .lines()
        .filter(|l| l.contains(&named) && l.contains(WARNING))
        .count()
}

#[test]
fn an_evicting_policy_is_warned_at_load_and_shown_by_info() {
    let s = Server::with(
        Config::default()
            .arg("maxmemory", "100mb")
            .arg("maxmemory-policy", "allkeys-lru"),
    );
    let mut c = s.conn();
    assert_eq!(risk(&mut c), "1");
    assert_eq!(policy(&mut c), "allkeys-lru");
    assert_eq!(warnings(&s, "allkeys-lru"), 1, "{}", s.log());
    let log = s.log();
    assert!(log.contains("lease") && log.contains("noeviction"), "{log}");
}

#[test]
fn no_maxmemory_or_noeviction_says_nothing() {
    let s = Server::with(Config::default().arg("maxmemory-policy", "volatile-ttl"));
    let mut c = s.conn();
    assert_eq!(risk(&mut c), "0", "no maxmemory: nothing is evicted");
    assert_eq!(policy(&mut c), "volatile-ttl");
    config_set(&mut c, "maxmemory-policy", "noeviction");
    config_set(&mut c, "maxmemory", "100mb");
    assert_eq!(risk(&mut c), "0");
    assert!(!s.log().contains(WARNING), "{}", s.log());
}

/// On 7.0 the config-change event makes the change visible in the same
/// connection's next command.
#[test]
fn config_set_is_seen_at_once_and_warned_once_per_setting() {
    let s = Server::start();
    let mut c = s.conn();
    assert_eq!(risk(&mut c), "0");
    config_set(&mut c, "maxmemory", "100mb");
    assert_eq!(risk(&mut c), "0", "noeviction, the default");
    config_set(&mut c, "maxmemory-policy", "volatile-ttl");
    assert_eq!(risk(&mut c), "1");
    assert_eq!(policy(&mut c), "volatile-ttl");
    assert_eq!(warnings(&s, "volatile-ttl"), 1, "{}", s.log());
    // The same setting again, or another setting changed: no new line.
    config_set(&mut c, "maxmemory-policy", "volatile-ttl");
    config_set(&mut c, "hz", "11");
    assert_eq!(warnings(&s, "volatile-ttl"), 1, "{}", s.log());
    // Safe, then the same risk again: warned again.
    config_set(&mut c, "maxmemory-policy", "noeviction");
    assert_eq!(risk(&mut c), "0");
    config_set(&mut c, "maxmemory-policy", "volatile-ttl");
    assert_eq!(warnings(&s, "volatile-ttl"), 2, "{}", s.log());
    config_set(&mut c, "maxmemory", "0");
    assert_eq!(risk(&mut c), "0", "no maxmemory again");
}

/// Redis 6.2 has no config-change event: a timer reads the settings once
/// a second, and the module still unloads (its timer stopped first).
#[test]
fn redis_6_2_sees_a_change_within_its_timer() {
    let s = Server::with(Config {
        bin: pypi_server(Pypi::Redis62),
        ..Config::default()
    });
    let mut c = s.conn();
    assert_eq!(risk(&mut c), "0");
    config_set(&mut c, "maxmemory", "100mb");
    config_set(&mut c, "maxmemory-policy", "allkeys-lfu");
    let deadline = Instant::now() + Duration::from_secs(10);
    while risk(&mut c) != "1" {
        assert!(Instant::now() < deadline, "never seen: {}", s.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(policy(&mut c), "allkeys-lfu");
    assert_eq!(warnings(&s, "allkeys-lfu"), 1, "{}", s.log());
    let _: () = redis::cmd("MODULE")
        .arg(&["UNLOAD", "tb"])
        .query(&mut c)
        .expect("MODULE UNLOAD with the timer armed");
}

/// What each policy mints: 100 drained buckets (10 tokens each, full again
/// only in hours), then a cache's writes past `maxmemory`. An evicted
/// bucket comes back full, so every one evicted admits its 10 tokens
/// again. The figures vary from run to run and are printed; `noeviction`
/// must mint nothing (its writes are refused with OOM instead).
fn minted_under(policy: &str) -> (u64, u64) {
    let s = Server::start();
    let mut c = s.conn();
    let used: u64 = info_field(&mut c, "memory", "used_memory")
        .parse()
        .expect("used_memory");
    config_set(&mut c, "maxmemory", &(used + 2_000_000).to_string());
    config_set(&mut c, "maxmemory-policy", policy);
    config_set(&mut c, "maxmemory-samples", "10");
    for i in 0..100 {
        let r: Vec<i64> = redis::cmd("TB.CONSUME")
            .arg(&[&format!("rl:{i}"), "10", "0.001", "10"])
            .query(&mut c)
            .expect("drain");
        assert_eq!(r[..2], [1, 0], "bucket {i} drained");
    }
    // The cache: 8,000 values of 1 KiB with a day's TTL, about four times
    // what maxmemory leaves, so an evicting policy must make room.
    let value = "x".repeat(1024);
    let mut refused = 0u64;
    for i in 0..8000 {
        let r: redis::RedisResult<()> = redis::cmd("SET")
            .arg(&[&format!("cache:{i}"), value.as_str(), "EX", "86400"])
            .query(&mut c);
        if r.is_err() {
            refused += 1;
        }
    }
    let mut minted = 0;
    for i in 0..100 {
        let r: redis::RedisResult<Vec<i64>> = redis::cmd("TB.CONSUME")
            .arg(&[&format!("rl:{i}"), "10", "0.001", "10"])
            .query(&mut c);
        if let Ok(r) = r {
            minted += 10 * u64::try_from(r[0]).unwrap_or(0);
        }
    }
    eprintln!(
        "{policy}: {minted} tokens minted of 100 drained buckets, {refused} cache writes refused"
    );
    (minted, refused)
}

#[test]
fn noeviction_mints_nothing_and_the_evicting_policies_are_measured() {
    let (minted, refused) = minted_under("noeviction");
    assert_eq!(minted, 0, "noeviction minted tokens");
    assert!(
        refused > 0,
        "the cache never reached maxmemory: the test proves nothing"
    );
    // Measured, not asserted: what the docs' table reports.
    for policy in ["allkeys-lru", "volatile-ttl"] {
        minted_under(policy);
    }
}
