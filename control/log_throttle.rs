//! [`LogThrottle`]: at most one log line per key (a worker) per interval.
//!
//! Why it exists: some WARN lines are triggered by what a worker sends (a
//! protocol violation the gateway repaired or refused), once per request.
//! A hostile or broken worker would then fill the gateway's log at request
//! rate, burying every other line and filling the disk. The metric still
//! counts every event; the log needs only the first one and, afterwards, a
//! line now and then saying how many were left out. So a caller asks
//! [`LogThrottle::admit`] before logging: the first event of a key logs at
//! once, later ones within the throttle's interval of the last logged
//! line are counted and left out, and the next line logged after the
//! interval carries that count (`suppressed`).
//!
//! Time is passed in ([`LogThrottle::admit_at`]) so the rule is tested
//! without a clock. Keys are bounded ([`MAX_KEYS`]): past that many, keys
//! whose interval is over are forgotten first; if none is, the event is
//! logged untracked (the keys are worker URLs, which only the operator
//! adds, so this is never a client's way around the throttle).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// The most keys a throttle tracks at once.
pub(crate) const MAX_KEYS: usize = 4096;

/// What a caller does with one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Log it, saying that `suppressed` events of this key were left out
    /// since the previous line.
    Log { suppressed: u64 },
    /// Leave it out (it is counted for the next line).
    Suppress,
}

/// One key's state: when its last line was logged, and how many events
/// were left out since.
#[derive(Debug, Clone, Copy)]
struct Slot {
    logged_at: Instant,
    suppressed: u64,
}

/// At most one log line per key per interval; see the module docs.
#[derive(Debug)]
pub(crate) struct LogThrottle {
    interval: Duration,
    slots: Mutex<HashMap<Box<str>, Slot>>,
}

impl LogThrottle {
    pub(crate) fn new(interval: Duration) -> Self {
        Self {
            interval,
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// [`LogThrottle::admit_at`] now (tokio's clock, so a test with paused
    /// time controls it).
    pub(crate) fn admit(&self, key: &str) -> Verdict {
        self.admit_at(key, Instant::now())
    }

    /// Whether an event of `key` at `now` is logged.
    pub(crate) fn admit_at(&self, key: &str, now: Instant) -> Verdict {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = slots.get_mut(key) {
            if now.saturating_duration_since(slot.logged_at) < self.interval {
                slot.suppressed = slot.suppressed.saturating_add(1);
                return Verdict::Suppress;
            }
            let suppressed = std::mem::take(&mut slot.suppressed);
            slot.logged_at = now;
            return Verdict::Log { suppressed };
        }
        if slots.len() >= MAX_KEYS {
            let interval = self.interval;
            slots.retain(|_, slot| now.saturating_duration_since(slot.logged_at) < interval);
            if slots.len() >= MAX_KEYS {
                return Verdict::Log { suppressed: 0 };
            }
        }
        slots.insert(
            Box::from(key),
            Slot {
                logged_at: now,
                suppressed: 0,
            },
        );
        Verdict::Log { suppressed: 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn the_first_event_logs_then_one_line_per_interval_counts_the_rest() {
        let throttle = LogThrottle::new(10 * SECOND);
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        assert_eq!(
            throttle.admit_at("w1", at(0)),
            Verdict::Log { suppressed: 0 }
        );
        for secs in [0, 1, 5, 9] {
            assert_eq!(throttle.admit_at("w1", at(secs)), Verdict::Suppress);
        }
        // Another worker has its own budget.
        assert_eq!(
            throttle.admit_at("w2", at(3)),
            Verdict::Log { suppressed: 0 }
        );
        // The interval is over: the next line says what was left out.
        assert_eq!(
            throttle.admit_at("w1", at(10)),
            Verdict::Log { suppressed: 4 }
        );
        assert_eq!(throttle.admit_at("w1", at(12)), Verdict::Suppress);
        // A quiet worker logs at once, with the count from before.
        assert_eq!(
            throttle.admit_at("w1", at(100)),
            Verdict::Log { suppressed: 1 }
        );
        assert_eq!(
            throttle.admit_at("w2", at(100)),
            Verdict::Log { suppressed: 0 }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn admit_reads_tokio_time() {
        let throttle = LogThrottle::new(10 * SECOND);
        assert_eq!(throttle.admit("w"), Verdict::Log { suppressed: 0 });
        tokio::time::advance(9 * SECOND).await;
        assert_eq!(throttle.admit("w"), Verdict::Suppress);
        tokio::time::advance(SECOND).await;
        assert_eq!(throttle.admit("w"), Verdict::Log { suppressed: 1 });
    }

    #[test]
    fn keys_are_bounded_and_stale_ones_go_first() {
        let throttle = LogThrottle::new(10 * SECOND);
        let start = Instant::now();
        for key in 0..MAX_KEYS {
            throttle.admit_at(&key.to_string(), start);
        }
        // Full, and every key still inside its interval: a new key logs
        // untracked, and keeps logging.
        for _ in 0..3 {
            assert_eq!(
                throttle.admit_at("new", start + SECOND),
                Verdict::Log { suppressed: 0 }
            );
        }
        // Once the others' interval is over, they make room.
        let later = start + 10 * SECOND;
        assert_eq!(
            throttle.admit_at("new", later),
            Verdict::Log { suppressed: 0 }
        );
        assert_eq!(throttle.admit_at("new", later), Verdict::Suppress);
        let slots = throttle
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        assert_eq!(slots.len(), 1);
    }
}
