//! State survives restarts: AOF after kill -9, and it is a plain hash that a
//! server without the module still loads.

use testkit::{
    consume, eventually, hgetall, info_field, peek, server_time_us, snapshot, Config, Server,
};

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
    // ...and the module carries on from that state: rl:user:1 was charged
    // 2 of 50 (then refilled at 0.01/s, under 1 token in the seconds this
    // test runs), so it holds 48, not a fresh bucket's 50, and a charge of
    // 1 leaves 47.
    let stored = &before[&b"rl:user:1".to_vec()].0;
    assert_eq!(stored["tokens"], "48");
    let ts: i64 = stored["ts"].parse().unwrap();
    let r = peek(&mut c, "rl:user:1", "50", "0.01", "1");
    let now_us = server_time_us(&mut c);
    assert_eq!(r[..3], [1, 48, 0], "{r:?}");
    // Full again when the 2 missing tokens are back: 200 s after ts, less
    // what has refilled by the peek (it ran before `now_us`).
    let since_ts_ms = (now_us - ts) / 1000;
    assert!(
        r[3] <= 200_000 && r[3] >= 200_000 - since_ts_ms - 1,
        "{r:?}, {since_ts_ms} ms after the write"
    );
    assert_eq!(
        hgetall(&mut c, "rl:user:1"),
        *stored,
        "a peek writes nothing"
    );
    assert_eq!(
        consume(&mut c, "rl:user:1", "50", "0.01", "1")[..3],
        [1, 47, 0]
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
