//! Usage is what the engines reported, everywhere a client reads it.
//!
//! A table of cases (endpoint × streamed or whole × `include_usage` × `n`
//! × with an image) runs against real gateways over real sim workers in
//! every mode (Regular and PD on both protocols, EPD on TokenSpeed). Each
//! worker appends the counts of every completion it sends to a usage log
//! (`smg-sim-worker --usage-log`); the test reads what the engines said for
//! its request (by request id) and checks every count the gateway wrote:
//! the whole answer's usage, the final usage chunk, each `/generate` chunk's
//! `meta_info`, Anthropic's `message_start` and `message_delta`.
//!
//! The rule for PD and EPD: prompt and completion tokens are the decode
//! worker's (it generated), cached tokens the prefill worker's (its prefix
//! cache saved the work; decode fetched the KV cache and reports 0 here).
//!
//! Every case is sent twice: the first fills the worker's prefix cache, so
//! the second reports a cached count that is non-zero and unlike the prompt
//! and completion counts (prompts of 16+ tokens, not a multiple of the
//! 16-token page; at most 7 tokens generated per sequence): a field read
//! from the wrong place cannot pass.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use support::media::image_data_url;
use support::{Gateway, SimWorker, bounded, poll_until};

const MAX_TOKENS: u32 = 7;
const IMAGE: &str = "palette_97x61.png";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Endpoint {
    Chat,
    Completions,
    Generate,
    Messages,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Delivery {
    Whole,
    /// Streamed; OpenAI without `stream_options.include_usage`.
    Stream,
    /// Streamed with `stream_options.include_usage` (OpenAI only).
    StreamWithUsage,
}

#[derive(Debug, Clone, Copy)]
struct Case {
    endpoint: Endpoint,
    delivery: Delivery,
    n: u32,
    image: bool,
}

const fn case(endpoint: Endpoint, delivery: Delivery, n: u32, image: bool) -> Case {
    Case {
        endpoint,
        delivery,
        n,
        image,
    }
}

use Delivery::{Stream, StreamWithUsage, Whole};
use Endpoint::{Chat, Completions, Generate, Messages};

/// Every way a client reads usage.
const CASES: &[Case] = &[
    case(Chat, Whole, 1, false),
    case(Chat, Stream, 1, false),
    case(Chat, StreamWithUsage, 1, false),
    case(Chat, Whole, 2, false),
    case(Chat, StreamWithUsage, 2, false),
    case(Chat, Whole, 1, true),
    case(Chat, StreamWithUsage, 1, true),
    case(Completions, Whole, 1, false),
    case(Completions, Stream, 1, false),
    case(Completions, StreamWithUsage, 1, false),
    case(Completions, StreamWithUsage, 2, false),
    case(Generate, Whole, 1, false),
    case(Generate, Stream, 1, false),
    case(Generate, Whole, 2, false),
    case(Generate, Stream, 2, false),
    case(Messages, Whole, 1, false),
    case(Messages, Stream, 1, false),
    case(Messages, Whole, 1, true),
    case(Messages, Stream, 1, true),
];

const TEXT: &str = "Tell the gateway a long story about tokens, caches, \
    prefill and decode workers, and the counts that clients are billed by.";

fn body(case: &Case) -> Value {
    let stream = case.delivery != Whole;
    let mut body = match case.endpoint {
        Chat => {
            let mut content = vec![json!({"type": "text", "text": TEXT})];
            if case.image {
                content.insert(
                    0,
                    json!({"type": "image_url", "image_url": {"url": image_data_url(IMAGE)}}),
                );
            }
            json!({"model": "model", "max_tokens": MAX_TOKENS, "n": case.n,
                   "messages": [{"role": "user", "content": content}]})
        }
        Completions => {
            json!({"model": "model", "max_tokens": MAX_TOKENS, "n": case.n, "prompt": TEXT})
        }
        Generate => json!({"text": TEXT,
                           "sampling_params": {"max_new_tokens": MAX_TOKENS, "n": case.n}}),
        Messages => {
            let mut content = vec![json!({"type": "text", "text": TEXT})];
            if case.image {
                let data = image_data_url(IMAGE);
                let data = data.split_once(',').expect("a data URL").1;
                content.insert(
                    0,
                    json!({"type": "image", "source":
                        {"type": "base64", "media_type": "image/png", "data": data}}),
                );
            }
            json!({"model": "model", "max_tokens": MAX_TOKENS,
                   "messages": [{"role": "user", "content": content}]})
        }
    };
    body["stream"] = json!(stream);
    if case.delivery == StreamWithUsage {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

fn path(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Chat => "/v1/chat/completions",
        Completions => "/v1/completions",
        Generate => "/generate",
        Messages => "/v1/messages",
    }
}

/// What one engine said in one completion (a usage log line).
#[derive(Debug, Clone, PartialEq)]
struct Report {
    role: String,
    index: u32,
    prompt: u32,
    completion: u32,
    cached: u32,
}

/// The counts a client must be told.
#[derive(Debug, Clone, PartialEq)]
struct Usage {
    prompt: u32,
    /// Per sequence.
    completion: Vec<u32>,
    cached: u32,
}

impl Usage {
    fn completion_total(&self) -> u32 {
        self.completion.iter().sum()
    }
}

/// The reports logged for engine request ids starting `<request id>-`.
fn reports(logs: &Path, request_id: &str) -> Vec<Report> {
    let prefix = format!("{request_id}-");
    let mut reports = Vec::new();
    for entry in std::fs::read_dir(logs).expect("log dir") {
        let text = std::fs::read_to_string(entry.expect("entry").path()).unwrap_or_default();
        for line in text.lines().filter(|line| line.starts_with(&prefix)) {
            let words: Vec<&str> = line.split_whitespace().collect();
            let field = |name: &str| -> u32 {
                words
                    .iter()
                    .find_map(|word| word.strip_prefix(name)?.strip_prefix('='))
                    .and_then(|value| value.parse().ok())
                    .unwrap_or_else(|| panic!("{name} in {line:?}"))
            };
            reports.push(Report {
                role: words[1].to_owned(),
                index: field("index"),
                prompt: field("prompt"),
                completion: field("completion"),
                cached: field("cached"),
            });
        }
    }
    reports
}

/// What the engines reported for `request_id`, once every report is in:
/// prompt and completions from the worker that generated, cached tokens
/// from the one that prefilled.
async fn engine_usage(logs: &Path, request_id: &str, n: u32, pd: bool) -> Usage {
    let reports = poll_until("the engines' usage reports", async || {
        let reports = reports(logs, request_id);
        let generated = reports.iter().filter(|r| r.role != "prefill").count();
        let prefilled = reports.iter().any(|r| r.role == "prefill");
        (generated == n as usize && prefilled == pd).then_some(reports)
    })
    .await;
    let mut generated: Vec<&Report> = reports.iter().filter(|r| r.role != "prefill").collect();
    generated.sort_by_key(|r| r.index);
    let prompt = generated[0].prompt;
    assert!(generated.iter().all(|r| r.prompt == prompt), "{reports:?}");
    let cached = match reports.iter().find(|r| r.role == "prefill") {
        Some(prefill) => {
            assert_eq!(prefill.prompt, prompt, "prefill and decode saw one prompt");
            prefill.cached
        }
        None => generated[0].cached,
    };
    Usage {
        prompt,
        completion: generated.iter().map(|r| r.completion).collect(),
        cached,
    }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client")
}

async fn send(gateway: &Gateway, case: &Case, request_id: &str) -> String {
    let response = http()
        .post(gateway.url(path(case.endpoint)))
        .header("x-request-id", request_id)
        .json(&body(case))
        .send()
        .await
        .expect("request sent");
    let status = response.status();
    let text = bounded("the response", response.text())
        .await
        .expect("body");
    assert_eq!(status, 200, "{case:?}: {text}");
    text
}

/// The `(event name, data)` frames of an SSE body, `[DONE]` included.
fn frames(text: &str) -> Vec<(Option<String>, String)> {
    text.split("\n\n")
        .filter(|frame| !frame.trim().is_empty())
        .map(|frame| {
            let event = frame
                .lines()
                .find_map(|line| line.strip_prefix("event: "))
                .map(str::to_owned);
            let data = frame
                .lines()
                .find_map(|line| line.strip_prefix("data: "))
                .unwrap_or_else(|| panic!("a data line in {frame:?}"))
                .to_owned();
            (event, data)
        })
        .collect()
}

fn json_frames(text: &str) -> Vec<(Option<String>, Value)> {
    frames(text)
        .into_iter()
        .filter(|(_, data)| data != "[DONE]")
        .map(|(event, data)| (event, serde_json::from_str(&data).expect("JSON frame")))
        .collect()
}

fn count(value: &Value) -> u32 {
    value
        .as_u64()
        .and_then(|v| u32::try_from(v).ok())
        .unwrap_or_else(|| panic!("a count, got {value}"))
}

/// OpenAI's `usage` object against the engines'.
fn check_openai_usage(usage: &Value, expected: &Usage, what: &str) {
    assert_eq!(count(&usage["prompt_tokens"]), expected.prompt, "{what}");
    assert_eq!(
        count(&usage["completion_tokens"]),
        expected.completion_total(),
        "{what}"
    );
    assert_eq!(
        count(&usage["total_tokens"]),
        expected.prompt + expected.completion_total(),
        "{what}"
    );
    assert_eq!(
        count(&usage["prompt_tokens_details"]["cached_tokens"]),
        expected.cached,
        "{what}"
    );
}

/// Anthropic's `usage`: `input_tokens` leaves the cached tokens out.
fn check_anthropic_usage(usage: &Value, expected: &Usage, output: Option<u32>, what: &str) {
    assert_eq!(
        count(&usage["input_tokens"]),
        expected.prompt - expected.cached,
        "{what}"
    );
    assert_eq!(
        count(&usage["cache_read_input_tokens"]),
        expected.cached,
        "{what}"
    );
    if let Some(output) = output {
        assert_eq!(count(&usage["output_tokens"]), output, "{what}");
    }
}

/// `/generate`'s `meta_info` of sequence `index` with `produced` tokens.
fn check_meta(meta: &Value, expected: &Usage, produced: u32, what: &str) {
    assert_eq!(count(&meta["prompt_tokens"]), expected.prompt, "{what}");
    assert_eq!(count(&meta["cached_tokens"]), expected.cached, "{what}");
    assert_eq!(count(&meta["completion_tokens"]), produced, "{what}");
}

/// Checks every count `text` (the gateway's answer to `case`) states.
fn check(case: &Case, text: &str, expected: &Usage) {
    let what = format!("{case:?}: {text}");
    let what = what.as_str();
    match (case.endpoint, case.delivery) {
        (Chat | Completions, Whole) => {
            let body: Value = serde_json::from_str(text).expect("JSON");
            check_openai_usage(&body["usage"], expected, what);
        }
        (Chat | Completions, Stream) => {
            for (_, chunk) in json_frames(text) {
                assert!(chunk["usage"].is_null(), "usage not asked for: {what}");
            }
        }
        (Chat | Completions, StreamWithUsage) => {
            let chunks = json_frames(text);
            let (last, before) = chunks.split_last().expect("chunks");
            for (_, chunk) in before {
                assert!(chunk["usage"].is_null(), "usage only at the end: {what}");
            }
            assert_eq!(last.1["choices"], json!([]), "{what}");
            check_openai_usage(&last.1["usage"], expected, what);
        }
        (Generate, Whole) => {
            let body: Value = serde_json::from_str(text).expect("JSON");
            let answers = match body {
                Value::Array(answers) => answers,
                one => vec![one],
            };
            assert_eq!(answers.len(), case.n as usize, "{what}");
            for answer in &answers {
                let index = answer["index"].as_u64().unwrap_or(0) as usize;
                let produced = answer["output_ids"].as_array().expect("ids").len() as u32;
                assert_eq!(produced, expected.completion[index], "{what}");
                check_meta(&answer["meta_info"], expected, produced, what);
            }
        }
        (Generate, _) => {
            let mut last = vec![0u32; case.n as usize];
            for (_, chunk) in json_frames(text) {
                let index = chunk["index"].as_u64().unwrap_or(0) as usize;
                let produced = chunk["output_ids"].as_array().expect("ids").len() as u32;
                check_meta(&chunk["meta_info"], expected, produced, what);
                if !chunk["meta_info"]["finish_reason"].is_null() {
                    last[index] = produced;
                }
            }
            assert_eq!(last, expected.completion, "each sequence's end: {what}");
        }
        (Messages, Whole) => {
            let body: Value = serde_json::from_str(text).expect("JSON");
            let output = Some(expected.completion_total());
            check_anthropic_usage(&body["usage"], expected, output, what);
        }
        (Messages, _) => {
            let events = json_frames(text);
            let start = events
                .iter()
                .find(|(event, _)| event.as_deref() == Some("message_start"))
                .expect("message_start");
            check_anthropic_usage(&start.1["message"]["usage"], expected, None, what);
            let delta = events
                .iter()
                .find(|(event, _)| event.as_deref() == Some("message_delta"))
                .expect("message_delta");
            let output = Some(expected.completion_total());
            check_anthropic_usage(&delta.1["usage"], expected, output, what);
        }
    }
}

/// A gateway over sim workers that log their usage reports.
struct Fleet {
    _workers: Vec<SimWorker>,
    gateway: Gateway,
    logs: tempfile::TempDir,
    pd: bool,
}

fn fleet(protocol: &str, mode: &str) -> Fleet {
    let logs = tempfile::tempdir().expect("log dir");
    let start = |role: &str| {
        let log: PathBuf = logs.path().join(format!("{role}.log"));
        let log = log.display().to_string();
        SimWorker::start(
            protocol,
            role,
            &[
                "--zero-delay",
                "--usage-log",
                &log,
                "--bootstrap-timeout-ms",
                "20000",
            ],
        )
    };
    let mut workers = Vec::new();
    let mut flags: Vec<String> = Vec::new();
    if mode == "regular" {
        let worker = start("regular");
        flags.extend(["--worker-urls".into(), worker.grpc_url()]);
        workers.push(worker);
    } else {
        if mode == "epd" {
            let encoder = start("encode");
            flags.extend([
                "--epd-disaggregation".into(),
                "--encode".into(),
                encoder.grpc_url(),
                encoder.bootstrap_port().to_string(),
            ]);
            workers.push(encoder);
        } else {
            flags.push("--pd-disaggregation".into());
        }
        let (prefill, decode) = (start("prefill"), start("decode"));
        flags.extend([
            "--prefill".into(),
            prefill.grpc_url(),
            prefill.bootstrap_port().to_string(),
            "--decode".into(),
            decode.grpc_url(),
        ]);
        workers.extend([prefill, decode]);
    }
    flags.extend(["--served-model-name".into(), "model".into()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Fleet {
        _workers: workers,
        gateway: Gateway::start(&flags),
        logs,
        pd: mode != "regular",
    }
}

async fn usage_matrix(protocol: &str, mode: &str) {
    let fleet = fleet(protocol, mode);
    for (number, case) in CASES.iter().enumerate() {
        let id = format!("{protocol}-{mode}-{number}");
        // The first fills the prefix cache; the second is measured.
        send(&fleet.gateway, case, &format!("warm-{id}")).await;
        let text = send(&fleet.gateway, case, &id).await;
        let expected = engine_usage(fleet.logs.path(), &id, case.n, fleet.pd).await;
        assert!(
            0 < expected.cached && expected.cached < expected.prompt,
            "{case:?}: the engines must report a partial cache hit: {expected:?}"
        );
        assert!(
            expected
                .completion
                .iter()
                .all(|&c| 0 < c && c < expected.cached),
            "{case:?}: counts unlike each other: {expected:?}"
        );
        check(case, &text, &expected);
    }
}

#[tokio::test]
async fn usage_is_what_the_engines_reported_in_regular_mode() {
    usage_matrix("tokenspeed", "regular").await;
    usage_matrix("sglang", "regular").await;
}

#[tokio::test]
async fn usage_is_what_the_engines_reported_in_pd_mode() {
    usage_matrix("tokenspeed", "pd").await;
    usage_matrix("sglang", "pd").await;
}

#[tokio::test]
async fn usage_is_what_the_engines_reported_in_epd_mode() {
    usage_matrix("tokenspeed", "epd").await;
}
