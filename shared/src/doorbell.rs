//! Doorbells: how one side of a ring wakes the other when it has gone to
//! sleep, without a syscall per value while it is awake.
//!
//! Why it exists: a ring hand-off between two spinning threads costs a few
//! hundred nanoseconds, a sleep/wake about 50 µs. So a consumer spins briefly
//! on its ring, then announces that it is going to sleep and waits on an
//! eventfd; producers write the eventfd only when the consumer has announced
//! it. The eventfd is a plain file descriptor, so the data-plane core can keep
//! a read of it queued on its io_uring and the control plane can watch it
//! with tokio's `AsyncFd`.
//!
//! # The no-lost-wake-up protocol
//!
//! ```text
//! consumer                               producer
//! prepare_sleep():  sleeping = true      push value (Release)
//!                   fence(SeqCst)        ring():  fence(SeqCst)
//! re-check the ring; if empty, wait               if sleeping.swap(false): write eventfd
//! ```
//!
//! Both sides store, fence (`SeqCst`), then load the other side's location,
//! so at least one sees the other's store: either the consumer's re-check
//! finds the value, or the producer sees `sleeping` and writes the eventfd
//! (the classic store-buffer/Dekker argument). `swap(false)` lets only one
//! of several producers pay for the write per sleep. A stale count left in
//! the eventfd only causes one spurious wake-up, after which the consumer
//! re-checks and sleeps again.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::sync::{AtomicBool, Ordering, fence};

/// An eventfd plus the "consumer is asleep" flag that decides when to use it.
#[derive(Debug)]
pub struct Doorbell {
    fd: EventFd,
    sleeping: AtomicBool,
}

impl Doorbell {
    /// A doorbell whose eventfd blocks on read (for a consumer that waits by
    /// reading it, directly or through io_uring).
    pub fn blocking() -> io::Result<Self> {
        Self::with_flags(EfdFlags::EFD_CLOEXEC)
    }

    /// A doorbell whose eventfd never blocks (for a consumer on an event
    /// loop, e.g. tokio's `AsyncFd`).
    pub fn nonblocking() -> io::Result<Self> {
        Self::with_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
    }

    fn with_flags(flags: EfdFlags) -> io::Result<Self> {
        let fd = EventFd::from_value_and_flags(0, flags)?;
        Ok(Self {
            fd,
            sleeping: AtomicBool::new(false),
        })
    }

    /// Producer side, after publishing a value: wakes the consumer if it has
    /// announced that it sleeps. Costs one fence and one atomic otherwise.
    pub fn ring(&self) {
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) && self.sleeping.swap(false, Ordering::AcqRel) {
            self.write_one();
        }
    }

    /// Wakes the consumer unconditionally (shutdown, tests).
    pub fn ring_always(&self) {
        self.sleeping.store(false, Ordering::SeqCst);
        self.write_one();
    }

    fn write_one(&self) {
        // It cannot block (the counter would have to reach u64::MAX - 1) and
        // the only possible failure, EAGAIN on overflow, still leaves it
        // readable.
        let _ = self.fd.write(1);
    }

    /// Consumer side: announce the intent to sleep. The caller must then
    /// re-check its ring, and either [`cancel_sleep`](Self::cancel_sleep) if
    /// something arrived or wait for the eventfd to become readable.
    pub fn prepare_sleep(&self) {
        self.sleeping.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Consumer side: it found work after [`prepare_sleep`](Self::prepare_sleep).
    pub fn cancel_sleep(&self) {
        self.sleeping.store(false, Ordering::Relaxed);
    }

    /// Consumer side, after waking: resets the eventfd's counter without
    /// blocking (a nonblocking eventfd), or after a poll said it is readable.
    /// Returns how many rings were pending (0 if none).
    pub fn drain(&self) -> u64 {
        self.try_drain().unwrap_or(0)
    }

    /// Like [`drain`](Self::drain), but reports a nonblocking eventfd with
    /// nothing pending as `WouldBlock` (what tokio's `AsyncFd::try_io` needs
    /// to clear its readiness only when the count really is zero).
    pub fn try_drain(&self) -> io::Result<u64> {
        let count = self.fd.read();
        self.sleeping.store(false, Ordering::Relaxed);
        Ok(count?)
    }

    /// Blocks until the eventfd is readable or `timeout_ms` passes (`-1`:
    /// forever); then drains it. For consumers without io_uring.
    pub fn wait(&self, timeout_ms: i32) -> io::Result<u64> {
        let mut pollfd = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
        // Any negative timeout waits forever, as poll(2) does.
        let timeout = PollTimeout::try_from(timeout_ms).unwrap_or(PollTimeout::NONE);
        let ready = match nix::poll::poll(&mut pollfd, timeout) {
            Ok(ready) => ready,
            Err(Errno::EINTR) => return Ok(0),
            Err(errno) => return Err(errno.into()),
        };
        if ready == 0 {
            self.sleeping.store(false, Ordering::Relaxed);
            return Ok(0);
        }
        Ok(self.drain())
    }

    /// Marks the consumer awake after it woke by other means (e.g. the
    /// eventfd read it had queued on io_uring completed).
    pub fn woke(&self) {
        self.sleeping.store(false, Ordering::Relaxed);
    }
}

impl AsRawFd for Doorbell {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for Doorbell {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    #[test]
    fn ring_writes_only_when_the_consumer_sleeps() {
        let bell = Doorbell::nonblocking().expect("eventfd");
        bell.ring();
        assert_eq!(bell.drain(), 0, "an awake consumer costs no write");
        bell.prepare_sleep();
        bell.ring();
        bell.ring();
        assert_eq!(bell.drain(), 1, "one write per sleep, however many rings");
        bell.prepare_sleep();
        bell.cancel_sleep();
        bell.ring();
        assert_eq!(bell.drain(), 0);
    }

    #[test]
    fn wait_times_out_then_wakes_on_a_ring_from_another_thread() {
        let bell = Arc::new(Doorbell::blocking().expect("eventfd"));
        bell.prepare_sleep();
        assert_eq!(bell.wait(10).expect("poll"), 0, "nothing rang: timeout");
        bell.prepare_sleep();
        let ringer = {
            let bell = Arc::clone(&bell);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                bell.ring();
            })
        };
        let started = Instant::now();
        assert_eq!(bell.wait(10_000).expect("poll"), 1);
        assert!(started.elapsed() < Duration::from_secs(5));
        ringer.join().expect("ringer");
    }
}
