//! `smg-sim-worker --agent` behind a real gateway: an agent's two-turn tool
//! loop (the model calls a tool, the client runs it and sends the result
//! back, the model answers) with a tool set this test invents, streamed and
//! whole, with `tool_choice` auto, required and a named function, in Regular
//! and PD, on both protocols; a thinking model (the Qwen3 family fixture)
//! adds `reasoning_content`; prompts without tools keep the usual output
//! unless `response_format` constrains them; and the same loop through
//! `smg demo` in every mode, whose gateway detects the `qwen` parser from the
//! bundled template.
//!
//! Why: `tests/tool_calls.rs` replays canned text; here nothing about the
//! tools is known to the worker in advance, as with a real client, so the
//! whole path (tools rendered by the template, the constraint a forced call
//! sends, the parsers, OpenAI's wire shapes) must hold for any tool set.

mod support;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use support::{Gateway, SimWorker, poll_until};

/// The user's first message: names no tool, offers an id and a place.
const QUESTION: &str = "Where is order 8812? It ships to Lisbon.";
/// The user's message that names the second tool.
const REFUND_QUESTION: &str = "Please issue_refund for order 8812.";
/// What the client's tool returns.
const TOOL_RESULT: &str = "{\"status\": \"shipped\", \"eta_days\": 2}";

fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "lookup_order",
            "description": "Finds an order and where it is",
            "parameters": {"type": "object", "properties": {
                "order_id": {"type": "string"},
                "include_items": {"type": "boolean"},
                "destination": {"type": "object", "properties": {
                    "city": {"type": "string"}, "zip": {"type": "integer", "minimum": 1000}},
                    "required": ["city"]},
                "note": {"type": "string"}},
                "required": ["order_id", "include_items", "destination"]}}},
        {"type": "function", "function": {
            "name": "issue_refund",
            "description": "Refunds an order",
            "parameters": {"type": "object", "properties": {
                "order_id": {"type": "string"},
                "amount": {"type": "number", "exclusiveMinimum": 0},
                "reason": {"type": "string", "enum": ["damaged", "late", "other"]}},
                "required": ["order_id", "amount", "reason"]}}},
    ])
}

/// The arguments the agentic model builds for each tool from the messages
/// above (required properties; the user's words for strings).
fn lookup_arguments() -> Value {
    json!({"order_id": "8812", "include_items": true, "destination": {"city": "Lisbon"}})
}

fn refund_arguments() -> Value {
    json!({"order_id": "8812", "amount": 1, "reason": "damaged"})
}

/// A loop's first request: which call it asks for and what must come back.
struct Case {
    what: &'static str,
    question: &'static str,
    tool_choice: Value,
    name: &'static str,
    arguments: Value,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            what: "auto",
            question: QUESTION,
            tool_choice: json!("auto"),
            name: "lookup_order",
            arguments: lookup_arguments(),
        },
        Case {
            what: "auto, a tool the user names",
            question: REFUND_QUESTION,
            tool_choice: json!("auto"),
            name: "issue_refund",
            arguments: refund_arguments(),
        },
        Case {
            what: "required",
            question: REFUND_QUESTION,
            tool_choice: json!("required"),
            name: "issue_refund",
            arguments: refund_arguments(),
        },
        Case {
            what: "named function",
            question: QUESTION,
            tool_choice: json!({"type": "function", "function": {"name": "issue_refund"}}),
            name: "issue_refund",
            arguments: refund_arguments(),
        },
    ]
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client")
}

fn request(model: &str, messages: &Value, tool_choice: &Value, stream: bool) -> Value {
    json!({"model": model, "messages": messages, "tools": tools(),
           "tool_choice": tool_choice, "stream": stream})
}

/// One chat completion as a client sees it: whole, or rebuilt from its
/// stream the way OpenAI's SDKs do (text and reasoning concatenated, calls
/// accumulated by `index`).
#[derive(Debug, Default)]
struct Reply {
    content: String,
    reasoning: String,
    /// (id, name, arguments text) per call.
    calls: Vec<(String, String, String)>,
    finish_reason: String,
}

impl Reply {
    fn whole(body: &Value) -> Reply {
        let choice = &body["choices"][0];
        let message = &choice["message"];
        assert_eq!(message["role"], "assistant", "{body}");
        let calls = message["tool_calls"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for call in &calls {
            assert_eq!(call["type"], "function", "{body}");
        }
        Reply {
            content: message["content"].as_str().unwrap_or_default().to_owned(),
            reasoning: message["reasoning_content"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            calls: calls
                .iter()
                .map(|call| {
                    (
                        call["id"].as_str().expect("an id").to_owned(),
                        call["function"]["name"]
                            .as_str()
                            .expect("a name")
                            .to_owned(),
                        call["function"]["arguments"]
                            .as_str()
                            .expect("arguments text")
                            .to_owned(),
                    )
                })
                .collect(),
            finish_reason: choice["finish_reason"]
                .as_str()
                .expect("finish_reason")
                .to_owned(),
        }
    }

    fn streamed(chunks: &[Value]) -> Reply {
        let mut reply = Reply::default();
        for chunk in chunks {
            let Some(choice) = chunk["choices"].get(0) else {
                continue;
            };
            let delta = &choice["delta"];
            reply
                .content
                .push_str(delta["content"].as_str().unwrap_or_default());
            reply
                .reasoning
                .push_str(delta["reasoning_content"].as_str().unwrap_or_default());
            for call in delta["tool_calls"].as_array().into_iter().flatten() {
                let index = call["index"].as_u64().expect("an index") as usize;
                if let Some(name) = call["function"]["name"].as_str() {
                    assert_eq!(index, reply.calls.len(), "indexes 0..n-1: {call}");
                    assert_eq!(call["type"], "function", "{call}");
                    let id = call["id"].as_str().expect("the first fragment has an id");
                    reply
                        .calls
                        .push((id.to_owned(), name.to_owned(), String::new()));
                } else {
                    assert!(call.get("id").is_none(), "an id once: {call}");
                }
                let fragment = call["function"]["arguments"].as_str().unwrap_or_default();
                reply.calls[index].2.push_str(fragment);
            }
            if let Some(reason) = choice["finish_reason"].as_str() {
                reply.finish_reason = reason.to_owned();
            }
        }
        reply
    }
}

async fn complete(base: &str, body: &Value) -> Reply {
    let response = http()
        .post(format!("{base}/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .expect("request sent");
    let status = response.status().as_u16();
    if body["stream"] == true {
        assert_eq!(status, 200);
        let mut text = String::new();
        let mut bytes = response.bytes_stream();
        while let Some(piece) = bytes.next().await {
            text.push_str(std::str::from_utf8(&piece.expect("body")).expect("UTF-8"));
        }
        assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
        let chunks: Vec<Value> = text
            .split("\n\n")
            .filter_map(|frame| frame.strip_prefix("data: "))
            .filter(|payload| *payload != "[DONE]")
            .map(|payload| serde_json::from_str(payload).expect("a JSON chunk"))
            .collect();
        Reply::streamed(&chunks)
    } else {
        let body: Value = response.json().await.expect("a JSON body");
        assert_eq!(status, 200, "{body}");
        Reply::whole(&body)
    }
}

/// What the thinking model's reasoning holds, per turn (`None`: a model
/// without think markers, or thinking switched off).
#[derive(Debug, Clone, Copy)]
struct Thinking {
    calls: Option<&'static str>,
    answers: Option<&'static str>,
}

const NO_THINKING: Thinking = Thinking {
    calls: None,
    answers: None,
};

/// Runs every case's loop, whole and streamed, against the gateway at
/// `base` serving `model`.
async fn check_tool_loops(base: &str, model: &str, thinking: Thinking) {
    for case in cases() {
        for stream in [false, true] {
            let what = format!("{} (stream: {stream})", case.what);
            check_tool_loop(base, model, &case, stream, thinking, &what).await;
        }
    }
}

async fn check_tool_loop(
    base: &str,
    model: &str,
    case: &Case,
    stream: bool,
    thinking: Thinking,
    what: &str,
) {
    // Turn one: the model calls a tool.
    let mut messages = vec![json!({"role": "user", "content": case.question})];
    let first = complete(
        base,
        &request(model, &json!(messages), &case.tool_choice, stream),
    )
    .await;
    assert_eq!(first.finish_reason, "tool_calls", "{what}: {first:?}");
    assert_eq!(first.calls.len(), 1, "{what}: {first:?}");
    let (id, name, arguments) = &first.calls[0];
    assert!(id.starts_with("call_") && id.len() > 5, "{what}: {id}");
    assert_eq!(name, case.name, "{what}");
    let parsed: Value = serde_json::from_str(arguments).expect("the arguments are JSON");
    assert_eq!(parsed, case.arguments, "{what}");
    assert_eq!(first.content.trim(), "", "{what}: no text besides the call");
    // Forced calls are JSON under a constraint: no think block.
    let forced = case.tool_choice != json!("auto");
    let reasoning = thinking.calls.filter(|_| !forced);
    assert_eq!(
        first.reasoning.trim(),
        reasoning.unwrap_or_default(),
        "{what}"
    );

    // Turn two: the call and its result go back; the model answers.
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}]}));
    messages.push(json!({"role": "tool", "tool_call_id": id, "content": TOOL_RESULT}));
    let second = complete(
        base,
        &request(model, &json!(messages), &json!("auto"), stream),
    )
    .await;
    assert_eq!(second.finish_reason, "stop", "{what}: {second:?}");
    assert!(second.calls.is_empty(), "{what}: {second:?}");
    assert_eq!(
        second.content.trim(),
        format!("The tool said: {TOOL_RESULT}"),
        "{what}"
    );
    assert_eq!(
        second.reasoning.trim(),
        thinking.answers.unwrap_or_default(),
        "{what}"
    );
}

fn agent_worker(role: &str, model: &std::path::Path, extra: &[&str]) -> SimWorker {
    let mut flags = vec!["--zero-delay", "--agent"];
    flags.extend(extra);
    SimWorker::start_with_model("tokenspeed", role, model, &flags)
}

fn bundled_model() -> PathBuf {
    support::model_dir()
}

fn qwen3_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/qwen3")
}

fn base(gateway: &Gateway) -> String {
    gateway.url("")
}

#[tokio::test]
async fn regular_mode_runs_tool_loops_with_any_tools() {
    let worker = agent_worker("regular", &bundled_model(), &[]);
    let gateway = Gateway::start(&["--worker-urls", &worker.grpc_url()]);
    check_tool_loops(&base(&gateway), "model", NO_THINKING).await;
}

#[tokio::test]
async fn tool_choice_none_offers_the_model_no_tools() {
    let worker = agent_worker("regular", &bundled_model(), &[]);
    let gateway = Gateway::start(&["--worker-urls", &worker.grpc_url()]);
    let messages = json!([{"role": "user", "content": "Where is order A123?"}]);
    for stream in [false, true] {
        let mut body = request("model", &messages, &json!("none"), stream);
        body["max_tokens"] = json!(24);
        let reply = complete(&base(&gateway), &body).await;
        // The agent saw no tools: its usual text, no call, no markup.
        assert!(reply.calls.is_empty(), "{reply:?}");
        assert!(!reply.content.contains("<tool_call>"), "{reply:?}");
        assert!(!reply.content.is_empty(), "{reply:?}");
        assert_ne!(reply.finish_reason, "tool_calls");
    }
}

#[tokio::test]
async fn sglang_workers_run_tool_loops_too() {
    let worker = SimWorker::start("sglang", "regular", &["--zero-delay", "--agent"]);
    let gateway = Gateway::start(&["--worker-urls", &worker.grpc_url()]);
    check_tool_loops(&base(&gateway), "model", NO_THINKING).await;
}

#[tokio::test]
async fn pd_mode_runs_tool_loops_with_any_tools() {
    let prefill = agent_worker("prefill", &bundled_model(), &[]);
    let decode = agent_worker("decode", &bundled_model(), &[]);
    let gateway = Gateway::start(&[
        "--pd-disaggregation",
        "--prefill",
        &prefill.grpc_url(),
        &prefill.bootstrap_port().to_string(),
        "--decode",
        &decode.grpc_url(),
    ]);
    check_tool_loops(&base(&gateway), "model", NO_THINKING).await;
}

#[tokio::test]
async fn a_thinking_model_adds_reasoning_unless_switched_off() {
    const MODEL_ID: &str = "Qwen/Qwen3-8B";
    let served = ["--served-model-name", MODEL_ID];
    let prefill = agent_worker("prefill", &qwen3_dir(), &served);
    let decode = agent_worker("decode", &qwen3_dir(), &served);
    let gateway = Gateway::start_with_model(
        Some(&qwen3_dir()),
        &[
            "--served-model-name",
            MODEL_ID,
            "--pd-disaggregation",
            "--prefill",
            &prefill.grpc_url(),
            &prefill.bootstrap_port().to_string(),
            "--decode",
            &decode.grpc_url(),
        ],
    );
    let thinking = Thinking {
        calls: Some("The user needs lookup_order: I will call it."),
        answers: Some("The results are in: I will answer."),
    };
    let auto = &cases()[0];
    for stream in [false, true] {
        let what = format!("thinking (stream: {stream})");
        check_tool_loop(&base(&gateway), MODEL_ID, auto, stream, thinking, &what).await;
    }

    // enable_thinking false: the template closes an empty block itself.
    let mut body = request(
        MODEL_ID,
        &json!([{"role": "user", "content": QUESTION}]),
        &json!("auto"),
        false,
    );
    body["chat_template_kwargs"] = json!({"enable_thinking": false});
    let reply = complete(&base(&gateway), &body).await;
    assert_eq!(reply.finish_reason, "tool_calls", "{reply:?}");
    assert_eq!(reply.reasoning, "", "{reply:?}");
    assert_eq!(reply.calls[0].1, "lookup_order");
}

#[tokio::test]
async fn prompts_without_tools_keep_the_usual_output_unless_constrained() {
    let worker = agent_worker("regular", &bundled_model(), &[]);
    let gateway = Gateway::start(&["--worker-urls", &worker.grpc_url()]);
    let body = json!({"model": "model", "max_tokens": 8,
                      "messages": [{"role": "user", "content": QUESTION}]});
    let reply = complete(&base(&gateway), &body).await;
    assert!(reply.calls.is_empty(), "{reply:?}");
    assert!(
        reply.content.starts_with("digest="),
        "the digest output: {reply:?}"
    );

    // Structured output is a JSON-schema constraint too: matching JSON.
    let body = json!({"model": "model", "messages": [{"role": "user", "content": QUESTION}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "order", "schema": {
            "type": "object", "properties": {"order_id": {"type": "string"},
            "late": {"type": "boolean"}}, "required": ["order_id", "late"]}}}});
    let reply = complete(&base(&gateway), &body).await;
    assert_eq!(reply.finish_reason, "stop", "{reply:?}");
    let parsed: Value = serde_json::from_str(&reply.content).expect("JSON content");
    assert_eq!(parsed, json!({"order_id": "8812", "late": true}));
}

/// A running `smg demo`, killed (with its fleet) on drop.
struct Demo {
    child: Child,
    base: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Demo {
    /// Starts `smg demo --mode MODE` on ephemeral ports and waits for the
    /// gateway's ready line.
    fn start(mode: &str) -> Demo {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let log = dir.path().join("demo.log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_smg"))
            .args(["demo", "--mode", mode, "--port", "0"])
            .args(["--prometheus-port", "0", "--admin-port", "0"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("a log file"))
            .spawn()
            .expect("smg demo starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with("smg ready") {
                    let _ = sender.send(line);
                }
            }
        });
        let ready = receiver
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|err| {
                let _ = child.kill();
                panic!("smg demo --mode {mode} never became ready: {err}")
            });
        let http = ready
            .split_whitespace()
            .find_map(|word| word.strip_prefix("http="))
            .expect("the ready line names the HTTP address");
        Demo {
            child,
            base: format!("http://{http}"),
            log,
            _dir: dir,
        }
    }
}

#[tokio::test]
async fn smg_demo_runs_tool_loops_in_every_mode() {
    for mode in ["regular", "pd", "epd"] {
        let demo = Demo::start(mode);
        let line = poll_until("the demo logs its output parsers", async || {
            let log = std::fs::read_to_string(&demo.log).ok()?;
            log.lines()
                .find(|line| line.contains("tool_call_parser"))
                .map(str::to_owned)
        })
        .await;
        assert!(line.contains("\"qwen\""), "{mode}: {line}");
        let auto = &cases()[0];
        for stream in [false, true] {
            let what = format!("smg demo --mode {mode} (stream: {stream})");
            check_tool_loop(&demo.base, "model", auto, stream, NO_THINKING, &what).await;
        }
        let required = &cases()[2];
        let what = format!("smg demo --mode {mode}, required");
        check_tool_loop(&demo.base, "model", required, true, NO_THINKING, &what).await;
    }
}
