//! [`EngineClient`]: one gRPC client for TokenSpeed and SGLang workers.
//!
//! Pipeline stages hold one `EngineClient` per worker and never learn which
//! protocol it speaks: this module picks the generated stub, converts
//! requests and replies with `convert`, and turns every gRPC status and
//! transport failure into the control plane's [`Error`], naming the worker
//! and saying how far the call got ([`Reach`]). It is also where the
//! worker's answers are first trusted, so it holds them to what was asked
//! (`bounds`: tokens per sequence, logprob alternatives, sequence indices)
//! and caps what it downloads (the tokenizer archive) and how large a
//! message it decodes (`decode_limit`: per call, from what was asked).
//!
//! Calls go over the worker's connection pool (`pool`): connections open
//! lazily and reconnect with backoff, so creating a client does no I/O and
//! a restarted worker needs no new client. A call the worker refused
//! unseen (HTTP/2 GOAWAY above its last stream id, REFUSED_STREAM) is sent
//! again at once on a fresh connection: the worker is up (it just said so)
//! and cannot have started the call, so this is safe even while the
//! request's other legs run. A call whose connection closed before it was
//! written (a keep-alive ping that went unanswered, a reset, a crash) is
//! not: the path to that worker is what failed, so the call is given back
//! unsent ([`Reach::Unsent`]) for the router to send to another worker. `grpcs://` workers are dialled over
//! TLS as [`WorkerTls`] says (with a client certificate for workers that
//! ask for one): every pooled connection makes its own TLS session.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use futures::Stream;
use futures::future::BoxFuture;
use sha2::{Digest as _, Sha256};
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

use super::bounds::{Admitted, OutputBounds, Violation};
use super::convert::{sglang, tokenspeed};
use super::decode_limit;
use super::pool::{ConnectionConfig, InBackoff, Lease, Pool};
use super::tls::WorkerTls;
use super::{
    Embedding, Engine, GenerateEvent, GenerateRequest, Load, MediaItem, ModelInfo, Runtime,
    ServerInfo,
};
use crate::error::{Error, ErrorCode, Reach, Result, excerpt};
use crate::log_throttle::{LogThrottle, Verdict};
use crate::metrics::ProtocolViolation;
use crate::proto::sglang_scheduler::sglang_scheduler_client::SglangSchedulerClient;
use crate::proto::tokenspeed_encoder::token_speed_encoder_client::TokenSpeedEncoderClient;
use crate::proto::tokenspeed_scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
use crate::proto::{self, common, sglang_scheduler as sg, tokenspeed_scheduler as ts};

/// How many times a call the worker refused unseen (GOAWAY,
/// REFUSED_STREAM) is sent again, each time on a fresh connection, before
/// it fails (as `worker_unavailable`, charging nobody, unsent: the router
/// may send it elsewhere).
const MAX_RESENDS: u32 = 3;

/// The largest tokenizer archive the gateway downloads from a worker. Real
/// ones (a `tokenizer.json` of at most tens of MiB, compressed, and a few
/// small JSON files) stay far below; the cap stops a worker from streaming
/// an archive of any size into the gateway's memory.
pub const MAX_TOKENIZER_ARCHIVE_BYTES: usize = 128 * 1024 * 1024;

/// The least time between two log lines about one worker's protocol
/// violations; the metric counts every violation.
const VIOLATION_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Keeps a hostile worker from writing the gateway's log at request rate:
/// every violation is counted, but at most one line per worker per
/// [`VIOLATION_LOG_INTERVAL`] is logged, saying how many were left out.
static VIOLATION_LOG: LazyLock<LogThrottle> =
    LazyLock::new(|| LogThrottle::new(VIOLATION_LOG_INTERVAL));

/// Logs `violation` by `worker` (during `request_id`, when there is one)
/// unless the worker's line for this interval was logged already.
fn warn_violation(worker: &str, request_id: Option<&str>, violation: &Violation) {
    let Verdict::Log { suppressed } = VIOLATION_LOG.admit(worker) else {
        return;
    };
    let interval = VIOLATION_LOG_INTERVAL.as_secs();
    tracing::warn!(
        worker,
        request_id = request_id.unwrap_or("-"),
        kind = violation.kind.label(),
        suppressed,
        "{}{}",
        violation.detail,
        match suppressed {
            0 => String::new(),
            n => format!(
                " ({n} earlier violations by this worker were not logged: \
                 one line per worker every {interval} s)"
            ),
        }
    );
}

/// The events of one Generate call. A gRPC status mid-stream, or a stream
/// that ends before its sequences complete, arrives as one `Err` item, after
/// which the stream ends. Dropping the stream cancels the call on the worker.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<GenerateEvent>> + Send + 'static>>;

/// A gRPC client of one engine worker. Cloning is cheap: clones share the
/// connections.
#[derive(Debug, Clone)]
pub struct EngineClient {
    url: Arc<str>,
    runtime: Runtime,
    pool: Arc<Pool>,
}

/// The stubs, on one pooled channel. Their answers are decoded up to
/// [`decode_limit::CONTROL_MESSAGE_BYTES`] unless a call sets its own
/// limit (Generate, Embed, GetTokenizer's chunks).
fn ts_scheduler(channel: Channel) -> TokenSpeedSchedulerClient<Channel> {
    TokenSpeedSchedulerClient::new(channel)
        .max_decoding_message_size(decode_limit::CONTROL_MESSAGE_BYTES)
        .max_encoding_message_size(proto::MAX_MESSAGE_BYTES)
}

fn ts_encoder(channel: Channel) -> TokenSpeedEncoderClient<Channel> {
    TokenSpeedEncoderClient::new(channel)
        .max_decoding_message_size(decode_limit::CONTROL_MESSAGE_BYTES)
        .max_encoding_message_size(proto::MAX_MESSAGE_BYTES)
}

fn sg_scheduler(channel: Channel) -> SglangSchedulerClient<Channel> {
    SglangSchedulerClient::new(channel)
        .max_decoding_message_size(decode_limit::CONTROL_MESSAGE_BYTES)
        .max_encoding_message_size(proto::MAX_MESSAGE_BYTES)
}

/// The start of the status tonic makes when a message's length prefix is
/// over the call's decoding limit (`tonic::codec::decode`). tonic gives
/// that refusal no type of its own, so [`over_decode_limit`] reads this
/// text; `decode_limit_refusals_are_told_from_worker_statuses` pins it to
/// the tonic in the lock file.
const DECODE_LIMIT_REFUSAL: &str = "Error, decoded message length too large";

/// Whether `status` is tonic refusing a worker's message for its length
/// (read from its prefix, before the message was buffered or decoded), as
/// opposed to a status the worker sent. A worker that sends this status
/// itself only gets itself blamed as if it had sent such a message.
fn over_decode_limit(status: &Status) -> bool {
    status.code() == Code::OutOfRange
        && std::error::Error::source(status).is_none()
        && status.message().starts_with(DECODE_LIMIT_REFUSAL)
}

/// How far a failed call got, as the transport errors under a status tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// The worker answered with this status, or reset this one stream.
    Answered,
    /// The connection broke under the call (or could not be made).
    Connection,
    /// The worker refused the call unseen on this connection (GOAWAY above
    /// its last stream id, REFUSED_STREAM): it is up; a fresh connection
    /// to it may take the call.
    Refused,
    /// The connection closed before the call was written (hyper gave it
    /// back): the worker never saw it, and the path to the worker is what
    /// failed.
    Unsent,
    /// No connect was tried: the last one failed and its backoff is not
    /// over ([`InBackoff`]). The worker is unreachable as that failure
    /// said; this call is not another failure of it.
    Backoff,
}

/// Reads a status's source chain: a status the worker sent has none; one
/// tonic made from a transport failure carries the hyper and h2 errors.
fn classify(status: &Status) -> Failure {
    let mut source = std::error::Error::source(status);
    if source.is_none() {
        return Failure::Answered;
    }
    while let Some(err) = source {
        if err
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            .is_some_and(|inner| inner.is::<InBackoff>())
        {
            return Failure::Backoff;
        }
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            // RFC 9113 §6.8: streams above a GOAWAY's last stream id were
            // not processed; §8.7: neither was a REFUSED_STREAM one. h2
            // marks exactly those streams with the peer's GOAWAY.
            if h2.reason() == Some(h2::Reason::REFUSED_STREAM)
                || (h2.is_go_away() && h2.is_remote())
            {
                return Failure::Refused;
            }
            if h2.is_reset() {
                return Failure::Answered;
            }
            return Failure::Connection;
        }
        // hyper gave the request back without writing it: the connection
        // closed before it could be sent.
        if err
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_canceled)
        {
            return Failure::Unsent;
        }
        source = err.source();
    }
    Failure::Connection
}

impl EngineClient {
    /// A client of the worker at `url` (`grpc://host:port`, `http://host:port`
    /// or `host:port`; `grpcs://host:port` over TLS with the public roots)
    /// speaking `runtime`, with default connection settings. Does no I/O:
    /// connections open on first use. Must be called inside a tokio runtime.
    pub fn new(url: &str, runtime: Runtime) -> Result<Self> {
        Self::new_with_tls(url, runtime, &WorkerTls::default())
    }

    /// As [`EngineClient::new`], dialling `grpcs://` URLs as `tls` says.
    pub fn new_with_tls(url: &str, runtime: Runtime, tls: &WorkerTls) -> Result<Self> {
        Self::with_connections(url, runtime, ConnectionConfig::default(), tls)
    }

    /// As [`EngineClient::new`], connecting as `connections` says and
    /// dialling `grpcs://` URLs as `tls` says: each of the pool's
    /// connections to such a worker is a TLS session made with `tls`.
    pub fn with_connections(
        url: &str,
        runtime: Runtime,
        connections: ConnectionConfig,
        tls: &WorkerTls,
    ) -> Result<Self> {
        let (uri, secure) = dial_uri(url)?;
        // The channels spawn their connection tasks on the current runtime.
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::internal(
                "an EngineClient must be created inside a tokio runtime",
            ));
        }
        let pool = Pool::new(url, &uri, connections, secure.then_some(tls)).map_err(|why| {
            Error::invalid_parameter("url", format!("worker URL {:?}: {why}", excerpt(url)))
        })?;
        Ok(Self {
            url: Arc::from(url),
            runtime,
            pool: Arc::new(pool),
        })
    }

    /// Connects to the worker at `url` and finds out which protocol it
    /// speaks: TokenSpeed's `GetModelInfo` first, SGLang's when the worker
    /// answers UNIMPLEMENTED.
    pub async fn detect(url: &str, connections: ConnectionConfig) -> Result<Self> {
        Self::detect_with_tls(url, connections, &WorkerTls::default()).await
    }

    /// As [`EngineClient::detect`], dialling `grpcs://` URLs as `tls` says.
    pub async fn detect_with_tls(
        url: &str,
        connections: ConnectionConfig,
        tls: &WorkerTls,
    ) -> Result<Self> {
        let client = Self::with_connections(url, Runtime::TokenSpeed, connections, tls)?;
        let probe = client
            .call_with_status(|channel| async move {
                ts_scheduler(channel)
                    .get_model_info(ts::GetModelInfoRequest {})
                    .await
            })
            .await;
        match probe {
            Ok(_) => return Ok(client),
            Err((status, _)) if status.code() == Code::Unimplemented => {}
            Err((_, err)) => return Err(err),
        }
        let client = Self {
            runtime: Runtime::Sglang,
            ..client
        };
        let probe = client
            .call_with_status(|channel| async move {
                sg_scheduler(channel)
                    .get_model_info(sg::GetModelInfoRequest {})
                    .await
            })
            .await;
        match probe {
            Ok(_) => Ok(client),
            Err((status, _)) if status.code() == Code::Unimplemented => Err(Error::new(
                ErrorCode::WorkerError,
                format!(
                    "worker {url} speaks neither TokenSpeed nor SGLang: both GetModelInfo \
                     probes answered UNIMPLEMENTED"
                ),
            )
            .with_worker(url)),
            Err((_, err)) => Err(err),
        }
    }

    pub fn runtime(&self) -> Runtime {
        self.runtime
    }

    /// The worker's URL as given to [`EngineClient::new`] or
    /// [`EngineClient::detect`].
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Makes one call on a pooled connection, sending it again on a fresh
    /// connection when the worker refused it unseen ([`Failure::Refused`]).
    /// Returns the answer and the lease, which counts the call's stream
    /// until dropped.
    async fn call_leased<T, F, Fut>(&self, rpc: F) -> Result<(T, Lease)>
    where
        F: Fn(Channel) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.call_with_status(rpc).await.map_err(|(_, err)| err)
    }

    /// [`EngineClient::call_leased`], keeping the worker's status of a
    /// failed call beside its error.
    async fn call_with_status<T, F, Fut>(
        &self,
        rpc: F,
    ) -> std::result::Result<(T, Lease), (Status, Error)>
    where
        F: Fn(Channel) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let mut resent = 0;
        loop {
            let lease = self.pool.lease();
            let status = match rpc(lease.channel()).await {
                Ok(response) => return Ok((response.into_inner(), lease)),
                Err(status) => status,
            };
            let failure = classify(&status);
            if matches!(failure, Failure::Refused | Failure::Unsent) {
                self.pool.retire(&lease);
                if failure == Failure::Refused && resent < MAX_RESENDS {
                    resent += 1;
                    crate::metrics::record_resend(&self.url);
                    tracing::debug!(worker = %self.url, %status, resent, "resending a call the worker never saw");
                    continue;
                }
            }
            let err = self.failure(&status, failure, &lease);
            return Err((status, err));
        }
    }

    /// [`EngineClient::call_leased`] for a call that ends with its answer.
    async fn call<T, F, Fut>(&self, rpc: F) -> Result<T>
    where
        F: Fn(Channel) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.call_leased(rpc).await.map(|(answer, _)| answer)
    }

    /// The error for a failed call made under `lease`. A message over the
    /// call's decoding limit is the worker's protocol violation, not its
    /// refusal of the request (as tonic's OUT_OF_RANGE would otherwise
    /// read).
    fn failure(&self, status: &Status, failure: Failure, lease: &Lease) -> Error {
        if over_decode_limit(status) {
            return self.violation(&Violation {
                kind: ProtocolViolation::MessageSize,
                detail: format!(
                    "it sent a message larger than any answer to the request can need ({})",
                    status.message()
                ),
            });
        }
        let reach = match failure {
            Failure::Answered => Reach::Worker,
            Failure::Refused | Failure::Unsent => Reach::Unsent,
            Failure::Connection => Reach::Connection {
                first: self.pool.first_failure_since(lease),
            },
            // A connection failure for retries (another worker takes it),
            // the failed connect's death seen again for the breaker.
            Failure::Backoff => Reach::Connection { first: false },
        };
        Error::from_worker_status(status, &self.url).with_reach(reach)
    }

    /// Starts a Generate call. Fails here if the request cannot be expressed
    /// in the worker's protocol or the worker cannot be reached or refuses
    /// the call; later failures arrive in the stream.
    ///
    /// The events are held to what the request asked for
    /// ([`OutputBounds`]): a sequence past its budget is cut there and the
    /// call aborted on the worker, surplus logprob alternatives are dropped,
    /// and what cannot be repaired ends the stream with
    /// `worker_protocol_violation`; each violation is counted against the
    /// worker. A message larger than the request's answer can need
    /// ([`decode_limit`]) is refused by its length prefix, undecoded.
    pub async fn generate(&self, request: GenerateRequest) -> Result<EventStream> {
        let bounds = OutputBounds::for_request(&request);
        let limit = decode_limit::generate_message_bytes(&request);
        let request_id = request.request_id.clone();
        match self.runtime {
            Runtime::TokenSpeed => {
                let request = tokenspeed::generate_request(request)?;
                let (responses, lease) = self
                    .call_leased(|channel| {
                        let request = request.clone();
                        async move {
                            ts_scheduler(channel)
                                .max_decoding_message_size(limit)
                                .generate(request)
                                .await
                        }
                    })
                    .await?;
                Ok(event_stream(
                    responses,
                    self.watch(request_id, bounds),
                    lease,
                    tokenspeed::event,
                ))
            }
            Runtime::Sglang => {
                let request = sglang::generate_request(request)?;
                let (responses, lease) = self
                    .call_leased(|channel| {
                        let request = request.clone();
                        async move {
                            sg_scheduler(channel)
                                .max_decoding_message_size(limit)
                                .generate(request)
                                .await
                        }
                    })
                    .await?;
                Ok(event_stream(
                    responses,
                    self.watch(request_id, bounds),
                    lease,
                    sglang::event,
                ))
            }
        }
    }

    fn watch(&self, request_id: String, bounds: OutputBounds) -> Watch {
        Watch {
            client: self.clone(),
            request_id,
            bounds,
            warned: false,
        }
    }

    /// Sends one media item to a TokenSpeed encode worker, which publishes
    /// its embedding under `room`. `Ok(false)` means the worker refused the
    /// item. The worker has read the tensor when this returns, so a shm
    /// segment may be released then.
    pub async fn encode(&self, request_id: &str, item: &MediaItem, room: i64) -> Result<bool> {
        if self.runtime != Runtime::TokenSpeed {
            return Err(self.unsupported("Encode (EPD encode workers)"));
        }
        let request = tokenspeed::encode_request(request_id, item, room)?;
        let response = self
            .call(|channel| {
                let request = request.clone();
                async move { ts_encoder(channel).encode(request).await }
            })
            .await?;
        Ok(response.accepted)
    }

    /// Asks the worker to stop `request_id`; `Ok(false)` if it did not know
    /// the request (already finished, or never there).
    pub async fn abort(&self, request_id: &str, reason: &str) -> Result<bool> {
        let (request_id, reason) = (request_id.to_owned(), reason.to_owned());
        match self.runtime {
            Runtime::TokenSpeed => self
                .call(|channel| {
                    let request = ts::AbortRequest {
                        request_id: request_id.clone(),
                        reason: reason.clone(),
                    };
                    async move { ts_scheduler(channel).abort(request).await }
                })
                .await
                .map(|response| response.success),
            Runtime::Sglang => self
                .call(|channel| {
                    let request = sg::AbortRequest {
                        request_id: request_id.clone(),
                        reason: reason.clone(),
                    };
                    async move { sg_scheduler(channel).abort(request).await }
                })
                .await
                .map(|response| response.success),
        }
    }

    /// Whether the worker reports itself healthy.
    pub async fn health_check(&self) -> Result<bool> {
        match self.runtime {
            Runtime::TokenSpeed => self
                .call(|channel| async move {
                    ts_scheduler(channel)
                        .health_check(ts::HealthCheckRequest {})
                        .await
                })
                .await
                .map(|response| response.healthy),
            Runtime::Sglang => self
                .call(|channel| async move {
                    sg_scheduler(channel)
                        .health_check(sg::HealthCheckRequest {})
                        .await
                })
                .await
                .map(|response| response.healthy),
        }
    }

    pub async fn model_info(&self) -> Result<ModelInfo> {
        match self.runtime {
            Runtime::TokenSpeed => self
                .call(|channel| async move {
                    ts_scheduler(channel)
                        .get_model_info(ts::GetModelInfoRequest {})
                        .await
                })
                .await
                .map(tokenspeed::model_info),
            Runtime::Sglang => self
                .call(|channel| async move {
                    sg_scheduler(channel)
                        .get_model_info(sg::GetModelInfoRequest {})
                        .await
                })
                .await
                .map(sglang::model_info),
        }
    }

    /// The worker's self-description, with its `/dev/shm` identity when it
    /// advertises one.
    pub async fn server_info(&self) -> Result<ServerInfo> {
        match self.runtime {
            Runtime::TokenSpeed => self
                .call(|channel| async move {
                    ts_scheduler(channel)
                        .get_server_info(ts::GetServerInfoRequest {})
                        .await
                })
                .await
                .map(tokenspeed::server_info),
            Runtime::Sglang => self
                .call(|channel| async move {
                    sg_scheduler(channel)
                        .get_server_info(sg::GetServerInfoRequest {})
                        .await
                })
                .await
                .map(sglang::server_info),
        }
    }

    /// The worker's load, summed over its DP ranks.
    pub async fn loads(&self) -> Result<Load> {
        match self.runtime {
            Runtime::TokenSpeed => self
                .call(|channel| async move {
                    ts_scheduler(channel)
                        .get_loads(tokenspeed::loads_request())
                        .await
                })
                .await
                .map(tokenspeed::load),
            Runtime::Sglang => self
                .call(|channel| async move {
                    sg_scheduler(channel)
                        .get_loads(sglang::loads_request())
                        .await
                })
                .await
                .map(sglang::load),
        }
    }

    /// The worker's tokenizer files as one zip archive, checked against the
    /// sha256 the worker sends on the last chunk; refused (and the download
    /// cancelled) past [`MAX_TOKENIZER_ARCHIVE_BYTES`], and a chunk larger
    /// than that whole archive is refused undecoded.
    pub async fn tokenizer_archive(&self) -> Result<Vec<u8>> {
        let (mut chunks, lease) = match self.runtime {
            Runtime::TokenSpeed => {
                self.call_leased(|channel| async move {
                    ts_scheduler(channel)
                        .max_decoding_message_size(decode_limit::tokenizer_chunk_bytes())
                        .get_tokenizer(common::GetTokenizerRequest {})
                        .await
                })
                .await?
            }
            Runtime::Sglang => {
                self.call_leased(|channel| async move {
                    sg_scheduler(channel)
                        .max_decoding_message_size(decode_limit::tokenizer_chunk_bytes())
                        .get_tokenizer(common::GetTokenizerRequest {})
                        .await
                })
                .await?
            }
        };
        let (mut archive, mut checksum) = (Vec::new(), String::new());
        loop {
            match chunks.message().await {
                Ok(Some(chunk)) => {
                    if archive.len().saturating_add(chunk.data.len()) > MAX_TOKENIZER_ARCHIVE_BYTES
                    {
                        // Dropping `chunks` cancels the download.
                        return Err(self.violation(&Violation {
                            kind: ProtocolViolation::TokenizerArchive,
                            detail: format!(
                                "its tokenizer archive is larger than the \
                                 {MAX_TOKENIZER_ARCHIVE_BYTES} bytes the gateway accepts"
                            ),
                        }));
                    }
                    archive.extend_from_slice(&chunk.data);
                    checksum = chunk.sha256;
                }
                Ok(None) => break,
                Err(status) => {
                    return Err(self.failure(&status, stream_failure(&status), &lease));
                }
            }
        }
        verify_sha256(&archive, &checksum).map_err(|why| self.worker_error(why))?;
        Ok(archive)
    }

    /// Embeds `input_ids` (SGLang's `Embed`; TokenSpeed has no such RPC).
    pub async fn embed(&self, request_id: &str, input_ids: Vec<u32>) -> Result<Embedding> {
        if self.runtime != Runtime::Sglang {
            return Err(self.unsupported("Embed"));
        }
        let response = self
            .call(|channel| {
                let request = sglang::embed_request(request_id, input_ids.clone());
                async move {
                    sg_scheduler(channel)
                        .max_decoding_message_size(decode_limit::embed_message_bytes())
                        .embed(request)
                        .await
                }
            })
            .await?;
        sglang::embedding(response).map_err(|violation| self.violation(&violation))
    }

    fn worker_error(&self, why: String) -> Error {
        Error::new(
            ErrorCode::WorkerError,
            format!("worker {}: {why}", self.url),
        )
        .with_worker(Arc::clone(&self.url))
    }

    /// Counts `violation` against this worker and makes it the error.
    fn violation(&self, violation: &Violation) -> Error {
        crate::metrics::record_protocol_violation(&self.url, violation.kind);
        warn_violation(&self.url, None, violation);
        Error::new(
            ErrorCode::WorkerProtocolViolation,
            format!("worker {}: {}", self.url, violation.detail),
        )
        .with_worker(Arc::clone(&self.url))
    }

    fn unsupported(&self, what: &str) -> Error {
        Error::new(
            ErrorCode::UnsupportedEndpoint,
            format!(
                "worker {} speaks {}, which has no {what} RPC",
                self.url,
                self.runtime().name()
            ),
        )
    }
}

/// How far a call got that failed after the worker answered its headers:
/// it saw the call, so a transport failure now is the connection's, never
/// "unsent".
fn stream_failure(status: &Status) -> Failure {
    match classify(status) {
        Failure::Refused | Failure::Unsent => Failure::Connection,
        other => other,
    }
}

impl Engine for EngineClient {
    fn url(&self) -> &str {
        EngineClient::url(self)
    }

    fn runtime(&self) -> Runtime {
        EngineClient::runtime(self)
    }

    fn generate(&self, request: GenerateRequest) -> BoxFuture<'_, Result<EventStream>> {
        Box::pin(EngineClient::generate(self, request))
    }

    fn encode<'a>(
        &'a self,
        request_id: &'a str,
        item: &'a MediaItem,
        room: i64,
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(EngineClient::encode(self, request_id, item, room))
    }

    fn abort<'a>(&'a self, request_id: &'a str, reason: &'a str) -> BoxFuture<'a, Result<bool>> {
        Box::pin(EngineClient::abort(self, request_id, reason))
    }

    fn embed<'a>(
        &'a self,
        request_id: &'a str,
        input_ids: Vec<u32>,
    ) -> BoxFuture<'a, Result<Embedding>> {
        Box::pin(EngineClient::embed(self, request_id, input_ids))
    }

    fn health_check(&self) -> BoxFuture<'_, Result<bool>> {
        Box::pin(EngineClient::health_check(self))
    }

    fn model_info(&self) -> BoxFuture<'_, Result<ModelInfo>> {
        Box::pin(EngineClient::model_info(self))
    }

    fn server_info(&self) -> BoxFuture<'_, Result<ServerInfo>> {
        Box::pin(EngineClient::server_info(self))
    }

    fn loads(&self) -> BoxFuture<'_, Result<Load>> {
        Box::pin(EngineClient::loads(self))
    }

    fn tokenizer_archive(&self) -> BoxFuture<'_, Result<Vec<u8>>> {
        Box::pin(EngineClient::tokenizer_archive(self))
    }
}

/// Checks a worker URL without dialling it: `grpc://host:port`,
/// `grpcs://host:port` or `host:port`. An `http://` URL (an SMG launch
/// script's HTTP worker) is refused saying that smg speaks gRPC, rather
/// than failing later as an HTTP/2 protocol error against an HTTP server.
pub fn check_worker_url(url: &str) -> Result<()> {
    dial_uri(url).map(|_| ())
}

/// The URI tonic dials for a worker URL, and whether it is over TLS:
/// `http://host:port` for `grpc://host:port` or `host:port`;
/// `https://host:port` for `grpcs://host:port`.
pub(super) fn dial_uri(url: &str) -> Result<(String, bool)> {
    let invalid = |why: &str| {
        Error::invalid_parameter(
            "url",
            format!(
                "worker URL {:?} {why}; expected grpc://host:port, grpcs://host:port or host:port",
                excerpt(url)
            ),
        )
    };
    let (authority, secure) = match url.split_once("://") {
        None => (url, false),
        Some(("grpc", rest)) => (rest.strip_suffix('/').unwrap_or(rest), false),
        Some(("grpcs", rest)) => (rest.strip_suffix('/').unwrap_or(rest), true),
        Some((scheme @ ("http" | "https"), _)) => {
            let instead = if scheme == "https" { "grpcs" } else { "grpc" };
            return Err(Error::invalid_parameter(
                "url",
                format!(
                    "worker URL {:?}: smg speaks gRPC to workers, not {scheme}; give the \
                     worker's gRPC address as {instead}://host:port",
                    excerpt(url)
                ),
            ));
        }
        Some((scheme, _)) => {
            return Err(invalid(&format!(
                "has unsupported scheme {:?}",
                excerpt(scheme)
            )));
        }
    };
    let authority: http::uri::Authority = authority
        .parse()
        .map_err(|_| invalid("is not a host:port"))?;
    if authority.port_u16().is_none() {
        return Err(invalid("has no port"));
    }
    let scheme = if secure { "https" } else { "http" };
    Ok((format!("{scheme}://{authority}"), secure))
}

/// Checks an archive against the lowercase (or uppercase) hex sha256 the
/// worker sent with it.
fn verify_sha256(archive: &[u8], expected_hex: &str) -> Result<(), String> {
    if expected_hex.is_empty() {
        return Err("the tokenizer archive's last chunk carries no sha256".to_owned());
    }
    let actual = Sha256::digest(archive)
        .iter()
        .fold(String::with_capacity(64), |mut hex, byte| {
            let _ = write!(hex, "{byte:02x}");
            hex
        });
    if actual.eq_ignore_ascii_case(expected_hex) {
        Ok(())
    } else {
        Err(format!(
            "the tokenizer archive ({} bytes) has sha256 {actual}, but the worker sent {expected_hex}",
            archive.len()
        ))
    }
}

/// Which sequences a Generate stream has started and finished, to tell a
/// finished stream from one the worker cut short.
#[derive(Debug, Default)]
struct Progress {
    completed_any: bool,
    unfinished: BTreeSet<u32>,
}

impl Progress {
    fn record(&mut self, event: &GenerateEvent) {
        match event {
            GenerateEvent::Chunk { index, .. } => {
                self.unfinished.insert(*index);
            }
            GenerateEvent::Complete { index, .. } => {
                self.completed_any = true;
                self.unfinished.remove(index);
            }
        }
    }

    /// The error for a stream that ended now, if it ended too early: before
    /// any completion, or with a started sequence never completed.
    fn interruption(&self, worker: &str) -> Option<Error> {
        let why = if !self.completed_any {
            "before any sequence completed".to_owned()
        } else if let Some(index) = self.unfinished.first() {
            format!("before sequence {index} completed")
        } else {
            return None;
        };
        Some(
            Error::new(
                ErrorCode::StreamInterrupted,
                format!("worker {worker}: the Generate stream ended {why}"),
            )
            .with_worker(worker),
        )
    }
}

/// What holds one Generate call's events to its request: the bounds, and
/// the client and id to abort the call with when the gateway cuts it.
struct Watch {
    client: EngineClient,
    request_id: String,
    bounds: OutputBounds,
    /// Whether a repaired violation was logged already (at most one line
    /// per call, however many messages repeat it, and at most one per
    /// worker per [`VIOLATION_LOG_INTERVAL`]; the metric counts every one).
    warned: bool,
}

impl Watch {
    fn worker(&self) -> &Arc<str> {
        &self.client.url
    }

    /// Checks `event`: what to pass on, or the error that ends the stream.
    fn admit(&mut self, event: GenerateEvent) -> Result<Admitted> {
        match self.bounds.admit(event) {
            Ok(admitted) => {
                if let Some(violation) = &admitted.repaired {
                    crate::metrics::record_protocol_violation(self.worker(), violation.kind);
                    if !std::mem::replace(&mut self.warned, true) {
                        warn_violation(self.worker(), Some(&self.request_id), violation);
                    }
                }
                Ok(admitted)
            }
            Err(violation) => Err(self.client.violation(&violation)),
        }
    }

    /// The gateway cut every sequence still open: tells the worker to stop
    /// the call (dropping the stream cancels it too, but an engine that
    /// ignores cancellation hears an Abort).
    fn abort_on_worker(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (client, request_id) = (self.client.clone(), self.request_id.clone());
        runtime.spawn(async move {
            let reason = "the worker went past the tokens the request asked for";
            if let Err(err) = client.abort(&request_id, reason).await {
                tracing::debug!(%err, %request_id, worker = client.url(), "abort failed");
            }
        });
    }
}

/// The state of a Generate stream being read.
struct Reading<M> {
    responses: Streaming<M>,
    watch: Watch,
    /// Counts the stream on its connection until the stream is dropped.
    lease: Lease,
    to_event: fn(M) -> Option<GenerateEvent>,
    progress: Progress,
    /// A completion the gateway made for a cut sequence, passed on next.
    pending: Option<GenerateEvent>,
}

/// What reading the stream gave: an event to pass on, the end, or an
/// error (after which the stream ends).
enum Step {
    Event(GenerateEvent),
    End,
    Failed(Error),
}

impl<M> Reading<M> {
    async fn step(&mut self) -> Step {
        if let Some(event) = self.pending.take() {
            self.progress.record(&event);
            return Step::Event(event);
        }
        if self.watch.bounds.cut_any() && self.watch.bounds.all_done() {
            // Every sequence has its end; what the worker still sends is
            // past what was asked.
            self.watch.abort_on_worker();
            return Step::End;
        }
        loop {
            let message = match self.responses.message().await {
                Ok(Some(message)) => message,
                Ok(None) => {
                    return match self.progress.interruption(self.watch.worker()) {
                        Some(error) => Step::Failed(error),
                        None => Step::End,
                    };
                }
                Err(status) => {
                    let failure = stream_failure(&status);
                    return Step::Failed(self.watch.client.failure(&status, failure, &self.lease));
                }
            };
            let Some(event) = (self.to_event)(message) else {
                let violation = Violation {
                    kind: ProtocolViolation::EmptyMessage,
                    detail: "a Generate message carried neither a chunk nor a completion"
                        .to_owned(),
                };
                return Step::Failed(self.watch.client.violation(&violation));
            };
            let admitted = match self.watch.admit(event) {
                Ok(admitted) => admitted,
                Err(error) => return Step::Failed(error),
            };
            self.pending = admitted.cut;
            if let Some(event) = admitted.event {
                self.progress.record(&event);
                return Step::Event(event);
            }
            if let Some(event) = self.pending.take() {
                self.progress.record(&event);
                return Step::Event(event);
            }
            // Dropped: read on.
        }
    }
}

/// Converts a protocol's Generate responses into events held to the
/// request's bounds; the first failure is the last item.
fn event_stream<M: Send + 'static>(
    responses: Streaming<M>,
    watch: Watch,
    lease: Lease,
    to_event: fn(M) -> Option<GenerateEvent>,
) -> EventStream {
    let reading = Reading {
        responses,
        watch,
        lease,
        to_event,
        progress: Progress::default(),
        pending: None,
    };
    Box::pin(futures::stream::unfold(
        Some(reading),
        |reading| async move {
            let mut reading = reading?;
            match reading.step().await {
                Step::Event(event) => Some((Ok(event), Some(reading))),
                Step::End => None,
                Step::Failed(error) => Some((Err(error), None)),
            }
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_urls_dial_plain_http_and_grpcs_dials_tls() {
        let cases = [
            (
                "grpc://10.0.0.1:50051",
                Some(("http://10.0.0.1:50051", false)),
            ),
            (
                "grpc://worker-3:50051/",
                Some(("http://worker-3:50051", false)),
            ),
            ("http://10.0.0.1:50051", None),
            ("127.0.0.1:9", Some(("http://127.0.0.1:9", false))),
            ("[::1]:50051", Some(("http://[::1]:50051", false))),
            (
                "grpcs://worker-3:50051",
                Some(("https://worker-3:50051", true)),
            ),
            ("https://10.0.0.1:50051/", None),
            ("grpcs://worker-3", None),
            ("ftp://10.0.0.1:50051", None),
            ("10.0.0.1", None),
            ("grpc://10.0.0.1:50051/path", None),
            ("", None),
        ];
        for (url, expected) in cases {
            match (dial_uri(url), expected) {
                (Ok((uri, secure)), Some((expected, tls))) => {
                    assert_eq!((uri.as_str(), secure), (expected, tls), "{url}");
                }
                (Err(err), None) => {
                    assert_eq!(err.code, ErrorCode::InvalidParameter, "{url}");
                    assert_eq!(err.param.as_deref(), Some("url"));
                }
                (got, expected) => panic!("{url}: got {got:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn a_client_needs_a_runtime_to_drive_its_channel() {
        let err = EngineClient::new("127.0.0.1:1", Runtime::TokenSpeed).expect_err("no runtime");
        assert_eq!(err.code, ErrorCode::InternalError);
        assert!(err.message.contains("tokio runtime"), "{err}");
    }

    #[tokio::test]
    async fn new_does_no_io_and_keeps_the_given_url() {
        // Nothing listens on port 1: a client is still made, lazily.
        let client = EngineClient::new("grpc://127.0.0.1:1", Runtime::Sglang).expect("lazy");
        assert_eq!(client.url(), "grpc://127.0.0.1:1");
        assert_eq!(client.runtime(), Runtime::Sglang);
        let clone = client.clone();
        assert_eq!(clone.runtime(), Runtime::Sglang);
    }

    #[test]
    fn statuses_are_classified_by_the_transport_errors_under_them() {
        // A status the worker sent carries no source: it saw the call.
        assert_eq!(classify(&Status::internal("scripted")), Failure::Answered);
        // A refused stream was never processed (RFC 9113 §8.7).
        let refused = Status::from_error(Box::new(h2::Error::from(h2::Reason::REFUSED_STREAM)));
        assert_eq!(classify(&refused), Failure::Refused);
        // Any other transport failure broke the connection under the call.
        let reset = Status::from_error(Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "reset by peer",
        )));
        assert_eq!(classify(&reset), Failure::Connection);
        let internal = Status::from_error(Box::new(h2::Error::from(h2::Reason::INTERNAL_ERROR)));
        assert_eq!(classify(&internal), Failure::Connection);
        // Once the worker answered, nothing is "unsent" any more.
        assert_eq!(stream_failure(&refused), Failure::Connection);
    }

    #[tokio::test]
    async fn calls_refused_during_the_reconnect_backoff_do_not_count_against_the_worker() {
        // Nothing listens on the port: the first call's connect is refused
        // and counts; the backoff (long enough to outlast the test) then
        // fails the next calls at once, and they do not count again.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let url = format!("grpc://127.0.0.1:{port}");
        let connections = ConnectionConfig {
            backoff: std::time::Duration::from_secs(3600),
            max_backoff: std::time::Duration::from_secs(3600),
            ..ConnectionConfig::default()
        };
        let client = EngineClient::with_connections(
            &url,
            Runtime::TokenSpeed,
            connections,
            &WorkerTls::default(),
        )
        .expect("lazy");
        let refused = client.loads().await.expect_err("nothing listens");
        assert!(
            refused.charges(&url),
            "the refused connect counts: {refused}"
        );
        for _ in 0..3 {
            let again = client.loads().await.expect_err("in backoff");
            assert!(!again.charges(&url), "the same failure again: {again}");
            assert!(again.retryable(), "another worker may take it: {again}");
        }
    }

    /// tonic's refusal of an oversized message, made by tonic's own
    /// decoder reading a length prefix, is told from any status a worker
    /// sends (a worker's OUT_OF_RANGE is its refusal of the request).
    #[tokio::test]
    async fn decode_limit_refusals_are_told_from_worker_statuses() {
        use tonic::codec::Codec as _;
        let limit = 4096;
        let read_one = |length: u32| {
            // A 5-byte gRPC message prefix (not compressed, `length`
            // bytes), then fewer bytes than it announces.
            let mut body = vec![0u8];
            body.extend_from_slice(&length.to_be_bytes());
            body.extend_from_slice(&[0; 16]);
            let decoder =
                tonic_prost::ProstCodec::<ts::GenerateRequest, ts::GenerateResponse>::default()
                    .decoder();
            let mut streaming = Streaming::new_response(
                decoder,
                http_body_util::Full::new(bytes::Bytes::from(body)),
                http::StatusCode::OK,
                None,
                Some(limit),
            );
            async move { streaming.message().await }
        };
        let refused = read_one(limit as u32 + 1)
            .await
            .expect_err("over the limit");
        assert!(over_decode_limit(&refused), "{refused:?}");
        // At the limit the decoder waits for the body, which ends short.
        let short = read_one(limit as u32).await.expect_err("a truncated body");
        assert!(!over_decode_limit(&short), "{short:?}");
        for status in [
            Status::out_of_range("the prompt is longer than the context"),
            Status::internal("Error, decoded message length too large"),
            Status::resource_exhausted("busy"),
        ] {
            assert!(!over_decode_limit(&status), "{status:?}");
        }
    }

    #[test]
    fn archives_must_match_their_checksum() {
        // sha256("abc"), a published test vector.
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        let cases = [
            (b"abc".as_slice(), abc.to_owned(), true),
            (b"abc".as_slice(), abc.to_ascii_uppercase(), true),
            (b"abd".as_slice(), abc.to_owned(), false),
            (b"abc".as_slice(), String::new(), false),
        ];
        for (archive, checksum, ok) in cases {
            assert_eq!(
                verify_sha256(archive, &checksum).is_ok(),
                ok,
                "{checksum:?}"
            );
        }
    }

    fn chunk(index: u32) -> GenerateEvent {
        GenerateEvent::Chunk {
            index,
            token_ids: vec![1],
            prompt_tokens: 1,
            completion_tokens: 1,
            cached_tokens: 0,
            logprobs: None,
        }
    }

    fn complete(index: u32) -> GenerateEvent {
        GenerateEvent::Complete {
            index,
            output_ids: vec![1],
            finish_reason: "length".to_owned(),
            matched_stop: None,
            prompt_tokens: 1,
            completion_tokens: 1,
            cached_tokens: 0,
            logprobs: None,
        }
    }

    #[test]
    fn streams_that_end_early_are_interruptions() {
        let cases: [(&str, Vec<GenerateEvent>, bool); 5] = [
            ("nothing", vec![], true),
            ("chunks only", vec![chunk(0), chunk(0)], true),
            ("complete", vec![chunk(0), complete(0)], false),
            ("unary", vec![complete(0)], false),
            (
                "one of two open",
                vec![chunk(0), chunk(1), complete(0)],
                true,
            ),
        ];
        for (name, events, interrupted) in cases {
            let mut progress = Progress::default();
            events.iter().for_each(|event| progress.record(event));
            let error = progress.interruption("w");
            assert_eq!(error.is_some(), interrupted, "{name}");
            if let Some(error) = error {
                assert_eq!(error.code, ErrorCode::StreamInterrupted, "{name}");
            }
        }
    }
}
