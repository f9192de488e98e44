//! The `smg` gateway binary.

use smg::cli::Invocation;
use smg_dataplane::runtime::CorePlan;

/// Under load the request path is dominated by small, short-lived
/// allocations (tokenizer pieces, JSON values, HTTP/2 frames); mimalloc's
/// per-thread free lists serve them far cheaper than glibc malloc.
#[global_allocator]
static GLOBAL_ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn init_logging(level: &str, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn main() -> anyhow::Result<()> {
    match smg::cli::parse() {
        Invocation::Launch(config) => {
            init_logging(config.log.level, config.log.json);
            // Enumerate the cores once, before any thread is pinned.
            let cores = CorePlan::enumerate(config.dataplane.cores);
            let runtime = smg::server::control_runtime(&cores)?;
            runtime.block_on(smg::server::launch(*config, cores))
        }
        Invocation::Demo(plan) => {
            init_logging(plan.gateway.log.level, plan.gateway.log.json);
            let cores = CorePlan::enumerate(plan.gateway.dataplane.cores);
            let runtime = smg::server::control_runtime(&cores)?;
            runtime.block_on(smg::demo::run(*plan, cores))
        }
    }
}
