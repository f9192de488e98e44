//! The `smg` gateway binary.

use clap::Parser;
use smg::cli::{Cli, Command};
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
    let cli = Cli::parse();
    match cli.command {
        Command::Launch(args) => {
            init_logging(args.log_level.as_filter(), args.log_json);
            // Enumerate the cores once, before any thread is pinned.
            let cores = CorePlan::enumerate(args.dataplane_cores);
            let runtime = smg::server::control_runtime(&cores)?;
            runtime.block_on(smg::server::launch(*args, cores))
        }
        Command::Demo(args) => {
            init_logging("info", false);
            let cores = CorePlan::enumerate(args.dataplane_cores);
            let runtime = smg::server::control_runtime(&cores)?;
            runtime.block_on(smg::demo::run(args, cores))
        }
    }
}
