//! The loopback backend: the RDMA lane without a NIC, for tests and for
//! workers on the same host.
//!
//! The arena is a 0600 tmpfs file named like every other file the gateway
//! puts in `/dev/shm` (`smg-<boot id>-<instance>-<32 hex>`, under the
//! instance's owner-file lock, so the shm lane's start-up sweep removes the
//! arena of a gateway killed with `-9` and never a live one), mapped
//! once and pre-faulted. Its header carries a random 64-bit key that plays
//! the rkey's part: a descriptor must name it.
//!
//! [`LoopbackReader`] is the worker's side, emulating a one-sided RDMA READ:
//! it maps the arena read-only (once per arena, kept while the arena's name
//! exists), checks the key and the bounds, loads the slot's stamp, copies the
//! bytes, and loads the stamp again; a stamp other than the descriptor's
//! generation means the slot was taken back (or reused) and the copy is
//! thrown away.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::sync::{Arc, Mutex};

use memmap2::{MmapOptions, MmapRaw};

use super::arena::{ArenaLayout, HEADER_LEN};
use super::descriptor::{Descriptor, DescriptorError, Endpoint};
use super::{RdmaError, RemoteMemory};
use crate::lanes::shm::{
    Mapping, OwnerFile, boot_tag, create_named, free_bytes, hex, instance_id, instance_stem_of,
    owner_file, random_u128, unlink_at,
};

/// The `RemoteTensorHandle.transport` of loopback descriptors.
pub const LOOPBACK_TRANSPORT: &str = "loopback";

/// A mapped arena file in a tmpfs directory; removed on drop.
#[derive(Debug)]
pub(crate) struct LoopbackMemory {
    // The mapping goes before the file and the name.
    map: Mapping,
    _file: File,
    dir_fd: File,
    name: String,
    key: u64,
    owner_instance: [u8; 12],
    arena_name: [u8; 16],
    /// Held while the arena's name exists (dropped after it is removed).
    _owner: std::sync::Arc<OwnerFile>,
}

impl LoopbackMemory {
    pub(crate) fn create(dir: &Path, len: usize) -> Result<Self, RdmaError> {
        let io_error = |action| move |source| RdmaError::Io { action, source };
        let dir_fd = File::open(dir).map_err(io_error("opening the arena directory"))?;
        let available = free_bytes(&dir_fd)?;
        if len as u64 > available {
            return Err(RdmaError::NoSpace {
                needed: len,
                available,
            });
        }
        let owner = owner_file(&dir_fd)?;
        let owner_instance = instance_id();
        let stem = format!("{}-", instance_stem_of(boot_tag(), &owner_instance));
        let (file, name) = create_named(&dir_fd, &stem, len)?;
        let remove_on_error = |err: RdmaError| {
            let _ = unlink_at(&dir_fd, &name);
            err
        };
        let map = Mapping::new(&file, len)
            .map_err(io_error("mapping the arena"))
            .map_err(remove_on_error)?;
        let hex = &name[stem.len()..];
        let arena_name = parse_hex16(hex).ok_or_else(|| {
            remove_on_error(RdmaError::Io {
                action: "naming the arena",
                source: io::Error::other(format!("unexpected arena name {name}")),
            })
        })?;
        let (key, _) = random_u128()
            .map_err(RdmaError::from)
            .map_err(remove_on_error)?;
        Ok(Self {
            map,
            _file: file,
            dir_fd,
            name,
            key,
            owner_instance,
            arena_name,
            _owner: owner,
        })
    }
}

impl Drop for LoopbackMemory {
    fn drop(&mut self) {
        let _ = unlink_at(&self.dir_fd, &self.name);
    }
}

// SAFETY: `base()` and `size()` describe the writable shared mapping `map`,
// which lives exactly as long as `self`.
unsafe impl RemoteMemory for LoopbackMemory {
    fn transport(&self) -> &'static str {
        LOOPBACK_TRANSPORT
    }

    fn base(&self) -> NonNull<u8> {
        self.map.ptr()
    }

    fn size(&self) -> usize {
        self.map.len()
    }

    fn key(&self) -> u64 {
        self.key
    }

    fn reader_address(&self, offset: u64) -> u64 {
        offset
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::Loopback {
            owner_instance: self.owner_instance,
            arena_name: self.arena_name,
        }
    }
}

/// The arena file name a loopback endpoint designates on this host.
pub fn arena_file_name(owner_instance: &[u8; 12], arena_name: &[u8; 16]) -> String {
    format!(
        "{}-{}",
        instance_stem_of(boot_tag(), owner_instance),
        hex(arena_name)
    )
}

fn parse_hex16(hex: &str) -> Option<[u8; 16]> {
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (index, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * index..2 * index + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Why a remote read failed. Every variant is the sender's fault or a late
/// read, so a worker answers INVALID_ARGUMENT (except `Io`).
#[derive(Debug, thiserror::Error)]
pub enum RemoteReadError {
    #[error("malformed RDMA descriptor: {0}")]
    Malformed(#[from] DescriptorError),
    #[error("the handle says {handle} bytes, its descriptor {descriptor}")]
    SizeMismatch { handle: u64, descriptor: u64 },
    #[error("a {0} descriptor cannot be read over loopback")]
    WrongBackend(&'static str),
    #[error("no arena {name} in {dir}")]
    ArenaNotFound { name: String, dir: String },
    #[error("arena {name} is not a valid arena: {why}")]
    ArenaInvalid { name: String, why: String },
    #[error("the descriptor's key does not match arena {name}")]
    BadKey { name: String },
    #[error("the descriptor is out of the bounds of arena {name}")]
    OutOfBounds { name: String },
    #[error(
        "stale descriptor: slot generation is {found}, the descriptor says {expected} (the slot was released or reused)"
    )]
    Stale { expected: u64, found: u64 },
    #[error("reading arena {name} failed: {source}")]
    Io { name: String, source: io::Error },
}

impl RemoteReadError {
    /// A stable snake_case name for logs and status messages.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Malformed(_) => "rdma_descriptor_malformed",
            Self::SizeMismatch { .. } => "rdma_size_mismatch",
            Self::WrongBackend(_) => "rdma_wrong_backend",
            Self::ArenaNotFound { .. } => "rdma_arena_not_found",
            Self::ArenaInvalid { .. } => "rdma_arena_invalid",
            Self::BadKey { .. } => "rdma_bad_key",
            Self::OutOfBounds { .. } => "rdma_out_of_bounds",
            Self::Stale { .. } => "rdma_stale_descriptor",
            Self::Io { .. } => "rdma_io_error",
        }
    }
}

/// One arena file mapped read-only, kept across reads.
#[derive(Debug)]
struct ReadMapping {
    /// Read-only and shared: every access goes through raw reads that
    /// tolerate concurrent writers (checked by the stamps).
    map: MmapRaw,
    file: File,
    layout: ArenaLayout,
    key: u64,
}

impl ReadMapping {
    fn open(dir: &Path, name: &str) -> Result<Self, RemoteReadError> {
        let invalid = |why: &str| RemoteReadError::ArenaInvalid {
            name: name.to_owned(),
            why: why.to_owned(),
        };
        // O_CLOEXEC comes with std's open.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(dir.join(name))
            .map_err(|source| {
                if source.kind() == io::ErrorKind::NotFound {
                    RemoteReadError::ArenaNotFound {
                        name: name.to_owned(),
                        dir: dir.display().to_string(),
                    }
                } else {
                    RemoteReadError::Io {
                        name: name.to_owned(),
                        source,
                    }
                }
            })?;
        let meta = file.metadata().map_err(|source| RemoteReadError::Io {
            name: name.to_owned(),
            source,
        })?;
        if !meta.file_type().is_file() {
            return Err(invalid("not a regular file"));
        }
        let len = usize::try_from(meta.len()).map_err(|_| invalid("larger than memory"))?;
        if len < HEADER_LEN {
            return Err(invalid("shorter than an arena header"));
        }
        let map = MmapOptions::new()
            .len(len)
            .map_raw_read_only(&file)
            .map_err(|source| RemoteReadError::Io {
                name: name.to_owned(),
                source,
            })?;
        let mut header = [0u8; HEADER_LEN];
        // SAFETY: the mapping holds at least HEADER_LEN bytes; the header is
        // written once, before any descriptor naming the arena exists.
        unsafe { std::ptr::copy_nonoverlapping(map.as_ptr(), header.as_mut_ptr(), HEADER_LEN) };
        let (layout, key) =
            ArenaLayout::parse_header(&header).ok_or_else(|| invalid("bad arena header"))?;
        if layout.total_len > len {
            return Err(invalid("file shorter than its layout"));
        }
        Ok(Self {
            map,
            file,
            layout,
            key,
        })
    }

    /// Whether the arena's name is gone (its gateway released or lost it).
    fn unlinked(&self) -> bool {
        self.file.metadata().map_or(true, |meta| meta.nlink() == 0)
    }

    fn stamp(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: `offset` was checked to be one of the layout's stamp
        // offsets (8-aligned, inside the mapping); accessed atomically only.
        unsafe { &*self.map.as_ptr().add(offset).cast::<AtomicU64>() }
    }
}

/// Reads loopback descriptors, as a worker on the gateway's host would
/// perform a one-sided RDMA READ. Keeps one mapping per arena.
#[derive(Debug)]
pub struct LoopbackReader {
    dir: PathBuf,
    arenas: Mutex<HashMap<String, Arc<ReadMapping>>>,
}

/// Mappings kept at most; the cache is emptied when it would grow beyond.
const MAX_CACHED_ARENAS: usize = 16;

impl LoopbackReader {
    /// A reader of arenas in `dir` (`/dev/shm` in production).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            arenas: Mutex::new(HashMap::new()),
        }
    }

    /// Reads the tensor a `RemoteTensorHandle` names: its `descriptor` bytes
    /// and its `nbytes`.
    pub fn read(&self, descriptor: &[u8], nbytes: u64) -> Result<Vec<u8>, RemoteReadError> {
        let descriptor = Descriptor::decode(descriptor)?;
        if descriptor.len != nbytes {
            return Err(RemoteReadError::SizeMismatch {
                handle: nbytes,
                descriptor: descriptor.len,
            });
        }
        let len = usize::try_from(nbytes).map_err(|_| RemoteReadError::SizeMismatch {
            handle: nbytes,
            descriptor: descriptor.len,
        })?;
        let mut out = vec![0u8; len];
        self.read_into(&descriptor, &mut out)?;
        Ok(out)
    }

    /// Copies the tensor `descriptor` names into `out` (exactly its length).
    pub fn read_into(
        &self,
        descriptor: &Descriptor,
        out: &mut [u8],
    ) -> Result<(), RemoteReadError> {
        let Endpoint::Loopback {
            owner_instance,
            arena_name,
        } = descriptor.endpoint
        else {
            return Err(RemoteReadError::WrongBackend("verbs"));
        };
        let name = arena_file_name(&owner_instance, &arena_name);
        let arena = self.arena(&name)?;
        if arena.key != descriptor.key {
            return Err(RemoteReadError::BadKey { name });
        }
        let (stamp_offset, data_offset) = slot_offsets(&arena.layout, descriptor, out.len())
            .ok_or(RemoteReadError::OutOfBounds { name })?;
        let stamp = arena.stamp(stamp_offset);
        let check = |found: u64| {
            if found == descriptor.generation {
                Ok(())
            } else {
                Err(RemoteReadError::Stale {
                    expected: descriptor.generation,
                    found,
                })
            }
        };
        check(stamp.load(Ordering::Acquire))?;
        // SAFETY: `data_offset + out.len()` lies inside the mapping (checked
        // by `slot_offsets` against a layout no larger than the file). The
        // gateway may be writing these bytes if the slot was reused; any
        // byte value is a valid u8, and the stamp check below throws such a
        // copy away (seqlock read side).
        unsafe {
            std::ptr::copy_nonoverlapping(
                arena.map.as_ptr().add(data_offset),
                out.as_mut_ptr(),
                out.len(),
            );
        }
        fence(Ordering::Acquire);
        check(stamp.load(Ordering::Relaxed))
    }

    /// The cached mapping of arena `name`, (re)opened when missing or when
    /// its name was removed since.
    fn arena(&self, name: &str) -> Result<Arc<ReadMapping>, RemoteReadError> {
        let mut arenas = self
            .arenas
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(arena) = arenas.get(name) {
            if !arena.unlinked() {
                return Ok(Arc::clone(arena));
            }
            arenas.remove(name);
        }
        let arena = Arc::new(ReadMapping::open(&self.dir, name)?);
        if arenas.len() >= MAX_CACHED_ARENAS {
            arenas.clear();
        }
        arenas.insert(name.to_owned(), Arc::clone(&arena));
        Ok(arena)
    }
}

/// The stamp and data offsets of the slot a descriptor names, when it names
/// exactly one slot of `layout` and `len` bytes fit in it.
fn slot_offsets(
    layout: &ArenaLayout,
    descriptor: &Descriptor,
    len: usize,
) -> Option<(usize, usize)> {
    let data = usize::try_from(descriptor.data).ok()?;
    let index = data.checked_sub(layout.data_offset)? / layout.slot_stride;
    let well_formed = index < layout.slots
        && layout.slot_offset(index) == data
        && usize::try_from(descriptor.stamp).ok()? == layout.stamp_offset(index)
        && len <= layout.slot_bytes;
    well_formed.then(|| (layout.stamp_offset(index), data))
}
