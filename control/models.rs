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

use crate::cli::{LaunchArgs, RuntimeArg};
use crate::engine::Runtime;
use crate::error::{Error, ErrorCode, Result};
use crate::mode::Mode;
use crate::pipeline::prepare::ServedModel;
use crate::pipeline::stages::RolePolicies;
use crate::policies::PolicyKind;
use crate::router::{RetryConfig, Router, RouterParts};
use crate::server::{
    ModelContext, lifecycle, model_context, retry_config, role_policies_with, start_load_polling,
};
use smg_dataplane::runtime::DataPlane;

use crate::workers::{WorkerRegistry, WorkerRole, WorkerSet, WorkerSpec, WorkerStatus};

/// How often a model without a discovered context looks for a ready worker.
const DISCOVERY_POLL: Duration = Duration::from_millis(100);
/// The pause after a failed discovery before the next try.
const DISCOVERY_RETRY: Duration = Duration::from_secs(1);

/// Parses `NAME=VALUE` flag values into a map, checking each value.
pub fn named_values<T>(
    flag: &str,
    values: &[String],
    parse: impl Fn(&str) -> std::result::Result<T, String>,
) -> std::result::Result<HashMap<String, T>, String> {
    values
        .iter()
        .map(|pair| {
            let (name, value) = pair
                .split_once('=')
                .filter(|(name, _)| !name.is_empty())
                .ok_or_else(|| format!("--{flag} {pair:?}: expected NAME=VALUE"))?;
            Ok((
                name.to_owned(),
                parse(value).map_err(|why| format!("--{flag} {pair:?}: {why}"))?,
            ))
        })
        .collect()
}

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

/// The models of an IGW gateway.
#[derive(Debug)]
pub struct ModelTable {
    args: Arc<LaunchArgs>,
    /// Where every model's images are preprocessed.
    dataplane: DataPlane,
    model_policies: HashMap<String, PolicyKind>,
    model_retries: HashMap<String, u32>,
    models: RwLock<HashMap<String, Arc<ModelEntry>>>,
}

impl ModelTable {
    pub fn new(args: Arc<LaunchArgs>, dataplane: DataPlane) -> anyhow::Result<Self> {
        let model_policies = named_values("model-policy", &args.model_policy, |v| {
            <PolicyKind as clap::ValueEnum>::from_str(v, false)
        })
        .map_err(anyhow::Error::msg)?;
        let model_retries = named_values("model-max-retries", &args.model_max_retries, |v| {
            v.parse::<u32>().map_err(|e| e.to_string())
        })
        .map_err(anyhow::Error::msg)?;
        Ok(Self {
            args,
            dataplane,
            model_policies,
            model_retries,
            models: RwLock::default(),
        })
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
        let args = &self.args;
        let policies = role_policies_with(args, self.model_policies.get(name).copied());
        let mut retry = retry_config(args);
        if let Some(&max_retries) = self.model_retries.get(name) {
            retry.max_retries = max_retries;
        }
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
            lifecycle(args),
        );
        let entry = Arc::new(ModelEntry {
            registry: Arc::new(registry),
            runtime,
            policies,
            retry,
            context: OnceLock::new(),
            routers: Mutex::default(),
        });
        start_load_polling(entry.workers(), &entry.policies, args);
        tokio::spawn(discover(
            Arc::clone(args),
            self.dataplane.clone(),
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
                format!("model {model:?} is not served here"),
            )
            .with_param("model")
        })?;
        let not_ready = |why: String| {
            Error::new(
                ErrorCode::ModelNotReady,
                format!("model {model:?} cannot be served yet: {why}"),
            )
        };
        let mode = entry.mode().map_err(not_ready)?;
        let context = entry
            .context
            .get()
            .ok_or_else(|| not_ready("its tokenizer is still being discovered".to_owned()))?;
        let mut routers = entry.routers.lock().unwrap_or_else(PoisonError::into_inner);
        let router = routers.entry(mode).or_insert_with(|| {
            tracing::info!(model, ?mode, "serving a model in a new mode");
            Arc::new(Router::new(RouterParts {
                mode,
                runtime: entry.runtime,
                workers: entry.workers().clone(),
                policies: entry.policies.clone(),
                tokenizer: context.tokenizer.clone(),
                model: context.model.clone(),
                retry: entry.retry,
                request_timeout: Duration::from_secs(self.args.request_timeout_secs.max(1)),
                media: context.media.clone(),
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

    /// Registers a worker for its `model_id` (required).
    pub fn register(&self, spec: WorkerSpec) -> Result<WorkerStatus> {
        let model = spec.model_id.clone().ok_or_else(|| {
            Error::invalid_parameter("model_id", "a worker needs a model_id with --enable-igw")
        })?;
        // A URL is one worker across all models.
        let id = crate::workers::worker_id(&spec.url);
        if self.status(&id).is_some() {
            return Err(Error::new(
                ErrorCode::WorkerAlreadyExists,
                format!("worker {} is already registered (id {id})", spec.url),
            )
            .with_param("url"));
        }
        let runtime = match spec.runtime.as_deref() {
            Some("tokenspeed") => Runtime::TokenSpeed,
            Some("sglang") => Runtime::Sglang,
            Some(other) => {
                return Err(Error::invalid_parameter(
                    "runtime",
                    format!("unknown runtime {other:?} (tokenspeed, sglang)"),
                ));
            }
            None => match self.args.runtime {
                Some(RuntimeArg::Sglang) => Runtime::Sglang,
                Some(RuntimeArg::Tokenspeed) | None => Runtime::TokenSpeed,
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

    pub fn remove(&self, id: &str) -> Result<WorkerStatus> {
        for (_, entry) in self.entries() {
            if entry.registry.status(id).is_some() {
                return entry.registry.remove(id);
            }
        }
        Err(Error::new(
            ErrorCode::WorkerNotFound,
            format!("no worker has id {id:?}"),
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
async fn discover(
    args: Arc<LaunchArgs>,
    dataplane: DataPlane,
    name: String,
    entry: Arc<ModelEntry>,
) {
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
        match model_context(&args, &probe, Some(name.clone()), &dataplane).await {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_values_parse_and_refuse_clearly() {
        let ok = named_values(
            "model-max-retries",
            &["llama=2".to_owned(), "qwen=0".to_owned()],
            |v| v.parse::<u32>().map_err(|e| e.to_string()),
        )
        .expect("valid");
        assert_eq!(ok.get("llama"), Some(&2));
        assert_eq!(ok.get("qwen"), Some(&0));
        let parse = |v: &str| v.parse::<u32>().map_err(|e| e.to_string());
        for bad in ["llama", "=2", "llama=x"] {
            let err =
                named_values("model-max-retries", &[bad.to_owned()], parse).expect_err("refused");
            assert!(err.contains("--model-max-retries"), "{err}");
        }
    }
}
