//! `make bench-rls`: tb-rls beside envoyproxy/ratelimit's Redis pattern, in
//! one run, on one redis-server with the module.
//!
//! - tb-rls: ShouldRateLimit over gRPC to 1 or 2 tb-rls processes, each
//!   request one TB.MCONSUME of its 1 or 3 descriptors.
//! - fixed window: what envoyproxy/ratelimit sends Redis for the same
//!   request (its src/redis/fixed_cache_impl.go): one pipeline of
//!   `INCRBY key hits` + `EXPIRE key unit-seconds` per descriptor, the key
//!   `<domain>_<key>_<value>_..._<window start>`, sent by this process
//!   straight to Redis on 1 or 2 multiplexed connections (one per instance).
//!
//! Each cell runs a fixed time at a fixed number of calls in flight and
//! reports decisions/s, p50/p99, Redis CPU per decision (INFO's
//! used_cpu_sys + used_cpu_user) and tb-rls's own CPU per decision
//! (/proc/<pid>/stat). A separate phase exceeds one key's budget on purpose
//! and counts what was admitted.
//!
//!     cargo run --release -p tb-rls --example bench_rls -- [--report docs/benchmarks.md] [--seconds N]
//!
//! TB_RLS_BIN names the tb-rls binary (default target/release/tb-rls).

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use redis::aio::ConnectionManager;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use testkit::Server;
use tonic::transport::Channel;

type R<T> = Result<T, String>;

const DOMAIN: &str = "bench";
const FIXED: &str = "fixed window";
const MODULE: &str = "module";
const RLS: &str = "tb-rls";
const FIXED_PACED: &str = "fixed window at tb-rls's rate";
/// The exact phase's budget: a day's limit, so that refill over the phase
/// (500 / 86400 per second) stays far below one token.
const BUDGET: u64 = 500;
/// Requests sent in the exact phase: three times the budget.
const EXACT_SENT: u64 = 3 * BUDGET;
/// The throughput limits: never reached, so every call is a full decision.
const HIGH: u64 = 1_000_000_000;
const IN_FLIGHT: [usize; 2] = [16, 64];
const DESCRIPTORS: [usize; 2] = [1, 3];
const INSTANCES: [usize; 2] = [1, 2];
const USERS: u64 = 1000;
/// The published per-op CPU of envoyproxy/ratelimit's own benchmark.
const PEER_US: &str = "12.4-16.1";
/// /proc's utime and stime are in USER_HZ, 100 on Linux.
const TICKS_PER_S: f64 = 100.0;

fn config() -> String {
    format!(
        "domain: {DOMAIN}\ndescriptors:\n\
         \x20 - key: user\n    rate_limit: {{unit: second, requests_per_unit: {HIGH}}}\n\
         \x20 - key: model\n    rate_limit: {{unit: second, requests_per_unit: {HIGH}}}\n\
         \x20 - key: tier\n    rate_limit: {{unit: second, requests_per_unit: {HIGH}}}\n\
         \x20 - key: exact\n    rate_limit: {{unit: day, requests_per_unit: {BUDGET}}}\n"
    )
}

/// A tb-rls process, killed on drop.
struct Rls {
    child: Child,
    grpc: String,
    // Held so that a later stdout line never meets a closed pipe.
    _stdout: BufReader<ChildStdout>,
}

impl Drop for Rls {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_rls(bin: &Path, config: &Path, redis: &str) -> R<Rls> {
    let mut child = Command::new(bin)
        .arg("--config")
        .arg(config)
        .args(["--redis", redis, "--grpc-addr", "127.0.0.1:0"])
        .args(["--http-addr", "127.0.0.1:0", "--watch-interval-ms", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| {
            format!(
                "{}: {e} (build it: cargo build --release -p tb-rls)",
                bin.display()
            )
        })?;
    let out = child.stdout.take().ok_or("tb-rls: no stdout")?;
    let mut out = BufReader::new(out);
    let mut line = String::new();
    out.read_line(&mut line)
        .map_err(|e| format!("tb-rls: reading its first line: {e}"))?;
    let grpc = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("grpc="))
        .ok_or_else(|| format!("tb-rls: no grpc= in its first line {line:?}"))?
        .to_string();
    if !line.contains("backend=Module") {
        return Err(format!("tb-rls: not on the module: {line:?}"));
    }
    Ok(Rls {
        child,
        grpc,
        _stdout: out,
    })
}

/// utime + stime of `pid`, in seconds.
fn proc_cpu(pid: u32) -> R<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    // The command name may hold spaces; the fields after it do not.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| format!("{path}: no ')' in {stat:?}"))?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| -> R<f64> {
        f.get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| format!("{path}: field {} not a number", i + 3))
    };
    // Fields 14 and 15 of stat(5); `rest` starts at field 3.
    Ok((tick(11)? + tick(12)?) / TICKS_PER_S)
}

/// Redis's used_cpu_sys + used_cpu_user, in seconds.
async fn redis_cpu(conn: &mut ConnectionManager) -> R<f64> {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(conn)
        .await
        .map_err(|e| format!("INFO cpu: {e}"))?;
    let field = |name: &str| -> R<f64> {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| format!("INFO cpu: no {name} in {info:?}"))
    };
    Ok(field("used_cpu_sys:")? + field("used_cpu_user:")?)
}

#[derive(Clone)]
enum Target {
    Rls(Vec<RateLimitServiceClient<Channel>>),
    Fixed(Vec<ConnectionManager>),
    /// tb-rls's TB.MCONSUME sent by the bench itself, as the fixed window's
    /// pipeline is: the two Redis patterns on the same footing.
    Module(Vec<ConnectionManager>),
}

impl Target {
    fn instances(&self) -> usize {
        match self {
            Target::Rls(c) => c.len(),
            Target::Fixed(c) | Target::Module(c) => c.len(),
        }
    }
}

/// The descriptors of request `n`: `exact` alone first when the phase is
/// the exact one, then user, model and tier values, `descs` in all.
fn entries(n: u64, descs: usize, exact: Option<&str>) -> Vec<(&'static str, String)> {
    let mut v = Vec::with_capacity(descs);
    match exact {
        Some(id) => v.push(("exact", id.to_string())),
        None => v.push(("user", format!("u{}", n % USERS))),
    }
    v.push(("model", format!("m{}", n % 4)));
    v.push(("tier", format!("t{}", n % 3)));
    v.truncate(descs);
    v
}

fn request(entries: &[(&'static str, String)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: DOMAIN.into(),
        descriptors: entries
            .iter()
            .map(|(k, v)| RateLimitDescriptor {
                entries: vec![rate_limit_descriptor::Entry {
                    key: (*k).to_string(),
                    value: v.clone(),
                }],
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

/// One decision: admitted or not.
async fn decide(target: &mut Target, inst: usize, entries: &[(&'static str, String)]) -> R<bool> {
    match target {
        Target::Rls(clients) => {
            let reply = clients[inst]
                .should_rate_limit(request(entries))
                .await
                .map_err(|e| format!("ShouldRateLimit: {e}"))?;
            Ok(reply.into_inner().overall_code == Code::Ok as i32)
        }
        Target::Fixed(conns) => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_err(|e| format!("clock: {e}"))?
                .as_secs();
            let mut pipe = redis::pipe();
            let mut limits = Vec::with_capacity(entries.len());
            for (k, v) in entries {
                // The peer's unit divider: the window starts at now / unit * unit.
                let (unit, limit) = if *k == "exact" {
                    (86400, BUDGET)
                } else {
                    (1, HIGH)
                };
                let key = format!("{DOMAIN}_{k}_{v}_{}", now / unit * unit);
                pipe.cmd("INCRBY")
                    .arg(&key)
                    .arg(1)
                    .cmd("EXPIRE")
                    .arg(&key)
                    .arg(unit)
                    .ignore();
                limits.push(limit);
            }
            let counts: Vec<u64> = pipe
                .query_async(&mut conns[inst])
                .await
                .map_err(|e| format!("INCRBY/EXPIRE pipeline: {e}"))?;
            Ok(counts.iter().zip(&limits).all(|(c, l)| c <= l))
        }
        Target::Module(conns) => {
            // What tb-rls sends for these descriptors: key, max, rate per
            // second, cost, per bucket.
            let mut cmd = redis::cmd("TB.MCONSUME");
            for (k, v) in entries {
                let (max, rate) = if *k == "exact" {
                    (BUDGET, BUDGET as f64 / 86400.0)
                } else {
                    (HIGH, HIGH as f64)
                };
                cmd.arg(format!("rls:{{{DOMAIN}}}:{k}={v}"))
                    .arg(max)
                    .arg(rate.to_string())
                    .arg(1);
            }
            let reply: Vec<redis::Value> = cmd
                .query_async(&mut conns[inst])
                .await
                .map_err(|e| format!("TB.MCONSUME: {e}"))?;
            Ok(matches!(reply.first(), Some(redis::Value::Int(1))))
        }
    }
}

struct Load {
    decisions: u64,
    admitted: u64,
    /// Each call's latency, ns, sorted.
    lat: Vec<u64>,
    secs: f64,
}

/// `in_flight` callers, spread over the target's instances, each calling
/// back to back (or, with `pace`, at `pace / in_flight` calls a second)
/// until `until` passes or, in the exact phase, until EXACT_SENT requests
/// have been sent.
async fn load(
    target: &Target,
    descs: usize,
    in_flight: usize,
    until: Duration,
    exact: Option<String>,
    pace: Option<f64>,
) -> R<Load> {
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let instances = target.instances();
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(in_flight);
    for t in 0..in_flight {
        let (stop, next, exact) = (stop.clone(), next.clone(), exact.clone());
        let mut target = target.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut admitted = 0u64;
            let gap = pace.map(|p| Duration::from_secs_f64(in_flight as f64 / p));
            let mut due = tokio::time::Instant::now();
            while !stop.load(Ordering::Relaxed) {
                if let Some(gap) = gap {
                    due += gap;
                    tokio::time::sleep_until(due).await;
                }
                let n = next.fetch_add(1, Ordering::Relaxed);
                if exact.is_some() && n >= EXACT_SENT {
                    break;
                }
                let e = entries(n, descs, exact.as_deref());
                let t0 = Instant::now();
                if decide(&mut target, t % instances, &e).await? {
                    admitted += 1;
                }
                lat.push(t0.elapsed().as_nanos() as u64);
            }
            Ok::<_, String>((lat, admitted))
        }));
    }
    if exact.is_none() {
        tokio::time::sleep(until).await;
        stop.store(true, Ordering::Relaxed);
    }
    let mut lat = Vec::new();
    let mut admitted = 0;
    for task in tasks {
        let (l, a) = task
            .await
            .map_err(|e| format!("a caller panicked: {e}"))??;
        lat.extend(l);
        admitted += a;
    }
    let secs = start.elapsed().as_secs_f64();
    lat.sort_unstable();
    Ok(Load {
        decisions: lat.len() as u64,
        admitted,
        lat,
        secs,
    })
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1e6
}

struct Cell {
    backend: &'static str,
    descs: usize,
    instances: usize,
    in_flight: usize,
    per_s: f64,
    p50: f64,
    p99: f64,
    redis_us: f64,
    rls_us: Option<f64>,
}

struct Exact {
    descs: usize,
    instances: usize,
    in_flight: usize,
    admitted: u64,
}

impl Exact {
    fn pass(&self) -> bool {
        self.admitted.abs_diff(BUDGET) <= 1
    }
}

/// What every cell shares: the connection that reads INFO, the seconds.
struct Run {
    info: ConnectionManager,
    secs: f64,
}

async fn cell(
    backend: &'static str,
    target: &Target,
    pids: &[u32],
    run: &mut Run,
    descs: usize,
    in_flight: usize,
    pace: Option<f64>,
) -> R<Cell> {
    let (info, secs) = (&mut run.info, run.secs);
    // Warm: connections, HTTP/2 windows, the keys' first writes.
    let warm = Duration::from_millis(500);
    load(target, descs, in_flight, warm, None, pace).await?;
    let r0 = redis_cpu(info).await?;
    let p0: f64 = pids.iter().map(|p| proc_cpu(*p)).sum::<R<f64>>()?;
    let l = load(
        target,
        descs,
        in_flight,
        Duration::from_secs_f64(secs),
        None,
        pace,
    )
    .await?;
    let r1 = redis_cpu(info).await?;
    let p1: f64 = pids.iter().map(|p| proc_cpu(*p)).sum::<R<f64>>()?;
    let n = l.decisions.max(1) as f64;
    if l.admitted != l.decisions {
        return Err(format!(
            "{backend}: {} of {} denied under a limit never reached",
            l.decisions - l.admitted,
            l.decisions
        ));
    }
    let c = Cell {
        backend,
        descs,
        instances: target.instances(),
        in_flight,
        per_s: l.decisions as f64 / l.secs,
        p50: pct(&l.lat, 0.50),
        p99: pct(&l.lat, 0.99),
        redis_us: (r1 - r0) * 1e6 / n,
        rls_us: (!pids.is_empty()).then(|| (p1 - p0) * 1e6 / n),
    };
    eprintln!(
        "bench-rls: {backend} descriptors={descs} instances={} in_flight={in_flight}: {:.0}/s p50 {:.2} ms p99 {:.2} ms redis {:.1} us{}",
        c.instances,
        c.per_s,
        c.p50,
        c.p99,
        c.redis_us,
        c.rls_us.map(|u| format!(" tb-rls {u:.1} us")).unwrap_or_default()
    );
    Ok(c)
}

struct Args {
    report: Option<PathBuf>,
    secs: f64,
}

fn args() -> R<Args> {
    let mut a = Args {
        report: None,
        secs: 3.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--report" => a.report = Some(PathBuf::from(value()?)),
            "--seconds" => {
                let v = value()?;
                a.secs = v
                    .parse()
                    .ok()
                    .filter(|s: &f64| *s > 0.0)
                    .ok_or_else(|| format!("--seconds {v:?}: not a positive number"))?;
            }
            other => {
                return Err(format!(
                    "unknown argument {other:?} (--report PATH, --seconds N)"
                ))
            }
        }
    }
    Ok(a)
}

/// `n` rounded, with thousands separated by commas, as the other tables.
fn thousands(n: f64) -> String {
    let digits = format!("{:.0}", n.max(0.0));
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "MISS"
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("bench-rls: {e}");
        std::process::exit(1);
    }
}

async fn run() -> R<()> {
    let args = args()?;
    let root = testkit::root();
    let bin = std::env::var_os("TB_RLS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/release/tb-rls"));
    let redis = Server::start();
    let url = redis.url();
    let dir = std::env::temp_dir().join(format!("tb-rls-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let cfg = dir.join("config.yaml");
    std::fs::write(&cfg, config()).map_err(|e| format!("{}: {e}", cfg.display()))?;
    let result = bench(&args, &bin, &cfg, &url).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn bench(args: &Args, bin: &Path, cfg: &Path, url: &str) -> R<()> {
    let client = redis::Client::open(url).map_err(|e| format!("{url}: {e}"))?;
    let manager = || async {
        ConnectionManager::new(client.clone())
            .await
            .map_err(|e| format!("{url}: {e}"))
    };
    let mut run = Run {
        info: manager().await?,
        secs: args.secs,
    };
    let mut cells = Vec::new();
    let mut exact = Vec::new();
    let mut run_id = 0;
    for &instances in &INSTANCES {
        let rls: Vec<Rls> = (0..instances)
            .map(|_| start_rls(bin, cfg, url))
            .collect::<R<_>>()?;
        let mut clients = Vec::new();
        for r in &rls {
            let c = RateLimitServiceClient::connect(format!("http://{}", r.grpc))
                .await
                .map_err(|e| format!("tb-rls at {}: {e}", r.grpc))?;
            clients.push(c);
        }
        let pids: Vec<u32> = rls.iter().map(|r| r.child.id()).collect();
        let rls_t = Target::Rls(clients);
        let mut conns = Vec::new();
        for _ in 0..instances {
            conns.push(manager().await?);
        }
        let fixed_t = Target::Fixed(conns.clone());
        let module_t = Target::Module(conns);
        for &descs in &DESCRIPTORS {
            for &in_flight in &IN_FLIGHT {
                let r = &mut run;
                cells.push(cell(FIXED, &fixed_t, &[], r, descs, in_flight, None).await?);
                cells.push(cell(MODULE, &module_t, &[], r, descs, in_flight, None).await?);
                let t = cell(RLS, &rls_t, &pids, r, descs, in_flight, None).await?;
                // The fixed window again at tb-rls's rate: Redis then sees
                // as many commands per read as tb-rls gives it.
                let pace = Some(t.per_s);
                cells.push(t);
                cells.push(cell(FIXED_PACED, &fixed_t, &[], r, descs, in_flight, pace).await?);
                run_id += 1;
                let id = format!("run{run_id}");
                let l = load(&rls_t, descs, in_flight, Duration::ZERO, Some(id), None).await?;
                let e = Exact {
                    descs,
                    instances,
                    in_flight,
                    admitted: l.admitted,
                };
                eprintln!(
                    "bench-rls: exact descriptors={descs} instances={instances} in_flight={in_flight}: admitted {} of {EXACT_SENT}, budget {BUDGET}: {}",
                    e.admitted,
                    verdict(e.pass())
                );
                exact.push(e);
            }
        }
    }
    let body = report(&cells, &exact, args.secs);
    println!("{body}");
    if let Some(path) = &args.report {
        write_section(path, &body)?;
        eprintln!("bench-rls: wrote {}", path.display());
    }
    Ok(())
}

/// The cell of `backend` with `c`'s shape.
fn beside<'a>(cells: &'a [Cell], c: &Cell, backend: &str) -> Option<&'a Cell> {
    cells.iter().find(|p| {
        p.backend == backend
            && p.descs == c.descs
            && p.instances == c.instances
            && p.in_flight == c.in_flight
    })
}

/// `c`'s Redis CPU per decision over that of the fixed window it is
/// measured against: the module's against the fixed window sent the same
/// way, tb-rls's against the fixed window at tb-rls's rate.
fn ratio(cells: &[Cell], c: &Cell) -> Option<f64> {
    let peer = match c.backend {
        MODULE => FIXED,
        RLS => FIXED_PACED,
        _ => return None,
    };
    beside(cells, c, peer)
        .filter(|p| p.redis_us > 0.0)
        .map(|p| c.redis_us / p.redis_us)
}

fn report(cells: &[Cell], exact: &[Exact], secs: f64) -> String {
    let mut s = String::new();
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let _ = writeln!(
        s,
        "`make bench-rls` (rls/examples/bench_rls.rs), {date}: tb-rls, Envoy's rate limit service, beside the\n\
         Redis commands envoyproxy/ratelimit sends for the same request (one pipeline of `INCRBY key hits` and\n\
         `EXPIRE key unit` per descriptor: its fixed window), on one redis-server 7.0 with the module, all on\n\
         loopback, one Redis key per user (1,000 users), model (4) and tier (3). Rows per shape:\n\
         \n\
         - `fixed window`: the peer's pipeline, sent by the bench straight to Redis on one multiplexed\n\
         \x20 connection per instance (as tb-rls's own connection), so with no service hop;\n\
         - `module`: tb-rls's `TB.MCONSUME` for the same descriptors, sent the same way;\n\
         - `tb-rls`: ShouldRateLimit over gRPC to 1 or 2 tb-rls processes;\n\
         - `fixed window at tb-rls's rate`: the peer's pipeline again, paced to the tb-rls row's decisions/s,\n\
         \x20 so Redis sees as few commands per read as tb-rls gives it (Redis CPU per call falls as more\n\
         \x20 calls share a read).\n\
         \n\
         {secs} s per cell after 0.5 s of warm-up; \"in flight\" is the bench's callers. The machine has 2 cores,\n\
         shared with other work and with the bench's own client: ops/s move by ~20% from run to run.\n\
         \n\
         Targets:\n\
         \n\
         - exact: a budget of {BUDGET} a day on one key, {} requests sent through tb-rls; admitted within\n\
         \x20 one token of the budget at every concurrency, with one tb-rls and with two.\n\
         - Redis CPU per decision with the module at most 1.1x the fixed window's pipeline, with 1 and with 3\n\
         \x20 descriptors, at the same concurrency: `module` against `fixed window`, and `tb-rls` against\n\
         \x20 `fixed window at tb-rls's rate`.\n",
        thousands(EXACT_SENT as f64)
    );
    let _ = writeln!(
        s,
        "| backend | descriptors | instances | in flight | decisions/s | p50 ms | p99 ms | Redis CPU µs/decision | tb-rls CPU µs/decision | Redis vs fixed window |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
    let (mut direct_ok, mut through_ok) = (true, true);
    for c in cells {
        let vs = match ratio(cells, c) {
            Some(r) => {
                if c.backend == MODULE {
                    direct_ok &= r <= 1.1;
                } else {
                    through_ok &= r <= 1.1;
                }
                format!("{r:.2}x {}", verdict(r <= 1.1))
            }
            None => String::new(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.1} | {} | {} |",
            c.backend,
            c.descs,
            c.instances,
            c.in_flight,
            thousands(c.per_s),
            c.p50,
            c.p99,
            c.redis_us,
            c.rls_us
                .map(|u| format!("{u:.1}"))
                .unwrap_or_else(|| "-".into()),
            vs
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "| exact phase: descriptors | instances | in flight | sent | admitted | budget | within one token |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for e in exact {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {BUDGET} | {} |",
            e.descs,
            e.instances,
            e.in_flight,
            thousands(EXACT_SENT as f64),
            e.admitted,
            verdict(e.pass())
        );
    }
    let exact_ok = exact.iter().all(Exact::pass);
    let (lo, hi) = cells
        .iter()
        .filter_map(|c| c.rls_us)
        .fold((f64::MAX, 0.0f64), |(lo, hi), u| (lo.min(u), hi.max(u)));
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "- exact within one token per key: {}.\n\
         - Redis CPU per decision at most 1.1x the fixed window's, the commands sent the same way (`module`): {}.\n\
         - Redis CPU per decision at most 1.1x the fixed window's at the same rate, through tb-rls: {}.\n\
         - tb-rls's own CPU: {lo:.1}-{hi:.1} µs per decision here (gRPC, the config's match, the Redis call), beside\n\
         \x20 envoyproxy/ratelimit's published {PEER_US} µs per op, measured on other hardware: an order, not a ratio.",
        verdict(exact_ok),
        verdict(direct_ok),
        verdict(through_ok)
    );
    s
}

/// Puts `body` between the document's bench-rls markers (or appends it,
/// markers and heading, to a document without them).
fn write_section(path: &Path, body: &str) -> R<()> {
    let (begin, end) = ("<!-- bench-rls:begin -->", "<!-- bench-rls:end -->");
    let doc = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let block = format!("{begin}\n{}\n{end}", body.trim_end());
    let new = match (doc.split_once(begin), doc.find(end)) {
        (Some((head, rest)), Some(_)) => {
            let (_, tail) = rest
                .split_once(end)
                .ok_or_else(|| format!("{}: {end} before {begin}", path.display()))?;
            format!("{head}{block}{tail}")
        }
        _ => format!(
            "{}\n\n## Envoy's rate limit service: tb-rls\n\n{block}\n",
            doc.trim_end()
        ),
    };
    std::fs::write(path, new).map_err(|e| format!("{}: {e}", path.display()))
}
