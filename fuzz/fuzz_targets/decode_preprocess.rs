//! The `decode_preprocess` target: see `fuzz/src/decode_preprocess.rs`, which `cargo test`
//! also runs over the committed corpus (`tests/fuzz_corpora.rs`).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| smg_fuzz::decode_preprocess::run(data));
