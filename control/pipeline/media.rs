//! Media planning in Preparation: fetch each image (the `media` intake),
//! turn it into the encoder's pixel tensor with the model's preprocessing
//! kernel, expand its `<|image_pad|>` placeholder to the number of tokens the
//! image takes, and record where those tokens sit.
//!
//! The kernel runs on the data plane's pinned cores: each image is a job
//! submitted through the rings, naming its destination lane (decided by
//! `crate::lanes` from the workers that will receive it); the kernel writes
//! the tensor into the lane's buffer once. The control plane only waits for
//! the result: the wire payload and, for lanes that hold resources, a lease
//! the request keeps until the RPCs carrying the tensor have returned.

use std::sync::Arc;

use bytes::Bytes;
use smg_dataplane::lanes::{InlineLane, LaneChoice, TensorLease};
use smg_dataplane::preprocess::{
    ImageLimits, ImagePlan, PreprocessError, Qwen2VlImageProcessor, VisionPreprocessConfig,
};
use smg_dataplane::runtime::{DataPlane, JobError};
use smg_shared::tensor::DType;

use crate::engine::{MediaItem, Modality, Tensor, TensorPayload};
use crate::error::{Error, ErrorCode, Result};
use crate::lanes::{self, LaneDecision, TensorLanes};
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
    lanes: Arc<TensorLanes>,
}

impl MediaPlanner {
    /// A planner for the model `tokenizer` was loaded for, from the vision
    /// files found with it (wherever they came from: the model directory,
    /// or the workers' directory or archive); `None` when the model has no
    /// vision preprocessing (no `preprocessor_config.json`).
    pub fn for_model(
        tokenizer: &Tokenizer,
        config: MediaConfig,
        dataplane: &DataPlane,
    ) -> Result<Option<Self>> {
        let Some(files) = tokenizer.vision_files() else {
            return Ok(None);
        };
        let vision = VisionPreprocessConfig::from_json(
            &files.preprocessor_config,
            files.model_config.as_deref(),
        )
        .map_err(|err| {
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
            lanes: TensorLanes::inline(),
        }))
    }

    /// Sends tensors through `lanes` (inline otherwise).
    pub fn with_lanes(mut self, lanes: Arc<TensorLanes>) -> Self {
        self.lanes = lanes;
        self
    }

    /// The lanes this model's tensors travel.
    pub fn lanes(&self) -> &TensorLanes {
        &self.lanes
    }

    /// Fetches and preprocesses `images` into the lane `lane` decided, and
    /// expands their placeholders in `input_ids`; returns the new ids and one
    /// media item per image with its lane lease (if its lane holds one).
    pub async fn plan(
        &self,
        images: &[String],
        input_ids: Vec<u32>,
        lane: &LaneDecision,
    ) -> Result<PlannedMedia> {
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
        let choice = lane.choice.clone().unwrap_or_else(|| LaneChoice {
            lane: Arc::new(InlineLane),
            min_bytes: 0,
        });
        let jobs = fetched.into_iter().enumerate().map(|(index, media)| {
            let processor = Arc::clone(&self.processor);
            let choice = choice.clone();
            async move {
                let image = self
                    .dataplane
                    .preprocess_into_lane(processor, media.bytes.clone(), DType::BFloat16, choice)
                    .await
                    .map_err(|err| match err {
                        JobError::Image(err) => image_error(index, &err),
                        other => Error::from_dataplane(&other),
                    })?;
                lanes::record_tensor(&image.tensor, image.plan.out_bytes);
                if let Some(fallback) = &lane.fallback {
                    lanes::record_fallback(fallback);
                }
                let payload = lanes::engine_payload(image.tensor.payload);
                Ok::<_, Error>((media, image.plan, payload, image.tensor.lease))
            }
        });
        let processed = futures::future::try_join_all(jobs).await?;
        let leases = processed
            .iter()
            .map(|(_, _, _, lease)| lease.clone())
            .collect();
        let (input_ids, items) = self.expand(
            input_ids,
            processed
                .into_iter()
                .map(|(media, plan, payload, _)| (media, plan, payload))
                .collect(),
        );
        Ok(PlannedMedia {
            input_ids,
            items,
            leases,
        })
    }

    fn expand(
        &self,
        input_ids: Vec<u32>,
        processed: Vec<(FetchedMedia, ImagePlan, TensorPayload)>,
    ) -> (Vec<u32>, Vec<MediaItem>) {
        let extra: usize = processed
            .iter()
            .map(|(_, plan, _)| plan.tokens as usize)
            .sum();
        let mut expanded = Vec::with_capacity(input_ids.len() + extra);
        let mut images = processed.into_iter();
        let mut items = Vec::new();
        for id in input_ids {
            if id != self.image_pad_id {
                expanded.push(id);
                continue;
            }
            let Some((media, plan, payload)) = images.next() else {
                expanded.push(id);
                continue;
            };
            let offset = expanded.len() as u32;
            let length = plan.tokens;
            expanded.extend(std::iter::repeat_n(self.image_pad_id, length as usize));
            let grid: Vec<u8> = plan
                .image_grid_thw()
                .iter()
                .flat_map(|&v| i64::from(v).to_le_bytes())
                .collect();
            items.push(MediaItem {
                modality: Modality::Image,
                content_hash: media.content_hash,
                encoder_input: Tensor {
                    dtype: DType::BFloat16,
                    shape: plan.out_shape.to_vec(),
                    payload: Some(payload),
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

/// A request's images after Preparation.
#[derive(Debug)]
pub struct PlannedMedia {
    /// The prompt with each image's placeholder expanded.
    pub input_ids: Vec<u32>,
    pub items: Vec<MediaItem>,
    /// Per item: the lease on its encoder input's lane resources.
    pub leases: Vec<Option<TensorLease>>,
}

/// A preprocessing failure as a client error with a stable code.
fn image_error(index: usize, err: &PreprocessError) -> Error {
    let code = match err {
        PreprocessError::UnsupportedFormat(_) => ErrorCode::UnsupportedImageFormat,
        PreprocessError::ImageTooLarge { .. } => ErrorCode::ImageTooLarge,
        PreprocessError::DecodeLimitExceeded(_) => ErrorCode::ImageDecodeLimitExceeded,
        PreprocessError::CorruptImage(_)
        | PreprocessError::ImageTooSmall { .. }
        | PreprocessError::BadAspectRatio { .. } => ErrorCode::InvalidImage,
        _ => ErrorCode::InternalError,
    };
    Error::new(code, format!("image {index}: {err}")).with_param("messages")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_failures_are_client_errors_with_stable_codes() {
        let cases = [
            (
                PreprocessError::DecodeLimitExceeded("iCCP inflates past 1 MiB".into()),
                "image_decode_limit_exceeded",
            ),
            (
                PreprocessError::CorruptImage("truncated".into()),
                "invalid_image",
            ),
        ];
        for (err, code) in cases {
            let mapped = image_error(2, &err);
            assert_eq!(mapped.code.as_str(), code, "{err}");
            assert_eq!(mapped.code.http_status(), 400, "{err}");
            assert!(
                mapped.message.starts_with("image 2: "),
                "{}",
                mapped.message
            );
        }
    }
}
