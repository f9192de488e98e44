//! The verbs backend (cargo feature `rdma-verbs`): the arena is anonymous,
//! pre-faulted memory registered once with the first RDMA device for remote
//! READ, through the `sideway` crate (which loads rdma-core at run time).
//!
//! A descriptor names the slot by remote virtual address and the memory
//! region's rkey, plus the port's GID, LID and number a reader needs to
//! address this host. Not built here: the queue-pair exchange through which
//! a worker connects to read (e.g. an rdma_cm listener), and a completion
//! path. This code compiles in CI and has never run against a NIC.
//!
//! Registration pins the arena: it counts against `RLIMIT_MEMLOCK` (8 MiB
//! for unprivileged users by default); deployments need
//! `LimitMEMLOCK=infinity` or CAP_IPC_LOCK, else `open` fails with
//! `device_error` and the lane falls back to inline.

use std::ptr::NonNull;
use std::sync::Arc;

use memmap2::{MmapOptions, MmapRaw};
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::DeviceContext;
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;

use super::descriptor::Endpoint;
use super::{RdmaUnavailable, RemoteMemory, VERBS_TRANSPORT};

/// The port descriptors name (ports are numbered from 1).
const PORT: u8 = 1;
/// The GID table entry descriptors carry.
const GID_INDEX: u32 = 0;

/// Private anonymous memory (`MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE`),
/// pre-faulted; unmapped on drop.
#[derive(Debug)]
struct AnonymousRegion {
    _map: MmapRaw,
    ptr: NonNull<u8>,
    len: usize,
}

impl AnonymousRegion {
    fn new(len: usize) -> std::io::Result<Self> {
        let map = MmapRaw::from(MmapOptions::new().len(len).populate().map_anon()?);
        let ptr =
            NonNull::new(map.as_mut_ptr()).ok_or_else(|| std::io::Error::other("null mapping"))?;
        Ok(Self {
            _map: map,
            ptr,
            len,
        })
    }
}

/// The registered arena and the verbs objects that keep it registered.
/// Field order is drop order: the memory region is deregistered before the
/// protection domain and device close, and before the memory is unmapped.
#[derive(Debug)]
pub(crate) struct VerbsMemory {
    mr: Arc<MemoryRegion>,
    _pd: Arc<ProtectionDomain>,
    _context: Arc<DeviceContext>,
    region: AnonymousRegion,
    gid: [u8; 16],
    lid: u16,
}

// SAFETY: `region` is ours alone; the verbs objects are only kept alive
// (sideway marks them Send + Sync).
unsafe impl Send for VerbsMemory {}
// SAFETY: as above.
unsafe impl Sync for VerbsMemory {}

impl VerbsMemory {
    /// Opens `device` (the name `detect_device` found), allocates one
    /// protection domain and registers `len` bytes for remote READ.
    pub(crate) fn open(device: &str, len: usize) -> Result<Self, RdmaUnavailable> {
        let fail = |what: &str| {
            let what = what.to_owned();
            move |err: &dyn std::fmt::Display| {
                RdmaUnavailable::new("device_error", format!("{what}: {err}"))
            }
        };
        let devices = DeviceList::new().map_err(|err| fail("listing RDMA devices")(&err))?;
        let chosen = devices
            .iter()
            .find(|candidate| candidate.name() == device)
            .ok_or_else(|| {
                RdmaUnavailable::new(
                    "no_device",
                    format!("rdma-core does not list device {device}"),
                )
            })?;
        let context = chosen
            .open()
            .map_err(|err| fail("opening the device")(&err))?;
        let pd = context
            .alloc_pd()
            .map_err(|err| fail("allocating a protection domain")(&err))?;
        let region = AnonymousRegion::new(len).map_err(|err| fail("allocating the arena")(&err))?;
        // SAFETY: `region` is `len` mapped bytes that outlive `mr` (field
        // order in `VerbsMemory`).
        let mr = unsafe {
            pd.reg_mr(
                region.ptr.as_ptr() as usize,
                len,
                AccessFlags::LocalWrite | AccessFlags::RemoteRead,
            )
        }
        .map_err(|err| fail("registering the arena (check RLIMIT_MEMLOCK)")(&err))?;
        let port = context
            .query_port(PORT)
            .map_err(|err| fail("querying port 1")(&err))?;
        let gid = context
            .query_gid(PORT, GID_INDEX)
            .map_err(|err| fail("querying GID 0 of port 1")(&err))?;
        Ok(Self {
            mr,
            _pd: pd,
            _context: context,
            region,
            gid: gid.raw,
            lid: port.lid(),
        })
    }
}

// SAFETY: `base()`/`size()` describe `region`, mapped read-write for as long
// as `self` lives and used only by the owning arena.
unsafe impl RemoteMemory for VerbsMemory {
    fn transport(&self) -> &'static str {
        VERBS_TRANSPORT
    }

    fn base(&self) -> NonNull<u8> {
        self.region.ptr
    }

    fn size(&self) -> usize {
        self.region.len
    }

    fn key(&self) -> u64 {
        u64::from(self.mr.rkey())
    }

    fn reader_address(&self, offset: u64) -> u64 {
        self.region.ptr.as_ptr() as u64 + offset
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::Verbs {
            gid: self.gid,
            lid: self.lid,
            port: PORT,
        }
    }
}
