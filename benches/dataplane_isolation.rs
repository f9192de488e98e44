//! The isolation figure: text chat p99 while the data plane is saturated
//! with 1080p images, divided by text chat p99 alone (goal ≤ 1.3).
//!
//! A zero-delay TokenSpeed sim worker and `smg` in front of it. Text load:
//! non-streaming 8-token chats, closed loop. Image load: chats carrying a
//! 1920x1080 JPEG (`file://`, allow-listed), closed loop with enough in
//! flight that the data plane's job ring never runs dry. Three gateway
//! set-ups: the default split (`--dataplane-cores 1`: on two cores, tokio
//! keeps core 0 and the data plane owns core 1); the same with the shm lane
//! (the tensor reaches the worker as a `/dev/shm` name instead of inside
//! the gRPC frame); and the data plane sharing every core with tokio
//! (`--dataplane-cores` = all cores). The worker is
//! pinned to core 0 when there are two or more cores. Prints a table and
//! writes `bench-results/dataplane_isolation.json`.
//!
//! Run: `cargo bench --bench dataplane_isolation` (optionally
//! `SMG_BENCH_SECS=20`). Not a test: nothing here asserts a speed.

#[path = "../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{closed_loop, percentile, pin};
use serde_json::{Value, json};

const TEXT_CONCURRENCY: usize = 8;
const IMAGE_CONCURRENCY: usize = 4;

#[derive(Debug, serde::Serialize)]
struct Row {
    setup: String,
    phase: String,
    text_requests: usize,
    text_per_sec: f64,
    text_p50_ms: f64,
    text_p99_ms: f64,
    images_per_sec: f64,
    image_p50_ms: f64,
}

fn images_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("dataplane/tests/fixtures/images")
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

async fn measure(setup: &str, chat_url: String, duration: Duration) -> Vec<Row> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .expect("http client");
    let text = json!({"model": "model", "max_tokens": 8, "ignore_eos": true,
        "messages": [{"role": "user", "content": "How far is the moon?"}]});
    let photo = format!(
        "file://{}",
        images_dir().join("photo_1920x1080.jpg").display()
    );
    let image = json!({"model": "model", "max_tokens": 1, "ignore_eos": true,
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": photo}},
            {"type": "text", "text": "What is in the picture?"}]}]});
    let text_loop = {
        let (http, url, body) = (http.clone(), chat_url.clone(), text.clone());
        move || {
            let (http, url, body) = (http.clone(), url.clone(), body.clone());
            closed_loop(TEXT_CONCURRENCY, duration, move || {
                post_ok(http.clone(), url.clone(), body.clone())
            })
        }
    };
    // Warm-up: connections, the tokenizer's caches, one image end to end.
    let _ = closed_loop(TEXT_CONCURRENCY, Duration::from_secs(1), {
        let (http, url, body) = (http.clone(), chat_url.clone(), text.clone());
        move || post_ok(http.clone(), url.clone(), body.clone())
    })
    .await;
    assert!(
        post_ok(http.clone(), chat_url.clone(), image.clone()).await,
        "an image request must succeed before measuring"
    );

    let (alone, wall) = text_loop().await;
    let alone = sorted(alone);
    let mut rows = vec![Row {
        setup: setup.to_owned(),
        phase: "text alone".to_owned(),
        text_requests: alone.len(),
        text_per_sec: alone.len() as f64 / wall.as_secs_f64(),
        text_p50_ms: percentile(&alone, 0.5),
        text_p99_ms: percentile(&alone, 0.99),
        images_per_sec: 0.0,
        image_p50_ms: f64::NAN,
    }];

    let images = tokio::spawn({
        let (http, url, body) = (http.clone(), chat_url.clone(), image.clone());
        // A little longer than the text run so the data plane stays busy
        // for all of it.
        closed_loop(
            IMAGE_CONCURRENCY,
            duration + Duration::from_secs(1),
            move || post_ok(http.clone(), url.clone(), body.clone()),
        )
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (loaded, wall) = text_loop().await;
    let (image_latencies, image_wall) = images.await.expect("image load");
    let loaded = sorted(loaded);
    let image_latencies = sorted(image_latencies);
    rows.push(Row {
        setup: setup.to_owned(),
        phase: "text + 1080p images".to_owned(),
        text_requests: loaded.len(),
        text_per_sec: loaded.len() as f64 / wall.as_secs_f64(),
        text_p50_ms: percentile(&loaded, 0.5),
        text_p99_ms: percentile(&loaded, 0.99),
        images_per_sec: image_latencies.len() as f64 / image_wall.as_secs_f64(),
        image_p50_ms: percentile(&image_latencies, 0.5),
    });
    rows
}

fn main() {
    let secs: u64 = std::env::var("SMG_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let duration = Duration::from_secs(secs);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let worker = support::SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    if cores >= 2 {
        pin(worker.pid(), 0);
    }
    let images = images_dir().display().to_string();
    let all_cores = cores.to_string();
    let mut rows = Vec::new();
    for (setup, dataplane_cores, transport) in [
        ("data plane on its own core (default)", "1", "inline"),
        ("data plane on its own core, shm lane", "1", "shm"),
        ("data plane sharing all cores", all_cores.as_str(), "inline"),
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
        let url = gateway.url("/v1/chat/completions");
        rows.extend(runtime.block_on(measure(setup, url, duration)));
    }

    println!(
        "\n| setup | phase | text req/s | text p50 ms | text p99 ms | images/s | image p50 ms |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {:.0} | {:.2} | {:.2} | {:.1} | {:.0} |",
            r.setup,
            r.phase,
            r.text_per_sec,
            r.text_p50_ms,
            r.text_p99_ms,
            r.images_per_sec,
            r.image_p50_ms
        );
    }
    for pair in rows.chunks(2) {
        if let [alone, loaded] = pair {
            println!(
                "{}: text p99 with images / alone = {:.2} (goal <= 1.3)",
                alone.setup,
                loaded.text_p99_ms / alone.text_p99_ms
            );
        }
    }
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench-results");
    if std::fs::create_dir_all(&out).is_ok() {
        let json =
            serde_json::to_string_pretty(&json!({"cores": cores, "seconds": secs, "rows": rows}))
                .unwrap_or_default();
        let _ = std::fs::write(out.join("dataplane_isolation.json"), json);
    }
}
