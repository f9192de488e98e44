//! Gateway-side latency of an EPD chat carrying one 1920x1080 JPEG, per
//! tensor lane (inline vs shm), through zero-delay sim workers.
//!
//! One encode, one prefill and one decode `smg-sim-worker` with
//! `--zero-delay`; for each lane a fresh `smg launch --epd-disaggregation`
//! with `--multimodal-tensor-transport inline|shm`. Each request asks for
//! one token, so its latency is the gateway's work (fetch, preprocess into
//! the lane, the Encode RPC carrying 25 MB inline or a shm name, the
//! prefill/decode legs) plus the sim workers' reading of the tensor. Closed
//! loop at concurrency 1 and 4. Prints a table and writes
//! `bench-results/lane_latency.json`.
//!
//! Run: `cargo bench --bench lane_latency` (optionally `SMG_BENCH_SECS=10`).
//! Not a test: nothing here asserts a speed.

#[path = "../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

mod common;

use std::time::Duration;

use common::{closed_loop, images_dir, percentile, photo_chat};
use serde_json::json;

#[derive(Debug, serde::Serialize)]
struct Row {
    lane: String,
    concurrency: usize,
    requests: usize,
    per_sec: f64,
    p50_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
}

async fn measure(lane: &str, url: String, duration: Duration) -> Vec<Row> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(16)
        .build()
        .expect("http client");
    let body = photo_chat();
    let post = {
        let (http, url, body) = (http.clone(), url.clone(), body.clone());
        move || {
            let (http, url, body) = (http.clone(), url.clone(), body.clone());
            async move {
                match http.post(&url).json(&body).send().await {
                    Ok(response) => {
                        response.status().is_success() && response.bytes().await.is_ok()
                    }
                    Err(_) => false,
                }
            }
        }
    };
    assert!(
        post().await,
        "an image request must succeed before measuring"
    );
    let _ = closed_loop(2, Duration::from_secs(1), post.clone()).await;
    let mut rows = Vec::new();
    for concurrency in [1, 4] {
        let (mut latencies, wall) = closed_loop(concurrency, duration, post.clone()).await;
        latencies.sort_by(f64::total_cmp);
        rows.push(Row {
            lane: lane.to_owned(),
            concurrency,
            requests: latencies.len(),
            per_sec: latencies.len() as f64 / wall.as_secs_f64(),
            p50_ms: percentile(&latencies, 0.5),
            p90_ms: percentile(&latencies, 0.9),
            p99_ms: percentile(&latencies, 0.99),
        });
    }
    rows
}

fn main() {
    let secs: u64 = std::env::var("SMG_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let duration = Duration::from_secs(secs);
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let zero = ["--zero-delay"];
    let encoder = support::SimWorker::start("tokenspeed", "encode", &zero);
    let prefill = support::SimWorker::start("tokenspeed", "prefill", &zero);
    let decode = support::SimWorker::start("tokenspeed", "decode", &zero);
    let images = images_dir().display().to_string();
    let (encode_url, encode_port) = (encoder.grpc_url(), encoder.bootstrap_port().to_string());
    let (prefill_url, prefill_port) = (prefill.grpc_url(), prefill.bootstrap_port().to_string());
    let decode_url = decode.grpc_url();
    let mut rows = Vec::new();
    for lane in ["inline", "shm"] {
        let gateway = support::Gateway::start(&[
            "--epd-disaggregation",
            "--encode",
            &encode_url,
            &encode_port,
            "--prefill",
            &prefill_url,
            &prefill_port,
            "--decode",
            &decode_url,
            "--served-model-name",
            "model",
            "--disable-health-check",
            "--allowed-local-media-path",
            &images,
            "--multimodal-tensor-transport",
            lane,
            "--dataplane-submit-timeout-ms",
            "60000",
        ]);
        let url = gateway.url("/v1/chat/completions");
        rows.extend(runtime.block_on(measure(lane, url, duration)));
    }
    println!("\n| lane | concurrency | requests | req/s | p50 ms | p90 ms | p99 ms |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} |",
            r.lane, r.concurrency, r.requests, r.per_sec, r.p50_ms, r.p90_ms, r.p99_ms
        );
    }
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench-results");
    if std::fs::create_dir_all(&out).is_ok() {
        let json = serde_json::to_string_pretty(&json!({"seconds": secs, "rows": rows}))
            .unwrap_or_default();
        let _ = std::fs::write(out.join("lane_latency.json"), json);
    }
}
