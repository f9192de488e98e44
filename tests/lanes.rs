//! End-to-end tests of the tensor lanes in EPD: each image's pixel tensor
//! reaches its encode worker inline or through a shm name, as
//! `--multimodal-tensor-transport` (and `auto`'s namespace check) decide.
//! Every test proves the encoder received the exact bytes (the sim worker's
//! digest in the answer) and which lane carried them (its `--record-dir`
//! sidecars), and that no shm name outlives its request: the gateway's names
//! in its own shm directory return to its slots' private names and the pool
//! reports every slot free on `/metrics`.
//!
//! Each test gives the gateway and its workers a shm directory of its own (a
//! directory in /dev/shm, or a small tmpfs where mounting is allowed), so
//! tests running in parallel never see each other's files.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use smg_shared::tensor::DType;
use support::media::{
    chat, expected, image_url, images_dir, messages, metric, metrics_text, processor,
};
use support::shm::ShmDir;
use support::{Gateway, SimWorker};

/// Large enough for the shm lane (over 64 KiB as bf16), small enough to fit
/// a 256 KiB slot.
const MEDIUM: &str = "rgba_150x100.png";
/// Under the 64 KiB threshold: inline on every lane.
const SMALL: &str = "tiny_20x20.png";
/// Larger than a test slot: a one-off file.
const LARGE: &str = "photo_640x480.jpg";
const SLOT_BYTES: &str = "262144";

/// An EPD fleet whose encoder records what it received.
struct Fleet {
    _workers: Vec<SimWorker>,
    record: tempfile::TempDir,
    flags: Vec<String>,
}

fn fleet(shm: &ShmDir, encoder_flags: &[&str], prefill_flags: &[&str]) -> Fleet {
    let record = tempfile::tempdir().unwrap();
    let record_arg = record.path().display().to_string();
    let shm_arg = shm.arg();
    let mut encode_args = vec![
        "--zero-delay",
        "--record-dir",
        &record_arg,
        "--shm-dir",
        &shm_arg,
    ];
    encode_args.extend_from_slice(encoder_flags);
    let encoder = SimWorker::start("tokenspeed", "encode", &encode_args);
    let mut prefill_args = vec!["--zero-delay", "--bootstrap-timeout-ms", "20000"];
    prefill_args.extend_from_slice(prefill_flags);
    let prefill = SimWorker::start("tokenspeed", "prefill", &prefill_args);
    let decode = SimWorker::start(
        "tokenspeed",
        "decode",
        &["--zero-delay", "--bootstrap-timeout-ms", "20000"],
    );
    let mut flags = vec![
        "--epd-disaggregation".into(),
        "--encode".into(),
        encoder.grpc_url(),
        encoder.bootstrap_port().to_string(),
        "--prefill".into(),
        prefill.grpc_url(),
        prefill.bootstrap_port().to_string(),
        "--decode".into(),
        decode.grpc_url(),
    ];
    flags.extend(common_flags(shm));
    Fleet {
        _workers: vec![encoder, prefill, decode],
        record,
        flags,
    }
}

/// What every gateway here is given: the fixture model's name, the images'
/// directory, a two-slot shm pool per core in `shm`, one data-plane core, no
/// health probes.
fn common_flags(shm: &ShmDir) -> Vec<String> {
    [
        "--served-model-name",
        "model",
        "--allowed-local-media-path",
        &images_dir().display().to_string(),
        "--multimodal-shm-dir",
        &shm.arg(),
        "--multimodal-shm-slot-bytes",
        SLOT_BYTES,
        "--multimodal-shm-slots-per-core",
        "2",
        "--dataplane-cores",
        "1",
        "--disable-health-check",
    ]
    .map(String::from)
    .to_vec()
}

/// A gateway in front of `fleet` sending tensors by `transport`.
fn gateway(fleet: &Fleet, transport: &str, extra: &[&str]) -> Gateway {
    let mut args: Vec<&str> = fleet.flags.iter().map(String::as_str).collect();
    args.extend_from_slice(&["--multimodal-tensor-transport", transport]);
    args.extend_from_slice(extra);
    Gateway::start(&args)
}

/// The lane the encoder recorded for each image it received, by tensor
/// size (so several images of different sizes are told apart).
fn recorded_lanes(fleet: &Fleet) -> Vec<(u64, String)> {
    recorded_in(fleet.record.path())
}

/// Whether an encoder input's sidecar is in `dir` (read while the worker
/// may still be writing it: a partial file does not count yet).
fn encoder_input_recorded(dir: &std::path::Path) -> bool {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .filter_map(|text| serde_json::from_str::<Value>(&text).ok())
        .any(|sidecar| sidecar["name"] == "encoder_input")
}

/// The (size, lane) of every encoder input recorded in `dir`, sorted.
fn recorded_in(dir: &std::path::Path) -> Vec<(u64, String)> {
    let mut lanes: Vec<(u64, String)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .map(|path| serde_json::from_str::<Value>(&std::fs::read_to_string(path).unwrap()).unwrap())
        .filter(|sidecar| sidecar["name"] == "encoder_input")
        .map(|sidecar| {
            (
                sidecar["nbytes"].as_u64().unwrap(),
                sidecar["lane"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    lanes.sort();
    lanes
}

/// The bf16 tensor size of a fixture image.
fn tensor_bytes(name: &str) -> u64 {
    let bytes = std::fs::read(images_dir().join(name)).unwrap();
    processor().plan(&bytes, DType::BFloat16).unwrap().out_bytes as u64
}

/// Sends one chat with `images` and checks the answer carries the digest of
/// exactly those tensors.
async fn chat_exactly(gateway: &Gateway, images: &[&str]) {
    let urls: Vec<String> = images.iter().map(|name| image_url(name)).collect();
    let messages = messages(&urls);
    let (status, body) = support::bounded("chat", chat(gateway, &messages)).await;
    assert_eq!(status, 200, "{body}");
    let content = body["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        content.starts_with(&expected(images, &messages)),
        "the encoder saw other bytes: {content:?}"
    );
}

/// Waits until every slot is free again and only the slots' private names
/// remain in the directory; fails after 10 s.
async fn assert_settles(gateway: &Gateway, shm: &ShmDir, private: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = metrics_text(gateway).await;
        let in_use = metric(&text, "smg_shm_slots_in_use", &[]);
        let names = shm.names_of(gateway.pid());
        if in_use == 0.0 && names == private {
            assert_eq!(metric(&text, "smg_shm_slots", &[]), 2.0);
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the lane did not settle: {in_use} slots in use, names {names:?} (private {private:?})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One request with a medium and a small image through `transport`; the
/// medium image must travel `medium_lane`, the small one always inline.
async fn one_lane(transport: &str, encoder_flags: &[&str], medium_lane: &str) -> (Gateway, Fleet) {
    let shm = ShmDir::in_dev_shm();
    let fleet = fleet(&shm, encoder_flags, &[]);
    let gateway = gateway(&fleet, transport, &[]);
    let private = shm.names_of(gateway.pid());
    chat_exactly(&gateway, &[MEDIUM, SMALL]).await;
    assert_eq!(
        recorded_lanes(&fleet),
        vec![
            (tensor_bytes(SMALL), "inline".to_owned()),
            (tensor_bytes(MEDIUM), medium_lane.to_owned()),
        ],
        "{transport}"
    );
    let text = metrics_text(&gateway).await;
    let medium_on_its_lane = metric(
        &text,
        "smg_tensor_lane_tensors_total",
        &[&format!("lane=\"{medium_lane}\"")],
    );
    assert!(medium_on_its_lane >= 1.0, "{transport}: {text}");
    if matches!(transport, "shm" | "auto") {
        assert_settles(&gateway, &shm, &private).await;
    }
    (gateway, fleet)
}

#[tokio::test]
async fn inline_lane_carries_the_exact_bytes_in_the_message() {
    let (gateway, _fleet) = one_lane("inline", &[], "inline").await;
    let text = metrics_text(&gateway).await;
    assert_eq!(
        metric(&text, "smg_tensor_lane_tensors_total", &["lane=\"shm\""]),
        0.0
    );
}

#[tokio::test]
async fn shm_lane_carries_tensors_over_the_threshold_through_a_name() {
    let (gateway, _fleet) = one_lane("shm", &[], "shm").await;
    let text = metrics_text(&gateway).await;
    assert!(
        metric(&text, "smg_tensor_lane_bytes_total", &["lane=\"shm\""])
            >= tensor_bytes(MEDIUM) as f64
    );
}

#[tokio::test]
async fn auto_takes_shm_when_the_encoder_shares_our_namespace() {
    one_lane("auto", &[], "shm").await;
}

#[tokio::test]
async fn auto_goes_inline_when_the_encoder_is_on_another_host() {
    let (gateway, _fleet) =
        one_lane("auto", &["--shm-namespace-id", "another-boot:42"], "inline").await;
    let text = metrics_text(&gateway).await;
    assert!(
        metric(
            &text,
            "smg_tensor_lane_fallbacks_total",
            &["requested=\"shm\"", "reason=\"namespace_mismatch\""]
        ) >= 1.0,
        "{text}"
    );
}

#[tokio::test]
async fn a_per_worker_override_beats_the_default() {
    // Default inline, but this encoder is forced onto shm with a threshold
    // low enough for the small image too.
    let shm = ShmDir::in_dev_shm();
    let fleet = fleet(&shm, &[], &[]);
    let encoder_url = fleet.flags[2].clone();
    let override_flag = format!("{encoder_url}=shm,min_bytes=1024");
    let gateway = gateway(
        &fleet,
        "inline",
        &["--worker-tensor-transport", &override_flag],
    );
    let private = shm.names_of(gateway.pid());
    chat_exactly(&gateway, &[MEDIUM, SMALL]).await;
    assert_eq!(
        recorded_lanes(&fleet),
        vec![
            (tensor_bytes(SMALL), "shm".to_owned()),
            (tensor_bytes(MEDIUM), "shm".to_owned()),
        ]
    );
    assert_settles(&gateway, &shm, &private).await;
}

#[tokio::test]
async fn rdma_loopback_carries_the_exact_bytes_and_frees_its_slots() {
    let shm = ShmDir::in_dev_shm();
    let fleet = fleet(&shm, &[], &[]);
    let gateway = gateway(
        &fleet,
        "rdma",
        &[
            "--multimodal-rdma-backend",
            "loopback",
            "--multimodal-rdma-slots",
            "2",
            "--multimodal-rdma-slot-bytes",
            SLOT_BYTES,
        ],
    );
    let arena = shm.names_of(gateway.pid());
    assert_eq!(
        arena.len(),
        2,
        "one arena file and the owner file: {arena:?}"
    );
    // Three requests through a two-slot arena: slots must come back.
    for _ in 0..3 {
        chat_exactly(&gateway, &[MEDIUM, SMALL]).await;
    }
    let lanes = recorded_lanes(&fleet);
    assert_eq!(
        lanes.iter().filter(|(_, lane)| lane == "remote").count(),
        3,
        "{lanes:?}"
    );
    assert!(
        lanes
            .iter()
            .all(|(size, lane)| (lane == "remote") == (*size == tensor_bytes(MEDIUM))),
        "{lanes:?}"
    );
    let text = metrics_text(&gateway).await;
    assert_eq!(
        metric(&text, "smg_tensor_lane_tensors_total", &["lane=\"rdma\""]),
        3.0,
        "{text}"
    );
    assert_eq!(shm.names_of(gateway.pid()), arena, "only the arena file");
    // Every slot comes back once the RPCs have returned.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = metrics_text(&gateway).await;
        if metric(&text, "smg_rdma_slots_in_use", &[]) == 0.0 {
            assert_eq!(metric(&text, "smg_rdma_slots", &[]), 2.0, "{text}");
            break;
        }
        assert!(Instant::now() < deadline, "rdma slots stay in use: {text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn rdma_falls_back_to_inline_and_says_so() {
    let (gateway, _fleet) = one_lane("rdma", &[], "inline").await;
    let text = metrics_text(&gateway).await;
    assert!(
        metric(
            &text,
            "smg_tensor_lane_fallbacks_total",
            &["requested=\"rdma\"", "reason=\"rdma_unavailable\""]
        ) >= 1.0,
        "{text}"
    );
}

#[tokio::test]
async fn a_retry_after_a_refused_encode_sends_a_fresh_name() {
    // The encoder reads (and unlinks) the first name, then refuses; the
    // retry must carry a new name for the same slot.
    let shm = ShmDir::in_dev_shm();
    let fleet = fleet(&shm, &["--refuse-encodes", "1"], &[]);
    let gateway = gateway(&fleet, "shm", &["--retry-initial-backoff-ms", "1"]);
    let private = shm.names_of(gateway.pid());
    chat_exactly(&gateway, &[MEDIUM]).await;
    let lanes = recorded_lanes(&fleet);
    assert_eq!(lanes.len(), 2, "read twice: {lanes:?}");
    assert!(lanes.iter().all(|(_, lane)| lane == "shm"), "{lanes:?}");
    assert_settles(&gateway, &shm, &private).await;
}

/// Fault matrix: the request fails (never hangs) with `expected_code` and
/// the lane settles.
async fn fault(encoder_flags: &[&str], prefill_flags: &[&str], expected_code: &str) {
    let shm = ShmDir::in_dev_shm();
    let fleet = fleet(&shm, encoder_flags, prefill_flags);
    let gateway = gateway(
        &fleet,
        "shm",
        &["--disable-retries", "--multimodal-shm-reclaim-ms", "300"],
    );
    let private = shm.names_of(gateway.pid());
    let messages = messages(&[image_url(MEDIUM)]);
    let (status, body) = support::bounded("faulty chat", chat(&gateway, &messages)).await;
    assert!(status >= 500, "{status}: {body}");
    assert_eq!(body["error"]["code"], expected_code, "{body}");
    assert_settles(&gateway, &shm, &private).await;
}

#[tokio::test]
async fn an_encoder_that_refuses_leaves_nothing_behind() {
    fault(&["--refuse-encodes", "100"], &[], "encode_failed").await;
}

#[tokio::test]
async fn an_encoder_that_dies_mid_rpc_leaves_nothing_behind() {
    fault(&["--exit-on-encode"], &[], "encode_failed").await;
}

#[tokio::test]
async fn a_prefill_that_dies_after_the_encode_leaves_nothing_behind() {
    fault(&[], &["--exit-after-tokens", "0"], "worker_error").await;
}

#[tokio::test]
async fn an_encoder_that_never_unlinks_is_cleaned_up_after_the_deadline() {
    let shm = ShmDir::in_dev_shm();
    let fleet = fleet(&shm, &["--keep-shm-names"], &[]);
    let gateway = gateway(&fleet, "shm", &["--multimodal-shm-reclaim-ms", "300"]);
    let private = shm.names_of(gateway.pid());
    chat_exactly(&gateway, &[MEDIUM]).await;
    assert_eq!(recorded_lanes(&fleet)[0].1, "shm");
    // The worker kept the name; the gateway removes it after the deadline.
    assert_settles(&gateway, &shm, &private).await;
}

#[tokio::test]
async fn a_client_that_disconnects_during_the_encode_frees_its_slot() {
    let shm = ShmDir::in_dev_shm();
    let fleet = fleet(&shm, &["--stall-encodes", "--keep-shm-names"], &[]);
    let gateway = gateway(&fleet, "shm", &["--multimodal-shm-reclaim-ms", "300"]);
    let private = shm.names_of(gateway.pid());
    let messages = messages(&[image_url(MEDIUM)]);
    let request = reqwest::Client::new()
        .post(gateway.url("/v1/chat/completions"))
        .json(&json!({"model": "model", "messages": messages, "max_tokens": 4}))
        .send();
    let client = tokio::spawn(request);
    // The encoder has the tensor (over shm) and stalls: now the client leaves.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !encoder_input_recorded(fleet.record.path()) {
        assert!(!client.is_finished(), "the stalled encode answered");
        assert!(
            Instant::now() < deadline,
            "the encoder never received the image"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    client.abort();
    assert!(client.await.is_err_and(|err| err.is_cancelled()));
    assert_eq!(recorded_lanes(&fleet)[0].1, "shm");
    assert_settles(&gateway, &shm, &private).await;
}

#[tokio::test]
async fn a_killed_gateways_names_are_swept_by_the_next_one() {
    let shm = ShmDir::in_dev_shm();
    let fleet = fleet(&shm, &["--keep-shm-names"], &[]);
    let first = gateway(&fleet, "shm", &[]);
    let first_pid = first.pid();
    chat_exactly(&first, &[MEDIUM]).await;
    let left = shm.names_of(first_pid);
    // Two private slot names, the public name the worker kept, and the
    // owner file (whose lock died with the process).
    assert_eq!(left.len(), 4, "{left:?}");
    drop(first); // SIGKILL: no chance to clean up.
    assert_eq!(
        shm.names_of(first_pid),
        left,
        "a killed gateway leaves its names"
    );
    let second = gateway(&fleet, "shm", &[]);
    assert!(
        shm.names_of(first_pid).is_empty(),
        "the next gateway's start-up sweep removed them"
    );
    chat_exactly(&second, &[MEDIUM]).await;
}

/// Gateway B starting on the shm directory gateway A uses (as a gateway in
/// another PID namespace sharing /dev/shm would) must not sweep A's live
/// names: A's owner-file lock proves it alive. A keeps serving over shm.
#[tokio::test]
async fn a_second_gateway_on_the_same_directory_keeps_the_first_ones_live_names() {
    let shm = ShmDir::in_dev_shm();
    let fleet = fleet(&shm, &[], &[]);
    let first = gateway(&fleet, "shm", &[]);
    let held = shm.names_of(first.pid());
    assert_eq!(held.len(), 3, "two slots and the owner file: {held:?}");
    // Ready means its start-up sweep has run.
    let second = gateway(&fleet, "shm", &[]);
    assert_eq!(
        shm.names_of(first.pid()),
        held,
        "the second gateway's sweep kept the first one's names"
    );
    assert_eq!(shm.names_of(second.pid()).len(), 3);
    chat_exactly(&first, &[MEDIUM]).await;
    assert_eq!(
        recorded_lanes(&fleet),
        vec![(tensor_bytes(MEDIUM), "shm".to_owned())]
    );
    assert_settles(&first, &shm, &held).await;
}

/// Someone removes the lane's slot files under a running gateway: the next
/// image still arrives (inline, counted as a `shm_slot_lost` fallback), the
/// pool is rebuilt, and later images go through shm again.
#[tokio::test]
async fn a_lane_whose_slot_files_are_removed_goes_inline_then_rebuilds() {
    let shm = ShmDir::in_dev_shm();
    let fleet = fleet(&shm, &[], &[]);
    let gateway = gateway(&fleet, "shm", &[]);
    let held = shm.names_of(gateway.pid());
    let slots: Vec<&String> = held.iter().filter(|n| !n.ends_with(".owner")).collect();
    assert_eq!(slots.len(), 2, "{held:?}");
    for name in &slots {
        std::fs::remove_file(shm.path.join(name)).unwrap();
    }
    chat_exactly(&gateway, &[MEDIUM]).await;
    assert_eq!(
        recorded_lanes(&fleet),
        vec![(tensor_bytes(MEDIUM), "inline".to_owned())]
    );
    let text = metrics_text(&gateway).await;
    assert_eq!(
        metric(
            &text,
            "smg_tensor_lane_fallbacks_total",
            &["requested=\"shm\"", "reason=\"shm_slot_lost\""]
        ),
        1.0,
        "{text}"
    );
    // The reclaimer replaces the pool: two fresh slot files.
    let deadline = Instant::now() + Duration::from_secs(10);
    let rebuilt = loop {
        let names = shm.names_of(gateway.pid());
        let fresh: Vec<String> = names
            .iter()
            .filter(|n| !n.ends_with(".owner") && !slots.contains(n))
            .cloned()
            .collect();
        if fresh.len() == 2 {
            break names;
        }
        assert!(
            Instant::now() < deadline,
            "the pool was not rebuilt: {names:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    clear_records(&fleet.record);
    chat_exactly(&gateway, &[MEDIUM]).await;
    assert_eq!(
        recorded_lanes(&fleet),
        vec![(tensor_bytes(MEDIUM), "shm".to_owned())]
    );
    assert_settles(&gateway, &shm, &rebuilt).await;
}

/// How a test takes a published tensor from under the worker about to read
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loss {
    /// Every name of the gateway's but its owner file is unlinked: the
    /// public name the worker was given and both slots' private names.
    Removed,
    /// The public name's file (the slot itself) is truncated to nothing.
    Truncated,
}

/// A Regular TokenSpeed worker reading over shm stops right before it
/// opens the first tensor (`--pause-shm-read`); the test then removes or
/// truncates the gateway's files and lets it go on. The request must end
/// cleanly: retried inline when the gateway still holds the bytes (a
/// `shm_slot_lost` fallback), else 503 `tensor_lost`; never a 400 blaming
/// the client nor a vague 5xx. Then the pool is rebuilt, the next two
/// images (one per slot) go over shm again, no name leaks, and the slot,
/// admission and worker load counters return to 0.
async fn a_tensor_lost_under_its_rpc(mode: &str, loss: Loss, extra: &[&str]) -> LostTensor {
    let shm = ShmDir::in_dev_shm();
    let pause = tempfile::tempdir().unwrap();
    let pause_arg = pause.path().display().to_string();
    let pause_flags = ["--pause-shm-read", pause_arg.as_str()];
    let mut gateway_extra = vec!["--retry-initial-backoff-ms", "1"];
    gateway_extra.extend_from_slice(extra);
    // The reader (the regular worker, or the encoder in EPD) pauses and
    // records into `record`.
    let (gateway, record, _workers) = if mode == "epd" {
        let fleet = fleet(&shm, &pause_flags, &[]);
        let gateway = gateway(&fleet, "shm", &gateway_extra);
        (gateway, fleet.record, fleet._workers)
    } else {
        let record = tempfile::tempdir().unwrap();
        let (record_arg, shm_arg) = (record.path().display().to_string(), shm.arg());
        let mut flags = vec![
            "--zero-delay",
            "--record-dir",
            &record_arg,
            "--shm-dir",
            &shm_arg,
        ];
        flags.extend_from_slice(&pause_flags);
        let worker = SimWorker::start("tokenspeed", "regular", &flags);
        let mut args = vec!["--worker-urls".to_owned(), worker.grpc_url()];
        args.extend(common_flags(&shm));
        args.extend(["--multimodal-tensor-transport", "shm"].map(String::from));
        args.extend(gateway_extra.iter().map(|s| (*s).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        (Gateway::start(&args), record, vec![worker])
    };
    let held = shm.names_of(gateway.pid());
    assert_eq!(held.len(), 3, "two slots and the owner file: {held:?}");

    let messages = messages(&[image_url(MEDIUM)]);
    let request = {
        let gateway_url = gateway.url("/v1/chat/completions");
        let body =
            json!({"model": "model", "messages": messages, "max_tokens": 40, "ignore_eos": true});
        tokio::spawn(async move {
            let response = reqwest::Client::new()
                .post(gateway_url)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            (
                status,
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        })
    };
    // The worker holds the handle and has not opened it yet.
    let paused = pause.path().join("paused");
    let name = support::poll_until("the worker to pause before its shm read", async || {
        std::fs::read_to_string(&paused).ok()
    })
    .await;
    let public = shm.path.join(&name);
    assert!(public.exists(), "the gateway published {name}");
    match loss {
        Loss::Removed => {
            for gone in shm.names_of(gateway.pid()) {
                if !gone.ends_with(".owner") {
                    std::fs::remove_file(shm.path.join(gone)).unwrap();
                }
            }
        }
        Loss::Truncated => {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&public)
                .unwrap()
                .set_len(0)
                .unwrap();
        }
    }
    std::fs::write(pause.path().join("resume"), b"").unwrap();
    let (status, body) = support::bounded("the request whose tensor was lost", request)
        .await
        .unwrap();
    let lost = LostTensor {
        status,
        body,
        lanes: recorded_in(record.path()),
        slot_lost: metric(
            &metrics_text(&gateway).await,
            "smg_tensor_lane_fallbacks_total",
            &["requested=\"shm\"", "reason=\"shm_slot_lost\""],
        ),
    };

    // (Shown when a later step fails.)
    println!(
        "the lost tensor's request: {} {} (worker read {:?}, {} shm_slot_lost fallbacks)",
        lost.status, lost.body, lost.lanes, lost.slot_lost
    );
    // The pool is rebuilt: two fresh slots and the owner file, nothing else.
    let rebuilt = support::poll_until("the pool to be rebuilt", async || {
        let names = shm.names_of(gateway.pid());
        let fresh = names
            .iter()
            .filter(|n| !n.ends_with(".owner") && !held.contains(n))
            .count();
        (fresh == 2 && names.len() == 3).then_some(names)
    })
    .await;
    clear_records(&record);
    for _ in 0..2 {
        chat_exactly(&gateway, &[MEDIUM]).await;
    }
    assert_eq!(
        recorded_in(record.path()),
        vec![(tensor_bytes(MEDIUM), "shm".to_owned()); 2],
        "the rebuilt pool's two slots carry the next images"
    );
    assert_settles(&gateway, &shm, &rebuilt).await;
    let text = metrics_text(&gateway).await;
    assert_eq!(metric(&text, "smg_admission_in_flight", &[]), 0.0, "{text}");
    let (_, listed) = gateway.admin(reqwest::Method::GET, "/workers", None).await;
    for worker in listed["workers"].as_array().unwrap() {
        assert_eq!(worker["in_flight"], 0, "{listed}");
    }
    // Only the rebuilt pool's names remain, in the whole directory.
    assert_eq!(shm.all_names(), rebuilt);
    lost
}

/// How the request whose tensor was lost ended.
struct LostTensor {
    status: u16,
    body: Value,
    /// What the worker recorded reading for it.
    lanes: Vec<(u64, String)>,
    /// `shm_slot_lost` fallbacks counted by then.
    slot_lost: f64,
}

#[tokio::test]
async fn a_slot_removed_before_the_worker_read_it_is_retried_inline() {
    let lost = a_tensor_lost_under_its_rpc("regular", Loss::Removed, &[]).await;
    assert_eq!(
        lost.status, 200,
        "retried with the bytes inline: {}",
        lost.body
    );
    assert_eq!(
        lost.lanes,
        vec![(tensor_bytes(MEDIUM), "inline".to_owned())],
        "the worker could not open the name; the retry carried the bytes"
    );
    assert_eq!(lost.slot_lost, 1.0);
}

#[tokio::test]
async fn a_slot_removed_with_no_retry_left_fails_with_tensor_lost() {
    let lost = a_tensor_lost_under_its_rpc("regular", Loss::Removed, &["--disable-retries"]).await;
    assert_eq!(
        (lost.status, &lost.body["error"]["code"]),
        (503, &json!("tensor_lost")),
        "{}",
        lost.body
    );
    assert_eq!(lost.lanes, vec![], "the worker read nothing");
}

#[tokio::test]
async fn a_slot_truncated_before_the_worker_read_it_fails_with_tensor_lost() {
    // The bytes went with the truncation: nothing to send inline.
    let lost = a_tensor_lost_under_its_rpc("regular", Loss::Truncated, &[]).await;
    assert_eq!(
        (lost.status, &lost.body["error"]["code"]),
        (503, &json!("tensor_lost")),
        "{}",
        lost.body
    );
    assert_eq!((lost.lanes.len(), lost.slot_lost), (0, 0.0));
}

#[tokio::test]
async fn an_encoders_slot_removed_before_it_read_it_is_retried_inline() {
    let lost = a_tensor_lost_under_its_rpc("epd", Loss::Removed, &[]).await;
    assert_eq!(
        lost.status, 200,
        "retried with the bytes inline: {}",
        lost.body
    );
    assert_eq!(
        lost.lanes,
        vec![(tensor_bytes(MEDIUM), "inline".to_owned())]
    );
    assert_eq!(lost.slot_lost, 1.0);
}

#[tokio::test]
async fn a_full_shm_directory_sends_tensors_inline_and_counts_it() {
    // A tmpfs barely larger than the slots when mounting is allowed;
    // otherwise /dev/shm with a free-space reserve nothing can satisfy.
    let large = tensor_bytes(LARGE);
    let (shm, extra) = match ShmDir::small_tmpfs(2 * 262_144 + 64 * 1024) {
        Some(tmpfs) => (tmpfs, Vec::new()),
        None => (
            ShmDir::in_dev_shm(),
            vec![
                "--multimodal-shm-keep-free-bytes".to_owned(),
                u64::MAX.to_string(),
            ],
        ),
    };
    assert!(large > 262_144, "the large image needs a one-off file");
    let fleet = fleet(&shm, &[], &[]);
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let gateway = gateway(&fleet, "shm", &extra);
    let private = shm.names_of(gateway.pid());
    chat_exactly(&gateway, &[LARGE, MEDIUM]).await;
    assert_eq!(
        recorded_lanes(&fleet),
        vec![
            (tensor_bytes(MEDIUM), "shm".to_owned()),
            (large, "inline".to_owned()),
        ],
        "the slot still serves; the one-off file did not fit"
    );
    let text = metrics_text(&gateway).await;
    assert!(
        metric(
            &text,
            "smg_tensor_lane_fallbacks_total",
            &["requested=\"shm\"", "reason=\"shm_no_space\""]
        ) >= 1.0,
        "{text}"
    );
    assert_settles(&gateway, &shm, &private).await;
}

#[tokio::test]
async fn regular_and_pd_tokenspeed_workers_read_mm_inputs_through_shm_too() {
    for mode in ["regular", "pd"] {
        let shm = ShmDir::in_dev_shm();
        let record = tempfile::tempdir().unwrap();
        let record_arg = record.path().display().to_string();
        let shm_arg = shm.arg();
        let reader_flags = [
            "--zero-delay",
            "--record-dir",
            &record_arg,
            "--shm-dir",
            &shm_arg,
        ];
        let mut workers = Vec::new();
        let mut flags: Vec<String> = Vec::new();
        if mode == "regular" {
            let worker = SimWorker::start("tokenspeed", "regular", &reader_flags);
            flags.extend(["--worker-urls".into(), worker.grpc_url()]);
            workers.push(worker);
        } else {
            let prefill = SimWorker::start("tokenspeed", "prefill", &reader_flags);
            let decode = SimWorker::start("tokenspeed", "decode", &["--zero-delay"]);
            flags.extend([
                "--pd-disaggregation".into(),
                "--prefill".into(),
                prefill.grpc_url(),
                prefill.bootstrap_port().to_string(),
                "--decode".into(),
                decode.grpc_url(),
            ]);
            workers.extend([prefill, decode]);
        }
        flags.extend(common_flags(&shm));
        flags.extend(["--multimodal-tensor-transport".into(), "shm".into()]);
        let args: Vec<&str> = flags.iter().map(String::as_str).collect();
        let gateway = Gateway::start(&args);
        let private = shm.names_of(gateway.pid());
        chat_exactly(&gateway, &[MEDIUM]).await;
        assert_eq!(
            recorded_in(record.path()),
            [(tensor_bytes(MEDIUM), "shm".to_owned())],
            "{mode}"
        );
        assert_settles(&gateway, &shm, &private).await;
        drop(workers);
    }
}

/// Registers `url` with the extra `fields`, waits until it is ready, and
/// returns its status.
async fn register_ready(gateway: &Gateway, url: &str, fields: Value) -> Value {
    let mut body = json!({ "url": url });
    body.as_object_mut()
        .unwrap()
        .extend(fields.as_object().unwrap().clone());
    let (status, answer) = gateway
        .admin(reqwest::Method::POST, "/workers", Some(body))
        .await;
    assert_eq!(status, 202, "{answer}");
    let path = format!("/workers/{}", answer["id"].as_str().unwrap());
    support::bounded("registration", async {
        loop {
            let (_, status) = gateway.admin(reqwest::Method::GET, &path, None).await;
            if status["status"] == "ready" {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

/// Removes worker `id` and waits until it has drained and is gone.
async fn remove_worker(gateway: &Gateway, id: &str) {
    let path = format!("/workers/{id}");
    let (status, answer) = gateway.admin(reqwest::Method::DELETE, &path, None).await;
    assert_eq!(status, 202, "{answer}");
    support::bounded("removal", async {
        while gateway.admin(reqwest::Method::GET, &path, None).await.0 != 404 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// The status of the gateway's one worker (`GET /workers` must list exactly
/// one).
async fn the_only_worker(gateway: &Gateway) -> Value {
    let (_, listed) = gateway.admin(reqwest::Method::GET, "/workers", None).await;
    let workers = listed["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 1, "{listed}");
    workers[0].clone()
}

/// `(tensor_transport, shm_min_bytes, tensor_transport_source)` of a status.
fn transport_of(status: &Value) -> (&str, u64, &str) {
    (
        status["tensor_transport"].as_str().unwrap(),
        status["shm_min_bytes"].as_u64().unwrap(),
        status["tensor_transport_source"].as_str().unwrap(),
    )
}

/// A Regular gateway serving `first` (given on the command line), plus
/// `extra` flags.
fn regular_gateway(shm: &ShmDir, first: &SimWorker, extra: &[&str]) -> Gateway {
    let mut args = vec!["--worker-urls".to_owned(), first.grpc_url()];
    args.extend(common_flags(shm));
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Gateway::start(&args)
}

/// A regular TokenSpeed worker recording what it reads into `record`.
fn recording_worker(shm: &ShmDir, record: &tempfile::TempDir) -> SimWorker {
    let record_arg = record.path().display().to_string();
    let shm_arg = shm.arg();
    SimWorker::start(
        "tokenspeed",
        "regular",
        &[
            "--zero-delay",
            "--record-dir",
            &record_arg,
            "--shm-dir",
            &shm_arg,
        ],
    )
}

/// Forgets what a recording worker has recorded so far.
fn clear_records(record: &tempfile::TempDir) {
    for entry in std::fs::read_dir(record.path()).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
}

/// Sends one chat with `images` (of distinct sizes) to a gateway whose only
/// receiver records into `record`, checks it read every one on `lane` (as
/// the worker names it), and returns how many tensors the gateway counted
/// on `counted` (as `/metrics` names it) so far.
async fn read_on(
    gateway: &Gateway,
    record: &tempfile::TempDir,
    images: &[&str],
    lane: &str,
    counted: &str,
) -> f64 {
    chat_exactly(gateway, images).await;
    let mut expected: Vec<(u64, String)> = images
        .iter()
        .map(|name| (tensor_bytes(name), lane.to_owned()))
        .collect();
    expected.sort();
    assert_eq!(recorded_in(record.path()), expected);
    let text = metrics_text(gateway).await;
    metric(
        &text,
        "smg_tensor_lane_tensors_total",
        &[&format!("lane=\"{counted}\"")],
    )
}

#[tokio::test]
async fn a_registered_transport_applies_to_its_worker_until_it_is_removed() {
    // Default inline and no shm anywhere on the command line: the pool is
    // made when the registration asks for shm.
    let shm = ShmDir::in_dev_shm();
    let record = tempfile::tempdir().unwrap();
    let first = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let reader = recording_worker(&shm, &record);
    let gateway = regular_gateway(&shm, &first, &["--multimodal-tensor-transport", "inline"]);
    assert_eq!(shm.names_of(gateway.pid()), Vec::<String>::new());

    // Bad values are refused, and nothing is registered.
    for (fields, code, param) in [
        (
            json!({"tensor_transport": "tcp"}),
            "invalid_parameter",
            "tensor_transport",
        ),
        (
            json!({"shm_min_bytes": 1024}),
            "invalid_parameter",
            "shm_min_bytes",
        ),
        (
            json!({"tensor_transport": "shm", "shm_min_bytes": -1}),
            "invalid_request",
            "shm_min_bytes",
        ),
    ] {
        let mut body = json!({ "url": reader.grpc_url() });
        body.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        let (status, answer) = gateway
            .admin(reqwest::Method::POST, "/workers", Some(body))
            .await;
        assert_eq!(status, 400, "{fields}: {answer}");
        assert_eq!(answer["error"]["code"], code, "{fields}: {answer}");
        assert_eq!(answer["error"]["param"], param, "{fields}: {answer}");
    }
    let listed_first = the_only_worker(&gateway).await;
    let first_id = listed_first["id"].as_str().unwrap().to_owned();
    assert_eq!(transport_of(&listed_first), ("inline", 65536, "default"));

    // shm with a threshold low enough for the small image too.
    let status = register_ready(
        &gateway,
        &reader.grpc_url(),
        json!({"tensor_transport": "shm", "shm_min_bytes": 1024}),
    )
    .await;
    assert_eq!(transport_of(&status), ("shm", 1024, "registration"));
    let reader_id = status["id"].as_str().unwrap().to_owned();
    let private = shm.names_of(gateway.pid());
    assert!(!private.is_empty(), "the registration made no shm pool");
    // The inline worker would keep every tensor inline (every receiver
    // must accept shm); once it is gone the registered one decides.
    remove_worker(&gateway, &first_id).await;
    let on_shm = read_on(&gateway, &record, &[MEDIUM, SMALL], "shm", "shm").await;
    assert_eq!(on_shm, 2.0);
    assert_settles(&gateway, &shm, &private).await;

    // Removed and registered again without the fields: the default again.
    remove_worker(&gateway, &reader_id).await;
    clear_records(&record);
    let status = register_ready(&gateway, &reader.grpc_url(), json!({})).await;
    assert_eq!(transport_of(&status), ("inline", 65536, "default"));
    let inline = read_on(&gateway, &record, &[MEDIUM, SMALL], "inline", "inline").await;
    assert!(inline >= 2.0, "{inline}");
    assert_eq!(
        metric(
            &metrics_text(&gateway).await,
            "smg_tensor_lane_tensors_total",
            &["lane=\"shm\""]
        ),
        2.0
    );
}

#[tokio::test]
async fn a_registered_transport_wins_over_the_flag_for_its_url() {
    // Default auto; the flag sends the reader's tensors through shm, its
    // registration says inline.
    let shm = ShmDir::in_dev_shm();
    let record = tempfile::tempdir().unwrap();
    let first = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let reader = recording_worker(&shm, &record);
    let flag = format!("{}=shm", reader.grpc_url());
    let gateway = regular_gateway(&shm, &first, &["--worker-tensor-transport", &flag]);
    let listed_first = the_only_worker(&gateway).await;
    let first_id = listed_first["id"].as_str().unwrap().to_owned();
    assert_eq!(transport_of(&listed_first), ("auto", 65536, "default"));

    let status = register_ready(
        &gateway,
        &reader.grpc_url(),
        json!({"tensor_transport": "inline"}),
    )
    .await;
    assert_eq!(transport_of(&status), ("inline", 65536, "registration"));
    let reader_id = status["id"].as_str().unwrap().to_owned();
    remove_worker(&gateway, &first_id).await;
    let on_shm = read_on(&gateway, &record, &[MEDIUM], "inline", "shm").await;
    assert_eq!(on_shm, 0.0);

    // Without its registration's word, the flag for its URL applies again.
    remove_worker(&gateway, &reader_id).await;
    clear_records(&record);
    let status = register_ready(&gateway, &reader.grpc_url(), json!({})).await;
    assert_eq!(transport_of(&status), ("shm", 65536, "flag"));
    let private = shm.names_of(gateway.pid());
    let on_shm = read_on(&gateway, &record, &[MEDIUM], "shm", "shm").await;
    assert_eq!(on_shm, 1.0);
    assert_settles(&gateway, &shm, &private).await;
}

#[tokio::test]
async fn a_registration_asking_for_rdma_opens_the_lane() {
    // No rdma on the command line: the loopback arena opens when the
    // registration asks for it.
    let shm = ShmDir::in_dev_shm();
    let record = tempfile::tempdir().unwrap();
    let first = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let reader = recording_worker(&shm, &record);
    let gateway = regular_gateway(
        &shm,
        &first,
        &[
            "--multimodal-tensor-transport",
            "inline",
            "--multimodal-rdma-backend",
            "loopback",
            "--multimodal-rdma-slots",
            "2",
            "--multimodal-rdma-slot-bytes",
            SLOT_BYTES,
        ],
    );
    assert_eq!(shm.names_of(gateway.pid()), Vec::<String>::new());
    let status = register_ready(
        &gateway,
        &reader.grpc_url(),
        json!({"tensor_transport": "rdma"}),
    )
    .await;
    assert_eq!(transport_of(&status), ("rdma", 65536, "registration"));
    assert_eq!(
        shm.names_of(gateway.pid()).len(),
        2,
        "one arena file and the owner file"
    );
    let (_, listed) = gateway.admin(reqwest::Method::GET, "/workers", None).await;
    let first_id = listed["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["url"] != status["url"])
        .map(|w| w["id"].as_str().unwrap().to_owned())
        .unwrap();
    remove_worker(&gateway, &first_id).await;
    let on_rdma = read_on(&gateway, &record, &[MEDIUM], "remote", "rdma").await;
    assert_eq!(on_rdma, 1.0);
}
