//! `POST /parse/function_call` and `POST /parse/reasoning` (SMG's admin
//! routes): run one of the gateway's output parsers over a text an operator
//! hands in, to see what a model's output becomes before pointing clients at
//! it.
//!
//! | route | body | answer |
//! |---|---|---|
//! | `/parse/function_call` | `{"text", "tool_call_parser", "tools"?}` | `{"remaining_text", "tool_calls": [{"function": {"name", "arguments"}}], "success": true}` |
//! | `/parse/reasoning` | `{"text", "reasoning_parser", "starts_in_reasoning"?}` | `{"normal_text", "reasoning_text", "success": true}` |
//!
//! An unknown parser name is 400 `invalid_parameter` naming the known ones.
//! The whole text is parsed as one response (one push, then finish), which
//! is what streaming gives too.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::{Deserialize, Serialize};
use smg_parsers::reasoning::{self, ReasoningOptions};
use smg_parsers::tool::{self, ToolSpec};

use super::http::{SharedState, error_response};
use super::types::openai::Tool;
use super::types::parse::parse_json;
use crate::error::{Error, Result};

pub(super) fn routes() -> axum::Router<SharedState> {
    axum::Router::new()
        .route("/parse/function_call", post(function_call))
        .route("/parse/reasoning", post(reasoning_text))
}

#[derive(Debug, Deserialize)]
struct FunctionCallRequest {
    text: String,
    tool_call_parser: String,
    /// Calls to tools not listed are not calls; none listed: any name.
    #[serde(default)]
    tools: Vec<Tool>,
}

#[derive(Debug, Serialize)]
struct FunctionCallResponse {
    remaining_text: String,
    tool_calls: Vec<ParsedCall>,
    success: bool,
}

#[derive(Debug, Serialize)]
struct ParsedCall {
    function: ParsedFunction,
}

#[derive(Debug, Serialize)]
struct ParsedFunction {
    name: String,
    /// JSON text.
    arguments: String,
}

#[derive(Debug, Deserialize)]
struct ReasoningRequest {
    text: String,
    reasoning_parser: String,
    /// The prompt already opened the think block.
    #[serde(default)]
    starts_in_reasoning: bool,
}

#[derive(Debug, Serialize)]
struct ReasoningResponse {
    normal_text: String,
    reasoning_text: String,
    success: bool,
}

fn answer<T: Serialize>(outcome: Result<T>) -> Response {
    match outcome {
        Ok(body) => Json(body).into_response(),
        Err(err) => error_response(&err),
    }
}

async fn function_call(body: Bytes) -> Response {
    answer(
        parse_json::<FunctionCallRequest>(&body).and_then(|request| {
            let tools: Arc<[ToolSpec]> = request
                .tools
                .iter()
                .map(|tool| ToolSpec {
                    name: tool.function.name.clone(),
                    parameters: tool.function.parameters.clone().filter(|p| !p.is_null()),
                })
                .collect();
            let mut parser = tool::create(&request.tool_call_parser, tools)
                .map_err(|err| Error::invalid_parameter("tool_call_parser", err.to_string()))?;
            let parsed = tool::parse_complete(parser.as_mut(), &request.text);
            Ok(FunctionCallResponse {
                remaining_text: parsed.content,
                tool_calls: parsed
                    .calls
                    .into_iter()
                    .map(|call| ParsedCall {
                        function: ParsedFunction {
                            name: call.name,
                            arguments: call.arguments,
                        },
                    })
                    .collect(),
                success: true,
            })
        }),
    )
}

async fn reasoning_text(body: Bytes) -> Response {
    answer(parse_json::<ReasoningRequest>(&body).and_then(|request| {
        let options = ReasoningOptions {
            starts_in_reasoning: request.starts_in_reasoning,
            ..ReasoningOptions::default()
        };
        let mut parser = reasoning::create(&request.reasoning_parser, options)
            .map_err(|err| Error::invalid_parameter("reasoning_parser", err.to_string()))?;
        let parsed = reasoning::parse_complete(parser.as_mut(), &request.text);
        Ok(ReasoningResponse {
            normal_text: parsed.content,
            reasoning_text: parsed.reasoning,
            success: true,
        })
    }))
}
