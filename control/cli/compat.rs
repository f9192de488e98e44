//! The compatibility contract with SMG's `launch` flags: one table says, for
//! every flag SMG takes, what smg does with it.
//!
//! Why it exists: operators switch by pointing their launch scripts at a
//! different binary, so each SMG flag needs one of three honest answers —
//! it works here ([`Treatment::Supported`], same meaning and unit, and the
//! same default or a stated reason why not), it is accepted and ignored
//! with a WARN because it has no effect here ([`Treatment::Ignored`]), or it
//! is refused at start-up with what to use instead ([`Treatment::Refused`],
//! [`Treatment::Coming`]). The table is the single source: it adds the
//! flags smg does not implement to the command line (so clap parses their
//! values and a `--config` file may hold them), it words the WARNs and the
//! refusals, and the tests check it against SMG's flag list
//! (`tests/fixtures/smg_flags.toml`) and against the README's table.

use clap::{Arg, ArgAction, ArgMatches, Command};

/// What smg does with one of SMG's flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Treatment {
    /// A flag of `smg launch` (by this name or an alias); `differs` states
    /// how its default (or accepted values) differ from SMG's, and why.
    Supported { differs: Option<&'static str> },
    /// Accepted, with a WARN at start-up saying why it has no effect.
    Ignored(&'static str),
    /// Refused at start-up; the text says what to use instead.
    Refused(&'static str),
    /// Refused until the issue with this number adds it.
    Coming(u32),
}

/// What a flag takes on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takes {
    /// Nothing (`--dp-aware`).
    Switch,
    /// One value; repeatable.
    Value,
    /// One or more values (`--worker-urls A B`).
    Values,
    /// A URL and an optional bootstrap port or `none` (`--prefill`).
    UrlPort,
}

impl Takes {
    /// The name the fixture uses.
    pub fn name(self) -> &'static str {
        match self {
            Takes::Switch => "switch",
            Takes::Value => "value",
            Takes::Values => "values",
            Takes::UrlPort => "url-port",
        }
    }
}

/// One of SMG's launch flags and what smg does with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmgFlag {
    /// The long flag, without its dashes.
    pub name: &'static str,
    pub takes: Takes,
    pub treatment: Treatment,
}

impl Treatment {
    /// The README's word for it.
    pub fn label(self) -> &'static str {
        match self {
            Treatment::Supported { .. } => "supported",
            Treatment::Ignored(_) => "ignored (WARN)",
            Treatment::Refused(_) | Treatment::Coming(_) => "refused",
        }
    }
}

const fn flag(name: &'static str, takes: Takes, treatment: Treatment) -> SmgFlag {
    SmgFlag {
        name,
        takes,
        treatment,
    }
}

const SAME: Treatment = Treatment::Supported { differs: None };

const fn differs(why: &'static str) -> Treatment {
    Treatment::Supported { differs: Some(why) }
}

use Takes::{Switch, UrlPort, Value, Values};
use Treatment::{Coming, Ignored, Refused};

const NO_DISCOVERY: Treatment = Refused(
    "smg has no Kubernetes service discovery: name the workers with --worker-urls, \
     --prefill, --decode, --encode, or register them with POST /workers on the admin listener",
);
const NO_MESH: Treatment =
    Refused("smg has no HA mesh: run replicas side by side behind a load balancer");
const NO_JWT: Treatment =
    Refused("admin routes take keys, not JWTs: --control-plane-api-keys ID:NAME:ROLE:KEY");
const NO_ORACLE_OR_REDIS: Treatment = Refused(
    "conversation history is stored with --history-backend sqlite|postgres|memory|none \
     (issue 17); there is no Oracle or Redis backend",
);
const NO_TOKENIZER_CACHE: Treatment =
    Ignored("smg has no tokenizer cache (tokenizing is not the bottleneck it caches for)");
const LEAST_LOAD_FIXED: Treatment =
    Ignored("least_load's estimate has fixed constants here (see the README's policies)");
const NO_WASM: Treatment = Refused("smg has no WebAssembly hooks");
const NO_OTEL: Treatment = Ignored(
    "smg exports no OpenTelemetry traces; the x-request-id of an answer is in every log line \
     and engine request id of its request",
);

/// Every launch flag of SMG (`tests/fixtures/smg_flags.toml` has their
/// defaults and units), in SMG's help order.
pub const SMG_FLAGS: &[SmgFlag] = &[
    // Worker configuration
    flag(
        "host",
        Value,
        differs(
            "127.0.0.1, not 0.0.0.0: nothing is reachable from the network until you say so \
             (and smg warns when it is reachable without a key)",
        ),
    ),
    flag("port", Value, SAME),
    flag(
        "health-check-port",
        Value,
        differs(
            "a listener like --prometheus-port's, on --prometheus-host: it serves /metrics too, \
             on the control plane's runtime",
        ),
    ),
    flag(
        "worker-urls",
        Values,
        differs("grpc:// or grpcs:// URLs only: smg speaks gRPC to workers, never HTTP"),
    ),
    // Routing policy
    flag(
        "policy",
        Value,
        differs("no passthrough policy (smg routes to gRPC workers itself)"),
    ),
    flag("cache-threshold", Value, SAME),
    flag("balance-abs-threshold", Value, SAME),
    flag("balance-rel-threshold", Value, SAME),
    flag(
        "balance-token-usage-threshold",
        Value,
        Ignored(
            "cache_aware balances on request load (--balance-abs-threshold, --balance-rel-threshold), not on KV usage",
        ),
    ),
    flag(
        "overload-token-usage-threshold",
        Value,
        Ignored(
            "cache_aware balances on request load (--balance-abs-threshold, --balance-rel-threshold), not on KV usage",
        ),
    ),
    flag(
        "eviction-interval",
        Value,
        Ignored(
            "the cache_aware tree evicts its least recently used pages as soon as it grows past --max-tree-size, so it never holds more and there is no periodic sweep to time",
        ),
    ),
    flag(
        "max-tree-size",
        Value,
        differs(
            "default 16777216 tokens, not 67108864: the tree keeps one node per 16-token page \
             and 2^20 nodes bound its memory per model",
        ),
    ),
    flag(
        "block-size",
        Value,
        Ignored("the cache_aware tree's pages are 16 tokens"),
    ),
    flag("max-idle-secs", Value, SAME),
    flag(
        "assignment-mode",
        Value,
        Ignored("manual: a key seen for the first time goes to a random worker"),
    ),
    flag("prefix-token-count", Value, SAME),
    flag("prefix-hash-load-factor", Value, SAME),
    flag("least-load-kv-pressure-weight", Value, LEAST_LOAD_FIXED),
    flag("least-load-default-throughput", Value, LEAST_LOAD_FIXED),
    flag("least-load-mean-prefill-tokens", Value, LEAST_LOAD_FIXED),
    flag("dp-aware", Switch, SAME),
    flag(
        "routing-key-override",
        Switch,
        Ignored("X-SMG-Routing-Key is followed by --policy manual and consistent_hashing only"),
    ),
    flag("enable-igw", Switch, SAME),
    flag(
        "dp-minimum-tokens-scheduler",
        Switch,
        Ignored("with --dp-aware each data-parallel rank is a worker the policy picks"),
    ),
    // PD disaggregation
    flag("pd-disaggregation", Switch, SAME),
    flag("epd-disaggregation", Switch, SAME),
    flag("prefill", UrlPort, SAME),
    flag("encode", UrlPort, SAME),
    flag("decode", Value, SAME),
    flag("prefill-policy", Value, SAME),
    flag("decode-policy", Value, SAME),
    flag("encode-policy", Value, SAME),
    flag("worker-startup-timeout-secs", Value, SAME),
    flag("worker-startup-delay", Value, SAME),
    flag(
        "worker-startup-check-interval",
        Value,
        differs(
            "the longest pause between two attempts to reach a worker at start-up; the first \
             retries come sooner (250 ms, doubling)",
        ),
    ),
    // Load monitoring
    flag(
        "load-monitor-interval",
        Value,
        differs(
            "an alias of --load-check-interval-secs, default 1 s, not 10: load-aware policies \
             ignore readings older than three intervals",
        ),
    ),
    flag(
        "engine-metrics",
        Switch,
        Ignored(
            "engine load readings are in GET /workers and the smg_worker_load_* metrics whenever a policy polls them",
        ),
    ),
    // Multimodal
    flag(
        "multimodal-tensor-transport",
        Value,
        differs(
            "default auto, not inline: /dev/shm only for workers sharing this host's shm \
             namespace, inline otherwise",
        ),
    ),
    flag(
        "multimodal-shm-min-bytes",
        Value,
        differs("default 64 KiB (SMG leaves it to each worker)"),
    ),
    // Service discovery
    flag("service-discovery", Switch, NO_DISCOVERY),
    flag("selector", Values, NO_DISCOVERY),
    flag("service-discovery-port", Value, NO_DISCOVERY),
    flag("service-discovery-namespace", Value, NO_DISCOVERY),
    flag("encode-selector", Values, NO_DISCOVERY),
    flag("prefill-selector", Values, NO_DISCOVERY),
    flag("decode-selector", Values, NO_DISCOVERY),
    flag("router-selector", Values, NO_MESH),
    flag("model-id-from", Value, NO_DISCOVERY),
    flag("model-alias", Value, SAME),
    // Logging
    flag("log-dir", Value, SAME),
    flag("log-level", Value, differs("also takes trace")),
    flag("log-json", Switch, SAME),
    // Prometheus
    flag("prometheus-port", Value, SAME),
    flag(
        "prometheus-host",
        Value,
        differs("defaults to --host (loopback), not 0.0.0.0"),
    ),
    flag(
        "prometheus-duration-buckets",
        Values,
        Ignored("the latency histograms have fixed buckets"),
    ),
    // Request handling
    flag("request-id-headers", Values, SAME),
    flag(
        "storage-context-headers",
        Values,
        Ignored("smg has no storage hooks to pass headers to"),
    ),
    flag(
        "trust-tenant-header",
        Switch,
        Refused("tenants come from API keys: --tenant-api-key TENANT:KEY"),
    ),
    flag(
        "tenant-header-name",
        Value,
        Refused("tenants come from API keys: --tenant-api-key TENANT:KEY"),
    ),
    flag("request-timeout-secs", Value, SAME),
    flag("shutdown-grace-period-secs", Value, SAME),
    flag(
        "max-payload-size",
        Value,
        differs("also takes sizes with a unit (32MiB, 1GB)"),
    ),
    flag("cors-allowed-origins", Values, SAME),
    // Rate limiting
    flag("max-concurrent-requests", Value, SAME),
    flag("queue-size", Value, SAME),
    flag("queue-timeout-secs", Value, SAME),
    flag(
        "rate-limit-tokens-per-second",
        Value,
        differs("requests per second, per tenant when tenant keys are set; takes fractions"),
    ),
    // Priority scheduler, tenant rate limits
    flag(
        "priority-scheduler-enabled",
        Switch,
        Ignored(
            "admission is always by priority class; classes come from --tenant-priority TENANT=CLASS",
        ),
    ),
    flag(
        "priority-scheduler-default-max-class",
        Value,
        Ignored("tenants not given a class with --tenant-priority are in class default"),
    ),
    flag(
        "priority-scheduler-config",
        Value,
        Refused("give each tenant's class with --tenant-priority TENANT=CLASS"),
    ),
    flag(
        "priority-scheduler-tenant-metric-top-n",
        Value,
        Ignored("tenant metric labels come only from configured keys, so they are bounded already"),
    ),
    flag(
        "tenant-rate-limit-enabled",
        Switch,
        Refused(
            "use --rate-limit-tokens-per-second and --rate-limit-burst (per tenant when --tenant-api-key is set)",
        ),
    ),
    flag(
        "tenant-rate-limit-config",
        Value,
        Refused(
            "use --rate-limit-tokens-per-second and --rate-limit-burst (per tenant when --tenant-api-key is set)",
        ),
    ),
    // Retries
    flag("retry-max-retries", Value, SAME),
    flag("retry-initial-backoff-ms", Value, SAME),
    flag("retry-max-backoff-ms", Value, SAME),
    flag("retry-backoff-multiplier", Value, SAME),
    flag("retry-jitter-factor", Value, SAME),
    flag("disable-retries", Switch, SAME),
    // Circuit breaker
    flag("cb-failure-threshold", Value, SAME),
    flag("cb-success-threshold", Value, SAME),
    flag("cb-timeout-duration-secs", Value, SAME),
    flag("cb-window-duration-secs", Value, SAME),
    flag("disable-circuit-breaker", Switch, SAME),
    // Health checks
    flag("health-failure-threshold", Value, SAME),
    flag("health-success-threshold", Value, SAME),
    flag("health-check-timeout-secs", Value, SAME),
    flag(
        "health-check-interval-secs",
        Value,
        differs(
            "default 10 s, not 60: a probe is one small gRPC call, and a dead worker is found sooner",
        ),
    ),
    flag(
        "health-check-endpoint",
        Value,
        Ignored(
            "smg speaks only gRPC to workers and probes them with the HealthCheck RPC, which has no HTTP path",
        ),
    ),
    flag("disable-health-check", Switch, SAME),
    flag("remove-unhealthy-workers", Switch, SAME),
    flag(
        "drain-settle-secs",
        Value,
        Ignored("a removed worker drains until its last request has finished"),
    ),
    // Tokenizer
    flag(
        "model-path",
        Value,
        differs(
            "a local directory (alias --model); smg does not download from the Hugging Face Hub",
        ),
    ),
    flag("tokenizer-path", Value, SAME),
    flag("chat-template", Value, SAME),
    flag(
        "disable-tokenizer-autoload",
        Switch,
        Ignored(
            "the tokenizer comes from --tokenizer-path or --model-path when given, else from the workers: serving needs one",
        ),
    ),
    flag("tokenizer-cache-enable-l0", Switch, NO_TOKENIZER_CACHE),
    flag("tokenizer-cache-l0-max-entries", Value, NO_TOKENIZER_CACHE),
    flag("tokenizer-cache-enable-l1", Switch, NO_TOKENIZER_CACHE),
    flag("tokenizer-cache-l1-max-memory", Value, NO_TOKENIZER_CACHE),
    // Parsers
    flag("reasoning-parser", Value, SAME),
    flag("tool-call-parser", Value, SAME),
    flag("mcp-config-path", Value, Coming(17)),
    // Backend
    flag(
        "backend",
        Value,
        differs("also spelled --runtime; tokenspeed or sglang workers over gRPC only"),
    ),
    flag(
        "history-backend",
        Value,
        differs(
            "sqlite (an embedded file, --history-path) by default, so history survives a \
             restart; memory, postgres and none as in SMG; no oracle or redis",
        ),
    ),
    flag("enable-wasm", Switch, NO_WASM),
    flag("storage-hook-wasm-path", Value, NO_WASM),
    flag("schema-config", Value, NO_ORACLE_OR_REDIS),
    flag("oracle-wallet-path", Value, NO_ORACLE_OR_REDIS),
    flag("oracle-tns-alias", Value, NO_ORACLE_OR_REDIS),
    flag("oracle-dsn", Value, NO_ORACLE_OR_REDIS),
    flag("oracle-user", Value, NO_ORACLE_OR_REDIS),
    flag("oracle-password", Value, NO_ORACLE_OR_REDIS),
    flag("oracle-external-auth", Switch, NO_ORACLE_OR_REDIS),
    flag("oracle-pool-min", Value, NO_ORACLE_OR_REDIS),
    flag("oracle-pool-max", Value, NO_ORACLE_OR_REDIS),
    flag("oracle-pool-timeout-secs", Value, NO_ORACLE_OR_REDIS),
    flag(
        "postgres-db-url",
        Value,
        differs("also spelled --history-url"),
    ),
    flag(
        "postgres-pool-max-size",
        Value,
        differs("16 connections when not given (SMG states no default)"),
    ),
    flag("redis-url", Value, NO_ORACLE_OR_REDIS),
    flag("redis-pool-max-size", Value, NO_ORACLE_OR_REDIS),
    flag("redis-retention-days", Value, NO_ORACLE_OR_REDIS),
    // TLS
    flag("tls-cert-path", Value, SAME),
    flag("tls-key-path", Value, SAME),
    // Tracing
    flag("enable-trace", Switch, NO_OTEL),
    flag("otlp-traces-endpoint", Value, NO_OTEL),
    // Authentication
    flag("api-key", Value, SAME),
    flag("tenant-api-key", Value, SAME),
    flag("jwt-issuer", Value, NO_JWT),
    flag("jwt-audience", Value, NO_JWT),
    flag("jwt-jwks-uri", Value, NO_JWT),
    flag("jwt-role-claim", Value, NO_JWT),
    flag("jwt-role-mapping", Value, NO_JWT),
    flag("control-plane-api-keys", Value, SAME),
    flag(
        "disable-audit-logging",
        Switch,
        Ignored(
            "admin changes are always written to the smg::audit log target; RUST_LOG=smg::audit=off silences it",
        ),
    ),
    // Mesh
    flag("enable-mesh", Switch, NO_MESH),
    flag("mesh-server-name", Value, NO_MESH),
    flag("mesh-host", Value, NO_MESH),
    flag("mesh-advertise-host", Value, NO_MESH),
    flag("mesh-port", Value, NO_MESH),
    flag("mesh-peer-urls", Values, NO_MESH),
    // WebRTC
    flag(
        "webrtc-bind-addr",
        Value,
        Ignored("smg has no WebRTC endpoint"),
    ),
    flag(
        "webrtc-stun-server",
        Value,
        Ignored("smg has no WebRTC endpoint"),
    ),
    // Runtime
    flag(
        "runtime-worker-threads",
        Value,
        Ignored(
            "the control plane runs one tokio thread per core the data plane leaves (see --dataplane-cores)",
        ),
    ),
];

/// The help heading of the SMG flags smg accepts without effect.
pub const IGNORED_HEADING: &str = "SMG flags accepted without effect (each logs a WARN)";

/// `launch` with an argument for each SMG flag smg does not implement:
/// ignored ones listed in the help under their own heading with why they
/// do nothing, refused ones hidden.
pub(super) fn with_smg_flags(launch: Command) -> Command {
    let mut launch = launch;
    for flag in SMG_FLAGS {
        let help = match flag.treatment {
            Treatment::Supported { .. } => continue,
            Treatment::Ignored(why) => why.to_owned(),
            Treatment::Refused(_) | Treatment::Coming(_) => String::new(),
        };
        // Its id is its name; an id smg's own flags use (their field names)
        // would be a duplicate clap refuses, which the tests would show.
        let arg = Arg::new(flag.name)
            .long(flag.name)
            .help(help)
            .help_heading(IGNORED_HEADING)
            .hide(!matches!(flag.treatment, Treatment::Ignored(_)));
        let arg = match flag.takes {
            Takes::Switch => arg.action(ArgAction::SetTrue),
            Takes::Value => arg
                .action(ArgAction::Append)
                .value_name("VALUE")
                .allow_hyphen_values(true),
            Takes::Values | Takes::UrlPort => arg
                .action(ArgAction::Append)
                .num_args(1..)
                .value_name("VALUE"),
        };
        launch = launch.arg(arg);
    }
    launch
}

/// The SMG flags of a parsed `launch` command line that smg does not
/// implement: the WARNs of those it ignores, or the refusal of the first
/// one it refuses.
pub(super) fn check(launch: &ArgMatches) -> Result<Vec<String>, (&'static str, String)> {
    let mut warnings = Vec::new();
    for flag in SMG_FLAGS {
        let given = match flag.treatment {
            Treatment::Supported { .. } => continue,
            _ => launch
                .value_source(flag.name)
                .is_some_and(|source| source != clap::parser::ValueSource::DefaultValue),
        };
        if !given {
            continue;
        }
        match flag.treatment {
            Treatment::Supported { .. } => {}
            Treatment::Ignored(why) => warnings.push(format!(
                "--{} is accepted for SMG compatibility but has no effect: {why}",
                flag.name
            )),
            Treatment::Refused(instead) => {
                return Err((flag.name, format!("not supported by smg: {instead}")));
            }
            Treatment::Coming(issue) => {
                return Err((
                    flag.name,
                    format!("not supported by smg yet (issue {issue} adds it)"),
                ));
            }
        }
    }
    Ok(warnings)
}
