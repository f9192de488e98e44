//! What happened to one request: the raw timestamps captured on the hot path
//! ([`Outcome`], integers only) and the per-request record derived from them
//! after the run ([`RequestRecord`], what `--output-jsonl` writes).
//!
//! All times are measured from the **scheduled** send time: a request that
//! waited for a free concurrency slot or behind a late timer carries that
//! wait in its TTFT and E2E (the wait itself is reported as `schedule_lag`).
//! With `--request-rate inf` there is no schedule, and the scheduled time is
//! the moment the request got its slot.

use serde::Serialize;

use crate::text::TokenCounter;
use crate::workload::PreparedRequest;

/// Why a request failed; the report counts failures by [`ErrorClass::key`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// TCP connect or HTTP handshake failed.
    ConnectFailed,
    /// The connection broke while sending or receiving.
    Io,
    /// `--timeout-secs` elapsed.
    Timeout,
    /// A non-2xx status (the key adds the status and the body's error code).
    HttpStatus,
    /// An SSE `data:` payload that is not JSON.
    MalformedSse,
    /// An error object inside the stream.
    StreamError,
    /// The stream ended without `data: [DONE]`.
    IncompleteStream,
    /// A non-streaming body that is not the expected JSON.
    InvalidResponse,
}

impl ErrorClass {
    pub fn name(self) -> &'static str {
        match self {
            ErrorClass::ConnectFailed => "connect_failed",
            ErrorClass::Io => "io",
            ErrorClass::Timeout => "timeout",
            ErrorClass::HttpStatus => "http_status",
            ErrorClass::MalformedSse => "malformed_sse",
            ErrorClass::StreamError => "stream_error",
            ErrorClass::IncompleteStream => "incomplete_stream",
            ErrorClass::InvalidResponse => "invalid_response",
        }
    }
}

/// Raw facts about one request, filled in on the hot path. Times are
/// nanoseconds since the run's epoch.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub request: u32,
    pub unit: u32,
    pub turn: u32,
    pub scheduled_ns: u64,
    pub sent_ns: u64,
    pub first_token_ns: Option<u64>,
    pub end_ns: u64,
    /// Gaps between consecutive token-bearing events (streaming).
    pub itl_ns: Vec<u64>,
    /// Token-bearing SSE events (streaming).
    pub token_events: u32,
    pub status: u16,
    pub server_prompt_tokens: Option<u32>,
    pub server_completion_tokens: Option<u32>,
    /// Generated text bytes seen (for the approximate count).
    pub output_bytes: u64,
    /// Generated text, kept only when a tokenizer will count it.
    pub output_text: Option<String>,
    pub error: Option<ErrorClass>,
    /// `http_status`: `"503:overloaded"`-style status and code; others: a message.
    pub error_detail: Option<String>,
}

/// How a record's token counts were obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    Server,
    Tokenizer,
    /// Streaming: one token per token-bearing event; otherwise `ceil(bytes/4)`.
    Approximate,
}

/// One line of `--output-jsonl`.
#[derive(Debug, Clone, Serialize)]
pub struct RequestRecord {
    pub request: u32,
    pub unit: u32,
    pub turn: u32,
    /// Seconds since the run started.
    pub scheduled_s: f64,
    pub sent_s: f64,
    pub end_s: f64,
    pub schedule_lag_ms: f64,
    pub ttft_ms: Option<f64>,
    pub e2e_ms: f64,
    pub tpot_ms: Option<f64>,
    pub itl_ms: Vec<f64>,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    pub prompt_token_source: TokenSource,
    pub output_token_source: TokenSource,
    pub images: u32,
    pub status: u16,
    pub ok: bool,
    pub error: Option<String>,
    pub error_detail: Option<String>,
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

impl ErrorClass {
    /// The key failures are counted under: the class name, plus the status
    /// and error code for HTTP errors (`http_503:overloaded`).
    pub fn key(self, detail: Option<&str>) -> String {
        match (self, detail) {
            (ErrorClass::HttpStatus, Some(detail)) => format!("http_{detail}"),
            _ => self.name().to_string(),
        }
    }
}

impl RequestRecord {
    /// Derives the record, counting tokens the server did not report.
    pub fn from_outcome(
        outcome: Outcome,
        prepared: &PreparedRequest,
        counter: &TokenCounter,
        streaming: bool,
    ) -> Self {
        let (prompt_tokens, prompt_token_source) = match outcome.server_prompt_tokens {
            Some(n) => (n, TokenSource::Server),
            None if counter.is_exact() => (prepared.prompt_tokens, TokenSource::Tokenizer),
            None => (prepared.prompt_tokens, TokenSource::Approximate),
        };
        let (output_tokens, output_token_source) =
            match (outcome.server_completion_tokens, &outcome.output_text) {
                (Some(n), _) => (n, TokenSource::Server),
                (None, Some(text)) if counter.is_exact() => {
                    (counter.count(text) as u32, TokenSource::Tokenizer)
                }
                (None, _) if streaming => (outcome.token_events, TokenSource::Approximate),
                (None, _) => (
                    outcome
                        .output_bytes
                        .div_ceil(crate::text::APPROX_BYTES_PER_TOKEN as u64)
                        as u32,
                    TokenSource::Approximate,
                ),
            };
        let e2e_ns = outcome.end_ns.saturating_sub(outcome.scheduled_ns);
        let ttft_ns = outcome
            .first_token_ns
            .map(|t| t.saturating_sub(outcome.scheduled_ns));
        let tpot_ms = match ttft_ns {
            Some(ttft) if output_tokens > 1 => {
                Some(ms(e2e_ns.saturating_sub(ttft)) / f64::from(output_tokens - 1))
            }
            _ => None,
        };
        let ok = outcome.error.is_none();
        RequestRecord {
            request: outcome.request,
            unit: outcome.unit,
            turn: outcome.turn,
            scheduled_s: outcome.scheduled_ns as f64 / 1e9,
            sent_s: outcome.sent_ns as f64 / 1e9,
            end_s: outcome.end_ns as f64 / 1e9,
            schedule_lag_ms: ms(outcome.sent_ns.saturating_sub(outcome.scheduled_ns)),
            ttft_ms: ttft_ns.map(ms),
            e2e_ms: ms(e2e_ns),
            tpot_ms,
            itl_ms: outcome.itl_ns.iter().map(|&g| ms(g)).collect(),
            prompt_tokens,
            output_tokens,
            prompt_token_source,
            output_token_source,
            images: prepared.images,
            status: outcome.status,
            ok,
            error: outcome
                .error
                .map(|class| class.key(outcome.error_detail.as_deref())),
            error_detail: outcome.error_detail,
        }
    }
}
