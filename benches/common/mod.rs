//! Helpers the scripted end-to-end benchmarks share: a closed-loop load
//! driver, percentiles, per-process CPU time and memory, core pinning and
//! settings from the environment.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The committed fixture images (`file://` URLs under it must be
/// allow-listed with `--allowed-local-media-path`).
pub fn images_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("dataplane/tests/fixtures/images")
}

/// A one-token chat about the committed 1920x1080 photo, sent as a
/// `file://` URL: the benches' image request.
pub fn photo_chat() -> serde_json::Value {
    let photo = format!(
        "file://{}",
        images_dir().join("photo_1920x1080.jpg").display()
    );
    serde_json::json!({"model": "model", "max_tokens": 1, "ignore_eos": true,
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": photo}},
            {"type": "text", "text": "What is in the picture?"}]}]})
}

pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Runs `op` from `concurrency` loops for `duration`; returns latencies (ms)
/// and the wall time.
pub async fn closed_loop<F, Fut>(
    concurrency: usize,
    duration: Duration,
    op: F,
) -> (Vec<f64>, Duration)
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let op = Arc::new(op);
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (op, stop) = (Arc::clone(&op), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let begin = Instant::now();
                    if op().await {
                        latencies.push(begin.elapsed().as_secs_f64() * 1000.0);
                    }
                }
                latencies
            })
        })
        .collect();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap_or_default());
    }
    (all, started.elapsed())
}

/// Sends `op` at Poisson arrivals of `rate` per second for `duration`
/// (seeded, so runs are comparable), each in its own task so a slow answer
/// never delays the next send, and returns the successful ones' latencies
/// (ms, from the moment the task starts the request) and the number of
/// failures.
pub async fn open_loop<F, Fut>(rate: f64, duration: Duration, seed: u64, op: F) -> (Vec<f64>, usize)
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send + 'static,
{
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let start = tokio::time::Instant::now();
    let mut scheduled = start;
    let mut tasks = Vec::new();
    loop {
        // Exponential inter-arrival times: -ln(U) / rate, U in (0, 1].
        let uniform: f64 = 1.0 - rng.random::<f64>();
        scheduled += Duration::from_secs_f64(-uniform.ln() / rate);
        if scheduled.duration_since(start) >= duration {
            break;
        }
        tokio::time::sleep_until(scheduled).await;
        let request = op();
        tasks.push(tokio::spawn(async move {
            let sent = std::time::Instant::now();
            let ok = request.await;
            ok.then(|| sent.elapsed().as_secs_f64() * 1000.0)
        }));
    }
    let (mut latencies, mut failures) = (Vec::with_capacity(tasks.len()), 0);
    for task in tasks {
        match task.await {
            Ok(Some(latency)) => latencies.push(latency),
            _ => failures += 1,
        }
    }
    (latencies, failures)
}

/// CPU seconds (user + system) the threads of process `pid` whose name
/// starts with `prefix` have used so far (`/proc/<pid>/task/*/stat`).
pub fn threads_cpu_seconds(pid: u32, prefix: &str) -> Option<f64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0.0;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let Some((head, tail)) = stat.rsplit_once(')') else {
            continue;
        };
        let name = head.split_once('(').map_or("", |(_, name)| name);
        if !name.starts_with(prefix) {
            continue;
        }
        let fields: Vec<&str> = tail.split_whitespace().collect();
        let user: f64 = fields.get(11).and_then(|f| f.parse().ok()).unwrap_or(0.0);
        let system: f64 = fields.get(12).and_then(|f| f.parse().ok()).unwrap_or(0.0);
        total += (user + system) / 100.0;
    }
    Some(total)
}

/// CPU seconds (user + system) a process has used so far, from
/// `/proc/<pid>/stat`; `None` where procfs is unavailable.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) follow ")".
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let user: f64 = fields.get(11)?.parse().ok()?;
    let system: f64 = fields.get(12)?.parse().ok()?;
    // USER_HZ is 100 on the Linux builds this runs on (x86_64, arm64).
    Some((user + system) / 100.0)
}

/// Seconds the threads of process `pid` have spent runnable but waiting
/// for a core (the second field of `/proc/<pid>/task/*/schedstat`). CPU
/// time plus this wait, per wall second, near 1.0 means the process always
/// had work: it was saturated, whether or not it got the core to itself.
pub fn run_queue_wait_seconds(pid: u32) -> Option<f64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let nanos: u64 = tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum();
    Some(nanos as f64 * 1e-9)
}

/// Jiffies the whole machine has spent busy and in total so far (all cores,
/// from the `cpu` line of `/proc/stat`); `None` where procfs is unavailable.
pub fn machine_jiffies() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|line| line.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|field| field.parse().ok())
        .collect();
    let total: u64 = fields.iter().sum();
    // idle and iowait are the 4th and 5th fields.
    let idle = fields.get(3)? + fields.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// The 1-minute load average.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Restricts the calling thread to `cores` (`None`: every core the machine
/// has). Threads and processes it starts afterwards inherit the mask, so a
/// benchmark pins itself only while it drives load and widens the mask again
/// before it starts a gateway, which sizes its data plane from the cores it
/// is allowed.
pub fn set_thread_cores(cores: Option<&[usize]>) {
    // SAFETY: `cpu_set_t` is plain data; CPU_ZERO/CPU_SET write inside it and
    // sched_setaffinity(0, ..) only reads it for the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        match cores {
            Some(cores) => cores.iter().for_each(|&core| libc::CPU_SET(core, &mut set)),
            // The kernel keeps only the cores that exist (and are allowed).
            None => (0..libc::CPU_SETSIZE as usize).for_each(|core| libc::CPU_SET(core, &mut set)),
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Pins every thread of process `pid` to `core` (`taskset`, when present).
pub fn pin(pid: u32, core: usize) {
    let _ = std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", &core.to_string(), &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

/// The environment variable `name` parsed, or `default` when it is unset
/// or does not parse.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// A memory figure of process `pid` from `/proc/PID/status`, in bytes:
/// `field` is its line's name with the colon (`VmRSS:`, `VmHWM:`).
pub fn proc_status_bytes(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Bytes as MiB.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// An HTTP/1.1 client for open-loop runs: one connection per request in
/// flight, kept for reuse.
pub fn open_loop_client() -> reqwest::Client {
    reqwest::Client::builder()
        .http1_only()
        .pool_max_idle_per_host(20_000)
        .timeout(Duration::from_secs(300))
        .build()
        .expect("client")
}

/// One chat request: its answer as a label ("200", "429 queue_full",
/// "503 no_healthy_worker", "transport error") and how long it took, in ms.
pub async fn classified_chat(
    client: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
) -> (String, f64) {
    let sent = Instant::now();
    let answer = match client.post(url).json(body).send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            let body: serde_json::Value = response.json().await.unwrap_or(serde_json::Value::Null);
            match body["error"]["code"].as_str() {
                Some(code) => format!("{status} {code}"),
                None if status == 200 && body["choices"][0]["message"].is_object() => {
                    "200".to_owned()
                }
                None => format!("{status} (no error code)"),
            }
        }
        Err(err) if err.is_connect() => "connect error".to_owned(),
        Err(err) if err.is_timeout() => "client timeout".to_owned(),
        Err(_) => "transport error".to_owned(),
    };
    (answer, sent.elapsed().as_secs_f64() * 1000.0)
}
