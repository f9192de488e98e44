//! The request pipeline: one list of stages per (endpoint, mode).
//!
//! [`RequestPipeline::build`] composes the stages for each valid pair and
//! answers `None` where an endpoint does not exist in a mode (the router then
//! answers 501). The list is what runs: the router runs Preparation once,
//! then [`attempt::run`] executes the remaining stages in this order on each
//! attempt. Resources the stages hold (worker load guards, leg aborts, lane
//! leases) are released by `Drop` when the request ends, however it ends.

pub(crate) mod attempt;
pub(crate) mod execution;
pub(crate) mod media;
pub(crate) mod parsing;
pub(crate) mod prepare;
pub(crate) mod request_context;
pub(crate) mod respond;
pub mod spec;
pub(crate) mod stages;
pub(crate) mod tool_set;

use crate::engine::Runtime;
use crate::mode::Mode;

/// The public endpoints a router serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    ChatCompletions,
    Completions,
    /// SGLang-native `/generate`.
    Generate,
    /// Anthropic `/v1/messages`.
    Messages,
    /// OpenAI `/v1/responses` (its generations; storage is the handler's).
    Responses,
    Embeddings,
    Classify,
}

impl Endpoint {
    pub const ALL: [Endpoint; 7] = [
        Endpoint::ChatCompletions,
        Endpoint::Completions,
        Endpoint::Generate,
        Endpoint::Messages,
        Endpoint::Responses,
        Endpoint::Embeddings,
        Endpoint::Classify,
    ];

    /// The label used in metrics.
    pub const fn label(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "chat",
            Endpoint::Completions => "completions",
            Endpoint::Generate => "generate",
            Endpoint::Messages => "messages",
            Endpoint::Responses => "responses",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Classify => "classify",
        }
    }

    /// Whether the endpoint generates tokens (as opposed to embedding).
    pub const fn generates(self) -> bool {
        !matches!(self, Endpoint::Embeddings | Endpoint::Classify)
    }
}

/// The stages, in the order a pipeline runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StageKind {
    /// Validate, resolve the model, render the chat template, tokenize,
    /// plan media.
    Preparation,
    /// One worker, or prefill + decode, plus an encode worker per image.
    WorkerSelection,
    /// The gRPC client of each chosen worker.
    ClientAcquisition,
    /// EPD only: each image's tensor into its lane, a room per image.
    Encode,
    /// The engine requests: rendezvous info, metadata-only media for
    /// prefill and decode.
    RequestBuilding,
    /// The attempt's engine request id on every call, and the response's
    /// created time.
    DispatchMetadata,
    /// Send; PD legs in parallel; EPD encodes supervised.
    RequestExecution,
    /// SSE or JSON; incremental detokenization; stop strings.
    ResponseProcessing,
}

impl StageKind {
    /// Whether the stage runs on every attempt (a retry runs it again);
    /// only Preparation runs once per request.
    pub const fn per_attempt(self) -> bool {
        !matches!(self, StageKind::Preparation)
    }
}

/// What pipeline construction depends on besides endpoint and mode.
#[derive(Debug, Clone, Copy)]
pub struct PipelineDeps {
    /// The workers' protocol: only SGLang serves embeddings.
    pub runtime: Runtime,
}

/// The composed stage list of one (endpoint, mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestPipeline {
    endpoint: Endpoint,
    mode: Mode,
    stages: Vec<StageKind>,
}

impl RequestPipeline {
    /// The pipeline for `endpoint` in `mode`, or `None` when the endpoint
    /// does not exist there (answered with 501).
    pub fn build(endpoint: Endpoint, mode: Mode, deps: &PipelineDeps) -> Option<Self> {
        if !endpoint.generates() && (mode != Mode::Regular || deps.runtime != Runtime::Sglang) {
            return None;
        }
        let mut stages = vec![
            StageKind::Preparation,
            StageKind::WorkerSelection,
            StageKind::ClientAcquisition,
        ];
        if mode.spec().encodes_media && endpoint.generates() {
            stages.push(StageKind::Encode);
        }
        stages.extend([
            StageKind::RequestBuilding,
            StageKind::DispatchMetadata,
            StageKind::RequestExecution,
            StageKind::ResponseProcessing,
        ]);
        Some(Self {
            endpoint,
            mode,
            stages,
        })
    }

    pub fn endpoint(&self) -> Endpoint {
        self.endpoint
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn stages(&self) -> &[StageKind] {
        &self.stages
    }

    pub fn has_stage(&self, stage: StageKind) -> bool {
        self.stages.contains(&stage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use StageKind::*;

    const TEXT: &[StageKind] = &[
        Preparation,
        WorkerSelection,
        ClientAcquisition,
        RequestBuilding,
        DispatchMetadata,
        RequestExecution,
        ResponseProcessing,
    ];
    const WITH_ENCODE: &[StageKind] = &[
        Preparation,
        WorkerSelection,
        ClientAcquisition,
        Encode,
        RequestBuilding,
        DispatchMetadata,
        RequestExecution,
        ResponseProcessing,
    ];

    /// The hand-written golden: every (endpoint, mode) and its stage list,
    /// for SGLang workers (which serve embeddings) and TokenSpeed (which do
    /// not).
    #[test]
    fn golden_stage_lists() {
        use Endpoint::*;
        use Mode::*;
        type Stages = Option<&'static [StageKind]>;
        let golden: &[(Endpoint, Mode, Stages, Stages)] = &[
            // (endpoint, mode, with SGLang workers, with TokenSpeed workers)
            (ChatCompletions, Regular, Some(TEXT), Some(TEXT)),
            (ChatCompletions, PrefillDecode, Some(TEXT), Some(TEXT)),
            (
                ChatCompletions,
                EncodePrefillDecode,
                Some(WITH_ENCODE),
                Some(WITH_ENCODE),
            ),
            (Completions, Regular, Some(TEXT), Some(TEXT)),
            (Completions, PrefillDecode, Some(TEXT), Some(TEXT)),
            (
                Completions,
                EncodePrefillDecode,
                Some(WITH_ENCODE),
                Some(WITH_ENCODE),
            ),
            (Generate, Regular, Some(TEXT), Some(TEXT)),
            (Generate, PrefillDecode, Some(TEXT), Some(TEXT)),
            (
                Generate,
                EncodePrefillDecode,
                Some(WITH_ENCODE),
                Some(WITH_ENCODE),
            ),
            (Messages, Regular, Some(TEXT), Some(TEXT)),
            (Messages, PrefillDecode, Some(TEXT), Some(TEXT)),
            (
                Messages,
                EncodePrefillDecode,
                Some(WITH_ENCODE),
                Some(WITH_ENCODE),
            ),
            (Responses, Regular, Some(TEXT), Some(TEXT)),
            (Responses, PrefillDecode, Some(TEXT), Some(TEXT)),
            (
                Responses,
                EncodePrefillDecode,
                Some(WITH_ENCODE),
                Some(WITH_ENCODE),
            ),
            (Embeddings, Regular, Some(TEXT), None),
            (Embeddings, PrefillDecode, None, None),
            (Embeddings, EncodePrefillDecode, None, None),
            (Classify, Regular, Some(TEXT), None),
            (Classify, PrefillDecode, None, None),
            (Classify, EncodePrefillDecode, None, None),
        ];
        assert_eq!(
            golden.len(),
            Endpoint::ALL.len() * 3,
            "every pair is listed"
        );
        for &(endpoint, mode, sglang, tokenspeed) in golden {
            for (runtime, expected) in
                [(Runtime::Sglang, sglang), (Runtime::TokenSpeed, tokenspeed)]
            {
                let built = RequestPipeline::build(endpoint, mode, &PipelineDeps { runtime });
                assert_eq!(
                    built.as_ref().map(RequestPipeline::stages),
                    expected,
                    "{endpoint:?} in {mode:?} on {runtime:?}"
                );
            }
        }
    }
}
