//! CL.THROTTLE, redis-cell's command, on the module's buckets: the replies
//! of redis-cell's README, a table of GCRA cases worked out by hand (on a
//! fake clock, through the module, FCALL tb_cl_throttle and the EVAL
//! script), the same bucket as TB.CONSUME, keys redis-cell left, hostile
//! input, replication and the AOF, a limit that changes, and the swap
//! itself: a key as redis-cell writes it, redis-cell loaded first, and a
//! replica upgraded before its primary. redis-cell itself is never run:
//! tests/fixtures/fake_redis_cell.c stands in for it (it keeps and
//! replicates its keys as redis-cell does; see the file).

use redis::Value;
use tb_core::contract::msg::WRONGTYPE;
use tb_core::error::{Error, StateError};
use testkit::{
    error_of, hgetall, int, load_eval_script, load_library, pypi_server, run, server_time_us,
    skewed_clock, snapshot, start_replica, tb_counter, wait_replicas, Config, FakeClock, Pypi,
    ReplicationStream, Server,
};

const T0: i64 = 1_893_456_000_000_000; // 2030-01-01T00:00:00Z in µs

/// One way to send CL.THROTTLE.
#[derive(Clone, Copy, Debug)]
enum Form {
    Module,
    Library,
    Eval,
}

const FORMS: [Form; 3] = [Form::Module, Form::Library, Form::Eval];

fn throttle_cmd(form: Form, sha: &str, key: &[u8], args: &[&str]) -> redis::Cmd {
    match form {
        Form::Module => {
            let mut c = redis::cmd("CL.THROTTLE");
            c.arg(key).arg(args);
            c
        }
        Form::Library => {
            let mut c = redis::cmd("FCALL");
            c.arg("tb_cl_throttle").arg(1).arg(key).arg(args);
            c
        }
        Form::Eval => {
            let mut c = redis::cmd("EVALSHA");
            c.arg(sha).arg(1).arg(key).arg("cl_throttle").arg(args);
            c
        }
    }
}

/// A server with the module, the library and the EVAL script.
fn all_forms(config: Config) -> (Server, redis::Connection, String) {
    let s = Server::with(config);
    let mut c = s.conn();
    load_library(&mut c);
    let sha = load_eval_script(&mut c);
    (s, c, sha)
}

fn throttle(
    c: &mut redis::Connection,
    form: Form,
    sha: &str,
    key: &str,
    args: &[&str],
) -> Vec<i64> {
    let reply = run(c, &throttle_cmd(form, sha, key.as_bytes(), args))
        .unwrap_or_else(|e| panic!("{form:?} {key} {args:?}: {e}"));
    redis::from_redis_value(&reply).unwrap()
}

#[test]
fn the_readme_examples_of_redis_cell() {
    let examples: [(&str, &[&str], [i64; 5]); 4] = [
        // "CL.THROTTLE user123 15 30 60", and with its quantity of 1 spelt out.
        ("user123", &["15", "30", "60"], [0, 16, 15, -1, 2]),
        ("user", &["15", "30", "60", "1"], [0, 16, 15, -1, 2]),
        // "Multiple Rate Limits": one key per kind of action; 10 per 60 s
        // is one token every 6 s.
        ("user123-read-rate", &["15", "30", "60"], [0, 16, 15, -1, 2]),
        ("user123-write-rate", &["5", "10", "60"], [0, 6, 5, -1, 6]),
    ];
    let (_s, mut c, sha) = all_forms(Config::default());
    for form in FORMS {
        for (key, args, want) in examples {
            let r = throttle(&mut c, form, &sha, &format!("{form:?}:{key}"), args);
            assert_eq!(r, want, "{form:?} {key} {args:?}");
        }
    }
}

/// GCRA cases worked out by hand, on a frozen clock. A bucket of
/// `max_burst + 1` tokens refilled at `count / period` per second; the
/// reply is [limited, limit, remaining, retry_s, reset_s], the seconds
/// rounded up.
#[test]
fn gcra_cases_worked_out_by_hand() {
    // (µs after T0, key, max_burst, count, period, quantity (None: omitted), reply, written)
    type Case = (
        i64,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        Option<&'static str>,
        [i64; 5],
        bool,
    );
    // One case a line: the columns read as the type above.
    #[rustfmt::skip]
    let cases: &[Case] = &[
        // Limit 5 at 1/s. A fresh key: one token used, full again in 1 s.
        (0, "a", "4", "1", "1", None, [0, 5, 4, -1, 1], true),
        // Draining it: each call takes one more second to refill.
        (0, "a", "4", "1", "1", None, [0, 5, 3, -1, 2], true),
        (0, "a", "4", "1", "1", Some("1"), [0, 5, 2, -1, 3], true),
        (0, "a", "4", "1", "1", None, [0, 5, 1, -1, 4], true),
        (0, "a", "4", "1", "1", None, [0, 5, 0, -1, 5], true),
        // Empty: limited, one token arrives in 1 s, full in 5 s.
        (0, "a", "4", "1", "1", None, [1, 5, 0, 1, 5], false),
        // 250 ms later: 0.25 tokens, so 0.75 s to go, rounded up to 1.
        (250_000, "a", "4", "1", "1", None, [1, 5, 0, 1, 5], false),
        // After the retry time: allowed, 0 left again, full in 5 s.
        (1_000_000, "a", "4", "1", "1", None, [0, 5, 0, -1, 5], true),
        // Quantity 0 checks and writes nothing.
        (3_500_000, "a", "4", "1", "1", Some("0"), [0, 5, 2, -1, 3], false),
        // A quantity above the limit never passes: limited, retry -1.
        (3_500_000, "a", "4", "1", "1", Some("6"), [1, 5, 2, -1, 3], false),
        // A quantity that fits the limit but not the bucket: how long
        // until 4 tokens are there (2.5 -> 4 at 1/s: 1.5 s, rounded up).
        (3_500_000, "a", "4", "1", "1", Some("4"), [1, 5, 2, 2, 3], false),
        // Taking 2 of the 2.5: 0.5 left, 4.5 s to full, rounded up.
        (3_500_000, "a", "4", "1", "1", Some("2"), [0, 5, 0, -1, 5], true),
        // 30 per 60 s: 0.5 per second, limit 16.
        (0, "b", "15", "30", "60", None, [0, 16, 15, -1, 2], true),
        (0, "b", "15", "30", "60", Some("15"), [0, 16, 0, -1, 32], true),
        // Empty: a token takes 2 s.
        (0, "b", "15", "30", "60", None, [1, 16, 0, 2, 32], false),
        // 0.5 s on: 0.25 tokens, 1.5 s to go, rounded up to 2.
        (500_000, "b", "15", "30", "60", None, [1, 16, 0, 2, 32], false),
        (2_000_000, "b", "15", "30", "60", None, [0, 16, 0, -1, 32], true),
        // A fresh key asking for the whole limit at once.
        (0, "c", "2", "3", "1", Some("3"), [0, 3, 0, -1, 1], true),
    ];
    let clock = FakeClock::new(T0);
    let (_s, mut c, sha) = all_forms(clock.config());
    for form in FORMS {
        let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
        for (i, &(at, key, burst, count, period, quantity, want, written)) in
            cases.iter().enumerate()
        {
            clock.set(T0 + at);
            let mut args = vec![burst, count, period];
            args.extend(quantity);
            let before = (hgetall(&mut c, key), int(&mut c, "PEXPIRETIME", key));
            let r = throttle(&mut c, form, &sha, key, &args);
            assert_eq!(r, want, "{form:?} case {i}: {key} {args:?}");
            let after = (hgetall(&mut c, key), int(&mut c, "PEXPIRETIME", key));
            assert_eq!(after != before, written, "{form:?} case {i}: written?");
            if written {
                // The key expires when the bucket is full: reset_s is that
                // time rounded up to whole seconds.
                let full_in_ms = after.1 - (T0 + at) / 1000;
                assert!(
                    full_in_ms <= want[4] * 1000 && full_in_ms > want[4] * 1000 - 1000,
                    "{form:?} case {i}"
                );
            }
        }
    }
}

/// `CL.THROTTLE k 15 30 60` and `TB.CONSUME k 16 0.5` are one bucket: the
/// two, interleaved on one key, leave what TB.CONSUME alone leaves.
#[test]
fn the_same_bucket_as_tb_consume() {
    let clock = FakeClock::new(T0);
    let s = Server::with(clock.config());
    let mut c = s.conn();
    let mut now = T0;
    for i in 0..200 {
        now += [0, 100_000, 250_000, 1_999_999][i % 4];
        clock.set(now);
        let quantity = ["1", "3", "0", "2", "1"][i % 5];
        let tb: Vec<i64> = redis::cmd("TB.CONSUME")
            .arg(&["alone", "16", "0.5", quantity])
            .query(&mut c)
            .unwrap();
        let shared: Vec<i64> = if i % 2 == 0 {
            redis::cmd("CL.THROTTLE")
                .arg(&["shared", "15", "30", "60", quantity])
                .query(&mut c)
                .unwrap()
        } else {
            redis::cmd("TB.CONSUME")
                .arg(&["shared", "16", "0.5", quantity])
                .query(&mut c)
                .unwrap()
        };
        if i % 2 == 0 {
            // The CL reply describes the same state as TB.CONSUME's.
            assert_eq!(shared[0], 1 - tb[0], "call {i}: limited");
            assert_eq!(shared[2], tb[1].max(0), "call {i}: remaining");
            let seconds = |ms: i64| (ms + 999) / 1000;
            assert_eq!(shared[4], seconds(tb[3]), "call {i}: reset");
            let retry = if tb[0] == 1 { -1 } else { seconds(tb[2]) };
            assert_eq!(shared[3], retry, "call {i}: retry");
        } else {
            assert_eq!(shared, tb, "call {i}");
        }
        assert_eq!(
            hgetall(&mut c, "shared"),
            hgetall(&mut c, "alone"),
            "call {i}"
        );
        assert_eq!(
            int(&mut c, "PEXPIRETIME", "shared"),
            int(&mut c, "PEXPIRETIME", "alone"),
            "call {i}"
        );
    }
    // And TB.PEEK reads it to the millisecond.
    let peek: Vec<i64> = redis::cmd("TB.PEEK")
        .arg(&["shared", "16", "0.5"])
        .query(&mut c)
        .unwrap();
    let cl: Vec<i64> = redis::cmd("CL.THROTTLE")
        .arg(&["shared", "15", "30", "60", "0"])
        .query(&mut c)
        .unwrap();
    assert_eq!(cl[2], peek[1].max(0));
    assert_eq!(cl[4], (peek[3] + 999) / 1000);
}

/// The bytes of a key, whatever its type, to tell "untouched" exactly.
fn dump(c: &mut redis::Connection, key: &str) -> Value {
    redis::cmd("DUMP").arg(key).query(c).unwrap()
}

/// A key redis-cell left (its TAT in nanoseconds, as a string) is the
/// bucket it stands for; a write turns it into the bucket hash, on the
/// replica too. Checks and denials leave it as it is.
#[test]
fn keys_redis_cell_left_are_read_and_converted() {
    let clock = FakeClock::new(T0);
    let (s, mut c, sha) = all_forms(clock.config());
    // A replica on the real clock: it only applies the primary's effects.
    let replica = start_replica(
        &s,
        Config {
            bin: pypi_server(Pypi::Valkey91),
            ..Config::without_module()
        },
    );
    let mut r = replica.conn();
    for form in FORMS {
        let key = format!("{form:?}:legacy");
        // 6 s ahead at 0.5/s: 3 of 16 tokens missing.
        let tat = ((T0 + 6_000_000) * 1000).to_string();
        let _: () = redis::cmd("SET").arg(&key).arg(&tat).query(&mut c).unwrap();
        let string = dump(&mut c, &key);
        assert_eq!(
            throttle(&mut c, form, &sha, &key, &["15", "30", "60", "0"]),
            [0, 16, 13, -1, 6]
        );
        assert_eq!(
            throttle(&mut c, form, &sha, &key, &["15", "30", "60", "20"]),
            [1, 16, 13, -1, 6]
        );
        assert_eq!(
            throttle(&mut c, form, &sha, &key, &["15", "30", "60", "14"]),
            [1, 16, 13, 2, 6]
        );
        assert_eq!(dump(&mut c, &key), string, "{form:?}: read, not written");
        // Nor re-encoded: reading a value in place would have made it raw.
        let encoding: String = redis::cmd("OBJECT")
            .arg(&["ENCODING", &key])
            .query(&mut c)
            .unwrap();
        assert_eq!(encoding, "int", "{form:?}");
        // TB.* don't read redis-cell strings.
        let err = error_of(
            &mut c,
            redis::cmd("TB.CONSUME").arg(&key).arg(&["16", "0.5"]),
        );
        assert!(err.starts_with("WRONGTYPE"), "{err}");
        // The first charge converts it.
        assert_eq!(
            throttle(&mut c, form, &sha, &key, &["15", "30", "60", "1"]),
            [0, 16, 12, -1, 8]
        );
        let h = hgetall(&mut c, &key);
        assert_eq!(h["tokens"].parse::<f64>().unwrap(), 12.0, "{form:?} {h:?}");
        assert_eq!(h["ts"], T0.to_string());
        assert_eq!(int(&mut c, "PEXPIRETIME", &key), T0 / 1000 + 8000);
        // A TAT in the past is a full bucket.
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(((T0 - 1) * 1000).to_string())
            .query(&mut c)
            .unwrap();
        assert_eq!(
            throttle(&mut c, form, &sha, &key, &["15", "30", "60"]),
            [0, 16, 15, -1, 2]
        );
        // Anything else in a string is not a redis-cell key.
        for text in ["hello", "-5", "01", "1.5", "18446744073709551616", ""] {
            let _: () = redis::cmd("SET").arg(&key).arg(text).query(&mut c).unwrap();
            let before = dump(&mut c, &key);
            let reply = run(
                &mut c,
                &throttle_cmd(form, &sha, key.as_bytes(), &["15", "30", "60"]),
            );
            assert_eq!(reply.unwrap_err(), WRONGTYPE, "{form:?} {text:?}");
            assert_eq!(dump(&mut c, &key), before);
        }
        let _: () = redis::cmd("DEL").arg(&key).query(&mut c).unwrap();
    }
    // The conversion reached the replica as effects: the same keys.
    for form in FORMS {
        let key = format!("{form:?}:moved");
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(((T0 + 2_000_000) * 1000).to_string())
            .query(&mut c)
            .unwrap();
        throttle(&mut c, form, &sha, &key, &["15", "30", "60"]);
    }
    wait_replicas(&mut c, 1);
    assert_eq!(snapshot(&mut r), snapshot(&mut c));
}

/// A call that must fail: key, arguments, error.
type ErrorCase<'a> = (&'a [u8], Vec<&'a [u8]>, String);

/// Bad arguments and keys are errors that name what is wrong, with the
/// key untouched and the server serving, in every form.
#[test]
fn hostile_input_is_an_error_and_touches_nothing() {
    let (mut s, mut c, sha) = all_forms(Config::default());
    let _: () = redis::cmd("RPUSH")
        .arg(&["list", "x"])
        .query(&mut c)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(&["other", "a", "1"])
        .query(&mut c)
        .unwrap();
    throttle(&mut c, Form::Module, &sha, "bucket", &["5", "1", "10", "2"]);
    let keys = ["list", "other", "bucket", "fresh"];
    let dumps = |c: &mut redis::Connection| keys.map(|k| dump(c, k));
    let before = dumps(&mut c);
    let errors_before = tb_counter(&mut c, "tb_errors");
    let arity = "ERR wrong number of arguments for 'cl.throttle' command".to_string();
    let cases: Vec<ErrorCase> = vec![
        (b"fresh", vec![b"1", b"1"], arity.clone()),
        (b"fresh", vec![b"1", b"1", b"1", b"1", b"1"], arity),
        (b"fresh", vec![b"1.5", b"1", b"1"], "ERR max_burst must be an integer".into()),
        (b"fresh", vec![b"\xff\xfe", b"1", b"1"], "ERR max_burst must be an integer".into()),
        (b"fresh", vec![b"-1", b"1", b"1"], "ERR max_burst must be >= 0".into()),
        (b"fresh", vec![b"1", b"0", b"1"], "ERR count must be >= 1".into()),
        (b"fresh", vec![b"1", b"-3", b"1"], "ERR count must be >= 1".into()),
        (b"fresh", vec![b"1", b"1", b"0"], "ERR period must be >= 1".into()),
        (b"fresh", vec![b"1", b"1", b"nan"], "ERR period must be an integer".into()),
        (b"fresh", vec![b"1", b"1", b"1", b"-1"], "ERR quantity must be >= 0".into()),
        (b"fresh", vec![b"1", b"1", b"1", b"1e3"], "ERR quantity must be an integer".into()),
        (b"fresh", vec![b"99999999999999999999", b"1", b"1"], "ERR max_burst must be an integer".into()),
        (b"fresh", vec![b"1000000000000", b"1", b"1"], "ERR max_burst must be < 1e12".into()),
        (b"fresh", vec![b"1", b"9223372036854775807", b"1"], "ERR count/period must be <= 1e12 per second".into()),
        (
            b"fresh",
            vec![b"999999", b"1", b"100000"],
            "ERR count/period is too low for max_burst: (max_burst+1)*period/count must be <= 1e10 seconds".into(),
        ),
        (b"list", vec![b"1", b"1", b"1"], WRONGTYPE.into()),
        (b"other", vec![b"1", b"1", b"1"], Error::NotABucket(StateError::Fields, None).to_string()),
    ];
    let mut module_errors = 0;
    for form in FORMS {
        for (key, args, want) in &cases {
            let mut cmd = throttle_cmd(form, &sha, key, &[]);
            cmd.arg(args.as_slice());
            assert_eq!(run(&mut c, &cmd), Err(want.clone()), "{form:?} {args:?}");
            if matches!(form, Form::Module) {
                module_errors += 1;
            }
        }
    }
    assert_eq!(dumps(&mut c), before, "errors touched a key");
    assert_eq!(
        tb_counter(&mut c, "tb_errors") - errors_before,
        module_errors
    );
    assert!(s.is_alive());
}

/// The primary's writes reach the replica and the AOF as effects: after a
/// run of calls, the replica, and the primary restarted from its AOF, hold
/// the same buckets.
#[test]
fn replicas_and_the_aof_hold_the_primarys_buckets() {
    let config = Config::default()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always");
    let mut s = Server::with(config.clone());
    let replica = start_replica(&s, Config::without_module());
    let (mut c, mut r) = (s.conn(), replica.conn());
    let admitted_before = tb_counter(&mut c, "tb_admitted");
    let (mut admitted, mut denied) = (0, 0);
    for i in 0..300u64 {
        let key = format!("k{}", i % 7);
        let quantity = (i % 4).to_string();
        let reply: Vec<i64> = redis::cmd("CL.THROTTLE")
            .arg(&[&key, "3", "10", "1", &quantity])
            .query(&mut c)
            .unwrap();
        if reply[0] == 0 {
            admitted += 1;
        } else {
            denied += 1;
        }
    }
    assert!(
        admitted > 50 && denied > 10,
        "{admitted} admitted, {denied} denied"
    );
    assert_eq!(
        tb_counter(&mut c, "tb_admitted") - admitted_before,
        admitted
    );
    wait_replicas(&mut c, 1);
    let state = snapshot(&mut c);
    assert_eq!(snapshot(&mut r), state, "the replica, without the module");
    s.kill9();
    s.restart_with(config);
    let mut c = s.conn();
    assert_eq!(snapshot(&mut c), state, "restored from the AOF");
}

/// With redis-cell loaded first, CL.THROTTLE stays redis-cell's: the
/// module logs one line, skips it and loads the rest. (The fixture is a
/// small module of this repository that registers `cl.throttle` under the
/// name redis-cell and keeps its keys as redis-cell does: a TAT string.)
#[test]
fn a_loaded_redis_cell_keeps_cl_throttle() {
    let fixture = testkit::fake_redis_cell();
    let s = Server::with(
        Config::without_module()
            .arg("loadmodule", &fixture.to_string_lossy())
            .arg("loadmodule", &testkit::module_path().to_string_lossy()),
    );
    let mut c = s.conn();
    let reply: String = redis::cmd("CL.THROTTLE")
        .arg(&["k", "1", "1", "1"])
        .query(&mut c)
        .unwrap();
    assert_eq!(reply, "fake redis-cell");
    let kind: String = redis::cmd("TYPE").arg("k").query(&mut c).unwrap();
    assert_eq!(kind, "string", "redis-cell's TAT, not this module's hash");
    let r: Vec<i64> = redis::cmd("TB.CONSUME")
        .arg(&["k2", "10", "1"])
        .query(&mut c)
        .unwrap();
    assert_eq!(r, [1, 9, 0, 1000]);
    let log = s.log();
    assert_eq!(
        log.matches(
            "tb: cl.throttle is already registered (redis-cell?); tb leaves it to that module"
        )
        .count(),
        1,
        "{log}"
    );
}

/// A key exactly as redis-cell leaves it (its TAT in nanoseconds, written
/// through the module API, with its relative expire time), written by the
/// fake redis-cell of tests/fixtures: after the swap (MODULE UNLOAD
/// redis-cell, MODULE LOAD this module) CL.THROTTLE reads it as the bucket
/// it stands for, leaves it as it is on a check, converts it on a charge,
/// and reads it as a full bucket once its TTL has passed.
#[test]
fn a_key_as_redis_cell_writes_it_is_read_after_the_swap() {
    let clock = FakeClock::new(T0);
    let s = Server::with(
        Config {
            module: false,
            ..clock.config()
        }
        .arg("enable-module-command", "yes")
        .arg("loadmodule", &testkit::fake_redis_cell().to_string_lossy()),
    );
    let mut c = s.conn();
    // 3 per second: one every 333,333,333 ns. Quantity 4 of a limit of 16
    // sets the TAT 4 intervals past now, for `legacy` and `expiring`.
    for key in ["legacy", "expiring"] {
        let reply: String = redis::cmd("CL.THROTTLE")
            .arg(&[key, "15", "3", "1", "4"])
            .query(&mut c)
            .unwrap();
        assert_eq!(reply, "fake redis-cell");
    }
    let tat = (T0 * 1000 + 4 * 333_333_333).to_string();
    let get = |c: &mut redis::Connection, key: &str| -> String {
        redis::cmd("GET").arg(key).query(c).unwrap()
    };
    assert_eq!(get(&mut c, "legacy"), tat);
    let encoding: String = redis::cmd("OBJECT")
        .arg(&["ENCODING", "legacy"])
        .query(&mut c)
        .unwrap();
    assert_eq!(
        encoding, "embstr",
        "a string the module API set, not SET's int"
    );
    // The TTL is the TAT's distance from now, truncated to the millisecond.
    assert_eq!(int(&mut c, "PEXPIRETIME", "legacy"), T0 / 1000 + 1333);

    // The swap.
    let ok: String = redis::cmd("MODULE")
        .arg(&["UNLOAD", "redis-cell"])
        .query(&mut c)
        .unwrap();
    assert_eq!(ok, "OK");
    let ok: String = redis::cmd("MODULE")
        .arg("LOAD")
        .arg(testkit::module_path().to_string_lossy().as_ref())
        .query(&mut c)
        .unwrap();
    assert_eq!(ok, "OK");

    // Half a second later: 1.333333332 - 0.5 s of refill missing at 3/s,
    // 2.499999996 tokens: 13.500000004 left, full in 0.833 s.
    clock.set(T0 + 500_000);
    let string = dump(&mut c, "legacy");
    for (args, reply) in [
        (&["15", "3", "1", "0"][..], [0, 16, 13, -1, 1]),
        (&["15", "3", "1", "14"], [1, 16, 13, 1, 1]),
        (&["15", "3", "1", "17"], [1, 16, 13, -1, 1]),
    ] {
        let r: Vec<i64> = redis::cmd("CL.THROTTLE")
            .arg("legacy")
            .arg(args)
            .query(&mut c)
            .unwrap();
        assert_eq!(r, reply, "{args:?}");
    }
    assert_eq!(dump(&mut c, "legacy"), string, "read, not written");
    assert_eq!(int(&mut c, "PEXPIRETIME", "legacy"), T0 / 1000 + 1333);
    // A charge converts it: this module's hash and expire time.
    let r: Vec<i64> = redis::cmd("CL.THROTTLE")
        .arg(&["legacy", "15", "3", "1", "1"])
        .query(&mut c)
        .unwrap();
    assert_eq!(r, [0, 16, 12, -1, 2]);
    let h = hgetall(&mut c, "legacy");
    let tokens: f64 = h["tokens"].parse().unwrap();
    assert!((tokens - 12.500000004).abs() < 1e-9, "{h:?}");
    assert_eq!(h["ts"], (T0 + 500_000).to_string());
    let peek: Vec<i64> = redis::cmd("TB.PEEK")
        .arg(&["legacy", "16", "3"])
        .query(&mut c)
        .unwrap();
    assert_eq!(
        int(&mut c, "PEXPIRETIME", "legacy"),
        T0 / 1000 + 500 + peek[3]
    );
    // Once redis-cell's TTL has passed, the key is gone: a full bucket.
    clock.set(T0 + 1_334_000);
    let r: Vec<i64> = redis::cmd("CL.THROTTLE")
        .arg(&["expiring", "15", "3", "1", "0"])
        .query(&mut c)
        .unwrap();
    assert_eq!(r, [0, 16, 16, -1, 0]);
    assert_eq!(int(&mut c, "EXISTS", "expiring"), 0);
}

/// A replica upgraded before its primary: the primary, still on
/// redis-cell (the fake of tests/fixtures, which replicates its command
/// verbatim as redis-cell does), sends every CL.THROTTLE it answers as the
/// command itself, limited calls included. The replica, with this module,
/// runs each one again on its own clock and its own copy of the key: its
/// keys become this module's hashes while the primary keeps its TAT
/// strings, and where the two clocks or states differ, so do the
/// decisions.
#[test]
fn a_replica_upgraded_first_reruns_redis_cells_commands_on_its_own_clock() {
    let primary = Server::with(Config {
        bin: pypi_server(Pypi::Valkey91),
        ..Config::without_module().arg("loadmodule", &testkit::fake_redis_cell().to_string_lossy())
    });
    let mut p = primary.conn();
    let throttle = |p: &mut redis::Connection, args: &[&str]| {
        let reply: String = redis::cmd("CL.THROTTLE").arg(args).query(p).unwrap();
        assert_eq!(reply, "fake redis-cell");
    };
    // Limit 2, one token a minute: drained before the replica attaches.
    throttle(&mut p, &["old", "1", "1", "60"]);
    throttle(&mut p, &["old", "1", "1", "60"]);
    let old_tat: String = redis::cmd("GET").arg("old").query(&mut p).unwrap();
    // The replica's clock runs 90 s ahead of the primary's: less than the
    // 120 s to `old`'s TAT (and expire time), so the key is still there.
    let replica = start_replica(&primary, skewed_clock("+90"));
    let mut r = replica.conn();
    let replica_type = |r: &mut redis::Connection, key: &str| -> String {
        redis::cmd("TYPE").arg(key).query(r).unwrap()
    };
    assert_eq!(replica_type(&mut r, "old"), "string", "the full sync");
    let mut stream = ReplicationStream::attach(&primary);

    // The primary limits this call: `old` stays drained, nothing written.
    throttle(&mut p, &["old", "1", "1", "60"]);
    // Two fresh keys' first calls, and one limited call.
    for _ in 0..3 {
        throttle(&mut p, &["new", "1", "1", "60"]);
    }
    let sent: Vec<Vec<String>> = stream
        .take(&mut p)
        .into_iter()
        .filter(|cmd| cmd[0] != "SELECT")
        .collect();
    let verbatim = |key: &str| {
        ["CL.THROTTLE", key, "1", "1", "60"]
            .map(String::from)
            .to_vec()
    };
    assert_eq!(
        sent,
        [
            verbatim("old"),
            verbatim("new"),
            verbatim("new"),
            verbatim("new")
        ],
        "every call, as the command"
    );
    // The replica has run them (WAIT: the stream above acknowledges nothing).
    let acked: i64 = redis::cmd("WAIT").arg(&[1, 10_000]).query(&mut p).unwrap();
    assert_eq!(acked, 1);

    // The primary: TAT strings, `old` as it was.
    let get = |p: &mut redis::Connection, key: &str| -> String {
        redis::cmd("GET").arg(key).query(p).unwrap()
    };
    assert_eq!(get(&mut p, "old"), old_tat);
    assert!(get(&mut p, "new").parse::<u64>().is_ok());
    // The replica: on its clock `old`'s TAT is 30 s nearer, half a token
    // more, so it charged the call the primary limited, and converted the
    // key.
    let replica_now = server_time_us(&mut r);
    let primary_now = server_time_us(&mut p);
    assert!(replica_now - primary_now > 85_000_000, "the clocks");
    for key in ["old", "new"] {
        assert_eq!(replica_type(&mut r, key), "hash", "{key}");
        let h = hgetall(&mut r, key);
        let ts: i64 = h["ts"].parse().unwrap();
        assert!(
            ts <= replica_now && ts > replica_now - 60_000_000,
            "{key}: the replica's clock, {h:?}"
        );
    }
    let mut tokens = |key: &str| hgetall(&mut r, key)["tokens"].parse::<f64>().unwrap();
    // 1.5 tokens and the refill of the seconds the test took, less 1.
    let old = tokens("old");
    assert!((0.5..0.6).contains(&old), "charged on the replica: {old}");
    assert!(
        tokens("new") < 0.01,
        "two admitted, one limited, as on the primary"
    );
}

/// A key's limit changes between calls (a client moved to another tier):
/// the balance carries over, clamped to the new `max`; no debt does. After
/// `CL.THROTTLE k 3 1 2 2` (2 of 4 tokens left), `CL.THROTTLE k 5 10 1 2`
/// finds those 2 tokens and passes, where redis-cell, carrying its TAT 4 s
/// ahead into the new limit, answers limited for 4 s.
#[test]
fn a_changed_limit_carries_the_balance_not_the_time_debt() {
    let clock = FakeClock::new(T0);
    let s = Server::with(clock.config());
    let mut c = s.conn();
    let throttle = |c: &mut redis::Connection, args: &[&str]| -> Vec<i64> {
        redis::cmd("CL.THROTTLE").arg(args).query(c).unwrap()
    };
    assert_eq!(
        throttle(&mut c, &["k", "3", "1", "2", "2"]),
        [0, 4, 2, -1, 4]
    );
    assert_eq!(
        throttle(&mut c, &["k", "5", "10", "1", "2"]),
        [0, 6, 0, -1, 1]
    );
    assert_eq!(hgetall(&mut c, "k")["tokens"], "0");
    // Lowered: 9 of 10 tokens left, then a limit of 3 holds 3.
    assert_eq!(throttle(&mut c, &["j", "9", "1", "1"]), [0, 10, 9, -1, 1]);
    assert_eq!(
        throttle(&mut c, &["j", "2", "1", "1", "0"]),
        [0, 3, 3, -1, 0]
    );
    assert_eq!(
        throttle(&mut c, &["j", "2", "1", "1", "3"]),
        [0, 3, 0, -1, 3]
    );
}
