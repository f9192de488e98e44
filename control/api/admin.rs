//! The admin API: the fleet changed while it serves.
//!
//! | route | answer |
//! |---|---|
//! | `POST /workers` `{"url", "role"?, "bootstrap_port"?, "model_id"?}` | 202 and the registration's status; 400 bad URL/role, 409 duplicate |
//! | `GET /workers` | `{"workers": [...]}` |
//! | `GET /workers/{id}` | the worker's status; 404 `worker_not_found` |
//! | `DELETE /workers/{id}` | 202, the worker drains (in-flight requests finish) |

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::http::{SharedState, error_response};
use super::types::parse::parse_json;
use crate::workers::WorkerSpec;

/// The admin routes, merged into the public API's router.
pub fn routes() -> axum::Router<SharedState> {
    axum::Router::new()
        .route("/workers", get(list).post(register))
        .route("/workers/{id}", get(show).delete(remove))
}

async fn register(State(state): State<SharedState>, body: axum::body::Bytes) -> Response {
    let spec: WorkerSpec = match parse_json(&body) {
        Ok(spec) => spec,
        Err(err) => return error_response(&err),
    };
    match state.register(spec) {
        Ok(status) => (StatusCode::ACCEPTED, Json(status)).into_response(),
        Err(err) => error_response(&err),
    }
}

async fn list(State(state): State<SharedState>) -> Response {
    Json(serde_json::json!({ "workers": state.list() })).into_response()
}

async fn show(State(state): State<SharedState>, Path(id): Path<String>) -> Response {
    match state.status(&id) {
        Ok(status) => Json(status).into_response(),
        Err(err) => error_response(&err),
    }
}

async fn remove(State(state): State<SharedState>, Path(id): Path<String>) -> Response {
    match state.remove(&id) {
        Ok(status) => (StatusCode::ACCEPTED, Json(status)).into_response(),
        Err(err) => error_response(&err),
    }
}
