//! The `smg` gateway binary.

use clap::Parser;

/// smg: a model gateway for LLM serving fleets.
#[derive(Debug, Parser)]
#[command(name = "smg", version, about)]
struct Cli {}

fn main() {
    let _cli = Cli::parse();
    eprintln!(
        "smg {}: the gateway's `launch` command is not built yet; \
         run `smg-sim-worker --help` for the simulated engine",
        env!("CARGO_PKG_VERSION")
    );
    std::process::exit(2);
}
