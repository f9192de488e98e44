//! One routing decision per policy (select + learn the route), timed call by
//! call over fleets of 8, 64 and 512 workers with 1k-token prompts; plus the
//! cache-aware radix tree's insert rate and memory per million tokens.
//!
//! Prompts share prefixes the way chat traffic does: 64 "system prompts" of
//! 512 tokens, each followed by a 512-token user part. Workers carry random
//! in-flight loads (0–3 requests) so load comparisons do real work.
//!
//! Run: `cargo bench --bench policy_selection` (`SMG_BENCH_DECISIONS=N`
//! changes the decisions per row). Not a test: nothing here asserts a speed.

use std::sync::Arc;
use std::time::Instant;

use smg::engine::{EngineClient, Runtime};
use smg::policies::{CacheAware, CacheAwareConfig, Policy, PolicyKind, Pool, SelectionRequest};
use smg::workers::{LoadGuard, Worker, WorkerRole};

const PROMPT_TOKENS: usize = 1024;
const PREFIXES: u32 = 64;

fn fleet(n: usize) -> Vec<Arc<Worker>> {
    (0..n)
        .map(|i| {
            let url = format!("grpc://10.0.{}.{}:50051", i / 250, i % 250 + 1);
            let client = EngineClient::new(&url, Runtime::TokenSpeed).expect("client");
            Arc::new(Worker::new(client, WorkerRole::Regular, None).expect("worker"))
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

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn print_row(name: &str, workers: usize, times: &mut [f64]) {
    times.sort_by(f64::total_cmp);
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    println!(
        "| {name} | {workers} | {mean:.2} | {:.2} | {:.2} |",
        percentile(times, 0.5),
        percentile(times, 0.99)
    );
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

fn main() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let _entered = runtime.enter();
    let decisions: usize = std::env::var("SMG_BENCH_DECISIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let traffic = prompts(2048, &mut rng);

    println!(
        "one routing decision (select + on_routed), {PROMPT_TOKENS}-token prompts, {decisions} decisions per row"
    );
    println!("| policy | workers | mean µs | p50 µs | p99 µs |");
    println!("|---|---:|---:|---:|---:|");
    for n in [8usize, 64, 512] {
        let workers = fleet(n);
        let _load: Vec<LoadGuard> = workers
            .iter()
            .flat_map(|w| (0..rng.next() % 4).map(|_| w.acquire_tokens(1000)))
            .collect();
        let available: Vec<usize> = (0..n).collect();
        let pool = Pool::new(&workers, &available, 1);
        for kind in PolicyKind::ALL {
            let policy = kind.build();
            let keys: Vec<String> = (0..256).map(|i| format!("session-{i}")).collect();
            let hash = [7u8; 32];
            let request = |i: usize| SelectionRequest {
                input_ids: &traffic[i % traffic.len()],
                routing_key: i.is_multiple_of(2).then(|| keys[i % keys.len()].as_str()),
                content_hash: i.is_multiple_of(5).then_some(&hash),
            };
            // Warm up: fill trees, rings and maps.
            for i in 0..traffic.len() {
                let r = request(i);
                let index = policy.select(&pool, &r);
                policy.on_routed(&workers[index], &r);
            }
            let mut times = Vec::with_capacity(decisions);
            for i in 0..decisions {
                let r = request(i);
                let started = Instant::now();
                let index = policy.select(&pool, &r);
                policy.on_routed(&workers[index], &r);
                times.push(started.elapsed().as_secs_f64() * 1e6);
            }
            print_row(policy.name(), n, &mut times);
            if kind == PolicyKind::CacheAware {
                // The lookup alone (the tree is warm; nothing is inserted).
                let mut lookups = Vec::with_capacity(decisions);
                for i in 0..decisions {
                    let r = request(i);
                    let started = Instant::now();
                    std::hint::black_box(policy.select(&pool, &r));
                    lookups.push(started.elapsed().as_secs_f64() * 1e6);
                }
                print_row("cache_aware (select only)", n, &mut lookups);
            }
        }
    }

    // Radix tree: inserts of unique 1k-token prompts into a large tree.
    let workers = fleet(64);
    let tree = CacheAware::new(CacheAwareConfig {
        max_pages: 1 << 22,
        ..CacheAwareConfig::default()
    });
    let unique: Vec<Vec<u32>> = (0..2000u32)
        .map(|p| {
            (0..PROMPT_TOKENS as u32)
                .map(|t| p.wrapping_mul(2_654_435_761) ^ t)
                .collect()
        })
        .collect();
    let before = rss_bytes();
    let started = Instant::now();
    let mut tokens = 0usize;
    for round in 0..4u32 {
        for (i, prompt) in unique.iter().enumerate() {
            let salted: Vec<u32> = prompt.iter().map(|t| t ^ (round << 20)).collect();
            let request = SelectionRequest {
                input_ids: &salted,
                ..Default::default()
            };
            tree.on_routed(&workers[i % workers.len()], &request);
            tokens += salted.len();
        }
    }
    let elapsed = started.elapsed();
    let grown = rss_bytes().saturating_sub(before);
    println!();
    println!(
        "radix tree: {tokens} tokens ({} pages) inserted in {:.1} ms: {:.2} M tokens/s, {:.0} k prompt inserts/s; RSS +{:.1} MiB = {:.1} MiB per million tokens",
        tree.pages(),
        elapsed.as_secs_f64() * 1e3,
        tokens as f64 / elapsed.as_secs_f64() / 1e6,
        (4 * unique.len()) as f64 / elapsed.as_secs_f64() / 1e3,
        grown as f64 / (1 << 20) as f64,
        grown as f64 / (1 << 20) as f64 / (tokens as f64 / 1e6),
    );
}
