//! The gateway's `/metrics` is clean Prometheus and documented; its logs
//! carry colour codes only when asked or on a terminal, and go to a file a
//! day too with `--log-dir`; a start-up mistake is one line.
//!
//! Gateways in each mode serve a mix of requests (every dialect, streamed
//! and whole, an image, failures and refusals); then each scrape must pass
//! `promtool check metrics` (HELP on every family, counters and only
//! counters named `_total`, ...), every family exported must be a row of
//! the README's metrics table with the same type and labels, and that
//! table must be the code's (`smg::metrics::FAMILIES`). A worker's health
//! and circuit gauges must be there before any request, and a removed
//! worker's series must leave with it while the others' stay.
//!
//! `promtool` comes from Debian's `prometheus` package. Without it on
//! PATH the promtool check is skipped with a note, unless
//! `SMG_REQUIRE_PROMTOOL` is set (as `.ci/run` sets it): then its absence
//! fails the test, so CI always runs the check.

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use support::media::image_data_url;
use support::{Gateway, SimWorker, bounded};

/// The bytes this test process holds, counted by [`Counting`]: how the
/// test of the exporter's upkeep sees observations held and let go.
static HELD: AtomicIsize = AtomicIsize::new(0);

/// The system allocator, counting what is held in [`HELD`].
struct Counting;

// SAFETY: every call is passed to the system allocator unchanged; only the
// count is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is System's.
        let block = unsafe { System.alloc(layout) };
        if !block.is_null() {
            HELD.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is System's.
        unsafe { System.dealloc(block, layout) };
        HELD.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract is System's.
        let moved = unsafe { System.realloc(block, layout, new_size) };
        if !moved.is_null() {
            HELD.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        moved
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client")
}

/// A family as exported: its `# TYPE`, whether it has `# HELP`, and the
/// label names of its series.
#[derive(Debug, Default, Clone, PartialEq)]
struct Exported {
    kind: String,
    help: bool,
    labels: BTreeSet<String>,
}

/// The families of a Prometheus text scrape, by name.
fn families(text: &str) -> BTreeMap<String, Exported> {
    let mut families: BTreeMap<String, Exported> = BTreeMap::new();
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split_whitespace().next().unwrap_or_default();
            families.entry(name.to_owned()).or_default().help = true;
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split_whitespace();
            let name = words.next().unwrap_or_default();
            families.entry(name.to_owned()).or_default().kind =
                words.next().unwrap_or_default().to_owned();
        } else if !line.starts_with('#') {
            let series = line.split(' ').next().unwrap_or_default();
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            // A histogram's series carry the family's name plus a suffix.
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    let base = name.strip_suffix(suffix)?;
                    (families.get(base)?.kind == "histogram").then_some(base)
                })
                .unwrap_or(name);
            let entry = families.entry(family.to_owned()).or_default();
            for pair in labels.trim_end_matches('}').split("\",") {
                if let Some((label, _)) = pair.split_once('=')
                    && label != "le"
                {
                    entry.labels.insert(label.trim_matches(',').to_owned());
                }
            }
        }
    }
    families
}

/// The README's metrics table: family → (type, label names).
fn readme_families() -> BTreeMap<String, (String, BTreeSet<String>)> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    readme
        .lines()
        .filter_map(|line| {
            let mut cells = line.strip_prefix("| `smg_")?.split('|');
            let name = format!("smg_{}", cells.next()?.trim().strip_suffix('`')?);
            let kind = cells.next()?.trim().to_owned();
            let labels = cells
                .next()?
                .split(',')
                .map(|label| label.trim().trim_matches('`').to_owned())
                .filter(|label| !label.is_empty())
                .collect();
            Some((name, (kind, labels)))
        })
        .collect()
}

/// `promtool` on PATH, if any.
fn promtool() -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join("promtool"))
        .find(|path| path.is_file())
}

/// `promtool check metrics` on `scrape`: `Some(problems)` when it found
/// any, `None` when clean or (outside CI) when promtool is not installed.
fn promtool_problems(scrape: &str) -> Option<String> {
    let Some(promtool) = promtool() else {
        assert!(
            std::env::var_os("SMG_REQUIRE_PROMTOOL").is_none(),
            "SMG_REQUIRE_PROMTOOL is set and promtool is not on PATH \
             (apt-get install prometheus)"
        );
        eprintln!("promtool is not on PATH: the promtool check is skipped");
        return None;
    };
    let mut child = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run promtool");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("promtool's stdin");
        stdin.write_all(scrape.as_bytes()).expect("feed promtool");
    }
    let output = child.wait_with_output().expect("promtool's verdict");
    (!output.status.success()).then(|| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

async fn scrape(gateway: &Gateway) -> String {
    bounded("a scrape", async {
        http()
            .get(format!("http://{}/metrics", gateway.metrics))
            .send()
            .await
            .expect("metrics answer")
            .text()
            .await
            .expect("metrics text")
    })
    .await
}

/// A gateway over fresh sim workers in `mode`, with flags that make the
/// optional families appear (engine load, admission).
fn fleet(protocol: &str, mode: &str) -> (Vec<SimWorker>, Gateway) {
    let start = |role: &str| SimWorker::start(protocol, role, &["--zero-delay"]);
    let mut workers = Vec::new();
    let mut flags: Vec<String> = Vec::new();
    if mode == "regular" {
        let worker = start("regular");
        flags.extend(["--worker-urls".into(), worker.grpc_url()]);
        workers.push(worker);
    } else {
        if mode == "epd" {
            let encoder = start("encode");
            flags.extend([
                "--epd-disaggregation".into(),
                "--encode".into(),
                encoder.grpc_url(),
                encoder.bootstrap_port().to_string(),
            ]);
            workers.push(encoder);
        } else {
            flags.push("--pd-disaggregation".into());
        }
        let (prefill, decode) = (start("prefill"), start("decode"));
        flags.extend([
            "--prefill".into(),
            prefill.grpc_url(),
            prefill.bootstrap_port().to_string(),
            "--decode".into(),
            decode.grpc_url(),
        ]);
        workers.extend([prefill, decode]);
    }
    flags.extend(
        [
            "--served-model-name",
            "model",
            "--policy",
            "power_of_two",
            "--max-concurrent-requests",
            "16",
            "--max-header-size",
            "8192",
        ]
        .map(String::from),
    );
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    (workers, Gateway::start(&flags))
}

/// Requests of every kind, and a few failures.
async fn serve_a_mix(gateway: &Gateway) {
    let image = json!([{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": image_data_url("palette_97x61.png")}},
        {"type": "text", "text": "What is in the picture?"}]}]);
    let hello = json!([{"role": "user", "content": "Say hello."}]);
    let ok = [
        (
            "/v1/chat/completions",
            json!({"model": "model", "max_tokens": 4, "messages": hello}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "model", "max_tokens": 4, "messages": image}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "model", "max_tokens": 4, "messages": hello,
            "stream": true, "stream_options": {"include_usage": true}}),
        ),
        (
            "/v1/completions",
            json!({"model": "model", "max_tokens": 4, "prompt": "Hi",
            "stream": true}),
        ),
        (
            "/generate",
            json!({"text": "Hi", "sampling_params": {"max_new_tokens": 4}}),
        ),
        (
            "/v1/messages",
            json!({"model": "model", "max_tokens": 4, "messages": hello}),
        ),
        (
            "/v1/responses",
            json!({"model": "model", "max_output_tokens": 4, "input": "Hi"}),
        ),
    ];
    for (path, body) in ok {
        let response = http()
            .post(gateway.url(path))
            .json(&body)
            .send()
            .await
            .expect("sent");
        assert_eq!(response.status(), 200, "{path}");
        bounded("the answer", response.bytes())
            .await
            .expect("a body");
    }
    let failing = [
        // model_not_found, a handler's error.
        http()
            .post(gateway.url("/v1/chat/completions"))
            .json(&json!({"model": "nope", "messages": hello})),
        // headers_too_large, a front-door refusal.
        http()
            .post(gateway.url("/v1/completions"))
            .header("x-padding", "p".repeat(9000))
            .json(&json!({"model": "model", "prompt": "Hi"})),
    ];
    for request in failing {
        let response = request.send().await.expect("sent");
        assert!(response.status().is_client_error());
    }
}

#[tokio::test]
async fn every_family_a_busy_gateway_exports_is_documented_and_promtool_clean() {
    let readme = readme_families();
    // The README's table is the code's.
    let table: BTreeMap<String, String> = smg::metrics::FAMILIES
        .iter()
        .map(|family| {
            let kind = format!("{:?}", family.kind).to_lowercase();
            (family.name.to_owned(), kind)
        })
        .collect();
    let documented: BTreeMap<String, String> = readme
        .iter()
        .map(|(name, (kind, _))| (name.clone(), kind.clone()))
        .collect();
    assert_eq!(
        documented, table,
        "README's metrics table vs metrics::FAMILIES"
    );

    let mut exported: BTreeMap<String, Exported> = BTreeMap::new();
    for (protocol, mode) in [
        ("tokenspeed", "regular"),
        ("sglang", "pd"),
        ("tokenspeed", "epd"),
    ] {
        let (_workers, gateway) = fleet(protocol, mode);
        serve_a_mix(&gateway).await;
        let text = if mode == "epd" {
            // An Encode may answer after its request has finished (the
            // embedding reached prefill first): it is timed then.
            support::poll_until("the Encode is timed", async || {
                let text = scrape(&gateway).await;
                text.contains("smg_router_encode_duration_seconds_count")
                    .then_some(text)
            })
            .await
        } else {
            scrape(&gateway).await
        };
        if let Some(problems) = promtool_problems(&text) {
            panic!("promtool check metrics ({protocol} {mode}):\n{problems}\n{text}");
        }
        for (name, family) in families(&text) {
            let seen = exported.entry(name).or_default();
            seen.kind = family.kind;
            seen.help |= family.help;
            seen.labels.extend(family.labels);
        }
    }
    // What serving requests in every mode must have shown.
    for name in [
        "smg_router_requests_total",
        "smg_router_request_duration_seconds",
        "smg_router_request_errors_total",
        "smg_router_ttft_seconds",
        "smg_worker_selection_total",
        "smg_router_pd_legs_start_seconds",
        "smg_router_encode_duration_seconds",
        "smg_worker_health_state",
        "smg_worker_cb_state",
        "smg_admission_in_flight",
        "smg_http_refusals_total",
        "smg_http_tenant_requests_total",
        "smg_tensor_lane_tensors_total",
        "smg_history_operation_duration_seconds",
        "smg_history_responses_stored_total",
        "smg_history_orphans_ended_total",
    ] {
        assert!(exported.contains_key(name), "{name} was not exported");
    }
    for (name, family) in &exported {
        let Some((kind, labels)) = readme.get(name) else {
            panic!("{name} is exported but not in the README's metrics table");
        };
        assert_eq!(&family.kind, kind, "{name}'s type");
        assert!(family.help, "{name} has no # HELP");
        assert!(
            family.labels.is_subset(labels),
            "{name}'s labels {:?}, the README says {labels:?}",
            family.labels
        );
    }
}

#[tokio::test]
async fn worker_gauges_show_from_start_up() {
    let (workers, gateway) = fleet("tokenspeed", "pd");
    // Scraped before any request.
    let text = scrape(&gateway).await;
    for worker in workers {
        let url = format!("worker=\"{}\"", worker.grpc_url());
        let states: Vec<f64> = text
            .lines()
            .filter(|line| line.starts_with("smg_worker_health_state{") && line.contains(&url))
            .filter_map(|line| line.rsplit(' ').next()?.parse().ok())
            .collect();
        assert_eq!(states.len(), 4, "one series per state for {url}:\n{text}");
        assert_eq!(
            states.iter().filter(|&&value| value == 1.0).count(),
            1,
            "{url} is in one state:\n{text}"
        );
        let circuit = text
            .lines()
            .find(|line| line.starts_with("smg_worker_cb_state{") && line.contains(&url))
            .unwrap_or_else(|| panic!("no smg_worker_cb_state for {url}:\n{text}"));
        assert!(
            circuit.ends_with(" 0"),
            "a new worker's circuit is closed: {circuit}"
        );
    }
}

/// The families with a series labelled `worker="{url}"` in `text`.
fn families_of(text: &str, url: &str) -> BTreeSet<String> {
    let label = format!("worker=\"{url}\"");
    text.lines()
        .filter(|line| !line.starts_with('#') && line.contains(&label))
        .filter_map(|line| Some(line.split_once('{')?.0.to_owned()))
        .collect()
}

#[tokio::test]
async fn a_removed_workers_series_leave_with_it_and_the_others_stay() {
    let first = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let second = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let gateway = Gateway::start(&[
        "--worker-urls",
        &first.grpc_url(),
        "--served-model-name",
        "model",
        "--policy",
        "round_robin",
        "--health-check-interval-secs",
        "1",
        "--health-success-threshold",
        "1",
    ]);
    let register = async || {
        let (code, accepted) = gateway
            .admin(
                reqwest::Method::POST,
                "/workers",
                Some(json!({"url": second.grpc_url()})),
            )
            .await;
        assert_eq!(code, 202, "{accepted}");
        let id = accepted["id"].as_str().expect("an id").to_owned();
        support::poll_until("the registered worker is ready", async || {
            let (code, status) = gateway
                .admin(reqwest::Method::GET, &format!("/workers/{id}"), None)
                .await;
            (code == 200 && status["status"] == "ready").then_some(())
        })
        .await;
        id
    };
    let id = register().await;
    // Round robin: both workers are chosen.
    for _ in 0..4 {
        let answer = http()
            .post(gateway.url("/v1/chat/completions"))
            .json(&json!({"model": "model", "max_tokens": 2,
                "messages": [{"role": "user", "content": "Hi"}]}))
            .send()
            .await
            .expect("sent");
        assert_eq!(answer.status(), 200);
    }
    let text = scrape(&gateway).await;
    let kept = families_of(&text, &first.grpc_url());
    let removed = families_of(&text, &second.grpc_url());
    for family in [
        "smg_worker_health_state",
        "smg_worker_cb_state",
        "smg_worker_connections",
        "smg_worker_connects_total",
        "smg_worker_selection_total",
    ] {
        assert!(
            kept.contains(family),
            "{family} of the first worker:\n{text}"
        );
        assert!(
            removed.contains(family),
            "{family} of the second worker:\n{text}"
        );
    }

    let (code, answer) = gateway
        .admin(reqwest::Method::DELETE, &format!("/workers/{id}"), None)
        .await;
    assert_eq!(code, 202, "{answer}");
    // Its series go once it has drained and been let go...
    let text = support::poll_until("the removed worker's series are gone", async || {
        let text = scrape(&gateway).await;
        families_of(&text, &second.grpc_url())
            .is_empty()
            .then_some(text)
    })
    .await;
    // ... and every series of the other worker stays.
    assert_eq!(families_of(&text, &first.grpc_url()), kept, "{text}");
    assert!(promtool_problems(&text).is_none(), "{text}");

    // Registered again, the same URL's series come back.
    register().await;
    let text = scrape(&gateway).await;
    assert!(
        families_of(&text, &second.grpc_url()).contains("smg_worker_health_state"),
        "{text}"
    );
}

/// The gateway's stderr once it has logged `line`.
async fn log_with(log: &std::path::Path, line: &str) -> String {
    support::poll_until(&format!("the log says {line:?}"), async || {
        let text = std::fs::read_to_string(log).ok()?;
        text.contains(line).then_some(text)
    })
    .await
}

#[tokio::test]
async fn log_lines_are_coloured_only_when_asked_or_on_a_terminal() {
    let worker = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let dir = tempfile::tempdir().expect("a directory");
    let url = worker.grpc_url();
    for (color, coloured) in [
        (None, false),
        (Some("never"), false),
        (Some("always"), true),
    ] {
        let log = dir.path().join(format!("{color:?}.log"));
        let mut args = vec!["--worker-urls", url.as_str()];
        if let Some(color) = color {
            args.extend(["--log-color", color]);
        }
        // stderr is a file here: `auto` (the default) must not colour.
        let _gateway = Gateway::start_logged(&args, "info", &log);
        let text = log_with(&log, "smg serving").await;
        assert_eq!(text.contains('\u{1b}'), coloured, "{color:?}:\n{text}");
    }

    // --log-dir: the same lines in DIR/smg.YYYY-MM-DD as well (the
    // directory made by smg), never coloured, even when stderr is.
    let logs = dir.path().join("logs");
    let log = dir.path().join("with-dir.log");
    let logs_arg = logs.to_str().expect("a UTF-8 path");
    let _gateway = Gateway::start_logged(
        &[
            "--worker-urls",
            &url,
            "--log-color",
            "always",
            "--log-dir",
            logs_arg,
        ],
        "info",
        &log,
    );
    assert!(log_with(&log, "smg serving").await.contains('\u{1b}'));
    let file = support::poll_until("the log file says smg serving", async || {
        let mut text = String::new();
        for entry in std::fs::read_dir(&logs).ok()?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let date = name.strip_prefix("smg.").unwrap_or_default();
            assert!(
                date.len() == 10
                    && date.chars().enumerate().all(|(i, c)| if i == 4 || i == 7 {
                        c == '-'
                    } else {
                        c.is_ascii_digit()
                    }),
                "{name} is not smg.YYYY-MM-DD"
            );
            text.push_str(&std::fs::read_to_string(entry.path()).ok()?);
        }
        text.contains("smg serving").then_some(text)
    })
    .await;
    assert!(!file.contains('\u{1b}'), "{file}");
}

/// Runs `smg launch ARGS` to its failure, with backtraces asked for;
/// returns its stderr.
fn failed_start(args: &[&str]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_smg"))
        .arg("launch")
        .args([
            "--host",
            "127.0.0.1",
            "--prometheus-port",
            "0",
            "--admin-port",
            "0",
        ])
        .arg("--model-path")
        .arg(support::model_dir())
        .args(["--log-level", "error", "--history-backend", "memory"])
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .env_remove("RUST_LOG")
        .output()
        .expect("run smg");
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn a_start_up_mistake_is_one_line() {
    let worker = SimWorker::start("tokenspeed", "regular", &["--zero-delay"]);
    let url = worker.grpc_url();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = taken.local_addr().expect("its address").port().to_string();
    let missing = "/nonexistent/smg-test/cert.pem";
    // A --log-dir under a file cannot be made.
    let not_a_dir = tempfile::NamedTempFile::new().expect("a file");
    let log_dir = not_a_dir.path().join("logs");
    let log_dir = log_dir.to_str().expect("a UTF-8 path");
    let cases: [(&[&str], &[&str]); 3] = [
        (
            &["--worker-urls", &url, "--port", &port],
            &[&port, "in use"],
        ),
        (
            &[
                "--worker-urls",
                &url,
                "--port",
                "0",
                "--tls-cert-path",
                missing,
                "--tls-key-path",
                missing,
            ],
            &[missing],
        ),
        (
            &["--worker-urls", &url, "--port", "0", "--log-dir", log_dir],
            &["--log-dir", log_dir],
        ),
    ];
    for (args, names) in cases {
        let stderr = failed_start(args);
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line, no backtrace:\n{stderr}");
        assert!(lines[0].starts_with("smg: "), "{stderr}");
        for name in names {
            assert!(lines[0].contains(name), "names {name}: {stderr}");
        }
        let words: Vec<&str> = lines[0].split(": ").collect();
        let mut unique = words.clone();
        unique.dedup();
        assert_eq!(words, unique, "says each cause once: {stderr}");
    }
    // A flag's bad value: the parser's message names the flag, then one
    // hint; no backtrace.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_smg"))
        .args(["launch", "--port", "abc"])
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("run smg");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let first = stderr.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("error: ") && first.contains("--port"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("backtrace") && stderr.lines().count() <= 3,
        "{stderr}"
    );
    drop(taken);
}

/// The value of `family`'s series labelled `worker="{url}"`.
fn worker_gauge(text: &str, family: &str, url: &str) -> Option<f64> {
    let label = format!("worker=\"{url}\"");
    text.lines()
        .find(|line| line.starts_with(&format!("{family}{{")) && line.contains(&label))
        .and_then(|line| line.rsplit_once(' ')?.1.parse().ok())
}

/// A refused duplicate registration leaves the live worker's series alone:
/// the worker holds three streams open over one stream per connection, so
/// its pool has three connections; registering its URL again is refused
/// (409) and `smg_worker_connections` still says three, not the one
/// connection a new client would have started with.
#[tokio::test]
async fn a_refused_duplicate_registration_keeps_the_live_workers_connection_count() {
    let worker = SimWorker::start(
        "tokenspeed",
        "regular",
        &["--zero-delay", "--hold-after-tokens", "1"],
    );
    let url = worker.grpc_url();
    let gateway = Gateway::start(&[
        "--worker-urls",
        &url,
        "--served-model-name",
        "model",
        "--worker-streams-per-connection",
        "1",
    ]);
    let mut streams = Vec::new();
    for _ in 0..3 {
        let stream = bounded(
            "a held stream's head",
            http()
                .post(gateway.url("/v1/chat/completions"))
                .json(&json!({"model": "model", "max_tokens": 8, "stream": true,
                    "messages": [{"role": "user", "content": "Hi"}]}))
                .send(),
        )
        .await
        .expect("sent");
        assert_eq!(stream.status(), 200);
        streams.push(stream);
    }
    support::poll_until("three connections to the worker", async || {
        let text = scrape(&gateway).await;
        (worker_gauge(&text, "smg_worker_connections", &url) == Some(3.0)).then_some(())
    })
    .await;

    let (code, refused) = gateway
        .admin(reqwest::Method::POST, "/workers", Some(json!({"url": url})))
        .await;
    assert_eq!(code, 409, "{refused}");
    let text = scrape(&gateway).await;
    assert_eq!(
        worker_gauge(&text, "smg_worker_connections", &url),
        Some(3.0),
        "{text}"
    );

    worker.signal(nix::sys::signal::Signal::SIGUSR1);
    for stream in streams {
        let body = bounded("a released stream", stream.text())
            .await
            .expect("its body");
        assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    }
}

/// A gateway nobody scrapes must not hold every histogram observation:
/// the exporter keeps each one until it is folded into its buckets, and
/// its upkeep thread does that every `UPKEEP_INTERVAL` without a scrape.
/// 4 million observations (~64 MB held) must be let go within a few
/// intervals while observations keep coming, as in a gateway serving
/// (the exporter frees folded blocks through crossbeam's epochs, which a
/// recording thread advances); without the upkeep they stay until a
/// scrape that never comes. The recorder is this test process's (the only
/// test here that installs one); the other tests' gateways are processes
/// of their own.
#[test]
fn histogram_observations_are_let_go_without_a_scrape() {
    let _handle = smg::metrics::install().expect("the recorder installs");
    let before = HELD.load(Ordering::Relaxed);
    let histogram = metrics::histogram!(smg::metrics::REQUEST_DURATION, "router" => "upkeep-test");
    for i in 0..4_000_000u32 {
        histogram.record(f64::from(i % 1000) / 1000.0);
    }
    let recorded = HELD.load(Ordering::Relaxed) - before;
    assert!(
        recorded > 24 << 20,
        "the observations are held until folded: {recorded} bytes"
    );
    let patience = smg::metrics::UPKEEP_INTERVAL * 4;
    let deadline = Instant::now() + patience;
    loop {
        let held = HELD.load(Ordering::Relaxed) - before;
        if held < 8 << 20 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{held} bytes of {recorded} still held {patience:?} later, with no scrape"
        );
        // Requests go on: a thousand observations per 100 ms.
        for i in 0..1000u32 {
            histogram.record(f64::from(i) / 1000.0);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
