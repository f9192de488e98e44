//! OpenAI's Responses API: `/v1/responses` and the stored responses behind
//! it.
//!
//! Why it exists: a response is more than one generation. Its input may
//! continue a stored chain (`previous_response_id`) or a conversation, its
//! tools may include MCP servers the gateway calls itself between
//! generations, it is stored when done, it may run in the background and be
//! cancelled while it runs. This module plans a response ([`plan`]: every
//! check and every history read happen before anything is generated, so a
//! bad request is an HTTP error, not a failed stream), runs it ([`execute`]:
//! generations through the router's chat pipeline, with `convert` building
//! their chat requests and `builder` their output items and stream events),
//! and stores it. Streamed, whole and background responses run the same
//! code; they differ only in where the events go ([`Sink`]).

mod builder;
mod convert;
mod mcp_loop;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use smg_history::{ConversationItem, StoredResponse};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use self::builder::OutputBuilder;
use self::convert::Messages;
use super::super::admit::HeldPermit;
use super::super::auth::Tenant;
use super::super::dialect::{ErrorDialect, render};
use super::super::http::{SharedState, named_frame, sse_response};
use super::super::types::openai::{Tool, ToolChoice};
use super::super::types::parse::parse_json;
use super::super::types::responses::{
    ConversationRef, IncompleteDetails, Item, ItemStatus, OutputTokensDetails, ResponseError,
    ResponseObject, ResponseObjectTag, ResponseStatus, ResponseUsage, ResponsesRequest, Sequenced,
    StreamEvent, TextConfig, ids, parse_input,
};
use super::super::types::tools::ToolsJson;
use super::{limits, routing_key};
use crate::error::{Error, ErrorCode, Result, excerpt};
use crate::history::History;
use crate::metrics;
use crate::offload::Offload;
use crate::pipeline::Endpoint;
use crate::pipeline::parsing::ParsedText;
use crate::pipeline::request_context::{carried, client_request_id};
use crate::pipeline::respond::{FinishReason, OutputEvent};
use crate::router::Router;

/// The longest `previous_response_id` chain replayed.
pub(super) const MAX_CHAIN_STEPS: usize = 1000;
/// The most items a conversation replays into one response.
pub(super) const MAX_CONVERSATION_ITEMS: usize = 10_000;
/// MCP calls one response may run, unless `max_tool_calls` says fewer.
pub(super) const DEFAULT_MAX_TOOL_CALLS: u32 = 16;
/// How long a cancel waits for the response to stop.
const CANCEL_WAIT: Duration = Duration::from_secs(30);
/// How often a cancel of a response another gateway runs reads it back,
/// waiting for it to end: first after this, then twice as long each time,
/// up to [`CANCEL_POLL_MOST`].
const CANCEL_POLL_FIRST: Duration = Duration::from_millis(20);
const CANCEL_POLL_MOST: Duration = Duration::from_millis(500);

/// Responses running on this gateway, by id: what cancels them and where
/// their final object appears.
#[derive(Debug, Default)]
pub struct InFlightResponses {
    running: Mutex<HashMap<String, InFlight>>,
}

#[derive(Debug, Clone)]
struct InFlight {
    cancel: CancellationToken,
    done: watch::Receiver<Option<Value>>,
}

/// A running response's entry; removed (exactly once) when dropped.
struct InFlightGuard<'a> {
    registry: &'a InFlightResponses,
    id: String,
    done: watch::Sender<Option<Value>>,
}

impl InFlightResponses {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, InFlight>> {
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn register(&self, id: &str, cancel: CancellationToken) -> InFlightGuard<'_> {
        let (done, receiver) = watch::channel(None);
        self.lock().insert(
            id.to_owned(),
            InFlight {
                cancel,
                done: receiver,
            },
        );
        InFlightGuard {
            registry: self,
            id: id.to_owned(),
            done,
        }
    }

    fn get(&self, id: &str) -> Option<InFlight> {
        self.lock().get(id).cloned()
    }

    /// Cancels the response `id` if it runs here; `true` if so. (What
    /// another gateway's cancel, recorded in the history store, comes to.)
    pub(crate) fn cancel(&self, id: &str) -> bool {
        self.get(id).is_some_and(|running| {
            running.cancel.cancel();
            true
        })
    }

    /// How many responses are running (for tests and shutdown logs).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl InFlightGuard<'_> {
    fn finish(&self, object: Value) {
        self.done.send_replace(Some(object));
    }
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.id);
    }
}

/// An MCP server a request names, with its tools once listed.
#[derive(Debug, Clone)]
pub(crate) struct McpServerPlan {
    pub label: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub allowed_tools: Option<Vec<String>>,
}

/// Everything a response is made from, checked before it runs.
struct Plan {
    request: Arc<ResponsesRequest>,
    id: String,
    created_at: i64,
    router: Arc<Router>,
    model: String,
    /// History, instructions and input, as chat messages.
    messages: Messages,
    /// This request's own input items (what is stored as its input).
    input_items: Arc<[Item]>,
    /// The function tools, in chat shape.
    tools: Arc<[Tool]>,
    /// `tools` as a chat request's text (see [`convert::chat_tools`]).
    chat_tools: Option<ToolsJson>,
    /// The tools as the client sent them (echoed in the response).
    tools_echo: Arc<[Value]>,
    choice: Option<ToolChoice>,
    mcp_servers: Vec<McpServerPlan>,
    conversation_id: Option<String>,
    store: bool,
    background: bool,
    stream: bool,
    routing_key: Option<String>,
    /// The body was large or continues a history: work proportional to
    /// the request (its messages, tools and stored form) runs off the
    /// request threads.
    heavy: bool,
}

/// Unix seconds, as stored objects carry their creation time.
pub(crate) fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX)
        })
}

/// Reads stored items back (`what` names them in the error).
fn stored_items(value: &Value, what: &str) -> Result<Vec<Item>> {
    let Value::Array(items) = value else {
        return Err(Error::new(
            ErrorCode::HistoryUnavailable,
            format!("{what} is not a list in the history store"),
        ));
    };
    items
        .iter()
        .map(|item| {
            Item::from_input(item, what).map_err(|err| {
                Error::new(
                    ErrorCode::HistoryUnavailable,
                    format!("{what} holds an unreadable item: {}", err.message),
                )
            })
        })
        .collect()
}

/// The chain a `previous_response_id` names, oldest first, checked (every
/// step there, none still running); its items are read by
/// [`Prior::into_items`].
async fn chain_steps(history: &History, previous: &str) -> Result<Vec<StoredResponse>> {
    let chain = history
        .response_chain(previous, MAX_CHAIN_STEPS + 1)
        .await?;
    let Some(oldest) = chain.first() else {
        return Err(Error::new(
            ErrorCode::PreviousResponseNotFound,
            format!("previous response {} does not exist", excerpt(previous)),
        )
        .with_param("previous_response_id"));
    };
    if chain.len() > MAX_CHAIN_STEPS {
        return Err(Error::invalid_parameter(
            "previous_response_id",
            format!("its chain is longer than {MAX_CHAIN_STEPS} responses"),
        ));
    }
    if let Some(missing) = &oldest.previous_response_id {
        return Err(Error::new(
            ErrorCode::PreviousResponseNotFound,
            format!(
                "the chain of {} continues response {missing}, which was deleted",
                excerpt(previous)
            ),
        )
        .with_param("previous_response_id"));
    }
    if let Some(step) = chain.iter().find(|step| {
        step.status == ResponseStatus::InProgress.as_str()
            || step.status == ResponseStatus::Queued.as_str()
    }) {
        return Err(Error::invalid_parameter(
            "previous_response_id",
            format!("response {} is still {}", step.id, step.status),
        ));
    }
    Ok(chain)
}

/// The stored items of a conversation, oldest first, as the history holds
/// them (read by [`Prior::into_items`]).
async fn conversation_values(history: &History, id: &str) -> Result<Vec<Value>> {
    if history.get_conversation(id).await?.is_none() {
        return Err(Error::new(
            ErrorCode::ConversationNotFound,
            format!("conversation {} does not exist", excerpt(id)),
        )
        .with_param("conversation"));
    }
    let mut items = Vec::new();
    let mut after = None;
    loop {
        let page = history
            .list_items(
                id,
                &smg_history::PageRequest {
                    limit: 100,
                    order: smg_history::Order::Asc,
                    after: after.take(),
                },
            )
            .await?;
        let last = page.items.last().map(|stored| stored.id.clone());
        items.extend(page.items.into_iter().map(|stored| stored.item));
        if items.len() > MAX_CONVERSATION_ITEMS {
            return Err(Error::invalid_parameter(
                "conversation",
                format!("it holds more than {MAX_CONVERSATION_ITEMS} items"),
            ));
        }
        match (page.has_more, last) {
            (true, Some(last)) => after = Some(last),
            _ => return Ok(items),
        }
    }
}

/// What a request continues, as read from the history.
enum Prior {
    Nothing,
    Chain(Vec<StoredResponse>),
    Conversation { id: String, items: Vec<Value> },
}

impl Prior {
    fn is_nothing(&self) -> bool {
        matches!(self, Prior::Nothing)
    }

    /// The items replayed before the request's own, oldest first.
    fn into_items(self) -> Result<Vec<Item>> {
        match self {
            Prior::Nothing => Ok(Vec::new()),
            Prior::Chain(chain) => {
                let mut items = Vec::new();
                for step in &chain {
                    items.extend(stored_items(&step.input, &format!("input of {}", step.id))?);
                    items.extend(stored_items(
                        &step.output,
                        &format!("output of {}", step.id),
                    )?);
                }
                Ok(items)
            }
            Prior::Conversation { id, items } => items
                .iter()
                .map(|stored| {
                    Item::from_input(stored, "conversation item").map_err(|err| {
                        Error::new(
                            ErrorCode::HistoryUnavailable,
                            format!(
                                "conversation {id} holds an unreadable item: {}",
                                err.message
                            ),
                        )
                    })
                })
                .collect(),
        }
    }
}

/// A request read and checked, before its history is: everything
/// [`Draft::read`] takes from the body alone (and the gateway's state).
struct Draft {
    request: ResponsesRequest,
    router: Arc<Router>,
    model: String,
    input_items: Vec<Item>,
    tools: Vec<Tool>,
    tools_echo: Arc<[Value]>,
    choice: Option<ToolChoice>,
    mcp_servers: Vec<McpServerPlan>,
    store: bool,
    background: bool,
}

impl Draft {
    /// Parses and checks `body`. Proportional to it: [`plan`] runs it off
    /// the request threads for a large body.
    fn read(state: &SharedState, body: &[u8]) -> Result<Self> {
        let mut request: ResponsesRequest = parse_json(body)?;
        let history = &state.history;
        if request.conversation.is_some() && request.previous_response_id.is_some() {
            return Err(Error::new(
                ErrorCode::MutuallyExclusiveParameters,
                "conversation and previous_response_id cannot be used together",
            )
            .with_param("conversation"));
        }
        let background = request.background.unwrap_or(false);
        let store = request.store.unwrap_or(true) && history.keeps_anything();
        if background {
            history.require("background")?;
            if request.store == Some(false) {
                return Err(Error::invalid_parameter(
                    "background",
                    "a background response must be stored (store: true)",
                ));
            }
        }
        let (router, model) = state.router_for(request.model.as_deref())?;
        let model = model.unwrap_or_else(|| router.model().name.clone());
        // Read once into items; the parsed JSON is not kept.
        let input_items = parse_input(request.input.take().as_ref())?;
        if input_items.is_empty() {
            return Err(Error::invalid_parameter("input", "must not be empty"));
        }

        let mut tools = Vec::new();
        let mut mcp_servers = Vec::new();
        for (index, tool) in request.tools.iter().flatten().enumerate() {
            let path = format!("tools[{index}]");
            let Value::Object(object) = tool else {
                return Err(Error::invalid_parameter(&path, "a tool must be an object"));
            };
            match object.get("type").and_then(Value::as_str) {
                Some("function") => tools.push(convert::function_tool(object, &path)?),
                Some("mcp") => {
                    let server = mcp_loop::server_plan(object, &path)?;
                    mcp_loop::vet(state, &server)?;
                    mcp_servers.push(server);
                }
                other => {
                    return Err(Error::new(
                        ErrorCode::UnsupportedTool,
                        format!(
                            "tool type {} is not served here (function and mcp tools are)",
                            other.map_or_else(
                                || "(none)".to_owned(),
                                |kind| format!("{:?}", excerpt(kind))
                            )
                        ),
                    )
                    .with_param(format!("{path}.type")));
                }
            }
        }
        let choice = convert::tool_choice(request.tool_choice.as_ref())?;
        let tools_echo: Arc<[Value]> = request.tools.take().unwrap_or_default().into();
        Ok(Self {
            request,
            router,
            model,
            input_items,
            tools,
            tools_echo,
            choice,
            mcp_servers,
            store,
            background,
        })
    }

    /// The plan, with `prior` (the history it continues) read into
    /// messages and every parameter checked as the first generation will
    /// see it. Proportional to the body and the history: [`plan`] runs it
    /// off the request threads when either is large.
    fn into_plan(self, state: &SharedState, prior: Prior, head: PlanHead) -> Result<Plan> {
        let Draft {
            request,
            router,
            model,
            input_items,
            tools,
            tools_echo,
            choice,
            mcp_servers,
            store,
            background,
        } = self;
        let prior = prior.into_items()?;
        let mut messages = Messages::default();
        if let Some(instructions) = &request.instructions {
            messages.system(instructions);
        }
        for item in prior.iter().chain(&input_items) {
            messages.push(item);
        }
        drop(prior);
        let stream = request.stream.unwrap_or(false);
        let chat_tools = convert::chat_tools(&tools)?;
        let plan = Plan {
            id: head.id,
            created_at: now_unix(),
            router,
            model,
            messages,
            input_items: input_items.into(),
            tools: tools.into(),
            chat_tools,
            tools_echo,
            choice,
            mcp_servers,
            conversation_id: head.conversation_id,
            store,
            background,
            stream,
            routing_key: head.routing_key,
            heavy: head.heavy,
            request: Arc::new(request),
        };
        // Every parameter is checked now, not when the first generation runs.
        plan.chat_spec(state, plan.chat_tools.as_ref())?;
        Ok(plan)
    }
}

/// What [`plan`] knows of a response besides its body.
struct PlanHead {
    id: String,
    conversation_id: Option<String>,
    routing_key: Option<String>,
    heavy: bool,
}

/// Checks a request and reads its history into a [`Plan`]. Reading the
/// body and converting it with its history cost time in proportion to
/// them: for a body over [`Offload::INLINE_BYTES`], or any history, that
/// work runs off the request threads (see `crate::offload`), as does every
/// later step of the response that is proportional to them.
async fn plan(state: &SharedState, headers: &HeaderMap, owner: &str, body: Bytes) -> Result<Plan> {
    let large = !Offload::is_small(body.len());
    let draft = {
        let state = Arc::clone(state);
        state
            .offload
            .clone()
            .run_when(large, move || Draft::read(&state, &body))
            .await?
    };
    let history = &state.history;
    let conversation_id = draft
        .request
        .conversation
        .as_ref()
        .map(|conversation| conversation.id().to_owned());
    let prior = match (&draft.request.previous_response_id, &conversation_id) {
        (Some(previous), _) => {
            history.require("previous_response_id")?;
            if !ids::owned_by(previous, owner) {
                return Err(
                    not_found_response(previous, ErrorCode::PreviousResponseNotFound)
                        .with_param("previous_response_id"),
                );
            }
            Prior::Chain(chain_steps(history, previous).await?)
        }
        (None, Some(conversation)) => {
            history.require("conversation")?;
            if !ids::owned_by(conversation, owner) {
                return Err(Error::new(
                    ErrorCode::ConversationNotFound,
                    format!("conversation {} does not exist", excerpt(conversation)),
                )
                .with_param("conversation"));
            }
            Prior::Conversation {
                items: conversation_values(history, conversation).await?,
                id: conversation.clone(),
            }
        }
        (None, None) => Prior::Nothing,
    };
    // A history is as large as the responses it holds, whatever this body.
    let heavy = large || !prior.is_nothing();
    let head = PlanHead {
        id: ids::mint_owned(ids::RESPONSE, owner),
        conversation_id,
        routing_key: routing_key(headers),
        heavy,
    };
    let state = Arc::clone(state);
    state
        .offload
        .clone()
        .run_when(heavy, move || draft.into_plan(&state, prior, head))
        .await
}

impl Plan {
    /// The chat request of the next generation, as the pipeline's spec.
    fn chat_spec(
        &self,
        state: &SharedState,
        tools: Option<&ToolsJson>,
    ) -> Result<crate::pipeline::spec::GenerationSpec> {
        chat_spec(
            &self.request,
            self.model.clone(),
            &self.messages,
            tools,
            self.choice.clone(),
            self.stream,
            &limits(state),
        )
    }

    /// [`Plan::chat_spec`] for the next generation, offering `tools`: off
    /// the request threads for a heavy plan (each generation's chat
    /// request copies and converts every message and tool).
    async fn next_spec(
        &mut self,
        state: &SharedState,
        tools: &mut Option<ToolsJson>,
    ) -> Result<crate::pipeline::spec::GenerationSpec> {
        if !self.heavy {
            return self.chat_spec(state, tools.as_ref());
        }
        let messages = std::mem::take(&mut self.messages);
        let offered = tools.take();
        let request = Arc::clone(&self.request);
        let (model, choice, stream, limits) = (
            self.model.clone(),
            self.choice.clone(),
            self.stream,
            limits(state),
        );
        let (messages, offered, spec) = state
            .offload
            .run(move || {
                let spec = chat_spec(
                    &request,
                    model,
                    &messages,
                    offered.as_ref(),
                    choice,
                    stream,
                    &limits,
                );
                Ok((messages, offered, spec))
            })
            .await?;
        self.messages = messages;
        *tools = offered;
        spec
    }

    /// What the response's stored form is made from.
    fn record(&self) -> Record {
        Record {
            id: self.id.clone(),
            previous_response_id: self.request.previous_response_id.clone(),
            conversation_id: self.conversation_id.clone(),
            model: self.model.clone(),
            created_at: self.created_at,
            input_items: Arc::clone(&self.input_items),
        }
    }

    /// [`Record::stored`] for `object`: off the request threads for a
    /// heavy plan (its input items and the object, tools echoed included,
    /// are converted in full).
    async fn stored(
        &self,
        state: &SharedState,
        object: &ResponseObject,
    ) -> Result<(StoredResponse, Vec<ConversationItem>)> {
        let record = self.record();
        let instance = state.history.instance().to_owned();
        if !self.heavy {
            return Ok(record.stored(object, &instance));
        }
        let object = object.clone();
        state
            .offload
            .run(move || Ok(record.stored(&object, &instance)))
            .await
    }

    /// The response object in `status` with `output`.
    fn object(
        &self,
        status: ResponseStatus,
        output: Vec<Item>,
        usage: Option<ResponseUsage>,
        error: Option<&Error>,
        incomplete: Option<&'static str>,
    ) -> ResponseObject {
        let request = &self.request;
        ResponseObject {
            id: self.id.clone(),
            object: ResponseObjectTag,
            created_at: self.created_at,
            status,
            background: self.background,
            error: error.map(|err| ResponseError {
                code: err.code.as_str().to_owned(),
                message: err.client_message(client_request_id().as_deref()),
            }),
            incomplete_details: incomplete.map(|reason| IncompleteDetails { reason }),
            instructions: request.instructions.clone(),
            max_output_tokens: request.max_output_tokens,
            max_tool_calls: request.max_tool_calls,
            model: self.model.clone(),
            output,
            parallel_tool_calls: request.parallel_tool_calls.unwrap_or(true),
            previous_response_id: request.previous_response_id.clone(),
            conversation: self
                .conversation_id
                .clone()
                .map(|id| ConversationRef { id }),
            reasoning: request.reasoning.clone().unwrap_or_default(),
            store: self.store,
            temperature: request.temperature,
            text: request.text.clone().unwrap_or(TextConfig {
                format: Some(super::super::types::responses::TextFormat::Text),
            }),
            tool_choice: request
                .tool_choice
                .clone()
                .unwrap_or_else(|| Value::from("auto")),
            tools: Arc::clone(&self.tools_echo),
            top_p: request.top_p,
            truncation: "disabled",
            usage,
            user: request.user.clone(),
            metadata: request.metadata.clone().unwrap_or_default(),
        }
    }
}

/// The chat request for `request`'s next generation from `messages`, as
/// the pipeline's spec.
fn chat_spec(
    request: &ResponsesRequest,
    model: String,
    messages: &Messages,
    tools: Option<&ToolsJson>,
    choice: Option<ToolChoice>,
    stream: bool,
    limits: &super::super::types::validate::Limits,
) -> Result<crate::pipeline::spec::GenerationSpec> {
    let chat = convert::chat_request(
        request,
        model,
        messages.messages(),
        tools.cloned(),
        choice,
        stream,
    );
    chat.to_spec(limits)
}

/// What a response's stored form is made from; cheap to clone.
struct Record {
    id: String,
    previous_response_id: Option<String>,
    conversation_id: Option<String>,
    model: String,
    created_at: i64,
    input_items: Arc<[Item]>,
}

impl Record {
    /// The stored form of `object`, and the items it adds to its
    /// conversation. While it is in flight it is owned by `instance`, the
    /// gateway running it (so its orphan can be found if that one dies).
    fn stored(
        &self,
        object: &ResponseObject,
        instance: &str,
    ) -> (StoredResponse, Vec<ConversationItem>) {
        let input: Vec<Value> = self.input_items.iter().map(Item::to_value).collect();
        let output: Vec<Value> = object.output.iter().map(Item::to_value).collect();
        let items = match &self.conversation_id {
            Some(conversation_id) if object.status.is_terminal() => self
                .input_items
                .iter()
                .chain(&object.output)
                .map(|item| ConversationItem {
                    id: item.id().to_owned(),
                    conversation_id: conversation_id.clone(),
                    created_at: self.created_at,
                    item: item.to_value(),
                })
                .collect(),
            _ => Vec::new(),
        };
        let response = StoredResponse {
            id: self.id.clone(),
            previous_response_id: self.previous_response_id.clone(),
            conversation_id: self.conversation_id.clone(),
            model: self.model.clone(),
            status: object.status.as_str().to_owned(),
            created_at: self.created_at,
            input: Value::Array(input),
            output: Value::Array(output),
            raw: serde_json::to_value(object).unwrap_or(Value::Null),
            owner: (!object.status.is_terminal()).then(|| instance.to_owned()),
        };
        (response, items)
    }
}

/// Where a running response's events go.
struct Sink {
    frames: Option<mpsc::Sender<Bytes>>,
    sequence: u64,
    /// A background response goes on when its client leaves.
    detached: bool,
}

impl Sink {
    fn collecting(detached: bool) -> Self {
        Self {
            frames: None,
            sequence: 0,
            detached,
        }
    }

    /// Sends `events`; false when the client has gone and the response
    /// should stop.
    async fn emit(&mut self, events: Vec<StreamEvent>) -> bool {
        let Some(frames) = &self.frames else {
            return true;
        };
        for event in events {
            let frame = named_frame(
                event.name(),
                &Sequenced {
                    event: &event,
                    sequence_number: self.sequence,
                },
            );
            self.sequence += 1;
            if frames.send(frame).await.is_err() {
                self.frames = None;
                return self.detached;
            }
        }
        true
    }
}

/// How a response ended.
#[derive(Debug)]
enum Outcome {
    Completed,
    Incomplete(&'static str),
    Failed(Error),
    Cancelled,
}

/// Waits for `work` unless the response is cancelled first.
async fn unless_cancelled<T>(
    cancel: &CancellationToken,
    work: impl Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        biased;
        () = cancel.cancelled() => None,
        value = work => Some(value),
    }
}

fn add_usage(total: &mut ResponseUsage, usage: &crate::pipeline::respond::Usage) {
    total.input_tokens += usage.prompt_tokens;
    total.output_tokens += usage.completion_tokens;
    total.input_tokens_details.cached_tokens += usage.cached_tokens;
    total.total_tokens = total.input_tokens + total.output_tokens;
}

/// Runs the generations of a response (several when MCP calls loop),
/// building its output in `builder`.
async fn generate(
    state: &SharedState,
    plan: &mut Plan,
    cancel: &CancellationToken,
    sink: &mut Sink,
    builder: &mut OutputBuilder,
    usage: &mut ResponseUsage,
) -> Outcome {
    let mut servers = mcp_loop::McpTools::default();
    if !plan.mcp_servers.is_empty() {
        let function_names: Vec<String> = plan
            .tools
            .iter()
            .map(|tool| tool.function.name.clone())
            .collect();
        let listing = mcp_loop::McpTools::list(state, &plan.mcp_servers, &function_names);
        match unless_cancelled(cancel, listing).await {
            None => return Outcome::Cancelled,
            Some(Err(err)) => return Outcome::Failed(err),
            Some(Ok(listed)) => servers = listed,
        }
    }
    builder.set_mcp_tools(servers.names());
    for (label, tools, error) in servers.list_items() {
        builder.mcp_list_tools(label, tools, error);
    }
    if !sink.emit(builder.take_events()).await {
        return Outcome::Cancelled;
    }
    let extra = servers.chat_tools();
    let mut tools = if extra.is_empty() {
        plan.chat_tools.take()
    } else {
        let function_tools = Arc::clone(&plan.tools);
        let offered = state.offload.run_when(plan.heavy, move || {
            let mut tools = function_tools.to_vec();
            tools.extend(extra);
            convert::chat_tools(&tools)
        });
        match offered.await {
            Ok(tools) => tools,
            Err(err) => return Outcome::Failed(err),
        }
    };
    let mut calls_left = plan
        .request
        .max_tool_calls
        .unwrap_or(DEFAULT_MAX_TOOL_CALLS);
    loop {
        let spec = match plan.next_spec(state, &mut tools).await {
            Ok(spec) => spec,
            Err(err) => return Outcome::Failed(err),
        };
        let generation = unless_cancelled(
            cancel,
            plan.router
                .generate(Endpoint::Responses, spec, plan.routing_key.clone()),
        )
        .await;
        let mut generation = match generation {
            None => return Outcome::Cancelled,
            Some(Err(err)) => return Outcome::Failed(err),
            Some(Ok(generation)) => generation,
        };
        builder.begin_generation();
        let mut finish = None;
        let failure = loop {
            let Some(event) = unless_cancelled(cancel, generation.output.next()).await else {
                break Some(Outcome::Cancelled);
            };
            match event {
                None => break None,
                Some(Ok(OutputEvent::Delta {
                    text,
                    reasoning,
                    tool_calls,
                    token_ids,
                    ..
                })) => {
                    let parsed = ParsedText {
                        content: text,
                        reasoning,
                        calls: tool_calls,
                    };
                    builder.delta(parsed, token_ids.len());
                    if !sink.emit(builder.take_events()).await {
                        break Some(Outcome::Cancelled);
                    }
                }
                Some(Ok(OutputEvent::Finish { reason, .. })) => finish = Some(reason),
                Some(Ok(OutputEvent::Usage(counts))) => add_usage(usage, &counts),
                Some(Ok(OutputEvent::Started(_))) => {}
                Some(Err(err)) => break Some(Outcome::Failed(err)),
            }
        };
        // Dropping the output aborts the engine's legs (cancel, failure).
        drop(generation);
        if let Some(failure) = failure {
            return failure;
        }
        let cut = finish == Some(FinishReason::Length);
        builder.end_generation(if cut {
            ItemStatus::Incomplete
        } else {
            ItemStatus::Completed
        });
        if !sink.emit(builder.take_events()).await {
            return Outcome::Cancelled;
        }
        if cut {
            return Outcome::Incomplete("max_output_tokens");
        }
        let pending = builder.take_pending_mcp();
        if pending.is_empty() {
            return Outcome::Completed;
        }
        match servers
            .run_calls(cancel, builder, sink, pending, &mut calls_left)
            .await
        {
            mcp_loop::Ran::All => {}
            mcp_loop::Ran::Cancelled => return Outcome::Cancelled,
            mcp_loop::Ran::OutOfBudget => return Outcome::Incomplete("max_tool_calls"),
        }
        // The client runs its function calls; the model goes on when it
        // sends their outputs.
        if builder.called_function() {
            return Outcome::Completed;
        }
        for item in builder.generation_items() {
            plan.messages.push(item);
        }
    }
}

/// Runs a planned response to its end, telling `sink` as it goes, and
/// stores it. Returns the final object, and the error it failed with.
async fn execute(
    state: &SharedState,
    mut plan: Plan,
    cancel: CancellationToken,
    sink: &mut Sink,
) -> (ResponseObject, Option<Error>) {
    let in_progress = plan.object(ResponseStatus::InProgress, Vec::new(), None, None, None);
    if plan.background {
        // A poll sees that the work has begun. A failure here is no reason
        // to stop: the final write says how the response ended, or fails.
        if let Ok((stored, _)) = plan.stored(state, &in_progress).await {
            let _ = state.history.save_response(&stored, &[]).await;
        }
    }
    let mut builder = OutputBuilder::default();
    let mut usage = ResponseUsage::default();
    let outcome = if sink
        .emit(vec![
            StreamEvent::Created {
                response: in_progress.clone(),
            },
            StreamEvent::InProgress {
                response: in_progress,
            },
        ])
        .await
    {
        generate(state, &mut plan, &cancel, sink, &mut builder, &mut usage).await
    } else {
        Outcome::Cancelled
    };
    // What a failure or a cancel left open is incomplete.
    builder.end_generation(ItemStatus::Incomplete);
    let _ = sink.emit(builder.take_events()).await;
    usage.output_tokens_details = OutputTokensDetails {
        reasoning_tokens: builder.reasoning_tokens,
    };
    let (status, error, incomplete) = match outcome {
        Outcome::Completed => (ResponseStatus::Completed, None, None),
        Outcome::Incomplete(reason) => (ResponseStatus::Incomplete, None, Some(reason)),
        Outcome::Failed(err) => (ResponseStatus::Failed, Some(err), None),
        Outcome::Cancelled => (ResponseStatus::Cancelled, None, None),
    };
    let mut object = plan.object(
        status,
        builder.into_items(),
        Some(usage),
        error.as_ref(),
        incomplete,
    );
    let mut failure = error;
    if plan.store {
        let saved = match plan.stored(state, &object).await {
            Ok((stored, items)) => state.history.save_response(&stored, &items).await,
            Err(err) => Err(err),
        };
        if let Err(err) = saved {
            let _ = sink
                .emit(vec![StreamEvent::Error {
                    code: err.code.as_str().to_owned(),
                    message: err.client_message(client_request_id().as_deref()),
                    param: None,
                }])
                .await;
            object.status = ResponseStatus::Failed;
            object.error = Some(ResponseError {
                code: err.code.as_str().to_owned(),
                message: err.client_message(client_request_id().as_deref()),
            });
            failure = Some(err);
        }
    }
    let terminal = match object.status {
        ResponseStatus::Completed => StreamEvent::Completed {
            response: object.clone(),
        },
        ResponseStatus::Incomplete => StreamEvent::Incomplete {
            response: object.clone(),
        },
        ResponseStatus::Cancelled => StreamEvent::Cancelled {
            response: object.clone(),
        },
        _ => StreamEvent::Failed {
            response: object.clone(),
        },
    };
    let _ = sink.emit(vec![terminal]).await;
    if plan.heavy {
        // Its messages and items are as large as what they came from.
        state.offload.drop_later(plan);
    }
    (object, failure)
}

fn json_response(status: StatusCode, body: &impl serde::Serialize) -> Response {
    (status, axum::Json(body)).into_response()
}

fn error_response(err: &Error) -> Response {
    metrics::record_error("responses", Endpoint::Responses.label(), err.code.as_str());
    render(err, ErrorDialect::OpenAi)
}

/// `POST /v1/responses`.
pub(crate) async fn create_response(
    State(state): State<SharedState>,
    held: Option<Extension<HeldPermit>>,
    tenant: Option<Extension<Tenant>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = std::time::Instant::now();
    let plan = match plan(&state, &headers, &owner(tenant.as_ref()), body).await {
        Ok(plan) => plan,
        Err(err) => return error_response(&err),
    };
    let router_label = plan.router.mode().metrics_label();
    let model = plan.model.clone();
    let record = move |failure: Option<&Error>| match failure {
        None => metrics::record_request(
            router_label,
            Endpoint::Responses.label(),
            &model,
            started.elapsed(),
        ),
        Some(err) => {
            metrics::record_error(router_label, Endpoint::Responses.label(), err.code.as_str());
        }
    };
    if plan.background {
        // Stored before the answer, so a GET right after it finds it.
        let queued = plan.object(ResponseStatus::Queued, Vec::new(), None, None, None);
        let saved = match plan.stored(&state, &queued).await {
            Ok((stored, _)) => state.history.save_response(&stored, &[]).await,
            Err(err) => Err(err),
        };
        if let Err(err) = saved {
            return error_response(&err);
        }
        let cancel = CancellationToken::new();
        // The admission slot goes with the work, not with the answer: a
        // background response counts against --max-concurrent-requests
        // until it ends.
        let permit = held.and_then(|Extension(held)| held.take());
        if plan.stream {
            let (sender, receiver) = mpsc::channel(64);
            let task_state = Arc::clone(&state);
            state.tasks.spawn(carried(async move {
                let _permit = permit;
                let mut sink = Sink {
                    frames: Some(sender),
                    sequence: 0,
                    detached: true,
                };
                let (_, failure) = run_registered(&task_state, plan, cancel, &mut sink).await;
                record(failure.as_ref());
            }));
            return sse_response(tokio_stream::wrappers::ReceiverStream::new(receiver));
        }
        let task_state = Arc::clone(&state);
        state.tasks.spawn(carried(async move {
            let _permit = permit;
            let mut sink = Sink::collecting(true);
            let (_, failure) = run_registered(&task_state, plan, cancel, &mut sink).await;
            record(failure.as_ref());
        }));
        return json_response(StatusCode::OK, &queued);
    }
    let cancel = CancellationToken::new();
    if plan.stream {
        let (sender, receiver) = mpsc::channel(64);
        let watch = sender.clone();
        let task_state = Arc::clone(&state);
        state.tasks.spawn(carried(async move {
            let mut sink = Sink {
                frames: Some(sender),
                sequence: 0,
                detached: false,
            };
            // A client that leaves cancels the response (and its legs) at
            // once, not when its next event finds the stream closed.
            let left = cancel.clone();
            let run = run_registered(&task_state, plan, cancel, &mut sink);
            tokio::pin!(run);
            let (_, failure) = tokio::select! {
                done = &mut run => done,
                () = watch.closed() => {
                    left.cancel();
                    run.await
                }
            };
            record(failure.as_ref());
        }));
        return sse_response(tokio_stream::wrappers::ReceiverStream::new(receiver));
    }
    let heavy = plan.heavy;
    let mut sink = Sink::collecting(false);
    let (object, failure) = run_registered(&state, plan, cancel, &mut sink).await;
    record(failure.as_ref());
    match failure {
        // A whole response that failed answers with the failure's status.
        Some(err) => render(&err, ErrorDialect::OpenAi),
        // It echoes the request's tools: as large as they were.
        None if heavy => match state
            .offload
            .run(move || {
                serde_json::to_vec(&object)
                    .map_err(|err| Error::internal(format!("a response does not serialize: {err}")))
            })
            .await
        {
            Ok(body) => (
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                body,
            )
                .into_response(),
            Err(err) => error_response(&err),
        },
        None => json_response(StatusCode::OK, &object),
    }
}

/// [`execute`] with the response registered as running, so it can be
/// cancelled and its end awaited.
async fn run_registered(
    state: &SharedState,
    plan: Plan,
    cancel: CancellationToken,
    sink: &mut Sink,
) -> (ResponseObject, Option<Error>) {
    let id = plan.id.clone();
    let heavy = plan.heavy;
    let guard = state.responses.register(&id, cancel.clone());
    let (object, failure) = execute(state, plan, cancel, sink).await;
    let finished = {
        let object = object.clone();
        state
            .offload
            .run_when(heavy, move || Ok(serde_json::to_value(&object)))
            .await
    };
    guard.finish(match finished {
        Ok(Ok(value)) => value,
        _ => Value::Null,
    });
    (object, failure)
}

/// The stored response `id`, or 404.
async fn stored_response(state: &SharedState, id: &str, owner: &str) -> Result<StoredResponse> {
    if !ids::owned_by(id, owner) {
        return Err(not_found_response(id, ErrorCode::ResponseNotFound));
    }
    state
        .history
        .get_response(id)
        .await?
        .ok_or_else(|| not_found_response(id, ErrorCode::ResponseNotFound))
}

/// "No such response", as `code` says it; also what another tenant's
/// response is to a caller.
fn not_found_response(id: &str, code: ErrorCode) -> Error {
    Error::new(code, format!("response {} does not exist", excerpt(id)))
}

/// Whom a request's stored objects belong to: its tenant (the empty name
/// when the gateway has no keys, so every caller shares one owner).
pub(crate) fn owner(tenant: Option<&Extension<Tenant>>) -> String {
    tenant.map_or_else(String::new, |Extension(tenant)| tenant.name().to_owned())
}

/// `GET /v1/responses/{id}`.
pub(crate) async fn get_response(
    State(state): State<SharedState>,
    tenant: Option<Extension<Tenant>>,
    Path(id): Path<String>,
) -> Response {
    match stored_response(&state, &id, &owner(tenant.as_ref())).await {
        Ok(stored) => json_response(StatusCode::OK, &stored.raw),
        Err(err) => error_response(&err),
    }
}

/// `DELETE /v1/responses/{id}`.
pub(crate) async fn delete_response(
    State(state): State<SharedState>,
    tenant: Option<Extension<Tenant>>,
    Path(id): Path<String>,
) -> Response {
    if !ids::owned_by(&id, &owner(tenant.as_ref())) {
        return error_response(&not_found_response(&id, ErrorCode::ResponseNotFound));
    }
    match state.history.delete_response(&id).await {
        Ok(true) => json_response(
            StatusCode::OK,
            &json!({"id": id, "object": "response.deleted", "deleted": true}),
        ),
        Ok(false) => error_response(&Error::new(
            ErrorCode::ResponseNotFound,
            format!("response {} does not exist", excerpt(&id)),
        )),
        Err(err) => error_response(&err),
    }
}

/// `POST /v1/responses/{id}/cancel`: stops a running response (its engine
/// legs are aborted) and answers with it as it ended.
pub(crate) async fn cancel_response(
    State(state): State<SharedState>,
    tenant: Option<Extension<Tenant>>,
    Path(id): Path<String>,
) -> Response {
    let owner = owner(tenant.as_ref());
    if !ids::owned_by(&id, &owner) {
        return error_response(&not_found_response(&id, ErrorCode::ResponseNotFound));
    }
    if let Some(running) = state.responses.get(&id) {
        return cancel_here(running, &id).await;
    }
    let stored = match stored_response(&state, &id, &owner).await {
        Ok(stored) => stored,
        Err(err) => return error_response(&err),
    };
    if !smg_history::in_flight(&stored.status) {
        return not_cancellable(&id, &stored.status);
    }
    // Another gateway runs it (or this one, about to register it): the
    // store tells its owner, which cancels it and stores it `cancelled`.
    match state.history.request_cancel(&id).await {
        Ok(true) => {}
        // It ended meanwhile.
        Ok(false) => {
            return match stored_response(&state, &id, &owner).await {
                Ok(stored) => not_cancellable(&id, &stored.status),
                Err(err) => error_response(&err),
            };
        }
        Err(err) => return error_response(&err),
    }
    let ended = tokio::time::timeout(CANCEL_WAIT, async {
        let mut pause = CANCEL_POLL_FIRST;
        loop {
            if let Some(running) = state.responses.get(&id) {
                return Ok(Err(running));
            }
            let stored = stored_response(&state, &id, &owner).await?;
            if !smg_history::in_flight(&stored.status) {
                return Ok(Ok(stored.raw));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(CANCEL_POLL_MOST);
        }
    })
    .await;
    match ended {
        Ok(Ok(Ok(object))) => json_response(StatusCode::OK, &object),
        Ok(Ok(Err(running))) => cancel_here(running, &id).await,
        Ok(Err(err)) => error_response(&err),
        Err(_) => did_not_stop(&id),
    }
}

/// Cancels a response running on this gateway and answers with it as it
/// ended.
async fn cancel_here(running: InFlight, id: &str) -> Response {
    running.cancel.cancel();
    let mut done = running.done;
    let ended = tokio::time::timeout(CANCEL_WAIT, done.wait_for(Option::is_some)).await;
    match ended {
        Ok(Ok(object)) => json_response(StatusCode::OK, &*object),
        _ => did_not_stop(id),
    }
}

fn did_not_stop(id: &str) -> Response {
    error_response(&Error::new(
        ErrorCode::RequestTimeout,
        format!(
            "response {} did not stop within {}s",
            excerpt(id),
            CANCEL_WAIT.as_secs()
        ),
    ))
}

fn not_cancellable(id: &str, status: &str) -> Response {
    error_response(&Error::new(
        ErrorCode::ResponseNotCancellable,
        format!("response {} is {status} already", excerpt(id)),
    ))
}

/// `limit` / `order` / `after` of a listing.
#[derive(Debug, Deserialize)]
pub(crate) struct ListQuery {
    pub limit: Option<usize>,
    pub order: Option<String>,
    pub after: Option<String>,
}

impl ListQuery {
    /// The page asked for: `limit` 1..=100 (default 20), `order` `asc` or
    /// `desc` (default).
    pub(crate) fn page(&self) -> Result<smg_history::PageRequest> {
        let limit = self.limit.unwrap_or(20);
        if !(1..=100).contains(&limit) {
            return Err(Error::invalid_parameter("limit", "must be within [1, 100]"));
        }
        let order = match self.order.as_deref() {
            None | Some("desc") => smg_history::Order::Desc,
            Some("asc") => smg_history::Order::Asc,
            Some(_) => return Err(Error::invalid_parameter("order", "must be asc or desc")),
        };
        Ok(smg_history::PageRequest {
            limit,
            order,
            after: self.after.clone(),
        })
    }
}

/// A list page as OpenAI shows one.
pub(crate) fn list_page(data: Vec<Value>, has_more: bool) -> Value {
    let id_of = |item: Option<&Value>| item.and_then(|item| item.get("id")).cloned();
    json!({
        "object": "list",
        "first_id": id_of(data.first()),
        "last_id": id_of(data.last()),
        "has_more": has_more,
        "data": data,
    })
}

/// `GET /v1/responses/{id}/input_items`: the response's own input items.
pub(crate) async fn list_input_items(
    State(state): State<SharedState>,
    tenant: Option<Extension<Tenant>>,
    Path(id): Path<String>,
    Query(query): Query<ListQuery>,
) -> Response {
    let owner = owner(tenant.as_ref());
    let listed = async {
        let page = query.page()?;
        let stored = stored_response(&state, &id, &owner).await?;
        let mut items = match stored.input {
            Value::Array(items) => items,
            _ => Vec::new(),
        };
        if page.order == smg_history::Order::Desc {
            items.reverse();
        }
        let start = match &page.after {
            None => 0,
            Some(after) => {
                let position = items
                    .iter()
                    .position(|item| item.get("id").and_then(Value::as_str) == Some(after));
                match position {
                    Some(position) => position + 1,
                    None => {
                        return Err(Error::new(
                            ErrorCode::ItemNotFound,
                            format!(
                                "response {} has no input item {}",
                                excerpt(&id),
                                excerpt(after)
                            ),
                        )
                        .with_param("after"));
                    }
                }
            }
        };
        let rest = items.split_off(start.min(items.len()));
        let has_more = rest.len() > page.limit;
        Ok(list_page(
            rest.into_iter().take(page.limit).collect(),
            has_more,
        ))
    }
    .await;
    match listed {
        Ok(body) => json_response(StatusCode::OK, &body),
        Err(err) => error_response(&err),
    }
}
