//! The Responses side of the end-to-end harness: requests sent whole or
//! streamed, and a stream split back into its named events.

use serde_json::Value;

use super::chat::http;
use super::{Gateway, bounded};

/// Sends `request`; its status and body (JSON, or the text as a string).
pub async fn send(request: reqwest::RequestBuilder) -> (u16, Value) {
    bounded("an HTTP exchange", async {
        let response = request.send().await.expect("request sent");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, body)
    })
    .await
}

pub async fn post(gateway: &Gateway, path: &str, body: &Value) -> (u16, Value) {
    send(http().post(gateway.url(path)).json(body)).await
}

pub async fn get(gateway: &Gateway, path: &str) -> (u16, Value) {
    send(http().get(gateway.url(path))).await
}

pub async fn delete(gateway: &Gateway, path: &str) -> (u16, Value) {
    send(http().delete(gateway.url(path))).await
}

/// A whole response that must be answered with 200.
pub async fn create(gateway: &Gateway, body: Value) -> Value {
    let (status, response) = post(gateway, "/v1/responses", &body).await;
    assert_eq!(status, 200, "{response}");
    response
}

/// The text of a response's message items.
pub fn output_text(response: &Value) -> String {
    response["output"]
        .as_array()
        .expect("output")
        .iter()
        .filter(|item| item["type"] == "message")
        .flat_map(|item| item["content"].as_array().expect("content").iter())
        .filter_map(|part| part["text"].as_str())
        .collect()
}

/// The digest a sim worker starts its answer with (`digest=<16 hex>.`).
pub fn digest(text: &str) -> &str {
    assert!(text.starts_with("digest="), "{text:?}");
    &text[..24]
}

/// The content of a whole chat completion over `messages`.
pub async fn chat_text(gateway: &Gateway, messages: Value) -> String {
    let (status, body) = post(
        gateway,
        "/v1/chat/completions",
        &serde_json::json!({"model": "model", "messages": messages, "max_tokens": 64}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_owned()
}

/// A streamed response's events: (SSE event name, data).
pub async fn events(gateway: &Gateway, body: &Value) -> Vec<(String, Value)> {
    let response = http()
        .post(gateway.url("/v1/responses"))
        .json(body)
        .send()
        .await
        .expect("request sent");
    assert_eq!(response.status().as_u16(), 200);
    let text = response.text().await.expect("body");
    parse_events(&text)
}

/// Splits an SSE body into (event name, data) pairs, checking that each
/// frame's event line names its data's `type`.
pub fn parse_events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter(|frame| !frame.trim().is_empty())
        .map(|frame| {
            let mut lines = frame.lines();
            let name = lines
                .next()
                .and_then(|line| line.strip_prefix("event: "))
                .unwrap_or_else(|| panic!("an event line in {frame:?}"));
            let data = lines
                .next()
                .and_then(|line| line.strip_prefix("data: "))
                .unwrap_or_else(|| panic!("a data line in {frame:?}"));
            let data: Value = serde_json::from_str(data).expect("JSON data");
            assert_eq!(data["type"], name, "the event line names the type");
            (name.to_owned(), data)
        })
        .collect()
}

pub fn names(events: &[(String, Value)]) -> Vec<&str> {
    events.iter().map(|(name, _)| name.as_str()).collect()
}
