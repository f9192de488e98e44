//! The worker's HTTP/2 server: hyper driven by hand around tonic's routes,
//! instead of `tonic::transport::Server`, so that the connection faults a
//! real engine's server (or a proxy in front of it) plays are ours to play.
//!
//! Why it exists: the gateway must survive its workers ending connections
//! (max connection age, restarts, overload protection), and tonic's server
//! can only end them by age. Here a connection can be ended after it has
//! taken N streams or every N milliseconds, either gracefully (HTTP/2
//! GOAWAY: the streams the server took finish, those it never saw are
//! refused and the client must resend them) or abruptly (the socket closes
//! under every stream). The server can also advertise
//! `SETTINGS_MAX_CONCURRENT_STREAMS` as engines do, and accept slowly.
//!
//! With `--tls-cert-path` each connection is a TLS session first (rustls,
//! ALPN h2; with `--client-ca-path` the client must present a certificate
//! chaining to that CA), and the faults play on the HTTP/2 connection inside
//! it: an abrupt end drops the session without a close_notify.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tonic::service::Routes;
use tower::ServiceExt as _;

/// How the server treats its connections (`smg-sim-worker` fault flags).
#[derive(Debug, Clone, Copy, Default)]
pub struct ConnectionFaults {
    /// End each connection once it has taken this many streams.
    pub goaway_after_streams: Option<u32>,
    /// End each connection this long after it was accepted, then the next
    /// one this long after that, and so on.
    pub goaway_every: Option<Duration>,
    /// End connections by closing the socket (no GOAWAY, streams fail)
    /// instead of a graceful GOAWAY.
    pub abrupt: bool,
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`; `None` advertises no limit.
    pub max_concurrent_streams: Option<u32>,
    /// How long a new connection waits before the server speaks on it.
    pub accept_delay: Duration,
}

/// HTTP/2 keepalive pings, as the gateway and engines use them.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long a client may take over its TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The server's TLS: the PEM certificate chain `cert` and its PEM `key`;
/// with `client_ca` (PEM), clients must present a certificate chaining to
/// it (mTLS). HTTP/2 only, by ALPN, as gRPC servers do.
pub fn tls_server_config(
    cert: &[u8],
    key: &[u8],
    client_ca: Option<&[u8]>,
) -> Result<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca) {
                roots
                    .add(cert.context("a client CA certificate")?)
                    .context("a client CA certificate")?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .context("the client CA")?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .context("the certificate")?;
    let key = PrivateKeyDer::from_pem_slice(key).context("the private key")?;
    let mut config = builder
        .with_single_cert(chain, key)
        .context("the certificate and key")?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// Serves `routes` on `listener` (over TLS when `tls` is given) until
/// `shutdown` resolves; then ends every connection gracefully and waits for
/// their streams to finish.
pub async fn serve(
    listener: TcpListener,
    routes: Routes,
    faults: ConnectionFaults,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let (stop, stopping) = watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let socket = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((socket, _)) => socket,
                Err(err) => {
                    tracing::warn!(%err, "accept failed");
                    continue;
                }
            },
        };
        // Reap finished connections so the set stays small.
        while connections.try_join_next().is_some() {}
        connections.spawn(accept_connection(
            socket,
            routes.clone(),
            faults,
            tls.clone(),
            stopping.clone(),
        ));
    }
    let _ = stop.send(true);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// One accepted socket: the accept delay, the TLS handshake if any, then
/// its HTTP/2 connection.
async fn accept_connection(
    socket: TcpStream,
    routes: Routes,
    faults: ConnectionFaults,
    tls: Option<tokio_rustls::TlsAcceptor>,
    stopping: watch::Receiver<bool>,
) {
    if let Err(err) = socket.set_nodelay(true) {
        tracing::debug!(%err, "cannot set TCP_NODELAY");
    }
    if !faults.accept_delay.is_zero() {
        tokio::time::sleep(faults.accept_delay).await;
    }
    let Some(tls) = tls else {
        return serve_connection(socket, routes, faults, stopping).await;
    };
    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, tls.accept(socket)).await {
        Ok(Ok(session)) => serve_connection(session, routes, faults, stopping).await,
        Ok(Err(err)) => tracing::info!(%err, "TLS handshake failed"),
        Err(_) => tracing::info!("TLS handshake timed out"),
    }
}

/// One connection, ended as `faults` say.
async fn serve_connection<I>(
    io: I,
    routes: Routes,
    faults: ConnectionFaults,
    mut stopping: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let taken = Arc::new(AtomicU32::new(0));
    let enough = Arc::new(Notify::new());
    let service = {
        let (taken, enough) = (Arc::clone(&taken), Arc::clone(&enough));
        hyper::service::service_fn(move |request: http::Request<Incoming>| {
            let count = taken.fetch_add(1, Ordering::Relaxed) + 1;
            if faults.goaway_after_streams == Some(count) {
                enough.notify_one();
            }
            routes.clone().oneshot(request)
        })
    };
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .keep_alive_interval(KEEPALIVE_INTERVAL)
        .max_concurrent_streams(faults.max_concurrent_streams)
        // Engines allow 256 MiB messages; big frames make them cheaper.
        .max_frame_size(1 << 20);
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let mut ending = false;
    let mut age = faults
        .goaway_every
        .map(|every| Box::pin(tokio::time::sleep(every)));
    loop {
        let end = tokio::select! {
            result = &mut connection => {
                if let Err(err) = result {
                    tracing::debug!(%err, "connection ended with an error");
                }
                return;
            }
            () = enough.notified(), if !ending => true,
            () = async { if let Some(age) = age.as_mut() { age.await } }, if age.is_some() && !ending => {
                age = None;
                true
            }
            changed = stopping.changed(), if !ending => {
                if changed.is_err() || *stopping.borrow() {
                    ending = true;
                    connection.as_mut().graceful_shutdown();
                }
                false
            }
        };
        if !end {
            continue;
        }
        if faults.abrupt {
            tracing::info!(
                streams = taken.load(Ordering::Relaxed),
                "closing a connection abruptly"
            );
            // Dropping the connection closes the socket under its streams.
            return;
        }
        tracing::info!(streams = taken.load(Ordering::Relaxed), "sending GOAWAY");
        ending = true;
        connection.as_mut().graceful_shutdown();
    }
}
