//! Images carried inside the request: `data:` URLs and bare base64.
//!
//! A 32 MiB image is a 43 MiB base64 string, and decoding it is per-byte
//! work on the tokio runtime. Two rules keep that cheap and fair: the size
//! is checked from the encoded length before a single byte is decoded (an
//! oversized string costs nothing), and decoding runs in slices with a
//! yield between them, so a burst of large inline images does not stall the
//! text requests sharing the worker thread. The content hash is computed in
//! the same pass.
//!
//! The base64 dialect is the standard alphabet with canonical padding and no
//! whitespace, which is what SGLang accepts (`b64decode(validate=True)`).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;

use super::HashedBytes;

/// Input bytes decoded between two yields: a multiple of 4 (whole base64
/// quanta), about 50 µs of work.
const DECODE_SLICE: usize = 64 * 1024;

/// Why inline image data was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InlineProblem {
    /// Not a `data:` URL this gateway takes (the reason is in the text).
    Malformed(String),
    /// Not valid base64 (the reason is in the text).
    InvalidBase64(String),
    /// The decoded size would exceed the cap.
    TooLarge { decoded_len: usize },
}

/// Decodes a `data:[<mime>][;param=value]*;base64,<payload>` URL.
///
/// Only base64 payloads are taken (images are binary), and only image media
/// types (`image/*`), `application/octet-stream` or none at all.
pub async fn decode_data_url(url: &str, max_bytes: usize) -> Result<HashedBytes, InlineProblem> {
    let rest = url
        .get(..5)
        .filter(|scheme| scheme.eq_ignore_ascii_case("data:"))
        .and_then(|_| url.get(5..))
        .ok_or_else(|| InlineProblem::Malformed("not a data: URL".to_owned()))?;
    let (header, payload) = rest.split_once(',').ok_or_else(|| {
        InlineProblem::Malformed("a data: URL needs a comma before its payload".to_owned())
    })?;
    let media_type = header.split(';').next().unwrap_or_default().trim();
    let is_base64 = header
        .rsplit(';')
        .next()
        .is_some_and(|last| last.trim().eq_ignore_ascii_case("base64"))
        && header.contains(';');
    if !is_base64 {
        return Err(InlineProblem::Malformed(
            "image data: URLs must be base64 (data:image/png;base64,...)".to_owned(),
        ));
    }
    let acceptable_type = media_type.is_empty()
        || media_type
            .get(..6)
            .is_some_and(|prefix| prefix.eq_ignore_ascii_case("image/"))
        || media_type.eq_ignore_ascii_case("application/octet-stream");
    if !acceptable_type {
        return Err(InlineProblem::Malformed(format!(
            "data: URL media type {media_type:?} is not an image type"
        )));
    }
    decode_base64(payload, max_bytes).await
}

/// Decodes standard, padded base64 with the size cap checked first.
pub async fn decode_base64(encoded: &str, max_bytes: usize) -> Result<HashedBytes, InlineProblem> {
    let decoded_len = padded_decoded_len(encoded.as_bytes())?;
    if decoded_len > max_bytes {
        return Err(InlineProblem::TooLarge { decoded_len });
    }
    let mut output = vec![0u8; decoded_len];
    let mut hasher = blake3::Hasher::new();
    let mut written = 0;
    for (index, slice) in encoded.as_bytes().chunks(DECODE_SLICE).enumerate() {
        if index > 0 {
            tokio::task::yield_now().await;
        }
        let produced = STANDARD
            .decode_slice(slice, &mut output[written..])
            .map_err(|error| describe_decode_error(error, index * DECODE_SLICE))?;
        hasher.update(&output[written..written + produced]);
        written += produced;
    }
    output.truncate(written);
    Ok(HashedBytes {
        bytes: Bytes::from(output),
        content_hash: *hasher.finalize().as_bytes(),
    })
}

/// The exact decoded length of canonically padded base64, from its length
/// and trailing `=` alone; refuses shapes that can never decode, so that
/// decoding in slices cannot accept what decoding whole would not.
fn padded_decoded_len(encoded: &[u8]) -> Result<usize, InlineProblem> {
    if encoded.is_empty() {
        return Err(InlineProblem::InvalidBase64("empty".to_owned()));
    }
    if !encoded.len().is_multiple_of(4) {
        return Err(InlineProblem::InvalidBase64(format!(
            "length {} is not a multiple of 4 (padding missing?)",
            encoded.len()
        )));
    }
    let padding = encoded.iter().rev().take(2).filter(|&&b| b == b'=').count();
    let body = &encoded[..encoded.len() - padding];
    if let Some(offset) = body.iter().position(|&b| b == b'=') {
        return Err(InlineProblem::InvalidBase64(format!(
            "padding '=' inside the data at offset {offset}"
        )));
    }
    Ok(encoded.len() / 4 * 3 - padding)
}

fn describe_decode_error(error: base64::DecodeSliceError, slice_start: usize) -> InlineProblem {
    use base64::{DecodeError, DecodeSliceError};
    let reason = match error {
        DecodeSliceError::DecodeError(DecodeError::InvalidByte(offset, byte)) => format!(
            "invalid byte {:?} at offset {}",
            char::from(byte),
            slice_start + offset
        ),
        DecodeSliceError::DecodeError(DecodeError::InvalidLastSymbol(offset, byte)) => format!(
            "invalid last symbol {:?} at offset {}",
            char::from(byte),
            slice_start + offset
        ),
        DecodeSliceError::DecodeError(other) => other.to_string(),
        DecodeSliceError::OutputSliceTooSmall => "more data than its length implies".to_owned(),
    };
    InlineProblem::InvalidBase64(reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(bytes: &[u8]) -> String {
        STANDARD.encode(bytes)
    }

    #[tokio::test]
    async fn data_url_decodes_to_the_original_bytes() {
        let image = b"\x89PNG\r\n\x1a\n fake image body";
        let url = format!("data:image/png;base64,{}", encode(image));
        let decoded = decode_data_url(&url, 1024).await.expect("valid data URL");
        assert_eq!(decoded.bytes.as_ref(), image);
        assert_eq!(decoded.content_hash, *blake3::hash(image).as_bytes());
    }

    #[tokio::test]
    async fn data_url_header_variants() {
        let payload = encode(b"abc");
        let accepted = [
            format!("data:;base64,{payload}"),
            format!("DATA:IMAGE/JPEG;BASE64,{payload}"),
            format!("data:image/png;name=a.png;base64,{payload}"),
            format!("data:application/octet-stream;base64,{payload}"),
        ];
        for url in &accepted {
            let decoded = decode_data_url(url, 1024).await.expect(url);
            assert_eq!(decoded.bytes.as_ref(), b"abc", "{url}");
        }
        let refused = [
            format!("data:image/png,{payload}"),
            format!("data:image/png;base64;name=x,{payload}"),
            format!("data:text/plain;base64,{payload}"),
            format!("data:image/png;base64{payload}"),
            format!("data:base64,{payload}"),
        ];
        for url in &refused {
            assert!(
                matches!(
                    decode_data_url(url, 1024).await,
                    Err(InlineProblem::Malformed(_))
                ),
                "{url}"
            );
        }
    }

    #[tokio::test]
    async fn invalid_base64_is_refused_with_its_position() {
        let cases = [
            ("QUJD!EVG", "invalid byte '!' at offset 4"),
            ("QUJ", "not a multiple of 4"),
            ("QQ==QUJD", "padding '=' inside the data at offset 2"),
            ("QUJD RUZH", "not a multiple of 4"),
            ("QUJDRUZH\n", "not a multiple of 4"),
            ("QR==", "invalid last symbol"),
            ("", "empty"),
        ];
        for (input, reason) in cases {
            match decode_base64(input, 1024).await {
                Err(InlineProblem::InvalidBase64(text)) => {
                    assert!(text.contains(reason), "{input:?}: {text}")
                }
                other => panic!("{input:?}: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn size_is_refused_from_the_encoded_length_before_decoding() {
        // 9 bytes decode from 12 characters; the cap is checked on the
        // exact decoded length, so 8 is refused and 9 accepted.
        let nine = encode(b"123456789");
        assert_eq!(
            decode_base64(&nine, 8).await,
            Err(InlineProblem::TooLarge { decoded_len: 9 })
        );
        assert_eq!(
            decode_base64(&nine, 9)
                .await
                .expect("at the cap")
                .bytes
                .len(),
            9
        );
        // A string that is not even base64 past its first quantum is refused
        // as too large, proving no decoding happened.
        let huge_garbage = format!("QUJD{}", "!".repeat(4 * 1000));
        assert_eq!(
            decode_base64(&huge_garbage, 100).await,
            Err(InlineProblem::TooLarge { decoded_len: 3003 })
        );
    }

    #[tokio::test]
    async fn payloads_spanning_many_slices_decode_exactly() {
        let image: Vec<u8> = (0..(3 * DECODE_SLICE + 7))
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let decoded = decode_base64(&encode(&image), image.len())
            .await
            .expect("valid multi-slice base64");
        assert_eq!(decoded.bytes.as_ref(), image.as_slice());
        assert_eq!(decoded.content_hash, *blake3::hash(&image).as_bytes());

        // A bad byte in a later slice is reported at its absolute offset.
        let mut spoiled = encode(&image);
        let bad_at = 2 * DECODE_SLICE + 10;
        spoiled.replace_range(bad_at..bad_at + 1, "*");
        match decode_base64(&spoiled, image.len()).await {
            Err(InlineProblem::InvalidBase64(text)) => {
                assert!(text.contains(&format!("offset {bad_at}")), "{text}")
            }
            other => panic!("{other:?}"),
        }
    }
}
