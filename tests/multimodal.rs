//! End-to-end tests of images through the gateway: fetched (file:// and
//! data: URLs), preprocessed into Qwen2-VL pixel tensors, placeholders
//! expanded, and delivered inline (Regular, PD) or through encode workers
//! (EPD). The sim workers' digests prove the exact tensor bytes, shapes and
//! grids arrived; the expected values come from running the same kernel here.

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use smg_dataplane::preprocess::{ImageLimits, Qwen2VlImageProcessor, VisionPreprocessConfig};
use smg_shared::tensor::DType;
use support::media::{
    Packing, chat, expected, expected_for, http, image_data_url, image_url, images_dir, messages,
    metric, metrics_text,
};
use support::{Gateway, SimWorker};

const ZERO: &[&str] = &["--zero-delay"];

/// The worker processes of one fleet and the gateway flags that name them.
struct Fleet {
    _workers: Vec<SimWorker>,
    flags: Vec<String>,
}

fn fleet(protocol: &str, mode: &str, encoders: usize, encode_flags: &[&str]) -> Fleet {
    let mut workers = Vec::new();
    let mut flags: Vec<String> = Vec::new();
    match mode {
        "regular" => {
            let worker = SimWorker::start(protocol, "regular", ZERO);
            flags.extend(["--worker-urls".into(), worker.grpc_url()]);
            workers.push(worker);
        }
        _ => {
            if mode == "epd" {
                flags.push("--epd-disaggregation".into());
                for _ in 0..encoders {
                    let mut extra = vec!["--zero-delay"];
                    extra.extend_from_slice(encode_flags);
                    let encoder = SimWorker::start(protocol, "encode", &extra);
                    flags.extend([
                        "--encode".into(),
                        encoder.grpc_url(),
                        encoder.bootstrap_port().to_string(),
                    ]);
                    workers.push(encoder);
                }
            } else {
                flags.push("--pd-disaggregation".into());
            }
            let prefill = SimWorker::start(
                protocol,
                "prefill",
                &["--zero-delay", "--bootstrap-timeout-ms", "20000"],
            );
            let decode = SimWorker::start(
                protocol,
                "decode",
                &["--zero-delay", "--bootstrap-timeout-ms", "20000"],
            );
            flags.extend([
                "--prefill".into(),
                prefill.grpc_url(),
                prefill.bootstrap_port().to_string(),
            ]);
            flags.extend(["--decode".into(), decode.grpc_url()]);
            workers.extend([prefill, decode]);
        }
    }
    flags.extend([
        "--served-model-name".into(),
        "model".into(),
        "--allowed-local-media-path".into(),
        images_dir().display().to_string(),
    ]);
    Fleet {
        _workers: workers,
        flags,
    }
}

fn gateway(fleet: &Fleet, extra: &[&str]) -> Gateway {
    let mut args: Vec<&str> = fleet.flags.iter().map(String::as_str).collect();
    args.extend_from_slice(extra);
    Gateway::start(&args)
}

#[tokio::test]
async fn an_image_reaches_the_worker_in_every_mode_and_protocol() {
    for (protocol, mode) in [
        ("tokenspeed", "regular"),
        ("sglang", "regular"),
        ("tokenspeed", "pd"),
        ("sglang", "pd"),
        ("tokenspeed", "epd"),
    ] {
        let fleet = fleet(protocol, mode, 1, &[]);
        let gateway = gateway(&fleet, &[]);
        let images = [image_url("palette_97x61.png")];
        let messages = messages(&images);
        let (status, body) = chat(&gateway, &messages).await;
        assert_eq!(status, 200, "{protocol} {mode}: {body}");
        let content = body["choices"][0]["message"]["content"]
            .as_str()
            .expect("content");
        let header = expected(&["palette_97x61.png"], &messages);
        assert!(
            content.starts_with(&header),
            "{protocol} {mode}: {content:?} vs {header}"
        );
    }
}

/// Several images in one chat, `data:` and `file://` URLs mixed, in Regular
/// and PD for both protocols: the worker's digest covers the expanded
/// prompt and every image's exact tensor, shape and grid, in order (SGLang:
/// one item, the images' tensors concatenated, as its wire has it). With the
/// default transport (`auto`) a TokenSpeed worker on this host gets its
/// larger tensors through `/dev/shm`; SGLang's wire has no shm payload, so
/// its tensors go inline.
#[tokio::test]
async fn several_images_as_data_and_file_urls_reach_the_worker_in_regular_and_pd() {
    let names = [
        "photo_640x480.jpg",
        "rgba_150x100.png",
        "odd_333x517.png",
        "tiny_9x7.jpg",
    ];
    let urls = vec![
        image_data_url(names[0]),
        image_url(names[1]),
        image_data_url(names[2]),
        image_url(names[3]),
    ];
    let messages = messages(&urls);
    for (protocol, mode, lane_for_large) in [
        ("tokenspeed", "regular", "shm"),
        ("tokenspeed", "pd", "shm"),
        ("sglang", "regular", "inline"),
        ("sglang", "pd", "inline"),
    ] {
        let packing = match protocol {
            "sglang" => Packing::Concatenated,
            _ => Packing::PerItem,
        };
        let header = expected_for(packing, &names, &messages);
        let fleet = fleet(protocol, mode, 0, &[]);
        let gateway = gateway(&fleet, &[]);
        let (status, body) = chat(&gateway, &messages).await;
        assert_eq!(status, 200, "{protocol} {mode}: {body}");
        let content = body["choices"][0]["message"]["content"]
            .as_str()
            .expect("content");
        assert!(
            content.starts_with(&header),
            "{protocol} {mode}: {content:?} vs {header}"
        );
        let metrics = metrics_text(&gateway).await;
        let tensors = |lane: &str| {
            metric(
                &metrics,
                "smg_tensor_lane_tensors_total",
                &[&format!("lane=\"{lane}\"")],
            )
        };
        assert!(
            tensors(lane_for_large) >= 1.0,
            "{protocol} {mode}: the 640x480 photo's 3.7 MB tensor took the {lane_for_large} lane:\n{metrics}"
        );
        assert_eq!(
            tensors("shm") + tensors("inline"),
            names.len() as f64,
            "{protocol} {mode}: one tensor per image"
        );
    }
}

#[tokio::test]
async fn epd_routes_each_image_by_content_to_a_stable_encoder() {
    let dirs: Vec<tempfile::TempDir> = (0..2)
        .map(|_| tempfile::tempdir().expect("tempdir"))
        .collect();
    let mut workers = Vec::new();
    let mut flags: Vec<String> = vec!["--epd-disaggregation".into()];
    for dir in &dirs {
        let path = dir.path().display().to_string();
        let encoder = SimWorker::start(
            "tokenspeed",
            "encode",
            &["--zero-delay", "--record-dir", &path],
        );
        flags.extend([
            "--encode".into(),
            encoder.grpc_url(),
            encoder.bootstrap_port().to_string(),
        ]);
        workers.push(encoder);
    }
    let prefill = SimWorker::start("tokenspeed", "prefill", ZERO);
    let decode = SimWorker::start("tokenspeed", "decode", ZERO);
    flags.extend([
        "--prefill".into(),
        prefill.grpc_url(),
        prefill.bootstrap_port().to_string(),
    ]);
    flags.extend([
        "--decode".into(),
        decode.grpc_url(),
        "--served-model-name".into(),
        "model".into(),
    ]);
    flags.extend([
        "--allowed-local-media-path".into(),
        images_dir().display().to_string(),
    ]);
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let gateway = Gateway::start(&args);

    let names = ["tiny_20x20.png", "rgba_150x100.png", "tiny_20x20.png"];
    let urls: Vec<String> = names.iter().map(|n| image_url(n)).collect();
    let messages = messages(&urls);
    for _ in 0..2 {
        let (status, body) = chat(&gateway, &messages).await;
        assert_eq!(status, 200, "{body}");
        let content = body["choices"][0]["message"]["content"]
            .as_str()
            .expect("content");
        assert!(
            content.starts_with(&expected(&names, &messages)),
            "{content:?}"
        );
    }
    // Each encode call records its pixels and grid; the same image (by
    // content) always lands on the same encoder.
    let recorded = |dir: &tempfile::TempDir| -> Vec<Value> {
        std::fs::read_dir(dir.path())
            .expect("record dir")
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .map(|p| {
                serde_json::from_str(&std::fs::read_to_string(p).expect("sidecar")).expect("json")
            })
            .collect()
    };
    let shapes_by_encoder: Vec<Vec<Value>> = dirs
        .iter()
        .map(|d| {
            recorded(d)
                .into_iter()
                .filter(|s| s["name"] == "encoder_input")
                .map(|s| s["shape"].clone())
                .collect()
        })
        .collect();
    let total: usize = shapes_by_encoder.iter().map(Vec::len).sum();
    assert_eq!(total, 6, "three images, twice");
    let config = VisionPreprocessConfig::from_model_dir(&support::model_dir()).expect("config");
    let processor = Qwen2VlImageProcessor::new(config, ImageLimits::default()).expect("processor");
    let tiny = std::fs::read(images_dir().join("tiny_20x20.png")).expect("fixture");
    let plan = processor.plan(&tiny, DType::BFloat16).expect("plan");
    let tiny_shape = json!(plan.out_shape);
    let tiny_homes = shapes_by_encoder
        .iter()
        .filter(|shapes| shapes.contains(&tiny_shape))
        .count();
    assert_eq!(
        tiny_homes, 1,
        "the same image always meets the same encoder: {shapes_by_encoder:?}"
    );
}

#[tokio::test]
async fn a_refused_or_dead_encode_fails_the_request_fast() {
    for fault in [&["--refuse-encodes", "100"][..], &["--exit-on-encode"][..]] {
        let fleet = fleet("tokenspeed", "epd", 1, fault);
        let gateway = gateway(&fleet, &["--disable-retries", "--disable-health-check"]);
        let messages = messages(&[image_url("tiny_20x20.png")]);
        let started = Instant::now();
        let (status, body) = chat(&gateway, &messages).await;
        assert_eq!(status, 502, "{fault:?}: {body}");
        assert_eq!(body["error"]["code"], "encode_failed", "{fault:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{fault:?}: failed within seconds, not at the 20 s rendezvous timeout"
        );
    }
}

#[tokio::test]
async fn bad_images_get_stable_codes() {
    let fleet = fleet("tokenspeed", "regular", 0, &[]);
    let gateway = gateway(&fleet, &[]);
    let cases = [
        (
            "data:image/png;base64,@@@not-base64@@@",
            "invalid_image_url",
        ),
        (
            "data:image/png;base64,SGVsbG8gd29ybGQ=",
            "unsupported_image_format",
        ),
        ("file:///etc/passwd", "media_url_forbidden"),
        (
            "http://169.254.169.254/latest/meta-data",
            "media_url_forbidden",
        ),
        ("ftp://example.com/a.png", "invalid_image_url"),
    ];
    for (url, code) in cases {
        let (status, body) = chat(&gateway, &messages(&[url.to_owned()])).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (400, Some(code)),
            "{url}: {body}"
        );
    }
    // A truncated PNG: a real header, then nothing.
    let png = std::fs::read(images_dir().join("odd_333x517.png")).expect("fixture");
    let dir = tempfile::tempdir_in(images_dir()).expect("tempdir inside the allowed dir");
    let truncated = dir.path().join("truncated.png");
    std::fs::write(&truncated, &png[..png.len() / 3]).expect("write");
    let (status, body) = chat(
        &gateway,
        &messages(&[format!("file://{}", truncated.display())]),
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_image")),
        "{body}"
    );
    // The gateway still serves images afterwards.
    let (status, _) = chat(&gateway, &messages(&[image_url("tiny_20x20.png")])).await;
    assert_eq!(status, 200);
}

/// The data plane in both loops (io_uring and the forced plain fallback):
/// corrupt images and unreadable files fail their request with a stable
/// code, and the same core then serves a good image byte-exactly.
#[tokio::test]
async fn the_data_plane_keeps_serving_after_bad_inputs() {
    let dir = tempfile::tempdir_in(images_dir()).expect("tempdir inside the allowed dir");
    let photo = std::fs::read(images_dir().join("photo_640x480.jpg")).expect("fixture");
    let mut garbage = photo[..64].to_vec();
    garbage.extend(std::iter::repeat_n(0x5Au8, 4096));
    std::fs::write(dir.path().join("garbage.jpg"), &garbage).expect("write");
    std::fs::write(dir.path().join("truncated.jpg"), &photo[..photo.len() / 2]).expect("write");
    std::fs::write(dir.path().join("empty.png"), b"").expect("write");
    std::fs::create_dir(dir.path().join("folder.png")).expect("mkdir");
    let in_dir = |name: &str| format!("file://{}", dir.path().join(name).display());
    let bad = [
        (in_dir("garbage.jpg"), "invalid_image"),
        (in_dir("truncated.jpg"), "invalid_image"),
        (in_dir("empty.png"), "media_fetch_failed"),
        (in_dir("folder.png"), "media_url_forbidden"),
        (in_dir("missing.png"), "media_fetch_failed"),
    ];
    let fleet = fleet("tokenspeed", "regular", 0, &[]);
    for io in ["uring", "plain"] {
        let gateway = gateway(&fleet, &["--dataplane-cores", "1", "--dataplane-io", io]);
        for (url, code) in &bad {
            let (status, body) = chat(&gateway, &messages(std::slice::from_ref(url))).await;
            assert_eq!(
                (status, body["error"]["code"].as_str()),
                (400, Some(*code)),
                "{io} {url}: {body}"
            );
        }
        let good = messages(&[image_url("palette_97x61.png")]);
        let (status, body) = chat(&gateway, &good).await;
        assert_eq!(status, 200, "{io}: {body}");
        let content = body["choices"][0]["message"]["content"]
            .as_str()
            .expect("content");
        let header = expected(&["palette_97x61.png"], &good);
        assert!(
            content.starts_with(&header),
            "{io}: {content:?} vs {header}"
        );
    }
}

/// A data plane whose ring is full past the submit deadline answers 503
/// `dataplane_busy` instead of queueing without bound, and serves again
/// once the burst has passed.
#[tokio::test]
async fn a_saturated_data_plane_answers_dataplane_busy() {
    let fleet = fleet("tokenspeed", "regular", 0, &[]);
    let gateway = gateway(
        &fleet,
        &[
            "--dataplane-cores",
            "1",
            "--dataplane-ring-capacity",
            "2",
            "--dataplane-submit-timeout-ms",
            "0",
        ],
    );
    let gateway = std::sync::Arc::new(gateway);
    let burst: Vec<_> = (0..8)
        .map(|_| {
            let gateway = std::sync::Arc::clone(&gateway);
            tokio::spawn(async move {
                let messages = messages(&[image_url("photo_640x480.jpg")]);
                chat(&gateway, &messages).await
            })
        })
        .collect();
    let mut busy = 0;
    let mut served = 0;
    for task in burst {
        let (status, body) = task.await.expect("request task");
        match status {
            200 => served += 1,
            503 => {
                assert_eq!(body["error"]["code"], "dataplane_busy", "{body}");
                busy += 1;
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert!(served >= 1, "the first images are served");
    assert!(
        busy >= 1,
        "eight images against one core and two slots: some are refused"
    );
    let (status, body) = chat(&gateway, &messages(&[image_url("tiny_20x20.png")])).await;
    assert_eq!(status, 200, "serving again after the burst: {body}");
}

/// Refusals of an image reference quote what the client wrote, bounded,
/// and nothing it did not: not what a host name resolved to, not where a
/// symlink leads, not the canonical path. A 1.5 MB reference gets a small
/// error.
#[tokio::test]
async fn image_refusals_quote_the_client_bounded_and_reveal_nothing_internal() {
    let fleet = fleet("tokenspeed", "regular", 0, &[]);
    let gateway = gateway(&fleet, &[]);
    let refused = async |url: String, code: &str| -> String {
        let response = http()
            .post(gateway.url("/v1/chat/completions"))
            .json(&json!({"model": "model", "messages": messages(&[url]), "max_tokens": 4}))
            .send()
            .await
            .expect("sent");
        let status = response.status().as_u16();
        let text = response.text().await.expect("a body");
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (400, Some(code)),
            "{}",
            &text[..text.len().min(2000)]
        );
        text
    };

    // A 30 KB reference (under the URL cap), outside the allowed directory
    // and inside it: each refusal quotes a bounded excerpt.
    let long = "x".repeat(30_000);
    for (url, code) in [
        (format!("file:///{long}.png"), "media_url_forbidden"),
        (
            format!("file://{}/{long}.png", images_dir().display()),
            "media_fetch_failed",
        ),
        (
            format!("https://127.0.0.1/{long}.png"),
            "media_url_forbidden",
        ),
    ] {
        let text = refused(url, code).await;
        assert!(text.len() < 4096, "{code}: a {} byte error", text.len());
    }
    // A 1.5 MB one is refused for its length before it is parsed.
    let longer = "x".repeat(1_500_000);
    for url in [
        format!("file:///{longer}.png"),
        format!("https://127.0.0.1/{longer}.png"),
    ] {
        let text = refused(url, "invalid_image_url").await;
        assert!(text.len() < 4096, "a {} byte error", text.len());
    }

    // A host name that resolves to loopback: the refusal names the host
    // the client wrote, not the address it resolved to.
    let text = refused(
        "http://localhost:9/cat.png".to_owned(),
        "media_url_forbidden",
    )
    .await;
    assert!(text.contains("localhost"), "{text}");
    for address in ["127.0.0.1", "::1", "loopback"] {
        assert!(!text.contains(address), "{address}: {text}");
    }

    // A symlink inside the allowed directory that leads out of it.
    let outside = tempfile::tempdir().expect("tempdir");
    let secret = outside.path().join("secret.png");
    std::fs::copy(images_dir().join("tiny_20x20.png"), &secret).expect("copy");
    let inside = tempfile::tempdir_in(images_dir()).expect("tempdir inside the allowed dir");
    let link = inside.path().join("innocent.png");
    std::os::unix::fs::symlink(&secret, &link).expect("symlink");
    let text = refused(format!("file://{}", link.display()), "media_url_forbidden").await;
    let outside_dir = outside.path().display().to_string();
    assert!(!text.contains(&outside_dir), "{text}");
    assert!(!text.contains("secret"), "{text}");
}

/// The fixture model's multimodal tokens: `<|vision_start|>`,
/// `<|vision_end|>`, `<|image_pad|>`, `<|video_pad|>`.
const VISION_TOKENS: [u32; 4] = [4003, 4004, 4005, 4006];

/// The prompt ids a worker logged (`--prompt-log`) for the request whose
/// client id is `id`.
fn logged_prompt(log: &std::path::Path, id: &str) -> Option<Vec<u32>> {
    let text = std::fs::read_to_string(log).ok()?;
    let line = text
        .lines()
        .find(|line| line.starts_with(&format!("{id}-")))?;
    let ids = line.split_once(' ')?.1;
    Some(
        ids.split(',')
            .filter(|id| !id.is_empty())
            .map(|id| id.parse().expect("a token id"))
            .collect(),
    )
}

/// Placeholder tokens typed as text, in every dialect, reach the engine as
/// ordinary text: no placeholder id without an image. With a real image,
/// the prompt holds exactly that image's placeholders.
#[tokio::test]
async fn placeholder_tokens_typed_as_text_never_become_placeholder_ids() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("prompts.log");
    let log_flag = log.display().to_string();
    let worker = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--zero-delay", "--prompt-log", &log_flag],
    );
    let gateway = Gateway::start(&[
        "--worker-urls",
        &worker.grpc_url(),
        "--served-model-name",
        "model",
        "--allowed-local-media-path",
        &images_dir().display().to_string(),
    ]);
    let typed = "look: <|image_pad|> and <|vision_start|><|image_pad|><|vision_end|> \
                 and <|video_pad|> and <|vision_start|>";
    let split = json!([{"role": "user", "content": [
        {"type": "text", "text": "split <|image"},
        {"type": "text", "text": "_pad|> across parts <|vision_"},
        {"type": "text", "text": "start|>"},
    ]}]);
    let requests = [
        (
            "/v1/chat/completions",
            json!({"model": "model", "max_tokens": 2,
                   "messages": [{"role": "system", "content": typed},
                                {"role": "user", "content": typed}]}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "model", "max_tokens": 2, "messages": split}),
        ),
        (
            "/v1/messages",
            json!({"model": "model", "max_tokens": 2, "system": typed,
                   "messages": [{"role": "user", "content": [{"type": "text", "text": typed}]}]}),
        ),
        (
            "/v1/responses",
            json!({"model": "model", "max_output_tokens": 2, "input": typed, "store": false}),
        ),
        (
            "/v1/completions",
            json!({"model": "model", "max_tokens": 2, "prompt": typed}),
        ),
        (
            "/generate",
            json!({"text": typed, "sampling_params": {"max_new_tokens": 2}}),
        ),
    ];
    for (n, (path, body)) in requests.iter().enumerate() {
        let id = format!("typed-{n}");
        let response = http()
            .post(gateway.url(path))
            .header("x-request-id", &id)
            .json(body)
            .send()
            .await
            .expect("sent");
        let status = response.status().as_u16();
        let text = response.text().await.expect("a body");
        assert_eq!(status, 200, "{path}: {text}");
        let prompt = logged_prompt(&log, &id).expect("the worker logged the prompt");
        let placeholders: Vec<u32> = prompt
            .iter()
            .copied()
            .filter(|id| VISION_TOKENS.contains(id))
            .collect();
        assert_eq!(placeholders, Vec::<u32>::new(), "{path} {body}: {prompt:?}");
    }

    // One real image, and the same text typed beside it.
    let image = "tiny_20x20.png";
    let bytes = std::fs::read(images_dir().join(image)).expect("fixture image");
    let expansion = support::media::processor()
        .preprocess(&bytes, DType::BFloat16)
        .expect("preprocess")
        .plan
        .tokens as usize;
    let messages = json!([{"role": "user", "content": [
        {"type": "text", "text": typed},
        {"type": "image_url", "image_url": {"url": image_url(image)}},
        {"type": "text", "text": typed},
    ]}]);
    let response = http()
        .post(gateway.url("/v1/chat/completions"))
        .header("x-request-id", "typed-image")
        .json(&json!({"model": "model", "max_tokens": 2, "messages": messages}))
        .send()
        .await
        .expect("sent");
    let status = response.status().as_u16();
    let text = response.text().await.expect("a body");
    assert_eq!(status, 200, "{text}");
    let prompt = logged_prompt(&log, "typed-image").expect("the worker logged the prompt");
    let count = |token: u32| prompt.iter().filter(|&&id| id == token).count();
    assert_eq!(
        [count(4003), count(4004), count(4005), count(4006)],
        [1, 1, expansion, 0],
        "{prompt:?}"
    );
}
