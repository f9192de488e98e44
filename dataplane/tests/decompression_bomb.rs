//! Images whose headers claim enormous sizes are refused from the header
//! alone, before anything the size of the image is allocated.
//!
//! This file is its own test binary with a single test because it installs a
//! global allocator that records the peak of live heap bytes: other tests
//! running beside it would move that peak.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use smg_dataplane::preprocess::{ImageLimits, Qwen2VlImageProcessor, VisionPreprocessConfig};
use smg_shared::tensor::DType;

/// Forwards to the system allocator and tracks live and peak bytes.
struct PeakTrackingAllocator;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static PEAK_BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to `System` with the caller's own arguments,
// so `System`'s guarantees carry over; the counters do not touch the memory.
unsafe impl GlobalAlloc for PeakTrackingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract for `layout`.
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            let live = LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK_BYTES.fetch_max(live, Ordering::Relaxed);
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: the caller passes a pointer this allocator returned for `layout`.
        unsafe { System.dealloc(pointer, layout) };
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: PeakTrackingAllocator = PeakTrackingAllocator;

/// Heap growth above which a refusal counts as "allocated for the image".
const ALLOWED_PEAK_GROWTH: usize = 1 << 20;

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn png_chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut chunk = (data.len() as u32).to_be_bytes().to_vec();
    chunk.extend_from_slice(kind);
    chunk.extend_from_slice(data);
    let mut covered = kind.to_vec();
    covered.extend_from_slice(data);
    chunk.extend_from_slice(&crc32(&covered).to_be_bytes());
    chunk
}

/// A valid-looking PNG announcing `width x height` RGB pixels, with a tiny
/// (far too short) compressed body.
fn png_claiming(width: u32, height: u32) -> Vec<u8> {
    let mut header = width.to_be_bytes().to_vec();
    header.extend_from_slice(&height.to_be_bytes());
    header.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit RGB, deflate, no interlace
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend(png_chunk(b"IHDR", &header));
    // zlib stream of one stored empty block.
    png.extend(png_chunk(
        b"IDAT",
        &[0x78, 0x01, 0x01, 0x00, 0x00, 0xFF, 0xFF, 0, 0, 0, 1],
    ));
    png.extend(png_chunk(b"IEND", &[]));
    png
}

/// A committed JPEG with its frame header (`FF frame_marker`: C0 baseline,
/// C2 progressive) rewritten to 65000x65000.
fn jpeg_claiming_65000_square(fixture: &str, frame_marker: u8) -> Vec<u8> {
    let path = format!(
        "{}/tests/fixtures/images/{fixture}",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut jpeg = std::fs::read(path).expect("fixture jpeg");
    let sof = jpeg
        .windows(2)
        .position(|pair| pair == [0xFF, frame_marker])
        .expect("frame header");
    // Marker (2), length (2), precision (1), then height and width.
    jpeg[sof + 5..sof + 7].copy_from_slice(&65000u16.to_be_bytes());
    jpeg[sof + 7..sof + 9].copy_from_slice(&65000u16.to_be_bytes());
    jpeg
}

/// A lossless WebP header announcing 16000x16000 (near the format's 16384
/// maximum, which image-webp 0.2 misreads as 0).
fn webp_claiming_16000_square() -> Vec<u8> {
    let (width, height) = (16000u32, 16000u32);
    let bits = (width - 1) | ((height - 1) << 14); // alpha and version bits zero
    let mut payload = vec![0x2F];
    payload.extend_from_slice(&bits.to_le_bytes());
    payload.extend_from_slice(&[0; 16]);
    let mut webp = b"RIFF".to_vec();
    webp.extend_from_slice(&((4 + 8 + payload.len()) as u32).to_le_bytes());
    webp.extend_from_slice(b"WEBPVP8L");
    webp.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    webp.extend_from_slice(&payload);
    webp
}

#[test]
fn oversized_headers_are_refused_without_allocating_the_image() {
    let model_dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/model");
    let config = VisionPreprocessConfig::from_model_dir(&model_dir).expect("model config");
    let processor =
        Qwen2VlImageProcessor::new(config, ImageLimits::default()).expect("valid config");

    let bombs = [
        (
            "png 100000x100000",
            png_claiming(100_000, 100_000),
            (100_000, 100_000),
        ),
        (
            "jpeg 65000x65000",
            jpeg_claiming_65000_square("photo_640x480.jpg", 0xC0),
            (65_000, 65_000),
        ),
        (
            "progressive jpeg 65000x65000",
            jpeg_claiming_65000_square("progressive_333x517.jpg", 0xC2),
            (65_000, 65_000),
        ),
        (
            "webp 16000x16000",
            webp_claiming_16000_square(),
            (16_000, 16_000),
        ),
    ];
    for (name, bytes, (width, height)) in bombs {
        let baseline = LIVE_BYTES.load(Ordering::Relaxed);
        PEAK_BYTES.store(baseline, Ordering::Relaxed);

        let error = processor
            .plan(&bytes, DType::BFloat16)
            .expect_err("plan must refuse");
        assert_eq!(error.code(), "image_too_large", "{name}: {error}");
        assert!(
            error.to_string().contains(&format!("{width}x{height}")),
            "{name}: {error}"
        );
        let error = processor
            .preprocess(&bytes, DType::Float32)
            .expect_err("preprocess must refuse");
        assert_eq!(error.code(), "image_too_large", "{name}: {error}");

        let growth = PEAK_BYTES.load(Ordering::Relaxed) - baseline;
        assert!(
            growth < ALLOWED_PEAK_GROWTH,
            "{name}: heap peaked {growth} bytes above the baseline while refusing"
        );
    }

    // The instrument works: a real image's decode and tensor do show up.
    let baseline = LIVE_BYTES.load(Ordering::Relaxed);
    PEAK_BYTES.store(baseline, Ordering::Relaxed);
    let real = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/images/photo_640x480.jpg"
    ))
    .expect("fixture jpeg");
    let image = processor
        .preprocess(&real, DType::Float32)
        .expect("real image");
    let growth = PEAK_BYTES.load(Ordering::Relaxed) - baseline;
    assert!(
        growth >= image.data.len() + 640 * 480 * 3,
        "peak growth {growth} should cover the tensor and the decoded image"
    );
    drop(image);

    // The same header under the cap is planned (and only then would decode).
    let modest = png_claiming(64, 48);
    let plan = processor
        .plan(&modest, DType::BFloat16)
        .expect("small header plans");
    assert_eq!(plan.image_grid_thw(), [1, 4, 4]);
    let error = processor
        .preprocess(&modest, DType::BFloat16)
        .expect_err("its body is too short");
    assert_eq!(error.code(), "corrupt_image", "{error}");
}
