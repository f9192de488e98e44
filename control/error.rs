//! One error type for the whole control plane.
//!
//! Every failure a client can see carries a stable snake_case [`ErrorCode`]:
//! the code fixes the HTTP status, who caused the failure (the client, the
//! gateway or a worker) and whether the request may be retried on another
//! attempt. Handlers never invent statuses; they pick a code.
//!
//! What a client reads is deliberately less than what the gateway knows.
//! Messages quote client input only through [`excerpt`] (bounded, control
//! characters escaped), so a 1.5 MB URL cannot become a 1.5 MB error. The
//! detail of a failure the client did not cause (a worker's address and
//! its words, an OS error chain, a `/dev/shm` name) helps an attacker map
//! the deployment and helps the client not at all: for codes that
//! [withhold](ErrorCode::withholds_detail) it, the client reads the code,
//! a fixed sentence and the request id ([`Error::client_message`]), and the
//! full message goes to the log under that id. Messages of client errors,
//! and of the gateway's capacity refusals that name the flag raising the
//! limit, are written for the client and stay; they must never carry a
//! resolved address, a path the client did not write, a pid or a worker
//! URL.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Who caused a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The request itself is wrong; retrying it cannot help.
    Client,
    /// The gateway could not serve it (capacity, configuration, a bug).
    Gateway,
    /// An engine worker failed or refused.
    Worker,
}

macro_rules! error_codes {
    ($( $(#[$doc:meta])* $variant:ident => ($code:literal, $status:literal, $origin:ident, $retryable:literal, $charged:ident), )*) => {
        /// The stable error codes smg answers with. The string form is part of
        /// the API: never rename one.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $( $(#[$doc])* $variant, )*
        }

        impl ErrorCode {
            /// Every code, for documentation and tests.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant),*];

            /// The snake_case code clients see in `error.code`.
            pub const fn as_str(self) -> &'static str {
                match self { $(ErrorCode::$variant => $code,)* }
            }

            /// The HTTP status this code answers with.
            pub const fn http_status(self) -> u16 {
                match self { $(ErrorCode::$variant => $status,)* }
            }

            pub const fn origin(self) -> Origin {
                match self { $(ErrorCode::$variant => Origin::$origin,)* }
            }

            /// Whether another attempt (possibly on another worker) may succeed.
            pub const fn retryable(self) -> bool {
                match self { $(ErrorCode::$variant => $retryable,)* }
            }

            /// Whether the client is told only the code, a fixed sentence
            /// and the request id, never the message: every worker fault
            /// answered 5xx, and the gateway's own unexpected failures,
            /// whose messages carry worker addresses, a worker's words, OS
            /// error chains or `/dev/shm` names (see the module doc). (The
            /// history store's failure keeps its fixed message; the
            /// driver's words are logged where it fails.)
            pub const fn withholds_detail(self) -> bool {
                matches!(self, ErrorCode::InternalError)
                    || (matches!(self.origin(), Origin::Worker) && self.http_status() >= 500)
            }

            /// Whether the failure counts against the worker it blames (its
            /// circuit breaker): the worker is down or broke the request.
            /// A rejection or an overload answer does not: the worker is up
            /// and talking.
            pub const fn charges_worker(self) -> bool {
                match self { $(ErrorCode::$variant => error_codes!(@charged $charged),)* }
            }
        }
    };
    (@charged charged) => { true };
    (@charged free) => { false };
}

error_codes! {
    /// The body is not valid JSON.
    InvalidJson => ("invalid_json", 400, Client, false, free),
    /// A field is missing, has the wrong type, or the request is malformed.
    InvalidRequest => ("invalid_request", 400, Client, false, free),
    /// A parameter is out of its allowed range.
    InvalidParameter => ("invalid_parameter", 400, Client, false, free),
    /// No such route.
    NotFound => ("not_found", 404, Client, false, free),
    /// The route exists but not with this method (`Allow` lists those it
    /// takes).
    MethodNotAllowed => ("method_not_allowed", 405, Client, false, free),
    /// The route needs an API key and the request has none, or not one
    /// the gateway knows.
    InvalidApiKey => ("invalid_api_key", 401, Client, false, free),
    /// The key is valid but may not do this (a viewer key changing the
    /// fleet).
    PermissionDenied => ("permission_denied", 403, Client, false, free),
    /// The request body is larger than `--max-payload-size`.
    PayloadTooLarge => ("payload_too_large", 413, Client, false, free),
    /// The request line and headers are larger than `--max-header-size`.
    HeadersTooLarge => ("headers_too_large", 431, Client, false, free),
    /// No served model has this name.
    ModelNotFound => ("model_not_found", 404, Client, false, free),
    /// The prompt (plus the requested output) does not fit the context.
    ContextLengthExceeded => ("context_length_exceeded", 400, Client, false, free),
    /// Rendering the chat template for this request took more work than
    /// `--chat-template-fuel` allows (a template looping far longer than
    /// the conversation warrants, or one driven into it by the request's
    /// messages, tools or `chat_template_kwargs`).
    ChatTemplateBudgetExceeded => ("chat_template_budget_exceeded", 400, Client, false, free),
    /// The endpoint does not exist in the router's mode.
    UnsupportedEndpoint => ("unsupported_endpoint", 501, Gateway, false, free),
    /// An image could not be decoded, or its size or shape is unusable.
    InvalidImage => ("invalid_image", 400, Client, false, free),
    /// An image's header declares more pixels than the gateway decodes.
    ImageTooLarge => ("image_too_large", 400, Client, false, free),
    /// Decoding an image would exceed the decoder's budget: a colour
    /// profile or text chunk that inflates past its cap, too many JPEG
    /// scans for its size, an allocation past the decoder's limit.
    ImageDecodeLimitExceeded => ("image_decode_limit_exceeded", 400, Client, false, free),
    /// An image is not JPEG, PNG or WebP.
    UnsupportedImageFormat => ("unsupported_image_format", 400, Client, false, free),
    /// The request carries media this gateway cannot process.
    UnsupportedMedia => ("unsupported_media", 501, Gateway, false, free),
    /// An image reference is malformed: an unknown scheme, a URL that does
    /// not parse, a `data:` URL that is not base64, invalid base64.
    InvalidImageUrl => ("invalid_image_url", 400, Client, false, free),
    /// An image URL leads where the gateway must not go: a loopback,
    /// private, link-local (cloud metadata) or otherwise non-public address
    /// (the SSRF guard), or a file outside the allowed directories.
    MediaUrlForbidden => ("media_url_forbidden", 400, Client, false, free),
    /// An image is larger than the configured byte cap.
    MediaTooLarge => ("media_too_large", 400, Client, false, free),
    /// The prompt holds multimodal tokens (`<|image_pad|>`,
    /// `<|vision_start|>`, ...) that the request's attached images do not
    /// account for: token ids a client sent, or a raw prompt's markup that
    /// disagrees with its `image_data`. Client text never makes one (it is
    /// neutralized); this is the backstop.
    PlaceholderMismatch => ("placeholder_mismatch", 400, Client, false, free),
    /// The request carries more images than the configured limit.
    TooManyImages => ("too_many_images", 400, Client, false, free),
    /// An image could not be obtained from where the client pointed: the
    /// server was unreachable, answered non-2xx or too slowly, or the file
    /// is missing. A client error: the client chose the source, no other
    /// worker can help (fetching precedes worker selection), and a 5xx
    /// would charge a third party's outage to the gateway.
    MediaFetchFailed => ("media_fetch_failed", 400, Client, false, free),
    /// The request's inline tensors would make a gRPC message larger than
    /// the engines accept (256 MiB); fewer or smaller images, or the shm
    /// lane, fit.
    MessageTooLarge => ("message_too_large", 413, Client, false, free),
    /// An MCP tool's `server_url` leads where the gateway must not go: not
    /// http(s), or a loopback, private, link-local (cloud metadata) or
    /// otherwise non-public address the operator did not allow
    /// (`--mcp-allow-private-host`).
    McpServerForbidden => ("mcp_server_forbidden", 400, Client, false, free),
    /// An MCP server refused the request's credentials (HTTP 401 or 403):
    /// the tool's `headers` (or their absence) do not satisfy it.
    McpServerUnauthorized => ("mcp_server_unauthorized", 400, Client, false, free),
    /// An MCP server could not be reached, or did not answer as an MCP
    /// server must: an HTTP error, a body that is not MCP, a JSON-RPC error
    /// (an unknown tool, arguments it refuses), a closed session. Never
    /// retried: a tool call may have effects.
    McpServerUnavailable => ("mcp_server_unavailable", 502, Gateway, false, free),
    /// An MCP server took longer than `--mcp-call-timeout-secs` to connect,
    /// list its tools or answer a tool call.
    McpTimeout => ("mcp_timeout", 504, Gateway, false, free),
    /// An MCP answer is larger than the gateway reads: a tool result over
    /// the result cap, or a tool list over its count or byte cap. Refused
    /// whole, never cut: half a JSON document would mislead the model.
    McpResultTooLarge => ("mcp_result_too_large", 502, Gateway, false, free),
    /// A worker with this URL is already registered (admin API).
    WorkerAlreadyExists => ("worker_already_exists", 409, Client, false, free),
    /// No worker has this id (admin API).
    WorkerNotFound => ("worker_not_found", 404, Client, false, free),
    /// `previous_response_id` names no stored response, or its chain
    /// reaches a response that was deleted.
    PreviousResponseNotFound => ("previous_response_not_found", 400, Client, false, free),
    /// No stored response has this id (`/v1/responses/{id}`).
    ResponseNotFound => ("response_not_found", 404, Client, false, free),
    /// No conversation has this id.
    ConversationNotFound => ("conversation_not_found", 404, Client, false, free),
    /// The conversation has no item with this id.
    ItemNotFound => ("item_not_found", 404, Client, false, free),
    /// Two parameters that exclude each other were both given
    /// (`conversation` and `previous_response_id`).
    MutuallyExclusiveParameters => ("mutually_exclusive_parameters", 400, Client, false, free),
    /// A Responses `input` item (or a conversation item) has an unknown
    /// type or lacks what its type needs.
    InvalidInputItem => ("invalid_input_item", 400, Client, false, free),
    /// A Responses tool type the gateway does not run (only `function` and
    /// `mcp` tools are served).
    UnsupportedTool => ("unsupported_tool", 400, Client, false, free),
    /// The response has finished already and cannot be cancelled.
    ResponseNotCancellable => ("response_not_cancellable", 400, Client, false, free),
    /// The request needs stored history (`background`, a conversation, the
    /// conversations API) and the gateway keeps none
    /// (`--history-backend none`).
    HistoryDisabled => ("history_disabled", 501, Gateway, false, free),
    /// The history store failed (unreachable, or an error in its
    /// database): nothing was stored, and no chain was changed.
    HistoryUnavailable => ("history_unavailable", 503, Gateway, true, free),
    /// (In a stored response's `error`, never an HTTP answer.) The gateway
    /// running the response stopped before it ended (killed, crashed); the
    /// response was ended as failed when a gateway of that name started
    /// again, or when another replica saw its lease run out.
    ResponseOrphaned => ("response_orphaned", 500, Gateway, false, free),
    /// The model's registered workers do not yet make up a servable mode
    /// (e.g. prefill without decode), or none is registered.
    ModelNotReady => ("model_not_ready", 503, Gateway, true, free),
    /// No healthy worker can take the request for a role the mode needs.
    NoHealthyWorker => ("no_healthy_worker", 503, Gateway, true, free),
    /// The gateway is at capacity (a full queue or ring).
    Overloaded => ("overloaded", 503, Gateway, true, free),
    /// Every admission slot is taken and the admission queue is full
    /// (`--max-concurrent-requests`, `--queue-size`); `Retry-After` says
    /// when to try again.
    QueueFull => ("queue_full", 429, Gateway, false, free),
    /// The request waited in the admission queue longer than
    /// `--queue-timeout-secs` (408 as in SMG, with `Retry-After`).
    QueueTimeout => ("queue_timeout", 408, Gateway, false, free),
    /// Over the request rate (`--rate-limit-tokens-per-second`, per tenant
    /// when tenants exist); `Retry-After` says when the next token comes.
    RateLimited => ("rate_limited", 429, Client, false, free),
    /// The listener holds `--max-connections` open connections; the new
    /// one is answered (with `Retry-After`) and closed.
    TooManyConnections => ("too_many_connections", 503, Gateway, true, free),
    /// Every data-plane core's job ring stayed full for the submit deadline
    /// (`--dataplane-submit-timeout-ms`): images arrive faster than the data
    /// plane preprocesses them.
    DataplaneBusy => ("dataplane_busy", 503, Gateway, true, free),
    /// The data plane is shutting down.
    DataplaneUnavailable => ("dataplane_unavailable", 503, Gateway, true, free),
    /// A tensor the request sent through `/dev/shm` was removed or
    /// truncated by someone else before its worker read it, and could not
    /// be sent again inline (its bytes went with the truncation, or no
    /// retry was left). The lane rebuilds its slots; the next request
    /// uses them.
    TensorLost => ("tensor_lost", 503, Gateway, true, free),
    /// The request took longer than the configured timeout.
    RequestTimeout => ("request_timeout", 504, Gateway, true, free),
    /// A worker could not be reached.
    WorkerUnavailable => ("worker_unavailable", 503, Worker, true, charged),
    /// A worker failed while serving the request.
    WorkerError => ("worker_error", 502, Worker, true, charged),
    /// A worker answered with something it must not send: a sequence that
    /// does not exist, logprob arrays that disagree with its tokens, an
    /// embedding that disagrees with its dimension, more data-parallel ranks
    /// or a larger tokenizer archive than the gateway accepts, a message
    /// larger than any answer to the request can need. (What can be
    /// repaired, a sequence past `max_tokens` or surplus logprob
    /// alternatives, is cut instead and only counted.)
    WorkerProtocolViolation => ("worker_protocol_violation", 502, Worker, true, charged),
    /// A worker did not answer in time.
    WorkerTimeout => ("worker_timeout", 504, Worker, true, charged),
    /// A worker rejected the request as invalid.
    WorkerRejected => ("worker_rejected", 400, Worker, false, free),
    /// A worker is overloaded (RESOURCE_EXHAUSTED).
    WorkerOverloaded => ("worker_overloaded", 429, Worker, true, free),
    /// An encode worker refused or failed an image (EPD).
    EncodeFailed => ("encode_failed", 502, Worker, true, charged),
    /// The worker's stream ended before the request completed.
    StreamInterrupted => ("stream_interrupted", 502, Worker, true, charged),
    /// The gateway failed unexpectedly.
    InternalError => ("internal_error", 500, Gateway, false, free),
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How far a failed engine call got, which decides whether it counts
/// against the worker's circuit breaker (see [`Error::charges`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reach {
    /// The worker saw the request, or the failure is not one call's: the
    /// code decides.
    #[default]
    Worker,
    /// The call's connection broke (reset, closed, unreachable). `first`
    /// is false when a failure reported since the call began already told
    /// of this connection's death: one death counts once, however many
    /// streams it took down.
    Connection { first: bool },
    /// The worker never saw the request: its connection was closing
    /// (HTTP/2 GOAWAY, the stream above its last stream id), refused the
    /// stream (REFUSED_STREAM), or closed before the request was written
    /// (a keep-alive ping unanswered, a reset). Never counts; always safe
    /// to send again, to any worker.
    Unsent,
}

/// A failure with its code, a human message, optionally the request
/// parameter at fault, and the worker it blames.
///
/// Decisions read fields, never the message: retries read
/// [`ErrorCode::retryable`], the circuit breakers [`Error::worker`] and
/// [`ErrorCode::charges_worker`]. The message is for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub code: ErrorCode,
    pub message: String,
    pub param: Option<String>,
    /// The URL of the worker whose answer (or silence) this is, when one
    /// is to blame.
    pub worker: Option<Arc<str>>,
    /// When trying again may succeed (the `Retry-After` header).
    pub retry_after: Option<Duration>,
    /// How far the failed call got (engine calls only).
    pub reach: Reach,
}

impl Error {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            param: None,
            worker: None,
            retry_after: None,
            reach: Reach::Worker,
        }
    }

    /// Says how far the failed call got.
    pub fn with_reach(mut self, reach: Reach) -> Self {
        self.reach = reach;
        self
    }

    /// Tells the client when trying again may succeed.
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// Blames the worker at `url`.
    pub fn with_worker(mut self, url: impl Into<Arc<str>>) -> Self {
        self.worker = Some(url.into());
        self
    }

    /// Whether this failure counts against the worker at `url`: its code
    /// charges workers, it blames that one, and the worker saw the request
    /// or this is the first report of its connection's death.
    pub fn charges(&self, url: &str) -> bool {
        let counts = match self.reach {
            Reach::Worker => true,
            Reach::Connection { first } => first,
            Reach::Unsent => false,
        };
        counts && self.code.charges_worker() && self.worker.as_deref() == Some(url)
    }

    /// Names the request parameter at fault.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, message)
    }

    pub fn invalid_parameter(param: &str, message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidParameter, message).with_param(param)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InternalError, message)
    }

    pub fn retryable(&self) -> bool {
        self.code.retryable()
    }

    /// The OpenAI `error.type` for this failure.
    pub fn openai_type(&self) -> &'static str {
        match self.code.origin() {
            Origin::Client => "invalid_request_error",
            Origin::Gateway | Origin::Worker => match self.code.http_status() {
                503 | 429 => "service_unavailable_error",
                _ => "server_error",
            },
        }
    }

    /// The message a client reads. For a code that
    /// [withholds](ErrorCode::withholds_detail) its detail: a fixed sentence
    /// naming the code and `request_id` (the `x-request-id` the log files
    /// the detail under), and the detail goes to the log here (WARN, in the
    /// request's span when there is one). Otherwise the message, cut to
    /// [`MAX_MESSAGE_CHARS`] as a backstop.
    pub fn client_message(&self, request_id: Option<&str>) -> String {
        if !self.code.withholds_detail() {
            if self.code.origin() == Origin::Worker {
                return self.worker_words(request_id);
            }
            return bounded(&self.message, MAX_MESSAGE_CHARS);
        }
        self.log_detail(request_id, "a failure answered without its detail");
        let what = match self.code.origin() {
            Origin::Worker => "a worker failed to serve the request",
            Origin::Gateway | Origin::Client => "the gateway failed to serve the request",
        };
        match request_id {
            Some(id) => format!(
                "{what} ({}); the gateway's log has the details under request id {id}",
                self.code
            ),
            None => format!(
                "{what} ({}); the gateway's log has the details under the request's x-request-id",
                self.code
            ),
        }
    }

    /// A worker's refusal the client caused (`worker_rejected`,
    /// `worker_overloaded`): its reason helps the client (a prompt over
    /// the context length), but the worker wrote it, and a worker's words
    /// may name its files, its peers' addresses or the gateway's `/dev/shm`
    /// names. The client reads them [redacted] and cut to
    /// [`WORKER_TEXT_CHARS`]; the log has them whole under the request id.
    fn worker_words(&self, request_id: Option<&str>) -> String {
        self.log_detail(request_id, "a worker refused the request");
        Excerpt(&redacted(&self.message), WORKER_TEXT_CHARS).to_string()
    }

    /// The whole message, for the log line a client's request id finds
    /// (WARN, in the request's span when there is one).
    fn log_detail(&self, request_id: Option<&str>, what: &str) {
        tracing::warn!(
            code = self.code.as_str(),
            request_id = request_id.unwrap_or("-"),
            worker = self.worker.as_deref().unwrap_or("-"),
            detail = %self.message,
            "{what}"
        );
    }

    /// The OpenAI-shaped error body:
    /// `{"error": {"message", "type", "param", "code"}}`, its message as
    /// [`Error::client_message`] gives it.
    pub fn to_openai_json(&self, request_id: Option<&str>) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.client_message(request_id),
                "type": self.openai_type(),
                "param": self.param.as_deref().map(|param| bounded(param, MAX_PARAM_CHARS)),
                "code": self.code.as_str(),
            }
        })
    }

    /// A data-plane job that failed for the runtime's reasons (busy,
    /// stopping, a bug), not because of its input; callers map input errors
    /// (an image, a file) themselves.
    pub fn from_dataplane(error: &smg_dataplane::JobError) -> Self {
        use smg_dataplane::JobError;
        let code = match error {
            JobError::Busy { .. } => ErrorCode::DataplaneBusy,
            JobError::ShuttingDown => ErrorCode::DataplaneUnavailable,
            JobError::Image(_)
            | JobError::File(_)
            | JobError::Base64(_)
            | JobError::Lane(_)
            | JobError::Panicked(_) => ErrorCode::InternalError,
        };
        let flag = match error {
            JobError::Busy { .. } => " (--dataplane-submit-timeout-ms)",
            _ => "",
        };
        Self::new(code, format!("{error}{flag}"))
    }

    /// Maps a worker's gRPC status to a code.
    pub fn from_worker_status(status: &tonic::Status, worker: &str) -> Self {
        use tonic::Code;
        let code = match status.code() {
            Code::InvalidArgument | Code::OutOfRange => ErrorCode::WorkerRejected,
            Code::FailedPrecondition => ErrorCode::WorkerError,
            Code::ResourceExhausted => ErrorCode::WorkerOverloaded,
            Code::DeadlineExceeded => ErrorCode::WorkerTimeout,
            Code::Unavailable => ErrorCode::WorkerUnavailable,
            Code::Cancelled | Code::Aborted => ErrorCode::WorkerError,
            _ => ErrorCode::WorkerError,
        };
        // A transport failure (refused connection, failed TLS handshake)
        // says only "transport error"; its causes say what went wrong.
        let mut message = status.message().to_owned();
        let mut cause = std::error::Error::source(status);
        while let Some(err) = cause {
            let text = err.to_string();
            if !message.contains(&text) {
                message.push_str(": ");
                message.push_str(&text);
            }
            cause = err.source();
        }
        // The worker's address is the `worker` field, for the breakers and
        // the log; a message a client may read never names it.
        Self::new(
            code,
            format!("the worker answered {:?}: {message}", status.code()),
        )
        .with_worker(worker)
    }
}

/// The most characters of client input a message quotes.
pub const EXCERPT_CHARS: usize = 100;

/// The most characters of a worker's own message a client reads
/// ([`redacted`] first).
pub const WORKER_TEXT_CHARS: usize = 200;

/// The most characters of any message a client reads: a backstop for a
/// message that quoted input without [`excerpt`].
pub const MAX_MESSAGE_CHARS: usize = 1024;

/// The most characters of `param` a client reads: a backstop for a path
/// that holds a client's key without [`excerpt`].
pub const MAX_PARAM_CHARS: usize = 256;

/// Client-supplied text as a message quotes it: at most
/// [`EXCERPT_CHARS`] characters (cut on a character boundary), control
/// characters escaped (`\n`, `\u{1b}`), and when cut an ellipsis and
/// the original length in bytes. `Display` writes it bare, `Debug` in
/// double quotes (inner quotes escaped), as `{:?}` quotes a string.
pub fn excerpt(text: &str) -> Excerpt<'_> {
    Excerpt(text, EXCERPT_CHARS)
}

/// See [`excerpt`]: the text and the most characters shown.
#[derive(Clone, Copy)]
pub struct Excerpt<'a>(&'a str, usize);

impl Excerpt<'_> {
    fn write(&self, f: &mut fmt::Formatter<'_>, quoted: bool) -> fmt::Result {
        use fmt::Write as _;
        let mut written = 0;
        for c in self.0.chars() {
            if written >= self.1 {
                return write!(f, "… ({} bytes)", self.0.len());
            }
            if c.is_control() {
                let escaped = c.escape_default().to_string();
                written += escaped.chars().count();
                f.write_str(&escaped)?;
            } else if quoted && (c == '"' || c == '\\') {
                written += 2;
                f.write_char('\\')?;
                f.write_char(c)?;
            } else {
                written += 1;
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for Excerpt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write(f, false)
    }
}

impl fmt::Debug for Excerpt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"")?;
        self.write(f, true)?;
        f.write_str("\"")
    }
}

/// A worker's message with what it must not pass on replaced: URLs
/// (`<url>`), file paths (`<path>`: absolute, `~/`, `./`, `../`, a
/// drive letter, or two or more `/`), network addresses (`<address>`:
/// IPv4 and IPv6 with or without a port, `host:port`) and the gateway's
/// `/dev/shm` names (`<shm name>`). Words are runs between whitespace and
/// `=,;"'()`; a word's trailing `.` or `:` (sentence punctuation) is kept
/// outside what it is judged as. A host name without a port is not
/// recognized (nothing tells it from a word like `config.json`).
pub(crate) fn redacted(text: &str) -> String {
    const SEPARATORS: &[char] = &['=', ',', ';', '"', '\'', '(', ')', '`'];
    let mut out = String::with_capacity(text.len().min(4 * WORKER_TEXT_CHARS));
    let mut rest = text;
    while !rest.is_empty() {
        let end = rest
            .find(|c: char| c.is_whitespace() || SEPARATORS.contains(&c))
            .unwrap_or(rest.len());
        if end == 0 {
            let c = rest.chars().next().map_or(1, char::len_utf8);
            out.push_str(&rest[..c]);
            rest = &rest[c..];
            continue;
        }
        let word = &rest[..end];
        let core = word.trim_end_matches(['.', ':']);
        match sensitive(core) {
            Some(placeholder) => {
                out.push_str(placeholder);
                out.push_str(&word[core.len()..]);
            }
            None => out.push_str(word),
        }
        rest = &rest[end..];
    }
    out
}

/// What a word of a worker's message is, when it must not reach a client.
fn sensitive(word: &str) -> Option<&'static str> {
    if word.contains("://") {
        return Some("<url>");
    }
    let bytes = word.as_bytes();
    let drive = bytes.len() > 2 && bytes[0].is_ascii_alphabetic() && &bytes[1..3] == b":\\";
    if (word.starts_with('/') && word.len() > 1)
        || ["~/", "./", "../"].iter().any(|p| word.starts_with(p))
        || drive
        || word.matches('/').count() >= 2
    {
        return Some("<path>");
    }
    if is_address(word) {
        return Some("<address>");
    }
    if let Some(at) = word.find(smg_dataplane::lanes::shm::NAME_PREFIX) {
        let after = &word[at + smg_dataplane::lanes::shm::NAME_PREFIX.len()..];
        if after.len() >= 16 && after[..16].bytes().all(|b| b.is_ascii_hexdigit()) {
            return Some("<shm name>");
        }
    }
    None
}

/// An IP address (v4 or v6, bracketed or not, with or without a port) or
/// a `host:port`.
fn is_address(word: &str) -> bool {
    if word.starts_with('[') && word.contains(']') || word.parse::<std::net::Ipv6Addr>().is_ok() {
        return true;
    }
    let (host, port) = match word.rsplit_once(':') {
        Some((host, port))
            if !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit()) =>
        {
            (host, true)
        }
        _ => (word, false),
    };
    if host.parse::<std::net::Ipv4Addr>().is_ok() {
        return true;
    }
    port && !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-' || b == b'_')
        && host.bytes().any(|b| b.is_ascii_alphabetic() || b == b'.')
}

/// `text` cut to `max` characters with an ellipsis and its length.
pub(crate) fn bounded(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}… ({} bytes)", &text[..cut], text.len()),
        None => text.to_owned(),
    }
}

/// A byte count as a message states a limit: in whole GiB, MiB or KiB
/// when it is one (`512 MiB`, as the flags take sizes), else in bytes.
pub fn bytes_text(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (size, unit) in UNITS {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{} {unit}", bytes / size);
        }
    }
    format!("{bytes} bytes")
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {

    /// The README's error table is the documentation clients read: every
    /// code is in it with its status, and it lists no code that does not
    /// exist.
    #[test]
    fn the_readme_documents_every_code_with_its_status() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
            .expect("README.md");
        let documented: std::collections::HashMap<&str, u16> = readme
            .lines()
            .filter_map(|line| {
                let mut cells = line.strip_prefix("| `")?.split('|');
                let code = cells.next()?.trim().strip_suffix('`')?;
                let status = cells.next()?.trim().parse().ok()?;
                Some((code, status))
            })
            .collect();
        for code in ErrorCode::ALL {
            assert_eq!(
                documented.get(code.as_str()),
                Some(&code.http_status()),
                "README error table row for {code}"
            );
        }
        for code in documented.keys() {
            assert!(
                ErrorCode::ALL.iter().any(|known| known.as_str() == *code),
                "README documents {code}, which no longer exists"
            );
        }
    }
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn limits_are_stated_in_the_units_flags_take() {
        assert_eq!(bytes_text(512 << 20), "512 MiB");
        assert_eq!(bytes_text(64 << 10), "64 KiB");
        assert_eq!(bytes_text(2 << 30), "2 GiB");
        assert_eq!(bytes_text(1000), "1000 bytes");
        assert_eq!(bytes_text((1 << 20) + 1), "1048577 bytes");
    }

    #[test]
    fn codes_are_unique_snake_case() {
        let mut seen = HashSet::new();
        for code in ErrorCode::ALL {
            let text = code.as_str();
            assert!(seen.insert(text), "duplicate code {text}");
            assert!(
                text.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{text} is not snake_case"
            );
        }
    }

    #[test]
    fn client_errors_are_4xx_and_never_retried() {
        for code in ErrorCode::ALL {
            if code.origin() == Origin::Client {
                assert!((400..500).contains(&code.http_status()), "{code}");
                assert!(!code.retryable(), "{code}");
            }
        }
    }

    #[test]
    fn openai_body_carries_code_and_param() {
        let err = Error::invalid_parameter("temperature", "must be within [0, 2]");
        let body = err.to_openai_json(None);
        assert_eq!(body["error"]["code"], "invalid_parameter");
        assert_eq!(body["error"]["param"], "temperature");
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }

    #[test]
    fn media_codes_are_pinned() {
        // Typed out by hand: these strings and statuses are API.
        let expected = [
            (ErrorCode::InvalidImageUrl, "invalid_image_url", 400),
            (ErrorCode::MediaUrlForbidden, "media_url_forbidden", 400),
            (ErrorCode::MediaTooLarge, "media_too_large", 400),
            (ErrorCode::TooManyImages, "too_many_images", 400),
            (ErrorCode::MediaFetchFailed, "media_fetch_failed", 400),
        ];
        for (code, text, status) in expected {
            assert_eq!(code.as_str(), text);
            assert_eq!(code.http_status(), status, "{text}");
            assert_eq!(code.origin(), Origin::Client, "{text}");
            assert!(!code.retryable(), "{text}");
            assert_eq!(
                Error::new(code, "x").openai_type(),
                "invalid_request_error",
                "{text}"
            );
        }
    }

    #[test]
    fn mcp_codes_are_pinned() {
        // Typed out by hand: these strings and statuses are API. None is
        // retried (a tool call may have effects) and none blames a worker.
        let expected = [
            (ErrorCode::McpServerForbidden, "mcp_server_forbidden", 400),
            (
                ErrorCode::McpServerUnauthorized,
                "mcp_server_unauthorized",
                400,
            ),
            (
                ErrorCode::McpServerUnavailable,
                "mcp_server_unavailable",
                502,
            ),
            (ErrorCode::McpTimeout, "mcp_timeout", 504),
            (ErrorCode::McpResultTooLarge, "mcp_result_too_large", 502),
        ];
        for (code, text, status) in expected {
            assert_eq!(code.as_str(), text);
            assert_eq!(code.http_status(), status, "{text}");
            assert!(!code.retryable(), "{text}");
            assert!(!code.charges_worker(), "{text}");
        }
    }

    #[test]
    fn front_door_codes_are_pinned() {
        // Typed out by hand: these strings and statuses are API.
        let expected = [
            (ErrorCode::InvalidApiKey, "invalid_api_key", 401, false),
            (ErrorCode::PermissionDenied, "permission_denied", 403, false),
            (ErrorCode::PayloadTooLarge, "payload_too_large", 413, false),
            (ErrorCode::HeadersTooLarge, "headers_too_large", 431, false),
            (
                ErrorCode::TooManyConnections,
                "too_many_connections",
                503,
                true,
            ),
        ];
        for (code, text, status, retryable) in expected {
            assert_eq!(code.as_str(), text);
            assert_eq!(code.http_status(), status, "{text}");
            assert_eq!(code.retryable(), retryable, "{text}");
            assert!(!code.charges_worker(), "{text}");
        }
    }

    #[test]
    fn worker_words_lose_urls_paths_addresses_and_shm_names() {
        let cases = [
            ("the prompt has 9000 tokens; the context holds 8192", None),
            (
                "cannot open /srv/models/x/config.json.",
                Some("cannot open <path>."),
            ),
            (
                "see ~/cache/x and ./w and ../up",
                Some("see <path> and <path> and <path>"),
            ),
            (
                "weights in data/llama/shard-1 (missing)",
                Some("weights in <path> (missing)"),
            ),
            ("ratio 3/4 tokens/s ok", None),
            (r"file C:\models\m.bin", Some("file <path>")),
            (
                "peer=10.0.0.5:8000, backup 10.0.0.6",
                Some("peer=<address>, backup <address>"),
            ),
            ("at http://h:1/v1 now", Some("at <url> now")),
            (
                "v6 [fe80::1]:50051 and ::1 and fe80::2:",
                Some("v6 <address> and <address> and <address>:"),
            ),
            (
                "rank node-7.internal:29500 failed",
                Some("rank <address> failed"),
            ),
            ("error: step 3:12 of 'x'", None),
            (
                "slot smg-0123456789abcdef0123456789abcdef-00112233445566778899aabb-ff gone",
                Some("slot <shm name> gone"),
            ),
            ("smg-sim-worker said no", None),
        ];
        for (text, expected) in cases {
            assert_eq!(redacted(text), expected.unwrap_or(text), "{text}");
        }
    }

    #[test]
    fn a_worker_refusal_reads_redacted_and_cut() {
        let status = tonic::Status::invalid_argument(format!(
            "too long: /etc/engine/limits.toml says so {}",
            "y".repeat(5000)
        ));
        for code in [ErrorCode::WorkerRejected, ErrorCode::WorkerOverloaded] {
            let mut err = Error::from_worker_status(&status, "grpc://10.9.9.9:1");
            err.code = code;
            let message = err.client_message(Some("req-1"));
            assert!(
                message
                    .starts_with("the worker answered InvalidArgument: too long: <path> says so y"),
                "{message}"
            );
            assert!(
                !message.contains("/etc") && !message.contains("10.9.9.9"),
                "{message}"
            );
            assert!(
                message.chars().count() <= WORKER_TEXT_CHARS + 20,
                "{message}"
            );
            // The message kept for the log is whole.
            assert!(err.message.contains("/etc/engine/limits.toml"));
        }
    }

    #[test]
    fn excerpts_are_bounded_escaped_and_cut_on_a_character() {
        let long = "x".repeat(1_500_000);
        let shown = excerpt(&long).to_string();
        assert_eq!(
            shown,
            format!("{}… (1500000 bytes)", "x".repeat(EXCERPT_CHARS))
        );
        // A cut falling inside multibyte characters keeps them whole.
        let wide = "é🦀".repeat(80);
        let shown = excerpt(&wide).to_string();
        assert!(shown.starts_with(&"é🦀".repeat(50)), "{shown}");
        assert!(
            shown.ends_with(&format!("… ({} bytes)", wide.len())),
            "{shown}"
        );
        // Control characters cannot forge log lines or terminal output.
        assert_eq!(
            excerpt("a\nb\u{1b}[2Jc\0").to_string(),
            "a\\nb\\u{1b}[2Jc\\u{0}"
        );
        assert_eq!(format!("{:?}", excerpt("say \"hi\"")), "\"say \\\"hi\\\"\"");
        // Short plain text is quoted as it is.
        assert_eq!(excerpt("gpt-4o").to_string(), "gpt-4o");
        assert_eq!(format!("{:?}", excerpt("gpt-4o")), "\"gpt-4o\"");
    }

    #[test]
    fn withheld_details_reach_the_log_not_the_client() {
        // Typed out by hand: the codes whose message the client never reads.
        let withheld = [
            ErrorCode::InternalError,
            ErrorCode::WorkerUnavailable,
            ErrorCode::WorkerError,
            ErrorCode::WorkerProtocolViolation,
            ErrorCode::WorkerTimeout,
            ErrorCode::EncodeFailed,
            ErrorCode::StreamInterrupted,
        ];
        for code in ErrorCode::ALL {
            assert_eq!(code.withholds_detail(), withheld.contains(code), "{code}");
            let err = Error::new(*code, "grpc://10.1.2.3:50051 pid 4242: /dev/shm/smg-4242-7")
                .with_worker("grpc://10.1.2.3:50051");
            let message = err.client_message(Some("req-7"));
            if code.withholds_detail() {
                assert!(!message.contains("10.1.2.3"), "{code}: {message}");
                assert!(!message.contains("4242"), "{code}: {message}");
                assert!(message.contains(code.as_str()), "{code}: {message}");
                assert!(message.contains("req-7"), "{code}: {message}");
            } else if code.origin() == Origin::Worker {
                // A worker's refusal: its words, redacted.
                assert_eq!(message, "<url> pid 4242: <path>", "{code}");
            } else {
                assert_eq!(message, err.message, "{code}");
            }
        }
        // Every message is bounded, whatever it quotes, and so is the
        // parameter's path.
        let huge = Error::invalid_request("y".repeat(100_000)).with_param("z".repeat(100_000));
        assert!(huge.client_message(None).chars().count() < MAX_MESSAGE_CHARS + 32);
        let param = huge.to_openai_json(None)["error"]["param"]
            .as_str()
            .map(|param| param.chars().count());
        assert!(
            param.is_some_and(|count| count < MAX_PARAM_CHARS + 32),
            "{param:?}"
        );
    }

    #[test]
    fn worker_statuses_map_to_stable_codes() {
        let cases = [
            (tonic::Code::InvalidArgument, ErrorCode::WorkerRejected),
            (tonic::Code::Unavailable, ErrorCode::WorkerUnavailable),
            (tonic::Code::DeadlineExceeded, ErrorCode::WorkerTimeout),
            (tonic::Code::ResourceExhausted, ErrorCode::WorkerOverloaded),
            (tonic::Code::Internal, ErrorCode::WorkerError),
        ];
        for (status, expected) in cases {
            let err = Error::from_worker_status(&tonic::Status::new(status, "x"), "w1");
            assert_eq!(err.code, expected, "{status:?}");
        }
    }

    #[test]
    fn only_worker_faults_charge_a_worker() {
        // Typed out by hand: the codes a circuit breaker counts.
        let charged = [
            ErrorCode::WorkerUnavailable,
            ErrorCode::WorkerError,
            ErrorCode::WorkerProtocolViolation,
            ErrorCode::WorkerTimeout,
            ErrorCode::EncodeFailed,
            ErrorCode::StreamInterrupted,
        ];
        for code in ErrorCode::ALL {
            assert_eq!(code.charges_worker(), charged.contains(code), "{code}");
            if code.charges_worker() {
                assert_eq!(code.origin(), Origin::Worker, "{code}");
            }
        }
    }

    #[test]
    fn blame_is_by_exact_worker_url() {
        let status = tonic::Status::unavailable("down");
        let err = Error::from_worker_status(&status, "grpc://h:50001");
        assert_eq!(err.worker.as_deref(), Some("grpc://h:50001"));
        assert!(err.charges("grpc://h:50001"));
        assert!(
            !err.charges("grpc://h:5000"),
            "a URL that is a prefix of another"
        );
        assert!(
            !Error::new(ErrorCode::WorkerError, "grpc://h:5000 failed").charges("grpc://h:5000")
        );
        let rejected = Error::from_worker_status(&tonic::Status::invalid_argument("no"), "w");
        assert!(
            !rejected.charges("w"),
            "a rejection does not count against the worker"
        );
    }
}
