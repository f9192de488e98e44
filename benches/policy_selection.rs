//! Routing decisions per policy, with criterion: one decision (`select` plus
//! `on_routed`, where cache_aware queues the route for its background
//! inserter) over fleets of 8, 64 and 512 workers with 1k-token prompts;
//! the cache-aware radix tree's insert rate (tokens/s, inserted inline).
//! After criterion, a scripted pass times decisions one by one and prints
//! p50/p99 per policy (criterion reports means), and the tree's memory per
//! million tokens.
//!
//! Prompts share prefixes the way chat traffic does: 64 "system prompts" of
//! 512 tokens, each followed by a 512-token user part. Workers carry random
//! in-flight loads (0–3 requests) so load comparisons do real work. Every
//! 32 decisions the benchmark waits, untimed, for cache_aware's background
//! inserter to catch up, as it does in a gateway that routes fewer than its
//! ~20k prompts/s.
//!
//! Run: `cargo bench --bench policy_selection` (criterion's arguments after
//! `--`, e.g. a filter; `SMG_BENCH_DECISIONS=N` changes the decisions per
//! row of the percentile pass). Not a test: nothing here asserts a speed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use smg::engine::{EngineClient, Runtime};
use smg::policies::{CacheAware, CacheAwareConfig, Policy, PolicyKind, Pool, SelectionRequest};
use smg::workers::{LoadGuard, Worker, WorkerRole};

const PROMPT_TOKENS: usize = 1024;
const PREFIXES: u32 = 64;
const FLEETS: [usize; 3] = [8, 64, 512];
/// Decisions between untimed waits for the background inserter.
const SETTLE_EVERY: usize = 32;

fn fleet(n: usize) -> Vec<Arc<Worker>> {
    (0..n)
        .map(|i| {
            let url = format!("grpc://10.0.{}.{}:50051", i / 250, i % 250 + 1);
            let client = EngineClient::new(&url, Runtime::TokenSpeed).expect("client");
            Arc::new(Worker::new(Arc::new(client), WorkerRole::Regular, None).expect("worker"))
        })
        .collect()
}

/// A deterministic pseudo-random stream (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn prompts(count: usize, rng: &mut Rng) -> Vec<Vec<u32>> {
    (0..count)
        .map(|_| {
            let prefix = (rng.next() % u64::from(PREFIXES)) as u32;
            let mut ids: Vec<u32> = (0..PROMPT_TOKENS as u32 / 2)
                .map(|t| (prefix * 7919 + t * 31) % 4000)
                .collect();
            ids.extend((0..PROMPT_TOKENS / 2).map(|_| (rng.next() % 4000) as u32));
            ids
        })
        .collect()
}

/// One fleet with its load and the traffic it is routed.
struct Scene {
    workers: Vec<Arc<Worker>>,
    available: Vec<usize>,
    _load: Vec<LoadGuard>,
    traffic: Arc<Vec<Vec<u32>>>,
    keys: Vec<String>,
    hash: [u8; 32],
}

impl Scene {
    fn new(n: usize, traffic: Arc<Vec<Vec<u32>>>, rng: &mut Rng) -> Self {
        let workers = fleet(n);
        let load = workers
            .iter()
            .flat_map(|w| (0..rng.next() % 4).map(|_| w.acquire_tokens(1000)))
            .collect();
        Self {
            available: (0..n).collect(),
            workers,
            _load: load,
            traffic,
            keys: (0..256).map(|i| format!("session-{i}")).collect(),
            hash: [7u8; 32],
        }
    }

    fn pool(&self) -> Pool<'_> {
        Pool::new(&self.workers, &self.available, 1)
    }

    /// The `i`th request: every other one carries a routing key, every
    /// fifth an image hash.
    fn request(&self, i: usize) -> SelectionRequest<'_> {
        SelectionRequest {
            input_ids: &self.traffic[i % self.traffic.len()],
            routing_key: i
                .is_multiple_of(2)
                .then(|| self.keys[i % self.keys.len()].as_str()),
            content_hash: i.is_multiple_of(5).then_some(&self.hash),
        }
    }

    /// One routing decision.
    fn decide(&self, policy: &dyn Policy, i: usize) -> usize {
        let request = self.request(i);
        let index = policy.select(&self.pool(), &request);
        policy.on_routed(&self.workers[index], &request);
        index
    }

    /// A fresh policy of `kind` that has seen the traffic once.
    fn warm(&self, kind: PolicyKind) -> Arc<dyn Policy> {
        let policy = kind.build();
        for i in 0..self.traffic.len() {
            self.decide(policy.as_ref(), i);
        }
        policy.settle();
        policy
    }

    /// Times `count` decisions from decision `start` on, in batches between
    /// the untimed waits (one clock read per batch, for criterion).
    fn timed_batches(&self, policy: &dyn Policy, start: usize, count: usize) -> Duration {
        let mut total = Duration::ZERO;
        let mut i = start;
        while i < start + count {
            let batch_end = (start + count).min(i + SETTLE_EVERY);
            let started = Instant::now();
            for decision in i..batch_end {
                std::hint::black_box(self.decide(policy, decision));
            }
            total += started.elapsed();
            policy.settle();
            i = batch_end;
        }
        total
    }

    /// Times `count` decisions one by one, from decision `start` on.
    fn timed(&self, policy: &dyn Policy, start: usize, count: usize) -> Vec<Duration> {
        let mut times = Vec::with_capacity(count);
        for i in start..start + count {
            let started = Instant::now();
            std::hint::black_box(self.decide(policy, i));
            times.push(started.elapsed());
            if i % SETTLE_EVERY == SETTLE_EVERY - 1 {
                policy.settle();
            }
        }
        times
    }
}

fn bench_decisions(criterion: &mut Criterion, scenes: &[Scene]) {
    let mut group = criterion.benchmark_group("decision");
    for scene in scenes {
        let n = scene.workers.len();
        for kind in PolicyKind::ALL {
            let policy = scene.warm(kind);
            let mut next = 0usize;
            group.bench_function(BenchmarkId::new(policy.name(), n), |b| {
                b.iter_custom(|iters| {
                    let count = usize::try_from(iters).unwrap_or(usize::MAX);
                    let total = scene.timed_batches(policy.as_ref(), next, count);
                    next = next.wrapping_add(count);
                    total
                });
            });
        }
    }
    group.finish();
}

/// Unique 1k-token prompts, salted per round.
fn unique_prompts(count: u32, round: u32) -> Vec<Vec<u32>> {
    (0..count)
        .map(|p| {
            (0..PROMPT_TOKENS as u32)
                .map(|t| p.wrapping_mul(2_654_435_761) ^ t ^ (round << 20))
                .collect()
        })
        .collect()
}

fn inline_tree(max_pages: usize) -> CacheAware {
    CacheAware::new(CacheAwareConfig {
        max_pages,
        background_inserts: false,
        ..CacheAwareConfig::default()
    })
}

fn bench_tree_inserts(criterion: &mut Criterion) {
    let workers = fleet(64);
    let mut group = criterion.benchmark_group("radix_tree");
    group.throughput(Throughput::Elements(PROMPT_TOKENS as u64));
    // The default size: once full, inserts include their share of eviction.
    let tree = inline_tree(1 << 20);
    let mut round = 0u32;
    group.bench_function("insert_1k_token_prompt", |b| {
        b.iter_custom(|iters| {
            let prompts = unique_prompts(u32::try_from(iters).unwrap_or(u32::MAX), round);
            round += 1;
            let started = Instant::now();
            for (i, prompt) in prompts.iter().enumerate() {
                let request = SelectionRequest {
                    input_ids: prompt,
                    ..Default::default()
                };
                tree.on_routed(&workers[i % workers.len()], &request);
            }
            started.elapsed()
        });
    });
    group.finish();
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn print_row(name: &str, workers: usize, times: &[Duration]) {
    let mut micros: Vec<f64> = times.iter().map(|t| t.as_secs_f64() * 1e6).collect();
    micros.sort_by(f64::total_cmp);
    let mean = micros.iter().sum::<f64>() / micros.len() as f64;
    println!(
        "| {name} | {workers} | {mean:.2} | {:.2} | {:.2} | {:.2} |",
        percentile(&micros, 0.5),
        percentile(&micros, 0.99),
        percentile(&micros, 0.999),
    );
}

fn percentile_pass(scenes: &[Scene]) {
    let decisions: usize = std::env::var("SMG_BENCH_DECISIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    println!();
    println!(
        "one routing decision (select + on_routed), {PROMPT_TOKENS}-token prompts, {decisions} decisions per row"
    );
    println!("| policy | workers | mean µs | p50 µs | p99 µs | p99.9 µs |");
    println!("|---|---:|---:|---:|---:|---:|");
    for scene in scenes {
        for kind in PolicyKind::ALL {
            let policy = scene.warm(kind);
            let times = scene.timed(policy.as_ref(), 0, decisions);
            print_row(policy.name(), scene.workers.len(), &times);
            if kind == PolicyKind::CacheAware {
                // The same decisions with the route inserted inline.
                let inline = inline_tree(1 << 20);
                for i in 0..scene.traffic.len() {
                    scene.decide(&inline, i);
                }
                let times = scene.timed(&inline, 0, decisions);
                print_row("cache_aware (insert inline)", scene.workers.len(), &times);
            }
        }
    }
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Memory per million tokens: RSS growth while a tree takes unique prompts.
fn tree_memory() {
    let workers = fleet(64);
    let tree = inline_tree(1 << 22);
    let before = rss_bytes();
    let started = Instant::now();
    let mut tokens = 0usize;
    for round in 0..4u32 {
        for (i, prompt) in unique_prompts(2000, round).iter().enumerate() {
            let request = SelectionRequest {
                input_ids: prompt,
                ..Default::default()
            };
            tree.on_routed(&workers[i % workers.len()], &request);
            tokens += prompt.len();
        }
    }
    let elapsed = started.elapsed();
    let grown = rss_bytes().saturating_sub(before);
    println!();
    println!(
        "radix tree: {tokens} tokens ({} pages) inserted in {:.1} ms: {:.2} M tokens/s; \
         RSS +{:.1} MiB = {:.1} MiB per million tokens",
        tree.pages(),
        elapsed.as_secs_f64() * 1e3,
        tokens as f64 / elapsed.as_secs_f64() / 1e6,
        grown as f64 / (1 << 20) as f64,
        grown as f64 / (1 << 20) as f64 / (tokens as f64 / 1e6),
    );
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let _entered = runtime.enter();
    // Memory first, before anything else has grown the heap.
    tree_memory();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let traffic = Arc::new(prompts(2048, &mut rng));
    let scenes: Vec<Scene> = FLEETS
        .iter()
        .map(|&n| Scene::new(n, Arc::clone(&traffic), &mut rng))
        .collect();
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_millis(1500))
        .configure_from_args();
    bench_decisions(&mut criterion, &scenes);
    bench_tree_inserts(&mut criterion);
    criterion.final_summary();
    percentile_pass(&scenes);
}
