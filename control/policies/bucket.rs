//! Bucket routing for prefill pools: requests are split by prompt length
//! into as many buckets as there are available workers, so short prompts do
//! not queue behind long ones. Bucket boundaries are quantiles of recent
//! prompt lengths, re-fitted every `refit_every` requests (and whenever the
//! number of workers changes); a length that falls on a boundary shared by
//! several buckets takes them in turn.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use super::{Policy, Pool, SelectionRequest};

#[derive(Debug, Clone, Copy)]
pub struct BucketConfig {
    /// Recent prompt lengths kept for fitting.
    pub history: usize,
    /// Requests between re-fits.
    pub refit_every: usize,
}

impl Default for BucketConfig {
    fn default() -> Self {
        Self {
            history: 1024,
            refit_every: 128,
        }
    }
}

#[derive(Debug, Default)]
struct Fit {
    lengths: VecDeque<u32>,
    since_fit: usize,
    /// Ascending; `boundaries.len() + 1` buckets.
    boundaries: Vec<u32>,
}

impl Fit {
    fn refit(&mut self, buckets: usize) {
        let mut sorted: Vec<u32> = self.lengths.iter().copied().collect();
        sorted.sort_unstable();
        self.boundaries = (1..buckets)
            .map(|b| sorted[(b * sorted.len() / buckets).min(sorted.len() - 1)])
            .collect();
        self.since_fit = 0;
    }
}

/// Length-bucketed routing.
#[derive(Debug, Default)]
pub struct Bucket {
    config: BucketConfig,
    fit: Mutex<Fit>,
    turn: AtomicUsize,
}

impl Bucket {
    pub fn new(config: BucketConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// The current bucket boundaries.
    pub fn boundaries(&self) -> Vec<u32> {
        self.fit
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .boundaries
            .clone()
    }
}

impl Policy for Bucket {
    fn name(&self) -> &'static str {
        "bucket"
    }

    fn select(&self, pool: &Pool<'_>, request: &SelectionRequest<'_>) -> usize {
        let available = pool.available();
        let buckets = available.len();
        let length = u32::try_from(request.input_ids.len()).unwrap_or(u32::MAX);
        let (lo, hi) = {
            let mut fit = self.fit.lock().unwrap_or_else(PoisonError::into_inner);
            if fit.lengths.len() == self.config.history.max(1) {
                fit.lengths.pop_front();
            }
            fit.lengths.push_back(length);
            fit.since_fit += 1;
            if fit.since_fit >= self.config.refit_every.max(1)
                || fit.boundaries.len() + 1 != buckets
            {
                fit.refit(buckets);
            }
            (
                fit.boundaries.partition_point(|&b| b < length),
                fit.boundaries.partition_point(|&b| b <= length),
            )
        };
        let span = hi - lo + 1;
        let bucket = lo + self.turn.fetch_add(1, Ordering::Relaxed) % span;
        available[bucket.min(buckets - 1)]
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{select, tokens, workers};
    use super::*;

    #[test]
    fn lengths_split_into_per_worker_buckets() {
        let fleet = workers(4);
        let policy = Bucket::new(BucketConfig {
            history: 400,
            refit_every: 50,
        });
        let prompt: Vec<u32> = vec![7; 4000];
        // Uniform lengths teach the quantiles; the 401st request re-fits on
        // the last 400 (1..=400).
        for length in 0..=400usize {
            select(&policy, &fleet, &tokens(&prompt[..length]));
        }
        assert_eq!(policy.boundaries(), [101, 201, 301]);
        assert_eq!(select(&policy, &fleet, &tokens(&prompt[..10])), 0);
        assert_eq!(select(&policy, &fleet, &tokens(&prompt[..150])), 1);
        assert_eq!(select(&policy, &fleet, &tokens(&prompt[..250])), 2);
        assert_eq!(select(&policy, &fleet, &tokens(&prompt[..3999])), 3);
    }

    #[test]
    fn the_fit_follows_the_traffic() {
        let fleet = workers(2);
        let policy = Bucket::new(BucketConfig {
            history: 100,
            refit_every: 10,
        });
        let prompt: Vec<u32> = vec![7; 5000];
        for i in 0..100usize {
            select(&policy, &fleet, &tokens(&prompt[..10 + i % 10]));
        }
        let short = policy.boundaries();
        for i in 0..100usize {
            select(&policy, &fleet, &tokens(&prompt[..1000 + i * 10]));
        }
        let long = policy.boundaries();
        assert!(short[0] < 20 && long[0] >= 1000, "{short:?} {long:?}");
    }

    #[test]
    fn identical_lengths_share_the_buckets_they_span() {
        let fleet = workers(3);
        let policy = Bucket::default();
        let prompt = [1u32; 64];
        let mut counts = [0usize; 3];
        for _ in 0..300 {
            counts[select(&policy, &fleet, &tokens(&prompt))] += 1;
        }
        assert!(counts.iter().all(|&c| c >= 90), "{counts:?}");
    }

    #[test]
    fn a_changed_fleet_refits_at_once() {
        let fleet = workers(3);
        let policy = Bucket::default();
        let prompt = vec![1u32; 100];
        for length in 1..=90usize {
            select(&policy, &fleet, &tokens(&prompt[..length]));
        }
        assert_eq!(policy.boundaries().len(), 2);
        fleet[1].set_healthy(false);
        let pick = select(&policy, &fleet, &tokens(&prompt[..5]));
        assert_eq!(policy.boundaries().len(), 1);
        assert_eq!(pick, 0);
        assert_eq!(select(&policy, &fleet, &tokens(&prompt[..90])), 2);
    }
}
