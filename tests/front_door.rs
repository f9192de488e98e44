//! The front door end to end: a real `smg launch` in front of a simulated
//! worker, called over real sockets. API keys and tenants, control-plane
//! keys and the admin listener, body and head limits, the slow-head and
//! keep-alive timers, the connection cap, request ids and CORS.
//!
//! Refusals are checked for their JSON (`error.code`), not only their
//! status. Raw sockets stand in for clients no HTTP library would be
//! (one that trickles its head, one that holds connections open).

mod support;

use std::time::Duration;

use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use support::media::{metric, metrics_text};
use support::{Gateway, SimWorker, bounded};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("http client")
}

fn start_worker() -> SimWorker {
    SimWorker::start("tokenspeed", "regular", &["--zero-delay"])
}

fn chat_body() -> Value {
    json!({
        "model": "model",
        "messages": [{"role": "user", "content": "Hello, front door."}],
        "max_tokens": 4,
    })
}

/// A status, the response's headers and its JSON body (`Null` if none).
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Value,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

async fn send(request: reqwest::RequestBuilder) -> Answer {
    let response = bounded("a request", request.send())
        .await
        .expect("the gateway answers");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.json().await.unwrap_or(Value::Null);
    Answer {
        status,
        headers,
        body,
    }
}

async fn chat(gateway: &Gateway, headers: &[(&str, &str)]) -> Answer {
    let mut request = http()
        .post(gateway.url("/v1/chat/completions"))
        .json(&chat_body());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    send(request).await
}

/// Checks Anthropic's error shape and its error type.
fn assert_anthropic(answer: &Answer, status: u16, kind: &str) {
    assert_eq!(answer.status, status, "{}", answer.body);
    assert_eq!(answer.body["type"], "error", "{}", answer.body);
    let error = &answer.body["error"];
    assert_eq!(error["type"], kind, "{}", answer.body);
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
    let keys: Vec<&String> = answer.body.as_object().expect("an object").keys().collect();
    assert_eq!(keys, ["type", "error"], "{}", answer.body);
}

/// Checks the OpenAI error shape and the code.
fn assert_refused(answer: &Answer, status: u16, code: &str) {
    assert_eq!(answer.status, status, "{}", answer.body);
    let error = &answer.body["error"];
    assert_eq!(error["code"], code, "{}", answer.body);
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
    assert!(error["type"].is_string(), "{}", answer.body);
    assert!(
        error.as_object().is_some_and(|e| e.contains_key("param")),
        "{}",
        answer.body
    );
}

// ----------------------------------------------------------------------------
// Authentication
// ----------------------------------------------------------------------------

#[tokio::test]
async fn without_keys_inference_is_open_and_admin_routes_stay_on_the_loopback_listener() {
    let worker = start_worker();
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("smg.log");
    let gateway = Gateway::start_logged(
        &["--worker-urls", &worker.grpc_url(), "--log-json"],
        "warn,smg::audit=info",
        &log,
    );
    assert_ne!(gateway.admin, gateway.http, "an admin listener of its own");
    assert!(gateway.admin.ip().is_loopback());

    let answer = chat(&gateway, &[]).await;
    assert_eq!(answer.status, 200, "{}", answer.body);

    for (method, path) in [
        (reqwest::Method::GET, "/workers"),
        (reqwest::Method::POST, "/workers"),
        (reqwest::Method::GET, "/workers/0123456789abcdef"),
        (reqwest::Method::DELETE, "/workers/0123456789abcdef"),
    ] {
        let answer = send(
            http()
                .request(method.clone(), gateway.url(path))
                .json(&json!({"url": "grpc://127.0.0.1:1"})),
        )
        .await;
        assert_refused(&answer, 404, "not_found");
    }
    let listed = send(http().get(gateway.admin_url("/workers"))).await;
    assert_eq!(listed.status, 200);
    assert_eq!(listed.body["workers"].as_array().map(Vec::len), Some(1));
    let inference = send(
        http()
            .post(gateway.admin_url("/v1/chat/completions"))
            .json(&chat_body()),
    )
    .await;
    assert_refused(&inference, 404, "not_found");

    // Changes through the admin listener are audited with the caller's address.
    let removed = send(http().delete(gateway.admin_url("/workers/0123456789abcdef"))).await;
    assert_refused(&removed, 404, "worker_not_found");
    let line = audit_line(
        &log,
        json!({"action": "DELETE /workers/0123456789abcdef", "outcome": "failed"}),
    )
    .await;
    let who = line["fields"]["who"].as_str().unwrap_or("");
    assert!(
        who.starts_with("admin listener client 127.0.0.1:"),
        "{line}"
    );
}

#[tokio::test]
async fn api_keys_admit_their_tenants_and_refuse_everyone_else() {
    let worker = start_worker();
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--api-key",
        "sk-main",
        "--tenant-api-key",
        "team-a:sk-a",
    ]);
    for headers in [
        vec![],
        vec![("authorization", "Bearer sk-wrong")],
        vec![("authorization", "sk-main")],
        vec![("x-api-key", "sk-a")],
    ] {
        let answer = chat(&gateway, &headers).await;
        assert_refused(&answer, 401, "invalid_api_key");
        assert_eq!(answer.header("www-authenticate"), Some("Bearer"));
    }
    for (key, _tenant) in [
        ("sk-main", "default"),
        ("sk-a", "team-a"),
        ("sk-a", "team-a"),
    ] {
        let answer = chat(&gateway, &[("authorization", &format!("Bearer {key}"))]).await;
        assert_eq!(answer.status, 200, "{key}: {}", answer.body);
        assert!(answer.body["choices"][0]["message"]["content"].is_string());
    }

    // /v1/models is an inference route (as in OpenAI); health stays open.
    let models = send(http().get(gateway.url("/v1/models"))).await;
    assert_refused(&models, 401, "invalid_api_key");
    let models = send(http().get(gateway.url("/v1/models")).bearer_auth("sk-a")).await;
    assert_eq!(models.status, 200);
    for path in ["/health", "/liveness", "/readiness"] {
        assert_eq!(
            send(http().get(gateway.url(path))).await.status,
            200,
            "{path}"
        );
    }
    let metrics = metrics_text(&gateway).await;
    assert_eq!(
        metric(
            &metrics,
            "smg_http_tenant_requests_total",
            &["tenant=\"team-a\"", "status=\"200\""]
        ),
        3.0,
        "two chats and /v1/models:\n{metrics}"
    );
    assert_eq!(
        metric(
            &metrics,
            "smg_http_tenant_requests_total",
            &["tenant=\"default\""]
        ),
        1.0
    );
    assert!(
        metric(
            &metrics,
            "smg_http_refusals_total",
            &["code=\"invalid_api_key\""]
        ) >= 5.0
    );

    // Anthropic clients send `x-api-key`; Bearer works there too.
    let message =
        json!({"model": "model", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]});
    for (header, value, status) in [
        ("x-api-key", "sk-a", 200),
        ("authorization", "Bearer sk-main", 200),
        ("x-api-key", "sk-wrong", 401),
    ] {
        let answer = send(
            http()
                .post(gateway.url("/v1/messages"))
                .header(header, value)
                .json(&message),
        )
        .await;
        assert_eq!(answer.status, status, "{header}: {}", answer.body);
        if status == 401 {
            // In Anthropic's shape, as every error of this route.
            assert_eq!(
                answer.body,
                json!({"type": "error", "error": {"type": "authentication_error",
                    "message": "the API key is not valid"}})
            );
            assert_eq!(answer.header("www-authenticate"), Some("Bearer"));
        } else {
            assert_eq!(answer.body["type"], "message", "{}", answer.body);
        }
    }
}

/// The audit lines written so far (the gateway logs JSON lines).
fn audit_lines(log: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["target"] == "smg::audit")
        .collect()
}

/// Waits (bounded) for an audit line whose fields include `fields`.
async fn audit_line(log: &std::path::Path, fields: Value) -> Value {
    let wanted = fields.as_object().expect("fields").clone();
    bounded("an audit line", async {
        loop {
            if let Some(line) = audit_lines(log).into_iter().find(|line| {
                wanted
                    .iter()
                    .all(|(name, value)| &line["fields"][name] == value)
            }) {
                return line;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

#[tokio::test]
async fn control_plane_keys_put_admin_routes_on_the_public_port_by_role_and_audit_changes() {
    let worker = start_worker();
    let spare = start_worker();
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("smg.log");
    let gateway = Gateway::start_logged(
        &[
            "--worker-urls",
            &worker.grpc_url(),
            "--control-plane-api-keys",
            "ops:alice:admin:cp-admin",
            "dash:grafana:viewer:cp-view",
            "--disable-health-check",
            "--log-json",
        ],
        "warn,smg::audit=info",
        &log,
    );
    assert_eq!(
        gateway.admin, gateway.http,
        "admin routes on the public port"
    );

    let workers = gateway.url("/workers");
    let registration = json!({"url": spare.grpc_url()});
    assert_refused(&send(http().get(&workers)).await, 401, "invalid_api_key");
    assert_refused(
        &send(http().get(&workers).bearer_auth("cp-wrong")).await,
        401,
        "invalid_api_key",
    );
    let listed = send(http().get(&workers).bearer_auth("cp-view")).await;
    assert_eq!(listed.status, 200, "a viewer reads");
    assert_eq!(listed.body["workers"].as_array().map(Vec::len), Some(1));
    let refused = send(
        http()
            .post(&workers)
            .bearer_auth("cp-view")
            .json(&registration),
    )
    .await;
    assert_refused(&refused, 403, "permission_denied");
    let denied = audit_line(
        &log,
        json!({"action": "POST /workers", "outcome": "denied", "code": "permission_denied"}),
    )
    .await;
    assert_eq!(denied["level"], "WARN", "{denied}");

    let added = send(
        http()
            .post(&workers)
            .bearer_auth("cp-admin")
            .json(&registration),
    )
    .await;
    assert_eq!(
        added.status, 202,
        "an admin changes the fleet: {}",
        added.body
    );
    let line = audit_line(
        &log,
        json!({"message": "admin change", "action": "POST /workers"}),
    )
    .await;
    assert_eq!(line["fields"]["who"], "key ops (alice, admin)", "{line}");
    assert_eq!(line["fields"]["outcome"], "done", "{line}");
    assert_eq!(line["fields"]["status"], 202, "{line}");

    let id = added.body["id"].as_str().expect("the new worker's id");
    // Registration goes on in the background; a worker is deleted once it
    // is registered.
    bounded("the registration", async {
        loop {
            let shown = send(
                http()
                    .get(gateway.url(&format!("/workers/{id}")))
                    .bearer_auth("cp-view"),
            )
            .await;
            if shown.status == 200 && shown.body["status"] != "registering" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let removed = send(
        http()
            .delete(gateway.url(&format!("/workers/{id}")))
            .bearer_auth("cp-admin"),
    )
    .await;
    assert_eq!(removed.status, 202, "{}", removed.body);
    audit_line(
        &log,
        json!({"action": format!("DELETE /workers/{id}"), "outcome": "done"}),
    )
    .await;
    let duplicate = send(
        http()
            .post(&workers)
            .bearer_auth("cp-admin")
            .json(&json!({"url": worker.grpc_url()})),
    )
    .await;
    assert_eq!(duplicate.status, 409, "{}", duplicate.body);
    audit_line(&log, json!({"outcome": "failed", "status": 409})).await;
    let changes: Vec<Value> = audit_lines(&log)
        .into_iter()
        .filter(|line| line["fields"]["message"] == "admin change")
        .collect();
    assert_eq!(changes.len(), 3, "reads are not audited: {changes:?}");

    // Inference needs no key here: none is configured for it.
    assert_eq!(chat(&gateway, &[]).await.status, 200);
}

// ----------------------------------------------------------------------------
// Limits
// ----------------------------------------------------------------------------

/// A PNG of `side`² pixels of 16-bit RGBA noise: 8 bytes a pixel that no
/// compressor shrinks, like the sensor noise of a large photo.
fn noise_png(side: u32) -> Vec<u8> {
    let mut pixels = vec![0u8; side as usize * side as usize * 8];
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for chunk in pixels.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
    }
    let mut png = Vec::with_capacity(pixels.len() + 64 * 1024);
    let mut encoder = png::Encoder::new(&mut png, side, side);
    encoder.set_color(png::ColorType::Rgba);
    encoder.set_depth(png::BitDepth::Sixteen);
    encoder.set_compression(png::Compression::NoCompression);
    let mut writer = encoder.write_header().expect("png header");
    writer.write_image_data(&pixels).expect("png data");
    writer.finish().expect("png end");
    png
}

#[tokio::test]
async fn a_20_mb_photo_is_accepted_with_the_default_limits() {
    use base64::Engine as _;
    let worker = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--multimodal-tensor-transport",
        "inline",
    ]);
    let photo = noise_png(1600);
    assert!(photo.len() > 20_000_000, "{} bytes", photo.len());
    let url = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(&photo)
    );
    let body = json!({
        "model": "model",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "What is in the picture?"},
        ]}],
    });
    let answer = send(http().post(gateway.url("/v1/chat/completions")).json(&body)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    // 1600² resizes to 1596² (multiples of 28): 57² merged patches, one
    // image token each, reached the worker with the prompt.
    let prompt_tokens = answer.body["usage"]["prompt_tokens"]
        .as_u64()
        .expect("usage");
    assert!(
        (57 * 57..57 * 57 + 64).contains(&prompt_tokens),
        "{prompt_tokens} prompt tokens"
    );
}

#[tokio::test]
async fn bodies_over_the_payload_limit_are_refused_with_json() {
    let worker = start_worker();
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--max-payload-size",
        "1048576",
        "--api-key",
        "sk-main",
    ]);
    let mut big = chat_body();
    big["messages"][0]["content"] = json!("x".repeat(2 << 20));
    let big = serde_json::to_vec(&big).expect("json");

    // With a Content-Length, and chunked (no length to check up front).
    let sized = send(
        http()
            .post(gateway.url("/v1/chat/completions"))
            .bearer_auth("sk-main")
            .header("content-type", "application/json")
            .body(big.clone()),
    )
    .await;
    assert_refused(&sized, 413, "payload_too_large");
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        big.chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect();
    let chunked = send(
        http()
            .post(gateway.url("/v1/chat/completions"))
            .bearer_auth("sk-main")
            .header("content-type", "application/json")
            .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks))),
    )
    .await;
    assert_refused(&chunked, 413, "payload_too_large");

    // Without a key, the body is never read: the answer is 401.
    let stranger = send(
        http()
            .post(gateway.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(big),
    )
    .await;
    assert_refused(&stranger, 401, "invalid_api_key");

    // Under the limit, served.
    let fine = chat(&gateway, &[("authorization", "Bearer sk-main")]).await;
    assert_eq!(fine.status, 200, "{}", fine.body);
}

#[tokio::test]
async fn oversized_heads_are_refused_and_other_clients_still_served() {
    let worker = start_worker();
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--max-header-size",
        "16384",
    ]);
    let answer = chat(&gateway, &[("x-filler", &"a".repeat(20_000))]).await;
    assert_refused(&answer, 431, "headers_too_large");
    // Past twice the limit the head is refused before hyper parses it, by
    // the listener, as JSON in the dialect of the route its request line
    // names.
    let huge = send(
        http()
            .get(gateway.url("/liveness"))
            .header("x-filler", "a".repeat(40_000)),
    )
    .await;
    assert_refused(&huge, 431, "headers_too_large");
    assert_eq!(huge.header("connection"), Some("close"));
    let huge = send(
        http()
            .post(gateway.url("/v1/messages"))
            .header("x-filler", "a".repeat(40_000))
            .json(&json!({"model": "model", "max_tokens": 4, "messages": []})),
    )
    .await;
    assert_anthropic(&huge, 431, "invalid_request_error");
    // Also on the raw socket, the head cut off mid-way: the answer comes
    // while the client is still sending.
    let mut raw = TcpStream::connect(gateway.http).await.expect("connect");
    raw.write_all(b"POST /v1/messages HTTP/1.1\r\nhost: smg\r\nx-filler: ")
        .await
        .expect("write");
    raw.write_all(&[b'a'; 40_000]).await.expect("write");
    let refused = bounded("the refusal", read_response(&mut raw)).await;
    assert_eq!(refused.status, 431, "{refused:?}");
    let body: Value = serde_json::from_slice(&refused.body).expect("json");
    assert_eq!(body["type"], "error", "{body}");
    assert!(until_closed(&mut raw).await.is_empty(), "then closed");

    let metrics = metrics_text(&gateway).await;
    assert!(
        metric(
            &metrics,
            "smg_http_refusals_total",
            &["code=\"headers_too_large\""]
        ) >= 4.0,
        "{metrics}"
    );
    assert_eq!(chat(&gateway, &[]).await.status, 200);
}

// ----------------------------------------------------------------------------
// Connections
// ----------------------------------------------------------------------------

/// An HTTP/1.1 response read off a raw socket.
#[derive(Debug)]
struct RawResponse {
    status: u16,
    head: String,
    body: Vec<u8>,
}

/// Reads one response (with a Content-Length) from `stream`.
async fn read_response(stream: &mut TcpStream) -> RawResponse {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = stream.read(&mut chunk).await.expect("read");
        assert!(
            n > 0,
            "closed before a response: {:?}",
            String::from_utf8_lossy(&buffer)
        );
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).to_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("a content-length");
    while buffer.len() < head_end + length {
        let n = stream.read(&mut chunk).await.expect("read");
        assert!(n > 0, "closed mid-body");
        buffer.extend_from_slice(&chunk[..n]);
    }
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    RawResponse {
        status,
        head,
        body: buffer[head_end..head_end + length].to_vec(),
    }
}

const LIVENESS: &[u8] = b"GET /liveness HTTP/1.1\r\nhost: smg\r\n\r\n";

/// Waits until the peer closes `stream`; returns what it sent meanwhile.
async fn until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut received = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return received,
            Ok(n) => received.extend_from_slice(&chunk[..n]),
        }
    }
}

#[tokio::test]
async fn a_slow_head_is_cut_while_other_clients_are_served() {
    let worker = start_worker();
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--header-read-timeout-secs",
        "1",
    ]);
    let mut slow = TcpStream::connect(gateway.http).await.expect("connect");
    slow.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: smg\r\n")
        .await
        .expect("write");
    let (mut reader, mut writer) = slow.into_split();
    // The attack: one header byte every 100 ms, never a complete head.
    let trickle = tokio::spawn(async move {
        let mut sent = 0usize;
        loop {
            if writer.write_all(b"x").await.is_err() {
                return sent;
            }
            sent += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    // Meanwhile an honest client is served, more than once.
    for _ in 0..3 {
        assert_eq!(chat(&gateway, &[]).await.status, 200);
    }
    let mut received = Vec::new();
    let cut = bounded("the slow head's cut", reader.read_to_end(&mut received)).await;
    assert!(
        cut.is_ok() || received.is_empty(),
        "the connection ends: {cut:?}"
    );
    assert!(
        received.is_empty(),
        "nothing was parsed, so nothing is answered"
    );
    let sent = bounded("the trickle's end", trickle)
        .await
        .expect("trickle task");
    assert!(
        sent < 300,
        "cut well before 30 s of trickling ({sent} bytes)"
    );

    // A connection that never sends a byte is cut the same way.
    let mut silent = TcpStream::connect(gateway.http).await.expect("connect");
    assert!(
        bounded("the silent cut", until_closed(&mut silent))
            .await
            .is_empty()
    );
    let metrics = metrics_text(&gateway).await;
    assert!(
        metric(
            &metrics,
            "smg_http_connections_closed_total",
            &["reason=\"header_read\""]
        ) >= 2.0,
        "{metrics}"
    );
}

#[tokio::test]
async fn idle_connections_are_closed_but_long_requests_are_not() {
    let worker = SimWorker::start("tokenspeed", "regular", &["--decode-ms-per-token", "20"]);
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--keep-alive-timeout-secs",
        "1",
        "--header-read-timeout-secs",
        "1",
    ]);
    // A request in flight for ~2.4 s, twice both timeouts, is not cut.
    let mut body = chat_body();
    body["max_tokens"] = json!(120);
    body["ignore_eos"] = json!(true);
    let long = send(http().post(gateway.url("/v1/chat/completions")).json(&body)).await;
    assert_eq!(long.status, 200, "{}", long.body);
    assert_eq!(long.body["usage"]["completion_tokens"], 120);

    // A kept-alive connection with nothing to do is closed.
    let mut idle = TcpStream::connect(gateway.http).await.expect("connect");
    idle.write_all(LIVENESS).await.expect("write");
    assert_eq!(read_response(&mut idle).await.status, 200);
    assert!(
        bounded("the idle close", until_closed(&mut idle))
            .await
            .is_empty()
    );
    let metrics = metrics_text(&gateway).await;
    assert!(
        metric(
            &metrics,
            "smg_http_connections_closed_total",
            &["reason=\"keep_alive\""]
        ) >= 1.0
    );
}

#[tokio::test]
async fn connections_over_the_cap_are_answered_503_with_retry_after() {
    let worker = start_worker();
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--max-connections",
        "2",
    ]);
    // Two kept-alive connections, each shown served (so surely accepted).
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(gateway.http).await.expect("connect");
        stream.write_all(LIVENESS).await.expect("write");
        assert_eq!(read_response(&mut stream).await.status, 200);
        held.push(stream);
    }
    // The refusal speaks the dialect of the route the request line names:
    // OpenAI's with the code, or Anthropic's on /v1/messages.
    let messages = b"POST /v1/messages HTTP/1.1\r\nhost: smg\r\ncontent-length: 2\r\n\r\n{}";
    for (request, anthropic) in [(LIVENESS, false), (&messages[..], true)] {
        let mut third = TcpStream::connect(gateway.http).await.expect("connect");
        third.write_all(request).await.expect("write");
        let refused = bounded("the refusal", read_response(&mut third)).await;
        assert_eq!(refused.status, 503, "{refused:?}");
        assert!(refused.head.contains("retry-after: 1"), "{}", refused.head);
        assert!(
            refused.head.contains("connection: close"),
            "{}",
            refused.head
        );
        assert!(
            refused.head.contains("content-type: application/json"),
            "{}",
            refused.head
        );
        let body: Value = serde_json::from_slice(&refused.body).expect("json");
        if anthropic {
            assert_eq!(body["type"], "error", "{body}");
            assert_eq!(body["error"]["type"], "overloaded_error", "{body}");
            assert!(
                body["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("--max-connections")),
                "{body}"
            );
        } else {
            assert_eq!(body["error"]["code"], "too_many_connections", "{body}");
            assert_eq!(body["error"]["type"], "service_unavailable_error", "{body}");
        }
        assert!(until_closed(&mut third).await.is_empty(), "then closed");
    }

    // The held connections still work; once one closes, a newcomer is served.
    held[0].write_all(LIVENESS).await.expect("write");
    assert_eq!(read_response(&mut held[0]).await.status, 200);
    drop(held.pop());
    let served = bounded("a freed slot", async {
        loop {
            let mut stream = TcpStream::connect(gateway.http).await.expect("connect");
            stream.write_all(LIVENESS).await.expect("write");
            let answer = read_response(&mut stream).await;
            if answer.status == 200 {
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(served.status, 200);
}

// ----------------------------------------------------------------------------
// Request ids and CORS
// ----------------------------------------------------------------------------

/// The engine request ids the worker logged so far.
fn engine_ids(log: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn is_minted(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

#[tokio::test]
async fn request_ids_are_echoed_or_minted_and_prefix_the_engine_ids() {
    let dir = tempfile::tempdir().expect("temp dir");
    let requests = dir.path().join("requests.log");
    let request_log = requests.display().to_string();
    let worker = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--zero-delay", "--request-log", &request_log],
    );
    let gateway = Gateway::start(&["--worker-urls", &worker.grpc_url()]);

    let answer = chat(&gateway, &[("x-request-id", "client-abc.1")]).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("x-request-id"), Some("client-abc.1"));
    let response_id = answer.body["id"].as_str().expect("the response id");
    assert!(response_id.starts_with("chatcmpl-"), "{response_id}");
    assert_eq!(
        engine_ids(&requests),
        [format!("client-abc.1-{response_id}-1")],
        "the engine id: client id, response id, attempt"
    );

    // SMG's other default headers are read too.
    let answer = chat(&gateway, &[("x-correlation-id", "corr-9")]).await;
    assert_eq!(answer.header("x-request-id"), Some("corr-9"));

    // Without an id, or with one that is not plain, a fresh one is minted.
    for headers in [vec![], vec![("x-request-id", "has spaces and \"quotes\"")]] {
        let answer = chat(&gateway, &headers).await;
        let id = answer.header("x-request-id").expect("an id").to_owned();
        assert!(is_minted(&id), "{id}");
        let last = engine_ids(&requests).pop().expect("logged");
        assert!(last.starts_with(&format!("{id}-chatcmpl-")), "{last}");
    }
    let long = "a".repeat(129);
    let answer = chat(&gateway, &[("x-request-id", &long)]).await;
    assert!(is_minted(answer.header("x-request-id").expect("an id")));

    // Every answer carries one: errors, unknown routes, health.
    let missing = send(
        http()
            .get(gateway.url("/nowhere"))
            .header("x-request-id", "r-404"),
    )
    .await;
    assert_refused(&missing, 404, "not_found");
    assert_eq!(missing.header("x-request-id"), Some("r-404"));
    let bad = send(
        http()
            .post(gateway.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body("{"),
    )
    .await;
    assert_eq!(bad.status, 400);
    assert!(is_minted(bad.header("x-request-id").expect("an id")));
    let health = send(http().get(gateway.url("/health"))).await;
    assert!(health.header("x-request-id").is_some());
}

#[tokio::test]
async fn cors_preflights_are_answered_for_allowed_origins_without_a_key() {
    let worker = start_worker();
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--api-key",
        "sk-main",
        "--cors-allowed-origins",
        "https://app.example,http://localhost:3000",
    ]);
    let preflight = |origin: &'static str| {
        http()
            .request(
                reqwest::Method::OPTIONS,
                gateway.url("/v1/chat/completions"),
            )
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization,content-type",
            )
    };
    let allowed = send(preflight("https://app.example")).await;
    assert_eq!(allowed.status, 200);
    assert_eq!(
        allowed.header("access-control-allow-origin"),
        Some("https://app.example")
    );
    let methods = allowed.header("access-control-allow-methods").unwrap_or("");
    assert!(methods.contains("POST"), "{methods}");
    let headers = allowed
        .header("access-control-allow-headers")
        .unwrap_or("")
        .to_lowercase();
    assert!(headers.contains("authorization"), "{headers}");
    assert!(allowed.header("x-request-id").is_some());

    let foreign = send(preflight("https://evil.example")).await;
    assert_eq!(foreign.header("access-control-allow-origin"), None);

    // The real call: the browser may read the answer and its request id,
    // and a refusal too.
    for (key, status) in [("sk-main", 200), ("sk-wrong", 401)] {
        let answer = send(
            http()
                .post(gateway.url("/v1/chat/completions"))
                .header("origin", "http://localhost:3000")
                .bearer_auth(key)
                .json(&chat_body()),
        )
        .await;
        assert_eq!(answer.status, status, "{}", answer.body);
        assert_eq!(
            answer.header("access-control-allow-origin"),
            Some("http://localhost:3000")
        );
        let exposed = answer
            .header("access-control-expose-headers")
            .unwrap_or("")
            .to_lowercase();
        assert!(exposed.contains("x-request-id"), "{exposed}");
    }
}
