//! `smg-mcp-test-server`: a real MCP server (rmcp's streamable-HTTP
//! service on axum) for the gateway's MCP tests, so they exercise the
//! protocol as a third-party server speaks it rather than a stand-in.
//!
//! Tools: `add` ({a, b} → the sum), `echo` ({text} → text), `fail` (an
//! `isError` result), `slow` ({ms} → sleeps, then answers; for deadlines),
//! `big` ({bytes} → that many `x`), `echo_header` ({name} → that request
//! header's value, or `<none>`). With `--require-bearer TOKEN` every request
//! without `authorization: Bearer TOKEN` gets a 401; with `--page-size N`
//! the tool list comes in pages of N.
//!
//! Once bound it prints one line to stdout:
//! `listening on http://127.0.0.1:PORT/mcp`.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use clap::Parser;
use http::StatusCode;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, JsonObject,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, ServerHandler};
use serde_json::{Value, json};

#[derive(Debug, Parser)]
#[command(about = "An MCP server for smg's tests")]
struct Args {
    /// Port on 127.0.0.1; 0 picks a free one.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Refuse (401) every request without `authorization: Bearer TOKEN`.
    #[arg(long, value_name = "TOKEN")]
    require_bearer: Option<String>,
    /// Tools per page of the tool list; 0: one page.
    #[arg(long, default_value_t = 0)]
    page_size: usize,
}

/// The tools, their schemas typed out by hand (the tests compare them).
fn tools() -> Vec<Tool> {
    let tool = |name: &'static str, description: &'static str, schema: Value| {
        let schema = schema.as_object().cloned().unwrap_or_default();
        Tool::new(name, description, Arc::new(schema))
    };
    vec![
        tool(
            "add",
            "Adds two numbers.",
            json!({
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"]
            }),
        ),
        tool(
            "echo",
            "Answers with its text.",
            json!({
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"]
            }),
        ),
        tool(
            "fail",
            "Always reports an error.",
            json!({"type": "object", "properties": {}}),
        ),
        tool(
            "slow",
            "Sleeps ms milliseconds, then answers.",
            json!({
                "type": "object",
                "properties": {"ms": {"type": "integer", "minimum": 0}},
                "required": ["ms"]
            }),
        ),
        tool(
            "big",
            "Answers with that many bytes of x.",
            json!({
                "type": "object",
                "properties": {"bytes": {"type": "integer", "minimum": 0}},
                "required": ["bytes"]
            }),
        ),
        tool(
            "echo_header",
            "Answers with the value of one of the request's HTTP headers.",
            json!({
                "type": "object",
                "properties": {"name": {"type": "string"}},
                "required": ["name"]
            }),
        ),
    ]
}

#[derive(Debug, Clone)]
struct TestTools {
    page_size: usize,
}

fn argument<'a>(arguments: &'a JsonObject, name: &str) -> Result<&'a Value, ErrorData> {
    arguments
        .get(name)
        .ok_or_else(|| ErrorData::invalid_params(format!("missing argument {name:?}"), None))
}

fn number(arguments: &JsonObject, name: &str) -> Result<f64, ErrorData> {
    argument(arguments, name)?
        .as_f64()
        .ok_or_else(|| ErrorData::invalid_params(format!("{name} is not a number"), None))
}

fn count(arguments: &JsonObject, name: &str) -> Result<u64, ErrorData> {
    argument(arguments, name)?
        .as_u64()
        .ok_or_else(|| ErrorData::invalid_params(format!("{name} is not a count"), None))
}

fn text<'a>(arguments: &'a JsonObject, name: &str) -> Result<&'a str, ErrorData> {
    argument(arguments, name)?
        .as_str()
        .ok_or_else(|| ErrorData::invalid_params(format!("{name} is not a string"), None))
}

impl ServerHandler for TestTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let all = tools();
        if self.page_size == 0 {
            return Ok(ListToolsResult::with_all_items(all));
        }
        let start = match request.and_then(|params| params.cursor) {
            Some(cursor) => cursor
                .parse::<usize>()
                .map_err(|_| ErrorData::invalid_params("bad cursor", None))?,
            None => 0,
        };
        let end = (start + self.page_size).min(all.len());
        let page = all.get(start..end).unwrap_or_default().to_vec();
        let mut result = ListToolsResult::with_all_items(page);
        result.next_cursor = (end < all.len()).then(|| end.to_string());
        Ok(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = request.arguments.unwrap_or_default();
        let answer =
            |text: String| Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into());
        match request.name.as_ref() {
            "add" => {
                let sum = number(&arguments, "a")? + number(&arguments, "b")?;
                answer(sum.to_string())
            }
            "echo" => answer(text(&arguments, "text")?.to_owned()),
            "fail" => Ok(CallToolResult::error(vec![ContentBlock::text(
                "the fail tool always fails",
            )])
            .into()),
            "slow" => {
                let ms = count(&arguments, "ms")?;
                tokio::time::sleep(Duration::from_millis(ms)).await;
                answer(format!("slept {ms} ms"))
            }
            "big" => {
                let bytes = usize::try_from(count(&arguments, "bytes")?)
                    .map_err(|_| ErrorData::invalid_params("bytes is too large", None))?;
                answer("x".repeat(bytes))
            }
            "echo_header" => {
                let name = text(&arguments, "name")?;
                let value = context
                    .extensions
                    .get::<http::request::Parts>()
                    .and_then(|parts| parts.headers.get(name))
                    .and_then(|value| value.to_str().ok())
                    .unwrap_or("<none>");
                answer(value.to_owned())
            }
            other => Err(ErrorData::invalid_params(
                format!("no tool named {other:?}"),
                None,
            )),
        }
    }
}

/// 401 unless the request carries `authorization: Bearer TOKEN`.
async fn require_bearer(expected: Arc<str>, request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok());
    if given == Some(&*expected) {
        next.run(request).await
    } else {
        (StatusCode::UNAUTHORIZED, "a bearer token is required").into_response()
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let tools = TestTools {
        page_size: args.page_size,
    };
    let service = StreamableHttpService::new(
        move || Ok(tools.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let mut router = axum::Router::new().nest_service("/mcp", service);
    if let Some(token) = args.require_bearer {
        let expected: Arc<str> = format!("Bearer {token}").into();
        router = router.layer(axum::middleware::from_fn(move |request, next| {
            require_bearer(Arc::clone(&expected), request, next)
        }));
    }
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port))
        .await
        .context("binding the listener")?;
    let address = listener.local_addr()?;
    let mut stdout = std::io::stdout();
    writeln!(stdout, "listening on http://{address}/mcp")?;
    stdout.flush()?;
    axum::serve(listener, router).await.context("serving MCP")?;
    Ok(())
}
