//! Types both halves of smg agree on: the control plane (tokio) and the data
//! plane (pinned io_uring threads) meet only through what this crate defines,
//! so neither reaches into the other: the bounded lock-free [`ring`] and the
//! eventfd [`doorbell`] that wakes a sleeping consumer, the `/dev/shm`
//! identity, and wire-neutral tensor types.

#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(unreachable_pub)]

pub mod doorbell;
pub mod ring;
pub mod shm;
mod sync;
pub mod tensor;
