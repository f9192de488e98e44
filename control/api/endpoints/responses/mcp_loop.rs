//! MCP tools in a response: the gateway lists each server's tools, offers
//! them to the model beside the function tools, runs the calls the model
//! makes to them and feeds the results back, up to a bound.
//!
//! Why it exists apart from the driver: what an MCP tool is (a server, a
//! session, a name that must not clash with another tool) is this module's
//! business; the driver only asks for the tools to offer, hands over the
//! calls the model made, and learns whether they all ran. The client side
//! of MCP (transport, SSRF guard, timeouts) is `crate::mcp`.

use std::collections::HashMap;

use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use super::builder::{OutputBuilder, PendingMcpCall};
use super::{McpServerPlan, Sink, unless_cancelled};
use crate::api::http::SharedState;
use crate::api::types::openai::{self, FunctionDefinition, Tool};
use crate::api::types::responses::McpToolInfo;
use crate::error::{Error, ErrorCode, Result, excerpt};
use crate::mcp::{McpServer, McpSession, McpTool};

/// Reads an `{"type": "mcp", ...}` tool.
pub(crate) fn server_plan(tool: &Map<String, Value>, path: &str) -> Result<McpServerPlan> {
    let string = |field: &str| match tool.get(field) {
        Some(Value::String(text)) if !text.is_empty() => Ok(text.clone()),
        Some(_) => Err(Error::invalid_parameter(
            &format!("{path}.{field}"),
            "must be a non-empty string",
        )),
        None => Err(Error::invalid_parameter(
            &format!("{path}.{field}"),
            format!(
                "is required for an mcp tool{}",
                if field == "server_url" {
                    " (connectors are not served here)"
                } else {
                    ""
                }
            ),
        )),
    };
    let label = string("server_label")?;
    let url = string("server_url")?;
    let headers = match tool.get("headers") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(headers)) => headers
            .iter()
            .map(|(name, value)| match value {
                Value::String(value) => Ok((name.clone(), value.clone())),
                _ => Err(Error::invalid_parameter(
                    &format!("{path}.headers.{}", excerpt(name)),
                    "must be a string",
                )),
            })
            .collect::<Result<_>>()?,
        Some(_) => {
            return Err(Error::invalid_parameter(
                &format!("{path}.headers"),
                "must be an object of strings",
            ));
        }
    };
    let names = |list: &Vec<Value>| {
        list.iter()
            .map(|name| name.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                Error::invalid_parameter(&format!("{path}.allowed_tools"), "must list tool names")
            })
    };
    let allowed_tools = match tool.get("allowed_tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(list)) => Some(names(list)?),
        Some(Value::Object(filter)) => match filter.get("tool_names") {
            Some(Value::Array(list)) => Some(names(list)?),
            _ => None,
        },
        Some(_) => {
            return Err(Error::invalid_parameter(
                &format!("{path}.allowed_tools"),
                "must be a list of tool names or {\"tool_names\": [...]}",
            ));
        }
    };
    match tool.get("require_approval") {
        None | Some(Value::Null) => {}
        Some(Value::String(never)) if never == "never" => {}
        Some(_) => {
            return Err(Error::invalid_parameter(
                &format!("{path}.require_approval"),
                "approvals are not served here: the gateway runs MCP calls itself \
                 (require_approval: \"never\")",
            ));
        }
    }
    Ok(McpServerPlan {
        label,
        url,
        headers,
        allowed_tools,
    })
}

/// Refuses, before anything runs, a server the guard refuses by its URL
/// alone (a scheme other than http(s), a private IP literal).
pub(crate) fn vet(state: &SharedState, plan: &McpServerPlan) -> Result<()> {
    let clients = state.mcp.as_ref().ok_or_else(|| {
        Error::internal("the gateway's MCP client could not be built (see its log)")
    })?;
    clients.vet(&McpServer {
        label: plan.label.clone(),
        url: plan.url.clone(),
        headers: Vec::new(),
        allowed_tools: None,
    })
}

/// A server whose tools were listed, or could not be.
#[derive(Debug)]
struct ListedServer {
    label: String,
    /// `None` when connecting or listing failed: the server offers no
    /// tools, and `error` says why.
    session: Option<McpSession>,
    tools: Vec<McpTool>,
    /// Why its tools could not be listed (its `mcp_list_tools` item's
    /// `error`).
    error: Option<String>,
}

/// The MCP servers of a response, connected and listed.
#[derive(Debug, Default)]
pub(crate) struct McpTools {
    servers: Vec<ListedServer>,
}

/// The error of a call left behind by a cancel.
const NOT_RUN_CANCELLED: &str = "not run: the response was cancelled";
/// The error of a call beyond `max_tool_calls`.
const NOT_RUN_OUT_OF_BUDGET: &str = "not run: the response reached max_tool_calls";

/// How running a generation's MCP calls went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ran {
    All,
    Cancelled,
    /// `max_tool_calls` would be passed: the calls beyond it were not run.
    OutOfBudget,
}

impl McpTools {
    /// Connects to each server and lists its tools. A server that cannot
    /// be reached or fails to list (down, refusing, too slow, an answer
    /// that is not MCP) does not fail the response, as with OpenAI: its
    /// `mcp_list_tools` item carries the `error`, and the model is offered
    /// the other servers' tools. The SSRF guard's refusal of a name that
    /// resolves to a private address stays the response's failure
    /// (`mcp_server_forbidden`), as it is for an IP literal refused before
    /// the response runs: a policy the request broke, not a server that
    /// failed. A tool name offered twice (by two
    /// servers, or by a server and a function tool) is a client error: the
    /// model could not tell which it calls.
    pub(crate) async fn list(
        state: &SharedState,
        plans: &[McpServerPlan],
        function_names: &[String],
    ) -> Result<Self> {
        let mut servers = Vec::new();
        let mut seen: HashMap<String, String> = function_names
            .iter()
            .map(|name| (name.clone(), "a function tool".to_owned()))
            .collect();
        for plan in plans {
            let server = McpServer {
                label: plan.label.clone(),
                url: plan.url.clone(),
                headers: plan.headers.clone(),
                allowed_tools: plan.allowed_tools.clone(),
            };
            let clients = state.mcp.as_ref().ok_or_else(|| {
                Error::internal("the gateway's MCP client could not be built (see its log)")
            })?;
            let listed = match clients.connect(&server).await {
                Ok(session) => session.list_tools().await.map(|tools| (session, tools)),
                Err(err) => Err(err),
            };
            let (session, tools) = match listed {
                Ok(listed) => listed,
                Err(err) if err.code == ErrorCode::McpServerForbidden => return Err(err),
                Err(err) => {
                    tracing::warn!(
                        server = %plan.label,
                        code = err.code.as_str(),
                        error = %err.message,
                        "an MCP server's tools could not be listed; the response goes on without them"
                    );
                    servers.push(ListedServer {
                        label: plan.label.clone(),
                        session: None,
                        tools: Vec::new(),
                        error: Some(format!(
                            "{}: {}",
                            err.code.as_str(),
                            err.client_message(None)
                        )),
                    });
                    continue;
                }
            };
            for tool in &tools {
                let here = format!("MCP server {}", plan.label);
                if let Some(there) = seen.insert(tool.name.clone(), here.clone()) {
                    return Err(Error::invalid_parameter(
                        "tools",
                        format!("tool {:?} is offered by {there} and by {here}", tool.name),
                    ));
                }
            }
            servers.push(ListedServer {
                label: plan.label.clone(),
                session: Some(session),
                tools,
                error: None,
            });
        }
        Ok(Self { servers })
    }

    /// Tool name → server label.
    pub(crate) fn names(&self) -> HashMap<String, String> {
        self.servers
            .iter()
            .flat_map(|server| {
                server
                    .tools
                    .iter()
                    .map(|tool| (tool.name.clone(), server.label.clone()))
            })
            .collect()
    }

    /// Each server's listing, as `mcp_list_tools` items show it (with
    /// the error of a server that could not list).
    pub(crate) fn list_items(&self) -> Vec<(String, Vec<McpToolInfo>, Option<String>)> {
        self.servers
            .iter()
            .map(|server| {
                let tools = server
                    .tools
                    .iter()
                    .map(|tool| McpToolInfo {
                        name: tool.name.clone(),
                        description: tool.description.clone(),
                        input_schema: tool.input_schema.clone(),
                        annotations: None,
                    })
                    .collect();
                (server.label.clone(), tools, server.error.clone())
            })
            .collect()
    }

    /// The tools as the model is offered them.
    pub(crate) fn chat_tools(&self) -> Vec<Tool> {
        self.servers
            .iter()
            .flat_map(|server| &server.tools)
            .map(|tool| Tool {
                kind: openai::FunctionTag,
                function: FunctionDefinition {
                    name: tool.name.clone(),
                    description: tool.description.clone(),
                    parameters: Some(tool.input_schema.clone()),
                    strict: None,
                },
            })
            .collect()
    }

    /// Runs the calls a generation made, in order, each result going into
    /// its item (an MCP tool's own error result is an output the model
    /// reads, as is a failed call). Every call's item ends done: those a
    /// stop left behind say why they were not run.
    pub(crate) async fn run_calls(
        &self,
        cancel: &CancellationToken,
        builder: &mut OutputBuilder,
        sink: &mut Sink,
        pending: Vec<PendingMcpCall>,
        calls_left: &mut u32,
    ) -> Ran {
        let mut pending = pending.into_iter();
        let ran = self
            .run_until_stopped(cancel, builder, sink, &mut pending, calls_left)
            .await;
        let reason = match ran {
            Ran::All => return ran,
            Ran::Cancelled => NOT_RUN_CANCELLED,
            Ran::OutOfBudget => NOT_RUN_OUT_OF_BUDGET,
        };
        for call in pending {
            builder.mcp_call_finished(call.output_index, Err(reason.to_owned()));
        }
        let _ = sink.emit(builder.take_events()).await;
        ran
    }

    /// Runs `pending` calls until one of them stops the loop (those after
    /// it stay in `pending`).
    async fn run_until_stopped(
        &self,
        cancel: &CancellationToken,
        builder: &mut OutputBuilder,
        sink: &mut Sink,
        pending: &mut std::vec::IntoIter<PendingMcpCall>,
        calls_left: &mut u32,
    ) -> Ran {
        for call in pending.by_ref() {
            if *calls_left == 0 {
                builder.mcp_call_finished(call.output_index, Err(NOT_RUN_OUT_OF_BUDGET.to_owned()));
                return Ran::OutOfBudget;
            }
            *calls_left -= 1;
            builder.mcp_call_started(call.output_index);
            if !sink.emit(builder.take_events()).await {
                builder.mcp_call_finished(call.output_index, Err(NOT_RUN_CANCELLED.to_owned()));
                return Ran::Cancelled;
            }
            let Some(result) = self.call(cancel, &call).await else {
                builder.mcp_call_finished(call.output_index, Err("cancelled".to_owned()));
                return Ran::Cancelled;
            };
            builder.mcp_call_finished(call.output_index, result);
            if !sink.emit(builder.take_events()).await {
                return Ran::Cancelled;
            }
        }
        Ran::All
    }

    /// Runs one call: its output, or the error the model is told; `None`
    /// when the response was cancelled first.
    async fn call(
        &self,
        cancel: &CancellationToken,
        call: &PendingMcpCall,
    ) -> Option<Result<String, String>> {
        let Some(session) = self
            .servers
            .iter()
            .find(|server| server.label == call.server_label)
            .and_then(|server| server.session.as_ref())
        else {
            return Some(Err("unknown server".to_owned()));
        };
        let arguments = if call.arguments.trim().is_empty() {
            Map::new()
        } else {
            match serde_json::from_str::<Value>(&call.arguments) {
                Ok(Value::Object(arguments)) => arguments,
                Ok(_) => {
                    return Some(Err("the model's arguments are not a JSON object".to_owned()));
                }
                Err(err) => return Some(Err(format!("the model's arguments are not JSON: {err}"))),
            }
        };
        let result = unless_cancelled(cancel, session.call_tool(&call.name, arguments)).await?;
        Some(match result {
            Ok(output) if output.is_error => Err(output.output),
            Ok(output) => Ok(output.output),
            Err(err) => Err(format!(
                "{}: {}",
                err.code.as_str(),
                err.client_message(None)
            )),
        })
    }
}
