//! The SGLang protocol: `SglangScheduler` for regular, prefill and decode
//! workers (SGLang has no encoder service). Pixel values arrive inline as one
//! tensor for the whole request; rooms are int32.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::{Request, Response, Status};

use crate::engine::{Event, GenerateJob, ItemSource, Role, Sampling, SimLogprobs};
use crate::proto::common;
use crate::proto::sglang_scheduler as sg;
use crate::service::{self, ResponseStream, Worker};
use crate::tensor::{Payload, RecordContext};

/// Serves `SglangScheduler` for one worker.
#[derive(Debug, Clone)]
pub struct Sglang(pub Worker);

/// Reads the request's pixel values (and model-specific tensors) as one
/// media item.
fn item_sources(
    worker: &Worker,
    request_id: &str,
    mm: Option<sg::MultimodalInputs>,
) -> Result<Vec<ItemSource>, Status> {
    let Some(mm) = mm else {
        return Ok(Vec::new());
    };
    let Some(pixels) = mm.pixel_values.as_ref() else {
        return Ok(Vec::new());
    };
    if worker.engine.role() == Role::Decode {
        return Ok(vec![ItemSource::MetadataOnly]);
    }
    let role = worker.engine.role().name();
    let context = |name| RecordContext {
        request_id,
        role,
        item_index: 0,
        name,
    };
    let input = worker.read(
        &pixels.dtype,
        &pixels.shape,
        Payload::Inline(&pixels.data),
        context("pixel_values"),
    )?;
    let mut named = Vec::with_capacity(mm.model_specific_tensors.len());
    for (name, tensor) in &mm.model_specific_tensors {
        let read = worker.read(
            &tensor.dtype,
            &tensor.shape,
            Payload::Inline(&tensor.data),
            context(name),
        )?;
        named.push((name.clone(), read.digest()));
    }
    Ok(vec![ItemSource::Received(crate::digest::item_digest(
        &input.digest(),
        &named,
    ))])
}

fn output_logprobs(logprobs: SimLogprobs) -> sg::OutputLogProbs {
    sg::OutputLogProbs {
        token_logprobs: logprobs.token_logprobs,
        token_ids: logprobs.token_ids,
        top_logprobs: logprobs
            .top
            .into_iter()
            .map(|(values, token_ids)| sg::TopLogProbs { values, token_ids })
            .collect(),
    }
}

fn response(request_id: &str, event: Event) -> sg::GenerateResponse {
    let response = match event {
        Event::Chunk(chunk) => sg::generate_response::Response::Chunk(sg::GenerateStreamChunk {
            token_ids: chunk.token_ids,
            prompt_tokens: chunk.prompt_tokens,
            completion_tokens: chunk.completion_tokens,
            cached_tokens: chunk.cached_tokens,
            output_logprobs: chunk.logprobs.map(output_logprobs),
            index: chunk.index,
            ..Default::default()
        }),
        Event::Complete(done) => sg::generate_response::Response::Complete(sg::GenerateComplete {
            output_ids: done.output_ids,
            finish_reason: done.finish_reason.to_owned(),
            prompt_tokens: done.prompt_tokens,
            completion_tokens: done.completion_tokens,
            cached_tokens: done.cached_tokens,
            matched_stop: done
                .matched_token_id
                .map(sg::generate_complete::MatchedStop::MatchedTokenId),
            output_logprobs: done.logprobs.map(output_logprobs),
            index: done.index,
            ..Default::default()
        }),
    };
    sg::GenerateResponse {
        request_id: request_id.to_owned(),
        response: Some(response),
    }
}

#[tonic::async_trait]
impl sg::sglang_scheduler_server::SglangScheduler for Sglang {
    type GenerateStream = ResponseStream<sg::GenerateResponse>;
    type GetTokenizerStream = ResponseStream<common::GetTokenizerChunk>;
    type SubscribeKvEventsStream = ResponseStream<common::KvEventBatch>;

    async fn generate(
        &self,
        request: Request<sg::GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let mut request = request.into_inner();
        let sampling = request.sampling_params.take().unwrap_or_default();
        service::reject_string_stops(&sampling.stop)?;
        let kv = request
            .disaggregated_params
            .take()
            .filter(|p| !p.bootstrap_host.is_empty())
            .map(|p| {
                service::rendezvous(
                    &p.bootstrap_host,
                    p.bootstrap_port,
                    i64::from(p.bootstrap_room),
                    "disaggregated_params",
                )
            })
            .transpose()?;
        let worker = self.0.clone();
        let request_id = request.request_id.clone();
        let mm = request.mm_inputs.take();
        let items = service::blocking(move || item_sources(&worker, &request_id, mm)).await?;
        let job = GenerateJob {
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
                    use sg::sampling_params::Constraint as C;
                    match constraint {
                        C::JsonSchema(text) => format!("json_schema {text}"),
                        C::Regex(text) => format!("regex {text}"),
                        C::EbnfGrammar(text) => format!("ebnf_grammar {text}"),
                        C::StructuralTag(text) => format!("structural_tag {text}"),
                    }
                }),
                json_schema: match sampling.constraint {
                    Some(sg::sampling_params::Constraint::JsonSchema(schema)) => Some(schema),
                    _ => None,
                },
            },
            stream: request.stream,
            kv,
        };
        let request_id = job.request_id.clone();
        let rank = self.0.enter_rank(request.data_parallel_rank)?;
        let events = self.0.engine.generate(job)?;
        Ok(Response::new(service::event_stream(events, move |event| {
            let _counted_until_the_stream_drops = &rank;
            response(&request_id, event)
        })))
    }

    async fn embed(
        &self,
        request: Request<sg::EmbedRequest>,
    ) -> Result<Response<sg::EmbedResponse>, Status> {
        if self.0.engine.role() != Role::Regular {
            return Err(Status::failed_precondition(
                "embeddings are served by regular workers only",
            ));
        }
        let request = request.into_inner();
        let input_ids = request.tokenized.map(|t| t.input_ids).unwrap_or_default();
        if input_ids.is_empty() {
            return Err(Status::invalid_argument("the input has no tokens"));
        }
        // A deterministic unit vector derived from the input.
        let digest = crate::digest::prompt_digest(&input_ids, &[]);
        let mut rng = StdRng::from_seed(digest);
        let dim = (self.0.engine.config.hostile.embedding_dim)
            .unwrap_or(self.0.engine.model.hidden_size)
            .max(1);
        let raw: Vec<f32> = (0..dim).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let norm = raw
            .iter()
            .map(|v| v * v)
            .sum::<f32>()
            .sqrt()
            .max(f32::MIN_POSITIVE);
        Ok(Response::new(sg::EmbedResponse {
            embedding_dim: dim,
            embedding: raw.into_iter().map(|v| v / norm).collect(),
            prompt_tokens: input_ids.len() as u32,
        }))
    }

    async fn health_check(
        &self,
        _request: Request<sg::HealthCheckRequest>,
    ) -> Result<Response<sg::HealthCheckResponse>, Status> {
        let (healthy, message) = self.0.health();
        Ok(Response::new(sg::HealthCheckResponse { healthy, message }))
    }

    async fn abort(
        &self,
        request: Request<sg::AbortRequest>,
    ) -> Result<Response<sg::AbortResponse>, Status> {
        let request = request.into_inner();
        let success = self.0.engine.abort(&request.request_id);
        let message = if success {
            "aborted"
        } else {
            "no such running request"
        };
        Ok(Response::new(sg::AbortResponse {
            success,
            message: message.to_owned(),
        }))
    }

    async fn get_model_info(
        &self,
        _request: Request<sg::GetModelInfoRequest>,
    ) -> Result<Response<sg::GetModelInfoResponse>, Status> {
        let model = &self.0.engine.model;
        let path = model.model_path.display().to_string();
        let tokenizer_path = self
            .0
            .engine
            .config
            .hostile
            .advertised_tokenizer_path(path.clone());
        Ok(Response::new(sg::GetModelInfoResponse {
            model_path: path.clone(),
            tokenizer_path,
            is_generation: true,
            preferred_sampling_params: String::new(),
            weight_version: self.0.engine.config.hostile.padded("default".to_owned()),
            served_model_name: model.served_model_name.clone(),
            max_context_length: model.max_context_length as i32,
            vocab_size: model.vocab_size as i32,
            supports_vision: model.supports_vision,
            model_type: model.model_type.clone(),
            eos_token_ids: model.eos_token_ids.iter().map(|&id| id as i32).collect(),
            pad_token_id: model.pad_token_id as i32,
            bos_token_id: model.bos_token_id as i32,
            max_req_input_len: model.max_context_length as i32,
            architectures: model.architectures.clone(),
            id2label_json: String::new(),
            num_labels: 0,
        }))
    }

    async fn get_server_info(
        &self,
        _request: Request<sg::GetServerInfoRequest>,
    ) -> Result<Response<sg::GetServerInfoResponse>, Status> {
        let engine = &self.0.engine;
        Ok(Response::new(sg::GetServerInfoResponse {
            server_args: Some(self.0.server_args()),
            scheduler_info: Some(self.0.scheduler_info()),
            active_requests: engine.loads().running,
            is_paused: false,
            last_receive_timestamp: 0.0,
            uptime_seconds: engine.uptime().as_secs_f64(),
            sglang_version: engine
                .config
                .hostile
                .padded(concat!("smg-sim-worker ", env!("CARGO_PKG_VERSION")).to_owned()),
            server_type: "grpc".to_owned(),
            start_time: Some(service::timestamp(engine.started)),
            max_total_num_tokens: engine.config.max_total_tokens as i32,
        }))
    }

    async fn get_loads(
        &self,
        _request: Request<sg::GetLoadsRequest>,
    ) -> Result<Response<sg::GetLoadsResponse>, Status> {
        let loads = self.0.engine.loads();
        let hostile = &self.0.engine.config.hostile;
        let load = sg::SchedulerLoad {
            dp_rank: 0,
            num_running_reqs: loads.running,
            num_waiting_reqs: loads.waiting,
            num_total_reqs: loads.running + loads.waiting,
            num_used_tokens: loads.used_tokens,
            max_total_num_tokens: loads.max_total_tokens,
            token_usage: loads.token_usage(),
            gen_throughput: loads.gen_throughput,
            cache_hit_rate: loads.cache_hit_rate,
            utilization: loads.utilization(),
            max_running_requests: loads.max_running_requests,
            queues: Some(sg::QueueMetrics {
                waiting: loads.waiting,
                ..Default::default()
            }),
            ..Default::default()
        };
        // With several ranks: the engine's figures on rank 0's entry and
        // each rank's own running count (the gateway sums ranks).
        let ranks: Vec<sg::SchedulerLoad> = if self.0.dp_running.len() == 1 {
            vec![load.clone()]
        } else {
            self.0
                .dp_running
                .iter()
                .enumerate()
                .map(|(rank, running)| sg::SchedulerLoad {
                    dp_rank: rank as i32,
                    num_running_reqs: running.load(std::sync::atomic::Ordering::Relaxed),
                    ..if rank == 0 {
                        load.clone()
                    } else {
                        sg::SchedulerLoad::default()
                    }
                })
                .collect()
        };
        Ok(Response::new(sg::GetLoadsResponse {
            timestamp: service::now_rfc3339(),
            version: self
                .0
                .engine
                .config
                .hostile
                .padded(env!("CARGO_PKG_VERSION").to_owned()),
            dp_rank_count: hostile.dp_ranks.unwrap_or(ranks.len() as i32),
            aggregate: Some(sg::AggregateMetrics {
                total_running_reqs: load.num_running_reqs,
                total_waiting_reqs: load.num_waiting_reqs,
                total_reqs: load.num_total_reqs,
                avg_token_usage: load.token_usage,
                avg_throughput: load.gen_throughput,
                avg_utilization: load.utilization,
            }),
            loads: ranks,
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
