//! Learning a model from its workers: info, tokenizer, vision config.
//!
//! Why it exists: a single-model gateway does this once at start-up and an
//! IGW gateway for each model when its first worker is ready, so the steps
//! live here, apart from both: ask the worker for its model info, load the
//! tokenizer (a local directory first, then the worker's advertised path,
//! then its GetTokenizer archive), and set up vision preprocessing when the
//! tokenizer's source has it (`preprocessor_config.json`). An operator's
//! `--chat-template` replaces the template the tokenizer came with, for
//! every model discovered, so it is applied here and nowhere else. What a worker supplies (the advertised path, the
//! archive) is read under bounds, and all tokenizer loading runs on the
//! blocking pool: an IGW gateway discovers while it serves.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use smg_dataplane::runtime::DataPlane;

use crate::config::{ModelSource, ParserSettings};
use crate::engine::{Engine, ModelInfo};
use crate::lanes::TensorLanes;
use crate::media::MediaConfig;
use crate::offload::Offload;
use crate::pipeline::media::MediaPlanner;
use crate::pipeline::parsing::ModelParsers;
use crate::pipeline::prepare::ServedModel;
use crate::pipeline::stages::RolePolicies;
use crate::tokenizer::Tokenizer;
use crate::workers::{Worker, WorkerRole, WorkerSet, spawn_load_polling};

/// How long a worker's discovery RPC may take.
pub(crate) const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// The context length assumed when neither the worker nor the model
/// directory states one.
const DEFAULT_CONTEXT_LENGTH: u32 = 32_768;

/// Runs one discovery RPC of the worker at `url` under [`DISCOVERY_TIMEOUT`].
pub(crate) async fn discover<T>(
    what: &str,
    url: &str,
    call: impl std::future::Future<Output = crate::error::Result<T>>,
) -> anyhow::Result<T> {
    tokio::time::timeout(DISCOVERY_TIMEOUT, call)
        .await
        .map_err(|_| anyhow::anyhow!("{what} of {url} timed out"))?
        .map_err(|err| anyhow::anyhow!("{what} of {url} failed: {err}"))
}

/// Runs tokenizer loading (file I/O, parsing tens of MiB of JSON) on the
/// blocking pool, off the request threads.
async fn off_runtime<T: Send + 'static>(
    load: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(load)
        .await
        .context("the tokenizer loader failed")?
}

/// The local tokenizer directory, else the workers' advertised local path,
/// else their GetTokenizer archive.
///
/// The advertised path comes from a worker, so it is read as one: regular
/// files only, no symlinks, size-capped ([`Tokenizer::from_worker_dir`]);
/// when that fails the archive is asked for instead. The archive is capped
/// in download size, entry count and unpacked size.
async fn load_tokenizer(
    source: &ModelSource,
    info: Option<&ModelInfo>,
    client: &Arc<dyn Engine>,
) -> anyhow::Result<Tokenizer> {
    if let Some(dir) = source.tokenizer_dir() {
        let dir = dir.to_owned();
        return off_runtime(move || {
            Tokenizer::from_model_dir(&dir)
                .with_context(|| format!("cannot load the tokenizer from {}", dir.display()))
        })
        .await;
    }
    if let Some(dir) = info
        .map(|i| PathBuf::from(&i.tokenizer_path))
        .filter(|p| !p.as_os_str().is_empty())
    {
        let advertised = off_runtime(move || {
            if !dir.is_dir() {
                return Ok(None);
            }
            Tokenizer::from_worker_dir(&dir)
                .map(Some)
                .with_context(|| format!("the advertised tokenizer path {}", dir.display()))
        })
        .await;
        match advertised {
            Ok(Some(tokenizer)) => return Ok(tokenizer),
            Ok(None) => {}
            Err(err) => tracing::warn!(
                worker = client.url(),
                "{err:#}; asking the worker for its tokenizer archive instead"
            ),
        }
    }
    let archive = discover("GetTokenizer", client.url(), client.tokenizer_archive()).await?;
    off_runtime(move || {
        Tokenizer::from_archive(&archive).context("the worker's tokenizer archive is unusable")
    })
    .await
}

fn model_dir_context_length(dir: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let config: serde_json::Value = serde_json::from_str(&text).ok()?;
    config
        .get("max_position_embeddings")?
        .as_u64()
        .and_then(|v| u32::try_from(v).ok())
}

/// What serving a model takes besides its workers.
#[derive(Debug)]
pub struct ModelContext {
    pub tokenizer: Tokenizer,
    pub model: ServedModel,
    pub media: Option<MediaPlanner>,
}

/// What discovering a model needs from the gateway.
#[derive(Debug, Clone)]
pub struct DiscoveryEnv {
    pub source: ModelSource,
    pub parsers: ParserSettings,
    pub media: MediaConfig,
    /// Where the model's images are preprocessed...
    pub dataplane: DataPlane,
    /// ...and the lanes their tensors leave by.
    pub lanes: Arc<TensorLanes>,
    /// Where large prompts are rendered and tokenized (one gate for every
    /// model).
    pub offload: Offload,
}

impl DiscoveryEnv {
    /// Discovers a model from one of its generating workers: its info, its
    /// tokenizer and its vision preprocessing. `name` overrides the served
    /// name.
    pub async fn model_context(
        &self,
        probe: &Worker,
        name: Option<String>,
    ) -> anyhow::Result<ModelContext> {
        let source = &self.source;
        let info = match discover("GetModelInfo", probe.url(), probe.client().model_info()).await {
            Ok(info) => Some(info),
            Err(err) if source.is_local() => {
                tracing::warn!(%err, "no model info from the workers; using the model directory");
                None
            }
            Err(err) => return Err(err),
        };
        let mut tokenizer = load_tokenizer(source, info.as_ref(), probe.client()).await?;
        if let Some(template) = &source.chat_template {
            tokenizer = tokenizer
                .with_chat_template(&template.source)
                .with_context(|| {
                    format!(
                        "--chat-template {} does not compile",
                        template.path.display()
                    )
                })?;
        }
        let tokenizer = tokenizer.with_template_budget(source.template_budget);
        let name = name
            .or_else(|| {
                info.as_ref()
                    .map(|i| i.served_model_name.clone())
                    .filter(|n| !n.is_empty())
            })
            .or_else(|| {
                source
                    .model_path
                    .as_ref()
                    .and_then(|p| p.file_name())
                    .map(|n| n.to_string_lossy().into_owned())
            })
            .unwrap_or_else(|| "default".to_owned());
        let max_context_length = info
            .as_ref()
            .map(|i| i.max_context_length)
            .filter(|&n| n > 0)
            .or_else(|| {
                source
                    .model_path
                    .as_deref()
                    .and_then(model_dir_context_length)
            })
            .unwrap_or(DEFAULT_CONTEXT_LENGTH);
        let parsers = ModelParsers::resolve(&self.parsers, &name, tokenizer.chat_template_source());
        tracing::info!(
            model = %name,
            tool_call_parser = parsers.tool.as_deref().unwrap_or("none"),
            reasoning_parser = parsers.reasoning.as_deref().unwrap_or("none"),
            "output parsers"
        );
        let model = ServedModel {
            name,
            max_context_length,
            vocab_size: info
                .as_ref()
                .map(|i| i.vocab_size)
                .filter(|&n| n > 0)
                .unwrap_or(tokenizer.vocab_size() as u32),
            parsers,
        };

        // The vision files come with the tokenizer's, from wherever it was
        // loaded: the model directory, or the workers' directory or archive.
        let media = MediaPlanner::for_model(&tokenizer, self.media.clone(), &self.dataplane)
            .map_err(|err| anyhow::anyhow!("{err}"))?
            .map(|planner| planner.with_lanes(Arc::clone(&self.lanes)));
        if media.is_none() {
            tracing::info!(
                "no vision preprocessing for this model (no preprocessor_config.json with its \
                 tokenizer): requests with images answer 501"
            );
        }
        Ok(ModelContext {
            tokenizer,
            model,
            media,
        })
    }
}

/// Polls GetLoads every `interval` for each role whose policy reads engine
/// load, and for every role when the workers' in-flight limits follow what
/// their engines report (`engine_limits`: no `--worker-max-in-flight`).
pub(crate) fn start_load_polling(
    workers: &WorkerSet,
    policies: &RolePolicies,
    interval: Duration,
    engine_limits: bool,
) {
    for role in [
        WorkerRole::Regular,
        WorkerRole::Prefill,
        WorkerRole::Decode,
        WorkerRole::Encode,
    ] {
        let needs_loads = policies.of(role).needs_loads();
        if needs_loads || engine_limits {
            spawn_load_polling(workers.clone(), role, interval, needs_loads);
        }
    }
}
