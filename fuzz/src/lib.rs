//! The fuzz targets' bodies, one module per target, each a plain
//! `run(&[u8])` with the target's checks.
//!
//! Why a library: the cargo-fuzz binaries (`fuzz_targets/`) need libFuzzer
//! and a nightly-flagged build, but an input that once broke a target must
//! stay fixed without that build. So the bodies live here, free of
//! libFuzzer: each binary is one `fuzz_target!` calling its `run`, and the
//! root workspace's `tests/fuzz_corpora.rs` includes this file (by path;
//! this crate is not a member there) and replays every committed input of
//! `corpus/<target>/` through the same `run` on every `cargo test`.
//!
//! Everything here depends only on crates the `smg` package depends on
//! (`smg`, `smg-dataplane`, `smg-shared`, `serde_json`), so it builds in
//! both places.

use std::path::PathBuf;

pub mod chat_template;
pub mod decode_preprocess;
pub mod detokenize;
pub mod request_json;
pub mod tokenizer_archive;
pub mod worker_response;

/// A target's body: one input, checked.
pub type Body = fn(&[u8]);

/// Every target: its name (the binary, `fuzz_targets/<name>.rs`, and
/// `corpus/<name>/`) and its body.
pub const TARGETS: &[(&str, Body)] = &[
    ("chat_template", chat_template::run),
    ("decode_preprocess", decode_preprocess::run),
    ("detokenize", detokenize::run),
    ("request_json", request_json::run),
    ("tokenizer_archive", tokenizer_archive::run),
    ("worker_response", worker_response::run),
];

/// The repository's root: the crate being built is either `smg` (at the
/// root) or `smg-fuzz` (in `fuzz/`).
pub fn repository_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if manifest.join("fuzz_targets").is_dir() {
        manifest.join("..")
    } else {
        manifest
    }
}
