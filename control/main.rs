//! The `smg` gateway binary.

use smg::cli::Invocation;
use smg_dataplane::runtime::CorePlan;

/// Under load the request path is dominated by small, short-lived
/// allocations (tokenizer pieces, JSON values, HTTP/2 frames); mimalloc's
/// per-thread free lists serve them far cheaper than glibc malloc.
#[global_allocator]
static GLOBAL_ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How often the allocator is asked to return memory freed a while ago.
const ALLOCATOR_UPKEEP: std::time::Duration = std::time::Duration::from_secs(1);

/// Returns the memory a burst freed to the OS once the burst is over.
///
/// Why: mimalloc purges freed pages (gives them back to the OS) lazily, on
/// a later allocation after their purge delay (10 ms, 100 ms for arenas).
/// A gateway that goes quiet after a burst makes no such allocation, so
/// the burst's memory stayed resident: 10,000 clients at once took the
/// gateway from 208 MiB to 992 MiB, and it was still at 838 MiB with every
/// client gone (`benches/burst.rs`). A thread of its own asks mimalloc
/// every [`ALLOCATOR_UPKEEP`] to do what a later allocation would have done
/// (`mi_collect(false)`: purge what has waited its delay; not a forced
/// purge, so under load nothing is returned sooner than mimalloc would
/// itself and pages in use are never touched).
fn start_allocator_upkeep() {
    let upkeep = std::thread::Builder::new()
        .name("smg-allocator".to_owned())
        .spawn(|| {
            loop {
                std::thread::sleep(ALLOCATOR_UPKEEP);
                // SAFETY: mi_collect takes no pointer and may be called
                // from any thread at any time (mimalloc.h); it only frees
                // what the allocator itself holds as free.
                unsafe { libmimalloc_sys::mi_collect(false) };
            }
        });
    if let Err(err) = upkeep {
        eprintln!("smg: no allocator upkeep thread ({err}); freed memory returns lazily");
    }
}

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
            start_allocator_upkeep();
            // Enumerate the cores once, before any thread is pinned.
            let cores = CorePlan::enumerate(config.dataplane.cores);
            let runtime = smg::server::control_runtime(&cores)?;
            runtime.block_on(smg::server::launch(*config, cores))
        }
        Invocation::Demo(plan) => {
            init_logging(&plan.gateway.log)?;
            start_allocator_upkeep();
            let cores = CorePlan::enumerate(plan.gateway.dataplane.cores);
            let runtime = smg::server::control_runtime(&cores)?;
            runtime.block_on(smg::demo::run(*plan, cores))
        }
    }
}
