//! Images carried inside the request: `data:` URLs and bare base64.
//!
//! A 32 MiB image is a 43 MiB base64 string, and decoding it is per-byte
//! work, which does not belong on the tokio runtime. Here the control plane
//! does only the constant-time part: it checks a `data:` URL's header and
//! the decoded size from the encoded length (an oversized string costs
//! nothing), then copies the payload into a data-plane job, where a core
//! validates, decodes and hashes it in one pass
//! (`smg_dataplane::runtime::DataPlane::decode_base64`). The copy is a
//! memcpy, an order of magnitude cheaper than decoding and hashing.
//!
//! The base64 dialect is the standard alphabet with canonical padding and no
//! whitespace, which is what SGLang accepts (`b64decode(validate=True)`).

use bytes::Bytes;
use smg_dataplane::DataPlane;
use smg_dataplane::runtime::{Base64Error, JobError, padded_decoded_len};

use super::HashedBytes;
use crate::error::Error;

/// Why inline image data was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum InlineProblem {
    /// Not a `data:` URL this gateway takes (the reason is in the text).
    Malformed(String),
    /// Not valid base64 (the reason is in the text).
    InvalidBase64(String),
    /// The decoded size would exceed the cap.
    TooLarge { decoded_len: usize },
    /// The data plane could not take the job (busy, stopping).
    DataPlane(Error),
}

/// Decodes a `data:[<mime>][;param=value]*;base64,<payload>` URL.
///
/// Only base64 payloads are taken (images are binary), and only image media
/// types (`image/*`), `application/octet-stream` or none at all.
pub(crate) async fn decode_data_url(
    url: &str,
    max_bytes: usize,
    dataplane: &DataPlane,
) -> Result<HashedBytes, InlineProblem> {
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
    decode_base64(payload, max_bytes, dataplane).await
}

/// Decodes standard, padded base64 on a data-plane core, with the size cap
/// checked first from the encoded length.
pub(crate) async fn decode_base64(
    encoded: &str,
    max_bytes: usize,
    dataplane: &DataPlane,
) -> Result<HashedBytes, InlineProblem> {
    let decoded_len = padded_decoded_len(encoded.as_bytes()).map_err(problem)?;
    if decoded_len > max_bytes {
        return Err(InlineProblem::TooLarge { decoded_len });
    }
    let contents = dataplane
        .decode_base64(Bytes::copy_from_slice(encoded.as_bytes()), max_bytes)
        .await
        .map_err(|error| match error {
            JobError::Base64(error) => problem(error),
            other => InlineProblem::DataPlane(Error::from_dataplane(&other)),
        })?;
    Ok(HashedBytes {
        bytes: contents.bytes,
        content_hash: contents.content_hash,
    })
}

fn problem(error: Base64Error) -> InlineProblem {
    match error {
        Base64Error::TooLarge { decoded_len, .. } => InlineProblem::TooLarge { decoded_len },
        other => InlineProblem::InvalidBase64(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;

    use super::*;

    /// Encoded bytes per data-plane slice (see `smg_dataplane`'s decoder).
    const DECODE_SLICE: usize = 64 * 1024;

    fn encode(bytes: &[u8]) -> String {
        STANDARD.encode(bytes)
    }

    /// A one-core data plane (inside a runtime).
    fn dataplane() -> DataPlane {
        DataPlane::start(smg_dataplane::DataPlaneConfig::default()).expect("data plane")
    }

    #[tokio::test]
    async fn data_url_decodes_to_the_original_bytes() {
        let image = b"\x89PNG\r\n\x1a\n fake image body";
        let url = format!("data:image/png;base64,{}", encode(image));
        let decoded = decode_data_url(&url, 1024, &dataplane())
            .await
            .expect("valid data URL");
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
        let dataplane = dataplane();
        for url in &accepted {
            let decoded = decode_data_url(url, 1024, &dataplane).await.expect(url);
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
                    decode_data_url(url, 1024, &dataplane).await,
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
        let dataplane = dataplane();
        for (input, reason) in cases {
            match decode_base64(input, 1024, &dataplane).await {
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
        let dataplane = dataplane();
        let nine = encode(b"123456789");
        assert_eq!(
            decode_base64(&nine, 8, &dataplane).await,
            Err(InlineProblem::TooLarge { decoded_len: 9 })
        );
        assert_eq!(
            decode_base64(&nine, 9, &dataplane)
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
            decode_base64(&huge_garbage, 100, &dataplane).await,
            Err(InlineProblem::TooLarge { decoded_len: 3003 })
        );
    }

    #[tokio::test]
    async fn payloads_spanning_many_slices_decode_exactly() {
        let image: Vec<u8> = (0..(3 * DECODE_SLICE + 7))
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let dataplane = dataplane();
        let decoded = decode_base64(&encode(&image), image.len(), &dataplane)
            .await
            .expect("valid multi-slice base64");
        assert_eq!(decoded.bytes.as_ref(), image.as_slice());
        assert_eq!(decoded.content_hash, *blake3::hash(&image).as_bytes());

        // A bad byte in a later slice is reported at its absolute offset.
        let mut spoiled = encode(&image);
        let bad_at = 2 * DECODE_SLICE + 10;
        spoiled.replace_range(bad_at..bad_at + 1, "*");
        match decode_base64(&spoiled, image.len(), &dataplane).await {
            Err(InlineProblem::InvalidBase64(text)) => {
                assert!(text.contains(&format!("offset {bad_at}")), "{text}")
            }
            other => panic!("{other:?}"),
        }
    }
}
