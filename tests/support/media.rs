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

/// A fixture image as a `data:` URL (base64, with its media type).
pub fn image_data_url(name: &str) -> String {
    use base64::Engine as _;
    let bytes = std::fs::read(images_dir().join(name)).expect("fixture image");
    let media_type = match name.rsplit('.').next() {
        Some("png") => "image/png",
        Some("webp") => "image/webp",
        _ => "image/jpeg",
    };
    let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
    format!("data:{media_type};base64,{encoded}")
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

/// What a TokenSpeed worker must have received for these fixture images:
/// the prompt's ids with each placeholder expanded, and each item's digest.
/// (For one image, SGLang's single concatenated item digests the same.)
pub fn expected(images: &[&str], messages: &Value) -> String {
    expected_for(Packing::PerItem, images, messages)
}

/// How a protocol packs a request's images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packing {
    /// TokenSpeed: one `MultimodalItem` per image, in prompt order.
    PerItem,
    /// SGLang: one `pixel_values` and one `image_grid_thw`, each the images'
    /// tensors concatenated along the first axis.
    Concatenated,
}

/// What a worker speaking a protocol that packs images as `packing` must
/// have received.
pub fn expected_for(packing: Packing, images: &[&str], messages: &Value) -> String {
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
    let mut tokens = Vec::new();
    // Per image: pixel rows, pixel bytes, grid bytes.
    let mut tensors: Vec<(u32, Vec<u8>, Vec<u8>)> = Vec::new();
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
        tokens.push(image.plan.tokens as usize);
        tensors.push((image.plan.out_shape[0], image.data, grid));
    }
    let item = |rows: u32, pixels: &[u8], grids: u32, grid: &[u8]| {
        let columns = u32::try_from(pixels.len() / 2 / rows.max(1) as usize).expect("columns");
        digest::item_digest(
            &digest::tensor_digest("bfloat16", &[rows, columns], pixels),
            &[(
                "image_grid_thw".to_owned(),
                digest::tensor_digest("int64", &[grids, 3], grid),
            )],
        )
    };
    let items: Vec<[u8; 32]> = match packing {
        Packing::PerItem => tensors
            .iter()
            .map(|(rows, pixels, grid)| item(*rows, pixels, 1, grid))
            .collect(),
        Packing::Concatenated if tensors.is_empty() => Vec::new(),
        Packing::Concatenated => {
            let rows = tensors.iter().map(|(rows, _, _)| rows).sum();
            let pixels: Vec<u8> = tensors.iter().flat_map(|(_, p, _)| p.clone()).collect();
            let grid: Vec<u8> = tensors.iter().flat_map(|(_, _, g)| g.clone()).collect();
            let count = u32::try_from(tensors.len()).expect("image count");
            vec![item(rows, &pixels, count, &grid)]
        }
    };
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
