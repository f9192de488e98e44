//! The endpoint handlers: parse the body into its dialect's request type,
//! validate it into a `GenerationSpec`, run it through the router, and write
//! the answer back in the same dialect — one JSON body, or an SSE stream
//! that ends with `data: [DONE]` (Anthropic: `message_stop`).
//!
//! Each dialect is a [`Dialect`]: how it frames deltas, finishes, usage and
//! errors. One driver streams any dialect, so streaming, metrics and error
//! handling exist once.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;

use super::http::{DONE_FRAME, SharedState, data_frame, named_frame, sse_response};
use super::logprobs;
use super::types::parse::parse_json;
use super::types::validate::Limits;
use super::types::{anthropic, embeddings, openai, sglang};
use crate::engine::{LogProbs, MatchedStop};
use crate::error::{Error, Result};
use crate::metrics;
use crate::pipeline::Endpoint;
use crate::pipeline::respond::{
    CollectedChoice, CollectedOutput, FinishReason, OutputEvent, Usage, collect,
};
use crate::router::Generation;
use crate::tokenizer::Tokenizer;

/// The header that pins a conversation to a worker under sticky policies.
const ROUTING_KEY_HEADER: &str = "x-smg-routing-key";

fn routing_key(headers: &HeaderMap) -> Option<String> {
    headers
        .get(ROUTING_KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn limits(state: &SharedState) -> Limits {
    Limits {
        max_output_tokens: state.output_limit(),
    }
}

fn openai_finish(reason: FinishReason) -> openai::FinishReason {
    match reason {
        FinishReason::Length => openai::FinishReason::Length,
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

/// How one API dialect writes a generation.
trait Dialect: Send + 'static {
    /// Frames before any output (Anthropic's `message_start`).
    fn start(&mut self, _generation: &GenerationInfo) -> Vec<Bytes> {
        Vec::new()
    }
    /// New text of sequence `index`, the tokens it came from and their
    /// logprobs when the client asked for them.
    fn delta(
        &mut self,
        index: u32,
        text: String,
        token_ids: &[u32],
        logprobs: Option<&LogProbs>,
    ) -> Vec<Bytes>;
    fn finish(
        &mut self,
        index: u32,
        reason: FinishReason,
        matched: Option<MatchedStop>,
    ) -> Vec<Bytes>;
    fn usage(&mut self, usage: &Usage) -> Vec<Bytes>;
    fn error(&mut self, err: &Error) -> Vec<Bytes> {
        vec![data_frame(&err.to_openai_json())]
    }
    fn end(&mut self) -> Vec<Bytes> {
        vec![Bytes::from_static(DONE_FRAME)]
    }
    /// The whole non-streamed answer.
    fn json(&self, generation: &GenerationInfo, output: CollectedOutput) -> Response;
}

/// The identifiers of a generation, without its output stream.
#[derive(Debug, Clone)]
struct GenerationInfo {
    id: String,
    model: String,
    created: u64,
    started: Instant,
    tokenizer: Tokenizer,
}

/// Runs a parsed request and answers in `dialect`.
async fn run<D: Dialect>(
    state: SharedState,
    endpoint: Endpoint,
    spec: Result<crate::api::types::spec::GenerationSpec>,
    headers: &HeaderMap,
    make_dialect: impl FnOnce(&crate::api::types::spec::GenerationSpec) -> D,
) -> Response {
    let started = Instant::now();
    let mut router_label = state.default_label();
    let outcome = async {
        let mut spec = spec?;
        let (router, model) = state.router_for(spec.model.as_deref())?;
        spec.model = model;
        router_label = router.mode().metrics_label();
        let stream = spec.stream;
        let dialect = make_dialect(&spec);
        let generation = router
            .generate(endpoint, spec, routing_key(headers))
            .await?;
        Ok::<_, Error>((stream, dialect, generation))
    }
    .await;
    let (stream, dialect, generation) = match outcome {
        Ok(parts) => parts,
        Err(err) => {
            metrics::record_error(router_label, endpoint.label(), err.code.as_str());
            return error_for(endpoint, &err);
        }
    };
    let Generation {
        request_id,
        model,
        created,
        n,
        tokenizer,
        output,
        stages: _,
    } = generation;
    let info = GenerationInfo {
        id: request_id,
        model,
        created,
        started,
        tokenizer,
    };
    if stream {
        return stream_response(router_label, endpoint, info, output, dialect);
    }
    match collect(output, n).await {
        Ok(collected) => {
            if let Some(ttft) = collected.first_token_after {
                metrics::record_ttft(router_label, ttft);
            }
            metrics::record_request(
                router_label,
                endpoint.label(),
                &info.model,
                started.elapsed(),
            );
            dialect.json(&info, collected)
        }
        Err(err) => {
            metrics::record_error(router_label, endpoint.label(), err.code.as_str());
            error_for(endpoint, &err)
        }
    }
}

fn error_for(endpoint: Endpoint, err: &Error) -> Response {
    if endpoint == Endpoint::Messages {
        let status = axum::http::StatusCode::from_u16(err.code.http_status())
            .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        return (status, axum::Json(anthropic::StreamEvent::error(err))).into_response();
    }
    err.clone().into_response()
}

fn stream_response<D: Dialect>(
    router_label: &'static str,
    endpoint: Endpoint,
    info: GenerationInfo,
    mut output: crate::pipeline::respond::OutputStream,
    mut dialect: D,
) -> Response {
    let frames = async_frames(move |sender| async move {
        let mut first_token: Option<Instant> = None;
        let mut completion_tokens = 0u32;
        let send_all = |frames: Vec<Bytes>| {
            let sender = sender.clone();
            async move {
                for frame in frames {
                    if sender.send(frame).await.is_err() {
                        return false;
                    }
                }
                true
            }
        };
        if !send_all(dialect.start(&info)).await {
            return;
        }
        while let Some(event) = output.next().await {
            let frames = match event {
                Ok(OutputEvent::Delta {
                    index,
                    text,
                    token_ids,
                    logprobs,
                }) => {
                    if first_token.is_none() {
                        first_token = Some(Instant::now());
                        metrics::record_ttft(router_label, info.started.elapsed());
                    }
                    dialect.delta(index, text, &token_ids, logprobs.as_ref())
                }
                Ok(OutputEvent::Finish {
                    index,
                    reason,
                    matched_stop,
                }) => dialect.finish(index, reason, matched_stop),
                Ok(OutputEvent::Usage(usage)) => {
                    completion_tokens = usage.completion_tokens;
                    dialect.usage(&usage)
                }
                Err(err) => {
                    metrics::record_error(router_label, endpoint.label(), err.code.as_str());
                    let mut frames = dialect.error(&err);
                    frames.extend(dialect.end());
                    let _ = send_all(frames).await;
                    return;
                }
            };
            if !send_all(frames).await {
                // The client went away: dropping `output` aborts the legs.
                return;
            }
        }
        if let Some(first) = first_token
            && completion_tokens > 1
        {
            metrics::record_tpot(router_label, first.elapsed() / (completion_tokens - 1));
        }
        metrics::record_request(
            router_label,
            endpoint.label(),
            &info.model,
            info.started.elapsed(),
        );
        let _ = send_all(dialect.end()).await;
    });
    sse_response(frames)
}

/// A stream of frames produced by a task; the task stops when the response
/// body (the receiver) is dropped.
fn async_frames<F, Fut>(producer: F) -> impl futures::Stream<Item = Bytes> + Send + 'static
where
    F: FnOnce(tokio::sync::mpsc::Sender<Bytes>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (sender, receiver) = tokio::sync::mpsc::channel(64);
    tokio::spawn(producer(sender));
    tokio_stream::wrappers::ReceiverStream::new(receiver)
}

// ----------------------------------------------------------------------------
// OpenAI chat and text completions
// ----------------------------------------------------------------------------

/// What differs between chat and text completions on the way out: the
/// `object` tags, the choice shapes and what a sequence carries from chunk
/// to chunk. [`OpenAiDialect`] writes both around them.
trait OpenAiShape: Send + 'static {
    type ChunkObject: Default + serde::Serialize;
    type ResponseObject: Default + serde::Serialize;
    type ChunkChoice: serde::Serialize;
    type Choice: serde::Serialize;
    /// What one sequence remembers between its chunks.
    type Sequence: Default + Clone + Send;

    /// The chunk choice for new text of sequence `index`.
    fn delta(
        sequence: &mut Self::Sequence,
        tokenizer: Option<&Tokenizer>,
        index: u32,
        text: String,
        logprobs: Option<&LogProbs>,
    ) -> Self::ChunkChoice;
    /// The chunk choice that ends sequence `index`.
    fn finish(
        sequence: &mut Self::Sequence,
        index: u32,
        reason: openai::FinishReason,
    ) -> Self::ChunkChoice;
    /// One choice of the whole answer.
    fn choice(tokenizer: &Tokenizer, choice: CollectedChoice) -> Self::Choice;
}

/// The state of sequence `index`, made (default) on first use.
fn sequence_slot<T: Default + Clone>(sequences: &mut Vec<T>, index: u32) -> &mut T {
    let slot = index as usize;
    if sequences.len() <= slot {
        sequences.resize(slot + 1, T::default());
    }
    &mut sequences[slot]
}

/// OpenAI's chat or text completions, streamed or whole.
struct OpenAiDialect<S: OpenAiShape> {
    info: Option<GenerationInfo>,
    include_usage: bool,
    sequences: Vec<S::Sequence>,
}

type ChatDialect = OpenAiDialect<ChatShape>;
type CompletionDialect = OpenAiDialect<TextCompletionShape>;

impl<S: OpenAiShape> OpenAiDialect<S> {
    fn new(include_usage: bool) -> Self {
        Self {
            info: None,
            include_usage,
            sequences: Vec::new(),
        }
    }

    fn chunk(&self, choices: Vec<S::ChunkChoice>, usage: Option<openai::Usage>) -> Bytes {
        let (id, model, created) = self
            .info
            .as_ref()
            .map(|i| (i.id.clone(), i.model.clone(), i.created))
            .unwrap_or_default();
        data_frame(&openai::CompletionEnvelope {
            id,
            object: S::ChunkObject::default(),
            created,
            model,
            choices,
            usage,
        })
    }
}

impl<S: OpenAiShape> Dialect for OpenAiDialect<S> {
    fn start(&mut self, generation: &GenerationInfo) -> Vec<Bytes> {
        self.info = Some(generation.clone());
        Vec::new()
    }

    fn delta(
        &mut self,
        index: u32,
        text: String,
        _token_ids: &[u32],
        logprobs: Option<&LogProbs>,
    ) -> Vec<Bytes> {
        let tokenizer = self.info.as_ref().map(|info| &info.tokenizer);
        let sequence = sequence_slot(&mut self.sequences, index);
        let choice = S::delta(sequence, tokenizer, index, text, logprobs);
        vec![self.chunk(vec![choice], None)]
    }

    fn finish(
        &mut self,
        index: u32,
        reason: FinishReason,
        _matched: Option<MatchedStop>,
    ) -> Vec<Bytes> {
        let sequence = sequence_slot(&mut self.sequences, index);
        let choice = S::finish(sequence, index, openai_finish(reason));
        vec![self.chunk(vec![choice], None)]
    }

    fn usage(&mut self, usage: &Usage) -> Vec<Bytes> {
        if self.include_usage {
            vec![self.chunk(Vec::new(), Some(openai_usage(usage)))]
        } else {
            Vec::new()
        }
    }

    fn json(&self, generation: &GenerationInfo, output: CollectedOutput) -> Response {
        axum::Json(openai::CompletionEnvelope {
            id: generation.id.clone(),
            object: S::ResponseObject::default(),
            created: generation.created,
            model: generation.model.clone(),
            choices: output
                .choices
                .into_iter()
                .map(|choice| S::choice(&generation.tokenizer, choice))
                .collect::<Vec<_>>(),
            usage: openai_usage(&output.usage),
        })
        .into_response()
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
    type ChunkObject = openai::ChatCompletionChunkObject;
    type ResponseObject = openai::ChatCompletionObject;
    type ChunkChoice = openai::ChunkChoice;
    type Choice = openai::ChatChoice;
    type Sequence = RoleSent;

    fn delta(
        role_sent: &mut RoleSent,
        tokenizer: Option<&Tokenizer>,
        index: u32,
        text: String,
        logprobs: Option<&LogProbs>,
    ) -> openai::ChunkChoice {
        openai::ChunkChoice {
            index,
            delta: openai::Delta {
                role: role_sent.take(),
                content: Some(text),
                tool_calls: None,
            },
            logprobs: logprobs
                .zip(tokenizer)
                .map(|(report, tokenizer)| logprobs::chat(tokenizer, [report])),
            finish_reason: None,
        }
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
                content: None,
                tool_calls: None,
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
                content: Some(choice.text),
                tool_calls: None,
            },
            finish_reason: choice.finish_reason.map(openai_finish),
        }
    }
}

/// Text completions: chunks carry only the new text; logprob offsets
/// continue from chunk to chunk.
struct TextCompletionShape;

impl OpenAiShape for TextCompletionShape {
    type ChunkObject = openai::TextCompletionObject;
    type ResponseObject = openai::TextCompletionObject;
    type ChunkChoice = openai::CompletionChoice;
    type Choice = openai::CompletionChoice;
    /// Characters of logprob tokens reported so far.
    type Sequence = u32;

    fn delta(
        text_offset: &mut u32,
        tokenizer: Option<&Tokenizer>,
        index: u32,
        text: String,
        logprobs: Option<&LogProbs>,
    ) -> openai::CompletionChoice {
        openai::CompletionChoice {
            index,
            text,
            logprobs: logprobs
                .zip(tokenizer)
                .map(|(report, tokenizer)| logprobs::completion(tokenizer, [report], text_offset)),
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
            finish_reason: choice.finish_reason.map(openai_finish),
        }
    }
}

pub async fn chat_completions(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let spec =
        parse_json::<openai::ChatCompletionRequest>(&body).and_then(|r| r.to_spec(&limits(&state)));
    run(state, Endpoint::ChatCompletions, spec, &headers, |spec| {
        ChatDialect::new(spec.include_usage)
    })
    .await
}

pub async fn completions(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let spec =
        parse_json::<openai::CompletionRequest>(&body).and_then(|r| r.to_spec(&limits(&state)));
    run(state, Endpoint::Completions, spec, &headers, |spec| {
        CompletionDialect::new(spec.include_usage)
    })
    .await
}

// ----------------------------------------------------------------------------
// SGLang /generate
// ----------------------------------------------------------------------------

/// Per sequence: everything generated so far (SGLang streams cumulative text).
#[derive(Default, Clone)]
struct SoFar {
    text: String,
    output_ids: Vec<u32>,
}

struct GenerateDialect {
    info: Option<GenerationInfo>,
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

    fn response(
        &self,
        index: u32,
        usage: &Usage,
        completion_tokens: u32,
    ) -> sglang::GenerateResponse {
        let so_far = self
            .sequences
            .get(index as usize)
            .cloned()
            .unwrap_or_default();
        let info = self.info.as_ref();
        sglang::GenerateResponse {
            text: so_far.text,
            output_ids: so_far.output_ids,
            meta_info: sglang::MetaInfo {
                id: info.map(|i| i.id.clone()).unwrap_or_default(),
                finish_reason: self.finished.get(index as usize).cloned().flatten(),
                prompt_tokens: usage.prompt_tokens,
                completion_tokens,
                cached_tokens: usage.cached_tokens,
                e2e_latency: info.map_or(0.0, |i| i.started.elapsed().as_secs_f64()),
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
    fn start(&mut self, generation: &GenerationInfo) -> Vec<Bytes> {
        self.info = Some(generation.clone());
        Vec::new()
    }

    fn delta(
        &mut self,
        index: u32,
        text: String,
        token_ids: &[u32],
        _logprobs: Option<&LogProbs>,
    ) -> Vec<Bytes> {
        let sequence = self.sequence(index);
        sequence.text.push_str(&text);
        sequence.output_ids.extend_from_slice(token_ids);
        let produced = sequence.output_ids.len() as u32;
        let usage = self.usage;
        vec![data_frame(&self.response(index, &usage, produced))]
    }

    fn finish(
        &mut self,
        index: u32,
        reason: FinishReason,
        matched: Option<MatchedStop>,
    ) -> Vec<Bytes> {
        let produced = self.sequence(index).output_ids.len() as u32;
        self.finished[index as usize] = Some(generate_finish(reason, matched, produced));
        let usage = self.usage;
        vec![data_frame(&self.response(index, &usage, produced))]
    }

    fn usage(&mut self, usage: &Usage) -> Vec<Bytes> {
        self.usage = *usage;
        Vec::new()
    }

    fn json(&self, generation: &GenerationInfo, output: CollectedOutput) -> Response {
        let n = output.choices.len();
        let responses: Vec<sglang::GenerateResponse> = output
            .choices
            .into_iter()
            .map(|choice| {
                let length = choice.token_ids.len() as u32;
                sglang::GenerateResponse {
                    meta_info: sglang::MetaInfo {
                        id: generation.id.clone(),
                        finish_reason: choice
                            .finish_reason
                            .map(|r| generate_finish(r, choice.matched_stop.clone(), length)),
                        prompt_tokens: output.usage.prompt_tokens,
                        completion_tokens: length,
                        cached_tokens: output.usage.cached_tokens,
                        e2e_latency: generation.started.elapsed().as_secs_f64(),
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

pub async fn generate(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let spec =
        parse_json::<sglang::GenerateRequest>(&body).and_then(|r| r.to_spec(&limits(&state)));
    run(state, Endpoint::Generate, spec, &headers, |spec| {
        GenerateDialect {
            info: None,
            n: spec.sampling.n.max(1),
            sequences: Vec::new(),
            finished: Vec::new(),
            usage: Usage::default(),
        }
    })
    .await
}

// ----------------------------------------------------------------------------
// Anthropic /v1/messages
// ----------------------------------------------------------------------------

struct MessagesDialect {
    info: Option<GenerationInfo>,
    block_open: bool,
    stop: Option<(anthropic::StopReason, Option<String>)>,
}

fn event_frame(event: &anthropic::StreamEvent) -> Bytes {
    named_frame(event.event_name(), event)
}

impl MessagesDialect {
    fn message(
        &self,
        content: Vec<anthropic::ResponseBlock>,
        usage: anthropic::Usage,
    ) -> anthropic::MessagesResponse {
        let info = self.info.as_ref();
        anthropic::MessagesResponse {
            id: info.map(|i| i.id.clone()).unwrap_or_default(),
            kind: anthropic::MessageTag,
            role: openai::AssistantRole,
            content,
            model: info.map(|i| i.model.clone()).unwrap_or_default(),
            stop_reason: self.stop.as_ref().map(|(reason, _)| *reason),
            stop_sequence: self.stop.as_ref().and_then(|(_, seq)| seq.clone()),
            usage,
        }
    }
}

fn anthropic_stop(
    reason: FinishReason,
    matched: Option<&MatchedStop>,
) -> (anthropic::StopReason, Option<String>) {
    let openai_reason = openai_finish(reason);
    anthropic::StopReason::from_finish(openai_reason, matched)
}

impl Dialect for MessagesDialect {
    fn start(&mut self, generation: &GenerationInfo) -> Vec<Bytes> {
        self.info = Some(generation.clone());
        let message = self.message(Vec::new(), anthropic::Usage::from_counts(0, 0, 0));
        vec![
            event_frame(&anthropic::StreamEvent::MessageStart { message }),
            event_frame(&anthropic::StreamEvent::ContentBlockStart {
                index: 0,
                content_block: anthropic::ResponseBlock::Text {
                    text: String::new(),
                },
            }),
        ]
        .into_iter()
        .inspect(|_| self.block_open = true)
        .collect()
    }

    fn delta(
        &mut self,
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
        _index: u32,
        reason: FinishReason,
        matched: Option<MatchedStop>,
    ) -> Vec<Bytes> {
        self.stop = Some(anthropic_stop(reason, matched.as_ref()));
        Vec::new()
    }

    fn usage(&mut self, usage: &Usage) -> Vec<Bytes> {
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

    fn json(&self, generation: &GenerationInfo, output: CollectedOutput) -> Response {
        let mut dialect = MessagesDialect {
            info: Some(generation.clone()),
            block_open: false,
            stop: None,
        };
        let Some(choice) = output.choices.into_iter().next() else {
            return Error::internal("the generation produced no output").into_response();
        };
        dialect.stop = choice
            .finish_reason
            .map(|reason| anthropic_stop(reason, choice.matched_stop.as_ref()));
        let usage = anthropic::Usage::from_counts(
            output.usage.prompt_tokens,
            output.usage.completion_tokens,
            output.usage.cached_tokens,
        );
        axum::Json(dialect.message(
            vec![anthropic::ResponseBlock::Text { text: choice.text }],
            usage,
        ))
        .into_response()
    }
}

pub async fn messages(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let spec =
        parse_json::<anthropic::MessagesRequest>(&body).and_then(|r| r.to_spec(&limits(&state)));
    run(state, Endpoint::Messages, spec, &headers, |_| {
        MessagesDialect {
            info: None,
            block_open: false,
            stop: None,
        }
    })
    .await
}

// ----------------------------------------------------------------------------
// Embeddings, classify, models
// ----------------------------------------------------------------------------

pub async fn embeddings(
    State(state): State<SharedState>,
    _headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let mut router_label = state.default_label();
    let outcome = async {
        let request = parse_json::<embeddings::EmbeddingRequest>(&body)?;
        let inputs = request.to_inputs()?;
        let format = request.encoding_format.unwrap_or_default();
        let (router, model) = state.router_for(Some(&request.model))?;
        router_label = router.mode().metrics_label();
        let model = model.unwrap_or_else(|| request.model.clone());
        let (_, vectors) = router.embed(Endpoint::Embeddings, &model, inputs).await?;
        let prompt_tokens = vectors.iter().map(|v| v.prompt_tokens).sum();
        let data = vectors
            .iter()
            .enumerate()
            .map(|(index, vector)| {
                let values = match request.dimensions {
                    Some(dims) => &vector.values[..vector.values.len().min(dims as usize)],
                    None => &vector.values[..],
                };
                embeddings::EmbeddingData {
                    object: embeddings::EmbeddingObject,
                    index: index as u32,
                    embedding: embeddings::EmbeddingVector::encode(values, format),
                }
            })
            .collect();
        Ok::<_, Error>(embeddings::EmbeddingResponse {
            object: super::types::forms::ListObject,
            data,
            model: request.model,
            usage: embeddings::InputUsage::new(prompt_tokens),
        })
    }
    .await;
    match outcome {
        Ok(response) => {
            metrics::record_request(
                router_label,
                Endpoint::Embeddings.label(),
                &response.model,
                started.elapsed(),
            );
            axum::Json(response).into_response()
        }
        Err(err) => {
            metrics::record_error(
                router_label,
                Endpoint::Embeddings.label(),
                err.code.as_str(),
            );
            err.into_response()
        }
    }
}

/// Class probabilities from the worker's output logits (softmax); labels are
/// `LABEL_<id>`, Hugging Face's names when a model has no `id2label`.
fn classify_logits(index: u32, logits: &[f32]) -> embeddings::Classification {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = logits.iter().map(|v| (v - max).exp()).collect();
    let total: f32 = exps.iter().sum::<f32>().max(f32::MIN_POSITIVE);
    let probs: Vec<f32> = exps.iter().map(|v| v / total).collect();
    let best = probs
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(id, _)| id);
    embeddings::Classification {
        index,
        label: format!("LABEL_{best}"),
        probs,
    }
}

pub async fn classify(
    State(state): State<SharedState>,
    _headers: HeaderMap,
    body: Bytes,
) -> Response {
    let outcome = async {
        let request = parse_json::<embeddings::ClassifyRequest>(&body)?;
        let inputs = request.to_inputs()?;
        let (router, model) = state.router_for(Some(&request.model))?;
        let model = model.unwrap_or_else(|| request.model.clone());
        let (id, outputs) = router.embed(Endpoint::Classify, &model, inputs).await?;
        let prompt_tokens = outputs.iter().map(|v| v.prompt_tokens).sum();
        Ok::<_, Error>(embeddings::ClassifyResponse {
            id,
            object: super::types::forms::ListObject,
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            model: request.model,
            data: outputs
                .iter()
                .enumerate()
                .map(|(index, output)| classify_logits(index as u32, &output.values))
                .collect(),
            usage: embeddings::InputUsage::new(prompt_tokens),
        })
    }
    .await;
    match outcome {
        Ok(response) => axum::Json(response).into_response(),
        Err(err) => err.into_response(),
    }
}

pub async fn models(State(state): State<SharedState>) -> Response {
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        - state.started.elapsed().as_secs();
    axum::Json(openai::ModelList {
        object: super::types::forms::ListObject,
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
    use super::*;

    fn info() -> GenerationInfo {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/model");
        GenerationInfo {
            id: "req-1".to_owned(),
            model: "m".to_owned(),
            created: 7,
            started: Instant::now(),
            tokenizer: Tokenizer::from_model_dir(&dir).unwrap(),
        }
    }

    /// "Hello world" is [39, 415, 78, 1009] ("H", "ell", "o", " world") in
    /// the fixture.
    fn report(token_ids: &[u32]) -> LogProbs {
        LogProbs {
            token_logprobs: token_ids.iter().map(|_| -0.5).collect(),
            token_ids: token_ids.to_vec(),
            top: token_ids.iter().map(|&id| vec![(-0.5, id)]).collect(),
        }
    }

    fn usage() -> Usage {
        Usage {
            prompt_tokens: 5,
            completion_tokens: 3,
            cached_tokens: 2,
        }
    }

    fn text(frames: Vec<Bytes>) -> Vec<String> {
        frames
            .into_iter()
            .map(|frame| String::from_utf8(frame.to_vec()).unwrap())
            .collect()
    }

    /// Two sequences interleaved: a delta with logprobs, a delta without,
    /// finishes (one before any text), usage, the end.
    fn stream(dialect: &mut impl Dialect, info: &GenerationInfo) -> Vec<String> {
        let mut frames = dialect.start(info);
        frames.extend(dialect.delta(0, "Hello".into(), &[39, 415], Some(&report(&[39, 415]))));
        frames.extend(dialect.delta(1, "Hi".into(), &[78], None));
        frames.extend(dialect.delta(0, " world".into(), &[78, 1009], Some(&report(&[78, 1009]))));
        frames.extend(dialect.finish(0, FinishReason::Length, None));
        frames.extend(dialect.finish(2, FinishReason::Abort, None));
        frames.extend(dialect.finish(1, FinishReason::Stop, Some(MatchedStop::TokenId(2))));
        frames.extend(dialect.usage(&usage()));
        frames.extend(dialect.end());
        text(frames)
    }

    fn collected() -> CollectedOutput {
        CollectedOutput {
            choices: vec![
                CollectedChoice {
                    index: 0,
                    text: "Hello world".into(),
                    token_ids: vec![39, 415, 78, 1009],
                    finish_reason: Some(FinishReason::Length),
                    matched_stop: None,
                    logprobs: vec![report(&[39, 415]), report(&[78, 1009])],
                },
                CollectedChoice {
                    index: 1,
                    text: "Hi".into(),
                    token_ids: vec![78],
                    finish_reason: None,
                    matched_stop: None,
                    logprobs: Vec::new(),
                },
            ],
            usage: usage(),
            first_token_after: None,
        }
    }

    /// The SSE `data:` frames of `payloads`.
    fn frames(payloads: &[&str]) -> Vec<String> {
        payloads
            .iter()
            .map(|payload| format!("data: {payload}\n\n"))
            .collect()
    }

    async fn body(response: Response) -> String {
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
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
        quiet.start(&info);
        assert!(quiet.usage(&usage()).is_empty());
        assert_eq!(
            body(dialect.json(&info, collected())).await,
            r#"{"id":"req-1","object":"chat.completion","created":7,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello world"},"logprobs":{"content":[{"token":"H","logprob":-0.5,"bytes":[72],"top_logprobs":[{"token":"H","logprob":-0.5,"bytes":[72]}]},{"token":"ell","logprob":-0.5,"bytes":[101,108,108],"top_logprobs":[{"token":"ell","logprob":-0.5,"bytes":[101,108,108]}]},{"token":"o","logprob":-0.5,"bytes":[111],"top_logprobs":[{"token":"o","logprob":-0.5,"bytes":[111]}]},{"token":" world","logprob":-0.5,"bytes":[32,119,111,114,108,100],"top_logprobs":[{"token":" world","logprob":-0.5,"bytes":[32,119,111,114,108,100]}]}]},"finish_reason":"length"},{"index":1,"message":{"role":"assistant","content":"Hi"},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":2}}}"#
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
        quiet.start(&info);
        assert!(quiet.usage(&usage()).is_empty());
        assert_eq!(
            body(dialect.json(&info, collected())).await,
            r#"{"id":"req-1","object":"text_completion","created":7,"model":"m","choices":[{"index":0,"text":"Hello world","logprobs":{"tokens":["H","ell","o"," world"],"token_logprobs":[-0.5,-0.5,-0.5,-0.5],"top_logprobs":[{"H":-0.5},{"ell":-0.5},{"o":-0.5},{" world":-0.5}],"text_offset":[0,1,4,5]},"finish_reason":"length"},{"index":1,"text":"Hi","logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":2}}}"#
        );
    }
}
