//! The `smg` gateway binary.

use smg::cli::Invocation;
use smg_dataplane::runtime::CorePlan;

/// Under load the request path is dominated by small, short-lived
/// allocations (tokenizer pieces, JSON values, HTTP/2 frames); mimalloc's
/// per-thread free lists serve them far cheaper than glibc malloc.
#[global_allocator]
static GLOBAL_ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs the command; a failure is one line on stderr (`smg: ...`) and
/// exit code 1: a start-up mistake (a port in use, an unreadable file) is
/// the user's to fix, not a backtrace or a debug dump to read.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("smg: {}", one_line(&err));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error and its causes joined by `: `, leaving out a cause the text
/// already says, on one line.
fn one_line(err: &anyhow::Error) -> String {
    let mut line = err.to_string();
    for cause in err.chain().skip(1) {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
    }
    line.replace('\n', " ")
}

/// Installs logging as `log` says.
fn init_logging(log: &smg::config::LogConfig) -> anyhow::Result<()> {
    smg::logging::init(log.level, log.json, log.color, log.dir.as_deref()).map_err(|err| {
        let dir = log.dir.as_deref().unwrap_or(std::path::Path::new(""));
        anyhow::anyhow!("--log-dir {}: {err}", dir.display())
    })
}

fn run() -> anyhow::Result<()> {
    match smg::cli::parse() {
        Invocation::Launch(config) => {
            init_logging(&config.log)?;
            // Enumerate the cores once, before any thread is pinned.
            let cores = CorePlan::enumerate(config.dataplane.cores);
            let runtime = smg::server::control_runtime(&cores)?;
            runtime.block_on(smg::server::launch(*config, cores))
        }
        Invocation::Demo(plan) => {
            init_logging(&plan.gateway.log)?;
            let cores = CorePlan::enumerate(plan.gateway.dataplane.cores);
            let runtime = smg::server::control_runtime(&cores)?;
            runtime.block_on(smg::demo::run(*plan, cores))
        }
    }
}
