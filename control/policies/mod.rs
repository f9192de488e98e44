//! Routing policies: which worker of a role takes a request.
//!
//! Every policy implements [`Policy`]; a router holds one per role (and, with
//! several models, one set per model). A policy sees the role's whole
//! membership as a [`Pool`] — the workers in a stable order plus which of
//! them may take a request now (ready, not draining, circuit not open) — and
//! must answer one of the available ones. Hash rings use the full membership
//! so that a worker going down moves only its own keys.
//!
//! Selection never blocks on I/O: it reads atomics (in-flight counts, the
//! latest `GetLoads` reading) and the policy's in-memory state.

mod bucket;
mod cache_aware;
mod consistent_hash;
mod least_load;
mod manual;
mod prefix_hash;

pub use bucket::{Bucket, BucketConfig};
pub use cache_aware::{CacheAware, CacheAwareConfig};
pub use consistent_hash::ConsistentHashing;
pub use least_load::LeastLoad;
pub use manual::{Manual, ManualConfig};
pub use prefix_hash::{PrefixHash, PrefixHashConfig};

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

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

/// The workers of one role as a policy sees them.
#[derive(Debug, Clone, Copy)]
pub struct Pool<'a> {
    members: &'a [Arc<Worker>],
    available: &'a [usize],
    generation: u64,
}

impl<'a> Pool<'a> {
    /// `available` holds indices into `members`, ascending, not empty;
    /// `generation` changes whenever `members` does.
    pub fn new(members: &'a [Arc<Worker>], available: &'a [usize], generation: u64) -> Self {
        debug_assert!(!available.is_empty());
        debug_assert!(available.windows(2).all(|w| w[0] < w[1]));
        Self {
            members,
            available,
            generation,
        }
    }

    pub fn members(&self) -> &'a [Arc<Worker>] {
        self.members
    }

    /// Indices of the members that may take a request, ascending.
    pub fn available(&self) -> &'a [usize] {
        self.available
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn worker(&self, index: usize) -> &'a Arc<Worker> {
        &self.members[index]
    }

    pub fn is_available(&self, index: usize) -> bool {
        self.available.binary_search(&index).is_ok()
    }

    /// The member index of the available worker with this serial.
    pub fn find_available(&self, serial: u64) -> Option<usize> {
        self.available
            .iter()
            .copied()
            .find(|&index| self.members[index].serial() == serial)
    }
}

/// A routing policy.
pub trait Policy: Send + Sync + fmt::Debug {
    fn name(&self) -> &'static str;

    /// Picks a member index of `pool`, one of its available ones.
    fn select(&self, pool: &Pool<'_>, request: &SelectionRequest<'_>) -> usize;

    /// Learns the route taken (cache-aware policies remember prefixes).
    fn on_routed(&self, _worker: &Worker, _request: &SelectionRequest<'_>) {}

    /// Waits until every route `on_routed` was told is learned (cache-aware
    /// learns in the background); tests and benchmarks use it.
    fn settle(&self) {}

    /// Whether the policy reads engine-reported load (so the gateway polls
    /// `GetLoads` for the workers it routes).
    fn needs_loads(&self) -> bool {
        false
    }
}

/// The policies `--policy` and friends accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    RoundRobin,
    Random,
    PowerOfTwo,
    LeastLoad,
    CacheAware,
    ConsistentHashing,
    PrefixHash,
    Manual,
    Bucket,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 9] = [
        PolicyKind::RoundRobin,
        PolicyKind::Random,
        PolicyKind::PowerOfTwo,
        PolicyKind::LeastLoad,
        PolicyKind::CacheAware,
        PolicyKind::ConsistentHashing,
        PolicyKind::PrefixHash,
        PolicyKind::Manual,
        PolicyKind::Bucket,
    ];

    /// The name flags and configs use.
    pub const fn name(self) -> &'static str {
        match self {
            PolicyKind::RoundRobin => "round_robin",
            PolicyKind::Random => "random",
            PolicyKind::PowerOfTwo => "power_of_two",
            PolicyKind::LeastLoad => "least_load",
            PolicyKind::CacheAware => "cache_aware",
            PolicyKind::ConsistentHashing => "consistent_hashing",
            PolicyKind::PrefixHash => "prefix_hash",
            PolicyKind::Manual => "manual",
            PolicyKind::Bucket => "bucket",
        }
    }

    /// A fresh policy with default tunables.
    pub fn build(self) -> Arc<dyn Policy> {
        self.build_with(&PolicyTunables::default())
    }

    pub fn build_with(self, tunables: &PolicyTunables) -> Arc<dyn Policy> {
        match self {
            PolicyKind::RoundRobin => Arc::new(RoundRobin::default()),
            PolicyKind::Random => Arc::new(Random),
            PolicyKind::PowerOfTwo => Arc::new(PowerOfTwo),
            PolicyKind::LeastLoad => Arc::new(LeastLoad::default()),
            PolicyKind::CacheAware => Arc::new(CacheAware::new(tunables.cache_aware)),
            PolicyKind::ConsistentHashing => Arc::new(ConsistentHashing::default()),
            PolicyKind::PrefixHash => Arc::new(PrefixHash::new(tunables.prefix_hash)),
            PolicyKind::Manual => Arc::new(Manual::new(tunables.manual)),
            PolicyKind::Bucket => Arc::new(Bucket::new(tunables.bucket)),
        }
    }
}

impl std::str::FromStr for PolicyKind {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        PolicyKind::ALL
            .into_iter()
            .find(|kind| kind.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = PolicyKind::ALL.map(PolicyKind::name).to_vec();
                format!("unknown policy {name:?} ({})", names.join(", "))
            })
    }
}

impl std::fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The tunables of the policies that have any.
#[derive(Debug, Clone, Copy, Default)]
pub struct PolicyTunables {
    pub cache_aware: CacheAwareConfig,
    pub prefix_hash: PrefixHashConfig,
    pub manual: ManualConfig,
    pub bucket: BucketConfig,
}

/// A worker's load in requests: the engine's running + waiting count when a
/// fresh `GetLoads` reading exists, else the gateway's in-flight count.
pub(crate) fn request_load(worker: &Worker, now: Instant) -> u64 {
    match worker.load_cell().fresh_at(now) {
        Some(reading) => u64::from(reading.requests),
        None => worker.in_flight() as u64,
    }
}

/// The available member with the smallest `key`; ties go to the first one
/// at or after `start` (in availability order), so equal workers take turns.
pub(crate) fn min_rotating<K: PartialOrd>(
    pool: &Pool<'_>,
    start: usize,
    key: impl Fn(&Worker) -> K,
) -> usize {
    let available = pool.available();
    let n = available.len();
    let mut best: Option<(K, usize)> = None;
    for step in 0..n {
        let index = available[(start + step) % n];
        let candidate = key(pool.worker(index));
        if best.as_ref().is_none_or(|(least, _)| candidate < *least) {
            best = Some((candidate, index));
        }
    }
    best.map_or(available[0], |(_, index)| index)
}

/// The available member with the lowest request load (then fewest in-flight
/// tokens); ties rotate with `start`.
pub(crate) fn least_loaded_from(pool: &Pool<'_>, now: Instant, start: usize) -> usize {
    min_rotating(pool, start, |worker| {
        (request_load(worker, now), worker.in_flight_tokens())
    })
}

/// The available member with the lowest request load (ties: the first).
pub(crate) fn least_loaded(pool: &Pool<'_>) -> usize {
    least_loaded_from(pool, Instant::now(), 0)
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

    fn select(&self, pool: &Pool<'_>, _request: &SelectionRequest<'_>) -> usize {
        let available = pool.available();
        available[self.next.fetch_add(1, Ordering::Relaxed) % available.len()]
    }
}

/// A uniformly random worker.
#[derive(Debug, Default)]
pub struct Random;

impl Policy for Random {
    fn name(&self) -> &'static str {
        "random"
    }

    fn select(&self, pool: &Pool<'_>, _request: &SelectionRequest<'_>) -> usize {
        let available = pool.available();
        available[rand::random_range(0..available.len())]
    }
}

/// Two random workers; the less loaded one wins (engine-reported load when
/// fresh, else in-flight requests).
#[derive(Debug, Default)]
pub struct PowerOfTwo;

impl Policy for PowerOfTwo {
    fn name(&self) -> &'static str {
        "power_of_two"
    }

    fn needs_loads(&self) -> bool {
        true
    }

    fn select(&self, pool: &Pool<'_>, _request: &SelectionRequest<'_>) -> usize {
        let available = pool.available();
        let n = available.len();
        if n == 1 {
            return available[0];
        }
        let first = rand::random_range(0..n);
        let second = (first + rand::random_range(1..n)) % n;
        let (a, b) = (available[first], available[second]);
        let now = Instant::now();
        let load = |index: usize| {
            let worker = pool.worker(index);
            (request_load(worker, now), worker.in_flight())
        };
        if load(b) < load(a) { b } else { a }
    }
}

#[cfg(test)]
pub mod test_support {
    use super::*;
    use crate::engine::{EngineClient, Runtime};
    use crate::workers::{LoadReading, WorkerRole};

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
                Arc::new(Worker::new(Arc::new(client), WorkerRole::Regular, None).expect("worker"))
            })
            .collect()
    }

    /// The available indices of `fleet`.
    pub fn available(fleet: &[Arc<Worker>]) -> Vec<usize> {
        (0..fleet.len())
            .filter(|&i| fleet[i].is_available())
            .collect()
    }

    /// Selects from `fleet` (generation 1) with the current availability.
    pub fn select(
        policy: &dyn Policy,
        fleet: &[Arc<Worker>],
        request: &SelectionRequest<'_>,
    ) -> usize {
        let available = available(fleet);
        policy.select(&Pool::new(fleet, &available, 1), request)
    }

    /// Selects and tells the policy the route taken.
    pub fn route(
        policy: &dyn Policy,
        fleet: &[Arc<Worker>],
        request: &SelectionRequest<'_>,
    ) -> usize {
        let index = select(policy, fleet, request);
        policy.on_routed(&fleet[index], request);
        policy.settle();
        index
    }

    /// Gives `worker` a fresh engine-reported load.
    pub fn report(worker: &Worker, reading: LoadReading) {
        worker
            .load_cell()
            .set_max_age(std::time::Duration::from_secs(3600));
        worker.load_cell().store(reading, Instant::now());
    }

    pub fn tokens(ids: &[u32]) -> SelectionRequest<'_> {
        SelectionRequest {
            input_ids: ids,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{report, select, workers};
    use super::*;
    use crate::workers::LoadReading;

    #[test]
    fn round_robin_visits_every_available_worker_in_turn() {
        let fleet = workers(4);
        fleet[2].set_healthy(false);
        let policy = RoundRobin::default();
        let picks: Vec<usize> = (0..6)
            .map(|_| select(&policy, &fleet, &SelectionRequest::default()))
            .collect();
        assert_eq!(picks, [0, 1, 3, 0, 1, 3]);
    }

    #[test]
    fn random_spreads_over_all_workers() {
        let fleet = workers(4);
        let mut counts = [0usize; 4];
        for _ in 0..4000 {
            counts[select(&Random, &fleet, &SelectionRequest::default())] += 1;
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
            assert_eq!(select(&PowerOfTwo, &fleet, &SelectionRequest::default()), 1);
        }
    }

    #[test]
    fn power_of_two_prefers_fresh_engine_load_over_in_flight() {
        let fleet = workers(2);
        // The gateway sees worker 1 busier, but the engine says worker 0 is.
        let _held = fleet[1].acquire();
        report(
            &fleet[0],
            LoadReading {
                requests: 9,
                ..Default::default()
            },
        );
        report(
            &fleet[1],
            LoadReading {
                requests: 2,
                ..Default::default()
            },
        );
        for _ in 0..50 {
            assert_eq!(select(&PowerOfTwo, &fleet, &SelectionRequest::default()), 1);
        }
    }

    #[test]
    fn least_loaded_picks_the_idlest_and_rotates_ties() {
        let fleet = workers(3);
        let _a = fleet[0].acquire();
        let _b = fleet[2].acquire();
        let all: Vec<usize> = (0..3).collect();
        let pool = Pool::new(&fleet, &all, 1);
        assert_eq!(least_loaded(&pool), 1);
        let idle = workers(3);
        let pool = Pool::new(&idle, &all, 1);
        let now = Instant::now();
        let picks: Vec<usize> = (0..3).map(|s| least_loaded_from(&pool, now, s)).collect();
        assert_eq!(picks, [0, 1, 2]);
    }

    /// No policy ever answers a worker that is not available, whatever the
    /// request looks like.
    #[test]
    fn every_policy_skips_unavailable_workers() {
        let fleet = workers(6);
        fleet[0].set_healthy(false);
        fleet[3].start_draining();
        for _ in 0..crate::workers::BreakerConfig::default().failure_threshold {
            fleet[4].record_outcome(false);
        }
        let prompts: Vec<Vec<u32>> = (0..40u32)
            .map(|i| (i * 7..i * 7 + 16 * (1 + i % 5)).collect())
            .collect();
        for kind in PolicyKind::ALL {
            let policy = kind.build();
            for (i, prompt) in prompts.iter().enumerate() {
                let key = format!("user-{}", i % 9);
                let hash = [i as u8; 32];
                let request = SelectionRequest {
                    input_ids: prompt,
                    routing_key: i.is_multiple_of(2).then_some(key.as_str()),
                    content_hash: i.is_multiple_of(3).then_some(&hash),
                };
                let index = test_support::route(policy.as_ref(), &fleet, &request);
                assert!(
                    [1, 2, 5].contains(&index),
                    "{} picked unavailable worker {index}",
                    policy.name()
                );
            }
        }
    }
}
