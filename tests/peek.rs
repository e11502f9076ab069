//! TB.PEEK: the same reply as TB.CONSUME without charging, never a write,
//! and it runs on a read-only replica.

use std::time::Duration;
use testkit::{
    back_to_back, consume, error_of, hgetall, int, peek, repl_offset, start_replica, wait_replicas,
    Config, Server,
};

#[test]
fn peek_reports_without_charging() {
    let s = Server::start();
    let mut c = s.conn();
    // Missing key: a full bucket, nothing created.
    assert_eq!(peek(&mut c, "k", "10", "1", "3"), vec![1, 10, 0, 0]);
    assert_eq!(int(&mut c, "EXISTS", "k"), 0);

    // 1 token short at 0.001/s → 1000 s, and full again in 8000 s, less
    // what refilled between the two calls.
    let (key, r, took) = back_to_back(Duration::from_secs(1000), |key| {
        consume(&mut c, key, "10", "0.001", "8");
        peek(&mut c, key, "10", "0.001", "3")
    });
    assert_eq!(r[0..2], [0, 2]);
    assert!(
        r[2] <= 1_000_000 && r[2] >= 1_000_000 - took,
        "{r:?}, {took} ms"
    );
    assert!(
        r[3] <= 8_000_000 && r[3] >= 8_000_000 - took,
        "{r:?}, {took} ms"
    );
    assert_eq!(peek(&mut c, &key, "10", "0.001", "2")[0..3], [1, 2, 0]);
}

#[test]
fn peek_never_writes_or_touches_the_ttl() {
    let s = Server::start();
    let _replica = start_replica(&s, Config::default());
    let mut c = s.conn();
    consume(&mut c, "k", "5", "0.01", "3");
    let state = hgetall(&mut c, "k");
    let at = int(&mut c, "PEXPIRETIME", "k");
    let offset = repl_offset(&mut c);
    for cost in ["0", "1", "2", "5"] {
        peek(&mut c, "k", "5", "0.01", cost);
        peek(&mut c, "k", "3", "0.01", cost.replace('5', "3").as_str());
    }
    assert_eq!(hgetall(&mut c, "k"), state);
    assert_eq!(int(&mut c, "PEXPIRETIME", "k"), at);
    assert_eq!(repl_offset(&mut c), offset);
}

#[test]
fn peek_runs_on_a_replica_and_consume_does_not() {
    let s = Server::start();
    let replica = start_replica(&s, Config::default());
    let mut p = s.conn();
    consume(&mut p, "k", "10", "0.01", "4");
    wait_replicas(&mut p, 1);

    let mut r = replica.conn();
    assert_eq!(peek(&mut r, "k", "10", "0.01", "1")[0..2], [1, 6]);
    let mut cmd = redis::cmd("TB.CONSUME");
    cmd.arg("k").arg(10).arg(0.01);
    assert!(error_of(&mut r, &cmd).starts_with("READONLY"));
}
