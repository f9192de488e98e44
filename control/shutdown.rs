//! Graceful shutdown: the phases between the first SIGTERM and the exit, and
//! the handles listeners and requests use to take part in them.
//!
//! Why it exists: a generation may hold a GPU for minutes, so a restart must
//! neither cut the ones in flight short nor leave work running on the
//! workers for nobody; and a gateway that exits while its shm names are
//! still published leaves files in `/dev/shm` behind. The phases:
//!
//! 1. **Drain** (first SIGTERM or SIGINT). Every listener stops accepting
//!    and closes its socket, so new connections are refused; once all are
//!    closed, `/readiness` answers 503 (in that order: whoever sees the 503
//!    also finds the ports closed). Open connections finish the requests
//!    they carry, streams included, and close.
//! 2. **Cut** (`--shutdown-grace-period-secs` after the signal, or a second
//!    signal). Connections still open are dropped. Dropping a response drops
//!    its engine streams, whose guards send an Abort for every leg that had
//!    not finished (`pipeline::execution`).
//! 3. **Aborts.** Those Abort RPCs run as spawned tasks, and a process that
//!    exits first never sends them: they are waited for, within
//!    [`ABORT_WAIT`]. A second signal skips this wait.
//!
//! Then `server` stops the data plane and releases the tensor lanes, whose
//! pools remove the gateway's `/dev/shm` names as they drop.
//!
//! Work a request starts beside its handler (connections, HTTP/2 streams,
//! SSE producers, leg supervisors) runs on [`RequestTasks`], so "every
//! request has finished" is one wait rather than a guess, and so is "every
//! abort has been sent". The sequence ([`Shutdown::run`]) takes its signals
//! from a channel and its clock from tokio: tests drive it with fake signals
//! and paused time.

use std::future::Future;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tokio_util::task::task_tracker::TaskTrackerToken;

/// How long dropped connections may take to wind down after the cut (their
/// tasks only have to notice they were dropped).
pub(crate) const CUT_WAIT: Duration = Duration::from_secs(5);

/// How long the engine aborts sent after the cut may take.
pub(crate) const ABORT_WAIT: Duration = Duration::from_secs(5);

/// A signal asking the gateway to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    Terminate,
    Interrupt,
}

impl StopSignal {
    pub fn name(self) -> &'static str {
        match self {
            StopSignal::Terminate => "SIGTERM",
            StopSignal::Interrupt => "SIGINT",
        }
    }
}

/// The stop signals this process receives, in order. The handlers are
/// installed before this returns, so a signal that arrives later is never
/// the default (fatal) action.
pub(crate) fn os_signals() -> mpsc::Receiver<StopSignal> {
    use tokio::signal::unix::{SignalKind, signal};
    let (sender, receiver) = mpsc::channel(4);
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut terminate), Ok(mut interrupt)) => {
            tokio::spawn(async move {
                loop {
                    let signal = tokio::select! {
                        Some(()) = terminate.recv() => StopSignal::Terminate,
                        Some(()) = interrupt.recv() => StopSignal::Interrupt,
                        else => return,
                    };
                    if sender.send(signal).await.is_err() {
                        return;
                    }
                }
            });
        }
        (Err(err), _) | (_, Err(err)) => {
            tracing::error!(%err, "cannot watch SIGTERM/SIGINT: the gateway stops only when killed");
        }
    }
    receiver
}

/// Tasks requests start beside their handlers, tracked so the shutdown can
/// wait for them: `work` (connections, HTTP/2 streams, SSE producers, leg
/// supervisors) and the engine `aborts` of legs cut short.
#[derive(Debug, Clone, Default)]
pub struct RequestTasks {
    work: TaskTracker,
    aborts: TaskTracker,
}

impl RequestTasks {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `task` as part of a request's work (on the current runtime).
    pub fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.work.spawn(task)
    }

    /// Sends an engine abort in the background. Called from `Drop`, so it
    /// may run outside any runtime: then there is nothing to send it with,
    /// and it returns false.
    pub fn spawn_abort<F>(&self, abort: F) -> bool
    where
        F: Future<Output = ()> + Send + 'static,
    {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                self.aborts.spawn_on(abort, &runtime);
                true
            }
            Err(_) => false,
        }
    }
}

/// The shutdown's phases as tokens, shared by the sequence
/// ([`Shutdown::run`]) and whoever takes part in it.
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    /// Phase 1: listeners stop accepting, connections close when idle.
    draining: CancellationToken,
    /// Every listener has closed its socket: readiness answers 503.
    unready: CancellationToken,
    /// Phase 2: connections still open are dropped.
    cut: CancellationToken,
    /// A token per listener whose socket is still open.
    listeners: TaskTracker,
    tasks: RequestTasks,
}

/// What a listener takes part in the shutdown with.
#[derive(Debug)]
pub struct ListenerShutdown {
    /// Stop accepting and close the socket; let connections finish.
    pub draining: CancellationToken,
    /// Drop the connections still open.
    pub cut: CancellationToken,
    /// Held while the socket is open: drop it right after closing it.
    pub open: TaskTrackerToken,
    /// Where connections and their HTTP/2 streams run.
    pub tasks: RequestTasks,
}

/// How a shutdown ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ending {
    /// Connections were still open at the cut and were dropped.
    pub cut: bool,
    /// A second signal asked to stop at once: aborts were not waited for.
    pub immediate: bool,
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    /// The tasks of requests, for the handlers and the pipeline.
    pub fn tasks(&self) -> &RequestTasks {
        &self.tasks
    }

    /// Cancelled once readiness must answer 503.
    pub fn unready(&self) -> CancellationToken {
        self.unready.clone()
    }

    /// Cancelled when connections still open must be dropped.
    pub fn cut(&self) -> CancellationToken {
        self.cut.clone()
    }

    /// The shutdown handle of a listener about to serve; the drain waits
    /// for its socket to close before readiness turns.
    pub fn listener(&self) -> ListenerShutdown {
        ListenerShutdown {
            draining: self.draining.clone(),
            cut: self.cut.clone(),
            open: self.listeners.token(),
            tasks: self.tasks.clone(),
        }
    }

    /// Runs the phases: waits for a first signal, drains for up to `grace`,
    /// cuts what is left, waits for the aborts. A second signal at any
    /// point cuts at once and skips the aborts. Never returns without a
    /// signal.
    pub async fn run(&self, mut signals: mpsc::Receiver<StopSignal>, grace: Duration) -> Ending {
        let Some(first) = signals.recv().await else {
            return std::future::pending().await;
        };
        let deadline = Instant::now() + grace;
        tracing::info!(
            signal = first.name(),
            grace_secs = grace.as_secs(),
            "shutdown: draining (listeners stop accepting; requests in flight may finish)"
        );
        self.draining.cancel();
        self.listeners.close();
        self.listeners.wait().await;
        self.unready.cancel();
        self.tasks.work.close();
        tracing::info!(
            tasks = self.tasks.work.len(),
            "shutdown: listeners closed, readiness answers 503; waiting for requests in flight"
        );

        let mut ending = Ending {
            cut: false,
            immediate: false,
        };
        tokio::select! {
            () = self.tasks.work.wait() => {
                tracing::info!("shutdown: every request has finished");
            }
            () = tokio::time::sleep_until(deadline) => {
                tracing::warn!(
                    tasks = self.tasks.work.len(),
                    "shutdown: grace period over; dropping the connections still open"
                );
                ending.cut = true;
            }
            Some(second) = signals.recv() => {
                tracing::warn!(signal = second.name(), "shutdown: second signal; stopping now");
                ending.cut = true;
                ending.immediate = true;
            }
        }
        if ending.cut {
            self.cut.cancel();
            // Dropped connections only have to notice: their engine streams
            // drop with them, and with those the leases of their shm names.
            tokio::select! {
                () = self.tasks.work.wait() => {}
                () = tokio::time::sleep(CUT_WAIT) => {
                    tracing::warn!(
                        tasks = self.tasks.work.len(),
                        "shutdown: request tasks still running after the cut"
                    );
                }
                Some(second) = signals.recv(), if !ending.immediate => {
                    tracing::warn!(signal = second.name(), "shutdown: second signal; stopping now");
                    ending.immediate = true;
                }
            }
        }
        if !ending.immediate {
            self.tasks.aborts.close();
            let pending = self.tasks.aborts.len();
            tokio::select! {
                () = self.tasks.aborts.wait() => {
                    // Logged even when none was left to wait for: an abort
                    // the cut triggered may have been answered already.
                    tracing::info!(waited_for = pending, "shutdown: engine aborts sent");
                }
                () = tokio::time::sleep(ABORT_WAIT) => {
                    tracing::warn!(
                        unanswered = self.tasks.aborts.len(),
                        "shutdown: workers did not answer every abort in time"
                    );
                }
                Some(second) = signals.recv() => {
                    tracing::warn!(signal = second.name(), "shutdown: second signal; stopping now");
                    ending.immediate = true;
                }
            }
        }
        ending
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use tokio::sync::oneshot;

    use super::*;

    const GRACE: Duration = Duration::from_secs(180);

    /// A running sequence and the sender of its signals.
    fn started(shutdown: &Shutdown) -> (mpsc::Sender<StopSignal>, tokio::task::JoinHandle<Ending>) {
        let (signals, receiver) = mpsc::channel(4);
        let sequence = shutdown.clone();
        let run = tokio::spawn(async move { sequence.run(receiver, GRACE).await });
        (signals, run)
    }

    #[tokio::test(start_paused = true)]
    async fn readiness_turns_only_once_every_listener_has_closed_its_socket() {
        let shutdown = Shutdown::new();
        let public = shutdown.listener();
        let admin = shutdown.listener();
        let (signals, run) = started(&shutdown);
        signals.send(StopSignal::Terminate).await.expect("sent");
        public.draining.cancelled().await;
        drop(public.open);
        tokio::task::yield_now().await;
        assert!(
            !shutdown.unready().is_cancelled(),
            "the admin socket is open"
        );
        drop(admin.open);
        shutdown.unready().cancelled().await;
        // Nothing in flight: the sequence ends without a cut.
        let ending = run.await.expect("the sequence ends");
        assert_eq!(
            ending,
            Ending {
                cut: false,
                immediate: false
            }
        );
        assert!(!shutdown.cut().is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn requests_that_finish_within_the_grace_period_are_not_cut() {
        let shutdown = Shutdown::new();
        let (finish, finished) = oneshot::channel::<()>();
        shutdown.tasks().spawn(async move {
            let _ = finished.await;
        });
        let (signals, run) = started(&shutdown);
        signals.send(StopSignal::Terminate).await.expect("sent");
        shutdown.unready().cancelled().await;
        // Well within the grace period (paused time jumps when idle).
        tokio::time::sleep(GRACE / 2).await;
        assert!(!run.is_finished(), "a request is still in flight");
        finish.send(()).expect("the request waits");
        assert!(!run.await.expect("the sequence ends").cut);
        assert!(!shutdown.cut().is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_deadline_work_is_cut_and_its_aborts_are_waited_for() {
        let shutdown = Shutdown::new();
        let sent = Arc::new(AtomicBool::new(false));
        // A stream that never ends on its own; dropped at the cut, its
        // guard sends an abort that takes a while to be answered.
        let tasks = shutdown.tasks().clone();
        let cut = shutdown.cut();
        let abort_sent = Arc::clone(&sent);
        shutdown.tasks().spawn(async move {
            cut.cancelled().await;
            tasks.spawn_abort(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                abort_sent.store(true, Ordering::SeqCst);
            });
        });
        let started_at = Instant::now();
        let (signals, run) = started(&shutdown);
        signals.send(StopSignal::Terminate).await.expect("sent");
        let ending = run.await.expect("the sequence ends");
        assert_eq!(
            ending,
            Ending {
                cut: true,
                immediate: false
            }
        );
        assert!(Instant::now() - started_at >= GRACE, "cut at the deadline");
        assert!(sent.load(Ordering::SeqCst), "the abort went out first");
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_signal_cuts_at_once_and_does_not_wait_for_aborts() {
        let shutdown = Shutdown::new();
        let tasks = shutdown.tasks().clone();
        let cut = shutdown.cut();
        shutdown.tasks().spawn(async move {
            cut.cancelled().await;
            // An abort to a worker that never answers.
            tasks.spawn_abort(std::future::pending());
        });
        let started_at = Instant::now();
        let (signals, run) = started(&shutdown);
        signals.send(StopSignal::Terminate).await.expect("sent");
        shutdown.unready().cancelled().await;
        signals.send(StopSignal::Interrupt).await.expect("sent");
        let ending = run.await.expect("the sequence ends");
        assert_eq!(
            ending,
            Ending {
                cut: true,
                immediate: true
            }
        );
        assert!(shutdown.cut().is_cancelled());
        assert!(
            Instant::now() - started_at < CUT_WAIT,
            "neither the grace period nor the abort wait ran"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_abort_nobody_answers_delays_the_exit_by_the_abort_wait_only() {
        let shutdown = Shutdown::new();
        let tasks = shutdown.tasks().clone();
        let cut = shutdown.cut();
        shutdown.tasks().spawn(async move {
            cut.cancelled().await;
            tasks.spawn_abort(std::future::pending());
        });
        let started_at = Instant::now();
        let (signals, run) = started(&shutdown);
        signals.send(StopSignal::Terminate).await.expect("sent");
        let ending = run.await.expect("the sequence ends");
        assert!(ending.cut && !ending.immediate);
        assert_eq!(Instant::now() - started_at, GRACE + ABORT_WAIT);
    }
}
