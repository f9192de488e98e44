//! TLS: HTTPS on the gateway's listeners, certificate reload on SIGHUP, and
//! the files `grpcs://` workers are dialled with.
//!
//! Why it exists: a gateway on a network carries prompts and keys, and its
//! certificates are short-lived (an ACME client or cert-manager renews them
//! every few weeks). Restarting to pick a renewed certificate up would cut
//! every stream, so the certificate lives behind a [`ReloadableCert`]:
//! rustls asks it for the certificate at each handshake, and SIGHUP swaps
//! what it answers. New connections get the new certificate; established
//! ones keep the session they negotiated. A reload that fails (a half-written
//! file, a key that does not match) keeps the old certificate and says why.
//!
//! rustls runs on ring, the provider the rest of the build (reqwest, tonic)
//! already uses. Listeners offer HTTP/2 and HTTP/1.1 by ALPN.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_rustls::TlsAcceptor;

use crate::config::{TlsFiles, WorkerTlsFiles};
use crate::engine::WorkerTls;

/// `smg_tls_reloads_total{outcome}`: SIGHUP reloads, `ok` or `failed`.
pub(crate) use crate::metrics::TLS_RELOADS;

/// Why certificate or key files cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} holds no PEM certificate", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{} is not a PEM certificate chain: {reason}", path.display())]
    BadCertificate { path: PathBuf, reason: String },
    #[error("{} holds no usable PEM private key: {reason}", path.display())]
    BadKey { path: PathBuf, reason: String },
    #[error("the key in {} does not belong to the certificate in {}: {reason}", key.display(), cert.display())]
    Mismatch {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
    #[error("TLS setup: {0}")]
    Setup(String),
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// The PEM certificates in `path`, leaf first.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| TlsError::BadCertificate {
            path: path.to_owned(),
            reason: err.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(chain)
}

fn provider() -> CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// Loads and checks a certificate chain and its key.
pub(crate) fn load_certified_key(files: &TlsFiles) -> Result<CertifiedKey, TlsError> {
    let chain = certificates(&files.cert_path)?;
    let key_pem = read(&files.key_path)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|err| TlsError::BadKey {
        path: files.key_path.clone(),
        reason: err.to_string(),
    })?;
    CertifiedKey::from_der(chain, key, &provider()).map_err(|err| TlsError::Mismatch {
        cert: files.cert_path.clone(),
        key: files.key_path.clone(),
        reason: err.to_string(),
    })
}

/// The certificate the listeners present, swapped by [`ReloadableCert::reload`].
#[derive(Debug)]
pub(crate) struct ReloadableCert {
    files: TlsFiles,
    current: RwLock<Arc<CertifiedKey>>,
}

impl ReloadableCert {
    /// Loads `files` (start-up fails if they cannot be used).
    pub(crate) fn load(files: &TlsFiles) -> Result<Arc<Self>, TlsError> {
        let key = load_certified_key(files)?;
        Ok(Arc::new(Self {
            files: files.clone(),
            current: RwLock::new(Arc::new(key)),
        }))
    }

    /// Reads the files again; on success new handshakes get the new
    /// certificate, on failure the old one stays.
    pub(crate) fn reload(&self) -> Result<(), TlsError> {
        let key = Arc::new(load_certified_key(&self.files)?);
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = key;
        Ok(())
    }

    /// An acceptor whose handshakes present the current certificate,
    /// offering HTTP/2 and HTTP/1.1.
    pub(crate) fn acceptor(self: &Arc<Self>) -> Result<TlsAcceptor, TlsError> {
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(provider()))
            .with_safe_default_protocol_versions()
            .map_err(|err| TlsError::Setup(err.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(self) as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

impl ResolvesServerCert for ReloadableCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(
            &self.current.read().unwrap_or_else(PoisonError::into_inner),
        ))
    }
}

/// Reloads `cert` on every SIGHUP, for as long as the process runs. The
/// handler is installed before this returns, so a SIGHUP after it never
/// ends the process (the default action).
pub(crate) fn reload_on_sighup(cert: Arc<ReloadableCert>) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangups = signal(SignalKind::hangup())?;
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            match cert.reload() {
                Ok(()) => {
                    metrics::counter!(TLS_RELOADS, "outcome" => "ok").increment(1);
                    tracing::info!(
                        cert = %cert.files.cert_path.display(),
                        "tls: certificate reloaded; new connections get it"
                    );
                }
                Err(err) => {
                    metrics::counter!(TLS_RELOADS, "outcome" => "failed").increment(1);
                    tracing::warn!(%err, "tls: reload failed; keeping the current certificate");
                }
            }
        }
    });
    Ok(())
}

/// Reads the files `grpcs://` workers are dialled with, checking each
/// (a bad file fails start-up, not the first request).
pub(crate) fn load_worker_tls(files: &WorkerTlsFiles) -> Result<WorkerTls, TlsError> {
    let mut ca_pems = Vec::new();
    for path in &files.ca_cert_paths {
        certificates(path)?;
        ca_pems.push(read(path)?);
    }
    let identity = match &files.client {
        Some(client) => {
            load_certified_key(client)?;
            Some((read(&client.cert_path)?, read(&client.key_path)?))
        }
        None => None,
    };
    Ok(WorkerTls { ca_pems, identity })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate for `name` and its key, as PEM files in
    /// `dir`.
    fn self_signed(dir: &Path, stem: &str, name: &str) -> TlsFiles {
        let cert = rcgen::generate_simple_self_signed(vec![name.to_owned()]).expect("a cert");
        let files = TlsFiles {
            cert_path: dir.join(format!("{stem}.pem")),
            key_path: dir.join(format!("{stem}.key")),
        };
        std::fs::write(&files.cert_path, cert.cert.pem()).expect("written");
        std::fs::write(&files.key_path, cert.signing_key.serialize_pem()).expect("written");
        files
    }

    fn served_name(cert: &ReloadableCert) -> Vec<u8> {
        cert.current
            .read()
            .expect("unpoisoned")
            .end_entity_cert()
            .expect("a leaf")
            .to_vec()
    }

    #[test]
    fn a_reload_swaps_the_certificate_and_a_failed_one_keeps_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let first = self_signed(dir.path(), "first", "one.example");
        let cert = ReloadableCert::load(&first).expect("loads");
        let before = served_name(&cert);

        // Renewed in place, as an ACME client does.
        let renewed = self_signed(dir.path(), "renewed", "two.example");
        std::fs::copy(&renewed.cert_path, &first.cert_path).expect("copied");
        std::fs::copy(&renewed.key_path, &first.key_path).expect("copied");
        cert.reload().expect("reloads");
        let after = served_name(&cert);
        assert_ne!(before, after);

        // A half-written file: the renewed certificate stays.
        std::fs::write(&first.cert_path, "-----BEGIN CERTIFICATE-----\nAAAA").expect("written");
        assert!(cert.reload().is_err());
        assert_eq!(served_name(&cert), after);
    }

    #[test]
    fn a_key_of_another_certificate_is_refused_naming_both_files() {
        let dir = tempfile::tempdir().expect("temp dir");
        let one = self_signed(dir.path(), "one", "one.example");
        let two = self_signed(dir.path(), "two", "two.example");
        let crossed = TlsFiles {
            cert_path: one.cert_path.clone(),
            key_path: two.key_path.clone(),
        };
        let err = load_certified_key(&crossed).expect_err("mismatched");
        assert!(matches!(err, TlsError::Mismatch { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("one.pem") && text.contains("two.key"),
            "{text}"
        );
    }

    #[test]
    fn missing_or_empty_files_are_refused_with_their_path() {
        let dir = tempfile::tempdir().expect("temp dir");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").expect("written");
        let files = TlsFiles {
            cert_path: empty.clone(),
            key_path: dir.path().join("absent.key"),
        };
        let err = load_certified_key(&files).expect_err("no certificate");
        assert!(matches!(err, TlsError::NoCertificate { .. }), "{err}");
        let worker = WorkerTlsFiles {
            ca_cert_paths: vec![dir.path().join("absent-ca.pem")],
            client: None,
        };
        let err = load_worker_tls(&worker).expect_err("no CA file");
        assert!(err.to_string().contains("absent-ca.pem"), "{err}");
    }
}
