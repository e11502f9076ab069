//! Concurrency leases (TB.ACQUIRE, TB.RELEASE, TB.RENEW, TB.INFLIGHT) on a
//! real server: the replies and state docs/commands.md gives, expiry and
//! pruning, exact admission under concurrent clients, BUCKET clauses all or
//! nothing, keys of another kind, replicas and the AOF, Cluster, key specs
//! and ACL, OOM, and the INFO counters. (The clock steps are in clock.rs,
//! failed writes in effects.rs, the Lua fallback in the lua_* files.)

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};
use testkit::{
    cluster::Cluster, consume, error_of, hgetall, int, out_of_memory, repl_offset, server_time_us,
    snapshot, start_replica, tb_counter, wait_replicas, Config, Server,
};

fn ints(c: &mut redis::Connection, args: &[&str]) -> Vec<i64> {
    let mut cmd = redis::cmd(args[0]);
    cmd.arg(&args[1..]);
    cmd.query(c).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn acquire(c: &mut redis::Connection, rest: &[&str]) -> Vec<i64> {
    ints(c, &[&["TB.ACQUIRE"], rest].concat())
}

fn inflight(c: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("TB.INFLIGHT").arg(key).query(c).unwrap()
}

/// A hash field's value as `(expires_at_us, weight)`.
fn stored(c: &mut redis::Connection, key: &str, id: &str) -> (i64, i64) {
    let h = hgetall(c, key);
    let (at, w) = h[id].split_once(':').expect("expiry:weight");
    (at.parse().unwrap(), w.parse().unwrap())
}

/// Microseconds as whole ms, rounded up (how the key's expiry is set).
fn ceil_ms(us: i64) -> i64 {
    (us as u64).div_ceil(1000) as i64
}

fn dump(c: &mut redis::Connection, key: &str) -> redis::Value {
    redis::cmd("DUMP").arg(key).query(c).unwrap()
}

#[test]
fn acquire_renew_release_as_documented() {
    let s = Server::start();
    let mut c = s.conn();
    let t0 = server_time_us(&mut c);
    assert_eq!(
        acquire(&mut c, &["rl:s", "2", "30000", "req-1"]),
        [1, 1, 0, 30000]
    );
    let (at, weight) = stored(&mut c, "rl:s", "req-1");
    let t1 = server_time_us(&mut c);
    assert!(at >= t0 + 30_000_000 && at <= t1 + 30_000_000, "{at}");
    assert_eq!(weight, 1);
    // The key lives exactly as long as its latest lease (ms, rounded up).
    assert_eq!(int(&mut c, "PEXPIRETIME", "rl:s"), ceil_ms(at));

    // No room for 2 more: denied until req-1 expires; nothing written.
    let before = (dump(&mut c, "rl:s"), repl_offset(&mut c));
    let r = acquire(&mut c, &["rl:s", "2", "30000", "req-2", "2"]);
    let now = server_time_us(&mut c);
    assert_eq!(r[..2], [0, 1]);
    assert_eq!(r[3], 0);
    // The wait reaches req-1's expiry, and is not a millisecond more than
    // it needs from the time the call ran (at most `now`).
    assert!(
        r[2] * 1000 >= at - now && (r[2] - 1) * 1000 < at - t1 + 1000,
        "{r:?}"
    );
    assert_eq!((dump(&mut c, "rl:s"), repl_offset(&mut c)), before);

    assert_eq!(
        acquire(&mut c, &["rl:s", "2", "30000", "req-2"]),
        [1, 2, 0, 30000]
    );
    assert_eq!(inflight(&mut c, "rl:s"), 2);
    assert_eq!(inflight(&mut c, "rl:nothing"), 0);

    // Renew extends from now; never shortens.
    assert_eq!(
        ints(&mut c, &["TB.RENEW", "rl:s", "req-1", "60000"]),
        [1, 60000]
    );
    let (renewed, _) = stored(&mut c, "rl:s", "req-1");
    assert!(renewed > at);
    assert_eq!(int(&mut c, "PEXPIRETIME", "rl:s"), ceil_ms(renewed));
    let r = ints(&mut c, &["TB.RENEW", "rl:s", "req-1", "1000"]);
    assert_eq!(r[0], 1);
    assert!(r[1] > 59_000, "a renewal never shortens: {r:?}");
    assert_eq!(stored(&mut c, "rl:s", "req-1").0, renewed);

    // Release: the live weight left; twice is harmless and writes nothing.
    assert_eq!(ints(&mut c, &["TB.RELEASE", "rl:s", "req-1"]), [1, 1]);
    assert!(!hgetall(&mut c, "rl:s").contains_key("req-1"));
    // The TTL follows the latest lease left (req-2's).
    let (at2, _) = stored(&mut c, "rl:s", "req-2");
    assert_eq!(int(&mut c, "PEXPIRETIME", "rl:s"), ceil_ms(at2));
    let before = repl_offset(&mut c);
    assert_eq!(ints(&mut c, &["TB.RELEASE", "rl:s", "req-1"]), [0, 1]);
    assert_eq!(ints(&mut c, &["TB.RENEW", "rl:s", "req-1", "1000"]), [0, 0]);
    assert_eq!(repl_offset(&mut c), before, "nothing replicated");
    assert!(
        !hgetall(&mut c, "rl:s").contains_key("req-1"),
        "never recreated"
    );
    // The last release deletes the key.
    assert_eq!(ints(&mut c, &["TB.RELEASE", "rl:s", "req-2"]), [1, 0]);
    assert_eq!(int(&mut c, "EXISTS", "rl:s"), 0);
}

#[test]
fn a_retried_acquire_renews_and_counts_once() {
    let s = Server::start();
    let mut c = s.conn();
    assert_eq!(
        acquire(&mut c, &["k", "3", "10000", "a", "2"]),
        [1, 2, 0, 10000]
    );
    // The reply was lost; the client asks again: still 2 in use.
    assert_eq!(
        acquire(&mut c, &["k", "3", "20000", "a", "2"]),
        [1, 2, 0, 20000]
    );
    assert_eq!(inflight(&mut c, "k"), 2);
    assert_eq!(hgetall(&mut c, "k").len(), 1);
    // A new weight replaces the old one; it must fit beside the others.
    assert_eq!(acquire(&mut c, &["k", "3", "20000", "b"])[..2], [1, 3]);
    assert_eq!(acquire(&mut c, &["k", "3", "20000", "a", "3"])[..2], [0, 3]);
    assert_eq!(acquire(&mut c, &["k", "3", "20000", "a", "1"])[..2], [1, 2]);
    assert_eq!(stored(&mut c, "k", "a").1, 1);
}

#[test]
fn expired_leases_are_absent_and_pruned_by_the_next_write() {
    let s = Server::start();
    let mut c = s.conn();
    // The long lease keeps the key (its TTL) while the short one expires.
    acquire(&mut c, &["k", "3", "50", "short", "2"]);
    acquire(&mut c, &["k", "3", "60000", "long"]);
    let started = Instant::now();
    thread::sleep(Duration::from_millis(120));
    assert!(started.elapsed() >= Duration::from_millis(100));
    assert_eq!(inflight(&mut c, "k"), 1, "the short lease has expired");
    assert_eq!(hgetall(&mut c, "k").len(), 2, "a read prunes nothing");
    // Its holder learns it lost the slot, and nothing is written.
    let before = repl_offset(&mut c);
    assert_eq!(ints(&mut c, &["TB.RENEW", "k", "short", "60000"]), [0, 0]);
    assert_eq!(ints(&mut c, &["TB.RELEASE", "k", "short"]), [0, 1]);
    assert_eq!(repl_offset(&mut c), before);
    // A denial prunes nothing either.
    assert_eq!(
        acquire(&mut c, &["k", "3", "60000", "big", "3"])[..2],
        [0, 1]
    );
    assert_eq!(hgetall(&mut c, "k").len(), 2);
    // The next write does: the expired field goes with it.
    assert_eq!(
        acquire(&mut c, &["k", "3", "60000", "new", "2"])[..2],
        [1, 3]
    );
    let h = hgetall(&mut c, "k");
    assert_eq!(h.keys().cloned().collect::<Vec<_>>(), ["long", "new"]);
}

#[test]
fn exactly_limit_of_fifty_concurrent_clients_get_a_slot() {
    let s = Server::start();
    const CLIENTS: usize = 50;
    const LIMIT: i64 = 7;
    let gate = Arc::new(Barrier::new(CLIENTS));
    let handles: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let gate = Arc::clone(&gate);
            let mut c = s.conn();
            thread::spawn(move || {
                gate.wait();
                let id = format!("client-{i}");
                let r = acquire(&mut c, &["rl:streams", &LIMIT.to_string(), "60000", &id]);
                assert!(r[1] <= LIMIT, "{r:?}");
                r[0]
            })
        })
        .collect();
    let acquired: i64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(acquired, LIMIT);
    let mut c = s.conn();
    assert_eq!(inflight(&mut c, "rl:streams"), LIMIT);
    assert_eq!(hgetall(&mut c, "rl:streams").len(), LIMIT as usize);
}

#[test]
fn bucket_clauses_are_all_or_nothing_with_the_lease() {
    let s = Server::start();
    let mut c = s.conn();
    consume(&mut c, "b2", "5", "0.001", "4"); // b2 holds 1
    let snap = snapshot(&mut c);
    // The lease fits, but b2 can't pay 2: nothing at all is written.
    let r: redis::Value = redis::cmd("TB.ACQUIRE")
        .arg(&[
            "k", "4", "60000", "a", "BUCKET", "b1", "10", "1", "3", "bucket", "b2", "5", "0.001",
            "2",
        ])
        .query(&mut c)
        .unwrap();
    let r: Vec<redis::Value> = redis::from_redis_value(&r).unwrap();
    let head: Vec<i64> = r[..4]
        .iter()
        .map(|v| redis::from_redis_value(v).unwrap())
        .collect();
    let b1: Vec<i64> = redis::from_redis_value(&r[4]).unwrap();
    let b2: Vec<i64> = redis::from_redis_value(&r[5]).unwrap();
    assert_eq!(head[..2], [0, 0]);
    assert_eq!(b1[..2], [1, 10], "b1 alone could pay: not charged");
    assert_eq!(b2[..2], [0, 1]);
    assert_eq!(head[2], b2[2], "the top retry is the largest wait");
    assert!(head[2] > 900_000, "{head:?}");
    assert_eq!(snapshot(&mut c), snap, "nothing written");

    // All can pay: the lease is taken and both buckets charged.
    let r: redis::Value = redis::cmd("TB.ACQUIRE")
        .arg(&[
            "k", "4", "60000", "a", "3", "BUCKET", "b1", "10", "1", "3", "BUCKET", "b2", "5",
            "0.001", "1",
        ])
        .query(&mut c)
        .unwrap();
    let r: Vec<redis::Value> = redis::from_redis_value(&r).unwrap();
    assert_eq!(redis::from_redis_value::<i64>(&r[0]).unwrap(), 1);
    assert_eq!(redis::from_redis_value::<i64>(&r[1]).unwrap(), 3);
    assert_eq!(
        redis::from_redis_value::<Vec<i64>>(&r[4]).unwrap()[..2],
        [1, 7]
    );
    assert_eq!(
        redis::from_redis_value::<Vec<i64>>(&r[5]).unwrap()[..2],
        [1, 0]
    );
    assert_eq!(hgetall(&mut c, "b1")["tokens"], "7");

    // No room for the lease: the buckets are not charged.
    let snap = snapshot(&mut c);
    let r: redis::Value = redis::cmd("TB.ACQUIRE")
        .arg(&["k", "4", "60000", "b", "2", "BUCKET", "b1", "10", "1", "1"])
        .query(&mut c)
        .unwrap();
    let r: Vec<redis::Value> = redis::from_redis_value(&r).unwrap();
    assert_eq!(redis::from_redis_value::<i64>(&r[0]).unwrap(), 0);
    let retry: i64 = redis::from_redis_value(&r[2]).unwrap();
    assert!(
        retry > 59_000 && retry <= 60_000,
        "until a expires: {retry}"
    );
    assert_eq!(
        redis::from_redis_value::<Vec<i64>>(&r[4]).unwrap()[..2],
        [1, 7]
    );
    assert_eq!(snapshot(&mut c), snap);
}

#[test]
fn keys_of_another_kind_are_errors_and_left_alone() {
    let s = Server::start();
    let mut c = s.conn();
    consume(&mut c, "bucket", "10", "1", "1");
    acquire(&mut c, &["lease", "2", "60000", "a"]);
    let _: () = redis::cmd("SET").arg(&["str", "x"]).query(&mut c).unwrap();
    let _: () = redis::cmd("HSET")
        .arg(&["tokens-ts", "tokens", "1:1", "ts", "2:1"])
        .query(&mut c)
        .unwrap();
    let keys = ["bucket", "lease", "str", "tokens-ts"];
    let snap: Vec<_> = keys.iter().map(|k| dump(&mut c, k)).collect();
    let not_a_lease = "ERR key is not a lease key: each field must hold <expires_at_us>:<weight>";
    for (args, want) in [
        (&["TB.ACQUIRE", "bucket", "2", "1000", "x"][..], not_a_lease),
        (&["TB.RELEASE", "bucket", "x"][..], not_a_lease),
        (&["TB.RENEW", "bucket", "x", "10"][..], not_a_lease),
        (&["TB.INFLIGHT", "bucket"][..], not_a_lease),
        (
            &["TB.INFLIGHT", "str"][..],
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ),
        (
            &["TB.CONSUME", "lease", "10", "1"][..],
            "ERR key is not a token bucket: the hash must hold exactly the fields tokens and ts",
        ),
        (
            &["TB.CONSUME", "tokens-ts", "10", "1"][..],
            "ERR key is not a token bucket: field tokens is not a finite decimal number",
        ),
        (
            &["TB.ACQUIRE", "k", "2", "1000", "x", "BUCKET", "lease", "10", "1", "1"][..],
            "ERR key is not a token bucket: the hash must hold exactly the fields tokens and ts (group 1)",
        ),
        (
            &["TB.ACQUIRE", "lease", "2", "1000", "x", "BUCKET", "lease", "10", "1", "1"][..],
            "ERR the key of group 1 is the lease key",
        ),
    ] {
        let mut cmd = redis::cmd(args[0]);
        cmd.arg(&args[1..]);
        assert_eq!(error_of(&mut c, &cmd), want, "{args:?}");
    }
    let after: Vec<_> = keys.iter().map(|k| dump(&mut c, k)).collect();
    assert_eq!(after, snap, "every key left as it was");
    assert_eq!(int(&mut c, "EXISTS", "k"), 0);
}

#[test]
fn argument_errors_name_the_argument() {
    let s = Server::start();
    let mut c = s.conn();
    for (args, want) in [
        (
            &["TB.ACQUIRE", "k", "2", "1000"][..],
            "ERR wrong number of arguments for 'tb.acquire' command",
        ),
        (
            &["TB.ACQUIRE", "k", "two", "1000", "id"][..],
            "ERR limit must be an integer",
        ),
        (
            &["TB.ACQUIRE", "k", "0", "1000", "id"][..],
            "ERR limit must be >= 1 and <= 1000000",
        ),
        (
            &["TB.ACQUIRE", "k", "2", "86400001", "id"][..],
            "ERR lease_ms must be >= 1 and <= 86400000",
        ),
        (
            &["TB.ACQUIRE", "k", "2", "1000", ""][..],
            "ERR id must be 1 to 256 bytes",
        ),
        (
            &["TB.ACQUIRE", "k", "2", "1000", "id", "3"][..],
            "ERR weight must not exceed limit, it could never fit",
        ),
        (
            &["TB.ACQUIRE", "k", "2", "1000", "id", "0"][..],
            "ERR weight must be >= 1",
        ),
        (
            // A word where the weight or BUCKET may stand names both.
            &[
                "TB.ACQUIRE",
                "k",
                "2",
                "1000",
                "id",
                "BUCKETS",
                "x",
                "1",
                "1",
                "1",
            ][..],
            "ERR syntax error at argument 5: expected weight, BUCKET or QUOTA",
        ),
        (
            &[
                "TB.ACQUIRE",
                "k",
                "2",
                "1000",
                "id",
                "1",
                "BUCKIT",
                "b",
                "1",
                "1",
                "1",
            ][..],
            "ERR syntax error at argument 6: expected BUCKET or QUOTA",
        ),
        (
            &[
                "TB.ACQUIRE",
                "k",
                "2",
                "1000",
                "id",
                "BUCKET",
                "b",
                "1",
                "1",
                "2",
            ][..],
            "ERR cost must not exceed max, it could never pass (group 1)",
        ),
        (
            &["TB.RENEW", "k", "id", "-1"][..],
            "ERR lease_ms must be >= 1 and <= 86400000",
        ),
        (
            &["TB.RELEASE", "k"][..],
            "ERR wrong number of arguments for 'tb.release' command",
        ),
        (
            &["TB.INFLIGHT", "k", "x"][..],
            "ERR wrong number of arguments for 'tb.inflight' command",
        ),
    ] {
        let mut cmd = redis::cmd(args[0]);
        cmd.arg(&args[1..]);
        assert_eq!(error_of(&mut c, &cmd), want, "{args:?}");
    }
    let long = "x".repeat(257);
    assert_eq!(
        error_of(
            &mut c,
            redis::cmd("TB.ACQUIRE").arg(&["k", "2", "1000", &long])
        ),
        "ERR id must be 1 to 256 bytes"
    );
    assert_eq!(int(&mut c, "EXISTS", "k"), 0);
}

#[test]
fn replicas_and_the_aof_hold_the_primarys_leases() {
    let dir = std::env::temp_dir().join(format!("tb-leases-aof-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = Config::default().arg("appendonly", "yes");
    let mut s = Server::with(config.clone());
    let replica = start_replica(&s, Config::without_module());
    let mut c = s.conn();
    for i in 0..40 {
        let id = format!("id-{}", i % 13);
        let lease_ms = if i % 5 == 0 { "30" } else { "600000" };
        acquire(&mut c, &["rl:a", "8", lease_ms, &id]);
        if i % 3 == 0 {
            let _: Vec<i64> = redis::cmd("TB.RENEW")
                .arg(&["rl:a", &format!("id-{}", i % 7), "900000"])
                .query(&mut c)
                .unwrap();
        }
        if i % 4 == 0 {
            let _: Vec<i64> = redis::cmd("TB.RELEASE")
                .arg(&["rl:a", &format!("id-{}", i % 11)])
                .query(&mut c)
                .unwrap();
        }
        if i % 10 == 9 {
            thread::sleep(Duration::from_millis(40)); // let the short ones expire
        }
        let _: redis::Value = redis::cmd("TB.ACQUIRE")
            .arg(&[
                "rl:b", "3", "600000", &id, "BUCKET", "rl:bb", "50", "0.01", "1",
            ])
            .query(&mut c)
            .unwrap();
    }
    wait_replicas(&mut c, 1);
    let state = snapshot(&mut c);
    assert!(state.len() >= 2, "{state:?}");
    assert_eq!(
        snapshot(&mut replica.conn()),
        state,
        "the replica, without the module"
    );
    s.kill9();
    s.restart_with(config);
    assert_eq!(snapshot(&mut s.conn()), state, "restored from the AOF");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cluster_keys_share_a_slot() {
    let cluster = Cluster::start(3, 0, Config::default());
    let mut cc = cluster.client();
    let r: redis::Value = redis::cmd("TB.ACQUIRE")
        .arg(&[
            "{u42}:streams",
            "2",
            "60000",
            "a",
            "BUCKET",
            "{u42}:tokens",
            "100",
            "1",
            "10",
        ])
        .query(&mut cc)
        .unwrap();
    let r: Vec<redis::Value> = redis::from_redis_value(&r).unwrap();
    assert_eq!(redis::from_redis_value::<i64>(&r[0]).unwrap(), 1);
    let n: i64 = redis::cmd("TB.INFLIGHT")
        .arg("{u42}:streams")
        .query(&mut cc)
        .unwrap();
    assert_eq!(n, 1);
    // Keys in two slots, sent to the lease key's node: CROSSSLOT.
    let mut node = cluster
        .primaries()
        .into_iter()
        .map(|p| p.conn())
        .find_map(|mut c| {
            let r = redis::cmd("TB.INFLIGHT")
                .arg("{u7}:streams")
                .query::<i64>(&mut c);
            r.is_ok().then_some(c)
        })
        .expect("a node owns {u7}");
    let err = error_of(
        &mut node,
        redis::cmd("TB.ACQUIRE").arg(&[
            "{u7}:streams",
            "2",
            "60000",
            "a",
            "BUCKET",
            "{u8}:tokens",
            "100",
            "1",
            "1",
        ]),
    );
    assert!(err.starts_with("CROSSSLOT"), "{err}");
    // The same for a quota's key after a quota with OFFSET, which no key
    // spec can reach: the handler names it.
    let err = error_of(
        &mut node,
        redis::cmd("TB.ACQUIRE").arg(&[
            "{u7}:streams",
            "2",
            "60000",
            "a",
            "QUOTA",
            "{u7}:day",
            "100",
            "DAY",
            "1",
            "OFFSET",
            "60",
            "QUOTA",
            "{u8}:month",
            "100",
            "MONTH",
            "1",
        ]),
    );
    assert!(err.starts_with("CROSSSLOT"), "{err}");
}

#[test]
fn key_specs_cover_the_bucket_keys_and_inflight_only_reads() {
    let s = Server::start();
    let mut admin = s.conn();
    let keys: Vec<redis::Value> = redis::cmd("COMMAND")
        .arg(&[
            "GETKEYSANDFLAGS",
            "TB.ACQUIRE",
            "s",
            "2",
            "1000",
            "BUCKET",
            "2",
            "BUCKET",
            "b1",
            "1",
            "1",
            "1",
            "BUCKET",
            "b2",
            "1",
            "1",
            "1",
        ])
        .query(&mut admin)
        .unwrap();
    let names: Vec<String> = keys
        .iter()
        .map(|k| {
            redis::from_redis_value::<(String, Vec<String>)>(k)
                .unwrap()
                .0
        })
        .collect();
    assert_eq!(names, ["s", "b1", "b2"], "an id named BUCKET is not a key");
    // A quota's OFFSET makes its clause longer: the handler finds the keys
    // after it, each read and updated, as the key specs say of the others.
    let keys: Vec<(String, Vec<String>)> = redis::cmd("COMMAND")
        .arg(&[
            "GETKEYSANDFLAGS",
            "TB.ACQUIRE",
            "s",
            "2",
            "1000",
            "id",
            "QUOTA",
            "q1",
            "5",
            "DAY",
            "1",
            "OFFSET",
            "60",
            "BUCKET",
            "b1",
            "1",
            "1",
            "1",
            "QUOTA",
            "q2",
            "5",
            "MONTH",
            "1",
        ])
        .query(&mut admin)
        .unwrap();
    let update = ["RW", "access", "update"].map(String::from).to_vec();
    assert_eq!(
        keys,
        ["s", "q1", "b1", "q2"].map(|k| (k.to_string(), update.clone()))
    );
    let flags: (String, Vec<String>) = redis::from_redis_value(
        &redis::cmd("COMMAND")
            .arg(&["GETKEYSANDFLAGS", "TB.INFLIGHT", "s"])
            .query::<Vec<redis::Value>>(&mut admin)
            .unwrap()[0],
    )
    .unwrap();
    assert!(flags.1.iter().any(|f| f == "RO"), "{flags:?}");
    // A user that may only read rl:* keys: INFLIGHT, nothing else; a user
    // of rl:* can't reach another key through a BUCKET clause.
    let lease_commands = ["tb.acquire", "tb.release", "tb.renew", "tb.inflight"];
    let lease_user = |name: &str, keys: &str| s.conn_limited(name, keys, &lease_commands);
    let mut reader = lease_user("reader", "%R~rl:*");
    let mut writer = lease_user("writer", "~rl:*");
    assert_eq!(inflight(&mut reader, "rl:s"), 0);
    let err = error_of(
        &mut reader,
        redis::cmd("TB.ACQUIRE").arg(&["rl:s", "2", "1000", "a"]),
    );
    assert!(err.starts_with("NOPERM"), "{err}");
    let err = error_of(
        &mut writer,
        redis::cmd("TB.ACQUIRE")
            .arg(&["rl:s", "2", "1000", "a", "BUCKET", "secret", "1", "1", "1"]),
    );
    assert!(err.starts_with("NOPERM"), "{err}");
    assert_eq!(acquire(&mut writer, &["rl:s", "2", "1000", "a"])[0], 1);
    // The docs name the arguments; the BUCKET block carries its keyword.
    let docs = format!(
        "{:?}",
        redis::cmd("COMMAND")
            .arg(&["DOCS", "TB.ACQUIRE"])
            .query::<redis::Value>(&mut admin)
            .unwrap()
    );
    for word in [
        "lease_ms", "weight", "BUCKET", "bkey", "QUOTA", "qkey", "OFFSET",
    ] {
        assert!(docs.contains(word), "{word}: {docs}");
    }
}

#[test]
fn acquire_is_refused_under_oom_release_and_renew_are_not() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, &["k", "2", "60000", "a"]);
    out_of_memory(&mut c, 2 << 20);
    let err = error_of(
        &mut c,
        redis::cmd("TB.ACQUIRE").arg(&["k", "2", "60000", "b"]),
    );
    assert!(err.starts_with("OOM"), "{err}");
    assert_eq!(ints(&mut c, &["TB.RENEW", "k", "a", "90000"]), [1, 90000]);
    assert_eq!(ints(&mut c, &["TB.RELEASE", "k", "a"]), [1, 0]);
    assert_eq!(inflight(&mut c, "k"), 0);
}

#[test]
fn info_counts_lease_calls() {
    let s = Server::start();
    let mut c = s.conn();
    acquire(&mut c, &["k", "1", "60000", "a"]);
    acquire(&mut c, &["k", "1", "60000", "b"]);
    ints(&mut c, &["TB.RENEW", "k", "a", "1000"]);
    ints(&mut c, &["TB.RENEW", "k", "zz", "1000"]);
    ints(&mut c, &["TB.RELEASE", "k", "a"]);
    inflight(&mut c, "k");
    for (field, n) in [
        ("tb_acquired", 1),
        ("tb_busy", 1),
        ("tb_renewed", 1),
        ("tb_released", 1),
        ("tb_inflights", 1),
    ] {
        assert_eq!(tb_counter(&mut c, field), n, "{field}");
    }
}
