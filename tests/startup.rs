//! Start-up order: the gateway starts before its workers (systemd and
//! Kubernetes start them together), serves `/readiness` 503 until one
//! worker of each role it needs has answered, then serves; a worker that
//! answers later joins; a fleet that never comes up stops the gateway
//! after `--worker-startup-timeout-secs`, naming what it waited for.

mod support;

use serde_json::{Value, json};
use support::{Gateway, SimWorker, model_dir, poll_until};

const ZERO: &[&str] = &["--zero-delay"];

/// A loopback port nothing listens on (yet): a worker started later takes
/// it.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free port")
}

/// `/readiness` on the metrics listener (where probes go): its status and
/// body.
async fn readiness(gateway: &Gateway) -> (u16, Value) {
    let response = reqwest::get(format!("http://{}/readiness", gateway.metrics))
        .await
        .expect("readiness answers");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON"))
}

async fn chat(gateway: &Gateway) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(gateway.url("/v1/chat/completions"))
        .json(&json!({
            "model": "model",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4
        }))
        .send()
        .await
        .expect("answered");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON"))
}

#[tokio::test]
async fn the_gateway_serves_before_its_worker_and_is_ready_once_it_answers() {
    let port = free_port();
    let url = format!("grpc://127.0.0.1:{port}");
    let gateway = Gateway::start_listening(
        Some(&model_dir()),
        &[
            "--worker-urls",
            &url,
            "--served-model-name",
            "model",
            "--worker-startup-check-interval",
            "1",
        ],
        None,
    );
    let (status, body) = readiness(&gateway).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["status"], "starting", "{body}");
    assert_eq!(
        body["workers"]["regular"],
        json!({"reached": 0, "total": 1})
    );
    assert_eq!(body["waiting_for"][0]["url"], url.as_str(), "{body}");
    let (status, body) = chat(&gateway).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "model_not_ready", "{body}");

    let port_text = port.to_string();
    let _worker = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--zero-delay", "--port", &port_text],
    );
    let body = poll_until("readiness turns 200", async || {
        let (status, body) = readiness(&gateway).await;
        (status == 200).then_some(body)
    })
    .await;
    assert_eq!(body["status"], "ready", "{body}");
    assert!(
        gateway
            .ready_line()
            .is_some_and(|line| line.contains("mode=grpc")),
        "the ready line follows"
    );
    let (status, body) = chat(&gateway).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["choices"][0]["message"]["content"]
            .as_str()
            .is_some_and(|text| text.starts_with("digest=")),
        "{body}"
    );
}

#[tokio::test]
async fn smgs_dedicated_probe_port_answers_the_probes_too() {
    let worker = SimWorker::start("tokenspeed", "regular", ZERO);
    let probe_port = free_port();
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--health-check-port",
        &probe_port.to_string(),
    ]);
    for path in ["/readiness", "/liveness", "/health"] {
        let response = reqwest::get(format!("http://127.0.0.1:{probe_port}{path}"))
            .await
            .expect("the probe port answers");
        assert_eq!(response.status(), 200, "{path}");
    }
    drop(gateway);
}

#[tokio::test]
async fn pd_is_not_ready_until_its_decode_worker_has_answered_runtime_given_or_not() {
    for runtime in [None, Some("tokenspeed")] {
        let prefill = SimWorker::start("tokenspeed", "prefill", ZERO);
        let decode_port = free_port();
        let decode_url = format!("grpc://127.0.0.1:{decode_port}");
        let prefill_url = prefill.grpc_url();
        let mut args = vec![
            "--pd-disaggregation",
            "--prefill",
            &prefill_url,
            "none",
            "--decode",
            &decode_url,
            "--served-model-name",
            "model",
            "--worker-startup-check-interval",
            "1",
        ];
        if let Some(runtime) = runtime {
            args.extend(["--runtime", runtime]);
        }
        let gateway = Gateway::start_listening(Some(&model_dir()), &args, None);
        // The prefill worker answers; readiness stays 503 for decode.
        let body = poll_until("the prefill worker is reached", async || {
            let (status, body) = readiness(&gateway).await;
            assert_eq!(
                status, 503,
                "{runtime:?}: never ready without decode: {body}"
            );
            (body["workers"]["prefill"]["reached"] == 1).then_some(body)
        })
        .await;
        assert_eq!(
            body["workers"]["decode"],
            json!({"reached": 0, "total": 1}),
            "{body}"
        );
        assert_eq!(body["waiting_for"][0]["role"], "decode", "{body}");

        let decode_port = decode_port.to_string();
        let _decode = SimWorker::start(
            "tokenspeed",
            "decode",
            &["--zero-delay", "--port", &decode_port],
        );
        poll_until("readiness turns 200", async || {
            (readiness(&gateway).await.0 == 200).then_some(())
        })
        .await;
        let (status, body) = chat(&gateway).await;
        assert_eq!(status, 200, "{runtime:?}: {body}");
    }
}

#[tokio::test]
async fn a_worker_answering_after_the_gateway_serves_joins_it() {
    let first = SimWorker::start("tokenspeed", "regular", ZERO);
    let late_port = free_port();
    let late_url = format!("grpc://127.0.0.1:{late_port}");
    let first_url = first.grpc_url();
    let gateway = Gateway::start_listening(
        Some(&model_dir()),
        &[
            "--worker-urls",
            &first_url,
            &late_url,
            "--served-model-name",
            "model",
            "--worker-startup-check-interval",
            "1",
        ],
        None,
    );
    // One regular worker is enough to serve.
    poll_until("readiness turns 200", async || {
        (readiness(&gateway).await.0 == 200).then_some(())
    })
    .await;
    let workers = || async {
        let list: Value = reqwest::get(gateway.admin_url("/workers"))
            .await
            .expect("workers")
            .json()
            .await
            .expect("JSON");
        list.as_array()
            .or_else(|| list["workers"].as_array())
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(workers().await.len(), 1);

    let late_port = late_port.to_string();
    let _late = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--zero-delay", "--port", &late_port],
    );
    let joined = poll_until("the late worker joins", async || {
        let list = workers().await;
        (list.len() == 2).then_some(list)
    })
    .await;
    assert!(
        joined
            .iter()
            .any(|w| w["url"] == late_url.as_str() && w["status"] == "ready"),
        "{joined:?}"
    );
}

#[tokio::test]
async fn a_fleet_that_never_answers_stops_the_gateway_after_the_startup_timeout() {
    let url = format!("grpc://127.0.0.1:{}", free_port());
    let log = tempfile::NamedTempFile::new().expect("log file");
    let mut gateway = Gateway::start_listening(
        Some(&model_dir()),
        &[
            "--worker-urls",
            &url,
            "--worker-startup-timeout-secs",
            "1",
            "--worker-startup-check-interval",
            "1",
        ],
        Some(log.path()),
    );
    let status = gateway.exited().await;
    assert_eq!(status.code(), Some(1), "a start-up failure");
    assert!(gateway.ready_line().is_none(), "never ready");
    let log = std::fs::read_to_string(log.path()).expect("the log");
    assert!(
        log.contains("--worker-startup-timeout-secs") && log.contains(&url),
        "{log}"
    );
}

#[tokio::test]
async fn a_model_path_that_is_no_local_directory_fails_before_waiting_for_workers() {
    // SMG also takes Hugging Face ids; smg reads a local directory only, and
    // says so at once (the worker need not be up for this).
    let url = format!("grpc://127.0.0.1:{}", free_port());
    let (status, stderr) = Gateway::fail_to_start_with_model(
        None,
        &[
            "--worker-urls",
            &url,
            "--model",
            "Qwen/Qwen2-VL-7B-Instruct",
        ],
    );
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--model-path Qwen/Qwen2-VL-7B-Instruct")
            && stderr.contains("Hugging Face Hub"),
        "{stderr}"
    );
}

/// A worker on the command line that never answers is given up after
/// `--worker-startup-timeout-secs`, and the series recorded while the
/// gateway tried it (its failed connects) leave `/metrics` with it; the
/// worker that answered keeps its own.
#[tokio::test]
async fn a_worker_given_up_at_start_up_leaves_no_series_behind() {
    let live = SimWorker::start("tokenspeed", "regular", ZERO);
    let live_url = live.grpc_url();
    let dead_url = format!("grpc://127.0.0.1:{}", free_port());
    let gateway = Gateway::start_listening(
        Some(&model_dir()),
        &[
            "--worker-urls",
            &live_url,
            &dead_url,
            "--served-model-name",
            "model",
            "--runtime",
            "tokenspeed",
            "--worker-startup-timeout-secs",
            "3",
            "--worker-startup-check-interval",
            "1",
        ],
        None,
    );
    let metrics = || async {
        reqwest::get(format!("http://{}/metrics", gateway.metrics))
            .await
            .expect("metrics answer")
            .text()
            .await
            .expect("text")
    };
    let of = |text: &str, url: &str| {
        let label = format!("worker=\"{url}\"");
        text.lines()
            .any(|line| !line.starts_with('#') && line.contains(&label))
    };
    poll_until(
        "the dead worker's failed connects are counted",
        async || {
            let text = metrics().await;
            of(&text, &dead_url).then_some(())
        },
    )
    .await;
    let text = poll_until("the dead worker's series are gone", async || {
        let text = metrics().await;
        (!of(&text, &dead_url)).then_some(text)
    })
    .await;
    assert!(of(&text, &live_url), "{text}");
    assert_eq!(chat(&gateway).await.0, 200);
}
