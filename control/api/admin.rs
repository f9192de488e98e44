//! The admin API: the fleet changed while it serves. Who may call it, and
//! the audit line of each change, are `auth`'s business.
//!
//! | route | answer |
//! |---|---|
//! | `POST /workers` `{"url", "role"?, "bootstrap_port"?, "model_id"?, "runtime"?, "tensor_transport"?, "shm_min_bytes"?}` | 202 and the registration's status; 400 bad URL/role/transport, 409 duplicate |
//! | `GET /workers[?model_id=&role=&status=]` | `{"workers": [...]}`, filtered |
//! | `GET /workers/{id}` | the worker's status; 404 `worker_not_found` |
//! | `DELETE /workers/{id}` | 202, the worker drains (in-flight requests finish) |
//! | `POST /parse/function_call`, `POST /parse/reasoning` | see `api::parsers` |

use axum::Json;
use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::http::{SharedState, error_response};
use super::types::parse::parse_json;
use crate::error::{Error, excerpt};
use crate::workers::WorkerSpec;

/// The admin routes: on the admin listener, or on the public one behind
/// control-plane keys (see `http::admin_on_public`).
pub(super) fn routes() -> axum::Router<SharedState> {
    axum::Router::new()
        .route("/workers", get(list).post(register))
        .route("/workers/{id}", get(show).delete(remove))
        .merge(super::parsers::routes())
}

async fn register(State(state): State<SharedState>, body: axum::body::Bytes) -> Response {
    let spec: WorkerSpec = match parse_json(&body) {
        Ok(spec) => spec,
        Err(err) => return error_response(&err),
    };
    match state.register(spec).await {
        Ok(status) => (StatusCode::ACCEPTED, Json(status)).into_response(),
        Err(err) => error_response(&err),
    }
}

async fn list(
    State(state): State<SharedState>,
    Query(filters): Query<HashMap<String, String>>,
) -> Response {
    if let Some(unknown) = filters
        .keys()
        .find(|key| !["model_id", "role", "status"].contains(&key.as_str()))
    {
        return error_response(&Error::invalid_parameter(
            &excerpt(unknown).to_string(),
            format!(
                "unknown filter {:?} (model_id, role, status)",
                excerpt(unknown)
            ),
        ));
    }
    let wanted = |key: &str, value: &str| filters.get(key).is_none_or(|want| want == value);
    let workers: Vec<_> = state
        .list()
        .into_iter()
        .filter(|w| {
            wanted("model_id", &w.model_id) && wanted("role", w.role) && wanted("status", w.status)
        })
        .collect();
    Json(serde_json::json!({ "workers": workers })).into_response()
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
