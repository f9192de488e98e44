//! A message header (`assistant to=functions.f<|channel|>commentary
//! <|constrain|>json`) read into the two facts that decide where its body
//! goes: the channel and the recipient.
//!
//! gpt-oss writes the recipient either before the channel
//! (`assistant to=functions.f<|channel|>commentary json`) or after it
//! (`<|channel|>commentary to=functions.f <|constrain|>json`), and the content
//! type with or without `<|constrain|>`; the reader therefore takes the first
//! `to=` word anywhere and the first word after `<|channel|>`, and ignores
//! the role and the content type, which change nothing for a client.

use super::markers::{Found, Marker, scan};

/// What a header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Header<'a> {
    /// The word after `<|channel|>`, if any.
    pub(crate) channel: Option<&'a str>,
    /// The text after `to=`, if any.
    pub(crate) recipient: Option<&'a str>,
}

/// Reads `text`, a header without its `<|start|>` and `<|message|>` (it may
/// contain `<|channel|>` and `<|constrain|>`).
pub(crate) fn read(text: &str) -> Header<'_> {
    let mut header = Header::default();
    let mut segment_start = 0;
    let mut after: Option<Marker> = None;
    loop {
        let (end, next) = match scan(text, segment_start, true) {
            Found::Marker(at, marker) => (at, Some(marker)),
            Found::Partial(_) | Found::Nothing => (text.len(), None),
        };
        let mut first_word = true;
        for word in text[segment_start..end].split_whitespace() {
            if let Some(recipient) = word.strip_prefix("to=") {
                header.recipient.get_or_insert(recipient);
                continue;
            }
            if first_word && after == Some(Marker::Channel) {
                header.channel.get_or_insert(word);
            }
            first_word = false;
        }
        match next {
            Some(marker) => {
                after = Some(marker);
                segment_start = end + marker.len();
            }
            None => return header,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(text: &str) -> (Option<&str>, Option<&str>) {
        let header = read(text);
        (header.channel, header.recipient)
    }

    #[test]
    fn reads_the_channel_and_the_recipient_in_either_order() {
        assert_eq!(of("<|channel|>analysis"), (Some("analysis"), None));
        assert_eq!(of("assistant<|channel|>final"), (Some("final"), None));
        assert_eq!(
            of("<|channel|>commentary to=functions.get_weather <|constrain|>json"),
            (Some("commentary"), Some("functions.get_weather"))
        );
        assert_eq!(
            of("assistant to=functions.get_weather<|channel|>commentary json"),
            (Some("commentary"), Some("functions.get_weather"))
        );
        assert_eq!(
            of(" to=browser.search<|channel|>analysis"),
            (Some("analysis"), Some("browser.search"))
        );
        assert_eq!(of("assistant"), (None, None));
        assert_eq!(of("<|channel|><|constrain|>json"), (None, None));
    }
}
