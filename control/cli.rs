//! `smg launch`'s command line, flag-compatible with the existing SMG gateway
//! so operators can switch without rewriting their launch scripts.

use std::path::PathBuf;

use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};

use crate::policies::PolicyKind;

/// smg: a model gateway for LLM serving fleets.
#[derive(Debug, Parser)]
#[command(name = "smg", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start the gateway.
    Launch(Box<LaunchArgs>),
    /// Start a simulated fleet and the gateway in front of it (a demo).
    Demo(crate::demo::DemoArgs),
}

/// Which memory the RDMA lane registers (`--multimodal-rdma-backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RdmaBackendArg {
    Verbs,
    Loopback,
}

/// How image tensors travel to the workers that read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TensorTransport {
    Inline,
    Shm,
    Auto,
    Rdma,
}

/// Which engine protocol the workers speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RuntimeArg {
    Tokenspeed,
    Sglang,
}

/// `--dataplane-io`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DataplaneIo {
    Auto,
    Uring,
    Plain,
}

impl DataplaneIo {
    pub fn backend(self) -> smg_dataplane::IoBackend {
        match self {
            DataplaneIo::Auto => smg_dataplane::IoBackend::Auto,
            DataplaneIo::Uring => smg_dataplane::IoBackend::Uring,
            DataplaneIo::Plain => smg_dataplane::IoBackend::Plain,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

impl LogLevel {
    pub fn as_filter(self) -> &'static str {
        match self {
            LogLevel::Trace => "trace",
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct LaunchArgs {
    /// Address the HTTP API listens on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port of the HTTP API.
    #[arg(long, default_value_t = 30000)]
    pub port: u16,

    /// Regular-mode workers.
    #[arg(long, num_args = 1.., value_name = "URL")]
    pub worker_urls: Vec<String>,
    /// Serve prefill/decode disaggregation (needs --prefill and --decode).
    #[arg(long)]
    pub pd_disaggregation: bool,
    /// Serve encode/prefill/decode disaggregation (needs --encode, --prefill, --decode).
    #[arg(long)]
    pub epd_disaggregation: bool,
    /// A prefill worker and optionally its bootstrap port (repeatable).
    #[arg(long, num_args = 1..=2, value_names = ["URL", "BOOTSTRAP_PORT"], action = ArgAction::Append)]
    pub prefill: Vec<String>,
    /// A decode worker (repeatable).
    #[arg(long, value_name = "URL", action = ArgAction::Append)]
    pub decode: Vec<String>,
    /// An encode worker and optionally its bootstrap port (repeatable).
    #[arg(long, num_args = 1..=2, value_names = ["URL", "BOOTSTRAP_PORT"], action = ArgAction::Append)]
    pub encode: Vec<String>,
    /// Serve several models, each in the mode its workers imply; start with
    /// no workers and register them through `POST /workers`.
    #[arg(long)]
    pub enable_igw: bool,
    /// A per-model routing policy, `MODEL=POLICY` (repeatable; IGW).
    #[arg(long, value_name = "MODEL=POLICY", action = ArgAction::Append)]
    pub model_policy: Vec<String>,
    /// A per-model retry count, `MODEL=N` (repeatable; IGW).
    #[arg(long, value_name = "MODEL=N", action = ArgAction::Append)]
    pub model_max_retries: Vec<String>,
    /// Another name clients may use for a model, `ALIAS=MODEL` (repeatable).
    #[arg(long, value_name = "ALIAS=MODEL", action = ArgAction::Append)]
    pub model_alias: Vec<String>,
    /// One logical worker per data-parallel rank each worker reports; the
    /// rank goes on requests where the protocol has a field (SGLang).
    #[arg(long)]
    pub dp_aware: bool,
    /// The engine protocol; probed from the workers when not given.
    #[arg(long, value_enum)]
    pub runtime: Option<RuntimeArg>,

    /// Routing policy for regular workers (and the default for other roles).
    #[arg(long, value_enum, default_value_t = PolicyKind::CacheAware)]
    pub policy: PolicyKind,
    #[arg(long, value_enum)]
    pub prefill_policy: Option<PolicyKind>,
    #[arg(long, value_enum)]
    pub decode_policy: Option<PolicyKind>,
    /// Encode routing; defaults to consistent hashing on the image's content.
    #[arg(long, value_enum, default_value_t = PolicyKind::ConsistentHashing)]
    pub encode_policy: PolicyKind,

    /// A Hugging Face model directory (tokenizer, chat template, configs).
    #[arg(long)]
    pub model_path: Option<PathBuf>,
    /// A tokenizer directory when it differs from --model-path.
    #[arg(long)]
    pub tokenizer_path: Option<PathBuf>,
    /// The model name clients use; defaults to the workers' served name.
    #[arg(long)]
    pub served_model_name: Option<String>,

    /// How image tensors reach encode/prefill workers. `auto` (the default)
    /// writes them to `/dev/shm` when every receiving worker shares this
    /// host's shm namespace and sends them inline otherwise.
    #[arg(long, value_enum, default_value_t = TensorTransport::Auto)]
    pub multimodal_tensor_transport: TensorTransport,
    /// Tensors smaller than this go inline even on the shm lane.
    #[arg(long, default_value_t = 64 * 1024)]
    pub multimodal_shm_min_bytes: u64,
    /// Per-worker transport: `URL=inline|shm|auto|rdma[,min_bytes=N]`
    /// (repeatable; overrides the two flags above for that worker).
    #[arg(long, value_name = "URL=MODE[,min_bytes=N]", action = ArgAction::Append)]
    pub worker_tensor_transport: Vec<String>,
    /// The tmpfs the shm lane writes into (workers must see the same one).
    #[arg(long, default_value = smg_shared::shm::SHM_DIR)]
    pub multimodal_shm_dir: PathBuf,
    /// Bytes per pre-faulted shm slot (larger tensors get a one-off file).
    #[arg(long, default_value_t = 32 * 1024 * 1024)]
    pub multimodal_shm_slot_bytes: usize,
    /// Shm slots per data-plane core.
    #[arg(long, default_value_t = 4)]
    pub multimodal_shm_slots_per_core: usize,
    /// How long after its RPC returned a shm name a worker never unlinked
    /// is removed by the gateway.
    #[arg(long, default_value_t = 30_000)]
    pub multimodal_shm_reclaim_ms: u64,
    /// The RDMA lane's backend: the host's first RDMA device (`verbs`,
    /// needs a build with `--features rdma-verbs`), or a `/dev/shm` arena
    /// workers on this host read (`loopback`, for tests and single hosts).
    #[arg(long, value_enum, default_value_t = RdmaBackendArg::Verbs)]
    pub multimodal_rdma_backend: RdmaBackendArg,
    /// Slots in the RDMA arena (registered once, shared by every core).
    #[arg(long, default_value_t = 16)]
    pub multimodal_rdma_slots: usize,
    /// Bytes per RDMA slot: the largest tensor the lane takes.
    #[arg(long, default_value_t = 32 << 20)]
    pub multimodal_rdma_slot_bytes: usize,
    /// How long a published RDMA slot waits for its RPC to return before
    /// the reaper takes it back (a late read then fails as stale).
    #[arg(long, default_value_t = 30_000)]
    pub multimodal_rdma_deadline_ms: u64,
    /// Free bytes a one-off shm file must leave in the tmpfs; tensors that
    /// would eat into them go inline (counted as fallbacks).
    #[arg(long, default_value_t = 0)]
    pub multimodal_shm_keep_free_bytes: u64,

    /// Directories `file://` image URLs may read from (repeatable).
    #[arg(long, value_name = "DIR", action = ArgAction::Append)]
    pub allowed_local_media_path: Vec<PathBuf>,
    /// Largest image accepted, in bytes.
    #[arg(long, default_value_t = 32 * 1024 * 1024)]
    pub media_max_bytes: usize,
    /// Most images one request may carry.
    #[arg(long, default_value_t = 16)]
    pub max_images_per_request: usize,
    /// Time allowed to fetch one image.
    #[arg(long, default_value_t = 10)]
    pub media_fetch_timeout_secs: u64,
    /// Hosts or networks (CIDR) image URLs may reach although they are not
    /// public addresses (repeatable); everything else private is refused.
    #[arg(long, value_name = "HOST_OR_CIDR", action = ArgAction::Append)]
    pub media_allow_private_host: Vec<String>,

    /// Data-plane threads, each pinned to a core of its own (default: a
    /// quarter of the cores, at least one). The tokio runtime keeps the rest.
    #[arg(long, value_name = "N")]
    pub dataplane_cores: Option<usize>,
    /// Jobs each data-plane core's ring holds; a full ring is backpressure.
    #[arg(long, default_value_t = 64)]
    pub dataplane_ring_capacity: usize,
    /// How long an image waits for room on a full data plane before the
    /// request fails with `dataplane_busy` (503).
    #[arg(long, default_value_t = 1000)]
    pub dataplane_submit_timeout_ms: u64,
    /// The data plane's I/O loop: io_uring if it can be set up (auto), io_uring
    /// or refuse to start (uring), or the plain fallback loop (plain).
    #[arg(long, value_enum, default_value_t = DataplaneIo::Auto)]
    pub dataplane_io: DataplaneIo,

    #[arg(long)]
    pub disable_health_check: bool,
    #[arg(long, default_value_t = 10)]
    pub health_check_interval_secs: u64,
    #[arg(long, default_value_t = 5)]
    pub health_check_timeout_secs: u64,
    #[arg(long, default_value_t = 3)]
    pub health_failure_threshold: u32,
    #[arg(long, default_value_t = 2)]
    pub health_success_threshold: u32,

    /// Consecutive failed RPCs (within the window) that open a worker's circuit.
    #[arg(long, default_value_t = 10)]
    pub cb_failure_threshold: u32,
    /// Successful trial RPCs that close a half-open circuit.
    #[arg(long, default_value_t = 3)]
    pub cb_success_threshold: u32,
    /// How long an open circuit keeps a worker out before a trial.
    #[arg(long, default_value_t = 60)]
    pub cb_timeout_duration_secs: u64,
    /// Failures count as consecutive only within this window.
    #[arg(long, default_value_t = 120)]
    pub cb_window_duration_secs: u64,
    #[arg(long)]
    pub disable_circuit_breaker: bool,

    /// How often workers' GetLoads is polled (only for load-aware policies).
    #[arg(long, default_value_t = 1)]
    pub load_check_interval_secs: u64,
    /// cache_aware: share of the prompt that must match to follow the cache.
    #[arg(long, default_value_t = 0.5)]
    pub cache_threshold: f64,
    /// cache_aware: the fleet is imbalanced when max − min load exceeds this...
    #[arg(long, default_value_t = 32)]
    pub balance_abs_threshold: u64,
    /// ...and max load exceeds min × this.
    #[arg(long, default_value_t = 1.5)]
    pub balance_rel_threshold: f64,
    /// cache_aware: 16-token pages remembered per model before LRU eviction.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_tree_size: usize,

    /// Address of the Prometheus /metrics listener (defaults to --host).
    #[arg(long)]
    pub prometheus_host: Option<String>,
    #[arg(long, default_value_t = 29000)]
    pub prometheus_port: u16,

    #[arg(long, default_value_t = 3)]
    pub retry_max_retries: u32,
    #[arg(long, default_value_t = 50)]
    pub retry_initial_backoff_ms: u64,
    #[arg(long, default_value_t = 5000)]
    pub retry_max_backoff_ms: u64,
    #[arg(long, default_value_t = 2.0)]
    pub retry_backoff_multiplier: f64,
    #[arg(long, default_value_t = 0.1)]
    pub retry_jitter_factor: f64,
    #[arg(long)]
    pub disable_retries: bool,
    /// Whole-request timeout.
    #[arg(long, default_value_t = 1800)]
    pub request_timeout_secs: u64,

    #[arg(long, value_enum, default_value_t = LogLevel::Info)]
    pub log_level: LogLevel,
    /// Log as JSON lines.
    #[arg(long)]
    pub log_json: bool,
}

/// A worker URL and its optional bootstrap port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSpec {
    pub url: String,
    pub bootstrap_port: Option<u16>,
}

/// Groups `--prefill URL [PORT]` values (clap hands them over flattened): a
/// purely numeric value is the bootstrap port of the URL before it.
pub fn worker_specs(flag: &str, values: &[String]) -> Result<Vec<WorkerSpec>, String> {
    let mut specs: Vec<WorkerSpec> = Vec::new();
    for value in values {
        if value.chars().all(|c| c.is_ascii_digit()) {
            let port = value
                .parse()
                .map_err(|_| format!("--{flag}: bootstrap port {value} is out of range"))?;
            match specs.last_mut() {
                Some(spec) if spec.bootstrap_port.is_none() => spec.bootstrap_port = Some(port),
                _ => {
                    return Err(format!(
                        "--{flag}: bootstrap port {value} follows no worker URL"
                    ));
                }
            }
        } else {
            specs.push(WorkerSpec {
                url: value.clone(),
                bootstrap_port: None,
            });
        }
    }
    Ok(specs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(line: &str) -> LaunchArgs {
        let cli = Cli::try_parse_from(line.split_whitespace()).expect("parses");
        match cli.command {
            Command::Launch(args) => *args,
            Command::Demo(_) => panic!("not a launch line"),
        }
    }

    #[test]
    fn the_documented_epd_launch_line_parses() {
        let args = launch(
            "smg launch --epd-disaggregation --encode grpc://127.0.0.1:50104 18995 \
             --prefill grpc://127.0.0.1:50101 19311 --decode grpc://127.0.0.1:50111 \
             --encode-policy consistent_hashing --prefill-policy round_robin \
             --decode-policy round_robin --policy cache_aware \
             --multimodal-tensor-transport inline --model-path /models/qwen \
             --disable-health-check --prometheus-port 29080 --host 0.0.0.0 --port 12345",
        );
        assert!(args.epd_disaggregation);
        let spec = |url: &str, port| WorkerSpec {
            url: url.to_owned(),
            bootstrap_port: port,
        };
        assert_eq!(
            worker_specs("encode", &args.encode),
            Ok(vec![spec("grpc://127.0.0.1:50104", Some(18995))])
        );
        assert_eq!(
            worker_specs("prefill", &args.prefill),
            Ok(vec![spec("grpc://127.0.0.1:50101", Some(19311))])
        );
        assert_eq!(args.decode, ["grpc://127.0.0.1:50111"]);
        assert_eq!(args.encode_policy, PolicyKind::ConsistentHashing);
        assert_eq!(args.prefill_policy, Some(PolicyKind::RoundRobin));
        assert_eq!(args.policy, PolicyKind::CacheAware);
        assert_eq!(args.multimodal_tensor_transport, TensorTransport::Inline);
        assert!(args.disable_health_check);
        assert_eq!(
            (args.host.as_str(), args.port, args.prometheus_port),
            ("0.0.0.0", 12345, 29080)
        );
        assert_eq!(
            args.prometheus_host, None,
            "the metrics listener follows --host"
        );
    }

    #[test]
    fn several_prefill_workers_with_and_without_bootstrap_ports() {
        let args = launch(
            "smg launch --pd-disaggregation --prefill grpc://a:1 8998 --prefill grpc://b:1 \
             --decode grpc://c:1 --decode grpc://d:1 --retry-max-retries 5 --disable-retries",
        );
        let specs = worker_specs("prefill", &args.prefill).expect("valid");
        assert_eq!(specs.len(), 2);
        assert_eq!(
            (specs[0].url.as_str(), specs[0].bootstrap_port),
            ("grpc://a:1", Some(8998))
        );
        assert_eq!(
            (specs[1].url.as_str(), specs[1].bootstrap_port),
            ("grpc://b:1", None)
        );
        assert!(worker_specs("prefill", &["9000".to_owned()]).is_err());
        assert!(worker_specs("prefill", &["grpc://a:1".to_owned(), "99999".to_owned()]).is_err());
        assert_eq!(args.decode.len(), 2);
        assert_eq!(args.retry_max_retries, 5);
        assert!(args.disable_retries);
    }

    #[test]
    fn regular_workers_and_policies() {
        let args = launch(
            "smg launch --worker-urls grpc://a:1 grpc://b:2 --policy power_of_two --log-json",
        );
        assert_eq!(args.worker_urls, ["grpc://a:1", "grpc://b:2"]);
        assert_eq!(args.policy, PolicyKind::PowerOfTwo);
        assert!(args.log_json);
        assert_eq!(
            args.multimodal_tensor_transport,
            TensorTransport::Auto,
            "same-host workers get the shm lane unless told otherwise"
        );
        assert!(Cli::try_parse_from(["smg", "launch", "--policy", "fastest"]).is_err());
    }
}
