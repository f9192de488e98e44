//! Image preprocessing kernels: compressed image bytes in, the engine's
//! encoder input tensor out.
//!
//! These are pure functions (no threads, no I/O on the hot path) so a
//! data-plane core can run them on bytes it already holds and write the
//! result straight into whatever lane buffer the tensor travels in. Each
//! step lives in its own file:
//!
//! - [`config`]: the model's preprocessing parameters, read once from its
//!   `preprocessor_config.json` (and `config.json`).
//! - [`decode`]: format sniffing, header-only size checks, decoding to 8-bit
//!   pixels the way PIL's `convert("RGB")` sees them.
//! - [`jpeg`]: JPEG through libjpeg-turbo's decoder, set up as Pillow sets it.
//! - [`resize`]: `smart_resize` (the target size rule) and a bicubic
//!   resampler that reproduces PIL's `Image.resize(..., BICUBIC)` bit for bit.
//! - [`output`]: how a normalized value becomes destination bytes (f32 or
//!   bf16, little-endian), precomputed per channel and byte value.
//! - [`qwen2_vl`]: the Qwen2-VL family kernel that ties them together:
//!   [`qwen2_vl::Qwen2VlImageProcessor::plan`] from the header alone, then
//!   [`qwen2_vl::Qwen2VlImageProcessor::write_into`] in one pass.
//! - [`scratch`]: the buffers a data-plane core reuses from image to image
//!   (decoded pixels, the resampler's rows), with a cap and a shrink rule.
//! - [`error`]: the stable error codes callers see.

pub mod config;
pub mod decode;
pub mod error;
pub mod jpeg;
pub mod output;
pub mod qwen2_vl;
pub mod resize;
pub mod scratch;

pub use config::{ConfigError, VisionPreprocessConfig};
pub use decode::{ImageLimits, SourceFormat};
pub use error::{IMAGE_ERROR_CODES, PreprocessError};
pub use qwen2_vl::{
    ImagePlan, PreprocessedImage, Qwen2VlImageProcessor, StageTimes, preprocess_image,
};
pub use resize::{ResizeError, smart_resize};
pub use scratch::{ScratchPolicy, ScratchSpace};
