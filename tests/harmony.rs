//! gpt-oss end to end: a scripted Harmony model (the `gpt-oss` family
//! fixture and `smg-sim-worker --script`) reasons on `analysis`, calls a
//! function on `commentary` and, given the result, answers on `final`; the
//! worker streams the fixture tokenizer's ids (each Harmony marker one
//! special id) and stops at `<|call|>` and `<|return|>`, its end-of-sequence
//! ids. The gateway must return OpenAI's shapes: `reasoning_content`,
//! `tool_calls` with `call_` ids, `finish_reason: "tool_calls"`, the same
//! message streamed and whole, and no Harmony marker anywhere, in Regular
//! and PD.

mod support;

use serde_json::{Value, json};
use support::chat::{FamilyModel, Script, assemble, weather_tools};
use support::{Gateway, SimWorker};

const MODEL_ID: &str = "openai/gpt-oss-20b";

const WEATHER: &str = "What is the weather in Paris?";
const WEATHER_REASONING: &str = "The user wants the weather in Paris; I should call get_weather.";
const WEATHER_ANSWER: &str = "<|channel|>analysis<|message|>The user wants the weather in Paris; I should call get_weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\",\"unit\":\"celsius\"}<|call|>";
const CALL_ARGUMENTS: &str = "{\"city\":\"Paris\",\"unit\":\"celsius\"}";
/// The call and its result as the template renders them for turn two: the
/// call on `commentary` to its function (arguments re-serialized from the
/// object the gateway hands the template), the result as a message from the
/// function the call id names. Matching it proves the prompt was Harmony.
const TOOL_RESULT: &str = "sunny, 21 °C";
const TOOL_RESULT_PROMPT: &str = "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\", \"unit\": \"celsius\"}<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>sunny, 21 °C<|end|><|start|>assistant";
const FOLLOW_UP_ANSWER: &str = "<|channel|>analysis<|message|>The tool says sunny.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny in Paris, 21 °C.<|return|>";

const FORMAT_QUESTION: &str = "Reply in JSON: is Paris in France?";
const FORMAT_REASONING: &str = "Paris is the capital of France.";
const FORMAT_JSON: &str = "{\"answer\": \"yes\"}";
const FORMAT_ANSWER: &str = "<|channel|>analysis<|message|>Paris is the capital of France.<|end|><|start|>assistant<|channel|>final<|constrain|>json<|message|>{\"answer\": \"yes\"}<|return|>";

const MARKERS: &[&str] = &[
    "<|start|>",
    "<|channel|>",
    "<|constrain|>",
    "<|message|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
];

fn request(messages: Value, stream: bool) -> Value {
    json!({"model": MODEL_ID, "messages": messages, "tools": weather_tools(),
           "max_tokens": 300, "stream": stream})
}

fn model() -> FamilyModel {
    FamilyModel::new("gpt-oss", MODEL_ID)
}

fn script() -> Script {
    support::chat::script(&[
        // The follow-up's prompt also holds the question: it must match first.
        json!({"when": TOOL_RESULT_PROMPT, "text": FOLLOW_UP_ANSWER}),
        json!({"when": WEATHER, "text": WEATHER_ANSWER}),
        json!({"when": FORMAT_QUESTION, "text": FORMAT_ANSWER}),
    ])
}

fn worker(role: &str, script: &Script) -> SimWorker {
    model().worker(role, script)
}

fn gateway(args: &[&str]) -> Gateway {
    model().gateway(args)
}

/// A whole answer, with no Harmony marker in it.
async fn whole(gateway: &Gateway, body: &Value) -> Value {
    let body = support::chat::whole(gateway, body).await;
    assert_no_markers(&body);
    body
}

/// A stream's chunks, none with a Harmony marker.
async fn chunks(gateway: &Gateway, body: &Value) -> Vec<Value> {
    let chunks = support::chat::chunks(gateway, body).await;
    for chunk in &chunks {
        assert_no_markers(chunk);
    }
    chunks
}

fn assert_no_markers(body: &Value) {
    let text = body.to_string();
    for marker in MARKERS {
        assert!(
            !text.contains(marker),
            "{marker} reached the client: {text}"
        );
    }
}

async fn check_two_turn_tool_loop(gateway: &Gateway) {
    let first = json!([{"role": "user", "content": WEATHER}]);
    let body = whole(gateway, &request(first.clone(), false)).await;
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
    let message = &choice["message"];
    assert_eq!(message["reasoning_content"], WEATHER_REASONING);
    assert_eq!(message["content"], Value::Null, "{message}");
    let calls = message["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(calls.len(), 1, "{message}");
    let id = calls[0]["id"].as_str().expect("id");
    assert!(id.starts_with("call_") && id.len() == 29, "{id}");
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(calls[0]["function"]["arguments"], CALL_ARGUMENTS);

    // Streamed: the same message, rebuilt from the deltas.
    let streamed = assemble(&chunks(gateway, &request(first.clone(), true)).await);
    assert_eq!(streamed.finish_reason, "tool_calls");
    assert_eq!(streamed.reasoning, WEATHER_REASONING);
    assert_eq!(streamed.content, "");
    assert_eq!(streamed.calls.len(), 1);
    let (streamed_id, name, arguments) = &streamed.calls[0];
    assert!(streamed_id.starts_with("call_"), "{streamed_id}");
    assert_eq!(
        (name.as_str(), arguments.as_str()),
        ("get_weather", CALL_ARGUMENTS)
    );

    // Turn two: the call and its result go back (with the reasoning, as
    // clients send it); the template renders them as Harmony messages and
    // the model answers on final.
    let mut history = first.as_array().expect("list").clone();
    history.push(json!({"role": "assistant", "content": null,
                        "reasoning_content": message["reasoning_content"],
                        "tool_calls": calls}));
    history.push(json!({"role": "tool", "tool_call_id": id, "content": TOOL_RESULT}));
    let second = Value::Array(history);
    let body = whole(gateway, &request(second.clone(), false)).await;
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "{body}");
    assert_eq!(choice["message"]["content"], "It is sunny in Paris, 21 °C.");
    assert_eq!(
        choice["message"]["reasoning_content"],
        "The tool says sunny."
    );
    assert!(choice["message"].get("tool_calls").is_none());
    let streamed = assemble(&chunks(gateway, &request(second, true)).await);
    assert_eq!(streamed.finish_reason, "stop");
    assert_eq!(streamed.content, "It is sunny in Paris, 21 °C.");
    assert_eq!(streamed.reasoning, "The tool says sunny.");
    assert!(streamed.calls.is_empty());
}

#[tokio::test]
async fn regular_mode_serves_a_two_turn_harmony_tool_loop() {
    let script = script();
    let worker = worker("regular", &script);
    let gateway = gateway(&["--worker-urls", &worker.grpc_url()]);
    check_two_turn_tool_loop(&gateway).await;
}

#[tokio::test]
async fn pd_mode_serves_a_two_turn_harmony_tool_loop() {
    let script = script();
    let prefill = worker("prefill", &script);
    let decode = worker("decode", &script);
    let gateway = gateway(&[
        "--pd-disaggregation",
        "--prefill",
        &prefill.grpc_url(),
        &prefill.bootstrap_port().to_string(),
        "--decode",
        &decode.grpc_url(),
    ]);
    check_two_turn_tool_loop(&gateway).await;
}

/// A Regular fleet whose sim worker logs the constraint of every request
/// (`--constraint-log`). Fields drop in order: the gateway first.
struct LoggedFleet {
    gateway: Gateway,
    _worker: SimWorker,
    _script: Script,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl LoggedFleet {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("constraints.log");
        let script = script();
        let log_arg = log.display().to_string();
        let worker = model().worker_with("regular", &script, &["--constraint-log", &log_arg]);
        let gateway = gateway(&["--worker-urls", &worker.grpc_url()]);
        Self {
            gateway,
            _worker: worker,
            _script: script,
            log,
            _dir: dir,
        }
    }
}

/// The constraints of the last two requests in the sim worker's
/// `--constraint-log` (`ID KIND TEXT` lines): both must be structural tags.
fn last_two_structural_tags(log: &std::path::Path) -> Vec<Value> {
    let text = std::fs::read_to_string(log).expect("the constraint log");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 2, "{text}");
    lines[lines.len() - 2..]
        .iter()
        .map(|line| {
            let (_, constraint) = line.split_once(' ').expect("id and constraint");
            let (kind, tag) = constraint.split_once(' ').expect("kind and text");
            assert_eq!(kind, "structural_tag", "{line}");
            serde_json::from_str(tag).expect("JSON")
        })
        .collect()
}

/// A forced call (`required`, a named function) reaches the engine as a
/// structural tag over Harmony's own `commentary` messages, not a JSON
/// schema over the whole output (which would take the model's channels
/// away), and its answer is read as Harmony: reasoning, then the call,
/// streamed and whole.
#[tokio::test]
async fn a_forced_call_is_a_structural_tag_and_reads_as_harmony() {
    let fleet = LoggedFleet::start();
    let (gateway, log) = (&fleet.gateway, fleet.log.as_path());
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    for (tool_choice, one_call) in [(json!("required"), false), (named, true)] {
        let mut body = request(json!([{"role": "user", "content": WEATHER}]), false);
        body["tool_choice"] = tool_choice.clone();
        let answer = whole(gateway, &body).await;
        let choice = &answer["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{answer}");
        assert_eq!(choice["message"]["reasoning_content"], WEATHER_REASONING);
        let calls = choice["message"]["tool_calls"]
            .as_array()
            .expect("tool_calls");
        assert_eq!(calls.len(), 1, "{answer}");
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        assert_eq!(calls[0]["function"]["arguments"], CALL_ARGUMENTS);
        body["stream"] = json!(true);
        let streamed = assemble(&chunks(gateway, &body).await);
        assert_eq!(streamed.finish_reason, "tool_calls");
        assert_eq!(streamed.reasoning, WEATHER_REASONING);
        assert_eq!(streamed.calls.len(), 1);

        // What the engine was asked to enforce, for both requests.
        for tag in last_two_structural_tags(log) {
            let format = &tag["format"];
            assert_eq!(format["type"], "triggered_tags");
            assert_eq!(format["at_least_one"], true);
            assert_eq!(format["stop_after_first"], one_call);
            assert_eq!(
                format["tags"][0]["begin"],
                "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
            );
            assert_eq!(
                format["tags"][0]["content"]["json_schema"]["required"],
                json!(["city"])
            );
        }
    }
}

/// `response_format` on gpt-oss holds only the `final` message's body to
/// the schema (a structural tag triggered by the final channel), so the
/// model still reasons on `analysis`; the `final<|constrain|>json` header
/// reads as the answer, whole and streamed.
#[tokio::test]
async fn a_response_format_is_a_structural_tag_on_the_final_channel() {
    let fleet = LoggedFleet::start();
    let (gateway, log) = (&fleet.gateway, fleet.log.as_path());
    let schema = json!({"type": "object", "properties": {"answer": {"type": "string"}},
                        "required": ["answer"]});
    let formats = [
        json!({"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}),
        json!({"type": "json_object"}),
    ];
    for format in formats {
        let mut body = json!({"model": MODEL_ID, "max_tokens": 100,
            "messages": [{"role": "user", "content": FORMAT_QUESTION}],
            "response_format": format});
        let answer = whole(gateway, &body).await;
        let message = &answer["choices"][0]["message"];
        assert_eq!(message["content"], FORMAT_JSON, "{answer}");
        assert_eq!(message["reasoning_content"], FORMAT_REASONING);
        assert_eq!(answer["choices"][0]["finish_reason"], "stop");
        body["stream"] = json!(true);
        let streamed = assemble(&chunks(gateway, &body).await);
        assert_eq!(streamed.content, FORMAT_JSON);
        assert_eq!(streamed.reasoning, FORMAT_REASONING);

        for tag in last_two_structural_tags(log) {
            let format_tag = &tag["format"];
            assert_eq!(
                format_tag["triggers"],
                json!(["<|start|>assistant<|channel|>final", "<|channel|>final"])
            );
            assert_eq!(
                format_tag["tags"][1]["begin"],
                "<|channel|>final<|constrain|>json<|message|>"
            );
            assert_eq!(format_tag["tags"][0]["content"]["type"], "json_schema");
            assert_eq!(format_tag["stop_after_first"], true);
        }
    }
    // With a forced call as well, the request is refused as any model's is.
    let body = json!({"model": MODEL_ID, "max_tokens": 100, "tools": weather_tools(),
        "tool_choice": "required", "messages": [{"role": "user", "content": FORMAT_QUESTION}],
        "response_format": {"type": "json_object"}});
    let refused = reqwest::Client::new()
        .post(gateway.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .expect("sent");
    assert_eq!(refused.status(), 400);
}

/// `tool_choice: none` and `separate_reasoning: false` still hide the
/// protocol: the call's body is the answer, reasoning moves into content.
#[tokio::test]
async fn tool_choice_none_and_inline_reasoning_never_show_markers() {
    let script = script();
    let worker = worker("regular", &script);
    let gateway = gateway(&["--worker-urls", &worker.grpc_url()]);
    let mut body = request(json!([{"role": "user", "content": WEATHER}]), false);
    body["tool_choice"] = json!("none");
    let answer = whole(&gateway, &body).await;
    let choice = &answer["choices"][0];
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["message"]["content"], CALL_ARGUMENTS);
    assert_eq!(choice["message"]["reasoning_content"], WEATHER_REASONING);
    assert!(choice["message"].get("tool_calls").is_none());

    body["separate_reasoning"] = json!(false);
    let answer = whole(&gateway, &body).await;
    let choice = &answer["choices"][0];
    assert_eq!(
        choice["message"]["content"],
        format!("{WEATHER_REASONING}{CALL_ARGUMENTS}")
    );
    assert!(choice["message"].get("reasoning_content").is_none());
    body["stream"] = json!(true);
    let streamed = assemble(&chunks(&gateway, &body).await);
    assert_eq!(
        streamed.content,
        format!("{WEATHER_REASONING}{CALL_ARGUMENTS}")
    );
    assert_eq!(streamed.finish_reason, "stop");
}
