//! The front door: what every request passes before its handler, as two
//! layers.
//!
//! - [`envelope`], around every route and the fallback: the request id and
//!   log span (`request_id`), the head size limit (`limits`), and on the
//!   way out the error rendered in the route's dialect (`dialect`) and the
//!   id returned.
//! - [`guard`], around each group of routes: the key gate (`auth`), then
//!   admission for the inference routes (`admit`), then the body read
//!   whole within its limit (`limits`). The body is read last, so neither
//!   a caller without a key nor a queued request makes the gateway hold a
//!   body; the permit is held until the response's last byte.
//!
//! Why two functions and not a layer per concern: each `from_fn` layer
//! clones its boxed inner service and boxes a future on every request; the
//! six layers the front door used to be cost about 14,000 instructions per
//! request, 4% of a small chat's (callgrind, BENCHMARKS.md, issue 13).
//! The concerns stay
//! in their modules as plain steps; this module only orders them.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

use super::admit::{admit, hold_until_sent};
use super::auth::{AdminGate, InferenceGate};
use super::dialect::Speaker;
use super::http::SharedState;
use super::limits::{BodyLimit, HeadLimit};
use super::request_id::RequestIds;
use crate::pipeline::request_context::with_client_request_id;

/// What [`envelope`] needs: where request ids come from, and the head
/// limit.
#[derive(Debug)]
pub(super) struct Envelope {
    pub ids: RequestIds,
    pub head: HeadLimit,
}

/// Every request's way in and out: its id and span, the head limit, and
/// errors in the route's dialect. Outside every other layer, so whatever
/// fails inside it (a gate, a limit, the router's 404 and 405, a handler)
/// is answered in the route's dialect with the request's id.
pub(super) async fn envelope(
    State(envelope): State<Arc<Envelope>>,
    mut request: Request,
    next: Next,
) -> Response {
    let mut assigned = envelope.ids.assign(&mut request);
    let span = std::mem::replace(&mut assigned.span, tracing::Span::none());
    let speaker = Speaker::of(&request);
    let head = envelope.head;
    let inside = async move {
        let response = match head.refusal(&request) {
            None => next.run(request).await,
            Some(refusal) => refusal,
        };
        speaker.answer(response).await
    };
    let mut response = with_client_request_id(Arc::clone(&assigned.id), inside)
        .instrument(span)
        .await;
    assigned.answer(&mut response);
    response
}

/// Who may call a group of routes.
#[derive(Debug)]
pub(super) enum Gate {
    /// Inference keys; the request is served for the key's tenant.
    Inference(InferenceGate),
    /// Control-plane keys (or the admin listener); changes are audited.
    Admin(AdminGate),
}

/// What [`guard`] checks for a group of routes.
#[derive(Debug)]
pub(super) struct Guard {
    pub gate: Gate,
    /// Admission control, on the routes that run generations.
    pub admission: Option<SharedState>,
    pub body: BodyLimit,
}

/// A route group's checks, in order: the gate, admission, the body.
pub(super) async fn guard(
    State(guard): State<Arc<Guard>>,
    request: Request,
    next: Next,
) -> Response {
    match &guard.gate {
        Gate::Inference(gate) => {
            let (mut request, tenant) = match gate.pass(request).await {
                Ok(passed) => passed,
                Err(refusal) => return refusal,
            };
            let mut response = match &guard.admission {
                Some(state) => match admit(state, &tenant, &mut request).await {
                    Ok(held) => {
                        hold_until_sent(&held, read_then_run(guard.body, request, next).await)
                    }
                    Err(refusal) => refusal,
                },
                None => read_then_run(guard.body, request, next).await,
            };
            // Counted per tenant by the envelope.
            response.extensions_mut().insert(tenant);
            response
        }
        Gate::Admin(gate) => {
            let (request, call) = match gate.pass(request).await {
                Ok(passed) => passed,
                Err(refusal) => return refusal,
            };
            let response = read_then_run(guard.body, request, next).await;
            call.audit(&response);
            response
        }
    }
}

/// Reads the body whole within `limit`, then runs the handler.
async fn read_then_run(limit: BodyLimit, request: Request, next: Next) -> Response {
    match limit.read(request).await {
        Ok(request) => next.run(request).await,
        Err(refusal) => refusal,
    }
}
