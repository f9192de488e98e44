//! How a worker takes image tensors, as far as the workers know it.
//!
//! Why it exists: the lanes (`crate::lanes`) decide per request which lane
//! a tensor takes, from each receiving worker's transport; a worker carries
//! the override its registration asked for, and its admin status shows what
//! the lanes make of it. These value types, and the [`LaneDirectory`] a
//! registry asks, live here so that `workers` never depends on `lanes`: the
//! lanes sit above the workers and are handed to them.

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::engine::Runtime;

/// A transport mode, as flags and registrations spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneMode {
    Inline,
    Shm,
    Auto,
    Rdma,
}

impl LaneMode {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "inline" => Some(LaneMode::Inline),
            "shm" => Some(LaneMode::Shm),
            "auto" => Some(LaneMode::Auto),
            "rdma" => Some(LaneMode::Rdma),
            _ => None,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            LaneMode::Inline => "inline",
            LaneMode::Shm => "shm",
            LaneMode::Auto => "auto",
            LaneMode::Rdma => "rdma",
        }
    }

    /// Whether the mode may put tensors in `/dev/shm`.
    pub fn uses_shm(self) -> bool {
        matches!(self, LaneMode::Shm | LaneMode::Auto)
    }
}

/// One worker's override of the mode and the inline threshold: from
/// `--worker-tensor-transport`, or from the worker's admin registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerLaneOverride {
    pub mode: LaneMode,
    pub min_bytes: Option<usize>,
}

/// Where a worker's transport comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportSource {
    /// Its admin registration's `tensor_transport`.
    Registration,
    /// A `--worker-tensor-transport` for its URL.
    Flag,
    /// `--multimodal-tensor-transport` / `--multimodal-shm-min-bytes`.
    Default,
    /// Its runtime takes tensors inline only (SGLang).
    Runtime,
}

impl TransportSource {
    pub const fn name(self) -> &'static str {
        match self {
            TransportSource::Registration => "registration",
            TransportSource::Flag => "flag",
            TransportSource::Default => "default",
            TransportSource::Runtime => "runtime",
        }
    }
}

/// The mode and threshold the lane decision applies to one worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerTransport {
    pub mode: LaneMode,
    pub min_bytes: usize,
    pub source: TransportSource,
}

/// Worker URLs compare without scheme and trailing slash.
pub fn normalize_url(url: &str) -> String {
    let bare = ["grpc://", "grpcs://", "http://", "https://"]
        .iter()
        .find_map(|scheme| url.strip_prefix(scheme))
        .unwrap_or(url);
    bare.trim_end_matches('/').to_owned()
}

/// What a worker registry needs of the gateway's tensor lanes.
pub trait LaneDirectory: Send + Sync + fmt::Debug {
    /// Makes the lane `mode` needs, if no earlier worker's mode did, before
    /// a worker asking for it can be picked.
    fn prepare(self: Arc<Self>, mode: LaneMode) -> BoxFuture<'static, ()>;

    /// The transport a `runtime` worker at `url`, registered with
    /// `registered`, gets.
    fn effective_transport(
        &self,
        runtime: Runtime,
        url: &str,
        registered: Option<WorkerLaneOverride>,
    ) -> WorkerTransport;
}
