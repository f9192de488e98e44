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
//! round exactly as Pillow's; PNG to the `png` crate and WebP to the `image`
//! crate's decoder, which are lossless (PNG) or bit-exact with libwebp here
//! (the parity test checks both). A JPEG must end in an end-of-image marker
//! after its scan data: PIL refuses truncated JPEGs ("image file is
//! truncated"), while libjpeg would only warn and fill the missing part with
//! gray.
//!
//! # What one image may cost
//!
//! The pixel cap bounds the decoded image; these bound what a decoder does
//! besides, so a small file cannot buy gigabytes or seconds of a core:
//! - PNG: the decoder's allocation limit is set before the header is read
//!   (every chunk it keeps counts against it), and ICC profiles and text
//!   chunks are skipped, never inflated. Before decoding, compressed
//!   metadata (iCCP, zTXt, compressed iTXt) is inflated into a sink with a
//!   cap of [`MAX_PNG_METADATA_CHUNK`] per chunk and
//!   [`MAX_PNG_METADATA_TOTAL`] per file, PIL's `MAX_TEXT_CHUNK` and
//!   `MAX_TEXT_MEMORY`: a file PIL refuses ("Decompressed data too large")
//!   is refused here too, with `decode_limit_exceeded`.
//! - JPEG: a scan budget ([`super::jpeg::max_scans`]).
//! - WebP: metadata chunks (ICC, EXIF, XMP) are never read. The decoder
//!   sizes its buffers from the bitstream's own header, so a bitstream
//!   whose dimensions differ from the canvas the pixel cap checked is
//!   refused before decoding (`corrupt_image`, as the decoder would
//!   refuse it after allocating).

use std::io::{Cursor, Read};

use image::codecs::webp::WebPDecoder;
use image::{ColorType, ImageDecoder, ImageError};

use super::error::PreprocessError;
use super::jpeg;
use super::resize::{PixelLayout, SourcePixels};
use super::scratch::sized;

/// What the PNG decoder may allocate besides the pixel buffer (which is
/// ours): chunks it keeps (EXIF, palette), row buffers.
const PNG_DECODER_ALLOC_BYTES: usize = 16 << 20;

/// Most bytes one compressed PNG metadata chunk (iCCP, zTXt, iTXt) may
/// inflate to: PIL's `PngImagePlugin.MAX_TEXT_CHUNK`.
pub const MAX_PNG_METADATA_CHUNK: u64 = 1 << 20;

/// Most bytes all of a PNG's metadata chunks may hold together, inflated:
/// PIL's `PngImagePlugin.MAX_TEXT_MEMORY`.
pub const MAX_PNG_METADATA_TOTAL: u64 = 64 << 20;

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
        SourceFormat::Png => {
            let (width, height) = png_header(bytes)?;
            SourceHeader {
                format,
                width,
                height,
            }
        }
        SourceFormat::WebP => open_webp(bytes, limits)?.0,
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
        SourceFormat::Png => decode_png(bytes, limits, buffer),
        SourceFormat::WebP => decode_webp(bytes, limits, buffer),
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

/// A PNG decoder whose allocation limit is set before it reads anything,
/// and which skips ICC profiles and text chunks.
fn png_decoder(bytes: &[u8]) -> png::Decoder<Cursor<&[u8]>> {
    let mut decoder = png::Decoder::new_with_limits(
        Cursor::new(bytes),
        png::Limits {
            bytes: PNG_DECODER_ALLOC_BYTES,
        },
    );
    decoder.set_ignore_iccp_chunk(true);
    decoder.set_ignore_text_chunk(true);
    // Bit depths below 8 and palettes become 8-bit gray or RGB(A); 16-bit
    // samples stay 16-bit (narrowed below as PIL does).
    decoder.set_transformations(png::Transformations::EXPAND);
    decoder
}

/// Width and height from the PNG's IHDR (nothing else is read).
fn png_header(bytes: &[u8]) -> Result<(u32, u32), PreprocessError> {
    let mut decoder = png_decoder(bytes);
    let info = decoder.read_header_info().map_err(png_error)?;
    Ok((info.width, info.height))
}

fn decode_png(
    bytes: &[u8],
    limits: &ImageLimits,
    buffer: Vec<u8>,
) -> Result<DecodedImage, PreprocessError> {
    let mut decoder = png_decoder(bytes);
    let info = decoder.read_header_info().map_err(png_error)?;
    let header = SourceHeader {
        format: SourceFormat::Png,
        width: info.width,
        height: info.height,
    };
    check_dimensions(&header, limits)?;
    check_png_metadata(bytes)?;
    let mut reader = decoder.read_info().map_err(png_error)?;
    let len = reader
        .output_buffer_size()
        .ok_or_else(|| too_large(&header, limits))?;
    let (color, depth) = reader.output_color_type();
    let mut data = sized(buffer, len);
    reader.next_frame(&mut data).map_err(png_error)?;

    let (layout, data) = match (color, depth) {
        (png::ColorType::Grayscale, png::BitDepth::Eight) => (PixelLayout::Gray, data),
        (png::ColorType::GrayscaleAlpha, png::BitDepth::Eight) => (PixelLayout::GrayAlpha, data),
        (png::ColorType::Rgb, png::BitDepth::Eight) => (PixelLayout::Rgb, data),
        (png::ColorType::Rgba, png::BitDepth::Eight) => (PixelLayout::Rgba, data),
        // PIL "I;16" -> "RGB" clips instead of scaling.
        (png::ColorType::Grayscale, png::BitDepth::Sixteen) => {
            (PixelLayout::Gray, narrow_u16(&data, |v| v.min(255) as u8))
        }
        (png::ColorType::GrayscaleAlpha, png::BitDepth::Sixteen) => {
            (PixelLayout::GrayAlpha, narrow_u16(&data, high_byte))
        }
        (png::ColorType::Rgb, png::BitDepth::Sixteen) => {
            (PixelLayout::Rgb, narrow_u16(&data, high_byte))
        }
        (png::ColorType::Rgba, png::BitDepth::Sixteen) => {
            (PixelLayout::Rgba, narrow_u16(&data, high_byte))
        }
        (color, depth) => {
            return Err(PreprocessError::UnsupportedFormat(format!(
                "png with {color:?} pixels of {depth:?} bits"
            )));
        }
    };
    Ok(DecodedImage {
        width: header.width as usize,
        height: header.height as usize,
        layout,
        data,
    })
}

fn png_error(error: png::DecodingError) -> PreprocessError {
    match error {
        png::DecodingError::LimitsExceeded => PreprocessError::DecodeLimitExceeded(format!(
            "the png decoder needs more than {PNG_DECODER_ALLOC_BYTES} bytes besides its pixels"
        )),
        error => PreprocessError::CorruptImage(format!("png: {error}")),
    }
}

/// Refuses a PNG whose metadata inflates past PIL's caps (see the module
/// doc). Walks the chunks by their lengths; a chunk that runs past the end
/// stops the walk (the decoder reports the damage). Inflating goes through
/// a 16 KiB block into nothing and stops one byte past the cap, so it costs
/// no buffer of the chunk's size and at most [`MAX_PNG_METADATA_TOTAL`]
/// bytes of inflating per file.
fn check_png_metadata(bytes: &[u8]) -> Result<(), PreprocessError> {
    let mut total = 0u64;
    let mut pos = 8;
    while let Some(chunk) = bytes.get(pos..pos + 8) {
        let len = u32::from_be_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]) as usize;
        let kind = [chunk[4], chunk[5], chunk[6], chunk[7]];
        let Some(data) = bytes.get(pos + 8..(pos + 8).saturating_add(len)) else {
            break;
        };
        pos += 12 + len;
        let size = match &kind {
            b"tEXt" => data.len() as u64,
            b"iCCP" | b"zTXt" => match compressed_after_keyword(data, 1) {
                Some(compressed) => inflated_len(compressed, &kind)?,
                None => continue,
            },
            b"iTXt" => match itxt_text(data) {
                Some((true, text)) => inflated_len(text, &kind)?,
                Some((false, text)) => text.len() as u64,
                None => continue,
            },
            b"IEND" => break,
            _ => continue,
        };
        total += size;
        if total > MAX_PNG_METADATA_TOTAL {
            return Err(PreprocessError::DecodeLimitExceeded(format!(
                "png metadata chunks hold more than {MAX_PNG_METADATA_TOTAL} bytes"
            )));
        }
    }
    Ok(())
}

/// What follows `keyword NUL` and `skip` more bytes (the compression
/// method).
fn compressed_after_keyword(data: &[u8], skip: usize) -> Option<&[u8]> {
    let nul = data.iter().position(|&b| b == 0)?;
    data.get(nul + 1 + skip..)
}

/// An iTXt's text and whether it is compressed: `keyword NUL flag method
/// language NUL translated-keyword NUL text`.
fn itxt_text(data: &[u8]) -> Option<(bool, &[u8])> {
    let after_keyword = data.get(data.iter().position(|&b| b == 0)? + 1..)?;
    let (&flag, rest) = after_keyword.split_first()?;
    let rest = rest.get(1..)?; // compression method
    let rest = rest.get(rest.iter().position(|&b| b == 0)? + 1..)?; // language
    let text = rest.get(rest.iter().position(|&b| b == 0)? + 1..)?; // translated keyword
    Some((flag == 1, text))
}

/// Bytes the zlib stream `compressed` inflates to, refusing past
/// [`MAX_PNG_METADATA_CHUNK`]. A damaged stream counts what inflated before
/// the damage (such chunks are skipped by the decoder anyway).
fn inflated_len(compressed: &[u8], kind: &[u8; 4]) -> Result<u64, PreprocessError> {
    let mut inflate = flate2::read::ZlibDecoder::new(compressed).take(MAX_PNG_METADATA_CHUNK + 1);
    let mut inflated = 0u64;
    let mut block = [0u8; 16 << 10];
    loop {
        match inflate.read(&mut block) {
            Ok(0) | Err(_) => break,
            Ok(n) => inflated += n as u64,
        }
    }
    if inflated > MAX_PNG_METADATA_CHUNK {
        return Err(PreprocessError::DecodeLimitExceeded(format!(
            "a png {} chunk inflates to more than {MAX_PNG_METADATA_CHUNK} bytes",
            String::from_utf8_lossy(kind)
        )));
    }
    Ok(inflated)
}

fn decode_webp(
    bytes: &[u8],
    limits: &ImageLimits,
    buffer: Vec<u8>,
) -> Result<DecodedImage, PreprocessError> {
    let (header, decoder) = open_webp(bytes, limits)?;
    check_dimensions(&header, limits)?;
    check_webp_bitstreams(bytes, &header)?;
    let to_error = |error| decoder_error(error, Some(&header), limits);
    let color = decoder.color_type();
    let len = usize::try_from(decoder.total_bytes()).map_err(|_| too_large(&header, limits))?;
    let mut data = sized(buffer, len);
    decoder.read_image_boxed(&mut data).map_err(to_error)?;
    let layout = match color {
        ColorType::Rgb8 => PixelLayout::Rgb,
        ColorType::Rgba8 => PixelLayout::Rgba,
        other => {
            return Err(PreprocessError::UnsupportedFormat(format!(
                "webp with {other:?} pixels"
            )));
        }
    };
    Ok(DecodedImage {
        width: header.width as usize,
        height: header.height as usize,
        layout,
        data,
    })
}

/// Refuses a WebP whose image bitstream (top-level, or the first frame's:
/// the only one decoded) has
/// other dimensions than its canvas (or frame): the decoder allocates its
/// buffers from the bitstream's own header (up to 16383x16383, ~400 MB)
/// before it compares, so the canvas the pixel cap checked would not bound
/// them. Such files fail to decode anyway; this fails them first.
fn check_webp_bitstreams(bytes: &[u8], header: &SourceHeader) -> Result<(), PreprocessError> {
    let canvas = (header.width, header.height);
    for (fourcc, data) in riff_chunks(bytes.get(12..).unwrap_or_default()) {
        match &fourcc {
            b"ANMF" => {
                // Frame x, y, width - 1, height - 1 (24 bits each), duration,
                // flags; then the frame's own chunks.
                let Some(frame) = data.get(..16) else {
                    continue;
                };
                let side = |at: usize| {
                    u32::from_le_bytes([frame[at], frame[at + 1], frame[at + 2], 0]) + 1
                };
                let size = (side(6), side(9));
                for (fourcc, data) in riff_chunks(&data[16..]) {
                    check_webp_bitstream(&fourcc, data, size)?;
                }
                break;
            }
            _ => check_webp_bitstream(&fourcc, data, canvas)?,
        }
    }
    Ok(())
}

/// Checks one VP8 or VP8L bitstream's dimensions against `expected`.
fn check_webp_bitstream(
    fourcc: &[u8; 4],
    data: &[u8],
    expected: (u32, u32),
) -> Result<(), PreprocessError> {
    let claimed = match fourcc {
        // Frame tag (3), start code (3), then 14-bit width and height
        // (the top two bits are scaling).
        b"VP8 " => data.get(6..10).map(|dims| {
            let side = |lo: u8, hi: u8| u32::from(u16::from_le_bytes([lo, hi]) & 0x3FFF);
            (side(dims[0], dims[1]), side(dims[2], dims[3]))
        }),
        // Signature, then width - 1 and height - 1 in 14 bits each.
        b"VP8L" => data.get(1..5).map(|bits| {
            let bits = u32::from_le_bytes([bits[0], bits[1], bits[2], bits[3]]);
            ((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
        }),
        _ => None,
    };
    match claimed {
        Some(claimed) if claimed != expected => Err(PreprocessError::CorruptImage(format!(
            "webp bitstream is {}x{}, its canvas {}x{}",
            claimed.0, claimed.1, expected.0, expected.1
        ))),
        _ => Ok(()),
    }
}

/// The RIFF chunks in `bytes` (fourcc, data), until one runs past the end.
fn riff_chunks(bytes: &[u8]) -> impl Iterator<Item = ([u8; 4], &[u8])> {
    let mut pos = 0usize;
    std::iter::from_fn(move || {
        let head = bytes.get(pos..pos + 8)?;
        let fourcc = [head[0], head[1], head[2], head[3]];
        let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
        let data = bytes.get(pos + 8..(pos + 8).checked_add(len)?)?;
        pos += 8 + len + len % 2;
        Some((fourcc, data))
    })
}

fn high_byte(value: u16) -> u8 {
    (value >> 8) as u8
}

/// 16-bit big-endian samples (as PNG stores them) to 8-bit.
fn narrow_u16(data: &[u8], narrow: impl Fn(u16) -> u8) -> Vec<u8> {
    data.chunks_exact(2)
        .map(|pair| narrow(u16::from_be_bytes([pair[0], pair[1]])))
        .collect()
}

/// Opens a WebP decoder and reads its header (not yet checked). Only the
/// RIFF chunk headers are read; no metadata chunk is.
fn open_webp<'a>(
    bytes: &'a [u8],
    limits: &ImageLimits,
) -> Result<(SourceHeader, BoxedDecoder<'a>), PreprocessError> {
    let decoder: BoxedDecoder<'a> = Box::new(
        WebPDecoder::new(Cursor::new(bytes)).map_err(|error| decoder_error(error, None, limits))?,
    );
    let (width, height) = decoder.dimensions();
    Ok((
        SourceHeader {
            format: SourceFormat::WebP,
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
            .flat_map(|v| v.to_be_bytes())
            .collect();
        assert_eq!(
            narrow_u16(&samples, |v| v.min(255) as u8),
            [0, 200, 255, 255, 255]
        );
        assert_eq!(narrow_u16(&samples, high_byte), [0, 0, 0, 1, 0xAB]);
    }
}
