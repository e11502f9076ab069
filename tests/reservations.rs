//! Reservations pace a fleet: 20 callers in parallel, each calling with
//! `WAIT max_ms` on one bucket and sleeping the wait the reply gives, are
//! served at the bucket's rate and never above it, and none is denied
//! while the waits stay under max_ms. Through the module (TB.CONSUME and
//! TB.CHARGE over two buckets, paced by the slower) and the Lua library
//! (tb_consume), on a real clock. A reservation given back with TB.ADJUST
//! leaves the next caller the wait it would have had without it, on a
//! frozen clock (Valkey under libfaketime), so the replies are exact.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testkit::{hgetall, ints, load_library, FakeClock, Server};

const CALLERS: usize = 20;
/// A burst of one token per caller, so the queue never reaches the floor.
const MAX: f64 = 20.0;
const RATE: f64 = 40.0;
const RUN: Duration = Duration::from_millis(2000);

/// `(allowed, wait)` of a reply.
type Reply = fn(&[redis::Value]) -> (bool, u64);

fn int_at(r: &[redis::Value], i: usize) -> i64 {
    redis::from_redis_value(&r[i]).unwrap_or_else(|e| panic!("element {i} of {r:?}: {e}"))
}

/// TB.CONSUME's and tb_consume's reply: `[allowed, remaining, retry, reset]`.
fn consume_reply(r: &[redis::Value]) -> (bool, u64) {
    (int_at(r, 0) == 1, int_at(r, 2) as u64)
}

/// When each admitted call may proceed (its send time plus its wait), and
/// the number of denials, from every caller.
fn fleet(
    s: &Server,
    call: fn(&str) -> redis::Cmd,
    reply: Reply,
    key: &str,
) -> (Instant, Vec<Instant>, usize) {
    let start = Instant::now();
    let proceeds = Arc::new(Mutex::new(Vec::new()));
    let denied = Arc::new(Mutex::new(0usize));
    std::thread::scope(|scope| {
        for _ in 0..CALLERS {
            let (proceeds, denied) = (Arc::clone(&proceeds), Arc::clone(&denied));
            let mut c = s.conn();
            scope.spawn(move || {
                while start.elapsed() < RUN {
                    let sent = Instant::now();
                    let r: Vec<redis::Value> = call(key).query(&mut c).expect("a reservation");
                    let (allowed, wait) = reply(&r);
                    let wait = Duration::from_millis(wait);
                    if allowed {
                        proceeds.lock().expect("not poisoned").push(sent + wait);
                    } else {
                        *denied.lock().expect("not poisoned") += 1;
                    }
                    std::thread::sleep(wait);
                }
            });
        }
    });
    let mut all = proceeds.lock().expect("not poisoned").clone();
    all.sort();
    let denied = *denied.lock().expect("not poisoned");
    (start, all, denied)
}

/// The k-th proceed (from 0) comes no earlier than the bucket allows:
/// `MAX` at once, then one per `1 / RATE` s, within one token; and the
/// fleet keeps pace (at least 80% of the rate over the run).
fn check_pacing(start: Instant, proceeds: &[Instant], denied: usize, form: &str) {
    assert_eq!(
        denied, 0,
        "{form}: a call was denied while its wait was under max_ms"
    );
    let token = Duration::from_secs_f64(1.0 / RATE);
    for (k, p) in proceeds.iter().enumerate() {
        let earliest = (k as f64 - MAX - 1.0).max(0.0) / RATE;
        assert!(
            p.duration_since(start) + token / 4 >= Duration::from_secs_f64(earliest),
            "{form}: call {k} proceeds at {:?}, before the rate allows ({earliest} s)",
            p.duration_since(start)
        );
    }
    let span = proceeds
        .last()
        .map_or(0.0, |p| p.duration_since(start).as_secs_f64());
    let paced = (proceeds.len() as f64 - MAX) / span;
    assert!(
        (0.8 * RATE..=RATE * 1.05).contains(&paced),
        "{form}: {} proceeds over {span:.3} s: {paced:.1}/s against a rate of {RATE}",
        proceeds.len()
    );
}

#[test]
fn a_fleet_with_waits_is_paced_at_the_rate_through_the_module() {
    let s = Server::start();
    let call = |key: &str| {
        let mut cmd = redis::cmd("TB.CONSUME");
        cmd.arg(&[key, "20", "40", "1", "WAIT", "5000"]);
        cmd
    };
    let (start, proceeds, denied) = fleet(&s, call, consume_reply, "rl:provider:rpm");
    check_pacing(start, &proceeds, denied, "module");
}

#[test]
fn a_fleet_with_waits_is_paced_at_the_rate_through_the_library() {
    let s = Server::start();
    load_library(&mut s.conn());
    let call = |key: &str| {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(&["tb_consume", "1", key, "20", "40", "1", "WAIT", "5000"]);
        cmd
    };
    let (start, proceeds, denied) = fleet(&s, call, consume_reply, "rl:provider:rpm");
    check_pacing(start, &proceeds, denied, "library");
}

/// TB.CHARGE's WAIT over two buckets: the first refills at twice the rate
/// of the second, so the second's waits are the call's, and the fleet is
/// paced at the slower rate (at the faster one the pace check fails).
#[test]
fn a_fleet_charging_two_buckets_is_paced_at_the_slower_rate() {
    let s = Server::start();
    let call = |key: &str| {
        let (fast, slow) = (format!("{key}:fast"), format!("{key}:slow"));
        let mut cmd = redis::cmd("TB.CHARGE");
        cmd.arg(&["2", &fast, &slow, "WAIT", "5000"])
            .arg(&["BUCKET", "20", "80", "1", "BUCKET", "20", "40", "1"]);
        cmd
    };
    // `[allowed, retry_after_ms, fast, slow]`: the retry is the longest wait.
    let reply = |r: &[redis::Value]| (int_at(r, 0) == 1, int_at(r, 1) as u64);
    let (start, proceeds, denied) = fleet(&s, call, reply, "rl:{provider}");
    check_pacing(start, &proceeds, denied, "charge");
}

/// A caller that gives its reservation back with TB.ADJUST, as the docs
/// say, leaves the queue as if it had never reserved: the next caller's
/// reply, and the hash, are those of a bucket with the same history
/// without it. On a frozen clock, moved by hand between the calls.
#[test]
fn a_reservation_given_back_leaves_the_next_wait_as_without_it() {
    const T0: i64 = 1_893_456_000_000_000; // 2030-01-01T00:00:00Z in µs
    let clock = FakeClock::new(T0);
    let s = Server::with(clock.config());
    let mut c = s.conn();
    for key in ["rl:cancelled", "rl:never"] {
        assert_eq!(
            ints(&mut c, &["TB.CONSUME", key, "10", "1", "10"]),
            [1, 0, 0, 10_000]
        );
    }
    // Into debt: 3 tokens at 1/s, a 3 s wait.
    assert_eq!(
        ints(
            &mut c,
            &["TB.CONSUME", "rl:cancelled", "10", "1", "3", "WAIT", "5000"]
        ),
        [1, -3, 3000, 13_000]
    );
    clock.set(T0 + 500_000);
    // Given back half a second later: the refill since is kept.
    assert_eq!(
        ints(&mut c, &["TB.ADJUST", "rl:cancelled", "10", "1", "3"]),
        [1, 0, 500, 9500]
    );
    clock.set(T0 + 700_000);
    let next: Vec<Vec<i64>> = ["rl:cancelled", "rl:never"]
        .iter()
        .map(|key| ints(&mut c, &["TB.CONSUME", key, "10", "1", "2", "WAIT", "5000"]))
        .collect();
    // 0.7 tokens refilled: 1.3 s to wait for the other 1.3, not 4.3 s.
    assert_eq!(next[0], [1, -2, 1300, 11_300]);
    assert_eq!(next[0], next[1]);
    assert_eq!(hgetall(&mut c, "rl:cancelled"), hgetall(&mut c, "rl:never"));
    // And the caller after that waits behind the one that stayed only.
    clock.set(T0 + 900_000);
    let after: Vec<Vec<i64>> = ["rl:cancelled", "rl:never"]
        .iter()
        .map(|key| ints(&mut c, &["TB.CONSUME", key, "10", "1", "1", "WAIT", "5000"]))
        .collect();
    assert_eq!(after[0], [1, -3, 2100, 12_100]);
    assert_eq!(after[0], after[1]);

    // TB.CHARGE's reservation on a bucket clause is given back the same way.
    let charge = |c: &mut redis::Connection, key: &str, cost: &str| -> (i64, i64, Vec<i64>) {
        redis::cmd("TB.CHARGE")
            .arg(&["1", key, "WAIT", "5000", "BUCKET", "10", "1", cost])
            .query(c)
            .unwrap_or_else(|e| panic!("TB.CHARGE {key}: {e}"))
    };
    clock.set(T0 + 100_000_000);
    for key in ["rl:c:cancelled", "rl:c:never"] {
        assert_eq!(charge(&mut c, key, "10"), (1, 0, vec![1, 0, 0, 10_000]));
    }
    assert_eq!(
        charge(&mut c, "rl:c:cancelled", "4"),
        (1, 4000, vec![1, -4, 4000, 14_000])
    );
    assert_eq!(
        ints(&mut c, &["TB.ADJUST", "rl:c:cancelled", "10", "1", "4"]),
        [1, 0, 1000, 10_000]
    );
    let a = charge(&mut c, "rl:c:cancelled", "2");
    assert_eq!(a, (1, 2000, vec![1, -2, 2000, 12_000]));
    assert_eq!(a, charge(&mut c, "rl:c:never", "2"));
    assert_eq!(
        hgetall(&mut c, "rl:c:cancelled"),
        hgetall(&mut c, "rl:c:never")
    );
}
