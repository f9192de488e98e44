//! Cache-aware routing: send a prompt to the worker that most likely still
//! holds its prefix in KV cache, unless the fleet is out of balance.
//!
//! The policy keeps an approximate radix tree over token ids, one per model
//! (a policy instance serves one model's role). Edges are 16-token pages, as
//! engines page their prefix caches; a node is named by a 64-bit chained
//! hash of the whole prefix up to it ("approximate": two prefixes could
//! collide, which costs at most one cache miss), and remembers which workers
//! took a prompt through it and when. The nodes live in a few shards by key,
//! each behind its own lock, so a lookup never waits for more than one
//! shard's update. The tree is bounded: past its share of `max_pages` a shard
//! evicts its least recently used eighth (found under the read lock,
//! removed in small batches under the write lock). Because a route
//! touches every node on its path with one tick, a parent is never older
//! than its children and eviction trims from the leaves.
//!
//! A request finds the deepest node of its page path in the tree (a binary
//! search over its page keys); the deepest node held by an available worker
//! gives the match. If the match covers at least `match_threshold` of the
//! prompt and the fleet is balanced, the least loaded of that node's holders
//! wins; otherwise the least loaded worker does.
//!
//! The route taken is learned off the request path: `on_routed` queues it
//! (a bounded queue; when full the route is not learned, as the tree is an
//! approximation anyway) and a background thread, started with the first
//! route, inserts it. A decision hashes its prompt once: `select` and
//! `on_routed` on one thread share the page keys of the last prompt.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use std::time::Instant;

use super::{Policy, Pool, SelectionRequest, least_loaded_from, request_load};
use crate::shared_prefix::shared_prefix_len;
use crate::workers::Worker;

/// Tokens per page (engines' prefix caches page at 16 tokens).
pub(super) const PAGE_TOKENS: usize = 16;

/// Lock shards of the tree (a power of two).
const SHARDS: usize = 16;

/// Routes waiting for the background insert before new ones are dropped.
const INSERT_QUEUE: usize = 4096;

/// Prompts up to this many tokens have their page keys kept per thread for
/// `on_routed` (longer ones are hashed again rather than pinned in memory).
const KEY_CACHE_TOKENS: usize = 32 * 1024;

/// Tunables, with SMG's defaults.
#[derive(Debug, Clone, Copy)]
pub struct CacheAwareConfig {
    /// Share of the prompt that must match to follow the cache.
    pub match_threshold: f64,
    /// The fleet is imbalanced when max − min load exceeds this...
    pub balance_abs_threshold: u64,
    /// ...and max exceeds min × this.
    pub balance_rel_threshold: f64,
    /// Tree nodes (pages) remembered before the least recently used go.
    pub max_pages: usize,
    /// Learn routes on a background thread (off the request path); `false`
    /// inserts inside `on_routed`.
    pub background_inserts: bool,
}

impl Default for CacheAwareConfig {
    fn default() -> Self {
        Self {
            match_threshold: 0.5,
            balance_abs_threshold: 32,
            balance_rel_threshold: 1.5,
            max_pages: 1 << 20,
            background_inserts: true,
        }
    }
}

/// The keys are already well-mixed hashes: use them as they are.
#[derive(Debug, Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

type NodeMap = HashMap<u64, Node, BuildHasherDefault<PassThrough>>;

#[derive(Debug, Default)]
struct Node {
    /// (worker serial, tick it last routed through here).
    holders: Vec<(u64, u64)>,
    last_used: u64,
}

/// The page nodes, sharded by key.
#[derive(Debug)]
struct Tree {
    shards: Box<[RwLock<NodeMap>]>,
    tick: AtomicU64,
    /// Nodes a shard keeps before evicting.
    shard_capacity: usize,
}

impl Tree {
    fn new(max_pages: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
            tick: AtomicU64::new(0),
            shard_capacity: (max_pages / SHARDS).max(1),
        }
    }

    /// The shard of `key`: middle bits, as the map itself hashes with the
    /// low bits (bucket) and the top seven (tag).
    fn shard_of(key: u64) -> usize {
        (key >> 40) as usize & (SHARDS - 1)
    }

    fn read(&self, key: u64) -> std::sync::RwLockReadGuard<'_, NodeMap> {
        self.shards[Self::shard_of(key)]
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn contains(&self, key: u64) -> bool {
        self.read(key).contains_key(&key)
    }

    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.read().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }

    /// Records that `serial` took a prompt with these page keys: every node
    /// on the path gets the worker and one tick. Each shard is locked once;
    /// a shard that grew past its share is trimmed afterwards. The keys are
    /// grouped by shard first (a counting sort: two passes), so each shard
    /// reads only its own.
    fn insert(&self, serial: u64, keys: &[u64]) {
        let tick = self.tick.fetch_add(1, Ordering::Relaxed) + 1;
        let mut bounds = [0usize; SHARDS + 1];
        for &key in keys {
            bounds[Self::shard_of(key) + 1] += 1;
        }
        for shard in 0..SHARDS {
            bounds[shard + 1] += bounds[shard];
        }
        let mut grouped = vec![0u64; keys.len()];
        let mut next = bounds;
        for &key in keys {
            let slot = &mut next[Self::shard_of(key)];
            grouped[*slot] = key;
            *slot += 1;
        }
        for shard in 0..SHARDS {
            let shard_keys = &grouped[bounds[shard]..bounds[shard + 1]];
            if shard_keys.is_empty() {
                continue;
            }
            let full = {
                let mut nodes = self.shards[shard]
                    .write()
                    .unwrap_or_else(PoisonError::into_inner);
                for &key in shard_keys {
                    let node = nodes.entry(key).or_default();
                    node.last_used = node.last_used.max(tick);
                    match node.holders.iter_mut().find(|(s, _)| *s == serial) {
                        Some(holder) => holder.1 = holder.1.max(tick),
                        None => node.holders.push((serial, tick)),
                    }
                }
                nodes.len() > self.shard_capacity
            };
            if full {
                self.evict(shard);
            }
        }
    }

    /// Drops the least recently used eighth of a full shard. The oldest are
    /// found under the read lock (lookups go on meanwhile) and removed a
    /// few hundred at a time under the write lock, so no lookup waits long.
    fn evict(&self, shard: usize) {
        const REMOVALS_PER_LOCK: usize = 256;
        let keep = self.shard_capacity - self.shard_capacity / 8;
        let oldest: Vec<u64> = {
            let nodes = self.shards[shard]
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            let excess = nodes.len().saturating_sub(keep);
            if excess == 0 {
                return;
            }
            let mut ages: Vec<(u64, u64)> = nodes
                .iter()
                .map(|(key, node)| (node.last_used, *key))
                .collect();
            ages.select_nth_unstable(excess - 1);
            ages[..excess].iter().map(|&(_, key)| key).collect()
        };
        for batch in oldest.chunks(REMOVALS_PER_LOCK) {
            let mut nodes = self.shards[shard]
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            for key in batch {
                nodes.remove(key);
            }
        }
    }
}

/// What the background inserter is told.
#[derive(Debug)]
enum Message {
    Insert {
        serial: u64,
        keys: Vec<u64>,
    },
    /// Answer once every earlier message is applied.
    Settle(std::sync::mpsc::Sender<()>),
}

/// The background inserter's loop; ends when the policy (the sender) is
/// dropped.
fn apply_routes(tree: Arc<Tree>, inbox: Receiver<Message>) {
    while let Ok(message) = inbox.recv() {
        match message {
            Message::Insert { serial, keys } => tree.insert(serial, &keys),
            Message::Settle(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// The last prompt hashed on this thread, with each full page's chain
/// state and key.
#[derive(Debug, Default)]
struct PromptKeys {
    tokens: Vec<u32>,
    chains: Vec<u64>,
    keys: Vec<u64>,
}

thread_local! {
    static LAST_PROMPT: RefCell<PromptKeys> = RefCell::new(PromptKeys::default());
}

/// Runs `f` over the page keys of `ids`. The pages a prompt shares with
/// the last prompt seen on this thread (its start: an agent's system
/// prompt and tools, or the same prompt again) keep their keys, and the
/// chain goes on from there (comparing is far cheaper than hashing), so one
/// decision hashes its prompt once and a conversation hashes only what is
/// new.
fn with_page_keys<R>(ids: &[u32], f: impl FnOnce(&[u64]) -> R) -> R {
    if ids.len() > KEY_CACHE_TOKENS {
        return f(&page_keys(ids).collect::<Vec<_>>());
    }
    LAST_PROMPT.with(|cell| match cell.try_borrow_mut() {
        Ok(mut last) => {
            let last = &mut *last;
            let kept = shared_prefix_len(&last.tokens, ids) / PAGE_TOKENS;
            last.chains.truncate(kept);
            last.keys.truncate(kept);
            let mut chain = last.chains.last().copied().unwrap_or(CHAIN_SEED);
            for page in ids[kept * PAGE_TOKENS..].chunks_exact(PAGE_TOKENS) {
                chain = chain_page(chain, page);
                last.chains.push(chain);
                last.keys.push(finalize(chain));
            }
            last.tokens.clear();
            last.tokens.extend_from_slice(ids);
            f(&last.keys)
        }
        Err(_) => f(&page_keys(ids).collect::<Vec<_>>()),
    })
}

/// The chain's state before the first page.
const CHAIN_SEED: u64 = 0x243F_6A88_85A3_08D3;

/// The chain's state after `page`, from its state before it.
fn chain_page(chain: u64, page: &[u32]) -> u64 {
    (chain.rotate_left(23) ^ page_hash(page)).wrapping_mul(0x517C_C1B7_2722_0A95)
}

/// The chained hash of each full page prefix of `ids`.
fn page_keys(ids: &[u32]) -> impl Iterator<Item = u64> + '_ {
    ids.chunks_exact(PAGE_TOKENS)
        .scan(CHAIN_SEED, |chain, page| {
            *chain = chain_page(*chain, page);
            Some(finalize(*chain))
        })
}

/// One page's hash: four independent multiply lanes over its eight token
/// pairs, so the CPU overlaps them; only the short chaining step in
/// [`page_keys`] is serial from page to page.
fn page_hash(page: &[u32]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut lanes: [u64; 4] = [
        0x1319_8A2E_0370_7344,
        0xA409_3822_299F_31D0,
        0x082E_FA98_EC4E_6C89,
        0x4528_21E6_38D0_1377,
    ];
    for (i, pair) in page.chunks_exact(2).enumerate() {
        let word = u64::from(pair[0]) | (u64::from(pair[1]) << 32);
        let lane = &mut lanes[i % 4];
        *lane = (*lane ^ word).wrapping_mul(K).rotate_left(31);
    }
    lanes[0] ^ lanes[1].rotate_left(16) ^ lanes[2].rotate_left(32) ^ lanes[3].rotate_left(48)
}

/// SplitMix64's finalizer: spreads the chained state over all 64 bits.
fn finalize(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Prefix-affinity routing with a load-balance escape.
#[derive(Debug)]
pub struct CacheAware {
    config: CacheAwareConfig,
    tree: Arc<Tree>,
    /// Rotates tie-breaking between equally loaded workers.
    turn: AtomicUsize,
    /// The background inserter's queue, started with the first route
    /// (`None` if its thread could not start: routes insert inline).
    inserter: OnceLock<Option<SyncSender<Message>>>,
    /// Routes not learned because the queue was full.
    dropped: AtomicU64,
}

impl Default for CacheAware {
    fn default() -> Self {
        Self::new(CacheAwareConfig::default())
    }
}

impl CacheAware {
    pub fn new(config: CacheAwareConfig) -> Self {
        Self {
            config,
            tree: Arc::new(Tree::new(config.max_pages)),
            turn: AtomicUsize::new(0),
            inserter: OnceLock::new(),
            dropped: AtomicU64::new(0),
        }
    }

    /// Nodes (pages) the tree holds now.
    pub fn pages(&self) -> usize {
        self.tree.len()
    }

    /// Routes not learned because the background queue was full.
    pub fn dropped_routes(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn inserter(&self) -> Option<&SyncSender<Message>> {
        self.inserter
            .get_or_init(|| {
                let (queue, inbox) = std::sync::mpsc::sync_channel(INSERT_QUEUE);
                let tree = Arc::clone(&self.tree);
                let started = std::thread::Builder::new()
                    .name("smg-cache-tree".to_owned())
                    .spawn(move || apply_routes(tree, inbox));
                match started {
                    Ok(_) => Some(queue),
                    Err(err) => {
                        tracing::warn!(%err, "cache-aware routes insert inline: no thread");
                        None
                    }
                }
            })
            .as_ref()
    }

    fn balanced(&self, pool: &Pool<'_>, now: Instant) -> bool {
        let (min, max) = pool
            .available()
            .iter()
            .map(|&i| request_load(pool.worker(i), now))
            .fold((u64::MAX, 0), |(lo, hi), l| (lo.min(l), hi.max(l)));
        let imbalanced = max.saturating_sub(min) > self.config.balance_abs_threshold
            && max as f64 > min as f64 * self.config.balance_rel_threshold;
        !imbalanced
    }

    /// The least loaded available holder of the deepest matching node
    /// (ties rotate with `turn`) and the tokens matched.
    ///
    /// The deepest node on the prompt's path is found by binary search over
    /// its page keys: a route inserts every page of its path and eviction
    /// takes the least recently used first, so a node's ancestors (touched
    /// at least as recently) exist whenever it does. That is log2(pages)
    /// lookups instead of one per page; memory latency, not hashing,
    /// dominates a lookup in a large tree.
    fn best_match(
        &self,
        pool: &Pool<'_>,
        keys: &[u64],
        turn: usize,
        now: Instant,
    ) -> Option<(usize, usize)> {
        let (mut matched, mut absent) = (0, keys.len());
        while matched < absent {
            let mid = (matched + absent) / 2;
            if self.tree.contains(keys[mid]) {
                matched = mid + 1;
            } else {
                absent = mid;
            }
        }
        for depth in (0..matched).rev() {
            let shard = self.tree.read(keys[depth]);
            let Some(node) = shard.get(&keys[depth]) else {
                continue;
            };
            let n = node.holders.len();
            let mut best: Option<(u64, usize)> = None;
            for step in 0..n {
                let (serial, _) = node.holders[(turn + step) % n];
                let Some(index) = pool.find_available(serial) else {
                    continue;
                };
                let load = request_load(pool.worker(index), now);
                if best.is_none_or(|(least, _)| load < least) {
                    best = Some((load, index));
                }
            }
            if let Some((_, index)) = best {
                return Some((index, (depth + 1) * PAGE_TOKENS));
            }
        }
        None
    }
}

impl Policy for CacheAware {
    fn name(&self) -> &'static str {
        "cache_aware"
    }

    fn needs_loads(&self) -> bool {
        true
    }

    fn select(&self, pool: &Pool<'_>, request: &SelectionRequest<'_>) -> usize {
        let now = Instant::now();
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        if !self.balanced(pool, now) {
            return least_loaded_from(pool, now, turn);
        }
        let ids = request.input_ids;
        let found = with_page_keys(ids, |keys| self.best_match(pool, keys, turn, now));
        match found {
            Some((index, matched))
                if matched as f64 >= self.config.match_threshold * ids.len() as f64 =>
            {
                index
            }
            _ => least_loaded_from(pool, now, turn),
        }
    }

    fn on_routed(&self, worker: &Worker, request: &SelectionRequest<'_>) {
        let ids = request.input_ids;
        if ids.len() < PAGE_TOKENS {
            return;
        }
        let serial = worker.serial();
        if self.config.background_inserts
            && let Some(queue) = self.inserter()
        {
            let keys = with_page_keys(ids, <[u64]>::to_vec);
            match queue.try_send(Message::Insert { serial, keys }) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                }
                // The inserter is gone (it panicked): insert here.
                Err(TrySendError::Disconnected(message)) => {
                    if let Message::Insert { serial, keys } = message {
                        self.tree.insert(serial, &keys);
                    }
                }
            }
            return;
        }
        with_page_keys(ids, |keys| self.tree.insert(serial, keys));
    }

    fn settle(&self) {
        let Some(Some(queue)) = self.inserter.get() else {
            return;
        };
        let (done, applied) = std::sync::mpsc::channel();
        if queue.send(Message::Settle(done)).is_ok() {
            let _ = applied.recv();
        }
    }
}
#[cfg(test)]
mod tests {
    use super::super::test_support::{route, select, tokens, workers};
    use super::*;

    #[test]
    fn a_shared_prefix_follows_its_first_worker() {
        let fleet = workers(4);
        let policy = CacheAware::default();
        let prefix: Vec<u32> = (0..64).collect();
        let _busy = fleet[0].acquire(); // steer the first pick away from worker 0
        let first = route(&policy, &fleet, &tokens(&prefix));
        assert_ne!(first, 0);
        let mut longer = prefix.clone();
        longer.extend(1000..1010);
        for _ in 0..10 {
            assert_eq!(route(&policy, &fleet, &tokens(&longer)), first);
        }
    }

    #[test]
    fn unseen_prompts_spread_to_the_least_loaded() {
        let fleet = workers(3);
        let policy = CacheAware::default();
        let _a = fleet[0].acquire();
        let _b = fleet[1].acquire();
        assert_eq!(
            route(&policy, &fleet, &tokens(&(500..600).collect::<Vec<_>>())),
            2
        );
        // With equal loads, distinct prompts take turns instead of piling up.
        let idle = workers(3);
        let mut seen: Vec<usize> = (0..3u32)
            .map(|i| {
                route(
                    &policy,
                    &idle,
                    &tokens(&(i * 1000..i * 1000 + 64).collect::<Vec<_>>()),
                )
            })
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, [0, 1, 2]);
    }

    #[test]
    fn a_short_match_below_the_threshold_does_not_count() {
        let fleet = workers(2);
        let policy = CacheAware::default();
        let shared: Vec<u32> = (0..16).collect();
        let owner = route(&policy, &fleet, &tokens(&shared));
        let _held = fleet[owner].acquire();
        // 16 of 80 tokens match (20% < 50%): the idle worker takes it.
        let mut long = shared.clone();
        long.extend(5000..5064);
        assert_eq!(route(&policy, &fleet, &tokens(&long)), 1 - owner);
    }

    #[test]
    fn imbalance_overrides_affinity() {
        let fleet = workers(2);
        let policy = CacheAware::default();
        let prompt: Vec<u32> = (0..64).collect();
        let owner = route(&policy, &fleet, &tokens(&prompt));
        let _load: Vec<_> = (0..40).map(|_| fleet[owner].acquire()).collect();
        assert_eq!(route(&policy, &fleet, &tokens(&prompt)), 1 - owner);
    }

    #[test]
    fn an_unavailable_holder_yields_to_a_shallower_available_one() {
        let fleet = workers(3);
        let policy = CacheAware::default();
        let base: Vec<u32> = (0..64).collect();
        let first = route(&policy, &fleet, &tokens(&base));
        let mut deeper = base.clone();
        deeper.extend(100..164);
        // Pin the deeper prompt to another worker by routing it there.
        let other = (first + 1) % 3;
        policy.on_routed(&fleet[other], &tokens(&deeper));
        policy.settle();
        assert_eq!(route(&policy, &fleet, &tokens(&deeper)), other);
        fleet[other].set_healthy(false);
        // 64 of 128 tokens still match on `first`: 50% meets the threshold.
        assert_eq!(route(&policy, &fleet, &tokens(&deeper)), first);
    }

    #[test]
    fn memory_is_bounded_and_the_oldest_pages_go_first() {
        let fleet = workers(2);
        let policy = CacheAware::new(CacheAwareConfig {
            max_pages: 256,
            ..Default::default()
        });
        let old: Vec<u32> = (0..16 * 8).collect();
        policy.on_routed(&fleet[0], &tokens(&old));
        for i in 0..200u32 {
            let ids: Vec<u32> = (10_000 + i * 1000..10_000 + i * 1000 + 16 * 16).collect();
            policy.on_routed(&fleet[1], &tokens(&ids));
        }
        policy.settle();
        assert!(policy.pages() <= 256, "{} pages", policy.pages());
        assert!(policy.pages() >= 200, "{} pages", policy.pages());
        // The first prompt was the least recently used: it is forgotten.
        let keys: Vec<u64> = page_keys(&old).collect();
        let all = [0usize, 1];
        let found = policy.best_match(&Pool::new(&fleet, &all, 1), &keys, 0, Instant::now());
        assert_eq!(found, None);
        assert!(keys.iter().all(|&key| !policy.tree.contains(key)));
    }

    #[test]
    fn routes_are_learned_in_the_background_or_inline_alike() {
        let fleet = workers(3);
        let prompt: Vec<u32> = (0..256).collect();
        for background_inserts in [true, false] {
            let policy = CacheAware::new(CacheAwareConfig {
                background_inserts,
                ..Default::default()
            });
            policy.on_routed(&fleet[2], &tokens(&prompt));
            policy.settle();
            assert_eq!(policy.pages(), 16, "background: {background_inserts}");
            assert_eq!(select(&policy, &fleet, &tokens(&prompt)), 2);
            assert_eq!(policy.dropped_routes(), 0);
        }
    }

    #[test]
    fn the_page_keys_of_a_prompt_are_reused_only_for_the_same_tokens() {
        let a: Vec<u32> = (0..64).collect();
        let mut b = a.clone();
        b[40] = 7;
        let keys_a = with_page_keys(&a, <[u64]>::to_vec);
        let keys_b = with_page_keys(&b, <[u64]>::to_vec);
        assert_eq!(keys_a, page_keys(&a).collect::<Vec<_>>());
        assert_eq!(keys_b, page_keys(&b).collect::<Vec<_>>());
        assert_eq!(keys_a[..2], keys_b[..2]);
        assert_ne!(keys_a[2], keys_b[2]);
    }

    #[test]
    fn prompts_sharing_a_start_with_the_last_one_get_the_keys_of_their_own_pages() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut prompt: Vec<u32> = Vec::new();
        for _ in 0..500 {
            // Keep a random share of the last prompt, change one token of
            // it now and then, and add more.
            prompt.truncate(rng.random_range(0..=prompt.len()));
            if !prompt.is_empty() && rng.random_bool(0.2) {
                let at = rng.random_range(0..prompt.len());
                prompt[at] = rng.random_range(0..50);
            }
            let more = rng.random_range(0..80);
            prompt.extend((0..more).map(|_| rng.random_range(0..50u32)));
            assert_eq!(
                with_page_keys(&prompt, <[u64]>::to_vec),
                page_keys(&prompt).collect::<Vec<_>>(),
                "{prompt:?}"
            );
        }
    }

    #[test]
    fn page_keys_chain_the_whole_prefix() {
        let a: Vec<u32> = (0..32).collect();
        let mut b = a.clone();
        b[3] = 999;
        let ka: Vec<u64> = page_keys(&a).collect();
        let kb: Vec<u64> = page_keys(&b).collect();
        assert_eq!(ka.len(), 2);
        assert_ne!(ka[0], kb[0]);
        assert_ne!(ka[1], kb[1], "a change in page 0 changes every later key");
        assert_eq!(page_keys(&a[..31]).count(), 1);
    }
}
