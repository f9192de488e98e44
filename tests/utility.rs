//! The gateway's utility endpoints through a real `smg` process:
//! `/v1/tokenize` and `/v1/detokenize` answer with the fixture tokenizer's
//! exact ids and text, one item or a batch, and refuse what they cannot
//! answer with the documented codes.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{Gateway, SimWorker};

async fn post(gateway: &Gateway, path: &str, body: Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(gateway.url(path))
        .timeout(Duration::from_secs(30))
        .json(&body)
        .send()
        .await
        .expect("request sent");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn tokenize_and_detokenize_use_the_models_tokenizer() {
    let worker = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--served-model-name",
        "model",
    ]);
    let hello = "Hello world, café 東京";
    let ids = support::encode(hello);
    assert!(ids.len() > 3, "the fixture splits the text into tokens");

    let (status, one) = post(
        &gateway,
        "/v1/tokenize",
        json!({"model": "model", "prompt": hello}),
    )
    .await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(one["tokens"], json!(ids));
    assert_eq!(one["count"], ids.len());
    assert_eq!(one["char_count"], hello.chars().count());
    assert!(one["max_model_len"].as_u64().is_some_and(|len| len > 0));

    let (status, batch) = post(
        &gateway,
        "/v1/tokenize",
        json!({"prompt": [hello, "", "x"]}),
    )
    .await;
    assert_eq!(status, 200, "{batch}");
    assert_eq!(batch["tokens"], json!([ids, [], support::encode("x")]));
    assert_eq!(batch["count"], json!([ids.len(), 0, 1]));

    let (status, text) = post(&gateway, "/v1/detokenize", json!({"tokens": ids})).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(text["text"], hello);
    let (status, texts) = post(
        &gateway,
        "/v1/detokenize",
        json!({"model": "model", "tokens": [ids, support::encode("x")]}),
    )
    .await;
    assert_eq!(status, 200, "{texts}");
    assert_eq!(texts["text"], json!([hello, "x"]));

    // Special tokens: kept only when asked (`<|im_end|>` is 4002).
    let (_, kept) = post(
        &gateway,
        "/v1/detokenize",
        json!({"tokens": [4002], "skip_special_tokens": false}),
    )
    .await;
    assert_eq!(kept["text"], "<|im_end|>");
    let (_, skipped) = post(&gateway, "/v1/detokenize", json!({"tokens": [4002]})).await;
    assert_eq!(skipped["text"], "");

    let (status, outside) = post(
        &gateway,
        "/v1/detokenize",
        json!({"tokens": [[1], [1, 999999]]}),
    )
    .await;
    assert_eq!(status, 400, "{outside}");
    assert_eq!(outside["error"]["param"], "tokens[1]");
    let (status, unknown) = post(
        &gateway,
        "/v1/tokenize",
        json!({"model": "other", "prompt": "hi"}),
    )
    .await;
    assert_eq!(status, 404, "{unknown}");
    assert_eq!(unknown["error"]["code"], "model_not_found");
    let (status, shape) = post(&gateway, "/v1/tokenize", json!({"prompt": 5})).await;
    assert_eq!(status, 400, "{shape}");
}

async fn post_admin(gateway: &Gateway, path: &str, body: Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(gateway.admin_url(path))
        .timeout(Duration::from_secs(30))
        .json(&body)
        .send()
        .await
        .expect("request sent");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn the_parse_routes_run_the_output_parsers_on_the_admin_listener() {
    let worker = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let gateway = Gateway::start(&["--worker-urls", &worker.grpc_url()]);
    let text = "Checking.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let (status, parsed) = post_admin(
        &gateway,
        "/parse/function_call",
        json!({"text": text, "tool_call_parser": "qwen", "tools": tools}),
    )
    .await;
    assert_eq!(status, 200, "{parsed}");
    assert_eq!(parsed["success"], true);
    assert_eq!(parsed["remaining_text"], "Checking.");
    assert_eq!(parsed["tool_calls"][0]["function"]["name"], "get_weather");
    let arguments: Value = serde_json::from_str(
        parsed["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .expect("text"),
    )
    .expect("JSON arguments");
    assert_eq!(arguments, json!({"city": "Paris"}));

    let (status, reasoning) = post_admin(
        &gateway,
        "/parse/reasoning",
        json!({"text": "<think>hmm</think>Answer.", "reasoning_parser": "qwen3"}),
    )
    .await;
    assert_eq!(status, 200, "{reasoning}");
    assert_eq!(reasoning["reasoning_text"], "hmm");
    assert_eq!(reasoning["normal_text"], "Answer.");
    let (status, r1) = post_admin(
        &gateway,
        "/parse/reasoning",
        json!({"text": "hmm</think>Answer.", "reasoning_parser": "deepseek_r1"}),
    )
    .await;
    assert_eq!(status, 200, "{r1}");
    assert_eq!(r1["reasoning_text"], "hmm");

    let (status, unknown) = post_admin(
        &gateway,
        "/parse/function_call",
        json!({"text": "x", "tool_call_parser": "hermes9"}),
    )
    .await;
    assert_eq!(status, 400, "{unknown}");
    assert_eq!(unknown["error"]["param"], "tool_call_parser");
    assert!(
        unknown["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("qwen"))
    );
    // Not on the public listener without control-plane keys.
    let (status, _) = post(
        &gateway,
        "/parse/reasoning",
        json!({"text": "", "reasoning_parser": "qwen3"}),
    )
    .await;
    assert_eq!(status, 404);
}
