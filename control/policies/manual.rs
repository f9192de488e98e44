//! Manual (sticky) routing: each routing key (`X-SMG-Routing-Key`) is bound
//! to the worker it first went to and stays there while that worker is
//! available; a key idle for `idle_ttl` is forgotten. A key whose worker
//! became unavailable is rebound to the least loaded one. Requests without a
//! key go to a random worker.
//!
//! A binding is kept under a 128-bit digest of its key, never the key
//! itself: the client chooses the key's length, and 3,000 keys of 100 KB
//! once held 335 MB. Each binding costs the same whatever the key.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{Policy, Pool, SelectionRequest, least_loaded_from};

#[derive(Debug, Clone, Copy)]
pub struct ManualConfig {
    /// A binding unused this long is dropped.
    pub idle_ttl: Duration,
    /// Bindings kept at most (the idle sweep runs when this is reached).
    pub max_keys: usize,
}

impl Default for ManualConfig {
    fn default() -> Self {
        Self {
            idle_ttl: Duration::from_secs(30 * 60),
            max_keys: 1 << 20,
        }
    }
}

#[derive(Debug)]
struct Binding {
    serial: u64,
    last_used: Instant,
}

/// A routing key's digest (its first 128 bits of BLAKE3).
type KeyDigest = u128;

fn digest(key: &str) -> KeyDigest {
    let hash = blake3::hash(key.as_bytes());
    let mut first = [0u8; 16];
    first.copy_from_slice(&hash.as_bytes()[..16]);
    u128::from_le_bytes(first)
}

#[derive(Debug, Default)]
struct Bindings {
    by_key: HashMap<KeyDigest, Binding>,
    /// When idle bindings were last swept.
    swept: Option<Instant>,
}

/// Sticky key → worker routing.
#[derive(Debug, Default)]
pub struct Manual {
    config: ManualConfig,
    bindings: Mutex<Bindings>,
    turn: AtomicUsize,
}

impl Manual {
    pub fn new(config: ManualConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// Keys bound now.
    pub fn keys(&self) -> usize {
        self.lock().by_key.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Bindings> {
        self.bindings.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Selects as of `now` (tests pass a fake clock).
    pub fn select_at(
        &self,
        pool: &Pool<'_>,
        request: &SelectionRequest<'_>,
        now: Instant,
    ) -> usize {
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        let Some(key) = request.routing_key else {
            let available = pool.available();
            return available[rand::random_range(0..available.len())];
        };
        let key = digest(key);
        let mut bindings = self.lock();
        self.sweep(&mut bindings, now);
        if let Some(binding) = bindings.by_key.get_mut(&key)
            && let Some(index) = pool.find_available(binding.serial)
        {
            binding.last_used = now;
            return index;
        }
        let index = least_loaded_from(pool, now, turn);
        bindings.by_key.insert(
            key,
            Binding {
                serial: pool.worker(index).serial(),
                last_used: now,
            },
        );
        index
    }

    /// Drops idle bindings, at most once per tenth of the TTL unless the
    /// map is full.
    fn sweep(&self, bindings: &mut Bindings, now: Instant) {
        let due = bindings
            .swept
            .is_none_or(|at| now.saturating_duration_since(at) >= self.config.idle_ttl / 10);
        if !due && bindings.by_key.len() < self.config.max_keys {
            return;
        }
        let ttl = self.config.idle_ttl;
        bindings
            .by_key
            .retain(|_, b| now.saturating_duration_since(b.last_used) < ttl);
        bindings.swept = Some(now);
        if bindings.by_key.len() >= self.config.max_keys {
            // Still full of live keys: forget the oldest half.
            let mut ages: Vec<Instant> = bindings.by_key.values().map(|b| b.last_used).collect();
            let half = ages.len() / 2;
            ages.select_nth_unstable(half);
            let cutoff = ages[half];
            bindings.by_key.retain(|_, b| b.last_used > cutoff);
        }
    }
}

impl Policy for Manual {
    fn name(&self) -> &'static str {
        "manual"
    }

    fn select(&self, pool: &Pool<'_>, request: &SelectionRequest<'_>) -> usize {
        self.select_at(pool, request, Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{available, workers};
    use super::*;

    fn keyed(key: &str) -> SelectionRequest<'_> {
        SelectionRequest {
            routing_key: Some(key),
            ..Default::default()
        }
    }

    #[test]
    fn keys_stick_fail_over_and_spread() {
        let fleet = workers(3);
        let policy = Manual::default();
        let t0 = Instant::now();
        let pick = |key: &str, at: Instant| {
            let up = available(&fleet);
            policy.select_at(&Pool::new(&fleet, &up, 1), &keyed(key), at)
        };
        let alice = pick("alice", t0);
        for _ in 0..5 {
            assert_eq!(pick("alice", t0), alice);
        }
        let _held = fleet[alice].acquire();
        let bob = pick("bob", t0);
        assert_ne!(bob, alice, "a new key goes to the least loaded");
        assert_eq!(pick("alice", t0), alice, "load does not break stickiness");
        fleet[alice].set_healthy(false);
        let moved = pick("alice", t0);
        assert_ne!(moved, alice);
        fleet[alice].set_healthy(true);
        assert_eq!(pick("alice", t0), moved, "the new binding sticks");
    }

    #[test]
    fn idle_keys_are_evicted() {
        let fleet = workers(2);
        let policy = Manual::new(ManualConfig {
            idle_ttl: Duration::from_secs(100),
            max_keys: 1000,
        });
        let t0 = Instant::now();
        let up = available(&fleet);
        let pool = Pool::new(&fleet, &up, 1);
        for i in 0..10 {
            policy.select_at(&pool, &keyed(&format!("k{i}")), t0);
        }
        assert_eq!(policy.keys(), 10);
        policy.select_at(&pool, &keyed("k0"), t0 + Duration::from_secs(60));
        policy.select_at(&pool, &keyed("fresh"), t0 + Duration::from_secs(150));
        // k1..k9 were idle for 150 s > 100 s; k0 (used at 60 s) and fresh remain.
        assert_eq!(policy.keys(), 2);
    }

    #[test]
    fn the_key_map_is_bounded() {
        let fleet = workers(2);
        let policy = Manual::new(ManualConfig {
            idle_ttl: Duration::from_secs(1000),
            max_keys: 16,
        });
        let t0 = Instant::now();
        let up = available(&fleet);
        let pool = Pool::new(&fleet, &up, 1);
        for i in 0..100u64 {
            policy.select_at(
                &pool,
                &keyed(&format!("k{i}")),
                t0 + Duration::from_millis(i),
            );
        }
        assert!(policy.keys() <= 16, "{}", policy.keys());
    }

    #[test]
    fn long_keys_are_bound_by_digest_and_still_stick() {
        let fleet = workers(4);
        let policy = Manual::default();
        let t0 = Instant::now();
        let pick = |key: &str| {
            let up = available(&fleet);
            policy.select_at(&Pool::new(&fleet, &up, 1), &keyed(key), t0)
        };
        let long_a = format!("{}a", "k".repeat(100_000));
        let long_b = format!("{}b", "k".repeat(100_000));
        let a = pick(&long_a);
        let b = pick(&long_b);
        assert_eq!(
            policy.keys(),
            2,
            "keys differing in their last byte are distinct"
        );
        for _ in 0..3 {
            assert_eq!(pick(&long_a), a);
            assert_eq!(pick(&long_b), b);
        }
        // What a binding stores does not grow with its key.
        assert_eq!(std::mem::size_of::<KeyDigest>(), 16);
        assert_ne!(digest(&long_a), digest(&long_b));
    }
}
