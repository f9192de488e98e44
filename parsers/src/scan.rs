//! Finding markers in text: the one search the tool and reasoning parsers
//! use for the markup that frames calls, argument values and think blocks.
//!
//! Why it exists: on every chunk a parser looks for a few short markers in
//! text that mostly contains none of them. Searching for each marker
//! separately (`str::find` per marker, then every suffix for a partial
//! marker) costs a searcher set-up per marker and per chunk, whatever the
//! text. A marker can only start where one of the markers' first bytes is,
//! so one `memchr` pass over those bytes (up to three of them; a plain
//! byte loop beyond) finds every candidate, and only candidates are
//! compared.
//!
//! The answer is exactly that of the per-marker search it replaces: the
//! earliest complete marker (on a tie, the first in the list), else the
//! longest suffix of the text that is a proper prefix of a marker. Such a
//! suffix always starts on a character boundary: it starts with a marker's
//! first byte, which in UTF-8 is never a continuation byte.

/// Where the markers stand in a text ([`find`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// Marker `index` (of the list searched) starts at byte `at`, and no
    /// marker starts earlier.
    Marker { at: usize, index: usize },
    /// No complete marker; `text[at..]` is the longest suffix that is a
    /// proper prefix of a marker: more text will tell.
    Prefix { at: usize },
    /// No marker, not even the start of one.
    Nothing,
}

/// Finds the earliest of `markers` (non-empty strings) in `text`, or the
/// chunk-final start of one (see the module docs).
pub(crate) fn find(text: &str, markers: &[&str]) -> Found {
    let firsts = FirstBytes::of(markers);
    let bytes = text.as_bytes();
    let mut from = 0;
    let mut prefix = None;
    while let Some(offset) = firsts.position(&bytes[from..]) {
        let at = from + offset;
        let tail = &bytes[at..];
        if let Some(index) = markers
            .iter()
            .position(|m| !m.is_empty() && tail.starts_with(m.as_bytes()))
        {
            return Found::Marker { at, index };
        }
        // Only the last few bytes can start a proper prefix; the earliest
        // one is the longest. A complete marker further on still wins.
        if prefix.is_none()
            && markers
                .iter()
                .any(|m| m.len() > tail.len() && m.as_bytes().starts_with(tail))
        {
            prefix = Some(at);
        }
        from = at + 1;
    }
    prefix.map_or(Found::Nothing, |at| Found::Prefix { at })
}

/// The distinct first bytes of a list of markers: up to three are searched
/// with `memchr`; a longer list falls back to a byte loop over all of them.
struct FirstBytes<'a> {
    markers: &'a [&'a str],
    bytes: [u8; 3],
    count: usize,
    more: bool,
}

impl<'a> FirstBytes<'a> {
    fn of(markers: &'a [&'a str]) -> Self {
        let mut firsts = Self {
            markers,
            bytes: [0; 3],
            count: 0,
            more: false,
        };
        for &first in markers.iter().filter_map(|m| m.as_bytes().first()) {
            if firsts.bytes[..firsts.count].contains(&first) {
                continue;
            }
            if firsts.count == firsts.bytes.len() {
                firsts.more = true;
                break;
            }
            firsts.bytes[firsts.count] = first;
            firsts.count += 1;
        }
        firsts
    }

    /// The first position in `haystack` holding one of the bytes. A chunk
    /// of a few tokens is shorter than `memchr`'s vector set-up is worth:
    /// below [`SHORT`] bytes, a plain loop.
    fn position(&self, haystack: &[u8]) -> Option<usize> {
        if self.more || haystack.len() < SHORT {
            return haystack.iter().position(|&b| self.contains(b));
        }
        match self.bytes[..self.count] {
            [a] => memchr::memchr(a, haystack),
            [a, b] => memchr::memchr2(a, b, haystack),
            [a, b, c] => memchr::memchr3(a, b, c, haystack),
            _ => None,
        }
    }

    fn contains(&self, byte: u8) -> bool {
        if self.more {
            self.markers
                .iter()
                .any(|m| m.as_bytes().first() == Some(&byte))
        } else {
            self.bytes[..self.count].contains(&byte)
        }
    }
}

/// Haystacks shorter than this are searched with a plain loop.
const SHORT: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    /// The search this module replaces, kept as the reference: each
    /// marker's first occurrence, the earliest (then the first listed) wins;
    /// else the longest suffix on a char boundary that is a proper prefix.
    fn reference(text: &str, markers: &[&str]) -> Found {
        let found = markers
            .iter()
            .enumerate()
            .filter_map(|(n, m)| text.find(m).map(|at| (at, n)))
            .min();
        if let Some((at, index)) = found {
            return Found::Marker { at, index };
        }
        let longest = markers.iter().map(|m| m.len()).max().unwrap_or(0);
        let from = text.len().saturating_sub(longest.saturating_sub(1));
        (from..text.len())
            .filter(|&at| text.is_char_boundary(at))
            .find(|&at| {
                markers
                    .iter()
                    .any(|m| m.len() > text.len() - at && m.starts_with(&text[at..]))
            })
            .map_or(Found::Nothing, |at| Found::Prefix { at })
    }

    /// Marker lists the parsers use, plus lists with more than three first
    /// bytes and with markers that share a start.
    const MARKER_SETS: &[&[&str]] = &[
        &["<tool_call>"],
        &["{", "["],
        &["<|python_tag|>", "{"],
        &["[TOOL_CALLS]"],
        &[
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁call▁begin｜>",
            "<｜end▁of▁sentence｜>",
        ],
        &["<|tool_calls_section_begin|>", "<|tool_call_begin|>"],
        &["[", "<|python_start|>", "<|python_end|>"],
        &["</think>", "<tool_call>"],
        &["\u{25c1}/think\u{25b7}"],
        &["</parameter>", "</function>", "</tool_call>"],
        &["ab", "b", "x", "é", "{"],
        &["abc", "ab", "bc", "c"],
    ];

    /// The chunk-final partial marker's length, as the parsers hold it.
    fn held(text: &str, markers: &[&str]) -> usize {
        match find(text, markers) {
            Found::Prefix { at } => text.len() - at,
            Found::Marker { .. } | Found::Nothing => 0,
        }
    }

    #[test]
    fn a_partial_marker_is_held_on_a_char_boundary() {
        let markers = ["<tool_call>", "<｜tool▁calls▁begin｜>"];
        assert_eq!(held("hello <tool", &markers), 5);
        assert_eq!(held("hello <tool_call", &markers), 10);
        assert_eq!(held("hello", &markers), 0);
        assert_eq!(held("x<｜tool", &markers), "<｜tool".len());
        // A whole marker is not "partial".
        assert_eq!(held("<tool_call>", &["<tool_call>"]), 0);
    }

    #[test]
    fn the_memchr_search_answers_as_the_per_marker_search() {
        let texts = [
            "",
            "plain text without markers",
            "a < b and c > d, then <tool_call>{\"x\": 1}</tool_call>",
            "text then <tool_ca",
            "<",
            "</thi",
            "reasoning</think>\n\nanswer<tool_call>",
            "x<｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁calls▁begin｜>",
            "é\u{25c1}/th",
            "\u{25c1}/think\u{25b7} after",
            "value\n</parameter>\n<parameter=b>",
            "{[ [{ <|python_tag|>",
            "<|tool_call_begin|>functions.f:0<|tool_calls_section_begin|>",
            "zzabcab",
            "xab bc c",
            "ééé ab",
            "[TOOL_CALLS",
            "<|python_st",
            // Past the short-haystack loop: memchr finds the candidates.
            "a long run of plain text, well past sixteen bytes, then <tool_call> \
             and </think> and <｜tool▁call▁begin｜> ab bc [TOOL_CALLS] {x} <|python_end|>",
        ];
        for markers in MARKER_SETS {
            for text in texts {
                // Every prefix too: the chunk-final partial markers.
                for end in (0..=text.len()).filter(|&end| text.is_char_boundary(end)) {
                    let text = &text[..end];
                    assert_eq!(
                        find(text, markers),
                        reference(text, markers),
                        "{text:?} in {markers:?}"
                    );
                }
            }
        }
    }
}
