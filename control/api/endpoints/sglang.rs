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
use axum::response::Response;

use super::super::http::{SharedState, data_frame, json_response};
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
        // `/generate` parses no tool calls; a stop is a stop.
        FinishReason::Stop | FinishReason::ToolCalls => sglang::GenerateFinishReason::Stop {
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

    /// Every chunk states the prompt's counts, so they are known before
    /// the first.
    fn start(&mut self, _info: &GenerationInfo, usage: &Usage) -> Vec<Bytes> {
        self.usage = *usage;
        Vec::new()
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
            Ok([single]) => json_response(&single),
            Err(many) => json_response(&many),
        }
    }
}

pub(crate) async fn generate(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    run::<GenerateDialect>(state, &headers, body).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    //! The exact bytes `/generate` writes, streamed and whole, except the
    //! wall-clock `e2e_latency`, which is checked to be a duration and then
    //! zeroed.
    use super::super::fixtures::{body, collected, frames, info, text, usage};
    use super::*;

    /// `text` with its `e2e_latency` values replaced by 0, after checking
    /// each is a number of seconds.
    fn without_latency(text: &str) -> String {
        const KEY: &str = r#""e2e_latency":"#;
        let mut out = String::new();
        let mut rest = text;
        while let Some(at) = rest.find(KEY) {
            let (head, tail) = rest.split_at(at + KEY.len());
            let end = tail.find([',', '}']).unwrap();
            let seconds: f64 = tail[..end].parse().unwrap();
            assert!((0.0..60.0).contains(&seconds), "{text}");
            out.push_str(head);
            out.push('0');
            rest = &tail[end..];
        }
        out.push_str(rest);
        out
    }

    fn dialect(n: u32) -> GenerateDialect {
        GenerateDialect {
            n,
            sequences: Vec::new(),
            finished: Vec::new(),
            usage: Usage::default(),
        }
    }

    #[test]
    fn streamed_chunks_carry_each_sequence_so_far() {
        let info = info();
        let mut dialect = dialect(2);
        let mut out = dialect.start(&info, &usage());
        out.extend(dialect.delta(&info, 0, "Hello".into(), &[39, 415], None));
        out.extend(dialect.usage(&info, &usage()));
        out.extend(dialect.delta(&info, 1, "Hi".into(), &[78], None));
        out.extend(dialect.delta(&info, 0, " world".into(), &[78, 1009], None));
        out.extend(dialect.finish(&info, 0, FinishReason::Length, None));
        out.extend(dialect.finish(&info, 2, FinishReason::Abort, None));
        let matched = Some(MatchedStop::TokenId(2));
        out.extend(dialect.finish(&info, 1, FinishReason::Stop, matched));
        out.extend(dialect.end());
        let out: Vec<String> = text(out).iter().map(|f| without_latency(f)).collect();
        let expected = [
            r#"{"text":"Hello","output_ids":[39,415],"meta_info":{"id":"req-1","finish_reason":null,"prompt_tokens":5,"completion_tokens":2,"cached_tokens":2,"e2e_latency":0},"index":0}"#,
            r#"{"text":"Hi","output_ids":[78],"meta_info":{"id":"req-1","finish_reason":null,"prompt_tokens":5,"completion_tokens":1,"cached_tokens":2,"e2e_latency":0},"index":1}"#,
            r#"{"text":"Hello world","output_ids":[39,415,78,1009],"meta_info":{"id":"req-1","finish_reason":null,"prompt_tokens":5,"completion_tokens":4,"cached_tokens":2,"e2e_latency":0},"index":0}"#,
            r#"{"text":"Hello world","output_ids":[39,415,78,1009],"meta_info":{"id":"req-1","finish_reason":{"type":"length","length":4},"prompt_tokens":5,"completion_tokens":4,"cached_tokens":2,"e2e_latency":0},"index":0}"#,
            r#"{"text":"","output_ids":[],"meta_info":{"id":"req-1","finish_reason":{"type":"abort","message":"aborted"},"prompt_tokens":5,"completion_tokens":0,"cached_tokens":2,"e2e_latency":0},"index":2}"#,
            r#"{"text":"Hi","output_ids":[78],"meta_info":{"id":"req-1","finish_reason":{"type":"stop","matched":2},"prompt_tokens":5,"completion_tokens":1,"cached_tokens":2,"e2e_latency":0},"index":1}"#,
            "[DONE]",
        ];
        assert_eq!(out, frames(&expected));
    }

    #[tokio::test]
    async fn one_sequence_answers_an_object_and_several_a_list() {
        let info = info();
        let dialect = dialect(2);
        assert_eq!(
            without_latency(&body(dialect.json(&info, collected())).await),
            r#"[{"text":"Hello world","output_ids":[39,415,78,1009],"meta_info":{"id":"req-1","finish_reason":{"type":"length","length":4},"prompt_tokens":5,"completion_tokens":4,"cached_tokens":2,"e2e_latency":0},"index":0},{"text":"Hi","output_ids":[78],"meta_info":{"id":"req-1","finish_reason":null,"prompt_tokens":5,"completion_tokens":1,"cached_tokens":2,"e2e_latency":0},"index":1}]"#
        );
        let mut one = collected();
        one.choices.truncate(1);
        assert_eq!(
            without_latency(&body(dialect.json(&info, one)).await),
            r#"{"text":"Hello world","output_ids":[39,415,78,1009],"meta_info":{"id":"req-1","finish_reason":{"type":"length","length":4},"prompt_tokens":5,"completion_tokens":4,"cached_tokens":2,"e2e_latency":0}}"#
        );
    }

    #[tokio::test]
    async fn errors_are_openai_shaped() {
        let err = crate::error::Error::new(crate::error::ErrorCode::NoHealthyWorker, "none");
        let response = GenerateDialect::error_response(&err);
        assert_eq!(response.status(), 503);
        assert_eq!(
            body(response).await,
            r#"{"error":{"message":"none","type":"service_unavailable_error","param":null,"code":"no_healthy_worker"}}"#
        );
    }
}
