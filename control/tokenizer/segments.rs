//! Tokenizing rendered prompts one segment at a time, with a bounded cache
//! of segments seen before.
//!
//! Hugging Face tokenizers first cut the text at added tokens
//! (`<|im_start|>`, `<|im_end|>`, ...) and then normalize, pre-tokenize and
//! run the model on each piece between them on its own. So for an added
//! token `T` matched verbatim, `encode(a + T + b)` is `encode(a)`, `id(T)`,
//! `encode(b)`. Chat templates put such tokens around every message, which
//! makes system prompts, role headers and earlier turns of a conversation
//! reappear verbatim as pieces, request after request; their ids come from
//! the cache instead of a fresh pass through the tokenizer, which is the
//! costliest step of a short request in the gateway.
//!
//! The cut is only ours to make when it is the tokenizer's own: every added
//! token must match verbatim (no `lstrip`/`rstrip`/`single_word`, and not
//! `normalized` when the tokenizer has a normalizer), and probe texts must
//! tokenize the same both ways (this catches pieces whose treatment depends
//! on their position, e.g. a Metaspace "prepend only first" scheme).
//! Otherwise [`SegmentEncoder::for_tokenizer`] declines and callers use the
//! tokenizer directly.

use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};

use super::byte_level_bpe::ByteLevelBpe;
use crate::memo::Memo;

/// Pieces longer than this are tokenized but never cached.
const MAX_CACHED_PIECE_BYTES: usize = 256 * 1024;
/// Memory the cache may hold in all, keys and ids counted.
const DEFAULT_CACHE_BYTES: usize = 64 * 1024 * 1024;

/// Encodes text piece by piece between verbatim added tokens.
pub(super) struct SegmentEncoder {
    delimiters: AhoCorasick,
    delimiter_ids: Vec<u32>,
    cache: Memo<Arc<[u32]>>,
    /// Encodes pieces without `tokenizers`' bookkeeping, when it applies.
    direct: Option<ByteLevelBpe>,
}

impl SegmentEncoder {
    /// An encoder for `tokenizer`, or `None` when cutting at added tokens
    /// would not reproduce the tokenizer's own output.
    pub(super) fn for_tokenizer(tokenizer: &tokenizers::Tokenizer) -> Option<Self> {
        Self::with_cache_bytes(tokenizer, DEFAULT_CACHE_BYTES)
    }

    fn with_cache_bytes(tokenizer: &tokenizers::Tokenizer, cache_bytes: usize) -> Option<Self> {
        if depends_on_piece_position(tokenizer) {
            return None;
        }
        let has_normalizer = tokenizer.get_normalizer().is_some();
        let mut tokens: Vec<(u32, String)> = Vec::new();
        for (id, token) in tokenizer.get_added_tokens_decoder() {
            let rewritten = token.lstrip
                || token.rstrip
                || token.single_word
                || (token.normalized && has_normalizer);
            if rewritten || token.content.is_empty() {
                return None;
            }
            tokens.push((id, token.content));
        }
        if tokens.is_empty() {
            return None;
        }
        tokens.sort();
        let delimiters = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(tokens.iter().map(|(_, content)| content.as_str()))
            .ok()?;
        let encoder = Self {
            delimiters,
            delimiter_ids: tokens.iter().map(|(id, _)| *id).collect(),
            cache: Memo::new(cache_bytes),
            direct: ByteLevelBpe::for_tokenizer(tokenizer),
        };
        let probes = probe_texts(&tokens);
        let agrees = probes.iter().all(|probe| {
            let whole = tokenizer.encode_fast(probe.as_str(), false).ok();
            let cut = encoder.encode(tokenizer, probe).ok();
            whole.map(|encoding| encoding.get_ids().to_vec()) == cut
        });
        // The probes must not stay in the cache: they are not traffic.
        encoder.cache.clear();
        agrees.then_some(encoder)
    }

    /// The ids of `text` (no special tokens added around it).
    pub(super) fn encode(
        &self,
        tokenizer: &tokenizers::Tokenizer,
        text: &str,
    ) -> tokenizers::Result<Vec<u32>> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 8);
        let mut start = 0;
        for found in self.delimiters.find_iter(text) {
            self.encode_piece(tokenizer, &text[start..found.start()], &mut ids)?;
            ids.push(self.delimiter_ids[found.pattern().as_usize()]);
            start = found.end();
        }
        self.encode_piece(tokenizer, &text[start..], &mut ids)?;
        Ok(ids)
    }

    fn encode_piece(
        &self,
        tokenizer: &tokenizers::Tokenizer,
        piece: &str,
        ids: &mut Vec<u32>,
    ) -> tokenizers::Result<()> {
        if piece.is_empty() {
            return Ok(());
        }
        if let Some(cached) = self.cache.get(piece) {
            ids.extend_from_slice(&cached);
            return Ok(());
        }
        let start = ids.len();
        let direct = self
            .direct
            .as_ref()
            .is_some_and(|direct| direct.encode(piece, ids));
        if !direct {
            ids.extend_from_slice(tokenizer.encode_fast(piece, false)?.get_ids());
        }
        if piece.len() <= MAX_CACHED_PIECE_BYTES {
            let piece_ids: Arc<[u32]> = ids[start..].into();
            let charge = std::mem::size_of_val::<[u32]>(&piece_ids);
            self.cache.insert(piece, piece_ids, charge);
        }
        Ok(())
    }

    #[cfg(test)]
    fn uses_direct_bpe(&self) -> bool {
        self.direct.is_some()
    }

    #[cfg(test)]
    fn cached_pieces(&self) -> usize {
        self.cache.len()
    }
}

/// Whether the pre-tokenizer treats the input's first piece differently
/// from the others (Metaspace's `prepend_scheme: "first"`), which probes
/// can miss when the vocabulary happens not to tell the two apart.
fn depends_on_piece_position(tokenizer: &tokenizers::Tokenizer) -> bool {
    serde_json::to_value(tokenizer.get_pre_tokenizer())
        .map(|config| config.to_string().contains(r#""prepend_scheme":"first""#))
        .unwrap_or(true)
}

/// Texts that mix added tokens with text before, between and after them,
/// including text glued to the tokens without whitespace.
fn probe_texts(tokens: &[(u32, String)]) -> Vec<String> {
    let samples = [
        "Hello world",
        " leading space",
        "\n\nnew lines\n",
        "naïve café 日本語 🙂",
        "glued",
    ];
    let mut probes: Vec<String> = samples.iter().map(|text| (*text).to_owned()).collect();
    for (index, (_, token)) in tokens.iter().enumerate() {
        let text = samples[index % samples.len()];
        let other = samples[(index + 1) % samples.len()];
        probes.push(format!("{text}{token}{other}{token}"));
        probes.push(format!("{token}{other}\n{token} {text}"));
    }
    probes
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn fixture() -> tokenizers::Tokenizer {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/model");
        tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap()
    }

    fn whole(tokenizer: &tokenizers::Tokenizer, text: &str) -> Vec<u32> {
        tokenizer
            .encode_fast(text, false)
            .unwrap()
            .get_ids()
            .to_vec()
    }

    #[test]
    fn cutting_at_added_tokens_gives_the_tokenizers_own_ids() {
        let tokenizer = fixture();
        let encoder = SegmentEncoder::for_tokenizer(&tokenizer).expect("fixture qualifies");
        assert!(encoder.uses_direct_bpe());
        let texts = [
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
            "no added tokens at all",
            "<|im_end|><|im_end|>",
            "x<|vision_start|><|image_pad|><|image_pad|><|vision_end|>y",
            "",
            "<|im_start",
            "tail<|endoftext|>",
        ];
        for text in texts {
            // Twice: once filling the cache, once from it.
            assert_eq!(
                encoder.encode(&tokenizer, text).unwrap(),
                whole(&tokenizer, text),
                "{text:?}"
            );
            assert_eq!(
                encoder.encode(&tokenizer, text).unwrap(),
                whole(&tokenizer, text),
                "{text:?}"
            );
        }
    }

    #[test]
    fn random_mixes_of_text_and_tokens_agree_with_the_tokenizer() {
        use rand::{Rng, SeedableRng};
        let tokenizer = fixture();
        let encoder = SegmentEncoder::for_tokenizer(&tokenizer).unwrap();
        let parts = [
            "<|im_start|>",
            "<|im_end|>",
            "<|image_pad|>",
            "hello",
            " world",
            "\n",
            "  ",
            "é",
            "日本",
            "🙂",
            "<|",
            "|>",
            "im_start",
            "123",
            ".",
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..500 {
            let text: String = (0..rng.random_range(0..12))
                .map(|_| parts[rng.random_range(0..parts.len())])
                .collect();
            assert_eq!(
                encoder.encode(&tokenizer, &text).unwrap(),
                whole(&tokenizer, &text),
                "{text:?}"
            );
        }
    }

    #[test]
    fn repeated_pieces_are_served_from_the_cache_and_probes_are_not_kept() {
        let tokenizer = fixture();
        let encoder = SegmentEncoder::for_tokenizer(&tokenizer).unwrap();
        assert_eq!(
            encoder.cached_pieces(),
            0,
            "the load-time probes are dropped"
        );
        let text = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>";
        encoder.encode(&tokenizer, text).unwrap();
        // Pieces: "system\nBe brief.", "\n", "user\nHi".
        assert_eq!(encoder.cached_pieces(), 3);
        encoder.encode(&tokenizer, text).unwrap();
        assert_eq!(encoder.cached_pieces(), 3);
    }

    #[test]
    fn the_cache_stays_within_its_budget() {
        let tokenizer = fixture();
        let encoder = SegmentEncoder::with_cache_bytes(&tokenizer, 64 * 1024).unwrap();
        for n in 0..5_000 {
            let text = format!("<|im_start|>user\nmessage number {n}<|im_end|>");
            assert_eq!(
                encoder.encode(&tokenizer, &text).unwrap(),
                whole(&tokenizer, &text)
            );
        }
        // 16 shards x 2 generations x 2 KiB, at >= 64 bytes per entry.
        assert!(
            encoder.cached_pieces() <= 16 * 2 * 2048 / 64,
            "{}",
            encoder.cached_pieces()
        );
        assert!(encoder.cached_pieces() > 0);
    }

    #[test]
    fn position_dependent_tokenizers_are_declined() {
        // A Metaspace pre-tokenizer that prepends "▁" only to the first
        // piece of the input: pieces encoded on their own would each get it.
        let json = serde_json::json!({
            "version": "1.0",
            "added_tokens": [{"id": 3, "content": "<s>", "single_word": false, "lstrip": false,
                              "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                              "split": true},
            "post_processor": null,
            "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"<unk>": 0, "▁hi": 1, "hi": 2, "<s>": 3},
                      "unk_token": "<unk>"}
        });
        let tokenizer = tokenizers::Tokenizer::from_bytes(json.to_string()).unwrap();
        assert_ne!(
            whole(&tokenizer, "hi<s>hi"),
            [1, 3, 1],
            "the scheme really is position dependent"
        );
        assert!(SegmentEncoder::for_tokenizer(&tokenizer).is_none());
    }

    #[test]
    fn stripping_added_tokens_are_declined() {
        let mut tokenizer = fixture();
        tokenizer
            .add_special_tokens(&[tokenizers::AddedToken::from("<|strip|>", true).lstrip(true)]);
        assert!(SegmentEncoder::for_tokenizer(&tokenizer).is_none());
    }
}
