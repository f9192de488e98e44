//! The `smg-bench` binary end to end against the fixture server: outputs
//! (summary, JSON with the config echoed, JSONL, HTML), a sweep, goodput,
//! images, server metrics deltas, quiet when piped, and set-up errors with
//! their codes.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

use smg_bench::fixture::{FixtureConfig, FixtureServer};

fn smg_bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_smg-bench"))
        .args(args)
        .output()
        .unwrap()
}

/// The fixture on its own thread and runtime, so the child can reach it
/// while the test blocks on the child.
fn serve(config: FixtureConfig) -> (String, std::sync::mpsc::Sender<()>) {
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let server = FixtureServer::start(config).await.unwrap();
            addr_tx.send(server.url()).unwrap();
            let _ = tokio::task::spawn_blocking(move || stop_rx.recv()).await;
        });
    });
    (addr_rx.recv().unwrap(), stop_tx)
}

#[test]
fn a_sweep_writes_every_output_and_echoes_its_config() {
    let (url, _stop) = serve(FixtureConfig {
        tokens: 4,
        ..FixtureConfig::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let jsonl = dir.path().join("out.jsonl");
    let html = dir.path().join("out.html");
    let out = smg_bench(&[
        "--base-url",
        &url,
        "--stream",
        "--num-prompts",
        "10",
        "--warmup",
        "2",
        "--sweep",
        "max-concurrency=1,4",
        "--slo",
        "ttft:1000,e2e:5000",
        "--image-count",
        "1",
        "--image-resolution",
        "64x48",
        "--metrics-url",
        &format!("{url}/metrics"),
        "--seed",
        "9",
        "--output-json",
        json.to_str().unwrap(),
        "--output-jsonl",
        jsonl.to_str().unwrap(),
        "--output-html",
        html.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.is_empty(),
        "no progress bar when not on a terminal: {stderr}"
    );
    assert!(
        stdout.contains("TTFT") && stdout.contains("Goodput:") && stdout.contains("Sweep:"),
        "{stdout}"
    );
    assert!(
        stdout.contains("fixture_requests_total"),
        "metrics deltas printed: {stdout}"
    );

    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(report["config"]["seed"], 9);
    assert_eq!(report["config"]["stream"], true);
    assert!(
        report["config"].get("api_key").is_none(),
        "secrets are not echoed"
    );
    let points = report["points"].as_array().unwrap();
    assert_eq!(points.len(), 2);
    for (point, conc) in points.iter().zip([1, 4]) {
        let s = &point["summary"];
        assert_eq!(s["max_concurrency"], conc);
        assert_eq!(s["completed"], 10);
        assert_eq!(s["images"], 10);
        assert_eq!(s["goodput"]["good_requests"], 10);
        assert!(s["ttft_ms"]["p99"].as_f64().unwrap() > 0.0);
        let delta = point["metrics_deltas"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["series"] == "fixture_requests_total")
            .unwrap();
        assert_eq!(
            delta["delta"], 10.0,
            "the server saw exactly the measured requests"
        );
    }
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&jsonl)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 20);
    assert_eq!(lines[0]["point"], 0);
    assert_eq!(lines[19]["point"], 1);
    assert_eq!(lines[0]["itl_ms"].as_array().unwrap().len(), 3);
    assert!(lines[0]["scheduled_s"].is_number() && lines[0]["ok"] == true);
    let html = std::fs::read_to_string(&html).unwrap();
    assert!(
        html.contains("<svg")
            && html.contains("Latency CDF")
            && html.contains("Throughput over time")
    );
}

#[test]
fn set_up_errors_exit_2_with_a_code() {
    let cases: [(&[&str], &str); 5] = [
        (&["--request-rate", "0"], "error: invalid value"),
        (
            &["--base-url", "https://x:1", "--model", "m"],
            "error[invalid_url]",
        ),
        (&["--num-prompts", "0"], "error[invalid_argument]"),
        (
            &["--duration", "1", "--model", "m"],
            "error[invalid_argument]",
        ),
        (
            &[
                "--dataset",
                "sharegpt",
                "--model",
                "m",
                "--base-url",
                "http://127.0.0.1:9",
            ],
            "error[invalid_argument]",
        ),
    ];
    for (args, expected) in cases {
        let out = smg_bench(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    // No model given and nothing answers /v1/models.
    let out = smg_bench(&["--base-url", "http://127.0.0.1:9"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("error[model_discovery_failed]"));
}

/// An https fixture with the test CA's server certificate (for 127.0.0.1).
fn serve_tls(config: FixtureConfig) -> (String, std::sync::mpsc::Sender<()>) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls");
    let chain = CertificateDer::pem_file_iter(dir.join("server.pem"))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    let tls = std::sync::Arc::new(tls);
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let server = FixtureServer::start_tls(config, tls).await.unwrap();
            addr_tx.send(server.url()).unwrap();
            let _ = tokio::task::spawn_blocking(move || stop_rx.recv()).await;
        });
    });
    (addr_rx.recv().unwrap(), stop_tx)
}

#[test]
fn https_endpoints_work_with_a_trusted_ca_and_are_refused_without_it() {
    let (url, _stop) = serve_tls(FixtureConfig {
        tokens: 3,
        ..FixtureConfig::default()
    });
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let ca = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls/ca.pem");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let out = smg_bench(&[
        "--base-url",
        &url,
        "--model",
        "m",
        "--stream",
        "--num-prompts",
        "6",
        "--ca-cert",
        ca.to_str().unwrap(),
        "--output-json",
        json.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["points"][0]["summary"]["completed"], 6, "{report}");

    // The server's CA is not a public root: without --ca-cert every TLS
    // handshake fails, and the failures are counted by class, not fatal.
    let out = smg_bench(&[
        "--base-url",
        &url,
        "--model",
        "m",
        "--num-prompts",
        "2",
        "--output-json",
        json.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let summary = &report["points"][0]["summary"];
    assert_eq!(summary["completed"], 0, "{summary}");
    assert_eq!(summary["failed"], 2, "{summary}");
    let classes: Vec<&String> = summary["errors"].as_object().unwrap().keys().collect();
    assert_eq!(classes.len(), 1, "{summary}");
    assert!(classes[0].starts_with("connect"), "{summary}");
}
