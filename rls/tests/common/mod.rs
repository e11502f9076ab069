//! A real tb-rls process for the integration tests (rls.rs, reload.rs,
//! failure.rs, eval.rs...): its flags, its first stdout line, its stderr
//! as lines, and a tonic client built from the same envoy-types protos.
#![allow(dead_code)]

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;
use testkit::Server;
use tonic::transport::Channel;

pub const OK: i32 = Code::Ok as i32;
pub const OVER: i32 = Code::OverLimit as i32;

/// A tb-rls process, killed on drop, with its scratch directory.
pub struct Rls {
    pub child: Child,
    pub grpc: String,
    pub http: String,
    /// The first stdout line: the bound addresses and the backend.
    pub line: String,
    pub dir: PathBuf,
    pub config: PathBuf,
    stderr: mpsc::Receiver<String>,
}

impl Drop for Rls {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Rls {
    /// The next line tb-rls writes to stderr, waiting at most `within`.
    pub fn stderr_line(&self, within: Duration) -> Option<String> {
        self.stderr.recv_timeout(within).ok()
    }

    /// Waits (bounded) for a stderr line holding `needle`; the lines before it.
    pub fn wait_stderr(&self, needle: &str) -> (String, Vec<String>) {
        let mut before = Vec::new();
        while let Some(line) = self.stderr_line(Duration::from_secs(20)) {
            if line.contains(needle) {
                return (line, before);
            }
            before.push(line);
        }
        panic!("no stderr line with {needle:?}; saw {before:?}");
    }

    /// Every stderr line written so far.
    pub fn stderr_so_far(&self) -> Vec<String> {
        self.stderr.try_iter().collect()
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .unwrap()
    }
}

pub fn scratch(name: &str) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tb-rls-{}-{name}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// tb-rls on `config` (written to config.yaml in a scratch directory,
/// returned) and `redis`, on free ports, not started.
pub fn command(config: &str, redis: &Server) -> (Command, PathBuf) {
    let dir = scratch("cfg");
    std::fs::write(dir.join("config.yaml"), config).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tb-rls"));
    cmd.arg("--config").arg(dir.join("config.yaml"));
    on(&mut cmd, &redis.url());
    (cmd, dir)
}

/// tb-rls on `config` and the Redis at `url` (as an ACL user, say).
pub fn start_at(config: &str, url: &str) -> Rls {
    let dir = scratch("cfg");
    let path = dir.join("config.yaml");
    std::fs::write(&path, config).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tb-rls"));
    cmd.arg("--config").arg(&path);
    on(&mut cmd, url);
    spawn(cmd, dir, path)
}

/// `--redis` and free loopback ports.
fn on(cmd: &mut Command, url: &str) {
    cmd.arg("--redis")
        .arg(url)
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"]);
}

/// tb-rls on `config`, with `args`.
pub fn start(config: &str, redis: &Server, args: &[&str]) -> Rls {
    start_env(config, redis, args, &[])
}

/// tb-rls on `config`, with `args` and environment variables `env`.
pub fn start_env(config: &str, redis: &Server, args: &[&str], env: &[(&str, &str)]) -> Rls {
    let (mut cmd, dir) = command(config, redis);
    cmd.args(args).envs(env.iter().copied());
    let path = dir.join("config.yaml");
    spawn(cmd, dir, path)
}

/// `cmd` (tb-rls with its config given, by flag or environment) on
/// `redis`, on free ports; `dir` is removed with it, `config` is what a
/// test rewrites.
pub fn launch(mut cmd: Command, redis: &Server, dir: PathBuf, config: PathBuf) -> Rls {
    on(&mut cmd, &redis.url());
    spawn(cmd, dir, config)
}

fn spawn(mut cmd: Command, dir: PathBuf, config: PathBuf) -> Rls {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
            .to_string()
    };
    let (grpc, http) = (field("grpc="), field("http="));
    let (tx, rx) = mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("{line}");
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Rls {
        child,
        grpc,
        http,
        line,
        dir,
        config,
        stderr: rx,
    }
}

pub fn descriptor(pairs: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: pairs
            .iter()
            .map(|(k, v)| rate_limit_descriptor::Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

/// A request of `domain` with `descriptors` and the request's hits_addend.
pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: hits,
    }
}

/// The service's answer to `r` (a gRPC error fails the test).
pub async fn ask(
    c: &mut RateLimitServiceClient<Channel>,
    r: RateLimitRequest,
) -> RateLimitResponse {
    c.should_rate_limit(r).await.unwrap().into_inner()
}

/// How many times Redis has run `command` (INFO commandstats, lower case).
pub fn calls(redis: &Server, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut redis.conn())
        .unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// One descriptor `k=v` of domain `d`.
pub fn one() -> RateLimitRequest {
    request("d", vec![descriptor(&[("k", "v")])], 0)
}

/// (code, remaining) of each status.
pub fn codes(r: &RateLimitResponse) -> Vec<(i32, u32)> {
    r.statuses
        .iter()
        .map(|s| (s.code, s.limit_remaining))
        .collect()
}

/// A limit of `n` a day on `k` in domain `d`.
pub fn daily(n: u32) -> String {
    format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: day, requests_per_unit: {n}}}\n")
}

/// SIGSTOP or SIGCONT to a redis-server.
pub fn signal(redis: &Server, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &redis.pid().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {}", redis.pid());
}
