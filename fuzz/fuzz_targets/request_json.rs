//! The `request_json` target: see `fuzz/src/request_json.rs`, which `cargo test`
//! also runs over the committed corpus (`tests/fuzz_corpora.rs`).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| smg_fuzz::request_json::run(data));
