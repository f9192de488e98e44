//! Consistent hashing: a ring with virtual nodes per worker, so a key keeps
//! landing on the same worker and a membership change moves only the keys of
//! the worker that came or went. Encode routing uses the image's content hash
//! as the key, so the same image meets the same encoder (and its cache).

use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

use super::{Policy, SelectionRequest};
use crate::workers::Worker;

/// Virtual nodes per worker on the ring.
const VIRTUAL_NODES: usize = 160;

#[derive(Debug, Default)]
struct Ring {
    /// Fingerprint of the candidate URLs the ring was built for.
    membership: u64,
    /// (point, candidate index), sorted by point.
    points: Vec<(u64, usize)>,
}

/// Routes by a stable key on a hash ring.
#[derive(Debug, Default)]
pub struct ConsistentHashing {
    ring: Mutex<Ring>,
}

fn hash_of(value: impl Hash) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
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
    let head = &request.input_ids[..request.input_ids.len().min(64)];
    hash_of(("tokens", head))
}

impl Policy for ConsistentHashing {
    fn name(&self) -> &'static str {
        "consistent_hashing"
    }

    fn select(&self, candidates: &[Arc<Worker>], request: &SelectionRequest<'_>) -> usize {
        let membership = hash_of(candidates.iter().map(|w| w.url()).collect::<Vec<_>>());
        let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        if ring.membership != membership || ring.points.is_empty() {
            ring.points = candidates
                .iter()
                .enumerate()
                .flat_map(|(index, worker)| {
                    (0..VIRTUAL_NODES).map(move |node| (hash_of((worker.url(), node)), index))
                })
                .collect();
            ring.points.sort_unstable();
            ring.membership = membership;
        }
        let key = key_of(request);
        let at = ring.points.partition_point(|(point, _)| *point < key);
        ring.points
            .get(at)
            .or_else(|| ring.points.first())
            .map_or(0, |(_, index)| *index)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::workers;
    use super::*;

    fn request(hash: &[u8; 32]) -> SelectionRequest<'_> {
        SelectionRequest {
            content_hash: Some(hash),
            ..Default::default()
        }
    }

    #[test]
    fn the_same_key_lands_on_the_same_worker() {
        let fleet = workers(5);
        let policy = ConsistentHashing::default();
        for seed in 0..50u8 {
            let hash = [seed; 32];
            let first = policy.select(&fleet, &request(&hash));
            assert_eq!(policy.select(&fleet, &request(&hash)), first);
        }
    }

    #[test]
    fn keys_spread_and_removal_moves_only_the_removed_workers_keys() {
        let fleet = workers(4);
        let policy = ConsistentHashing::default();
        let hashes: Vec<[u8; 32]> = (0..400u32)
            .map(|i| *blake3::hash(&i.to_le_bytes()).as_bytes())
            .collect();
        let before: Vec<String> = hashes
            .iter()
            .map(|h| fleet[policy.select(&fleet, &request(h))].url().to_owned())
            .collect();
        for worker in &fleet {
            let share = before.iter().filter(|url| *url == worker.url()).count();
            assert!(share > 40, "{} got only {share} of 400 keys", worker.url());
        }
        let shrunk: Vec<_> = fleet[1..].to_vec();
        for (hash, old) in hashes.iter().zip(&before) {
            let new = shrunk[policy.select(&shrunk, &request(hash))].url();
            if old != fleet[0].url() {
                assert_eq!(new, old, "a key of a surviving worker moved");
            }
        }
    }

    #[test]
    fn a_routing_key_wins_over_tokens() {
        let fleet = workers(8);
        let policy = ConsistentHashing::default();
        let keyed = |ids: &'static [u32]| SelectionRequest {
            input_ids: ids,
            routing_key: Some("session-42"),
            content_hash: None,
        };
        assert_eq!(
            policy.select(&fleet, &keyed(&[1, 2, 3])),
            policy.select(&fleet, &keyed(&[9, 9, 9]))
        );
    }
}
