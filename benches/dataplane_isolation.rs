//! The isolation figure: text chat p99 while the data plane is saturated
//! with 1080p images, divided by text chat p99 alone (goal ≤ 1.3).
//!
//! A zero-delay TokenSpeed sim worker and `smg` in front of it. Text load:
//! non-streaming 8-token chats, open loop (seeded Poisson arrivals at
//! `SMG_BENCH_TEXT_RATE`, default 300/s; latency from each request's send),
//! so the figure compares service latency rather than how a saturated
//! core 0 splits its time. `SMG_BENCH_ROUNDS` (default 3) alternating rounds
//! of text alone and text under image load, `SMG_BENCH_SECS` (default 8)
//! each; percentiles pool every round, and each round's ratio is printed
//! too. Image load: chats carrying a 1920x1080 JPEG (`file://`,
//! allow-listed), closed loop with enough in flight that the data plane's
//! job ring never runs dry (the table's data-plane CPU column shows how busy
//! its threads were).
//!
//! Four gateway set-ups, each differing from the previous in one thing: the
//! default split (`--dataplane-cores 1`: on two cores, tokio keeps core 0
//! and the data plane owns core 1) with the inline lane (the 25 MB tensor
//! inside the gRPC frame); the same with the shm lane (a `/dev/shm` name on
//! the wire; what `auto` picks for a same-host worker); the same with a
//! worker that checks each tensor's size but neither reads nor digests its
//! bytes (`--skip-tensor-bytes`: on a machine too small to give the worker
//! cores of its own, this separates the gateway's share from the worker's);
//! and that with the data plane sharing every core with tokio
//! (`--dataplane-cores` = all cores). The worker and this load generator
//! are pinned to core 0 when there are two or more cores, so core 1 belongs
//! to the data plane alone in the split set-ups. Prints a table and writes
//! `bench-results/dataplane_isolation.json`.
//!
//! Run: `cargo bench --bench dataplane_isolation`. Not a test: nothing here
//! asserts a speed.

#[path = "../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

mod common;

use std::time::Duration;

use common::{
    closed_loop, images_dir, load_average, open_loop, percentile, photo_chat, pin,
    set_thread_cores, threads_cpu_seconds,
};
use serde_json::{Value, json};

const IMAGE_CONCURRENCY: usize = 4;
/// Text chats per second when `SMG_BENCH_TEXT_RATE` is unset. On a two-core
/// machine core 0 carries the gateway's tokio, the worker and this load
/// generator: 300/s keeps it well below saturation, so text latency is
/// service time, not queueing behind a full core.
const DEFAULT_TEXT_RATE: f64 = 300.0;

/// One set-up's result: text latencies pooled over every round.
#[derive(Debug, serde::Serialize)]
struct Row {
    setup: String,
    phase: String,
    rounds: usize,
    text_offered_per_sec: f64,
    text_requests: usize,
    text_failures: usize,
    text_p50_ms: f64,
    text_p99_ms: f64,
    text_p999_ms: f64,
    images_per_sec: f64,
    image_p50_ms: f64,
    /// Data-plane threads' CPU seconds per wall second during text runs.
    dataplane_busy: f64,
    /// Each round's text p99 (ms).
    round_p99_ms: Vec<f64>,
}

async fn post_ok(http: reqwest::Client, url: String, body: Value) -> bool {
    match http.post(&url).json(&body).send().await {
        Ok(response) => {
            let ok = response.status().is_success();
            ok && response.bytes().await.is_ok()
        }
        Err(_) => false,
    }
}

fn sorted(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_by(f64::total_cmp);
    values
}

/// What one phase (text alone, or text under image load) gathered.
#[derive(Default)]
struct Phase {
    text: Vec<f64>,
    failures: usize,
    round_p99: Vec<f64>,
    dataplane_cpu: f64,
    text_wall: f64,
    images: Vec<f64>,
    image_wall: f64,
}

impl Phase {
    fn row(self, setup: &str, phase: &str, text_rate: f64) -> Row {
        let text = sorted(self.text);
        let images = sorted(self.images);
        Row {
            setup: setup.to_owned(),
            phase: phase.to_owned(),
            rounds: self.round_p99.len(),
            text_offered_per_sec: text_rate,
            text_requests: text.len(),
            text_failures: self.failures,
            text_p50_ms: percentile(&text, 0.5),
            text_p99_ms: percentile(&text, 0.99),
            text_p999_ms: percentile(&text, 0.999),
            images_per_sec: if self.image_wall > 0.0 {
                images.len() as f64 / self.image_wall
            } else {
                0.0
            },
            image_p50_ms: percentile(&images, 0.5),
            dataplane_busy: self.dataplane_cpu / self.text_wall,
            round_p99_ms: self.round_p99,
        }
    }
}

struct Load {
    chat_url: String,
    gateway_pid: u32,
    duration: Duration,
    text_rate: f64,
    http: reqwest::Client,
    text: Value,
}

impl Load {
    fn dataplane_cpu(&self) -> f64 {
        threads_cpu_seconds(self.gateway_pid, "smg-dp").unwrap_or(f64::NAN)
    }

    /// One open-loop text run, added to `phase`.
    async fn text_run(&self, round: u64, phase: &mut Phase) {
        let cpu_before = self.dataplane_cpu();
        let began = std::time::Instant::now();
        let (latencies, failures) = open_loop(self.text_rate, self.duration, round, {
            let (http, url, body) = (self.http.clone(), self.chat_url.clone(), self.text.clone());
            move || post_ok(http.clone(), url.clone(), body.clone())
        })
        .await;
        phase.text_wall += began.elapsed().as_secs_f64();
        phase.dataplane_cpu += self.dataplane_cpu() - cpu_before;
        phase
            .round_p99
            .push(percentile(&sorted(latencies.clone()), 0.99));
        phase.text.extend(latencies);
        phase.failures += failures;
    }
}

/// Alternating rounds of text alone and text under image load, so a slow
/// stretch of the machine hits both phases alike.
async fn measure(load: Load, rounds: u64) -> (Phase, Phase) {
    let image = photo_chat();
    // Warm-up: connections, the tokenizer's caches, one image end to end.
    let _ = closed_loop(8, Duration::from_secs(1), {
        let (http, url, body) = (load.http.clone(), load.chat_url.clone(), load.text.clone());
        move || post_ok(http.clone(), url.clone(), body.clone())
    })
    .await;
    assert!(
        post_ok(load.http.clone(), load.chat_url.clone(), image.clone()).await,
        "an image request must succeed before measuring"
    );
    let (mut alone, mut loaded) = (Phase::default(), Phase::default());
    for round in 0..rounds {
        load.text_run(round, &mut alone).await;
        let images = tokio::spawn({
            let (http, url, body) = (load.http.clone(), load.chat_url.clone(), image.clone());
            // Longer than the text run so the data plane is busy for all of it.
            closed_loop(
                IMAGE_CONCURRENCY,
                load.duration + Duration::from_secs(1),
                move || post_ok(http.clone(), url.clone(), body.clone()),
            )
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        load.text_run(round, &mut loaded).await;
        let (latencies, wall) = images.await.expect("image load");
        loaded.images.extend(latencies);
        loaded.image_wall += wall.as_secs_f64();
    }
    (alone, loaded)
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let secs: u64 = env_or("SMG_BENCH_SECS", 8);
    let rounds: u64 = env_or("SMG_BENCH_ROUNDS", 3);
    let text_rate: f64 = env_or("SMG_BENCH_TEXT_RATE", DEFAULT_TEXT_RATE);
    let duration = Duration::from_secs(secs);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // The load generator runs on core 0 only: pinned before the runtime
    // exists so its threads inherit the mask; the main thread widens its
    // mask again whenever it starts a process (see `set_thread_cores`).
    let load_cores: Option<&[usize]> = (cores >= 2).then_some(&[0]);
    set_thread_cores(load_cores);
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    set_thread_cores(None);
    let start_worker = |extra: &[&str]| {
        let mut args = vec!["--zero-delay"];
        args.extend_from_slice(extra);
        let worker = support::SimWorker::start("tokenspeed", "regular", &args);
        if cores >= 2 {
            pin(worker.pid(), 0);
        }
        worker
    };
    let digesting = start_worker(&[]);
    let size_only = start_worker(&["--skip-tensor-bytes"]);
    let images = images_dir().display().to_string();
    let all_cores = cores.to_string();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()
        .expect("http client");
    let text = json!({"model": "model", "max_tokens": 8, "ignore_eos": true,
        "messages": [{"role": "user", "content": "How far is the moon?"}]});
    let mut rows = Vec::new();
    // Each set-up differs from the one before it in one thing: the lane, the
    // worker's reading, then the data plane's pinning.
    for (setup, dataplane_cores, transport, worker) in [
        ("own core, inline lane", "1", "inline", &digesting),
        ("own core, shm lane", "1", "shm", &digesting),
        (
            "own core, shm lane, worker skips tensor bytes",
            "1",
            "shm",
            &size_only,
        ),
        (
            "sharing all cores, shm lane, worker skips tensor bytes",
            all_cores.as_str(),
            "shm",
            &size_only,
        ),
    ] {
        let gateway = support::Gateway::start(&[
            "--worker-urls",
            &worker.grpc_url(),
            "--served-model-name",
            "model",
            "--disable-health-check",
            "--policy",
            "round_robin",
            "--allowed-local-media-path",
            &images,
            "--dataplane-cores",
            dataplane_cores,
            "--dataplane-submit-timeout-ms",
            "60000",
            "--multimodal-tensor-transport",
            transport,
        ]);
        let load = Load {
            chat_url: gateway.url("/v1/chat/completions"),
            gateway_pid: gateway.pid(),
            duration,
            text_rate,
            http: http.clone(),
            text: text.clone(),
        };
        set_thread_cores(load_cores);
        let (alone, loaded) = runtime.block_on(measure(load, rounds));
        set_thread_cores(None);
        rows.push(alone.row(setup, "text alone", text_rate));
        rows.push(loaded.row(setup, "text + 1080p images", text_rate));
    }

    println!(
        "\n{rounds} alternating rounds of {secs} s per phase; text {text_rate:.0} chats/s, open loop"
    );
    println!(
        "\n| setup | phase | text requests | failed | text p50 ms | text p99 ms | text p99.9 ms | p99 per round ms | images/s | image p50 ms | data-plane CPU |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|");
    for r in &rows {
        let per_round: Vec<String> = r.round_p99_ms.iter().map(|p| format!("{p:.2}")).collect();
        println!(
            "| {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {} | {:.1} | {:.0} | {:.2} |",
            r.setup,
            r.phase,
            r.text_requests,
            r.text_failures,
            r.text_p50_ms,
            r.text_p99_ms,
            r.text_p999_ms,
            per_round.join(" / "),
            r.images_per_sec,
            r.image_p50_ms,
            r.dataplane_busy
        );
    }
    if let Some(load) = load_average() {
        println!("load average (1 min) after the run: {load:.2}");
    }
    for pair in rows.chunks(2) {
        if let [alone, loaded] = pair {
            let per_round: Vec<String> = alone
                .round_p99_ms
                .iter()
                .zip(&loaded.round_p99_ms)
                .map(|(a, l)| format!("{:.2}", l / a))
                .collect();
            println!(
                "{}: text p99 with images / alone = {:.2} pooled, per round {} (goal <= 1.3)",
                alone.setup,
                loaded.text_p99_ms / alone.text_p99_ms,
                per_round.join(" / ")
            );
        }
    }
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench-results");
    if std::fs::create_dir_all(&out).is_ok() {
        let json = serde_json::to_string_pretty(&json!({"cores": cores, "seconds": secs,
            "rounds": rounds, "text_rate": text_rate, "rows": rows}))
        .unwrap_or_default();
        let _ = std::fs::write(out.join("dataplane_isolation.json"), json);
    }
}
