//! TLS end to end: HTTPS on the gateway's listeners, certificate reload on
//! SIGHUP, and grpcs:// with mTLS to a simulated worker.
//!
//! Every certificate is made here at run time (`rcgen`): a test CA, leaf
//! certificates for `localhost`/`127.0.0.1` it signs, and a client
//! certificate for the gateway. Clients trust the test CA only. Which
//! certificate a connection got is read from its handshake; that a reload
//! happened is read from `smg_tls_reloads_total`, not assumed after a sleep.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use support::media::{metric, metrics_text};
use support::{Gateway, SimWorker, bounded, poll_until};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// A test CA and the files it issues, in a directory of the test's own.
struct Pki {
    dir: tempfile::TempDir,
    ca: CertifiedIssuer<'static, KeyPair>,
    ca_path: PathBuf,
}

/// A certificate and key on disk, and the certificate's DER.
struct Leaf {
    cert: PathBuf,
    key: PathBuf,
    der: Vec<u8>,
}

impl Pki {
    fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "smg test CA");
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("a key"))
            .expect("a CA");
        let dir = tempfile::tempdir().expect("temp dir");
        let ca_path = dir.path().join("ca.pem");
        std::fs::write(&ca_path, ca.pem()).expect("written");
        Self { dir, ca, ca_path }
    }

    /// A certificate for `names` signed by the CA, written as
    /// `<stem>.pem` and `<stem>.key`.
    fn issue(&self, stem: &str, names: &[&str]) -> Leaf {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("params");
        params.distinguished_name.push(DnType::CommonName, stem);
        let key = KeyPair::generate().expect("a key");
        let cert = params.signed_by(&key, &self.ca).expect("signed");
        let leaf = Leaf {
            cert: self.dir.path().join(format!("{stem}.pem")),
            key: self.dir.path().join(format!("{stem}.key")),
            der: cert.der().to_vec(),
        };
        std::fs::write(&leaf.cert, cert.pem()).expect("written");
        std::fs::write(&leaf.key, key.serialize_pem()).expect("written");
        leaf
    }

    /// A certificate for this host's loopback names.
    fn server(&self, stem: &str) -> Leaf {
        self.issue(stem, &["localhost", "127.0.0.1"])
    }

    fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(&self.ca_path).expect("the CA file")
    }
}

fn path(path: &Path) -> String {
    path.display().to_string()
}

/// An HTTPS client trusting the test CA only.
fn https_client(pki: &Pki) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&pki.ca_pem()).expect("CA"))
        .timeout(Duration::from_secs(30))
}

fn chat_body() -> Value {
    json!({
        "model": "model",
        "messages": [{"role": "user", "content": "Hello over TLS."}],
        "max_tokens": 4,
    })
}

/// A gateway serving HTTPS with `leaf` in front of a plain worker.
fn https_gateway(worker: &SimWorker, leaf: &Leaf) -> Gateway {
    Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--served-model-name",
        "model",
        "--tls-cert-path",
        &path(&leaf.cert),
        "--tls-key-path",
        &path(&leaf.key),
    ])
}

#[tokio::test]
async fn the_public_and_admin_listeners_speak_https_only() {
    let pki = Pki::new();
    let leaf = pki.server("gateway");
    let worker = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let gateway = https_gateway(&worker, &leaf);
    let url = |path: &str| format!("https://127.0.0.1:{}{path}", gateway.http.port());

    // HTTP/2 by ALPN, and HTTP/1.1 for clients that only speak it.
    for (client, version) in [
        (
            https_client(&pki).build().expect("client"),
            reqwest::Version::HTTP_2,
        ),
        (
            https_client(&pki).http1_only().build().expect("client"),
            reqwest::Version::HTTP_11,
        ),
    ] {
        let response = bounded(
            "an HTTPS chat",
            client
                .post(url("/v1/chat/completions"))
                .json(&chat_body())
                .send(),
        )
        .await
        .expect("answered over TLS");
        assert_eq!(response.version(), version);
        assert_eq!(response.status(), 200);
        let body: Value = response.json().await.expect("JSON");
        let content = body["choices"][0]["message"]["content"]
            .as_str()
            .expect("content");
        assert!(content.starts_with("digest="), "{body}");
    }
    let admin = https_client(&pki)
        .build()
        .expect("client")
        .get(format!(
            "https://127.0.0.1:{}/workers",
            gateway.admin.port()
        ))
        .send()
        .await
        .expect("the admin listener answers over TLS");
    assert_eq!(admin.status(), 200);

    // No plaintext on the TLS port, and no trust without the CA.
    let plain = support::media::http()
        .get(format!("http://{}/liveness", gateway.http))
        .send()
        .await;
    assert!(plain.is_err(), "{plain:?}");
    let untrusting = reqwest::Client::builder()
        .use_rustls_tls()
        .build()
        .expect("client")
        .get(url("/liveness"))
        .send()
        .await;
    assert!(untrusting.is_err(), "{untrusting:?}");
    // The probes stay plain HTTP on the metrics listener.
    let probe = support::media::http()
        .get(format!("http://{}/readiness", gateway.metrics))
        .send()
        .await
        .expect("answered");
    assert_eq!(probe.status(), 200);
}

/// A TLS client trusting the test CA only.
fn connector(pki: &Pki) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from(pki.ca.der().to_vec()))
        .expect("the CA");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
}

/// A TLS connection to `gateway`'s public listener, and the leaf
/// certificate it was shown.
async fn tls_connect(pki: &Pki, gateway: &Gateway) -> (TlsStream<TcpStream>, Vec<u8>) {
    let tcp = TcpStream::connect(gateway.http).await.expect("connect");
    let name = ServerName::try_from("localhost").expect("a name");
    let stream = bounded("the handshake", connector(pki).connect(name, tcp))
        .await
        .expect("a handshake");
    let leaf = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .expect("a certificate")
        .to_vec();
    (stream, leaf)
}

/// `GET /liveness` over an open (kept-alive) HTTP/1.1 connection: its status.
async fn liveness_over(stream: &mut TlsStream<TcpStream>) -> u16 {
    stream
        .write_all(b"GET /liveness HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .expect("sent");
    bounded("the answer", async {
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = stream.read(&mut buf).await.expect("read");
            assert!(n > 0, "the connection closed: {answer:?}");
            answer.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&answer);
            let Some((head, body)) = text.split_once("\r\n\r\n") else {
                continue;
            };
            let length: usize = head
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().ok())?
                })
                .expect("a content-length");
            if body.len() >= length {
                return head[9..12].parse().expect("a status");
            }
        }
    })
    .await
}

/// A connection over `--max-connections` on an HTTPS listener gets its
/// 503 inside a TLS session, as JSON with the code and `Retry-After`, then
/// the close; the held connection is still served.
#[tokio::test]
async fn an_https_connection_over_the_cap_is_answered_503_inside_tls() {
    let pki = Pki::new();
    let leaf = pki.server("gateway");
    let worker = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--tls-cert-path",
        &path(&leaf.cert),
        "--tls-key-path",
        &path(&leaf.key),
        "--max-connections",
        "1",
    ]);
    let (mut held, _) = tls_connect(&pki, &gateway).await;
    assert_eq!(liveness_over(&mut held).await, 200, "the held connection");

    let (mut over, _) = tls_connect(&pki, &gateway).await;
    over.write_all(b"GET /liveness HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .expect("sent");
    let answer = bounded("the refusal and the close", async {
        let mut answer = Vec::new();
        // The gateway closes the session after its answer; a reset after
        // the bytes are in is an end too.
        let _ = over.read_to_end(&mut answer).await;
        answer
    })
    .await;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text.split_once("\r\n\r\n").expect("a whole answer");
    assert!(head.starts_with("HTTP/1.1 503"), "{head}");
    assert!(head.contains("retry-after: 1"), "{head}");
    assert!(head.contains("connection: close"), "{head}");
    let body: Value = serde_json::from_str(body).expect("JSON");
    assert_eq!(body["error"]["code"], "too_many_connections", "{body}");

    assert_eq!(liveness_over(&mut held).await, 200, "still served");
}

async fn reloads(gateway: &Gateway, outcome: &str) -> f64 {
    let text = metrics_text(gateway).await;
    metric(
        &text,
        "smg_tls_reloads_total",
        &[&format!("outcome=\"{outcome}\"")],
    )
}

#[tokio::test]
async fn sighup_serves_a_new_certificate_to_new_connections_and_keeps_old_ones() {
    let pki = Pki::new();
    let first = pki.server("first");
    let worker = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let gateway = https_gateway(&worker, &first);

    let (mut old, shown) = tls_connect(&pki, &gateway).await;
    assert_eq!(shown, first.der);
    assert_eq!(liveness_over(&mut old).await, 200);

    // Renewed in place, as an ACME client does, then SIGHUP.
    let renewed = pki.server("renewed");
    std::fs::copy(&renewed.cert, &first.cert).expect("copied");
    std::fs::copy(&renewed.key, &first.key).expect("copied");
    gateway.signal(Signal::SIGHUP);
    poll_until("the reload", async || {
        (reloads(&gateway, "ok").await == 1.0).then_some(())
    })
    .await;

    let (mut new, shown) = tls_connect(&pki, &gateway).await;
    assert_eq!(
        shown, renewed.der,
        "a new connection gets the new certificate"
    );
    assert_eq!(liveness_over(&mut new).await, 200);
    assert_eq!(
        liveness_over(&mut old).await,
        200,
        "the old connection keeps working"
    );

    // A broken file on the next SIGHUP: the renewed certificate stays.
    std::fs::write(&first.cert, "-----BEGIN CERTIFICATE-----\nAAAA\n").expect("written");
    gateway.signal(Signal::SIGHUP);
    poll_until("the failed reload", async || {
        (reloads(&gateway, "failed").await == 1.0).then_some(())
    })
    .await;
    let (mut after, shown) = tls_connect(&pki, &gateway).await;
    assert_eq!(shown, renewed.der);
    assert_eq!(liveness_over(&mut after).await, 200);
}

/// A TokenSpeed worker serving gRPC over TLS with `leaf`, asking clients
/// for a certificate from the test CA.
fn mtls_worker(pki: &Pki, leaf: &Leaf) -> SimWorker {
    SimWorker::start(
        "tokenspeed",
        "regular",
        &[
            "--zero-delay",
            "--tls-cert-path",
            &path(&leaf.cert),
            "--tls-key-path",
            &path(&leaf.key),
            "--client-ca-path",
            &path(&pki.ca_path),
        ],
    )
}

#[tokio::test]
async fn grpcs_with_mtls_reaches_the_worker_and_no_client_certificate_is_refused_at_start_up() {
    let pki = Pki::new();
    let worker_leaf = pki.server("worker");
    let client = pki.issue("gateway-client", &["smg-gateway"]);
    let worker = mtls_worker(&pki, &worker_leaf);
    let url = format!("grpcs://{}", worker.grpc);
    let ca = path(&pki.ca_path);

    let gateway = Gateway::start(&[
        "--worker-urls",
        &url,
        "--served-model-name",
        "model",
        "--ca-cert-path",
        &ca,
        "--client-cert-path",
        &path(&client.cert),
        "--client-key-path",
        &path(&client.key),
    ]);
    let response = support::media::http()
        .post(gateway.url("/v1/chat/completions"))
        .json(&chat_body())
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("JSON");
    assert!(
        body["choices"][0]["message"]["content"]
            .as_str()
            .is_some_and(|c| c.starts_with("digest=")),
        "{body}"
    );
    drop(gateway);

    // Without its client certificate the gateway cannot discover the
    // worker, and says so.
    let (status, stderr) = Gateway::fail_to_start(&["--worker-urls", &url, "--ca-cert-path", &ca]);
    assert!(!status.success());
    assert!(stderr.contains(&url), "{stderr}");
    assert!(
        stderr.contains("CertificateRequired")
            && stderr.contains("does the worker require a client certificate"),
        "{stderr}"
    );

    // Nor without trusting the worker's CA.
    let (status, stderr) = Gateway::fail_to_start(&[
        "--worker-urls",
        &url,
        "--client-cert-path",
        &path(&client.cert),
        "--client-key-path",
        &path(&client.key),
    ]);
    assert!(!status.success());
    assert!(
        stderr.contains("UnknownIssuer") && stderr.contains("not from a public CA"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_pooled_connection_to_a_grpcs_worker_is_an_mtls_session() {
    // The worker allows 2 streams per connection (SETTINGS, which the pool
    // can only read inside the TLS session) and ends each connection with a
    // GOAWAY after 6 streams: a burst needs several connections, and new
    // ones after the GOAWAYs, each its own mTLS handshake.
    let pki = Pki::new();
    let worker_leaf = pki.server("worker");
    let client = pki.issue("gateway-client", &["smg-gateway"]);
    let worker = SimWorker::start(
        "tokenspeed",
        "regular",
        &[
            "--decode-ms-per-token",
            "20",
            "--max-concurrent-streams",
            "2",
            "--goaway-after-streams",
            "6",
            "--tls-cert-path",
            &path(&worker_leaf.cert),
            "--tls-key-path",
            &path(&worker_leaf.key),
            "--client-ca-path",
            &path(&pki.ca_path),
        ],
    );
    let gateway = Gateway::start(&[
        "--worker-urls",
        &format!("grpcs://{}", worker.grpc),
        "--served-model-name",
        "model",
        "--worker-connections",
        "4",
        "--ca-cert-path",
        &path(&pki.ca_path),
        "--client-cert-path",
        &path(&client.cert),
        "--client-key-path",
        &path(&client.key),
    ]);
    let chat = async || {
        support::media::http()
            .post(gateway.url("/v1/chat/completions"))
            .json(&chat_body())
            .send()
            .await
            .expect("answered")
            .status()
    };
    // One request first, so the first connection's SETTINGS are known.
    assert_eq!(chat().await, 200);
    let statuses = bounded(
        "a burst over grpcs",
        futures::future::join_all((0..16).map(|_| chat())),
    )
    .await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");

    let text = metrics_text(&gateway).await;
    let connections = metric(&text, "smg_worker_connections", &[]);
    let connected = metric(
        &text,
        "smg_worker_connects_total",
        &["outcome=\"connected\""],
    );
    let failed = metric(&text, "smg_worker_connects_total", &["outcome=\"failed\""]);
    println!(
        "{connections} pooled connections, {connected} TLS sessions, {} failed",
        failed.abs()
    );
    assert!(
        connections >= 2.0,
        "the pool read the worker's 2-stream limit through TLS: {connections}"
    );
    assert!(connected > connections, "GOAWAYs led to new sessions");
    assert_eq!(failed, 0.0, "every handshake succeeded");
}

#[tokio::test]
async fn unusable_certificate_files_fail_start_up_naming_the_file() {
    let pki = Pki::new();
    let one = pki.server("one");
    let two = pki.server("two");
    let (status, stderr) = Gateway::fail_to_start(&[
        "--worker-urls",
        "grpc://127.0.0.1:1",
        "--tls-cert-path",
        &path(&one.cert),
        "--tls-key-path",
        &path(&two.key),
    ]);
    assert!(!status.success());
    assert!(stderr.contains("two.key"), "{stderr}");
    let (status, stderr) = Gateway::fail_to_start(&[
        "--worker-urls",
        "grpc://127.0.0.1:1",
        "--tls-cert-path",
        &path(&one.cert),
    ]);
    assert_eq!(status.code(), Some(2));
    assert!(stderr.contains("--tls-key-path"), "{stderr}");
}

/// `GET /workers/{id}` on the admin listener, until `done` holds.
async fn registration(gateway: &Gateway, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let url = gateway.admin_url(&format!("/workers/{id}"));
    poll_until("the registration settles", async || {
        let status: Value = support::media::http()
            .get(&url)
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        done(&status).then_some(status)
    })
    .await
}

async fn register(gateway: &Gateway, url: &str) -> String {
    let answer: Value = support::media::http()
        .post(gateway.admin_url("/workers"))
        .json(&json!({"url": url}))
        .send()
        .await
        .expect("the admin listener answers")
        .json()
        .await
        .expect("JSON");
    answer["id"].as_str().expect("a job id").to_owned()
}

#[tokio::test]
async fn a_grpcs_worker_registered_at_run_time_is_dialled_with_the_gateways_certificate() {
    let pki = Pki::new();
    let client = pki.issue("gateway-client", &["smg-gateway"]);
    let plain = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let secure = mtls_worker(&pki, &pki.server("worker"));
    let url = format!("grpcs://{}", secure.grpc);
    let ca = path(&pki.ca_path);

    let gateway = Gateway::start(&[
        "--worker-urls",
        &plain.grpc_url(),
        "--served-model-name",
        "model",
        "--ca-cert-path",
        &ca,
        "--client-cert-path",
        &path(&client.cert),
        "--client-key-path",
        &path(&client.key),
        "--health-check-interval-secs",
        "1",
        "--health-success-threshold",
        "1",
    ]);
    let id = register(&gateway, &url).await;
    // Ready: its health probes, too, went over mTLS.
    let status = registration(&gateway, &id, |s| {
        s["status"] == "ready" || s["status"] == "registration_failed"
    })
    .await;
    assert_eq!(status["status"], "ready", "{status}");

    // Without a client certificate the registration fails, saying why.
    let without = Gateway::start(&[
        "--worker-urls",
        &plain.grpc_url(),
        "--served-model-name",
        "model",
        "--ca-cert-path",
        &ca,
    ]);
    let id = register(&without, &url).await;
    let status = registration(&without, &id, |s| s["status"] != "registering").await;
    assert_eq!(status["status"], "registration_failed", "{status}");
    let error = status["error"].as_str().expect("an error");
    assert!(error.contains("CertificateRequired"), "{error}");
}
