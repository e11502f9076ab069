//! ShouldRateLimit: the protos in, the plan, one Redis round trip, the
//! reply out.

use crate::breaker::{Breaker, Enter};
use crate::engine::Engine;
use crate::error::Error;
use crate::metrics::{Failed, Metrics, Tally};
use crate::plan::{plan, Descriptor, Plan, Request};
use crate::reload::Live;
use crate::reply::{admitted_without_redis, reply, HeaderNames, Reply};
use crate::settings::{Failure, OnError};
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as PbUnit, Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

pub struct Service {
    /// Swapped by a reload: each call plans on the one it read first.
    pub config: Arc<Live>,
    pub engine: Arc<Engine>,
    pub headers: Option<HeaderNames>,
    pub metrics: Arc<Metrics>,
    failure: Failure,
    breaker: Option<Breaker>,
    /// Decisions waiting on Redis now.
    in_flight: AtomicUsize,
    /// Whether Redis is failing now: its cause is logged once, not per call.
    failing: AtomicBool,
    /// Whether a reply of no backend's shape was logged (once per process).
    odd_reply: AtomicBool,
    /// When a shed may be logged next, and the sheds not logged yet.
    next_shed_log_ms: AtomicU64,
    shed_since: AtomicU64,
    started: Instant,
}

/// A slot of --max-in-flight, given back when the call ends (or is dropped).
struct Slot<'a>(&'a AtomicUsize);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How often a run of shed calls is logged at most.
const SHED_LOG_EVERY_MS: u64 = 10_000;

impl Service {
    pub fn new(
        config: Arc<Live>,
        engine: Arc<Engine>,
        headers: Option<HeaderNames>,
        failure: Failure,
        metrics: Arc<Metrics>,
    ) -> Self {
        Service {
            config,
            engine,
            headers,
            metrics,
            breaker: failure.breaker.map(Breaker::new),
            failure,
            in_flight: AtomicUsize::new(0),
            failing: AtomicBool::new(false),
            odd_reply: AtomicBool::new(false),
            next_shed_log_ms: AtomicU64::new(0),
            shed_since: AtomicU64::new(0),
            started: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn slot(&self) -> Option<Slot<'_>> {
        let held = self.in_flight.fetch_add(1, Ordering::AcqRel);
        let slot = Slot(&self.in_flight);
        match self.failure.max_in_flight {
            Some(max) if held >= max => None,
            _ => Some(slot),
        }
    }

    /// The first shed is logged, then at most one line per
    /// SHED_LOG_EVERY_MS with the count, so an overload can't flood the log.
    fn log_shed(&self, max: usize) {
        let now = self.now_ms();
        let n = self.shed_since.fetch_add(1, Ordering::Relaxed) + 1;
        let next = self.next_shed_log_ms.load(Ordering::Relaxed);
        if now >= next
            && self
                .next_shed_log_ms
                .compare_exchange(
                    next,
                    now + SHED_LOG_EVERY_MS,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            self.shed_since.store(0, Ordering::Relaxed);
            eprintln!(
                "tb-rls: shedding: {max} decisions wait on Redis (--max-in-flight); {n} call(s) answered RESOURCE_EXHAUSTED"
            );
        }
    }

    /// Redis failed (or the breaker is open): the answer --on-redis-error gives.
    fn by_policy(
        &self,
        plan: &Plan,
        why: &Error,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        match self.failure.on_error {
            OnError::Closed => Err(tonic::Status::unavailable(why.to_string())),
            OnError::Open => Ok(response(admitted_without_redis(
                plan,
                self.headers.as_ref(),
            ))),
        }
    }

    /// /metrics' text: the counters and the state now.
    pub fn metrics_text(&self) -> String {
        let open = self
            .breaker
            .as_ref()
            .is_some_and(|b| b.state() != crate::breaker::State::Closed);
        let in_flight = self.in_flight.load(Ordering::Relaxed) as u64;
        self.metrics.render(in_flight, open)
    }

    async fn decide(
        &self,
        plan: &Plan,
        tally: &Tally,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let Some(_slot) = self.slot() else {
            self.metrics.failed(Failed::Shed);
            self.metrics.record(tally, plan, None);
            let max = self.failure.max_in_flight.unwrap_or(0);
            self.log_shed(max);
            return Err(tonic::Status::resource_exhausted(format!(
                "tb-rls: {max} decisions already wait on Redis (--max-in-flight)"
            )));
        };
        let enter = match &self.breaker {
            Some(b) => match b.enter(self.now_ms()) {
                Enter::Skip => {
                    self.metrics.failed(Failed::BreakerSkip);
                    self.metrics.record(tally, plan, None);
                    let why = Error::Redis(format!(
                        "redis: not called: the breaker is open after {} failures, for {} ms at a time",
                        b.limits.failures, b.limits.cooldown_ms
                    ));
                    return self.by_policy(plan, &why);
                }
                other => other,
            },
            None => Enter::Call,
        };
        let probe = enter == Enter::Probe;
        let deadline = self.failure.redis_timeout;
        let answer =
            tokio::time::timeout(deadline, self.engine.decide(&plan.enforced, &plan.shadow))
                .await
                .unwrap_or_else(|_| {
                    Err(Error::Redis(format!(
                        "redis: no answer within {} ms (--redis-timeout)",
                        deadline.as_millis()
                    )))
                });
        match answer {
            Ok((enforced, shadow)) => {
                self.metrics.record(tally, plan, Some((&enforced, &shadow)));
                if let Some(b) = &self.breaker {
                    b.success(probe);
                }
                if self.failing.swap(false, Ordering::Relaxed) {
                    eprintln!("tb-rls: redis answers again");
                }
                Ok(response(reply(
                    plan,
                    &enforced,
                    &shadow,
                    self.headers.as_ref(),
                )))
            }
            Err(e @ Error::Reply(_)) => {
                // Redis answered: no outage, so no failure policy and no
                // breaker failure; the cause is logged once.
                self.metrics.record(tally, plan, None);
                self.metrics.failed(Failed::Service);
                if let Some(b) = &self.breaker {
                    b.success(probe);
                }
                if !self.odd_reply.swap(true, Ordering::Relaxed) {
                    eprintln!("tb-rls: {e}");
                }
                Err(tonic::Status::internal(e.to_string()))
            }
            Err(e) => {
                self.metrics.record(tally, plan, None);
                self.metrics.failed(Failed::Redis);
                let opened = match &self.breaker {
                    Some(b) => b.failure(probe, self.now_ms()),
                    None => false,
                };
                if opened {
                    self.metrics.breaker_opened();
                }
                if !self.failing.swap(true, Ordering::Relaxed) {
                    eprintln!("tb-rls: {e}");
                }
                if opened {
                    if let Some(l) = self.breaker.as_ref().map(|b| b.limits) {
                        eprintln!(
                            "tb-rls: breaker open: {} redis failures within {} ms; calls are answered by --on-redis-error without redis, one probe every {} ms",
                            l.failures, l.window_ms, l.cooldown_ms
                        );
                    }
                }
                self.by_policy(plan, &e)
            }
        }
    }
}

fn to_request(r: RateLimitRequest) -> Request {
    Request {
        domain: r.domain,
        hits_addend: r.hits_addend,
        descriptors: r
            .descriptors
            .into_iter()
            .map(|d| Descriptor {
                entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
                hits_addend: d.hits_addend.map(|h| h.value),
                limit_override: d.limit.map(|l| (l.requests_per_unit, l.unit)),
            })
            .collect(),
    }
}

fn duration(ms: u64) -> Duration {
    Duration {
        seconds: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

#[tonic::async_trait]
impl RateLimitService for Service {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        self.metrics.call();
        let answer = self.answer(to_request(request.into_inner())).await;
        if let Err(status) = &answer {
            self.metrics.error(status.code());
        }
        answer
    }
}

impl Service {
    async fn answer(
        &self,
        request: Request,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let config = self.config.get();
        let plan =
            plan(&config, &request).map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
        let tally = self.metrics.tally(&config, &request, &plan);
        if plan.enforced.is_empty() && plan.shadow.is_empty() {
            // Decided here: no Redis, no slot, nothing for the breaker.
            self.metrics.record(&tally, &plan, Some((&[], &[])));
            return Ok(response(reply(&plan, &[], &[], self.headers.as_ref())));
        }
        self.decide(&plan, &tally).await
    }
}

fn response(r: Reply) -> tonic::Response<RateLimitResponse> {
    let code = |over: bool| if over { Code::OverLimit } else { Code::Ok } as i32;
    let statuses = r
        .statuses
        .iter()
        .map(|s| DescriptorStatus {
            code: code(s.over),
            current_limit: s.limit.as_ref().map(|l| RateLimit {
                name: l.name.clone(),
                requests_per_unit: l.requests_per_unit,
                unit: PbUnit::try_from(l.unit.to_proto()).unwrap_or(PbUnit::Unknown) as i32,
            }),
            limit_remaining: s.remaining,
            duration_until_reset: s.until_reset_ms.map(duration),
            ..DescriptorStatus::default()
        })
        .collect();
    let response_headers_to_add = r
        .headers
        .into_iter()
        .map(|(key, value)| HeaderValue {
            key,
            value,
            ..HeaderValue::default()
        })
        .collect();
    tonic::Response::new(RateLimitResponse {
        overall_code: code(r.over),
        statuses,
        response_headers_to_add,
        ..RateLimitResponse::default()
    })
}
