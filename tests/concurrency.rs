//! 16 clients hammer one hot key for 2 s. Every token is accounted for by
//! the server's own clock: the tokens charged plus what the bucket holds at
//! the end are exactly max plus the refill from the first write's `ts` to
//! the last one's. Nothing is minted, and nothing is lost: the bucket is
//! drained first and takes 2,500 s to fill again, so the cap at `max`
//! never forfeits refill during the run, however the machine schedules
//! the clients. Nor is more ever admitted than max + rate * t, with t
//! measured here.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use testkit::{consume, Server};

const MAX: f64 = 1_000_000.0;
const RATE: f64 = 400.0;
/// From empty to full: far longer than the run can take.
const FILL: Duration = Duration::from_secs(2_500);

/// What one client saw.
#[derive(Default)]
struct Seen {
    calls: u64,
    admitted: u64,
}

/// The bucket's `tokens` and `ts`, `None` once the key is gone.
fn read_bucket(c: &mut redis::Connection) -> Option<(f64, i64)> {
    let hash: std::collections::BTreeMap<String, String> =
        redis::cmd("HGETALL").arg("hot").query(c).expect("HGETALL");
    (!hash.is_empty()).then(|| {
        (
            hash["tokens"].parse().expect("tokens"),
            hash["ts"].parse().expect("ts"),
        )
    })
}

#[test]
fn hot_key_admits_exactly_the_budget() {
    let s = Server::start();
    let clients = 16;
    let barrier = Arc::new(Barrier::new(clients + 1));
    let run_for = Duration::from_secs(2);
    let handles: Vec<_> = (0..clients)
        .map(|_| {
            let mut c = s.conn();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                let start = Instant::now();
                let mut seen = Seen::default();
                while start.elapsed() < run_for {
                    let r = consume(&mut c, "hot", "1000000", "400", "1");
                    seen.calls += 1;
                    seen.admitted += u64::from(r[0] == 1);
                }
                seen
            })
        })
        .collect();
    let mut c = s.conn();
    // Taken before the first call, so no call can start before it.
    let t0 = Instant::now();
    // The first write drains the bucket: the burst of max, and the ts the
    // accounting starts from. From empty, it is full again only after
    // max / rate = 2,500 s.
    assert_eq!(
        consume(&mut c, "hot", "1000000", "400", "1000000"),
        [1, 0, 0, FILL.as_millis() as i64]
    );
    let (_, ts_first) = read_bucket(&mut c).expect("the bucket after its first write");
    barrier.wait();
    let seen: Vec<Seen> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let elapsed = t0.elapsed().as_secs_f64();
    let last = read_bucket(&mut c);
    let admitted: u64 = seen.iter().map(|s| s.admitted).sum();
    let calls: u64 = seen.iter().map(|s| s.calls).sum();
    // Tokens charged: the drain, then 1 per admitted call.
    let charged = MAX + admitted as f64;

    assert!(
        calls > 2 * admitted,
        "the key must be contended ({calls} calls)"
    );
    // Every server-side call happened inside [t0, t0 + elapsed].
    let ceiling = MAX + RATE * elapsed;
    assert!(charged <= ceiling, "charged {charged} > {ceiling}");

    // The server's account. `held` at `ts_last`: the last write's. The
    // bucket cannot have filled (and expired) within the run.
    assert!(t0.elapsed() < FILL, "the run outlasted the fill time");
    let (held, ts_last) = last.expect("the bucket, still short of full");
    let budget = MAX + RATE * (ts_last - ts_first) as f64 / 1e6;
    let accounted = charged + held;
    eprintln!(
        "{calls} calls, {admitted} admitted in {elapsed:.3} s; charged {charged} + held {held} \
         = {accounted}, budget {budget}"
    );
    assert!(
        (accounted - budget).abs() <= 1e-6,
        "minted or lost: charged {charged} + held {held} != {budget}"
    );
}
