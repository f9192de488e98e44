//! The HTTP under rmcp's streamable-HTTP transport: the gateway's own
//! reqwest client, so an MCP connection goes only where the SSRF guard lets
//! it and no answer is read past a byte cap.
//!
//! The client is built like the image fetcher's (`media::remote`): no proxy
//! (the guard would vet only the proxy), no redirects (a redirect could
//! lead anywhere; MCP endpoints have no business redirecting), and the
//! [`VettingResolver`], which hands the client only vetted addresses. Hosts
//! written as IP literals never reach a resolver, so every exchange vets
//! them first. No `Accept-Encoding` is sent, so the caps count what
//! arrives.
//!
//! [`GuardedHttp`] implements rmcp's `StreamableHttpClient`: POST a
//! JSON-RPC message and take the answer as JSON or as an SSE stream, GET the
//! server's SSE stream, DELETE the session. Each answer (a JSON body, or one
//! SSE stream in total) is cut off at `max_answer_bytes` with
//! [`HttpFailure::TooLarge`]. Failures travel back through rmcp as
//! `StreamableHttpError::Client(HttpFailure)` (or inside an SSE error),
//! where the session finds them again to pick an error code.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::stream::{BoxStream, Stream, StreamExt};
use http::{HeaderName, HeaderValue, StatusCode};
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::{Client, RequestBuilder, Response, Url};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::common::http_header::{
    EVENT_STREAM_MIME_TYPE, HEADER_LAST_EVENT_ID, HEADER_SESSION_ID, JSON_MIME_TYPE,
};
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use sse_stream::{Sse, SseStream};

use crate::media::guard::{
    DestinationPolicy, ForbiddenDestination, SendFailure, VettingResolver, literal_address,
};
use crate::media::remote::{error_chain, redacted};

/// Why one HTTP exchange with an MCP server failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpFailure {
    /// The SSRF guard refused the destination, or the URL is not http(s).
    #[error("{0}")]
    Forbidden(String),
    /// The server answered 401 or 403.
    #[error("{0}")]
    Unauthorized(String),
    /// Connecting or reading timed out inside the HTTP client.
    #[error("{0}")]
    Timeout(String),
    /// An answer (a JSON body or an SSE stream) passed the byte cap.
    #[error("the MCP server's answer is larger than {limit} bytes")]
    TooLarge { limit: usize },
    /// Unreachable, a broken connection, an HTTP error status, an answer
    /// that is not MCP.
    #[error("{0}")]
    Failed(String),
}

type HttpResult<T> = Result<T, StreamableHttpError<HttpFailure>>;

/// The last [`HttpFailure`] of one session's transport. rmcp hands most
/// failures back inside its errors, but a failure that ends an SSE answer
/// (the byte cap) ends its transport, and the call then sees only "transport
/// closed"; the session reads the cause here.
#[derive(Debug, Clone, Default)]
pub struct FailureSlot(Arc<Mutex<Option<HttpFailure>>>);

impl FailureSlot {
    fn record(&self, failure: &HttpFailure) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(failure.clone());
        }
    }

    /// The last failure recorded, emptying the slot.
    pub fn take(&self) -> Option<HttpFailure> {
        self.0.lock().ok().and_then(|mut slot| slot.take())
    }
}

/// Records the failure in `result` (if it is one of ours) in `slot`.
fn noted<T>(slot: &FailureSlot, result: HttpResult<T>) -> HttpResult<T> {
    if let Err(StreamableHttpError::Client(failure)) = &result {
        slot.record(failure);
    }
    result
}

/// The guarded HTTP client the MCP transport runs on; cheap to clone (one
/// connection pool per gateway), with a [`FailureSlot`] per session
/// ([`GuardedHttp::for_session`]).
#[derive(Debug, Clone)]
pub struct GuardedHttp {
    client: Client,
    policy: Arc<DestinationPolicy>,
    max_answer_bytes: usize,
    failures: FailureSlot,
}

impl GuardedHttp {
    pub fn new(
        policy: Arc<DestinationPolicy>,
        connect_timeout: Duration,
        max_answer_bytes: usize,
    ) -> reqwest::Result<Self> {
        let client = Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(Arc::new(VettingResolver::new(Arc::clone(&policy))))
            .user_agent(concat!("smg/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(connect_timeout)
            .tcp_nodelay(true)
            .build()?;
        Ok(Self {
            client,
            policy,
            max_answer_bytes,
            failures: FailureSlot::default(),
        })
    }

    /// The same client (and connection pool) with a failure slot of its
    /// own, for one session's transport.
    pub fn for_session(&self) -> (GuardedHttp, FailureSlot) {
        let failures = FailureSlot::default();
        let http = GuardedHttp {
            failures: failures.clone(),
            ..self.clone()
        };
        (http, failures)
    }

    /// The checks before any connection: an http(s) URL with a host and,
    /// for an IP-literal host (which no resolver sees), the guard.
    pub fn vet(&self, parsed: &Url) -> Result<(), HttpFailure> {
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(HttpFailure::Forbidden(format!(
                "{}: MCP servers are reached over http(s) only",
                redacted(parsed)
            )));
        }
        let host = parsed
            .host_str()
            .filter(|host| !host.is_empty())
            .ok_or_else(|| HttpFailure::Forbidden(format!("{}: no host", redacted(parsed))))?;
        if let Some(address) = literal_address(host) {
            self.policy
                .check(&address.to_string(), address)
                .map_err(|refusal| forbidden(parsed, &refusal))?;
        }
        Ok(())
    }

    /// A request to `uri` with the transport's headers, after vetting it.
    fn request(
        &self,
        method: reqwest::Method,
        uri: &str,
        session_id: Option<&str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(Url, RequestBuilder), HttpFailure> {
        // The transport only ever asks for the URL the session was opened
        // with, vetted then; vetted again per request all the same.
        let url = Url::parse(uri)
            .map_err(|error| HttpFailure::Failed(format!("the MCP URL does not parse: {error}")))?;
        self.vet(&url)?;
        let mut request = self.client.request(method, url.clone());
        for (name, value) in custom_headers {
            request = request.header(name, value);
        }
        if let Some(token) = auth_header {
            request = request.bearer_auth(token);
        }
        if let Some(session_id) = session_id {
            request = request.header(HEADER_SESSION_ID, session_id);
        }
        Ok((url, request))
    }

    async fn send(&self, url: &Url, request: RequestBuilder) -> Result<Response, HttpFailure> {
        request
            .send()
            .await
            .map_err(|error| describe_send_error(&error, url))
    }

    async fn post(
        &self,
        uri: &str,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> HttpResult<StreamableHttpPostResponse> {
        let body = serde_json::to_vec(&message)?;
        let (url, request) = self
            .request(
                reqwest::Method::POST,
                uri,
                session_id.as_deref(),
                auth_header,
                custom_headers,
            )
            .map_err(StreamableHttpError::Client)?;
        let request = request
            .header(ACCEPT, ANSWER_TYPES)
            .header(CONTENT_TYPE, JSON_MIME_TYPE)
            .body(body);
        let response = self
            .send(&url, request)
            .await
            .map_err(StreamableHttpError::Client)?;
        let status = response.status();
        if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if status == StatusCode::NOT_FOUND && session_id.is_some() {
            return Err(StreamableHttpError::SessionExpired);
        }
        let answer_type = media_type(&response);
        let new_session = response
            .headers()
            .get(HEADER_SESSION_ID)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        if !status.is_success() {
            return match self.refusal(&url, response, answer_type).await {
                Ok(error) => Ok(StreamableHttpPostResponse::Json(error, new_session)),
                Err(failure) => Err(StreamableHttpError::Client(failure)),
            };
        }
        let expects_answer = matches!(message, ClientJsonRpcMessage::Request(_));
        match answer_type.as_deref() {
            Some(EVENT_STREAM_MIME_TYPE) => Ok(StreamableHttpPostResponse::Sse(
                self.sse(response),
                new_session,
            )),
            Some(JSON_MIME_TYPE) => {
                let body = self
                    .read_capped(&url, response)
                    .await
                    .map_err(StreamableHttpError::Client)?;
                if body.is_empty() && !expects_answer {
                    return Ok(StreamableHttpPostResponse::Accepted);
                }
                let answer: ServerJsonRpcMessage = serde_json::from_slice(&body)?;
                Ok(StreamableHttpPostResponse::Json(answer, new_session))
            }
            // Some servers answer a notification with an empty 200.
            _ if !expects_answer && response.content_length() == Some(0) => {
                Ok(StreamableHttpPostResponse::Accepted)
            }
            other => Err(StreamableHttpError::UnexpectedContentType(
                other.map(str::to_owned),
            )),
        }
    }

    /// What a non-2xx answer means: `Ok` with the JSON-RPC error the
    /// server sent along (rmcp reports it as the server's error), else the
    /// status as the failure.
    async fn refusal(
        &self,
        url: &Url,
        response: Response,
        answer_type: Option<String>,
    ) -> Result<ServerJsonRpcMessage, HttpFailure> {
        let status = response.status();
        if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
            return Err(HttpFailure::Unauthorized(format!(
                "{} answered {status}",
                redacted(url)
            )));
        }
        if answer_type.as_deref() == Some(JSON_MIME_TYPE)
            && let Ok(body) = self.read_capped(url, response).await
            && let Ok(error @ ServerJsonRpcMessage::Error(_)) =
                serde_json::from_slice::<ServerJsonRpcMessage>(&body)
        {
            return Ok(error);
        }
        Err(HttpFailure::Failed(format!(
            "{} answered {status}",
            redacted(url)
        )))
    }

    /// Reads a JSON body, refusing it past the cap (a declared length is
    /// refused before reading).
    async fn read_capped(&self, url: &Url, mut response: Response) -> Result<Bytes, HttpFailure> {
        let limit = self.max_answer_bytes;
        let too_large = HttpFailure::TooLarge { limit };
        if response
            .content_length()
            .is_some_and(|len| len > u64::try_from(limit).unwrap_or(u64::MAX))
        {
            return Err(too_large);
        }
        let mut body = BytesMut::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|error| read_failure(&error, url))?
        {
            if body.len() + chunk.len() > limit {
                return Err(too_large);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body.freeze())
    }

    /// The answer's SSE events, the whole stream under the byte cap.
    fn sse(&self, response: Response) -> BoxStream<'static, Result<Sse, SseError>> {
        // `Response::chunk` read in a loop (reqwest's `bytes_stream` needs
        // its "stream" feature, which the gateway does not otherwise use).
        let chunks = futures::stream::unfold(Some(response), |response| async move {
            let mut response = response?;
            match response.chunk().await {
                Ok(Some(chunk)) => Some((Ok(chunk), Some(response))),
                Ok(None) => None,
                Err(error) => Some((Err(read_failure(&error, response.url())), None)),
            }
        });
        let failures = self.failures.clone();
        let bytes = capped(chunks, self.max_answer_bytes).inspect(move |chunk| {
            if let Err(failure) = chunk {
                failures.record(failure);
            }
        });
        SseStream::from_bytes_stream(bytes).boxed()
    }

    async fn open_stream(
        &self,
        uri: &str,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> HttpResult<BoxStream<'static, Result<Sse, SseError>>> {
        let (url, mut request) = self
            .request(
                reqwest::Method::GET,
                uri,
                session_id.as_deref(),
                auth_header,
                custom_headers,
            )
            .map_err(StreamableHttpError::Client)?;
        request = request.header(ACCEPT, EVENT_STREAM_MIME_TYPE);
        if let Some(last_event_id) = last_event_id {
            request = request.header(HEADER_LAST_EVENT_ID, last_event_id);
        }
        let response = self
            .send(&url, request)
            .await
            .map_err(StreamableHttpError::Client)?;
        let status = response.status();
        if status == StatusCode::METHOD_NOT_ALLOWED {
            return Err(StreamableHttpError::ServerDoesNotSupportSse);
        }
        if !status.is_success() {
            let answer_type = media_type(&response);
            let failure = match self.refusal(&url, response, answer_type).await {
                Ok(error) => HttpFailure::Failed(format!(
                    "{} refused its event stream: {error:?}",
                    redacted(&url)
                )),
                Err(failure) => failure,
            };
            return Err(StreamableHttpError::Client(failure));
        }
        match media_type(&response).as_deref() {
            Some(EVENT_STREAM_MIME_TYPE) => Ok(self.sse(response)),
            other => Err(StreamableHttpError::UnexpectedContentType(
                other.map(str::to_owned),
            )),
        }
    }
    async fn end_session(
        &self,
        uri: &str,
        session_id: &str,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> HttpResult<()> {
        let (url, request) = self
            .request(
                reqwest::Method::DELETE,
                uri,
                Some(session_id),
                auth_header,
                custom_headers,
            )
            .map_err(StreamableHttpError::Client)?;
        let response = self
            .send(&url, request)
            .await
            .map_err(StreamableHttpError::Client)?;
        let status = response.status();
        // 405: the server keeps no sessions to end.
        if status.is_success() || status == StatusCode::METHOD_NOT_ALLOWED {
            return Ok(());
        }
        Err(StreamableHttpError::Client(HttpFailure::Failed(format!(
            "{} answered {status} to ending the session",
            redacted(&url)
        ))))
    }
}

/// What a POST accepts back.
const ANSWER_TYPES: &str = "application/json, text/event-stream";

impl StreamableHttpClient for GuardedHttp {
    type Error = HttpFailure;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> HttpResult<StreamableHttpPostResponse> {
        let answer = self
            .post(&uri, message, session_id, auth_header, custom_headers)
            .await;
        noted(&self.failures, answer)
    }

    // rmcp passes its own limits to these two; ours (one cap per answer,
    // from the gateway's config) apply instead.
    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        _max_sse_event_size: usize,
    ) -> HttpResult<StreamableHttpPostResponse> {
        let answer = self
            .post(&uri, message, session_id, auth_header, custom_headers)
            .await;
        noted(&self.failures, answer)
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        _limits: StreamableHttpResponseLimits,
    ) -> HttpResult<StreamableHttpPostResponse> {
        let answer = self
            .post(&uri, message, session_id, auth_header, custom_headers)
            .await;
        noted(&self.failures, answer)
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> HttpResult<()> {
        let ended = self
            .end_session(&uri, &session_id, auth_header, custom_headers)
            .await;
        noted(&self.failures, ended)
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> HttpResult<BoxStream<'static, Result<Sse, SseError>>> {
        let stream = self
            .open_stream(&uri, session_id, last_event_id, auth_header, custom_headers)
            .await;
        noted(&self.failures, stream)
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        _max_sse_event_size: usize,
    ) -> HttpResult<BoxStream<'static, Result<Sse, SseError>>> {
        let stream = self
            .open_stream(&uri, session_id, last_event_id, auth_header, custom_headers)
            .await;
        noted(&self.failures, stream)
    }
}

/// The answer's media type without parameters, lowercase.
fn media_type(response: &Response) -> Option<String> {
    let value = response.headers().get(CONTENT_TYPE)?.to_str().ok()?;
    let essence = value.split(';').next().unwrap_or_default().trim();
    Some(essence.to_ascii_lowercase())
}

/// `stream`'s chunks until `limit` bytes have passed, then one
/// [`HttpFailure::TooLarge`] and the end; the first failure also ends it.
fn capped<S>(stream: S, limit: usize) -> impl Stream<Item = Result<Bytes, HttpFailure>>
where
    S: Stream<Item = Result<Bytes, HttpFailure>>,
{
    stream
        .scan((0usize, false), move |(seen, ended), chunk| {
            if *ended {
                return futures::future::ready(None);
            }
            let item = chunk.and_then(|chunk| {
                *seen = seen.saturating_add(chunk.len());
                if *seen > limit {
                    Err(HttpFailure::TooLarge { limit })
                } else {
                    Ok(chunk)
                }
            });
            *ended = item.is_err();
            futures::future::ready(Some(item))
        })
        .fuse()
}

/// The guard's refusal, or what failed (the error chain goes to the log).
fn describe_send_error(error: &reqwest::Error, url: &Url) -> HttpFailure {
    let what = match SendFailure::of(error) {
        SendFailure::Forbidden(refusal) => return forbidden(url, refusal),
        SendFailure::TimedOut => "timed out",
        SendFailure::Failed(what) => what,
    };
    tracing::warn!(url = %redacted(url), error = %error_chain(error), "an MCP request failed");
    let text = format!("{}: {what}", redacted(url));
    if error.is_timeout() {
        HttpFailure::Timeout(text)
    } else {
        HttpFailure::Failed(text)
    }
}

fn read_failure(error: &reqwest::Error, url: &Url) -> HttpFailure {
    tracing::warn!(url = %redacted(url), error = %error_chain(error), "an MCP answer broke off");
    let text = format!("{}: reading the answer failed", redacted(url));
    if error.is_timeout() {
        HttpFailure::Timeout(text)
    } else {
        HttpFailure::Failed(text)
    }
}

fn forbidden(url: &Url, refusal: &ForbiddenDestination) -> HttpFailure {
    HttpFailure::Forbidden(format!("{}: {refusal}", redacted(url)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(allow: &[&str]) -> GuardedHttp {
        let allowances = allow
            .iter()
            .map(|text| text.parse().expect("test allowances parse"))
            .collect();
        GuardedHttp::new(
            Arc::new(DestinationPolicy::new(allowances)),
            Duration::from_secs(1),
            1024,
        )
        .expect("client builds")
    }

    #[test]
    fn vetting_refuses_other_schemes_and_unallowed_literals() {
        let none = http(&[]);
        let loopback = http(&["127.0.0.1"]);
        // (client, url, allowed)
        let cases = [
            (&none, "https://mcp.example.com/mcp", true),
            (&none, "http://127.0.0.1:9/mcp", false),
            (&none, "http://[::1]:9/mcp", false),
            (&none, "http://169.254.169.254/latest", false),
            (&none, "http://[::ffff:a9fe:a9fe]/", false),
            (&none, "http://2852039166/", false),
            (&none, "file:///etc/passwd", false),
            (&none, "ftp://mcp.example.com/", false),
            (&loopback, "http://127.0.0.1:9/mcp", true),
            (&loopback, "http://127.0.0.2:9/mcp", false),
        ];
        for (client, url, allowed) in cases {
            let verdict = client.vet(&Url::parse(url).expect("test URLs parse"));
            assert_eq!(verdict.is_ok(), allowed, "{url}: {verdict:?}");
            if let Err(failure) = verdict {
                assert!(matches!(failure, HttpFailure::Forbidden(_)), "{url}");
            }
        }
    }

    #[tokio::test]
    async fn the_cap_counts_the_whole_stream_and_ends_it() {
        let chunks =
            ["abcd", "efgh", "ijkl", "mnop"].map(|text| Ok(Bytes::from_static(text.as_bytes())));
        let seen: Vec<_> = capped(futures::stream::iter(chunks), 10).collect().await;
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert_eq!(seen[1], Ok(Bytes::from_static(b"efgh")));
        assert_eq!(seen[2], Err(HttpFailure::TooLarge { limit: 10 }));
    }
}
