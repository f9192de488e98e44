//! The lanes' resources and their lifetime: the start-up sweep of dead
//! gateways' shm names, the per-core shm pools and the RDMA arena (made at
//! start-up when the settings ask for them, else on the first registration
//! that does), what each worker advertised about its `/dev/shm`, and a
//! reclaimer task that frees slots whose names are gone (or overdue) and
//! publishes occupancy gauges.

use std::collections::HashMap;
use std::sync::{Arc, Once, OnceLock, RwLock, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use smg_dataplane::lanes::rdma::{self, RdmaArena, RdmaConfig, RdmaLane};
use smg_dataplane::lanes::{
    Fallback, SealedTensor, ShmLane, ShmLaneConfig, ShmOccupancy, TensorLane, shm,
};
use smg_shared::shm::ShmNamespace;

use super::decision::{AvailableLanes, LaneDecision, Receiver, SharedMemory, decide};
use super::settings::LaneSettings;
use crate::engine::{Runtime, TensorPayload};
use crate::mode::Mode;
use crate::workers::{
    LaneDirectory, LaneMode, TransportSource, Worker, WorkerLaneOverride, WorkerRole, WorkerSet,
    WorkerTransport, normalize_url,
};

// The names live with every other family in `crate::metrics::FAMILIES`.
pub(crate) use crate::metrics::{
    SHM_SLOTS, SHM_SLOTS_IN_USE, TENSOR_LANE_BYTES as BYTES_TOTAL,
    TENSOR_LANE_FALLBACKS as FALLBACKS_TOTAL, TENSOR_LANE_TENSORS as TENSORS_TOTAL,
};

/// How often the reclaimer looks at the shm slots.
const RECLAIM_INTERVAL: Duration = Duration::from_millis(200);
/// How long learning a worker's shm namespace may take.
const NAMESPACE_TIMEOUT: Duration = Duration::from_secs(5);

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

impl TensorLanes {
    /// Sets the lanes up: sweeps the names dead gateways left in the shm
    /// directory, and creates the per-core pools when any mode uses shm. A
    /// pool that cannot be created (too little room) leaves shm off: those
    /// tensors go inline, counted as fallbacks.
    /// `rdma` is the RDMA lane when one opened ([`open_rdma`], which logs
    /// why not); without it `rdma` modes fall back to inline.
    pub fn start(settings: &LaneSettings, cores: usize, rdma: Option<Arc<RdmaLane>>) -> Arc<Self> {
        // Whatever this gateway's mode, names left by gateways that are
        // provably gone (their owner file's lock is free, or another boot)
        // are removed now; a live gateway's are kept, whatever its PID
        // namespace.
        match shm::sweep_orphans(&settings.shm_dir) {
            Ok(summary) if summary.removed == 0 && summary.errors == 0 => {}
            Ok(summary) => tracing::info!(
                removed = summary.removed,
                kept = summary.kept,
                errors = summary.errors,
                dir = %settings.shm_dir.display(),
                "removed shm names left by gateways that are gone"
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
            metrics::gauge!(SHM_SLOTS).set(occupancy.slots_total as f64);
            metrics::gauge!(SHM_SLOTS_IN_USE).set(occupancy.slots_in_use as f64);
        }
        if let Some(rdma) = self.rdma_lane() {
            let occupancy = rdma.arena().occupancy();
            metrics::gauge!(rdma::SLOTS_METRIC).set(occupancy.slots_total as f64);
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
        let receivers: Vec<Receiver> = members
            .iter()
            .filter(|worker| worker.is_available())
            .map(|worker| self.receiver(worker))
            .collect();
        decide(&receivers, &self.available())
    }

    /// What the decision knows of a receiver: its transport, and for
    /// `auto` whether it shares our `/dev/shm` (asking it in the background
    /// when nobody has yet).
    fn receiver(&self, worker: &Arc<Worker>) -> Receiver {
        let transport = self.transport_for(worker.url(), worker.lane_override());
        let shm = if transport.mode == LaneMode::Auto {
            self.shared_memory(worker)
        } else {
            SharedMemory::Unknown
        };
        Receiver { transport, shm }
    }

    /// The lanes that exist now.
    fn available(&self) -> AvailableLanes {
        AvailableLanes {
            shm: match self.shm.get() {
                Some(Ok(lane)) => Ok(Arc::clone(lane) as Arc<dyn TensorLane>),
                Some(Err(why)) => Err(*why),
                None => Err("shm_unavailable"),
            },
            rdma: self
                .rdma_lane()
                .map(|lane| Arc::clone(lane) as Arc<dyn TensorLane>),
        }
    }

    /// Whether `worker` shares our `/dev/shm`, as far as we know.
    fn shared_memory(&self, worker: &Arc<Worker>) -> SharedMemory {
        let key = normalize_url(worker.url());
        let known = self
            .namespaces
            .read()
            .ok()
            .and_then(|known| known.get(&key).cloned());
        match known {
            Some(KnownNamespace::Known(Some(theirs))) => match &self.namespace {
                Some(ours) if ours.as_str() == theirs => SharedMemory::Shared,
                _ => SharedMemory::NotShared,
            },
            Some(KnownNamespace::Known(None)) => SharedMemory::NotShared,
            Some(KnownNamespace::Pending) => SharedMemory::Unknown,
            None => {
                self.ask_later(worker, &key);
                SharedMemory::Unknown
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

impl LaneDirectory for TensorLanes {
    fn prepare(self: Arc<Self>, mode: LaneMode) -> BoxFuture<'static, ()> {
        Box::pin(async move { TensorLanes::prepare(&self, mode).await })
    }

    fn effective_transport(
        &self,
        runtime: Runtime,
        url: &str,
        registered: Option<WorkerLaneOverride>,
    ) -> WorkerTransport {
        TensorLanes::effective_transport(self, runtime, url, registered)
    }
}

/// Opens the RDMA lane when a mode asks for it: the verbs backend on the
/// host's first device, or the loopback arena in the shm directory. Without
/// one, `None` after one log line saying why (those tensors go inline,
/// counted as `rdma_unavailable` fallbacks).
pub(crate) fn open_rdma(settings: &LaneSettings) -> Option<Arc<RdmaLane>> {
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
                shm::ShmError::Io { .. } | shm::ShmError::SlotLost { .. } => "shm_unavailable",
            })
        }
    }
}

/// Counts a decision-level fallback once per tensor it affected.
pub(crate) fn record_fallback(fallback: &Fallback) {
    metrics::counter!(
        FALLBACKS_TOTAL,
        "requested" => fallback.requested.name(),
        "reason" => fallback.reason
    )
    .increment(1);
}

/// Counts a sealed tensor on its lane (and its own fallback, if any).
pub(crate) fn record_tensor(tensor: &SealedTensor, nbytes: usize) {
    let lane = tensor.lane.name();
    metrics::counter!(TENSORS_TOTAL, "lane" => lane).increment(1);
    metrics::counter!(BYTES_TOTAL, "lane" => lane).increment(nbytes as u64);
    if let Some(fallback) = &tensor.fallback {
        record_fallback(fallback);
    }
}

/// The engine payload of a sealed tensor.
pub(crate) fn engine_payload(payload: smg_dataplane::lanes::WirePayload) -> TensorPayload {
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

/// Who owns the shm names this process publishes (`ShmHandle.owner_id`):
/// the stem of every name, `smg-<boot id>-<instance>`.
fn owner_id() -> String {
    shm::instance_stem()
}

/// Frees shm slots whose names are gone or overdue, rebuilds shm pools
/// that lost a slot's file, and publishes both pools' occupancy, until the
/// lanes are dropped.
async fn reclaim(lanes: Weak<TensorLanes>) {
    let mut tick = tokio::time::interval(RECLAIM_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(lanes) = lanes.upgrade() else { return };
        if let Some(shm) = lanes.shm_lane().cloned() {
            rebuild_lost_pools(shm).await;
        }
        lanes.publish_occupancy();
    }
}

/// Replaces the shm pools whose slot files someone else removed (their
/// tensors went inline meanwhile, counted as `shm_slot_lost` fallbacks).
async fn rebuild_lost_pools(shm: Arc<ShmLane>) {
    let dir = shm.dir().display().to_string();
    match tokio::task::spawn_blocking(move || shm.rebuild_lost()).await {
        Ok(Ok(0)) => {}
        Ok(Ok(rebuilt)) => tracing::warn!(
            rebuilt,
            dir,
            "shm slot files were removed by someone else; rebuilt those pools (tensors went inline meanwhile)"
        ),
        Ok(Err(err)) => tracing::warn!(
            %err,
            dir,
            "a shm pool lost its files and cannot be rebuilt yet; its tensors go inline"
        ),
        Err(err) => tracing::warn!(%err, "rebuilding shm pools failed"),
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
}
