//! The `/dev/shm` lane: tensors handed to a worker on the same host as a
//! named tmpfs file it opens, reads and unlinks.
//!
//! The first write into a fresh tmpfs file runs at a tenth of memory speed
//! (page faults and zeroing), so tensors are written into long-lived,
//! pre-faulted slots instead. Each slot is a tmpfs file (mode 0600) under a
//! private name, mapped once; a finished tensor gets a fresh, unguessable
//! public name with `link(2)`, which fails rather than replace an existing
//! name. The worker unlinks that name when it has read it, which drops the
//! slot's link count back to one. (An `O_TMPFILE` slot would need no private
//! name, but Linux lets such a file be linked only once.) A slot is written again only
//! when both hold: the RPC that carried it has returned (its [`ShmTensor`]
//! guard dropped) and its public name is gone. A name a dead worker left
//! behind is removed after `reclaim_after`.
//!
//! Tensors larger than a slot get a one-off file that is unlinked when the
//! guard drops.
//!
//! **Whose name is it.** Every name (private, public, one-off, the RDMA
//! loopback arena) is `smg-<boot id>-<instance>-<32 hex>`: the kernel's boot
//! id (32 hex digits) and an instance id of 96 random bits drawn once per
//! process ([`instance_id`]). A pid would not do: two gateways in different
//! PID namespaces sharing one `/dev/shm` can have the same pid (and start
//! time), and one's start-up sweep then deleted the other's live slots.
//!
//! **Proving an owner gone.** Before creating any name in a directory, a
//! process creates `smg-<boot id>-<instance>.owner` there and holds an
//! exclusive `flock` on it for as long as it has names in that directory
//! (the file says the owner's pid, for people; nothing reads it). The kernel
//! drops the lock when the process dies, however it dies, whatever its
//! namespace. [`sweep_orphans`] (run at every gateway's start-up) removes
//! the names of an instance only when that proves it gone: its boot id is
//! not this boot's, or `flock(LOCK_EX|LOCK_NB)` on its owner file succeeds
//! (and the file is still the one at that name). A busy lock means alive;
//! names with no owner file or in another format are left alone, since
//! nothing proves their owner dead. An entry that fails is counted and the
//! sweep goes on. A pool that drops removes its own names, and the last one
//! in a directory removes the owner file (still locked while it does).
//!
//! **Losing slots anyway.** If someone else unlinks a slot's private name
//! (an operator, an old gateway's sweep), the slot cannot be published
//! again: `link(2)` fails with `ENOENT` ([`ShmError::SlotLost`]). The pool
//! marks itself lost, the tensor already written goes inline instead (see
//! `lanes::write_through`), and [`super::ShmLane::rebuild_lost`] (the
//! control plane's reclaim tick) replaces the pool with a fresh one. Loss is
//! noticed by the publish that hits it, not by polling every slot's name
//! ([`ShmPool::is_lost`] does that for whoever wants to ask).
//!
//! **Losing a slot under a running RPC.** A slot's names can also go (or
//! its file be truncated) after the tensor was published and before the
//! worker read it. Then the worker fails the call, and [`ShmTensor::lost`]
//! tells the gateway its lane, not the worker or the client, was at fault;
//! the bytes are still in the gateway's open file unless it was truncated
//! ([`ShmTensor::copy_out`] reads them with `pread`, never through the
//! mapping, so a truncated file is a short read, not a `SIGBUS`), so the
//! request can retry them inline. A slot found removed or truncated is
//! never written again (writing a mapping past a truncated file's end
//! would kill the process with `SIGBUS`): claiming a slot and freeing a
//! returned one both check that its private name still leads to its file
//! at full size, and mark the pool lost when not.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use memmap2::{MmapOptions, MmapRaw};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, FallocateFlags, Flock, FlockArg, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::UnlinkatFlags;

/// Every public name this lane creates starts with this.
pub const NAME_PREFIX: &str = "smg-";
/// The owner file of an instance is its stem followed by this.
pub const OWNER_SUFFIX: &str = ".owner";
/// Hex digits of the boot id, the instance id and a name's random part.
const BOOT_HEX: usize = 32;
const INSTANCE_HEX: usize = 24;
const RANDOM_HEX: usize = 32;
/// Where the kernel publishes the boot id.
const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// How a pool is laid out.
#[derive(Debug, Clone)]
pub struct ShmPoolConfig {
    /// The tmpfs directory (`/dev/shm`; a test directory in tests).
    pub dir: PathBuf,
    /// Bytes per slot: the largest tensor a slot takes.
    pub slot_bytes: usize,
    /// Slots in the pool.
    pub slots: usize,
    /// How long after its RPC returned a name may linger before the pool
    /// removes it itself (a worker that died before unlinking).
    pub reclaim_after: Duration,
    /// Bytes of the filesystem a one-off file must leave free (other tenants
    /// of a small `/dev/shm` need room too); the tensor goes inline instead.
    pub keep_free_bytes: u64,
}

/// Why the lane cannot take a tensor; the caller falls back to inline.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    #[error("/dev/shm has {available} bytes free, the tensor needs {needed}")]
    NoSpace { needed: usize, available: u64 },
    #[error("shm I/O failed while {action}: {source}")]
    Io {
        action: &'static str,
        source: io::Error,
    },
    /// A slot's file was removed by someone else: the pool must be rebuilt.
    #[error("a shm slot's file was removed by someone else ({source}); the pool is being rebuilt")]
    SlotLost { source: io::Error },
}

impl ShmError {
    fn io(action: &'static str) -> impl FnOnce(io::Error) -> Self {
        move |source| Self::Io { action, source }
    }

    /// A stable name for metrics and logs.
    pub fn code(&self) -> &'static str {
        match self {
            ShmError::NoSpace { .. } => "shm_no_space",
            ShmError::Io { .. } => "shm_io_error",
            ShmError::SlotLost { .. } => "shm_slot_lost",
        }
    }
}

const FREE: u8 = 0;
/// Handed to a writer, not yet published.
const WRITING: u8 = 1;
/// Published; its RPC has not returned.
const IN_FLIGHT: u8 = 2;
/// Its RPC returned; waiting for the worker to unlink the name.
const RETURNED: u8 = 3;

/// One long-lived slot: a privately named tmpfs file and its mapping.
#[derive(Debug)]
struct Slot {
    file: File,
    private_name: String,
    /// The file's inode: the private name must still lead to it.
    ino: u64,
    map: Mapping,
    state: AtomicU8,
    /// The random part of the slot's current public name.
    name_hi: AtomicU64,
    name_lo: AtomicU64,
    /// Nanoseconds since the pool's epoch when the RPC returned.
    returned_at: AtomicU64,
}

/// A shared, writable mapping of a whole file (`MAP_SHARED |
/// MAP_POPULATE`), pre-faulted for writing; unmapped on drop. Only raw
/// pointers come out of it: the slot state machine gives exactly one writer
/// access at a time (WRITING), and nobody in this process reads it.
#[derive(Debug)]
pub(crate) struct Mapping {
    raw: MmapRaw,
    ptr: NonNull<u8>,
}

// SAFETY: `ptr` is `raw`'s base address, which is Send and Sync: it is plain
// shared memory that lives as long as the mapping; every access to the
// bytes goes through the owners' own exclusivity rules.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` hands out only the address.
unsafe impl Sync for Mapping {}

impl Mapping {
    pub(crate) fn new(file: &File, len: usize) -> io::Result<Self> {
        let raw = MmapOptions::new().len(len).populate().map_raw(file)?;
        let ptr = NonNull::new(raw.as_mut_ptr()).ok_or_else(|| io::Error::other("null mapping"))?;
        let mapping = Self { raw, ptr };
        // Touch every page once so tensor writes never fault (MAP_POPULATE
        // maps the pages, but a shared mapping still faults on the first
        // write to each).
        let page = 4096;
        for offset in (0..len).step_by(page) {
            // SAFETY: offset < len, inside the writable mapping, which no
            // one else uses yet.
            unsafe { mapping.ptr.as_ptr().add(offset).write_volatile(0) };
        }
        Ok(mapping)
    }

    /// The first mapped byte.
    pub(crate) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Mapped bytes.
    pub(crate) fn len(&self) -> usize {
        self.raw.len()
    }
}

#[derive(Debug)]
struct PoolInner {
    config: ShmPoolConfig,
    dir_fd: File,
    /// `smg-<boot id>-<instance>-` for every name this process creates.
    name_stem: String,
    slots: Vec<Slot>,
    epoch: Instant,
    /// Where the next free-slot search starts (spreads reuse).
    cursor: AtomicUsize,
    one_off_files: AtomicUsize,
    /// Someone else removed a slot's file: nothing is published any more.
    lost: AtomicBool,
    /// Held while any name of this pool may exist (dropped last).
    _owner: Arc<OwnerFile>,
}

/// A pool of pre-faulted shm slots. Cloning shares the pool.
#[derive(Debug, Clone)]
pub struct ShmPool {
    inner: Arc<PoolInner>,
}

/// How the pool's slots are used right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Occupancy {
    pub free: usize,
    pub busy: usize,
    pub one_off_files: usize,
}

impl ShmPool {
    /// Creates `config.slots` slots of `config.slot_bytes`, reserving and
    /// touching their memory now. Fails when the directory lacks the room.
    pub fn create(config: ShmPoolConfig) -> Result<Self, ShmError> {
        let dir_fd = File::open(&config.dir).map_err(ShmError::io("opening the shm directory"))?;
        let needed = config.slot_bytes.saturating_mul(config.slots);
        let available = free_bytes(&dir_fd)?;
        if needed as u64 > available {
            return Err(ShmError::NoSpace { needed, available });
        }
        let owner = owner_file(&dir_fd)?;
        let name_stem = format!("{}-", instance_stem());
        let mut slots = Vec::with_capacity(config.slots);
        let mut pending = PrivateNames {
            dir: &dir_fd,
            names: Vec::new(),
        };
        for _ in 0..config.slots {
            let (file, private_name) = create_named(&dir_fd, &name_stem, config.slot_bytes)?;
            pending.names.push(private_name.clone());
            let map =
                Mapping::new(&file, config.slot_bytes).map_err(ShmError::io("mapping a slot"))?;
            let ino = file
                .metadata()
                .map_err(ShmError::io("checking a slot"))?
                .ino();
            slots.push(Slot {
                file,
                private_name,
                ino,
                map,
                state: AtomicU8::new(FREE),
                name_hi: AtomicU64::new(0),
                name_lo: AtomicU64::new(0),
                returned_at: AtomicU64::new(0),
            });
        }
        // From here the pool owns the private names (and removes them on drop).
        pending.names.clear();
        drop(pending);
        Ok(Self {
            inner: Arc::new(PoolInner {
                name_stem,
                config,
                dir_fd,
                slots,
                epoch: Instant::now(),
                cursor: AtomicUsize::new(0),
                one_off_files: AtomicUsize::new(0),
                lost: AtomicBool::new(false),
                _owner: owner,
            }),
        })
    }

    /// Whether a slot's private name was removed or replaced by someone
    /// else (checked name by name; a pool found lost stays lost).
    pub fn is_lost(&self) -> bool {
        if self.marked_lost() {
            return true;
        }
        let inner = &self.inner;
        let lost = inner.slots.iter().any(|slot| {
            let at_name = nix::sys::stat::fstatat(
                &inner.dir_fd,
                slot.private_name.as_str(),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            );
            !matches!(at_name, Ok(stat) if stat.st_ino == slot.ino)
        });
        if lost {
            inner.lost.store(true, Ordering::Relaxed);
        }
        lost
    }

    /// Whether the pool already knows it lost a slot (no system call).
    pub fn marked_lost(&self) -> bool {
        self.inner.lost.load(Ordering::Relaxed)
    }

    /// A buffer of `nbytes` to write one tensor into: a free slot when one
    /// is large enough and free, else a one-off file when /dev/shm has room.
    pub fn acquire(&self, nbytes: usize) -> Result<ShmWriter, ShmError> {
        let inner = &self.inner;
        if self.marked_lost() {
            return Err(ShmError::SlotLost {
                source: io::Error::new(
                    io::ErrorKind::NotFound,
                    "the pool lost a slot and waits to be rebuilt",
                ),
            });
        }
        if nbytes <= inner.config.slot_bytes
            && let Some(index) = self.claim_slot()
        {
            if !self.slot_intact(index) {
                // Removed or truncated while free: never write it again.
                inner.slots[index].state.store(FREE, Ordering::Release);
                inner.lost.store(true, Ordering::Relaxed);
                return Err(ShmError::SlotLost {
                    source: io::Error::new(
                        io::ErrorKind::NotFound,
                        "a free slot's file was removed or truncated",
                    ),
                });
            }
            return Ok(ShmWriter {
                pool: self.clone(),
                target: Some(Target::Slot(index)),
                nbytes,
            });
        }
        // Too large for a slot, or every slot busy: a one-off file keeps the
        // tensor on the lane, at the cost of cold pages.
        let available = free_bytes(&inner.dir_fd)?.saturating_sub(inner.config.keep_free_bytes);
        if nbytes as u64 > available {
            return Err(ShmError::NoSpace {
                needed: nbytes,
                available,
            });
        }
        let (file, name) = create_named(&inner.dir_fd, &inner.name_stem, nbytes)?;
        let map = if nbytes == 0 {
            None
        } else {
            Some(Mapping::new(&file, nbytes).map_err(ShmError::io("mapping a one-off file"))?)
        };
        inner.one_off_files.fetch_add(1, Ordering::Relaxed);
        Ok(ShmWriter {
            pool: self.clone(),
            target: Some(Target::OneOff { file, map, name }),
            nbytes,
        })
    }

    /// Free and busy slots (reclaiming any whose names are gone first).
    pub fn occupancy(&self) -> Occupancy {
        self.occupancy_at(Instant::now())
    }

    /// [`occupancy`](Self::occupancy) as if the clock read `now`: names
    /// whose RPC returned more than `reclaim_after` before `now` are
    /// reclaimed. Lets a test move time instead of sleeping.
    pub fn occupancy_at(&self, now: Instant) -> Occupancy {
        let mut free = 0;
        for index in 0..self.inner.slots.len() {
            if self.try_reclaim(index, now) {
                free += 1;
            }
        }
        Occupancy {
            free,
            busy: self.inner.slots.len() - free,
            one_off_files: self.inner.one_off_files.load(Ordering::Relaxed),
        }
    }

    /// Slots in the pool.
    pub fn slots(&self) -> usize {
        self.inner.slots.len()
    }

    /// The largest tensor a slot takes.
    pub fn slot_bytes(&self) -> usize {
        self.inner.config.slot_bytes
    }

    fn claim_slot(&self) -> Option<usize> {
        let now = Instant::now();
        let slots = self.inner.slots.len();
        let start = self.inner.cursor.fetch_add(1, Ordering::Relaxed);
        (0..slots)
            .map(|step| (start + step) % slots.max(1))
            .find(|&index| {
                self.try_reclaim(index, now)
                    && self.inner.slots[index]
                        .state
                        .compare_exchange(FREE, WRITING, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
            })
    }

    /// Whether slot `index` is free, freeing it first when its RPC returned
    /// and its name is gone (or has outlived `reclaim_after` at `now`).
    fn try_reclaim(&self, index: usize, now: Instant) -> bool {
        let slot = &self.inner.slots[index];
        match slot.state.load(Ordering::Acquire) {
            FREE => true,
            RETURNED => {
                if !self.slot_intact(index) {
                    // Its file went, or shrank, under the RPC: reusing it
                    // would write past the file's end (SIGBUS). The pool is
                    // rebuilt instead; this slot stays busy until then.
                    self.inner.lost.store(true, Ordering::Relaxed);
                    return false;
                }
                let name_gone = slot.file.metadata().is_ok_and(|meta| meta.nlink() == 1);
                let returned_at = Duration::from_nanos(slot.returned_at.load(Ordering::Relaxed));
                let overdue = now.saturating_duration_since(self.inner.epoch)
                    > returned_at + self.inner.config.reclaim_after;
                if !name_gone && !overdue {
                    return false;
                }
                if !name_gone {
                    // The worker never unlinked it (died, or lost the RPC).
                    let name = self.name(
                        slot.name_hi.load(Ordering::Relaxed),
                        slot.name_lo.load(Ordering::Relaxed),
                    );
                    let _ = unlink_at(&self.inner.dir_fd, &name);
                    if slot.file.metadata().is_ok_and(|meta| meta.nlink() != 1) {
                        return false;
                    }
                }
                slot.state
                    .compare_exchange(RETURNED, FREE, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            }
            _ => false,
        }
    }

    fn name(&self, hi: u64, lo: u64) -> String {
        self.inner.public_name(hi, lo)
    }

    /// Whether slot `index`'s private name still leads to its file and the
    /// file still holds a whole slot (one `fstatat`). Someone else removing
    /// or truncating it makes it false for good.
    fn slot_intact(&self, index: usize) -> bool {
        let inner = &self.inner;
        let slot = &inner.slots[index];
        let at_name = nix::sys::stat::fstatat(
            &inner.dir_fd,
            slot.private_name.as_str(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        );
        matches!(at_name, Ok(stat) if stat.st_ino == slot.ino
            && u64::try_from(stat.st_size).is_ok_and(|len| len >= inner.config.slot_bytes as u64))
    }

    fn release(&self, index: usize) {
        let slot = &self.inner.slots[index];
        let now = self.inner.epoch.elapsed().as_nanos() as u64;
        slot.returned_at.store(now, Ordering::Relaxed);
        slot.state.store(RETURNED, Ordering::Release);
    }
}

/// Where a writer's bytes go.
#[derive(Debug)]
enum Target {
    Slot(usize),
    /// A file created under its public name.
    OneOff {
        file: File,
        map: Option<Mapping>,
        name: String,
    },
}

/// Exclusive access to one tensor's buffer before it is published. Dropping
/// it unpublished returns the slot.
#[derive(Debug)]
pub struct ShmWriter {
    pool: ShmPool,
    /// `None` once published.
    target: Option<Target>,
    nbytes: usize,
}

impl ShmWriter {
    /// The tensor's bytes, to be written once.
    pub fn buffer(&mut self) -> &mut [u8] {
        let map = match &self.target {
            Some(Target::Slot(index)) => Some(&self.pool.inner.slots[*index].map),
            Some(Target::OneOff { map, .. }) => map.as_ref(),
            None => None,
        };
        match map {
            // SAFETY: the state machine (WRITING) or sole ownership of a
            // one-off file gives this writer exclusive use of the first
            // `nbytes` <= mapping length bytes, for as long as `&mut self`.
            Some(map) => unsafe { std::slice::from_raw_parts_mut(map.ptr().as_ptr(), self.nbytes) },
            None => &mut [],
        }
    }

    /// Gives the written tensor a fresh public name. The returned guard must
    /// live until the RPC carrying the name has returned. On failure the
    /// writer keeps its bytes (a caller can still send them another way)
    /// and returns the slot when dropped; [`ShmError::SlotLost`] says the
    /// slot's file is gone (the pool is then marked lost).
    pub fn publish(&mut self) -> Result<ShmTensor, ShmError> {
        let pool = self.pool.clone();
        let target = self.target.take().ok_or_else(|| ShmError::Io {
            action: "publishing",
            source: io::Error::other("the writer was already published"),
        })?;
        let (hi, lo, name) = match &target {
            Target::OneOff { name, .. } => (0, 0, name.clone()),
            Target::Slot(index) => loop {
                let (hi, lo) = random_u128()?;
                let name = pool.name(hi, lo);
                let private = &pool.inner.slots[*index].private_name;
                match link_at(&pool.inner.dir_fd, private, &name) {
                    Ok(()) => break (hi, lo, name),
                    Err(err) if err.kind() == io::ErrorKind::AlreadyExists => continue,
                    Err(source) => {
                        // Put the target back so Drop returns it.
                        self.target = Some(target);
                        if source.kind() == io::ErrorKind::NotFound {
                            pool.inner.lost.store(true, Ordering::Relaxed);
                            return Err(ShmError::SlotLost { source });
                        }
                        return Err(ShmError::Io {
                            action: "naming a tensor",
                            source,
                        });
                    }
                }
            },
        };
        if let Target::Slot(index) = target {
            let slot = &pool.inner.slots[index];
            slot.name_hi.store(hi, Ordering::Relaxed);
            slot.name_lo.store(lo, Ordering::Relaxed);
            slot.state.store(IN_FLIGHT, Ordering::Release);
        }
        Ok(ShmTensor {
            pool,
            target: Some(target),
            name,
            nbytes: self.nbytes as u64,
        })
    }
}

impl Drop for ShmWriter {
    fn drop(&mut self) {
        match self.target.take() {
            Some(Target::Slot(index)) => {
                self.pool.inner.slots[index]
                    .state
                    .store(FREE, Ordering::Release);
            }
            Some(Target::OneOff { .. }) => {
                self.pool
                    .inner
                    .one_off_files
                    .fetch_sub(1, Ordering::Relaxed);
            }
            None => {}
        }
    }
}

/// A published tensor: its name is in /dev/shm until the worker unlinks it.
/// Dropping the guard says the RPC carrying it has returned.
#[derive(Debug)]
pub struct ShmTensor {
    pool: ShmPool,
    target: Option<Target>,
    name: String,
    nbytes: u64,
}

impl ShmTensor {
    /// The name to put in the `ShmHandle` (a single component of /dev/shm).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tensor's size in bytes (the handle's offset is always 0).
    pub fn nbytes(&self) -> u64 {
        self.nbytes
    }

    /// Whether someone else took the tensor from under its RPC: a slot
    /// whose private name was removed or replaced or whose file was
    /// truncated (the pool is then marked lost, to be rebuilt), a one-off
    /// file truncated. A name a worker consumed is not a loss.
    pub fn lost(&self) -> bool {
        match &self.target {
            Some(Target::Slot(index)) => {
                let lost = !self.pool.slot_intact(*index);
                if lost {
                    self.pool.inner.lost.store(true, Ordering::Relaxed);
                }
                lost
            }
            Some(Target::OneOff { file, .. }) => {
                !file.metadata().is_ok_and(|meta| meta.len() >= self.nbytes)
            }
            None => false,
        }
    }

    /// The tensor's bytes, read from the open file with `pread` (never
    /// through the mapping, which faults past a truncated file's end), so
    /// they can still go inline when their names are gone. Fails with
    /// [`ShmError::SlotLost`] when the file no longer holds them.
    pub fn copy_out(&self) -> Result<Vec<u8>, ShmError> {
        use std::os::unix::fs::FileExt;
        let file = match &self.target {
            Some(Target::Slot(index)) => &self.pool.inner.slots[*index].file,
            Some(Target::OneOff { file, .. }) => file,
            None => {
                return Err(ShmError::Io {
                    action: "copying a tensor out",
                    source: io::Error::other("the tensor was already released"),
                });
            }
        };
        let len = usize::try_from(self.nbytes).map_err(|_| ShmError::Io {
            action: "copying a tensor out",
            source: io::Error::other("the tensor is larger than memory"),
        })?;
        let mut bytes = vec![0u8; len];
        file.read_exact_at(&mut bytes, 0).map_err(|source| {
            if source.kind() == io::ErrorKind::UnexpectedEof {
                ShmError::SlotLost { source }
            } else {
                ShmError::Io {
                    action: "copying a tensor out",
                    source,
                }
            }
        })?;
        Ok(bytes)
    }

    /// Makes sure the tensor has a public name again before another RPC
    /// carries it (a retry after a worker read and unlinked the last one):
    /// `None` when the current name still exists, else the fresh name now
    /// linked. A one-off file has only its public name, so once a worker
    /// unlinked it, it cannot be renamed: that is an error.
    pub fn renew(&self) -> Result<Option<String>, ShmError> {
        match &self.target {
            Some(Target::Slot(index)) => {
                if self.lost() {
                    return Err(ShmError::SlotLost {
                        source: io::Error::new(
                            io::ErrorKind::NotFound,
                            "the slot's file was removed or truncated under its RPC",
                        ),
                    });
                }
                let slot = &self.pool.inner.slots[*index];
                let linked = slot
                    .file
                    .metadata()
                    .map_err(ShmError::io("checking a slot's links"))?
                    .nlink();
                if linked > 1 {
                    return Ok(None);
                }
                loop {
                    let (hi, lo) = random_u128()?;
                    let name = self.pool.name(hi, lo);
                    match link_at(&self.pool.inner.dir_fd, &slot.private_name, &name) {
                        Ok(()) => {
                            slot.name_hi.store(hi, Ordering::Relaxed);
                            slot.name_lo.store(lo, Ordering::Relaxed);
                            return Ok(Some(name));
                        }
                        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => continue,
                        Err(source) => {
                            return Err(ShmError::Io {
                                action: "renaming a tensor",
                                source,
                            });
                        }
                    }
                }
            }
            Some(Target::OneOff { file, .. }) => {
                let linked = file
                    .metadata()
                    .map_err(ShmError::io("checking a one-off file's links"))?
                    .nlink();
                if linked > 0 {
                    Ok(None)
                } else {
                    Err(ShmError::Io {
                        action: "renaming a one-off tensor",
                        source: io::Error::new(
                            io::ErrorKind::NotFound,
                            "a worker already consumed its only name",
                        ),
                    })
                }
            }
            None => Ok(None),
        }
    }
}

impl Drop for ShmTensor {
    fn drop(&mut self) {
        match self.target.take() {
            Some(Target::Slot(index)) => self.pool.release(index),
            Some(Target::OneOff { file, map, .. }) => {
                // Never reused: drop the name now (a reader that has it open
                // keeps its pages until it closes them).
                let _ = unlink_at(&self.pool.inner.dir_fd, &self.name);
                drop(map);
                drop(file);
                self.pool
                    .inner
                    .one_off_files
                    .fetch_sub(1, Ordering::Relaxed);
            }
            None => {}
        }
    }
}

/// What one [`sweep_orphans`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepSummary {
    /// Names (and owner files) of provably gone owners, removed.
    pub removed: usize,
    /// `smg-` names left alone: a live owner, or none provably gone.
    pub kept: usize,
    /// Entries that could not be read, locked or removed (logged).
    pub errors: usize,
}

/// Removes the names of gateway instances that are provably gone (see the
/// module docs): another boot's, or whose owner file nobody holds locked.
/// Never touches this process's own names. Fails only when `dir` cannot
/// be listed; an entry that fails is logged, counted and skipped.
pub fn sweep_orphans(dir: &Path) -> io::Result<SweepSummary> {
    let dir_fd = File::open(dir)?;
    let own = instance_stem();
    let mut summary = SweepSummary::default();
    // Per instance stem: whether it has an owner file, and its other names.
    let mut owners: BTreeMap<String, (bool, Vec<String>)> = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = match entry {
            Ok(entry) => entry,
            Err(err) => {
                tracing::warn!(%err, dir = %dir.display(), "shm sweep: cannot read an entry");
                summary.errors += 1;
                continue;
            }
        };
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        match parse_name(&name) {
            Some(parsed) => {
                let owner = owners.entry(parsed.stem.to_owned()).or_default();
                if parsed.owner_file {
                    owner.0 = true;
                } else {
                    owner.1.push(name);
                }
            }
            // Another format (an older gateway's pid-based names, a
            // stranger's): nothing proves its owner gone.
            None if name.starts_with(NAME_PREFIX) => summary.kept += 1,
            None => {}
        }
    }
    for (stem, (has_owner_file, names)) in owners {
        let all = names.len() + usize::from(has_owner_file);
        if stem == own {
            summary.kept += all;
            continue;
        }
        let owner_name = format!("{stem}{OWNER_SUFFIX}");
        let other_boot = stem_boot(&stem) != boot_tag();
        // Held until the names are gone, so the owner file cannot be
        // re-taken by anyone in between.
        let _lock = if other_boot {
            None
        } else if !has_owner_file {
            summary.kept += all;
            continue;
        } else {
            match lock_if_gone(&dir_fd, &owner_name) {
                Ok(Some(lock)) => Some(lock),
                Ok(None) => {
                    summary.kept += all;
                    continue;
                }
                Err(err) => {
                    tracing::warn!(%err, name = owner_name, "shm sweep: cannot test an owner's lock");
                    summary.errors += 1;
                    summary.kept += all;
                    continue;
                }
            }
        };
        let owner_file = has_owner_file.then_some(owner_name);
        for name in names.iter().chain(owner_file.as_ref()) {
            match unlink_at(&dir_fd, name) {
                Ok(()) => summary.removed += 1,
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => {
                    tracing::warn!(%err, name, "shm sweep: cannot remove a gone owner's name");
                    summary.errors += 1;
                }
            }
        }
    }
    Ok(summary)
}

/// The exclusive lock of the owner file `name` when nobody holds it (its
/// owner is gone) and the name still leads to the file locked; `None` when
/// it is held, or was removed or replaced meanwhile (its owner may be alive).
fn lock_if_gone(dir: &File, name: &str) -> io::Result<Option<Flock<File>>> {
    let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK;
    let file = match nix::fcntl::openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => File::from(fd),
        Err(Errno::ENOENT) => return Ok(None),
        Err(errno) => return Err(errno.into()),
    };
    let lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => lock,
        Err((_, Errno::EWOULDBLOCK)) => return Ok(None),
        Err((_, errno)) => return Err(errno.into()),
    };
    Ok(still_named(dir, name, &lock)?.then_some(lock))
}

/// Whether `name` in `dir` is still the file `file` (same inode).
fn still_named(dir: &File, name: &str, file: &File) -> io::Result<bool> {
    let ours = file.metadata()?;
    match nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(stat) => Ok(stat.st_ino == ours.ino() && stat.st_dev == ours.dev()),
        Err(Errno::ENOENT) => Ok(false),
        Err(errno) => Err(errno.into()),
    }
}

/// A name this lane could have created, split up.
#[derive(Debug, PartialEq, Eq)]
struct ParsedName<'a> {
    /// `smg-<boot>-<instance>`.
    stem: &'a str,
    /// The instance's owner file rather than a tensor or slot.
    owner_file: bool,
}

/// Parses `smg-<32 hex>-<24 hex>-<32 hex>` and `smg-<32 hex>-<24 hex>.owner`
/// (lowercase hex); anything else is `None`.
fn parse_name(name: &str) -> Option<ParsedName<'_>> {
    let is_hex = |part: &str, len: usize| {
        part.len() == len && part.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    let stem_len = NAME_PREFIX.len() + BOOT_HEX + 1 + INSTANCE_HEX;
    let rest = name.strip_prefix(NAME_PREFIX)?;
    let (boot, rest) = rest.split_at_checked(BOOT_HEX)?;
    let rest = rest.strip_prefix('-')?;
    let (instance, tail) = rest.split_at_checked(INSTANCE_HEX)?;
    if !is_hex(boot, BOOT_HEX) || !is_hex(instance, INSTANCE_HEX) {
        return None;
    }
    let stem = &name[..stem_len];
    if tail == OWNER_SUFFIX {
        return Some(ParsedName {
            stem,
            owner_file: true,
        });
    }
    let random = tail.strip_prefix('-')?;
    is_hex(random, RANDOM_HEX).then_some(ParsedName {
        stem,
        owner_file: false,
    })
}

/// The boot part of a parsed stem.
fn stem_boot(stem: &str) -> &str {
    stem.get(NAME_PREFIX.len()..NAME_PREFIX.len() + BOOT_HEX)
        .unwrap_or_default()
}

/// This process's instance id: 96 random bits drawn once, in every name it
/// creates (and in RDMA loopback descriptors).
pub fn instance_id() -> [u8; 12] {
    static ID: OnceLock<[u8; 12]> = OnceLock::new();
    *ID.get_or_init(|| {
        let mut id = [0u8; 12];
        if getrandom::fill(&mut id).is_err() {
            // No kernel randomness (not seen on Linux): the clock and the pid
            // still make a collision with a live instance unlikely.
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_nanos() as u64);
            id[..8].copy_from_slice(&nanos.to_le_bytes());
            id[8..].copy_from_slice(&std::process::id().to_le_bytes());
        }
        id
    })
}

/// This boot's id as 32 lowercase hex digits (all zeros when unreadable:
/// names then only rely on owner locks).
pub fn boot_tag() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| {
        let hex: String = std::fs::read_to_string(BOOT_ID_PATH)
            .unwrap_or_default()
            .chars()
            .filter(char::is_ascii_hexdigit)
            .map(|c| c.to_ascii_lowercase())
            .collect();
        if hex.len() == BOOT_HEX {
            hex
        } else {
            "0".repeat(BOOT_HEX)
        }
    })
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `smg-<boot id>-<instance>`: every name this process creates starts with
/// it and a `-`; its owner file is it plus [`OWNER_SUFFIX`]. Also this
/// process's `ShmHandle.owner_id`.
pub fn instance_stem() -> String {
    instance_stem_of(boot_tag(), &instance_id())
}

/// The stem of instance `instance` in boot `boot` (32 hex digits).
pub fn instance_stem_of(boot: &str, instance: &[u8; 12]) -> String {
    format!("{NAME_PREFIX}{boot}-{}", hex(instance))
}

/// This process's owner file in one directory, locked while held.
#[derive(Debug)]
pub(crate) struct OwnerFile {
    dir: File,
    name: String,
    /// The directory's (device, inode), to share one owner file per directory.
    key: (u64, u64),
    lock: Flock<File>,
}

impl Drop for OwnerFile {
    fn drop(&mut self) {
        // Unlinked while still locked: a sweeper that opened it meanwhile
        // finds it busy or no longer at its name.
        if still_named(&self.dir, &self.name, &self.lock).unwrap_or(false) {
            let _ = unlink_at(&self.dir, &self.name);
        }
    }
}

/// The owner file of this process in `dir`, shared by every pool and arena
/// there; the last holder to drop removes it.
pub(crate) fn owner_file(dir: &File) -> Result<Arc<OwnerFile>, ShmError> {
    static OWNERS: Mutex<Vec<Weak<OwnerFile>>> = Mutex::new(Vec::new());
    let meta = dir
        .metadata()
        .map_err(ShmError::io("checking the shm directory"))?;
    let key = (meta.dev(), meta.ino());
    let mut owners = OWNERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    owners.retain(|owner| owner.strong_count() > 0);
    if let Some(owner) = owners
        .iter()
        .filter_map(Weak::upgrade)
        .find(|owner| owner.key == key)
    {
        return Ok(owner);
    }
    let owner = Arc::new(create_owner_file(dir, key)?);
    owners.push(Arc::downgrade(&owner));
    Ok(owner)
}

/// Creates (or takes over) and locks this instance's owner file in `dir`.
fn create_owner_file(dir: &File, key: (u64, u64)) -> Result<OwnerFile, ShmError> {
    let name = format!("{}{OWNER_SUFFIX}", instance_stem());
    let dir = dir
        .try_clone()
        .map_err(ShmError::io("keeping the shm directory open"))?;
    loop {
        let flags = OFlag::O_CREAT | OFlag::O_RDWR | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
        let fd = nix::fcntl::openat(&dir, name.as_str(), flags, Mode::S_IRUSR | Mode::S_IWUSR)
            .map_err(|errno| ShmError::Io {
                action: "creating the owner file",
                source: errno.into(),
            })?;
        // Blocking: only a sweeper that found an earlier file of ours
        // unlocked holds it, for as long as it removes names.
        let lock = Flock::lock(File::from(fd), FlockArg::LockExclusive).map_err(|(_, errno)| {
            ShmError::Io {
                action: "locking the owner file",
                source: errno.into(),
            }
        })?;
        // A sweeper may have removed the name while we waited: lock a file
        // that is still at the name, or try again.
        if !still_named(&dir, &name, &lock).map_err(ShmError::io("checking the owner file"))? {
            continue;
        }
        let mut file: &File = &lock;
        let _ = file.set_len(0);
        let _ = writeln!(
            file,
            "pid {} (in its own PID namespace)",
            std::process::id()
        );
        return Ok(OwnerFile {
            dir,
            name,
            key,
            lock,
        });
    }
}

/// Bytes an unprivileged writer may still allocate in `dir`'s filesystem.
pub(crate) fn free_bytes(dir: &File) -> Result<u64, ShmError> {
    let stats = nix::sys::statvfs::fstatvfs(dir).map_err(|errno| ShmError::Io {
        action: "checking free space",
        source: errno.into(),
    })?;
    Ok(stats
        .blocks_available()
        .saturating_mul(stats.fragment_size()))
}

/// A new 0600 file `<stem><random>` in `dir` of `len` bytes with its
/// memory reserved; never replaces an existing file.
pub(crate) fn create_named(dir: &File, stem: &str, len: usize) -> Result<(File, String), ShmError> {
    let (file, name) = loop {
        let (hi, lo) = random_u128()?;
        let name = format!("{stem}{hi:016x}{lo:016x}");
        let flags =
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_RDWR | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
        match nix::fcntl::openat(dir, name.as_str(), flags, Mode::S_IRUSR | Mode::S_IWUSR) {
            Ok(fd) => break (File::from(fd), name),
            // Someone holds this name: draw another.
            Err(Errno::EEXIST) => continue,
            Err(errno) => {
                return Err(ShmError::Io {
                    action: "creating a shm file",
                    source: errno.into(),
                });
            }
        }
    };
    if len > 0 {
        let reserved = nix::fcntl::fallocate(&file, FallocateFlags::empty(), 0, len as libc::off_t);
        if let Err(errno) = reserved {
            let _ = unlink_at(dir, &name);
            return Err(if errno == Errno::ENOSPC {
                ShmError::NoSpace {
                    needed: len,
                    available: 0,
                }
            } else {
                ShmError::Io {
                    action: "reserving shm memory",
                    source: errno.into(),
                }
            });
        }
    }
    Ok((file, name))
}

/// Adds the name `to` for the file named `from` in `dir`; fails with
/// `AlreadyExists` instead of replacing an existing name.
fn link_at(dir: &File, from: &str, to: &str) -> io::Result<()> {
    nix::unistd::linkat(dir, from, dir, to, AtFlags::empty()).map_err(io::Error::from)
}

/// Private names created so far, removed if pool creation fails midway.
struct PrivateNames<'a> {
    dir: &'a File,
    names: Vec<String>,
}

impl Drop for PrivateNames<'_> {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = unlink_at(self.dir, name);
        }
    }
}

impl PoolInner {
    /// The public name whose random part is `hi`, `lo`.
    fn public_name(&self, hi: u64, lo: u64) -> String {
        format!("{}{hi:016x}{lo:016x}", self.name_stem)
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        // Every guard is gone (they hold the pool). Remove the slots' private
        // names and any public name a worker never unlinked.
        for slot in &self.slots {
            let _ = unlink_at(&self.dir_fd, &slot.private_name);
            if slot.state.load(Ordering::Acquire) == RETURNED {
                let hi = slot.name_hi.load(Ordering::Relaxed);
                let lo = slot.name_lo.load(Ordering::Relaxed);
                let _ = unlink_at(&self.dir_fd, &self.public_name(hi, lo));
            }
        }
    }
}

pub(crate) fn unlink_at(dir: &File, name: &str) -> io::Result<()> {
    nix::unistd::unlinkat(dir, name, UnlinkatFlags::NoRemoveDir).map_err(io::Error::from)
}

/// 128 unguessable bits from the kernel.
pub(crate) fn random_u128() -> Result<(u64, u64), ShmError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|err| ShmError::Io {
        action: "drawing a random name",
        source: err.into(),
    })?;
    let (hi, lo) = bytes.split_at(8);
    let word = |part: &[u8]| part.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
    Ok((word(hi), word(lo)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    /// An instance of this boot other than ours, with one name and an owner
    /// file in `dir`; returns (stem, data name, owner file name).
    fn other_instance(dir: &Path, boot: &str, tag: &[u8; 12]) -> (String, String, String) {
        let stem = instance_stem_of(boot, tag);
        let data = format!("{stem}-{}", "cd".repeat(16));
        let owner = format!("{stem}{OWNER_SUFFIX}");
        std::fs::write(dir.join(&data), b"tensor").unwrap();
        std::fs::write(dir.join(&owner), b"").unwrap();
        (stem, data, owner)
    }

    /// Locks `owner` the way its instance would: an open file description
    /// of its own, so the sweep's `flock` (another description) conflicts
    /// even within this process.
    fn hold(dir: &Path, owner: &str) -> Flock<File> {
        let file = File::open(dir.join(owner)).unwrap();
        Flock::lock(file, FlockArg::LockExclusiveNonblock).unwrap()
    }

    #[test]
    fn names_parse_into_their_owner_and_nothing_else_does() {
        let boot = "0123456789abcdef0123456789abcdef";
        let instance = "00112233445566778899aabb";
        let random = "ff".repeat(16);
        let stem = format!("smg-{boot}-{instance}");
        let cases = [
            (format!("{stem}-{random}"), Some(false)),
            (format!("{stem}.owner"), Some(true)),
            (format!("{stem}-{}", "ff".repeat(15)), None),
            (format!("{stem}-{}", "FF".repeat(16)), None),
            (format!("{stem}.lock"), None),
            (format!("smg-4242-12345-{random}"), None),
            (format!("smg-{boot}-{random}"), None),
            ("smg-".to_owned(), None),
        ];
        for (name, expected) in cases {
            let parsed = parse_name(&name);
            assert_eq!(parsed.as_ref().map(|p| p.owner_file), expected, "{name}");
            if let Some(parsed) = parsed {
                assert_eq!(parsed.stem, stem);
                assert_eq!(stem_boot(parsed.stem), boot);
            }
        }
    }

    #[test]
    fn an_owner_holding_its_lock_is_kept_and_a_released_one_is_swept() {
        let dir = tempfile::tempdir().unwrap();
        let (_, data, owner) = other_instance(dir.path(), boot_tag(), b"alive-owner!");
        let lock = hold(dir.path(), &owner);
        let summary = sweep_orphans(dir.path()).unwrap();
        assert_eq!(
            summary,
            SweepSummary {
                removed: 0,
                kept: 2,
                errors: 0
            }
        );
        assert_eq!(names(dir.path()), {
            let mut both = vec![data.clone(), owner.clone()];
            both.sort();
            both
        });
        // The owner dies: the kernel releases its lock.
        drop(lock);
        let summary = sweep_orphans(dir.path()).unwrap();
        assert_eq!((summary.removed, summary.kept), (2, 0));
        assert!(names(dir.path()).is_empty());
    }

    #[test]
    fn another_boots_names_are_swept_without_asking_a_lock() {
        let dir = tempfile::tempdir().unwrap();
        let other_boot = if boot_tag().starts_with('f') {
            "e".repeat(BOOT_HEX)
        } else {
            "f".repeat(BOOT_HEX)
        };
        let (_, _, owner) = other_instance(dir.path(), &other_boot, b"last-boot!!!");
        // Even a held lock proves nothing about a process of another boot
        // (a persistent directory reused after a reboot).
        let _lock = hold(dir.path(), &owner);
        let summary = sweep_orphans(dir.path()).unwrap();
        assert_eq!((summary.removed, summary.kept), (2, 0));
        assert!(names(dir.path()).is_empty());
    }

    #[test]
    fn names_without_an_owner_file_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (_, data, owner) = other_instance(dir.path(), boot_tag(), b"no-owner-fil");
        std::fs::remove_file(dir.path().join(owner)).unwrap();
        let summary = sweep_orphans(dir.path()).unwrap();
        assert_eq!((summary.removed, summary.kept), (0, 1));
        assert_eq!(names(dir.path()), vec![data]);
    }

    #[test]
    fn an_entry_that_fails_does_not_stop_the_sweep() {
        let dir = tempfile::tempdir().unwrap();
        // Two gone instances; the first (in sweep order) has a "name" that
        // is a non-empty directory, which unlink refuses.
        let (first, _, _) = other_instance(dir.path(), boot_tag(), b"aaaa-gone-01");
        let (_, second_data, _) = other_instance(dir.path(), boot_tag(), b"bbbb-gone-02");
        let stuck = format!("{first}-{}", "ee".repeat(16));
        std::fs::create_dir(dir.path().join(&stuck)).unwrap();
        std::fs::write(dir.path().join(&stuck).join("inside"), b"x").unwrap();
        let summary = sweep_orphans(dir.path()).unwrap();
        assert_eq!(summary.errors, 1, "{summary:?}");
        assert_eq!(summary.removed, 4, "{summary:?}");
        assert_eq!(names(dir.path()), vec![stuck]);
        assert!(!dir.path().join(second_data).exists());
    }

    #[test]
    fn our_own_names_are_never_swept_and_the_owner_file_goes_with_the_last_pool() {
        let dir = tempfile::tempdir().unwrap();
        let config = ShmPoolConfig {
            dir: dir.path().to_path_buf(),
            slot_bytes: 64,
            slots: 1,
            reclaim_after: Duration::from_secs(60),
            keep_free_bytes: 0,
        };
        let first = ShmPool::create(config.clone()).unwrap();
        let second = ShmPool::create(config).unwrap();
        let own = names(dir.path());
        assert_eq!(own.len(), 3, "two slots and one shared owner file: {own:?}");
        let summary = sweep_orphans(dir.path()).unwrap();
        assert_eq!((summary.removed, summary.kept), (0, 3));
        drop(first);
        assert_eq!(names(dir.path()).len(), 2, "the owner file stays");
        drop(second);
        assert!(names(dir.path()).is_empty(), "{:?}", names(dir.path()));
    }

    #[test]
    fn a_pool_whose_slot_file_was_removed_is_lost_and_publishing_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let pool = ShmPool::create(ShmPoolConfig {
            dir: dir.path().to_path_buf(),
            slot_bytes: 64,
            slots: 1,
            reclaim_after: Duration::from_secs(60),
            keep_free_bytes: 0,
        })
        .unwrap();
        assert!(!pool.is_lost());
        let mut writer = pool.acquire(8).unwrap();
        writer.buffer().copy_from_slice(b"12345678");
        // Someone else removes every slot file (not the owner file).
        for name in names(dir.path()) {
            if !name.ends_with(OWNER_SUFFIX) {
                std::fs::remove_file(dir.path().join(name)).unwrap();
            }
        }
        let err = writer.publish().unwrap_err();
        assert_eq!(err.code(), "shm_slot_lost");
        assert_eq!(writer.buffer(), b"12345678", "the bytes are still there");
        drop(writer);
        assert!(pool.marked_lost() && pool.is_lost());
        assert_eq!(pool.acquire(8).unwrap_err().code(), "shm_slot_lost");
    }
}
