//! TB.CONSUME on a real server: reply values, stored hash, expiry, and that
//! denied and zero-cost calls write nothing.

use std::time::Duration;
use testkit::{
    back_to_back, consume, error_of, exec_survives, hgetall, info_field, int, repl_offset,
    server_time_us, start_replica, Config, Server,
};

/// Waits until the server's clock is past `ms` (ms since the epoch): a key
/// whose PEXPIRETIME is `ms` or earlier has expired by then.
fn wait_for_server_ms(c: &mut redis::Connection, ms: i64) {
    while server_time_us(c) / 1000 <= ms {
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn fresh_bucket_replies_and_stores_state() {
    let s = Server::start();
    // The replication offset only moves while a replica is attached.
    let _replica = start_replica(&s, Config::default());
    let mut c = s.conn();
    let before = repl_offset(&mut c);
    let t0 = server_time_us(&mut c);
    assert_eq!(consume(&mut c, "k", "10", "1", "1"), vec![1, 9, 0, 1000]);
    let t1 = server_time_us(&mut c);

    let h = hgetall(&mut c, "k");
    assert_eq!(h.len(), 2, "{h:?}");
    assert_eq!(h["tokens"], "9");
    let ts: i64 = h["ts"].parse().expect("ts is an integer");
    assert!(
        t0 <= ts && ts <= t1,
        "ts {ts} is the server's clock in µs, read between {t0} and {t1}"
    );

    // Expires exactly when full again: ceil(ts/1000) + reset_after_ms.
    let at = int(&mut c, "PEXPIRETIME", "k");
    assert_eq!(at, (ts + 999) / 1000 + 1000);
    // PTTL counts from the server's current (floored) millisecond.
    let (t2, pttl, t3) = (
        server_time_us(&mut c) / 1000,
        int(&mut c, "PTTL", "k"),
        server_time_us(&mut c) / 1000,
    );
    assert!(
        at - t3 <= pttl && pttl <= at - t2,
        "pttl {pttl}, expiry at {at}, read between {t2} and {t3}"
    );
    assert!(
        repl_offset(&mut c) > before,
        "an admitted call is replicated"
    );
}

#[test]
fn draining_then_denial_gives_sub_second_retry() {
    let s = Server::start();
    let mut c = s.conn();
    // 3 burst, 0.5 tokens/s: a token every 2000 ms. Four calls within
    // those 2000 ms: three admitted, then a denial.
    let (_, replies, took) = back_to_back(Duration::from_millis(2000), |key| {
        (0..4)
            .map(|_| consume(&mut c, key, "3", "0.5", "1"))
            .collect::<Vec<_>>()
    });
    for (r, left) in replies.iter().zip([2, 1, 0]) {
        assert_eq!(r[0..3], [1, left, 0], "{replies:?}");
    }
    let r = &replies[3];
    assert_eq!(r[0..2], [0, 0], "{replies:?}");
    // Less than `took` ms of refill since the first call: the token is
    // 2000 ms away less that, and the full bucket 6000 ms.
    assert!(
        r[2] <= 2000 && r[2] >= 2000 - took,
        "retry {r:?}, {took} ms"
    );
    assert!(
        r[3] <= 6000 && r[3] >= 6000 - took,
        "reset {r:?}, {took} ms"
    );

    // Fractional cost and rate: 10 at 4/s, cost 2.5 → retry in 625 ms steps.
    let r = consume(&mut c, "f", "10", "4", "2.5");
    assert_eq!(r, vec![1, 7, 0, 625]);
    assert_eq!(hgetall(&mut c, "f")["tokens"], "7.5");
}

/// Waits until the server's clock reads at least `us`: sleeps while it is
/// far, then asks TIME until it is there.
fn wait_for_server_us(c: &mut redis::Connection, us: i64) {
    loop {
        let left = us - server_time_us(c);
        if left <= 0 {
            return;
        }
        if left > 3_000 {
            std::thread::sleep(Duration::from_micros((left - 2_000) as u64));
        }
    }
}

/// `f`'s result and the server's clock just before and just after it: the
/// server ran `f`'s command at some instant in between.
fn bracketed<T>(
    c: &mut redis::Connection,
    f: impl FnOnce(&mut redis::Connection) -> T,
) -> (i64, T, i64) {
    let before = server_time_us(c);
    let out = f(c);
    (before, out, server_time_us(c))
}

/// A denied call's `retry_after_ms` is the earliest whole millisecond at
/// which the same request passes: checked on both sides against the
/// server's clock, read around the calls. 2 burst at 5/s, drained: one
/// token is there exactly 200 ms after the drain's `ts`. Each denial pins
/// the wait to within the time TIME took around it (about 0.1 ms), so ten
/// denials, a few ms apart, catch a wait one millisecond off.
#[test]
fn retry_after_is_when_the_request_passes() {
    let s = Server::start();
    let mut c = s.conn();
    for attempt in 0..5 {
        let key = format!("k{attempt}");
        assert_eq!(consume(&mut c, &key, "2", "5", "2")[..2], [1, 0]);
        let ts: i64 = hgetall(&mut c, &key)["ts"].parse().unwrap();
        let passes_at = ts + 200_000;
        let mut last = (0, 0, 0);
        for _ in 0..10 {
            let (before, r, after) = bracketed(&mut c, |c| consume(c, &key, "2", "5", "1"));
            assert_eq!(r[0], 0, "{r:?}");
            let wait = r[2];
            // The denial ran at some `now` in [before, after], and `now +
            // wait` ms is the first whole millisecond at or past
            // `passes_at`: not early for the latest `now`, not late for
            // the earliest.
            let at = format!("{r:?}, clock {before}..{after}, passes at {passes_at}");
            assert!(after + wait * 1000 >= passes_at, "early: {at}");
            assert!(before + (wait - 1) * 1000 < passes_at, "late: {at}");
            last = (before, wait, after);
            std::thread::sleep(Duration::from_millis(7));
        }
        let (before, wait, after) = last;
        // A retry a millisecond before the earliest `now + wait` fails.
        let early_by = before + (wait - 1) * 1000;
        wait_for_server_us(&mut c, early_by - 3_000);
        let (_, early, early_after) = bracketed(&mut c, |c| consume(c, &key, "2", "5", "1"));
        if early_after >= early_by {
            eprintln!(
                "{key}: the early retry came {} us late: again",
                early_after - early_by
            );
            continue;
        }
        assert_eq!(early[0], 0, "retried before the wait: {early:?}");
        // A retry once `wait` ms have passed since the latest `now` passes.
        wait_for_server_us(&mut c, after + wait * 1000);
        assert_eq!(consume(&mut c, &key, "2", "5", "1")[0], 1);
        return;
    }
    panic!("5 early retries in a row came too late");
}

#[test]
fn denied_and_zero_cost_calls_write_nothing() {
    let s = Server::start();
    let _replica = start_replica(&s, Config::default());
    let mut c = s.conn();
    consume(&mut c, "k", "2", "0.001", "2");
    let state = hgetall(&mut c, "k");
    let at = int(&mut c, "PEXPIRETIME", "k");
    let offset = repl_offset(&mut c);
    let dirty = info_field(&mut c, "persistence", "rdb_changes_since_last_save");

    for _ in 0..20 {
        assert_eq!(consume(&mut c, "k", "2", "0.001", "1")[0], 0);
        assert_eq!(consume(&mut c, "k", "2", "0.001", "0")[0], 1);
    }
    // Cost 0 on a missing key must not create it either.
    assert_eq!(consume(&mut c, "missing", "2", "1", "0"), vec![1, 2, 0, 0]);

    assert_eq!(hgetall(&mut c, "k"), state);
    assert_eq!(int(&mut c, "PEXPIRETIME", "k"), at);
    assert_eq!(int(&mut c, "EXISTS", "missing"), 0);
    assert_eq!(repl_offset(&mut c), offset, "nothing replicated");
    assert_eq!(
        info_field(&mut c, "persistence", "rdb_changes_since_last_save"),
        dirty,
        "nothing dirtied"
    );
}

#[test]
fn lowered_max_clamps_stored_tokens() {
    let s = Server::start();
    let mut c = s.conn();
    consume(&mut c, "k", "100", "1", "1"); // 99 left
    assert_eq!(consume(&mut c, "k", "10", "1", "1"), vec![1, 9, 0, 1000]);
    assert_eq!(hgetall(&mut c, "k")["tokens"], "9");
}

#[test]
fn bucket_that_expired_is_full_again() {
    let s = Server::start();
    let mut c = s.conn();
    // 2 tokens at 20/s: full again, and expired, 100 ms after being
    // drained (by the server's clock, read after the call).
    assert_eq!(consume(&mut c, "k", "2", "20", "2"), [1, 0, 0, 100]);
    let after = server_time_us(&mut c);
    wait_for_server_ms(&mut c, (after + 999) / 1000 + 100);
    assert_eq!(int(&mut c, "EXISTS", "k"), 0);
    assert_eq!(consume(&mut c, "k", "2", "20", "2")[0..2], [1, 0]);
}

#[test]
fn binary_keys_are_kept_byte_for_byte() {
    let s = Server::start();
    let mut c = s.conn();
    let keys: [&[u8]; 3] = [b"rl:\x00nul", b"rl:\xff\xfe not utf8", b""];
    for key in keys {
        let r: Vec<i64> = redis::cmd("TB.CONSUME")
            .arg(key)
            .arg(5)
            .arg(1)
            .query(&mut c)
            .unwrap();
        assert_eq!(r, vec![1, 4, 0, 1000]);
        assert_eq!(hgetall(&mut c, key)["tokens"], "4");
        let r: Vec<i64> = redis::cmd("TB.PEEK")
            .arg(key)
            .arg(5)
            .arg(1)
            .query(&mut c)
            .unwrap();
        assert_eq!(r[1], 4);
    }
    let all: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    assert_eq!(all.len(), 3);
}

#[test]
fn fractional_max_needs_an_explicit_cost() {
    let s = Server::start();
    let mut c = s.conn();
    // The default cost of 1 can never pass a bucket of 0.5.
    let mut cmd = redis::cmd("TB.CONSUME");
    cmd.arg("k").arg("0.5").arg("0.17");
    assert!(error_of(&mut c, &cmd).contains("cost must not exceed max"));
    assert_eq!(consume(&mut c, "k", "0.5", "0.17", "0.25")[0..3], [1, 0, 0]);
    assert_eq!(hgetall(&mut c, "k")["tokens"], "0.25");
}

#[test]
fn denied_calls_do_not_touch_watched_keys() {
    let s = Server::start();
    let mut watcher = s.conn();
    let mut other = s.conn();
    consume(&mut other, "k", "1", "0.001", "1");
    let adjust = |c: &mut redis::Connection, args: &[&str]| {
        let _: Vec<i64> = redis::cmd("TB.ADJUST").arg(args).query(c).unwrap();
    };
    // A denial (and a cost-0 check) changes nothing, so a WATCH survives it.
    assert!(exec_survives(&mut watcher, &["k"], || {
        assert_eq!(consume(&mut other, "k", "1", "0.001", "1")[0], 0);
    }));
    assert!(exec_survives(&mut watcher, &["k"], || {
        assert_eq!(consume(&mut other, "k", "1", "0.001", "0")[0], 1);
    }));
    // Refunding a missing (full) bucket changes nothing either.
    assert!(exec_survives(&mut watcher, &["absent"], || {
        adjust(&mut other, &["absent", "10", "1", "5"]);
    }));
    // An admitted call modifies the key, which aborts the transaction.
    adjust(&mut other, &["k", "1", "0.001", "1"]);
    assert!(!exec_survives(&mut watcher, &["k"], || {
        assert_eq!(consume(&mut other, "k", "1", "0.001", "0.5")[0], 1);
    }));
    // So does a refund that fills the bucket, which deletes the key.
    assert!(!exec_survives(&mut watcher, &["k"], || {
        adjust(&mut other, &["k", "1", "0.001", "1"]);
        assert_eq!(int(&mut other, "EXISTS", "k"), 0);
    }));
}

#[test]
fn writes_raise_the_keyspace_events_of_hset_and_pexpireat() {
    let s = Server::start();
    let mut c = s.conn();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "notify-keyspace-events", "KEA"])
        .query(&mut c)
        .unwrap();
    let mut sub = s.conn();
    let _: () = redis::cmd("PSUBSCRIBE")
        .arg("__keyevent@0__:*")
        .query(&mut sub)
        .unwrap();
    sub.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    consume(&mut c, "k", "2", "0.001", "1"); // writes
    consume(&mut c, "k", "2", "0.001", "5e-1"); // writes
    consume(&mut c, "k", "2", "0.001", "1"); // denied: no event
    let _: Vec<i64> = redis::cmd("TB.ADJUST")
        .arg(&["k", "2", "0.001", "9"])
        .query(&mut c)
        .unwrap(); // full: deleted
    let _: Vec<i64> = redis::cmd("TB.ADJUST")
        .arg(&["gone", "2", "0.001", "1"])
        .query(&mut c)
        .unwrap(); // full, absent: nothing
    let _: () = redis::cmd("SET")
        .arg(&["marker", "x"])
        .query(&mut c)
        .unwrap();
    let mut events = Vec::new();
    loop {
        let msg = sub.recv_response().unwrap();
        let redis::Value::Array(parts) = msg else {
            continue;
        };
        let channel: String = redis::from_redis_value(&parts[2]).unwrap();
        let key: String = redis::from_redis_value(&parts[3]).unwrap();
        let event = channel.rsplit(':').next().unwrap().to_string();
        if key == "marker" {
            break;
        }
        events.push(format!("{event} {key}"));
    }
    assert_eq!(
        events,
        ["hset k", "expire k", "hset k", "expire k", "del k"]
    );
}

/// The TTL is set from the limits of the call that wrote: after the rate is
/// lowered (or max raised), the key expires when the old bucket would have
/// been full, and the next call sees a full bucket under the new limits.
#[test]
fn lowering_the_rate_after_a_write_lets_the_key_expire_early() {
    let s = Server::start();
    let mut c = s.conn();
    // 5 of 10 tokens at 1000/s: full again, and expired, 5 ms later (by
    // the server's clock, read after the call).
    assert_eq!(consume(&mut c, "k", "10", "1000", "5"), [1, 5, 0, 5]);
    let after = server_time_us(&mut c);
    wait_for_server_ms(&mut c, (after + 999) / 1000 + 5);
    assert_eq!(int(&mut c, "EXISTS", "k"), 0);
    // At 1/s the bucket would still hold about 5: the new tier gets a full one.
    assert_eq!(consume(&mut c, "k", "10", "1", "1")[..2], [1, 9]);
}
