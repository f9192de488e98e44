//! The HTTP listener: accepts connections up to a cap, serves HTTP/1.1 and
//! HTTP/2 on each with hyper, and closes the ones that stall.
//!
//! Why it exists: `axum::serve` has no bound on open connections and no
//! clock on a connection, so one client holding thousands of sockets, or
//! trickling a request head one byte a second (slowloris), pins the
//! gateway's descriptors and memory for ever. Here:
//!
//! - At most `max_connections` are served at once. One more is answered
//!   `503 too_many_connections` with `Retry-After: 1`, written straight to
//!   the socket as HTTP/1.1 once its request line has named the route (the
//!   answer is in that route's error dialect; after a second without one,
//!   in OpenAI's; an HTTP/2 client sees a protocol error), and closed.
//!   Answering beats leaving it in the kernel's backlog: the client learns
//!   at once that it should back off.
//! - Each connection runs a [`ConnClock`] with two timers. The head timer
//!   runs from the accept, and from the first byte of each later request,
//!   until the request's head is complete; on expiry the socket is closed
//!   with no answer (nothing was parsed to answer). The connection reads
//!   what has arrived before its timer is looked at, so a head that came in
//!   time is served however late the gateway gets to it. The keep-alive timer
//!   runs while no request is in flight; on expiry the connection is shut
//!   down gracefully. HTTP/2 connections, told apart by their preface, get
//!   only the keep-alive timer once the preface is in: their frames
//!   interleave, so no byte marks a new request's start.
//! - Request heads are bounded twice: `api::limits` answers heads over
//!   `--max-header-size` with a JSON 431. An HTTP/1 head still going at
//!   twice that size, or with more header fields or a longer target than
//!   hyper reads, is stopped on its way to hyper by its [`HeadScan`] (hyper
//!   would answer it 431 or 414 without a body): the listener answers it
//!   itself, a JSON 431 in the dialect of the route its request line names,
//!   and closes the connection. (An HTTP/2 header list over twice the limit
//!   is refused by the h2 layer, 431 without a body: see the README.)
//! - Sockets get TCP_NODELAY, so the first token is never held back by
//!   Nagle.
//! - With TLS (`crate::tls`), each connection first completes its
//!   handshake, within the head timeout counted from the accept (a client
//!   that stalls its handshake is a slowloris too); the clock then watches
//!   the session's plaintext. A connection over the cap gets its 503
//!   inside a TLS session too, after a handshake bounded by a second (and,
//!   like every refusal, only while fewer than 256 refusals are running).
//! - On shutdown (`crate::shutdown`) the listener stops accepting and closes
//!   its socket, and every connection finishes its requests (streams
//!   included) and closes, until the cut drops those still open. `serve`
//!   returns once every connection has ended. Connections, and the tasks
//!   hyper spawns for HTTP/2 streams, run on the shutdown's request tasks,
//!   so it can wait for all of them.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::extract::ConnectInfo;
use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::dialect::ErrorDialect;
use super::head::{HeadScan, MAX_HEAD_FIELDS, Overflow, REQUEST_LINE_KEPT, Scan};
use crate::config::HttpLimits;
use crate::error::{Error, ErrorCode};
use crate::metrics;
use crate::shutdown::{ListenerShutdown, RequestTasks};

/// The first bytes of every HTTP/2 connection (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Opens a listening socket on `host:port` as `TcpListener::bind` does
/// (the first address `host` resolves to that binds, `SO_REUSEADDR` set),
/// with a listen backlog of `backlog` connections instead of tokio's 1024.
/// The kernel caps it at `net.core.somaxconn` (4096 on current Linux).
///
/// Why: a burst connects faster than the accept loop takes connections. A
/// full backlog drops the client's handshake ACK, and its request with it;
/// the client's data retransmissions back off, so its request can reach
/// the gateway seconds after the accept, past the head timeout, and the
/// connection is closed under a request the client believes it sent.
/// 10,000 clients at once overflowed a 1024 backlog 1,200-11,800 times.
pub async fn bind(host: &str, port: u16, backlog: u32) -> std::io::Result<TcpListener> {
    let mut failed = None;
    for addr in tokio::net::lookup_host((host, port)).await? {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        match socket.bind(addr) {
            Ok(()) => return socket.listen(backlog),
            Err(err) => failed = Some(err),
        }
    }
    Err(failed.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the host resolves to no address",
        )
    }))
}

/// Refused connections answered at once; more are closed unanswered.
const MAX_REFUSALS_IN_FLIGHT: usize = 256;

/// How long a refused connection is read (and discarded) after its answer,
/// so closing it does not reset the answer away before the client reads it.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// How long a connection over the cap may take to complete its TLS
/// handshake before its refusal is sent.
const REFUSAL_HANDSHAKE_WAIT: Duration = Duration::from_secs(1);

/// How long a connection over the cap may take to send its request line
/// (which names the route whose dialect the refusal speaks).
const REQUEST_LINE_WAIT: Duration = Duration::from_secs(1);

/// The two timeouts a connection runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnTimeouts {
    pub header_read: Duration,
    pub keep_alive: Duration,
}

/// Why a connection's timer fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expiry {
    /// A request head took too long: close the socket.
    HeaderRead,
    /// No request for too long: shut down gracefully.
    KeepAlive,
}

/// Which protocol a connection speaks, as far as its first bytes tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    /// This many bytes of the HTTP/2 preface have arrived, nothing else.
    Undecided(usize),
    Http1,
    Http2,
}

/// Where a connection is between requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// A request head is on its way since then.
    Head(Instant),
    /// Requests are in flight: no timer (a generation may take minutes).
    Busy,
    /// Nothing in flight since then.
    Idle(Instant),
}

/// A connection's timers as a state machine, events in, a deadline out,
/// with the scan of its HTTP/1 heads ([`HeadScan`]). Time is passed in, so
/// the rules are tested without a clock.
#[derive(Debug, Clone)]
pub(crate) struct ConnClock {
    timeouts: ConnTimeouts,
    protocol: Protocol,
    phase: Phase,
    in_flight: usize,
    /// The HTTP/1 head on its way (in `Phase::Head`).
    head: HeadScan,
}

impl ConnClock {
    /// A connection accepted at `now`: its first head is on its way, and
    /// may take `head_cap` bytes without ending.
    pub(super) fn new(timeouts: ConnTimeouts, head_cap: usize, now: Instant) -> Self {
        Self {
            timeouts,
            protocol: Protocol::Undecided(0),
            phase: Phase::Head(now),
            in_flight: 0,
            head: HeadScan::new(head_cap),
        }
    }

    /// Whether [`ConnClock::on_bytes`] can change anything now (the I/O
    /// path skips it otherwise).
    pub(super) fn wants_bytes(&self) -> bool {
        match self.protocol {
            Protocol::Undecided(_) => true,
            Protocol::Http1 => match self.phase {
                Phase::Idle(_) => true,
                Phase::Head(_) => self.head.state() == Scan::Reading,
                Phase::Busy => false,
            },
            Protocol::Http2 => false,
        }
    }

    /// Bytes arrived at `now`. Returns whether the deadline moved.
    pub(super) fn on_bytes(&mut self, bytes: &[u8], now: Instant) -> bool {
        if bytes.is_empty() {
            return false;
        }
        if let Protocol::Undecided(matched) = self.protocol {
            let expected = &H2_PREFACE[matched..];
            let n = expected.len().min(bytes.len());
            self.protocol = if bytes[..n] != expected[..n] {
                // The bytes that looked like the preface began the head.
                self.head.feed(&H2_PREFACE[..matched]);
                Protocol::Http1
            } else if matched + n == H2_PREFACE.len() {
                Protocol::Http2
            } else {
                Protocol::Undecided(matched + n)
            };
            if self.protocol == Protocol::Http2 && matches!(self.phase, Phase::Head(_)) {
                // The preface is the whole "head" HTTP/2 has; from here on
                // the connection is idle until a stream opens.
                self.phase = Phase::Idle(now);
                return true;
            }
        }
        if self.protocol != Protocol::Http1 {
            return false;
        }
        let mut moved = false;
        if matches!(self.phase, Phase::Idle(_)) {
            self.phase = Phase::Head(now);
            self.head.restart();
            moved = true;
        }
        if matches!(self.phase, Phase::Head(_)) {
            self.head.feed(bytes);
        }
        moved
    }

    /// The current head's refusal, once its scan refused it, with the
    /// dialect of the route it names.
    pub(super) fn head_refused(&self) -> Option<(Overflow, ErrorDialect)> {
        match (self.phase, self.head.state()) {
            (Phase::Head(_), Scan::Refused(overflow)) => Some((overflow, self.head.dialect())),
            _ => None,
        }
    }

    /// A request's head is complete and its handler runs.
    pub(super) fn on_request(&mut self) {
        if let Protocol::Undecided(_) = self.protocol {
            self.protocol = Protocol::Http1;
        }
        self.in_flight += 1;
        self.phase = Phase::Busy;
    }

    /// A response ended (sent or abandoned) at `now`. Returns whether the
    /// deadline moved.
    pub(super) fn on_response_end(&mut self, now: Instant) -> bool {
        self.in_flight = self.in_flight.saturating_sub(1);
        if self.in_flight == 0 {
            self.phase = Phase::Idle(now);
            return true;
        }
        false
    }

    /// When the connection's timer fires, and why.
    pub(super) fn deadline(&self) -> Option<(Instant, Expiry)> {
        match self.phase {
            Phase::Head(since) => Some((since + self.timeouts.header_read, Expiry::HeaderRead)),
            Phase::Idle(since) => Some((since + self.timeouts.keep_alive, Expiry::KeepAlive)),
            Phase::Busy => None,
        }
    }

    /// The timer that has fired by `now`, if any.
    pub(super) fn expired(&self, now: Instant) -> Option<Expiry> {
        self.deadline()
            .filter(|(at, _)| *at <= now)
            .map(|(_, why)| why)
    }
}

/// A connection's clock, shared by its socket (bytes), its service
/// (requests and responses) and its task (the timer).
#[derive(Debug)]
struct ConnState {
    clock: Mutex<ConnClock>,
    /// `clock.wants_bytes()`, readable without the lock on every read.
    wants_bytes: AtomicBool,
    /// Signalled when the deadline moves.
    moved: Notify,
}

impl ConnState {
    fn new(timeouts: ConnTimeouts, head_cap: usize) -> Arc<Self> {
        Arc::new(Self {
            clock: Mutex::new(ConnClock::new(timeouts, head_cap, Instant::now())),
            wants_bytes: AtomicBool::new(true),
            moved: Notify::new(),
        })
    }

    /// Bytes arrived: the clock and the head's scan see them. Returns the
    /// head's refusal, if they made it one.
    fn on_read(&self, bytes: &[u8]) -> Option<(Overflow, ErrorDialect)> {
        let now = Instant::now();
        let mut clock = self.clock.lock().unwrap_or_else(PoisonError::into_inner);
        let moved = clock.on_bytes(bytes, now);
        let refused = clock.head_refused();
        self.wants_bytes
            .store(clock.wants_bytes(), Ordering::Relaxed);
        drop(clock);
        if moved {
            self.moved.notify_one();
        }
        refused
    }

    fn update(&self, change: impl FnOnce(&mut ConnClock) -> bool) {
        let mut clock = self.clock.lock().unwrap_or_else(PoisonError::into_inner);
        let moved = change(&mut clock);
        self.wants_bytes
            .store(clock.wants_bytes(), Ordering::Relaxed);
        drop(clock);
        if moved {
            self.moved.notify_one();
        }
    }

    fn deadline(&self) -> Option<(Instant, Expiry)> {
        self.clock
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .deadline()
    }

    fn expired(&self, now: Instant) -> Option<Expiry> {
        self.clock
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .expired(now)
    }

    /// A request entered; the returned guard ends it when dropped.
    fn request_started(self: &Arc<Self>) -> InFlight {
        self.update(|clock| {
            clock.on_request();
            true
        });
        InFlight(Arc::clone(self))
    }
}

/// One request in flight on a connection, until its response body is done
/// or dropped.
#[derive(Debug)]
struct InFlight(Arc<ConnState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let now = Instant::now();
        self.0.update(|clock| clock.on_response_end(now));
    }
}

/// A response body that holds its request's [`InFlight`] until it ends.
struct TrackedBody {
    body: Body,
    _in_flight: InFlight,
}

impl HttpBody for TrackedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// A head refused on its way to hyper: the connection's stream, taken
/// back from hyper to answer on, and the refusal.
struct RefusedHead<S> {
    stream: S,
    overflow: Overflow,
    dialect: ErrorDialect,
}

/// Where a [`WatchedStream`] leaves its stream when its head is refused.
type RefusedSlot<S> = Arc<Mutex<Option<RefusedHead<S>>>>;

/// A socket (or the plaintext of a TLS session) that tells its
/// connection's clock when bytes arrive. When the bytes make the head's
/// scan refuse it, the stream leaves hyper (which sees a read error and
/// ends the connection without answering) for `refused`, where the
/// connection's task takes it to answer.
struct WatchedStream<S> {
    /// `None` once handed over to `refused`.
    stream: Option<S>,
    state: Arc<ConnState>,
    refused: RefusedSlot<S>,
}

impl<S> WatchedStream<S> {
    fn gone() -> std::io::Error {
        std::io::Error::new(
            std::io::ErrorKind::NotConnected,
            "the request head was refused",
        )
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WatchedStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let Some(stream) = this.stream.as_mut() else {
            return Poll::Ready(Err(Self::gone()));
        };
        let before = buf.filled().len();
        let polled = Pin::new(stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && this.state.wants_bytes.load(Ordering::Relaxed) {
            let arrived = &buf.filled()[before..];
            if !arrived.is_empty()
                && let Some((overflow, dialect)) = this.state.on_read(arrived)
                && let Some(stream) = this.stream.take()
            {
                *this.refused.lock().unwrap_or_else(PoisonError::into_inner) = Some(RefusedHead {
                    stream,
                    overflow,
                    dialect,
                });
                return Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "request head refused before hyper read it",
                )));
            }
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WatchedStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut().stream.as_mut() {
            Some(stream) => Pin::new(stream).poll_write(cx, buf),
            None => Poll::Ready(Err(Self::gone())),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut().stream.as_mut() {
            Some(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            None => Poll::Ready(Err(Self::gone())),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.as_ref().is_some_and(S::is_write_vectored)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut().stream.as_mut() {
            Some(stream) => Pin::new(stream).poll_flush(cx),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut().stream.as_mut() {
            Some(stream) => Pin::new(stream).poll_shutdown(cx),
            None => Poll::Ready(Ok(())),
        }
    }
}

/// How a listener serves its connections.
#[derive(Clone)]
pub struct ListenerSettings {
    /// `public` or `admin`: the metrics label.
    pub name: &'static str,
    pub limits: HttpLimits,
    /// HTTPS: the TLS handshake each connection starts with.
    pub tls: Option<TlsAcceptor>,
}

impl std::fmt::Debug for ListenerSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerSettings")
            .field("name", &self.name)
            .field("limits", &self.limits)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// hyper's executor for the tasks of HTTP/2 streams: the request tasks, so
/// the shutdown waits for (and the cut reaches) those too.
#[derive(Debug, Clone)]
struct TrackedExecutor(RequestTasks);

impl<F> hyper::rt::Executor<F> for TrackedExecutor
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, task: F) {
        self.0.spawn(task);
    }
}

/// Serves `app` on `listener` until the shutdown drains it: then closes the
/// socket and waits for every connection to end (on its own, or at the
/// cut).
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    settings: ListenerSettings,
    shutdown: ListenerShutdown,
) -> std::io::Result<()> {
    let ListenerShutdown {
        draining,
        cut,
        open,
        tasks,
    } = shutdown;
    let limits = settings.limits;
    let max = limits.max_connections.clamp(1, u32::MAX as usize);
    let connections = Arc::new(Semaphore::new(max));
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS_IN_FLIGHT));
    let timeouts = ConnTimeouts {
        header_read: limits.header_read_timeout,
        keep_alive: limits.keep_alive_timeout,
    };
    let mut builder = auto::Builder::new(TrackedExecutor(tasks.clone()));
    builder
        .http1()
        .keep_alive(true)
        .header_read_timeout(None)
        .max_headers(MAX_HEAD_FIELDS)
        .max_buf_size(hyper_buffer(limits.max_header_bytes));
    builder.http2().max_header_list_size(
        u32::try_from(limits.max_header_bytes.saturating_mul(2)).unwrap_or(u32::MAX),
    );
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    accept_failed(err).await;
                    continue;
                }
            },
            () = draining.cancelled() => break,
        };
        let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
            metrics::record_refusal(ErrorCode::TooManyConnections.as_str());
            // Answered while fewer than MAX_REFUSALS_IN_FLIGHT refusals run
            // (an HTTPS one after its handshake, which that bound also
            // caps); beyond that, closed unanswered.
            if let Ok(permit) = Arc::clone(&refusals).try_acquire_owned() {
                let tls = settings.tls.clone();
                tokio::spawn(async move {
                    match tls {
                        None => refuse_over_cap(stream).await,
                        Some(acceptor) => refuse_over_cap_tls(stream, acceptor).await,
                    }
                    drop(permit);
                });
            }
            continue;
        };
        if let Err(err) = stream.set_nodelay(true) {
            tracing::debug!(%err, "cannot set TCP_NODELAY");
        }
        metrics::record_connections(settings.name, max - connections.available_permits());
        let connection = Connection {
            peer,
            app: app.clone(),
            builder: builder.clone(),
            listener: settings.name,
            max_header_bytes: limits.max_header_bytes,
            state: ConnState::new(timeouts, head_cap(limits.max_header_bytes)),
            stop: Stop {
                draining: draining.clone(),
                cut: cut.clone(),
            },
        };
        let tls = settings.tls.clone();
        let connections = Arc::clone(&connections);
        tasks.spawn(async move {
            match tls {
                None => connection.serve(stream).await,
                Some(acceptor) => connection.serve_tls(stream, acceptor).await,
            }
            drop(permit);
            metrics::record_connections(settings.name, max - connections.available_permits());
        });
    }
    drop(listener);
    drop(open);
    tracing::info!(listener = settings.name, "listener closed");
    // Every connection holds a permit until it ends.
    let _all = connections
        .acquire_many(u32::try_from(max).unwrap_or(u32::MAX))
        .await;
    Ok(())
}

/// The bytes an HTTP/1 head may take without ending before the listener
/// refuses it: twice the head limit, so complete heads between the two get
/// the JSON answer of `api::limits`, with the route known.
fn head_cap(max_header_bytes: usize) -> usize {
    max_header_bytes.saturating_mul(2)
}

/// hyper's read buffer: at least the head cap, so a head's scan refuses it
/// before hyper would (at the same read or an earlier one); at least
/// hyper's minimum.
fn hyper_buffer(max_header_bytes: usize) -> usize {
    head_cap(max_header_bytes).max(8192)
}

/// An accept that failed: a connection that died in the backlog is nobody's
/// problem; anything else (out of descriptors) gets a pause, so the loop
/// does not spin while the condition lasts.
async fn accept_failed(err: std::io::Error) {
    use std::io::ErrorKind;
    if matches!(
        err.kind(),
        ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::ConnectionRefused
    ) {
        return;
    }
    tracing::warn!(%err, "accept failed; pausing the listener");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// [`refuse_over_cap`] for HTTPS: the answer goes inside a TLS session
/// (a TLS client could not read a plaintext one), so the handshake comes
/// first, within [`REFUSAL_HANDSHAKE_WAIT`]; a client that does not finish
/// it in time is closed unanswered.
async fn refuse_over_cap_tls(stream: TcpStream, acceptor: TlsAcceptor) {
    match tokio::time::timeout(REFUSAL_HANDSHAKE_WAIT, acceptor.accept(stream)).await {
        Ok(Ok(session)) => refuse_over_cap(session).await,
        Ok(Err(err)) => tracing::debug!(%err, "TLS handshake of a refused connection failed"),
        Err(_) => tracing::debug!("TLS handshake of a refused connection too slow"),
    }
}

/// Answers a connection over the cap in the dialect of the route its
/// request line names (waiting up to [`REQUEST_LINE_WAIT`] for it), then
/// closes it.
async fn refuse_over_cap<S>(mut stream: S)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut start = [0u8; REQUEST_LINE_KEPT];
    let mut read = 0;
    let reading = async {
        while read < start.len() && !start[..read].contains(&b'\n') {
            match tokio::io::AsyncReadExt::read(&mut stream, &mut start[read..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n,
            }
        }
    };
    let _ = tokio::time::timeout(REQUEST_LINE_WAIT, reading).await;
    let dialect = super::head::dialect_of_head_start(&start[..read]);
    let err = Error::new(
        ErrorCode::TooManyConnections,
        "the gateway holds as many connections as --max-connections allows; retry shortly",
    )
    .with_retry_after(Duration::from_secs(1));
    answer_and_close(stream, &err, dialect).await;
}

/// Writes `err` as a whole HTTP/1.1 response in `dialect` (with
/// `Connection: close`), closes the sending side, then reads what the
/// client still sends until it closes (or [`REFUSAL_LINGER`]), so the
/// answer is not lost to a reset.
async fn answer_and_close<S>(mut stream: S, err: &Error, dialect: ErrorDialect)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    if stream.write_all(&raw_answer(err, dialect)).await.is_err()
        || stream.shutdown().await.is_err()
    {
        return;
    }
    let drain = async {
        let mut sink = [0u8; 4096];
        loop {
            match tokio::io::AsyncReadExt::read(&mut stream, &mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    };
    let _ = tokio::time::timeout(REFUSAL_LINGER, drain).await;
}

/// `err` as the bytes of an HTTP/1.1 response: its status, its JSON body
/// in `dialect`, `Retry-After` when it says when to come back, and
/// `Connection: close`.
fn raw_answer(err: &Error, dialect: ErrorDialect) -> Vec<u8> {
    let status = http::StatusCode::from_u16(err.code.http_status())
        .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    let body = dialect.body(err).to_string();
    let retry_after = err.retry_after.map_or(String::new(), |after| {
        format!("retry-after: {}\r\n", after.as_secs().max(1))
    });
    format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\n{retry_after}\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    )
    .into_bytes()
}

/// When a connection must close: once idle (`draining`), or now (`cut`).
#[derive(Debug)]
struct Stop {
    draining: CancellationToken,
    cut: CancellationToken,
}

/// One accepted connection and what it is served with.
struct Connection {
    peer: SocketAddr,
    app: axum::Router,
    builder: auto::Builder<TrackedExecutor>,
    listener: &'static str,
    /// `--max-header-size`, for the refusal of a head its scan stops.
    max_header_bytes: usize,
    /// Its clock, started at the accept (a TLS handshake counts against
    /// the first head's time).
    state: Arc<ConnState>,
    stop: Stop,
}

impl Connection {
    /// Completes the TLS handshake, within the head timeout counted from
    /// the accept, then serves the session's plaintext.
    async fn serve_tls(self, stream: TcpStream, acceptor: TlsAcceptor) {
        let Some((deadline, _)) = self.state.deadline() else {
            return;
        };
        let handshake = tokio::select! {
            done = tokio::time::timeout_at(deadline, acceptor.accept(stream)) => done,
            () = self.stop.cut.cancelled() => return,
        };
        match handshake {
            Ok(Ok(session)) => self.serve(session).await,
            Ok(Err(err)) => {
                tracing::debug!(peer = %self.peer, %err, "TLS handshake failed");
                metrics::record_connection_closed(self.listener, "tls_handshake");
            }
            Err(_) => {
                tracing::debug!(peer = %self.peer, "TLS handshake too slow; closing the connection");
                metrics::record_connection_closed(self.listener, "header_read");
            }
        }
    }

    /// Serves the connection's HTTP under its clock.
    async fn serve<S>(self, stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let refused: RefusedSlot<S> = Arc::default();
        let max_header_bytes = self.max_header_bytes;
        let cut = self.stop.cut.clone();
        self.serve_http(stream, Arc::clone(&refused)).await;
        let head = refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(RefusedHead {
            stream,
            overflow,
            dialect,
        }) = head
        {
            let err = overflow.error(max_header_bytes);
            metrics::record_refusal(err.code.as_str());
            tracing::debug!(%err, "request head refused before hyper read it");
            tokio::select! {
                () = answer_and_close(stream, &err, dialect) => {}
                () = cut.cancelled() => {}
            }
        }
    }

    /// Serves the connection's HTTP until it ends (or its head is refused:
    /// then its stream is in `refused`).
    async fn serve_http<S>(self, stream: S, refused: RefusedSlot<S>)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Connection {
            peer,
            app,
            builder,
            listener,
            max_header_bytes: _,
            state,
            stop,
        } = self;
        let io = WatchedStream {
            stream: Some(stream),
            state: Arc::clone(&state),
            refused,
        };
        serve_connection(io, peer, app, builder, listener, state, stop).await;
    }
}

/// Serves one connection under its clock.
async fn serve_connection<S>(
    stream: WatchedStream<S>,
    peer: SocketAddr,
    app: axum::Router,
    builder: auto::Builder<TrackedExecutor>,
    listener: &'static str,
    state: Arc<ConnState>,
    stop: Stop,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(stream);
    let service_state = Arc::clone(&state);
    let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
        let in_flight = service_state.request_started();
        request.extensions_mut().insert(ConnectInfo(peer));
        let app = app.clone();
        async move {
            let response = app.oneshot(request.map(Body::new)).await?;
            Ok::<_, Infallible>(response.map(|body| TrackedBody {
                body,
                _in_flight: in_flight,
            }))
        }
    });
    let connection = builder.serve_connection(io, service).into_owned();
    tokio::pin!(connection);
    let mut closing = false;
    loop {
        // Once closing, only a stalled head still needs the timer.
        let deadline = state
            .deadline()
            .filter(|(_, why)| !closing || *why == Expiry::HeaderRead);
        let timer = async {
            match deadline {
                Some((at, _)) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        // The connection first: it reads what has arrived before the timer
        // may close it. A head already in the socket when the gateway gets
        // to the connection late (a burst's thousands of accepts queue
        // their tasks for seconds) is served, not reset unread: the timer
        // is for clients that are slow, not for a gateway that is.
        tokio::select! {
            biased;
            served = connection.as_mut() => {
                if let Err(err) = served {
                    tracing::debug!(%peer, %err, "connection ended with an error");
                }
                return;
            }
            () = state.moved.notified() => {}
            () = timer => match state.expired(Instant::now()) {
                Some(Expiry::HeaderRead) => {
                    tracing::debug!(%peer, "request head too slow; closing the connection");
                    metrics::record_connection_closed(listener, "header_read");
                    return;
                }
                Some(Expiry::KeepAlive) if !closing => {
                    metrics::record_connection_closed(listener, "keep_alive");
                    connection.as_mut().graceful_shutdown();
                    closing = true;
                }
                Some(Expiry::KeepAlive) | None => {}
            },
            () = stop.draining.cancelled(), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            () = stop.cut.cancelled() => {
                // Dropping the connection drops its responses, and with
                // them their engine streams: their legs are aborted.
                tracing::debug!(%peer, "shutdown: dropping the connection");
                metrics::record_connection_closed(listener, "shutdown");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUTS: ConnTimeouts = ConnTimeouts {
        header_read: Duration::from_secs(10),
        keep_alive: Duration::from_secs(75),
    };

    const HEAD_CAP: usize = 8192;

    fn at(start: Instant, secs: u64) -> Instant {
        start + Duration::from_secs(secs)
    }

    #[test]
    fn a_fresh_connection_has_the_head_timeout_from_its_accept() {
        let start = Instant::now();
        let mut clock = ConnClock::new(TIMEOUTS, HEAD_CAP, start);
        assert_eq!(clock.deadline(), Some((at(start, 10), Expiry::HeaderRead)));
        // Bytes trickling in do not push the deadline back (slowloris).
        for second in 1..10 {
            assert!(!clock.on_bytes(b"G", at(start, second)));
        }
        assert_eq!(clock.expired(at(start, 9)), None);
        assert_eq!(clock.expired(at(start, 10)), Some(Expiry::HeaderRead));
    }

    #[test]
    fn a_request_in_flight_has_no_timer_and_idleness_starts_when_it_ends() {
        let start = Instant::now();
        let mut clock = ConnClock::new(TIMEOUTS, HEAD_CAP, start);
        clock.on_bytes(b"POST /v1/chat/completions HTTP/1.1\r\n", start);
        clock.on_request();
        assert_eq!(clock.deadline(), None, "a generation may take minutes");
        assert!(!clock.wants_bytes(), "body bytes are not a new head");
        assert!(clock.on_response_end(at(start, 300)));
        assert_eq!(clock.deadline(), Some((at(start, 375), Expiry::KeepAlive)));
    }

    #[test]
    fn the_next_head_on_a_kept_alive_connection_is_timed_from_its_first_byte() {
        let start = Instant::now();
        let mut clock = ConnClock::new(TIMEOUTS, HEAD_CAP, start);
        clock.on_bytes(b"GET /health HTTP/1.1\r\n\r\n", start);
        clock.on_request();
        clock.on_response_end(at(start, 1));
        assert!(clock.wants_bytes());
        // 60 s idle, then a request starts: the head timer, not the idle one.
        assert!(clock.on_bytes(b"GE", at(start, 61)));
        assert_eq!(clock.deadline(), Some((at(start, 71), Expiry::HeaderRead)));
        assert!(!clock.on_bytes(b"T /", at(start, 62)));
        assert_eq!(clock.deadline(), Some((at(start, 71), Expiry::HeaderRead)));
    }

    #[test]
    fn http2_is_idle_after_its_preface_and_its_frames_start_no_head() {
        let start = Instant::now();
        let mut clock = ConnClock::new(TIMEOUTS, HEAD_CAP, start);
        // The preface may arrive in pieces.
        let (first, rest) = H2_PREFACE.split_at(5);
        assert!(!clock.on_bytes(first, start));
        assert!(clock.wants_bytes());
        assert!(clock.on_bytes(rest, at(start, 1)));
        assert_eq!(clock.deadline(), Some((at(start, 76), Expiry::KeepAlive)));
        assert!(!clock.wants_bytes());
        assert!(
            !clock.on_bytes(b"\x00\x00\x08\x06", at(start, 30)),
            "a PING"
        );
        // Two streams: idle only once both have ended.
        clock.on_request();
        clock.on_request();
        assert!(!clock.on_response_end(at(start, 40)));
        assert_eq!(clock.deadline(), None);
        assert!(clock.on_response_end(at(start, 41)));
        assert_eq!(clock.deadline(), Some((at(start, 116), Expiry::KeepAlive)));
    }

    #[test]
    fn a_head_that_starts_like_the_preface_but_differs_is_http1() {
        let start = Instant::now();
        let mut clock = ConnClock::new(TIMEOUTS, HEAD_CAP, start);
        clock.on_bytes(b"PRI", start);
        clock.on_bytes(b"ZE /x HTTP/1.1\r\n", start);
        assert_eq!(clock.protocol, Protocol::Http1);
        assert_eq!(clock.deadline(), Some((at(start, 10), Expiry::HeaderRead)));
    }

    #[test]
    fn hyper_reads_at_least_its_minimum_and_never_less_than_the_head_cap() {
        assert_eq!(hyper_buffer(1024), 8192);
        assert_eq!(head_cap(1024), 2048);
        assert_eq!(hyper_buffer(64 * 1024), 128 * 1024);
        for limit in [1024, 4096, 5000, 64 * 1024, 1 << 20] {
            assert!(hyper_buffer(limit) >= head_cap(limit), "{limit}");
        }
    }

    #[test]
    fn each_http1_head_is_scanned_from_its_first_byte() {
        let start = Instant::now();
        let mut clock = ConnClock::new(TIMEOUTS, 64, start);
        // The first bytes look like the HTTP/2 preface, then are not: they
        // are the head's first bytes all the same.
        clock.on_bytes(b"PRI", start);
        clock.on_bytes(b"NT /v1/messages HTTP/1.1\r\n", start);
        assert!(clock.wants_bytes(), "the head has not ended");
        assert_eq!(clock.head_refused(), None);
        clock.on_bytes(b"x-filler: aaaaaaaaaaaaaaaaaaaaaaaaa", start);
        assert_eq!(
            clock.head_refused(),
            Some((Overflow::Bytes(64), ErrorDialect::Anthropic))
        );

        // On a kept-alive connection, the next head is scanned afresh.
        let mut clock = ConnClock::new(TIMEOUTS, 64, start);
        clock.on_bytes(b"GET /v1/messages HTTP/1.1\r\n\r\n", start);
        assert!(
            !clock.wants_bytes(),
            "the head ended; its body is not looked at"
        );
        clock.on_request();
        clock.on_response_end(at(start, 1));
        clock.on_bytes(b"POST /v1/chat/completions HTTP/1.1\r\n", at(start, 2));
        clock.on_bytes(&[b'a'; 64], at(start, 2));
        assert_eq!(
            clock.head_refused(),
            Some((Overflow::Bytes(64), ErrorDialect::OpenAi))
        );
        // HTTP/2 is not scanned (the h2 layer bounds its header lists).
        let mut clock = ConnClock::new(TIMEOUTS, 64, start);
        clock.on_bytes(H2_PREFACE, start);
        clock.on_bytes(&[0; 256], start);
        assert_eq!(clock.head_refused(), None);
    }

    #[test]
    fn a_refusal_the_listener_writes_is_a_whole_response_in_its_dialect() {
        let err = Error::new(ErrorCode::TooManyConnections, "full")
            .with_retry_after(Duration::from_secs(1));
        let openai = String::from_utf8(raw_answer(&err, ErrorDialect::OpenAi)).expect("text");
        let (head, body) = openai.split_once("\r\n\r\n").expect("a head and a body");
        assert!(
            head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{head}"
        );
        assert!(head.contains("\r\nretry-after: 1\r\n"), "{head}");
        assert!(head.contains("\r\nconnection: close\r\n"), "{head}");
        assert!(
            head.ends_with(&format!("content-length: {}", body.len())),
            "{head}"
        );
        let json: serde_json::Value = serde_json::from_str(body).expect("json");
        assert_eq!(json["error"]["code"], "too_many_connections");

        let err = Overflow::Fields.error(4096);
        let anthropic = String::from_utf8(raw_answer(&err, ErrorDialect::Anthropic)).expect("text");
        let (head, body) = anthropic.split_once("\r\n\r\n").expect("a head and a body");
        assert!(
            head.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
            "{head}"
        );
        assert!(!head.contains("retry-after"), "{head}");
        let json: serde_json::Value = serde_json::from_str(body).expect("json");
        assert_eq!(json["type"], "error");
        assert_eq!(json["error"]["type"], "invalid_request_error");
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_that_arrived_in_time_is_served_however_late_the_gateway_reads_it() {
        use tokio::io::AsyncReadExt;
        // Both the head and the timer are ready when the connection's task
        // first runs: the head must win. (Were the two polled in random
        // order, 32 rounds would all pass one time in 2^32.)
        for _ in 0..32 {
            let state = ConnState::new(TIMEOUTS, HEAD_CAP);
            let (mut client, server) = tokio::io::duplex(64 * 1024);
            client
                .write_all(b"GET / HTTP/1.1\r\nhost: gateway\r\n\r\n")
                .await
                .expect("written");
            // The gateway gets to the connection after its head deadline.
            tokio::time::advance(TIMEOUTS.header_read + Duration::from_secs(1)).await;
            let stream = WatchedStream {
                stream: Some(server),
                state: Arc::clone(&state),
                refused: Arc::default(),
            };
            let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
            let builder = auto::Builder::new(TrackedExecutor(RequestTasks::new()));
            let stop = Stop {
                draining: CancellationToken::new(),
                cut: CancellationToken::new(),
            };
            let peer = SocketAddr::from(([127, 0, 0, 1], 1));
            let served = tokio::spawn(serve_connection(
                stream, peer, app, builder, "public", state, stop,
            ));
            let mut status_line = [0u8; 17];
            client
                .read_exact(&mut status_line)
                .await
                .expect("answered, not closed unread");
            assert_eq!(&status_line, b"HTTP/1.1 200 OK\r\n");
            served.abort();
        }
    }
}
