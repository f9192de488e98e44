//! Lanes: how a finished tensor travels from a data-plane core to a worker.
//!
//! The kernel writes each tensor once, into the buffer of the lane chosen
//! for it; the lane then yields what goes on the wire (inline bytes, a
//! `/dev/shm` name, or an RDMA descriptor) and a guard that the request
//! keeps until the RPC carrying it has returned.
//!
//! - `shm.rs`: pre-faulted `/dev/shm` slots with fresh public names.

pub mod rdma;
pub mod shm;
