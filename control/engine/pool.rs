//! The HTTP/2 connections to one worker: a small pool that grows with the
//! streams in flight.
//!
//! Why it exists: on one connection per worker, every stream shares that
//! connection's fate. A server that ends it (a GOAWAY for its maximum
//! connection age, a restart, overload protection) fails thousands of
//! streams at once, and each failure used to count against the worker's
//! circuit breaker. The pool spreads streams over a few connections,
//! replaces a connection the server is closing, and gives every call a
//! connection epoch, so that one connection's death counts once.
//!
//! How it works. tonic and hyper expose no connection state, so the pool
//! keeps its own:
//!
//! - A *slot* is one tonic [`Channel`]: one HTTP/2 connection at a time,
//!   which tonic redials when it breaks. The pool counts the streams leased
//!   on each slot.
//! - A call leases the least loaded slot. When that one already holds its
//!   cap of streams and the pool has fewer than `max_connections` slots, a
//!   new slot (a new connection) opens. At the maximum, the least loaded
//!   slot takes the stream anyway, and hyper queues it until the server's
//!   stream limit lets it start.
//! - The cap is `streams_per_connection`, or the server's
//!   `SETTINGS_MAX_CONCURRENT_STREAMS` when that is lower. hyper does not
//!   expose the server's settings, so the pool reads them from the first
//!   frame the server sends on each connection, which RFC 9113 requires to
//!   be its SETTINGS ([`Sniffed`]). A later SETTINGS change is not seen.
//! - A connect that fails puts the slot in backoff (doubling from
//!   `backoff` to `max_backoff`, with ±20% jitter). Until it is over, calls
//!   on that slot fail at once, as gRPC fails calls in TRANSIENT_FAILURE,
//!   so the router retries elsewhere instead of waiting; their error
//!   carries [`InBackoff`], so they are not counted as failures of their
//!   own (the failed connect was).
//! - A call the worker never saw (the connection's GOAWAY excluded it, or
//!   the stream was refused) retires the slot's channel: the slot gets a
//!   fresh one, which dials a new connection, while the streams the server
//!   took finish on the old connection, which closes after them.
//! - Epochs: a lease records the pool's epoch. The first connection-level
//!   failure reported by a call leased at the current epoch advances it;
//!   failures of calls leased before that are the same death seen again.
//! - TLS (`grpcs://` workers): the pool's connector makes each
//!   connection's TLS session itself, with the [`WorkerTls`] rustls config
//!   (roots, client certificate, ALPN h2), and hands hyper the decrypted
//!   stream, so the SETTINGS are read as on a plaintext connection. tonic
//!   dials an `http://` endpoint (its own connector would otherwise wrap
//!   TLS again) whose origin is the `https://` URI, so requests say
//!   `:scheme https`. A failed handshake fails the connect: backoff applies.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::tls::{WorkerTls, server_name};

/// How the gateway connects to each worker (`--worker-*` connection flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionConfig {
    /// Most HTTP/2 connections to one worker.
    pub max_connections: usize,
    /// Streams a connection takes before another opens, unless the server
    /// advertises a lower `SETTINGS_MAX_CONCURRENT_STREAMS`.
    pub streams_per_connection: u32,
    /// How long establishing a connection (TCP, and the TLS handshake for
    /// `grpcs://` workers) may take.
    pub connect_timeout: Duration,
    /// How long a connection may go without a byte from the server before
    /// it is pinged (HTTP/2 PING), idle or not: engines tolerate 30 s
    /// (wire.md), and it finds dead connections before a request does.
    pub keepalive_interval: Duration,
    /// How long a ping may go unanswered before the connection is closed.
    /// The streams on it then fail as a connection failure: a black-holed
    /// worker's calls end within `keepalive_interval + keepalive_timeout`
    /// of its last byte, instead of at the request timeout.
    pub keepalive_timeout: Duration,
    /// The first reconnect backoff after a failed connect.
    pub backoff: Duration,
    /// The longest reconnect backoff.
    pub max_backoff: Duration,
}

impl Default for ConnectionConfig {
    fn default() -> Self {
        Self {
            max_connections: 4,
            // RFC 9113's recommended minimum, and what hyper assumes of a
            // server before its SETTINGS arrive.
            streams_per_connection: 100,
            connect_timeout: Duration::from_secs(5),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
        }
    }
}

/// No `SETTINGS_MAX_CONCURRENT_STREAMS` seen (yet, or at all).
const UNLIMITED: u32 = u32::MAX;

/// Streams a connection remembers having reset (h2's default is 10). The
/// gateway resets streams on purpose: a stop string ended a sequence, the
/// client left, a leg past its bound. Frames the worker sent before it saw
/// the reset are ignored on a remembered stream; on a forgotten one each
/// counts as an error of the connection, and at 1,024 errors h2 closes it
/// (GOAWAY `ENHANCE_YOUR_CALM`), failing every stream on it. At thousands
/// of requests a second, ten are forgotten within milliseconds.
const RESET_STREAMS_REMEMBERED: usize = 1024;

/// One worker's connections.
#[derive(Debug)]
pub(super) struct Pool {
    url: Arc<str>,
    endpoint: Endpoint,
    /// Where and how each connection is made.
    target: Arc<Target>,
    config: ConnectionConfig,
    slots: RwLock<Vec<Arc<Slot>>>,
    epoch: AtomicU64,
}

/// Where a worker's connections go: its `host:port`, and for a `grpcs://`
/// worker the TLS session each connection makes first.
struct Target {
    authority: String,
    tls: Option<(TlsConnector, ServerName<'static>)>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("authority", &self.authority)
            .field("tls", &self.tls.as_ref().map(|(_, name)| name))
            .finish()
    }
}

impl Target {
    /// A TCP connection to the worker, inside a TLS session if it wants one.
    async fn connect(&self) -> io::Result<Wire> {
        let stream = TcpStream::connect(self.authority.as_str()).await?;
        stream.set_nodelay(true)?;
        match &self.tls {
            None => Ok(Wire::Plain(stream)),
            Some((connector, name)) => {
                let session = connector.connect(name.clone(), stream).await?;
                Ok(Wire::Tls(Box::new(session)))
            }
        }
    }
}

/// One connection at a time, and its stream count.
#[derive(Debug)]
struct Slot {
    /// The slot's channel and its generation (bumped when retired).
    current: Mutex<(Channel, u64)>,
    link: Arc<Link>,
}

/// What a slot's connector and its callers share.
#[derive(Debug)]
struct Link {
    url: Arc<str>,
    config: ConnectionConfig,
    in_flight: AtomicU32,
    /// The latest connection's `SETTINGS_MAX_CONCURRENT_STREAMS`.
    advertised: AtomicU32,
    backoff: Mutex<Backoff>,
}

/// Failed connects in a row, and when the next may be tried.
#[derive(Debug, Default)]
struct Backoff {
    failures: u32,
    until: Option<Instant>,
}

/// A call's hold on a slot: counts one stream until dropped.
#[derive(Debug)]
pub(super) struct Lease {
    slot: Arc<Slot>,
    channel: Channel,
    generation: u64,
    epoch: u64,
}

impl Lease {
    pub(super) fn channel(&self) -> Channel {
        self.channel.clone()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.slot.link.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Pool {
    /// A pool for the worker at `url`, dialling `uri` (`http://host:port`,
    /// or `https://host:port` with `tls`: every connection is then a TLS
    /// session made as `tls` says). Does no I/O; must be called inside a
    /// tokio runtime.
    pub(super) fn new(
        url: &str,
        uri: &str,
        config: ConnectionConfig,
        tls: Option<&WorkerTls>,
    ) -> Result<Self, String> {
        let parsed: Uri = uri.parse().map_err(|err| format!("{err}"))?;
        let authority = parsed
            .authority()
            .map(|authority| authority.as_str().to_owned())
            .ok_or_else(|| "no host:port".to_owned())?;
        let tls = match tls {
            None => None,
            Some(tls) => {
                let name = server_name(&authority)?;
                let config = tls.rustls_config()?;
                Some((TlsConnector::from(Arc::new(config)), name))
            }
        };
        // tonic's own connector would wrap an `https://` endpoint in TLS
        // again: it dials `http://`, and requests carry the real origin.
        let dialled: Uri = format!("http://{authority}")
            .parse()
            .map_err(|err| format!("{err}"))?;
        let mut endpoint = Endpoint::from(dialled)
            .http2_max_concurrent_reset_streams(RESET_STREAMS_REMEMBERED)
            .http2_keep_alive_interval(config.keepalive_interval)
            .keep_alive_timeout(config.keepalive_timeout)
            .keep_alive_while_idle(true);
        if tls.is_some() {
            endpoint = endpoint.origin(parsed);
        }
        let pool = Self {
            url: Arc::from(url),
            endpoint,
            target: Arc::new(Target { authority, tls }),
            config: ConnectionConfig {
                max_connections: config.max_connections.max(1),
                streams_per_connection: config.streams_per_connection.max(1),
                ..config
            },
            slots: RwLock::new(Vec::new()),
            epoch: AtomicU64::new(0),
        };
        let first = pool.new_slot();
        pool.slots
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .push(first);
        crate::metrics::record_worker_connections(&pool.url, 1);
        Ok(pool)
    }

    fn new_slot(&self) -> Arc<Slot> {
        let link = Arc::new(Link {
            url: Arc::clone(&self.url),
            config: self.config,
            in_flight: AtomicU32::new(0),
            advertised: AtomicU32::new(UNLIMITED),
            backoff: Mutex::new(Backoff::default()),
        });
        Arc::new(Slot {
            current: Mutex::new((self.channel(&link), 0)),
            link,
        })
    }

    /// A lazily connecting channel whose connections `link` dials.
    fn channel(&self, link: &Arc<Link>) -> Channel {
        let (link, target) = (Arc::clone(link), Arc::clone(&self.target));
        let connector = tower::service_fn(move |_: Uri| {
            let (link, target) = (Arc::clone(&link), Arc::clone(&target));
            async move { link.dial(&target).await }
        });
        self.endpoint.connect_with_connector_lazy(connector)
    }

    /// The cap of streams on a slot.
    fn cap(&self, slot: &Slot) -> u32 {
        self.config
            .streams_per_connection
            .min(slot.link.advertised.load(Ordering::Relaxed))
            .max(1)
    }

    /// Leases a slot for one call (see the module docs for which).
    pub(super) fn lease(&self) -> Lease {
        let least_loaded = |slots: &[Arc<Slot>]| {
            slots
                .iter()
                .min_by_key(|slot| slot.link.in_flight.load(Ordering::Relaxed))
                .cloned()
        };
        let chosen = {
            let slots = self.slots.read().unwrap_or_else(PoisonError::into_inner);
            least_loaded(&slots).filter(|slot| {
                slot.link.in_flight.load(Ordering::Relaxed) < self.cap(slot)
                    || slots.len() >= self.config.max_connections
            })
        };
        let slot = chosen.unwrap_or_else(|| {
            let mut slots = self.slots.write().unwrap_or_else(PoisonError::into_inner);
            // Another call may have opened one meanwhile.
            match least_loaded(&slots) {
                Some(slot)
                    if slot.link.in_flight.load(Ordering::Relaxed) < self.cap(&slot)
                        || slots.len() >= self.config.max_connections =>
                {
                    slot
                }
                _ => {
                    let slot = self.new_slot();
                    slots.push(Arc::clone(&slot));
                    crate::metrics::record_worker_connections(&self.url, slots.len());
                    slot
                }
            }
        });
        slot.link.in_flight.fetch_add(1, Ordering::Relaxed);
        let (channel, generation) = {
            let current = slot.current.lock().unwrap_or_else(PoisonError::into_inner);
            (current.0.clone(), current.1)
        };
        Lease {
            slot,
            channel,
            generation,
            epoch: self.epoch.load(Ordering::Acquire),
        }
    }

    /// The lease's connection takes no more streams (a GOAWAY, a refused
    /// stream): its slot gets a fresh channel, once per connection however
    /// many calls report it.
    pub(super) fn retire(&self, lease: &Lease) {
        let mut current = lease
            .slot
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if current.1 == lease.generation {
            *current = (self.channel(&lease.slot.link), lease.generation + 1);
        }
    }

    /// Reports a connection-level failure of a call made under `lease`;
    /// true if it is the first such failure since the lease was taken (the
    /// one to count), false if an earlier one already reported this death.
    pub(super) fn first_failure_since(&self, lease: &Lease) -> bool {
        self.epoch
            .compare_exchange(
                lease.epoch,
                lease.epoch + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Streams in flight on each slot, for tests.
    #[cfg(test)]
    fn loads(&self) -> Vec<u32> {
        self.slots
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|slot| slot.link.in_flight.load(Ordering::Relaxed))
            .collect()
    }
}

impl Link {
    /// Dials a new connection for the slot's channel, unless the slot is in
    /// backoff after a failed connect.
    async fn dial(self: Arc<Self>, target: &Target) -> io::Result<TokioIo<Sniffed>> {
        let now = Instant::now();
        if let Some(until) = self.backoff().until.filter(|&until| until > now) {
            crate::metrics::record_worker_connect(&self.url, "backoff");
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                InBackoff {
                    remaining: until - now,
                },
            ));
        }
        let connected =
            match tokio::time::timeout(self.config.connect_timeout, target.connect()).await {
                Ok(connected) => connected,
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("connect timed out after {:?}", self.config.connect_timeout),
                )),
            };
        match connected {
            Ok(stream) => {
                *self.backoff() = Backoff::default();
                self.advertised.store(UNLIMITED, Ordering::Relaxed);
                crate::metrics::record_worker_connect(&self.url, "connected");
                Ok(TokioIo::new(Sniffed {
                    stream,
                    link: self,
                    head: Some(Vec::new()),
                }))
            }
            Err(err) => {
                let pause = self.backoff().fail(Instant::now(), &self.config);
                crate::metrics::record_worker_connect(&self.url, "failed");
                tracing::debug!(worker = %self.url, %err, ?pause, "connect failed");
                Err(err)
            }
        }
    }

    fn backoff(&self) -> std::sync::MutexGuard<'_, Backoff> {
        self.backoff.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Why a call failed without a connect being tried: the slot's last connect
/// failed, and its backoff is not over. The failed connect counted against
/// the worker; a call refused meanwhile is that failure seen again.
#[derive(Debug)]
pub(crate) struct InBackoff {
    remaining: Duration,
}

impl std::fmt::Display for InBackoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "not reconnecting for another {:?}: the last connect failed",
            self.remaining
        )
    }
}

impl std::error::Error for InBackoff {}

impl Backoff {
    /// Records a failed connect at `now`; returns the pause before the next.
    fn fail(&mut self, now: Instant, config: &ConnectionConfig) -> Duration {
        let exponent = i32::try_from(self.failures).unwrap_or(i32::MAX);
        self.failures = self.failures.saturating_add(1);
        let base = (config.backoff.as_secs_f64() * 2f64.powi(exponent))
            .min(config.max_backoff.as_secs_f64());
        let jitter = 1.0 + 0.2 * (rand::random::<f64>() * 2.0 - 1.0);
        let pause = Duration::from_secs_f64((base * jitter).max(0.0));
        self.until = Some(now + pause);
        pause
    }
}

/// A connection to a worker: plain TCP, or a TLS session over it.
#[derive(Debug)]
enum Wire {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Wire {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Wire::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            Wire::Tls(session) => Pin::new(session.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Wire {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Wire::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            Wire::Tls(session) => Pin::new(session.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Wire::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Wire::Tls(session) => Pin::new(session.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Wire::Plain(stream) => stream.is_write_vectored(),
            Wire::Tls(session) => session.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Wire::Plain(stream) => Pin::new(stream).poll_flush(cx),
            Wire::Tls(session) => Pin::new(session.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Wire::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            Wire::Tls(session) => Pin::new(session.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A connection whose first frame from the server, its SETTINGS, is read
/// for `SETTINGS_MAX_CONCURRENT_STREAMS` on the way to hyper (inside the
/// TLS session, for a `grpcs://` worker).
#[derive(Debug)]
pub(super) struct Sniffed {
    stream: Wire,
    link: Arc<Link>,
    /// The bytes read so far, until the first frame is complete.
    head: Option<Vec<u8>>,
}

/// What the first bytes a server sent say.
#[derive(Debug, PartialEq, Eq)]
enum Preface {
    /// Not a whole frame yet.
    Incomplete,
    /// A SETTINGS frame, with its stream limit if it sets one.
    Settings { max_concurrent_streams: Option<u32> },
    /// Not a SETTINGS frame (not HTTP/2, or not a compliant server).
    Other,
}

/// The frame type of SETTINGS, and the identifier of its stream limit
/// (RFC 9113 §6.5, §6.5.2).
const SETTINGS: u8 = 0x4;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
/// A SETTINGS frame longer than this is not one we read.
const MAX_SETTINGS_LEN: usize = 16 * 1024;

fn read_preface(head: &[u8]) -> Preface {
    let Some(header) = head.get(..9) else {
        return Preface::Incomplete;
    };
    let len = usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
    let stream_id = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
    if header[3] != SETTINGS || stream_id != 0 || len % 6 != 0 || len > MAX_SETTINGS_LEN {
        return Preface::Other;
    }
    let Some(payload) = head.get(9..9 + len) else {
        return Preface::Incomplete;
    };
    // The last value of a repeated setting wins (RFC 9113 §6.5).
    let max_concurrent_streams = payload
        .chunks_exact(6)
        .rev()
        .find(|entry| u16::from_be_bytes([entry[0], entry[1]]) == SETTINGS_MAX_CONCURRENT_STREAMS)
        .map(|entry| u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]));
    Preface::Settings {
        max_concurrent_streams,
    }
}

impl AsyncRead for Sniffed {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.stream).poll_read(cx, buf))?;
        if let Some(head) = this.head.as_mut() {
            head.extend_from_slice(&buf.filled()[before..]);
            match read_preface(head) {
                Preface::Incomplete if buf.filled().len() > before => {}
                Preface::Settings {
                    max_concurrent_streams,
                } => {
                    let limit = max_concurrent_streams.unwrap_or(UNLIMITED);
                    this.link.advertised.store(limit, Ordering::Relaxed);
                    tracing::debug!(worker = %this.link.url, limit, "server SETTINGS read");
                    this.head = None;
                }
                // Not SETTINGS, or the connection ended before a frame.
                _ => this.head = None,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Sniffed {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SETTINGS frame header for a payload of `len` bytes.
    fn settings_header(len: u8) -> Vec<u8> {
        vec![0, 0, len, SETTINGS, 0, 0, 0, 0, 0]
    }

    #[test]
    fn the_stream_limit_is_read_from_the_servers_first_settings() {
        // Typed from RFC 9113 §6.5.1: identifier (16 bits), value (32 bits).
        let mut frame = settings_header(12);
        frame.extend([0x00, 0x04, 0x00, 0x10, 0x00, 0x00]); // INITIAL_WINDOW_SIZE 1 MiB
        frame.extend([0x00, 0x03, 0x00, 0x00, 0x00, 0x20]); // MAX_CONCURRENT_STREAMS 32
        assert_eq!(
            read_preface(&frame),
            Preface::Settings {
                max_concurrent_streams: Some(32)
            }
        );
        for cut in [0, 5, 9, 15, frame.len() - 1] {
            assert_eq!(read_preface(&frame[..cut]), Preface::Incomplete, "{cut}");
        }
        // Bytes after the frame (the next frames) do not matter.
        let mut longer = frame.clone();
        longer.extend([0, 0, 8, 6, 0, 0, 0, 0, 0]);
        assert_eq!(read_preface(&longer), read_preface(&frame));

        let mut no_limit = settings_header(6);
        no_limit.extend([0x00, 0x04, 0x00, 0x10, 0x00, 0x00]);
        assert_eq!(
            read_preface(&no_limit),
            Preface::Settings {
                max_concurrent_streams: None
            }
        );
        // A PING frame, a SETTINGS on a stream, a ragged SETTINGS: not ours.
        assert_eq!(read_preface(&[0, 0, 8, 6, 0, 0, 0, 0, 0]), Preface::Other);
        assert_eq!(
            read_preface(&[0, 0, 0, SETTINGS, 0, 0, 0, 0, 1]),
            Preface::Other
        );
        assert_eq!(read_preface(&settings_header(7)), Preface::Other);
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_resets_on_success() {
        let config = ConnectionConfig::default();
        let mut backoff = Backoff::default();
        let now = Instant::now();
        let pauses: Vec<Duration> = (0..7).map(|_| backoff.fail(now, &config)).collect();
        let within =
            |pause: Duration, base: f64| (base * 0.8..=base * 1.2).contains(&pause.as_secs_f64());
        for (pause, base) in pauses.iter().zip([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]) {
            assert!(within(*pause, base), "{pause:?} vs {base}");
        }
        assert!(backoff.until.is_some_and(|until| until > now));
    }

    fn pool(config: ConnectionConfig) -> Pool {
        Pool::new("grpc://127.0.0.1:1", "http://127.0.0.1:1", config, None).expect("pool")
    }

    #[tokio::test]
    async fn the_pool_grows_when_its_connections_are_full_and_not_past_its_maximum() {
        let pool = pool(ConnectionConfig {
            max_connections: 3,
            streams_per_connection: 2,
            ..ConnectionConfig::default()
        });
        let leases: Vec<Lease> = (0..6).map(|_| pool.lease()).collect();
        assert_eq!(pool.loads(), [2, 2, 2], "two streams per connection");
        let extra = pool.lease();
        assert_eq!(pool.loads().len(), 3, "no fourth connection");
        assert_eq!(pool.loads().iter().sum::<u32>(), 7);
        drop((leases, extra));
        assert_eq!(pool.loads(), [0, 0, 0], "leases give their streams back");
    }

    #[tokio::test]
    async fn a_lower_server_limit_caps_the_streams_on_a_connection() {
        let pool = pool(ConnectionConfig {
            max_connections: 4,
            streams_per_connection: 100,
            ..ConnectionConfig::default()
        });
        let first = pool.lease();
        first.slot.link.advertised.store(1, Ordering::Relaxed);
        let second = pool.lease();
        assert_eq!(pool.loads(), [1, 1], "the server allows one stream");
        drop((first, second));
    }

    #[tokio::test]
    async fn one_connection_death_is_reported_once_per_epoch() {
        let pool = pool(ConnectionConfig::default());
        let (a, b) = (pool.lease(), pool.lease());
        assert!(pool.first_failure_since(&a), "the first report counts");
        assert!(!pool.first_failure_since(&b), "the same death, seen again");
        let later = pool.lease();
        assert!(pool.first_failure_since(&later), "a call leased after it");
        assert!(!pool.first_failure_since(&a));
    }

    #[tokio::test]
    async fn retiring_a_connection_replaces_it_once() {
        let pool = pool(ConnectionConfig::default());
        let (a, b) = (pool.lease(), pool.lease());
        pool.retire(&a);
        pool.retire(&b);
        let after = pool.lease();
        assert_eq!(after.generation, 1, "two reports, one replacement");
        pool.retire(&after);
        assert_eq!(pool.lease().generation, 2);
    }
}
