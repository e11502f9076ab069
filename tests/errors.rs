//! Every error: the message names the bad argument, and nothing is written.

use testkit::{
    consume, error_of, int, repl_offset, snapshot, start_replica, tb_counter, Config, Server,
};

fn cmd(parts: &[&[u8]]) -> redis::Cmd {
    let mut c = redis::cmd(std::str::from_utf8(parts[0]).unwrap());
    for p in &parts[1..] {
        c.arg(*p);
    }
    c
}

/// An argv written as one byte string, split at each space (two spaces
/// make an empty argument).
fn words(line: &[u8]) -> Vec<&[u8]> {
    line.split(|&b| b == b' ').collect()
}

/// Runs `parts`, expects an error containing `expected`, and checks that
/// neither `k` (an existing bucket) nor `new` (a missing key) changed.
fn assert_rejected(c: &mut redis::Connection, parts: &[&[u8]], expected: &str) {
    let before = snapshot(c);
    let offset = repl_offset(c);
    let err = error_of(c, &cmd(parts));
    assert!(
        err.contains(expected),
        "{:?}: got {err:?}, want {expected:?}",
        parts
            .iter()
            .map(|p| String::from_utf8_lossy(p))
            .collect::<Vec<_>>()
    );
    assert_eq!(snapshot(c), before, "an error changed the dataset");
    assert_eq!(repl_offset(c), offset, "an error was replicated");
}

#[test]
fn argument_errors_name_the_argument_and_write_nothing() {
    let s = Server::start();
    let _replica = start_replica(&s, Config::default());
    let mut c = s.conn();
    consume(&mut c, "k", "10", "1", "3");

    let arity = "wrong number of arguments";
    let max_nan = "max must be a finite decimal number";
    let max_range = "max must be > 0 and <= 1e12";
    let rate_nan = "rate must be a finite decimal number";
    let rate_range = "rate must be > 0 and <= 1e12";
    let cost_nan = "cost must be a finite decimal number";
    let above_max = "cost must not exceed max";
    let delta_nan = "delta must be a finite decimal number";
    let cases: Vec<(Vec<&[u8]>, &str)> = vec![
        (words(b"TB.CONSUME k 10"), arity),
        (words(b"TB.CONSUME k 10 1 1 1 1 1"), arity),
        (
            words(b"TB.CONSUME k 10 1 1 1"),
            "syntax error at argument 4: expected WAIT",
        ),
        (
            words(b"TB.CONSUME k 10 1 1 WAIT x"),
            "max_ms must be an integer",
        ),
        (
            words(b"TB.QUOTA k 10 FORTNIGHT"),
            "period must be DAY, WEEK, MONTH, YEAR",
        ),
        (
            words(b"TB.QUOTA k 10 DAY 1 2"),
            "syntax error at argument 4: expected OFFSET",
        ),
        (words(b"TB.QADJUST k 10 DAY"), arity),
        (
            words(b"TB.CHARGE 1 k BUCKETS 1 1 1"),
            "expected BUCKET or QUOTA",
        ),
        (
            words(b"TB.CHARGE 1 k QUOTA 0 DAY 1"),
            "limit must be > 0 and <= 1e12 (group 1)",
        ),
        (words(b"TB.PEEK k"), arity),
        (words(b"TB.ADJUST k 10 1"), arity),
        (words(b"TB.MCONSUME k 10 1"), arity),
        (words(b"TB.MCONSUME k 10 1 1 new"), arity),
        (words(b"TB.CONSUME new abc 1"), max_nan),
        (words(b"TB.CONSUME new nan 1"), max_nan),
        (words(b"TB.CONSUME new inf 1"), max_nan),
        (words(b"TB.CONSUME new -inf 1"), max_nan),
        (words(b"TB.CONSUME new 0x10 1"), max_nan),
        (vec![b"TB.CONSUME", b"new", b" 10", b"1"], max_nan),
        (words(b"TB.CONSUME new  1"), max_nan),
        (words(b"TB.CONSUME new 1e999 1"), max_nan),
        (words(b"TB.CONSUME new \xff 1"), max_nan),
        (words(b"TB.CONSUME new 0 1"), max_range),
        (words(b"TB.CONSUME new -5 1"), max_range),
        (words(b"TB.CONSUME new 2e12 1"), max_range),
        (words(b"TB.CONSUME k 10 NaN"), rate_nan),
        (words(b"TB.CONSUME k 10 0"), rate_range),
        (words(b"TB.CONSUME k 10 1e13"), rate_range),
        (words(b"TB.CONSUME k 1e11 1"), "rate is too low for max"),
        (words(b"TB.CONSUME k 10 1 x"), cost_nan),
        (words(b"TB.CONSUME k 10 1 -1"), "cost must be >= 0"),
        (words(b"TB.CONSUME k 10 1 11"), above_max),
        (words(b"TB.CONSUME k 0.5 1"), above_max),
        (words(b"TB.PEEK k 10 1 10.5"), above_max),
        (words(b"TB.ADJUST k 10 1 inf"), delta_nan),
        (
            words(b"TB.MCONSUME k 10 1 1 new 10 x 1"),
            "rate must be a finite decimal number (group 2)",
        ),
        (
            words(b"TB.MCONSUME k 10 1 1 k 10 1 1"),
            "duplicate key: group 2 repeats the key of group 1",
        ),
    ];
    let errors_before = tb_counter(&mut c, "tb_errors");
    for (parts, expected) in &cases {
        assert_rejected(&mut c, parts, expected);
    }
    let errors_after = tb_counter(&mut c, "tb_errors");
    assert_eq!(errors_after - errors_before, cases.len() as u64);
    assert!(s.log().lines().all(|l| !l.contains("panic")));
}

#[test]
fn keys_of_other_types_are_wrongtype_and_untouched() {
    let s = Server::start();
    let mut c = s.conn();
    let _: () = redis::cmd("SET").arg("str").arg("x").query(&mut c).unwrap();
    let _: () = redis::cmd("RPUSH")
        .arg("list")
        .arg("x")
        .query(&mut c)
        .unwrap();
    let _: () = redis::cmd("SADD")
        .arg("set")
        .arg("x")
        .query(&mut c)
        .unwrap();
    let _: () = redis::cmd("ZADD")
        .arg("zset")
        .arg(1)
        .arg("x")
        .query(&mut c)
        .unwrap();
    let _: String = redis::cmd("XADD")
        .arg("stream")
        .arg("*")
        .arg("f")
        .arg("v")
        .query(&mut c)
        .unwrap();
    for key in ["str", "list", "set", "zset", "stream"] {
        let k = key.as_bytes();
        for parts in [
            vec![&b"TB.CONSUME"[..], k, b"10", b"1"],
            vec![b"TB.PEEK", k, b"10", b"1"],
            vec![b"TB.ADJUST", k, b"10", b"1", b"5"],
            vec![
                b"TB.MCONSUME",
                b"fresh",
                b"10",
                b"1",
                b"1",
                k,
                b"10",
                b"1",
                b"1",
            ],
        ] {
            let before = snapshot_types(&mut c);
            let err = error_of(&mut c, &cmd(&parts));
            assert!(err.starts_with("WRONGTYPE"), "{key}: {err}");
            assert_eq!(snapshot_types(&mut c), before);
        }
    }
    assert_eq!(int(&mut c, "EXISTS", "fresh"), 0, "MCONSUME wrote nothing");
}

fn snapshot_types(c: &mut redis::Connection) -> Vec<(String, String, i64)> {
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(c).unwrap();
    keys.sort();
    keys.into_iter()
        .map(|k| {
            let t: String = redis::cmd("TYPE").arg(&k).query(c).unwrap();
            let d: Vec<u8> = redis::cmd("DUMP").arg(&k).query(c).unwrap();
            (k, t, d.len() as i64)
        })
        .collect()
}

#[test]
fn hashes_that_are_not_buckets_are_errors_and_untouched() {
    let s = Server::start();
    let mut c = s.conn();
    let cases: [(&[&str], &str); 6] = [
        (
            &["tokens", "5", "ts", "1", "extra", "x"],
            "exactly the fields tokens and ts",
        ),
        (&["tokens", "5"], "exactly the fields tokens and ts"),
        (
            &["tokens", "5", "other", "1"],
            "exactly the fields tokens and ts",
        ),
        (
            &["tokens", "abc", "ts", "1"],
            "field tokens is not a finite decimal number",
        ),
        (
            &["tokens", "nan", "ts", "1"],
            "field tokens is not a finite decimal number",
        ),
        (
            &["tokens", "5", "ts", "1.5"],
            "field ts is not an integer of microseconds",
        ),
    ];
    for (i, (fields, expected)) in cases.iter().enumerate() {
        let key = format!("h{i}");
        let mut hset = redis::cmd("HSET");
        hset.arg(&key).arg(*fields);
        let _: i64 = hset.query(&mut c).unwrap();
        for command in ["TB.CONSUME", "TB.PEEK", "TB.ADJUST"] {
            let mut parts: Vec<&[u8]> = vec![command.as_bytes(), key.as_bytes(), b"10", b"1"];
            if command == "TB.ADJUST" {
                parts.push(b"1");
            }
            assert_rejected(&mut c, &parts, expected);
        }
        assert_rejected(
            &mut c,
            &[
                b"TB.MCONSUME",
                b"ok",
                b"1",
                b"1",
                b"1",
                key.as_bytes(),
                b"10",
                b"1",
                b"1",
            ],
            expected,
        );
        assert_eq!(int(&mut c, "EXISTS", "ok"), 0);
    }
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
}
