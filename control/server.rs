//! Start-up: from `smg launch` flags to a serving gateway. Splits the cores
//! between tokio and the data plane and starts the data plane, builds the
//! workers and detects their runtime, loads the tokenizer, assembles the
//! router for the chosen mode (or the model table with `--enable-igw`),
//! starts health probes and the metrics listener, and serves the HTTP API
//! until SIGTERM or Ctrl-C; then stops the data plane.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use smg_dataplane::runtime::{CorePlan, DataPlane, DataPlaneConfig, confine_current_thread};
use tokio::net::TcpListener;

use crate::api::{self, AppState, Fleet};
use crate::cli::{LaunchArgs, RuntimeArg, worker_specs};
use crate::engine::{EngineClient, ModelInfo, Runtime};
use crate::media::MediaConfig;
use crate::mode::Mode;
use crate::models::{ModelTable, named_values};
use crate::pipeline::media::MediaPlanner;
use crate::pipeline::prepare::ServedModel;
use crate::pipeline::stages::RolePolicies;
use crate::policies::{CacheAwareConfig, PolicyKind, PolicyTunables};
use crate::router::{RetryConfig, Router, RouterParts};
use crate::tokenizer::Tokenizer;
use crate::workers::{
    BreakerConfig, HealthConfig, Lifecycle, Worker, WorkerRegistry, WorkerRole, WorkerSet,
    advertised_bootstrap_port, spawn_health_checks, spawn_load_polling,
};

/// How long start-up waits for a worker's discovery RPCs.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// A worker named on the command line: URL, role, bootstrap port.
type FlaggedWorker = (String, WorkerRole, Option<u16>);

/// The workers the flags describe, and the mode.
fn fleet_from_flags(args: &LaunchArgs) -> anyhow::Result<(Mode, Vec<FlaggedWorker>)> {
    let to_anyhow = |e: String| anyhow::anyhow!(e);
    let mut fleet = Vec::new();
    let mode = if args.epd_disaggregation {
        for spec in worker_specs("encode", &args.encode).map_err(to_anyhow)? {
            fleet.push((spec.url, WorkerRole::Encode, spec.bootstrap_port));
        }
        Mode::EncodePrefillDecode
    } else if args.pd_disaggregation {
        Mode::PrefillDecode
    } else {
        Mode::Regular
    };
    if mode == Mode::Regular {
        if !args.prefill.is_empty() || !args.decode.is_empty() || !args.encode.is_empty() {
            bail!("--prefill/--decode/--encode need --pd-disaggregation or --epd-disaggregation");
        }
        fleet.extend(
            args.worker_urls
                .iter()
                .map(|url| (url.clone(), WorkerRole::Regular, None)),
        );
    } else {
        for spec in worker_specs("prefill", &args.prefill).map_err(to_anyhow)? {
            fleet.push((spec.url, WorkerRole::Prefill, spec.bootstrap_port));
        }
        fleet.extend(
            args.decode
                .iter()
                .map(|url| (url.clone(), WorkerRole::Decode, None)),
        );
    }
    for role in mode.spec().required_roles {
        if !fleet.iter().any(|(_, r, _)| r == role) {
            bail!("{mode:?} mode needs at least one {role} worker");
        }
    }
    Ok((mode, fleet))
}

async fn discover<T>(
    what: &str,
    url: &str,
    call: impl std::future::Future<Output = crate::error::Result<T>>,
) -> anyhow::Result<T> {
    tokio::time::timeout(DISCOVERY_TIMEOUT, call)
        .await
        .map_err(|_| anyhow::anyhow!("{what} of {url} timed out"))?
        .map_err(|err| anyhow::anyhow!("{what} of {url} failed: {err}"))
}

fn load_tokenizer_dir(dir: &Path) -> anyhow::Result<Tokenizer> {
    Tokenizer::from_model_dir(dir)
        .with_context(|| format!("cannot load the tokenizer from {}", dir.display()))
}

/// `--tokenizer-path`, else `--model-path`, else the workers' advertised
/// local path, else their GetTokenizer archive.
async fn load_tokenizer(
    args: &LaunchArgs,
    info: Option<&ModelInfo>,
    client: &EngineClient,
) -> anyhow::Result<Tokenizer> {
    if let Some(dir) = args.tokenizer_path.as_ref().or(args.model_path.as_ref()) {
        return load_tokenizer_dir(dir);
    }
    if let Some(dir) = info
        .map(|i| PathBuf::from(&i.tokenizer_path))
        .filter(|p| p.is_dir())
    {
        return load_tokenizer_dir(&dir);
    }
    let archive = discover("GetTokenizer", client.url(), client.tokenizer_archive()).await?;
    Tokenizer::from_archive(&archive).context("the worker's tokenizer archive is unusable")
}

fn model_dir_context_length(dir: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let config: serde_json::Value = serde_json::from_str(&text).ok()?;
    config
        .get("max_position_embeddings")?
        .as_u64()
        .and_then(|v| u32::try_from(v).ok())
}

fn media_config(args: &LaunchArgs) -> anyhow::Result<MediaConfig> {
    let allow_private_hosts = args
        .media_allow_private_host
        .iter()
        .map(|text| {
            text.parse()
                .map_err(|err| anyhow::anyhow!("--media-allow-private-host {text}: {err}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(MediaConfig {
        max_bytes: args.media_max_bytes,
        max_images_per_request: args.max_images_per_request,
        fetch_timeout: Duration::from_secs(args.media_fetch_timeout_secs.max(1)),
        allowed_file_dirs: args.allowed_local_media_path.clone(),
        allow_private_hosts,
        ..MediaConfig::default()
    })
}

/// The tokio runtime for the control plane: confined to the cores the data
/// plane does not own, one worker thread per core, when `cores` splits them.
pub fn control_runtime(cores: &CorePlan) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if cores.exclusive {
        let control = cores.control.clone();
        builder
            .worker_threads(control.len())
            .on_thread_start(move || {
                confine_current_thread(&control);
            });
    }
    builder.build()
}

/// The data plane `args` and the core split describe.
pub fn dataplane_config(args: &LaunchArgs, cores: &CorePlan) -> DataPlaneConfig {
    DataPlaneConfig {
        ring_capacity: args.dataplane_ring_capacity.max(1),
        submit_wait: Duration::from_millis(args.dataplane_submit_timeout_ms),
        io: args.dataplane_io.backend(),
        ..DataPlaneConfig::for_plan(cores)
    }
}

/// The circuit breaker every worker gets (`--cb-*`).
pub fn breaker_config(args: &LaunchArgs) -> BreakerConfig {
    BreakerConfig {
        enabled: !args.disable_circuit_breaker,
        failure_threshold: args.cb_failure_threshold.max(1),
        success_threshold: args.cb_success_threshold.max(1),
        open_for: Duration::from_secs(args.cb_timeout_duration_secs),
        window: Duration::from_secs(args.cb_window_duration_secs.max(1)),
    }
}

/// How workers registered at run time are watched.
pub fn lifecycle(args: &LaunchArgs) -> Lifecycle {
    Lifecycle {
        health: (!args.disable_health_check).then(|| health_config(args)),
        breaker: breaker_config(args),
        probe_timeout: Duration::from_secs(args.health_check_timeout_secs.max(1)),
        dp_aware: args.dp_aware,
    }
}

/// Health probing (`--health-check-*`).
pub fn health_config(args: &LaunchArgs) -> HealthConfig {
    HealthConfig::new(
        Duration::from_secs(args.health_check_interval_secs.max(1)),
        Duration::from_secs(args.health_check_timeout_secs.max(1)),
        args.health_failure_threshold,
        args.health_success_threshold,
    )
}

/// The policy of each role (`--policy`, `--prefill-policy`, ...).
pub fn role_policies(args: &LaunchArgs) -> RolePolicies {
    role_policies_with(args, None)
}

/// The policy of each role, with `model_policy` (a per-model override)
/// replacing `--policy` and the prefill/decode policies.
pub fn role_policies_with(args: &LaunchArgs, model_policy: Option<PolicyKind>) -> RolePolicies {
    let tunables = PolicyTunables {
        cache_aware: CacheAwareConfig {
            match_threshold: args.cache_threshold,
            balance_abs_threshold: args.balance_abs_threshold,
            balance_rel_threshold: args.balance_rel_threshold,
            max_pages: args.max_tree_size.max(64),
            ..CacheAwareConfig::default()
        },
        ..PolicyTunables::default()
    };
    let pick = |role_flag: Option<PolicyKind>| {
        model_policy
            .or(role_flag)
            .unwrap_or(args.policy)
            .build_with(&tunables)
    };
    RolePolicies {
        regular: pick(None),
        prefill: pick(args.prefill_policy),
        decode: pick(args.decode_policy),
        encode: args.encode_policy.build_with(&tunables),
    }
}

/// Polls GetLoads for each role whose policy reads engine load.
pub fn start_load_polling(workers: &WorkerSet, policies: &RolePolicies, args: &LaunchArgs) {
    let interval = Duration::from_secs(args.load_check_interval_secs.max(1));
    for role in [
        WorkerRole::Regular,
        WorkerRole::Prefill,
        WorkerRole::Decode,
        WorkerRole::Encode,
    ] {
        if policies.of(role).needs_loads() {
            spawn_load_polling(workers.clone(), role, interval);
        }
    }
}

/// What serving a model takes besides its workers.
#[derive(Debug)]
pub struct ModelContext {
    pub tokenizer: Tokenizer,
    pub model: ServedModel,
    pub media: Option<MediaPlanner>,
}

/// Discovers a model from one of its generating workers: its info, its
/// tokenizer (flags first, then what the worker offers) and its vision
/// preprocessing, whose images run on `dataplane`. `name` overrides the
/// served name.
pub async fn model_context(
    args: &LaunchArgs,
    probe: &Worker,
    name: Option<String>,
    dataplane: &DataPlane,
) -> anyhow::Result<ModelContext> {
    let info = match discover("GetModelInfo", probe.url(), probe.client().model_info()).await {
        Ok(info) => Some(info),
        Err(err) if args.model_path.is_some() || args.tokenizer_path.is_some() => {
            tracing::warn!(%err, "no model info from the workers; using the model directory");
            None
        }
        Err(err) => return Err(err),
    };
    let tokenizer = load_tokenizer(args, info.as_ref(), probe.client()).await?;
    let name = name
        .or_else(|| {
            info.as_ref()
                .map(|i| i.served_model_name.clone())
                .filter(|n| !n.is_empty())
        })
        .or_else(|| {
            args.model_path
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
            args.model_path
                .as_deref()
                .and_then(model_dir_context_length)
        })
        .unwrap_or(32_768);
    let model = ServedModel {
        name,
        max_context_length,
        vocab_size: info
            .as_ref()
            .map(|i| i.vocab_size)
            .filter(|&n| n > 0)
            .unwrap_or(tokenizer.vocab_size() as u32),
    };

    let media = match args.tokenizer_path.as_ref().or(args.model_path.as_ref()) {
        Some(dir) => MediaPlanner::for_model(dir, &tokenizer, media_config(args)?, dataplane)
            .map_err(|err| anyhow::anyhow!("{err}"))?
            .map(|planner| planner.with_lanes(crate::lanes::installed())),
        None => None,
    };
    if media.is_none() {
        tracing::info!("no vision preprocessing for this model: requests with images answer 501");
    }
    Ok(ModelContext {
        tokenizer,
        model,
        media,
    })
}

/// Retries (`--retry-*`, `--disable-retries`).
pub fn retry_config(args: &LaunchArgs) -> RetryConfig {
    RetryConfig {
        max_retries: args.retry_max_retries,
        initial_backoff: Duration::from_millis(args.retry_initial_backoff_ms),
        max_backoff: Duration::from_millis(args.retry_max_backoff_ms),
        multiplier: args.retry_backoff_multiplier,
        jitter_factor: args.retry_jitter_factor,
        disabled: args.disable_retries,
    }
}

/// Builds the router that `args` describe; images run on `dataplane`.
pub async fn build_router(args: &LaunchArgs, dataplane: &DataPlane) -> anyhow::Result<Router> {
    let (mode, fleet) = fleet_from_flags(args)?;
    let first_url = &fleet[0].0;
    let runtime = match args.runtime {
        Some(RuntimeArg::Tokenspeed) => Runtime::TokenSpeed,
        Some(RuntimeArg::Sglang) => Runtime::Sglang,
        None => discover(
            "runtime detection",
            first_url,
            EngineClient::detect(first_url),
        )
        .await?
        .runtime(),
    };
    if mode == Mode::EncodePrefillDecode && !runtime.has_encoder() {
        bail!(
            "EPD needs encode workers, but {} has no encoder protocol: use TokenSpeed workers",
            runtime.name()
        );
    }

    let workers = WorkerSet::default();
    for (url, role, flagged_port) in &fleet {
        let client =
            EngineClient::new(url, runtime).with_context(|| format!("bad worker URL {url}"))?;
        let needs_bootstrap = matches!(role, WorkerRole::Prefill | WorkerRole::Encode);
        let port = match (flagged_port, needs_bootstrap) {
            (Some(port), _) => Some(*port),
            (None, true) => {
                let info = discover("GetServerInfo", url, client.server_info()).await?;
                Some(advertised_bootstrap_port(&info).with_context(|| {
                    format!("{role} worker {url} needs a bootstrap port: give it after the URL")
                })?)
            }
            (None, false) => None,
        };
        let ranks = if args.dp_aware {
            let load = discover("GetLoads", url, client.loads()).await?;
            u32::try_from(load.dp_rank_count).unwrap_or(0).max(1)
        } else {
            1
        };
        for rank in 0..ranks {
            let worker = Worker::new(client.clone(), *role, port)
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .with_breaker(breaker_config(args));
            workers.add(if args.dp_aware {
                worker.with_dp_rank(rank)
            } else {
                worker
            });
        }
    }

    crate::lanes::installed()
        .learn_namespaces(&workers.all())
        .await;
    let probe = workers
        .all()
        .into_iter()
        .find(|w| w.role() != WorkerRole::Encode)
        .context("no generating worker")?;
    let ModelContext {
        tokenizer,
        model,
        media,
    } = model_context(args, &probe, args.served_model_name.clone(), dataplane).await?;
    let policies = role_policies(args);
    if !args.disable_health_check {
        spawn_health_checks(workers.all(), health_config(args));
    }
    start_load_polling(&workers, &policies, args);
    Ok(Router::new(RouterParts {
        mode,
        runtime,
        workers,
        policies,
        tokenizer,
        model,
        retry: retry_config(args),
        request_timeout: Duration::from_secs(args.request_timeout_secs.max(1)),
        media,
    }))
}

/// Runs the gateway until a shutdown signal. `cores` is the split made at
/// start-up, before anything was pinned (see [`control_runtime`]).
pub async fn launch(args: LaunchArgs, cores: CorePlan) -> anyhow::Result<()> {
    let metrics = crate::metrics::install().map_err(|e| anyhow::anyhow!("metrics: {e}"))?;
    tracing::info!(
        dataplane = ?cores.dataplane.iter().map(|c| c.id).collect::<Vec<_>>(),
        control = ?cores.control.iter().map(|c| c.id).collect::<Vec<_>>(),
        exclusive = cores.exclusive,
        "core split"
    );
    let dataplane = DataPlane::start(dataplane_config(&args, &cores))
        .map_err(|err| anyhow::anyhow!("data plane: {err}"))?;
    let lane_settings = crate::lanes::settings_from(&args).map_err(anyhow::Error::msg)?;
    let lanes = crate::lanes::TensorLanes::start(
        &lane_settings,
        dataplane.threads(),
        crate::lanes::open_rdma(&lane_settings),
    );
    crate::lanes::install(&lanes);
    let served = serve_with(args, &dataplane, metrics).await;
    // The shm pools go (their files with them) once no request holds a slot.
    drop(lanes);
    // In-flight images finish or fail; the cores' threads join.
    let stopping = dataplane.clone();
    drop(dataplane);
    let _ = tokio::task::spawn_blocking(move || stopping.shutdown()).await;
    served
}

async fn serve_with(
    args: LaunchArgs,
    dataplane: &DataPlane,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
) -> anyhow::Result<()> {
    let aliases = named_values("model-alias", &args.model_alias, |model| {
        Ok(model.to_owned())
    })
    .map_err(anyhow::Error::msg)?;
    let (fleet, label) = if args.enable_igw {
        if !args.worker_urls.is_empty()
            || !args.prefill.is_empty()
            || !args.decode.is_empty()
            || !args.encode.is_empty()
        {
            bail!("--enable-igw starts with no workers: register them with POST /workers");
        }
        let args = Arc::new(args.clone());
        (
            Fleet::Models(Arc::new(ModelTable::new(args, dataplane.clone())?)),
            "igw",
        )
    } else {
        let router = build_router(&args, dataplane).await?;
        let mode = router.mode();
        let registry = WorkerRegistry::new(
            router.model().name.clone(),
            router.runtime(),
            mode.spec().required_roles.to_vec(),
            router.workers().clone(),
            lifecycle(&args),
        );
        let fleet = Fleet::Single {
            router: Arc::new(router),
            registry: Arc::new(registry),
        };
        (fleet, mode.metrics_label())
    };
    let state = Arc::new(AppState::of(fleet).with_aliases(aliases));

    let http = TcpListener::bind((args.host.as_str(), args.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
    let metrics_host = args
        .prometheus_host
        .clone()
        .unwrap_or_else(|| args.host.clone());
    let metrics_listener = TcpListener::bind((metrics_host.as_str(), args.prometheus_port))
        .await
        .with_context(|| {
            format!(
                "cannot listen for metrics on {metrics_host}:{}",
                args.prometheus_port
            )
        })?;
    let http_addr: SocketAddr = http.local_addr()?;
    let metrics_addr: SocketAddr = metrics_listener.local_addr()?;

    tokio::spawn(api::serve_metrics(metrics_listener, metrics));
    println!("smg ready http={http_addr} metrics={metrics_addr} mode={label}");
    tracing::info!(%http_addr, %metrics_addr, mode = label, "smg serving");
    api::serve(http, state, shutdown_signal()).await?;
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    tracing::info!("shutting down");
}
