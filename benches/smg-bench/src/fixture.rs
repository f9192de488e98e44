//! A scripted OpenAI-compatible server with known timings and injected
//! faults: the reference smg-bench's self-tests measure against, and the
//! zero-delay endpoint its client-ceiling benchmark saturates.
//!
//! It serves `/v1/chat/completions`, `/v1/completions` and `/generate`
//! (streaming or not), `/v1/models` and a Prometheus-style `/metrics`. A
//! stream sends a role-only chunk at once (as vLLM and SGLang do; it must not
//! count as the first token), then token `k` (0-based) at exactly
//! `ttft + k * itl` after the request arrived (absolute deadlines, so timer
//! error does not accumulate), an optional usage chunk and `data: [DONE]`.
//! A non-streaming answer comes after `ttft + (tokens - 1) * itl`. Faults
//! apply to every n-th request (1-based arrival order).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Prompt tokens the fixture reports in `usage`.
pub const FIXTURE_PROMPT_TOKENS: u32 = 10;
pub const FIXTURE_MODEL: &str = "fixture-model";

#[derive(Debug, Clone, Default)]
pub struct FixtureConfig {
    pub ttft: Duration,
    pub itl: Duration,
    /// Generated tokens per request (at least 1).
    pub tokens: u32,
    /// Omit `usage` / `meta_info` token counts (clients must count).
    pub no_usage: bool,
    /// Every n-th request answers `error_status` with an OpenAI error body.
    pub error_every: u64,
    pub error_status: u16,
    /// Every n-th stream carries a payload that is not JSON after token 1.
    pub malformed_every: u64,
    /// Every n-th stream ends without `data: [DONE]`.
    pub truncate_every: u64,
    /// Request number `stall_request` waits `stall` before it starts.
    pub stall_request: u64,
    pub stall: Duration,
    /// Close a keep-alive connection that stays idle this long.
    pub idle_close: Option<Duration>,
    /// `/readiness` answers 503 this many times before it answers 200 (a
    /// gateway still reaching its workers).
    pub unready_probes: u64,
}

/// A running fixture; stops when dropped.
#[derive(Debug)]
pub struct FixtureServer {
    pub addr: SocketAddr,
    scheme: &'static str,
    requests: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl FixtureServer {
    /// Binds 127.0.0.1 on a free port and serves on the current runtime.
    pub async fn start(config: FixtureConfig) -> std::io::Result<Self> {
        Self::start_with(config, None).await
    }

    /// The same over TLS (`https`) with `tls`'s certificate.
    pub async fn start_tls(
        config: FixtureConfig,
        tls: Arc<rustls::ServerConfig>,
    ) -> std::io::Result<Self> {
        Self::start_with(config, Some(tokio_rustls::TlsAcceptor::from(tls))).await
    }

    async fn start_with(
        config: FixtureConfig,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> std::io::Result<Self> {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let requests = Arc::new(AtomicU64::new(0));
        let shared = Arc::new(Shared {
            config,
            requests: requests.clone(),
            probes: AtomicU64::new(0),
        });
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let shared = shared.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let idle_close = shared.config.idle_close;
                    let service = service_fn(move |req| handle(shared.clone(), req));
                    let mut builder = hyper::server::conn::http1::Builder::new();
                    if let Some(idle) = idle_close {
                        builder.timer(TokioTimer::new()).header_read_timeout(idle);
                    }
                    match tls {
                        None => {
                            let _ = builder
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        }
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(stream).await {
                                let _ = builder
                                    .serve_connection(TokioIo::new(stream), service)
                                    .await;
                            }
                        }
                    }
                });
            }
        });
        Ok(FixtureServer {
            addr,
            scheme,
            requests,
            task,
        })
    }

    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// Completion requests received so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

impl Drop for FixtureServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Shared {
    config: FixtureConfig,
    requests: Arc<AtomicU64>,
    /// `/readiness` requests so far.
    probes: AtomicU64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completions,
    Generate,
}

/// A full body or a channel-fed stream.
#[derive(Debug)]
pub enum FixtureBody {
    Full(Option<Bytes>),
    Channel(mpsc::Receiver<Bytes>),
}

impl Body for FixtureBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            FixtureBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            FixtureBody::Channel(rx) => rx.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b)))),
        }
    }
}

fn respond(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<FixtureBody> {
    let mut response = Response::new(FixtureBody::Full(Some(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    response
}

async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<FixtureBody>, Infallible> {
    let arrived = Instant::now();
    let kind = match req.uri().path() {
        "/v1/chat/completions" => Kind::Chat,
        "/v1/completions" => Kind::Completions,
        "/generate" => Kind::Generate,
        "/v1/models" => {
            let body = format!(
                r#"{{"object":"list","data":[{{"id":"{FIXTURE_MODEL}","object":"model"}}]}}"#
            );
            return Ok(respond(StatusCode::OK, "application/json", body.into()));
        }
        "/readiness" => {
            let probe = shared.probes.fetch_add(1, Ordering::Relaxed);
            let (status, body) = if probe < shared.config.unready_probes {
                (StatusCode::SERVICE_UNAVAILABLE, r#"{"status":"starting"}"#)
            } else {
                (StatusCode::OK, r#"{"status":"ready"}"#)
            };
            return Ok(respond(status, "application/json", body.into()));
        }
        "/metrics" => {
            let body = format!(
                "# TYPE fixture_requests_total counter\nfixture_requests_total {}\n",
                shared.requests.load(Ordering::Relaxed)
            );
            return Ok(respond(StatusCode::OK, "text/plain", body.into()));
        }
        _ => return Ok(respond(StatusCode::NOT_FOUND, "text/plain", Bytes::new())),
    };
    let body = req
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let n = shared.requests.fetch_add(1, Ordering::Relaxed) + 1;
    let config = &shared.config;
    let every = |k: u64| k > 0 && n.is_multiple_of(k);
    if every(config.error_every) {
        let status =
            StatusCode::from_u16(config.error_status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        let body = r#"{"error":{"message":"injected failure","type":"server_error","param":null,"code":"overloaded"}}"#;
        return Ok(respond(
            status,
            "application/json",
            Bytes::from_static(body.as_bytes()),
        ));
    }
    let start = if n == config.stall_request && !config.stall.is_zero() {
        tokio::time::sleep(config.stall).await;
        Instant::now()
    } else {
        arrived
    };
    let stream = memchr::memmem::find(&body, b"\"stream\":true").is_some();
    let tokens = config.tokens.max(1);
    if !stream {
        let done_at = start + config.ttft + config.itl * (tokens - 1);
        if done_at > Instant::now() {
            tokio::time::sleep_until(done_at).await;
        }
        let text = "tok ".repeat(tokens as usize);
        return Ok(respond(
            StatusCode::OK,
            "application/json",
            whole_body(kind, &text, tokens, config.no_usage),
        ));
    }
    let (tx, rx) = mpsc::channel(16);
    let config = config.clone();
    tokio::spawn(async move {
        if kind == Kind::Chat {
            let role = r#"{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#;
            let _ = tx.send(sse(role)).await;
        }
        for k in 0..tokens {
            tokio::time::sleep_until(start + config.ttft + config.itl * k).await;
            let chunk = match kind {
                Kind::Chat => r#"{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok "}}]}"#.to_string(),
                Kind::Completions => r#"{"object":"text_completion","choices":[{"index":0,"text":"tok "}]}"#.to_string(),
                Kind::Generate => generate_json(&"tok ".repeat(k as usize + 1), k + 1, config.no_usage),
            };
            if tx.send(sse(&chunk)).await.is_err() {
                return;
            }
            if k == 0 && config.malformed_every > 0 && n.is_multiple_of(config.malformed_every) {
                let _ = tx.send(sse("{\"choices\": [ this is not json")).await;
            }
        }
        if kind != Kind::Generate && !config.no_usage {
            let usage = format!(
                r#"{{"choices":[],"usage":{{"prompt_tokens":{FIXTURE_PROMPT_TOKENS},"completion_tokens":{tokens},"total_tokens":{}}}}}"#,
                FIXTURE_PROMPT_TOKENS + tokens
            );
            let _ = tx.send(sse(&usage)).await;
        }
        if !(config.truncate_every > 0 && n.is_multiple_of(config.truncate_every)) {
            let _ = tx.send(sse("[DONE]")).await;
        }
    });
    let mut response = Response::new(FixtureBody::Channel(rx));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    Ok(response)
}

fn sse(data: &str) -> Bytes {
    Bytes::from(format!("data: {data}\n\n"))
}

fn generate_json(text: &str, completion_tokens: u32, no_usage: bool) -> String {
    if no_usage {
        format!(r#"{{"text":"{text}","meta_info":{{"id":"f"}}}}"#)
    } else {
        format!(
            r#"{{"text":"{text}","meta_info":{{"id":"f","prompt_tokens":{FIXTURE_PROMPT_TOKENS},"completion_tokens":{completion_tokens}}}}}"#
        )
    }
}

fn whole_body(kind: Kind, text: &str, tokens: u32, no_usage: bool) -> Bytes {
    let usage = if no_usage {
        String::new()
    } else {
        format!(
            r#","usage":{{"prompt_tokens":{FIXTURE_PROMPT_TOKENS},"completion_tokens":{tokens},"total_tokens":{}}}"#,
            FIXTURE_PROMPT_TOKENS + tokens
        )
    };
    let body = match kind {
        Kind::Chat => format!(
            r#"{{"id":"f","object":"chat.completion","model":"{FIXTURE_MODEL}","choices":[{{"index":0,"message":{{"role":"assistant","content":"{text}"}},"finish_reason":"length"}}]{usage}}}"#
        ),
        Kind::Completions => format!(
            r#"{{"id":"f","object":"text_completion","model":"{FIXTURE_MODEL}","choices":[{{"index":0,"text":"{text}","finish_reason":"length"}}]{usage}}}"#
        ),
        Kind::Generate => generate_json(text, tokens, no_usage),
    };
    Bytes::from(body)
}
