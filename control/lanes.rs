//! Which lane each image tensor takes to its workers: inline in the gRPC
//! message, a `/dev/shm` name, or (later) RDMA.
//!
//! Why it exists: the data plane writes a tensor once, into the lane chosen
//! before the job is submitted, so the choice must be made up front from the
//! workers that may receive it (the encode pool in EPD, the regular or
//! prefill pool otherwise). `--multimodal-tensor-transport` sets the default
//! mode; `--worker-tensor-transport URL=MODE[,min_bytes=N]` overrides it per
//! worker, and a worker registered through the admin API may carry its own
//! override (the same [`WorkerLaneOverride`], which then wins over the
//! flag's for its URL; [`TensorLanes::transport_for`] is the one place that
//! resolves registration → flag → default). The shm lane is taken only when
//! every available receiver accepts it (mode `shm`, or `auto` with the
//! worker's advertised `shm_namespace_id` equal to ours); otherwise the tensor goes inline, and where inline was not
//! what the operator asked for, `smg_tensor_lane_fallbacks_total` says why.
//!
//! It also owns the shm lane's lifetime: the start-up sweep of dead
//! gateways' names, the per-core pools (created at start-up when a flag asks
//! for shm, else on the first registration that does; likewise the RDMA
//! lane), and a reclaimer task that frees slots whose names are gone (or
//! overdue) and publishes occupancy gauges.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Once, OnceLock, RwLock, Weak};
use std::time::Duration;

use smg_dataplane::lanes::rdma::{self, RdmaArena, RdmaBackend, RdmaConfig, RdmaLane};
use smg_dataplane::lanes::{
    Fallback, LaneChoice, LaneKind, SealedTensor, ShmLane, ShmLaneConfig, ShmOccupancy, TensorLane,
    shm,
};
use smg_shared::shm::ShmNamespace;

use crate::engine::{Runtime, TensorPayload};
use crate::mode::Mode;
use crate::workers::{Worker, WorkerRole, WorkerSet};

pub const TENSORS_TOTAL: &str = "smg_tensor_lane_tensors_total";
pub const BYTES_TOTAL: &str = "smg_tensor_lane_bytes_total";
pub const FALLBACKS_TOTAL: &str = "smg_tensor_lane_fallbacks_total";
pub const SHM_SLOTS_IN_USE: &str = "smg_shm_slots_in_use";
pub const SHM_SLOTS_TOTAL: &str = "smg_shm_slots_total";

/// How often the reclaimer looks at the shm slots.
const RECLAIM_INTERVAL: Duration = Duration::from_millis(200);
/// How long learning a worker's shm namespace may take.
const NAMESPACE_TIMEOUT: Duration = Duration::from_secs(5);

/// A transport mode, as the flags spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneMode {
    Inline,
    Shm,
    Auto,
    Rdma,
}

impl LaneMode {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "inline" => Some(LaneMode::Inline),
            "shm" => Some(LaneMode::Shm),
            "auto" => Some(LaneMode::Auto),
            "rdma" => Some(LaneMode::Rdma),
            _ => None,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            LaneMode::Inline => "inline",
            LaneMode::Shm => "shm",
            LaneMode::Auto => "auto",
            LaneMode::Rdma => "rdma",
        }
    }

    fn uses_shm(self) -> bool {
        matches!(self, LaneMode::Shm | LaneMode::Auto)
    }
}

/// One worker's override of the mode and the inline threshold: from
/// `--worker-tensor-transport`, or from the worker's admin registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerLaneOverride {
    pub mode: LaneMode,
    pub min_bytes: Option<usize>,
}

/// Where a worker's transport comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportSource {
    /// Its admin registration's `tensor_transport`.
    Registration,
    /// A `--worker-tensor-transport` for its URL.
    Flag,
    /// `--multimodal-tensor-transport` / `--multimodal-shm-min-bytes`.
    Default,
    /// Its runtime takes tensors inline only (SGLang).
    Runtime,
}

impl TransportSource {
    pub const fn name(self) -> &'static str {
        match self {
            TransportSource::Registration => "registration",
            TransportSource::Flag => "flag",
            TransportSource::Default => "default",
            TransportSource::Runtime => "runtime",
        }
    }
}

/// The mode and threshold the lane decision applies to one worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerTransport {
    pub mode: LaneMode,
    pub min_bytes: usize,
    pub source: TransportSource,
}

/// Parses `URL=MODE[,min_bytes=N]` (`--worker-tensor-transport`).
pub fn parse_override(text: &str) -> Result<(String, WorkerLaneOverride), String> {
    let (url, rest) = text
        .rsplit_once('=')
        .filter(|(url, _)| !url.is_empty())
        .ok_or_else(|| format!("{text:?} is not URL=MODE[,min_bytes=N]"))?;
    // `URL=MODE,min_bytes=N`: the last '=' may belong to min_bytes.
    let (url, spec) = match url.rsplit_once(',') {
        Some((head, "min_bytes")) => {
            let (url, mode) = head
                .rsplit_once('=')
                .ok_or_else(|| format!("{text:?} is not URL=MODE[,min_bytes=N]"))?;
            (url, format!("{mode},min_bytes={rest}"))
        }
        _ => (url, rest.to_owned()),
    };
    let mut parts = spec.split(',');
    let mode_text = parts.next().unwrap_or_default();
    let mode = LaneMode::parse(mode_text).ok_or_else(|| {
        format!("{text:?}: unknown transport {mode_text:?} (inline, shm, auto or rdma)")
    })?;
    let mut min_bytes = None;
    for part in parts {
        let value = part
            .strip_prefix("min_bytes=")
            .ok_or_else(|| format!("{text:?}: unknown option {part:?} (min_bytes=N)"))?;
        min_bytes = Some(
            value
                .parse()
                .map_err(|_| format!("{text:?}: min_bytes must be a byte count, not {value:?}"))?,
        );
    }
    Ok((normalize_url(url), WorkerLaneOverride { mode, min_bytes }))
}

/// Worker URLs compare without scheme and trailing slash.
fn normalize_url(url: &str) -> String {
    let bare = ["grpc://", "http://", "https://"]
        .iter()
        .find_map(|scheme| url.strip_prefix(scheme))
        .unwrap_or(url);
    bare.trim_end_matches('/').to_owned()
}

/// Everything the lanes are configured from.
#[derive(Debug, Clone)]
pub struct LaneSettings {
    pub mode: LaneMode,
    pub min_bytes: usize,
    pub overrides: Vec<(String, WorkerLaneOverride)>,
    pub shm_dir: PathBuf,
    pub shm_slot_bytes: usize,
    pub shm_slots_per_core: usize,
    pub shm_reclaim_after: Duration,
    pub shm_keep_free_bytes: u64,
    pub rdma_backend: RdmaBackend,
    pub rdma_slots: usize,
    pub rdma_slot_bytes: usize,
    /// How long a published RDMA slot waits for its RPC before the reaper
    /// takes it back.
    pub rdma_deadline: Duration,
}

impl LaneSettings {
    fn wants_shm(&self) -> bool {
        self.mode.uses_shm() || self.overrides.iter().any(|(_, o)| o.mode.uses_shm())
    }

    fn wants_rdma(&self) -> bool {
        self.mode == LaneMode::Rdma || self.overrides.iter().any(|(_, o)| o.mode == LaneMode::Rdma)
    }
}

/// What a worker advertised about its /dev/shm, as far as we know.
#[derive(Debug, Clone, PartialEq, Eq)]
enum KnownNamespace {
    /// Being asked (GetServerInfo under way).
    Pending,
    Known(Option<String>),
}

/// The lanes of one gateway process.
#[derive(Debug)]
pub struct TensorLanes {
    mode: LaneMode,
    min_bytes: usize,
    overrides: HashMap<String, WorkerLaneOverride>,
    /// The shm lane once some mode asked for it, or why it could not be
    /// created (the fallback reason).
    shm: OnceLock<Result<Arc<ShmLane>, &'static str>>,
    /// The RDMA lane once some mode asked for it (`None`: it did not open).
    rdma: OnceLock<Option<Arc<RdmaLane>>>,
    /// What lanes asked for later ([`TensorLanes::prepare`]) are made from;
    /// `None` for [`TensorLanes::inline`].
    settings: Option<(LaneSettings, usize)>,
    /// The reclaimer runs from the first lane that holds resources.
    reclaimer: Once,
    namespace: Option<ShmNamespace>,
    namespaces: Arc<RwLock<HashMap<String, KnownNamespace>>>,
}

/// The lane decision for one request's tensors.
#[derive(Debug, Clone, Default)]
pub struct LaneDecision {
    /// `None`: inline.
    pub choice: Option<LaneChoice>,
    /// Inline although the receivers' mode asked for another lane.
    pub fallback: Option<Fallback>,
}

impl TensorLanes {
    /// Sets the lanes up: sweeps the names dead gateways left in the shm
    /// directory, and creates the per-core pools when any mode uses shm. A
    /// pool that cannot be created (too little room) leaves shm off: those
    /// tensors go inline, counted as fallbacks.
    /// `rdma` is the RDMA lane when one opened ([`open_rdma`], which logs
    /// why not); without it `rdma` modes fall back to inline.
    pub fn start(settings: &LaneSettings, cores: usize, rdma: Option<Arc<RdmaLane>>) -> Arc<Self> {
        // Whatever this gateway's mode, names left by gateways that died
        // (pid and start time are in each name) are removed now.
        match shm::sweep_orphans(&settings.shm_dir) {
            Ok(0) => {}
            Ok(removed) => tracing::info!(
                removed,
                dir = %settings.shm_dir.display(),
                "removed shm names left by gateways that died"
            ),
            Err(err) => {
                tracing::warn!(%err, dir = %settings.shm_dir.display(), "shm orphan sweep failed")
            }
        }
        let namespace = ShmNamespace::read_from(
            std::path::Path::new("/proc/sys/kernel/random/boot_id"),
            &settings.shm_dir,
        )
        .map_err(|err| tracing::warn!(%err, "no shm namespace: auto sends tensors inline"))
        .ok();
        let lanes = Arc::new(Self {
            mode: settings.mode,
            min_bytes: settings.min_bytes,
            overrides: settings.overrides.iter().cloned().collect(),
            shm: OnceLock::new(),
            rdma: OnceLock::new(),
            settings: Some((settings.clone(), cores)),
            reclaimer: Once::new(),
            namespace,
            namespaces: Arc::default(),
        });
        if settings.wants_shm() {
            lanes.shm.get_or_init(|| create_shm(settings, cores));
        }
        if rdma.is_some() || settings.wants_rdma() {
            lanes.rdma.get_or_init(|| rdma);
        }
        lanes.start_reclaimer();
        lanes
    }

    /// Makes the lane `mode` needs if no earlier mode did (a worker
    /// registered at run time asking for shm or rdma on a gateway whose
    /// flags did not): the same pools, and the same fallbacks when they
    /// cannot be made, as at start-up. A pool is created and touched on a
    /// blocking thread. Made once: a lane that could not be made is not
    /// tried again.
    pub async fn prepare(self: &Arc<Self>, mode: LaneMode) {
        if self.settings.is_none() || mode == LaneMode::Inline {
            return;
        }
        let lanes = Arc::clone(self);
        let made = tokio::task::spawn_blocking(move || {
            let Some((settings, cores)) = &lanes.settings else {
                return;
            };
            if mode == LaneMode::Rdma {
                lanes.rdma.get_or_init(|| open_rdma_lane(settings));
            } else {
                lanes.shm.get_or_init(|| create_shm(settings, *cores));
            }
        })
        .await;
        if let Err(err) = made {
            tracing::warn!(%err, "making a tensor lane failed");
        }
        self.start_reclaimer();
    }

    /// Starts the reclaimer once some lane holds resources.
    fn start_reclaimer(self: &Arc<Self>) {
        if self.shm_lane().is_none() && self.rdma_lane().is_none() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        self.reclaimer.call_once(|| {
            self.publish_occupancy();
            runtime.spawn(reclaim(Arc::downgrade(self)));
        });
    }

    fn shm_lane(&self) -> Option<&Arc<ShmLane>> {
        self.shm.get().and_then(|made| made.as_ref().ok())
    }

    fn rdma_lane(&self) -> Option<&Arc<RdmaLane>> {
        self.rdma.get().and_then(Option::as_ref)
    }

    /// Inline only (tests, and models without images).
    pub fn inline() -> Arc<Self> {
        Arc::new(Self {
            mode: LaneMode::Inline,
            min_bytes: 0,
            overrides: HashMap::new(),
            shm: OnceLock::new(),
            rdma: OnceLock::new(),
            settings: None,
            reclaimer: Once::new(),
            namespace: None,
            namespaces: Arc::default(),
        })
    }

    /// Whether any worker may need its advertised namespace.
    fn needs_namespaces(&self) -> bool {
        self.mode == LaneMode::Auto || self.overrides.values().any(|o| o.mode == LaneMode::Auto)
    }

    /// Records a worker's advertised namespace (from GetServerInfo).
    pub fn learn_namespace(&self, url: &str, namespace: Option<String>) {
        if let Ok(mut known) = self.namespaces.write() {
            known.insert(normalize_url(url), KnownNamespace::Known(namespace));
        }
    }

    /// Asks each of `workers` for its namespace (start-up, before serving).
    pub async fn learn_namespaces(&self, workers: &[Arc<Worker>]) {
        if !self.needs_namespaces() {
            return;
        }
        let asks = workers.iter().map(|worker| async move {
            let info = tokio::time::timeout(NAMESPACE_TIMEOUT, worker.client().server_info()).await;
            match info {
                Ok(Ok(info)) => self.learn_namespace(worker.url(), info.shm_namespace_id),
                Ok(Err(err)) => {
                    tracing::warn!(worker = worker.url(), %err, "cannot learn the worker's shm namespace");
                }
                Err(_) => {
                    tracing::warn!(worker = worker.url(), "GetServerInfo timed out; shm namespace unknown");
                }
            }
        });
        futures::future::join_all(asks).await;
    }

    /// The shm lane's occupancy, when it exists.
    pub fn shm_occupancy(&self) -> Option<ShmOccupancy> {
        self.shm_lane().map(|lane| lane.occupancy())
    }

    fn publish_occupancy(&self) {
        if let Some(occupancy) = self.shm_occupancy() {
            metrics::gauge!(SHM_SLOTS_TOTAL).set(occupancy.slots_total as f64);
            metrics::gauge!(SHM_SLOTS_IN_USE).set(occupancy.slots_in_use as f64);
        }
        if let Some(rdma) = self.rdma_lane() {
            let occupancy = rdma.arena().occupancy();
            metrics::gauge!(rdma::SLOTS_TOTAL_METRIC).set(occupancy.slots_total as f64);
            metrics::gauge!(rdma::SLOTS_IN_USE_METRIC).set(occupancy.slots_in_use as f64);
        }
    }

    /// The mode and threshold for the worker at `url` whose registration
    /// carried `registered` (a registration is the newer, more specific
    /// statement, so it wins over a flag for the same URL; either beats the
    /// default; an override without a threshold takes the default one).
    pub fn transport_for(
        &self,
        url: &str,
        registered: Option<WorkerLaneOverride>,
    ) -> WorkerTransport {
        let flagged = || self.overrides.get(&normalize_url(url)).copied();
        let (chosen, source) = match registered {
            Some(o) => (Some(o), TransportSource::Registration),
            None => (flagged(), TransportSource::Flag),
        };
        match chosen {
            Some(o) => WorkerTransport {
                mode: o.mode,
                min_bytes: o.min_bytes.unwrap_or(self.min_bytes),
                source,
            },
            None => WorkerTransport {
                mode: self.mode,
                min_bytes: self.min_bytes,
                source: TransportSource::Default,
            },
        }
    }

    /// [`Self::transport_for`] as a `runtime` worker gets it: SGLang
    /// workers take tensors inline whatever is asked (what
    /// [`Self::decide`] does).
    pub fn effective_transport(
        &self,
        runtime: Runtime,
        url: &str,
        registered: Option<WorkerLaneOverride>,
    ) -> WorkerTransport {
        match runtime {
            Runtime::Sglang => WorkerTransport {
                mode: LaneMode::Inline,
                min_bytes: 0,
                source: TransportSource::Runtime,
            },
            Runtime::TokenSpeed => self.transport_for(url, registered),
        }
    }

    /// The lane for a request's tensors in `mode` on `runtime` workers:
    /// inline for SGLang (its TensorData has no shm or remote payload);
    /// otherwise decided over the available workers of the receiving role.
    pub fn decide(&self, mode: Mode, runtime: Runtime, workers: &WorkerSet) -> LaneDecision {
        if runtime == Runtime::Sglang {
            return LaneDecision::default();
        }
        let role = if mode.spec().encodes_media {
            WorkerRole::Encode
        } else if mode == Mode::Regular {
            WorkerRole::Regular
        } else {
            WorkerRole::Prefill
        };
        let (members, _) = workers.members(role);
        let receivers: Vec<&Arc<Worker>> = members
            .iter()
            .filter(|worker| worker.is_available())
            .collect();
        self.decide_for(&receivers)
    }

    fn decide_for(&self, receivers: &[&Arc<Worker>]) -> LaneDecision {
        let mut min_bytes = 0usize;
        // The one lane every receiver accepts, if any.
        let mut common: Option<LaneKind> = None;
        let mut everyone_agrees = !receivers.is_empty();
        let mut fallback = None;
        for worker in receivers {
            let key = normalize_url(worker.url());
            let transport = self.transport_for(worker.url(), worker.lane_override());
            min_bytes = min_bytes.max(transport.min_bytes);
            let accepted = match transport.mode {
                LaneMode::Inline => Err(None),
                LaneMode::Rdma if self.rdma_lane().is_some() => Ok(LaneKind::Rdma),
                LaneMode::Rdma => Err(Some(Fallback {
                    requested: LaneKind::Rdma,
                    reason: "rdma_unavailable",
                })),
                LaneMode::Shm => Ok(LaneKind::Shm),
                LaneMode::Auto => match self.namespace_refusal(worker, &key) {
                    None => Ok(LaneKind::Shm),
                    Some(why) => Err(why),
                },
            };
            match accepted {
                Ok(lane) if common.is_none_or(|c| c == lane) => common = Some(lane),
                Ok(lane) => {
                    everyone_agrees = false;
                    fallback = fallback.or(Some(Fallback {
                        requested: lane,
                        reason: "mixed_lanes",
                    }));
                }
                Err(why) => {
                    everyone_agrees = false;
                    fallback = fallback.or(why);
                }
            }
        }
        let lane = match common {
            Some(lane) if everyone_agrees => lane,
            _ => {
                return LaneDecision {
                    choice: None,
                    fallback,
                };
            }
        };
        let (available, missing) = match lane {
            LaneKind::Shm => match self.shm.get() {
                Some(Ok(lane)) => (Some(Arc::clone(lane) as Arc<dyn TensorLane>), ""),
                Some(Err(why)) => (None, *why),
                None => (None, "shm_unavailable"),
            },
            LaneKind::Rdma => (
                self.rdma_lane()
                    .map(|l| Arc::clone(l) as Arc<dyn TensorLane>),
                "rdma_unavailable",
            ),
            LaneKind::Inline => (None, ""),
        };
        match available {
            Some(lane) => LaneDecision {
                choice: Some(LaneChoice { lane, min_bytes }),
                fallback: None,
            },
            None => LaneDecision {
                choice: None,
                fallback: (lane != LaneKind::Inline).then_some(Fallback {
                    requested: lane,
                    reason: missing,
                }),
            },
        }
    }

    /// `None` when `worker` shares our /dev/shm; else why not (`Some(None)`
    /// never happens here: auto asked for shm, so refusals are fallbacks).
    fn namespace_refusal(&self, worker: &Arc<Worker>, key: &str) -> Option<Option<Fallback>> {
        let refuse = |reason| {
            Some(Some(Fallback {
                requested: LaneKind::Shm,
                reason,
            }))
        };
        let known = self
            .namespaces
            .read()
            .ok()
            .and_then(|known| known.get(key).cloned());
        match known {
            Some(KnownNamespace::Known(Some(theirs))) => match &self.namespace {
                Some(ours) if ours.as_str() == theirs => None,
                _ => refuse("namespace_mismatch"),
            },
            Some(KnownNamespace::Known(None)) => refuse("namespace_mismatch"),
            Some(KnownNamespace::Pending) => refuse("namespace_unknown"),
            None => {
                self.ask_later(worker, key);
                refuse("namespace_unknown")
            }
        }
    }

    /// Learns a worker's namespace in the background (workers added at run
    /// time); its tensors go inline meanwhile.
    fn ask_later(&self, worker: &Arc<Worker>, key: &str) {
        if let Ok(mut known) = self.namespaces.write() {
            if known.contains_key(key) {
                return;
            }
            known.insert(key.to_owned(), KnownNamespace::Pending);
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let client = worker.client().clone();
        let key = key.to_owned();
        let namespaces = Arc::downgrade(&self.namespaces);
        runtime.spawn(async move {
            let learned = tokio::time::timeout(NAMESPACE_TIMEOUT, client.server_info())
                .await
                .ok()
                .and_then(Result::ok);
            if let Some(sink) = namespaces.upgrade() {
                let entry = match learned {
                    Some(info) => KnownNamespace::Known(info.shm_namespace_id),
                    // Try again on a later request.
                    None => {
                        if let Ok(mut known) = sink.write() {
                            known.remove(&key);
                        }
                        return;
                    }
                };
                if let Ok(mut known) = sink.write() {
                    known.insert(key, entry);
                }
            }
        });
    }
}

/// The lanes `smg launch` was started with (`installed` finds them).
static INSTALLED: Mutex<Weak<TensorLanes>> = Mutex::new(Weak::new());

/// Makes `lanes` the process's lanes for routers built from now on. Only a
/// weak reference is kept: the shm pools (and their files) go when the
/// launcher and the last request holding a slot let go.
pub fn install(lanes: &Arc<TensorLanes>) {
    match INSTALLED.lock() {
        Ok(mut installed) => *installed = Arc::downgrade(lanes),
        Err(poisoned) => *poisoned.into_inner() = Arc::downgrade(lanes),
    }
}

/// The installed lanes, or inline-only lanes when none are.
pub fn installed() -> Arc<TensorLanes> {
    let installed = match INSTALLED.lock() {
        Ok(installed) => installed.upgrade(),
        Err(poisoned) => poisoned.into_inner().upgrade(),
    };
    installed.unwrap_or_else(TensorLanes::inline)
}

/// The lane settings `smg launch`'s flags describe.
pub fn settings_from(args: &crate::cli::LaunchArgs) -> Result<LaneSettings, String> {
    use crate::cli::TensorTransport;
    let overrides = args
        .worker_tensor_transport
        .iter()
        .map(|text| parse_override(text).map_err(|err| format!("--worker-tensor-transport {err}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(LaneSettings {
        mode: match args.multimodal_tensor_transport {
            TensorTransport::Inline => LaneMode::Inline,
            TensorTransport::Shm => LaneMode::Shm,
            TensorTransport::Auto => LaneMode::Auto,
            TensorTransport::Rdma => LaneMode::Rdma,
        },
        min_bytes: usize::try_from(args.multimodal_shm_min_bytes).unwrap_or(usize::MAX),
        overrides,
        shm_dir: args.multimodal_shm_dir.clone(),
        shm_slot_bytes: args.multimodal_shm_slot_bytes,
        shm_slots_per_core: args.multimodal_shm_slots_per_core,
        shm_reclaim_after: Duration::from_millis(args.multimodal_shm_reclaim_ms),
        shm_keep_free_bytes: args.multimodal_shm_keep_free_bytes,
        rdma_backend: match args.multimodal_rdma_backend {
            crate::cli::RdmaBackendArg::Verbs => RdmaBackend::Verbs,
            crate::cli::RdmaBackendArg::Loopback => RdmaBackend::Loopback,
        },
        rdma_slots: args.multimodal_rdma_slots,
        rdma_slot_bytes: args.multimodal_rdma_slot_bytes,
        rdma_deadline: Duration::from_millis(args.multimodal_rdma_deadline_ms),
    })
}

/// Opens the RDMA lane when a mode asks for it: the verbs backend on the
/// host's first device, or the loopback arena in the shm directory. Without
/// one, `None` after one log line saying why (those tensors go inline,
/// counted as `rdma_unavailable` fallbacks).
pub fn open_rdma(settings: &LaneSettings) -> Option<Arc<RdmaLane>> {
    if !settings.wants_rdma() {
        return None;
    }
    open_rdma_lane(settings)
}

/// Opens the RDMA lane `settings` describe (`None`, logged, when it cannot).
fn open_rdma_lane(settings: &LaneSettings) -> Option<Arc<RdmaLane>> {
    let config = RdmaConfig {
        slot_bytes: settings.rdma_slot_bytes,
        slots: settings.rdma_slots,
        loopback_dir: settings.shm_dir.clone(),
    };
    let arena = match RdmaArena::open(settings.rdma_backend, &config) {
        Ok(arena) => arena,
        Err(why) => {
            why.log_fallback();
            return None;
        }
    };
    let transport = arena.transport();
    match RdmaLane::new(arena, settings.rdma_deadline) {
        Ok(lane) => {
            tracing::info!(
                transport,
                slots = settings.rdma_slots,
                slot_bytes = settings.rdma_slot_bytes,
                "rdma tensor lane ready"
            );
            Some(Arc::new(lane))
        }
        Err(err) => {
            tracing::warn!(%err, "the rdma lane's reaper did not start; its tensors go inline");
            None
        }
    }
}

/// Creates the per-core shm pools `settings` describe, or says why not (the
/// fallback reason its tensors are counted under).
fn create_shm(settings: &LaneSettings, cores: usize) -> Result<Arc<ShmLane>, &'static str> {
    let config = ShmLaneConfig {
        dir: settings.shm_dir.clone(),
        slot_bytes: settings.shm_slot_bytes,
        slots_per_core: settings.shm_slots_per_core,
        reclaim_after: settings.shm_reclaim_after,
        keep_free_bytes: settings.shm_keep_free_bytes,
    };
    match ShmLane::create(&config, cores) {
        Ok(lane) => {
            tracing::info!(
                dir = %settings.shm_dir.display(),
                cores,
                slots_per_core = settings.shm_slots_per_core,
                slot_bytes = settings.shm_slot_bytes,
                "shm tensor lane ready"
            );
            Ok(Arc::new(lane))
        }
        Err(err) => {
            tracing::warn!(%err, dir = %settings.shm_dir.display(), "the shm tensor lane is unavailable; its tensors go inline");
            Err(match err {
                shm::ShmError::NoSpace { .. } => "shm_no_space",
                shm::ShmError::Io { .. } => "shm_unavailable",
            })
        }
    }
}

/// Counts a decision-level fallback once per tensor it affected.
pub fn record_fallback(fallback: &Fallback) {
    metrics::counter!(
        FALLBACKS_TOTAL,
        "requested" => fallback.requested.name(),
        "reason" => fallback.reason
    )
    .increment(1);
}

/// Counts a sealed tensor on its lane (and its own fallback, if any).
pub fn record_tensor(tensor: &SealedTensor, nbytes: usize) {
    let lane = tensor.lane.name();
    metrics::counter!(TENSORS_TOTAL, "lane" => lane).increment(1);
    metrics::counter!(BYTES_TOTAL, "lane" => lane).increment(nbytes as u64);
    if let Some(fallback) = &tensor.fallback {
        record_fallback(fallback);
    }
}

/// The engine payload of a sealed tensor.
pub fn engine_payload(payload: smg_dataplane::lanes::WirePayload) -> TensorPayload {
    use smg_dataplane::lanes::WirePayload;
    match payload {
        WirePayload::Inline(bytes) => TensorPayload::Inline(bytes),
        WirePayload::Shm { name, nbytes } => TensorPayload::Shm {
            name,
            offset: 0,
            nbytes,
            owner_id: owner_id(),
        },
        WirePayload::Remote {
            transport,
            descriptor,
            nbytes,
        } => TensorPayload::Remote {
            transport,
            descriptor,
            nbytes,
        },
    }
}

/// Who owns the shm names this process publishes (`ShmHandle.owner_id`).
fn owner_id() -> String {
    format!("smg-{}", std::process::id())
}

/// Frees shm slots whose names are gone or overdue and publishes both
/// pools' occupancy, until the lanes are dropped.
async fn reclaim(lanes: Weak<TensorLanes>) {
    let mut tick = tokio::time::interval(RECLAIM_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(lanes) = lanes.upgrade() else { return };
        lanes.publish_occupancy();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lanes with this default and these flag overrides (no pools).
    fn configured(
        mode: LaneMode,
        min_bytes: usize,
        flags: &[(&str, WorkerLaneOverride)],
    ) -> TensorLanes {
        TensorLanes {
            mode,
            min_bytes,
            overrides: flags
                .iter()
                .map(|(url, o)| ((*url).to_owned(), *o))
                .collect(),
            shm: OnceLock::new(),
            rdma: OnceLock::new(),
            settings: None,
            reclaimer: Once::new(),
            namespace: None,
            namespaces: Arc::default(),
        }
    }

    #[test]
    fn a_registration_wins_over_the_flag_which_wins_over_the_default() {
        let flagged = WorkerLaneOverride {
            mode: LaneMode::Shm,
            min_bytes: Some(10),
        };
        let lanes = configured(LaneMode::Auto, 64, &[("h:1", flagged)]);
        let registered = WorkerLaneOverride {
            mode: LaneMode::Inline,
            min_bytes: None,
        };
        let transport = |url, registered| {
            let t = lanes.transport_for(url, registered);
            (t.mode, t.min_bytes, t.source)
        };
        assert_eq!(
            transport("grpc://h:1/", Some(registered)),
            (LaneMode::Inline, 64, TransportSource::Registration)
        );
        assert_eq!(
            transport("http://h:1", None),
            (LaneMode::Shm, 10, TransportSource::Flag)
        );
        assert_eq!(
            transport("grpc://h:2", None),
            (LaneMode::Auto, 64, TransportSource::Default)
        );
        let sglang = lanes.effective_transport(Runtime::Sglang, "grpc://h:1", Some(flagged));
        assert_eq!(
            (sglang.mode, sglang.source),
            (LaneMode::Inline, TransportSource::Runtime)
        );
    }

    #[test]
    fn overrides_parse_with_and_without_a_threshold() {
        assert_eq!(
            parse_override("grpc://10.0.0.1:50051=shm").expect("valid"),
            (
                "10.0.0.1:50051".to_owned(),
                WorkerLaneOverride {
                    mode: LaneMode::Shm,
                    min_bytes: None
                }
            )
        );
        assert_eq!(
            parse_override("http://h:1/=auto,min_bytes=1048576").expect("valid"),
            (
                "h:1".to_owned(),
                WorkerLaneOverride {
                    mode: LaneMode::Auto,
                    min_bytes: Some(1 << 20)
                }
            )
        );
        for bad in [
            "grpc://h:1",
            "=shm",
            "grpc://h:1=tcp",
            "grpc://h:1=shm,min_bytes=lots",
            "grpc://h:1=shm,size=3",
        ] {
            assert!(parse_override(bad).is_err(), "{bad}");
        }
    }
}
