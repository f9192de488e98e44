//! The byte-level BPE alphabet: GPT-2-style vocabularies spell every byte
//! as one printable character, so a token's vocabulary entry maps back to
//! the exact bytes it stands for, even when they are half a UTF-8
//! character (which decoding a single token would turn into U+FFFD).
//!
//! The mapping: bytes `!..=~`, `¡..=¬` and `®..=ÿ` are the characters with
//! the same code point; the other 68 bytes, in increasing order, are the
//! characters from U+0100 on.

/// Whether `byte` is spelled as the character with its own code point.
fn spelled_as_itself(byte: u8) -> bool {
    matches!(byte, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// The byte a vocabulary character stands for, if it is in the alphabet.
fn byte_of(ch: char) -> Option<u8> {
    let code = u32::from(ch);
    if let Ok(byte) = u8::try_from(code) {
        return spelled_as_itself(byte).then_some(byte);
    }
    let rank = code.checked_sub(0x100)?;
    (0..=u8::MAX)
        .filter(|&byte| !spelled_as_itself(byte))
        .nth(usize::try_from(rank).ok()?)
}

/// The vocabulary character that spells `byte`.
pub(super) fn char_of(byte: u8) -> char {
    if spelled_as_itself(byte) {
        return char::from(byte);
    }
    let rank = (0..byte).filter(|&lower| !spelled_as_itself(lower)).count();
    // At most 68 bytes are not spelled as themselves: U+0100..=U+0143.
    char::from_u32(0x100 + rank as u32).unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// Characters from U+0000 to here may be in the alphabet (the last is
/// U+0143, byte 0xAD's).
const ALPHABET_END: usize = 0x144;

/// [`byte_of`] as a lookup table, for converting a whole vocabulary at once.
pub(super) struct Alphabet([Option<u8>; ALPHABET_END]);

impl Alphabet {
    pub(super) fn new() -> Self {
        let mut bytes = [None; ALPHABET_END];
        for byte in 0..=u8::MAX {
            if let Some(slot) = bytes.get_mut(char_of(byte) as usize) {
                *slot = Some(byte);
            }
        }
        Self(bytes)
    }

    /// The byte `ch` spells, if it is in the alphabet.
    pub(super) fn byte_of(&self, ch: char) -> Option<u8> {
        *self.0.get(ch as usize)?
    }
}

/// The bytes a byte-level vocabulary entry stands for, or `None` when the
/// entry has a character outside the alphabet (e.g. an added token).
pub(super) fn token_bytes(entry: &str) -> Option<Vec<u8>> {
    entry.chars().map(byte_of).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_alphabet_covers_every_byte_exactly_once() {
        let mut seen = std::collections::HashSet::new();
        for code in 0u32..0x200 {
            if let Some(byte) = char::from_u32(code).and_then(byte_of) {
                assert!(seen.insert(byte), "byte {byte} spelled twice");
            }
        }
        assert_eq!(seen.len(), 256);
        for byte in 0..=u8::MAX {
            assert_eq!(byte_of(char_of(byte)), Some(byte));
        }
        let alphabet = Alphabet::new();
        for code in 0u32..0x400 {
            let ch = char::from_u32(code).expect("a scalar value");
            assert_eq!(alphabet.byte_of(ch), byte_of(ch), "U+{code:04X}");
        }
    }

    #[test]
    fn known_spellings() {
        // 'Ġ' is the space, 'Ċ' the newline in GPT-2 vocabularies.
        assert_eq!(token_bytes("Ġhello"), Some(b" hello".to_vec()));
        assert_eq!(token_bytes("Ċ"), Some(b"\n".to_vec()));
        // "é" is C3 A9, spelled "Ã" (U+00C3) and "©" (U+00A9).
        assert_eq!(token_bytes("Ã©"), Some("é".as_bytes().to_vec()));
        // Half a character stays half a character.
        assert_eq!(token_bytes("Ã"), Some(vec![0xC3]));
        assert_eq!(token_bytes("日"), None);
    }
}
