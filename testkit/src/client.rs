//! Small client helpers: TB calls, error texts, INFO fields, datasets.

use redis::Value;
use std::collections::BTreeMap;
use std::thread::sleep;
use std::time::{Duration, Instant};

pub fn consume(
    c: &mut redis::Connection,
    key: &str,
    max: &str,
    rate: &str,
    cost: &str,
) -> Vec<i64> {
    redis::cmd("TB.CONSUME")
        .arg(key)
        .arg(max)
        .arg(rate)
        .arg(cost)
        .query(c)
        .expect("TB.CONSUME")
}

pub fn peek(c: &mut redis::Connection, key: &str, max: &str, rate: &str, cost: &str) -> Vec<i64> {
    redis::cmd("TB.PEEK")
        .arg(key)
        .arg(max)
        .arg(rate)
        .arg(cost)
        .query(c)
        .expect("TB.PEEK")
}

/// An error reply as the server sent it (`CODE detail`), failing the test
/// if `e` is no error reply (the connection dropped, the server died).
pub fn error_text(e: &redis::RedisError) -> String {
    assert!(
        e.code().is_some() && !e.is_io_error() && !e.is_connection_dropped(),
        "not an error reply (did the server die?): {e:?}"
    );
    format!("{} {}", e.code().unwrap_or(""), e.detail().unwrap_or(""))
        .trim()
        .to_string()
}

/// A command's reply, or its error text.
pub fn run(c: &mut redis::Connection, cmd: &redis::Cmd) -> Result<Value, String> {
    cmd.query::<Value>(c).map_err(|e| error_text(&e))
}

/// A command's error text, failing the test if it succeeded.
pub fn error_of(c: &mut redis::Connection, cmd: &redis::Cmd) -> String {
    match run(c, cmd) {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e,
    }
}

/// The server's clock (`TIME`) in microseconds since the epoch.
pub fn server_time_us(c: &mut redis::Connection) -> i64 {
    let t: Vec<i64> = redis::cmd("TIME").query(c).expect("TIME");
    t[0] * 1_000_000 + t[1]
}

/// One field of the `MODULE LIST` entry of the module named `tb` (Redis
/// 8.2 and Valkey list modules of their own too); fails the test unless
/// exactly one entry has that name.
pub fn tb_module_field(c: &mut redis::Connection, field: &str) -> Value {
    let list: Vec<Vec<Value>> = redis::cmd("MODULE")
        .arg("LIST")
        .query(c)
        .expect("MODULE LIST");
    let get = |entry: &[Value], name: &str| {
        entry
            .chunks(2)
            .find(|kv| redis::from_redis_value::<String>(&kv[0]).ok().as_deref() == Some(name))
            .map(|kv| kv[1].clone())
            .unwrap_or_else(|| panic!("no {name} in {entry:?}"))
    };
    let tb: Vec<&Vec<Value>> = list
        .iter()
        .filter(|e| {
            redis::from_redis_value::<String>(&get(e, "name"))
                .ok()
                .as_deref()
                == Some("tb")
        })
        .collect();
    assert_eq!(tb.len(), 1, "{list:?}");
    get(tb[0], field)
}

pub fn dbsize(c: &mut redis::Connection) -> i64 {
    redis::cmd("DBSIZE").query(c).expect("DBSIZE")
}

pub fn hgetall(
    c: &mut redis::Connection,
    key: impl redis::ToRedisArgs,
) -> BTreeMap<String, String> {
    redis::cmd("HGETALL").arg(key).query(c).expect("HGETALL")
}

/// The integer array a command of words answers (`args[0]` the command);
/// an error fails the test, naming the command.
pub fn ints(c: &mut redis::Connection, args: &[&str]) -> Vec<i64> {
    redis::cmd(args[0])
        .arg(&args[1..])
        .query(c)
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

pub fn int(c: &mut redis::Connection, cmd: &str, key: impl redis::ToRedisArgs) -> i64 {
    redis::cmd(cmd).arg(key).query(c).expect(cmd)
}

/// One `field:value` line of INFO.
pub fn info_field(c: &mut redis::Connection, section: &str, field: &str) -> String {
    let info: String = redis::cmd("INFO").arg(section).query(c).expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in INFO {section}:\n{info}"))
        .trim()
        .to_string()
}

/// One of the module's INFO counters (`tb_errors`, `tb_panics`...).
pub fn tb_counter(c: &mut redis::Connection, name: &str) -> u64 {
    info_field(c, "tb", name).parse().expect(name)
}

pub fn repl_offset(c: &mut redis::Connection) -> i64 {
    info_field(c, "replication", "master_repl_offset")
        .parse()
        .expect("offset")
}

pub fn expired_keys(c: &mut redis::Connection) -> String {
    info_field(c, "stats", "expired_keys")
}

/// Every key with its hash and absolute expire time (ms), for comparing two
/// servers' datasets.
pub fn snapshot(c: &mut redis::Connection) -> BTreeMap<Vec<u8>, (BTreeMap<String, String>, i64)> {
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(c).expect("KEYS");
    keys.into_iter()
        .map(|k| {
            let h = hgetall(c, &k);
            let at = int(c, "PEXPIRETIME", &k);
            (k, (h, at))
        })
        .collect()
}

/// Runs `call` between `WATCH keys` and `EXEC` on `watcher`; true if the
/// transaction still ran (no watched key was signalled as modified).
pub fn exec_survives(watcher: &mut redis::Connection, keys: &[&str], call: impl FnOnce()) -> bool {
    let _: () = redis::cmd("WATCH").arg(keys).query(watcher).unwrap();
    call();
    let _: () = redis::cmd("MULTI").query(watcher).unwrap();
    let _: () = redis::cmd("SET")
        .arg(&["side", "x"])
        .query(watcher)
        .unwrap();
    let exec: Value = redis::cmd("EXEC").query(watcher).unwrap();
    exec != Value::Nil
}

/// Runs `scenario` on a fresh key (`k0`, `k1`...) until one run takes less
/// than `window` by this process's clock, and returns the key, what the run
/// returned and how long it took in whole milliseconds, rounded up. For
/// calls that must come within one refill period of each other: a run
/// that a stalled machine spread wider tests nothing, so it is run again
/// (at most 5 times), and the caller derives every bound it checks from
/// the time taken.
pub fn back_to_back<T>(window: Duration, mut scenario: impl FnMut(&str) -> T) -> (String, T, i64) {
    for attempt in 0..5 {
        let key = format!("k{attempt}");
        let start = Instant::now();
        let out = scenario(&key);
        let took = start.elapsed();
        if took < window {
            return (key, out, took.as_micros().div_ceil(1000) as i64);
        }
        eprintln!("{key}: the calls took {took:?}, more than {window:?}: again");
    }
    panic!("5 runs in a row took more than {window:?}");
}

/// Polls `f` until it returns true or the timeout passes.
pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        sleep(Duration::from_millis(20));
    }
    f()
}

/// Fills the server past a 1 MB maxmemory with a `ballast` string of
/// `bytes`, under noeviction: every write that needs memory fails with OOM.
pub fn out_of_memory(c: &mut redis::Connection, bytes: usize) {
    let _: () = redis::cmd("SET")
        .arg("ballast")
        .arg(vec![b'x'; bytes])
        .query(c)
        .unwrap();
    for (name, value) in [("maxmemory-policy", "noeviction"), ("maxmemory", "1mb")] {
        let _: () = redis::cmd("CONFIG")
            .arg(&["SET", name, value])
            .query(c)
            .unwrap();
    }
}

/// An empty dataset with `bad` (`string`: a string; else a hash that is no
/// bucket) and `later`, a bucket whose TTL has just passed.
pub fn bad_then_expired(c: &mut redis::Connection, bad: &str) {
    let _: () = redis::cmd("FLUSHALL").query(c).unwrap();
    if bad == "string" {
        let _: () = redis::cmd("SET").arg(&["bad", "x"]).query(c).unwrap();
    } else {
        let _: () = redis::cmd("HSET")
            .arg(&["bad", "tokens", "nan", "ts", "1"])
            .query(c)
            .unwrap();
    }
    let _: () = redis::cmd("HSET")
        .arg(&["later", "tokens", "1", "ts", "1"])
        .query(c)
        .unwrap();
    let _: () = redis::cmd("PEXPIRE").arg(&["later", "1"]).query(c).unwrap();
    sleep(Duration::from_millis(5));
}
