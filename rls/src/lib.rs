//! tb-rls: Envoy's rate limit service (RLS v3) on redis-tokenbucket's
//! buckets. The mapping (config, matching, plan, reply) is plain Rust with
//! no Redis or gRPC types; `grpc`, `engine` and `http` are the edges.

pub mod breaker;
pub mod config;
pub mod engine;
pub mod error;
pub mod grpc;
pub mod keys;
pub mod matcher;
pub mod metrics;
pub mod plan;
pub mod reload;
pub mod reply;
pub mod settings;
pub mod unit;
