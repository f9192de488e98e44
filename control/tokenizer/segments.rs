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
//!
//! Before the cache, each thread keeps the last text it encoded with its
//! ids and added tokens: a prompt that starts as the previous one did (an
//! agent's system prompt and tools, turn after turn) takes the ids of that
//! common prefix as they are, up to the last added token the prefix fully
//! decides, and is scanned, hashed and looked up from there on only. An
//! added token found at `start` is decided by the text up to `start` plus
//! the longest added token (a longer one could begin there), so one whose
//! end plus that length lies within the common prefix is found at the
//! same place in both texts, as is everything before it; the scan resumes
//! at its end, where a scan of the whole text would resume too.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aho_corasick::{AhoCorasick, MatchKind};

use super::byte_level_bpe::ByteLevelBpe;
use crate::memo::Memo;
use crate::shared_prefix::shared_prefix_len;

/// Pieces longer than this are tokenized but never cached.
const MAX_CACHED_PIECE_BYTES: usize = 256 * 1024;
/// Memory the cache may hold in all, keys and ids counted.
const DEFAULT_CACHE_BYTES: usize = 64 * 1024 * 1024;
/// Texts longer than this are not kept as a thread's last text.
const MAX_REMEMBERED_TEXT_BYTES: usize = 256 * 1024;

/// Names each encoder for the threads' last texts (an address could be
/// reused by the next encoder, for another tokenizer).
static NEXT_ENCODER_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static LAST_ENCODED: RefCell<LastEncoded> = RefCell::new(LastEncoded::default());
}

/// The last text one thread encoded, and what encoding it found.
#[derive(Default)]
struct LastEncoded {
    /// The encoder that encoded it (0: none yet).
    encoder: u64,
    text: String,
    ids: Vec<u32>,
    /// Its added tokens in order.
    found: Vec<FoundToken>,
    /// Bytes of the last encoded text taken from the previous one (tests).
    #[cfg(test)]
    reused_bytes: usize,
}

/// An added token found in a text: where it ends, and how many ids the
/// text's encoding has up to and including it.
#[derive(Debug, Clone, Copy)]
struct FoundToken {
    end: usize,
    ids: usize,
}

/// Encodes text piece by piece between verbatim added tokens.
pub(super) struct SegmentEncoder {
    /// This encoder's name in the threads' [`LastEncoded`].
    id: u64,
    delimiters: AhoCorasick,
    delimiter_ids: Vec<u32>,
    /// Bytes of the longest added token.
    longest_delimiter: usize,
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
            id: NEXT_ENCODER_ID.fetch_add(1, Ordering::Relaxed),
            delimiters,
            delimiter_ids: tokens.iter().map(|(id, _)| *id).collect(),
            longest_delimiter: tokens
                .iter()
                .map(|(_, content)| content.len())
                .max()
                .unwrap_or(0),
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
        LAST_ENCODED.with(|last| match last.try_borrow_mut() {
            Ok(mut last) => self.encode_after(tokenizer, text, &mut last),
            // Not reached (nothing here encodes while encoding); still, a
            // text is encoded without the record rather than not at all.
            Err(_) => self.encode_after(tokenizer, text, &mut LastEncoded::default()),
        })
    }

    /// Encodes `text`, taking what it shares with `last` from it, and
    /// leaves `text` in `last`.
    fn encode_after(
        &self,
        tokenizer: &tokenizers::Tokenizer,
        text: &str,
        last: &mut LastEncoded,
    ) -> tokenizers::Result<Vec<u32>> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 8);
        let mut start = 0;
        let mut kept_tokens = 0;
        if last.encoder == self.id {
            let shared = shared_prefix_len(text.as_bytes(), last.text.as_bytes());
            let decided = last
                .found
                .iter()
                .rposition(|token| token.end + self.longest_delimiter <= shared);
            if let Some(index) = decided {
                let through = last.found[index];
                ids.extend_from_slice(&last.ids[..through.ids]);
                kept_tokens = index + 1;
                start = through.end;
            }
        }
        // Out of use until it describes `text` (an error below leaves it so).
        last.encoder = 0;
        last.found.truncate(kept_tokens);
        #[cfg(test)]
        {
            last.reused_bytes = start;
        }
        let scan_from = start;
        for token in self.delimiters.find_iter(&text[scan_from..]) {
            let (token_start, token_end) = (scan_from + token.start(), scan_from + token.end());
            self.encode_piece(tokenizer, &text[start..token_start], &mut ids)?;
            ids.push(self.delimiter_ids[token.pattern().as_usize()]);
            last.found.push(FoundToken {
                end: token_end,
                ids: ids.len(),
            });
            start = token_end;
        }
        self.encode_piece(tokenizer, &text[start..], &mut ids)?;
        if text.len() <= MAX_REMEMBERED_TEXT_BYTES {
            last.encoder = self.id;
            last.text.clear();
            last.text.push_str(text);
            last.ids.clear();
            last.ids.extend_from_slice(&ids);
        }
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

    /// Bytes the last encode on this thread took from the one before.
    fn reused_bytes() -> usize {
        LAST_ENCODED.with(|last| last.borrow().reused_bytes)
    }

    #[test]
    fn a_prompt_starting_as_the_last_one_takes_its_ids_and_agrees_with_the_tokenizer() {
        let tokenizer = fixture();
        let encoder = SegmentEncoder::for_tokenizer(&tokenizer).unwrap();
        let base = "<|im_start|>system\nYou are a helpful assistant with tools.<|im_end|>\n\
                    <|im_start|>user\nWhat is the weather?<|im_end|>\n<|im_start|>assistant\n";
        // The next turn: the same start, more after it.
        encoder.encode(&tokenizer, base).unwrap();
        let next = format!("{base}It is sunny.<|im_end|>\n<|im_start|>user\nThanks<|im_end|>");
        assert_eq!(
            encoder.encode(&tokenizer, &next).unwrap(),
            whole(&tokenizer, &next)
        );
        assert!(reused_bytes() > base.len() / 2, "{}", reused_bytes());
        // A text that differs from its first byte takes nothing.
        let other = format!("x{base}");
        assert_eq!(
            encoder.encode(&tokenizer, &other).unwrap(),
            whole(&tokenizer, &other)
        );
        assert_eq!(reused_bytes(), 0);
        // A change at every byte (a char boundary) of the base, after the
        // base itself: what is taken is only what the change leaves alone.
        for (at, _) in base.char_indices() {
            for change in ["Z", "<|im_end|>", "<|im_start|", "\n"] {
                let changed = format!("{}{change}{}", &base[..at], &base[at..]);
                encoder.encode(&tokenizer, base).unwrap();
                assert_eq!(
                    encoder.encode(&tokenizer, &changed).unwrap(),
                    whole(&tokenizer, &changed),
                    "{changed:?}"
                );
                assert!(reused_bytes() <= at, "{changed:?}: {}", reused_bytes());
            }
        }
    }

    /// The fixture with two more added tokens, one the start of the other.
    fn fixture_with_nested_tokens() -> tokenizers::Tokenizer {
        let mut tokenizer = fixture();
        tokenizer.add_special_tokens(&[
            tokenizers::AddedToken::from("<x>", true),
            tokenizers::AddedToken::from("<x>yz", true),
        ]);
        tokenizer
    }

    #[test]
    fn an_added_token_a_longer_one_may_extend_is_not_taken_from_the_last_text() {
        let tokenizer = fixture_with_nested_tokens();
        let encoder = SegmentEncoder::for_tokenizer(&tokenizer).unwrap();
        let long = whole(&tokenizer, "<x>yz");
        assert_eq!(long.len(), 1, "<x>yz is one token: {long:?}");
        // Both texts start "hi<x>y": there `<x>` is found in the first,
        // `<x>yz` in the second.
        let first = "hi<x>yq and more text after it";
        let second = "hi<x>yz and more text after it";
        encoder.encode(&tokenizer, first).unwrap();
        let ids = encoder.encode(&tokenizer, second).unwrap();
        assert_eq!(ids, whole(&tokenizer, second));
        assert!(ids.contains(&long[0]), "{ids:?}");
        assert_eq!(reused_bytes(), 0);
    }

    #[test]
    fn texts_growing_and_changing_from_the_last_one_agree_with_the_tokenizer() {
        use rand::{Rng, SeedableRng};
        let tokenizer = fixture_with_nested_tokens();
        let encoder = SegmentEncoder::for_tokenizer(&tokenizer).unwrap();
        let parts = [
            "<|im_start|>",
            "<|im_end|>",
            "<x>",
            "<x>yz",
            "yz",
            "y",
            "hello",
            " world",
            "\n",
            "é",
            "🙂",
            "<|",
            "|>",
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let mut text = String::new();
        let mut reused = 0;
        for _ in 0..2_000 {
            // Keep a random share of the last text (cut at a char), add parts.
            let keep = rng.random_range(0..=text.len());
            let keep = (0..=keep)
                .rev()
                .find(|&i| text.is_char_boundary(i))
                .unwrap_or(0);
            text.truncate(keep);
            for _ in 0..rng.random_range(0..6) {
                text.push_str(parts[rng.random_range(0..parts.len())]);
            }
            assert_eq!(
                encoder.encode(&tokenizer, &text).unwrap(),
                whole(&tokenizer, &text),
                "{text:?}"
            );
            reused += reused_bytes();
        }
        assert!(reused > 0, "some texts took ids from the last one");
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
