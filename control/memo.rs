//! A bounded, sharded memo from request text to what the gateway derived
//! from it, for work that repeats verbatim across requests.
//!
//! Why it exists: a fleet's requests repeat large pieces byte for byte —
//! the system prompt and earlier turns between a chat template's special
//! tokens, the `tools` array an agent resends every turn — and what the
//! gateway makes of them (token ids, parsed and rendered tool schemas) is a
//! pure function of those bytes. One mechanism serves them all: keys are
//! the exact text (a hit is an equal string, never just an equal hash), and
//! memory is bounded by a byte budget the caller charges per entry.
//!
//! Eviction is by generations, not per-entry recency: each shard fills a
//! young map; when it would pass its budget, the young map becomes the old
//! one (the previous old map is dropped) and a fresh young map starts. A
//! hit in the old map moves the entry back to the young one. This keeps
//! what is in use at the cost of one map swap, with no list to maintain on
//! every hit; at most twice the budget of one generation is held.

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;

use hashbrown::HashTable;

/// Independent shards (lock striping across tokio workers).
const SHARDS: usize = 16;
/// What an entry costs beyond its key and the caller's charge: a table
/// slot (key pointer and length, hash, charge) and the shared value's
/// header, roughly.
const ENTRY_OVERHEAD_BYTES: usize = 64;

/// Text → `V`, bounded by bytes. `V` is cloned out on a hit, so it should
/// be cheap to clone (an `Arc`).
///
/// A key is hashed once per call (SipHash, randomly keyed: the keys are
/// client text), and that hash picks the shard and finds the entry: keys
/// here are whole system prompts and tool lists, kilobytes each, so a
/// second pass over them is a real share of a lookup.
pub(crate) struct Memo<V> {
    shards: Vec<Mutex<Shard<V>>>,
    hasher: RandomState,
}

struct Shard<V> {
    young: HashTable<Entry<V>>,
    old: HashTable<Entry<V>>,
    young_bytes: usize,
    budget_bytes: usize,
}

struct Entry<V> {
    key: Box<str>,
    hash: u64,
    value: V,
    cost: usize,
}

impl<V: Clone> Memo<V> {
    /// A memo holding about `total_bytes` in all (keys and charges).
    pub(crate) fn new(total_bytes: usize) -> Self {
        // Each shard holds up to two generations of `budget_bytes`.
        let budget_bytes = (total_bytes / SHARDS / 2).max(1);
        Self {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        young: HashTable::new(),
                        old: HashTable::new(),
                        young_bytes: 0,
                        budget_bytes,
                    })
                })
                .collect(),
            hasher: RandomState::new(),
        }
    }

    /// The key's hash and its shard. The shard is chosen by bits the
    /// tables use for neither the bucket (the low bits) nor the tag (the
    /// top seven), so entries of one shard still spread over its table.
    fn locate(&self, key: &str) -> (u64, &Mutex<Shard<V>>) {
        let hash = self.hasher.hash_one(key);
        let index = (hash >> 32) as usize % SHARDS;
        (hash, &self.shards[index])
    }

    /// The value remembered for exactly `key`.
    pub(crate) fn get(&self, key: &str) -> Option<V> {
        let (hash, shard) = self.locate(key);
        let mut shard = shard.lock().ok()?;
        let same = |entry: &Entry<V>| entry.hash == hash && &*entry.key == key;
        if let Some(entry) = shard.young.find(hash, same) {
            return Some(entry.value.clone());
        }
        let entry = shard.old.find_entry(hash, same).ok()?.remove().0;
        let value = entry.value.clone();
        shard.admit(entry);
        Some(value)
    }

    /// Remembers `value` for `key`; `charge` is what the value holds in
    /// memory (the key's own bytes are counted here). A key larger than a
    /// shard's budget is not remembered.
    pub(crate) fn insert(&self, key: &str, value: V, charge: usize) {
        let cost = key.len() + charge + ENTRY_OVERHEAD_BYTES;
        let (hash, shard) = self.locate(key);
        if let Ok(mut shard) = shard.lock()
            && cost <= shard.budget_bytes
        {
            shard.admit(Entry {
                key: key.into(),
                hash,
                value,
                cost,
            });
        }
    }

    /// Forgets everything.
    pub(crate) fn clear(&self) {
        for shard in &self.shards {
            if let Ok(mut shard) = shard.lock() {
                shard.young.clear();
                shard.old.clear();
                shard.young_bytes = 0;
            }
        }
    }

    /// Entries held, in both generations (the tests' view).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .filter_map(|shard| shard.lock().ok())
            .map(|shard| shard.young.len() + shard.old.len())
            .sum()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<V> fmt::Debug for Memo<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Memo")
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

impl<V> Shard<V> {
    /// Puts `entry` in the young generation, replacing an entry of the
    /// same key; a young generation that would pass its budget becomes
    /// the old one first (the previous old one is dropped).
    fn admit(&mut self, entry: Entry<V>) {
        if self.young_bytes + entry.cost > self.budget_bytes {
            self.old = std::mem::take(&mut self.young);
            self.young_bytes = 0;
        }
        let hash = entry.hash;
        let same = |held: &Entry<V>| held.hash == hash && held.key == entry.key;
        if let Ok(held) = self.young.find_entry(hash, same) {
            let (replaced, _) = held.remove();
            self.young_bytes -= replaced.cost;
        }
        self.young_bytes += entry.cost;
        self.young.insert_unique(hash, entry, |held| held.hash);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_hit_needs_the_exact_key() {
        let memo = Memo::new(1 << 20);
        memo.insert("tools: [a]", 1u32, 4);
        assert_eq!(memo.get("tools: [a]"), Some(1));
        assert_eq!(memo.get("tools: [a] "), None);
        assert_eq!(memo.get("tools: [b]"), None);
    }

    #[test]
    fn memory_stays_within_two_generations_of_the_budget() {
        // One shard's generation holds 1 KiB; each entry costs 64 + key + 100.
        let memo = Memo::new(SHARDS * 2 * 1024);
        for index in 0..10_000 {
            memo.insert(&format!("key {index}"), index, 100);
        }
        let per_entry = ENTRY_OVERHEAD_BYTES + 100 + "key 0000".len();
        let most = SHARDS * 2 * 1024 / per_entry + SHARDS * 2;
        assert!(memo.len() <= most, "{} entries, at most {most}", memo.len());
        // The newest entries are the ones kept.
        assert_eq!(memo.get("key 9999"), Some(9999));
        assert_eq!(memo.get("key 0"), None);
    }

    #[test]
    fn an_entry_in_use_survives_a_generation_change() {
        let memo = Memo::new(SHARDS * 2 * 1024);
        memo.insert("kept", 0, 10);
        for index in 0..10_000 {
            // Touching the entry keeps it in the young generation.
            assert_eq!(memo.get("kept"), Some(0), "lost after {index} inserts");
            memo.insert(&format!("filler {index}"), index + 1, 100);
        }
    }

    #[test]
    fn a_key_inserted_again_replaces_its_entry_and_its_cost() {
        let memo = Memo::new(SHARDS * 2 * 1024);
        for value in 0..1_000 {
            memo.insert("same", value, 100);
        }
        assert_eq!(memo.len(), 1);
        assert_eq!(memo.get("same"), Some(999));
        let shard = memo.locate("same").1.lock().unwrap();
        assert_eq!(shard.young_bytes, "same".len() + 100 + ENTRY_OVERHEAD_BYTES);
    }

    #[test]
    fn an_entry_larger_than_a_generation_is_not_kept() {
        let memo = Memo::new(SHARDS * 2 * 1024);
        memo.insert("huge", 1, 4096);
        assert_eq!(memo.get("huge"), None);
        memo.insert("small", 2, 10);
        memo.clear();
        assert!(memo.is_empty());
    }
}
