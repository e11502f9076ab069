//! ShouldRateLimit: the protos in, the plan, one Redis round trip, the
//! reply out.

use crate::engine::Engine;
use crate::error::Error;
use crate::plan::{plan, Descriptor, Request};
use crate::reload::Live;
use crate::reply::{reply, HeaderNames};
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as PbUnit, Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub struct Service {
    /// Swapped by a reload: each call plans on the one it read first.
    pub config: Arc<Live>,
    pub engine: Arc<Engine>,
    pub headers: Option<HeaderNames>,
    /// Whether Redis is failing now: its cause is logged once, not per call.
    failing: AtomicBool,
}

impl Service {
    pub fn new(config: Arc<Live>, engine: Arc<Engine>, headers: Option<HeaderNames>) -> Self {
        Service {
            config,
            engine,
            headers,
            failing: AtomicBool::new(false),
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
        let request = to_request(request.into_inner());
        let plan = plan(&self.config.get(), &request)
            .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
        let (enforced, shadow) = match self.engine.decide(&plan.enforced, &plan.shadow).await {
            Ok(r) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    eprintln!("tb-rls: redis answers again");
                }
                r
            }
            Err(e) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    eprintln!("tb-rls: {e}");
                }
                let status = match e {
                    Error::Redis(_) => tonic::Status::unavailable(e.to_string()),
                    _ => tonic::Status::internal(e.to_string()),
                };
                return Err(status);
            }
        };
        let r = reply(&plan, &enforced, &shadow, self.headers.as_ref());
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
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: code(r.over),
            statuses,
            response_headers_to_add,
            ..RateLimitResponse::default()
        }))
    }
}
