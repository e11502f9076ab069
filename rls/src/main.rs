//! tb-rls: load the config, find the Redis backend, serve gRPC (RLS v3 and
//! grpc.health.v1) and HTTP /healthcheck and /metrics until SIGINT or
//! SIGTERM.

use clap::Parser;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use std::process::ExitCode;
use std::sync::Arc;
use tb_rls::engine::Engine;
use tb_rls::error::Error;
use tb_rls::grpc::Service;
use tb_rls::metrics::{endpoint_from, near_ratio_from, Metrics};
use tb_rls::reload::{Source, Watcher};
use tb_rls::settings::{Flags, Settings};

async fn shutdown() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

/// GET /metrics: the service's counters, as text.
fn scrape(service: &Arc<Service>) -> axum::routing::MethodRouter {
    let service = Arc::clone(service);
    axum::routing::get(move || {
        let text = service.metrics_text();
        async move {
            (
                [(
                    axum::http::header::CONTENT_TYPE,
                    "text/plain; version=0.0.4; charset=utf-8",
                )],
                text,
            )
        }
    })
}

async fn run() -> Result<(), Error> {
    let settings = Settings::resolve(Flags::parse(), |k| std::env::var(k).ok())?;
    let metrics = Arc::new(Metrics::new(near_ratio_from(
        std::env::var("NEAR_LIMIT_RATIO").ok(),
    )?));
    let (watcher, config) = Watcher::load(Source {
        path: settings.config.clone(),
        root: settings.watch_root.clone(),
    })?;
    let endpoint = endpoint_from(|k| std::env::var(k).ok())?;
    metrics.config_load(true);
    let deadline = settings.failure.redis_timeout;
    // A frozen Redis at startup stops it, named, rather than hanging it.
    let engine = tokio::time::timeout(deadline, Engine::connect(&settings.redis))
        .await
        .map_err(|_| {
            Error::Redis(format!(
                "redis at {}: no answer within {} ms (--redis-timeout)",
                settings.redis,
                deadline.as_millis()
            ))
        })??;
    let engine = Arc::new(engine);
    let bind = |addr: &str| {
        let addr = addr.to_string();
        async move {
            tokio::net::TcpListener::bind(&addr)
                .await
                .map_err(|e| Error::Usage(format!("cannot listen on {addr}: {e}")))
        }
    };
    let grpc = bind(&settings.grpc_addr).await?;
    let http = bind(&settings.http_addr).await?;
    let prometheus = match &endpoint {
        Some(e) => Some(bind(&e.addr).await?),
        None => None,
    };
    let shown =
        |l: &tokio::net::TcpListener| l.local_addr().map(|a| a.to_string()).unwrap_or_default();
    // One line a supervisor (or a test) reads to learn the bound ports.
    println!(
        "tb-rls: serving grpc={} http={} backend={:?} domains={}{}",
        shown(&grpc),
        shown(&http),
        engine.backend(),
        config.get().domains.len(),
        prometheus
            .as_ref()
            .map(|l| format!(" prometheus={}", shown(l)))
            .unwrap_or_default()
    );
    if let Some(every) = settings.reload_every {
        watcher
            .spawn(every, Arc::clone(&metrics))
            .map_err(|e| Error::Usage(format!("cannot start the config reload: {e}")))?;
    }
    let service = Arc::new(Service::new(
        config,
        engine,
        settings.headers,
        settings.failure,
        metrics,
    ));
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<RateLimitServiceServer<Service>>()
        .await;
    let app = axum::Router::new()
        .route("/healthcheck", axum::routing::get(|| async { "OK" }))
        .route("/metrics", scrape(&service));
    if let (Some(listener), Some(e)) = (prometheus, &endpoint) {
        let app = axum::Router::new().route(&e.path, scrape(&service));
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown())
                .await
        });
    }
    let http_task = tokio::spawn(async move {
        axum::serve(http, app)
            .with_graceful_shutdown(shutdown())
            .await
    });
    // The builder's TCP_NODELAY (on by default) is ignored for an incoming
    // stream: without it, a reply written in two segments waits on the
    // caller's delayed ACK (40 ms p99s under load in `make bench-rls`).
    let incoming = tonic::transport::server::TcpIncoming::from(grpc).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(health)
        .add_service(RateLimitServiceServer::from_arc(service))
        .serve_with_incoming_shutdown(incoming, shutdown())
        .await
        .map_err(|e| Error::Usage(format!("gRPC server: {e}")))?;
    http_task.abort();
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tb-rls: {e}");
            ExitCode::FAILURE
        }
    }
}
