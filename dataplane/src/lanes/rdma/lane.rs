//! The RDMA arena as one of the data plane's tensor lanes: the kernel
//! writes straight into a reserved slot, sealing publishes it, and the
//! request holds the published slot as its lease until the RPCs that carry
//! the descriptor have returned.
//!
//! The arena is shared by every core (claiming a slot is one
//! compare-and-swap), so the core index plays no part here.

use std::time::Duration;

use bytes::Bytes;

use super::{RdmaArena, RdmaTensor, RdmaWriter, Reaper};
use crate::lanes::{
    LaneBuffer, LaneError, LaneKind, LeaseResource, SealedTensor, TensorLane, TensorLease,
    Unsealed, WirePayload,
};

/// An open arena, its reaper, and how long a published slot may wait for
/// its RPC before the reaper takes it back.
#[derive(Debug)]
pub struct RdmaLane {
    arena: RdmaArena,
    deadline: Duration,
    _reaper: Reaper,
}

impl RdmaLane {
    /// Serves `arena`; slots published longer than `deadline` ago are
    /// reaped (checked every `deadline / 4`, at least every 10 ms).
    pub fn new(arena: RdmaArena, deadline: Duration) -> std::io::Result<Self> {
        let reaper = arena.spawn_reaper((deadline / 4).max(Duration::from_millis(10)))?;
        Ok(Self {
            arena,
            deadline,
            _reaper: reaper,
        })
    }

    pub fn arena(&self) -> &RdmaArena {
        &self.arena
    }
}

impl TensorLane for RdmaLane {
    fn kind(&self) -> LaneKind {
        LaneKind::Rdma
    }

    fn reserve(&self, _core: usize, nbytes: usize) -> Result<Box<dyn LaneBuffer>, LaneError> {
        Ok(Box::new(RdmaBuffer {
            writer: self.arena.reserve(nbytes)?,
            deadline: self.deadline,
        }))
    }
}

struct RdmaBuffer {
    writer: RdmaWriter,
    deadline: Duration,
}

impl LaneBuffer for RdmaBuffer {
    fn bytes_mut(&mut self) -> &mut [u8] {
        self.writer.buffer()
    }

    fn seal(self: Box<Self>) -> Result<SealedTensor, Unsealed> {
        let tensor = self.writer.publish(self.deadline);
        Ok(SealedTensor {
            lane: LaneKind::Rdma,
            payload: WirePayload::Remote {
                transport: tensor.transport().to_owned(),
                descriptor: Bytes::copy_from_slice(tensor.descriptor()),
                nbytes: tensor.nbytes(),
            },
            lease: Some(TensorLease::new(RdmaLease { _published: tensor })),
            fallback: None,
        })
    }
}

/// A published slot held by a request. A retry carries the same descriptor:
/// reading does not consume it, and the slot stays put while this lives.
#[derive(Debug)]
struct RdmaLease {
    /// Dropping it frees the slot (once; the reaper may have beaten it).
    _published: RdmaTensor,
}

impl LeaseResource for RdmaLease {}
