//! One attempt of a request: the attempt-scoped stages of its pipeline, run
//! in the order [`RequestPipeline`] declares them.
//!
//! Why it exists: the stage list is the program, not a description of it.
//! [`run`] walks `pipeline.stages()` and runs each stage over one
//! [`AttemptState`]; a stage the list lacks (Encode outside EPD) never runs,
//! and the stages that ran are returned so tests pin what really executes.
//! Preparation is request-scoped and runs once before the first attempt;
//! every later stage runs again on a retry, so a retry picks workers, rooms
//! and engine request ids afresh.

use std::sync::Arc;
use std::time::SystemTime;

use tokio::time::Instant;

use futures::StreamExt;

use super::execution::{ExecutionPlan, execute};
use super::prepare::PreparedRequest;
use super::respond::{OutputStream, ResponseOptions, process};
use super::stages::{
    Clients, EncodeDispatch, RolePolicies, Selection, acquire_clients, build_plan,
    media_for_attempt, plan_encodes, select_workers,
};
use super::{RequestPipeline, StageKind};
use crate::engine::{EventStream, MediaItem};
use crate::error::{Error, ErrorCode, Result};
use crate::metrics;
use crate::mode::Mode;
use crate::shutdown::RequestTasks;
use crate::tokenizer::Tokenizer;
use crate::workers::{Worker, WorkerSet};

/// What every stage of an attempt may read.
#[derive(Debug)]
pub(crate) struct AttemptContext<'a> {
    pub mode: Mode,
    pub request: &'a PreparedRequest,
    pub workers: &'a WorkerSet,
    pub policies: &'a RolePolicies,
    pub tokenizer: &'a Tokenizer,
    /// Where leg supervisors and engine aborts run.
    pub tasks: &'a RequestTasks,
    /// The engine calls' id for this attempt: `<request id>-<attempt>`.
    pub engine_request_id: String,
    /// Workers selection passes over when another can take the request
    /// (their connections failed under an earlier attempt).
    pub avoid: Vec<Arc<str>>,
    /// When the whole request (all attempts) must be done.
    pub deadline: Instant,
}

/// What an attempt produced, and whom it used.
pub(crate) struct AttemptOutcome {
    /// The response, its first event already received (so a failure before
    /// any byte reached the client is still retryable).
    pub result: Result<OutputStream>,
    /// The workers WorkerSelection chose; empty when it failed.
    pub chosen: Vec<Arc<Worker>>,
    /// The stages that ran, in order, the failing one included.
    pub ran: Vec<StageKind>,
    /// The response's `created` time (Unix seconds), set by
    /// DispatchMetadata.
    pub created: u64,
}

impl std::fmt::Debug for AttemptOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttemptOutcome")
            .field("ok", &self.result.is_ok())
            .field("chosen", &self.chosen.len())
            .field("ran", &self.ran)
            .finish_non_exhaustive()
    }
}

/// What the stages of one attempt hand each other. Each slot is filled by
/// the stage that produces it and taken by the one that consumes it.
#[derive(Default)]
struct AttemptState {
    selection: Option<Selection>,
    clients: Option<Clients>,
    /// The request's media with lane handles renewed for this attempt.
    media: Option<Vec<MediaItem>>,
    encodes: EncodeDispatch,
    plan: Option<ExecutionPlan>,
    events: Option<EventStream>,
    output: Option<OutputStream>,
    created: u64,
}

impl AttemptState {
    /// The media of this attempt, renewed on first use (Encode or
    /// RequestBuilding, whichever runs first).
    fn media(&mut self, request: &PreparedRequest) -> Result<&[MediaItem]> {
        if self.media.is_none() {
            self.media = Some(media_for_attempt(request)?);
        }
        Ok(self.media.as_deref().unwrap_or_default())
    }
}

/// Takes what an earlier stage left in `slot`; an empty slot means the
/// pipeline lists `stage` before the stage that fills it.
fn earlier<T>(slot: &mut Option<T>, stage: StageKind, needs: &str) -> Result<T> {
    slot.take().ok_or_else(|| {
        Error::internal(format!(
            "pipeline stage {stage:?} runs before the stage that produces its {needs}"
        ))
    })
}

/// Runs the attempt-scoped stages of `pipeline`, in order, stopping at the
/// first that fails.
pub(crate) async fn run(pipeline: &RequestPipeline, cx: AttemptContext<'_>) -> AttemptOutcome {
    let mut state = AttemptState::default();
    let mut ran = Vec::with_capacity(pipeline.stages().len());
    let mut chosen = Vec::new();
    for &stage in pipeline.stages().iter().filter(|stage| stage.per_attempt()) {
        ran.push(stage);
        let step = run_stage(stage, &cx, &mut state).await;
        if stage == StageKind::WorkerSelection
            && let Some(selection) = &state.selection
        {
            chosen = selection.workers().cloned().collect();
        }
        if let Err(err) = step {
            return AttemptOutcome {
                result: Err(err),
                chosen,
                ran,
                created: state.created,
            };
        }
    }
    let result = state
        .output
        .take()
        .ok_or_else(|| Error::internal("the pipeline ended without a ResponseProcessing stage"));
    AttemptOutcome {
        result,
        chosen,
        ran,
        created: state.created,
    }
}

async fn run_stage(
    stage: StageKind,
    cx: &AttemptContext<'_>,
    state: &mut AttemptState,
) -> Result<()> {
    match stage {
        // Request-scoped: ran once before the first attempt.
        StageKind::Preparation => {}
        StageKind::WorkerSelection => {
            state.selection = Some(
                select_workers(cx.mode, cx.request, cx.workers, cx.policies, &cx.avoid).await?,
            );
        }
        StageKind::ClientAcquisition => {
            let selection = state
                .selection
                .as_ref()
                .ok_or_else(|| Error::internal("ClientAcquisition runs before WorkerSelection"))?;
            state.clients = Some(acquire_clients(selection));
        }
        StageKind::Encode => {
            let selection = earlier(&mut state.selection, stage, "workers")?;
            let clients = earlier(&mut state.clients, stage, "clients")?;
            let encodes = plan_encodes(state.media(cx.request)?, &selection, &clients);
            state.selection = Some(selection);
            state.clients = Some(clients);
            state.encodes = encodes?;
        }
        StageKind::RequestBuilding => {
            state.media(cx.request)?;
            let media = earlier(&mut state.media, stage, "media")?;
            state.plan = Some(build_plan(
                cx.mode,
                cx.request,
                media,
                earlier(&mut state.selection, stage, "workers")?,
                earlier(&mut state.clients, stage, "clients")?,
                std::mem::take(&mut state.encodes),
            )?);
        }
        StageKind::DispatchMetadata => {
            let plan = state
                .plan
                .as_mut()
                .ok_or_else(|| Error::internal("DispatchMetadata runs before RequestBuilding"))?;
            plan.stamp(&cx.engine_request_id);
            state.created = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |since| since.as_secs());
        }
        StageKind::RequestExecution => {
            let plan = earlier(&mut state.plan, stage, "execution plan")?;
            let legs_started = Instant::now();
            state.events = Some(execute(plan, cx.tasks).await?);
            if cx.mode != Mode::Regular {
                metrics::record_pd_legs_start(cx.mode.metrics_label(), legs_started.elapsed());
            }
        }
        StageKind::ResponseProcessing => {
            let events = earlier(&mut state.events, stage, "engine events")?;
            let request = cx.request;
            let options = ResponseOptions {
                tokenizer: cx.tokenizer.clone(),
                n: request.sampling.n,
                skip_special_tokens: request.sampling.skip_special_tokens,
                stop_strings: request.stop_strings.clone(),
                no_stop_trim: request.sampling.no_stop_trim,
                deadline: cx.deadline,
                parsing: request.parsing.clone(),
                stop_token_ids: request
                    .sampling
                    .stop_token_ids
                    .iter()
                    .chain(cx.tokenizer.eos_token_ids())
                    .copied()
                    .collect(),
            };
            let mut output = process(events, options);
            // Wait for the first event: an error here is still retryable.
            state.output = Some(match output.next().await {
                Some(Err(err)) => return Err(err),
                Some(Ok(first)) => {
                    Box::pin(futures::stream::once(async { Ok(first) }).chain(output))
                }
                None => {
                    return Err(Error::new(
                        ErrorCode::StreamInterrupted,
                        "the response ended before it began",
                    ));
                }
            });
        }
    }
    Ok(())
}
