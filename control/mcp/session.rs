//! Connecting to an MCP server, listing its tools, calling one.
//!
//! [`McpClients`] is built once per gateway: it holds the guarded HTTP
//! client (one connection pool) and the limits. [`McpClients::connect`]
//! runs the `initialize` handshake with one server and gives an
//! [`McpSession`], which a Responses request keeps while its loop runs and
//! closes at the end.
//!
//! Every exchange has a deadline (the handshake `connect_timeout`, each
//! listing and call `call_timeout`) and every answer a byte cap; a tool
//! list is also capped in count. `allowed_tools` is enforced on both sides:
//! a tool outside it is neither listed nor called. Failures become the
//! `mcp_*` codes by what [`HttpFailure`] the transport reported, never by
//! message text.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use reqwest::Url;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ContentBlock,
    Implementation, PaginatedRequestParams,
};
use rmcp::service::{ClientInitializeError, RoleClient, RunningService, ServiceError};
use rmcp::transport::common::client_side_sse::NeverRetry;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClientTransportConfig, StreamableHttpError,
};
use rmcp::transport::{DynamicTransportError, StreamableHttpClientTransport};
use rmcp::{ErrorData, ServiceExt};

use super::http::{FailureSlot, GuardedHttp, HttpFailure};
use super::{McpCallOutput, McpConfig, McpServer, McpTool};
use crate::error::{Error, ErrorCode, Result};
use crate::media::guard::DestinationPolicy;
use crate::media::remote::error_chain;

/// Most pages of a tool list followed before the listing is refused (a
/// server that pages forever would otherwise be stopped only by the
/// deadline).
const MAX_TOOL_PAGES: usize = 64;

/// Headers a client may not set on an MCP server's requests: the
/// transport's own and HTTP's framing.
const RESERVED_HEADERS: &[&str] = &[
    "accept",
    "connection",
    "content-length",
    "content-type",
    "host",
    "last-event-id",
    "mcp-protocol-version",
    "mcp-session-id",
    "te",
    "transfer-encoding",
    "upgrade",
];

/// The gateway's MCP client: one per gateway, shared by every request.
#[derive(Debug, Clone)]
pub struct McpClients {
    http: GuardedHttp,
    config: Arc<McpConfig>,
}

impl McpClients {
    pub fn new(config: McpConfig) -> Result<Self> {
        let policy = Arc::new(DestinationPolicy::new(config.allow_private_hosts.clone()));
        let http = GuardedHttp::new(policy, config.connect_timeout, config.max_answer_bytes())
            .map_err(|error| {
                Error::internal(format!("the MCP HTTP client: {}", error_chain(&error)))
            })?;
        Ok(Self {
            http,
            config: Arc::new(config),
        })
    }

    pub fn config(&self) -> &McpConfig {
        &self.config
    }

    /// Checks `server`'s URL without connecting: its scheme, and an IP
    /// literal against the guard (a name is vetted when it resolves), so a
    /// request naming a forbidden server is refused before it runs.
    pub fn vet(&self, server: &McpServer) -> Result<()> {
        self.vetted_url(server).map(|_| ())
    }

    fn vetted_url(&self, server: &McpServer) -> Result<Url> {
        let url = Url::parse(&server.url).map_err(|error| {
            Error::invalid_request(format!(
                "MCP server {}: server_url is not a URL: {error}",
                server.label
            ))
        })?;
        self.http
            .vet(&url)
            .map_err(|failure| from_failure(&server.label, failure))?;
        Ok(url)
    }

    /// Opens a session with `server`: vets its URL, then runs the MCP
    /// handshake within `connect_timeout`.
    pub async fn connect(&self, server: &McpServer) -> Result<McpSession> {
        let url = self.vetted_url(server)?;
        let headers = header_map(server)?;
        let mut transport = StreamableHttpClientTransportConfig::with_uri(url.as_str());
        transport.custom_headers = headers;
        // One session per request: a broken stream or an expired session
        // is a failure to report, not something to repair behind the
        // request's back.
        transport.retry_config = Arc::new(NeverRetry::default());
        transport.reinit_on_expired_session = false;
        let (http, failures) = self.http.for_session();
        let transport = StreamableHttpClientTransport::with_client(http, transport);
        let identity = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("smg", env!("CARGO_PKG_VERSION")),
        );
        let service = tokio::time::timeout(self.config.connect_timeout, identity.serve(transport))
            .await
            .map_err(|_| {
                timed_out(
                    &server.label,
                    "connecting and initializing",
                    self.config.connect_timeout,
                )
            })?
            .map_err(|error| from_init_error(&server.label, &error, &failures))?;
        Ok(McpSession {
            label: server.label.clone(),
            allowed: server
                .allowed_tools
                .as_ref()
                .map(|names| names.iter().cloned().collect()),
            service,
            failures,
            config: Arc::clone(&self.config),
        })
    }
}

/// A live session with one MCP server.
#[derive(Debug)]
pub struct McpSession {
    label: String,
    allowed: Option<HashSet<String>>,
    service: RunningService<RoleClient, ClientConfig>,
    /// What broke this session's transport, when rmcp's error does not say.
    failures: FailureSlot,
    config: Arc<McpConfig>,
}

impl McpSession {
    /// The server's `server_label`.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Whether `allowed_tools` lets the model call `tool`.
    pub fn allows(&self, tool: &str) -> bool {
        self.allowed
            .as_ref()
            .is_none_or(|allowed| allowed.contains(tool))
    }

    /// The server's tools that `allowed_tools` lets through, in the
    /// server's order, every page of the list within one `call_timeout`.
    pub async fn list_tools(&self) -> Result<Vec<McpTool>> {
        let timeout = self.config.call_timeout;
        self.failures.take();
        tokio::time::timeout(timeout, self.list_all_pages())
            .await
            .map_err(|_| {
                timed_out(
                    &self.label,
                    "listing tools (--mcp-call-timeout-secs)",
                    timeout,
                )
            })?
    }

    async fn list_all_pages(&self) -> Result<Vec<McpTool>> {
        let mut tools = Vec::new();
        let mut cursor = None;
        for _ in 0..MAX_TOOL_PAGES {
            let params = PaginatedRequestParams::default().with_cursor(cursor);
            let page = self
                .service
                .list_tools(Some(params))
                .await
                .map_err(|error| self.service_failure("listing tools", &error))?;
            for tool in page.tools {
                if !self.allows(&tool.name) {
                    continue;
                }
                if tools.len() == self.config.max_tools {
                    return Err(self.error(
                        ErrorCode::McpResultTooLarge,
                        format!("lists more than {} tools", self.config.max_tools),
                    ));
                }
                tools.push(McpTool {
                    name: tool.name.into_owned(),
                    description: tool.description.map(|text| text.into_owned()),
                    input_schema: serde_json::Value::Object(Arc::unwrap_or_clone(
                        tool.input_schema,
                    )),
                });
            }
            cursor = page.next_cursor;
            if cursor.is_none() {
                return Ok(tools);
            }
        }
        Err(self.error(
            ErrorCode::McpResultTooLarge,
            format!("pages its tool list past {MAX_TOOL_PAGES} pages"),
        ))
    }

    /// Calls `tool` with `arguments` within `call_timeout`. The tool's own
    /// error (`isError`) is an `Ok` with `is_error`. A tool outside
    /// `allowed_tools` is refused (`invalid_request`) without asking the
    /// server; the Responses loop checks [`McpSession::allows`] first and
    /// tells the model instead.
    pub async fn call_tool(
        &self,
        tool: &str,
        arguments: serde_json::Map<String, serde_json::Value>,
    ) -> Result<McpCallOutput> {
        if !self.allows(tool) {
            return Err(Error::invalid_request(format!(
                "MCP server {}: tool {tool:?} is not in its allowed_tools",
                self.label
            )));
        }
        let mut params = CallToolRequestParams::new(tool.to_owned());
        params.arguments = Some(arguments);
        let timeout = self.config.call_timeout;
        self.failures.take();
        let result = tokio::time::timeout(timeout, self.service.call_tool(params))
            .await
            .map_err(|_| {
                timed_out(
                    &self.label,
                    &format!("calling {tool} (--mcp-call-timeout-secs)"),
                    timeout,
                )
            })?
            .map_err(|error| self.service_failure(&format!("calling {tool}"), &error))?;
        let output = joined_output(&result);
        if output.len() > self.config.max_result_bytes {
            return Err(self.error(
                ErrorCode::McpResultTooLarge,
                format!(
                    "{tool} answered {} bytes, over the {}-byte cap",
                    output.len(),
                    self.config.max_result_bytes
                ),
            ));
        }
        Ok(McpCallOutput {
            output,
            is_error: result.is_error == Some(true),
        })
    }

    /// Ends the session (the server is told when it keeps sessions),
    /// within `connect_timeout`. Dropping a session ends it too, without
    /// waiting.
    pub async fn close(self) {
        let timeout = self.config.connect_timeout;
        let _ = tokio::time::timeout(timeout, self.service.cancel()).await;
    }

    fn service_failure(&self, what: &str, error: &ServiceError) -> Error {
        match error {
            ServiceError::McpError(data) => from_server_error(&self.label, what, data),
            other => from_transport(&self.label, what, other, &self.failures),
        }
    }

    fn error(&self, code: ErrorCode, what: String) -> Error {
        Error::new(code, format!("MCP server {}: {what}", self.label))
    }
}

/// The result's text blocks, one per line; without any, its structured
/// content as JSON.
fn joined_output(result: &CallToolResult) -> String {
    let texts: Vec<&str> = result
        .content
        .iter()
        .filter_map(ContentBlock::as_text)
        .map(|text| text.text.as_str())
        .collect();
    match (&result.structured_content, texts.is_empty()) {
        (Some(structured), true) => structured.to_string(),
        _ => texts.join("\n"),
    }
}

/// The server's `headers` as HTTP headers, refusing malformed ones and
/// those the transport sets itself.
fn header_map(server: &McpServer) -> Result<HashMap<HeaderName, HeaderValue>> {
    let mut headers = HashMap::with_capacity(server.headers.len());
    for (name, value) in &server.headers {
        let refuse = |why: &str| {
            Error::invalid_request(format!(
                "MCP server {}: header {name:?} {why}",
                server.label
            ))
        };
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| refuse("is not a valid header name"))?;
        if RESERVED_HEADERS.contains(&name.as_str()) {
            return Err(refuse("is set by the gateway"));
        }
        let value = HeaderValue::from_str(value).map_err(|_| refuse("has an invalid value"))?;
        headers.insert(name, value);
    }
    Ok(headers)
}

fn timed_out(label: &str, what: &str, timeout: Duration) -> Error {
    Error::new(
        ErrorCode::McpTimeout,
        format!(
            "MCP server {label}: {what} took longer than {} ms",
            timeout.as_millis()
        ),
    )
}

fn from_failure(label: &str, failure: HttpFailure) -> Error {
    let code = match failure {
        HttpFailure::Forbidden(_) => ErrorCode::McpServerForbidden,
        HttpFailure::Unauthorized(_) => ErrorCode::McpServerUnauthorized,
        HttpFailure::Timeout(_) => ErrorCode::McpTimeout,
        HttpFailure::TooLarge { .. } => ErrorCode::McpResultTooLarge,
        HttpFailure::Failed(_) => ErrorCode::McpServerUnavailable,
    };
    Error::new(code, format!("MCP server {label}: {failure}"))
}

fn from_server_error(label: &str, what: &str, error: &ErrorData) -> Error {
    Error::new(
        ErrorCode::McpServerUnavailable,
        format!(
            "MCP server {label}: {what}: it answered error {}: {}",
            error.code.0, error.message
        ),
    )
}

/// The transport failure under an rmcp error (or, when rmcp's error does
/// not carry it, the one that broke the transport), else the error's text.
fn from_transport(
    label: &str,
    what: &str,
    error: &(dyn std::error::Error + 'static),
    failures: &FailureSlot,
) -> Error {
    match find_failure(error).or_else(|| failures.take()) {
        Some(failure) => from_failure(label, failure),
        None => Error::new(ErrorCode::McpServerUnavailable, {
            tracing::warn!(server = %label, error = %error_chain(error), "{what}");
            format!("MCP server {label}: {what}")
        }),
    }
}

fn from_init_error(label: &str, error: &ClientInitializeError, failures: &FailureSlot) -> Error {
    match error {
        ClientInitializeError::JsonRpcError(data) => from_server_error(label, "initializing", data),
        // The transport error is a field here, not the error's source.
        ClientInitializeError::TransportError { error, .. } => {
            from_transport(label, "initializing", error, failures)
        }
        other => from_transport(label, "initializing", other, failures),
    }
}

/// Walks an error's causes for the [`HttpFailure`] the guarded HTTP
/// client reported: rmcp wraps it as `StreamableHttpError::Client`, or,
/// when an SSE answer broke, inside the SSE parser's body error.
fn find_failure(error: &(dyn std::error::Error + 'static)) -> Option<HttpFailure> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(failure) = error.downcast_ref::<HttpFailure>() {
            return Some(failure.clone());
        }
        if let Some(transport) = error.downcast_ref::<StreamableHttpError<HttpFailure>>() {
            match transport {
                StreamableHttpError::Client(failure) => return Some(failure.clone()),
                StreamableHttpError::Sse(sse) => {
                    if let Some(failure) = sse_failure(sse) {
                        return Some(failure);
                    }
                }
                _ => {}
            }
        }
        if let Some(sse) = error.downcast_ref::<SseError>()
            && let Some(failure) = sse_failure(sse)
        {
            return Some(failure);
        }
        current = match error.downcast_ref::<DynamicTransportError>() {
            Some(dynamic) => Some(dynamic.error.as_ref()),
            None => error.source(),
        };
    }
    None
}

fn sse_failure(error: &SseError) -> Option<HttpFailure> {
    match error {
        SseError::Body(body) => body.downcast_ref::<HttpFailure>().cloned(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(headers: &[(&str, &str)]) -> McpServer {
        McpServer {
            label: "s".to_owned(),
            url: "https://mcp.example.com/mcp".to_owned(),
            headers: headers
                .iter()
                .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
                .collect(),
            allowed_tools: None,
        }
    }

    #[test]
    fn headers_refuse_the_transports_own_and_malformed_ones() {
        let ok = header_map(&server(&[("Authorization", "Bearer t"), ("x-team", "a")]))
            .expect("plain headers pass");
        assert_eq!(ok.len(), 2);
        assert_eq!(
            ok.get(&HeaderName::from_static("authorization")),
            Some(&HeaderValue::from_static("Bearer t"))
        );
        for (name, value) in [
            ("Mcp-Session-Id", "x"),
            ("content-type", "text/plain"),
            ("Host", "internal"),
            ("bad name", "x"),
            ("x-ok", "line\nbreak"),
        ] {
            let error = header_map(&server(&[(name, value)])).expect_err(name);
            assert_eq!(error.code, ErrorCode::InvalidRequest, "{name}");
        }
    }

    #[test]
    fn failures_map_to_their_codes() {
        let cases = [
            (
                HttpFailure::Forbidden("x".into()),
                ErrorCode::McpServerForbidden,
            ),
            (
                HttpFailure::Unauthorized("x".into()),
                ErrorCode::McpServerUnauthorized,
            ),
            (HttpFailure::Timeout("x".into()), ErrorCode::McpTimeout),
            (
                HttpFailure::TooLarge { limit: 1 },
                ErrorCode::McpResultTooLarge,
            ),
            (
                HttpFailure::Failed("x".into()),
                ErrorCode::McpServerUnavailable,
            ),
        ];
        for (failure, code) in cases {
            // Found however rmcp wraps it.
            let wrapped: StreamableHttpError<HttpFailure> =
                StreamableHttpError::Client(failure.clone());
            assert_eq!(find_failure(&wrapped), Some(failure.clone()));
            let in_sse: StreamableHttpError<HttpFailure> =
                StreamableHttpError::Sse(SseError::Body(Box::new(failure.clone())));
            assert_eq!(find_failure(&in_sse), Some(failure.clone()));
            assert_eq!(from_failure("s", failure).code, code);
        }
    }

    #[test]
    fn output_joins_text_and_falls_back_to_structured_content() {
        let text = CallToolResult::success(vec![ContentBlock::text("a"), ContentBlock::text("b")]);
        assert_eq!(joined_output(&text), "a\nb");
        let mut structured = CallToolResult::success(Vec::new());
        structured.structured_content = Some(serde_json::json!({"sum": 5}));
        assert_eq!(joined_output(&structured), r#"{"sum":5}"#);
    }
}
