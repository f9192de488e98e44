//! The gateway's MCP client (`smg::mcp`) against a real MCP server process
//! (`smg-mcp-test-server`, rmcp's server side): listing tools with their
//! schemas, `allowed_tools`, calls and tool errors, deadlines, the result
//! cap, the SSRF guard, unreachable and non-MCP servers, and headers.
//!
//! Every test bounds itself with [`bounded`], so a hang fails instead of
//! stalling the suite.

mod support;

use std::future::Future;
use std::time::Duration;

use serde_json::{Map, Value, json};
use smg::error::{Error, ErrorCode};
use smg::mcp::{McpCallOutput, McpClients, McpConfig, McpServer, McpSession};
use support::mcp::McpTestServer;

/// The longest any test may take.
const TEST_DEADLINE: Duration = Duration::from_secs(60);

async fn bounded<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(TEST_DEADLINE, future)
        .await
        .expect("the test finished within its deadline")
}

/// Limits for tests, loopback allowed (the test server is on 127.0.0.1).
fn config() -> McpConfig {
    McpConfig {
        allow_private_hosts: vec!["127.0.0.1".parse().expect("allowance")],
        ..McpConfig::default()
    }
}

fn clients(config: McpConfig) -> McpClients {
    McpClients::new(config).expect("the MCP client builds")
}

fn server(url: &str) -> McpServer {
    McpServer {
        label: "test".to_owned(),
        url: url.to_owned(),
        headers: Vec::new(),
        allowed_tools: None,
    }
}

async fn connect(config: McpConfig, server: McpServer) -> McpSession {
    clients(config)
        .connect(&server)
        .await
        .expect("the session opens")
}

async fn connect_error(config: McpConfig, server: McpServer) -> Error {
    match clients(config).connect(&server).await {
        Ok(session) => panic!("{} connected", session.label()),
        Err(error) => error,
    }
}

fn arguments(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("{other} is not an object"),
    }
}

async fn call(session: &McpSession, tool: &str, args: Value) -> Result<McpCallOutput, Error> {
    session.call_tool(tool, arguments(args)).await
}

fn names(tools: &[smg::mcp::McpTool]) -> Vec<&str> {
    tools.iter().map(|tool| tool.name.as_str()).collect()
}

#[tokio::test]
async fn tools_are_listed_in_order_with_their_schemas_intact() {
    let mcp = McpTestServer::start(&[]);
    bounded(async {
        let session = connect(config(), server(&mcp.url)).await;
        let tools = session.list_tools().await.expect("tools/list");
        assert_eq!(
            names(&tools),
            ["add", "echo", "fail", "slow", "big", "echo_header"]
        );
        let add = &tools[0];
        assert_eq!(add.description.as_deref(), Some("Adds two numbers."));
        // Typed out by hand, as the server declares it.
        assert_eq!(
            add.input_schema,
            json!({
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"]
            })
        );
        assert_eq!(
            tools[3].input_schema,
            json!({
                "type": "object",
                "properties": {"ms": {"type": "integer", "minimum": 0}},
                "required": ["ms"]
            })
        );
        session.close().await;
    })
    .await;
}

#[tokio::test]
async fn every_page_of_a_paged_list_is_read() {
    let mcp = McpTestServer::start(&["--page-size", "2"]);
    bounded(async {
        let session = connect(config(), server(&mcp.url)).await;
        let tools = session.list_tools().await.expect("tools/list");
        assert_eq!(
            names(&tools),
            ["add", "echo", "fail", "slow", "big", "echo_header"]
        );
        let mut only_big = server(&mcp.url);
        only_big.allowed_tools = Some(vec!["big".to_owned()]);
        let session = connect(config(), only_big).await;
        assert_eq!(
            names(&session.list_tools().await.expect("tools/list")),
            ["big"]
        );
    })
    .await;
}

#[tokio::test]
async fn allowed_tools_limit_both_the_list_and_the_calls() {
    let mcp = McpTestServer::start(&[]);
    bounded(async {
        let mut limited = server(&mcp.url);
        limited.allowed_tools = Some(vec!["echo".to_owned(), "add".to_owned()]);
        let session = connect(config(), limited).await;
        let tools = session.list_tools().await.expect("tools/list");
        assert_eq!(names(&tools), ["add", "echo"], "the server's order");
        assert!(session.allows("add"));
        assert!(!session.allows("fail"));
        let refused = call(&session, "fail", json!({}))
            .await
            .expect_err("fail is not allowed");
        assert_eq!(refused.code, ErrorCode::InvalidRequest, "{refused}");
        assert!(refused.message.contains("allowed_tools"), "{refused}");
    })
    .await;
}

#[tokio::test]
async fn the_tool_list_is_capped_in_count() {
    let mcp = McpTestServer::start(&[]);
    bounded(async {
        let session = connect(
            McpConfig {
                max_tools: 5,
                ..config()
            },
            server(&mcp.url),
        )
        .await;
        let error = session.list_tools().await.expect_err("six tools");
        assert_eq!(error.code, ErrorCode::McpResultTooLarge, "{error}");
        assert!(error.message.contains("more than 5 tools"), "{error}");
    })
    .await;
}

#[tokio::test]
async fn calls_answer_with_the_tools_text() {
    let mcp = McpTestServer::start(&[]);
    bounded(async {
        let session = connect(config(), server(&mcp.url)).await;
        let sum = call(&session, "add", json!({"a": 2, "b": 3}))
            .await
            .expect("add");
        assert_eq!(
            sum,
            McpCallOutput {
                output: "5".to_owned(),
                is_error: false
            }
        );
        let echoed = call(&session, "echo", json!({"text": "héllo\n\"world\""}))
            .await
            .expect("echo");
        assert_eq!(echoed.output, "héllo\n\"world\"");
        assert!(!echoed.is_error);
    })
    .await;
}

#[tokio::test]
async fn a_tools_own_error_is_a_result_for_the_model() {
    let mcp = McpTestServer::start(&[]);
    bounded(async {
        let session = connect(config(), server(&mcp.url)).await;
        let failed = call(&session, "fail", json!({})).await.expect("a result");
        assert!(failed.is_error);
        assert_eq!(failed.output, "the fail tool always fails");
    })
    .await;
}

#[tokio::test]
async fn a_json_rpc_error_is_the_servers_failure() {
    let mcp = McpTestServer::start(&[]);
    bounded(async {
        let session = connect(config(), server(&mcp.url)).await;
        let error = call(&session, "add", json!({"a": 2}))
            .await
            .expect_err("b is missing");
        assert_eq!(error.code, ErrorCode::McpServerUnavailable, "{error}");
        assert!(error.message.contains("missing argument"), "{error}");
        // The session is still good.
        let sum = call(&session, "add", json!({"a": 1, "b": 1})).await;
        assert_eq!(sum.expect("add").output, "2");
    })
    .await;
}

#[tokio::test]
async fn a_slow_call_times_out_and_the_session_survives() {
    let mcp = McpTestServer::start(&[]);
    bounded(async {
        let session = connect(
            McpConfig {
                call_timeout: Duration::from_millis(300),
                ..config()
            },
            server(&mcp.url),
        )
        .await;
        // The tool would take a minute; the deadline is 300 ms.
        let error = call(&session, "slow", json!({"ms": 60_000}))
            .await
            .expect_err("over the deadline");
        assert_eq!(error.code, ErrorCode::McpTimeout, "{error}");
        assert!(!error.retryable(), "a tool call is never retried");
        let echoed = call(&session, "echo", json!({"text": "still here"})).await;
        assert_eq!(echoed.expect("echo").output, "still here");
    })
    .await;
}

#[tokio::test]
async fn a_result_over_the_cap_is_refused_whole() {
    let mcp = McpTestServer::start(&[]);
    bounded(async {
        let limits = McpConfig {
            max_result_bytes: 1000,
            ..config()
        };
        let session = connect(limits.clone(), server(&mcp.url)).await;
        let at_cap = call(&session, "big", json!({"bytes": 1000})).await;
        assert_eq!(at_cap.expect("at the cap").output, "x".repeat(1000));
        // Just over: read, then refused.
        let over = call(&session, "big", json!({"bytes": 1001}))
            .await
            .expect_err("over the cap");
        assert_eq!(over.code, ErrorCode::McpResultTooLarge, "{over}");
        assert!(over.message.contains("1001 bytes"), "{over}");
        // Far over: the HTTP answer itself is cut off at its cap.
        let far = limits.max_answer_bytes() * 4;
        let session = connect(limits, server(&mcp.url)).await;
        let error = call(&session, "big", json!({"bytes": far}))
            .await
            .expect_err("far over the cap");
        assert_eq!(error.code, ErrorCode::McpResultTooLarge, "{error}");
        assert!(error.message.contains("answer is larger than"), "{error}");
    })
    .await;
}

#[tokio::test]
async fn loopback_servers_are_refused_without_an_allowance() {
    let mcp = McpTestServer::start(&[]);
    bounded(async {
        // An IP literal (vetted before connecting) and a name (vetted by
        // the resolver).
        for url in [mcp.url.clone(), mcp.url_by_name()] {
            let error = connect_error(McpConfig::default(), server(&url)).await;
            assert_eq!(error.code, ErrorCode::McpServerForbidden, "{url}: {error}");
            assert!(
                error.message.contains("only fetches from public addresses"),
                "{url}: {error}"
            );
        }
        // Allowing one address does not allow its neighbour.
        let other = McpConfig {
            allow_private_hosts: vec!["127.0.0.2".parse().expect("allowance")],
            ..McpConfig::default()
        };
        let error = connect_error(other, server(&mcp.url)).await;
        assert_eq!(error.code, ErrorCode::McpServerForbidden, "{error}");
        for url in ["file:///etc/passwd", "grpc://127.0.0.1:1/"] {
            let error = connect_error(config(), server(url)).await;
            assert_eq!(error.code, ErrorCode::McpServerForbidden, "{url}: {error}");
        }
        let error = connect_error(config(), server("not a url")).await;
        assert_eq!(error.code, ErrorCode::InvalidRequest, "{error}");
        // With the allowance, by name too.
        let by_name = McpConfig {
            allow_private_hosts: vec!["localhost".parse().expect("allowance")],
            ..McpConfig::default()
        };
        let session = connect(by_name, server(&mcp.url_by_name())).await;
        assert_eq!(session.list_tools().await.expect("tools/list").len(), 6);
    })
    .await;
}

#[tokio::test]
async fn an_unreachable_server_is_unavailable() {
    // A port that was free a moment ago and has no listener now.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    bounded(async {
        let url = format!("http://127.0.0.1:{port}/mcp");
        let error = connect_error(config(), server(&url)).await;
        assert_eq!(error.code, ErrorCode::McpServerUnavailable, "{error}");
    })
    .await;
}

#[tokio::test]
async fn a_url_that_is_not_an_mcp_endpoint_is_unavailable() {
    let mcp = McpTestServer::start(&[]);
    bounded(async {
        let url = mcp.url.replace("/mcp", "/elsewhere");
        let error = connect_error(config(), server(&url)).await;
        assert_eq!(error.code, ErrorCode::McpServerUnavailable, "{error}");
        assert!(error.message.contains("404"), "{error}");
    })
    .await;
}

#[tokio::test]
async fn the_tools_headers_reach_the_server() {
    let mcp = McpTestServer::start(&[]);
    bounded(async {
        let mut with_headers = server(&mcp.url);
        with_headers.headers = vec![("X-Smg-Test".to_owned(), "from the request".to_owned())];
        let session = connect(config(), with_headers).await;
        let seen = call(&session, "echo_header", json!({"name": "x-smg-test"})).await;
        assert_eq!(seen.expect("echo_header").output, "from the request");
        let absent = call(&session, "echo_header", json!({"name": "x-other"})).await;
        assert_eq!(absent.expect("echo_header").output, "<none>");

        let mut reserved = server(&mcp.url);
        reserved.headers = vec![("mcp-session-id".to_owned(), "forged".to_owned())];
        let error = connect_error(config(), reserved).await;
        assert_eq!(error.code, ErrorCode::InvalidRequest, "{error}");
    })
    .await;
}

#[tokio::test]
async fn a_server_requiring_a_token_gets_it_from_the_headers() {
    let mcp = McpTestServer::start(&["--require-bearer", "test"]);
    bounded(async {
        let error = connect_error(config(), server(&mcp.url)).await;
        assert_eq!(error.code, ErrorCode::McpServerUnauthorized, "{error}");
        assert!(error.message.contains("401"), "{error}");

        let mut wrong = server(&mcp.url);
        wrong.headers = vec![("authorization".to_owned(), "Bearer nope".to_owned())];
        let error = connect_error(config(), wrong).await;
        assert_eq!(error.code, ErrorCode::McpServerUnauthorized, "{error}");

        let mut right = server(&mcp.url);
        right.headers = vec![("Authorization".to_owned(), "Bearer test".to_owned())];
        let session = connect(config(), right).await;
        let sum = call(&session, "add", json!({"a": 2, "b": 3})).await;
        assert_eq!(sum.expect("add").output, "5");
    })
    .await;
}
