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
//!
//! Placeholders belong to the gateway ([`Placeholders`]). A vision model's
//! tokenizer turns the text `<|image_pad|>` into the placeholder id wherever
//! it appears, so a client typing it would hand the engine a placeholder
//! with no pixels behind it (an engine may crash on that, or read another
//! image's memory). Two layers stop it:
//!
//! 1. Neutralize: before the chat template renders, every string the client
//!    wrote (message text in every dialect, tool arguments and results,
//!    template kwargs) has each multimodal token (`<|vision_start|>`,
//!    `<|vision_end|>`, `<|image_pad|>`, `<|video_pad|>`) rewritten with a
//!    zero-width space (U+200B) after its `<`, so it tokenizes as the
//!    ordinary text it is; a string ending in the start of one (`… <|image`)
//!    gets the same treatment, so two adjacent parts cannot join into a
//!    token. Raw prompts (`/v1/completions`, `/generate` text) are
//!    neutralized the same way unless the request attaches images: a raw
//!    prompt with `image_data` is written in the model's own markup, as
//!    SGLang defines it.
//! 2. Count (the backstop, after tokenization, for every prompt, token ids
//!    included): the prompt must hold exactly one `<|image_pad|>`,
//!    `<|vision_start|>` and `<|vision_end|>` per attached image and no
//!    `<|video_pad|>` (the gateway takes no video), else it is refused with
//!    `placeholder_mismatch` (400) before anything is fetched. A tool
//!    definition, rendered by the template as JSON, is not rewritten: one
//!    quoting a placeholder meets this check.
//!
//! Text-only models (no vision preprocessing) have no placeholders and
//! need neither.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
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
/// The Qwen2-VL family's multimodal tokens, as its chat template writes
/// them around an image (or a video).
const VISION_START: &str = "<|vision_start|>";
const VISION_END: &str = "<|vision_end|>";
const VIDEO_PAD: &str = "<|video_pad|>";

/// The tokens [`Placeholders`] guards.
const PLACEHOLDER_TOKENS: [&str; 4] = [VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD];

/// What the neutralized form of a token puts after its `<`.
const ZERO_WIDTH_SPACE: char = '\u{200B}';

/// A vision model's multimodal tokens: which texts client strings must not
/// spell, and which ids a prompt may hold only for attached images (see the
/// module doc).
#[derive(Debug, Clone)]
pub struct Placeholders {
    /// Each token's text, with its id (tokens the tokenizer lacks are left
    /// out).
    tokens: Vec<(&'static str, u32)>,
}

impl Placeholders {
    fn for_tokenizer(tokenizer: &Tokenizer) -> Self {
        let tokens = PLACEHOLDER_TOKENS
            .into_iter()
            .filter_map(|text| Some((text, tokenizer.token_id(text)?)))
            .collect();
        Self { tokens }
    }

    /// `text` with every multimodal token, and a trailing start of one,
    /// broken by a zero-width space after its `<`; borrowed when there was
    /// none.
    pub fn neutralize<'a>(&self, text: &'a str) -> Cow<'a, str> {
        // Every token starts with `<`: most text has none, found by one
        // memchr scan instead of a substring search per token.
        if !text.contains('<') {
            return Cow::Borrowed(text);
        }
        let spelled = self.tokens.iter().any(|(token, _)| text.contains(token));
        let trailing = self.trailing_start(text);
        if !spelled && trailing.is_none() {
            return Cow::Borrowed(text);
        }
        let mut out = text.to_owned();
        if let Some(at) = trailing {
            out.insert(at + 1, ZERO_WIDTH_SPACE);
        }
        for (token, _) in &self.tokens {
            let broken = format!("<{ZERO_WIDTH_SPACE}{}", &token[1..]);
            out = out.replace(token, &broken);
        }
        Cow::Owned(out)
    }

    /// Where `text` ends with a proper start of a token (`<`, `<|image`):
    /// the offset of that `<`.
    fn trailing_start(&self, text: &str) -> Option<usize> {
        let longest = self.tokens.iter().map(|(token, _)| token.len()).max()?;
        let from = text.len().saturating_sub(longest - 1);
        text.char_indices()
            .skip_while(|(at, _)| *at < from)
            .filter(|(_, c)| *c == '<')
            .map(|(at, _)| at)
            .find(|&at| {
                let tail = &text[at..];
                self.tokens
                    .iter()
                    .any(|(token, _)| token.len() > tail.len() && token.starts_with(tail))
            })
    }

    /// Neutralizes every string in `value`, keys excepted (a template reads
    /// a message's keys, never renders them).
    pub fn neutralize_json(&self, value: &mut Value) {
        match value {
            Value::String(text) => {
                if let Cow::Owned(neutral) = self.neutralize(text) {
                    *text = neutral;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|item| self.neutralize_json(item)),
            Value::Object(fields) => fields
                .values_mut()
                .for_each(|field| self.neutralize_json(field)),
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }

    /// The backstop: `input_ids` hold exactly one image placeholder, one
    /// vision start and one vision end per image, and no video placeholder.
    pub fn check(&self, input_ids: &[u32], images: usize) -> Result<()> {
        // One pass over the ids for every token (not one per token); an id
        // outside the tokens' range, as nearly all are, costs two
        // comparisons.
        let ids = self.tokens.iter().map(|(_, id)| *id);
        let (Some(lowest), Some(highest)) = (ids.clone().min(), ids.max()) else {
            return Ok(());
        };
        let mut counts = [0usize; PLACEHOLDER_TOKENS.len()];
        for &seen in input_ids {
            if seen < lowest || seen > highest {
                continue;
            }
            if let Some(count) = self
                .tokens
                .iter()
                .position(|(_, id)| *id == seen)
                .and_then(|at| counts.get_mut(at))
            {
                *count += 1;
            }
        }
        for ((token, _), &found) in self.tokens.iter().zip(&counts) {
            let wanted = if *token == VIDEO_PAD { 0 } else { images };
            if found != wanted {
                return Err(Error::new(
                    ErrorCode::PlaceholderMismatch,
                    format!(
                        "the prompt holds {found} {token} tokens but the request attaches {images} images; \
                         multimodal tokens come only from attached images"
                    ),
                )
                .with_param("messages"));
            }
        }
        Ok(())
    }
}

/// Everything needed to turn image references into engine media items.
#[derive(Debug, Clone)]
pub struct MediaPlanner {
    fetcher: Arc<MediaFetcher>,
    processor: Arc<Qwen2VlImageProcessor>,
    image_pad_id: u32,
    placeholders: Arc<Placeholders>,
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
            placeholders: Arc::new(Placeholders::for_tokenizer(tokenizer)),
            dataplane: dataplane.clone(),
            lanes: TensorLanes::inline(),
        }))
    }

    /// Sends tensors through `lanes` (inline otherwise).
    pub fn with_lanes(mut self, lanes: Arc<TensorLanes>) -> Self {
        self.lanes = lanes;
        self
    }

    /// The model's multimodal tokens, which client text must not spell.
    pub fn placeholders(&self) -> &Placeholders {
        &self.placeholders
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

    fn fixture() -> (Tokenizer, Placeholders) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/model");
        let tokenizer = Tokenizer::from_model_dir(&dir).expect("fixture tokenizer");
        let placeholders = Placeholders::for_tokenizer(&tokenizer);
        (tokenizer, placeholders)
    }

    #[test]
    fn typed_placeholders_tokenize_as_text() {
        let (tokenizer, placeholders) = fixture();
        let vision: Vec<u32> = placeholders.tokens.iter().map(|(_, id)| *id).collect();
        assert_eq!(vision.len(), 4, "the fixture has all four tokens");
        let typed = "a <|image_pad|> b <|vision_start|><|video_pad|><|vision_end|> c <|image";
        let neutral = placeholders.neutralize(typed);
        let ids = tokenizer.encode(&neutral, true).expect("ids");
        assert!(ids.iter().all(|id| !vision.contains(id)), "{ids:?}");
        // Only the `<` of each token gains the space: the text reads the same.
        assert_eq!(neutral.replace('\u{200B}', ""), typed);
        // Ordinary text is left as it is, without a copy.
        assert!(matches!(
            placeholders.neutralize("a < b <| c |>"),
            Cow::Borrowed(_)
        ));
        // Two parts that would join into a token cannot.
        let mut parts = serde_json::json!(["x <|image", "_pad|> y"]);
        placeholders.neutralize_json(&mut parts);
        let joined = format!(
            "{}{}",
            parts[0].as_str().expect("text"),
            parts[1].as_str().expect("text")
        );
        let ids = tokenizer.encode(&joined, true).expect("ids");
        assert!(ids.iter().all(|id| !vision.contains(id)), "{ids:?}");
    }

    #[test]
    fn the_backstop_counts_placeholders_against_images() {
        let (tokenizer, placeholders) = fixture();
        let ids = |text: &str| tokenizer.encode(text, true).expect("ids");
        let one = ids("<|vision_start|><|image_pad|><|vision_end|> what?");
        assert!(placeholders.check(&one, 1).is_ok());
        for (prompt, images) in [
            ("<|vision_start|><|image_pad|><|vision_end|> what?", 0),
            ("<|image_pad|> what?", 1),
            (
                "<|vision_start|><|image_pad|><|vision_end|><|image_pad|>",
                1,
            ),
            ("<|vision_start|><|video_pad|><|vision_end|>", 0),
            ("plain", 1),
        ] {
            let err = placeholders.check(&ids(prompt), images).expect_err(prompt);
            assert_eq!(err.code, ErrorCode::PlaceholderMismatch, "{prompt}");
            assert_eq!(err.code.http_status(), 400);
        }
        assert!(placeholders.check(&ids("plain"), 0).is_ok());
    }

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
