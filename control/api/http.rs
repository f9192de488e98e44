//! The HTTP server's routes and their front door, shared state, error
//! responses and SSE framing. (Connections are served by `listener`.)
//!
//! Every router built here passes requests through the same front door
//! (`front_door`): its envelope outermost (request id and log span, head
//! limit, errors in the route's dialect), CORS when configured, then per
//! group of routes its guard (key gate, admission, body limit) before the
//! handler.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router as HttpRouter;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::{Stream, StreamExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

pub use super::state::AppState;

use super::auth::{AdminAccess, AdminGate, InferenceGate};
use super::dialect::{self, ErrorDialect};
use super::endpoints;
use super::front_door::{self, Envelope, Gate, Guard};
use super::limits::{BodyLimit, HeadLimit};
use super::request_id::{RequestIds, X_REQUEST_ID};
use crate::config::{CorsPolicy, FrontDoorConfig};
use crate::error::Error;

pub type SharedState = Arc<AppState>;

/// The public API: inference routes behind the inference key gate, health
/// routes open, and the admin routes behind control-plane keys when keys
/// are configured (see [`admin_on_public`]).
pub fn app(state: SharedState, front: &FrontDoorConfig) -> HttpRouter {
    let body = BodyLimit(front.limits.max_payload_bytes);
    let guard = |x_api_key, admitted: bool| {
        from_fn_with_state(
            Arc::new(Guard {
                gate: Gate::Inference(InferenceGate::new(&front.auth, x_api_key)),
                admission: admitted.then(|| Arc::clone(&state)),
                body,
            }),
            front_door::guard,
        )
    };
    let inference = HttpRouter::new()
        .route("/v1/chat/completions", post(endpoints::chat_completions))
        .route("/v1/completions", post(endpoints::completions))
        .route("/generate", post(endpoints::generate))
        .route("/v1/embeddings", post(endpoints::embeddings))
        .route("/v1/classify", post(endpoints::classify))
        .route("/v1/tokenize", post(endpoints::tokenize))
        .route("/v1/detokenize", post(endpoints::detokenize))
        .route("/v1/responses", post(endpoints::create_response))
        .route_layer(guard(false, true));
    // Stored responses and conversations, and the model list: not
    // admitted.
    let history = HttpRouter::new()
        .route(
            "/v1/responses/{id}",
            get(endpoints::get_response).delete(endpoints::delete_response),
        )
        .route(
            "/v1/responses/{id}/cancel",
            post(endpoints::cancel_response),
        )
        .route(
            "/v1/responses/{id}/input_items",
            get(endpoints::list_input_items),
        )
        .route("/v1/conversations", post(endpoints::create_conversation))
        .route(
            "/v1/conversations/{id}",
            get(endpoints::get_conversation)
                .post(endpoints::update_conversation)
                .delete(endpoints::delete_conversation),
        )
        .route(
            "/v1/conversations/{id}/items",
            get(endpoints::list_conversation_items).post(endpoints::add_conversation_items),
        )
        .route(
            "/v1/conversations/{id}/items/{item_id}",
            get(endpoints::get_conversation_item).delete(endpoints::delete_conversation_item),
        )
        .route("/v1/models", get(endpoints::models))
        .route_layer(guard(false, false));
    // Anthropic clients send their key in `x-api-key`.
    let messages = HttpRouter::new()
        .route("/v1/messages", post(endpoints::messages))
        .route_layer(guard(true, true));
    let open = HttpRouter::new()
        .route("/health", get(health))
        .route("/liveness", get(liveness))
        .route("/readiness", get(readiness));
    let mut router = inference.merge(history).merge(messages).merge(open);
    if admin_on_public(front) {
        router = router.merge(admin_routes(front, AdminAccess::Keys));
    }
    with_front_door(router.fallback(not_found), front).with_state(state)
}

/// The admin listener's API: the admin routes, to whoever reaches it.
pub fn admin_app(state: SharedState, front: &FrontDoorConfig) -> HttpRouter {
    with_front_door(
        admin_routes(front, AdminAccess::Listener).fallback(not_found),
        front,
    )
    .with_state(state)
}

/// Whether the admin routes are on the public listener (control-plane
/// keys guard them) rather than on an admin listener of their own.
pub fn admin_on_public(front: &FrontDoorConfig) -> bool {
    !front.auth.control_plane_keys.is_empty()
}

fn admin_routes(front: &FrontDoorConfig, access: AdminAccess) -> HttpRouter<SharedState> {
    super::admin::routes().route_layer(from_fn_with_state(
        Arc::new(Guard {
            gate: Gate::Admin(AdminGate::new(&front.auth, access)),
            admission: None,
            body: BodyLimit(front.limits.max_payload_bytes),
        }),
        front_door::guard,
    ))
}

/// The layers every route and the fallback go through: the envelope
/// outermost, CORS inside it (preflights are answered before any gate).
fn with_front_door(
    router: HttpRouter<SharedState>,
    front: &FrontDoorConfig,
) -> HttpRouter<SharedState> {
    // Bodies are bounded by the guard, not the extractors' 2 MB.
    let mut router = router.layer(DefaultBodyLimit::disable());
    if let Some(cors) = cors(&front.cors) {
        router = router.layer(cors);
    }
    router.layer(from_fn_with_state(
        Arc::new(Envelope {
            ids: RequestIds::new(&front.request_id_headers),
            head: HeadLimit(front.limits.max_header_bytes),
        }),
        front_door::envelope,
    ))
}

/// The CORS layer of `policy`: preflights are answered before any key is
/// asked for, and browsers may read the request id and `Retry-After`.
fn cors(policy: &CorsPolicy) -> Option<CorsLayer> {
    let origins = match policy {
        CorsPolicy::Off => return None,
        CorsPolicy::AnyOrigin => AllowOrigin::any(),
        CorsPolicy::Origins(origins) => AllowOrigin::list(
            origins
                .iter()
                .filter_map(|origin| HeaderValue::from_str(origin).ok()),
        ),
    };
    Some(
        CorsLayer::new()
            .allow_origin(origins)
            .allow_methods([Method::GET, Method::POST, Method::DELETE, Method::OPTIONS])
            .allow_headers(AllowHeaders::mirror_request())
            .expose_headers([X_REQUEST_ID, header::RETRY_AFTER])
            .max_age(Duration::from_secs(600)),
    )
}

/// A front-door refusal: its JSON error, counted by code.
pub(super) fn refusal(err: &Error) -> Response {
    crate::metrics::record_refusal(err.code.as_str());
    error_response(err)
}

/// Serves Prometheus `/metrics` and the probes (`/health`, `/liveness`,
/// `/readiness`) on their own listener until `stop`. It is not drained with
/// the others: through a shutdown it answers `/readiness` 503 while the
/// public listener refuses connections.
pub async fn serve_metrics(
    listener: TcpListener,
    handle: crate::metrics::MetricsHandle,
    state: SharedState,
    stop: CancellationToken,
) {
    let app = HttpRouter::new()
        .route(
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
        )
        .route("/health", get(health))
        .route("/liveness", get(liveness))
        .route("/readiness", get(readiness))
        .fallback(not_found)
        .layer(axum::middleware::from_fn(dialect::speak))
        .with_state(state);
    if let Err(err) = axum::serve(listener, app)
        .with_graceful_shutdown(stop.cancelled_owned())
        .await
    {
        tracing::error!(%err, "metrics listener failed");
    }
}

/// An error response with the code's status, OpenAI-shaped; the
/// front door renders it again on a route of another dialect.
pub(super) fn error_response(err: &Error) -> Response {
    dialect::render(err, ErrorDialect::OpenAi)
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        error_response(&self)
    }
}

/// A `text/event-stream` response from already-framed SSE bytes.
pub(super) fn sse_response(frames: impl Stream<Item = Bytes> + Send + 'static) -> Response {
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

/// A `200 application/json` response of `value`, serialized into one
/// buffer sized for a typical completion. (axum's `Json` writes through a
/// `BytesMut` writer grown from 128 bytes, with a capacity check on each of
/// the serializer's hundreds of small writes.)
pub(super) fn json_response(value: &impl serde::Serialize) -> Response {
    let mut body = Vec::with_capacity(JSON_RESPONSE_CAPACITY);
    match serde_json::to_writer(&mut body, value) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            Bytes::from(body),
        )
            .into_response(),
        Err(err) => {
            Error::internal(format!("the response does not serialize: {err}")).into_response()
        }
    }
}

/// Room a JSON response starts with: a chat completion with a short
/// answer, or tool calls, fits without growing.
const JSON_RESPONSE_CAPACITY: usize = 1024;

/// One `data: <json>\n\n` frame.
pub(super) fn data_frame(json: &impl serde::Serialize) -> Bytes {
    let mut frame = b"data: ".to_vec();
    if serde_json::to_writer(&mut frame, json).is_err() {
        frame.extend_from_slice(b"{}");
    }
    frame.extend_from_slice(b"\n\n");
    Bytes::from(frame)
}

/// One `event: <name>\ndata: <json>\n\n` frame (Anthropic streams).
pub(super) fn named_frame(event: &str, json: &impl serde::Serialize) -> Bytes {
    let mut frame = format!("event: {event}\n").into_bytes();
    frame.extend_from_slice(&data_frame(json));
    Bytes::from(frame)
}

pub(super) const DONE_FRAME: &[u8] = b"data: [DONE]\n\n";

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

async fn not_found(uri: Uri) -> Response {
    error_response(&Error::new(
        crate::error::ErrorCode::NotFound,
        format!("no route {}", crate::error::excerpt(uri.path())),
    ))
}
