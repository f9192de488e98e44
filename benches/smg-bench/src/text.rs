//! Prompt text and token counting.
//!
//! Token counts come from the server's `usage` whenever it sends one; this
//! module is the fallback. With `--tokenizer` it uses the real Hugging Face
//! tokenizer; without one it uses a documented approximation: **one token per
//! 4 bytes of UTF-8, rounded up** (the usual rule of thumb for English BPE
//! vocabularies). Random prompts are built from short common words so that the
//! approximation and real tokenizers agree to within a few tens of percent; with
//! a tokenizer, prompts are trimmed to the exact requested token count.

use std::path::Path;

use rand::Rng;
use tokenizers::Tokenizer;

use crate::error::{SetupError, SetupResult};

/// Counts tokens of text the server did not count for us.
#[derive(Debug)]
pub enum TokenCounter {
    Tokenizer(Box<Tokenizer>),
    /// `ceil(bytes / 4)`.
    Approximate,
}

/// Bytes per token in the approximation.
pub const APPROX_BYTES_PER_TOKEN: usize = 4;

impl TokenCounter {
    /// Loads `tokenizer.json` (or `DIR/tokenizer.json`) when a path is given.
    pub fn load(path: Option<&Path>) -> SetupResult<Self> {
        let Some(path) = path else {
            return Ok(TokenCounter::Approximate);
        };
        let file = if path.is_dir() {
            path.join("tokenizer.json")
        } else {
            path.to_path_buf()
        };
        Tokenizer::from_file(&file)
            .map(|t| TokenCounter::Tokenizer(Box::new(t)))
            .map_err(|e| {
                SetupError::InvalidTokenizer(format!(
                    "cannot load tokenizer {}: {e}",
                    file.display()
                ))
            })
    }

    pub fn count(&self, text: &str) -> usize {
        match self {
            TokenCounter::Tokenizer(t) => t
                .encode_fast(text, false)
                .map(|e| e.len())
                .unwrap_or_else(|_| approximate_tokens(text)),
            TokenCounter::Approximate => approximate_tokens(text),
        }
    }

    pub fn is_exact(&self) -> bool {
        matches!(self, TokenCounter::Tokenizer(_))
    }

    /// Random text of `tokens` tokens (exactly, with a tokenizer).
    pub fn random_text(&self, rng: &mut impl Rng, tokens: usize) -> String {
        match self {
            TokenCounter::Approximate => random_words(rng, tokens * APPROX_BYTES_PER_TOKEN),
            TokenCounter::Tokenizer(t) => {
                // Words average close to one token each; grow until long enough,
                // then cut the ids to the exact count and decode.
                let mut budget = tokens * APPROX_BYTES_PER_TOKEN;
                for _ in 0..8 {
                    let text = random_words(rng, budget);
                    let Ok(encoding) = t.encode_fast(text.as_str(), false) else {
                        return text;
                    };
                    let ids = encoding.get_ids();
                    if ids.len() >= tokens {
                        return t
                            .decode(&ids[..tokens], false)
                            .unwrap_or_else(|_| text.clone());
                    }
                    budget = budget * 2 + APPROX_BYTES_PER_TOKEN;
                }
                random_words(rng, budget)
            }
        }
    }
}

pub fn approximate_tokens(text: &str) -> usize {
    text.len().div_ceil(APPROX_BYTES_PER_TOKEN)
}

/// Short common words; with a following space they average ~4 bytes.
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are",
    "as", "with", "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by",
    "word", "but", "not", "what", "all", "were", "we", "when", "your", "can", "said", "there",
    "use", "an", "each", "which", "she", "do", "how", "their", "if", "will", "up", "other",
    "about", "out", "many", "then", "them", "these", "so", "some", "her", "would", "make", "like",
    "him", "into", "time", "has", "look", "two", "more", "write", "go", "see", "number", "no",
    "way", "could", "people", "my", "than", "first", "water", "been", "call", "who", "oil", "its",
    "now", "find", "long", "down", "day", "did", "get", "come", "made", "may", "part", "sun",
    "red", "map", "cat", "dog", "run", "sky", "sea", "box", "key", "ice", "art", "law", "car",
];

/// Random words joined by spaces, about `bytes` long (never empty).
pub fn random_words(rng: &mut impl Rng, bytes: usize) -> String {
    let mut out = String::with_capacity(bytes + 8);
    while out.len() < bytes.max(1) {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(WORDS[rng.random_range(0..WORDS.len())]);
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn approximation_is_four_bytes_per_token_rounded_up() {
        assert_eq!(approximate_tokens(""), 0);
        assert_eq!(approximate_tokens("abcd"), 1);
        assert_eq!(approximate_tokens("abcde"), 2);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let text = TokenCounter::Approximate.random_text(&mut rng, 100);
        let tokens = approximate_tokens(&text);
        assert!((100..=102).contains(&tokens), "{tokens}");
    }

    #[test]
    fn a_real_tokenizer_gives_exact_prompt_lengths() {
        let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/model");
        let counter = TokenCounter::load(Some(&model)).unwrap();
        assert!(counter.is_exact());
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for tokens in [1, 17, 300] {
            let text = counter.random_text(&mut rng, tokens);
            let counted = counter.count(&text);
            // Decoding a cut and re-encoding can merge a pair at the cut.
            assert!(counted.abs_diff(tokens) <= 1, "{tokens} -> {counted}");
        }
        let err = TokenCounter::load(Some(Path::new("/nonexistent/tokenizer.json"))).unwrap_err();
        assert_eq!(err.code(), "invalid_tokenizer");
    }
}
