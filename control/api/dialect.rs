//! Errors in the dialect of the route that failed.
//!
//! Why it exists: a client parses an error in the dialect it speaks, an
//! OpenAI client `{"error": {"message", "type", "param", "code"}}`, an
//! Anthropic client `{"type": "error", "error": {"type", "message"}}`, and
//! fails on anything else (plain text, an empty body). Errors are raised in
//! many places that do not know the dialect: the front door's layers (head
//! and body limits, the key gate, admission), the fallbacks (404, 405), the
//! framework's own extractor rejections (plain text), as well as the
//! handlers. Only the route knows the dialect.
//!
//! So there is one renderer, [`render`], and one step, [`Speaker`], that
//! the front door's envelope runs outside every other layer (and [`speak`]
//! on the metrics listener): an error response carries the [`Error`] it
//! was made from (a response extension, [`Rendered`]), and the step renders
//! it again for the route's dialect when it was rendered in another. A failure that
//! carries no `Error` and no JSON (the framework's plain-text rejections,
//! its empty 405) gets one from its status, so every error leaving the
//! gateway is JSON, in the route's dialect. (JSON answers made on purpose,
//! such as readiness's 503, pass untouched.)

use axum::body::{Body, to_bytes};
use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::types::anthropic;
use crate::error::{Error, ErrorCode, excerpt};
use crate::pipeline::request_context::client_request_id;

/// The shape errors take on a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ErrorDialect {
    /// `{"error": {"message", "type", "param", "code"}}`: every route but
    /// Anthropic's (admin and probes included).
    OpenAi,
    /// `{"type": "error", "error": {"type", "message"}}`: `/v1/messages`.
    Anthropic,
}

impl ErrorDialect {
    /// The dialect of the route at `path`.
    pub(super) fn of_path(path: &str) -> Self {
        let path = path.trim_end_matches('/');
        if path == "/v1/messages" || path.starts_with("/v1/messages/") {
            ErrorDialect::Anthropic
        } else {
            ErrorDialect::OpenAi
        }
    }

    /// `err` as this dialect's JSON body, its message as the client may
    /// read it ([`Error::client_message`], naming the request's id).
    pub(super) fn body(self, err: &Error) -> serde_json::Value {
        let id = client_request_id();
        match self {
            ErrorDialect::OpenAi => err.to_openai_json(id.as_deref()),
            ErrorDialect::Anthropic => serde_json::to_value(anthropic::StreamEvent::error(err))
                .unwrap_or_else(|_| err.to_openai_json(id.as_deref())),
        }
    }
}

/// What an error response was made from, and in which dialect.
#[derive(Debug, Clone)]
pub(super) struct Rendered {
    pub error: Error,
    pub dialect: ErrorDialect,
}

/// The error response for `err` in `dialect`: the code's status, the JSON
/// body, `Retry-After` when the error says when to come back, and the
/// error itself as a [`Rendered`] extension for [`speak`].
pub(super) fn render(err: &Error, dialect: ErrorDialect) -> Response {
    let status =
        StatusCode::from_u16(err.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, axum::Json(dialect.body(err))).into_response();
    if let Some(after) = err.retry_after {
        // Whole seconds, rounded up: "0" would invite an immediate retry.
        let seconds = after.as_secs() + u64::from(after.subsec_nanos() > 0);
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    }
    response.extensions_mut().insert(Rendered {
        error: err.clone(),
        dialect,
    });
    response
}

/// The most of a plain-text rejection that becomes the error's message.
const REJECTION_TEXT_BYTES: usize = 4096;

/// The outermost error layer of a router with no other front door (the
/// metrics listener): renders every error response in the dialect of the
/// request's route.
pub(super) async fn speak(request: Request, next: Next) -> Response {
    let speaker = Speaker::of(&request);
    speaker.answer(next.run(request).await).await
}

/// What rendering an error in a request's dialect needs to know of the
/// request, read before the request is handed on.
pub(super) struct Speaker {
    dialect: ErrorDialect,
    method: Method,
    uri: Uri,
}

impl Speaker {
    pub(super) fn of(request: &Request) -> Self {
        Self {
            dialect: ErrorDialect::of_path(request.uri().path()),
            method: request.method().clone(),
            // Cheap: a URI's parts are shared buffers.
            uri: request.uri().clone(),
        }
    }

    /// `response`, an error in it rendered in the request's dialect.
    pub(super) async fn answer(self, response: Response) -> Response {
        let Speaker {
            dialect,
            method,
            uri,
        } = self;
        let path = uri.path();
        if let Some(rendered) = response.extensions().get::<Rendered>() {
            if rendered.dialect == dialect {
                return response;
            }
            let error = rendered.error.clone();
            return again(response, &error, dialect);
        }
        let failed = response.status().is_client_error() || response.status().is_server_error();
        if !failed || is_json(&response) {
            // A success, or an answer made on purpose (readiness's 503).
            return response;
        }
        // A failure without an Error or JSON: the framework's own answer.
        let (parts, body) = response.into_parts();
        let text = to_bytes(body, REJECTION_TEXT_BYTES)
            .await
            .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_owned())
            .unwrap_or_default();
        let error = match parts.status {
            StatusCode::NOT_FOUND => {
                Error::new(ErrorCode::NotFound, format!("no route {}", excerpt(path)))
            }
            // The router adds `Allow` on the way out.
            StatusCode::METHOD_NOT_ALLOWED => Error::new(
                ErrorCode::MethodNotAllowed,
                format!(
                    "{} does not take {method} (`Allow` lists the methods it takes)",
                    excerpt(path)
                ),
            ),
            StatusCode::PAYLOAD_TOO_LARGE => Error::new(ErrorCode::PayloadTooLarge, text),
            status if status.is_client_error() => Error::invalid_request(if text.is_empty() {
                status.to_string()
            } else {
                text
            }),
            status => Error::internal(if text.is_empty() {
                status.to_string()
            } else {
                text
            }),
        };
        again(Response::from_parts(parts, Body::empty()), &error, dialect)
    }
}

fn is_json(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/json"))
}

/// `response` with its body (and status) rendered from `err` in `dialect`;
/// its other headers (`WWW-Authenticate`, `Allow`, `Connection`, CORS)
/// stay.
fn again(response: Response, err: &Error, dialect: ErrorDialect) -> Response {
    let (mut parts, _) = response.into_parts();
    let fresh = render(err, dialect);
    let (fresh_parts, body) = fresh.into_parts();
    parts.status = fresh_parts.status;
    parts.headers.remove(header::CONTENT_LENGTH);
    for (name, value) in &fresh_parts.headers {
        parts.headers.insert(name, value.clone());
    }
    parts.extensions = fresh_parts.extensions;
    Response::from_parts(parts, body)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    async fn text(response: Response) -> String {
        let bytes = to_bytes(response.into_body(), usize::MAX).await.unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[test]
    fn only_the_messages_route_speaks_anthropic() {
        for (path, dialect) in [
            ("/v1/messages", ErrorDialect::Anthropic),
            ("/v1/messages/", ErrorDialect::Anthropic),
            ("/v1/messages/count_tokens", ErrorDialect::Anthropic),
            ("/v1/messagesx", ErrorDialect::OpenAi),
            ("/v1/chat/completions", ErrorDialect::OpenAi),
            ("/generate", ErrorDialect::OpenAi),
            ("/workers", ErrorDialect::OpenAi),
            ("/nope", ErrorDialect::OpenAi),
        ] {
            assert_eq!(ErrorDialect::of_path(path), dialect, "{path}");
        }
    }

    #[tokio::test]
    async fn one_error_in_both_dialects() {
        let err = Error::new(ErrorCode::QueueFull, "busy")
            .with_retry_after(std::time::Duration::from_millis(1500));
        let openai = render(&err, ErrorDialect::OpenAi);
        assert_eq!(openai.status(), 429);
        assert_eq!(openai.headers()[header::RETRY_AFTER], "2");
        assert_eq!(
            text(openai).await,
            r#"{"error":{"message":"busy","type":"service_unavailable_error","param":null,"code":"queue_full"}}"#
        );
        let anthropic = render(&err, ErrorDialect::Anthropic);
        assert_eq!(anthropic.status(), 429);
        assert_eq!(anthropic.headers()[header::RETRY_AFTER], "2");
        assert_eq!(
            text(anthropic).await,
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"busy"}}"#
        );
    }
}
