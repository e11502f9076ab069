//! 16 clients hammer one hot key for 2 s: the bucket admits max + rate*t,
//! within a few percent, and never more.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use testkit::{consume, Server};

#[test]
fn hot_key_admits_exactly_the_budget() {
    let s = Server::start();
    let (max, rate) = (100.0, 400.0);
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
                let (mut admitted, mut calls) = (0u64, 0u64);
                while start.elapsed() < run_for {
                    admitted += consume(&mut c, "hot", "100", "400", "1")[0] as u64;
                    calls += 1;
                }
                (admitted, calls)
            })
        })
        .collect();
    // Taken before the barrier opens, so no call can start before it.
    let t0 = Instant::now();
    barrier.wait();
    let results: Vec<(u64, u64)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let elapsed = t0.elapsed().as_secs_f64();
    let admitted: u64 = results.iter().map(|r| r.0).sum();
    let calls: u64 = results.iter().map(|r| r.1).sum();

    // Every server-side call happened inside [t0, t0 + elapsed].
    let ceiling = max + rate * elapsed;
    assert!(
        calls > 2 * admitted,
        "the key must be contended ({calls} calls)"
    );
    assert!(
        admitted as f64 <= ceiling,
        "admitted {admitted} > {ceiling}"
    );
    let expected = max + rate * run_for.as_secs_f64();
    assert!(
        admitted as f64 >= 0.97 * expected,
        "admitted {admitted}, expected about {expected}"
    );
}
