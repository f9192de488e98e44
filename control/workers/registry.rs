//! The worker registry behind the admin API: registers workers at run time
//! (asynchronously, with probing), lists them with their health, circuit and
//! load, and removes them by draining (requests in flight finish; no new
//! ones start).
//!
//! A registration is validated at once (URL shape, role, duplicates) and
//! then runs in the background: bootstrap-port discovery for prefill and
//! encode workers that name none, then the worker joins the membership as
//! `pending` and its health probes make it `ready` (or, with health checks
//! disabled, one successful probe does).
//!
//! With `--dp-aware` a registration asks the engine (`GetLoads`) how many
//! data-parallel ranks it runs and joins one logical worker per rank, each
//! with its own id and load; the engine's own id (the one the registration
//! answered) then names all of its ranks for `GET` (the first rank) and
//! `DELETE` (every rank).
//!
//! With `--remove-unhealthy-workers` (SMG's flag), a worker its health
//! checks find unhealthy (`not_ready` or `failed`) is removed the same way,
//! once per health-check interval ([`WorkerRegistry::remove_unhealthy`]):
//! it drains and leaves the fleet for good (registering it again brings it
//! back), where it would otherwise stay listed out of rotation until it
//! recovers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::transport::{LaneDirectory, LaneMode, WorkerLaneOverride, WorkerTransport};
use super::{
    BreakerConfig, HealthConfig, HealthState, InFlightLimit, Worker, WorkerRole, WorkerSet, probe,
    reported_limit, spawn_circuit_probe, spawn_probe_loop, worker_id,
};
use crate::engine::{
    ConnectionConfig, Engine, EngineClient, Load, Runtime, ServerInfo, WorkerTls, check_worker_tls,
};
use crate::error::{Error, ErrorCode, Result};
use crate::metrics::ProtocolViolation;

/// How long a registration waits for the worker's discovery RPCs.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a draining worker is checked for its last request.
const DRAIN_POLL: Duration = Duration::from_millis(20);

/// How workers are connected to and watched.
#[derive(Debug, Clone, Copy)]
pub struct Lifecycle {
    /// Periodic probes; `None` with `--disable-health-check`.
    pub health: Option<HealthConfig>,
    pub breaker: BreakerConfig,
    /// Timeout of the one-shot probe when health checks are disabled.
    pub probe_timeout: Duration,
    /// One logical worker per data-parallel rank (`--dp-aware`).
    pub dp_aware: bool,
    /// The HTTP/2 connections to each worker.
    pub connections: ConnectionConfig,
    /// Most requests one worker holds at once (`--worker-max-in-flight`):
    /// its engine's report, a number, or no limit.
    pub max_in_flight: InFlightLimit,
    /// The most data-parallel ranks one engine may bring
    /// (`--max-dp-ranks`): each becomes a worker with its own probes and
    /// load, so an engine reporting 50,000 must be refused, not obeyed.
    pub max_dp_ranks: u32,
    /// Remove a worker its health checks find unhealthy, as `DELETE
    /// /workers/ID` would (`--remove-unhealthy-workers`); needs `health`.
    pub remove_unhealthy: bool,
}

impl Lifecycle {
    /// `--max-dp-ranks`'s default: beyond the largest data-parallel
    /// deployments behind one engine endpoint.
    pub const DEFAULT_MAX_DP_RANKS: u32 = 256;

    /// How many logical workers the engine at `url` becomes under
    /// `--dp-aware`, from its `GetLoads` answer: one per data-parallel rank
    /// (at least one), refused past [`Lifecycle::max_dp_ranks`] as the
    /// engine's protocol violation.
    pub fn dp_ranks(&self, url: &str, load: &Load) -> Result<u32> {
        let ranks = u32::try_from(load.dp_rank_count).unwrap_or(0).max(1);
        if ranks <= self.max_dp_ranks {
            return Ok(ranks);
        }
        crate::metrics::record_protocol_violation(url, ProtocolViolation::DpRanks);
        Err(Error::new(
            ErrorCode::WorkerProtocolViolation,
            format!(
                "worker {url} reports {ranks} data-parallel ranks; at most {} are accepted \
                 (--max-dp-ranks)",
                self.max_dp_ranks
            ),
        )
        .with_worker(url))
    }
}

/// A worker to register.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSpec {
    pub url: String,
    #[serde(default = "regular")]
    pub role: String,
    #[serde(default)]
    pub bootstrap_port: Option<u16>,
    /// The model it serves; defaults to the gateway's (only model).
    #[serde(default)]
    pub model_id: Option<String>,
    /// `tokenspeed` or `sglang` (IGW; defaults to `--runtime`, else
    /// tokenspeed). A single-model gateway uses its own runtime.
    #[serde(default)]
    pub runtime: Option<String>,
    /// `inline`, `shm`, `auto` or `rdma`: this worker's tensor transport,
    /// as a `--worker-tensor-transport` for its URL would set it (and
    /// winning over one).
    #[serde(default)]
    pub tensor_transport: Option<String>,
    /// This worker's inline threshold (with `tensor_transport`; default
    /// `--multimodal-shm-min-bytes`).
    #[serde(default)]
    pub shm_min_bytes: Option<u64>,
}

impl WorkerSpec {
    /// The transport override the registration carries, checked.
    fn lane_override(&self) -> Result<Option<WorkerLaneOverride>> {
        let Some(text) = self.tensor_transport.as_deref() else {
            return match self.shm_min_bytes {
                Some(_) => Err(Error::invalid_parameter(
                    "shm_min_bytes",
                    "shm_min_bytes goes with a tensor_transport (inline, shm, auto or rdma)",
                )),
                None => Ok(None),
            };
        };
        let mode = LaneMode::parse(text).ok_or_else(|| {
            Error::invalid_parameter(
                "tensor_transport",
                format!("unknown tensor transport {text:?} (inline, shm, auto or rdma)"),
            )
        })?;
        Ok(Some(WorkerLaneOverride {
            mode,
            min_bytes: self
                .shm_min_bytes
                .map(|bytes| usize::try_from(bytes).unwrap_or(usize::MAX)),
        }))
    }
}

fn regular() -> String {
    WorkerRole::Regular.name().to_owned()
}

/// What the admin API shows of a worker.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WorkerStatus {
    pub id: String,
    pub url: String,
    pub role: &'static str,
    pub model_id: String,
    /// registering | pending | ready | not_ready | failed | draining |
    /// registration_failed
    pub status: &'static str,
    pub circuit: &'static str,
    pub in_flight: usize,
    /// Most requests it is sent at once: `--worker-max-in-flight`, else
    /// its engine's `max_running_requests`; `null`: no limit.
    pub max_in_flight: Option<usize>,
    pub bootstrap_port: Option<u16>,
    /// The tensor transport the lane decision applies to it (`inline`,
    /// `shm`, `auto`, `rdma`; always `inline` for SGLang)...
    pub tensor_transport: &'static str,
    /// ...its inline threshold in bytes...
    pub shm_min_bytes: usize,
    /// ...and where they come from: `registration`, `flag`
    /// (`--worker-tensor-transport`), `default` or `runtime` (SGLang).
    pub tensor_transport_source: &'static str,
    /// The data-parallel rank this logical worker stands for (`--dp-aware`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dp_rank: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load: Option<LoadStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The last `GetLoads` reading and its age.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LoadStatus {
    pub requests: u32,
    pub waiting_uncached_tokens: u32,
    pub kv_usage: f32,
    pub throughput: f32,
    pub age_ms: u64,
}

/// A registration still under way, or one that failed.
#[derive(Debug, Clone)]
struct Job {
    url: String,
    role: WorkerRole,
    bootstrap_port: Option<u16>,
    lane_override: Option<WorkerLaneOverride>,
    error: Option<String>,
    /// Keeps the series labelled with its URL (its connects) in
    /// `/metrics` while it runs and while its failure is listed.
    _series: crate::metrics::WorkerSeriesHold,
}

/// The workers of one model and how they are managed.
#[derive(Debug)]
pub struct WorkerRegistry {
    model: String,
    runtime: Runtime,
    roles: Vec<WorkerRole>,
    set: WorkerSet,
    lifecycle: Lifecycle,
    lanes: Arc<dyn LaneDirectory>,
    /// How registered `grpcs://` workers are dialled.
    tls: WorkerTls,
    jobs: Mutex<HashMap<String, Job>>,
    draining: Mutex<HashMap<String, Arc<Worker>>>,
}

impl WorkerRegistry {
    /// A registry over `set` for `model`, admitting workers of `roles`;
    /// `lanes` are the gateway's tensor lanes.
    pub fn new(
        model: String,
        runtime: Runtime,
        roles: Vec<WorkerRole>,
        set: WorkerSet,
        lifecycle: Lifecycle,
        lanes: Arc<dyn LaneDirectory>,
    ) -> Self {
        Self {
            model,
            runtime,
            roles,
            set,
            lifecycle,
            lanes,
            tls: WorkerTls::default(),
            jobs: Mutex::default(),
            draining: Mutex::default(),
        }
    }

    /// Dials registered `grpcs://` workers as `tls` says (by default: the
    /// public roots, no client certificate).
    pub fn with_worker_tls(mut self, tls: WorkerTls) -> Self {
        self.tls = tls;
        self
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    pub fn workers(&self) -> &WorkerSet {
        &self.set
    }

    fn jobs(&self) -> std::sync::MutexGuard<'_, HashMap<String, Job>> {
        self.jobs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn draining(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Worker>>> {
        self.draining.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Validates `spec` and starts registering it in the background.
    pub fn register(self: &Arc<Self>, spec: WorkerSpec) -> Result<WorkerStatus> {
        let role: WorkerRole = spec
            .role
            .parse()
            .map_err(|why: String| Error::invalid_parameter("role", why))?;
        let lane_override = spec.lane_override()?;
        if !self.roles.contains(&role) {
            return Err(Error::invalid_parameter(
                "role",
                format!(
                    "this gateway serves {} workers, not {role}",
                    self.roles
                        .iter()
                        .map(|r| r.name())
                        .collect::<Vec<_>>()
                        .join("/")
                ),
            ));
        }
        if let Some(model) = &spec.model_id
            && model != &self.model
        {
            return Err(Error::invalid_parameter(
                "model_id",
                format!("this gateway serves {:?}, not {model:?}", self.model),
            ));
        }
        let id = worker_id(&spec.url);
        let client = {
            let mut jobs = self.jobs();
            let taken = !self.engine_workers(&id).is_empty()
                || jobs.get(&id).is_some_and(|job| job.error.is_none());
            if taken {
                return Err(Error::new(
                    ErrorCode::WorkerAlreadyExists,
                    format!("worker {} is already registered (id {id})", spec.url),
                )
                .with_param("url"));
            }
            // Built only once the URL is known to be new: a client records its
            // connection gauge, which a refused duplicate must not overwrite.
            let client = EngineClient::with_connections(
                &spec.url,
                self.runtime,
                self.lifecycle.connections,
                &self.tls,
            )?;
            jobs.insert(
                id.clone(),
                Job {
                    url: client.url().to_owned(),
                    role,
                    bootstrap_port: spec.bootstrap_port,
                    lane_override,
                    error: None,
                    _series: crate::metrics::WorkerSeriesHold::new(client.url()),
                },
            );
            client
        };
        let registry = Arc::clone(self);
        let job_id = id.clone();
        tokio::spawn(async move {
            match registry
                .admit(client, role, spec.bootstrap_port, lane_override)
                .await
            {
                Ok(()) => {
                    registry.jobs().remove(&job_id);
                }
                Err(why) => {
                    tracing::warn!(id = %job_id, %why, "worker registration failed");
                    if let Some(job) = registry.jobs().get_mut(&job_id) {
                        job.error = Some(why);
                    }
                }
            }
        });
        self.status(&id)
            .ok_or_else(|| Error::internal("a registration vanished"))
    }

    /// Discovery and probing, then joining the membership.
    async fn admit(
        &self,
        client: EngineClient,
        role: WorkerRole,
        bootstrap_port: Option<u16>,
        lane_override: Option<WorkerLaneOverride>,
    ) -> std::result::Result<(), String> {
        check_worker_tls(client.url(), &self.tls)
            .await
            .map_err(|err| err.to_string())?;
        let needs_bootstrap = matches!(role, WorkerRole::Prefill | WorkerRole::Encode);
        let port = match (bootstrap_port, needs_bootstrap) {
            (Some(port), _) => Some(port),
            (None, false) => None,
            (None, true) => {
                let info = tokio::time::timeout(DISCOVERY_TIMEOUT, client.server_info())
                    .await
                    .map_err(|_| "GetServerInfo timed out".to_owned())?
                    .map_err(|err| format!("GetServerInfo failed: {err}"))?;
                Some(advertised_bootstrap_port(&info).ok_or_else(|| {
                    format!("the {role} worker advertises no bootstrap port: give bootstrap_port")
                })?)
            }
        };
        let (ranks, load) = if self.lifecycle.dp_aware {
            let load = tokio::time::timeout(DISCOVERY_TIMEOUT, client.loads())
                .await
                .map_err(|_| "GetLoads timed out".to_owned())?
                .map_err(|err| format!("GetLoads failed: {err}"))?;
            let ranks = self
                .lifecycle
                .dp_ranks(client.url(), &load)
                .map_err(|err| err.message)?;
            (Some(ranks), Some(load))
        } else if self.lifecycle.max_in_flight.follows_engine() {
            // Its in-flight limit from the start; the load polling keeps
            // it current. An engine without GetLoads has none.
            let load = tokio::time::timeout(DISCOVERY_TIMEOUT, client.loads()).await;
            (None, load.ok().and_then(std::result::Result::ok))
        } else {
            (None, None)
        };
        if let Some(wanted) = lane_override
            && self.runtime == Runtime::TokenSpeed
        {
            // Its lane exists before its first request can pick it.
            Arc::clone(&self.lanes).prepare(wanted.mode).await;
        }
        let engine: Arc<dyn Engine> = Arc::new(client);
        let workers = (0..ranks.unwrap_or(1))
            .map(|rank| {
                let worker = Worker::new(Arc::clone(&engine), role, port)
                    .map_err(|err| err.message)?
                    .with_lane_override(lane_override)
                    .with_breaker(self.lifecycle.breaker)
                    .with_in_flight_limit(self.lifecycle.max_in_flight)
                    .with_health(HealthState::Pending);
                if let Some(load) = &load {
                    worker.learn_limit(reported_limit(load, ranks.is_some()));
                }
                Ok(Arc::new(match ranks {
                    Some(_) => worker.with_dp_rank(rank),
                    None => worker,
                }))
            })
            .collect::<std::result::Result<Vec<_>, String>>()?;
        if self.lifecycle.health.is_none() {
            // One engine, one probe: its ranks share its health.
            if !probe(&workers[0], self.lifecycle.probe_timeout).await {
                return Err("the worker failed its health check".to_owned());
            }
        }
        for worker in workers {
            match self.lifecycle.health {
                Some(config) => {
                    self.set.insert(Arc::clone(&worker));
                    spawn_circuit_probe(Arc::clone(&worker), self.lifecycle.probe_timeout);
                    spawn_probe_loop(worker, config);
                }
                None => {
                    worker.set_health(HealthState::Ready);
                    self.set.insert(Arc::clone(&worker));
                    spawn_circuit_probe(worker, self.lifecycle.probe_timeout);
                }
            }
        }
        Ok(())
    }

    /// The workers (members or draining) that `id` names: the worker with
    /// that id, or every data-parallel rank of the engine with that id.
    fn engine_workers(&self, id: &str) -> Vec<Arc<Worker>> {
        if let Some(worker) = self
            .set
            .get(id)
            .or_else(|| self.draining().get(id).cloned())
        {
            return vec![worker];
        }
        let mut ranks: Vec<Arc<Worker>> = self
            .set
            .all()
            .into_iter()
            .chain(self.draining().values().cloned())
            .filter(|w| w.dp_rank().is_some() && worker_id(w.url()) == id)
            .collect();
        ranks.sort_by_key(|w| w.dp_rank());
        ranks
    }

    /// Takes a worker out of rotation and drops it once its requests in
    /// flight have finished. Forgets a failed registration.
    pub fn remove(self: &Arc<Self>, id: &str) -> Result<WorkerStatus> {
        let members: Vec<Arc<Worker>> = self
            .engine_workers(id)
            .into_iter()
            .filter(|w| !w.is_draining())
            .collect();
        let mut statuses = Vec::new();
        for worker in members {
            let Some(worker) = self.set.remove(worker.id()) else {
                continue;
            };
            worker.start_draining();
            self.draining()
                .insert(worker.id().to_owned(), Arc::clone(&worker));
            statuses.push(self.describe(&worker));
            let registry = Arc::clone(self);
            tokio::spawn(async move {
                while worker.in_flight() > 0 {
                    tokio::time::sleep(DRAIN_POLL).await;
                }
                worker.retire();
                registry.draining().remove(worker.id());
                tracing::info!(worker = worker.url(), "worker drained and removed");
            });
        }
        if let Some(status) = statuses.into_iter().next() {
            return Ok(status);
        }
        let mut jobs = self.jobs();
        if jobs.get(id).is_some_and(|job| job.error.is_some()) {
            let job = jobs.remove(id).map(|job| self.job_status(id, &job));
            return job.ok_or_else(|| Error::internal("a job vanished"));
        }
        if let Some(job) = jobs.get(id) {
            return Err(Error::invalid_request(format!(
                "worker {} is still registering; delete it once it is registered",
                job.url
            )));
        }
        drop(jobs);
        if let Some(worker) = self.engine_workers(id).first() {
            return Ok(self.describe(worker));
        }
        Err(Error::new(
            ErrorCode::WorkerNotFound,
            format!("no worker has id {id:?}"),
        ))
    }

    /// With `--remove-unhealthy-workers` (and health checks on): removes
    /// the unhealthy workers once per health-check interval, until the
    /// registry is dropped.
    pub fn spawn_unhealthy_removal(self: &Arc<Self>) {
        let (Some(health), true) = (self.lifecycle.health, self.lifecycle.remove_unhealthy) else {
            return;
        };
        let registry = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(health.interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                let Some(registry) = registry.upgrade() else {
                    return;
                };
                registry.remove_unhealthy();
            }
        });
    }

    /// Removes (drains) every member its health checks find unhealthy;
    /// returns their ids.
    pub fn remove_unhealthy(self: &Arc<Self>) -> Vec<String> {
        let unhealthy: Vec<Arc<Worker>> = self
            .set
            .all()
            .into_iter()
            .filter(|worker| {
                matches!(worker.health(), HealthState::NotReady | HealthState::Failed)
                    && !worker.is_draining()
            })
            .collect();
        let mut removed = Vec::new();
        for worker in unhealthy {
            tracing::warn!(
                worker = worker.url(),
                state = worker.health().name(),
                "removing an unhealthy worker (--remove-unhealthy-workers)"
            );
            match self.remove(worker.id()) {
                Ok(_) => removed.push(worker.id().to_owned()),
                Err(err) => tracing::debug!(worker = worker.url(), %err, "not removed"),
            }
        }
        removed
    }

    /// One worker's status, registered, draining or registering.
    pub fn status(&self, id: &str) -> Option<WorkerStatus> {
        if let Some(worker) = self.engine_workers(id).first() {
            return Some(self.describe(worker));
        }
        self.jobs().get(id).map(|job| self.job_status(id, job))
    }

    /// Every worker: members, draining ones, registrations.
    pub fn list(&self) -> Vec<WorkerStatus> {
        let mut all: Vec<WorkerStatus> = self
            .set
            .all()
            .iter()
            .map(|worker| self.describe(worker))
            .collect();
        all.extend(self.draining().values().map(|worker| self.describe(worker)));
        all.extend(self.jobs().iter().map(|(id, job)| self.job_status(id, job)));
        all
    }

    /// What the lanes make of a worker at `url` registered with `registered`.
    fn transport(&self, url: &str, registered: Option<WorkerLaneOverride>) -> WorkerTransport {
        self.lanes
            .effective_transport(self.runtime, url, registered)
    }

    fn describe(&self, worker: &Worker) -> WorkerStatus {
        let transport = self.transport(worker.url(), worker.lane_override());
        let status = if worker.is_draining() {
            "draining"
        } else {
            worker.health().name()
        };
        WorkerStatus {
            id: worker.id().to_owned(),
            url: worker.url().to_owned(),
            role: worker.role().name(),
            model_id: self.model.clone(),
            status,
            circuit: worker.breaker().state().name(),
            in_flight: worker.in_flight(),
            max_in_flight: worker.max_in_flight(),
            bootstrap_port: worker.bootstrap_port(),
            tensor_transport: transport.mode.name(),
            shm_min_bytes: transport.min_bytes,
            tensor_transport_source: transport.source.name(),
            dp_rank: worker.dp_rank(),
            load: worker
                .load_cell()
                .last(Instant::now())
                .map(|(reading, age)| LoadStatus {
                    requests: reading.requests,
                    waiting_uncached_tokens: reading.waiting_uncached_tokens,
                    kv_usage: reading.kv_usage,
                    throughput: reading.throughput,
                    age_ms: u64::try_from(age.as_millis()).unwrap_or(u64::MAX),
                }),
            error: None,
        }
    }

    fn job_status(&self, id: &str, job: &Job) -> WorkerStatus {
        let transport = self.transport(&job.url, job.lane_override);
        WorkerStatus {
            id: id.to_owned(),
            url: job.url.clone(),
            role: job.role.name(),
            model_id: self.model.clone(),
            status: if job.error.is_some() {
                "registration_failed"
            } else {
                "registering"
            },
            circuit: "closed",
            in_flight: 0,
            max_in_flight: None,
            bootstrap_port: job.bootstrap_port,
            tensor_transport: transport.mode.name(),
            shm_min_bytes: transport.min_bytes,
            tensor_transport_source: transport.source.name(),
            dp_rank: None,
            load: None,
            error: job.error.clone(),
        }
    }
}

/// The bootstrap port a worker advertises when it is not given.
pub fn advertised_bootstrap_port(info: &ServerInfo) -> Option<u16> {
    [
        info.scheduler_info.get("bootstrap_port"),
        info.server_args.get("disaggregation_bootstrap_port"),
    ]
    .into_iter()
    .flatten()
    .find_map(serde_json::Value::as_u64)
    .and_then(|port| u16::try_from(port).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lifecycle(max_dp_ranks: u32) -> Lifecycle {
        Lifecycle {
            health: None,
            breaker: BreakerConfig::default(),
            probe_timeout: Duration::from_secs(1),
            dp_aware: true,
            connections: ConnectionConfig::default(),
            max_in_flight: InFlightLimit::Engine,
            max_dp_ranks,
            remove_unhealthy: false,
        }
    }

    fn reporting(dp_rank_count: i32) -> Load {
        Load {
            dp_rank_count,
            ..Load::default()
        }
    }

    #[test]
    fn an_engine_brings_its_ranks_up_to_the_cap() {
        let lifecycle = lifecycle(8);
        let cases = [
            (0, Some(1)),
            (-3, Some(1)),
            (1, Some(1)),
            (8, Some(8)),
            (9, None),
        ];
        for (reported, expected) in cases {
            let ranks = lifecycle.dp_ranks("grpc://w:1", &reporting(reported));
            match expected {
                Some(expected) => assert_eq!(ranks, Ok(expected), "{reported}"),
                None => {
                    let err = ranks.expect_err("past the cap");
                    assert_eq!(err.code, ErrorCode::WorkerProtocolViolation);
                    assert_eq!(err.worker.as_deref(), Some("grpc://w:1"));
                    assert!(err.message.contains("--max-dp-ranks"), "{err}");
                }
            }
        }
        let refused = lifecycle
            .dp_ranks("w", &reporting(50_000))
            .expect_err("50k");
        assert!(refused.message.contains("50000"), "{refused}");
    }

    #[tokio::test]
    async fn unhealthy_members_are_removed_and_healthy_ones_stay() {
        let set = WorkerSet::default();
        let fleet = crate::policies::test_support::workers(4);
        for worker in &fleet {
            set.insert(Arc::clone(worker));
        }
        fleet[1].set_health(HealthState::NotReady);
        fleet[2].set_health(HealthState::Failed);
        fleet[3].set_health(HealthState::Pending);
        let registry = Arc::new(WorkerRegistry::new(
            "model".to_owned(),
            Runtime::TokenSpeed,
            vec![WorkerRole::Regular],
            set.clone(),
            lifecycle(8),
            crate::lanes::TensorLanes::inline() as _,
        ));
        let mut removed = registry.remove_unhealthy();
        removed.sort();
        let mut expected = vec![fleet[1].id().to_owned(), fleet[2].id().to_owned()];
        expected.sort();
        assert_eq!(removed, expected);
        let mut left: Vec<String> = set.all().iter().map(|w| w.id().to_owned()).collect();
        left.sort();
        let mut kept = vec![fleet[0].id().to_owned(), fleet[3].id().to_owned()];
        kept.sort();
        assert_eq!(left, kept, "ready and pending workers stay");
        assert!(fleet[1].is_draining() && fleet[2].is_draining());
        assert!(
            registry.remove_unhealthy().is_empty(),
            "a draining worker is not removed twice"
        );
    }
}
