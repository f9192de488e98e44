//! What every handler shares: the routers and the admin API's registries.
//!
//! A gateway serves one model through one router, or (`--enable-igw`)
//! several models through a [`ModelTable`] that builds a router per model
//! and mode. Handlers ask [`AppState::router_for`] for the router of the
//! model a request names (after resolving `--model-alias`), so both shapes
//! serve through the same code.
//!
//! A static fleet's router exists only once its workers have answered
//! (see `startup`): until then the state has no fleet, `/readiness` shows
//! what start-up waits for, and requests answer 503 `model_not_ready`.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::endpoints::InFlightResponses;
use crate::admission::{Admission, AdmissionConfig};
use crate::error::{Error, ErrorCode, Result, excerpt};
use crate::history::History;
use crate::mcp::{McpClients, McpConfig};
use crate::models::ModelTable;
use crate::pipeline::prepare::ServedModel;
use crate::router::Router;
use crate::shutdown::RequestTasks;
use crate::startup::StartupStatus;
use crate::workers::{BreakerConfig, Lifecycle, WorkerRegistry, WorkerSpec, WorkerStatus};

/// The routers a gateway serves with.
#[derive(Debug)]
pub enum Fleet {
    /// One model, one mode.
    Single {
        router: Arc<Router>,
        registry: Arc<WorkerRegistry>,
    },
    /// Several models, each in the mode its workers imply.
    Models(Arc<ModelTable>),
}

/// The metrics `router` label of IGW requests that fail before a model's
/// router is known.
const IGW_LABEL: &str = "igw";

#[derive(Debug)]
pub struct AppState {
    /// Set at once, or (a static fleet) once start-up has reached its
    /// workers.
    fleet: OnceLock<Fleet>,
    /// What start-up waits for, while `fleet` is unset.
    startup: Option<Arc<StartupStatus>>,
    /// `--model-alias ALIAS=MODEL`.
    pub aliases: HashMap<String, String>,
    pub started: Instant,
    /// Admission control of the inference routes.
    pub admission: Arc<Admission>,
    /// Where handlers run work that outlives them (SSE producers), so the
    /// shutdown can wait for it.
    pub tasks: RequestTasks,
    /// Cancelled when the gateway is shutting down: readiness answers 503.
    pub unready: CancellationToken,
    /// Stored responses and conversations (`--history-backend`).
    pub history: History,
    /// Responses running here, for cancellation.
    pub responses: InFlightResponses,
    /// Connections to the MCP servers Responses requests name (`None` when
    /// its HTTP client could not be built: MCP tools are then refused).
    pub mcp: Option<McpClients>,
    /// The gate CPU-heavy work passes (large bodies parsed here, prompts in
    /// the routers), shared with every router.
    pub offload: crate::offload::Offload,
}

impl AppState {
    /// One router; its admin API registers workers without health probes.
    pub fn new(router: Router) -> Self {
        let registry = WorkerRegistry::new(
            router.model().name.clone(),
            router.runtime(),
            router.mode().spec().required_roles.to_vec(),
            router.workers().clone(),
            Lifecycle {
                health: None,
                breaker: BreakerConfig::default(),
                probe_timeout: Duration::from_secs(5),
                dp_aware: false,
                connections: crate::engine::ConnectionConfig::default(),
                max_in_flight: crate::workers::InFlightLimit::Engine,
                max_dp_ranks: Lifecycle::DEFAULT_MAX_DP_RANKS,
                remove_unhealthy: false,
            },
            crate::lanes::TensorLanes::inline() as _,
        );
        Self::with_registry(router, Arc::new(registry))
    }

    pub fn with_registry(router: Router, registry: Arc<WorkerRegistry>) -> Self {
        Self::of(Fleet::Single {
            router: Arc::new(router),
            registry,
        })
    }

    pub fn of(fleet: Fleet) -> Self {
        let state = Self::starting(None);
        let _ = state.fleet.set(fleet);
        state
    }

    /// A gateway whose fleet start-up is still bringing up; [`AppState::serve`]
    /// installs it.
    pub fn starting(status: Option<Arc<StartupStatus>>) -> Self {
        Self {
            fleet: OnceLock::new(),
            startup: status,
            aliases: HashMap::new(),
            started: Instant::now(),
            admission: Admission::new(AdmissionConfig::default()),
            tasks: RequestTasks::new(),
            unready: CancellationToken::new(),
            history: History::memory(),
            responses: InFlightResponses::default(),
            mcp: McpClients::new(McpConfig::default()).ok(),
            offload: crate::offload::Offload::for_host(),
        }
    }

    /// Shares `offload`'s slots (the routers' gate) for the body parsing
    /// done before a request reaches a router.
    pub fn with_offload(mut self, offload: crate::offload::Offload) -> Self {
        self.offload = offload;
        self
    }

    /// Stores history in `history` (an in-memory store otherwise).
    pub fn with_history(mut self, history: History) -> Self {
        self.history = history;
        self
    }

    /// Reaches MCP servers through `mcp`.
    pub fn with_mcp(mut self, mcp: McpClients) -> Self {
        self.mcp = Some(mcp);
        self
    }

    /// Takes part in `shutdown`: its request tasks, and its readiness.
    pub fn with_shutdown(mut self, shutdown: &crate::shutdown::Shutdown) -> Self {
        self.tasks = shutdown.tasks().clone();
        self.unready = shutdown.unready();
        self
    }

    pub fn with_admission(mut self, config: AdmissionConfig) -> Self {
        self.admission = Admission::new(config);
        self
    }

    pub fn with_aliases(mut self, aliases: HashMap<String, String>) -> Self {
        self.aliases = aliases;
        self
    }

    /// Installs the fleet start-up brought up; from then on requests are
    /// served. Only the first call counts.
    pub fn serve(&self, fleet: Fleet) {
        let _ = self.fleet.set(fleet);
    }

    /// The fleet, once start-up has brought it up.
    pub fn fleet(&self) -> Option<&Fleet> {
        self.fleet.get()
    }

    /// The refusal of a request while start-up still waits for workers.
    fn starting_error() -> Error {
        Error::new(
            ErrorCode::ModelNotReady,
            "the gateway is starting: its workers have not all answered yet (see /readiness)",
        )
    }

    fn resolve<'a>(&'a self, model: &'a str) -> &'a str {
        self.aliases.get(model).map_or(model, String::as_str)
    }

    /// The router for a request naming `model` (or none), and the model's
    /// canonical name to put on the request.
    pub fn router_for(&self, model: Option<&str>) -> Result<(Arc<Router>, Option<String>)> {
        let model = model.map(|m| self.resolve(m));
        let Some(fleet) = self.fleet() else {
            return Err(Self::starting_error());
        };
        match fleet {
            Fleet::Single { router, .. } => Ok((Arc::clone(router), model.map(str::to_owned))),
            Fleet::Models(table) => {
                let name = match model {
                    Some(name) => name.to_owned(),
                    None => table.sole_model().ok_or_else(|| {
                        Error::invalid_request("name the model: this gateway serves several")
                            .with_param("model")
                    })?,
                };
                Ok((table.router_for(&name)?, Some(name)))
            }
        }
    }

    /// The largest `max_tokens` a request may ask for before its model is
    /// known (`None` with several models: each router checks its own).
    pub fn output_limit(&self) -> Option<u32> {
        match self.fleet()? {
            Fleet::Single { router, .. } => Some(router.model().max_context_length),
            Fleet::Models(_) => None,
        }
    }

    /// The metrics label for failures before a router is chosen.
    pub fn default_label(&self) -> &'static str {
        match self.fleet() {
            Some(Fleet::Single { router, .. }) => router.mode().metrics_label(),
            Some(Fleet::Models(_)) => IGW_LABEL,
            None => self
                .startup
                .as_ref()
                .map_or(IGW_LABEL, |status| status.mode().metrics_label()),
        }
    }

    /// The models `/v1/models` lists.
    pub fn served_models(&self) -> Vec<ServedModel> {
        match self.fleet() {
            Some(Fleet::Single { router, .. }) => vec![router.model().clone()],
            Some(Fleet::Models(table)) => table.served(),
            None => Vec::new(),
        }
    }

    pub async fn register(&self, spec: WorkerSpec) -> Result<WorkerStatus> {
        let Some(fleet) = self.fleet() else {
            return Err(Self::starting_error());
        };
        match fleet {
            Fleet::Single { registry, .. } => {
                let spec = WorkerSpec {
                    model_id: spec.model_id.map(|m| self.resolve(&m).to_owned()),
                    ..spec
                };
                registry.register(spec)
            }
            Fleet::Models(table) => table.register(spec).await,
        }
    }

    pub fn remove(&self, id: &str) -> Result<WorkerStatus> {
        match self.fleet() {
            Some(Fleet::Single { registry, .. }) => registry.remove(id),
            Some(Fleet::Models(table)) => table.remove(id),
            None => Err(Self::starting_error()),
        }
    }

    pub fn status(&self, id: &str) -> Result<WorkerStatus> {
        let found = match self.fleet() {
            Some(Fleet::Single { registry, .. }) => registry.status(id),
            Some(Fleet::Models(table)) => table.status(id),
            None => None,
        };
        found.ok_or_else(|| {
            Error::new(
                ErrorCode::WorkerNotFound,
                format!("no worker has id {:?}", excerpt(id)),
            )
        })
    }

    pub fn list(&self) -> Vec<WorkerStatus> {
        match self.fleet() {
            Some(Fleet::Single { registry, .. }) => registry.list(),
            Some(Fleet::Models(table)) => table.list(),
            None => Vec::new(),
        }
    }

    /// `/readiness`: whether the gateway can serve, and the details.
    pub fn readiness(&self) -> (bool, serde_json::Value) {
        if self.unready.is_cancelled() {
            return (false, serde_json::json!({"status": "shutting_down"}));
        }
        let Some(fleet) = self.fleet() else {
            let body = self.startup.as_ref().map_or_else(
                || serde_json::json!({"status": "starting"}),
                |status| status.readiness(),
            );
            return (false, body);
        };
        match fleet {
            Fleet::Single { router, .. } => {
                let roles: serde_json::Map<String, serde_json::Value> = router
                    .mode()
                    .spec()
                    .required_roles
                    .iter()
                    .map(|&role| {
                        (
                            role.name().to_owned(),
                            serde_json::json!({
                                "healthy": router.workers().healthy(role).len(),
                                "total": router.workers().of_role(role).len(),
                            }),
                        )
                    })
                    .collect();
                let ready = router.ready();
                let body = serde_json::json!({
                    "status": if ready { "ready" } else { "not_ready" },
                    "mode": router.mode().metrics_label(),
                    "workers": roles,
                });
                (ready, body)
            }
            Fleet::Models(table) => {
                let models: serde_json::Map<String, serde_json::Value> = table
                    .readiness()
                    .into_iter()
                    .map(|model| {
                        let workers: serde_json::Map<String, serde_json::Value> = model
                            .workers
                            .into_iter()
                            .map(|(role, healthy, total)| {
                                (
                                    role.name().to_owned(),
                                    serde_json::json!({"healthy": healthy, "total": total}),
                                )
                            })
                            .collect();
                        (
                            model.name,
                            serde_json::json!({
                                "status": if model.mode.is_some() { "ready" } else { "not_ready" },
                                "mode": model.mode,
                                "workers": workers,
                            }),
                        )
                    })
                    .collect();
                let ready = models.values().any(|m| m["status"] == "ready");
                let body = serde_json::json!({
                    "status": if ready { "ready" } else { "not_ready" },
                    "mode": IGW_LABEL,
                    "models": models,
                });
                (ready, body)
            }
        }
    }
}
