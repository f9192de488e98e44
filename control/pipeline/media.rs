//! Media planning in Preparation: fetch each image (the `media` intake),
//! turn it into the encoder's pixel tensor with the model's preprocessing
//! kernel, expand its `<|image_pad|>` placeholder to the number of tokens the
//! image takes, and record where those tokens sit.
//!
//! The kernel runs on the data plane's pinned cores: each image is a job
//! submitted through the rings, naming its destination (the inline buffer
//! that becomes the gRPC payload); the kernel writes the tensor into it once.
//! The control plane only waits for the result.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use smg_dataplane::preprocess::{
    ImageLimits, PreprocessError, PreprocessedImage, Qwen2VlImageProcessor, VisionPreprocessConfig,
};
use smg_dataplane::runtime::{DataPlane, Destination, JobError};
use smg_shared::tensor::DType;

use crate::engine::{MediaItem, Modality, Tensor, TensorPayload};
use crate::error::{Error, ErrorCode, Result};
use crate::media::{FetchedMedia, MediaConfig, MediaFetcher};
use crate::tokenizer::Tokenizer;

/// The token a chat template puts where an image goes.
const IMAGE_PAD: &str = "<|image_pad|>";
/// The name engines know the grid tensor by.
const GRID_TENSOR: &str = "image_grid_thw";

/// Everything needed to turn image references into engine media items.
#[derive(Debug, Clone)]
pub struct MediaPlanner {
    fetcher: Arc<MediaFetcher>,
    processor: Arc<Qwen2VlImageProcessor>,
    image_pad_id: u32,
    dataplane: DataPlane,
}

impl MediaPlanner {
    /// A planner for the model in `model_dir`, or `None` when the model has
    /// no vision preprocessing (no `preprocessor_config.json`).
    pub fn for_model(
        model_dir: &Path,
        tokenizer: &Tokenizer,
        config: MediaConfig,
        dataplane: &DataPlane,
    ) -> Result<Option<Self>> {
        if !model_dir.join("preprocessor_config.json").is_file() {
            return Ok(None);
        }
        let vision = VisionPreprocessConfig::from_model_dir(model_dir).map_err(|err| {
            Error::internal(format!(
                "cannot read the model's preprocessing config: {err}"
            ))
        })?;
        let processor = Qwen2VlImageProcessor::new(vision, ImageLimits::default())
            .map_err(|err| Error::internal(format!("unusable preprocessing config: {err}")))?;
        let image_pad_id = tokenizer
            .token_id(IMAGE_PAD)
            .ok_or_else(|| Error::internal(format!("the tokenizer has no {IMAGE_PAD} token")))?;
        Ok(Some(Self {
            fetcher: Arc::new(
                MediaFetcher::new(config, dataplane.clone())
                    .map_err(|err| Error::internal(format!("bad media settings: {err}")))?,
            ),
            processor: Arc::new(processor),
            image_pad_id,
            dataplane: dataplane.clone(),
        }))
    }

    /// Fetches and preprocesses `images` and expands their placeholders in
    /// `input_ids`; returns the new ids and one media item per image.
    pub async fn plan(
        &self,
        images: &[String],
        input_ids: Vec<u32>,
    ) -> Result<(Vec<u32>, Vec<MediaItem>)> {
        let pads = input_ids
            .iter()
            .filter(|&&id| id == self.image_pad_id)
            .count();
        if pads != images.len() {
            return Err(Error::invalid_request(format!(
                "the prompt has {pads} image placeholders but the request carries {} images",
                images.len()
            ))
            .with_param("messages"));
        }
        let fetched = self.fetcher.fetch_all(images).await?;
        // One data-plane job per image, all submitted at once: a request's
        // images spread over the cores instead of queueing one by one.
        let jobs = fetched.into_iter().enumerate().map(|(index, media)| {
            let processor = Arc::clone(&self.processor);
            async move {
                let image = self
                    .dataplane
                    .preprocess_image(
                        processor,
                        media.bytes.clone(),
                        DType::BFloat16,
                        Destination::Inline,
                    )
                    .await
                    .map_err(|err| match err {
                        JobError::Image(err) => image_error(index, &err),
                        other => Error::from_dataplane(&other),
                    })?;
                Ok::<_, Error>((media, image))
            }
        });
        let processed = futures::future::try_join_all(jobs).await?;
        Ok(self.expand(input_ids, processed))
    }

    fn expand(
        &self,
        input_ids: Vec<u32>,
        processed: Vec<(FetchedMedia, PreprocessedImage)>,
    ) -> (Vec<u32>, Vec<MediaItem>) {
        let extra: usize = processed
            .iter()
            .map(|(_, image)| image.plan.tokens as usize)
            .sum();
        let mut expanded = Vec::with_capacity(input_ids.len() + extra);
        let mut images = processed.into_iter();
        let mut items = Vec::new();
        for id in input_ids {
            if id != self.image_pad_id {
                expanded.push(id);
                continue;
            }
            let Some((media, image)) = images.next() else {
                expanded.push(id);
                continue;
            };
            let offset = expanded.len() as u32;
            let length = image.plan.tokens;
            expanded.extend(std::iter::repeat_n(self.image_pad_id, length as usize));
            let grid: Vec<u8> = image
                .plan
                .image_grid_thw()
                .iter()
                .flat_map(|&v| i64::from(v).to_le_bytes())
                .collect();
            items.push(MediaItem {
                modality: Modality::Image,
                content_hash: media.content_hash,
                encoder_input: Tensor {
                    dtype: DType::BFloat16,
                    shape: image.plan.out_shape.to_vec(),
                    payload: Some(TensorPayload::Inline(Bytes::from(image.data))),
                },
                model_specific: vec![(
                    GRID_TENSOR.to_owned(),
                    Tensor {
                        dtype: DType::Int64,
                        shape: vec![1, 3],
                        payload: Some(TensorPayload::Inline(Bytes::from(grid))),
                    },
                )],
                placeholders: vec![(offset, length)],
                placeholder_token_id: Some(self.image_pad_id),
            });
        }
        (expanded, items)
    }
}

/// A preprocessing failure as a client error with a stable code.
fn image_error(index: usize, err: &PreprocessError) -> Error {
    let code = match err {
        PreprocessError::UnsupportedFormat(_) => ErrorCode::UnsupportedImageFormat,
        PreprocessError::ImageTooLarge { .. } => ErrorCode::ImageTooLarge,
        PreprocessError::CorruptImage(_)
        | PreprocessError::ImageTooSmall { .. }
        | PreprocessError::BadAspectRatio { .. } => ErrorCode::InvalidImage,
        _ => ErrorCode::InternalError,
    };
    Error::new(code, format!("image {index}: {err}")).with_param("messages")
}
