//! One data-plane core: a pinned thread that pops jobs from its ring, runs
//! them, and pushes completions to its reactor.
//!
//! Why it exists: this is the loop the whole split is for. It owns its job
//! ring's consumer end, its completion ring's producer end and (with the
//! io_uring backend) its own ring in the kernel, so nothing on the hot path
//! is shared with another thread except through those rings' atomics.
//!
//! The loop, in either backend: reap I/O completions, flush completions that
//! found the completion ring full, take jobs (a bounded number of file reads
//! in flight, one image at a time so I/O keeps moving between images), and
//! when there was nothing to do, spin for [`CoreSettings::spin`], then
//! announce sleep on the job doorbell and block (in `io_uring_enter` with the
//! doorbell's eventfd read queued, or in `poll` without io_uring).

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use smg_shared::doorbell::Doorbell;
use smg_shared::ring::{Full, RingReceiver, RingSender};
use tokio::sync::oneshot;

use super::job::{
    Completion, Destination, ImageJob, Job, JobError, JobResult, LaneImage, Output, Work,
};
use super::{files, inline};
use crate::lanes::{self, WriteError};
use crate::preprocess::ScratchSpace;

/// File reads one core keeps in flight at most.
pub(crate) const MAX_FILES_IN_FLIGHT: usize = 64;
/// How long the core naps when its completion ring is full (the reactor is
/// behind); it takes no new jobs meanwhile.
const BACKLOG_NAP: Duration = Duration::from_micros(100);

/// The state of one core that the control plane also touches: doorbells,
/// the shutdown flags and counters. Everything else is the thread's own.
#[derive(Debug)]
pub(crate) struct CoreShared {
    /// Rung by submitters; the core sleeps on it.
    pub jobs_bell: Doorbell,
    /// Rung by the core; the reactor sleeps on it.
    pub done_bell: Doorbell,
    /// Set once at shutdown: submitters stop, the core winds down.
    pub closed: AtomicBool,
    /// Submitters between checking `closed` and finishing their push; the
    /// core waits for zero before its final drain, so no job is left behind.
    pub submitters: AtomicUsize,
    /// Set by the core after its last completion: the reactor may stop.
    pub exited: AtomicBool,
    pub completed: AtomicU64,
    pub skipped_cancelled: AtomicU64,
}

impl CoreShared {
    pub(crate) fn new() -> std::io::Result<Self> {
        Ok(Self {
            jobs_bell: Doorbell::blocking()?,
            done_bell: Doorbell::nonblocking()?,
            closed: AtomicBool::new(false),
            submitters: AtomicUsize::new(0),
            exited: AtomicBool::new(false),
            completed: AtomicU64::new(0),
            skipped_cancelled: AtomicU64::new(0),
        })
    }
}

/// Per-core tuning.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CoreSettings {
    /// Busy-poll this long after the last work before sleeping.
    pub spin: Duration,
    /// This core's index: its share of each lane.
    pub index: usize,
}

/// The core's side of its rings, shared by both loop backends.
pub(crate) struct CoreWorker {
    pub shared: Arc<CoreShared>,
    pub jobs: RingReceiver<Job>,
    pub completions: RingSender<Completion>,
    /// Completions that found the completion ring full, oldest first. While
    /// it is non-empty the core takes no new jobs, so it stays bounded.
    backlog: VecDeque<Completion>,
    pub settings: CoreSettings,
    /// The image kernels' buffers, reused from job to job on this core.
    pub scratch: ScratchSpace,
}

impl std::fmt::Debug for CoreWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreWorker")
            .field("backlog", &self.backlog.len())
            .finish_non_exhaustive()
    }
}

impl CoreWorker {
    pub(crate) fn new(
        shared: Arc<CoreShared>,
        jobs: RingReceiver<Job>,
        completions: RingSender<Completion>,
        settings: CoreSettings,
    ) -> Self {
        Self {
            shared,
            jobs,
            completions,
            backlog: VecDeque::new(),
            settings,
            scratch: ScratchSpace::default(),
        }
    }

    pub(crate) fn closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    /// Sends a finished job's result toward its waiter.
    pub(crate) fn complete(&mut self, reply: oneshot::Sender<JobResult>, result: JobResult) {
        self.shared.completed.fetch_add(1, Ordering::Relaxed);
        let completion = Completion { reply, result };
        if !self.backlog.is_empty() {
            self.backlog.push_back(completion);
            return;
        }
        match self.completions.try_push(completion) {
            Ok(()) => self.shared.done_bell.ring(),
            Err(Full(completion)) => self.backlog.push_back(completion),
        }
    }

    /// Retries completions that found the ring full; true if any went out.
    pub(crate) fn flush_backlog(&mut self) -> bool {
        let mut sent = false;
        while let Some(completion) = self.backlog.pop_front() {
            match self.completions.try_push(completion) {
                Ok(()) => sent = true,
                Err(Full(completion)) => {
                    self.backlog.push_front(completion);
                    break;
                }
            }
        }
        if sent {
            self.shared.done_bell.ring();
        }
        sent
    }

    pub(crate) fn backlogged(&self) -> bool {
        !self.backlog.is_empty()
    }

    /// The next job whose waiter still wants it (a dropped request's jobs are
    /// skipped: their futures are gone, so no one needs a completion).
    pub(crate) fn next_job(&mut self) -> Option<Job> {
        loop {
            let job = self.jobs.try_pop()?;
            if job.reply.is_closed() {
                self.shared
                    .skipped_cancelled
                    .fetch_add(1, Ordering::Relaxed);
                continue;
            }
            return Some(job);
        }
    }

    /// Sleeps until a submitter rings, unless a job or shutdown arrived since
    /// the last look. `wait` blocks on the doorbell (backend-specific).
    pub(crate) fn sleep_unless_work(&self, wait: impl FnOnce()) {
        self.shared.jobs_bell.prepare_sleep();
        if !self.jobs.is_empty() || self.closed() {
            self.shared.jobs_bell.cancel_sleep();
            return;
        }
        wait();
    }

    /// Backs off when idle: spins until `idle_since + spin`, naps while the
    /// backlog is stuck; returns true once the caller should sleep.
    pub(crate) fn idle(&self, idle_since: &mut Option<Instant>) -> bool {
        if self.backlogged() {
            std::thread::sleep(BACKLOG_NAP);
            return false;
        }
        let since = *idle_since.get_or_insert_with(Instant::now);
        if since.elapsed() < self.settings.spin {
            std::hint::spin_loop();
            return false;
        }
        true
    }

    /// Shutdown, after the loop stopped taking jobs and finished its I/O:
    /// waits out submitters mid-push, fails every queued job (dropping its
    /// reply resolves the waiter with `ShuttingDown`), hands the reactor what
    /// completions fit, and tells it to stop.
    pub(crate) fn finish(mut self) {
        while self.shared.submitters.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        let mut refused = 0u64;
        while let Some(job) = self.jobs.try_pop() {
            drop(job);
            refused += 1;
        }
        self.flush_backlog();
        // Whatever still does not fit is dropped: its waiter sees ShuttingDown.
        self.backlog.clear();
        self.shared.exited.store(true, Ordering::SeqCst);
        self.shared.done_bell.ring_always();
        if refused > 0 {
            tracing::debug!(refused, "data-plane core refused queued jobs at shutdown");
        }
    }
}

/// Runs work that needs no I/O (or, in the plain backend, does its I/O with
/// blocking calls) on core `core`, with the core's scratch buffers. A
/// panic becomes an error and the core keeps serving.
pub(crate) fn execute(work: Work, core: usize, scratch: &mut ScratchSpace) -> JobResult {
    catch_unwind(AssertUnwindSafe(|| match work {
        Work::Ping => Ok(Output::Pong),
        #[cfg(feature = "testing")]
        Work::Hold(hold) => {
            hold.run();
            Ok(Output::Pong)
        }
        Work::ReadFile(request) => files::read_blocking(request)
            .map(Output::File)
            .map_err(JobError::File),
        Work::DecodeBase64(request) => inline::decode_and_hash(&request.encoded, request.max_bytes)
            .map(Output::File)
            .map_err(JobError::Base64),
        Work::Image(job) => run_image(job, core, scratch),
    }))
    .unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_owned());
        Err(JobError::Panicked(message))
    })
}

/// Plans from the header, takes the destination buffer at exactly the
/// planned size (from this core's share of the lane), and lets the kernel
/// write the tensor into it once, using the core's scratch buffers.
fn run_image(job: ImageJob, core: usize, scratch: &mut ScratchSpace) -> JobResult {
    let ImageJob {
        processor,
        bytes,
        dtype,
        destination,
    } = job;
    let plan = processor.plan(&bytes, dtype)?;
    match destination {
        Destination::Inline => {
            let mut data = vec![0u8; plan.out_bytes];
            processor.write_into_with(&plan, &bytes, &mut data, scratch)?;
            Ok(Output::Image(crate::preprocess::PreprocessedImage {
                plan,
                data,
            }))
        }
        Destination::Lane(choice) => {
            let tensor = lanes::write_through(Some(&choice), core, plan.out_bytes, |dst| {
                processor.write_into_with(&plan, &bytes, dst, scratch)
            })
            .map_err(|WriteError::Write(err)| JobError::Image(err))?;
            Ok(Output::LaneImage(LaneImage { plan, tensor }))
        }
    }
}

/// The fallback loop without io_uring: file reads are blocking calls on
/// this thread, the doorbell is waited on with `poll`.
pub(crate) fn run_plain(mut worker: CoreWorker) {
    let mut idle_since = None;
    loop {
        let mut progress = worker.flush_backlog();
        if worker.closed() {
            break;
        }
        while !worker.backlogged() {
            let Some(job) = worker.next_job() else { break };
            progress = true;
            let heavy = job.work.is_heavy();
            let result = execute(job.work, worker.settings.index, &mut worker.scratch);
            worker.complete(job.reply, result);
            if heavy {
                break;
            }
        }
        if progress {
            idle_since = None;
            continue;
        }
        if worker.idle(&mut idle_since) {
            worker.sleep_unless_work(|| {
                if let Err(error) = worker.shared.jobs_bell.wait(-1) {
                    tracing::warn!(%error, "data-plane doorbell wait failed");
                    std::thread::sleep(BACKLOG_NAP);
                }
            });
            idle_since = None;
        }
    }
    worker.finish();
}
