//! Incremental detokenization: turning a stream of generated token ids into
//! a stream of text, one sequence at a time.
//!
//! Decoding each token alone is wrong: in byte-level BPE one character (an
//! emoji, a CJK ideograph) often spans several tokens, and decoders such as
//! SentencePiece's change a token's text depending on what precedes it.
//! Re-decoding the whole sequence on every token is right but costs
//! O(length) per token. The fix is the prefix/read-offset technique: decode
//! a few already-emitted tokens (the context) together with the new ones,
//! and emit what the new ones added to the context's text, holding it back
//! while it ends in an incomplete UTF-8 sequence (U+FFFD).
//!
//! The ids not emitted yet are bounded too, so a push costs the same on a
//! worker's hostile stream as on a normal one: ids that add no text
//! (skipped special tokens) are dropped at once, and a run of more than
//! [`MAX_PENDING_TOKENS`] ids that never completes a character (a real
//! character spans at most four byte tokens) is emitted as the U+FFFD a
//! full decode shows for invalid bytes. A long push that ends inside a
//! character (a worker sending many ids at once) emits up to its last
//! whole character and holds back only the ids of the one in progress.

use super::Tokenizer;
use crate::error::Result;

/// How many already-emitted tokens are decoded again with the new ones, so
/// that decoders which treat a leading token specially (SentencePiece drops
/// the first token's leading space) see the same neighbourhood as a full
/// decode would.
const CONTEXT_TOKENS: usize = 4;

/// How many ids may wait for their character to complete before they are
/// emitted as they decode (with U+FFFD for their incomplete bytes).
const MAX_PENDING_TOKENS: usize = 16;

/// The most ids one character can span: four UTF-8 bytes, one per
/// byte-level token at worst.
const MAX_CHAR_TOKENS: usize = 4;

/// Decodes one sequence's tokens as they arrive.
#[derive(Debug)]
pub struct IncrementalDecoder {
    tokenizer: Tokenizer,
    skip_special_tokens: bool,
    /// Up to [`CONTEXT_TOKENS`] ids already emitted (decoded again only as
    /// context), followed by at most [`MAX_PENDING_TOKENS`] ids not emitted
    /// yet (plus the last push's).
    window: Vec<u32>,
    /// How many of the window's ids are context.
    context_tokens: usize,
    /// The byte length of the context ids' text.
    context_text_len: usize,
}

impl IncrementalDecoder {
    pub fn new(tokenizer: &Tokenizer, skip_special_tokens: bool) -> Self {
        Self {
            tokenizer: tokenizer.clone(),
            skip_special_tokens,
            window: Vec::new(),
            context_tokens: 0,
            context_text_len: 0,
        }
    }

    /// Adds generated ids and returns the text they complete, which may be
    /// empty (a partial character, or a skipped special token). Never returns
    /// half a UTF-8 character. Costs O(ids + context), whatever the length of
    /// the sequence so far.
    pub fn push(&mut self, ids: &[u32]) -> Result<String> {
        self.window.extend_from_slice(ids);
        let text = self.decode_window()?;
        let incomplete = text.ends_with(char::REPLACEMENT_CHARACTER);
        if text.len() <= self.context_text_len && !incomplete {
            // The pending ids add no text (skipped special tokens): nothing
            // to wait for, so they need not be decoded again.
            self.window.truncate(self.context_tokens);
            return Ok(String::new());
        }
        let pending = self.window.len() - self.context_tokens;
        if incomplete && pending <= MAX_PENDING_TOKENS {
            return Ok(String::new());
        }
        if incomplete {
            // A long push that ends inside a character (a worker sending
            // many ids at once): emit up to the last whole character and
            // hold back the ids of the one in progress, at most
            // [`MAX_CHAR_TOKENS`]. Only a run that no such cut completes
            // (bytes that are not UTF-8) comes out with U+FFFD.
            for held in 1..=MAX_CHAR_TOKENS.min(pending - 1) {
                let cut = self.window.len() - held;
                let text = self
                    .tokenizer
                    .decode(&self.window[..cut], self.skip_special_tokens)?;
                if !text.ends_with(char::REPLACEMENT_CHARACTER) {
                    let new_text = text_after(&text, self.context_text_len).to_owned();
                    self.retire_emitted(held)?;
                    return Ok(new_text);
                }
            }
        }
        let new_text = text_after(&text, self.context_text_len).to_owned();
        self.retire_emitted(0)?;
        Ok(new_text)
    }

    /// Returns whatever is still held back (an incomplete character comes
    /// out as U+FFFD, exactly as a full decode shows it) and resets the
    /// decoder.
    pub fn finish(&mut self) -> Result<String> {
        let text = self.decode_window()?;
        let rest = text_after(&text, self.context_text_len).to_owned();
        self.window.clear();
        self.context_tokens = 0;
        self.context_text_len = 0;
        Ok(rest)
    }

    fn decode_window(&self) -> Result<String> {
        self.tokenizer
            .decode(&self.window, self.skip_special_tokens)
    }

    /// The window has been emitted but for its last `held` ids: keep the
    /// emitted part's last tokens as the context for the next push, and
    /// the held ids after them, pending.
    fn retire_emitted(&mut self, held: usize) -> Result<()> {
        let emitted = self.window.len() - held;
        let keep_from = emitted.saturating_sub(CONTEXT_TOKENS);
        self.window.drain(..keep_from);
        self.context_tokens = emitted - keep_from;
        self.context_text_len = self
            .tokenizer
            .decode(
                &self.window[..self.context_tokens],
                self.skip_special_tokens,
            )?
            .len();
        Ok(())
    }
}

/// The part of `text` after its first `offset` bytes, starting at the next
/// character boundary should `offset` fall inside a character (a decoder
/// that rewrote the context's last character).
fn text_after(text: &str, offset: usize) -> &str {
    let mut start = offset.min(text.len());
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const MULTILINGUAL: &str = "Hello 👋 世界! 🎉🎉 café 日本語のテキスト, ünïcödé ✓ 😀👍🏽 done.";

    fn fixture() -> Tokenizer {
        Tokenizer::from_model_dir(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/model"),
        )
        .expect("the fixture model loads")
    }

    /// Feeds `ids` in chunks of `chunk` and returns every push's output and
    /// the finish output, in order.
    fn stream(tokenizer: &Tokenizer, ids: &[u32], chunk: usize, skip_special: bool) -> Vec<String> {
        let mut decoder = IncrementalDecoder::new(tokenizer, skip_special);
        let mut pieces: Vec<String> = ids
            .chunks(chunk)
            .map(|chunk| decoder.push(chunk).expect("decodes"))
            .collect();
        pieces.push(decoder.finish().expect("decodes"));
        pieces
    }

    #[test]
    fn the_fixture_splits_characters_across_tokens() {
        // The premise of the tests below: some token is only part of a character.
        let tokenizer = fixture();
        let ids = tokenizer.encode(MULTILINGUAL, false).expect("encodes");
        let partial = ids.iter().filter(|&&id| {
            tokenizer
                .decode(&[id], false)
                .expect("decodes")
                .contains(char::REPLACEMENT_CHARACTER)
        });
        assert!(partial.count() >= 3);
    }

    #[test]
    fn one_id_at_a_time_reproduces_the_full_decode() {
        let tokenizer = fixture();
        let ids = tokenizer.encode(MULTILINGUAL, false).expect("encodes");
        let pieces = stream(&tokenizer, &ids, 1, false);
        for piece in &pieces {
            assert!(!piece.contains(char::REPLACEMENT_CHARACTER), "{piece:?}");
        }
        assert_eq!(
            pieces.concat(),
            tokenizer.decode(&ids, false).expect("decodes")
        );
        assert_eq!(pieces.concat(), MULTILINGUAL);
        assert_eq!(
            pieces.last().map(String::as_str),
            Some(""),
            "nothing left for finish"
        );
    }

    #[test]
    fn any_chunking_reproduces_the_full_decode() {
        let tokenizer = fixture();
        let ids = tokenizer.encode(MULTILINGUAL, false).expect("encodes");
        for chunk in [2, 3, 7, ids.len()] {
            assert_eq!(
                stream(&tokenizer, &ids, chunk, false).concat(),
                MULTILINGUAL,
                "chunk {chunk}"
            );
        }
    }

    #[test]
    fn a_long_push_ending_inside_a_character_holds_back_only_that_character() {
        // A worker that sends more than MAX_PENDING_TOKENS ids at once,
        // cut inside a character: the text must still be the full decode,
        // with no U+FFFD, whatever comes next.
        let tokenizer = fixture();
        let ids = tokenizer.encode(MULTILINGUAL, false).expect("encodes");
        let mut cuts = 0;
        for cut in MAX_PENDING_TOKENS + 1..ids.len() {
            let head = tokenizer.decode(&ids[..cut], false).expect("decodes");
            if !head.ends_with(char::REPLACEMENT_CHARACTER) {
                continue;
            }
            cuts += 1;
            let mut decoder = IncrementalDecoder::new(&tokenizer, false);
            let pieces = [
                decoder.push(&ids[..cut]).expect("decodes"),
                decoder.push(&ids[cut..]).expect("decodes"),
                decoder.finish().expect("decodes"),
            ];
            for piece in &pieces {
                assert!(
                    !piece.contains(char::REPLACEMENT_CHARACTER),
                    "cut {cut}: {piece:?}"
                );
            }
            assert_eq!(pieces.concat(), MULTILINGUAL, "cut {cut}");
        }
        assert!(
            cuts >= 3,
            "the fixture has cuts inside characters past 16 ids"
        );
    }

    #[test]
    fn special_tokens_are_kept_or_skipped() {
        let tokenizer = fixture();
        let mut ids = tokenizer.encode("Hi 世界", false).expect("encodes");
        ids.push(4002);
        ids.extend(tokenizer.encode(" more", false).expect("encodes"));
        let kept = stream(&tokenizer, &ids, 1, false).concat();
        assert_eq!(kept, "Hi 世界<|im_end|> more");
        let skipped = stream(&tokenizer, &ids, 1, true).concat();
        assert_eq!(skipped, "Hi 世界 more");
        assert_eq!(skipped, tokenizer.decode(&ids, true).expect("decodes"));
    }

    #[test]
    fn an_incomplete_character_is_held_until_finish() {
        let tokenizer = fixture();
        let ids = tokenizer.encode("a 👋", false).expect("encodes");
        let mut decoder = IncrementalDecoder::new(&tokenizer, false);
        assert_eq!(decoder.push(&ids[..1]).expect("decodes"), "a");
        // The emoji without its last byte token: nothing can be emitted yet.
        let without_last = &ids[..ids.len() - 1];
        assert_eq!(decoder.push(&without_last[1..]).expect("decodes"), "");
        let flushed = decoder.finish().expect("decodes");
        assert!(
            flushed.ends_with(char::REPLACEMENT_CHARACTER),
            "{flushed:?}"
        );
        assert_eq!(
            format!("a{flushed}"),
            tokenizer.decode(without_last, false).expect("decodes")
        );
        // finish reset the decoder: nothing of the old sequence leaks out.
        let fresh = tokenizer.encode("ok", false).expect("encodes");
        assert_eq!(decoder.push(&fresh).expect("decodes"), "ok");
    }

    #[test]
    fn work_per_push_does_not_grow_with_the_sequence() {
        let tokenizer = fixture();
        let ids = tokenizer
            .encode(&MULTILINGUAL.repeat(40), false)
            .expect("encodes");
        let mut decoder = IncrementalDecoder::new(&tokenizer, false);
        let mut largest_window = 0;
        let mut text = String::new();
        for id in &ids {
            text.push_str(&decoder.push(&[*id]).expect("decodes"));
            largest_window = largest_window.max(decoder.window.len());
        }
        text.push_str(&decoder.finish().expect("decodes"));
        assert_eq!(text, MULTILINGUAL.repeat(40));
        // The context plus the longest run of tokens inside one character.
        assert!(
            largest_window <= CONTEXT_TOKENS + 4,
            "window grew to {largest_window}"
        );
    }

    #[test]
    fn ids_that_add_no_text_are_not_decoded_again() {
        // A worker streaming only skipped special tokens once made every
        // push decode all of them again (quadratic in the stream).
        let tokenizer = fixture();
        let mut ids = tokenizer.encode("before 世界", false).expect("encodes");
        ids.extend(std::iter::repeat_n(4002, 5_000));
        ids.extend(tokenizer.encode(" after", false).expect("encodes"));
        let mut decoder = IncrementalDecoder::new(&tokenizer, true);
        let mut text = String::new();
        let mut largest_window = 0;
        for id in &ids {
            text.push_str(&decoder.push(&[*id]).expect("decodes"));
            largest_window = largest_window.max(decoder.window.len());
        }
        text.push_str(&decoder.finish().expect("decodes"));
        assert_eq!(text, tokenizer.decode(&ids, true).expect("decodes"));
        assert_eq!(text, "before 世界 after");
        assert!(
            largest_window <= CONTEXT_TOKENS + 1,
            "window grew to {largest_window}"
        );
    }

    #[test]
    fn bytes_that_never_complete_a_character_are_emitted_as_replacement_characters() {
        let tokenizer = fixture();
        // A token that is a lone UTF-8 continuation byte: it can never
        // start or complete a character.
        let continuation = (0..tokenizer.vocab_size() as u32)
            .find(|&id| {
                tokenizer.decode(&[id], false).ok().as_deref() == Some("\u{FFFD}")
                    && tokenizer.decode(&[id, id], false).ok().as_deref()
                        == Some("\u{FFFD}\u{FFFD}")
            })
            .expect("the byte-level fixture has a lone continuation byte");
        let mut decoder = IncrementalDecoder::new(&tokenizer, false);
        let mut text = String::new();
        let mut largest_window = 0;
        for _ in 0..5_000 {
            text.push_str(&decoder.push(&[continuation]).expect("decodes"));
            largest_window = largest_window.max(decoder.window.len());
        }
        assert!(
            largest_window <= CONTEXT_TOKENS + MAX_PENDING_TOKENS + 1,
            "window grew to {largest_window}"
        );
        assert!(
            text.chars().count() >= 4_900,
            "emitted as it went: {}",
            text.chars().count()
        );
        text.push_str(&decoder.finish().expect("decodes"));
        assert!(text.chars().all(|c| c == char::REPLACEMENT_CHARACTER));
        let ok = tokenizer.encode(" ok", false).expect("encodes");
        assert_eq!(decoder.push(&ok).expect("decodes"), " ok");
    }

    #[test]
    fn sentencepiece_leading_spaces_survive_streaming() {
        // A SentencePiece-style decoder drops the leading space of the first
        // token it decodes: without context tokens every push would start a
        // new word without its space.
        let tokenizer_json = r#"{
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "post_processor": null,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
            "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
            "model": {"type": "WordLevel", "unk_token": "[UNK]",
                      "vocab": {"▁Hello": 0, "▁world": 1, "▁again": 2, "[UNK]": 3}}
        }"#;
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("tokenizer.json"), tokenizer_json).expect("writes");
        let tokenizer = Tokenizer::from_model_dir(dir.path()).expect("loads");
        let ids = tokenizer
            .encode("Hello world again", false)
            .expect("encodes");
        assert_eq!(ids, [0, 1, 2]);
        let pieces = stream(&tokenizer, &ids, 1, false);
        assert_eq!(pieces, ["Hello", " world", " again", ""]);
    }

    #[test]
    fn text_after_moves_to_a_character_boundary() {
        assert_eq!(text_after("aé b", 2), " b");
        assert_eq!(text_after("ab", 1), "b");
        assert_eq!(text_after("ab", 5), "");
    }
}
