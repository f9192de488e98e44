//! OpenAI's Responses API wire types: the request, the items a response is
//! made of, the response object and its stream events.
//!
//! Why it exists: agent frameworks speak the Responses API first, and its
//! shapes differ from chat's everywhere: the input is a list of typed items
//! (messages, function calls and their outputs, reasoning), the output is
//! such a list too, and a stream is a sequence of named events about those
//! items. Items are kept as the API shows them so a stored response replays
//! exactly; [`Item::from_input`] reads a client's item with the field path
//! of what is wrong in its error, and mints the ids a client may omit.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::forms::{JsonText, literal_tag};
use crate::error::{Error, ErrorCode, Result, excerpt};

literal_tag!(
    /// `"response"`, the `object` of a response.
    ResponseObjectTag = "response"
);

/// `POST /v1/responses`. Unknown fields are ignored, as OpenAI clients send
/// many (`include`, `truncation`, `service_tier`, ...) that change nothing
/// here.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ResponsesRequest {
    /// The served model when absent.
    pub model: Option<String>,
    /// A string (one user message) or a list of items; checked by
    /// [`parse_input`].
    pub input: Option<Value>,
    /// A system message put before everything else; not carried to the
    /// responses that continue this one.
    pub instructions: Option<String>,
    pub previous_response_id: Option<String>,
    /// `"conv_…"` or `{"id": "conv_…"}`.
    pub conversation: Option<ConversationParam>,
    /// Default true.
    pub store: Option<bool>,
    pub background: Option<bool>,
    pub stream: Option<bool>,
    pub max_output_tokens: Option<u32>,
    /// At most this many MCP calls are run by the gateway for one response.
    pub max_tool_calls: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// SGLang extension, as on chat.
    pub top_k: Option<i32>,
    pub text: Option<TextConfig>,
    /// `function` and `mcp` tools (others are `unsupported_tool`).
    pub tools: Option<Vec<Value>>,
    /// `"none"`, `"auto"`, `"required"` or `{"type": "function", "name"}`.
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub reasoning: Option<ReasoningConfig>,
    pub metadata: Option<Map<String, Value>>,
    pub user: Option<String>,
    /// Extra chat-template variables, as on chat.
    pub chat_template_kwargs: Option<Map<String, Value>>,
}

/// `conversation`: an id, or an object with one.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum ConversationParam {
    Id(String),
    Object { id: String },
}

impl ConversationParam {
    pub fn id(&self) -> &str {
        match self {
            ConversationParam::Id(id) | ConversationParam::Object { id } => id,
        }
    }
}

/// `text`: how the output text is formatted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TextConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<TextFormat>,
}

/// `text.format`: free text, any JSON object, or JSON matching a schema
/// (flat, unlike chat's `response_format.json_schema`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TextFormat {
    Text,
    JsonObject,
    JsonSchema {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        description: Option<String>,
        /// In the client's key order (the engine emits properties in it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        schema: Option<JsonText>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        strict: Option<bool>,
    },
}

/// `reasoning`: `effort` goes to the chat template as `reasoning_effort`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReasoningConfig {
    pub effort: Option<String>,
    pub summary: Option<String>,
}

/// Prefixes of the ids the gateway mints, as OpenAI spells them.
pub mod ids {
    pub const RESPONSE: &str = "resp";
    pub const MESSAGE: &str = "msg";
    pub const REASONING: &str = "rs";
    pub const FUNCTION_CALL: &str = "fc";
    pub const FUNCTION_CALL_OUTPUT: &str = "fco";
    pub const CALL: &str = "call";
    pub const MCP_CALL: &str = "mcp";
    pub const MCP_LIST_TOOLS: &str = "mcpl";
    pub const CONVERSATION: &str = "conv";

    /// A fresh id: the prefix, `_`, then 48 hex digits of randomness.
    pub fn mint(prefix: &str) -> String {
        let high = rand::random::<u128>();
        let low = rand::random::<u64>();
        format!("{prefix}_{high:032x}{low:016x}")
    }

    /// The tag binding 32 hex digits of randomness to their owner.
    fn owner_tag(owner: &str, random: &str) -> String {
        let mut hasher = blake3::Hasher::new_derive_key("smg 2026 stored-object owner tag");
        hasher.update(owner.as_bytes());
        hasher.update(&[0]);
        hasher.update(random.as_bytes());
        hasher.finalize().to_hex()[..16].to_owned()
    }

    /// A fresh id of a stored object (a response, a conversation) that
    /// only `owner` (the request's tenant) can name: the prefix, `_`, 32
    /// hex digits of randomness, then 16 of a hash of the owner and that
    /// randomness. Another tenant that learns the id is told it does not
    /// exist; every gateway replica checks it alike, with nothing stored.
    pub fn mint_owned(prefix: &str, owner: &str) -> String {
        let random = format!("{:032x}", rand::random::<u128>());
        let tag = owner_tag(owner, &random);
        format!("{prefix}_{random}{tag}")
    }

    /// Whether `id` was minted for `owner` by [`mint_owned`].
    pub fn owned_by(id: &str, owner: &str) -> bool {
        let Some((_, digits)) = id.split_once('_') else {
            return false;
        };
        if digits.len() != 48 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return false;
        }
        let (random, tag) = digits.split_at(32);
        owner_tag(owner, random) == tag
    }
}

/// One part of a message's content.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    InputText {
        text: String,
    },
    InputImage {
        image_url: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
    OutputText {
        text: String,
        annotations: Vec<Value>,
        logprobs: Vec<Value>,
    },
    Refusal {
        refusal: String,
    },
}

impl ContentPart {
    /// An answer's text, as a response carries it.
    pub fn output_text(text: String) -> Self {
        ContentPart::OutputText {
            text,
            annotations: Vec::new(),
            logprobs: Vec::new(),
        }
    }
}

/// A piece of reasoning, as `content` of a reasoning item carries it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ReasoningPart {
    ReasoningText { text: String },
}

/// A piece of a reasoning summary (`summary` of a reasoning item).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SummaryPart {
    SummaryText { text: String },
}

/// An item's progress, as items show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemStatus {
    InProgress,
    Completed,
    Incomplete,
    Failed,
}

/// A tool an MCP server offers, as `mcp_list_tools` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct McpToolInfo {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub input_schema: Value,
    pub annotations: Option<Value>,
}

/// One item of a response's input or output, or of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Item {
    Message {
        id: String,
        role: String,
        status: ItemStatus,
        content: Vec<ContentPart>,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        status: ItemStatus,
    },
    FunctionCallOutput {
        id: String,
        call_id: String,
        output: String,
        status: ItemStatus,
    },
    Reasoning {
        id: String,
        summary: Vec<SummaryPart>,
        content: Vec<ReasoningPart>,
        encrypted_content: Option<String>,
        status: ItemStatus,
    },
    McpListTools {
        id: String,
        server_label: String,
        tools: Vec<McpToolInfo>,
        error: Option<String>,
    },
    McpCall {
        id: String,
        server_label: String,
        name: String,
        arguments: String,
        output: Option<String>,
        error: Option<String>,
        status: ItemStatus,
    },
}

/// The roles a message item may have.
const MESSAGE_ROLES: &[&str] = &["user", "system", "developer", "assistant"];

fn bad_item(path: &str, message: impl Into<String>) -> Error {
    Error::new(ErrorCode::InvalidInputItem, message).with_param(path)
}

fn string_field(object: &Map<String, Value>, path: &str, field: &str) -> Result<String> {
    match object.get(field) {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(_) => Err(bad_item(
            &format!("{path}.{field}"),
            format!("{field} must be a string"),
        )),
        None => Err(bad_item(
            &format!("{path}.{field}"),
            format!("{field} is required"),
        )),
    }
}

fn optional_string(object: &Map<String, Value>, path: &str, field: &str) -> Result<Option<String>> {
    match object.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(bad_item(
            &format!("{path}.{field}"),
            format!("{field} must be a string"),
        )),
    }
}

/// The item's id, or a fresh one with `prefix`.
fn id_or_mint(object: &Map<String, Value>, path: &str, prefix: &str) -> Result<String> {
    Ok(optional_string(object, path, "id")?.unwrap_or_else(|| ids::mint(prefix)))
}

/// The text of a list of `{type, text}` parts (`summary_text`,
/// `reasoning_text`, `output_text`, ...), in order.
fn part_texts(value: Option<&Value>, path: &str, field: &str) -> Result<Vec<String>> {
    let parts = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(parts)) => parts,
        Some(_) => {
            return Err(bad_item(
                &format!("{path}.{field}"),
                format!("{field} must be a list"),
            ));
        }
    };
    parts
        .iter()
        .enumerate()
        .map(|(index, part)| {
            let part_path = format!("{path}.{field}[{index}]");
            match part {
                Value::Object(object) => string_field(object, &part_path, "text"),
                _ => Err(bad_item(&part_path, "must be an object with a text")),
            }
        })
        .collect()
}

fn message_content(role: &str, value: Option<&Value>, path: &str) -> Result<Vec<ContentPart>> {
    let content_path = format!("{path}.content");
    let parts = match value {
        Some(Value::String(text)) if role == "assistant" => {
            return Ok(vec![ContentPart::output_text(text.clone())]);
        }
        Some(Value::String(text)) => {
            return Ok(vec![ContentPart::InputText { text: text.clone() }]);
        }
        Some(Value::Array(parts)) => parts,
        _ => {
            return Err(bad_item(
                &content_path,
                "content must be a string or a list of parts",
            ));
        }
    };
    parts
        .iter()
        .enumerate()
        .map(|(index, part)| {
            let part_path = format!("{content_path}[{index}]");
            let Value::Object(object) = part else {
                return Err(bad_item(&part_path, "a content part must be an object"));
            };
            let kind = string_field(object, &part_path, "type")?;
            match kind.as_str() {
                "input_text" => Ok(ContentPart::InputText {
                    text: string_field(object, &part_path, "text")?,
                }),
                "output_text" => Ok(ContentPart::output_text(string_field(
                    object, &part_path, "text",
                )?)),
                "refusal" => Ok(ContentPart::Refusal {
                    refusal: string_field(object, &part_path, "refusal")?,
                }),
                "input_image" => {
                    let image_url = match object.get("image_url") {
                        Some(Value::String(url)) => url.clone(),
                        // OpenAI's chat-style `{"image_url": {"url"}}`.
                        Some(Value::Object(inner)) => {
                            string_field(inner, &format!("{part_path}.image_url"), "url")?
                        }
                        _ if object.contains_key("file_id") => {
                            return Err(bad_item(
                                &format!("{part_path}.file_id"),
                                "files are not served here: send the image as image_url \
                                 (an http(s) or data: URL)",
                            ));
                        }
                        _ => return Err(bad_item(&part_path, "input_image needs an image_url")),
                    };
                    Ok(ContentPart::InputImage {
                        image_url,
                        detail: optional_string(object, &part_path, "detail")?,
                    })
                }
                other => Err(bad_item(
                    &format!("{part_path}.type"),
                    format!(
                        "unknown content part type {other:?} (input_text, input_image, \
                         output_text or refusal)"
                    ),
                )),
            }
        })
        .collect()
}

impl Item {
    /// Reads a client's item at `path` (`input[2]`): a message (with or
    /// without `"type": "message"`), `function_call`,
    /// `function_call_output`, `reasoning`, or an MCP item replayed from an
    /// earlier output. Ids a client omits are minted.
    pub fn from_input(value: &Value, path: &str) -> Result<Item> {
        let Value::Object(object) = value else {
            return Err(bad_item(path, "an input item must be an object"));
        };
        let kind = match object.get("type") {
            None if object.contains_key("role") => "message".to_owned(),
            None => return Err(bad_item(&format!("{path}.type"), "type is required")),
            Some(_) => string_field(object, path, "type")?,
        };
        match kind.as_str() {
            "message" => {
                let role = string_field(object, path, "role")?;
                if !MESSAGE_ROLES.contains(&role.as_str()) {
                    return Err(bad_item(
                        &format!("{path}.role"),
                        format!(
                            "unknown role {:?} (user, system, developer or assistant)",
                            excerpt(&role)
                        ),
                    ));
                }
                let content = message_content(&role, object.get("content"), path)?;
                Ok(Item::Message {
                    id: id_or_mint(object, path, ids::MESSAGE)?,
                    role,
                    status: ItemStatus::Completed,
                    content,
                })
            }
            "function_call" => Ok(Item::FunctionCall {
                id: id_or_mint(object, path, ids::FUNCTION_CALL)?,
                call_id: string_field(object, path, "call_id")?,
                name: string_field(object, path, "name")?,
                arguments: string_field(object, path, "arguments")?,
                status: ItemStatus::Completed,
            }),
            "function_call_output" => {
                let output = match object.get("output") {
                    Some(Value::String(text)) => text.clone(),
                    Some(parts @ Value::Array(_)) => {
                        part_texts(Some(parts), path, "output")?.concat()
                    }
                    _ => {
                        return Err(bad_item(
                            &format!("{path}.output"),
                            "output must be a string or a list of text parts",
                        ));
                    }
                };
                Ok(Item::FunctionCallOutput {
                    id: id_or_mint(object, path, ids::FUNCTION_CALL_OUTPUT)?,
                    call_id: string_field(object, path, "call_id")?,
                    output,
                    status: ItemStatus::Completed,
                })
            }
            "reasoning" => Ok(Item::Reasoning {
                id: id_or_mint(object, path, ids::REASONING)?,
                summary: part_texts(object.get("summary"), path, "summary")?
                    .into_iter()
                    .map(|text| SummaryPart::SummaryText { text })
                    .collect(),
                content: part_texts(object.get("content"), path, "content")?
                    .into_iter()
                    .map(|text| ReasoningPart::ReasoningText { text })
                    .collect(),
                encrypted_content: optional_string(object, path, "encrypted_content")?,
                status: ItemStatus::Completed,
            }),
            "mcp_list_tools" => Ok(Item::McpListTools {
                id: id_or_mint(object, path, ids::MCP_LIST_TOOLS)?,
                server_label: string_field(object, path, "server_label")?,
                // What a server offered once is not offered again by
                // replaying it: only the calls matter to the model.
                tools: Vec::new(),
                error: optional_string(object, path, "error")?,
            }),
            "mcp_call" => Ok(Item::McpCall {
                id: id_or_mint(object, path, ids::MCP_CALL)?,
                server_label: string_field(object, path, "server_label")?,
                name: string_field(object, path, "name")?,
                arguments: string_field(object, path, "arguments")?,
                output: optional_string(object, path, "output")?,
                error: optional_string(object, path, "error")?,
                status: ItemStatus::Completed,
            }),
            "item_reference" => Err(bad_item(
                &format!("{path}.type"),
                "item_reference is not supported: send the item itself, or continue with \
                 previous_response_id or conversation",
            )),
            other => Err(bad_item(
                &format!("{path}.type"),
                format!(
                    "unknown item type {other:?} (message, function_call, \
                     function_call_output, reasoning, mcp_call)"
                ),
            )),
        }
    }

    pub fn id(&self) -> &str {
        match self {
            Item::Message { id, .. }
            | Item::FunctionCall { id, .. }
            | Item::FunctionCallOutput { id, .. }
            | Item::Reasoning { id, .. }
            | Item::McpListTools { id, .. }
            | Item::McpCall { id, .. } => id,
        }
    }

    /// The item as JSON, for storage and listings.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// The request's `input`: a string is one user message.
pub fn parse_input(input: Option<&Value>) -> Result<Vec<Item>> {
    match input {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(text)) => Ok(vec![Item::Message {
            id: ids::mint(ids::MESSAGE),
            role: "user".into(),
            status: ItemStatus::Completed,
            content: vec![ContentPart::InputText { text: text.clone() }],
        }]),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(index, item)| Item::from_input(item, &format!("input[{index}]")))
            .collect(),
        Some(_) => Err(Error::invalid_parameter(
            "input",
            "must be a string or a list of items",
        )),
    }
}

/// A response's lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResponseStatus {
    Queued,
    InProgress,
    Completed,
    Incomplete,
    Failed,
    Cancelled,
}

impl ResponseStatus {
    pub const fn as_str(self) -> &'static str {
        match self {
            ResponseStatus::Queued => "queued",
            ResponseStatus::InProgress => "in_progress",
            ResponseStatus::Completed => "completed",
            ResponseStatus::Incomplete => "incomplete",
            ResponseStatus::Failed => "failed",
            ResponseStatus::Cancelled => "cancelled",
        }
    }

    /// Whether the response is over (nothing more will change it).
    pub const fn is_terminal(self) -> bool {
        !matches!(self, ResponseStatus::Queued | ResponseStatus::InProgress)
    }
}

/// `error` of a failed response.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResponseError {
    pub code: String,
    pub message: String,
}

/// `incomplete_details`: why the output stopped short.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IncompleteDetails {
    pub reason: &'static str,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct InputTokensDetails {
    pub cached_tokens: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: u32,
}

/// `usage`, summed over every generation the response ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ResponseUsage {
    pub input_tokens: u32,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: u32,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: u32,
}

/// `conversation` of a response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConversationRef {
    pub id: String,
}

/// The response object, whole or as stream events carry it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResponseObject {
    pub id: String,
    pub object: ResponseObjectTag,
    pub created_at: i64,
    pub status: ResponseStatus,
    pub background: bool,
    pub error: Option<ResponseError>,
    pub incomplete_details: Option<IncompleteDetails>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub max_tool_calls: Option<u32>,
    pub model: String,
    pub output: Vec<Item>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub conversation: Option<ConversationRef>,
    pub reasoning: ReasoningConfig,
    pub store: bool,
    pub temperature: Option<f32>,
    pub text: TextConfig,
    pub tool_choice: Value,
    /// The request's tools, shared by every object of one response (a
    /// stream repeats the object in several events).
    #[serde(serialize_with = "shared_list")]
    pub tools: Arc<[Value]>,
    pub top_p: Option<f32>,
    pub truncation: &'static str,
    pub usage: Option<ResponseUsage>,
    pub user: Option<String>,
    pub metadata: Map<String, Value>,
}

fn shared_list<S: serde::Serializer>(
    items: &Arc<[Value]>,
    serializer: S,
) -> std::result::Result<S::Ok, S::Error> {
    items[..].serialize(serializer)
}

/// One event of a streamed response; [`Sequenced`] adds its number.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type")]
pub enum StreamEvent {
    #[serde(rename = "response.created")]
    Created { response: ResponseObject },
    #[serde(rename = "response.in_progress")]
    InProgress { response: ResponseObject },
    #[serde(rename = "response.completed")]
    Completed { response: ResponseObject },
    #[serde(rename = "response.incomplete")]
    Incomplete { response: ResponseObject },
    #[serde(rename = "response.failed")]
    Failed { response: ResponseObject },
    /// The response was cancelled (`POST /v1/responses/{id}/cancel`).
    #[serde(rename = "response.cancelled")]
    Cancelled { response: ResponseObject },
    #[serde(rename = "response.output_item.added")]
    OutputItemAdded { output_index: usize, item: Item },
    #[serde(rename = "response.output_item.done")]
    OutputItemDone { output_index: usize, item: Item },
    #[serde(rename = "response.content_part.added")]
    ContentPartAdded {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: ContentPart,
    },
    #[serde(rename = "response.content_part.done")]
    ContentPartDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        part: ContentPart,
    },
    #[serde(rename = "response.output_text.delta")]
    OutputTextDelta {
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
        logprobs: Vec<Value>,
    },
    #[serde(rename = "response.output_text.done")]
    OutputTextDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
        logprobs: Vec<Value>,
    },
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningTextDelta {
        item_id: String,
        output_index: usize,
        content_index: usize,
        delta: String,
    },
    #[serde(rename = "response.reasoning_text.done")]
    ReasoningTextDone {
        item_id: String,
        output_index: usize,
        content_index: usize,
        text: String,
    },
    #[serde(rename = "response.function_call_arguments.delta")]
    FunctionCallArgumentsDelta {
        item_id: String,
        output_index: usize,
        delta: String,
    },
    #[serde(rename = "response.function_call_arguments.done")]
    FunctionCallArgumentsDone {
        item_id: String,
        output_index: usize,
        name: String,
        arguments: String,
    },
    #[serde(rename = "response.mcp_list_tools.in_progress")]
    McpListToolsInProgress {
        item_id: String,
        output_index: usize,
    },
    #[serde(rename = "response.mcp_list_tools.completed")]
    McpListToolsCompleted {
        item_id: String,
        output_index: usize,
    },
    #[serde(rename = "response.mcp_list_tools.failed")]
    McpListToolsFailed {
        item_id: String,
        output_index: usize,
    },
    #[serde(rename = "response.mcp_call_arguments.delta")]
    McpCallArgumentsDelta {
        item_id: String,
        output_index: usize,
        delta: String,
    },
    #[serde(rename = "response.mcp_call_arguments.done")]
    McpCallArgumentsDone {
        item_id: String,
        output_index: usize,
        arguments: String,
    },
    #[serde(rename = "response.mcp_call.in_progress")]
    McpCallInProgress {
        item_id: String,
        output_index: usize,
    },
    #[serde(rename = "response.mcp_call.completed")]
    McpCallCompleted {
        item_id: String,
        output_index: usize,
    },
    #[serde(rename = "response.mcp_call.failed")]
    McpCallFailed {
        item_id: String,
        output_index: usize,
    },
    /// A failure outside the response's own output (the history store).
    #[serde(rename = "error")]
    Error {
        code: String,
        message: String,
        param: Option<String>,
    },
}

impl StreamEvent {
    /// The SSE `event:` name: the `type` the event serializes with.
    pub fn name(&self) -> &'static str {
        match self {
            StreamEvent::Created { .. } => "response.created",
            StreamEvent::InProgress { .. } => "response.in_progress",
            StreamEvent::Completed { .. } => "response.completed",
            StreamEvent::Incomplete { .. } => "response.incomplete",
            StreamEvent::Failed { .. } => "response.failed",
            StreamEvent::Cancelled { .. } => "response.cancelled",
            StreamEvent::OutputItemAdded { .. } => "response.output_item.added",
            StreamEvent::OutputItemDone { .. } => "response.output_item.done",
            StreamEvent::ContentPartAdded { .. } => "response.content_part.added",
            StreamEvent::ContentPartDone { .. } => "response.content_part.done",
            StreamEvent::OutputTextDelta { .. } => "response.output_text.delta",
            StreamEvent::OutputTextDone { .. } => "response.output_text.done",
            StreamEvent::ReasoningTextDelta { .. } => "response.reasoning_text.delta",
            StreamEvent::ReasoningTextDone { .. } => "response.reasoning_text.done",
            StreamEvent::FunctionCallArgumentsDelta { .. } => {
                "response.function_call_arguments.delta"
            }
            StreamEvent::FunctionCallArgumentsDone { .. } => {
                "response.function_call_arguments.done"
            }
            StreamEvent::McpListToolsInProgress { .. } => "response.mcp_list_tools.in_progress",
            StreamEvent::McpListToolsCompleted { .. } => "response.mcp_list_tools.completed",
            StreamEvent::McpListToolsFailed { .. } => "response.mcp_list_tools.failed",
            StreamEvent::McpCallArgumentsDelta { .. } => "response.mcp_call_arguments.delta",
            StreamEvent::McpCallArgumentsDone { .. } => "response.mcp_call_arguments.done",
            StreamEvent::McpCallInProgress { .. } => "response.mcp_call.in_progress",
            StreamEvent::McpCallCompleted { .. } => "response.mcp_call.completed",
            StreamEvent::McpCallFailed { .. } => "response.mcp_call.failed",
            StreamEvent::Error { .. } => "error",
        }
    }
}

/// An event with its place in the stream (`sequence_number`, from 0).
#[derive(Debug, Serialize)]
pub struct Sequenced<'a> {
    #[serde(flatten)]
    pub event: &'a StreamEvent,
    pub sequence_number: u64,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_string_input_is_one_user_message() {
        let items = parse_input(Some(&json!("hi"))).unwrap();
        let [
            Item::Message {
                role, content, id, ..
            },
        ] = items.as_slice()
        else {
            panic!("{items:?}");
        };
        assert_eq!(role, "user");
        assert!(id.starts_with("msg_") && id.len() == 4 + 48, "{id}");
        assert_eq!(content, &[ContentPart::InputText { text: "hi".into() }]);
    }

    #[test]
    fn items_read_with_their_path_in_errors() {
        let input = json!([
            {"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "c1", "name": "f"},
        ]);
        let err = parse_input(Some(&input)).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidInputItem);
        assert_eq!(err.param.as_deref(), Some("input[1].arguments"));

        let err = parse_input(Some(&json!([{"type": "web_search_call"}]))).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("input[0].type"));
        let err = parse_input(Some(&json!([{"role": "tool", "content": "x"}]))).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("input[0].role"));
        let err = parse_input(Some(
            &json!([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]),
        ))
        .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("input[0].content[0].type"));
        let err = parse_input(Some(&json!(3))).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidParameter);
    }

    #[test]
    fn items_keep_client_ids_and_serialize_as_the_api_shows_them() {
        let input = json!([
            {"type": "message", "id": "msg_1", "role": "assistant", "content": "ok"},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f",
             "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "42"},
            {"type": "reasoning", "id": "rs_1", "summary": [],
             "content": [{"type": "reasoning_text", "text": "think"}]},
        ]);
        let items = parse_input(Some(&input)).unwrap();
        assert_eq!(
            items[0].to_value(),
            json!({"type": "message", "id": "msg_1", "role": "assistant",
                   "status": "completed",
                   "content": [{"type": "output_text", "text": "ok", "annotations": [],
                                "logprobs": []}]})
        );
        assert_eq!(
            items[1].to_value(),
            json!({"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f",
                   "arguments": "{}", "status": "completed"})
        );
        assert!(items[2].id().starts_with("fco_"));
        assert_eq!(
            items[3].to_value()["content"],
            json!([{"type": "reasoning_text", "text": "think"}])
        );
        // A stored item reads back as itself.
        for item in &items {
            assert_eq!(&Item::from_input(&item.to_value(), "x").unwrap(), item);
        }
    }

    #[test]
    fn an_owned_id_names_its_object_for_its_owner_only() {
        let id = ids::mint_owned(ids::RESPONSE, "team-a");
        assert!(id.starts_with("resp_") && id.len() == 5 + 48, "{id}");
        assert!(ids::owned_by(&id, "team-a"));
        assert!(!ids::owned_by(&id, "team-b"));
        assert!(!ids::owned_by(&id, ""));
        // A changed digit, a plain minted id, junk.
        let mut forged = id.clone().into_bytes();
        forged[10] = if forged[10] == b'0' { b'1' } else { b'0' };
        assert!(!ids::owned_by(
            &String::from_utf8(forged).unwrap(),
            "team-a"
        ));
        assert!(!ids::owned_by(&ids::mint(ids::RESPONSE), "team-a"));
        assert!(!ids::owned_by("resp_nope", "team-a"));
        assert!(!ids::owned_by("nope", "team-a"));
    }

    #[test]
    fn events_carry_their_type_and_sequence_number() {
        let event = StreamEvent::OutputTextDelta {
            item_id: "msg_1".into(),
            output_index: 0,
            content_index: 0,
            delta: "Hi".into(),
            logprobs: Vec::new(),
        };
        let json = serde_json::to_value(Sequenced {
            event: &event,
            sequence_number: 7,
        })
        .unwrap();
        assert_eq!(json["type"], event.name());
        assert_eq!(json["sequence_number"], 7);
        assert_eq!(json["delta"], "Hi");
    }
}
