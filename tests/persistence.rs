//! State survives restarts: AOF after kill -9, and it is a plain hash that a
//! server without the module still loads.

use testkit::{consume, eventually, hgetall, info_field, peek, snapshot, Config, Server};

fn aof() -> Config {
    Config::default()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
}

fn some_buckets(c: &mut redis::Connection) {
    for i in 0..200 {
        let key = format!("rl:user:{i}");
        consume(c, &key, "50", "0.01", &format!("{}", 1 + i % 7));
        if i % 3 == 0 {
            let _: Vec<i64> = redis::cmd("TB.ADJUST")
                .arg(&[key.as_str(), "50", "0.01", "-60"])
                .query(c)
                .unwrap();
        }
    }
    let _: redis::Value = redis::cmd("TB.MCONSUME")
        .arg(&["rl:{t}:a", "5", "0.01", "2", "rl:{t}:b", "5", "0.01", "3"])
        .query(c)
        .unwrap();
}

#[test]
fn aof_restores_identical_state_after_kill_9() {
    let mut s = Server::with(aof());
    let mut c = s.conn();
    some_buckets(&mut c);
    let before = snapshot(&mut c);
    assert_eq!(before.len(), 202);
    drop(c);
    s.kill9();
    s.restart_with(aof());
    assert_eq!(snapshot(&mut s.conn()), before);
}

#[test]
fn data_loads_without_the_module_and_back() {
    let mut s = Server::with(aof());
    let mut c = s.conn();
    some_buckets(&mut c);
    let before = snapshot(&mut c);
    drop(c);
    s.kill9();
    s.restart_with(Config {
        module: false,
        ..aof()
    });
    assert_eq!(
        snapshot(&mut s.conn()),
        before,
        "plain hashes load anywhere"
    );
    s.kill9();
    s.restart_with(aof());
    let mut c = s.conn();
    assert_eq!(snapshot(&mut c), before);
    // ...and the module carries on from that state: 50 - cost(1) = 49.
    assert_eq!(peek(&mut c, "rl:user:1", "50", "0.01", "1")[0], 1);
    assert_eq!(
        hgetall(&mut c, "rl:user:1"),
        before[&b"rl:user:1".to_vec()].0
    );
}

#[test]
fn bgrewriteaof_then_restart_is_identical() {
    let mut s = Server::with(aof());
    let mut c = s.conn();
    some_buckets(&mut c);
    let _: String = redis::cmd("BGREWRITEAOF").query(&mut c).unwrap();
    assert!(eventually(std::time::Duration::from_secs(30), || {
        info_field(&mut c, "persistence", "aof_rewrite_in_progress") == "0"
            && info_field(&mut c, "persistence", "aof_rewrite_scheduled") == "0"
            && info_field(&mut c, "persistence", "aof_last_bgrewrite_status") == "ok"
    }));
    // A write after the rewrite lands in the new incremental AOF.
    consume(&mut c, "rl:after", "9", "0.01", "4");
    let before = snapshot(&mut c);
    drop(c);
    s.kill9();
    s.restart_with(aof());
    assert_eq!(snapshot(&mut s.conn()), before);
}

#[test]
fn rdb_save_then_restart_is_identical() {
    let mut s = Server::start();
    let mut c = s.conn();
    some_buckets(&mut c);
    let _: String = redis::cmd("SAVE").query(&mut c).unwrap();
    let before = snapshot(&mut c);
    drop(c);
    s.kill9();
    s.restart_with(Config::default());
    assert_eq!(snapshot(&mut s.conn()), before);
}
