//! Jobs that exist only for tests (the `testing` feature): a [`Hold`]
//! occupies a core until the test releases it, so a test can fill a ring,
//! abandon queued jobs or shut down while a job runs, ordered by signals
//! instead of sleeps.

use std::sync::mpsc;

use tokio::sync::oneshot;

/// The job half of a hold: the core says it started, then blocks until the
/// [`HoldHandle`] is released or dropped.
#[derive(Debug)]
pub struct Hold {
    started: oneshot::Sender<()>,
    release: mpsc::Receiver<()>,
}

/// The test's half of a hold.
#[derive(Debug)]
pub struct HoldHandle {
    started: Option<oneshot::Receiver<()>>,
    release: mpsc::Sender<()>,
}

/// A hold job and the handle that observes and ends it. Submit the job
/// with [`Work::Hold`](super::Work::Hold).
pub fn hold() -> (Hold, HoldHandle) {
    let (started_tx, started_rx) = oneshot::channel();
    let (release_tx, release_rx) = mpsc::channel();
    (
        Hold {
            started: started_tx,
            release: release_rx,
        },
        HoldHandle {
            started: Some(started_rx),
            release: release_tx,
        },
    )
}

impl Hold {
    /// Runs on the core: announces the start, then waits for the release
    /// (a dropped handle releases too, so a failing test never leaves a
    /// core stuck).
    pub(crate) fn run(self) {
        let _ = self.started.send(());
        let _ = self.release.recv();
    }
}

impl HoldHandle {
    /// Waits until a core runs the hold. False if the job was dropped
    /// without running (refused or failed at shutdown); true on later calls
    /// once it started.
    pub async fn started(&mut self) -> bool {
        match self.started.take() {
            Some(started) => started.await.is_ok(),
            None => true,
        }
    }

    /// Lets the core finish the hold (answered like a ping).
    pub fn release(self) {
        // Dropping the sender ends the core's wait.
        drop(self.release);
    }
}
