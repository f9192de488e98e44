//! Choosing the resized size (`smart_resize`) and resampling to it the way
//! PIL does (`Image.resize(size, Image.BICUBIC)` on an RGB uint8 image).
//!
//! Why a file of its own: the resize is where preprocessing spends its time
//! (PIL's bicubic resize is ~37 ms of HF's ~167 ms for a 1080p photo), and
//! it is where parity with Hugging Face is won or lost. The model was trained
//! on PIL's output, so this resampler reproduces PIL's arithmetic exactly:
//!
//! - Per output pixel, PIL centres the kernel at `(i + 0.5) * scale`, takes
//!   the source pixels `trunc(center ± support + 0.5)` (clamped to the image),
//!   and weighs them with the Keys cubic (a = -0.5, support 2). When shrinking,
//!   the kernel is stretched by the scale factor (antialiasing) and its support
//!   grows with it. The weights are normalized to sum to one in f64, then
//!   rounded to 22-bit fixed point (away from zero at .5).
//! - The image is resampled along one axis, then the other; each pass
//!   accumulates `pixel * weight` in i32 from a 0.5 rounding bias and clips the
//!   result back to 0..=255 (uint8) before the next pass reads it. Which axis
//!   goes first depends on the Pillow version (see [`PassOrder`]).
//! - A pass whose size does not change is skipped (it would be the identity).
//!
//! Integer sums are exact in any order, so the loops are free to be laid out
//! for speed: weights are computed once per (input, output) size and padded
//! to a fixed tap count, and output rows are streamed into the caller's
//! buffer. Horizontal-first keeps only a ring of `taps` horizontally resampled
//! rows; vertical-first reads the decoded rows directly and keeps one row. No
//! full-size intermediate image exists.

/// Qwen2-VL rejects images whose long side exceeds this many short sides.
pub const MAX_ASPECT_RATIO: f64 = 200.0;

/// Fixed-point fraction bits of PIL's 8-bit resampler (32 - 8 - 2).
const PRECISION_BITS: u32 = 22;
/// Rounding bias added before shifting the fixed-point sum back to 8 bits.
const ROUNDING_BIAS: i32 = 1 << (PRECISION_BITS - 1);
/// Half-width of the bicubic kernel, in source pixels, before stretching.
const BICUBIC_SUPPORT: f64 = 2.0;
/// Output elements the vertical pass keeps in registers at a time.
const VERTICAL_CHUNK: usize = 64;

/// Why `smart_resize` refused a size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ResizeError {
    #[error("image has a zero side ({width}x{height})")]
    ZeroSide { width: u32, height: u32 },
    #[error("aspect ratio of {width}x{height} exceeds {MAX_ASPECT_RATIO}")]
    AspectRatio { width: u32, height: u32 },
    #[error("{width}x{height} resizes to an empty or unrepresentable size")]
    Degenerate { width: u32, height: u32 },
}

/// Qwen2-VL's rule for the resized size: both sides multiples of `factor`
/// (`patch_size * merge_size`), the area within `min_pixels..=max_pixels`, the
/// aspect ratio kept as well as the rounding allows. Returns `(height, width)`.
///
/// The arithmetic is Python's, step for step (f64 division and `sqrt`,
/// `round` ties to even, `floor` when shrinking to fit `max_pixels`, `ceil`
/// when growing to reach `min_pixels`), so borderline sizes round the same
/// way as in Hugging Face. Exact for images under 2^53 pixels.
pub fn smart_resize(
    height: u32,
    width: u32,
    factor: u32,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<(u32, u32), ResizeError> {
    if height == 0 || width == 0 || factor == 0 {
        return Err(ResizeError::ZeroSide { width, height });
    }
    let (h, w, f) = (f64::from(height), f64::from(width), f64::from(factor));
    if h.max(w) / h.min(w) > MAX_ASPECT_RATIO {
        return Err(ResizeError::AspectRatio { width, height });
    }
    let area = u128::from(height) * u128::from(width);
    let round_to_factor = |side: f64| (side / f).round_ties_even() * f;
    let (mut h_bar, mut w_bar) = (round_to_factor(h), round_to_factor(w));
    // Both are integers below 2^34, so their product is exact as u128.
    let rounded_area = h_bar as u128 * w_bar as u128;
    if rounded_area > u128::from(max_pixels) {
        let beta = (area as f64 / max_pixels as f64).sqrt();
        h_bar = f.max((h / beta / f).floor() * f);
        w_bar = f.max((w / beta / f).floor() * f);
    } else if rounded_area < u128::from(min_pixels) {
        let beta = (min_pixels as f64 / area as f64).sqrt();
        h_bar = (h * beta / f).ceil() * f;
        w_bar = (w * beta / f).ceil() * f;
    }
    let side = |value: f64| {
        if value >= 1.0 && value <= f64::from(u32::MAX) {
            Some(value as u32)
        } else {
            None
        }
    };
    match (side(h_bar), side(w_bar)) {
        (Some(h_bar), Some(w_bar)) => Ok((h_bar, w_bar)),
        _ => Err(ResizeError::Degenerate { width, height }),
    }
}

/// The Keys cubic convolution kernel with a = -0.5 (PIL's BICUBIC).
fn bicubic_kernel(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// Clips a fixed-point sum back to a pixel value.
#[inline(always)]
fn to_pixel(sum: i32) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

/// The resampling weights of one axis. Every output reads the same number of
/// consecutive source pixels (`taps_per_output`): outputs near the edges,
/// which PIL gives fewer taps, are padded with zero weights (exact in integer
/// arithmetic), so the inner loops have a fixed trip count.
#[derive(Debug, Clone)]
pub struct AxisTaps {
    in_len: usize,
    taps_per_output: usize,
    first: Vec<usize>,
    weights: Vec<i32>,
}

impl AxisTaps {
    /// PIL's bicubic weights for resampling `in_len` pixels to `out_len`.
    /// Both must be non-zero.
    pub fn bicubic(in_len: usize, out_len: usize) -> Self {
        let scale = in_len as f64 / out_len.max(1) as f64;
        let filter_scale = scale.max(1.0);
        let support = BICUBIC_SUPPORT * filter_scale;
        let max_taps = support.ceil() as usize * 2 + 1;
        let inverse_filter_scale = 1.0 / filter_scale;
        let fixed_one = f64::from(1u32 << PRECISION_BITS);

        // PIL's taps: first source index and weights per output.
        let mut spans = Vec::with_capacity(out_len);
        let mut fixed_weights = Vec::with_capacity(out_len * max_taps);
        let mut real_weights = vec![0f64; max_taps];
        for out_index in 0..out_len {
            let center = (out_index as f64 + 0.5) * scale;
            // `as i64` truncates toward zero, like C's `(int)` cast PIL uses.
            let lo = ((center - support + 0.5) as i64).max(0) as usize;
            let hi = ((center + support + 0.5) as i64).clamp(0, in_len as i64) as usize;
            let taps = hi.saturating_sub(lo).min(max_taps);
            let mut total = 0.0;
            for (offset, weight) in real_weights[..taps].iter_mut().enumerate() {
                let distance = (lo + offset) as f64 - center + 0.5;
                *weight = bicubic_kernel(distance * inverse_filter_scale);
                total += *weight;
            }
            let start = fixed_weights.len();
            for weight in &real_weights[..taps] {
                let normalized = if total != 0.0 {
                    weight / total
                } else {
                    *weight
                };
                let rounding = if normalized < 0.0 { -0.5 } else { 0.5 };
                fixed_weights.push((rounding + normalized * fixed_one) as i32);
            }
            spans.push((lo, start, taps));
        }

        // Pad every output to the widest span, shifting edge windows inward
        // so they stay inside the source (a span never exceeds `in_len`).
        let taps_per_output = spans.iter().map(|&(_, _, taps)| taps).max().unwrap_or(0);
        let mut first = Vec::with_capacity(out_len);
        let mut weights = vec![0i32; out_len * taps_per_output];
        for (padded, &(lo, start, taps)) in
            weights.chunks_exact_mut(taps_per_output.max(1)).zip(&spans)
        {
            let window_start = lo.min(in_len.saturating_sub(taps_per_output));
            let shift = lo - window_start;
            padded[shift..shift + taps].copy_from_slice(&fixed_weights[start..start + taps]);
            first.push(window_start);
        }
        AxisTaps {
            in_len,
            taps_per_output,
            first,
            weights,
        }
    }

    /// Number of output pixels along this axis.
    pub fn out_len(&self) -> usize {
        self.first.len()
    }

    /// Number of input pixels along this axis.
    pub fn in_len(&self) -> usize {
        self.in_len
    }

    /// Source pixels every output reads (some with zero weight).
    pub fn taps_per_output(&self) -> usize {
        self.taps_per_output
    }

    /// The first source index output `index` reads, and the weights of the
    /// `taps_per_output` source indices from there on (22-bit fixed point).
    #[inline]
    pub fn taps(&self, index: usize) -> (usize, &[i32]) {
        let start = index * self.taps_per_output;
        (
            self.first[index],
            &self.weights[start..start + self.taps_per_output],
        )
    }
}

/// How a decoded 8-bit image stores its channels. Resampling reads only what
/// PIL's `convert("RGB")` keeps: alpha is dropped (not composited), gray is
/// replicated into R, G and B.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PixelLayout {
    Gray,
    GrayAlpha,
    Rgb,
    Rgba,
}

impl PixelLayout {
    /// Bytes per pixel.
    pub const fn channels(self) -> usize {
        match self {
            PixelLayout::Gray => 1,
            PixelLayout::GrayAlpha => 2,
            PixelLayout::Rgb => 3,
            PixelLayout::Rgba => 4,
        }
    }
}

/// A borrowed 8-bit image, rows top to bottom, channels interleaved.
#[derive(Debug, Clone, Copy)]
pub struct SourcePixels<'a> {
    width: usize,
    height: usize,
    layout: PixelLayout,
    data: &'a [u8],
}

impl<'a> SourcePixels<'a> {
    /// `None` unless `data` holds exactly `width * height` pixels of `layout`
    /// and both sides are non-zero.
    pub fn new(width: usize, height: usize, layout: PixelLayout, data: &'a [u8]) -> Option<Self> {
        let expected = width.checked_mul(height)?.checked_mul(layout.channels())?;
        (width > 0 && height > 0 && data.len() == expected).then_some(SourcePixels {
            width,
            height,
            layout,
            data,
        })
    }

    pub fn width(&self) -> usize {
        self.width
    }

    pub fn height(&self) -> usize {
        self.height
    }

    pub fn layout(&self) -> PixelLayout {
        self.layout
    }

    fn row(&self, y: usize) -> &'a [u8] {
        let row_bytes = self.width * self.layout.channels();
        &self.data[y * row_bytes..(y + 1) * row_bytes]
    }
}

/// Which pass runs first when both axes change.
///
/// Pillow's order depends on its version, and the order changes the result
/// (each pass rounds to uint8): up to 12.1 it always resamples horizontally
/// first; 12.2 and 12.3 go vertical first for images over 100 times taller
/// than wide that shrink in height; from 13.0 it goes vertical first whenever
/// the height shrinks and the width does not (a cheaper horizontal pass).
/// This resampler follows Pillow 13, the version the parity goldens use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassOrder {
    HorizontalFirst,
    VerticalFirst,
}

impl PassOrder {
    /// Pillow 13's choice for resizing `in_width x in_height` to
    /// `out_width x out_height`.
    pub fn pillow(in_width: usize, in_height: usize, out_width: usize, out_height: usize) -> Self {
        if out_width >= in_width && out_height < in_height {
            PassOrder::VerticalFirst
        } else {
            PassOrder::HorizontalFirst
        }
    }
}

/// Streams a PIL-identical bicubic resize of a [`SourcePixels`] image to RGB
/// uint8 rows, a caller-sized batch of output rows at a time.
#[derive(Debug)]
pub struct BicubicRgbResampler<'a> {
    source: SourcePixels<'a>,
    out_width: usize,
    out_height: usize,
    order: PassOrder,
    /// `None` when the width does not change (PIL skips that pass).
    horizontal: Option<AxisTaps>,
    /// `None` when the height does not change.
    vertical: Option<AxisTaps>,
    /// Horizontal first: a ring of horizontally resampled source rows (RGB,
    /// output width); source row `r` lives in slot `r % window_rows`.
    /// Vertical first: one vertically resampled row in the source layout.
    scratch: Vec<u8>,
    window_rows: usize,
    /// Horizontal first: source rows below this one have been resampled
    /// horizontally (or skipped as unused).
    next_source_row: usize,
    next_output_row: usize,
    /// Byte offsets of the rows the current output row reads.
    tap_rows: Vec<usize>,
}

impl<'a> BicubicRgbResampler<'a> {
    /// Prepares a resize of `source` to `out_width` x `out_height` (both
    /// non-zero) in Pillow 13's pass order: computes both axes' weights once.
    pub fn new(source: SourcePixels<'a>, out_width: usize, out_height: usize) -> Self {
        let order = PassOrder::pillow(source.width, source.height, out_width, out_height);
        Self::with_order(source, out_width, out_height, order)
    }

    /// As [`new`](Self::new), with the pass order chosen by the caller (to
    /// reproduce another Pillow version). The order only matters when both
    /// sides change.
    pub fn with_order(
        source: SourcePixels<'a>,
        out_width: usize,
        out_height: usize,
        order: PassOrder,
    ) -> Self {
        Self::build(source, out_width, out_height, order, Vec::new())
    }

    /// As [`new`](Self::new), with its row window in `scratch` (a buffer
    /// from an earlier image; its contents do not matter). Get the buffer
    /// back with [`into_scratch`](Self::into_scratch).
    pub fn with_scratch(
        source: SourcePixels<'a>,
        out_width: usize,
        out_height: usize,
        scratch: Vec<u8>,
    ) -> Self {
        let order = PassOrder::pillow(source.width, source.height, out_width, out_height);
        Self::build(source, out_width, out_height, order, scratch)
    }

    /// The row-window buffer, for the next image.
    pub fn into_scratch(self) -> Vec<u8> {
        self.scratch
    }

    fn build(
        source: SourcePixels<'a>,
        out_width: usize,
        out_height: usize,
        order: PassOrder,
        scratch: Vec<u8>,
    ) -> Self {
        let horizontal =
            (out_width != source.width).then(|| AxisTaps::bicubic(source.width, out_width));
        let vertical =
            (out_height != source.height).then(|| AxisTaps::bicubic(source.height, out_height));
        let order = if horizontal.is_some() {
            order
        } else {
            PassOrder::VerticalFirst
        };
        let (scratch_len, window_rows) = match (&vertical, order) {
            (None, _) => (0, 0),
            (Some(_), PassOrder::VerticalFirst) => (source.width * source.layout.channels(), 0),
            (Some(vertical), PassOrder::HorizontalFirst) => (
                vertical.taps_per_output() * out_width * 3,
                vertical.taps_per_output(),
            ),
        };
        BicubicRgbResampler {
            source,
            out_width,
            out_height,
            order,
            horizontal,
            vertical,
            // Every row of the window is written before it is read.
            scratch: super::scratch::sized(scratch, scratch_len),
            window_rows,
            next_source_row: 0,
            next_output_row: 0,
            tap_rows: Vec::with_capacity(window_rows),
        }
    }

    /// Bytes in one output row (`out_width * 3`).
    pub fn row_bytes(&self) -> usize {
        self.out_width * 3
    }

    /// Output rows not yet written.
    pub fn remaining_rows(&self) -> usize {
        self.out_height - self.next_output_row
    }

    /// Writes the next output rows into `out`, as many as fit whole (and
    /// remain), and returns how many it wrote.
    pub fn write_rows(&mut self, out: &mut [u8]) -> usize {
        let row_bytes = self.row_bytes();
        if row_bytes == 0 {
            return 0;
        }
        let rows = (out.len() / row_bytes).min(self.remaining_rows());
        for out_row in out.chunks_exact_mut(row_bytes).take(rows) {
            self.write_row(out_row);
            self.next_output_row += 1;
        }
        rows
    }

    fn write_row(&mut self, out_row: &mut [u8]) {
        let y = self.next_output_row;
        let layout = self.source.layout;
        let horizontal = self.horizontal.as_ref();
        let Some(vertical) = &self.vertical else {
            horizontal_pass(layout, self.source.row(y), horizontal, out_row);
            return;
        };
        let (first, weights) = vertical.taps(y);
        match self.order {
            PassOrder::VerticalFirst => {
                let source_row_bytes = self.source.width * layout.channels();
                self.tap_rows.clear();
                self.tap_rows
                    .extend((first..first + weights.len()).map(|row| row * source_row_bytes));
                if horizontal.is_none() && layout == PixelLayout::Rgb {
                    vertical_pass(self.source.data, &self.tap_rows, weights, out_row);
                } else {
                    vertical_pass(self.source.data, &self.tap_rows, weights, &mut self.scratch);
                    horizontal_pass(layout, &self.scratch, horizontal, out_row);
                }
            }
            PassOrder::HorizontalFirst => {
                let row_bytes = out_row.len();
                // Rows below `first` are never needed again: outputs read
                // non-decreasing source windows.
                while self.next_source_row < first + weights.len() {
                    let source_row = self.next_source_row;
                    if source_row >= first {
                        let slot = source_row % self.window_rows;
                        horizontal_pass(
                            layout,
                            self.source.row(source_row),
                            horizontal,
                            &mut self.scratch[slot * row_bytes..(slot + 1) * row_bytes],
                        );
                    }
                    self.next_source_row += 1;
                }
                self.tap_rows.clear();
                self.tap_rows.extend(
                    (first..first + weights.len()).map(|row| (row % self.window_rows) * row_bytes),
                );
                vertical_pass(&self.scratch, &self.tap_rows, weights, out_row);
            }
        }
    }
}

/// Resizes a whole image to RGB uint8 (`out_width * out_height * 3` bytes),
/// exactly as PIL's `img.convert("RGB").resize((w, h), BICUBIC)`.
pub fn resize_to_rgb8(source: SourcePixels<'_>, out_width: usize, out_height: usize) -> Vec<u8> {
    let mut resampler = BicubicRgbResampler::new(source, out_width, out_height);
    let mut out = vec![0; out_width * out_height * 3];
    resampler.write_rows(&mut out);
    out
}

/// One source row to one RGB row of the output width: resampled when `taps`
/// is given, otherwise only converted to RGB.
fn horizontal_pass(
    layout: PixelLayout,
    source_row: &[u8],
    taps: Option<&AxisTaps>,
    out: &mut [u8],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the function only requires AVX2, which this CPU has.
        return unsafe { horizontal_pass_avx2(layout, source_row, taps, out) };
    }
    horizontal_pass_portable(layout, source_row, taps, out);
}

/// [`horizontal_pass_portable`] compiled for AVX2 (the kernels are inlined
/// into it, so LLVM vectorizes them with 256-bit integer operations).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn horizontal_pass_avx2(
    layout: PixelLayout,
    source_row: &[u8],
    taps: Option<&AxisTaps>,
    out: &mut [u8],
) {
    horizontal_pass_portable(layout, source_row, taps, out);
}

#[inline(always)]
fn horizontal_pass_portable(
    layout: PixelLayout,
    source_row: &[u8],
    taps: Option<&AxisTaps>,
    out: &mut [u8],
) {
    match (taps, layout) {
        (Some(taps), PixelLayout::Gray) => resample_row::<1, true>(source_row, taps, out),
        (Some(taps), PixelLayout::GrayAlpha) => resample_row::<2, true>(source_row, taps, out),
        (Some(taps), PixelLayout::Rgb) => resample_row::<3, false>(source_row, taps, out),
        (Some(taps), PixelLayout::Rgba) => resample_row::<4, false>(source_row, taps, out),
        (None, PixelLayout::Gray) => copy_row::<1, true>(source_row, out),
        (None, PixelLayout::GrayAlpha) => copy_row::<2, true>(source_row, out),
        (None, PixelLayout::Rgb) => out.copy_from_slice(source_row),
        (None, PixelLayout::Rgba) => copy_row::<4, false>(source_row, out),
    }
}

/// Picks a fixed-tap-count loop for the common kernel widths (4 when
/// enlarging, 5-7 when shrinking a little).
#[inline(always)]
fn resample_row<const STRIDE: usize, const GRAY: bool>(
    source_row: &[u8],
    taps: &AxisTaps,
    out: &mut [u8],
) {
    match taps.taps_per_output() {
        4 => resample_row_fixed::<STRIDE, GRAY, 4>(source_row, taps, out),
        5 => resample_row_fixed::<STRIDE, GRAY, 5>(source_row, taps, out),
        6 => resample_row_fixed::<STRIDE, GRAY, 6>(source_row, taps, out),
        7 => resample_row_fixed::<STRIDE, GRAY, 7>(source_row, taps, out),
        _ => resample_row_any::<STRIDE, GRAY>(source_row, taps, out),
    }
}

// The kernels below index instead of zipping iterators: the release profile
// builds without LTO in many codegen units, where `Zip`'s specialised
// constructor is not inlined and costs more than the arithmetic.

#[allow(clippy::needless_range_loop)]
#[inline(always)]
fn resample_row_fixed<const STRIDE: usize, const GRAY: bool, const TAPS: usize>(
    source_row: &[u8],
    taps: &AxisTaps,
    out: &mut [u8],
) {
    let pixels = out.len() / 3;
    let firsts = &taps.first[..pixels];
    let weights = &taps.weights[..pixels * TAPS];
    for x in 0..pixels {
        let start = firsts[x] * STRIDE;
        let window = &source_row[start..start + TAPS * STRIDE];
        let weight = &weights[x * TAPS..x * TAPS + TAPS];
        let mut sums = [ROUNDING_BIAS; 3];
        for k in 0..TAPS {
            let pixel = &window[k * STRIDE..k * STRIDE + STRIDE];
            if GRAY {
                sums[0] += i32::from(pixel[0]) * weight[k];
            } else {
                sums[0] += i32::from(pixel[0]) * weight[k];
                sums[1] += i32::from(pixel[1]) * weight[k];
                sums[2] += i32::from(pixel[2]) * weight[k];
            }
        }
        store_rgb::<GRAY>(sums, &mut out[x * 3..x * 3 + 3]);
    }
}

#[allow(clippy::needless_range_loop)]
#[inline(always)]
fn resample_row_any<const STRIDE: usize, const GRAY: bool>(
    source_row: &[u8],
    taps: &AxisTaps,
    out: &mut [u8],
) {
    for x in 0..out.len() / 3 {
        let (first, weights) = taps.taps(x);
        let window = &source_row[first * STRIDE..(first + weights.len()) * STRIDE];
        let mut sums = [ROUNDING_BIAS; 3];
        for k in 0..weights.len() {
            let pixel = &window[k * STRIDE..k * STRIDE + STRIDE];
            sums[0] += i32::from(pixel[0]) * weights[k];
            if !GRAY {
                sums[1] += i32::from(pixel[1]) * weights[k];
                sums[2] += i32::from(pixel[2]) * weights[k];
            }
        }
        store_rgb::<GRAY>(sums, &mut out[x * 3..x * 3 + 3]);
    }
}

#[inline(always)]
fn store_rgb<const GRAY: bool>(sums: [i32; 3], out: &mut [u8]) {
    if GRAY {
        out.fill(to_pixel(sums[0]));
    } else {
        out[0] = to_pixel(sums[0]);
        out[1] = to_pixel(sums[1]);
        out[2] = to_pixel(sums[2]);
    }
}

#[inline(always)]
fn copy_row<const STRIDE: usize, const GRAY: bool>(source_row: &[u8], out: &mut [u8]) {
    for (x, pixel) in out.chunks_exact_mut(3).enumerate() {
        let source = &source_row[x * STRIDE..x * STRIDE + STRIDE];
        if GRAY {
            pixel.fill(source[0]);
        } else {
            pixel.copy_from_slice(&source[..3]);
        }
    }
}

/// One output row (`out.len()` bytes) as the weighted sum of the rows of
/// `data` starting at `row_offsets`.
fn vertical_pass(data: &[u8], row_offsets: &[usize], weights: &[i32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the function only requires AVX2, which this CPU has.
        return unsafe { vertical_pass_avx2(data, row_offsets, weights, out) };
    }
    vertical_pass_portable(data, row_offsets, weights, out);
}

/// [`vertical_pass_portable`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn vertical_pass_avx2(data: &[u8], row_offsets: &[usize], weights: &[i32], out: &mut [u8]) {
    vertical_pass_portable(data, row_offsets, weights, out);
}

/// With a fixed-count loop for the common kernel widths.
#[inline(always)]
fn vertical_pass_portable(data: &[u8], row_offsets: &[usize], weights: &[i32], out: &mut [u8]) {
    match weights.len() {
        4 => vertical_pass_fixed::<4>(data, row_offsets, weights, out),
        5 => vertical_pass_fixed::<5>(data, row_offsets, weights, out),
        6 => vertical_pass_fixed::<6>(data, row_offsets, weights, out),
        7 => vertical_pass_fixed::<7>(data, row_offsets, weights, out),
        _ => vertical_pass_any(data, row_offsets, weights, out),
    }
}

#[allow(clippy::needless_range_loop)]
#[inline(always)]
fn vertical_pass_fixed<const TAPS: usize>(
    data: &[u8],
    row_offsets: &[usize],
    weights: &[i32],
    out: &mut [u8],
) {
    let len = out.len();
    let rows: [&[u8]; TAPS] = std::array::from_fn(|t| &data[row_offsets[t]..row_offsets[t] + len]);
    let weights: [i32; TAPS] = std::array::from_fn(|t| weights[t]);
    for i in 0..len {
        let mut sum = ROUNDING_BIAS;
        for t in 0..TAPS {
            sum += i32::from(rows[t][i]) * weights[t];
        }
        out[i] = to_pixel(sum);
    }
}

/// Any kernel width: works on chunks so the sums stay in registers (or at
/// least in L1) across taps.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
fn vertical_pass_any(data: &[u8], row_offsets: &[usize], weights: &[i32], out: &mut [u8]) {
    let len = out.len();
    let mut start = 0;
    while start < len {
        let n = VERTICAL_CHUNK.min(len - start);
        let mut sums = [ROUNDING_BIAS; VERTICAL_CHUNK];
        for (t, &offset) in row_offsets.iter().enumerate() {
            let weight = weights[t];
            let row = &data[offset + start..offset + start + n];
            for i in 0..n {
                sums[i] += i32::from(row[i]) * weight;
            }
        }
        let out_chunk = &mut out[start..start + n];
        for i in 0..n {
            out_chunk[i] = to_pixel(sums[i]);
        }
        start += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smart_resize_matches_hugging_face() {
        // (height, width, factor, min_pixels, max_pixels) -> (height, width),
        // the expectations printed by transformers 4.57's smart_resize.
        type Case = ((u32, u32, u32, u64, u64), (u32, u32));
        let table: &[Case] = &[
            ((480, 640, 28, 3136, 12845056), (476, 644)),
            ((1080, 1920, 28, 3136, 12845056), (1092, 1932)),
            ((20, 20, 28, 3136, 12845056), (56, 56)),
            ((517, 333, 28, 3136, 12845056), (504, 336)),
            // 42/28 = 1.5 rounds to 2 and 70/28 = 2.5 rounds to 2: ties to even.
            ((42, 70, 28, 3136, 12845056), (56, 56)),
            ((70, 42, 28, 3136, 1003520), (56, 56)),
            ((98, 126, 28, 3136, 12845056), (112, 112)),
            ((4000, 6000, 28, 3136, 12845056), (2912, 4368)),
            ((1080, 1920, 28, 3136, 200704), (336, 588)),
            ((2400, 300, 28, 3136, 12845056), (2408, 308)),
            ((10, 2000, 28, 3136, 12845056), (28, 812)),
            ((1, 200, 28, 3136, 12845056), (28, 812)),
            ((3000, 4000, 28, 3136, 1003520), (840, 1148)),
            ((1080, 1920, 32, 65536, 16777216), (1088, 1920)),
            ((480, 640, 32, 65536, 16777216), (480, 640)),
            ((100, 100, 28, 1, 1), (28, 28)),
            ((1, 1, 28, 3136, 12845056), (56, 56)),
        ];
        for &((h, w, factor, min, max), expected) in table {
            assert_eq!(
                smart_resize(h, w, factor, min, max),
                Ok(expected),
                "{h}x{w} factor {factor} pixels {min}..{max}"
            );
        }
    }

    #[test]
    fn smart_resize_rejects_bad_shapes() {
        assert_eq!(
            smart_resize(10, 2001, 28, 3136, 12845056),
            Err(ResizeError::AspectRatio {
                width: 2001,
                height: 10
            })
        );
        assert!(matches!(
            smart_resize(2001, 10, 28, 3136, 12845056),
            Err(ResizeError::AspectRatio { .. })
        ));
        assert!(matches!(
            smart_resize(0, 10, 28, 3136, 12845056),
            Err(ResizeError::ZeroSide { .. })
        ));
        // HF returns (0, 0) here; there is nothing to patchify.
        assert!(matches!(
            smart_resize(7, 9, 28, 0, 12845056),
            Err(ResizeError::Degenerate { .. })
        ));
    }

    #[test]
    fn bicubic_kernel_shape() {
        assert_eq!(bicubic_kernel(0.0), 1.0);
        assert_eq!(bicubic_kernel(1.0), 0.0);
        assert_eq!(bicubic_kernel(-2.0), 0.0);
        assert_eq!(bicubic_kernel(0.5), 0.5625);
        assert_eq!(bicubic_kernel(1.5), -0.0625);
        assert_eq!(bicubic_kernel(-1.5), -0.0625);
    }

    #[test]
    fn weights_sum_to_one_in_fixed_point() {
        for (in_len, out_len) in [(7, 3), (7, 10), (1920, 1932), (1920, 588), (5, 1), (1, 5)] {
            let taps = AxisTaps::bicubic(in_len, out_len);
            assert_eq!(taps.out_len(), out_len);
            for index in 0..out_len {
                let (first, weights) = taps.taps(index);
                assert!(first + weights.len() <= in_len);
                let total: i32 = weights.iter().sum();
                assert!(
                    (total - (1 << PRECISION_BITS)).abs() <= weights.len() as i32,
                    "{in_len}->{out_len} output {index}: {total}"
                );
            }
        }
        // Shrinking 4x stretches the kernel to 8 source pixels each side.
        assert_eq!(AxisTaps::bicubic(400, 100).taps_per_output(), 16);
        assert_eq!(AxisTaps::bicubic(100, 400).taps_per_output(), 4);
        // A 1-pixel source: every output reads that pixel with full weight.
        let single = AxisTaps::bicubic(1, 5);
        assert_eq!(single.taps(3), (0, &[1 << PRECISION_BITS][..]));
    }

    fn gradient_row() -> Vec<u8> {
        // PIL's input: R = row, G = 255 - row, B = row / 2.
        [0u8, 50, 100, 200, 255, 30, 0]
            .iter()
            .flat_map(|&v| [v, 255 - v, v / 2])
            .collect()
    }

    #[test]
    fn horizontal_resize_matches_pil_values() {
        // Expectations printed by Pillow 13's Image.resize((w, 1), BICUBIC).
        let row = gradient_row();
        let source = SourcePixels::new(7, 1, PixelLayout::Rgb, &row).expect("7x1 RGB");
        let cases: &[(usize, &[u8])] = &[
            (3, &[35, 220, 18, 185, 70, 93, 64, 191, 32]),
            (4, &[18, 237, 9, 124, 131, 62, 208, 47, 104, 13, 242, 7]),
            (
                10,
                &[
                    0, 255, 0, 23, 232, 12, 61, 194, 31, 96, 159, 48, 166, 89, 83, 234, 21, 117,
                    250, 5, 124, 79, 176, 39, 1, 254, 1, 0, 255, 0,
                ],
            ),
        ];
        for &(width, expected) in cases {
            assert_eq!(resize_to_rgb8(source, width, 1), expected, "7 -> {width}");
        }
        assert_eq!(resize_to_rgb8(source, 7, 1), row, "same size is a copy");
    }

    #[test]
    fn vertical_resize_matches_pil_values() {
        let column = [0u8, 50, 100, 200, 255, 30, 0];
        let source = SourcePixels::new(1, 7, PixelLayout::Gray, &column).expect("1x7 gray");
        let resized = resize_to_rgb8(source, 1, 4);
        assert_eq!(
            resized,
            [18, 18, 18, 124, 124, 124, 208, 208, 208, 13, 13, 13]
        );
    }

    /// A deterministic pseudo-random image (xorshift), for comparisons.
    fn noise(width: usize, height: usize, channels: usize, seed: u32) -> Vec<u8> {
        let mut state = seed.max(1);
        (0..width * height * channels)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                (state >> 24) as u8
            })
            .collect()
    }

    /// The textbook two-pass resize with a full intermediate image, written
    /// independently of the streaming logic.
    fn two_pass_reference(
        rgb: &[u8],
        (width, height): (usize, usize),
        (out_width, out_height): (usize, usize),
        order: PassOrder,
    ) -> Vec<u8> {
        // Resamples along x (`along_x`) or y an image of `w x h` RGB pixels.
        let pass = |input: &[u8], w: usize, h: usize, along_x: bool, out_len: usize| {
            let taps = AxisTaps::bicubic(if along_x { w } else { h }, out_len);
            let (ow, oh) = if along_x { (out_len, h) } else { (w, out_len) };
            let mut out = vec![0u8; ow * oh * 3];
            for y in 0..oh {
                for x in 0..ow {
                    let (first, weights) = taps.taps(if along_x { x } else { y });
                    for c in 0..3 {
                        let mut sum = ROUNDING_BIAS;
                        for (k, &weight) in weights.iter().enumerate() {
                            let (sx, sy) = if along_x {
                                (first + k, y)
                            } else {
                                (x, first + k)
                            };
                            sum += i32::from(input[(sy * w + sx) * 3 + c]) * weight;
                        }
                        out[(y * ow + x) * 3 + c] = to_pixel(sum);
                    }
                }
            }
            out
        };
        let mut image = rgb.to_vec();
        let (mut w, mut h) = (width, height);
        let axes = match order {
            PassOrder::HorizontalFirst => [true, false],
            PassOrder::VerticalFirst => [false, true],
        };
        for along_x in axes {
            if along_x && out_width != w {
                image = pass(&image, w, h, true, out_width);
                w = out_width;
            } else if !along_x && out_height != h {
                image = pass(&image, w, h, false, out_height);
                h = out_height;
            }
        }
        image
    }

    #[test]
    fn streaming_resize_equals_two_pass_reference() {
        let (width, height) = (37, 23);
        let rgb = noise(width, height, 3, 7);
        let source = SourcePixels::new(width, height, PixelLayout::Rgb, &rgb).expect("rgb");
        let sizes = [
            (37, 23),
            (56, 56),
            (12, 7),
            (5, 60),
            (80, 9),
            (37, 11),
            (9, 23),
            (40, 20),
        ];
        for (ow, oh) in sizes {
            for order in [PassOrder::HorizontalFirst, PassOrder::VerticalFirst] {
                let expected = two_pass_reference(&rgb, (width, height), (ow, oh), order);
                let mut resampler = BicubicRgbResampler::with_order(source, ow, oh, order);
                let mut whole = vec![0u8; ow * oh * 3];
                assert_eq!(resampler.write_rows(&mut whole), oh);
                assert_eq!(whole, expected, "{width}x{height} -> {ow}x{oh} {order:?}");

                // The same result when pulled a few rows at a time.
                let mut resampler = BicubicRgbResampler::with_order(source, ow, oh, order);
                let mut pieces = Vec::new();
                let mut batch = vec![0u8; resampler.row_bytes() * 3];
                while resampler.remaining_rows() > 0 {
                    let rows = resampler.write_rows(&mut batch);
                    pieces.extend_from_slice(&batch[..rows * ow * 3]);
                }
                assert_eq!(pieces, expected, "batched {ow}x{oh} {order:?}");
            }
        }
    }

    #[test]
    fn pass_order_follows_pillow_13() {
        // Height shrinks, width grows or stays: vertical first.
        assert_eq!(
            PassOrder::pillow(333, 517, 336, 504),
            PassOrder::VerticalFirst
        );
        assert_eq!(
            PassOrder::pillow(300, 517, 300, 504),
            PassOrder::VerticalFirst
        );
        assert_eq!(
            PassOrder::pillow(640, 480, 644, 476),
            PassOrder::VerticalFirst
        );
        // Everything else: horizontal first.
        assert_eq!(
            PassOrder::pillow(517, 333, 504, 336),
            PassOrder::HorizontalFirst
        );
        assert_eq!(
            PassOrder::pillow(1920, 1080, 1932, 1092),
            PassOrder::HorizontalFirst
        );
        assert_eq!(
            PassOrder::pillow(1920, 1080, 588, 336),
            PassOrder::HorizontalFirst
        );
        // The order changes results when both axes change (rounding between passes).
        let rgb = noise(37, 23, 3, 9);
        let (a, b) = (
            two_pass_reference(&rgb, (37, 23), (40, 20), PassOrder::HorizontalFirst),
            two_pass_reference(&rgb, (37, 23), (40, 20), PassOrder::VerticalFirst),
        );
        let differing = a.iter().zip(&b).filter(|(x, y)| x != y).count();
        assert!(differing > 0, "{differing} of {}", a.len());
    }

    #[test]
    fn gray_and_alpha_layouts_resize_like_their_rgb_conversion() {
        let (width, height) = (19, 13);
        let gray_alpha = noise(width, height, 2, 3);
        let as_rgb: Vec<u8> = gray_alpha.chunks_exact(2).flat_map(|p| [p[0]; 3]).collect();
        let rgba: Vec<u8> = noise(width, height, 4, 5);
        let rgba_as_rgb: Vec<u8> = rgba
            .chunks_exact(4)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect();
        let gray: Vec<u8> = gray_alpha.chunks_exact(2).map(|p| p[0]).collect();
        let rgb_source =
            |data| SourcePixels::new(width, height, PixelLayout::Rgb, data).expect("rgb");
        for (ow, oh) in [(19, 13), (8, 30), (40, 13), (19, 5)] {
            let sources = [
                (PixelLayout::GrayAlpha, &gray_alpha, &as_rgb),
                (PixelLayout::Gray, &gray, &as_rgb),
                (PixelLayout::Rgba, &rgba, &rgba_as_rgb),
            ];
            for (layout, data, rgb) in sources {
                let source = SourcePixels::new(width, height, layout, data).expect("source");
                assert_eq!(
                    resize_to_rgb8(source, ow, oh),
                    resize_to_rgb8(rgb_source(rgb), ow, oh),
                    "{layout:?} -> {ow}x{oh}"
                );
            }
        }
    }

    #[test]
    fn constant_images_stay_constant() {
        let flat = vec![77u8; 50 * 30 * 3];
        let source = SourcePixels::new(50, 30, PixelLayout::Rgb, &flat).expect("rgb");
        for (ow, oh) in [(7, 5), (120, 90), (50, 4)] {
            assert!(resize_to_rgb8(source, ow, oh).iter().all(|&v| v == 77));
        }
    }

    #[test]
    fn source_pixels_checks_its_buffer() {
        assert!(SourcePixels::new(2, 2, PixelLayout::Rgb, &[0; 12]).is_some());
        assert!(SourcePixels::new(2, 2, PixelLayout::Rgb, &[0; 11]).is_none());
        assert!(SourcePixels::new(0, 2, PixelLayout::Rgb, &[]).is_none());
        assert!(SourcePixels::new(usize::MAX, 2, PixelLayout::Rgba, &[]).is_none());
    }
}
