//! What the lanes are configured from: the default transport, per-worker
//! overrides and the shm / RDMA pool shapes. `cli` builds it; nothing here
//! knows a flag.

use std::path::PathBuf;
use std::time::Duration;

use smg_dataplane::lanes::rdma::RdmaBackend;

use crate::workers::{LaneMode, WorkerLaneOverride};

/// Everything the lanes are configured from.
#[derive(Debug, Clone)]
pub struct LaneSettings {
    pub mode: LaneMode,
    pub min_bytes: usize,
    pub overrides: Vec<(String, WorkerLaneOverride)>,
    pub shm_dir: PathBuf,
    pub shm_slot_bytes: usize,
    pub shm_slots_per_core: usize,
    pub shm_reclaim_after: Duration,
    pub shm_keep_free_bytes: u64,
    pub rdma_backend: RdmaBackend,
    pub rdma_slots: usize,
    pub rdma_slot_bytes: usize,
    /// How long a published RDMA slot waits for its RPC before the reaper
    /// takes it back.
    pub rdma_deadline: Duration,
}

impl LaneSettings {
    pub(super) fn wants_shm(&self) -> bool {
        self.mode.uses_shm() || self.overrides.iter().any(|(_, o)| o.mode.uses_shm())
    }

    pub(super) fn wants_rdma(&self) -> bool {
        self.mode == LaneMode::Rdma || self.overrides.iter().any(|(_, o)| o.mode == LaneMode::Rdma)
    }
}
