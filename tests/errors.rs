//! Every error answers in its route's dialect: OpenAI's
//! `{"error": {"message", "type", "param", "code"}}` on the OpenAI, SGLang
//! and admin routes, Anthropic's `{"type": "error", "error": {"type",
//! "message"}}` on `/v1/messages`, whoever raised it: the key gate,
//! admission, the head and body limits, the JSON parser, the request
//! timeout, the router's fallbacks (404, 405) and the framework's own
//! rejections. Refusals of a limit name the flag that changes it. Real
//! `smg` and `smg-sim-worker` processes, real HTTP. (The connection cap's
//! refusal, answered before any request is served, is checked in both
//! dialects in `tests/front_door.rs`.)

mod support;

use std::time::Duration;

use futures::StreamExt;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use support::{Gateway, SimWorker, bounded, poll_until};

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client")
}

const MESSAGES: &str = "/v1/messages";
const CHAT: &str = "/v1/chat/completions";

/// A small valid body for `path`.
fn body(path: &str) -> Value {
    let messages = json!([{"role": "user", "content": "Hi"}]);
    match path {
        MESSAGES => json!({"model": "model", "max_tokens": 4, "messages": messages}),
        "/generate" => json!({"text": "Hi", "sampling_params": {"max_new_tokens": 4}}),
        "/v1/completions" => json!({"model": "model", "max_tokens": 4, "prompt": "Hi"}),
        _ => json!({"model": "model", "max_tokens": 4, "messages": messages}),
    }
}

struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Value,
    text: String,
}

async fn send(request: reqwest::RequestBuilder) -> Answer {
    let response = bounded("an answer", request.send())
        .await
        .expect("the gateway answers");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = bounded("the body", response.text()).await.expect("a body");
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    Answer {
        status,
        headers,
        body,
        text,
    }
}

/// Anthropic's error type for a status, as Anthropic documents them.
fn anthropic_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// `answer` is the error `code` with `status`, in the dialect of `path`,
/// as JSON; returns its message.
fn assert_error(path: &str, answer: &Answer, status: u16, code: &str) -> String {
    let what = format!("{path}: {} {}", answer.status, answer.text);
    assert_eq!(answer.status, status, "{what}");
    assert_eq!(
        answer
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/json"),
        "{what}"
    );
    let error = &answer.body["error"];
    let message = error["message"].as_str().unwrap_or_default().to_owned();
    assert!(!message.is_empty(), "{what}");
    if path.starts_with(MESSAGES) {
        assert_eq!(answer.body["type"], "error", "{what}");
        assert_eq!(error["type"], anthropic_type(status), "{what}");
        let keys: Vec<&String> = answer.body.as_object().expect("an object").keys().collect();
        assert_eq!(keys, ["type", "error"], "{what}");
        let keys: Vec<&String> = error.as_object().expect("an object").keys().collect();
        assert_eq!(keys, ["type", "message"], "{what}");
    } else {
        assert_eq!(error["code"], code, "{what}");
        assert!(error["type"].is_string(), "{what}");
        assert!(
            error.as_object().is_some_and(|e| e.contains_key("param")),
            "{what}"
        );
    }
    message
}

/// Sends `path`'s usual body with `id` as its `x-request-id`.
async fn send_with_id(gateway: &Gateway, path: &str, id: &str) -> Answer {
    send(
        http()
            .post(gateway.url(path))
            .header("x-request-id", id)
            .json(&body(path)),
    )
    .await
}

fn worker() -> SimWorker {
    SimWorker::start("tokenspeed", "regular", &["--zero-delay"])
}

fn gateway(worker: &SimWorker, extra: &[&str]) -> Gateway {
    let url = worker.grpc_url();
    let mut args = vec!["--worker-urls", &url, "--served-model-name", "model"];
    args.extend_from_slice(extra);
    Gateway::start(&args)
}

#[tokio::test]
async fn requests_the_front_door_refuses_are_refused_in_the_routes_dialect() {
    let worker = worker();
    let gateway = gateway(
        &worker,
        &[
            "--api-key",
            "sk-good",
            "--max-payload-size",
            "2048",
            "--max-header-size",
            "4096",
        ],
    );
    for path in [CHAT, "/v1/completions", "/generate", MESSAGES] {
        let post = || http().post(gateway.url(path));
        let keyed = || post().bearer_auth("sk-good");

        // The key gate.
        let answer = send(post().json(&body(path))).await;
        assert_error(path, &answer, 401, "invalid_api_key");
        assert_eq!(
            answer.headers.get("www-authenticate").map(|v| v.as_bytes()),
            Some(&b"Bearer"[..])
        );

        // The body limit, declared and streamed, names its flag.
        let big = "x".repeat(4096);
        let answer = send(
            keyed()
                .header("content-type", "application/json")
                .body(big.clone()),
        )
        .await;
        let message = assert_error(path, &answer, 413, "payload_too_large");
        assert!(message.contains("--max-payload-size (2 KiB)"), "{message}");
        let chunks = futures::stream::iter([Ok::<_, std::io::Error>(big.into_bytes())]);
        let answer = send(
            keyed()
                .header("content-type", "application/json")
                .body(reqwest::Body::wrap_stream(chunks)),
        )
        .await;
        let message = assert_error(path, &answer, 413, "payload_too_large");
        assert!(message.contains("--max-payload-size"), "{message}");

        // The head limit.
        let answer = send(
            keyed()
                .header("x-padding", "p".repeat(5000))
                .json(&body(path)),
        )
        .await;
        let message = assert_error(path, &answer, 431, "headers_too_large");
        assert!(message.contains("--max-header-size (4 KiB)"), "{message}");
        // Heads hyper would refuse without a body (one still going at twice
        // the limit, one with more fields than it reads) are stopped on the
        // way and answered by the listener, in the route's dialect too.
        let answer = send(
            keyed()
                .header("x-padding", "p".repeat(9000))
                .json(&body(path)),
        )
        .await;
        let message = assert_error(path, &answer, 431, "headers_too_large");
        assert!(
            message.contains("more than 8192 bytes")
                && message.contains("--max-header-size (4 KiB)"),
            "{message}"
        );
        let mut many = keyed();
        for n in 0..120 {
            many = many.header(format!("x-field-{n}"), "v");
        }
        let answer = send(many.json(&body(path))).await;
        let message = assert_error(path, &answer, 431, "headers_too_large");
        assert!(message.contains("100 header fields"), "{message}");

        // The JSON parser.
        let answer = send(keyed().header("content-type", "application/json").body("{")).await;
        assert_error(path, &answer, 400, "invalid_json");

        // A method the route does not take.
        let answer = send(http().get(gateway.url(path)).bearer_auth("sk-good")).await;
        let message = assert_error(path, &answer, 405, "method_not_allowed");
        assert!(message.contains("GET"), "{message}");
        assert_eq!(
            answer.headers.get("allow").map(|v| v.as_bytes()),
            Some(&b"POST"[..])
        );

        // And it still serves.
        let answer = send(keyed().json(&body(path))).await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.text);
    }

    // Unknown routes: JSON everywhere, Anthropic's under its route.
    for path in ["/v1/nope", "/", "/v1/messages/nope"] {
        let answer = send(http().get(gateway.url(path))).await;
        let message = assert_error(path, &answer, 404, "not_found");
        assert!(message.contains(path), "{message}");
    }
    // The Prometheus listener too.
    let answer = send(http().get(format!("http://{}/nope", gateway.metrics))).await;
    assert_error("/nope", &answer, 404, "not_found");
    let answer = send(http().post(format!("http://{}/metrics", gateway.metrics))).await;
    assert_error("/metrics", &answer, 405, "method_not_allowed");
    // The framework's own rejections on the admin API are JSON too.
    let answer = send(http().post(gateway.admin_url("/workers")).body("{}")).await;
    assert_eq!(answer.status, 400, "{}", answer.text);
    assert_error("/workers", &answer, 400, "invalid_request");
}

#[tokio::test]
async fn admission_refusals_speak_the_routes_dialect_and_name_their_flags() {
    // Rate: one request, then nothing for a long while.
    let worker = worker();
    let gateway = gateway(
        &worker,
        &[
            "--rate-limit-tokens-per-second",
            "0.001",
            "--rate-limit-burst",
            "1",
        ],
    );
    let answer = send(http().post(gateway.url(CHAT)).json(&body(CHAT))).await;
    assert_eq!(answer.status, 200, "{}", answer.text);
    for path in [CHAT, MESSAGES] {
        let answer = send(http().post(gateway.url(path)).json(&body(path))).await;
        let message = assert_error(path, &answer, 429, "rate_limited");
        assert!(
            message.contains("--rate-limit-tokens-per-second"),
            "{message}"
        );
        assert!(answer.headers.contains_key("retry-after"));
    }

    // Concurrency: a stalled stream holds the one slot, no queue.
    let stalled = SimWorker::start("tokenspeed", "regular", &["--stall-after-tokens", "1"]);
    let gateway = self::gateway(
        &stalled,
        &["--max-concurrent-requests", "1", "--queue-size", "0"],
    );
    let mut stream = body(CHAT);
    stream["stream"] = json!(true);
    let holder = http()
        .post(gateway.url(CHAT))
        .json(&stream)
        .send()
        .await
        .expect("sent");
    assert_eq!(holder.status(), 200);
    let mut holder = holder.bytes_stream();
    assert!(bounded("the first token", holder.next()).await.is_some());
    for path in [CHAT, MESSAGES, "/generate"] {
        let answer = send(http().post(gateway.url(path)).json(&body(path))).await;
        let message = assert_error(path, &answer, 429, "queue_full");
        assert!(
            message.contains("--max-concurrent-requests") && message.contains("--queue-size"),
            "{message}"
        );
    }
    drop(holder);
}

#[tokio::test]
async fn a_request_timeout_answers_in_the_routes_dialect_and_names_its_flag() {
    let stalled = SimWorker::start("tokenspeed", "regular", &["--stall-after-tokens", "1"]);
    let gateway = gateway(&stalled, &["--request-timeout-secs", "1"]);
    for path in [CHAT, MESSAGES] {
        let answer = send(http().post(gateway.url(path)).json(&body(path))).await;
        let message = assert_error(path, &answer, 504, "request_timeout");
        assert!(message.contains("--request-timeout-secs"), "{message}");
    }
}

/// A worker's failure answers its code and the request's id, never the
/// worker's address: the address, and the worker's own words, go to the
/// gateway's log under the same id. Before any output (a worker that is
/// down) and within a stream (a worker failing after a token), in both
/// dialects.
#[tokio::test]
async fn a_worker_failure_names_the_request_id_and_no_worker_address() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("smg.log");
    let mut down = worker();
    let failing = SimWorker::start("tokenspeed", "regular", &["--fail-after-tokens", "1"]);
    let addresses = [down.grpc_url(), failing.grpc_url()];
    let ports = [
        down.grpc.port().to_string(),
        failing.grpc.port().to_string(),
    ];
    let flags = [
        "--served-model-name",
        "model",
        "--disable-health-check",
        "--disable-retries",
    ];
    let mut args = vec!["--worker-urls", &addresses[0]];
    args.extend(flags);
    let gateway = Gateway::start_logged(&args, "warn", &log);
    down.kill();
    let leaks = |text: &str| {
        addresses
            .iter()
            .chain(&ports)
            .any(|address| text.contains(address.as_str()))
            || text.contains("127.0.0.1")
    };
    for (n, path) in [CHAT, MESSAGES].into_iter().enumerate() {
        let id = format!("trace-down-{n}");
        let answer = send_with_id(&gateway, path, &id).await;
        let message = assert_error(path, &answer, 503, "worker_unavailable");
        assert!(!leaks(&answer.text), "{path}: {}", answer.text);
        assert!(
            message.contains(&id) && message.contains("worker_unavailable"),
            "{path}: the message names the request id and the code: {message}"
        );
    }
    poll_until(
        "the log names the down worker under the request id",
        async || {
            let text = std::fs::read_to_string(&log).ok()?;
            text.lines()
                .any(|line| line.contains("trace-down-0") && line.contains(&ports[0]))
                .then_some(())
        },
    )
    .await;

    let mut args = vec!["--worker-urls", &addresses[1]];
    args.extend(flags);
    let gateway = Gateway::start(&args);
    for path in [CHAT, MESSAGES] {
        let mut request = body(path);
        request["stream"] = json!(true);
        request["max_tokens"] = json!(8);
        let answer = send(
            http()
                .post(gateway.url(path))
                .header("x-request-id", "trace-stream")
                .json(&request),
        )
        .await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.text);
        assert!(
            answer.text.contains("worker_error"),
            "{path}: {}",
            answer.text
        );
        assert!(
            answer.text.contains("trace-stream"),
            "{path}: {}",
            answer.text
        );
        assert!(!leaks(&answer.text), "{path}: {}", answer.text);
    }
}

/// A worker's refusal (400 `worker_rejected`) passes the worker's reason
/// on, since the client caused it, but a worker's words may name its
/// files, its peers' addresses and the gateway's `/dev/shm` names: the
/// client reads them redacted and cut, the log has them whole under the
/// request id.
#[tokio::test]
async fn a_worker_refusal_gives_its_reason_without_paths_addresses_or_shm_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("smg.log");
    let shm_name = format!(
        "smg-{}-{}-{}",
        "0123456789abcdef".repeat(2),
        "00112233445566778899aabb",
        "ff".repeat(16)
    );
    let secrets = [
        "/models/llama-3/config.json",
        "10.1.2.3:8000",
        "http://10.1.2.3:8000/v1",
        "[fe80::1]:50051",
        "node-7.internal:29500",
        shm_name.as_str(),
    ];
    let words = format!(
        "prompt too long for this model. cannot open {} (peer {}, at {} or {}, rank {}), segment {}. {}",
        secrets[0],
        secrets[1],
        secrets[2],
        secrets[3],
        secrets[4],
        secrets[5],
        "x".repeat(4000)
    );
    let rejecting = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--hostile", &format!("reject={words}"), "--zero-delay"],
    );
    let address = rejecting.grpc_url();
    let args = [
        "--worker-urls",
        address.as_str(),
        "--served-model-name",
        "model",
        "--disable-health-check",
    ];
    let gateway = Gateway::start_logged(&args, "warn", &log);
    let leaks = |text: &str| {
        secrets
            .iter()
            .chain(["10.1.2.3", "fe80", "node-7", "/models", "smg-0123"].iter())
            .find(|secret| text.contains(*secret))
            .copied()
    };
    for path in [CHAT, MESSAGES] {
        let id = format!("trace-reject-{}", path.len());
        let answer = send_with_id(&gateway, path, &id).await;
        let message = assert_error(path, &answer, 400, "worker_rejected");
        assert_eq!(leaks(&answer.text), None, "{path}: {}", answer.text);
        assert!(
            message.contains("prompt too long for this model. cannot open <path> (peer <address>, at <url> or <address>, rank <address>), segment <shm name>."),
            "{path}: the reason stays, what it names does not: {message}"
        );
        assert!(
            message.chars().count() < 260 && message.ends_with("bytes)"),
            "{path}: cut to an excerpt: {message}"
        );
        poll_until("the log has the whole reason under the id", async || {
            let text = std::fs::read_to_string(&log).ok()?;
            text.lines()
                .any(|line| {
                    line.contains(&id) && line.contains(secrets[0]) && line.contains(secrets[5])
                })
                .then_some(())
        })
        .await;
    }
}

/// A client's value is quoted in an error only as an excerpt (100
/// characters and its length), wherever the gateway or serde quotes it:
/// a 100 KB model name, role, tool name, logit-bias key, response id or
/// worker URL gives a short message that says how long the value was, not
/// a message cut at the 1,024-character backstop.
#[tokio::test]
async fn client_values_are_quoted_as_excerpts() {
    let worker = worker();
    let gateway = gateway(&worker, &[]);
    let long = "q".repeat(100_000);
    let messages = json!([{"role": "user", "content": "Hi"}]);
    let function = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
    let cases: Vec<(&str, Value, u16, &str)> = vec![
        (
            CHAT,
            json!({"model": long, "messages": messages}),
            404,
            "model_not_found",
        ),
        (
            CHAT,
            json!({"model": "model", "messages": [{"role": long, "content": "Hi"}]}),
            400,
            "invalid_request",
        ),
        (
            CHAT,
            json!({"model": "model", "messages": messages, "tools": function,
                "tool_choice": {"type": "function", "function": {"name": long}}}),
            400,
            "invalid_parameter",
        ),
        (
            CHAT,
            json!({"model": "model", "messages": messages, "logit_bias": {long.as_str(): 1}}),
            400,
            "invalid_parameter",
        ),
        (
            MESSAGES,
            json!({"model": "model", "max_tokens": 4, "messages": messages,
                "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "tool", "name": long}}),
            400,
            "invalid_parameter",
        ),
        (
            "/v1/responses",
            json!({"model": "model", "input": [{"type": "message", "role": long, "content": "Hi"}]}),
            400,
            "invalid_input_item",
        ),
        (
            "/v1/responses",
            json!({"model": "model", "input": "Hi", "previous_response_id": long}),
            400,
            "previous_response_not_found",
        ),
        (
            "/workers",
            json!({"url": format!("grpc://{long}:1")}),
            400,
            "invalid_parameter",
        ),
    ];
    let quoted = |what: &str, answer: &Answer| {
        let message = answer.body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.chars().count() < 600 && message.contains("… (") && message.contains(" bytes)"),
            "{what}: {message}"
        );
        let param = answer.body["error"]["param"].as_str().unwrap_or_default();
        assert!(param.chars().count() < 300, "{what}: {param}");
    };
    for (path, body, status, code) in cases {
        let url = if path == "/workers" {
            gateway.admin_url(path)
        } else {
            gateway.url(path)
        };
        let answer = send(http().post(url).json(&body)).await;
        assert_error(path, &answer, status, code);
        quoted(path, &answer);
    }
    // Values in the URL: a route that does not exist, a worker id.
    let path = "p".repeat(30_000);
    let answer = send(http().get(gateway.url(&format!("/v1/{path}")))).await;
    assert_error("/v1/…", &answer, 404, "not_found");
    quoted("/v1/…", &answer);
    let answer = send(http().get(gateway.admin_url(&format!("/workers/{path}")))).await;
    assert_error("/workers/…", &answer, 404, "worker_not_found");
    quoted("/workers/…", &answer);
}
