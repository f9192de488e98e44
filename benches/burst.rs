//! Issue 15's burst: N keep-alive clients (10,000 by default), one
//! connection each, send one chat at the same moment to a gateway in front
//! of zero-delay `smg-sim-worker`s. Reports the time to answer them all,
//! p50/p99, the answers by status and code, and the gateway's resident
//! memory: settled before the burst, at its peak, with the burst's
//! connections still open and idle, and settled after they closed; the
//! difference between the last two, divided by the connections the
//! gateway reported open (the client's pool may carry two requests on one
//! connection, so there can be fewer than N), is what one idle client
//! connection costs. For requests that got no answer, the row names the
//! innermost error (reset, closed before the answer, ...), and it records
//! the connections the gateway closed or refused meanwhile and the
//! kernel's listen-queue and reset counters (`nstat`).
//!
//! Why it exists: the burst used to take the gateway from 175 MiB
//! to 865 MiB, and a test cannot say whether memory comes back or how
//! much a connection costs; only a run can.
//!
//! Each clients' connection is its own TCP connection (HTTP/1.1
//! keep-alive), so the process needs N + a few hundred file descriptors,
//! and so does the gateway (`ulimit -n`; the gateway gets
//! `--max-connections` N + 1000). RSS is read from `/proc/PID/status`
//! (`VmRSS`, `VmHWM` for the peak), sampled every 20 ms. "Settled" is the
//! lowest reading over `SMG_BENCH_SETTLE_SECS` (default 5) once the
//! gateway reports its client connections closed.
//!
//! Run: `cargo bench --bench burst` (`SMG_BENCH_CLIENTS`, default 10000;
//! `SMG_BENCH_WORKERS`, default 1). The gateway inherits the bench's
//! environment, so allocator options go on the command line
//! (`MIMALLOC_PURGE_DELAY=0 cargo bench --bench burst`), and extra gateway
//! flags in `SMG_BENCH_GATEWAY_ARGS`. `SMG_BENCH_LEGACY=1` runs the
//! gateway with issue 15's pool, breaker and back-pressure switched off as
//! far as flags go ([`LEGACY_ARGS`]: one HTTP/2 connection per worker, no
//! circuit breaker, no per-worker in-flight limit), for the comparison
//! row; what flags cannot switch off (GOAWAY resends, the breaker's
//! counting rules, the listener fixes) stays on.
//! Prints a table and writes `bench-results/burst.json`. Not a test:
//! nothing here asserts a speed or a size.

// The e2e harness (process start-up, ports, the fixtures); its digest unit
// tests are not run here, so their imports look unused in this target.
#[path = "../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{env_or, load_average, mib, percentile, proc_status_bytes};
use serde_json::{Value, json};
use support::{Gateway, SimWorker};

/// The gateway flags of `SMG_BENCH_LEGACY=1`: issue 15's worker
/// connection pool, circuit breaker and per-worker in-flight limit off.
const LEGACY_ARGS: &str =
    "--worker-connections 1 --disable-circuit-breaker --worker-max-in-flight none";

fn chat_body() -> Value {
    json!({
        "model": "model",
        "messages": [{"role": "user", "content": "Hello, burst."}],
        "max_tokens": 4,
    })
}

/// The gateway's open client connections (`smg_http_connections`, public
/// listener).
async fn open_connections(gateway: &Gateway) -> Option<f64> {
    let text = reqwest::get(format!("http://{}/metrics", gateway.metrics))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    text.lines()
        .filter(|line| line.starts_with("smg_http_connections{") && line.contains("public"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .reduce(f64::max)
}

/// The gateway's counts of connections it closed or refused
/// (`smg_http_connections_closed_total`, `smg_http_refusals_total`), one
/// entry per labelled sample: whether a failure the clients saw was the
/// gateway's doing (a timer, `--max-connections`).
async fn gateway_closures(gateway: &Gateway) -> BTreeMap<String, f64> {
    let Ok(response) = reqwest::get(format!("http://{}/metrics", gateway.metrics)).await else {
        return BTreeMap::new();
    };
    let text = response.text().await.unwrap_or_default();
    text.lines()
        .filter(|line| {
            line.starts_with("smg_http_connections_closed_total")
                || line.starts_with("smg_http_refusals_total")
        })
        .filter_map(|line| {
            let (sample, value) = line.rsplit_once(' ')?;
            Some((sample.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// Counters of the kernel's TCP stack (`nstat -az`) that tell whether
/// connections were lost before the gateway accepted them: the listen
/// queue overflowing (`TcpExtListenOverflows`, `TcpExtListenDrops`), SYN
/// cookies sent, resets. `None` without `nstat`.
fn tcp_counters() -> Option<BTreeMap<String, u64>> {
    const WANTED: [&str; 7] = [
        "TcpExtListenOverflows",
        "TcpExtListenDrops",
        "TcpExtSyncookiesSent",
        "TcpExtTCPReqQFullDrop",
        "TcpExtTCPAbortOnData",
        "TcpOutRsts",
        "TcpExtTCPTimeouts",
    ];
    let output = std::process::Command::new("nstat")
        .args(["-asz", "--json"])
        .output()
        .ok()?;
    let json: Value = serde_json::from_slice(&output.stdout).ok()?;
    let counters = json["kernel"].as_object()?;
    Some(
        WANTED
            .iter()
            .map(|name| {
                (
                    name.to_string(),
                    counters.get(*name).and_then(Value::as_u64).unwrap_or(0),
                )
            })
            .collect(),
    )
}

/// `after - before`, per counter.
fn counter_delta(
    before: &Option<BTreeMap<String, u64>>,
    after: &Option<BTreeMap<String, u64>>,
) -> BTreeMap<String, u64> {
    let (Some(before), Some(after)) = (before, after) else {
        return BTreeMap::new();
    };
    after
        .iter()
        .map(|(name, value)| {
            let was = before.get(name).copied().unwrap_or(0);
            (name.clone(), value.saturating_sub(was))
        })
        .collect()
}

/// The lowest RSS over `window`, sampled every 20 ms.
async fn settled_rss(pid: u32, window: Duration) -> u64 {
    let until = Instant::now() + window;
    let mut lowest = u64::MAX;
    while Instant::now() < until {
        lowest = lowest.min(proc_status_bytes(pid, "VmRSS:").unwrap_or(u64::MAX));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    lowest
}

/// What a request that got no answer met, as its answer's key: the stage
/// (`connect`, `timeout`, else `transport`) and the innermost cause in the
/// error's chain (`Connection reset by peer (os error 104)`, `connection
/// closed before message completed`, ...), so a row says which it was.
fn transport_failure(err: &reqwest::Error) -> String {
    let stage = if err.is_connect() {
        "connect"
    } else if err.is_timeout() {
        "timeout"
    } else {
        "transport"
    };
    let mut innermost: &dyn std::error::Error = err;
    while let Some(cause) = innermost.source() {
        innermost = cause;
    }
    format!("{stage} error: {innermost}")
}

#[derive(Debug, Default)]
struct Burst {
    answers: BTreeMap<String, usize>,
    latencies_ms: Vec<f64>,
    elapsed: Duration,
}

/// `clients` clients, one connection each, released together; returns the
/// answers and the client, whose connections stay open until it is
/// dropped.
async fn burst(gateway: &Gateway, clients: usize) -> (Burst, reqwest::Client) {
    let client = reqwest::Client::builder()
        .http1_only()
        .pool_max_idle_per_host(clients)
        .pool_idle_timeout(None)
        .timeout(Duration::from_secs(300))
        .build()
        .expect("client");
    let url = gateway.url("/v1/chat/completions");
    let start = Arc::new(tokio::sync::Barrier::new(clients + 1));
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (client, url, start) = (client.clone(), url.clone(), Arc::clone(&start));
            tokio::spawn(async move {
                start.wait().await;
                let sent = Instant::now();
                let answer = match client.post(url).json(&chat_body()).send().await {
                    Ok(response) => {
                        let status = response.status().as_u16();
                        let body: Value = response.json().await.unwrap_or(Value::Null);
                        match body["error"]["code"].as_str() {
                            Some(code) => format!("{status} {code}"),
                            None => status.to_string(),
                        }
                    }
                    Err(err) => transport_failure(&err),
                };
                (answer, sent.elapsed())
            })
        })
        .collect();
    start.wait().await;
    let began = Instant::now();
    let mut result = Burst::default();
    for task in tasks {
        let Ok((answer, took)) = task.await else {
            continue;
        };
        *result.answers.entry(answer).or_default() += 1;
        result.latencies_ms.push(took.as_secs_f64() * 1000.0);
    }
    result.elapsed = began.elapsed();
    result
        .latencies_ms
        .sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    (result, client)
}

async fn run(
    clients: usize,
    workers: usize,
    settle: Duration,
    gateway_env: &str,
    gateway_args: &str,
) -> Value {
    let sims: Vec<SimWorker> = (0..workers)
        .map(|_| SimWorker::start("tokenspeed", "regular", &["--zero-delay"]))
        .collect();
    let urls: Vec<String> = sims.iter().map(SimWorker::grpc_url).collect();
    let max_connections = (clients + 1000).to_string();
    let mut args = vec!["--worker-urls"];
    args.extend(urls.iter().map(String::as_str));
    args.extend(["--served-model-name", "model"]);
    args.extend(["--max-connections", max_connections.as_str()]);
    args.extend(gateway_args.split_whitespace());
    let gateway = Gateway::start(&args);
    let pid = gateway.pid();

    // Warm: a few hundred requests, so the baseline has its pools, caches
    // and tokenizer state.
    let (_, warm) = burst(&gateway, 200).await;
    drop(warm);
    let before = settled_rss(pid, settle).await;

    let sampling = Arc::new(AtomicBool::new(true));
    let peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (sampling, peak) = (Arc::clone(&sampling), Arc::clone(&peak));
        tokio::spawn(async move {
            while sampling.load(Ordering::Relaxed) {
                if let Some(rss) = proc_status_bytes(pid, "VmRSS:") {
                    peak.fetch_max(rss, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let tcp_before = tcp_counters();
    let closures_before = gateway_closures(&gateway).await;
    let (result, client) = burst(&gateway, clients).await;
    let tcp = counter_delta(&tcp_before, &tcp_counters());
    let closures: BTreeMap<String, f64> = gateway_closures(&gateway)
        .await
        .into_iter()
        .map(|(sample, value)| {
            let was = closures_before.get(&sample).copied().unwrap_or(0.0);
            (sample, value - was)
        })
        .filter(|(_, delta)| *delta > 0.0)
        .collect();
    sampling.store(false, Ordering::Relaxed);
    let _ = sampler.await;
    let peak = peak
        .load(Ordering::Relaxed)
        .max(proc_status_bytes(pid, "VmHWM:").unwrap_or(0));
    let open = open_connections(&gateway).await.unwrap_or(f64::NAN);
    let held = settled_rss(pid, settle).await;

    drop(client);
    let closing = Instant::now();
    while open_connections(&gateway).await.unwrap_or(0.0) > 1.0
        && closing.elapsed() < Duration::from_secs(60)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = settled_rss(pid, settle).await;

    let (answered, p50, p99) = (
        result.latencies_ms.len(),
        percentile(&result.latencies_ms, 0.50),
        percentile(&result.latencies_ms, 0.99),
    );
    // Per connection the gateway held open: the client's pool may carry
    // some requests on a connection another request already used, so there
    // can be fewer connections than clients.
    let connections = if open.is_finite() && open >= 1.0 {
        open
    } else {
        clients.max(1) as f64
    };
    let per_connection = held.saturating_sub(after) as f64 / connections;
    println!(
        "burst of {clients} on {workers} worker(s): {answered} answered in {:.2} s, p50 {p50:.0} ms, \
         p99 {p99:.0} ms, {:?}; RSS {:.0} MiB before, {:.0} peak, {:.0} with {open} connections \
         idle, {:.0} after they closed; {:.1} KiB per idle connection",
        result.elapsed.as_secs_f64(),
        result.answers,
        mib(before),
        mib(peak),
        mib(held),
        mib(after),
        per_connection / 1024.0,
    );
    println!("during the burst: gateway closed/refused {closures:?}; kernel TCP {tcp:?}");
    json!({
        "clients": clients,
        "workers": workers,
        "gateway_env": gateway_env,
        "gateway_args": gateway_args,
        "seconds_to_answer_all": result.elapsed.as_secs_f64(),
        "p50_ms": p50,
        "p99_ms": p99,
        "answers": result.answers,
        "rss_before_bytes": before,
        "rss_peak_bytes": peak,
        "rss_connections_idle_bytes": held,
        "connections_open": open,
        "rss_after_bytes": after,
        "bytes_per_idle_connection": per_connection,
        "gateway_closed_or_refused": closures,
        "kernel_tcp": tcp,
    })
}

fn main() {
    let clients: usize = env_or("SMG_BENCH_CLIENTS", 10_000);
    let workers: usize = env_or("SMG_BENCH_WORKERS", 1);
    let settle = Duration::from_secs(env_or("SMG_BENCH_SETTLE_SECS", 5));
    // The allocator options the gateway inherits, recorded with the row.
    let gateway_env = std::env::vars()
        .filter(|(key, _)| key.starts_with("MIMALLOC_"))
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(" ");
    // Extra gateway flags, whitespace-separated (an experiment's
    // `--header-read-timeout-secs 2`), recorded with the row.
    let extra_args = std::env::var("SMG_BENCH_GATEWAY_ARGS").unwrap_or_default();
    let legacy = env_or("SMG_BENCH_LEGACY", 0u8) != 0;
    let gateway_args = if legacy {
        format!("{LEGACY_ARGS} {extra_args}").trim().to_owned()
    } else {
        extra_args
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let load_before = load_average().unwrap_or(f64::NAN);
    println!(
        "burst: {clients} clients, {workers} zero-delay worker(s), gateway args {gateway_args:?}, \
         load {load_before:.2}"
    );
    let mut row = runtime.block_on(run(clients, workers, settle, &gateway_env, &gateway_args));
    let load_after = load_average().unwrap_or(f64::NAN);
    println!("load {load_after:.2} at the end");
    row["legacy"] = json!(legacy);
    row["load_average"] = json!([load_before, load_after]);
    println!();
    println!(
        "| gateway | clients | workers | all answered in | p50 | p99 | answers | RSS before | peak | connections idle | after close | per idle connection |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let configuration = match (legacy, gateway_args.is_empty()) {
        (true, _) => format!("legacy (`{gateway_args}`)"),
        (false, true) => "defaults".to_owned(),
        (false, false) => format!("`{gateway_args}`"),
    };
    let answers = row["answers"]
        .as_object()
        .map(|answers| {
            answers
                .iter()
                .map(|(answer, count)| format!("{answer} × {count}"))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    let mib_of = |key: &str| mib(row[key].as_u64().unwrap_or(0));
    println!(
        "| {configuration} | {clients} | {workers} | {:.2} s | {:.0} ms | {:.0} ms | {answers} | {:.0} MiB | {:.0} MiB | {:.0} MiB | {:.0} MiB | {:.1} KiB |",
        row["seconds_to_answer_all"].as_f64().unwrap_or(f64::NAN),
        row["p50_ms"].as_f64().unwrap_or(f64::NAN),
        row["p99_ms"].as_f64().unwrap_or(f64::NAN),
        mib_of("rss_before_bytes"),
        mib_of("rss_peak_bytes"),
        mib_of("rss_connections_idle_bytes"),
        mib_of("rss_after_bytes"),
        row["bytes_per_idle_connection"]
            .as_f64()
            .unwrap_or(f64::NAN)
            / 1024.0,
    );
    let _ = std::fs::create_dir_all("bench-results");
    let _ = std::fs::write(
        "bench-results/burst.json",
        serde_json::to_string_pretty(&row).unwrap_or_default(),
    );
}
