//! The hot path: HTTP/1.1 keep-alive connections driven with hyper's
//! low-level client, one connection per in-flight request.
//!
//! A request takes an idle connection (or opens one), sends a pre-built body
//! (a reference-counted `Bytes` clone), reads the answer and returns the
//! connection to the idle list once the body is fully read. Streams are
//! parsed frame by frame as they arrive, and each token-bearing event is
//! stamped on arrival. No pooling layer, no per-request URL parsing or
//! header-map building beyond the request's own few headers.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use http::{HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::cli::Endpoint;
use crate::error::{SetupError, SetupResult};
use crate::record::{ErrorClass, Outcome};
use crate::response::{Payload, error_code};
use crate::sse::SseParser;
use crate::workload::PreparedRequest;

/// Largest error body read to find its code.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// An `http(s)://host:port[/prefix]` URL, resolved once.
#[derive(Clone)]
pub struct BaseUrl {
    pub addr: SocketAddr,
    pub host: HeaderValue,
    /// Path prefix without a trailing slash (usually empty).
    pub prefix: String,
    /// For `https`: how to wrap each connection (set up once).
    tls: Option<TlsTarget>,
}

/// The TLS client side of an `https` base URL.
#[derive(Clone)]
struct TlsTarget {
    connector: tokio_rustls::TlsConnector,
    server_name: rustls::pki_types::ServerName<'static>,
}

impl std::fmt::Debug for BaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BaseUrl")
            .field("addr", &self.addr)
            .field("host", &self.host)
            .field("prefix", &self.prefix)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// A TLS client configuration trusting the public web PKI roots plus, if
/// given, the CA certificates in a PEM file (private fleets' CAs).
fn tls_config(ca_cert: Option<&Path>) -> SetupResult<rustls::ClientConfig> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = ca_cert {
        let bad = |why: String| {
            SetupError::InvalidArgument(format!("--ca-cert {}: {why}", path.display()))
        };
        let certificates = CertificateDer::pem_file_iter(path)
            .map_err(|e| bad(e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(e.to_string()))?;
        if certificates.is_empty() {
            return Err(bad("no certificate in the file".into()));
        }
        for certificate in certificates {
            roots.add(certificate).map_err(|e| bad(e.to_string()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| SetupError::InvalidArgument(format!("TLS set-up: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}

impl BaseUrl {
    pub async fn resolve(url: &str) -> SetupResult<Self> {
        Self::resolve_with(url, None).await
    }

    /// Resolves `url`; `https` URLs trust the web PKI and `ca_cert`'s CAs.
    pub async fn resolve_with(url: &str, ca_cert: Option<&Path>) -> SetupResult<Self> {
        let bad = |why: &str| SetupError::InvalidUrl(format!("`{url}`: {why}"));
        let uri: Uri = url.parse().map_err(|_| bad("not a URL"))?;
        let (default_port, https) = match uri.scheme_str() {
            Some("http") => (80, false),
            Some("https") => (443, true),
            _ => return Err(bad("expected http(s)://host:port")),
        };
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        let tls = if https {
            let server_name = rustls::pki_types::ServerName::try_from(authority.host().to_owned())
                .map_err(|_| bad("the host is not a valid TLS server name"))?;
            let connector = tokio_rustls::TlsConnector::from(Arc::new(tls_config(ca_cert)?));
            Some(TlsTarget {
                connector,
                server_name,
            })
        } else {
            None
        };
        let port = authority.port_u16().unwrap_or(default_port);
        let addr = tokio::net::lookup_host((authority.host(), port))
            .await
            .map_err(|e| bad(&format!("cannot resolve: {e}")))?
            .next()
            .ok_or_else(|| bad("the host resolves to no address"))?;
        let host = HeaderValue::from_str(authority.as_str()).map_err(|_| bad("bad host"))?;
        Ok(BaseUrl {
            addr,
            host,
            prefix: uri.path().trim_end_matches('/').to_string(),
            tls,
        })
    }

    /// `prefix + path`, without doubling a `/v1` the user put in the base URL.
    pub fn join(&self, path: &str) -> String {
        match (self.prefix.strip_suffix("/v1"), path.strip_prefix("/v1")) {
            (Some(prefix), Some(_)) => format!("{prefix}{path}"),
            _ => format!("{}{path}", self.prefix),
        }
    }
}

/// Opens one HTTP/1.1 connection to `base` (TCP_NODELAY, TLS for https)
/// and spawns its driver.
pub async fn connect(base: &BaseUrl) -> std::io::Result<SendRequest<Full<Bytes>>> {
    let stream = TcpStream::connect(base.addr).await?;
    stream.set_nodelay(true)?;
    match &base.tls {
        None => handshake(stream).await,
        Some(tls) => {
            let stream = tls
                .connector
                .connect(tls.server_name.clone(), stream)
                .await?;
            handshake(stream).await
        }
    }
}

async fn handshake<S>(stream: S) -> std::io::Result<SendRequest<Full<Bytes>>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(async move {
        // Ends when the sender is dropped or the peer closes; errors surface
        // on the request that was using the connection.
        let _ = connection.await;
    });
    Ok(sender)
}

/// Sends the run's requests to one endpoint.
#[derive(Debug)]
pub struct Client {
    base: BaseUrl,
    path: Uri,
    auth: Option<HeaderValue>,
    endpoint: Endpoint,
    stream: bool,
    keep_text: bool,
    timeout: Duration,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
}

/// How one attempt ended, before timing is filled in.
enum Ending {
    /// The response was read completely; the connection can be reused.
    Complete,
    /// The connection must not be reused.
    Broken,
}

impl Client {
    pub fn new(
        base: BaseUrl,
        endpoint: Endpoint,
        stream: bool,
        api_key: Option<&str>,
        keep_text: bool,
        timeout: Duration,
    ) -> SetupResult<Self> {
        let path: Uri = base
            .join(endpoint.path())
            .parse()
            .map_err(|_| SetupError::InvalidUrl(format!("bad path prefix `{}`", base.prefix)))?;
        let auth = api_key
            .map(|key| HeaderValue::from_str(&format!("Bearer {key}")))
            .transpose()
            .map_err(|_| SetupError::InvalidArgument("the API key is not a valid header".into()))?;
        Ok(Client {
            base,
            path,
            auth,
            endpoint,
            stream,
            keep_text,
            timeout,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Opens `count` connections ahead of the run so connection set-up is
    /// not measured (connections beyond these open on demand).
    pub async fn preconnect(&self, count: usize) -> SetupResult<()> {
        let mut opened = Vec::with_capacity(count);
        for _ in 0..count {
            let sender = connect(&self.base).await.map_err(|e| {
                SetupError::InvalidUrl(format!("cannot connect to {}: {e}", self.base.addr))
            })?;
            opened.push(sender);
        }
        self.lock_idle().extend(opened);
        Ok(())
    }

    fn lock_idle(&self) -> std::sync::MutexGuard<'_, Vec<SendRequest<Full<Bytes>>>> {
        // A panic while holding this lock cannot leave the list inconsistent.
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Open connections waiting for a request.
    pub fn idle_count(&self) -> usize {
        self.lock_idle().len()
    }

    fn take_idle(&self) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.lock_idle();
        while let Some(sender) = idle.pop() {
            if !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    /// Sends one request and records what happened into `outcome`
    /// (`scheduled_ns` must already be set). Never fails: failures are
    /// recorded with their class.
    pub async fn execute(&self, prepared: &PreparedRequest, epoch: Instant, outcome: &mut Outcome) {
        outcome.sent_ns = since(epoch);
        let result =
            tokio::time::timeout(self.timeout, self.attempt(prepared, epoch, outcome)).await;
        outcome.end_ns = since(epoch);
        if result.is_err() {
            outcome.error = Some(ErrorClass::Timeout);
            outcome.error_detail = Some(format!("no complete answer in {:?}", self.timeout));
        }
    }

    async fn attempt(&self, prepared: &PreparedRequest, epoch: Instant, outcome: &mut Outcome) {
        // An idle connection the server has just closed fails before the
        // request is written (`is_canceled`); only then is it retried, once,
        // on a fresh connection.
        let mut reused = true;
        let (sender, response) = loop {
            let idle = if reused { self.take_idle() } else { None };
            reused = idle.is_some();
            let mut sender = match idle {
                Some(sender) => sender,
                None => match connect(&self.base).await {
                    Ok(sender) => sender,
                    Err(e) => {
                        outcome.error = Some(ErrorClass::ConnectFailed);
                        outcome.error_detail = Some(e.to_string());
                        return;
                    }
                },
            };
            let sent = match sender.ready().await {
                Ok(()) => sender.send_request(self.request(prepared)).await,
                Err(e) => Err(e),
            };
            match sent {
                Ok(response) => break (sender, response),
                Err(e) if reused && e.is_canceled() => reused = false,
                Err(e) => {
                    outcome.error = Some(ErrorClass::Io);
                    outcome.error_detail = Some(e.to_string());
                    return;
                }
            }
        };
        let status = response.status();
        outcome.status = status.as_u16();
        let mut body = response.into_body();
        let ending = if !status.is_success() {
            read_error(&mut body, outcome).await
        } else if self.stream {
            self.read_stream(&mut body, epoch, outcome).await
        } else {
            self.read_whole(&mut body, outcome).await
        };
        if let Ending::Complete = ending {
            self.lock_idle().push(sender);
        }
    }

    fn request(&self, prepared: &PreparedRequest) -> Request<Full<Bytes>> {
        let mut request = Request::new(Full::new(prepared.body.clone()));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.path.clone();
        let headers = request.headers_mut();
        headers.insert(HOST, self.base.host.clone());
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(auth) = &self.auth {
            headers.insert(AUTHORIZATION, auth.clone());
        }
        request
    }

    async fn read_whole(&self, body: &mut hyper::body::Incoming, outcome: &mut Outcome) -> Ending {
        let bytes = match body.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) => {
                outcome.error = Some(ErrorClass::Io);
                outcome.error_detail = Some(e.to_string());
                return Ending::Broken;
            }
        };
        let Some(payload) = Payload::parse(&bytes) else {
            outcome.error = Some(ErrorClass::InvalidResponse);
            outcome.error_detail = Some(snippet(&bytes));
            return Ending::Complete;
        };
        if let Some(error) = &payload.error {
            outcome.error = Some(ErrorClass::InvalidResponse);
            outcome.error_detail = Some(error.to_string());
            return Ending::Complete;
        }
        let mut text = self.keep_text.then(String::new);
        let mut bytes_out = 0u64;
        let mut found = false;
        payload.for_each_choice_text(|t| {
            found = true;
            bytes_out += t.len() as u64;
            if let Some(text) = &mut text {
                text.push_str(t);
            }
        });
        if let (Endpoint::Generate, Some(t)) = (self.endpoint, &payload.text) {
            found = true;
            bytes_out += t.len() as u64;
            if let Some(text) = &mut text {
                text.push_str(t);
            }
        }
        if !found && payload.usage().is_none() {
            outcome.error = Some(ErrorClass::InvalidResponse);
            outcome.error_detail = Some(format!("no generated text in {}", snippet(&bytes)));
            return Ending::Complete;
        }
        outcome.output_bytes = bytes_out;
        outcome.output_text = text;
        if let Some(usage) = payload.usage() {
            outcome.server_prompt_tokens = usage.prompt_tokens;
            outcome.server_completion_tokens = usage.completion_tokens;
        }
        Ending::Complete
    }

    async fn read_stream(
        &self,
        body: &mut hyper::body::Incoming,
        epoch: Instant,
        outcome: &mut Outcome,
    ) -> Ending {
        let mut parser = SseParser::new();
        let mut state = StreamState {
            endpoint: self.endpoint,
            text: self.keep_text.then(String::new),
            generate_seen: 0,
            last_token_ns: None,
            done: false,
        };
        loop {
            match body.frame().await {
                None => break,
                Some(Err(e)) => {
                    outcome.error.get_or_insert(ErrorClass::Io);
                    outcome.error_detail.get_or_insert_with(|| e.to_string());
                    return Ending::Broken;
                }
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    let now = since(epoch);
                    parser.feed(&data, &mut |event| state.event(event, now, outcome));
                }
            }
        }
        let now = since(epoch);
        parser.finish(&mut |event| state.event(event, now, outcome));
        if !state.done && outcome.error.is_none() {
            outcome.error = Some(ErrorClass::IncompleteStream);
            outcome.error_detail = Some("the stream ended without data: [DONE]".into());
        }
        outcome.output_text = state.text;
        Ending::Complete
    }
}

/// Per-stream parsing state.
struct StreamState {
    endpoint: Endpoint,
    text: Option<String>,
    /// Generate streams resend the whole text: bytes seen so far.
    generate_seen: usize,
    last_token_ns: Option<u64>,
    done: bool,
}

impl StreamState {
    fn event(&mut self, data: &[u8], now: u64, outcome: &mut Outcome) {
        if data == b"[DONE]" {
            self.done = true;
            return;
        }
        let Some(payload) = Payload::parse(data) else {
            outcome.error.get_or_insert(ErrorClass::MalformedSse);
            outcome
                .error_detail
                .get_or_insert_with(|| format!("not JSON: {}", snippet(data)));
            return;
        };
        if let Some(error) = &payload.error {
            outcome.error.get_or_insert(ErrorClass::StreamError);
            outcome
                .error_detail
                .get_or_insert_with(|| error.to_string());
            return;
        }
        let mut new_bytes = 0usize;
        let text = &mut self.text;
        payload.for_each_choice_text(|t| {
            new_bytes += t.len();
            if let Some(text) = text {
                text.push_str(t);
            }
        });
        if let (Endpoint::Generate, Some(t)) = (self.endpoint, &payload.text) {
            // Cumulative: only what goes beyond the text seen so far is new.
            if t.len() > self.generate_seen {
                new_bytes += t.len() - self.generate_seen;
                self.generate_seen = t.len();
                if let Some(text) = &mut self.text {
                    text.clear();
                    text.push_str(t);
                }
            }
        }
        if let Some(usage) = payload.usage() {
            if usage.prompt_tokens.is_some() {
                outcome.server_prompt_tokens = usage.prompt_tokens;
            }
            if usage.completion_tokens.is_some() {
                outcome.server_completion_tokens = usage.completion_tokens;
            }
        }
        if new_bytes > 0 {
            outcome.output_bytes += new_bytes as u64;
            outcome.token_events += 1;
            match self.last_token_ns {
                None => outcome.first_token_ns = Some(now),
                Some(last) => outcome.itl_ns.push(now.saturating_sub(last)),
            }
            self.last_token_ns = Some(now);
        }
    }
}

async fn read_error(body: &mut hyper::body::Incoming, outcome: &mut Outcome) -> Ending {
    let mut buf = Vec::new();
    let mut ending = Ending::Complete;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Ok(data) = frame.into_data()
                    && buf.len() < MAX_ERROR_BODY
                {
                    buf.extend_from_slice(&data);
                }
            }
            Err(_) => {
                ending = Ending::Broken;
                break;
            }
        }
    }
    outcome.error = Some(ErrorClass::HttpStatus);
    outcome.error_detail = Some(match error_code(&buf) {
        Some(code) => format!("{}:{code}", outcome.status),
        None => outcome.status.to_string(),
    });
    ending
}

fn since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// The start of a payload, for error details.
fn snippet(bytes: &[u8]) -> String {
    let end = bytes.len().min(120);
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// GET `path` on `base` with a fresh connection: `(status, body)`.
pub async fn get(base: &BaseUrl, path: &str, timeout: Duration) -> Result<(u16, Bytes), String> {
    let fut = async {
        let mut sender = connect(base).await.map_err(|e| e.to_string())?;
        let mut request = Request::new(Full::new(Bytes::new()));
        *request.uri_mut() = path.parse().map_err(|_| format!("bad path {path}"))?;
        request.headers_mut().insert(HOST, base.host.clone());
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| format!("no answer in {timeout:?}"))?
}
