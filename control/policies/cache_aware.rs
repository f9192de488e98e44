//! Cache-aware routing: send a prompt to the worker that most likely still
//! holds its prefix in KV cache, unless the fleet is out of balance.
//!
//! The policy keeps an approximate radix tree over token ids, one per model
//! (a policy instance serves one model's role). Edges are 16-token pages, as
//! engines page their prefix caches; a node is named by a 64-bit chained
//! hash of the whole prefix up to it ("approximate": two prefixes could
//! collide, which costs at most one cache miss), and remembers which workers
//! took a prompt through it and when. The tree is bounded: past `max_pages`
//! nodes the least recently used eighth is evicted in one batch. Because a
//! route touches every node on its path, a parent is never older than its
//! children and eviction trims from the leaves.
//!
//! A request finds the deepest node of its page path in the tree (a binary
//! search over its page keys); the deepest node held by an available worker
//! gives the match. If the match covers at least
//! `match_threshold` of the prompt and the fleet is balanced, the least
//! loaded of that node's holders wins; otherwise the least loaded worker
//! does. The route taken is inserted afterwards.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock};
use std::time::Instant;

use super::{Policy, Pool, SelectionRequest, least_loaded_from, request_load};
use crate::workers::Worker;

/// Tokens per page (engines' prefix caches page at 16 tokens).
pub const PAGE_TOKENS: usize = 16;

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
}

impl Default for CacheAwareConfig {
    fn default() -> Self {
        Self {
            match_threshold: 0.5,
            balance_abs_threshold: 32,
            balance_rel_threshold: 1.5,
            max_pages: 1 << 20,
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

#[derive(Debug, Default)]
struct Tree {
    nodes: NodeMap,
    tick: u64,
}

/// The chained hash of each full page prefix of `ids`.
fn page_keys(ids: &[u32]) -> impl Iterator<Item = u64> + '_ {
    ids.chunks_exact(PAGE_TOKENS)
        .scan(0x243F_6A88_85A3_08D3u64, |state, page| {
            for &id in page {
                *state = (state.rotate_left(5) ^ u64::from(id)).wrapping_mul(0x517C_C1B7_2722_0A95);
            }
            Some(finalize(*state))
        })
}

/// SplitMix64's finalizer: spreads the chained state over all 64 bits.
fn finalize(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Prefix-affinity routing with a load-balance escape.
#[derive(Debug, Default)]
pub struct CacheAware {
    config: CacheAwareConfig,
    tree: RwLock<Tree>,
    /// Rotates tie-breaking between equally loaded workers.
    turn: AtomicUsize,
}

impl CacheAware {
    pub fn new(config: CacheAwareConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// Nodes (pages) the tree holds now.
    pub fn pages(&self) -> usize {
        self.tree
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .nodes
            .len()
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

    /// The available holders of the deepest matching node and the tokens
    /// matched.
    ///
    /// The deepest node on the prompt's path is found by binary search over
    /// its page keys: a route inserts every page of its path and eviction
    /// takes the least recently used first, so a node's ancestors (touched
    /// at least as recently) exist whenever it does. That is log2(pages)
    /// lookups instead of one per page; memory latency, not hashing,
    /// dominates a lookup in a large tree.
    fn longest_match(&self, pool: &Pool<'_>, ids: &[u32]) -> (Vec<usize>, usize) {
        let keys: Vec<u64> = page_keys(ids).collect();
        let tree = self.tree.read().unwrap_or_else(PoisonError::into_inner);
        let (mut matched, mut absent) = (0, keys.len());
        while matched < absent {
            let mid = (matched + absent) / 2;
            if tree.nodes.contains_key(&keys[mid]) {
                matched = mid + 1;
            } else {
                absent = mid;
            }
        }
        for depth in (0..matched).rev() {
            let Some(node) = tree.nodes.get(&keys[depth]) else {
                continue;
            };
            let holders: Vec<usize> = node
                .holders
                .iter()
                .filter_map(|&(serial, _)| pool.find_available(serial))
                .collect();
            if !holders.is_empty() {
                return (holders, (depth + 1) * PAGE_TOKENS);
            }
        }
        (Vec::new(), 0)
    }

    fn evict(&self, tree: &mut Tree) {
        let keep = self.config.max_pages - self.config.max_pages / 8;
        let excess = tree.nodes.len().saturating_sub(keep);
        if excess == 0 {
            return;
        }
        let mut ages: Vec<(u64, u64)> = tree
            .nodes
            .iter()
            .map(|(key, node)| (node.last_used, *key))
            .collect();
        ages.select_nth_unstable(excess - 1);
        for (_, key) in &ages[..excess] {
            tree.nodes.remove(key);
        }
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
        let (holders, matched) = self.longest_match(pool, request.input_ids);
        let enough = !holders.is_empty()
            && matched as f64 >= self.config.match_threshold * request.input_ids.len() as f64;
        if !enough {
            return least_loaded_from(pool, now, turn);
        }
        let n = holders.len();
        (0..n)
            .map(|step| holders[(turn + step) % n])
            .min_by_key(|&index| request_load(pool.worker(index), now))
            .unwrap_or(holders[0])
    }

    fn on_routed(&self, worker: &Worker, request: &SelectionRequest<'_>) {
        if request.input_ids.len() < PAGE_TOKENS {
            return;
        }
        let serial = worker.serial();
        let mut tree = self.tree.write().unwrap_or_else(PoisonError::into_inner);
        tree.tick += 1;
        let tick = tree.tick;
        for key in page_keys(request.input_ids) {
            let node = tree.nodes.entry(key).or_default();
            node.last_used = tick;
            match node.holders.iter_mut().find(|(s, _)| *s == serial) {
                Some(holder) => holder.1 = tick,
                None => node.holders.push((serial, tick)),
            }
        }
        if tree.nodes.len() > self.config.max_pages {
            self.evict(&mut tree);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{route, tokens, workers};
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
        assert_eq!(route(&policy, &fleet, &tokens(&deeper)), other);
        fleet[other].set_healthy(false);
        // 64 of 128 tokens still match on `first`: 50% meets the threshold.
        assert_eq!(route(&policy, &fleet, &tokens(&deeper)), first);
    }

    #[test]
    fn memory_is_bounded_and_the_oldest_pages_go_first() {
        let fleet = workers(2);
        let policy = CacheAware::new(CacheAwareConfig {
            max_pages: 64,
            ..Default::default()
        });
        let old: Vec<u32> = (0..16 * 8).collect();
        policy.on_routed(&fleet[0], &tokens(&old));
        for i in 0..20u32 {
            let ids: Vec<u32> = (10_000 + i * 1000..10_000 + i * 1000 + 16 * 4).collect();
            policy.on_routed(&fleet[1], &tokens(&ids));
        }
        assert!(policy.pages() <= 64, "{} pages", policy.pages());
        // The first prompt was the least recently used: it is forgotten.
        let (holders, matched) = {
            let all = [0usize, 1];
            policy.longest_match(&Pool::new(&fleet, &all, 1), &old)
        };
        assert!(holders.is_empty() && matched == 0, "{holders:?} {matched}");
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
