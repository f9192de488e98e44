//! `Tokenizer::decode` for byte-level BPE tokenizers (GPT-2, Llama 3, Qwen,
//! DeepSeek), from a table built once at load.
//!
//! Why: Hugging Face `tokenizers` decodes by turning every id into a
//! `String`, then every character of it into a byte through a hash map,
//! which cost about 490 instructions per token and 30% of a chat request's
//! gateway work. With a decoder that is `ByteLevel` alone, the bytes a token
//! contributes never depend on its neighbours, so they are worked out once
//! per id here; decoding is then copying each id's bytes and one UTF-8
//! check. Every caller of `decode` (the incremental detokenizer,
//! `/v1/detokenize`, logprob text) gets it.
//!
//! The table reproduces what `tokenizers` 0.22 does, rule by rule
//! (`TokenizerImpl::decode`, then `ByteLevel::decode_chain`):
//! - an id's token is its added token's content if it has one, else its
//!   vocabulary entry; an id with neither (outside the vocabulary)
//!   contributes nothing and is no error;
//! - with `skip_special_tokens`, a token is dropped when its *text* is a
//!   special added token's content (`tokenizers` compares strings, not ids);
//! - a token whose characters are all in the byte-level alphabet becomes
//!   the bytes they spell; any other token (an added token such as
//!   `<｜tool▁calls▁begin｜>`, or one with a space) keeps its UTF-8 text;
//! - the bytes of all kept tokens are joined and converted to text as
//!   `String::from_utf8_lossy` does (one U+FFFD per invalid sequence, which
//!   may span tokens). `ByteLevel` has no clean-up step.
//!
//! Decoding never fails, as `tokenizers` never does on this shape. The
//! table is one byte arena and one offset per id (about 1.5 MB for a
//! 150k-token vocabulary), not an allocation per id.

use super::byte_level::Alphabet;

/// Ids beyond this many per actual token make the table refuse (sparse ids,
/// e.g. an added token with a huge id): such a tokenizer keeps the
/// `tokenizers` path rather than a mostly empty table.
const MAX_IDS_PER_TOKEN: usize = 2;
/// Slack for small vocabularies in the same check.
const ID_SLACK: usize = 4096;

/// The bytes every id decodes to, and which ids are special.
pub(super) struct ByteLevelTable {
    /// Every id's bytes, in id order.
    arena: Box<[u8]>,
    /// Id `i`'s bytes are `arena[offsets[i]..offsets[i + 1]]`; one more
    /// entry than ids.
    offsets: Box<[u32]>,
    /// Bit `i` set: id `i`'s token text is a special token's content.
    special: Box<[u64]>,
}

impl ByteLevelTable {
    /// The table for `tokenizer`, when its decoder is `ByteLevel` alone and
    /// its model BPE; `None` for any other shape (which keeps the
    /// `tokenizers` path).
    pub(super) fn build(tokenizer: &tokenizers::Tokenizer) -> Option<Self> {
        if !matches!(
            tokenizer.get_decoder(),
            Some(tokenizers::DecoderWrapper::ByteLevel(_))
        ) || !matches!(tokenizer.get_model(), tokenizers::ModelWrapper::BPE(_))
        {
            return None;
        }
        // A BPE model's id -> token map is built from its vocabulary, so no
        // id above these has a token.
        let added = tokenizer.get_added_tokens_decoder();
        let vocab = tokenizer.get_vocab(true);
        let max_id = vocab
            .values()
            .chain(added.keys())
            .copied()
            .max()
            .unwrap_or(0);
        let ids = usize::try_from(max_id).ok()?.checked_add(1)?;
        if ids > (vocab.len() + added.len()) * MAX_IDS_PER_TOKEN + ID_SLACK {
            tracing::debug!(ids, "sparse token ids: decoding through tokenizers");
            return None;
        }
        let alphabet = Alphabet::new();
        let added_vocabulary = tokenizer.get_added_vocabulary();
        let mut arena = Vec::new();
        let mut offsets = Vec::with_capacity(ids + 1);
        let mut special = vec![0u64; ids.div_ceil(64)];
        offsets.push(0u32);
        for id in 0..=max_id {
            if let Some(token) = tokenizer.id_to_token(id) {
                let start = arena.len();
                let spelled = token.chars().try_for_each(|ch| {
                    arena.push(alphabet.byte_of(ch)?);
                    Some(())
                });
                if spelled.is_none() {
                    arena.truncate(start);
                    arena.extend_from_slice(token.as_bytes());
                }
                if added_vocabulary.is_special_token(&token) {
                    let index = usize::try_from(id).ok()?;
                    special[index / 64] |= 1 << (index % 64);
                }
            }
            offsets.push(u32::try_from(arena.len()).ok()?);
        }
        Some(Self {
            arena: arena.into_boxed_slice(),
            offsets: offsets.into_boxed_slice(),
            special: special.into_boxed_slice(),
        })
    }

    /// The text of `ids`, exactly as `tokenizers` decodes it.
    pub(super) fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 8);
        for &id in ids {
            if skip_special_tokens && self.is_special(id) {
                continue;
            }
            bytes.extend_from_slice(self.bytes_of(id));
        }
        match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(invalid) => String::from_utf8_lossy(invalid.as_bytes()).into_owned(),
        }
    }

    /// The bytes `id` contributes; empty outside the vocabulary.
    fn bytes_of(&self, id: u32) -> &[u8] {
        let Ok(index) = usize::try_from(id) else {
            return &[];
        };
        let (Some(&start), Some(&end)) = (self.offsets.get(index), self.offsets.get(index + 1))
        else {
            return &[];
        };
        let range = start as usize..end as usize;
        self.arena.get(range).unwrap_or_default()
    }

    fn is_special(&self, id: u32) -> bool {
        let Ok(index) = usize::try_from(id) else {
            return false;
        };
        self.special
            .get(index / 64)
            .is_some_and(|word| word & (1 << (index % 64)) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::super::Tokenizer;
    use rand::{Rng, SeedableRng};
    use serde_json::{Value, json};
    use std::path::{Path, PathBuf};

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
    }

    /// The bundled test model and every family fixture.
    fn model_dirs() -> Vec<PathBuf> {
        let mut dirs = vec![fixtures().join("model")];
        let mut families: Vec<PathBuf> = std::fs::read_dir(fixtures().join("models"))
            .expect("the family fixtures")
            .map(|entry| entry.expect("a directory entry").path())
            .collect();
        families.sort();
        dirs.extend(families);
        dirs
    }

    /// The gateway's tokenizer and `tokenizers`' own, from one tokenizer.json.
    fn both_from(dir: &Path) -> (Tokenizer, tokenizers::Tokenizer) {
        let ours = Tokenizer::from_model_dir(dir).expect("the gateway's tokenizer loads");
        let theirs = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json"))
            .expect("tokenizers loads tokenizer.json");
        (ours, theirs)
    }

    /// A model directory holding only `tokenizer` as its tokenizer.json.
    fn dir_with(tokenizer: &Value) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(
            dir.path().join("tokenizer.json"),
            serde_json::to_vec(tokenizer).expect("serializes"),
        )
        .expect("writes");
        dir
    }

    fn tokenizer_json(dir: &Path) -> Value {
        let text = std::fs::read(dir.join("tokenizer.json")).expect("reads");
        serde_json::from_slice(&text).expect("tokenizer.json is JSON")
    }

    /// Ids to draw from: every id, added and special ones, ids whose bytes
    /// are part of a UTF-8 character, ids outside the vocabulary.
    struct Pools {
        all: Vec<u32>,
        added: Vec<u32>,
        partial: Vec<u32>,
        outside: Vec<u32>,
    }

    fn pools(ours: &Tokenizer, theirs: &tokenizers::Tokenizer) -> Pools {
        let size = u32::try_from(ours.vocab_size()).expect("fits");
        let added: Vec<u32> = theirs.get_added_tokens_decoder().into_keys().collect();
        let all: Vec<u32> = (0..size).chain(added.iter().copied()).collect();
        // What the vocabulary spells, whatever the decoder makes of it.
        let partial: Vec<u32> = all
            .iter()
            .copied()
            .filter(|&id| {
                theirs
                    .id_to_token(id)
                    .and_then(|token| super::super::byte_level::token_bytes(&token))
                    .is_some_and(|bytes| std::str::from_utf8(&bytes).is_err())
            })
            .collect();
        assert!(!partial.is_empty(), "some id is part of a character");
        assert!(!added.is_empty(), "some id is an added token");
        let max = all.iter().copied().max().unwrap_or(0);
        let outside = vec![max + 1, max + 2, max + 1000, u32::MAX - 1, u32::MAX];
        Pools {
            all,
            added,
            partial,
            outside,
        }
    }

    /// `sequences` random id sequences decode as `tokenizers` decodes
    /// them, both skip settings; returns how many were checked.
    fn check_random(
        ours: &Tokenizer,
        theirs: &tokenizers::Tokenizer,
        seed: u64,
        sequences: usize,
    ) -> usize {
        let pools = pools(ours, theirs);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut checked = 0;
        for _ in 0..sequences {
            let len = rng.random_range(0..48);
            let ids: Vec<u32> = (0..len)
                .map(|_| {
                    let pool = match rng.random_range(0..10) {
                        0..=3 => &pools.all,
                        4 | 5 => &pools.added,
                        6..=8 => &pools.partial,
                        _ => &pools.outside,
                    };
                    pool[rng.random_range(0..pool.len())]
                })
                .collect();
            for skip in [false, true] {
                let expected = theirs.decode(&ids, skip).expect("tokenizers decodes");
                let got = ours.decode(&ids, skip).expect("decodes");
                assert_eq!(got, expected, "ids {ids:?}, skip_special_tokens {skip}");
                checked += 1;
            }
        }
        checked
    }

    /// Every id alone and all ids in a row decode as `tokenizers` does.
    fn check_every_id(ours: &Tokenizer, theirs: &tokenizers::Tokenizer) {
        let pools = pools(ours, theirs);
        for skip in [false, true] {
            for &id in pools.all.iter().chain(&pools.outside) {
                assert_eq!(
                    ours.decode(&[id], skip).expect("decodes"),
                    theirs.decode(&[id], skip).expect("tokenizers decodes"),
                    "id {id}, skip_special_tokens {skip}"
                );
            }
            assert_eq!(
                ours.decode(&pools.all, skip).expect("decodes"),
                theirs.decode(&pools.all, skip).expect("tokenizers decodes"),
                "all ids, skip_special_tokens {skip}"
            );
        }
    }

    #[test]
    fn every_fixture_decodes_from_the_table_exactly_as_tokenizers_does() {
        let dirs = model_dirs();
        assert!(dirs.len() >= 10, "the bundled model and the families");
        for (seed, dir) in (0u64..).zip(&dirs) {
            let (ours, theirs) = both_from(dir);
            assert!(
                ours.loaded.byte_table.is_some(),
                "{} is byte-level BPE: the table path",
                dir.display()
            );
            check_every_id(&ours, &theirs);
            let checked = check_random(&ours, &theirs, seed, 2_000);
            assert_eq!(checked, 4_000, "{}", dir.display());
        }
    }

    #[test]
    fn added_tokens_follow_tokenizers_rules_not_the_vocabulary() {
        let mut json = tokenizer_json(&fixtures().join("model"));
        let vocab = json["model"]["vocab"]
            .as_object()
            .expect("a BPE vocabulary");
        let the = vocab["Ġthe"].clone();
        let added = json["added_tokens"].as_array_mut().expect("added tokens");
        // `tokenizers` gives a token already in the vocabulary that id, and
        // the others the next free ones, whatever `id` says.
        let token = |id: u32, content: &str, special: bool| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": special})
        };
        // Special by content although a vocabulary entry: its id is skipped.
        added.push(token(
            u32::try_from(the.as_u64().expect("an id")).expect("fits"),
            "Ġthe",
            true,
        ));
        // All in the alphabet: spelled as bytes, "é" alone being byte E9.
        added.push(token(4007, "café", false));
        // A lone byte C3 (half of "é") as an added token.
        added.push(token(4008, "Ã", false));
        // Outside the alphabet (a space, fullwidth bars): kept as UTF-8 text.
        added.push(token(4009, "<｜tool▁calls▁begin｜>", true));
        added.push(token(4010, " spaced\n", false));
        added.push(token(4011, "Ġnot special", false));
        let dir = dir_with(&json);
        let (ours, theirs) = both_from(dir.path());
        assert!(ours.loaded.byte_table.is_some());
        let the_id = ours.token_id("Ġthe").expect("Ġthe");
        assert_eq!(ours.decode(&[the_id], false).expect("decodes"), " the");
        assert_eq!(ours.decode(&[the_id], true).expect("decodes"), "");
        let id = |token: &str| ours.token_id(token).expect("an added token");
        assert_eq!(
            ours.decode(&[id("café")], false).expect("decodes"),
            "caf\u{FFFD}"
        );
        assert_eq!(
            ours.decode(&[id("<｜tool▁calls▁begin｜>"), id(" spaced\n")], false)
                .expect("decodes"),
            "<｜tool▁calls▁begin｜> spaced\n"
        );
        assert_eq!(
            ours.decode(&[id("Ġnot special"), id("Ã"), id("Ã")], false)
                .expect("decodes"),
            "Ġnot special\u{FFFD}\u{FFFD}"
        );
        check_every_id(&ours, &theirs);
        check_random(&ours, &theirs, 99, 2_000);
    }

    #[test]
    fn other_decoders_keep_the_tokenizers_path() {
        let byte_level = tokenizer_json(&fixtures().join("model"))["decoder"].clone();
        let decoders = [
            json!({"type": "Sequence", "decoders": [byte_level]}),
            json!({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true}),
            Value::Null,
        ];
        for (seed, decoder) in (0u64..).zip(decoders) {
            let mut json = tokenizer_json(&fixtures().join("model"));
            json["decoder"] = decoder.clone();
            let dir = dir_with(&json);
            let (ours, theirs) = both_from(dir.path());
            assert!(ours.loaded.byte_table.is_none(), "{decoder}");
            check_random(&ours, &theirs, seed, 300);
        }
    }

    #[test]
    fn sparse_ids_keep_the_tokenizers_path() {
        let mut json = tokenizer_json(&fixtures().join("model"));
        json["model"]["vocab"]
            .as_object_mut()
            .expect("a BPE vocabulary")
            .insert("Ġfaraway".to_owned(), json!(3_000_000));
        let dir = dir_with(&json);
        let (ours, theirs) = both_from(dir.path());
        assert_eq!(theirs.token_to_id("Ġfaraway"), Some(3_000_000));
        assert!(ours.loaded.byte_table.is_none());
        assert_eq!(
            ours.decode(&[3_000_000], false).expect("decodes"),
            " faraway"
        );
        check_random(&ours, &theirs, 7, 300);
    }
}
