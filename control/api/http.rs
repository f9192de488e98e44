//! The HTTP server: routes, shared state, error responses, SSE framing, and
//! the listener (TCP_NODELAY on every accepted socket, so the first token is
//! never held back by Nagle).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use axum::Router as HttpRouter;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use futures::{Stream, StreamExt};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

pub use super::state::AppState;

use super::endpoints;
use crate::error::Error;

pub type SharedState = Arc<AppState>;

/// The routing table of the public API.
pub fn app(state: SharedState) -> HttpRouter {
    let inference = HttpRouter::new()
        .route("/v1/chat/completions", post(endpoints::chat_completions))
        .route("/v1/completions", post(endpoints::completions))
        .route("/generate", post(endpoints::generate))
        .route("/v1/messages", post(endpoints::messages))
        .route("/v1/embeddings", post(endpoints::embeddings))
        .route("/v1/classify", post(endpoints::classify))
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            super::admit::admit,
        ));
    HttpRouter::new()
        .merge(inference)
        .route("/v1/models", get(endpoints::models))
        .route("/health", get(health))
        .route("/liveness", get(liveness))
        .route("/readiness", get(readiness))
        .merge(super::admin::routes())
        .fallback(not_found)
        .with_state(state)
}

/// Serves the API on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    state: SharedState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = listener.tap_io(|socket| {
        if let Err(err) = socket.set_nodelay(true) {
            tracing::debug!(%err, "cannot set TCP_NODELAY");
        }
    });
    axum::serve(listener, app(state))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Serves Prometheus `/metrics` on its own listener.
pub async fn serve_metrics(listener: TcpListener, handle: PrometheusHandle) {
    let app = HttpRouter::new().route(
        "/metrics",
        get(move || {
            let handle = handle.clone();
            async move {
                (
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    handle.render(),
                )
            }
        }),
    );
    if let Err(err) = axum::serve(listener, app).await {
        tracing::error!(%err, "metrics listener failed");
    }
}

/// An OpenAI-shaped error response with the code's status.
pub fn error_response(err: &Error) -> Response {
    let status =
        StatusCode::from_u16(err.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, axum::Json(err.to_openai_json())).into_response();
    if let Some(after) = err.retry_after {
        // Whole seconds, rounded up: "0" would invite an immediate retry.
        let seconds = after.as_secs() + u64::from(after.subsec_nanos() > 0);
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    }
    response
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        error_response(&self)
    }
}

/// A `text/event-stream` response from already-framed SSE bytes.
pub fn sse_response(frames: impl Stream<Item = Bytes> + Send + 'static) -> Response {
    let mut response = Response::new(Body::from_stream(frames.map(Ok::<_, Infallible>)));
    let headers: &mut HeaderMap = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// One `data: <json>\n\n` frame.
pub fn data_frame(json: &impl serde::Serialize) -> Bytes {
    let mut frame = b"data: ".to_vec();
    if serde_json::to_writer(&mut frame, json).is_err() {
        frame.extend_from_slice(b"{}");
    }
    frame.extend_from_slice(b"\n\n");
    Bytes::from(frame)
}

/// One `event: <name>\ndata: <json>\n\n` frame (Anthropic streams).
pub fn named_frame(event: &str, json: &impl serde::Serialize) -> Bytes {
    let mut frame = format!("event: {event}\n").into_bytes();
    frame.extend_from_slice(&data_frame(json));
    Bytes::from(frame)
}

pub const DONE_FRAME: &[u8] = b"data: [DONE]\n\n";

async fn health(State(state): State<SharedState>) -> Response {
    readiness(State(state)).await
}

async fn liveness() -> Response {
    (
        StatusCode::OK,
        axum::Json(serde_json::json!({"status": "alive"})),
    )
        .into_response()
}

/// Ready when a healthy worker exists for every role the mode needs (with
/// several models: when at least one model can serve).
async fn readiness(State(state): State<SharedState>) -> Response {
    let (ready, body) = state.readiness();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}

async fn not_found() -> Response {
    error_response(&Error::new(
        crate::error::ErrorCode::NotFound,
        "no such route",
    ))
}
