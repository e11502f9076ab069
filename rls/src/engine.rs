//! Redis: every limit of a request in one TB.MCONSUME (the module), or
//! `FCALL tb_mconsume` (the Functions library) where the module is not
//! loaded, or `EVALSHA <sha> N keys... mconsume ...` (the EVAL script)
//! where Functions can't be used either (Redis 6.x, FUNCTION renamed away
//! or refused by an ACL), found at startup as the clients find it: the
//! call refused as an unknown command means the next backend. A request
//! with a calendar quota goes as one TB.CHARGE (or `FCALL tb_charge`, or
//! the script's `charge`) instead, buckets and quotas all-or-nothing.

use crate::error::Error;
use crate::plan::Group;
use crate::reply::Bucket;
use redis::aio::ConnectionManager;
use redis::Value;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// The Functions library, loaded where the module is missing.
pub const LIBRARY: &str = include_str!("../../lua/tb.lua");

/// The EVAL script, which build.rs has lua/gen_eval.py write from
/// lua/tb.lua: `EVALSHA <sha> numkeys key... <operation> arg...`.
pub const EVAL_SCRIPT: &str = include_str!(concat!(env!("OUT_DIR"), "/tb-eval.lua"));

/// The EVAL script's SHA1, as SCRIPT LOAD answers it.
pub fn eval_sha() -> &'static str {
    static SHA: OnceLock<String> = OnceLock::new();
    SHA.get_or_init(|| redis::Script::new(EVAL_SCRIPT).get_hash().to_string())
}

/// The discriminants are what `Engine::backend` stores (`from_u8`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Module = 0,
    Functions = 1,
    Eval = 2,
}

impl Backend {
    fn from_u8(n: u8) -> Backend {
        match n {
            1 => Backend::Functions,
            2 => Backend::Eval,
            _ => Backend::Module,
        }
    }
}

pub struct Engine {
    conn: ConnectionManager,
    /// The backend found last, as `Backend as u8`.
    backend: AtomicU8,
}

fn redis_err(e: &redis::RedisError) -> Error {
    Error::Redis(format!("redis: {e}"))
}

/// The server says this command doesn't exist here, or this user may not run it.
fn refused(text: &str) -> bool {
    let t = text.to_lowercase();
    t.contains("unknown command") || t.contains("no permissions to run")
}

fn function_missing(text: &str) -> bool {
    text.to_lowercase().contains("function not found")
}

/// Redis itself failed (a dropped connection, a timeout), as opposed to
/// answering: then no backend can be told from another.
fn unreachable(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal()
}

/// The head of a Lua call of `operation`: `FCALL tb_<operation>`, or
/// `EVALSHA <sha>`, whose operation follows the keys (`lua_operation`).
fn lua_head(backend: Backend, operation: &str) -> redis::Cmd {
    if backend == Backend::Eval {
        let mut c = redis::cmd("EVALSHA");
        c.arg(eval_sha());
        c
    } else {
        let mut c = redis::cmd("FCALL");
        c.arg(format!("tb_{operation}"));
        c
    }
}

/// The EVAL script's operation name, after the keys.
fn lua_operation(cmd: &mut redis::Cmd, backend: Backend, operation: &str) {
    if backend == Backend::Eval {
        cmd.arg(operation);
    }
}

/// The library's version, as `tb_version` answers it.
pub fn library_version() -> &'static str {
    let marker = "local LIBRARY_VERSION = '";
    LIBRARY
        .find(marker)
        .and_then(|at| {
            let rest = &LIBRARY[at + marker.len()..];
            rest.find('\'').map(|end| &rest[..end])
        })
        .unwrap_or("")
}

/// One all-or-nothing call of `groups`: TB.MCONSUME for buckets alone,
/// as before calendar quotas (the cheaper command), TB.CHARGE as soon as
/// one is a quota.
fn call(backend: Backend, groups: &[Group]) -> redis::Cmd {
    if groups.iter().any(|g| g.calendar.is_some()) {
        charge(backend, groups)
    } else {
        mconsume(backend, groups)
    }
}

/// `TB.CHARGE N keys... clauses...`, the library's `tb_charge` alike:
/// `BUCKET max rate cost` or `QUOTA limit period cost [OFFSET minutes]`.
fn charge(backend: Backend, groups: &[Group]) -> redis::Cmd {
    let mut cmd = match backend {
        Backend::Module => redis::cmd("TB.CHARGE"),
        Backend::Functions | Backend::Eval => lua_head(backend, "charge"),
    };
    cmd.arg(groups.len());
    for g in groups {
        cmd.arg(&g.key);
    }
    lua_operation(&mut cmd, backend, "charge");
    for g in groups {
        match g.calendar {
            Some(c) => {
                cmd.arg("QUOTA").arg(g.max).arg(c.period).arg(g.cost);
                if c.utc_offset_minutes != 0 {
                    cmd.arg("OFFSET").arg(c.utc_offset_minutes);
                }
            }
            None => {
                cmd.arg("BUCKET")
                    .arg(g.max)
                    .arg(g.rate.to_string())
                    .arg(g.cost);
            }
        }
    }
    cmd
}

fn mconsume(backend: Backend, groups: &[Group]) -> redis::Cmd {
    let mut cmd;
    match backend {
        Backend::Module => {
            cmd = redis::cmd("TB.MCONSUME");
            for g in groups {
                cmd.arg(&g.key)
                    .arg(g.max)
                    .arg(g.rate.to_string())
                    .arg(g.cost);
            }
        }
        Backend::Functions | Backend::Eval => {
            cmd = lua_head(backend, "mconsume");
            cmd.arg(groups.len());
            for g in groups {
                cmd.arg(&g.key);
            }
            lua_operation(&mut cmd, backend, "mconsume");
            for g in groups {
                cmd.arg(g.max).arg(g.rate.to_string()).arg(g.cost);
            }
        }
    }
    cmd
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        _ => None,
    }
}

/// `[allowed, retry_after_ms, b1, b2, ...]` with `n` buckets or quotas
/// (TB.MCONSUME's reply and TB.CHARGE's alike).
fn parse(reply: &Value, n: usize) -> Result<Vec<Bucket>, Error> {
    let bad = || {
        Error::Reply(format!(
            "redis: TB.MCONSUME or TB.CHARGE answered what it never answers: {reply:?}"
        ))
    };
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    if items.len() != n + 2 {
        return Err(bad());
    }
    let mut buckets = Vec::with_capacity(n);
    for item in &items[2..] {
        let Value::Array(b) = item else {
            return Err(bad());
        };
        let [a, rem, retry, reset] = b.as_slice() else {
            return Err(bad());
        };
        let (Some(a), Some(rem), Some(retry), Some(reset)) =
            (int(a), int(rem), int(retry), int(reset))
        else {
            return Err(bad());
        };
        buckets.push(Bucket {
            allowed: a == 1,
            remaining: rem,
            retry_after_ms: u64::try_from(retry).unwrap_or(0),
            reset_after_ms: u64::try_from(reset).unwrap_or(0),
        });
    }
    Ok(buckets)
}

impl Engine {
    /// Connects to `url` and finds the backend.
    pub async fn connect(url: &str) -> Result<Engine, Error> {
        let client =
            redis::Client::open(url).map_err(|e| Error::Usage(format!("--redis {url}: {e}")))?;
        let conn = ConnectionManager::new(client)
            .await
            .map_err(|e| Error::Redis(format!("redis at {url}: {e}")))?;
        let engine = Engine {
            conn,
            backend: AtomicU8::new(Backend::Module as u8),
        };
        engine.detect().await?;
        Ok(engine)
    }

    pub fn backend(&self) -> Backend {
        Backend::from_u8(self.backend.load(Ordering::Relaxed))
    }

    fn found(&self, backend: Backend) -> Result<Backend, Error> {
        self.backend.store(backend as u8, Ordering::Relaxed);
        Ok(backend)
    }

    /// The module if TB.MCONSUME runs (a cost-0 check writes nothing),
    /// else the Functions library, loaded if missing or not ours, else
    /// the EVAL script where FUNCTION is unknown (Redis 6.x) or refused
    /// (renamed away, an ACL): the clients' order and tests.
    pub async fn detect(&self) -> Result<Backend, Error> {
        let mut conn = self.conn.clone();
        let probe = [Group {
            key: "rls:{probe}".into(),
            max: 1,
            rate: 1.0,
            cost: 0,
            calendar: None,
        }];
        let module_said = match mconsume(Backend::Module, &probe)
            .query_async::<Value>(&mut conn)
            .await
        {
            Ok(_) => return self.found(Backend::Module),
            Err(e) if refused(&e.to_string()) => e.to_string(),
            Err(e) => return Err(redis_err(&e)),
        };
        let functions_said = match self.functions(&mut conn).await {
            Ok(()) => return self.found(Backend::Functions),
            Err(Ok(why)) => why,
            Err(Err(e)) => return Err(e),
        };
        match self.load_script().await {
            Ok(()) => self.found(Backend::Eval),
            Err(e) if unreachable(&e) => Err(redis_err(&e)),
            Err(e) => Err(Error::Redis(format!(
                "redis: no backend can run here (TB.MCONSUME: {module_said}; Functions: {functions_said}; SCRIPT LOAD: {e})"
            ))),
        }
    }

    /// The Functions library, ours or loaded now. Err(Ok(why)): Functions
    /// can't be used here (the next backend); Err(Err(..)): Redis failed.
    async fn functions(&self, conn: &mut ConnectionManager) -> Result<(), Result<String, Error>> {
        let version: Result<String, _> = redis::cmd("FCALL_RO")
            .arg("tb_version")
            .arg(0)
            .query_async(conn)
            .await;
        match &version {
            Ok(v) if v == library_version() => return Ok(()),
            Ok(_) => {}
            Err(e) if refused(&e.to_string()) => return Err(Ok(format!("FCALL_RO: {e}"))),
            Err(e) if function_missing(&e.to_string()) => {}
            Err(e) => return Err(Err(redis_err(e))),
        }
        let loaded: Result<String, _> = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(LIBRARY)
            .query_async(conn)
            .await;
        match loaded {
            Ok(_) => Ok(()),
            Err(e) if unreachable(&e) => Err(Err(redis_err(&e))),
            // Any answer but the name (unknown, NOPERM, a managed service
            // that disables it): the EVAL script needs no FUNCTION.
            Err(e) => Err(Ok(format!("FUNCTION LOAD: {e}"))),
        }
    }

    /// SCRIPT LOAD of the EVAL script: at startup, and again after a
    /// NOSCRIPT (SCRIPT FLUSH, a restart, a failover).
    async fn load_script(&self) -> Result<(), redis::RedisError> {
        let mut conn = self.conn.clone();
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(EVAL_SCRIPT)
            .query_async(&mut conn)
            .await?;
        if sha != eval_sha() {
            return Err(redis::RedisError::from((
                redis::ErrorKind::ResponseError,
                "SCRIPT LOAD answered another SHA1 than the script's",
                format!("{sha}, not {}", eval_sha()),
            )));
        }
        Ok(())
    }

    /// The enforced call's buckets (none if `enforced` is empty) and one
    /// bucket per shadow group, in one round trip. A backend gone since
    /// startup (a failover to a server without it, FUNCTION FLUSH) is
    /// found again, the EVAL script flushed (NOSCRIPT) loaded again, and
    /// the call sent once more: a refused call ran nothing.
    pub async fn decide(
        &self,
        enforced: &[Group],
        shadow: &[Group],
    ) -> Result<(Vec<Bucket>, Vec<Bucket>), Error> {
        match self.send(enforced, shadow).await {
            Err(e) if e.kind() == redis::ErrorKind::NoScriptError => {
                self.load_script().await.map_err(|e| redis_err(&e))?;
                self.send(enforced, shadow)
                    .await
                    .map_err(|e| redis_err(&e))?
            }
            Err(e) if refused(&e.to_string()) || function_missing(&e.to_string()) => {
                self.detect().await?;
                self.send(enforced, shadow)
                    .await
                    .map_err(|e| redis_err(&e))?
            }
            other => other.map_err(|e| redis_err(&e))?,
        }
    }

    async fn send(
        &self,
        enforced: &[Group],
        shadow: &[Group],
    ) -> Result<Result<(Vec<Bucket>, Vec<Bucket>), Error>, redis::RedisError> {
        let backend = self.backend();
        let mut pipe = redis::pipe();
        if !enforced.is_empty() {
            pipe.add_command(call(backend, enforced));
        }
        for g in shadow {
            pipe.add_command(call(backend, std::slice::from_ref(g)));
        }
        if enforced.is_empty() && shadow.is_empty() {
            return Ok(Ok((Vec::new(), Vec::new())));
        }
        let mut conn = self.conn.clone();
        let replies: Vec<Value> = pipe.query_async(&mut conn).await?;
        Ok(self.parse_all(&replies, enforced, shadow))
    }

    fn parse_all(
        &self,
        replies: &[Value],
        enforced: &[Group],
        shadow: &[Group],
    ) -> Result<(Vec<Bucket>, Vec<Bucket>), Error> {
        let mut at = 0;
        let mut first = Vec::new();
        if !enforced.is_empty() {
            first = parse(replies.first().unwrap_or(&Value::Nil), enforced.len())?;
            at = 1;
        }
        let mut rest = Vec::with_capacity(shadow.len());
        for i in 0..shadow.len() {
            let b = parse(replies.get(at + i).unwrap_or(&Value::Nil), 1)?;
            rest.extend(b);
        }
        Ok((first, rest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_eval_script_is_built_from_the_library_and_runs_both_operations() {
        assert!(EVAL_SCRIPT.starts_with("-- GENERATED by lua/gen_eval.py"));
        assert!(EVAL_SCRIPT.contains("redis.replicate_commands()"));
        for op in ["'mconsume', tb_mconsume", "'charge', tb_charge"] {
            assert!(EVAL_SCRIPT.contains(op), "{op}");
        }
        assert_eq!(eval_sha().len(), 40);
    }

    #[test]
    fn the_library_version_is_read_from_the_library() {
        let v = library_version();
        assert!(!v.is_empty() && !v.contains('\''), "{v}");
    }

    #[test]
    fn a_reply_of_the_wrong_shape_is_an_error_not_a_panic() {
        assert!(parse(&Value::Nil, 1).is_err());
        assert!(parse(&Value::Array(vec![Value::Int(1), Value::Int(0)]), 1).is_err());
        let good = Value::Array(vec![
            Value::Int(1),
            Value::Int(0),
            Value::Array(vec![
                Value::Int(1),
                Value::Int(9),
                Value::Int(0),
                Value::Int(100),
            ]),
        ]);
        let b = parse(&good, 1).unwrap();
        assert_eq!(
            (b[0].allowed, b[0].remaining, b[0].reset_after_ms),
            (true, 9, 100)
        );
    }

    #[test]
    fn both_backends_send_every_group() {
        let g = vec![
            Group {
                key: "a".into(),
                max: 2,
                rate: 0.5,
                cost: 1,
                calendar: None,
            },
            Group {
                key: "b".into(),
                max: 3,
                rate: 1.0,
                cost: 0,
                calendar: None,
            },
        ];
        let packed =
            |c: redis::Cmd| String::from_utf8_lossy(&c.get_packed_command()).replace("\r\n", " ");
        let m = packed(mconsume(Backend::Module, &g));
        assert!(
            m.contains("TB.MCONSUME $1 a $1 2 $3 0.5 $1 1 $1 b $1 3 $1 1 $1 0"),
            "{m}"
        );
        let f = packed(mconsume(Backend::Functions, &g));
        assert!(
            f.contains("FCALL $11 tb_mconsume $1 2 $1 a $1 b $1 2 $3 0.5 $1 1 $1 3 $1 1 $1 0"),
            "{f}"
        );
        assert_eq!(
            packed(call(Backend::Module, &g)),
            m,
            "buckets alone: MCONSUME"
        );
        let e = packed(mconsume(Backend::Eval, &g));
        assert!(
            e.contains(&format!(
                "EVALSHA $40 {} $1 2 $1 a $1 b $8 mconsume $1 2 $3 0.5 $1 1 $1 3 $1 1 $1 0",
                eval_sha()
            )),
            "{e}"
        );
    }

    #[test]
    fn a_calendar_quota_makes_the_call_a_charge_on_both_backends() {
        use crate::plan::Calendar;
        let g = vec![
            Group {
                key: "q".into(),
                max: 1000,
                rate: 0.0,
                cost: 3,
                calendar: Some(Calendar {
                    period: "MONTH",
                    utc_offset_minutes: 0,
                }),
            },
            Group {
                key: "b".into(),
                max: 60,
                rate: 1.0,
                cost: 3,
                calendar: None,
            },
            Group {
                key: "d".into(),
                max: 50,
                rate: 0.0,
                cost: 3,
                calendar: Some(Calendar {
                    period: "DAY",
                    utc_offset_minutes: -300,
                }),
            },
        ];
        let packed =
            |c: redis::Cmd| String::from_utf8_lossy(&c.get_packed_command()).replace("\r\n", " ");
        let clauses = "$1 q $1 b $1 d $5 QUOTA $4 1000 $5 MONTH $1 3 $6 BUCKET $2 60 $1 1 $1 3 $5 QUOTA $2 50 $3 DAY $1 3 $6 OFFSET $4 -300";
        let m = packed(call(Backend::Module, &g));
        assert!(m.contains(&format!("$9 TB.CHARGE $1 3 {clauses}")), "{m}");
        let f = packed(call(Backend::Functions, &g));
        assert!(
            f.contains(&format!("$5 FCALL $9 tb_charge $1 3 {clauses}")),
            "{f}"
        );
        let keys = "$1 3 $1 q $1 b $1 d";
        let e = packed(call(Backend::Eval, &g));
        assert!(
            e.contains(&format!(
                "$7 EVALSHA $40 {} {keys} $6 charge{}",
                eval_sha(),
                &clauses["$1 q $1 b $1 d".len()..]
            )),
            "{e}"
        );
    }
}
