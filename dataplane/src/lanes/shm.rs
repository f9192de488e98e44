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
//! guard drops. Every name (private or public) carries the gateway's pid and
//! start time, so [`sweep_orphans`] can remove the files of gateway
//! processes that died (`kill -9`) without touching live ones; a pool that
//! drops removes its own.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use memmap2::{MmapOptions, MmapRaw};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, FallocateFlags, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::UnlinkatFlags;

/// Every public name this lane creates starts with this.
pub const NAME_PREFIX: &str = "smg-";

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
    /// `smg-<pid>-<start time>-` for every name this process creates.
    name_stem: String,
    slots: Vec<Slot>,
    epoch: Instant,
    /// Where the next free-slot search starts (spreads reuse).
    cursor: AtomicUsize,
    one_off_files: AtomicUsize,
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
        let name_stem = format!("{NAME_PREFIX}{}-{}-", std::process::id(), own_start_time());
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
            slots.push(Slot {
                file,
                private_name,
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
            }),
        })
    }

    /// A buffer of `nbytes` to write one tensor into: a free slot when one
    /// is large enough and free, else a one-off file when /dev/shm has room.
    pub fn acquire(&self, nbytes: usize) -> Result<ShmWriter, ShmError> {
        let inner = &self.inner;
        if nbytes <= inner.config.slot_bytes
            && let Some(index) = self.claim_slot()
        {
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
    /// live until the RPC carrying the name has returned.
    pub fn publish(mut self) -> Result<ShmTensor, ShmError> {
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

    /// Makes sure the tensor has a public name again before another RPC
    /// carries it (a retry after a worker read and unlinked the last one):
    /// `None` when the current name still exists, else the fresh name now
    /// linked. A one-off file has only its public name, so once a worker
    /// unlinked it, it cannot be renamed: that is an error.
    pub fn renew(&self) -> Result<Option<String>, ShmError> {
        match &self.target {
            Some(Target::Slot(index)) => {
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

/// Removes the public names of gateway processes that no longer run (their
/// pid is gone, or now belongs to a process started at another time).
/// Returns how many names were removed.
pub fn sweep_orphans(dir: &Path) -> io::Result<usize> {
    let mut removed = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let file_name = entry.file_name();
        let Some(name) = file_name.to_str() else {
            continue;
        };
        let Some((pid, start_time)) = parse_owner(name) else {
            continue;
        };
        if process_start_time(pid) == Some(start_time) {
            continue;
        }
        match std::fs::remove_file(entry.path()) {
            Ok(()) => removed += 1,
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(err),
        }
    }
    Ok(removed)
}

/// `(pid, start time)` from `smg-<pid>-<start>-<32 hex>`.
fn parse_owner(name: &str) -> Option<(u32, u64)> {
    let rest = name.strip_prefix(NAME_PREFIX)?;
    let mut parts = rest.splitn(3, '-');
    let pid = parts.next()?.parse().ok()?;
    let start_time = parts.next()?.parse().ok()?;
    let random = parts.next()?;
    (random.len() == 32 && random.bytes().all(|b| b.is_ascii_hexdigit()))
        .then_some((pid, start_time))
}

/// A process's start time in clock ticks since boot (`/proc/<pid>/stat`
/// field 22), or `None` when no such process exists.
pub(crate) fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = stat.rsplit_once(')')?.1;
    // Field 3 (state) is the first after the name; start time is field 22.
    after_name.split_whitespace().nth(19)?.parse().ok()
}

pub(crate) fn own_start_time() -> u64 {
    process_start_time(std::process::id()).unwrap_or(0)
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
