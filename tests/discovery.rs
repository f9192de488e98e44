//! Learning a model from its workers: with no `--model-path`, the
//! tokenizer comes from a worker (the directory it advertises, else its
//! `GetTokenizer` archive), and the vision preprocessing settings come
//! with it, so images are served rather than answered 501.

mod support;

use support::media::{chat, expected, image_url, messages};
use support::{Gateway, SimWorker};

#[tokio::test]
async fn images_are_served_when_the_tokenizer_comes_from_the_worker() {
    // An advertised directory the gateway can read, then (the advertised
    // path missing) the worker's archive.
    for hostile in [None, Some("tokenizer-path=/nonexistent/smg-test-dir")] {
        let mut extra = vec!["--zero-delay"];
        if let Some(hostile) = hostile {
            extra.extend(["--hostile", hostile]);
        }
        let worker = SimWorker::start("tokenspeed", "regular", &extra);
        let gateway = Gateway::start_with_model(
            None,
            &[
                "--worker-urls",
                &worker.grpc_url(),
                "--served-model-name",
                "model",
                "--allowed-local-media-path",
                &support::media::images_dir().display().to_string(),
            ],
        );
        let messages = messages(&[image_url("palette_97x61.png")]);
        let (status, body) = chat(&gateway, &messages).await;
        assert_eq!(status, 200, "{hostile:?}: {body}");
        let content = body["choices"][0]["message"]["content"]
            .as_str()
            .expect("content");
        let header = expected(&["palette_97x61.png"], &messages);
        assert!(content.starts_with(&header), "{hostile:?}: {content:?}");
    }
}

/// `POST /workers` on the admin listener: status and body.
async fn register(gateway: &Gateway, body: serde_json::Value) -> (u16, serde_json::Value) {
    let response = reqwest::Client::new()
        .post(gateway.admin_url("/workers"))
        .json(&body)
        .send()
        .await
        .expect("answered");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON"))
}

#[tokio::test]
async fn an_igw_worker_registered_without_a_runtime_is_probed_for_it() {
    let worker = SimWorker::start("sglang", "regular", &["--zero-delay"]);
    let gateway = Gateway::start_with_model(
        None,
        &[
            "--enable-igw",
            "--health-check-interval-secs",
            "1",
            "--health-success-threshold",
            "1",
        ],
    );
    let (status, body) = register(
        &gateway,
        serde_json::json!({"url": worker.grpc_url(), "model_id": "m"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let id = body["id"].as_str().expect("an id").to_owned();
    support::poll_until("the SGLang worker is ready", async || {
        let status: serde_json::Value = reqwest::get(gateway.admin_url(&format!("/workers/{id}")))
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        (status["status"] == "ready").then_some(())
    })
    .await;
    let answer = support::poll_until("the model serves", async || {
        let response = reqwest::Client::new()
            .post(gateway.url("/v1/chat/completions"))
            .json(&serde_json::json!({
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4
            }))
            .send()
            .await
            .ok()?;
        (response.status() == 200).then_some(response)
    })
    .await;
    let body: serde_json::Value = answer.json().await.expect("JSON");
    assert!(
        body["choices"][0]["message"]["content"]
            .as_str()
            .is_some_and(|text| text.starts_with("digest=")),
        "{body}"
    );

    // A model's first worker that does not answer cannot be probed: the
    // registration says to give its runtime.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("grpc://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let (status, body) = register(
        &gateway,
        serde_json::json!({"url": url, "model_id": "other"}),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "worker_unavailable", "{body}");
    // The detail (the `runtime` hint, the address) is in the log; the
    // answer names the code and no address.
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("worker_unavailable"), "{body}");
    assert!(!message.contains(&url), "{body}");
    let (status, body) = register(
        &gateway,
        serde_json::json!({"url": url, "model_id": "other", "runtime": "tokenspeed"}),
    )
    .await;
    assert_eq!(status, 202, "with its runtime it registers: {body}");
}

/// `--chat-template FILE` reaches a model the gateway learns only later,
/// from a worker registered with `POST /workers` (IGW, no model directory:
/// the tokenizer comes from the worker): the worker's script matches only
/// the prompt the override renders.
#[tokio::test]
async fn the_chat_template_flag_applies_to_a_model_registered_later() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let script = dir.path().join("script.jsonl");
    std::fs::write(
        &script,
        format!(
            "{}\n",
            serde_json::json!({"when": "[[igw-override user]] hi", "text": "Rendered by the override."})
        ),
    )
    .expect("write the script");
    let template = dir.path().join("override.jinja");
    std::fs::write(
        &template,
        "{% for m in messages %}[[igw-override {{ m.role }}]] {{ m.content }}\n{% endfor %}",
    )
    .expect("write the template");
    let qwen3 =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/qwen3");
    let worker = SimWorker::start_with_model(
        "tokenspeed",
        "regular",
        &qwen3,
        &["--zero-delay", "--script", script.to_str().expect("UTF-8")],
    );
    let gateway = Gateway::start_with_model(
        None,
        &[
            "--enable-igw",
            "--health-check-interval-secs",
            "1",
            "--health-success-threshold",
            "1",
            "--chat-template",
            template.to_str().expect("UTF-8"),
        ],
    );
    let (status, body) = register(
        &gateway,
        serde_json::json!({"url": worker.grpc_url(), "model_id": "m", "runtime": "tokenspeed"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let answer = support::poll_until("the model serves", async || {
        let response = reqwest::Client::new()
            .post(gateway.url("/v1/chat/completions"))
            .json(&serde_json::json!({
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 50,
                "separate_reasoning": false
            }))
            .send()
            .await
            .ok()?;
        (response.status() == 200).then_some(response)
    })
    .await;
    let body: serde_json::Value = answer.json().await.expect("JSON");
    assert_eq!(
        body["choices"][0]["message"]["content"], "Rendered by the override.",
        "{body}"
    );
}
