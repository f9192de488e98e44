//! Bad image bytes at the kernel boundary: every one must come back as an
//! error with a stable code (never a panic, never a tensor made of guesses),
//! and the same processor must keep producing the right tensor afterwards.
//!
//! The codes are smg's contract (see `PreprocessError::code`): formats we do
//! not decode are `unsupported_format`, damaged or truncated files of a
//! format we do decode are `corrupt_image` (or `unsupported_format` when the
//! file is valid but uses a feature the decoder lacks, e.g. 12-bit JPEG).

#![allow(clippy::unwrap_used)]

use std::path::Path;

use smg_dataplane::preprocess::jpeg::MAX_SCANS;
use smg_dataplane::preprocess::{
    ImageLimits, PreprocessError, Qwen2VlImageProcessor, VisionPreprocessConfig,
};
use smg_shared::tensor::DType;

fn processor() -> Qwen2VlImageProcessor {
    processor_with(ImageLimits::default())
}

fn processor_with(limits: ImageLimits) -> Qwen2VlImageProcessor {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/model");
    let config = VisionPreprocessConfig::from_model_dir(&dir).unwrap();
    Qwen2VlImageProcessor::new(config, limits).unwrap()
}

fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/images")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

fn preprocess(processor: &Qwen2VlImageProcessor, bytes: &[u8]) -> Result<Vec<u8>, PreprocessError> {
    processor
        .preprocess(bytes, DType::BFloat16)
        .map(|image| image.data)
}

fn error_of(processor: &Qwen2VlImageProcessor, bytes: &[u8], what: &str) -> PreprocessError {
    match preprocess(processor, bytes) {
        Ok(_) => panic!("{what}: preprocessed without error"),
        Err(error) => error,
    }
}

/// The offset of the first `marker` (FF xx) in a JPEG.
fn marker_offset(jpeg: &[u8], marker: u8) -> usize {
    jpeg.windows(2)
        .position(|pair| pair == [0xFF, marker])
        .unwrap()
}

#[test]
fn formats_we_do_not_decode_are_named() {
    let processor = processor();
    let cases: &[(&str, &[u8], &str)] = &[
        ("gif", b"GIF89a\x10\x00\x10\x00\x80\x00\x00", "gif"),
        ("bmp", b"BM\x36\x00\x0c\x00\x00\x00\x00\x00\x36\x00", "bmp"),
        ("tiff le", b"II*\x00\x08\x00\x00\x00\x0e\x00", "tiff"),
        ("tiff be", b"MM\x00*\x00\x00\x00\x08\x00\x0e", "tiff"),
        (
            "avif",
            b"\x00\x00\x00\x1cftypavif\x00\x00\x00\x00",
            "heif/avif",
        ),
        ("ico", b"\x00\x00\x01\x00\x01\x00\x10\x10", "ico"),
        ("empty", b"", "empty"),
        (
            "text",
            b"<svg xmlns='http://www.w3.org/2000/svg'/>",
            "not a jpeg",
        ),
        ("riff wave", b"RIFF\x24\x00\x00\x00WAVEfmt ", "not a jpeg"),
    ];
    for &(what, bytes, named) in cases {
        let error = error_of(&processor, bytes, what);
        assert_eq!(error.code(), "unsupported_format", "{what}: {error}");
        assert!(error.to_string().contains(named), "{what}: {error}");
        let error = processor
            .plan(bytes, DType::BFloat16)
            .expect_err("plan refuses too");
        assert_eq!(error.code(), "unsupported_format", "{what}: {error}");
    }
}

#[test]
fn every_truncation_of_a_jpeg_fails_cleanly() {
    let processor = processor();
    for name in ["tiny_9x7.jpg", "progressive_333x517.jpg"] {
        let jpeg = fixture(name);
        // Every prefix for the tiny one; a spread of cuts for the larger one.
        let step = (jpeg.len() / 400).max(1);
        for len in (0..jpeg.len()).step_by(step) {
            let error = error_of(&processor, &jpeg[..len], name);
            let expected = if len < 3 {
                "unsupported_format"
            } else {
                "corrupt_image"
            };
            assert_eq!(error.code(), expected, "{name} cut at {len}: {error}");
        }
    }
}

#[test]
fn truncated_png_and_webp_fail_cleanly() {
    let processor = processor();
    for name in ["transparent_64x48.png", "lossy_320x240.webp"] {
        let bytes = fixture(name);
        let whole = preprocess(&processor, &bytes).unwrap();
        for len in (0..bytes.len()).step_by(7) {
            match preprocess(&processor, &bytes[..len]) {
                // Only the trailer may go missing without changing the pixels.
                Ok(data) => assert_eq!(data, whole, "{name} cut at {len} decoded differently"),
                Err(error) => assert!(
                    ["corrupt_image", "unsupported_format"].contains(&error.code()),
                    "{name} cut at {len}: {error}"
                ),
            }
        }
    }
}

#[test]
fn flipped_bytes_never_panic() {
    // A flipped size byte can announce a far larger image; a small cap keeps
    // those cheap (they fail as image_too_large) so the test stays fast.
    let processor = processor_with(ImageLimits {
        max_source_pixels: 256 * 256,
        ..ImageLimits::default()
    });
    for name in ["tiny_9x7.jpg", "cmyk_120x90.jpg", "transparent_64x48.png"] {
        let original = fixture(name);
        // Every header byte (the first 700 hold all of them here), then a
        // sample of the compressed data, where damage is less varied.
        let positions = (0..original.len()).filter(|&p| p < 700 || p % 23 == 0);
        for position in positions {
            let mut damaged = original.clone();
            damaged[position] ^= 0xA5;
            if let Err(error) = preprocess(&processor, &damaged) {
                assert!(error.is_image_error(), "{name} byte {position}: {error}");
            }
        }
    }
}

#[test]
fn damaged_jpeg_headers_have_stable_codes() {
    let processor = processor();
    let jpeg = fixture("tiny_9x7.jpg");
    let sof = marker_offset(&jpeg, 0xC0);

    // 12-bit samples: a valid JPEG this 8-bit decoder does not handle.
    let mut twelve_bit = jpeg.clone();
    twelve_bit[sof + 4] = 12;
    let error = error_of(&processor, &twelve_bit, "12-bit");
    assert_eq!(error.code(), "unsupported_format", "{error}");
    assert!(error.to_string().contains("precision"), "{error}");

    // A lossless (SOF3) frame.
    let mut lossless = jpeg.clone();
    lossless[sof + 1] = 0xC3;
    let error = error_of(&processor, &lossless, "lossless");
    assert_eq!(error.code(), "unsupported_format", "{error}");

    // Zero height in the frame header.
    let mut empty = jpeg.clone();
    empty[sof + 5..sof + 7].copy_from_slice(&[0, 0]);
    let error = error_of(&processor, &empty, "zero height");
    assert!(
        ["corrupt_image", "image_too_small"].contains(&error.code()),
        "{error}"
    );

    // A Huffman table whose code counts overflow.
    let mut bad_huffman = jpeg.clone();
    let dht = marker_offset(&jpeg, 0xC4);
    bad_huffman[dht + 5..dht + 21].fill(0xFF);
    let error = error_of(&processor, &bad_huffman, "bad huffman table");
    assert_eq!(error.code(), "corrupt_image", "{error}");

    // A marker segment whose length runs past the end of the file.
    let mut long_segment = jpeg[..sof].to_vec();
    long_segment.extend_from_slice(&[0xFF, 0xE1, 0xFF, 0xF0, 1, 2, 3]);
    long_segment.extend_from_slice(&[0xFF, 0xD9]);
    let error = error_of(&processor, &long_segment, "overlong segment");
    assert_eq!(error.code(), "corrupt_image", "{error}");

    // JPEG magic, then nothing a decoder can use.
    let mut no_frame = vec![0xFF, 0xD8, 0xFF, 0xFE, 0x00, 0x04, b'h', b'i'];
    no_frame.extend_from_slice(&[0xFF, 0xD9]);
    let error = error_of(&processor, &no_frame, "no frame");
    assert_eq!(error.code(), "corrupt_image", "{error}");
}

#[test]
fn a_scan_flood_is_refused_before_decoding() {
    let processor = processor();
    let jpeg = fixture("tiny_9x7.jpg");
    let end = jpeg.len() - 2;
    assert_eq!(jpeg[end..], [0xFF, 0xD9]);
    // The real image, then many more (empty) scans, then the end marker.
    let mut flood = jpeg[..end].to_vec();
    for _ in 0..MAX_SCANS + 1 {
        flood.extend_from_slice(&[0xFF, 0xDA, 0x00, 0x08, 0x01, 0x01, 0x00, 0x00, 0x3F, 0x00]);
    }
    flood.extend_from_slice(&[0xFF, 0xD9]);
    let error = error_of(&processor, &flood, "scan flood");
    assert_eq!(error.code(), "decode_limit_exceeded", "{error}");
    assert!(error.to_string().contains("scans"), "{error}");
}

#[test]
fn damaged_png_and_webp_are_corrupt() {
    let processor = processor();
    // A PNG whose header checksum is wrong.
    let mut png = fixture("transparent_64x48.png");
    png[29] ^= 0xFF; // last byte of IHDR's CRC
    let error = error_of(&processor, &png, "png bad crc");
    assert_eq!(error.code(), "corrupt_image", "{error}");

    // A WebP container whose first chunk is not an image chunk.
    let mut webp = b"RIFF".to_vec();
    webp.extend_from_slice(&20u32.to_le_bytes());
    webp.extend_from_slice(b"WEBPJUNK");
    webp.extend_from_slice(&8u32.to_le_bytes());
    webp.extend_from_slice(&[0; 8]);
    let error = error_of(&processor, &webp, "webp junk chunk");
    assert!(
        ["corrupt_image", "unsupported_format"].contains(&error.code()),
        "{error}"
    );
}

#[test]
fn the_kernel_keeps_working_after_bad_input() {
    let processor = processor();
    let good = fixture("photo_640x480.jpg");
    let before = preprocess(&processor, &good).unwrap();
    let mut bad = good.clone();
    bad.truncate(good.len() / 3);
    for _ in 0..3 {
        assert!(preprocess(&processor, &bad).is_err());
        assert!(preprocess(&processor, b"GIF89a").is_err());
    }
    assert_eq!(preprocess(&processor, &good).unwrap(), before);
}
