//! Running the benchmark: set-up (validation, model discovery, workload,
//! connections, warmup), then one open-loop run per sweep point.
//!
//! The dispatcher walks the arrival schedule: it waits for each arrival's
//! scheduled instant, then for a concurrency slot (if capped), and spawns the
//! unit. Every request's latency starts at its scheduled instant, so time
//! spent waiting for a slot, or behind a late timer, is never hidden
//! (coordinated omission). Timers sleep to 1 ms before the deadline and
//! yield for the rest, so the schedule is kept to well under a millisecond
//! when the client is not saturated; `schedule_lag` shows when it is.

use std::convert::Infallible;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{Semaphore, mpsc};

use crate::cli::{Args, Endpoint, Rate, Sweep};
use crate::client::{BaseUrl, Client, get};
use crate::error::{SetupError, SetupResult};
use crate::prom::{Delta, Scraper, deltas};
use crate::record::{Outcome, RequestRecord};
use crate::schedule::Arrivals;
use crate::stats::{Summary, summarize};
use crate::text::TokenCounter;
use crate::workload::{self, Workload};

/// Connections opened ahead of a capped run at most.
const MAX_PRECONNECT: usize = 4096;

/// Everything a run needs, built once before the first point.
#[derive(Debug)]
pub struct Setup {
    pub args: Args,
    pub model: String,
    pub counter: TokenCounter,
    pub workload: Workload,
    pub client: Client,
    pub scraper: Option<Scraper>,
}

/// The parameters that vary between sweep points.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Point {
    pub request_rate: Rate,
    pub max_concurrency: Option<usize>,
}

/// One point's results.
#[derive(Debug, Serialize)]
pub struct PointResult {
    pub point: Point,
    pub summary: Summary,
    #[serde(skip)]
    pub records: Vec<RequestRecord>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_deltas: Option<Vec<Delta>>,
}

/// A whole invocation's results.
#[derive(Debug, Serialize)]
pub struct Report {
    pub model: String,
    pub config: Args,
    pub points: Vec<PointResult>,
}

fn invalid(msg: impl Into<String>) -> SetupError {
    SetupError::InvalidArgument(msg.into())
}

/// The points to run, in order.
pub fn points(args: &Args) -> Vec<Point> {
    let base = Point {
        request_rate: args.request_rate,
        max_concurrency: args.max_concurrency,
    };
    match &args.sweep {
        None => vec![base],
        Some(Sweep::RequestRate(rates)) => rates
            .iter()
            .map(|&request_rate| Point {
                request_rate,
                ..base
            })
            .collect(),
        Some(Sweep::MaxConcurrency(caps)) => caps
            .iter()
            .map(|&c| Point {
                max_concurrency: Some(c),
                ..base
            })
            .collect(),
    }
}

/// Rejects flag combinations that cannot run.
pub fn validate(args: &Args) -> SetupResult<()> {
    if args.num_prompts == 0 {
        return Err(invalid("--num-prompts must be at least 1"));
    }
    if let Some(d) = args.duration
        && !(d > 0.0 && d.is_finite())
    {
        return Err(invalid("--duration must be a positive number of seconds"));
    }
    if let Some(secs) = args.wait_ready
        && !(secs > 0.0 && secs.is_finite())
    {
        return Err(invalid("--wait-ready must be a positive number of seconds"));
    }
    if args.max_concurrency == Some(0) {
        return Err(invalid("--max-concurrency must be at least 1"));
    }
    if args.threads == 0 {
        return Err(invalid("--threads must be at least 1"));
    }
    if !(args.timeout_secs > 0.0 && args.timeout_secs.is_finite()) {
        return Err(invalid("--timeout-secs must be a positive number"));
    }
    if args.turns == 0 || args.prefix_groups == 0 {
        return Err(invalid("--turns and --prefix-groups must be at least 1"));
    }
    if args.duration.is_some() {
        for p in points(args) {
            if p.request_rate.is_infinite() && p.max_concurrency.is_none() {
                return Err(invalid(
                    "--duration with --request-rate inf needs --max-concurrency (or the run would open unbounded connections)",
                ));
            }
        }
    }
    Ok(())
}

/// How often `--wait-ready` asks.
const READY_POLL: Duration = Duration::from_millis(100);

/// `--wait-ready SECS`: asks `GET /readiness` until it answers 200 (a
/// gateway started just before, or still reaching its workers), failing
/// with the last answer after `within`.
pub async fn wait_ready(base: &BaseUrl, base_url: &str, within: Duration) -> SetupResult<()> {
    let deadline = Instant::now() + within;
    let path = base.join("/readiness");
    loop {
        let last = match get(base, &path, READY_POLL.max(Duration::from_secs(2))).await {
            Ok((200, _)) => return Ok(()),
            Ok((status, body)) => format!(
                "status {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(300)])
            ),
            Err(why) => why,
        };
        if Instant::now() + READY_POLL > deadline {
            return Err(SetupError::ServerNotReady(format!(
                "{base_url}/readiness did not answer 200 within --wait-ready {} s (last: {last})",
                within.as_secs_f64()
            )));
        }
        tokio::time::sleep(READY_POLL).await;
    }
}

/// Asks `GET /v1/models` for the served model's name.
async fn discover_model(base: &BaseUrl) -> SetupResult<String> {
    let fail = |why: String| {
        SetupError::ModelDiscoveryFailed(format!(
            "cannot learn the model name from GET /v1/models ({why}); pass --model"
        ))
    };
    let (status, body) = get(base, &base.join("/v1/models"), Duration::from_secs(10))
        .await
        .map_err(fail)?;
    if status != 200 {
        return Err(fail(format!("status {status}")));
    }
    let value: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| fail(format!("not JSON: {e}")))?;
    value["data"][0]["id"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| fail("no data[0].id".into()))
}

/// Validates flags, learns the model, builds every request and connects.
pub async fn prepare(args: Args) -> SetupResult<Setup> {
    validate(&args)?;
    let base = BaseUrl::resolve_with(&args.base_url, args.ca_cert.as_deref()).await?;
    if let Some(secs) = args.wait_ready {
        wait_ready(&base, &args.base_url, Duration::from_secs_f64(secs)).await?;
    }
    let model = match (&args.model, args.endpoint) {
        (Some(model), _) => model.clone(),
        (None, Endpoint::Generate) => String::new(),
        (None, _) => discover_model(&base).await?,
    };
    let counter = TokenCounter::load(args.tokenizer.as_deref())?;
    let workload = workload::build(&args, &model, &counter)?;
    let client = Client::new(
        base,
        args.endpoint,
        args.stream,
        args.api_key.as_deref(),
        counter.is_exact(),
        Duration::from_secs_f64(args.timeout_secs),
    )?;
    let scraper = match &args.metrics_url {
        Some(url) => Some(Scraper::new(url).await?),
        None => None,
    };
    Ok(Setup {
        args,
        model,
        counter,
        workload,
        client,
        scraper,
    })
}

/// Prepares, warms up, and runs every point.
pub async fn run(args: Args) -> SetupResult<Report> {
    let setup = Arc::new(prepare(args).await?);
    warm_up(&setup).await;
    let mut results = Vec::new();
    for point in points(&setup.args) {
        results.push(run_point(&setup, point).await?);
    }
    Ok(Report {
        model: setup.model.clone(),
        config: setup.args.clone(),
        points: results,
    })
}

/// Sends the warmup units (closed loop at the concurrency cap) and discards them.
pub async fn warm_up(setup: &Arc<Setup>) {
    let units = setup.workload.warmup_units;
    if units == 0 {
        return;
    }
    let lanes = setup.args.max_concurrency.unwrap_or(units).clamp(1, units);
    let next = Arc::new(AtomicU64::new(0));
    let mut lanes_done = Vec::with_capacity(lanes);
    for _ in 0..lanes {
        let setup = setup.clone();
        let next = next.clone();
        lanes_done.push(tokio::spawn(async move {
            let epoch = Instant::now();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= units {
                    break;
                }
                for prepared in setup.workload.warmup_unit(i) {
                    let mut outcome = Outcome::default();
                    setup.client.execute(prepared, epoch, &mut outcome).await;
                }
            }
        }));
    }
    for lane in lanes_done {
        let _ = lane.await;
    }
}

/// Waits until `deadline`: a timer to 1 ms before it, then yields.
async fn wait_until(deadline: Instant) {
    let now = Instant::now();
    if deadline <= now {
        return;
    }
    if deadline - now > Duration::from_millis(2) {
        tokio::time::sleep_until((deadline - Duration::from_millis(1)).into()).await;
    }
    while Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Runs one point of the schedule.
pub async fn run_point(setup: &Arc<Setup>, point: Point) -> SetupResult<PointResult> {
    let args = &setup.args;
    let before = match &setup.scraper {
        Some(s) => Some(s.scrape().await?),
        None => None,
    };
    if let Some(cap) = point.max_concurrency {
        let idle_target = cap.min(MAX_PRECONNECT);
        setup
            .client
            .preconnect(idle_target.saturating_sub(setup.client.idle_count()))
            .await?;
    }
    let mut arrivals = Arrivals::new(point.request_rate, args.burstiness, args.seed)?;
    let units = setup.workload.units();
    let turns = setup.workload.turns;
    let expected = if args.duration.is_some() {
        1024
    } else {
        units * turns
    };
    let outcomes: Arc<Mutex<Vec<Outcome>>> = Arc::new(Mutex::new(Vec::with_capacity(expected)));
    let completed = Arc::new(AtomicU64::new(0));
    let slots = point.max_concurrency.map(|c| Arc::new(Semaphore::new(c)));
    let (done_tx, mut done_rx) = mpsc::channel::<Infallible>(1);
    let progress = Progress::start(args, units * turns, completed.clone());

    let cpu_before = process_cpu_secs();
    let epoch = Instant::now();
    let mut request_seq: u32 = 0;
    for sequence in 0usize.. {
        let offset = arrivals.next_offset();
        match args.duration {
            Some(d) if offset > d || epoch.elapsed().as_secs_f64() > d => break,
            None if sequence >= units => break,
            _ => {}
        }
        let scheduled = match point.request_rate {
            Rate::Finite(_) => {
                let at = epoch + Duration::from_secs_f64(offset);
                wait_until(at).await;
                Some(at)
            }
            Rate::Infinite => None,
        };
        let permit = match &slots {
            Some(slots) => slots.clone().acquire_owned().await.ok(),
            None => None,
        };
        if let (Some(d), None) = (args.duration, scheduled)
            && epoch.elapsed().as_secs_f64() > d
        {
            break;
        }
        // Without a schedule, latency starts when the request gets its slot.
        let scheduled = scheduled.unwrap_or_else(Instant::now);
        let unit = sequence % units;
        let first_request = request_seq;
        request_seq = request_seq.wrapping_add(turns as u32);
        let setup = setup.clone();
        let outcomes = outcomes.clone();
        let completed = completed.clone();
        let done = done_tx.clone();
        tokio::spawn(async move {
            let mut turn_scheduled = nanos(scheduled.saturating_duration_since(epoch));
            for (turn, prepared) in setup.workload.unit(unit).iter().enumerate() {
                let mut outcome = Outcome {
                    request: first_request.wrapping_add(turn as u32),
                    unit: unit as u32,
                    turn: turn as u32,
                    scheduled_ns: turn_scheduled,
                    ..Outcome::default()
                };
                setup.client.execute(prepared, epoch, &mut outcome).await;
                // The next turn is due as soon as this one has its answer.
                turn_scheduled = outcome.end_ns;
                let failed = outcome.error.is_some();
                outcomes
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(outcome);
                completed.fetch_add(1, Ordering::Relaxed);
                if failed {
                    break;
                }
            }
            drop(permit);
            // Release the setup before signalling completion.
            drop(setup);
            drop(done);
        });
    }
    drop(done_tx);
    // Every task holds a sender: `recv` ends when the last one is done.
    let _ = done_rx.recv().await;
    let client_cpu_s = process_cpu_secs() - cpu_before;
    let wall_s = epoch.elapsed().as_secs_f64();
    progress.finish();

    let outcomes = std::mem::take(&mut *outcomes.lock().unwrap_or_else(|p| p.into_inner()));
    let mut records: Vec<RequestRecord> = outcomes
        .into_iter()
        .map(|o| {
            let prepared = &setup.workload.unit(o.unit as usize)[o.turn as usize];
            RequestRecord::from_outcome(o, prepared, &setup.counter, args.stream)
        })
        .collect();
    records.sort_by(|a, b| {
        a.scheduled_s
            .total_cmp(&b.scheduled_s)
            .then(a.request.cmp(&b.request))
    });
    let mut summary = summarize(
        &records,
        point.request_rate,
        point.max_concurrency,
        args.slo.as_ref(),
    );
    summary.client_cpu_s = client_cpu_s;
    summary.client_cpu_utilization = if wall_s > 0.0 {
        client_cpu_s / wall_s
    } else {
        0.0
    };
    let metrics_deltas = match (&setup.scraper, before) {
        (Some(s), Some(before)) => Some(deltas(&before, &s.scrape().await?)),
        _ => None,
    };
    Ok(PointResult {
        point,
        summary,
        records,
        metrics_deltas,
    })
}

/// User + system CPU seconds used by this process so far.
fn process_cpu_secs() -> f64 {
    // SAFETY: getrusage only writes into the zeroed struct we own.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return 0.0;
        }
        usage
    };
    let secs = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// A progress bar on a terminal (stderr), nothing otherwise.
struct Progress {
    ticker: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    fn start(args: &Args, total: usize, completed: Arc<AtomicU64>) -> Self {
        if args.no_progress || !std::io::stderr().is_terminal() {
            return Progress { ticker: None };
        }
        let bar = match args.duration {
            Some(_) => indicatif::ProgressBar::new_spinner(),
            None => indicatif::ProgressBar::new(total as u64),
        };
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} requests ({per_sec})",
        ) {
            bar.set_style(style);
        }
        let ticker = tokio::spawn(async move {
            loop {
                bar.set_position(completed.load(Ordering::Relaxed));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Progress {
            ticker: Some(ticker),
        }
    }

    fn finish(self) {
        if let Some(ticker) = self.ticker {
            ticker.abort();
            // Clear the bar's line.
            eprint!("\r\x1b[2K");
        }
    }
}
