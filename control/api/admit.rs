//! Admission of the inference routes, as the front door runs it: a request
//! is admitted ([`admit`]) before its body is read and keeps its permit
//! until its response body (a stream included) has been sent or dropped
//! ([`hold_until_sent`]).
//!
//! Why the front door does it: every inference route is admitted by the
//! same rule, and the permit must outlive the handler (a stream is still
//! being written when the handler has returned), which only the response
//! body can carry.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http_body::{Frame, SizeHint};

use super::auth::Tenant;
use super::state::AppState;
use crate::admission::Permit;

/// Admits `request` for `tenant`: waits for a slot (or answers the
/// refusal), then hands the permit to the handler as a [`HeldPermit`]
/// extension, which [`hold_until_sent`] reads back after the handler.
pub(super) async fn admit(
    state: &AppState,
    tenant: &Tenant,
    request: &mut Request,
) -> Result<HeldPermit, Response> {
    let permit = state
        .admission
        .admit(Some(tenant.name()))
        .await
        .map_err(IntoResponse::into_response)?;
    let held = HeldPermit::default();
    if let Ok(mut slot) = held.0.lock() {
        *slot = Some(permit);
    }
    request.extensions_mut().insert(held.clone());
    Ok(held)
}

/// `response`, holding the request's permit until its body has been sent
/// or dropped (unless the handler took the permit into work of its own).
pub(super) fn hold_until_sent(held: &HeldPermit, response: Response) -> Response {
    let Some(permit) = held.take() else {
        return response;
    };
    if !permit.limits() {
        return response;
    }
    let (parts, body) = response.into_parts();
    Response::from_parts(
        parts,
        Body::new(PermittedBody {
            body,
            _permit: permit,
        }),
    )
}

/// The request's admission permit, for a handler whose work outlives its
/// response (a background response): it takes the permit into that work,
/// so the slot stays taken until the work ends, not until the answer is
/// sent.
#[derive(Debug, Clone, Default)]
pub(crate) struct HeldPermit(Arc<Mutex<Option<Permit>>>);

impl HeldPermit {
    pub(crate) fn take(&self) -> Option<Permit> {
        self.0.lock().map_or(None, |mut slot| slot.take())
    }
}

/// A response body that holds its request's permit until it is dropped:
/// after its last byte, or when the client goes away. Sizes and the end of
/// the stream are the inner body's, so a JSON answer keeps its
/// Content-Length.
struct PermittedBody {
    body: Body,
    _permit: Permit,
}

impl http_body::Body for PermittedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
