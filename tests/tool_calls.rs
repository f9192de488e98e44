//! Tool calls and reasoning end to end: a scripted Qwen3-style model (the
//! `qwen3` family fixture and `smg-sim-worker --script`) answers with a think
//! block and Hermes tool calls, streamed as the fixture tokenizer's own ids,
//! and the gateway returns OpenAI's shapes: `reasoning_content`,
//! `tool_calls` with `call_` ids, `finish_reason: "tool_calls"`, the same
//! calls streamed and whole, in Regular and PD.

mod support;

use serde_json::{Value, json};
use support::chat::{FamilyModel, Script, assemble, chunks, http, weather_tools, whole};
use support::{Gateway, SimWorker};

const MODEL_ID: &str = "Qwen/Qwen3-8B";

const WEATHER: &str = "What is the weather in Paris and Rome?";
const WEATHER_ANSWER: &str = "<think>\nTwo cities: two calls. <tool_call> here is just thought.\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \"unit\": \"celsius\"}}\n</tool_call>";
const FOLLOW_UP: &str = "sunny in Paris";
const FOLLOW_UP_ANSWER: &str =
    "<think>\nBoth answered.\n</think>\n\nParis is sunny and Rome is 21 °C.";

fn model() -> FamilyModel {
    FamilyModel::new("qwen3", MODEL_ID)
}

fn script() -> Script {
    support::chat::script(&[
        // The follow-up's prompt holds the tool result; it must match first.
        json!({"when": FOLLOW_UP, "text": FOLLOW_UP_ANSWER}),
        json!({"when": WEATHER, "text": WEATHER_ANSWER}),
    ])
}

fn worker(role: &str, script: &Script) -> SimWorker {
    model().worker(role, script)
}

fn gateway(args: &[&str]) -> Gateway {
    model().gateway(args)
}

fn request(messages: Value, stream: bool) -> Value {
    json!({"model": MODEL_ID, "messages": messages, "tools": weather_tools(),
           "max_tokens": 300, "stream": stream})
}

fn arguments(text: &str) -> Value {
    serde_json::from_str(text).expect("arguments are JSON")
}

async fn check_two_turn_tool_loop(gateway: &Gateway) {
    let first = json!([{"role": "user", "content": WEATHER}]);
    let body = whole(gateway, &request(first.clone(), false)).await;
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
    let message = &choice["message"];
    assert_eq!(
        message["reasoning_content"],
        "\nTwo cities: two calls. <tool_call> here is just thought.\n"
    );
    // Text before and between the calls is kept; the blank lines the
    // model wrote after </think> are not answer text.
    assert_eq!(message["content"], "Let me check.\n\n");
    let calls = message["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(calls.len(), 2, "{message}");
    for call in calls {
        let id = call["id"].as_str().expect("id");
        assert!(id.starts_with("call_") && id.len() == 29, "{id}");
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "get_weather");
    }
    assert_eq!(
        arguments(calls[0]["function"]["arguments"].as_str().expect("text")),
        json!({"city": "Paris"})
    );
    assert_eq!(
        arguments(calls[1]["function"]["arguments"].as_str().expect("text")),
        json!({"city": "Rome", "unit": "celsius"})
    );

    // Streamed: the same message, rebuilt from the deltas.
    let streamed = assemble(&chunks(gateway, &request(first.clone(), true)).await);
    assert_eq!(streamed.finish_reason, "tool_calls");
    assert_eq!(streamed.reasoning, message["reasoning_content"]);
    assert_eq!(streamed.content, message["content"]);
    assert_eq!(streamed.calls.len(), 2);
    for ((id, name, args), whole) in streamed.calls.iter().zip(calls) {
        assert!(id.starts_with("call_"));
        assert_eq!(name, "get_weather");
        assert_eq!(args, whole["function"]["arguments"].as_str().expect("text"));
    }

    // Turn two: the calls and their results go back; the model answers.
    let mut history = first.as_array().expect("list").clone();
    history.push(json!({"role": "assistant", "content": message["content"],
                        "tool_calls": calls}));
    history.push(json!({"role": "tool", "tool_call_id": calls[0]["id"], "content": FOLLOW_UP}));
    history.push(json!({"role": "tool", "tool_call_id": calls[1]["id"], "content": "21 °C"}));
    let body = whole(gateway, &request(Value::Array(history), false)).await;
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "{body}");
    assert_eq!(
        choice["message"]["content"],
        "Paris is sunny and Rome is 21 °C."
    );
    assert_eq!(choice["message"]["reasoning_content"], "\nBoth answered.\n");
    assert!(choice["message"].get("tool_calls").is_none());
}

#[tokio::test]
async fn regular_mode_serves_a_two_turn_tool_loop() {
    let script = script();
    let worker = worker("regular", &script);
    let gateway = gateway(&["--worker-urls", &worker.grpc_url()]);
    check_two_turn_tool_loop(&gateway).await;
}

#[tokio::test]
async fn pd_mode_serves_a_two_turn_tool_loop() {
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

#[tokio::test]
async fn tool_choice_none_and_inline_reasoning_leave_the_text_raw() {
    let script = script();
    let worker = worker("regular", &script);
    let gateway = gateway(&["--worker-urls", &worker.grpc_url()]);
    let mut body = request(json!([{"role": "user", "content": WEATHER}]), false);
    body["tool_choice"] = json!("none");
    body["separate_reasoning"] = json!(false);
    let answer = whole(&gateway, &body).await;
    let choice = &answer["choices"][0];
    assert_eq!(choice["message"]["content"], WEATHER_ANSWER);
    assert_eq!(choice["finish_reason"], "stop");
    assert!(choice["message"].get("tool_calls").is_none());
    assert!(choice["message"].get("reasoning_content").is_none());

    // The operator can turn both parsers off for the model.
    drop(gateway);
    let gateway = gateway_with_flags(
        &worker,
        &[
            "--tool-call-parser",
            "passthrough",
            "--reasoning-parser",
            "passthrough",
        ],
    );
    let answer = whole(
        &gateway,
        &request(json!([{"role": "user", "content": WEATHER}]), false),
    )
    .await;
    assert_eq!(answer["choices"][0]["message"]["content"], WEATHER_ANSWER);
}

fn gateway_with_flags(worker: &SimWorker, flags: &[&str]) -> Gateway {
    let url = worker.grpc_url();
    let mut args = vec!["--worker-urls", url.as_str()];
    args.extend(flags);
    gateway(&args)
}

#[tokio::test]
async fn unknown_parser_names_stop_the_gateway_at_start_up() {
    let (status, stderr) = Gateway::fail_to_start(&[
        "--worker-urls",
        "grpc://127.0.0.1:9",
        "--tool-call-parser",
        "hermes2",
    ]);
    assert!(!status.success());
    assert!(
        stderr.contains("tool-call-parser") && stderr.contains("qwen"),
        "{stderr}"
    );
    let (status, stderr) = Gateway::fail_to_start(&[
        "--worker-urls",
        "grpc://127.0.0.1:9",
        "--model-reasoning-parser",
        "m=nope",
    ]);
    assert!(!status.success());
    assert!(stderr.contains("model-reasoning-parser"), "{stderr}");
}

/// The SSE events of a `/v1/messages` stream: (name, data).
async fn message_events(gateway: &Gateway, body: &Value) -> Vec<(String, Value)> {
    let response = http()
        .post(gateway.url("/v1/messages"))
        .json(body)
        .send()
        .await
        .expect("request sent");
    assert_eq!(response.status().as_u16(), 200);
    let text = response.text().await.expect("a body");
    text.split("\n\n")
        .filter(|frame| !frame.is_empty())
        .map(|frame| {
            let mut lines = frame.lines();
            let name = lines
                .next()
                .and_then(|l| l.strip_prefix("event: "))
                .expect("event");
            let data = lines
                .next()
                .and_then(|l| l.strip_prefix("data: "))
                .expect("data");
            (
                name.to_owned(),
                serde_json::from_str(data).expect("JSON data"),
            )
        })
        .collect()
}

#[tokio::test]
async fn anthropic_messages_carry_thinking_and_tool_use_blocks() {
    let script = script();
    let worker = worker("regular", &script);
    let gateway = gateway(&["--worker-urls", &worker.grpc_url()]);
    let tools = json!([{"name": "get_weather", "description": "Current weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"},
                         "unit": {"type": "string"}}, "required": ["city"]}}]);
    let first = json!([{"role": "user", "content": WEATHER}]);
    let body = json!({"model": MODEL_ID, "max_tokens": 300, "tools": tools, "messages": first});
    let response = http()
        .post(gateway.url("/v1/messages"))
        .json(&body)
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status().as_u16(), 200);
    let message: Value = response.json().await.expect("JSON");
    assert_eq!(message["stop_reason"], "tool_use", "{message}");
    let blocks = message["content"].as_array().expect("content");
    let kinds: Vec<&str> = blocks
        .iter()
        .map(|b| b["type"].as_str().expect("type"))
        .collect();
    assert_eq!(
        kinds,
        ["thinking", "text", "tool_use", "tool_use"],
        "{message}"
    );
    assert_eq!(
        blocks[0]["thinking"],
        "\nTwo cities: two calls. <tool_call> here is just thought.\n"
    );
    // The whitespace between the two calls is no text block.
    assert_eq!(blocks[1]["text"], "Let me check.\n");
    assert_eq!(blocks[2]["name"], "get_weather");
    assert_eq!(blocks[2]["input"], json!({"city": "Paris"}));
    assert_eq!(
        blocks[3]["input"],
        json!({"city": "Rome", "unit": "celsius"})
    );

    // Streamed: the same blocks, rebuilt from the events.
    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    let events = message_events(&gateway, &streamed_body).await;
    let mut rebuilt: Vec<Value> = Vec::new();
    let mut inputs: Vec<String> = Vec::new();
    let mut stop_reason = Value::Null;
    for (name, data) in &events {
        match name.as_str() {
            "content_block_start" => {
                assert_eq!(data["index"], rebuilt.len(), "blocks open in order");
                rebuilt.push(data["content_block"].clone());
                inputs.push(String::new());
            }
            "content_block_delta" => {
                let index = data["index"].as_u64().expect("index") as usize;
                let delta = &data["delta"];
                let block = &mut rebuilt[index];
                match delta["type"].as_str().expect("type") {
                    "thinking_delta" => {
                        let joined = format!(
                            "{}{}",
                            block["thinking"].as_str().expect("thinking"),
                            delta["thinking"].as_str().expect("text")
                        );
                        block["thinking"] = json!(joined);
                    }
                    "text_delta" => {
                        let joined = format!(
                            "{}{}",
                            block["text"].as_str().expect("text"),
                            delta["text"].as_str().expect("text")
                        );
                        block["text"] = json!(joined);
                    }
                    "input_json_delta" => {
                        inputs[index].push_str(delta["partial_json"].as_str().expect("json"))
                    }
                    other => panic!("unexpected delta {other}"),
                }
            }
            "message_delta" => stop_reason = data["delta"]["stop_reason"].clone(),
            _ => {}
        }
    }
    for (block, input) in rebuilt.iter_mut().zip(&inputs) {
        if block["type"] == "tool_use" {
            block["input"] = serde_json::from_str(input).expect("input JSON");
        }
    }
    assert_eq!(stop_reason, "tool_use");
    for (streamed, whole) in rebuilt.iter().zip(blocks) {
        let mut whole = whole.clone();
        let mut streamed = streamed.clone();
        // Ids are minted per response.
        for block in [&mut whole, &mut streamed] {
            if let Some(object) = block.as_object_mut() {
                object.remove("id");
            }
        }
        assert_eq!(streamed, whole);
    }
    assert_eq!(rebuilt.len(), blocks.len());

    // Turn two: thinking and tool_use go back, results as tool_result.
    let mut history = first.as_array().expect("list").clone();
    history.push(json!({"role": "assistant", "content": blocks}));
    history.push(json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": blocks[2]["id"], "content": FOLLOW_UP},
        {"type": "tool_result", "tool_use_id": blocks[3]["id"], "content": "21 °C"},
    ]}));
    let body = json!({"model": MODEL_ID, "max_tokens": 300, "tools": tools,
                      "messages": history});
    let response = http()
        .post(gateway.url("/v1/messages"))
        .json(&body)
        .send()
        .await
        .expect("sent");
    let message: Value = response.json().await.expect("JSON");
    assert_eq!(message["stop_reason"], "end_turn", "{message}");
    let blocks = message["content"].as_array().expect("content");
    assert_eq!(blocks[0]["type"], "thinking");
    assert_eq!(blocks[1]["text"], "Paris is sunny and Rome is 21 °C.");
}

const CUT_QUESTION: &str = "Weather in Paris, briefly?";
const CUT_ANSWER: &str = "<think>\nLook it up.\n</think>\n\nChecking.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>";

/// The shortest token prefix of `text` (the fixture tokenizer's ids, as the
/// sim worker streams them) whose decoded text contains `marker`.
fn tokens_through(text: &str, marker: &str) -> (u32, String) {
    let tokenizer = smg::tokenizer::Tokenizer::from_model_dir(&model().dir).expect("loads");
    let ids = tokenizer.encode(text, false).expect("encodes");
    (1..=ids.len())
        .map(|n| (n, tokenizer.decode(&ids[..n], false).expect("decodes")))
        .find(|(_, prefix)| prefix.contains(marker))
        .map(|(n, prefix)| (n as u32, prefix))
        .expect("the marker is in the text")
}

/// `max_tokens` ends the answer inside a call's arguments: the call is no
/// call (finish_reason stays "length"), its raw text is content, the
/// reasoning is reasoning, and a stream gives the same content and
/// reasoning as the whole answer.
#[tokio::test]
async fn a_call_cut_off_by_max_tokens_comes_back_as_content() {
    let script = support::chat::script(&[json!({"when": CUT_QUESTION, "text": CUT_ANSWER})]);
    let worker = worker("regular", &script);
    let gateway = gateway(&["--worker-urls", &worker.grpc_url()]);
    let (max_tokens, generated) = tokens_through(CUT_ANSWER, "\"unit\": \"");
    assert!(
        !generated.contains("celsius\"}}"),
        "the cut falls inside the arguments: {generated:?}"
    );
    let (_, answer) = generated
        .split_once("</think>")
        .expect("a whole think block");
    let answer = answer.trim_start();
    let mut body = request(json!([{"role": "user", "content": CUT_QUESTION}]), false);
    body["max_tokens"] = json!(max_tokens);

    let response = whole(&gateway, &body).await;
    let choice = &response["choices"][0];
    assert_eq!(choice["finish_reason"], "length", "{response}");
    let message = &choice["message"];
    assert_eq!(
        message["reasoning_content"], "\nLook it up.\n",
        "{response}"
    );
    assert_eq!(message["content"], answer, "{response}");
    assert!(message.get("tool_calls").is_none(), "{response}");

    body["stream"] = json!(true);
    let streamed = assemble(&chunks(&gateway, &body).await);
    assert_eq!(streamed.finish_reason, "length");
    assert_eq!(streamed.reasoning, message["reasoning_content"]);
    assert_eq!(streamed.content, message["content"]);
}
