//! Engine workers as the control plane sees them: one protocol-neutral request
//! and event type, and one client that speaks TokenSpeed or SGLang underneath.
//!
//! The two engines disagree on field numbers, room widths and where tensors
//! go (see `proto/`); everything above this module uses only the types here,
//! so a pipeline stage never matches on the runtime.

mod bounds;
mod client;
mod convert;
mod decode_limit;
mod pool;
mod tls;

pub use client::{EngineClient, EventStream, MAX_TOKENIZER_ARCHIVE_BYTES, check_worker_url};
pub use pool::ConnectionConfig;
pub use tls::{WorkerTls, check_worker_tls};

use bytes::Bytes;
use futures::future::BoxFuture;

use crate::error::Result;
use smg_shared::tensor::DType;

/// Which engine protocol a worker speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Runtime {
    TokenSpeed,
    Sglang,
}

impl Runtime {
    pub const fn name(self) -> &'static str {
        match self {
            Runtime::TokenSpeed => "tokenspeed",
            Runtime::Sglang => "sglang",
        }
    }

    /// The largest PD/EPD room this runtime's wire type holds: SGLang rooms
    /// are int32, TokenSpeed rooms int64 (both non-negative).
    pub const fn max_room(self) -> i64 {
        match self {
            Runtime::TokenSpeed => i64::MAX,
            Runtime::Sglang => i32::MAX as i64,
        }
    }

    /// Whether the runtime has an encoder service (EPD).
    pub const fn has_encoder(self) -> bool {
        matches!(self, Runtime::TokenSpeed)
    }
}

/// The calls the gateway makes to one worker, whatever it runs.
///
/// Why a trait: the router's retries, blame, leg coupling and cancellation
/// depend only on what these calls answer and when, so the same pipeline
/// runs against [`EngineClient`] (gRPC to a real or simulated engine) in
/// production and against a scripted engine in process, under paused time,
/// in the router's tests.
pub trait Engine: std::fmt::Debug + Send + Sync + 'static {
    /// The worker's URL, as the fleet names it.
    fn url(&self) -> &str;

    fn runtime(&self) -> Runtime;

    /// Starts a Generate call; see [`EngineClient::generate`].
    fn generate(&self, request: GenerateRequest) -> BoxFuture<'_, Result<EventStream>>;

    /// Sends one media item to an encode worker; see [`EngineClient::encode`].
    fn encode<'a>(
        &'a self,
        request_id: &'a str,
        item: &'a MediaItem,
        room: i64,
    ) -> BoxFuture<'a, Result<bool>>;

    /// Asks the worker to stop a request; see [`EngineClient::abort`].
    fn abort<'a>(&'a self, request_id: &'a str, reason: &'a str) -> BoxFuture<'a, Result<bool>>;

    /// Embeds `input_ids`; see [`EngineClient::embed`].
    fn embed<'a>(
        &'a self,
        request_id: &'a str,
        input_ids: Vec<u32>,
    ) -> BoxFuture<'a, Result<Embedding>>;

    fn health_check(&self) -> BoxFuture<'_, Result<bool>>;

    fn model_info(&self) -> BoxFuture<'_, Result<ModelInfo>>;

    fn server_info(&self) -> BoxFuture<'_, Result<ServerInfo>>;

    fn loads(&self) -> BoxFuture<'_, Result<Load>>;

    fn tokenizer_archive(&self) -> BoxFuture<'_, Result<Vec<u8>>>;
}

/// A fresh random rendezvous room valid for `runtime`.
pub fn mint_room(runtime: Runtime) -> i64 {
    rand::random_range(0..=runtime.max_room())
}

/// Reads a worker's Generate stream from the raw bytes of its messages, as
/// [`EngineClient::generate`] reads them off the wire: each message is
/// held to the size a legitimate answer to `request` can need (refused
/// undecoded past it), decoded as `runtime`'s `GenerateResponse`, turned
/// into a [`GenerateEvent`] and held to `request`'s output bounds (its
/// `n`, `max_new_tokens` or `output_budget`, and logprob ask). Returns the events
/// passed on, including completions the gateway makes for sequences it cut,
/// or the error (`worker_protocol_violation`) that would end the stream.
///
/// Why public: these are the first steps to see a worker's bytes, and the
/// fuzz target `worker_response` (`fuzz/`) drives them with arbitrary bytes
/// without a gRPC server. The client runs the same conversion and bounds.
pub fn read_generate_messages<'a>(
    runtime: Runtime,
    request: &GenerateRequest,
    messages: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Vec<GenerateEvent>> {
    use prost::Message;

    use crate::error::{Error, ErrorCode};
    use crate::proto::{sglang_scheduler as sg, tokenspeed_scheduler as ts};

    let refuse = |detail: String| Error::new(ErrorCode::WorkerProtocolViolation, detail);
    let mut bounds = bounds::OutputBounds::for_request(request);
    let limit = decode_limit::generate_message_bytes(request);
    let mut events = Vec::new();
    for bytes in messages {
        if bytes.len() > limit {
            return Err(refuse(format!(
                "a Generate message of {} bytes is over the request's limit of {limit}",
                bytes.len()
            )));
        }
        let event = match runtime {
            Runtime::TokenSpeed => {
                ts::GenerateResponse::decode(bytes).map(convert::tokenspeed::event)
            }
            Runtime::Sglang => sg::GenerateResponse::decode(bytes).map(convert::sglang::event),
        }
        .map_err(|err| refuse(format!("a Generate message does not decode: {err}")))?
        .ok_or_else(|| {
            refuse("a Generate message carried neither a chunk nor a completion".to_owned())
        })?;
        let admitted = bounds
            .admit(event)
            .map_err(|violation| refuse(violation.detail))?;
        events.extend(admitted.event);
        events.extend(admitted.cut);
    }
    Ok(events)
}

/// Which of a worker's other answers [`read_worker_answer`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerKind {
    ModelInfo,
    ServerInfo,
    Loads,
    /// SGLang's `Embed` (TokenSpeed has no such RPC).
    Embed,
}

/// A worker's answer other than Generate, as the gateway reads it.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerAnswer {
    ModelInfo(ModelInfo),
    ServerInfo(ServerInfo),
    Load(Load),
    Embedding(Embedding),
}

/// Reads `bytes` as the `runtime`'s encoded answer of `kind` the way
/// [`EngineClient`] reads it: refused past the call's decoding limit
/// (`decode_limit`), decoded by prost, converted and checked as the client
/// converts and checks it (an embedding's shape and width).
///
/// Why public: as [`read_generate_messages`], for the fuzz target
/// `worker_response` (`fuzz/`), which drives these conversions with
/// arbitrary bytes without a gRPC server.
pub fn read_worker_answer(
    runtime: Runtime,
    kind: AnswerKind,
    bytes: &[u8],
) -> Result<WorkerAnswer> {
    use prost::Message;

    use crate::error::{Error, ErrorCode};
    use crate::proto::{sglang_scheduler as sg, tokenspeed_scheduler as ts};

    let refuse = |detail: String| Error::new(ErrorCode::WorkerProtocolViolation, detail);
    let limit = match kind {
        AnswerKind::Embed => decode_limit::embed_message_bytes(),
        AnswerKind::ModelInfo | AnswerKind::ServerInfo | AnswerKind::Loads => {
            decode_limit::CONTROL_MESSAGE_BYTES
        }
    };
    if bytes.len() > limit {
        return Err(refuse(format!(
            "a {kind:?} answer of {} bytes is over its limit of {limit}",
            bytes.len()
        )));
    }
    let undecodable = |err: prost::DecodeError| refuse(format!("a {kind:?} answer: {err}"));
    Ok(match (runtime, kind) {
        (Runtime::TokenSpeed, AnswerKind::ModelInfo) => {
            WorkerAnswer::ModelInfo(convert::tokenspeed::model_info(
                ts::GetModelInfoResponse::decode(bytes).map_err(undecodable)?,
            ))
        }
        (Runtime::Sglang, AnswerKind::ModelInfo) => {
            WorkerAnswer::ModelInfo(convert::sglang::model_info(
                sg::GetModelInfoResponse::decode(bytes).map_err(undecodable)?,
            ))
        }
        (Runtime::TokenSpeed, AnswerKind::ServerInfo) => {
            WorkerAnswer::ServerInfo(convert::tokenspeed::server_info(
                ts::GetServerInfoResponse::decode(bytes).map_err(undecodable)?,
            ))
        }
        (Runtime::Sglang, AnswerKind::ServerInfo) => {
            WorkerAnswer::ServerInfo(convert::sglang::server_info(
                sg::GetServerInfoResponse::decode(bytes).map_err(undecodable)?,
            ))
        }
        (Runtime::TokenSpeed, AnswerKind::Loads) => WorkerAnswer::Load(convert::tokenspeed::load(
            ts::GetLoadsResponse::decode(bytes).map_err(undecodable)?,
        )),
        (Runtime::Sglang, AnswerKind::Loads) => WorkerAnswer::Load(convert::sglang::load(
            sg::GetLoadsResponse::decode(bytes).map_err(undecodable)?,
        )),
        (Runtime::Sglang, AnswerKind::Embed) => WorkerAnswer::Embedding(
            convert::sglang::embedding(sg::EmbedResponse::decode(bytes).map_err(undecodable)?)
                .map_err(|violation| refuse(violation.detail))?,
        ),
        (Runtime::TokenSpeed, AnswerKind::Embed) => {
            return Err(Error::new(
                ErrorCode::UnsupportedEndpoint,
                "TokenSpeed has no Embed RPC",
            ));
        }
    })
}

/// Where a tensor's bytes travel.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorPayload {
    /// In the gRPC message itself.
    Inline(Bytes),
    /// A `/dev/shm` name the worker opens, reads and unlinks (TokenSpeed).
    Shm {
        name: String,
        offset: u64,
        nbytes: u64,
        owner_id: String,
    },
    /// Remote memory the worker fetches itself (TokenSpeed).
    Remote {
        transport: String,
        descriptor: Bytes,
        nbytes: u64,
    },
}

/// A tensor for an engine: element type, shape and where its bytes are.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<u32>,
    /// `None` sends the metadata only (what prefill and decode see in EPD).
    pub payload: Option<TensorPayload>,
}

/// What kind of media an item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Modality {
    Image,
    Video,
    Audio,
}

/// One media item of a prompt, in prompt order.
#[derive(Debug, Clone, PartialEq)]
pub struct MediaItem {
    pub modality: Modality,
    /// blake3 of the raw media bytes.
    pub content_hash: [u8; 32],
    /// The encoder's input (pixel values).
    pub encoder_input: Tensor,
    /// Named side tensors (e.g. `image_grid_thw`), sent inline.
    pub model_specific: Vec<(String, Tensor)>,
    /// (offset, length) of the item's placeholder tokens in the prompt.
    pub placeholders: Vec<(u32, u32)>,
    pub placeholder_token_id: Option<u32>,
}

/// A structured-output constraint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Constraint {
    Regex(String),
    JsonSchema(String),
    EbnfGrammar(String),
    StructuralTag(String),
}

/// Sampling as smg understands it; `None` leaves the engine's default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub max_new_tokens: Option<u32>,
    pub min_new_tokens: u32,
    /// Token stops only: engines run without a tokenizer, so the gateway
    /// trims string stops itself.
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub skip_special_tokens: bool,
    pub spaces_between_special_tokens: bool,
    pub no_stop_trim: bool,
    /// Number of sequences (at least 1).
    pub n: u32,
    pub logit_bias: Vec<(String, f32)>,
    pub constraint: Option<Constraint>,
}

/// The PD rendezvous: prefill's bootstrap server and the request's room,
/// identical on both legs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvBootstrap {
    pub host: String,
    pub port: u16,
    pub room: i64,
}

/// Where prefill fetches media item `item_index`'s embedding (EPD).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodeBootstrap {
    pub item_index: u32,
    pub host: String,
    pub port: u16,
    pub room: i64,
}

/// A Generate call, protocol-neutral.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerateRequest {
    pub request_id: String,
    pub input_ids: Vec<u32>,
    pub original_text: String,
    pub sampling: Sampling,
    pub stream: bool,
    pub return_logprob: bool,
    pub top_logprobs_num: i32,
    pub media: Vec<MediaItem>,
    pub kv_bootstrap: Option<KvBootstrap>,
    pub encode_bootstrap: Vec<EncodeBootstrap>,
    pub data_parallel_rank: Option<i32>,
    /// Tokens per sequence the gateway accepts from the worker: the asked
    /// `max_new_tokens`, else the context left after the prompt. Never sent
    /// (the worker gets `sampling.max_new_tokens` as asked); `None` holds
    /// the stream to `sampling.max_new_tokens` alone.
    pub output_budget: Option<u32>,
}

/// Which stop ended a sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MatchedStop {
    TokenId(u32),
    Text(String),
}

/// Per-token log probabilities, when requested.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogProbs {
    pub token_logprobs: Vec<f32>,
    pub token_ids: Vec<u32>,
    /// For each position: (logprob, token id) alternatives.
    pub top: Vec<Vec<(f32, u32)>>,
}

/// What a Generate stream says.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerateEvent {
    /// New tokens of sequence `index` (a delta).
    Chunk {
        index: u32,
        token_ids: Vec<u32>,
        prompt_tokens: u32,
        completion_tokens: u32,
        cached_tokens: u32,
        logprobs: Option<LogProbs>,
    },
    /// Sequence `index` is done.
    Complete {
        index: u32,
        output_ids: Vec<u32>,
        finish_reason: String,
        matched_stop: Option<MatchedStop>,
        prompt_tokens: u32,
        completion_tokens: u32,
        cached_tokens: u32,
        logprobs: Option<LogProbs>,
    },
}

/// What a worker says about its model (GetModelInfo).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelInfo {
    pub model_path: String,
    pub tokenizer_path: String,
    pub served_model_name: String,
    pub model_type: String,
    pub architectures: Vec<String>,
    pub max_context_length: u32,
    pub max_req_input_len: u32,
    pub vocab_size: u32,
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    pub pad_token_id: Option<u32>,
    pub weight_version: String,
    pub supports_vision: bool,
}

/// What a worker says about itself (GetServerInfo).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerInfo {
    /// `"<boot_id>:<st_dev>"` when the worker advertises it.
    pub shm_namespace_id: Option<String>,
    pub active_requests: i32,
    pub max_total_num_tokens: i32,
    pub version: String,
    pub server_args: serde_json::Value,
    pub scheduler_info: serde_json::Value,
}

/// A worker's load (GetLoads), summed over its DP ranks: counts and
/// throughput add up, `token_usage` and `cache_hit_rate` are rank averages.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Load {
    pub running_requests: i32,
    pub waiting_requests: i32,
    /// Requests the engine runs at once (`max_running_requests`), summed
    /// over its ranks; 0 when it reports none.
    pub max_running_requests: i32,
    pub used_tokens: i32,
    pub max_total_tokens: i32,
    pub waiting_uncached_tokens: i32,
    pub token_usage: f64,
    pub gen_throughput: f64,
    pub cache_hit_rate: f64,
    pub dp_rank_count: i32,
}

/// An embedding (SGLang `Embed`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Embedding {
    pub values: Vec<f32>,
    pub prompt_tokens: u32,
}
