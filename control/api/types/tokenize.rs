//! `/v1/tokenize` and `/v1/detokenize` (SGLang's and SMG's shapes): the
//! model's tokenizer as a service, so clients count and cut prompts with the
//! exact ids the engines will see.
//!
//! Both take one item or a batch and answer in the same form: a string
//! prompt gives `tokens: [ids]`, a list gives `tokens: [[ids], ...]`.

use serde::{Deserialize, Serialize};

use super::forms::TextOrList;

/// `POST /v1/tokenize`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TokenizeRequest {
    /// Optional when the gateway serves one model.
    pub model: Option<String>,
    pub prompt: TextOrList<String>,
    /// Default false: the ids of the text alone, as a chat template's
    /// output is encoded.
    pub add_special_tokens: Option<bool>,
}

/// One value, or one per item of a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum OneOrBatch<T> {
    One(T),
    Batch(Vec<T>),
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenizeResponse {
    pub tokens: OneOrBatch<Vec<u32>>,
    pub count: OneOrBatch<usize>,
    /// Characters (Unicode scalar values) of each prompt.
    pub char_count: OneOrBatch<usize>,
    pub max_model_len: u32,
}

/// `POST /v1/detokenize`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    /// `[ids]` or a batch `[[ids], ...]`.
    pub tokens: OneOrBatch<Vec<u32>>,
    /// Default true.
    pub skip_special_tokens: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DetokenizeResponse {
    pub text: OneOrBatch<String>,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn single_and_batch_token_lists_are_told_apart() {
        let one: DetokenizeRequest = serde_json::from_str(r#"{"tokens": [1, 2]}"#).unwrap();
        assert_eq!(one.tokens, OneOrBatch::One(vec![1, 2]));
        let batch: DetokenizeRequest =
            serde_json::from_str(r#"{"tokens": [[1], [], [3, 4]]}"#).unwrap();
        assert_eq!(
            batch.tokens,
            OneOrBatch::Batch(vec![vec![1], vec![], vec![3, 4]])
        );
        assert!(serde_json::from_str::<DetokenizeRequest>(r#"{"tokens": [-1]}"#).is_err());
        assert!(serde_json::from_str::<DetokenizeRequest>(r#"{"tokens": "12"}"#).is_err());
    }
}
