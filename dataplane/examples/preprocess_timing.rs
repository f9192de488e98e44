//! Rough single-core timing of the Qwen2-VL image kernel on one file:
//! decode alone, then `write_into` (decode + resize + normalize + patchify)
//! into a reused destination buffer, as a data-plane core would.
//!
//!     cargo run --release -p smg-dataplane --example preprocess_timing -- IMAGE [bf16|f32] [MODEL_DIR]
//!
//! Machines are shared and noisy: read the minimum and median, not the mean.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use smg_dataplane::preprocess::decode::{self, ImageLimits};
use smg_dataplane::preprocess::{Qwen2VlImageProcessor, VisionPreprocessConfig};
use smg_shared::tensor::DType;

const ROUNDS: usize = 15;

fn summarize(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "{name:<28} min {:>7.2} ms   median {:>7.2} ms",
        samples[0].as_secs_f64() * 1e3,
        samples[samples.len() / 2].as_secs_f64() * 1e3
    );
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let image = args
        .next()
        .ok_or("usage: preprocess_timing IMAGE [bf16|f32] [MODEL_DIR]")?;
    let dtype = match args.next().as_deref() {
        Some("f32") => DType::Float32,
        _ => DType::BFloat16,
    };
    let model_dir = args.next().map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/model")
    });
    let bytes = std::fs::read(&image)?;
    let config = VisionPreprocessConfig::from_model_dir(&model_dir)?;
    let processor = Qwen2VlImageProcessor::new(config, ImageLimits::default())?;
    let plan = processor.plan(&bytes, dtype)?;
    println!(
        "{image}: {}x{} -> {}x{}, out {:?} {dtype} ({:.1} MB)",
        plan.source_width,
        plan.source_height,
        plan.resized_width,
        plan.resized_height,
        plan.out_shape,
        plan.out_bytes as f64 / 1e6
    );

    let mut decode_times = Vec::new();
    for _ in 0..ROUNDS {
        let start = Instant::now();
        let decoded = decode::decode(&bytes, processor.limits())?;
        decode_times.push(start.elapsed());
        drop(decoded);
    }
    summarize("decode", decode_times);

    let mut dst = vec![0u8; plan.out_bytes];
    processor.write_into(&plan, &bytes, &mut dst)?; // warm the destination pages
    let mut write_times = Vec::new();
    for _ in 0..ROUNDS {
        let start = Instant::now();
        processor.write_into(&plan, &bytes, &mut dst)?;
        write_times.push(start.elapsed());
    }
    summarize("write_into (warm buffer)", write_times);
    Ok(())
}
