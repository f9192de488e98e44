//! Several models, each in its own mode, behind one gateway
//! (`--enable-igw`).
//!
//! The gateway starts with no workers. Workers are registered through the
//! admin API with a role and a `model_id`; each model gets its own worker
//! set, registry, policies (per-model override or the role flags) and retry
//! settings. A model is served in the mode its registered workers imply —
//! encode+prefill+decode → EPD, prefill+decode → PD, regular → Regular — by
//! a [`Router`] built for that mode on first use (the same `Mode`-
//! parameterized type as a single-model gateway), sharing the model's
//! workers and policy state. A model whose roles make no mode, or whose
//! tokenizer has not been discovered yet, answers 503 `model_not_ready`.
//!
//! A model's tokenizer and limits are discovered in the background from its
//! first ready generating worker (the flags' `--tokenizer-path` /
//! `--model-path` win when given, as in a single-model gateway).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use crate::config::RoutingConfig;
use crate::discovery::{DiscoveryEnv, ModelContext, start_load_polling};
use crate::engine::{EngineClient, Runtime, WorkerTls};
use crate::error::{Error, ErrorCode, Result, excerpt};
use crate::mode::Mode;
use crate::pipeline::prepare::ServedModel;
use crate::pipeline::stages::RolePolicies;
use crate::router::{RetryConfig, Router, RouterParts};
use crate::shutdown::RequestTasks;
use crate::workers::{Lifecycle, WorkerRegistry, WorkerRole, WorkerSet, WorkerSpec, WorkerStatus};

/// How often a model without a discovered context looks for a ready worker.
const DISCOVERY_POLL: Duration = Duration::from_millis(100);
/// The pause after a failed discovery before the next try.
const DISCOVERY_RETRY: Duration = Duration::from_secs(1);

/// A model's readiness: the mode label it serves in (`None`: not
/// servable) and per role its (healthy, total) workers.
#[derive(Debug, Clone)]
pub struct ModelReadiness {
    pub name: String,
    pub mode: Option<&'static str>,
    pub workers: Vec<(WorkerRole, usize, usize)>,
}

/// One model of an IGW gateway.
#[derive(Debug)]
struct ModelEntry {
    registry: Arc<WorkerRegistry>,
    runtime: Runtime,
    policies: RolePolicies,
    retry: RetryConfig,
    context: OnceLock<ModelContext>,
    routers: Mutex<HashMap<Mode, Arc<Router>>>,
}

impl ModelEntry {
    fn workers(&self) -> &WorkerSet {
        self.registry.workers()
    }

    /// The mode the registered roles imply, if they make a complete one.
    fn mode(&self) -> std::result::Result<Mode, String> {
        let roles = self.workers().roles();
        let mode = Mode::implied_by(&roles);
        let complete = mode
            .spec()
            .required_roles
            .iter()
            .all(|role| roles.contains(role));
        if !complete {
            let names: Vec<&str> = roles.iter().map(|r| r.name()).collect();
            return Err(if names.is_empty() {
                "it has no registered workers".to_owned()
            } else {
                format!(
                    "its workers ({}) make no mode: it needs regular workers, or prefill and decode workers (plus encode for EPD)",
                    names.join(", ")
                )
            });
        }
        if mode == Mode::EncodePrefillDecode && !self.runtime.has_encoder() {
            return Err(format!(
                "EPD needs encode workers, but {} has no encoder protocol",
                self.runtime.name()
            ));
        }
        Ok(mode)
    }
}

/// What every model of an IGW gateway is served with.
#[derive(Debug)]
pub struct ModelTableConfig {
    /// Policies, retries and timeouts (with their per-model overrides).
    pub routing: RoutingConfig,
    /// How registered workers are watched.
    pub lifecycle: Lifecycle,
    /// The runtime of a worker registered without one (`--runtime`);
    /// `None`: its model's, else asked of the worker.
    pub default_runtime: Option<Runtime>,
    /// How a model is discovered from its first ready worker.
    pub env: DiscoveryEnv,
    /// Where the routers' leg supervisors and engine aborts run.
    pub tasks: RequestTasks,
    /// How `grpcs://` workers are dialled.
    pub worker_tls: WorkerTls,
}

/// The models of an IGW gateway.
#[derive(Debug)]
pub struct ModelTable {
    config: Arc<ModelTableConfig>,
    models: RwLock<HashMap<String, Arc<ModelEntry>>>,
}

impl ModelTable {
    pub fn new(config: ModelTableConfig) -> Self {
        Self {
            config: Arc::new(config),
            models: RwLock::default(),
        }
    }

    fn entry(&self, name: &str) -> Option<Arc<ModelEntry>> {
        self.models
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    fn entries(&self) -> Vec<(String, Arc<ModelEntry>)> {
        let mut all: Vec<(String, Arc<ModelEntry>)> = self
            .models
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(name, entry)| (name.clone(), Arc::clone(entry)))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// The model's entry, created (with its discovery task and load
    /// polling) on its first worker.
    fn entry_or_create(&self, name: &str, runtime: Runtime) -> Arc<ModelEntry> {
        let mut models = self.models.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = models.get(name) {
            return Arc::clone(entry);
        }
        let config = &self.config;
        let policies = config.routing.role_policies(Some(name));
        let retry = config.routing.retry_for(Some(name));
        let registry = WorkerRegistry::new(
            name.to_owned(),
            runtime,
            vec![
                WorkerRole::Regular,
                WorkerRole::Prefill,
                WorkerRole::Decode,
                WorkerRole::Encode,
            ],
            WorkerSet::default(),
            config.lifecycle,
            Arc::clone(&config.env.lanes) as _,
        )
        .with_worker_tls(config.worker_tls.clone());
        let entry = Arc::new(ModelEntry {
            registry: Arc::new(registry),
            runtime,
            policies,
            retry,
            context: OnceLock::new(),
            routers: Mutex::default(),
        });
        entry.registry.spawn_unhealthy_removal();
        start_load_polling(
            entry.workers(),
            &entry.policies,
            config.routing.load_check_interval,
            config.lifecycle.max_in_flight.follows_engine(),
        );
        tokio::spawn(discover(
            Arc::clone(config),
            name.to_owned(),
            Arc::clone(&entry),
        ));
        models.insert(name.to_owned(), Arc::clone(&entry));
        entry
    }

    /// The router that serves `model` now.
    pub fn router_for(&self, model: &str) -> Result<Arc<Router>> {
        let entry = self.entry(model).ok_or_else(|| {
            Error::new(
                ErrorCode::ModelNotFound,
                format!("model {:?} is not served here", excerpt(model)),
            )
            .with_param("model")
        })?;
        let not_ready = |why: String| {
            Error::new(
                ErrorCode::ModelNotReady,
                format!("model {:?} cannot be served yet: {why}", excerpt(model)),
            )
        };
        let mode = entry.mode().map_err(not_ready)?;
        let context = entry
            .context
            .get()
            .ok_or_else(|| not_ready("its tokenizer is still being discovered".to_owned()))?;
        let mut routers = entry.routers.lock().unwrap_or_else(PoisonError::into_inner);
        let router = routers.entry(mode).or_insert_with(|| {
            tracing::info!(model, mode = mode.name(), "serving a model in a new mode");
            Arc::new(Router::new(RouterParts {
                mode,
                runtime: entry.runtime,
                workers: entry.workers().clone(),
                policies: entry.policies.clone(),
                tokenizer: context.tokenizer.clone(),
                model: context.model.clone(),
                retry: entry.retry,
                request_timeout: self.config.routing.request_timeout,
                media: context.media.clone(),
                tasks: self.config.tasks.clone(),
                offload: self.config.env.offload.clone(),
            }))
        });
        Ok(Arc::clone(router))
    }

    /// The only model, when exactly one is registered (requests may then
    /// omit `model`).
    pub fn sole_model(&self) -> Option<String> {
        let models = self.models.read().unwrap_or_else(PoisonError::into_inner);
        (models.len() == 1)
            .then(|| models.keys().next().cloned())
            .flatten()
    }

    /// The models with a discovered context, for `/v1/models`.
    pub fn served(&self) -> Vec<ServedModel> {
        self.entries()
            .into_iter()
            .filter_map(|(_, entry)| entry.context.get().map(|c| c.model.clone()))
            .collect()
    }

    /// Per model: whether and in which mode it serves, and its workers.
    pub fn readiness(&self) -> Vec<ModelReadiness> {
        self.entries()
            .into_iter()
            .map(|(name, entry)| {
                let servable = entry
                    .mode()
                    .ok()
                    .filter(|mode| {
                        entry.context.get().is_some()
                            && mode
                                .spec()
                                .required_roles
                                .iter()
                                .all(|&role| !entry.workers().healthy(role).is_empty())
                    })
                    .map(Mode::metrics_label);
                let roles = entry
                    .workers()
                    .roles()
                    .into_iter()
                    .map(|role| {
                        (
                            role,
                            entry.workers().healthy(role).len(),
                            entry.workers().of_role(role).len(),
                        )
                    })
                    .collect();
                ModelReadiness {
                    name,
                    mode: servable,
                    workers: roles,
                }
            })
            .collect()
    }

    /// Registers a worker for its `model_id` (required). A worker
    /// registered without `runtime` (and no `--runtime`) speaks its model's
    /// protocol, or, for a model's first worker, the one it answers in
    /// (probed here: an SGLang worker taken for TokenSpeed would fail every
    /// health probe and stay pending).
    pub async fn register(&self, spec: WorkerSpec) -> Result<WorkerStatus> {
        let model = spec.model_id.clone().ok_or_else(|| {
            Error::invalid_parameter("model_id", "a worker needs a model_id with --enable-igw")
        })?;
        // A URL is one worker across all models.
        let id = crate::workers::worker_id(&spec.url);
        if self.status(&id).is_some() {
            return Err(Error::new(
                ErrorCode::WorkerAlreadyExists,
                format!(
                    "worker {} is already registered (id {id})",
                    excerpt(&spec.url)
                ),
            )
            .with_param("url"));
        }
        let runtime = match spec.runtime.as_deref() {
            Some("tokenspeed") => Runtime::TokenSpeed,
            Some("sglang") => Runtime::Sglang,
            Some(other) => {
                return Err(Error::invalid_parameter(
                    "runtime",
                    format!("unknown runtime {:?} (tokenspeed, sglang)", excerpt(other)),
                ));
            }
            None => match (self.config.default_runtime, self.entry(&model)) {
                (Some(runtime), _) => runtime,
                (None, Some(entry)) => entry.runtime,
                (None, None) => self.detect_runtime(&spec.url).await?,
            },
        };
        let entry = self.entry_or_create(&model, runtime);
        if entry.runtime != runtime {
            return Err(Error::invalid_parameter(
                "runtime",
                format!(
                    "model {model:?} is served by {} workers",
                    entry.runtime.name()
                ),
            ));
        }
        entry.registry.register(spec)
    }

    /// The protocol the worker at `url` answers in.
    async fn detect_runtime(&self, url: &str) -> Result<Runtime> {
        let detect = EngineClient::detect_with_tls(
            url,
            self.config.lifecycle.connections,
            &self.config.worker_tls,
        );
        let unknown = |why: String| {
            Error::new(
                ErrorCode::WorkerUnavailable,
                format!(
                    "cannot tell which protocol worker {url} speaks ({why}): give \"runtime\" \
                     (tokenspeed or sglang) to register a worker that is not up yet"
                ),
            )
            .with_param("runtime")
        };
        match tokio::time::timeout(crate::discovery::DISCOVERY_TIMEOUT, detect).await {
            Ok(Ok(client)) => Ok(client.runtime()),
            Ok(Err(err)) => Err(unknown(err.message)),
            Err(_) => Err(unknown("no answer in time".to_owned())),
        }
    }

    pub fn remove(&self, id: &str) -> Result<WorkerStatus> {
        for (_, entry) in self.entries() {
            if entry.registry.status(id).is_some() {
                return entry.registry.remove(id);
            }
        }
        Err(Error::new(
            ErrorCode::WorkerNotFound,
            format!("no worker has id {:?}", excerpt(id)),
        ))
    }

    pub fn status(&self, id: &str) -> Option<WorkerStatus> {
        self.entries()
            .into_iter()
            .find_map(|(_, entry)| entry.registry.status(id))
    }

    pub fn list(&self) -> Vec<WorkerStatus> {
        self.entries()
            .into_iter()
            .flat_map(|(_, entry)| entry.registry.list())
            .collect()
    }
}

/// Waits for a ready generating worker of the model, then discovers the
/// model's tokenizer and limits from it (retrying on failure).
async fn discover(config: Arc<ModelTableConfig>, name: String, entry: Arc<ModelEntry>) {
    loop {
        let probe = entry
            .workers()
            .all()
            .into_iter()
            .find(|w| w.role() != WorkerRole::Encode && w.is_healthy());
        let Some(probe) = probe else {
            tokio::time::sleep(DISCOVERY_POLL).await;
            continue;
        };
        match config.env.model_context(&probe, Some(name.clone())).await {
            Ok(context) => {
                tracing::info!(model = %name, "model discovered");
                let _ = entry.context.set(context);
                return;
            }
            Err(err) => {
                tracing::warn!(model = %name, %err, "model discovery failed; retrying");
                tokio::time::sleep(DISCOVERY_RETRY).await;
            }
        }
    }
}
