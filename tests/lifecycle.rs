//! End-to-end tests of the worker lifecycle through real `smg` and
//! `smg-sim-worker` processes: the admin API (registration at run time,
//! refusals, draining removal), health transitions of a flapping worker, the
//! removal of an unhealthy one under `--remove-unhealthy-workers`, and the
//! circuit breaker opening on failed RPCs and closing after recovery.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use support::{Gateway, SimWorker, bounded, poll_until};

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

async fn call(method: reqwest::Method, url: String, body: Option<Value>) -> (u16, Value) {
    let mut request = client().request(method, url);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn get(gateway: &Gateway, path: &str) -> (u16, Value) {
    call(reqwest::Method::GET, gateway.url(path), None).await
}

/// `GET` on an admin route (on the admin listener).
async fn admin_get(gateway: &Gateway, path: &str) -> (u16, Value) {
    call(reqwest::Method::GET, gateway.admin_url(path), None).await
}

async fn chat(gateway: &Gateway, extra: Value) -> (u16, Value) {
    let mut body = json!({
        "model": "model",
        "messages": [{"role": "user", "content": "Hello, fleet."}],
        "max_tokens": 8,
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    call(
        reqwest::Method::POST,
        gateway.url("/v1/chat/completions"),
        Some(body),
    )
    .await
}

/// Polls `GET /workers/{id}` until `done` accepts the status.
async fn wait_status(gateway: &Gateway, id: &str, what: &str, done: impl Fn(u16, &Value) -> bool) {
    poll_until(what, async || {
        let (code, body) = admin_get(gateway, &format!("/workers/{id}")).await;
        done(code, &body).then_some(())
    })
    .await;
}

/// The id the gateway gives the worker at `url` (from `GET /workers`).
async fn id_of(gateway: &Gateway, url: &str) -> String {
    let (_, body) = admin_get(gateway, "/workers").await;
    body["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["url"] == url)
        .map(|w| w["id"].as_str().unwrap().to_owned())
        .unwrap_or_else(|| panic!("{url} is not listed: {body}"))
}

/// The gateway's Prometheus exposition.
async fn metrics_text(gateway: &Gateway) -> String {
    client()
        .get(format!("http://{}/metrics", gateway.metrics))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// `smg_worker_selection_total` summed over the lines naming `worker_url`.
async fn selections_of(gateway: &Gateway, worker_url: &str) -> f64 {
    let text = metrics_text(gateway).await;
    let label = format!("worker=\"{worker_url}\"");
    text.lines()
        .filter(|line| line.starts_with("smg_worker_selection_total") && line.contains(&label))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn workers_registered_at_run_time_take_traffic_and_bad_registrations_are_refused() {
    let first = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let gateway = Gateway::start(&[
        "--worker-urls",
        &first.grpc_url(),
        "--served-model-name",
        "model",
        "--policy",
        "power_of_two",
        "--health-check-interval-secs",
        "1",
        "--health-success-threshold",
        "1",
        "--load-check-interval-secs",
        "1",
    ]);
    let (code, listed) = admin_get(&gateway, "/workers").await;
    assert_eq!(code, 200);
    let workers = listed["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 1, "{listed}");
    assert_eq!(workers[0]["status"], "ready");
    assert_eq!(workers[0]["role"], "regular");
    assert_eq!(workers[0]["circuit"], "closed");

    let second = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let post = |body: Value| {
        call(
            reqwest::Method::POST,
            gateway.admin_url("/workers"),
            Some(body),
        )
    };
    let (code, accepted) = post(json!({"url": second.grpc_url()})).await;
    assert_eq!(code, 202, "{accepted}");
    assert!(
        ["registering", "pending", "ready"].contains(&accepted["status"].as_str().unwrap()),
        "{accepted}"
    );
    let id = accepted["id"].as_str().unwrap().to_owned();
    wait_status(
        &gateway,
        &id,
        "the new worker becomes ready",
        |code, body| code == 200 && body["status"] == "ready",
    )
    .await;

    // Refusals, each with its stable code.
    let refusals = [
        (
            json!({"url": second.grpc_url()}),
            409,
            "worker_already_exists",
        ),
        (json!({"url": "grpc://"}), 400, "invalid_parameter"),
        (
            json!({"url": "grpc://127.0.0.1:1", "role": "chef"}),
            400,
            "invalid_parameter",
        ),
        (
            json!({"url": "grpc://127.0.0.1:1", "role": "prefill"}),
            400,
            "invalid_parameter",
        ),
        (
            json!({"url": "grpc://127.0.0.1:1", "model_id": "other"}),
            400,
            "invalid_parameter",
        ),
        (json!({"url": 5}), 400, "invalid_request"),
    ];
    for (body, status, code) in refusals {
        let (got, answer) = post(body.clone()).await;
        assert_eq!(
            (got, answer["error"]["code"].as_str()),
            (status, Some(code)),
            "{body} → {answer}"
        );
    }
    let (code, missing) = admin_get(&gateway, "/workers/0123456789abcdef").await;
    assert_eq!(
        (code, missing["error"]["code"].as_str()),
        (404, Some("worker_not_found"))
    );

    // Traffic reaches the new worker.
    for _ in 0..30 {
        let (code, body) = chat(&gateway, json!({})).await;
        assert_eq!(code, 200, "{body}");
    }
    let to_second = selections_of(&gateway, &second.grpc_url()).await;
    let to_first = selections_of(&gateway, &first.grpc_url()).await;
    assert!(
        to_second >= 1.0 && to_first >= 1.0,
        "{to_first} / {to_second}"
    );
    assert_eq!(to_first + to_second, 30.0);

    // power_of_two reads engine load: the gateway polls GetLoads.
    wait_status(&gateway, &id, "a GetLoads reading", |_, body| {
        body["load"]["age_ms"]
            .as_u64()
            .is_some_and(|age| age < 5000)
    })
    .await;
    // ... and exports each reading's age.
    let text = metrics_text(&gateway).await;
    let label = format!("worker=\"{}\"", second.grpc_url());
    let age = text
        .lines()
        .find(|line| line.starts_with("smg_worker_load_age_seconds") && line.contains(&label))
        .and_then(|line| line.rsplit(' ').next()?.parse::<f64>().ok());
    assert!(age.is_some_and(|age| age < 5.0), "{age:?}\n{text}");
}

#[tokio::test]
async fn a_deleted_worker_finishes_its_stream_and_takes_no_new_requests() {
    let worker = SimWorker::start(
        "tokenspeed",
        "regular",
        &[
            "--decode-ms-per-token",
            "25",
            "--prefill-tokens-per-sec",
            "1000000",
        ],
    );
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--served-model-name",
        "model",
        "--disable-health-check",
    ]);
    let id = id_of(&gateway, &worker.grpc_url()).await;
    let body = json!({
        "model": "model",
        "messages": [{"role": "user", "content": "Hello, fleet."}],
        "max_tokens": 40,
        "ignore_eos": true,
        "stream": true,
    });
    let response = client()
        .post(gateway.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let mut stream = response.bytes_stream();
    let mut text = String::new();
    // The first chunk proves the request is under way on the worker.
    text.push_str(&String::from_utf8_lossy(
        &stream.next().await.unwrap().unwrap(),
    ));

    let (code, removed) = call(
        reqwest::Method::DELETE,
        gateway.admin_url(&format!("/workers/{id}")),
        None,
    )
    .await;
    assert_eq!(code, 202, "{removed}");
    assert_eq!(removed["status"], "draining");
    assert_eq!(removed["in_flight"], 1);
    let (code, refused) = chat(&gateway, json!({})).await;
    assert_eq!(
        (code, refused["error"]["code"].as_str()),
        (503, Some("no_healthy_worker")),
        "{refused}"
    );

    bounded("the drained stream ends", async {
        while let Some(chunk) = stream.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        }
    })
    .await;
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(!text.contains("\"error\""), "{text}");
    let tokens = text.matches("\"delta\"").count();
    assert!(tokens >= 40, "{tokens} chunks: the stream was cut short");
    wait_status(&gateway, &id, "the drained worker is gone", |code, _| {
        code == 404
    })
    .await;
    let (_, listed) = admin_get(&gateway, "/workers").await;
    assert_eq!(listed["workers"], json!([]));
}

#[tokio::test]
async fn a_flapping_worker_leaves_and_rejoins_rotation() {
    let flag = tempfile::NamedTempFile::new().unwrap();
    let flag_path = flag.path().to_str().unwrap().to_owned();
    let worker = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--zero-delay", "--unhealthy-while-exists", &flag_path],
    );
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--served-model-name",
        "model",
        "--health-check-interval-secs",
        "1",
        "--health-failure-threshold",
        "1",
        "--health-success-threshold",
        "1",
        // A lone worker out of rotation would get requests in panic mode.
        "--panic-threshold",
        "0",
    ]);
    let id = id_of(&gateway, &worker.grpc_url()).await;
    // The flag file exists: the worker reports unhealthy.
    wait_status(&gateway, &id, "the worker turns not_ready", |_, body| {
        body["status"] == "not_ready"
    })
    .await;
    let (code, _) = get(&gateway, "/readiness").await;
    assert_eq!(code, 503);
    let (code, body) = chat(&gateway, json!({})).await;
    assert_eq!(
        (code, body["error"]["code"].as_str()),
        (503, Some("no_healthy_worker"))
    );

    flag.close().unwrap();
    wait_status(&gateway, &id, "the worker is ready again", |_, body| {
        body["status"] == "ready"
    })
    .await;
    let (code, _) = get(&gateway, "/readiness").await;
    assert_eq!(code, 200);
    let (code, body) = chat(&gateway, json!({})).await;
    assert_eq!(code, 200, "{body}");
}

#[tokio::test]
async fn with_remove_unhealthy_workers_an_unhealthy_worker_is_removed() {
    let flag = tempfile::NamedTempFile::new().unwrap();
    let flag_path = flag.path().to_str().unwrap().to_owned();
    let sick = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--zero-delay", "--unhealthy-while-exists", &flag_path],
    );
    let well = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let gateway = Gateway::start(&[
        "--worker-urls",
        &sick.grpc_url(),
        &well.grpc_url(),
        "--served-model-name",
        "model",
        "--health-check-interval-secs",
        "1",
        "--health-failure-threshold",
        "1",
        "--health-success-threshold",
        "1",
        "--remove-unhealthy-workers",
    ]);
    // The flag file exists: the sick worker reports unhealthy, and is
    // removed rather than kept out of rotation.
    let listed = poll_until("the unhealthy worker is removed", async || {
        let (_, body) = admin_get(&gateway, "/workers").await;
        let urls: Vec<&str> = body["workers"]
            .as_array()?
            .iter()
            .filter_map(|w| w["url"].as_str())
            .collect();
        (urls == [well.grpc_url().as_str()]).then_some(body.clone())
    })
    .await;
    assert_eq!(listed["workers"][0]["status"], "ready", "{listed}");
    let (code, body) = chat(&gateway, json!({})).await;
    assert_eq!(code, 200, "the healthy worker serves: {body}");
    // Its series leave /metrics with it.
    let sick_label = format!("worker=\"{}\"", sick.grpc_url());
    let text = poll_until("the removed worker's series are gone", async || {
        let text = metrics_text(&gateway).await;
        (!text.contains(&sick_label)).then_some(text)
    })
    .await;
    assert!(
        text.contains(&format!("worker=\"{}\"", well.grpc_url())),
        "{text}"
    );
}

#[tokio::test]
async fn the_circuit_opens_on_failures_and_closes_after_recovery() {
    let mut failing = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--zero-delay", "--fail-after-tokens", "0"],
    );
    let port = failing.grpc.port().to_string();
    let url = failing.grpc_url();
    let gateway = Gateway::start(&[
        "--worker-urls",
        &url,
        "--served-model-name",
        "model",
        "--disable-health-check",
        "--disable-retries",
        "--cb-failure-threshold",
        "2",
        "--cb-success-threshold",
        "1",
        "--cb-timeout-duration-secs",
        "1",
        // This test pins the timed half-open path: no probes of the open
        // circuit, no panic routing to the lone worker.
        "--cb-probe-interval-ms",
        "0",
        "--panic-threshold",
        "0",
    ]);
    let id = id_of(&gateway, &url).await;
    for _ in 0..2 {
        let (code, body) = chat(&gateway, json!({})).await;
        assert_eq!(
            (code, body["error"]["code"].as_str()),
            (502, Some("worker_error")),
            "{body}"
        );
    }
    let (_, status) = admin_get(&gateway, &format!("/workers/{id}")).await;
    assert_eq!(status["circuit"], "open", "{status}");
    // Open: the worker is skipped, so no worker is left.
    let (code, body) = chat(&gateway, json!({})).await;
    assert_eq!(
        (code, body["error"]["code"].as_str()),
        (503, Some("no_healthy_worker"))
    );

    // The worker is replaced by a healthy one on the same address, slow to
    // its first token (a prompt of a dozen tokens or more takes over half a
    // second to prefill), so a trial request stays in flight a while.
    failing.kill();
    let healthy = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--port", &port, "--prefill-tokens-per-sec", "20"],
    );
    assert_eq!(healthy.grpc_url(), url);
    // Half-open: once the open period is over, the next request is the one
    // trial (the success threshold) and closes the circuit. Only an
    // admission notices the period is over, so ask until one is admitted.
    let trial = poll_until("the circuit admits a trial", async || {
        let (code, body) = chat(&gateway, json!({})).await;
        let refused = code == 503 && body["error"]["code"] == "no_healthy_worker";
        (!refused).then_some((code, body))
    });
    // A request arriving while the trial is in flight without a verdict
    // (the worker shows the half-open circuit and one request) finds no
    // trial slot.
    let during_trial = async {
        poll_until("the trial is in flight", async || {
            let (_, status) = admin_get(&gateway, &format!("/workers/{id}")).await;
            (status["circuit"] == "half_open" && status["in_flight"] == 1).then_some(())
        })
        .await;
        chat(&gateway, json!({})).await
    };
    let ((code, body), (second_code, second)) = tokio::join!(trial, during_trial);
    assert_eq!(
        (second_code, second["error"]["code"].as_str()),
        (503, Some("no_healthy_worker")),
        "{second}"
    );
    assert_eq!(code, 200, "{body}");
    assert!(
        body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .starts_with("digest="),
        "{body}"
    );
    let (_, status) = admin_get(&gateway, &format!("/workers/{id}")).await;
    assert_eq!(status["circuit"], "closed", "{status}");
    let (code, body) = chat(&gateway, json!({})).await;
    assert_eq!(code, 200, "closed: requests flow again: {body}");
}

/// Asks for `model` until it stops answering 503 (its mode or tokenizer is
/// still settling); returns the first other answer.
async fn once_served(gateway: &Gateway, model: &str) -> (u16, Value) {
    poll_until("the model serves", async || {
        let (code, body) = chat(gateway, json!({"model": model})).await;
        (code != 503).then_some((code, body))
    })
    .await
}

#[tokio::test]
async fn igw_serves_each_model_in_the_mode_its_workers_imply() {
    let gateway = Gateway::start(&[
        "--enable-igw",
        "--health-check-interval-secs",
        "1",
        "--health-success-threshold",
        "1",
        "--model-alias",
        "small=alpha",
        "--model-policy",
        "beta=round_robin",
        "--model-max-retries",
        "beta=1",
    ]);
    let post = |body: Value| {
        call(
            reqwest::Method::POST,
            gateway.admin_url("/workers"),
            Some(body),
        )
    };
    let ask = |model: &'static str| chat(&gateway, json!({"model": model}));
    let (code, _) = get(&gateway, "/readiness").await;
    assert_eq!(code, 503, "no workers yet");
    let (code, body) = ask("alpha").await;
    assert_eq!(
        (code, body["error"]["code"].as_str()),
        (404, Some("model_not_found"))
    );

    // beta: prefill alone makes no mode.
    let prefill = SimWorker::start("tokenspeed", "prefill", &["--zero-delay"]);
    let (code, body) =
        post(json!({"url": prefill.grpc_url(), "role": "prefill", "model_id": "beta"})).await;
    assert_eq!(code, 202, "{body}");
    let prefill_id = body["id"].as_str().unwrap().to_owned();
    wait_status(&gateway, &prefill_id, "prefill ready", |_, b| {
        b["status"] == "ready"
    })
    .await;
    let (code, body) = ask("beta").await;
    assert_eq!(
        (code, body["error"]["code"].as_str()),
        (503, Some("model_not_ready")),
        "{body}"
    );

    // Adding decode makes beta a PD model.
    let decode = SimWorker::start("tokenspeed", "decode", &["--zero-delay"]);
    let (code, body) =
        post(json!({"url": decode.grpc_url(), "role": "decode", "model_id": "beta"})).await;
    assert_eq!(code, 202, "{body}");
    let decode_id = body["id"].as_str().unwrap().to_owned();
    wait_status(&gateway, &decode_id, "decode ready", |_, b| {
        b["status"] == "ready"
    })
    .await;
    let (code, body) = once_served(&gateway, "beta").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["model"], "beta");
    assert!(
        body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .starts_with("digest=")
    );

    // alpha: one regular worker, reached through its alias.
    let regular = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let (code, body) = post(json!({"url": regular.grpc_url(), "model_id": "alpha"})).await;
    assert_eq!(code, 202, "{body}");
    let (code, body) = once_served(&gateway, "small").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["model"], "alpha");

    let (code, ready) = get(&gateway, "/readiness").await;
    assert_eq!(code, 200, "{ready}");
    assert_eq!(ready["models"]["alpha"]["mode"], "grpc");
    assert_eq!(ready["models"]["beta"]["mode"], "grpc_pd");
    let (_, models) = get(&gateway, "/v1/models").await;
    let mut names: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["alpha", "beta"]);
    let (_, listed) = admin_get(&gateway, "/workers").await;
    assert_eq!(listed["workers"].as_array().unwrap().len(), 3, "{listed}");
    let (_, beta) = admin_get(&gateway, "/workers?model_id=beta").await;
    assert_eq!(beta["workers"].as_array().unwrap().len(), 2, "{beta}");
    let (_, decodes) = admin_get(&gateway, "/workers?model_id=beta&role=decode").await;
    assert_eq!(decodes["workers"][0]["id"], decode_id.as_str(), "{decodes}");
    let (code, body) = admin_get(&gateway, "/workers?colour=red").await;
    assert_eq!(
        (code, body["error"]["code"].as_str()),
        (400, Some("invalid_parameter"))
    );

    // A worker without a model, or a duplicate across models, is refused.
    let (code, body) = post(json!({"url": "grpc://127.0.0.1:1"})).await;
    assert_eq!(
        (code, body["error"]["code"].as_str()),
        (400, Some("invalid_parameter"))
    );
    let (code, body) = post(json!({"url": regular.grpc_url(), "model_id": "beta"})).await;
    assert_eq!(
        (code, body["error"]["code"].as_str()),
        (409, Some("worker_already_exists"))
    );
    // Without a model name a request is ambiguous now.
    let mut bare = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    bare.as_object_mut().unwrap().remove("model");
    let (code, body) = call(
        reqwest::Method::POST,
        gateway.url("/v1/chat/completions"),
        Some(bare),
    )
    .await;
    assert_eq!(code, 400, "{body}");
}

#[tokio::test]
async fn dp_aware_gateways_route_to_each_data_parallel_rank() {
    let worker = SimWorker::start(
        "sglang",
        "regular",
        &[
            "--dp-size",
            "2",
            "--decode-ms-per-token",
            "40",
            "--prefill-tokens-per-sec",
            "1000000",
        ],
    );
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--served-model-name",
        "model",
        "--dp-aware",
        "--policy",
        "round_robin",
        "--disable-health-check",
    ]);
    let (_, listed) = admin_get(&gateway, "/workers").await;
    let workers = listed["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 2, "one logical worker per rank: {listed}");
    assert_eq!(workers[0]["url"], workers[1]["url"]);
    assert_ne!(workers[0]["id"], workers[1]["id"]);

    let streams = start_rank_streams(&gateway, 2).await;
    // Both requests run now, one on each rank.
    let (ranks, running) = running_per_rank(worker.url()).await;
    assert_eq!(ranks, 2);
    assert_eq!(running, [(0, 1), (1, 1)]);
    finish_rank_streams(streams).await;

    // Each rank has series of its own (`<url>@<rank>`), so one rank's
    // gauges do not overwrite the other's; the engine's connections are
    // counted under its URL.
    let text = metrics_text(&gateway).await;
    let url = worker.grpc_url();
    for rank in 0..2 {
        let label = format!("worker=\"{url}@{rank}\"");
        for family in [
            "smg_worker_selection_total",
            "smg_worker_health_state",
            "smg_worker_cb_state",
        ] {
            assert!(
                text.lines()
                    .any(|line| line.starts_with(family) && line.contains(&label)),
                "{family} of rank {rank}:\n{text}"
            );
        }
        let chosen = text
            .lines()
            .find(|line| line.starts_with("smg_worker_selection_total") && line.contains(&label))
            .and_then(|line| line.rsplit_once(' '))
            .map(|(_, count)| count.to_owned());
        assert_eq!(chosen.as_deref(), Some("1"), "{text}");
    }
    assert!(
        text.lines()
            .any(|line| line.starts_with("smg_worker_connections{")
                && line.contains(&format!("worker=\"{url}\""))),
        "{text}"
    );
}

/// Starts `n` streamed chats and reads each one's first chunk, so all `n`
/// are under way on the workers when this returns.
async fn start_rank_streams(
    gateway: &Gateway,
    n: usize,
) -> Vec<impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin> {
    let body = json!({
        "model": "model",
        "messages": [{"role": "user", "content": "Hello, ranks."}],
        "max_tokens": 20,
        "ignore_eos": true,
        "stream": true,
    });
    let mut streams = Vec::new();
    for _ in 0..n {
        let response = client()
            .post(gateway.url("/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        let mut stream = response.bytes_stream();
        stream.next().await.unwrap().unwrap();
        streams.push(stream);
    }
    streams
}

/// Reads every stream to its end, which must be `data: [DONE]`.
async fn finish_rank_streams(
    streams: Vec<impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin>,
) {
    for mut stream in streams {
        let mut text = String::new();
        bounded("a rank's stream ends", async {
            while let Some(chunk) = stream.next().await {
                text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            }
        })
        .await;
        assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    }
}

/// The SGLang engine at `url`'s DP rank count and `GetLoads` running
/// requests per rank.
async fn running_per_rank(url: String) -> (i32, Vec<(i32, i32)>) {
    use smg::proto::sglang_scheduler as sg;
    use smg::proto::sglang_scheduler::sglang_scheduler_client::SglangSchedulerClient;

    let mut engine = SglangSchedulerClient::connect(url).await.unwrap();
    let loads = engine
        .get_loads(sg::GetLoadsRequest {
            dp_rank: None,
            include: vec![],
        })
        .await
        .unwrap()
        .into_inner();
    let running = loads
        .loads
        .iter()
        .map(|l| (l.dp_rank, l.num_running_reqs))
        .collect();
    (loads.dp_rank_count, running)
}

#[tokio::test]
async fn dp_aware_registration_at_run_time_adds_a_worker_per_rank() {
    let slow = [
        "--decode-ms-per-token",
        "40",
        "--prefill-tokens-per-sec",
        "1000000",
    ];
    let first = SimWorker::start("sglang", "regular", &slow);
    let gateway = Gateway::start(&[
        "--worker-urls",
        &first.grpc_url(),
        "--served-model-name",
        "model",
        "--dp-aware",
        "--policy",
        "round_robin",
        "--disable-health-check",
    ]);
    let mut args = vec!["--dp-size", "3"];
    args.extend(slow);
    let ranked = SimWorker::start("sglang", "regular", &args);
    let post = |body: Value| {
        call(
            reqwest::Method::POST,
            gateway.admin_url("/workers"),
            Some(body),
        )
    };
    let (code, accepted) = post(json!({"url": ranked.grpc_url()})).await;
    assert_eq!(code, 202, "{accepted}");
    let id = accepted["id"].as_str().unwrap().to_owned();
    // The engine's id names its first rank once the ranks have joined.
    wait_status(&gateway, &id, "the ranks join", |code, body| {
        code == 200 && body["status"] == "ready" && body["dp_rank"] == 0
    })
    .await;
    let (_, listed) = admin_get(&gateway, "/workers").await;
    let mut ranks: Vec<(String, u64)> = listed["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["url"] == ranked.grpc_url())
        .map(|w| {
            assert_eq!(w["status"], "ready", "{w}");
            (
                w["id"].as_str().unwrap().to_owned(),
                w["dp_rank"].as_u64().unwrap(),
            )
        })
        .collect();
    ranks.sort_by_key(|(_, rank)| *rank);
    assert_eq!(
        ranks.iter().map(|(_, rank)| *rank).collect::<Vec<_>>(),
        [0, 1, 2],
        "{listed}"
    );
    let mut ids: Vec<&String> = ranks.iter().map(|(id, _)| id).collect();
    ids.dedup();
    assert_eq!(ids.len(), 3, "each rank has its own id: {listed}");
    let (code, again) = post(json!({"url": ranked.grpc_url()})).await;
    assert_eq!(
        (code, again["error"]["code"].as_str()),
        (409, Some("worker_already_exists"))
    );

    // Four logical workers in turn: one request on each rank of the new
    // engine (and one on the first engine).
    let streams = start_rank_streams(&gateway, 4).await;
    assert_eq!(
        running_per_rank(ranked.url()).await.1,
        [(0, 1), (1, 1), (2, 1)]
    );

    // Deleting the engine's id drains every rank; the streams finish.
    let (code, removed) = call(
        reqwest::Method::DELETE,
        gateway.admin_url(&format!("/workers/{id}")),
        None,
    )
    .await;
    assert_eq!(code, 202, "{removed}");
    assert_eq!(removed["status"], "draining");
    finish_rank_streams(streams).await;
    wait_status(&gateway, &id, "every rank is gone", |code, _| code == 404).await;
    let (_, listed) = admin_get(&gateway, "/workers").await;
    let left: Vec<&Value> = listed["workers"].as_array().unwrap().iter().collect();
    assert_eq!(left.len(), 1, "{listed}");
    assert_eq!(left[0]["url"], first.grpc_url());
}
