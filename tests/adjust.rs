//! TB.ADJUST: refunds capped at max, debt floored at -max, and how CONSUME
//! behaves in debt.

use std::time::Duration;
use testkit::{
    back_to_back, bucket_delete, bucket_write, consume, hgetall, info_field, int, peek, snapshot,
    ReplicationStream, Server,
};

fn adjust(c: &mut redis::Connection, key: &str, max: &str, rate: &str, delta: &str) -> Vec<i64> {
    redis::cmd("TB.ADJUST")
        .arg(&[key, max, rate, delta])
        .query(c)
        .expect("TB.ADJUST")
}

#[test]
fn refund_is_capped_at_max() {
    let s = Server::start();
    let mut c = s.conn();
    consume(&mut c, "k", "10", "0.01", "6");
    let r = adjust(&mut c, "k", "10", "0.01", "2.5");
    assert_eq!(r[0..2], [1, 6]);
    assert_eq!(
        hgetall(&mut c, "k")["tokens"]
            .parse::<f64>()
            .unwrap()
            .floor(),
        6.0
    );
    // Refunding past max fills the bucket, which is the same as no key.
    assert_eq!(adjust(&mut c, "k", "10", "0.01", "1000"), vec![1, 10, 0, 0]);
    assert_eq!(int(&mut c, "EXISTS", "k"), 0);
}

#[test]
fn debt_is_floored_at_minus_max() {
    let s = Server::start();
    let mut c = s.conn();
    // 100 tokens at 10/s; one settlement of 1,000,000 stops at -100, then
    // CONSUME and PEEK: all within the 10 s refill takes back to 0.
    let (key, (r, h, at, d, p), took) = back_to_back(Duration::from_secs(10), |key| {
        let r = adjust(&mut c, key, "100", "10", "-1000000");
        let (h, at) = (hgetall(&mut c, key), int(&mut c, "PEXPIRETIME", key));
        let d = consume(&mut c, key, "100", "10", "1");
        let p = peek(&mut c, key, "100", "10", "0");
        (r, h, at, d, p)
    });
    assert_eq!(r[0..2], [1, -100]);
    // Cost 1 needs 101 tokens of refill: 10.1 s. Full after 20 s = 2*max/rate.
    assert!(r[2] > 10_000 && r[2] <= 10_100, "{r:?}");
    assert!(r[3] > 19_900 && r[3] <= 20_000, "{r:?}");
    assert_eq!(h["tokens"], "-100");
    // Expires when full: 20 s after ts (rounded up to the ms).
    let ts: i64 = h["ts"].parse().unwrap();
    assert_eq!(at, (ts + 999) / 1000 + r[3]);

    // In debt, CONSUME and PEEK deny; refill pays the debt back first:
    // at most `took` ms of it, 10 tokens a second.
    assert_eq!(d[0], 0, "{d:?}");
    assert!(
        d[1] >= -100 && d[1] as f64 <= -100.0 + 10.0 * took as f64 / 1000.0,
        "{d:?}, {took} ms"
    );
    assert_eq!(p[0], 0, "even cost 0 waits for 0: {p:?}");
    assert_eq!(hgetall(&mut c, &key), h, "the denials wrote nothing");
}

/// TB.ADJUST writes on every call, a delta of 0 included (it rewrites
/// `ts` and the expire time), and a refund that fills the bucket deletes
/// it; except on a missing key that it leaves full: a missing key is a
/// full bucket already, so nothing is written, replicated or dirtied.
/// What each call replicates is read from the replication stream.
#[test]
fn adjust_writes_unless_it_leaves_a_missing_bucket_full() {
    let s = Server::start();
    let mut c = s.conn();
    let mut stream = ReplicationStream::attach(&s);
    let dirty =
        |c: &mut redis::Connection| info_field(c, "persistence", "rdb_changes_since_last_save");
    type Expected = fn(&mut redis::Connection) -> Vec<Vec<String>>;
    let nothing: Expected = |_| Vec::new();
    let cases: [(&str, Expected); 7] = [
        ("-3", |c| bucket_write(c, "k")),
        ("0", |c| bucket_write(c, "k")),
        ("-0.5", |c| bucket_write(c, "k")),
        ("1.25", |c| bucket_write(c, "k")),
        ("100", |_| bucket_delete("k")),
        ("5", nothing),
        ("0", nothing),
    ];
    for (delta, expected) in cases {
        let before = (hgetall(&mut c, "k"), dirty(&mut c));
        adjust(&mut c, "k", "10", "0.01", delta);
        let after = (hgetall(&mut c, "k"), dirty(&mut c));
        let sent = stream.take_commands(&mut c);
        assert_eq!(sent, expected(&mut c), "delta {delta}");
        if sent.is_empty() {
            assert_eq!(after, before, "delta {delta}: nothing written");
            assert_eq!(int(&mut c, "EXISTS", "k"), 0);
        } else {
            assert_ne!(after, before, "delta {delta}: written");
        }
    }
}

/// In debt even a cost of 0 is denied (the balance is below 0), and one
/// such group vetoes a whole TB.MCONSUME.
#[test]
fn cost_zero_in_debt_is_denied_and_vetoes_mconsume() {
    let s = Server::start();
    let mut c = s.conn();
    assert_eq!(adjust(&mut c, "debt", "10", "0.001", "-15")[..2], [1, -5]);
    let r = consume(&mut c, "debt", "10", "0.001", "0");
    assert_eq!(r[..2], [0, -5]);
    // Back to 0 takes 5 tokens at 0.001/s.
    assert!(r[2] > 4_990_000 && r[2] <= 5_000_000, "{r:?}");
    let before = snapshot(&mut c);
    let m: Vec<redis::Value> = redis::cmd("TB.MCONSUME")
        .arg(&["fine", "10", "1", "1", "debt", "10", "0.001", "0"])
        .query(&mut c)
        .unwrap();
    assert_eq!(m[0], redis::Value::Int(0), "{m:?}");
    assert_eq!(snapshot(&mut c), before, "nobody was charged");
}
