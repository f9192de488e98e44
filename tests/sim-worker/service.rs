//! What the TokenSpeed and SGLang services share: the worker's identity, the
//! event-stream adapter, media reading and small proto helpers.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::engine::{Event, EventStream, Rendezvous, SharedEngine};
use crate::proto::common;
use crate::tensor::{Payload, ReceivedTensor, RecordContext, Recorder, read_tensor};

/// A boxed server-streaming response.
pub type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Everything an RPC handler needs.
#[derive(Debug, Clone)]
pub struct Worker {
    pub engine: SharedEngine,
    /// Requests running per data-parallel rank (`--dp-size`; one rank by
    /// default), as GetLoads reports them per rank.
    pub dp_running: Arc<Vec<std::sync::atomic::AtomicI32>>,
    pub recorder: Option<Arc<Recorder>>,
    pub shm_namespace_id: String,
    pub port: u16,
    pub bootstrap_port: Option<u16>,
    pub protocol: &'static str,
}

impl Worker {
    /// Counts a request on data-parallel `rank` until the guard drops;
    /// refuses a rank the worker does not have.
    pub fn enter_rank(&self, rank: i32) -> Result<RankGuard, Status> {
        let slot = usize::try_from(rank)
            .ok()
            .filter(|&r| r < self.dp_running.len())
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "data_parallel_rank {rank} is out of range (dp size {})",
                    self.dp_running.len()
                ))
            })?;
        self.dp_running[slot].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(RankGuard {
            counters: Arc::clone(&self.dp_running),
            slot,
        })
    }

    /// The worker's launch arguments, as `GetServerInfo.server_args`.
    pub fn server_args(&self) -> prost_types::Struct {
        let model = &self.engine.model;
        let config = &self.engine.config;
        json_struct(serde_json::json!({
            "model_path": model.model_path.display().to_string(),
            "tokenizer_path": model.model_path.display().to_string(),
            "served_model_name": model.served_model_name,
            "protocol": self.protocol,
            "port": self.port,
            "disaggregation_mode": disaggregation_mode(self),
            "disaggregation_bootstrap_port": self.bootstrap_port,
            "max_running_requests": config.max_running_requests,
            "max_total_tokens": config.max_total_tokens,
            "context_length": model.max_context_length,
        }))
    }

    /// The scheduler facts, as `GetServerInfo.scheduler_info`; carries the
    /// `/dev/shm` identity the gateway compares for the shm lane.
    pub fn scheduler_info(&self) -> prost_types::Struct {
        json_struct(serde_json::json!({
            "shm_namespace_id": self.shm_namespace_id,
            "disaggregation_mode": disaggregation_mode(self),
            "bootstrap_port": self.bootstrap_port,
            "max_total_num_tokens": self.engine.config.max_total_tokens,
            "max_running_requests": self.engine.config.max_running_requests,
            "simulated": true,
        }))
    }

    /// Reads one tensor, recording it when asked to.
    pub fn read(
        &self,
        dtype: &str,
        shape: &[u32],
        payload: Payload<'_>,
        context: RecordContext<'_>,
    ) -> Result<ReceivedTensor, Status> {
        let tensor = read_tensor(dtype, shape, payload, self.engine.config.intake)?;
        if let Some(recorder) = &self.recorder {
            recorder.record(context, &tensor);
        }
        Ok(tensor)
    }

    /// The tokenizer archive, chunked, with its sha256 on the last chunk.
    pub fn tokenizer_chunks(&self) -> ResponseStream<common::GetTokenizerChunk> {
        let hostile = &self.engine.config.hostile;
        let chunk = hostile
            .archive_chunk_bytes
            .map_or(64 * 1024, |n| usize::try_from(n).unwrap_or(usize::MAX))
            .max(1);
        if let Some(bytes) = hostile.archive_bytes {
            return zero_archive(bytes, chunk);
        }
        let (zip, sha) = &self.engine.model.tokenizer_zip;
        let pieces: Vec<&[u8]> = zip.chunks(chunk).collect();
        let last = pieces.len().saturating_sub(1);
        let chunks: Vec<Result<common::GetTokenizerChunk, Status>> = pieces
            .into_iter()
            .enumerate()
            .map(|(i, data)| {
                Ok(common::GetTokenizerChunk {
                    data: bytes::Bytes::copy_from_slice(data),
                    sha256: if i == last {
                        sha.clone()
                    } else {
                        String::new()
                    },
                })
            })
            .collect();
        Box::pin(tokio_stream::iter(chunks))
    }

    pub fn health(&self) -> (bool, String) {
        let faults = &self.engine.config.faults;
        let flagged = faults
            .unhealthy_while_exists
            .as_ref()
            .is_some_and(|path| path.exists());
        if faults.unhealthy || flagged {
            (false, "unhealthy (fault injection)".to_owned())
        } else {
            let ready = format!("{} worker ready", self.engine.role().name());
            (true, self.engine.config.hostile.padded(ready))
        }
    }
}

/// Hostile: `total` zero bytes as an "archive" in `chunk`-byte pieces, made
/// as they are sent (the worker holds one piece, whatever `total`), with
/// the sha256 of all of it on the last piece.
fn zero_archive(total: u64, chunk: usize) -> ResponseStream<common::GetTokenizerChunk> {
    use sha2::Digest as _;
    let piece = bytes::Bytes::from(vec![0u8; chunk]);
    let state = (0u64, sha2::Sha256::new());
    Box::pin(futures::stream::unfold(Some(state), move |state| {
        let piece = piece.clone();
        async move {
            let (sent, mut hasher) = state?;
            let len = usize::try_from((total - sent).min(chunk as u64)).unwrap_or(chunk);
            let data = piece.slice(..len);
            hasher.update(&data);
            let sent = sent + len as u64;
            if sent < total {
                let message = common::GetTokenizerChunk {
                    data,
                    sha256: String::new(),
                };
                return Some((Ok(message), Some((sent, hasher))));
            }
            let sha256 = hasher
                .finalize()
                .iter()
                .map(|byte| format!("{byte:02x}"))
                .collect();
            Some((Ok(common::GetTokenizerChunk { data, sha256 }), None))
        }
    }))
}

fn disaggregation_mode(worker: &Worker) -> &'static str {
    match worker.engine.role() {
        crate::engine::Role::Regular => "null",
        role => role.name(),
    }
}

/// Maps the engine's events to a protocol's response messages.
pub fn event_stream<T: Send + 'static>(
    events: EventStream,
    to_message: impl Fn(Event) -> T + Send + 'static,
) -> ResponseStream<T> {
    Box::pin(ReceiverStream::new(events).map(move |event| event.map(&to_message)))
}

/// A rendezvous peer from a protocol's (host, port, room).
pub fn rendezvous(host: &str, port: i32, room: i64, what: &str) -> Result<Rendezvous, Status> {
    let port = u16::try_from(port)
        .ok()
        .filter(|&port| port != 0)
        .ok_or_else(|| {
            Status::invalid_argument(format!("{what}: bootstrap port {port} is invalid"))
        })?;
    if host.is_empty() {
        return Err(Status::invalid_argument(format!(
            "{what}: bootstrap host is empty"
        )));
    }
    if room < 0 {
        return Err(Status::invalid_argument(format!(
            "{what}: bootstrap room {room} is negative"
        )));
    }
    Ok(Rendezvous {
        host: host.to_owned(),
        port,
        room,
    })
}

/// Engines run without a tokenizer: string stops are the gateway's job.
pub fn reject_string_stops(stop: &[String]) -> Result<(), Status> {
    if stop.is_empty() {
        Ok(())
    } else {
        Err(Status::invalid_argument(
            "string stop sequences are not accepted: send stop_token_ids and trim stop strings in the gateway",
        ))
    }
}

/// Converts JSON to a protobuf `Struct`.
pub fn json_struct(value: serde_json::Value) -> prost_types::Struct {
    match json_value(value).kind {
        Some(prost_types::value::Kind::StructValue(s)) => s,
        _ => prost_types::Struct::default(),
    }
}

fn json_value(value: serde_json::Value) -> prost_types::Value {
    use prost_types::value::Kind;
    let kind = match value {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        serde_json::Value::String(s) => Kind::StringValue(s),
        serde_json::Value::Array(items) => Kind::ListValue(prost_types::ListValue {
            values: items.into_iter().map(json_value).collect(),
        }),
        serde_json::Value::Object(map) => Kind::StructValue(prost_types::Struct {
            fields: map.into_iter().map(|(k, v)| (k, json_value(v))).collect(),
        }),
    };
    prost_types::Value { kind: Some(kind) }
}

/// The current time as a protobuf timestamp.
pub fn timestamp(time: std::time::SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(time)
}

/// The current UTC time in RFC 3339, as GetLoads reports it.
pub fn now_rfc3339() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs() as i64;
    let (days, day_secs) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (proleptic Gregorian calendar).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        day_secs / 3600,
        day_secs % 3600 / 60,
        day_secs % 60,
        now.subsec_millis()
    )
}

/// Runs blocking tensor reads (file I/O, large copies) off the reactor.
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| Status::internal(format!("tensor reader failed: {err}")))?
}

/// One request's count on its data-parallel rank; released on drop.
#[derive(Debug)]
pub struct RankGuard {
    counters: Arc<Vec<std::sync::atomic::AtomicI32>>,
    slot: usize,
}

impl Drop for RankGuard {
    fn drop(&mut self) {
        self.counters[self.slot].fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}
