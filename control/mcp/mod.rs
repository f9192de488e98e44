//! MCP tools: the gateway as a Model Context Protocol client.
//!
//! Why it exists: a Responses request may carry `{"type": "mcp",
//! "server_label", "server_url", "headers", "allowed_tools"}` tools. The
//! gateway, not the client, then lists that server's tools for the model,
//! runs the calls the model makes and feeds the results back (the loop lives
//! in `responses`). That makes the gateway open connections to URLs a client
//! chose, from inside the operator's network, and read whatever comes back:
//! the same exposure as image URLs, with the same answer. Every connection
//! goes through the media SSRF guard ([`crate::media::guard`]; loopback and
//! private servers only under `--mcp-allow-private-host`), every exchange
//! has a deadline, and every answer a byte cap.
//!
//! The protocol (the `initialize` handshake, sessions, JSON or SSE answers,
//! paged tool lists) is the official Rust SDK's, `rmcp`. Its own HTTP client
//! is reqwest 0.13, built without our resolver; so the transport runs on
//! [`http::GuardedHttp`], our reqwest client implementing rmcp's
//! `StreamableHttpClient`, and nothing in rmcp dials on its own.
//!
//! - [`session`]: [`McpClients`] (one per gateway) and [`McpSession`] (one
//!   per server per request): list tools, call one.
//! - [`http`]: the guarded HTTP under the transport, its byte caps, and the
//!   [`http::HttpFailure`] each failed exchange is classified as.
//!
//! Failures carry stable codes: `mcp_server_forbidden` (the guard),
//! `mcp_server_unauthorized` (401/403), `mcp_server_unavailable`,
//! `mcp_timeout`, `mcp_result_too_large`. A tool's own error result
//! (`isError`) is not a failure: it is an [`McpCallOutput`] with `is_error`,
//! for the model to read.

pub mod http;
pub mod session;

use std::time::Duration;

use crate::media::PrivateHostAllowance;

pub use session::{McpClients, McpSession};

/// How the gateway talks to MCP servers. Part of
/// [`crate::config::GatewayConfig`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpConfig {
    /// Hosts or networks MCP servers may be at although they are not public
    /// (`--mcp-allow-private-host`); the media guard's syntax.
    pub allow_private_hosts: Vec<PrivateHostAllowance>,
    /// Time to reach a server and finish the `initialize` handshake.
    pub connect_timeout: Duration,
    /// Time for one tool listing or one tool call (`--mcp-call-timeout-secs`).
    pub call_timeout: Duration,
    /// The largest tool result, in bytes of its joined text; a larger one
    /// is refused (`mcp_result_too_large`), never cut. No HTTP answer is read
    /// past [`McpConfig::max_answer_bytes`].
    pub max_result_bytes: usize,
    /// The most tools one server may list (after `allowed_tools`); a longer
    /// list is refused, since every tool's schema goes into the prompt.
    pub max_tools: usize,
}

impl McpConfig {
    /// Room for JSON-RPC framing, escaping and the tool list's schemas
    /// around a result of `max_result_bytes`.
    const ANSWER_SLACK_BYTES: usize = 256 * 1024;

    /// The most bytes read from one HTTP answer (a JSON body, or one SSE
    /// stream): twice the result cap, since JSON escaping may double text,
    /// plus slack for framing.
    pub fn max_answer_bytes(&self) -> usize {
        self.max_result_bytes
            .saturating_mul(2)
            .saturating_add(Self::ANSWER_SLACK_BYTES)
    }
}

impl Default for McpConfig {
    fn default() -> Self {
        Self {
            allow_private_hosts: Vec::new(),
            connect_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(30),
            max_result_bytes: 1 << 20,
            max_tools: 128,
        }
    }
}

/// One MCP server a request names (an `mcp` tool).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpServer {
    /// The request's `server_label`: how the model and the output items
    /// name this server.
    pub label: String,
    /// `http://` or `https://`, the streamable-HTTP endpoint.
    pub url: String,
    /// Sent with every request to the server (`authorization` among them).
    pub headers: Vec<(String, String)>,
    /// Only these tools are listed and may be called; `None`: all.
    pub allowed_tools: Option<Vec<String>>,
}

/// A tool as the server lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct McpTool {
    pub name: String,
    pub description: Option<String>,
    /// The JSON Schema of its arguments, as the server sent it.
    pub input_schema: serde_json::Value,
}

/// What a tool call answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpCallOutput {
    /// The result's text blocks joined by newlines; when it has none, its
    /// structured content as JSON. Images, audio and resources are left
    /// out (the model reads text).
    pub output: String,
    /// The tool reported an error (`isError`); `output` says what.
    pub is_error: bool,
}
