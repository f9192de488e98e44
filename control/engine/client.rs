//! [`EngineClient`]: one gRPC client for TokenSpeed and SGLang workers.
//!
//! Pipeline stages hold one `EngineClient` per worker and never learn which
//! protocol it speaks: this module picks the generated stub, converts
//! requests and replies with `convert`, and turns every gRPC status and
//! transport failure into the control plane's [`Error`], naming the worker.
//! It is also where the worker's answers are first trusted, so it holds them
//! to what was asked (`bounds`: tokens per sequence, logprob alternatives,
//! sequence indices) and caps what it downloads (the tokenizer archive).
//! Channels connect lazily and reconnect by themselves, so creating a client
//! does no I/O and a restarted worker needs no new client. `grpcs://`
//! workers are dialled over TLS as [`WorkerTls`] says (with a client
//! certificate for workers that ask for one).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use futures::future::BoxFuture;
use sha2::{Digest as _, Sha256};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status, Streaming};

use super::bounds::{Admitted, OutputBounds, Violation};
use super::convert::{sglang, tokenspeed};
use super::tls::WorkerTls;
use super::{
    Embedding, Engine, GenerateEvent, GenerateRequest, Load, MediaItem, ModelInfo, Runtime,
    ServerInfo,
};
use crate::error::{Error, ErrorCode, Result};
use crate::metrics::ProtocolViolation;
use crate::proto::sglang_scheduler::sglang_scheduler_client::SglangSchedulerClient;
use crate::proto::tokenspeed_encoder::token_speed_encoder_client::TokenSpeedEncoderClient;
use crate::proto::tokenspeed_scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
use crate::proto::{self, common, sglang_scheduler as sg, tokenspeed_scheduler as ts};

/// How long establishing a connection to a worker may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP/2 ping interval, also while idle: engines tolerate it (wire.md) and
/// it finds dead connections before a request does.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);

/// The largest tokenizer archive the gateway downloads from a worker. Real
/// ones (a `tokenizer.json` of at most tens of MiB, compressed, and a few
/// small JSON files) stay far below; the cap stops a worker from streaming
/// an archive of any size into the gateway's memory.
pub const MAX_TOKENIZER_ARCHIVE_BYTES: usize = 128 * 1024 * 1024;

/// The events of one Generate call. A gRPC status mid-stream, or a stream
/// that ends before its sequences complete, arrives as one `Err` item, after
/// which the stream ends. Dropping the stream cancels the call on the worker.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<GenerateEvent>> + Send + 'static>>;

/// A gRPC client of one engine worker. Cloning is cheap: clones share the
/// connection.
#[derive(Debug, Clone)]
pub struct EngineClient {
    url: Arc<str>,
    stubs: Stubs,
}

/// The generated stubs of the worker's protocol, all on one channel.
#[derive(Debug, Clone)]
enum Stubs {
    TokenSpeed {
        scheduler: TokenSpeedSchedulerClient<Channel>,
        encoder: TokenSpeedEncoderClient<Channel>,
    },
    Sglang {
        scheduler: SglangSchedulerClient<Channel>,
    },
}

impl EngineClient {
    /// A client of the worker at `url` (`grpc://host:port`, `http://host:port`
    /// or `host:port`; `grpcs://host:port` over TLS with the public roots)
    /// speaking `runtime`. Does no I/O: the channel connects on first use.
    /// Must be called inside a tokio runtime.
    pub fn new(url: &str, runtime: Runtime) -> Result<Self> {
        Self::new_with_tls(url, runtime, &WorkerTls::default())
    }

    /// As [`EngineClient::new`], dialling `grpcs://` URLs as `tls` says.
    pub fn new_with_tls(url: &str, runtime: Runtime, tls: &WorkerTls) -> Result<Self> {
        Ok(Self::on_channel(url, runtime, lazy_channel(url, tls)?))
    }

    /// Connects to the worker at `url` and finds out which protocol it
    /// speaks: TokenSpeed's `GetModelInfo` first, SGLang's when the worker
    /// answers UNIMPLEMENTED.
    pub async fn detect(url: &str) -> Result<Self> {
        Self::detect_with_tls(url, &WorkerTls::default()).await
    }

    /// As [`EngineClient::detect`], dialling `grpcs://` URLs as `tls` says.
    pub async fn detect_with_tls(url: &str, tls: &WorkerTls) -> Result<Self> {
        let channel = lazy_channel(url, tls)?;
        let probe = TokenSpeedSchedulerClient::new(channel.clone())
            .get_model_info(ts::GetModelInfoRequest {})
            .await;
        match probe {
            Ok(_) => return Ok(Self::on_channel(url, Runtime::TokenSpeed, channel)),
            Err(status) if status.code() == Code::Unimplemented => {}
            Err(status) => return Err(Error::from_worker_status(&status, url)),
        }
        let probe = SglangSchedulerClient::new(channel.clone())
            .get_model_info(sg::GetModelInfoRequest {})
            .await;
        match probe {
            Ok(_) => Ok(Self::on_channel(url, Runtime::Sglang, channel)),
            Err(status) if status.code() == Code::Unimplemented => Err(Error::new(
                ErrorCode::WorkerError,
                format!(
                    "worker {url} speaks neither TokenSpeed nor SGLang: both GetModelInfo \
                     probes answered UNIMPLEMENTED"
                ),
            )
            .with_worker(url)),
            Err(status) => Err(Error::from_worker_status(&status, url)),
        }
    }

    fn on_channel(url: &str, runtime: Runtime, channel: Channel) -> Self {
        let limit = proto::MAX_MESSAGE_BYTES;
        let stubs = match runtime {
            Runtime::TokenSpeed => Stubs::TokenSpeed {
                scheduler: TokenSpeedSchedulerClient::new(channel.clone())
                    .max_decoding_message_size(limit)
                    .max_encoding_message_size(limit),
                encoder: TokenSpeedEncoderClient::new(channel)
                    .max_decoding_message_size(limit)
                    .max_encoding_message_size(limit),
            },
            Runtime::Sglang => Stubs::Sglang {
                scheduler: SglangSchedulerClient::new(channel)
                    .max_decoding_message_size(limit)
                    .max_encoding_message_size(limit),
            },
        };
        Self {
            url: Arc::from(url),
            stubs,
        }
    }

    pub fn runtime(&self) -> Runtime {
        match self.stubs {
            Stubs::TokenSpeed { .. } => Runtime::TokenSpeed,
            Stubs::Sglang { .. } => Runtime::Sglang,
        }
    }

    /// The worker's URL as given to [`EngineClient::new`] or
    /// [`EngineClient::detect`].
    pub fn url(&self) -> &str {
        &self.url
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
    /// worker.
    pub async fn generate(&self, request: GenerateRequest) -> Result<EventStream> {
        let bounds = OutputBounds::for_request(&request);
        let request_id = request.request_id.clone();
        match &self.stubs {
            Stubs::TokenSpeed { scheduler, .. } => {
                let request = tokenspeed::generate_request(request)?;
                let responses = scheduler
                    .clone()
                    .generate(request)
                    .await
                    .map_err(|status| self.status_error(&status))?;
                Ok(event_stream(
                    responses.into_inner(),
                    self.watch(request_id, bounds),
                    tokenspeed::event,
                ))
            }
            Stubs::Sglang { scheduler } => {
                let request = sglang::generate_request(request)?;
                let responses = scheduler
                    .clone()
                    .generate(request)
                    .await
                    .map_err(|status| self.status_error(&status))?;
                Ok(event_stream(
                    responses.into_inner(),
                    self.watch(request_id, bounds),
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
        let Stubs::TokenSpeed { encoder, .. } = &self.stubs else {
            return Err(self.unsupported("Encode (EPD encode workers)"));
        };
        let request = tokenspeed::encode_request(request_id, item, room)?;
        let response = encoder
            .clone()
            .encode(request)
            .await
            .map_err(|status| self.status_error(&status))?;
        Ok(response.into_inner().accepted)
    }

    /// Asks the worker to stop `request_id`; `Ok(false)` if it did not know
    /// the request (already finished, or never there).
    pub async fn abort(&self, request_id: &str, reason: &str) -> Result<bool> {
        let (request_id, reason) = (request_id.to_owned(), reason.to_owned());
        let answer = match &self.stubs {
            Stubs::TokenSpeed { scheduler, .. } => scheduler
                .clone()
                .abort(ts::AbortRequest { request_id, reason })
                .await
                .map(|response| response.into_inner().success),
            Stubs::Sglang { scheduler } => scheduler
                .clone()
                .abort(sg::AbortRequest { request_id, reason })
                .await
                .map(|response| response.into_inner().success),
        };
        answer.map_err(|status| self.status_error(&status))
    }

    /// Whether the worker reports itself healthy.
    pub async fn health_check(&self) -> Result<bool> {
        let answer = match &self.stubs {
            Stubs::TokenSpeed { scheduler, .. } => scheduler
                .clone()
                .health_check(ts::HealthCheckRequest {})
                .await
                .map(|response| response.into_inner().healthy),
            Stubs::Sglang { scheduler } => scheduler
                .clone()
                .health_check(sg::HealthCheckRequest {})
                .await
                .map(|response| response.into_inner().healthy),
        };
        answer.map_err(|status| self.status_error(&status))
    }

    pub async fn model_info(&self) -> Result<ModelInfo> {
        let answer = match &self.stubs {
            Stubs::TokenSpeed { scheduler, .. } => scheduler
                .clone()
                .get_model_info(ts::GetModelInfoRequest {})
                .await
                .map(|response| tokenspeed::model_info(response.into_inner())),
            Stubs::Sglang { scheduler } => scheduler
                .clone()
                .get_model_info(sg::GetModelInfoRequest {})
                .await
                .map(|response| sglang::model_info(response.into_inner())),
        };
        answer.map_err(|status| self.status_error(&status))
    }

    /// The worker's self-description, with its `/dev/shm` identity when it
    /// advertises one.
    pub async fn server_info(&self) -> Result<ServerInfo> {
        let answer = match &self.stubs {
            Stubs::TokenSpeed { scheduler, .. } => scheduler
                .clone()
                .get_server_info(ts::GetServerInfoRequest {})
                .await
                .map(|response| tokenspeed::server_info(response.into_inner())),
            Stubs::Sglang { scheduler } => scheduler
                .clone()
                .get_server_info(sg::GetServerInfoRequest {})
                .await
                .map(|response| sglang::server_info(response.into_inner())),
        };
        answer.map_err(|status| self.status_error(&status))
    }

    /// The worker's load, summed over its DP ranks.
    pub async fn loads(&self) -> Result<Load> {
        let answer = match &self.stubs {
            Stubs::TokenSpeed { scheduler, .. } => scheduler
                .clone()
                .get_loads(tokenspeed::loads_request())
                .await
                .map(|response| tokenspeed::load(response.into_inner())),
            Stubs::Sglang { scheduler } => scheduler
                .clone()
                .get_loads(sglang::loads_request())
                .await
                .map(|response| sglang::load(response.into_inner())),
        };
        answer.map_err(|status| self.status_error(&status))
    }

    /// The worker's tokenizer files as one zip archive, checked against the
    /// sha256 the worker sends on the last chunk; refused (and the download
    /// cancelled) past [`MAX_TOKENIZER_ARCHIVE_BYTES`].
    pub async fn tokenizer_archive(&self) -> Result<Vec<u8>> {
        let request = common::GetTokenizerRequest {};
        let chunks = match &self.stubs {
            Stubs::TokenSpeed { scheduler, .. } => scheduler.clone().get_tokenizer(request).await,
            Stubs::Sglang { scheduler } => scheduler.clone().get_tokenizer(request).await,
        };
        let mut chunks = chunks
            .map_err(|status| self.status_error(&status))?
            .into_inner();
        let (mut archive, mut checksum) = (Vec::new(), String::new());
        while let Some(chunk) = chunks
            .message()
            .await
            .map_err(|status| self.status_error(&status))?
        {
            if archive.len().saturating_add(chunk.data.len()) > MAX_TOKENIZER_ARCHIVE_BYTES {
                // Dropping `chunks` cancels the download.
                return Err(self.violation(&Violation {
                    kind: ProtocolViolation::TokenizerArchive,
                    detail: format!(
                        "its tokenizer archive is larger than the {MAX_TOKENIZER_ARCHIVE_BYTES} \
                         bytes the gateway accepts"
                    ),
                }));
            }
            archive.extend_from_slice(&chunk.data);
            checksum = chunk.sha256;
        }
        verify_sha256(&archive, &checksum).map_err(|why| self.worker_error(why))?;
        Ok(archive)
    }

    /// Embeds `input_ids` (SGLang's `Embed`; TokenSpeed has no such RPC).
    pub async fn embed(&self, request_id: &str, input_ids: Vec<u32>) -> Result<Embedding> {
        let Stubs::Sglang { scheduler } = &self.stubs else {
            return Err(self.unsupported("Embed"));
        };
        let response = scheduler
            .clone()
            .embed(sglang::embed_request(request_id, input_ids))
            .await
            .map_err(|status| self.status_error(&status))?;
        sglang::embedding(response.into_inner()).map_err(|violation| self.violation(&violation))
    }

    fn status_error(&self, status: &Status) -> Error {
        Error::from_worker_status(status, &self.url)
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
        tracing::warn!(
            worker = %self.url,
            kind = violation.kind.label(),
            "{}",
            violation.detail
        );
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

/// A channel to `url` that connects on first use, with the gateway's
/// transport settings (TLS as `tls` says for `grpcs://`).
fn lazy_channel(url: &str, tls: &WorkerTls) -> Result<Channel> {
    let (uri, secure) = dial_uri(url)?;
    // The channel spawns its connection task on the current runtime.
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(Error::internal(
            "an EngineClient must be created inside a tokio runtime",
        ));
    }
    let invalid = |err: &dyn std::fmt::Display| {
        Error::invalid_parameter("url", format!("worker URL {url:?}: {err}"))
    };
    let mut endpoint = Endpoint::from_shared(uri)
        .map_err(|err| invalid(&err))?
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_while_idle(true)
        .connect_timeout(CONNECT_TIMEOUT);
    if secure {
        endpoint = endpoint
            .tls_config(tls.client_config())
            .map_err(|err| invalid(&err))?;
    }
    Ok(endpoint.connect_lazy())
}

/// The URI tonic dials for a worker URL, and whether it is over TLS:
/// `http://host:port` for `grpc://host:port`, `http://host:port` or
/// `host:port`; `https://host:port` for `grpcs://host:port` or
/// `https://host:port`.
pub(super) fn dial_uri(url: &str) -> Result<(String, bool)> {
    let invalid = |why: &str| {
        Error::invalid_parameter(
            "url",
            format!(
                "worker URL {url:?} {why}; expected grpc://host:port, grpcs://host:port, \
                 http://host:port or host:port"
            ),
        )
    };
    let (authority, secure) = match url.split_once("://") {
        None => (url, false),
        Some(("grpc" | "http", rest)) => (rest.strip_suffix('/').unwrap_or(rest), false),
        Some(("grpcs" | "https", rest)) => (rest.strip_suffix('/').unwrap_or(rest), true),
        Some((scheme, _)) => return Err(invalid(&format!("has unsupported scheme {scheme:?}"))),
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
    /// Whether a repaired violation was logged already (one line per call,
    /// however many messages repeat it; the metric counts every one).
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
                        tracing::warn!(
                            worker = %self.worker(),
                            request_id = %self.request_id,
                            kind = violation.kind.label(),
                            "{}",
                            violation.detail
                        );
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
                    return Step::Failed(Error::from_worker_status(&status, self.watch.worker()));
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
    to_event: fn(M) -> Option<GenerateEvent>,
) -> EventStream {
    let reading = Reading {
        responses,
        watch,
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
                "http://10.0.0.1:50051",
                Some(("http://10.0.0.1:50051", false)),
            ),
            (
                "http://worker-3:50051/",
                Some(("http://worker-3:50051", false)),
            ),
            ("127.0.0.1:9", Some(("http://127.0.0.1:9", false))),
            ("[::1]:50051", Some(("http://[::1]:50051", false))),
            (
                "grpcs://worker-3:50051",
                Some(("https://worker-3:50051", true)),
            ),
            (
                "https://10.0.0.1:50051/",
                Some(("https://10.0.0.1:50051", true)),
            ),
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
