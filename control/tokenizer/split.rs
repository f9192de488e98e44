//! The pre-tokenizer's regex split, on the `regex` crate's automata for
//! ASCII text where it gives the same pieces as `tokenizers`' Oniguruma.
//!
//! Why: Oniguruma is a backtracking engine, and every match sets up and
//! copies its match stack; on a short chat prompt the split cost about a
//! seventh of the gateway's instructions for the whole request (callgrind,
//! BENCHMARKS.md, issue 13). The `regex` crate matches these patterns with
//! a lazy DFA and no per-match setup.
//!
//! The patterns byte-level tokenizers ship (GPT-2's, and the Llama 3 /
//! Qwen2 family's) end in `\s+(?!\S)|\s+`: a run of whitespace gives its
//! last character to the word after it. The `regex` crate has no
//! look-around, so [`Split`] matches `\s+` in that place and then applies
//! the look-ahead itself: a whitespace match made by that last alternative
//! (no earlier alternative matches where it starts), two characters or
//! longer and followed by a non-whitespace character, ends one character
//! earlier. That is exactly what backtracking into `\s+(?!\S)` finds. For
//! patterns without that tail, or with any other look-around, or that the
//! `regex` crate does not compile, Oniguruma does all the work.
//!
//! Only ASCII text takes the fast path: on ASCII, `\s`, `\p{L}` and `\p{N}`
//! mean the same in both engines, while outside it their Unicode tables
//! may differ by version. The byte-level encoder also checks probe texts
//! against `tokenizers` at load time (`ByteLevelBpe::first_disagreement`).

use regex::Regex;
use tokenizers::utils::SysRegex;

/// The tail the fast path replaces: the look-ahead alternative and its
/// fallback.
const WHITESPACE_TAIL: &str = r"|\s+(?!\S)|\s+";

/// A compiled split pattern.
pub(super) struct Split {
    onig: SysRegex,
    fast: Option<Fast>,
}

/// The pattern on the `regex` crate: all of it with `\s+` for the tail,
/// unanchored and anchored, and the alternatives before the tail alone,
/// anchored.
struct Fast {
    whole: Regex,
    /// `whole` anchored where the last match ended: pieces usually follow
    /// each other, and an anchored search runs forward only (an
    /// unanchored one also runs backward to find where its match began).
    next: Regex,
    head: Regex,
}

impl Split {
    /// Compiles `pattern` for Oniguruma and, when its shape allows, for
    /// the fast path; `None` if Oniguruma refuses it.
    pub(super) fn new(pattern: &str) -> Option<Self> {
        let onig = SysRegex::new(pattern).ok()?;
        Some(Self {
            onig,
            fast: Fast::new(pattern),
        })
    }

    /// Whether ASCII text takes the fast path.
    #[cfg(test)]
    pub(super) fn is_fast(&self) -> bool {
        self.fast.is_some()
    }

    /// Calls `each` with the byte range of every match in `text`, in order.
    pub(super) fn for_each_match(&self, text: &str, mut each: impl FnMut(usize, usize)) {
        match &self.fast {
            Some(fast) if text.is_ascii() => fast.for_each_match(text, each),
            _ => {
                for (start, end) in self.onig.find_iter(text) {
                    each(start, end);
                }
            }
        }
    }

    /// Oniguruma's matches, for tests that compare the two paths.
    #[cfg(test)]
    pub(super) fn onig_matches(&self, text: &str) -> Vec<(usize, usize)> {
        self.onig.find_iter(text).collect()
    }
}

impl Fast {
    fn new(pattern: &str) -> Option<Self> {
        let head = pattern.strip_suffix(WHITESPACE_TAIL)?;
        // Any other look-around (or a construct the `regex` crate lacks)
        // keeps the pattern on Oniguruma; so does a word boundary, which
        // the anchored head below could not see the context of.
        if head.contains("(?=")
            || head.contains("(?!")
            || head.contains("(?<")
            || head.contains(r"\b")
            || head.contains(r"\B")
            || head.contains(r"\G")
        {
            return None;
        }
        Some(Self {
            whole: Regex::new(&format!(r"{head}|\s+")).ok()?,
            next: Regex::new(&format!(r"^(?:{head}|\s+)")).ok()?,
            head: Regex::new(&format!(r"^(?:{head})")).ok()?,
        })
    }

    fn for_each_match(&self, text: &str, mut each: impl FnMut(usize, usize)) {
        let bytes = text.as_bytes();
        let mut at = 0;
        while at <= text.len() {
            let found = match self.next.find(&text[at..]) {
                Some(next) => Some((at, at + next.end())),
                None => self
                    .whole
                    .find_at(text, at)
                    .map(|found| (found.start(), found.end())),
            };
            let Some((start, mut end)) = found else {
                return;
            };
            // ASCII text: every character is one byte, and ASCII
            // whitespace is what `\s` matches in it.
            let whitespace = bytes[start..end].iter().all(|&byte| is_space(byte));
            if whitespace
                && end - start >= 2
                && bytes.get(end).is_some_and(|&next| !is_space(next))
                && !self.head.is_match(&text[start..])
            {
                end -= 1;
            }
            each(start, end);
            // No alternative matches empty text, but never loop on one.
            at = if end > start { end } else { end + 1 };
        }
    }
}

/// `\s` on ASCII: space, `\t`, `\n`, vertical tab, form feed, `\r`
/// (`u8::is_ascii_whitespace` leaves out the vertical tab).
fn is_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// GPT-2's split, as `ByteLevel` applies it.
    const GPT2: &str =
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
    /// The Llama 3 / Qwen2 family's split.
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

    fn fast_matches(split: &Split, text: &str) -> Vec<(usize, usize)> {
        let mut matches = Vec::new();
        split.for_each_match(text, |start, end| matches.push((start, end)));
        matches
    }

    /// A deterministic generator (xorshift), so failures reproduce.
    struct Texts(u64);

    impl Texts {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        /// Up to 40 characters drawn mostly from the classes the
        /// patterns tell apart: letters, digits, punctuation, the six
        /// whitespace characters, apostrophe contractions.
        fn text(&mut self) -> String {
            const PIECES: &[&str] = &[
                "a", "Z", "q", "7", "0", "42", " ", " ", "  ", "\t", "\n", "\r", "\r\n", "\x0b",
                "\x0c", "\x1c", "\x1f", ".", ",", "!", "?", "-", "_", "'", "'s", "'T", "'re",
                "'LL", "'d", "(", "\"", "<|x|>", "\x01", "\x7f", "word", " word", "   x",
            ];
            let len = self.next() % 24;
            (0..len)
                .map(|_| PIECES[(self.next() % PIECES.len() as u64) as usize])
                .collect()
        }
    }

    #[test]
    fn the_family_patterns_take_the_fast_path_and_others_do_not() {
        assert!(Split::new(GPT2).unwrap().is_fast());
        assert!(Split::new(LLAMA3).unwrap().is_fast());
        // No whitespace tail, or look-around elsewhere: Oniguruma alone.
        assert!(!Split::new(r"\s+|\w+").unwrap().is_fast());
        assert!(!Split::new(r"a(?=b)|\s+(?!\S)|\s+").unwrap().is_fast());
        assert!(!Split::new(r"\bx|\s+(?!\S)|\s+").unwrap().is_fast());
    }

    #[test]
    fn ascii_text_splits_as_oniguruma_splits_it() {
        for pattern in [GPT2, LLAMA3] {
            let split = Split::new(pattern).unwrap();
            let mut texts = Texts(0x9e37_79b9_7f4a_7c15);
            for _ in 0..20_000 {
                let text = texts.text();
                assert_eq!(
                    fast_matches(&split, &text),
                    split.onig_matches(&text),
                    "{pattern} on {text:?}"
                );
            }
        }
    }

    #[test]
    fn the_look_ahead_leaves_the_last_space_to_the_next_word() {
        let split = Split::new(GPT2).unwrap();
        let pieces = |text: &str| -> Vec<String> {
            fast_matches(&split, text)
                .into_iter()
                .map(|(start, end)| text[start..end].to_string())
                .collect()
        };
        assert_eq!(pieces("a   b"), ["a", "  ", " b"]);
        assert_eq!(pieces("a \n b"), ["a", " \n", " b"]);
        assert_eq!(pieces("a\nb"), ["a", "\n", "b"]);
        assert_eq!(pieces("a   "), ["a", "   "]);
    }

    #[test]
    fn text_outside_ascii_goes_to_oniguruma() {
        let split = Split::new(GPT2).unwrap();
        let text = "caf\u{e9}  \u{3000}na\u{ef}ve \u{0661}\u{0662}";
        assert_eq!(fast_matches(&split, text), split.onig_matches(text));
    }
}
