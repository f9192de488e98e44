//! `smg-sim-worker --script`: a scripted completion (think block, tool call,
//! multi-byte text) comes back byte-exact through real gateway and worker
//! processes in Regular, PD and EPD, on both protocols, streamed and not;
//! the worker streams it as the family tokenizer's own ids, one to three per
//! event; a prompt the script does not match gets the usual digest output;
//! a bad script stops the worker at start-up with a one-line error.
//!
//! The requests offer no tools and ask for reasoning inline
//! (`separate_reasoning: false`), so the raw text (markers included) is what
//! must arrive; `tests/tool_calls.rs` covers the parsed shapes. The Qwen3
//! family fixture is used:
//! its `<think>` and `<tool_call>` markers are single, non-special tokens,
//! so they survive the default `skip_special_tokens` decoding.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use smg::proto::tokenspeed_scheduler as ts;
use smg::proto::tokenspeed_scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
use support::{Gateway, SimWorker, bounded, expected_header};

const MODEL_ID: &str = "Qwen/Qwen3-8B";

/// What the scripted model says, and to which prompt.
const WEATHER_QUESTION: &str = "What is the weather in Paris?";
const WEATHER_ANSWER: &str = "<think>\nThe user wants the weather in Paris. I should call \
    get_weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \
    {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>";
const GREETING_QUESTION: &str = "Say hi in three languages.";
const GREETING_ANSWER: &str = "Hi! 👋 Ça va ? 你好，世界！ Привет.";

fn qwen3_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/qwen3")
}

/// A script file for this test, in a temporary directory that lives as long
/// as the returned handle.
struct ScriptFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

fn script_file(lines: &[Value]) -> ScriptFile {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("script.jsonl");
    let text: String = lines.iter().map(|line| format!("{line}\n")).collect();
    std::fs::write(&path, text).expect("write the script");
    ScriptFile { _dir: dir, path }
}

fn weather_script() -> ScriptFile {
    script_file(&[
        json!({"when": WEATHER_QUESTION, "text": WEATHER_ANSWER}),
        json!({"when": GREETING_QUESTION, "text": GREETING_ANSWER}),
        // Never reached for the questions above: the first match wins.
        json!({"when": "Paris", "text": "the wrong line"}),
    ])
}

fn worker(protocol: &str, role: &str, script: &Path) -> SimWorker {
    let script = script.to_str().expect("a UTF-8 path");
    SimWorker::start_with_model(
        protocol,
        role,
        &qwen3_dir(),
        &[
            "--zero-delay",
            "--script",
            script,
            "--served-model-name",
            MODEL_ID,
        ],
    )
}

fn gateway(args: &[&str]) -> Gateway {
    let mut all = args.to_vec();
    all.extend(["--served-model-name", MODEL_ID]);
    Gateway::start_with_model(Some(&qwen3_dir()), &all)
}

fn family_tokenizer() -> smg::tokenizer::Tokenizer {
    smg::tokenizer::Tokenizer::from_model_dir(&qwen3_dir()).expect("the qwen3 fixture loads")
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client")
}

fn chat(question: &str, stream: bool) -> Value {
    json!({
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 200,
        "stream": stream,
        "separate_reasoning": false,
    })
}

/// The assistant text and finish reason of a non-streamed chat completion.
async fn chat_text(gateway: &Gateway, question: &str) -> (String, String) {
    let response = http()
        .post(gateway.url("/v1/chat/completions"))
        .json(&chat(question, false))
        .send()
        .await
        .expect("request sent");
    let status = response.status().as_u16();
    let body: Value = response.json().await.expect("a JSON body");
    assert_eq!(status, 200, "{body}");
    let choice = &body["choices"][0];
    (
        choice["message"]["content"]
            .as_str()
            .expect("text content")
            .to_owned(),
        choice["finish_reason"]
            .as_str()
            .expect("a finish reason")
            .to_owned(),
    )
}

/// The concatenated `delta.content` and the finish reason of a streamed one.
async fn streamed_chat_text(gateway: &Gateway, question: &str) -> (String, String) {
    let response = http()
        .post(gateway.url("/v1/chat/completions"))
        .json(&chat(question, true))
        .send()
        .await
        .expect("request sent");
    assert_eq!(response.status().as_u16(), 200);
    let body = bounded("the SSE body", response.text())
        .await
        .expect("a body");
    let mut text = String::new();
    let mut finish = String::new();
    for payload in body
        .split("\n\n")
        .filter_map(|frame| frame.lines().find_map(|line| line.strip_prefix("data: ")))
        .filter(|payload| *payload != "[DONE]")
    {
        let chunk: Value = serde_json::from_str(payload).expect("a JSON chunk");
        let choice = &chunk["choices"][0];
        if let Some(piece) = choice["delta"]["content"].as_str() {
            text.push_str(piece);
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            finish = reason.to_owned();
        }
    }
    (text, finish)
}

/// Both scripted answers arrive byte-exact, streamed and not, and an
/// unscripted prompt gets the worker's usual digest output.
async fn check_scripted_chat(gateway: &Gateway, mode: &str) {
    for (question, answer) in [
        (WEATHER_QUESTION, WEATHER_ANSWER),
        (GREETING_QUESTION, GREETING_ANSWER),
    ] {
        let whole = chat_text(gateway, question).await;
        assert_eq!(whole, (answer.to_owned(), "stop".to_owned()), "{mode}");
        let streamed = streamed_chat_text(gateway, question).await;
        assert_eq!(streamed, (answer.to_owned(), "stop".to_owned()), "{mode}");
    }
    let unscripted = "Tell me about gateways.";
    let tokenizer = family_tokenizer();
    let messages = [json!({"role": "user", "content": unscripted})];
    let options = smg::tokenizer::ChatTemplateOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    let prompt = tokenizer
        .apply_chat_template(&messages, &options)
        .expect("renders");
    let ids = tokenizer.encode(&prompt, false).expect("encodes");
    let (text, _) = chat_text(gateway, unscripted).await;
    assert!(
        text.starts_with(&expected_header(&ids, &[])),
        "{mode}: {text:?}"
    );
}

#[tokio::test]
async fn a_scripted_completion_comes_back_byte_exact_in_regular_mode() {
    let script = weather_script();
    for protocol in ["tokenspeed", "sglang"] {
        let worker = worker(protocol, "regular", &script.path);
        let gateway = gateway(&["--worker-urls", &worker.grpc_url()]);
        check_scripted_chat(&gateway, &format!("regular {protocol}")).await;
    }
}

#[tokio::test]
async fn a_scripted_completion_comes_back_byte_exact_in_pd_mode() {
    let script = weather_script();
    for protocol in ["tokenspeed", "sglang"] {
        let prefill = worker(protocol, "prefill", &script.path);
        let decode = worker(protocol, "decode", &script.path);
        let port = prefill.bootstrap_port().to_string();
        let gateway = gateway(&[
            "--pd-disaggregation",
            "--prefill",
            &prefill.grpc_url(),
            &port,
            "--decode",
            &decode.grpc_url(),
        ]);
        check_scripted_chat(&gateway, &format!("pd {protocol}")).await;
    }
}

#[tokio::test]
async fn a_scripted_completion_comes_back_byte_exact_in_epd_mode() {
    let script = weather_script();
    let encode = worker("tokenspeed", "encode", &script.path);
    let prefill = worker("tokenspeed", "prefill", &script.path);
    let decode = worker("tokenspeed", "decode", &script.path);
    let (encode_port, prefill_port) = (
        encode.bootstrap_port().to_string(),
        prefill.bootstrap_port().to_string(),
    );
    let gateway = gateway(&[
        "--epd-disaggregation",
        "--encode",
        &encode.grpc_url(),
        &encode_port,
        "--prefill",
        &prefill.grpc_url(),
        &prefill_port,
        "--decode",
        &decode.grpc_url(),
    ]);
    check_scripted_chat(&gateway, "epd tokenspeed").await;
}

/// Straight to the worker: the streamed ids are the family tokenizer's ids
/// of the text (each marker one id), then EOS, one to three per event.
#[tokio::test]
async fn the_worker_streams_the_tokenizers_ids_a_few_per_event() {
    let script = weather_script();
    let worker = worker("tokenspeed", "regular", &script.path);
    let tokenizer = family_tokenizer();
    let prompt = format!("<|im_start|>user\n{WEATHER_QUESTION}<|im_end|>\n<|im_start|>assistant\n");
    let request = ts::GenerateRequest {
        request_id: "scripted-1".into(),
        tokenized: Some(ts::TokenizedInput {
            input_ids: tokenizer.encode(&prompt, false).expect("encodes"),
            original_text: String::new(),
        }),
        sampling_params: Some(ts::SamplingParams {
            max_new_tokens: Some(200),
            ..Default::default()
        }),
        logprob_start_len: Some(-1),
        stream: true,
        ..Default::default()
    };
    let mut client = TokenSpeedSchedulerClient::connect(worker.url())
        .await
        .expect("connect");
    let mut stream = client
        .generate(request)
        .await
        .expect("a stream")
        .into_inner();
    let mut events: Vec<Vec<u32>> = Vec::new();
    let mut complete = None;
    while let Some(message) = bounded("the stream", stream.message())
        .await
        .expect("a message")
    {
        match message.response.expect("a response") {
            ts::generate_response::Response::Chunk(chunk) => events.push(chunk.token_ids),
            ts::generate_response::Response::Complete(done) => complete = Some(done),
        }
    }
    let complete = complete.expect("a completion");
    let mut expected = tokenizer.encode(WEATHER_ANSWER, false).expect("encodes");
    let eos = tokenizer.token_id("<|im_end|>").expect("an EOS token");
    expected.push(eos);
    for marker in ["<think>", "</think>", "<tool_call>", "</tool_call>"] {
        let id = tokenizer.token_id(marker).expect("a marker token");
        assert_eq!(expected.iter().filter(|&&t| t == id).count(), 1, "{marker}");
    }
    assert_eq!(events.concat(), expected);
    assert_eq!(complete.output_ids, expected);
    assert_eq!(complete.finish_reason, "stop");
    let sizes: Vec<usize> = events.iter().map(Vec::len).collect();
    let cycle = [1, 2, 3].into_iter().cycle();
    let expected_sizes: Vec<usize> = cycle.take(sizes.len()).collect();
    assert_eq!(sizes[..sizes.len() - 1], expected_sizes[..sizes.len() - 1]);
    assert!(sizes[sizes.len() - 1] <= expected_sizes[sizes.len() - 1]);
    assert_eq!(
        tokenizer.decode(&events.concat(), true).expect("decodes"),
        WEATHER_ANSWER
    );
}

/// The worker with `args`, which must exit at start-up: its status and
/// stderr.
async fn start_up_failure(args: &[&str]) -> (std::process::ExitStatus, String) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_smg-sim-worker"))
        .arg("--model-path")
        .arg(qwen3_dir())
        .args(args)
        .kill_on_drop(true)
        .output();
    let output = bounded("the worker exits at start-up", output)
        .await
        .expect("the worker ran");
    (
        output.status,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_bad_script_stops_the_worker_at_start_up_with_one_line() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path.to_str().expect("a UTF-8 path").to_owned()
    };
    let cases = [
        (
            write(
                "not-json.jsonl",
                "{\"when\": \"a\", \"text\": \"b\"}\nnot json\n",
            ),
            "line 2",
        ),
        (
            write("missing.jsonl", "{\"when\": \"a\"}\n"),
            "missing field `text`",
        ),
        (
            write("misspelt.jsonl", "{\"when\": \"a\", \"txt\": \"b\"}\n"),
            "unknown field `txt`",
        ),
        (write("not-an-object.jsonl", "[\"a\", \"b\"]\n"), "line 1"),
        (write("empty.jsonl", "\n\n"), "no lines"),
        (
            dir.path()
                .join("absent.jsonl")
                .to_str()
                .expect("a UTF-8 path")
                .to_owned(),
            "cannot read it",
        ),
    ];
    for (path, reason) in &cases {
        let (status, stderr) = start_up_failure(&["--script", path]).await;
        assert_eq!(status.code(), Some(2), "{path}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{path}: {stderr}");
        assert!(stderr.contains(path.as_str()), "{stderr}");
        assert!(stderr.contains(reason), "{path}: {stderr}");
    }
}

/// `--chat-template FILE` replaces the model's own template: the prompt the
/// worker decodes carries the override's marker, so only then does the
/// script's line match and its answer come back (the model's ChatML prompt
/// gets the worker's digest output instead).
#[tokio::test]
async fn the_chat_template_flag_replaces_the_models_template_in_the_prompt() {
    const QUESTION: &str = "Which template rendered this?";
    const ANSWER: &str = "The operator's template did.";
    let script = script_file(&[json!({
        "when": format!("[[override user]] {QUESTION}"),
        "text": ANSWER,
    })]);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let template = dir.path().join("override.jinja");
    std::fs::write(
        &template,
        "{% for m in messages %}[[override {{ m.role }}]] {{ m.content }}\n{% endfor %}\
         {% if add_generation_prompt %}{{ eos_token }}{% endif %}",
    )
    .expect("write the template");
    let template = template.to_str().expect("a UTF-8 path");

    let worker = worker("tokenspeed", "regular", &script.path);
    let overridden = gateway(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--chat-template",
        template,
    ]);
    assert_eq!(
        chat_text(&overridden, QUESTION).await,
        (ANSWER.to_owned(), "stop".to_owned())
    );
    assert_eq!(
        streamed_chat_text(&overridden, QUESTION).await,
        (ANSWER.to_owned(), "stop".to_owned())
    );
    drop(overridden);

    let own = gateway(&["--worker-urls", &worker.grpc_url()]);
    let (text, _) = chat_text(&own, QUESTION).await;
    assert_ne!(
        text, ANSWER,
        "the model's own template does not match the script"
    );
}
