//! The contract cases of `tests/vectors.json` on real servers with a fake
//! clock, through every form of the contract:
//!
//! * Valkey 9.1 and Redis 8.2: the module (TB.*), the library (FCALL /
//!   FCALL_RO) and the EVAL scripts (EVALSHA), buckets and leases alike;
//! * Redis 6.2 without the module: the EVAL scripts.
//!
//! `core/tests/vectors.rs` checks the same file against tb_core. For each
//! case the stored state is written with HSET/SET and the clock is set to
//! `base_ts_us + elapsed_us`, then the reply, or error, and every key after
//! the call are compared with the file.

use redis::Value;
use testkit::vectors::{vectors, After, Before, Case};
use testkit::{
    hgetall, info_field, int, load_eval_script, load_library, pypi_server, run, Config, FakeClock,
    Pypi, Server,
};

/// How a case is sent to the server.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Form {
    Module,
    Library,
    Eval,
}

/// A server and what it can run.
struct Target {
    name: &'static str,
    conn: redis::Connection,
    clock: FakeClock,
    forms: Vec<Form>,
    /// SHA1 of the EVAL script.
    sha: String,
    /// PEXPIRETIME exists (Redis >= 7); else PTTL on the frozen clock.
    expiretime: bool,
    _server: Server,
}

impl Target {
    fn start(name: &'static str, config: impl Fn(&FakeClock) -> Config, forms: Vec<Form>) -> Self {
        let clock = FakeClock::new(1_893_456_000_000_000);
        let server = Server::with(config(&clock));
        let mut conn = server.conn();
        if forms.contains(&Form::Library) {
            load_library(&mut conn);
        }
        let sha = load_eval_script(&mut conn);
        let version = info_field(&mut conn, "server", "redis_version");
        let expiretime = !version.starts_with("6.");
        Target {
            name,
            conn,
            clock,
            forms,
            sha,
            expiretime,
            _server: server,
        }
    }

    fn command(&self, form: Form, case: &Case) -> redis::Cmd {
        match form {
            Form::Module => {
                let mut cmd = redis::cmd(&format!("TB.{}", case.command.to_uppercase()));
                cmd.arg(case.module_args());
                cmd
            }
            Form::Library | Form::Eval => {
                let mut cmd = if form == Form::Eval {
                    let mut c = redis::cmd("EVALSHA");
                    c.arg(&self.sha);
                    c
                } else if ["peek", "qpeek", "inflight"].contains(&case.command.as_str()) {
                    let mut c = redis::cmd("FCALL_RO");
                    c.arg(format!("tb_{}", case.command));
                    c
                } else {
                    let mut c = redis::cmd("FCALL");
                    c.arg(format!("tb_{}", case.command));
                    c
                };
                cmd.arg(case.keys.len()).arg(&case.keys);
                if form == Form::Eval {
                    cmd.arg(&case.command);
                }
                cmd.arg(&case.args);
                cmd
            }
        }
    }

    /// Writes the case's state at its own clock, then runs it.
    fn run(&mut self, base: i64, form: Form, case: &Case) -> Result<Value, String> {
        let c = &mut self.conn;
        let _: () = redis::cmd("FLUSHALL").arg("SYNC").query(c).unwrap();
        for (key, value) in &case.state {
            let _: () = match value {
                Before::Hash(h) => redis::cmd("HSET").arg(key).arg(h).query(c),
                Before::String(s) => redis::cmd("SET").arg(key).arg(s).query(c),
            }
            .unwrap();
        }
        self.clock.set(base + case.elapsed_us);
        let cmd = self.command(form, case);
        run(&mut self.conn, &cmd)
    }

    /// Every key of the case against what the file expects after the call
    /// (after an error, every key is as it was).
    fn check_keys(&mut self, now: i64, form: Form, case: &Case, ctx: &str) {
        let mut keys: Vec<&String> = case.keys.iter().chain(case.state.keys()).collect();
        keys.sort();
        keys.dedup();
        for key in keys {
            let expected = case.after.as_ref().and_then(|a| a.get(key));
            let c = &mut self.conn;
            match expected {
                None => self.check_unchanged(case, key, ctx),
                Some(After::Same(s)) if s == "unchanged" => self.check_unchanged(case, key, ctx),
                Some(After::Same(s)) if s == "absent" => {
                    assert_eq!(int(c, "EXISTS", key), 0, "{ctx}: {key} exists");
                }
                Some(After::Bucket {
                    tokens,
                    ts,
                    expire_at_ms,
                }) => {
                    let h = hgetall(c, key);
                    assert_eq!(
                        h.keys().collect::<Vec<_>>(),
                        ["tokens", "ts"],
                        "{ctx}: {key} {h:?}"
                    );
                    let bits = |s: &str| s.parse::<f64>().map(f64::to_bits).ok();
                    assert_eq!(bits(&h["tokens"]), bits(tokens), "{ctx}: {key} {h:?}");
                    if form == Form::Module {
                        // The module writes the shortest round-trip decimal.
                        assert_eq!(&h["tokens"], tokens, "{ctx}: {key}");
                    }
                    assert_eq!(&h["ts"], ts, "{ctx}: {key}");
                    self.check_expire_at(now, key, *expire_at_ms, ctx);
                }
                Some(After::Quota {
                    used,
                    start,
                    expire_at_ms,
                }) => {
                    let h = hgetall(c, key);
                    assert_eq!(
                        h.keys().collect::<Vec<_>>(),
                        ["start", "used"],
                        "{ctx}: {key} {h:?}"
                    );
                    let bits = |s: &str| s.parse::<f64>().map(f64::to_bits).ok();
                    assert_eq!(bits(&h["used"]), bits(used), "{ctx}: {key} {h:?}");
                    if form == Form::Module {
                        assert_eq!(&h["used"], used, "{ctx}: {key}");
                    }
                    assert_eq!(&h["start"], start, "{ctx}: {key}");
                    self.check_expire_at(now, key, *expire_at_ms, ctx);
                }
                Some(After::Leases {
                    leases,
                    expire_at_ms,
                }) => {
                    assert_eq!(&hgetall(c, key), leases, "{ctx}: {key}");
                    self.check_expire_at(now, key, *expire_at_ms, ctx);
                }
                Some(other) => panic!("{ctx}: bad expectation for {key}: {other:?}"),
            }
        }
    }

    /// The key's absolute expiry, in ms.
    fn check_expire_at(&mut self, now: i64, key: &str, expire_at_ms: i64, ctx: &str) {
        let c = &mut self.conn;
        if self.expiretime {
            assert_eq!(int(c, "PEXPIRETIME", key), expire_at_ms, "{ctx}: {key}");
        } else {
            // The clock is frozen, so PTTL is exact.
            let pttl = expire_at_ms - now.div_euclid(1000);
            assert_eq!(int(c, "PTTL", key), pttl, "{ctx}: {key}");
        }
    }

    /// The key holds exactly the state the case wrote, without an expiry.
    fn check_unchanged(&mut self, case: &Case, key: &str, ctx: &str) {
        let c = &mut self.conn;
        match case.state.get(key) {
            Some(Before::Hash(h)) => assert_eq!(&hgetall(c, key), h, "{ctx}: {key}"),
            Some(Before::String(s)) => {
                let v: String = redis::cmd("GET").arg(key).query(c).unwrap();
                assert_eq!(&v, s, "{ctx}: {key}");
            }
            None => {
                assert_eq!(int(c, "EXISTS", key), 0, "{ctx}: {key} was created");
                return;
            }
        }
        assert_eq!(int(c, "PTTL", key), -1, "{ctx}: {key} got an expiry");
    }
}

/// The reply as JSON, the way the file spells it.
fn json(v: &Value) -> serde_json::Value {
    match v {
        Value::Int(n) => serde_json::json!(n),
        Value::Array(a) => serde_json::Value::Array(a.iter().map(json).collect()),
        other => panic!("unexpected reply {other:?}"),
    }
}

fn check_all(target: &mut Target) {
    let v = vectors();
    assert!(v.cases.len() >= 30);
    for form in target.forms.clone() {
        for case in &v.cases {
            let ctx = format!("{} via {form:?}: {}", target.name, case.name);
            let got = target.run(v.base_ts_us, form, case);
            match (&case.error, &case.reply) {
                (Some(e), _) => {
                    // The Lua forms name the function in arity errors.
                    let e = if form == Form::Module {
                        e.clone()
                    } else {
                        e.replace("'tb.", "'tb_")
                    };
                    assert_eq!(got, Err(e), "{ctx}");
                }
                (None, Some(reply)) => {
                    let got = got.unwrap_or_else(|e| panic!("{ctx}: error {e}"));
                    assert_eq!(&json(&got), reply, "{ctx}");
                }
                (None, None) => panic!("{ctx}: no reply and no error"),
            }
            target.check_keys(v.base_ts_us + case.elapsed_us, form, case, &ctx);
        }
    }
}

#[test]
fn vectors_hold_for_module_library_and_scripts_on_valkey() {
    let mut t = Target::start(
        "valkey 9.1",
        |clock| clock.config(),
        vec![Form::Module, Form::Library, Form::Eval],
    );
    check_all(&mut t);
}

#[test]
fn vectors_hold_for_module_library_and_scripts_on_redis_8_2() {
    let mut t = Target::start(
        "redis 8.2",
        |clock| Config {
            bin: pypi_server(Pypi::Redis82),
            ..clock.config()
        },
        vec![Form::Module, Form::Library, Form::Eval],
    );
    check_all(&mut t);
}

#[test]
fn vectors_hold_for_the_scripts_on_redis_6_2() {
    let mut t = Target::start(
        "redis 6.2",
        |clock| Config {
            bin: pypi_server(Pypi::Redis62),
            module: false,
            ..clock.config()
        },
        vec![Form::Eval],
    );
    check_all(&mut t);
}
