//! The router: one type for every mode. It owns the pipelines built for its
//! [`Mode`], the workers, their policies and the model's tokenizer, and runs
//! a request through its pipeline's stages, retrying the attempt-scoped
//! stages (selection through execution) on retryable failures before any
//! output has reached the client.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;

use crate::engine::Embedding;
use crate::engine::Runtime;
use crate::error::{Error, ErrorCode, Result};
use crate::lanes::LaneDecision;
use crate::metrics;
use crate::mode::Mode;
use crate::pipeline::execution::execute;
use crate::pipeline::media::MediaPlanner;
use crate::pipeline::prepare::mint_request_id;
use crate::pipeline::prepare::{PreparedRequest, ServedModel, prepare};
use crate::pipeline::respond::{OutputStream, ResponseOptions, process};
use crate::pipeline::spec::{GenerationSpec, InputItem};
use crate::pipeline::stages::{
    EncodeDispatch, RolePolicies, Selection, acquire_clients, build_plan, media_for_attempt, pick,
    plan_encodes, select_workers,
};
use crate::pipeline::{Endpoint, PipelineDeps, RequestPipeline, StageKind};
use crate::policies::SelectionRequest;
use crate::tokenizer::Tokenizer;
use crate::workers::{Worker, WorkerRole, WorkerSet};

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
    pub output: OutputStream,
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

    pub fn pipeline(&self, endpoint: Endpoint) -> Result<&RequestPipeline> {
        self.pipelines.get(&endpoint).ok_or_else(|| {
            Error::new(
                ErrorCode::UnsupportedEndpoint,
                format!(
                    "{} is not served in {:?} mode with {} workers",
                    endpoint.label(),
                    self.parts.mode,
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
        let deadline = started + self.parts.request_timeout;
        let attempts = self.parts.retry.attempts();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let outcome = tokio::time::timeout_at(
                deadline.into(),
                self.attempt(pipeline, &request, attempt, deadline),
            )
            .await
            .unwrap_or_else(|_| {
                Err(Error::new(
                    ErrorCode::RequestTimeout,
                    "the request exceeded its time limit",
                ))
            });
            match outcome {
                Ok(output) => {
                    return Ok(Generation {
                        request_id: request.request_id.clone(),
                        model: request.model.clone(),
                        created: SystemTime::now()
                            .duration_since(SystemTime::UNIX_EPOCH)
                            .map_or(0, |d| d.as_secs()),
                        n: request.sampling.n,
                        tokenizer: self.parts.tokenizer.clone(),
                        output,
                    });
                }
                Err(err) if err.retryable() && attempt < attempts && Instant::now() < deadline => {
                    let pause = self.parts.retry.backoff(attempt);
                    tracing::info!(request_id = %request.request_id, attempt, code = %err.code, ?pause, "retrying");
                    metrics::record_retry(self.parts.mode.metrics_label(), err.code.as_str());
                    tokio::time::sleep(pause).await;
                }
                Err(err) => return Err(err),
            }
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
        let mut prompts = Vec::with_capacity(inputs.len());
        for input in inputs {
            let ids = match input {
                InputItem::Text(text) => self.parts.tokenizer.encode(&text, true)?,
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
            let engine_id = format!("{request_id}-{index}");
            async move { self.embed_one(&engine_id, ids).await }
        });
        let embeddings = futures::future::try_join_all(calls).await?;
        Ok((request_id, embeddings))
    }

    async fn embed_one(&self, engine_id: &str, ids: &[u32]) -> Result<Embedding> {
        let attempts = self.parts.retry.attempts();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let selection = SelectionRequest {
                input_ids: ids,
                ..Default::default()
            };
            let outcome = async {
                let guard = pick(
                    &self.parts.workers,
                    &self.parts.policies,
                    WorkerRole::Regular,
                    &selection,
                )?;
                let worker = Arc::clone(guard.worker());
                let client = worker.client().clone();
                let result = tokio::time::timeout(
                    self.parts.request_timeout,
                    client.embed(&format!("{engine_id}-{attempt}"), ids.to_vec()),
                )
                .await
                .unwrap_or_else(|_| {
                    Err(Error::new(
                        ErrorCode::RequestTimeout,
                        "the request exceeded its time limit",
                    ))
                });
                match &result {
                    Ok(_) => worker.record_outcome(true),
                    Err(err) => record_failure(std::slice::from_ref(&worker), err),
                }
                result
            }
            .await;
            match outcome {
                Err(err) if err.retryable() && attempt < attempts => {
                    tokio::time::sleep(self.parts.retry.backoff(attempt)).await;
                }
                other => return other,
            }
        }
    }

    /// One attempt: the stages after Preparation, up to the first output
    /// event (so a failure before any byte reaches the client can retry).
    /// The outcome feeds the chosen workers' circuit breakers: success once
    /// the first event arrives, failure on a worker's fault before or during
    /// the stream.
    async fn attempt(
        &self,
        pipeline: &RequestPipeline,
        request: &PreparedRequest,
        attempt: u32,
        deadline: Instant,
    ) -> Result<OutputStream> {
        let engine_request_id = format!("{}-{attempt}", request.request_id);
        let selection = select_workers(
            self.parts.mode,
            request,
            &self.parts.workers,
            &self.parts.policies,
        )?;
        let chosen: Vec<Arc<Worker>> = std::iter::once(&selection.primary)
            .chain(&selection.prefill)
            .chain(&selection.encoders)
            .map(|guard| Arc::clone(guard.worker()))
            .collect();
        let outcome = self
            .attempt_on(pipeline, request, selection, engine_request_id, deadline)
            .await;
        match outcome {
            Ok(output) => {
                for worker in &chosen {
                    worker.record_outcome(true);
                }
                Ok(Box::pin(output.inspect(move |event| {
                    if let Err(err) = event {
                        record_failure(&chosen, err);
                    }
                })))
            }
            Err(err) => {
                record_failure(&chosen, &err);
                Err(err)
            }
        }
    }

    /// The attempt's stages after WorkerSelection.
    async fn attempt_on(
        &self,
        pipeline: &RequestPipeline,
        request: &PreparedRequest,
        selection: Selection,
        engine_request_id: String,
        deadline: Instant,
    ) -> Result<OutputStream> {
        let mode = self.parts.mode;
        let clients = acquire_clients(&selection);
        let media = media_for_attempt(request)?;
        let encodes = if pipeline.has_stage(StageKind::Encode) {
            plan_encodes(&media, &selection, &clients, &engine_request_id)?
        } else {
            EncodeDispatch::default()
        };
        let plan = build_plan(
            mode,
            request,
            media,
            selection,
            clients,
            encodes,
            engine_request_id,
        )?;
        let legs_started = Instant::now();
        let events = execute(plan).await?;
        if mode != Mode::Regular {
            metrics::record_pd_legs_start(mode.metrics_label(), legs_started.elapsed());
        }
        let options = ResponseOptions {
            tokenizer: self.parts.tokenizer.clone(),
            n: request.sampling.n,
            skip_special_tokens: request.sampling.skip_special_tokens,
            stop_strings: request.stop_strings.clone(),
            no_stop_trim: request.sampling.no_stop_trim,
            deadline,
        };
        let mut output = process(events, options);
        // Wait for the first event: an error here is still retryable.
        match output.next().await {
            Some(Err(err)) => Err(err),
            Some(Ok(first)) => Ok(Box::pin(
                futures::stream::once(async { Ok(first) }).chain(output),
            )),
            None => Err(Error::new(
                ErrorCode::StreamInterrupted,
                "the response ended before it began",
            )),
        }
    }
}

/// Whether a failure is the worker's fault (and so counts against its
/// circuit breaker). Rejections of invalid requests and overload answers do
/// not: the worker is up and talking.
fn worker_fault(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::WorkerUnavailable
            | ErrorCode::WorkerError
            | ErrorCode::WorkerTimeout
            | ErrorCode::EncodeFailed
            | ErrorCode::StreamInterrupted
    )
}

/// Charges a worker fault to the workers its message names (worker errors
/// carry the worker's URL), or to every chosen worker when it names none.
fn record_failure(chosen: &[Arc<Worker>], err: &Error) {
    if !worker_fault(err.code) {
        return;
    }
    let named: Vec<&Arc<Worker>> = chosen
        .iter()
        .filter(|w| err.message.contains(w.url()))
        .collect();
    if named.is_empty() {
        chosen.iter().for_each(|w| w.record_outcome(false));
    } else {
        named.into_iter().for_each(|w| w.record_outcome(false));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retry() -> RetryConfig {
        RetryConfig {
            max_retries: 3,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(300),
            multiplier: 2.0,
            jitter_factor: 0.0,
            disabled: false,
        }
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let config = retry();
        assert_eq!(config.backoff(1), Duration::from_millis(100));
        assert_eq!(config.backoff(2), Duration::from_millis(200));
        assert_eq!(config.backoff(3), Duration::from_millis(300));
        assert_eq!(config.backoff(9), Duration::from_millis(300));
    }

    #[test]
    fn jitter_stays_within_its_factor() {
        let config = RetryConfig {
            jitter_factor: 0.5,
            ..retry()
        };
        for _ in 0..100 {
            let pause = config.backoff(1).as_secs_f64();
            assert!((0.05..=0.15).contains(&pause), "{pause}");
        }
    }

    #[test]
    fn disabled_retries_mean_one_attempt() {
        assert_eq!(
            RetryConfig {
                disabled: true,
                ..retry()
            }
            .attempts(),
            1
        );
        assert_eq!(retry().attempts(), 4);
    }
}
