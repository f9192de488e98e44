//! Request ids: accepted from the client (`--request-id-headers`, first
//! present wins) or minted, returned as `x-request-id` on every response,
//! put on the request's log span, and sent to the engines as the prefix of
//! their request ids (see `pipeline::request_context`).
//!
//! Why it exists: one id from the client's logs through the gateway's to an
//! engine's is how an operator follows a slow or failed request. A client's
//! id is taken only when it is short and plain (at most
//! [`MAX_REQUEST_ID_LEN`] of `A-Z a-z 0-9 - _ . :`), since it lands in log
//! lines and engine ids; otherwise a fresh one replaces it, and the response
//! says which.
//!
//! This layer also counts inference requests per tenant
//! (`smg_http_tenant_requests_total`), reading the tenant the gate put on
//! the response.

use std::sync::Arc;

use axum::extract::Request;
use axum::response::Response;
use http::{HeaderName, HeaderValue};

use super::auth::Tenant;
use crate::metrics;
use crate::pipeline::request_context::push_hex_u128;

/// The header the id is returned in (and handed to handlers in).
pub(super) const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The longest client id kept.
pub const MAX_REQUEST_ID_LEN: usize = 128;

/// A request's id (a request extension).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub Arc<str>);

/// Where ids are read from.
#[derive(Debug, Clone)]
pub(super) struct RequestIds {
    headers: Arc<[HeaderName]>,
}

impl RequestIds {
    /// Reads ids from `headers` (valid lowercase names; others are skipped).
    pub(super) fn new(headers: &[String]) -> Self {
        Self {
            headers: headers
                .iter()
                .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok())
                .collect(),
        }
    }

    /// The client's id, if one of the headers carries a usable one.
    fn client_id(&self, request: &Request) -> Option<Arc<str>> {
        self.headers
            .iter()
            .find_map(|name| request.headers().get(name))
            .and_then(|value| value.to_str().ok())
            .filter(|id| usable(id))
            .map(Arc::from)
    }
}

/// Whether a client's id can be kept as it is.
pub(super) fn usable(id: &str) -> bool {
    (1..=MAX_REQUEST_ID_LEN).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// A fresh id: 32 hex digits.
fn mint() -> Arc<str> {
    let mut id = String::with_capacity(32);
    push_hex_u128(&mut id, rand::random());
    Arc::from(id)
}

/// A request's id as the front door assigned it: the id, its header value
/// and the request's log span.
pub(super) struct Assigned {
    pub id: Arc<str>,
    value: Option<HeaderValue>,
    pub span: tracing::Span,
}

impl RequestIds {
    /// Gives `request` its id (the client's, or a fresh one), puts it in
    /// the request's headers and extensions, and opens its span.
    pub(super) fn assign(&self, request: &mut Request) -> Assigned {
        let id = self.client_id(request).unwrap_or_else(mint);
        let value = HeaderValue::from_str(&id).ok();
        if let Some(value) = &value {
            request.headers_mut().insert(X_REQUEST_ID, value.clone());
        }
        request.extensions_mut().insert(RequestId(Arc::clone(&id)));
        let span = tracing::info_span!(
            "request",
            request_id = %id,
            method = %request.method(),
            path = %request.uri().path(),
            tenant = tracing::field::Empty,
        );
        Assigned { id, value, span }
    }
}

impl Assigned {
    /// Returns the id on `response`, and counts the request for the
    /// tenant the gate put on it.
    pub(super) fn answer(self, response: &mut Response) {
        if let Some(value) = self.value {
            response.headers_mut().insert(X_REQUEST_ID, value);
        }
        if let Some(tenant) = response.extensions().get::<Tenant>() {
            metrics::record_tenant_request(tenant.name(), response.status().as_u16());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(pairs: &[(&str, &str)]) -> Request {
        let mut builder = http::Request::builder().uri("/v1/models");
        for (name, value) in pairs {
            builder = builder.header(*name, *value);
        }
        builder.body(axum::body::Body::empty()).expect("request")
    }

    #[test]
    fn the_first_configured_header_with_a_usable_id_wins() {
        let ids = RequestIds::new(&["x-request-id".into(), "x-correlation-id".into()]);
        let found =
            |pairs: &[(&str, &str)]| ids.client_id(&request(pairs)).map(|id| id.to_string());
        assert_eq!(
            found(&[("x-correlation-id", "corr-1")]),
            Some("corr-1".into())
        );
        assert_eq!(
            found(&[("x-correlation-id", "corr-1"), ("x-request-id", "req-1")]),
            Some("req-1".into())
        );
        assert_eq!(
            found(&[("x-trace-id", "t-1")]),
            None,
            "not a configured header"
        );
        assert_eq!(found(&[("x-request-id", "has space")]), None);
    }

    #[test]
    fn usable_ids_are_short_and_plain() {
        for good in ["a", "0f3c-11:2.x_y", &"a".repeat(MAX_REQUEST_ID_LEN)] {
            assert!(usable(good), "{good}");
        }
        for bad in [
            "",
            "a b",
            "a\"b",
            "a/b",
            "ü",
            &"a".repeat(MAX_REQUEST_ID_LEN + 1),
        ] {
            assert!(!usable(bad), "{bad}");
        }
        assert_eq!(mint().len(), 32);
        assert!(usable(&mint()));
    }
}
