//! Arbitrary bytes as the tokenizer archive a worker's `GetTokenizer`
//! returns, loaded as the gateway loads it (`Tokenizer::from_archive`): the
//! zip reader with its entry and byte budgets, the JSON files, the
//! tokenizer, the chat template's compilation. Anything but a loaded
//! tokenizer or an error is a bug; a loaded one must also encode, decode
//! and render a short conversation without panicking.
//!
//! Inputs are capped at the client's `MAX_TOKENIZER_ARCHIVE_BYTES`, as the
//! client refuses anything larger before loading it.

use serde_json::json;
use smg::engine::MAX_TOKENIZER_ARCHIVE_BYTES;
use smg::tokenizer::{ChatTemplateOptions, Tokenizer};

/// One input, as the fuzz target runs it.
pub fn run(data: &[u8]) {
    if data.len() > MAX_TOKENIZER_ARCHIVE_BYTES {
        return;
    }
    let Ok(tokenizer) = Tokenizer::from_archive(data) else {
        return;
    };
    if let Ok(ids) = tokenizer.encode("Hello, world! <|im_end|>", true) {
        let _ = tokenizer.decode(&ids, false);
    }
    let messages = [json!({"role": "user", "content": "Hi"})];
    let options = ChatTemplateOptions {
        add_generation_prompt: true,
        ..ChatTemplateOptions::default()
    };
    let _ = tokenizer.apply_chat_template(&messages, &options);
    let _ = tokenizer.vision_files();
}
