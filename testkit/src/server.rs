//! Real redis-server processes on free loopback ports, each in its own
//! temporary directory, killed and cleaned up on drop.

use crate::client::{eventually, info_field, repl_offset};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

pub fn module_path() -> PathBuf {
    let path = std::env::var_os("TB_MODULE")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::root().join("target/release/libredis_tokenbucket.so"));
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

/// How many ports a start tries: a port is free when picked, but another
/// process (a parallel test binary) can take it before the server binds.
const PORT_ATTEMPTS: usize = 20;

/// The text every server version logs when it can't bind its port (or the
/// cluster bus port).
fn port_taken(output: &str) -> bool {
    output.contains("Address already in use")
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

/// A server exited at start because its port was taken.
#[derive(Debug)]
pub struct PortTaken;

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

    /// Starts a server on a free port, trying another one while the port
    /// turns out to be taken.
    pub fn with(config: Config) -> Server {
        for _ in 1..PORT_ATTEMPTS {
            if let Ok(s) = Server::on_port(free_port(), config.clone()) {
                return s;
            }
        }
        Server::on_port(free_port(), config).unwrap_or_else(|PortTaken| {
            panic!("{PORT_ATTEMPTS} ports in a row were taken before the server bound them")
        })
    }

    /// Starts a server on `port`; a server that fails for any other reason
    /// fails the test.
    pub fn on_port(port: u16, config: Config) -> Result<Server, PortTaken> {
        let mut s = Server {
            port,
            dir: scratch_dir(port),
            config,
            child: None,
        };
        // On error `s` is dropped, which removes its directory.
        s.launch()?;
        Ok(s)
    }

    fn launch(&mut self) -> Result<(), PortTaken> {
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
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<(), PortTaken> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    let mut err = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        let _ = e.read_to_string(&mut err);
                    }
                    self.child = None;
                    let log = self.log();
                    if port_taken(&log) || port_taken(&err) {
                        return Err(PortTaken);
                    }
                    panic!(
                        "server on port {} exited with {status}: {err}\n{log}",
                        self.port
                    );
                }
            }
            if self.answers() {
                return Ok(());
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

    /// Whether this server, and not another process that took the port,
    /// answers on it: PING passes (not LOADING) and INFO names our pid.
    /// Raw RESP with timeouts, since whatever holds the port may never
    /// answer, and the client's connection setup would wait for it forever.
    fn answers(&self) -> bool {
        let probe = || -> std::io::Result<bool> {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
            s.set_read_timeout(Some(Duration::from_secs(1)))?;
            s.write_all(b"PING\r\nINFO server\r\n")?;
            let mut reply = BufReader::new(s);
            let mut line = String::new();
            reply.read_line(&mut line)?;
            if line != "+PONG\r\n" {
                return Ok(false);
            }
            line.clear();
            reply.read_line(&mut line)?;
            let len: usize = line.trim_start_matches('$').trim().parse().unwrap_or(0);
            let mut info = vec![0; len];
            reply.read_exact(&mut info)?;
            let pid = format!("process_id:{}\r\n", self.pid());
            Ok(String::from_utf8_lossy(&info).contains(&pid))
        };
        probe().unwrap_or(false)
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

    /// A connection as the ACL user `name` (password `pw`), made first with
    /// `rules` (`~rl:*`, `-@all`, `+tb.consume`, ...).
    pub fn conn_as(&self, name: &str, rules: &[&str]) -> redis::Connection {
        let _: String = redis::cmd("ACL")
            .arg(&["SETUSER", name, "on", ">pw"])
            .arg(rules)
            .query(&mut self.conn())
            .expect("ACL SETUSER");
        redis::Client::open(format!("redis://{name}:pw@127.0.0.1:{}/", self.port))
            .and_then(|c| c.get_connection())
            .expect("connect as the ACL user")
    }

    /// A connection as the ACL user `name` who may reach only `keys` (a
    /// key pattern: `~rl:*`, `%R~rl:*`, ...) and run only `commands`.
    pub fn conn_limited(&self, name: &str, keys: &str, commands: &[&str]) -> redis::Connection {
        let allowed: Vec<String> = commands.iter().map(|c| format!("+{c}")).collect();
        let mut rules = vec![keys, "resetchannels", "-@all"];
        rules.extend(allowed.iter().map(String::as_str));
        self.conn_as(name, &rules)
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
    /// `config` (to load or drop the module, change persistence...). The
    /// port can't change (replicas and clients know it), so a port taken
    /// meanwhile is waited for a little, then fails the test.
    pub fn restart_with(&mut self, config: Config) {
        self.kill9();
        self.config = config;
        for _ in 0..PORT_ATTEMPTS {
            if self.launch().is_ok() {
                return;
            }
            sleep(Duration::from_millis(200));
        }
        panic!("port {} stayed taken after a restart", self.port);
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

/// Starts a server that must refuse to start (e.g. the module declines to
/// load), and returns its log once the process has exited.
pub fn start_fails(config: Config) -> String {
    for _ in 1..PORT_ATTEMPTS {
        if let Ok(log) = start_fails_on(free_port(), &config) {
            return log;
        }
    }
    start_fails_on(free_port(), &config).unwrap_or_else(|PortTaken| {
        panic!("{PORT_ATTEMPTS} ports in a row were taken before the server bound them")
    })
}

fn start_fails_on(port: u16, config: &Config) -> Result<String, PortTaken> {
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
    if port_taken(&log) || port_taken(&out) {
        return Err(PortTaken);
    }
    Ok(log)
}

/// The module built with `--features test-hooks` (TB.PANIC, TB.FAULT), in
/// its own target directory: the `cargo test` that runs the calling test
/// holds the lock of `target/` until it ends, so building there would wait
/// forever. The dev profile (unwinding too) halves the build time.
pub fn test_hooks_module() -> PathBuf {
    let root = crate::root();
    let target_dir = root.join("target/test-hooks");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let started = Instant::now();
    let out = Command::new(cargo)
        .current_dir(&root)
        .args([
            "build",
            "-p",
            "redis-tokenbucket",
            "--features",
            "test-hooks",
            "--lib",
        ])
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

/// Builds tests/fixtures/fake_redis_cell.c, a stand-in for redis-cell (a
/// C compiler is on every machine the project builds on: cargo needs one
/// to link), once per test process.
pub fn fake_redis_cell() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let src = crate::root().join("tests/fixtures/fake_redis_cell.c");
            let out =
                std::env::temp_dir().join(format!("tb-fake-redis-cell-{}.so", std::process::id()));
            let built = Command::new("cc")
                .args(["-shared", "-fPIC", "-O1", "-o"])
                .arg(&out)
                .arg(&src)
                .status()
                .expect("run cc");
            assert!(built.success(), "cc {}", src.display());
            out
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_port_is_told_apart_and_another_one_is_used() {
        // Another server holds the port: it answers PING, but is not ours.
        let other = Server::with(Config::without_module());
        assert!(Server::on_port(other.port, Config::without_module()).is_err());
        assert!(start_fails_on(other.port, &Config::without_module()).is_err());
        // Something that never answers holds it.
        let port = free_port();
        let _holder = TcpListener::bind(("127.0.0.1", port)).expect("hold the port");
        assert!(Server::on_port(port, Config::without_module()).is_err());
    }

    #[test]
    fn a_taken_cluster_bus_port_is_a_taken_port() {
        // The Cluster harness starts its nodes through Server::with, so a
        // node whose bus port (+10000) was taken moves to another port too.
        let port = free_port();
        let _bus = TcpListener::bind(("127.0.0.1", port + 10_000)).expect("hold the bus port");
        let config = Config::without_module().arg("cluster-enabled", "yes");
        assert!(Server::on_port(port, config).is_err());
    }
}
