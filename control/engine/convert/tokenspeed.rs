//! TokenSpeed's messages ⇄ the engine types.
//!
//! TokenSpeed's protocol is close to smg's own model: one `MultimodalItem` per
//! media item, tensors inline, in `/dev/shm` or in remote memory, sampling
//! fields as proto3 `optional`s (unset stays unset), int64 rooms. The
//! conversions here are therefore mostly one-to-one; the checks are the room
//! ranges. TokenSpeed has no per-request DP rank field, so
//! `GenerateRequest::data_parallel_rank` does not travel to it.

use std::collections::HashMap;

use super::{LOAD_SECTIONS, RankLoad, checked_room, json_from_struct};
use crate::engine::{
    Constraint, EncodeBootstrap, GenerateEvent, GenerateRequest, KvBootstrap, Load, LogProbs,
    MediaItem, Modality, ModelInfo, Runtime, Sampling, ServerInfo, Tensor, TensorPayload,
};
use crate::error::Result;
use crate::proto::{common, tokenspeed_encoder as enc, tokenspeed_scheduler as ts};

/// The Generate request a TokenSpeed worker receives.
pub(crate) fn generate_request(request: GenerateRequest) -> Result<ts::GenerateRequest> {
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
        data_parallel_rank: _,
        // The gateway's own bound on the answer (engine::bounds).
        output_budget: _,
    } = request;
    let kv_bootstrap_info = kv_bootstrap.map(kv_bootstrap_info).transpose()?;
    let encode_bootstrap_info = if encode_bootstrap.is_empty() {
        None
    } else {
        Some(ts::EncodeBootstrapInfo {
            items: encode_bootstrap
                .into_iter()
                .map(encode_item_bootstrap)
                .collect::<Result<_>>()?,
        })
    };
    let mm_inputs = (!media.is_empty()).then(|| ts::MultimodalInputs {
        items: media.into_iter().map(multimodal_item).collect(),
    });
    Ok(ts::GenerateRequest {
        request_id,
        tokenized: Some(ts::TokenizedInput {
            input_ids,
            original_text,
        }),
        sampling_params: Some(sampling_params(sampling)),
        return_logprob,
        // No input-token logprobs: the gateway only reports output logprobs.
        logprob_start_len: Some(-1),
        top_logprobs_num,
        token_ids_logprob: Vec::new(),
        stream,
        mm_inputs,
        encode_bootstrap_info,
        kv_bootstrap_info,
    })
}

/// The Encode request for one media item and its room: today's encode
/// workers take exactly one item and one assignment per call.
pub(crate) fn encode_request(
    request_id: &str,
    item: &MediaItem,
    room: i64,
) -> Result<enc::EncodeRequest> {
    let bootstrap_room = checked_room(Runtime::TokenSpeed, room)?;
    Ok(enc::EncodeRequest {
        request_id: request_id.to_owned(),
        mm_inputs: Some(ts::MultimodalInputs {
            items: vec![multimodal_item(item.clone())],
        }),
        items: vec![enc::EncodeItemAssignment { bootstrap_room }],
    })
}

fn kv_bootstrap_info(kv: KvBootstrap) -> Result<ts::KvBootstrapInfo> {
    Ok(ts::KvBootstrapInfo {
        bootstrap_room: checked_room(Runtime::TokenSpeed, kv.room)?,
        bootstrap_host: kv.host,
        bootstrap_port: i32::from(kv.port),
    })
}

fn encode_item_bootstrap(info: EncodeBootstrap) -> Result<ts::EncodeItemBootstrapInfo> {
    Ok(ts::EncodeItemBootstrapInfo {
        item_index: info.item_index,
        bootstrap_room: checked_room(Runtime::TokenSpeed, info.room)?,
        bootstrap_host: info.host,
        bootstrap_port: i32::from(info.port),
    })
}

fn sampling_params(sampling: Sampling) -> ts::SamplingParams {
    ts::SamplingParams {
        temperature: sampling.temperature,
        top_p: sampling.top_p,
        top_k: sampling.top_k,
        min_p: sampling.min_p,
        frequency_penalty: sampling.frequency_penalty,
        presence_penalty: sampling.presence_penalty,
        repetition_penalty: sampling.repetition_penalty,
        max_new_tokens: sampling.max_new_tokens,
        min_new_tokens: sampling.min_new_tokens,
        // String stops never reach engines; the gateway trims them.
        stop: Vec::new(),
        stop_token_ids: sampling.stop_token_ids,
        ignore_eos: sampling.ignore_eos,
        skip_special_tokens: sampling.skip_special_tokens,
        spaces_between_special_tokens: sampling.spaces_between_special_tokens,
        n: sampling.n.max(1),
        logit_bias: sampling.logit_bias.into_iter().collect::<HashMap<_, _>>(),
        constraint: sampling.constraint.map(|constraint| {
            use ts::sampling_params::Constraint as Wire;
            match constraint {
                Constraint::Regex(text) => Wire::Regex(text),
                Constraint::JsonSchema(text) => Wire::JsonSchema(text),
                Constraint::EbnfGrammar(text) => Wire::EbnfGrammar(text),
                Constraint::StructuralTag(text) => Wire::StructuralTag(text),
            }
        }),
        custom_params: None,
        no_stop_trim: sampling.no_stop_trim,
    }
}

fn multimodal_item(item: MediaItem) -> ts::MultimodalItem {
    ts::MultimodalItem {
        modality: modality(item.modality) as i32,
        content_hash: bytes::Bytes::copy_from_slice(&item.content_hash),
        encoder_input: Some(tensor_data(item.encoder_input)),
        model_specific_tensors: item
            .model_specific
            .into_iter()
            .map(|(name, tensor)| (name, tensor_data(tensor)))
            .collect(),
        placeholders: item
            .placeholders
            .into_iter()
            .map(|(offset, length)| ts::PlaceholderRange { offset, length })
            .collect(),
        placeholder_token_id: item.placeholder_token_id,
    }
}

fn modality(modality: Modality) -> common::Modality {
    match modality {
        Modality::Image => common::Modality::Image,
        Modality::Video => common::Modality::Video,
        Modality::Audio => common::Modality::Audio,
    }
}

fn tensor_data(tensor: Tensor) -> ts::TensorData {
    use ts::tensor_data::Payload;
    ts::TensorData {
        shape: tensor.shape,
        dtype: tensor.dtype.wire_name().to_owned(),
        payload: tensor.payload.map(|payload| match payload {
            // The data plane's buffer itself: no copy on the way out.
            TensorPayload::Inline(bytes) => Payload::Inline(bytes),
            TensorPayload::Shm {
                name,
                offset,
                nbytes,
                owner_id,
            } => Payload::Shm(common::ShmHandle {
                name,
                offset,
                nbytes,
                owner_id,
            }),
            TensorPayload::Remote {
                transport,
                descriptor,
                nbytes,
            } => Payload::Remote(common::RemoteTensorHandle {
                transport,
                descriptor,
                nbytes,
            }),
        }),
    }
}

/// One Generate stream message as an event; `None` if it carries neither a
/// chunk nor a completion.
pub(crate) fn event(response: ts::GenerateResponse) -> Option<GenerateEvent> {
    super::generate_event_from!(ts, response, log_probs)
}

fn log_probs(probs: ts::OutputLogProbs) -> LogProbs {
    super::log_probs(
        probs.token_logprobs,
        probs.token_ids,
        probs
            .top_logprobs
            .into_iter()
            .map(|top| (top.values, top.token_ids)),
    )
}

pub(crate) fn model_info(info: ts::GetModelInfoResponse) -> ModelInfo {
    super::model_info_from!(info)
}

pub(crate) fn server_info(info: ts::GetServerInfoResponse) -> ServerInfo {
    let scheduler_info = json_from_struct(info.scheduler_info);
    ServerInfo {
        shm_namespace_id: super::shm_namespace_id(&scheduler_info),
        active_requests: info.active_requests,
        max_total_num_tokens: info.max_total_num_tokens,
        version: info.tokenspeed_version,
        server_args: json_from_struct(info.server_args),
        scheduler_info,
    }
}

pub(crate) fn loads_request() -> ts::GetLoadsRequest {
    ts::GetLoadsRequest {
        dp_rank: None,
        include: LOAD_SECTIONS.map(str::to_owned).to_vec(),
    }
}

pub(crate) fn load(loads: ts::GetLoadsResponse) -> Load {
    super::sum_ranks(
        loads.dp_rank_count,
        loads.loads.into_iter().map(|rank| RankLoad {
            running_requests: rank.num_running_reqs,
            waiting_requests: rank.num_waiting_reqs,
            max_running_requests: rank.max_running_requests,
            used_tokens: rank.num_used_tokens,
            max_total_tokens: rank.max_total_num_tokens,
            waiting_uncached_tokens: rank.num_waiting_uncached_tokens,
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

    fn image(payload: Option<TensorPayload>) -> MediaItem {
        MediaItem {
            modality: Modality::Image,
            content_hash: [7; 32],
            encoder_input: Tensor {
                dtype: DType::BFloat16,
                shape: vec![4, 1176],
                payload,
            },
            model_specific: vec![(
                "image_grid_thw".to_owned(),
                Tensor {
                    dtype: DType::Int64,
                    shape: vec![1, 3],
                    payload: Some(TensorPayload::Inline(Bytes::from_static(&[1; 24]))),
                },
            )],
            placeholders: vec![(3, 4)],
            placeholder_token_id: Some(4005),
        }
    }

    #[test]
    fn optional_sampling_fields_stay_unset_or_set_as_given() {
        let set = Sampling {
            temperature: Some(0.0),
            top_p: Some(0.9),
            top_k: Some(-1),
            min_p: Some(0.0),
            frequency_penalty: Some(0.5),
            presence_penalty: Some(0.0),
            repetition_penalty: Some(1.1),
            max_new_tokens: Some(0),
            n: 2,
            ..Sampling::default()
        };
        let wire = sampling_params(set);
        assert_eq!(wire.temperature, Some(0.0), "zero is kept, not dropped");
        assert_eq!(wire.top_p, Some(0.9));
        assert_eq!(wire.top_k, Some(-1));
        assert_eq!(wire.min_p, Some(0.0));
        assert_eq!(wire.frequency_penalty, Some(0.5));
        assert_eq!(wire.presence_penalty, Some(0.0));
        assert_eq!(wire.repetition_penalty, Some(1.1));
        assert_eq!(wire.max_new_tokens, Some(0));
        assert_eq!(wire.n, 2);
        // A zero temperature still goes on the wire (field 1, fixed32 0.0).
        assert_eq!(
            field(&wire.encode_to_vec(), 1),
            Some(Raw::Fixed32(0.0f32.to_bits()))
        );

        let unset = sampling_params(Sampling::default());
        assert_eq!(unset.temperature, None);
        assert_eq!(unset.top_k, None);
        assert_eq!(unset.repetition_penalty, None);
        assert_eq!(unset.max_new_tokens, None);
        assert_eq!(unset.n, 1, "n is at least 1");
        let bytes = unset.encode_to_vec();
        for number in 1..=8 {
            assert_eq!(field(&bytes, number), None, "field {number} left unset");
        }
    }

    #[test]
    fn generate_request_carries_ids_bootstraps_and_stream() {
        let request = GenerateRequest {
            request_id: "r1".to_owned(),
            input_ids: vec![1, 2, 3],
            original_text: "hi".to_owned(),
            stream: true,
            return_logprob: true,
            top_logprobs_num: 5,
            sampling: Sampling {
                stop_token_ids: vec![9],
                logit_bias: vec![("11".to_owned(), -100.0)],
                constraint: Some(Constraint::JsonSchema("{}".to_owned())),
                ..Sampling::default()
            },
            media: vec![image(None)],
            kv_bootstrap: Some(KvBootstrap {
                host: "10.0.0.1".to_owned(),
                port: 8998,
                room: i64::MAX,
            }),
            encode_bootstrap: vec![EncodeBootstrap {
                item_index: 0,
                host: "10.0.0.2".to_owned(),
                port: 9000,
                room: 5,
            }],
            data_parallel_rank: Some(3),
            output_budget: Some(7),
        };
        let wire = generate_request(request).expect("converts");
        assert_eq!(wire.request_id, "r1");
        assert_eq!(
            wire.sampling_params.as_ref().and_then(|s| s.max_new_tokens),
            None,
            "the gateway's output budget is its own, never sent"
        );
        assert_eq!(wire.logprob_start_len, Some(-1));
        assert!(wire.stream && wire.return_logprob);
        assert_eq!(wire.top_logprobs_num, 5);
        let sampling = wire.sampling_params.as_ref().expect("sampling");
        assert_eq!(sampling.stop_token_ids, [9]);
        assert_eq!(sampling.logit_bias.get("11"), Some(&-100.0));
        assert_eq!(
            sampling.constraint,
            Some(ts::sampling_params::Constraint::JsonSchema("{}".to_owned()))
        );
        assert_eq!(
            wire.kv_bootstrap_info,
            Some(ts::KvBootstrapInfo {
                bootstrap_host: "10.0.0.1".to_owned(),
                bootstrap_port: 8998,
                bootstrap_room: i64::MAX,
            })
        );
        let encode = wire.encode_bootstrap_info.as_ref().expect("encode info");
        assert_eq!(encode.items.len(), 1);
        assert_eq!(encode.items[0].bootstrap_port, 9000);
        assert_eq!(encode.items[0].bootstrap_room, 5);

        // TokenSpeed's TokenizedInput: ids are field 1, text field 2.
        let tokenized = wire.tokenized.expect("tokenized").encode_to_vec();
        assert_eq!(field(&tokenized, 1), Some(Raw::Bytes(vec![1, 2, 3])));
        assert_eq!(field(&tokenized, 2), Some(Raw::Bytes(b"hi".to_vec())));
    }

    #[test]
    fn plain_requests_send_no_media_or_bootstrap() {
        let wire = generate_request(GenerateRequest {
            request_id: "plain".to_owned(),
            ..GenerateRequest::default()
        })
        .expect("converts");
        assert_eq!(wire.mm_inputs, None);
        assert_eq!(wire.kv_bootstrap_info, None);
        assert_eq!(wire.encode_bootstrap_info, None);
        assert!(!wire.stream);
    }

    #[test]
    fn negative_rooms_are_refused() {
        let request = GenerateRequest {
            kv_bootstrap: Some(KvBootstrap {
                host: "h".to_owned(),
                port: 1,
                room: -5,
            }),
            ..GenerateRequest::default()
        };
        let err = generate_request(request).expect_err("refused");
        assert_eq!(err.code, ErrorCode::InvalidParameter);
        let item = image(None);
        let err = encode_request("e", &item, -1).expect_err("refused");
        assert_eq!(err.code, ErrorCode::InvalidParameter);
    }

    #[test]
    fn media_items_keep_their_metadata_and_payload_kind() {
        use ts::tensor_data::Payload;
        let cases = [
            (None, None),
            (
                Some(TensorPayload::Inline(Bytes::from_static(b"pix"))),
                Some(Payload::Inline(Bytes::from_static(b"pix"))),
            ),
            (
                Some(TensorPayload::Shm {
                    name: "smg-1".to_owned(),
                    offset: 64,
                    nbytes: 9408,
                    owner_id: "gw".to_owned(),
                }),
                Some(Payload::Shm(common::ShmHandle {
                    name: "smg-1".to_owned(),
                    offset: 64,
                    nbytes: 9408,
                    owner_id: "gw".to_owned(),
                })),
            ),
            (
                Some(TensorPayload::Remote {
                    transport: "rdma".to_owned(),
                    descriptor: Bytes::from_static(b"desc"),
                    nbytes: 9408,
                }),
                Some(Payload::Remote(common::RemoteTensorHandle {
                    transport: "rdma".to_owned(),
                    descriptor: Bytes::from_static(b"desc"),
                    nbytes: 9408,
                })),
            ),
        ];
        for (payload, expected) in cases {
            let wire = multimodal_item(image(payload));
            assert_eq!(wire.modality, common::Modality::Image as i32);
            assert_eq!(wire.content_hash, vec![7; 32]);
            let input = wire.encoder_input.expect("encoder input");
            assert_eq!(input.shape, [4, 1176]);
            assert_eq!(input.dtype, "bfloat16");
            assert_eq!(input.payload, expected);
            let grid = &wire.model_specific_tensors["image_grid_thw"];
            assert_eq!(grid.dtype, "int64");
            assert_eq!(
                grid.payload,
                Some(Payload::Inline(Bytes::from(vec![1; 24])))
            );
            assert_eq!(
                wire.placeholders,
                [ts::PlaceholderRange {
                    offset: 3,
                    length: 4
                }]
            );
            assert_eq!(wire.placeholder_token_id, Some(4005));
        }
    }

    #[test]
    fn encode_request_has_one_item_and_one_assignment() {
        let item = image(Some(TensorPayload::Inline(Bytes::from_static(b"x"))));
        let wire = encode_request("enc-1", &item, i64::MAX).expect("converts");
        assert_eq!(wire.request_id, "enc-1");
        assert_eq!(wire.mm_inputs.expect("mm").items.len(), 1);
        assert_eq!(
            wire.items,
            [enc::EncodeItemAssignment {
                bootstrap_room: i64::MAX
            }]
        );
    }

    #[test]
    fn stream_messages_become_events() {
        use ts::generate_response::Response;
        let probs = ts::OutputLogProbs {
            token_logprobs: vec![-0.1],
            token_ids: vec![42],
            top_logprobs: vec![ts::TopLogProbs {
                values: vec![-0.1, -3.0],
                token_ids: vec![42, 43],
            }],
        };
        let chunk = ts::GenerateResponse {
            request_id: "r".to_owned(),
            response: Some(Response::Chunk(ts::GenerateStreamChunk {
                token_ids: vec![42],
                prompt_tokens: 10,
                completion_tokens: 1,
                cached_tokens: 4,
                output_logprobs: Some(probs),
                index: 2,
            })),
        };
        assert_eq!(
            event(chunk),
            Some(GenerateEvent::Chunk {
                index: 2,
                token_ids: vec![42],
                prompt_tokens: 10,
                completion_tokens: 1,
                cached_tokens: 4,
                logprobs: Some(LogProbs {
                    token_logprobs: vec![-0.1],
                    token_ids: vec![42],
                    top: vec![vec![(-0.1, 42), (-3.0, 43)]],
                }),
            })
        );
        let complete = ts::GenerateResponse {
            request_id: "r".to_owned(),
            response: Some(Response::Complete(ts::GenerateComplete {
                output_ids: vec![42, 7],
                finish_reason: "stop".to_owned(),
                prompt_tokens: 10,
                completion_tokens: 2,
                cached_tokens: 4,
                output_logprobs: None,
                matched_stop: Some(ts::generate_complete::MatchedStop::MatchedStopStr(
                    "</s>".to_owned(),
                )),
                index: 1,
            })),
        };
        assert_eq!(
            event(complete),
            Some(GenerateEvent::Complete {
                index: 1,
                output_ids: vec![42, 7],
                finish_reason: "stop".to_owned(),
                matched_stop: Some(MatchedStop::Text("</s>".to_owned())),
                prompt_tokens: 10,
                completion_tokens: 2,
                cached_tokens: 4,
                logprobs: None,
            })
        );
        assert_eq!(event(ts::GenerateResponse::default()), None);
    }

    #[test]
    fn model_info_drops_negative_ids() {
        let info = model_info(ts::GetModelInfoResponse {
            served_model_name: "m".to_owned(),
            max_context_length: 32768,
            vocab_size: -1,
            eos_token_ids: vec![4002, -1],
            bos_token_id: -1,
            pad_token_id: 0,
            supports_vision: true,
            ..Default::default()
        });
        assert_eq!(info.served_model_name, "m");
        assert_eq!(info.max_context_length, 32768);
        assert_eq!(info.vocab_size, 0);
        assert_eq!(info.eos_token_ids, [4002]);
        assert_eq!(info.bos_token_id, None);
        assert_eq!(info.pad_token_id, Some(0));
        assert!(info.supports_vision);
    }

    #[test]
    fn loads_ask_for_every_section() {
        assert_eq!(
            loads_request().include,
            ["core", "disagg", "queues", "memory"]
        );
        assert_eq!(loads_request().dp_rank, None);
    }
}
