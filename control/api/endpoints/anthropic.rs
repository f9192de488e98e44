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
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};

use super::super::dialect::ErrorDialect;
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

    const ERRORS: ErrorDialect = ErrorDialect::Anthropic;

    fn start(&mut self, info: &GenerationInfo, usage: &Usage) -> Vec<Bytes> {
        let message = message(
            info,
            self.stop.as_ref(),
            Vec::new(),
            anthropic::Usage::from_counts(usage.prompt_tokens, 0, usage.cached_tokens),
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
            usage: anthropic::DeltaUsage::from(anthropic::Usage::from_counts(
                usage.prompt_tokens,
                usage.completion_tokens,
                usage.cached_tokens,
            )),
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
            return Self::error_response(&Error::internal("the generation produced no output"));
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    //! The exact bytes `/v1/messages` writes: named events streamed, the
    //! message whole, and Anthropic-shaped errors.
    use super::super::fixtures::{body, collected, info, text, usage};
    use super::*;
    use crate::error::ErrorCode;

    fn dialect() -> MessagesDialect {
        MessagesDialect {
            block_open: false,
            stop: None,
        }
    }

    /// The `event: <name>\ndata: <json>\n\n` frames of `events`.
    fn events(events: &[(&str, &str)]) -> Vec<String> {
        events
            .iter()
            .map(|(name, json)| format!("event: {name}\ndata: {json}\n\n"))
            .collect()
    }

    const MESSAGE_START: (&str, &str) = (
        "message_start",
        r#"{"type":"message_start","message":{"id":"req-1","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":0,"cache_read_input_tokens":2}}}"#,
    );
    const BLOCK_START: (&str, &str) = (
        "content_block_start",
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
    );
    const MESSAGE_STOP: (&str, &str) = ("message_stop", r#"{"type":"message_stop"}"#);

    #[test]
    fn a_stream_is_one_text_block_between_start_and_stop() {
        let info = info();
        let mut dialect = dialect();
        let mut out = dialect.start(&info, &usage());
        out.extend(dialect.delta(&info, 0, "Hello".into(), &[39, 415], None));
        out.extend(dialect.delta(&info, 0, " world".into(), &[78, 1009], None));
        let matched = Some(MatchedStop::Text("!".into()));
        out.extend(dialect.finish(&info, 0, FinishReason::Stop, matched));
        out.extend(dialect.usage(&info, &usage()));
        out.extend(dialect.end());
        let expected = [
            MESSAGE_START,
            BLOCK_START,
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" world"}}"#,
            ),
            (
                "content_block_stop",
                r#"{"type":"content_block_stop","index":0}"#,
            ),
            (
                "message_delta",
                r#"{"type":"message_delta","delta":{"stop_reason":"stop_sequence","stop_sequence":"!"},"usage":{"input_tokens":3,"output_tokens":3,"cache_read_input_tokens":2}}"#,
            ),
            MESSAGE_STOP,
        ];
        assert_eq!(text(out), events(&expected));
    }

    #[test]
    fn a_stream_that_fails_ends_with_an_error_event_then_message_stop() {
        let info = info();
        let mut dialect = dialect();
        let mut out = dialect.start(&info, &usage());
        out.extend(dialect.error(&Error::internal("boom")));
        out.extend(dialect.end());
        let expected = [
            MESSAGE_START,
            BLOCK_START,
            (
                "error",
                r#"{"type":"error","error":{"type":"api_error","message":"boom"}}"#,
            ),
            MESSAGE_STOP,
        ];
        assert_eq!(text(out), events(&expected));
    }

    #[tokio::test]
    async fn the_whole_message_and_errors_are_pinned() {
        let info = info();
        assert_eq!(
            body(dialect().json(&info, collected())).await,
            r#"{"id":"req-1","type":"message","role":"assistant","content":[{"type":"text","text":"Hello world"}],"model":"m","stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":3,"cache_read_input_tokens":2}}"#
        );
        let response =
            MessagesDialect::error_response(&Error::new(ErrorCode::NoHealthyWorker, "none"));
        assert_eq!(response.status(), 503);
        assert_eq!(
            body(response).await,
            r#"{"type":"error","error":{"type":"overloaded_error","message":"none"}}"#
        );
        // A generation without output is the gateway's fault, reported in
        // Anthropic's shape like every error of this route.
        let mut empty = collected();
        empty.choices.clear();
        let response = dialect().json(&info, empty);
        assert_eq!(response.status(), 500);
        assert_eq!(
            body(response).await,
            r#"{"type":"error","error":{"type":"api_error","message":"the generation produced no output"}}"#
        );
    }
}
