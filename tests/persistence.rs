//! State survives restarts: AOF after kill -9, SAVE and BGSAVE (a BGSAVE
//! holds the state at fork time), and it is a plain hash that a server
//! without the module still loads.

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
    // Quotas, a mixed call and a reservation (periods of 31 years: none
    // ends during the test).
    for i in 0..10 {
        let _: Vec<i64> = redis::cmd("TB.QUOTA")
            .arg(&[&format!("q:{i}"), "1000", "1000000000", "12.5"])
            .query(c)
            .unwrap();
    }
    let _: redis::Value = redis::cmd("TB.CHARGE")
        .arg(&[
            "2", "rl:{t}:c", "q:{t}", "WAIT", "100000", "BUCKET", "5", "0.01", "5",
        ])
        .arg(&["QUOTA", "10", "1000000000", "3"])
        .query(c)
        .unwrap();
    let _: Vec<i64> = redis::cmd("TB.CONSUME")
        .arg(&["rl:{t}:c", "5", "0.01", "2", "WAIT", "1000000"])
        .query(c)
        .unwrap();
}

#[test]
fn aof_restores_identical_state_after_kill_9() {
    let mut s = Server::with(aof());
    let mut c = s.conn();
    some_buckets(&mut c);
    let before = snapshot(&mut c);
    assert_eq!(before.len(), 214);
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

fn config_set(c: &mut redis::Connection, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", name, value])
        .query(c)
        .unwrap();
}

/// Waits for the running BGSAVE to end, and checks it succeeded.
fn wait_bgsave(c: &mut redis::Connection) {
    assert!(eventually(std::time::Duration::from_secs(60), || {
        info_field(c, "persistence", "rdb_bgsave_in_progress") == "0"
    }));
    assert_eq!(info_field(c, "persistence", "rdb_last_bgsave_status"), "ok");
}

/// BGSAVE writes the dataset as it was when the server forked: a bucket
/// charged, and one created, while the child is still writing are not in
/// that file (a restart from it restores the state at fork time exactly),
/// and are in the next one (a restart from it restores them exactly).
/// `rdb-key-save-delay` (µs per key, slept by the child) keeps the child
/// busy for at least 4 s, so the writes land while it runs, as INFO checks.
#[test]
fn bgsave_holds_the_state_at_fork_time_and_the_next_one_the_writes_during_it() {
    let mut s = Server::start();
    let mut c = s.conn();
    some_buckets(&mut c);
    let at_fork = snapshot(&mut c);
    config_set(&mut c, "rdb-key-save-delay", "20000");
    let started: String = redis::cmd("BGSAVE").query(&mut c).unwrap();
    assert!(started.contains("started"), "{started}");

    // rl:user:1 held 48 of 50: charged 5 more. rl:during is new.
    assert_eq!(
        consume(&mut c, "rl:user:1", "50", "0.01", "5")[..3],
        [1, 43, 0]
    );
    assert_eq!(
        consume(&mut c, "rl:during", "9", "0.01", "4")[..3],
        [1, 5, 0]
    );
    assert_eq!(
        info_field(&mut c, "persistence", "rdb_bgsave_in_progress"),
        "1",
        "the writes ran while the child was saving"
    );
    let after_writes = snapshot(&mut c);
    assert_eq!(after_writes.len(), at_fork.len() + 1);
    assert_ne!(
        after_writes[&b"rl:user:1".to_vec()],
        at_fork[&b"rl:user:1".to_vec()]
    );
    wait_bgsave(&mut c);
    let rdb = s.dir.join("dump.rdb");
    let fork_rdb = s.dir.join("fork-time.rdb");
    std::fs::copy(&rdb, &fork_rdb).expect("keep the first dump");

    // The next BGSAVE, with nothing written meanwhile, holds the writes.
    config_set(&mut c, "rdb-key-save-delay", "0");
    let _: String = redis::cmd("BGSAVE").query(&mut c).unwrap();
    wait_bgsave(&mut c);
    drop(c);
    s.kill9();
    s.restart_with(Config::default());
    assert_eq!(
        snapshot(&mut s.conn()),
        after_writes,
        "restart from the BGSAVE after the writes"
    );

    // The first one holds the dataset at fork time, and nothing later.
    s.kill9();
    std::fs::copy(&fork_rdb, &rdb).expect("put the first dump back");
    s.restart_with(Config::default());
    let mut c = s.conn();
    assert_eq!(
        snapshot(&mut c),
        at_fork,
        "restart from the BGSAVE that forked before the writes"
    );
    // ...and the module carries on from it: 48 left, not 43.
    assert_eq!(
        consume(&mut c, "rl:user:1", "50", "0.01", "1")[..3],
        [1, 47, 0]
    );
}
