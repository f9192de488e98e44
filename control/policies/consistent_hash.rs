//! Consistent hashing: a ring with virtual nodes per worker, so a key keeps
//! landing on the same worker and a membership change moves only the keys of
//! the worker that came or went.
//!
//! The ring holds every member of the role and is rebuilt only when the
//! membership changes; a key whose worker is unavailable walks clockwise to
//! the next available one (so its keys move, and come back when it does).
//! The key is `X-SMG-Routing-Key` when given, else a media item's content
//! hash (encode routing: the same image meets the same encoder and its
//! cache), else the prompt's first 64 tokens.

use std::hash::{Hash, Hasher};
use std::sync::{Arc, PoisonError, RwLock};

use super::{Policy, Pool, SelectionRequest};

/// Virtual nodes per worker on the ring.
const VIRTUAL_NODES: usize = 160;
/// Prompt tokens that form the fallback key.
const KEY_TOKENS: usize = 64;

pub(crate) fn hash_of(value: impl Hash) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// (point, member index), sorted by point, for one membership generation.
#[derive(Debug, Default)]
struct RingPoints {
    generation: u64,
    members: usize,
    points: Vec<(u64, u32)>,
}

/// A hash ring over a pool's members, rebuilt when the membership changes.
#[derive(Debug, Default)]
pub(crate) struct Ring {
    built: RwLock<Arc<RingPoints>>,
}

impl Ring {
    fn points_for(&self, pool: &Pool<'_>) -> Arc<RingPoints> {
        {
            let built = self.built.read().unwrap_or_else(PoisonError::into_inner);
            if built.generation == pool.generation()
                && built.members == pool.members().len()
                && !built.points.is_empty()
            {
                return Arc::clone(&built);
            }
        }
        let mut points: Vec<(u64, u32)> = pool
            .members()
            .iter()
            .enumerate()
            .flat_map(|(index, worker)| {
                (0..VIRTUAL_NODES).map(move |node| (hash_of((worker.id(), node)), index as u32))
            })
            .collect();
        points.sort_unstable();
        let fresh = Arc::new(RingPoints {
            generation: pool.generation(),
            members: pool.members().len(),
            points,
        });
        *self.built.write().unwrap_or_else(PoisonError::into_inner) = Arc::clone(&fresh);
        fresh
    }

    /// The first available member clockwise from `key` that `accept`s;
    /// `None` if none does.
    pub(crate) fn walk(
        &self,
        pool: &Pool<'_>,
        key: u64,
        mut accept: impl FnMut(usize) -> bool,
    ) -> Option<usize> {
        let ring = self.points_for(pool);
        let points = &ring.points;
        let start = points.partition_point(|(point, _)| *point < key);
        let mut tried = 0usize;
        for step in 0..points.len() {
            let index = points[(start + step) % points.len()].1 as usize;
            if pool.is_available(index) {
                if accept(index) {
                    return Some(index);
                }
                tried += 1;
                if tried > pool.available().len() * 4 {
                    break;
                }
            }
        }
        None
    }
}

/// The request's key: the explicit routing key, else the media hash, else the
/// prompt's first tokens.
fn key_of(request: &SelectionRequest<'_>) -> u64 {
    if let Some(key) = request.routing_key {
        return hash_of(("key", key));
    }
    if let Some(content) = request.content_hash {
        return hash_of(("content", content));
    }
    let head = &request.input_ids[..request.input_ids.len().min(KEY_TOKENS)];
    hash_of(("tokens", head))
}

/// Routes by a stable key on a hash ring.
#[derive(Debug, Default)]
pub struct ConsistentHashing {
    ring: Ring,
}

impl Policy for ConsistentHashing {
    fn name(&self) -> &'static str {
        "consistent_hashing"
    }

    fn select(&self, pool: &Pool<'_>, request: &SelectionRequest<'_>) -> usize {
        self.ring
            .walk(pool, key_of(request), |_| true)
            .unwrap_or(pool.available()[0])
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{available, workers};
    use super::*;
    use crate::workers::Worker;

    fn request(hash: &[u8; 32]) -> SelectionRequest<'_> {
        SelectionRequest {
            content_hash: Some(hash),
            ..Default::default()
        }
    }

    fn pick(
        policy: &ConsistentHashing,
        fleet: &[Arc<Worker>],
        generation: u64,
        hash: &[u8; 32],
    ) -> String {
        let up = available(fleet);
        let index = policy.select(&Pool::new(fleet, &up, generation), &request(hash));
        fleet[index].id().to_owned()
    }

    fn keys() -> Vec<[u8; 32]> {
        (0..400u32)
            .map(|i| *blake3::hash(&i.to_le_bytes()).as_bytes())
            .collect()
    }

    #[test]
    fn the_same_key_lands_on_the_same_worker() {
        let fleet = workers(5);
        let policy = ConsistentHashing::default();
        for seed in 0..50u8 {
            let hash = [seed; 32];
            assert_eq!(
                pick(&policy, &fleet, 1, &hash),
                pick(&policy, &fleet, 1, &hash)
            );
        }
    }

    #[test]
    fn keys_spread_and_removal_moves_only_the_removed_workers_keys() {
        let fleet = workers(4);
        let policy = ConsistentHashing::default();
        let before: Vec<String> = keys().iter().map(|h| pick(&policy, &fleet, 1, h)).collect();
        for worker in &fleet {
            let share = before.iter().filter(|id| *id == worker.id()).count();
            assert!(share > 40, "{} got only {share} of 400 keys", worker.id());
        }
        let shrunk: Vec<_> = fleet[1..].to_vec();
        for (hash, old) in keys().iter().zip(&before) {
            let new = pick(&policy, &shrunk, 2, hash);
            if old != fleet[0].id() {
                assert_eq!(&new, old, "a key of a surviving worker moved");
            }
        }
    }

    #[test]
    fn an_unavailable_worker_hands_its_keys_on_and_gets_them_back() {
        let fleet = workers(4);
        let policy = ConsistentHashing::default();
        let before: Vec<String> = keys().iter().map(|h| pick(&policy, &fleet, 1, h)).collect();
        fleet[2].set_healthy(false);
        let during: Vec<String> = keys().iter().map(|h| pick(&policy, &fleet, 1, h)).collect();
        for (old, new) in before.iter().zip(&during) {
            assert_ne!(new, fleet[2].id());
            if old != fleet[2].id() {
                assert_eq!(new, old, "only the down worker's keys move");
            }
        }
        fleet[2].set_healthy(true);
        let after: Vec<String> = keys().iter().map(|h| pick(&policy, &fleet, 1, h)).collect();
        assert_eq!(after, before);
    }

    #[test]
    fn a_routing_key_wins_over_tokens() {
        let fleet = workers(8);
        let policy = ConsistentHashing::default();
        let up = available(&fleet);
        let pool = Pool::new(&fleet, &up, 1);
        let keyed = |ids: &'static [u32]| SelectionRequest {
            input_ids: ids,
            routing_key: Some("session-42"),
            content_hash: None,
        };
        assert_eq!(
            policy.select(&pool, &keyed(&[1, 2, 3])),
            policy.select(&pool, &keyed(&[9, 9, 9]))
        );
    }
}
