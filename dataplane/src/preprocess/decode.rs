//! From compressed bytes to 8-bit pixels, as PIL's `convert("RGB")` sees them.
//!
//! Why a file of its own: this is the untrusted-input boundary. It decides the
//! format from magic bytes (never from a client's content type), reads the
//! dimensions from the header and enforces the pixel cap *before* any pixel
//! buffer exists (decompression bombs), and maps every decoder failure onto a
//! stable [`PreprocessError`] code.
//!
//! Conversions follow what Hugging Face's processor gets from PIL, not what
//! looks nicest:
//! - Alpha is dropped, not composited on white: PIL's `convert("RGB")` keeps
//!   the colour channels of an RGBA/LA image unchanged, even where alpha is 0.
//! - Gray is replicated into R, G and B.
//! - 16-bit PNGs: RGB(A) and gray+alpha keep the high byte (PIL's `RGB;16B`
//!   unpacking); plain 16-bit gray opens as PIL mode `I;16`, whose conversion to
//!   RGB clips at 255 rather than scaling.
//! - EXIF orientation is ignored. HF's image processor does not rotate a PIL
//!   image it is given; only `transformers.image_utils.load_image` (used when
//!   a URL or path string is passed) applies `exif_transpose`. Engines that
//!   open bytes with `PIL.Image.open` see the stored orientation, as here.
//! - ICC profiles and PNG gamma are ignored, as PIL does.
//! - Animated WebP: the first frame.
//!
//! JPEG goes to libjpeg-turbo's decoder ([`super::jpeg`]), so its pixels
//! round exactly as Pillow's; PNG and WebP to the `image` crate's decoders,
//! which are lossless (PNG) or bit-exact with libwebp here (the parity test
//! checks both). A JPEG must end in an end-of-image marker after its scan
//! data: PIL refuses truncated JPEGs ("image file is truncated"), while
//! libjpeg would only warn and fill the missing part with gray.

use std::io::Cursor;

use image::codecs::png::PngDecoder;
use image::codecs::webp::WebPDecoder;
use image::{ColorType, ImageDecoder, ImageError, Limits};

use super::error::PreprocessError;
use super::jpeg;
use super::resize::{PixelLayout, SourcePixels};
use super::scratch::sized;

/// Extra decoder working memory allowed on top of the decoded pixels.
const DECODER_SLACK_BYTES: u64 = 64 << 20;

/// The compressed formats the kernel decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SourceFormat {
    Jpeg,
    Png,
    WebP,
}

impl SourceFormat {
    /// The format announced by the first bytes, if it is one we decode.
    pub fn sniff(bytes: &[u8]) -> Option<Self> {
        if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
            Some(SourceFormat::Jpeg)
        } else if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(SourceFormat::Png)
        } else if bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP" {
            Some(SourceFormat::WebP)
        } else {
            None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SourceFormat::Jpeg => "jpeg",
            SourceFormat::Png => "png",
            SourceFormat::WebP => "webp",
        }
    }
}

/// Caps applied to an image before it is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// Largest width × height accepted, read from the header. The decoded
    /// image costs 3-4 bytes per pixel (8 with 16-bit PNGs) before resizing.
    pub max_source_pixels: u64,
    /// Shortest side accepted, in pixels (at least 1).
    pub min_source_side: u32,
}

impl Default for ImageLimits {
    /// 8192 × 8192 pixels (a 48-megapixel photo fits); any non-empty side.
    fn default() -> Self {
        ImageLimits {
            max_source_pixels: 8192 * 8192,
            min_source_side: 1,
        }
    }
}

/// What the header says, checked against [`ImageLimits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceHeader {
    pub format: SourceFormat,
    pub width: u32,
    pub height: u32,
}

/// A decoded image in one of the 8-bit layouts the resampler reads.
#[derive(Debug, Clone)]
pub struct DecodedImage {
    width: usize,
    height: usize,
    layout: PixelLayout,
    data: Vec<u8>,
}

impl DecodedImage {
    /// The pixels, for the resampler.
    pub fn pixels(&self) -> Option<SourcePixels<'_>> {
        SourcePixels::new(self.width, self.height, self.layout, &self.data)
    }

    pub fn layout(&self) -> PixelLayout {
        self.layout
    }

    /// The pixel buffer, for reuse by the next image.
    pub fn into_buffer(self) -> Vec<u8> {
        self.data
    }
}

type BoxedDecoder<'a> = Box<dyn ImageDecoder + 'a>;

/// Reads and checks the header only: no pixel buffer is allocated.
pub fn read_header(bytes: &[u8], limits: &ImageLimits) -> Result<SourceHeader, PreprocessError> {
    let format = sniff_supported(bytes)?;
    let header = match format {
        SourceFormat::Jpeg => {
            let jpeg = jpeg::read_header(bytes)?;
            SourceHeader {
                format,
                width: jpeg.width,
                height: jpeg.height,
            }
        }
        SourceFormat::Png | SourceFormat::WebP => open_lossless(format, bytes, limits)?.0,
    };
    check_dimensions(&header, limits)?;
    Ok(header)
}

/// Decodes the whole image after the same checks as [`read_header`].
pub fn decode(bytes: &[u8], limits: &ImageLimits) -> Result<DecodedImage, PreprocessError> {
    decode_into(bytes, limits, Vec::new())
}

/// As [`decode`], writing the pixels into `buffer` (a core's scratch buffer
/// from an earlier image; its contents do not matter) where the format
/// allows. The buffer is consumed even on error.
pub fn decode_into(
    bytes: &[u8],
    limits: &ImageLimits,
    buffer: Vec<u8>,
) -> Result<DecodedImage, PreprocessError> {
    match sniff_supported(bytes)? {
        SourceFormat::Jpeg => decode_jpeg(bytes, limits, buffer),
        format @ (SourceFormat::Png | SourceFormat::WebP) => {
            decode_with_image_crate(format, bytes, limits, buffer)
        }
    }
}

fn sniff_supported(bytes: &[u8]) -> Result<SourceFormat, PreprocessError> {
    SourceFormat::sniff(bytes)
        .ok_or_else(|| PreprocessError::UnsupportedFormat(describe_unsupported(bytes)))
}

fn decode_jpeg(
    bytes: &[u8],
    limits: &ImageLimits,
    buffer: Vec<u8>,
) -> Result<DecodedImage, PreprocessError> {
    if !jpeg_has_end_marker(bytes) {
        return Err(PreprocessError::CorruptImage(
            "jpeg ends before its end-of-image marker (truncated)".into(),
        ));
    }
    let check = |header: &jpeg::JpegHeader| {
        check_dimensions(
            &SourceHeader {
                format: SourceFormat::Jpeg,
                width: header.width,
                height: header.height,
            },
            limits,
        )
    };
    let pixels = jpeg::decode_into(bytes, check, buffer)?;
    Ok(DecodedImage {
        width: pixels.header.width as usize,
        height: pixels.header.height as usize,
        layout: pixels.layout,
        data: pixels.data,
    })
}

fn decode_with_image_crate(
    format: SourceFormat,
    bytes: &[u8],
    limits: &ImageLimits,
    buffer: Vec<u8>,
) -> Result<DecodedImage, PreprocessError> {
    let (header, mut decoder) = open_lossless(format, bytes, limits)?;
    check_dimensions(&header, limits)?;
    let to_error = |error| decoder_error(error, Some(&header), limits);
    let mut decoder_limits = Limits::default();
    decoder_limits.max_alloc = Some(
        limits
            .max_source_pixels
            .saturating_mul(8)
            .saturating_add(DECODER_SLACK_BYTES),
    );
    decoder.set_limits(decoder_limits).map_err(to_error)?;

    let color = decoder.color_type();
    let len = usize::try_from(decoder.total_bytes()).map_err(|_| too_large(&header, limits))?;
    let mut data = sized(buffer, len);
    decoder.read_image_boxed(&mut data).map_err(to_error)?;

    let (width, height) = (header.width as usize, header.height as usize);
    let (layout, data) = match color {
        ColorType::L8 => (PixelLayout::Gray, data),
        ColorType::La8 => (PixelLayout::GrayAlpha, data),
        ColorType::Rgb8 => (PixelLayout::Rgb, data),
        ColorType::Rgba8 => (PixelLayout::Rgba, data),
        // PIL "I;16" -> "RGB" clips instead of scaling.
        ColorType::L16 => (PixelLayout::Gray, narrow_u16(&data, |v| v.min(255) as u8)),
        ColorType::La16 => (PixelLayout::GrayAlpha, narrow_u16(&data, high_byte)),
        ColorType::Rgb16 => (PixelLayout::Rgb, narrow_u16(&data, high_byte)),
        ColorType::Rgba16 => (PixelLayout::Rgba, narrow_u16(&data, high_byte)),
        other => {
            return Err(PreprocessError::UnsupportedFormat(format!(
                "{} with {other:?} pixels",
                header.format.name()
            )));
        }
    };
    Ok(DecodedImage {
        width,
        height,
        layout,
        data,
    })
}

fn high_byte(value: u16) -> u8 {
    (value >> 8) as u8
}

/// 16-bit samples (native endian, as the decoders emit them) to 8-bit.
fn narrow_u16(data: &[u8], narrow: impl Fn(u16) -> u8) -> Vec<u8> {
    data.chunks_exact(2)
        .map(|pair| narrow(u16::from_ne_bytes([pair[0], pair[1]])))
        .collect()
}

/// Opens a PNG or WebP decoder and reads its header (not yet checked).
fn open_lossless<'a>(
    format: SourceFormat,
    bytes: &'a [u8],
    limits: &ImageLimits,
) -> Result<(SourceHeader, BoxedDecoder<'a>), PreprocessError> {
    let to_error = |error| decoder_error(error, None, limits);
    let cursor = Cursor::new(bytes);
    let decoder: BoxedDecoder<'a> = match format {
        SourceFormat::Png => Box::new(PngDecoder::new(cursor).map_err(to_error)?),
        SourceFormat::WebP => Box::new(WebPDecoder::new(cursor).map_err(to_error)?),
        SourceFormat::Jpeg => {
            return Err(PreprocessError::UnsupportedFormat(
                "jpeg is decoded by libjpeg".into(),
            ));
        }
    };
    let (width, height) = decoder.dimensions();
    Ok((
        SourceHeader {
            format,
            width,
            height,
        },
        decoder,
    ))
}

fn check_dimensions(header: &SourceHeader, limits: &ImageLimits) -> Result<(), PreprocessError> {
    let (width, height) = (header.width, header.height);
    let shortest = width.min(height);
    if shortest == 0 || shortest < limits.min_source_side {
        return Err(PreprocessError::ImageTooSmall {
            width,
            height,
            reason: "a side is shorter than the minimum",
        });
    }
    if u64::from(width) * u64::from(height) > limits.max_source_pixels {
        return Err(too_large(header, limits));
    }
    Ok(())
}

fn too_large(header: &SourceHeader, limits: &ImageLimits) -> PreprocessError {
    PreprocessError::ImageTooLarge {
        width: header.width,
        height: header.height,
        pixels: u64::from(header.width) * u64::from(header.height),
        max_pixels: limits.max_source_pixels,
    }
}

fn decoder_error(
    error: ImageError,
    header: Option<&SourceHeader>,
    limits: &ImageLimits,
) -> PreprocessError {
    match (error, header) {
        (ImageError::Unsupported(error), _) => {
            PreprocessError::UnsupportedFormat(error.to_string())
        }
        (ImageError::Limits(_), Some(header)) => too_large(header, limits),
        (error, _) => PreprocessError::CorruptImage(error.to_string()),
    }
}

/// Names formats we recognise but do not decode, for a useful message.
fn describe_unsupported(bytes: &[u8]) -> String {
    let known = [
        (&b"GIF8"[..], 0, "gif"),
        (&b"BM"[..], 0, "bmp"),
        (&b"II*\0"[..], 0, "tiff"),
        (&b"MM\0*"[..], 0, "tiff"),
        (&b"ftyp"[..], 4, "heif/avif"),
        (&b"\0\0\x01\0"[..], 0, "ico"),
    ];
    for (magic, offset, name) in known {
        if bytes.get(offset..offset + magic.len()) == Some(magic) {
            return format!("{name} is not accepted (jpeg, png or webp)");
        }
    }
    if bytes.is_empty() {
        "empty input".into()
    } else {
        "not a jpeg, png or webp image".into()
    }
}

/// Offset of the first start-of-scan marker (FF DA), found by walking the
/// marker segments before it by their lengths (EXIF thumbnails carry their
/// own markers); bytes between segments are skipped as libjpeg does. `None`
/// if the file ends, or reaches its end-of-image marker, first.
pub(super) fn jpeg_first_scan(bytes: &[u8]) -> Option<usize> {
    const START_OF_SCAN: u8 = 0xDA;
    const END_OF_IMAGE: u8 = 0xD9;
    let mut pos = 2;
    loop {
        let (&lead, &marker) = (bytes.get(pos)?, bytes.get(pos + 1)?);
        if lead != 0xFF || marker == 0xFF {
            pos += 1;
            continue;
        }
        match marker {
            START_OF_SCAN => return Some(pos),
            END_OF_IMAGE => return None,
            // Markers without a length field.
            0x01 | 0xD0..=0xD7 | 0x00 => pos += 2,
            _ => {
                let length = bytes.get(pos + 2..pos + 4)?;
                pos += 2 + usize::from(u16::from_be_bytes([length[0], length[1]]));
            }
        }
    }
}

/// Whether an end-of-image marker (FF D9) follows the first start-of-scan.
/// Inside scan data FF is always followed by 00 or a restart marker, so any
/// FF D9 after the scan starts is the real end.
fn jpeg_has_end_marker(bytes: &[u8]) -> bool {
    jpeg_first_scan(bytes).is_some_and(|scan_start| {
        bytes[scan_start..]
            .windows(2)
            .rev()
            .any(|pair| pair == [0xFF, 0xD9])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniffs_by_magic_bytes() {
        assert_eq!(
            SourceFormat::sniff(&[0xFF, 0xD8, 0xFF, 0xE0]),
            Some(SourceFormat::Jpeg)
        );
        assert_eq!(
            SourceFormat::sniff(b"\x89PNG\r\n\x1a\n...."),
            Some(SourceFormat::Png)
        );
        assert_eq!(
            SourceFormat::sniff(b"RIFF\0\0\0\0WEBPVP8 "),
            Some(SourceFormat::WebP)
        );
        assert_eq!(SourceFormat::sniff(b"RIFF\0\0\0\0WAVEfmt "), None);
        assert_eq!(SourceFormat::sniff(b"GIF89a"), None);
        assert_eq!(SourceFormat::sniff(&[]), None);
    }

    #[test]
    fn unsupported_formats_are_named() {
        let error = read_header(b"GIF89a\x01\0\x01\0", &ImageLimits::default())
            .expect_err("gif is not decoded");
        assert_eq!(error.code(), "unsupported_format");
        assert!(error.to_string().contains("gif"), "{error}");
        let error = read_header(b"", &ImageLimits::default()).expect_err("empty");
        assert_eq!(error.code(), "unsupported_format");
    }

    #[test]
    fn end_marker_check_follows_segments() {
        // SOI, an APP1 whose payload holds a fake EOI, SOS, scan data, EOI.
        let mut jpeg = vec![0xFF, 0xD8, 0xFF, 0xE1, 0x00, 0x06, 0xFF, 0xD9, 0xAB, 0xCD];
        jpeg.extend_from_slice(&[0xFF, 0xDA, 0x00, 0x02, 0x12, 0xFF, 0x00, 0x34]);
        assert!(!jpeg_has_end_marker(&jpeg), "no EOI after the scan yet");
        jpeg.extend_from_slice(&[0xFF, 0xD9]);
        assert!(jpeg_has_end_marker(&jpeg));
        jpeg.extend_from_slice(b"trailing bytes after EOI are fine");
        assert!(jpeg_has_end_marker(&jpeg));
        assert!(
            !jpeg_has_end_marker(&[0xFF, 0xD8, 0xFF, 0xD9]),
            "EOI before any scan"
        );
        assert!(
            !jpeg_has_end_marker(&[0xFF, 0xD8, 0xFF, 0xE0, 0x10]),
            "cut in a length"
        );
    }

    #[test]
    fn sixteen_bit_narrowing_follows_pil() {
        let samples: Vec<u8> = [0u16, 200, 255, 256, 0xABCD]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        assert_eq!(
            narrow_u16(&samples, |v| v.min(255) as u8),
            [0, 200, 255, 255, 255]
        );
        assert_eq!(narrow_u16(&samples, high_byte), [0, 0, 0, 1, 0xAB]);
    }
}
