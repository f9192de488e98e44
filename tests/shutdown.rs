//! Graceful shutdown end to end: a real `smg launch` in front of simulated
//! workers, stopped with real signals.
//!
//! Events are ordered by what the processes show, never by sleeping: a
//! stream is in flight once its first SSE event arrived; the first signal
//! has been handled once `/readiness` (on the metrics listener, which stays
//! open through the drain) answers 503; the gateway is done once it has
//! exited. That a leg was aborted, not merely disconnected, is read from
//! the worker's `--abort-log`, which the worker writes before answering the
//! Abort, and the gateway waits for that answer before it exits.

mod support;

use std::time::Duration;

use futures::StreamExt;
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use support::media::{image_url, images_dir, messages};
use support::shm::ShmDir;
use support::{Gateway, SimWorker, bounded, poll_until};

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("http client")
}

/// A tensor large enough for the shm lane (over 64 KiB as bf16) that fits a
/// 256 KiB slot.
const MEDIUM: &str = "rgba_150x100.png";

/// A streamed chat asking for exactly `tokens` tokens.
fn streamed_chat(messages: Value, tokens: u32) -> Value {
    json!({
        "model": "model",
        "messages": messages,
        "stream": true,
        "max_tokens": tokens,
        "ignore_eos": true,
        "stream_options": {"include_usage": true},
    })
}

fn hello() -> Value {
    json!([{"role": "user", "content": "Hello, shutdown."}])
}

/// A response body being read.
type Body = std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>;

/// Sends `body` as request `id` and returns the response once its first SSE
/// bytes arrived: from then on the stream is in flight.
async fn start_stream(gateway: &Gateway, id: &str, body: &Value) -> (String, Body) {
    let response = http()
        .post(gateway.url("/v1/chat/completions"))
        .header("x-request-id", id)
        .json(body)
        .send()
        .await
        .expect("the gateway answers");
    assert_eq!(response.status(), 200, "{id}");
    let mut stream: Body = Box::pin(response.bytes_stream());
    let first = bounded("the first event", stream.next())
        .await
        .expect("a first chunk")
        .expect("bytes");
    (String::from_utf8_lossy(&first).into_owned(), stream)
}

/// Reads a stream to its end: its text, and whether it ended cleanly.
async fn read_to_end(mut text: String, mut stream: Body) -> (String, bool) {
    let clean = bounded("the stream ends", async {
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(bytes) => text.push_str(&String::from_utf8_lossy(&bytes)),
                Err(_) => return false,
            }
        }
        true
    })
    .await;
    (text, clean)
}

/// `GET /readiness` on the metrics listener.
async fn readiness(gateway: &Gateway) -> u16 {
    http()
        .get(format!("http://{}/readiness", gateway.metrics))
        .send()
        .await
        .expect("the metrics listener answers")
        .status()
        .as_u16()
}

/// Waits until the gateway has handled its first signal.
async fn wait_unready(gateway: &Gateway) {
    poll_until("readiness turns 503", async || {
        (readiness(gateway).await == 503).then_some(())
    })
    .await;
}

fn refused(addr: std::net::SocketAddr) -> bool {
    matches!(
        std::net::TcpStream::connect(addr),
        Err(err) if err.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

/// The `data:` payloads of an SSE text, `[DONE]` excluded.
fn events(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).expect("JSON events"))
        .collect()
}

#[tokio::test]
async fn sigterm_drains_fifty_streams_to_their_end_then_exits_zero() {
    const STREAMS: usize = 50;
    const TOKENS: u32 = 80;
    // ~20 ms a token: each stream runs for seconds after its first event.
    let worker = SimWorker::start("tokenspeed", "regular", &["--decode-ms-per-token", "20"]);
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("gateway.log");
    let mut gateway = Gateway::start_logged(
        &[
            "--worker-urls",
            &worker.grpc_url(),
            "--served-model-name",
            "model",
            "--shutdown-grace-period-secs",
            "120",
        ],
        "smg=info",
        &log,
    );
    assert_eq!(readiness(&gateway).await, 200);

    let body = streamed_chat(hello(), TOKENS);
    let ids: Vec<String> = (0..STREAMS).map(|i| format!("drain-{i}")).collect();
    let streams =
        futures::future::join_all(ids.iter().map(|id| start_stream(&gateway, id, &body))).await;
    // Every stream is in flight: it has its first event, not its last.
    for (first, _) in &streams {
        assert!(!first.contains("[DONE]"), "{first}");
    }

    gateway.signal(Signal::SIGTERM);
    wait_unready(&gateway).await;
    // Readiness turns only once the listeners are closed.
    assert!(refused(gateway.http), "the public listener still accepts");
    assert!(refused(gateway.admin), "the admin listener still accepts");

    for (i, (first, stream)) in streams.into_iter().enumerate() {
        let (text, clean) = read_to_end(first, stream).await;
        assert!(clean, "stream {i} was cut: {text}");
        assert!(text.ends_with("data: [DONE]\n\n"), "stream {i}: {text}");
        let events = events(&text);
        let finish: Vec<&Value> = events
            .iter()
            .filter_map(|e| e["choices"].get(0))
            .filter_map(|c| c.get("finish_reason"))
            .filter(|reason| !reason.is_null())
            .collect();
        assert_eq!(finish, [&json!("length")], "stream {i}");
        let usage = events
            .iter()
            .find_map(|e| e.get("usage").filter(|u| !u.is_null()))
            .expect("a usage event");
        assert_eq!(usage["completion_tokens"], TOKENS, "stream {i}");
    }

    let status = gateway.exited().await;
    assert_eq!(status.code(), Some(0), "{status:?}");
    let log = std::fs::read_to_string(&log).expect("the gateway's log");
    for phase in [
        "shutdown: draining",
        "shutdown: listeners closed, readiness answers 503",
        "shutdown: every request has finished",
        "shutdown: data plane stopped",
        "shutdown: tensor lanes released",
    ] {
        assert!(log.contains(phase), "no {phase:?} in the log:\n{log}");
    }
    assert!(!log.contains("grace period over"), "{log}");
}

/// A regular worker that stalls every stream after two tokens (until
/// aborted), reads images through `shm` and keeps their names (so the
/// gateway must remove them), and logs the Abort calls it gets.
fn stalling_worker(shm: &ShmDir, abort_log: &std::path::Path) -> SimWorker {
    let shm_arg = shm.arg();
    let abort_arg = abort_log.display().to_string();
    SimWorker::start(
        "tokenspeed",
        "regular",
        &[
            "--zero-delay",
            "--stall-after-tokens",
            "2",
            "--shm-dir",
            &shm_arg,
            "--keep-shm-names",
            "--abort-log",
            &abort_arg,
        ],
    )
}

/// A gateway sending image tensors through the shm lane in `shm`.
fn shm_gateway(
    worker: &SimWorker,
    shm: &ShmDir,
    grace_secs: &str,
    log: &std::path::Path,
) -> Gateway {
    let shm_arg = shm.arg();
    let images = images_dir().display().to_string();
    Gateway::start_logged(
        &[
            "--worker-urls",
            &worker.grpc_url(),
            "--served-model-name",
            "model",
            "--allowed-local-media-path",
            &images,
            "--multimodal-tensor-transport",
            "shm",
            "--multimodal-shm-dir",
            &shm_arg,
            "--multimodal-shm-slot-bytes",
            "262144",
            "--multimodal-shm-slots-per-core",
            "2",
            "--dataplane-cores",
            "1",
            "--disable-health-check",
            "--shutdown-grace-period-secs",
            grace_secs,
        ],
        "smg=info",
        log,
    )
}

/// Starts a stream with an image that never ends on its own, and checks the
/// gateway's shm names now include the one the worker kept.
async fn start_stalled_image_stream(gateway: &Gateway, shm: &ShmDir, id: &str) -> (String, Body) {
    let private = shm.names_of(gateway.pid());
    assert!(!private.is_empty(), "the pool's slots have names");
    let body = streamed_chat(messages(&[image_url(MEDIUM)]), 1000);
    let stream = start_stream(gateway, id, &body).await;
    let names = shm.names_of(gateway.pid());
    assert_eq!(
        names.len(),
        private.len() + 1,
        "the tensor's name, kept by the worker: {names:?}"
    );
    stream
}

#[tokio::test]
async fn a_stream_longer_than_the_grace_period_is_cut_and_its_leg_aborted() {
    let shm = ShmDir::in_dev_shm();
    let dir = tempfile::tempdir().expect("temp dir");
    let abort_log = dir.path().join("aborts");
    let log = dir.path().join("gateway.log");
    let worker = stalling_worker(&shm, &abort_log);
    let mut gateway = shm_gateway(&worker, &shm, "1", &log);
    let (first, stream) = start_stalled_image_stream(&gateway, &shm, "cut-at-deadline").await;

    gateway.signal(Signal::SIGTERM);
    let status = gateway.exited().await;
    assert_eq!(status.code(), Some(0), "{status:?}");

    let (text, clean) = read_to_end(first, stream).await;
    assert!(
        !clean && !text.contains("[DONE]"),
        "the stream was cut, not finished: {text}"
    );
    // The worker got the Abort while the request still ran, and answered
    // it before the gateway exited.
    let aborts = std::fs::read_to_string(&abort_log).expect("the worker logged an abort");
    let aborted: Vec<&str> = aborts.lines().collect();
    assert_eq!(aborted.len(), 1, "{aborts}");
    assert!(
        aborted[0].starts_with("cut-at-deadline-") && aborted[0].ends_with(" running"),
        "{aborts}"
    );
    assert_eq!(
        shm.names_of(gateway.pid()),
        Vec::<String>::new(),
        "the gateway left shm names behind"
    );
    let log = std::fs::read_to_string(&log).expect("the gateway's log");
    for phase in [
        "shutdown: draining",
        "shutdown: grace period over",
        "shutdown: engine aborts sent",
        "shutdown: tensor lanes released",
    ] {
        assert!(log.contains(phase), "no {phase:?} in the log:\n{log}");
    }
}

#[tokio::test]
async fn a_second_signal_stops_at_once_and_still_cleans_shm() {
    let shm = ShmDir::in_dev_shm();
    let dir = tempfile::tempdir().expect("temp dir");
    let abort_log = dir.path().join("aborts");
    let log = dir.path().join("gateway.log");
    let worker = stalling_worker(&shm, &abort_log);
    // A grace period the test would never outlive.
    let mut gateway = shm_gateway(&worker, &shm, "3600", &log);
    let (first, stream) = start_stalled_image_stream(&gateway, &shm, "stop-now").await;

    gateway.signal(Signal::SIGTERM);
    wait_unready(&gateway).await;
    gateway.signal(Signal::SIGINT);
    let status = gateway.exited().await;
    assert_eq!(status.code(), Some(0), "{status:?}");

    let (text, clean) = read_to_end(first, stream).await;
    assert!(!clean && !text.contains("[DONE]"), "{text}");
    assert_eq!(
        shm.names_of(gateway.pid()),
        Vec::<String>::new(),
        "the gateway left shm names behind"
    );
    let log = std::fs::read_to_string(&log).expect("the gateway's log");
    assert!(
        log.contains("shutdown: second signal; stopping now"),
        "{log}"
    );
    drop(worker);
}
