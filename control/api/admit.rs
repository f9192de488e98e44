//! The admission layer of the inference routes: a request is admitted
//! ([`Admission::admit`]) before its body is read and keeps its permit
//! until its response body (a stream included) has been sent or dropped.
//!
//! Why a layer: every inference route is admitted by the same rule, and
//! the permit must outlive the handler (a stream is still being written
//! when the handler has returned), which only the response body can carry.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body::{Frame, SizeHint};

use super::auth::Tenant;
use super::http::SharedState;
use crate::admission::Permit;

/// Admits the request, runs it, and ties the permit to its response body.
pub(super) async fn admit(
    State(state): State<SharedState>,
    request: Request,
    next: Next,
) -> Response {
    let tenant = request.extensions().get::<Tenant>().cloned();
    let permit = match state
        .admission
        .admit(tenant.as_ref().map(Tenant::name))
        .await
    {
        Ok(permit) => permit,
        Err(err) => return err.into_response(),
    };
    let held = HeldPermit::default();
    if let Ok(mut slot) = held.0.lock() {
        *slot = Some(permit);
    }
    let mut request = request;
    request.extensions_mut().insert(held.clone());
    let response = next.run(request).await;
    // A handler that runs on past its response took the permit with it.
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
