//! A circuit breaker per worker, fed by the outcomes of real RPCs.
//!
//! Closed (traffic flows) → open after `failure_threshold` consecutive
//! failures within `window` (no traffic) → half-open once `open_for` has
//! passed → closed after `success_threshold` successes in a row, or open
//! again on the first failure. A half-open circuit admits at most
//! `success_threshold` trial requests at a time: a request takes a trial
//! slot when it is sent ([`CircuitBreaker::admit`]) and gives it back when
//! it ends ([`CircuitBreaker::end_trial`], from the request's load guard),
//! so a recovering worker is not flooded before it has proven itself.
//!
//! An open circuit does not only wait out `open_for`: while it is open,
//! the worker is probed with its health RPC (`health::spawn_circuit_probe`,
//! every `probe_interval`, backing off to `max_probe_interval`), and the
//! first healthy answer turns it half-open
//! ([`CircuitBreaker::probe_succeeded`]). A worker that answers again is
//! back within a probe interval, not a full timeout; `open_for` remains the
//! bound when probing is off.
//!
//! What counts as a failure is decided by the caller (the router charges
//! only failures that blame the worker, once per request and once per
//! connection death: see `Error::charges`).
//!
//! The state machine takes the current time as an argument, so tests drive
//! it with a fake clock; the hot-path checks ([`CircuitBreaker::allows`],
//! [`CircuitBreaker::admit`]) are a single atomic load while the circuit is
//! closed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// SMG's `--cb-*` flags.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerConfig {
    pub enabled: bool,
    pub failure_threshold: u32,
    pub success_threshold: u32,
    /// How long the circuit stays open before a trial.
    pub open_for: Duration,
    /// Consecutive failures count only within this window.
    pub window: Duration,
    /// How soon an open circuit's worker is first probed; zero: never
    /// (the circuit waits out `open_for`).
    pub probe_interval: Duration,
    /// The longest pause between two probes of an open circuit (the pause
    /// doubles after each unhealthy answer).
    pub max_probe_interval: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            failure_threshold: 10,
            success_threshold: 3,
            open_for: Duration::from_secs(60),
            window: Duration::from_secs(120),
            probe_interval: Duration::from_millis(250),
            max_probe_interval: Duration::from_secs(2),
        }
    }
}

/// Where a circuit stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    pub const fn name(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

/// Whether a request may be sent, and on what terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The circuit is closed (or the breaker disabled).
    Free,
    /// A half-open trial: give the slot back with
    /// [`CircuitBreaker::end_trial`] and this ticket when the request ends.
    Trial(TrialTicket),
    /// Open, or every trial slot is taken.
    Refused,
}

/// Names the half-open period a trial slot was taken in, so a slot given
/// back after the circuit moved on does not count against the next period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrialTicket(u64);

#[derive(Debug)]
struct Core {
    state: BreakerState,
    failures: u32,
    first_failure: Option<Instant>,
    opened_at: Option<Instant>,
    trial_successes: u32,
    /// Trial requests sent and not yet ended (half-open only).
    trials_in_flight: u32,
    /// Counts transitions; a trial ticket holds the value it was taken at.
    period: u64,
}

/// Told about every state change, whichever call made it (an outcome, or
/// an open circuit's timeout noticed by a selection or an admission).
pub(super) type TransitionObserver = Box<dyn Fn(BreakerState) + Send + Sync>;

/// One worker's breaker.
pub struct CircuitBreaker {
    config: BreakerConfig,
    /// Mirrors `core.state != Closed`, so a closed circuit costs one load.
    tripped: AtomicBool,
    core: Mutex<Core>,
    observer: Option<TransitionObserver>,
}

impl std::fmt::Debug for CircuitBreaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("config", &self.config)
            .field("core", &self.core)
            .field("observed", &self.observer.is_some())
            .finish()
    }
}

impl CircuitBreaker {
    pub fn new(config: BreakerConfig) -> Self {
        Self {
            config,
            tripped: AtomicBool::new(false),
            core: Mutex::new(Core {
                state: BreakerState::Closed,
                failures: 0,
                first_failure: None,
                opened_at: None,
                trial_successes: 0,
                trials_in_flight: 0,
                period: 0,
            }),
            observer: None,
        }
    }

    /// The breaker calling `observer` on every state change.
    pub fn with_observer(mut self, observer: TransitionObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    pub fn config(&self) -> &BreakerConfig {
        &self.config
    }

    /// Whether a request may go to the worker now.
    pub fn allows(&self) -> bool {
        !self.tripped.load(Ordering::Relaxed) || self.allows_at(Instant::now())
    }

    /// Whether a request may go at `now` (a half-open circuit with a free
    /// trial slot allows one); an open circuit whose time is up turns
    /// half-open. Takes no slot: see [`CircuitBreaker::admit_at`].
    pub fn allows_at(&self, now: Instant) -> bool {
        if !self.config.enabled {
            return true;
        }
        let mut core = self.core.lock().unwrap_or_else(PoisonError::into_inner);
        self.refresh(&mut core, now);
        self.has_room(&core)
    }

    /// Admits a request about to be sent now, taking a trial slot when the
    /// circuit is half-open.
    pub fn admit(&self) -> Admission {
        if !self.tripped.load(Ordering::Relaxed) {
            return Admission::Free;
        }
        self.admit_at(Instant::now())
    }

    /// Admits a request about to be sent at `now`.
    pub fn admit_at(&self, now: Instant) -> Admission {
        if !self.config.enabled {
            return Admission::Free;
        }
        let mut core = self.core.lock().unwrap_or_else(PoisonError::into_inner);
        self.refresh(&mut core, now);
        if !self.has_room(&core) {
            return Admission::Refused;
        }
        match core.state {
            BreakerState::Closed => Admission::Free,
            BreakerState::HalfOpen => {
                core.trials_in_flight += 1;
                Admission::Trial(TrialTicket(core.period))
            }
            BreakerState::Open => Admission::Refused,
        }
    }

    /// Gives back the trial slot `ticket` took (the request ended, however).
    pub fn end_trial(&self, ticket: TrialTicket) {
        let mut core = self.core.lock().unwrap_or_else(PoisonError::into_inner);
        if core.period == ticket.0 {
            core.trials_in_flight = core.trials_in_flight.saturating_sub(1);
        }
    }

    /// Trial requests in flight now.
    pub fn trials_in_flight(&self) -> u32 {
        self.core
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .trials_in_flight
    }

    /// An open circuit whose time is up turns half-open.
    fn refresh(&self, core: &mut Core, now: Instant) {
        if core.state == BreakerState::Open
            && core
                .opened_at
                .is_some_and(|at| now.saturating_duration_since(at) >= self.config.open_for)
        {
            self.transition(core, BreakerState::HalfOpen);
        }
    }

    fn has_room(&self, core: &Core) -> bool {
        match core.state {
            BreakerState::Closed => true,
            BreakerState::Open => false,
            BreakerState::HalfOpen => core.trials_in_flight < self.config.success_threshold.max(1),
        }
    }

    pub fn state(&self) -> BreakerState {
        self.core
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .state
    }

    /// The failures counted toward opening the circuit (in a row, within
    /// the window) while it is closed.
    pub fn failures(&self) -> u32 {
        self.core
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .failures
    }

    /// Records an RPC outcome now; returns the new state if it changed.
    pub fn record(&self, success: bool) -> Option<BreakerState> {
        self.record_at(success, Instant::now())
    }

    /// Records an RPC outcome at `now`; returns the new state if it changed.
    pub fn record_at(&self, success: bool, now: Instant) -> Option<BreakerState> {
        if !self.config.enabled {
            return None;
        }
        let mut core = self.core.lock().unwrap_or_else(PoisonError::into_inner);
        let before = core.state;
        match (core.state, success) {
            (BreakerState::Closed, true) => {
                core.failures = 0;
                core.first_failure = None;
            }
            (BreakerState::Closed, false) => {
                let in_window = core.first_failure.is_some_and(|first| {
                    now.saturating_duration_since(first) <= self.config.window
                });
                if in_window {
                    core.failures += 1;
                } else {
                    core.failures = 1;
                    core.first_failure = Some(now);
                }
                if core.failures >= self.config.failure_threshold.max(1) {
                    core.opened_at = Some(now);
                    self.transition(&mut core, BreakerState::Open);
                }
            }
            (BreakerState::HalfOpen, true) => {
                core.trial_successes += 1;
                if core.trial_successes >= self.config.success_threshold.max(1) {
                    self.transition(&mut core, BreakerState::Closed);
                }
            }
            (BreakerState::HalfOpen, false) => {
                core.opened_at = Some(now);
                self.transition(&mut core, BreakerState::Open);
            }
            // Outcomes of requests sent before the circuit opened.
            (BreakerState::Open, _) => {}
        }
        (core.state != before).then_some(core.state)
    }

    /// The worker answered a probe healthily: an open circuit turns
    /// half-open (trial requests decide the rest). Returns the new state if
    /// it changed.
    pub fn probe_succeeded(&self) -> Option<BreakerState> {
        let mut core = self.core.lock().unwrap_or_else(PoisonError::into_inner);
        if core.state != BreakerState::Open {
            return None;
        }
        self.transition(&mut core, BreakerState::HalfOpen);
        Some(BreakerState::HalfOpen)
    }

    fn transition(&self, core: &mut Core, to: BreakerState) {
        core.state = to;
        core.failures = 0;
        core.first_failure = None;
        core.trial_successes = 0;
        core.trials_in_flight = 0;
        core.period += 1;
        self.tripped
            .store(to != BreakerState::Closed, Ordering::Relaxed);
        if let Some(observer) = &self.observer {
            observer(to);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> CircuitBreaker {
        CircuitBreaker::new(BreakerConfig {
            enabled: true,
            failure_threshold: 3,
            success_threshold: 2,
            open_for: Duration::from_secs(30),
            window: Duration::from_secs(10),
            ..BreakerConfig::default()
        })
    }

    #[test]
    fn opens_after_consecutive_failures_then_recovers_through_half_open() {
        let cb = breaker();
        let t0 = Instant::now();
        assert_eq!(cb.record_at(false, t0), None);
        assert_eq!(cb.record_at(false, t0 + Duration::from_secs(1)), None);
        assert!(cb.allows_at(t0 + Duration::from_secs(1)));
        assert_eq!(
            cb.record_at(false, t0 + Duration::from_secs(2)),
            Some(BreakerState::Open)
        );
        assert!(!cb.allows_at(t0 + Duration::from_secs(3)));
        assert!(!cb.allows(), "the fast path sees the open circuit");
        assert!(!cb.allows_at(t0 + Duration::from_secs(31)));
        assert!(cb.allows_at(t0 + Duration::from_secs(32)));
        assert_eq!(cb.state(), BreakerState::HalfOpen);
        assert_eq!(cb.record_at(true, t0 + Duration::from_secs(33)), None);
        assert_eq!(
            cb.record_at(true, t0 + Duration::from_secs(34)),
            Some(BreakerState::Closed)
        );
        assert!(cb.allows());
    }

    #[test]
    fn the_observer_hears_every_transition_including_the_timed_half_open() {
        let heard = std::sync::Arc::new(Mutex::new(Vec::new()));
        let sink = std::sync::Arc::clone(&heard);
        let cb = breaker().with_observer(Box::new(move |state| {
            sink.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(state);
        }));
        let t0 = Instant::now();
        open(&cb, t0);
        // Nothing but time passes: the admission notices the timeout.
        assert!(matches!(
            cb.admit_at(t0 + Duration::from_secs(31)),
            Admission::Trial(_)
        ));
        cb.record_at(true, t0 + Duration::from_secs(32));
        cb.record_at(true, t0 + Duration::from_secs(32));
        assert_eq!(
            *heard.lock().unwrap_or_else(PoisonError::into_inner),
            [
                BreakerState::Open,
                BreakerState::HalfOpen,
                BreakerState::Closed
            ]
        );
    }

    fn open(cb: &CircuitBreaker, at: Instant) {
        for _ in 0..cb.config().failure_threshold {
            cb.record_at(false, at);
        }
        assert_eq!(cb.state(), BreakerState::Open);
    }

    #[test]
    fn half_open_admits_only_as_many_trials_as_successes_needed() {
        let cb = breaker();
        let t0 = Instant::now();
        open(&cb, t0);
        let later = t0 + Duration::from_secs(30);
        assert_eq!(cb.admit_at(t0), Admission::Refused, "open: nothing goes");
        let first = cb.admit_at(later);
        let second = cb.admit_at(later);
        assert!(matches!(first, Admission::Trial(_)), "{first:?}");
        assert!(matches!(second, Admission::Trial(_)), "{second:?}");
        assert_eq!(cb.state(), BreakerState::HalfOpen);
        // success_threshold (2) trials are out: the next request waits.
        assert_eq!(cb.admit_at(later), Admission::Refused);
        assert!(!cb.allows_at(later));
        assert_eq!(cb.trials_in_flight(), 2);
        // A trial that ends (here without a verdict) frees its slot.
        if let Admission::Trial(ticket) = first {
            cb.end_trial(ticket);
        }
        assert!(cb.allows_at(later));
        let third = cb.admit_at(later);
        assert!(matches!(third, Admission::Trial(_)), "{third:?}");
        assert_eq!(cb.admit_at(later), Admission::Refused);
        // Two successes close the circuit: traffic is free again.
        cb.record_at(true, later);
        assert_eq!(cb.record_at(true, later), Some(BreakerState::Closed));
        assert_eq!(cb.trials_in_flight(), 0);
        for _ in 0..10 {
            assert_eq!(cb.admit_at(later), Admission::Free);
        }
    }

    #[test]
    fn a_trial_ending_after_the_circuit_moved_on_frees_nothing_new() {
        let cb = breaker();
        let t0 = Instant::now();
        open(&cb, t0);
        let half_open = t0 + Duration::from_secs(30);
        let Admission::Trial(stale) = cb.admit_at(half_open) else {
            panic!("no trial");
        };
        // The trial fails: open again, then half-open for a new period.
        assert_eq!(cb.record_at(false, half_open), Some(BreakerState::Open));
        let again = half_open + Duration::from_secs(30);
        assert!(matches!(cb.admit_at(again), Admission::Trial(_)));
        assert!(matches!(cb.admit_at(again), Admission::Trial(_)));
        // The old trial's slot belonged to the old period.
        cb.end_trial(stale);
        assert_eq!(cb.trials_in_flight(), 2);
        assert_eq!(cb.admit_at(again), Admission::Refused);
    }

    #[test]
    fn a_failed_trial_reopens_for_a_full_timeout() {
        let cb = breaker();
        let t0 = Instant::now();
        for _ in 0..3 {
            cb.record_at(false, t0);
        }
        assert!(cb.allows_at(t0 + Duration::from_secs(30)));
        assert_eq!(
            cb.record_at(false, t0 + Duration::from_secs(31)),
            Some(BreakerState::Open)
        );
        assert!(!cb.allows_at(t0 + Duration::from_secs(60)));
        assert!(cb.allows_at(t0 + Duration::from_secs(61)));
    }

    #[test]
    fn failures_outside_the_window_or_broken_by_success_do_not_open() {
        let cb = breaker();
        let t0 = Instant::now();
        cb.record_at(false, t0);
        cb.record_at(false, t0 + Duration::from_secs(5));
        // The window (10 s from the first failure) has passed: count restarts.
        assert_eq!(cb.record_at(false, t0 + Duration::from_secs(11)), None);
        assert_eq!(cb.record_at(false, t0 + Duration::from_secs(12)), None);
        assert_eq!(cb.record_at(true, t0 + Duration::from_secs(13)), None);
        assert_eq!(cb.record_at(false, t0 + Duration::from_secs(14)), None);
        assert_eq!(cb.record_at(false, t0 + Duration::from_secs(15)), None);
        assert_eq!(cb.state(), BreakerState::Closed);
    }

    #[test]
    fn a_healthy_probe_lets_an_open_circuit_try_again_before_its_timeout() {
        let cb = breaker();
        let t0 = Instant::now();
        assert_eq!(cb.probe_succeeded(), None, "closed: nothing to do");
        open(&cb, t0);
        let soon = t0 + Duration::from_secs(1);
        assert!(!cb.allows_at(soon), "open_for (30 s) is far from over");
        assert_eq!(cb.probe_succeeded(), Some(BreakerState::HalfOpen));
        assert!(matches!(cb.admit_at(soon), Admission::Trial(_)));
        // Trials decide: a failure opens it again, for a full period.
        assert_eq!(cb.record_at(false, soon), Some(BreakerState::Open));
        assert!(!cb.allows_at(soon + Duration::from_secs(29)));
        assert_eq!(cb.probe_succeeded(), Some(BreakerState::HalfOpen));
        cb.record_at(true, soon);
        assert_eq!(cb.record_at(true, soon), Some(BreakerState::Closed));
        assert_eq!(cb.probe_succeeded(), None);
    }

    #[test]
    fn a_disabled_breaker_never_opens() {
        let cb = CircuitBreaker::new(BreakerConfig {
            enabled: false,
            failure_threshold: 1,
            ..BreakerConfig::default()
        });
        let t0 = Instant::now();
        for _ in 0..10 {
            assert_eq!(cb.record_at(false, t0), None);
        }
        assert!(cb.allows_at(t0));
        assert_eq!(cb.admit_at(t0), Admission::Free);
        assert_eq!(cb.state(), BreakerState::Closed);
    }
}
