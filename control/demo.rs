//! `smg demo`: the gateway on an embedded default. Starts a simulated fleet
//! (`smg-sim-worker` processes from the same build) on loopback in the chosen
//! mode with the bundled test model, then launches the gateway in front of
//! it and prints a `curl` that works. The workers die with the gateway.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};

use crate::cli::{Cli, Command as CliCommand, LaunchArgs};

/// Which simulated fleet to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DemoMode {
    Regular,
    Pd,
    Epd,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    #[arg(long, value_enum, default_value_t = DemoMode::Regular)]
    pub mode: DemoMode,
    /// The worker protocol (EPD needs tokenspeed).
    #[arg(long, default_value = "tokenspeed")]
    pub protocol: String,
    /// The model directory; defaults to the bundled test model.
    #[arg(long)]
    pub model_path: Option<PathBuf>,
    #[arg(long, default_value_t = 30000)]
    pub port: u16,
    #[arg(long, default_value_t = 29000)]
    pub prometheus_port: u16,
    /// Data-plane threads (as `smg launch --dataplane-cores`).
    #[arg(long, value_name = "N")]
    pub dataplane_cores: Option<usize>,
}

/// A fleet process that is killed when dropped.
struct FleetProcess {
    child: Child,
    grpc: String,
    bootstrap: Option<String>,
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
fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe calls (prctl, getppid); it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before the prctl took effect.
            if libc::getppid() as u32 != parent {
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
        bootstrap: bootstrap.and_then(|b| b.rsplit_once(':').map(|(_, port)| port.to_owned())),
    })
}

/// Runs the demo until Ctrl-C; `cores` is the start-up core split.
pub async fn run(args: DemoArgs, cores: smg_dataplane::runtime::CorePlan) -> anyhow::Result<()> {
    let binary = sim_worker_binary()?;
    let model = args.model_path.clone().unwrap_or_else(bundled_model);
    let protocol = args.protocol.as_str();
    let mut fleet = Vec::new();
    let mut flags: Vec<String> = Vec::new();
    let worker = |role| start_worker(&binary, protocol, role, &model);
    match args.mode {
        DemoMode::Regular => {
            let regular = worker("regular")?;
            flags.extend(["--worker-urls".into(), regular.grpc.clone()]);
            fleet.push(regular);
        }
        DemoMode::Pd | DemoMode::Epd => {
            if args.mode == DemoMode::Epd {
                let encode = worker("encode")?;
                flags.extend([
                    "--epd-disaggregation".into(),
                    "--encode".into(),
                    encode.grpc.clone(),
                ]);
                flags.extend(encode.bootstrap.clone());
                fleet.push(encode);
            } else {
                flags.push("--pd-disaggregation".into());
            }
            let prefill = worker("prefill")?;
            let decode = worker("decode")?;
            flags.extend(["--prefill".into(), prefill.grpc.clone()]);
            flags.extend(prefill.bootstrap.clone());
            flags.extend(["--decode".into(), decode.grpc.clone()]);
            fleet.extend([prefill, decode]);
        }
    }
    let mut line = vec!["smg".to_owned(), "launch".to_owned()];
    line.extend(flags);
    line.extend([
        "--model-path".into(),
        model.display().to_string(),
        "--port".into(),
        args.port.to_string(),
        "--prometheus-port".into(),
        args.prometheus_port.to_string(),
    ]);
    if let Some(n) = args.dataplane_cores {
        line.extend(["--dataplane-cores".into(), n.to_string()]);
    }
    let launch: LaunchArgs = match clap::Parser::try_parse_from(&line)
        .map(|cli: Cli| cli.command)
        .context("building the launch line")?
    {
        CliCommand::Launch(args) => *args,
        CliCommand::Demo(_) => bail!("unexpected demo command"),
    };
    println!(
        "simulated fleet ({:?}, {protocol}) started; gateway: {}",
        args.mode,
        line.join(" ")
    );
    println!(
        "try:\n  curl -s http://127.0.0.1:{}/v1/chat/completions -H 'content-type: application/json' \\\n    -d '{{\"model\": \"model\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}], \"max_tokens\": 32}}'",
        args.port
    );
    let result = crate::server::launch(launch, cores).await;
    drop(fleet);
    result
}
