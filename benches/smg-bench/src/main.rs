//! The `smg-bench` command: parse flags, build the runtime (one current-thread
//! runtime by default, `--threads N` for more), run, print and write reports.
//! Exits 0 when the run completed (even with failed requests, which are
//! reported), 2 on a set-up error printed as `error[code]: message`.

use std::process::ExitCode;

use clap::Parser;
use smg_bench::cli::Args;
use smg_bench::error::{SetupError, SetupResult};
use smg_bench::report;
use smg_bench::run::{self, Report};

fn main() -> ExitCode {
    let args = Args::parse();
    match run_cli(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error[{}]: {e}", e.code());
            ExitCode::from(2)
        }
    }
}

fn run_cli(args: Args) -> SetupResult<()> {
    let runtime = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()
    }
    .map_err(|e| SetupError::Io(format!("starting the runtime: {e}")))?;
    let report = runtime.block_on(run::run(args))?;
    print_and_write(&report)
}

fn print_and_write(report: &Report) -> SetupResult<()> {
    for point in &report.points {
        print!("{}", report::summary_text(report, point));
    }
    if report.points.len() > 1 {
        println!("Sweep:");
        print!("{}", report::sweep_text(report));
    }
    let cfg = &report.config;
    if let Some(path) = &cfg.output_json {
        report::write_json(report, path)?;
    }
    if let Some(path) = &cfg.output_jsonl {
        report::write_jsonl(report, path)?;
    }
    if let Some(path) = &cfg.output_html {
        report::write_html(report, path)?;
    }
    Ok(())
}
