//! The slot arena both RDMA backends share: how the registered memory is
//! laid out, and the lock-free state machine that hands slots to writers,
//! publishes them, and takes them back exactly once.
//!
//! Memory layout (little-endian; the loopback reader checks it):
//!
//! | bytes | field |
//! |---|---|
//! | 0..8 | magic `b"SMGARENA"` |
//! | 8..12 | layout version (u32), `1` |
//! | 12..16 | slot count (u32) |
//! | 16..24 | slot capacity in bytes (u64) |
//! | 24..32 | slot stride in bytes (u64, a multiple of 4096) |
//! | 32..40 | offset of slot 0's data (u64, a multiple of 4096) |
//! | 40..48 | the arena key (u64) |
//! | 48..64 | reserved, zero |
//! | 64.. | one 8-byte generation stamp per slot |
//! | data offset.. | the slots, `stride` bytes apart |
//!
//! Each slot's state lives in one in-process word, `generation << 2 |
//! state`, so every transition is a single compare-and-swap that also names
//! the publication it applies to; its stamp in the shared memory mirrors the
//! generation for readers. A publication carries the slot's current
//! generation; taking the slot back (the RPC returned, or the reaper found it
//! past its deadline) bumps the stamp first, then frees the slot, so a reader
//! holding the old descriptor sees the change and rejects what it copied
//! (a seqlock: stamp, copy, fence, stamp). Whoever wins the compare-and-swap
//! (the guard or the reaper) does the release; the other does nothing.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence};
use std::time::{Duration, Instant};

use super::RemoteMemory;

/// The first eight bytes of an arena.
pub(crate) const ARENA_MAGIC: [u8; 8] = *b"SMGARENA";
pub(crate) const ARENA_VERSION: u32 = 1;
/// Header bytes before the stamp table.
pub(crate) const HEADER_LEN: usize = 64;
const PAGE: usize = 4096;

/// Where everything is in an arena of `slots` slots of `slot_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ArenaLayout {
    pub slots: usize,
    pub slot_bytes: usize,
    pub slot_stride: usize,
    pub data_offset: usize,
    pub total_len: usize,
}

impl ArenaLayout {
    /// `None` when the arena would not fit the address space (or has no slot).
    pub(crate) fn new(slots: usize, slot_bytes: usize) -> Option<Self> {
        if slots == 0 || u32::try_from(slots).is_err() {
            return None;
        }
        let slot_stride = round_up(slot_bytes.max(1), PAGE)?;
        let data_offset = round_up(HEADER_LEN.checked_add(slots.checked_mul(8)?)?, PAGE)?;
        let total_len = data_offset.checked_add(slot_stride.checked_mul(slots)?)?;
        isize::try_from(total_len).ok()?;
        Some(Self {
            slots,
            slot_bytes,
            slot_stride,
            data_offset,
            total_len,
        })
    }

    pub(crate) fn stamp_offset(&self, index: usize) -> usize {
        HEADER_LEN + 8 * index
    }

    pub(crate) fn slot_offset(&self, index: usize) -> usize {
        self.data_offset + self.slot_stride * index
    }

    /// The header bytes for this layout and `key`.
    pub(crate) fn header(&self, key: u64) -> [u8; HEADER_LEN] {
        let mut header = [0u8; HEADER_LEN];
        header[0..8].copy_from_slice(&ARENA_MAGIC);
        header[8..12].copy_from_slice(&ARENA_VERSION.to_le_bytes());
        header[12..16].copy_from_slice(&(self.slots as u32).to_le_bytes());
        header[16..24].copy_from_slice(&(self.slot_bytes as u64).to_le_bytes());
        header[24..32].copy_from_slice(&(self.slot_stride as u64).to_le_bytes());
        header[32..40].copy_from_slice(&(self.data_offset as u64).to_le_bytes());
        header[40..48].copy_from_slice(&key.to_le_bytes());
        header
    }

    /// The layout and key a header describes, if it is a version-1 header.
    pub(crate) fn parse_header(header: &[u8]) -> Option<(Self, u64)> {
        let word = |range: std::ops::Range<usize>| {
            let mut bytes = [0u8; 8];
            bytes[..range.len()].copy_from_slice(header.get(range)?);
            Some(u64::from_le_bytes(bytes))
        };
        if header.get(0..8)? != ARENA_MAGIC || word(8..12)? != u64::from(ARENA_VERSION) {
            return None;
        }
        let slots = usize::try_from(word(12..16)?).ok()?;
        let slot_bytes = usize::try_from(word(16..24)?).ok()?;
        let layout = Self::new(slots, slot_bytes)?;
        let agrees = word(24..32)? == layout.slot_stride as u64
            && word(32..40)? == layout.data_offset as u64;
        agrees.then_some((layout, word(40..48)?))
    }
}

fn round_up(value: usize, to: usize) -> Option<usize> {
    value.checked_add(to - 1).map(|v| v / to * to)
}

const FREE: u64 = 0;
/// Handed to a writer; not published.
const WRITING: u64 = 1;
/// Published; its guard (or the reaper) will take it back.
const PUBLISHED: u64 = 2;
/// Being taken back: the stamp is bumped, then the slot is freed.
const RELEASING: u64 = 3;
const STATE_MASK: u64 = 3;

fn lease(generation: u64, state: u64) -> u64 {
    (generation << 2) | state
}

#[derive(Debug)]
struct SlotState {
    /// `generation << 2 | state`.
    lease: AtomicU64,
    /// Nanoseconds since the arena's epoch after which the reaper may take
    /// a published slot back.
    deadline: AtomicU64,
}

/// How the arena's slots are used right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaOccupancy {
    /// `smg_rdma_slots`.
    pub slots_total: usize,
    /// `smg_rdma_slots_in_use`: being written or published.
    pub slots_in_use: usize,
    /// Slots the reaper took back from publications past their deadline.
    pub reaped_total: u64,
}

/// One arena: a backend's registered memory and its slots.
#[derive(Debug)]
pub(crate) struct SlotArena {
    slots: Vec<SlotState>,
    layout: ArenaLayout,
    epoch: Instant,
    cursor: AtomicUsize,
    reaped: AtomicU64,
    memory: Box<dyn RemoteMemory>,
}

impl SlotArena {
    /// Lays out `memory` (at least `layout.total_len` bytes) as an arena.
    pub(crate) fn new(memory: Box<dyn RemoteMemory>, layout: ArenaLayout) -> Self {
        debug_assert!(memory.size() >= layout.total_len);
        let header = layout.header(memory.key());
        // SAFETY: `RemoteMemory` guarantees `size()` writable bytes at
        // `base()`; the header fits (HEADER_LEN <= data_offset <= len), and
        // nobody else has the arena yet.
        unsafe {
            std::ptr::copy_nonoverlapping(header.as_ptr(), memory.base().as_ptr(), HEADER_LEN);
        }
        let arena = Self {
            slots: (0..layout.slots)
                .map(|_| SlotState {
                    lease: AtomicU64::new(lease(1, FREE)),
                    deadline: AtomicU64::new(0),
                })
                .collect(),
            layout,
            epoch: Instant::now(),
            cursor: AtomicUsize::new(0),
            reaped: AtomicU64::new(0),
            memory,
        };
        for index in 0..layout.slots {
            arena.stamp(index).store(1, Ordering::Release);
        }
        arena
    }

    pub(crate) fn memory(&self) -> &dyn RemoteMemory {
        &*self.memory
    }

    pub(crate) fn layout(&self) -> &ArenaLayout {
        &self.layout
    }

    /// The shared stamp of slot `index`.
    fn stamp(&self, index: usize) -> &AtomicU64 {
        // SAFETY: the stamp table lies inside the arena (layout), each stamp
        // is 8-aligned (the base is page-aligned, offsets are 64 + 8i), and
        // the memory lives as long as `self`. Every access is atomic.
        unsafe {
            &*self
                .memory
                .base()
                .as_ptr()
                .add(self.layout.stamp_offset(index))
                .cast::<AtomicU64>()
        }
    }

    /// Claims a free slot for a writer: `(index, generation)`. Never
    /// blocks; when every slot is taken it reaps expired ones once and looks
    /// again.
    pub(crate) fn claim(&self) -> Option<(usize, u64)> {
        self.try_claim().or_else(|| {
            if self.reap_expired() > 0 {
                self.try_claim()
            } else {
                None
            }
        })
    }

    fn try_claim(&self) -> Option<(usize, u64)> {
        let slots = self.slots.len();
        let start = self.cursor.fetch_add(1, Ordering::Relaxed);
        (0..slots).find_map(|step| {
            let index = (start + step) % slots;
            let current = self.slots[index].lease.load(Ordering::Relaxed);
            if current & STATE_MASK != FREE {
                return None;
            }
            let generation = current >> 2;
            self.slots[index]
                .lease
                .compare_exchange(
                    current,
                    lease(generation, WRITING),
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .ok()
                .map(|_| {
                    // Order this writer's coming data stores after the stamp
                    // bump that freed the slot (the seqlock's write side).
                    fence(Ordering::Release);
                    (index, generation)
                })
        })
    }

    /// Where slot `index`'s bytes start (`layout.slot_bytes` of them).
    pub(crate) fn slot_ptr(&self, index: usize) -> *mut u8 {
        // SAFETY: the slot's offset lies inside the arena memory.
        unsafe {
            self.memory
                .base()
                .as_ptr()
                .add(self.layout.slot_offset(index))
        }
    }

    /// A writer gave its slot back unpublished.
    pub(crate) fn abandon(&self, index: usize, generation: u64) {
        let _ = self.slots[index].lease.compare_exchange(
            lease(generation, WRITING),
            lease(generation, FREE),
            Ordering::Release,
            Ordering::Relaxed,
        );
    }

    /// Publishes the written slot until `deadline` from now.
    pub(crate) fn publish(&self, index: usize, generation: u64, deadline: Duration) {
        let at = self.now_nanos().saturating_add(deadline.as_nanos() as u64);
        let slot = &self.slots[index];
        slot.deadline.store(at, Ordering::Relaxed);
        slot.lease
            .store(lease(generation, PUBLISHED), Ordering::Release);
    }

    /// Takes back the publication `(index, generation)` if nobody has yet:
    /// bumps its stamp (old descriptors go stale), then frees the slot.
    /// Returns whether this call did it.
    pub(crate) fn release(&self, index: usize, generation: u64) -> bool {
        let slot = &self.slots[index];
        if slot
            .lease
            .compare_exchange(
                lease(generation, PUBLISHED),
                lease(generation, RELEASING),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return false;
        }
        let next = generation + 1;
        self.stamp(index).store(next, Ordering::Release);
        slot.lease.store(lease(next, FREE), Ordering::Release);
        true
    }

    /// Takes back every publication past its deadline; returns how many.
    pub(crate) fn reap_expired(&self) -> usize {
        let now = self.now_nanos();
        let mut reaped = 0;
        for (index, slot) in self.slots.iter().enumerate() {
            let current = slot.lease.load(Ordering::Acquire);
            if current & STATE_MASK != PUBLISHED || slot.deadline.load(Ordering::Relaxed) > now {
                continue;
            }
            if self.release(index, current >> 2) {
                reaped += 1;
            }
        }
        if reaped > 0 {
            self.reaped.fetch_add(reaped as u64, Ordering::Relaxed);
            tracing::warn!(
                slots = reaped,
                "RDMA lane: reaped slots whose RPC outlived their deadline; late readers get stale descriptors"
            );
        }
        reaped
    }

    pub(crate) fn occupancy(&self) -> RdmaOccupancy {
        let in_use = self
            .slots
            .iter()
            .filter(|slot| slot.lease.load(Ordering::Relaxed) & STATE_MASK != FREE)
            .count();
        RdmaOccupancy {
            slots_total: self.slots.len(),
            slots_in_use: in_use,
            reaped_total: self.reaped.load(Ordering::Relaxed),
        }
    }

    fn now_nanos(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_page_aligned_and_round_trips_through_the_header() {
        let layout = ArenaLayout::new(3, 5000).expect("fits");
        assert_eq!(layout.slot_stride, 8192);
        assert_eq!(layout.data_offset, 4096);
        assert_eq!(layout.total_len, 4096 + 3 * 8192);
        assert_eq!(layout.stamp_offset(2), 64 + 16);
        assert_eq!(layout.slot_offset(2), 4096 + 2 * 8192);
        let header = layout.header(0x55aa);
        assert_eq!(&header[0..8], b"SMGARENA");
        assert_eq!(&header[8..12], &1u32.to_le_bytes());
        assert_eq!(&header[12..16], &3u32.to_le_bytes());
        assert_eq!(&header[16..24], &5000u64.to_le_bytes());
        assert_eq!(&header[40..48], &0x55aau64.to_le_bytes());
        assert_eq!(ArenaLayout::parse_header(&header), Some((layout, 0x55aa)));
        let mut bad = header;
        bad[24] ^= 1;
        assert_eq!(ArenaLayout::parse_header(&bad), None, "stride disagrees");
        assert_eq!(ArenaLayout::new(0, 10), None);
        assert_eq!(ArenaLayout::new(usize::MAX / 2, usize::MAX / 2), None);
    }
}
