//! What storing Responses costs the gateway, per history backend, measured
//! against chat completions in the same run.
//!
//! Why it exists: a stored response is a chat completion plus history work
//! (a write per response, a chain read per `previous_response_id`), and
//! users choose a backend by what that work costs. Two parts, for the
//! memory, sqlite and postgres backends in turn (one gateway each, pinned to
//! core 1 with `taskset` when there are two cores; the zero-delay sim worker
//! on core 0; the postgres server, the history crate's private test server,
//! and the load generator unpinned):
//!
//! - Throughput: non-streaming 8-token chat completions, then non-streaming
//!   stored 8-token Responses (closed loop, 64 in flight), each request with
//!   a prompt of its own; on memory also `store: false` Responses (the API's
//!   own cost, nothing stored). Requests per gateway CPU-second is the
//!   per-core figure.
//! - Chains: 10-step `previous_response_id` chains, one request at a time;
//!   each step is followed by the chat completion carrying the same history
//!   as messages, so the growth of the prompt is paid by both and the
//!   difference of their slopes is what replaying a chain adds per step.
//!   The gateway's own timing of the chain read (`response_chain` in
//!   `smg_history_operation_duration_seconds`) is shown per step: one query
//!   per chain, whatever its length.
//!
//! Prints tables and writes `bench-results/responses_storage.json`. Run:
//! `cargo bench --bench responses_storage` (`SMG_BENCH_SECS` per throughput
//! row, default 8; `SMG_BENCH_CHAINS` chains per backend, default 20). Not a
//! test: nothing here asserts a speed.

// The e2e harness (process start-up, ports); its digest unit tests are not
// run here, so their imports look unused in this target.
#[path = "../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

#[path = "../history/tests/support/postgres.rs"]
mod postgres;

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{closed_loop, cpu_seconds, load_average, percentile, pin};
use serde_json::{Value, json};

const OUTPUT_TOKENS: u32 = 8;
const CONCURRENCY: usize = 64;
const CHAIN_STEPS: usize = 10;

#[derive(Debug, Clone, serde::Serialize)]
struct Row {
    backend: String,
    scenario: String,
    requests: usize,
    failures: u64,
    requests_per_sec: f64,
    /// CPU the gateway used per wall second (1.0 = one full core).
    gateway_cpu_cores: f64,
    /// Requests per CPU-second of the gateway: the per-core figure.
    requests_per_gateway_cpu_sec: f64,
    load_average: f64,
    p50_ms: f64,
    p99_ms: f64,
}

#[derive(Debug, Clone, serde::Serialize)]
struct ChainStep {
    backend: String,
    step: usize,
    responses_p50_ms: f64,
    chat_p50_ms: f64,
    /// Mean of the gateway's own timing of the chain read at this step.
    chain_read_mean_ms: f64,
}

/// What a request body asks for.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Chat,
    Responses { store: bool },
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Chat => "chat completions",
            Kind::Responses { store: true } => "responses, stored",
            Kind::Responses { store: false } => "responses, store: false",
        }
    }

    fn path(self) -> &'static str {
        match self {
            Kind::Chat => "/v1/chat/completions",
            Kind::Responses { .. } => "/v1/responses",
        }
    }

    /// A body whose prompt is `text` (the same prompt tokens either way).
    fn body(self, text: &str) -> Value {
        match self {
            Kind::Chat => json!({"model": "model", "max_tokens": OUTPUT_TOKENS,
                "messages": [{"role": "user", "content": text}]}),
            Kind::Responses { store } => json!({"model": "model",
                "max_output_tokens": OUTPUT_TOKENS, "store": store, "input": text}),
        }
    }
}

/// The text of a response's message items.
fn output_text(response: &Value) -> String {
    response["output"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|item| item["type"] == "message")
        .flat_map(|item| item["content"].as_array().into_iter().flatten())
        .filter_map(|part| part["text"].as_str())
        .collect()
}

/// The sum and count of the gateway's `response_chain` timings so far.
async fn chain_read_totals(http: &reqwest::Client, metrics: &str) -> (f64, f64) {
    let Ok(response) = http.get(metrics).send().await else {
        return (f64::NAN, f64::NAN);
    };
    let text = response.text().await.unwrap_or_default();
    let value = |suffix: &str| {
        text.lines()
            .find(|line| {
                line.starts_with(&format!("smg_history_operation_duration_seconds{suffix}{{"))
                    && line.contains("operation=\"response_chain\"")
            })
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|value| value.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (value("_sum"), value("_count"))
}

/// Runs `kind` from [`CONCURRENCY`] loops for `duration` against `gateway`.
async fn throughput(
    http: &reqwest::Client,
    gateway: &support::Gateway,
    backend: &str,
    kind: Kind,
    duration: Duration,
) -> Row {
    let sequence = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let (http, url) = (http.clone(), gateway.url(kind.path()));
    let count = Arc::clone(&failures);
    let cpu_before = cpu_seconds(gateway.pid());
    let started = Instant::now();
    let (mut latencies, _) = closed_loop(CONCURRENCY, duration, move || {
        let n = sequence.fetch_add(1, Ordering::Relaxed);
        let body = kind.body(&format!("Benchmark the gateway, please. Request {n}"));
        let (http, url, failures) = (http.clone(), url.clone(), Arc::clone(&count));
        async move {
            let ok = match http.post(&url).json(&body).send().await {
                Ok(response) if response.status().is_success() => response.bytes().await.is_ok(),
                _ => false,
            };
            if !ok {
                failures.fetch_add(1, Ordering::Relaxed);
            }
            ok
        }
    })
    .await;
    let wall = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds(gateway.pid())
        .zip(cpu_before)
        .map(|(after, before)| after - before);
    latencies.sort_by(f64::total_cmp);
    let requests = latencies.len();
    Row {
        backend: backend.to_owned(),
        scenario: kind.label().to_owned(),
        requests,
        failures: failures.load(Ordering::Relaxed),
        requests_per_sec: requests as f64 / wall,
        gateway_cpu_cores: cpu.map_or(f64::NAN, |cpu| cpu / wall),
        requests_per_gateway_cpu_sec: cpu.map_or(f64::NAN, |cpu| requests as f64 / cpu),
        load_average: load_average().unwrap_or(f64::NAN),
        p50_ms: percentile(&latencies, 0.5),
        p99_ms: percentile(&latencies, 0.99),
    }
}

/// Times `body` sent to `url` once; the answer must be a success.
async fn timed(http: &reqwest::Client, url: &str, body: &Value) -> (f64, Value) {
    let started = Instant::now();
    let response = http.post(url).json(body).send().await.expect("sent");
    let status = response.status();
    let answer: Value = response.json().await.expect("a JSON answer");
    assert!(status.is_success(), "{status}: {answer}");
    (started.elapsed().as_secs_f64() * 1000.0, answer)
}

/// `chains` chains of [`CHAIN_STEPS`] responses, each step followed by the
/// chat completion over the same history.
async fn chains(
    http: &reqwest::Client,
    gateway: &support::Gateway,
    backend: &str,
    chains: usize,
) -> Vec<ChainStep> {
    let responses_url = gateway.url("/v1/responses");
    let chat_url = gateway.url("/v1/chat/completions");
    let metrics = format!("http://{}/metrics", gateway.metrics);
    let mut responses_ms = vec![Vec::new(); CHAIN_STEPS];
    let mut chat_ms = vec![Vec::new(); CHAIN_STEPS];
    let mut read_ms = vec![Vec::new(); CHAIN_STEPS];
    for chain in 0..chains {
        let mut previous: Option<Value> = None;
        let mut messages: Vec<Value> = Vec::new();
        for step in 0..CHAIN_STEPS {
            let input = format!("Chain {chain} of {backend}, step {}: go on.", step + 1);
            let mut body = Kind::Responses { store: true }.body(&input);
            if let Some(previous) = &previous {
                body["previous_response_id"] = previous["id"].clone();
            }
            let (sum_before, count_before) = chain_read_totals(http, &metrics).await;
            let (ms, response) = timed(http, &responses_url, &body).await;
            let (sum_after, count_after) = chain_read_totals(http, &metrics).await;
            responses_ms[step].push(ms);
            if count_after > count_before {
                read_ms[step].push((sum_after - sum_before) * 1000.0);
            }
            messages.push(json!({"role": "user", "content": input}));
            let chat = json!({"model": "model", "max_tokens": OUTPUT_TOKENS,
                              "messages": messages});
            let (ms, _) = timed(http, &chat_url, &chat).await;
            chat_ms[step].push(ms);
            messages.push(json!({"role": "assistant", "content": output_text(&response)}));
            previous = Some(response);
        }
    }
    let median = |values: &mut Vec<f64>| {
        values.sort_by(f64::total_cmp);
        percentile(values, 0.5)
    };
    (0..CHAIN_STEPS)
        .map(|step| ChainStep {
            backend: backend.to_owned(),
            step: step + 1,
            responses_p50_ms: median(&mut responses_ms[step]),
            chat_p50_ms: median(&mut chat_ms[step]),
            chain_read_mean_ms: if read_ms[step].is_empty() {
                f64::NAN
            } else {
                read_ms[step].iter().sum::<f64>() / read_ms[step].len() as f64
            },
        })
        .collect()
}

/// The least-squares slope of `values` over steps 1..=n (ms per step).
fn slope(values: &[f64]) -> f64 {
    let n = values.len() as f64;
    let mean_x = (n + 1.0) / 2.0;
    let mean_y = values.iter().sum::<f64>() / n;
    let (mut num, mut den) = (0.0, 0.0);
    for (index, y) in values.iter().enumerate() {
        let x = index as f64 + 1.0;
        num += (x - mean_x) * (y - mean_y);
        den += (x - mean_x) * (x - mean_x);
    }
    num / den
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let secs = env_or("SMG_BENCH_SECS", 8);
    let chain_count = usize::try_from(env_or("SMG_BENCH_CHAINS", 20)).unwrap_or(20);
    let duration = Duration::from_secs(secs);
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let worker = support::SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores >= 2 {
        pin(worker.pid(), 0);
    }
    let fleet = [
        "--worker-urls".to_owned(),
        worker.grpc_url(),
        "--served-model-name".to_owned(),
        "model".to_owned(),
        "--disable-health-check".to_owned(),
    ];
    let dir = tempfile::tempdir().expect("temp dir");
    let sqlite = dir.path().join("history.sqlite3");
    let postgres_url = runtime.block_on(postgres::fresh_database());
    let backends: [(&str, Vec<String>); 3] = [
        ("memory", vec!["--history-backend".into(), "memory".into()]),
        (
            "sqlite",
            vec![
                "--history-backend".into(),
                "sqlite".into(),
                "--history-path".into(),
                sqlite.display().to_string(),
            ],
        ),
        (
            "postgres",
            vec![
                "--history-backend".into(),
                "postgres".into(),
                "--history-url".into(),
                postgres_url,
            ],
        ),
    ];
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()
        .expect("http client");
    let mut rows = Vec::new();
    let mut steps = Vec::new();
    for (backend, history) in &backends {
        let args: Vec<&str> = fleet.iter().chain(history).map(String::as_str).collect();
        let gateway = support::Gateway::start(&args);
        if cores >= 2 {
            pin(gateway.pid(), 1);
        }
        let mut kinds = vec![Kind::Chat, Kind::Responses { store: true }];
        if *backend == "memory" {
            kinds.push(Kind::Responses { store: false });
        }
        runtime.block_on(async {
            for kind in kinds {
                rows.push(throughput(&http, &gateway, backend, kind, duration).await);
            }
            steps.extend(chains(&http, &gateway, backend, chain_count).await);
        });
    }

    println!(
        "\n{:<9} {:<24} {:>9} {:>6} {:>8} {:>8} {:>14} {:>6} {:>8} {:>8}",
        "backend",
        "scenario",
        "requests",
        "fails",
        "req/s",
        "gw cpu",
        "req/gw-cpu-s",
        "load",
        "p50 ms",
        "p99 ms"
    );
    for r in &rows {
        println!(
            "{:<9} {:<24} {:>9} {:>6} {:>8.0} {:>8.2} {:>14.0} {:>6.1} {:>8.2} {:>8.2}",
            r.backend,
            r.scenario,
            r.requests,
            r.failures,
            r.requests_per_sec,
            r.gateway_cpu_cores,
            r.requests_per_gateway_cpu_sec,
            r.load_average,
            r.p50_ms,
            r.p99_ms
        );
    }
    for r in &rows {
        if let Some(chat) = rows
            .iter()
            .find(|c| c.backend == r.backend && c.scenario == Kind::Chat.label())
            && r.scenario != chat.scenario
        {
            println!(
                "{} {}: {:.2}x the requests per gateway CPU-second of chat completions",
                r.backend,
                r.scenario,
                r.requests_per_gateway_cpu_sec / chat.requests_per_gateway_cpu_sec
            );
        }
    }

    println!(
        "\n{CHAIN_STEPS}-step previous_response_id chains ({chain_count} per backend, one request \
         at a time): p50 ms of step k, of the chat completion over the same history, and the \
         gateway's mean chain read"
    );
    println!(
        "{:<9} {:>4} {:>13} {:>9} {:>14}",
        "backend", "step", "responses ms", "chat ms", "chain read ms"
    );
    for s in &steps {
        println!(
            "{:<9} {:>4} {:>13.2} {:>9.2} {:>14.3}",
            s.backend, s.step, s.responses_p50_ms, s.chat_p50_ms, s.chain_read_mean_ms
        );
    }
    let mut slopes = Vec::new();
    for (backend, _) in &backends {
        let of = |pick: fn(&ChainStep) -> f64| -> Vec<f64> {
            steps
                .iter()
                .filter(|s| s.backend == *backend)
                .map(pick)
                .collect()
        };
        let responses = slope(&of(|s| s.responses_p50_ms));
        let chat = slope(&of(|s| s.chat_p50_ms));
        let reads: Vec<f64> = of(|s| s.chain_read_mean_ms).into_iter().skip(1).collect();
        let read = slope(&reads);
        println!(
            "{backend}: a step adds {responses:.3} ms to a response, {chat:.3} ms to the chat \
             completion with the same history: {:.3} ms per step for replaying the chain \
             (the chain read itself: {read:.4} ms per step)",
            responses - chat
        );
        slopes.push(
            json!({"backend": backend, "responses_ms_per_step": responses,
            "chat_ms_per_step": chat, "added_ms_per_step": responses - chat,
            "chain_read_ms_per_step": read}),
        );
    }
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench-results");
    if std::fs::create_dir_all(&out).is_ok() {
        let json = serde_json::to_string_pretty(&json!({
            "cores": cores, "seconds": secs, "chains": chain_count,
            "rows": rows, "chain_steps": steps, "slopes": slopes}))
        .unwrap_or_default();
        let _ = std::fs::write(out.join("responses_storage.json"), json);
    }
}
