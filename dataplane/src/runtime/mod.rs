//! The data-plane runtime: N pinned threads, one io_uring each, fed through
//! bounded lock-free rings.
//!
//! Why it exists: everything that touches megabytes (reading an image file,
//! decoding it, writing its tensor) must stay off the tokio threads that
//! serve text requests. This module is the only way work crosses over.
//!
//! # Shape
//!
//! ```text
//!  tokio tasks ──submit──► job ring (MPSC, bounded) ──► core i: pinned thread, own io_uring
//!      ▲                       doorbell: eventfd,            │ runs the job (file read via
//!      │                       read queued on the uring      │ io_uring, image kernel)
//!      │                                                     ▼
//!  oneshot ◄── reactor i (tokio task) ◄── completion ring (SPSC, bounded)
//!              doorbell: eventfd watched by AsyncFd
//! ```
//!
//! - **Threads**: [`DataPlaneConfig::threads`] cores, each pinned to the core
//!   named in [`DataPlaneConfig::pin`] (see [`cores::CorePlan`], which
//!   enumerates the machine once and keeps the tokio runtime off those
//!   cores). Each owns its ring ends, its io_uring and its in-flight buffers.
//! - **Rings**: `smg_shared::ring`, our own bounded MPSC ring. Submitters
//!   pick the least-loaded core (a round-robin start breaks ties).
//! - **Doorbells**: `smg_shared::doorbell`. Consumers spin for
//!   [`DataPlaneConfig::spin`] after their last work, then announce sleep;
//!   producers write the eventfd only then, so a busy pipeline makes no
//!   syscalls for its hand-offs.
//! - **Backpressure**: a full job ring is never queued around. The submitter
//!   waits for a reactor to report that jobs moved on, up to
//!   [`DataPlaneConfig::submit_wait`], then fails with
//!   [`JobError::Busy`] (`dataplane_busy`).
//! - **Fallback**: [`IoBackend::Auto`] probes io_uring once at start-up; if
//!   it cannot be set up (e.g. Docker's default seccomp profile), every core
//!   runs a plain loop (blocking reads, `poll` on the doorbell) and one log
//!   line says so. [`IoBackend::Plain`] forces that loop (tests use it).
//! - **Shutdown**: [`DataPlane::shutdown`], or dropping the last clone,
//!   closes the rings to new jobs, lets each core finish its running job and
//!   its queued I/O, fails the jobs still queued (their futures resolve with
//!   [`JobError::ShuttingDown`]), delivers the last completions and joins
//!   the threads. No future is left hanging.

mod core;
pub mod cores;
mod files;
mod inline;
mod job;
mod reactor;
#[cfg(feature = "testing")]
pub mod testing;
mod uring;

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;

use smg_shared::ring::{self, Full, RingSender};
use smg_shared::tensor::DType;
use tokio::sync::oneshot;

use self::core::{CoreSettings, CoreShared, CoreWorker};
pub use self::cores::{
    CorePlan, confine_current_thread, default_dataplane_cores, lower_current_thread_priority,
};
pub use self::inline::padded_decoded_len;
pub use self::job::{
    Base64Decode, Base64Error, Destination, FileContents, FileRead, FileReadError, FileSource,
    ImageJob, JobError, JobResult, LaneImage, Output, Work,
};
use self::job::{Completion, Job};
use self::reactor::SpaceSignal;
use crate::preprocess::{PreprocessedImage, Qwen2VlImageProcessor};
pub use core_affinity::CoreId;

/// Which loop the cores run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoBackend {
    /// io_uring when it can be set up, else the plain loop (logged once).
    #[default]
    Auto,
    /// io_uring or fail to start.
    Uring,
    /// The plain loop: blocking reads, `poll` on the doorbell.
    Plain,
}

/// The loop the cores actually run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActiveBackend {
    Uring,
    Plain,
}

impl ActiveBackend {
    /// Its name in logs and flags (`uring`, `plain`).
    pub fn name(self) -> &'static str {
        match self {
            ActiveBackend::Uring => "uring",
            ActiveBackend::Plain => "plain",
        }
    }
}

/// How to build the data plane.
#[derive(Debug, Clone)]
pub struct DataPlaneConfig {
    /// Data-plane threads (at least 1).
    pub threads: usize,
    /// The core each thread is pinned to; threads beyond the list run
    /// unpinned.
    pub pin: Vec<CoreId>,
    /// Jobs each core's ring holds (rounded up to a power of two).
    pub ring_capacity: usize,
    /// How long a submitter waits for room when every ring is full.
    pub submit_wait: Duration,
    pub io: IoBackend,
    /// How long an idle core (and nothing else) busy-polls before sleeping.
    pub spin: Duration,
}

impl Default for DataPlaneConfig {
    fn default() -> Self {
        Self {
            threads: 1,
            pin: Vec::new(),
            ring_capacity: 64,
            submit_wait: Duration::from_secs(1),
            io: IoBackend::Auto,
            spin: Duration::from_micros(50),
        }
    }
}

impl DataPlaneConfig {
    /// The threads and pinning of a [`CorePlan`], defaults otherwise.
    pub fn for_plan(plan: &CorePlan) -> Self {
        Self {
            threads: plan.threads,
            pin: plan.dataplane.clone(),
            ..Self::default()
        }
    }
}

/// Why the data plane could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("io_uring was required (--dataplane-io uring) but is unavailable: {0}")]
    UringUnavailable(String),
    #[error("the data plane must be started inside a tokio runtime")]
    NoRuntime,
    #[error("cannot create the data plane's doorbells: {0}")]
    Doorbell(std::io::Error),
    #[error("cannot start a data-plane thread: {0}")]
    Thread(std::io::Error),
}

/// Jobs completed and skipped by one core (for tests and metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreStats {
    pub completed: u64,
    /// Jobs whose waiter was gone before they started.
    pub skipped_cancelled: u64,
}

/// A core as submitters see it.
struct CoreHandle {
    jobs: RingSender<Job>,
    shared: Arc<CoreShared>,
}

struct Inner {
    cores: Vec<CoreHandle>,
    next_core: AtomicUsize,
    space: Arc<SpaceSignal>,
    submit_wait: Duration,
    backend: ActiveBackend,
    closed: AtomicBool,
    /// Taken once, at shutdown (never on the hot path).
    threads: Mutex<Vec<JoinHandle<()>>>,
    thread_names: Vec<String>,
}

/// Numbers data planes within the process, for thread names.
static INSTANCES: AtomicUsize = AtomicUsize::new(0);

/// The running data plane. Cheap to clone; every clone submits to the same
/// cores. Dropping the last clone shuts it down (see [`shutdown`](Self::shutdown)).
#[derive(Clone)]
pub struct DataPlane {
    inner: Arc<Inner>,
}

impl fmt::Debug for DataPlane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataPlane")
            .field("threads", &self.inner.cores.len())
            .field("backend", &self.inner.backend)
            .finish_non_exhaustive()
    }
}

impl DataPlane {
    /// Starts the cores and, on the current tokio runtime, their reactors.
    pub fn start(config: DataPlaneConfig) -> Result<Self, StartError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| StartError::NoRuntime)?;
        let backend = choose_backend(config.io)?;
        let space = Arc::new(SpaceSignal::default());
        let mut cores = Vec::new();
        let mut threads = Vec::new();
        let mut thread_names = Vec::new();
        let instance = INSTANCES.fetch_add(1, Ordering::Relaxed);
        for index in 0..config.threads.max(1) {
            let shared = Arc::new(CoreShared::new().map_err(StartError::Doorbell)?);
            let (jobs, job_receiver) = ring::bounded::<Job>(config.ring_capacity);
            // Room for every queued job plus the core's in-flight reads, so
            // the core rarely has to hold completions back.
            let (done_sender, done_receiver) =
                ring::bounded::<Completion>(jobs.capacity() + core::MAX_FILES_IN_FLIGHT + 1);
            let settings = CoreSettings {
                spin: config.spin,
                index,
            };
            let worker = CoreWorker::new(Arc::clone(&shared), job_receiver, done_sender, settings);
            let pin = config.pin.get(index).copied();
            let name = format!("smg-dp{instance}.{index}");
            thread_names.push(name.clone());
            let thread = std::thread::Builder::new()
                .name(name)
                .spawn(move || core_main(index, pin, backend, worker))
                .map_err(StartError::Thread)?;
            threads.push(thread);
            runtime.spawn(reactor::run(
                done_receiver,
                Arc::clone(&shared),
                Arc::clone(&space),
            ));
            cores.push(CoreHandle { jobs, shared });
        }
        tracing::info!(
            threads = cores.len(),
            pinned = ?config.pin.iter().take(cores.len()).map(|c| c.id).collect::<Vec<_>>(),
            backend = backend.name(),
            ring_capacity = cores[0].jobs.capacity(),
            "data plane started"
        );
        Ok(Self {
            inner: Arc::new(Inner {
                cores,
                next_core: AtomicUsize::new(0),
                space,
                submit_wait: config.submit_wait,
                backend,
                closed: AtomicBool::new(false),
                threads: Mutex::new(threads),
                thread_names,
            }),
        })
    }

    pub fn backend(&self) -> ActiveBackend {
        self.inner.backend
    }

    pub fn threads(&self) -> usize {
        self.inner.cores.len()
    }

    /// The cores' thread names (`smg-dp<instance>.<core>`, as `top -H` and
    /// `/proc/<pid>/task/*/comm` show them).
    pub fn thread_names(&self) -> &[String] {
        &self.inner.thread_names
    }

    pub fn stats(&self) -> Vec<CoreStats> {
        self.inner
            .cores
            .iter()
            .map(|core| CoreStats {
                completed: core.shared.completed.load(Ordering::Relaxed),
                skipped_cancelled: core.shared.skipped_cancelled.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Runs `work` on a core and waits for its result. A full ring waits up
    /// to the configured deadline, then fails with [`JobError::Busy`].
    /// Dropping the future abandons the job (a core skips it if it has not
    /// started).
    pub async fn submit(&self, work: Work) -> JobResult {
        let (reply, result) = oneshot::channel();
        let mut job = Job { work, reply };
        job = match self.try_submit(job) {
            Ok(()) => return result.await.unwrap_or(Err(JobError::ShuttingDown)),
            Err(Err(error)) => return Err(error),
            Err(Ok(job)) => job,
        };
        let space = &self.inner.space;
        let deadline = tokio::time::Instant::now() + self.inner.submit_wait;
        loop {
            space.waiting.fetch_add(1, Ordering::SeqCst);
            let waited = {
                let notified = space.notify.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                // Pairs with the reactor's fence in `jobs_moved`.
                fence(Ordering::SeqCst);
                match self.try_submit(job) {
                    Ok(()) => None,
                    Err(Err(error)) => Some(Err(error)),
                    Err(Ok(back)) => {
                        let timed_out = tokio::time::timeout_at(deadline, notified).await.is_err();
                        Some(Ok((back, timed_out)))
                    }
                }
            };
            space.waiting.fetch_sub(1, Ordering::SeqCst);
            match waited {
                None => return result.await.unwrap_or(Err(JobError::ShuttingDown)),
                Some(Err(error)) => return Err(error),
                Some(Ok((back, timed_out))) => {
                    job = back;
                    if timed_out {
                        // One last look before giving up.
                        return match self.try_submit(job) {
                            Ok(()) => result.await.unwrap_or(Err(JobError::ShuttingDown)),
                            Err(Err(error)) => Err(error),
                            Err(Ok(_job)) => Err(JobError::Busy {
                                waited_ms: self.inner.submit_wait.as_millis() as u64,
                            }),
                        };
                    }
                }
            }
        }
    }

    /// Pushes `job` onto the least-loaded core's ring. `Err(Ok(job))`: every
    /// ring is full; `Err(Err(_))`: shutting down.
    fn try_submit(&self, job: Job) -> Result<(), Result<Job, JobError>> {
        let cores = &self.inner.cores;
        let start = self.inner.next_core.fetch_add(1, Ordering::Relaxed) % cores.len();
        let order = (0..cores.len()).map(|k| (start + k) % cores.len());
        let least_loaded = order
            .clone()
            .min_by_key(|&i| cores[i].jobs.len())
            .unwrap_or(start);
        let mut job = job;
        for index in std::iter::once(least_loaded).chain(order.filter(|&i| i != least_loaded)) {
            let core = &cores[index];
            // Announce the push before checking `closed`; the core waits for
            // zero announced pushes before its final drain (SeqCst on both
            // sides: either we see `closed` or the core sees us).
            core.shared.submitters.fetch_add(1, Ordering::SeqCst);
            if core.shared.closed.load(Ordering::SeqCst) {
                core.shared.submitters.fetch_sub(1, Ordering::SeqCst);
                return Err(Err(JobError::ShuttingDown));
            }
            let pushed = core.jobs.try_push(job);
            core.shared.submitters.fetch_sub(1, Ordering::SeqCst);
            match pushed {
                Ok(()) => {
                    core.shared.jobs_bell.ring();
                    return Ok(());
                }
                Err(Full(back)) => job = back,
            }
        }
        Err(Ok(job))
    }

    /// An empty job: measures the round trip through a core.
    pub async fn ping(&self) -> Result<(), JobError> {
        match self.submit(Work::Ping).await? {
            Output::Pong => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// Reads a whole file on a core (io_uring when available) and hashes it.
    pub async fn read_file(
        &self,
        path: PathBuf,
        max_bytes: usize,
    ) -> Result<FileContents, JobError> {
        self.read(FileSource::Path(path), max_bytes).await
    }

    /// Reads a whole file the caller already opened (and vetted), on a core,
    /// and hashes it; the core closes it.
    pub async fn read_opened(
        &self,
        file: std::os::fd::OwnedFd,
        max_bytes: usize,
    ) -> Result<FileContents, JobError> {
        self.read(FileSource::Opened(file), max_bytes).await
    }

    async fn read(&self, source: FileSource, max_bytes: usize) -> Result<FileContents, JobError> {
        match self
            .submit(Work::ReadFile(FileRead { source, max_bytes }))
            .await?
        {
            Output::File(contents) => Ok(contents),
            other => Err(unexpected(&other)),
        }
    }

    /// Decodes an inline base64 payload on a core and hashes it (at most
    /// `max_bytes` decoded; check the cap with [`padded_decoded_len`] before
    /// copying a payload over).
    pub async fn decode_base64(
        &self,
        encoded: Bytes,
        max_bytes: usize,
    ) -> Result<FileContents, JobError> {
        match self
            .submit(Work::DecodeBase64(Base64Decode { encoded, max_bytes }))
            .await?
        {
            Output::File(contents) => Ok(contents),
            other => Err(unexpected(&other)),
        }
    }

    /// Preprocesses an image on a core into `destination`.
    pub async fn preprocess_image(
        &self,
        processor: Arc<Qwen2VlImageProcessor>,
        bytes: Bytes,
        dtype: DType,
        destination: Destination,
    ) -> Result<PreprocessedImage, JobError> {
        let job = ImageJob {
            processor,
            bytes,
            dtype,
            destination,
        };
        match self.submit(Work::Image(job)).await? {
            Output::Image(image) => Ok(image),
            other => Err(unexpected(&other)),
        }
    }

    /// Preprocesses an image on a core straight into `choice`'s lane (small
    /// tensors, and tensors the lane cannot take, go inline; see
    /// [`crate::lanes::write_through`]).
    pub async fn preprocess_into_lane(
        &self,
        processor: Arc<Qwen2VlImageProcessor>,
        bytes: Bytes,
        dtype: DType,
        choice: crate::lanes::LaneChoice,
    ) -> Result<LaneImage, JobError> {
        let job = ImageJob {
            processor,
            bytes,
            dtype,
            destination: Destination::Lane(choice),
        };
        match self.submit(Work::Image(job)).await? {
            Output::LaneImage(image) => Ok(image),
            other => Err(unexpected(&other)),
        }
    }

    /// Stops taking jobs, lets the cores finish what runs, fails what is
    /// queued, and joins the threads. Blocks for at most one running job per
    /// core; idempotent.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }
}

impl Inner {
    fn shutdown(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            // Another caller is (or was) joining the threads.
            return;
        }
        for core in &self.cores {
            core.shared.closed.store(true, Ordering::SeqCst);
            core.shared.jobs_bell.ring_always();
        }
        // Submitters waiting for room learn about the shutdown now.
        self.space.notify.notify_waiters();
        let threads = match self.threads.lock() {
            Ok(mut threads) => std::mem::take(&mut *threads),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        };
        for thread in threads {
            if thread.join().is_err() {
                tracing::error!("a data-plane thread panicked");
            }
        }
        tracing::info!("data plane stopped");
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn unexpected(output: &Output) -> JobError {
    JobError::Panicked(format!(
        "a core answered with the wrong output kind: {output:?}"
    ))
}

/// Decides the backend once, before any thread starts.
fn choose_backend(io: IoBackend) -> Result<ActiveBackend, StartError> {
    match io {
        IoBackend::Plain => Ok(ActiveBackend::Plain),
        IoBackend::Uring => uring::probe()
            .map(|()| ActiveBackend::Uring)
            .map_err(StartError::UringUnavailable),
        IoBackend::Auto => match uring::probe() {
            Ok(()) => Ok(ActiveBackend::Uring),
            Err(reason) => {
                tracing::warn!(
                    %reason,
                    "io_uring is unavailable; the data plane falls back to a plain loop (blocking reads, poll)"
                );
                Ok(ActiveBackend::Plain)
            }
        },
    }
}

/// A data-plane thread: pin, set up the backend, run the loop.
fn core_main(index: usize, pin: Option<CoreId>, backend: ActiveBackend, worker: CoreWorker) {
    if let Some(core) = pin
        && !core_affinity::set_for_current(core)
    {
        tracing::warn!(
            index,
            core = core.id,
            "cannot pin a data-plane thread; it runs unpinned"
        );
    }
    match backend {
        ActiveBackend::Uring => match uring::new_ring() {
            Ok(ring) => uring::run(worker, ring),
            Err(error) => {
                tracing::warn!(index, %error, "this core's io_uring failed to start; it runs the plain loop");
                core::run_plain(worker);
            }
        },
        ActiveBackend::Plain => core::run_plain(worker),
    }
}
