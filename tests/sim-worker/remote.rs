//! Reading `RemoteTensorHandle` payloads: the worker's side of the RDMA
//! lane.
//!
//! This host has no RDMA device, so the simulated worker serves the lane's
//! loopback transport: a one-sided READ emulated by copying from the
//! gateway's `/dev/shm` arena (mapped read-only), with the arena key checked
//! as an rkey and the slot's generation stamp checked before and after the
//! copy (`smg_dataplane::lanes::rdma::LoopbackReader`, the same code the
//! lane's tests use). A stale, forged or malformed descriptor is
//! INVALID_ARGUMENT; a verbs (`rdma`) descriptor is UNIMPLEMENTED, as on a
//! worker without a NIC.

use std::sync::OnceLock;

use smg_dataplane::lanes::rdma::{LOOPBACK_TRANSPORT, LoopbackReader, RemoteReadError};
use tonic::Status;

/// One reader per process (arenas in `--shm-dir`, else `/dev/shm`): it
/// keeps each arena mapped across requests.
fn reader() -> &'static LoopbackReader {
    static READER: OnceLock<LoopbackReader> = OnceLock::new();
    READER.get_or_init(|| LoopbackReader::new(crate::tensor::shm_root()))
}

/// The bytes a remote handle names.
pub fn read_remote(transport: &str, descriptor: &[u8], nbytes: u64) -> Result<Vec<u8>, Status> {
    if transport != LOOPBACK_TRANSPORT {
        return Err(Status::unimplemented(format!(
            "remote tensor transport {transport:?} is not served by this worker (it has no RDMA device; it reads {LOOPBACK_TRANSPORT:?})"
        )));
    }
    reader().read(descriptor, nbytes).map_err(|err| match err {
        RemoteReadError::Io { .. } => Status::internal(format!("{}: {err}", err.code())),
        _ => Status::invalid_argument(format!("{}: {err}", err.code())),
    })
}
