//! How a resized pixel byte becomes the bytes the engine reads.
//!
//! Why a file of its own: after the resize, every output element is a
//! function of just (channel, byte value): HF rescales a uint8 by the rescale
//! factor in f64, casts to f32, then subtracts the f32 mean and divides by the
//! f32 std. There are only 3 × 256 distinct results, so they are computed
//! once, with HF's exact f32 arithmetic, and stored already encoded as
//! little-endian f32 or bf16 bytes. Patchifying is then a table lookup and a
//! store per element, and matches HF bit for bit given the same pixels.

use super::config::{CHANNELS, VisionPreprocessConfig};

/// `value` rounded to bfloat16 (round to nearest, ties to even), as bits.
/// NaN stays NaN (made quiet, sign kept) instead of rounding into infinity;
/// values past bf16's range round to infinity, as in PyTorch.
pub fn f32_to_bf16_bits(value: f32) -> u16 {
    let bits = value.to_bits();
    if value.is_nan() {
        return ((bits >> 16) as u16) | 0x0040;
    }
    let lowest_kept_bit = (bits >> 16) & 1;
    // Cannot overflow: the largest non-NaN pattern, -inf, is 0xFF80_0000.
    ((bits + 0x7FFF + lowest_kept_bit) >> 16) as u16
}

/// The f32 Hugging Face's processor produces for byte `value` of `channel`.
pub fn normalized_value(config: &VisionPreprocessConfig, channel: usize, value: u8) -> f32 {
    let mut x = if config.do_rescale {
        (f64::from(value) * config.rescale_factor) as f32
    } else {
        f32::from(value)
    };
    if config.do_normalize {
        x = (x - config.image_mean[channel] as f32) / config.image_std[channel] as f32;
    }
    x
}

/// For each channel and byte value, the destination encoding (`N` bytes,
/// little-endian) of its normalized value.
#[derive(Debug, Clone)]
pub struct EncodedValueTable<const N: usize> {
    entries: [[[u8; N]; 256]; CHANNELS],
}

impl EncodedValueTable<4> {
    /// Little-endian f32.
    pub fn float32(config: &VisionPreprocessConfig) -> Self {
        Self::build(config, |x| x.to_le_bytes())
    }
}

impl EncodedValueTable<2> {
    /// Little-endian bf16, rounded to nearest even.
    pub fn bfloat16(config: &VisionPreprocessConfig) -> Self {
        Self::build(config, |x| f32_to_bf16_bits(x).to_le_bytes())
    }
}

impl<const N: usize> EncodedValueTable<N> {
    fn build(config: &VisionPreprocessConfig, encode: impl Fn(f32) -> [u8; N]) -> Self {
        let mut entries = [[[0u8; N]; 256]; CHANNELS];
        for (channel, table) in entries.iter_mut().enumerate() {
            for (value, entry) in (0..=u8::MAX).zip(table.iter_mut()) {
                *entry = encode(normalized_value(config, channel, value));
            }
        }
        EncodedValueTable { entries }
    }

    /// The 256 encodings of one channel.
    #[inline]
    pub fn channel(&self, channel: usize) -> &[[u8; N]; 256] {
        &self.entries[channel]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        let cases: &[(u32, u16)] = &[
            (0x3F80_0000, 0x3F80), // 1.0 exactly
            (0x3F80_7FFF, 0x3F80), // just below half: down
            (0x3F80_8000, 0x3F80), // tie, kept bit even: stays
            (0x3F81_8000, 0x3F82), // tie, kept bit odd: up to even
            (0x3F80_8001, 0x3F81), // just above half: up
            (0xBF80_8001, 0xBF81), // negative, above half: away from zero
            (0x8000_0000, 0x8000), // -0.0
            (0x0000_8000, 0x0000), // subnormal tie rounds to even (zero)
            (0x7F7F_FFFF, 0x7F80), // f32::MAX rounds to +inf
            (0x7F80_0000, 0x7F80), // +inf
            (0xFF80_0000, 0xFF80), // -inf
        ];
        for &(bits, expected) in cases {
            assert_eq!(
                f32_to_bf16_bits(f32::from_bits(bits)),
                expected,
                "{bits:#010x}"
            );
        }
    }

    #[test]
    fn bf16_keeps_nan_a_nan() {
        for bits in [0x7FC0_0000u32, 0x7F80_0001, 0xFF80_0001, 0x7FFF_FFFF] {
            let rounded = f32_to_bf16_bits(f32::from_bits(bits));
            let widened = f32::from_bits(u32::from(rounded) << 16);
            assert!(widened.is_nan(), "{bits:#010x} became {rounded:#06x}");
            assert_eq!(
                rounded & 0x8000,
                ((bits >> 16) as u16) & 0x8000,
                "sign kept"
            );
        }
    }

    fn clip_config() -> VisionPreprocessConfig {
        VisionPreprocessConfig::from_json(
            r#"{"image_processor_type": "Qwen2VLImageProcessor"}"#,
            None,
        )
        .expect("default config")
    }

    #[test]
    fn table_holds_hf_arithmetic() {
        let config = clip_config();
        let table = EncodedValueTable::float32(&config);
        // numpy: (np.float32(np.float64(v) * (1/255)) - np.float32(mean)) / np.float32(std)
        // (The config holds f64; numpy casts mean and std to f32.)
        let expected_red_0 = (0.0f32 - 0.48145466f64 as f32) / 0.26862954f64 as f32;
        assert_eq!(f32::from_le_bytes(table.channel(0)[0]), expected_red_0);
        let blue_255 = (((255.0f64 / 255.0) as f32) - 0.40821073f64 as f32) / 0.27577711f64 as f32;
        assert_eq!(f32::from_le_bytes(table.channel(2)[255]), blue_255);
        assert!((f32::from_le_bytes(table.channel(1)[128]) - 0.16889).abs() < 1e-4);

        let bf16 = EncodedValueTable::bfloat16(&config);
        for channel in 0..CHANNELS {
            for value in 0..=255u8 {
                let full = f32::from_le_bytes(table.channel(channel)[usize::from(value)]);
                let bits = u16::from_le_bytes(bf16.channel(channel)[usize::from(value)]);
                assert_eq!(bits, f32_to_bf16_bits(full));
            }
        }
    }

    #[test]
    fn flags_turn_steps_off() {
        let mut config = clip_config();
        config.do_normalize = false;
        assert_eq!(normalized_value(&config, 0, 51), (51.0f64 / 255.0) as f32);
        config.do_rescale = false;
        assert_eq!(normalized_value(&config, 2, 51), 51.0);
    }
}
