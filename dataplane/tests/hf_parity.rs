//! Parity with Hugging Face's `Qwen2VLImageProcessor` (transformers 4.57,
//! Pillow 13) on the committed fixture images.
//!
//! The goldens come from `benches/parity/make_qwen2vl_goldens.py`; see it for
//! how to regenerate them. Per case this checks the exact shape and grid, the
//! tensor's checksums, 64 sampled values, and for the two smallest cases every
//! value. It also checks the two intermediate fingerprints the script records
//! (PIL's decoded RGB and its bicubic resize), which must be bit-identical
//! for every format, JPEG included.
//!
//! Run with `--nocapture` to see the per-case error table.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use smg_dataplane::preprocess::decode::{self, ImageLimits};
use smg_dataplane::preprocess::resize::resize_to_rgb8;
use smg_dataplane::preprocess::{Qwen2VlImageProcessor, VisionPreprocessConfig};
use smg_shared::tensor::DType;

/// How close a case must come to Hugging Face's output.
#[derive(Debug, Clone, Copy)]
struct Tolerance {
    /// Largest |ours - HF| over the compared values, in normalized units
    /// (one uint8 step is 1 / (255 * std), 0.0142 to 0.0150 with CLIP's std).
    max_abs: f64,
    /// Largest mean |ours - HF| over the compared values.
    mean_abs: f64,
    /// Largest |sum - HF sum| / (HF sum of |values|) over the whole tensor.
    checksum_relative: f64,
    /// Whether the decoded pixels, the resize and every compared value must
    /// be bit-identical to PIL's / HF's.
    exact: bool,
}

/// Every case, whatever its format: the bounds (max abs error 0.02,
/// mean 1e-3, in normalized units), and beyond them bit-identity. JPEG goes
/// through libjpeg-turbo set up as Pillow sets it, PNG and WebP decode
/// losslessly or bit-exactly, and everything after decoding reproduces PIL
/// and numpy exactly, so nothing may differ; a drift in any stage fails here
/// with the stage named (decoded pixels, resize, values).
const TOLERANCE: Tolerance = Tolerance {
    max_abs: 0.02,
    mean_abs: 1e-3,
    checksum_relative: 1e-6,
    exact: true,
};

#[derive(Debug, Deserialize)]
struct Goldens {
    versions: serde_json::Value,
    cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
struct Case {
    name: String,
    file: String,
    overrides: Overrides,
    pil_mode: String,
    source_size: [u32; 2],
    resized_size: [u32; 2],
    shape: [u32; 2],
    image_grid_thw: [u32; 3],
    sum: f64,
    abs_sum: f64,
    decoded_rgb_u8_sum: u64,
    resized_rgb_u8_fingerprint: u64,
    samples: Vec<(usize, usize, f64)>,
    full_f32_le_base64: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Overrides {
    min_pixels: Option<u64>,
    max_pixels: Option<u64>,
    patch_size: Option<u32>,
    image_mean: Option<[f64; 3]>,
    image_std: Option<[f64; 3]>,
}

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn load_goldens() -> Goldens {
    let path = fixtures_dir().join("qwen2vl_goldens.json");
    let text = std::fs::read_to_string(&path).expect("goldens are committed");
    serde_json::from_str(&text).expect("goldens parse")
}

fn config_for(overrides: &Overrides) -> VisionPreprocessConfig {
    let model_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/model");
    let mut config = VisionPreprocessConfig::from_model_dir(&model_dir).expect("model config");
    if let Some(v) = overrides.min_pixels {
        config.min_pixels = v;
    }
    if let Some(v) = overrides.max_pixels {
        config.max_pixels = v;
    }
    if let Some(v) = overrides.patch_size {
        config.patch_size = v;
    }
    if let Some(v) = overrides.image_mean {
        config.image_mean = v;
    }
    if let Some(v) = overrides.image_std {
        config.image_std = v;
    }
    config
}

/// Standard base64 (with padding) to bytes.
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    for quad in text.as_bytes().chunks(4) {
        let digits: Vec<u8> = quad.iter().copied().filter(|&c| c != b'=').collect();
        let bits = digits
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &c)| acc | value(c) << (18 - 6 * i));
        let bytes = bits.to_be_bytes();
        out.extend_from_slice(&bytes[1..digits.len()]);
    }
    out
}

fn f32_values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The script's order-sensitive checksum: sum(v * (i % 251 + 1)).
fn u8_fingerprint(rgb: &[u8]) -> u64 {
    rgb.iter()
        .enumerate()
        .map(|(i, &v)| u64::from(v) * (i as u64 % 251 + 1))
        .sum()
}

#[derive(Debug, Default)]
struct Errors {
    count: usize,
    max: f64,
    total: f64,
}

impl Errors {
    fn add(&mut self, ours: f64, theirs: f64) {
        let error = (ours - theirs).abs();
        self.count += 1;
        self.total += error;
        self.max = self.max.max(error);
    }

    fn mean(&self) -> f64 {
        self.total / self.count.max(1) as f64
    }
}

struct Report {
    name: String,
    samples: Errors,
    full: Option<Errors>,
    checksum_relative_error: f64,
    resize_bit_exact: bool,
    decode_matches: bool,
}

fn check_case(case: &Case) -> Report {
    let bytes = std::fs::read(fixtures_dir().join(&case.file)).expect("fixture image");
    let processor = Qwen2VlImageProcessor::new(config_for(&case.overrides), ImageLimits::default())
        .expect("valid config");
    let image = processor
        .preprocess(&bytes, DType::Float32)
        .unwrap_or_else(|error| panic!("{}: {error}", case.name));
    let plan = &image.plan;
    assert_eq!(
        [plan.source_width, plan.source_height],
        case.source_size,
        "{}",
        case.name
    );
    assert_eq!(
        [plan.resized_width, plan.resized_height],
        case.resized_size,
        "{}",
        case.name
    );
    assert_eq!(plan.out_shape, case.shape, "{}: shape", case.name);
    assert_eq!(
        plan.image_grid_thw(),
        case.image_grid_thw,
        "{}: grid",
        case.name
    );
    let merge = processor.config().merge_size;
    assert_eq!(
        plan.tokens,
        case.shape[0] / (merge * merge),
        "{}: tokens",
        case.name
    );

    let values = f32_values(&image.data);
    let width = case.shape[1] as usize;
    let sum: f64 = values.iter().map(|&v| f64::from(v)).sum();
    let checksum_relative_error = (sum - case.sum).abs() / case.abs_sum;
    let abs_sum: f64 = values.iter().map(|&v| f64::from(v).abs()).sum();
    assert!(
        (abs_sum - case.abs_sum).abs() / case.abs_sum < 1e-3,
        "{}: abs sum {abs_sum} vs {}",
        case.name,
        case.abs_sum
    );

    let mut samples = Errors::default();
    for &(row, col, expected) in &case.samples {
        // The goldens hold f32 values; compare them as f32.
        samples.add(
            f64::from(values[row * width + col]),
            f64::from(expected as f32),
        );
    }
    let full = case.full_f32_le_base64.as_deref().map(|encoded| {
        let expected = f32_values(&base64_decode(encoded));
        assert_eq!(expected.len(), values.len(), "{}: full tensor", case.name);
        let mut errors = Errors::default();
        for (&ours, &theirs) in values.iter().zip(&expected) {
            errors.add(f64::from(ours), f64::from(theirs));
        }
        errors
    });

    // Intermediate fingerprints: our decode, and our resize of it.
    let decoded = decode::decode(&bytes, &ImageLimits::default()).expect("decode");
    let pixels = decoded.pixels().expect("pixels");
    let rgb = resize_to_rgb8(pixels, pixels.width(), pixels.height());
    let rgb_sum: u64 = rgb.iter().map(|&v| u64::from(v)).sum();
    let resized = resize_to_rgb8(
        pixels,
        case.resized_size[0] as usize,
        case.resized_size[1] as usize,
    );
    Report {
        name: case.name.clone(),
        samples,
        full,
        checksum_relative_error,
        resize_bit_exact: u8_fingerprint(&resized) == case.resized_rgb_u8_fingerprint,
        decode_matches: rgb_sum == case.decoded_rgb_u8_sum,
    }
}

#[test]
fn matches_hugging_face_qwen2_vl_processor() {
    let goldens = load_goldens();
    assert!(goldens.cases.len() >= 21, "goldens hold every fixture");
    println!("goldens from {}", goldens.versions);
    println!(
        "{:<36} {:>9} {:>9} {:>9} {:>9} {:>9}  decode  resize",
        "case", "smp max", "smp mean", "full max", "full mean", "sum rel"
    );
    let mut failures = Vec::new();
    for case in &goldens.cases {
        let report = check_case(case);
        let (full_max, full_mean) = report
            .full
            .as_ref()
            .map_or(("-".to_string(), "-".to_string()), |e| {
                (format!("{:.2e}", e.max), format!("{:.2e}", e.mean()))
            });
        println!(
            "{:<36} {:>9.2e} {:>9.2e} {:>9} {:>9} {:>9.2e}  {:<6}  {}",
            report.name,
            report.samples.max,
            report.samples.mean(),
            full_max,
            full_mean,
            report.checksum_relative_error,
            if report.decode_matches {
                "same"
            } else {
                "differs"
            },
            if report.resize_bit_exact {
                "exact"
            } else {
                "differs"
            },
        );
        let tolerance = TOLERANCE;
        let mut check = |ok: bool, what: &str| {
            if !ok {
                failures.push(format!("{}: {what}", report.name));
            }
        };
        for errors in std::iter::once(&report.samples).chain(report.full.as_ref()) {
            check(errors.max <= tolerance.max_abs, "max abs error");
            check(errors.mean() <= tolerance.mean_abs, "mean abs error");
            if tolerance.exact {
                check(errors.max == 0.0, "values must match exactly");
            }
        }
        check(
            report.checksum_relative_error <= tolerance.checksum_relative,
            "checksum",
        );
        if tolerance.exact {
            check(report.decode_matches, "decoded pixels differ from PIL's");
            check(report.resize_bit_exact, "resize differs from PIL's");
        }
    }
    assert!(failures.is_empty(), "parity failures: {failures:#?}");
}

#[test]
fn goldens_cover_the_promised_shapes() {
    let goldens = load_goldens();
    let shape_of = |name: &str| {
        goldens
            .cases
            .iter()
            .find(|case| case.name == name)
            .map(|case| (case.shape, case.image_grid_thw))
    };
    assert_eq!(shape_of("photo_640x480"), Some(([1564, 1176], [1, 34, 46])));
    assert_eq!(
        shape_of("photo_1920x1080"),
        Some(([10764, 1176], [1, 78, 138]))
    );
    let modes: Vec<&str> = goldens.cases.iter().map(|c| c.pil_mode.as_str()).collect();
    for mode in ["RGB", "RGBA", "L", "P", "I;16", "CMYK"] {
        assert!(modes.contains(&mode), "a {mode} fixture");
    }
    // The list: odd sizes, tiny images, grayscale, RGBA/transparent,
    // EXIF rotation, a tall panorama; and JPEG's variants (progressive,
    // chroma subsampling 4:2:2 and 4:4:4, gray, CMYK).
    for name in [
        "odd_333x517",
        "tiny_20x20",
        "tiny_jpeg_9x7",
        "gray_257x193",
        "gray_jpeg_211x157",
        "rgba_150x100",
        "transparent_64x48",
        "exif_rot90_200x120",
        "panorama_300x2400",
        "progressive_333x517",
        "subsampled_422_301x203",
        "full_chroma_444_161x97",
        "cmyk_jpeg_120x90",
    ] {
        assert!(shape_of(name).is_some(), "a {name} case");
    }
    // HF does not apply EXIF orientation to a PIL image it is handed: the
    // stored 200x120 (wide) is what gets resized, not the 120x200 view.
    let rotated = goldens
        .cases
        .iter()
        .find(|case| case.name == "exif_rot90_200x120")
        .expect("exif case");
    assert_eq!(rotated.source_size, [200, 120]);
    assert_eq!(rotated.image_grid_thw, [1, 8, 14]);
}

#[test]
fn base64_decoder_round_trips_known_text() {
    assert_eq!(base64_decode("TWFu"), b"Man");
    assert_eq!(base64_decode("TWE="), b"Ma");
    assert_eq!(base64_decode("TQ=="), b"M");
    assert_eq!(base64_decode(""), b"");
}
