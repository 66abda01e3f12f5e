//! The HTTP endpoint of a running pipeline (axum): `/metrics` (Prometheus
//! text, or OpenMetrics when the scraper asks for it), `/health/live` and
//! `/health/ready`.
//!
//! - `/health/live`: 200 while the process serves requests.
//! - `/health/ready`: 200 once every subtask is past recovery and
//!   checkpoints complete (a checkpoint completed since the latest
//!   (re)start, the latest no older than `[metrics]
//!   ready_max_checkpoint_age`); 503 otherwise, with the reason.
//!
//! Bodies are small JSON objects: `{"status":"ready","pipeline":"orders",
//! "last_checkpoint":12,"last_checkpoint_age_seconds":0.4}`.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::exporter::{render, Observed};

struct Shared {
    observed: Observed,
}

/// A started endpoint; stops when dropped.
#[derive(Debug)]
pub struct MetricsServer {
    address: SocketAddr,
    task: JoinHandle<()>,
}

impl MetricsServer {
    /// Listens on `address` (port 0: any free port) and serves until
    /// dropped. The error names the address and the fix.
    pub async fn start(address: SocketAddr, observed: Observed) -> anyhow::Result<MetricsServer> {
        let listener = TcpListener::bind(address).await.map_err(|e| {
            anyhow::anyhow!(
                "cannot listen on {address} for the metrics endpoint: {e}. Fix: pick a free address in \
                 [metrics] listen or --metrics-listen (or stop the process that holds it)"
            )
        })?;
        let address = listener.local_addr()?;
        let shared = Arc::new(Shared { observed });
        let app = Router::new()
            .route("/metrics", get(metrics))
            .route("/health/live", get(live))
            .route("/health/ready", get(ready))
            .fallback(not_found)
            .with_state(shared);
        let task = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                tracing::error!(%error, "the metrics endpoint stopped");
            }
        });
        tracing::info!(%address, "serving /metrics, /health/live and /health/ready");
        Ok(MetricsServer { address, task })
    }

    /// Where it listens.
    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn metrics(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let openmetrics = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("application/openmetrics-text"));
    let body = render(&shared.observed, openmetrics);
    let content_type = if openmetrics {
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    } else {
        "text/plain; version=0.0.4; charset=utf-8"
    };
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

async fn live(State(shared): State<Arc<Shared>>) -> Response {
    Json(json!({"status": "live", "pipeline": shared.observed.pipeline})).into_response()
}

async fn ready(State(shared): State<Arc<Shared>>) -> Response {
    let observed = &shared.observed;
    let r = observed.readiness();
    let body = json!({
        "status": if r.ready { "ready" } else { "not ready" },
        "pipeline": observed.pipeline,
        "reason": r.reason,
        "last_checkpoint": r.last_checkpoint,
        "last_checkpoint_age_seconds": r.last_checkpoint_age_seconds,
    });
    let status = if r.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        "not found: this endpoint serves /metrics, /health/live and /health/ready\n",
    )
        .into_response()
}
