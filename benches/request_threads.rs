//! Issue 19: small chats' latency while huge prompts are being tokenized.
//!
//! A zero-delay TokenSpeed sim worker and `smg` in front of it, with the
//! default core split (on two cores: one tokio thread, the data plane on
//! the other core). One client sends short non-streaming chats back to back
//! (8 output tokens) and their latency is recorded, first with nothing else
//! running, then while two more clients send 8 MB completion prompts back
//! to back (each is tokenized in full and then refused,
//! `context_length_exceeded`: the CPU work is the gateway's alone). Prints
//! a table of p50/p99 per phase and writes
//! `bench-results/request_threads.json`.
//!
//! Run: `cargo bench --bench request_threads` (`SMG_BENCH_SECS`, default
//! 10 s per phase). `SMG_BENCH_GATEWAY=PATH[,PATH...]` measures those `smg`
//! binaries instead of this build's, in the order given (e.g. a build of
//! the previous commit, then this one). Not a test: nothing here asserts a
//! speed.

#[path = "../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::{closed_loop, load_average, percentile};
use serde_json::{Value, json};

/// The bytes of each huge prompt.
const HUGE_BYTES: usize = 8 << 20;
const HUGE_CLIENTS: usize = 2;

#[derive(Debug, serde::Serialize)]
struct Row {
    gateway: String,
    phase: String,
    chats: usize,
    chat_failures: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    huge_prompts_answered: usize,
    load_average: f64,
}

async fn chat(http: reqwest::Client, url: String, failures: Arc<AtomicUsize>) -> bool {
    let body = json!({
        "model": "model",
        "messages": [{"role": "user", "content": "Say hello to the gateway."}],
        "max_tokens": 8,
    });
    let ok = match http.post(&url).json(&body).send().await {
        Ok(response) => response.status().is_success() && response.bytes().await.is_ok(),
        Err(_) => false,
    };
    if !ok {
        failures.fetch_add(1, Ordering::Relaxed);
    }
    ok
}

/// Sends 8 MB prompts back to back until `stop`; returns how many were
/// answered.
async fn huge_prompts(http: reqwest::Client, url: String, stop: Arc<AtomicBool>) -> usize {
    let prompt = "lorem ipsum dolor sit amet ".repeat(HUGE_BYTES / 27);
    let body = serde_json::to_vec(&json!({"model": "model", "prompt": prompt, "max_tokens": 1}))
        .expect("serializes");
    let mut answered = 0;
    while !stop.load(Ordering::Relaxed) {
        let sent = http
            .post(&url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await;
        if let Ok(response) = sent
            && response.bytes().await.is_ok()
        {
            answered += 1;
        }
    }
    answered
}

async fn phase(gateway: &support::Gateway, label: &str, name: &str, huge: bool) -> Row {
    let secs = std::env::var("SMG_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let http = reqwest::Client::new();
    let stop = Arc::new(AtomicBool::new(false));
    let flood: Vec<_> = (0..if huge { HUGE_CLIENTS } else { 0 })
        .map(|_| {
            tokio::spawn(huge_prompts(
                reqwest::Client::new(),
                gateway.url("/v1/completions"),
                Arc::clone(&stop),
            ))
        })
        .collect();
    let failures = Arc::new(AtomicUsize::new(0));
    let url = gateway.url("/v1/chat/completions");
    let counted = Arc::clone(&failures);
    let (mut latencies, _) = closed_loop(1, Duration::from_secs(secs), move || {
        chat(http.clone(), url.clone(), Arc::clone(&counted))
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut answered = 0;
    for task in flood {
        answered += task.await.unwrap_or(0);
    }
    latencies.sort_by(f64::total_cmp);
    Row {
        gateway: label.to_owned(),
        phase: name.to_owned(),
        chats: latencies.len(),
        chat_failures: failures.load(Ordering::Relaxed),
        p50_ms: percentile(&latencies, 0.5),
        p99_ms: percentile(&latencies, 0.99),
        max_ms: latencies.last().copied().unwrap_or(f64::NAN),
        huge_prompts_answered: answered,
        load_average: load_average().unwrap_or(f64::NAN),
    }
}

#[tokio::main]
async fn main() {
    let programs: Vec<PathBuf> = match std::env::var("SMG_BENCH_GATEWAY") {
        Ok(list) => list.split(',').map(PathBuf::from).collect(),
        Err(_) => vec![PathBuf::from(env!("CARGO_BIN_EXE_smg"))],
    };
    let worker = support::SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let mut rows = Vec::new();
    for program in &programs {
        let label = program
            .file_name()
            .map_or_else(String::new, |name| name.to_string_lossy().into_owned());
        let gateway = support::Gateway::start_program(
            program,
            &[
                "--worker-urls",
                &worker.grpc_url(),
                "--served-model-name",
                "model",
            ],
        );
        // Warm-up: connections, caches.
        let _ = phase(&gateway, &label, "warm-up", false).await;
        rows.push(phase(&gateway, &label, "chats alone", false).await);
        rows.push(phase(&gateway, &label, "chats + 8 MB prompts", true).await);
    }
    println!(
        "\n| gateway | phase | chats | failed | p50 ms | p99 ms | max ms | 8 MB prompts answered | load avg |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for row in &rows {
        println!(
            "| {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {} | {:.1} |",
            row.gateway,
            row.phase,
            row.chats,
            row.chat_failures,
            row.p50_ms,
            row.p99_ms,
            row.max_ms,
            row.huge_prompts_answered,
            row.load_average
        );
    }
    let out: Value = json!({ "rows": rows });
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench-results");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(
        dir.join("request_threads.json"),
        serde_json::to_string_pretty(&out).unwrap_or_default(),
    );
}
