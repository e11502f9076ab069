//! The Lua library's quota functions against the module's quota commands,
//! on one server with a fake clock: one seeded random sequence of
//! TB.QUOTA, TB.QPEEK, TB.QADJUST, TB.CHARGE (quotas beside buckets,
//! with and without WAIT) and TB.ACQUIRE with quota and bucket clauses on
//! `m:` keys and tb_quota & co. on `l:` keys, with the clock stepped by µs to weeks (across midnights,
//! month ends and leap days, and back across them), and now and then a
//! random quota state planted on both sides. Replies, errors, stored
//! hashes, expire times and the replication stream must be identical.
//!
//! Valkey 9.1 under libfaketime, as `lua_differential.rs`. Set
//! `TB_DIFF_SEED` to replay another sequence.

use redis::Value;
use std::collections::BTreeMap;
use testkit::vectors::module_args;
use testkit::{
    hgetall, int, lazy_expiry_only, load_library, run, FakeClock, ReplicationStream, Rng,
};

/// 2028-02-28T23:00:00Z, an hour before a leap day, in µs.
const T0: i64 = 1_835_391_600_000_000;
const OPS: usize = 3000;
const KEYS: &[&str] = &["a", "b", "c"];
/// Buckets, for TB.CHARGE's BUCKET clauses.
const BUCKETS: &[&str] = &["x", "y"];
/// TB.ACQUIRE's lease key.
const LEASE_KEY: &str = "s";
const LIMITS: &[&str] = &["3", "10", "2.5", "1e6", "1e12", "7.25", "0.5"];
const PERIODS: &[&str] = &["DAY", "week", "Month", "YEAR", "60", "3600", "86400", "7"];
const AMOUNTS: &[&str] = &["1", "0", "2", "0.1", "3", "2.5", "0.5"];
const OFFSETS: &[&str] = &["0", "60", "-300", "330", "1439", "-1439"];
/// Arguments that are wrong, one of them now and then.
const BAD: &[&str] = &[
    "x",
    "0",
    "-1",
    "1e-300",
    "11",
    "HOUR",
    "10000000001",
    "1440",
    "1.5",
    "",
];

/// A valid argument from `good`, or now and then a bad one.
fn pick(rng: &mut Rng, good: &[&str]) -> String {
    let list = if rng.chance(0.03) { BAD } else { good };
    rng.pick(list).to_string()
}

fn seed() -> u64 {
    std::env::var("TB_DIFF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x0C_A1E7_DA12_2028)
}

/// A TB.CHARGE in the library's layout: 1 to 3 keys, quotas and buckets
/// (now and then a bucket clause on a quota key), with or without WAIT.
fn random_charge(rng: &mut Rng) -> (&'static str, Vec<String>, Vec<String>) {
    let mut keys: Vec<String> = Vec::new();
    let mut args = Vec::new();
    if rng.chance(0.4) {
        args.extend(["WAIT".to_string(), rng.below(20_000).to_string()]);
    }
    clauses(rng, &mut keys, &mut args);
    (
        if rng.chance(0.02) {
            "charges"
        } else {
            "charge"
        },
        keys,
        args,
    )
}

/// TB.ACQUIRE on the lease key `s` with one to three clauses, in the
/// library's keyword form.
fn random_acquire(rng: &mut Rng) -> (&'static str, Vec<String>, Vec<String>) {
    let mut keys = vec![LEASE_KEY.to_string()];
    let mut args = vec![
        pick(rng, &["1", "2", "3"]),
        pick(rng, &["1000", "30000"]),
        rng.pick(&["a", "b", "c"]).to_string(),
    ];
    if rng.chance(0.3) {
        args.push(pick(rng, &["1", "2"]));
    }
    clauses(rng, &mut keys, &mut args);
    ("acquire", keys, args)
}

/// One to three BUCKET or QUOTA clauses, their keys pushed on `keys`.
fn clauses(rng: &mut Rng, keys: &mut Vec<String>, args: &mut Vec<String>) {
    for _ in 0..1 + rng.below(3) {
        let bucket = rng.chance(0.5);
        let pool = if bucket != rng.chance(0.05) {
            BUCKETS
        } else {
            KEYS
        };
        let key = rng.pick(pool).to_string();
        if keys.contains(&key) && !rng.chance(0.1) {
            continue;
        }
        keys.push(key);
        if bucket {
            let max = pick(rng, &["10", "3", "1e6", "2.5"]);
            let rate = pick(rng, &["1", "0.5", "100", "0.01"]);
            args.extend(["BUCKET".to_string(), max, rate, pick(rng, AMOUNTS)]);
        } else {
            args.extend([
                "QUOTA".to_string(),
                pick(rng, LIMITS),
                pick(rng, PERIODS),
                pick(rng, AMOUNTS),
            ]);
            if rng.chance(0.3) {
                args.extend(["OFFSET".to_string(), pick(rng, OFFSETS)]);
            }
        }
    }
}

/// A call in the library's layout: its name, keys and ARGV.
fn random_call(rng: &mut Rng) -> (&'static str, Vec<String>, Vec<String>) {
    if rng.chance(0.3) {
        return random_charge(rng);
    }
    if rng.chance(0.2) {
        return random_acquire(rng);
    }
    let name = *rng.pick(&["quota", "quota", "quota", "qpeek", "qadjust"]);
    let key = rng.pick(KEYS).to_string();
    let mut args = vec![pick(rng, LIMITS), pick(rng, PERIODS)];
    if name == "qadjust" || rng.chance(0.7) {
        let amount = pick(rng, AMOUNTS);
        args.push(if name == "qadjust" && rng.chance(0.5) {
            format!("-{amount}")
        } else {
            amount
        });
    }
    if rng.chance(0.4) {
        let word = if rng.chance(0.97) { "OFFSET" } else { "OFF" };
        args.extend([word.to_string(), pick(rng, OFFSETS)]);
    }
    if rng.chance(0.01) {
        args.push("1".to_string());
    }
    (name, vec![key], args)
}

/// A clock step: mostly small, sometimes hours to weeks, now and then back.
fn step(rng: &mut Rng) -> i64 {
    match rng.below(100) {
        0..=29 => 0,
        30..=59 => rng.below(5_000_000) as i64,
        60..=79 => rng.below(3_600_000_000) as i64,
        80..=91 => rng.below(14 * 86_400_000_000) as i64,
        _ => -(rng.below(86_400_000_000) as i64),
    }
}

/// What a key holds, on either side: its hash and expire time.
fn state(c: &mut redis::Connection, key: &str) -> (BTreeMap<String, String>, i64) {
    (hgetall(c, key), int(c, "PEXPIRETIME", key))
}

/// The stream's commands on `prefix`-ed keys, the prefix taken off.
fn ours(stream: Vec<Vec<String>>, prefix: &str) -> Vec<Vec<String>> {
    stream
        .into_iter()
        .filter(|cmd| cmd.get(1).is_some_and(|k| k.starts_with(prefix)))
        .map(|mut cmd| {
            cmd[1] = cmd[1].trim_start_matches(prefix).to_string();
            if cmd[0].eq_ignore_ascii_case("HSET") && cmd.len() == 6 {
                // The module writes the shortest decimal, the library %.17g.
                if let Ok(u) = cmd[3].parse::<f64>() {
                    cmd[3] = format!("bits {:#x}", u.to_bits());
                }
            }
            cmd
        })
        .collect()
}

#[test]
fn random_quota_sequence_matches_the_module() {
    let seed = seed();
    let mut rng = Rng(seed);
    let clock = FakeClock::new(T0);
    // Active expiry on a stepped clock stops after a key or two, so it
    // would expire one side of a pair and not the other: keys expire
    // only when an op opens them, on both sides alike.
    let s = lazy_expiry_only(clock.config());
    let mut c = s.conn();
    load_library(&mut c);
    let mut now = T0;
    let mut stream = ReplicationStream::attach_ticking(&s, || {
        now += 1000;
        clock.set(now);
    });
    let (mut admitted, mut denied, mut errors, mut back, mut charged) = (0, 0, 0, 0, 0);
    let mut acquired = 0;
    for i in 0..OPS {
        let dt = step(&mut rng);
        back += usize::from(dt < 0);
        now += dt;
        clock.set(now);
        if rng.chance(0.04) {
            // A planted state: any period start near the clock, possibly
            // ahead of it (a clock stepped back), or not canonical.
            let key = rng.pick(KEYS);
            let start = now / 1_000_000 + rng.below(200_000) as i64 - 100_000;
            let start = if rng.chance(0.1) {
                format!("0{start}")
            } else {
                start.to_string()
            };
            let used = rng
                .pick(&["0", "1", "2.5", "-4", "30", "1e13", "nan"])
                .to_string();
            for p in ["m:", "l:"] {
                let _: () = redis::cmd("HSET")
                    .arg(format!("{p}{key}"))
                    .arg(&["used", &used, "start", &start])
                    .query(&mut c)
                    .unwrap();
            }
        }
        let (name, keys, args) = random_call(&mut rng);
        let ctx = format!(
            "op {i} (seed {seed:#x}, T0{:+}us): {name} {keys:?} {args:?}",
            now - T0
        );
        // Expire both sides alike before the calls, then set the stream aside.
        for key in &keys {
            for p in ["m:", "l:"] {
                int(&mut c, "EXISTS", format!("{p}{key}"));
            }
        }
        stream.take(&mut c);
        let on = |p: &str| keys.iter().map(|k| format!("{p}{k}")).collect::<Vec<_>>();
        let mut module = redis::cmd(&format!("TB.{}", name.to_uppercase()));
        if name.starts_with("charge") {
            module.arg(keys.len()).arg(on("m:")).arg(&args);
        } else {
            module.arg(module_args(name, &on("m:"), &args));
        }
        let by_module = run(&mut c, &module);
        let module_sent = ours(stream.take(&mut c), "m:");
        let fcall = if name == "qpeek" { "FCALL_RO" } else { "FCALL" };
        let by_library = run(
            &mut c,
            redis::cmd(fcall)
                .arg(format!("tb_{name}"))
                .arg(keys.len())
                .arg(on("l:"))
                .arg(&args),
        )
        .map_err(|e| e.replace(&format!("'tb_{name}'"), &format!("'tb.{name}'")));
        let library_sent = ours(stream.take(&mut c), "l:");
        if name == "charges" {
            // No such command, nor function: both refuse it.
            assert!(by_module.is_err() && by_library.is_err(), "{ctx}");
            continue;
        }
        assert_eq!(by_library, by_module, "{ctx}");
        assert_eq!(library_sent, module_sent, "replicated by {ctx}");
        for key in &keys {
            let (m, l) = (
                state(&mut c, &format!("m:{key}")),
                state(&mut c, &format!("l:{key}")),
            );
            // A bucket's tokens or a quota's used, as the double it spells.
            let bits = |h: &BTreeMap<String, String>, f: &str| {
                h.get(f)
                    .and_then(|u| u.parse::<f64>().ok())
                    .map(f64::to_bits)
            };
            for f in ["used", "tokens"] {
                assert_eq!(bits(&l.0, f), bits(&m.0, f), "{f} of {key} after {ctx}");
            }
            let rest =
                |h: &BTreeMap<String, String>| (h.get("start").cloned(), h.get("ts").cloned());
            assert_eq!((rest(&l.0), l.1), (rest(&m.0), m.1), "{key} after {ctx}");
            if key == LEASE_KEY {
                assert_eq!(l, m, "the leases after {ctx}");
            }
        }
        let took = matches!(&by_module, Ok(Value::Array(r)) if r.first() == Some(&Value::Int(1)));
        charged += usize::from(name == "charge" && took);
        acquired += usize::from(
            name == "acquire" && took && args.iter().any(|a| a.eq_ignore_ascii_case("QUOTA")),
        );
        match by_module {
            Ok(Value::Array(r)) if r.first() == Some(&Value::Int(1)) => admitted += 1,
            Ok(_) => denied += 1,
            Err(_) => errors += 1,
        }
    }
    // What the sequence exercised, so a dull generator fails the test.
    assert!(
        admitted > 1000
            && denied > 100
            && errors > 100
            && back > 100
            && charged > 200
            && acquired > 50,
        "{admitted} {denied} {errors} {back} {charged} {acquired}"
    );
}
