//! Anthropic's Messages API (`/v1/messages`) wire types.
//!
//! Agents and SDKs written for Anthropic (Claude Code, the `anthropic` SDKs)
//! speak this dialect: a `system` apart from the messages, typed content
//! blocks, a required `max_tokens`, and a stream of named SSE events. smg
//! serves them from the same open models by converting the conversation to
//! the OpenAI message shape the chat template takes
//! ([`MessagesRequest::chat_messages`]) and answering in Anthropic's shapes.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::forms::{TextOrList, buffered_option, literal_tag};
use super::openai::{AssistantRole, FinishReason};
use super::parse::parse_json_field;
use super::spec::{self, ChatPrompt, GenerationSpec, Prompt, ToolSet, image_urls, tool_name};
use super::tools::{self, ToolDialect, ToolsJson};
use super::validate::{CheckedSampling, Limits, SamplingFields};
use crate::engine::MatchedStop;
use crate::error::{Error, ErrorCode, Result, excerpt};

literal_tag!(
    /// `"message"`, the `type` of a Messages response.
    MessageTag = "message"
);

// ---------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------

/// Who wrote an input message; Anthropic has no system or tool role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InputRole {
    User,
    Assistant,
}

/// A text block: the only block `system` and tool results may hold here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TextBlock {
    Text { text: String },
}

/// Where an image's bytes are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ImageSource {
    Base64 { media_type: String, data: String },
    Url { url: String },
}

impl ImageSource {
    /// The image as one URL: base64 sources become `data:` URLs.
    pub fn to_url(&self) -> String {
        match self {
            ImageSource::Base64 { media_type, data } => format!("data:{media_type};base64,{data}"),
            ImageSource::Url { url } => url.clone(),
        }
    }
}

/// A block of an input message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Text {
        text: String,
    },
    /// User messages only.
    Image {
        source: ImageSource,
    },
    /// Assistant messages only: a call the assistant made earlier.
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
    /// Assistant messages only: reasoning returned earlier, replayed to
    /// templates that read it (`reasoning_content`).
    Thinking {
        thinking: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    /// Assistant messages only: reasoning the client cannot read; dropped.
    RedactedThinking {
        data: String,
    },
    /// User messages only: the answer to a `tool_use`.
    ToolResult {
        tool_use_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<TextOrList<TextBlock>>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputMessage {
    pub role: InputRole,
    pub content: TextOrList<ContentBlock>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The input's JSON schema.
    pub input_schema: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolChoice {
    Auto {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        disable_parallel_tool_use: Option<bool>,
    },
    /// Some tool must be called.
    Any {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        disable_parallel_tool_use: Option<bool>,
    },
    /// This tool must be called.
    Tool {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        disable_parallel_tool_use: Option<bool>,
    },
    None,
}

impl ToolChoice {
    /// At most one `tool_use` block (`disable_parallel_tool_use: true`).
    fn disables_parallel_use(&self) -> bool {
        match self {
            ToolChoice::Auto {
                disable_parallel_tool_use,
            }
            | ToolChoice::Any {
                disable_parallel_tool_use,
            }
            | ToolChoice::Tool {
                disable_parallel_tool_use,
                ..
            } => *disable_parallel_tool_use == Some(true),
            ToolChoice::None => false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    pub user_id: Option<String>,
}

/// `POST /v1/messages`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessagesRequest {
    pub model: String,
    pub messages: Vec<InputMessage>,
    /// A string or text blocks (joined with newlines for the template).
    pub system: Option<TextOrList<TextBlock>>,
    /// Required by Anthropic, so by smg too.
    pub max_tokens: u32,
    pub stop_sequences: Option<Vec<String>>,
    pub stream: Option<bool>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    /// `[Tool]`, kept as text until [`tools::memoized`] parses it.
    pub tools: Option<ToolsJson>,
    #[serde(default, deserialize_with = "buffered_option")]
    pub tool_choice: Option<ToolChoice>,
    /// Extended thinking: `{"type": "enabled", "budget_tokens"}` or
    /// `{"type": "disabled"}`.
    pub thinking: Option<ThinkingConfig>,
    pub metadata: Option<Metadata>,
}

/// Whether a thinking model should think. Thinking models reason whatever
/// the client asks unless their chat template has a switch; `disabled`
/// turns that switch off (as `reasoning_effort: "none"` does on OpenAI's
/// route). The budget is not enforced: the engines have no thinking budget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ThinkingConfig {
    Enabled {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        budget_tokens: Option<u32>,
    },
    Disabled,
}

fn text_of(blocks: &TextOrList<TextBlock>) -> String {
    match blocks {
        TextOrList::Text(text) => text.clone(),
        TextOrList::List(blocks) => blocks
            .iter()
            .map(|TextBlock::Text { text }| text.as_str())
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

impl MessagesRequest {
    /// Validates the request and turns it into the pipeline's spec.
    pub fn to_spec(&self, limits: &Limits) -> Result<GenerationSpec> {
        let tools = self.tool_set()?;
        if self.messages.is_empty() {
            return Err(Error::invalid_parameter(
                "messages",
                "must contain at least one message",
            ));
        }
        let tool_choice = self.resolve_tool_choice(&tools)?;
        let parallel_tool_calls = !self
            .tool_choice
            .as_ref()
            .is_some_and(ToolChoice::disables_parallel_use);
        let constraint =
            tools::tool_constraint(&tool_choice, tools.definitions(), parallel_tool_calls)?;
        let CheckedSampling {
            sampling,
            stop_strings,
        } = SamplingFields {
            param_prefix: "",
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: None,
            frequency_penalty: None,
            presence_penalty: None,
            repetition_penalty: None,
            max_tokens: Some(("max_tokens", self.max_tokens)),
            min_tokens: None,
            n: None,
            stop: self
                .stop_sequences
                .as_deref()
                .map(|stops| ("stop_sequences", stops)),
            stop_token_ids: &[],
            logit_bias: None,
            ignore_eos: false,
            skip_special_tokens: true,
            spaces_between_special_tokens: true,
            no_stop_trim: false,
            constraint,
        }
        .check(limits)?;
        let mut messages = self.chat_messages()?;
        tools::arguments_as_objects(&mut messages);
        let reasoning_effort =
            matches!(self.thinking, Some(ThinkingConfig::Disabled)).then(|| "none".to_owned());
        let mut template_kwargs = serde_json::Map::new();
        if let Some(effort) = &reasoning_effort {
            template_kwargs.insert("reasoning_effort".into(), Value::from(effort.as_str()));
        }
        Ok(GenerationSpec {
            model: Some(self.model.clone()),
            images: image_urls(&messages),
            prompt: Prompt::Chat(ChatPrompt {
                messages,
                tools,
                tool_choice,
                parallel_tool_calls,
                template_kwargs,
                reasoning_effort,
                separate_reasoning: true,
            }),
            sampling,
            stop_strings,
            stream: self.stream.unwrap_or(false),
            include_usage: false,
            logprobs: None,
            echo: false,
            request_id: None,
        })
    }

    /// The conversation in the OpenAI message shape the chat template takes
    /// (see [`ChatPrompt`]):
    ///
    /// - `system` becomes a leading system message (text blocks joined with
    ///   `\n`);
    /// - string content stays a string; user blocks become parts: text →
    ///   `{"type": "text"}`, image → `{"type": "image_url"}` (base64 as a
    ///   `data:` URL);
    /// - each `tool_result` becomes a `tool` message at its place in the
    ///   conversation, splitting the user message around it;
    /// - assistant text blocks are joined with `\n` into `content`;
    ///   `tool_use` blocks become `tool_calls` with `arguments` as JSON text.
    pub fn chat_messages(&self) -> Result<Vec<Value>> {
        let mut messages = Vec::new();
        if let Some(system) = &self.system {
            let text = text_of(system);
            if !text.is_empty() {
                messages.push(json!({"role": "system", "content": text}));
            }
        }
        for (index, message) in self.messages.iter().enumerate() {
            match message.role {
                InputRole::User => push_user_message(index, &message.content, &mut messages)?,
                InputRole::Assistant => messages.push(assistant_message(index, &message.content)?),
            }
        }
        Ok(messages)
    }

    /// The request's tools in OpenAI's shape, parsed and checked (or
    /// remembered from an earlier request with the same `tools` text).
    fn tool_set(&self) -> Result<ToolSet> {
        let Some(json) = &self.tools else {
            return Ok(ToolSet::default());
        };
        tools::memoized(ToolDialect::Anthropic, json.text(), |text| {
            let tools: Vec<Tool> = parse_json_field("tools", text)?;
            Ok(tools
                .into_iter()
                .map(|tool| {
                    let mut function = json!({"name": tool.name, "parameters": tool.input_schema});
                    if let Some(description) = tool.description {
                        function["description"] = Value::from(description);
                    }
                    json!({"type": "function", "function": function})
                })
                .collect())
        })
    }

    fn resolve_tool_choice(&self, tools: &ToolSet) -> Result<spec::ToolChoice> {
        Ok(match &self.tool_choice {
            None | Some(ToolChoice::Auto { .. }) if tools.is_empty() => spec::ToolChoice::None,
            None | Some(ToolChoice::Auto { .. }) => spec::ToolChoice::Auto,
            Some(ToolChoice::None) => spec::ToolChoice::None,
            Some(ToolChoice::Any { .. }) if tools.is_empty() => {
                return Err(Error::invalid_parameter(
                    "tool_choice",
                    "\"any\" requires a non-empty tools",
                ));
            }
            Some(ToolChoice::Any { .. }) => spec::ToolChoice::Required,
            Some(ToolChoice::Tool { name, .. }) => {
                if !tools
                    .definitions()
                    .iter()
                    .any(|tool| tool_name(tool) == Some(name))
                {
                    return Err(Error::invalid_parameter(
                        "tool_choice",
                        format!("names tool {:?}, which is not in tools", excerpt(name)),
                    ));
                }
                spec::ToolChoice::Function(name.clone())
            }
        })
    }
}

fn block_error(message: usize, block: usize, why: &str) -> Error {
    Error::invalid_parameter(&format!("messages[{message}].content[{block}]"), why)
}

fn push_user_message(
    index: usize,
    content: &TextOrList<ContentBlock>,
    messages: &mut Vec<Value>,
) -> Result<()> {
    let blocks = match content {
        TextOrList::Text(text) => {
            messages.push(json!({"role": "user", "content": text}));
            return Ok(());
        }
        TextOrList::List(blocks) => blocks,
    };
    let mut parts = Vec::new();
    for (block_index, block) in blocks.iter().enumerate() {
        match block {
            ContentBlock::Text { text } => parts.push(json!({"type": "text", "text": text})),
            ContentBlock::Image { source } => parts.push(json!({
                "type": "image_url",
                "image_url": {"url": source.to_url()},
            })),
            ContentBlock::ToolResult {
                tool_use_id,
                content,
            } => {
                if !parts.is_empty() {
                    messages.push(json!({"role": "user", "content": std::mem::take(&mut parts)}));
                }
                messages.push(json!({
                    "role": "tool",
                    "tool_call_id": tool_use_id,
                    "content": content.as_ref().map(text_of).unwrap_or_default(),
                }));
            }
            ContentBlock::ToolUse { .. } => {
                return Err(block_error(
                    index,
                    block_index,
                    "tool_use blocks belong in assistant messages",
                ));
            }
            ContentBlock::Thinking { .. } | ContentBlock::RedactedThinking { .. } => {
                return Err(block_error(
                    index,
                    block_index,
                    "thinking blocks belong in assistant messages",
                ));
            }
        }
    }
    if !parts.is_empty() {
        messages.push(json!({"role": "user", "content": parts}));
    }
    Ok(())
}

fn assistant_message(index: usize, content: &TextOrList<ContentBlock>) -> Result<Value> {
    let blocks = match content {
        TextOrList::Text(text) => return Ok(json!({"role": "assistant", "content": text})),
        TextOrList::List(blocks) => blocks,
    };
    let mut texts = Vec::new();
    let mut thinking = Vec::new();
    let mut tool_calls = Vec::new();
    for (block_index, block) in blocks.iter().enumerate() {
        match block {
            ContentBlock::Text { text } => texts.push(text.as_str()),
            ContentBlock::Thinking { thinking: text, .. } => thinking.push(text.as_str()),
            ContentBlock::RedactedThinking { .. } => {}
            ContentBlock::ToolUse { id, name, input } => tool_calls.push(json!({
                "id": id,
                "type": "function",
                "function": {"name": name, "arguments": input.to_string()},
            })),
            ContentBlock::Image { .. } => {
                return Err(block_error(
                    index,
                    block_index,
                    "images are only allowed in user messages",
                ));
            }
            ContentBlock::ToolResult { .. } => {
                return Err(block_error(
                    index,
                    block_index,
                    "tool_result blocks belong in user messages",
                ));
            }
        }
    }
    let content = if texts.is_empty() && !tool_calls.is_empty() {
        Value::Null
    } else {
        Value::from(texts.join("\n"))
    };
    let mut message = json!({"role": "assistant", "content": content});
    if !tool_calls.is_empty() {
        message["tool_calls"] = Value::from(tool_calls);
    }
    if !thinking.is_empty() {
        message["reasoning_content"] = Value::from(thinking.join("\n"));
    }
    Ok(message)
}

// ---------------------------------------------------------------------------
// Responses
// ---------------------------------------------------------------------------

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model finished (EOS or a stop token).
    EndTurn,
    MaxTokens,
    /// One of `stop_sequences` matched (named in `stop_sequence`).
    StopSequence,
    ToolUse,
    Refusal,
}

impl StopReason {
    /// Anthropic's reason, and the matched stop sequence, for a finish the
    /// pipeline described in OpenAI terms. Only a matched stop *string* is a
    /// `stop_sequence`; EOS and stop tokens end the turn.
    pub fn from_finish(
        reason: FinishReason,
        matched: Option<&MatchedStop>,
    ) -> (StopReason, Option<String>) {
        match (reason, matched) {
            (FinishReason::Stop, Some(MatchedStop::Text(text))) => {
                (StopReason::StopSequence, Some(text.clone()))
            }
            (FinishReason::Stop, _) => (StopReason::EndTurn, None),
            (FinishReason::Length, _) => (StopReason::MaxTokens, None),
            (FinishReason::ToolCalls, _) => (StopReason::ToolUse, None),
            (FinishReason::ContentFilter, _) => (StopReason::Refusal, None),
        }
    }
}

/// Token counts, Anthropic style: `input_tokens` excludes the prompt tokens
/// read from the prefix cache, which are counted in
/// `cache_read_input_tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub cache_read_input_tokens: u32,
}

impl Usage {
    /// From the engine's counts (`cached_tokens` ⊆ `prompt_tokens`).
    pub fn from_counts(prompt_tokens: u32, completion_tokens: u32, cached_tokens: u32) -> Self {
        Self {
            input_tokens: prompt_tokens.saturating_sub(cached_tokens),
            output_tokens: completion_tokens,
            cache_read_input_tokens: cached_tokens,
        }
    }
}

/// A block of generated content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseBlock {
    /// A thinking model's reasoning. smg signs nothing: `signature` is
    /// empty, and a signature sent back is not checked.
    Thinking {
        thinking: String,
        signature: String,
    },
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

/// A Messages response; also the `message` of `message_start` (with empty
/// `content` and null `stop_reason`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessagesResponse {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: MessageTag,
    pub role: AssistantRole,
    pub content: Vec<ResponseBlock>,
    pub model: String,
    pub stop_reason: Option<StopReason>,
    pub stop_sequence: Option<String>,
    pub usage: Usage,
}

/// What a `content_block_delta` adds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BlockDelta {
    TextDelta {
        text: String,
    },
    ThinkingDelta {
        thinking: String,
    },
    /// A fragment of a `tool_use` block's input JSON.
    InputJsonDelta {
        partial_json: String,
    },
}

/// The body of `message_delta`: how the message ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageDelta {
    pub stop_reason: Option<StopReason>,
    pub stop_sequence: Option<String>,
}

/// `message_delta`'s usage: cumulative, as Anthropic's current API sends
/// it (the output tokens, and the input counts again, so the last event
/// alone states the whole request's usage).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeltaUsage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u32>,
    pub output_tokens: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_input_tokens: Option<u32>,
}

impl From<Usage> for DeltaUsage {
    fn from(usage: Usage) -> Self {
        Self {
            input_tokens: Some(usage.input_tokens),
            output_tokens: usage.output_tokens,
            cache_read_input_tokens: Some(usage.cache_read_input_tokens),
        }
    }
}

/// An error as Anthropic reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// `invalid_request_error`, `authentication_error`,
    /// `permission_error`, `not_found_error`, `request_too_large`,
    /// `rate_limit_error`, `overloaded_error` or `api_error`.
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
}

impl ErrorDetail {
    pub fn from_error(err: &Error) -> Self {
        Self {
            kind: anthropic_error_type(err.code).to_owned(),
            message: err
                .client_message(crate::pipeline::request_context::client_request_id().as_deref()),
        }
    }
}

/// Anthropic's error type for one of smg's codes, by HTTP status (the
/// types Anthropic documents for each status; other client errors are
/// invalid requests, other server errors API errors).
fn anthropic_error_type(code: ErrorCode) -> &'static str {
    match code.http_status() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// One event of a streamed Messages response, in the order Anthropic sends
/// them: `message_start`, then per content block `content_block_start`,
/// `content_block_delta`s and `content_block_stop`, then `message_delta`
/// and `message_stop`; `ping` may come anywhere, `error` ends the stream.
/// Each is written as an SSE `event: <name>` line and a `data:` line holding
/// the JSON, whose `type` repeats the name ([`StreamEvent::to_sse`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamEvent {
    MessageStart {
        message: MessagesResponse,
    },
    ContentBlockStart {
        index: u32,
        content_block: ResponseBlock,
    },
    ContentBlockDelta {
        index: u32,
        delta: BlockDelta,
    },
    ContentBlockStop {
        index: u32,
    },
    MessageDelta {
        delta: MessageDelta,
        usage: DeltaUsage,
    },
    MessageStop,
    Ping,
    /// Its JSON, `{"type": "error", "error": {"type", "message"}}`, is also
    /// the body of a non-streamed error response.
    Error {
        error: ErrorDetail,
    },
}

impl StreamEvent {
    /// The error event (and non-streamed error body) for `err`.
    pub fn error(err: &Error) -> Self {
        StreamEvent::Error {
            error: ErrorDetail::from_error(err),
        }
    }

    /// The name for the SSE `event:` line.
    pub fn event_name(&self) -> &'static str {
        match self {
            StreamEvent::MessageStart { .. } => "message_start",
            StreamEvent::ContentBlockStart { .. } => "content_block_start",
            StreamEvent::ContentBlockDelta { .. } => "content_block_delta",
            StreamEvent::ContentBlockStop { .. } => "content_block_stop",
            StreamEvent::MessageDelta { .. } => "message_delta",
            StreamEvent::MessageStop => "message_stop",
            StreamEvent::Ping => "ping",
            StreamEvent::Error { .. } => "error",
        }
    }

    /// The event as one SSE frame: `event: <name>\ndata: <json>\n\n`.
    pub fn to_sse(&self) -> Result<String> {
        let data = serde_json::to_string(self)
            .map_err(|err| Error::internal(format!("cannot encode an Anthropic event: {err}")))?;
        Ok(format!("event: {}\ndata: {data}\n\n", self.event_name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Sampling;

    fn messages_request(body: Value) -> MessagesRequest {
        serde_json::from_value(body).expect("a valid Messages request")
    }

    /// What the Anthropic SDK sends for a vision turn after a tool round trip.
    fn sdk_body() -> Value {
        json!({
            "model": "qwen2-vl",
            "max_tokens": 1024,
            "system": [
                {"type": "text", "text": "You are a vision assistant.",
                 "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "Be concise."},
            ],
            "messages": [
                {"role": "user", "content": "What's the weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather",
                     "input": {"city": "Paris"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1",
                     "content": [{"type": "text", "text": "18C, cloudy"}]},
                    {"type": "text", "text": "And what is in this picture?"},
                    {"type": "image", "source": {
                        "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                    {"type": "image", "source": {
                        "type": "url", "url": "https://example.com/b.jpg"}},
                ]},
            ],
            "stop_sequences": ["\n\nHuman:"],
            "stream": true,
            "temperature": 0.3,
            "top_p": 0.9,
            "top_k": 50,
            "tools": [{"name": "weather", "description": "Current weather",
                       "input_schema": {"type": "object",
                                        "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "auto"},
            "metadata": {"user_id": "u-1"},
        })
    }

    #[test]
    fn conversation_converts_to_chat_messages() {
        let request = messages_request(sdk_body());
        let expected = vec![
            json!({"role": "system", "content": "You are a vision assistant.\nBe concise."}),
            json!({"role": "user", "content": "What's the weather in Paris?"}),
            json!({"role": "assistant", "content": "Let me check.", "tool_calls": [
                {"id": "toolu_1", "type": "function",
                 "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}},
            ]}),
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "18C, cloudy"}),
            json!({"role": "user", "content": [
                {"type": "text", "text": "And what is in this picture?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                {"type": "image_url", "image_url": {"url": "https://example.com/b.jpg"}},
            ]}),
        ];
        assert_eq!(request.chat_messages().expect("convertible"), expected);
    }

    #[test]
    fn sdk_request_becomes_a_spec() {
        let request = messages_request(sdk_body());
        assert_eq!(
            request.metadata.as_ref().and_then(|m| m.user_id.as_deref()),
            Some("u-1")
        );
        let spec = request.to_spec(&Limits::default()).expect("valid");
        assert_eq!(spec.model.as_deref(), Some("qwen2-vl"));
        assert_eq!(
            spec.images,
            [
                "data:image/png;base64,iVBORw0KGgo=",
                "https://example.com/b.jpg"
            ]
        );
        assert_eq!(spec.stop_strings, ["\n\nHuman:"]);
        assert!(spec.stream);
        let expected_sampling = Sampling {
            temperature: Some(0.3),
            top_p: Some(0.9),
            top_k: Some(50),
            max_new_tokens: Some(1024),
            skip_special_tokens: true,
            spaces_between_special_tokens: true,
            n: 1,
            ..Sampling::default()
        };
        assert_eq!(spec.sampling, expected_sampling);
        let Prompt::Chat(chat_prompt) = spec.prompt else {
            panic!("a chat prompt");
        };
        assert_eq!(chat_prompt.messages.len(), 5);
        assert_eq!(chat_prompt.tool_choice, spec::ToolChoice::Auto);
        assert_eq!(
            chat_prompt.tools.definitions(),
            vec![json!({"type": "function", "function": {
                "name": "weather", "description": "Current weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            }})]
        );
    }

    #[test]
    fn tool_only_assistant_turn_has_null_content() {
        let request = messages_request(json!({
            "model": "m", "max_tokens": 5, "system": "sys",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t", "content": "done"}]},
            ],
        }));
        assert_eq!(
            request.chat_messages().expect("convertible"),
            vec![
                json!({"role": "system", "content": "sys"}),
                json!({"role": "user", "content": [{"type": "text", "text": "hi"}]}),
                json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ]}),
                json!({"role": "tool", "tool_call_id": "t", "content": "done"}),
            ]
        );
    }

    #[test]
    fn misplaced_blocks_and_bad_parameters_are_rejected() {
        let image = json!({"type": "image", "source": {"type": "url", "url": "u"}});
        let cases = [
            (
                json!([{"role": "assistant", "content": [image]}]),
                json!({}),
                "messages[0].content[0]",
            ),
            (
                json!([{"role": "user", "content": [{"type": "text", "text": "a"},
                    {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]),
                json!({}),
                "messages[0].content[1]",
            ),
            (
                json!([{"role": "assistant", "content": [
                    {"type": "tool_result", "tool_use_id": "t"}]}]),
                json!({}),
                "messages[0].content[0]",
            ),
            (json!([]), json!({}), "messages"),
            (
                json!([{"role": "user", "content": "hi"}]),
                json!({"max_tokens": 0}),
                "max_tokens",
            ),
            (
                json!([{"role": "user", "content": "hi"}]),
                json!({"stop_sequences": [""]}),
                "stop_sequences",
            ),
            (
                json!([{"role": "user", "content": "hi"}]),
                json!({"tool_choice": {"type": "any"}}),
                "tool_choice",
            ),
            (
                json!([{"role": "user", "content": "hi"}]),
                json!({"tools": [{"name": "f", "input_schema": {}}],
                       "tool_choice": {"type": "tool", "name": "g"}}),
                "tool_choice",
            ),
        ];
        for (messages, extra, param) in cases {
            let mut body = json!({"model": "m", "max_tokens": 10, "messages": messages});
            if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
                body.extend(extra.clone());
            }
            let err = messages_request(body)
                .to_spec(&Limits::default())
                .expect_err(param);
            assert_eq!(err.code, ErrorCode::InvalidParameter, "{param}: {err}");
            assert_eq!(err.param.as_deref(), Some(param), "{err}");
        }
    }

    #[test]
    fn response_serializes_as_anthropic_does() {
        let response = MessagesResponse {
            id: "msg_1".into(),
            kind: MessageTag,
            role: AssistantRole,
            content: vec![ResponseBlock::Text {
                text: "Hello!".into(),
            }],
            model: "qwen2-vl".into(),
            stop_reason: Some(StopReason::StopSequence),
            stop_sequence: Some("\n\nHuman:".into()),
            usage: Usage::from_counts(30, 4, 16),
        };
        let expected = json!({
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": "Hello!"}],
            "model": "qwen2-vl",
            "stop_reason": "stop_sequence",
            "stop_sequence": "\n\nHuman:",
            "usage": {"input_tokens": 14, "output_tokens": 4, "cache_read_input_tokens": 16},
        });
        let actual = serde_json::to_value(&response).expect("serialize");
        assert_eq!(actual, expected);
        assert_eq!(
            serde_json::from_value::<MessagesResponse>(actual).expect("parse back"),
            response
        );
    }

    #[test]
    fn stop_reasons_follow_what_matched() {
        let cases = [
            (
                FinishReason::Stop,
                Some(MatchedStop::Text("END".into())),
                (StopReason::StopSequence, Some("END".to_string())),
            ),
            (
                FinishReason::Stop,
                Some(MatchedStop::TokenId(4002)),
                (StopReason::EndTurn, None),
            ),
            (FinishReason::Stop, None, (StopReason::EndTurn, None)),
            (FinishReason::Length, None, (StopReason::MaxTokens, None)),
            (FinishReason::ToolCalls, None, (StopReason::ToolUse, None)),
        ];
        for (reason, matched, expected) in cases {
            assert_eq!(
                StopReason::from_finish(reason, matched.as_ref()),
                expected,
                "{reason:?} {matched:?}"
            );
        }
    }

    #[test]
    fn stream_events_are_sse_frames_named_by_their_type() {
        let start = StreamEvent::MessageStart {
            message: MessagesResponse {
                id: "msg_1".into(),
                kind: MessageTag,
                role: AssistantRole,
                content: Vec::new(),
                model: "m".into(),
                stop_reason: None,
                stop_sequence: None,
                usage: Usage::from_counts(10, 0, 0),
            },
        };
        let cases = [
            (
                start,
                "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":10,\"output_tokens\":0,\"cache_read_input_tokens\":0}}}\n\n",
            ),
            (
                StreamEvent::ContentBlockStart {
                    index: 0,
                    content_block: ResponseBlock::Text {
                        text: String::new(),
                    },
                },
                "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            ),
            (
                StreamEvent::ContentBlockDelta {
                    index: 0,
                    delta: BlockDelta::TextDelta { text: "Hi".into() },
                },
                "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
            ),
            (
                StreamEvent::ContentBlockDelta {
                    index: 1,
                    delta: BlockDelta::InputJsonDelta {
                        partial_json: "{\"ci".into(),
                    },
                },
                "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"ci\"}}\n\n",
            ),
            (
                StreamEvent::ContentBlockStop { index: 0 },
                "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
            ),
            (
                StreamEvent::MessageDelta {
                    delta: MessageDelta {
                        stop_reason: Some(StopReason::EndTurn),
                        stop_sequence: None,
                    },
                    usage: Usage::from_counts(30, 2, 16).into(),
                },
                "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"input_tokens\":14,\"output_tokens\":2,\"cache_read_input_tokens\":16}}\n\n",
            ),
            (
                StreamEvent::MessageStop,
                "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
            ),
            (
                StreamEvent::Ping,
                "event: ping\ndata: {\"type\":\"ping\"}\n\n",
            ),
            (
                StreamEvent::error(&Error::new(ErrorCode::Overloaded, "busy")),
                "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"}}\n\n",
            ),
        ];
        for (event, expected) in cases {
            assert_eq!(event.to_sse().expect("encodable"), expected);
        }
    }

    #[test]
    fn error_types_follow_the_status() {
        let cases = [
            (ErrorCode::InvalidParameter, "invalid_request_error"),
            (ErrorCode::ModelNotFound, "not_found_error"),
            (ErrorCode::WorkerOverloaded, "rate_limit_error"),
            (ErrorCode::NoHealthyWorker, "overloaded_error"),
            (ErrorCode::InternalError, "api_error"),
            (ErrorCode::WorkerTimeout, "api_error"),
            (ErrorCode::InvalidApiKey, "authentication_error"),
            (ErrorCode::PermissionDenied, "permission_error"),
            (ErrorCode::PayloadTooLarge, "request_too_large"),
            (ErrorCode::QueueTimeout, "invalid_request_error"),
            (ErrorCode::MethodNotAllowed, "invalid_request_error"),
            (ErrorCode::QueueFull, "rate_limit_error"),
        ];
        for (code, expected) in cases {
            let detail = ErrorDetail::from_error(&Error::new(code, "x"));
            assert_eq!(detail.kind, expected, "{code}");
        }
    }

    #[test]
    fn malformed_tools_name_the_field_at_fault_from_the_body_root() {
        let err = messages_request(json!({
            "model": "m", "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "weather", "input_schema": {}}, {"name": "no_schema"}],
        }))
        .to_spec(&Limits::default())
        .expect_err("a tool without input_schema");
        assert_eq!(err.code, ErrorCode::InvalidRequest, "{err}");
        assert_eq!(err.param.as_deref(), Some("tools[1].input_schema"), "{err}");
    }
}
