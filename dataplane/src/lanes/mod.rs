//! Lanes: how a finished tensor travels from a data-plane core to a worker.
//!
//! The kernel writes each tensor once, into a buffer the lane chosen for it
//! hands out on the core that runs the job ([`TensorLane::reserve`]); sealing
//! the buffer ([`LaneBuffer::seal`]) yields what goes on the wire (inline
//! bytes, a `/dev/shm` name, or an RDMA descriptor) and a [`TensorLease`]
//! that the request keeps until the RPC carrying the tensor has returned.
//! Dropping the last clone of the lease frees the lane's resources, exactly
//! once, however the request ended.
//!
//! - [`InlineLane`]: a heap buffer of exactly the planned size that becomes
//!   the gRPC message's `Bytes` without another copy.
//! - [`ShmLane`]: one pre-faulted [`shm::ShmPool`] per data-plane core.
//! - An RDMA arena plugs in as a third implementor of the same two traits.
//!
//! A lane that cannot take a tensor (no slot, no room in `/dev/shm`) never
//! fails the request: the core writes it inline and the sealed tensor says
//! why ([`SealedTensor::fallback`]), so the control plane can count it. The
//! same holds when sealing fails after the write (a shm slot whose file
//! someone removed): the written bytes are copied inline ([`Unsealed`]),
//! and the shm lane rebuilds the pool that lost it
//! ([`ShmLane::rebuild_lost`]). And when a shm tensor is lost after it was
//! published, while a worker was to read it, its lease says so
//! ([`TensorLease::lost`]: the failed call was the lane's fault, so the
//! request may retry) and the retry carries its bytes inline when the
//! gateway still holds them ([`TensorLease::renew`],
//! [`TensorLease::take_fallback`]).

pub mod rdma;
pub mod shm;

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use bytes::Bytes;

use self::shm::{ShmError, ShmPool, ShmPoolConfig, ShmTensor};

/// Which lane carried a tensor (metric label `lane`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LaneKind {
    Inline,
    Shm,
    Rdma,
}

impl LaneKind {
    pub const fn name(self) -> &'static str {
        match self {
            LaneKind::Inline => "inline",
            LaneKind::Shm => "shm",
            LaneKind::Rdma => "rdma",
        }
    }
}

/// What a tensor looks like on the wire, engine-neutral.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WirePayload {
    /// The bytes themselves, in the gRPC message.
    Inline(Bytes),
    /// A single name in the worker's `/dev/shm` (offset 0).
    Shm { name: String, nbytes: u64 },
    /// Memory the worker fetches itself (RDMA).
    Remote {
        transport: String,
        descriptor: Bytes,
        nbytes: u64,
    },
}

/// Why a lane could not take a tensor.
#[derive(Debug, thiserror::Error)]
pub enum LaneError {
    #[error(transparent)]
    Shm(#[from] ShmError),
    #[error(transparent)]
    Rdma(#[from] rdma::RdmaError),
    #[error("{0}")]
    Other(String),
}

impl LaneError {
    /// A stable snake_case reason for metrics and logs.
    pub fn code(&self) -> &'static str {
        match self {
            LaneError::Shm(err) => err.code(),
            LaneError::Rdma(err) => err.code(),
            LaneError::Other(_) => "lane_error",
        }
    }
}

/// A lane as the data plane sees it. Implementors are shared by every core
/// (`Arc<dyn TensorLane>` in a job's destination) and keep a share of their
/// resources per core, so reserving touches no other core's state.
pub trait TensorLane: Send + Sync + fmt::Debug {
    fn kind(&self) -> LaneKind;

    /// A writable buffer of exactly `nbytes` from core `core`'s share.
    fn reserve(&self, core: usize, nbytes: usize) -> Result<Box<dyn LaneBuffer>, LaneError>;
}

/// A buffer the kernel writes one tensor into, then seals.
pub trait LaneBuffer: Send {
    fn bytes_mut(&mut self) -> &mut [u8];

    /// Publishes the written tensor. Dropping an unsealed buffer returns its
    /// resources. On failure the buffer comes back with its bytes intact.
    fn seal(self: Box<Self>) -> Result<SealedTensor, Unsealed>;
}

/// A buffer the lane could not publish, with its bytes still readable.
pub struct Unsealed {
    pub error: LaneError,
    pub buffer: Box<dyn LaneBuffer>,
}

impl fmt::Debug for Unsealed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Unsealed")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

/// Held by a request for as long as an RPC may read a tensor. Lanes whose
/// handles a worker consumes (a shm name it unlinks) renew them before
/// another attempt carries the tensor.
pub trait LeaseResource: Send + Sync + fmt::Debug {
    /// The payload for the next RPC when it differs from the last one.
    fn renew(&self) -> Result<Option<WirePayload>, LaneError> {
        Ok(None)
    }

    /// Whether someone else took the resource the last RPC named from under
    /// it (a shm file removed or truncated before the worker read it): the
    /// call failed because of the lane, not the worker or the request.
    fn lost(&self) -> bool {
        false
    }

    /// Once, after a [`renew`](Self::renew) moved the tensor inline: why.
    fn take_fallback(&self) -> Option<Fallback> {
        None
    }
}

/// Shared ownership of a sealed tensor's lane resources: the last clone to
/// drop frees them.
#[derive(Debug, Clone)]
pub struct TensorLease(Arc<dyn LeaseResource>);

impl TensorLease {
    pub fn new(resource: impl LeaseResource + 'static) -> Self {
        Self(Arc::new(resource))
    }

    /// See [`LeaseResource::renew`].
    pub fn renew(&self) -> Result<Option<WirePayload>, LaneError> {
        self.0.renew()
    }

    /// See [`LeaseResource::lost`].
    pub fn lost(&self) -> bool {
        self.0.lost()
    }

    /// See [`LeaseResource::take_fallback`].
    pub fn take_fallback(&self) -> Option<Fallback> {
        self.0.take_fallback()
    }
}

/// A tensor on its lane: what to put on the wire, and the lease to hold.
#[derive(Debug)]
pub struct SealedTensor {
    pub lane: LaneKind,
    pub payload: WirePayload,
    /// `None` for inline bytes (they own themselves).
    pub lease: Option<TensorLease>,
    /// The lane that was asked for and why it was not used (the tensor then
    /// went inline).
    pub fallback: Option<Fallback>,
}

/// A tensor that went inline although another lane was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fallback {
    pub requested: LaneKind,
    pub reason: &'static str,
}

/// The lane of a job's destination and the size below which tensors go
/// inline anyway (a small tensor is cheaper in the message than as a file).
#[derive(Debug, Clone)]
pub struct LaneChoice {
    pub lane: Arc<dyn TensorLane>,
    pub min_bytes: usize,
}

/// The inline lane: a heap buffer that becomes `Bytes` without a copy.
#[derive(Debug, Default, Clone, Copy)]
pub struct InlineLane;

impl TensorLane for InlineLane {
    fn kind(&self) -> LaneKind {
        LaneKind::Inline
    }

    fn reserve(&self, _core: usize, nbytes: usize) -> Result<Box<dyn LaneBuffer>, LaneError> {
        Ok(Box::new(InlineBuffer(vec![0u8; nbytes])))
    }
}

struct InlineBuffer(Vec<u8>);

impl LaneBuffer for InlineBuffer {
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }

    fn seal(self: Box<Self>) -> Result<SealedTensor, Unsealed> {
        Ok(SealedTensor {
            lane: LaneKind::Inline,
            payload: WirePayload::Inline(Bytes::from(self.0)),
            lease: None,
            fallback: None,
        })
    }
}

/// Why [`write_through`] produced no tensor.
#[derive(Debug)]
pub enum WriteError<E> {
    /// The kernel failed.
    Write(E),
}

/// Writes a tensor of `nbytes` through `choice` on core `core`: small
/// tensors and tensors the lane cannot take or publish go inline (the
/// latter marked as a fallback). `write` fills the buffer once.
pub fn write_through<E>(
    choice: Option<&LaneChoice>,
    core: usize,
    nbytes: usize,
    write: impl FnOnce(&mut [u8]) -> Result<(), E>,
) -> Result<SealedTensor, WriteError<E>> {
    let reserved = match choice {
        Some(choice) if nbytes >= choice.min_bytes && choice.lane.kind() != LaneKind::Inline => {
            choice.lane.reserve(core, nbytes).map_err(|err| Fallback {
                requested: choice.lane.kind(),
                reason: err.code(),
            })
        }
        _ => Err(Fallback {
            requested: LaneKind::Inline,
            reason: "",
        }),
    };
    match reserved {
        Ok(mut buffer) => {
            write(buffer.bytes_mut()).map_err(WriteError::Write)?;
            match buffer.seal() {
                Ok(sealed) => Ok(sealed),
                Err(Unsealed { error, mut buffer }) => {
                    // Written but not published: the bytes go inline.
                    let data = Bytes::copy_from_slice(buffer.bytes_mut());
                    drop(buffer);
                    Ok(SealedTensor {
                        lane: LaneKind::Inline,
                        payload: WirePayload::Inline(data),
                        lease: None,
                        fallback: choice.map(|choice| Fallback {
                            requested: choice.lane.kind(),
                            reason: error.code(),
                        }),
                    })
                }
            }
        }
        Err(fallback) => {
            let mut data = vec![0u8; nbytes];
            write(&mut data).map_err(WriteError::Write)?;
            Ok(SealedTensor {
                lane: LaneKind::Inline,
                payload: WirePayload::Inline(Bytes::from(data)),
                lease: None,
                fallback: (fallback.requested != LaneKind::Inline).then_some(fallback),
            })
        }
    }
}

/// How the shm lane is laid out on each core.
#[derive(Debug, Clone)]
pub struct ShmLaneConfig {
    pub dir: PathBuf,
    pub slot_bytes: usize,
    pub slots_per_core: usize,
    pub reclaim_after: Duration,
    pub keep_free_bytes: u64,
}

/// The `/dev/shm` lane: one pool of pre-faulted slots per data-plane core.
/// A pool that lost a slot's file is replaced by [`ShmLane::rebuild_lost`]
/// (the old one lives on until its last tensor's RPC returned).
#[derive(Debug)]
pub struct ShmLane {
    pools: Vec<RwLock<ShmPool>>,
    config: ShmLaneConfig,
}

/// Slot occupancy summed over the cores' pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ShmOccupancy {
    pub slots_total: usize,
    pub slots_in_use: usize,
    pub one_off_files: usize,
}

impl ShmLane {
    /// Creates one pool per core (memory reserved and touched now).
    pub fn create(config: &ShmLaneConfig, cores: usize) -> Result<Self, ShmError> {
        let pools = (0..cores.max(1))
            .map(|_| ShmPool::create(pool_config(config)).map(RwLock::new))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            pools,
            config: config.clone(),
        })
    }

    pub fn dir(&self) -> &std::path::Path {
        &self.config.dir
    }

    /// Core `core`'s pool as it is now.
    fn pool(&self, core: usize) -> ShmPool {
        self.pools[core % self.pools.len()]
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replaces every pool that found it lost a slot's file (a publish that
    /// failed with [`ShmError::SlotLost`]; see [`ShmPool::marked_lost`])
    /// with a fresh one; returns how many were replaced. Only an atomic load
    /// per pool when nothing was lost, so it can run on every reclaim tick. Creates and touches memory: call it off the async threads.
    /// Fails when a fresh pool cannot be made (the lost one stays, and its
    /// tensors keep going inline until a later call succeeds).
    pub fn rebuild_lost(&self) -> Result<usize, ShmError> {
        let mut rebuilt = 0;
        for pool in &self.pools {
            let lost = pool
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .marked_lost();
            if !lost {
                continue;
            }
            let fresh = ShmPool::create(pool_config(&self.config))?;
            *pool.write().unwrap_or_else(PoisonError::into_inner) = fresh;
            rebuilt += 1;
        }
        Ok(rebuilt)
    }

    /// Busy and total slots over every core (reclaiming what can be).
    pub fn occupancy(&self) -> ShmOccupancy {
        (0..self.pools.len()).map(|core| self.pool(core)).fold(
            ShmOccupancy::default(),
            |mut sum, pool| {
                let occupancy = pool.occupancy();
                sum.slots_total += pool.slots();
                sum.slots_in_use += occupancy.busy;
                sum.one_off_files += occupancy.one_off_files;
                sum
            },
        )
    }
}

impl TensorLane for ShmLane {
    fn kind(&self) -> LaneKind {
        LaneKind::Shm
    }

    fn reserve(&self, core: usize, nbytes: usize) -> Result<Box<dyn LaneBuffer>, LaneError> {
        Ok(Box::new(ShmBuffer(self.pool(core).acquire(nbytes)?)))
    }
}

fn pool_config(config: &ShmLaneConfig) -> ShmPoolConfig {
    ShmPoolConfig {
        dir: config.dir.clone(),
        slot_bytes: config.slot_bytes,
        slots: config.slots_per_core,
        reclaim_after: config.reclaim_after,
        keep_free_bytes: config.keep_free_bytes,
    }
}

struct ShmBuffer(shm::ShmWriter);

impl LaneBuffer for ShmBuffer {
    fn bytes_mut(&mut self) -> &mut [u8] {
        self.0.buffer()
    }

    fn seal(mut self: Box<Self>) -> Result<SealedTensor, Unsealed> {
        let tensor = match self.0.publish() {
            Ok(tensor) => tensor,
            Err(err) => {
                return Err(Unsealed {
                    error: err.into(),
                    buffer: self,
                });
            }
        };
        let payload = WirePayload::Shm {
            name: tensor.name().to_owned(),
            nbytes: tensor.nbytes(),
        };
        Ok(SealedTensor {
            lane: LaneKind::Shm,
            payload,
            lease: Some(TensorLease::new(ShmLease {
                name: Mutex::new(tensor.name().to_owned()),
                tensor,
                inline: OnceLock::new(),
                fallback: Mutex::new(None),
            })),
            fallback: None,
        })
    }
}

/// A published shm tensor held by a request.
#[derive(Debug)]
struct ShmLease {
    tensor: ShmTensor,
    /// The public name the last RPC carried.
    name: Mutex<String>,
    /// The bytes, once the tensor could not be named again (its file lost,
    /// or a one-off file's only name consumed): later RPCs carry them.
    inline: OnceLock<Bytes>,
    /// Why it went inline, until the caller took it to count it.
    fallback: Mutex<Option<Fallback>>,
}

impl LeaseResource for ShmLease {
    fn renew(&self) -> Result<Option<WirePayload>, LaneError> {
        if let Some(bytes) = self.inline.get() {
            return Ok(Some(WirePayload::Inline(bytes.clone())));
        }
        let name = match self.tensor.renew() {
            Ok(None) => return Ok(None),
            Ok(Some(name)) => name,
            Err(err) => {
                // The name cannot come back, but the gateway's open file may
                // still hold the bytes: send them inline (a truncated file
                // no longer does, and the request fails with the loss).
                let bytes = self.tensor.copy_out()?;
                let bytes = self.inline.get_or_init(|| Bytes::from(bytes)).clone();
                *self.fallback.lock().unwrap_or_else(PoisonError::into_inner) = Some(Fallback {
                    requested: LaneKind::Shm,
                    reason: err.code(),
                });
                return Ok(Some(WirePayload::Inline(bytes)));
            }
        };
        match self.name.lock() {
            Ok(mut current) => current.clone_from(&name),
            Err(poisoned) => poisoned.into_inner().clone_from(&name),
        }
        Ok(Some(WirePayload::Shm {
            name,
            nbytes: self.tensor.nbytes(),
        }))
    }

    fn lost(&self) -> bool {
        // Once inline, the last RPC carried bytes, not the lost name.
        self.inline.get().is_none() && self.tensor.lost()
    }

    fn take_fallback(&self) -> Option<Fallback> {
        self.fallback
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}
