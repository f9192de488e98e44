//! The router: one type for every mode. It owns the pipelines built for its
//! [`Mode`], the workers, their policies and the model's tokenizer, and runs
//! a request through its pipeline's stages, retrying the attempt-scoped
//! stages (selection through execution) on retryable failures before any
//! output has reached the client.
//!
//! When output has reached the client is the retry rule. A generation has
//! no effect but its answer (tool calls are run by the client, or by the
//! Responses loop between generations), so running it again on another
//! worker is invisible to a client that has been sent nothing; the cost is
//! the work the first worker did for nothing.
//!
//! - Streamed: the client is sent the first event as soon as it exists, so
//!   an attempt ends at its first event; a failure after it (a worker that
//!   dies, a connection reset, a black hole ended by the keep-alive) ends
//!   the stream with an error event.
//! - Not streamed: nothing is sent before the answer is whole, so an
//!   attempt reads the whole answer. A failure anywhere in it, the first
//!   token or the last, is retried like a failure before it; the client
//!   sees only the answer of the attempt that completed.
//!
//! Where a retry goes: a failure of the connection to a worker (a call it
//! never saw, one the connection broke under) passes that worker over in
//! the request's later attempts whenever another worker of its role can
//! take them; the path to it is what failed. A call the worker never saw
//! is sent again at once, without a pause and outside the retry budget (up
//! to [`MAX_RESENDS`] times): nothing ran, so nothing is retried.
//!
//! It also feeds the circuit breakers: a success once an attempt's first
//! event arrives; a failure only for the worker the error blames, only if
//! the error counts against workers (`Error::charges`: not the gateway's
//! own timeouts, not a call the worker never saw, not a connection death
//! already counted), and at most once per request however many attempts
//! fail on that worker.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;

use crate::engine::Embedding;
use crate::engine::Runtime;
use crate::error::{Error, ErrorCode, Reach, Result};
use crate::lanes::LaneDecision;
use crate::metrics;
use crate::mode::Mode;
use crate::offload::Offload;
use crate::pipeline::attempt::{self, AttemptContext, AttemptOutcome};
use crate::pipeline::media::MediaPlanner;
use crate::pipeline::prepare::mint_request_id;
use crate::pipeline::prepare::{PreparedRequest, ServedModel, prepare};
use crate::pipeline::request_context::{client_request_id, engine_request_id};
use crate::pipeline::respond::{OutputEvent, OutputStream};
use crate::pipeline::spec::{GenerationSpec, InputItem};
use crate::pipeline::stages::{RolePolicies, pick};
use crate::pipeline::{Endpoint, PipelineDeps, RequestPipeline, StageKind};
use crate::policies::SelectionRequest;
use crate::shutdown::RequestTasks;
use crate::tokenizer::Tokenizer;
use crate::workers::{Worker, WorkerRole, WorkerSet};

/// How many times one request's calls that a worker never saw
/// ([`Reach::Unsent`]) are sent again, outside the retry budget.
const MAX_RESENDS: u32 = 3;

/// Retries with exponential backoff and jitter (SMG's `--retry-*` flags).
#[derive(Debug, Clone, Copy)]
pub struct RetryConfig {
    pub max_retries: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    pub multiplier: f64,
    pub jitter_factor: f64,
    pub disabled: bool,
}

impl RetryConfig {
    /// The pause before retry number `attempt` (1-based).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exponent = i32::try_from(attempt.saturating_sub(1)).unwrap_or(i32::MAX);
        let base = self.initial_backoff.as_secs_f64() * self.multiplier.max(1.0).powi(exponent);
        let capped = base.min(self.max_backoff.as_secs_f64());
        let jitter = 1.0 + self.jitter_factor.clamp(0.0, 1.0) * (rand::random::<f64>() * 2.0 - 1.0);
        Duration::from_secs_f64((capped * jitter).max(0.0))
    }

    fn attempts(&self) -> u32 {
        if self.disabled {
            1
        } else {
            self.max_retries + 1
        }
    }
}

/// Everything a router is made of.
#[derive(Debug)]
pub struct RouterParts {
    pub mode: Mode,
    pub runtime: Runtime,
    pub workers: WorkerSet,
    pub policies: RolePolicies,
    pub tokenizer: Tokenizer,
    pub model: ServedModel,
    pub retry: RetryConfig,
    pub request_timeout: Duration,
    /// Image intake and preprocessing; `None` for text-only models.
    pub media: Option<MediaPlanner>,
    /// Where leg supervisors and engine aborts run (the shutdown waits for
    /// them).
    pub tasks: RequestTasks,
    /// Where large prompts are rendered and tokenized.
    pub offload: Offload,
}

/// One router, parameterized by its mode.
#[derive(Debug)]
pub struct Router {
    parts: RouterParts,
    pipelines: HashMap<Endpoint, RequestPipeline>,
}

/// A generation under way: the identifiers clients see and its output.
pub struct Generation {
    pub request_id: String,
    pub model: String,
    pub created: u64,
    pub n: u32,
    /// The model's tokenizer (responses render token ids with it).
    pub tokenizer: crate::tokenizer::Tokenizer,
    /// The pipeline stages that ran for it, in order: Preparation, then
    /// those of the attempt that answered.
    pub stages: Vec<StageKind>,
    pub output: OutputStream,
    /// When the first text arrived, for a request whose answer was read
    /// whole before it was returned (not streamed): its `output` then
    /// replays it, so the time can no longer be read off the stream.
    pub first_token_at: Option<Instant>,
}

impl std::fmt::Debug for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generation")
            .field("request_id", &self.request_id)
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

impl Router {
    pub fn new(parts: RouterParts) -> Self {
        let deps = PipelineDeps {
            runtime: parts.runtime,
        };
        let pipelines = Endpoint::ALL
            .into_iter()
            .filter_map(|endpoint| {
                RequestPipeline::build(endpoint, parts.mode, &deps).map(|p| (endpoint, p))
            })
            .collect();
        Self { parts, pipelines }
    }

    pub fn mode(&self) -> Mode {
        self.parts.mode
    }

    pub fn model(&self) -> &ServedModel {
        &self.parts.model
    }

    pub fn runtime(&self) -> Runtime {
        self.parts.runtime
    }

    pub fn workers(&self) -> &WorkerSet {
        &self.parts.workers
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.parts.tokenizer
    }

    /// The gate large prompts' CPU work passes through.
    pub fn offload(&self) -> &Offload {
        &self.parts.offload
    }

    pub fn pipeline(&self, endpoint: Endpoint) -> Result<&RequestPipeline> {
        self.pipelines.get(&endpoint).ok_or_else(|| {
            Error::new(
                ErrorCode::UnsupportedEndpoint,
                format!(
                    "{} is not served in {} mode with {} workers",
                    endpoint.label(),
                    self.parts.mode.name(),
                    self.parts.runtime.name()
                ),
            )
        })
    }

    /// Whether a healthy worker exists for every role the mode needs.
    pub fn ready(&self) -> bool {
        self.parts
            .mode
            .spec()
            .required_roles
            .iter()
            .all(|&role| !self.parts.workers.healthy(role).is_empty())
    }

    /// Runs a generation request through its pipeline.
    pub async fn generate(
        &self,
        endpoint: Endpoint,
        spec: GenerationSpec,
        routing_key: Option<String>,
    ) -> Result<Generation> {
        let pipeline = self.pipeline(endpoint)?;
        let started = Instant::now();
        let request = prepare(
            endpoint,
            spec,
            &self.parts.model,
            &self.parts.tokenizer,
            &self.parts.offload,
            self.parts.media.as_ref(),
            || match &self.parts.media {
                Some(media) => {
                    media
                        .lanes()
                        .decide(self.parts.mode, self.parts.runtime, &self.parts.workers)
                }
                None => LaneDecision::default(),
            },
            routing_key,
        )
        .await?;
        self.dispatch(pipeline, request, started).await
    }

    /// Runs a prepared request's attempts, retrying as configured, until
    /// one has produced its first event.
    async fn dispatch(
        &self,
        pipeline: &RequestPipeline,
        request: PreparedRequest,
        started: Instant,
    ) -> Result<Generation> {
        let deadline = started + self.parts.request_timeout;
        let charged = Charged::default();
        let Attempted {
            output,
            ran,
            created,
            first_token_at,
        } = self
            .with_retries(&request.request_id, deadline, |attempt, avoid| {
                self.attempt(pipeline, &request, attempt, avoid, deadline, &charged)
            })
            .await?;
        let mut stages = Vec::with_capacity(ran.len() + 1);
        stages.push(StageKind::Preparation);
        stages.extend(ran);
        Ok(Generation {
            request_id: request.request_id,
            model: request.model,
            created,
            n: request.sampling.n,
            tokenizer: self.parts.tokenizer.clone(),
            stages,
            output,
            first_token_at,
        })
    }

    /// The one retry loop: runs `attempt(1, avoid)`, `attempt(2, avoid)`,
    /// ... until one succeeds, fails for good (not retryable), the attempts
    /// run out or `deadline` passes; every attempt runs under the deadline,
    /// and the pause between attempts follows the retry settings.
    ///
    /// `avoid` lists the workers whose connections failed under this
    /// request's earlier attempts (selection passes them over when it can).
    /// A failure the worker never saw ([`Reach::Unsent`]) is sent again at
    /// once and does not count as a retry, up to [`MAX_RESENDS`] times.
    async fn with_retries<T, F, Fut>(
        &self,
        request_id: &str,
        deadline: Instant,
        mut attempt: F,
    ) -> Result<T>
    where
        F: FnMut(u32, Vec<Arc<str>>) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let attempts = self.parts.retry.attempts();
        // Attempts made (each gets its own engine request id), retries
        // among them, and resends of calls never seen.
        let (mut number, mut retries, mut resends) = (0, 0, 0);
        let mut avoid: Vec<Arc<str>> = Vec::new();
        loop {
            number += 1;
            let outcome = tokio::time::timeout_at(deadline, attempt(number, avoid.clone()))
                .await
                .unwrap_or_else(|_| {
                    Err(Error::new(
                        ErrorCode::RequestTimeout,
                        "the request exceeded --request-timeout-secs",
                    ))
                });
            let err = match outcome {
                Ok(done) => return Ok(done),
                Err(err) if Instant::now() >= deadline => return Err(err),
                Err(err) => err,
            };
            if let Some(worker) = avoided_after(&err)
                && !avoid.contains(worker)
            {
                avoid.push(Arc::clone(worker));
            }
            if err.reach == Reach::Unsent && resends < MAX_RESENDS {
                resends += 1;
                let worker = err.worker.as_deref().unwrap_or("-");
                tracing::debug!(
                    request_id,
                    attempt = number,
                    worker,
                    "sending a call no worker saw again"
                );
                metrics::record_resend(worker);
                continue;
            }
            if !err.retryable() || retries + 1 >= attempts {
                return Err(err);
            }
            retries += 1;
            let pause = self.parts.retry.backoff(retries);
            tracing::info!(request_id, attempt = number, code = %err.code, ?pause, "retrying");
            metrics::record_retry(self.parts.mode.metrics_label(), err.code.as_str());
            tokio::time::sleep(pause).await;
        }
    }

    /// Embeds each input (SGLang `Embed`, Regular mode): tokenized here, one
    /// worker per input chosen by the regular policy, retried like
    /// generation. Returns the request id and one embedding per input.
    pub async fn embed(
        &self,
        endpoint: Endpoint,
        model: &str,
        inputs: Vec<InputItem>,
    ) -> Result<(String, Vec<Embedding>)> {
        self.pipeline(endpoint)?;
        if model != self.parts.model.name {
            return Err(Error::new(
                ErrorCode::ModelNotFound,
                format!(
                    "model {model:?} is not served here (serving {:?})",
                    self.parts.model.name
                ),
            )
            .with_param("model"));
        }
        let request_id = mint_request_id(endpoint);
        let client_request_id = client_request_id();
        let mut prompts = Vec::with_capacity(inputs.len());
        for input in inputs {
            let ids = match input {
                InputItem::Text(text) => {
                    let tokenizer = self.parts.tokenizer.clone();
                    self.parts
                        .offload
                        .run_sized(text.len(), move || tokenizer.encode(&text, true))
                        .await?
                }
                InputItem::TokenIds(ids) => ids,
            };
            if ids.len() as u64 >= u64::from(self.parts.model.max_context_length) {
                return Err(Error::new(
                    ErrorCode::ContextLengthExceeded,
                    format!(
                        "an input has {} tokens; the model's context holds {}",
                        ids.len(),
                        self.parts.model.max_context_length
                    ),
                )
                .with_param("input"));
            }
            prompts.push(ids);
        }
        let calls = prompts.iter().enumerate().map(|(index, ids)| {
            let engine_id = engine_request_id(
                client_request_id.as_deref(),
                &request_id,
                u32::try_from(index).unwrap_or(u32::MAX),
            );
            async move { self.embed_one(&engine_id, ids).await }
        });
        let embeddings = futures::future::try_join_all(calls).await?;
        Ok((request_id, embeddings))
    }

    async fn embed_one(&self, engine_id: &str, ids: &[u32]) -> Result<Embedding> {
        let deadline = Instant::now() + self.parts.request_timeout;
        let charged = &Charged::default();
        self.with_retries(engine_id, deadline, |attempt, avoid| async move {
            let selection = SelectionRequest {
                input_ids: ids,
                ..Default::default()
            };
            let guard = pick(
                &self.parts.workers,
                &self.parts.policies,
                WorkerRole::Regular,
                &selection,
                &avoid,
            )
            .await?;
            let worker = Arc::clone(guard.worker());
            let result = worker
                .client()
                .embed(&format!("{engine_id}-{attempt}"), ids.to_vec())
                .await;
            match &result {
                Ok(_) => worker.record_outcome(true),
                Err(err) => charged.record(std::slice::from_ref(&worker), err),
            }
            result
        })
        .await
    }

    /// One attempt: the pipeline's attempt-scoped stages
    /// ([`attempt::run`]), up to the first output event for a streamed
    /// request and to the last for one that is not (so a failure before any
    /// byte reaches the client can retry; see the module docs). The outcome
    /// feeds the chosen workers' circuit breakers: success once the first
    /// event arrives, failure on a worker's fault before or during the
    /// stream.
    async fn attempt(
        &self,
        pipeline: &RequestPipeline,
        request: &PreparedRequest,
        attempt: u32,
        avoid: Vec<Arc<str>>,
        deadline: Instant,
        charged: &Charged,
    ) -> Result<Attempted> {
        let context = AttemptContext {
            mode: self.parts.mode,
            request,
            workers: &self.parts.workers,
            policies: &self.parts.policies,
            tokenizer: &self.parts.tokenizer,
            tasks: &self.parts.tasks,
            engine_request_id: engine_request_id(
                request.client_request_id.as_deref(),
                &request.request_id,
                attempt,
            ),
            avoid,
            deadline,
        };
        let AttemptOutcome {
            result,
            chosen,
            ran,
            created,
        } = attempt::run(pipeline, context).await;
        match result {
            Ok(output) => {
                for worker in &chosen {
                    worker.record_outcome(true);
                }
                if !request.stream {
                    return match read_whole(output).await {
                        Ok((events, first_token_at)) => Ok(Attempted {
                            output: Box::pin(futures::stream::iter(events.into_iter().map(Ok))),
                            ran,
                            created,
                            first_token_at,
                        }),
                        Err(err) => {
                            let err = blame_a_lost_tensor(request, err);
                            charged.record(&chosen, &err);
                            Err(err)
                        }
                    };
                }
                let output: OutputStream = Box::pin(output.inspect(move |event| {
                    if let Err(err) = event {
                        record_failure(&chosen, err);
                    }
                }));
                Ok(Attempted {
                    output,
                    ran,
                    created,
                    first_token_at: None,
                })
            }
            Err(err) => {
                let err = blame_a_lost_tensor(request, err);
                charged.record(&chosen, &err);
                Err(err)
            }
        }
    }
}

/// `err`, unless a tensor this attempt sent through a lane was taken from
/// under it (a shm file removed or truncated before the worker read it):
/// then the worker's refusal (`worker_rejected`, `encode_failed`) was the
/// lane's fault, neither the client's nor the worker's, so the failure
/// becomes `tensor_lost`, which charges no worker and is retried; the
/// retry sends the tensor inline when the gateway still holds its bytes
/// (`media_for_attempt`).
fn blame_a_lost_tensor(request: &PreparedRequest, err: Error) -> Error {
    if err.code == ErrorCode::TensorLost || !request.leases.iter().flatten().any(|l| l.lost()) {
        return err;
    }
    tracing::warn!(
        request_id = %request.request_id,
        code = %err.code,
        detail = %err.message,
        "a tensor's shm file was removed or truncated before its worker read it"
    );
    Error::new(
        ErrorCode::TensorLost,
        "an image's tensor was removed from /dev/shm before the worker read it \
         (someone else deleted or truncated the gateway's file)",
    )
}

/// A successful attempt.
struct Attempted {
    output: OutputStream,
    ran: Vec<StageKind>,
    created: u64,
    first_token_at: Option<Instant>,
}

/// Reads an answer to its end: its events, and when the first text came;
/// the first error instead, if one ends it. The events are what the
/// response is built from anyway, so holding them costs about what the
/// collected answer does.
async fn read_whole(mut output: OutputStream) -> Result<(Vec<OutputEvent>, Option<Instant>)> {
    let mut events = Vec::new();
    let mut first_token_at = None;
    while let Some(event) = output.next().await {
        let event = event?;
        if first_token_at.is_none() && matches!(event, OutputEvent::Delta { .. }) {
            first_token_at = Some(Instant::now());
        }
        events.push(event);
    }
    Ok((events, first_token_at))
}

/// The worker a later attempt should pass over after `err`: the one it
/// blames, when its connection failed (the call never reached it, or the
/// connection broke under it). A worker that answered with an error is
/// left to the policy and its circuit breaker.
fn avoided_after(err: &Error) -> Option<&Arc<str>> {
    match err.reach {
        Reach::Unsent | Reach::Connection { .. } => err.worker.as_ref(),
        Reach::Worker => None,
    }
}

/// Charges a failure to the chosen worker it blames, if it counts against
/// a worker at all ([`Error::charges`]). A failure that blames no worker
/// (the gateway's own timeout, a lane that could not renew a tensor)
/// charges nobody: a healthy worker must not be shut out for it.
fn record_failure(chosen: &[Arc<Worker>], err: &Error) {
    for worker in chosen.iter().filter(|worker| err.charges(worker.url())) {
        worker.record_outcome(false);
    }
}

/// The workers one request's failed attempts have charged: each at most
/// once, so a request retried on the same worker (a lone worker, a sticky
/// policy) counts as one failure, not one per attempt.
#[derive(Debug, Default)]
struct Charged(std::sync::Mutex<Vec<u64>>);

impl Charged {
    /// [`record_failure`], skipping workers this request already charged.
    fn record(&self, chosen: &[Arc<Worker>], err: &Error) {
        let mut charged = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let fresh: Vec<Arc<Worker>> = chosen
            .iter()
            .filter(|worker| err.charges(worker.url()) && !charged.contains(&worker.serial()))
            .cloned()
            .collect();
        charged.extend(fresh.iter().map(|worker| worker.serial()));
        drop(charged);
        record_failure(&fresh, err);
    }
}

#[cfg(test)]
mod tests;
