//! Anthropic's Messages API (`/v1/messages`).
//!
//! Why it exists: Anthropic clients expect named SSE events around the
//! output (`message_start`, then per content block `content_block_start`,
//! `_delta`s and `_stop`, then `message_delta` with the stop reason and
//! usage, `message_stop`) and Anthropic-shaped errors, streamed and whole.
//! The output arrives parsed (`pipeline::parsing`): reasoning becomes a
//! `thinking` block (`thinking_delta`), text a `text` block, each tool call
//! a `tool_use` block whose input streams as `input_json_delta`; a block
//! opens when its first piece arrives and closes when another kind starts,
//! and text that is only whitespace between blocks is dropped, as is
//! `content: null` on OpenAI's side. The dialect remembers its open block
//! and why the generation stopped; streaming itself is the driver's.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;

use super::super::dialect::ErrorDialect;
use super::super::http::{SharedState, json_response, named_frame};
use super::super::types::spec::GenerationSpec;
use super::super::types::validate::Limits;
use super::super::types::{anthropic, openai};
use super::{Dialect, GenerationInfo, run};
use crate::engine::{LogProbs, MatchedStop};
use crate::error::{Error, Result};
use crate::pipeline::Endpoint;
use crate::pipeline::parsing::ParsedText;
use crate::pipeline::respond::{CollectedOutput, FinishReason, Usage};

/// Why a generation stopped, and the stop sequence that did it.
type Stop = (anthropic::StopReason, Option<String>);

/// The content block a stream has open.
#[derive(Debug, Clone, PartialEq, Eq)]
enum OpenBlock {
    Thinking,
    Text,
    /// The tool call of this index.
    ToolUse(usize),
}

struct MessagesDialect {
    /// The open block and its index.
    open: Option<(OpenBlock, u32)>,
    /// Blocks opened so far (the next block's index).
    blocks: u32,
    /// Whitespace held back until text that is not whitespace follows it
    /// (whitespace around tool calls is no answer).
    held_whitespace: String,
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
        MessagesDialect::new()
    }

    const ERRORS: ErrorDialect = ErrorDialect::Anthropic;

    fn start(&mut self, info: &GenerationInfo, usage: &Usage) -> Vec<Bytes> {
        let message = message(
            info,
            self.stop.as_ref(),
            Vec::new(),
            anthropic::Usage::from_counts(usage.prompt_tokens, 0, usage.cached_tokens),
        );
        vec![event_frame(&anthropic::StreamEvent::MessageStart {
            message,
        })]
    }

    fn parsed_delta(
        &mut self,
        _info: &GenerationInfo,
        _index: u32,
        parsed: ParsedText,
        _token_ids: &[u32],
        _logprobs: Option<&LogProbs>,
    ) -> Vec<Bytes> {
        let mut frames = Vec::new();
        if !parsed.reasoning.is_empty() {
            let index = self.open_block(OpenBlock::Thinking, &mut frames, || {
                anthropic::ResponseBlock::Thinking {
                    thinking: String::new(),
                    signature: String::new(),
                }
            });
            frames.push(event_frame(&anthropic::StreamEvent::ContentBlockDelta {
                index,
                delta: anthropic::BlockDelta::ThinkingDelta {
                    thinking: parsed.reasoning,
                },
            }));
        }
        self.text(parsed.content, &mut frames);
        for call in parsed.calls {
            let id = call.id.clone().unwrap_or_default();
            let name = call.name.clone();
            let block = OpenBlock::ToolUse(call.index);
            let index = match (name, &self.open) {
                (None, Some((open, index))) if *open == block => *index,
                (name, _) => {
                    self.held_whitespace.clear();
                    self.open_block(block, &mut frames, || anthropic::ResponseBlock::ToolUse {
                        id,
                        name: name.unwrap_or_default(),
                        input: serde_json::json!({}),
                    })
                }
            };
            if !call.arguments.is_empty() {
                frames.push(event_frame(&anthropic::StreamEvent::ContentBlockDelta {
                    index,
                    delta: anthropic::BlockDelta::InputJsonDelta {
                        partial_json: call.arguments,
                    },
                }));
            }
        }
        frames
    }

    fn delta(
        &mut self,
        _info: &GenerationInfo,
        _index: u32,
        text: String,
        _token_ids: &[u32],
        _logprobs: Option<&LogProbs>,
    ) -> Vec<Bytes> {
        let mut frames = Vec::new();
        self.text(text, &mut frames);
        frames
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
        // Whitespace alone is still an answer when nothing else came.
        if self.blocks == 0 || self.open == Some((OpenBlock::Text, self.blocks - 1)) {
            let text = std::mem::take(&mut self.held_whitespace);
            self.text_now(text, &mut frames);
        }
        self.close_block(&mut frames);
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
        let mut content = Vec::new();
        if !choice.reasoning.is_empty() {
            content.push(anthropic::ResponseBlock::Thinking {
                thinking: choice.reasoning,
                signature: String::new(),
            });
        }
        // Text between calls, as a stream would have put it: a piece that
        // is only whitespace is no block (unless it is all there is).
        let mut from = 0;
        let mut text_block = |content: &mut Vec<anthropic::ResponseBlock>, to: usize| {
            let piece = choice.text.get(from..to).unwrap_or_default();
            from = to.max(from);
            if !piece.trim().is_empty() {
                content.push(anthropic::ResponseBlock::Text {
                    text: piece.to_owned(),
                });
            }
        };
        for call in &choice.tool_calls {
            text_block(&mut content, call.text_before);
            content.push(anthropic::ResponseBlock::ToolUse {
                id: call.id.clone(),
                name: call.name.clone(),
                input: tool_input(&call.arguments),
            });
        }
        text_block(&mut content, choice.text.len());
        if content.is_empty() {
            content.push(anthropic::ResponseBlock::Text { text: choice.text });
        }
        json_response(&message(info, stop.as_ref(), content, usage))
    }
}

/// A call's arguments as the `input` object; the parsers write JSON, so
/// anything else is a model that wrote a broken call: an empty input.
fn tool_input(arguments: &str) -> serde_json::Value {
    match serde_json::from_str(arguments) {
        Ok(value @ serde_json::Value::Object(_)) => value,
        _ if arguments.trim().is_empty() => serde_json::json!({}),
        _ => {
            tracing::warn!(arguments, "a tool call's arguments are not a JSON object");
            serde_json::json!({})
        }
    }
}

impl MessagesDialect {
    fn new() -> Self {
        MessagesDialect {
            open: None,
            blocks: 0,
            held_whitespace: String::new(),
            stop: None,
        }
    }

    /// Answer text: whitespace waits until something that is not
    /// whitespace follows it in the same text block.
    fn text(&mut self, text: String, frames: &mut Vec<Bytes>) {
        if text.is_empty() {
            return;
        }
        if text.trim().is_empty() && !matches!(self.open, Some((OpenBlock::Text, _))) {
            self.held_whitespace.push_str(&text);
            return;
        }
        let mut text = text;
        if !self.held_whitespace.is_empty() {
            text.insert_str(0, &std::mem::take(&mut self.held_whitespace));
        }
        self.text_now(text, frames);
    }

    fn text_now(&mut self, text: String, frames: &mut Vec<Bytes>) {
        let index = self.open_block(OpenBlock::Text, frames, || anthropic::ResponseBlock::Text {
            text: String::new(),
        });
        if !text.is_empty() {
            frames.push(event_frame(&anthropic::StreamEvent::ContentBlockDelta {
                index,
                delta: anthropic::BlockDelta::TextDelta { text },
            }));
        }
    }

    /// The index of an open block of kind `block`, opening it (and closing
    /// another) when needed.
    fn open_block(
        &mut self,
        block: OpenBlock,
        frames: &mut Vec<Bytes>,
        start: impl FnOnce() -> anthropic::ResponseBlock,
    ) -> u32 {
        if let Some((open, index)) = &self.open
            && *open == block
        {
            return *index;
        }
        self.close_block(frames);
        let index = self.blocks;
        self.blocks += 1;
        self.open = Some((block, index));
        frames.push(event_frame(&anthropic::StreamEvent::ContentBlockStart {
            index,
            content_block: start(),
        }));
        index
    }

    fn close_block(&mut self, frames: &mut Vec<Bytes>) {
        if let Some((_, index)) = self.open.take() {
            frames.push(event_frame(&anthropic::StreamEvent::ContentBlockStop {
                index,
            }));
        }
    }
}

pub(crate) async fn messages(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    run::<MessagesDialect>(state, &headers, body).await
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
        MessagesDialect::new()
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
        // Blocks open with their first piece: none had come.
        let expected = [
            MESSAGE_START,
            (
                "error",
                // A gateway fault's detail stays in the log.
                r#"{"type":"error","error":{"type":"api_error","message":"the gateway failed to serve the request (internal_error); the gateway's log has the details under the request's x-request-id"}}"#,
            ),
            MESSAGE_STOP,
        ];
        assert_eq!(text(out), events(&expected));
    }

    #[tokio::test]
    async fn thinking_text_and_tool_use_blocks_streamed_and_whole() {
        use crate::pipeline::parsing::ToolCallDelta;
        use crate::pipeline::respond::CollectedCall;
        let info = info();
        let mut dialect = dialect();
        let call = |id: Option<&str>, name: Option<&str>, arguments: &str| ToolCallDelta {
            index: 0,
            id: id.map(str::to_owned),
            name: name.map(str::to_owned),
            arguments: arguments.to_owned(),
        };
        let mut out = dialect.start(&info, &usage());
        let pieces = [
            ParsedText {
                reasoning: "Need the".into(),
                ..ParsedText::default()
            },
            ParsedText {
                reasoning: " weather.".into(),
                // Whitespace before a call is no answer.
                content: "\n\n".into(),
                ..ParsedText::default()
            },
            ParsedText {
                calls: vec![call(Some("call_1"), Some("get_weather"), "")],
                ..ParsedText::default()
            },
            ParsedText {
                calls: vec![call(None, None, "{\"city\":\"Paris\"}")],
                ..ParsedText::default()
            },
        ];
        for piece in pieces {
            out.extend(dialect.parsed_delta(&info, 0, piece, &[], None));
        }
        out.extend(dialect.finish(&info, 0, FinishReason::ToolCalls, None));
        out.extend(dialect.usage(&info, &usage()));
        out.extend(dialect.end());
        let expected = [
            MESSAGE_START,
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Need the"}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":" weather."}}"#,
            ),
            (
                "content_block_stop",
                r#"{"type":"content_block_stop","index":0}"#,
            ),
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"call_1","name":"get_weather","input":{}}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"city\":\"Paris\"}"}}"#,
            ),
            (
                "content_block_stop",
                r#"{"type":"content_block_stop","index":1}"#,
            ),
            (
                "message_delta",
                r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"input_tokens":3,"output_tokens":3,"cache_read_input_tokens":2}}"#,
            ),
            MESSAGE_STOP,
        ];
        assert_eq!(text(out), events(&expected));

        let mut whole = collected();
        whole.choices.truncate(1);
        let choice = &mut whole.choices[0];
        choice.text = "\n\n".into();
        choice.reasoning = "Need the weather.".into();
        choice.finish_reason = Some(FinishReason::ToolCalls);
        choice.tool_calls = vec![CollectedCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: "{\"city\":\"Paris\"}".into(),
            text_before: 2,
        }];
        assert_eq!(
            body(MessagesDialect::new().json(&info, whole)).await,
            r#"{"id":"req-1","type":"message","role":"assistant","content":[{"type":"thinking","thinking":"Need the weather.","signature":""},{"type":"tool_use","id":"call_1","name":"get_weather","input":{"city":"Paris"}}],"model":"m","stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":3,"cache_read_input_tokens":2}}"#
        );
    }

    #[test]
    fn broken_call_arguments_become_an_empty_input() {
        assert_eq!(tool_input("{\"a\":1}"), serde_json::json!({"a": 1}));
        assert_eq!(tool_input(""), serde_json::json!({}));
        assert_eq!(tool_input("{\"a\":"), serde_json::json!({}));
        assert_eq!(tool_input("[1]"), serde_json::json!({}));
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
            r#"{"type":"error","error":{"type":"api_error","message":"the gateway failed to serve the request (internal_error); the gateway's log has the details under the request's x-request-id"}}"#
        );
    }
}
