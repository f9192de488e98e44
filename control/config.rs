//! The gateway's configuration: typed, validated once, read everywhere.
//!
//! Why it exists: flags are a user interface, not a data structure. `cli`
//! turns `smg launch`'s flags (and a `--config` file) into one
//! [`GatewayConfig`], checking and clamping each value exactly once; from
//! there on, start-up (`server`), the model table and every subsystem read
//! the part they own — the lanes their [`LaneSettings`], the workers their
//! [`Lifecycle`], the router its [`RoutingConfig`] — and nothing below
//! `server` knows a flag exists. `smg demo` builds one directly.
//!
//! The parts are the subsystems' own config types, gathered here; this
//! module adds only what belongs to no single subsystem (listeners, the
//! fleet, where the model comes from, logging).

pub use crate::pipeline::parsing::ParserSettings;
pub use smg_history::HistoryConfig;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use smg_dataplane::IoBackend;
use smg_dataplane::runtime::{CorePlan, DataPlaneConfig};

use crate::admission::AdmissionConfig;
use crate::engine::Runtime;
use crate::lanes::LaneSettings;
use crate::mcp::McpConfig;
use crate::media::MediaConfig;
use crate::mode::Mode;
use crate::pipeline::stages::RolePolicies;
use crate::policies::{PolicyKind, PolicyTunables};
use crate::router::RetryConfig;
use crate::tokenizer::TemplateBudget;
use crate::workers::{Lifecycle, WorkerRole};

/// Everything `smg launch` needs, from listeners to log format.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    pub listen: ListenConfig,
    /// Who may call, how much they may send, request ids and CORS.
    pub front: FrontDoorConfig,
    pub fleet: FleetConfig,
    /// TLS to `grpcs://` workers.
    pub worker_tls: WorkerTlsFiles,
    /// The engine protocol; `None`: probed from the first worker (static
    /// fleets) or TokenSpeed unless a registration says otherwise (IGW).
    pub runtime: Option<Runtime>,
    pub model: ModelSource,
    /// How chat output is parsed into reasoning and tool calls.
    pub parsers: ParserSettings,
    /// Where stored responses and conversations are kept.
    pub history: HistoryConfig,
    /// This gateway's name in the history store (`--history-instance`):
    /// the owner of the responses it runs in the background. `None`: the
    /// host name and the bound port (`HOSTNAME:PORT`).
    pub history_instance: Option<String>,
    pub routing: RoutingConfig,
    pub lifecycle: Lifecycle,
    pub lanes: LaneSettings,
    pub media: MediaConfig,
    /// The MCP servers of Responses requests' `mcp` tools: where they may
    /// be, how long they get.
    pub mcp: McpConfig,
    /// How much work the gateway takes on at once, and who waits.
    pub admission: AdmissionConfig,
    pub dataplane: DataPlaneSettings,
    /// The nice value of the threads doing CPU-heavy request work
    /// (`--cpu-work-nice`; `crate::offload`).
    pub cpu_work_nice: u8,
    /// How the gateway waits for the workers named at start-up.
    pub startup: StartupConfig,
    /// How the gateway stops on SIGTERM.
    pub shutdown: ShutdownConfig,
    pub log: LogConfig,
    /// WARNs to log at start-up: SMG flags given that have no effect here.
    pub warnings: Vec<String>,
}

/// How start-up waits for the workers named on the command line: workers
/// not up yet do not stop the gateway; it serves (`/readiness` 503) and
/// keeps trying to reach them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartupConfig {
    /// How long to keep trying; then workers still unreachable are given
    /// up on, and the gateway exits if a role it needs has none.
    pub timeout: Duration,
    /// Pause before the first attempt.
    pub delay: Duration,
    /// The first pause between two attempts to reach a worker...
    pub first_backoff: Duration,
    /// ...doubling up to this.
    pub max_backoff: Duration,
}

impl StartupConfig {
    /// The first pause between two attempts.
    pub const FIRST_BACKOFF: Duration = Duration::from_millis(250);
}

impl Default for StartupConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(1800),
            delay: Duration::ZERO,
            first_backoff: Self::FIRST_BACKOFF,
            max_backoff: Duration::from_secs(30),
        }
    }
}

/// Where the HTTP API, the admin routes and the Prometheus exporter listen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenConfig {
    pub host: String,
    pub port: u16,
    pub metrics_host: String,
    pub metrics_port: u16,
    /// Another listener of the probes (and /metrics) on `metrics_host`
    /// (`--health-check-port`).
    pub probe_port: Option<u16>,
    /// The admin listener, opened only when no control-plane key is
    /// configured (with keys, admin routes are served on the public
    /// listener behind them).
    pub admin_host: String,
    pub admin_port: u16,
    /// HTTPS on the public and admin listeners (the metrics listener stays
    /// plain HTTP); `None`: plain HTTP.
    pub tls: Option<TlsFiles>,
}

/// A PEM certificate chain (leaf first) and its PEM private key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
}

/// What the gateway dials `grpcs://` workers with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerTlsFiles {
    /// PEM CA certificates workers' certificates must chain to; empty: the
    /// public web PKI roots.
    pub ca_cert_paths: Vec<PathBuf>,
    /// The gateway's own certificate and key, for workers that ask for one
    /// (mTLS).
    pub client: Option<TlsFiles>,
}

/// The HTTP front door: everything decided about a request before a
/// handler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontDoorConfig {
    pub auth: AuthConfig,
    pub limits: HttpLimits,
    /// Header names a client's request id is read from, in order of
    /// preference (lowercase, valid header names).
    pub request_id_headers: Vec<String>,
    pub cors: CorsPolicy,
}

/// API keys. Empty lists mean no key is asked for (inference) or admin
/// routes stay on the admin listener (control plane).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthConfig {
    /// Keys for the inference routes, each naming its tenant.
    pub api_keys: Vec<ApiKey>,
    /// Keys for the admin routes.
    pub control_plane_keys: Vec<ControlPlaneKey>,
}

/// An inference key and the tenant it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    pub tenant: String,
    pub digest: KeyDigest,
}

/// A control-plane key (`--control-plane-api-keys ID:NAME:ROLE:KEY`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlPlaneKey {
    /// Stable identifier, written to the audit log.
    pub id: String,
    /// Who holds it (a person or a system), written to the audit log.
    pub name: String,
    pub role: AdminRole,
    pub digest: KeyDigest,
}

/// What a control-plane key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminRole {
    /// Everything.
    Admin,
    /// Reads only (`GET`).
    Viewer,
}

impl AdminRole {
    pub fn name(self) -> &'static str {
        match self {
            AdminRole::Admin => "admin",
            AdminRole::Viewer => "viewer",
        }
    }
}

/// The BLAKE3 digest of a key: the configuration never holds a key itself,
/// so a printed config leaks nothing, and keys are compared by digest in
/// constant time.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyDigest(blake3::Hash);

impl KeyDigest {
    pub fn of(key: &str) -> Self {
        Self(blake3::hash(key.as_bytes()))
    }

    /// Whether both digests are of the same key. `blake3::Hash` compares in
    /// constant time, so the time taken says nothing of how much matched.
    pub fn matches(&self, other: &KeyDigest) -> bool {
        self.0 == other.0
    }
}

impl std::fmt::Debug for KeyDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyDigest(..)")
    }
}

/// Bounds on what one client may hold or send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Largest request body, in bytes.
    pub max_payload_bytes: usize,
    /// Largest request head (request line and headers), in bytes.
    pub max_header_bytes: usize,
    /// Time a client has to send a request's head, counted from the
    /// connection's accept or from the first byte of a later request.
    pub header_read_timeout: Duration,
    /// Time a connection with no request in flight stays open.
    pub keep_alive_timeout: Duration,
    /// Open connections per listener; more are answered 503 and closed.
    pub max_connections: usize,
}

/// Which browser origins may call the API (CORS).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CorsPolicy {
    /// No CORS headers: browsers refuse cross-origin calls.
    #[default]
    Off,
    /// `*`: any origin.
    AnyOrigin,
    /// These origins (`scheme://host[:port]`).
    Origins(Vec<String>),
}

/// How the gateway stops (see `shutdown`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownConfig {
    /// How long requests in flight may run after the first SIGTERM before
    /// their connections are dropped and their engine legs aborted.
    pub grace_period: Duration,
}

/// The workers the gateway starts with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FleetConfig {
    /// One model served in `mode` by the listed workers (at least one of
    /// each role the mode needs).
    Static {
        mode: Mode,
        workers: Vec<WorkerAddress>,
    },
    /// Several models, none at start: workers arrive through `POST /workers`.
    Igw,
}

/// A worker named at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerAddress {
    pub url: String,
    pub role: WorkerRole,
    /// The KV / embedding rendezvous port; asked of the worker when `None`
    /// and its role needs one.
    pub bootstrap_port: Option<u16>,
}

/// Where the tokenizer, chat template and model configs come from when the
/// workers are not asked, and what rendering the chat template may cost.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelSource {
    pub model_path: Option<PathBuf>,
    pub tokenizer_path: Option<PathBuf>,
    /// The name clients use; defaults to the workers' served name.
    pub served_model_name: Option<String>,
    /// `--chat-template`: replaces every served model's own template.
    pub chat_template: Option<ChatTemplateOverride>,
    /// The work one chat template rendering may do
    /// (`--chat-template-fuel`), whichever source the template comes from.
    pub template_budget: TemplateBudget,
}

/// A chat template file given by the operator, read (and checked to
/// compile) at start-up: a template that cannot load stops the gateway then,
/// not each request later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTemplateOverride {
    pub path: PathBuf,
    /// The file's text.
    pub source: String,
}

impl ModelSource {
    /// The local directory to load the tokenizer (and vision config) from,
    /// if one was given.
    pub fn tokenizer_dir(&self) -> Option<&Path> {
        self.tokenizer_path
            .as_deref()
            .or(self.model_path.as_deref())
    }

    /// Whether the model can be set up without the workers' help.
    pub fn is_local(&self) -> bool {
        self.tokenizer_dir().is_some()
    }
}

/// The routing policy of each role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyChoice {
    /// Regular workers, and the default of prefill and decode.
    pub default: PolicyKind,
    pub prefill: Option<PolicyKind>,
    pub decode: Option<PolicyKind>,
    pub encode: PolicyKind,
}

/// How requests are spread, retried and timed out.
#[derive(Debug, Clone)]
pub struct RoutingConfig {
    pub policies: PolicyChoice,
    pub tunables: PolicyTunables,
    /// Per model (IGW): a policy replacing `policies.default` and the
    /// prefill/decode choices.
    pub model_policies: HashMap<String, PolicyKind>,
    pub retry: RetryConfig,
    /// Per model (IGW): its retry count.
    pub model_retries: HashMap<String, u32>,
    /// The whole-request timeout.
    pub request_timeout: Duration,
    /// How often GetLoads is polled for load-aware policies.
    pub load_check_interval: Duration,
    /// Other names clients may use for a model (alias → model).
    pub aliases: HashMap<String, String>,
    /// Panic mode: below this percentage of available workers in a role,
    /// route across all of them (0: never).
    pub panic_threshold: u8,
}

impl RoutingConfig {
    /// Fresh policies for each role of `model` (its own state: policies
    /// remember routes).
    pub fn role_policies(&self, model: Option<&str>) -> RolePolicies {
        let model_policy = model.and_then(|name| self.model_policies.get(name).copied());
        let pick = |role_choice: Option<PolicyKind>| {
            model_policy
                .or(role_choice)
                .unwrap_or(self.policies.default)
                .build_with(&self.tunables)
        };
        RolePolicies {
            regular: pick(None),
            prefill: pick(self.policies.prefill),
            decode: pick(self.policies.decode),
            encode: self.policies.encode.build_with(&self.tunables),
            panic_threshold: self.panic_threshold,
        }
    }

    /// The retry settings of `model` (its `--model-max-retries`, if any).
    pub fn retry_for(&self, model: Option<&str>) -> RetryConfig {
        let mut retry = self.retry;
        if let Some(&max_retries) = model.and_then(|name| self.model_retries.get(name)) {
            retry.max_retries = max_retries;
        }
        retry
    }
}

/// The data plane's shape, before the cores are split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataPlaneSettings {
    /// Data-plane threads; `None`: a quarter of the cores, at least one.
    pub cores: Option<usize>,
    pub ring_capacity: usize,
    pub submit_wait: Duration,
    pub io: IoBackend,
}

impl DataPlaneSettings {
    /// The data plane to start on `plan`'s cores.
    pub fn for_plan(&self, plan: &CorePlan) -> DataPlaneConfig {
        DataPlaneConfig {
            ring_capacity: self.ring_capacity,
            submit_wait: self.submit_wait,
            io: self.io,
            ..DataPlaneConfig::for_plan(plan)
        }
    }
}

/// How the gateway logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// A `tracing` filter directive (`info`, `debug`, ...); `RUST_LOG` wins.
    pub level: &'static str,
    /// JSON lines instead of text.
    pub json: bool,
    /// When lines carry ANSI colour codes.
    pub color: crate::logging::LogColor,
    /// `--log-dir`: a directory where the lines also go, a file a day.
    pub dir: Option<std::path::PathBuf>,
}
