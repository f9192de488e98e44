//! The TokenSpeed protocol: `TokenSpeedScheduler` (every role; discovery
//! only on encode workers) and `TokenSpeedEncoder` (encode workers).

use std::collections::HashMap;

use tonic::{Request, Response, Status};

use crate::engine::{Event, GenerateJob, ItemSource, Rendezvous, Role, Sampling, SimLogprobs};
use crate::proto::common;
use crate::proto::tokenspeed_encoder as enc;
use crate::proto::tokenspeed_scheduler as ts;
use crate::service::{self, ResponseStream, Worker};
use crate::tensor::{Payload, RecordContext};

/// Serves both TokenSpeed services for one worker.
#[derive(Debug, Clone)]
pub struct TokenSpeed(pub Worker);

impl TokenSpeed {
    fn to_job(
        &self,
        request: ts::GenerateRequest,
        items: Vec<ItemSource>,
    ) -> Result<GenerateJob, Status> {
        let sampling = request.sampling_params.unwrap_or_default();
        service::reject_string_stops(&sampling.stop)?;
        let kv = request
            .kv_bootstrap_info
            .map(|kv| {
                service::rendezvous(
                    &kv.bootstrap_host,
                    kv.bootstrap_port,
                    kv.bootstrap_room,
                    "kv_bootstrap_info",
                )
            })
            .transpose()?;
        Ok(GenerateJob {
            request_id: request.request_id,
            input_ids: request.tokenized.map(|t| t.input_ids).unwrap_or_default(),
            items,
            sampling: Sampling {
                max_new_tokens: sampling.max_new_tokens,
                min_new_tokens: sampling.min_new_tokens,
                stop_token_ids: sampling.stop_token_ids,
                ignore_eos: sampling.ignore_eos,
                n: sampling.n.max(1),
                logprobs: request
                    .return_logprob
                    .then(|| request.top_logprobs_num.max(0) as u32),
                constraint: sampling.constraint.as_ref().map(|constraint| {
                    use ts::sampling_params::Constraint as C;
                    match constraint {
                        C::JsonSchema(text) => format!("json_schema {text}"),
                        C::Regex(text) => format!("regex {text}"),
                        C::EbnfGrammar(text) => format!("ebnf_grammar {text}"),
                        C::StructuralTag(text) => format!("structural_tag {text}"),
                    }
                }),
                json_schema: match sampling.constraint {
                    Some(ts::sampling_params::Constraint::JsonSchema(schema)) => Some(schema),
                    _ => None,
                },
            },
            stream: request.stream,
            kv,
        })
    }
}

/// The payload of a TokenSpeed tensor, borrowed.
fn payload(tensor: &ts::TensorData) -> Option<Payload<'_>> {
    Some(match tensor.payload.as_ref()? {
        ts::tensor_data::Payload::Inline(bytes) => Payload::Inline(bytes),
        ts::tensor_data::Payload::Shm(handle) => Payload::Shm {
            name: &handle.name,
            offset: handle.offset,
            nbytes: handle.nbytes,
        },
        ts::tensor_data::Payload::Remote(handle) => Payload::Remote {
            transport: &handle.transport,
            descriptor: &handle.descriptor,
            nbytes: handle.nbytes,
        },
    })
}

/// Reads one item's encoder input and model-specific tensors and returns the
/// item's fingerprint; `None` when the item carries no encoder input.
fn read_item(
    worker: &Worker,
    request_id: &str,
    index: usize,
    item: &ts::MultimodalItem,
) -> Result<Option<[u8; 32]>, Status> {
    let role = worker.engine.role().name();
    let Some(input) = item.encoder_input.as_ref() else {
        return Ok(None);
    };
    let Some(input_payload) = payload(input) else {
        return Ok(None);
    };
    let context = |name| RecordContext {
        request_id,
        role,
        item_index: index,
        name,
    };
    let pixels = worker.read(
        &input.dtype,
        &input.shape,
        input_payload,
        context("encoder_input"),
    )?;
    let mut named = Vec::with_capacity(item.model_specific_tensors.len());
    for (name, tensor) in &item.model_specific_tensors {
        let Some(tensor_payload) = payload(tensor) else {
            continue;
        };
        let read = worker.read(&tensor.dtype, &tensor.shape, tensor_payload, context(name))?;
        named.push((name.clone(), read.digest()));
    }
    Ok(Some(crate::digest::item_digest(&pixels.digest(), &named)))
}

/// Decides, per item, whether it is read here, fetched from an encoder, or
/// metadata only (decode).
fn item_sources(
    worker: &Worker,
    request_id: &str,
    mm_inputs: Option<ts::MultimodalInputs>,
    encode_info: Option<ts::EncodeBootstrapInfo>,
) -> Result<Vec<ItemSource>, Status> {
    let items = mm_inputs.map(|m| m.items).unwrap_or_default();
    let mut from_encoder: HashMap<u32, Rendezvous> = HashMap::new();
    for info in encode_info.map(|e| e.items).unwrap_or_default() {
        if info.item_index as usize >= items.len() {
            return Err(Status::invalid_argument(format!(
                "encode_bootstrap_info names item {} but the request has {} items",
                info.item_index,
                items.len()
            )));
        }
        let peer = service::rendezvous(
            &info.bootstrap_host,
            info.bootstrap_port,
            info.bootstrap_room,
            "encode_bootstrap_info",
        )?;
        from_encoder.insert(info.item_index, peer);
    }
    let decode = worker.engine.role() == Role::Decode;
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            if decode {
                return Ok(ItemSource::MetadataOnly);
            }
            if let Some(peer) = from_encoder.remove(&(index as u32)) {
                return Ok(ItemSource::FromEncoder(peer));
            }
            Ok(match read_item(worker, request_id, index, item)? {
                Some(digest) => ItemSource::Received(digest),
                None => ItemSource::MetadataOnly,
            })
        })
        .collect()
}

fn output_logprobs(logprobs: SimLogprobs) -> ts::OutputLogProbs {
    ts::OutputLogProbs {
        token_logprobs: logprobs.token_logprobs,
        token_ids: logprobs.token_ids,
        top_logprobs: logprobs
            .top
            .into_iter()
            .map(|(values, token_ids)| ts::TopLogProbs { values, token_ids })
            .collect(),
    }
}

fn response(request_id: &str, event: Event) -> ts::GenerateResponse {
    let response = match event {
        Event::Chunk(chunk) => ts::generate_response::Response::Chunk(ts::GenerateStreamChunk {
            token_ids: chunk.token_ids,
            prompt_tokens: chunk.prompt_tokens,
            completion_tokens: chunk.completion_tokens,
            cached_tokens: chunk.cached_tokens,
            output_logprobs: chunk.logprobs.map(output_logprobs),
            index: chunk.index,
        }),
        Event::Complete(done) => ts::generate_response::Response::Complete(ts::GenerateComplete {
            output_ids: done.output_ids,
            finish_reason: done.finish_reason.to_owned(),
            prompt_tokens: done.prompt_tokens,
            completion_tokens: done.completion_tokens,
            cached_tokens: done.cached_tokens,
            output_logprobs: done.logprobs.map(output_logprobs),
            matched_stop: done
                .matched_token_id
                .map(ts::generate_complete::MatchedStop::MatchedTokenId),
            index: done.index,
        }),
    };
    ts::GenerateResponse {
        request_id: request_id.to_owned(),
        response: Some(response),
    }
}

#[tonic::async_trait]
impl ts::token_speed_scheduler_server::TokenSpeedScheduler for TokenSpeed {
    type GenerateStream = ResponseStream<ts::GenerateResponse>;
    type GetTokenizerStream = ResponseStream<common::GetTokenizerChunk>;
    type SubscribeKvEventsStream = ResponseStream<common::KvEventBatch>;

    async fn generate(
        &self,
        request: Request<ts::GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let mut request = request.into_inner();
        if self.0.engine.role() == Role::Encode {
            return Err(Status::failed_precondition(
                "this is an encode worker: it serves Encode, not Generate",
            ));
        }
        let worker = self.0.clone();
        let request_id = request.request_id.clone();
        let mm_inputs = request.mm_inputs.take();
        let encode_info = request.encode_bootstrap_info.take();
        let items =
            service::blocking(move || item_sources(&worker, &request_id, mm_inputs, encode_info))
                .await?;
        let job = self.to_job(request, items)?;
        let request_id = job.request_id.clone();
        let events = self.0.engine.generate(job)?;
        Ok(Response::new(service::event_stream(events, move |event| {
            response(&request_id, event)
        })))
    }

    async fn health_check(
        &self,
        _request: Request<ts::HealthCheckRequest>,
    ) -> Result<Response<ts::HealthCheckResponse>, Status> {
        let (healthy, message) = self.0.health();
        Ok(Response::new(ts::HealthCheckResponse { healthy, message }))
    }

    async fn abort(
        &self,
        request: Request<ts::AbortRequest>,
    ) -> Result<Response<ts::AbortResponse>, Status> {
        let request = request.into_inner();
        let success = self.0.engine.abort(&request.request_id);
        let message = if success {
            "aborted"
        } else {
            "no such running request"
        };
        Ok(Response::new(ts::AbortResponse {
            success,
            message: message.to_owned(),
        }))
    }

    async fn get_model_info(
        &self,
        _request: Request<ts::GetModelInfoRequest>,
    ) -> Result<Response<ts::GetModelInfoResponse>, Status> {
        let model = &self.0.engine.model;
        let path = model.model_path.display().to_string();
        let tokenizer_path = self
            .0
            .engine
            .config
            .hostile
            .advertised_tokenizer_path(path.clone());
        let vision = model.supports_vision;
        Ok(Response::new(ts::GetModelInfoResponse {
            model_path: path.clone(),
            tokenizer_path,
            served_model_name: model.served_model_name.clone(),
            model_type: model.model_type.clone(),
            architectures: model.architectures.clone(),
            max_context_length: model.max_context_length as i32,
            max_req_input_len: model.max_context_length as i32,
            vocab_size: model.vocab_size as i32,
            eos_token_ids: model.eos_token_ids.iter().map(|&id| id as i32).collect(),
            pad_token_id: model.pad_token_id as i32,
            bos_token_id: model.bos_token_id as i32,
            weight_version: self.0.engine.config.hostile.padded("default".to_owned()),
            default_sampling_params_json: String::new(),
            supports_vision: vision,
            supports_multimodal: vision,
            supported_modalities: if vision {
                vec![common::Modality::Image as i32]
            } else {
                Vec::new()
            },
            model_dtype: "bfloat16".to_owned(),
            multimodal_encoder_dtype: if vision {
                "bfloat16".to_owned()
            } else {
                String::new()
            },
        }))
    }

    async fn get_server_info(
        &self,
        _request: Request<ts::GetServerInfoRequest>,
    ) -> Result<Response<ts::GetServerInfoResponse>, Status> {
        let engine = &self.0.engine;
        Ok(Response::new(ts::GetServerInfoResponse {
            server_args: Some(self.0.server_args()),
            scheduler_info: Some(self.0.scheduler_info()),
            active_requests: engine.loads().running,
            is_paused: false,
            uptime_seconds: engine.uptime().as_secs_f64(),
            max_total_num_tokens: engine.config.max_total_tokens as i32,
            tokenspeed_version: engine
                .config
                .hostile
                .padded(concat!("smg-sim-worker ", env!("CARGO_PKG_VERSION")).to_owned()),
            start_time: Some(service::timestamp(engine.started)),
        }))
    }

    async fn get_loads(
        &self,
        _request: Request<ts::GetLoadsRequest>,
    ) -> Result<Response<ts::GetLoadsResponse>, Status> {
        let loads = self.0.engine.loads();
        let load = ts::SchedulerLoad {
            dp_rank: 0,
            num_running_reqs: loads.running,
            num_waiting_reqs: loads.waiting,
            num_total_reqs: loads.running + loads.waiting,
            num_used_tokens: loads.used_tokens,
            max_total_num_tokens: loads.max_total_tokens,
            max_running_requests: loads.max_running_requests,
            token_usage: loads.token_usage(),
            gen_throughput: loads.gen_throughput,
            cache_hit_rate: loads.cache_hit_rate,
            utilization: loads.utilization(),
            memory: None,
            queues: Some(ts::QueueMetrics {
                waiting: loads.waiting,
                ..Default::default()
            }),
            num_waiting_uncached_tokens: loads.waiting_uncached_tokens,
        };
        Ok(Response::new(ts::GetLoadsResponse {
            timestamp: service::now_rfc3339(),
            version: self
                .0
                .engine
                .config
                .hostile
                .padded(env!("CARGO_PKG_VERSION").to_owned()),
            dp_rank_count: self.0.engine.config.hostile.dp_ranks.unwrap_or(1),
            aggregate: Some(ts::AggregateMetrics {
                total_running_reqs: load.num_running_reqs,
                total_waiting_reqs: load.num_waiting_reqs,
                total_reqs: load.num_total_reqs,
                avg_token_usage: load.token_usage,
                avg_throughput: load.gen_throughput,
                avg_utilization: load.utilization,
            }),
            loads: vec![load],
        }))
    }

    async fn flush_cache(
        &self,
        _request: Request<common::FlushCacheRequest>,
    ) -> Result<Response<common::FlushCacheResponse>, Status> {
        self.0.engine.flush_cache();
        Ok(Response::new(common::FlushCacheResponse {
            success: true,
            message: "prefix cache flushed".to_owned(),
        }))
    }

    async fn get_tokenizer(
        &self,
        _request: Request<common::GetTokenizerRequest>,
    ) -> Result<Response<Self::GetTokenizerStream>, Status> {
        Ok(Response::new(self.0.tokenizer_chunks()))
    }

    async fn subscribe_kv_events(
        &self,
        _request: Request<common::SubscribeKvEventsRequest>,
    ) -> Result<Response<Self::SubscribeKvEventsStream>, Status> {
        Err(Status::unimplemented(
            "the simulated worker publishes no KV events yet",
        ))
    }
}

#[tonic::async_trait]
impl enc::token_speed_encoder_server::TokenSpeedEncoder for TokenSpeed {
    async fn encode(
        &self,
        request: Request<enc::EncodeRequest>,
    ) -> Result<Response<enc::EncodeResponse>, Status> {
        if self.0.engine.role() != Role::Encode {
            return Err(Status::failed_precondition(format!(
                "this is a {} worker, not an encode worker",
                self.0.engine.role().name()
            )));
        }
        let request = request.into_inner();
        let items = request.mm_inputs.map(|m| m.items).unwrap_or_default();
        let ([item], [assignment]) = (items.as_slice(), request.items.as_slice()) else {
            return Err(Status::invalid_argument(format!(
                "an encode call takes exactly one item and one assignment, got {} and {}",
                items.len(),
                request.items.len()
            )));
        };
        if assignment.bootstrap_room < 0 {
            return Err(Status::invalid_argument("the bootstrap room is negative"));
        }
        let room = assignment.bootstrap_room;
        let worker = self.0.clone();
        let item = item.clone();
        let request_id = request.request_id;
        let digest = service::blocking(move || read_item(&worker, &request_id, 0, &item)).await?;
        let digest =
            digest.ok_or_else(|| Status::invalid_argument("the item carries no encoder input"))?;
        let accepted = self.0.engine.encode(digest, room).await?;
        Ok(Response::new(enc::EncodeResponse { accepted }))
    }
}
