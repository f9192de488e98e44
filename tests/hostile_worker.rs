//! End-to-end tests of a gateway facing a hostile worker: `smg-sim-worker
//! --hostile ...` breaks the protocol's promises (tokens past `max_tokens`,
//! 100,000 logprob alternatives, sequences that do not exist, 50,000 DP
//! ranks, an archive of any size, a FIFO where the tokenizer should be,
//! messages larger than any answer to the request can need) and
//! the gateway must answer each with a correct, truncated response or a
//! stable error code that blames the worker, stay bounded (the client never
//! receives more than it asked for), and keep serving.
//!
//! Where a misbehaviour makes a request fail, the fleet is that worker and a
//! well-behaved one under `round_robin` with retries off: two requests then
//! reach one each, so the test sees the refusal and the gateway still
//! serving, whichever comes first.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::media::{metric, metrics_text};
use support::{Gateway, SimWorker, bounded};

/// `smg_worker_protocol_violations_total`, the worker-error metric.
const VIOLATIONS: &str = "smg_worker_protocol_violations_total";

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client")
}

/// Where `path` is served: admin routes on the admin listener.
fn url_of(gateway: &Gateway, path: &str) -> String {
    if path.starts_with("/workers") {
        gateway.admin_url(path)
    } else {
        gateway.url(path)
    }
}

async fn post(gateway: &Gateway, path: &str, body: Value) -> (u16, Value) {
    let response = bounded(
        "the request",
        http().post(url_of(gateway, path)).json(&body).send(),
    )
    .await
    .expect("request sent");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn get(gateway: &Gateway, path: &str) -> (u16, Value) {
    let response = http()
        .get(url_of(gateway, path))
        .send()
        .await
        .expect("request sent");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The `data:` payloads of an SSE response (bounded: a gateway that
/// forwards an endless stream fails here instead of hanging).
async fn sse(gateway: &Gateway, path: &str, body: Value) -> Vec<Value> {
    let response = http()
        .post(gateway.url(path))
        .json(&body)
        .send()
        .await
        .expect("request sent");
    assert_eq!(response.status().as_u16(), 200);
    let text = bounded("the SSE body", response.text())
        .await
        .expect("body");
    text.split("\n\n")
        .filter_map(|frame| frame.lines().find_map(|line| line.strip_prefix("data: ")))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).expect("a JSON event"))
        .collect()
}

fn chat(extra: Value) -> Value {
    let mut body = json!({
        "model": "model",
        "messages": [{"role": "user", "content": "Tell the gateway a story."}],
        "max_tokens": 8,
    });
    if let (Some(target), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        target.extend(extra.clone());
    }
    body
}

/// A gateway over `workers` that retries nothing and alternates workers.
fn alternating_gateway(workers: &[&SimWorker]) -> Gateway {
    let urls: Vec<String> = workers.iter().map(|w| w.grpc_url()).collect();
    let mut args = vec!["--worker-urls"];
    args.extend(urls.iter().map(String::as_str));
    args.extend([
        "--served-model-name",
        "model",
        "--policy",
        "round_robin",
        "--disable-retries",
        "--disable-health-check",
    ]);
    Gateway::start(&args)
}

/// Status and body text of a POST (a JSON answer, or an SSE stream).
async fn post_text(gateway: &Gateway, path: &str, body: Value) -> (u16, String) {
    let response = http()
        .post(gateway.url(path))
        .json(&body)
        .send()
        .await
        .expect("request sent");
    let status = response.status().as_u16();
    let text = bounded("the body", response.text()).await.expect("body");
    (status, text)
}

/// Sends `body` twice (once to each worker of an alternating gateway) and
/// returns the refusal, after checking the other answer was the good
/// worker's output.
async fn refused_once(gateway: &Gateway, path: &str, body: Value) -> Value {
    let first = post_text(gateway, path, body.clone()).await;
    let second = post_text(gateway, path, body).await;
    let (ok, refused) = match (first.0, second.0) {
        (200, _) => (first, second),
        (_, 200) => (second, first),
        _ => panic!("neither worker served: {first:?} / {second:?}"),
    };
    // A whole answer starts with the sim's digest; a stream ends in [DONE].
    let served = ["digest=", "data: [DONE]", "\"embedding\""];
    assert!(served.iter().any(|mark| ok.1.contains(mark)), "{}", ok.1);
    let refusal: Value = serde_json::from_str(&refused.1).expect("a JSON error");
    assert_eq!(
        (refused.0, refusal["error"]["code"].as_str()),
        (502, Some("worker_protocol_violation")),
        "{refusal}"
    );
    refusal
}

/// Waits until the worker at `url` (TokenSpeed) runs no request.
async fn worker_idle(url: String) {
    use smg::proto::tokenspeed_scheduler as ts;
    use smg::proto::tokenspeed_scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
    let client = TokenSpeedSchedulerClient::connect(url)
        .await
        .expect("connect");
    support::poll_until("the worker stops generating", async || {
        let loads = client
            .clone()
            .get_loads(ts::GetLoadsRequest {
                dp_rank: None,
                include: vec![],
            })
            .await
            .expect("loads")
            .into_inner();
        (loads.aggregate.map_or(-1, |a| a.total_running_reqs) == 0).then_some(())
    })
    .await;
}

/// Runs `smg launch` with `args` (and the fixture model unless `model` is
/// false) until it exits, for start-ups that must fail; fails the test if
/// it is still running after 30 s.
fn launch_exits(model: bool, args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_smg"));
    command.args([
        "launch",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--prometheus-port",
        "0",
        "--admin-port",
        "0",
        "--log-level",
        "warn",
        "--history-backend",
        "memory",
    ]);
    if model {
        command.arg("--model-path").arg(support::model_dir());
    }
    let mut child = command
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn smg");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the gateway was still running after 30 s: {}",
                reader.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status, reader.join().unwrap_or_default())
}

#[tokio::test]
async fn a_stream_past_max_tokens_is_cut_there_finished_as_length_and_stopped_on_the_worker() {
    // A million tokens at 1 ms each: without the cut and the abort the
    // client would read for a quarter of an hour.
    let worker = SimWorker::start(
        "tokenspeed",
        "regular",
        &[
            "--hostile",
            "overrun-tokens=1000000",
            "--decode-ms-per-token",
            "1",
            "--decode-ms-per-running-request",
            "0",
            "--prefill-tokens-per-sec",
            "1000000",
        ],
    );
    let gateway = Gateway::start(&["--worker-urls", &worker.grpc_url()]);
    let body = json!({
        "text": "Count to a million.",
        "stream": true,
        "sampling_params": {"max_new_tokens": 16},
    });
    let events = sse(&gateway, "/generate", body).await;
    let last = events.last().expect("events");
    // `/generate` streams cumulative output: the last event has it all.
    assert_eq!(
        last["output_ids"].as_array().map(Vec::len),
        Some(16),
        "{last}"
    );
    assert_eq!(
        last["meta_info"]["finish_reason"]["type"], "length",
        "{last}"
    );
    assert_eq!(last["meta_info"]["completion_tokens"], 16, "{last}");
    worker_idle(worker.url()).await;

    // The same in another dialect.
    let events = sse(
        &gateway,
        "/v1/chat/completions",
        chat(json!({
            "max_tokens": 24,
            "stream": true,
            "stream_options": {"include_usage": true},
        })),
    )
    .await;
    let usage = events
        .iter()
        .find_map(|event| event.get("usage").filter(|u| !u.is_null()))
        .expect("a usage chunk");
    assert_eq!(usage["completion_tokens"], 24, "{usage}");
    let finish = events
        .iter()
        .find_map(|event| event["choices"][0]["finish_reason"].as_str())
        .expect("a finish reason");
    assert_eq!(finish, "length");
    worker_idle(worker.url()).await;

    let text = metrics_text(&gateway).await;
    let overruns = metric(&text, VIOLATIONS, &["kind=\"token_overrun\""]);
    assert!(overruns >= 2.0, "{overruns}: {text}");
}

#[tokio::test]
async fn a_whole_answer_past_max_tokens_is_truncated_for_every_sequence() {
    // Unary: each sequence's one completion carries 50,000 ids.
    let worker = SimWorker::start(
        "sglang",
        "regular",
        &["--hostile", "overrun-tokens=50000", "--zero-delay"],
    );
    let gateway = Gateway::start(&["--worker-urls", &worker.grpc_url()]);
    let body = json!({
        "text": "Count to fifty thousand.",
        "sampling_params": {"max_new_tokens": 12, "n": 2},
    });
    let (status, answer) = post(&gateway, "/generate", body).await;
    assert_eq!(status, 200, "{answer}");
    let sequences = answer.as_array().expect("n = 2 answers a list");
    assert_eq!(sequences.len(), 2);
    for sequence in sequences {
        assert_eq!(sequence["output_ids"].as_array().map(Vec::len), Some(12));
        assert_eq!(sequence["meta_info"]["finish_reason"]["type"], "length");
        assert_eq!(sequence["meta_info"]["completion_tokens"], 12);
    }
    // The gateway goes on answering, truncated each time.
    let (status, again) = post(
        &gateway,
        "/v1/completions",
        json!({
            "model": "model", "prompt": "Again.", "max_tokens": 5,
        }),
    )
    .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["usage"]["completion_tokens"], 5, "{again}");
    assert_eq!(again["choices"][0]["finish_reason"], "length");

    // Without max_tokens a request may have what the context holds after
    // its prompt (32,768 for the fixture), and not a token more.
    let body = json!({"model": "model", "messages": [{"role": "user", "content": "Go on."}]});
    let (status, open) = post(&gateway, "/v1/chat/completions", body).await;
    assert_eq!(status, 200);
    let usage = &open["usage"];
    let prompt = usage["prompt_tokens"].as_u64().expect("prompt tokens");
    assert_eq!(
        usage["completion_tokens"].as_u64(),
        Some(32_768 - prompt),
        "{usage}"
    );
    assert_eq!(open["choices"][0]["finish_reason"], "length");
}

#[tokio::test]
async fn a_worker_overrunning_every_request_gets_one_log_line_and_every_violation_counted() {
    // Each request's overrun is repaired (cut at max_tokens) and counted,
    // and used to be logged as a WARN line per request: a hostile worker
    // wrote the gateway's log at request rate. Now its first violation is
    // logged, later ones within the interval (10 s) only counted.
    const REQUESTS: usize = 10;
    let worker = SimWorker::start(
        "sglang",
        "regular",
        &["--hostile", "overrun-tokens=1000", "--zero-delay"],
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("gateway.log");
    let gateway = Gateway::start_logged(&["--worker-urls", &worker.grpc_url()], "warn", &log);
    for _ in 0..REQUESTS {
        let body = json!({
            "text": "Count to a thousand.",
            "sampling_params": {"max_new_tokens": 4},
        });
        let (status, answer) = post(&gateway, "/generate", body).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["meta_info"]["completion_tokens"], 4, "{answer}");
    }
    let text = metrics_text(&gateway).await;
    let overruns = metric(&text, VIOLATIONS, &["kind=\"token_overrun\""]);
    assert!(overruns >= REQUESTS as f64, "{overruns}: {text}");
    let overrun_lines = || {
        std::fs::read_to_string(&log)
            .expect("the gateway's log")
            .lines()
            .filter(|line| line.contains("token_overrun"))
            .count()
    };
    let lines = support::poll_until("the first violation is logged", async || {
        Some(overrun_lines()).filter(|&lines| lines > 0)
    })
    .await;
    // One line, or two should the requests have straddled an interval on
    // a very slow machine; never one per request.
    assert!(
        lines < REQUESTS / 2,
        "{lines} lines for {REQUESTS} requests"
    );
}

#[tokio::test]
async fn logprob_alternatives_are_cut_to_what_was_asked() {
    let worker = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--hostile", "logprobs=100000", "--zero-delay"],
    );
    let gateway = Gateway::start(&["--worker-urls", &worker.grpc_url()]);
    for stream in [false, true] {
        let body = chat(json!({
            "max_tokens": 3,
            "logprobs": true,
            "top_logprobs": 5,
            "ignore_eos": true,
            "stream": stream,
        }));
        let contents: Vec<Value> = if stream {
            sse(&gateway, "/v1/chat/completions", body)
                .await
                .iter()
                .filter_map(|event| event["choices"][0]["logprobs"]["content"].as_array())
                .flatten()
                .cloned()
                .collect()
        } else {
            let (status, answer) = post(&gateway, "/v1/chat/completions", body).await;
            assert_eq!(status, 200, "{answer}");
            answer["choices"][0]["logprobs"]["content"]
                .as_array()
                .expect("logprobs")
                .clone()
        };
        assert_eq!(contents.len(), 3, "stream {stream}");
        for token in &contents {
            let alternatives = token["top_logprobs"].as_array().expect("alternatives");
            assert_eq!(alternatives.len(), 5, "stream {stream}");
        }
    }
    let text = metrics_text(&gateway).await;
    let cut = metric(&text, VIOLATIONS, &["kind=\"logprob_alternatives\""]);
    assert!(cut >= 2.0, "{cut}: {text}");
}

#[tokio::test]
async fn a_logprob_flood_past_the_message_limit_is_refused_without_decoding_it() {
    // 1,000,000 alternatives a token make each message ~6 MB per token,
    // past the 4 MiB an 8-token answer with 5 alternatives may take: tonic
    // refuses it from its length prefix, so nothing of it is decoded (no
    // `logprob_alternatives` repair is counted), and the request fails
    // with the worker's violation instead of reaching the client trimmed.
    for runtime in ["tokenspeed", "sglang"] {
        let hostile = SimWorker::start(
            runtime,
            "regular",
            &["--hostile", "logprobs=1000000", "--zero-delay"],
        );
        let good = SimWorker::start(runtime, "regular", &["--zero-delay"]);
        let gateway = alternating_gateway(&[&hostile, &good]);
        for stream in [false, true] {
            let body = chat(json!({
                "logprobs": true,
                "top_logprobs": 5,
                "ignore_eos": true,
                "stream": stream,
            }));
            let refusal = refused_once(&gateway, "/v1/chat/completions", body).await;
            let message = refusal["error"]["message"].as_str().unwrap_or_default();
            assert!(!message.contains(&hostile.grpc_url()), "{message}");
        }
        let text = metrics_text(&gateway).await;
        let label = format!("worker=\"{}\"", hostile.grpc_url());
        assert_eq!(
            metric(&text, VIOLATIONS, &["kind=\"message_size\"", &label]),
            2.0,
            "{runtime}: blamed on the hostile worker as oversized: {text}"
        );
        assert_eq!(
            metric(&text, VIOLATIONS, &["kind=\"logprob_alternatives\""]),
            0.0,
            "{runtime}: refused before decoding: {text}"
        );
    }
}

#[tokio::test]
async fn logprobs_that_disagree_with_their_tokens_are_refused() {
    let hostile = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--hostile", "short-logprobs", "--zero-delay"],
    );
    let good = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let gateway = alternating_gateway(&[&hostile, &good]);
    let body = chat(json!({"logprobs": true, "top_logprobs": 2}));
    let refusal = refused_once(&gateway, "/v1/chat/completions", body).await;
    let message = refusal["error"]["message"].as_str().unwrap_or_default();
    // What the worker got wrong is the operator's to read (the log, the
    // metric's kind); the client reads the code, and no worker address.
    assert!(message.contains("worker_protocol_violation"), "{message}");
    assert!(!message.contains(&hostile.grpc_url()), "{message}");
    let text = metrics_text(&gateway).await;
    assert_eq!(metric(&text, VIOLATIONS, &["kind=\"logprob_shape\""]), 1.0);
}

#[tokio::test]
async fn a_sequence_the_request_does_not_have_is_refused() {
    let hostile = SimWorker::start(
        "sglang",
        "regular",
        &["--hostile", "sequence-index=7", "--zero-delay"],
    );
    let good = SimWorker::start("sglang", "regular", &["--zero-delay"]);
    let gateway = alternating_gateway(&[&hostile, &good]);
    for stream in [false, true] {
        let body = chat(json!({"stream": stream}));
        let refusal = refused_once(&gateway, "/v1/chat/completions", body).await;
        let message = refusal["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("worker_protocol_violation"), "{message}");
        assert!(!message.contains(&hostile.grpc_url()), "{message}");
    }
    let text = metrics_text(&gateway).await;
    let label = format!("worker=\"{}\"", hostile.grpc_url());
    assert_eq!(
        metric(&text, VIOLATIONS, &["kind=\"sequence_index\"", &label]),
        2.0,
        "blamed on the hostile worker: {text}"
    );
}

#[tokio::test]
async fn an_embedding_wider_than_the_cap_is_refused() {
    let hostile = SimWorker::start(
        "sglang",
        "regular",
        &["--hostile", "embedding-dim=1000000", "--zero-delay"],
    );
    let good = SimWorker::start("sglang", "regular", &["--zero-delay"]);
    let gateway = alternating_gateway(&[&hostile, &good]);
    let body = json!({"model": "model", "input": "embed me"});
    refused_once(&gateway, "/v1/embeddings", body).await;
    let text = metrics_text(&gateway).await;
    assert_eq!(
        metric(&text, VIOLATIONS, &["kind=\"embedding_shape\""]),
        1.0
    );
}

#[tokio::test]
async fn an_engine_reporting_50000_dp_ranks_is_refused_at_start_up() {
    let hostile = SimWorker::start(
        "sglang",
        "regular",
        &["--hostile", "dp-ranks=50000", "--zero-delay"],
    );
    let (status, stderr) = launch_exits(
        true,
        &[
            "--worker-urls",
            &hostile.grpc_url(),
            "--dp-aware",
            "--disable-health-check",
        ],
    );
    assert!(!status.success());
    assert!(
        stderr.contains("50000 data-parallel ranks") && stderr.contains("--max-dp-ranks"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_registration_reporting_50000_dp_ranks_fails_and_the_gateway_serves_on() {
    let good = SimWorker::start("sglang", "regular", &["--zero-delay"]);
    let gateway = Gateway::start(&[
        "--worker-urls",
        &good.grpc_url(),
        "--served-model-name",
        "model",
        "--dp-aware",
        "--disable-health-check",
    ]);
    let hostile = SimWorker::start(
        "sglang",
        "regular",
        &["--hostile", "dp-ranks=50000", "--zero-delay"],
    );
    let (code, accepted) = post(&gateway, "/workers", json!({"url": hostile.grpc_url()})).await;
    assert_eq!(code, 202, "{accepted}");
    let id = accepted["id"].as_str().expect("an id").to_owned();
    let failed = support::poll_until("the registration ends", async || {
        let (_, status) = get(&gateway, &format!("/workers/{id}")).await;
        (status["status"] != "registering").then_some(status)
    })
    .await;
    assert_eq!(failed["status"], "registration_failed", "{failed}");
    let error = failed["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("50000") && error.contains("--max-dp-ranks"),
        "{error}"
    );

    let (_, listed) = get(&gateway, "/workers").await;
    let ready: Vec<&Value> = listed["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .filter(|w| w["status"] == "ready")
        .collect();
    assert_eq!(ready.len(), 1, "only the good engine's one rank: {listed}");
    let (status, answer) = post(&gateway, "/v1/chat/completions", chat(json!({}))).await;
    assert_eq!(status, 200, "{answer}");
    let text = metrics_text(&gateway).await;
    assert_eq!(metric(&text, VIOLATIONS, &["kind=\"dp_ranks\""]), 1.0);
}

#[tokio::test]
async fn a_tokenizer_archive_past_the_cap_is_refused_without_downloading_it_all() {
    // 8 MiB past the gateway's 128 MiB cap.
    let bytes = (136u64 << 20).to_string();
    let archive = format!("archive-bytes={bytes}");
    let hostile = SimWorker::start("tokenspeed", "regular", &["--hostile", &archive]);
    let (status, stderr) = launch_exits(false, &["--worker-urls", &hostile.grpc_url()]);
    assert!(!status.success());
    assert!(
        stderr.contains("tokenizer archive is larger than the 134217728 bytes"),
        "{stderr}"
    );
}

#[tokio::test]
async fn oversized_control_answers_are_refused_without_decoding_them() {
    use smg::engine::{EngineClient, Runtime};
    use smg::error::ErrorCode;
    // 16 MiB of padding in each control answer (model and server info,
    // loads, health), past their 4 MiB limit: each call fails with the
    // worker's violation (blamed as oversized: tonic refused the message
    // from its length prefix) instead of decoding it.
    let padding = format!("control-bytes={}", 16u64 << 20);
    for runtime in [Runtime::TokenSpeed, Runtime::Sglang] {
        let hostile = SimWorker::start(runtime.name(), "regular", &["--hostile", &padding]);
        let client = EngineClient::new(&hostile.grpc_url(), runtime).expect("a client");
        let oversized = |what: &str, result: Result<(), smg::error::Error>| {
            let err = result.expect_err(what);
            assert_eq!(
                err.code,
                ErrorCode::WorkerProtocolViolation,
                "{runtime:?} {what}: {err}"
            );
            assert!(
                err.message.contains("larger than any answer"),
                "{runtime:?} {what}: {err}"
            );
        };
        oversized("model info", client.model_info().await.map(drop));
        oversized("server info", client.server_info().await.map(drop));
        oversized("loads", client.loads().await.map(drop));
        oversized("health", client.health_check().await.map(drop));
        // Detection probes GetModelInfo with the same limit.
        let detected = EngineClient::detect(
            &hostile.grpc_url(),
            smg::engine::ConnectionConfig::default(),
        )
        .await;
        oversized("detect", detected.map(drop));
    }

    // Registered at run time, such a worker fails its registration and is
    // counted as oversized; the gateway serves on.
    let good = SimWorker::start("sglang", "regular", &["--zero-delay"]);
    let gateway = Gateway::start(&[
        "--worker-urls",
        &good.grpc_url(),
        "--served-model-name",
        "model",
        "--disable-health-check",
    ]);
    let hostile = SimWorker::start("sglang", "regular", &["--hostile", &padding]);
    let (code, accepted) = post(&gateway, "/workers", json!({"url": hostile.grpc_url()})).await;
    assert_eq!(code, 202, "{accepted}");
    let id = accepted["id"].as_str().expect("an id").to_owned();
    let failed = support::poll_until("the registration ends", async || {
        let (_, status) = get(&gateway, &format!("/workers/{id}")).await;
        (status["status"] != "registering").then_some(status)
    })
    .await;
    assert_eq!(failed["status"], "registration_failed", "{failed}");
    let (status, answer) = post(&gateway, "/v1/chat/completions", chat(json!({}))).await;
    assert_eq!(status, 200, "{answer}");
    let text = metrics_text(&gateway).await;
    let label = format!("worker=\"{}\"", hostile.grpc_url());
    assert!(
        metric(&text, VIOLATIONS, &["kind=\"message_size\"", &label]) >= 1.0,
        "{text}"
    );
}

#[tokio::test]
async fn a_tokenizer_chunk_larger_than_the_whole_archive_cap_is_refused_undecoded() {
    use smg::engine::{EngineClient, Runtime};
    use smg::error::ErrorCode;
    // One 136 MiB chunk: past the 128 MiB archive cap on its own, so it is
    // refused from its length prefix (a message-size violation), not
    // buffered and decoded before the archive's running total sees it.
    let bytes = (136u64 << 20).to_string();
    let archive = format!("archive-bytes={bytes}");
    let chunk = format!("archive-chunk-bytes={bytes}");
    let hostile = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--hostile", &archive, "--hostile", &chunk],
    );
    let client = EngineClient::new(&hostile.grpc_url(), Runtime::TokenSpeed).expect("a client");
    let err = client.tokenizer_archive().await.expect_err("refused");
    assert_eq!(err.code, ErrorCode::WorkerProtocolViolation, "{err}");
    assert!(err.message.contains("larger than any answer"), "{err}");
}

/// `mkfifo path`.
fn mkfifo(path: &Path) {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("no NUL");
    // SAFETY: `c_path` is a valid NUL-terminated string that outlives the
    // call; mkfifo only reads it.
    let status = unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) };
    assert_eq!(status, 0, "mkfifo {}", path.display());
}

#[tokio::test]
async fn an_advertised_tokenizer_dir_holding_a_fifo_blocks_nothing() {
    // The worker advertises a directory whose tokenizer.json is a FIFO that
    // nobody ever writes: opening it for reading would wait forever.
    let dir = tempfile::tempdir().expect("temp dir");
    mkfifo(&dir.path().join("tokenizer.json"));
    let advertised = format!("tokenizer-path={}", dir.path().display());
    let hostile = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--hostile", &advertised, "--zero-delay"],
    );
    // Refused as a worker's directory, the tokenizer comes from the
    // worker's archive instead, and the gateway serves.
    let gateway = Gateway::start_with_model(
        None,
        &[
            "--worker-urls",
            &hostile.grpc_url(),
            "--disable-health-check",
        ],
    );
    let (status, answer) = post(&gateway, "/v1/chat/completions", chat(json!({}))).await;
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer["choices"][0]["message"]["content"]
            .as_str()
            .is_some_and(|text| text.starts_with("digest=")),
        "{answer}"
    );
}
