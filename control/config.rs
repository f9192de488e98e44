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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use smg_dataplane::IoBackend;
use smg_dataplane::runtime::{CorePlan, DataPlaneConfig};

use crate::admission::AdmissionConfig;
use crate::engine::Runtime;
use crate::lanes::LaneSettings;
use crate::media::MediaConfig;
use crate::mode::Mode;
use crate::pipeline::stages::RolePolicies;
use crate::policies::{PolicyKind, PolicyTunables};
use crate::router::RetryConfig;
use crate::workers::{Lifecycle, WorkerRole};

/// Everything `smg launch` needs, from listeners to log format.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    pub listen: ListenConfig,
    pub fleet: FleetConfig,
    /// The engine protocol; `None`: probed from the first worker (static
    /// fleets) or TokenSpeed unless a registration says otherwise (IGW).
    pub runtime: Option<Runtime>,
    pub model: ModelSource,
    pub routing: RoutingConfig,
    pub lifecycle: Lifecycle,
    pub lanes: LaneSettings,
    pub media: MediaConfig,
    /// How much work the gateway takes on at once, and who waits.
    pub admission: AdmissionConfig,
    pub dataplane: DataPlaneSettings,
    pub log: LogConfig,
}

/// Where the HTTP API and the Prometheus exporter listen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenConfig {
    pub host: String,
    pub port: u16,
    pub metrics_host: String,
    pub metrics_port: u16,
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
/// workers are not asked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelSource {
    pub model_path: Option<PathBuf>,
    pub tokenizer_path: Option<PathBuf>,
    /// The name clients use; defaults to the workers' served name.
    pub served_model_name: Option<String>,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogConfig {
    /// A `tracing` filter directive (`info`, `debug`, ...); `RUST_LOG` wins.
    pub level: &'static str,
    /// JSON lines instead of text.
    pub json: bool,
}
