//! Start-up: from a [`GatewayConfig`] to a serving gateway. Splits the
//! cores between tokio and the data plane and starts the data plane and the
//! tensor lanes, opens the listeners (the HTTP API, the metrics and probes,
//! and, without control-plane keys, the admin routes) and serves at once:
//! an IGW fleet's model table from the start, a static fleet's router as
//! soon as `startup` has reached one worker of each role (until then
//! `/readiness` answers 503). It prints `smg listening ...` when the
//! listeners are open and `smg ready ...` when requests can be served, and
//! serves until SIGTERM or Ctrl-C. Then it shuts down in the phases
//! `shutdown` describes, stops the data plane and releases the tensor lanes
//! (removing the gateway's `/dev/shm` names), and returns: exit code 0.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use smg_dataplane::runtime::{CorePlan, DataPlane, confine_current_thread};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::api::{self, AppState, Fleet};
use crate::config::{FleetConfig, GatewayConfig, HistoryConfig};
use crate::discovery::DiscoveryEnv;
use crate::lanes::{TensorLanes, open_rdma};
use crate::models::{ModelTable, ModelTableConfig};
use crate::shutdown::Shutdown;
use crate::startup::{StartupStatus, bring_up};
use crate::tls::{ReloadableCert, load_worker_tls, reload_on_sighup};
use crate::workers::WorkerRegistry;

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

/// Runs the gateway until a shutdown signal. `cores` is the split made at
/// start-up, before anything was pinned (see [`control_runtime`]).
pub async fn launch(config: GatewayConfig, cores: CorePlan) -> anyhow::Result<()> {
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    let metrics = crate::metrics::install().map_err(|e| anyhow::anyhow!("metrics: {e}"))?;
    tracing::info!(
        dataplane = ?cores.dataplane.iter().map(|c| c.id).collect::<Vec<_>>(),
        control = ?cores.control.iter().map(|c| c.id).collect::<Vec<_>>(),
        exclusive = cores.exclusive,
        "core split"
    );
    let dataplane = DataPlane::start(config.dataplane.for_plan(&cores))
        .map_err(|err| anyhow::anyhow!("data plane: {err}"))?;
    let lanes = TensorLanes::start(&config.lanes, dataplane.threads(), open_rdma(&config.lanes));
    let env = DiscoveryEnv {
        source: config.model.clone(),
        parsers: config.parsers.clone(),
        media: config.media.clone(),
        dataplane: dataplane.clone(),
        lanes: Arc::clone(&lanes),
        offload: crate::offload::Offload::for_host_with(&crate::offload::WorkThreads {
            nice: config.cpu_work_nice,
            // Off the data plane's cores, as tokio's own threads are.
            cores: if cores.exclusive {
                cores.control.clone()
            } else {
                Vec::new()
            },
        }),
    };
    let served = serve_with(config, env, metrics).await;
    // In-flight images finish or fail; the cores' threads join.
    let stopping = dataplane.clone();
    drop(dataplane);
    let _ = tokio::task::spawn_blocking(move || stopping.shutdown()).await;
    let served_to_the_end = served.is_ok();
    if served_to_the_end {
        tracing::info!("shutdown: data plane stopped");
    }
    // The shm pools remove their names (slots, and names workers left
    // behind) as the last holder drops them.
    match Arc::try_unwrap(lanes) {
        Ok(lanes) => {
            drop(lanes);
            if served_to_the_end {
                tracing::info!("shutdown: tensor lanes released");
            }
        }
        Err(lanes) => tracing::warn!(
            holders = Arc::strong_count(&lanes) - 1,
            "the tensor lanes are still held; their shm names go when the process ends"
        ),
    }
    served
}

async fn serve_with(
    config: GatewayConfig,
    env: DiscoveryEnv,
    metrics: crate::metrics::MetricsHandle,
) -> anyhow::Result<()> {
    // Certificates first: a bad file fails start-up before any discovery.
    let tls = match &config.listen.tls {
        Some(files) => {
            let cert = ReloadableCert::load(files)
                .context("HTTPS certificate (--tls-cert-path, --tls-key-path)")?;
            let acceptor = cert.acceptor()?;
            reload_on_sighup(cert).context("cannot watch SIGHUP for certificate reloads")?;
            Some(acceptor)
        }
        None => None,
    };
    // A missing model directory fails now, not once the workers answer.
    if let Some(dir) = config.model.tokenizer_dir()
        && !dir.is_dir()
    {
        let flag = if config.model.tokenizer_path.is_some() {
            "--tokenizer-path"
        } else {
            "--model-path"
        };
        bail!(
            "{flag} {}: no such local directory (smg reads a model directory; it does not \
             download from the Hugging Face Hub: fetch it first, e.g. `huggingface-cli download \
             MODEL --local-dir DIR`, and give DIR; or leave it out to load the tokenizer from \
             the workers)",
            dir.display()
        );
    }
    let worker_tls = load_worker_tls(&config.worker_tls)
        .context("worker TLS (--ca-cert-path, --client-cert-path, --client-key-path)")?;
    // The history store before any listener: a database that cannot be
    // reached (or migrated) fails start-up, not the first response.
    let history = smg_history::open(&config.history).await.map_err(|err| {
        let flags = match &config.history {
            HistoryConfig::Sqlite { path } => {
                format!("sqlite, --history-path {}", path.display())
            }
            HistoryConfig::Postgres { .. } => "postgres, --history-url".to_owned(),
            other => other.backend().to_owned(),
        };
        anyhow::anyhow!("{err} ({flags})")
    })?;
    tracing::info!(backend = history.backend(), "history store open");
    let listen = &config.listen;
    let front = &config.front;
    // The public listener's backlog holds a burst of up to
    // --max-connections while the accept loop catches up.
    let backlog = u32::try_from(front.limits.max_connections).unwrap_or(u32::MAX);
    let http = api::bind(listen.host.as_str(), listen.port, backlog)
        .await
        .with_context(|| format!("cannot listen on {}:{}", listen.host, listen.port))?;
    // The history's owner name needs the bound port (HOSTNAME:PORT); its
    // previous life's orphans are ended before anything is served.
    let history = crate::history::History::new(history)
        .with_instance(&history_instance(&config, http.local_addr()?.port()));
    let orphans = history
        .start_lease()
        .await
        .map_err(|err| anyhow::anyhow!("history store: {}", err.message))?;
    if orphans > 0 {
        tracing::warn!(
            orphans,
            instance = history.instance(),
            "ended background responses a previous run left unfinished"
        );
    }
    let shutdown = Shutdown::new();
    let tasks = shutdown.tasks();
    let (state, label, static_fleet) = match &config.fleet {
        FleetConfig::Igw => {
            let table = ModelTable::new(ModelTableConfig {
                routing: config.routing.clone(),
                lifecycle: config.lifecycle,
                default_runtime: config.runtime,
                env: env.clone(),
                tasks: tasks.clone(),
                worker_tls: worker_tls.clone(),
            });
            (AppState::of(Fleet::Models(Arc::new(table))), "igw", None)
        }
        FleetConfig::Static { mode, workers } => {
            let status = Arc::new(StartupStatus::new(*mode, workers));
            (
                AppState::starting(Some(Arc::clone(&status))),
                mode.metrics_label(),
                Some((*mode, workers.as_slice(), status)),
            )
        }
    };
    let state = Arc::new(
        state
            .with_aliases(config.routing.aliases.clone())
            .with_admission(config.admission.clone())
            .with_history(history)
            .with_mcp(
                crate::mcp::McpClients::new(config.mcp.clone())
                    .map_err(|err| anyhow::anyhow!("MCP client: {}", err.message))?,
            )
            .with_shutdown(&shutdown)
            .with_offload(env.offload.clone()),
    );

    // Cancels another replica records in the store for a response running
    // here reach it through the registry of running responses.
    let running = Arc::downgrade(&state);
    state.history.keep_lease(Arc::new(move |id: &str| {
        running
            .upgrade()
            .is_some_and(|state| state.responses.cancel(id))
    }));

    let metrics_listener = TcpListener::bind((listen.metrics_host.as_str(), listen.metrics_port))
        .await
        .with_context(|| {
            format!(
                "cannot listen for metrics on {}:{}",
                listen.metrics_host, listen.metrics_port
            )
        })?;
    let probe_listener = match listen.probe_port {
        Some(port) => Some(
            TcpListener::bind((listen.metrics_host.as_str(), port))
                .await
                .with_context(|| {
                    format!(
                        "cannot listen for probes on {}:{port} (--health-check-port)",
                        listen.metrics_host
                    )
                })?,
        ),
        None => None,
    };
    // Without control-plane keys, admin routes get a listener of their own.
    let admin = if api::admin_on_public(front) {
        None
    } else {
        let listener = TcpListener::bind((listen.admin_host.as_str(), listen.admin_port))
            .await
            .with_context(|| {
                format!(
                    "cannot listen for admin routes on {}:{} (--admin-host/--admin-port; \
                     or configure --control-plane-api-keys to serve them on --port)",
                    listen.admin_host, listen.admin_port
                )
            })?;
        Some(listener)
    };
    let http_addr: SocketAddr = http.local_addr()?;
    let metrics_addr: SocketAddr = metrics_listener.local_addr()?;
    let admin_addr: SocketAddr = match &admin {
        Some(listener) => listener.local_addr()?,
        None => http_addr,
    };
    warn_if_exposed(&config, http_addr, admin_addr);

    // Installed before the ready line: from then on a signal drains.
    let signals = crate::shutdown::os_signals();
    let settings = |name| api::ListenerSettings {
        name,
        limits: front.limits,
        tls: tls.clone(),
    };
    let admin_served = admin.map(|listener| {
        tokio::spawn(api::serve(
            listener,
            api::admin_app(Arc::clone(&state), front),
            settings("admin"),
            shutdown.listener(),
        ))
    });
    let metrics_stop = CancellationToken::new();
    if let Some(listener) = probe_listener {
        tokio::spawn(api::serve_metrics(
            listener,
            metrics.clone(),
            Arc::clone(&state),
            metrics_stop.clone(),
        ));
    }
    let metrics_served = tokio::spawn(api::serve_metrics(
        metrics_listener,
        metrics,
        Arc::clone(&state),
        metrics_stop.clone(),
    ));
    let public = api::serve(
        http,
        api::app(Arc::clone(&state), front),
        settings("public"),
        shutdown.listener(),
    );
    println!("smg listening http={http_addr} metrics={metrics_addr} admin={admin_addr}");
    let ready_line = || {
        println!(
            "smg ready http={http_addr} metrics={metrics_addr} admin={admin_addr} mode={label}"
        );
        tracing::info!(%http_addr, %metrics_addr, %admin_addr, mode = label, https = tls.is_some(), "smg serving");
    };
    let serving =
        async { tokio::join!(public, shutdown.run(signals, config.shutdown.grace_period)) };
    tokio::pin!(serving);
    let (served, ending) = match static_fleet {
        None => {
            drop(env);
            ready_line();
            serving.await
        }
        Some((mode, workers, status)) => {
            // Serve (readiness 503) while the workers are reached.
            let up = async {
                let router =
                    bring_up(&config, mode, workers, &env, tasks, &worker_tls, status).await?;
                let registry = WorkerRegistry::new(
                    router.model().name.clone(),
                    router.runtime(),
                    mode.spec().required_roles.to_vec(),
                    router.workers().clone(),
                    config.lifecycle,
                    Arc::clone(&env.lanes) as _,
                )
                .with_worker_tls(worker_tls.clone());
                let registry = Arc::new(registry);
                registry.spawn_unhealthy_removal();
                state.serve(Fleet::Single {
                    router: Arc::new(router),
                    registry,
                });
                anyhow::Ok(())
            };
            tokio::select! {
                // A signal during start-up: stop without waiting for it.
                ended = &mut serving => ended,
                up = up => {
                    up?;
                    drop(env);
                    ready_line();
                    serving.await
                }
            }
        }
    };
    served?;
    if let Some(admin) = admin_served {
        admin.await??;
    }
    // The probes go last: until here they answered 503.
    metrics_stop.cancel();
    if tokio::time::timeout(METRICS_STOP_WAIT, metrics_served)
        .await
        .is_err()
    {
        tracing::warn!("shutdown: the metrics listener did not close in time");
    }
    drop(state);
    tracing::info!(
        cut = ending.cut,
        immediate = ending.immediate,
        "shutdown: every listener closed"
    );
    Ok(())
}

/// How long the metrics listener's last scrapes may take at shutdown.
const METRICS_STOP_WAIT: Duration = Duration::from_secs(2);

/// This gateway's name in the history store: `--history-instance`, or
/// `HOSTNAME:PORT` (two live processes cannot listen on one port of one
/// host, so live replicas get distinct names, and a restart on the same
/// address finds its previous life's rows).
fn history_instance(config: &GatewayConfig, port: u16) -> String {
    config.history_instance.clone().unwrap_or_else(|| {
        let host = nix::unistd::gethostname()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "localhost".to_owned());
        format!("{host}:{port}")
    })
}

/// Warns when a route group is reachable beyond loopback without a key.
fn warn_if_exposed(config: &GatewayConfig, http: SocketAddr, admin: SocketAddr) {
    let auth = &config.front.auth;
    if !http.ip().is_loopback() && auth.api_keys.is_empty() {
        tracing::warn!(
            %http,
            "inference routes are open to anyone who reaches {http}: configure --api-key or --tenant-api-key"
        );
    }
    if !admin.ip().is_loopback() && auth.control_plane_keys.is_empty() {
        tracing::warn!(
            %admin,
            "admin routes (/workers) are open to anyone who reaches {admin}: configure --control-plane-api-keys"
        );
    }
}
