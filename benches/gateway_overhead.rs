//! End-to-end gateway overhead: `smg` in front of a zero-delay simulated
//! worker, against calling that worker directly over gRPC, in one run.
//!
//! Scenarios: non-streaming 8-token chat throughput (closed loop, 64 in
//! flight) and streaming 8-token chat time per request on keep-alive
//! connections at 1 and 32 concurrent clients. The gateway is pinned to one
//! core with `taskset` when available, the worker to the other. Prints a
//! table and writes `bench-results/gateway_overhead.json`.
//!
//! Run: `cargo bench --bench gateway_overhead` (optionally
//! `SMG_BENCH_SECS=20`; `SMG_BENCH_FRONT_DOOR=1` puts an API key and
//! admission control in front). Not a test: nothing here asserts a speed.

// The e2e harness (process start-up, ports); its digest unit tests are not
// run here, so their imports look unused in this target.
#[path = "../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{
    closed_loop, cpu_seconds, load_average, machine_jiffies, percentile, pin,
    run_queue_wait_seconds,
};
use futures::StreamExt;
use serde_json::json;
use smg::proto::tokenspeed_scheduler as ts;
use smg::proto::tokenspeed_scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;

const OUTPUT_TOKENS: u32 = 8;

/// The API key of `SMG_BENCH_FRONT_DOOR=1` runs.
const BENCH_KEY: &str = "bench-key-0123456789";

#[derive(Debug, Clone, serde::Serialize)]
struct Row {
    scenario: String,
    target: String,
    concurrency: usize,
    requests: usize,
    requests_per_sec: f64,
    /// CPU the serving process used per wall second (1.0 = one full core).
    server_cpu_cores: f64,
    /// Wall seconds per second the serving process was runnable but
    /// waiting for its core (`server_cpu_cores` + this ≈ 1: saturated).
    server_run_queue_wait: f64,
    /// Requests per CPU-second of the serving process.
    requests_per_server_cpu_sec: f64,
    /// Cores the whole machine kept busy on average (everything running,
    /// other users of the machine included), and the load average after.
    machine_busy_cores: f64,
    load_average: f64,
    mean_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// What the machine did while a row ran.
struct Usage {
    wall: Duration,
    /// CPU seconds of the serving process.
    server_cpu: Option<f64>,
    /// Seconds it waited, runnable, for a core.
    server_wait: Option<f64>,
    busy_cores: Option<f64>,
}

/// Measures `run`'s wall time, `server_pid`'s CPU time and the machine's.
async fn measured<T>(server_pid: u32, run: impl std::future::Future<Output = T>) -> (T, Usage) {
    let cpu_before = cpu_seconds(server_pid);
    let wait_before = run_queue_wait_seconds(server_pid);
    let machine_before = machine_jiffies();
    let started = std::time::Instant::now();
    let out = run.await;
    let wall = started.elapsed();
    let server_cpu = cpu_seconds(server_pid)
        .zip(cpu_before)
        .map(|(after, before)| after - before);
    let server_wait = run_queue_wait_seconds(server_pid)
        .zip(wait_before)
        .map(|(after, before)| after - before);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let busy_cores =
        machine_jiffies()
            .zip(machine_before)
            .map(|((busy, total), (busy0, total0))| {
                cores * (busy - busy0) as f64 / (total - total0).max(1) as f64
            });
    (
        out,
        Usage {
            wall,
            server_cpu,
            server_wait,
            busy_cores,
        },
    )
}

fn row(
    scenario: &str,
    target: &str,
    concurrency: usize,
    mut latencies: Vec<f64>,
    usage: &Usage,
) -> Row {
    latencies.sort_by(f64::total_cmp);
    let requests = latencies.len();
    let wall = usage.wall;
    let server_cpu = usage.server_cpu;
    Row {
        scenario: scenario.to_owned(),
        target: target.to_owned(),
        concurrency,
        requests,
        requests_per_sec: requests as f64 / wall.as_secs_f64(),
        server_cpu_cores: server_cpu.map_or(f64::NAN, |cpu| cpu / wall.as_secs_f64()),
        server_run_queue_wait: usage
            .server_wait
            .map_or(f64::NAN, |wait| wait / wall.as_secs_f64()),
        requests_per_server_cpu_sec: server_cpu.map_or(f64::NAN, |cpu| requests as f64 / cpu),
        machine_busy_cores: usage.busy_cores.unwrap_or(f64::NAN),
        load_average: load_average().unwrap_or(f64::NAN),
        mean_ms: latencies.iter().sum::<f64>() / requests.max(1) as f64,
        p50_ms: percentile(&latencies, 0.5),
        p99_ms: percentile(&latencies, 0.99),
    }
}

fn main() {
    let secs: u64 = std::env::var("SMG_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let duration = Duration::from_secs(secs);
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let worker = support::SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    // `SMG_BENCH_FRONT_DOOR=1`: an API key on every request and admission
    // control on (a limit above the bench's concurrency, so nothing waits):
    // the cost of the front door itself.
    let front_door = std::env::var("SMG_BENCH_FRONT_DOOR").is_ok_and(|v| v == "1");
    let mut gateway_args = vec![
        "--worker-urls".to_owned(),
        worker.grpc_url(),
        "--served-model-name".to_owned(),
        "model".to_owned(),
        "--disable-health-check".to_owned(),
        "--policy".to_owned(),
        "round_robin".to_owned(),
    ];
    if front_door {
        gateway_args.extend(
            ["--api-key", BENCH_KEY, "--max-concurrent-requests", "1024"].map(str::to_owned),
        );
    }
    let gateway_args: Vec<&str> = gateway_args.iter().map(String::as_str).collect();
    let gateway = support::Gateway::start(&gateway_args);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores >= 2 {
        pin(gateway.pid(), 1);
        pin(worker.pid(), 0);
    }
    // A fixed system prompt and a user message that differs in every request
    // (a counter), as in real traffic: the gateway renders and tokenizes each
    // prompt, and only the recurring pieces may come from its cache.
    let system = "You are a helpful assistant. Answer briefly and precisely.";
    let messages = json!([{"role": "system", "content": system},
                          {"role": "user", "content": "Benchmark the gateway, please. Request 0"}]);
    let tokenizer =
        smg::tokenizer::Tokenizer::from_model_dir(&support::model_dir()).expect("tokenizer");
    let prompt = tokenizer
        .apply_chat_template(
            messages.as_array().expect("list"),
            &smg::tokenizer::ChatTemplateOptions {
                add_generation_prompt: true,
                ..Default::default()
            },
        )
        .expect("template");
    let input_ids = tokenizer.encode(&prompt, false).expect("ids");
    let chat_url = gateway.url("/v1/chat/completions");
    let worker_url = worker.url();
    let (gateway_pid, worker_pid) = (gateway.pid(), worker.pid());

    let rows = runtime.block_on(async move {
        let mut headers = reqwest::header::HeaderMap::new();
        if front_door {
            let bearer = format!("Bearer {BENCH_KEY}");
            headers.insert(
                reqwest::header::AUTHORIZATION,
                bearer.parse().expect("a header value"),
            );
        }
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .default_headers(headers)
            .build()
            .expect("http client");
        let sequence = Arc::new(AtomicU64::new(0));
        let body = move |stream: bool| {
            let n = sequence.fetch_add(1, Ordering::Relaxed);
            let messages = json!([{"role": "system", "content": system},
                                  {"role": "user", "content": format!("Benchmark the gateway, please. Request {n}")}]);
            json!({"model": "model", "messages": messages, "max_tokens": OUTPUT_TOKENS,
                   "ignore_eos": true, "stream": stream})
        };
        let grpc = TokenSpeedSchedulerClient::connect(worker_url)
            .await
            .expect("connect worker");
        let direct_request = move |stream: bool| ts::GenerateRequest {
            request_id: format!("bench-{:x}", rand::random::<u64>()),
            tokenized: Some(ts::TokenizedInput {
                input_ids: input_ids.clone(),
                original_text: String::new(),
            }),
            sampling_params: Some(ts::SamplingParams {
                max_new_tokens: Some(OUTPUT_TOKENS),
                ignore_eos: true,
                ..Default::default()
            }),
            stream,
            ..Default::default()
        };
        let mut rows = Vec::new();
        for (scenario, stream, concurrency) in [
            ("chat, non-streaming", false, 64usize),
            ("chat, streaming", true, 1),
            ("chat, streaming", true, 32),
        ] {
            let (http, url, body) = (http.clone(), chat_url.clone(), body.clone());
            let ((latencies, _), usage) = measured(gateway_pid, closed_loop(concurrency, duration, move || {
                let (http, url, payload) = (http.clone(), url.clone(), body(stream));
                async move {
                    match http.post(&url).json(&payload).send().await {
                        Ok(response) if response.status().is_success() => {
                            let mut body = response.bytes_stream();
                            while let Some(chunk) = body.next().await {
                                if chunk.is_err() {
                                    return false;
                                }
                            }
                            true
                        }
                        _ => false,
                    }
                }
            }))
            .await;
            rows.push(row(scenario, "gateway (HTTP)", concurrency, latencies, &usage));

            let (grpc, make) = (grpc.clone(), direct_request.clone());
            let ((latencies, _), usage) = measured(worker_pid, closed_loop(concurrency, duration, move || {
                let (mut grpc, request) = (grpc.clone(), make(stream));
                async move {
                    match grpc.generate(request).await {
                        Ok(response) => {
                            let mut messages = response.into_inner();
                            loop {
                                match messages.message().await {
                                    Ok(Some(_)) => {}
                                    Ok(None) => return true,
                                    Err(_) => return false,
                                }
                            }
                        }
                        Err(_) => false,
                    }
                }
            }))
            .await;
            rows.push(row(scenario, "worker direct (gRPC)", concurrency, latencies, &usage));
        }
        rows
    });

    println!(
        "\n{:<22} {:<22} {:>5} {:>9} {:>9} {:>9} {:>9} {:>12} {:>9} {:>6} {:>9} {:>9} {:>9}",
        "scenario",
        "target",
        "conc",
        "requests",
        "req/s",
        "srv cpu",
        "srv wait",
        "req/srv-cpu-s",
        "busy/cores",
        "load",
        "mean ms",
        "p50 ms",
        "p99 ms"
    );
    for r in &rows {
        println!(
            "{:<22} {:<22} {:>5} {:>9} {:>9.0} {:>9.2} {:>9.2} {:>12.0} {:>7.2}/{cores} {:>6.1} {:>9.3} {:>9.3} {:>9.3}",
            r.scenario,
            r.target,
            r.concurrency,
            r.requests,
            r.requests_per_sec,
            r.server_cpu_cores,
            r.server_run_queue_wait,
            r.requests_per_server_cpu_sec,
            r.machine_busy_cores,
            r.load_average,
            r.mean_ms,
            r.p50_ms,
            r.p99_ms
        );
    }
    println!(
        "srv cpu: the serving process's CPU per wall second; srv wait: the time it was \
         runnable but waited for its core, per wall second (cpu + wait near 1.00: the server \
         was saturated, had it had the core to itself); \
         req/srv-cpu-s: requests per CPU-second it used; busy/cores: cores the whole \
         machine kept busy (other processes included); load: 1-minute load average after."
    );
    for pair in rows.chunks(2) {
        if let [gateway, direct] = pair {
            println!(
                "{} at {}: gateway adds {:.3} ms at p50; throughput ratio gateway/direct {:.2}",
                gateway.scenario,
                gateway.concurrency,
                gateway.p50_ms - direct.p50_ms,
                gateway.requests_per_sec / direct.requests_per_sec
            );
        }
    }
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench-results");
    if std::fs::create_dir_all(&out).is_ok() {
        let json =
            serde_json::to_string_pretty(&json!({"cores": cores, "seconds": secs, "rows": rows}))
                .unwrap_or_default();
        let _ = std::fs::write(out.join("gateway_overhead.json"), json);
    }
}
