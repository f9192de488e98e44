//! A direct byte-level BPE encoder for the tokenizers most models ship
//! (GPT-2, Qwen2, Llama 3 style): the same regex split and the same merges
//! as Hugging Face `tokenizers`, without its per-piece offset bookkeeping.
//!
//! `tokenizers` tracks, for every piece of the input, how each character
//! maps back to the original text (normalized strings, alignments, one
//! `String` per token). Engines only want ids, and for a short chat prompt
//! that bookkeeping costs more than the merges themselves, so the gateway
//! runs the pipeline directly when it is one of the shapes below:
//!
//! - normalizer: none, or NFC (then only ASCII text, which NFC leaves
//!   unchanged, takes this path; other text goes to `tokenizers`);
//! - pre-tokenizer: `ByteLevel` with its built-in GPT-2 regex, or a
//!   `Split` on a regex (isolated matches) followed by `ByteLevel` without
//!   a regex; never with `add_prefix_space`;
//! - model: BPE without dropout, word prefixes or suffixes, whose
//!   vocabulary spells every byte (so no unknown-token or byte-fallback
//!   rule can apply); `ignore_merges` is honoured.
//!
//! The regex splits as `tokenizers`' own engine does (ASCII text on the
//! `regex` crate where that gives the same pieces, see `super::split`),
//! and merges follow its rule: the lowest-ranked adjacent pair
//! first, the leftmost on ties. [`ByteLevelBpe::for_tokenizer`] checks
//! probe texts against `tokenizers` at load time and declines on any
//! difference, so a shape read wrongly costs speed, never correctness.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::byte_level::{self, char_of};
use super::split::Split;
use rustc_hash::FxHashMap;
use serde_json::Value;

/// The split `ByteLevel` applies when its `use_regex` is set (GPT-2's).
const GPT2_SPLIT: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Runs a byte-level BPE tokenizer's pre-tokenizer and model directly.
pub(super) struct ByteLevelBpe {
    split: Split,
    /// The id of each byte on its own.
    byte_ids: [u32; 256],
    /// `(left, right)` packed into a u64 → `(rank, merged id)`.
    merges: FxHashMap<u64, (u32, u32)>,
    /// With `ignore_merges`: a piece that is a vocabulary entry as a whole
    /// is that entry, whatever the merges would make of it.
    whole_pieces: Option<HashMap<Box<[u8]>, u32>>,
    /// NFC normalizer: only ASCII text is known to pass through unchanged.
    ascii_only: bool,
}

impl std::fmt::Debug for ByteLevelBpe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ByteLevelBpe")
            .field("merges", &self.merges.len())
            .field("ignore_merges", &self.whole_pieces.is_some())
            .field("ascii_only", &self.ascii_only)
            .finish()
    }
}

/// Scratch space reused across the pieces of one text.
#[derive(Default)]
struct Scratch {
    symbols: Vec<Symbol>,
    /// `(rank, position, merged id)`, lowest rank then leftmost first.
    queue: BinaryHeap<Reverse<(u32, u32, u32)>>,
}

#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    /// Neighbours in the linked list of live symbols (`NONE` at the ends).
    prev: u32,
    next: u32,
    live: bool,
}

const NONE: u32 = u32::MAX;

/// Pieces up to this many bytes merge on the stack by scanning for the
/// lowest-ranked pair; longer ones use a priority queue.
const SHORT_PIECE: usize = 32;
/// The rank of a pair that has no merge.
const NO_MERGE: (u32, u32) = (u32::MAX, 0);

fn pair_key(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

impl ByteLevelBpe {
    /// The direct encoder for `tokenizer`, or `None` when its pipeline is
    /// not one of the supported shapes or a probe text comes out different.
    pub(super) fn for_tokenizer(tokenizer: &tokenizers::Tokenizer) -> Option<Self> {
        let ascii_only = match serde_json::to_value(tokenizer.get_normalizer()).ok()? {
            Value::Null => false,
            normalizer if normalizer["type"] == "NFC" => true,
            _ => return None,
        };
        let split = Split::new(split_pattern(
            &serde_json::to_value(tokenizer.get_pre_tokenizer()).ok()?,
        )?)?;
        let model = serde_json::to_value(tokenizer.get_model()).ok()?;
        let plain_bpe = model["type"] == "BPE"
            && model["dropout"]
                .as_f64()
                .is_none_or(|dropout| dropout == 0.0)
            && model["continuing_subword_prefix"]
                .as_str()
                .is_none_or(str::is_empty)
            && model["end_of_word_suffix"]
                .as_str()
                .is_none_or(str::is_empty);
        if !plain_bpe {
            return None;
        }
        let vocab = model["vocab"].as_object()?;
        let id_of = |entry: &str| {
            vocab
                .get(entry)?
                .as_u64()
                .and_then(|id| u32::try_from(id).ok())
        };
        let mut byte_ids = [0u32; 256];
        for (byte, slot) in (0..=u8::MAX).zip(byte_ids.iter_mut()) {
            *slot = id_of(char_of(byte).encode_utf8(&mut [0; 4]))?;
        }
        let mut merges = FxHashMap::default();
        for (rank, merge) in model["merges"].as_array()?.iter().enumerate() {
            let (left, right) = merge_pair(merge)?;
            let merged = id_of(&format!("{left}{right}"))?;
            // As in `tokenizers`, a pair listed twice keeps its later rank.
            merges.insert(
                pair_key(id_of(left)?, id_of(right)?),
                (u32::try_from(rank).ok()?, merged),
            );
        }
        let whole_pieces = if model["ignore_merges"].as_bool().unwrap_or(false) {
            let mut pieces = HashMap::with_capacity(vocab.len());
            for (entry, id) in vocab {
                // Entries outside the byte alphabet can never be a piece.
                if let (Some(bytes), Some(id)) = (byte_level::token_bytes(entry), id.as_u64()) {
                    pieces.insert(bytes.into_boxed_slice(), u32::try_from(id).ok()?);
                }
            }
            Some(pieces)
        } else {
            None
        };
        let encoder = Self {
            split,
            byte_ids,
            merges,
            whole_pieces,
            ascii_only,
        };
        if let Some(probe) = encoder.first_disagreement(tokenizer) {
            tracing::warn!(
                ?probe,
                "the direct byte-level BPE encoder disagrees with the tokenizer; not using it"
            );
            return None;
        }
        Some(encoder)
    }

    /// The first probe text this encoder tokenizes differently from
    /// `tokenizer`, if any.
    fn first_disagreement(&self, tokenizer: &tokenizers::Tokenizer) -> Option<String> {
        probe_texts().into_iter().find(|probe| {
            let expected = tokenizer
                .encode_fast(probe.as_str(), false)
                .ok()
                .map(|encoding| encoding.get_ids().to_vec());
            let mut ids = Vec::new();
            let direct = self.encode(probe, &mut ids).then_some(ids);
            // Text the encoder declines (non-ASCII under NFC) is no verdict.
            direct.is_some() && direct != expected
        })
    }

    /// Appends the ids of `text` (which holds no added tokens) and returns
    /// true, or returns false, appending nothing, when this encoder does
    /// not take `text` (non-ASCII text under an NFC normalizer).
    pub(super) fn encode(&self, text: &str, ids: &mut Vec<u32>) -> bool {
        if self.ascii_only && !text.is_ascii() {
            return false;
        }
        let bytes = text.as_bytes();
        let mut scratch = Scratch::default();
        let mut start = 0;
        self.split.for_each_match(text, |match_start, match_end| {
            // Text between matches is a piece of its own too (isolated).
            self.encode_piece(&bytes[start..match_start], ids, &mut scratch);
            self.encode_piece(&bytes[match_start..match_end], ids, &mut scratch);
            start = match_end;
        });
        self.encode_piece(&bytes[start..], ids, &mut scratch);
        true
    }

    fn encode_piece(&self, piece: &[u8], ids: &mut Vec<u32>, scratch: &mut Scratch) {
        match piece {
            [] => return,
            [byte] => return ids.push(self.byte_ids[usize::from(*byte)]),
            _ => {}
        }
        if let Some(id) = self
            .whole_pieces
            .as_ref()
            .and_then(|pieces| pieces.get(piece))
        {
            return ids.push(*id);
        }
        if piece.len() <= SHORT_PIECE {
            return self.merge_short(piece, ids);
        }
        let Scratch { symbols, queue } = scratch;
        symbols.clear();
        queue.clear();
        let last = piece.len() - 1;
        for (index, byte) in piece.iter().enumerate() {
            // `piece.len()` fits u32: pieces come from a request body.
            let position = index as u32;
            symbols.push(Symbol {
                id: self.byte_ids[usize::from(*byte)],
                prev: if index == 0 { NONE } else { position - 1 },
                next: if index == last { NONE } else { position + 1 },
                live: true,
            });
        }
        for (index, window) in symbols.windows(2).enumerate() {
            if let Some(&(rank, merged)) = self.merges.get(&pair_key(window[0].id, window[1].id)) {
                queue.push(Reverse((rank, index as u32, merged)));
            }
        }
        while let Some(Reverse((_, position, merged))) = queue.pop() {
            let left = symbols[position as usize];
            if !left.live || left.next == NONE {
                continue;
            }
            let right = symbols[left.next as usize];
            // An entry whose pair has changed since it was queued is stale.
            match self.merges.get(&pair_key(left.id, right.id)) {
                Some(&(_, current)) if current == merged => {}
                _ => continue,
            }
            symbols[left.next as usize].live = false;
            symbols[position as usize].id = merged;
            symbols[position as usize].next = right.next;
            if right.next != NONE {
                symbols[right.next as usize].prev = position;
            }
            if left.prev != NONE {
                let before = symbols[left.prev as usize].id;
                if let Some(&(rank, joined)) = self.merges.get(&pair_key(before, merged)) {
                    queue.push(Reverse((rank, left.prev, joined)));
                }
            }
            if right.next != NONE {
                let after = symbols[right.next as usize].id;
                if let Some(&(rank, joined)) = self.merges.get(&pair_key(merged, after)) {
                    queue.push(Reverse((rank, position, joined)));
                }
            }
        }
        let mut position = 0;
        while position != NONE {
            let symbol = symbols[position as usize];
            ids.push(symbol.id);
            position = symbol.next;
        }
    }
}

impl ByteLevelBpe {
    fn rank_of(&self, left: u32, right: u32) -> (u32, u32) {
        self.merges
            .get(&pair_key(left, right))
            .copied()
            .unwrap_or(NO_MERGE)
    }

    /// The same merge rule as the queue (lowest rank, leftmost on ties) for
    /// a piece of at most [`SHORT_PIECE`] bytes: each step scans the pairs'
    /// ranks, and only the two pairs next to a merge are looked up again.
    fn merge_short(&self, piece: &[u8], ids: &mut Vec<u32>) {
        let mut symbols = [0u32; SHORT_PIECE];
        let mut len = piece.len();
        for (slot, byte) in symbols.iter_mut().zip(piece) {
            *slot = self.byte_ids[usize::from(*byte)];
        }
        // `pairs[i]`: (rank, merged id) of `symbols[i]` and `symbols[i + 1]`.
        let mut pairs = [NO_MERGE; SHORT_PIECE];
        for i in 0..len - 1 {
            pairs[i] = self.rank_of(symbols[i], symbols[i + 1]);
        }
        loop {
            let mut best = None;
            let mut best_rank = NO_MERGE.0;
            for (i, &(rank, _)) in pairs[..len - 1].iter().enumerate() {
                if rank < best_rank {
                    best_rank = rank;
                    best = Some(i);
                }
            }
            let Some(i) = best else { break };
            symbols[i] = pairs[i].1;
            symbols.copy_within(i + 2..len, i + 1);
            if i + 2 < len {
                pairs.copy_within(i + 2..len - 1, i + 1);
            }
            len -= 1;
            if i > 0 {
                pairs[i - 1] = self.rank_of(symbols[i - 1], symbols[i]);
            }
            if i + 1 < len {
                pairs[i] = self.rank_of(symbols[i], symbols[i + 1]);
            }
        }
        ids.extend_from_slice(&symbols[..len]);
    }
}

/// The split regex of a supported pre-tokenizer configuration.
fn split_pattern(pre_tokenizer: &Value) -> Option<&str> {
    let byte_level = |config: &Value, use_regex: bool| {
        config["type"] == "ByteLevel"
            && config["add_prefix_space"] == false
            && config["use_regex"].as_bool().unwrap_or(true) == use_regex
    };
    if byte_level(pre_tokenizer, true) {
        return Some(GPT2_SPLIT);
    }
    match pre_tokenizer["pretokenizers"].as_array()?.as_slice() {
        [split, last]
            if split["type"] == "Split"
                && split["behavior"] == "Isolated"
                && split["invert"] == false
                && byte_level(last, false) =>
        {
            split["pattern"]["Regex"].as_str()
        }
        _ => None,
    }
}

/// A merge as serialized: `["a", "b"]`, or the older `"a b"`.
fn merge_pair(merge: &Value) -> Option<(&str, &str)> {
    match merge {
        Value::Array(pair) => match pair.as_slice() {
            [left, right] => Some((left.as_str()?, right.as_str()?)),
            _ => None,
        },
        Value::String(joined) => joined.split_once(' '),
        _ => None,
    }
}

/// Texts that exercise every branch of the usual split regexes and the
/// merges: contractions, letters, digit runs, punctuation, whitespace runs
/// before words and at the end, line breaks, and multi-byte characters.
fn probe_texts() -> Vec<String> {
    [
        "Hello world",
        "The quick brown fox jumps over the lazy dog.",
        " leading space and trailing space ",
        "I'm sure they'll say it's what we'd've done; DON'T SHOUT'S",
        "digits 1 12 123 1234 12345 3.14159 -42 1,000,000",
        "tabs\tand\t\tnew\nlines\n\n\r\n  indented\n    code();\n",
        "    many     spaces     ",
        "punctuation!!! ... ?? (brackets) [x] {y} <z> \"quotes\" 'single'",
        "email@example.com https://example.com/a_b-c?d=e&f=g#h",
        "naïve café déjà vu Ünïcödé",
        "日本語のテキスト 中文 한국어",
        "emoji 🙂👍🏽 👨‍👩‍👧 flags 🇫🇷",
        "combining e\u{301} a\u{300}\u{302} and zero\u{200b}width",
        "mixed123abc ABC123 a1b2c3 __init__ snake_case CamelCase",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "\n",
        " ",
        "",
    ]
    .iter()
    .map(|text| (*text).to_owned())
    .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn fixture_json() -> Value {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/model/tokenizer.json");
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    fn load(json: &Value) -> tokenizers::Tokenizer {
        tokenizers::Tokenizer::from_bytes(json.to_string()).unwrap()
    }

    /// The fixture's vocabulary and merges behind a Qwen2-style pipeline:
    /// NFC, a `Split` on Qwen2's regex, then `ByteLevel` without a regex.
    fn qwen2_style() -> Value {
        let mut json = fixture_json();
        json["normalizer"] = serde_json::json!({"type": "NFC"});
        json["pre_tokenizer"] = serde_json::json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex":
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"},
             "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
        ]});
        json
    }

    /// A piece the merges never build, added to the vocabulary on its own.
    const UNMERGED_ENTRY: &str = "zzqzz";
    const UNMERGED_ID: u32 = 4007;

    /// Llama-3 style: no normalizer, digits in runs of up to three, and
    /// `ignore_merges` (with a vocabulary entry only it can produce).
    fn llama3_style() -> Value {
        let mut json = qwen2_style();
        json["model"]["vocab"][UNMERGED_ENTRY] = Value::from(UNMERGED_ID);
        json["normalizer"] = Value::Null;
        json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = Value::from(
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        );
        json["model"]["ignore_merges"] = Value::from(true);
        json
    }

    fn reference(tokenizer: &tokenizers::Tokenizer, text: &str) -> Vec<u32> {
        tokenizer
            .encode_fast(text, false)
            .unwrap()
            .get_ids()
            .to_vec()
    }

    fn direct(encoder: &ByteLevelBpe, text: &str) -> Option<Vec<u32>> {
        let mut ids = Vec::new();
        encoder.encode(text, &mut ids).then_some(ids)
    }

    /// Random texts from fragments chosen to hit regex and merge edges;
    /// the ASCII ones only when `ascii`.
    fn random_texts(seed: u64, count: usize, ascii: bool) -> Vec<String> {
        let fragments = [
            "a", "e", "the", " the", "The", "THE", "ing", "er", " ", "  ", "   ", "\t", "\n",
            "\r\n", "\n\n", " \n", "0", "7", "123", "4567", ".", ",", "!", "?", "...", "'", "'s",
            "'S", "'ll", "'re", "'ve", "'d", "'m", "'t", "\"", "(", ")", "-", "_", "/", "\\", "#",
            "@", "é", "É", "ß", "日本", "語", "🙂", "👍🏽", "\u{301}", "\u{200b}", "\u{a0}", "ﬁ",
            "Ω", "ℌ", "①", "²", "١٢٣", "hello", "world", "token", "izer", "Hello", "zzqzz",
        ];
        let fragments: Vec<&str> = fragments
            .into_iter()
            .filter(|fragment| !ascii || fragment.is_ascii())
            .collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..count)
            .map(|_| {
                (0..rng.random_range(0..24))
                    .map(|_| fragments[rng.random_range(0..fragments.len())])
                    .collect()
            })
            .collect()
    }

    fn assert_agrees(json: &Value) -> ByteLevelBpe {
        let tokenizer = load(json);
        let encoder = ByteLevelBpe::for_tokenizer(&tokenizer).expect("a supported shape");
        let mut checked = 0;
        // Pieces longer than SHORT_PIECE take the queue.
        let long_runs = [
            "x".repeat(3000),
            " ".repeat(700),
            "12".repeat(500),
            "internationalization".repeat(3),
            format!("{} and {}", "tokenizer".repeat(4), "é".repeat(20)),
        ];
        let texts = [random_texts(11, 2000, false), random_texts(12, 1000, true)].concat();
        for text in texts.iter().chain(&probe_texts()).chain(&long_runs) {
            if let Some(ids) = direct(&encoder, text) {
                assert_eq!(ids, reference(&tokenizer, text), "{text:?}");
                checked += 1;
            } else {
                assert!(encoder.ascii_only && !text.is_ascii(), "{text:?} declined");
            }
        }
        assert!(checked > 1000, "only {checked} texts compared");
        encoder
    }

    #[test]
    fn gpt2_byte_level_fixture_matches_the_tokenizer() {
        let encoder = assert_agrees(&fixture_json());
        assert!(!encoder.ascii_only && encoder.whole_pieces.is_none());
    }

    #[test]
    fn qwen2_style_split_with_nfc_matches_on_ascii_and_declines_the_rest() {
        let encoder = assert_agrees(&qwen2_style());
        assert!(encoder.ascii_only);
        assert_eq!(direct(&encoder, "café"), None);
        assert!(direct(&encoder, "cafe").is_some());
    }

    #[test]
    fn llama3_style_ignore_merges_matches_the_tokenizer() {
        let encoder = assert_agrees(&llama3_style());
        assert!(encoder.whole_pieces.is_some());
    }

    #[test]
    fn ignore_merges_takes_a_whole_vocabulary_entry() {
        let json = llama3_style();
        let mut without = json.clone();
        without["model"]["ignore_merges"] = Value::from(false);
        let (with, without) = (load(&json), load(&without));
        let encoder = ByteLevelBpe::for_tokenizer(&with).unwrap();
        assert_eq!(reference(&with, UNMERGED_ENTRY), [UNMERGED_ID]);
        assert_ne!(reference(&without, UNMERGED_ENTRY), [UNMERGED_ID]);
        for text in [UNMERGED_ENTRY, "a zzqzz b", "zzqzzz", " zzqzz"] {
            assert_eq!(
                direct(&encoder, text).unwrap(),
                reference(&with, text),
                "{text:?}"
            );
        }
    }

    #[test]
    fn unsupported_shapes_are_declined() {
        let mut lowercase = fixture_json();
        lowercase["normalizer"] = serde_json::json!({"type": "Lowercase"});
        let mut prefix_space = fixture_json();
        prefix_space["pre_tokenizer"]["add_prefix_space"] = Value::from(true);
        let mut dropout = fixture_json();
        dropout["model"]["dropout"] = Value::from(0.5);
        let mut whitespace = fixture_json();
        whitespace["pre_tokenizer"] = serde_json::json!({"type": "Whitespace"});
        for json in [lowercase, prefix_space, dropout, whitespace] {
            assert!(
                ByteLevelBpe::for_tokenizer(&load(&json)).is_none(),
                "{}",
                json["normalizer"]
            );
        }
    }

    #[test]
    fn the_load_time_probes_catch_a_wrong_encoder() {
        let tokenizer = load(&fixture_json());
        let mut encoder = ByteLevelBpe::for_tokenizer(&tokenizer).unwrap();
        assert_eq!(encoder.first_disagreement(&tokenizer), None);
        // Reversed merge priorities: what a misread merges list would give.
        for (rank, _) in encoder.merges.values_mut() {
            *rank = u32::MAX - *rank;
        }
        assert!(encoder.first_disagreement(&tokenizer).is_some());
        // GPT-2's split without `\s+(?!\S)`: a run of spaces before a
        // word would no longer leave its last space to the word.
        let mut encoder = ByteLevelBpe::for_tokenizer(&tokenizer).unwrap();
        encoder.split =
            Split::new(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+")
                .unwrap();
        assert!(encoder.first_disagreement(&tokenizer).is_some());
    }

    #[test]
    fn short_pieces_merge_like_the_tokenizer() {
        let tokenizer = load(&fixture_json());
        let encoder = ByteLevelBpe::for_tokenizer(&tokenizer).unwrap();
        let words = [
            "internationalization",
            "tokenizer",
            "aaaa",
            "ing",
            "é",
            " the",
            "er",
        ];
        for len in (2..8).chain(SHORT_PIECE - 3..=SHORT_PIECE) {
            for word in words {
                let piece: String = word.chars().cycle().take(len).collect();
                if piece.len() > SHORT_PIECE {
                    continue;
                }
                let mut short = Vec::new();
                encoder.merge_short(piece.as_bytes(), &mut short);
                assert_eq!(short, reference(&tokenizer, &piece), "{piece:?}");
            }
        }
    }

    #[test]
    fn merges_take_the_leftmost_pair_on_ties() {
        let tokenizer = load(&fixture_json());
        let encoder = ByteLevelBpe::for_tokenizer(&tokenizer).unwrap();
        for run in 1..40 {
            for letter in ["a", "e", "l", " ", "0", "\n"] {
                let text = letter.repeat(run);
                assert_eq!(
                    direct(&encoder, &text).unwrap(),
                    reference(&tokenizer, &text)
                );
            }
        }
    }
}
