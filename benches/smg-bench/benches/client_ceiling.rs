//! The client's own ceiling: how many requests per second one `smg-bench`
//! core can drive against a zero-delay endpoint, so users know when the
//! load generator (not the server) is the limit.
//!
//! `cargo bench -p smg-bench --bench client_ceiling` starts the scripted
//! fixture server with no delays on a thread pinned to CPU 1, then runs the
//! release `smg-bench` binary pinned to CPU 0 (`taskset -c 0`, one
//! current-thread runtime) with `--request-rate inf` at several concurrency
//! caps, non-streaming and streaming (8 tokens). It prints a Markdown table
//! with the client's CPU use during the run (its own `getrusage`) and req/s per
//! client core. `SMG_BENCH_REQUESTS` sets requests per row (default 200000).

use std::process::Command;

use smg_bench::fixture::{FixtureConfig, FixtureServer};

fn pin_current_thread(cpu: usize) -> bool {
    // SAFETY: `set` is a plain bitmask owned by this frame, zeroed before use;
    // sched_setaffinity(0, ...) only changes the calling thread's affinity.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

fn main() {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let requests: usize = std::env::var("SMG_BENCH_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let pinned = cpus > 1 && pin_current_thread(1);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("server runtime");
        runtime.block_on(async move {
            let server = FixtureServer::start(FixtureConfig {
                tokens: 8,
                ..FixtureConfig::default()
            })
            .await
            .expect("fixture server");
            addr_tx.send((server.url(), pinned)).expect("send addr");
            std::future::pending::<()>().await;
        });
    });
    let (url, pinned) = addr_rx.recv().expect("server address");
    let taskset = cpus > 1 && Command::new("taskset").arg("-V").output().is_ok();
    println!(
        "client ceiling: {requests} requests per row; server pinned to cpu 1: {pinned}; client pinned to cpu 0: {taskset}"
    );
    println!();
    println!(
        "| mode | conc | req/s | client cpu | req/s per client core | e2e p50 ms | e2e p99 ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let out = std::env::temp_dir().join(format!("smg-bench-ceiling-{}.json", std::process::id()));
    for (stream, conc, n) in [
        (false, 1, requests / 10),
        (false, 16, requests),
        (false, 64, requests),
        (false, 256, requests),
        (true, 64, requests / 4),
    ] {
        let bin = env!("CARGO_BIN_EXE_smg-bench");
        let mut cmd = if taskset {
            let mut c = Command::new("taskset");
            c.args(["-c", "0", bin]);
            c
        } else {
            Command::new(bin)
        };
        cmd.args([
            "--base-url",
            &url,
            "--model",
            "fixture-model",
            "--request-rate",
            "inf",
        ])
        .args([
            "--max-concurrency",
            &conc.to_string(),
            "--num-prompts",
            &n.to_string(),
        ])
        .args([
            "--input-len",
            "16",
            "--output-len",
            "8",
            "--warmup",
            &conc.to_string(),
        ])
        .args(["--no-progress", "--output-json"])
        .arg(&out);
        if stream {
            cmd.arg("--stream");
        }
        let status = cmd.output().expect("run smg-bench");
        assert!(
            status.status.success(),
            "{}",
            String::from_utf8_lossy(&status.stderr)
        );
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&out).expect("read json")).expect("json");
        let s = &json["points"][0]["summary"];
        let rate = s["achieved_rate"].as_f64().unwrap_or(0.0);
        let failed = s["failed"].as_u64().unwrap_or(0);
        assert_eq!(failed, 0, "failed requests: {}", s["errors"]);
        // The client's own CPU during the measured run, per wall second.
        let cpu_share = s["client_cpu_utilization"].as_f64().unwrap_or(f64::NAN);
        println!(
            "| {} | {conc} | {rate:.0} | {cpu_share:.2} | {:.0} | {:.3} | {:.3} |",
            if stream {
                "stream, 8 tokens"
            } else {
                "non-streaming"
            },
            rate / cpu_share.max(0.01),
            s["e2e_ms"]["p50"].as_f64().unwrap_or(f64::NAN),
            s["e2e_ms"]["p99"].as_f64().unwrap_or(f64::NAN),
        );
    }
    let _ = std::fs::remove_file(out);
}
