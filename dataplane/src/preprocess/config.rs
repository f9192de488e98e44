//! The preprocessing parameters of a Qwen2-VL family model, read from its
//! Hugging Face model directory.
//!
//! Why a file of its own: the numbers that decide the tensor's shape (patch,
//! merge and temporal patch sizes, the pixel budget) and values (mean, std,
//! rescale factor) are spelled differently across Qwen2-VL, Qwen2.5-VL and
//! Qwen3-VL releases and live in two files. This module settles them once, at
//! start-up, into one validated [`VisionPreprocessConfig`] so the kernel never
//! looks at JSON.
//!
//! Resolution rules (each mirrors what Hugging Face does, except where noted):
//! - Pixel budget: start from HF's defaults (56*56, 28*28*1280), take
//!   `size.shortest_edge` / `size.longest_edge` when present, then let the
//!   top-level `min_pixels` / `max_pixels` win. This is the rule of HF's fast
//!   processor (`Qwen2VLImageProcessorFast`, what Qwen3-VL ships with). HF's
//!   slow processor (transformers 4.57) ignores `size` unless `min_pixels` and
//!   `max_pixels` are also given; every Qwen2-VL / Qwen2.5-VL release does give
//!   them, so the two agree on real models.
//! - Patch, merge and temporal patch sizes: `preprocessor_config.json` first,
//!   then `config.json`'s `vision_config` (`patch_size` / `spatial_patch_size`,
//!   `spatial_merge_size`, `temporal_patch_size`), then HF's defaults. When both
//!   files give a value and they differ, loading fails: the processor and the
//!   vision tower would disagree, and the model would see garbage.
//! - Only what this kernel implements is accepted: three input channels,
//!   bicubic resampling (`resample` 3) and `do_resize` true.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Model types (`config.json`'s `model_type`) whose images this kernel serves.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"];

/// Image processor classes (`image_processor_type`) that define this layout.
pub const SUPPORTED_PROCESSOR_TYPES: &[&str] = &[
    "Qwen2VLImageProcessor",
    "Qwen2VLImageProcessorFast",
    "Qwen2_5_VLImageProcessor",
];

/// The kernel always produces three channels (PIL's `convert("RGB")`).
pub const CHANNELS: usize = 3;

const DEFAULT_PATCH_SIZE: u32 = 14;
const DEFAULT_MERGE_SIZE: u32 = 2;
const DEFAULT_TEMPORAL_PATCH_SIZE: u32 = 2;
const DEFAULT_MIN_PIXELS: u64 = 56 * 56;
const DEFAULT_MAX_PIXELS: u64 = 28 * 28 * 1280;
const OPENAI_CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
const OPENAI_CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];
const PIL_BICUBIC: u32 = 3;

/// Validated preprocessing parameters for one Qwen2-VL family model.
#[derive(Debug, Clone, PartialEq)]
pub struct VisionPreprocessConfig {
    /// `config.json`'s `model_type`, when the model directory had one.
    pub model_type: Option<String>,
    /// Side of one square patch, in resized pixels (14 for Qwen2/2.5-VL, 16 for Qwen3-VL).
    pub patch_size: u32,
    /// Patches merged per side into one LLM token (2).
    pub merge_size: u32,
    /// Frames per patch along time; a still image is repeated this many times (2).
    pub temporal_patch_size: u32,
    /// Lower bound on resized width × height.
    pub min_pixels: u64,
    /// Upper bound on resized width × height.
    pub max_pixels: u64,
    /// Per-channel mean subtracted after rescaling (R, G, B).
    pub image_mean: [f64; 3],
    /// Per-channel standard deviation divided by after subtracting the mean.
    pub image_std: [f64; 3],
    /// Factor applied to 0..=255 pixel values (1/255).
    pub rescale_factor: f64,
    /// Whether pixel values are multiplied by `rescale_factor`.
    pub do_rescale: bool,
    /// Whether `(value - mean) / std` is applied.
    pub do_normalize: bool,
    /// Recorded for completeness: the kernel always converts to RGB, as a
    /// three-channel mean/std requires.
    pub do_convert_rgb: bool,
}

/// Why a model directory's preprocessing config could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{file} is not a valid vision preprocessing config: {source}")]
    Parse {
        file: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("{0} is not a Qwen2-VL family model (qwen2_vl, qwen2_5_vl, qwen3_vl)")]
    UnsupportedModel(String),
    #[error("unsupported preprocessing setting: {0}")]
    Unsupported(String),
    #[error("invalid preprocessing setting: {0}")]
    Invalid(String),
    #[error(
        "{field} is {preprocessor} in preprocessor_config.json but {model} in config.json's vision_config"
    )]
    Inconsistent {
        field: &'static str,
        preprocessor: u32,
        model: u32,
    },
}

#[derive(Debug, Deserialize)]
struct RawPreprocessorConfig {
    image_processor_type: Option<String>,
    min_pixels: Option<u64>,
    max_pixels: Option<u64>,
    size: Option<RawSize>,
    patch_size: Option<u32>,
    merge_size: Option<u32>,
    temporal_patch_size: Option<u32>,
    image_mean: Option<PerChannel>,
    image_std: Option<PerChannel>,
    rescale_factor: Option<f64>,
    do_resize: Option<bool>,
    do_rescale: Option<bool>,
    do_normalize: Option<bool>,
    do_convert_rgb: Option<bool>,
    resample: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct RawSize {
    #[serde(alias = "min_pixels")]
    shortest_edge: Option<u64>,
    #[serde(alias = "max_pixels")]
    longest_edge: Option<u64>,
}

/// HF accepts one number for all channels or one per channel.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum PerChannel {
    All(f64),
    Each(Vec<f64>),
}

#[derive(Debug, Deserialize)]
struct RawModelConfig {
    model_type: Option<String>,
    vision_config: Option<RawVisionConfig>,
}

#[derive(Debug, Deserialize)]
struct RawVisionConfig {
    patch_size: Option<u32>,
    spatial_patch_size: Option<u32>,
    spatial_merge_size: Option<u32>,
    temporal_patch_size: Option<u32>,
    in_chans: Option<u32>,
    in_channels: Option<u32>,
}

impl VisionPreprocessConfig {
    /// Reads `preprocessor_config.json` (required) and `config.json`
    /// (optional) from a Hugging Face model directory. Start-up only: this is
    /// the one function in the module that does I/O.
    pub fn from_model_dir(dir: &Path) -> Result<Self, ConfigError> {
        let read = |path: PathBuf| {
            std::fs::read_to_string(&path).map_err(|source| ConfigError::Read { path, source })
        };
        let preprocessor = read(dir.join("preprocessor_config.json"))?;
        let model_config_path = dir.join("config.json");
        let model = match std::fs::read_to_string(&model_config_path) {
            Ok(text) => Some(text),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => {
                return Err(ConfigError::Read {
                    path: model_config_path,
                    source,
                });
            }
        };
        Self::from_json(&preprocessor, model.as_deref())
    }

    /// Parses the two files' contents (`config.json` may be absent).
    pub fn from_json(
        preprocessor_json: &str,
        model_config_json: Option<&str>,
    ) -> Result<Self, ConfigError> {
        let pre: RawPreprocessorConfig =
            serde_json::from_str(preprocessor_json).map_err(|source| ConfigError::Parse {
                file: "preprocessor_config.json",
                source,
            })?;
        let model: Option<RawModelConfig> = model_config_json
            .map(serde_json::from_str)
            .transpose()
            .map_err(|source| ConfigError::Parse {
                file: "config.json",
                source,
            })?;
        let model_type = model.as_ref().and_then(|m| m.model_type.clone());
        check_family(model_type.as_deref(), pre.image_processor_type.as_deref())?;

        let vision = model.as_ref().and_then(|m| m.vision_config.as_ref());
        if let Some(channels) = vision.and_then(|v| v.in_chans.or(v.in_channels))
            && channels != CHANNELS as u32
        {
            return Err(ConfigError::Unsupported(format!(
                "vision tower takes {channels} input channels, this kernel produces 3"
            )));
        }
        if pre.do_resize == Some(false) {
            return Err(ConfigError::Unsupported("do_resize = false".into()));
        }
        if let Some(resample) = pre.resample
            && resample != PIL_BICUBIC
        {
            return Err(ConfigError::Unsupported(format!(
                "resample = {resample} (only 3, bicubic, is implemented)"
            )));
        }

        let patch_size = resolve(
            "patch_size",
            pre.patch_size,
            vision.and_then(|v| v.patch_size.or(v.spatial_patch_size)),
            DEFAULT_PATCH_SIZE,
        )?;
        let merge_size = resolve(
            "merge_size",
            pre.merge_size,
            vision.and_then(|v| v.spatial_merge_size),
            DEFAULT_MERGE_SIZE,
        )?;
        let temporal_patch_size = resolve(
            "temporal_patch_size",
            pre.temporal_patch_size,
            vision.and_then(|v| v.temporal_patch_size),
            DEFAULT_TEMPORAL_PATCH_SIZE,
        )?;

        let mut min_pixels = DEFAULT_MIN_PIXELS;
        let mut max_pixels = DEFAULT_MAX_PIXELS;
        if let Some(size) = &pre.size {
            min_pixels = size.shortest_edge.unwrap_or(min_pixels);
            max_pixels = size.longest_edge.unwrap_or(max_pixels);
        }
        min_pixels = pre.min_pixels.unwrap_or(min_pixels);
        max_pixels = pre.max_pixels.unwrap_or(max_pixels);

        let config = VisionPreprocessConfig {
            model_type,
            patch_size,
            merge_size,
            temporal_patch_size,
            min_pixels,
            max_pixels,
            image_mean: per_channel("image_mean", pre.image_mean, OPENAI_CLIP_MEAN)?,
            image_std: per_channel("image_std", pre.image_std, OPENAI_CLIP_STD)?,
            rescale_factor: pre.rescale_factor.unwrap_or(1.0 / 255.0),
            do_rescale: pre.do_rescale.unwrap_or(true),
            do_normalize: pre.do_normalize.unwrap_or(true),
            do_convert_rgb: pre.do_convert_rgb.unwrap_or(true),
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the invariants the kernel relies on. Called by the parsers; call
    /// it again after editing fields by hand.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |what: String| Err(ConfigError::Invalid(what));
        if !(1..=256).contains(&self.patch_size) {
            return invalid(format!("patch_size {} (1..=256)", self.patch_size));
        }
        if !(1..=16).contains(&self.merge_size) {
            return invalid(format!("merge_size {} (1..=16)", self.merge_size));
        }
        if !(1..=16).contains(&self.temporal_patch_size) {
            return invalid(format!(
                "temporal_patch_size {} (1..=16)",
                self.temporal_patch_size
            ));
        }
        if self.max_pixels == 0 || self.min_pixels > self.max_pixels {
            return invalid(format!(
                "pixel budget {}..={} is empty",
                self.min_pixels, self.max_pixels
            ));
        }
        if !self.rescale_factor.is_finite() {
            return invalid(format!("rescale_factor {}", self.rescale_factor));
        }
        let finite = |values: &[f64; 3]| values.iter().all(|v| v.is_finite());
        if !finite(&self.image_mean) {
            return invalid(format!("image_mean {:?}", self.image_mean));
        }
        if !finite(&self.image_std) || self.image_std.contains(&0.0) {
            return invalid(format!("image_std {:?}", self.image_std));
        }
        Ok(())
    }

    /// Resized sides are multiples of this: `patch_size * merge_size`.
    pub fn resize_factor(&self) -> u32 {
        self.patch_size * self.merge_size
    }

    /// Width of the output tensor: `C * temporal_patch_size * P * P`
    /// (1176 for P = 14, 1536 for P = 16).
    pub fn patch_row_len(&self) -> usize {
        let patch = self.patch_size as usize;
        CHANNELS * self.temporal_patch_size as usize * patch * patch
    }
}

fn check_family(model_type: Option<&str>, processor_type: Option<&str>) -> Result<(), ConfigError> {
    match (model_type, processor_type) {
        (Some(model), _) if SUPPORTED_MODEL_TYPES.contains(&model) => Ok(()),
        (Some(model), _) => Err(ConfigError::UnsupportedModel(format!(
            "model_type {model:?}"
        ))),
        (None, Some(processor)) if SUPPORTED_PROCESSOR_TYPES.contains(&processor) => Ok(()),
        (None, Some(processor)) => Err(ConfigError::UnsupportedModel(format!(
            "image_processor_type {processor:?}"
        ))),
        (None, None) => Err(ConfigError::UnsupportedModel(
            "a model with neither model_type nor image_processor_type".into(),
        )),
    }
}

fn resolve(
    field: &'static str,
    preprocessor: Option<u32>,
    model: Option<u32>,
    default: u32,
) -> Result<u32, ConfigError> {
    match (preprocessor, model) {
        (Some(preprocessor), Some(model)) if preprocessor != model => {
            Err(ConfigError::Inconsistent {
                field,
                preprocessor,
                model,
            })
        }
        (Some(value), _) | (None, Some(value)) => Ok(value),
        (None, None) => Ok(default),
    }
}

fn per_channel(
    field: &str,
    value: Option<PerChannel>,
    default: [f64; 3],
) -> Result<[f64; 3], ConfigError> {
    match value {
        None => Ok(default),
        Some(PerChannel::All(v)) => Ok([v; 3]),
        Some(PerChannel::Each(values)) => <[f64; 3]>::try_from(values.as_slice()).map_err(|_| {
            ConfigError::Invalid(format!(
                "{field} has {} values, expected 3 (R, G, B)",
                values.len()
            ))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN2_VL_MODEL: &str = r#"{"model_type": "qwen2_vl",
        "vision_config": {"patch_size": 14, "spatial_patch_size": 14, "spatial_merge_size": 2,
                          "temporal_patch_size": 2, "in_chans": 3}}"#;

    fn fixture_model_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/model")
    }

    #[test]
    fn reads_the_committed_qwen2_vl_model_dir() {
        let config = VisionPreprocessConfig::from_model_dir(&fixture_model_dir())
            .expect("fixture model dir parses");
        assert_eq!(config.model_type.as_deref(), Some("qwen2_vl"));
        assert_eq!(
            (
                config.patch_size,
                config.merge_size,
                config.temporal_patch_size
            ),
            (14, 2, 2)
        );
        assert_eq!((config.min_pixels, config.max_pixels), (3136, 12845056));
        assert_eq!(config.image_mean, [0.48145466, 0.4578275, 0.40821073]);
        assert_eq!(config.image_std, [0.26862954, 0.26130258, 0.27577711]);
        assert_eq!(config.rescale_factor, 0.00392156862745098);
        assert!(config.do_rescale && config.do_normalize && config.do_convert_rgb);
        assert_eq!(config.resize_factor(), 28);
        assert_eq!(config.patch_row_len(), 1176);
    }

    #[test]
    fn qwen2_5_vl_spelling_with_top_level_pixel_budget() {
        let pre = r#"{"image_processor_type": "Qwen2_5_VLImageProcessor",
            "min_pixels": 3136, "max_pixels": 200704, "patch_size": 14,
            "temporal_patch_size": 2, "merge_size": 2,
            "image_mean": [0.1, 0.2, 0.3], "image_std": [0.4, 0.5, 0.6]}"#;
        let model = r#"{"model_type": "qwen2_5_vl", "vision_config": {"patch_size": 14,
            "spatial_merge_size": 2, "temporal_patch_size": 2, "in_chans": 3}}"#;
        let config = VisionPreprocessConfig::from_json(pre, Some(model)).expect("parses");
        assert_eq!((config.min_pixels, config.max_pixels), (3136, 200704));
        assert_eq!(config.image_mean, [0.1, 0.2, 0.3]);
        assert_eq!(config.image_std, [0.4, 0.5, 0.6]);
    }

    #[test]
    fn qwen3_vl_spelling_takes_size_and_vision_config() {
        // Qwen3-VL ships `size` only and leaves merge/temporal to config.json.
        let pre = r#"{"image_processor_type": "Qwen2VLImageProcessorFast",
            "size": {"longest_edge": 16777216, "shortest_edge": 65536},
            "patch_size": 16, "image_mean": 0.5, "image_std": [0.5, 0.5, 0.5]}"#;
        let model = r#"{"model_type": "qwen3_vl", "vision_config": {"patch_size": 16,
            "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3}}"#;
        let config = VisionPreprocessConfig::from_json(pre, Some(model)).expect("parses");
        assert_eq!(
            (
                config.patch_size,
                config.merge_size,
                config.temporal_patch_size
            ),
            (16, 2, 2)
        );
        assert_eq!((config.min_pixels, config.max_pixels), (65536, 16777216));
        assert_eq!(config.image_mean, [0.5; 3]);
        assert_eq!(config.patch_row_len(), 1536);
        assert_eq!(config.resize_factor(), 32);
    }

    #[test]
    fn top_level_pixel_budget_wins_over_size() {
        let pre = r#"{"image_processor_type": "Qwen2VLImageProcessor",
            "size": {"shortest_edge": 100, "longest_edge": 1000},
            "max_pixels": 5000}"#;
        let config = VisionPreprocessConfig::from_json(pre, None).expect("parses");
        assert_eq!((config.min_pixels, config.max_pixels), (100, 5000));
    }

    #[test]
    fn missing_fields_take_hf_defaults() {
        let config = VisionPreprocessConfig::from_json(
            r#"{"image_processor_type": "Qwen2VLImageProcessor"}"#,
            None,
        )
        .expect("parses");
        assert_eq!(
            (
                config.patch_size,
                config.merge_size,
                config.temporal_patch_size
            ),
            (14, 2, 2)
        );
        assert_eq!((config.min_pixels, config.max_pixels), (3136, 1003520));
        assert_eq!(config.image_mean, OPENAI_CLIP_MEAN);
        assert_eq!(config.rescale_factor, 1.0 / 255.0);
    }

    #[test]
    fn rejects_what_the_kernel_cannot_honour() {
        let rejected = [
            (
                r#"{"patch_size": 16}"#,
                Some(QWEN2_VL_MODEL),
                "patch_size is 16 in preprocessor_config.json but 14",
            ),
            (r#"{}"#, Some(r#"{"model_type": "llava"}"#), "llava"),
            (
                r#"{"image_processor_type": "CLIPImageProcessor"}"#,
                None,
                "CLIP",
            ),
            (r#"{}"#, None, "neither"),
            (r#"{"resample": 2}"#, Some(QWEN2_VL_MODEL), "resample = 2"),
            (r#"{"do_resize": false}"#, Some(QWEN2_VL_MODEL), "do_resize"),
            (
                r#"{"image_mean": [0.5, 0.5]}"#,
                Some(QWEN2_VL_MODEL),
                "2 values",
            ),
            (r#"{"image_std": 0.0}"#, Some(QWEN2_VL_MODEL), "image_std"),
            (
                r#"{"min_pixels": 10, "max_pixels": 5}"#,
                Some(QWEN2_VL_MODEL),
                "empty",
            ),
            (r#"{"patch_size": 0}"#, None, "UnsupportedModel"),
            (
                r#"{}"#,
                Some(r#"{"model_type": "qwen2_vl", "vision_config": {"in_chans": 4}}"#),
                "4 input channels",
            ),
            (
                r#"{"min_pixels": "many"}"#,
                Some(QWEN2_VL_MODEL),
                "preprocessor_config.json",
            ),
        ];
        for (pre, model, expected) in rejected {
            let error = VisionPreprocessConfig::from_json(pre, model)
                .expect_err(&format!("{pre} should be rejected"));
            let text = format!("{error} {error:?}");
            assert!(text.contains(expected), "{pre}: {text}");
        }
    }

    #[test]
    fn zero_patch_size_is_invalid() {
        let error = VisionPreprocessConfig::from_json(r#"{"patch_size": 0}"#, Some(QWEN2_VL_MODEL))
            .expect_err("zero patch");
        // preprocessor 0 vs model 14 is caught as an inconsistency first.
        assert!(
            matches!(error, ConfigError::Inconsistent { .. }),
            "{error:?}"
        );
        let error = VisionPreprocessConfig::from_json(
            r#"{"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 0}"#,
            None,
        )
        .expect_err("zero patch");
        assert!(matches!(error, ConfigError::Invalid(_)), "{error:?}");
    }
}
