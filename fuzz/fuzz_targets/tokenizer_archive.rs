//! The `tokenizer_archive` target: see `fuzz/src/tokenizer_archive.rs`, which `cargo test`
//! also runs over the committed corpus (`tests/fuzz_corpora.rs`).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| smg_fuzz::tokenizer_archive::run(data));
