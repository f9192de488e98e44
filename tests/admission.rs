//! Admission control end to end: real `smg` and `smg-sim-worker` processes,
//! real HTTP. A streaming request that the worker keeps generating holds
//! the one slot of `--max-concurrent-requests 1`; what waits, in what
//! order, and what is refused (with which code and `Retry-After`) is
//! observed through responses and the gateway's `/metrics`, never timed.

mod support;

use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use support::{Gateway, SimWorker, bounded};

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("http client")
}

fn completion(max_tokens: u32, stream: bool) -> Value {
    json!({"model": "model", "prompt": "hello", "max_tokens": max_tokens, "stream": stream,
           "ignore_eos": true})
}

/// The value of a gauge on the gateway's `/metrics`, 0 while unset.
async fn gauge(gateway: &Gateway, name: &str) -> f64 {
    let text = http()
        .get(format!("http://{}/metrics", gateway.metrics))
        .send()
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Waits until `name` reads `value` on `/metrics`.
async fn until_gauge(gateway: &Gateway, name: &str, value: f64) {
    bounded(&format!("{name} reaching {value}"), async {
        while gauge(gateway, name).await != value {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// Starts a streaming completion and returns its body once the first
/// event arrived: the request is admitted and holds its slot until the
/// body is dropped.
async fn holding_stream(gateway: &Gateway) -> impl futures::Stream {
    let response = http()
        .post(gateway.url("/v1/completions"))
        .json(&completion(500, true))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), 200, "{:?}", response.text().await);
    let mut body = response.bytes_stream();
    let first = bounded("the first event", body.next()).await;
    assert!(first.is_some_and(|chunk| chunk.is_ok()));
    body
}

async fn status_of(gateway: &Gateway, body: Value) -> (u16, Option<String>, Value) {
    let response = http()
        .post(gateway.url("/v1/completions"))
        .json(&body)
        .send()
        .await
        .expect("sent");
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|value| value.to_str().expect("ascii").to_owned());
    let body = response.json().await.unwrap_or(Value::Null);
    (status, retry_after, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_fills_refuses_the_excess_and_drains_in_arrival_order() {
    // 20 ms per token: the holding stream runs for 10 s unless dropped.
    let worker = SimWorker::start("tokenspeed", "regular", &["--decode-ms-per-token", "20"]);
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--max-concurrent-requests",
        "1",
        "--queue-size",
        "2",
        "--queue-timeout-secs",
        "60",
    ]);
    let holder = holding_stream(&gateway).await;
    until_gauge(&gateway, "smg_admission_in_flight", 1.0).await;

    let first = tokio::spawn({
        let url = gateway.url("/v1/completions");
        async move { http().post(url).json(&completion(2, false)).send().await }
    });
    until_gauge(&gateway, "smg_admission_queue_depth", 1.0).await;
    let second = tokio::spawn({
        let url = gateway.url("/v1/completions");
        async move { http().post(url).json(&completion(2, false)).send().await }
    });
    until_gauge(&gateway, "smg_admission_queue_depth", 2.0).await;

    let (status, retry_after, body) = status_of(&gateway, completion(2, false)).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "queue_full");
    assert_eq!(retry_after.as_deref(), Some("1"));

    // The first queued request is admitted when the holder leaves; the
    // second only when the first has finished (one slot).
    drop(holder);
    let first = bounded("the first queued request", first)
        .await
        .expect("joined")
        .expect("answered");
    assert_eq!(first.status(), 200);
    let second = bounded("the second queued request", second)
        .await
        .expect("joined")
        .expect("answered");
    assert_eq!(second.status(), 200);
    until_gauge(&gateway, "smg_admission_in_flight", 0.0).await;
    assert_eq!(gauge(&gateway, "smg_admission_queue_depth").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_past_the_queue_timeout_is_refused_with_408_and_retry_after() {
    let worker = SimWorker::start("tokenspeed", "regular", &["--decode-ms-per-token", "20"]);
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--max-concurrent-requests",
        "1",
        "--queue-timeout-secs",
        "1",
    ]);
    let _holder = holding_stream(&gateway).await;
    let (status, retry_after, body) = status_of(&gateway, completion(2, false)).await;
    assert_eq!(status, 408, "{body}");
    assert_eq!(body["error"]["code"], "queue_timeout");
    assert!(retry_after.is_some());
    assert_eq!(gauge(&gateway, "smg_admission_queue_depth").await, 0.0);
}

#[tokio::test]
async fn requests_over_the_rate_are_refused_with_the_time_to_the_next_token() {
    let worker = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    // Two requests at once, then one per 100 s.
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--rate-limit-tokens-per-second",
        "0.01",
        "--rate-limit-burst",
        "2",
    ]);
    for _ in 0..2 {
        let (status, _, body) = status_of(&gateway, completion(2, false)).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, retry_after, body) = status_of(&gateway, completion(2, false)).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "rate_limited");
    let seconds: u64 = retry_after.expect("Retry-After").parse().expect("seconds");
    assert!((90..=100).contains(&seconds), "{seconds}");
}
