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
//! then encoded baseline 4:2:0 at quality 85 by libjpeg). Each round is one
//! whole kernel run (`write_into_timed`, the production kernel with a clock
//! read at each stage boundary) into a reused (warm) destination with a
//! reused `ScratchSpace`, as a data-plane core runs it. The stage columns
//! are means over the rounds and add up to the mean total; the table also
//! shows the median and minimum total, and images per second of this
//! thread's CPU time (what one core does when it gets the core to itself,
//! short of cache and memory contention).

use std::path::PathBuf;
use std::time::Duration;

/// The gateway's allocator (`control/main.rs`), so per-image allocations
/// cost here what they cost on a data-plane core.
#[global_allocator]
static GLOBAL_ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use smg_dataplane::preprocess::decode::{self, ImageLimits};
use smg_dataplane::preprocess::resize::resize_to_rgb8;
use smg_dataplane::preprocess::{
    Qwen2VlImageProcessor, ScratchSpace, StageTimes, VisionPreprocessConfig,
};
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
        "rounds {}, output {}, one thread",
        options.rounds, options.dtype
    );
    println!(
        "| image | resized | out shape | out MB | decode ms | resize ms | rest ms | mean total ms | median total ms | min total ms | img/s | out GB/s | img per CPU-s | faults/img |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, bytes) in &inputs {
        let plan = processor.plan(bytes, options.dtype)?;
        let mut dst = vec![0u8; plan.out_bytes];
        let mut scratch = ScratchSpace::default();
        // Touch the destination's pages and warm the scratch space.
        processor.write_into_timed(&plan, bytes, &mut dst, &mut scratch)?;
        let cpu_before = thread_cpu_time();
        let faults_before = thread_minor_faults();
        let mut runs = Vec::with_capacity(options.rounds);
        for _ in 0..options.rounds {
            if !options.gap.is_zero() {
                std::thread::sleep(options.gap);
            }
            runs.push(processor.write_into_timed(&plan, bytes, &mut dst, &mut scratch)?);
        }
        std::hint::black_box(&dst);
        let faults = faults_before
            .zip(thread_minor_faults())
            .map_or("-".to_string(), |(before, after)| {
                format!("{}", (after - before) / options.rounds as u64)
            });
        let per_cpu_second = cpu_before
            .zip(thread_cpu_time())
            .map(|(before, after)| (after - before) / options.rounds as u32)
            .filter(|cpu| !cpu.is_zero())
            .map_or("-".to_string(), |cpu| {
                format!("{:.1}", 1.0 / cpu.as_secs_f64())
            });
        let mean = |stage: fn(&StageTimes) -> Duration| {
            runs.iter().map(stage).sum::<Duration>() / options.rounds as u32
        };
        let totals: Vec<Duration> = runs.iter().map(StageTimes::total).collect();
        let min_total = totals.iter().min().copied().unwrap_or_default();
        let mean_total = mean(StageTimes::total);
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "| {name} | {}x{} | {:?} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} | {:.2} | {per_cpu_second} | {faults} |",
            plan.resized_width,
            plan.resized_height,
            plan.out_shape,
            plan.out_bytes as f64 / 1e6,
            ms(mean(|t| t.decode)),
            ms(mean(|t| t.resize)),
            ms(mean(|t| t.rest)),
            ms(mean_total),
            ms(median(totals)),
            ms(min_total),
            1.0 / mean_total.as_secs_f64(),
            plan.out_bytes as f64 / mean_total.as_secs_f64() / 1e9,
        );
    }
    Ok(())
}
