//! `GET /metrics`: envoyproxy/ratelimit's per-descriptor stats (total_hits,
//! over_limit, near_limit, within_limit, shadow_mode, counted in hits as
//! the peer counts them) and the service's own counters, in Prometheus'
//! text format. A series is keyed by the config's descriptor path, never
//! by a request's values, except under `detailed_metric`, whose series
//! are bounded by MAX_DETAILED_SERIES.

use crate::config::Config;
use crate::error::Error;
use crate::plan::{self, Decision, Group, Plan, Request};
use crate::reply::Bucket;
use crate::settings::{env_bool, env_var};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

/// The peer's NEAR_LIMIT_RATIO default.
pub const NEAR_LIMIT_RATIO: f64 = 0.8;
/// Series that `detailed_metric` may add (request values in a label) for
/// the process's life; beyond, a new value counts on its limit's config
/// path, and `ratelimit_service_detailed_metric_overflow_total` says so.
pub const MAX_DETAILED_SERIES: usize = 1000;

/// One descriptor path's stats, in hits.
#[derive(Debug, Default)]
pub struct Stats {
    pub total_hits: AtomicU64,
    pub over_limit: AtomicU64,
    pub near_limit: AtomicU64,
    pub within_limit: AtomicU64,
    pub shadow_mode: AtomicU64,
}

/// The per-descriptor stats, `ratelimit_service_rate_limit_<stat>`, and
/// their help.
pub const STATS: [(&str, &str); 5] = [
    ("total_hits", "Hits (hits_addend) on each limit"),
    (
        "over_limit",
        "Hits denied by each limit (shadow limits included)",
    ),
    (
        "near_limit",
        "Hits allowed beyond NEAR_LIMIT_RATIO of the bucket",
    ),
    ("within_limit", "Hits allowed by each limit"),
    ("shadow_mode", "Hits over a shadow limit, answered OK"),
];

impl Stats {
    fn get(&self, stat: &str) -> &AtomicU64 {
        match stat {
            "over_limit" => &self.over_limit,
            "near_limit" => &self.near_limit,
            "within_limit" => &self.within_limit,
            "shadow_mode" => &self.shadow_mode,
            _ => &self.total_hits,
        }
    }
}

/// The gRPC statuses tb-rls answers with, each counted.
pub const ERROR_CODES: [tonic::Code; 4] = [
    tonic::Code::InvalidArgument,
    tonic::Code::Unavailable,
    tonic::Code::ResourceExhausted,
    tonic::Code::Internal,
];

/// Why a call reached no Redis answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    /// Redis failed or passed its deadline (the peer's redis_error).
    Redis,
    /// An answer no backend gives (the peer's service_error).
    Service,
    /// The breaker was open: Redis was not called.
    BreakerSkip,
    /// Over --max-in-flight: answered RESOURCE_EXHAUSTED.
    Shed,
}

#[derive(Debug, Default)]
pub struct Metrics {
    near_ratio: f64,
    /// domain -> descriptor path -> stats.
    series: RwLock<HashMap<String, HashMap<String, Arc<Stats>>>>,
    detailed: AtomicUsize,
    detailed_overflow: AtomicU64,
    calls: AtomicU64,
    errors: [AtomicU64; ERROR_CODES.len()],
    redis_errors: AtomicU64,
    service_errors: AtomicU64,
    breaker_skipped: AtomicU64,
    breaker_opened: AtomicU64,
    shed: AtomicU64,
    domain_not_found: AtomicU64,
    config_load_success: AtomicU64,
    config_load_error: AtomicU64,
}

/// The near_limit ratio from NEAR_LIMIT_RATIO (unset: 0.8), a number in
/// [0, 1].
pub fn near_ratio_from(var: Option<String>) -> Result<f64, Error> {
    // Unset or empty is the default, as for every variable of the peer's.
    let Some(text) = var.filter(|v| !v.is_empty()) else {
        return Ok(NEAR_LIMIT_RATIO);
    };
    match text.trim().parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(Error::Usage(format!(
            "NEAR_LIMIT_RATIO '{text}': expected a number from 0 to 1"
        ))),
    }
}

/// The peer's own Prometheus listener (USE_PROMETHEUS=true): /metrics
/// also served on `addr` at `path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub addr: String,
    pub path: String,
}

/// USE_PROMETHEUS, PROMETHEUS_ADDR (`:9090`, Go's form: no host is every
/// interface) and PROMETHEUS_PATH (`/metrics`), as the peer reads them.
pub fn endpoint_from(env: impl Fn(&str) -> Option<String>) -> Result<Option<Endpoint>, Error> {
    let var = |name: &str, default: &str| env_var(&env, name, default);
    if !env_bool(&env, "USE_PROMETHEUS", false)? {
        return Ok(None);
    }
    let addr = var("PROMETHEUS_ADDR", ":9090");
    let addr = match addr.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => addr,
    };
    let path = var("PROMETHEUS_PATH", "/metrics");
    // A plain path: the router would read `{` or `*` as a capture.
    let plain = path.len() > 1
        && path.starts_with('/')
        && path
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/-_.~".contains(c));
    if !plain || path == "/healthcheck" {
        return Err(Error::Usage(format!(
            "PROMETHEUS_PATH={path}: give a path such as /metrics (letters, digits, / - _ . ~)"
        )));
    }
    Ok(Some(Endpoint { addr, path }))
}

/// A request's descriptors, each with the stats it counts on and its cost
/// (None where no limit applies), in the plan's order.
pub struct Tally(Vec<Option<(Arc<Stats>, u64)>>);

/// The peer's detailed key: `key_value` per entry, a `share_threshold`
/// entry by its pattern instead.
fn detailed_path(entries: &[(String, String)], shared: &[Option<String>]) -> String {
    let any_shared = shared.iter().any(Option::is_some);
    let mut out = String::new();
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        out.push_str(k);
        match shared.get(i).and_then(Option::as_deref) {
            Some(pattern) => {
                out.push('_');
                out.push_str(pattern);
            }
            None if !any_shared || !v.is_empty() => {
                out.push('_');
                out.push_str(v);
            }
            None => {}
        }
    }
    out
}

impl Metrics {
    pub fn new(near_ratio: f64) -> Metrics {
        Metrics {
            near_ratio,
            ..Metrics::default()
        }
    }

    /// The series of `path`, made if new; None when it is new, `detailed`
    /// and MAX_DETAILED_SERIES are made (checked under the write lock, so
    /// racing calls can't pass the bound).
    fn stats(&self, domain: &str, path: &str, detailed: bool) -> Option<Arc<Stats>> {
        let read = |s: &HashMap<String, HashMap<String, Arc<Stats>>>| {
            s.get(domain).and_then(|d| d.get(path)).cloned()
        };
        let found = match self.series.read() {
            Ok(s) => read(&s),
            Err(poisoned) => read(&poisoned.into_inner()),
        };
        if found.is_some() {
            return found;
        }
        // Past the bound a new detailed series is refused without the lock.
        if detailed && self.detailed.load(Ordering::Relaxed) >= MAX_DETAILED_SERIES {
            return None;
        }
        let mut series = match self.series.write() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(s) = series.get(domain).and_then(|d| d.get(path)) {
            return Some(Arc::clone(s));
        }
        if detailed {
            if self.detailed.load(Ordering::Relaxed) >= MAX_DETAILED_SERIES {
                return None;
            }
            self.detailed.fetch_add(1, Ordering::Relaxed);
        }
        let s = Arc::new(Stats::default());
        series
            .entry(domain.to_string())
            .or_default()
            .insert(path.to_string(), Arc::clone(&s));
        Some(s)
    }

    /// The stats each descriptor of `request` counts on, under the config
    /// `plan` was made on.
    pub fn tally(&self, config: &Config, request: &Request, plan: &Plan) -> Tally {
        if !config.domains.contains_key(&request.domain) {
            self.domain_not_found.fetch_add(1, Ordering::Relaxed);
        }
        let prefix = format!("{}.", request.domain);
        let each = request
            .descriptors
            .iter()
            .zip(&plan.decisions)
            .zip(&plan.matched)
            .map(|((d, decision), m)| {
                if matches!(decision, Decision::NoLimit | Decision::Unlimited) {
                    return None;
                }
                // An override without a configured match has no path: uncounted.
                let m = m.as_ref()?;
                let path = m.full_key.strip_prefix(&prefix).unwrap_or(&m.full_key);
                let cost = plan::cost_of(request, d);
                let detailed = m
                    .detailed_metric
                    .then(|| detailed_path(&d.entries, &m.shared));
                let stats = match detailed.and_then(|p| self.stats(&request.domain, &p, true)) {
                    Some(s) => s,
                    None => {
                        if m.detailed_metric {
                            self.detailed_overflow.fetch_add(1, Ordering::Relaxed);
                        }
                        self.stats(&request.domain, path, false)?
                    }
                };
                Some((stats, cost))
            })
            .collect();
        Tally(each)
    }

    /// Counts the hits of one call: `answer` holds the buckets of the
    /// enforced call and of each shadow call, None when Redis gave none
    /// (then only total_hits and what was decided here count).
    pub fn record(&self, tally: &Tally, plan: &Plan, answer: Option<(&[Bucket], &[Bucket])>) {
        let add = |c: &AtomicU64, n: u64| {
            c.fetch_add(n, Ordering::Relaxed);
        };
        for (t, decision) in tally.0.iter().zip(&plan.decisions) {
            let Some((s, cost)) = t else { continue };
            let cost = *cost;
            add(&s.total_hits, cost);
            match decision {
                Decision::NoLimit | Decision::Unlimited => {}
                Decision::Local { over, shadow, .. } => {
                    if *over {
                        add(&s.over_limit, cost);
                        if *shadow {
                            add(&s.shadow_mode, cost);
                        }
                    } else {
                        add(&s.within_limit, cost);
                    }
                }
                Decision::Enforced { group, .. } => {
                    let Some((enforced, _)) = answer else {
                        continue;
                    };
                    match (enforced.get(*group), plan.enforced.get(*group)) {
                        (Some(b), Some(g)) if b.allowed => {
                            add(&s.within_limit, cost);
                            add(&s.near_limit, self.near(b, g, cost));
                        }
                        _ => add(&s.over_limit, cost),
                    }
                }
                Decision::Shadow { call, .. } => {
                    let Some((_, shadow)) = answer else { continue };
                    match (shadow.get(*call), plan.shadow.get(*call)) {
                        (Some(b), Some(g)) if b.allowed => {
                            add(&s.within_limit, cost);
                            add(&s.near_limit, self.near(b, g, cost));
                        }
                        (Some(_), Some(_)) => {
                            add(&s.over_limit, cost);
                            add(&s.shadow_mode, cost);
                        }
                        _ => {}
                    }
                }
            }
        }
    }

    /// The peer's near_limit, with the bucket's used tokens for its count:
    /// the hits of this call above floor(max * ratio), at most `cost`.
    fn near(&self, b: &Bucket, g: &Group, cost: u64) -> u64 {
        let remaining = u64::try_from(b.remaining.max(0)).unwrap_or(u64::MAX);
        let used = g.max.saturating_sub(remaining);
        let threshold = (g.max as f64 * self.near_ratio).floor() as u64;
        used.saturating_sub(threshold).min(g.cost).min(cost)
    }

    pub fn call(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }

    pub fn error(&self, code: tonic::Code) {
        if let Some(i) = ERROR_CODES.iter().position(|c| *c == code) {
            self.errors[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn failed(&self, why: Failed) {
        let c = match why {
            Failed::Redis => &self.redis_errors,
            Failed::Service => &self.service_errors,
            Failed::BreakerSkip => &self.breaker_skipped,
            Failed::Shed => &self.shed,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn breaker_opened(&self) {
        self.breaker_opened.fetch_add(1, Ordering::Relaxed);
    }

    /// A config loaded (at startup or by a reload), or refused.
    pub fn config_load(&self, ok: bool) {
        let c = if ok {
            &self.config_load_success
        } else {
            &self.config_load_error
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The text exposition (format 0.0.4), with the service's state now:
    /// the decisions waiting on Redis, and whether the breaker is not closed.
    pub fn render(&self, in_flight: u64, breaker_open: bool) -> String {
        let mut out = String::new();
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut rows: Vec<(String, String, Arc<Stats>)> = {
            let collect = |s: &HashMap<String, HashMap<String, Arc<Stats>>>| {
                s.iter()
                    .flat_map(|(d, by)| {
                        by.iter()
                            .map(|(p, st)| (d.clone(), p.clone(), Arc::clone(st)))
                    })
                    .collect::<Vec<_>>()
            };
            match self.series.read() {
                Ok(s) => collect(&s),
                Err(poisoned) => collect(&poisoned.into_inner()),
            }
        };
        rows.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        for (stat, help) in STATS {
            let name = format!("ratelimit_service_rate_limit_{stat}");
            header(&mut out, &name, help, "counter");
            for (domain, path, s) in &rows {
                let _ = writeln!(
                    out,
                    "{name}{{domain=\"{}\",descriptor=\"{}\"}} {}",
                    escape(domain),
                    escape(path),
                    load(s.get(stat))
                );
            }
        }
        let plain: [(&str, &str, &AtomicU64); 8] = [
            (
                "ratelimit_service_calls_total",
                "ShouldRateLimit calls",
                &self.calls,
            ),
            (
                "ratelimit_service_shed_total",
                "Calls answered RESOURCE_EXHAUSTED over --max-in-flight",
                &self.shed,
            ),
            (
                "ratelimit_service_breaker_skipped_total",
                "Calls answered by --on-redis-error without Redis, the breaker open",
                &self.breaker_skipped,
            ),
            (
                "ratelimit_service_breaker_opened_total",
                "Times the breaker opened",
                &self.breaker_opened,
            ),
            (
                "ratelimit_service_domain_not_found_total",
                "Calls for a domain no config has",
                &self.domain_not_found,
            ),
            (
                "ratelimit_service_detailed_metric_overflow_total",
                "detailed_metric descriptors counted on their config path, the series bound reached",
                &self.detailed_overflow,
            ),
            (
                "ratelimit_service_config_load_success",
                "Configs loaded, at startup and by reloads",
                &self.config_load_success,
            ),
            (
                "ratelimit_service_config_load_error",
                "New configs refused by a reload (each text once)",
                &self.config_load_error,
            ),
        ];
        for (name, help, c) in plain {
            header(&mut out, name, help, "counter");
            let _ = writeln!(out, "{name} {}", load(c));
        }
        let name = "ratelimit_service_call_errors_total";
        header(
            &mut out,
            name,
            "Calls answered with a gRPC error",
            "counter",
        );
        for (code, c) in ERROR_CODES.iter().zip(&self.errors) {
            let _ = writeln!(out, "{name}{{code=\"{}\"}} {}", code_name(*code), load(c));
        }
        let name = "ratelimit_service_should_rate_limit_error";
        header(
            &mut out,
            name,
            "Calls whose Redis call failed (redis_error) or answered what no backend answers (service_error)",
            "counter",
        );
        for (kind, c) in [
            ("redis_error", &self.redis_errors),
            ("service_error", &self.service_errors),
        ] {
            let _ = writeln!(out, "{name}{{err_type=\"{kind}\"}} {}", load(c));
        }
        for (name, help, value) in [
            (
                "ratelimit_service_redis_in_flight",
                "Decisions waiting on Redis now",
                in_flight,
            ),
            (
                "ratelimit_service_breaker_open",
                "1 while the breaker is open or half open",
                u64::from(breaker_open),
            ),
        ] {
            header(&mut out, name, help, "gauge");
            let _ = writeln!(out, "{name} {value}");
        }
        out
    }
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}.");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A label value as the text format quotes it.
fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn code_name(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
        tonic::Code::Unavailable => "UNAVAILABLE",
        tonic::Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        tonic::Code::Internal => "INTERNAL",
        _ => "UNKNOWN",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{plan, Descriptor};

    fn config(text: &str) -> Config {
        let mut c = Config::default();
        c.add_str("t.yaml", text).unwrap();
        c
    }

    fn req(pairs: &[(&str, &str)], hits: u32) -> Request {
        Request {
            domain: "d".into(),
            descriptors: vec![Descriptor {
                entries: pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Descriptor::default()
            }],
            hits_addend: hits,
        }
    }

    fn bucket(allowed: bool, remaining: i64) -> Bucket {
        Bucket {
            allowed,
            remaining,
            retry_after_ms: 0,
            reset_after_ms: 0,
        }
    }

    fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in {text}"))
    }

    const C: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 10}\n  - key: w\n    value: \"a*\"\n    detailed_metric: true\n    rate_limit: {unit: hour, requests_per_unit: 10}\n";

    #[test]
    fn near_limit_counts_the_hits_above_the_ratio_as_the_peer() {
        let m = Metrics::new(0.8);
        let c = config(C);
        // 5 hits leaving 3 of 10: 7 used, under floor(8); then 2 hits
        // leaving 1: 9 used, one hit above 8.
        for (hits, remaining, near) in [(5, 3, 0), (2, 1, 1)] {
            let r = req(&[("k", "v")], hits);
            let p = plan(&c, &r).unwrap();
            let t = m.tally(&c, &r, &p);
            let before = t.0[0]
                .as_ref()
                .unwrap()
                .0
                .near_limit
                .load(Ordering::Relaxed);
            m.record(&t, &p, Some((&[bucket(true, remaining)], &[])));
            let after = t.0[0]
                .as_ref()
                .unwrap()
                .0
                .near_limit
                .load(Ordering::Relaxed);
            assert_eq!(after - before, near, "hits {hits}");
        }
        let r = req(&[("k", "v")], 4);
        let p = plan(&c, &r).unwrap();
        let t = m.tally(&c, &r, &p);
        m.record(&t, &p, Some((&[bucket(false, 1)], &[])));
        let text = m.render(0, false);
        let at = |stat: &str| {
            line(
                &text,
                &format!("ratelimit_service_rate_limit_{stat}{{domain=\"d\",descriptor=\"k\"}}"),
            )
            .rsplit(' ')
            .next()
            .unwrap()
            .to_string()
        };
        assert_eq!(
            [
                "total_hits",
                "within_limit",
                "near_limit",
                "over_limit",
                "shadow_mode"
            ]
            .map(at),
            ["11", "7", "1", "4", "0"]
        );
    }

    #[test]
    fn detailed_series_are_bounded_and_labels_escaped() {
        let m = Metrics::new(0.8);
        let c = config(C);
        for i in 0..MAX_DETAILED_SERIES + 5 {
            let r = req(&[("w", &format!("a\"{i}"))], 1);
            let p = plan(&c, &r).unwrap();
            let t = m.tally(&c, &r, &p);
            m.record(&t, &p, None);
        }
        let text = m.render(0, false);
        let totals: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("ratelimit_service_rate_limit_total_hits{"))
            .collect();
        assert_eq!(totals.len(), MAX_DETAILED_SERIES + 1);
        assert!(text.contains("descriptor=\"w_a\\\"0\"} 1"), "{text}");
        assert!(text.contains("descriptor=\"w_a*\"} 5"));
        assert_eq!(
            line(&text, "ratelimit_service_detailed_metric_overflow_total "),
            "ratelimit_service_detailed_metric_overflow_total 5"
        );
    }

    #[test]
    fn the_peers_prometheus_variables() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(endpoint_from(env(&[])), Ok(None));
        assert_eq!(
            endpoint_from(env(&[("USE_PROMETHEUS", "true")])),
            Ok(Some(Endpoint {
                addr: "0.0.0.0:9090".into(),
                path: "/metrics".into()
            }))
        );
        let set = [
            ("USE_PROMETHEUS", "1"),
            ("PROMETHEUS_ADDR", "127.0.0.1:9102"),
            ("PROMETHEUS_PATH", "/stats/prometheus"),
        ];
        let e = endpoint_from(|k| {
            set.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        });
        assert_eq!(
            e,
            Ok(Some(Endpoint {
                addr: "127.0.0.1:9102".into(),
                path: "/stats/prometheus".into()
            }))
        );
        assert_eq!(
            endpoint_from(env(&[("USE_PROMETHEUS", "yes")]))
                .unwrap_err()
                .to_string(),
            "USE_PROMETHEUS=yes: give true or false"
        );
        let bad = [("USE_PROMETHEUS", "true"), ("PROMETHEUS_PATH", "/{x}")];
        let e = endpoint_from(|k| {
            bad.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        });
        assert_eq!(
            e.unwrap_err().to_string(),
            "PROMETHEUS_PATH=/{x}: give a path such as /metrics (letters, digits, / - _ . ~)"
        );
    }

    #[test]
    fn the_ratio_is_a_number_from_0_to_1() {
        assert_eq!(near_ratio_from(None), Ok(0.8));
        assert_eq!(near_ratio_from(Some(String::new())), Ok(0.8));
        assert_eq!(near_ratio_from(Some("0.5".into())), Ok(0.5));
        assert_eq!(
            near_ratio_from(Some("1.5".into())).unwrap_err().to_string(),
            "NEAR_LIMIT_RATIO '1.5': expected a number from 0 to 1"
        );
    }
}
