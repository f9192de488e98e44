//! The errors an image can fail preprocessing with, and their stable codes.
//!
//! The control plane turns these into API errors and metrics labels, so the
//! codes ([`PreprocessError::code`]) are part of smg's contract: add new ones,
//! never rename existing ones. Messages are for humans and may change.

use smg_shared::tensor::DType;

/// Why an image could not be turned into an encoder input tensor.
#[derive(Debug, thiserror::Error)]
pub enum PreprocessError {
    /// The bytes are not a JPEG, PNG or WebP image, or use a feature of one
    /// that the decoder does not implement.
    #[error("unsupported image format: {0}")]
    UnsupportedFormat(String),

    /// The bytes look like a supported format but are truncated or damaged.
    #[error("corrupt image: {0}")]
    CorruptImage(String),

    /// The header announces more pixels than the configured cap; nothing was
    /// decoded.
    #[error("image is {width}x{height} ({pixels} pixels), above the cap of {max_pixels} pixels")]
    ImageTooLarge {
        width: u32,
        height: u32,
        pixels: u64,
        max_pixels: u64,
    },

    /// Decoding would cost more memory or work than one image is allowed,
    /// whatever its pixel count: a metadata chunk that inflates past its
    /// cap, a JPEG with more scans than its size allows, a decoder's
    /// allocation limit. Nothing beyond the limit was allocated or decoded.
    #[error("image exceeds a decoding limit: {0}")]
    DecodeLimitExceeded(String),

    /// The image has a zero or too short side, or resizing it would leave no
    /// patch.
    #[error("image is {width}x{height}, too small to preprocess ({reason})")]
    ImageTooSmall {
        width: u32,
        height: u32,
        reason: &'static str,
    },

    /// The long side is more than 200 times the short side (Qwen2-VL's limit).
    #[error("image is {width}x{height}: aspect ratio above 200")]
    BadAspectRatio { width: u32, height: u32 },

    /// The requested output element type is neither float32 nor bfloat16.
    #[error("output dtype {0} is not supported (float32 or bfloat16)")]
    UnsupportedDType(DType),

    /// The destination buffer is not exactly the plan's `out_bytes` long.
    #[error("destination buffer holds {actual} bytes, the plan needs {expected}")]
    BufferSizeMismatch { expected: usize, actual: usize },

    /// `write_into` was given bytes whose header differs from the planned one.
    #[error("image header does not match the plan it is written with")]
    PlanMismatch,

    /// The preprocessing config failed validation (a deployment error, not
    /// the image's fault).
    #[error("invalid preprocessing config: {0}")]
    InvalidConfig(String),
}

/// The codes an image's bytes alone can cause, whatever they hold. The others
/// (`unsupported_dtype`, `buffer_size_mismatch`, `plan_mismatch`,
/// `invalid_config`) mean the caller misused the kernel.
pub const IMAGE_ERROR_CODES: &[&str] = &[
    "unsupported_format",
    "corrupt_image",
    "image_too_large",
    "decode_limit_exceeded",
    "image_too_small",
    "bad_aspect_ratio",
];

impl PreprocessError {
    /// Whether the image's bytes, not the caller, caused this error.
    pub fn is_image_error(&self) -> bool {
        IMAGE_ERROR_CODES.contains(&self.code())
    }

    /// The stable, snake_case code for this error.
    pub fn code(&self) -> &'static str {
        match self {
            PreprocessError::UnsupportedFormat(_) => "unsupported_format",
            PreprocessError::CorruptImage(_) => "corrupt_image",
            PreprocessError::ImageTooLarge { .. } => "image_too_large",
            PreprocessError::DecodeLimitExceeded(_) => "decode_limit_exceeded",
            PreprocessError::ImageTooSmall { .. } => "image_too_small",
            PreprocessError::BadAspectRatio { .. } => "bad_aspect_ratio",
            PreprocessError::UnsupportedDType(_) => "unsupported_dtype",
            PreprocessError::BufferSizeMismatch { .. } => "buffer_size_mismatch",
            PreprocessError::PlanMismatch => "plan_mismatch",
            PreprocessError::InvalidConfig(_) => "invalid_config",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_stable_snake_case() {
        let cases = [
            (
                PreprocessError::UnsupportedFormat("x".into()),
                "unsupported_format",
            ),
            (PreprocessError::CorruptImage("x".into()), "corrupt_image"),
            (
                PreprocessError::ImageTooLarge {
                    width: 1,
                    height: 1,
                    pixels: 1,
                    max_pixels: 0,
                },
                "image_too_large",
            ),
            (
                PreprocessError::DecodeLimitExceeded("x".into()),
                "decode_limit_exceeded",
            ),
            (
                PreprocessError::ImageTooSmall {
                    width: 0,
                    height: 1,
                    reason: "zero side",
                },
                "image_too_small",
            ),
            (
                PreprocessError::BadAspectRatio {
                    width: 1,
                    height: 300,
                },
                "bad_aspect_ratio",
            ),
            (
                PreprocessError::UnsupportedDType(DType::Int64),
                "unsupported_dtype",
            ),
            (
                PreprocessError::BufferSizeMismatch {
                    expected: 2,
                    actual: 1,
                },
                "buffer_size_mismatch",
            ),
            (PreprocessError::PlanMismatch, "plan_mismatch"),
            (PreprocessError::InvalidConfig("x".into()), "invalid_config"),
        ];
        for (error, code) in cases {
            assert_eq!(error.code(), code, "{error}");
            let caused_by_image = matches!(
                error,
                PreprocessError::UnsupportedFormat(_)
                    | PreprocessError::CorruptImage(_)
                    | PreprocessError::ImageTooLarge { .. }
                    | PreprocessError::DecodeLimitExceeded(_)
                    | PreprocessError::ImageTooSmall { .. }
                    | PreprocessError::BadAspectRatio { .. }
            );
            assert_eq!(error.is_image_error(), caused_by_image, "{error}");
        }
    }
}
