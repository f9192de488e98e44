//! Worker health: periodic gRPC `HealthCheck` probes feeding a state machine.
//!
//! ```text
//! pending ──N ok──▶ ready ──M failed──▶ not_ready ──N ok──▶ ready
//!    │                                     │
//!    └──── failing for `failed_after` ─────┴──▶ failed ──N ok──▶ ready
//! ```
//!
//! Only `ready` workers take traffic.
//!
//! The same health RPC also probes open circuits ([`spawn_circuit_probe`]):
//! a worker whose breaker opened is asked at a short interval, backing off,
//! and its first healthy answer turns the circuit half-open, whether or not
//! periodic health checks are on. A worker named on the command line
//! starts `ready` (the operator vouched for it); one registered through the
//! admin API starts `pending`. The machine takes the time as an argument so
//! tests drive it with a fake clock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Worker;

/// Probe settings (SMG's `--health-check-*` flags).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HealthConfig {
    pub interval: Duration,
    pub timeout: Duration,
    /// Failed probes in a row that take a ready worker out of rotation.
    pub failure_threshold: u32,
    /// Good probes in a row that put a worker (back) into rotation.
    pub success_threshold: u32,
    /// How long a worker may fail before it counts as `failed`.
    pub failed_after: Duration,
}

impl HealthConfig {
    /// `failed_after` defaults to four times the time it takes to notice a
    /// failure (`failure_threshold` probes), at least a minute.
    pub fn new(
        interval: Duration,
        timeout: Duration,
        failure_threshold: u32,
        success_threshold: u32,
    ) -> Self {
        let failure_threshold = failure_threshold.max(1);
        Self {
            interval,
            timeout,
            failure_threshold,
            success_threshold: success_threshold.max(1),
            failed_after: (interval * failure_threshold * 4).max(Duration::from_secs(60)),
        }
    }
}

/// A worker's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum HealthState {
    /// Registered, not yet proven healthy.
    Pending = 0,
    Ready = 1,
    /// Recently failing probes; out of rotation.
    NotReady = 2,
    /// Failing for a long time.
    Failed = 3,
}

impl HealthState {
    pub const fn name(self) -> &'static str {
        match self {
            HealthState::Pending => "pending",
            HealthState::Ready => "ready",
            HealthState::NotReady => "not_ready",
            HealthState::Failed => "failed",
        }
    }

    pub(super) const fn from_u8(value: u8) -> Self {
        match value {
            0 => HealthState::Pending,
            1 => HealthState::Ready,
            2 => HealthState::NotReady,
            _ => HealthState::Failed,
        }
    }
}

/// The health state machine of one worker.
#[derive(Debug, Clone)]
pub struct HealthTracker {
    config: HealthConfig,
    state: HealthState,
    successes: u32,
    failures: u32,
    failing_since: Option<Instant>,
}

impl HealthTracker {
    pub fn new(config: HealthConfig, initial: HealthState) -> Self {
        Self {
            config,
            state: initial,
            successes: 0,
            failures: 0,
            failing_since: None,
        }
    }

    pub fn state(&self) -> HealthState {
        self.state
    }

    /// Feeds one probe result; returns the new state if it changed.
    pub fn observe(&mut self, healthy: bool, now: Instant) -> Option<HealthState> {
        let before = self.state;
        if healthy {
            self.failures = 0;
            self.failing_since = None;
            self.successes = self.successes.saturating_add(1);
            if self.state != HealthState::Ready && self.successes >= self.config.success_threshold {
                self.state = HealthState::Ready;
            }
        } else {
            self.successes = 0;
            self.failures = self.failures.saturating_add(1);
            let since = *self.failing_since.get_or_insert(now);
            if self.state == HealthState::Ready && self.failures >= self.config.failure_threshold {
                self.state = HealthState::NotReady;
            }
            if self.state != HealthState::Ready
                && now.saturating_duration_since(since) >= self.config.failed_after
            {
                self.state = HealthState::Failed;
            }
        }
        (self.state != before).then_some(self.state)
    }
}

/// One probe: healthy iff the worker answers `healthy` within the timeout.
pub async fn probe(worker: &Worker, timeout: Duration) -> bool {
    matches!(
        tokio::time::timeout(timeout, worker.client().health_check()).await,
        Ok(Ok(true))
    )
}

/// Starts one probe loop per worker; each stops when its worker retires or
/// the runtime stops.
pub fn spawn_health_checks(workers: Vec<Arc<Worker>>, config: HealthConfig) {
    for worker in workers {
        spawn_probe_loop(worker, config);
    }
}

/// Starts the probe loop of one worker.
pub fn spawn_probe_loop(worker: Arc<Worker>, config: HealthConfig) {
    let retired = worker.retired_token();
    tokio::spawn(async move {
        tokio::select! {
            () = probe_loop(&worker, config) => {}
            () = retired.cancelled() => {}
        }
    });
}

/// Starts the circuit probe of one worker: whenever its circuit opens, the
/// worker is probed after `probe_interval`, then at doubling pauses up to
/// `max_probe_interval`, until it answers healthy (the circuit turns
/// half-open) or the circuit leaves `open` otherwise. Stops when the worker
/// retires; does nothing if the breaker is off or probing disabled.
pub fn spawn_circuit_probe(worker: Arc<Worker>, timeout: Duration) {
    let config = *worker.breaker().config();
    if !config.enabled || config.probe_interval.is_zero() {
        return;
    }
    let retired = worker.retired_token();
    tokio::spawn(async move {
        tokio::select! {
            () = circuit_probe_loop(&worker, timeout) => {}
            () = retired.cancelled() => {}
        }
    });
}

async fn circuit_probe_loop(worker: &Worker, timeout: Duration) {
    let config = *worker.breaker().config();
    loop {
        worker.circuit_open().await;
        let mut pause = config.probe_interval;
        while worker.breaker().state() == super::BreakerState::Open {
            tokio::time::sleep(pause).await;
            if worker.breaker().state() != super::BreakerState::Open {
                break;
            }
            if probe(worker, timeout).await {
                crate::metrics::record_circuit_probe(worker.label(), "healthy");
                if worker.breaker().probe_succeeded().is_some() {
                    tracing::info!(worker = worker.label(), "open circuit probed healthy");
                }
                break;
            }
            crate::metrics::record_circuit_probe(worker.label(), "failed");
            pause = (pause * 2).min(config.max_probe_interval.max(config.probe_interval));
        }
    }
}

async fn probe_loop(worker: &Worker, config: HealthConfig) {
    let mut tracker = HealthTracker::new(config, worker.health());
    let mut ticker = tokio::time::interval(config.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let healthy = probe(worker, config.timeout).await;
        if let Some(state) = tracker.observe(healthy, Instant::now()) {
            if state == HealthState::Ready {
                tracing::info!(worker = worker.label(), "worker ready");
            } else {
                tracing::warn!(
                    worker = worker.url(),
                    state = state.name(),
                    "worker health changed"
                );
            }
            worker.set_health(state);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> HealthConfig {
        HealthConfig {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            failure_threshold: 3,
            success_threshold: 2,
            failed_after: Duration::from_secs(20),
        }
    }

    fn at(t0: Instant, secs: u64) -> Instant {
        t0 + Duration::from_secs(secs)
    }

    #[test]
    fn pending_becomes_ready_after_n_successes() {
        let t0 = Instant::now();
        let mut tracker = HealthTracker::new(config(), HealthState::Pending);
        assert_eq!(tracker.observe(true, t0), None);
        assert_eq!(tracker.observe(true, at(t0, 1)), Some(HealthState::Ready));
    }

    #[test]
    fn ready_leaves_rotation_after_m_failures_and_returns_after_n_successes() {
        let t0 = Instant::now();
        let mut tracker = HealthTracker::new(config(), HealthState::Ready);
        assert_eq!(tracker.observe(false, t0), None);
        assert_eq!(tracker.observe(false, at(t0, 1)), None);
        // A success in between resets the count.
        assert_eq!(tracker.observe(true, at(t0, 2)), None);
        assert_eq!(tracker.observe(false, at(t0, 3)), None);
        assert_eq!(tracker.observe(false, at(t0, 4)), None);
        assert_eq!(
            tracker.observe(false, at(t0, 5)),
            Some(HealthState::NotReady)
        );
        assert_eq!(tracker.observe(true, at(t0, 6)), None);
        assert_eq!(tracker.observe(true, at(t0, 7)), Some(HealthState::Ready));
    }

    #[test]
    fn long_failure_means_failed_and_failed_can_recover() {
        let t0 = Instant::now();
        let mut tracker = HealthTracker::new(config(), HealthState::Ready);
        for s in 0..3 {
            tracker.observe(false, at(t0, s));
        }
        assert_eq!(tracker.state(), HealthState::NotReady);
        assert_eq!(tracker.observe(false, at(t0, 19)), None);
        assert_eq!(
            tracker.observe(false, at(t0, 20)),
            Some(HealthState::Failed)
        );
        tracker.observe(true, at(t0, 21));
        assert_eq!(tracker.observe(true, at(t0, 22)), Some(HealthState::Ready));
    }

    #[test]
    fn a_pending_worker_that_never_answers_fails() {
        let t0 = Instant::now();
        let mut tracker = HealthTracker::new(config(), HealthState::Pending);
        assert_eq!(tracker.observe(false, t0), None);
        assert_eq!(
            tracker.observe(false, at(t0, 25)),
            Some(HealthState::Failed)
        );
    }

    #[test]
    fn the_default_failed_after_is_generous() {
        let config = HealthConfig::new(Duration::from_secs(10), Duration::from_secs(5), 3, 2);
        assert_eq!(config.failed_after, Duration::from_secs(120));
        let quick = HealthConfig::new(Duration::from_secs(1), Duration::from_secs(1), 0, 0);
        assert_eq!(quick.failure_threshold, 1);
        assert_eq!(quick.success_threshold, 1);
        assert_eq!(quick.failed_after, Duration::from_secs(60));
    }
}
