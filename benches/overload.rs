//! Issue 14's overload row: open-loop load at three times the fleet's
//! capacity, against a gateway with admission control on and off. Reports,
//! per row, the answers by status and code, the p50/p99 latency of the
//! admitted requests (200) and of the refusals, how the admitted p99
//! compares with the unloaded p99 (the goal: within 1.5x), and the
//! gateway's resident memory (start, max, end; the goal: flat).
//!
//! Why it exists: the admission tests prove that the queue fills, drains
//! and refuses with the right codes; only a run under sustained overload
//! shows what the admitted requests still get, how fast the excess is
//! turned away, and whether memory stays put while it is.
//!
//! The fleet's capacity is set by the workers, not by the machine's CPU:
//! `SMG_BENCH_WORKERS` (default 2) sim workers, each decoding at most
//! `SMG_BENCH_WORKER_SLOTS` (default 4) requests at once at 10 ms per token
//! (no extra cost per running request), and every request asks for
//! `SMG_BENCH_TOKENS` (default 10) tokens with `ignore_eos`: about 100 ms of
//! worker time each, so the fleet serves workers × slots requests at once
//! and a few tens per second, far below what the gateway itself could
//! forward. The gateway gets `--max-concurrent-requests` = workers × slots
//! (the fleet's concurrency), `--queue-size` `SMG_BENCH_QUEUE` (default a
//! quarter of it), `--queue-timeout-secs 1` and `--policy least_load` (so
//! the admitted requests spread over the workers' slots evenly).
//!
//! Capacity (requests/s) is measured first with a closed loop at exactly
//! the fleet's concurrency for `SMG_BENCH_CAPACITY_SECS` (default 10).
//! Then each row is an open loop (Poisson
//! arrivals, seeded; each request its own task on a pooled HTTP/1.1
//! client, so a slow answer never delays the next send) for
//! `SMG_BENCH_SECS` (default 20) at a multiple of that capacity: 0.5x
//! (the unloaded baseline), 1x and 3x with admission on; then, each on a
//! fresh gateway, 3x with a queue eight times as long and 3x with the
//! default queue (100 requests, 60 s): under overload the queue stays
//! full, so an admitted request waits about queue / capacity, which is
//! what separates its p99 from the unloaded one; and 3x with admission off
//! (no `--max-concurrent-requests`: what admission buys). Latency is timed
//! from the moment a request's task starts sending it. RSS is `VmRSS` from
//! `/proc/PID/status`, sampled every 100 ms: at the row's start, its
//! highest sample, and once the row's last answer is in. Each row also
//! keeps its ten slowest answers with the second they were sent at, so a
//! stall of the shared machine (a cluster) can be told from a tail.
//!
//! Run: `cargo bench --bench overload` (the dev profile,
//! `cargo bench --profile dev --bench overload`, builds much faster and is
//! what BENCHMARKS.md records). Prints a table and writes
//! `bench-results/overload.json`. Not a test: nothing here asserts a speed
//! or a size; the ratio is printed.

// The e2e harness (process start-up, ports, the fixtures); its digest unit
// tests are not run here, so their imports look unused in this target.
#[path = "../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::{
    classified_chat, closed_loop, env_or, load_average, mib, open_loop_client, percentile,
    proc_status_bytes,
};
use serde_json::{Value, json};
use support::{Gateway, SimWorker};

/// The fleet: its size and how long a request takes on it.
#[derive(Debug, Clone, Copy)]
struct Fleet {
    workers: usize,
    /// Requests each worker decodes at once (`--max-running-requests`).
    slots: usize,
    /// Tokens per request, one decode step (10 ms) each.
    tokens: u32,
    /// Admission queue length for the rows with admission on.
    queue: usize,
}

impl Fleet {
    fn concurrency(&self) -> usize {
        self.workers * self.slots
    }
}

fn chat_body(tokens: u32) -> Value {
    json!({
        "model": "model",
        "messages": [{"role": "user", "content": "Hello, overload."}],
        "max_tokens": tokens,
        "ignore_eos": true,
    })
}

/// Samples the gateway's RSS every 100 ms until dropped; keeps the
/// highest reading.
struct RssSampler {
    running: Arc<AtomicBool>,
    max: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl RssSampler {
    fn start(pid: u32) -> RssSampler {
        let running = Arc::new(AtomicBool::new(true));
        let max = Arc::new(AtomicU64::new(
            proc_status_bytes(pid, "VmRSS:").unwrap_or(0),
        ));
        let task = {
            let (running, max) = (Arc::clone(&running), Arc::clone(&max));
            tokio::spawn(async move {
                while running.load(Ordering::Relaxed) {
                    if let Some(rss) = proc_status_bytes(pid, "VmRSS:") {
                        max.fetch_max(rss, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        };
        RssSampler { running, max, task }
    }

    async fn stop(self) -> u64 {
        self.running.store(false, Ordering::Relaxed);
        let _ = self.task.await;
        self.max.load(Ordering::Relaxed)
    }
}

/// Closed loop at the fleet's concurrency: requests per second served, and
/// the p50 latency (the fleet's service time through the gateway).
async fn capacity(gateway: &Gateway, fleet: Fleet, duration: Duration) -> (f64, f64) {
    let (client, url, body) = (
        open_loop_client(),
        gateway.url("/v1/chat/completions"),
        chat_body(fleet.tokens),
    );
    let (mut latencies, elapsed) = closed_loop(fleet.concurrency(), duration, move || {
        let (client, url, body) = (client.clone(), url.clone(), body.clone());
        async move { classified_chat(&client, &url, &body).await.0 == "200" }
    })
    .await;
    latencies.sort_by(f64::total_cmp);
    (
        latencies.len() as f64 / elapsed.as_secs_f64(),
        percentile(&latencies, 0.50),
    )
}

/// What one row is: its name and configuration.
#[derive(Debug, Clone, Copy)]
struct RowSpec {
    name: &'static str,
    /// The admission queue length; `None`: admission off.
    queue: Option<usize>,
    /// `--queue-timeout-secs`.
    queue_timeout_secs: u64,
    /// Offered load as a multiple of the measured capacity.
    load: f64,
    seed: u64,
}

/// An open loop at `rate` requests/s for `duration` against `gateway`.
async fn row(
    gateway: &Gateway,
    fleet: Fleet,
    spec: RowSpec,
    rate: f64,
    duration: Duration,
) -> Value {
    use rand::{Rng, SeedableRng};
    let pid = gateway.pid();
    let (client, url, body) = (
        open_loop_client(),
        Arc::new(gateway.url("/v1/chat/completions")),
        Arc::new(chat_body(fleet.tokens)),
    );
    let rss_start = proc_status_bytes(pid, "VmRSS:").unwrap_or(0);
    let sampler = RssSampler::start(pid);

    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed);
    let start = tokio::time::Instant::now();
    let mut scheduled = start;
    let mut tasks = Vec::new();
    loop {
        // Exponential inter-arrival times: -ln(U) / rate, U in (0, 1].
        let uniform: f64 = 1.0 - rng.random::<f64>();
        scheduled += Duration::from_secs_f64(-uniform.ln() / rate);
        if scheduled.duration_since(start) >= duration {
            break;
        }
        tokio::time::sleep_until(scheduled).await;
        let (client, url, body) = (client.clone(), Arc::clone(&url), Arc::clone(&body));
        let at = start.elapsed().as_secs_f64();
        tasks.push(tokio::spawn(async move {
            let (answer, ms) = classified_chat(&client, &url, &body).await;
            (answer, ms, at)
        }));
    }
    let sending = start.elapsed();
    let sent = tasks.len();
    let rss_sending_ended = proc_status_bytes(pid, "VmRSS:").unwrap_or(0);

    let mut answers: BTreeMap<String, usize> = BTreeMap::new();
    let (mut admitted, mut refused) = (Vec::new(), Vec::new());
    // The slowest answers with the second they were sent at, to tell a
    // stall (a cluster) from a tail.
    let mut slowest: Vec<(f64, f64, String)> = Vec::new();
    for task in tasks {
        let (answer, ms, at) = task
            .await
            .unwrap_or_else(|_| ("client task panicked".to_owned(), f64::NAN, f64::NAN));
        slowest.push((ms, at, answer.clone()));
        if answer == "200" {
            admitted.push(ms);
        } else if answer.starts_with("429") || answer.starts_with("408") {
            refused.push(ms);
        }
        *answers.entry(answer).or_default() += 1;
    }
    let drained = start.elapsed();
    let rss_max = sampler.stop().await;
    let rss_end = proc_status_bytes(pid, "VmRSS:").unwrap_or(0);
    admitted.sort_by(f64::total_cmp);
    refused.sort_by(f64::total_cmp);
    slowest.sort_by(|a, b| b.0.total_cmp(&a.0));
    slowest.truncate(10);
    let slowest: Vec<Value> = slowest
        .into_iter()
        .map(|(ms, at, answer)| json!({"ms": ms, "sent_at_s": at, "answer": answer}))
        .collect();
    let row = json!({
        "row": spec.name,
        "admission": spec.queue.is_some(),
        "max_concurrent_requests": spec.queue.map(|_| fleet.concurrency()),
        "queue_size": spec.queue,
        "queue_timeout_secs": spec.queue.map(|_| spec.queue_timeout_secs),
        "load": spec.load,
        "offered_per_sec": rate,
        "sent": sent,
        "sent_per_sec": sent as f64 / sending.as_secs_f64(),
        "seconds_sending": sending.as_secs_f64(),
        "seconds_until_last_answer": drained.as_secs_f64(),
        "answers": answers,
        "admitted_per_sec": admitted.len() as f64 / sending.as_secs_f64(),
        "admitted_p50_ms": percentile(&admitted, 0.50),
        "admitted_p99_ms": percentile(&admitted, 0.99),
        "admitted_max_ms": admitted.last().copied().unwrap_or(f64::NAN),
        "refused_p50_ms": percentile(&refused, 0.50),
        "refused_p99_ms": percentile(&refused, 0.99),
        "rss_start_bytes": rss_start,
        "rss_when_sending_ended_bytes": rss_sending_ended,
        "rss_max_bytes": rss_max,
        "rss_end_bytes": rss_end,
        "load_average": load_average(),
        "slowest": slowest,
    });
    println!(
        "{}: {sent} sent at {:.0}/s, {}; admitted p50 {:.0} ms p99 {:.0} ms; refused p50 {:.1} ms \
         p99 {:.1} ms; RSS {:.0} → max {:.0} → end {:.0} MiB; last answer after {:.1} s; load {:.2}",
        spec.name,
        sent as f64 / sending.as_secs_f64(),
        row["answers"],
        percentile(&admitted, 0.50),
        percentile(&admitted, 0.99),
        percentile(&refused, 0.50),
        percentile(&refused, 0.99),
        mib(rss_start),
        mib(rss_max),
        mib(rss_end),
        drained.as_secs_f64(),
        load_average().unwrap_or(f64::NAN),
    );
    let slow: Vec<String> = row["slowest"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|slow| {
            format!(
                "{:.0} ms at {:.2} s",
                slow["ms"].as_f64().unwrap_or(f64::NAN),
                slow["sent_at_s"].as_f64().unwrap_or(f64::NAN)
            )
        })
        .collect();
    println!("  slowest: {}", slow.join(", "));
    row
}

/// A gateway in front of `urls`; `queue: None` turns admission off.
fn gateway(urls: &[String], fleet: Fleet, spec: RowSpec) -> Gateway {
    let concurrency = fleet.concurrency().to_string();
    let queue = spec.queue.map(|queue| queue.to_string());
    let timeout = spec.queue_timeout_secs.to_string();
    let mut args = vec!["--worker-urls"];
    args.extend(urls.iter().map(String::as_str));
    args.extend(["--served-model-name", "model", "--policy", "least_load"]);
    if let Some(queue) = &queue {
        args.extend(["--max-concurrent-requests", concurrency.as_str()]);
        args.extend(["--queue-size", queue.as_str()]);
        args.extend(["--queue-timeout-secs", timeout.as_str()]);
    }
    Gateway::start(&args)
}

/// A few requests so pools, caches and the tokenizer are warm.
async fn warm(gateway: &Gateway, fleet: Fleet) {
    let (client, url, body) = (
        open_loop_client(),
        gateway.url("/v1/chat/completions"),
        chat_body(fleet.tokens),
    );
    let sends = (0..fleet.concurrency()).map(|_| classified_chat(&client, &url, &body));
    futures::future::join_all(sends).await;
}

async fn run(fleet: Fleet, duration: Duration, capacity_for: Duration) -> Value {
    let slots = fleet.slots.to_string();
    let sims: Vec<SimWorker> = (0..fleet.workers)
        .map(|_| {
            SimWorker::start(
                "tokenspeed",
                "regular",
                &[
                    "--decode-ms-per-token",
                    "10",
                    "--decode-ms-per-running-request",
                    "0",
                    "--max-running-requests",
                    &slots,
                ],
            )
        })
        .collect();
    let urls: Vec<String> = sims.iter().map(SimWorker::grpc_url).collect();

    let mut rows = Vec::new();
    let short = RowSpec {
        name: "",
        queue: Some(fleet.queue),
        queue_timeout_secs: 1,
        load: 0.0,
        seed: 0,
    };
    let gateway_on = gateway(&urls, fleet, short);
    warm(&gateway_on, fleet).await;
    let (capacity, service_ms) = capacity(&gateway_on, fleet, capacity_for).await;
    println!(
        "capacity: {capacity:.1} requests/s at {} in flight (closed loop, {} s), p50 {service_ms:.0} ms",
        fleet.concurrency(),
        capacity_for.as_secs()
    );
    let specs_on = [
        RowSpec {
            name: "unloaded (0.5x)",
            load: 0.5,
            seed: 1,
            ..short
        },
        RowSpec {
            name: "1x",
            load: 1.0,
            seed: 2,
            ..short
        },
        RowSpec {
            name: "3x",
            load: 3.0,
            seed: 3,
            ..short
        },
    ];
    for spec in specs_on {
        rows.push(row(&gateway_on, fleet, spec, capacity * spec.load, duration).await);
    }
    drop(gateway_on);

    // Each on a gateway of its own, at 3x: a queue eight times as long,
    // the default queue (100 requests, 60 s), and admission off.
    let others = [
        RowSpec {
            name: "3x, long queue",
            queue: Some(fleet.queue * 8),
            queue_timeout_secs: 1,
            load: 3.0,
            seed: 3,
        },
        RowSpec {
            name: "3x, default queue",
            queue: Some(100),
            queue_timeout_secs: 60,
            load: 3.0,
            seed: 3,
        },
        RowSpec {
            name: "3x, admission off",
            queue: None,
            queue_timeout_secs: 0,
            load: 3.0,
            seed: 3,
        },
    ];
    for spec in others {
        let gateway = gateway(&urls, fleet, spec);
        warm(&gateway, fleet).await;
        rows.push(row(&gateway, fleet, spec, capacity * spec.load, duration).await);
    }

    let unloaded_p99 = rows[0]["admitted_p99_ms"].as_f64().unwrap_or(f64::NAN);
    for row in &mut rows {
        let p99 = row["admitted_p99_ms"].as_f64().unwrap_or(f64::NAN);
        row["admitted_p99_over_unloaded_p99"] = json!(p99 / unloaded_p99);
    }
    json!({
        "workers": fleet.workers,
        "slots_per_worker": fleet.slots,
        "tokens_per_request": fleet.tokens,
        "decode_ms_per_token": 10,
        "capacity_per_sec": capacity,
        "capacity_p50_ms": service_ms,
        "seconds_per_row": duration.as_secs_f64(),
        "rows": rows,
    })
}

fn print_table(result: &Value) {
    println!();
    println!(
        "| row | admission (max / queue / timeout) | offered | sent/s | answers | admitted/s | admitted p50 | admitted p99 | p99 / unloaded p99 | refused p50 | refused p99 | RSS start | max | end |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let rows = result["rows"].as_array().cloned().unwrap_or_default();
    for row in rows {
        let number = |key: &str| row[key].as_f64().unwrap_or(f64::NAN);
        let mib_of = |key: &str| mib(row[key].as_u64().unwrap_or(0));
        let admission = match row["queue_size"].as_u64() {
            Some(queue) => format!(
                "{} / {queue} / {} s",
                row["max_concurrent_requests"], row["queue_timeout_secs"]
            ),
            None => "off".to_owned(),
        };
        let answers = row["answers"]
            .as_object()
            .map(|answers| {
                answers
                    .iter()
                    .map(|(answer, count)| format!("{answer} × {count}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        println!(
            "| {} | {admission} | {:.0}/s ({}x) | {:.0} | {answers} | {:.0} | {:.0} ms | {:.0} ms | {:.2} | {:.1} ms | {:.1} ms | {:.0} MiB | {:.0} MiB | {:.0} MiB |",
            row["row"].as_str().unwrap_or_default(),
            number("offered_per_sec"),
            number("load"),
            number("sent_per_sec"),
            number("admitted_per_sec"),
            number("admitted_p50_ms"),
            number("admitted_p99_ms"),
            number("admitted_p99_over_unloaded_p99"),
            number("refused_p50_ms"),
            number("refused_p99_ms"),
            mib_of("rss_start_bytes"),
            mib_of("rss_max_bytes"),
            mib_of("rss_end_bytes"),
        );
    }
}

fn main() {
    let workers: usize = env_or("SMG_BENCH_WORKERS", 2);
    let slots: usize = env_or("SMG_BENCH_WORKER_SLOTS", 4);
    let fleet = Fleet {
        workers,
        slots,
        tokens: env_or("SMG_BENCH_TOKENS", 10),
        queue: env_or("SMG_BENCH_QUEUE", (workers * slots / 4).max(1)),
    };
    let duration = Duration::from_secs(env_or("SMG_BENCH_SECS", 20));
    let capacity_for = Duration::from_secs(env_or("SMG_BENCH_CAPACITY_SECS", 10));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "overload: {} worker(s) × {} slots, {} tokens at 10 ms each per request, queue {}, {} s per row, load {:.2}",
        fleet.workers,
        fleet.slots,
        fleet.tokens,
        fleet.queue,
        duration.as_secs(),
        load_average().unwrap_or(f64::NAN)
    );
    let result = runtime.block_on(run(fleet, duration, capacity_for));
    print_table(&result);
    let _ = std::fs::create_dir_all("bench-results");
    let _ = std::fs::write(
        "bench-results/overload.json",
        serde_json::to_string_pretty(&result).unwrap_or_default(),
    );
}
