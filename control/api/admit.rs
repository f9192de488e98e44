//! The admission layer of the inference routes: a request is admitted
//! ([`Admission::admit`]) before its body is read and keeps its permit
//! until its response body (a stream included) has been sent or dropped.
//!
//! Why a layer: every inference route is admitted by the same rule, and
//! the permit must outlive the handler (a stream is still being written
//! when the handler has returned), which only the response body can carry.

use std::pin::Pin;
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
    let response = next.run(request).await;
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
