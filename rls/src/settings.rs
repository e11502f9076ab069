//! Flags, and envoyproxy/ratelimit's environment variables where a flag
//! is not given (so its manifests work by changing the image).

use crate::breaker::Limits;
use crate::error::Error;
use crate::reply::HeaderNames;
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "tb-rls",
    about = "Envoy's rate limit service (RLS v3) on token buckets"
)]
pub struct Flags {
    /// A config file or a directory of them (default: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// redis://host:port/ (default: REDIS_URL as host:port, else 127.0.0.1:6379).
    #[arg(long)]
    pub redis: Option<String>,
    /// gRPC address (default: GRPC_HOST:GRPC_PORT, 0.0.0.0:8081). Port 0 picks a free one.
    #[arg(long)]
    pub grpc_addr: Option<String>,
    /// HTTP address of /healthcheck (default: HOST:PORT, 0.0.0.0:8080).
    #[arg(long)]
    pub http_addr: Option<String>,
    /// How often the config is read again for a reload, in ms; 0: never.
    #[arg(long, default_value_t = 1000)]
    pub watch_interval_ms: u64,
    /// Each call's Redis deadline, a duration such as 250ms or 2s; past it
    /// the call is a Redis failure (default: REDIS_TIMEOUT, else 1s).
    #[arg(long)]
    pub redis_timeout: Option<String>,
    /// What a call answers when Redis fails: closed (gRPC UNAVAILABLE, so
    /// Envoy's failure_mode_deny decides) or open (OK).
    #[arg(long, value_enum, default_value_t = OnError::Closed)]
    pub on_redis_error: OnError,
    /// Redis failures within --breaker-window-ms that open the breaker; 0: no breaker.
    #[arg(long, default_value_t = 5)]
    pub breaker_failures: usize,
    #[arg(long, default_value_t = 10_000)]
    pub breaker_window_ms: u64,
    /// How long an open breaker answers without Redis before one call probes it.
    #[arg(long, default_value_t = 2_000)]
    pub breaker_cooldown_ms: u64,
    /// Decisions waiting on Redis at once; beyond, a call is answered
    /// RESOURCE_EXHAUSTED at once. 0: no bound.
    #[arg(long, default_value_t = 1000)]
    pub max_in_flight: usize,
}

/// The failure policy.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    Open,
    Closed,
}

/// A Go duration (the peer's REDIS_TIMEOUT): decimal numbers, each with a
/// unit of ns, us, µs, ms, s, m or h, e.g. `1.5s`, `1m30s`, `250ms`.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let mut total = 0f64;
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += number * seconds;
    }
    Duration::try_from_secs_f64(total).ok()
}

#[derive(Debug, PartialEq)]
pub struct Settings {
    pub config: PathBuf,
    pub redis: String,
    pub grpc_addr: String,
    pub http_addr: String,
    pub headers: Option<HeaderNames>,
    /// None: no reload.
    pub reload_every: Option<Duration>,
    /// RUNTIME_WATCH_ROOT (when `config` comes from RUNTIME_ROOT): the
    /// root whose symlink swap publishes a new config.
    pub watch_root: Option<PathBuf>,
    pub failure: Failure,
}

/// What a call does when Redis fails or is slow.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub redis_timeout: Duration,
    pub on_error: OnError,
    /// None: no breaker.
    pub breaker: Option<Limits>,
    /// None: no bound.
    pub max_in_flight: Option<usize>,
}

/// A variable as the peer reads it: unset or empty is `default`.
pub fn env_var(env: &dyn Fn(&str) -> Option<String>, name: &str, default: &str) -> String {
    env(name)
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_string())
}

/// A true/false variable, in the forms the peer's Go parser takes; unset
/// or empty is `default`.
pub fn env_bool(
    env: &dyn Fn(&str) -> Option<String>,
    name: &str,
    default: bool,
) -> Result<bool, Error> {
    match env_var(env, name, "").as_str() {
        "" => Ok(default),
        "true" | "1" | "TRUE" | "True" => Ok(true),
        "false" | "0" | "FALSE" | "False" => Ok(false),
        other => Err(Error::Usage(format!("{name}={other}: give true or false"))),
    }
}

impl Settings {
    /// From the flags, then `env` (a variable's value by name).
    pub fn resolve(flags: Flags, env: impl Fn(&str) -> Option<String>) -> Result<Settings, Error> {
        let var = |name: &str, default: &str| env_var(&env, name, default);
        let (config, watch_root) = match flags.config {
            Some(path) => (path, None),
            None => {
                // The peer's default: the root is watched for a symlink swap.
                let watch_root_var = env_bool(&env, "RUNTIME_WATCH_ROOT", true)?;
                let root = PathBuf::from(var("RUNTIME_ROOT", "/srv/runtime_data/current"));
                let mut p = root.clone();
                p.push(var("RUNTIME_SUBDIRECTORY", ""));
                p.push(var("RUNTIME_APPDIRECTORY", "config"));
                (p, watch_root_var.then_some(root))
            }
        };
        let (timeout_text, timeout_name) = match &flags.redis_timeout {
            Some(t) => (t.clone(), "--redis-timeout"),
            None => (var("REDIS_TIMEOUT", "1s"), "REDIS_TIMEOUT"),
        };
        let redis_timeout = parse_duration(&timeout_text)
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                Error::Usage(format!(
                    "{timeout_name} {timeout_text}: give a duration above 0 such as 250ms or 2s"
                ))
            })?;
        for (name, v) in [
            ("--breaker-window-ms", flags.breaker_window_ms),
            ("--breaker-cooldown-ms", flags.breaker_cooldown_ms),
        ] {
            if v == 0 {
                return Err(Error::Usage(format!("{name} 0: give at least 1")));
            }
        }
        let failure = Failure {
            redis_timeout,
            on_error: flags.on_redis_error,
            breaker: (flags.breaker_failures > 0).then_some(Limits {
                failures: flags.breaker_failures,
                window_ms: flags.breaker_window_ms,
                cooldown_ms: flags.breaker_cooldown_ms,
            }),
            max_in_flight: (flags.max_in_flight > 0).then_some(flags.max_in_flight),
        };
        let reload_every =
            (flags.watch_interval_ms > 0).then(|| Duration::from_millis(flags.watch_interval_ms));
        let redis = match flags.redis {
            Some(url) => url,
            None => {
                let raw = var("REDIS_URL", "127.0.0.1:6379");
                if raw.contains("://") {
                    raw
                } else if raw.starts_with('/') {
                    return Err(Error::Usage(format!(
                        "REDIS_URL {raw}: a unix socket is not supported; give host:port or --redis"
                    )));
                } else {
                    format!("redis://{raw}/")
                }
            }
        };
        let grpc_addr = flags.grpc_addr.unwrap_or_else(|| {
            format!(
                "{}:{}",
                var("GRPC_HOST", "0.0.0.0"),
                var("GRPC_PORT", "8081")
            )
        });
        let http_addr = flags
            .http_addr
            .unwrap_or_else(|| format!("{}:{}", var("HOST", "0.0.0.0"), var("PORT", "8080")));
        let headers = if env_bool(&env, "LIMIT_RESPONSE_HEADERS_ENABLED", false)? {
            let d = HeaderNames::default();
            Some(HeaderNames {
                limit: var("LIMIT_LIMIT_HEADER", &d.limit),
                remaining: var("LIMIT_REMAINING_HEADER", &d.remaining),
                reset: var("LIMIT_RESET_HEADER", &d.reset),
            })
        } else {
            None
        };
        Ok(Settings {
            config,
            redis,
            grpc_addr,
            http_addr,
            headers,
            reload_every,
            watch_root,
            failure,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn resolve(args: &[&str], env: &[(&str, &str)]) -> Result<Settings, Error> {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let flags =
            Flags::try_parse_from(std::iter::once("tb-rls").chain(args.iter().copied())).unwrap();
        Settings::resolve(flags, |k| env.get(k).cloned())
    }

    #[test]
    fn the_peers_variables_are_read_where_no_flag_is_given() {
        let s = resolve(
            &[],
            &[
                ("REDIS_URL", "redis.svc:6380"),
                ("GRPC_HOST", "127.0.0.1"),
                ("GRPC_PORT", "9000"),
                ("PORT", "9001"),
                ("RUNTIME_ROOT", "/data"),
                ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ],
        )
        .unwrap();
        assert_eq!(s.redis, "redis://redis.svc:6380/");
        assert_eq!(s.grpc_addr, "127.0.0.1:9000");
        assert_eq!(s.http_addr, "0.0.0.0:9001");
        assert_eq!(s.config, PathBuf::from("/data/ratelimit/config"));
        assert_eq!(s.headers, None);
        assert_eq!(s.watch_root, Some(PathBuf::from("/data")));
        assert_eq!(s.reload_every, Some(Duration::from_secs(1)));
        let s = resolve(
            &["--watch-interval-ms", "0"],
            &[("RUNTIME_WATCH_ROOT", "false")],
        )
        .unwrap();
        assert_eq!((s.watch_root, s.reload_every), (None, None));
        let e = resolve(&[], &[("RUNTIME_WATCH_ROOT", "yes")]).unwrap_err();
        assert_eq!(e.to_string(), "RUNTIME_WATCH_ROOT=yes: give true or false");
    }

    #[test]
    fn flags_win_over_variables() {
        let s = resolve(
            &[
                "--config",
                "x.yaml",
                "--redis",
                "redis://h:1/",
                "--grpc-addr",
                "127.0.0.1:0",
                "--http-addr",
                "127.0.0.1:0",
            ],
            &[("REDIS_URL", "other:2"), ("GRPC_PORT", "3")],
        )
        .unwrap();
        assert_eq!(
            (s.config, s.redis.as_str(), s.grpc_addr.as_str()),
            (PathBuf::from("x.yaml"), "redis://h:1/", "127.0.0.1:0")
        );
        assert_eq!(
            s.watch_root, None,
            "a --config of its own is watched as it is"
        );
    }

    #[test]
    fn the_failure_model_reads_redis_timeout_as_the_peer_writes_it() {
        let s = resolve(&[], &[]).unwrap();
        assert_eq!(
            s.failure,
            Failure {
                redis_timeout: Duration::from_secs(1),
                on_error: OnError::Closed,
                breaker: Some(Limits {
                    failures: 5,
                    window_ms: 10_000,
                    cooldown_ms: 2_000
                }),
                max_in_flight: Some(1000),
            }
        );
        let s = resolve(&[], &[("REDIS_TIMEOUT", "1m30.5s")]).unwrap();
        assert_eq!(s.failure.redis_timeout, Duration::from_millis(90_500));
        let s = resolve(
            &[
                "--redis-timeout",
                "250ms",
                "--on-redis-error",
                "open",
                "--breaker-failures",
                "0",
                "--max-in-flight",
                "0",
            ],
            &[("REDIS_TIMEOUT", "10s")],
        )
        .unwrap();
        assert_eq!(s.failure.redis_timeout, Duration::from_millis(250));
        assert_eq!(s.failure.on_error, OnError::Open);
        assert_eq!((s.failure.breaker, s.failure.max_in_flight), (None, None));
        for (args, env, want) in [
            (
                &[][..],
                &[("REDIS_TIMEOUT", "10")][..],
                "REDIS_TIMEOUT 10: give a duration above 0 such as 250ms or 2s",
            ),
            (
                &["--redis-timeout", "0s"][..],
                &[][..],
                "--redis-timeout 0s: give a duration above 0 such as 250ms or 2s",
            ),
            (
                &["--breaker-cooldown-ms", "0"][..],
                &[][..],
                "--breaker-cooldown-ms 0: give at least 1",
            ),
        ] {
            assert_eq!(resolve(args, env).unwrap_err().to_string(), want);
        }
        assert_eq!(parse_duration("1h2m"), Some(Duration::from_secs(3720)));
        assert_eq!(parse_duration("5x"), None);
        assert_eq!(parse_duration("ms"), None);
    }

    #[test]
    fn headers_are_the_peers_when_enabled_and_bad_values_are_refused() {
        let s = resolve(
            &[],
            &[
                ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
                ("LIMIT_RESET_HEADER", "X-Reset"),
            ],
        )
        .unwrap();
        let h = s.headers.unwrap();
        assert_eq!(
            (h.limit.as_str(), h.reset.as_str()),
            ("RateLimit-Limit", "X-Reset")
        );
        let e = resolve(&[], &[("LIMIT_RESPONSE_HEADERS_ENABLED", "sure")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "LIMIT_RESPONSE_HEADERS_ENABLED=sure: give true or false"
        );
        let e = resolve(&[], &[("REDIS_URL", "/var/run/nutcracker/ratelimit.sock")]).unwrap_err();
        assert!(e.to_string().contains("unix socket is not supported"));
    }
}
