//! The protocol-neutral simulated engine: scheduling, the timing model,
//! deterministic generation, the disaggregation roles, faults and load
//! accounting. The TokenSpeed and SGLang services translate their messages
//! into a [`GenerateJob`] and the [`Event`]s back.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::digest;
use crate::hostile::Hostility;
use crate::model::ModelFacts;
use crate::rendezvous::{self, FetchError, RoomStore};

/// What a worker does in the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    Regular,
    Prefill,
    Decode,
    Encode,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Regular => "regular",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Encode => "encode",
        }
    }
}

/// How long simulated work takes.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Prompt tokens processed per second (uncached tokens only).
    pub prefill_tokens_per_sec: f64,
    /// Base latency of one decode step.
    pub decode_ms_per_token: f64,
    /// Extra decode latency per concurrently running request.
    pub decode_ms_per_running_request: f64,
    /// Time to encode one media item.
    pub encode_ms_per_item: f64,
}

impl Timing {
    pub const ZERO: Timing = Timing {
        prefill_tokens_per_sec: 0.0,
        decode_ms_per_token: 0.0,
        decode_ms_per_running_request: 0.0,
        encode_ms_per_item: 0.0,
    };
}

/// Injected failures, for tests of the gateway's fault handling.
#[derive(Debug, Default)]
pub struct Faults {
    /// Fail the stream with INTERNAL after this many tokens.
    pub fail_after_tokens: Option<u32>,
    /// End the stream without a completion after this many tokens.
    pub drop_after_tokens: Option<u32>,
    /// Exit the process after this many tokens.
    pub exit_after_tokens: Option<u32>,
    /// Stop producing tokens (until cancelled) after this many tokens.
    pub stall_after_tokens: Option<u32>,
    /// Stop producing tokens after this many, until released.
    pub hold: Option<Hold>,
    /// The token faults above play only on this sequence of a request
    /// (`n` > 1); `None`: on every sequence.
    pub faulty_sequence: Option<u32>,
    /// Answer `accepted: false` to this many more Encode calls.
    pub refuse_encodes: AtomicU32,
    /// Fail this many more Encode calls with UNAVAILABLE.
    pub fail_encodes: AtomicU32,
    /// Exit the process in the middle of an Encode call.
    pub exit_on_encode: bool,
    /// Never answer Encode calls.
    pub stall_encodes: bool,
    /// Never publish KV caches or embeddings to the rendezvous.
    pub withhold_bootstrap: bool,
    /// Report unhealthy in HealthCheck.
    pub unhealthy: bool,
    /// Report unhealthy in HealthCheck while this file exists (flapping).
    pub unhealthy_while_exists: Option<std::path::PathBuf>,
}

/// Streams that stop after `after_tokens` tokens and go on once
/// `released` turns true (the test's signal: `--hold-after-tokens`), so a
/// test can act while a response is known to be in the middle of its
/// stream, and choose when it ends.
#[derive(Debug)]
pub struct Hold {
    pub after_tokens: u32,
    pub released: watch::Receiver<bool>,
}

/// Static engine settings.
#[derive(Debug)]
pub struct EngineConfig {
    pub role: Role,
    pub timing: Timing,
    pub faults: Faults,
    /// How tensors are taken in (including the never-unlink fault).
    pub intake: crate::tensor::Intake,
    /// Protocol promises to break (`--hostile`).
    pub hostile: crate::hostile::Hostility,
    pub bootstrap_timeout: Duration,
    pub default_max_new_tokens: u32,
    pub max_running_requests: u32,
    pub max_total_tokens: u32,
    /// Each Generate call's request id is appended here, one per line
    /// (tests check the ids the gateway sends).
    pub request_log: Option<std::path::PathBuf>,
    /// Each Generate call's constraint is appended here, one line per
    /// call: `<request id> <kind> <text>` (tests check what the gateway
    /// asked the engine to enforce).
    pub constraint_log: Option<std::path::PathBuf>,
    /// Each Generate call's prompt is appended here, one line per call:
    /// `<request id> <id>,<id>,...` (tests check which token ids reached
    /// the engine, e.g. that typed text made no placeholder ids).
    pub prompt_log: Option<std::path::PathBuf>,
    /// Each Abort call is appended here before it is answered, one line
    /// per call: `<request id> running|unknown` (tests check that the
    /// gateway aborted a leg, as opposed to merely closing its stream).
    pub abort_log: Option<std::path::PathBuf>,
    /// `--script`: canned completions for matching prompts.
    pub script: Option<crate::scripted::CompletionScript>,
    /// Each completion is appended here before it is sent, one line per
    /// sequence: `<request id> <role> index=I prompt=P completion=C
    /// cached=K`, the counts it reports (tests check the gateway's usage
    /// against what the engines said).
    pub usage_log: Option<std::path::PathBuf>,
    /// Each new peak of the Generate calls held at once (waiting for a
    /// scheduler slot or running) is appended here, one `peak N` line per
    /// rise (tests check that the gateway never sent more than the
    /// worker's `max_running_requests`).
    pub peak_log: Option<std::path::PathBuf>,
    /// `--agent`: tool calls and answers made from the prompt's tools.
    pub agent: Option<crate::agent::AgentModel>,
}

/// A peer's bootstrap server and the room to fetch there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendezvous {
    pub host: String,
    pub port: u16,
    pub room: i64,
}

/// Where a media item's fingerprint comes from.
#[derive(Debug, Clone)]
pub enum ItemSource {
    /// The worker read the item's tensors itself.
    Received([u8; 32]),
    /// EPD: fetch the item's embedding from its encode worker.
    FromEncoder(Rendezvous),
    /// Placeholders and grid only (decode's view of an item).
    MetadataOnly,
}

/// The sampling controls the simulation honors.
#[derive(Debug, Clone, Default)]
pub struct Sampling {
    pub max_new_tokens: Option<u32>,
    pub min_new_tokens: u32,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub n: u32,
    /// Output logprobs requested, with this many alternatives per token.
    pub logprobs: Option<u32>,
    /// The request's JSON-schema constraint (`--agent` writes JSON that
    /// matches it; other constraints are not simulated).
    pub json_schema: Option<String>,
    /// The request's constraint as `KIND TEXT` (`json_schema`, `regex`,
    /// `ebnf_grammar`, `structural_tag`), for `--constraint-log`.
    pub constraint: Option<String>,
}

/// Simulated output logprobs: the token at output position `p` (0-based)
/// has logprob `-(p + 1) / 8`; alternative `k` (0 = the token itself) has
/// id `token + k` (wrapping within `vocab`) and logprob `-(p + 1) / 8 - k`.
/// Exact in f32, so tests can check what the gateway renders.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SimLogprobs {
    pub token_logprobs: Vec<f32>,
    pub token_ids: Vec<u32>,
    /// Per position: (logprobs, ids) of the alternatives, best first.
    pub top: Vec<(Vec<f32>, Vec<u32>)>,
}

impl SimLogprobs {
    pub fn for_tokens(tokens: &[u32], first_position: usize, top_k: u32, vocab: u32) -> Self {
        let mut out = Self::default();
        for (offset, &token) in tokens.iter().enumerate() {
            let logprob = -((first_position + offset + 1) as f32) / 8.0;
            out.token_logprobs.push(logprob);
            out.token_ids.push(token);
            let alternatives = (0..top_k).map(|k| ((token + k) % vocab.max(1), logprob - k as f32));
            let (ids, values): (Vec<u32>, Vec<f32>) = alternatives.unzip();
            out.top.push((values, ids));
        }
        out
    }
}

/// One generate call, protocol-neutral.
#[derive(Debug, Clone)]
pub struct GenerateJob {
    pub request_id: String,
    pub input_ids: Vec<u32>,
    pub items: Vec<ItemSource>,
    pub sampling: Sampling,
    pub stream: bool,
    pub kv: Option<Rendezvous>,
}

/// Streamed tokens of one sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    pub index: u32,
    pub token_ids: Vec<u32>,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub cached_tokens: u32,
    pub logprobs: Option<SimLogprobs>,
}

/// The end of one sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct Complete {
    pub index: u32,
    pub output_ids: Vec<u32>,
    pub finish_reason: &'static str,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub cached_tokens: u32,
    pub matched_token_id: Option<u32>,
    /// For unary calls: logprobs of every output token.
    pub logprobs: Option<SimLogprobs>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Chunk(Chunk),
    Complete(Complete),
}

pub type EventStream = mpsc::Receiver<Result<Event, Status>>;

/// Load figures in the shape GetLoads reports them.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadSnapshot {
    pub running: i32,
    pub waiting: i32,
    pub used_tokens: i32,
    pub waiting_uncached_tokens: i32,
    pub max_total_tokens: i32,
    pub max_running_requests: i32,
    pub gen_throughput: f64,
    pub cache_hit_rate: f64,
}

impl LoadSnapshot {
    pub fn token_usage(&self) -> f64 {
        f64::from(self.used_tokens) / f64::from(self.max_total_tokens.max(1))
    }

    pub fn utilization(&self) -> f64 {
        f64::from(self.running) / f64::from(self.max_running_requests.max(1))
    }
}

/// Words the simulated model "says" after its digest header.
const FILLER_WORDS: &[&str] = &[
    " the", " model", " gateway", " routes", " tokens", " to", " a", " worker", " and", " streams",
    " them", " back", " quickly", " with", " care", " over", " many", " cores", " while",
    " images", " flow", " through", " shared", " memory", " lanes", " for", " every", " request",
    " that", " arrives", " on", " time",
];

/// Prefix-cache page size, in tokens.
const CACHE_PAGE: usize = 16;
/// Pages the simulated prefix cache remembers.
const CACHE_CAPACITY: usize = 1 << 16;

#[derive(Debug, Default)]
struct PrefixCache {
    pages: HashSet<[u8; 32]>,
    order: VecDeque<[u8; 32]>,
}

impl PrefixCache {
    /// Returns how many leading tokens were cached, then caches all pages.
    fn lookup_and_insert(&mut self, ids: &[u32]) -> u32 {
        let mut hasher = blake3::Hasher::new();
        let mut cached = 0;
        let mut still_matching = true;
        for page in ids.chunks_exact(CACHE_PAGE) {
            for id in page {
                hasher.update(&id.to_le_bytes());
            }
            let key = *hasher.finalize().as_bytes();
            if still_matching && self.pages.contains(&key) {
                cached += CACHE_PAGE as u32;
            } else {
                still_matching = false;
                if self.pages.insert(key) {
                    self.order.push_back(key);
                }
            }
        }
        while self.order.len() > CACHE_CAPACITY {
            if let Some(old) = self.order.pop_front() {
                self.pages.remove(&old);
            }
        }
        cached
    }

    fn clear(&mut self) {
        self.pages.clear();
        self.order.clear();
    }
}

#[derive(Debug, Default)]
struct Counters {
    running: AtomicI64,
    waiting: AtomicI64,
    /// Generate calls held, waiting or running, and their peak.
    held: AtomicI64,
    peak_held: AtomicI64,
    used_tokens: AtomicI64,
    waiting_uncached_tokens: AtomicI64,
    prompt_tokens_total: AtomicU64,
    cached_tokens_total: AtomicU64,
    /// (unix second, tokens generated in it), the last few seconds.
    generated: Mutex<VecDeque<(u64, u64)>>,
}

/// Throughput is averaged over this many seconds.
const THROUGHPUT_WINDOW_SECS: u64 = 5;

impl Counters {
    fn note_generated(&self, tokens: u64) {
        let now = unix_seconds();
        let mut window = lock(&self.generated);
        match window.back_mut() {
            Some((second, count)) if *second == now => *count += tokens,
            _ => window.push_back((now, tokens)),
        }
        while window
            .front()
            .is_some_and(|(second, _)| second + THROUGHPUT_WINDOW_SECS <= now)
        {
            window.pop_front();
        }
    }

    fn throughput(&self) -> f64 {
        let now = unix_seconds();
        let window = lock(&self.generated);
        let total: u64 = window
            .iter()
            .filter(|(second, _)| second + THROUGHPUT_WINDOW_SECS > now)
            .map(|(_, count)| count)
            .sum();
        total as f64 / THROUGHPUT_WINDOW_SECS as f64
    }
}

fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// Appends `request_id` as a line of `path` (one `write` call, so lines
/// of concurrent calls do not interleave).
fn log_request_id(path: &std::path::Path, request_id: &str) {
    log_line(path, request_id);
}

/// Appends `line` to the file at `path`.
fn log_line(path: &std::path::Path, line: &str) {
    use std::io::Write;
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut file| file.write_all(format!("{line}\n").as_bytes()));
    if let Err(err) = written {
        tracing::warn!(path = %path.display(), %err, "cannot write the log line");
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The simulated engine shared by every RPC of one worker process.
#[derive(Debug)]
pub struct Engine {
    pub config: EngineConfig,
    pub model: ModelFacts,
    pub rooms: RoomStore,
    pub started: SystemTime,
    cache: Mutex<PrefixCache>,
    counters: Counters,
    running: Mutex<HashMap<String, CancellationToken>>,
    permits: Semaphore,
    filler_tokens: Vec<Vec<u32>>,
}

/// How a sequence (or the whole request) ended early.
#[derive(Debug)]
enum Stop {
    /// The client went away; nothing more to send.
    ClientGone,
    /// An injected fault ended the stream (the error, if any, was sent).
    Fault,
}

impl Engine {
    pub fn new(config: EngineConfig, model: ModelFacts) -> anyhow::Result<Self> {
        let filler_tokens = FILLER_WORDS
            .iter()
            .map(|word| model.encode(word))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let permits = Semaphore::new(config.max_running_requests.max(1) as usize);
        Ok(Self {
            config,
            model,
            rooms: RoomStore::default(),
            started: SystemTime::now(),
            cache: Mutex::default(),
            counters: Counters::default(),
            running: Mutex::default(),
            permits,
            filler_tokens,
        })
    }

    pub fn role(&self) -> Role {
        self.config.role
    }

    /// Checks a job against the role and starts it; events arrive on the
    /// returned stream. Requests a role cannot serve fail here, before any
    /// event.
    pub fn generate(self: &Arc<Self>, job: GenerateJob) -> Result<EventStream, Status> {
        if let Some(path) = &self.config.request_log {
            log_request_id(path, &job.request_id);
        }
        if let (Some(path), Some(constraint)) =
            (&self.config.constraint_log, &job.sampling.constraint)
        {
            log_line(path, &format!("{} {constraint}", job.request_id));
        }
        if let Some(path) = &self.config.prompt_log {
            let ids: Vec<String> = job.input_ids.iter().map(u32::to_string).collect();
            log_line(path, &format!("{} {}", job.request_id, ids.join(",")));
        }
        match (self.config.role, &job.kv) {
            (Role::Encode, _) => {
                return Err(Status::failed_precondition(
                    "this is an encode worker: it serves Encode, not Generate",
                ));
            }
            (Role::Prefill | Role::Decode, None) => {
                return Err(Status::invalid_argument(format!(
                    "a {} worker needs the request's bootstrap host, port and room",
                    self.config.role.name()
                )));
            }
            (Role::Regular, Some(_)) => {
                return Err(Status::invalid_argument(
                    "a regular worker does not take part in a PD rendezvous",
                ));
            }
            _ => {}
        }
        if let Some(text) = &self.config.hostile.reject {
            return Err(Status::invalid_argument(text.clone()));
        }
        if job.input_ids.is_empty() {
            return Err(Status::invalid_argument("the prompt has no tokens"));
        }
        if job.input_ids.len() > self.model.max_context_length as usize {
            return Err(Status::invalid_argument(format!(
                "the prompt has {} tokens; the context holds {}",
                job.input_ids.len(),
                self.model.max_context_length
            )));
        }
        if let Some(bad) = job
            .input_ids
            .iter()
            .find(|&&id| id >= self.model.vocab_size)
        {
            return Err(Status::invalid_argument(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.model.vocab_size
            )));
        }
        let (sender, receiver) = mpsc::channel(64);
        let engine = Arc::clone(self);
        tokio::spawn(async move {
            let request_id = job.request_id.clone();
            if let Err(status) = engine.run(job, &sender).await {
                tracing::debug!(%request_id, %status, "request failed");
                let _ = sender.send(Err(status)).await;
            }
        });
        Ok(receiver)
    }

    /// Counts a Generate call as held, logging each new peak to the peak
    /// log.
    fn note_held(&self) -> Held<'_> {
        let now = self.counters.held.fetch_add(1, Ordering::AcqRel) + 1;
        let before = self.counters.peak_held.fetch_max(now, Ordering::Relaxed);
        if now > before
            && let Some(path) = &self.config.peak_log
        {
            log_line(path, &format!("peak {now}"));
        }
        Held {
            gauge: &self.counters.held,
            unanswered: AtomicU32::new(1),
        }
    }

    async fn run(
        self: &Arc<Self>,
        job: GenerateJob,
        sender: &mpsc::Sender<Result<Event, Status>>,
    ) -> Result<(), Status> {
        let prompt_tokens = job.input_ids.len() as u32;
        let cancel = CancellationToken::new();
        let held = self.note_held();
        let _running = {
            let _waiting = Gauge::add(&self.counters.waiting, 1);
            let _waiting_tokens = Gauge::add(
                &self.counters.waiting_uncached_tokens,
                i64::from(prompt_tokens),
            );
            let permit = tokio::select! {
                permit = self.permits.acquire() => permit,
                () = sender.closed() => return Ok(()),
            };
            let permit = permit.map_err(|_| Status::unavailable("the worker is shutting down"))?;
            RunningGuard::enter(self, &job.request_id, cancel.clone(), permit)
        };
        let _kv_tokens = Gauge::add(&self.counters.used_tokens, i64::from(prompt_tokens));

        let (prompt_digest, cached_tokens) = match self.config.role {
            Role::Decode => {
                let peer = job
                    .kv
                    .as_ref()
                    .ok_or_else(|| Status::internal("checked above"))?;
                // An abort (or the gateway going away) ends the wait, as
                // it ends generation.
                let kv = tokio::select! {
                    kv = self.fetch(peer, "KV cache") => kv?,
                    () = cancel.cancelled() => return Ok(()),
                    () = sender.closed() => return Ok(()),
                };
                (kv, 0)
            }
            _ => self.prefill(&job).await?,
        };
        self.counters
            .prompt_tokens_total
            .fetch_add(u64::from(prompt_tokens), Ordering::Relaxed);
        self.counters
            .cached_tokens_total
            .fetch_add(u64::from(cached_tokens), Ordering::Relaxed);

        let mut sampling = job.sampling.clone();
        if self.config.role == Role::Prefill {
            if let Some(peer) = job
                .kv
                .as_ref()
                .filter(|_| !self.config.faults.withhold_bootstrap)
            {
                self.rooms.publish(peer.room, prompt_digest);
            }
            // Prefill's job ends with the first token; decode streams the rest.
            sampling.n = 1;
            sampling.max_new_tokens = Some(1);
            sampling.min_new_tokens = 0;
        }
        let scripted = self.planned_completion(&job, &mut sampling);
        let calm = Hostility::default();
        let hostile = match &self.config.hostile.only_for {
            Some(marker) => {
                let prompt = self.model.decode_prompt(&job.input_ids).unwrap_or_default();
                if prompt.contains(marker.as_str()) {
                    &self.config.hostile
                } else {
                    &calm
                }
            }
            None => &self.config.hostile,
        };
        held.unanswered.store(sampling.n.max(1), Ordering::Relaxed);
        let context = SequenceContext {
            held: &held,
            scripted,
            hostile,
            request_id: &job.request_id,
            prompt_digest,
            prompt_tokens,
            cached_tokens,
            sampling: &sampling,
            stream: job.stream,
            cancel: &cancel,
            sender,
        };
        let sequences = (0..sampling.n.max(1)).map(|index| self.sequence(&context, index));
        match futures::future::try_join_all(sequences).await {
            Ok(_) | Err(Stop::ClientGone) | Err(Stop::Fault) => Ok(()),
        }
    }

    /// The completion `--script` or `--agent` plans for this prompt, if
    /// any, read from the prompt decoded with special tokens kept (decode in
    /// PD sees the same prompt ids as prefill, so plans the same text). An
    /// agent's answer is as long as it needs when the request sets no
    /// `max_new_tokens`, as a real engine's is; a script's keeps the default.
    fn planned_completion(&self, job: &GenerateJob, sampling: &mut Sampling) -> Option<Arc<[u32]>> {
        if self.config.script.is_none() && self.config.agent.is_none() {
            return None;
        }
        let prompt = self.model.decode_prompt(&job.input_ids)?;
        if let Some(tokens) = self
            .config
            .script
            .as_ref()
            .and_then(|script| script.completion_for(&prompt))
        {
            return Some(tokens);
        }
        let agent = self.config.agent.as_ref()?;
        let text = agent.completion_for(&prompt, job.sampling.json_schema.as_deref())?;
        let tokens = match self.model.encode(&text) {
            Ok(tokens) => tokens,
            Err(err) => {
                tracing::warn!(%err, "the agent's answer cannot be encoded; usual output instead");
                return None;
            }
        };
        if sampling.max_new_tokens.is_none() {
            let needed = u32::try_from(tokens.len()).unwrap_or(u32::MAX);
            sampling.max_new_tokens = Some(needed.max(self.config.default_max_new_tokens));
        }
        Some(tokens.into())
    }

    /// Computes the prompt's fingerprint (fetching EPD embeddings) and
    /// simulates the prefill's compute time.
    async fn prefill(&self, job: &GenerateJob) -> Result<([u8; 32], u32), Status> {
        let mut item_digests = Vec::with_capacity(job.items.len());
        for (index, item) in job.items.iter().enumerate() {
            item_digests.push(match item {
                ItemSource::Received(digest) => *digest,
                ItemSource::FromEncoder(peer) => self.fetch(peer, "embedding").await?,
                ItemSource::MetadataOnly => {
                    return Err(Status::invalid_argument(format!(
                        "media item {index} carries neither a tensor nor encode bootstrap info"
                    )));
                }
            });
        }
        let cached = lock(&self.cache).lookup_and_insert(&job.input_ids);
        let uncached = job.input_ids.len() as f64 - f64::from(cached);
        if self.config.timing.prefill_tokens_per_sec > 0.0 {
            sleep_ms(1000.0 * uncached / self.config.timing.prefill_tokens_per_sec).await;
        }
        Ok((digest::prompt_digest(&job.input_ids, &item_digests), cached))
    }

    async fn fetch(&self, peer: &Rendezvous, what: &str) -> Result<[u8; 32], Status> {
        rendezvous::fetch(
            &peer.host,
            peer.port,
            peer.room,
            self.config.bootstrap_timeout,
        )
        .await
        .map_err(|err| match err {
            FetchError::Timeout { .. } => {
                Status::deadline_exceeded(format!("{what} never arrived: {err}"))
            }
            FetchError::Unreachable { .. } => {
                Status::unavailable(format!("{what} transfer failed: {err}"))
            }
            FetchError::Refused { .. } => {
                Status::internal(format!("{what} transfer failed: {err}"))
            }
        })
    }

    /// Generates one sequence of a request.
    async fn sequence(&self, context: &SequenceContext<'_>, index: u32) -> Result<(), Stop> {
        let sampling = context.sampling;
        let faults = &self.config.faults;
        let hostile = context.hostile;
        // Hostile: past max_new_tokens, EOS and stop ids alike.
        let overrun = hostile.overrun_tokens.is_some();
        let max_new_tokens = hostile.overrun_tokens.unwrap_or(
            sampling
                .max_new_tokens
                .unwrap_or(self.config.default_max_new_tokens),
        );
        let ignore_eos = sampling.ignore_eos || overrun;
        let wire_index = index.saturating_add(hostile.sequence_index);
        let faulty = faults.faulty_sequence.is_none_or(|faulty| faulty == index);
        let at = |fault: Option<u32>| fault.filter(|_| faulty);
        let mut script = match &context.scripted {
            Some(tokens) => Script::scripted(self, tokens),
            None => Script::new(self, &context.prompt_digest, index),
        };
        let mut output_ids: Vec<u32> = Vec::new();
        let mut generated = Gauge::add(&self.counters.used_tokens, 0);
        let logprobs = |tokens: &[u32], first_position: usize, top_k: u32| {
            self.logprobs(hostile, tokens, first_position, top_k)
        };
        let complete = |output_ids: &[u32], finish_reason, matched_token_id| Complete {
            index: wire_index,
            output_ids: output_ids.to_vec(),
            finish_reason,
            prompt_tokens: context.prompt_tokens,
            completion_tokens: output_ids.len() as u32,
            cached_tokens: context.cached_tokens,
            matched_token_id,
            logprobs: sampling
                .logprobs
                .filter(|_| !context.stream)
                .map(|top_k| logprobs(output_ids, 0, top_k)),
        };
        let finish = loop {
            let produced = output_ids.len() as u32;
            if produced >= max_new_tokens {
                break complete(&output_ids, "length", None);
            }
            if Some(produced) == at(faults.exit_after_tokens) {
                tracing::warn!("fault injection: exiting after {produced} tokens");
                std::process::exit(17);
            }
            if Some(produced) == at(faults.fail_after_tokens) {
                let status = Status::internal(format!("injected failure after {produced} tokens"));
                let _ = context.sender.send(Err(status)).await;
                return Err(Stop::Fault);
            }
            if Some(produced) == at(faults.drop_after_tokens) {
                return Err(Stop::Fault);
            }
            if Some(produced) == at(faults.stall_after_tokens) {
                tokio::select! {
                    () = context.cancel.cancelled() => {}
                    () = context.sender.closed() => return Err(Stop::ClientGone),
                }
            }
            if let Some(hold) = faults.hold.as_ref().filter(|_| faulty)
                && produced == hold.after_tokens
            {
                let mut released = hold.released.clone();
                tokio::select! {
                    // An error is the sender gone: nothing will release it.
                    _ = released.wait_for(|released| *released) => {}
                    () = context.cancel.cancelled() => {}
                    () = context.sender.closed() => return Err(Stop::ClientGone),
                }
            }
            if context.cancel.is_cancelled() {
                break complete(&output_ids, "abort", None);
            }
            self.decode_step_delay(context.cancel).await;
            if context.cancel.is_cancelled() {
                break complete(&output_ids, "abort", None);
            }

            // One event carries `step` tokens: never past max_new_tokens,
            // and never past a fault's token count (checked above, per event).
            let step = script
                .tokens_per_event()
                .min((max_new_tokens - produced) as usize)
                .min(self.tokens_before_next_fault(produced));
            let mut event_tokens = Vec::with_capacity(step);
            let mut stopped_by = None;
            for _ in 0..step {
                let produced = output_ids.len() as u32;
                let may_stop = produced >= sampling.min_new_tokens && !overrun;
                let natural_end = may_stop && !ignore_eos && script.at_natural_end(produced);
                let token = if natural_end {
                    self.model.eos_token_ids[0]
                } else {
                    script.next_token()
                };
                output_ids.push(token);
                event_tokens.push(token);
                let is_eos = !ignore_eos && self.model.eos_token_ids.contains(&token);
                if may_stop && (is_eos || sampling.stop_token_ids.contains(&token)) {
                    stopped_by = Some(token);
                    break;
                }
            }
            generated.bump(event_tokens.len() as i64);
            self.counters.note_generated(event_tokens.len() as u64);
            if context.stream {
                let first_position = output_ids.len() - event_tokens.len();
                let chunk = Chunk {
                    index: wire_index,
                    logprobs: sampling
                        .logprobs
                        .map(|top_k| logprobs(&event_tokens, first_position, top_k)),
                    token_ids: event_tokens,
                    prompt_tokens: context.prompt_tokens,
                    completion_tokens: output_ids.len() as u32,
                    cached_tokens: context.cached_tokens,
                };
                if context.sender.send(Ok(Event::Chunk(chunk))).await.is_err() {
                    return Err(Stop::ClientGone);
                }
            }
            if let Some(token) = stopped_by {
                break complete(&output_ids, "stop", Some(token));
            }
        };
        if let Some(path) = &self.config.usage_log {
            log_line(
                path,
                &format!(
                    "{} {} index={} prompt={} completion={} cached={}",
                    context.request_id,
                    self.config.role.name(),
                    finish.index,
                    finish.prompt_tokens,
                    finish.completion_tokens,
                    finish.cached_tokens
                ),
            );
        }
        context.held.answered_one();
        if context
            .sender
            .send(Ok(Event::Complete(finish)))
            .await
            .is_err()
        {
            return Err(Stop::ClientGone);
        }
        Ok(())
    }

    /// How many tokens may be produced after `produced` before a fault's
    /// token count is reached (so one event never jumps over a fault).
    fn tokens_before_next_fault(&self, produced: u32) -> usize {
        let faults = &self.config.faults;
        [
            faults.exit_after_tokens,
            faults.fail_after_tokens,
            faults.drop_after_tokens,
            faults.stall_after_tokens,
            faults.hold.as_ref().map(|hold| hold.after_tokens),
        ]
        .into_iter()
        .flatten()
        .filter(|&at| at > produced)
        .map(|at| (at - produced) as usize)
        .min()
        .unwrap_or(usize::MAX)
    }

    /// The logprobs reported for `tokens`: as [`SimLogprobs::for_tokens`]
    /// describes, unless hostile mode sends more alternatives than asked or
    /// fewer values than tokens.
    fn logprobs(
        &self,
        hostile: &Hostility,
        tokens: &[u32],
        first_position: usize,
        top_k: u32,
    ) -> SimLogprobs {
        let top_k = hostile.logprob_alternatives.unwrap_or(top_k);
        let mut logprobs =
            SimLogprobs::for_tokens(tokens, first_position, top_k, self.model.vocab_size);
        if hostile.short_logprobs {
            logprobs.token_logprobs.pop();
        }
        logprobs
    }

    async fn decode_step_delay(&self, cancel: &CancellationToken) {
        let timing = &self.config.timing;
        let running = self.counters.running.load(Ordering::Relaxed).max(1) as f64;
        let ms = timing.decode_ms_per_token + timing.decode_ms_per_running_request * running;
        if ms > 0.0 {
            tokio::select! {
                () = sleep_ms(ms) => {}
                () = cancel.cancelled() => {}
            }
        } else {
            tokio::task::yield_now().await;
        }
    }

    /// Reads an encode call's item and publishes its embedding under `room`.
    pub async fn encode(&self, item_digest: [u8; 32], room: i64) -> Result<bool, Status> {
        let faults = &self.config.faults;
        if faults.exit_on_encode {
            tracing::warn!("fault injection: exiting in the middle of Encode");
            std::process::exit(17);
        }
        if faults.stall_encodes {
            std::future::pending::<()>().await;
        }
        if take_one(&faults.fail_encodes) {
            return Err(Status::unavailable("injected encode failure"));
        }
        if take_one(&faults.refuse_encodes) {
            return Ok(false);
        }
        if self.config.timing.encode_ms_per_item > 0.0 {
            sleep_ms(self.config.timing.encode_ms_per_item).await;
        }
        if !faults.withhold_bootstrap {
            self.rooms.publish(room, item_digest);
        }
        Ok(true)
    }

    /// Cancels a running request; true when it was found.
    pub fn abort(&self, request_id: &str) -> bool {
        let found = match lock(&self.running).get(request_id) {
            Some(cancel) => {
                cancel.cancel();
                true
            }
            None => false,
        };
        if let Some(path) = &self.config.abort_log {
            let outcome = if found { "running" } else { "unknown" };
            log_line(path, &format!("{request_id} {outcome}"));
        }
        found
    }

    pub fn flush_cache(&self) {
        lock(&self.cache).clear();
    }

    pub fn loads(&self) -> LoadSnapshot {
        let prompt = self.counters.prompt_tokens_total.load(Ordering::Relaxed);
        let cached = self.counters.cached_tokens_total.load(Ordering::Relaxed);
        let gauge = |g: &AtomicI64| g.load(Ordering::Relaxed).clamp(0, i64::from(i32::MAX)) as i32;
        LoadSnapshot {
            running: gauge(&self.counters.running),
            waiting: gauge(&self.counters.waiting),
            used_tokens: gauge(&self.counters.used_tokens),
            waiting_uncached_tokens: gauge(&self.counters.waiting_uncached_tokens),
            max_total_tokens: self.config.max_total_tokens.min(i32::MAX as u32) as i32,
            max_running_requests: self.config.max_running_requests.min(i32::MAX as u32) as i32,
            gen_throughput: self.counters.throughput(),
            cache_hit_rate: if prompt == 0 {
                0.0
            } else {
                cached as f64 / prompt as f64
            },
        }
    }

    pub fn uptime(&self) -> Duration {
        self.started.elapsed().unwrap_or_default()
    }
}

struct SequenceContext<'a> {
    held: &'a Held<'a>,
    /// `--script`: the tokens this prompt's completion is made of.
    scripted: Option<Arc<[u32]>>,
    /// How this request's generation misbehaves (`--hostile`; nothing for
    /// a prompt `only-for` does not match).
    hostile: &'a Hostility,
    request_id: &'a str,
    prompt_digest: [u8; 32],
    prompt_tokens: u32,
    cached_tokens: u32,
    sampling: &'a Sampling,
    stream: bool,
    cancel: &'a CancellationToken,
    sender: &'a mpsc::Sender<Result<Event, Status>>,
}

/// The deterministic text of one sequence: the digest header, then filler
/// words chosen by a generator seeded from the digest and the index; or, for
/// a prompt `--script` matches, the scripted tokens (then filler, if EOS is
/// ignored).
struct Script<'a> {
    engine: &'a Engine,
    pending: VecDeque<u32>,
    rng: StdRng,
    natural_length: u32,
    /// Scripted output cycles through [`crate::scripted::TOKENS_PER_EVENT`];
    /// other output is streamed one token per event.
    scripted: bool,
    events: usize,
}

impl<'a> Script<'a> {
    fn new(engine: &'a Engine, prompt_digest: &[u8; 32], index: u32) -> Self {
        let header = digest::output_header(prompt_digest);
        let pending: VecDeque<u32> = engine.model.encode(&header).unwrap_or_default().into();
        let mut seed = *prompt_digest;
        for (byte, extra) in seed.iter_mut().zip(index.to_le_bytes()) {
            *byte ^= extra;
        }
        let natural_length =
            pending.len() as u32 + 8 + (u32::from(prompt_digest[8]) + index * 7) % 40;
        Self {
            engine,
            pending,
            rng: StdRng::from_seed(seed),
            natural_length,
            scripted: false,
            events: 0,
        }
    }

    fn scripted(engine: &'a Engine, tokens: &[u32]) -> Self {
        Self {
            engine,
            pending: tokens.iter().copied().collect(),
            rng: StdRng::from_seed([0; 32]),
            natural_length: tokens.len() as u32,
            scripted: true,
            events: 0,
        }
    }

    /// How many tokens the next streamed event carries.
    fn tokens_per_event(&mut self) -> usize {
        if !self.scripted {
            return 1;
        }
        let sizes = crate::scripted::TOKENS_PER_EVENT;
        let size = sizes[self.events % sizes.len()];
        self.events += 1;
        size
    }

    fn at_natural_end(&self, produced: u32) -> bool {
        produced >= self.natural_length
    }

    fn next_token(&mut self) -> u32 {
        loop {
            if let Some(token) = self.pending.pop_front() {
                return token;
            }
            let words = &self.engine.filler_tokens;
            let word = &words[self.rng.random_range(0..words.len())];
            self.pending.extend(word.iter().copied());
        }
    }
}

/// Adds to a gauge for as long as it lives.
struct Gauge<'a> {
    gauge: &'a AtomicI64,
    amount: i64,
}

impl<'a> Gauge<'a> {
    fn add(gauge: &'a AtomicI64, amount: i64) -> Self {
        gauge.fetch_add(amount, Ordering::Relaxed);
        Self { gauge, amount }
    }

    fn bump(&mut self, amount: i64) {
        self.gauge.fetch_add(amount, Ordering::Relaxed);
        self.amount += amount;
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.gauge.fetch_sub(self.amount, Ordering::Relaxed);
    }
}

/// A Generate call counted as held until its last sequence's answer is
/// about to be sent (or it ends without one): the count falls before the
/// client can see the answer and send another call, so a client that waits
/// for answers never sees more held than it had outstanding.
struct Held<'a> {
    gauge: &'a AtomicI64,
    /// Sequences not yet answered.
    unanswered: AtomicU32,
}

impl Held<'_> {
    fn answered_one(&self) {
        if self.unanswered.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.gauge.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if *self.unanswered.get_mut() > 0 {
            self.gauge.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A running request: counted, abortable by id, holding a scheduler slot.
struct RunningGuard<'a> {
    engine: &'a Engine,
    request_id: String,
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl<'a> RunningGuard<'a> {
    fn enter(
        engine: &'a Engine,
        request_id: &str,
        cancel: CancellationToken,
        permit: tokio::sync::SemaphorePermit<'a>,
    ) -> Self {
        engine.counters.running.fetch_add(1, Ordering::Relaxed);
        lock(&engine.running).insert(request_id.to_owned(), cancel);
        Self {
            engine,
            request_id: request_id.to_owned(),
            _permit: permit,
        }
    }
}

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        self.engine.counters.running.fetch_sub(1, Ordering::Relaxed);
        lock(&self.engine.running).remove(&self.request_id);
    }
}

fn take_one(counter: &AtomicU32) -> bool {
    counter
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok()
}

async fn sleep_ms(ms: f64) {
    if ms > 0.0 && ms.is_finite() {
        tokio::time::sleep(Duration::from_secs_f64(ms / 1000.0)).await;
    }
}

/// Shared engine handle used by the services.
pub type SharedEngine = Arc<Engine>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_cache_counts_whole_leading_pages() {
        let mut cache = PrefixCache::default();
        let prompt: Vec<u32> = (0..40).collect();
        assert_eq!(cache.lookup_and_insert(&prompt), 0);
        assert_eq!(cache.lookup_and_insert(&prompt), 32, "two full pages");
        let mut other = prompt.clone();
        other[20] = 999;
        assert_eq!(cache.lookup_and_insert(&other), 16, "diverges in page two");
        cache.clear();
        assert_eq!(cache.lookup_and_insert(&prompt), 0);
    }

    #[test]
    fn take_one_counts_down_to_zero() {
        let counter = AtomicU32::new(2);
        assert!(take_one(&counter));
        assert!(take_one(&counter));
        assert!(!take_one(&counter));
    }
}
