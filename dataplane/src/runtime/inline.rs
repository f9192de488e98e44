//! Decoding inline media on a core: the per-byte half of a `data:` URL or a
//! bare base64 image.
//!
//! Why it exists: a 32 MiB image arrives as a 43 MiB base64 string, and
//! decoding plus hashing it is per-byte work that must not run on the tokio
//! threads serving text. The control plane keeps the cheap checks (the URL's
//! header, and the size cap from the encoded length alone, so an oversized
//! string costs nothing) and hands the payload here; a core validates,
//! decodes and hashes it in one pass, a cache-sized slice at a time (each
//! slice is hashed while it is still in cache), like a file read.
//!
//! The dialect is the standard alphabet with canonical padding and no
//! whitespace, which is what SGLang accepts (`b64decode(validate=True)`).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;

use super::job::FileContents;

/// Encoded bytes decoded and hashed per step: whole base64 quanta, sized
/// to stay in cache between decoding and hashing.
const DECODE_SLICE: usize = 64 * 1024;

/// Decode `encoded` (standard, padded base64) and hash the result, refusing
/// more than `max_bytes` decoded bytes.
#[derive(Debug, Clone)]
pub struct Base64Decode {
    pub encoded: Bytes,
    pub max_bytes: usize,
}

/// Why a base64 payload was refused. The texts are the reasons clients see.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Base64Error {
    #[error("empty")]
    Empty,
    #[error("length {0} is not a multiple of 4 (padding missing?)")]
    Length(usize),
    #[error("padding '=' inside the data at offset {0}")]
    PaddingInside(usize),
    #[error("invalid byte {byte:?} at offset {offset}")]
    InvalidByte { offset: usize, byte: char },
    #[error("invalid last symbol {byte:?} at offset {offset}")]
    InvalidLastSymbol { offset: usize, byte: char },
    #[error("more data than its length implies")]
    Overrun,
    #[error("{0}")]
    Other(String),
    #[error("decodes to {decoded_len} bytes, over the limit of {max_bytes}")]
    TooLarge {
        decoded_len: usize,
        max_bytes: usize,
    },
}

/// The exact decoded length of canonically padded base64, from its length
/// and last two bytes alone (constant time: callers check their size cap
/// with it before handing the payload over).
pub fn padded_decoded_len(encoded: &[u8]) -> Result<usize, Base64Error> {
    if encoded.is_empty() {
        return Err(Base64Error::Empty);
    }
    if !encoded.len().is_multiple_of(4) {
        return Err(Base64Error::Length(encoded.len()));
    }
    let padding = encoded.iter().rev().take(2).filter(|&&b| b == b'=').count();
    Ok(encoded.len() / 4 * 3 - padding)
}

/// Validates, decodes and hashes `encoded` (see [`Base64Decode`]).
pub(crate) fn decode_and_hash(
    encoded: &[u8],
    max_bytes: usize,
) -> Result<FileContents, Base64Error> {
    let decoded_len = padded_decoded_len(encoded)?;
    if decoded_len > max_bytes {
        return Err(Base64Error::TooLarge {
            decoded_len,
            max_bytes,
        });
    }
    // Padding anywhere but the end would let slices decode what the whole
    // string cannot.
    let body = &encoded[..encoded.len() - (encoded.len() / 4 * 3 - decoded_len)];
    if let Some(offset) = body.iter().position(|&b| b == b'=') {
        return Err(Base64Error::PaddingInside(offset));
    }
    let mut output = vec![0u8; decoded_len];
    let mut hasher = blake3::Hasher::new();
    let mut written = 0;
    for (index, slice) in encoded.chunks(DECODE_SLICE).enumerate() {
        let produced = STANDARD
            .decode_slice(slice, &mut output[written..])
            .map_err(|error| describe(error, index * DECODE_SLICE))?;
        hasher.update(&output[written..written + produced]);
        written += produced;
    }
    output.truncate(written);
    Ok(FileContents {
        bytes: Bytes::from(output),
        content_hash: *hasher.finalize().as_bytes(),
    })
}

fn describe(error: base64::DecodeSliceError, slice_start: usize) -> Base64Error {
    use base64::{DecodeError, DecodeSliceError};
    match error {
        DecodeSliceError::DecodeError(DecodeError::InvalidByte(offset, byte)) => {
            Base64Error::InvalidByte {
                offset: slice_start + offset,
                byte: char::from(byte),
            }
        }
        DecodeSliceError::DecodeError(DecodeError::InvalidLastSymbol(offset, byte)) => {
            Base64Error::InvalidLastSymbol {
                offset: slice_start + offset,
                byte: char::from(byte),
            }
        }
        DecodeSliceError::DecodeError(other) => Base64Error::Other(other.to_string()),
        DecodeSliceError::OutputSliceTooSmall => Base64Error::Overrun,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_and_hashes_across_slices() {
        let data: Vec<u8> = (0..(3 * DECODE_SLICE + 7))
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let decoded = decode_and_hash(STANDARD.encode(&data).as_bytes(), data.len()).expect("ok");
        assert_eq!(decoded.bytes.as_ref(), data.as_slice());
        assert_eq!(decoded.content_hash, *blake3::hash(&data).as_bytes());
    }

    #[test]
    fn malformed_payloads_say_where() {
        let cases: [(&str, Base64Error); 6] = [
            ("", Base64Error::Empty),
            ("QUJ", Base64Error::Length(3)),
            ("QQ==QUJD", Base64Error::PaddingInside(2)),
            (
                "QUJD!EVG",
                Base64Error::InvalidByte {
                    offset: 4,
                    byte: '!',
                },
            ),
            (
                "QR==",
                Base64Error::InvalidLastSymbol {
                    offset: 1,
                    byte: 'R',
                },
            ),
            (
                "QUJDRUZHSUpL",
                Base64Error::TooLarge {
                    decoded_len: 9,
                    max_bytes: 6,
                },
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(
                decode_and_hash(input.as_bytes(), 6).map(|c| c.bytes),
                Err(expected),
                "{input:?}"
            );
        }
    }

    #[test]
    fn the_decoded_length_needs_only_the_ends() {
        assert_eq!(padded_decoded_len(b"QUJD"), Ok(3));
        assert_eq!(padded_decoded_len(b"QUI="), Ok(2));
        assert_eq!(padded_decoded_len(b"QQ=="), Ok(1));
        // Not validated here: garbage of the right shape has a length.
        assert_eq!(padded_decoded_len(b"!!!!!!!!"), Ok(6));
    }
}
