//! Compiles `proto/` into Rust with `protox` (a pure-Rust protobuf compiler),
//! so building smg never needs a system `protoc`.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "common.proto",
    "tokenspeed_scheduler.proto",
    "tokenspeed_encoder.proto",
    "sglang_scheduler.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = PathBuf::from("proto");
    for file in PROTOS {
        println!("cargo:rerun-if-changed=proto/{file}");
    }
    let descriptors = protox::compile(PROTOS, [&proto_dir])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Tensor payloads stay `bytes::Bytes` end to end: an inline tensor
        // written by the data plane reaches the gRPC frame without a copy.
        .bytes(".")
        // The prompt's token ids are encoded by hand (a stack block per 64
        // ids instead of a buffer call per byte): control/proto/tokenized.rs.
        .extern_path(
            ".tokenspeed.grpc.scheduler.TokenizedInput",
            "crate::proto::tokenized::TokenSpeedTokenizedInput",
        )
        .extern_path(
            ".sglang.grpc.scheduler.TokenizedInput",
            "crate::proto::tokenized::SglangTokenizedInput",
        )
        .compile_fds(descriptors)?;
    Ok(())
}
