//! `smg`'s command line, flag-compatible with the existing SMG gateway so
//! operators can switch without rewriting their launch scripts.
//!
//! Why it exists: this is the one module that knows flags. It parses them
//! (and a `--config` TOML file whose keys are spelled like the long flags;
//! flags given on the command line win over the file), and turns them into
//! a [`GatewayConfig`] once, checking every value and naming the flag when
//! one is wrong. Everything below `server` reads that config.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::parser::ValueSource;
use clap::{ArgAction, Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use smg_dataplane::IoBackend;
use smg_dataplane::lanes::rdma::RdmaBackend;

use crate::admission::{AdmissionConfig, Priority, RateLimit};
use crate::config::{
    AdminRole, ApiKey, AuthConfig, ChatTemplateOverride, ControlPlaneKey, CorsPolicy,
    DataPlaneSettings, FleetConfig, FrontDoorConfig, GatewayConfig, HistoryConfig, HttpLimits,
    KeyDigest, ListenConfig, LogConfig, ModelSource, ParserSettings, PolicyChoice, RoutingConfig,
    ShutdownConfig, StartupConfig, TlsFiles, WorkerAddress, WorkerTlsFiles,
};
use crate::demo::{DemoMode, DemoPlan};
use crate::engine::{ConnectionConfig, Runtime};
use crate::lanes::LaneSettings;
use crate::mcp::McpConfig;
use crate::media::{MediaConfig, PrivateHostAllowance};
use crate::mode::Mode;
use crate::policies::{
    CacheAwareConfig, ManualConfig, PolicyKind, PolicyTunables, PrefixHashConfig,
};
use crate::router::RetryConfig;
use crate::tokenizer::{ChatTemplate, TemplateBudget};
use crate::workers::{
    BreakerConfig, HealthConfig, InFlightLimit, LaneMode, Lifecycle, WorkerLaneOverride,
    WorkerRole, normalize_url,
};

mod compat;

pub use compat::{IGNORED_HEADING, SMG_FLAGS, SmgFlag, Takes, Treatment};

/// A value of `--policy` and friends.
fn policy() -> impl TypedValueParser<Value = PolicyKind> {
    PossibleValuesParser::new(PolicyKind::ALL.map(PolicyKind::name)).try_map(|name| name.parse())
}

/// smg: a model gateway for LLM serving fleets.
///
/// `smg --worker-urls ...` is `smg launch --worker-urls ...`, as in SMG.
#[derive(Debug, Parser)]
#[command(name = "smg", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start the gateway (the default: a command line that starts with a
    /// flag is a launch command line).
    #[command(visible_alias = "start")]
    Launch(Box<LaunchArgs>),
    /// Start a simulated fleet and the gateway in front of it (a demo).
    Demo(DemoArgs),
}

/// What a command line asks for, checked.
#[derive(Debug)]
pub enum Invocation {
    Launch(Box<GatewayConfig>),
    Demo(Box<DemoPlan>),
}

/// Why a command line was refused.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// clap's own refusal (unknown flag, bad value, `--help`, `--version`).
    #[error(transparent)]
    Syntax(#[from] clap::Error),
    #[error(transparent)]
    Config(#[from] ConfigError),
}

impl CliError {
    /// Prints the error (or the help clap was asked for) and exits: 0 for
    /// `--help`/`--version`, 2 for a refused command line.
    pub fn exit(self) -> ! {
        match self {
            CliError::Syntax(err) => err.exit(),
            CliError::Config(err) => {
                eprintln!("error: {err}");
                std::process::exit(2)
            }
        }
    }
}

/// A flag (or config file key) whose value cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--{flag}: {reason}")]
pub struct ConfigError {
    /// The long flag, without its dashes.
    pub flag: &'static str,
    pub reason: String,
}

impl ConfigError {
    fn new(flag: &'static str, reason: impl Into<String>) -> Self {
        Self {
            flag,
            reason: reason.into(),
        }
    }
}

/// Parses the process's command line.
pub fn parse() -> Invocation {
    parse_from(std::env::args_os()).unwrap_or_else(|err| err.exit())
}

/// Parses `argv` (with the program name first), reading `--config` files.
pub fn parse_from<I, T>(argv: I) -> Result<Invocation, CliError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let argv = with_launch_implied(argv.into_iter().map(Into::into).collect());
    let argv = with_config_file(argv)?;
    let matches = command().try_get_matches_from(argv)?;
    let cli = Cli::from_arg_matches(&matches)?;
    Ok(match cli.command {
        Command::Launch(mut args) => {
            if let Some(launch) = matches.subcommand_matches("launch") {
                args.smg_warnings = compat::check(launch)
                    .map_err(|(flag, reason)| ConfigError::new(flag, reason))?;
            }
            Invocation::Launch(Box::new(GatewayConfig::try_from(*args)?))
        }
        Command::Demo(args) => Invocation::Demo(Box::new(args.plan()?)),
    })
}

/// The whole command line: [`Cli`] with SMG's flags that smg does not
/// implement added to `launch` (see [`compat`]), so they parse, and are
/// then warned about or refused by name.
pub fn command() -> clap::Command {
    Cli::command().mut_subcommand("launch", compat::with_smg_flags)
}

/// `argv` with `launch` inserted when it starts with a flag other than
/// `--help`/`--version`: as in SMG, `smg --worker-urls ...` launches.
fn with_launch_implied(mut argv: Vec<OsString>) -> Vec<OsString> {
    let starts_with_flag = argv.get(1).is_some_and(|first| {
        let first = first.to_string_lossy();
        first.starts_with('-') && !matches!(first.as_ref(), "-h" | "--help" | "-V" | "--version")
    });
    if starts_with_flag {
        argv.insert(1, "launch".into());
    }
    argv
}

/// `argv` with the keys of its `--config` file (if any) inserted as flags
/// right after `launch`, skipping those the command line gives itself.
fn with_config_file(argv: Vec<OsString>) -> Result<Vec<OsString>, CliError> {
    let matches = command().try_get_matches_from(&argv)?;
    let Some(("launch", launch)) = matches.subcommand() else {
        return Ok(argv);
    };
    let Some(path) = launch.get_one::<PathBuf>("config") else {
        return Ok(argv);
    };
    let file_error =
        |reason: String| ConfigError::new("config", format!("{}: {reason}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|err| file_error(err.to_string()))?;
    let table: toml::Table = text
        .parse()
        .map_err(|err: toml::de::Error| file_error(err.to_string()))?;
    let command = command();
    let launch_command = command
        .find_subcommand("launch")
        .ok_or_else(|| file_error("no launch command".to_owned()))?;
    let mut flags: Vec<OsString> = Vec::new();
    for (key, value) in &table {
        let arg = launch_command
            .get_arguments()
            .find(|arg| {
                key != "config"
                    && (arg.get_long() == Some(key.as_str())
                        || arg
                            .get_all_aliases()
                            .is_some_and(|aliases| aliases.contains(&key.as_str())))
            })
            .ok_or_else(|| {
                file_error(format!(
                    "unknown key {key:?} (keys are the long flags of smg launch)"
                ))
            })?;
        if launch.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine) {
            continue;
        }
        let flag = OsString::from(format!("--{key}"));
        let scalar = |value: &toml::Value| -> Result<OsString, ConfigError> {
            match value {
                toml::Value::String(text) => Ok(text.into()),
                toml::Value::Integer(n) => Ok(n.to_string().into()),
                toml::Value::Float(x) => Ok(x.to_string().into()),
                toml::Value::Boolean(b) => Ok(b.to_string().into()),
                other => Err(file_error(format!(
                    "{key}: {} is not a flag value",
                    other.type_str()
                ))),
            }
        };
        let takes_values = arg.get_action().takes_values();
        match value {
            toml::Value::Boolean(on) if !takes_values => {
                if *on {
                    flags.push(flag);
                }
            }
            toml::Value::Array(items) => {
                for item in items {
                    flags.push(flag.clone());
                    match item {
                        // One occurrence with several values: `[URL, PORT]`.
                        toml::Value::Array(values) => {
                            for value in values {
                                flags.push(scalar(value)?);
                            }
                        }
                        single => flags.push(scalar(single)?),
                    }
                }
            }
            single => {
                flags.push(flag);
                flags.push(scalar(single)?);
            }
        }
    }
    let split = argv
        .iter()
        .position(|word| word == "launch" || word == "start")
        .map_or(argv.len(), |at| at + 1);
    let mut merged = argv[..split].to_vec();
    merged.extend(flags);
    merged.extend_from_slice(&argv[split..]);
    Ok(merged)
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

// The flags' enums mirror domain types that know nothing of clap; these
// are the only conversions between them.

impl DataplaneIo {
    fn backend(self) -> IoBackend {
        match self {
            DataplaneIo::Auto => IoBackend::Auto,
            DataplaneIo::Uring => IoBackend::Uring,
            DataplaneIo::Plain => IoBackend::Plain,
        }
    }
}

impl RdmaBackendArg {
    fn backend(self) -> RdmaBackend {
        match self {
            RdmaBackendArg::Verbs => RdmaBackend::Verbs,
            RdmaBackendArg::Loopback => RdmaBackend::Loopback,
        }
    }
}

impl TensorTransport {
    fn mode(self) -> LaneMode {
        match self {
            TensorTransport::Inline => LaneMode::Inline,
            TensorTransport::Shm => LaneMode::Shm,
            TensorTransport::Auto => LaneMode::Auto,
            TensorTransport::Rdma => LaneMode::Rdma,
        }
    }
}

impl RuntimeArg {
    fn runtime(self) -> Runtime {
        match self {
            RuntimeArg::Tokenspeed => Runtime::TokenSpeed,
            RuntimeArg::Sglang => Runtime::Sglang,
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
    fn as_filter(self) -> &'static str {
        match self {
            LogLevel::Trace => "trace",
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }
}

/// The help headings of `smg launch`, in SMG's order where SMG has them.
mod heading {
    pub(super) const GENERAL: &str = "Config file";
    pub(super) const WORKERS: &str = "Worker configuration";
    pub(super) const ROUTING: &str = "Routing policy";
    pub(super) const PD: &str = "PD / EPD disaggregation";
    pub(super) const IGW: &str = "Several models (IGW)";
    pub(super) const MODEL: &str = "Model and tokenizer";
    pub(super) const PARSERS: &str = "Parsers";
    pub(super) const HISTORY: &str = "Responses and conversation history";
    pub(super) const MEDIA: &str = "Images";
    pub(super) const MCP: &str = "MCP tools";
    pub(super) const LANES: &str = "Tensor lanes";
    pub(super) const DATAPLANE: &str = "Data plane";
    pub(super) const CONNECTIONS: &str = "Worker connections";
    pub(super) const HEALTH: &str = "Health checks";
    pub(super) const BREAKER: &str = "Circuit breaker";
    pub(super) const RETRY: &str = "Retries";
    pub(super) const REQUESTS: &str = "Request handling";
    pub(super) const ADMISSION: &str = "Rate limiting and admission";
    pub(super) const AUTH: &str = "Authentication";
    pub(super) const TLS: &str = "TLS / mTLS";
    pub(super) const PROMETHEUS: &str = "Prometheus metrics and probes";
    pub(super) const LOGGING: &str = "Logging";
}

/// `--history-backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HistoryBackendArg {
    Sqlite,
    Postgres,
    Memory,
    None,
}

#[derive(Debug, Clone, Args)]
pub struct LaunchArgs {
    /// A TOML file of flags, keys spelled like the long flags
    /// (`worker-urls = ["grpc://..."]`, `model-path = "..."`); flags given
    /// on the command line win over it.
    #[arg(long, value_name = "FILE", help_heading = heading::GENERAL)]
    pub config: Option<PathBuf>,

    // ==== Worker configuration ====
    /// Address the HTTP API listens on (loopback unless you say otherwise).
    #[arg(long, default_value = "127.0.0.1", help_heading = heading::WORKERS)]
    pub host: String,
    /// Port of the HTTP API.
    #[arg(long, default_value_t = 30000, help_heading = heading::WORKERS)]
    pub port: u16,
    /// Regular-mode workers: gRPC addresses, `grpc://HOST:PORT` (or
    /// `grpcs://` for TLS).
    #[arg(long, num_args = 1.., value_name = "URL", help_heading = heading::WORKERS)]
    pub worker_urls: Vec<String>,
    /// The engine protocol the workers speak (`--backend` in SMG); probed
    /// from the workers when not given.
    #[arg(long, alias = "backend", value_parser = runtime_arg, value_name = "tokenspeed|sglang", help_heading = heading::WORKERS)]
    pub runtime: Option<RuntimeArg>,
    /// How long start-up keeps trying to reach the workers named on the
    /// command line; until one of each role answers, /readiness is 503.
    /// Past it, workers still unreachable are given up on (the gateway
    /// exits if a role then has none).
    #[arg(long, value_name = "SECS", default_value_t = 1800, help_heading = heading::WORKERS)]
    pub worker_startup_timeout_secs: u64,
    /// Pause before the first attempt to reach the workers.
    #[arg(long, value_name = "SECS", default_value_t = 0, help_heading = heading::WORKERS)]
    pub worker_startup_delay: u64,
    /// The longest pause between two attempts to reach a worker at
    /// start-up (the first retries come after 250 ms, doubling).
    #[arg(long, value_name = "SECS", default_value_t = 30, help_heading = heading::WORKERS)]
    pub worker_startup_check_interval: u64,
    /// One logical worker per data-parallel rank each worker reports; the
    /// rank goes on requests where the protocol has a field (SGLang).
    #[arg(long, help_heading = heading::WORKERS)]
    pub dp_aware: bool,
    /// The most data-parallel ranks one engine may report under
    /// `--dp-aware`; an engine reporting more is refused (start-up fails, a
    /// registration ends `registration_failed`).
    #[arg(long, value_name = "N", default_value_t = Lifecycle::DEFAULT_MAX_DP_RANKS, help_heading = heading::WORKERS)]
    pub max_dp_ranks: u32,

    // ==== Routing policy ====
    /// Routing policy for regular workers (and the default for other roles).
    #[arg(long, value_parser = policy(), default_value_t = PolicyKind::CacheAware, help_heading = heading::ROUTING)]
    pub policy: PolicyKind,
    /// cache_aware: share of the prompt (0 to 1) that must match a worker's
    /// cached routes to follow the cache.
    #[arg(long, value_name = "FRACTION", default_value_t = 0.3, help_heading = heading::ROUTING)]
    pub cache_threshold: f64,
    /// cache_aware: the fleet is imbalanced when the most and least loaded
    /// workers differ by more than this many requests...
    #[arg(long, value_name = "REQUESTS", default_value_t = 64, help_heading = heading::ROUTING)]
    pub balance_abs_threshold: u64,
    /// ...and the most loaded carries more than this multiple of the least.
    #[arg(long, value_name = "RATIO", default_value_t = 1.5, help_heading = heading::ROUTING)]
    pub balance_rel_threshold: f64,
    /// cache_aware: prompt tokens remembered per model before the least
    /// recently used are evicted (kept as 16-token pages).
    #[arg(long, value_name = "TOKENS", default_value_t = 1 << 24, help_heading = heading::ROUTING)]
    pub max_tree_size: usize,
    /// manual: a routing key unused this long is forgotten.
    #[arg(long, value_name = "SECS", default_value_t = 14400, help_heading = heading::ROUTING)]
    pub max_idle_secs: u64,
    /// prefix_hash: leading prompt tokens that form the key.
    #[arg(long, value_name = "TOKENS", default_value_t = 256, help_heading = heading::ROUTING)]
    pub prefix_token_count: usize,
    /// prefix_hash: a worker loaded above this multiple of the average is
    /// passed over.
    #[arg(long, value_name = "RATIO", default_value_t = 1.25, help_heading = heading::ROUTING)]
    pub prefix_hash_load_factor: f64,
    /// How often workers' GetLoads is polled (for load-aware policies, and
    /// for the in-flight limits without --worker-max-in-flight;
    /// `--load-monitor-interval` in SMG).
    #[arg(long, alias = "load-monitor-interval", value_name = "SECS", default_value_t = 1, help_heading = heading::ROUTING)]
    pub load_check_interval_secs: u64,
    /// Panic mode, as in Envoy: when fewer than this percentage of a role's
    /// workers are available (healthy, circuit not open), route across all
    /// of them rather than refuse every request. 0 turns it off.
    #[arg(long, value_name = "PERCENT", default_value_t = 50, help_heading = heading::ROUTING)]
    pub panic_threshold: u8,

    // ==== PD / EPD ====
    /// Serve prefill/decode disaggregation (needs --prefill and --decode).
    #[arg(long, help_heading = heading::PD)]
    pub pd_disaggregation: bool,
    /// Serve encode/prefill/decode disaggregation (needs --encode, --prefill, --decode).
    #[arg(long, help_heading = heading::PD)]
    pub epd_disaggregation: bool,
    /// A prefill worker and its bootstrap port, or `none` to ask the worker
    /// (the default) (repeatable).
    #[arg(long, num_args = 1..=2, value_names = ["URL", "BOOTSTRAP_PORT"], action = ArgAction::Append, help_heading = heading::PD)]
    pub prefill: Vec<String>,
    /// A decode worker (repeatable).
    #[arg(long, value_name = "URL", action = ArgAction::Append, help_heading = heading::PD)]
    pub decode: Vec<String>,
    /// An encode worker and its bootstrap port, or `none` to ask the worker
    /// (the default) (repeatable).
    #[arg(long, num_args = 1..=2, value_names = ["URL", "BOOTSTRAP_PORT"], action = ArgAction::Append, help_heading = heading::PD)]
    pub encode: Vec<String>,
    /// Routing policy of prefill workers (default: --policy).
    #[arg(long, value_parser = policy(), help_heading = heading::PD)]
    pub prefill_policy: Option<PolicyKind>,
    /// Routing policy of decode workers (default: --policy).
    #[arg(long, value_parser = policy(), help_heading = heading::PD)]
    pub decode_policy: Option<PolicyKind>,
    /// Routing policy of encode workers: by default consistent hashing on
    /// the image's content.
    #[arg(long, value_parser = policy(), default_value_t = PolicyKind::ConsistentHashing, help_heading = heading::PD)]
    pub encode_policy: PolicyKind,

    // ==== IGW ====
    /// Serve several models, each in the mode its workers imply; start with
    /// no workers and register them through `POST /workers`.
    #[arg(long, help_heading = heading::IGW)]
    pub enable_igw: bool,
    /// A per-model routing policy, `MODEL=POLICY` (repeatable; IGW).
    #[arg(long, value_name = "MODEL=POLICY", action = ArgAction::Append, help_heading = heading::IGW)]
    pub model_policy: Vec<String>,
    /// A per-model retry count, `MODEL=N` (repeatable; IGW).
    #[arg(long, value_name = "MODEL=N", action = ArgAction::Append, help_heading = heading::IGW)]
    pub model_max_retries: Vec<String>,
    /// Another name clients may use for a model, `ALIAS=MODEL` (repeatable).
    #[arg(long, value_name = "ALIAS=MODEL", action = ArgAction::Append, help_heading = heading::IGW)]
    pub model_alias: Vec<String>,

    // ==== Model ====
    /// A local Hugging Face model directory (tokenizer, chat template,
    /// configs); `--model` is the same flag. Without it the tokenizer comes
    /// from the workers.
    #[arg(long, alias = "model", value_name = "DIR", help_heading = heading::MODEL)]
    pub model_path: Option<PathBuf>,
    /// A tokenizer directory when it differs from --model-path.
    #[arg(long, value_name = "DIR", help_heading = heading::MODEL)]
    pub tokenizer_path: Option<PathBuf>,
    /// The model name clients use; defaults to the workers' served name.
    #[arg(long, value_name = "NAME", help_heading = heading::MODEL)]
    pub served_model_name: Option<String>,
    /// A Jinja chat template file that replaces the template of every
    /// model served (its tokenizer_config.json's or chat_template.jinja),
    /// models registered later included.
    #[arg(long, value_name = "PATH", help_heading = heading::MODEL)]
    pub chat_template: Option<PathBuf>,
    /// The work one chat template rendering may do, in minijinja fuel
    /// (about one unit per instruction and per 64 bytes of data the template
    /// produces); a request whose rendering needs more is refused with
    /// chat_template_budget_exceeded (400).
    #[arg(long, value_name = "FUEL", default_value_t = TemplateBudget::DEFAULT_FUEL, help_heading = heading::MODEL)]
    pub chat_template_fuel: u64,

    // ==== Parsers ====
    /// The tool-call parser for chat output (qwen, qwen_xml, llama,
    /// pythonic, mistral, deepseek, deepseek31, kimik2, glm45_moe,
    /// glm47_moe, json, passthrough); default: detected from the model id
    /// and chat template.
    #[arg(long, value_name = "NAME", help_heading = heading::PARSERS)]
    pub tool_call_parser: Option<String>,
    /// MODEL=NAME: the tool-call parser of one served model, over
    /// --tool-call-parser. Repeatable.
    #[arg(long, value_name = "MODEL=NAME", action = ArgAction::Append, help_heading = heading::PARSERS)]
    pub model_tool_call_parser: Vec<String>,
    /// The reasoning parser (qwen3, qwen3_thinking, deepseek_r1,
    /// deepseek_v31, glm45, kimi, kimi_thinking, kimi_k25, passthrough);
    /// default: detected from the model id.
    #[arg(long, value_name = "NAME", help_heading = heading::PARSERS)]
    pub reasoning_parser: Option<String>,
    /// MODEL=NAME: the reasoning parser of one served model, over
    /// --reasoning-parser. Repeatable.
    #[arg(long, value_name = "MODEL=NAME", action = ArgAction::Append, help_heading = heading::PARSERS)]
    pub model_reasoning_parser: Vec<String>,

    // ==== Responses and conversation history ====
    /// Where stored responses and conversations are kept: sqlite (an
    /// embedded file, --history-path), postgres (--history-url; shared by
    /// several gateways), memory (lost on restart) or none.
    #[arg(long, value_enum, default_value_t = HistoryBackendArg::Sqlite, help_heading = heading::HISTORY)]
    pub history_backend: HistoryBackendArg,
    /// The sqlite backend's database file (created with its directory).
    #[arg(long, value_name = "FILE", default_value = "smg-history.sqlite3", help_heading = heading::HISTORY)]
    pub history_path: PathBuf,
    /// The postgres backend's URL (postgres://user:password@host/db).
    #[arg(long, alias = "postgres-db-url", value_name = "URL", help_heading = heading::HISTORY)]
    pub history_url: Option<String>,
    /// The postgres backend's most open connections.
    #[arg(long, alias = "history-pool-size", value_name = "N", default_value_t = 16, help_heading = heading::HISTORY)]
    pub postgres_pool_max_size: u32,
    /// How long a history call waits for a postgres connection (a free
    /// one, or a new one) before it fails with history_unavailable (503),
    /// and how long start-up waits for the first.
    #[arg(long, value_name = "SECS", default_value_t = 5, help_heading = heading::HISTORY)]
    pub history_connect_timeout_secs: u64,
    /// This gateway's name in the history store, unique among the live
    /// gateways sharing it (default HOSTNAME:PORT). Background responses a
    /// gateway leaves unfinished when it dies are ended as failed
    /// (response_orphaned) when a gateway of the same name starts, or by
    /// another replica once its 30 s lease has run out.
    #[arg(long, value_name = "NAME", help_heading = heading::HISTORY)]
    pub history_instance: Option<String>,

    // ==== Images ====
    /// Directories `file://` image URLs may read from (repeatable).
    #[arg(long, value_name = "DIR", action = ArgAction::Append, help_heading = heading::MEDIA)]
    pub allowed_local_media_path: Vec<PathBuf>,
    /// Largest image accepted (bytes, or a size such as 32MiB).
    #[arg(long, value_name = "BYTES", value_parser = byte_size::<usize>, default_value = "32MiB", help_heading = heading::MEDIA)]
    pub media_max_bytes: usize,
    /// Most images one request may carry.
    #[arg(long, value_name = "N", default_value_t = 16, help_heading = heading::MEDIA)]
    pub max_images_per_request: usize,
    /// Time allowed to fetch one image.
    #[arg(long, value_name = "SECS", default_value_t = 10, help_heading = heading::MEDIA)]
    pub media_fetch_timeout_secs: u64,
    /// Hosts or networks (CIDR) image URLs may reach although they are not
    /// public addresses (repeatable); everything else private is refused.
    #[arg(long, value_name = "HOST_OR_CIDR", action = ArgAction::Append, help_heading = heading::MEDIA)]
    pub media_allow_private_host: Vec<String>,

    // ==== MCP tools ====
    /// Hosts or networks (CIDR) the MCP servers of Responses requests'
    /// `mcp` tools may be at although they are not public addresses
    /// (repeatable); everything else private is refused.
    #[arg(long, value_name = "HOST_OR_CIDR", action = ArgAction::Append, help_heading = heading::MCP)]
    pub mcp_allow_private_host: Vec<String>,
    /// Time an MCP server gets to list its tools or answer one tool call.
    #[arg(long, value_name = "SECS", default_value_t = 30, help_heading = heading::MCP)]
    pub mcp_call_timeout_secs: u64,

    // ==== Tensor lanes ====
    /// How image tensors reach encode/prefill workers. `auto` writes them
    /// to `/dev/shm` when every receiving worker shares this host's shm
    /// namespace and sends them inline otherwise.
    #[arg(long, value_enum, default_value_t = TensorTransport::Auto, help_heading = heading::LANES)]
    pub multimodal_tensor_transport: TensorTransport,
    /// Tensors smaller than this go inline even on the shm lane (bytes, or
    /// a size such as 64KiB).
    #[arg(long, value_name = "BYTES", value_parser = byte_size::<u64>, default_value = "64KiB", help_heading = heading::LANES)]
    pub multimodal_shm_min_bytes: u64,
    /// Per-worker transport: `URL=inline|shm|auto|rdma[,min_bytes=N]`
    /// (repeatable; overrides the two flags above for that worker).
    #[arg(long, value_name = "URL=MODE[,min_bytes=N]", action = ArgAction::Append, help_heading = heading::LANES)]
    pub worker_tensor_transport: Vec<String>,
    /// The tmpfs the shm lane writes into (workers must see the same one).
    #[arg(long, value_name = "DIR", default_value = smg_shared::shm::SHM_DIR, help_heading = heading::LANES)]
    pub multimodal_shm_dir: PathBuf,
    /// Size of a pre-faulted shm slot; larger tensors get a one-off file.
    #[arg(long, value_name = "BYTES", value_parser = byte_size::<usize>, default_value = "32MiB", help_heading = heading::LANES)]
    pub multimodal_shm_slot_bytes: usize,
    /// Shm slots per data-plane core.
    #[arg(long, value_name = "N", default_value_t = 4, help_heading = heading::LANES)]
    pub multimodal_shm_slots_per_core: usize,
    /// How long after its RPC returned a shm name a worker never unlinked
    /// is removed by the gateway.
    #[arg(long, value_name = "MS", default_value_t = 30_000, help_heading = heading::LANES)]
    pub multimodal_shm_reclaim_ms: u64,
    /// Free space a one-off shm file must leave in the tmpfs; tensors that
    /// would eat into it go inline (counted as fallbacks).
    #[arg(long, value_name = "BYTES", value_parser = byte_size::<u64>, default_value = "0", help_heading = heading::LANES)]
    pub multimodal_shm_keep_free_bytes: u64,
    /// The RDMA lane's backend: the host's first RDMA device (`verbs`,
    /// needs a build with `--features rdma-verbs`), or a `/dev/shm` arena
    /// workers on this host read (`loopback`, for tests and single hosts).
    #[arg(long, value_enum, default_value_t = RdmaBackendArg::Verbs, help_heading = heading::LANES)]
    pub multimodal_rdma_backend: RdmaBackendArg,
    /// Slots in the RDMA arena (registered once, shared by every core).
    #[arg(long, value_name = "N", default_value_t = 16, help_heading = heading::LANES)]
    pub multimodal_rdma_slots: usize,
    /// Size of an RDMA slot: the largest tensor the lane takes.
    #[arg(long, value_name = "BYTES", value_parser = byte_size::<usize>, default_value = "32MiB", help_heading = heading::LANES)]
    pub multimodal_rdma_slot_bytes: usize,
    /// How long a published RDMA slot waits for its RPC to return before
    /// the reaper takes it back (a late read then fails as stale).
    #[arg(long, value_name = "MS", default_value_t = 30_000, help_heading = heading::LANES)]
    pub multimodal_rdma_deadline_ms: u64,

    // ==== Data plane ====
    /// Data-plane threads, each pinned to a core of its own (default: a
    /// quarter of the cores, at least one). The tokio runtime keeps the rest.
    #[arg(long, value_name = "N", help_heading = heading::DATAPLANE)]
    pub dataplane_cores: Option<usize>,
    /// Jobs each data-plane core's ring holds; a full ring is backpressure.
    #[arg(long, value_name = "JOBS", default_value_t = 64, help_heading = heading::DATAPLANE)]
    pub dataplane_ring_capacity: usize,
    /// How long an image waits for room on a full data plane before the
    /// request fails with `dataplane_busy` (503).
    #[arg(long, value_name = "MS", default_value_t = 1000, help_heading = heading::DATAPLANE)]
    pub dataplane_submit_timeout_ms: u64,
    /// The data plane's I/O loop: io_uring if it can be set up (auto), io_uring
    /// or refuse to start (uring), or the plain fallback loop (plain).
    #[arg(long, value_enum, default_value_t = DataplaneIo::Auto, help_heading = heading::DATAPLANE)]
    pub dataplane_io: DataplaneIo,

    // ==== Worker connections ====
    /// Most HTTP/2 connections to one worker; the pool grows toward it as
    /// streams fill the open connections.
    #[arg(long, value_name = "N", default_value_t = 4, help_heading = heading::CONNECTIONS)]
    pub worker_connections: usize,
    /// Streams one worker connection takes before another opens (lower if
    /// the worker advertises a lower SETTINGS_MAX_CONCURRENT_STREAMS).
    #[arg(long, value_name = "N", default_value_t = 100, help_heading = heading::CONNECTIONS)]
    pub worker_streams_per_connection: u32,
    /// Most requests one worker is sent at once; more wait in the gateway
    /// for a slot (bounded by the request timeout, and by admission's queue
    /// when --max-concurrent-requests is set), a PD/EPD request taking all
    /// its workers' slots together. `engine` (or 0): the
    /// max_running_requests its engine reports in GetLoads (re-read every
    /// --load-check-interval-secs; no limit if it reports none). `none`: no
    /// limit, whatever the engine reports (every request is sent at once).
    #[arg(long, value_name = "REQUESTS|engine|none", value_parser = in_flight_limit, default_value = "engine", help_heading = heading::CONNECTIONS)]
    pub worker_max_in_flight: InFlightLimit,
    /// HTTP/2 PING on each worker connection after this long without a
    /// byte from the worker (idle connections too). 30 s is what engines
    /// must tolerate (more often risks a `too_many_pings` GOAWAY).
    #[arg(long, value_name = "SECS", default_value_t = 30, help_heading = heading::CONNECTIONS)]
    pub worker_keepalive_interval_secs: u64,
    /// How long a PING may go unanswered before the connection is closed:
    /// the streams on it then fail as a connection failure (retried
    /// elsewhere when nothing reached the client). A black-holed worker's
    /// requests end within the interval plus this.
    #[arg(long, value_name = "SECS", default_value_t = 10, help_heading = heading::CONNECTIONS)]
    pub worker_keepalive_timeout_secs: u64,

    // ==== Health checks ====
    /// No periodic HealthCheck probes (a worker added through the admin API
    /// then needs one good probe).
    #[arg(long, help_heading = heading::HEALTH)]
    pub disable_health_check: bool,
    /// Remove a worker its health checks find unhealthy (not_ready or
    /// failed), as DELETE /workers/ID would: it drains and leaves the fleet
    /// until registered again. Default: it stays listed, out of rotation,
    /// until it recovers.
    #[arg(long, help_heading = heading::HEALTH)]
    pub remove_unhealthy_workers: bool,
    /// Pause between two HealthCheck probes of a worker.
    #[arg(long, value_name = "SECS", default_value_t = 10, help_heading = heading::HEALTH)]
    pub health_check_interval_secs: u64,
    /// Time a HealthCheck probe may take.
    #[arg(long, value_name = "SECS", default_value_t = 5, help_heading = heading::HEALTH)]
    pub health_check_timeout_secs: u64,
    /// Failed probes in a row that make a ready worker not ready.
    #[arg(long, value_name = "N", default_value_t = 3, help_heading = heading::HEALTH)]
    pub health_failure_threshold: u32,
    /// Good probes in a row that make a worker ready.
    #[arg(long, value_name = "N", default_value_t = 2, help_heading = heading::HEALTH)]
    pub health_success_threshold: u32,

    // ==== Circuit breaker ====
    /// Consecutive failed RPCs (within the window) that open a worker's circuit.
    #[arg(long, value_name = "N", default_value_t = 10, help_heading = heading::BREAKER)]
    pub cb_failure_threshold: u32,
    /// Successful trial RPCs that close a half-open circuit.
    #[arg(long, value_name = "N", default_value_t = 3, help_heading = heading::BREAKER)]
    pub cb_success_threshold: u32,
    /// How long an open circuit keeps a worker out before a trial.
    #[arg(long, value_name = "SECS", default_value_t = 60, help_heading = heading::BREAKER)]
    pub cb_timeout_duration_secs: u64,
    /// Failures count as consecutive only within this window.
    #[arg(long, value_name = "SECS", default_value_t = 120, help_heading = heading::BREAKER)]
    pub cb_window_duration_secs: u64,
    /// No circuit breakers.
    #[arg(long, help_heading = heading::BREAKER)]
    pub disable_circuit_breaker: bool,
    /// How soon a worker whose circuit opened is first probed with its
    /// health RPC; the pause doubles after each unhealthy answer, and a
    /// healthy one makes the circuit half-open. 0: no probes (the circuit
    /// waits out --cb-timeout-duration-secs).
    #[arg(long, value_name = "MS", default_value_t = 250, help_heading = heading::BREAKER)]
    pub cb_probe_interval_ms: u64,
    /// The longest pause between two probes of an open circuit.
    #[arg(long, value_name = "MS", default_value_t = 2000, help_heading = heading::BREAKER)]
    pub cb_probe_max_interval_ms: u64,

    // ==== Retries ====
    /// Retries of a failed request (on other workers when it can), before
    /// any output reached the client.
    #[arg(long, value_name = "N", default_value_t = 5, help_heading = heading::RETRY)]
    pub retry_max_retries: u32,
    /// Pause before the first retry.
    #[arg(long, value_name = "MS", default_value_t = 50, help_heading = heading::RETRY)]
    pub retry_initial_backoff_ms: u64,
    /// The longest pause between two retries.
    #[arg(long, value_name = "MS", default_value_t = 30_000, help_heading = heading::RETRY)]
    pub retry_max_backoff_ms: u64,
    /// Each pause is the previous one times this.
    #[arg(long, value_name = "RATIO", default_value_t = 1.5, help_heading = heading::RETRY)]
    pub retry_backoff_multiplier: f64,
    /// Each pause varies randomly by up to this share of itself (0 to 1).
    #[arg(long, value_name = "FRACTION", default_value_t = 0.2, help_heading = heading::RETRY)]
    pub retry_jitter_factor: f64,
    /// No retries.
    #[arg(long, help_heading = heading::RETRY)]
    pub disable_retries: bool,

    // ==== Request handling ====
    /// Whole-request timeout, streams included.
    #[arg(long, value_name = "SECS", default_value_t = 1800, help_heading = heading::REQUESTS)]
    pub request_timeout_secs: u64,
    /// Largest request body (bytes, or a size such as 32MiB; larger: 413
    /// payload_too_large).
    #[arg(long, value_name = "BYTES", value_parser = byte_size::<usize>, default_value = "512MiB", help_heading = heading::REQUESTS)]
    pub max_payload_size: usize,
    /// Largest request head, request line and headers (bytes, or a size
    /// such as 64KiB; larger: 431 headers_too_large).
    #[arg(long, value_name = "BYTES", value_parser = byte_size::<usize>, default_value = "64KiB", help_heading = heading::REQUESTS)]
    pub max_header_size: usize,
    /// Time a client has to send a request's head, from its connection's
    /// accept or from the first byte of a later request; then the
    /// connection is closed (slow-header clients).
    #[arg(long, value_name = "SECS", default_value_t = 10, help_heading = heading::REQUESTS)]
    pub header_read_timeout_secs: u64,
    /// Time a connection with no request in flight stays open (longer than
    /// the 60 s idle timeout of common load balancers, so they close first).
    #[arg(long, value_name = "SECS", default_value_t = 75, help_heading = heading::REQUESTS)]
    pub keep_alive_timeout_secs: u64,
    /// Open connections per listener; a connection over the cap is answered
    /// 503 too_many_connections with Retry-After and closed.
    #[arg(long, value_name = "N", default_value_t = 10_000, help_heading = heading::REQUESTS)]
    pub max_connections: usize,
    /// Headers a client's request id is read from, first present wins
    /// (repeatable). The id is returned as `x-request-id`.
    #[arg(
        long,
        num_args = 1..,
        value_name = "HEADER",
        action = ArgAction::Append,
        default_values_t = ["x-request-id", "x-correlation-id", "x-trace-id", "request-id"].map(String::from),
        help_heading = heading::REQUESTS
    )]
    pub request_id_headers: Vec<String>,
    /// Browser origins allowed to call the API (CORS), `scheme://host[:port]`
    /// or `*` (repeatable or comma-separated); none by default.
    #[arg(long, num_args = 1.., value_name = "ORIGIN", value_delimiter = ',', action = ArgAction::Append, help_heading = heading::REQUESTS)]
    pub cors_allowed_origins: Vec<String>,
    /// After SIGTERM (or SIGINT), how long requests and streams in flight
    /// may run before their connections are dropped and their engine legs
    /// aborted. A second signal stops at once.
    #[arg(long, value_name = "SECS", default_value_t = 180, help_heading = heading::REQUESTS)]
    pub shutdown_grace_period_secs: u64,
    /// The nice value (0-19) of the threads doing a request's CPU-heavy
    /// work (bodies over 64 KiB, large prompts, long template renders):
    /// under contention the request threads get the cores first. 0: the
    /// process's own priority.
    #[arg(long, value_name = "NICE", default_value_t = crate::offload::WorkThreads::DEFAULT_NICE, value_parser = clap::value_parser!(u8).range(0..=19), help_heading = heading::REQUESTS)]
    pub cpu_work_nice: u8,

    // ==== Admission ====
    /// Requests served at once (admission control); the rest wait in the
    /// queue. -1 (or 0): no limit.
    #[arg(long, value_name = "REQUESTS", default_value_t = -1, allow_hyphen_values = true, help_heading = heading::ADMISSION)]
    pub max_concurrent_requests: i64,
    /// Requests that may wait for a slot when all are taken; beyond it,
    /// 429 queue_full.
    #[arg(long, value_name = "REQUESTS", default_value_t = 100, help_heading = heading::ADMISSION)]
    pub queue_size: usize,
    /// How long a request may wait for a slot; then 408 queue_timeout.
    /// Fractions are taken (`0.25`): under overload every admitted request
    /// waits about this long at most, so it bounds their latency.
    #[arg(long, value_name = "SECS", default_value_t = 60.0, help_heading = heading::ADMISSION)]
    pub queue_timeout_secs: f64,
    /// Requests per second (a token bucket), per tenant when tenant keys
    /// are configured; unset: no rate limit.
    #[arg(long, value_name = "REQUESTS_PER_SEC", help_heading = heading::ADMISSION)]
    pub rate_limit_tokens_per_second: Option<f64>,
    /// The token bucket's capacity in requests (a burst); default: one
    /// second's worth of the rate, at least 1.
    #[arg(long, value_name = "REQUESTS", help_heading = heading::ADMISSION)]
    pub rate_limit_burst: Option<f64>,
    /// TENANT=CLASS: the tenant's priority class in the admission queue
    /// (system, interactive, default, bulk). Repeatable.
    #[arg(long, value_name = "TENANT=CLASS", help_heading = heading::ADMISSION)]
    pub tenant_priority: Vec<String>,

    // ==== Authentication ====
    /// The key inference routes require (`Authorization: Bearer KEY`, or
    /// `x-api-key: KEY` on /v1/messages); its tenant is `default`. Prefer
    /// the --config file to the command line for keys.
    #[arg(long, value_name = "KEY", help_heading = heading::AUTH)]
    pub api_key: Option<String>,
    /// A tenant's inference key, `TENANT:KEY` (repeatable); the tenant
    /// labels its requests' metrics and logs.
    #[arg(long, value_name = "TENANT:KEY", action = ArgAction::Append, help_heading = heading::AUTH)]
    pub tenant_api_key: Vec<String>,
    /// Keys of the admin routes (`/workers`), `ID:NAME:ROLE:KEY` with ROLE
    /// `admin` or `viewer` (reads only). With keys, admin routes are served
    /// on the public listener behind them; without, only on the admin
    /// listener.
    #[arg(long, num_args = 1.., value_name = "ID:NAME:ROLE:KEY", action = ArgAction::Append, help_heading = heading::AUTH)]
    pub control_plane_api_keys: Vec<String>,
    /// Address of the admin listener (admin routes without keys).
    #[arg(long, default_value = "127.0.0.1", help_heading = heading::AUTH)]
    pub admin_host: String,
    /// Port of the admin listener.
    #[arg(long, default_value_t = 30001, help_heading = heading::AUTH)]
    pub admin_port: u16,

    // ==== TLS ====
    /// PEM certificate chain (leaf first) served on the public and admin
    /// listeners, which then speak HTTPS only (needs --tls-key-path).
    /// Reloaded, with the key, on SIGHUP.
    #[arg(long, value_name = "FILE", help_heading = heading::TLS)]
    pub tls_cert_path: Option<PathBuf>,
    /// PEM private key of --tls-cert-path.
    #[arg(long, value_name = "FILE", help_heading = heading::TLS)]
    pub tls_key_path: Option<PathBuf>,
    /// PEM CA certificates `grpcs://` workers' certificates must chain to
    /// (repeatable); none: the public web PKI roots.
    #[arg(long, value_name = "FILE", action = ArgAction::Append, help_heading = heading::TLS)]
    pub ca_cert_path: Vec<PathBuf>,
    /// PEM certificate the gateway presents to `grpcs://` workers that ask
    /// for one (mTLS; needs --client-key-path).
    #[arg(long, value_name = "FILE", help_heading = heading::TLS)]
    pub client_cert_path: Option<PathBuf>,
    /// PEM private key of --client-cert-path.
    #[arg(long, value_name = "FILE", help_heading = heading::TLS)]
    pub client_key_path: Option<PathBuf>,

    // ==== Prometheus ====
    /// Address of the listener of /metrics and the probes (/liveness,
    /// /readiness, /health); defaults to --host.
    #[arg(long, value_name = "HOST", help_heading = heading::PROMETHEUS)]
    pub prometheus_host: Option<String>,
    /// Port of the listener of /metrics and the probes.
    #[arg(long, default_value_t = 29000, help_heading = heading::PROMETHEUS)]
    pub prometheus_port: u16,
    /// Another port serving the probes (/liveness, /readiness, /health, and
    /// /metrics as well) on --prometheus-host, for probes configured with
    /// SMG's dedicated port; unset: none.
    #[arg(long, value_name = "PORT", help_heading = heading::PROMETHEUS)]
    pub health_check_port: Option<u16>,

    // ==== Logging ====
    /// Least severe level logged (RUST_LOG, when set, wins).
    #[arg(long, value_enum, default_value_t = LogLevel::Info, help_heading = heading::LOGGING)]
    pub log_level: LogLevel,
    /// Log as JSON lines.
    #[arg(long, help_heading = heading::LOGGING)]
    pub log_json: bool,
    /// Also log to a file a day in this directory (created if need be):
    /// DIR/smg.YYYY-MM-DD (UTC), as SMG names them; never coloured.
    #[arg(long, value_name = "DIR", help_heading = heading::LOGGING)]
    pub log_dir: Option<PathBuf>,

    /// WARNs for the SMG flags given that have no effect here (filled in
    /// from the compatibility table, not a flag).
    #[arg(skip)]
    pub smg_warnings: Vec<String>,
    /// ANSI colours in log lines: auto (only when stderr is a terminal and
    /// NO_COLOR is unset), always or never.
    #[arg(long, value_name = "WHEN", default_value = "auto", help_heading = heading::LOGGING,
          value_parser = clap::builder::ValueParser::new(crate::logging::LogColor::from_str))]
    pub log_color: crate::logging::LogColor,
}

/// A worker URL and its optional bootstrap port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSpec {
    pub url: String,
    pub bootstrap_port: Option<u16>,
}

/// Groups `--prefill URL [PORT|none]` values (clap hands them over
/// flattened): a purely numeric value is the bootstrap port of the URL
/// before it, and `none` (as in SMG) says it has none to give: the worker
/// is asked.
pub fn worker_specs(flag: &'static str, values: &[String]) -> Result<Vec<WorkerSpec>, ConfigError> {
    let mut specs: Vec<WorkerSpec> = Vec::new();
    let mut port_given = false;
    for value in values {
        if value.eq_ignore_ascii_case("none") {
            match specs.last() {
                Some(spec) if spec.bootstrap_port.is_none() && !port_given => port_given = true,
                _ => {
                    return Err(ConfigError::new(
                        flag,
                        "`none` (no bootstrap port) follows no worker URL",
                    ));
                }
            }
        } else if value.chars().all(|c| c.is_ascii_digit()) {
            let port = value.parse().map_err(|_| {
                ConfigError::new(flag, format!("bootstrap port {value} is out of range"))
            })?;
            match specs.last_mut() {
                Some(spec) if spec.bootstrap_port.is_none() && !port_given => {
                    spec.bootstrap_port = Some(port);
                    port_given = true;
                }
                _ => {
                    return Err(ConfigError::new(
                        flag,
                        format!("bootstrap port {value} follows no worker URL"),
                    ));
                }
            }
        } else {
            specs.push(WorkerSpec {
                url: value.clone(),
                bootstrap_port: None,
            });
            port_given = false;
        }
    }
    Ok(specs)
}

/// `--runtime` (`--backend` in SMG): the engine protocols smg speaks, and
/// a clear refusal of SMG's other backends.
fn runtime_arg(text: &str) -> Result<RuntimeArg, String> {
    match text {
        "tokenspeed" => Ok(RuntimeArg::Tokenspeed),
        "sglang" => Ok(RuntimeArg::Sglang),
        "vllm" | "trtllm" | "openai" | "anthropic" | "gemini" => Err(format!(
            "smg drives tokenspeed and sglang engines over gRPC; {text} workers are not supported"
        )),
        other => Err(format!("unknown runtime {other:?} (tokenspeed or sglang)")),
    }
}

/// `--worker-max-in-flight`: a number of requests, `engine` (or 0) for
/// what each engine reports, `none` for no limit.
fn in_flight_limit(text: &str) -> Result<InFlightLimit, String> {
    match text.trim() {
        "engine" | "0" => Ok(InFlightLimit::Engine),
        "none" => Ok(InFlightLimit::Unlimited),
        number => number
            .parse()
            .map(InFlightLimit::Fixed)
            .map_err(|_| format!("{text:?} is not a number of requests, `engine` or `none`")),
    }
}

/// A byte count: a plain integer (SMG's form), or a number with a unit,
/// decimal (`KB`, `MB`, `GB`, `TB`) or binary (`KiB`, `MiB`, `GiB`, `TiB`;
/// `K`, `M`, `G`, `T` are binary too), in any case, with or without a space.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let unit = unit.trim();
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        _ => {
            return Err(format!(
                "{text:?} is not a size: give bytes (1048576) or a number with a unit \
                 (KB, MB, GB, KiB, MiB, GiB)"
            ));
        }
    };
    let too_large = || format!("{text:?} is too large");
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(scale).ok_or_else(too_large);
    }
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size: give bytes (1048576) or a number with a unit (KB, MB, GB, KiB, MiB, GiB)"))?;
    let bytes = (value * scale as f64).round();
    if unit.is_empty() || !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("{text:?} is not a whole number of bytes"));
    }
    Ok(bytes as u64)
}

/// clap's parser of a size flag, as `T`.
fn byte_size<T: TryFrom<u64>>(text: &str) -> Result<T, String> {
    let bytes = parse_bytes(text)?;
    T::try_from(bytes).map_err(|_| format!("{text:?} is too large"))
}

/// Parses `NAME=VALUE` flag values into a map, checking each value.
/// The parser flags, every name checked against the parsers that exist.
fn parser_settings(args: &LaunchArgs) -> Result<ParserSettings, ConfigError> {
    fn known(flag: &'static str, names: &[&str], name: &str) -> Result<String, ConfigError> {
        if names.contains(&name) {
            Ok(name.to_owned())
        } else {
            Err(ConfigError::new(
                flag,
                format!("unknown parser {name:?}; known: {}", names.join(", ")),
            ))
        }
    }
    let tools = smg_parsers::tool::PARSER_NAMES;
    let reasoning = smg_parsers::reasoning::PARSER_NAMES;
    Ok(ParserSettings {
        tool_call_parser: args
            .tool_call_parser
            .as_deref()
            .map(|name| known("tool-call-parser", tools, name))
            .transpose()?,
        reasoning_parser: args
            .reasoning_parser
            .as_deref()
            .map(|name| known("reasoning-parser", reasoning, name))
            .transpose()?,
        model_tool_call_parsers: named_values(
            "model-tool-call-parser",
            &args.model_tool_call_parser,
            |name| known("model-tool-call-parser", tools, name).map_err(|err| err.to_string()),
        )?,
        model_reasoning_parsers: named_values(
            "model-reasoning-parser",
            &args.model_reasoning_parser,
            |name| known("model-reasoning-parser", reasoning, name).map_err(|err| err.to_string()),
        )?,
    })
}

pub fn named_values<T>(
    flag: &'static str,
    values: &[String],
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<HashMap<String, T>, ConfigError> {
    values
        .iter()
        .map(|pair| {
            let (name, value) = pair
                .split_once('=')
                .filter(|(name, _)| !name.is_empty())
                .ok_or_else(|| ConfigError::new(flag, format!("{pair:?}: expected NAME=VALUE")))?;
            let value =
                parse(value).map_err(|why| ConfigError::new(flag, format!("{pair:?}: {why}")))?;
            Ok((name.to_owned(), value))
        })
        .collect()
}

/// Parses `URL=MODE[,min_bytes=N]` (`--worker-tensor-transport`) into the
/// worker's normalized URL and its override.
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

/// Whether `text` may name a tenant or a control-plane key: it ends up in
/// metric labels and log lines, so it is short and plain.
fn plain_name(text: &str) -> bool {
    (1..=64).contains(&text.len())
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'))
}

/// Whether `key` can be sent in an `Authorization` header at all.
fn sendable_key(key: &str) -> bool {
    !key.is_empty() && key.bytes().all(|b| b.is_ascii_graphic())
}

/// `--api-key` (tenant `default`) and `--tenant-api-key TENANT:KEY` values,
/// as digests. Refusals never quote a value: it may hold a key.
pub fn api_keys(api_key: Option<&str>, tenant_keys: &[String]) -> Result<Vec<ApiKey>, ConfigError> {
    let mut keys = Vec::new();
    if let Some(key) = api_key {
        if !sendable_key(key) {
            return Err(ConfigError::new(
                "api-key",
                "the key is empty or has characters a header cannot carry",
            ));
        }
        keys.push(ApiKey {
            tenant: DEFAULT_TENANT.to_owned(),
            digest: KeyDigest::of(key),
        });
    }
    for (index, value) in tenant_keys.iter().enumerate() {
        let flag = "tenant-api-key";
        let (tenant, key) = value.split_once(':').ok_or_else(|| {
            ConfigError::new(flag, format!("value {}: expected TENANT:KEY", index + 1))
        })?;
        if !plain_name(tenant) {
            return Err(ConfigError::new(
                flag,
                format!(
                    "value {}: the tenant must be 1 to 64 letters, digits or -_.@",
                    index + 1
                ),
            ));
        }
        if !sendable_key(key) {
            return Err(ConfigError::new(
                flag,
                format!(
                    "tenant {tenant}: the key is empty or has characters a header cannot carry"
                ),
            ));
        }
        let digest = KeyDigest::of(key);
        if keys
            .iter()
            .any(|known: &ApiKey| known.digest.matches(&digest))
        {
            return Err(ConfigError::new(
                flag,
                format!("tenant {tenant}: this key is already given (keys must be unique)"),
            ));
        }
        keys.push(ApiKey {
            tenant: tenant.to_owned(),
            digest,
        });
    }
    Ok(keys)
}

/// `--control-plane-api-keys ID:NAME:ROLE:KEY` values (the key may itself
/// contain `:`), as digests.
pub fn control_plane_keys(values: &[String]) -> Result<Vec<ControlPlaneKey>, ConfigError> {
    let flag = "control-plane-api-keys";
    let mut keys: Vec<ControlPlaneKey> = Vec::new();
    for (index, value) in values.iter().enumerate() {
        let mut parts = value.splitn(4, ':');
        let (Some(id), Some(name), Some(role), Some(key)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(ConfigError::new(
                flag,
                format!("value {}: expected ID:NAME:ROLE:KEY", index + 1),
            ));
        };
        if !plain_name(id) || !plain_name(name) {
            return Err(ConfigError::new(
                flag,
                format!(
                    "value {}: ID and NAME must be 1 to 64 letters, digits or -_.@",
                    index + 1
                ),
            ));
        }
        let role = match role {
            "admin" => AdminRole::Admin,
            "viewer" => AdminRole::Viewer,
            other => {
                return Err(ConfigError::new(
                    flag,
                    format!("key {id}: unknown role {other:?} (admin or viewer)"),
                ));
            }
        };
        if !sendable_key(key) {
            return Err(ConfigError::new(
                flag,
                format!("key {id}: the key is empty or has characters a header cannot carry"),
            ));
        }
        let digest = KeyDigest::of(key);
        if keys.iter().any(|known| known.id == id) {
            return Err(ConfigError::new(
                flag,
                format!("key {id}: the ID is used twice"),
            ));
        }
        if keys.iter().any(|known| known.digest.matches(&digest)) {
            return Err(ConfigError::new(
                flag,
                format!("key {id}: this key is already given (keys must be unique)"),
            ));
        }
        keys.push(ControlPlaneKey {
            id: id.to_owned(),
            name: name.to_owned(),
            role,
            digest,
        });
    }
    Ok(keys)
}

/// `--request-id-headers`: valid header names, lowercased, each once.
fn request_id_headers(values: &[String]) -> Result<Vec<String>, ConfigError> {
    let mut names: Vec<String> = Vec::new();
    for value in values {
        let name = value.trim().to_ascii_lowercase();
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(ConfigError::new(
                "request-id-headers",
                format!("{value:?} is not a header name"),
            ));
        }
        if !names.contains(&name) {
            names.push(name);
        }
    }
    if names.is_empty() {
        return Err(ConfigError::new(
            "request-id-headers",
            "name at least one header",
        ));
    }
    Ok(names)
}

/// `--cors-allowed-origins`: `*`, or origins (`scheme://host[:port]`).
fn cors_policy(values: &[String]) -> Result<CorsPolicy, ConfigError> {
    let flag = "cors-allowed-origins";
    let values: Vec<&str> = values
        .iter()
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
        .collect();
    if values.is_empty() {
        return Ok(CorsPolicy::Off);
    }
    if values.contains(&"*") {
        if values.len() > 1 {
            return Err(ConfigError::new(
                flag,
                "`*` allows every origin: give it alone",
            ));
        }
        return Ok(CorsPolicy::AnyOrigin);
    }
    let mut origins = Vec::new();
    for value in values {
        let origin = value.trim_end_matches('/');
        let uri: http::Uri = origin
            .parse()
            .map_err(|_| ConfigError::new(flag, format!("{value:?} is not an origin")))?;
        let well_formed = matches!(uri.scheme_str(), Some("http" | "https"))
            && uri.authority().is_some()
            && uri
                .path_and_query()
                .is_none_or(|p| p.as_str().is_empty() || p == "/");
        if !well_formed {
            return Err(ConfigError::new(
                flag,
                format!("{value:?} is not an origin (scheme://host[:port], nothing after)"),
            ));
        }
        origins.push(origin.to_owned());
    }
    Ok(CorsPolicy::Origins(origins))
}

/// The front door's part of the flags.
fn front_door(args: &LaunchArgs) -> Result<FrontDoorConfig, ConfigError> {
    let max_connections = at_least("max-connections", args.max_connections, 1)?;
    if max_connections > MAX_CONNECTIONS_CAP {
        return Err(ConfigError::new(
            "max-connections",
            format!("{max_connections} is above the maximum, {MAX_CONNECTIONS_CAP}"),
        ));
    }
    Ok(FrontDoorConfig {
        auth: AuthConfig {
            api_keys: api_keys(args.api_key.as_deref(), &args.tenant_api_key)?,
            control_plane_keys: control_plane_keys(&args.control_plane_api_keys)?,
        },
        limits: HttpLimits {
            max_payload_bytes: at_least("max-payload-size", args.max_payload_size, 1)?,
            max_header_bytes: at_least("max-header-size", args.max_header_size, 1024)?,
            header_read_timeout: seconds(
                "header-read-timeout-secs",
                args.header_read_timeout_secs,
            )?,
            keep_alive_timeout: seconds("keep-alive-timeout-secs", args.keep_alive_timeout_secs)?,
            max_connections,
        },
        request_id_headers: request_id_headers(&args.request_id_headers)?,
        cors: cors_policy(&args.cors_allowed_origins)?,
    })
}

/// A certificate flag and its key flag: both or neither.
fn tls_pair(
    (cert_flag, cert): (&'static str, &Option<PathBuf>),
    (key_flag, key): (&'static str, &Option<PathBuf>),
) -> Result<Option<TlsFiles>, ConfigError> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(TlsFiles {
            cert_path: cert.clone(),
            key_path: key.clone(),
        })),
        (None, None) => Ok(None),
        (Some(_), None) => Err(ConfigError::new(
            key_flag,
            format!("--{cert_flag} needs its private key"),
        )),
        (None, Some(_)) => Err(ConfigError::new(
            cert_flag,
            format!("--{key_flag} needs its certificate"),
        )),
    }
}

/// Tokens per page of the cache_aware tree (`--max-tree-size` counts tokens).
const CACHE_PAGE_TOKENS: usize = 16;

/// The tenant of `--api-key`.
pub const DEFAULT_TENANT: &str = "default";

/// The most `--max-connections` takes (a file descriptor each).
const MAX_CONNECTIONS_CAP: usize = 1 << 20;

/// `--chat-template PATH`: the file is read and compiled here, so that a
/// missing file or a template with a syntax error stops start-up naming the
/// flag instead of failing every request later. (It is compiled again per
/// model, with that model's special tokens as variables.)
fn chat_template_override(path: &std::path::Path) -> Result<ChatTemplateOverride, ConfigError> {
    const FLAG: &str = "chat-template";
    let source = std::fs::read_to_string(path)
        .map_err(|err| ConfigError::new(FLAG, format!("cannot read {}: {err}", path.display())))?;
    ChatTemplate::compile(source.clone(), &serde_json::Map::new())
        .map_err(|err| ConfigError::new(FLAG, format!("{}: {}", path.display(), err.message)))?;
    Ok(ChatTemplateOverride {
        path: path.to_owned(),
        source,
    })
}

/// `value`, refused below `min` (a zero interval, an empty ring...).
fn at_least<T: PartialOrd + std::fmt::Display>(
    flag: &'static str,
    value: T,
    min: T,
) -> Result<T, ConfigError> {
    if value < min {
        return Err(ConfigError::new(
            flag,
            format!("{value} is below the minimum, {min}"),
        ));
    }
    Ok(value)
}

/// `value`, refused above `max` (a percentage over 100...).
fn at_most<T: PartialOrd + std::fmt::Display>(
    flag: &'static str,
    value: T,
    max: T,
) -> Result<T, ConfigError> {
    if value > max {
        return Err(ConfigError::new(
            flag,
            format!("{value} is above the maximum, {max}"),
        ));
    }
    Ok(value)
}

/// Admission control from its flags.
fn admission(args: &LaunchArgs) -> Result<AdmissionConfig, ConfigError> {
    let rate = match args.rate_limit_tokens_per_second {
        None => None,
        Some(per_second) if per_second.is_finite() && per_second > 0.0 => {
            let burst = args.rate_limit_burst.unwrap_or(per_second.max(1.0));
            if !burst.is_finite() || burst < 1.0 {
                return Err(ConfigError::new(
                    "rate-limit-burst",
                    format!("{burst} is less than one request"),
                ));
            }
            Some(RateLimit { per_second, burst })
        }
        Some(other) => {
            return Err(ConfigError::new(
                "rate-limit-tokens-per-second",
                format!("{other} is not a positive rate"),
            ));
        }
    };
    Ok(AdmissionConfig {
        max_concurrent: usize::try_from(args.max_concurrent_requests)
            .ok()
            .filter(|&limit| limit > 0),
        queue_size: args.queue_size,
        queue_timeout: fractional_seconds("queue-timeout-secs", args.queue_timeout_secs)?,
        rate,
        tenant_priorities: named_values("tenant-priority", &args.tenant_priority, |class| {
            class.parse::<Priority>()
        })?,
    })
}

/// `--media-allow-private-host`, `--mcp-allow-private-host`: the SSRF
/// guard's exceptions, one syntax for both.
fn private_hosts(
    flag: &'static str,
    texts: &[String],
) -> Result<Vec<PrivateHostAllowance>, ConfigError> {
    texts
        .iter()
        .map(|text| {
            text.parse()
                .map_err(|err| ConfigError::new(flag, format!("{text}: {err}")))
        })
        .collect()
}

fn seconds(flag: &'static str, secs: u64) -> Result<Duration, ConfigError> {
    at_least(flag, secs, 1).map(Duration::from_secs)
}

/// A duration given in seconds with a fraction, at least a millisecond.
fn fractional_seconds(flag: &'static str, secs: f64) -> Result<Duration, ConfigError> {
    if !(secs.is_finite() && secs >= 0.001) {
        return Err(ConfigError::new(
            flag,
            format!("{secs} is not a duration of at least 0.001 seconds"),
        ));
    }
    Duration::try_from_secs_f64(secs).map_err(|err| ConfigError::new(flag, err.to_string()))
}

fn fraction(flag: &'static str, value: f64) -> Result<f64, ConfigError> {
    if !(0.0..=1.0).contains(&value) {
        return Err(ConfigError::new(
            flag,
            format!("{value} is not between 0 and 1"),
        ));
    }
    Ok(value)
}

/// The workers the flags name, and the mode they make.
fn fleet(args: &LaunchArgs) -> Result<FleetConfig, ConfigError> {
    let named_any = !args.prefill.is_empty() || !args.decode.is_empty() || !args.encode.is_empty();
    if args.enable_igw {
        if named_any || !args.worker_urls.is_empty() {
            return Err(ConfigError::new(
                "enable-igw",
                "an IGW gateway starts with no workers: register them with POST /workers",
            ));
        }
        return Ok(FleetConfig::Igw);
    }
    let mut workers = Vec::new();
    let mut add = |role, specs: Vec<WorkerSpec>| {
        workers.extend(specs.into_iter().map(|spec| WorkerAddress {
            url: spec.url,
            role,
            bootstrap_port: spec.bootstrap_port,
        }));
    };
    let unported = |urls: &[String]| {
        urls.iter()
            .map(|url| WorkerSpec {
                url: url.clone(),
                bootstrap_port: None,
            })
            .collect::<Vec<_>>()
    };
    let mode = if args.epd_disaggregation {
        add(WorkerRole::Encode, worker_specs("encode", &args.encode)?);
        Mode::EncodePrefillDecode
    } else if args.pd_disaggregation {
        if !args.encode.is_empty() {
            return Err(ConfigError::new(
                "encode",
                "encode workers need --epd-disaggregation",
            ));
        }
        Mode::PrefillDecode
    } else {
        if named_any {
            return Err(ConfigError::new(
                "pd-disaggregation",
                "--prefill/--decode/--encode need --pd-disaggregation or --epd-disaggregation",
            ));
        }
        Mode::Regular
    };
    if mode == Mode::Regular {
        add(WorkerRole::Regular, unported(&args.worker_urls));
    } else {
        add(WorkerRole::Prefill, worker_specs("prefill", &args.prefill)?);
        add(WorkerRole::Decode, unported(&args.decode));
    }
    let flag_of = |role: WorkerRole| match role {
        WorkerRole::Regular => "worker-urls",
        WorkerRole::Prefill => "prefill",
        WorkerRole::Decode => "decode",
        WorkerRole::Encode => "encode",
    };
    for worker in &workers {
        crate::engine::check_worker_url(&worker.url)
            .map_err(|err| ConfigError::new(flag_of(worker.role), err.message))?;
    }
    for role in mode.spec().required_roles {
        if !workers.iter().any(|worker| worker.role == *role) {
            let flag = flag_of(*role);
            return Err(ConfigError::new(
                flag,
                format!("{} mode needs at least one {role} worker", mode.name()),
            ));
        }
    }
    Ok(FleetConfig::Static { mode, workers })
}

impl TryFrom<LaunchArgs> for GatewayConfig {
    type Error = ConfigError;

    fn try_from(args: LaunchArgs) -> Result<Self, ConfigError> {
        let fleet = fleet(&args)?;
        let listen = ListenConfig {
            metrics_host: args
                .prometheus_host
                .clone()
                .unwrap_or_else(|| args.host.clone()),
            host: args.host.clone(),
            port: args.port,
            metrics_port: args.prometheus_port,
            probe_port: args.health_check_port,
            admin_host: args.admin_host.clone(),
            admin_port: args.admin_port,
            tls: tls_pair(
                ("tls-cert-path", &args.tls_cert_path),
                ("tls-key-path", &args.tls_key_path),
            )?,
        };
        let worker_tls = WorkerTlsFiles {
            ca_cert_paths: args.ca_cert_path.clone(),
            client: tls_pair(
                ("client-cert-path", &args.client_cert_path),
                ("client-key-path", &args.client_key_path),
            )?,
        };
        let front = front_door(&args)?;
        let model_policies = named_values("model-policy", &args.model_policy, |name| {
            name.parse::<PolicyKind>()
        })?;
        let model_retries = named_values("model-max-retries", &args.model_max_retries, |n| {
            n.parse::<u32>().map_err(|err| err.to_string())
        })?;
        let aliases = named_values("model-alias", &args.model_alias, |model| {
            Ok(model.to_owned())
        })?;
        let routing = RoutingConfig {
            policies: PolicyChoice {
                default: args.policy,
                prefill: args.prefill_policy,
                decode: args.decode_policy,
                encode: args.encode_policy,
            },
            tunables: PolicyTunables {
                cache_aware: CacheAwareConfig {
                    match_threshold: fraction("cache-threshold", args.cache_threshold)?,
                    balance_abs_threshold: args.balance_abs_threshold,
                    balance_rel_threshold: at_least(
                        "balance-rel-threshold",
                        args.balance_rel_threshold,
                        1.0,
                    )?,
                    // SMG counts tokens; the tree keeps 16-token pages.
                    max_pages: at_least("max-tree-size", args.max_tree_size, 1024)?
                        .div_ceil(CACHE_PAGE_TOKENS),
                    ..CacheAwareConfig::default()
                },
                prefix_hash: PrefixHashConfig {
                    prefix_tokens: at_least("prefix-token-count", args.prefix_token_count, 1)?,
                    load_factor: at_least(
                        "prefix-hash-load-factor",
                        args.prefix_hash_load_factor,
                        1.0,
                    )?,
                },
                manual: ManualConfig {
                    idle_ttl: seconds("max-idle-secs", args.max_idle_secs)?,
                    ..ManualConfig::default()
                },
                ..PolicyTunables::default()
            },
            model_policies,
            retry: RetryConfig {
                max_retries: args.retry_max_retries,
                initial_backoff: Duration::from_millis(args.retry_initial_backoff_ms),
                max_backoff: Duration::from_millis(args.retry_max_backoff_ms),
                multiplier: at_least(
                    "retry-backoff-multiplier",
                    args.retry_backoff_multiplier,
                    1.0,
                )?,
                jitter_factor: fraction("retry-jitter-factor", args.retry_jitter_factor)?,
                disabled: args.disable_retries,
            },
            model_retries,
            request_timeout: seconds("request-timeout-secs", args.request_timeout_secs)?,
            load_check_interval: seconds(
                "load-check-interval-secs",
                args.load_check_interval_secs,
            )?,
            aliases,
            panic_threshold: at_most("panic-threshold", args.panic_threshold, 100)?,
        };
        let probe_timeout = seconds("health-check-timeout-secs", args.health_check_timeout_secs)?;
        let health = HealthConfig::new(
            seconds(
                "health-check-interval-secs",
                args.health_check_interval_secs,
            )?,
            probe_timeout,
            at_least("health-failure-threshold", args.health_failure_threshold, 1)?,
            at_least("health-success-threshold", args.health_success_threshold, 1)?,
        );
        let lifecycle = Lifecycle {
            health: (!args.disable_health_check).then_some(health),
            breaker: BreakerConfig {
                enabled: !args.disable_circuit_breaker,
                failure_threshold: at_least("cb-failure-threshold", args.cb_failure_threshold, 1)?,
                success_threshold: at_least("cb-success-threshold", args.cb_success_threshold, 1)?,
                open_for: Duration::from_secs(args.cb_timeout_duration_secs),
                window: seconds("cb-window-duration-secs", args.cb_window_duration_secs)?,
                probe_interval: Duration::from_millis(args.cb_probe_interval_ms),
                max_probe_interval: Duration::from_millis(at_least(
                    "cb-probe-max-interval-ms",
                    args.cb_probe_max_interval_ms,
                    args.cb_probe_interval_ms,
                )?),
            },
            probe_timeout,
            dp_aware: args.dp_aware,
            connections: ConnectionConfig {
                max_connections: at_least("worker-connections", args.worker_connections, 1)?,
                streams_per_connection: at_least(
                    "worker-streams-per-connection",
                    args.worker_streams_per_connection,
                    1,
                )?,
                keepalive_interval: seconds(
                    "worker-keepalive-interval-secs",
                    args.worker_keepalive_interval_secs,
                )?,
                keepalive_timeout: seconds(
                    "worker-keepalive-timeout-secs",
                    args.worker_keepalive_timeout_secs,
                )?,
                ..ConnectionConfig::default()
            },
            max_in_flight: args.worker_max_in_flight,
            max_dp_ranks: at_least("max-dp-ranks", args.max_dp_ranks, 1)?,
            remove_unhealthy: args.remove_unhealthy_workers,
        };
        let overrides = args
            .worker_tensor_transport
            .iter()
            .map(|text| {
                parse_override(text).map_err(|why| ConfigError::new("worker-tensor-transport", why))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let lanes = LaneSettings {
            mode: args.multimodal_tensor_transport.mode(),
            min_bytes: usize::try_from(args.multimodal_shm_min_bytes).unwrap_or(usize::MAX),
            overrides,
            shm_dir: args.multimodal_shm_dir.clone(),
            shm_slot_bytes: at_least(
                "multimodal-shm-slot-bytes",
                args.multimodal_shm_slot_bytes,
                1,
            )?,
            shm_slots_per_core: args.multimodal_shm_slots_per_core,
            shm_reclaim_after: Duration::from_millis(args.multimodal_shm_reclaim_ms),
            shm_keep_free_bytes: args.multimodal_shm_keep_free_bytes,
            rdma_backend: args.multimodal_rdma_backend.backend(),
            rdma_slots: args.multimodal_rdma_slots,
            rdma_slot_bytes: args.multimodal_rdma_slot_bytes,
            rdma_deadline: Duration::from_millis(args.multimodal_rdma_deadline_ms),
        };
        let media = MediaConfig {
            max_bytes: args.media_max_bytes,
            max_images_per_request: args.max_images_per_request,
            fetch_timeout: seconds("media-fetch-timeout-secs", args.media_fetch_timeout_secs)?,
            allowed_file_dirs: args.allowed_local_media_path.clone(),
            allow_private_hosts: private_hosts(
                "media-allow-private-host",
                &args.media_allow_private_host,
            )?,
            ..MediaConfig::default()
        };
        let mcp = McpConfig {
            allow_private_hosts: private_hosts(
                "mcp-allow-private-host",
                &args.mcp_allow_private_host,
            )?,
            call_timeout: seconds("mcp-call-timeout-secs", args.mcp_call_timeout_secs)?,
            ..McpConfig::default()
        };
        let admission = admission(&args)?;
        let dataplane = DataPlaneSettings {
            cores: args
                .dataplane_cores
                .map(|n| at_least("dataplane-cores", n, 1))
                .transpose()?,
            ring_capacity: at_least("dataplane-ring-capacity", args.dataplane_ring_capacity, 1)?,
            submit_wait: Duration::from_millis(args.dataplane_submit_timeout_ms),
            io: args.dataplane_io.backend(),
        };
        Ok(GatewayConfig {
            cpu_work_nice: args.cpu_work_nice,
            listen,
            front,
            fleet,
            worker_tls,
            runtime: args.runtime.map(RuntimeArg::runtime),
            parsers: parser_settings(&args)?,
            history: history_config(&args)?,
            history_instance: args
                .history_instance
                .as_deref()
                .map(history_instance)
                .transpose()?,
            model: ModelSource {
                model_path: args.model_path,
                tokenizer_path: args.tokenizer_path,
                served_model_name: args.served_model_name,
                chat_template: args
                    .chat_template
                    .as_deref()
                    .map(chat_template_override)
                    .transpose()?,
                template_budget: TemplateBudget {
                    fuel: at_least("chat-template-fuel", args.chat_template_fuel, 1)?,
                },
            },
            routing,
            lifecycle,
            lanes,
            media,
            mcp,
            admission,
            dataplane,
            startup: StartupConfig {
                timeout: seconds(
                    "worker-startup-timeout-secs",
                    args.worker_startup_timeout_secs,
                )?,
                delay: Duration::from_secs(args.worker_startup_delay),
                first_backoff: StartupConfig::FIRST_BACKOFF,
                max_backoff: seconds(
                    "worker-startup-check-interval",
                    args.worker_startup_check_interval,
                )?
                .max(StartupConfig::FIRST_BACKOFF),
            },
            shutdown: ShutdownConfig {
                grace_period: Duration::from_secs(args.shutdown_grace_period_secs),
            },
            log: LogConfig {
                level: args.log_level.as_filter(),
                json: args.log_json,
                color: args.log_color,
                dir: args.log_dir,
            },
            warnings: {
                let mut warnings = args.smg_warnings;
                if args.remove_unhealthy_workers && args.disable_health_check {
                    warnings.push(
                        "--remove-unhealthy-workers has no effect with --disable-health-check: \
                         no health check finds a worker unhealthy"
                            .to_owned(),
                    );
                }
                warnings
            },
        })
    }
}

/// `--history-instance`: a name the store can key a lease by, and a log
/// line can show.
fn history_instance(name: &str) -> Result<String, ConfigError> {
    let refuse = |reason: &str| Err(ConfigError::new("history-instance", reason.to_owned()));
    if name.trim().is_empty() {
        return refuse("the instance name is empty");
    }
    if name.len() > 200 {
        return refuse("the instance name is longer than 200 bytes");
    }
    if name.chars().any(char::is_control) {
        return refuse("the instance name holds a control character");
    }
    Ok(name.to_owned())
}

/// `--history-backend` and the options of the backend it names.
fn history_config(args: &LaunchArgs) -> Result<HistoryConfig, ConfigError> {
    Ok(match args.history_backend {
        HistoryBackendArg::None => HistoryConfig::None,
        HistoryBackendArg::Memory => HistoryConfig::Memory,
        HistoryBackendArg::Sqlite => HistoryConfig::Sqlite {
            path: args.history_path.clone(),
        },
        HistoryBackendArg::Postgres => HistoryConfig::Postgres {
            url: args.history_url.clone().ok_or_else(|| {
                ConfigError::new(
                    "history-url",
                    "--history-backend postgres needs --history-url postgres://…",
                )
            })?,
            max_connections: at_least("postgres-pool-max-size", args.postgres_pool_max_size, 1)?,
            connect_timeout: seconds(
                "history-connect-timeout-secs",
                args.history_connect_timeout_secs,
            )?,
        },
    })
}

/// The defaults of every `smg launch` flag.
fn launch_defaults() -> Result<LaunchArgs, CliError> {
    let matches = command().try_get_matches_from(["smg", "launch"])?;
    let launch = matches
        .subcommand_matches("launch")
        .ok_or_else(|| ConfigError::new("config", "no launch command"))?;
    Ok(LaunchArgs::from_arg_matches(launch)?)
}

/// `smg demo`'s flags.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// The simulated fleet: one regular worker (regular), a prefill and a
    /// decode worker (pd), or an encode, a prefill and a decode worker (epd).
    #[arg(long, value_parser = PossibleValuesParser::new(["regular", "pd", "epd"]).try_map(|m| DemoMode::from_str(&m)), default_value = "regular")]
    pub mode: DemoMode,
    /// The worker protocol (EPD needs tokenspeed).
    #[arg(long, value_parser = PossibleValuesParser::new(["tokenspeed", "sglang"]), default_value = "tokenspeed")]
    pub protocol: String,
    /// The model directory; defaults to the bundled test model.
    #[arg(long, value_name = "DIR")]
    pub model_path: Option<PathBuf>,
    /// Port of the HTTP API (as `smg launch --port`).
    #[arg(long, default_value_t = 30000)]
    pub port: u16,
    /// Port of /metrics and the probes (as `smg launch --prometheus-port`).
    #[arg(long, default_value_t = 29000)]
    pub prometheus_port: u16,
    /// Port of the admin listener (as `smg launch --admin-port`).
    #[arg(long, default_value_t = 30001)]
    pub admin_port: u16,
    /// Data-plane threads (as `smg launch --dataplane-cores`).
    #[arg(long, value_name = "N")]
    pub dataplane_cores: Option<usize>,
    /// Where stored responses go (as `smg launch --history-backend`, but
    /// memory by default: a demo leaves no files behind).
    #[arg(long, value_enum, default_value_t = HistoryBackendArg::Memory)]
    pub history_backend: HistoryBackendArg,
    /// The sqlite file, with `--history-backend sqlite`.
    #[arg(long, value_name = "FILE", default_value = "smg-history.sqlite3")]
    pub history_path: PathBuf,
}

impl DemoArgs {
    /// The demo: `smg launch`'s defaults with the demo's ports and model;
    /// the fleet is filled in once the simulated workers run.
    fn plan(self) -> Result<DemoPlan, CliError> {
        // Flag defaults need a fleet; the demo's is made later.
        let mut defaults = launch_defaults()?;
        defaults.enable_igw = true;
        let mut gateway = GatewayConfig::try_from(defaults)?;
        gateway.listen.port = self.port;
        gateway.listen.metrics_port = self.prometheus_port;
        gateway.listen.admin_port = self.admin_port;
        gateway.dataplane.cores = self
            .dataplane_cores
            .map(|n| at_least("dataplane-cores", n, 1))
            .transpose()?;
        gateway.history = match self.history_backend {
            HistoryBackendArg::Sqlite => HistoryConfig::Sqlite {
                path: self.history_path,
            },
            HistoryBackendArg::Memory => HistoryConfig::Memory,
            HistoryBackendArg::None => HistoryConfig::None,
            HistoryBackendArg::Postgres => {
                return Err(ConfigError::new(
                    "history-backend",
                    "the demo keeps history in memory or sqlite; run `smg launch` for postgres",
                )
                .into());
            }
        };
        Ok(DemoPlan {
            mode: self.mode,
            protocol: self.protocol,
            model_path: self.model_path,
            gateway,
        })
    }
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

    fn config(line: &str) -> Result<GatewayConfig, CliError> {
        match parse_from(line.split_whitespace())? {
            Invocation::Launch(config) => Ok(*config),
            Invocation::Demo(_) => panic!("not a launch line"),
        }
    }

    fn refusal(line: &str) -> ConfigError {
        match config(line) {
            Err(CliError::Config(err)) => err,
            other => panic!("{line}: expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn postgres_history_flags_become_the_postgres_config() {
        let line = "smg launch --worker-urls grpc://a:1 --history-backend postgres \
                    --history-url postgres://db/h";
        let HistoryConfig::Postgres {
            url,
            max_connections,
            connect_timeout,
        } = config_ok(line).history
        else {
            panic!("{line}: not postgres");
        };
        assert_eq!(
            (url.as_str(), max_connections, connect_timeout),
            ("postgres://db/h", 16, Duration::from_secs(5))
        );
        let line = format!("{line} --postgres-pool-max-size 3 --history-connect-timeout-secs 1");
        assert!(matches!(
            config_ok(&line).history,
            HistoryConfig::Postgres {
                max_connections: 3,
                connect_timeout,
                ..
            } if connect_timeout == Duration::from_secs(1)
        ));
        let refused = refusal(
            "smg launch --worker-urls grpc://a:1 --history-backend postgres \
             --history-url postgres://db/h --history-connect-timeout-secs 0",
        );
        assert_eq!(refused.flag, "history-connect-timeout-secs");
    }

    #[test]
    fn the_history_instance_is_a_printable_name_or_left_to_the_host_and_port() {
        let line = "smg launch --worker-urls grpc://a:1";
        assert_eq!(config_ok(line).history_instance, None);
        assert_eq!(
            config_ok(&format!("{line} --history-instance gw-eu-1"))
                .history_instance
                .as_deref(),
            Some("gw-eu-1")
        );
        let long = "x".repeat(201);
        for bad in ["", "   ", "a\tb", long.as_str()] {
            let argv = line.split(' ').chain(["--history-instance", bad]);
            match parse_from(argv) {
                Err(CliError::Config(refused)) => {
                    assert_eq!(refused.flag, "history-instance", "{bad:?}");
                }
                other => panic!("{bad:?}: expected a config error, got {other:?}"),
            }
        }
    }

    #[test]
    fn worker_keepalive_flags_set_the_pools_pings() {
        let defaults = config_ok("smg launch --worker-urls grpc://a:1").lifecycle;
        assert_eq!(
            (
                defaults.connections.keepalive_interval,
                defaults.connections.keepalive_timeout
            ),
            (Duration::from_secs(30), Duration::from_secs(10)),
            "the wire contract's 30 s, and a pong within 10 s"
        );
        let set = config_ok(
            "smg launch --worker-urls grpc://a:1 --worker-keepalive-interval-secs 2 \
             --worker-keepalive-timeout-secs 3",
        )
        .lifecycle;
        assert_eq!(
            (
                set.connections.keepalive_interval,
                set.connections.keepalive_timeout
            ),
            (Duration::from_secs(2), Duration::from_secs(3))
        );
        for flag in [
            "worker-keepalive-interval-secs",
            "worker-keepalive-timeout-secs",
        ] {
            let refused = refusal(&format!("smg launch --worker-urls grpc://a:1 --{flag} 0"));
            assert_eq!(refused.flag, flag);
        }
    }

    #[test]
    fn mcp_flags_become_the_mcp_config_with_the_media_guards_syntax() {
        let defaults = config_ok("smg launch --worker-urls grpc://a:1");
        assert_eq!(defaults.mcp, crate::mcp::McpConfig::default());
        assert_eq!(defaults.mcp.call_timeout, Duration::from_secs(30));
        let config = config_ok(
            "smg launch --worker-urls grpc://a:1 --mcp-allow-private-host 10.0.0.0/8 \
             --mcp-allow-private-host *.corp.example --mcp-call-timeout-secs 5 \
             --media-allow-private-host 127.0.0.1",
        );
        let allowances: Vec<PrivateHostAllowance> = ["10.0.0.0/8", "*.corp.example"]
            .iter()
            .map(|text| text.parse().expect("valid allowance"))
            .collect();
        assert_eq!(config.mcp.allow_private_hosts, allowances);
        assert_eq!(config.mcp.call_timeout, Duration::from_secs(5));
        assert_eq!(
            config.media.allow_private_hosts,
            vec!["127.0.0.1".parse().expect("valid allowance")],
            "the two guards' exceptions stay apart"
        );
    }

    #[test]
    fn a_launch_line_becomes_one_typed_config() {
        let config = config(
            "smg launch --pd-disaggregation --prefill grpc://a:1 8998 --decode grpc://c:1 \
             --policy round_robin --decode-policy least_load --retry-max-retries 5 \
             --model-max-retries m=1 --model-policy m=random --model-alias gpt=m \
             --runtime sglang --disable-health-check --health-check-timeout-secs 7 \
             --request-timeout-secs 9 --multimodal-tensor-transport shm \
             --worker-tensor-transport grpc://a:1=inline --dataplane-io plain --log-json",
        )
        .expect("valid");
        assert_eq!(
            config.fleet,
            FleetConfig::Static {
                mode: Mode::PrefillDecode,
                workers: vec![
                    WorkerAddress {
                        url: "grpc://a:1".into(),
                        role: WorkerRole::Prefill,
                        bootstrap_port: Some(8998)
                    },
                    WorkerAddress {
                        url: "grpc://c:1".into(),
                        role: WorkerRole::Decode,
                        bootstrap_port: None
                    },
                ]
            }
        );
        assert_eq!(config.runtime, Some(Runtime::Sglang));
        let routing = &config.routing;
        assert_eq!(routing.policies.default, PolicyKind::RoundRobin);
        assert_eq!(routing.policies.decode, Some(PolicyKind::LeastLoad));
        assert_eq!(routing.retry_for(None).max_retries, 5);
        assert_eq!(routing.retry_for(Some("m")).max_retries, 1);
        assert_eq!(routing.role_policies(Some("m")).decode.name(), "random");
        assert_eq!(routing.role_policies(None).decode.name(), "least_load");
        assert_eq!(routing.aliases.get("gpt").map(String::as_str), Some("m"));
        assert_eq!(routing.request_timeout, Duration::from_secs(9));
        assert!(config.lifecycle.health.is_none());
        assert_eq!(config.lifecycle.probe_timeout, Duration::from_secs(7));
        assert_eq!(routing.panic_threshold, 50, "Envoy's default");
        assert_eq!(config.lifecycle.connections, ConnectionConfig::default());
        assert_eq!(config.lifecycle.max_in_flight, InFlightLimit::Engine);
        let breaker = config.lifecycle.breaker;
        assert_eq!(breaker.probe_interval, Duration::from_millis(250));
        assert_eq!(breaker.max_probe_interval, Duration::from_secs(2));
        assert_eq!(
            config.lifecycle.max_dp_ranks,
            Lifecycle::DEFAULT_MAX_DP_RANKS
        );
        assert_eq!(config.lanes.mode, LaneMode::Shm);
        assert_eq!(
            config.lanes.overrides,
            [(
                "a:1".to_owned(),
                WorkerLaneOverride {
                    mode: LaneMode::Inline,
                    min_bytes: None
                }
            )]
        );
        assert_eq!(config.dataplane.io, IoBackend::Plain);
        assert!(config.log.json);
        assert_eq!(config.listen.metrics_host, "127.0.0.1");
    }

    #[test]
    fn the_worker_in_flight_limit_follows_the_engine_a_number_or_nothing() {
        let limit = |flag: &str| {
            config(&format!("smg launch --worker-urls grpc://a:1 {flag}"))
                .map(|config| config.lifecycle.max_in_flight)
        };
        assert_eq!(limit("").ok(), Some(InFlightLimit::Engine), "the default");
        assert_eq!(
            limit("--worker-max-in-flight engine").ok(),
            Some(InFlightLimit::Engine)
        );
        assert_eq!(
            limit("--worker-max-in-flight 0").ok(),
            Some(InFlightLimit::Engine),
            "0 keeps meaning the engine's report"
        );
        assert_eq!(
            limit("--worker-max-in-flight 16").ok(),
            Some(InFlightLimit::Fixed(16))
        );
        assert_eq!(
            limit("--worker-max-in-flight none").ok(),
            Some(InFlightLimit::Unlimited)
        );
        assert!(!InFlightLimit::Unlimited.follows_engine());
        assert!(!InFlightLimit::Fixed(16).follows_engine());
        for bad in ["-1", "many", "1.5"] {
            assert!(
                limit(&format!("--worker-max-in-flight {bad}")).is_err(),
                "{bad} is refused"
            );
        }
    }

    #[test]
    fn bad_values_are_refused_naming_their_flag() {
        let cases = [
            ("smg launch", "worker-urls"),
            (
                "smg launch --pd-disaggregation --decode grpc://d:1",
                "prefill",
            ),
            ("smg launch --prefill grpc://p:1", "pd-disaggregation"),
            (
                "smg launch --enable-igw --worker-urls grpc://a:1",
                "enable-igw",
            ),
            (
                "smg launch --worker-urls grpc://a:1 --health-check-interval-secs 0",
                "health-check-interval-secs",
            ),
            (
                "smg launch --worker-urls grpc://a:1 --cb-failure-threshold 0",
                "cb-failure-threshold",
            ),
            (
                "smg launch --worker-urls grpc://a:1 --dataplane-ring-capacity 0",
                "dataplane-ring-capacity",
            ),
            (
                "smg launch --worker-urls grpc://a:1 --cache-threshold 2",
                "cache-threshold",
            ),
            (
                "smg launch --worker-urls grpc://a:1 --retry-jitter-factor 1.5",
                "retry-jitter-factor",
            ),
            (
                "smg launch --worker-urls grpc://a:1 --model-policy m=fastest",
                "model-policy",
            ),
            (
                "smg launch --worker-urls grpc://a:1 --model-max-retries m",
                "model-max-retries",
            ),
            (
                "smg launch --worker-urls grpc://a:1 --worker-tensor-transport a=tcp",
                "worker-tensor-transport",
            ),
            (
                "smg launch --worker-urls grpc://a:1 --media-allow-private-host not/a/net",
                "media-allow-private-host",
            ),
            (
                "smg launch --worker-urls grpc://a:1 --mcp-allow-private-host not/a/net",
                "mcp-allow-private-host",
            ),
            (
                "smg launch --worker-urls grpc://a:1 --mcp-call-timeout-secs 0",
                "mcp-call-timeout-secs",
            ),
            (
                "smg launch --pd-disaggregation --prefill 9000 --decode grpc://d:1",
                "prefill",
            ),
            (
                "smg launch --worker-urls grpc://a:1 --dp-aware --max-dp-ranks 0",
                "max-dp-ranks",
            ),
            (
                "smg launch --worker-urls grpc://a:1 --queue-timeout-secs 0",
                "queue-timeout-secs",
            ),
            (
                "smg launch --worker-urls grpc://a:1 --queue-timeout-secs NaN",
                "queue-timeout-secs",
            ),
        ];
        for (line, flag) in cases {
            let err = refusal(line);
            assert_eq!(err.flag, flag, "{line}: {err}");
            assert!(err.to_string().starts_with(&format!("--{flag}: ")), "{err}");
        }
        assert!(matches!(
            config("smg launch --policy fastest"),
            Err(CliError::Syntax(_))
        ));
    }

    #[test]
    fn front_door_flags_become_keys_limits_ids_and_cors() {
        let config = config(
            "smg launch --worker-urls grpc://a:1 --api-key sk-main \
             --tenant-api-key team-a:sk-a --tenant-api-key team-b:sk:with:colons \
             --control-plane-api-keys ops:alice:admin:cp-1 dash:grafana:viewer:cp-2 \
             --admin-host 0.0.0.0 --admin-port 31001 --max-payload-size 1048576 \
             --max-header-size 8192 --header-read-timeout-secs 3 --keep-alive-timeout-secs 9 \
             --max-connections 64 --request-id-headers X-Trace-Id x-request-id \
             --cors-allowed-origins https://a.example,http://localhost:3000/",
        )
        .expect("valid");
        let auth = &config.front.auth;
        let tenants: Vec<_> = auth.api_keys.iter().map(|k| k.tenant.as_str()).collect();
        assert_eq!(tenants, ["default", "team-a", "team-b"]);
        assert!(
            auth.api_keys[2]
                .digest
                .matches(&KeyDigest::of("sk:with:colons"))
        );
        let operators: Vec<_> = auth
            .control_plane_keys
            .iter()
            .map(|k| (k.id.as_str(), k.name.as_str(), k.role))
            .collect();
        assert_eq!(
            operators,
            [
                ("ops", "alice", AdminRole::Admin),
                ("dash", "grafana", AdminRole::Viewer)
            ]
        );
        assert!(
            auth.control_plane_keys[1]
                .digest
                .matches(&KeyDigest::of("cp-2"))
        );
        assert!(
            !format!("{config:?}").contains("sk-main"),
            "a printed config holds no key"
        );
        assert_eq!(
            (config.listen.admin_host.as_str(), config.listen.admin_port),
            ("0.0.0.0", 31001)
        );
        assert_eq!(
            config.front.limits,
            HttpLimits {
                max_payload_bytes: 1 << 20,
                max_header_bytes: 8192,
                header_read_timeout: Duration::from_secs(3),
                keep_alive_timeout: Duration::from_secs(9),
                max_connections: 64,
            }
        );
        assert_eq!(
            config.front.request_id_headers,
            ["x-trace-id", "x-request-id"]
        );
        assert_eq!(
            config.front.cors,
            CorsPolicy::Origins(vec![
                "https://a.example".into(),
                "http://localhost:3000".into()
            ])
        );
    }

    #[test]
    fn the_front_door_defaults_are_open_but_bounded() {
        let config = config("smg launch --worker-urls grpc://a:1").expect("valid");
        let front = &config.front;
        assert_eq!(front.auth, AuthConfig::default());
        assert_eq!(
            (config.listen.admin_host.as_str(), config.listen.admin_port),
            ("127.0.0.1", 30001),
            "admin routes stay on loopback"
        );
        assert_eq!(front.limits.max_payload_bytes, 512 << 20, "as in SMG");
        assert_eq!(front.limits.max_header_bytes, 64 << 10);
        assert_eq!(front.limits.header_read_timeout, Duration::from_secs(10));
        assert_eq!(front.limits.keep_alive_timeout, Duration::from_secs(75));
        assert_eq!(front.limits.max_connections, 10_000);
        assert_eq!(
            front.request_id_headers,
            [
                "x-request-id",
                "x-correlation-id",
                "x-trace-id",
                "request-id"
            ],
            "SMG's defaults"
        );
        assert_eq!(front.cors, CorsPolicy::Off);
        let any =
            super::tests::config("smg launch --worker-urls grpc://a:1 --cors-allowed-origins *")
                .expect("valid");
        assert_eq!(any.front.cors, CorsPolicy::AnyOrigin);
    }

    #[test]
    fn the_queue_timeout_takes_fractions_of_a_second() {
        let timeout = |line: &str| config(line).expect("valid").admission.queue_timeout;
        assert_eq!(
            timeout("smg launch --worker-urls grpc://a:1"),
            Duration::from_secs(60),
            "as in SMG"
        );
        assert_eq!(
            timeout("smg launch --worker-urls grpc://a:1 --queue-timeout-secs 5"),
            Duration::from_secs(5)
        );
        assert_eq!(
            timeout("smg launch --worker-urls grpc://a:1 --queue-timeout-secs 0.25"),
            Duration::from_millis(250)
        );
    }

    #[test]
    fn bad_key_flags_are_refused_naming_the_flag_but_never_the_key() {
        let cases = [
            ("--tenant-api-key sk-secret", "tenant-api-key"),
            ("--tenant-api-key :sk-secret", "tenant-api-key"),
            ("--tenant-api-key bad/tenant:sk-secret", "tenant-api-key"),
            ("--tenant-api-key team-a:", "tenant-api-key"),
            (
                "--tenant-api-key a:sk-secret --tenant-api-key b:sk-secret",
                "tenant-api-key",
            ),
            (
                "--api-key sk-secret --tenant-api-key a:sk-secret",
                "tenant-api-key",
            ),
            (
                "--control-plane-api-keys ops:alice:sk-secret",
                "control-plane-api-keys",
            ),
            (
                "--control-plane-api-keys ops:alice:owner:sk-secret",
                "control-plane-api-keys",
            ),
            (
                "--control-plane-api-keys ops::admin:sk-secret",
                "control-plane-api-keys",
            ),
            (
                "--control-plane-api-keys ops:alice:admin:",
                "control-plane-api-keys",
            ),
            (
                "--control-plane-api-keys ops:a:admin:sk-secret ops:b:viewer:other",
                "control-plane-api-keys",
            ),
            (
                "--control-plane-api-keys ops:a:admin:sk-secret dash:b:viewer:sk-secret",
                "control-plane-api-keys",
            ),
            ("--request-id-headers bad(name)", "request-id-headers"),
            (
                "--cors-allowed-origins ftp://a.example",
                "cors-allowed-origins",
            ),
            (
                "--cors-allowed-origins https://a.example/path",
                "cors-allowed-origins",
            ),
            (
                "--cors-allowed-origins *,https://a.example",
                "cors-allowed-origins",
            ),
            ("--max-connections 0", "max-connections"),
            ("--max-connections 99999999", "max-connections"),
            ("--max-header-size 100", "max-header-size"),
            ("--max-payload-size 0", "max-payload-size"),
            ("--header-read-timeout-secs 0", "header-read-timeout-secs"),
            ("--keep-alive-timeout-secs 0", "keep-alive-timeout-secs"),
        ];
        for (flags, flag) in cases {
            let line = format!("smg launch --worker-urls grpc://a:1 {flags}");
            let err = refusal(&line);
            assert_eq!(err.flag, flag, "{line}: {err}");
            assert!(
                !err.reason.contains("sk-secret"),
                "{line}: {err} shows the key"
            );
        }
    }

    #[test]
    fn keys_can_come_from_the_config_file() {
        let file = write_config(
            r#"
            worker-urls = ["grpc://a:1"]
            api-key = "sk-main"
            tenant-api-key = ["team-a:sk-a"]
            control-plane-api-keys = ["ops:alice:admin:cp-1"]
            cors-allowed-origins = ["https://a.example"]
            max-connections = 5
            "#,
        );
        let line = format!("smg launch --config {}", file.path().display());
        let config = config(&line).expect("valid");
        assert_eq!(config.front.auth.api_keys.len(), 2);
        assert_eq!(config.front.auth.control_plane_keys[0].id, "ops");
        assert_eq!(config.front.limits.max_connections, 5);
        assert_eq!(
            config.front.cors,
            CorsPolicy::Origins(vec!["https://a.example".into()])
        );
    }

    #[test]
    fn tls_files_come_in_pairs() {
        let secure = config(
            "smg launch --worker-urls grpcs://w:1 --tls-cert-path c.pem --tls-key-path k.pem \
             --ca-cert-path a.pem --ca-cert-path b.pem \
             --client-cert-path cc.pem --client-key-path ck.pem",
        )
        .expect("valid");
        let pair = |cert: &str, key: &str| TlsFiles {
            cert_path: cert.into(),
            key_path: key.into(),
        };
        assert_eq!(secure.listen.tls, Some(pair("c.pem", "k.pem")));
        assert_eq!(
            secure.worker_tls,
            WorkerTlsFiles {
                ca_cert_paths: vec!["a.pem".into(), "b.pem".into()],
                client: Some(pair("cc.pem", "ck.pem")),
            }
        );
        let plain = config("smg launch --worker-urls grpc://w:1").expect("valid");
        assert_eq!(plain.listen.tls, None);
        assert_eq!(plain.worker_tls, WorkerTlsFiles::default());
        for (line, flag) in [
            ("--tls-cert-path c.pem", "tls-key-path"),
            ("--tls-key-path k.pem", "tls-cert-path"),
            ("--client-cert-path c.pem", "client-key-path"),
            ("--client-key-path k.pem", "client-cert-path"),
        ] {
            let err = refusal(&format!("smg launch --worker-urls grpc://w:1 {line}"));
            assert_eq!(err.flag, flag, "{line}: {err}");
        }
    }

    #[test]
    fn the_grace_period_defaults_to_smgs_and_comes_from_a_flag_or_the_file() {
        let grace = |line: &str| config(line).expect("valid").shutdown.grace_period.as_secs();
        assert_eq!(grace("smg launch --worker-urls grpc://a:1"), 180);
        assert_eq!(
            grace("smg launch --worker-urls grpc://a:1 --shutdown-grace-period-secs 0"),
            0,
            "zero: cut at once"
        );
        let file = write_config("shutdown-grace-period-secs = 30\nworker-urls = [\"grpc://a:1\"]");
        assert_eq!(
            grace(&format!("smg launch --config {}", file.path().display())),
            30
        );
    }

    fn write_config(text: &str) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        std::io::Write::write_all(&mut file, text.as_bytes()).expect("written");
        file
    }

    #[test]
    fn a_config_file_sets_flags_and_the_command_line_wins() {
        let file = write_config(
            r#"
            pd-disaggregation = true
            prefill = [["grpc://p:1", 8998], "grpc://p:2"]
            decode = ["grpc://d:1"]
            policy = "round_robin"
            port = 31000
            disable-retries = true
            cache-threshold = 0.25
            model-path = "/models/m"
            "#,
        );
        let path = file.path().display().to_string();
        let config = config(&format!("smg launch --config {path} --port 32000")).expect("valid");
        let FleetConfig::Static { mode, workers } = &config.fleet else {
            panic!("static fleet")
        };
        assert_eq!(*mode, Mode::PrefillDecode);
        let ports: Vec<_> = workers
            .iter()
            .map(|w| (w.url.as_str(), w.bootstrap_port))
            .collect();
        assert_eq!(
            ports,
            [
                ("grpc://p:1", Some(8998)),
                ("grpc://p:2", None),
                ("grpc://d:1", None)
            ]
        );
        assert_eq!(config.listen.port, 32000, "the command line wins");
        assert_eq!(config.routing.policies.default, PolicyKind::RoundRobin);
        assert!(config.routing.retry.disabled);
        assert_eq!(config.routing.tunables.cache_aware.match_threshold, 0.25);
        assert_eq!(
            config.model.model_path.as_deref(),
            Some(std::path::Path::new("/models/m"))
        );

        // A list on the command line replaces the file's list.
        let config =
            super::tests::config(&format!("smg launch --config {path} --decode grpc://d:9"))
                .expect("valid");
        let FleetConfig::Static { workers, .. } = &config.fleet else {
            panic!("static fleet")
        };
        let decoders: Vec<_> = workers
            .iter()
            .filter(|w| w.role == WorkerRole::Decode)
            .map(|w| w.url.as_str())
            .collect();
        assert_eq!(decoders, ["grpc://d:9"]);
    }

    #[test]
    fn a_config_file_with_unknown_or_bad_keys_is_refused() {
        for (text, expected) in [
            (
                "worker-url = [\"grpc://a:1\"]",
                "unknown key \"worker-url\"",
            ),
            ("config = \"other.toml\"", "unknown key \"config\""),
            ("worker-urls = [{a = 1}]", "not a flag value"),
            ("worker-urls = [", "TOML"),
        ] {
            let file = write_config(text);
            let line = format!("smg launch --config {}", file.path().display());
            let err = refusal(&line);
            assert_eq!(err.flag, "config", "{text}");
            assert!(
                err.reason.contains(expected) || (expected == "TOML" && !err.reason.is_empty()),
                "{text}: {err}"
            );
        }
        let err = refusal("smg launch --config /nonexistent/smg.toml");
        assert!(err.reason.contains("/nonexistent/smg.toml"), "{err}");
        let file = write_config("policy = \"fastest\"\nworker-urls = [\"grpc://a:1\"]");
        let line = format!("smg launch --config {}", file.path().display());
        assert!(matches!(config(&line), Err(CliError::Syntax(_))));
    }

    #[test]
    fn the_demo_takes_launch_defaults_with_its_own_ports() {
        let plan = match parse_from(["smg", "demo", "--mode", "pd", "--port", "31001"]) {
            Ok(Invocation::Demo(plan)) => plan,
            other => panic!("{other:?}"),
        };
        assert_eq!(plan.mode, DemoMode::Pd);
        assert_eq!(plan.gateway.listen.port, 31001);
        assert_eq!(plan.gateway.listen.metrics_port, 29000);
        assert_eq!(
            plan.gateway.routing.policies.default,
            PolicyKind::CacheAware
        );
        assert_eq!(plan.gateway.lanes.mode, LaneMode::Auto);
        assert!(parse_from(["smg", "demo", "--mode", "xpd"]).is_err());
    }

    #[test]
    fn launch_is_implied_by_a_leading_flag_as_in_smg() {
        for line in [
            "smg --worker-urls grpc://a:1",
            "smg launch --worker-urls grpc://a:1",
            "smg start --worker-urls grpc://a:1",
        ] {
            let config = config(line).expect(line);
            assert_eq!(
                config.fleet,
                FleetConfig::Static {
                    mode: Mode::Regular,
                    workers: vec![WorkerAddress {
                        url: "grpc://a:1".into(),
                        role: WorkerRole::Regular,
                        bootstrap_port: None
                    }]
                },
                "{line}"
            );
        }
        let file = write_config("worker-urls = [\"grpc://a:1\"]\nport = 31000");
        let line = format!("smg --config {}", file.path().display());
        assert_eq!(config(&line).expect("valid").listen.port, 31000);
        for help in ["smg --help", "smg -h", "smg --version"] {
            match parse_from(help.split_whitespace()) {
                Err(CliError::Syntax(err)) => assert!(
                    matches!(
                        err.kind(),
                        clap::error::ErrorKind::DisplayHelp
                            | clap::error::ErrorKind::DisplayVersion
                    ),
                    "{help}: {err}"
                ),
                other => panic!("{help}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_bootstrap_port_may_be_none_as_in_smg() {
        let config = config(
            "smg launch --pd-disaggregation --prefill grpc://p:1 none --prefill grpc://p:2 9000 \
             --prefill grpc://p:3 NONE --decode grpc://d:1",
        )
        .expect("valid");
        let FleetConfig::Static { workers, .. } = &config.fleet else {
            panic!("static fleet")
        };
        let ports: Vec<_> = workers
            .iter()
            .map(|w| (w.url.as_str(), w.bootstrap_port))
            .collect();
        assert_eq!(
            ports,
            [
                ("grpc://p:1", None),
                ("grpc://p:2", Some(9000)),
                ("grpc://p:3", None),
                ("grpc://d:1", None)
            ]
        );
        for values in [&["none"][..], &["grpc://p:1", "9000", "none"]] {
            let values: Vec<String> = values.iter().map(|v| (*v).to_owned()).collect();
            assert!(worker_specs("prefill", &values).is_err(), "{values:?}");
        }
    }

    #[test]
    fn smgs_spellings_name_the_same_flags() {
        let config = config(
            "smg --worker-urls grpc://a:1 --model /models/m --backend sglang \
             --load-monitor-interval 7",
        )
        .expect("valid");
        assert_eq!(
            config.model.model_path.as_deref(),
            Some(std::path::Path::new("/models/m"))
        );
        assert_eq!(config.runtime, Some(Runtime::Sglang));
        assert_eq!(config.routing.load_check_interval, Duration::from_secs(7));
        let file = write_config("worker-urls = [\"grpc://a:1\"]\nmodel = \"/models/f\"");
        let from_file = super::tests::config(&format!("smg --config {}", file.path().display()))
            .expect("valid");
        assert_eq!(
            from_file.model.model_path.as_deref(),
            Some(std::path::Path::new("/models/f"))
        );
        match config_err("smg --worker-urls grpc://a:1 --backend vllm") {
            CliError::Syntax(err) => {
                assert!(err.to_string().contains("tokenspeed and sglang"), "{err}")
            }
            other => panic!("{other:?}"),
        }
    }

    fn config_err(line: &str) -> CliError {
        match config(line) {
            Err(err) => err,
            Ok(config) => panic!("{line}: accepted as {config:?}"),
        }
    }

    #[test]
    fn sizes_take_units_and_plain_byte_counts() {
        let cases = [
            ("1048576", Some(1 << 20)),
            ("32MiB", Some(32 << 20)),
            ("32 mib", Some(32 << 20)),
            ("64K", Some(64 << 10)),
            ("1GB", Some(1_000_000_000)),
            ("1.5KiB", Some(1536)),
            ("2tb", Some(2_000_000_000_000)),
            ("0", Some(0)),
            ("lots", None),
            ("12 parsecs", None),
            ("1.5", None),
            ("-1", None),
            ("", None),
            ("99999999999999999999", None),
            ("20000000TiB", None),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_bytes(text).ok(), expected, "{text:?}");
        }
        let config = config(
            "smg --worker-urls grpc://a:1 --max-payload-size 32MiB --max-header-size 16KiB \
             --media-max-bytes 1MB",
        )
        .expect("valid");
        assert_eq!(config.front.limits.max_payload_bytes, 32 << 20);
        assert_eq!(config.front.limits.max_header_bytes, 16 << 10);
        assert_eq!(config.media.max_bytes, 1_000_000);
        assert!(matches!(
            config_err("smg --worker-urls grpc://a:1 --max-payload-size lots"),
            CliError::Syntax(_)
        ));
    }

    #[test]
    fn http_workers_are_refused_saying_smg_speaks_grpc() {
        for (line, flag) in [
            ("smg --worker-urls http://w:8000", "worker-urls"),
            ("smg --worker-urls grpc://a:1 https://w:8000", "worker-urls"),
            (
                "smg --pd-disaggregation --prefill http://p:8000 9000 --decode grpc://d:1",
                "prefill",
            ),
            (
                "smg --pd-disaggregation --prefill grpc://p:1 --decode http://d:8000",
                "decode",
            ),
            ("smg --worker-urls grpc://w", "worker-urls"),
        ] {
            let err = refusal(line);
            assert_eq!(err.flag, flag, "{line}: {err}");
            if line.contains("http") {
                assert!(
                    err.reason.contains("smg speaks gRPC to workers"),
                    "{line}: {err}"
                );
            }
        }
    }

    #[test]
    fn the_tree_size_counts_tokens_as_in_smg() {
        let pages = |line: &str| {
            config(line)
                .expect("valid")
                .routing
                .tunables
                .cache_aware
                .max_pages
        };
        assert_eq!(pages("smg --worker-urls grpc://a:1"), 1 << 20);
        assert_eq!(
            pages("smg --worker-urls grpc://a:1 --max-tree-size 67108864"),
            1 << 22
        );
        assert_eq!(
            pages("smg --worker-urls grpc://a:1 --max-tree-size 1601"),
            101
        );
        assert_eq!(
            refusal("smg --worker-urls grpc://a:1 --max-tree-size 100").flag,
            "max-tree-size"
        );
    }

    #[test]
    fn smg_flags_without_effect_warn_and_others_are_refused_by_name() {
        let config = config(
            "smg --worker-urls grpc://a:1 --eviction-interval 60 --block-size 16 \
             --enable-trace --prometheus-duration-buckets 0.1 1 10",
        )
        .expect("valid");
        assert_eq!(config.warnings.len(), 4, "{:?}", config.warnings);
        for flag in [
            "--eviction-interval",
            "--block-size",
            "--enable-trace",
            "--prometheus-duration-buckets",
        ] {
            assert!(
                config
                    .warnings
                    .iter()
                    .any(|w| w.starts_with(flag) && w.contains("no effect")),
                "{flag}: {:?}",
                config.warnings
            );
        }
        let file = write_config("worker-urls = [\"grpc://a:1\"]\neviction-interval = 60");
        let from_file = super::tests::config(&format!("smg --config {}", file.path().display()))
            .expect("valid");
        assert_eq!(from_file.warnings.len(), 1);

        let err = refusal("smg --worker-urls grpc://a:1 --service-discovery");
        assert_eq!(err.flag, "service-discovery");
        assert!(err.reason.contains("--worker-urls"), "{err}");
        let err = refusal("smg --worker-urls grpc://a:1 --mcp-config-path m.yaml");
        assert_eq!(err.flag, "mcp-config-path");
        assert!(err.reason.contains("issue 17"), "{err}");
        let parsers = config_ok("smg --worker-urls grpc://a:1 --tool-call-parser qwen");
        assert_eq!(parsers.parsers.tool_call_parser.as_deref(), Some("qwen"));
        assert!(
            config_ok("smg --worker-urls grpc://a:1")
                .warnings
                .is_empty(),
            "no SMG flag, no WARN"
        );
    }

    #[test]
    fn log_dir_and_remove_unhealthy_workers_take_effect() {
        let config = config_ok(
            "smg --worker-urls grpc://a:1 --log-dir /var/log/smg --remove-unhealthy-workers",
        );
        assert!(config.warnings.is_empty(), "{:?}", config.warnings);
        assert_eq!(
            config.log.dir.as_deref(),
            Some(std::path::Path::new("/var/log/smg"))
        );
        assert!(config.lifecycle.remove_unhealthy);
        let plain = config_ok("smg --worker-urls grpc://a:1");
        assert_eq!(plain.log.dir, None);
        assert!(!plain.lifecycle.remove_unhealthy);
        // Without health checks nothing finds a worker unhealthy: said once.
        let idle = config_ok(
            "smg --worker-urls grpc://a:1 --remove-unhealthy-workers --disable-health-check",
        );
        assert_eq!(idle.warnings.len(), 1, "{:?}", idle.warnings);
        assert!(idle.warnings[0].contains("--disable-health-check"));
    }

    fn config_ok(line: &str) -> GatewayConfig {
        config(line).expect(line)
    }

    /// A file holding `text`, kept as long as the handle.
    fn template_file(text: &str) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        std::io::Write::write_all(&mut file, text.as_bytes()).expect("written");
        file
    }

    #[test]
    fn a_chat_template_file_is_read_and_compiled_at_start_up() {
        let source = "{% for m in messages %}<<{{ m.role }}>>{{ m.content }}{% endfor %}";
        let file = template_file(source);
        let path = file.path().display().to_string();
        let config = config_ok(&format!(
            "smg --worker-urls grpc://a:1 --chat-template {path}"
        ));
        let template = config.model.chat_template.expect("the override is kept");
        assert_eq!(template.path, file.path());
        assert_eq!(template.source, source);
        assert_eq!(
            config_ok("smg --worker-urls grpc://a:1")
                .model
                .chat_template,
            None,
            "without the flag each model keeps its own template"
        );

        // The same as a --config file key.
        let toml = template_file(&format!(
            "worker-urls = [\"grpc://a:1\"]\nchat-template = \"{path}\""
        ));
        let from_file = config_ok(&format!("smg --config {}", toml.path().display()));
        assert_eq!(
            from_file.model.chat_template.map(|t| t.source).as_deref(),
            Some(source)
        );
    }

    #[test]
    fn a_missing_chat_template_file_is_refused_naming_the_flag_and_the_path() {
        let err = refusal("smg --worker-urls grpc://a:1 --chat-template /nonexistent/t.jinja");
        assert_eq!(err.flag, "chat-template");
        assert!(err.reason.contains("/nonexistent/t.jinja"), "{err}");
        assert!(err.to_string().starts_with("--chat-template: "), "{err}");
        let dir = tempfile::tempdir().expect("temp dir");
        let err = refusal(&format!(
            "smg --worker-urls grpc://a:1 --chat-template {}",
            dir.path().display()
        ));
        assert_eq!(err.flag, "chat-template", "a directory is not a template");
    }

    #[test]
    fn a_chat_template_that_does_not_compile_is_refused_at_start_up() {
        let file = template_file("{% for m in messages %}{{ m.content }}");
        let err = refusal(&format!(
            "smg --worker-urls grpc://a:1 --chat-template {}",
            file.path().display()
        ));
        assert_eq!(err.flag, "chat-template");
        assert!(err.reason.contains("does not compile"), "{err}");
        assert!(
            err.reason.contains(&file.path().display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn every_demo_flag_is_described() {
        let command = command();
        let demo = command.find_subcommand("demo").expect("demo");
        for arg in demo.get_arguments() {
            assert!(
                arg.get_help().is_some_and(|h| !h.to_string().is_empty()),
                "demo --{} has no description",
                arg.get_long().unwrap_or_default()
            );
        }
    }

    #[test]
    fn every_launch_flag_has_a_heading_a_description_and_a_unit() {
        let command = command();
        let launch = command.find_subcommand("launch").expect("launch");
        for arg in launch.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if arg.is_hide_set() || long == "help" {
                continue;
            }
            assert!(arg.get_help_heading().is_some(), "--{long} has no heading");
            if arg.get_help_heading() == Some(compat::IGNORED_HEADING) {
                continue;
            }
            assert!(arg.get_help_heading().is_some(), "--{long} has no heading");
            assert!(
                arg.get_help().is_some_and(|h| !h.to_string().is_empty()),
                "--{long} has no description"
            );
            let unit = arg
                .get_value_names()
                .and_then(|names| names.first())
                .map(|name| name.as_str().to_owned());
            let expected = if long.ends_with("-secs")
                || long.starts_with("worker-startup-")
                    && long != "worker-startup-delay"
                    && !long.ends_with("interval")
            {
                Some("SECS")
            } else if long.ends_with("-ms") {
                Some("MS")
            } else if long.ends_with("-bytes")
                || long.ends_with("-size")
                    && long != "queue-size"
                    && long != "postgres-pool-max-size"
            {
                Some(if long == "max-tree-size" {
                    "TOKENS"
                } else {
                    "BYTES"
                })
            } else {
                None
            };
            if let Some(expected) = expected {
                assert_eq!(unit.as_deref(), Some(expected), "--{long}'s unit");
            }
        }
        let help = command
            .clone()
            .find_subcommand_mut("launch")
            .expect("launch")
            .render_long_help()
            .to_string();
        for heading in [
            "Worker configuration:",
            "Routing policy:",
            "PD / EPD disaggregation:",
            "Prometheus metrics and probes:",
            "Logging:",
            "Rate limiting and admission:",
            "TLS / mTLS:",
            compat::IGNORED_HEADING,
        ] {
            assert!(help.contains(heading), "no {heading:?} in the help");
        }
        assert!(help.contains("[default: 512MiB]"), "sizes show their unit");
        assert!(
            !help.contains("--service-discovery"),
            "refused flags stay hidden"
        );
    }

    #[test]
    fn named_values_parse_and_refuse_clearly() {
        let parse = |v: &str| v.parse::<u32>().map_err(|e| e.to_string());
        let ok = named_values(
            "model-max-retries",
            &["llama=2".to_owned(), "qwen=0".to_owned()],
            parse,
        )
        .expect("valid");
        assert_eq!(ok.get("llama"), Some(&2));
        assert_eq!(ok.get("qwen"), Some(&0));
        for bad in ["llama", "=2", "llama=x"] {
            let err =
                named_values("model-max-retries", &[bad.to_owned()], parse).expect_err("refused");
            assert_eq!(err.flag, "model-max-retries", "{err}");
        }
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
