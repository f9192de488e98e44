//! Arbitrary token ids, as a worker streams them, through the gateway's
//! incremental detokenizer and stop-string matcher against the test model's
//! tokenizer (`tests/fixtures/model`, a byte-level BPE with added tokens).
//! Ids out of the vocabulary, special tokens and ids that split a UTF-8
//! character are all allowed: errors are fine, a panic is not, and the text
//! that comes out may not grow faster than the ids that went in.
//!
//! Input: byte 0 picks `skip_special_tokens` and `no_stop_trim`; bytes 1..3
//! are a stop string's length; then that stop string (lossy UTF-8); the rest
//! is chunks of little-endian `u16` ids (chunk boundaries at every 0xFFFF id,
//! so the fuzzer controls how the stream is split).

use std::sync::OnceLock;

use smg::tokenizer::{IncrementalDecoder, StopMatcher, Tokenizer};

fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let dir = super::repository_root().join("tests/fixtures/model");
        Tokenizer::from_model_dir(&dir).expect("the test model's tokenizer loads")
    })
}

/// Ids are taken modulo this: the vocabulary (4007) and a few ids past it.
const ID_RANGE: u32 = 4100;

/// The most text bytes one id may add: the longest vocabulary entry is 30
/// byte symbols, each of which may come out as a 3-byte U+FFFD.
const MAX_BYTES_PER_ID: usize = 96;

/// One input, as the fuzz target runs it.
pub fn run(data: &[u8]) {
    let tokenizer = tokenizer();
    let [flags, len_lo, len_hi, rest @ ..] = data else {
        return;
    };
    let stop_len = usize::from(u16::from_le_bytes([*len_lo, *len_hi])).min(rest.len()) % 64;
    let (stop, ids) = rest.split_at(stop_len);
    let stop = String::from_utf8_lossy(stop).into_owned();
    let ids: Vec<u32> = ids
        .chunks_exact(2)
        .map(|pair| u32::from(u16::from_le_bytes([pair[0], pair[1]])))
        .map(|id| if id == 0xFFFF { id } else { id % ID_RANGE })
        .collect();

    let mut decoder = IncrementalDecoder::new(tokenizer, flags & 1 != 0);
    let stops: Vec<String> = if stop.is_empty() {
        Vec::new()
    } else {
        vec![stop]
    };
    let mut matcher = StopMatcher::new(stops, flags & 2 != 0);
    let mut out = 0usize;
    let mut decoded = 0usize;
    let mut stopped = false;
    for chunk in ids.split(|&id| id == 0xFFFF) {
        let Ok(text) = decoder.push(chunk) else {
            return;
        };
        if !stopped {
            let outcome = matcher.push(&text);
            out += outcome.text.len();
            stopped = outcome.matched_stop.is_some();
        }
        decoded += text.len();
        assert!(
            decoded <= (ids.len() + 1) * MAX_BYTES_PER_ID,
            "{decoded} bytes of text from {} ids",
            ids.len()
        );
    }
    if let Ok(tail) = decoder.finish()
        && !stopped
    {
        let outcome = matcher.push(&tail);
        out += outcome.text.len();
        stopped = outcome.matched_stop.is_some();
    }
    if !stopped {
        out += matcher.finish().len();
    }
    assert!(
        out <= (ids.len() + 1) * MAX_BYTES_PER_ID,
        "{out} bytes of text from {} ids",
        ids.len()
    );
}
