//! Generated gRPC types and clients/servers for the engines' protocols.
//!
//! `build.rs` compiles `proto/` at build time; the module tree mirrors the
//! proto packages because generated code refers across packages with
//! `super::` paths. Use the short aliases at the bottom. The two
//! `TokenizedInput` messages are hand-encoded (`tokenized`) and re-exported
//! where the generated ones would be.

#![allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]

pub mod smg {
    pub mod grpc {
        pub mod common {
            tonic::include_proto!("smg.grpc.common");
        }
    }
}

pub mod tokenspeed {
    pub mod grpc {
        pub mod scheduler {
            tonic::include_proto!("tokenspeed.grpc.scheduler");
            pub use crate::proto::tokenized::TokenSpeedTokenizedInput as TokenizedInput;
        }
        pub mod encoder {
            tonic::include_proto!("tokenspeed.grpc.encoder");
        }
    }
}

pub mod sglang {
    pub mod grpc {
        pub mod scheduler {
            tonic::include_proto!("sglang.grpc.scheduler");
            pub use crate::proto::tokenized::SglangTokenizedInput as TokenizedInput;
        }
    }
}

pub mod tokenized;

pub use sglang::grpc::scheduler as sglang_scheduler;
pub use smg::grpc::common;
pub use tokenspeed::grpc::encoder as tokenspeed_encoder;
pub use tokenspeed::grpc::scheduler as tokenspeed_scheduler;

/// Engines accept gRPC messages up to this size; the gateway and the
/// simulated workers use the same limit.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024 * 1024;
