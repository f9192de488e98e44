//! Anthropic's Messages API (`/v1/messages`).
//!
//! Why it exists: Anthropic clients expect named SSE events around the text
//! (`message_start`, one text block's `content_block_start`/`_delta`/`_stop`,
//! `message_delta` with the stop reason and usage, `message_stop`) and
//! Anthropic-shaped errors, both streamed and as whole responses. The
//! dialect remembers only whether its text block is open and why the
//! generation stopped; streaming itself is the driver's.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::super::http::{SharedState, named_frame};
use super::super::types::spec::GenerationSpec;
use super::super::types::validate::Limits;
use super::super::types::{anthropic, openai};
use super::{Dialect, GenerationInfo, run};
use crate::engine::{LogProbs, MatchedStop};
use crate::error::{Error, Result};
use crate::pipeline::Endpoint;
use crate::pipeline::respond::{CollectedOutput, FinishReason, Usage};

/// Why a generation stopped, and the stop sequence that did it.
type Stop = (anthropic::StopReason, Option<String>);

struct MessagesDialect {
    block_open: bool,
    stop: Option<Stop>,
}

fn event_frame(event: &anthropic::StreamEvent) -> Bytes {
    named_frame(event.event_name(), event)
}

/// The message envelope, whole or (empty) in `message_start`.
fn message(
    info: &GenerationInfo,
    stop: Option<&Stop>,
    content: Vec<anthropic::ResponseBlock>,
    usage: anthropic::Usage,
) -> anthropic::MessagesResponse {
    anthropic::MessagesResponse {
        id: info.id.clone(),
        kind: anthropic::MessageTag,
        role: openai::AssistantRole,
        content,
        model: info.model.clone(),
        stop_reason: stop.map(|(reason, _)| *reason),
        stop_sequence: stop.and_then(|(_, seq)| seq.clone()),
        usage,
    }
}

fn anthropic_stop(reason: FinishReason, matched: Option<&MatchedStop>) -> Stop {
    anthropic::StopReason::from_finish(super::openai::finish_reason(reason), matched)
}

impl Dialect for MessagesDialect {
    const ENDPOINT: Endpoint = Endpoint::Messages;
    type Request = anthropic::MessagesRequest;

    fn spec(request: &Self::Request, limits: &Limits) -> Result<GenerationSpec> {
        request.to_spec(limits)
    }

    fn for_spec(_spec: &GenerationSpec) -> Self {
        MessagesDialect {
            block_open: false,
            stop: None,
        }
    }

    fn error_response(err: &Error) -> Response {
        let status = StatusCode::from_u16(err.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, axum::Json(anthropic::StreamEvent::error(err))).into_response()
    }

    fn start(&mut self, info: &GenerationInfo) -> Vec<Bytes> {
        let message = message(
            info,
            self.stop.as_ref(),
            Vec::new(),
            anthropic::Usage::from_counts(0, 0, 0),
        );
        self.block_open = true;
        vec![
            event_frame(&anthropic::StreamEvent::MessageStart { message }),
            event_frame(&anthropic::StreamEvent::ContentBlockStart {
                index: 0,
                content_block: anthropic::ResponseBlock::Text {
                    text: String::new(),
                },
            }),
        ]
    }

    fn delta(
        &mut self,
        _info: &GenerationInfo,
        _index: u32,
        text: String,
        _token_ids: &[u32],
        _logprobs: Option<&LogProbs>,
    ) -> Vec<Bytes> {
        vec![event_frame(&anthropic::StreamEvent::ContentBlockDelta {
            index: 0,
            delta: anthropic::BlockDelta::TextDelta { text },
        })]
    }

    fn finish(
        &mut self,
        _info: &GenerationInfo,
        _index: u32,
        reason: FinishReason,
        matched: Option<MatchedStop>,
    ) -> Vec<Bytes> {
        self.stop = Some(anthropic_stop(reason, matched.as_ref()));
        Vec::new()
    }

    fn usage(&mut self, _info: &GenerationInfo, usage: &Usage) -> Vec<Bytes> {
        let mut frames = Vec::new();
        if std::mem::replace(&mut self.block_open, false) {
            frames.push(event_frame(&anthropic::StreamEvent::ContentBlockStop {
                index: 0,
            }));
        }
        let (stop_reason, stop_sequence) = match &self.stop {
            Some((reason, sequence)) => (Some(*reason), sequence.clone()),
            None => (None, None),
        };
        frames.push(event_frame(&anthropic::StreamEvent::MessageDelta {
            delta: anthropic::MessageDelta {
                stop_reason,
                stop_sequence,
            },
            usage: anthropic::DeltaUsage {
                output_tokens: usage.completion_tokens,
            },
        }));
        frames
    }

    fn error(&mut self, err: &Error) -> Vec<Bytes> {
        vec![event_frame(&anthropic::StreamEvent::error(err))]
    }

    fn end(&mut self) -> Vec<Bytes> {
        vec![event_frame(&anthropic::StreamEvent::MessageStop)]
    }

    fn json(&self, info: &GenerationInfo, output: CollectedOutput) -> Response {
        let Some(choice) = output.choices.into_iter().next() else {
            return Error::internal("the generation produced no output").into_response();
        };
        let stop = choice
            .finish_reason
            .map(|reason| anthropic_stop(reason, choice.matched_stop.as_ref()));
        let usage = anthropic::Usage::from_counts(
            output.usage.prompt_tokens,
            output.usage.completion_tokens,
            output.usage.cached_tokens,
        );
        axum::Json(message(
            info,
            stop.as_ref(),
            vec![anthropic::ResponseBlock::Text { text: choice.text }],
            usage,
        ))
        .into_response()
    }
}

pub(crate) async fn messages(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    run::<MessagesDialect>(state, &headers, &body).await
}

