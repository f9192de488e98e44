//! The chat side of the end-to-end harness: a family test model served by
//! scripted sim workers, requests sent whole or streamed, and a stream put
//! back together the way OpenAI's SDKs do (text and reasoning concatenated,
//! calls accumulated by `index`, checked as they go: ids and names once,
//! indexes in order).

use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};

use super::{Gateway, SimWorker};

/// A family fixture under `tests/fixtures/models/` served under `model_id`.
#[derive(Debug, Clone)]
pub struct FamilyModel {
    pub dir: PathBuf,
    pub model_id: &'static str,
}

/// A `--script` file in a directory that lives as long as this value.
#[derive(Debug)]
pub struct Script {
    _dir: tempfile::TempDir,
    pub path: String,
}

/// Writes `lines` (`{"when", "text"}` objects) as a script file.
pub fn script(lines: &[Value]) -> Script {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("script.jsonl");
    let text: String = lines.iter().map(|line| format!("{line}\n")).collect();
    std::fs::write(&path, text).expect("write the script");
    let path = path.to_str().expect("UTF-8").to_owned();
    Script { _dir: dir, path }
}

impl FamilyModel {
    pub fn new(family: &str, model_id: &'static str) -> Self {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/models")
            .join(family);
        FamilyModel { dir, model_id }
    }

    /// A zero-delay TokenSpeed worker of `role` playing `script`.
    pub fn worker(&self, role: &str, script: &Script) -> SimWorker {
        self.worker_with(role, script, &[])
    }

    /// As [`FamilyModel::worker`], with more sim-worker flags.
    pub fn worker_with(&self, role: &str, script: &Script, extra: &[&str]) -> SimWorker {
        let mut args = vec![
            "--zero-delay",
            "--script",
            &script.path,
            "--served-model-name",
            self.model_id,
        ];
        args.extend_from_slice(extra);
        SimWorker::start_with_model("tokenspeed", role, &self.dir, &args)
    }

    /// A gateway on this model, with `args`.
    pub fn gateway(&self, args: &[&str]) -> Gateway {
        let mut all = args.to_vec();
        all.extend(["--served-model-name", self.model_id]);
        Gateway::start_with_model(Some(&self.dir), &all)
    }
}

/// One `get_weather(city, unit?)` tool, OpenAI-shaped.
pub fn weather_tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"type": "string"}}, "required": ["city"]},
    }}])
}

pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client")
}

/// A non-streamed chat completion's body; the status must be 200.
pub async fn whole(gateway: &Gateway, body: &Value) -> Value {
    let response = http()
        .post(gateway.url("/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .expect("request sent");
    let status = response.status().as_u16();
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(status, 200, "{body}");
    body
}

/// A streamed chat completion's chunks, parsed; the stream must end with
/// `[DONE]`.
pub async fn chunks(gateway: &Gateway, body: &Value) -> Vec<Value> {
    let response = http()
        .post(gateway.url("/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .expect("request sent");
    assert_eq!(response.status().as_u16(), 200);
    let mut text = String::new();
    let mut bytes = response.bytes_stream();
    while let Some(piece) = bytes.next().await {
        text.push_str(std::str::from_utf8(&piece.expect("body")).expect("UTF-8"));
    }
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    text.split("\n\n")
        .filter_map(|frame| frame.strip_prefix("data: "))
        .filter(|payload| *payload != "[DONE]")
        .map(|payload| serde_json::from_str(payload).expect("a JSON chunk"))
        .collect()
}

/// A streamed message put back together.
#[derive(Debug, Default)]
pub struct Assembled {
    pub content: String,
    pub reasoning: String,
    /// (id, name, arguments) per index.
    pub calls: Vec<(String, String, String)>,
    pub finish_reason: String,
}

/// Rebuilds choice 0 from `chunks`, checking the call fragments' shape: a
/// call's first fragment carries `id`, `type` and its name, later ones
/// neither; indexes come 0, 1, ... in order.
pub fn assemble(chunks: &[Value]) -> Assembled {
    let mut out = Assembled::default();
    for chunk in chunks {
        let Some(choice) = chunk["choices"].get(0) else {
            continue;
        };
        let delta = &choice["delta"];
        out.content
            .push_str(delta["content"].as_str().unwrap_or_default());
        out.reasoning
            .push_str(delta["reasoning_content"].as_str().unwrap_or_default());
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().expect("index") as usize;
            if let Some(name) = call["function"]["name"].as_str() {
                assert_eq!(index, out.calls.len(), "indexes 0..n-1 in order");
                assert_eq!(call["type"], "function");
                let id = call["id"].as_str().expect("the first fragment has an id");
                out.calls
                    .push((id.to_owned(), name.to_owned(), String::new()));
            } else {
                assert!(
                    call.get("id").is_none() && call.get("type").is_none(),
                    "{call}"
                );
            }
            let arguments = call["function"]["arguments"].as_str().unwrap_or_default();
            out.calls[index].2.push_str(arguments);
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            out.finish_reason = reason.to_owned();
        }
    }
    out
}
