//! The endpoint handlers and the one driver they share.
//!
//! Why it exists: every generation endpoint goes the same way, whatever its
//! dialect: parse the body into the dialect's request type, validate it into
//! a `GenerationSpec`, run it through the router, and write the answer back
//! in the same dialect, as one JSON body or as an SSE stream that ends with
//! `data: [DONE]` (Anthropic: `message_stop`). That way lives here once
//! ([`run`], [`stream_response`]), with the metrics and error handling; a
//! dialect is a [`Dialect`] that only says how it frames deltas, finishes,
//! usage and errors.
//!
//! One file per dialect, mirroring `api/types/`:
//! - `openai`: `/v1/chat/completions`, `/v1/completions`, `/v1/models`;
//! - `anthropic`: `/v1/messages`;
//! - `sglang`: `/generate`;
//! - `embeddings`: `/v1/embeddings` and `/v1/classify` (no generation, no
//!   stream: they skip the driver);
//! - `tokenize`: `/v1/tokenize` and `/v1/detokenize` (the gateway's
//!   tokenizer alone);
//! - `responses`: `/v1/responses` (generations driven by their own loop,
//!   with stored history and MCP calls) and the stored responses;
//! - `conversations`: `/v1/conversations` and their items (storage only).

mod anthropic;
mod conversations;
mod embeddings;
mod openai;
mod responses;
mod sglang;
mod tokenize;

pub(crate) use anthropic::messages;
pub(crate) use conversations::{
    add_conversation_items, create_conversation, delete_conversation, delete_conversation_item,
    get_conversation, get_conversation_item, list_conversation_items, update_conversation,
};
pub(crate) use embeddings::{classify, embeddings};
pub(crate) use openai::{chat_completions, completions, models};
pub(super) use responses::InFlightResponses;
pub(crate) use responses::{
    cancel_response, create_response, delete_response, get_response, list_input_items,
};
pub(crate) use sglang::generate;
pub(crate) use tokenize::{detokenize, tokenize};

use std::time::Instant;

use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::response::Response;
use futures::StreamExt;
use serde::de::DeserializeOwned;

use super::dialect::{ErrorDialect, render};
use super::http::{DONE_FRAME, SharedState, data_frame, sse_response};
use super::types::parse::parse_json;
use super::types::spec::GenerationSpec;
use super::types::validate::Limits;
use crate::engine::{LogProbs, MatchedStop};
use crate::error::{Error, Result};
use crate::metrics;
use crate::pipeline::Endpoint;
use crate::pipeline::parsing::ParsedText;
use crate::pipeline::request_context::carried;
use crate::pipeline::respond::{
    CollectedOutput, FinishReason, OutputEvent, OutputStream, Usage, collect,
};
use crate::router::Generation;
use crate::shutdown::RequestTasks;
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

/// How one API dialect reads a generation request and writes its answer.
///
/// The driver owns the generation's identity ([`GenerationInfo`]) and hands
/// it to every call; a dialect keeps only what it carries from one frame to
/// the next.
trait Dialect: Sized + Send + 'static {
    /// The endpoint this dialect serves (metrics label, pipeline choice).
    const ENDPOINT: Endpoint;
    /// The request body's type.
    type Request: DeserializeOwned;

    /// Checks a request into the protocol-neutral spec.
    fn spec(request: &Self::Request, limits: &Limits) -> Result<GenerationSpec>;
    /// The dialect's state for answering `spec`, made before the spec goes
    /// to the router.
    fn for_spec(spec: &GenerationSpec) -> Self;
    /// The shape of this dialect's errors.
    const ERRORS: ErrorDialect = ErrorDialect::OpenAi;

    /// A failure answered as a whole response (before any stream, or by a
    /// request that is not streamed).
    fn error_response(err: &Error) -> Response {
        render(err, Self::ERRORS)
    }

    /// Frames before any output (Anthropic's `message_start`), once the
    /// engine has reported the prompt's `usage` (prompt and cached tokens).
    fn start(&mut self, _info: &GenerationInfo, _usage: &Usage) -> Vec<Bytes> {
        Vec::new()
    }
    /// New output of sequence `index` split into reasoning, text and tool
    /// calls (see `pipeline::parsing`). Dialects that show only text write
    /// its text.
    fn parsed_delta(
        &mut self,
        info: &GenerationInfo,
        index: u32,
        parsed: ParsedText,
        token_ids: &[u32],
        logprobs: Option<&LogProbs>,
    ) -> Vec<Bytes> {
        self.delta(info, index, parsed.content, token_ids, logprobs)
    }
    /// New text of sequence `index`, the tokens it came from and their
    /// logprobs when the client asked for them.
    fn delta(
        &mut self,
        info: &GenerationInfo,
        index: u32,
        text: String,
        token_ids: &[u32],
        logprobs: Option<&LogProbs>,
    ) -> Vec<Bytes>;
    fn finish(
        &mut self,
        info: &GenerationInfo,
        index: u32,
        reason: FinishReason,
        matched: Option<MatchedStop>,
    ) -> Vec<Bytes>;
    fn usage(&mut self, info: &GenerationInfo, usage: &Usage) -> Vec<Bytes>;
    fn error(&mut self, err: &Error) -> Vec<Bytes> {
        vec![data_frame(&Self::ERRORS.body(err))]
    }
    fn end(&mut self) -> Vec<Bytes> {
        vec![Bytes::from_static(DONE_FRAME)]
    }
    /// The whole non-streamed answer.
    fn json(&self, info: &GenerationInfo, output: CollectedOutput) -> Response;
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

/// The state of sequence `index`, made (default) on first use.
fn sequence_slot<T: Default + Clone>(sequences: &mut Vec<T>, index: u32) -> &mut T {
    let slot = index as usize;
    if sequences.len() <= slot {
        sequences.resize(slot + 1, T::default());
    }
    &mut sequences[slot]
}

/// `body` as `D`'s request, made a generation spec. A body over
/// [`Offload::INLINE_BYTES`](crate::offload::Offload::INLINE_BYTES) is
/// parsed off the request threads: megabytes of JSON (an image as a `data:`
/// URL, a long prompt) hold a thread for milliseconds, and every request on
/// that thread would wait.
async fn parse_spec<D: Dialect>(
    offload: &crate::offload::Offload,
    limits: Limits,
    body: Bytes,
) -> Result<GenerationSpec> {
    let len = body.len();
    let parse = move || parse_json::<D::Request>(&body).and_then(|r| D::spec(&r, &limits));
    if crate::offload::Offload::is_small(len) {
        parse()
    } else {
        offload.run(parse).await
    }
}

/// Parses `body` as `D`'s request, runs it and answers in `D`.
async fn run<D: Dialect>(state: SharedState, headers: &HeaderMap, body: Bytes) -> Response {
    let endpoint = D::ENDPOINT;
    let spec = parse_spec::<D>(&state.offload, limits(&state), body).await;
    let started = Instant::now();
    let mut router_label = state.default_label();
    let outcome = async {
        let mut spec = spec?;
        let (router, model) = state.router_for(spec.model.as_deref())?;
        spec.model = model;
        router_label = router.mode().metrics_label();
        let stream = spec.stream;
        let dialect = D::for_spec(&spec);
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
            return D::error_response(&err);
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
        first_token_at,
    } = generation;
    let info = GenerationInfo {
        id: request_id,
        model,
        created,
        started,
        tokenizer,
    };
    if stream {
        return stream_response(&state.tasks, router_label, info, output, dialect);
    }
    match collect(output, n).await {
        Ok(collected) => {
            // An answer read whole by the router says when its first text
            // came; the collection only replays it.
            let first_token_after = first_token_at
                .map(|at| at.into_std().saturating_duration_since(started))
                .or(collected.first_token_after);
            if let Some(ttft) = first_token_after {
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
            D::error_response(&err)
        }
    }
}

/// Streams `output` as `dialect`'s SSE frames.
fn stream_response<D: Dialect>(
    tasks: &RequestTasks,
    router_label: &'static str,
    info: GenerationInfo,
    mut output: OutputStream,
    mut dialect: D,
) -> Response {
    let endpoint = D::ENDPOINT;
    let frames = async_frames(tasks, move |sender| async move {
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
        while let Some(event) = output.next().await {
            let frames = match event {
                Ok(OutputEvent::Started(usage)) => dialect.start(&info, &usage),
                Ok(OutputEvent::Delta {
                    index,
                    text,
                    reasoning,
                    tool_calls,
                    token_ids,
                    logprobs,
                }) => {
                    if first_token.is_none() {
                        first_token = Some(Instant::now());
                        metrics::record_ttft(router_label, info.started.elapsed());
                    }
                    let parsed = ParsedText {
                        content: text,
                        reasoning,
                        calls: tool_calls,
                    };
                    dialect.parsed_delta(&info, index, parsed, &token_ids, logprobs.as_ref())
                }
                Ok(OutputEvent::Finish {
                    index,
                    reason,
                    matched_stop,
                    ..
                }) => dialect.finish(&info, index, reason, matched_stop),
                Ok(OutputEvent::Usage(usage)) => {
                    completion_tokens = usage.completion_tokens;
                    dialect.usage(&info, &usage)
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

/// A stream of frames produced by a task on `tasks`. The task is dropped as
/// soon as the response body (the receiver) is: a producer waiting for the
/// engine's next token would otherwise notice only when it has one to send,
/// and its legs would be aborted that late (or, at shutdown, never).
fn async_frames<F, Fut>(
    tasks: &RequestTasks,
    producer: F,
) -> impl futures::Stream<Item = Bytes> + Send + 'static
where
    F: FnOnce(tokio::sync::mpsc::Sender<Bytes>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (sender, receiver) = tokio::sync::mpsc::channel(64);
    let watch = sender.clone();
    let produce = producer(sender);
    // The task outlives the handler: it keeps the request's span and id,
    // so a failure mid-stream is logged, and answered, under that id.
    tasks.spawn(carried(async move {
        tokio::select! {
            () = produce => {}
            () = watch.closed() => {}
        }
    }));
    tokio_stream::wrappers::ReceiverStream::new(receiver)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod fixtures {
    //! One generation, its events and its collected output, shared by the
    //! dialects' pinned-bytes tests.
    use axum::response::Response;

    use super::*;
    use crate::pipeline::respond::CollectedChoice;

    pub(super) fn info() -> GenerationInfo {
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
    pub(super) fn report(token_ids: &[u32]) -> LogProbs {
        LogProbs {
            token_logprobs: token_ids.iter().map(|_| -0.5).collect(),
            token_ids: token_ids.to_vec(),
            top: token_ids.iter().map(|&id| vec![(-0.5, id)]).collect(),
        }
    }

    pub(super) fn usage() -> Usage {
        Usage {
            prompt_tokens: 5,
            completion_tokens: 3,
            cached_tokens: 2,
        }
    }

    pub(super) fn text(frames: Vec<Bytes>) -> Vec<String> {
        frames
            .into_iter()
            .map(|frame| String::from_utf8(frame.to_vec()).unwrap())
            .collect()
    }

    pub(super) fn collected() -> CollectedOutput {
        CollectedOutput {
            choices: vec![
                CollectedChoice {
                    index: 0,
                    text: "Hello world".into(),
                    token_ids: vec![39, 415, 78, 1009],
                    finish_reason: Some(FinishReason::Length),
                    matched_stop: None,
                    logprobs: vec![report(&[39, 415]), report(&[78, 1009])],
                    ..Default::default()
                },
                CollectedChoice {
                    index: 1,
                    text: "Hi".into(),
                    token_ids: vec![78],
                    finish_reason: None,
                    matched_stop: None,
                    logprobs: Vec::new(),
                    ..Default::default()
                },
            ],
            usage: usage(),
            first_token_after: None,
        }
    }

    /// The SSE `data:` frames of `payloads`.
    pub(super) fn frames(payloads: &[&str]) -> Vec<String> {
        payloads
            .iter()
            .map(|payload| format!("data: {payload}\n\n"))
            .collect()
    }

    pub(super) async fn body(response: Response) -> String {
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }
}
