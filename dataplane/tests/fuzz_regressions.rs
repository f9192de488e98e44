//! Inputs the fuzzer (`fuzz/`, target `decode_preprocess`) found or kept,
//! replayed on every `cargo test` with the fuzz target's own checks: no
//! panic, only documented error codes, and a decoded image that agrees with
//! the header it was planned from. Add a crash reproducer by copying it from
//! `fuzz/artifacts/decode_preprocess/` into `tests/fixtures/fuzz/`.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use smg_dataplane::preprocess::decode::{self, ImageLimits};
use smg_dataplane::preprocess::{IMAGE_ERROR_CODES, Qwen2VlImageProcessor, VisionPreprocessConfig};
use smg_shared::tensor::DType;

/// The fuzz target's processor: the test model's config with a small
/// `max_pixels`, and a 2048x2048 source cap.
fn fuzz_processor() -> Qwen2VlImageProcessor {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/model");
    let mut config = VisionPreprocessConfig::from_model_dir(&dir).unwrap();
    config.max_pixels = 128 * 28 * 28;
    let limits = ImageLimits {
        max_source_pixels: 2048 * 2048,
        ..ImageLimits::default()
    };
    Qwen2VlImageProcessor::new(config, limits).unwrap()
}

/// What happened to one input, for the summary assertion.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Tensor,
    Refused(&'static str),
}

fn run_one(processor: &Qwen2VlImageProcessor, name: &str, data: &[u8]) -> Outcome {
    let header = decode::read_header(data, processor.limits());
    match decode::decode(data, processor.limits()) {
        Ok(image) => {
            let pixels = image.pixels().unwrap();
            let header = header.unwrap_or_else(|error| panic!("{name}: decodes, header {error}"));
            assert_eq!(
                (pixels.width(), pixels.height()),
                (header.width as usize, header.height as usize),
                "{name}: decoded size differs from the header"
            );
        }
        Err(error) => assert!(error.is_image_error(), "{name}: {error}"),
    }
    let mut outcome = Outcome::Tensor;
    for dtype in [DType::BFloat16, DType::Float32] {
        let result = processor.plan(data, dtype).and_then(|plan| {
            let mut dst = vec![0u8; plan.out_bytes];
            processor.write_into(&plan, data, &mut dst)
        });
        if let Err(error) = result {
            assert!(error.is_image_error(), "{name}: {error}");
            outcome = Outcome::Refused(error.code());
        }
    }
    outcome
}

#[test]
fn fuzz_inputs_stay_fixed() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fuzz");
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "bin"))
        .collect();
    entries.sort();
    assert!(!entries.is_empty(), "no inputs in {}", dir.display());
    let processor = fuzz_processor();
    for path in entries {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let data = std::fs::read(&path).unwrap();
        // The file name says what the input must come to: `..._ok.bin` a
        // tensor, `..._<code>.bin` that error code.
        let outcome = run_one(&processor, &name, &data);
        let expected = IMAGE_ERROR_CODES
            .iter()
            .find(|code| name.ends_with(&format!("_{code}.bin")))
            .map_or(Outcome::Tensor, |code| Outcome::Refused(code));
        assert_eq!(outcome, expected, "{name}");
    }
}
