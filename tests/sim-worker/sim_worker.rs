//! `smg-sim-worker`: a simulated GPU engine worker that speaks the real
//! TokenSpeed or SGLang gRPC protocols, so the gateway can be developed and
//! tested end to end without GPUs.
//!
//! It generates deterministic text that starts with a digest of what it
//! received (token ids, tensor bytes, shapes, dtypes; see `digest`), takes part
//! in PD and EPD rendezvous over real TCP, reads tensors from inline bytes,
//! `/dev/shm` or the RDMA lane's loopback arena like a real worker, follows a simple timing model, and injects
//! faults on request (and, with `--hostile`, breaks the protocol's promises
//! as a buggy or compromised engine could; see `hostile`). With `--script`,
//! prompts that match get canned completions instead, streamed as the model's
//! real token ids (see `scripted`); with `--agent`, prompts that carry tools
//! get tool calls and answers made from them (see `agent`). When it is listening it prints one line to stdout:
//! `smg-sim-worker ready grpc=HOST:PORT bootstrap=HOST:PORT|none`.

mod agent;
mod digest;
mod engine;
mod hostile;
mod model;
mod remote;
mod rendezvous;
mod scripted;
mod serve;
mod service;
mod sglang;
mod tensor;
mod tokenspeed;

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};

/// The gateway's allocator: a benchmark's worker serves the same
/// many-small-allocations traffic, and under glibc malloc it spent a fifth
/// of its time allocating.
#[global_allocator]
static GLOBAL_ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use smg::proto;
use smg::proto::sglang_scheduler::sglang_scheduler_server::SglangSchedulerServer;
use smg::proto::tokenspeed_encoder::token_speed_encoder_server::TokenSpeedEncoderServer;
use smg::proto::tokenspeed_scheduler::token_speed_scheduler_server::TokenSpeedSchedulerServer;
use smg_shared::shm::ShmNamespace;
use tokio::net::TcpListener;
use tonic::service::Routes;

use crate::agent::AgentModel;
use crate::engine::{Engine, EngineConfig, Faults, Hold, Role, Timing};
use crate::hostile::{Hostility, Misbehaviour};
use crate::model::ModelFacts;
use crate::scripted::CompletionScript;
use crate::serve::ConnectionFaults;
use crate::service::Worker;
use crate::tensor::{Intake, Recorder};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Protocol {
    Tokenspeed,
    Sglang,
}

/// A simulated TokenSpeed / SGLang engine worker.
#[derive(Debug, Parser)]
#[command(
    name = "smg-sim-worker",
    version,
    about = "A simulated TokenSpeed / SGLang engine worker for testing smg without GPUs"
)]
struct Args {
    /// The engine protocol to serve.
    #[arg(long, value_enum, default_value_t = Protocol::Tokenspeed)]
    protocol: Protocol,
    /// The worker's part in the fleet.
    #[arg(long, value_enum, default_value_t = Role::Regular)]
    role: Role,
    /// Address to listen on (gRPC and bootstrap).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// gRPC port; 0 picks a free one (see the ready line).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Rendezvous port for prefill and encode workers; 0 picks a free one.
    #[arg(long)]
    bootstrap_port: Option<u16>,
    /// A Hugging Face model directory (tokenizer.json, config.json, ...).
    #[arg(long)]
    model_path: PathBuf,
    /// The model name to report; defaults to the model directory's name.
    #[arg(long)]
    served_model_name: Option<String>,
    /// Canned completions: JSON lines `{"when": "<substring of the decoded
    /// prompt>", "text": "<completion>"}`; the first match wins, a prompt
    /// nothing matches gets the usual output. A bad file stops the worker
    /// at start-up.
    #[arg(long, value_name = "FILE")]
    script: Option<PathBuf>,
    /// Play an agentic model: a prompt whose chat template rendered tools
    /// gets a Hermes tool call built from the tools' schemas (after the
    /// user's turn) or an answer quoting the tool results (after them),
    /// with a think block on models that have think tokens; a JSON-schema
    /// constraint gets matching JSON. Other prompts get the usual output;
    /// --script lines match first.
    #[arg(long)]
    agent: bool,
    /// Overrides the advertised `/dev/shm` identity (`"<boot_id>:<st_dev>"`).
    #[arg(long)]
    shm_namespace_id: Option<String>,

    /// Serve gRPC over TLS with this PEM certificate chain (needs
    /// --tls-key-path); the gateway dials it as `grpcs://`.
    #[arg(long, value_name = "FILE", requires = "tls_key_path")]
    tls_cert_path: Option<PathBuf>,
    /// PEM private key of --tls-cert-path.
    #[arg(long, value_name = "FILE", requires = "tls_cert_path")]
    tls_key_path: Option<PathBuf>,
    /// Require clients to present a certificate signed by this PEM CA
    /// (mTLS; needs --tls-cert-path).
    #[arg(long, value_name = "FILE", requires = "tls_cert_path")]
    client_ca_path: Option<PathBuf>,

    /// No simulated compute time at all (overhead benchmarks).
    #[arg(long)]
    zero_delay: bool,
    /// Prompt tokens prefilled per second (uncached tokens only).
    #[arg(long, default_value_t = 50_000.0)]
    prefill_tokens_per_sec: f64,
    /// Base latency of one decode step, in milliseconds.
    #[arg(long, default_value_t = 10.0)]
    decode_ms_per_token: f64,
    /// Extra decode-step latency per running request, in milliseconds.
    #[arg(long, default_value_t = 0.05)]
    decode_ms_per_running_request: f64,
    /// Time to encode one media item, in milliseconds.
    #[arg(long, default_value_t = 5.0)]
    encode_ms_per_item: f64,
    /// Requests decoded at once; more wait in a queue.
    #[arg(long, default_value_t = 256)]
    max_running_requests: u32,
    /// KV cache capacity in tokens, reported in loads.
    #[arg(long, default_value_t = 262_144)]
    max_total_tokens: u32,
    /// max_new_tokens when a request does not set it.
    #[arg(long, default_value_t = 128)]
    default_max_new_tokens: u32,
    /// How long prefill waits for an embedding and decode for a KV cache.
    #[arg(long, default_value_t = 30_000)]
    bootstrap_timeout_ms: u64,

    /// Fault: fail each stream with INTERNAL after N tokens.
    #[arg(long)]
    fail_after_tokens: Option<u32>,
    /// Fault: end each stream without a completion after N tokens.
    #[arg(long)]
    drop_after_tokens: Option<u32>,
    /// Fault: exit the process when a stream reaches N tokens.
    #[arg(long)]
    exit_after_tokens: Option<u32>,
    /// Fault: stop producing tokens after N (until aborted or cancelled).
    #[arg(long)]
    stall_after_tokens: Option<u32>,
    /// Hold each stream after N tokens until the process gets SIGUSR1;
    /// then held streams and every later one go on.
    #[arg(long, value_name = "N")]
    hold_after_tokens: Option<u32>,
    /// The token faults (--fail/drop/exit/stall/hold-after-tokens) play
    /// only on sequence INDEX of a request with n > 1; the others run
    /// normally.
    #[arg(long, value_name = "INDEX")]
    faulty_sequence: Option<u32>,
    /// Fault: answer `accepted: false` to the first N Encode calls.
    #[arg(long, default_value_t = 0)]
    refuse_encodes: u32,
    /// Fault: fail the first N Encode calls with UNAVAILABLE.
    #[arg(long, default_value_t = 0)]
    fail_encodes: u32,
    /// Fault: exit the process in the middle of an Encode call.
    #[arg(long)]
    exit_on_encode: bool,
    /// Fault: never answer Encode calls.
    #[arg(long)]
    stall_encodes: bool,
    /// Fault: never publish KV caches or embeddings for peers.
    #[arg(long)]
    withhold_bootstrap: bool,
    /// Fault: read shm tensors but never unlink their names.
    #[arg(long)]
    keep_shm_names: bool,
    /// Stop before opening the first shm tensor: write its name to
    /// DIR/paused, then wait until DIR/resume exists (a test removes or
    /// truncates the gateway's files meanwhile).
    #[arg(long, value_name = "DIR")]
    pause_shm_read: Option<PathBuf>,
    /// Benchmarks only: check each tensor's size and consume its shm name,
    /// but neither read nor digest its bytes (a real engine copies them to
    /// its GPU on cores of its own). The output digest then covers each
    /// tensor's dtype and shape, not its contents.
    #[arg(long)]
    skip_tensor_bytes: bool,
    /// Fault: report unhealthy in HealthCheck.
    #[arg(long)]
    unhealthy: bool,
    /// Fault: end each HTTP/2 connection once it has taken N streams
    /// (a graceful GOAWAY unless --abrupt-goaway).
    #[arg(long, value_name = "N")]
    goaway_after_streams: Option<u32>,
    /// Fault: end each HTTP/2 connection this many milliseconds after it
    /// was accepted (a graceful GOAWAY unless --abrupt-goaway).
    #[arg(long, value_name = "MS")]
    goaway_every_ms: Option<u64>,
    /// Fault: end connections by closing the socket under their streams
    /// instead of a graceful GOAWAY.
    #[arg(long)]
    abrupt_goaway: bool,
    /// SETTINGS_MAX_CONCURRENT_STREAMS to advertise, as real engines set
    /// it; unlimited by default.
    #[arg(long, value_name = "N")]
    max_concurrent_streams: Option<u32>,
    /// Fault: wait this many milliseconds after accepting a connection
    /// before speaking on it.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    accept_delay_ms: u64,
    /// Data-parallel ranks (SGLang): GetLoads reports each, Generate takes
    /// `data_parallel_rank` below it.
    #[arg(long, default_value_t = 1)]
    dp_size: u32,
    /// Fault: report unhealthy in HealthCheck while this file exists.
    #[arg(long, value_name = "PATH")]
    unhealthy_while_exists: Option<std::path::PathBuf>,
    /// Misbehave like a buggy or compromised engine (repeatable):
    /// `overrun-tokens=N`, `logprobs=N`, `short-logprobs`,
    /// `sequence-index=N`, `dp-ranks=N`, `archive-bytes=N`,
    /// `tokenizer-path=DIR`, `embedding-dim=N`.
    #[arg(long, value_name = "MISBEHAVIOUR", value_parser = Misbehaviour::parse)]
    hostile: Vec<Misbehaviour>,

    /// Read shm tensors from this directory instead of /dev/shm (and
    /// advertise its namespace).
    #[arg(long, value_name = "DIR")]
    shm_dir: Option<PathBuf>,
    /// Write every received tensor here (raw bytes + JSON sidecar).
    #[arg(long)]
    record_dir: Option<PathBuf>,
    /// Append each Generate call's request id to this file, one per line.
    #[arg(long, value_name = "FILE")]
    request_log: Option<PathBuf>,
    /// Append each Generate call's constraint (`ID KIND TEXT`: KIND is
    /// json_schema, regex, ebnf_grammar or structural_tag) to this file.
    #[arg(long, value_name = "FILE")]
    constraint_log: Option<PathBuf>,
    /// Append each Generate call's request id and prompt token ids
    /// (`ID 1,2,3`) to this file, one line per call.
    #[arg(long, value_name = "FILE")]
    prompt_log: Option<PathBuf>,
    /// Append each Abort call's request id and whether it was running
    /// (`ID running|unknown`) to this file, before answering it.
    #[arg(long, value_name = "FILE")]
    abort_log: Option<PathBuf>,
    /// Append each completion's token counts (`ID ROLE index=I prompt=P
    /// completion=C cached=K`) to this file, before sending it.
    #[arg(long, value_name = "FILE")]
    usage_log: Option<PathBuf>,
    /// Append each new peak of the Generate calls held at once (waiting
    /// for a slot or running) to this file (`peak N`, one line per rise).
    #[arg(long, value_name = "FILE")]
    peak_log: Option<PathBuf>,
    /// Log filter (e.g. info, debug, smg_sim_worker=trace).
    #[arg(long, default_value = "info")]
    log_level: String,
}

impl Args {
    fn connection_faults(&self) -> ConnectionFaults {
        ConnectionFaults {
            goaway_after_streams: self.goaway_after_streams,
            goaway_every: self.goaway_every_ms.map(Duration::from_millis),
            abrupt: self.abrupt_goaway,
            max_concurrent_streams: self.max_concurrent_streams,
            accept_delay: Duration::from_millis(self.accept_delay_ms),
        }
    }

    /// The TLS the gRPC server speaks, if any: its certificate, and the CA
    /// client certificates must chain to (mTLS).
    fn tls_acceptor(&self) -> Result<Option<tokio_rustls::TlsAcceptor>> {
        let (Some(cert), Some(key)) = (&self.tls_cert_path, &self.tls_key_path) else {
            return Ok(None);
        };
        let read = |path: &PathBuf| {
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
        };
        let client_ca = self.client_ca_path.as_ref().map(read).transpose()?;
        let config = serve::tls_server_config(&read(cert)?, &read(key)?, client_ca.as_deref())?;
        Ok(Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))))
    }

    fn engine_config(&self) -> EngineConfig {
        let timing = if self.zero_delay {
            Timing::ZERO
        } else {
            Timing {
                prefill_tokens_per_sec: self.prefill_tokens_per_sec,
                decode_ms_per_token: self.decode_ms_per_token,
                decode_ms_per_running_request: self.decode_ms_per_running_request,
                encode_ms_per_item: self.encode_ms_per_item,
            }
        };
        EngineConfig {
            role: self.role,
            timing,
            faults: Faults {
                fail_after_tokens: self.fail_after_tokens,
                drop_after_tokens: self.drop_after_tokens,
                exit_after_tokens: self.exit_after_tokens,
                stall_after_tokens: self.stall_after_tokens,
                hold: None,
                faulty_sequence: self.faulty_sequence,
                refuse_encodes: AtomicU32::new(self.refuse_encodes),
                fail_encodes: AtomicU32::new(self.fail_encodes),
                exit_on_encode: self.exit_on_encode,
                stall_encodes: self.stall_encodes,
                withhold_bootstrap: self.withhold_bootstrap,
                unhealthy: self.unhealthy,
                unhealthy_while_exists: self.unhealthy_while_exists.clone(),
            },
            intake: Intake {
                keep_shm_names: self.keep_shm_names,
                size_only: self.skip_tensor_bytes,
            },
            hostile: Hostility::new(&self.hostile),
            bootstrap_timeout: Duration::from_millis(self.bootstrap_timeout_ms),
            default_max_new_tokens: self.default_max_new_tokens,
            max_running_requests: self.max_running_requests,
            max_total_tokens: self.max_total_tokens,
            request_log: self.request_log.clone(),
            prompt_log: self.prompt_log.clone(),
            constraint_log: self.constraint_log.clone(),
            abort_log: self.abort_log.clone(),
            script: None,
            usage_log: self.usage_log.clone(),
            peak_log: self.peak_log.clone(),
            agent: None,
        }
    }
}

/// A flag that turns true at the first SIGUSR1. The handler is in place
/// before the ready line is printed, so a test's signal never meets the
/// default action (ending the process).
fn released_by_sigusr1() -> Result<tokio::sync::watch::Receiver<bool>> {
    use tokio::signal::unix::{SignalKind, signal};

    let mut signals = signal(SignalKind::user_defined1()).context("cannot catch SIGUSR1")?;
    let (release, released) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        while signals.recv().await.is_some() {
            release.send_replace(true);
        }
    });
    Ok(released)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&args.log_level)?)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if args.protocol == Protocol::Sglang && args.role == Role::Encode {
        bail!("SGLang has no encoder protocol: run encode workers with --protocol tokenspeed");
    }
    let model = ModelFacts::load(&args.model_path, args.served_model_name.clone())?;
    let mut config = args.engine_config();
    if let Some(after_tokens) = args.hold_after_tokens {
        config.faults.hold = Some(Hold {
            after_tokens,
            released: released_by_sigusr1()?,
        });
    }
    if let Some(path) = &args.script {
        match CompletionScript::load(path, &model) {
            Ok(script) => config.script = Some(script),
            Err(err) => {
                // One line, for whoever reads a test's stderr.
                eprintln!("smg-sim-worker: {err:#}");
                std::process::exit(2);
            }
        }
    }
    if args.agent {
        config.agent = Some(AgentModel::new(&model));
    }
    let engine = Arc::new(Engine::new(config, model)?);
    if let Some(dir) = &args.shm_dir {
        tensor::set_shm_dir(dir.clone());
    }
    if let Some(dir) = &args.pause_shm_read {
        tensor::pause_first_shm_read(dir.clone());
    }
    let shm_namespace_id = match (&args.shm_namespace_id, &args.shm_dir) {
        (Some(id), _) => id.clone(),
        (None, Some(dir)) => {
            ShmNamespace::read_from(Path::new("/proc/sys/kernel/random/boot_id"), dir)
                .map(|ns| ns.to_string())
                .unwrap_or_default()
        }
        (None, None) => ShmNamespace::current()
            .map(|ns| ns.to_string())
            .unwrap_or_else(|err| {
                tracing::warn!(%err, "no /dev/shm identity; advertising none");
                String::new()
            }),
    };

    let grpc = TcpListener::bind((args.host.as_str(), args.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
    let grpc_addr = grpc.local_addr()?;
    let bootstrap = match (args.role, args.bootstrap_port) {
        (Role::Prefill | Role::Encode, port) => Some(
            TcpListener::bind((args.host.as_str(), port.unwrap_or(0)))
                .await
                .with_context(|| format!("cannot listen for bootstrap on {}", args.host))?,
        ),
        (_, Some(_)) => bail!("--bootstrap-port is for prefill and encode workers"),
        _ => None,
    };
    let bootstrap_addr: Option<SocketAddr> = bootstrap
        .as_ref()
        .map(TcpListener::local_addr)
        .transpose()?;
    if let Some(listener) = bootstrap {
        let max_wait = engine.config.bootstrap_timeout;
        tokio::spawn(rendezvous::serve(listener, engine.rooms.clone(), max_wait));
    }

    let recorder = args
        .record_dir
        .clone()
        .map(Recorder::new)
        .transpose()
        .context("cannot create the record directory")?
        .map(Arc::new);
    let worker = Worker {
        engine,
        dp_running: Arc::new(
            (0..args.dp_size.max(1))
                .map(|_| std::sync::atomic::AtomicI32::new(0))
                .collect(),
        ),
        recorder,
        shm_namespace_id,
        port: grpc_addr.port(),
        bootstrap_port: bootstrap_addr.map(|a| a.port()),
        protocol: match args.protocol {
            Protocol::Tokenspeed => "tokenspeed",
            Protocol::Sglang => "sglang",
        },
    };

    let limit = proto::MAX_MESSAGE_BYTES;
    let tls = args.tls_acceptor().context("TLS setup")?;
    let routes = match args.protocol {
        Protocol::Tokenspeed => {
            let service = tokenspeed::TokenSpeed(worker);
            Routes::new(
                TokenSpeedSchedulerServer::new(service.clone())
                    .max_decoding_message_size(limit)
                    .max_encoding_message_size(limit),
            )
            .add_service(
                TokenSpeedEncoderServer::new(service)
                    .max_decoding_message_size(limit)
                    .max_encoding_message_size(limit),
            )
        }
        Protocol::Sglang => Routes::new(
            SglangSchedulerServer::new(sglang::Sglang(worker))
                .max_decoding_message_size(limit)
                .max_encoding_message_size(limit),
        ),
    };

    let bootstrap_text = bootstrap_addr.map_or_else(|| "none".to_owned(), |a| a.to_string());
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "smg-sim-worker ready grpc={grpc_addr} bootstrap={bootstrap_text}"
    )?;
    stdout.flush()?;
    drop(stdout);
    tracing::info!(
        protocol = ?args.protocol,
        role = args.role.name(),
        grpc = %grpc_addr,
        bootstrap = %bootstrap_text,
        "simulated worker serving"
    );

    serve::serve(
        grpc,
        routes,
        args.connection_faults(),
        tls,
        shutdown_signal(),
    )
    .await?;
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = match signal(SignalKind::terminate()) {
        Ok(stream) => stream,
        Err(err) => {
            tracing::warn!(%err, "cannot watch SIGTERM");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutting down");
}
