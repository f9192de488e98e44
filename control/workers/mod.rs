//! The engine workers a router can send to: their identity and role, client,
//! in-flight load, health, circuit breaker and reported load, and the shared
//! membership ([`WorkerSet`]) that routers select from and the admin API
//! changes at run time.
//!
//! A request that picks a worker holds a [`LoadGuard`] for as long as it uses
//! it; the guard's `Drop` gives the slot back, so a cancelled or failed
//! request can never leak a load count. A worker caps the requests it holds
//! at what its engine reports it runs at once (`max_running_requests` in
//! `GetLoads`, re-read as the engine reports it), or at
//! `--worker-max-in-flight` when that is given (`none`: no limit): a full
//! worker takes nobody new, and the guard's drop wakes one request waiting
//! for room.

mod breaker;
mod health;
mod loads;
mod registry;
mod transport;

pub use breaker::{Admission, BreakerConfig, BreakerState, CircuitBreaker, TrialTicket};
pub use health::{
    HealthConfig, HealthState, HealthTracker, probe, spawn_circuit_probe, spawn_health_checks,
    spawn_probe_loop,
};
pub use loads::{LoadCell, LoadReading, reported_limit, spawn_load_polling};
pub use registry::{
    Lifecycle, LoadStatus, WorkerRegistry, WorkerSpec, WorkerStatus, advertised_bootstrap_port,
};
pub use transport::{
    LaneDirectory, LaneMode, TransportSource, WorkerLaneOverride, WorkerTransport, normalize_url,
};

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::engine::Engine;
use crate::error::{Error, ErrorCode, Result};

/// A worker's part in the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WorkerRole {
    Regular,
    Prefill,
    Decode,
    Encode,
}

impl WorkerRole {
    pub const fn name(self) -> &'static str {
        match self {
            WorkerRole::Regular => "regular",
            WorkerRole::Prefill => "prefill",
            WorkerRole::Decode => "decode",
            WorkerRole::Encode => "encode",
        }
    }
}

impl fmt::Display for WorkerRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for WorkerRole {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<Self, String> {
        match text {
            "regular" => Ok(WorkerRole::Regular),
            "prefill" => Ok(WorkerRole::Prefill),
            "decode" => Ok(WorkerRole::Decode),
            "encode" => Ok(WorkerRole::Encode),
            other => Err(format!(
                "unknown worker role {other:?} (regular, prefill, decode, encode)"
            )),
        }
    }
}

/// A process-unique number per worker, so policies can key their memory by
/// a `u64` instead of a URL.
fn next_serial() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// How many requests one worker is sent at once (`--worker-max-in-flight`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InFlightLimit {
    /// The `max_running_requests` its engine reports in `GetLoads`, re-read
    /// with the load polling; no limit while it reports none.
    #[default]
    Engine,
    /// At most this many, whatever the engine reports.
    Fixed(usize),
    /// No limit, whatever the engine reports: every request is sent at
    /// once and waits in the engine's queue (`none`).
    Unlimited,
}

impl InFlightLimit {
    /// Whether the limit follows what the engine reports (so its loads
    /// must be read).
    pub fn follows_engine(self) -> bool {
        self == Self::Engine
    }
}

/// One engine worker.
#[derive(Debug)]
pub struct Worker {
    /// A short stable id derived from the URL (safe in an admin API path).
    id: String,
    /// Unique in a gateway.
    url: String,
    serial: u64,
    role: WorkerRole,
    /// Host of the worker's rendezvous (bootstrap) server: the worker's host.
    bootstrap_host: String,
    bootstrap_port: Option<u16>,
    /// The data-parallel rank this logical worker stands for (`--dp-aware`).
    dp_rank: Option<u32>,
    /// How metrics and logs name it (see [`Worker::label`]).
    label: String,
    client: Arc<dyn Engine>,
    in_flight: AtomicUsize,
    /// Most requests held at once; 0: no limit.
    max_in_flight: AtomicUsize,
    /// The limit was configured (`--worker-max-in-flight N` or `none`):
    /// what the engine reports does not change it.
    limit_configured: bool,
    /// Wakes one waiting request when a held one ends (limited workers).
    room: tokio::sync::Notify,
    /// Prompt tokens of the requests in flight.
    in_flight_tokens: AtomicU64,
    health: AtomicU8,
    /// Removed from the fleet: finishes what it has, takes nothing new.
    draining: AtomicBool,
    breaker: CircuitBreaker,
    /// Woken when the circuit opens (the circuit probe waits on it).
    circuit_opened: Arc<tokio::sync::Notify>,
    load: LoadCell,
    /// Cancelled when the worker leaves the fleet; stops its probe loop.
    retired: CancellationToken,
    /// The tensor transport its admin registration asked for; it lives
    /// and goes with the worker.
    lane_override: Option<WorkerLaneOverride>,
    /// Keeps the series labelled with its URL in `/metrics` while it
    /// exists: its last holder (its drain, a probe, a load poll) is the
    /// last that can record for it.
    _series: crate::metrics::WorkerSeriesHold,
}

impl Worker {
    pub fn new(
        client: Arc<dyn Engine>,
        role: WorkerRole,
        bootstrap_port: Option<u16>,
    ) -> Result<Self> {
        let url = client.url().to_owned();
        let bootstrap_host = host_of(&url).ok_or_else(|| {
            Error::new(
                ErrorCode::InvalidRequest,
                format!("worker URL {url:?} has no host"),
            )
        })?;
        let circuit_opened = Arc::new(tokio::sync::Notify::new());
        let breaker = observed_breaker(&url, role, BreakerConfig::default(), &circuit_opened);
        let series = crate::metrics::WorkerSeriesHold::new(&url);
        Ok(Self {
            id: worker_id(&url),
            label: url.clone(),
            url,
            serial: next_serial(),
            role,
            bootstrap_host,
            bootstrap_port,
            dp_rank: None,
            client,
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            limit_configured: false,
            room: tokio::sync::Notify::new(),
            in_flight_tokens: AtomicU64::new(0),
            health: AtomicU8::new(HealthState::Ready as u8),
            draining: AtomicBool::new(false),
            breaker,
            circuit_opened,
            load: LoadCell::default(),
            retired: CancellationToken::new(),
            lane_override: None,
            _series: series,
        })
    }

    /// The worker with the tensor transport its registration asked for.
    pub fn with_lane_override(mut self, lane_override: Option<WorkerLaneOverride>) -> Self {
        self.lane_override = lane_override;
        self
    }

    /// The tensor transport its registration asked for, if any.
    pub fn lane_override(&self) -> Option<WorkerLaneOverride> {
        self.lane_override
    }

    /// The worker with its in-flight limit as configured: following its
    /// engine's reports, at most `N` requests at once (a limit below one is
    /// one), or none, whatever its engine reports.
    pub fn with_in_flight_limit(mut self, limit: InFlightLimit) -> Self {
        match limit {
            InFlightLimit::Engine => {}
            InFlightLimit::Fixed(limit) => {
                self.max_in_flight = AtomicUsize::new(limit.max(1));
                self.limit_configured = true;
            }
            InFlightLimit::Unlimited => {
                self.max_in_flight = AtomicUsize::new(0);
                self.limit_configured = true;
            }
        }
        self
    }

    /// Most requests this worker holds at once, if limited.
    pub fn max_in_flight(&self) -> Option<usize> {
        Some(self.max_in_flight.load(Ordering::Acquire)).filter(|&max| max > 0)
    }

    /// Takes the limit the engine reports (`None`: it reports none, so no
    /// limit) unless one was configured. A raised or lifted limit wakes
    /// every request waiting for room; a lowered one takes effect as the
    /// requests above it end. Returns whether the limit changed.
    pub fn learn_limit(&self, reported: Option<usize>) -> bool {
        if self.limit_configured {
            return false;
        }
        let limit = reported.map_or(0, |limit| limit.max(1));
        let before = self.max_in_flight.swap(limit, Ordering::AcqRel);
        if before == limit {
            return false;
        }
        tracing::info!(
            worker = self.label(),
            limit = ?reported,
            before = ?Some(before).filter(|&max| max > 0),
            "the worker's in-flight limit follows its engine's max_running_requests"
        );
        self.room.notify_waiters();
        true
    }

    /// Whether the worker holds fewer requests than its limit.
    pub fn has_room(&self) -> bool {
        self.max_in_flight()
            .is_none_or(|max| self.in_flight() < max)
    }

    /// Resolves when a request holding this worker ends (a limited worker
    /// only: an unlimited one never wakes anyone). Wakes one waiter; a
    /// waiter dropped after it was woken passes the wake-up on.
    pub fn room_freed(&self) -> tokio::sync::futures::Notified<'_> {
        self.room.notified()
    }

    /// The worker with this circuit-breaker configuration.
    pub fn with_breaker(mut self, config: BreakerConfig) -> Self {
        self.breaker = observed_breaker(&self.label, self.role, config, &self.circuit_opened);
        self
    }

    /// The logical worker for one data-parallel rank of the engine (its id
    /// names the rank; the URL stays the engine's).
    pub fn with_dp_rank(mut self, rank: u32) -> Self {
        self.id = worker_id(&format!("{}#dp{rank}", self.url));
        self.dp_rank = Some(rank);
        self.label = format!("{}@{rank}", self.url);
        let config = *self.breaker.config();
        self.breaker = observed_breaker(&self.label, self.role, config, &self.circuit_opened);
        self
    }

    pub fn dp_rank(&self) -> Option<u32> {
        self.dp_rank
    }

    /// The worker starting in this health state.
    pub fn with_health(self, state: HealthState) -> Self {
        self.health.store(state as u8, Ordering::Relaxed);
        self
    }

    /// The worker's id in the fleet: stable for a URL, URL-safe.
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// How metrics and logs name this worker: its URL, and for one
    /// data-parallel rank `<url>@<rank>` (as SMG names the ranks of a
    /// DP-aware worker), so the ranks of one engine have series of their
    /// own. Series about the engine's connections keep the bare URL.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// A process-unique number for this worker.
    pub fn serial(&self) -> u64 {
        self.serial
    }

    pub fn role(&self) -> WorkerRole {
        self.role
    }

    /// The worker's engine calls (gRPC in production).
    pub fn client(&self) -> &Arc<dyn Engine> {
        &self.client
    }

    pub fn bootstrap_host(&self) -> &str {
        &self.bootstrap_host
    }

    pub fn bootstrap_port(&self) -> Option<u16> {
        self.bootstrap_port
    }

    /// Requests currently holding this worker.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Prompt tokens of the requests currently holding this worker.
    pub fn in_flight_tokens(&self) -> u64 {
        self.in_flight_tokens.load(Ordering::Relaxed)
    }

    pub fn health(&self) -> HealthState {
        HealthState::from_u8(self.health.load(Ordering::Relaxed))
    }

    pub fn set_health(&self, state: HealthState) {
        let before = self.health.swap(state as u8, Ordering::Relaxed);
        if before != state as u8 {
            crate::metrics::record_health(self.label(), self.role.name(), state.name());
        }
    }

    pub fn is_healthy(&self) -> bool {
        self.health() == HealthState::Ready
    }

    /// Marks the worker ready or not ready (tests, and health without probes).
    pub fn set_healthy(&self, healthy: bool) {
        self.set_health(if healthy {
            HealthState::Ready
        } else {
            HealthState::NotReady
        });
    }

    pub fn breaker(&self) -> &CircuitBreaker {
        &self.breaker
    }

    /// Waits until the circuit is open (at once if it is).
    pub async fn circuit_open(&self) {
        loop {
            let opened = self.circuit_opened.notified();
            tokio::pin!(opened);
            opened.as_mut().enable();
            if self.breaker.state() == BreakerState::Open {
                return;
            }
            opened.await;
        }
    }

    /// Feeds an RPC outcome to the circuit breaker.
    pub fn record_outcome(&self, success: bool) {
        self.breaker.record(success);
    }

    pub fn load_cell(&self) -> &LoadCell {
        &self.load
    }

    /// The engine-reported load if it is fresh.
    pub fn reported_load(&self) -> Option<LoadReading> {
        self.load.fresh_at(Instant::now())
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Takes the worker out of rotation for good; requests in flight finish.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Stops the worker's background tasks (its probe loop).
    pub fn retire(&self) {
        self.start_draining();
        self.retired.cancel();
    }

    pub fn retired_token(&self) -> CancellationToken {
        self.retired.clone()
    }

    /// Whether a new request may go here: ready, not draining, circuit not
    /// open.
    pub fn is_available(&self) -> bool {
        self.is_healthy() && !self.is_draining() && self.breaker.allows()
    }

    /// Counts a request against this worker until the guard drops.
    pub fn acquire(self: &Arc<Self>) -> LoadGuard {
        self.acquire_tokens(0)
    }

    /// Counts a request of `tokens` prompt tokens against this worker until
    /// the guard drops (whatever the circuit says: see
    /// [`Worker::try_acquire_tokens`] for sending a request).
    pub fn acquire_tokens(self: &Arc<Self>, tokens: u64) -> LoadGuard {
        self.hold(tokens, None)
    }

    /// Holds the worker for a request about to be sent, if its circuit
    /// admits one: a half-open circuit gives out a limited number of trial
    /// slots, and the guard gives its slot back when it drops.
    pub fn try_acquire_tokens(self: &Arc<Self>, tokens: u64) -> Option<LoadGuard> {
        self.try_hold(tokens, true).ok()
    }

    /// Holds the worker for a request about to be sent, if it has room
    /// under its limit and (with `ask_circuit`) its circuit admits one.
    pub fn try_hold(
        self: &Arc<Self>,
        tokens: u64,
        ask_circuit: bool,
    ) -> Result<LoadGuard, Refusal> {
        if let Some(max) = self.max_in_flight() {
            // Reserve the slot first, atomically, so a burst cannot overrun
            // the limit between a check and an increment.
            self.in_flight
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                    (held < max).then_some(held + 1)
                })
                .map_err(|_| Refusal::Full)?;
        } else {
            self.in_flight.fetch_add(1, Ordering::Relaxed);
        }
        let trial = if ask_circuit {
            match self.breaker.admit() {
                Admission::Free => None,
                Admission::Trial(ticket) => Some(ticket),
                Admission::Refused => {
                    self.release_slot();
                    return Err(Refusal::Circuit);
                }
            }
        } else {
            None
        };
        Ok(self.counted(tokens, trial))
    }

    fn hold(self: &Arc<Self>, tokens: u64, trial: Option<TrialTicket>) -> LoadGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.counted(tokens, trial)
    }

    /// Gives a request slot back, waking a waiter on a limited worker.
    fn release_slot(&self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        if self.max_in_flight().is_some() {
            self.room.notify_one();
        }
    }

    /// The guard of a request whose slot is already counted.
    fn counted(self: &Arc<Self>, tokens: u64, trial: Option<TrialTicket>) -> LoadGuard {
        self.in_flight_tokens.fetch_add(tokens, Ordering::Relaxed);
        LoadGuard {
            worker: Arc::clone(self),
            tokens,
            trial,
        }
    }
}

/// A breaker that logs and counts its every transition under the worker's
/// URL and role, and wakes `opened`'s waiters when it opens.
fn observed_breaker(
    url: &str,
    role: WorkerRole,
    config: BreakerConfig,
    opened: &Arc<tokio::sync::Notify>,
) -> CircuitBreaker {
    let url = url.to_owned();
    let opened = Arc::clone(opened);
    CircuitBreaker::new(config).with_observer(Box::new(move |state| {
        tracing::warn!(worker = %url, state = state.name(), "circuit breaker");
        crate::metrics::record_breaker(&url, role.name(), state.name());
        if state == BreakerState::Open {
            opened.notify_waiters();
        }
    }))
}

/// The id of the worker at `url`: 16 hex digits of its blake3 hash.
pub fn worker_id(url: &str) -> String {
    let digest = blake3::hash(url.as_bytes());
    digest.as_bytes()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The host part of a worker URL (`grpc://host:port`, `http://host:port`,
/// `host:port`, IPv6 in brackets).
fn host_of(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next()?;
    let host = if let Some(bracketed) = authority.strip_prefix('[') {
        bracketed.split(']').next()?
    } else {
        authority
            .rsplit_once(':')
            .map_or(authority, |(host, _)| host)
    };
    (!host.is_empty()).then(|| host.to_owned())
}

/// One request's hold on a worker; gives the load back on drop.
#[derive(Debug)]
pub struct LoadGuard {
    worker: Arc<Worker>,
    tokens: u64,
    /// The half-open trial slot this request holds.
    trial: Option<TrialTicket>,
}

impl LoadGuard {
    pub fn worker(&self) -> &Arc<Worker> {
        &self.worker
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.worker
            .in_flight_tokens
            .fetch_sub(self.tokens, Ordering::Relaxed);
        if let Some(ticket) = self.trial.take() {
            self.worker.breaker.end_trial(ticket);
        }
        self.worker.release_slot();
    }
}

/// Why a worker did not take a request ([`Worker::try_hold`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// It holds as many requests as its limit allows.
    Full,
    /// Its circuit is open, or every half-open trial slot is taken.
    Circuit,
}

/// One immutable view of the membership.
#[derive(Debug, Default)]
struct Members {
    by_role: HashMap<WorkerRole, Arc<[Arc<Worker>]>>,
    /// Changes whenever the membership does (process-unique).
    generation: u64,
}

/// The workers of one router (or one model), by role: a shared handle, so
/// the admin API's changes reach the router at once. Readers take a snapshot
/// (an `Arc` clone); writers replace it.
#[derive(Debug, Default, Clone)]
pub struct WorkerSet {
    members: Arc<RwLock<Arc<Members>>>,
}

fn next_generation() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl WorkerSet {
    fn snapshot(&self) -> Arc<Members> {
        Arc::clone(&self.members.read().unwrap_or_else(PoisonError::into_inner))
    }

    fn update(&self, change: impl FnOnce(&mut HashMap<WorkerRole, Vec<Arc<Worker>>>)) {
        let mut guard = self.members.write().unwrap_or_else(PoisonError::into_inner);
        let mut by_role: HashMap<WorkerRole, Vec<Arc<Worker>>> = guard
            .by_role
            .iter()
            .map(|(role, workers)| (*role, workers.to_vec()))
            .collect();
        change(&mut by_role);
        *guard = Arc::new(Members {
            by_role: by_role
                .into_iter()
                .filter(|(_, workers)| !workers.is_empty())
                .map(|(role, workers)| (role, Arc::from(workers)))
                .collect(),
            generation: next_generation(),
        });
    }

    /// Adds a worker; returns the shared handle to it.
    pub fn add(&self, worker: Worker) -> Arc<Worker> {
        let worker = Arc::new(worker);
        self.insert(Arc::clone(&worker));
        worker
    }

    pub fn insert(&self, worker: Arc<Worker>) {
        crate::metrics::record_worker_joined(
            worker.label(),
            worker.role.name(),
            worker.health().name(),
            worker.breaker().state().name(),
        );
        self.update(|by_role| by_role.entry(worker.role).or_default().push(worker));
    }

    /// Takes the worker with `id` out of the membership (it stops getting
    /// new requests); returns it.
    pub fn remove(&self, id: &str) -> Option<Arc<Worker>> {
        let mut removed = None;
        self.update(|by_role| {
            for workers in by_role.values_mut() {
                if let Some(at) = workers.iter().position(|w| w.id() == id) {
                    removed = Some(workers.remove(at));
                }
            }
        });
        removed
    }

    pub fn get(&self, id: &str) -> Option<Arc<Worker>> {
        self.snapshot()
            .by_role
            .values()
            .flat_map(|workers| workers.iter())
            .find(|w| w.id() == id)
            .cloned()
    }

    /// Every worker of `role`, available or not.
    pub fn of_role(&self, role: WorkerRole) -> Arc<[Arc<Worker>]> {
        self.snapshot()
            .by_role
            .get(&role)
            .cloned()
            .unwrap_or_else(|| Arc::from(Vec::new()))
    }

    /// Every worker of `role` and the membership generation they belong to.
    pub fn members(&self, role: WorkerRole) -> (Arc<[Arc<Worker>]>, u64) {
        let members = self.snapshot();
        let workers = members
            .by_role
            .get(&role)
            .cloned()
            .unwrap_or_else(|| Arc::from(Vec::new()));
        (workers, members.generation)
    }

    /// The workers of `role` that may take a new request now.
    pub fn healthy(&self, role: WorkerRole) -> Vec<Arc<Worker>> {
        self.of_role(role)
            .iter()
            .filter(|w| w.is_available())
            .cloned()
            .collect()
    }

    /// Every worker, in role order.
    pub fn all(&self) -> Vec<Arc<Worker>> {
        let members = self.snapshot();
        let mut roles: Vec<&WorkerRole> = members.by_role.keys().collect();
        roles.sort();
        roles
            .into_iter()
            .flat_map(|role| members.by_role[role].iter().cloned())
            .collect()
    }

    /// The roles with at least one worker.
    pub fn roles(&self) -> Vec<WorkerRole> {
        let mut roles: Vec<WorkerRole> = self.snapshot().by_role.keys().copied().collect();
        roles.sort();
        roles
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_parsed_from_worker_urls() {
        for (url, host) in [
            ("grpc://127.0.0.1:50051", "127.0.0.1"),
            ("http://gpu-7.example:30000", "gpu-7.example"),
            ("10.0.0.2:1234", "10.0.0.2"),
            ("grpc://[::1]:50051", "::1"),
        ] {
            assert_eq!(host_of(url).as_deref(), Some(host), "{url}");
        }
        assert_eq!(host_of("grpc://:50051"), None);
    }

    #[test]
    fn load_guards_count_exactly_once() {
        let worker = crate::policies::test_support::workers(1).remove(0);
        let a = worker.acquire_tokens(100);
        let b = worker.acquire_tokens(20);
        assert_eq!(worker.in_flight(), 2);
        assert_eq!(worker.in_flight_tokens(), 120);
        drop(a);
        assert_eq!(worker.in_flight(), 1);
        assert_eq!(worker.in_flight_tokens(), 20);
        drop(b);
        assert_eq!(worker.in_flight(), 0);
        assert_eq!(worker.in_flight_tokens(), 0);
    }

    #[tokio::test]
    async fn the_engines_reported_limit_applies_unless_one_is_configured() {
        let worker = crate::policies::test_support::workers(1).remove(0);
        assert_eq!(worker.max_in_flight(), None, "no report yet: no limit");
        assert!(worker.learn_limit(Some(1)));
        assert!(
            !worker.learn_limit(Some(1)),
            "the same report changes nothing"
        );
        let first = worker.try_hold(0, false).expect("room for one");
        assert_eq!(worker.try_hold(0, false).err(), Some(Refusal::Full));

        // A raised limit wakes a request waiting for room.
        let waiting = worker.room_freed();
        tokio::pin!(waiting);
        waiting.as_mut().enable();
        assert!(worker.learn_limit(Some(2)));
        waiting.await;
        let second = worker.try_hold(0, false).expect("the raised limit");

        // Lowered below what it holds: nobody new until enough have ended.
        assert!(worker.learn_limit(Some(1)));
        drop(first);
        assert_eq!(worker.try_hold(0, false).err(), Some(Refusal::Full));
        drop(second);
        let third = worker.try_hold(0, false).expect("back under the limit");
        drop(third);

        // An engine that stops reporting one lifts it.
        assert!(worker.learn_limit(None));
        assert_eq!(worker.max_in_flight(), None);

        let configured = crate::policies::test_support::workers(1).remove(0);
        let configured = Arc::try_unwrap(configured)
            .expect("sole owner")
            .with_in_flight_limit(InFlightLimit::Fixed(3));
        assert!(!configured.learn_limit(Some(100)), "the flag wins");
        assert_eq!(configured.max_in_flight(), Some(3));

        let unlimited = crate::policies::test_support::workers(1).remove(0);
        let unlimited = Arc::new(
            Arc::try_unwrap(unlimited)
                .expect("sole owner")
                .with_in_flight_limit(InFlightLimit::Unlimited),
        );
        assert!(!unlimited.learn_limit(Some(1)), "`none` wins too");
        assert_eq!(unlimited.max_in_flight(), None);
        let held: Vec<_> = (0..3)
            .map(|_| unlimited.try_hold(0, false).expect("no limit"))
            .collect();
        assert_eq!(unlimited.in_flight(), held.len());
    }

    #[test]
    fn a_half_open_worker_takes_only_its_trial_requests() {
        let plain = crate::policies::test_support::workers(1).remove(0);
        let worker = Arc::new(Arc::try_unwrap(plain).expect("sole owner").with_breaker(
            BreakerConfig {
                failure_threshold: 1,
                success_threshold: 2,
                open_for: std::time::Duration::ZERO,
                ..BreakerConfig::default()
            },
        ));
        worker.record_outcome(false);
        // open_for is zero: the next admission finds it half-open.
        let first = worker.try_acquire_tokens(10).expect("trial 1");
        let second = worker.try_acquire_tokens(10).expect("trial 2");
        assert_eq!(worker.breaker().state(), BreakerState::HalfOpen);
        assert!(worker.try_acquire_tokens(10).is_none(), "no third trial");
        assert!(!worker.is_available());
        // Load counted without the circuit's consent takes no trial slot.
        drop(worker.acquire_tokens(5));
        drop(first);
        assert_eq!(worker.breaker().trials_in_flight(), 1);
        assert!(worker.is_available());
        let third = worker.try_acquire_tokens(10).expect("a freed slot");
        worker.record_outcome(true);
        worker.record_outcome(true);
        assert_eq!(worker.breaker().state(), BreakerState::Closed);
        let free: Vec<LoadGuard> = (0..5)
            .filter_map(|_| worker.try_acquire_tokens(1))
            .collect();
        assert_eq!(free.len(), 5, "a closed circuit admits everything");
        drop((second, third, free));
        assert_eq!(worker.in_flight(), 0);
        assert_eq!(worker.breaker().trials_in_flight(), 0);
    }

    #[test]
    fn only_available_workers_are_offered() {
        let set = WorkerSet::default();
        for worker in crate::policies::test_support::workers(4) {
            set.insert(worker);
        }
        let all = set.of_role(WorkerRole::Regular);
        assert_eq!(set.healthy(WorkerRole::Regular).len(), 4);
        all[0].set_healthy(false);
        all[1].start_draining();
        for _ in 0..BreakerConfig::default().failure_threshold {
            all[2].record_outcome(false);
        }
        let offered = set.healthy(WorkerRole::Regular);
        assert_eq!(offered.len(), 1);
        assert_eq!(offered[0].id(), all[3].id());
        assert!(set.healthy(WorkerRole::Prefill).is_empty());
    }

    #[test]
    fn membership_changes_are_shared_and_bump_the_generation() {
        let set = WorkerSet::default();
        let view = set.clone();
        let fleet = crate::policies::test_support::workers(2);
        set.insert(Arc::clone(&fleet[0]));
        let (_, first) = view.members(WorkerRole::Regular);
        set.insert(Arc::clone(&fleet[1]));
        let (members, second) = view.members(WorkerRole::Regular);
        assert_eq!(members.len(), 2);
        assert_ne!(first, second);
        let removed = set.remove(fleet[0].id()).expect("present");
        assert_eq!(removed.id(), fleet[0].id());
        assert_eq!(view.of_role(WorkerRole::Regular).len(), 1);
        assert!(view.get(fleet[0].id()).is_none());
        assert!(view.get(fleet[1].id()).is_some());
        assert!(set.remove(&worker_id("grpc://nowhere:1")).is_none());
        assert_eq!(fleet[0].id(), worker_id(fleet[0].url()));
        assert_eq!(fleet[0].id().len(), 16);
        set.remove(fleet[1].id());
        assert!(view.roles().is_empty());
    }
}
