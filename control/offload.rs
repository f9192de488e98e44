//! CPU-heavy request work (parsing and converting a large body, a chat's
//! tools or a Responses input and history, rendering a chat template,
//! tokenizing a long prompt, freeing what they built) off the async worker
//! threads, with bounded concurrency.
//!
//! Why it exists: the control plane runs few tokio worker threads (one per
//! core the data plane leaves, so one on a two-core machine), and every
//! request's I/O is driven by them. Work that holds one of them for
//! hundreds of milliseconds (tokenizing megabytes of text, a template
//! looping through its budget) stalls every other request on that thread:
//! an adversarial probe saw a huge prompt raise other requests' median
//! latency from 4 ms to 365 ms.
//!
//! The rule is by size. Small work stays inline: a hop to the blocking pool
//! costs microseconds and two context switches, which is most of what a
//! short chat's preparation costs, and the gateway's throughput is
//! benchmarked. Work on more than [`Offload::INLINE_BYTES`] of text goes to
//! tokio's blocking pool, at most [`Offload::concurrency`] at a time (the
//! CPU count): a burst of huge prompts queues for a slot rather than
//! oversubscribing the cores the request threads need too. Waiting for a
//! slot is a future, so a client that disconnects leaves the queue at once;
//! work that has started runs to its end (a thread cannot be interrupted)
//! and keeps its slot until then, so the bound holds.
//!
//! The work runs on the gate's own threads (one per slot), not tokio's
//! blocking pool, at a lower scheduling priority (nice 10 by default,
//! `--cpu-work-nice`): under contention the kernel gives the request
//! threads, which drive every client's I/O, about ten times their share
//! of a core, so four clients sending 10 MB bodies back to back slow the
//! others' requests less. Idle cores still run the work at full speed.
//!
//! Chat templates cannot be sized by their input (a small conversation may
//! drive a template into a long loop), so they are first rendered inline on
//! a small fuel budget and, when that runs out, again here on the full one
//! (see `crate::tokenizer`'s `RenderBudget`).

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use smg_dataplane::runtime::{CoreId, confine_current_thread, lower_current_thread_priority};
use tokio::sync::Semaphore;

use crate::error::{Error, Result};
use crate::metrics;

/// The gate CPU-heavy request work passes through. Cheap to clone: clones
/// share the slots.
#[derive(Debug, Clone)]
pub struct Offload {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    slots: Arc<Semaphore>,
    concurrency: usize,
    waiting: AtomicUsize,
    running: AtomicUsize,
    /// The gate's threads take work from here; they end when the last
    /// clone of the gate is dropped (and the sender with it).
    jobs: Mutex<mpsc::Sender<Job>>,
}

type Job = Box<dyn FnOnce() + Send>;

/// Where and how the gate's threads run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkThreads {
    /// The nice value they run at (0: the process's own).
    pub nice: u8,
    /// The cores they may run on (empty: any).
    pub cores: Vec<CoreId>,
}

impl WorkThreads {
    /// `--cpu-work-nice`'s default.
    pub const DEFAULT_NICE: u8 = 10;
}

impl Offload {
    /// Text (in bytes) up to which tokenizing runs on the request's own
    /// thread: well under a millisecond of encoding.
    pub const INLINE_BYTES: usize = 64 * 1024;

    /// A gate letting `concurrency` (at least 1) pieces of work run at
    /// once, on threads at the process's own priority (tests).
    pub fn new(concurrency: usize) -> Self {
        Self::with_threads(concurrency, &WorkThreads::default())
    }

    /// A gate letting `concurrency` (at least 1) pieces of work run at
    /// once, on as many threads set up as `threads` says.
    pub fn with_threads(concurrency: usize, threads: &WorkThreads) -> Self {
        let concurrency = concurrency.max(1);
        let (sender, receiver) = mpsc::channel::<Job>();
        let receiver = Arc::new(Mutex::new(receiver));
        for index in 0..concurrency {
            let receiver = Arc::clone(&receiver);
            let threads = threads.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("smg-cpu-work-{index}"))
                .spawn(move || work_thread(&threads, &receiver));
            if let Err(err) = spawned {
                // Fewer threads only means less parallel work; with none,
                // `run` answers every job with an error.
                tracing::warn!(%err, "cannot start a CPU work thread");
            }
        }
        Self {
            shared: Arc::new(Shared {
                slots: Arc::new(Semaphore::new(concurrency)),
                concurrency,
                waiting: AtomicUsize::new(0),
                running: AtomicUsize::new(0),
                jobs: Mutex::new(sender),
            }),
        }
    }

    /// A gate with one slot per CPU this process may use, its threads at
    /// the default nice value.
    pub fn for_host() -> Self {
        Self::for_host_with(&WorkThreads {
            nice: WorkThreads::DEFAULT_NICE,
            cores: Vec::new(),
        })
    }

    /// A gate with one slot per CPU this process may use, its threads set
    /// up as `threads` says.
    pub fn for_host_with(threads: &WorkThreads) -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        Self::with_threads(cpus, threads)
    }

    /// How many pieces of work may run at once.
    pub fn concurrency(&self) -> usize {
        self.shared.concurrency
    }

    /// Whether work on `bytes` of text is small enough to run inline.
    pub fn is_small(bytes: usize) -> bool {
        bytes <= Self::INLINE_BYTES
    }

    /// Runs `work` inline when `bytes` [is small](Offload::is_small), else
    /// [off the request threads](Offload::run).
    pub async fn run_sized<T: Send + 'static>(
        &self,
        bytes: usize,
        work: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.run_when(!Self::is_small(bytes), work).await
    }

    /// Runs `work` [off the request threads](Offload::run) when `heavy`,
    /// else inline: for work whose size the caller judged by more than
    /// one length (a body and the history it continues, say).
    pub async fn run_when<T: Send + 'static>(
        &self,
        heavy: bool,
        work: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        if heavy { self.run(work).await } else { work() }
    }

    /// Drops `value` on the blocking pool, through the gate: freeing a
    /// tree of allocations as large as a request body (parsed JSON, the
    /// chat messages built from it) costs about what building it did, and
    /// would hold a request thread as long. Outside a runtime (or once it
    /// shuts down) the value is dropped where it is.
    pub fn drop_later<T: Send + 'static>(&self, value: T) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let offload = self.clone();
        runtime.spawn(async move {
            // The gate only fails once closed; the value is dropped either way.
            let _ = offload
                .run(move || {
                    drop(value);
                    Ok(())
                })
                .await;
        });
    }

    /// Runs `work` on the blocking pool once a slot is free. Dropping the
    /// returned future while it waits gives up its place; once `work` has
    /// started it finishes, holding its slot.
    pub async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let slot = {
            let _waiting = Counted::enter(&self.shared, |s| &s.waiting);
            Arc::clone(&self.shared.slots)
                .acquire_owned()
                .await
                .map_err(|_| Error::internal("the CPU work gate is closed"))?
        };
        let shared = Arc::clone(&self.shared);
        let (done, outcome) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let outcome = {
                let _running = Counted::enter(&shared, |s| &s.running);
                let _slot = slot;
                // A panic is this job's failure, not the thread's end.
                std::panic::catch_unwind(AssertUnwindSafe(work))
            };
            // The counts and the slot are released before the caller
            // hears the outcome.
            let _ = done.send(outcome);
        });
        let sent = match self.shared.jobs.lock() {
            Ok(jobs) => jobs.send(job).is_ok(),
            Err(_) => false,
        };
        if !sent {
            return Err(Error::internal("the CPU work threads are gone"));
        }
        match outcome.await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(Error::internal("a CPU work task panicked")),
            Err(_) => Err(Error::internal("a CPU work task was dropped unrun")),
        }
    }

    /// Work waiting for a slot.
    pub fn waiting(&self) -> usize {
        self.shared.waiting.load(Ordering::Relaxed)
    }

    /// Work running.
    pub fn running(&self) -> usize {
        self.shared.running.load(Ordering::Relaxed)
    }
}

impl Default for Offload {
    fn default() -> Self {
        Self::for_host()
    }
}

/// A gate's thread: set up once, then runs jobs until the gate is gone.
fn work_thread(threads: &WorkThreads, jobs: &Mutex<mpsc::Receiver<Job>>) {
    confine_current_thread(&threads.cores);
    if threads.nice > 0 && !lower_current_thread_priority(threads.nice) {
        tracing::warn!(
            nice = threads.nice,
            "cannot lower a CPU work thread's priority (--cpu-work-nice)"
        );
    }
    loop {
        // One thread waits in `recv` while the others wait for the lock;
        // the lock is let go before the job runs.
        let job = match jobs.lock() {
            Ok(receiver) => receiver.recv(),
            Err(_) => return,
        };
        match job {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}

/// One unit of a counter for as long as it lives, mirrored to the gauges.
struct Counted<'a> {
    shared: &'a Shared,
    counter: fn(&Shared) -> &AtomicUsize,
}

impl<'a> Counted<'a> {
    fn enter(shared: &'a Shared, counter: fn(&Shared) -> &AtomicUsize) -> Self {
        counter(shared).fetch_add(1, Ordering::Relaxed);
        publish(shared);
        Self { shared, counter }
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        (self.counter)(self.shared).fetch_sub(1, Ordering::Relaxed);
        publish(self.shared);
    }
}

fn publish(shared: &Shared) {
    metrics::record_cpu_work(
        shared.running.load(Ordering::Relaxed),
        shared.waiting.load(Ordering::Relaxed),
    );
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn small_work_runs_inline_and_large_work_on_another_thread() {
        let offload = Offload::new(1);
        let here = std::thread::current().id();
        let inline = offload
            .run_sized(Offload::INLINE_BYTES, move || {
                Ok(std::thread::current().id())
            })
            .await
            .expect("runs");
        assert_eq!(inline, here);
        let off = offload
            .run_sized(Offload::INLINE_BYTES + 1, move || {
                Ok(std::thread::current().id())
            })
            .await
            .expect("runs");
        assert_ne!(off, here);
        assert_eq!(offload.running() + offload.waiting(), 0);
    }

    #[tokio::test]
    async fn work_beyond_the_slots_queues_and_a_dropped_waiter_leaves() {
        let offload = Offload::new(1);
        // The first piece of work holds the only slot until released.
        let (started_tx, started_rx) = mpsc::channel::<()>();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let first = tokio::spawn({
            let offload = offload.clone();
            async move {
                offload
                    .run(move || {
                        started_tx.send(()).expect("the test waits");
                        release_rx.recv().expect("the test releases");
                        Ok(1)
                    })
                    .await
            }
        });
        tokio::task::spawn_blocking(move || started_rx.recv())
            .await
            .expect("joined")
            .expect("the first work started");
        assert_eq!(offload.running(), 1);

        // A second one waits for the slot; it never runs if dropped.
        let ran = Arc::new(AtomicUsize::new(0));
        let second = tokio::spawn({
            let offload = offload.clone();
            let ran = Arc::clone(&ran);
            async move {
                offload
                    .run(move || {
                        ran.fetch_add(1, Ordering::Relaxed);
                        Ok(2)
                    })
                    .await
            }
        });
        while offload.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        second.abort();
        assert!(second.await.expect_err("aborted").is_cancelled());
        assert_eq!(offload.waiting(), 0, "the cancelled waiter left the queue");

        // A third one waits, and runs once the first releases the slot.
        let third = tokio::spawn({
            let offload = offload.clone();
            async move { offload.run(|| Ok(3)).await }
        });
        while offload.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        release_tx.send(()).expect("the first work waits");
        assert_eq!(first.await.expect("joined").expect("ran"), 1);
        assert_eq!(third.await.expect("joined").expect("ran"), 3);
        assert_eq!(ran.load(Ordering::Relaxed), 0, "the dropped work never ran");
        assert_eq!(offload.running() + offload.waiting(), 0);
    }

    /// The calling thread's nice value, from `/proc/thread-self/stat`
    /// (field 19; the command name before it may hold spaces).
    fn own_nice() -> i64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        // Fields from the third on: state is index 0, nice is field 19.
        after_name.split(' ').nth(16).unwrap().parse().unwrap()
    }

    #[tokio::test]
    async fn work_runs_on_the_gates_threads_at_their_nice_value() {
        let here = own_nice();
        let offload = Offload::with_threads(
            2,
            &WorkThreads {
                nice: 7,
                cores: Vec::new(),
            },
        );
        for _ in 0..4 {
            let (name, nice) = offload
                .run(|| {
                    let name = std::thread::current().name().map(str::to_owned);
                    Ok((name, own_nice()))
                })
                .await
                .unwrap();
            assert!(name.unwrap().starts_with("smg-cpu-work-"));
            // Lowering is always allowed; a test run already niced above
            // 7 stays where it is.
            assert_eq!(nice, here.max(7));
        }
        assert_eq!(own_nice(), here, "the caller's thread is untouched");
        // Nice 0 leaves the threads as the process is.
        let plain = Offload::new(1);
        assert_eq!(plain.run(|| Ok(own_nice())).await.unwrap(), here);
    }

    #[tokio::test]
    async fn a_panicking_job_fails_alone_and_its_thread_serves_on() {
        let offload = Offload::new(1);
        let err = offload
            .run(|| -> Result<()> { panic!("a bug in some work") })
            .await
            .expect_err("fails");
        assert_eq!(err.code, crate::error::ErrorCode::InternalError);
        assert_eq!(offload.run(|| Ok(5)).await.unwrap(), 5);
        assert_eq!(offload.running() + offload.waiting(), 0);
    }

    #[tokio::test]
    async fn errors_come_back_as_they_were() {
        let offload = Offload::new(2);
        let err = offload
            .run(|| Err::<(), _>(Error::invalid_request("no")))
            .await
            .expect_err("fails");
        assert_eq!(err.code, crate::error::ErrorCode::InvalidRequest);
    }
}
