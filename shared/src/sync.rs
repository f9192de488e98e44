//! The atomics and cells the ring is built on, swappable for loom's.
//!
//! Why it exists: the ring's correctness rests on memory orderings, and the
//! cheapest strong check of those is `loom`, which explores every
//! interleaving the C++11 memory model allows. Loom needs its own atomic and
//! cell types; under `--cfg loom` this module re-exports them, otherwise the
//! standard ones behind the same small API (`UnsafeCell::with_mut`).

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;
#[cfg(loom)]
pub(crate) use loom::sync::Arc;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};

#[cfg(not(loom))]
pub(crate) use std::sync::Arc;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};

/// `std::cell::UnsafeCell` with loom's closure-based access API.
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(std::cell::UnsafeCell::new(value))
    }

    /// Runs `f` with a raw pointer to the contents; the caller upholds the
    /// aliasing rules for whatever `f` does with it.
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}
