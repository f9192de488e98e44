//! Bounds on what one request may send: its head (`--max-header-size`,
//! 431 `headers_too_large`) and its body (`--max-payload-size`, 413
//! `payload_too_large`), refused with the API's usual JSON errors.
//!
//! Why it exists: the HTTP framework's own body limit was 2 MB and answered
//! in plain text, so a photo sent as a `data:` URL failed with a body no
//! client could parse. The body is read here, after authentication (a
//! stranger cannot make the gateway buffer anything), into one buffer
//! sized from `Content-Length`; handlers get it whole. A body found too
//! large is read on (and discarded) for up to [`DRAIN_BYTES`] or
//! [`DRAIN_TIME`] before the answer, so a client still sending gets its 413
//! instead of a connection reset.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::response::Response;
use http::{HeaderMap, HeaderValue, header};
use http_body_util::BodyExt;

use super::http::refusal;
use crate::error::{Error, ErrorCode, bytes_text};

/// The most a refused body is read on before its answer.
const DRAIN_BYTES: usize = 16 << 20;
/// The longest a refused body is read on before its answer.
const DRAIN_TIME: Duration = Duration::from_secs(1);

/// `--max-header-size`, in bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct HeadLimit(pub usize);

/// `--max-payload-size`, in bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct BodyLimit(pub usize);

/// The size of a request's head as sent in HTTP/1.1: request line, then
/// `name: value\r\n` per header, then the blank line.
pub(super) fn head_size(method: &http::Method, uri: &http::Uri, headers: &HeaderMap) -> usize {
    const LINE_FRAMING: usize = " HTTP/1.1\r\n".len() + 1 + "\r\n".len();
    let target = uri
        .path_and_query()
        .map_or(1, |target| target.as_str().len());
    let fields: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + ": ".len() + value.len() + "\r\n".len())
        .sum();
    method.as_str().len() + target + LINE_FRAMING + fields
}

impl HeadLimit {
    /// The refusal of a request whose head is over the limit.
    pub(super) fn refusal(self, request: &Request) -> Option<Response> {
        let HeadLimit(max) = self;
        let size = head_size(request.method(), request.uri(), request.headers());
        if size <= max {
            return None;
        }
        let mut response = refusal(&Error::new(
            ErrorCode::HeadersTooLarge,
            format!(
                "the request line and headers take {size} bytes, over --max-header-size ({})",
                bytes_text(max as u64)
            ),
        ));
        close_after(&mut response);
        Some(response)
    }
}

impl BodyLimit {
    /// `request` with its body read whole, or its refusal past the limit.
    pub(super) async fn read(self, request: Request) -> Result<Request, Response> {
        let BodyLimit(max) = self;
        let (parts, body) = request.into_parts();
        let declared = declared_length(&parts.headers);
        if let Some(declared) = declared.filter(|&declared| declared > max) {
            let drained = discard(body).await;
            return Err(too_large(max, Some(declared), drained));
        }
        match read_body(body, max, declared).await {
            Ok(bytes) => Ok(Request::from_parts(parts, Body::from(bytes))),
            Err(Unread::TooLarge(rest)) => {
                let drained = discard(rest).await;
                Err(too_large(max, None, drained))
            }
            Err(Unread::Broken(err)) => Err(refusal(&Error::invalid_request(format!(
                "the request body could not be read: {err}"
            )))),
        }
    }
}

/// Why a body was not read.
enum Unread {
    /// Over the limit; the rest of the body is still unread.
    TooLarge(Body),
    /// The client's stream broke.
    Broken(axum::Error),
}

/// `Content-Length`, when present and a number.
fn declared_length(headers: &HeaderMap) -> Option<usize> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The body's bytes, or why not; at most `max` of them are ever held.
async fn read_body(mut body: Body, max: usize, declared: Option<usize>) -> Result<Bytes, Unread> {
    let mut buffer = Vec::with_capacity(declared.unwrap_or(0).min(max));
    let mut first: Option<Bytes> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(Unread::Broken)?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        if first.as_ref().map_or(buffer.len(), Bytes::len) + data.len() > max {
            return Err(Unread::TooLarge(body));
        }
        // One frame (the usual HTTP/1.1 case for small bodies) needs no copy.
        if first.is_none() && buffer.is_empty() {
            first = Some(data);
            continue;
        }
        if let Some(first) = first.take() {
            buffer.extend_from_slice(&first);
        }
        buffer.extend_from_slice(&data);
    }
    Ok(first.unwrap_or_else(|| Bytes::from(buffer)))
}

/// Reads and discards what remains of `body`, within [`DRAIN_BYTES`] and
/// [`DRAIN_TIME`]. Returns whether the body was read to its end.
pub(super) async fn discard(mut body: Body) -> bool {
    let reading = async {
        let mut seen = 0usize;
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else {
                return false;
            };
            seen += frame.data_ref().map_or(0, Bytes::len);
            if seen > DRAIN_BYTES {
                return false;
            }
        }
        true
    };
    tokio::time::timeout(DRAIN_TIME, reading)
        .await
        .unwrap_or(false)
}

fn too_large(max: usize, declared: Option<usize>, drained: bool) -> Response {
    let limit = bytes_text(max as u64);
    let message = match declared {
        Some(size) => {
            format!("the request body takes {size} bytes, over --max-payload-size ({limit})")
        }
        None => format!("the request body exceeds --max-payload-size ({limit})"),
    };
    let mut response = refusal(&Error::new(ErrorCode::PayloadTooLarge, message));
    if !drained {
        close_after(&mut response);
    }
    response
}

/// Marks the connection for closing after this response (HTTP/1.1; HTTP/2
/// drops the header).
fn close_after(response: &mut Response) {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_size_counts_the_bytes_http1_sends() {
        let request = http::Request::post("/v1/chat/completions?x=1")
            .header("authorization", "Bearer k")
            .header("x-a", "")
            .body(())
            .expect("request");
        let wire =
            "POST /v1/chat/completions?x=1 HTTP/1.1\r\nauthorization: Bearer k\r\nx-a: \r\n\r\n";
        assert_eq!(
            head_size(request.method(), request.uri(), request.headers()),
            wire.len()
        );
    }

    #[tokio::test]
    async fn a_body_is_read_whole_up_to_the_limit_and_refused_past_it() {
        let chunks = |sizes: &[usize]| {
            let frames: Vec<Result<Bytes, std::io::Error>> = sizes
                .iter()
                .map(|&n| Ok(Bytes::from(vec![7u8; n])))
                .collect();
            Body::from_stream(futures::stream::iter(frames))
        };
        let whole = read_body(chunks(&[3, 4, 3]), 10, None).await;
        assert!(matches!(whole, Ok(ref bytes) if bytes.len() == 10));
        let one = read_body(chunks(&[10]), 10, Some(10)).await;
        assert!(matches!(one, Ok(ref bytes) if bytes.len() == 10));
        let over = read_body(chunks(&[6, 5, 100]), 10, None).await;
        let Err(Unread::TooLarge(rest)) = over else {
            panic!("an 11th byte is over a limit of 10");
        };
        assert!(discard(rest).await, "the rest of a small body is drained");
    }

    #[test]
    fn content_length_is_read_when_it_is_a_number() {
        let mut headers = HeaderMap::new();
        assert_eq!(declared_length(&headers), None);
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("42"));
        assert_eq!(declared_length(&headers), Some(42));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("lots"));
        assert_eq!(declared_length(&headers), None);
    }
}
