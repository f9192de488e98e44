//! Bringing up a static fleet: the workers named on the command line, in
//! whatever order they come up.
//!
//! Why it exists: under systemd or Kubernetes the gateway and its engines
//! start together, and an engine loading a model takes minutes. So the
//! gateway does not wait for its workers before it listens: it serves at
//! once (`/readiness` 503, inference 503 `model_not_ready`) while each
//! worker is tried on its own, again and again with a doubling pause
//! (250 ms up to `--worker-startup-check-interval`), until
//! `--worker-startup-timeout-secs`. A worker counts once it has answered:
//! its TLS session (for `grpcs://`), runtime detection or a HealthCheck,
//! and the discovery its role needs (bootstrap port, data-parallel ranks).
//! As soon as one worker of each role the mode needs has answered, the
//! model is discovered from one of them and the router starts serving;
//! workers that answer later join it. At the deadline, workers that never
//! answered are given up on with a WARN, and if a role still has none the
//! gateway stops with an error naming them.
//!
//! What is not worth retrying fails start-up at once: a TLS handshake a
//! worker refused (a certificate problem does not fix itself), EPD over a
//! runtime without an encoder, or workers that speak different protocols.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::config::{GatewayConfig, StartupConfig, WorkerAddress};
use crate::discovery::{DiscoveryEnv, ModelContext, discover, start_load_polling};
use crate::engine::{Engine, EngineClient, Runtime, WorkerTls, check_worker_tls};
use crate::mode::Mode;
use crate::router::{Router, RouterParts};
use crate::shutdown::RequestTasks;
use crate::workers::{
    Worker, WorkerRole, WorkerSet, advertised_bootstrap_port, reported_limit, spawn_circuit_probe,
    spawn_probe_loop,
};

/// What `/readiness` shows while the fleet comes up.
#[derive(Debug)]
pub struct StartupStatus {
    mode: Mode,
    workers: Mutex<Vec<Waiting>>,
}

#[derive(Debug, Clone)]
struct Waiting {
    url: String,
    role: WorkerRole,
    reached: bool,
    /// Why the last attempt to reach it failed.
    error: Option<String>,
}

impl StartupStatus {
    pub fn new(mode: Mode, fleet: &[WorkerAddress]) -> Self {
        Self {
            mode,
            workers: Mutex::new(
                fleet
                    .iter()
                    .map(|address| Waiting {
                        url: address.url.clone(),
                        role: address.role,
                        reached: false,
                        error: None,
                    })
                    .collect(),
            ),
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    fn workers(&self) -> std::sync::MutexGuard<'_, Vec<Waiting>> {
        self.workers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn update(&self, url: &str, role: WorkerRole, reached: bool, error: Option<String>) {
        if let Some(waiting) = self
            .workers()
            .iter_mut()
            .find(|w| w.url == url && w.role == role)
        {
            waiting.reached = reached;
            waiting.error = error;
        }
    }

    /// `/readiness`'s body while the fleet comes up: per role, how many of
    /// its workers have answered, and the last error of those that have not.
    pub fn readiness(&self) -> serde_json::Value {
        let workers = self.workers();
        let roles: serde_json::Map<String, serde_json::Value> = self
            .mode
            .spec()
            .required_roles
            .iter()
            .map(|&role| {
                let of_role = workers.iter().filter(|w| w.role == role);
                (
                    role.name().to_owned(),
                    serde_json::json!({
                        "reached": of_role.clone().filter(|w| w.reached).count(),
                        "total": of_role.count(),
                    }),
                )
            })
            .collect();
        let waiting: Vec<serde_json::Value> = workers
            .iter()
            .filter(|w| !w.reached)
            .map(|w| serde_json::json!({"url": w.url, "role": w.role.name(), "error": w.error}))
            .collect();
        serde_json::json!({
            "status": "starting",
            "mode": self.mode.metrics_label(),
            "workers": roles,
            "waiting_for": waiting,
        })
    }
}

/// A worker that has answered, with what start-up learnt of it.
struct Reached {
    address: WorkerAddress,
    client: EngineClient,
    runtime: Runtime,
    bootstrap_port: Option<u16>,
    /// Data-parallel ranks (`--dp-aware`); 1 otherwise.
    ranks: u32,
    /// Its `GetLoads` answer, when it gave one and something needs it (the
    /// ranks, or its in-flight limit: no `--worker-max-in-flight`).
    load: Option<crate::engine::Load>,
    /// Keeps the series recorded while reaching it (its connects) until
    /// its workers hold them.
    _series: crate::metrics::WorkerSeriesHold,
}

/// The outcome of trying one worker until the deadline.
enum Attempt {
    Reached(Box<Reached>),
    /// Not worth retrying: start-up fails.
    Fatal(anyhow::Error),
    /// The deadline passed.
    GaveUp,
}

/// Brings up `fleet` in `mode` and returns its router, once one worker of
/// each required role has answered; workers answering later join the
/// router in the background (until the deadline).
pub(crate) async fn bring_up(
    config: &GatewayConfig,
    mode: Mode,
    fleet: &[WorkerAddress],
    env: &DiscoveryEnv,
    tasks: &RequestTasks,
    worker_tls: &WorkerTls,
    status: Arc<StartupStatus>,
) -> anyhow::Result<Router> {
    let startup = config.startup;
    let started = Instant::now();
    tokio::time::sleep(startup.delay).await;
    let deadline = started + startup.delay + startup.timeout;
    let (sender, mut arrivals) = mpsc::unbounded_channel();
    for address in fleet {
        let reach = Reach {
            address: address.clone(),
            runtime: config.runtime,
            dp_aware: config.lifecycle.dp_aware,
            connections: config.lifecycle.connections,
            tls: worker_tls.clone(),
            lifecycle: config.lifecycle,
            status: Arc::clone(&status),
        };
        let sender = sender.clone();
        tokio::spawn(async move {
            let outcome = reach.until(deadline, startup).await;
            let _ = sender.send(outcome);
        });
    }
    drop(sender);

    let mut reached: Vec<Reached> = Vec::new();
    let has_every_role = |reached: &[Reached]| {
        mode.spec()
            .required_roles
            .iter()
            .all(|role| reached.iter().any(|r| r.address.role == *role))
    };
    while !has_every_role(&reached) {
        match arrivals.recv().await {
            Some(Attempt::Reached(worker)) => reached.push(*worker),
            Some(Attempt::Fatal(err)) => return Err(err),
            // The status holds its last error for the message below.
            Some(Attempt::GaveUp) => {}
            None => {
                let waited = status
                    .workers()
                    .iter()
                    .filter(|w| !w.reached)
                    .map(|w| {
                        format!(
                            "{} worker {} ({})",
                            w.role,
                            w.url,
                            w.error.as_deref().unwrap_or("no answer")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; ");
                bail!(
                    "no worker of every role {} mode needs answered within \
                     --worker-startup-timeout-secs ({} s): {waited}",
                    mode.name(),
                    startup.timeout.as_secs()
                );
            }
        }
    }
    let runtime = reached[0].runtime;
    if let Some(other) = reached.iter().find(|r| r.runtime != runtime) {
        bail!(
            "the workers speak different protocols: {} is {}, {} is {} (see --runtime)",
            reached[0].address.url,
            runtime.name(),
            other.address.url,
            other.runtime.name()
        );
    }
    if mode == Mode::EncodePrefillDecode && !runtime.has_encoder() {
        bail!(
            "EPD needs encode workers, but {} has no encoder protocol: use TokenSpeed workers",
            runtime.name()
        );
    }
    let workers = WorkerSet::default();
    let joined: Vec<Arc<Worker>> = reached
        .into_iter()
        .map(|worker| join(&workers, worker, config))
        .collect::<anyhow::Result<Vec<_>>>()?
        .into_iter()
        .flatten()
        .collect();
    env.lanes.learn_namespaces(&joined).await;
    let probe = joined
        .iter()
        .find(|w| w.role() != WorkerRole::Encode)
        .context("no generating worker")?;
    let ModelContext {
        tokenizer,
        model,
        media,
    } = env
        .model_context(probe, config.model.served_model_name.clone())
        .await?;
    let routing = &config.routing;
    let policies = routing.role_policies(None);
    for worker in &joined {
        watch(worker, config);
    }
    start_load_polling(
        &workers,
        &policies,
        routing.load_check_interval,
        config.lifecycle.max_in_flight.follows_engine(),
    );

    // Those still coming join as they answer.
    let late = LateArrivals {
        workers: workers.clone(),
        runtime,
        lanes: Arc::downgrade(&env.lanes),
        config: config.clone(),
    };
    tokio::spawn(late.run(arrivals));

    Ok(Router::new(RouterParts {
        mode,
        runtime,
        workers,
        policies,
        tokenizer,
        model,
        retry: routing.retry_for(None),
        request_timeout: routing.request_timeout,
        media,
        tasks: tasks.clone(),
        offload: env.offload.clone(),
    }))
}

/// Makes the logical workers of a worker that answered (one per
/// data-parallel rank) and adds them to `workers`, ready: it has just
/// answered.
fn join(
    workers: &WorkerSet,
    reached: Reached,
    config: &GatewayConfig,
) -> anyhow::Result<Vec<Arc<Worker>>> {
    let dp_aware = config.lifecycle.dp_aware;
    let engine: Arc<dyn Engine> = Arc::new(reached.client);
    let mut joined = Vec::new();
    for rank in 0..reached.ranks {
        let worker = Worker::new(
            Arc::clone(&engine),
            reached.address.role,
            reached.bootstrap_port,
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .with_breaker(config.lifecycle.breaker)
        .with_in_flight_limit(config.lifecycle.max_in_flight);
        let worker = Arc::new(if dp_aware {
            worker.with_dp_rank(rank)
        } else {
            worker
        });
        if let Some(load) = &reached.load {
            worker.learn_limit(reported_limit(load, dp_aware));
        }
        workers.insert(Arc::clone(&worker));
        joined.push(worker);
    }
    Ok(joined)
}

/// Starts a joined worker's health probes and circuit probe.
fn watch(worker: &Arc<Worker>, config: &GatewayConfig) {
    if let Some(health) = config.lifecycle.health {
        spawn_probe_loop(Arc::clone(worker), health);
    }
    spawn_circuit_probe(Arc::clone(worker), config.lifecycle.probe_timeout);
}

/// Workers answering after the router started serving.
struct LateArrivals {
    workers: WorkerSet,
    runtime: Runtime,
    /// Weak: a shutdown releases the lanes (and their shm names) while
    /// late workers may still be tried.
    lanes: std::sync::Weak<crate::lanes::TensorLanes>,
    config: GatewayConfig,
}

impl LateArrivals {
    async fn run(self, mut arrivals: mpsc::UnboundedReceiver<Attempt>) {
        while let Some(attempt) = arrivals.recv().await {
            let reached = match attempt {
                Attempt::Reached(reached) => *reached,
                Attempt::Fatal(err) => {
                    tracing::error!("{err:#}; the gateway serves without this worker");
                    continue;
                }
                Attempt::GaveUp => continue,
            };
            let url = reached.address.url.clone();
            if reached.runtime != self.runtime {
                tracing::error!(
                    worker = %url,
                    "the worker speaks {}, the others {}: not serving it",
                    reached.runtime.name(),
                    self.runtime.name()
                );
                continue;
            }
            match join(&self.workers, reached, &self.config) {
                Ok(joined) => {
                    let Some(lanes) = self.lanes.upgrade() else {
                        return;
                    };
                    lanes.learn_namespaces(&joined).await;
                    drop(lanes);
                    for worker in &joined {
                        watch(worker, &self.config);
                    }
                    tracing::info!(worker = %url, "worker answered and joined");
                }
                Err(err) => tracing::error!(worker = %url, "{err:#}"),
            }
        }
    }
}

/// Trying one worker.
struct Reach {
    address: WorkerAddress,
    /// `--runtime`; detected from the worker when `None`.
    runtime: Option<Runtime>,
    dp_aware: bool,
    connections: crate::engine::ConnectionConfig,
    tls: WorkerTls,
    lifecycle: crate::workers::Lifecycle,
    status: Arc<StartupStatus>,
}

/// Why one attempt failed.
enum Failure {
    /// Try again (the worker is not up yet, or not answering yet).
    Retry(String),
    Fatal(anyhow::Error),
}

impl Reach {
    /// Tries the worker until it answers, a fatal error, or the deadline.
    async fn until(self, deadline: Instant, startup: StartupConfig) -> Attempt {
        let (url, role) = (self.address.url.clone(), self.address.role);
        // The series recorded while trying (its connects) leave /metrics
        // with this hold when the worker is given up.
        let _series = crate::metrics::WorkerSeriesHold::new(&url);
        let mut backoff = Backoff::new(startup);
        let mut last_logged: Option<String> = None;
        loop {
            let attempt = tokio::time::timeout_at(deadline, self.once()).await;
            let why = match attempt {
                Ok(Ok(reached)) => {
                    self.status.update(&url, role, true, None);
                    return Attempt::Reached(Box::new(reached));
                }
                Ok(Err(Failure::Fatal(err))) => return Attempt::Fatal(err),
                Ok(Err(Failure::Retry(why))) => why,
                Err(_) => "no answer before the deadline".to_owned(),
            };
            self.status.update(&url, role, false, Some(why.clone()));
            // Once per distinct reason, not once per attempt.
            if last_logged.as_deref() != Some(why.as_str()) {
                tracing::warn!(worker = %url, %role, "worker not reachable yet, retrying: {why}");
                last_logged = Some(why.clone());
            }
            let pause = backoff.next();
            if Instant::now() + pause >= deadline {
                tracing::warn!(
                    worker = %url,
                    %role,
                    "gave up on the worker: it did not answer within --worker-startup-timeout-secs ({} s): {why}",
                    startup.timeout.as_secs()
                );
                return Attempt::GaveUp;
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// One attempt: TLS, runtime (or a HealthCheck), bootstrap port, ranks.
    async fn once(&self) -> Result<Reached, Failure> {
        let url = &self.address.url;
        let retry = |err: anyhow::Error| Failure::Retry(format!("{err:#}"));
        check_worker_tls(url, &self.tls).await.map_err(|err| {
            Failure::Fatal(anyhow::anyhow!(
                "{err} (see --ca-cert-path, --client-cert-path, --client-key-path)"
            ))
        })?;
        let client = match self.runtime {
            Some(runtime) => {
                let client =
                    EngineClient::with_connections(url, runtime, self.connections, &self.tls)
                        .map_err(|err| Failure::Fatal(anyhow::anyhow!("{err}")))?;
                let healthy = discover("HealthCheck", url, client.health_check())
                    .await
                    .map_err(retry)?;
                if !healthy {
                    return Err(Failure::Retry("HealthCheck: not healthy yet".to_owned()));
                }
                client
            }
            None => discover(
                "runtime detection",
                url,
                EngineClient::detect_with_tls(url, self.connections, &self.tls),
            )
            .await
            .map_err(retry)?,
        };
        let runtime = client.runtime();
        let role = self.address.role;
        let bootstrap_port = match (
            self.address.bootstrap_port,
            matches!(role, WorkerRole::Prefill | WorkerRole::Encode),
        ) {
            (Some(port), _) => Some(port),
            (None, false) => None,
            (None, true) => {
                let info = discover("GetServerInfo", url, client.server_info())
                    .await
                    .map_err(retry)?;
                Some(advertised_bootstrap_port(&info).ok_or_else(|| {
                    Failure::Fatal(anyhow::anyhow!(
                        "{role} worker {url} advertises no bootstrap port: give it after the URL"
                    ))
                })?)
            }
        };
        let (ranks, load) = if self.dp_aware {
            let load = discover("GetLoads", url, client.loads())
                .await
                .map_err(retry)?;
            let ranks = self
                .lifecycle
                .dp_ranks(url, &load)
                .map_err(|err| Failure::Fatal(anyhow::anyhow!("{err}")))?;
            (ranks, Some(load))
        } else if self.lifecycle.max_in_flight.follows_engine() {
            // Its in-flight limit from the start; the load polling keeps
            // it current. An engine without GetLoads has none.
            let load = discover("GetLoads", url, client.loads()).await;
            if let Err(err) = &load {
                tracing::debug!(worker = %url, "no in-flight limit reported yet: {err:#}");
            }
            (1, load.ok())
        } else {
            (1, None)
        };
        Ok(Reached {
            address: self.address.clone(),
            client,
            runtime,
            bootstrap_port,
            ranks,
            load,
            _series: crate::metrics::WorkerSeriesHold::new(url),
        })
    }
}

/// The pauses between attempts to reach a worker: doubling from
/// `first_backoff` up to `max_backoff`.
#[derive(Debug, Clone, Copy)]
struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    fn new(startup: StartupConfig) -> Self {
        Self {
            next: startup.first_backoff,
            max: startup.max_backoff,
        }
    }

    fn next(&mut self) -> Duration {
        let pause = self.next;
        self.next = (pause * 2).min(self.max);
        pause
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_between_attempts_doubles_up_to_the_check_interval() {
        let startup = StartupConfig {
            max_backoff: Duration::from_secs(3),
            ..StartupConfig::default()
        };
        let mut backoff = Backoff::new(startup);
        let ms: Vec<u128> = (0..7).map(|_| backoff.next().as_millis()).collect();
        assert_eq!(ms, [250, 500, 1000, 2000, 3000, 3000, 3000]);
    }

    #[test]
    fn readiness_while_starting_names_the_workers_not_reached() {
        let fleet = [
            WorkerAddress {
                url: "grpc://p:1".into(),
                role: WorkerRole::Prefill,
                bootstrap_port: None,
            },
            WorkerAddress {
                url: "grpc://d:1".into(),
                role: WorkerRole::Decode,
                bootstrap_port: None,
            },
        ];
        let status = StartupStatus::new(Mode::PrefillDecode, &fleet);
        status.update("grpc://p:1", WorkerRole::Prefill, true, None);
        status.update(
            "grpc://d:1",
            WorkerRole::Decode,
            false,
            Some("connection refused".into()),
        );
        assert_eq!(
            status.readiness(),
            serde_json::json!({
                "status": "starting",
                "mode": "grpc_pd",
                "workers": {
                    "prefill": {"reached": 1, "total": 1},
                    "decode": {"reached": 0, "total": 1},
                },
                "waiting_for": [
                    {"url": "grpc://d:1", "role": "decode", "error": "connection refused"}
                ],
            })
        );
    }
}
