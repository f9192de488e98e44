//! Prefix hashing: the hash of a prompt's first N tokens on a consistent-hash
//! ring, so prompts sharing that prefix meet the same worker's cache, with a
//! load-factor escape (bounded-load consistent hashing): a worker already
//! carrying more than `load_factor` × the average load is passed over for
//! the next one on the ring.

use std::time::Instant;

use super::consistent_hash::{Ring, hash_of};
use super::{Policy, Pool, SelectionRequest, least_loaded, request_load};

#[derive(Debug, Clone, Copy)]
pub struct PrefixHashConfig {
    /// Leading tokens that form the key.
    pub prefix_tokens: usize,
    /// A worker may carry at most this multiple of the average load.
    pub load_factor: f64,
}

impl Default for PrefixHashConfig {
    fn default() -> Self {
        Self {
            prefix_tokens: 256,
            load_factor: 1.25,
        }
    }
}

/// Routes by the hash of the prompt's head, within a load bound.
#[derive(Debug, Default)]
pub struct PrefixHash {
    config: PrefixHashConfig,
    ring: Ring,
}

impl PrefixHash {
    pub fn new(config: PrefixHashConfig) -> Self {
        Self {
            config,
            ring: Ring::default(),
        }
    }
}

impl Policy for PrefixHash {
    fn name(&self) -> &'static str {
        "prefix_hash"
    }

    fn needs_loads(&self) -> bool {
        true
    }

    fn select(&self, pool: &Pool<'_>, request: &SelectionRequest<'_>) -> usize {
        let ids = request.input_ids;
        let key = hash_of(("prefix", &ids[..ids.len().min(self.config.prefix_tokens)]));
        let now = Instant::now();
        let available = pool.available();
        let total: u64 = available
            .iter()
            .map(|&i| request_load(pool.worker(i), now))
            .sum();
        // The load bound counts the new request, so an idle fleet never escapes.
        let average = (total + 1) as f64 / available.len() as f64;
        let bound = (average * self.config.load_factor).ceil().max(1.0) as u64;
        self.ring
            .walk(pool, key, |index| {
                request_load(pool.worker(index), now) < bound
            })
            .unwrap_or_else(|| least_loaded(pool))
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{select, tokens, workers};
    use super::*;

    #[test]
    fn prompts_sharing_the_head_share_a_worker() {
        let fleet = workers(6);
        let policy = PrefixHash::new(PrefixHashConfig {
            prefix_tokens: 32,
            ..Default::default()
        });
        let mut counts = [0usize; 6];
        for head in 0..60u32 {
            let mut a: Vec<u32> = (head * 100..head * 100 + 32).collect();
            let mut b = a.clone();
            a.extend([1, 2, 3]);
            b.extend(7000..7100);
            let pick = select(&policy, &fleet, &tokens(&a));
            assert_eq!(select(&policy, &fleet, &tokens(&b)), pick);
            counts[pick] += 1;
        }
        assert!(counts.iter().all(|&c| c > 0), "keys spread: {counts:?}");
    }

    #[test]
    fn an_overloaded_owner_is_passed_over() {
        let fleet = workers(3);
        let policy = PrefixHash::default();
        let prompt: Vec<u32> = (0..300).collect();
        let owner = select(&policy, &fleet, &tokens(&prompt));
        let _held: Vec<_> = (0..6).map(|_| fleet[owner].acquire()).collect();
        // Average (6 + 1) / 3 ≈ 2.3, bound 3: the owner (6) escapes.
        let escaped = select(&policy, &fleet, &tokens(&prompt));
        assert_ne!(escaped, owner);
        // The escape is stable: the next worker on the ring, not a random one.
        assert_eq!(select(&policy, &fleet, &tokens(&prompt)), escaped);
    }
}
