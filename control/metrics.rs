//! Prometheus metrics, with SMG's metric names where SMG has them, labelled
//! by the router's mode (`grpc`, `grpc_pd`, `grpc_epd`).
//!
//! Recording goes through the `metrics` facade; [`install`] sets up the
//! Prometheus recorder whose rendering the `/metrics` listener serves.
//!
//! Every family the gateway exports is a row of [`FAMILIES`]: its name,
//! kind and help text. [`install`] describes each (so every series has
//! `# HELP`), and the tests check the table against what a busy gateway
//! exports (`promtool check metrics` clean, counters and only counters
//! ending in `_total`) and against the README's list. Gauges a dashboard
//! needs before the first request (a worker's health and circuit) are set
//! when the worker joins ([`record_worker_joined`]).
//!
//! The families about workers (`smg_worker_*`, labelled by the worker's
//! URL) are kept apart from the exporter's registry, in [`WorkerSeries`],
//! and leave `/metrics` with the worker. Why: the exporter can drop a
//! series only when it has not changed for an idle timeout, which would
//! also drop a live worker's steady gauges (its health, its circuit), and
//! keeping a removed worker's series for ever shows dead workers on
//! dashboards and grows without bound as workers come and go. So every
//! worker, and every registration while it runs or its failure is listed,
//! holds a [`WorkerSeriesHold`] on its URL; when the last hold on a URL is
//! dropped, every series labelled with it goes, gauges and counters alike
//! (a counter of a target that is gone may disappear, as Prometheus
//! expects). A worker drops its hold with its last reference, after its
//! drain and after its probes and load polls have let go, so no late
//! reading brings its series back.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::formatting::{
    sanitize_label_key, sanitize_label_value, write_help_line, write_type_line,
};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use metrics_util::registry::{AtomicStorage, Registry};

pub const REQUESTS_TOTAL: &str = "smg_router_requests_total";
pub const REQUEST_DURATION: &str = "smg_router_request_duration_seconds";
pub const REQUEST_ERRORS: &str = "smg_router_request_errors_total";
pub const TTFT: &str = "smg_router_ttft_seconds";
pub const TPOT: &str = "smg_router_tpot_seconds";
pub const WORKER_SELECTION: &str = "smg_worker_selection_total";
pub const RETRIES: &str = "smg_router_retries_total";
pub const PD_LEGS_START: &str = "smg_router_pd_legs_start_seconds";
pub const ENCODE_DURATION: &str = "smg_router_encode_duration_seconds";
pub const WORKER_HEALTH: &str = "smg_worker_health_state";
pub const BREAKER_STATE: &str = "smg_worker_cb_state";
pub const BREAKER_TRANSITIONS: &str = "smg_worker_cb_transitions_total";
pub const LOAD_READINGS: &str = "smg_worker_load_readings_total";
pub const LOAD_AGE: &str = "smg_worker_load_age_seconds";
pub const ADMISSION_IN_FLIGHT: &str = "smg_admission_in_flight";
pub const ADMISSION_QUEUE_DEPTH: &str = "smg_admission_queue_depth";
pub const ADMISSION_WAIT: &str = "smg_admission_queue_wait_seconds";
pub const CPU_WORK_RUNNING: &str = "smg_cpu_work_running";
pub const CPU_WORK_WAITING: &str = "smg_cpu_work_waiting";
pub const ADMISSION_REFUSALS: &str = "smg_admission_refusals_total";
pub const TENANT_REQUESTS: &str = "smg_http_tenant_requests_total";
pub const HTTP_REFUSALS: &str = "smg_http_refusals_total";
pub const HTTP_CONNECTIONS: &str = "smg_http_connections";
pub const HTTP_CONNECTIONS_CLOSED: &str = "smg_http_connections_closed_total";
pub const WORKER_CONNECTIONS: &str = "smg_worker_connections";
pub const WORKER_CONNECTS: &str = "smg_worker_connects_total";
pub const WORKER_RESENDS: &str = "smg_worker_resends_total";
pub const PANIC_ROUTING: &str = "smg_worker_panic_routing_total";
pub const CIRCUIT_PROBES: &str = "smg_worker_cb_probes_total";
pub const WORKER_PROTOCOL_VIOLATIONS: &str = "smg_worker_protocol_violations_total";
pub const TENSOR_LANE_TENSORS: &str = "smg_tensor_lane_tensors_total";
pub const TENSOR_LANE_BYTES: &str = "smg_tensor_lane_bytes_total";
pub const TENSOR_LANE_FALLBACKS: &str = "smg_tensor_lane_fallbacks_total";
pub const SHM_SLOTS_IN_USE: &str = "smg_shm_slots_in_use";
/// A gauge (the slots the pools hold), so not `_total`.
pub const SHM_SLOTS: &str = "smg_shm_slots";
pub const TLS_RELOADS: &str = "smg_tls_reloads_total";
pub const HISTORY_DURATION: &str = "smg_history_operation_duration_seconds";
pub const HISTORY_ERRORS: &str = "smg_history_errors_total";
pub const RESPONSES_STORED: &str = "smg_history_responses_stored_total";
pub const ORPHANS_ENDED: &str = "smg_history_orphans_ended_total";

/// What a family is, as Prometheus types it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    /// The `# TYPE` word.
    pub fn prometheus_type(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric family: its name, kind and `# HELP` text.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
}

const fn family(name: &'static str, kind: Kind, help: &'static str) -> Family {
    Family { name, kind, help }
}

/// Every family the gateway exports.
pub const FAMILIES: &[Family] = &[
    family(
        REQUESTS_TOTAL,
        Kind::Counter,
        "Requests answered, by router mode, endpoint and model.",
    ),
    family(
        REQUEST_DURATION,
        Kind::Histogram,
        "Time from a request's arrival to its last byte, in seconds.",
    ),
    family(
        REQUEST_ERRORS,
        Kind::Counter,
        "Requests that failed, by router mode, endpoint and error code.",
    ),
    family(
        TTFT,
        Kind::Histogram,
        "Time to the first token, in seconds.",
    ),
    family(
        TPOT,
        Kind::Histogram,
        "Time per output token after the first, in seconds.",
    ),
    family(
        WORKER_SELECTION,
        Kind::Counter,
        "Workers chosen by a policy, by worker, role and policy.",
    ),
    family(
        RETRIES,
        Kind::Counter,
        "Attempts retried, by router mode and the error code that failed the attempt.",
    ),
    family(
        PD_LEGS_START,
        Kind::Histogram,
        "Time to start a PD or EPD request's engine calls, in seconds.",
    ),
    family(
        ENCODE_DURATION,
        Kind::Histogram,
        "Duration of Encode calls to encode workers (EPD), in seconds.",
    ),
    family(
        WORKER_HEALTH,
        Kind::Gauge,
        "1 for the worker's current health state (pending, ready, not_ready, failed), 0 for the others.",
    ),
    family(
        BREAKER_STATE,
        Kind::Gauge,
        "The worker's circuit breaker: 0 closed, 1 open, 2 half-open.",
    ),
    family(
        BREAKER_TRANSITIONS,
        Kind::Counter,
        "Circuit breaker transitions, by the state entered.",
    ),
    family(
        LOAD_READINGS,
        Kind::Counter,
        "Fresh GetLoads readings received, by worker and role.",
    ),
    family(
        LOAD_AGE,
        Kind::Gauge,
        "Age of the worker's latest GetLoads reading after each poll round, in seconds (+Inf before the first).",
    ),
    family(
        ADMISSION_IN_FLIGHT,
        Kind::Gauge,
        "Inference requests admitted and not yet answered (--max-concurrent-requests).",
    ),
    family(
        ADMISSION_QUEUE_DEPTH,
        Kind::Gauge,
        "Inference requests waiting for an admission slot (--queue-size).",
    ),
    family(
        CPU_WORK_RUNNING,
        Kind::Gauge,
        "CPU-heavy request work running on the blocking pool, off the request threads: parsing or converting a body over 64 KiB (chat tools, a Responses input and history), rendering a chat template past its first fuel budget, tokenizing over 64 KiB of text, freeing what these built.",
    ),
    family(
        CPU_WORK_WAITING,
        Kind::Gauge,
        "CPU-heavy request work (large bodies, tools, Responses inputs and history, templates past their first budget, long prompts) waiting for one of the gate's slots (one per CPU).",
    ),
    family(
        ADMISSION_WAIT,
        Kind::Histogram,
        "Time a request waited for an admission slot, admitted or not, in seconds.",
    ),
    family(
        ADMISSION_REFUSALS,
        Kind::Counter,
        "Requests admission refused, by reason (queue_full, queue_timeout, rate_limited) and priority.",
    ),
    family(
        TENANT_REQUESTS,
        Kind::Counter,
        "Inference requests answered, by tenant and HTTP status.",
    ),
    family(
        HTTP_REFUSALS,
        Kind::Counter,
        "Requests or connections the front door refused, by error code.",
    ),
    family(
        HTTP_CONNECTIONS,
        Kind::Gauge,
        "Connections open, by listener.",
    ),
    family(
        HTTP_CONNECTIONS_CLOSED,
        Kind::Counter,
        "Connections the gateway closed, by listener and reason.",
    ),
    family(
        WORKER_CONNECTIONS,
        Kind::Gauge,
        "HTTP/2 connections open to the worker (its pool's slots).",
    ),
    family(
        WORKER_CONNECTS,
        Kind::Counter,
        "Connects to a worker, by outcome (connected, failed, backoff).",
    ),
    family(
        WORKER_RESENDS,
        Kind::Counter,
        "Calls a worker never saw (GOAWAY, REFUSED_STREAM), sent again.",
    ),
    family(
        PANIC_ROUTING,
        Kind::Counter,
        "Requests routed in panic mode (too few of the role's workers available), by role.",
    ),
    family(
        CIRCUIT_PROBES,
        Kind::Counter,
        "Health probes of open circuits, by outcome (healthy, failed).",
    ),
    family(
        WORKER_PROTOCOL_VIOLATIONS,
        Kind::Counter,
        "What workers sent that they must not have, repaired or refused, by worker and kind.",
    ),
    family(
        TENSOR_LANE_TENSORS,
        Kind::Counter,
        "Image tensors sent to workers, by lane (inline, shm, rdma).",
    ),
    family(
        TENSOR_LANE_BYTES,
        Kind::Counter,
        "Image tensor bytes sent to workers, by lane.",
    ),
    family(
        TENSOR_LANE_FALLBACKS,
        Kind::Counter,
        "Tensors sent on another lane than asked for, by the lane asked for and reason.",
    ),
    family(
        SHM_SLOTS_IN_USE,
        Kind::Gauge,
        "shm lane slots being written or published to a worker.",
    ),
    family(
        SHM_SLOTS,
        Kind::Gauge,
        "shm lane slots in the data-plane cores' pools.",
    ),
    family(
        smg_dataplane::lanes::rdma::SLOTS_IN_USE_METRIC,
        Kind::Gauge,
        "RDMA arena slots being written or published.",
    ),
    family(
        smg_dataplane::lanes::rdma::SLOTS_METRIC,
        Kind::Gauge,
        "RDMA arena slots.",
    ),
    family(
        TLS_RELOADS,
        Kind::Counter,
        "Certificate reloads on SIGHUP, by outcome (ok, failed).",
    ),
    family(
        HISTORY_DURATION,
        Kind::Histogram,
        "History store operations (Responses, conversations), by backend and operation.",
    ),
    family(
        HISTORY_ERRORS,
        Kind::Counter,
        "History store operations that failed, by backend and operation.",
    ),
    family(
        RESPONSES_STORED,
        Kind::Counter,
        "Responses written to the history store, by backend and status.",
    ),
    family(
        ORPHANS_ENDED,
        Kind::Counter,
        "Responses a stopped gateway left in flight, ended as failed (response_orphaned), by backend and by whom (restart: its own next start; lease: a replica, once its lease ran out).",
    ),
];

/// Latency buckets (seconds) for every histogram.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0,
];

/// The name prefix of the families about workers, kept in
/// [`WorkerSeries`]: counters and gauges only.
const WORKER_PREFIX: &str = "smg_worker_";

/// Whether the family `name` is about workers.
fn about_workers(name: &str) -> bool {
    name.starts_with(WORKER_PREFIX)
}

/// The worker families' series, once [`install`] ran.
static WORKER_SERIES: OnceLock<WorkerSeries> = OnceLock::new();

/// What `/metrics` serves: the exporter's families, then the workers'.
#[derive(Debug, Clone)]
pub struct MetricsHandle {
    exporter: PrometheusHandle,
    workers: &'static WorkerSeries,
}

impl MetricsHandle {
    /// The Prometheus text of every series.
    pub fn render(&self) -> String {
        let mut text = self.exporter.render();
        self.workers.render(&mut text);
        text
    }
}

/// How often the exporter folds the histogram observations it holds into
/// their buckets when no scrape did (see [`start_upkeep`]).
pub const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Installs the global recorder (the Prometheus exporter, with the worker
/// families in [`WorkerSeries`]), describes every family and starts the
/// exporter's upkeep; call once at start-up.
pub fn install() -> Result<MetricsHandle, String> {
    let exporter = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), LATENCY_BUCKETS)
        .map_err(|err| err.to_string())?
        .build_recorder();
    let handle = exporter.handle();
    start_upkeep(handle.clone());
    let workers = WORKER_SERIES.get_or_init(WorkerSeries::default);
    metrics::set_global_recorder(Split { exporter, workers }).map_err(|err| err.to_string())?;
    for family in FAMILIES {
        match family.kind {
            Kind::Counter => metrics::describe_counter!(family.name, family.help),
            Kind::Gauge => metrics::describe_gauge!(family.name, family.help),
            Kind::Histogram => metrics::describe_histogram!(family.name, family.help),
        }
    }
    Ok(MetricsHandle {
        exporter: handle,
        workers,
    })
}

/// The exporter keeps every histogram observation (a few per request) until
/// it is folded into the histogram's buckets, which a scrape of `/metrics`
/// does; a gateway nobody scrapes would hold them all. A thread of its own
/// folds them every [`UPKEEP_INTERVAL`], as the exporter's own `build()`
/// would (`build_recorder`, which lets the worker families be split off,
/// starts no upkeep).
fn start_upkeep(exporter: PrometheusHandle) {
    let started = std::thread::Builder::new()
        .name("smg-metrics".to_owned())
        .spawn(move || {
            loop {
                std::thread::sleep(UPKEEP_INTERVAL);
                exporter.run_upkeep();
            }
        });
    if let Err(err) = started {
        tracing::warn!(%err, "no metrics upkeep thread: histogram observations wait for a scrape");
    }
}

/// The global recorder: the worker families go to [`WorkerSeries`], the
/// rest to the Prometheus exporter.
struct Split {
    exporter: PrometheusRecorder,
    workers: &'static WorkerSeries,
}

impl Recorder for Split {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        // The worker families' help comes from [`FAMILIES`] when rendered.
        if !about_workers(key.as_str()) {
            self.exporter.describe_counter(key, unit, description);
        }
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        if !about_workers(key.as_str()) {
            self.exporter.describe_gauge(key, unit, description);
        }
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.exporter.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        if about_workers(key.name()) {
            return self.workers.counter(key);
        }
        self.exporter.register_counter(key, metadata)
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        if about_workers(key.name()) {
            return self.workers.gauge(key);
        }
        self.exporter.register_gauge(key, metadata)
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        self.exporter.register_histogram(key, metadata)
    }
}

/// The series of the worker families, and the holds on each worker URL's
/// series.
#[derive(Debug)]
struct WorkerSeries {
    registry: Registry<Key, AtomicStorage>,
    /// How many holds each worker URL has.
    holds: Mutex<HashMap<Arc<str>, usize>>,
}

impl Default for WorkerSeries {
    fn default() -> Self {
        Self {
            registry: Registry::atomic(),
            holds: Mutex::new(HashMap::new()),
        }
    }
}

impl WorkerSeries {
    fn counter(&self, key: &Key) -> Counter {
        self.registry
            .get_or_create_counter(key, |counter| Counter::from_arc(Arc::clone(counter)))
    }

    fn gauge(&self, key: &Key) -> Gauge {
        self.registry
            .get_or_create_gauge(key, |gauge| Gauge::from_arc(Arc::clone(gauge)))
    }

    fn holds(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, usize>> {
        self.holds.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn hold(&self, url: &Arc<str>) {
        *self.holds().entry(Arc::clone(url)).or_default() += 1;
    }

    /// One hold on `url` let go; the last takes its series with it.
    fn release(&self, url: &str) {
        let mut holds = self.holds();
        let Some(count) = holds.get_mut(url) else {
            return;
        };
        *count -= 1;
        if *count == 0 {
            holds.remove(url);
            // Under the lock: a hold taken meanwhile waits, and its
            // worker's series are recorded after this.
            self.forget(url);
        }
    }

    /// Removes every series labelled `worker=url`, and those of its
    /// data-parallel ranks (`worker=url@rank`).
    fn forget(&self, url: &str) {
        let of_url = |value: &str| {
            value.strip_prefix(url).is_some_and(|rest| {
                rest.is_empty()
                    || rest
                        .strip_prefix('@')
                        .is_some_and(|rank| rank.bytes().all(|b| b.is_ascii_digit()))
            })
        };
        let other = |key: &Key| {
            !key.labels()
                .any(|label| label.key() == "worker" && of_url(label.value()))
        };
        self.registry.retain_counters(|key, _| other(key));
        self.registry.retain_gauges(|key, _| other(key));
    }

    /// Appends the series in the Prometheus text format, one block per
    /// family as the exporter writes them, sorted.
    fn render(&self, text: &mut String) {
        let mut families: BTreeMap<String, (Kind, Vec<(String, String)>)> = BTreeMap::new();
        let mut add = |key: &Key, kind: Kind, value: String| {
            let labels = key
                .labels()
                .map(|label| {
                    format!(
                        "{}=\"{}\"",
                        sanitize_label_key(label.key()),
                        sanitize_label_value(label.value())
                    )
                })
                .collect::<Vec<_>>()
                .join(",");
            families
                .entry(key.name().to_owned())
                .or_insert_with(|| (kind, Vec::new()))
                .1
                .push((labels, value));
        };
        self.registry.visit_counters(|key, counter| {
            add(
                key,
                Kind::Counter,
                counter.load(Ordering::Acquire).to_string(),
            );
        });
        self.registry.visit_gauges(|key, gauge| {
            let value = f64::from_bits(gauge.load(Ordering::Acquire));
            add(key, Kind::Gauge, value.to_string());
        });
        for (name, (kind, mut series)) in families {
            series.sort();
            if let Some(family) = FAMILIES.iter().find(|family| family.name == name) {
                write_help_line(text, &name, None, None, family.help);
            }
            write_type_line(text, &name, None, None, kind.prometheus_type());
            for (labels, value) in series {
                text.push_str(&name);
                if !labels.is_empty() {
                    text.push('{');
                    text.push_str(&labels);
                    text.push('}');
                }
                text.push(' ');
                text.push_str(&value);
                text.push('\n');
            }
            text.push('\n');
        }
    }
}

/// A hold on the series labelled with one worker URL: they stay while any
/// hold on the URL exists and go when the last is dropped. Each worker
/// (each data-parallel rank) holds one for as long as it exists, and each
/// registration while it runs or its failure is listed. Before
/// [`install`] (in unit tests) it holds nothing.
#[derive(Debug)]
pub struct WorkerSeriesHold {
    url: Arc<str>,
    series: Option<&'static WorkerSeries>,
}

impl WorkerSeriesHold {
    pub fn new(url: &str) -> Self {
        let url: Arc<str> = Arc::from(url);
        let series = WORKER_SERIES.get();
        if let Some(series) = series {
            series.hold(&url);
        }
        Self { url, series }
    }
}

impl Clone for WorkerSeriesHold {
    fn clone(&self) -> Self {
        Self::new(&self.url)
    }
}

impl Drop for WorkerSeriesHold {
    fn drop(&mut self) {
        if let Some(series) = self.series {
            series.release(&self.url);
        }
    }
}

/// One finished request.
pub fn record_request(
    router: &'static str,
    endpoint: &'static str,
    model: &str,
    elapsed: Duration,
) {
    let labels = [
        ("router", router.to_owned()),
        ("endpoint", endpoint.to_owned()),
        ("model", model.to_owned()),
    ];
    metrics::counter!(REQUESTS_TOTAL, &labels).increment(1);
    metrics::histogram!(REQUEST_DURATION, &labels).record(elapsed.as_secs_f64());
}

/// One history store operation and whether it failed.
pub fn record_history(backend: &'static str, operation: &'static str, elapsed: Duration, ok: bool) {
    let labels = [("backend", backend), ("operation", operation)];
    metrics::histogram!(HISTORY_DURATION, &labels).record(elapsed.as_secs_f64());
    if !ok {
        metrics::counter!(HISTORY_ERRORS, &labels).increment(1);
    }
}

/// One response stored.
pub fn record_response_stored(backend: &'static str, status: &'static str) {
    metrics::counter!(RESPONSES_STORED, "backend" => backend, "status" => status).increment(1);
}

/// `count` responses left in flight by a stopped gateway ended, `by` its
/// own restart or by a replica once its lease ran out (a zero count makes
/// the series show from start-up).
pub fn record_orphans_ended(backend: &'static str, by: &'static str, count: u64) {
    metrics::counter!(ORPHANS_ENDED, "backend" => backend, "by" => by).increment(count);
}

/// One failed request, by its stable error code.
pub fn record_error(router: &'static str, endpoint: &'static str, code: &'static str) {
    metrics::counter!(REQUEST_ERRORS, "router" => router, "endpoint" => endpoint, "code" => code)
        .increment(1);
}

pub fn record_ttft(router: &'static str, elapsed: Duration) {
    metrics::histogram!(TTFT, "router" => router).record(elapsed.as_secs_f64());
}

pub fn record_tpot(router: &'static str, per_token: Duration) {
    metrics::histogram!(TPOT, "router" => router).record(per_token.as_secs_f64());
}

pub fn record_selection(worker: &str, role: &'static str, policy: &'static str) {
    metrics::counter!(WORKER_SELECTION, "worker" => worker.to_owned(), "role" => role, "policy" => policy)
        .increment(1);
}

pub fn record_retry(router: &'static str, code: &'static str) {
    metrics::counter!(RETRIES, "router" => router, "code" => code).increment(1);
}

pub fn record_encode(elapsed: Duration) {
    metrics::histogram!(ENCODE_DURATION).record(elapsed.as_secs_f64());
}

pub fn record_pd_legs_start(router: &'static str, elapsed: Duration) {
    metrics::histogram!(PD_LEGS_START, "router" => router).record(elapsed.as_secs_f64());
}

/// A worker's health changed: a 0/1 gauge per state (the current one is 1).
pub fn record_health(worker: &str, role: &'static str, state: &'static str) {
    for name in ["pending", "ready", "not_ready", "failed"] {
        metrics::gauge!(WORKER_HEALTH, "worker" => worker.to_owned(), "role" => role, "state" => name)
            .set(if name == state { 1.0 } else { 0.0 });
    }
}

/// A worker's circuit breaker changed state.
pub fn record_breaker(worker: &str, role: &'static str, state: &'static str) {
    set_breaker_state(worker, role, state);
    metrics::counter!(BREAKER_TRANSITIONS, "worker" => worker.to_owned(), "role" => role, "to" => state)
        .increment(1);
}

fn set_breaker_state(worker: &str, role: &'static str, state: &'static str) {
    let code = match state {
        "closed" => 0.0,
        "open" => 1.0,
        _ => 2.0,
    };
    metrics::gauge!(BREAKER_STATE, "worker" => worker.to_owned(), "role" => role).set(code);
}

/// A worker joined the fleet: its health and circuit gauges show from now
/// on, before any request or state change.
pub fn record_worker_joined(
    worker: &str,
    role: &'static str,
    health: &'static str,
    breaker: &'static str,
) {
    record_health(worker, role, health);
    set_breaker_state(worker, role, breaker);
}

/// The HTTP/2 connections (pool slots) the gateway keeps to a worker.
pub fn record_worker_connections(worker: &str, connections: usize) {
    metrics::gauge!(WORKER_CONNECTIONS, "worker" => worker.to_owned()).set(connections as f64);
}

/// A connect to a worker: `connected`, `failed`, or `backoff` (refused
/// without dialling: the last connect failed recently).
pub fn record_worker_connect(worker: &str, outcome: &'static str) {
    metrics::counter!(WORKER_CONNECTS, "worker" => worker.to_owned(), "outcome" => outcome)
        .increment(1);
}

/// A call the worker never saw (GOAWAY, REFUSED_STREAM) was sent again.
pub fn record_resend(worker: &str) {
    metrics::counter!(WORKER_RESENDS, "worker" => worker.to_owned()).increment(1);
}

/// A request of `role` was routed in panic mode: too few of the role's
/// workers were available, so all of them were candidates.
pub fn record_panic_routing(role: &'static str) {
    metrics::counter!(PANIC_ROUTING, "role" => role).increment(1);
}

/// An open circuit's health probe: `healthy` (the circuit turns half-open)
/// or `failed`.
pub fn record_circuit_probe(worker: &str, outcome: &'static str) {
    metrics::counter!(CIRCUIT_PROBES, "worker" => worker.to_owned(), "outcome" => outcome)
        .increment(1);
}

/// How old the worker's latest `GetLoads` reading is after a poll round
/// (+Inf before the first reading): a growing age means policies fall back
/// to in-flight counts.
pub fn record_load_age(worker: &str, role: &'static str, age: Option<Duration>) {
    let seconds = age.map_or(f64::INFINITY, |age| age.as_secs_f64());
    metrics::gauge!(LOAD_AGE, "worker" => worker.to_owned(), "role" => role).set(seconds);
}

/// A fresh `GetLoads` reading arrived (its age is 0 now).
pub fn record_load_reading(worker: &str, role: &'static str) {
    metrics::counter!(LOAD_READINGS, "worker" => worker.to_owned(), "role" => role).increment(1);
}

/// Admission's occupancy after a change: requests served and waiting.
pub fn record_admission(in_flight: usize, waiting: usize) {
    metrics::gauge!(ADMISSION_IN_FLIGHT).set(in_flight as f64);
    metrics::gauge!(ADMISSION_QUEUE_DEPTH).set(waiting as f64);
}

/// How long a queued request waited, admitted or not.
/// Prompt work off the request threads: running, and waiting for a slot.
pub fn record_cpu_work(running: usize, waiting: usize) {
    metrics::gauge!(CPU_WORK_RUNNING).set(running as f64);
    metrics::gauge!(CPU_WORK_WAITING).set(waiting as f64);
}

pub fn record_admission_wait(waited: Duration, priority: &'static str) {
    metrics::histogram!(ADMISSION_WAIT, "priority" => priority).record(waited.as_secs_f64());
}

/// A request admission refused: `queue_full`, `queue_timeout` or
/// `rate_limited`.
pub fn record_admission_refusal(reason: &'static str, priority: &'static str) {
    metrics::counter!(ADMISSION_REFUSALS, "reason" => reason, "priority" => priority).increment(1);
}

/// An inference request answered for `tenant` (the key's tenant, or
/// `anonymous` without keys), by its HTTP status.
pub fn record_tenant_request(tenant: &str, status: u16) {
    metrics::counter!(TENANT_REQUESTS, "tenant" => tenant.to_owned(), "status" => status.to_string())
        .increment(1);
}

/// The front door refused a request or connection, by its error code
/// (`invalid_api_key`, `payload_too_large`, `too_many_connections`, ...).
pub fn record_refusal(code: &'static str) {
    metrics::counter!(HTTP_REFUSALS, "code" => code).increment(1);
}

/// Connections open on a listener (`public` or `admin`).
pub fn record_connections(listener: &'static str, open: usize) {
    metrics::gauge!(HTTP_CONNECTIONS, "listener" => listener).set(open as f64);
}

/// A connection the gateway closed on a timer: `header_read` (its client
/// was too slow to send a request head) or `keep_alive` (idle too long).
pub fn record_connection_closed(listener: &'static str, reason: &'static str) {
    metrics::counter!(HTTP_CONNECTIONS_CLOSED, "listener" => listener, "reason" => reason)
        .increment(1);
}

/// What a worker sent that it must not have: the `kind` label of
/// [`WORKER_PROTOCOL_VIOLATIONS`]. The gateway repairs some (cuts a
/// sequence, drops alternatives) and refuses the rest; either way the
/// worker is counted, so a buggy or hostile engine shows on a dashboard
/// even when every client got a correct answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProtocolViolation {
    /// A sequence went past the tokens asked for (`max_tokens`, else the
    /// context left after the prompt): cut there, finished as `length`.
    TokenOverrun,
    /// More logprob alternatives per token than asked: truncated.
    LogprobAlternatives,
    /// Logprobs nobody asked for: dropped.
    UnaskedLogprobs,
    /// Logprob arrays whose lengths disagree with each other or with the
    /// tokens they describe: refused.
    LogprobShape,
    /// A sequence index outside the request's `n`: refused.
    SequenceIndex,
    /// Tokens or a completion for a sequence the worker already completed:
    /// dropped.
    AfterCompletion,
    /// A Generate message with neither a chunk nor a completion: refused.
    EmptyMessage,
    /// An embedding whose length disagrees with its dimension, or past the
    /// dimension cap: refused.
    EmbeddingShape,
    /// More data-parallel ranks than `--max-dp-ranks`: registration refused.
    DpRanks,
    /// A tokenizer archive past its download cap: refused.
    TokenizerArchive,
    /// A message larger than any answer to the request can need (its
    /// length prefix, read before the message is decoded): refused.
    MessageSize,
}

impl ProtocolViolation {
    /// Every kind, for documentation and tests.
    pub const ALL: [ProtocolViolation; 11] = [
        ProtocolViolation::TokenOverrun,
        ProtocolViolation::LogprobAlternatives,
        ProtocolViolation::UnaskedLogprobs,
        ProtocolViolation::LogprobShape,
        ProtocolViolation::SequenceIndex,
        ProtocolViolation::AfterCompletion,
        ProtocolViolation::EmptyMessage,
        ProtocolViolation::EmbeddingShape,
        ProtocolViolation::DpRanks,
        ProtocolViolation::TokenizerArchive,
        ProtocolViolation::MessageSize,
    ];

    /// The `kind` label.
    pub const fn label(self) -> &'static str {
        match self {
            ProtocolViolation::TokenOverrun => "token_overrun",
            ProtocolViolation::LogprobAlternatives => "logprob_alternatives",
            ProtocolViolation::UnaskedLogprobs => "unasked_logprobs",
            ProtocolViolation::LogprobShape => "logprob_shape",
            ProtocolViolation::SequenceIndex => "sequence_index",
            ProtocolViolation::AfterCompletion => "after_completion",
            ProtocolViolation::EmptyMessage => "empty_message",
            ProtocolViolation::EmbeddingShape => "embedding_shape",
            ProtocolViolation::DpRanks => "dp_ranks",
            ProtocolViolation::TokenizerArchive => "tokenizer_archive",
            ProtocolViolation::MessageSize => "message_size",
        }
    }
}

/// A worker broke the protocol (repaired or refused).
pub fn record_protocol_violation(worker: &str, kind: ProtocolViolation) {
    metrics::counter!(WORKER_PROTOCOL_VIOLATIONS, "worker" => worker.to_owned(), "kind" => kind.label())
        .increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prometheus's naming rules for the table: snake_case under `smg_`,
    /// counters and only counters ending in `_total`, one row per name.
    #[test]
    fn families_follow_prometheus_naming() {
        let mut seen = std::collections::HashSet::new();
        for family in FAMILIES {
            let name = family.name;
            assert!(seen.insert(name), "{name} twice");
            assert!(name.starts_with("smg_"), "{name}");
            assert!(
                name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{name}"
            );
            assert_eq!(
                name.ends_with("_total"),
                family.kind == Kind::Counter,
                "{name}: counters, and only counters, end in _total"
            );
            assert!(family.help.ends_with('.'), "{name}: a sentence");
        }
    }

    /// The worker store keeps counters and gauges only, and every family
    /// labelled by worker lives there (so it can leave with the worker).
    #[test]
    fn worker_families_are_counters_or_gauges() {
        for family in FAMILIES.iter().filter(|family| about_workers(family.name)) {
            assert_ne!(family.kind, Kind::Histogram, "{}", family.name);
        }
        for name in [
            WORKER_SELECTION,
            WORKER_HEALTH,
            BREAKER_STATE,
            BREAKER_TRANSITIONS,
            LOAD_READINGS,
            LOAD_AGE,
            WORKER_CONNECTIONS,
            WORKER_CONNECTS,
            WORKER_RESENDS,
            CIRCUIT_PROBES,
            WORKER_PROTOCOL_VIOLATIONS,
        ] {
            assert!(about_workers(name), "{name} is labelled by worker");
        }
    }

    fn key(name: &'static str, worker: &str) -> Key {
        Key::from_parts(
            name,
            vec![
                metrics::Label::new("worker", worker.to_owned()),
                metrics::Label::new("role", "regular"),
            ],
        )
    }

    #[test]
    fn a_worker_urls_series_go_with_its_last_hold_and_no_one_elses() {
        let series = WorkerSeries::default();
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("grpc://h:1"), Arc::from("grpc://h:10"));
        series.gauge(&key(WORKER_HEALTH, &a)).set(1.0);
        series.counter(&key(WORKER_CONNECTS, &a)).increment(3);
        series.gauge(&key(LOAD_AGE, &b)).set(f64::INFINITY);
        series.counter(&key(WORKER_CONNECTS, &b)).increment(1);
        series
            .counter(&Key::from_parts(
                PANIC_ROUTING,
                vec![metrics::Label::new("role", "decode")],
            ))
            .increment(1);
        // Two holds on `a` (two data-parallel ranks), one on `b`.
        series.hold(&a);
        series.hold(&a);
        series.hold(&b);
        series.release(&a);
        let mut text = String::new();
        series.render(&mut text);
        assert!(text.contains("worker=\"grpc://h:1\""), "{text}");

        series.release(&a);
        let mut text = String::new();
        series.render(&mut text);
        assert!(!text.contains("worker=\"grpc://h:1\""), "{text}");
        assert!(
            text.contains("smg_worker_connects_total{worker=\"grpc://h:10\",role=\"regular\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "smg_worker_load_age_seconds{worker=\"grpc://h:10\",role=\"regular\"} inf\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("smg_worker_panic_routing_total{role=\"decode\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("# HELP smg_worker_connects_total Connects to a worker")
                && text.contains("# TYPE smg_worker_connects_total counter\n")
                && text.contains("# TYPE smg_worker_load_age_seconds gauge\n"),
            "{text}"
        );
        assert!(!text.contains("smg_worker_health_state"), "{text}");

        // A URL held again records afresh.
        series.hold(&a);
        series.gauge(&key(WORKER_HEALTH, &a)).set(1.0);
        let mut text = String::new();
        series.render(&mut text);
        assert!(
            text.contains("smg_worker_health_state{worker=\"grpc://h:1\""),
            "{text}"
        );
    }

    #[test]
    fn violation_labels_are_unique_snake_case() {
        let mut seen = std::collections::HashSet::new();
        for kind in ProtocolViolation::ALL {
            let label = kind.label();
            assert!(seen.insert(label), "duplicate {label}");
            assert!(
                label.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{label}"
            );
        }
    }
}
