//! The server clock drives refill: steps back mint nothing (and the reply
//! times count the wait until the stored ts), steps forward refill up to
//! max and no further. Runs on Valkey under libfaketime.

use testkit::{
    consume, hgetall, int, peek, pypi_server, skewed_clock, snapshot, start_replica, wait_replicas,
    Config, FakeClock, Pypi, Server,
};

const T0: i64 = 1_893_456_000_000_000; // 2030-01-01T00:00:00Z in µs

#[test]
fn refill_follows_the_fake_clock_exactly() {
    let clock = FakeClock::new(T0);
    let s = Server::with(clock.config());
    let mut c = s.conn();
    assert_eq!(consume(&mut c, "k", "10", "2", "10"), vec![1, 0, 0, 5000]);
    assert_eq!(hgetall(&mut c, "k")["ts"], T0.to_string());
    assert_eq!(int(&mut c, "PEXPIRETIME", "k"), T0 / 1000 + 5000);

    clock.set(T0 + 1_250_000); // 2.5 tokens
    assert_eq!(peek(&mut c, "k", "10", "2", "3"), vec![0, 2, 250, 3750]);

    // Back an hour: nothing minted, and the times count the hour until
    // the clock is back at the stored ts.
    clock.set(T0 - 3_600_000_000);
    assert_eq!(
        peek(&mut c, "k", "10", "2", "1"),
        vec![0, 0, 3_600_500, 3_605_000]
    );
    assert_eq!(
        consume(&mut c, "k", "10", "2", "1"),
        vec![0, 0, 3_600_500, 3_605_000]
    );
    clock.set(T0 - 3_600_000_000 + 3_600_499_000);
    assert_eq!(consume(&mut c, "k", "10", "2", "1")[0..3], [0, 0, 1]);
    clock.set(T0 - 3_600_000_000 + 3_600_500_000);
    assert_eq!(consume(&mut c, "k", "10", "2", "1")[0..2], [1, 0]);

    clock.set(T0 + 3_600_000_000); // forward an hour: full, not more
    assert_eq!(peek(&mut c, "k", "10", "2", "1"), vec![1, 10, 0, 0]);
}

#[test]
fn failover_to_a_replica_whose_clock_is_behind_refills_nothing_early() {
    let primary = Server::with(Config {
        bin: pypi_server(Pypi::Valkey91),
        ..Config::default()
    });
    // The replica's clock runs an hour behind the primary's.
    let replica = start_replica(&primary, skewed_clock("-3600"));
    let mut p = primary.conn();
    let before_write = std::time::Instant::now();
    assert_eq!(consume(&mut p, "k", "10", "1", "10"), vec![1, 0, 0, 10_000]);
    let after_write = std::time::Instant::now();
    wait_replicas(&mut p, 1);
    let state = snapshot(&mut p);

    let mut r = replica.conn();
    let _: String = redis::cmd("REPLICAOF")
        .arg(&["NO", "ONE"])
        .query(&mut r)
        .unwrap();
    assert_eq!(
        snapshot(&mut r),
        state,
        "tokens, ts and expire time carried over"
    );
    std::thread::sleep(std::time::Duration::from_millis(1200));
    // 1.2 s later the old primary would hold 1.2 tokens. On the new one the
    // stored ts is an hour in its future: no time has elapsed, no refill,
    // and the retry time counts what is left of that hour, then 1 s.
    let before_call = std::time::Instant::now();
    let d = consume(&mut r, "k", "10", "1", "1");
    let after_call = std::time::Instant::now();
    assert_eq!(d[0..2], [0, 0]);
    let ms = |a: std::time::Instant, b: std::time::Instant| (b - a).as_millis() as i64;
    let (least, most) = (ms(after_write, before_call), ms(before_write, after_call));
    assert!(
        d[2] >= 3_601_000 - most - 1 && d[2] <= 3_601_000 - least + 1,
        "{d:?}, {least}..{most} ms after the write"
    );
    assert_eq!(d[3] - d[2], 9_000, "{d:?}");
    assert_eq!(snapshot(&mut r), state, "the denial wrote nothing");
}

/// Leases expire at absolute times on the server clock: a step back never
/// frees a slot early (the wait counts the step), a step forward expires
/// leases early, as it does Redis's own TTLs.
#[test]
fn a_clock_step_back_never_frees_a_lease_early() {
    let clock = FakeClock::new(T0);
    let s = Server::with(clock.config());
    let mut c = s.conn();
    let lease = |c: &mut redis::Connection, args: &[&str]| -> Vec<i64> {
        redis::cmd(args[0]).arg(&args[1..]).query(c).unwrap()
    };
    let inflight =
        |c: &mut redis::Connection| -> i64 { redis::cmd("TB.INFLIGHT").arg("k").query(c).unwrap() };
    assert_eq!(
        lease(&mut c, &["TB.ACQUIRE", "k", "1", "10000", "a"]),
        [1, 1, 0, 10000]
    );
    assert_eq!(hgetall(&mut c, "k")["a"], format!("{}:1", T0 + 10_000_000));

    clock.set(T0 - 3_600_000_000); // back an hour
    assert_eq!(inflight(&mut c), 1);
    assert_eq!(
        lease(&mut c, &["TB.ACQUIRE", "k", "1", "10000", "b"]),
        [0, 1, 3_610_000, 0],
        "b waits the hour back, then a's 10 s"
    );
    // A renewal keeps the later expiry.
    assert_eq!(
        lease(&mut c, &["TB.RENEW", "k", "a", "10000"]),
        [1, 3_610_000]
    );

    clock.set(T0 + 9_999_000);
    assert_eq!(
        lease(&mut c, &["TB.ACQUIRE", "k", "1", "10000", "b"]),
        [0, 1, 1, 0]
    );
    clock.set(T0 + 10_000_000);
    assert_eq!(inflight(&mut c), 0);
    assert_eq!(
        lease(&mut c, &["TB.ACQUIRE", "k", "1", "60000", "b"]),
        [1, 1, 0, 60000]
    );

    clock.set(T0 + 10_000_000 + 3_600_000_000); // forward an hour
    assert_eq!(inflight(&mut c), 0, "expired early, as TTLs are");
    assert_eq!(lease(&mut c, &["TB.RENEW", "k", "b", "60000"]), [0, 0]);
}
