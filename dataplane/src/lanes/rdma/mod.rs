//! The RDMA lane: tensors a worker fetches itself with a one-sided READ from
//! one registered arena of the gateway's memory, named by a descriptor in
//! `RemoteTensorHandle { transport, descriptor, nbytes }`.
//!
//! Registering memory with a NIC is slow and pins it, so the lane registers
//! one arena once and cuts it into fixed-size slots ([`RdmaConfig`]). The
//! data-plane kernel writes a tensor once, straight into a slot
//! ([`RdmaArena::reserve`], [`RdmaWriter::buffer`]); publishing it
//! ([`RdmaWriter::publish`]) yields the descriptor and a guard,
//! [`RdmaTensor`], that the request keeps until the RPC carrying the
//! descriptor has returned (workers read before they answer). Dropping the
//! guard takes the slot back exactly once. A publication also has a
//! deadline: a reaper ([`RdmaArena::spawn_reaper`], and `reserve` itself when
//! the arena is full) takes back slots whose RPC outlived it.
//!
//! Each slot carries a generation stamp in the shared memory; taking a slot
//! back bumps it, so a reader holding an old descriptor (a late or retried
//! read) detects that the bytes are no longer its tensor: it reads the stamp,
//! copies, and reads the stamp again (see `arena.rs`). Nothing on the write
//! path locks or blocks: slots are claimed and released with one
//! compare-and-swap each.
//!
//! Two backends provide the memory ([`RemoteMemory`]):
//!
//! - **loopback** (`loopback.rs`, always built, what the tests run): the
//!   arena is a pre-faulted `/dev/shm` file; [`LoopbackReader`] is the
//!   worker's side (the simulated worker uses it), doing the READ as a copy
//!   out of a read-only mapping, with the arena's random key checked as an
//!   rkey would be.
//! - **verbs** (`verbs.rs`, cargo feature `rdma-verbs`, the `sideway`
//!   crate): the first RDMA device, one protection domain, one memory region
//!   over an anonymous arena registered for remote READ; its descriptor
//!   carries the remote address, rkey, GID, LID and port. It compiles; it has
//!   never run against a NIC (the README says exactly what has run).
//!
//! Without a device, [`RdmaArena::open`] answers [`RdmaUnavailable`] with a
//! stable reason; the caller sends tensors inline, logs it once
//! ([`RdmaUnavailable::log_fallback`]) and counts
//! `smg_tensor_lane_fallbacks_total{requested="rdma",reason}`.

mod arena;
pub mod descriptor;
mod lane;
pub mod loopback;
#[cfg(feature = "rdma-verbs")]
mod verbs;

use std::fmt;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::{Arc, mpsc};
use std::time::Duration;

pub use arena::RdmaOccupancy;
use arena::{ArenaLayout, SlotArena};
pub use descriptor::{Descriptor, DescriptorError, Endpoint};
pub use lane::RdmaLane;
pub use loopback::{LOOPBACK_TRANSPORT, LoopbackReader, RemoteReadError};

use crate::lanes::shm::ShmError;

/// The `RemoteTensorHandle.transport` of verbs descriptors.
pub const VERBS_TRANSPORT: &str = "rdma";

/// Gauge: slots being written or published.
pub const SLOTS_IN_USE_METRIC: &str = "smg_rdma_slots_in_use";
/// Gauge: slots in the arena (not a counter, so no `_total`).
pub const SLOTS_METRIC: &str = "smg_rdma_slots";
/// Where the kernel lists RDMA devices.
const INFINIBAND_CLASS: &str = "/sys/class/infiniband";

/// Memory a backend registered for remote reads.
///
/// # Safety
///
/// `base()` must point to `size()` bytes, page-aligned, mapped readable and
/// writable for as long as the value lives, and used by nobody but the
/// [`RdmaArena`] that owns it (and remote readers).
pub unsafe trait RemoteMemory: Send + Sync + fmt::Debug {
    /// The `RemoteTensorHandle.transport` of this backend's descriptors.
    fn transport(&self) -> &'static str;
    fn base(&self) -> NonNull<u8>;
    fn size(&self) -> usize;
    /// The key a descriptor must carry (the arena key, or the rkey).
    fn key(&self) -> u64;
    /// How a reader addresses byte `offset` of the arena: the offset itself
    /// (loopback) or a virtual address (verbs).
    fn reader_address(&self, offset: u64) -> u64;
    fn endpoint(&self) -> Endpoint;
}

/// Which backend to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdmaBackend {
    /// The first RDMA device (feature `rdma-verbs`).
    Verbs,
    /// A `/dev/shm` arena read by workers on this host.
    Loopback,
}

/// How an arena is laid out.
#[derive(Debug, Clone)]
pub struct RdmaConfig {
    /// The largest tensor a slot takes.
    pub slot_bytes: usize,
    pub slots: usize,
    /// Where the loopback arena file goes (`/dev/shm`).
    pub loopback_dir: PathBuf,
}

impl Default for RdmaConfig {
    /// 16 slots of 32 MiB: a 1080p image's bf16 pixels (~25 MB) fit a slot.
    fn default() -> Self {
        Self {
            slot_bytes: 32 << 20,
            slots: 16,
            loopback_dir: PathBuf::from(smg_shared::shm::SHM_DIR),
        }
    }
}

/// Why the lane cannot take a tensor; the caller sends it inline.
#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    #[error("a tensor of {nbytes} bytes exceeds the RDMA slot size of {slot_bytes} bytes")]
    TooLarge { nbytes: usize, slot_bytes: usize },
    #[error("all {slots} RDMA slots are in use")]
    ArenaFull { slots: usize },
    #[error("an arena of {slots} slots of {slot_bytes} bytes does not fit the address space")]
    BadLayout { slots: usize, slot_bytes: usize },
    #[error("the arena needs {needed} bytes, its directory has {available} free")]
    NoSpace { needed: usize, available: u64 },
    #[error("RDMA arena I/O failed while {action}: {source}")]
    Io {
        action: &'static str,
        source: std::io::Error,
    },
}

impl RdmaError {
    /// A stable snake_case name for metrics and logs.
    pub fn code(&self) -> &'static str {
        match self {
            Self::TooLarge { .. } => "rdma_tensor_too_large",
            Self::ArenaFull { .. } => "rdma_arena_full",
            Self::BadLayout { .. } => "rdma_bad_layout",
            Self::NoSpace { .. } => "rdma_no_space",
            Self::Io { .. } => "rdma_io_error",
        }
    }
}

impl From<ShmError> for RdmaError {
    fn from(err: ShmError) -> Self {
        match err {
            ShmError::NoSpace { needed, available } => Self::NoSpace { needed, available },
            ShmError::Io { action, source } => Self::Io { action, source },
            ShmError::SlotLost { source } => Self::Io {
                action: "using a shm file",
                source,
            },
        }
    }
}

/// Why `--multimodal-tensor-transport rdma` cannot be served here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaUnavailable {
    reason: &'static str,
    detail: String,
}

impl RdmaUnavailable {
    fn new(reason: &'static str, detail: impl Into<String>) -> Self {
        Self {
            reason,
            detail: detail.into(),
        }
    }

    /// The `reason` label: `no_device`, `built_without_verbs`,
    /// `device_error` or `arena_error`.
    pub fn reason(&self) -> &'static str {
        self.reason
    }

    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// The one log line that says tensors go inline instead.
    pub fn log_fallback(&self) {
        tracing::warn!(
            reason = self.reason,
            detail = %self.detail,
            "--multimodal-tensor-transport rdma is unavailable here; tensors go inline"
        );
    }
}

impl fmt::Display for RdmaUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RDMA unavailable ({}): {}", self.reason, self.detail)
    }
}

impl std::error::Error for RdmaUnavailable {}

/// The name of the first RDMA device the kernel lists, or why there is
/// none usable by this build.
pub fn detect_device() -> Result<String, RdmaUnavailable> {
    let first = std::fs::read_dir(INFINIBAND_CLASS)
        .ok()
        .and_then(|entries| {
            let mut names: Vec<String> = entries
                .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
                .collect();
            names.sort();
            names.into_iter().next()
        });
    let Some(device) = first else {
        return Err(RdmaUnavailable::new(
            "no_device",
            format!("{INFINIBAND_CLASS} lists no RDMA device"),
        ));
    };
    if cfg!(feature = "rdma-verbs") {
        Ok(device)
    } else {
        Err(RdmaUnavailable::new(
            "built_without_verbs",
            format!("found RDMA device {device}, but smg was built without the rdma-verbs feature"),
        ))
    }
}

/// The RDMA lane's arena. Cloning shares it.
#[derive(Debug, Clone)]
pub struct RdmaArena {
    inner: Arc<SlotArena>,
}

impl RdmaArena {
    /// Opens `backend`; for verbs, `Err` when there is no usable device (the
    /// caller falls back to inline).
    pub fn open(backend: RdmaBackend, config: &RdmaConfig) -> Result<Self, RdmaUnavailable> {
        match backend {
            RdmaBackend::Loopback => Self::loopback(config)
                .map_err(|err| RdmaUnavailable::new("arena_error", err.to_string())),
            RdmaBackend::Verbs => Self::verbs(config),
        }
    }

    /// A loopback arena in `config.loopback_dir`.
    pub fn loopback(config: &RdmaConfig) -> Result<Self, RdmaError> {
        let layout = layout(config)?;
        let memory = loopback::LoopbackMemory::create(&config.loopback_dir, layout.total_len)?;
        Ok(Self::with_memory(Box::new(memory), layout))
    }

    #[cfg(feature = "rdma-verbs")]
    fn verbs(config: &RdmaConfig) -> Result<Self, RdmaUnavailable> {
        let device = detect_device()?;
        let layout =
            layout(config).map_err(|err| RdmaUnavailable::new("arena_error", err.to_string()))?;
        let memory = verbs::VerbsMemory::open(&device, layout.total_len)?;
        Ok(Self::with_memory(Box::new(memory), layout))
    }

    #[cfg(not(feature = "rdma-verbs"))]
    fn verbs(_config: &RdmaConfig) -> Result<Self, RdmaUnavailable> {
        Err(detect_device().err().unwrap_or_else(|| {
            RdmaUnavailable::new("built_without_verbs", "smg was built without rdma-verbs")
        }))
    }

    fn with_memory(memory: Box<dyn RemoteMemory>, layout: ArenaLayout) -> Self {
        Self {
            inner: Arc::new(SlotArena::new(memory, layout)),
        }
    }

    /// The `RemoteTensorHandle.transport` of this arena's descriptors.
    pub fn transport(&self) -> &'static str {
        self.inner.memory().transport()
    }

    /// The largest tensor a slot takes.
    pub fn slot_bytes(&self) -> usize {
        self.inner.layout().slot_bytes
    }

    /// A slot to write one tensor of `nbytes` into. Never blocks: a tensor
    /// larger than a slot, or a full arena, is an error (send it inline).
    pub fn reserve(&self, nbytes: usize) -> Result<RdmaWriter, RdmaError> {
        let layout = self.inner.layout();
        if nbytes > layout.slot_bytes {
            return Err(RdmaError::TooLarge {
                nbytes,
                slot_bytes: layout.slot_bytes,
            });
        }
        let (index, generation) = self.inner.claim().ok_or(RdmaError::ArenaFull {
            slots: layout.slots,
        })?;
        Ok(RdmaWriter {
            arena: Arc::clone(&self.inner),
            index,
            generation,
            nbytes,
            published: false,
        })
    }

    /// Slots in use and in all (for `smg_rdma_slots_*`).
    pub fn occupancy(&self) -> RdmaOccupancy {
        self.inner.occupancy()
    }

    /// Takes back every publication past its deadline; returns how many.
    pub fn reap_expired(&self) -> usize {
        self.inner.reap_expired()
    }

    /// Runs [`reap_expired`](Self::reap_expired) every `interval` on a
    /// thread of its own until the returned handle drops.
    pub fn spawn_reaper(&self, interval: Duration) -> std::io::Result<Reaper> {
        let arena = Arc::downgrade(&self.inner);
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("smg-rdma-reaper".to_owned())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                    let Some(arena) = arena.upgrade() else { return };
                    arena.reap_expired();
                }
            })?;
        Ok(Reaper {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

fn layout(config: &RdmaConfig) -> Result<ArenaLayout, RdmaError> {
    ArenaLayout::new(config.slots, config.slot_bytes).ok_or(RdmaError::BadLayout {
        slots: config.slots,
        slot_bytes: config.slot_bytes,
    })
}

/// The reaper thread; stopped and joined on drop.
#[derive(Debug)]
pub struct Reaper {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Reaper {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Exclusive use of one slot until the tensor is published. Dropping it
/// unpublished gives the slot back.
#[derive(Debug)]
pub struct RdmaWriter {
    arena: Arc<SlotArena>,
    index: usize,
    generation: u64,
    nbytes: usize,
    published: bool,
}

impl RdmaWriter {
    /// The tensor's `nbytes` bytes, to be written once.
    pub fn buffer(&mut self) -> &mut [u8] {
        // SAFETY: the slot holds at least `nbytes` (checked in `reserve`),
        // and this writer holds it in WRITING state until it is published or
        // dropped, both of which need `self` by value: the slice, borrowed
        // from `&mut self`, is the only reference into the slot meanwhile.
        unsafe { std::slice::from_raw_parts_mut(self.arena.slot_ptr(self.index), self.nbytes) }
    }

    /// Publishes the written tensor. The guard must live until the RPC
    /// carrying its descriptor has returned; after `deadline` the reaper
    /// may take the slot back even if it has not.
    pub fn publish(mut self, deadline: Duration) -> RdmaTensor {
        self.published = true;
        let arena = Arc::clone(&self.arena);
        arena.publish(self.index, self.generation, deadline);
        let memory = arena.memory();
        let layout = arena.layout();
        let descriptor = Descriptor {
            generation: self.generation,
            data: memory.reader_address(layout.slot_offset(self.index) as u64),
            len: self.nbytes as u64,
            stamp: memory.reader_address(layout.stamp_offset(self.index) as u64),
            key: memory.key(),
            endpoint: memory.endpoint(),
        };
        RdmaTensor {
            descriptor: descriptor.encode(),
            transport: memory.transport(),
            nbytes: self.nbytes as u64,
            index: self.index,
            generation: self.generation,
            arena,
        }
    }
}

impl Drop for RdmaWriter {
    fn drop(&mut self) {
        if !self.published {
            self.arena.abandon(self.index, self.generation);
        }
    }
}

/// A published tensor: what goes in the `RemoteTensorHandle`, and the
/// guard that takes the slot back (exactly once) when dropped.
#[derive(Debug)]
pub struct RdmaTensor {
    arena: Arc<SlotArena>,
    descriptor: Vec<u8>,
    transport: &'static str,
    nbytes: u64,
    index: usize,
    generation: u64,
}

impl RdmaTensor {
    /// `RemoteTensorHandle.transport`.
    pub fn transport(&self) -> &'static str {
        self.transport
    }

    /// `RemoteTensorHandle.descriptor`.
    pub fn descriptor(&self) -> &[u8] {
        &self.descriptor
    }

    /// `RemoteTensorHandle.nbytes`.
    pub fn nbytes(&self) -> u64 {
        self.nbytes
    }

    /// The slot generation the descriptor names.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

impl Drop for RdmaTensor {
    fn drop(&mut self) {
        self.arena.release(self.index, self.generation);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::time::Instant;

    const SLOT: usize = 64 * 1024;

    fn arena(slots: usize) -> RdmaArena {
        RdmaArena::loopback(&RdmaConfig {
            slot_bytes: SLOT,
            slots,
            loopback_dir: PathBuf::from(smg_shared::shm::SHM_DIR),
        })
        .unwrap()
    }

    fn reader() -> LoopbackReader {
        LoopbackReader::new(smg_shared::shm::SHM_DIR)
    }

    fn publish(arena: &RdmaArena, bytes: &[u8], deadline: Duration) -> RdmaTensor {
        let mut writer = arena.reserve(bytes.len()).unwrap();
        writer.buffer().copy_from_slice(bytes);
        writer.publish(deadline)
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    const LONG: Duration = Duration::from_secs(600);

    fn arena_file(tensor: &RdmaTensor) -> PathBuf {
        let Ok(Descriptor {
            endpoint:
                Endpoint::Loopback {
                    owner_instance,
                    arena_name,
                },
            ..
        }) = Descriptor::decode(tensor.descriptor())
        else {
            panic!("a loopback descriptor")
        };
        Path::new(smg_shared::shm::SHM_DIR)
            .join(loopback::arena_file_name(&owner_instance, &arena_name))
    }

    #[test]
    fn a_published_tensor_reads_back_exactly() {
        let arena = arena(2);
        assert_eq!(arena.transport(), "loopback");
        let bytes = pattern(SLOT - 3, 7);
        let tensor = publish(&arena, &bytes, LONG);
        assert_eq!(tensor.transport(), LOOPBACK_TRANSPORT);
        assert_eq!(tensor.nbytes(), bytes.len() as u64);
        let read = reader().read(tensor.descriptor(), tensor.nbytes()).unwrap();
        assert_eq!(read, bytes);
        let empty = publish(&arena, &[], LONG);
        assert_eq!(
            reader().read(empty.descriptor(), 0).unwrap(),
            Vec::<u8>::new()
        );
    }

    #[test]
    fn dropping_the_guard_frees_the_slot_and_stales_its_descriptor() {
        let arena = arena(1);
        let reader = reader();
        let first = publish(&arena, &pattern(100, 1), LONG);
        let stale = first.descriptor().to_vec();
        assert_eq!(arena.occupancy().slots_in_use, 1);
        drop(first);
        assert_eq!(arena.occupancy().slots_in_use, 0);
        let err = reader.read(&stale, 100).unwrap_err();
        assert_eq!(err.code(), "rdma_stale_descriptor", "{err}");

        // The slot is reused under a new generation; the old descriptor
        // stays stale, the new one reads the new bytes.
        let second = publish(&arena, &pattern(100, 2), LONG);
        let old = Descriptor::decode(&stale).unwrap();
        assert!(second.generation() > old.generation);
        assert_eq!(
            reader.read(&stale, 100).unwrap_err().code(),
            "rdma_stale_descriptor"
        );
        assert_eq!(
            reader.read(second.descriptor(), 100).unwrap(),
            pattern(100, 2)
        );
    }

    #[test]
    fn a_full_arena_refuses_clearly_and_leaks_nothing() {
        let arena = arena(2);
        let a = arena.reserve(10).unwrap();
        let b = publish(&arena, &[1; 10], LONG);
        let err = arena.reserve(10).unwrap_err();
        assert_eq!(err.code(), "rdma_arena_full");
        assert!(err.to_string().contains("all 2 RDMA slots"), "{err}");
        assert_eq!(
            arena.occupancy(),
            RdmaOccupancy {
                slots_total: 2,
                slots_in_use: 2,
                reaped_total: 0
            }
        );
        drop(a); // unpublished: the slot simply returns
        let c = arena.reserve(10).unwrap();
        drop(c);
        drop(b);
        assert_eq!(arena.occupancy().slots_in_use, 0);
        // Every slot can be taken again.
        let all: Vec<_> = (0..2).map(|_| arena.reserve(1).unwrap()).collect();
        assert_eq!(all.len(), 2);
    }

    #[test]
    fn a_tensor_larger_than_a_slot_is_refused() {
        let arena = arena(1);
        let err = arena.reserve(SLOT + 1).unwrap_err();
        assert_eq!(err.code(), "rdma_tensor_too_large");
        assert!(err.to_string().contains(&SLOT.to_string()), "{err}");
        assert!(arena.reserve(SLOT).is_ok());
        assert_eq!(arena.occupancy().slots_in_use, 0);
    }

    #[test]
    fn the_reaper_takes_back_overdue_slots_once() {
        let arena = arena(1);
        let reader = reader();
        let overdue = publish(&arena, &pattern(64, 3), Duration::ZERO);
        let descriptor = overdue.descriptor().to_vec();
        assert_eq!(arena.reap_expired(), 1);
        assert_eq!(arena.reap_expired(), 0, "already reaped");
        let occupancy = arena.occupancy();
        assert_eq!((occupancy.slots_in_use, occupancy.reaped_total), (0, 1));
        assert_eq!(
            reader.read(&descriptor, 64).unwrap_err().code(),
            "rdma_stale_descriptor"
        );
        // The slot goes to a new tensor; the overdue guard's late drop must
        // not free it.
        let current = publish(&arena, &pattern(64, 4), LONG);
        drop(overdue);
        assert_eq!(arena.occupancy().slots_in_use, 1);
        assert_eq!(
            reader.read(current.descriptor(), 64).unwrap(),
            pattern(64, 4)
        );
        drop(current);
        assert_eq!(arena.occupancy().slots_in_use, 0);
    }

    #[test]
    fn a_full_arena_reaps_before_refusing() {
        let arena = arena(1);
        let _overdue = publish(&arena, &[0; 8], Duration::ZERO);
        let fresh = arena.reserve(8);
        assert!(fresh.is_ok(), "the overdue slot is reclaimed on demand");
        assert_eq!(arena.occupancy().reaped_total, 1);
        let _held = fresh.unwrap().publish(LONG);
        assert_eq!(arena.reserve(8).unwrap_err().code(), "rdma_arena_full");
    }

    #[test]
    fn the_reaper_thread_runs_until_its_handle_drops() {
        let arena = arena(2);
        let reaper = arena.spawn_reaper(Duration::from_millis(5)).unwrap();
        let _overdue = publish(&arena, &[0; 8], Duration::from_millis(20));
        let started = Instant::now();
        while arena.occupancy().slots_in_use != 0 {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the reaper never took the slot back"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(arena.occupancy().reaped_total, 1);
        drop(reaper); // joins the thread
        let _late = publish(&arena, &[0; 8], Duration::ZERO);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(arena.occupancy().slots_in_use, 1, "no reaper any more");
    }

    #[test]
    fn the_reader_checks_key_bounds_and_size() {
        let arena = arena(2);
        let reader = reader();
        let tensor = publish(&arena, &pattern(32, 5), LONG);
        let good = tensor.descriptor().to_vec();

        let mut bad_key = good.clone();
        bad_key[40] ^= 0xff;
        assert_eq!(
            reader.read(&bad_key, 32).unwrap_err().code(),
            "rdma_bad_key"
        );

        let mut off_slot = good.clone();
        off_slot[16] = off_slot[16].wrapping_add(8); // data not at a slot start
        assert_eq!(
            reader.read(&off_slot, 32).unwrap_err().code(),
            "rdma_out_of_bounds"
        );

        let mut too_long = Descriptor::decode(&good).unwrap();
        too_long.len = SLOT as u64 + 1;
        assert_eq!(
            reader
                .read(&too_long.encode(), SLOT as u64 + 1)
                .unwrap_err()
                .code(),
            "rdma_out_of_bounds"
        );

        assert_eq!(
            reader.read(&good, 31).unwrap_err().code(),
            "rdma_size_mismatch"
        );
        assert_eq!(
            reader.read(&good[..20], 32).unwrap_err().code(),
            "rdma_descriptor_malformed"
        );
        let mut other_arena = Descriptor::decode(&good).unwrap();
        other_arena.endpoint = Endpoint::Loopback {
            owner_instance: crate::lanes::shm::instance_id(),
            arena_name: [0; 16],
        };
        assert_eq!(
            reader.read(&other_arena.encode(), 32).unwrap_err().code(),
            "rdma_arena_not_found"
        );
        let mut verbs = Descriptor::decode(&good).unwrap();
        verbs.endpoint = Endpoint::Verbs {
            gid: [0; 16],
            lid: 0,
            port: 1,
        };
        assert_eq!(
            reader.read(&verbs.encode(), 32).unwrap_err().code(),
            "rdma_wrong_backend"
        );
        assert_eq!(reader.read(&good, 32).unwrap(), pattern(32, 5));
    }

    #[test]
    fn the_arena_file_is_private_named_for_the_sweep_and_removed_on_drop() {
        use std::os::unix::fs::PermissionsExt;
        let arena = arena(1);
        let tensor = publish(&arena, &[1, 2, 3], LONG);
        let path = arena_file(&tensor);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        assert!(
            name.starts_with(&format!("{}-", crate::lanes::shm::instance_stem())),
            "{name}"
        );
        // A reader that mapped the arena notices when its name is gone.
        let reader = reader();
        assert!(reader.read(tensor.descriptor(), 3).is_ok());
        let descriptor = tensor.descriptor().to_vec();
        drop(tensor);
        drop(arena);
        assert!(!path.exists(), "the arena file is removed with the arena");
        assert_eq!(
            reader.read(&descriptor, 3).unwrap_err().code(),
            "rdma_arena_not_found"
        );
    }

    #[test]
    fn the_orphan_sweep_removes_a_dead_gateways_arena_and_spares_a_live_one() {
        use crate::lanes::shm::{OWNER_SUFFIX, boot_tag, instance_stem, instance_stem_of};
        let dir = tempfile::tempdir().unwrap();
        let arena = RdmaArena::loopback(&RdmaConfig {
            slot_bytes: 4096,
            slots: 1,
            loopback_dir: dir.path().to_path_buf(),
        })
        .unwrap();
        let names = |dir: &Path| {
            let mut names = std::fs::read_dir(dir)
                .unwrap()
                .map(|entry| entry.unwrap().file_name().into_string().unwrap())
                .collect::<Vec<_>>();
            names.sort();
            names
        };
        let live = names(dir.path());
        let own = instance_stem();
        assert_eq!(live.len(), 2, "the arena and the owner file: {live:?}");
        assert!(live[0].starts_with(&format!("{own}-")), "{live:?}");
        assert_eq!(live[1], format!("{own}{OWNER_SUFFIX}"));
        // What a gateway killed with -9 leaves: an arena name and an owner
        // file nobody holds locked.
        let dead = instance_stem_of(boot_tag(), b"dead-gateway");
        let dead_arena = format!("{dead}-{}", "ab".repeat(16));
        std::fs::hard_link(dir.path().join(&live[0]), dir.path().join(&dead_arena)).unwrap();
        std::fs::write(dir.path().join(format!("{dead}{OWNER_SUFFIX}")), b"").unwrap();
        let summary = crate::lanes::shm::sweep_orphans(dir.path()).unwrap();
        assert_eq!((summary.removed, summary.kept, summary.errors), (2, 2, 0));
        assert_eq!(names(dir.path()), live);
        drop(arena);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn reads_racing_slot_reuse_never_return_the_wrong_bytes() {
        // One slot republished over and over while a reader holds older
        // descriptors: every read either returns exactly the bytes of the
        // publication it names or reports it stale.
        let arena = arena(1);
        let len = 16 * 1024;
        let (sender, receiver) = mpsc::sync_channel::<(Vec<u8>, u8)>(4);
        let writer_arena = arena.clone();
        let writer = std::thread::spawn(move || {
            for round in 0..400u32 {
                let seed = (round % 251) as u8;
                let tensor = publish(&writer_arena, &pattern(len, seed), LONG);
                let _ = sender.try_send((tensor.descriptor().to_vec(), seed));
                drop(tensor);
            }
        });
        let reader = reader();
        let (mut exact, mut stale) = (0, 0);
        for (descriptor, seed) in receiver {
            match reader.read(&descriptor, len as u64) {
                Ok(bytes) => {
                    assert!(bytes == pattern(len, seed), "torn read accepted");
                    exact += 1;
                }
                Err(err) => {
                    assert_eq!(err.code(), "rdma_stale_descriptor");
                    stale += 1;
                }
            }
        }
        writer.join().unwrap();
        assert!(exact + stale > 0);
    }

    #[test]
    fn without_a_device_rdma_is_unavailable_with_a_reason() {
        let listed = std::fs::read_dir(INFINIBAND_CLASS).is_ok_and(|mut dir| dir.next().is_some());
        let result = RdmaArena::open(RdmaBackend::Verbs, &RdmaConfig::default());
        if listed {
            // A machine with a device: only the build can refuse.
            if let Err(err) = result {
                assert_ne!(err.reason(), "no_device", "{err}");
            }
        } else {
            let err = result.unwrap_err();
            assert_eq!(err.reason(), "no_device");
            assert!(err.to_string().contains(INFINIBAND_CLASS), "{err}");
            assert_eq!(detect_device().unwrap_err().reason(), "no_device");
        }
    }
}
