//! The Lua library against the module, on one server with a fake clock.
//!
//! * `random_sequence_matches_the_module`: one seeded random sequence of
//!   operations goes through TB.* and CL.THROTTLE on `m:` keys and
//!   through FCALL (tb_cl_throttle too) on `l:` keys, with the clock
//!   stepped between operations and, now and then, a random stored state
//!   planted on both sides (its `ts` often ahead of the clock, as a clock
//!   step or a failover leaves it), or a key redis-cell left (its TAT). Replies, errors,
//!   stored states and the replication stream must be identical: same
//!   keys, bit-identical balances, same `ts`, same PEXPIRETIME, and the
//!   same commands replicated, argument for argument (`tokens` compared
//!   as the double it spells).
//! * `random_lease_sequence_matches_the_module`: the same for the lease
//!   commands: TB.ACQUIRE (with BUCKET clauses), TB.RELEASE, TB.RENEW and
//!   TB.INFLIGHT against tb_acquire & co., with random ids, weights,
//!   limits and lease times, the clock stepped by µs to a minute (leases
//!   expire, sometimes it steps back), lease states planted on both sides
//!   (expired leases, leading zeros), and keys of the wrong kind.
//! * `random_calls_on_large_lease_keys_match_the_module`: the lease
//!   commands on keys of more leases than a summary lists, leases expiring
//!   in the middle, the live weight checked against the hash after every
//!   step.
//! * `module_and_library_share_keys`: one key served alternately by both
//!   behaves exactly like a key served by the module alone.
//!
//! Valkey 9.1 under libfaketime: both the module (CachedMicroseconds) and
//! the library (TIME) read the frozen fake clock, so results are exact.
//! Set `TB_DIFF_SEED` to replay another sequence.

use redis::Value;
use std::collections::BTreeMap;
use testkit::vectors::module_args;
use testkit::{
    hgetall, int, lazy_expiry_only, load_library, run, snapshot, FakeClock, ReplicationStream, Rng,
    Server, STREAM_MARKER,
};

const T0: i64 = 1_893_456_000_000_000; // 2030-01-01T00:00:00Z in µs
const OPS: usize = 4000;

/// Keys that hold buckets; each has usual limits, sometimes overridden.
const POOL: &[(&str, &str, &str)] = &[
    ("a", "10", "1"),
    ("b", "3", "0.5"),
    ("c", "0.5", "0.17"),
    ("d", "100", "2.5"),
    ("e", "7.25", "1000"),
    ("f", "1000000", "0.17"),
];
/// Keys that are not buckets, identical under both prefixes.
const BROKEN: &[&str] = &["str", "extra", "hexnum", "fracts"];
const MAXES: &[&str] = &[
    "1", "2", "3", "10", "0.5", "0.17", "100", "7.25", "1e6", "1e12",
];
const RATES: &[&str] = &[
    "0.17", "1", "2.5", "1000", "0.001", "3", "1e12", "100", "1e-3",
];
const GARBAGE: &[&str] = &[
    "x", "nan", "inf", "-inf", "0x10", " 1", "1 ", "1e999", "", "1e", ".", "+-1", "1,5",
];

/// One operation in the library's layout: KEYS and ARGV.
#[derive(Clone, Debug)]
struct Op {
    kind: &'static str,
    keys: Vec<String>,
    args: Vec<String>,
}

impl Op {
    /// The TB.* command on `prefix`-ed keys (MCONSUME interleaves the keys
    /// with their groups of three numbers).
    fn module(&self, prefix: &str) -> redis::Cmd {
        let keys: Vec<String> = self.keys.iter().map(|k| format!("{prefix}{k}")).collect();
        let name = match self.kind {
            "cl_throttle" => "CL.THROTTLE".to_string(),
            kind => format!("TB.{}", kind.to_uppercase()),
        };
        let mut cmd = redis::cmd(&name);
        cmd.arg(module_args(self.kind, &keys, &self.args));
        cmd
    }

    /// The FCALL (FCALL_RO for peek) on `prefix`-ed keys.
    fn library(&self, prefix: &str) -> redis::Cmd {
        let mut cmd = redis::cmd(if self.kind == "peek" || self.kind == "inflight" {
            "FCALL_RO"
        } else {
            "FCALL"
        });
        cmd.arg(format!("tb_{}", self.kind)).arg(self.keys.len());
        for k in &self.keys {
            cmd.arg(format!("{prefix}{k}"));
        }
        cmd.arg(&self.args);
        cmd
    }
}

/// The library spells arity errors with its function name.
fn module_spelling(reply: Result<Value, String>) -> Result<Value, String> {
    reply.map_err(|e| {
        [
            "consume", "peek", "mconsume", "adjust", "acquire", "release", "renew", "inflight",
        ]
        .iter()
        .fold(e, |e, k| {
            e.replace(&format!("'tb_{k}'"), &format!("'tb.{k}'"))
        })
    })
}

/// A decimal number, in one of the spellings the grammar allows.
fn spell(rng: &mut Rng, x: f64) -> String {
    match rng.below(6) {
        0 => format!("{x:e}"),
        1 => format!("+{x}"),
        _ => format!("{x}"),
    }
}

fn cost(rng: &mut Rng, max: &str) -> Option<String> {
    let m: f64 = max.parse().unwrap_or(1.0); // max may be garbage too
    Some(match rng.below(100) {
        0..=29 => "1".into(),
        30..=44 => "0".into(),
        45..=59 => max.to_string(),
        60..=79 => {
            let x = (rng.unit() * m * 1000.0).floor() / 1000.0;
            spell(rng, x)
        }
        80..=89 => return None,
        90..=94 => format!("{}", m * 2.0 + 1.0),
        95..=96 => "-1".into(),
        // Positive but at the edge of what a full bucket of max can charge.
        97 => format!("{:e}", m * 1e-16 * (0.5 + rng.unit())),
        _ => rng.pick(GARBAGE).to_string(),
    })
}

fn delta(rng: &mut Rng, max: &str) -> String {
    let m: f64 = max.parse().unwrap_or(1.0); // max may be garbage too
    let magnitude = match rng.below(8) {
        0 => 1.0,
        1 => 0.5,
        2 => m,
        3 => 2.0 * m,
        4 => 1e6,
        5 => 0.0,
        _ => (rng.unit() * m * 100.0).floor() / 100.0,
    };
    match rng.below(40) {
        0 => rng.pick(GARBAGE).to_string(),
        n if n < 20 => spell(rng, -magnitude),
        _ => spell(rng, magnitude),
    }
}

/// max and rate for `key`: usually its own, sometimes lowered, raised or
/// invalid (a random pair can break the max/rate bound, or be garbage).
fn limits(rng: &mut Rng, key: &str) -> (String, String) {
    let (_, max, rate) = POOL.iter().find(|(k, _, _)| *k == key).unwrap();
    match rng.below(100) {
        0..=79 => (max.to_string(), rate.to_string()),
        80..=89 => (rng.pick(MAXES).to_string(), rng.pick(RATES).to_string()),
        90..=95 => {
            // Anywhere in range, with 1 to 17 significant digits: extreme
            // ratios are where the retry-time rounding correction works.
            let max = wild(rng, -3.0, 12.0);
            let rate = wild(rng, -3.0, 12.0);
            (max, rate)
        }
        96 => (rng.pick(GARBAGE).to_string(), rate.to_string()),
        97 => (max.to_string(), rng.pick(GARBAGE).to_string()),
        98 => ("0".into(), rate.to_string()),
        _ => (max.to_string(), "-1".into()),
    }
}

/// A random decimal of magnitude 10^lo..10^hi, printed with a random
/// number of significant digits.
fn wild(rng: &mut Rng, lo: f64, hi: f64) -> String {
    let x = 10f64.powf(lo + rng.unit() * (hi - lo));
    let digits = 1 + rng.below(17) as usize;
    format!("{x:.*e}", digits - 1)
}

fn bucket_key(rng: &mut Rng) -> String {
    if rng.chance(0.03) {
        rng.pick(BROKEN).to_string()
    } else {
        rng.pick(POOL).0.to_string()
    }
}

fn random_op(rng: &mut Rng) -> Op {
    let roll = rng.below(100);
    let kind = match roll {
        0..=39 => "consume",
        40..=54 => "peek",
        55..=69 => "adjust",
        70..=89 => "mconsume",
        90..=96 => return throttle_op(rng),
        _ => return arity_op(rng),
    };
    if kind == "mconsume" {
        let n = 1 + rng.below(4) as usize;
        let mut keys: Vec<String> = Vec::new();
        let mut args = Vec::new();
        for _ in 0..n {
            let mut key = bucket_key(rng);
            // Mostly distinct keys; now and then a duplicate on purpose.
            while keys.contains(&key) && !rng.chance(0.1) {
                key = bucket_key(rng);
            }
            let base = if BROKEN.contains(&key.as_str()) {
                "a"
            } else {
                &key
            };
            let (max, rate) = limits(rng, base);
            let c = cost(rng, &max).unwrap_or_else(|| "1".into());
            keys.push(key);
            args.extend([max, rate, c]);
        }
        return Op { kind, keys, args };
    }
    let key = bucket_key(rng);
    let base = if BROKEN.contains(&key.as_str()) {
        "a"
    } else {
        &key
    };
    let (max, rate) = limits(rng, base);
    let mut args = vec![max.clone(), rate];
    if kind == "adjust" {
        args.push(delta(rng, &max));
    } else if let Some(c) = cost(rng, &max) {
        args.push(c);
    }
    if kind != "adjust" && rng.chance(0.35) {
        // A reservation: waits from none to past what the floor allows,
        // now and then a bad keyword or time.
        let max_ms = match rng.below(10) {
            0 => rng.pick(&["-1", "1.5", "x", "100000000000001"]).to_string(),
            1 => "0".to_string(),
            2..=5 => rng.below(5_000).to_string(),
            _ => rng.below(100_000_000).to_string(),
        };
        let word = *rng.pick(&["WAIT", "wait", "WAIT", "WAIT", "WAIT", "WAITS"]);
        // A whole bucket's cost, often: the next call is short of it.
        if rng.chance(0.7) {
            args.truncate(2);
            args.push(max);
        }
        args.extend([word.to_string(), max_ms]);
    }
    Op {
        kind,
        keys: vec![key],
        args,
    }
}

/// A CL.THROTTLE on a bucket key: integer limits (sometimes bad ones), a
/// quantity that is omitted, 0, fits, is above the limit or is garbage.
fn throttle_op(rng: &mut Rng) -> Op {
    let key = rng.pick(POOL).0.to_string();
    let burst = *rng.pick(&["0", "1", "2", "9", "15", "99", "999999", "-1", "1.5"]);
    let count = *rng.pick(&["1", "2", "30", "1000", "7", "0"]);
    let period = *rng.pick(&["1", "2", "60", "3600", "x"]);
    let mut args: Vec<String> = [burst, count, period].map(String::from).to_vec();
    match rng.below(8) {
        0 => {}
        1 => args.push("0".into()),
        2 => args.push("1000001".into()),
        3 => args.push(rng.pick(&["-1", "1e3", "x"]).to_string()),
        _ => args.push((1 + rng.below(3)).to_string()),
    }
    Op {
        kind: "cl_throttle",
        keys: vec![key],
        args,
    }
}

/// Wrong argument counts that are arity errors for both forms (for
/// MCONSUME: ARGV one or two off a multiple of three, or nothing at all).
fn arity_op(rng: &mut Rng) -> Op {
    let key = rng.pick(POOL).0.to_string();
    let numbers = |n: usize| vec!["1".to_string(); n];
    match rng.below(4) {
        0 => Op {
            kind: "consume",
            keys: vec![key],
            args: numbers(*rng.pick(&[0, 1, 6])),
        },
        1 => Op {
            kind: "peek",
            keys: vec![key],
            args: numbers(*rng.pick(&[0, 1, 6])),
        },
        2 => Op {
            kind: "adjust",
            keys: vec![key],
            args: numbers(*rng.pick(&[2, 4])),
        },
        _ => {
            let n = rng.below(3) as usize;
            let keys: Vec<String> = POOL[..n].iter().map(|p| p.0.to_string()).collect();
            let args = match (n, rng.below(2)) {
                (0, _) => Vec::new(),
                (_, 0) => numbers(3 * n - 1),
                _ => numbers(3 * n + 2),
            };
            Op {
                kind: "mconsume",
                keys,
                args,
            }
        }
    }
}

/// How far the clock moves before the next operation, in µs: of 100
/// rolls, those below `ends[0]` not at all, then below each next end by
/// under a ms, by up to `ms` ms, by up to `s` seconds, and the rest back by
/// up to 10 s.
struct Steps {
    ends: [u64; 4],
    ms: u64,
    s: u64,
}

const BUCKET_STEPS: Steps = Steps {
    ends: [30, 55, 80, 95],
    ms: 5_000,
    s: 100,
};

/// Leases of a few ms to a minute expire now and then.
const LEASE_STEPS: Steps = Steps {
    ends: [25, 45, 80, 92],
    ms: 3_000,
    s: 60,
};

impl Steps {
    fn step(&self, rng: &mut Rng) -> i64 {
        let roll = rng.below(100);
        let [still, sub_ms, ms, s] = self.ends;
        if roll < still {
            0
        } else if roll < sub_ms {
            1 + rng.below(999) as i64
        } else if roll < ms {
            1_000 * (1 + rng.below(self.ms) as i64) + rng.below(1_000) as i64
        } else if roll < s {
            1_000_000 * (1 + rng.below(self.s) as i64) + rng.below(1_000_000) as i64
        } else {
            -(1 + rng.below(10_000_000) as i64)
        }
    }
}

/// A bucket's stored state: `tokens` as the f64's bits, `ts`, expire time.
/// A redis-cell key (a string) shows as bits 0 and `tat:<its text>`.
type State = Option<(u64, String, i64)>;

fn state(c: &mut redis::Connection, key: &str) -> State {
    let kind: String = redis::cmd("TYPE").arg(key).query(c).unwrap();
    if kind == "string" {
        let text: String = redis::cmd("GET").arg(key).query(c).unwrap();
        return Some((0, format!("tat:{text}"), int(c, "PEXPIRETIME", key)));
    }
    let h = hgetall(c, key);
    if h.is_empty() {
        assert_eq!(int(c, "EXISTS", key), 0, "{key} is an empty hash?");
        return None;
    }
    assert_eq!(h.len(), 2, "{key}: {h:?}");
    let tokens: f64 = h["tokens"]
        .parse()
        .unwrap_or_else(|_| panic!("{key}: {h:?}"));
    assert!(
        tokens.is_finite() && !h["tokens"].contains("inf"),
        "{key}: {h:?}"
    );
    Some((
        tokens.to_bits(),
        h["ts"].clone(),
        int(c, "PEXPIRETIME", key),
    ))
}

/// Writes the same random stored state to `key` under both prefixes, as a
/// clock step or a failover leaves it: a balance in or out of [-max, max]
/// and a `ts` up to an hour either side of `now`, often ahead of it.
/// Returns how far ahead `ts` is (negative: behind).
fn plant(c: &mut redis::Connection, rng: &mut Rng, key: &str, now: i64) -> i64 {
    let (_, max, _) = POOL.iter().find(|(k, _, _)| *k == key).unwrap();
    let m: f64 = max.parse().unwrap();
    let balance = m * (3.0 * rng.unit() - 1.5);
    let tokens = if rng.chance(0.5) {
        format!("{balance:e}")
    } else {
        format!("{balance}")
    };
    let reach = *rng.pick(&[1_000i64, 1_000_000, 60_000_000, 3_600_000_000]);
    let ahead = (reach as f64 * (2.0 * rng.unit() - 0.5)) as i64;
    let expire_at_ms = (now + ahead.max(0)) / 1000 + 1 + rng.below(7_200_000) as i64;
    for p in ["m:", "l:"] {
        let k = format!("{p}{key}");
        let _: () = redis::cmd("DEL").arg(&k).query(c).unwrap();
        let _: () = redis::cmd("HSET")
            .arg(&k)
            .arg("tokens")
            .arg(&tokens)
            .arg("ts")
            .arg(now + ahead)
            .query(c)
            .unwrap();
        let _: () = redis::cmd("PEXPIREAT")
            .arg(&k)
            .arg(expire_at_ms)
            .query(c)
            .unwrap();
    }
    ahead
}

/// Writes the same key redis-cell would have left to `key` under both
/// prefixes: its TAT, in ns, up to an hour either side of `now`.
fn plant_cell(c: &mut redis::Connection, rng: &mut Rng, key: &str, now: i64) {
    let reach = *rng.pick(&[1_000i64, 1_000_000, 60_000_000, 3_600_000_000]);
    let tat_us = now + (reach as f64 * (2.0 * rng.unit() - 0.5)) as i64;
    let tat = (tat_us * 1000 + rng.below(1000) as i64).to_string();
    for p in ["m:", "l:"] {
        let _: () = redis::cmd("SET")
            .arg(format!("{p}{key}"))
            .arg(&tat)
            .query(c)
            .unwrap();
    }
}

/// The seed of a random sequence: `TB_DIFF_SEED`, else the test's own.
fn seed(default: u64) -> u64 {
    std::env::var("TB_DIFF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// A server on a fake clock at `T0`, with the library loaded.
fn library_on_fake_clock() -> (FakeClock, Server, redis::Connection) {
    let clock = FakeClock::new(T0);
    // Active expiry on a stepped clock stops after a key or two, so it
    // would expire one side of a pair and not the other: keys expire
    // only when an op opens them, on both sides alike.
    let s = lazy_expiry_only(clock.config());
    let mut c = s.conn();
    load_library(&mut c);
    (clock, s, c)
}

/// Reads `keys` under both prefixes, so that a key due to expire is
/// expired on both sides alike.
fn expire_due<'k>(c: &mut redis::Connection, keys: impl IntoIterator<Item = &'k str>) {
    for k in keys {
        for p in ["m:", "l:"] {
            int(c, "EXISTS", format!("{p}{k}"));
        }
    }
}

/// `op` through the module on `m:` keys and the library on `l:` keys: the
/// same reply (the module's, returned).
fn same_reply(c: &mut redis::Connection, op: &Op, ctx: &str) -> Result<Value, String> {
    let by_module = run(c, &op.module("m:"));
    let by_library = module_spelling(run(c, &op.library("l:")));
    assert_eq!(by_library, by_module, "{ctx}");
    by_module
}

/// Call `i` of a key the module and the library take turns on
/// (`shared:`), against the module alone (`alone:`): the same reply.
fn shared_is_alone(c: &mut redis::Connection, op: &Op, i: usize) -> Result<Value, String> {
    let shared = if i.is_multiple_of(2) {
        run(c, &op.module("shared:"))
    } else {
        run(c, &op.library("shared:"))
    };
    assert_eq!(shared, run(c, &op.module("alone:")), "call {i}: {op:?}");
    shared
}

/// How many lease calls were done (`[1, ...]`) and not, by kind.
#[derive(Default, Debug)]
struct Done {
    acquired: usize,
    denied: usize,
    released: usize,
    renewed: usize,
}

impl Done {
    fn count(&mut self, kind: &str, reply: &Result<Value, String>) {
        if let Ok(Value::Array(r)) = reply {
            let done = usize::from(r[0] == Value::Int(1));
            match kind {
                "acquire" => {
                    self.acquired += done;
                    self.denied += 1 - done;
                }
                "release" => self.released += done,
                "renew" => self.renewed += done,
                _ => {}
            }
        }
    }
}

/// Buckets and non-buckets, identical under both prefixes.
fn setup_keys(c: &mut redis::Connection) {
    for p in ["m:", "l:"] {
        let _: () = redis::cmd("SET")
            .arg(format!("{p}str"))
            .arg("1")
            .query(c)
            .unwrap();
        for (key, fields) in [
            ("extra", vec![("tokens", "1"), ("ts", "1"), ("x", "1")]),
            ("hexnum", vec![("tokens", "0x10"), ("ts", "1")]),
            ("fracts", vec![("tokens", "1"), ("ts", "1.5")]),
        ] {
            let _: () = redis::cmd("HSET")
                .arg(format!("{p}{key}"))
                .arg(fields)
                .query(c)
                .unwrap();
        }
    }
}

#[derive(Default, Debug)]
struct Tally {
    admitted: usize,
    denied: usize,
    errors: BTreeMap<String, usize>,
    deletes: usize,
    debts: usize,
    backwards: usize,
    mconsume_denied: usize,
    planted_ahead: usize,
    cl_ops: usize,
    cl_limited: usize,
    cl_converted: usize,
    ops_on_future_ts: usize,
    too_small: usize,
    /// Reservations admitted with a wait (`WAIT max_ms`).
    reservations: usize,
    /// Calls that replicated something.
    replicated: usize,
}

/// What a call on `prefix`-ed `keys` replicated, in a form both sides
/// share: keys without the prefix, `tokens` as the bits of the double it
/// spells (the library writes 17 significant digits, the module the
/// shortest text), SELECT left out, and only commands on the call's keys
/// (the server's background expiry may delete another key meanwhile).
fn effects(stream: Vec<Vec<String>>, prefix: &str, keys: &[String]) -> Vec<Vec<String>> {
    let ours = |k: &str| {
        k.strip_prefix(prefix)
            .is_some_and(|k| keys.iter().any(|key| key == k))
    };
    stream
        .into_iter()
        .filter(|cmd| match cmd[0].to_uppercase().as_str() {
            "SELECT" => false,
            "MULTI" | "EXEC" => true,
            _ => cmd.get(1).is_some_and(|k| ours(k)),
        })
        .map(|mut cmd| {
            if let Some(k) = cmd.get_mut(1) {
                *k = k.trim_start_matches(prefix).to_string();
            }
            if cmd[0].eq_ignore_ascii_case("HSET") && cmd.len() == 6 && cmd[2] == "tokens" {
                if let Ok(t) = cmd[3].parse::<f64>() {
                    cmd[3] = format!("bits {:#x}", t.to_bits());
                }
            }
            cmd
        })
        .collect()
}

#[test]
fn random_sequence_matches_the_module() {
    let seed = seed(0x7B5E_ED00_2030_0101);
    let mut rng = Rng(seed);
    let (clock, s, mut c) = library_on_fake_clock();
    setup_keys(&mut c);
    let mut now = T0;
    let mut stream = ReplicationStream::attach_ticking(&s, || {
        now += 1000;
        clock.set(now);
    });

    let mut tally = Tally::default();
    for i in 0..OPS {
        let dt = BUCKET_STEPS.step(&mut rng);
        if dt < 0 {
            // Expire, at the current time, every key that is due, on both
            // sides alike: the server's background expiry may have taken
            // one side's key and not yet the other's, which a step back
            // would otherwise bring to light.
            expire_due(&mut c, POOL.iter().map(|p| p.0));
            tally.backwards += 1;
        }
        if dt != 0 {
            now += dt;
            clock.set(now);
        }
        if rng.chance(0.05) {
            let key = rng.pick(POOL).0;
            if plant(&mut c, &mut rng, key, now) > 0 {
                tally.planted_ahead += 1;
            }
        }
        if rng.chance(0.02) {
            let key = rng.pick(POOL).0;
            plant_cell(&mut c, &mut rng, key, now);
        }
        let op = random_op(&mut rng);
        let ctx = || format!("op {i} (seed {seed:#x}, clock T0{:+}us): {op:?}", now - T0);
        let before: Vec<State> = op
            .keys
            .iter()
            .filter(|k| !BROKEN.contains(&k.as_str()))
            .map(|k| state(&mut c, &format!("m:{k}")))
            .collect();
        if before
            .iter()
            .flatten()
            .any(|(_, ts, _)| ts.parse::<i64>().is_ok_and(|ts| ts > now))
        {
            tally.ops_on_future_ts += 1;
        }

        // Both sides' keys equally expired or not, then the stream so far
        // set aside: what follows is the calls' own.
        expire_due(&mut c, op.keys.iter().map(String::as_str));
        stream.take(&mut c);
        let by_module = run(&mut c, &op.module("m:"));
        let module_sent = effects(stream.take(&mut c), "m:", &op.keys);
        let by_library = module_spelling(run(&mut c, &op.library("l:")));
        let library_sent = effects(stream.take(&mut c), "l:", &op.keys);
        assert_eq!(by_library, by_module, "{}", ctx());
        assert_eq!(library_sent, module_sent, "replicated by {}", ctx());
        tally.replicated += usize::from(!module_sent.is_empty());

        for k in op.keys.iter().filter(|k| !BROKEN.contains(&k.as_str())) {
            let m = state(&mut c, &format!("m:{k}"));
            let l = state(&mut c, &format!("l:{k}"));
            assert_eq!(l, m, "state of {k} after {}", ctx());
        }

        // What the sequence exercised, so a dull generator fails the test.
        match &by_module {
            Err(e) => {
                if e.contains("too small to charge") {
                    tally.too_small += 1;
                }
                let kind = e.split(':').next().unwrap_or(e).to_string();
                *tally.errors.entry(kind).or_default() += 1;
            }
            Ok(Value::Array(r)) if op.kind == "cl_throttle" => {
                tally.cl_ops += 1;
                tally.cl_limited += usize::from(r.first() == Some(&Value::Int(1)));
            }
            Ok(Value::Array(r)) => {
                if r.first() == Some(&Value::Int(1)) {
                    tally.admitted += 1;
                } else {
                    tally.denied += 1;
                    if op.kind == "mconsume"
                        && r.iter().any(
                            |b| matches!(b, Value::Array(b) if b.first() == Some(&Value::Int(1))),
                        )
                    {
                        tally.mconsume_denied += 1;
                    }
                }
                if op.kind == "adjust" && matches!(r.get(1), Some(Value::Int(n)) if *n < 0) {
                    tally.debts += 1;
                }
                if op.kind != "adjust"
                    && r.first() == Some(&Value::Int(1))
                    && matches!(r.get(2), Some(Value::Int(n)) if *n > 0)
                {
                    tally.reservations += 1;
                }
            }
            Ok(v) => panic!("unexpected reply {v:?} to {}", ctx()),
        }
        let after: Vec<State> = op
            .keys
            .iter()
            .filter(|k| !BROKEN.contains(&k.as_str()))
            .map(|k| state(&mut c, &format!("m:{k}")))
            .collect();
        tally.deletes += before
            .iter()
            .zip(&after)
            .filter(|(b, a)| b.is_some() && a.is_none())
            .count();
        let is_cell = |s: &State| s.as_ref().is_some_and(|(_, ts, _)| ts.starts_with("tat:"));
        tally.cl_converted += before
            .iter()
            .zip(&after)
            .filter(|(b, a)| is_cell(b) && a.is_some() && !is_cell(a))
            .count();
    }
    // Keys redis-cell left that no call converted: the same on both sides.
    for (k, _, _) in POOL {
        let (m, l) = (
            state(&mut c, &format!("m:{k}")),
            state(&mut c, &format!("l:{k}")),
        );
        assert_eq!(l, m, "{k} at the end");
        if m.as_ref().is_some_and(|(_, ts, _)| ts.starts_with("tat:")) {
            for p in ["m:", "l:"] {
                assert_eq!(int(&mut c, "DEL", format!("{p}{k}")), 1);
            }
        }
    }

    assert_eq!(int(&mut c, "DEL", STREAM_MARKER), 1);
    // The non-buckets were never written; then drop them, and compare the
    // whole dataset: same keys, same contents, under both prefixes.
    for p in ["m:", "l:"] {
        let v: String = redis::cmd("GET")
            .arg(format!("{p}str"))
            .query(&mut c)
            .unwrap();
        assert_eq!(v, "1");
        assert_eq!(hgetall(&mut c, format!("{p}extra")).len(), 3);
        assert_eq!(hgetall(&mut c, format!("{p}hexnum"))["tokens"], "0x10");
        assert_eq!(hgetall(&mut c, format!("{p}fracts"))["ts"], "1.5");
        for b in BROKEN {
            assert_eq!(int(&mut c, "DEL", format!("{p}{b}")), 1);
        }
    }
    let all = snapshot(&mut c);
    let side = |p: &str| -> BTreeMap<Vec<u8>, _> {
        all.iter()
            .filter_map(|(k, v)| k.strip_prefix(p.as_bytes()).map(|k| (k.to_vec(), v)))
            .collect()
    };
    let (m, l) = (side("m:"), side("l:"));
    assert_eq!(
        l.keys().collect::<Vec<_>>(),
        m.keys().collect::<Vec<_>>(),
        "same keys"
    );
    assert_eq!(m.len() + l.len(), all.len(), "no other keys");
    for (k, v) in &m {
        let (mh, ma) = v;
        let (lh, la) = l[k];
        assert_eq!((&lh["ts"], la), (&mh["ts"], ma), "{k:?}");
        let bits = |h: &BTreeMap<String, String>| h["tokens"].parse::<f64>().unwrap().to_bits();
        assert_eq!(bits(lh), bits(mh), "{k:?}");
    }

    eprintln!("{tally:?}");
    assert!(tally.admitted > OPS / 4, "{tally:?}");
    assert!(tally.denied > OPS / 20, "{tally:?}");
    assert!(tally.mconsume_denied > 20, "{tally:?}");
    assert!(tally.deletes > 20, "{tally:?}");
    assert!(tally.debts > 20, "{tally:?}");
    assert!(tally.reservations > 20, "{tally:?}");
    assert!(tally.backwards > 20, "{tally:?}");
    assert!(tally.errors.len() >= 8, "{tally:?}");
    assert!(tally.planted_ahead > 50, "{tally:?}");
    assert!(tally.ops_on_future_ts > 200, "{tally:?}");
    assert!(tally.replicated > OPS / 4, "{tally:?}");
    assert!(tally.too_small >= 3, "{tally:?}");
    assert!(tally.cl_ops > 60 && tally.cl_limited > 20, "{tally:?}");
    assert!(tally.cl_converted >= 3, "{tally:?}");
}

/// Alternates the module and the library on `shared:k`, and runs the same
/// calls through the module alone on `alone:k`: a caller cannot tell the
/// two apart, whichever served the previous call.
#[test]
fn module_and_library_share_keys() {
    let (clock, _s, mut c) = library_on_fake_clock();
    let mut rng = Rng(42);
    let mut now = T0;
    let mut denied = 0;
    for i in 0..600 {
        now += rng.below(400_000) as i64 - 20_000;
        clock.set(now);
        let (kind, third) = match rng.below(3) {
            0 => ("consume", *rng.pick(&["1", "2", "0", "2.5", "5"])),
            1 => ("peek", *rng.pick(&["1", "3", "5"])),
            _ => ("adjust", *rng.pick(&["1", "-1", "-7.5", "2.25", "9"])),
        };
        let op = Op {
            kind,
            keys: vec!["k".into()],
            args: vec!["5".into(), "2".into(), third.into()],
        };
        let shared = shared_is_alone(&mut c, &op, i);
        assert!(shared.is_ok(), "call {i}: {shared:?}");
        if let Ok(Value::Array(r)) = &shared {
            denied += usize::from(r[0] == Value::Int(0));
        }
        assert_eq!(
            state(&mut c, "shared:k"),
            state(&mut c, "alone:k"),
            "call {i}: {op:?}"
        );
    }
    assert!(denied > 50, "only {denied} denials");
}

// ---- leases ------------------------------------------------------------------

/// Keys that hold leases.
const LEASE_POOL: &[&str] = &["s1", "s2", "s3"];
const IDS: &[&str] = &["a", "b", "c", "d", "e", "f", "g", "h"];
const LEASE_MS: &[&str] = &[
    "1", "2", "5", "20", "100", "500", "1000", "3000", "10000", "60000", "86400000",
];
const LIMITS: &[&str] = &["1", "2", "3", "4", "5", "8", "+3", "003"];
const BAD_INTS: &[&str] = &[
    "0",
    "-1",
    "x",
    "1.5",
    "1e3",
    "",
    " 1",
    "1000001",
    "86400001",
    "9223372036854775808",
];

fn lease_id(rng: &mut Rng) -> String {
    match rng.below(100) {
        0 => String::new(),
        1 => "i".repeat(257),
        2 => "i".repeat(256),
        _ => rng.pick(IDS).to_string(),
    }
}

/// A key for a lease command: mostly a lease key, now and then a bucket
/// or a key that is neither.
fn lease_key(rng: &mut Rng) -> String {
    match rng.below(100) {
        0..=89 => rng.pick(LEASE_POOL).to_string(),
        90..=95 => rng.pick(POOL).0.to_string(),
        _ => rng.pick(BROKEN).to_string(),
    }
}

fn int_arg(rng: &mut Rng, good: &[&str]) -> String {
    if rng.chance(0.03) {
        rng.pick(BAD_INTS).to_string()
    } else {
        rng.pick(good).to_string()
    }
}

fn random_lease_op(rng: &mut Rng) -> Op {
    let roll = rng.below(100);
    let key = lease_key(rng);
    match roll {
        0..=41 => {
            let limit = int_arg(rng, LIMITS);
            let mut args = vec![limit.clone(), int_arg(rng, LEASE_MS), lease_id(rng)];
            if rng.chance(0.5) {
                let l: u64 = limit.trim_start_matches('+').parse().unwrap_or(3).max(1);
                args.push(match rng.below(100) {
                    0..=2 => rng.pick(BAD_INTS).to_string(),
                    3..=7 => (l + 1).to_string(),
                    _ => (1 + rng.below(l)).to_string(),
                });
            }
            let mut keys = vec![key.clone()];
            let clauses = match rng.below(100) {
                0..=59 => 0,
                60..=84 => 1,
                _ => 2 + rng.below(2),
            };
            for _ in 0..clauses {
                let b = match rng.below(100) {
                    0..=91 => rng.pick(POOL).0.to_string(),
                    92..=93 => key.clone(),
                    94..=95 => keys.last().cloned().unwrap_or_default(),
                    96..=97 => rng.pick(LEASE_POOL).to_string(),
                    _ => rng.pick(BROKEN).to_string(),
                };
                let base = POOL.iter().find(|p| p.0 == b).map_or("a", |p| p.0);
                let (max, rate) = limits(rng, base);
                let c = cost(rng, &max).unwrap_or_else(|| "1".into());
                keys.push(b);
                args.extend([max, rate, c]);
            }
            Op {
                kind: "acquire",
                keys,
                args,
            }
        }
        42..=63 => Op {
            kind: "release",
            keys: vec![key],
            args: vec![lease_id(rng)],
        },
        64..=85 => Op {
            kind: "renew",
            keys: vec![key],
            args: vec![lease_id(rng), int_arg(rng, LEASE_MS)],
        },
        86..=93 => Op {
            kind: "inflight",
            keys: vec![key],
            args: vec![],
        },
        94..=95 => {
            // Argument counts that are arity errors for both forms.
            let (kind, n) = *rng.pick(&[
                ("acquire", 2),
                ("acquire", 5),
                ("release", 0),
                ("release", 2),
                ("renew", 1),
                ("renew", 3),
                ("inflight", 1),
            ]);
            Op {
                kind,
                keys: vec![key],
                args: vec!["1".to_string(); n],
            }
        }
        // Buckets change too, for the BUCKET clauses to meet every state.
        _ => random_op(rng),
    }
}

/// Writes the same lease hash to `key` under both prefixes, as another
/// client, a clock step or a crash leaves it: a few leases, some expired,
/// some with leading zeros, and a key expiry at or after the latest one
/// (or none).
fn plant_leases(c: &mut redis::Connection, rng: &mut Rng, key: &str, now: i64) {
    let mut fields = Vec::new();
    let mut latest = 0;
    for _ in 0..1 + rng.below(6) {
        let id = rng.pick(IDS).to_string();
        let expires = now - 2_000_000 + rng.below(62_000_000) as i64;
        latest = latest.max(expires);
        let zeros = if rng.chance(0.1) { "00" } else { "" };
        let weight = 1 + rng.below(3);
        fields.push((id, format!("{zeros}{expires}:{zeros}{weight}")));
    }
    let expire_at_ms = (latest > now && !rng.chance(0.1))
        .then(|| latest.div_euclid(1000) + 1 + rng.below(3) as i64);
    for p in ["m:", "l:"] {
        let k = format!("{p}{key}");
        let _: () = redis::cmd("DEL").arg(&k).query(c).unwrap();
        for (id, value) in &fields {
            let _: () = redis::cmd("HSET")
                .arg(&k)
                .arg(id)
                .arg(value)
                .query(c)
                .unwrap();
        }
        if let Some(at) = expire_at_ms {
            let _: () = redis::cmd("PEXPIREAT").arg(&k).arg(at).query(c).unwrap();
        }
    }
}

/// Any key's state, for comparing the two sides: its type, its contents
/// (a bucket's `tokens` as the f64's bits: the library writes 17 digits)
/// and its expire time.
fn any_state(c: &mut redis::Connection, key: &str) -> (String, BTreeMap<String, String>, i64) {
    let kind: String = redis::cmd("TYPE").arg(key).query(c).unwrap();
    let mut contents = BTreeMap::new();
    match kind.as_str() {
        "hash" => {
            contents = hgetall(c, key);
            if let Some(tokens) = contents.get_mut("tokens") {
                if let Ok(x) = tokens.parse::<f64>() {
                    *tokens = format!("bits {:#x}", x.to_bits());
                }
            }
        }
        "string" => {
            let v: String = redis::cmd("GET").arg(key).query(c).unwrap();
            contents.insert(String::new(), v);
        }
        _ => {}
    }
    (kind, contents, int(c, "PEXPIRETIME", key))
}

/// The live leases of `key` (a hash) at `now`: how many, and how many of
/// its fields have expired.
fn lease_counts(c: &mut redis::Connection, key: &str, now: i64) -> (usize, usize) {
    let h = hgetall(c, key);
    let ends: Vec<i64> = h
        .values()
        .filter_map(|v| v.split(':').next()?.parse().ok())
        .collect();
    let live = ends.iter().filter(|&&e| now < e).count();
    (live, ends.len() - live)
}

#[derive(Default, Debug)]
struct LeaseTally {
    acquired: usize,
    acquired_with_buckets: usize,
    reacquired: usize,
    full: usize,
    buckets_short: usize,
    released: usize,
    released_last: usize,
    release_unknown: usize,
    renewed: usize,
    renew_lost: usize,
    inflight_busy: usize,
    pruned: usize,
    errors: BTreeMap<String, usize>,
    backwards: usize,
    planted: usize,
}

#[test]
fn random_lease_sequence_matches_the_module() {
    let seed = seed(0x1EA5_ED00_2030_0101);
    let mut rng = Rng(seed);
    let (clock, _s, mut c) = library_on_fake_clock();
    setup_keys(&mut c);

    let mut now = T0;
    let mut tally = LeaseTally::default();
    for i in 0..OPS {
        let dt = LEASE_STEPS.step(&mut rng);
        if dt < 0 {
            // As in the bucket sequence: expire what is due on both sides
            // before the clock steps back.
            expire_due(
                &mut c,
                POOL.iter().map(|p| p.0).chain(LEASE_POOL.iter().copied()),
            );
            tally.backwards += 1;
        }
        if dt != 0 {
            now += dt;
            clock.set(now);
        }
        if rng.chance(0.04) {
            let key = rng.pick(LEASE_POOL);
            plant_leases(&mut c, &mut rng, key, now);
            tally.planted += 1;
        }
        if rng.chance(0.02) {
            let key = rng.pick(POOL).0;
            plant(&mut c, &mut rng, key, now);
        }
        let mut op = random_lease_op(&mut rng);
        // Mostly release and renew ids the key holds, live or expired; now
        // and then acquire one again.
        let id_at = match op.kind {
            "release" | "renew" if rng.chance(0.7) => Some(0),
            "acquire" if rng.chance(0.3) => Some(2),
            _ => None,
        };
        if let Some(at) = id_at.filter(|&at| op.args.len() > at) {
            let held: Vec<String> = any_state(&mut c, &format!("m:{}", op.keys[0]))
                .1
                .into_keys()
                .filter(|id| !id.is_empty())
                .collect();
            if !held.is_empty() {
                op.args[at] = rng.pick(&held).clone();
            }
        }
        let ctx = || format!("op {i} (seed {seed:#x}, clock T0{:+}us): {op:?}", now - T0);
        let lease_key = format!("m:{}", op.keys.first().map_or("", String::as_str));
        let is_lease_op = ["acquire", "release", "renew", "inflight"].contains(&op.kind);
        let before = any_state(&mut c, &lease_key);
        let states = |c: &mut redis::Connection| -> Vec<_> {
            op.keys
                .iter()
                .map(|k| any_state(c, &format!("m:{k}")))
                .collect()
        };
        let all_before = states(&mut c);
        let (live_before, expired_before) = if is_lease_op && before.0 == "hash" {
            lease_counts(&mut c, &lease_key, now)
        } else {
            (0, 0)
        };
        let had_id = |id: &str| {
            before
                .1
                .get(id)
                .and_then(|v| v.split(':').next()?.parse::<i64>().ok())
                .is_some_and(|e| now < e)
        };

        let by_module = same_reply(&mut c, &op, &ctx());
        let mut seen = Vec::new();
        for k in &op.keys {
            if seen.contains(&k) {
                continue;
            }
            seen.push(k);
            let m = any_state(&mut c, &format!("m:{k}"));
            let l = any_state(&mut c, &format!("l:{k}"));
            assert_eq!(l, m, "state of {k} after {}", ctx());
        }

        // What the sequence exercised, so a dull generator fails the test.
        let after = any_state(&mut c, &lease_key);
        let ints = |v: &Value| -> Vec<i64> {
            match v {
                Value::Array(a) => a
                    .iter()
                    .take(4)
                    .map(|x| redis::from_redis_value(x).unwrap_or(-1))
                    .collect(),
                Value::Int(n) => vec![*n],
                _ => vec![],
            }
        };
        match (&by_module, op.kind) {
            (Err(e), _) => {
                let kind = e.split(':').next().unwrap_or(e).to_string();
                *tally.errors.entry(kind).or_default() += 1;
            }
            (Ok(v), "acquire") => {
                let r = ints(v);
                if r[0] == 1 {
                    tally.acquired += 1;
                    tally.acquired_with_buckets += usize::from(op.keys.len() > 1);
                    tally.reacquired += usize::from(had_id(&op.args[2]));
                    if expired_before > 0 {
                        tally.pruned += 1;
                        let (_, expired_after) = lease_counts(&mut c, &lease_key, now);
                        assert_eq!(expired_after, 0, "{}", ctx());
                    }
                } else {
                    assert_eq!(states(&mut c), all_before, "a denial wrote: {}", ctx());
                    let weight: i64 = op
                        .args
                        .get(3)
                        .filter(|_| op.args.len() % 3 == 1)
                        .map_or(1, |w| w.parse().unwrap());
                    let limit: i64 = op.args[0].trim_start_matches('+').parse().unwrap();
                    if r[1] - i64::from(had_id(&op.args[2])) + weight > limit {
                        tally.full += 1;
                    } else {
                        tally.buckets_short += 1;
                    }
                }
            }
            (Ok(v), "release") => {
                let r = ints(v);
                if r[0] == 1 {
                    tally.released += 1;
                    tally.released_last += usize::from(after.0 == "none");
                } else {
                    tally.release_unknown += 1;
                    assert_eq!(after, before, "{}", ctx());
                }
            }
            (Ok(v), "renew") => {
                let r = ints(v);
                if r[0] == 1 {
                    tally.renewed += 1;
                } else {
                    tally.renew_lost += usize::from(before.1.contains_key(&op.args[0]));
                    assert_eq!(after, before, "{}", ctx());
                }
            }
            (Ok(v), "inflight") => {
                tally.inflight_busy += usize::from(ints(v)[0] > 0 && live_before > 0);
            }
            _ => {}
        }
    }

    // The whole dataset: same keys, same contents, under both prefixes.
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    let side = |c: &mut redis::Connection, p: &str| -> BTreeMap<String, _> {
        keys.iter()
            .filter_map(|k| k.strip_prefix(p))
            .map(|k| (k.to_string(), any_state(c, &format!("{p}{k}"))))
            .collect()
    };
    let (m, l) = (side(&mut c, "m:"), side(&mut c, "l:"));
    assert_eq!(l, m, "the datasets");
    assert_eq!(m.len() + l.len(), keys.len(), "no other keys");

    eprintln!("{tally:?}");
    // About half what the default seed and seeds 1 to 4 gave.
    assert!(tally.acquired > OPS / 10, "{tally:?}");
    assert!(tally.acquired_with_buckets > 100, "{tally:?}");
    assert!(tally.reacquired > 50, "{tally:?}");
    assert!(tally.full > 70, "{tally:?}");
    assert!(tally.buckets_short > 20, "{tally:?}");
    assert!(
        tally.released > 100 && tally.released_last > 70,
        "{tally:?}"
    );
    assert!(tally.release_unknown > 200, "{tally:?}");
    assert!(tally.renewed > 100 && tally.renew_lost > 10, "{tally:?}");
    assert!(tally.inflight_busy > 50, "{tally:?}");
    assert!(tally.pruned > 20, "{tally:?}");
    assert!(tally.backwards > 100, "{tally:?}");
    assert!(tally.planted > 100, "{tally:?}");
    assert!(tally.errors.len() >= 10, "{tally:?}");
}

/// `module_and_library_share_keys` for a lease key: leases taken through
/// one are renewed, released and counted through the other.
#[test]
fn module_and_library_share_lease_keys() {
    let (clock, _s, mut c) = library_on_fake_clock();
    let mut rng = Rng(21);
    let mut now = T0;
    let mut done = Done::default();
    for i in 0..600 {
        now += rng.below(400_000) as i64 - 20_000;
        clock.set(now);
        let id = rng.pick(&IDS[..5]).to_string();
        let (kind, args) = match rng.below(8) {
            0..=3 => {
                let lease_ms = rng.pick(&["300", "1000", "3000"]).to_string();
                let weight = rng.pick(&["1", "2"]).to_string();
                ("acquire", vec!["4".into(), lease_ms, id, weight])
            }
            4 => ("release", vec![id]),
            5 => ("renew", vec![id, "1000".into()]),
            _ => ("inflight", vec![]),
        };
        let op = Op {
            kind,
            keys: vec!["s".into()],
            args,
        };
        let shared = shared_is_alone(&mut c, &op, i);
        done.count(op.kind, &shared);
        assert_eq!(
            any_state(&mut c, "shared:s"),
            any_state(&mut c, "alone:s"),
            "call {i}: {op:?}"
        );
    }
    assert!(done.acquired > 50 && done.denied > 30, "{done:?}");
    assert!(done.released > 20 && done.renewed > 20, "{done:?}");
}

/// The live weight of a lease hash at `now`, read by brute force (the
/// summary, the empty field, left out).
fn live_weight(c: &mut redis::Connection, key: &str, now: i64) -> i64 {
    hgetall(c, key)
        .iter()
        .filter(|(f, _)| !f.is_empty())
        .filter_map(|(_, v)| {
            let (e, w) = v.split_once(':')?;
            let (e, w): (i64, i64) = (e.parse().ok()?, w.parse().ok()?);
            (now < e).then_some(w)
        })
        .sum()
}

/// Random calls on keys of many leases (more than a summary lists), short
/// leases expiring in the middle: module and library give the same replies
/// and leave the same hash (its summary included) and expire time, and
/// after every step TB.INFLIGHT on both equals the live weight read by
/// brute force. Now and then both sides get the same key as written before
/// summaries (many leases, none), or a summary that disagrees.
#[test]
fn random_calls_on_large_lease_keys_match_the_module() {
    let seed = seed(0x000B_161E_A5E5);
    let mut rng = Rng(seed);
    let (clock, _s, mut c) = library_on_fake_clock();
    let ids: Vec<String> = (0..60).map(|i| format!("id{i}")).collect();
    let lease_ms = ["5", "50", "500", "2000", "10000", "30000", "60000"];
    let mut now = T0;
    let (mut large, mut with_summary, mut done) = (0, 0, Done::default());
    for i in 0..OPS {
        now += match rng.below(100) {
            0..=29 => 0,
            30..=96 => rng.below(150_000) as i64,
            97 => rng.below(20_000_000) as i64,
            _ => -(rng.below(3_000_000) as i64),
        };
        clock.set(now);
        if rng.chance(0.01) {
            // The same many leases on both sides, as written before
            // summaries, or with a summary that counts one lease too many.
            let n = 10 + rng.below(30);
            let broken = rng.chance(0.5);
            for p in ["m:", "l:"] {
                let k = format!("{p}big");
                let _: () = redis::cmd("DEL").arg(&k).query(&mut c).unwrap();
                let mut cmd = redis::cmd("HSET");
                cmd.arg(&k);
                for j in 0..n {
                    cmd.arg(format!("old{j}"))
                        .arg(format!("{}:1", now + 1 + (j as i64) * 700_000));
                }
                if broken {
                    cmd.arg("")
                        .arg(format!("{n}:{}:0:{}:{}", n + 1, now + 5, now + 9));
                }
                let _: () = cmd.query(&mut c).unwrap();
            }
        }
        let id = if rng.chance(0.6) {
            // An id the key holds, live or expired, if any.
            let held: Vec<String> = hgetall(&mut c, "m:big")
                .into_keys()
                .filter(|k| !k.is_empty())
                .collect();
            if held.is_empty() {
                rng.pick(&ids).clone()
            } else {
                rng.pick(&held).clone()
            }
        } else {
            rng.pick(&ids).clone()
        };
        let (kind, args) = match rng.below(10) {
            0..=4 => {
                let limit = 20 + rng.below(40);
                let weight = 1 + rng.below(3);
                let ms = rng.pick(&lease_ms).to_string();
                let args = vec![limit.to_string(), ms, id, weight.to_string()];
                ("acquire", args)
            }
            5..=6 => ("release", vec![id]),
            7..=8 => ("renew", vec![id, rng.pick(&lease_ms).to_string()]),
            _ => ("inflight", vec![]),
        };
        let op = Op {
            kind,
            keys: vec!["big".into()],
            args,
        };
        let fields: i64 = int(&mut c, "HLEN", "m:big");
        large += usize::from(fields > 9);
        with_summary += usize::from(hgetall(&mut c, "m:big").contains_key(""));
        let ctx = format!("op {i} (seed {seed:#x}, clock T0{:+}us): {op:?}", now - T0);
        let by_module = same_reply(&mut c, &op, &ctx);
        assert_eq!(
            any_state(&mut c, "l:big"),
            any_state(&mut c, "m:big"),
            "{ctx}"
        );
        let live = live_weight(&mut c, "m:big", now);
        let inflight = Op {
            kind: "inflight",
            keys: vec!["big".into()],
            args: vec![],
        };
        for (form, got) in [
            ("module", run(&mut c, &inflight.module("m:"))),
            ("library", run(&mut c, &inflight.library("l:"))),
        ] {
            assert_eq!(
                got,
                Ok(Value::Int(live)),
                "{form}'s live weight after {ctx}"
            );
        }
        done.count(kind, &by_module);
    }
    eprintln!("large {large}, with a summary {with_summary}, {done:?}");
    assert!(
        large > OPS / 2 && with_summary > OPS / 3,
        "{large} {with_summary}"
    );
    assert!(done.acquired > 500 && done.denied > 200, "{done:?}");
    assert!(done.released > 200 && done.renewed > 200, "{done:?}");
}
