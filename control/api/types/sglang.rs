//! SGLang's native `/generate` wire types.
//!
//! Tools built on SGLang (RL trainers, eval harnesses, SGLang's own
//! benchmarks) call `/generate` directly with text or token ids and a
//! `sampling_params` object, and read `text`, `output_ids` and `meta_info`
//! back. smg answers in the same shape so they can point at the gateway
//! unchanged. One prompt per request: SGLang's batch form (a list of texts
//! or of id lists) is rejected with an `invalid_parameter` naming the field.

use serde::{Deserialize, Serialize};

use super::forms::{InputItem, PromptInput, StringOrList};
use super::spec::{GenerationSpec, Prompt};
use super::validate::{
    CheckedSampling, Limits, SamplingFields, check_inputs, check_top_logprobs, single_constraint,
};
use crate::engine::{Constraint, MatchedStop};
use crate::error::{Error, Result};

/// `max_new_tokens` when a `/generate` request sets none: SGLang's own
/// default, so clients see the same output lengths as on SGLang.
pub const DEFAULT_MAX_NEW_TOKENS: u32 = 128;

/// `sampling_params` of a `/generate` request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerateSamplingParams {
    /// Defaults to [`DEFAULT_MAX_NEW_TOKENS`].
    pub max_new_tokens: Option<u32>,
    pub min_new_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub stop: Option<StringOrList>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub ignore_eos: Option<bool>,
    /// Default true.
    pub skip_special_tokens: Option<bool>,
    /// Default true.
    pub spaces_between_special_tokens: Option<bool>,
    pub no_stop_trim: Option<bool>,
    pub n: Option<u32>,
    pub regex: Option<String>,
    /// A JSON schema, as a JSON text (SGLang's form).
    pub json_schema: Option<String>,
    pub ebnf: Option<String>,
}

/// `POST /generate`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerateRequest {
    /// The prompt as text; exactly one of `text` and `input_ids`.
    pub text: Option<StringOrList>,
    /// The prompt as token ids.
    pub input_ids: Option<PromptInput>,
    pub sampling_params: Option<GenerateSamplingParams>,
    pub stream: Option<bool>,
    /// The request id to use (and to abort by); smg mints one if absent.
    pub rid: Option<String>,
    pub return_logprob: Option<bool>,
    /// Alternatives per position when `return_logprob` is set.
    pub top_logprobs_num: Option<u32>,
    /// Images for the prompt's image placeholders: URLs, data URLs or base64.
    pub image_data: Option<StringOrList>,
}

fn batch_rejected(param: &str, count: usize) -> Error {
    Error::invalid_parameter(
        param,
        format!("holds {count} prompts; batched requests are not supported, send one per request"),
    )
}

impl GenerateRequest {
    /// Validates the request and turns it into the pipeline's spec.
    pub fn to_spec(&self, limits: &Limits) -> Result<GenerationSpec> {
        let prompt = self.prompt()?;
        let return_logprob = self.return_logprob.unwrap_or(false);
        check_top_logprobs(
            "top_logprobs_num",
            self.top_logprobs_num,
            (!return_logprob).then_some("return_logprob"),
        )?;
        let unset = GenerateSamplingParams::default();
        let params = self.sampling_params.as_ref().unwrap_or(&unset);
        let constraint = single_constraint([
            (
                "sampling_params.json_schema",
                params.json_schema.clone().map(Constraint::JsonSchema),
            ),
            (
                "sampling_params.regex",
                params.regex.clone().map(Constraint::Regex),
            ),
            (
                "sampling_params.ebnf",
                params.ebnf.clone().map(Constraint::EbnfGrammar),
            ),
        ])?;
        let CheckedSampling {
            sampling,
            stop_strings,
        } = SamplingFields {
            param_prefix: "sampling_params.",
            temperature: params.temperature,
            top_p: params.top_p,
            top_k: params.top_k,
            min_p: params.min_p,
            frequency_penalty: params.frequency_penalty,
            presence_penalty: params.presence_penalty,
            repetition_penalty: params.repetition_penalty,
            max_tokens: Some((
                "max_new_tokens",
                params.max_new_tokens.unwrap_or(DEFAULT_MAX_NEW_TOKENS),
            )),
            min_tokens: params.min_new_tokens.map(|value| ("min_new_tokens", value)),
            n: params.n,
            stop: params.stop.as_ref().map(|stop| ("stop", stop.as_slice())),
            stop_token_ids: params.stop_token_ids.as_deref().unwrap_or_default(),
            logit_bias: None,
            ignore_eos: params.ignore_eos.unwrap_or(false),
            skip_special_tokens: params.skip_special_tokens.unwrap_or(true),
            spaces_between_special_tokens: params.spaces_between_special_tokens.unwrap_or(true),
            no_stop_trim: params.no_stop_trim.unwrap_or(false),
            constraint,
        }
        .check(limits)?;
        Ok(GenerationSpec {
            model: None,
            prompt,
            images: self
                .image_data
                .as_ref()
                .map(|images| images.as_slice().to_vec())
                .unwrap_or_default(),
            sampling,
            stop_strings,
            stream: self.stream.unwrap_or(false),
            include_usage: false,
            logprobs: return_logprob.then(|| self.top_logprobs_num.unwrap_or(0)),
            echo: false,
            request_id: self.rid.clone(),
        })
    }

    /// The single prompt: `text` or `input_ids`, never both.
    fn prompt(&self) -> Result<Prompt> {
        match (&self.text, &self.input_ids) {
            (Some(_), Some(_)) => Err(Error::invalid_parameter(
                "input_ids",
                "set either text or input_ids, not both",
            )),
            (None, None) => Err(Error::invalid_parameter(
                "text",
                "set text or input_ids to give a prompt",
            )),
            (Some(text), None) => match text.as_slice() {
                [text] if !text.is_empty() => Ok(Prompt::Text(text.clone())),
                [] | [_] => Err(Error::invalid_parameter("text", "must not be empty")),
                texts => Err(batch_rejected("text", texts.len())),
            },
            (None, Some(input_ids)) => {
                let prompts = input_ids.to_items();
                check_inputs("input_ids", &prompts)?;
                match prompts.as_slice() {
                    [InputItem::TokenIds(ids)] => Ok(Prompt::TokenIds(ids.clone())),
                    [InputItem::Text(_), ..] => Err(Error::invalid_parameter(
                        "input_ids",
                        "must be a list of token ids",
                    )),
                    prompts => Err(batch_rejected("input_ids", prompts.len())),
                }
            }
        }
    }
}

/// The stop that ended a sequence: a token id or a stop string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MatchedValue {
    TokenId(u32),
    Text(String),
}

impl From<MatchedStop> for MatchedValue {
    fn from(matched: MatchedStop) -> Self {
        match matched {
            MatchedStop::TokenId(id) => MatchedValue::TokenId(id),
            MatchedStop::Text(text) => MatchedValue::Text(text),
        }
    }
}

/// `meta_info.finish_reason`: `{"type": "stop", "matched": ...}`,
/// `{"type": "length", "length": N}` or `{"type": "abort", "message": ...}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum GenerateFinishReason {
    Stop {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        matched: Option<MatchedValue>,
    },
    Length {
        length: u32,
    },
    Abort {
        message: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetaInfo {
    pub id: String,
    /// Null until the sequence ends (in streams, every chunk but the last).
    pub finish_reason: Option<GenerateFinishReason>,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub cached_tokens: u32,
    /// Seconds since the request arrived.
    pub e2e_latency: f64,
}

/// A `/generate` result: one object, or a list of them when `n` > 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerateResponse {
    pub text: String,
    pub output_ids: Vec<u32>,
    pub meta_info: MetaInfo,
    /// Which of the `n` sequences this is, when `n` > 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
}

/// One `data:` event of a streamed `/generate`: the same shape as the
/// response, where (as in SGLang by default) `text` and `output_ids` hold
/// everything generated so far, not just the new part, and
/// `meta_info.finish_reason` is null until the last event. The stream ends
/// with `data: [DONE]`.
pub type GenerateStreamChunk = GenerateResponse;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Sampling;
    use crate::error::ErrorCode;
    use serde_json::{Value, json};

    fn generate(body: Value) -> GenerateRequest {
        serde_json::from_value(body).expect("a valid /generate body")
    }

    #[test]
    fn sglang_generate_body_becomes_a_spec() {
        let request = generate(json!({
            "text": "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe.<|im_end|>\n",
            "image_data": "https://example.com/a.jpg",
            "sampling_params": {
                "max_new_tokens": 64, "min_new_tokens": 2,
                "temperature": 0.0, "top_p": 1.0, "top_k": 1, "min_p": 0.0,
                "frequency_penalty": 0.0, "presence_penalty": 0.0,
                "repetition_penalty": 1.0,
                "stop": "<|im_end|>", "stop_token_ids": [4002],
                "ignore_eos": false, "skip_special_tokens": false,
                "no_stop_trim": true, "n": 1,
                "json_schema": "{\"type\":\"object\"}",
            },
            "stream": true,
            "rid": "req-42",
            "return_logprob": true,
            "top_logprobs_num": 5,
            "logprob_start_len": -1,
        }));
        let spec = request.to_spec(&Limits::default()).expect("valid");
        assert_eq!(
            spec.prompt,
            Prompt::Text(
                "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe.<|im_end|>\n"
                    .into()
            )
        );
        assert_eq!(spec.model, None);
        assert_eq!(spec.images, ["https://example.com/a.jpg"]);
        assert_eq!(spec.stop_strings, ["<|im_end|>"]);
        assert_eq!(spec.request_id.as_deref(), Some("req-42"));
        assert_eq!(spec.logprobs, Some(5));
        assert!(spec.stream);
        assert!(!spec.include_usage);
        let expected = Sampling {
            temperature: Some(0.0),
            top_p: Some(1.0),
            top_k: Some(1),
            min_p: Some(0.0),
            frequency_penalty: Some(0.0),
            presence_penalty: Some(0.0),
            repetition_penalty: Some(1.0),
            max_new_tokens: Some(64),
            min_new_tokens: 2,
            stop_token_ids: vec![4002],
            ignore_eos: false,
            skip_special_tokens: false,
            spaces_between_special_tokens: true,
            no_stop_trim: true,
            n: 1,
            logit_bias: Vec::new(),
            constraint: Some(Constraint::JsonSchema("{\"type\":\"object\"}".into())),
        };
        assert_eq!(spec.sampling, expected);
    }

    #[test]
    fn input_ids_and_defaults() {
        let spec = generate(json!({"input_ids": [1, 2, 3]}))
            .to_spec(&Limits::default())
            .expect("valid");
        assert_eq!(spec.prompt, Prompt::TokenIds(vec![1, 2, 3]));
        assert_eq!(spec.sampling.max_new_tokens, Some(DEFAULT_MAX_NEW_TOKENS));
        assert!(spec.sampling.skip_special_tokens);
        assert_eq!(spec.sampling.n, 1);
        assert_eq!(spec.logprobs, None);
        assert!(!spec.stream);
        assert!(spec.images.is_empty());

        let single_batch = generate(json!({"input_ids": [[7, 8]], "image_data": ["a", "b"]}))
            .to_spec(&Limits::default())
            .expect("a batch of one is one prompt");
        assert_eq!(single_batch.prompt, Prompt::TokenIds(vec![7, 8]));
        assert_eq!(single_batch.images, ["a", "b"]);
    }

    #[test]
    fn invalid_generate_requests_name_the_parameter() {
        let cases = [
            (json!({}), "text"),
            (json!({"text": "a", "input_ids": [1]}), "input_ids"),
            (json!({"text": ["a", "b"]}), "text"),
            (json!({"text": ""}), "text"),
            (json!({"input_ids": [[1], [2]]}), "input_ids"),
            (json!({"input_ids": []}), "input_ids"),
            (json!({"input_ids": "abc"}), "input_ids"),
            (
                json!({"text": "a", "top_logprobs_num": 2}),
                "top_logprobs_num",
            ),
            (
                json!({"text": "a", "sampling_params": {"temperature": -1}}),
                "sampling_params.temperature",
            ),
            (
                json!({"text": "a", "sampling_params": {"max_new_tokens": 0}}),
                "sampling_params.max_new_tokens",
            ),
            (
                json!({"text": "a", "sampling_params": {"min_new_tokens": 200}}),
                "sampling_params.min_new_tokens",
            ),
            (
                json!({"text": "a", "sampling_params": {"regex": "a", "ebnf": "b"}}),
                "sampling_params.ebnf",
            ),
            (
                json!({"text": "a", "sampling_params": {"stop": ["x", ""]}}),
                "sampling_params.stop",
            ),
        ];
        for (body, param) in cases {
            let err = generate(body.clone())
                .to_spec(&Limits::default())
                .expect_err(param);
            assert_eq!(err.code, ErrorCode::InvalidParameter, "{body}: {err}");
            assert_eq!(err.param.as_deref(), Some(param), "{body}: {err}");
        }
    }

    #[test]
    fn default_max_new_tokens_is_still_capped() {
        let limits = Limits {
            max_output_tokens: Some(100),
        };
        let err = generate(json!({"text": "a"}))
            .to_spec(&limits)
            .expect_err("128 > 100");
        assert_eq!(err.param.as_deref(), Some("sampling_params.max_new_tokens"));
    }

    #[test]
    fn response_serializes_as_sglang_does() {
        let response = GenerateResponse {
            text: "digest=00ff. hello".into(),
            output_ids: vec![10, 11, 4000],
            meta_info: MetaInfo {
                id: "req-42".into(),
                finish_reason: Some(GenerateFinishReason::Stop {
                    matched: Some(MatchedStop::TokenId(4000).into()),
                }),
                prompt_tokens: 12,
                completion_tokens: 3,
                cached_tokens: 8,
                e2e_latency: 0.25,
            },
            index: None,
        };
        let expected = json!({
            "text": "digest=00ff. hello",
            "output_ids": [10, 11, 4000],
            "meta_info": {
                "id": "req-42",
                "finish_reason": {"type": "stop", "matched": 4000},
                "prompt_tokens": 12, "completion_tokens": 3, "cached_tokens": 8,
                "e2e_latency": 0.25,
            },
        });
        let actual = serde_json::to_value(&response).expect("serialize");
        assert_eq!(actual, expected);
        assert_eq!(
            serde_json::from_value::<GenerateResponse>(actual).expect("parse back"),
            response
        );
    }

    #[test]
    fn finish_reasons_serialize_in_all_forms() {
        let cases = [
            (
                GenerateFinishReason::Stop {
                    matched: Some(MatchedStop::Text("\n\n".into()).into()),
                },
                json!({"type": "stop", "matched": "\n\n"}),
            ),
            (
                GenerateFinishReason::Stop { matched: None },
                json!({"type": "stop"}),
            ),
            (
                GenerateFinishReason::Length { length: 128 },
                json!({"type": "length", "length": 128}),
            ),
            (
                GenerateFinishReason::Abort {
                    message: "client disconnected".into(),
                },
                json!({"type": "abort", "message": "client disconnected"}),
            ),
        ];
        for (reason, expected) in cases {
            assert_eq!(serde_json::to_value(&reason).expect("serialize"), expected);
        }
    }

    #[test]
    fn stream_chunk_writes_a_null_finish_reason_until_the_end() {
        let chunk: GenerateStreamChunk = GenerateResponse {
            text: "digest".into(),
            output_ids: vec![10],
            meta_info: MetaInfo {
                id: "r".into(),
                finish_reason: None,
                prompt_tokens: 12,
                completion_tokens: 1,
                cached_tokens: 0,
                e2e_latency: 0.01,
            },
            index: Some(1),
        };
        assert_eq!(
            serde_json::to_value(&chunk).expect("serialize"),
            json!({
                "text": "digest", "output_ids": [10], "index": 1,
                "meta_info": {"id": "r", "finish_reason": null, "prompt_tokens": 12,
                              "completion_tokens": 1, "cached_tokens": 0, "e2e_latency": 0.01},
            })
        );
    }
}
