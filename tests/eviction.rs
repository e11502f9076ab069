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
