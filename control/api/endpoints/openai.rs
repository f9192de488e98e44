//! OpenAI's chat and text completions (`/v1/chat/completions`,
//! `/v1/completions`) and the model list (`/v1/models`).
//!
//! Why it exists: most clients speak OpenAI, and its two generation
//! endpoints differ only in their `object` tags, their choice shapes and what
//! a sequence carries from chunk to chunk (chat: whether the role went out;
//! completions: the logprob text offset). [`OpenAiShape`] names exactly
//! those differences and one [`OpenAiDialect`] writes both around them.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};

use super::super::http::{SharedState, data_frame, json_response};
use super::super::logprobs;
use super::super::types::forms::ListObject;
use super::super::types::openai;
use super::super::types::spec::GenerationSpec;
use super::super::types::validate::Limits;
use super::{Dialect, GenerationInfo, run, sequence_slot};
use crate::engine::{LogProbs, MatchedStop};
use crate::error::Result;
use crate::pipeline::Endpoint;
use crate::pipeline::parsing::ParsedText;
use crate::pipeline::respond::{CollectedChoice, CollectedOutput, FinishReason, Usage};
use crate::tokenizer::Tokenizer;

/// OpenAI's finish reason for ours (Anthropic's stop reason starts here too).
pub(super) fn finish_reason(reason: FinishReason) -> openai::FinishReason {
    match reason {
        FinishReason::Length => openai::FinishReason::Length,
        FinishReason::ToolCalls => openai::FinishReason::ToolCalls,
        FinishReason::Stop | FinishReason::Abort => openai::FinishReason::Stop,
    }
}

fn openai_usage(usage: &Usage) -> openai::Usage {
    openai::Usage::new(
        usage.prompt_tokens,
        usage.completion_tokens,
        Some(usage.cached_tokens),
    )
}

/// What differs between chat and text completions: the request, the
/// `object` tags, the choice shapes and what a sequence carries from chunk
/// to chunk. [`OpenAiDialect`] writes both around them.
trait OpenAiShape: Send + 'static {
    const ENDPOINT: Endpoint;
    type Request: serde::de::DeserializeOwned;
    type ChunkObject: Default + serde::Serialize;
    type ResponseObject: Default + serde::Serialize;
    type ChunkChoice: serde::Serialize;
    type Choice: serde::Serialize;
    /// What one sequence remembers between its chunks.
    type Sequence: Default + Clone + Send;

    fn spec(request: &Self::Request, limits: &Limits) -> Result<GenerationSpec>;
    /// The chunk choice for new text of sequence `index`.
    fn delta(
        sequence: &mut Self::Sequence,
        tokenizer: &Tokenizer,
        index: u32,
        text: String,
        logprobs: Option<&LogProbs>,
    ) -> Self::ChunkChoice;
    /// The chunk choices for new output of sequence `index`; shapes that
    /// show only text write its text.
    fn parsed_delta(
        sequence: &mut Self::Sequence,
        tokenizer: &Tokenizer,
        index: u32,
        parsed: ParsedText,
        logprobs: Option<&LogProbs>,
    ) -> Vec<Self::ChunkChoice> {
        vec![Self::delta(
            sequence,
            tokenizer,
            index,
            parsed.content,
            logprobs,
        )]
    }
    /// The chunk choice that ends sequence `index`.
    fn finish(
        sequence: &mut Self::Sequence,
        index: u32,
        reason: openai::FinishReason,
    ) -> Self::ChunkChoice;
    /// One choice of the whole answer.
    fn choice(tokenizer: &Tokenizer, choice: CollectedChoice) -> Self::Choice;
}

/// OpenAI's chat or text completions, streamed or whole.
struct OpenAiDialect<S: OpenAiShape> {
    include_usage: bool,
    sequences: Vec<S::Sequence>,
}

type ChatDialect = OpenAiDialect<ChatShape>;
type CompletionDialect = OpenAiDialect<TextCompletionShape>;

impl<S: OpenAiShape> OpenAiDialect<S> {
    fn new(include_usage: bool) -> Self {
        Self {
            include_usage,
            sequences: Vec::new(),
        }
    }

    fn chunk(
        info: &GenerationInfo,
        choices: Vec<S::ChunkChoice>,
        usage: Option<openai::Usage>,
    ) -> Bytes {
        data_frame(&openai::CompletionEnvelope {
            id: info.id.clone(),
            object: S::ChunkObject::default(),
            created: info.created,
            model: info.model.clone(),
            choices,
            usage,
        })
    }
}

impl<S: OpenAiShape> Dialect for OpenAiDialect<S> {
    const ENDPOINT: Endpoint = S::ENDPOINT;
    type Request = S::Request;

    fn spec(request: &S::Request, limits: &Limits) -> Result<GenerationSpec> {
        S::spec(request, limits)
    }

    fn for_spec(spec: &GenerationSpec) -> Self {
        Self::new(spec.include_usage)
    }

    fn parsed_delta(
        &mut self,
        info: &GenerationInfo,
        index: u32,
        parsed: ParsedText,
        _token_ids: &[u32],
        logprobs: Option<&LogProbs>,
    ) -> Vec<Bytes> {
        let sequence = sequence_slot(&mut self.sequences, index);
        S::parsed_delta(sequence, &info.tokenizer, index, parsed, logprobs)
            .into_iter()
            .map(|choice| Self::chunk(info, vec![choice], None))
            .collect()
    }

    fn delta(
        &mut self,
        info: &GenerationInfo,
        index: u32,
        text: String,
        _token_ids: &[u32],
        logprobs: Option<&LogProbs>,
    ) -> Vec<Bytes> {
        let sequence = sequence_slot(&mut self.sequences, index);
        let choice = S::delta(sequence, &info.tokenizer, index, text, logprobs);
        vec![Self::chunk(info, vec![choice], None)]
    }

    fn finish(
        &mut self,
        info: &GenerationInfo,
        index: u32,
        reason: FinishReason,
        _matched: Option<MatchedStop>,
    ) -> Vec<Bytes> {
        let sequence = sequence_slot(&mut self.sequences, index);
        let choice = S::finish(sequence, index, finish_reason(reason));
        vec![Self::chunk(info, vec![choice], None)]
    }

    fn usage(&mut self, info: &GenerationInfo, usage: &Usage) -> Vec<Bytes> {
        if self.include_usage {
            vec![Self::chunk(info, Vec::new(), Some(openai_usage(usage)))]
        } else {
            Vec::new()
        }
    }

    fn json(&self, info: &GenerationInfo, output: CollectedOutput) -> Response {
        json_response(&openai::CompletionEnvelope {
            id: info.id.clone(),
            object: S::ResponseObject::default(),
            created: info.created,
            model: info.model.clone(),
            choices: output
                .choices
                .into_iter()
                .map(|choice| S::choice(&info.tokenizer, choice))
                .collect::<Vec<_>>(),
            usage: openai_usage(&output.usage),
        })
    }
}

/// Chat: the first chunk of each sequence carries the assistant role.
struct ChatShape;

/// Per chat sequence: whether its role went out.
#[derive(Default, Clone)]
struct RoleSent(bool);

impl RoleSent {
    /// The role, the first time only.
    fn take(&mut self) -> Option<openai::AssistantRole> {
        (!std::mem::replace(&mut self.0, true)).then_some(openai::AssistantRole)
    }
}

impl OpenAiShape for ChatShape {
    const ENDPOINT: Endpoint = Endpoint::ChatCompletions;
    type Request = openai::ChatCompletionRequest;
    type ChunkObject = openai::ChatCompletionChunkObject;
    type ResponseObject = openai::ChatCompletionObject;
    type ChunkChoice = openai::ChunkChoice;
    type Choice = openai::ChatChoice;
    type Sequence = RoleSent;

    fn spec(request: &Self::Request, limits: &Limits) -> Result<GenerationSpec> {
        request.to_spec(limits)
    }

    fn delta(
        role_sent: &mut RoleSent,
        tokenizer: &Tokenizer,
        index: u32,
        text: String,
        logprobs: Option<&LogProbs>,
    ) -> openai::ChunkChoice {
        openai::ChunkChoice {
            index,
            delta: openai::Delta {
                role: role_sent.take(),
                content: Some(text),
                reasoning_content: None,
                tool_calls: None,
            },
            logprobs: logprobs.map(|report| logprobs::chat(tokenizer, [report])),
            finish_reason: None,
        }
    }

    /// Reasoning, then text, then each call fragment, one chunk each (the
    /// order they were written in, and the shape clients accumulate by
    /// `index`); the logprobs ride on the first.
    fn parsed_delta(
        role_sent: &mut RoleSent,
        tokenizer: &Tokenizer,
        index: u32,
        parsed: ParsedText,
        logprobs: Option<&LogProbs>,
    ) -> Vec<openai::ChunkChoice> {
        let mut deltas = Vec::new();
        if !parsed.reasoning.is_empty() {
            deltas.push(openai::Delta {
                reasoning_content: Some(parsed.reasoning),
                ..Default::default()
            });
        }
        let calls_only = !parsed.calls.is_empty() && parsed.content.is_empty();
        if !calls_only && (!parsed.content.is_empty() || deltas.is_empty()) {
            deltas.push(openai::Delta {
                content: Some(parsed.content),
                ..Default::default()
            });
        }
        for call in parsed.calls {
            let first = call.name.is_some();
            deltas.push(openai::Delta {
                tool_calls: Some(vec![openai::ToolCallDelta {
                    index: call.index as u32,
                    id: call.id,
                    kind: first.then(openai::FunctionTag::default),
                    function: openai::FunctionCallDelta {
                        name: call.name,
                        arguments: Some(call.arguments),
                    },
                }]),
                ..Default::default()
            });
        }
        let mut logprobs = logprobs.map(|report| logprobs::chat(tokenizer, [report]));
        deltas
            .into_iter()
            .map(|mut delta| {
                delta.role = role_sent.take();
                openai::ChunkChoice {
                    index,
                    delta,
                    logprobs: logprobs.take(),
                    finish_reason: None,
                }
            })
            .collect()
    }

    fn finish(
        role_sent: &mut RoleSent,
        index: u32,
        reason: openai::FinishReason,
    ) -> openai::ChunkChoice {
        openai::ChunkChoice {
            index,
            delta: openai::Delta {
                role: role_sent.take(),
                ..Default::default()
            },
            logprobs: None,
            finish_reason: Some(reason),
        }
    }

    fn choice(tokenizer: &Tokenizer, choice: CollectedChoice) -> openai::ChatChoice {
        openai::ChatChoice {
            index: choice.index,
            logprobs: (!choice.logprobs.is_empty())
                .then(|| logprobs::chat(tokenizer, &choice.logprobs)),
            message: openai::AssistantMessage {
                role: openai::AssistantRole,
                // Null when the model only called tools (whitespace around
                // the calls is not an answer).
                content: (choice.tool_calls.is_empty() || !choice.text.trim().is_empty())
                    .then_some(choice.text),
                reasoning_content: (!choice.reasoning.is_empty()).then_some(choice.reasoning),
                tool_calls: (!choice.tool_calls.is_empty()).then(|| {
                    choice
                        .tool_calls
                        .into_iter()
                        .map(|call| openai::ToolCall {
                            id: call.id,
                            kind: openai::FunctionTag,
                            function: openai::FunctionCall {
                                name: call.name,
                                arguments: call.arguments,
                            },
                        })
                        .collect()
                }),
            },
            finish_reason: choice.finish_reason.map(finish_reason),
        }
    }
}

/// Text completions: chunks carry only the new text; logprob offsets
/// continue from chunk to chunk.
struct TextCompletionShape;

impl OpenAiShape for TextCompletionShape {
    const ENDPOINT: Endpoint = Endpoint::Completions;
    type Request = openai::CompletionRequest;
    type ChunkObject = openai::TextCompletionObject;
    type ResponseObject = openai::TextCompletionObject;
    type ChunkChoice = openai::CompletionChoice;
    type Choice = openai::CompletionChoice;
    /// Characters of logprob tokens reported so far.
    type Sequence = u32;

    fn spec(request: &Self::Request, limits: &Limits) -> Result<GenerationSpec> {
        request.to_spec(limits)
    }

    fn delta(
        text_offset: &mut u32,
        tokenizer: &Tokenizer,
        index: u32,
        text: String,
        logprobs: Option<&LogProbs>,
    ) -> openai::CompletionChoice {
        openai::CompletionChoice {
            index,
            text,
            logprobs: logprobs.map(|report| logprobs::completion(tokenizer, [report], text_offset)),
            finish_reason: None,
        }
    }

    fn finish(
        _text_offset: &mut u32,
        index: u32,
        reason: openai::FinishReason,
    ) -> openai::CompletionChoice {
        openai::CompletionChoice {
            index,
            text: String::new(),
            logprobs: None,
            finish_reason: Some(reason),
        }
    }

    fn choice(tokenizer: &Tokenizer, choice: CollectedChoice) -> openai::CompletionChoice {
        openai::CompletionChoice {
            index: choice.index,
            logprobs: (!choice.logprobs.is_empty())
                .then(|| logprobs::completion(tokenizer, &choice.logprobs, &mut 0)),
            text: choice.text,
            finish_reason: choice.finish_reason.map(finish_reason),
        }
    }
}

pub(crate) async fn chat_completions(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    run::<ChatDialect>(state, &headers, body).await
}

pub(crate) async fn completions(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    run::<CompletionDialect>(state, &headers, body).await
}

pub(crate) async fn models(State(state): State<SharedState>) -> Response {
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        - state.started.elapsed().as_secs();
    axum::Json(openai::ModelList {
        object: ListObject,
        data: state
            .served_models()
            .into_iter()
            .map(|model| openai::ModelCard {
                id: model.name,
                object: openai::ModelObject,
                created,
                owned_by: "smg".to_owned(),
                max_model_len: Some(model.max_context_length),
            })
            .collect(),
    })
    .into_response()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    //! The exact bytes the OpenAI dialects write, streamed and whole: what
    //! clients parse, pinned byte for byte.
    use super::super::fixtures::frames as frames_of;
    use super::super::fixtures::{body, collected, frames, info, report, text, usage};
    use super::*;

    /// Bodies are parsed by size: a small one on the request's thread (it
    /// parses although the gate's only slot is taken), one over the inline
    /// size through the gate (it waits for the slot, then parses).
    #[tokio::test]
    async fn a_large_body_is_parsed_through_the_cpu_gate_and_a_small_one_inline() {
        use crate::api::types::validate::Limits;
        use crate::offload::Offload;

        let offload = Offload::new(1);
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (started, running) = tokio::sync::oneshot::channel();
        let blocker = {
            let offload = offload.clone();
            tokio::spawn(async move {
                offload
                    .run(move || {
                        let _ = started.send(());
                        let _ = held.recv();
                        Ok(())
                    })
                    .await
            })
        };
        running.await.unwrap();

        let chat = |content: String| {
            Bytes::from(
                serde_json::to_vec(&serde_json::json!({"model": "m",
                    "messages": [{"role": "user", "content": content}]}))
                .unwrap(),
            )
        };
        let small = super::super::parse_spec::<ChatDialect>(
            &offload,
            Limits::default(),
            chat("hi".to_owned()),
        )
        .await;
        assert!(small.is_ok(), "{small:?}");

        let large = chat("x".repeat(Offload::INLINE_BYTES));
        let mut parse = Box::pin(super::super::parse_spec::<ChatDialect>(
            &offload,
            Limits::default(),
            large,
        ));
        assert!(futures::poll!(&mut parse).is_pending());
        assert_eq!(offload.waiting(), 1);
        release.send(()).unwrap();
        assert!(parse.await.is_ok());
        blocker.await.unwrap().unwrap();
    }

    /// Two sequences interleaved: a delta with logprobs, a delta without,
    /// finishes (one before any text), usage, the end.
    fn stream(dialect: &mut impl Dialect, info: &GenerationInfo) -> Vec<String> {
        let hello = report(&[39, 415]);
        let world = report(&[78, 1009]);
        let mut frames = dialect.start(info, &usage());
        frames.extend(dialect.delta(info, 0, "Hello".into(), &[39, 415], Some(&hello)));
        frames.extend(dialect.delta(info, 1, "Hi".into(), &[78], None));
        frames.extend(dialect.delta(info, 0, " world".into(), &[78, 1009], Some(&world)));
        frames.extend(dialect.finish(info, 0, FinishReason::Length, None));
        frames.extend(dialect.finish(info, 2, FinishReason::Abort, None));
        let matched = Some(MatchedStop::TokenId(2));
        frames.extend(dialect.finish(info, 1, FinishReason::Stop, matched));
        frames.extend(dialect.usage(info, &usage()));
        frames.extend(dialect.end());
        text(frames)
    }

    #[tokio::test]
    async fn chat_frames_and_body_are_pinned() {
        let info = info();
        let mut dialect = ChatDialect::new(true);
        let expected = [
            r#"{"id":"req-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hello"},"logprobs":{"content":[{"token":"H","logprob":-0.5,"bytes":[72],"top_logprobs":[{"token":"H","logprob":-0.5,"bytes":[72]}]},{"token":"ell","logprob":-0.5,"bytes":[101,108,108],"top_logprobs":[{"token":"ell","logprob":-0.5,"bytes":[101,108,108]}]}]},"finish_reason":null}]}"#,
            r#"{"id":"req-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":1,"delta":{"role":"assistant","content":"Hi"},"logprobs":null,"finish_reason":null}]}"#,
            r#"{"id":"req-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":" world"},"logprobs":{"content":[{"token":"o","logprob":-0.5,"bytes":[111],"top_logprobs":[{"token":"o","logprob":-0.5,"bytes":[111]}]},{"token":" world","logprob":-0.5,"bytes":[32,119,111,114,108,100],"top_logprobs":[{"token":" world","logprob":-0.5,"bytes":[32,119,111,114,108,100]}]}]},"finish_reason":null}]}"#,
            r#"{"id":"req-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}]}"#,
            r#"{"id":"req-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":2,"delta":{"role":"assistant"},"logprobs":null,"finish_reason":"stop"}]}"#,
            r#"{"id":"req-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":1,"delta":{},"logprobs":null,"finish_reason":"stop"}]}"#,
            r#"{"id":"req-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":2}}}"#,
            r#"[DONE]"#,
        ];
        assert_eq!(stream(&mut dialect, &info), frames(&expected));
        let mut quiet = ChatDialect::new(false);
        assert!(quiet.usage(&info, &usage()).is_empty());
        assert_eq!(
            body(dialect.json(&info, collected())).await,
            r#"{"id":"req-1","object":"chat.completion","created":7,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello world"},"logprobs":{"content":[{"token":"H","logprob":-0.5,"bytes":[72],"top_logprobs":[{"token":"H","logprob":-0.5,"bytes":[72]}]},{"token":"ell","logprob":-0.5,"bytes":[101,108,108],"top_logprobs":[{"token":"ell","logprob":-0.5,"bytes":[101,108,108]}]},{"token":"o","logprob":-0.5,"bytes":[111],"top_logprobs":[{"token":"o","logprob":-0.5,"bytes":[111]}]},{"token":" world","logprob":-0.5,"bytes":[32,119,111,114,108,100],"top_logprobs":[{"token":" world","logprob":-0.5,"bytes":[32,119,111,114,108,100]}]}]},"finish_reason":"length"},{"index":1,"message":{"role":"assistant","content":"Hi"},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":2}}}"#
        );
    }

    #[tokio::test]
    async fn parsed_chat_output_is_pinned_streamed_and_whole() {
        use crate::pipeline::parsing::ToolCallDelta;
        use crate::pipeline::respond::CollectedCall;
        let info = info();
        let mut dialect = ChatDialect::new(false);
        let call = |id: Option<&str>, name: Option<&str>, arguments: &str| ToolCallDelta {
            index: 0,
            id: id.map(str::to_owned),
            name: name.map(str::to_owned),
            arguments: arguments.to_owned(),
        };
        let mut frames = dialect.start(&info, &usage());
        frames.extend(dialect.parsed_delta(
            &info,
            0,
            ParsedText {
                reasoning: "think".into(),
                content: "Sure.".into(),
                calls: vec![call(Some("call_1"), Some("get_weather"), "{\"city\":")],
            },
            &[],
            None,
        ));
        frames.extend(dialect.parsed_delta(
            &info,
            0,
            ParsedText {
                calls: vec![call(None, None, "\"Paris\"}")],
                ..ParsedText::default()
            },
            &[],
            None,
        ));
        frames.extend(dialect.finish(&info, 0, FinishReason::ToolCalls, None));
        let expected = [
            r#"{"id":"req-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","reasoning_content":"think"},"logprobs":null,"finish_reason":null}]}"#,
            r#"{"id":"req-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"Sure."},"logprobs":null,"finish_reason":null}]}"#,
            r#"{"id":"req-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":"}}]},"logprobs":null,"finish_reason":null}]}"#,
            r#"{"id":"req-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]},"logprobs":null,"finish_reason":null}]}"#,
            r#"{"id":"req-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}]}"#,
        ];
        assert_eq!(text(frames), frames_of(&expected));
        let mut whole = collected();
        whole.choices.truncate(1);
        let choice = &mut whole.choices[0];
        choice.text = "\n\n".into();
        choice.logprobs.clear();
        choice.reasoning = "think".into();
        choice.finish_reason = Some(FinishReason::ToolCalls);
        choice.tool_calls = vec![CollectedCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: "{\"city\":\"Paris\"}".into(),
            text_before: 2,
        }];
        assert_eq!(
            body(dialect.json(&info, whole)).await,
            r#"{"id":"req-1","object":"chat.completion","created":7,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,"reasoning_content":"think","tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},"logprobs":null,"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":2}}}"#
        );
    }

    #[tokio::test]
    async fn completion_frames_and_body_are_pinned() {
        let info = info();
        let mut dialect = CompletionDialect::new(true);
        let expected = [
            r#"{"id":"req-1","object":"text_completion","created":7,"model":"m","choices":[{"index":0,"text":"Hello","logprobs":{"tokens":["H","ell"],"token_logprobs":[-0.5,-0.5],"top_logprobs":[{"H":-0.5},{"ell":-0.5}],"text_offset":[0,1]},"finish_reason":null}]}"#,
            r#"{"id":"req-1","object":"text_completion","created":7,"model":"m","choices":[{"index":1,"text":"Hi","logprobs":null,"finish_reason":null}]}"#,
            r#"{"id":"req-1","object":"text_completion","created":7,"model":"m","choices":[{"index":0,"text":" world","logprobs":{"tokens":["o"," world"],"token_logprobs":[-0.5,-0.5],"top_logprobs":[{"o":-0.5},{" world":-0.5}],"text_offset":[4,5]},"finish_reason":null}]}"#,
            r#"{"id":"req-1","object":"text_completion","created":7,"model":"m","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length"}]}"#,
            r#"{"id":"req-1","object":"text_completion","created":7,"model":"m","choices":[{"index":2,"text":"","logprobs":null,"finish_reason":"stop"}]}"#,
            r#"{"id":"req-1","object":"text_completion","created":7,"model":"m","choices":[{"index":1,"text":"","logprobs":null,"finish_reason":"stop"}]}"#,
            r#"{"id":"req-1","object":"text_completion","created":7,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":2}}}"#,
            r#"[DONE]"#,
        ];
        assert_eq!(stream(&mut dialect, &info), frames(&expected));
        let mut quiet = CompletionDialect::new(false);
        assert!(quiet.usage(&info, &usage()).is_empty());
        assert_eq!(
            body(dialect.json(&info, collected())).await,
            r#"{"id":"req-1","object":"text_completion","created":7,"model":"m","choices":[{"index":0,"text":"Hello world","logprobs":{"tokens":["H","ell","o"," world"],"token_logprobs":[-0.5,-0.5,-0.5,-0.5],"top_logprobs":[{"H":-0.5},{"ell":-0.5},{"o":-0.5},{" world":-0.5}],"text_offset":[0,1,4,5]},"finish_reason":"length"},{"index":1,"text":"Hi","logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":2}}}"#
        );
    }
}
