//! Overload and connection faults end to end, through real `smg` and
//! `smg-sim-worker` processes: a burst of keep-alive clients, workers that
//! end their HTTP/2 connections (GOAWAY, graceful or not), a worker killed
//! and restarted under load, a black-holed worker behind the fault proxy,
//! panic mode with every circuit open, calls a dead connection never sent,
//! and memory after a burst.
//!
//! Events are ordered by what the processes show (`/metrics`, the admin
//! API, responses), never by sleeps; nothing asserts on how long anything
//! took. Durations are printed as measurements.

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::proxy::FaultProxy;
use support::{Gateway, SimWorker, bounded, poll_until};

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

fn chat_body() -> Value {
    json!({
        "model": "model",
        "messages": [{"role": "user", "content": "Hello, burst."}],
        "max_tokens": 4,
    })
}

async fn chat(client: &reqwest::Client, gateway: &Gateway) -> (u16, Value) {
    let response = client
        .post(gateway.url("/v1/chat/completions"))
        .json(&chat_body())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The gateway's Prometheus exposition.
async fn metrics_text(gateway: &Gateway) -> String {
    http()
        .get(format!("http://{}/metrics", gateway.metrics))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The sum of the samples of `metric` whose labels contain every one of
/// `labels` (`key="value"` strings).
async fn metric_sum(gateway: &Gateway, metric: &str, labels: &[&str]) -> f64 {
    metrics_text(gateway)
        .await
        .lines()
        .filter(|line| {
            line.strip_prefix(metric)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
        })
        .filter(|line| labels.iter().all(|label| line.contains(label)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// How many times any circuit opened.
async fn circuits_opened(gateway: &Gateway) -> f64 {
    metric_sum(gateway, "smg_worker_cb_transitions_total", &["to=\"open\""]).await
}

/// What a burst of clients got back: a count per (status, error code;
/// for a client that got no answer, status 0 and what its connection met).
#[derive(Debug, Default)]
struct Tally {
    answers: BTreeMap<(u16, String), usize>,
    /// The slowest answer of each status.
    slowest: BTreeMap<u16, Duration>,
    elapsed: Duration,
}

impl Tally {
    fn count(&self, status: u16) -> usize {
        self.answers
            .iter()
            .filter(|((s, _), _)| *s == status)
            .map(|(_, n)| n)
            .sum()
    }

    fn total(&self) -> usize {
        self.answers.values().sum()
    }
}

/// The file descriptors this process's bursts may hold at once: its
/// open-files limit (raised to the hard limit first, so the gateways
/// started after it inherit that too) less a reserve for everything
/// else. Each burst takes one permit per client until its connections are
/// dropped; tests running in parallel wait for each other's bursts
/// instead of running the process out of descriptors. (Two 10,000-client
/// bursts at once under a 20,000 limit failed 22 connects with `Too many
/// open files`.)
fn descriptors() -> &'static (Arc<tokio::sync::Semaphore>, usize) {
    static DESCRIPTORS: std::sync::OnceLock<(Arc<tokio::sync::Semaphore>, usize)> =
        std::sync::OnceLock::new();
    DESCRIPTORS.get_or_init(|| {
        let files = usize::try_from(raise_open_files_limit()).unwrap_or(usize::MAX);
        let budget = files
            .saturating_sub(RESERVED_DESCRIPTORS)
            .min(tokio::sync::Semaphore::MAX_PERMITS);
        (Arc::new(tokio::sync::Semaphore::new(budget)), budget)
    })
}

/// Descriptors left to the test harness, the processes' pipes and the
/// tests' other clients.
const RESERVED_DESCRIPTORS: usize = 1024;

/// The descriptors for `clients` connections, once no other burst needs
/// them.
async fn descriptors_for(clients: usize) -> tokio::sync::OwnedSemaphorePermit {
    let (budget, total) = descriptors();
    assert!(
        clients <= *total,
        "{clients} client connections need `ulimit -n` of at least {} (the hard limit leaves \
         {total} besides the {RESERVED_DESCRIPTORS} reserved)",
        clients + RESERVED_DESCRIPTORS,
    );
    Arc::clone(budget)
        .acquire_many_owned(u32::try_from(clients).unwrap())
        .await
        .unwrap()
}

/// A burst's clients, each its own keep-alive connection, open until
/// this is dropped.
struct Clients {
    connections: Vec<hyper::client::conn::http1::SendRequest<String>>,
    _descriptors: tokio::sync::OwnedSemaphorePermit,
}

/// A client's one connection to the gateway: a TCP connection of its own
/// with an HTTP/1.1 session on it (no pool: a pool would open spare
/// connections while its requests wait for one, leave them idle, and the
/// gateway's head timer would close them under any request sent on one
/// later).
async fn connect(
    gateway: SocketAddr,
) -> Result<hyper::client::conn::http1::SendRequest<String>, String> {
    let stream = tokio::net::TcpStream::connect(gateway)
        .await
        .map_err(|err| format!("connect: {}", error_chain(&err)))?;
    stream.set_nodelay(true).unwrap();
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|err| format!("handshake: {}", error_chain(&err)))?;
    // Ends when its sender is dropped and no request is in flight.
    tokio::spawn(connection);
    Ok(sender)
}

/// One chat on `sender`'s connection: its status and error code ("" for
/// none), or, if no answer came, what the connection met.
async fn chat_on(
    sender: &mut hyper::client::conn::http1::SendRequest<String>,
    gateway: SocketAddr,
) -> Result<(u16, String), String> {
    use http_body_util::BodyExt;
    sender
        .ready()
        .await
        .map_err(|err| format!("not ready: {}", error_chain(&err)))?;
    let request = http::Request::post("/v1/chat/completions")
        .header(http::header::HOST, gateway.to_string())
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(chat_body().to_string())
        .unwrap();
    let response = sender
        .send_request(request)
        .await
        .map_err(|err| format!("send: {}", error_chain(&err)))?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|err| format!("body: {}", error_chain(&err)))?
        .to_bytes();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let code = body["error"]["code"].as_str().unwrap_or("").to_owned();
    Ok((status, code))
}

/// `err` and each of its sources, outermost first.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut chain = err.to_string();
    let mut cause = err.source();
    while let Some(inner) = cause {
        chain.push_str(": ");
        chain.push_str(&inner.to_string());
        cause = inner.source();
    }
    chain
}

/// `clients` keep-alive clients (one connection each), released together,
/// each connecting and sending one chat.
async fn burst(gateway: &Gateway, clients: usize) -> Tally {
    burst_holding(gateway, clients).await.0
}

/// [`burst`], returning the clients too: their connections stay open
/// until they are dropped.
async fn burst_holding(gateway: &Gateway, clients: usize) -> (Tally, Clients) {
    let descriptors = descriptors_for(clients).await;
    let start = Arc::new(tokio::sync::Barrier::new(clients + 1));
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let start = Arc::clone(&start);
            let gateway = gateway.http;
            tokio::spawn(async move {
                start.wait().await;
                let sent = Instant::now();
                let answer = match connect(gateway).await {
                    Ok(mut sender) => chat_on(&mut sender, gateway)
                        .await
                        .map(|answer| (answer, sender)),
                    Err(err) => Err(err),
                };
                (answer, sent.elapsed())
            })
        })
        .collect();
    start.wait().await;
    let began = Instant::now();
    let mut tally = Tally::default();
    let mut connections = Vec::with_capacity(clients);
    for task in tasks {
        let (answer, took) = task.await.unwrap();
        let (status, code) = match answer {
            Ok(((status, code), sender)) => {
                connections.push(sender);
                (status, code)
            }
            Err(failure) => (0, failure),
        };
        *tally.answers.entry((status, code)).or_default() += 1;
        let slowest = tally.slowest.entry(status).or_default();
        *slowest = (*slowest).max(took);
    }
    tally.elapsed = began.elapsed();
    let clients = Clients {
        connections,
        _descriptors: descriptors,
    };
    (tally, clients)
}

fn single_worker_gateway(worker: &SimWorker, extra: &[&str]) -> Gateway {
    let url = worker.grpc_url();
    let mut args = vec![
        "--worker-urls",
        url.as_str(),
        "--served-model-name",
        "model",
    ];
    args.extend_from_slice(extra);
    Gateway::start(&args)
}

/// Issue 15's burst: 10,000 keep-alive clients, one connection each, send
/// one chat at the same moment to a gateway with its default settings in
/// front of `workers` zero-delay sim workers. Every request is answered
/// 200 (or 429 by admission, which the defaults do not limit); none 503,
/// no circuit opens, and the next request is served. How long the burst
/// took is printed, not asserted.
async fn ten_thousand_clients_on(workers: usize) {
    let clients = 10_000;
    // Before the gateway starts: it inherits the raised limit.
    descriptors();
    let sims: Vec<SimWorker> = (0..workers)
        .map(|_| SimWorker::start("tokenspeed", "regular", &["--zero-delay"]))
        .collect();
    let urls: Vec<String> = sims.iter().map(SimWorker::grpc_url).collect();
    let mut args = vec!["--worker-urls"];
    args.extend(urls.iter().map(String::as_str));
    args.extend(["--served-model-name", "model"]);
    let gateway = Gateway::start(&args);
    let closed_before = gateway_closures(&gateway).await;
    let (tally, mut clients_left) =
        tokio::time::timeout(Duration::from_secs(600), burst_holding(&gateway, clients))
            .await
            .expect("the burst of 10,000 ended within 10 minutes");
    let closed = closures_since(&gateway, &closed_before).await;
    println!(
        "burst of {clients} on {workers} worker(s): all answered in {:.2} s; {tally:?}; \
         the gateway closed or refused {closed:?}",
        tally.elapsed.as_secs_f64()
    );
    assert_eq!(tally.total(), clients);
    assert_eq!(tally.count(503), 0, "no 503: {tally:?}");
    assert_eq!(
        tally.count(200) + tally.count(429),
        clients,
        "only 200s and admission's 429s: {tally:?}; the gateway closed or refused {closed:?}"
    );
    for (status, code) in tally.answers.keys() {
        if *status == 429 {
            assert_eq!(code, "queue_full", "{tally:?}");
        }
    }
    assert_eq!(circuits_opened(&gateway).await, 0.0, "no circuit opened");
    // The next request, on one of the burst's kept-alive connections (a
    // new one would be over the default --max-connections, 10,000, while
    // they are open).
    let next = clients_left.connections.first_mut().unwrap();
    let answer = chat_on(next, gateway.http).await;
    assert_eq!(
        answer,
        Ok((200, String::new())),
        "the next request after the burst"
    );
    assert_eq!(circuits_opened(&gateway).await, 0.0, "no circuit opened");
}

/// The gateway's `smg_http_connections_closed_total` and
/// `smg_http_refusals_total` samples: connections it closed (its timers)
/// or refused (`--max-connections`).
async fn gateway_closures(gateway: &Gateway) -> BTreeMap<String, f64> {
    metrics_text(gateway)
        .await
        .lines()
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

/// [`gateway_closures`] that grew since `before`, by how much.
async fn closures_since(
    gateway: &Gateway,
    before: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    gateway_closures(gateway)
        .await
        .into_iter()
        .map(|(sample, value)| {
            let was = before.get(&sample).copied().unwrap_or(0.0);
            (sample, value - was)
        })
        .filter(|(_, grew)| *grew > 0.0)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_clients_at_once_on_one_worker_are_all_served() {
    ten_thousand_clients_on(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_clients_at_once_on_four_workers_are_all_served() {
    ten_thousand_clients_on(4).await;
}

/// The gateway's resident memory (`VmRSS` in `/proc/PID/status`), in bytes.
fn resident_bytes(gateway: &Gateway) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", gateway.pid())).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in {status}"));
    kib * 1024
}

/// Raises this process's soft limit on open files to its hard limit (the
/// gateway it spawns inherits it) and returns the new soft limit.
fn raise_open_files_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit the call writes into.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
        0
    );
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: `limit` is a valid rlimit the call only reads; a soft limit
    // equal to the hard limit is always allowed.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    limit.rlim_cur
}

/// Waits until the gateway's public listener reports no client connection
/// open.
async fn until_clients_closed(gateway: &Gateway) {
    poll_until("the clients' connections close", async || {
        let open = metric_sum(gateway, "smg_http_connections", &["listener=\"public\""]).await;
        (open == 0.0).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_returns_near_its_baseline_after_a_burst() {
    // Each client is a connection here and in the gateway: 3,000 of them,
    // or as many as the open-files limit leaves room for (raised before
    // the gateway starts, which inherits it).
    let clients = descriptors().1.min(3000);
    let worker = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let gateway = single_worker_gateway(&worker, &[]);
    // Warm: the baseline holds the pools, caches and tokenizer state that
    // serving any request builds.
    let warm = bounded("the warm-up", burst(&gateway, 200)).await;
    assert_eq!(warm.count(200), 200, "{warm:?}");
    until_clients_closed(&gateway).await;
    let baseline = resident_bytes(&gateway);

    let (tally, client) = bounded("the burst", burst_holding(&gateway, clients)).await;
    assert_eq!(tally.count(200), clients, "{tally:?}");
    // The clients linger, connected and idle, for 3 s, then leave
    // together. The pause is the workload, not a synchronization (nothing
    // is waited for): keep-alive clients that stay a while after their
    // answers. Then nothing the gateway does later returns what the burst
    // freed; only its allocator upkeep does. Measured without the upkeep
    // thread (control/main.rs): RSS stayed at 351-377 MiB for 30 s against
    // a 202-208 MiB baseline, and the test failed. (Clients that leave at
    // once as the burst ends do not show it: the gateway's own work on
    // their closes purged the memory.)
    let open = metric_sum(&gateway, "smg_http_connections", &["listener=\"public\""]).await;
    let after_burst = resident_bytes(&gateway);
    tokio::time::sleep(Duration::from_secs(3)).await;
    drop(client);
    until_clients_closed(&gateway).await;

    // The memory the burst took comes back to within 64 MiB of the
    // baseline (a 10,000-client burst took ~780 MiB; without the
    // allocator's upkeep most of it stayed).
    let bound = baseline + 64 * 1024 * 1024;
    let mib = |bytes: u64| bytes / (1024 * 1024);
    let closed_at = Instant::now();
    // Polled, failing after 30 s with what it stayed at.
    let settled = loop {
        let now = resident_bytes(&gateway);
        if now <= bound {
            break now;
        }
        assert!(
            closed_at.elapsed() < Duration::from_secs(30),
            "RSS stayed at {} MiB 30 s after the connections closed: above {} MiB \
             (baseline {} MiB, {} MiB with the burst's connections open)",
            mib(now),
            mib(bound),
            mib(baseline),
            mib(after_burst),
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!(
        "burst of {clients}: RSS {} MiB before, {} MiB with its {open} connections open, {} MiB \
         {:?} after they closed (bound {} MiB)",
        mib(baseline),
        mib(after_burst),
        mib(settled),
        closed_at.elapsed(),
        mib(bound),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_goaway_mid_burst_fails_no_request() {
    // Every connection ends after 50 streams: a burst of 600 meets a dozen
    // GOAWAYs, each while streams the worker never saw are on the wire.
    let worker = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--zero-delay", "--goaway-after-streams", "50"],
    );
    let gateway = single_worker_gateway(&worker, &[]);
    let clients = 600;
    let tally = bounded("the burst", burst(&gateway, clients)).await;
    let resent = metric_sum(&gateway, "smg_worker_resends_total", &[]).await;
    let connects = metric_sum(
        &gateway,
        "smg_worker_connects_total",
        &["outcome=\"connected\""],
    )
    .await;
    println!(
        "burst of {clients} through GOAWAYs: {tally:?}; {resent} calls resent, {connects} connects"
    );
    assert_eq!(tally.count(200), clients, "{tally:?}");
    assert_eq!(circuits_opened(&gateway).await, 0.0, "no circuit opened");
    // A graceful GOAWAY's first frame still admits every stream, so a
    // connection may take more than 50 before it is closed: how many GOAWAYs
    // and resends a run meets varies, but the burst outlives some.
    assert!(connects > 1.0, "GOAWAYs led to new connections: {connects}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abrupt_connection_deaths_mid_burst_open_no_circuit() {
    // The worker closes each connection's socket after 50 streams, under
    // the streams still running: those fail, each death counted once, and
    // are run again.
    let worker = SimWorker::start(
        "tokenspeed",
        "regular",
        &[
            "--zero-delay",
            "--goaway-after-streams",
            "50",
            "--abrupt-goaway",
        ],
    );
    let gateway = single_worker_gateway(&worker, &[]);
    let clients = 600;
    let tally = bounded("the burst", burst(&gateway, clients)).await;
    let retried = metric_sum(&gateway, "smg_router_retries_total", &[]).await;
    println!("burst of {clients} through abrupt closes: {tally:?}; {retried} retries");
    // Every connection dies at its 50th stream, under all the streams it
    // carries: a burst of 600 keeps meeting dying connections, and a
    // request whose every attempt met one fails (its retries ran out).
    assert_eq!(tally.total(), clients);
    assert_eq!(circuits_opened(&gateway).await, 0.0, "no circuit opened");
    let (status, body) = chat(&http(), &gateway).await;
    assert_eq!(status, 200, "{body}");
}

/// The admin API's view of the worker at `url`.
async fn worker_status(gateway: &Gateway, url: &str) -> Value {
    let body: Value = http()
        .get(gateway.admin_url("/workers"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["url"] == url)
        .cloned()
        .unwrap_or_else(|| panic!("{url} is not listed: {body}"))
}

/// Waits until the admin API's view of the worker at `url` satisfies
/// `done`; returns that view.
async fn until_worker(
    gateway: &Gateway,
    url: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    poll_until(what, async || {
        let status = worker_status(gateway, url).await;
        done(&status).then_some(status)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_reset_under_twenty_streams_counts_once() {
    // Twenty requests stall on the worker after their first token, all on
    // one connection through the proxy; then the proxy resets it. Counted
    // per stream that would be twenty failures and an open circuit (the
    // threshold is two); counted per death, it is one.
    let worker = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--zero-delay", "--stall-after-tokens", "1"],
    );
    let proxy = FaultProxy::start(worker.grpc).await;
    let url = proxy.grpc_url();
    let gateway = Gateway::start(&[
        "--worker-urls",
        &url,
        "--served-model-name",
        "model",
        "--policy",
        "round_robin",
        "--worker-connections",
        "1",
        "--disable-retries",
        "--disable-health-check",
        "--cb-failure-threshold",
        "2",
    ]);
    let client = http();
    let stalled: Vec<_> = (0..20)
        .map(|_| {
            let (client, url) = (client.clone(), gateway.url("/v1/chat/completions"));
            tokio::spawn(async move {
                let response = client.post(url).json(&chat_body()).send().await.unwrap();
                let status = response.status().as_u16();
                let body: Value = response.json().await.unwrap_or(Value::Null);
                (status, body)
            })
        })
        .collect();
    until_worker(&gateway, &url, "twenty requests on the worker", |w| {
        w["in_flight"] == 20
    })
    .await;
    proxy.reset_all();
    for request in stalled {
        let (status, body) = bounded("a reset request", request).await.unwrap();
        assert_eq!(status, 502, "{body}");
    }
    let status = worker_status(&gateway, &url).await;
    assert_eq!(status["circuit"], "closed", "{status}");
    assert_eq!(circuits_opened(&gateway).await, 0.0);
    // A short request (it ends before the stall) goes through a fresh
    // connection.
    let response = client
        .post(gateway.url("/v1/chat/completions"))
        .json(&json!({
            "model": "model",
            "messages": [{"role": "user", "content": "again"}],
            "max_tokens": 1,
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert!(proxy.accepted() >= 2, "a new connection was made");
}

/// Clients sending chats one after another until stopped; what each got,
/// in order, with when it was answered.
struct Load {
    stop: Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Vec<(Instant, u16)>>>,
}

impl Load {
    fn start(gateway: &Gateway, clients: usize) -> Load {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let tasks = (0..clients)
            .map(|_| {
                let (client, url, stop) = (
                    http(),
                    gateway.url("/v1/chat/completions"),
                    Arc::clone(&stop),
                );
                tokio::spawn(async move {
                    let mut answers = Vec::new();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let status = match client.post(&url).json(&chat_body()).send().await {
                            Ok(response) => response.status().as_u16(),
                            Err(_) => 0,
                        };
                        answers.push((Instant::now(), status));
                    }
                    answers
                })
            })
            .collect();
        Load { stop, tasks }
    }

    async fn stop(self) -> Vec<(Instant, u16)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut all = Vec::new();
        for task in self.tasks {
            all.extend(bounded("a load client stops", task).await.unwrap());
        }
        all.sort_by_key(|(at, _)| *at);
        all
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_and_restarted_under_load_is_back_once_it_answers() {
    // One worker, no panic mode and a ten-minute circuit timeout: requests
    // succeed after the restart only if the open circuit is probed back in.
    let mut worker = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let port = worker.grpc.port().to_string();
    let url = worker.grpc_url();
    let gateway = Gateway::start(&[
        "--worker-urls",
        &url,
        "--served-model-name",
        "model",
        "--health-check-interval-secs",
        "1",
        "--health-check-timeout-secs",
        "1",
        "--health-failure-threshold",
        "1",
        "--health-success-threshold",
        "1",
        "--cb-failure-threshold",
        "3",
        "--cb-timeout-duration-secs",
        "600",
        "--panic-threshold",
        "0",
    ]);
    let load = Load::start(&gateway, 8);
    poll_until("the load is served", async || {
        (metric_sum(&gateway, "smg_router_requests_total", &[]).await > 50.0).then_some(())
    })
    .await;

    worker.kill();
    let down = until_worker(&gateway, &url, "the worker is out", |w| {
        w["status"] != "ready" || w["circuit"] == "open"
    })
    .await;
    println!("killed: {down}");
    let restarted = SimWorker::start("tokenspeed", "regular", &["--zero-delay", "--port", &port]);
    assert_eq!(restarted.grpc_url(), url);
    until_worker(&gateway, &url, "its health check passes", |w| {
        w["status"] == "ready"
    })
    .await;
    let ready_at = Instant::now();
    let back = until_worker(&gateway, &url, "its circuit lets requests in", |w| {
        w["circuit"] != "open"
    })
    .await;
    let circuit_back = ready_at.elapsed();
    // From here on, every request is served.
    let client = http();
    for _ in 0..20 {
        let (status, body) = chat(&client, &gateway).await;
        assert_eq!(status, 200, "{body}");
    }
    let answers = load.stop().await;
    let first_success_after_ready = answers
        .iter()
        .find(|(at, status)| *at >= ready_at && *status == 200)
        .map(|(at, _)| at.duration_since(ready_at));
    let during: BTreeMap<u16, usize> = answers.iter().fold(BTreeMap::new(), |mut m, (_, s)| {
        *m.entry(*s).or_default() += 1;
        m
    });
    println!(
        "restart under load: answers {during:?}; circuit {} {circuit_back:?} after the health \
         check passed; first success {first_success_after_ready:?} after it",
        back["circuit"]
    );
    assert!(
        answers.iter().all(|(_, status)| *status != 0),
        "every request was answered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_worker_is_left_for_the_others_and_not_retried_forever() {
    let direct = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let hidden = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let proxy = FaultProxy::start(hidden.grpc).await;
    let (direct_url, hidden_url) = (direct.grpc_url(), proxy.grpc_url());
    let gateway = Gateway::start(&[
        "--worker-urls",
        &direct_url,
        &hidden_url,
        "--served-model-name",
        "model",
        "--policy",
        "round_robin",
        "--health-check-interval-secs",
        "1",
        "--health-check-timeout-secs",
        "1",
        "--health-failure-threshold",
        "1",
        "--request-timeout-secs",
        "5",
    ]);
    let client = http();
    for _ in 0..4 {
        let (status, body) = chat(&client, &gateway).await;
        assert_eq!(status, 200, "{body}");
    }
    let selections = |url: &str| {
        let label = format!("worker=\"{url}\"");
        let gateway = &gateway;
        async move { metric_sum(gateway, "smg_worker_selection_total", &[label.as_str()]).await }
    };
    assert!(selections(&hidden_url).await >= 1.0, "both take traffic");

    proxy.black_hole(true);
    // Requests keep coming meanwhile; those that land on the black hole
    // end at the request timeout (504), not never.
    let load = Load::start(&gateway, 4);
    until_worker(
        &gateway,
        &hidden_url,
        "the black hole leaves rotation",
        |w| w["status"] == "not_ready",
    )
    .await;
    let answers = load.stop().await;
    let during: BTreeMap<u16, usize> = answers.iter().fold(BTreeMap::new(), |mut m, (_, s)| {
        *m.entry(*s).or_default() += 1;
        m
    });
    println!("while the worker was black-holed: {during:?}");
    assert!(
        during.keys().all(|status| [200, 504].contains(status)),
        "served, or timed out by the gateway: {during:?}"
    );

    // Out of rotation: everything goes to the other worker, and the black
    // hole takes no more requests.
    let before = selections(&hidden_url).await;
    for _ in 0..20 {
        let (status, body) = chat(&client, &gateway).await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(selections(&hidden_url).await, before, "not retried");
    let hidden_status = worker_status(&gateway, &hidden_url).await;
    assert_eq!(hidden_status["in_flight"], 0, "{hidden_status}");

    // The partition heals: the worker answers its probes and rejoins.
    proxy.black_hole(false);
    until_worker(&gateway, &hidden_url, "the worker rejoins", |w| {
        w["status"] == "ready"
    })
    .await;
    poll_until("requests reach it again", async || {
        let (status, _) = chat(&client, &gateway).await;
        assert_eq!(status, 200);
        (selections(&hidden_url).await > before).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_mode_serves_through_workers_whose_circuits_are_all_open() {
    // Circuits open at the first failure and, unprobed, stay open ten
    // minutes: only panic mode can serve once the workers are back.
    let mut workers: Vec<SimWorker> = (0..2)
        .map(|_| SimWorker::start("tokenspeed", "regular", &["--zero-delay"]))
        .collect();
    let ports: Vec<String> = workers.iter().map(|w| w.grpc.port().to_string()).collect();
    let urls: Vec<String> = workers.iter().map(SimWorker::grpc_url).collect();
    let gateway = Gateway::start(&[
        "--worker-urls",
        &urls[0],
        &urls[1],
        "--served-model-name",
        "model",
        "--disable-health-check",
        "--cb-failure-threshold",
        "1",
        "--cb-timeout-duration-secs",
        "600",
        "--cb-probe-interval-ms",
        "0",
    ]);
    let client = http();
    let (status, body) = chat(&client, &gateway).await;
    assert_eq!(status, 200, "{body}");

    for worker in &mut workers {
        worker.kill();
    }
    poll_until("every circuit opens", async || {
        let _ = chat(&client, &gateway).await;
        let mut open = 0;
        for url in &urls {
            open += usize::from(worker_status(&gateway, url).await["circuit"] == "open");
        }
        (open == urls.len()).then_some(())
    })
    .await;
    let _restarted: Vec<SimWorker> = ports
        .iter()
        .map(|port| SimWorker::start("tokenspeed", "regular", &["--zero-delay", "--port", port]))
        .collect();
    // The first calls may meet the reconnect backoff of the dead
    // connections; once one is served, all are.
    poll_until("a request is served", async || {
        (chat(&client, &gateway).await.0 == 200).then_some(())
    })
    .await;
    for _ in 0..10 {
        let (status, body) = chat(&client, &gateway).await;
        assert_eq!(status, 200, "panic mode serves: {body}");
    }
    for url in &urls {
        let status = worker_status(&gateway, url).await;
        assert_eq!(status["circuit"], "open", "still open: {status}");
    }
    assert!(metric_sum(&gateway, "smg_worker_panic_routing_total", &[]).await >= 10.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_waits_in_the_gateway_for_the_workers_slots() {
    // Each request takes a few decode steps: a burst of 300 would put them
    // all on the worker at once; with a limit of 16 the rest wait in the
    // gateway and are served as slots free.
    let worker = SimWorker::start("tokenspeed", "regular", &["--decode-ms-per-token", "2"]);
    let url = worker.grpc_url();
    let gateway = single_worker_gateway(&worker, &["--worker-max-in-flight", "16"]);
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (admin, url, sampling) = (
            gateway.admin_url("/workers"),
            url.clone(),
            Arc::clone(&sampling),
        );
        tokio::spawn(async move {
            let client = http();
            let mut most = 0;
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                let body: Value = client
                    .get(&admin)
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                for worker in body["workers"].as_array().unwrap() {
                    if worker["url"] == url.as_str() {
                        most = most.max(worker["in_flight"].as_u64().unwrap());
                    }
                }
            }
            most
        })
    };
    let clients = 300;
    let tally = bounded("the burst", burst(&gateway, clients)).await;
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    let most = sampler.await.unwrap();
    println!("burst of {clients} on a worker limited to 16: {tally:?}; most in flight seen {most}");
    assert_eq!(tally.count(200), clients, "{tally:?}");
    assert!(most <= 16, "the limit held: {most}");
    assert!(most > 0, "the sampler saw the burst");
    assert_eq!(circuits_opened(&gateway).await, 0.0);
}

/// The largest `peak N` in a sim worker's `--peak-log` (0 if none).
fn peak_in(log: &std::path::Path) -> u64 {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.strip_prefix("peak ")?.parse().ok())
        .max()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_waits_for_the_slots_the_engine_reports() {
    // The worker runs 4 requests at once and says so in GetLoads
    // (max_running_requests); no flag tells the gateway. A burst of 200
    // waits in the gateway: the worker never holds more than 4 calls (its
    // peak log counts the calls it holds, queued or running).
    let dir = tempfile::tempdir().unwrap();
    let (first_peaks, second_peaks) = (dir.path().join("first"), dir.path().join("second"));
    let mut worker = SimWorker::start(
        "tokenspeed",
        "regular",
        &[
            "--decode-ms-per-token",
            "2",
            "--max-running-requests",
            "4",
            "--peak-log",
            first_peaks.to_str().unwrap(),
        ],
    );
    let url = worker.grpc_url();
    let port = worker.grpc.port().to_string();
    let gateway = single_worker_gateway(&worker, &[]);
    until_worker(&gateway, &url, "the engine's limit is read", |w| {
        w["max_in_flight"] == 4
    })
    .await;
    let clients = 200;
    let tally = bounded("the burst", burst(&gateway, clients)).await;
    let peak = peak_in(&first_peaks);
    println!("burst of {clients} on an engine running 4: {tally:?}; its peak {peak}");
    assert_eq!(tally.count(200), clients, "{tally:?}");
    assert!(peak <= 4, "the worker held {peak} calls at once");
    assert!(peak > 0, "the peak log saw the burst");
    assert_eq!(circuits_opened(&gateway).await, 0.0);

    // The engine comes back on the same port running 8: the limit follows
    // its report.
    worker.kill();
    let restarted = SimWorker::start(
        "tokenspeed",
        "regular",
        &[
            "--decode-ms-per-token",
            "2",
            "--max-running-requests",
            "8",
            "--peak-log",
            second_peaks.to_str().unwrap(),
            "--port",
            &port,
        ],
    );
    assert_eq!(restarted.grpc_url(), url);
    until_worker(&gateway, &url, "the new limit is read", |w| {
        w["max_in_flight"] == 8 && w["circuit"] != "open"
    })
    .await;
    poll_until("a request is served", async || {
        (chat(&http(), &gateway).await.0 == 200).then_some(())
    })
    .await;
    let tally = bounded("the second burst", burst(&gateway, clients)).await;
    let peak = peak_in(&second_peaks);
    println!("burst of {clients} on an engine running 8: {tally:?}; its peak {peak}");
    assert_eq!(tally.count(200), clients, "{tally:?}");
    assert!(peak <= 8, "the worker held {peak} calls at once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_age_out_every_200_ms_fail_no_request() {
    // A maximum connection age, as proxies and engines set it: every
    // connection gets a graceful GOAWAY 200 ms after it opened.
    let worker = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--zero-delay", "--goaway-every-ms", "200"],
    );
    let gateway = single_worker_gateway(&worker, &[]);
    let load = Load::start(&gateway, 8);
    poll_until("several connections aged out", async || {
        let connects = metric_sum(
            &gateway,
            "smg_worker_connects_total",
            &["outcome=\"connected\""],
        )
        .await;
        (connects >= 5.0).then_some(())
    })
    .await;
    let answers = load.stop().await;
    let failed: Vec<u16> = answers
        .iter()
        .map(|(_, status)| *status)
        .filter(|&status| status != 200)
        .collect();
    println!(
        "{} requests across aging connections, failed: {failed:?}",
        answers.len()
    );
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(circuits_opened(&gateway).await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_allowing_few_streams_per_connection_gets_more_connections() {
    // The worker advertises SETTINGS_MAX_CONCURRENT_STREAMS 4 and accepts
    // slowly; the gateway's own cap (100) is higher, so only what it read
    // from the worker's SETTINGS makes the pool open more connections.
    let worker = SimWorker::start(
        "tokenspeed",
        "regular",
        &[
            "--decode-ms-per-token",
            "20",
            "--max-concurrent-streams",
            "4",
            "--accept-delay-ms",
            "100",
        ],
    );
    let gateway = single_worker_gateway(&worker, &["--worker-connections", "4"]);
    // One request first, so the first connection's SETTINGS are known.
    let (status, body) = chat(&http(), &gateway).await;
    assert_eq!(status, 200, "{body}");
    let tally = bounded("the burst", burst(&gateway, 16)).await;
    let connections = metric_sum(&gateway, "smg_worker_connections", &[]).await;
    println!("16 requests on a 4-stream worker: {tally:?}; {connections} connections");
    assert_eq!(tally.count(200), 16, "{tally:?}");
    assert!(
        connections >= 2.0,
        "the pool grew past the worker's 4 streams: {connections}"
    );
}

/// A streamed chat's SSE body, parsed: the `data:` payloads before
/// `[DONE]`, and whether `[DONE]` ended it.
fn sse_frames(text: &str) -> (Vec<Value>, bool) {
    let mut frames = Vec::new();
    let mut done = false;
    for data in text.lines().filter_map(|line| line.strip_prefix("data: ")) {
        if data == "[DONE]" {
            done = true;
        } else {
            frames.push(serde_json::from_str(data).unwrap_or(Value::Null));
        }
    }
    (frames, done)
}

/// Two workers, the first behind the fault proxy and stalling streams
/// after their first token (`stall`: sim-worker fault flags), and a
/// gateway that pings its worker connections after 1 s of silence and
/// gives a ping 1 s: the request timeout (10 minutes) can never be what
/// ends a request here.
async fn stalled_worker_behind_a_proxy(
    stall: &[&str],
) -> (SimWorker, SimWorker, FaultProxy, Gateway) {
    let mut hidden_args = vec!["--zero-delay", "--stall-after-tokens", "1"];
    hidden_args.extend_from_slice(stall);
    let hidden = SimWorker::start("tokenspeed", "regular", &hidden_args);
    let direct = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let proxy = FaultProxy::start(hidden.grpc).await;
    let (hidden_url, direct_url) = (proxy.grpc_url(), direct.grpc_url());
    let args = [
        "--worker-urls",
        hidden_url.as_str(),
        direct_url.as_str(),
        "--served-model-name",
        "model",
        "--policy",
        "round_robin",
        "--disable-health-check",
        "--cb-failure-threshold",
        "1",
        "--cb-probe-interval-ms",
        "0",
        "--panic-threshold",
        "0",
        "--request-timeout-secs",
        "600",
        "--worker-keepalive-interval-secs",
        "1",
        "--worker-keepalive-timeout-secs",
        "1",
    ];
    let gateway = Gateway::start(&args);
    (hidden, direct, proxy, gateway)
}

/// Starts `count` chats with `body` at once; each task reports on
/// `started` when its answer's head arrived (for a stream: its first
/// event reached the client) and returns the status and body.
fn chats_in_flight(
    gateway: &Gateway,
    count: usize,
    body: &Value,
    started: &tokio::sync::mpsc::UnboundedSender<()>,
) -> Vec<tokio::task::JoinHandle<(u16, String)>> {
    let client = http();
    (0..count)
        .map(|_| {
            let (client, url, started, body) = (
                client.clone(),
                gateway.url("/v1/chat/completions"),
                started.clone(),
                body.clone(),
            );
            tokio::spawn(async move {
                let response = client.post(url).json(&body).send().await.unwrap();
                let _ = started.send(());
                let status = response.status().as_u16();
                (status, response.text().await.unwrap_or_default())
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_in_flight_on_a_black_holed_worker_end_at_its_keepalive_and_its_circuit_opens() {
    let (_hidden, _direct, proxy, gateway) = stalled_worker_behind_a_proxy(&[]).await;
    let hidden_url = proxy.grpc_url();
    // Eight streams; round robin gives the stalling worker half of them,
    // whose first token reaches the client and then nothing more.
    let (started, mut heads) = tokio::sync::mpsc::unbounded_channel();
    let streams = chats_in_flight(&gateway, 8, &streamed(), &started);
    for _ in 0..streams.len() {
        bounded("a stream's head", heads.recv()).await.unwrap();
    }
    let stalled = worker_status(&gateway, &hidden_url).await["in_flight"]
        .as_u64()
        .unwrap();
    assert!(stalled > 0, "round robin sent some to the stalling worker");

    // The partition: no byte crosses either way, no connection closes.
    proxy.black_hole(true);
    let hole_at = Instant::now();
    let mut cut = 0;
    for stream in streams {
        let (status, text) = bounded("a stream on a black hole ends", stream)
            .await
            .unwrap();
        assert_eq!(status, 200, "the head went out before the hole: {text}");
        let (frames, done) = sse_frames(&text);
        assert!(done, "every stream ends with [DONE]: {text}");
        if let Some(error) = frames.iter().find(|frame| frame["error"].is_object()) {
            // Tokens reached the client: it is told, with a code it may
            // retry on, instead of waiting for the request timeout.
            assert_eq!(error["error"]["code"], "worker_error", "{text}");
            cut += 1;
        }
    }
    println!(
        "{cut} of 8 streams cut by the black hole, all ended {:?} after it opened",
        hole_at.elapsed()
    );
    assert_eq!(cut, stalled, "exactly the black-holed streams were cut");

    until_worker(
        &gateway,
        &hidden_url,
        "the black hole's circuit opens",
        |w| w["circuit"] == "open",
    )
    .await;
    let selections = async || {
        let label = format!("worker=\"{hidden_url}\"");
        metric_sum(&gateway, "smg_worker_selection_total", &[label.as_str()]).await
    };
    let before = selections().await;
    let client = http();
    for _ in 0..10 {
        let (status, body) = chat(&client, &gateway).await;
        assert_eq!(status, 200, "the other worker serves: {body}");
    }
    assert_eq!(
        selections().await,
        before,
        "nothing more is sent into the hole"
    );
}

/// [`chat_body`], streamed.
fn streamed() -> Value {
    let mut body = chat_body();
    body["stream"] = json!(true);
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unstreamed_requests_cut_mid_answer_by_a_black_hole_are_answered_by_the_other_worker() {
    // Two sequences per request; behind the proxy the second stalls after
    // its first token while the first completes: the gateway holds half an
    // answer when the hole opens. The client has been sent nothing, so the
    // request may be run again elsewhere.
    let (_hidden, _direct, proxy, gateway) =
        stalled_worker_behind_a_proxy(&["--faulty-sequence", "1"]).await;
    let hidden_url = proxy.grpc_url();
    let mut two = chat_body();
    two["n"] = json!(2);
    let (started, _heads) = tokio::sync::mpsc::unbounded_channel();
    let requests = chats_in_flight(&gateway, 8, &two, &started);
    poll_until(
        "the other worker answered, the stalling one holds",
        async || {
            let finished = requests.iter().filter(|r| r.is_finished()).count();
            let held = worker_status(&gateway, &hidden_url).await["in_flight"]
                .as_u64()
                .unwrap();
            (held > 0 && finished + held as usize == requests.len()).then_some(())
        },
    )
    .await;

    proxy.black_hole(true);
    let hole_at = Instant::now();
    for request in requests {
        let (status, body) = bounded("a request on a black hole ends", request)
            .await
            .unwrap();
        assert_eq!(status, 200, "{body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        let choices = body["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 2, "{body}");
        for choice in choices {
            assert!(choice["message"]["content"].is_string(), "{body}");
        }
    }
    let retried = metric_sum(&gateway, "smg_router_retries_total", &[]).await;
    println!(
        "8 half-answered requests through a black hole: all answered {:?} after it opened, \
         {retried} retries",
        hole_at.elapsed()
    );
    assert!(retried >= 1.0, "the held ones were run again: {retried}");
    until_worker(
        &gateway,
        &hidden_url,
        "the black hole's circuit opens",
        |w| w["circuit"] == "open",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_cut_mid_answer_by_a_connection_reset_are_run_again_unless_streamed() {
    // Every stream is held after its first token; then the proxy resets the
    // one connection under all of them. The whole-answer requests have
    // sent their clients nothing and are run again; the streams have sent
    // their first event and end with an error event.
    let worker = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--zero-delay", "--hold-after-tokens", "1"],
    );
    let proxy = FaultProxy::start(worker.grpc).await;
    let url = proxy.grpc_url();
    let gateway = Gateway::start(&[
        "--worker-urls",
        &url,
        "--served-model-name",
        "model",
        "--worker-connections",
        "1",
        "--disable-health-check",
        "--cb-failure-threshold",
        "2",
    ]);
    let (started, mut heads) = tokio::sync::mpsc::unbounded_channel();
    let streams = chats_in_flight(&gateway, 5, &streamed(), &started);
    for _ in 0..streams.len() {
        bounded("a stream's head", heads.recv()).await.unwrap();
    }
    let whole = chats_in_flight(&gateway, 20, &chat_body(), &started);
    until_worker(&gateway, &url, "every request on the worker", |w| {
        w["in_flight"] == 25
    })
    .await;

    proxy.reset_all();
    for stream in streams {
        let (status, text) = bounded("a cut stream ends", stream).await.unwrap();
        assert_eq!(status, 200, "{text}");
        let (frames, done) = sse_frames(&text);
        assert!(done, "{text}");
        let error = frames.iter().find(|frame| frame["error"].is_object());
        assert_eq!(
            error.map(|frame| frame["error"]["code"].clone()),
            Some(json!("worker_error")),
            "{text}"
        );
    }
    // The whole-answer requests are back on the worker, on a new
    // connection, held again: let them finish.
    until_worker(&gateway, &url, "the cut requests are sent again", |w| {
        w["in_flight"] == 20
    })
    .await;
    assert!(proxy.accepted() >= 2, "a new connection carries them");
    worker.signal(nix::sys::signal::Signal::SIGUSR1);
    for request in whole {
        let (status, body) = bounded("a cut request is answered", request).await.unwrap();
        assert_eq!(status, 200, "{body}");
    }
    let retried = metric_sum(&gateway, "smg_router_retries_total", &[]).await;
    assert_eq!(retried, 20.0, "each cut whole-answer request, once");
    let status = worker_status(&gateway, &url).await;
    assert_eq!(
        status["circuit"], "closed",
        "one death, counted once: {status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_a_dead_connection_never_sent_go_to_the_other_worker_and_charge_nobody() {
    // The hidden worker (behind the proxy) takes one stream at a time and
    // holds each after its first token; the gateway keeps one connection to
    // each worker. A stream holds the hidden worker's one slot, and the
    // whole-answer requests round robin gives it wait behind that stream in
    // the gateway's HTTP/2 client, never written. Then the proxy black-holes
    // the connection: its keep-alive ping goes unanswered and closes it.
    // The held stream fails (one connection death: one failure); the calls
    // never sent fail too, and must go to the other worker, not back into
    // the hole, where they would die with the next connection and charge
    // the worker a second time (the threshold is two).
    let hidden = SimWorker::start(
        "tokenspeed",
        "regular",
        &[
            "--zero-delay",
            "--stall-after-tokens",
            "1",
            "--max-concurrent-streams",
            "1",
        ],
    );
    let direct = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let proxy = FaultProxy::start(hidden.grpc).await;
    let (hidden_url, direct_url) = (proxy.grpc_url(), direct.grpc_url());
    let gateway = Gateway::start(&[
        "--worker-urls",
        &hidden_url,
        &direct_url,
        "--served-model-name",
        "model",
        "--policy",
        "round_robin",
        "--worker-connections",
        "1",
        "--disable-health-check",
        "--cb-failure-threshold",
        "2",
        "--cb-probe-interval-ms",
        "0",
        "--panic-threshold",
        "0",
        "--request-timeout-secs",
        "600",
        "--worker-keepalive-interval-secs",
        "1",
        "--worker-keepalive-timeout-secs",
        "1",
    ]);
    // Two streams: round robin gives each worker one; the hidden one's
    // holds after its first event.
    let (started, mut heads) = tokio::sync::mpsc::unbounded_channel();
    let streams = chats_in_flight(&gateway, 2, &streamed(), &started);
    for _ in 0..streams.len() {
        bounded("a stream's head", heads.recv()).await.unwrap();
    }
    until_worker(&gateway, &hidden_url, "one stream held", |w| {
        w["in_flight"] == 1
    })
    .await;
    let whole = chats_in_flight(&gateway, 8, &chat_body(), &started);
    let waiting = poll_until(
        "the other worker answered its share, the rest wait for the hidden one",
        async || {
            let finished = whole.iter().filter(|r| r.is_finished()).count();
            let waiting = worker_status(&gateway, &hidden_url).await["in_flight"]
                .as_u64()
                .unwrap()
                - 1;
            (waiting > 0 && finished + waiting as usize == whole.len()).then_some(waiting)
        },
    )
    .await;
    let selected = async || {
        let label = format!("worker=\"{hidden_url}\"");
        metric_sum(&gateway, "smg_worker_selection_total", &[label.as_str()]).await
    };
    let selected_before = selected().await;

    proxy.black_hole(true);
    for request in whole {
        let (status, body) = bounded("a request behind the hole ends", request)
            .await
            .unwrap();
        assert_eq!(status, 200, "{body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert!(
            body["choices"][0]["message"]["content"].is_string(),
            "{body}"
        );
    }
    for stream in streams {
        let (status, text) = bounded("a stream ends", stream).await.unwrap();
        assert_eq!(status, 200, "{text}");
        assert!(sse_frames(&text).1, "{text}");
    }
    let resent = {
        let label = format!("worker=\"{hidden_url}\"");
        metric_sum(&gateway, "smg_worker_resends_total", &[label.as_str()]).await
    };
    let status = worker_status(&gateway, &hidden_url).await;
    println!(
        "{waiting} calls never sent when the connection died; {resent} resent; {} proxy \
         connections; hidden worker {status}",
        proxy.accepted()
    );
    assert_eq!(
        selected().await,
        selected_before,
        "nothing more was sent into the hole"
    );
    assert_eq!(status["in_flight"], 0, "{status}");
    assert_eq!(
        status["circuit"], "closed",
        "one connection death, one failure: {status}"
    );
    assert_eq!(circuits_opened(&gateway).await, 0.0);
}
