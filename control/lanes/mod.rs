//! Which lane each image tensor takes to its workers: inline in the gRPC
//! message, a `/dev/shm` name, or an RDMA slot.
//!
//! Why it exists: the data plane writes a tensor once, into the lane chosen
//! before the job is submitted, so the choice must be made up front from the
//! workers that may receive it (the encode pool in EPD, the regular or
//! prefill pool otherwise). The default mode comes from the settings; a
//! per-worker override (from the settings, or from the worker's admin
//! registration, which wins) changes it for one worker;
//! [`TensorLanes::transport_for`] is the one place that resolves
//! registration → override → default.
//!
//! - [`settings`]: what the lanes are configured from;
//! - [`decision`]: the choice, a pure function of the receivers' transports
//!   and the lanes that exist;
//! - [`pools`]: the shm pools and RDMA arena, their sweep, reclaimer and
//!   gauges, and the [`TensorLanes`] handle the gateway passes to whoever
//!   needs it (there is no process-wide instance).

mod decision;
mod pools;
mod settings;

pub(crate) use decision::LaneDecision;
pub(crate) use pools::{TensorLanes, engine_payload, open_rdma, record_fallback, record_tensor};
pub(crate) use settings::LaneSettings;
