//! SGLang's native `/generate`.
//!
//! Why it exists: SGLang clients (and SGLang's own benchmarks) expect
//! cumulative streaming, where every chunk repeats the whole text and token
//! ids so far with a `meta_info` block, and a bare object (or a list, when
//! `n > 1`) as the whole answer. That is unlike OpenAI's deltas, so the
//! dialect keeps each sequence's output so far.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};

use super::super::http::{SharedState, data_frame};
use super::super::types::sglang;
use super::super::types::spec::GenerationSpec;
use super::super::types::validate::Limits;
use super::{Dialect, GenerationInfo, run, sequence_slot};
use crate::engine::{LogProbs, MatchedStop};
use crate::error::Result;
use crate::pipeline::Endpoint;
use crate::pipeline::respond::{CollectedOutput, FinishReason, Usage};

/// Per sequence: everything generated so far (SGLang streams cumulative text).
#[derive(Default, Clone)]
struct SoFar {
    text: String,
    output_ids: Vec<u32>,
}

struct GenerateDialect {
    n: u32,
    sequences: Vec<SoFar>,
    finished: Vec<Option<sglang::GenerateFinishReason>>,
    usage: Usage,
}

impl GenerateDialect {
    fn sequence(&mut self, index: u32) -> &mut SoFar {
        sequence_slot(&mut self.finished, index);
        sequence_slot(&mut self.sequences, index)
    }

    /// Sequence `index` so far, as one streamed chunk.
    fn response(
        &self,
        info: &GenerationInfo,
        index: u32,
        completion_tokens: u32,
    ) -> sglang::GenerateResponse {
        let so_far = self
            .sequences
            .get(index as usize)
            .cloned()
            .unwrap_or_default();
        sglang::GenerateResponse {
            text: so_far.text,
            output_ids: so_far.output_ids,
            meta_info: sglang::MetaInfo {
                id: info.id.clone(),
                finish_reason: self.finished.get(index as usize).cloned().flatten(),
                prompt_tokens: self.usage.prompt_tokens,
                completion_tokens,
                cached_tokens: self.usage.cached_tokens,
                e2e_latency: info.started.elapsed().as_secs_f64(),
            },
            index: (self.n > 1).then_some(index),
        }
    }
}

fn generate_finish(
    reason: FinishReason,
    matched: Option<MatchedStop>,
    length: u32,
) -> sglang::GenerateFinishReason {
    match reason {
        FinishReason::Stop => sglang::GenerateFinishReason::Stop {
            matched: matched.map(Into::into),
        },
        FinishReason::Length => sglang::GenerateFinishReason::Length { length },
        FinishReason::Abort => sglang::GenerateFinishReason::Abort {
            message: "aborted".to_owned(),
        },
    }
}

impl Dialect for GenerateDialect {
    const ENDPOINT: Endpoint = Endpoint::Generate;
    type Request = sglang::GenerateRequest;

    fn spec(request: &Self::Request, limits: &Limits) -> Result<GenerationSpec> {
        request.to_spec(limits)
    }

    fn for_spec(spec: &GenerationSpec) -> Self {
        GenerateDialect {
            n: spec.sampling.n.max(1),
            sequences: Vec::new(),
            finished: Vec::new(),
            usage: Usage::default(),
        }
    }

    fn delta(
        &mut self,
        info: &GenerationInfo,
        index: u32,
        text: String,
        token_ids: &[u32],
        _logprobs: Option<&LogProbs>,
    ) -> Vec<Bytes> {
        let sequence = self.sequence(index);
        sequence.text.push_str(&text);
        sequence.output_ids.extend_from_slice(token_ids);
        let produced = sequence.output_ids.len() as u32;
        vec![data_frame(&self.response(info, index, produced))]
    }

    fn finish(
        &mut self,
        info: &GenerationInfo,
        index: u32,
        reason: FinishReason,
        matched: Option<MatchedStop>,
    ) -> Vec<Bytes> {
        let produced = self.sequence(index).output_ids.len() as u32;
        self.finished[index as usize] = Some(generate_finish(reason, matched, produced));
        vec![data_frame(&self.response(info, index, produced))]
    }

    fn usage(&mut self, _info: &GenerationInfo, usage: &Usage) -> Vec<Bytes> {
        self.usage = *usage;
        Vec::new()
    }

    fn json(&self, info: &GenerationInfo, output: CollectedOutput) -> Response {
        let n = output.choices.len();
        let responses: Vec<sglang::GenerateResponse> = output
            .choices
            .into_iter()
            .map(|choice| {
                let length = choice.token_ids.len() as u32;
                sglang::GenerateResponse {
                    meta_info: sglang::MetaInfo {
                        id: info.id.clone(),
                        finish_reason: choice
                            .finish_reason
                            .map(|r| generate_finish(r, choice.matched_stop.clone(), length)),
                        prompt_tokens: output.usage.prompt_tokens,
                        completion_tokens: length,
                        cached_tokens: output.usage.cached_tokens,
                        e2e_latency: info.started.elapsed().as_secs_f64(),
                    },
                    text: choice.text,
                    output_ids: choice.token_ids,
                    index: (n > 1).then_some(choice.index),
                }
            })
            .collect();
        match <[sglang::GenerateResponse; 1]>::try_from(responses) {
            Ok([single]) => axum::Json(single).into_response(),
            Err(many) => axum::Json(many).into_response(),
        }
    }
}

pub(crate) async fn generate(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    run::<GenerateDialect>(state, &headers, &body).await
}

