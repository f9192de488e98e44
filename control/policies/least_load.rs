//! Least load: the worker whose queue drains soonest.
//!
//! A worker's score estimates the seconds of work ahead of a new request:
//! (prompt tokens the engine has queued without a cache hit + prompt tokens
//! the gateway has in flight there) / the engine's throughput, plus a
//! KV-pressure term (a nearly full KV cache means preemption soon). Without
//! a fresh `GetLoads` reading the engine terms drop out and the score falls
//! back to the gateway's in-flight tokens, then in-flight requests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use super::{Policy, Pool, SelectionRequest, min_rotating};
use crate::workers::Worker;

/// Assumed tokens/s when a worker reports none.
const DEFAULT_THROUGHPUT: f64 = 1000.0;
/// Seconds of penalty for a full KV cache (scaled by the used share).
const KV_PRESSURE_SECS: f64 = 2.0;

/// Routes to the worker with the least estimated work ahead.
#[derive(Debug, Default)]
pub struct LeastLoad {
    /// Rotates the start of the scan so equal workers take turns.
    start: AtomicUsize,
}

/// A worker's estimated seconds of queued work (lower is better).
pub(crate) fn work_ahead(worker: &Worker, now: Instant) -> f64 {
    let in_flight_tokens = worker.in_flight_tokens() as f64;
    match worker.load_cell().fresh_at(now) {
        Some(reading) => {
            let throughput = if reading.throughput > 0.0 {
                f64::from(reading.throughput)
            } else {
                DEFAULT_THROUGHPUT
            };
            (f64::from(reading.waiting_uncached_tokens) + in_flight_tokens) / throughput
                + KV_PRESSURE_SECS * f64::from(reading.kv_usage)
        }
        None => in_flight_tokens / DEFAULT_THROUGHPUT,
    }
}

impl Policy for LeastLoad {
    fn name(&self) -> &'static str {
        "least_load"
    }

    fn needs_loads(&self) -> bool {
        true
    }

    fn select(&self, pool: &Pool<'_>, _request: &SelectionRequest<'_>) -> usize {
        let start = self.start.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        min_rotating(pool, start, |worker| {
            (work_ahead(worker, now), worker.in_flight())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{report, select, tokens, workers};
    use super::*;
    use crate::workers::LoadReading;

    #[test]
    fn without_engine_load_it_follows_in_flight_tokens_then_requests() {
        let fleet = workers(3);
        let policy = LeastLoad::default();
        let _long = fleet[0].acquire_tokens(4000);
        let _short_a = fleet[1].acquire_tokens(100);
        let _short_b = fleet[1].acquire_tokens(100);
        let _one = fleet[2].acquire_tokens(300);
        // 200 tokens on worker 1 beat 300 on worker 2 despite two requests.
        assert_eq!(select(&policy, &fleet, &tokens(&[1; 32])), 1);
    }

    #[test]
    fn equal_workers_take_turns() {
        let fleet = workers(3);
        let policy = LeastLoad::default();
        let mut picks: Vec<usize> = (0..3)
            .map(|_| select(&policy, &fleet, &tokens(&[])))
            .collect();
        picks.sort_unstable();
        assert_eq!(picks, [0, 1, 2]);
    }

    #[test]
    fn engine_queues_throughput_and_kv_pressure_count() {
        let fleet = workers(3);
        let policy = LeastLoad::default();
        // 0: 8000 queued tokens at 1000 tok/s = 8 s.
        report(
            &fleet[0],
            LoadReading {
                requests: 4,
                waiting_uncached_tokens: 8000,
                kv_usage: 0.1,
                throughput: 1000.0,
            },
        );
        // 1: the same queue on a 4x faster engine = 2 s, but a full KV cache (+2 s).
        report(
            &fleet[1],
            LoadReading {
                requests: 4,
                waiting_uncached_tokens: 8000,
                kv_usage: 1.0,
                throughput: 4000.0,
            },
        );
        // 2: 3000 tokens at 1000 tok/s = 3 s, empty cache.
        report(
            &fleet[2],
            LoadReading {
                requests: 1,
                waiting_uncached_tokens: 3000,
                kv_usage: 0.0,
                throughput: 1000.0,
            },
        );
        assert_eq!(select(&policy, &fleet, &tokens(&[])), 2);
        // Relieve worker 1's KV pressure: it becomes the best.
        report(
            &fleet[1],
            LoadReading {
                requests: 4,
                waiting_uncached_tokens: 8000,
                kv_usage: 0.2,
                throughput: 4000.0,
            },
        );
        assert_eq!(select(&policy, &fleet, &tokens(&[])), 1);
    }
}
