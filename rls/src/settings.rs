//! Flags, and envoyproxy/ratelimit's environment variables where a flag
//! is not given (so its manifests work by changing the image).

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
}

impl Settings {
    /// From the flags, then `env` (a variable's value by name).
    pub fn resolve(flags: Flags, env: impl Fn(&str) -> Option<String>) -> Result<Settings, Error> {
        let var = |name: &str, default: &str| {
            env(name)
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| default.to_string())
        };
        let flag = |name: &str| -> Result<bool, Error> {
            match var(name, "").as_str() {
                "" => Ok(true),
                "true" | "1" | "TRUE" | "True" => Ok(true),
                "false" | "0" | "FALSE" | "False" => Ok(false),
                other => Err(Error::Usage(format!("{name}={other}: give true or false"))),
            }
        };
        // The peer's default: the root is watched for a symlink swap.
        let watch_root_var = flag("RUNTIME_WATCH_ROOT")?;
        let (config, watch_root) = match flags.config {
            Some(path) => (path, None),
            None => {
                let root = PathBuf::from(var("RUNTIME_ROOT", "/srv/runtime_data/current"));
                let mut p = root.clone();
                p.push(var("RUNTIME_SUBDIRECTORY", ""));
                p.push(var("RUNTIME_APPDIRECTORY", "config"));
                (p, watch_root_var.then_some(root))
            }
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
        let headers = match var("LIMIT_RESPONSE_HEADERS_ENABLED", "false").as_str() {
            "true" | "1" | "TRUE" | "True" => {
                let d = HeaderNames::default();
                Some(HeaderNames {
                    limit: var("LIMIT_LIMIT_HEADER", &d.limit),
                    remaining: var("LIMIT_REMAINING_HEADER", &d.remaining),
                    reset: var("LIMIT_RESET_HEADER", &d.reset),
                })
            }
            "false" | "0" | "FALSE" | "False" => None,
            other => {
                return Err(Error::Usage(format!(
                    "LIMIT_RESPONSE_HEADERS_ENABLED={other}: give true or false"
                )))
            }
        };
        Ok(Settings {
            config,
            redis,
            grpc_addr,
            http_addr,
            headers,
            reload_every,
            watch_root,
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
