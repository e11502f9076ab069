//! Reservations pace a fleet: 20 callers in parallel, each calling with
//! `WAIT max_ms` on one bucket and sleeping the wait the reply gives, are
//! served at the bucket's rate and never above it, and none is denied
//! while the waits stay under max_ms. Through the module (TB.CONSUME) and
//! the Lua library (tb_consume), on a real clock.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testkit::{load_library, Server};

const CALLERS: usize = 20;
/// A burst of one token per caller, so the queue never reaches the floor.
const MAX: f64 = 20.0;
const RATE: f64 = 40.0;
const RUN: Duration = Duration::from_millis(2000);

/// When each admitted call may proceed (its send time plus its wait), and
/// the number of denials, from every caller.
fn fleet(s: &Server, call: fn(&str) -> redis::Cmd, key: &str) -> (Instant, Vec<Instant>, usize) {
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
                    let r: Vec<i64> = call(key).query(&mut c).expect("a reservation");
                    if r[0] == 1 {
                        let wait = Duration::from_millis(r[2] as u64);
                        proceeds.lock().expect("not poisoned").push(sent + wait);
                        std::thread::sleep(wait);
                    } else {
                        *denied.lock().expect("not poisoned") += 1;
                        std::thread::sleep(Duration::from_millis(r[2] as u64));
                    }
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
    let (start, proceeds, denied) = fleet(&s, call, "rl:provider:rpm");
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
    let (start, proceeds, denied) = fleet(&s, call, "rl:provider:rpm");
    check_pacing(start, &proceeds, denied, "library");
}
