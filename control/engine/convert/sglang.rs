//! SGLang's messages ⇄ the engine types.
//!
//! SGLang's protocol differs from smg's model in three ways this module
//! absorbs:
//!
//! * Sampling fields 1–7 are plain proto3 scalars, so "unset" would arrive as
//!   0 (a zero `top_p`, a zero repetition penalty). Unset fields are sent as
//!   the engine's neutral values instead.
//! * PD rooms are int32; a room that does not fit is refused, never
//!   truncated (two requests must never share a rendezvous).
//! * Media travel as ONE inline `pixel_values` tensor per request: the
//!   items' encoder inputs are concatenated along dim 0, and so is each named
//!   model-specific tensor. There is no shm or remote payload.

use std::collections::HashMap;

use super::{LOAD_SECTIONS, RankLoad, checked_room, json_from_struct};
use crate::engine::bounds::Violation;
use crate::engine::{
    Constraint, Embedding, GenerateEvent, GenerateRequest, KvBootstrap, Load, LogProbs, MediaItem,
    Modality, ModelInfo, Runtime, Sampling, ServerInfo, Tensor, TensorPayload,
};
use crate::error::{Error, Result};
use crate::metrics::ProtocolViolation;
use crate::proto::sglang_scheduler as sg;

/// The values an unset sampling field means: sampling left as the model
/// computes it.
const NEUTRAL_TEMPERATURE: f32 = 1.0;
const NEUTRAL_TOP_P: f32 = 1.0;
/// SGLang's "no top-k cut-off".
const NEUTRAL_TOP_K: i32 = -1;
const NEUTRAL_MIN_P: f32 = 0.0;
const NEUTRAL_FREQUENCY_PENALTY: f32 = 0.0;
const NEUTRAL_PRESENCE_PENALTY: f32 = 0.0;
const NEUTRAL_REPETITION_PENALTY: f32 = 1.0;

/// The Generate request an SGLang worker receives.
///
/// `data_parallel_rank: None` leaves the wire field at its proto3 default
/// (absent): SGLang's int32 cannot tell "no rank" from rank 0.
pub(crate) fn generate_request(request: GenerateRequest) -> Result<sg::GenerateRequest> {
    let GenerateRequest {
        request_id,
        input_ids,
        original_text,
        sampling,
        stream,
        return_logprob,
        top_logprobs_num,
        media,
        kv_bootstrap,
        encode_bootstrap,
        data_parallel_rank,
        // The gateway's own bound on the answer (engine::bounds).
        output_budget: _,
    } = request;
    if !encode_bootstrap.is_empty() {
        return Err(Error::internal(
            "SGLang workers have no encoder protocol: encode_bootstrap is TokenSpeed only",
        ));
    }
    Ok(sg::GenerateRequest {
        request_id,
        tokenized: Some(sg::TokenizedInput {
            original_text,
            input_ids,
        }),
        mm_inputs: multimodal_inputs(&media)?,
        sampling_params: Some(sampling_params(sampling)),
        return_logprob,
        // No input-token logprobs: the gateway only reports output logprobs.
        logprob_start_len: -1,
        top_logprobs_num,
        disaggregated_params: kv_bootstrap.map(disaggregated_params).transpose()?,
        data_parallel_rank: data_parallel_rank.unwrap_or_default(),
        stream,
        ..Default::default()
    })
}

fn disaggregated_params(kv: KvBootstrap) -> Result<sg::DisaggregatedParams> {
    Ok(sg::DisaggregatedParams {
        bootstrap_room: checked_room(Runtime::Sglang, kv.room)?,
        bootstrap_host: kv.host,
        bootstrap_port: i32::from(kv.port),
    })
}

fn sampling_params(sampling: Sampling) -> sg::SamplingParams {
    sg::SamplingParams {
        temperature: sampling.temperature.unwrap_or(NEUTRAL_TEMPERATURE),
        top_p: sampling.top_p.unwrap_or(NEUTRAL_TOP_P),
        top_k: sampling.top_k.unwrap_or(NEUTRAL_TOP_K),
        min_p: sampling.min_p.unwrap_or(NEUTRAL_MIN_P),
        frequency_penalty: sampling
            .frequency_penalty
            .unwrap_or(NEUTRAL_FREQUENCY_PENALTY),
        presence_penalty: sampling
            .presence_penalty
            .unwrap_or(NEUTRAL_PRESENCE_PENALTY),
        repetition_penalty: sampling
            .repetition_penalty
            .unwrap_or(NEUTRAL_REPETITION_PENALTY),
        max_new_tokens: sampling.max_new_tokens,
        // String stops never reach engines; the gateway trims them.
        stop: Vec::new(),
        stop_token_ids: sampling.stop_token_ids,
        skip_special_tokens: sampling.skip_special_tokens,
        spaces_between_special_tokens: sampling.spaces_between_special_tokens,
        constraint: sampling.constraint.map(|constraint| {
            use sg::sampling_params::Constraint as Wire;
            match constraint {
                Constraint::Regex(text) => Wire::Regex(text),
                Constraint::JsonSchema(text) => Wire::JsonSchema(text),
                Constraint::EbnfGrammar(text) => Wire::EbnfGrammar(text),
                Constraint::StructuralTag(text) => Wire::StructuralTag(text),
            }
        }),
        n: sampling.n.max(1),
        min_new_tokens: sampling.min_new_tokens,
        ignore_eos: sampling.ignore_eos,
        no_stop_trim: sampling.no_stop_trim,
        stream_interval: None,
        logit_bias: sampling.logit_bias.into_iter().collect(),
        custom_params: None,
    }
}

/// All of a request's media as SGLang's single `MultimodalInputs`.
///
/// Items whose encoder inputs all carry no payload (metadata only, as a
/// decode leg sees them) send no `pixel_values`; the placeholders, token id,
/// modalities and model-specific tensors still travel.
fn multimodal_inputs(media: &[MediaItem]) -> Result<Option<sg::MultimodalInputs>> {
    if media.is_empty() {
        return Ok(None);
    }
    let encoder_inputs: Vec<&Tensor> = media.iter().map(|item| &item.encoder_input).collect();
    let pixel_values = concatenate("encoder input", &encoder_inputs)?;

    let names: Vec<&str> = sorted_names(&media[0]);
    let mut model_specific_tensors = HashMap::new();
    for (index, item) in media.iter().enumerate().skip(1) {
        if sorted_names(item) != names {
            return Err(Error::invalid_request(format!(
                "SGLang takes each model-specific tensor concatenated over all media items, \
                 but media item {index} has tensors {:?} and item 0 has {names:?}",
                sorted_names(item)
            )));
        }
    }
    for name in names {
        let parts: Vec<&Tensor> = media
            .iter()
            .filter_map(|item| {
                item.model_specific
                    .iter()
                    .find(|(candidate, _)| candidate == name)
                    .map(|(_, tensor)| tensor)
            })
            .collect();
        if let Some(tensor) = concatenate(name, &parts)? {
            model_specific_tensors.insert(name.to_owned(), tensor);
        }
    }

    let mut token_ids = media.iter().filter_map(|item| item.placeholder_token_id);
    let im_token_id = token_ids.next();
    if let Some(other) = token_ids.find(|id| Some(*id) != im_token_id) {
        return Err(Error::invalid_request(format!(
            "SGLang takes one placeholder token id per request, but the media items use \
             {im_token_id:?} and {other}"
        )));
    }

    Ok(Some(sg::MultimodalInputs {
        pixel_values,
        modalities: media
            .iter()
            .map(|item| modality_name(item.modality).to_owned())
            .collect(),
        model_specific_tensors,
        im_token_id,
        mm_placeholders: media
            .iter()
            .flat_map(|item| &item.placeholders)
            .map(|&(offset, length)| sg::PlaceholderRange { offset, length })
            .collect(),
        ..Default::default()
    }))
}

fn sorted_names(item: &MediaItem) -> Vec<&str> {
    let mut names: Vec<&str> = item
        .model_specific
        .iter()
        .map(|(name, _)| name.as_str())
        .collect();
    names.sort_unstable();
    names
}

fn modality_name(modality: Modality) -> &'static str {
    match modality {
        Modality::Image => "image",
        Modality::Video => "video",
        Modality::Audio => "audio",
    }
}

/// Concatenates one tensor per media item along dim 0 into one inline
/// tensor. All parts must share the dtype and the trailing dims and carry
/// inline bytes of exactly their size; `None` when every part is
/// metadata-only.
fn concatenate(what: &str, parts: &[&Tensor]) -> Result<Option<sg::TensorData>> {
    let Some(first) = parts.first() else {
        return Ok(None);
    };
    let mut inline: Vec<&bytes::Bytes> = Vec::with_capacity(parts.len());
    for (index, part) in parts.iter().enumerate() {
        match &part.payload {
            Some(TensorPayload::Inline(bytes)) => inline.push(bytes),
            None => {}
            Some(TensorPayload::Shm { .. }) | Some(TensorPayload::Remote { .. }) => {
                return Err(Error::internal(format!(
                    "SGLang workers take tensors inline only, but media item {index}'s {what} \
                     is not inline"
                )));
            }
        }
    }
    if inline.is_empty() {
        return Ok(None);
    }
    if inline.len() != parts.len() {
        return Err(Error::internal(format!(
            "media items mix inline and metadata-only {what}s; SGLang needs all or none"
        )));
    }

    let Some((_, trailing)) = first.shape.split_first() else {
        return Err(Error::invalid_request(format!(
            "media item 0's {what} is a scalar; SGLang concatenates along dim 0"
        )));
    };
    let mut rows: u32 = 0;
    for (index, (part, bytes)) in parts.iter().zip(&inline).enumerate() {
        if part.dtype != first.dtype || part.shape.get(1..) != Some(trailing) {
            return Err(Error::invalid_request(format!(
                "SGLang takes one {what} tensor per request, so every media item's must share \
                 dtype and trailing dims: item {index} is {} {:?}, item 0 is {} {:?}",
                part.dtype, part.shape, first.dtype, first.shape
            )));
        }
        let expected = part.dtype.tensor_bytes(&part.shape);
        if expected != Some(bytes.len()) {
            return Err(Error::internal(format!(
                "media item {index}'s {what} holds {} bytes but {} {:?} needs {expected:?}",
                bytes.len(),
                part.dtype,
                part.shape
            )));
        }
        rows = rows.checked_add(part.shape[0]).ok_or_else(|| {
            Error::invalid_request(format!("the concatenated {what} has too many rows"))
        })?;
    }
    let mut shape = Vec::with_capacity(first.shape.len());
    shape.push(rows);
    shape.extend_from_slice(trailing);
    // One image keeps its buffer; several are concatenated along rows (the
    // one copy SGLang's single pixel_values tensor forces).
    let data = match inline.as_slice() {
        [only] => (*only).clone(),
        parts => {
            let slices: Vec<&[u8]> = parts.iter().map(|b| b.as_ref()).collect();
            bytes::Bytes::from(slices.concat())
        }
    };
    Ok(Some(sg::TensorData {
        data,
        shape,
        dtype: first.dtype.wire_name().to_owned(),
    }))
}

/// One Generate stream message as an event; `None` if it carries neither a
/// chunk nor a completion.
pub(crate) fn event(response: sg::GenerateResponse) -> Option<GenerateEvent> {
    super::generate_event_from!(sg, response, log_probs)
}

fn log_probs(probs: sg::OutputLogProbs) -> LogProbs {
    super::log_probs(
        probs.token_logprobs,
        probs.token_ids,
        probs
            .top_logprobs
            .into_iter()
            .map(|top| (top.values, top.token_ids)),
    )
}

pub(crate) fn embed_request(request_id: &str, input_ids: Vec<u32>) -> sg::EmbedRequest {
    sg::EmbedRequest {
        request_id: request_id.to_owned(),
        tokenized: Some(sg::TokenizedInput {
            original_text: String::new(),
            input_ids,
        }),
        ..Default::default()
    }
}

/// The widest embedding accepted from a worker. Embedding models' hidden
/// sizes stay in the thousands (4,096 and 8,192 are common); the cap stops
/// a worker from making the gateway render millions of floats into JSON.
pub(crate) const MAX_EMBEDDING_DIM: usize = 65_536;

/// The embedding, or a violation if its length disagrees with its stated
/// dimension or passes [`MAX_EMBEDDING_DIM`].
pub(crate) fn embedding(response: sg::EmbedResponse) -> Result<Embedding, Violation> {
    let shape = |detail: String| Violation {
        kind: ProtocolViolation::EmbeddingShape,
        detail,
    };
    if response.embedding.len() != response.embedding_dim as usize {
        return Err(shape(format!(
            "the embedding has {} values but embedding_dim says {}",
            response.embedding.len(),
            response.embedding_dim
        )));
    }
    if response.embedding.len() > MAX_EMBEDDING_DIM {
        return Err(shape(format!(
            "the embedding has {} dimensions; the gateway accepts at most {MAX_EMBEDDING_DIM}",
            response.embedding.len()
        )));
    }
    Ok(Embedding {
        values: response.embedding,
        prompt_tokens: response.prompt_tokens,
    })
}

pub(crate) fn model_info(info: sg::GetModelInfoResponse) -> ModelInfo {
    super::model_info_from!(info)
}

pub(crate) fn server_info(info: sg::GetServerInfoResponse) -> ServerInfo {
    let scheduler_info = json_from_struct(info.scheduler_info);
    ServerInfo {
        shm_namespace_id: super::shm_namespace_id(&scheduler_info),
        active_requests: info.active_requests,
        max_total_num_tokens: info.max_total_num_tokens,
        version: info.sglang_version,
        server_args: json_from_struct(info.server_args),
        scheduler_info,
    }
}

pub(crate) fn loads_request() -> sg::GetLoadsRequest {
    sg::GetLoadsRequest {
        dp_rank: None,
        include: LOAD_SECTIONS.map(str::to_owned).to_vec(),
    }
}

/// SGLang reports no uncached waiting tokens; they count as 0.
pub(crate) fn load(loads: sg::GetLoadsResponse) -> Load {
    super::sum_ranks(
        loads.dp_rank_count,
        loads.loads.into_iter().map(|rank| RankLoad {
            running_requests: rank.num_running_reqs,
            waiting_requests: rank.num_waiting_reqs,
            max_running_requests: rank.max_running_requests,
            used_tokens: rank.num_used_tokens,
            max_total_tokens: rank.max_total_num_tokens,
            waiting_uncached_tokens: 0,
            token_usage: rank.token_usage,
            gen_throughput: rank.gen_throughput,
            cache_hit_rate: rank.cache_hit_rate,
        }),
    )
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use prost::Message;
    use smg_shared::tensor::DType;

    use super::*;
    use crate::engine::MatchedStop;
    use crate::engine::convert::wire::{Raw, field};
    use crate::error::ErrorCode;

    fn inline(dtype: DType, shape: &[u32], fill: u8) -> Tensor {
        let len = dtype.tensor_bytes(shape).expect("small tensor");
        Tensor {
            dtype,
            shape: shape.to_vec(),
            payload: Some(TensorPayload::Inline(Bytes::from(vec![fill; len]))),
        }
    }

    fn image(rows: u32, fill: u8, offset: u32) -> MediaItem {
        MediaItem {
            modality: Modality::Image,
            content_hash: [fill; 32],
            encoder_input: inline(DType::BFloat16, &[rows, 6], fill),
            model_specific: vec![(
                "image_grid_thw".to_owned(),
                inline(DType::Int64, &[1, 3], fill + 100),
            )],
            placeholders: vec![(offset, rows / 4)],
            placeholder_token_id: Some(4005),
        }
    }

    #[test]
    fn unset_sampling_fields_get_neutral_values_on_the_wire() {
        let wire = sampling_params(Sampling::default());
        let bytes = wire.encode_to_vec();
        // Fields 1-7 are plain scalars: explicit values, read by number.
        let cases = [
            (1, Raw::Fixed32(1.0f32.to_bits())),
            (2, Raw::Fixed32(1.0f32.to_bits())),
            (3, Raw::Varint(-1i64 as u64)),
            (7, Raw::Fixed32(1.0f32.to_bits())),
        ];
        for (number, expected) in cases {
            assert_eq!(field(&bytes, number), Some(expected), "field {number}");
        }
        // Zero is the neutral value for these, so proto3 leaves them off.
        for number in [4, 5, 6] {
            assert_eq!(field(&bytes, number), None, "field {number}");
        }
        assert_eq!(wire.min_p, 0.0);
        assert_eq!(wire.frequency_penalty, 0.0);
        assert_eq!(wire.presence_penalty, 0.0);
        assert_eq!(wire.max_new_tokens, None);
        assert_eq!(wire.n, 1);
    }

    #[test]
    fn set_sampling_fields_are_sent_as_given() {
        let wire = sampling_params(Sampling {
            temperature: Some(0.0),
            top_p: Some(0.5),
            top_k: Some(20),
            min_p: Some(0.05),
            frequency_penalty: Some(0.2),
            presence_penalty: Some(-0.3),
            repetition_penalty: Some(1.2),
            max_new_tokens: Some(64),
            min_new_tokens: 2,
            stop_token_ids: vec![4002],
            ignore_eos: true,
            n: 3,
            constraint: Some(Constraint::Regex("a+".to_owned())),
            ..Sampling::default()
        });
        assert_eq!(wire.temperature, 0.0, "greedy stays greedy");
        assert_eq!(wire.top_p, 0.5);
        assert_eq!(wire.top_k, 20);
        assert_eq!(wire.min_p, 0.05);
        assert_eq!(wire.frequency_penalty, 0.2);
        assert_eq!(wire.presence_penalty, -0.3);
        assert_eq!(wire.repetition_penalty, 1.2);
        assert_eq!(wire.max_new_tokens, Some(64));
        assert_eq!(wire.min_new_tokens, 2);
        assert_eq!(wire.stop_token_ids, [4002]);
        assert!(wire.ignore_eos);
        assert_eq!(wire.n, 3);
        assert_eq!(
            wire.constraint,
            Some(sg::sampling_params::Constraint::Regex("a+".to_owned()))
        );
    }

    #[test]
    fn pd_rooms_must_fit_int32() {
        let request = |room| GenerateRequest {
            kv_bootstrap: Some(KvBootstrap {
                host: "10.0.0.1".to_owned(),
                port: 8998,
                room,
            }),
            ..GenerateRequest::default()
        };
        let wire = generate_request(request(i64::from(i32::MAX))).expect("fits");
        assert_eq!(
            wire.disaggregated_params,
            Some(sg::DisaggregatedParams {
                bootstrap_host: "10.0.0.1".to_owned(),
                bootstrap_port: 8998,
                bootstrap_room: i32::MAX,
            })
        );
        let err = generate_request(request(i64::from(i32::MAX) + 1)).expect_err("refused");
        assert_eq!(err.code, ErrorCode::InvalidParameter);
        assert_eq!(err.param.as_deref(), Some("bootstrap_room"));
    }

    #[test]
    fn generate_request_fields_land_where_sglang_expects_them() {
        let wire = generate_request(GenerateRequest {
            request_id: "s1".to_owned(),
            input_ids: vec![5, 6],
            original_text: "yo".to_owned(),
            stream: true,
            data_parallel_rank: Some(2),
            ..GenerateRequest::default()
        })
        .expect("converts");
        assert_eq!(wire.request_id, "s1");
        assert!(wire.stream);
        assert_eq!(wire.data_parallel_rank, 2);
        assert_eq!(wire.logprob_start_len, -1);
        assert_eq!(wire.mm_inputs, None);
        assert_eq!(wire.disaggregated_params, None);
        // SGLang's TokenizedInput: text is field 1, ids field 2.
        let tokenized = wire.tokenized.expect("tokenized").encode_to_vec();
        assert_eq!(field(&tokenized, 1), Some(Raw::Bytes(b"yo".to_vec())));
        assert_eq!(field(&tokenized, 2), Some(Raw::Bytes(vec![5, 6])));
    }

    #[test]
    fn encode_bootstrap_is_refused() {
        let err = generate_request(GenerateRequest {
            encode_bootstrap: vec![crate::engine::EncodeBootstrap {
                item_index: 0,
                host: "h".to_owned(),
                port: 1,
                room: 1,
            }],
            ..GenerateRequest::default()
        })
        .expect_err("refused");
        assert_eq!(err.code, ErrorCode::InternalError);
    }

    #[test]
    fn items_concatenate_into_one_pixel_tensor() {
        let media = [image(4, 1, 3), image(8, 2, 20)];
        let inputs = multimodal_inputs(&media)
            .expect("converts")
            .expect("has media");
        let pixels = inputs.pixel_values.as_ref().expect("pixel values");
        assert_eq!(pixels.shape, [12, 6]);
        assert_eq!(pixels.dtype, "bfloat16");
        let mut expected = vec![1u8; 4 * 6 * 2];
        expected.extend(vec![2u8; 8 * 6 * 2]);
        assert_eq!(pixels.data, expected, "item order kept, bytes unchanged");

        assert_eq!(inputs.model_specific_tensors.len(), 1);
        let grid = &inputs.model_specific_tensors["image_grid_thw"];
        assert_eq!(grid.shape, [2, 3]);
        assert_eq!(grid.dtype, "int64");
        let mut expected = vec![101u8; 24];
        expected.extend(vec![102u8; 24]);
        assert_eq!(grid.data, expected);

        assert_eq!(
            inputs.mm_placeholders,
            [
                sg::PlaceholderRange {
                    offset: 3,
                    length: 1
                },
                sg::PlaceholderRange {
                    offset: 20,
                    length: 2
                },
            ]
        );
        assert_eq!(inputs.im_token_id, Some(4005));
        assert_eq!(inputs.modalities, ["image", "image"]);
    }

    #[test]
    fn metadata_only_items_send_no_pixels_but_keep_their_metadata() {
        let mut media = [image(4, 1, 3), image(4, 2, 9)];
        for item in &mut media {
            item.encoder_input.payload = None;
        }
        let inputs = multimodal_inputs(&media)
            .expect("converts")
            .expect("has media");
        assert_eq!(inputs.pixel_values, None);
        assert_eq!(inputs.mm_placeholders.len(), 2);
        assert_eq!(
            inputs.model_specific_tensors["image_grid_thw"].shape,
            [2, 3]
        );
    }

    #[test]
    fn media_sglang_cannot_carry_is_refused() {
        let shm = |mut item: MediaItem| {
            item.encoder_input.payload = Some(TensorPayload::Shm {
                name: "smg-x".to_owned(),
                offset: 0,
                nbytes: 48,
                owner_id: String::new(),
            });
            item
        };
        let remote = |mut item: MediaItem| {
            item.encoder_input.payload = Some(TensorPayload::Remote {
                transport: "rdma".to_owned(),
                descriptor: Bytes::new(),
                nbytes: 48,
            });
            item
        };
        let other_dtype = |mut item: MediaItem| {
            item.encoder_input = inline(DType::Float32, &[4, 6], 0);
            item
        };
        let other_width = |mut item: MediaItem| {
            item.encoder_input = inline(DType::BFloat16, &[4, 7], 0);
            item
        };
        let short_bytes = |mut item: MediaItem| {
            item.encoder_input.payload = Some(TensorPayload::Inline(Bytes::from_static(&[0; 5])));
            item
        };
        let metadata_only = |mut item: MediaItem| {
            item.encoder_input.payload = None;
            item
        };
        let no_grid = |mut item: MediaItem| {
            item.model_specific.clear();
            item
        };
        let video_token = |mut item: MediaItem| {
            item.placeholder_token_id = Some(4006);
            item
        };
        type Spoil = fn(MediaItem) -> MediaItem;
        let cases: [(&str, Spoil, ErrorCode, &str); 8] = [
            ("shm", shm, ErrorCode::InternalError, "inline only"),
            ("remote", remote, ErrorCode::InternalError, "inline only"),
            ("dtype", other_dtype, ErrorCode::InvalidRequest, "float32"),
            ("width", other_width, ErrorCode::InvalidRequest, "[4, 7]"),
            ("bytes", short_bytes, ErrorCode::InternalError, "5 bytes"),
            (
                "mixed",
                metadata_only,
                ErrorCode::InternalError,
                "all or none",
            ),
            (
                "names",
                no_grid,
                ErrorCode::InvalidRequest,
                "image_grid_thw",
            ),
            ("token", video_token, ErrorCode::InvalidRequest, "4006"),
        ];
        for (name, spoil, code, needle) in cases {
            let media = [image(4, 1, 0), spoil(image(4, 2, 9))];
            let err = multimodal_inputs(&media).expect_err(name);
            assert_eq!(err.code, code, "{name}: {err}");
            assert!(err.message.contains(needle), "{name}: {}", err.message);
        }
    }

    #[test]
    fn stream_messages_become_events() {
        use sg::generate_response::Response;
        let chunk = sg::GenerateResponse {
            request_id: "r".to_owned(),
            response: Some(Response::Chunk(sg::GenerateStreamChunk {
                token_ids: vec![9],
                prompt_tokens: 3,
                completion_tokens: 1,
                index: 1,
                output_logprobs: Some(sg::OutputLogProbs {
                    token_logprobs: vec![-0.7],
                    token_ids: vec![9],
                    top_logprobs: Vec::new(),
                }),
                ..Default::default()
            })),
        };
        assert_eq!(
            event(chunk),
            Some(GenerateEvent::Chunk {
                index: 1,
                token_ids: vec![9],
                prompt_tokens: 3,
                completion_tokens: 1,
                cached_tokens: 0,
                logprobs: Some(LogProbs {
                    token_logprobs: vec![-0.7],
                    token_ids: vec![9],
                    top: Vec::new(),
                }),
            })
        );
        let complete = sg::GenerateResponse {
            request_id: "r".to_owned(),
            response: Some(Response::Complete(sg::GenerateComplete {
                output_ids: vec![9, 4002],
                finish_reason: "stop".to_owned(),
                prompt_tokens: 3,
                completion_tokens: 2,
                cached_tokens: 1,
                matched_stop: Some(sg::generate_complete::MatchedStop::MatchedTokenId(4002)),
                index: 0,
                ..Default::default()
            })),
        };
        assert_eq!(
            event(complete),
            Some(GenerateEvent::Complete {
                index: 0,
                output_ids: vec![9, 4002],
                finish_reason: "stop".to_owned(),
                matched_stop: Some(MatchedStop::TokenId(4002)),
                prompt_tokens: 3,
                completion_tokens: 2,
                cached_tokens: 1,
                logprobs: None,
            })
        );
        assert_eq!(event(sg::GenerateResponse::default()), None);
    }

    #[test]
    fn embeddings_must_match_their_dimension() {
        let ok = embedding(sg::EmbedResponse {
            embedding_dim: 2,
            embedding: vec![0.6, 0.8],
            prompt_tokens: 4,
        })
        .expect("consistent");
        assert_eq!(ok.values, [0.6, 0.8]);
        assert_eq!(ok.prompt_tokens, 4);
        let bad = embedding(sg::EmbedResponse {
            embedding_dim: 3,
            embedding: vec![0.6, 0.8],
            prompt_tokens: 4,
        });
        assert_eq!(
            bad.map_err(|v| v.kind),
            Err(ProtocolViolation::EmbeddingShape)
        );
    }

    #[test]
    fn embeddings_wider_than_the_cap_are_refused() {
        let wide = |dim: usize| {
            embedding(sg::EmbedResponse {
                embedding_dim: dim as u32,
                embedding: vec![0.0; dim],
                prompt_tokens: 1,
            })
        };
        assert!(wide(MAX_EMBEDDING_DIM).is_ok());
        let refused = wide(MAX_EMBEDDING_DIM + 1).expect_err("too wide");
        assert_eq!(refused.kind, ProtocolViolation::EmbeddingShape);
    }

    #[test]
    fn loads_sum_over_ranks() {
        let rank = |dp_rank, running| sg::SchedulerLoad {
            dp_rank,
            num_running_reqs: running,
            num_waiting_reqs: 1,
            num_used_tokens: 10,
            max_total_num_tokens: 100,
            max_running_requests: 8,
            token_usage: 0.1,
            ..Default::default()
        };
        let load = load(sg::GetLoadsResponse {
            dp_rank_count: 2,
            loads: vec![rank(0, 3), rank(1, 4)],
            ..Default::default()
        });
        assert_eq!(load.running_requests, 7);
        assert_eq!(load.waiting_requests, 2);
        assert_eq!(load.max_running_requests, 16);
        assert_eq!(load.used_tokens, 20);
        assert_eq!(load.max_total_tokens, 200);
        assert_eq!(load.dp_rank_count, 2);
        assert_eq!(
            loads_request().include,
            ["core", "disagg", "queues", "memory"]
        );
    }
}
