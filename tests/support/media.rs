//! Image helpers shared by the end-to-end tests: fixture images, chat
//! messages carrying them, the header a sim worker must answer with for
//! them (computed with the same preprocessing kernel), and the gateway's
//! metrics.

#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use smg_dataplane::preprocess::{ImageLimits, Qwen2VlImageProcessor, VisionPreprocessConfig};
use smg_shared::tensor::DType;

use super::{Gateway, digest, expected_header};

/// The fixture model's `<|image_pad|>` id.
const IMAGE_PAD: u32 = 4005;

pub fn images_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("dataplane/tests/fixtures/images")
}

pub fn image_url(name: &str) -> String {
    format!("file://{}", images_dir().join(name).display())
}

pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client")
}

/// A user turn with the given images and a question.
pub fn messages(images: &[String]) -> Value {
    let mut content: Vec<Value> = images
        .iter()
        .map(|url| json!({"type": "image_url", "image_url": {"url": url}}))
        .collect();
    content.push(json!({"type": "text", "text": "What is in the picture?"}));
    json!([{"role": "user", "content": content}])
}

/// What the worker must have received for these fixture images: the
/// prompt's ids with each placeholder expanded, and each item's digest.
pub fn expected(images: &[&str], messages: &Value) -> String {
    let tokenizer =
        smg::tokenizer::Tokenizer::from_model_dir(&super::model_dir()).expect("tokenizer");
    let options = smg::tokenizer::ChatTemplateOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    let text = tokenizer
        .apply_chat_template(messages.as_array().expect("list"), &options)
        .expect("template");
    let ids = tokenizer.encode(&text, false).expect("ids");
    let processor = processor();
    let mut items = Vec::new();
    let mut tokens = Vec::new();
    for name in images {
        let bytes = std::fs::read(images_dir().join(name)).expect("fixture image");
        let image = processor
            .preprocess(&bytes, DType::BFloat16)
            .expect("preprocess");
        let grid: Vec<u8> = image
            .plan
            .image_grid_thw()
            .iter()
            .flat_map(|&v| i64::from(v).to_le_bytes())
            .collect();
        items.push(digest::item_digest(
            &digest::tensor_digest("bfloat16", &image.plan.out_shape, &image.data),
            &[(
                "image_grid_thw".to_owned(),
                digest::tensor_digest("int64", &[1, 3], &grid),
            )],
        ));
        tokens.push(image.plan.tokens as usize);
    }
    let mut expanded = Vec::new();
    let mut per_image = tokens.into_iter();
    for id in ids {
        if id == IMAGE_PAD {
            expanded.extend(std::iter::repeat_n(
                IMAGE_PAD,
                per_image.next().expect("one per image"),
            ));
        } else {
            expanded.push(id);
        }
    }
    expected_header(&expanded, &items)
}

pub async fn chat(gateway: &Gateway, messages: &Value) -> (u16, Value) {
    let response = http()
        .post(gateway.url("/v1/chat/completions"))
        .json(
            &json!({"model": "model", "messages": messages, "max_tokens": 40, "ignore_eos": true}),
        )
        .send()
        .await
        .expect("sent");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The gateway's `/metrics` text.
pub async fn metrics_text(gateway: &Gateway) -> String {
    http()
        .get(format!("http://{}/metrics", gateway.metrics))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text")
}

/// The sum of a metric's samples whose line contains every `labels` part
/// (0 when absent).
pub fn metric(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
        })
        .filter(|line| labels.iter().all(|label| line.contains(label)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The preprocessing kernel the fixture model uses.
pub fn processor() -> Qwen2VlImageProcessor {
    let config = VisionPreprocessConfig::from_model_dir(&super::model_dir()).expect("config");
    Qwen2VlImageProcessor::new(config, ImageLimits::default()).expect("processor")
}
