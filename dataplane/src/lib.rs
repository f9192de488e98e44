//! smg's data plane: pinned per-core threads, each with its own io_uring, that
//! decode and preprocess media and move tensors into the lanes (inline gRPC
//! bytes, `/dev/shm` slots, RDMA slots).
//!
//! It depends only on `smg-shared`, never on the control plane: the two sides
//! meet through the bounded rings whose types live there. The runtime and
//! rings arrive with the data-plane issue; the first kernel, image
//! preprocessing for the Qwen2-VL family, lives in [`preprocess`].

pub mod lanes;
pub mod preprocess;

pub use smg_shared::shm::ShmNamespace;
