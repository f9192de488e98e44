//! The io_uring backend of a data-plane core: its loop and its file reads.
//!
//! Why it exists: the core's I/O — reading `file://` media, waiting on its
//! job doorbell — goes through one io_uring owned by the core's thread, so a
//! slow disk never stalls the image kernel and sleeping costs one
//! `io_uring_enter`. A read of the job doorbell's eventfd stays queued at all
//! times; when the core has nothing to do it waits for one completion, which
//! is either that read (a submitter rang) or a file operation finishing.
//!
//! A file read is a small state machine, one queued operation at a time:
//! `openat(O_NOFOLLOW|O_NONBLOCK)` (skipped for a descriptor the caller
//! opened, as the `file://` confinement does) → `statx` (regular file? size within the
//! cap?) → `read`s until end of file (one byte of slack detects growth) →
//! `close` (not awaited). Every buffer an operation points into (path, statx
//! buffer, data, doorbell counter) is owned by the core and outlives the
//! operation: shutdown waits for every queued operation to complete before
//! the ring and the buffers are dropped.

use std::ffi::CString;
use std::os::fd::{BorrowedFd, IntoRawFd};
use std::os::unix::ffi::OsStrExt;
use std::time::Instant;

use io_uring::{IoUring, opcode, squeue, types};
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use tokio::sync::oneshot;

use super::core::{CoreWorker, MAX_FILES_IN_FLIGHT, execute};
use super::files::{OPEN_FLAGS, check_metadata, finish_read};
use super::job::{FileRead, FileReadError, FileSource, JobError, JobResult, Output, Work};

/// Submission queue entries per core.
const RING_ENTRIES: u32 = 256;
/// `user_data` of the job doorbell's eventfd read.
const DOORBELL: u64 = u64::MAX;
/// `user_data` of fire-and-forget closes.
const CLOSE: u64 = u64::MAX - 1;
/// Largest single read request.
const MAX_READ_CHUNK: usize = 1 << 30;

/// Creates a core's ring.
pub(crate) fn new_ring() -> std::io::Result<IoUring> {
    IoUring::new(RING_ENTRIES)
}

/// Checks once, at start-up, that io_uring can be set up here (Docker's
/// default seccomp profile forbids it) and supports the operations the
/// cores queue.
pub(crate) fn probe() -> Result<(), String> {
    let ring = IoUring::new(8).map_err(|error| format!("io_uring_setup failed: {error}"))?;
    let mut probe = io_uring::Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|error| format!("cannot probe io_uring opcodes: {error}"))?;
    for (name, code) in [
        ("openat", opcode::OpenAt::CODE),
        ("statx", opcode::Statx::CODE),
        ("read", opcode::Read::CODE),
        ("close", opcode::Close::CODE),
    ] {
        if !probe.is_supported(code) {
            return Err(format!("this kernel's io_uring lacks {name}"));
        }
    }
    Ok(())
}

/// Queues `entry`, submitting first if the submission queue is full.
///
/// # Safety
/// Every buffer `entry` points into must stay valid until its completion is
/// reaped.
unsafe fn push(ring: &mut IoUring, entry: &squeue::Entry) {
    loop {
        // SAFETY: forwarded from the caller.
        if unsafe { ring.submission().push(entry) }.is_ok() {
            return;
        }
        if let Err(error) = ring.submit() {
            tracing::warn!(%error, "io_uring submit failed while the queue was full");
        }
    }
}

/// Where a file read is.
#[derive(Debug)]
enum Stage {
    Opening,
    Statting,
    Reading,
}

/// One file read in flight.
struct FileOp {
    reply: oneshot::Sender<JobResult>,
    path: CString,
    max_bytes: usize,
    stage: Stage,
    fd: i32,
    statx: Box<libc::statx>,
    data: Vec<u8>,
}

/// The core's file reads in flight, indexed by `user_data`.
#[derive(Default)]
struct FileOps {
    slots: Vec<Option<FileOp>>,
    free: Vec<usize>,
    live: usize,
}

impl FileOps {
    fn len(&self) -> usize {
        self.live
    }

    /// Starts reading `request`; an unusable path completes at once.
    fn start(
        &mut self,
        ring: &mut IoUring,
        request: FileRead,
        reply: oneshot::Sender<JobResult>,
    ) -> Option<(oneshot::Sender<JobResult>, JobResult)> {
        let (path, fd) = match request.source {
            FileSource::Path(path) => match CString::new(path.as_os_str().as_bytes()) {
                Ok(path) => (path, -1),
                Err(_) => {
                    let error = FileReadError::Io("the path contains a NUL byte".to_owned());
                    return Some((reply, Err(JobError::File(error))));
                }
            },
            // The op owns the descriptor from here and closes it when done.
            FileSource::Opened(fd) => (CString::default(), fd.into_raw_fd()),
        };
        let index = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        // SAFETY: statx is plain data; zeroed is a valid value.
        let statx: Box<libc::statx> = Box::new(unsafe { std::mem::zeroed() });
        let op = self.slots[index].insert(FileOp {
            reply,
            path,
            max_bytes: request.max_bytes,
            stage: Stage::Opening,
            fd,
            statx,
            data: Vec::new(),
        });
        self.live += 1;
        if op.fd >= 0 {
            Self::queue_statx(ring, index, op);
            return None;
        }
        let entry = opcode::OpenAt::new(types::Fd(libc::AT_FDCWD), op.path.as_ptr())
            .flags(OPEN_FLAGS)
            .build()
            .user_data(index as u64);
        // SAFETY: the path lives in the slot until the op completes.
        unsafe { push(ring, &entry) };
        None
    }

    /// Moves the op at `index` on after its operation completed with
    /// `result`; returns the reply and outcome when the op is done.
    fn advance(
        &mut self,
        ring: &mut IoUring,
        index: usize,
        result: i32,
    ) -> Option<(oneshot::Sender<JobResult>, JobResult)> {
        let op = self.slots.get_mut(index)?.as_mut()?;
        let step = match op.stage {
            Stage::Opening => Self::opened(ring, index, op, result),
            Stage::Statting => Self::statted(ring, index, op, result),
            Stage::Reading => Self::read_some(ring, index, op, result),
        };
        let outcome = step.err()?;
        let op = self.slots[index].take()?;
        self.free.push(index);
        self.live -= 1;
        if op.fd >= 0 {
            let close = opcode::Close::new(types::Fd(op.fd))
                .build()
                .user_data(CLOSE);
            // SAFETY: close points into no buffer.
            unsafe { push(ring, &close) };
        }
        let result = outcome.map(Output::File).map_err(JobError::File);
        Some((op.reply, result))
    }

    /// `Ok(())`: another operation was queued. `Err(outcome)`: finished.
    fn opened(
        ring: &mut IoUring,
        index: usize,
        op: &mut FileOp,
        result: i32,
    ) -> Result<(), Result<super::job::FileContents, FileReadError>> {
        if result < 0 {
            return Err(Err(FileReadError::from_errno(-result)));
        }
        op.fd = result;
        Self::queue_statx(ring, index, op);
        Ok(())
    }

    fn queue_statx(ring: &mut IoUring, index: usize, op: &mut FileOp) {
        op.stage = Stage::Statting;
        let entry = opcode::Statx::new(
            types::Fd(op.fd),
            c"".as_ptr(),
            (&raw mut *op.statx).cast::<types::statx>(),
        )
        .flags(libc::AT_EMPTY_PATH)
        .mask(libc::STATX_TYPE | libc::STATX_SIZE)
        .build()
        .user_data(index as u64);
        // SAFETY: the statx buffer is boxed in the slot until completion; the
        // empty path is a static.
        unsafe { push(ring, &entry) };
    }

    fn statted(
        ring: &mut IoUring,
        index: usize,
        op: &mut FileOp,
        result: i32,
    ) -> Result<(), Result<super::job::FileContents, FileReadError>> {
        if result < 0 {
            return Err(Err(FileReadError::from_errno(-result)));
        }
        let mode = u32::from(op.statx.stx_mode);
        let regular = mode & libc::S_IFMT == libc::S_IFREG;
        check_metadata(regular, op.statx.stx_size, op.max_bytes).map_err(Err)?;
        // Regular files never block on open; reads should wait for the disk
        // (in io_uring's workers), not fail with EAGAIN.
        // SAFETY: `op.fd` is owned by this op (opened by io_uring or handed
        // over by the caller), which closes it only after its last read; it
        // stays open while `fd` is borrowed here.
        let fd = unsafe { BorrowedFd::borrow_raw(op.fd) };
        if let Ok(flags) = fcntl(fd, FcntlArg::F_GETFL) {
            let flags = OFlag::from_bits_retain(flags) - OFlag::O_NONBLOCK;
            let _ = fcntl(fd, FcntlArg::F_SETFL(flags));
        }
        // One byte beyond the declared size, so growth shows up as a full
        // buffer instead of going unnoticed.
        let expected = op.statx.stx_size as usize;
        let limit = op.max_bytes.saturating_add(1);
        op.data = Vec::with_capacity(expected.saturating_add(1).min(limit).max(1));
        op.stage = Stage::Reading;
        Self::queue_read(ring, index, op);
        Ok(())
    }

    fn read_some(
        ring: &mut IoUring,
        index: usize,
        op: &mut FileOp,
        result: i32,
    ) -> Result<(), Result<super::job::FileContents, FileReadError>> {
        if result < 0 {
            if -result == libc::EINTR || -result == libc::EAGAIN {
                Self::queue_read(ring, index, op);
                return Ok(());
            }
            return Err(Err(FileReadError::from_errno(-result)));
        }
        if result == 0 {
            return Err(finish_read(std::mem::take(&mut op.data), op.max_bytes));
        }
        let filled = op.data.len() + result as usize;
        // SAFETY: the kernel initialised `result` more bytes after the
        // current length (within the capacity the read was given).
        unsafe { op.data.set_len(filled) };
        if filled > op.max_bytes {
            return Err(Err(FileReadError::TooLarge {
                len: filled as u64,
                max_bytes: op.max_bytes,
            }));
        }
        if op.data.len() == op.data.capacity() {
            // The file grew past its declared size: keep reading, up to the
            // cap plus one byte.
            let more = op
                .data
                .capacity()
                .min(op.max_bytes + 1 - op.data.len())
                .max(1);
            op.data.reserve_exact(more);
        }
        Self::queue_read(ring, index, op);
        Ok(())
    }

    fn queue_read(ring: &mut IoUring, index: usize, op: &mut FileOp) {
        let offset = op.data.len();
        let spare = op.data.spare_capacity_mut();
        let len = spare.len().min(MAX_READ_CHUNK) as u32;
        let entry = opcode::Read::new(types::Fd(op.fd), spare.as_mut_ptr().cast::<u8>(), len)
            .offset(offset as u64)
            .build()
            .user_data(index as u64);
        // SAFETY: the data vector lives in the slot and is not resized until
        // this read completes.
        unsafe { push(ring, &entry) };
    }
}

/// The core's loop with io_uring.
pub(crate) fn run(mut worker: CoreWorker, mut ring: IoUring) {
    let mut files = FileOps::default();
    let mut doorbell_count: Box<u64> = Box::new(0);
    let doorbell_fd = std::os::fd::AsRawFd::as_raw_fd(&worker.shared.jobs_bell);
    let arm_doorbell = |ring: &mut IoUring, count: &mut Box<u64>| {
        let entry = opcode::Read::new(types::Fd(doorbell_fd), (&raw mut **count).cast::<u8>(), 8)
            .build()
            .user_data(DOORBELL);
        // SAFETY: the counter is boxed and lives until the loop has reaped
        // this read (see the end of this function).
        unsafe { push(ring, &entry) };
    };
    arm_doorbell(&mut ring, &mut doorbell_count);
    let mut reaped: Vec<(u64, i32)> = Vec::with_capacity(64);
    let mut idle_since: Option<Instant> = None;
    let mut doorbell_armed = true;
    loop {
        let mut progress = reap(&mut ring, &mut reaped);
        for &(user_data, result) in &reaped {
            if on_completion(&mut worker, &mut ring, &mut files, user_data, result) {
                worker.shared.jobs_bell.woke();
                doorbell_armed = false;
                if !worker.closed() {
                    arm_doorbell(&mut ring, &mut doorbell_count);
                    doorbell_armed = true;
                }
            }
        }
        progress |= worker.flush_backlog();
        if worker.closed() {
            break;
        }
        while !worker.backlogged() && files.len() < MAX_FILES_IN_FLIGHT {
            let Some(job) = worker.next_job() else { break };
            progress = true;
            match job.work {
                Work::ReadFile(request) => {
                    if let Some((reply, outcome)) = files.start(&mut ring, request, job.reply) {
                        worker.complete(reply, outcome);
                    }
                }
                work => {
                    let heavy = work.is_heavy();
                    let outcome = execute(work, worker.settings.index, &mut worker.scratch);
                    worker.complete(job.reply, outcome);
                    if heavy {
                        // Let queued I/O move before the next image.
                        break;
                    }
                }
            }
        }
        if let Err(error) = ring.submit() {
            tracing::warn!(%error, "io_uring submit failed");
        }
        if progress {
            idle_since = None;
            continue;
        }
        if worker.idle(&mut idle_since) {
            worker.sleep_unless_work(|| {
                if let Err(error) = ring.submit_and_wait(1)
                    && error.raw_os_error() != Some(libc::EINTR)
                {
                    tracing::warn!(%error, "io_uring wait failed");
                }
            });
            idle_since = None;
        }
    }
    // Shutdown: take no more jobs; let every queued operation complete so no
    // buffer is freed under the kernel. Writing the doorbell completes its
    // queued read.
    if doorbell_armed {
        worker.shared.jobs_bell.ring_always();
    }
    while files.len() > 0 || doorbell_armed {
        if let Err(error) = ring.submit_and_wait(1)
            && error.raw_os_error() != Some(libc::EINTR)
        {
            tracing::error!(%error, "io_uring wait failed during shutdown");
            break;
        }
        reap(&mut ring, &mut reaped);
        for &(user_data, result) in &reaped {
            if on_completion(&mut worker, &mut ring, &mut files, user_data, result) {
                doorbell_armed = false;
            }
        }
    }
    // Queued closes complete on their own; nothing of ours is referenced.
    let _ = ring.submit();
    drop(doorbell_count);
    worker.finish();
}

/// Handles one reaped completion, for the running loop and the shutdown
/// drain alike: a file operation moves on (and is answered when it is
/// done), a close needs nothing. Returns true for the doorbell's read,
/// which each caller handles its own way.
fn on_completion(
    worker: &mut CoreWorker,
    ring: &mut IoUring,
    files: &mut FileOps,
    user_data: u64,
    result: i32,
) -> bool {
    match user_data {
        DOORBELL => return true,
        CLOSE => {}
        index => {
            if let Some((reply, outcome)) = files.advance(ring, index as usize, result) {
                worker.complete(reply, outcome);
            }
        }
    }
    false
}

/// Collects the completion queue into `into`; true if anything completed.
fn reap(ring: &mut IoUring, into: &mut Vec<(u64, i32)>) -> bool {
    into.clear();
    into.extend(ring.completion().map(|cqe| (cqe.user_data(), cqe.result())));
    !into.is_empty()
}
