//! Single-core throughput of the Qwen2-VL image kernel, split into its
//! stages: JPEG (or PNG/WebP) decode, the bicubic resize, and the rest
//! (rescale + normalize + patchify + encode into the destination), for a
//! 1080p and a 4K photo at Qwen2-VL's default pixel limits.
//!
//!     taskset -c 1 cargo run --release -p smg-dataplane --example preprocess_bench
//!     ... --example preprocess_bench -- [--rounds N] [--dtype bf16|f32] [--gap-ms MS] [IMAGE ...]
//!
//! Without IMAGE arguments it runs the committed 1920x1080 fixture and a
//! 3840x2160 JPEG made from it (upscaled 2x by the kernel's own resampler,
//! then encoded baseline 4:2:0 at quality 85 by libjpeg). Each stage is timed
//! on its own, `rounds` times: decode alone; the resize of an already decoded
//! image, a band of `merge * patch` rows at a time as `write_into` pulls it;
//! and the whole `write_into` into a reused (warm) destination. "rest" is the
//! whole minus decode and resize medians. Each image gets two rows: `fresh`
//! allocates the intermediate buffers (decoded pixels, resampler rows, band)
//! per image, as `write_into` does; `pooled` reuses one `ScratchSpace`, as a
//! data-plane core does (`write_into_with`). Machines are shared and noisy: the
//! table shows medians, the minimum of the whole, and images per second of
//! this thread's CPU time during the whole-kernel rounds (what one core does
//! when it gets the core to itself, short of cache and memory contention).

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The gateway's allocator (`control/main.rs`), so per-image allocations
/// cost here what they cost on a data-plane core.
#[global_allocator]
static GLOBAL_ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use smg_dataplane::preprocess::decode::{self, ImageLimits};
use smg_dataplane::preprocess::resize::{BicubicRgbResampler, resize_to_rgb8};
use smg_dataplane::preprocess::{Qwen2VlImageProcessor, ScratchSpace, VisionPreprocessConfig};
use smg_shared::tensor::DType;

struct Options {
    rounds: usize,
    /// Idle time before each whole-kernel round (a core between images).
    gap: Duration,
    dtype: DType,
    images: Vec<PathBuf>,
}

fn parse_options() -> Result<Options, String> {
    let mut options = Options {
        rounds: 20,
        gap: Duration::ZERO,
        dtype: DType::BFloat16,
        images: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--rounds" => {
                options.rounds = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|&n| n > 0)
                    .ok_or("--rounds takes a positive number")?;
            }
            "--gap-ms" => {
                options.gap = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .map(Duration::from_millis)
                    .ok_or("--gap-ms takes milliseconds")?;
            }
            "--dtype" => {
                options.dtype = match args.next().as_deref() {
                    Some("bf16") => DType::BFloat16,
                    Some("f32") => DType::Float32,
                    _ => return Err("--dtype takes bf16 or f32".into()),
                };
            }
            _ if arg.starts_with("--") => return Err(format!("unknown option {arg}")),
            _ => options.images.push(PathBuf::from(arg)),
        }
    }
    Ok(options)
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn time<T>(rounds: usize, work: impl FnMut() -> T) -> Vec<Duration> {
    time_after_gap(rounds, Duration::ZERO, work)
}

/// As [`time`], idling `gap` (untimed) before each round.
fn time_after_gap<T>(rounds: usize, gap: Duration, mut work: impl FnMut() -> T) -> Vec<Duration> {
    (0..rounds)
        .map(|_| {
            if !gap.is_zero() {
                std::thread::sleep(gap);
            }
            let start = Instant::now();
            std::hint::black_box(work());
            start.elapsed()
        })
        .collect()
}

/// CPU time this thread has used (user + system), from
/// `/proc/thread-self/stat` in clock ticks (100 Hz on Linux). Over many
/// rounds it tells how much of a core the kernel needed, whatever share of
/// the core other processes took meanwhile on a busy machine.
fn thread_cpu_time() -> Option<Duration> {
    const TICKS_PER_SECOND: u64 = 100;
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the parenthesized command name; utime and stime are the
    // 14th and 15th fields overall, the 12th and 13th after it.
    let after_name = &stat[stat.rfind(')')? + 2..];
    let mut fields = after_name.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis(
        (user + system) * 1000 / TICKS_PER_SECOND,
    ))
}

/// Minor page faults this thread has taken (`/proc/thread-self/stat`, the
/// 10th field): fresh pages the kernel had to map, which reused buffers
/// avoid. Unlike times, a count the machine's load does not blur.
fn thread_minor_faults() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    let after_name = &stat[stat.rfind(')')? + 2..];
    after_name.split_whitespace().nth(7)?.parse().ok()
}

fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/images")
        .join(name)
}

/// The 1080p fixture upscaled to 3840x2160 and encoded as a baseline JPEG.
fn make_4k_jpeg(limits: &ImageLimits) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let source = std::fs::read(fixture_path("photo_1920x1080.jpg"))?;
    let decoded = decode::decode(&source, limits)?;
    let pixels = decoded.pixels().ok_or("decoded buffer size")?;
    let (width, height) = (3840, 2160);
    let rgb = resize_to_rgb8(pixels, width, height);
    let mut compress = mozjpeg::Compress::new(mozjpeg::ColorSpace::JCS_RGB);
    compress.set_fastest_defaults();
    compress.set_size(width, height);
    compress.set_quality(85.0);
    let mut started = compress.start_compress(Vec::new())?;
    started.write_scanlines(&rgb)?;
    Ok(started.finish()?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = parse_options()?;
    let model_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/model");
    let config = VisionPreprocessConfig::from_model_dir(&model_dir)?;
    let band_rows = (config.patch_size * config.merge_size) as usize;
    let processor = Qwen2VlImageProcessor::new(config, ImageLimits::default())?;
    let limits = *processor.limits();

    let mut inputs: Vec<(String, Vec<u8>)> = Vec::new();
    if options.images.is_empty() {
        inputs.push((
            "photo_1920x1080.jpg".into(),
            std::fs::read(fixture_path("photo_1920x1080.jpg"))?,
        ));
        inputs.push(("photo_3840x2160.jpg (made)".into(), make_4k_jpeg(&limits)?));
    } else {
        for path in &options.images {
            inputs.push((path.display().to_string(), std::fs::read(path)?));
        }
    }

    println!(
        "rounds {} per stage, output {}, one thread",
        options.rounds, options.dtype
    );
    println!(
        "| image | buffers | resized | out shape | out MB | decode ms | resize ms | rest ms | total ms | min total ms | img/s | out GB/s | img per CPU-s | faults/img |"
    );
    println!("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, bytes) in &inputs {
        let plan = processor.plan(bytes, options.dtype)?;
        let decoded = decode::decode(bytes, &limits)?;
        let pixels = decoded.pixels().ok_or("decoded buffer size")?;
        let (out_width, out_height) = (plan.resized_width as usize, plan.resized_height as usize);
        let mut band = vec![0u8; band_rows * out_width * 3];
        let resize_median = median(time(options.rounds, || {
            let mut resampler = BicubicRgbResampler::new(pixels, out_width, out_height);
            while resampler.remaining_rows() > 0 {
                resampler.write_rows(&mut band);
            }
            band[0]
        }));
        let mut dst = vec![0u8; plan.out_bytes];
        processor.write_into(&plan, bytes, &mut dst)?; // touch the pages once
        for pooled in [false, true] {
            let mut scratch = ScratchSpace::default();
            let mut reused = Vec::new();
            let decode_median = median(time(options.rounds, || {
                if !pooled {
                    return decode::decode(bytes, &limits).map(|image| image.layout());
                }
                let image = decode::decode_into(bytes, &limits, std::mem::take(&mut reused))?;
                let layout = image.layout();
                reused = image.into_buffer();
                Ok(layout)
            }));
            let mut write = || {
                if pooled {
                    processor.write_into_with(&plan, bytes, &mut dst, &mut scratch)
                } else {
                    processor.write_into(&plan, bytes, &mut dst)
                }
            };
            write()?; // warm the scratch space
            let cpu_before = thread_cpu_time();
            let faults_before = thread_minor_faults();
            let totals = time_after_gap(options.rounds, options.gap, &mut write);
            let faults = faults_before
                .zip(thread_minor_faults())
                .map_or("-".to_string(), |(before, after)| {
                    format!("{}", (after - before) / options.rounds as u64)
                });
            let cpu_per_image = cpu_before
                .zip(thread_cpu_time())
                .map(|(before, after)| (after - before) / options.rounds as u32);
            let min_total = totals.iter().min().copied().unwrap_or_default();
            let total_median = median(totals);
            let rest = total_median.saturating_sub(decode_median + resize_median);
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            let per_cpu_second = cpu_per_image
                .filter(|cpu| !cpu.is_zero())
                .map_or("-".to_string(), |cpu| {
                    format!("{:.1}", 1.0 / cpu.as_secs_f64())
                });
            println!(
                "| {name} | {} | {}x{} | {:?} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} | {:.2} | {per_cpu_second} | {faults} |",
                if pooled { "pooled" } else { "fresh" },
                out_width,
                out_height,
                plan.out_shape,
                plan.out_bytes as f64 / 1e6,
                ms(decode_median),
                ms(resize_median),
                ms(rest),
                ms(total_median),
                ms(min_total),
                1.0 / total_median.as_secs_f64(),
                plan.out_bytes as f64 / total_median.as_secs_f64() / 1e9,
            );
        }
    }
    Ok(())
}
