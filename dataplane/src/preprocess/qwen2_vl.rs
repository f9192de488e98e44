//! The Qwen2-VL family image kernel: compressed bytes to `pixel_values`
//! `[grid_t * grid_h * grid_w, 3 * temporal_patch_size * P * P]`, plus
//! `image_grid_thw` and the number of placeholder tokens.
//!
//! Why a file of its own: this is the contract with the engines (Qwen2-VL,
//! Qwen2.5-VL and Qwen3-VL encoders all take this layout), and the place the
//! data plane's one-pass design is put together:
//!
//! 1. [`Qwen2VlImageProcessor::plan`] reads only the header, applies the pixel
//!    cap and `smart_resize`, and returns the output shape and byte count, so
//!    the caller can reserve a lane buffer (inline, shm slot, RDMA slot)
//!    before any pixel is decoded.
//! 2. [`Qwen2VlImageProcessor::write_into`] decodes, resizes (PIL's bicubic,
//!    streamed a band of `merge_size * patch_size` rows at a time), and
//!    rescales + normalizes + patchifies each band straight into the caller's
//!    buffer through a per-(channel, byte) table of encoded values. The only
//!    buffers besides the decoded image are the resampler's few scratch rows
//!    and one band of RGB bytes.
//!
//! Patch order is Hugging Face's: for each `merge_size × merge_size` block of
//! patches in row-major block order, the block's patches in row-major order;
//! within a patch, channel, then time, then row, then column. A still image
//! is one frame repeated `temporal_patch_size` times, so `grid_t` is 1.

use std::time::{Duration, Instant};

use smg_shared::tensor::DType;

use super::config::{CHANNELS, VisionPreprocessConfig};
use super::decode::{self, ImageLimits, SourceFormat};
use super::error::PreprocessError;
use super::output::EncodedValueTable;
use super::resize::{BicubicRgbResampler, ResizeError, smart_resize};
use super::scratch::{ScratchSpace, sized};

/// The kernel's stages, as [`Qwen2VlImageProcessor::write_into_timed`]
/// splits its time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Decode,
    Resize,
    /// Everything else: checks, rescale + normalize + patchify + encode.
    Rest,
}

/// Wall time per stage of one kernel run (they add up to the run's time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageTimes {
    pub decode: Duration,
    pub resize: Duration,
    pub rest: Duration,
}

impl StageTimes {
    pub fn total(&self) -> Duration {
        self.decode + self.resize + self.rest
    }
}

/// Everything known about an image's output before decoding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImagePlan {
    pub format: SourceFormat,
    pub source_width: u32,
    pub source_height: u32,
    /// Size after `smart_resize` (multiples of `patch_size * merge_size`).
    pub resized_width: u32,
    pub resized_height: u32,
    pub grid_t: u32,
    pub grid_h: u32,
    pub grid_w: u32,
    /// Placeholder tokens the prompt needs: patches / merge_size².
    pub tokens: u32,
    pub out_dtype: DType,
    /// `[grid_t * grid_h * grid_w, 3 * temporal_patch_size * P * P]`.
    pub out_shape: [u32; 2],
    /// Bytes of the output tensor in `out_dtype`.
    pub out_bytes: usize,
}

impl ImagePlan {
    /// The `image_grid_thw` row the engine expects: `[1, grid_h, grid_w]`.
    pub fn image_grid_thw(&self) -> [u32; 3] {
        [self.grid_t, self.grid_h, self.grid_w]
    }
}

/// An image preprocessed into an owned buffer (little-endian `plan.out_dtype`).
#[derive(Debug, Clone)]
pub struct PreprocessedImage {
    pub plan: ImagePlan,
    pub data: Vec<u8>,
}

/// The Qwen2-VL family kernel for one model's config: holds the precomputed
/// value tables, so build one per model and reuse it for every image.
#[derive(Debug, Clone)]
pub struct Qwen2VlImageProcessor {
    config: VisionPreprocessConfig,
    limits: ImageLimits,
    float32: EncodedValueTable<4>,
    bfloat16: EncodedValueTable<2>,
}

impl Qwen2VlImageProcessor {
    /// Validates `config` and precomputes its value tables.
    pub fn new(
        config: VisionPreprocessConfig,
        limits: ImageLimits,
    ) -> Result<Self, super::config::ConfigError> {
        config.validate()?;
        Ok(Qwen2VlImageProcessor {
            float32: EncodedValueTable::float32(&config),
            bfloat16: EncodedValueTable::bfloat16(&config),
            config,
            limits,
        })
    }

    pub fn config(&self) -> &VisionPreprocessConfig {
        &self.config
    }

    pub fn limits(&self) -> &ImageLimits {
        &self.limits
    }

    /// Reads the header of `bytes` (nothing is decoded) and plans the output.
    pub fn plan(&self, bytes: &[u8], out_dtype: DType) -> Result<ImagePlan, PreprocessError> {
        check_dtype(out_dtype)?;
        let header = decode::read_header(bytes, &self.limits)?;
        self.plan_dimensions(header.format, header.width, header.height, out_dtype)
    }

    /// Plans the output for an image of known size (pure arithmetic).
    pub fn plan_dimensions(
        &self,
        format: SourceFormat,
        width: u32,
        height: u32,
        out_dtype: DType,
    ) -> Result<ImagePlan, PreprocessError> {
        check_dtype(out_dtype)?;
        let config = &self.config;
        let (resized_height, resized_width) = smart_resize(
            height,
            width,
            config.resize_factor(),
            config.min_pixels,
            config.max_pixels,
        )
        .map_err(|error| match error {
            ResizeError::AspectRatio { .. } => PreprocessError::BadAspectRatio { width, height },
            ResizeError::ZeroSide { .. } => PreprocessError::ImageTooSmall {
                width,
                height,
                reason: "a side is zero",
            },
            ResizeError::Degenerate { .. } => PreprocessError::ImageTooSmall {
                width,
                height,
                reason: "it resizes to no patches",
            },
        })?;
        let grid_t: u32 = 1;
        let grid_h = resized_height / config.patch_size;
        let grid_w = resized_width / config.patch_size;
        let too_large = || PreprocessError::ImageTooLarge {
            width,
            height,
            pixels: u64::from(width) * u64::from(height),
            max_pixels: self.limits.max_source_pixels,
        };
        let patches = grid_t
            .checked_mul(grid_h)
            .and_then(|n| n.checked_mul(grid_w))
            .ok_or_else(too_large)?;
        let row_len = u32::try_from(config.patch_row_len()).map_err(|_| too_large())?;
        let out_shape = [patches, row_len];
        let out_bytes = out_dtype.tensor_bytes(&out_shape).ok_or_else(too_large)?;
        Ok(ImagePlan {
            format,
            source_width: width,
            source_height: height,
            resized_width,
            resized_height,
            grid_t,
            grid_h,
            grid_w,
            tokens: patches / (config.merge_size * config.merge_size),
            out_dtype,
            out_shape,
            out_bytes,
        })
    }

    /// Decodes `bytes` and writes the planned tensor into `dst`, which must be
    /// exactly `plan.out_bytes` long (it need not be aligned or zeroed). The
    /// plan must come from this processor's [`plan`](Self::plan) for the same
    /// bytes. On error, `dst` may hold a partial tensor.
    pub fn write_into(
        &self,
        plan: &ImagePlan,
        bytes: &[u8],
        dst: &mut [u8],
    ) -> Result<(), PreprocessError> {
        self.write_into_with(plan, bytes, dst, &mut ScratchSpace::default())
    }

    /// As [`write_into`](Self::write_into), with the intermediate buffers
    /// (decoded pixels, resampler rows, the band being patchified) taken
    /// from and returned to `scratch`, a data-plane core's own.
    pub fn write_into_with(
        &self,
        plan: &ImagePlan,
        bytes: &[u8],
        dst: &mut [u8],
        scratch: &mut ScratchSpace,
    ) -> Result<(), PreprocessError> {
        self.write_observed(plan, bytes, dst, scratch, &mut |_| {})
    }

    /// As [`write_into_with`](Self::write_into_with), timing each stage of
    /// this one run: decode, the resize (band by band), and the rest
    /// (checks, rescale + normalize + patchify + encode, buffer hand-back).
    /// The three add up to the call's wall time. For benchmarks: it reads
    /// the clock twice per band.
    pub fn write_into_timed(
        &self,
        plan: &ImagePlan,
        bytes: &[u8],
        dst: &mut [u8],
        scratch: &mut ScratchSpace,
    ) -> Result<StageTimes, PreprocessError> {
        let started = Instant::now();
        let mut times = StageTimes::default();
        let mut lap = started;
        self.write_observed(plan, bytes, dst, scratch, &mut |stage| {
            let now = Instant::now();
            let spent = now - lap;
            lap = now;
            match stage {
                Stage::Decode => times.decode += spent,
                Stage::Resize => times.resize += spent,
                Stage::Rest => times.rest += spent,
            }
        })?;
        times.rest += lap.elapsed();
        Ok(times)
    }

    /// The kernel, telling `finished` each time a stage's piece of work ends
    /// (production passes a no-op, which compiles away).
    fn write_observed(
        &self,
        plan: &ImagePlan,
        bytes: &[u8],
        dst: &mut [u8],
        scratch: &mut ScratchSpace,
        finished: &mut impl FnMut(Stage),
    ) -> Result<(), PreprocessError> {
        let replanned = self.plan_dimensions(
            plan.format,
            plan.source_width,
            plan.source_height,
            plan.out_dtype,
        )?;
        if replanned != *plan {
            return Err(PreprocessError::PlanMismatch);
        }
        if dst.len() != plan.out_bytes {
            return Err(PreprocessError::BufferSizeMismatch {
                expected: plan.out_bytes,
                actual: dst.len(),
            });
        }
        if SourceFormat::sniff(bytes) != Some(plan.format) {
            return Err(PreprocessError::PlanMismatch);
        }
        let policy = *scratch.policy();
        finished(Stage::Rest);
        let decoded = decode::decode_into(bytes, &self.limits, scratch.decoded.take())?;
        finished(Stage::Decode);
        let written = self.write_decoded(plan, &decoded, dst, scratch, finished);
        scratch.decoded.give_back(decoded.into_buffer(), &policy);
        written
    }

    /// Resizes and patchifies decoded pixels into `dst`.
    fn write_decoded(
        &self,
        plan: &ImagePlan,
        decoded: &decode::DecodedImage,
        dst: &mut [u8],
        scratch: &mut ScratchSpace,
        finished: &mut impl FnMut(Stage),
    ) -> Result<(), PreprocessError> {
        let pixels = decoded.pixels().ok_or_else(|| {
            PreprocessError::CorruptImage("decoder returned a buffer of the wrong size".into())
        })?;
        if (pixels.width(), pixels.height())
            != (plan.source_width as usize, plan.source_height as usize)
        {
            return Err(PreprocessError::PlanMismatch);
        }
        let policy = *scratch.policy();
        let geometry = PatchGeometry::new(&self.config, plan);
        let mut resampler = BicubicRgbResampler::with_scratch(
            pixels,
            plan.resized_width as usize,
            plan.resized_height as usize,
            scratch.resize.take(),
        );
        // Every byte of the band is written before it is read.
        let mut band = sized(
            scratch.band.take(),
            geometry.band_rows() * resampler.row_bytes(),
        );
        finished(Stage::Rest);
        match plan.out_dtype {
            DType::BFloat16 => write_bands(
                &mut resampler,
                &geometry,
                &self.bfloat16,
                &mut band,
                dst,
                finished,
            ),
            _ => write_bands(
                &mut resampler,
                &geometry,
                &self.float32,
                &mut band,
                dst,
                finished,
            ),
        }
        scratch.band.give_back(band, &policy);
        scratch.resize.give_back(resampler.into_scratch(), &policy);
        Ok(())
    }

    /// [`plan`](Self::plan) then [`write_into`](Self::write_into) a new buffer.
    pub fn preprocess(
        &self,
        bytes: &[u8],
        out_dtype: DType,
    ) -> Result<PreprocessedImage, PreprocessError> {
        let plan = self.plan(bytes, out_dtype)?;
        let mut data = vec![0u8; plan.out_bytes];
        self.write_into(&plan, bytes, &mut data)?;
        Ok(PreprocessedImage { plan, data })
    }
}

/// One-shot convenience: builds the kernel for `config` and preprocesses one
/// image into a new buffer. Long-lived callers should keep a
/// [`Qwen2VlImageProcessor`] and use `plan` + `write_into`.
pub fn preprocess_image(
    bytes: &[u8],
    config: &VisionPreprocessConfig,
    out: DType,
    limits: &ImageLimits,
) -> Result<PreprocessedImage, PreprocessError> {
    let processor = Qwen2VlImageProcessor::new(config.clone(), *limits)
        .map_err(|error| PreprocessError::InvalidConfig(error.to_string()))?;
    processor.preprocess(bytes, out)
}

fn check_dtype(dtype: DType) -> Result<(), PreprocessError> {
    match dtype {
        DType::Float32 | DType::BFloat16 => Ok(()),
        other => Err(PreprocessError::UnsupportedDType(other)),
    }
}

/// The sizes patchifying works with, in elements and pixels.
#[derive(Debug, Clone, Copy)]
struct PatchGeometry {
    patch: usize,
    merge: usize,
    temporal: usize,
    /// Resized image width in pixels.
    width: usize,
    /// Merge blocks per band (`grid_w / merge`).
    blocks_per_band: usize,
    /// Elements per output row (`3 * temporal * patch²`).
    row_len: usize,
}

impl PatchGeometry {
    fn new(config: &VisionPreprocessConfig, plan: &ImagePlan) -> Self {
        let merge = config.merge_size as usize;
        PatchGeometry {
            patch: config.patch_size as usize,
            merge,
            temporal: config.temporal_patch_size as usize,
            width: plan.resized_width as usize,
            blocks_per_band: plan.grid_w as usize / merge,
            row_len: config.patch_row_len(),
        }
    }

    /// Resized image rows per band of merge blocks.
    fn band_rows(&self) -> usize {
        self.merge * self.patch
    }

    /// Output elements per band: its patches times the row length.
    fn band_elements(&self) -> usize {
        self.blocks_per_band * self.merge * self.merge * self.row_len
    }
}

/// Resizes band after band (into `band`, `merge * patch` rows) and
/// patchifies each into its slice of `dst`.
fn write_bands<const N: usize>(
    resampler: &mut BicubicRgbResampler<'_>,
    geometry: &PatchGeometry,
    table: &EncodedValueTable<N>,
    band: &mut [u8],
    dst: &mut [u8],
    finished: &mut impl FnMut(Stage),
) {
    let (elements, _) = dst.as_chunks_mut::<N>();
    for band_out in elements.chunks_exact_mut(geometry.band_elements()) {
        resampler.write_rows(band);
        finished(Stage::Resize);
        patchify_band(band, geometry, table, band_out);
        finished(Stage::Rest);
    }
}

/// Writes the patches of one band (`merge * patch` resized rows of RGB bytes)
/// in Hugging Face's order. Indexes rather than zipping iterators, for the
/// same reason as the resampler's kernels (see `resize.rs`).
#[allow(clippy::needless_range_loop)]
fn patchify_band<const N: usize>(
    band: &[u8],
    geometry: &PatchGeometry,
    table: &EncodedValueTable<N>,
    out: &mut [[u8; N]],
) {
    let PatchGeometry {
        patch,
        merge,
        temporal,
        width,
        blocks_per_band,
        row_len,
    } = *geometry;
    let row_bytes = width * 3;
    let plane = patch * patch;
    let mut patch_index = 0;
    for block in 0..blocks_per_band {
        for my in 0..merge {
            for mx in 0..merge {
                let (y0, x0) = (my * patch, (block * merge + mx) * patch);
                let patch_out = &mut out[patch_index * row_len..(patch_index + 1) * row_len];
                for channel in 0..CHANNELS {
                    let values = table.channel(channel);
                    let channel_out = &mut patch_out
                        [channel * temporal * plane..(channel + 1) * temporal * plane];
                    for dy in 0..patch {
                        let start = (y0 + dy) * row_bytes + x0 * 3 + channel;
                        let pixels = &band[start..start + (patch - 1) * 3 + 1];
                        let out_row = &mut channel_out[dy * patch..(dy + 1) * patch];
                        for dx in 0..patch {
                            out_row[dx] = values[usize::from(pixels[dx * 3])];
                        }
                    }
                    for frame in 1..temporal {
                        channel_out.copy_within(0..plane, frame * plane);
                    }
                }
                patch_index += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::ImageEncoder;
    use image::codecs::png::PngEncoder;

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/tests/fixtures/images/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|error| panic!("{path}: {error}"))
    }

    fn qwen2_vl() -> Qwen2VlImageProcessor {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/model");
        let config = VisionPreprocessConfig::from_model_dir(&dir).expect("fixture config");
        Qwen2VlImageProcessor::new(config, ImageLimits::default()).expect("valid config")
    }

    fn png(width: u32, height: u32, color: image::ExtendedColorType, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        PngEncoder::new(&mut out)
            .write_image(data, width, height, color)
            .expect("encode png");
        out
    }

    fn f32_values(bytes: &[u8]) -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    #[test]
    fn plans_640x480_and_1080p_from_the_header() {
        let processor = qwen2_vl();
        let plan = processor
            .plan(&fixture("photo_640x480.jpg"), DType::Float32)
            .expect("plan");
        assert_eq!((plan.source_width, plan.source_height), (640, 480));
        assert_eq!((plan.resized_width, plan.resized_height), (644, 476));
        assert_eq!(plan.image_grid_thw(), [1, 34, 46]);
        assert_eq!(plan.out_shape, [1564, 1176]);
        assert_eq!(plan.tokens, 391);
        assert_eq!(plan.out_bytes, 1564 * 1176 * 4);

        let plan = processor
            .plan(&fixture("photo_1920x1080.jpg"), DType::BFloat16)
            .expect("plan");
        assert_eq!(plan.image_grid_thw(), [1, 78, 138]);
        assert_eq!(plan.out_shape, [10764, 1176]);
        assert_eq!(plan.tokens, 2691);
        assert_eq!(plan.out_bytes, 10764 * 1176 * 2);
    }

    /// A 8x4 image whose pixel (x, y) channel c holds `(y * 8 + x) * 3 + c`,
    /// with patch 2, merge 2, temporal 2, no resize, no rescale/normalize: the
    /// output holds the raw bytes, so the layout can be checked by hand.
    #[test]
    fn patch_order_matches_hugging_face_by_hand() {
        let (width, height) = (8u32, 4u32);
        let pixels: Vec<u8> = (0..width * height * 3).map(|v| v as u8).collect();
        let bytes = png(width, height, image::ExtendedColorType::Rgb8, &pixels);
        let mut config = qwen2_vl().config().clone();
        config.patch_size = 2;
        config.min_pixels = 16;
        config.do_rescale = false;
        config.do_normalize = false;
        let processor =
            Qwen2VlImageProcessor::new(config, ImageLimits::default()).expect("valid config");
        let image = processor
            .preprocess(&bytes, DType::Float32)
            .expect("preprocess");
        assert_eq!(image.plan.image_grid_thw(), [1, 2, 4]);
        assert_eq!(image.plan.out_shape, [8, 24]);
        assert_eq!(image.plan.tokens, 2);

        let value = |x: u32, y: u32, c: u32| ((y * 8 + x) * 3 + c) as f32;
        // Patch (row, col) of the 2x4 patch grid covers pixels x in 2*col..,
        // y in 2*row..; each output row: for c, for t (x2), 2x2 pixels.
        let patch_row = |row: u32, col: u32| -> Vec<f32> {
            let mut out = Vec::new();
            for c in 0..3 {
                for _t in 0..2 {
                    for dy in 0..2 {
                        for dx in 0..2 {
                            out.push(value(col * 2 + dx, row * 2 + dy, c));
                        }
                    }
                }
            }
            out
        };
        // Merge blocks are 2x2 patches: block 0 = patch cols 0-1, block 1 = cols 2-3.
        let expected_order = [
            (0, 0),
            (0, 1),
            (1, 0),
            (1, 1),
            (0, 2),
            (0, 3),
            (1, 2),
            (1, 3),
        ];
        let values = f32_values(&image.data);
        for (index, &(row, col)) in expected_order.iter().enumerate() {
            assert_eq!(
                values[index * 24..(index + 1) * 24],
                patch_row(row, col),
                "output row {index} should be patch ({row}, {col})"
            );
        }
        // Spelled out for the first row: red of pixels (0,0) (1,0) (0,1) (1,1)
        // twice, then green, then blue.
        assert_eq!(
            values[..24],
            [
                0., 3., 24., 27., 0., 3., 24., 27., 1., 4., 25., 28., 1., 4., 25., 28., 2., 5.,
                26., 29., 2., 5., 26., 29.
            ]
        );
    }

    #[test]
    fn bf16_output_is_the_rounded_f32_output() {
        let processor = qwen2_vl();
        let bytes = fixture("rgba_150x100.png");
        let full = processor.preprocess(&bytes, DType::Float32).expect("f32");
        let half = processor.preprocess(&bytes, DType::BFloat16).expect("bf16");
        assert_eq!(half.plan.out_shape, full.plan.out_shape);
        assert_eq!(half.data.len() * 2, full.data.len());
        for (value, bits) in f32_values(&full.data).iter().zip(half.data.chunks_exact(2)) {
            let bits = u16::from_le_bytes([bits[0], bits[1]]);
            assert_eq!(bits, super::super::output::f32_to_bf16_bits(*value));
        }
    }

    #[test]
    fn write_into_reuses_a_dirty_buffer() {
        let processor = qwen2_vl();
        let bytes = fixture("tiny_20x20.png");
        let fresh = processor.preprocess(&bytes, DType::Float32).expect("fresh");
        let mut dirty = vec![0xA5u8; fresh.plan.out_bytes];
        processor
            .write_into(&fresh.plan, &bytes, &mut dirty)
            .expect("write");
        assert_eq!(dirty, fresh.data);
    }

    /// The timed kernel is the same kernel: identical bytes, and every stage
    /// it reports took time (decode and resize do real work on a 640x480
    /// photo; "rest" patchifies it).
    #[test]
    fn timed_kernel_writes_the_same_tensor_and_reports_each_stage() {
        let processor = qwen2_vl();
        let bytes = fixture("photo_640x480.jpg");
        for dtype in [DType::Float32, DType::BFloat16] {
            let fresh = processor.preprocess(&bytes, dtype).expect("preprocess");
            let mut timed = vec![0xA5u8; fresh.plan.out_bytes];
            let times = processor
                .write_into_timed(
                    &fresh.plan,
                    &bytes,
                    &mut timed,
                    &mut ScratchSpace::default(),
                )
                .expect("timed run");
            assert!(timed == fresh.data, "{dtype:?}: the timed run differs");
            assert!(times.decode > Duration::ZERO, "{times:?}");
            assert!(times.resize > Duration::ZERO, "{times:?}");
            assert!(times.rest > Duration::ZERO, "{times:?}");
            assert_eq!(times.total(), times.decode + times.resize + times.rest);
        }
        let mut short = vec![0u8; 16];
        let plan = processor.plan(&bytes, DType::Float32).expect("plan");
        assert!(matches!(
            processor.write_into_timed(&plan, &bytes, &mut short, &mut ScratchSpace::default()),
            Err(PreprocessError::BufferSizeMismatch { .. })
        ));
    }

    /// One scratch space through images of every format, size and layout,
    /// larger and smaller in turn, and a corrupt one in between: each
    /// output equals a fresh-buffer run's, so no stale byte leaks through.
    #[test]
    fn reused_scratch_gives_the_same_tensors_as_fresh_buffers() {
        let processor = qwen2_vl();
        let names = [
            "photo_640x480.jpg",
            "tiny_20x20.png",
            "odd_333x517.png",
            "cmyk_120x90.jpg",
            "photo_640x480.jpg",
            "gray16_48x40.png",
            "rgba_150x100.png",
            "tiny_9x7.jpg",
        ];
        let mut scratch = ScratchSpace::default();
        for name in names {
            let bytes = fixture(name);
            let dtypes: &[DType] = match name {
                "tiny_20x20.png" => &[DType::Float32, DType::BFloat16],
                _ => &[DType::Float32],
            };
            for &dtype in dtypes {
                let fresh = processor.preprocess(&bytes, dtype).expect(name);
                let mut reused = vec![0x5Au8; fresh.plan.out_bytes];
                processor
                    .write_into_with(&fresh.plan, &bytes, &mut reused, &mut scratch)
                    .expect(name);
                assert!(
                    reused == fresh.data,
                    "{name} {dtype:?} differs with reused scratch"
                );
            }
            assert!(scratch.retained_bytes() > 0, "{name}: buffers are kept");
            // A corrupt image fails cleanly and the next one is unaffected.
            let mut broken = bytes.clone();
            broken.truncate(broken.len() / 2);
            if let Ok(plan) = processor.plan(&broken, DType::Float32) {
                let mut dst = vec![0u8; plan.out_bytes];
                assert!(
                    processor
                        .write_into_with(&plan, &broken, &mut dst, &mut scratch)
                        .is_err()
                );
            }
        }
    }

    #[test]
    fn bad_inputs_have_stable_codes() {
        let processor = qwen2_vl();
        let code = |result: Result<PreprocessedImage, PreprocessError>| {
            result.expect_err("must fail").code()
        };

        // Random bytes.
        let mut state = 0x1234_5678u32;
        let random: Vec<u8> = (0..4096)
            .map(|_| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (state >> 24) as u8
            })
            .collect();
        assert_eq!(
            code(processor.preprocess(&random, DType::Float32)),
            "unsupported_format"
        );

        // A JPEG cut in the middle of its scan: the header still plans.
        let jpeg = fixture("photo_640x480.jpg");
        let truncated = &jpeg[..jpeg.len() / 2];
        let plan = processor
            .plan(truncated, DType::Float32)
            .expect("header is intact");
        let mut dst = vec![0u8; plan.out_bytes];
        let error = processor
            .write_into(&plan, truncated, &mut dst)
            .expect_err("truncated");
        assert_eq!(error.code(), "corrupt_image", "{error}");

        // A JPEG cut inside its header.
        assert_eq!(
            code(processor.preprocess(&jpeg[..100], DType::Float32)),
            "corrupt_image"
        );

        // A PNG cut in its pixel data, and one with a damaged byte in it.
        let png_bytes = fixture("odd_333x517.png");
        let cut = &png_bytes[..png_bytes.len() - 5000];
        assert_eq!(
            code(processor.preprocess(cut, DType::Float32)),
            "corrupt_image"
        );
        let mut damaged = png_bytes.clone();
        damaged[png_bytes.len() / 2] ^= 0x5A;
        assert_eq!(
            code(processor.preprocess(&damaged, DType::Float32)),
            "corrupt_image"
        );

        // A WebP cut short, and JPEG magic followed by garbage.
        let webp = fixture("lossy_320x240.webp");
        let cut = &webp[..webp.len() * 2 / 3];
        assert_eq!(
            code(processor.preprocess(cut, DType::Float32)),
            "corrupt_image"
        );
        let mut fake_jpeg = vec![0xFF, 0xD8, 0xFF, 0xE0];
        fake_jpeg.extend_from_slice(&random[..512]);
        assert_eq!(
            code(processor.preprocess(&fake_jpeg, DType::Float32)),
            "corrupt_image"
        );

        // A 1x300 image: aspect ratio 300.
        let sliver = png(1, 300, image::ExtendedColorType::L8, &[128; 300]);
        assert_eq!(
            code(processor.preprocess(&sliver, DType::Float32)),
            "bad_aspect_ratio"
        );

        // Too small for the configured minimum side.
        let small_limits = ImageLimits {
            min_source_side: 32,
            ..ImageLimits::default()
        };
        let strict = Qwen2VlImageProcessor::new(processor.config().clone(), small_limits)
            .expect("valid config");
        let tiny = fixture("tiny_20x20.png");
        assert_eq!(
            code(strict.preprocess(&tiny, DType::Float32)),
            "image_too_small"
        );

        // No pixel budget floor: 7x9 rounds to zero patches.
        let mut config = processor.config().clone();
        config.min_pixels = 0;
        let no_floor =
            Qwen2VlImageProcessor::new(config, ImageLimits::default()).expect("valid config");
        let speck = png(9, 7, image::ExtendedColorType::L8, &[9; 63]);
        assert_eq!(
            code(no_floor.preprocess(&speck, DType::Float32)),
            "image_too_small"
        );

        // Over the pixel cap.
        let capped = Qwen2VlImageProcessor::new(
            processor.config().clone(),
            ImageLimits {
                max_source_pixels: 640 * 480 - 1,
                ..ImageLimits::default()
            },
        )
        .expect("valid config");
        let error = capped.plan(&jpeg, DType::Float32).expect_err("over cap");
        assert_eq!(error.code(), "image_too_large");

        // Output dtypes the engines do not take as encoder input.
        assert_eq!(
            code(processor.preprocess(&tiny, DType::Int64)),
            "unsupported_dtype"
        );
    }

    #[test]
    fn write_into_checks_buffer_and_plan() {
        let processor = qwen2_vl();
        let tiny = fixture("tiny_20x20.png");
        let plan = processor.plan(&tiny, DType::Float32).expect("plan");
        let mut short = vec![0u8; plan.out_bytes - 4];
        let error = processor
            .write_into(&plan, &tiny, &mut short)
            .expect_err("short buffer");
        assert_eq!(error.code(), "buffer_size_mismatch");

        let mut dst = vec![0u8; plan.out_bytes];
        let other = fixture("palette_97x61.png");
        let error = processor
            .write_into(&plan, &other, &mut dst)
            .expect_err("other image");
        assert_eq!(error.code(), "plan_mismatch");
        let error = processor
            .write_into(&plan, &fixture("photo_640x480.jpg"), &mut dst)
            .expect_err("other format");
        assert_eq!(error.code(), "plan_mismatch");
    }

    #[test]
    fn write_into_refuses_plans_it_did_not_make() {
        let processor = qwen2_vl();
        let tiny = fixture("tiny_20x20.png");
        let plan = processor.plan(&tiny, DType::Float32).expect("plan");

        let mut tampered = plan;
        tampered.resized_height += 28;
        tampered.grid_h += 2;
        let mut dst = vec![0u8; plan.out_bytes];
        let error = processor
            .write_into(&tampered, &tiny, &mut dst)
            .expect_err("tampered plan");
        assert_eq!(error.code(), "plan_mismatch");

        // A plan from a processor with another pixel budget.
        let mut config = processor.config().clone();
        config.min_pixels = 112 * 112;
        let other = Qwen2VlImageProcessor::new(config, ImageLimits::default()).expect("config");
        let other_plan = other.plan(&tiny, DType::Float32).expect("plan");
        assert_eq!(other_plan.image_grid_thw(), [1, 8, 8]);
        let mut dst = vec![0u8; other_plan.out_bytes];
        let error = processor
            .write_into(&other_plan, &tiny, &mut dst)
            .expect_err("foreign plan");
        assert_eq!(error.code(), "plan_mismatch");
    }

    #[test]
    fn grayscale_fills_all_three_channels_alike() {
        let processor = qwen2_vl();
        let mut config = processor.config().clone();
        config.do_normalize = false;
        let plain = Qwen2VlImageProcessor::new(config, ImageLimits::default()).expect("config");
        let image = plain
            .preprocess(&fixture("gray_257x193.png"), DType::Float32)
            .expect("gray");
        let values = f32_values(&image.data);
        let plane = 2 * 14 * 14;
        for row in values.chunks_exact(1176) {
            assert_eq!(row[..plane], row[plane..2 * plane]);
            assert_eq!(row[..plane], row[2 * plane..]);
        }
    }
}
