//! Arbitrary bytes through the image kernel exactly as the data plane runs
//! it: header-only `plan`, then `write_into` a buffer of the planned size,
//! plus the bare decoder. Any panic, abort, sanitizer report or runaway
//! allocation is a bug; errors are fine as long as their code is one of the
//! documented ones and decoding agrees with the header it planned from.

use std::sync::OnceLock;

use smg_dataplane::preprocess::decode::{self, ImageLimits};
use smg_dataplane::preprocess::{Qwen2VlImageProcessor, VisionPreprocessConfig};
use smg_shared::tensor::DType;

fn processor() -> &'static Qwen2VlImageProcessor {
    static PROCESSOR: OnceLock<Qwen2VlImageProcessor> = OnceLock::new();
    PROCESSOR.get_or_init(|| {
        let mut config = VisionPreprocessConfig::from_json(
            include_str!("../../tests/fixtures/model/preprocessor_config.json"),
            Some(include_str!("../../tests/fixtures/model/config.json")),
        )
        .expect("fixture config");
        // Small tensors keep executions fast; the decoders still see any
        // size up to the cap below.
        config.max_pixels = 128 * 28 * 28;
        let limits = ImageLimits {
            max_source_pixels: 2048 * 2048,
            ..ImageLimits::default()
        };
        Qwen2VlImageProcessor::new(config, limits).expect("valid config")
    })
}

/// One input, as the fuzz target runs it.
pub fn run(data: &[u8]) {
    let processor = processor();
    let header = decode::read_header(data, processor.limits());
    match decode::decode(data, processor.limits()) {
        Ok(image) => {
            let pixels = image.pixels().expect("decoded buffer matches its size");
            let header = header.expect("a decodable image has a readable header");
            assert_eq!(
                (pixels.width(), pixels.height()),
                (header.width as usize, header.height as usize),
                "decoded size differs from the header"
            );
        }
        Err(error) => assert!(error.is_image_error(), "{error}"),
    }
    for dtype in [DType::BFloat16, DType::Float32] {
        let plan = match processor.plan(data, dtype) {
            Ok(plan) => plan,
            Err(error) => {
                assert!(error.is_image_error(), "{error}");
                return;
            }
        };
        let mut dst = vec![0u8; plan.out_bytes];
        if let Err(error) = processor.write_into(&plan, data, &mut dst) {
            assert!(error.is_image_error(), "{error}");
        }
    }
}
