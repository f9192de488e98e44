//! End-to-end tests of the gateway: real `smg` and `smg-sim-worker` processes
//! on loopback, real HTTP. The sim workers' output starts with a digest of
//! the token ids they received, so every answer proves the prompt reached the
//! right worker intact, in each mode and protocol.

mod support;

use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use smg::proto::tokenspeed_scheduler as ts;
use smg::proto::tokenspeed_scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
use support::{Gateway, SimWorker, bounded, expected_header};

const ZERO: &[&str] = &["--zero-delay"];

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client")
}

fn gateway_tokenizer() -> smg::tokenizer::Tokenizer {
    smg::tokenizer::Tokenizer::from_model_dir(&support::model_dir()).expect("fixture tokenizer")
}

/// The ids the gateway sends for a chat with these messages.
fn chat_ids(messages: &Value) -> Vec<u32> {
    let tokenizer = gateway_tokenizer();
    let messages = messages.as_array().expect("a list").clone();
    let options = smg::tokenizer::ChatTemplateOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    let text = tokenizer
        .apply_chat_template(&messages, &options)
        .expect("renders");
    tokenizer.encode(&text, false).expect("encodes")
}

fn completion_ids(prompt: &str) -> Vec<u32> {
    gateway_tokenizer().encode(prompt, true).expect("encodes")
}

async fn post(gateway: &Gateway, path: &str, body: Value) -> (u16, Value) {
    let response = http()
        .post(gateway.url(path))
        .json(&body)
        .send()
        .await
        .expect("request sent");
    let status = response.status().as_u16();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body)
}

/// The `data:` payloads of an SSE response, in order.
async fn sse(gateway: &Gateway, path: &str, body: Value) -> Vec<String> {
    let response = http()
        .post(gateway.url(path))
        .json(&body)
        .send()
        .await
        .expect("request sent");
    let status = response.status().as_u16();
    if status != 200 {
        let text = response.text().await.unwrap_or_default();
        panic!("{path} answered {status}: {text}");
    }
    assert_eq!(
        response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("text/event-stream")
    );
    let text = bounded("SSE body", response.text()).await.expect("body");
    text.split("\n\n")
        .filter_map(|frame| frame.lines().find_map(|line| line.strip_prefix("data: ")))
        .map(str::to_owned)
        .collect()
}

fn chat_body(messages: &Value, extra: Value) -> Value {
    let mut body = json!({"model": "model", "messages": messages, "max_tokens": 40});
    if let (Some(target), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        target.extend(extra.clone());
    }
    body
}

/// Waits until the TokenSpeed worker at `url` runs no request.
async fn tokenspeed_idle(url: String) {
    let mut client = TokenSpeedSchedulerClient::connect(url)
        .await
        .expect("connect");
    bounded("the worker's requests end", async {
        loop {
            let loads = client
                .get_loads(ts::GetLoadsRequest {
                    dp_rank: None,
                    include: vec![],
                })
                .await
                .expect("loads")
                .into_inner();
            if loads.aggregate.map_or(-1, |a| a.total_running_reqs) == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

fn hello() -> Value {
    json!([{"role": "user", "content": "Say hello to the gateway."}])
}

async fn check_chat_in_mode(gateway: &Gateway) {
    let messages = hello();
    let header = expected_header(&chat_ids(&messages), &[]);
    let (status, body) = post(
        gateway,
        "/v1/chat/completions",
        chat_body(&messages, json!({})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let content = body["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    assert!(content.starts_with(&header), "{content:?} vs {header}");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "model");
    let usage = &body["usage"];
    assert_eq!(
        usage["prompt_tokens"].as_u64(),
        Some(chat_ids(&messages).len() as u64)
    );
    assert!(usage["completion_tokens"].as_u64().expect("count") > 0);

    // Streaming yields the same text, role first, and ends with [DONE].
    let frames = sse(
        gateway,
        "/v1/chat/completions",
        chat_body(
            &messages,
            json!({"stream": true, "stream_options": {"include_usage": true}}),
        ),
    )
    .await;
    assert_eq!(frames.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = frames[..frames.len() - 1]
        .iter()
        .map(|f| serde_json::from_str(f).expect("json chunk"))
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, content);
    let last = chunks.last().expect("a usage chunk");
    assert_eq!(
        last["usage"]["completion_tokens"],
        usage["completion_tokens"]
    );
    assert!(
        chunks
            .iter()
            .any(|c| !c["choices"][0]["finish_reason"].is_null())
    );
}

#[tokio::test]
async fn regular_mode_serves_chat_on_both_protocols() {
    for protocol in ["tokenspeed", "sglang"] {
        let worker = SimWorker::start(protocol, "regular", ZERO);
        let gateway = Gateway::start(&[
            "--worker-urls",
            &worker.grpc_url(),
            "--served-model-name",
            "model",
        ]);
        check_chat_in_mode(&gateway).await;
    }
}

#[tokio::test]
async fn pd_mode_serves_chat_on_both_protocols() {
    for protocol in ["tokenspeed", "sglang"] {
        let prefill = SimWorker::start(protocol, "prefill", ZERO);
        let decode = SimWorker::start(protocol, "decode", ZERO);
        let port = prefill.bootstrap_port().to_string();
        let gateway = Gateway::start(&[
            "--pd-disaggregation",
            "--prefill",
            &prefill.grpc_url(),
            &port,
            "--decode",
            &decode.grpc_url(),
            "--served-model-name",
            "model",
        ]);
        check_chat_in_mode(&gateway).await;
    }
}

/// The launch line from the issue, with ports adapted: EPD with bootstrap
/// ports on the command line, every policy named, inline tensors.
#[tokio::test]
async fn the_documented_epd_launch_line_serves_text_as_pd() {
    let encode = SimWorker::start("tokenspeed", "encode", ZERO);
    let prefill = SimWorker::start("tokenspeed", "prefill", ZERO);
    let decode = SimWorker::start("tokenspeed", "decode", ZERO);
    let (encode_port, prefill_port) = (
        encode.bootstrap_port().to_string(),
        prefill.bootstrap_port().to_string(),
    );
    let gateway = Gateway::start(&[
        "--epd-disaggregation",
        "--encode",
        &encode.grpc_url(),
        &encode_port,
        "--prefill",
        &prefill.grpc_url(),
        &prefill_port,
        "--decode",
        &decode.grpc_url(),
        "--encode-policy",
        "consistent_hashing",
        "--prefill-policy",
        "round_robin",
        "--decode-policy",
        "round_robin",
        "--policy",
        "cache_aware",
        "--multimodal-tensor-transport",
        "inline",
        "--disable-health-check",
        "--served-model-name",
        "model",
    ]);
    check_chat_in_mode(&gateway).await;
    let (status, body) = post(
        &gateway,
        "/v1/embeddings",
        json!({"model": "model", "input": "x"}),
    )
    .await;
    assert_eq!(status, 501);
    assert_eq!(body["error"]["code"], "unsupported_endpoint");
}

#[tokio::test]
async fn epd_over_sglang_is_refused_at_start_up() {
    let prefill = SimWorker::start("sglang", "prefill", ZERO);
    let decode = SimWorker::start("sglang", "decode", ZERO);
    let (status, stderr) = Gateway::fail_to_start(&[
        "--epd-disaggregation",
        "--encode",
        &decode.grpc_url(),
        "1234",
        "--prefill",
        &prefill.grpc_url(),
        &prefill.bootstrap_port().to_string(),
        "--decode",
        &decode.grpc_url(),
    ]);
    assert!(!status.success());
    assert!(stderr.contains("encoder protocol"), "{stderr}");
}

#[tokio::test]
async fn completions_generate_and_messages_speak_their_dialects() {
    let worker = SimWorker::start("tokenspeed", "regular", ZERO);
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--served-model-name",
        "model",
    ]);
    let prompt = "The gateway said";
    let header = expected_header(&completion_ids(prompt), &[]);

    let (status, body) = post(
        &gateway,
        "/v1/completions",
        json!({"model": "model", "prompt": prompt, "max_tokens": 30}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "text_completion");
    let text = body["choices"][0]["text"].as_str().expect("text");
    assert!(text.starts_with(&header), "{text:?}");

    let (status, body) = post(
        &gateway,
        "/generate",
        json!({"text": prompt, "sampling_params": {"max_new_tokens": 30}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["text"].as_str(), Some(text));
    assert_eq!(
        body["meta_info"]["completion_tokens"].as_u64(),
        body["output_ids"].as_array().map(|a| a.len() as u64)
    );

    let frames = sse(
        &gateway,
        "/generate",
        json!({"text": prompt, "stream": true, "sampling_params": {"max_new_tokens": 30}}),
    )
    .await;
    assert_eq!(frames.last().map(String::as_str), Some("[DONE]"));
    let last: Value = serde_json::from_str(&frames[frames.len() - 2]).expect("json");
    assert_eq!(
        last["text"].as_str(),
        Some(text),
        "SGLang streams cumulative text"
    );

    let messages = json!([{"role": "user", "content": "Say hello to the gateway."}]);
    let header = expected_header(&chat_ids(&messages), &[]);
    let (status, body) = post(
        &gateway,
        "/v1/messages",
        json!({"model": "model", "max_tokens": 40, "messages": messages}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["type"], "message");
    let text = body["content"][0]["text"].as_str().expect("text");
    assert!(text.starts_with(&header), "{text:?}");
    assert!(body["usage"]["output_tokens"].as_u64().expect("count") > 0);

    let response = http()
        .post(gateway.url("/v1/messages"))
        .json(&json!({"model": "model", "max_tokens": 40, "stream": true, "messages": messages}))
        .send()
        .await
        .expect("sent");
    let body = response.text().await.expect("body");
    let events: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(events.first(), Some(&"message_start"));
    assert_eq!(events.last(), Some(&"message_stop"));
    assert!(events.contains(&"content_block_delta"));
    assert!(events.contains(&"message_delta"));
}

#[tokio::test]
async fn stop_strings_are_trimmed_by_the_gateway() {
    let worker = SimWorker::start("sglang", "regular", ZERO);
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--served-model-name",
        "model",
    ]);
    let prompt = "Tell a story";
    let (_, full) = post(
        &gateway,
        "/v1/completions",
        json!({"model": "model", "prompt": prompt, "max_tokens": 60, "ignore_eos": true}),
    )
    .await;
    let text = full["choices"][0]["text"]
        .as_str()
        .expect("text")
        .to_owned();
    // Stop on the second filler word the worker produced.
    let word = text.split(' ').nth(2).expect("filler words").to_owned();
    let stop = format!(" {word}");
    let cut = text.find(&stop).expect("the stop occurs");
    for stream in [false, true] {
        let body = json!({"model": "model", "prompt": prompt, "max_tokens": 60, "ignore_eos": true, "stop": [stop], "stream": stream});
        let got = if stream {
            let frames = sse(&gateway, "/v1/completions", body).await;
            frames[..frames.len() - 1]
                .iter()
                .filter_map(|f| serde_json::from_str::<Value>(f).ok())
                .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_owned))
                .collect::<String>()
        } else {
            let (status, body) = post(&gateway, "/v1/completions", body).await;
            assert_eq!(status, 200);
            assert_eq!(body["choices"][0]["finish_reason"], "stop");
            body["choices"][0]["text"]
                .as_str()
                .expect("text")
                .to_owned()
        };
        assert_eq!(got, text[..cut], "stream={stream}");
    }
}

#[tokio::test]
async fn bad_requests_get_stable_codes() {
    let worker = SimWorker::start("tokenspeed", "regular", ZERO);
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--served-model-name",
        "model",
    ]);
    let long_prompt = "word ".repeat(40_000);
    let cases = [
        (json!("{not json"), 400, "invalid_json"),
        (
            json!({"model": "model", "messages": "hi"}),
            400,
            "invalid_request",
        ),
        (
            json!({"model": "other", "messages": hello()}),
            404,
            "model_not_found",
        ),
        (
            json!({"model": "model", "messages": []}),
            400,
            "invalid_parameter",
        ),
        (
            json!({"model": "model", "messages": hello(), "temperature": 5}),
            400,
            "invalid_parameter",
        ),
        (
            json!({"model": "model", "messages": hello(), "n": 0}),
            400,
            "invalid_parameter",
        ),
        (
            json!({"model": "model", "messages": hello(), "max_tokens": 10_000_000}),
            400,
            "invalid_parameter",
        ),
        (
            json!({"model": "model", "messages": [{"role": "user", "content": long_prompt}]}),
            400,
            "context_length_exceeded",
        ),
    ];
    for (body, status, code) in cases {
        let request = http().post(gateway.url("/v1/chat/completions"));
        let request = match body.as_str() {
            Some(raw) => request
                .header("content-type", "application/json")
                .body(raw.to_owned()),
            None => request.json(&body),
        };
        let response = request.send().await.expect("sent");
        let got_status = response.status().as_u16();
        let got: Value = response.json().await.expect("json error body");
        assert_eq!(
            (got_status, got["error"]["code"].as_str()),
            (status, Some(code)),
            "{body}: {got}"
        );
        assert!(
            got["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    }
}

/// A body nested far deeper than any stack: skipped by serde, then walked
/// to name the field of a shape error.
fn deeply_nested_body(extra_fields: &str) -> String {
    let depth = 100_000;
    format!(
        r#"{{"deep": {open}{close}, {extra_fields}, "stream": "yes"}}"#,
        open = "[".repeat(depth),
        close = "]".repeat(depth),
    )
}

#[tokio::test]
async fn deeply_nested_json_is_refused_on_every_json_route_and_the_gateway_lives_on() {
    let worker = SimWorker::start("tokenspeed", "regular", ZERO);
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--served-model-name",
        "model",
    ]);
    let routes = [
        (
            "/v1/chat/completions",
            r#""model": "model", "messages": []"#,
        ),
        ("/v1/completions", r#""model": "model", "prompt": "hi""#),
        ("/generate", r#""text": "hi""#),
        (
            "/v1/messages",
            r#""model": "model", "max_tokens": 5, "messages": []"#,
        ),
        (
            "/v1/embeddings",
            r#""model": "model", "input": "hi", "dimensions": "x""#,
        ),
        (
            "/v1/classify",
            r#""model": "model", "input": {"text": "hi"}"#,
        ),
        (
            "/workers",
            r#""url": "grpc://127.0.0.1:1", "bootstrap_port": "x""#,
        ),
    ];
    for (path, fields) in routes {
        let url = if path == "/workers" {
            gateway.admin_url(path)
        } else {
            gateway.url(path)
        };
        let response = http()
            .post(url)
            .header("content-type", "application/json")
            .body(deeply_nested_body(fields))
            .send()
            .await
            .unwrap_or_else(|err| panic!("{path}: the gateway died: {err}"));
        let status = response.status().as_u16();
        let body: Value = response.json().await.expect("json error body");
        assert_eq!(status, 400, "{path}: {body}");
        if path == "/v1/messages" {
            // Anthropic's error shape names a type, not a code.
            assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        } else {
            assert_eq!(body["error"]["code"], "invalid_request", "{path}: {body}");
        }
    }
    let (status, body) = post(
        &gateway,
        "/v1/chat/completions",
        chat_body(&hello(), json!({"max_tokens": 4})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn a_worker_dying_mid_stream_ends_the_stream_with_an_error_event() {
    // Paced decoding, so the first tokens are on the wire before the exit.
    let worker = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--decode-ms-per-token", "20", "--exit-after-tokens", "12"],
    );
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--served-model-name",
        "model",
    ]);
    let frames = sse(
        &gateway,
        "/v1/chat/completions",
        chat_body(&hello(), json!({"stream": true})),
    )
    .await;
    assert_eq!(frames.last().map(String::as_str), Some("[DONE]"));
    let error: Value = serde_json::from_str(&frames[frames.len() - 2]).expect("error frame");
    assert!(error["error"]["code"].is_string(), "{error}");
    let streamed: Vec<Value> = frames[..frames.len() - 2]
        .iter()
        .map(|f| serde_json::from_str(f).expect("chunk"))
        .collect();
    assert!(!streamed.is_empty(), "tokens arrived before the failure");
    assert!(
        streamed
            .iter()
            .all(|c| c["choices"][0]["finish_reason"].is_null())
    );
}

#[tokio::test]
async fn a_dead_decode_worker_fails_pd_fast() {
    let prefill = SimWorker::start(
        "tokenspeed",
        "prefill",
        &["--zero-delay", "--bootstrap-timeout-ms", "20000"],
    );
    let mut decode = SimWorker::start("tokenspeed", "decode", ZERO);
    let gateway = Gateway::start(&[
        "--pd-disaggregation",
        "--prefill",
        &prefill.grpc_url(),
        &prefill.bootstrap_port().to_string(),
        "--decode",
        &decode.grpc_url(),
        "--disable-health-check",
        "--retry-max-retries",
        "1",
        "--served-model-name",
        "model",
    ]);
    decode.kill();
    let started = std::time::Instant::now();
    let (status, body) = post(
        &gateway,
        "/v1/chat/completions",
        chat_body(&hello(), json!({})),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "worker_unavailable");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "failed fast, not at the rendezvous timeout"
    );
}

#[tokio::test]
async fn retries_route_around_a_dead_worker() {
    let live = SimWorker::start("tokenspeed", "regular", ZERO);
    let mut dead = SimWorker::start("tokenspeed", "regular", ZERO);
    let gateway = Gateway::start(&[
        "--worker-urls",
        &live.grpc_url(),
        &dead.grpc_url(),
        "--policy",
        "round_robin",
        "--disable-health-check",
        "--retry-initial-backoff-ms",
        "1",
        "--served-model-name",
        "model",
    ]);
    dead.kill();
    for _ in 0..6 {
        let (status, body) = post(
            &gateway,
            "/v1/chat/completions",
            chat_body(&hello(), json!({})),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, _) = post(
        &gateway,
        "/v1/chat/completions",
        chat_body(&hello(), json!({})),
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_client_that_disconnects_aborts_the_worker_request() {
    let worker = SimWorker::start("tokenspeed", "regular", &["--decode-ms-per-token", "20"]);
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--served-model-name",
        "model",
    ]);
    let response = http()
        .post(gateway.url("/v1/chat/completions"))
        .json(&chat_body(
            &hello(),
            json!({"stream": true, "max_tokens": 2000, "ignore_eos": true}),
        ))
        .send()
        .await
        .expect("sent");
    let mut body = response.bytes_stream();
    bounded("first bytes", body.next())
        .await
        .expect("a chunk")
        .expect("bytes");
    let mut client = TokenSpeedSchedulerClient::connect(worker.url())
        .await
        .expect("connect");
    let loads = client
        .get_loads(ts::GetLoadsRequest {
            dp_rank: None,
            include: vec![],
        })
        .await
        .expect("loads")
        .into_inner();
    assert_eq!(loads.aggregate.map(|a| a.total_running_reqs), Some(1));
    drop(body);
    tokenspeed_idle(worker.url()).await;
}

#[tokio::test]
async fn discovery_health_and_metrics_endpoints() {
    let worker = SimWorker::start("tokenspeed", "regular", ZERO);
    let gateway = Gateway::start(&["--worker-urls", &worker.grpc_url()]);
    let models: Value = http()
        .get(gateway.url("/v1/models"))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("json");
    assert_eq!(models["object"], "list");
    assert_eq!(
        models["data"][0]["id"], "model",
        "the worker's served name (its model dir)"
    );
    for path in ["/health", "/liveness", "/readiness"] {
        let status = http()
            .get(gateway.url(path))
            .send()
            .await
            .expect("sent")
            .status();
        assert_eq!(status.as_u16(), 200, "{path}");
    }
    let (status, _) = post(
        &gateway,
        "/v1/chat/completions",
        chat_body(&hello(), json!({})),
    )
    .await;
    assert_eq!(status, 200);
    let metrics = http()
        .get(format!("http://{}/metrics", gateway.metrics))
        .send()
        .await
        .expect("sent")
        .text()
        .await
        .expect("text");
    assert!(metrics.contains("smg_router_requests_total"), "{metrics}");
    assert!(metrics.contains("router=\"grpc\""), "{metrics}");
    assert!(metrics.contains("smg_worker_selection_total"), "{metrics}");
    let (status, body) = post(&gateway, "/v1/nope", json!({})).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
}

#[tokio::test]
async fn embeddings_and_classify_on_sglang_regular_workers() {
    let worker = SimWorker::start("sglang", "regular", ZERO);
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--served-model-name",
        "model",
    ]);
    let (status, body) = post(
        &gateway,
        "/v1/embeddings",
        json!({"model": "model", "input": ["first text", "second text"]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "list");
    let data = body["data"].as_array().expect("data");
    assert_eq!(data.len(), 2);
    let vector = |i: usize| -> Vec<f64> {
        data[i]["embedding"]
            .as_array()
            .expect("floats")
            .iter()
            .map(|v| v.as_f64().expect("float"))
            .collect()
    };
    assert_eq!(vector(0).len(), 64, "the fixture's hidden size");
    assert_ne!(vector(0), vector(1), "different inputs embed differently");
    let norm: f64 = vector(1).iter().map(|v| v * v).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() < 1e-3);
    assert_eq!(
        body["usage"]["prompt_tokens"].as_u64(),
        Some((completion_ids("first text").len() + completion_ids("second text").len()) as u64)
    );
    let (status, ids) = post(
        &gateway,
        "/v1/embeddings",
        json!({"model": "model", "input": [[5, 6, 7], [8]]}),
    )
    .await;
    assert_eq!(status, 200, "{ids}");
    assert_eq!(ids["usage"]["prompt_tokens"], 4);
    let (status, again) = post(
        &gateway,
        "/v1/embeddings",
        json!({"model": "model", "input": "first text"}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        again["data"][0]["embedding"], data[0]["embedding"],
        "deterministic"
    );

    let (status, body) = post(
        &gateway,
        "/v1/classify",
        json!({"model": "model", "input": ["a", "b"]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let probs: f64 = body["data"][0]["probs"]
        .as_array()
        .expect("probs")
        .iter()
        .filter_map(Value::as_f64)
        .sum();
    assert!((probs - 1.0).abs() < 1e-3);
    assert!(
        body["data"][1]["label"]
            .as_str()
            .is_some_and(|l| l.starts_with("LABEL_"))
    );

    let (status, body) = post(
        &gateway,
        "/v1/embeddings",
        json!({"model": "nope", "input": "x"}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("model_not_found"))
    );
}

#[tokio::test]
async fn embeddings_need_sglang_workers() {
    let worker = SimWorker::start("tokenspeed", "regular", ZERO);
    let gateway = Gateway::start(&["--worker-urls", &worker.grpc_url()]);
    let (status, body) = post(
        &gateway,
        "/v1/embeddings",
        json!({"model": "model", "input": "x"}),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (501, Some("unsupported_endpoint"))
    );
}

#[tokio::test]
async fn a_failing_prefill_leg_aborts_decode_at_once() {
    // The prefill fails without publishing its KV cache: otherwise decode
    // could fetch it and finish (zero delay) before the gateway reads
    // prefill's error, and only the gateway's abort stops decode waiting.
    let prefill = SimWorker::start(
        "tokenspeed",
        "prefill",
        &[
            "--zero-delay",
            "--fail-after-tokens",
            "0",
            "--withhold-bootstrap",
        ],
    );
    let decode = SimWorker::start(
        "tokenspeed",
        "decode",
        &["--zero-delay", "--bootstrap-timeout-ms", "20000"],
    );
    let gateway = Gateway::start(&[
        "--pd-disaggregation",
        "--prefill",
        &prefill.grpc_url(),
        &prefill.bootstrap_port().to_string(),
        "--decode",
        &decode.grpc_url(),
        "--disable-retries",
        "--served-model-name",
        "model",
    ]);
    let started = std::time::Instant::now();
    let (status, body) = post(
        &gateway,
        "/v1/chat/completions",
        chat_body(&hello(), json!({})),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (502, Some("worker_error")),
        "{body}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "not the 20 s rendezvous timeout"
    );
    // Decode was told to stop waiting for the KV cache.
    tokenspeed_idle(decode.url()).await;
}

#[tokio::test]
async fn a_pd_client_that_disconnects_aborts_both_legs() {
    let prefill = SimWorker::start("sglang", "prefill", ZERO);
    let decode = SimWorker::start("sglang", "decode", &["--decode-ms-per-token", "20"]);
    let gateway = Gateway::start(&[
        "--pd-disaggregation",
        "--prefill",
        &prefill.grpc_url(),
        &prefill.bootstrap_port().to_string(),
        "--decode",
        &decode.grpc_url(),
        "--served-model-name",
        "model",
    ]);
    let response = http()
        .post(gateway.url("/v1/chat/completions"))
        .json(&chat_body(
            &hello(),
            json!({"stream": true, "max_tokens": 2000, "ignore_eos": true}),
        ))
        .send()
        .await
        .expect("sent");
    let mut body = response.bytes_stream();
    bounded("first bytes", body.next())
        .await
        .expect("a chunk")
        .expect("bytes");
    drop(body);
    let mut client =
        smg::proto::sglang_scheduler::sglang_scheduler_client::SglangSchedulerClient::connect(
            decode.url(),
        )
        .await
        .expect("connect");
    bounded("decode's request ends", async {
        loop {
            let loads = client
                .get_loads(smg::proto::sglang_scheduler::GetLoadsRequest {
                    dp_rank: None,
                    include: vec![],
                })
                .await
                .expect("loads")
                .into_inner();
            if loads.aggregate.map_or(-1, |a| a.total_running_reqs) == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn unhealthy_workers_make_the_gateway_unready_and_answer_no_healthy_worker() {
    let worker = SimWorker::start("tokenspeed", "regular", &["--zero-delay", "--unhealthy"]);
    // Panic mode off: a lone worker out would otherwise get the request
    // anyway (see tests/overload.rs).
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--served-model-name",
        "model",
        "--health-check-interval-secs",
        "1",
        "--health-failure-threshold",
        "1",
        "--panic-threshold",
        "0",
    ]);
    bounded("readiness turns false", async {
        loop {
            let response = http()
                .get(gateway.url("/readiness"))
                .send()
                .await
                .expect("sent");
            if response.status().as_u16() == 503 {
                let body: Value = response.json().await.expect("json");
                assert_eq!(body["workers"]["regular"]["healthy"], 0);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let (status, body) = post(
        &gateway,
        "/v1/chat/completions",
        chat_body(&hello(), json!({})),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("no_healthy_worker")),
        "{body}"
    );
}

#[tokio::test]
async fn a_stalled_worker_hits_the_request_timeout() {
    let worker = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--zero-delay", "--stall-after-tokens", "0"],
    );
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--served-model-name",
        "model",
        "--request-timeout-secs",
        "1",
    ]);
    let started = std::time::Instant::now();
    let (status, body) = post(
        &gateway,
        "/v1/chat/completions",
        chat_body(&hello(), json!({})),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (504, Some("request_timeout")),
        "{body}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    // The timed-out request was aborted on the worker.
    tokenspeed_idle(worker.url()).await;
}

/// The sim worker's logprob for output position `p`: `-(p + 1) / 8`, and
/// `k` less for its `k`-th alternative.
fn sim_logprob(position: usize) -> f64 {
    -((position + 1) as f64) / 8.0
}

#[tokio::test]
async fn logprobs_are_rendered_in_chat_and_completion_shapes_on_both_protocols() {
    for protocol in ["tokenspeed", "sglang"] {
        let worker = SimWorker::start(protocol, "regular", ZERO);
        let gateway = Gateway::start(&[
            "--worker-urls",
            &worker.grpc_url(),
            "--served-model-name",
            "model",
        ]);
        let tokens = 6;
        let extra =
            json!({"max_tokens": tokens, "ignore_eos": true, "logprobs": true, "top_logprobs": 2});

        // Chat, whole answer: one entry per token, in order, whose texts
        // join into the answer.
        let (status, body) = post(
            &gateway,
            "/v1/chat/completions",
            chat_body(&hello(), extra.clone()),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let content = body["choices"][0]["logprobs"]["content"]
            .as_array()
            .expect("content");
        assert_eq!(content.len(), tokens, "{protocol}");
        let joined: String = content
            .iter()
            .map(|t| t["token"].as_str().expect("token"))
            .collect();
        assert_eq!(
            joined,
            body["choices"][0]["message"]["content"]
                .as_str()
                .expect("text")
        );
        for (position, entry) in content.iter().enumerate() {
            assert_eq!(
                entry["logprob"].as_f64(),
                Some(sim_logprob(position)),
                "{protocol} {entry}"
            );
            let top = entry["top_logprobs"].as_array().expect("alternatives");
            assert_eq!(top.len(), 2);
            assert_eq!(top[0]["token"], entry["token"]);
            assert_eq!(
                top[1]["logprob"].as_f64(),
                Some(sim_logprob(position) - 1.0)
            );
            let bytes: Vec<u8> = entry["bytes"]
                .as_array()
                .expect("bytes")
                .iter()
                .map(|b| b.as_u64().expect("byte") as u8)
                .collect();
            assert_eq!(
                String::from_utf8_lossy(&bytes),
                entry["token"].as_str().expect("token")
            );
        }

        // Chat, streamed: the same entries spread over the chunks.
        let mut streamed = Vec::new();
        for frame in sse(&gateway, "/v1/chat/completions", chat_body(&hello(), json!({
            "max_tokens": tokens, "ignore_eos": true, "logprobs": true, "top_logprobs": 2, "stream": true
        }))).await {
            if frame == "[DONE]" {
                break;
            }
            let chunk: Value = serde_json::from_str(&frame).expect("json chunk");
            if let Some(entries) = chunk["choices"][0]["logprobs"]["content"].as_array() {
                streamed.extend(entries.iter().map(|e| e["logprob"].as_f64().expect("logprob")));
            }
        }
        let expected: Vec<f64> = (0..tokens).map(sim_logprob).collect();
        assert_eq!(streamed, expected, "{protocol}");

        // Without the flag there are none.
        let (_, body) = post(
            &gateway,
            "/v1/chat/completions",
            chat_body(&hello(), json!({"max_tokens": 2})),
        )
        .await;
        assert!(body["choices"][0]["logprobs"].is_null(), "{body}");

        // Completions: legacy columns, offsets in characters of the text.
        let (status, body) = post(
            &gateway,
            "/v1/completions",
            json!({
                "model": "model", "prompt": "The gateway said", "max_tokens": tokens,
                "ignore_eos": true, "logprobs": 2
            }),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let columns = &body["choices"][0]["logprobs"];
        let texts: Vec<&str> = columns["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .map(|t| t.as_str().expect("token"))
            .collect();
        assert_eq!(
            texts.concat(),
            body["choices"][0]["text"].as_str().expect("text")
        );
        let offsets: Vec<u64> = columns["text_offset"]
            .as_array()
            .expect("offsets")
            .iter()
            .map(|o| o.as_u64().expect("offset"))
            .collect();
        let mut expected_offsets = Vec::new();
        let mut at = 0u64;
        for text in &texts {
            expected_offsets.push(at);
            at += text.chars().count() as u64;
        }
        assert_eq!(offsets, expected_offsets);
        assert_eq!(columns["token_logprobs"][3].as_f64(), Some(sim_logprob(3)));
        let ranked = columns["top_logprobs"][0].as_object().expect("ranked");
        assert_eq!(ranked.len(), 2);
        assert_eq!(
            ranked.values().next().and_then(Value::as_f64),
            Some(sim_logprob(0))
        );
    }
}

/// The fixture model with a chat template that loops (ten billion steps)
/// when the first message says `loop`, and renders as the fixture's
/// otherwise.
fn model_with_a_looping_template() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for entry in std::fs::read_dir(support::model_dir()).expect("the fixture model") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|ext| ext == "json") {
            std::fs::copy(&path, dir.path().join(path.file_name().expect("a name")))
                .expect("copied");
        }
    }
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(support::model_dir().join("tokenizer_config.json"))
            .expect("tokenizer_config.json"),
    )
    .expect("JSON");
    let fixture = config["chat_template"].as_str().expect("a template");
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        format!(
            "{{% if messages[0].content == 'loop' %}}{{% for i in range(100000) %}}\
             {{% for j in range(100000) %}}{{% endfor %}}{{% endfor %}}{{% endif %}}{fixture}"
        ),
    )
    .expect("written");
    dir
}

/// How long one of the flood's 8 MB prompts may take (the chats asked
/// during the flood keep the usual 30 s bound).
const FLOOD_REQUEST_LIMIT: Duration = Duration::from_secs(120);

/// Issue 19: a template that loops past `--chat-template-fuel` is the
/// client's 400 with a stable code naming the flag, and the gateway serves
/// on; and while a stream of 8 MB prompts is being tokenized (known to be
/// under way from `smg_cpu_work_running`), ordinary chats are answered.
#[tokio::test]
async fn template_loops_run_out_of_fuel_and_huge_prompts_leave_the_gateway_serving() {
    let model = model_with_a_looping_template();
    let worker = SimWorker::start("tokenspeed", "regular", ZERO);
    let gateway = Gateway::start_with_model(
        Some(model.path()),
        &[
            "--worker-urls",
            &worker.grpc_url(),
            "--served-model-name",
            "model",
            "--chat-template-fuel",
            "2000000",
        ],
    );

    let looping = json!([{"role": "user", "content": "loop"}]);
    let (status, body) = bounded(
        "the looping template",
        post(
            &gateway,
            "/v1/chat/completions",
            chat_body(&looping, json!({})),
        ),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "chat_template_budget_exceeded");
    let message = body["error"]["message"].as_str().expect("a message");
    assert!(
        message.contains("--chat-template-fuel") && message.contains("2000000"),
        "{message}"
    );
    check_chat_in_mode(&gateway).await;

    // Two clients sending 8 MB prompts back to back until told to stop.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let huge = "lorem ipsum dolor sit amet ".repeat((8 << 20) / 27);
    let flood: Vec<_> = (0..2)
        .map(|_| {
            let (url, stop, huge) = (
                gateway.url("/v1/completions"),
                std::sync::Arc::clone(&stop),
                huge.clone(),
            );
            tokio::spawn(async move {
                // One 8 MB prompt takes seconds to tokenize in a debug build,
                // more on a loaded 2-core machine with two of them at once:
                // the flood's own requests get longer than the usual 30 s.
                let client = reqwest::Client::builder()
                    .timeout(FLOOD_REQUEST_LIMIT)
                    .build()
                    .expect("http client");
                let mut codes = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let response = client
                        .post(&url)
                        .json(&json!({"model": "model", "prompt": huge, "max_tokens": 1}))
                        .send()
                        .await
                        .expect("sent");
                    let body: Value = response.json().await.expect("a JSON answer");
                    codes.push(body["error"]["code"].as_str().map(str::to_owned));
                }
                codes
            })
        })
        .collect();
    support::poll_until("an 8 MB prompt is being tokenized", async || {
        let text = support::media::metrics_text(&gateway).await;
        (support::media::metric(&text, "smg_cpu_work_running", &[]) >= 1.0).then_some(())
    })
    .await;
    for _ in 0..3 {
        bounded("a chat during the flood", check_chat_in_mode(&gateway)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for client in flood {
        let codes = tokio::time::timeout(FLOOD_REQUEST_LIMIT, client)
            .await
            .expect("the flood ends within its request limit")
            .expect("joined");
        assert!(!codes.is_empty());
        // Tokenized in full, then found too long for the model.
        for code in codes {
            assert_eq!(code.as_deref(), Some("context_length_exceeded"));
        }
    }
}

/// About `bytes` of JSON: `make(i)` for i = 0, 1, ... inside `wrap`.
fn body_of_about(
    bytes: usize,
    make: impl Fn(usize) -> Value,
    wrap: impl Fn(Vec<Value>) -> Value,
) -> Value {
    let one = serde_json::to_vec(&make(0)).expect("serializes").len() + 1;
    wrap((0..bytes / one).map(make).collect())
}

/// A function tool with a schema of a few properties, as agents send them.
fn schema_tool(i: usize) -> Value {
    json!({"type": "function", "function": {
        "name": format!("tool_{i}"),
        "description": format!("Looks up thing number {i} in the catalogue"),
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "the city"},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "options": {"type": "object", "properties": {
                "a": {"type": "boolean"}, "b": {"type": "array", "items": {"type": "number"}}}}},
            "required": ["city"]}}})
}

/// A Responses input item: a call, its output, a user message, in turn.
fn responses_item(i: usize) -> Value {
    match i % 3 {
        0 => json!({"type": "function_call", "call_id": format!("call_{i}"),
                    "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}),
        1 => json!({"type": "function_call_output", "call_id": format!("call_{}", i - 1),
                    "output": "sunny"}),
        _ => json!({"role": "user", "content": "and tomorrow?"}),
    }
}

/// Clients sending `body` to `path` back to back until `stop`; each
/// returns the error codes of its answers.
fn flood(
    gateway: &Gateway,
    path: &str,
    body: &Value,
    clients: usize,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Vec<Option<String>>>> {
    let body = bytes::Bytes::from(serde_json::to_vec(body).expect("serializes"));
    (0..clients)
        .map(|_| {
            let (url, stop, body) = (gateway.url(path), std::sync::Arc::clone(stop), body.clone());
            tokio::spawn(async move {
                let client = reqwest::Client::builder()
                    .timeout(FLOOD_REQUEST_LIMIT)
                    .build()
                    .expect("http client");
                let mut codes = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let started = std::time::Instant::now();
                    let response = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body.clone())
                        .send()
                        .await
                        .expect("sent");
                    let answer: Value = response.json().await.expect("a JSON answer");
                    eprintln!(
                        "  flood {url}: {:?} in {:?}",
                        answer["error"]["code"],
                        started.elapsed()
                    );
                    codes.push(answer["error"]["code"].as_str().map(str::to_owned));
                }
                codes
            })
        })
        .collect()
}

/// Stops a [`flood`] and returns every code its clients saw.
async fn end_flood(
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
    clients: Vec<tokio::task::JoinHandle<Vec<Option<String>>>>,
) -> Vec<Option<String>> {
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut codes = Vec::new();
    for client in clients {
        codes.extend(
            tokio::time::timeout(FLOOD_REQUEST_LIMIT, client)
                .await
                .expect("the flood ends within its request limit")
                .expect("joined"),
        );
    }
    codes
}

/// Ordinary chats answered while a flood runs; their latencies printed
/// (for the reader: nothing here asserts a speed).
async fn chats_answered_during(gateway: &Gateway, what: &str) {
    for _ in 0..3 {
        let started = std::time::Instant::now();
        bounded("a chat during the flood", check_chat_in_mode(gateway)).await;
        eprintln!(
            "{what}: an ordinary chat answered in {:?}",
            started.elapsed()
        );
    }
}

/// Issue 19: reading a `/v1/responses` body (its input items, its tools)
/// and converting it into the chat it generates from, and building the
/// template's and the parsers' views of a chat's tools, take time in
/// proportion to the body: past `Offload::INLINE_BYTES` they run off the
/// request threads, so bodies of 2 MB (the default limit) leave ordinary
/// chats answered. The first flood fails after its conversion (a
/// `tool_choice` naming a function it does not offer), so the only work it
/// can put on the offload gauge is that conversion: without the fix the
/// gauge never moves and the wait for it fails.
#[tokio::test]
async fn large_tools_and_responses_inputs_are_converted_off_the_request_threads() {
    let worker = SimWorker::start("tokenspeed", "regular", ZERO);
    let gateway = Gateway::start(&["--worker-urls", &worker.grpc_url()]);
    const BODY: usize = 1900 * 1024;
    let input = |extra: Value| {
        body_of_about(BODY, responses_item, |items| {
            let mut body = json!({"model": "model", "input": items, "max_output_tokens": 1});
            if let (Some(target), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
                target.extend(extra.clone());
            }
            body
        })
    };

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let refused = input(json!({
        "tools": [{"type": "function", "name": "get_weather",
                   "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "missing"},
    }));
    let clients = flood(&gateway, "/v1/responses", &refused, 2, &stop);
    support::poll_until(
        "a responses body is converted off the request threads",
        async || {
            let text = support::media::metrics_text(&gateway).await;
            (support::media::metric(&text, "smg_cpu_work_running", &[]) >= 1.0).then_some(())
        },
    )
    .await;
    chats_answered_during(&gateway, "responses input (refused)").await;
    let codes = end_flood(&stop, clients).await;
    assert!(!codes.is_empty());
    for code in codes {
        assert_eq!(code.as_deref(), Some("invalid_parameter"));
    }

    // Whole requests: 2 MB of tools on chat, 2 MB of input on responses;
    // both prompts are then far longer than the model's context.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tools = body_of_about(BODY, schema_tool, |tools| {
        json!({"model": "model", "messages": [{"role": "user", "content": "hi"}],
               "tools": tools, "max_tokens": 1})
    });
    let mut clients = flood(&gateway, "/v1/chat/completions", &tools, 1, &stop);
    clients.extend(flood(
        &gateway,
        "/v1/responses",
        &input(json!({})),
        1,
        &stop,
    ));
    support::poll_until("the large bodies are being prepared", async || {
        let text = support::media::metrics_text(&gateway).await;
        (support::media::metric(&text, "smg_cpu_work_running", &[]) >= 1.0).then_some(())
    })
    .await;
    chats_answered_during(&gateway, "chat tools and responses input").await;
    let codes = end_flood(&stop, clients).await;
    assert!(!codes.is_empty());
    for code in codes {
        assert_eq!(code.as_deref(), Some("context_length_exceeded"));
    }
    check_chat_in_mode(&gateway).await;
}
