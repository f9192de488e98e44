//! The `worker_response` target: see `fuzz/src/worker_response.rs`, which `cargo test`
//! also runs over the committed corpus (`tests/fuzz_corpora.rs`).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| smg_fuzz::worker_response::run(data));
