//! JPEG decoding with libjpeg-turbo's arithmetic, as Pillow decodes it.
//!
//! Why a file of its own: the model was trained on what Pillow's
//! `Image.open(...).convert("RGB")` returns, and Pillow decodes JPEG with
//! libjpeg-turbo's defaults: the accurate integer IDCT (`JDCT_ISLOW`) and
//! "fancy" (triangle-filter) chroma upsampling. Pure-Rust decoders round
//! differently (a few uint8 steps on some pixels), enough to miss the parity
//! bounds; this module drives the same libjpeg-turbo code (as MozJPEG ships
//! it, built from source and statically linked by `mozjpeg-sys`) with the
//! same settings, so decoded pixels match Pillow's byte for byte.
//!
//! What Pillow does, and so this module:
//! - 1 component → gray (`L`), 3 → RGB (libjpeg converts YCbCr), 4 → CMYK.
//! - Pillow reads every 4-component JPEG as inverted CMYK (`CMYK;I`, the
//!   Adobe convention), Adobe marker or not, and `convert("RGB")` then
//!   computes `(255 - C') * (255 - K') / 255` per channel with its own
//!   rounding ([`inverted_cmyk_to_rgb`]).
//! - libjpeg's warnings (extraneous bytes, bad restart markers) are ignored;
//!   only its fatal errors fail the image.
//!
//! libjpeg reports fatal errors by calling an error handler that must not
//! return; the `mozjpeg` wrapper's handler unwinds (`resume_unwind`, no panic
//! hook) with the formatted message, which [`decode`] catches at this
//! boundary and turns into a [`PreprocessError`]. Any other panic is
//! re-raised: it is a bug, not bad input.
//!
//! Dimensions are checked (by the caller's closure) after libjpeg has read
//! the header and before it allocates anything image-sized.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use mozjpeg::{ColorSpace, Decompress};

use super::error::PreprocessError;
use super::resize::PixelLayout;

/// Prefix of the `mozjpeg` wrapper's unwinding payload for libjpeg's fatal
/// errors.
const LIBJPEG_FATAL_PREFIX: &str = "libjpeg fatal error: ";

/// Most scans a JPEG may have, however small. Each scan of a progressive
/// JPEG walks every block of its components (libjpeg only warns about a
/// scan that repeats an earlier one), so a few kilobytes of repeated scans
/// cost seconds of a core: ~1000 scans took 7 s. Real encoders write 1
/// (baseline) to about a dozen (libjpeg's and mozjpeg's progressive
/// scripts); 100 leaves room for unusual ones.
pub const MAX_SCANS: usize = 100;

/// Scans every JPEG may have, however large (see [`max_scans`]).
pub const MIN_SCAN_ALLOWANCE: usize = 32;

/// The per-image CPU budget, in scans × pixels: 100 scans of a
/// 16-megapixel image.
pub const SCAN_PIXEL_BUDGET: u64 = 100 * 16_000_000;

/// Most scans a `width` × `height` JPEG may have: the budget spread over
/// its pixels, between [`MIN_SCAN_ALLOWANCE`] and [`MAX_SCANS`].
///
/// Counted from the bytes, before libjpeg runs ([`count_scans`]): every
/// scan libjpeg decodes starts with an FF DA marker in the file, so the
/// count is an upper bound that no arrangement of the file can evade.
pub fn max_scans(width: u32, height: u32) -> usize {
    let pixels = (u64::from(width) * u64::from(height)).max(1);
    let budget = usize::try_from(SCAN_PIXEL_BUDGET / pixels).unwrap_or(usize::MAX);
    budget.clamp(MIN_SCAN_ALLOWANCE, MAX_SCANS)
}

/// What libjpeg's header says about an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JpegHeader {
    pub width: u32,
    pub height: u32,
    pub components: usize,
}

/// Pixels decoded from a JPEG, in a layout the resampler reads.
#[derive(Debug)]
pub struct JpegPixels {
    pub header: JpegHeader,
    pub layout: PixelLayout,
    pub data: Vec<u8>,
}

/// Reads the header only (nothing image-sized is allocated).
pub fn read_header(bytes: &[u8]) -> Result<JpegHeader, PreprocessError> {
    guarded(|| {
        let decompress = Decompress::new_mem(bytes).map_err(io_error)?;
        Ok(header_of(&decompress))
    })
}

/// Decodes `bytes` after `check` accepted the header's dimensions.
pub fn decode(
    bytes: &[u8],
    check: impl FnOnce(&JpegHeader) -> Result<(), PreprocessError>,
) -> Result<JpegPixels, PreprocessError> {
    decode_into(bytes, check, Vec::new())
}

/// As [`decode`], into `buffer` (reused scratch; its contents do not
/// matter: every byte of the image is written).
pub fn decode_into(
    bytes: &[u8],
    check: impl FnOnce(&JpegHeader) -> Result<(), PreprocessError>,
    buffer: Vec<u8>,
) -> Result<JpegPixels, PreprocessError> {
    guarded(|| {
        let decompress = Decompress::new_mem(bytes).map_err(io_error)?;
        let header = header_of(&decompress);
        check(&header)?;
        // Before libjpeg decodes (or allocates) anything.
        let scans = count_scans(bytes);
        let allowed = max_scans(header.width, header.height);
        if scans > allowed {
            return Err(PreprocessError::DecodeLimitExceeded(format!(
                "jpeg has {scans} scans, more than the {allowed} accepted at {}x{}",
                header.width, header.height
            )));
        }
        let (out_space, channels) = match header.components {
            1 => (ColorSpace::JCS_GRAYSCALE, 1),
            3 => (ColorSpace::JCS_RGB, 3),
            4 => (ColorSpace::JCS_CMYK, 4),
            other => {
                return Err(PreprocessError::UnsupportedFormat(format!(
                    "jpeg with {other} colour components"
                )));
            }
        };
        let mut started = decompress.to_colorspace(out_space).map_err(io_error)?;
        if (started.width(), started.height()) != (header.width as usize, header.height as usize) {
            return Err(PreprocessError::CorruptImage(
                "jpeg output size differs from its header".into(),
            ));
        }
        let len = (header.width as usize)
            .checked_mul(header.height as usize)
            .and_then(|pixels| pixels.checked_mul(channels))
            .ok_or_else(|| PreprocessError::CorruptImage("jpeg size overflows".into()))?;
        let mut data = super::scratch::sized(buffer, len);
        started
            .read_scanlines_into::<u8>(&mut data)
            .map_err(io_error)?;
        // Reads up to the end-of-image marker; a fatal error there unwinds.
        started.finish().map_err(io_error)?;
        let layout = match channels {
            1 => PixelLayout::Gray,
            3 => PixelLayout::Rgb,
            _ => {
                inverted_cmyk_to_rgb(&mut data);
                PixelLayout::Rgb
            }
        };
        Ok(JpegPixels {
            header,
            layout,
            data,
        })
    })
}

fn header_of<R>(decompress: &Decompress<R>) -> JpegHeader {
    let (width, height) = decompress.size();
    JpegHeader {
        // libjpeg's dimensions are 16-bit in the file.
        width: u32::try_from(width).unwrap_or(u32::MAX),
        height: u32::try_from(height).unwrap_or(u32::MAX),
        components: decompress.components().len(),
    }
}

/// Runs `work`, turning libjpeg's fatal errors (which unwind) into errors.
fn guarded<T>(work: impl FnOnce() -> Result<T, PreprocessError>) -> Result<T, PreprocessError> {
    catch_unwind(AssertUnwindSafe(work)).unwrap_or_else(|payload| Err(libjpeg_error(payload)))
}

/// The error for libjpeg's fatal error `payload`; re-raises anything else.
fn libjpeg_error(payload: Box<dyn Any + Send>) -> PreprocessError {
    let message = match payload.downcast::<String>() {
        Ok(message) if message.starts_with(LIBJPEG_FATAL_PREFIX) => message,
        Ok(other) => resume_unwind(other),
        Err(other) => resume_unwind(other),
    };
    let message = message[LIBJPEG_FATAL_PREFIX.len()..].trim().to_string();
    classify(message)
}

/// libjpeg's message texts are its only stable error description here.
/// Valid JPEGs this build does not handle (12-bit or lossless files, odd
/// colour conversions, left-out features) are unsupported; everything else,
/// including "Unsupported marker type" (a byte that is no marker at all), is
/// damage.
fn classify(message: String) -> PreprocessError {
    const UNSUPPORTED_FEATURE: [&str; 4] = [
        "Unsupported JPEG",
        "Unsupported color conversion",
        "not implemented",
        "omitted at compile time",
    ];
    if UNSUPPORTED_FEATURE
        .iter()
        .any(|phrase| message.contains(phrase))
    {
        PreprocessError::UnsupportedFormat(format!("jpeg: {message}"))
    } else {
        PreprocessError::CorruptImage(format!("jpeg: {message}"))
    }
}

fn io_error(error: std::io::Error) -> PreprocessError {
    PreprocessError::CorruptImage(format!("jpeg: {error}"))
}

/// Pillow's `CMYK;I` unpacking followed by its CMYK → RGB conversion, in
/// place: 4 bytes per pixel in, 3 out (the buffer is truncated). Per
/// channel, with `c` and `k` the inverted samples and `nk = 255 - k`:
/// `nk - round(c * nk / 255)` using Pillow's `MULDIV255` rounding.
pub fn inverted_cmyk_to_rgb(data: &mut Vec<u8>) {
    let pixels = data.len() / 4;
    for index in 0..pixels {
        let source = index * 4;
        let not_k = i32::from(data[source + 3]); // 255 - (255 - stored)
        for channel in 0..3 {
            let c = 255 - i32::from(data[source + channel]);
            let product = c * not_k + 128;
            let scaled = ((product >> 8) + product) >> 8;
            data[index * 3 + channel] = (not_k - scaled).clamp(0, 255) as u8;
        }
    }
    data.truncate(pixels * 3);
}

/// Start-of-scan markers in the file, from the first one on. Inside entropy-coded data a 0xFF byte
/// is always followed by 0x00 or a restart marker, and marker segments before
/// the first scan are skipped by length, so every FF DA counted after that
/// starts a scan (an over-count only if a later segment's payload holds FF
/// DA, which only makes the limit stricter for crafted files).
fn count_scans(bytes: &[u8]) -> usize {
    let Some(first) = super::decode::jpeg_first_scan(bytes) else {
        return 0;
    };
    bytes[first..]
        .windows(2)
        .filter(|pair| *pair == [0xFF, 0xDA])
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmyk_conversion_follows_pillow() {
        // Stored (inverted) CMYK → Pillow's RGB, checked against
        // Image.frombytes("CMYK", ..., rawmode="CMYK;I").convert("RGB").
        let mut data = vec![
            255, 255, 255, 255, // no ink: white
            0, 0, 0, 0, // full ink everywhere: black
            255, 255, 255, 0, // only black ink
            0, 255, 127, 255, // full cyan, half yellow
            200, 100, 50, 128, // mixed
        ];
        inverted_cmyk_to_rgb(&mut data);
        assert_eq!(
            data,
            [255, 255, 255, 0, 0, 0, 0, 0, 0, 0, 255, 127, 100, 50, 25]
        );
    }

    #[test]
    fn the_scan_allowance_shrinks_with_the_image_between_its_bounds() {
        assert_eq!(max_scans(640, 480), MAX_SCANS);
        assert_eq!(max_scans(4000, 4000), 100);
        assert_eq!(max_scans(8000, 4000), 50);
        assert_eq!(max_scans(8192, 8192), MIN_SCAN_ALLOWANCE);
        assert_eq!(max_scans(0, 0), MAX_SCANS);
    }

    #[test]
    fn libjpeg_messages_map_to_codes() {
        assert_eq!(
            classify("Unsupported JPEG data precision 12".into()).code(),
            "unsupported_format"
        );
        assert_eq!(
            classify("Unsupported JPEG process: SOF type 0xc3".into()).code(),
            "unsupported_format"
        );
        assert_eq!(
            classify("Bogus marker length".into()).code(),
            "corrupt_image"
        );
        // Found by the fuzzer: a stray byte after FF is damage, not a format.
        assert_eq!(
            classify("Unsupported marker type 0x3a".into()).code(),
            "corrupt_image"
        );
    }

    #[test]
    fn other_panics_are_not_swallowed() {
        let outcome = catch_unwind(|| guarded::<()>(|| resume_unwind(Box::new("a bug"))));
        assert!(outcome.is_err(), "a non-libjpeg panic must propagate");
        let outcome = guarded::<()>(|| {
            resume_unwind(Box::new(format!(
                "{LIBJPEG_FATAL_PREFIX}Bogus marker length"
            )))
        });
        assert_eq!(outcome.expect_err("libjpeg error").code(), "corrupt_image");
    }
}
