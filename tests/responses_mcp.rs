//! The Responses API's MCP loop end to end: a gateway process, a scripted
//! Qwen3 sim worker and a real MCP server process (`smg-mcp-test-server`).
//!
//! Why it exists: the loop's parts (listing a server's tools, offering them
//! to the model, running its calls, feeding the results back, the
//! `max_tool_calls` bound, replaying calls in a chain) are unit-tested one
//! by one; only whole processes show that they fit: that a call the model
//! writes as Hermes `<tool_call>` text reaches the server, that its result
//! reaches the next prompt, and that the items and events a client sees
//! tell that story in order, whole or streamed.
//!
//! How a prompt is proved: the worker's script answers by a substring of
//! the prompt it gets (first matching line wins), so a line that matches
//! only a tool's output (inside Qwen3's `<tool_response>` block) proves
//! that output reached the model.

mod support;

use futures::StreamExt;
use serde_json::{Value, json};
use support::chat::{FamilyModel, Script, http, script};
use support::mcp::McpTestServer;
use support::responses::{create, events, get, names, output_text, parse_events, post};
use support::{Gateway, SimWorker, bounded, poll_until};

const QWEN3: &str = "Qwen/Qwen3-8B";

/// A gateway on a scripted Qwen3 worker, and an MCP server to call
/// (stopped in that order: the gateway ends its MCP sessions while the
/// server still answers).
struct Fleet {
    gateway: Gateway,
    _worker: SimWorker,
    _script: Script,
    mcp: McpTestServer,
}

impl Fleet {
    /// `lines` is the worker's script; `allow_loopback` whether the gateway
    /// may call MCP servers on 127.0.0.1.
    fn start_with(lines: &[Value], allow_loopback: bool) -> Fleet {
        let model = FamilyModel::new("qwen3", QWEN3);
        let mcp = McpTestServer::start(&[]);
        let script = script(lines);
        let worker = model.worker("regular", &script);
        let url = worker.grpc_url();
        let mut args = vec!["--worker-urls", url.as_str()];
        if allow_loopback {
            args.extend(["--mcp-allow-private-host", "127.0.0.1"]);
        }
        let gateway = model.gateway(&args);
        Fleet {
            gateway,
            _worker: worker,
            _script: script,
            mcp,
        }
    }

    fn start(lines: &[Value]) -> Fleet {
        Fleet::start_with(lines, true)
    }

    /// The test server as a request's `mcp` tool.
    fn calc(&self) -> Value {
        json!({"type": "mcp", "server_label": "calc", "server_url": self.mcp.url,
               "require_approval": "never"})
    }
}

/// A Qwen3 completion: a think block, then `rest`.
fn think(reasoning: &str, rest: &str) -> String {
    format!("<think>\n{reasoning}\n</think>\n\n{rest}")
}

/// A Hermes tool call as Qwen3 writes it.
fn call(name: &str, arguments: Value) -> String {
    let call = json!({"name": name, "arguments": arguments});
    format!("<tool_call>\n{call}\n</tool_call>")
}

/// How Qwen3's template shows the model a tool's output.
fn tool_response(output: &str) -> String {
    format!("<tool_response>\n{output}\n</tool_response>")
}

const SUM: &str = "What is 2 plus 3?";
const SUM_ANSWER: &str = "The sum is 5.";

/// The model calls `add` {a: 2, b: 3}, then answers from its result.
fn sum_script() -> Vec<Value> {
    vec![
        json!({"when": tool_response("5"), "text": think("The tool said 5.", SUM_ANSWER)}),
        json!({"when": SUM, "text": think("I should add.", &call("add", json!({"a": 2, "b": 3})))}),
    ]
}

fn sum_request(fleet: &Fleet) -> Value {
    json!({"model": QWEN3, "input": SUM, "tools": [fleet.calc()], "max_output_tokens": 300})
}

/// The output items' types, in order.
fn kinds(response: &Value) -> Vec<&str> {
    response["output"]
        .as_array()
        .expect("output")
        .iter()
        .map(|item| item["type"].as_str().expect("type"))
        .collect()
}

/// The output items of type `kind`.
fn items<'a>(response: &'a Value, kind: &str) -> Vec<&'a Value> {
    response["output"]
        .as_array()
        .expect("output")
        .iter()
        .filter(|item| item["type"] == kind)
        .collect()
}

/// A call item's arguments, parsed.
fn arguments(item: &Value) -> Value {
    serde_json::from_str(item["arguments"].as_str().expect("arguments")).expect("JSON arguments")
}

/// Checks what every stream must hold (sequence numbers 0, 1, 2, ...;
/// each item added once and done once, in order) and returns the final
/// response.
fn check_stream(events: &[(String, Value)]) -> Value {
    for (number, (_, data)) in events.iter().enumerate() {
        assert_eq!(
            data["sequence_number"],
            number as u64,
            "{:?}",
            names(events)
        );
    }
    let indexes = |name: &str| -> Vec<u64> {
        events
            .iter()
            .filter(|(event, _)| event == name)
            .map(|(_, data)| data["output_index"].as_u64().expect("output_index"))
            .collect()
    };
    let added = indexes("response.output_item.added");
    assert_eq!(added, (0..added.len() as u64).collect::<Vec<_>>());
    assert_eq!(
        indexes("response.output_item.done"),
        added,
        "{:?}",
        names(events)
    );
    let (_, last) = events.last().expect("events");
    let response = last["response"].clone();
    let output = response["output"].as_array().expect("output");
    assert_eq!(output.len(), added.len());
    // Each item's done event carries the item as it ends.
    for (_, data) in events
        .iter()
        .filter(|(name, _)| name == "response.output_item.done")
    {
        let index = data["output_index"].as_u64().expect("index") as usize;
        assert_eq!(data["item"], output[index]);
    }
    response
}

/// The event names with reasoning left out, each item's added/done event
/// naming the item's type, and runs of one delta event counted once.
fn shape(events: &[(String, Value)]) -> Vec<String> {
    let mut shape: Vec<String> = Vec::new();
    for (name, data) in events {
        let kind = data["item"]["type"].as_str();
        if name.starts_with("response.reasoning_text") || kind == Some("reasoning") {
            continue;
        }
        let entry = match kind {
            Some(kind) => format!("{name} {kind}"),
            None => name.clone(),
        };
        if shape.last() != Some(&entry) {
            shape.push(entry);
        }
    }
    shape
}

/// The usage of a chat completion over `messages` with `tools`.
async fn chat_usage(fleet: &Fleet, messages: Value, tools: &Value) -> (u64, u64) {
    let (status, body) = post(
        &fleet.gateway,
        "/v1/chat/completions",
        &json!({"model": QWEN3, "messages": messages, "tools": tools, "max_tokens": 300}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let count = |field: &str| body["usage"][field].as_u64().expect("a token count");
    (count("prompt_tokens"), count("completion_tokens"))
}

#[tokio::test]
async fn a_whole_response_runs_the_models_mcp_call_and_answers_from_its_result() {
    let fleet = Fleet::start(&sum_script());
    let response = bounded("the response", create(&fleet.gateway, sum_request(&fleet))).await;
    assert_eq!(response["status"], "completed", "{response}");
    assert_eq!(response["error"], Value::Null);
    assert_eq!(response["incomplete_details"], Value::Null);
    assert_eq!(
        kinds(&response),
        [
            "mcp_list_tools",
            "reasoning",
            "mcp_call",
            "reasoning",
            "message"
        ]
    );

    let listing = &response["output"][0];
    assert_eq!(listing["server_label"], "calc");
    assert_eq!(listing["error"], Value::Null);
    let tools = listing["tools"].as_array().expect("tools");
    let tool_names: Vec<&str> = tools
        .iter()
        .map(|tool| tool["name"].as_str().expect("name"))
        .collect();
    assert_eq!(
        tool_names,
        ["add", "echo", "fail", "slow", "big", "echo_header"]
    );
    assert_eq!(
        tools[0],
        json!({"name": "add", "description": "Adds two numbers.",
               "input_schema": {"type": "object",
                   "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                   "required": ["a", "b"]},
               "annotations": null})
    );

    let mcp_call = &response["output"][2];
    assert_eq!(mcp_call["server_label"], "calc");
    assert_eq!(mcp_call["name"], "add");
    assert_eq!(arguments(mcp_call), json!({"a": 2, "b": 3}));
    assert_eq!(mcp_call["output"], "5");
    assert_eq!(mcp_call["error"], Value::Null);
    assert_eq!(mcp_call["status"], "completed");
    assert_eq!(
        response["output"][1]["content"][0]["text"],
        "\nI should add.\n"
    );
    assert_eq!(output_text(&response), SUM_ANSWER);
    assert_eq!(response["output"][4]["status"], "completed");

    // The usage is both generations'. Their prompts, sent again as chat
    // completions with the same tools, cost what the response reports.
    let offered: Value = tools
        .iter()
        .map(|tool| {
            json!({"type": "function", "function": {"name": tool["name"],
                   "description": tool["description"], "parameters": tool["input_schema"]}})
        })
        .collect();
    let first = chat_usage(&fleet, json!([{"role": "user", "content": SUM}]), &offered).await;
    let second = chat_usage(
        &fleet,
        json!([
            {"role": "user", "content": SUM},
            {"role": "assistant", "content": null, "reasoning_content": "\nI should add.\n",
             "tool_calls": [{"id": mcp_call["id"], "type": "function",
                 "function": {"name": "add", "arguments": mcp_call["arguments"]}}]},
            {"role": "tool", "tool_call_id": mcp_call["id"], "content": "5"},
        ]),
        &offered,
    )
    .await;
    let usage = &response["usage"];
    assert_eq!(
        usage["input_tokens"].as_u64(),
        Some(first.0 + second.0),
        "{usage}"
    );
    assert_eq!(
        usage["output_tokens"].as_u64(),
        Some(first.1 + second.1),
        "{usage}"
    );
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(first.0 + second.0 + first.1 + second.1)
    );

    // In the background the same loop runs to the same output.
    let mut request = sum_request(&fleet);
    request["background"] = json!(true);
    let queued = create(&fleet.gateway, request).await;
    assert_eq!(queued["status"], "queued", "{queued}");
    let path = format!("/v1/responses/{}", queued["id"].as_str().expect("id"));
    let done = poll_until("the background response ends", async || {
        let (_, stored) = get(&fleet.gateway, &path).await;
        let running = stored["status"] == "queued" || stored["status"] == "in_progress";
        (!running).then_some(stored)
    })
    .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(kinds(&done), kinds(&response));
    assert_eq!(done["output"][2]["output"], "5");
    assert_eq!(output_text(&done), output_text(&response));
}

#[tokio::test]
async fn a_streamed_response_tells_the_mcp_call_as_it_runs_and_is_stored_as_streamed() {
    let fleet = Fleet::start(&sum_script());
    let mut request = sum_request(&fleet);
    request["stream"] = json!(true);
    let events = bounded("the stream", events(&fleet.gateway, &request)).await;
    let response = check_stream(&events);
    assert_eq!(
        shape(&events),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added mcp_list_tools",
            "response.mcp_list_tools.in_progress",
            "response.mcp_list_tools.completed",
            "response.output_item.done mcp_list_tools",
            "response.output_item.added mcp_call",
            "response.mcp_call_arguments.delta",
            "response.mcp_call_arguments.done",
            "response.mcp_call.in_progress",
            "response.mcp_call.completed",
            "response.output_item.done mcp_call",
            "response.output_item.added message",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done message",
            "response.completed",
        ]
    );
    assert_eq!(response["status"], "completed");
    let mcp_call = items(&response, "mcp_call")[0].clone();
    assert_eq!(mcp_call["output"], "5");
    assert_eq!(mcp_call["status"], "completed");
    // The argument deltas add up to the arguments, all about this call.
    let of_call = |name: &str| -> Vec<&Value> {
        events
            .iter()
            .filter(|(event, _)| event == name)
            .map(|(_, data)| data)
            .collect()
    };
    let deltas = of_call("response.mcp_call_arguments.delta");
    let streamed: String = deltas
        .iter()
        .map(|data| data["delta"].as_str().expect("delta"))
        .collect();
    assert_eq!(streamed, mcp_call["arguments"].as_str().expect("arguments"));
    let done = of_call("response.mcp_call_arguments.done");
    assert_eq!(done[0]["arguments"], mcp_call["arguments"]);
    for name in [
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.in_progress",
        "response.mcp_call.completed",
    ] {
        for data in of_call(name) {
            assert_eq!(data["item_id"], mcp_call["id"], "{name}");
        }
    }
    assert_eq!(output_text(&response), SUM_ANSWER);

    let id = response["id"].as_str().expect("id");
    let (status, stored) = get(&fleet.gateway, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 200, "{stored}");
    assert_eq!(stored, response);
}

/// One of two MCP servers is down (its process was stopped, so its port
/// refuses): as with OpenAI, its `mcp_list_tools` item carries the `error`
/// (and `response.mcp_list_tools.failed` is streamed), and the response
/// goes on with the other server's tools: the model's call to `add` runs
/// and it answers. Whole and streamed tell the same story; the stored
/// response is the streamed one.
#[tokio::test]
async fn a_server_that_cannot_list_its_tools_is_an_error_item_and_the_response_goes_on() {
    let fleet = Fleet::start(&sum_script());
    let down = McpTestServer::start(&[]);
    let down_url = down.url.clone();
    drop(down);
    let mut request = sum_request(&fleet);
    request["tools"] = json!([
        {"type": "mcp", "server_label": "down", "server_url": down_url,
         "require_approval": "never"},
        fleet.calc(),
    ]);
    let whole = bounded("the response", create(&fleet.gateway, request.clone())).await;
    request["stream"] = json!(true);
    let events = bounded("the stream", events(&fleet.gateway, &request)).await;
    let streamed = check_stream(&events);
    assert_eq!(
        shape(&events)[..10],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added mcp_list_tools",
            "response.mcp_list_tools.in_progress",
            "response.mcp_list_tools.failed",
            "response.output_item.done mcp_list_tools",
            "response.output_item.added mcp_list_tools",
            "response.mcp_list_tools.in_progress",
            "response.mcp_list_tools.completed",
            "response.output_item.done mcp_list_tools",
        ]
    );
    for response in [&whole, &streamed] {
        assert_eq!(response["status"], "completed", "{response}");
        assert_eq!(response["error"], Value::Null);
        assert_eq!(
            kinds(response),
            [
                "mcp_list_tools",
                "mcp_list_tools",
                "reasoning",
                "mcp_call",
                "reasoning",
                "message"
            ]
        );
        let failed = &response["output"][0];
        assert_eq!(failed["server_label"], "down");
        assert_eq!(failed["tools"], json!([]));
        let error = failed["error"].as_str().expect("an error");
        assert!(error.starts_with("mcp_server_unavailable: "), "{error}");
        let listed = &response["output"][1];
        assert_eq!(listed["server_label"], "calc");
        assert_eq!(listed["error"], Value::Null);
        assert!(!listed["tools"].as_array().expect("tools").is_empty());
        let mcp_call = &response["output"][3];
        assert_eq!(
            (&mcp_call["name"], &mcp_call["output"]),
            (&json!("add"), &json!("5"))
        );
        assert_eq!(output_text(response), SUM_ANSWER);
    }
    let id = streamed["id"].as_str().expect("id");
    let (status, stored) = get(&fleet.gateway, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 200, "{stored}");
    assert_eq!(stored, streamed);
}

const FAIL: &str = "Try the tool that fails.";
const FAIL_ANSWER: &str = "The tool failed.";

#[tokio::test]
async fn a_failing_tool_is_a_failed_call_and_the_model_is_told_why() {
    let fleet = Fleet::start(&[
        json!({"when": tool_response("error: the fail tool always fails"),
               "text": think("It failed.", FAIL_ANSWER)}),
        json!({"when": FAIL, "text": think("Trying it.", &call("fail", json!({})))}),
    ]);
    let request =
        json!({"model": QWEN3, "input": FAIL, "tools": [fleet.calc()], "max_output_tokens": 300});
    let whole = bounded("the response", create(&fleet.gateway, request.clone())).await;
    let mut streamed_request = request;
    streamed_request["stream"] = json!(true);
    let events = bounded("the stream", events(&fleet.gateway, &streamed_request)).await;
    let streamed = check_stream(&events);
    let names = names(&events);
    assert!(names.contains(&"response.mcp_call.failed"), "{names:?}");
    assert!(!names.contains(&"response.mcp_call.completed"), "{names:?}");
    for response in [&whole, &streamed] {
        assert_eq!(response["status"], "completed", "{response}");
        assert_eq!(
            kinds(response),
            [
                "mcp_list_tools",
                "reasoning",
                "mcp_call",
                "reasoning",
                "message"
            ]
        );
        let mcp_call = &response["output"][2];
        assert_eq!(mcp_call["name"], "fail");
        assert_eq!(mcp_call["status"], "failed");
        assert_eq!(mcp_call["error"], "the fail tool always fails");
        assert_eq!(mcp_call["output"], Value::Null);
        assert_eq!(output_text(response), FAIL_ANSWER);
    }
}

#[tokio::test]
async fn max_tool_calls_stops_the_loop_and_says_which_calls_did_not_run() {
    // The first generation calls add once; the second, told 5, calls it
    // twice more. One call is allowed.
    let again = format!(
        "{}\n{}",
        call("add", json!({"a": 5, "b": 5})),
        call("add", json!({"a": 1, "b": 1}))
    );
    let fleet = Fleet::start(&[
        json!({"when": tool_response("5"), "text": think("Add more.", &again)}),
        json!({"when": SUM, "text": think("I should add.", &call("add", json!({"a": 2, "b": 3})))}),
    ]);
    let mut request = sum_request(&fleet);
    request["max_tool_calls"] = json!(1);
    let whole = bounded("the response", create(&fleet.gateway, request.clone())).await;
    request["stream"] = json!(true);
    let events = bounded("the stream", events(&fleet.gateway, &request)).await;
    let streamed = check_stream(&events);
    assert_eq!(
        events.last().map(|(name, _)| name.as_str()),
        Some("response.incomplete")
    );
    for response in [&whole, &streamed] {
        assert_eq!(response["status"], "incomplete", "{response}");
        assert_eq!(response["incomplete_details"]["reason"], "max_tool_calls");
        assert_eq!(response["max_tool_calls"], 1);
        assert_eq!(
            kinds(response),
            [
                "mcp_list_tools",
                "reasoning",
                "mcp_call",
                "reasoning",
                "mcp_call",
                "mcp_call"
            ]
        );
        let calls = items(response, "mcp_call");
        assert_eq!(calls[0]["status"], "completed");
        assert_eq!(calls[0]["output"], "5");
        for not_run in &calls[1..] {
            assert_eq!(not_run["status"], "failed", "{not_run}");
            assert_eq!(not_run["output"], Value::Null);
            let error = not_run["error"].as_str().expect("an error");
            assert!(
                error.contains("not run") && error.contains("max_tool_calls"),
                "{error}"
            );
        }
        assert_eq!(arguments(calls[2]), json!({"a": 1, "b": 1}));
    }
}

const MIXED: &str = "Add 2 and 3, then tell me the weather in Paris.";
const MIXED_ANSWER: &str = "5, and it is sunny in Paris.";

fn weather_tool() -> Value {
    json!({"type": "function", "name": "get_weather",
           "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}})
}

#[tokio::test]
async fn an_mcp_call_beside_a_function_call_runs_and_the_client_continues_the_loop() {
    let both = format!(
        "{}\n{}",
        call("add", json!({"a": 2, "b": 3})),
        call("get_weather", json!({"city": "Paris"}))
    );
    // Both results answer the one assistant turn that asked for them.
    let answered = format!(
        "{}\n{}<|im_end|>",
        tool_response("5"),
        tool_response("sunny in Paris")
    );
    let fleet = Fleet::start(&[
        json!({"when": answered, "text": think("Both answered.", MIXED_ANSWER)}),
        json!({"when": MIXED, "text": think("Two tools.", &both)}),
    ]);
    let tools = json!([fleet.calc(), weather_tool()]);
    let first = bounded(
        "the response",
        create(
            &fleet.gateway,
            json!({"model": QWEN3, "input": MIXED, "tools": tools, "max_output_tokens": 300}),
        ),
    )
    .await;
    assert_eq!(first["status"], "completed", "{first}");
    assert_eq!(
        kinds(&first),
        ["mcp_list_tools", "reasoning", "mcp_call", "function_call"]
    );
    let mcp_call = &first["output"][2];
    assert_eq!(mcp_call["output"], "5");
    assert_eq!(mcp_call["status"], "completed");
    let function_call = &first["output"][3];
    assert_eq!(function_call["name"], "get_weather");
    assert_eq!(function_call["status"], "completed");
    assert_eq!(arguments(function_call), json!({"city": "Paris"}));

    let follow_up = bounded(
        "the follow-up",
        create(
            &fleet.gateway,
            json!({"model": QWEN3, "previous_response_id": first["id"], "tools": tools,
                   "max_output_tokens": 300,
                   "input": [{"type": "function_call_output",
                              "call_id": function_call["call_id"],
                              "output": "sunny in Paris"}]}),
        ),
    )
    .await;
    assert_eq!(follow_up["status"], "completed", "{follow_up}");
    assert_eq!(
        kinds(&follow_up),
        ["mcp_list_tools", "reasoning", "message"]
    );
    assert_eq!(output_text(&follow_up), MIXED_ANSWER);
}

/// A 400 with `code` (and `param`, when given) as OpenAI shows an error.
fn assert_rejected(status: u16, body: &Value, code: &str, param: Option<&str>) {
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    if let Some(param) = param {
        assert_eq!(body["error"]["param"], param, "{body}");
    }
}

#[tokio::test]
async fn a_loopback_server_is_forbidden_unless_allowed() {
    let fleet = Fleet::start_with(&sum_script(), false);
    let mut request = sum_request(&fleet);
    let (status, body) = bounded(
        "the response",
        post(&fleet.gateway, "/v1/responses", &request),
    )
    .await;
    assert_rejected(status, &body, "mcp_server_forbidden", None);

    // An IP literal is vetted before anything runs: a streamed request is
    // refused as a whole one is.
    request["stream"] = json!(true);
    let (status, body) = bounded(
        "the response",
        post(&fleet.gateway, "/v1/responses", &request),
    )
    .await;
    assert_rejected(status, &body, "mcp_server_forbidden", None);

    // A name is vetted when it resolves, once the stream has begun: the
    // response fails.
    let url = request["tools"][0]["server_url"]
        .as_str()
        .expect("server_url")
        .replace("127.0.0.1", "localhost");
    request["tools"][0]["server_url"] = json!(url);
    let events = bounded("the stream", events(&fleet.gateway, &request)).await;
    let failed = check_stream(&events);
    assert_eq!(
        events.last().map(|(name, _)| name.as_str()),
        Some("response.failed")
    );
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["error"]["code"], "mcp_server_forbidden");
}

#[tokio::test]
async fn tool_name_clashes_and_approvals_are_client_errors() {
    let fleet = Fleet::start(&sum_script());
    let clash = json!({"type": "function", "name": "add",
                       "parameters": {"type": "object", "properties": {}}});
    let (status, body) = bounded(
        "the clash",
        post(
            &fleet.gateway,
            "/v1/responses",
            &json!({"model": QWEN3, "input": SUM, "tools": [fleet.calc(), clash]}),
        ),
    )
    .await;
    assert_rejected(status, &body, "invalid_parameter", Some("tools"));
    let message = body["error"]["message"].as_str().expect("message");
    assert!(message.contains("\"add\""), "{message}");

    let mut always = fleet.calc();
    always["require_approval"] = json!("always");
    let (status, body) = bounded(
        "the approval",
        post(
            &fleet.gateway,
            "/v1/responses",
            &json!({"model": QWEN3, "input": SUM, "tools": [always]}),
        ),
    )
    .await;
    assert_rejected(
        status,
        &body,
        "invalid_parameter",
        Some("tools[0].require_approval"),
    );
}

const DOUBLE: &str = "Now double it.";
const DOUBLE_ANSWER: &str = "Doubled, it is 10.";

#[tokio::test]
async fn a_chain_replays_an_mcp_call_and_its_output() {
    // Matches only if the follow-up's prompt holds the first response's
    // call result, its answer, then the new question.
    let replayed = format!(
        "{}<|im_end|>\n<|im_start|>assistant\n{SUM_ANSWER}<|im_end|>\n\
         <|im_start|>user\n{DOUBLE}",
        tool_response("5")
    );
    let mut lines = vec![
        json!({"when": replayed, "text": think("5 doubled.", DOUBLE_ANSWER)}),
        json!({"when": DOUBLE, "text": "The first response was not replayed as expected."}),
    ];
    lines.extend(sum_script());
    let fleet = Fleet::start(&lines);
    let first = bounded("the response", create(&fleet.gateway, sum_request(&fleet))).await;
    assert_eq!(first["status"], "completed", "{first}");
    let follow_up = bounded(
        "the follow-up",
        create(
            &fleet.gateway,
            json!({"model": QWEN3, "previous_response_id": first["id"], "input": DOUBLE,
                   "max_output_tokens": 300}),
        ),
    )
    .await;
    assert_eq!(follow_up["status"], "completed", "{follow_up}");
    assert_eq!(output_text(&follow_up), DOUBLE_ANSWER);
    // Without an mcp tool in this request, no server is listed again.
    assert_eq!(kinds(&follow_up), ["reasoning", "message"]);
}

const STALL: &str = "Take your time, then add 2 and 3.";

#[tokio::test]
async fn cancelling_during_a_call_ends_it_and_the_calls_after_it() {
    let both = format!(
        "{}\n{}",
        call("slow", json!({"ms": 60_000})),
        call("add", json!({"a": 2, "b": 3}))
    );
    let fleet = Fleet::start(&[json!({"when": STALL, "text": think("Slowly.", &both)})]);
    let request = json!({"model": QWEN3, "input": STALL, "tools": [fleet.calc()],
                         "max_output_tokens": 300, "stream": true});
    let response = http()
        .post(fleet.gateway.url("/v1/responses"))
        .json(&request)
        .send()
        .await
        .expect("request sent");
    assert_eq!(response.status().as_u16(), 200);
    let mut body = response.bytes_stream();
    let mut text = String::new();
    // Read until the gateway says it is running the slow call.
    bounded("the slow call starts", async {
        while !text.contains("event: response.mcp_call.in_progress\n") {
            let piece = body.next().await.expect("more").expect("bytes");
            text.push_str(std::str::from_utf8(&piece).expect("UTF-8"));
        }
    })
    .await;
    let (whole_frames, _) = text.rsplit_once("\n\n").expect("a whole frame");
    let started = parse_events(whole_frames);
    let id = started[0].1["response"]["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let (status, cancelled) = bounded(
        "the cancel",
        post(
            &fleet.gateway,
            &format!("/v1/responses/{id}/cancel"),
            &json!({}),
        ),
    )
    .await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(cancelled["status"], "cancelled");
    let calls = items(&cancelled, "mcp_call");
    assert_eq!(calls.len(), 2, "{cancelled}");
    assert_eq!(calls[0]["name"], "slow");
    assert_eq!(calls[0]["status"], "failed");
    assert_eq!(calls[0]["error"], "cancelled");
    assert_eq!(calls[1]["name"], "add");
    assert_eq!(calls[1]["status"], "failed");
    assert_eq!(calls[1]["error"], "not run: the response was cancelled");

    // The stream ends telling the same.
    bounded("the rest of the stream", async {
        while let Some(piece) = body.next().await {
            text.push_str(std::str::from_utf8(&piece.expect("bytes")).expect("UTF-8"));
        }
    })
    .await;
    let events = parse_events(&text);
    let streamed = check_stream(&events);
    assert_eq!(
        events.last().map(|(name, _)| name.as_str()),
        Some("response.cancelled")
    );
    assert_eq!(streamed, cancelled);
}
