//! A bounded, lock-free, multi-producer single-consumer ring.
//!
//! Why we write it: the control plane (many tokio tasks) and each pinned
//! data-plane core meet only through rings like this one, so its hand-off
//! cost and its failure modes are the product. It is bounded on purpose — a
//! full ring is backpressure the caller must handle ([`Full`] hands the value
//! back), never an unbounded queue — and it never blocks or allocates after
//! construction. One type serves both directions: jobs into a core (many
//! submitters, one core) and completions out of it (one core, one reactor;
//! a single producer is just the uncontended case).
//!
//! # Algorithm
//!
//! Dmitry Vyukov's bounded queue, with the consumer side specialised to a
//! single consumer. Every slot carries a sequence number `seq`:
//!
//! - `seq == pos`: the slot is free for the producer claiming position `pos`;
//! - `seq == pos + 1`: it holds the value written at `pos`, ready to pop;
//! - after the pop at `pos` the consumer sets `seq = pos + capacity`, which
//!   frees the slot for position `pos + capacity` one lap later.
//!
//! Producers claim a position by compare-and-swap on `tail`, then write the
//! value and publish it by storing `seq`. The single consumer owns `head`;
//! it needs no read-modify-write at all. Positions are `usize` counters that
//! wrap; slot `pos & (capacity - 1)` holds position `pos`, and differences are
//! taken with wrapping arithmetic, so wrap-around is harmless. The capacity
//! is a power of two and at least 2 (with one slot, "free for the next lap"
//! and "holds a value" would be the same `seq`).
//!
//! # Memory orderings
//!
//! - A producer's `Release` store of `seq = pos + 1` after writing the value
//!   pairs with the consumer's `Acquire` load of `seq`: the consumer sees the
//!   whole value before it reads it.
//! - The consumer's `Release` store of `seq = pos + capacity` after moving the
//!   value out pairs with the next lap's producer's `Acquire` load of `seq`:
//!   the producer never overwrites a value still being read.
//! - `tail` is only a ticket counter; the CAS on it is `Relaxed` because the
//!   slot's `seq` (not `tail`) carries the data dependency. `head` is written
//!   only by the consumer and read by the others just for [`RingSender::len`]
//!   hints and by `Drop`, which runs with exclusive access.
//!
//! A producer that claimed a position but has not yet published it holds up
//! the consumer at that position (later positions may already be written).
//! The window is a few instructions unless the producer is preempted; a
//! consumer sleeping on a doorbell is woken by that producer's own ring once
//! it publishes (see [`crate::doorbell`]).

use std::fmt;
use std::mem::MaybeUninit;

use crate::sync::{Arc, AtomicUsize, Ordering, UnsafeCell};

/// Pads and aligns a value to its own cache lines (128 bytes covers the
/// adjacent-line prefetcher on x86 and the 128-byte lines of some ARM cores),
/// so producers bumping `tail` do not invalidate the consumer's `head`.
#[repr(align(128))]
struct CachePadded<T>(T);

struct Slot<T> {
    seq: AtomicUsize,
    value: UnsafeCell<MaybeUninit<T>>,
}

struct Shared<T> {
    slots: Box<[Slot<T>]>,
    mask: usize,
    tail: CachePadded<AtomicUsize>,
    head: CachePadded<AtomicUsize>,
}

// SAFETY: values move between threads through the ring (so `T: Send`), and
// every access to a slot's value is ordered by its `seq` protocol above, so
// sharing `Shared` is sound whenever `T` may be sent.
unsafe impl<T: Send> Send for Shared<T> {}
// SAFETY: as above; no `&T` is ever handed out, so `T: Sync` is not needed.
unsafe impl<T: Send> Sync for Shared<T> {}

/// Creates a ring holding up to `capacity` values (rounded up to a power of
/// two, at least 2). Panics only if that rounding overflows `usize`.
pub fn bounded<T>(capacity: usize) -> (RingSender<T>, RingReceiver<T>) {
    let capacity = capacity
        .max(2)
        .checked_next_power_of_two()
        .expect("ring capacity overflows usize");
    let slots = (0..capacity)
        .map(|pos| Slot {
            seq: AtomicUsize::new(pos),
            value: UnsafeCell::new(MaybeUninit::uninit()),
        })
        .collect();
    let shared = Arc::new(Shared {
        slots,
        mask: capacity - 1,
        tail: CachePadded(AtomicUsize::new(0)),
        head: CachePadded(AtomicUsize::new(0)),
    });
    (
        RingSender {
            shared: Arc::clone(&shared),
        },
        RingReceiver { shared, head: 0 },
    )
}

/// The ring was full; the value comes back to the caller.
#[derive(PartialEq, Eq)]
pub struct Full<T>(pub T);

impl<T> fmt::Debug for Full<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Full(..)")
    }
}

/// The producing end; clone it for every submitter.
pub struct RingSender<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Clone for RingSender<T> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T> fmt::Debug for RingSender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingSender")
            .field("capacity", &self.capacity())
            .finish_non_exhaustive()
    }
}

impl<T> RingSender<T> {
    /// Appends `value`, or hands it back if the ring is full. Never blocks.
    pub fn try_push(&self, value: T) -> Result<(), Full<T>> {
        let shared = &*self.shared;
        let mut pos = shared.tail.0.load(Ordering::Relaxed);
        loop {
            let slot = &shared.slots[pos & shared.mask];
            let seq = slot.seq.load(Ordering::Acquire);
            // How far the slot's sequence is ahead of our position: 0 means
            // free for us, negative means it still holds the value written
            // one lap ago (full), positive means another producer took `pos`.
            let lag = seq.wrapping_sub(pos) as isize;
            if lag == 0 {
                match shared.tail.0.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        // SAFETY: winning the CAS for `pos` while `seq == pos`
                        // gives this producer sole access to the slot until it
                        // publishes below; the consumer reads it only after
                        // seeing `seq == pos + 1`.
                        slot.value.with_mut(|cell| unsafe { (*cell).write(value) });
                        slot.seq.store(pos.wrapping_add(1), Ordering::Release);
                        return Ok(());
                    }
                    Err(current) => pos = current,
                }
            } else if lag < 0 {
                return Err(Full(value));
            } else {
                pos = shared.tail.0.load(Ordering::Relaxed);
            }
        }
    }

    /// How many values the ring holds at most.
    pub fn capacity(&self) -> usize {
        self.shared.mask + 1
    }

    /// Values claimed but not yet popped: a hint for load balancing, already
    /// stale when returned.
    pub fn len(&self) -> usize {
        let tail = self.shared.tail.0.load(Ordering::Relaxed);
        let head = self.shared.head.0.load(Ordering::Relaxed);
        tail.wrapping_sub(head).min(self.capacity())
    }

    /// Whether [`len`](Self::len) is zero (same caveat).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The consuming end: exactly one per ring (it cannot be cloned).
pub struct RingReceiver<T> {
    shared: Arc<Shared<T>>,
    /// The next position to pop; only this end moves it.
    head: usize,
}

impl<T> fmt::Debug for RingReceiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingReceiver")
            .field("capacity", &(self.shared.mask + 1))
            .field("head", &self.head)
            .finish_non_exhaustive()
    }
}

impl<T> RingReceiver<T> {
    /// Takes the oldest published value, if the next one is published.
    pub fn try_pop(&mut self) -> Option<T> {
        let shared = &*self.shared;
        let pos = self.head;
        let slot = &shared.slots[pos & shared.mask];
        if slot.seq.load(Ordering::Acquire) != pos.wrapping_add(1) {
            return None;
        }
        // SAFETY: `seq == pos + 1` means the producer of `pos` has written the
        // value and released it; this is the only consumer, and producers will
        // not touch the slot until `seq` moves on below.
        let value = slot
            .value
            .with_mut(|cell| unsafe { (*cell).assume_init_read() });
        slot.seq
            .store(pos.wrapping_add(shared.mask + 1), Ordering::Release);
        self.head = pos.wrapping_add(1);
        shared.head.0.store(self.head, Ordering::Relaxed);
        Some(value)
    }

    /// Whether the next value is not yet published (a value may be arriving).
    pub fn is_empty(&self) -> bool {
        let slot = &self.shared.slots[self.head & self.shared.mask];
        slot.seq.load(Ordering::Acquire) != self.head.wrapping_add(1)
    }

    pub fn capacity(&self) -> usize {
        self.shared.mask + 1
    }
}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        // Exclusive access: every sender and the receiver are gone, so every
        // claimed position was also published (a push completes within one
        // call). Drop the values still in the ring.
        let mut pos = self.head.0.load(Ordering::Relaxed);
        let tail = self.tail.0.load(Ordering::Relaxed);
        while pos != tail {
            let slot = &self.slots[pos & self.mask];
            if slot.seq.load(Ordering::Relaxed) == pos.wrapping_add(1) {
                // SAFETY: published and never popped, so initialised, and no
                // other reference to the ring exists any more.
                slot.value
                    .with_mut(|cell| unsafe { (*cell).assume_init_drop() });
            }
            pos = pos.wrapping_add(1);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::atomic::AtomicUsize as StdAtomicUsize;
    use std::sync::{Arc as StdArc, Barrier};

    #[test]
    fn capacity_rounds_up_to_a_power_of_two_of_at_least_two() {
        for (asked, got) in [(0, 2), (1, 2), (2, 2), (3, 4), (64, 64), (65, 128)] {
            let (sender, receiver) = bounded::<u8>(asked);
            assert_eq!((sender.capacity(), receiver.capacity()), (got, got));
        }
    }

    #[test]
    fn empty_then_full_then_empty_again() {
        let (sender, mut receiver) = bounded(4);
        assert!(receiver.is_empty());
        assert_eq!(receiver.try_pop(), None);
        for value in 0..4 {
            sender.try_push(value).expect("room for four");
        }
        assert_eq!(sender.len(), 4);
        assert_eq!(sender.try_push(99), Err(Full(99)), "a full ring refuses");
        assert_eq!(receiver.try_pop(), Some(0));
        sender.try_push(4).expect("one slot freed");
        assert_eq!(sender.try_push(5), Err(Full(5)));
        let drained: Vec<_> = std::iter::from_fn(|| receiver.try_pop()).collect();
        assert_eq!(drained, [1, 2, 3, 4]);
        assert!(receiver.is_empty());
        assert!(sender.is_empty());
    }

    #[test]
    fn wraps_around_many_laps_in_order() {
        let (sender, mut receiver) = bounded(4);
        let mut next_out = 0u64;
        for value in 0..10_000u64 {
            if sender.try_push(value).is_err() {
                // Pop a few whenever full, so the fill level keeps shifting.
                for _ in 0..3 {
                    assert_eq!(receiver.try_pop(), Some(next_out));
                    next_out += 1;
                }
                sender.try_push(value).expect("room after popping");
            }
        }
        while let Some(value) = receiver.try_pop() {
            assert_eq!(value, next_out);
            next_out += 1;
        }
        assert_eq!(next_out, 10_000);
    }

    #[test]
    fn positions_wrap_past_usize_max() {
        // Start the counters just below usize::MAX so the wrap happens now,
        // not after 2^64 pushes.
        let (sender, mut receiver) = bounded::<usize>(4);
        let start = usize::MAX - 5;
        for (index, slot) in sender.shared.slots.iter().enumerate() {
            // Slot i is free for the first position at or after `start`
            // congruent to i modulo 4.
            let pos = (0..4)
                .map(|k| start.wrapping_add(k))
                .find(|pos| pos & 3 == index)
                .expect("one of four consecutive positions");
            slot.seq.store(pos, Ordering::Relaxed);
        }
        sender.shared.tail.0.store(start, Ordering::Relaxed);
        sender.shared.head.0.store(start, Ordering::Relaxed);
        receiver.head = start;
        for round in 0..20usize {
            for k in 0..3 {
                sender.try_push(round * 3 + k).expect("room");
            }
            for k in 0..3 {
                assert_eq!(receiver.try_pop(), Some(round * 3 + k));
            }
        }
        assert!(receiver.head < start, "the head wrapped past usize::MAX");
    }

    /// Counts live values so leaks and double drops show up.
    struct Tracked(StdArc<StdAtomicUsize>);
    impl Drop for Tracked {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn dropping_the_ring_drops_what_it_still_holds_exactly_once() {
        let live = StdArc::new(StdAtomicUsize::new(0));
        let make = || {
            live.fetch_add(1, Ordering::Relaxed);
            Tracked(StdArc::clone(&live))
        };
        let (sender, mut receiver) = bounded(8);
        for _ in 0..8 {
            sender.try_push(make()).expect("room");
        }
        // A refused value comes back and is dropped by the caller.
        drop(sender.try_push(make()));
        drop(receiver.try_pop());
        drop(receiver.try_pop());
        assert_eq!(live.load(Ordering::Relaxed), 6);
        drop(receiver);
        assert_eq!(live.load(Ordering::Relaxed), 6, "the sender keeps it alive");
        drop(sender);
        assert_eq!(live.load(Ordering::Relaxed), 0);
    }

    /// Many producers against one consumer through a small ring: every value
    /// arrives exactly once, and each producer's values arrive in its order.
    #[test]
    fn many_producers_one_consumer_deliver_everything_exactly_once() {
        const PRODUCERS: usize = 8;
        const PER_PRODUCER: usize = 20_000;
        let (sender, mut receiver) = bounded::<(usize, usize)>(16);
        let start = StdArc::new(Barrier::new(PRODUCERS + 1));
        let full_retries = StdArc::new(StdAtomicUsize::new(0));
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|producer| {
                let sender = sender.clone();
                let start = StdArc::clone(&start);
                let full_retries = StdArc::clone(&full_retries);
                std::thread::spawn(move || {
                    start.wait();
                    for seq in 0..PER_PRODUCER {
                        let mut item = (producer, seq);
                        while let Err(Full(back)) = sender.try_push(item) {
                            item = back;
                            full_retries.fetch_add(1, Ordering::Relaxed);
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        drop(sender);
        start.wait();
        let mut next = [0usize; PRODUCERS];
        let mut seen = HashSet::new();
        let mut received = 0;
        while received < PRODUCERS * PER_PRODUCER {
            match receiver.try_pop() {
                Some((producer, seq)) => {
                    assert_eq!(seq, next[producer], "producer {producer} out of order");
                    next[producer] += 1;
                    assert!(seen.insert((producer, seq)), "duplicate {producer}/{seq}");
                    received += 1;
                }
                None => std::hint::spin_loop(),
            }
        }
        for producer in producers {
            producer.join().expect("producer thread");
        }
        assert_eq!(receiver.try_pop(), None, "nothing beyond what was sent");
        assert!(next.iter().all(|&n| n == PER_PRODUCER));
        // The ring was small enough to be full at times: the backpressure
        // path was exercised, not just the fast path.
        assert!(full_retries.load(Ordering::Relaxed) > 0);
    }
}

/// Model-checked with loom: `RUSTFLAGS="--cfg loom" cargo test -p smg-shared
/// --release --lib loom` explores every interleaving of these small cases.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;

    /// Two producers race each other and the consumer on a ring already one
    /// lap in (the second push lands in slot 0 again). No retry loops: loom
    /// needs every thread to finish in a bounded number of steps.
    #[test]
    fn loom_two_producers_one_consumer_across_a_lap() {
        loom::model(|| {
            let (sender, mut receiver) = bounded::<usize>(2);
            sender.try_push(0).expect("empty ring");
            assert_eq!(receiver.try_pop(), Some(0));
            let producers: Vec<_> = [1, 2]
                .into_iter()
                .map(|value| {
                    let sender = sender.clone();
                    loom::thread::spawn(move || sender.try_push(value).expect("two free slots"))
                })
                .collect();
            let mut got: Vec<usize> = receiver.try_pop().into_iter().collect();
            for producer in producers {
                producer.join().expect("producer");
            }
            got.extend(std::iter::from_fn(|| receiver.try_pop()));
            got.sort_unstable();
            assert_eq!(got, [1, 2], "each value exactly once");
        });
    }

    /// A producer pushing into a full ring while the consumer pops: it either
    /// sees the slot still taken (Full) or freed, and never overwrites an
    /// unread value.
    #[test]
    fn loom_push_into_a_full_ring_races_a_pop() {
        loom::model(|| {
            let (sender, mut receiver) = bounded::<usize>(2);
            sender.try_push(1).expect("room");
            sender.try_push(2).expect("room");
            let producer = {
                let sender = sender.clone();
                loom::thread::spawn(move || sender.try_push(3).is_ok())
            };
            assert_eq!(receiver.try_pop(), Some(1));
            let pushed = producer.join().expect("producer");
            let rest: Vec<usize> = std::iter::from_fn(|| receiver.try_pop()).collect();
            if pushed {
                assert_eq!(rest, [2, 3]);
            } else {
                assert_eq!(rest, [2]);
            }
        });
    }

    #[test]
    fn loom_values_left_in_the_ring_are_dropped() {
        loom::model(|| {
            let (sender, mut receiver) = bounded::<loom::sync::Arc<()>>(2);
            let token = loom::sync::Arc::new(());
            let pusher = {
                let sender = sender.clone();
                let token = loom::sync::Arc::clone(&token);
                loom::thread::spawn(move || {
                    let _ = sender.try_push(token);
                })
            };
            let _ = receiver.try_pop();
            pusher.join().expect("pusher");
            drop((sender, receiver));
            assert_eq!(loom::sync::Arc::strong_count(&token), 1);
        });
    }
}
