//! Worker load as the engines report it (`GetLoads`), polled per worker
//! group when a load-aware policy routes that group, or when the workers'
//! in-flight limits follow their engines (no `--worker-max-in-flight`).
//!
//! The latest reading lives in a few atomics on the worker, so a routing
//! decision reads it without locks; a reading older than its freshness limit
//! is ignored and policies fall back to the gateway's own in-flight counts.
//! Each answer's `max_running_requests` becomes the worker's in-flight limit
//! ([`reported_limit`]), so a limit follows an engine that changes it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{WorkerRole, WorkerSet};
use crate::engine::Load;

/// Nanoseconds since a process-wide origin (0 means "never").
fn clock_nanos(now: Instant) -> u64 {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let origin = *ORIGIN.get_or_init(|| Instant::now() - Duration::from_secs(1));
    u64::try_from(now.saturating_duration_since(origin).as_nanos()).unwrap_or(u64::MAX)
}

/// What policies use from a `GetLoads` answer.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LoadReading {
    /// Running plus waiting requests.
    pub requests: u32,
    /// Prompt tokens queued that the prefix cache does not cover.
    pub waiting_uncached_tokens: u32,
    /// Share of the KV cache in use, 0..=1.
    pub kv_usage: f32,
    /// Generated tokens per second.
    pub throughput: f32,
}

impl LoadReading {
    pub fn from_load(load: &Load) -> Self {
        let clamp = |v: i32| u32::try_from(v.max(0)).unwrap_or(0);
        let kv_usage = if load.max_total_tokens > 0 {
            f64::from(load.used_tokens) / f64::from(load.max_total_tokens)
        } else {
            load.token_usage
        };
        Self {
            requests: clamp(load.running_requests).saturating_add(clamp(load.waiting_requests)),
            waiting_uncached_tokens: clamp(load.waiting_uncached_tokens),
            kv_usage: kv_usage.clamp(0.0, 1.0) as f32,
            throughput: load.gen_throughput.max(0.0) as f32,
        }
    }
}

/// The in-flight limit an engine's `GetLoads` answer sets for one of its
/// workers: its `max_running_requests`, divided among its data-parallel
/// ranks when each rank is a worker of its own (`per_rank`); `None` when
/// it reports none. Requests beyond it would only wait in that engine's
/// queue, where they cannot move to a worker that frees up first: they
/// wait in the gateway instead.
pub fn reported_limit(load: &Load, per_rank: bool) -> Option<usize> {
    let total = usize::try_from(load.max_running_requests)
        .ok()
        .filter(|&total| total > 0)?;
    let ranks = match usize::try_from(load.dp_rank_count) {
        Ok(ranks) if per_rank && ranks > 0 => ranks,
        _ => 1,
    };
    Some((total / ranks).max(1))
}

/// The latest reading of one worker, in atomics.
#[derive(Debug, Default)]
pub struct LoadCell {
    /// requests (high 32 bits) | waiting uncached tokens (low 32 bits).
    counts: AtomicU64,
    /// kv usage f32 bits (high) | throughput f32 bits (low).
    rates: AtomicU64,
    /// When it was read (`clock_nanos`), 0 = never.
    read_at: AtomicU64,
    /// Readings older than this are stale (0 = no poller: always stale).
    max_age_nanos: AtomicU64,
}

impl LoadCell {
    pub fn store(&self, reading: LoadReading, now: Instant) {
        self.counts.store(
            (u64::from(reading.requests) << 32) | u64::from(reading.waiting_uncached_tokens),
            Ordering::Relaxed,
        );
        self.rates.store(
            (u64::from(reading.kv_usage.to_bits()) << 32) | u64::from(reading.throughput.to_bits()),
            Ordering::Relaxed,
        );
        self.read_at.store(clock_nanos(now), Ordering::Relaxed);
    }

    /// Readings older than `max_age` are ignored from now on.
    pub fn set_max_age(&self, max_age: Duration) {
        self.max_age_nanos.store(
            u64::try_from(max_age.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// The reading if it is fresh at `now`.
    pub fn fresh_at(&self, now: Instant) -> Option<LoadReading> {
        let read_at = self.read_at.load(Ordering::Relaxed);
        let max_age = self.max_age_nanos.load(Ordering::Relaxed);
        if read_at == 0 || max_age == 0 || clock_nanos(now).saturating_sub(read_at) > max_age {
            return None;
        }
        Some(self.reading())
    }

    /// The last reading, fresh or not, and its age.
    pub fn last(&self, now: Instant) -> Option<(LoadReading, Duration)> {
        let read_at = self.read_at.load(Ordering::Relaxed);
        (read_at != 0).then(|| {
            (
                self.reading(),
                Duration::from_nanos(clock_nanos(now).saturating_sub(read_at)),
            )
        })
    }

    fn reading(&self) -> LoadReading {
        let counts = self.counts.load(Ordering::Relaxed);
        let rates = self.rates.load(Ordering::Relaxed);
        LoadReading {
            requests: (counts >> 32) as u32,
            waiting_uncached_tokens: counts as u32,
            kv_usage: f32::from_bits((rates >> 32) as u32),
            throughput: f32::from_bits(rates as u32),
        }
    }
}

/// Polls `GetLoads` of every worker of `role` in `workers` each `interval`
/// (the membership is re-read every round), until the runtime stops. Each
/// answer sets the worker's in-flight limit (unless configured); with
/// `store_loads` (a load-aware policy routes the role) it is also the
/// worker's load reading, fresh for three intervals.
pub fn spawn_load_polling(
    workers: WorkerSet,
    role: WorkerRole,
    interval: Duration,
    store_loads: bool,
) {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let members = workers.of_role(role);
            let polls = members
                .iter()
                .map(|worker| poll_one(Arc::clone(worker), interval, store_loads));
            futures::future::join_all(polls).await;
        }
    });
}

async fn poll_one(worker: Arc<super::Worker>, interval: Duration, store_loads: bool) {
    if store_loads {
        worker.load_cell().set_max_age(interval * 3);
    }
    match tokio::time::timeout(interval, worker.client().loads()).await {
        Ok(Ok(load)) => {
            worker.learn_limit(reported_limit(&load, worker.dp_rank().is_some()));
            if !store_loads {
                return;
            }
            let now = Instant::now();
            worker.load_cell().store(LoadReading::from_load(&load), now);
            crate::metrics::record_load_reading(worker.label(), role_name(&worker));
        }
        Ok(Err(err)) => tracing::debug!(worker = worker.label(), %err, "GetLoads failed"),
        Err(_) => tracing::debug!(worker = worker.label(), "GetLoads timed out"),
    }
    let age = worker.load_cell().last(Instant::now()).map(|(_, age)| age);
    crate::metrics::record_load_age(worker.label(), role_name(&worker), age);
}

fn role_name(worker: &super::Worker) -> &'static str {
    worker.role().name()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_round_trip_and_go_stale() {
        let cell = LoadCell::default();
        let t0 = Instant::now();
        assert_eq!(cell.fresh_at(t0), None);
        let reading = LoadReading {
            requests: 7,
            waiting_uncached_tokens: 4096,
            kv_usage: 0.25,
            throughput: 1500.5,
        };
        cell.store(reading, t0);
        assert_eq!(cell.fresh_at(t0), None, "no poller set a freshness limit");
        cell.set_max_age(Duration::from_secs(3));
        assert_eq!(cell.fresh_at(t0 + Duration::from_secs(2)), Some(reading));
        assert_eq!(cell.fresh_at(t0 + Duration::from_secs(4)), None);
        let (last, age) = cell.last(t0 + Duration::from_secs(4)).expect("a reading");
        assert_eq!(last, reading);
        assert_eq!(age, Duration::from_secs(4));
    }

    #[test]
    fn max_running_requests_becomes_the_limit() {
        let load = |max_running_requests, dp_rank_count| Load {
            max_running_requests,
            dp_rank_count,
            ..Load::default()
        };
        assert_eq!(reported_limit(&load(48, 1), false), Some(48));
        assert_eq!(reported_limit(&load(48, 4), false), Some(48), "one worker");
        assert_eq!(
            reported_limit(&load(48, 4), true),
            Some(12),
            "a rank's share"
        );
        assert_eq!(reported_limit(&load(2, 4), true), Some(1), "at least one");
        assert_eq!(reported_limit(&load(48, 0), true), Some(48));
        assert_eq!(reported_limit(&load(0, 1), false), None, "not reported");
        assert_eq!(reported_limit(&load(-5, 1), false), None);
    }

    #[test]
    fn a_load_becomes_a_reading() {
        let load = Load {
            running_requests: 3,
            waiting_requests: 2,
            used_tokens: 500,
            max_total_tokens: 1000,
            waiting_uncached_tokens: -4,
            gen_throughput: 250.0,
            ..Load::default()
        };
        assert_eq!(
            LoadReading::from_load(&load),
            LoadReading {
                requests: 5,
                waiting_uncached_tokens: 0,
                kv_usage: 0.5,
                throughput: 250.0,
            }
        );
    }
}
