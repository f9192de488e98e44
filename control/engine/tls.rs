//! How `grpcs://` workers are dialled ([`WorkerTls`]), and a handshake
//! check that says why a worker refuses the gateway's TLS session.
//!
//! The connection pool (`pool`) makes the TLS session of every connection
//! to a `grpcs://` worker itself, with [`WorkerTls::rustls_config`], under
//! the HTTP/2 connection tonic drives (so that it can still read the
//! worker's SETTINGS); the check below uses the very same config.
//!
//! Why the check exists: over TLS 1.3 a server that wants a client
//! certificate and gets none (or one it does not trust) rejects it only
//! after the client has finished its handshake, with an alert the gRPC
//! client never reads: it reports "transport error: broken pipe". An
//! operator who forgot `--client-cert-path` deserves better. Before the
//! first RPC to a `grpcs://` worker (start-up discovery, a registration),
//! [`check_worker_tls`] makes one TLS session of its own with the same
//! roots and certificate, waits for the worker's first bytes, and turns
//! what went wrong into one sentence: the worker's certificate is not
//! trusted, the worker wants a client certificate, or it refused ours.

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::AsyncReadExt;

use super::client::dial_uri;
use crate::error::{Error, ErrorCode, Result};

/// How long the check waits for the TCP connection and the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long it waits after the handshake for the worker's first bytes (a
/// gRPC server sends its HTTP/2 settings at once; a refusal arrives as an
/// alert instead).
const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(2);

/// How `grpcs://` workers are dialled: the CA certificates their
/// certificates must chain to (none: the public web PKI roots), and the
/// gateway's own certificate for workers that ask for one (mTLS). The
/// default trusts the public roots and presents no certificate.
#[derive(Clone, Default)]
pub struct WorkerTls {
    /// PEM CA certificates (each may hold several).
    pub ca_pems: Vec<Vec<u8>>,
    /// PEM certificate chain and PEM private key.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for WorkerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerTls")
            .field("ca_pems", &self.ca_pems.len())
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

impl WorkerTls {
    /// These settings as a rustls client config (ring, TLS 1.2 and 1.3,
    /// ALPN h2): the roots a worker's certificate must chain to, and the
    /// client certificate for workers that ask for one.
    pub(super) fn rustls_config(&self) -> std::result::Result<rustls::ClientConfig, String> {
        let mut roots = rustls::RootCertStore::empty();
        if self.ca_pems.is_empty() {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        }
        for pem in &self.ca_pems {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|err| format!("a CA certificate: {err}"))?;
                roots
                    .add(cert)
                    .map_err(|err| format!("a CA certificate: {err}"))?;
            }
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|err| err.to_string())?
        .with_root_certificates(roots);
        let mut config = match &self.identity {
            Some((cert, key)) => {
                let chain = CertificateDer::pem_slice_iter(cert)
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|err| format!("the client certificate: {err}"))?;
                let key = PrivateKeyDer::from_pem_slice(key)
                    .map_err(|err| format!("the client key: {err}"))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|err| format!("the client certificate: {err}"))?
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(config)
    }
}

/// For a `grpcs://` worker at `url`: makes a TLS session as the gateway's
/// channels would and fails, saying why, when the worker's certificate is
/// not trusted or the worker refuses the session. Other URLs pass at once,
/// as do failures that are no TLS matter (nothing listening: the RPC that
/// follows reports it).
pub async fn check_worker_tls(url: &str, tls: &WorkerTls) -> Result<()> {
    let (uri, secure) = dial_uri(url)?;
    if !secure {
        return Ok(());
    }
    let refused = |why: String| {
        Error::new(
            ErrorCode::WorkerUnavailable,
            format!("worker {url}: TLS: {why}"),
        )
        .with_worker(url)
    };
    let authority = uri.trim_start_matches("https://");
    let name = server_name(authority).map_err(refused)?;
    let config = tls.rustls_config().map_err(refused)?;
    let connected =
        tokio::time::timeout(HANDSHAKE_TIMEOUT, tokio::net::TcpStream::connect(authority)).await;
    let Ok(Ok(tcp)) = connected else {
        // Unreachable: not a TLS problem.
        return Ok(());
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let mut session =
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, connector.connect(name, tcp)).await {
            Err(_) => return Err(refused("the handshake timed out".to_owned())),
            Ok(Err(err)) => {
                return Err(refused(format!(
                    "the handshake failed: {err}{}",
                    hint(&err.to_string(), tls)
                )));
            }
            Ok(Ok(session)) => session,
        };
    let mut first = [0u8; 1];
    match tokio::time::timeout(FIRST_BYTES_TIMEOUT, session.read(&mut first)).await {
        // Bytes (its HTTP/2 settings), or silence: the session stands.
        Ok(Ok(1..)) | Err(_) => Ok(()),
        Ok(Ok(0)) => Err(refused(format!(
            "the worker closed the session right after the handshake{}",
            hint("", tls)
        ))),
        Ok(Err(err)) => Err(refused(format!(
            "the worker refused the session: {err}{}",
            hint(&err.to_string(), tls)
        ))),
    }
}

/// The name a worker's certificate must carry, from its `host:port` (a DNS
/// name or an IP address, bracketed or not).
pub(super) fn server_name(authority: &str) -> std::result::Result<ServerName<'static>, String> {
    let host = authority
        .rsplit_once(':')
        .map_or(authority, |(host, _)| host)
        .trim_start_matches('[')
        .trim_end_matches(']');
    ServerName::try_from(host.to_owned())
        .map_err(|err| format!("{host:?} is no server name: {err}"))
}

/// What an operator likely has to change, from what went wrong.
fn hint(error: &str, tls: &WorkerTls) -> &'static str {
    let error = error.to_ascii_lowercase();
    if error.contains("unknownissuer") || error.contains("unknown issuer") {
        if tls.ca_pems.is_empty() {
            " (the worker's certificate is not from a public CA: trust its CA)"
        } else {
            " (the worker's certificate does not chain to the trusted CAs)"
        }
    } else if error.contains("notvalidforname") || error.contains("not valid for name") {
        " (the worker's certificate does not name the host in its URL)"
    } else if tls.identity.is_none() {
        " (does the worker require a client certificate? none is configured)"
    } else if error.contains("certificate") || error.is_empty() {
        " (does the worker trust the CA of the gateway's client certificate?)"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn plaintext_and_unreachable_workers_pass_the_check() {
        let tls = WorkerTls::default();
        check_worker_tls("grpc://127.0.0.1:1", &tls)
            .await
            .expect("no TLS to check");
        check_worker_tls("grpcs://127.0.0.1:1", &tls)
            .await
            .expect("nothing listens: the RPC says so, not the check");
    }

    #[test]
    fn server_names_come_from_the_host() {
        let dns = server_name("worker-3:50051").expect("a DNS name");
        assert_eq!(dns.to_str(), "worker-3");
        let v4 = server_name("127.0.0.1:50051").expect("an IPv4 address");
        assert!(matches!(v4, ServerName::IpAddress(_)), "{v4:?}");
        let v6 = server_name("[::1]:50051").expect("an IPv6 address");
        assert!(matches!(v6, ServerName::IpAddress(_)), "{v6:?}");
        assert!(server_name("bad_name!:1").is_err());
    }

    #[test]
    fn hints_name_the_side_to_fix() {
        let none = WorkerTls::default();
        let with_identity = WorkerTls {
            ca_pems: vec![b"pem".to_vec()],
            identity: Some((Vec::new(), Vec::new())),
        };
        assert!(hint("invalid peer certificate: UnknownIssuer", &none).contains("public CA"));
        assert!(
            hint("invalid peer certificate: UnknownIssuer", &with_identity).contains("trusted CAs")
        );
        assert!(
            hint("received fatal alert: CertificateRequired", &none).contains("client certificate")
        );
        assert!(hint("received fatal alert: BadCertificate", &with_identity).contains("trust"));
    }
}
