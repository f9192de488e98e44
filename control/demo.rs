//! `smg demo`: the gateway on an embedded default. Starts a simulated fleet
//! (`smg-sim-worker` processes from the same build) on loopback in the chosen
//! mode with the bundled test model, then launches the gateway in front of
//! it and prints a `curl` that works. The workers die with the gateway.
//!
//! The workers play an agentic model (`smg-sim-worker --agent`): a request
//! with `tools` gets a tool call built from the tools' schemas, and the
//! follow-up with the tool results gets an answer quoting them, so an SDK
//! or agent framework can run its own tool loop against the demo. The
//! gateway picks the tool-call parser by detection, as for any model (the
//! bundled template's `<tool_call>` selects `qwen`).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, bail};

use crate::config::{FleetConfig, GatewayConfig, WorkerAddress};
use crate::mode::Mode;
use crate::workers::WorkerRole;

/// Which simulated fleet to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DemoMode {
    Regular,
    Pd,
    Epd,
}

impl std::str::FromStr for DemoMode {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        match name {
            "regular" => Ok(DemoMode::Regular),
            "pd" => Ok(DemoMode::Pd),
            "epd" => Ok(DemoMode::Epd),
            other => Err(format!("unknown demo mode {other:?} (regular, pd, epd)")),
        }
    }
}

/// A demo to run: the simulated fleet and the gateway config that
/// `smg launch`'s defaults give, with the demo's ports.
#[derive(Debug)]
pub struct DemoPlan {
    pub mode: DemoMode,
    /// `tokenspeed` or `sglang` (EPD needs tokenspeed).
    pub protocol: String,
    /// The model directory; `None`: the bundled test model.
    pub model_path: Option<PathBuf>,
    /// Everything but the fleet and the model, which the demo fills in.
    pub gateway: GatewayConfig,
}

/// A fleet process that is killed when dropped.
struct FleetProcess {
    child: Child,
    grpc: String,
    bootstrap: Option<u16>,
}

impl Drop for FleetProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sim_worker_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot locate the smg binary")?;
    let candidate = exe.with_file_name("smg-sim-worker");
    if candidate.is_file() {
        Ok(candidate)
    } else {
        bail!(
            "{} not found: build both binaries first (cargo build --release --bins)",
            candidate.display()
        )
    }
}

fn bundled_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/model")
}

/// Makes the child get SIGTERM when the demo dies, even by SIGKILL (where
/// no destructor runs). The signal follows the thread that forked, and the
/// demo starts its fleet from the main thread, which lives as long as it.
// `pre_exec` has no safe form: this is the control plane's one `unsafe`.
#[allow(unsafe_code)]
fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = nix::unistd::Pid::this();
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe calls (prctl, getppid); it allocates nothing on
    // success.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
                .map_err(std::io::Error::from)?;
            // The parent may have died before the prctl took effect.
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::other(
                    "the demo exited while starting its fleet",
                ));
            }
            Ok(())
        });
    }
}

fn start_worker(
    binary: &Path,
    protocol: &str,
    role: &str,
    model: &Path,
) -> anyhow::Result<FleetProcess> {
    let mut command = Command::new(binary);
    die_with_parent(&mut command);
    let mut child = command
        .args([
            "--protocol",
            protocol,
            "--role",
            role,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
        ])
        .arg("--model-path")
        .arg(model)
        .arg("--agent")
        .args(["--log-level", "warn"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot start {}", binary.display()))?;
    let stdout = child.stdout.take().context("no worker stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let field = |key: &str| {
        line.split_whitespace()
            .find_map(|word| word.strip_prefix(key))
            .map(str::to_owned)
    };
    let grpc = field("grpc=").with_context(|| format!("{role} worker did not start: {line:?}"))?;
    let bootstrap = field("bootstrap=").filter(|b| b != "none");
    Ok(FleetProcess {
        child,
        grpc: format!("grpc://{grpc}"),
        bootstrap: bootstrap
            .and_then(|b| b.rsplit_once(':').and_then(|(_, port)| port.parse().ok())),
    })
}

/// Runs the demo until Ctrl-C; `cores` is the start-up core split.
pub async fn run(plan: DemoPlan, cores: smg_dataplane::runtime::CorePlan) -> anyhow::Result<()> {
    let binary = sim_worker_binary()?;
    let model = plan.model_path.clone().unwrap_or_else(bundled_model);
    let protocol = plan.protocol.as_str();
    let mut fleet = Vec::new();
    let mut workers = Vec::new();
    let worker = |role| start_worker(&binary, protocol, role, &model);
    let address = |process: &FleetProcess, role| WorkerAddress {
        url: process.grpc.clone(),
        role,
        bootstrap_port: process.bootstrap,
    };
    let mode = match plan.mode {
        DemoMode::Regular => {
            let regular = worker("regular")?;
            workers.push(address(&regular, WorkerRole::Regular));
            fleet.push(regular);
            Mode::Regular
        }
        DemoMode::Pd | DemoMode::Epd => {
            let mode = if plan.mode == DemoMode::Epd {
                let encode = worker("encode")?;
                workers.push(address(&encode, WorkerRole::Encode));
                fleet.push(encode);
                Mode::EncodePrefillDecode
            } else {
                Mode::PrefillDecode
            };
            let prefill = worker("prefill")?;
            let decode = worker("decode")?;
            workers.push(address(&prefill, WorkerRole::Prefill));
            workers.push(address(&decode, WorkerRole::Decode));
            fleet.extend([prefill, decode]);
            mode
        }
    };
    let mut gateway = plan.gateway;
    gateway.model.model_path = Some(model);
    gateway.fleet = FleetConfig::Static { mode, workers };
    let urls: Vec<String> = fleet.iter().map(|process| process.grpc.clone()).collect();
    println!(
        "simulated fleet ({}, {protocol}) started: {}",
        mode.name(),
        urls.join(" ")
    );
    println!(
        "try:\n  curl -s http://127.0.0.1:{}/v1/chat/completions -H 'content-type: application/json' \\\n    -d '{{\"model\": \"model\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}], \"max_tokens\": 32}}'",
        gateway.listen.port
    );
    println!(
        "requests with \"tools\" get a simulated tool call, and the follow-up with the tool \
         result an answer quoting it"
    );
    let result = crate::server::launch(gateway, cores).await;
    drop(fleet);
    result
}
