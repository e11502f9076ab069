//! The server clock drives refill: steps back mint nothing, steps forward
//! refill up to max and no further. Runs on Valkey under libfaketime.

mod common;
use common::*;

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

    clock.set(T0 - 3_600_000_000); // back an hour: nothing minted
    assert_eq!(peek(&mut c, "k", "10", "2", "1"), vec![0, 0, 500, 5000]);
    assert_eq!(consume(&mut c, "k", "10", "2", "1")[0], 0);

    clock.set(T0 + 3_600_000_000); // forward an hour: full, not more
    assert_eq!(peek(&mut c, "k", "10", "2", "1"), vec![1, 10, 0, 0]);
}
