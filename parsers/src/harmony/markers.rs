//! Harmony's structural tokens as they appear in decoded text, and the one
//! scanner every state of the parser uses to find them.
//!
//! Each marker is a single special token in gpt-oss's tokenizer, and the
//! gateway decodes with special tokens kept when it parses, so a marker in
//! the text is exactly that token: matching the text is equivalent to
//! matching token ids. Only a chunk-final *prefix* of a marker is ambiguous;
//! the scanner reports it so the caller can hold it back.

/// A structural token of the Harmony format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Marker {
    /// `<|start|>`: a message begins (its header follows).
    Start,
    /// `<|channel|>`: the channel name follows, inside a header.
    Channel,
    /// `<|constrain|>`: the content type follows (`json`), inside a header.
    Constrain,
    /// `<|message|>`: the header ends, the body begins.
    Message,
    /// `<|end|>`: a message ends; another may follow.
    End,
    /// `<|call|>`: a tool-call message ends (an EOS token).
    Call,
    /// `<|return|>`: the final message ends (an EOS token).
    Return,
}

impl Marker {
    pub(crate) const ALL: [Marker; 7] = [
        Marker::Start,
        Marker::Channel,
        Marker::Constrain,
        Marker::Message,
        Marker::End,
        Marker::Call,
        Marker::Return,
    ];

    pub(crate) const fn text(self) -> &'static str {
        match self {
            Marker::Start => "<|start|>",
            Marker::Channel => "<|channel|>",
            Marker::Constrain => "<|constrain|>",
            Marker::Message => "<|message|>",
            Marker::End => "<|end|>",
            Marker::Call => "<|call|>",
            Marker::Return => "<|return|>",
        }
    }

    pub(crate) const fn len(self) -> usize {
        self.text().len()
    }
}

/// Every marker's text, for tests and callers that check for leaks.
pub const MARKERS: [&str; 7] = [
    Marker::Start.text(),
    Marker::Channel.text(),
    Marker::Constrain.text(),
    Marker::Message.text(),
    Marker::End.text(),
    Marker::Call.text(),
    Marker::Return.text(),
];

/// What [`scan`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// A whole marker starts at this byte offset.
    Marker(usize, Marker),
    /// The text from this offset to its end is a proper prefix of a marker:
    /// the next chunk decides what it is.
    Partial(usize),
    /// No marker, whole or partial.
    Nothing,
}

/// The first marker in `text` at or after byte `from`. With `at_end`, the
/// text is complete and a trailing prefix is not a marker.
pub(crate) fn scan(text: &str, from: usize, at_end: bool) -> Found {
    let bytes = text.as_bytes();
    let mut at = from;
    while let Some(offset) = bytes.get(at..).and_then(find_open) {
        let start = at + offset;
        let rest = &text[start..];
        if let Some(marker) = Marker::ALL
            .into_iter()
            .find(|marker| rest.starts_with(marker.text()))
        {
            return Found::Marker(start, marker);
        }
        if !at_end
            && Marker::ALL
                .into_iter()
                .any(|marker| marker.text().starts_with(rest))
        {
            return Found::Partial(start);
        }
        at = start + 1;
    }
    Found::Nothing
}

/// The offset of the first `<` (every marker starts with one).
fn find_open(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|&b| b == b'<')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_whole_and_partial_markers() {
        assert_eq!(scan("ab<|end|>c", 0, false), Found::Marker(2, Marker::End));
        assert_eq!(scan("a < b <|en", 0, false), Found::Partial(6));
        assert_eq!(scan("a < b <|en", 0, true), Found::Nothing);
        assert_eq!(scan("x<", 0, false), Found::Partial(1));
        assert_eq!(
            scan("<|other|><|call|>", 0, false),
            Found::Marker(9, Marker::Call)
        );
        assert_eq!(scan("<|end|>", 1, false), Found::Nothing);
    }
}
