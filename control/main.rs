//! The `smg` gateway binary.

use smg::cli::Invocation;
use smg_dataplane::runtime::CorePlan;

/// Under load the request path is dominated by small, short-lived
/// allocations (tokenizer pieces, JSON values, HTTP/2 frames); mimalloc's
/// per-thread free lists serve them far cheaper than glibc malloc.
#[global_allocator]
static GLOBAL_ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs the command; a failure is one line on stderr (`smg: ...`, its
/// causes joined by `: `) and exit code 1: a start-up mistake (a port in
/// use, an unreadable file) is the user's to fix, not a backtrace to read.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("smg: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    match smg::cli::parse() {
        Invocation::Launch(config) => {
            let log = &config.log;
            smg::logging::init(log.level, log.json, log.color);
            // Enumerate the cores once, before any thread is pinned.
            let cores = CorePlan::enumerate(config.dataplane.cores);
            let runtime = smg::server::control_runtime(&cores)?;
            runtime.block_on(smg::server::launch(*config, cores))
        }
        Invocation::Demo(plan) => {
            let log = &plan.gateway.log;
            smg::logging::init(log.level, log.json, log.color);
            let cores = CorePlan::enumerate(plan.gateway.dataplane.cores);
            let runtime = smg::server::control_runtime(&cores)?;
            runtime.block_on(smg::demo::run(*plan, cores))
        }
    }
}
