//! `/v1/embeddings` (OpenAI) and `/v1/classify` (SGLang) wire types.
//!
//! Both take a batch of inputs and return one result per input, with no
//! sampling and no streaming, so they skip the generation spec: the caller
//! gets the validated inputs from `to_inputs` and builds the response from
//! the engine's vectors.
//!
//! Embeddings follow OpenAI exactly, including `encoding_format: "base64"`
//! (little-endian f32 bytes, base64-encoded), which the OpenAI Python SDK
//! asks for by default. Classification is SGLang's shape, kept small: a label
//! and the class probabilities per input.

use serde::{Deserialize, Serialize};

use super::forms::{InputItem, ListObject, PromptInput, literal_tag};
use super::validate::check_inputs;
use crate::error::{Error, Result};

literal_tag!(
    /// `"embedding"`, the `object` of each embedding.
    EmbeddingObject = "embedding"
);

/// The most inputs one request may carry (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

/// How embeddings are written in the response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EncodingFormat {
    /// A JSON array of numbers.
    #[default]
    Float,
    /// The little-endian f32 bytes, base64-encoded.
    Base64,
}

/// `POST /v1/embeddings`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingRequest {
    pub model: String,
    /// A string, strings, token ids or token-id lists.
    pub input: PromptInput,
    /// Defaults to [`EncodingFormat::Float`].
    pub encoding_format: Option<EncodingFormat>,
    /// Truncate each embedding to this many dimensions (models trained for
    /// it only); at least 1.
    pub dimensions: Option<u32>,
    pub user: Option<String>,
}

/// Inputs: at least one, at most [`MAX_INPUTS`], none empty.
fn checked_inputs(input: &PromptInput) -> Result<Vec<InputItem>> {
    let items = input.to_items();
    check_inputs("input", &items)?;
    if items.len() > MAX_INPUTS {
        return Err(Error::invalid_parameter(
            "input",
            format!(
                "holds {} inputs; at most {MAX_INPUTS} are allowed",
                items.len()
            ),
        ));
    }
    Ok(items)
}

impl EmbeddingRequest {
    /// Validates the request and returns its inputs, in order.
    pub fn to_inputs(&self) -> Result<Vec<InputItem>> {
        if self.dimensions == Some(0) {
            return Err(Error::invalid_parameter("dimensions", "must be at least 1"));
        }
        checked_inputs(&self.input)
    }
}

/// One embedding, as floats or as base64 (see [`EncodingFormat`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EmbeddingVector {
    Float(Vec<f32>),
    Base64(String),
}

impl EmbeddingVector {
    /// Encodes `values` as the request asked.
    pub fn encode(values: &[f32], format: EncodingFormat) -> Self {
        match format {
            EncodingFormat::Float => EmbeddingVector::Float(values.to_vec()),
            EncodingFormat::Base64 => {
                let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                EmbeddingVector::Base64(base64_encode(&bytes))
            }
        }
    }
}

/// Standard base64 (RFC 4648, with padding).
fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let sextets = [
            b[0] >> 2,
            ((b[0] & 0x03) << 4) | (b[1] >> 4),
            ((b[1] & 0x0f) << 2) | (b[2] >> 6),
            b[2] & 0x3f,
        ];
        // A chunk of n bytes carries n + 1 sextets; the rest is padding.
        for (position, &sextet) in sextets.iter().enumerate() {
            if position <= chunk.len() {
                out.push(char::from(ALPHABET[usize::from(sextet)]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingData {
    pub object: EmbeddingObject,
    /// The input's position in the request.
    pub index: u32,
    pub embedding: EmbeddingVector,
}

/// Token counts of a request without output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputUsage {
    pub prompt_tokens: u32,
    /// Equal to `prompt_tokens`.
    pub total_tokens: u32,
}

impl InputUsage {
    pub fn new(prompt_tokens: u32) -> Self {
        Self {
            prompt_tokens,
            total_tokens: prompt_tokens,
        }
    }
}

/// The `/v1/embeddings` response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingResponse {
    pub object: ListObject,
    pub data: Vec<EmbeddingData>,
    pub model: String,
    pub usage: InputUsage,
}

/// `POST /v1/classify`: which class each input belongs to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassifyRequest {
    pub model: String,
    /// A string, strings, token ids or token-id lists.
    pub input: PromptInput,
}

impl ClassifyRequest {
    /// Validates the request and returns its inputs, in order.
    pub fn to_inputs(&self) -> Result<Vec<InputItem>> {
        checked_inputs(&self.input)
    }
}

/// The class of one input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Classification {
    /// The input's position in the request.
    pub index: u32,
    /// The most probable class's name (the model's `id2label`).
    pub label: String,
    /// Every class's probability, in class-id order.
    pub probs: Vec<f32>,
}

/// The `/v1/classify` response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassifyResponse {
    pub id: String,
    pub object: ListObject,
    pub created: u64,
    pub model: String,
    pub data: Vec<Classification>,
    pub usage: InputUsage,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
    use serde_json::{Value, json};

    fn embedding_request(body: Value) -> EmbeddingRequest {
        serde_json::from_value(body).expect("a valid embeddings request")
    }

    #[test]
    fn embedding_inputs_in_all_four_forms() {
        let cases = [
            (json!("hello"), vec![InputItem::Text("hello".into())]),
            (
                json!(["a", "b"]),
                vec![InputItem::Text("a".into()), InputItem::Text("b".into())],
            ),
            (json!([1, 2, 3]), vec![InputItem::TokenIds(vec![1, 2, 3])]),
            (
                json!([[1, 2], [3]]),
                vec![
                    InputItem::TokenIds(vec![1, 2]),
                    InputItem::TokenIds(vec![3]),
                ],
            ),
        ];
        for (input, expected) in cases {
            let request = embedding_request(json!({
                "model": "e5", "input": input, "encoding_format": "base64", "dimensions": 256,
            }));
            assert_eq!(request.encoding_format, Some(EncodingFormat::Base64));
            assert_eq!(request.dimensions, Some(256));
            assert_eq!(request.to_inputs().expect("valid"), expected, "{input}");
        }
    }

    #[test]
    fn invalid_embedding_requests_name_the_parameter() {
        let too_many: Vec<String> = vec!["x".to_string(); MAX_INPUTS + 1];
        let cases = [
            (json!({"input": []}), "input"),
            (json!({"input": ""}), "input"),
            (json!({"input": ["a", ""]}), "input"),
            (json!({"input": [[1], []]}), "input"),
            (json!({"input": too_many}), "input"),
            (json!({"input": "a", "dimensions": 0}), "dimensions"),
        ];
        for (mut body, param) in cases {
            body["model"] = json!("e5");
            let err = embedding_request(body).to_inputs().expect_err(param);
            assert_eq!(err.code, ErrorCode::InvalidParameter, "{err}");
            assert_eq!(err.param.as_deref(), Some(param), "{err}");
        }
        let unknown_format = serde_json::from_value::<EmbeddingRequest>(
            json!({"model": "e5", "input": "a", "encoding_format": "int8"}),
        );
        assert!(unknown_format.is_err());
    }

    #[test]
    fn base64_matches_known_encodings() {
        // RFC 4648 test vectors.
        let vectors = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, encoded) in vectors {
            assert_eq!(base64_encode(plain.as_bytes()), encoded, "{plain}");
        }
        // 1.0f32 is 00 00 80 3f little-endian; -2.0f32 is 00 00 00 c0.
        assert_eq!(
            EmbeddingVector::encode(&[1.0, -2.0], EncodingFormat::Base64),
            EmbeddingVector::Base64("AACAPwAAAMA=".into())
        );
    }

    #[test]
    fn embedding_response_serializes_as_openai_does() {
        let response = EmbeddingResponse {
            object: ListObject,
            data: vec![
                EmbeddingData {
                    object: EmbeddingObject,
                    index: 0,
                    embedding: EmbeddingVector::encode(&[0.5, -0.25], EncodingFormat::Float),
                },
                EmbeddingData {
                    object: EmbeddingObject,
                    index: 1,
                    embedding: EmbeddingVector::encode(&[1.0], EncodingFormat::Base64),
                },
            ],
            model: "e5".into(),
            usage: InputUsage::new(7),
        };
        let expected = json!({
            "object": "list",
            "data": [
                {"object": "embedding", "index": 0, "embedding": [0.5, -0.25]},
                {"object": "embedding", "index": 1, "embedding": "AACAPw=="},
            ],
            "model": "e5",
            "usage": {"prompt_tokens": 7, "total_tokens": 7},
        });
        let actual = serde_json::to_value(&response).expect("serialize");
        assert_eq!(actual, expected);
        assert_eq!(
            serde_json::from_value::<EmbeddingResponse>(actual).expect("parse back"),
            response
        );
    }

    #[test]
    fn classify_request_and_response() {
        let request: ClassifyRequest = serde_json::from_value(json!({
            "model": "sentiment", "input": ["great film", "dull"],
        }))
        .expect("a valid classify request");
        assert_eq!(
            request.to_inputs().expect("valid"),
            vec![
                InputItem::Text("great film".into()),
                InputItem::Text("dull".into())
            ]
        );
        let empty: ClassifyRequest =
            serde_json::from_value(json!({"model": "sentiment", "input": []}))
                .expect("parses; validation rejects");
        assert_eq!(
            empty.to_inputs().expect_err("empty").param.as_deref(),
            Some("input")
        );

        let response = ClassifyResponse {
            id: "classify-1".into(),
            object: ListObject,
            created: 5,
            model: "sentiment".into(),
            data: vec![Classification {
                index: 0,
                label: "positive".into(),
                probs: vec![0.25, 0.75],
            }],
            usage: InputUsage::new(3),
        };
        assert_eq!(
            serde_json::to_value(&response).expect("serialize"),
            json!({
                "id": "classify-1", "object": "list", "created": 5, "model": "sentiment",
                "data": [{"index": 0, "label": "positive", "probs": [0.25, 0.75]}],
                "usage": {"prompt_tokens": 3, "total_tokens": 3},
            })
        );
    }
}
