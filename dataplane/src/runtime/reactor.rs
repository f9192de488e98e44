//! The control-plane side of a core's completion ring: one tokio task per
//! core that drains completions and wakes the futures waiting for them.
//!
//! Why it exists: the pinned core never touches tokio (no waker calls, no
//! unparking of tokio threads from a foreign core). It pushes a completion
//! and, only if this task announced sleep, writes the completion doorbell's
//! eventfd, which tokio watches with `AsyncFd`. This task then delivers a
//! whole batch of results through their oneshot senders, and tells
//! submitters waiting for ring space that jobs have moved on.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering, fence};
use std::time::Duration;

use smg_shared::ring::RingReceiver;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;

use super::core::CoreShared;
use super::job::Completion;

/// Wakes submitters that found every job ring full.
#[derive(Debug, Default)]
pub(crate) struct SpaceSignal {
    /// Submitters currently waiting; notifying costs a lock inside `Notify`,
    /// so the reactor only notifies when someone waits.
    pub waiting: AtomicUsize,
    pub notify: Notify,
}

impl SpaceSignal {
    /// After jobs moved on. The fence pairs with the one a submitter puts
    /// between registering as waiting and re-checking the rings (see
    /// `DataPlane::submit`): either it sees the freed slot or we see it.
    pub(crate) fn jobs_moved(&self) {
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::Relaxed) > 0 {
            self.notify.notify_waiters();
        }
    }
}

/// The completion doorbell's descriptor, for `AsyncFd`.
struct DoneBell(Arc<CoreShared>);

impl AsRawFd for DoneBell {
    fn as_raw_fd(&self) -> RawFd {
        self.0.done_bell.as_raw_fd()
    }
}

/// Runs until the core has exited and every completion is delivered.
pub(crate) async fn run(
    mut completions: RingReceiver<Completion>,
    shared: Arc<CoreShared>,
    space: Arc<SpaceSignal>,
) {
    // SAFETY: the eventfd is owned by `CoreShared`, which the `DoneBell`
    // keeps alive (an `Arc`) for the AsyncFd's whole life; it is never
    // closed or replaced meanwhile, so `as_raw_fd` always names it.
    let registered = unsafe {
        AsyncFd::register_with_interest(DoneBell(Arc::clone(&shared)), Interest::READABLE)
    };
    let bell = match registered {
        Ok(bell) => Some(bell),
        Err(error) => {
            let error = error.into_parts().1;
            tracing::error!(%error, "cannot watch the completion doorbell; polling every millisecond");
            None
        }
    };
    loop {
        let mut delivered = 0usize;
        while let Some(Completion { reply, result }) = completions.try_pop() {
            // The waiter may be gone (its request was cancelled): fine.
            let _ = reply.send(result);
            delivered += 1;
        }
        if delivered > 0 {
            space.jobs_moved();
        }
        if shared.exited.load(Ordering::SeqCst) {
            // The core pushed its last completion before setting `exited`.
            while let Some(Completion { reply, result }) = completions.try_pop() {
                let _ = reply.send(result);
            }
            space.jobs_moved();
            return;
        }
        shared.done_bell.prepare_sleep();
        if !completions.is_empty() || shared.exited.load(Ordering::SeqCst) {
            shared.done_bell.cancel_sleep();
            continue;
        }
        match &bell {
            Some(bell) => match bell.readable().await {
                Ok(mut guard) => {
                    // Clears tokio's readiness only when the eventfd really is
                    // drained (the read fails with WouldBlock).
                    let _ = guard.try_io(|inner| inner.get_ref().0.done_bell.try_drain());
                }
                Err(error) => {
                    tracing::error!(%error, "completion doorbell failed");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            },
            None => tokio::time::sleep(Duration::from_millis(1)).await,
        }
    }
}
