//! TB.MCONSUME: several buckets, all-or-nothing.

use redis::Value;
use std::time::Duration;
use testkit::{
    back_to_back, bad_then_expired, consume, dbsize, error_of, exec_survives, expired_keys,
    hgetall, int, lazy_expiry_only, repl_offset, snapshot, start_replica, wait_replicas, Config,
    Server,
};

fn mconsume(c: &mut redis::Connection, args: &[&str]) -> (i64, i64, Vec<Vec<i64>>) {
    let v: Vec<Value> = redis::cmd("TB.MCONSUME")
        .arg(args)
        .query(c)
        .expect("TB.MCONSUME");
    let allowed: i64 = redis::from_redis_value(&v[0]).unwrap();
    let retry: i64 = redis::from_redis_value(&v[1]).unwrap();
    let buckets = v[2..]
        .iter()
        .map(|b| redis::from_redis_value(b).unwrap())
        .collect();
    (allowed, retry, buckets)
}

#[test]
fn all_admitted_charges_every_bucket() {
    let s = Server::start();
    let mut c = s.conn();
    let (ok, retry, b) = mconsume(
        &mut c,
        &[
            "u", "10", "1", "1", "k", "5", "0.5", "2", "i", "3", "2", "0",
        ],
    );
    assert_eq!((ok, retry), (1, 0));
    assert_eq!(
        b,
        vec![vec![1, 9, 0, 1000], vec![1, 3, 0, 4000], vec![1, 3, 0, 0]]
    );
    assert_eq!(hgetall(&mut c, "u")["tokens"], "9");
    assert_eq!(hgetall(&mut c, "k")["tokens"], "3");
    assert_eq!(int(&mut c, "EXISTS", "i"), 0, "cost 0 writes nothing");
    let ts = &hgetall(&mut c, "u")["ts"];
    assert_eq!(&hgetall(&mut c, "k")["ts"], ts, "one clock read per call");
}

#[test]
fn one_short_bucket_writes_nothing_anywhere() {
    let s = Server::start();
    let _replica = start_replica(&s, Config::default());
    let mut c = s.conn();
    consume(&mut c, "u", "10", "0.01", "4");
    // ip drained, then the call: ip is short as long as they come within
    // the 100 s a token takes at 0.01/s.
    let mut before = Default::default();
    let mut offset = 0;
    let (ip, (ok, retry, b), took) = back_to_back(Duration::from_secs(100), |ip| {
        consume(&mut c, ip, "2", "0.01", "2");
        before = snapshot(&mut c);
        offset = repl_offset(&mut c);
        mconsume(
            &mut c,
            &[
                "u", "10", "0.01", "1", "key", "5", "1", "1", ip, "2", "0.01", "1",
            ],
        )
    });
    assert_eq!(ok, 0);
    assert_eq!(b[0][0..2], [1, 6], "user could pay, untouched");
    assert_eq!(b[1], vec![1, 5, 0, 0], "missing key: full, untouched");
    assert_eq!(b[2][0..2], [0, 0]);
    assert_eq!(retry, b[2][2]);
    assert!(
        retry <= 100_000 && retry >= 100_000 - took,
        "{retry}, {took} ms after {ip} was drained"
    );

    assert_eq!(snapshot(&mut c), before, "nothing written");
    assert_eq!(int(&mut c, "EXISTS", "key"), 0);
    assert_eq!(repl_offset(&mut c), offset, "nothing replicated");
}

#[test]
fn the_worst_retry_wins() {
    let s = Server::start();
    let mut c = s.conn();
    // Three drained buckets, then one call on all three, within the
    // 1000 ms a's token takes.
    let (_, (ok, retry, b), took) = back_to_back(Duration::from_millis(1000), |k| {
        let (a, bb, cc) = (format!("{k}:a"), format!("{k}:b"), format!("{k}:c"));
        consume(&mut c, &a, "1", "1", "1"); // 1000 ms to pass again
        consume(&mut c, &bb, "1", "0.25", "1"); // 4000 ms
        consume(&mut c, &cc, "1", "0.5", "1"); // 2000 ms
        mconsume(
            &mut c,
            &[
                &a, "1", "1", "1", &bb, "1", "0.25", "1", &cc, "1", "0.5", "1",
            ],
        )
    });
    assert_eq!(ok, 0);
    // Each bucket's wait, less at most `took` ms of refill.
    for (bucket, full_wait) in b.iter().zip([1000, 4000, 2000]) {
        assert_eq!(bucket[..2], [0, 0], "{b:?}");
        assert!(
            bucket[2] <= full_wait && bucket[2] >= full_wait - took,
            "{b:?}, {took} ms"
        );
    }
    let worst = b.iter().map(|x| x[2]).max().unwrap();
    assert_eq!(retry, worst);
    assert_eq!(retry, b[1][2]);
}

#[test]
fn duplicates_arity_and_group_limit() {
    let s = Server::start();
    let mut c = s.conn();
    let err = error_of(
        &mut c,
        redis::cmd("TB.MCONSUME")
            .arg(&["a", "1", "1", "1", "b", "1", "1", "1", "a", "2", "1", "1"]),
    );
    assert_eq!(err, "ERR duplicate key: group 3 repeats the key of group 1");
    for bad in [
        &["a"][..],
        &["a", "1", "1"],
        &["a", "1", "1", "1", "b", "1", "1"],
    ] {
        let err = error_of(&mut c, redis::cmd("TB.MCONSUME").arg(bad));
        assert_eq!(
            err,
            "ERR wrong number of arguments for 'tb.mconsume' command"
        );
    }
    let err = error_of(&mut c, &redis::cmd("TB.MCONSUME"));
    assert!(err.contains("wrong number of arguments"), "{err}");

    let group = |i: usize| [format!("g{i}"), "2".into(), "1".into(), "1".into()];
    let many: Vec<String> = (0..10_000).flat_map(group).collect();
    let (ok, _, b) = mconsume(&mut c, &many.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!((ok, b.len()), (1, 10_000));
    let too_many: Vec<String> = (0..10_001).flat_map(group).collect();
    let err = error_of(&mut c, redis::cmd("TB.MCONSUME").arg(&too_many));
    assert_eq!(err, "ERR too many buckets: at most 10000 groups per call");
    assert_eq!(int(&mut c, "EXISTS", "g10000"), 0);
}

#[test]
fn replicated_as_effects() {
    let s = Server::start();
    let replica = start_replica(&s, Config::without_module());
    let mut c = s.conn();
    for i in 0..200 {
        let (a, b) = (format!("a{}", i % 7), format!("b{}", i % 5));
        let _ = mconsume(&mut c, &[&a, "5", "0.01", "1", &b, "3", "0.01", "1"]);
    }
    wait_replicas(&mut c, 1);
    let primary = snapshot(&mut c);
    assert_eq!(primary.len(), 12);
    assert_eq!(snapshot(&mut replica.conn()), primary);
}

#[test]
fn only_buckets_it_changes_are_signalled_as_modified() {
    let s = Server::start();
    let mut watcher = s.conn();
    let mut c = s.conn();
    consume(&mut c, "k", "1", "0.001", "1"); // k is empty now
    let denied = ["u", "10", "1", "1", "k", "1", "0.001", "1"];
    assert!(exec_survives(&mut watcher, &["u", "k"], || {
        assert_eq!(mconsume(&mut c, &denied).0, 0);
    }));
    // Admitted: u is charged, k's cost is 0 so k is not touched.
    let admitted = ["u", "10", "1", "1", "k", "1", "0.001", "0"];
    assert!(exec_survives(&mut watcher, &["k"], || {
        assert_eq!(mconsume(&mut c, &admitted).0, 1);
    }));
    assert!(!exec_survives(&mut watcher, &["u"], || {
        assert_eq!(mconsume(&mut c, &admitted).0, 1);
    }));
}

/// `bad` (a string, or a hash that is not a bucket) before `later`, an
/// expired bucket: the call fails at `bad` without opening `later`.
#[test]
fn an_error_stops_before_later_groups_are_opened() {
    let s = lazy_expiry_only(Config::default());
    let mut c = s.conn();
    for bad in ["string", "hash"] {
        bad_then_expired(&mut c, bad);
        let before = expired_keys(&mut c);
        let err = error_of(
            &mut c,
            redis::cmd("TB.MCONSUME").arg(&["bad", "10", "1", "1", "later", "10", "1", "1"]),
        );
        assert!(
            err.starts_with(if bad == "string" {
                "WRONGTYPE"
            } else {
                "ERR key is not a token bucket"
            }),
            "{err}"
        );
        assert_eq!(
            expired_keys(&mut c),
            before,
            "{bad}: the expired key was opened"
        );
        assert_eq!(dbsize(&mut c), 2, "{bad}");
        // Opening it afterwards does expire it: the setup holds.
        assert_eq!(int(&mut c, "EXISTS", "later"), 0);
    }
}
