//! Issue 15's soak: an open loop at 70% of the fleet's measured capacity
//! for ten minutes while the workers' HTTP/2 connections end with a GOAWAY
//! every 5 s and one worker is killed and restarted on the same port every
//! minute. Reports the answers by status and code, the failed requests
//! (anything but 200; the goal is none) with the second each was sent at,
//! p50/p99, and the gateway's resident memory sampled every second: at the
//! start, its highest, at the end, and its slope over the second half (the
//! goal: flat).
//!
//! Why it exists: the overload tests prove each fault on its own within a
//! few seconds; only a long run shows that the faults together, repeated
//! a hundred times, fail no request and leak nothing (a connection, a
//! waiter, a breaker state or a buffer per GOAWAY or restart would show as
//! a slope).
//!
//! The fleet: `SMG_BENCH_WORKERS` (default 2) sim workers, each running at
//! most `SMG_BENCH_WORKER_SLOTS` (default 4) requests at once at 10 ms per
//! token (no extra cost per running request), every request asking for
//! `SMG_BENCH_TOKENS` (default 10) tokens with `ignore_eos`: about 100 ms
//! of worker time each, so the capacity is the workers' and not the
//! machine's. Each worker ends every HTTP/2 connection 5 s after accepting
//! it (`--goaway-every-ms 5000`, a graceful GOAWAY) and advertises its
//! `max_running_requests`, which the gateway takes as its in-flight limit.
//! The gateway runs with its defaults (no admission limit, retries on).
//! Capacity (requests/s) is measured first with a closed loop at the
//! fleet's concurrency for `SMG_BENCH_CAPACITY_SECS` (default 10). Then
//! Poisson arrivals (seeded) at 0.7x of it for `SMG_BENCH_SECS` (default
//! 600), each request its own task on a pooled HTTP/1.1 client; every
//! `SMG_BENCH_RESTART_SECS` (default 60) the next worker in turn is killed
//! (SIGKILL) and started again on its port. Latency is timed from the
//! moment a request's task starts sending it. RSS is `VmRSS` from
//! `/proc/PID/status`; the slope is a least-squares fit over the samples of
//! the second half, in MiB per minute.
//!
//! Run: `cargo bench --profile dev --bench soak` (the dev profile builds
//! much faster and is what BENCHMARKS.md records; `SMG_BENCH_SECS=60` for
//! a quick look). Prints a table and writes `bench-results/soak.json`. Not
//! a test: nothing here asserts a speed, a count or a size.

// The e2e harness (process start-up, ports, the fixtures); its digest unit
// tests are not run here, so their imports look unused in this target.
#[path = "../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{
    classified_chat, closed_loop, env_or, load_average, mib, open_loop_client, percentile,
    proc_status_bytes,
};
use serde_json::{Value, json};
use support::{Gateway, SimWorker};

/// The fleet and the faults it plays.
#[derive(Debug, Clone, Copy)]
struct Fleet {
    workers: usize,
    /// Requests each worker runs at once (`--max-running-requests`).
    slots: usize,
    /// Tokens per request, one decode step (10 ms) each.
    tokens: u32,
    /// Each worker connection ends (graceful GOAWAY) this long after it
    /// was accepted.
    goaway_every: Duration,
    /// A worker is killed and restarted this often.
    restart_every: Duration,
}

impl Fleet {
    fn concurrency(&self) -> usize {
        self.workers * self.slots
    }

    fn worker_args(&self, port: Option<u16>) -> Vec<String> {
        let mut args: Vec<String> = [
            "--decode-ms-per-token",
            "10",
            "--decode-ms-per-running-request",
            "0",
        ]
        .map(str::to_owned)
        .to_vec();
        args.extend([
            "--max-running-requests".to_owned(),
            self.slots.to_string(),
            "--goaway-every-ms".to_owned(),
            self.goaway_every.as_millis().to_string(),
        ]);
        if let Some(port) = port {
            args.extend(["--port".to_owned(), port.to_string()]);
        }
        args
    }

    fn start_worker(&self, port: Option<u16>) -> SimWorker {
        let args = self.worker_args(port);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        SimWorker::start("tokenspeed", "regular", &args)
    }
}

fn chat_body(tokens: u32) -> Value {
    json!({
        "model": "model",
        "messages": [{"role": "user", "content": "Hello, soak."}],
        "max_tokens": tokens,
        "ignore_eos": true,
    })
}

/// The sum of the gateway's `metric` samples whose labels contain every
/// one of `labels`.
async fn metric_sum(gateway: &Gateway, metric: &str, labels: &[&str]) -> f64 {
    let text = match reqwest::get(format!("http://{}/metrics", gateway.metrics)).await {
        Ok(response) => response.text().await.unwrap_or_default(),
        Err(_) => return f64::NAN,
    };
    text.lines()
        .filter(|line| {
            line.strip_prefix(metric)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
        })
        .filter(|line| labels.iter().all(|label| line.contains(label)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Least-squares slope of `(seconds, bytes)` samples, in MiB per minute.
fn slope_mib_per_min(samples: &[(f64, u64)]) -> f64 {
    let n = samples.len() as f64;
    if samples.len() < 2 {
        return f64::NAN;
    }
    let mean_t = samples.iter().map(|(t, _)| t).sum::<f64>() / n;
    let mean_m = samples.iter().map(|(_, b)| mib(*b)).sum::<f64>() / n;
    let (mut covariance, mut variance) = (0.0, 0.0);
    for (t, bytes) in samples {
        covariance += (t - mean_t) * (mib(*bytes) - mean_m);
        variance += (t - mean_t) * (t - mean_t);
    }
    covariance / variance * 60.0
}

/// Kills and restarts the workers in turn every `fleet.restart_every`
/// until `until`; returns each restart's second and how long the worker
/// was down (kill to ready line).
async fn restart_in_turn(
    mut sims: Vec<SimWorker>,
    fleet: Fleet,
    start: Instant,
    until: Duration,
) -> (Vec<SimWorker>, Vec<Value>) {
    let mut restarts = Vec::new();
    let mut next = fleet.restart_every;
    let mut turn = 0;
    while next < until {
        tokio::time::sleep_until((start + next).into()).await;
        let index = turn % sims.len();
        let port = sims[index].grpc.port();
        let killed_at = start.elapsed();
        sims[index].kill();
        // Starting it blocks (it waits for the ready line): off the
        // runtime's threads.
        let restarted = tokio::task::spawn_blocking(move || fleet.start_worker(Some(port)))
            .await
            .expect("the worker restarts");
        let down = start.elapsed() - killed_at;
        sims[index] = restarted;
        println!(
            "  {:.0} s: worker {index} (port {port}) killed and back after {:.0} ms",
            killed_at.as_secs_f64(),
            down.as_secs_f64() * 1000.0
        );
        restarts.push(json!({
            "at_s": killed_at.as_secs_f64(),
            "worker": index,
            "port": port,
            "down_ms": down.as_secs_f64() * 1000.0,
        }));
        turn += 1;
        next += fleet.restart_every;
    }
    (sims, restarts)
}

async fn run(fleet: Fleet, duration: Duration, capacity_for: Duration) -> Value {
    let sims: Vec<SimWorker> = (0..fleet.workers)
        .map(|_| fleet.start_worker(None))
        .collect();
    let urls: Vec<String> = sims.iter().map(SimWorker::grpc_url).collect();
    let mut args = vec!["--worker-urls"];
    args.extend(urls.iter().map(String::as_str));
    args.extend(["--served-model-name", "model"]);
    let gateway = Gateway::start(&args);
    let pid = gateway.pid();
    let (client, url, body) = (
        open_loop_client(),
        Arc::new(gateway.url("/v1/chat/completions")),
        Arc::new(chat_body(fleet.tokens)),
    );

    // Capacity: a closed loop at the fleet's concurrency.
    let (mut latencies, elapsed) = {
        let (client, url, body) = (client.clone(), Arc::clone(&url), Arc::clone(&body));
        closed_loop(fleet.concurrency(), capacity_for, move || {
            let (client, url, body) = (client.clone(), Arc::clone(&url), Arc::clone(&body));
            async move { classified_chat(&client, &url, &body).await.0 == "200" }
        })
        .await
    };
    latencies.sort_by(f64::total_cmp);
    let capacity = latencies.len() as f64 / elapsed.as_secs_f64();
    let rate = capacity * 0.7;
    println!(
        "capacity: {capacity:.1} requests/s at {} in flight (closed loop, {} s), p50 {:.0} ms; \
         soaking at {rate:.1}/s for {} s",
        fleet.concurrency(),
        capacity_for.as_secs(),
        percentile(&latencies, 0.5),
        duration.as_secs()
    );

    let connects_before = metric_sum(
        &gateway,
        "smg_worker_connects_total",
        &["outcome=\"connected\""],
    )
    .await;
    let start = Instant::now();
    let rss: Arc<Mutex<Vec<(f64, u64)>>> = Arc::default();
    let sampler = {
        let rss = Arc::clone(&rss);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(Duration::from_secs(1));
            loop {
                ticker.tick().await;
                if let Some(bytes) = proc_status_bytes(pid, "VmRSS:") {
                    rss.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push((start.elapsed().as_secs_f64(), bytes));
                }
            }
        })
    };
    let restarter = tokio::spawn(restart_in_turn(sims, fleet, start, duration));

    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(15);
    let mut scheduled = tokio::time::Instant::from_std(start);
    let mut tasks = Vec::new();
    loop {
        // Exponential inter-arrival times: -ln(U) / rate, U in (0, 1].
        let uniform: f64 = 1.0 - rng.random::<f64>();
        scheduled += Duration::from_secs_f64(-uniform.ln() / rate);
        if scheduled.duration_since(start.into()) >= duration {
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
    let mut answers: BTreeMap<String, usize> = BTreeMap::new();
    let (mut served, mut all) = (Vec::new(), Vec::new());
    let mut failed = Vec::new();
    for task in tasks {
        let (answer, ms, at) = task
            .await
            .unwrap_or_else(|_| ("client task panicked".to_owned(), f64::NAN, f64::NAN));
        all.push(ms);
        if answer == "200" {
            served.push(ms);
        } else {
            failed.push(json!({"sent_at_s": at, "ms": ms, "answer": answer}));
        }
        *answers.entry(answer).or_default() += 1;
    }
    let drained = start.elapsed();
    let (_sims, restarts) = restarter.await.expect("the restarts");
    sampler.abort();
    let rss_end = proc_status_bytes(pid, "VmRSS:").unwrap_or(0);
    let samples = rss
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let half = duration.as_secs_f64() / 2.0;
    let second_half: Vec<(f64, u64)> = samples
        .iter()
        .copied()
        .filter(|(t, _)| *t >= half)
        .collect();
    let rss_start = samples.first().map_or(0, |(_, bytes)| *bytes);
    let rss_max = samples.iter().map(|(_, bytes)| *bytes).max().unwrap_or(0);
    served.sort_by(f64::total_cmp);
    all.sort_by(f64::total_cmp);
    let connects = metric_sum(
        &gateway,
        "smg_worker_connects_total",
        &["outcome=\"connected\""],
    )
    .await
        - connects_before;
    // `+ 0.0`: an empty sum is -0.0.
    let circuits_opened = metric_sum(
        &gateway,
        "smg_worker_cb_transitions_total",
        &["to=\"open\""],
    )
    .await
        + 0.0;
    json!({
        "workers": fleet.workers,
        "slots_per_worker": fleet.slots,
        "tokens_per_request": fleet.tokens,
        "decode_ms_per_token": 10,
        "goaway_every_ms": fleet.goaway_every.as_millis() as u64,
        "restart_every_s": fleet.restart_every.as_secs(),
        "capacity_per_sec": capacity,
        "offered_per_sec": rate,
        "seconds": duration.as_secs_f64(),
        "sent": sent,
        "sent_per_sec": sent as f64 / sending.as_secs_f64(),
        "seconds_until_last_answer": drained.as_secs_f64(),
        "answers": answers,
        "failed": failed.len(),
        "failures": failed,
        "p50_ms": percentile(&served, 0.50),
        "p99_ms": percentile(&served, 0.99),
        "max_ms": served.last().copied().unwrap_or(f64::NAN),
        "all_p99_ms": percentile(&all, 0.99),
        "restarts": restarts,
        "worker_connections_opened": connects,
        "circuits_opened": circuits_opened,
        "rss_start_bytes": rss_start,
        "rss_max_bytes": rss_max,
        "rss_end_bytes": rss_end,
        "rss_second_half_slope_mib_per_min": slope_mib_per_min(&second_half),
        "rss_samples": samples.iter().map(|(t, bytes)| json!([t, bytes])).collect::<Vec<_>>(),
        "load_average": load_average(),
    })
}

fn print_table(result: &Value) {
    let number = |key: &str| result[key].as_f64().unwrap_or(f64::NAN);
    let mib_of = |key: &str| mib(result[key].as_u64().unwrap_or(0));
    let answers = result["answers"]
        .as_object()
        .map(|answers| {
            answers
                .iter()
                .map(|(answer, count)| format!("{answer} × {count}"))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    println!();
    println!(
        "| duration | offered (0.7x capacity) | sent | answers | failed | p50 | p99 | restarts | worker connections opened | circuits opened | RSS start | max | end | RSS slope, 2nd half |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {:.0} s | {:.1}/s (of {:.1}/s) | {} | {answers} | {} | {:.0} ms | {:.0} ms | {} | {:.0} | {:.0} | {:.0} MiB | {:.0} MiB | {:.0} MiB | {:+.3} MiB/min |",
        number("seconds"),
        number("offered_per_sec"),
        number("capacity_per_sec"),
        result["sent"],
        result["failed"],
        number("p50_ms"),
        number("p99_ms"),
        result["restarts"].as_array().map_or(0, Vec::len),
        number("worker_connections_opened"),
        number("circuits_opened"),
        mib_of("rss_start_bytes"),
        mib_of("rss_max_bytes"),
        mib_of("rss_end_bytes"),
        number("rss_second_half_slope_mib_per_min"),
    );
    for failure in result["failures"].as_array().into_iter().flatten().take(20) {
        println!(
            "  failed: {} sent at {:.2} s after {:.0} ms",
            failure["answer"].as_str().unwrap_or_default(),
            failure["sent_at_s"].as_f64().unwrap_or(f64::NAN),
            failure["ms"].as_f64().unwrap_or(f64::NAN)
        );
    }
}

fn main() {
    let fleet = Fleet {
        workers: env_or("SMG_BENCH_WORKERS", 2),
        slots: env_or("SMG_BENCH_WORKER_SLOTS", 4),
        tokens: env_or("SMG_BENCH_TOKENS", 10),
        goaway_every: Duration::from_millis(5000),
        restart_every: Duration::from_secs(env_or("SMG_BENCH_RESTART_SECS", 60)),
    };
    let duration = Duration::from_secs(env_or("SMG_BENCH_SECS", 600));
    let capacity_for = Duration::from_secs(env_or("SMG_BENCH_CAPACITY_SECS", 10));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "soak: {} worker(s) × {} slots, {} tokens at 10 ms each per request, GOAWAY every {} ms, \
         a restart every {} s, {} s; load {:.2}",
        fleet.workers,
        fleet.slots,
        fleet.tokens,
        fleet.goaway_every.as_millis(),
        fleet.restart_every.as_secs(),
        duration.as_secs(),
        load_average().unwrap_or(f64::NAN)
    );
    let result = runtime.block_on(run(fleet, duration, capacity_for));
    print_table(&result);
    let _ = std::fs::create_dir_all("bench-results");
    let _ = std::fs::write(
        "bench-results/soak.json",
        serde_json::to_string_pretty(&result).unwrap_or_default(),
    );
}
