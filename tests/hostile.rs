//! A hostile client: tens of thousands of TB commands, the bucket and the
//! lease commands, with random argument counts and random bytes (huge and
//! tiny numbers, `nan`, `inf`, `0x10`, spaces, empty strings, NUL bytes,
//! ids of every length...), while a second client keeps writing garbage,
//! other types and broken leases into the same keys.
//!
//! Every call is checked against an oracle built from tb-core and the key
//! pool's state just before the call: the exact error for a failing call
//! (which must change nothing), the documented reply shape for a
//! successful one (which may change only its own keys, into valid buckets
//! and lease keys). At the end: the server is up, nothing panicked, and
//! the INFO counters add up to what the client saw.
//!
//! The two clients take turns from one seeded PRNG (set `TB_HOSTILE_SEED`
//! to replay a run), so each call's before/after snapshot is exact; Redis
//! runs commands one at a time anyway, so taking turns loses no
//! interleaving a concurrent writer could produce.

use redis::Value;
use std::collections::BTreeMap;
use std::time::Instant;
use tb_core::args::{parse_adjust, parse_consume, parse_mconsume, Memos};
use tb_core::contract::msg::WRONGTYPE;
use tb_core::contract::MAX_LEASE_ID_BYTES;
use tb_core::error::Error;
use tb_core::lease::{
    decide, key_expire_at_ms, parse_acquire, parse_inflight, parse_release, parse_renew, Kind,
    Lease, ACQUIRE_ID_INDEX, ID_INDEX, LIST_FIELD, SUMMARY_FIELD, TRACKED,
};
use testkit::{
    consume, dbsize, error_of, error_text, hgetall, lease_summary_problem, tb_counter, Config,
    KeyView, Rng, Server,
};

/// 60% bucket commands (as many as when they were the only ones), 40%
/// lease commands.
const CALLS: usize = 100_000;

/// The keys both clients fight over: plain, empty, binary, spaced.
fn key_pool() -> Vec<Vec<u8>> {
    let mut keys: Vec<Vec<u8>> = (0..10).map(|i| format!("k{i}").into_bytes()).collect();
    keys.extend([
        b"".to_vec(),
        b"\0".to_vec(),
        b"\xff\xfe\x00k".to_vec(),
        b"a key with spaces\r\n".to_vec(),
        b"{tag}k".to_vec(),
        vec![b'x'; 300],
    ]);
    keys
}

/// Strings that are not (or barely) numbers.
const HOSTILE: &[&str] = &[
    "nan",
    "NaN",
    "-nan",
    "inf",
    "-inf",
    "+inf",
    "infinity",
    "Infinity",
    "0x10",
    "0X1p3",
    "1 0",
    " 10",
    "10 ",
    "\t1",
    "1\n",
    "",
    " ",
    "\0",
    "1\0",
    "\x001",
    "1e",
    "1e+",
    ".",
    "+",
    "-",
    "--1",
    "1..2",
    "1.2.3",
    "e5",
    "1_000",
    "1,5",
    "１",
    "0b101",
    "1e309",
    "-1e309",
    "1e99999999999999999999",
    "1e-99999999999999999999",
    "4.9e-324",
    "5e-324",
    "2.2250738585072014e-308",
    "1.7976931348623157e308",
    "-1.7976931348623157e308",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551616",
    "0",
    "-0",
    "+0.0",
    "-1",
    "1e12",
    "1000000000000.0001",
    "1e13",
    "1e10",
    "1e-10",
    "0.0000000001",
    "1e-300",
];

/// A number that is valid somewhere: small, huge, tiny, fractional.
fn plausible(r: &mut Rng) -> String {
    match r.index(7) {
        0 => r
            .pick(&["1", "10", "100", "0.5", "2.5", "1000", "3"])
            .to_string(),
        1 => format!("{}", r.index(1_000_000)),
        2 => format!("{:.3}", r.unit() * 1000.0),
        3 => format!("{}e{}", 1 + r.index(9), r.index(25) as i64 - 12),
        4 => format!("{}", r.unit() * 1e12),
        5 => format!("{:e}", r.unit()),
        _ => format!("-{}", r.index(100)),
    }
}

fn number_arg(r: &mut Rng) -> Vec<u8> {
    match r.index(20) {
        0..=11 => plausible(r).into_bytes(),
        12..=17 => r.pick(HOSTILE).as_bytes().to_vec(),
        18 => {
            // A long digit string, sometimes valid.
            let mut s = "9".repeat(1 + r.index(400));
            if r.percent(50) {
                s.insert(0, '.');
            }
            s.into_bytes()
        }
        _ => r.bytes(8),
    }
}

/// One group's `max rate cost`, valid most of the time.
fn limits_args(r: &mut Rng) -> [Vec<u8>; 3] {
    let max = match r.index(6) {
        0 => 1e12,
        1 => 0.5,
        2 => r.unit() * 1e6,
        _ => 1.0 + r.index(100) as f64,
    };
    let rate = match r.index(6) {
        0 => 1e12,
        1 => max / 1e10,
        2 => r.unit() * 1e3,
        3 => 1.0 + r.index(1000) as f64,
        _ => (max / 1e4).max(r.unit()),
    };
    let cost = match r.index(5) {
        0 => 0.0,
        1 => max,
        _ => (max * r.unit()).floor(),
    };
    let mut out = [max, rate, cost].map(|v| format!("{v}").into_bytes());
    for a in out.iter_mut() {
        if r.percent(12) {
            *a = number_arg(r);
        }
    }
    out
}

fn key_arg(r: &mut Rng, pool: &[Vec<u8>]) -> Vec<u8> {
    r.pick(pool).clone()
}

/// The bucket commands' (`FOR_BUCKETS`) or the lease commands' keys: mostly
/// their half of the pool, so each has keys of its own kind to work on,
/// and a fifth of the time any key (the other kind's, garbage...).
const FOR_BUCKETS: usize = 0;
const FOR_LEASES: usize = 1;
fn own_key(r: &mut Rng, pool: &[Vec<u8>], half: usize) -> Vec<u8> {
    if r.percent(20) {
        return key_arg(r, pool);
    }
    pool[2 * r.index(pool.len() / 2) + half].clone()
}

/// The usual `limit`, `lease_ms` and `weight`: small limits, so leases
/// contend; short leases, which expire between calls and get pruned.
const LIMITS: &[&str] = &["1", "2", "3", "5", "10"];
const LEASE_MS: &[&str] = &["1", "50", "60000", "600000", "600000", "3600000"];
const WEIGHTS: &[&str] = &["1", "1", "2", "3"];

/// An integer argument of the lease commands: a usual value, a bound or
/// one past it, an integer in another spelling, or any number.
fn int_arg(r: &mut Rng, usual: &[&str]) -> Vec<u8> {
    match r.index(20) {
        0..=17 => r.pick(usual).as_bytes().to_vec(),
        18 => r
            .pick(&[
                "0",
                "-1",
                "+1",
                "007",
                "1000000",
                "1000001",
                "86400000",
                "86400001",
                "9223372036854775807",
                "9223372036854775808",
                "1.0",
                "1e3",
            ])
            .as_bytes()
            .to_vec(),
        _ => number_arg(r),
    }
}

/// Lease ids (and the garbage writer's lease fields): a few shared ones,
/// so releases and renewals find live leases; the longest allowed and one
/// byte more; empty; random bytes.
fn lease_id(r: &mut Rng) -> Vec<u8> {
    match r.index(20) {
        0..=16 => r
            .pick(&["a", "b", "tokens", "BUCKET", "\0"])
            .as_bytes()
            .to_vec(),
        17 => vec![b'i'; MAX_LEASE_ID_BYTES + r.index(2)],
        18 => Vec::new(),
        _ => r.bytes(8),
    }
}

/// `NAMES[i]` is the command `Parsed::command == i` stands for.
const NAMES: [[&str; 3]; 8] = [
    ["TB.CONSUME", "tb.consume", "Tb.Consume"],
    ["TB.PEEK", "tb.peek", "tB.pEEK"],
    ["TB.ADJUST", "tb.adjust", "Tb.Adjust"],
    ["TB.MCONSUME", "tb.mconsume", "TB.mconsume"],
    ["TB.ACQUIRE", "tb.acquire", "Tb.AcQuIrE"],
    ["TB.RELEASE", "tb.release", "tB.rELEASE"],
    ["TB.RENEW", "tb.renew", "Tb.Renew"],
    ["TB.INFLIGHT", "tb.inflight", "TB.inflight"],
];

/// A random call: a TB command with a random number of arguments.
fn random_call(r: &mut Rng, pool: &[Vec<u8>]) -> Vec<Vec<u8>> {
    // The bucket commands 60% of the time, the lease commands 40%.
    let which = if r.percent(60) {
        r.index(4)
    } else {
        4 + r.index(4)
    };
    let mut argv = vec![r.pick(&NAMES[which]).as_bytes().to_vec()];
    match which {
        3 => {
            let groups = if r.percent(5) { 0 } else { 1 + r.index(6) };
            for _ in 0..groups {
                argv.push(own_key(r, pool, FOR_BUCKETS));
                argv.extend(limits_args(r));
            }
        }
        4 => acquire_args(r, pool, &mut argv),
        5 | 6 => {
            argv.push(own_key(r, pool, FOR_LEASES));
            argv.push(lease_id(r));
            if which == 6 {
                argv.push(int_arg(r, LEASE_MS));
            }
        }
        7 => argv.push(own_key(r, pool, FOR_LEASES)),
        _ => {
            argv.push(own_key(r, pool, FOR_BUCKETS));
            let [max, rate, cost] = limits_args(r);
            argv.extend([max, rate]);
            if which == 2 {
                let delta = match r.index(4) {
                    0 => number_arg(r),
                    1 => format!("-{}", plausible(r)).into_bytes(),
                    _ => plausible(r).into_bytes(),
                };
                argv.push(delta);
            } else if r.percent(70) {
                argv.push(cost);
            }
        }
    }
    // Wrong argument counts: drop or add some.
    if r.percent(8) {
        let n = r.index((argv.len() - 1).min(3) + 1);
        argv.truncate(argv.len() - n);
    } else if r.percent(6) {
        for _ in 0..1 + r.index(3) {
            argv.push(number_arg(r));
        }
    }
    if r.percent(3) {
        // Any argument (even the key) replaced by random bytes.
        let i = r.index(argv.len());
        if i > 0 {
            argv[i] = r.bytes(16);
        }
    }
    argv
}

/// TB.ACQUIRE's `key limit lease_ms id [weight] [BUCKET bkey max rate cost
/// ...]`: a weight half the time, up to three clauses, a keyword that is
/// sometimes not `BUCKET`, a clause sometimes on the lease key itself.
fn acquire_args(r: &mut Rng, pool: &[Vec<u8>], argv: &mut Vec<Vec<u8>>) {
    let key = own_key(r, pool, FOR_LEASES);
    argv.push(key.clone());
    argv.push(int_arg(r, LIMITS));
    argv.push(int_arg(r, LEASE_MS));
    argv.push(lease_id(r));
    if r.percent(50) {
        argv.push(int_arg(r, WEIGHTS));
    }
    for _ in 0..*r.pick(&[0, 0, 0, 1, 1, 2, 3]) {
        argv.push(match r.index(20) {
            0 => b"BUCKETS".to_vec(),
            1 => number_arg(r),
            _ => r.pick(&["BUCKET", "bucket", "Bucket"]).as_bytes().to_vec(),
        });
        argv.push(if r.percent(5) {
            key.clone()
        } else {
            own_key(r, pool, FOR_BUCKETS)
        });
        argv.extend(limits_args(r));
    }
}

// ---- what the key pool holds --------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
struct KeyState {
    ty: String,
    dump: Option<Vec<u8>>,
    expire_at: i64,
    hash: Option<BTreeMap<Vec<u8>, Vec<u8>>>,
}

type Snap = BTreeMap<Vec<u8>, KeyState>;

impl KeyState {
    fn missing() -> KeyState {
        KeyState {
            ty: "none".into(),
            dump: None,
            expire_at: -2,
            hash: None,
        }
    }

    /// Whether two snapshots hold the same key: a hash by its fields (a
    /// read can move a hash table's fields, and so its DUMP, by rehashing
    /// it a step), anything else by its DUMP.
    fn same(&self, other: &KeyState) -> bool {
        match (&self.hash, &other.hash) {
            (Some(a), Some(b)) => a == b && self.expire_at == other.expire_at,
            _ => self == other,
        }
    }

    /// Whether the key's expire time had passed by `now_ms`, so it may be
    /// gone without anyone deleting it.
    fn may_have_expired(&self, now_ms: i64) -> bool {
        self.expire_at > 0 && self.expire_at <= now_ms
    }
}

fn snap(c: &mut redis::Connection, pool: &[Vec<u8>]) -> (Snap, i64) {
    let mut p = redis::pipe();
    for k in pool {
        p.cmd("TYPE")
            .arg(k)
            .cmd("DUMP")
            .arg(k)
            .cmd("PEXPIRETIME")
            .arg(k);
    }
    let v: Vec<Value> = p.query(c).expect("snapshot pipeline");
    let mut out = Snap::new();
    for (k, chunk) in pool.iter().zip(v.chunks(3)) {
        let ty: String = redis::from_redis_value(&chunk[0]).unwrap();
        let dump: Option<Vec<u8>> = redis::from_redis_value(&chunk[1]).unwrap();
        let expire_at: i64 = redis::from_redis_value(&chunk[2]).unwrap();
        out.insert(
            k.clone(),
            KeyState {
                ty,
                dump,
                expire_at,
                hash: None,
            },
        );
    }
    let hashes: Vec<Vec<u8>> = out
        .iter()
        .filter(|(_, s)| s.ty == "hash")
        .map(|(k, _)| k.clone())
        .collect();
    if !hashes.is_empty() {
        let mut p = redis::pipe();
        for k in &hashes {
            p.cmd("HGETALL").arg(k);
        }
        let maps: Vec<BTreeMap<Vec<u8>, Vec<u8>>> = p.query(c).expect("HGETALL pipeline");
        for (k, m) in hashes.iter().zip(maps) {
            let s = out.get_mut(k).unwrap();
            if m.is_empty() {
                // Expired between the two pipelines (hashes are never empty).
                *s = KeyState::missing();
            } else {
                s.hash = Some(m);
            }
        }
    }
    let time: Vec<i64> = redis::cmd("TIME").query(c).expect("TIME");
    (out, time[0] * 1000 + time[1] / 1000)
}

/// Keys whose state differs between two snapshots, except keys that may
/// have expired on their own in between (`now_ms`: after the second).
fn changed(before: &Snap, after: &Snap, now_ms: i64) -> Vec<Vec<u8>> {
    before
        .iter()
        .filter(|(k, b)| !after[*k].same(b) && !b.may_have_expired(now_ms))
        .map(|(k, _)| k.clone())
        .collect()
}

// ---- the oracle ---------------------------------------------------------------------

impl KeyState {
    /// The key as tb-core's rule reads it.
    fn view(&self) -> KeyView<'_, Vec<u8>, Vec<u8>> {
        match self.ty.as_str() {
            "none" => KeyView::Missing,
            "hash" => KeyView::Hash(self.hash.as_ref().expect("hash fields")),
            _ => KeyView::Other,
        }
    }
}

/// Why a key is not usable as a bucket.
fn key_error(s: &KeyState) -> Option<Error> {
    s.view().load().err()
}

/// Why a key is not usable as a lease key by a call about `id` (empty:
/// TB.INFLIGHT) at `now_ms`, as the lease commands read it: whole, or its
/// summary and the caller's own lease.
fn lease_key_error(s: &KeyState, id: &[u8], now_ms: i64) -> Option<Error> {
    let id = (!id.is_empty()).then_some(id);
    decide(&s.view(), id, now_ms * 1000, Kind::Inflight, |_| Ok(())).err()
}

/// Whether the key holds more fields than a call reads whole: a call may
/// then write what its pass found, even when it changes no lease.
fn large(s: &KeyState) -> bool {
    s.hash.as_ref().is_some_and(|h| h.len() > TRACKED + 1)
}

/// A parsed call: its bucket keys with each one's `max`, and a lease
/// command's key, id and numbers.
#[derive(Default)]
struct Parsed {
    command: usize,
    keys: Vec<(Vec<u8>, f64)>,
    lease_key: Option<Vec<u8>>,
    /// TB.ACQUIRE's, TB.RELEASE's and TB.RENEW's id.
    id: Vec<u8>,
    /// TB.ACQUIRE of an id whose lease was live: its buckets are not
    /// charged, and their replies are TB.PEEK's.
    retry: bool,
    /// TB.ACQUIRE's and TB.RENEW's.
    lease_ms: i64,
    /// TB.ACQUIRE's.
    limit: i64,
    weight: i64,
}

/// The reply a call must get at `now_ms`: `Err(message)` or `Ok(parsed
/// call)`.
fn predict(argv: &[Vec<u8>], state: &Snap, now_ms: i64) -> Result<Parsed, String> {
    let name = String::from_utf8_lossy(&argv[0]).to_lowercase();
    let msg = |e: Error| e.to_string();
    // A store of its own: the answer without any earlier call's memo,
    // which the server's remembered answers must equal.
    let memos = &Memos::new();
    let bucket = |command, max| Parsed {
        command,
        keys: vec![(argv[1].clone(), max)],
        ..Parsed::default()
    };
    let lease = |command| Parsed {
        command,
        lease_key: Some(argv[1].clone()),
        ..Parsed::default()
    };
    let call = match name.as_str() {
        "tb.consume" | "tb.peek" => {
            let s = parse_consume(argv, memos).map_err(msg)?;
            bucket(if name == "tb.consume" { 0 } else { 1 }, s.limits.max)
        }
        "tb.adjust" => bucket(2, parse_adjust(argv, memos).map_err(msg)?.limits.max),
        "tb.mconsume" => {
            let g = parse_mconsume(argv, memos).map_err(msg)?;
            Parsed {
                command: 3,
                keys: g
                    .iter()
                    .map(|g| (argv[g.key_index].clone(), g.limits.max))
                    .collect(),
                ..Parsed::default()
            }
        }
        "tb.acquire" => {
            let a = parse_acquire(argv, memos).map_err(msg)?;
            Parsed {
                keys: a
                    .clauses
                    .iter()
                    .map(|c| {
                        let most = match c.limit {
                            tb_core::charge::Limit::Bucket(l) => l.max,
                            tb_core::charge::Limit::Quota(q) => q.limit,
                        };
                        (argv[c.key_index].clone(), most)
                    })
                    .collect(),
                id: argv[ACQUIRE_ID_INDEX].clone(),
                lease_ms: a.lease_ms,
                limit: a.limit,
                weight: a.weight,
                ..lease(4)
            }
        }
        "tb.release" => {
            parse_release(argv).map_err(msg)?;
            Parsed {
                id: argv[ID_INDEX].clone(),
                ..lease(5)
            }
        }
        "tb.renew" => {
            let lease_ms = parse_renew(argv).map_err(msg)?;
            Parsed {
                id: argv[ID_INDEX].clone(),
                lease_ms,
                ..lease(6)
            }
        }
        "tb.inflight" => {
            parse_inflight(argv).map_err(msg)?;
            lease(7)
        }
        other => panic!("not a TB command: {other}"),
    };
    // A key outside the pool (random bytes) is missing: the garbage writer
    // only writes pool keys, and the test deletes any other a call wrote.
    // The lease key is read first, then the buckets.
    if let Some(e) = call
        .lease_key
        .as_ref()
        .and_then(|k| state.get(k))
        .and_then(|s| lease_key_error(s, &call.id, now_ms))
    {
        return Err(e.to_string());
    }
    for (i, (k, _)) in call.keys.iter().enumerate() {
        let Some(e) = state.get(k).and_then(key_error) else {
            continue;
        };
        // TB.MCONSUME's groups and TB.ACQUIRE's BUCKET clauses, from 1.
        let e = if matches!(call.command, 3 | 4) {
            e.in_group(i + 1)
        } else {
            e
        };
        return Err(e.to_string());
    }
    Ok(call)
}

/// `predict` for the reply the call got: from the keys as they were before
/// it, or, if that does not fit the reply, with the keys whose expire time
/// had passed by `now_ms` gone, as they may have been when the call ran.
fn expected(
    argv: &[Vec<u8>],
    before: &Snap,
    got: &redis::RedisResult<Value>,
    now_ms: i64,
) -> Result<Parsed, String> {
    let want = predict(argv, before, now_ms);
    let fits = match (&want, got) {
        (Err(want), Err(e)) => *want == error_text(e),
        (Ok(_), Ok(_)) => true,
        _ => false,
    };
    if fits || !before.values().any(|s| s.may_have_expired(now_ms)) {
        return want;
    }
    let gone: Snap = before
        .iter()
        .map(|(k, s)| {
            let s = if s.may_have_expired(now_ms) {
                KeyState::missing()
            } else {
                s.clone()
            };
            (k.clone(), s)
        })
        .collect();
    predict(argv, &gone, now_ms)
}

fn ints(v: &Value) -> Option<Vec<i64>> {
    match v {
        Value::Array(items) => items
            .iter()
            .map(|i| match i {
                Value::Int(n) => Some(*n),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

/// `[allowed, remaining, retry_after_ms, reset_after_ms]` for a bucket of
/// capacity `max`.
fn check_four(v: &Value, max: f64, ctx: &str) -> [i64; 4] {
    let r = ints(v).unwrap_or_else(|| panic!("{ctx}: not an array of integers: {v:?}"));
    let r: [i64; 4] = r
        .try_into()
        .unwrap_or_else(|r| panic!("{ctx}: {r:?} is not 4 integers"));
    let [allowed, remaining, retry, reset] = r;
    assert!(allowed == 0 || allowed == 1, "{ctx}: allowed {r:?}");
    assert!(retry >= 0 && reset >= 0, "{ctx}: negative time {r:?}");
    assert!(retry <= reset, "{ctx}: retry after reset {r:?}");
    // Reply times are bounded by the fill-time limit, at most 2e13 ms, plus
    // the wait until a future ts: a 16-digit ts is at most 1e13 ms away.
    assert!(reset <= 30_000_000_000_002, "{ctx}: reset {r:?}");
    assert!(
        remaining as f64 <= max && remaining as f64 >= -max - 1.0,
        "{ctx}: remaining outside [-max, max] {r:?}"
    );
    r
}

fn show(argv: &[Vec<u8>]) -> String {
    let parts: Vec<String> = argv
        .iter()
        .map(|a| {
            if a.len() > 40 {
                format!(
                    "{:?}...({} bytes)",
                    String::from_utf8_lossy(&a[..40]),
                    a.len()
                )
            } else {
                format!("{:?}", String::from_utf8_lossy(a))
            }
        })
        .collect();
    parts.join(" ")
}

// ---- the garbage writer ---------------------------------------------------------------

fn garbage(r: &mut Rng, g: &mut redis::Connection, pool: &[Vec<u8>]) {
    let k = key_arg(r, pool);
    let junk = |r: &mut Rng| -> Vec<u8> {
        if r.percent(50) {
            number_arg(r)
        } else {
            r.bytes(12)
        }
    };
    let mut p = redis::pipe();
    p.cmd("DEL").arg(&k).ignore();
    match r.index(24) {
        0..=8 => {} // just deleted
        9 => {
            p.cmd("SET").arg(&k).arg(junk(r)).ignore();
        }
        10 => {
            p.cmd("RPUSH").arg(&k).arg(junk(r)).arg("x").ignore();
        }
        11 => {
            p.cmd("SADD").arg(&k).arg(junk(r)).ignore();
        }
        12 => {
            p.cmd("ZADD").arg(&k).arg(1).arg(junk(r)).ignore();
        }
        13 => {
            p.cmd("XADD")
                .arg(&k)
                .arg("*")
                .arg("tokens")
                .arg("1")
                .ignore();
        }
        14 => {
            // A bucket with an extra field.
            p.cmd("HSET")
                .arg(&k)
                .arg("tokens")
                .arg("1")
                .arg("ts")
                .arg("1")
                .arg(junk(r))
                .arg("x")
                .ignore();
        }
        15 => {
            // Only one of the two fields.
            let f = *r.pick(&["tokens", "ts", "TOKENS", "extra"]);
            p.cmd("HSET").arg(&k).arg(f).arg(junk(r)).ignore();
        }
        16 | 17 => {
            // Exactly tokens and ts, holding anything.
            p.cmd("HSET")
                .arg(&k)
                .arg("tokens")
                .arg(junk(r))
                .arg("ts")
                .arg(junk(r))
                .ignore();
        }
        22 | 23 => {
            // A lease key of more leases than a call reads whole (all
            // ending in 2100), with its summary and list, ones that
            // disagree with it, or none.
            let n = TRACKED + 1 + r.index(4);
            p.cmd("HSET").arg(&k);
            for i in 0..n {
                p.arg(format!("big{i}")).arg("4102444800000000:1");
            }
            let count = n as i64;
            let t = "4102444800000000";
            let (summary, list) = match r.index(9) {
                0 | 1 => (Some(format!("{count}:{count}:0:{t}:{t}:{t}")), Some("")),
                2 => (
                    Some(format!("{count}:{}:0:{t}:{t}:{t}", count - 1)),
                    Some(""),
                ),
                3 => (Some(format!("1:{count}:0:{t}:{t}:{t}")), Some("")),
                4 => (Some(format!("0:0:0:{t}:{t}:{t}")), Some("")),
                5 => (Some(format!("{count}:{count}:1:9:9:1")), Some(";1:1:1:x")),
                6 => (Some(format!("{count}:{count}:1:{t}:{t}:5")), None),
                7 => (
                    Some(format!("{count}:{count}:1:{t}:{t}:5")),
                    Some(";5:1:1:x;"),
                ),
                _ => (None, None),
            };
            if let Some(summary) = summary {
                p.arg(SUMMARY_FIELD).arg(summary);
            }
            if let Some(list) = list {
                p.arg(LIST_FIELD).arg(list);
            }
            p.ignore();
        }
        20 | 21 => {
            // A lease key: live leases (until 2100, or the largest
            // expiry), expired ones, and values that are no lease.
            p.cmd("HSET").arg(&k);
            for _ in 0..1 + r.index(3) {
                let value = if r.percent(75) {
                    *r.pick(&[
                        "4102444800000000:1",
                        "4102444800000000:2",
                        "9999999999999999:1000000",
                        "9223372036854775807:1",
                        "0009223372036854775807:1",
                        "1764513600123456:1",
                        "1:1",
                        "0:3",
                    ])
                } else {
                    *r.pick(&[
                        "1:0",
                        "1:1000001",
                        "-1:1",
                        "1:-1",
                        "1.5:1",
                        " 1:1",
                        "1:1:1",
                        ":1",
                        "1:",
                        "",
                        "1",
                        "99999999999999999999:1",
                    ])
                };
                p.arg(lease_id(r)).arg(value);
            }
            p.ignore();
        }
        _ => {
            // A plausible bucket with hostile values: debt, above any max,
            // far past or future timestamps.
            let tokens = r
                .pick(&["5", "-5", "1e300", "-1e300", "0", "1e-300", "999999999999"])
                .to_string();
            let ts = r
                .pick(&[
                    "0",
                    "-9999999999999999",
                    "9999999999999999",
                    "1764513600123456",
                    "1",
                ])
                .to_string();
            p.cmd("HSET")
                .arg(&k)
                .arg("tokens")
                .arg(tokens)
                .arg("ts")
                .arg(ts)
                .ignore();
        }
    }
    if r.percent(30) {
        p.cmd("PEXPIRE").arg(&k).arg(3_600_000).ignore();
    }
    let _: () = p.query(g).expect("garbage writer");
}

// ---- the tests ---------------------------------------------------------------------------

#[derive(Default, Debug)]
struct Tally {
    errors: u64,
    admitted: u64,
    denied: u64,
    peeks: u64,
    adjusts: u64,
    acquired: u64,
    busy: u64,
    released: u64,
    renewed: u64,
    inflights: u64,
}

#[test]
fn hostile_calls_on_garbage_keys_error_cleanly_or_answer_in_shape() {
    let seed = std::env::var("TB_HOSTILE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x7B_2026);
    eprintln!("TB_HOSTILE_SEED={seed}");
    let mut r = Rng(seed);
    let mut s = Server::start();
    let mut c = s.conn();
    let mut g = s.conn();
    let pool = key_pool();
    let started = Instant::now();
    let mut tally = Tally::default();
    let mut kinds: BTreeMap<String, u64> = BTreeMap::new();

    let (mut before, mut before_ms) = snap(&mut c, &pool);
    for n in 0..CALLS {
        if r.percent(12) {
            garbage(&mut r, &mut g, &pool);
            (before, before_ms) = snap(&mut c, &pool);
        }
        let argv = random_call(&mut r, &pool);
        let ctx = format!("call {n} (seed {seed}): {}", show(&argv));
        let mut cmd = redis::cmd(std::str::from_utf8(&argv[0]).unwrap());
        for a in &argv[1..] {
            cmd.arg(a.as_slice());
        }
        let got = cmd.query::<Value>(&mut c);
        let (after, now_ms) = snap(&mut c, &pool);
        let want = expected(&argv, &before, &got, now_ms);
        let moved = changed(&before, &after, now_ms);
        match (want, got) {
            (Err(want), Err(e)) => {
                let text = error_text(&e);
                assert_eq!(text, want, "{ctx}");
                assert!(
                    moved.is_empty(),
                    "{ctx}: a failed call changed {:?}",
                    moved
                        .iter()
                        .map(|k| (k, &before[k], &after[k], now_ms))
                        .collect::<Vec<_>>()
                );
                tally.errors += 1;
                let kind = want.split([':', '(']).next().unwrap().trim().to_string();
                *kinds.entry(kind).or_default() += 1;
            }
            (Err(want), Ok(v)) => panic!(
                "{ctx}: want error {want:?}, got {v:?}; before {:?}",
                argv.get(1).and_then(|k| before.get(k))
            ),
            (Ok(_), Err(e)) => panic!("{ctx}: want success, got {e:?}"),
            (Ok(mut call), Ok(v)) => {
                *kinds.entry("ok".into()).or_default() += 1;
                let lease_key = call.lease_key.as_ref().and_then(|k| before.get(k));
                call.retry = call.command == 4
                    && lease_key
                        .and_then(|s| s.hash.as_ref())
                        .and_then(|h| h.get(&call.id))
                        .and_then(|v| Lease::parse(v))
                        .is_some_and(|l| l.expires_us > before_ms * 1000);
                let was_large = lease_key.is_some_and(large);
                // Admitted, acquired, released or renewed.
                let done = check_reply(&call, &v, &ctx);
                let own: Vec<&Vec<u8>> = call
                    .keys
                    .iter()
                    .map(|(k, _)| k)
                    .chain(&call.lease_key)
                    .collect();
                for k in &moved {
                    assert!(own.contains(&k), "{ctx}: changed another key {k:?}");
                }
                let writes = match call.command {
                    1 | 7 => false,
                    2 => true,
                    4..=6 => done || was_large,
                    _ => done,
                };
                if !writes {
                    assert!(
                        moved.is_empty(),
                        "{ctx}: a call that writes nothing changed {moved:?}"
                    );
                }
                for (k, max) in &call.keys {
                    if moved.contains(k) {
                        check_bucket_key(&after[k], *max, &ctx);
                    }
                }
                if let Some(k) = &call.lease_key {
                    if moved.contains(k) {
                        check_lease_key(&after[k], before_ms, !was_large, &ctx);
                    }
                    if let (4, true, Some(h)) = (
                        call.command,
                        done,
                        after.get(k).and_then(|s| s.hash.as_ref()),
                    ) {
                        // The lease taken: its weight, for lease_ms at least.
                        let lease = h.get(&call.id).and_then(|v| Lease::parse(v));
                        let lease = lease.unwrap_or_else(|| {
                            panic!("{ctx}: no lease in {h:?}, before {:?}", before.get(k))
                        });
                        assert_eq!(lease.weight, call.weight, "{ctx}");
                        assert!(
                            lease.expires_us >= (before_ms + call.lease_ms) * 1000,
                            "{ctx}: {lease:?}"
                        );
                    }
                }
                match (call.command, done) {
                    (1, _) => tally.peeks += 1,
                    (2, _) => tally.adjusts += 1,
                    (4, true) => tally.acquired += 1,
                    (4, false) => tally.busy += 1,
                    (5, true) => tally.released += 1,
                    (6, true) => tally.renewed += 1,
                    (5 | 6, false) => {}
                    (7, _) => tally.inflights += 1,
                    (_, true) => tally.admitted += 1,
                    (_, false) => tally.denied += 1,
                }
                // Keys outside the pool go, so the oracle can take them as
                // missing.
                let strays: Vec<&Vec<u8>> = own
                    .into_iter()
                    .filter(|k| !before.contains_key(*k))
                    .collect();
                if !strays.is_empty() {
                    let _: () = redis::cmd("DEL").arg(strays).query(&mut c).unwrap();
                }
            }
        }
        before = after;
        before_ms = now_ms;
        if n % 5000 == 0 {
            assert_eq!(tb_counter(&mut c, "tb_panics"), 0, "{ctx}");
        }
    }
    let elapsed = started.elapsed();
    eprintln!(
        "{CALLS} hostile calls in {:.1} s: {tally:?}",
        elapsed.as_secs_f64()
    );
    eprintln!("outcomes: {kinds:#?}");

    assert!(s.is_alive(), "server died:\n{}", s.log());
    assert_eq!(tb_counter(&mut c, "tb_panics"), 0);
    assert_eq!(tb_counter(&mut c, "tb_errors"), tally.errors);
    assert_eq!(tb_counter(&mut c, "tb_admitted"), tally.admitted);
    assert_eq!(tb_counter(&mut c, "tb_denied"), tally.denied);
    assert_eq!(tb_counter(&mut c, "tb_peeks"), tally.peeks);
    assert_eq!(tb_counter(&mut c, "tb_adjusts"), tally.adjusts);
    assert_eq!(tb_counter(&mut c, "tb_acquired"), tally.acquired);
    assert_eq!(tb_counter(&mut c, "tb_busy"), tally.busy);
    assert_eq!(tb_counter(&mut c, "tb_released"), tally.released);
    assert_eq!(tb_counter(&mut c, "tb_renewed"), tally.renewed);
    assert_eq!(tb_counter(&mut c, "tb_inflights"), tally.inflights);
    let log = s.log();
    assert!(
        !log.to_lowercase().contains("panic"),
        "panic in the log:\n{log}"
    );
    // Each kind of outcome was reached often enough to mean something.
    assert!(tally.admitted > 1000 && tally.denied > 100, "{tally:?}");
    assert!(tally.peeks > 1000 && tally.adjusts > 1000, "{tally:?}");
    assert!(
        tally.acquired > 500 && tally.busy > 50 && tally.inflights > 1000,
        "{tally:?}"
    );
    assert!(tally.released > 50 && tally.renewed > 50, "{tally:?}");
    for kind in [
        "ok",
        WRONGTYPE,
        "ERR key is not a token bucket",
        "ERR wrong number of arguments for 'tb.mconsume' command",
        "ERR max must be a finite decimal number",
        "ERR rate is too low for max",
        "ERR cost must not exceed max, it could never pass",
        "ERR duplicate key",
        "ERR wrong number of arguments for 'tb.acquire' command",
        "ERR wrong number of arguments for 'tb.renew' command",
        "ERR limit must be",
        "ERR lease_ms must be",
        "ERR weight must",
        "ERR id must be 1 to 256 bytes",
        "ERR syntax error at argument",
        "ERR the key of group",
        "ERR key is not a lease key",
    ] {
        let seen: u64 = kinds
            .iter()
            .filter(|(k, _)| k.starts_with(kind))
            .map(|(_, n)| n)
            .sum();
        assert!(seen >= 20, "{kind:?} seen {seen} times: {kinds:#?}");
    }
}

/// Checks a successful reply's shape; returns whether it was admitted (a
/// lease command: acquired, released or renewed).
fn check_reply(call: &Parsed, v: &Value, ctx: &str) -> bool {
    if call.command >= 4 {
        return check_lease_reply(call, v, ctx);
    }
    if call.command != 3 {
        let [allowed, remaining, retry, _] = check_four(v, call.keys[0].1, ctx);
        match call.command {
            0 if allowed == 1 => {
                assert_eq!(retry, 0, "{ctx}: admitted with a retry time");
                assert!(remaining >= 0, "{ctx}: admitted into debt");
            }
            0 | 1 if allowed == 0 => assert!(retry > 0, "{ctx}: denied with no wait"),
            0 | 1 => assert_eq!(retry, 0, "{ctx}: allowed with a wait"),
            _ => assert_eq!(allowed, 1, "{ctx}: TB.ADJUST always applies"),
        }
        return allowed == 1;
    }
    let Value::Array(items) = v else {
        panic!("{ctx}: not an array: {v:?}")
    };
    assert_eq!(items.len(), 2 + call.keys.len(), "{ctx}: {v:?}");
    let (Value::Int(all), Value::Int(retry)) = (&items[0], &items[1]) else {
        panic!("{ctx}: head is not two integers: {v:?}")
    };
    assert!(*all == 0 || *all == 1, "{ctx}: {v:?}");
    let mut worst = 0;
    for (item, (_, max)) in items[2..].iter().zip(&call.keys) {
        let [allowed, remaining, r, _] = check_four(item, *max, ctx);
        worst = worst.max(r);
        if *all == 1 {
            assert_eq!((allowed, r), (1, 0), "{ctx}: {v:?}");
            assert!(remaining >= 0, "{ctx}: {v:?}");
        }
    }
    assert_eq!(*retry, worst, "{ctx}: retry is the longest wait: {v:?}");
    if *all == 0 {
        assert!(worst > 0, "{ctx}: denied with no wait: {v:?}");
    }
    *all == 1
}

/// A lease command's reply: TB.INFLIGHT's weight, TB.RELEASE's `[released,
/// in_use]`, TB.RENEW's `[renewed, expires_in_ms]`, or TB.ACQUIRE's
/// `[acquired, in_use, retry_after_ms, expires_in_ms, bucket replies...]`.
/// Returns whether the lease was acquired, released or renewed.
fn check_lease_reply(call: &Parsed, v: &Value, ctx: &str) -> bool {
    if call.command == 7 {
        let Value::Int(in_use) = v else {
            panic!("{ctx}: not an integer: {v:?}")
        };
        assert!(*in_use >= 0, "{ctx}: {v:?}");
        return false;
    }
    let Value::Array(items) = v else {
        panic!("{ctx}: not an array: {v:?}")
    };
    let head = if call.command == 4 { 4 } else { 2 };
    assert_eq!(items.len(), head + call.keys.len(), "{ctx}: {v:?}");
    let head = ints(&Value::Array(items[..head].to_vec()))
        .unwrap_or_else(|| panic!("{ctx}: not integers: {v:?}"));
    let done = head[0];
    assert!(done == 0 || done == 1, "{ctx}: {v:?}");
    match call.command {
        5 => assert!(head[1] >= 0, "{ctx}: in_use {v:?}"),
        6 if done == 1 => assert!(head[1] >= call.lease_ms, "{ctx}: {v:?}"),
        6 => assert_eq!(head[1], 0, "{ctx}: not renewed, yet expires: {v:?}"),
        _ => {
            let (in_use, retry, expires) = (head[1], head[2], head[3]);
            let mut worst = 0;
            for (item, (_, max)) in items[4..].iter().zip(&call.keys) {
                let [allowed, remaining, r, _] = check_four(item, *max, ctx);
                worst = worst.max(r);
                if done == 1 && !call.retry {
                    assert_eq!((allowed, r), (1, 0), "{ctx}: {v:?}");
                    assert!(remaining >= 0, "{ctx}: {v:?}");
                }
            }
            if done == 1 {
                assert_eq!(retry, 0, "{ctx}: acquired with a wait: {v:?}");
                assert!(
                    in_use >= call.weight && in_use <= call.limit,
                    "{ctx}: in_use outside [weight, limit]: {v:?}"
                );
                assert!(expires >= call.lease_ms, "{ctx}: {v:?}");
            } else {
                // No room for the lease, or a bucket can't pay: a wait
                // (a retry's buckets were paid: theirs is not it).
                assert!(retry > 0, "{ctx}: {v:?}");
                assert!(call.retry || retry >= worst, "{ctx}: {v:?}");
                assert!(in_use >= 0, "{ctx}: {v:?}");
                assert_eq!(expires, 0, "{ctx}: denied, yet expires: {v:?}");
            }
        }
    }
    done == 1
}

/// A lease key a successful call wrote: deleted (its last lease given
/// back) or a hash of leases, with none that had expired before the call
/// (`before_ms`: the write prunes them), and a summary that holds if it
/// has one. It expires with its latest lease; a key that kept a summary
/// before the call (`exact` false) may expire later, with the latest lease
/// it knew of.
fn check_lease_key(s: &KeyState, before_ms: i64, exact: bool, ctx: &str) {
    if s.ty == "none" {
        return;
    }
    assert_eq!(s.ty, "hash", "{ctx}");
    let h = s.hash.as_ref().unwrap();
    let mut latest = 0;
    for (field, value) in h {
        if field.as_slice() == SUMMARY_FIELD || field.as_slice() == LIST_FIELD {
            continue;
        }
        let lease = Lease::parse(value)
            .unwrap_or_else(|| panic!("{ctx}: field {field:?} holds no lease: {value:?}"));
        assert!(
            lease.expires_us > before_ms * 1000,
            "{ctx}: an expired lease was left: {field:?} {lease:?}"
        );
        latest = latest.max(lease.expires_us);
    }
    if let Some(problem) = lease_summary_problem(h) {
        panic!("{ctx}: {problem}: {h:?}");
    }
    if exact {
        assert_eq!(
            s.expire_at,
            key_expire_at_ms(latest),
            "{ctx}: the key expires with its latest lease: {h:?}"
        );
    } else {
        assert!(
            s.expire_at >= key_expire_at_ms(latest),
            "{ctx}: the key expires before its latest lease: {h:?}"
        );
    }
}

/// A key a successful call wrote: deleted (a full bucket) or a hash of
/// exactly `tokens` and `ts`, in [-max, max], with an expire time.
fn check_bucket_key(s: &KeyState, max: f64, ctx: &str) {
    if s.ty == "none" {
        return;
    }
    assert_eq!(s.ty, "hash", "{ctx}");
    let h = s.hash.as_ref().unwrap();
    assert_eq!(h.len(), 2, "{ctx}: {h:?}");
    let b = s
        .view()
        .load()
        .unwrap_or_else(|e| panic!("{ctx}: {e:?}"))
        .expect("a hash");
    assert!(b.tokens >= -max && b.tokens < max, "{ctx}: stored {b:?}");
    assert!(s.expire_at > 0, "{ctx}: a bucket without an expire time");
}

fn mconsume(groups: &[(Vec<u8>, &str, &str, &str)]) -> redis::Cmd {
    let mut cmd = redis::cmd("TB.MCONSUME");
    for (k, max, rate, cost) in groups {
        cmd.arg(k.as_slice()).arg(*max).arg(*rate).arg(*cost);
    }
    cmd
}

/// TB.MCONSUME at its limit: 10,000 groups work, 10,001 are refused, and a
/// bad last group (number, duplicate, wrong type) writes none of the others.
#[test]
fn mconsume_at_the_group_limit() {
    let started = Instant::now();
    let mut s = Server::start();
    let mut c = s.conn();
    // 0.001 tokens/s: no refill worth counting while the test runs.
    let group = |i: usize| (format!("g{i}").into_bytes(), "10", "0.001", "1");
    let mut groups: Vec<_> = (0..10_000).map(group).collect();

    // 10,001 groups: refused before anything is read.
    groups.push(group(10_000));
    let err = error_of(&mut c, &mconsume(&groups));
    assert_eq!(err, "ERR too many buckets: at most 10000 groups per call");
    groups.pop();
    assert_eq!(dbsize(&mut c), 0);

    // A bad number, a duplicate key, a wrong type in the 10,000th group.
    let last = groups.len() - 1;
    let mut bad = groups.clone();
    bad[last].3 = "nan";
    let err = error_of(&mut c, &mconsume(&bad));
    assert_eq!(
        err,
        "ERR cost must be a finite decimal number (group 10000)"
    );
    let mut dup = groups.clone();
    dup[last].0 = b"g1234".to_vec();
    let err = error_of(&mut c, &mconsume(&dup));
    assert_eq!(
        err,
        "ERR duplicate key: group 10000 repeats the key of group 1235"
    );
    assert_eq!(dbsize(&mut c), 0, "a refused call wrote buckets");
    let _: () = redis::cmd("RPUSH")
        .arg("g9999")
        .arg("x")
        .query(&mut c)
        .unwrap();
    let err = error_of(&mut c, &mconsume(&groups));
    assert_eq!(err, WRONGTYPE);
    assert_eq!(dbsize(&mut c), 1, "a refused call wrote buckets");
    let _: () = redis::cmd("DEL").arg("g9999").query(&mut c).unwrap();
    let _: () = redis::cmd("HSET")
        .arg("g9999")
        .arg("tokens")
        .arg("nan")
        .arg("ts")
        .arg("1")
        .query(&mut c)
        .unwrap();
    let err = error_of(&mut c, &mconsume(&groups));
    assert_eq!(
        err,
        "ERR key is not a token bucket: field tokens is not a finite decimal number (group 10000)"
    );
    let _: () = redis::cmd("DEL").arg("g9999").query(&mut c).unwrap();

    // 10,000 groups: admitted, each charged, one reply of 10,002 entries.
    for round in 0..3 {
        let v: Value = mconsume(&groups).query(&mut c).expect("10,000 groups");
        let Value::Array(items) = &v else {
            panic!("{v:?}")
        };
        assert_eq!(items.len(), 10_002);
        assert_eq!(items[0], Value::Int(1));
        assert_eq!(items[1], Value::Int(0));
        for item in &items[2..] {
            assert_eq!(ints(item).unwrap()[..2], [1, 9 - round]);
        }
        assert_eq!(dbsize(&mut c), 10_000);
    }
    // All-or-nothing at scale: one drained bucket denies all 10,000.
    consume(&mut c, "g5000", "10", "0.001", "7");
    let v: Value = mconsume(&groups).query(&mut c).expect("denied");
    let Value::Array(items) = &v else {
        panic!("{v:?}")
    };
    assert_eq!(items[0], Value::Int(0));
    assert_eq!(
        hgetall(&mut c, "g0")["tokens"]
            .parse::<f64>()
            .unwrap()
            .floor(),
        7.0
    );

    assert!(s.is_alive());
    assert_eq!(tb_counter(&mut c, "tb_panics"), 0);
    eprintln!(
        "group-limit checks in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// The size limits Redis itself puts on keys and arguments: a 1 MiB key
/// is an ordinary bucket; an argument beyond proto-max-bulk-len (512 MB by
/// default, lowered here) is refused by the server before any command runs,
/// and the server carries on.
#[test]
fn huge_keys_and_arguments() {
    let mut s = Server::with(Config::default().arg("proto-max-bulk-len", "2mb"));
    let mut c = s.conn();
    let big = vec![b'k'; 1 << 20];
    let r: Vec<i64> = redis::cmd("TB.CONSUME")
        .arg(&big)
        .arg("10")
        .arg("1")
        .arg("3")
        .query(&mut c)
        .expect("1 MiB key");
    assert_eq!(r[..2], [1, 7]);
    assert_eq!(hgetall(&mut c, &big)["tokens"], "7");
    // A 1 MiB number is just not a number.
    let err = error_of(
        &mut c,
        redis::cmd("TB.CONSUME")
            .arg("k")
            .arg(vec![b'1'; 1 << 20])
            .arg("1"),
    );
    assert_eq!(err, "ERR max must be a finite decimal number");

    let mut other = s.conn();
    let too_big = vec![b'k'; 3 << 20];
    let res = redis::cmd("TB.CONSUME")
        .arg(&too_big)
        .arg("10")
        .arg("1")
        .query::<Value>(&mut other);
    let e = res.expect_err("a key over proto-max-bulk-len");
    assert!(
        e.to_string().contains("invalid bulk length")
            || e.is_io_error()
            || e.is_connection_dropped(),
        "{e:?}"
    );
    assert!(s.is_alive());
    let pong: String = redis::cmd("PING").query(&mut c).expect("PING");
    assert_eq!(pong, "PONG");
    assert_eq!(dbsize(&mut c), 1);
}
