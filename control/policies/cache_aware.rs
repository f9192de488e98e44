//! Cache-aware routing: send a prompt to the worker that most likely still
//! holds its prefix in KV cache, unless that would unbalance the fleet.
//!
//! The policy remembers, per 16-token page of every routed prompt, which
//! worker took it (an approximate, bounded map from page-prefix hash to
//! worker). A new prompt walks its pages while they match; if the matched
//! share reaches `match_threshold` and the fleet is balanced, that worker
//! wins, else the least-loaded one does.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use super::{Policy, SelectionRequest, least_loaded};
use crate::workers::Worker;

/// Tokens per remembered page.
const PAGE_TOKENS: usize = 16;

/// Tunables, with SMG's defaults.
#[derive(Debug, Clone, Copy)]
pub struct CacheAwareConfig {
    /// Share of the prompt that must match to follow the cache.
    pub match_threshold: f64,
    /// The fleet is imbalanced when max − min in-flight exceeds this...
    pub balance_abs_threshold: usize,
    /// ...and max exceeds min × this.
    pub balance_rel_threshold: f64,
    /// Pages remembered before the oldest are forgotten.
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

#[derive(Debug, Default)]
struct PageMap {
    owner: HashMap<u64, Arc<str>>,
    order: VecDeque<u64>,
}

/// Prefix-affinity routing with a load-balance escape.
#[derive(Debug, Default)]
pub struct CacheAware {
    config: CacheAwareConfig,
    pages: Mutex<PageMap>,
}

impl CacheAware {
    pub fn new(config: CacheAwareConfig) -> Self {
        Self {
            config,
            pages: Mutex::default(),
        }
    }

    fn page_hashes(input_ids: &[u32]) -> impl Iterator<Item = u64> + '_ {
        input_ids
            .chunks_exact(PAGE_TOKENS)
            .scan(blake3::Hasher::new(), |hasher, page| {
                for id in page {
                    hasher.update(&id.to_le_bytes());
                }
                let digest = hasher.finalize();
                let mut head = [0u8; 8];
                head.copy_from_slice(&digest.as_bytes()[..8]);
                Some(u64::from_le_bytes(head))
            })
    }

    fn balanced(&self, candidates: &[Arc<Worker>]) -> bool {
        let loads = candidates.iter().map(|w| w.in_flight());
        let (min, max) = loads.fold((usize::MAX, 0), |(lo, hi), l| (lo.min(l), hi.max(l)));
        let imbalanced = max.saturating_sub(min) > self.config.balance_abs_threshold
            && max as f64 > min as f64 * self.config.balance_rel_threshold;
        !imbalanced
    }
}

impl Policy for CacheAware {
    fn name(&self) -> &'static str {
        "cache_aware"
    }

    fn select(&self, candidates: &[Arc<Worker>], request: &SelectionRequest<'_>) -> usize {
        if !self.balanced(candidates) {
            return least_loaded(candidates);
        }
        let pages = self.pages.lock().unwrap_or_else(PoisonError::into_inner);
        let mut best: Option<(usize, usize)> = None;
        for (depth, hash) in Self::page_hashes(request.input_ids).enumerate() {
            let Some(owner) = pages.owner.get(&hash) else {
                break;
            };
            match candidates.iter().position(|w| w.url() == owner.as_ref()) {
                Some(index) => best = Some((index, (depth + 1) * PAGE_TOKENS)),
                None => break,
            }
        }
        drop(pages);
        match best {
            Some((index, matched))
                if matched as f64
                    >= self.config.match_threshold * request.input_ids.len() as f64 =>
            {
                index
            }
            _ => least_loaded(candidates),
        }
    }

    fn on_routed(&self, worker: &Worker, request: &SelectionRequest<'_>) {
        let owner: Arc<str> = Arc::from(worker.url());
        let mut pages = self.pages.lock().unwrap_or_else(PoisonError::into_inner);
        for hash in Self::page_hashes(request.input_ids) {
            if pages.owner.insert(hash, Arc::clone(&owner)).is_none() {
                pages.order.push_back(hash);
            }
        }
        while pages.order.len() > self.config.max_pages {
            if let Some(old) = pages.order.pop_front() {
                pages.owner.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::workers;
    use super::*;

    fn routed(policy: &CacheAware, fleet: &[Arc<Worker>], ids: &[u32]) -> usize {
        let request = SelectionRequest {
            input_ids: ids,
            ..Default::default()
        };
        let index = policy.select(fleet, &request);
        policy.on_routed(&fleet[index], &request);
        index
    }

    #[test]
    fn a_shared_prefix_follows_its_first_worker() {
        let fleet = workers(4);
        let policy = CacheAware::default();
        let prefix: Vec<u32> = (0..64).collect();
        let _busy = fleet[0].acquire(); // steer the first pick away from worker 0
        let first = routed(&policy, &fleet, &prefix);
        assert_ne!(first, 0);
        let mut longer = prefix.clone();
        longer.extend(1000..1010);
        assert_eq!(routed(&policy, &fleet, &longer), first);
    }

    #[test]
    fn an_unseen_prompt_goes_to_the_least_loaded() {
        let fleet = workers(3);
        let policy = CacheAware::default();
        let _a = fleet[0].acquire();
        let _b = fleet[1].acquire();
        assert_eq!(routed(&policy, &fleet, &(500..600).collect::<Vec<_>>()), 2);
    }

    #[test]
    fn imbalance_overrides_affinity() {
        let fleet = workers(2);
        let policy = CacheAware::default();
        let prompt: Vec<u32> = (0..64).collect();
        let owner = routed(&policy, &fleet, &prompt);
        let _load: Vec<_> = (0..40).map(|_| fleet[owner].acquire()).collect();
        assert_eq!(routed(&policy, &fleet, &prompt), 1 - owner);
    }

    #[test]
    fn memory_is_bounded() {
        let fleet = workers(1);
        let policy = CacheAware::new(CacheAwareConfig {
            max_pages: 8,
            ..Default::default()
        });
        routed(&policy, &fleet, &(0..16 * 20).collect::<Vec<_>>());
        assert_eq!(policy.pages.lock().expect("lock").owner.len(), 8);
    }
}
