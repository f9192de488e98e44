//! What each attack class of issue 19 costs the gateway, and what it does
//! to everyone else: per attack, the gateway's peak resident memory and
//! CPU seconds while the attack runs, and the p50/p99 latency of
//! well-behaved requests sent at the same time, against the same gateway
//! with no attack.
//!
//! Why it exists: issue 19's goal is that no attack raises memory above the
//! configured budgets or other clients' p99 by more than 2x. A test can
//! prove an attack is refused; only a run under load shows what the refusal
//! costs and whether the others notice.
//!
//! Set-up per attack: a fresh gateway (so its peak RSS is this attack's)
//! in front of one zero-delay `smg-sim-worker` (a hostile one, `--hostile`,
//! for the attacks a worker makes), on the bundled test model. Phase one
//! ("quiet"): well-behaved chat completions (`max_tokens` 8) at a fixed
//! Poisson rate for `SMG_BENCH_SECS` (default 8). Phase two: the same
//! traffic with four attackers sending the attack back to back. The RSS
//! is sampled every 20 ms in phase two (peak, and growth over phase one's
//! last reading); CPU is the gateway process's user + system time per
//! phase. Each attack answer's status and size are tallied, and the first
//! is checked to be the refusal (or cut) the fix gives, so a row cannot
//! measure an attack that silently stopped being one.
//!
//! The "before" column is the adversarial probe's figure quoted in issue
//! 19, measured on the code before the fixes with its own harness; the
//! rows here measure the code as it is. Prints a table and writes
//! `bench-results/attacks.json`. Run: `cargo bench --bench attacks`
//! (`SMG_BENCH_ONLY`, a `|`-separated list of labels, runs only those;
//! `SMG_BENCH_VARIANTS`, a `|`-separated list of extra gateway flags,
//! runs every attack once per variant, one after the other, e.g.
//! `--cpu-work-nice 0|--cpu-work-nice 10`). The sim worker's CPU seconds
//! are given too: for a worker's attacks it burns CPU making the flood,
//! on the same cores.
//! Not a test: nothing here asserts a speed.

// The e2e harness (process start-up, ports, the fixtures); its digest unit
// tests are not run here, so their imports look unused in this target.
#[path = "../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

mod common;

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use base64::Engine as _;
use common::{cpu_seconds, load_average, mib, open_loop, percentile, proc_status_bytes};
use serde_json::{Value, json};
use support::{Gateway, SimWorker};

/// Well-behaved requests per second in both phases.
const RATE: f64 = 40.0;
/// Attackers sending back to back.
const ATTACKERS: usize = 4;

/// One attack class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    NestedJson,
    PngProfileBomb,
    JpegScanFlood,
    WorkerOverrun,
    LogprobFlood,
    RoutingKeys,
    HugeReference,
}

impl Class {
    const ALL: [Class; 7] = [
        Class::NestedJson,
        Class::PngProfileBomb,
        Class::JpegScanFlood,
        Class::WorkerOverrun,
        Class::LogprobFlood,
        Class::RoutingKeys,
        Class::HugeReference,
    ];

    fn label(self) -> &'static str {
        match self {
            Class::NestedJson => "nested_json",
            Class::PngProfileBomb => "png_profile_bomb",
            Class::JpegScanFlood => "jpeg_scan_flood",
            Class::WorkerOverrun => "worker_overrun",
            Class::LogprobFlood => "logprob_flood",
            Class::RoutingKeys => "routing_keys",
            Class::HugeReference => "huge_reference",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Class::NestedJson => "40 KB body, 20,000 nested arrays",
            Class::PngProfileBomb => "PNG whose iCCP inflates to 256 MiB",
            Class::JpegScanFlood => "progressive JPEG, 1,000 scans",
            Class::WorkerOverrun => "worker streams 1M tokens, 16 asked",
            Class::LogprobFlood => "worker sends 100,000 alternatives, 5 asked",
            Class::RoutingKeys => "100 KB X-SMG-Routing-Key each, --policy manual",
            Class::HugeReference => "1.5 MB file:// image reference",
        }
    }

    /// The probe's figure on the code before the fixes (issue 19).
    fn before(self) -> &'static str {
        match self {
            Class::NestedJson => "process killed (stack overflow)",
            Class::PngProfileBomb => "6 GB RSS (3 MB PNG)",
            Class::JpegScanFlood => "7 s of a data-plane core each",
            Class::WorkerOverrun => "10M tokens (4.4 GB) to the client",
            Class::LogprobFlood => "100,000 alternatives to the client",
            Class::RoutingKeys => "+335 MB for 3,000 keys, kept 30 min",
            Class::HugeReference => "1.5 MB error body",
        }
    }

    fn hostile(self) -> &'static [&'static str] {
        match self {
            Class::WorkerOverrun => &[
                "--hostile",
                "overrun-tokens=1000000",
                "--hostile",
                "only-for=ATTACK",
            ],
            Class::LogprobFlood => &[
                "--hostile",
                "logprobs=100000",
                "--hostile",
                "only-for=ATTACK",
            ],
            _ => &[],
        }
    }

    fn gateway_flags(self) -> &'static [&'static str] {
        match self {
            // Heads large enough for the keys (the default 64 KiB refuses
            // them at the door, which is no test of the key store).
            Class::RoutingKeys => &["--policy", "manual", "--max-header-size", "256KiB"],
            _ => &[],
        }
    }
}

/// One attack request, ready to send many times.
struct Attack {
    body: Arc<Vec<u8>>,
    /// `X-SMG-Routing-Key` of this size, different every time.
    routing_key_bytes: usize,
    /// What the first answer must be: a status and a phrase in its body.
    expect: (u16, &'static str),
}

fn zlib_of_zeros(len: usize) -> Vec<u8> {
    let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    let block = vec![0u8; 1 << 16];
    let mut left = len;
    while left > 0 {
        let n = left.min(block.len());
        encoder.write_all(&block[..n]).expect("in memory");
        left -= n;
    }
    encoder.finish().expect("in memory")
}

fn png_chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut chunk = u32::try_from(data.len())
        .expect("a small chunk")
        .to_be_bytes()
        .to_vec();
    chunk.extend_from_slice(kind);
    chunk.extend_from_slice(data);
    let mut crc = flate2::Crc::new();
    crc.update(kind);
    crc.update(data);
    chunk.extend_from_slice(&crc.sum().to_be_bytes());
    chunk
}

fn image_fixture(name: &str) -> Vec<u8> {
    let path = common::images_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// A small PNG with an iCCP chunk whose profile inflates to 256 MiB.
fn png_profile_bomb() -> Vec<u8> {
    let png = image_fixture("tiny_20x20.png");
    // Signature (8), then IHDR: length, type, 13 bytes, CRC.
    let after_ihdr = 8 + 4 + 4 + 13 + 4;
    let mut profile = b"bomb\0\0".to_vec();
    profile.extend_from_slice(&zlib_of_zeros(256 << 20));
    let mut out = png[..after_ihdr].to_vec();
    out.extend_from_slice(&png_chunk(b"iCCP", &profile));
    out.extend_from_slice(&png[after_ihdr..]);
    out
}

/// A progressive JPEG whose last scan is repeated up to `total` scans.
fn jpeg_with_scans(total: usize) -> Vec<u8> {
    let jpeg = image_fixture("progressive_333x517.jpg");
    let starts: Vec<usize> = jpeg
        .windows(2)
        .enumerate()
        .filter(|(_, pair)| *pair == [0xFF, 0xDA])
        .map(|(at, _)| at)
        .collect();
    let end = jpeg.len() - 2;
    let last_scan = &jpeg[starts[starts.len() - 1]..end];
    let mut out = jpeg[..end].to_vec();
    for _ in starts.len()..total {
        out.extend_from_slice(last_scan);
    }
    out.extend_from_slice(&[0xFF, 0xD9]);
    out
}

fn image_chat(bytes: &[u8], mime: &str) -> Value {
    let url = format!(
        "data:{mime};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    );
    json!({"model": "model", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "What is in the picture?"}]}]})
}

fn attack(class: Class) -> Attack {
    let chat = |body: Value| Arc::new(serde_json::to_vec(&body).expect("JSON"));
    let plain = json!({"model": "model", "max_tokens": 8,
        "messages": [{"role": "user", "content": "Hello there"}]});
    match class {
        Class::NestedJson => {
            // In a field the gateway reads, so the error path (which once
            // walked the nesting recursively to name the bad field) runs.
            let mut body = br#"{"model":"model","max_tokens":8,"messages":"#.to_vec();
            body.extend(std::iter::repeat_n(b'[', 20_000));
            body.extend(std::iter::repeat_n(b']', 20_000));
            body.push(b'}');
            Attack {
                body: Arc::new(body),
                routing_key_bytes: 0,
                expect: (400, "invalid_request"),
            }
        }
        Class::PngProfileBomb => Attack {
            body: chat(image_chat(&png_profile_bomb(), "image/png")),
            routing_key_bytes: 0,
            expect: (400, "iCCP"),
        },
        Class::JpegScanFlood => Attack {
            body: chat(image_chat(&jpeg_with_scans(1000), "image/jpeg")),
            routing_key_bytes: 0,
            expect: (400, "scan"),
        },
        Class::WorkerOverrun => Attack {
            body: chat(json!({"model": "model", "max_tokens": 16, "stream": true,
                "messages": [{"role": "user", "content": "ATTACK"}]})),
            routing_key_bytes: 0,
            expect: (200, "[DONE]"),
        },
        Class::LogprobFlood => Attack {
            body: chat(json!({"model": "model", "max_tokens": 16, "logprobs": true,
                "top_logprobs": 5, "messages": [{"role": "user", "content": "ATTACK"}]})),
            routing_key_bytes: 0,
            // 16 tokens of 100,000 alternatives is one message of ~10 MB,
            // over the 4 MiB this request's answer may take: refused from
            // its length prefix, undecoded (engine/decode_limit.rs).
            expect: (502, "worker_protocol_violation"),
        },
        Class::RoutingKeys => Attack {
            body: chat(plain),
            routing_key_bytes: 100 << 10,
            expect: (200, "chat.completion"),
        },
        Class::HugeReference => {
            let path = "a".repeat(1_500_000);
            Attack {
                body: chat(image_chat_url(&format!("file:///{path}.png"))),
                routing_key_bytes: 0,
                expect: (400, "invalid_image_url"),
            }
        }
    }
}

fn image_chat_url(url: &str) -> Value {
    json!({"model": "model", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "What is in the picture?"}]}]})
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client")
}

/// A routing key of `len` bytes, different for each `serial`.
fn routing_key(len: usize, serial: u64) -> String {
    let mut key = format!("{serial:016x}");
    key.extend(std::iter::repeat_n('k', len.saturating_sub(key.len())));
    key
}

/// Sends the attack once: its status and body size (the body read to the
/// end, as an attacker would).
async fn send_attack(
    client: &reqwest::Client,
    url: &str,
    attack: &Attack,
    serial: u64,
) -> Option<(u16, usize, String)> {
    let mut request = client
        .post(url)
        .header("content-type", "application/json")
        .body(attack.body.as_ref().clone());
    if attack.routing_key_bytes > 0 {
        request = request.header(
            "x-smg-routing-key",
            routing_key(attack.routing_key_bytes, serial),
        );
    }
    let response = request.send().await.ok()?;
    let status = response.status().as_u16();
    let body = response.bytes().await.ok()?;
    let head = String::from_utf8_lossy(&body[..body.len().min(4096)]).into_owned();
    let tail = String::from_utf8_lossy(&body[body.len().saturating_sub(64)..]).into_owned();
    Some((status, body.len(), format!("{head}…{tail}")))
}

#[derive(Debug, Default)]
struct Phase {
    p50: f64,
    p99: f64,
    sent: usize,
    failed: usize,
    cpu: f64,
    worker_cpu: f64,
}

async fn well_behaved(gateway: &Gateway, seconds: f64, seed: u64) -> (Vec<f64>, usize) {
    let client = http();
    let url = gateway.url("/v1/chat/completions");
    let body = json!({"model": "model", "max_tokens": 8,
        "messages": [{"role": "user", "content": "Hello there, how are you?"}]});
    open_loop(RATE, Duration::from_secs_f64(seconds), seed, move || {
        let (client, url, body) = (client.clone(), url.clone(), body.clone());
        async move {
            match client.post(&url).json(&body).send().await {
                Ok(response) if response.status().is_success() => response.bytes().await.is_ok(),
                _ => false,
            }
        }
    })
    .await
}

fn phase(mut latencies: Vec<f64>, failed: usize, cpu: f64, worker_cpu: f64) -> Phase {
    latencies.sort_by(f64::total_cmp);
    Phase {
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
        sent: latencies.len() + failed,
        failed,
        cpu,
        worker_cpu,
    }
}

#[derive(Debug)]
struct Row {
    class: Class,
    /// The extra gateway flags of this run.
    variant: String,
    quiet: Phase,
    attacked: Phase,
    attacks: u64,
    statuses: Vec<(u16, u64)>,
    largest_answer: usize,
    rss_before: u64,
    rss_peak: u64,
}

async fn run(class: Class, variant: &str, seconds: f64) -> Row {
    let mut worker_args = vec!["--zero-delay"];
    worker_args.extend_from_slice(class.hostile());
    let worker = SimWorker::start("tokenspeed", "regular", &worker_args);
    let mut args = vec![
        "--worker-urls".to_owned(),
        worker.grpc_url(),
        "--served-model-name".to_owned(),
        "model".to_owned(),
        "--allowed-local-media-path".to_owned(),
        common::images_dir().display().to_string(),
    ];
    args.extend(class.gateway_flags().iter().map(|flag| (*flag).to_owned()));
    args.extend(variant.split_whitespace().map(str::to_owned));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let gateway = Gateway::start(&args);
    let pid = gateway.pid();
    let worker_pid = worker.pid();
    let worker_cpu = || cpu_seconds(worker_pid).unwrap_or(f64::NAN);
    let attack = Arc::new(attack(class));
    let url = gateway.url("/v1/chat/completions");

    // The attack is still one: its first answer is the refusal or cut.
    let client = http();
    let (status, _, body) = send_attack(&client, &url, &attack, 0)
        .await
        .expect("the attack is answered");
    let (want_status, phrase) = attack.expect;
    assert!(
        status == want_status && body.contains(phrase),
        "{}: {status} {}",
        class.label(),
        &body[..body.len().min(600)]
    );

    // Warm up, then the quiet phase.
    let _ = well_behaved(&gateway, 1.0, 1).await;
    let (cpu0, worker0) = (cpu_seconds(pid).unwrap_or(f64::NAN), worker_cpu());
    let (latencies, failed) = well_behaved(&gateway, seconds, 7).await;
    let (cpu1, worker1) = (cpu_seconds(pid).unwrap_or(f64::NAN), worker_cpu());
    let quiet = phase(latencies, failed, cpu1 - cpu0, worker1 - worker0);
    let rss_before = proc_status_bytes(pid, "VmRSS:").unwrap_or(0);

    // The attack phase: attackers back to back, the RSS sampled.
    let stop = Arc::new(AtomicBool::new(false));
    let serial = Arc::new(AtomicU64::new(1));
    let peak = Arc::new(AtomicU64::new(rss_before));
    let sampler = {
        let (stop, peak) = (Arc::clone(&stop), Arc::clone(&peak));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some(rss) = proc_status_bytes(pid, "VmRSS:") {
                    peak.fetch_max(rss, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let attackers: Vec<_> = (0..ATTACKERS)
        .map(|_| {
            let (stop, serial, attack, url) = (
                Arc::clone(&stop),
                Arc::clone(&serial),
                Arc::clone(&attack),
                url.clone(),
            );
            tokio::spawn(async move {
                let client = http();
                let mut seen: Vec<(u16, u64)> = Vec::new();
                let mut largest = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let n = serial.fetch_add(1, Ordering::Relaxed);
                    let status = match send_attack(&client, &url, &attack, n).await {
                        Some((status, len, _)) => {
                            largest = largest.max(len);
                            status
                        }
                        None => 0,
                    };
                    tally(&mut seen, status, 1);
                }
                (seen, largest)
            })
        })
        .collect();
    let (cpu2, worker2) = (cpu_seconds(pid).unwrap_or(f64::NAN), worker_cpu());
    let (latencies, failed) = well_behaved(&gateway, seconds, 7).await;
    let (cpu3, worker3) = (cpu_seconds(pid).unwrap_or(f64::NAN), worker_cpu());
    stop.store(true, Ordering::Relaxed);
    let mut statuses: Vec<(u16, u64)> = Vec::new();
    let mut largest_answer = 0;
    for attacker in attackers {
        let (seen, largest) = attacker.await.unwrap_or_default();
        largest_answer = largest_answer.max(largest);
        for (status, count) in seen {
            tally(&mut statuses, status, count);
        }
    }
    statuses.sort_unstable();
    let _ = sampler.join();
    let rss_peak = peak
        .load(Ordering::Relaxed)
        .max(proc_status_bytes(pid, "VmHWM:").unwrap_or(0));
    Row {
        class,
        variant: variant.to_owned(),
        quiet,
        attacked: phase(latencies, failed, cpu3 - cpu2, worker3 - worker2),
        attacks: statuses.iter().map(|(_, count)| count).sum(),
        statuses,
        largest_answer,
        rss_before,
        rss_peak,
    }
}

/// Adds `count` answers of `status` to `statuses`.
fn tally(statuses: &mut Vec<(u16, u64)>, status: u16, count: u64) {
    match statuses.iter_mut().find(|(seen, _)| *seen == status) {
        Some((_, total)) => *total += count,
        None => statuses.push((status, count)),
    }
}

fn main() {
    let seconds: f64 = std::env::var("SMG_BENCH_SECS")
        .ok()
        .and_then(|secs| secs.parse().ok())
        .unwrap_or(8.0);
    let only: Option<Vec<String>> = std::env::var("SMG_BENCH_ONLY")
        .ok()
        .map(|list| list.split('|').map(str::to_owned).collect());
    let variants: Vec<String> = std::env::var("SMG_BENCH_VARIANTS")
        .map(|list| list.split('|').map(|v| v.trim().to_owned()).collect())
        .unwrap_or_else(|_| vec![String::new()]);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "attacks: {RATE} well-behaved chats/s, {ATTACKERS} attackers, {seconds} s per phase, load {:.2}",
        load_average().unwrap_or(f64::NAN)
    );
    let mut rows = Vec::new();
    for class in Class::ALL {
        if only
            .as_ref()
            .is_some_and(|only| !only.iter().any(|label| label == class.label()))
        {
            continue;
        }
        for variant in &variants {
            let row = runtime.block_on(run(class, variant, seconds));
            println!(
                "{:<17} [{}] attacks {:>6} {:?} largest answer {} B; RSS {:.0} -> peak {:.0} MiB; CPU {:.2} -> {:.2} s (worker {:.2} -> {:.2}); p50 {:.1} -> {:.1} ms, p99 {:.1} -> {:.1} ms ({} / {} failed); load {:.2}",
                row.class.label(),
                row.variant,
                row.attacks,
                row.statuses,
                row.largest_answer,
                mib(row.rss_before),
                mib(row.rss_peak),
                row.quiet.cpu,
                row.attacked.cpu,
                row.quiet.worker_cpu,
                row.attacked.worker_cpu,
                row.quiet.p50,
                row.attacked.p50,
                row.quiet.p99,
                row.attacked.p99,
                row.quiet.failed,
                row.attacked.failed,
                load_average().unwrap_or(f64::NAN),
            );
            rows.push(row);
        }
    }

    println!();
    println!(
        "| attack | gateway flags | before (issue 19's probe) | attacks answered (status × count) | largest answer | gateway RSS quiet → peak | gateway CPU s quiet → attacked | worker CPU s quiet → attacked | others' p50 quiet → attacked | others' p99 quiet → attacked |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for row in &rows {
        let statuses = row
            .statuses
            .iter()
            .map(|(status, count)| format!("{status} × {count}"))
            .collect::<Vec<_>>()
            .join(", ");
        println!(
            "| `{}`: {} | {} | {} | {} | {} B | {:.0} → {:.0} MiB | {:.2} → {:.2} | {:.2} → {:.2} | {:.1} → {:.1} ms | {:.1} → {:.1} ms |",
            row.class.label(),
            row.class.what(),
            if row.variant.is_empty() {
                "(defaults)"
            } else {
                row.variant.as_str()
            },
            row.class.before(),
            statuses,
            row.largest_answer,
            mib(row.rss_before),
            mib(row.rss_peak),
            row.quiet.cpu,
            row.attacked.cpu,
            row.quiet.worker_cpu,
            row.attacked.worker_cpu,
            row.quiet.p50,
            row.attacked.p50,
            row.quiet.p99,
            row.attacked.p99,
        );
    }
    let json: Vec<Value> = rows
        .iter()
        .map(|row| {
            json!({
                "attack": row.class.label(),
                "gateway_flags": row.variant,
                "worker_cpu_quiet_s": row.quiet.worker_cpu,
                "worker_cpu_attacked_s": row.attacked.worker_cpu,
                "attacks": row.attacks,
                "statuses": row.statuses,
                "largest_answer_bytes": row.largest_answer,
                "rss_quiet_bytes": row.rss_before,
                "rss_peak_bytes": row.rss_peak,
                "cpu_quiet_s": row.quiet.cpu,
                "cpu_attacked_s": row.attacked.cpu,
                "p50_quiet_ms": row.quiet.p50,
                "p50_attacked_ms": row.attacked.p50,
                "p99_quiet_ms": row.quiet.p99,
                "p99_attacked_ms": row.attacked.p99,
                "sent_quiet": row.quiet.sent,
                "sent_attacked": row.attacked.sent,
                "failed_quiet": row.quiet.failed,
                "failed_attacked": row.attacked.failed,
            })
        })
        .collect();
    let _ = std::fs::create_dir_all("bench-results");
    let _ = std::fs::write(
        "bench-results/attacks.json",
        serde_json::to_string_pretty(&json).unwrap_or_default(),
    );
}
