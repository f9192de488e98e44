//! Small files that ask a decoder for far more than their pixels: PNG
//! metadata chunks that inflate to hundreds of megabytes, chunks the PNG
//! decoder would keep in memory, JPEGs whose scans repeat. Each must be
//! refused with `decode_limit_exceeded` by the limit named in its message,
//! while the test thread's heap stays small; files that only come close to
//! a limit still decode.
//!
//! The heap is measured per thread (the allocator below counts each
//! thread's own allocations), so these tests can run side by side.

#![allow(clippy::unwrap_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write;
use std::path::Path;

use smg_dataplane::preprocess::decode::{MAX_PNG_METADATA_CHUNK, MAX_PNG_METADATA_TOTAL};
use smg_dataplane::preprocess::jpeg::max_scans;
use smg_dataplane::preprocess::{
    ImageLimits, PreprocessError, Qwen2VlImageProcessor, VisionPreprocessConfig,
};
use smg_shared::tensor::DType;

/// Forwards to the system allocator and counts, per thread, the live heap
/// bytes this thread allocated and their peak.
struct PerThreadPeak;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn record(delta: isize) {
    // `try_with`: allocations during thread teardown go uncounted.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: every method forwards to `System` with the caller's own
// arguments, so `System`'s guarantees carry over; the counters never touch
// the memory.
unsafe impl GlobalAlloc for PerThreadPeak {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract.
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            record(layout.size() as isize);
        }
        pointer
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let pointer = unsafe { System.alloc_zeroed(layout) };
        if !pointer.is_null() {
            record(layout.size() as isize);
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: the caller passes a pointer this allocator returned for `layout`.
        unsafe { System.dealloc(pointer, layout) };
        record(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract.
        let moved = unsafe { System.realloc(pointer, layout, new_size) };
        if !moved.is_null() {
            record(new_size as isize - layout.size() as isize);
        }
        moved
    }
}

#[global_allocator]
static ALLOCATOR: PerThreadPeak = PerThreadPeak;

/// Runs `work` and returns its result with how far this thread's heap rose
/// above where it started.
fn peak_growth<T>(work: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|peak| peak.set(base));
    let result = work();
    let growth = PEAK.with(Cell::get) - base;
    (result, growth.max(0) as usize)
}

/// Heap a refusal may use: a few buffers, never the bomb.
const REFUSAL_HEAP: usize = 4 << 20;

fn processor() -> Qwen2VlImageProcessor {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/model");
    let config = VisionPreprocessConfig::from_model_dir(&dir).unwrap();
    Qwen2VlImageProcessor::new(config, ImageLimits::default()).unwrap()
}

fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/images")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

fn preprocess(bytes: &[u8]) -> Result<Vec<u8>, PreprocessError> {
    processor()
        .preprocess(bytes, DType::BFloat16)
        .map(|image| image.data)
}

/// Preprocesses `bytes`, expecting `decode_limit_exceeded` with `phrase` in
/// its message, within [`REFUSAL_HEAP`] of this thread's heap.
fn assert_refused(bytes: &[u8], phrase: &str, what: &str) {
    let processor = processor();
    let (outcome, growth) = peak_growth(|| processor.preprocess(bytes, DType::BFloat16));
    let error = match outcome {
        Ok(_) => panic!("{what}: preprocessed without error"),
        Err(error) => error,
    };
    assert_eq!(error.code(), "decode_limit_exceeded", "{what}: {error}");
    assert!(error.is_image_error(), "{what}");
    assert!(error.to_string().contains(phrase), "{what}: {error}");
    assert!(
        growth < REFUSAL_HEAP,
        "{what}: the heap rose {growth} bytes while refusing"
    );
}

/// `len` zero bytes, zlib-compressed (about a thousandth of `len`).
fn zlib_of_zeros(len: usize) -> Vec<u8> {
    let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    let block = vec![0u8; 1 << 16];
    let mut left = len;
    while left > 0 {
        let n = left.min(block.len());
        encoder.write_all(&block[..n]).unwrap();
        left -= n;
    }
    encoder.finish().unwrap()
}

fn png_chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut chunk = (data.len() as u32).to_be_bytes().to_vec();
    chunk.extend_from_slice(kind);
    chunk.extend_from_slice(data);
    let mut crc = flate2::Crc::new();
    crc.update(kind);
    crc.update(data);
    chunk.extend_from_slice(&crc.sum().to_be_bytes());
    chunk
}

/// A committed PNG with `chunks` inserted right after its IHDR.
fn png_with(chunks: &[Vec<u8>]) -> Vec<u8> {
    let png = fixture("tiny_20x20.png");
    // Signature (8), then IHDR: length, type, 13 bytes, CRC.
    let after_ihdr = 8 + 4 + 4 + 13 + 4;
    assert_eq!(&png[12..16], b"IHDR");
    let mut out = png[..after_ihdr].to_vec();
    for chunk in chunks {
        out.extend_from_slice(chunk);
    }
    out.extend_from_slice(&png[after_ihdr..]);
    out
}

fn iccp(profile_zlib: &[u8]) -> Vec<u8> {
    let mut data = b"bomb\0\0".to_vec(); // name, NUL, method 0 (zlib)
    data.extend_from_slice(profile_zlib);
    png_chunk(b"iCCP", &data)
}

fn ztxt(text_zlib: &[u8]) -> Vec<u8> {
    let mut data = b"Comment\0\0".to_vec();
    data.extend_from_slice(text_zlib);
    png_chunk(b"zTXt", &data)
}

fn itxt_compressed(text_zlib: &[u8]) -> Vec<u8> {
    // keyword NUL, compressed, method 0, language NUL, translated NUL.
    let mut data = b"Comment\0\x01\0en\0\0".to_vec();
    data.extend_from_slice(text_zlib);
    png_chunk(b"iTXt", &data)
}

#[test]
fn a_png_colour_profile_that_inflates_to_256_mib_is_refused_within_a_small_heap() {
    let bomb = zlib_of_zeros(256 << 20);
    assert!(bomb.len() < 512 << 10, "{} compressed bytes", bomb.len());
    assert_refused(
        &png_with(&[iccp(&bomb)]),
        "iCCP chunk inflates to more than 1048576 bytes",
        "iCCP bomb",
    );
}

#[test]
fn compressed_png_text_chunks_are_capped_like_the_profile() {
    let bomb = zlib_of_zeros(64 << 20);
    assert_refused(
        &png_with(&[ztxt(&bomb)]),
        "zTXt chunk inflates",
        "zTXt bomb",
    );
    assert_refused(
        &png_with(&[itxt_compressed(&bomb)]),
        "iTXt chunk inflates",
        "iTXt bomb",
    );
    // Each chunk under its cap, all of them together over the total.
    let chunk = ztxt(&zlib_of_zeros(MAX_PNG_METADATA_CHUNK as usize));
    let count = (MAX_PNG_METADATA_TOTAL / MAX_PNG_METADATA_CHUNK) as usize + 1;
    assert_refused(
        &png_with(&vec![chunk; count]),
        "metadata chunks hold more than",
        "many text chunks",
    );
}

#[test]
fn a_png_chunk_the_decoder_would_keep_is_refused_by_its_allocation_limit() {
    // eXIf is kept in memory by the decoder; 20 MiB of it is beyond the
    // decoder's allowance, whatever the (20x20) pixel count.
    let exif = png_chunk(b"eXIf", &vec![0u8; 20 << 20]);
    let error = preprocess(&png_with(&[exif])).expect_err("refused");
    assert_eq!(error.code(), "decode_limit_exceeded", "{error}");
    assert!(
        error.to_string().contains("png decoder needs more than"),
        "{error}"
    );
}

#[test]
fn metadata_within_the_caps_is_skipped_and_the_pixels_are_unchanged() {
    let plain = preprocess(&fixture("tiny_20x20.png")).unwrap();
    let profile = zlib_of_zeros(600 << 10);
    let text = zlib_of_zeros(MAX_PNG_METADATA_CHUNK as usize);
    let with_metadata = png_with(&[
        iccp(&profile),
        ztxt(&text),
        itxt_compressed(&text),
        png_chunk(b"tEXt", b"Software\0a test"),
        png_chunk(b"eXIf", &[0u8; 4096]),
    ]);
    assert_eq!(preprocess(&with_metadata).unwrap(), plain);
}

/// The progressive fixture with its last scan repeated until the file has
/// `total` scans. libjpeg decodes a repeated scan again (with a warning),
/// so each copy costs a full pass over the image.
fn progressive_with_scans(total: usize) -> Vec<u8> {
    let jpeg = fixture("progressive_333x517.jpg");
    let starts: Vec<usize> = jpeg
        .windows(2)
        .enumerate()
        .filter(|(_, pair)| *pair == [0xFF, 0xDA])
        .map(|(at, _)| at)
        .collect();
    let end = jpeg.len() - 2;
    assert_eq!(jpeg[end..], [0xFF, 0xD9]);
    assert!(starts.len() > 1 && starts.len() <= total, "{starts:?}");
    let last_scan = &jpeg[starts[starts.len() - 1]..end];
    let mut out = jpeg[..end].to_vec();
    for _ in starts.len()..total {
        out.extend_from_slice(last_scan);
    }
    out.extend_from_slice(&[0xFF, 0xD9]);
    out
}

#[test]
fn a_progressive_jpeg_with_repeated_scans_is_refused_past_its_scan_budget() {
    let allowed = max_scans(333, 517);
    assert_eq!(allowed, 100);
    assert_refused(
        &progressive_with_scans(allowed + 50),
        &format!("scans, more than the {allowed} accepted at 333x517"),
        "repeated scans",
    );
}

#[test]
fn a_progressive_jpeg_within_its_scan_budget_still_decodes() {
    let plain = preprocess(&fixture("progressive_333x517.jpg")).unwrap();
    // libjpeg warns about each repeated scan and decodes it again; at the
    // budget the file is still decoded, into a tensor of the same shape.
    let repeated = preprocess(&progressive_with_scans(max_scans(333, 517))).unwrap();
    assert_eq!(repeated.len(), plain.len());
}

fn webp_chunk(fourcc: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut chunk = fourcc.to_vec();
    chunk.extend_from_slice(&(data.len() as u32).to_le_bytes());
    chunk.extend_from_slice(data);
    if data.len() % 2 == 1 {
        chunk.push(0);
    }
    chunk
}

fn webp(chunks: &[Vec<u8>]) -> Vec<u8> {
    let body: Vec<u8> = chunks.concat();
    let mut out = b"RIFF".to_vec();
    out.extend_from_slice(&((4 + body.len()) as u32).to_le_bytes());
    out.extend_from_slice(b"WEBP");
    out.extend_from_slice(&body);
    out
}

/// An extended-format header for a `width` x `height` canvas, no flags.
fn vp8x(width: u32, height: u32) -> Vec<u8> {
    let mut data = vec![0u8; 4];
    data.extend_from_slice(&(width - 1).to_le_bytes()[..3]);
    data.extend_from_slice(&(height - 1).to_le_bytes()[..3]);
    webp_chunk(b"VP8X", &data)
}

/// The committed lossy WebP's VP8 bitstream, its frame header claiming
/// `width` x `height`.
fn vp8_claiming(width: u16, height: u16) -> Vec<u8> {
    let file = fixture("lossy_320x240.webp");
    assert_eq!(&file[12..16], b"VP8 ");
    let len = u32::from_le_bytes([file[16], file[17], file[18], file[19]]) as usize;
    let mut data = file[20..20 + len].to_vec();
    // Frame tag (3), start code (3), then 14-bit width and height.
    assert_eq!(data[3..6], [0x9d, 0x01, 0x2a]);
    data[6..8].copy_from_slice(&width.to_le_bytes());
    data[8..10].copy_from_slice(&height.to_le_bytes());
    webp_chunk(b"VP8 ", &data)
}

#[test]
fn a_webp_bitstream_larger_than_its_small_canvas_is_refused_before_its_buffers_exist() {
    let processor = processor();
    // The header (a 16x16 canvas) passes the pixel cap; the bitstream
    // inside claims 16383x16383, 400 MB of decoder buffers.
    let bytes = webp(&[vp8x(16, 16), vp8_claiming(16383, 16383)]);
    let (outcome, growth) = peak_growth(|| processor.preprocess(&bytes, DType::BFloat16));
    let error = outcome.expect_err("refused");
    assert!(
        growth < REFUSAL_HEAP,
        "the heap rose {growth} bytes while refusing ({error})"
    );
    assert_eq!(error.code(), "corrupt_image", "{error}");
    assert!(error.to_string().contains("16383x16383"), "{error}");
    // The same bitstream under a canvas of its own size decodes.
    let consistent = webp(&[vp8x(320, 240), vp8_claiming(320, 240)]);
    let plain = preprocess(&fixture("lossy_320x240.webp")).unwrap();
    assert_eq!(preprocess(&consistent).unwrap(), plain);
}
