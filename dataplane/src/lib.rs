//! smg's data plane: pinned per-core threads, each with its own io_uring, that
//! read and preprocess media and move tensors into the lanes (inline gRPC
//! bytes, later `/dev/shm` and RDMA slots).
//!
//! It depends only on `smg-shared`, never on the control plane: the two sides
//! meet through the bounded rings and doorbells defined there.
//!
//! - [`runtime`]: the threads, their rings, io_uring loops, the reactor that
//!   hands results back to tokio, backpressure and shutdown.
//! - [`preprocess`]: the image kernels the cores run (Qwen2-VL family).

#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(unreachable_pub)]

pub mod lanes;
pub mod preprocess;
pub mod runtime;

pub use runtime::{DataPlane, DataPlaneConfig, IoBackend, JobError};
pub use smg_shared::shm::ShmNamespace;
