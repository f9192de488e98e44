//! The `chat_template` target: see `fuzz/src/chat_template.rs`, which `cargo test`
//! also runs over the committed corpus (`tests/fuzz_corpora.rs`).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| smg_fuzz::chat_template::run(data));
