//! Writes replicate as effects (HSET, HDEL, PEXPIREAT, DEL), and an effect that
//! can't be carried out never goes unnoticed:
//!
//! * a server whose redis.conf renamed or disabled one of those commands
//!   refuses the module, with a log line that says why;
//! * a step of a write that fails (forced with TB.FAULT in a test-hooks
//!   build) becomes the call's error reply, counts in `tb_errors`, and
//!   leaves the replica exactly like its primary.

use testkit::{
    consume, error_of, module_path, snapshot, start_fails, start_replica, tb_counter,
    test_hooks_config, wait_replicas, Config, Server,
};

const REFUSED: &str = "command (renamed or disabled by rename-command?); the module replicates every write as HSET, HDEL, PEXPIREAT and DEL, so it will not load";

#[test]
fn a_server_without_an_effect_command_refuses_the_module() {
    for name in ["HSET", "HDEL", "PEXPIREAT", "DEL"] {
        // `--rename-command NAME ""` disables it.
        let log = start_fails(Config::default().arg("rename-command", &format!("{name} ")));
        assert!(
            log.contains(&format!("this server has no {name} {REFUSED}")),
            "{name}:\n{log}"
        );
        // Renamed to another name is the same: effects go out by name.
        let log =
            start_fails(Config::default().arg("rename-command", &format!("{name} renamed-{name}")));
        assert!(
            log.contains(&format!("this server has no {name} ")),
            "{log}"
        );
    }
    // At runtime too: MODULE LOAD fails, the server carries on.
    let s = Server::with(
        Config::without_module()
            .arg("rename-command", "PEXPIREAT ")
            .arg("enable-module-command", "yes"),
    );
    let mut c = s.conn();
    let err = error_of(
        &mut c,
        redis::cmd("MODULE")
            .arg("LOAD")
            .arg(module_path().to_string_lossy().as_ref()),
    );
    assert!(err.contains("Error loading"), "{err}");
    assert!(s
        .log()
        .contains(&format!("this server has no PEXPIREAT {REFUSED}")));
    let err = error_of(&mut c, redis::cmd("TB.CONSUME").arg(&["k", "10", "1"]));
    assert!(err.contains("unknown command"), "{err}");
}

fn errors(c: &mut redis::Connection) -> u64 {
    tb_counter(c, "tb_errors")
}

fn fault(c: &mut redis::Connection, step: &str) {
    let armed: i64 = redis::cmd("TB.FAULT").arg(step).query(c).expect("TB.FAULT");
    assert_eq!(armed, 1);
}

const FAILED: &str = "ERR tb could not write the key:";

/// Arms `step`, sends `args` (command first), and checks the call fails
/// naming `failed` and is the `count`th error the module counted.
fn fails_at(c: &mut redis::Connection, step: &str, args: &[&str], failed: &str, count: u64) {
    fault(c, step);
    let err = error_of(c, redis::cmd(args[0]).arg(&args[1..]));
    assert!(
        err.starts_with(&format!("{FAILED} {failed} failed")),
        "{step}: {err}"
    );
    assert_eq!(errors(c), count, "{step}");
}

#[test]
fn a_failed_write_is_an_error_counted_and_the_same_on_the_replica() {
    let primary = Server::with(test_hooks_config());
    let replica = start_replica(&primary, Config::without_module());
    let (mut p, mut r) = (primary.conn(), replica.conn());
    assert_eq!(
        consume(&mut p, "k", "10", "0.001", "4"),
        [1, 6, 0, 4_000_000]
    );
    let written = snapshot(&mut p);

    // HashSet fails: nothing changes anywhere.
    let consume_k = ["TB.CONSUME", "k", "10", "0.001", "1"];
    fails_at(&mut p, "hashset", &consume_k, "HSET", 1);
    assert_eq!(snapshot(&mut p), written);
    wait_replicas(&mut p, 1);
    assert_eq!(snapshot(&mut r), written);

    // The expire fails after the hash was written: the replica gets the
    // HSET alone, so both keep the old expire time.
    fails_at(&mut p, "expire", &consume_k, "PEXPIREAT", 2);
    let now = snapshot(&mut p);
    let (hash, expire_at) = &now[b"k".as_slice()];
    assert_eq!(
        hash["tokens"].parse::<f64>().unwrap().floor(),
        5.0,
        "{hash:?}"
    );
    assert_eq!(
        *expire_at,
        written[b"k".as_slice()].1,
        "the old expire time"
    );
    wait_replicas(&mut p, 1);
    assert_eq!(snapshot(&mut r), now);

    // A refund to full deletes the key; the delete fails: nothing changes.
    let refund = ["TB.ADJUST", "k", "10", "0.001", "100"];
    fails_at(&mut p, "delete", &refund, "DEL", 3);
    assert_eq!(snapshot(&mut p), now);
    wait_replicas(&mut p, 1);
    assert_eq!(snapshot(&mut r), now);

    // Replicate fails only for a command the server lacks, which refuses
    // the load; forced here, it is still reported, counted and logged.
    let fresh = ["TB.CONSUME", "fresh", "10", "0.001", "1"];
    fails_at(&mut p, "replicate", &fresh, "replicate HSET", 4);
    assert!(
        primary
            .log()
            .contains("tb: a write failed at replicate HSET"),
        "{}",
        primary.log()
    );

    // Every step fires once: the next calls write and replicate as usual.
    assert_eq!(consume(&mut p, "k", "10", "0.001", "1")[0], 1);
    assert_eq!(
        consume(&mut p, "other", "10", "0.001", "1"),
        [1, 9, 0, 1_000_000]
    );
    wait_replicas(&mut p, 1);
    let (ps, rs) = (snapshot(&mut p), snapshot(&mut r));
    for key in [b"k".as_slice(), b"other"] {
        assert_eq!(ps[key], rs[key], "{key:?}");
    }
    assert_eq!(errors(&mut p), 4);
}

#[test]
fn a_failed_write_in_mconsume_is_an_error_and_counted() {
    let s = Server::with(test_hooks_config());
    let mut c = s.conn();
    let before = snapshot(&mut c);
    let mconsume = ["TB.MCONSUME", "a", "10", "1", "1", "b", "10", "1", "1"];
    fails_at(&mut c, "hashset", &mconsume, "HSET", 1);
    // The first group's write failed, so the call stopped before the second.
    assert_eq!(snapshot(&mut c), before);
}

#[test]
fn a_failed_lease_write_is_an_error_counted_and_the_same_on_the_replica() {
    let primary = Server::with(test_hooks_config());
    let replica = start_replica(&primary, Config::without_module());
    let (mut p, mut r) = (primary.conn(), replica.conn());
    let acquire = |c: &mut redis::Connection, args: &[&str]| -> Vec<i64> {
        redis::cmd("TB.ACQUIRE").arg(args).query(c).unwrap()
    };
    acquire(&mut p, &["k", "3", "600000", "a"]);
    acquire(&mut p, &["k", "3", "20", "short"]);
    std::thread::sleep(std::time::Duration::from_millis(60));
    let same = |p: &mut redis::Connection, r: &mut redis::Connection| {
        wait_replicas(p, 1);
        assert_eq!(snapshot(r), snapshot(p));
    };
    let written = snapshot(&mut p);

    // An acquire sets its lease first (an EVAL acquire under maxmemory is
    // then refused before it writes anything): that failing changes
    // nothing anywhere.
    let take_b = ["TB.ACQUIRE", "k", "3", "600000", "b"];
    fails_at(&mut p, "hashset", &take_b, "HSET", 1);
    assert_eq!(snapshot(&mut p), written);
    same(&mut p, &mut r);
    // Pruning the expired lease fails after the HSET: both sides hold b,
    // and the expired lease still.
    fails_at(&mut p, "hdel", &take_b, "HDEL", 2);
    let taken = snapshot(&mut p);
    let fields: Vec<&String> = taken[b"k".as_slice()].0.keys().collect();
    assert_eq!(fields, ["a", "b", "short"]);
    assert_eq!(taken[b"k".as_slice()].1, written[b"k".as_slice()].1);
    same(&mut p, &mut r);
    // A renewal (which runs under maxmemory) starts with its expire: that
    // failing changes nothing.
    let renew = ["TB.RENEW", "k", "a", "900000"];
    fails_at(&mut p, "expire", &renew, "PEXPIREAT", 3);
    assert_eq!(snapshot(&mut p), taken);
    same(&mut p, &mut r);
    // Its HSET fails after the expire and the prune: the key expires
    // later and lost the expired lease on both sides, a's lease is as it
    // was.
    fails_at(&mut p, "hashset", &renew, "HSET", 4);
    let pruned = snapshot(&mut p);
    let fields: Vec<&String> = pruned[b"k".as_slice()].0.keys().collect();
    assert_eq!(fields, ["a", "b"]);
    assert_eq!(
        pruned[b"k".as_slice()].0["a"],
        taken[b"k".as_slice()].0["a"]
    );
    assert!(pruned[b"k".as_slice()].1 > taken[b"k".as_slice()].1);
    same(&mut p, &mut r);
    // The last release deletes the key; the delete fails: nothing changes.
    let released: Vec<i64> = redis::cmd("TB.RELEASE")
        .arg(&["k", "b"])
        .query(&mut p)
        .unwrap();
    assert_eq!(released, [1, 1]);
    let one_left = snapshot(&mut p);
    fails_at(&mut p, "delete", &["TB.RELEASE", "k", "a"], "DEL", 5);
    assert_eq!(snapshot(&mut p), one_left);
    same(&mut p, &mut r);
    // Replicate fails only for a command the server lacks (which refuses
    // the load); forced, it is still reported, counted and logged.
    fails_at(&mut p, "replicate", &take_b, "replicate HSET", 6);
    assert!(primary
        .log()
        .contains("tb: a lease write failed at replicate HSET"));
    // Every step fires once: the next call writes and replicates.
    assert_eq!(acquire(&mut p, &["other", "3", "600000", "c"])[0], 1);
    wait_replicas(&mut p, 1);
    assert_eq!(
        snapshot(&mut p)[b"other".as_slice()],
        snapshot(&mut r)[b"other".as_slice()]
    );
}
