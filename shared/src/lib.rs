//! Types both halves of smg agree on: the control plane (tokio) and the data
//! plane (pinned io_uring threads) meet only through what this crate defines,
//! so neither reaches into the other.

pub mod shm;
pub mod tensor;
