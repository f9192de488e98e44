//! Routing policies: which healthy worker of a role takes a request.
//!
//! Every policy implements [`Policy`]; routers hold one per role. Selection
//! never blocks and never does I/O: it reads the candidates' in-flight counts
//! and the policy's own in-memory state.

mod cache_aware;
mod consistent_hash;

pub use cache_aware::CacheAware;
pub use consistent_hash::ConsistentHashing;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::workers::Worker;

/// What a policy may look at when choosing.
#[derive(Debug, Clone, Copy, Default)]
pub struct SelectionRequest<'a> {
    /// The prompt's token ids.
    pub input_ids: &'a [u32],
    /// An explicit sticky key (`X-SMG-Routing-Key`).
    pub routing_key: Option<&'a str>,
    /// A media item's content hash (encode routing in EPD).
    pub content_hash: Option<&'a [u8; 32]>,
}

/// A routing policy.
pub trait Policy: Send + Sync + fmt::Debug {
    fn name(&self) -> &'static str;

    /// Picks the index of one of `candidates` (healthy, never empty).
    fn select(&self, candidates: &[Arc<Worker>], request: &SelectionRequest<'_>) -> usize;

    /// Learns the route taken (cache-aware policies remember prefixes).
    fn on_routed(&self, _worker: &Worker, _request: &SelectionRequest<'_>) {}
}

/// The policies `--policy` and friends accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum PolicyKind {
    RoundRobin,
    Random,
    PowerOfTwo,
    ConsistentHashing,
    CacheAware,
}

impl PolicyKind {
    pub fn build(self) -> Arc<dyn Policy> {
        match self {
            PolicyKind::RoundRobin => Arc::new(RoundRobin::default()),
            PolicyKind::Random => Arc::new(Random),
            PolicyKind::PowerOfTwo => Arc::new(PowerOfTwo),
            PolicyKind::ConsistentHashing => Arc::new(ConsistentHashing::default()),
            PolicyKind::CacheAware => Arc::new(CacheAware::default()),
        }
    }
}

/// Each worker in turn.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round_robin"
    }

    fn select(&self, candidates: &[Arc<Worker>], _request: &SelectionRequest<'_>) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % candidates.len()
    }
}

/// A uniformly random worker.
#[derive(Debug, Default)]
pub struct Random;

impl Policy for Random {
    fn name(&self) -> &'static str {
        "random"
    }

    fn select(&self, candidates: &[Arc<Worker>], _request: &SelectionRequest<'_>) -> usize {
        rand::random_range(0..candidates.len())
    }
}

/// Two random workers; the one with fewer requests in flight wins.
#[derive(Debug, Default)]
pub struct PowerOfTwo;

impl Policy for PowerOfTwo {
    fn name(&self) -> &'static str {
        "power_of_two"
    }

    fn select(&self, candidates: &[Arc<Worker>], _request: &SelectionRequest<'_>) -> usize {
        if candidates.len() == 1 {
            return 0;
        }
        let first = rand::random_range(0..candidates.len());
        let second = (first + rand::random_range(1..candidates.len())) % candidates.len();
        if candidates[second].in_flight() < candidates[first].in_flight() {
            second
        } else {
            first
        }
    }
}

/// The index of the candidate with the fewest requests in flight.
pub(crate) fn least_loaded(candidates: &[Arc<Worker>]) -> usize {
    candidates
        .iter()
        .enumerate()
        .min_by_key(|(_, worker)| worker.in_flight())
        .map_or(0, |(index, _)| index)
}

#[cfg(test)]
pub mod test_support {
    use super::*;
    use crate::engine::{EngineClient, Runtime};
    use crate::workers::WorkerRole;

    /// A runtime for the engine clients' lazy channels (they need one to
    /// exist; these tests never connect).
    fn runtime() -> &'static tokio::runtime::Runtime {
        static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
        RUNTIME.get_or_init(|| tokio::runtime::Runtime::new().expect("tokio runtime"))
    }

    /// `n` workers on distinct (unreachable) URLs.
    pub fn workers(n: usize) -> Vec<Arc<Worker>> {
        let _entered = runtime().enter();
        (0..n)
            .map(|i| {
                let client = EngineClient::new(
                    &format!("grpc://127.0.0.1:{}", 10_000 + i),
                    Runtime::TokenSpeed,
                )
                .expect("client");
                Arc::new(Worker::new(client, WorkerRole::Regular, None).expect("worker"))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::workers;
    use super::*;

    #[test]
    fn round_robin_visits_every_worker_in_turn() {
        let fleet = workers(3);
        let policy = RoundRobin::default();
        let picks: Vec<usize> = (0..6)
            .map(|_| policy.select(&fleet, &SelectionRequest::default()))
            .collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn random_spreads_over_all_workers() {
        let fleet = workers(4);
        let mut counts = [0usize; 4];
        for _ in 0..4000 {
            counts[Random.select(&fleet, &SelectionRequest::default())] += 1;
        }
        for count in counts {
            assert!((700..1300).contains(&count), "{counts:?}");
        }
    }

    #[test]
    fn power_of_two_avoids_the_busy_worker() {
        let fleet = workers(2);
        let _busy: Vec<_> = (0..5).map(|_| fleet[0].acquire()).collect();
        for _ in 0..50 {
            assert_eq!(PowerOfTwo.select(&fleet, &SelectionRequest::default()), 1);
        }
    }

    #[test]
    fn least_loaded_picks_the_idlest() {
        let fleet = workers(3);
        let _a = fleet[0].acquire();
        let _b = fleet[2].acquire();
        assert_eq!(least_loaded(&fleet), 1);
    }
}
