//! OpenAI's Chat Completions, Completions and Models wire types.
//!
//! Most clients (the OpenAI SDKs, LangChain, benchmark tools) speak this
//! dialect, so these types follow OpenAI's field names, `object` values and
//! null-vs-absent conventions exactly. SGLang's sampling extensions (`top_k`,
//! `min_p`, `regex`, ...) are accepted at the top level, as SGLang's own
//! OpenAI server does. Unknown fields are ignored (clients send many we do
//! not use); a known field with the wrong type is an `invalid_request`.
//!
//! Requests become a [`GenerationSpec`] through
//! [`ChatCompletionRequest::to_spec`] and [`CompletionRequest::to_spec`].

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::forms::{
    InputItem, JsonText, ListObject, PromptInput, StringOrList, TextOrList, literal_tag,
};
use super::parse::parse_json_field;
use super::spec::{self, ChatPrompt, GenerationSpec, Prompt, ToolSet, image_urls, tool_name};
use super::tools::{self, ToolDialect, ToolsJson};
use super::validate::{
    CheckedSampling, Limits, SamplingFields, check_inputs, check_top_logprobs, single_constraint,
};
use crate::engine::Constraint;
use crate::error::{Error, Result, excerpt};

literal_tag!(
    /// `"chat.completion"`.
    ChatCompletionObject = "chat.completion"
);
literal_tag!(
    /// `"chat.completion.chunk"`.
    ChatCompletionChunkObject = "chat.completion.chunk"
);
literal_tag!(
    /// `"text_completion"`, for completions and their stream chunks alike.
    TextCompletionObject = "text_completion"
);
literal_tag!(
    /// `"model"`.
    ModelObject = "model"
);
literal_tag!(
    /// `"function"`, the only tool type.
    FunctionTag = "function"
);
literal_tag!(
    /// `"assistant"`, the role of every generated message.
    AssistantRole = "assistant"
);

/// The JSON schema `response_format: {"type": "json_object"}` constrains
/// output to: any JSON object.
pub const ANY_JSON_OBJECT_SCHEMA: &str = r#"{"type":"object"}"#;

// ---------------------------------------------------------------------------
// Chat requests
// ---------------------------------------------------------------------------

/// Who wrote a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    /// OpenAI's newer name for system instructions.
    Developer,
    User,
    Assistant,
    Tool,
}

impl Role {
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    /// The role chat templates see: `developer` means `system` to them, as
    /// open-model templates know no `developer` role.
    pub const fn template_role(self) -> &'static str {
        match self {
            Role::Developer => "system",
            other => other.as_str(),
        }
    }
}

/// A message's content: a string or a list of parts.
pub type MessageContent = TextOrList<ContentPart>;

/// One part of a multi-part message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    Text { text: String },
    ImageUrl { image_url: ImageUrl },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageUrl {
    /// An `http(s)` or `data:` URL.
    pub url: String,
    /// `"auto"`, `"low"` or `"high"`; passed through, not interpreted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// A call the assistant made, as it appears in the conversation history and
/// in responses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type", default)]
    pub kind: FunctionTag,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// The arguments as a JSON text.
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    /// Absent or null only on assistant messages that call tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<MessageContent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// Which call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant turn's reasoning, as a response returned it; templates
    /// that replay reasoning (gpt-oss, DeepSeek) read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The same under the other names clients send it back by (`reasoning`
    /// as newer servers return it, `thinking`). Passed on as sent: the
    /// renderer also gives the first one set as `reasoning_content` and
    /// `thinking`, as `transformers` does (`tokenizer::chat_template`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    #[serde(rename = "type", default)]
    pub kind: FunctionTag,
    pub function: FunctionDefinition,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionDefinition {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The arguments' JSON schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// `"none"`, `"auto"`, `"required"`, or `{"type": "function", "function":
/// {"name"}}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ToolChoice {
    Mode(ToolChoiceMode),
    Function(NamedToolChoice),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolChoiceMode {
    None,
    Auto,
    Required,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NamedToolChoice {
    #[serde(rename = "type", default)]
    pub kind: FunctionTag,
    pub function: FunctionName,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionName {
    pub name: String,
}

impl<'de> Deserialize<'de> for ToolChoice {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ToolChoiceVisitor;

        impl<'de> Visitor<'de> for ToolChoiceVisitor {
            type Value = ToolChoice;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#""none", "auto", "required" or a named function"#)
            }

            fn visit_str<E: de::Error>(self, mode: &str) -> Result<Self::Value, E> {
                ToolChoiceMode::deserialize(de::value::StrDeserializer::new(mode))
                    .map(ToolChoice::Mode)
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                NamedToolChoice::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(ToolChoice::Function)
            }
        }

        deserializer.deserialize_any(ToolChoiceVisitor)
    }
}

/// `response_format`: free text, any JSON object, or JSON matching a schema.
///
/// Read by a hand-written visitor rather than serde's internally tagged
/// form, which would buffer the object through a key-sorting map and lose
/// the schema's property order (see [`JsonText`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsonSchemaFormat {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The schema, in the client's key order; absent means any JSON object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<JsonText>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

impl<'de> Deserialize<'de> for ResponseFormat {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ResponseFormatVisitor;

        impl<'de> Visitor<'de> for ResponseFormatVisitor {
            type Value = ResponseFormat;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#"an object with "type": "text", "json_object" or "json_schema""#)
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                const TYPES: &[&str] = &["text", "json_object", "json_schema"];
                let mut kind: Option<String> = None;
                let mut json_schema: Option<JsonSchemaFormat> = None;
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "type" => kind = Some(map.next_value()?),
                        "json_schema" => json_schema = Some(map.next_value()?),
                        _ => {
                            map.next_value::<de::IgnoredAny>()?;
                        }
                    }
                }
                match kind.as_deref() {
                    None => Err(de::Error::missing_field("type")),
                    Some("text") => Ok(ResponseFormat::Text),
                    Some("json_object") => Ok(ResponseFormat::JsonObject),
                    Some("json_schema") => json_schema
                        .map(|json_schema| ResponseFormat::JsonSchema { json_schema })
                        .ok_or_else(|| de::Error::missing_field("json_schema")),
                    Some(other) => Err(de::Error::unknown_variant(other, TYPES)),
                }
            }
        }

        deserializer.deserialize_map(ResponseFormatVisitor)
    }
}

impl ResponseFormat {
    /// The engine constraint this format asks for (`None` for free text).
    pub fn constraint(&self) -> Option<Constraint> {
        match self {
            ResponseFormat::Text => None,
            ResponseFormat::JsonObject => {
                Some(Constraint::JsonSchema(ANY_JSON_OBJECT_SCHEMA.to_owned()))
            }
            ResponseFormat::JsonSchema { json_schema } => Some(Constraint::JsonSchema(
                json_schema
                    .schema
                    .as_ref()
                    .map_or(ANY_JSON_OBJECT_SCHEMA, JsonText::as_str)
                    .to_owned(),
            )),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` (and no choices) before `[DONE]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_usage: Option<bool>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub n: Option<u32>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub stop: Option<StringOrList>,
    /// Deprecated by OpenAI in favour of `max_completion_tokens`; still what
    /// most clients send.
    pub max_tokens: Option<u32>,
    /// Wins over `max_tokens` when both are set.
    pub max_completion_tokens: Option<u32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// Token id (as a string) → bias in [-100, 100].
    pub logit_bias: Option<BTreeMap<String, f32>>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u32>,
    /// Accepted for compatibility; not forwarded (the engine protocols carry
    /// no seed).
    pub seed: Option<i64>,
    /// The end user, for the caller's logs.
    pub user: Option<String>,
    /// `[Tool]`, kept as text until [`tools::memoized`] parses it.
    pub tools: Option<ToolsJson>,
    pub tool_choice: Option<ToolChoice>,
    /// Default true; false allows one call at most.
    pub parallel_tool_calls: Option<bool>,
    pub response_format: Option<ResponseFormat>,
    /// `"none"` (or `"minimal"`) turns a thinking model's reasoning off where
    /// its chat template has a switch; passed to the template as well.
    pub reasoning_effort: Option<String>,
    // SGLang extensions.
    /// Default true: reasoning goes to `reasoning_content`, not `content`.
    pub separate_reasoning: Option<bool>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub min_tokens: Option<u32>,
    pub ignore_eos: Option<bool>,
    /// Default true.
    pub skip_special_tokens: Option<bool>,
    /// Default true.
    pub spaces_between_special_tokens: Option<bool>,
    pub no_stop_trim: Option<bool>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub regex: Option<String>,
    pub ebnf: Option<String>,
    /// Extra chat-template variables, e.g. `{"enable_thinking": false}`.
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
}

/// The output-token limit a chat or completion request set, and under which
/// name: `max_completion_tokens` wins over `max_tokens`.
fn output_token_limit(
    max_completion_tokens: Option<u32>,
    max_tokens: Option<u32>,
) -> Option<(&'static str, u32)> {
    max_completion_tokens
        .map(|value| ("max_completion_tokens", value))
        .or(max_tokens.map(|value| ("max_tokens", value)))
}

/// At most one of `response_format`, `regex`, `ebnf` and a forced tool call.
fn openai_constraint(
    response_format: Option<&ResponseFormat>,
    regex: Option<&String>,
    ebnf: Option<&String>,
    tool_call: Option<Constraint>,
) -> Result<Option<Constraint>> {
    single_constraint([
        ("tool_choice", tool_call),
        (
            "response_format",
            response_format.and_then(ResponseFormat::constraint),
        ),
        ("regex", regex.cloned().map(Constraint::Regex)),
        ("ebnf", ebnf.cloned().map(Constraint::EbnfGrammar)),
    ])
}

/// The [`SamplingFields`] of a chat or completion request: both carry the
/// same sampling fields under the same names.
macro_rules! openai_sampling_fields {
    ($request:expr, $constraint:expr) => {
        SamplingFields {
            param_prefix: "",
            temperature: $request.temperature,
            top_p: $request.top_p,
            top_k: $request.top_k,
            min_p: $request.min_p,
            frequency_penalty: $request.frequency_penalty,
            presence_penalty: $request.presence_penalty,
            repetition_penalty: $request.repetition_penalty,
            max_tokens: output_token_limit($request.max_completion_tokens, $request.max_tokens),
            min_tokens: $request.min_tokens.map(|value| ("min_tokens", value)),
            n: $request.n,
            stop: $request.stop.as_ref().map(|stop| ("stop", stop.as_slice())),
            stop_token_ids: $request.stop_token_ids.as_deref().unwrap_or_default(),
            logit_bias: $request.logit_bias.as_ref(),
            ignore_eos: $request.ignore_eos.unwrap_or(false),
            skip_special_tokens: $request.skip_special_tokens.unwrap_or(true),
            spaces_between_special_tokens: $request.spaces_between_special_tokens.unwrap_or(true),
            no_stop_trim: $request.no_stop_trim.unwrap_or(false),
            constraint: $constraint,
        }
    };
}

/// Whether a stream ends with a usage-only chunk.
fn wants_usage_chunk(stream: bool, options: Option<&StreamOptions>) -> bool {
    stream && options.and_then(|options| options.include_usage) == Some(true)
}

fn to_json<T: Serialize>(value: &T) -> Result<Value> {
    serde_json::to_value(value)
        .map_err(|err| Error::internal(format!("cannot re-encode a request field: {err}")))
}

impl ChatCompletionRequest {
    /// Validates the request and turns it into the pipeline's spec.
    pub fn to_spec(&self, limits: &Limits) -> Result<GenerationSpec> {
        let tools = self.tool_set()?;
        self.check_messages()?;
        let logprobs = self.logprobs.unwrap_or(false);
        check_top_logprobs(
            "top_logprobs",
            self.top_logprobs,
            (!logprobs).then_some("logprobs"),
        )?;
        let tool_choice = self.resolve_tool_choice(&tools)?;
        let parallel_tool_calls = self.parallel_tool_calls.unwrap_or(true);
        let constraint = openai_constraint(
            self.response_format.as_ref(),
            self.regex.as_ref(),
            self.ebnf.as_ref(),
            tools::tool_constraint(&tool_choice, tools.definitions(), parallel_tool_calls)?,
        )?;
        let CheckedSampling {
            sampling,
            stop_strings,
        } = openai_sampling_fields!(self, constraint).check(limits)?;

        let mut messages = self.template_messages()?;
        tools::arguments_as_objects(&mut messages);
        let mut template_kwargs = serde_json::Map::new();
        if let Some(effort) = &self.reasoning_effort {
            template_kwargs.insert("reasoning_effort".into(), Value::from(effort.as_str()));
        }
        // The client's own variables win over ours.
        template_kwargs.extend(self.chat_template_kwargs.clone().unwrap_or_default());
        let stream = self.stream.unwrap_or(false);
        Ok(GenerationSpec {
            model: Some(self.model.clone()),
            images: image_urls(&messages),
            prompt: Prompt::Chat(ChatPrompt {
                messages,
                tools,
                tool_choice,
                parallel_tool_calls,
                template_kwargs,
                reasoning_effort: self.reasoning_effort.clone(),
                separate_reasoning: self.separate_reasoning.unwrap_or(true),
            }),
            sampling,
            stop_strings,
            stream,
            include_usage: wants_usage_chunk(stream, self.stream_options.as_ref()),
            logprobs: logprobs.then(|| self.top_logprobs.unwrap_or(0)),
            echo: false,
            request_id: None,
        })
    }

    /// The messages as JSON for the chat template (see [`ChatPrompt`]).
    fn template_messages(&self) -> Result<Vec<Value>> {
        self.messages
            .iter()
            .map(|message| {
                let mut value = to_json(message)?;
                value["role"] = Value::from(message.role.template_role());
                Ok(value)
            })
            .collect()
    }

    fn check_messages(&self) -> Result<()> {
        if self.messages.is_empty() {
            return Err(Error::invalid_parameter(
                "messages",
                "must contain at least one message",
            ));
        }
        for (index, message) in self.messages.iter().enumerate() {
            if message.role == Role::Tool && message.tool_call_id.is_none() {
                return Err(Error::invalid_parameter(
                    &format!("messages[{index}].tool_call_id"),
                    "is required for tool messages",
                ));
            }
            let calls_tools = message
                .tool_calls
                .as_ref()
                .is_some_and(|calls| !calls.is_empty());
            let missing_content = match (message.role, &message.content) {
                (_, Some(_)) => continue,
                (Role::Assistant, None) if calls_tools => continue,
                (Role::Assistant, None) => "assistant messages need content or tool_calls".into(),
                (role, None) => format!("is required for {} messages", role.as_str()),
            };
            return Err(Error::invalid_parameter(
                &format!("messages[{index}].content"),
                missing_content,
            ));
        }
        Ok(())
    }

    /// The request's tools, parsed and checked (or remembered from an
    /// earlier request with the same `tools` text).
    fn tool_set(&self) -> Result<ToolSet> {
        let Some(json) = &self.tools else {
            return Ok(ToolSet::default());
        };
        tools::memoized(ToolDialect::OpenAi, json.text(), |text| {
            parse_json_field::<Vec<Tool>>("tools", text)?
                .iter()
                .map(to_json)
                .collect()
        })
    }

    fn resolve_tool_choice(&self, tools: &ToolSet) -> Result<spec::ToolChoice> {
        let requires_tools = |what: &str| {
            Error::invalid_parameter("tool_choice", format!("{what} requires a non-empty tools"))
        };
        Ok(match &self.tool_choice {
            None if tools.is_empty() => spec::ToolChoice::None,
            None => spec::ToolChoice::Auto,
            Some(ToolChoice::Mode(ToolChoiceMode::None)) => spec::ToolChoice::None,
            Some(ToolChoice::Mode(ToolChoiceMode::Auto)) if tools.is_empty() => {
                spec::ToolChoice::None
            }
            Some(ToolChoice::Mode(ToolChoiceMode::Auto)) => spec::ToolChoice::Auto,
            Some(ToolChoice::Mode(ToolChoiceMode::Required)) if tools.is_empty() => {
                return Err(requires_tools("\"required\""));
            }
            Some(ToolChoice::Mode(ToolChoiceMode::Required)) => spec::ToolChoice::Required,
            Some(ToolChoice::Function(named)) => {
                let name = &named.function.name;
                if tools.is_empty() {
                    return Err(requires_tools("a named function"));
                }
                if !tools
                    .definitions()
                    .iter()
                    .any(|tool| tool_name(tool) == Some(name))
                {
                    return Err(Error::invalid_parameter(
                        "tool_choice",
                        format!("names function {:?}, which is not in tools", excerpt(name)),
                    ));
                }
                spec::ToolChoice::Function(name.clone())
            }
        })
    }
}

// ---------------------------------------------------------------------------
// Completion requests
// ---------------------------------------------------------------------------

/// `POST /v1/completions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionRequest {
    pub model: String,
    /// A string, strings, token ids or token-id lists; batches (more than one
    /// prompt) are rejected by [`CompletionRequest::to_spec`].
    pub prompt: PromptInput,
    /// Not supported: any non-empty suffix is rejected.
    pub suffix: Option<String>,
    /// Put the prompt before the completion.
    pub echo: Option<bool>,
    /// The number of alternatives to return with each token's logprob.
    pub logprobs: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub n: Option<u32>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub stop: Option<StringOrList>,
    pub max_tokens: Option<u32>,
    /// Not OpenAI's for completions; accepted like chat's, and wins over
    /// `max_tokens`.
    pub max_completion_tokens: Option<u32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub logit_bias: Option<BTreeMap<String, f32>>,
    /// Accepted for compatibility; not forwarded.
    pub seed: Option<i64>,
    pub user: Option<String>,
    pub response_format: Option<ResponseFormat>,
    // SGLang extensions.
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub min_tokens: Option<u32>,
    pub ignore_eos: Option<bool>,
    pub skip_special_tokens: Option<bool>,
    pub spaces_between_special_tokens: Option<bool>,
    pub no_stop_trim: Option<bool>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub regex: Option<String>,
    pub ebnf: Option<String>,
}

impl CompletionRequest {
    /// Validates the request and turns it into the pipeline's spec.
    pub fn to_spec(&self, limits: &Limits) -> Result<GenerationSpec> {
        if self
            .suffix
            .as_ref()
            .is_some_and(|suffix| !suffix.is_empty())
        {
            return Err(Error::invalid_parameter("suffix", "is not supported"));
        }
        let mut prompts = self.prompt.to_items();
        check_inputs("prompt", &prompts)?;
        if prompts.len() > 1 {
            return Err(Error::invalid_parameter(
                "prompt",
                format!(
                    "holds {} prompts; batched prompts are not supported, send one per request",
                    prompts.len()
                ),
            ));
        }
        check_top_logprobs("logprobs", self.logprobs, None)?;
        let constraint = openai_constraint(
            self.response_format.as_ref(),
            self.regex.as_ref(),
            self.ebnf.as_ref(),
            None,
        )?;
        let CheckedSampling {
            sampling,
            stop_strings,
        } = openai_sampling_fields!(self, constraint).check(limits)?;

        let prompt = match prompts.pop() {
            Some(InputItem::Text(text)) => Prompt::Text(text),
            Some(InputItem::TokenIds(ids)) => Prompt::TokenIds(ids),
            None => return Err(Error::internal("a checked prompt list was empty")),
        };
        let stream = self.stream.unwrap_or(false);
        Ok(GenerationSpec {
            model: Some(self.model.clone()),
            prompt,
            images: Vec::new(),
            sampling,
            stop_strings,
            stream,
            include_usage: wants_usage_chunk(stream, self.stream_options.as_ref()),
            logprobs: self.logprobs,
            echo: self.echo.unwrap_or(false),
            request_id: None,
        })
    }
}

// ---------------------------------------------------------------------------
// Responses
// ---------------------------------------------------------------------------

/// Why a choice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// EOS or a stop sequence.
    Stop,
    /// The output-token limit.
    Length,
    /// The model called tools.
    ToolCalls,
    ContentFilter,
}

/// Token counts. `total_tokens` is always the sum of the other two.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the engine's prefix cache.
    pub cached_tokens: u32,
}

impl Usage {
    /// Usage with `total_tokens` computed; `cached_tokens` fills
    /// `prompt_tokens_details` when known.
    pub fn new(prompt_tokens: u32, completion_tokens: u32, cached_tokens: Option<u32>) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens.saturating_add(completion_tokens),
            prompt_tokens_details: cached_tokens
                .map(|cached_tokens| PromptTokensDetails { cached_tokens }),
        }
    }
}

/// Chat logprobs: one entry per generated token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    /// The token's UTF-8 bytes (null when not representable).
    pub bytes: Option<Vec<u8>>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Option<Vec<u8>>,
}

/// The message of a non-streamed chat choice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssistantMessage {
    pub role: AssistantRole,
    /// Null when the model only called tools.
    pub content: Option<String>,
    /// A thinking model's reasoning, split off the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<FinishReason>,
}

/// The envelope of every OpenAI completion answer, chat or text, whole or
/// streamed: `Object` is its `object` tag, `Choice` its choice shape and
/// `U` its usage — [`Usage`] on whole answers, `Option<Usage>` on stream
/// chunks, where only the last (usage-only) chunk writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionEnvelope<Object, Choice, U: UsageField> {
    pub id: String,
    pub object: Object,
    /// Unix seconds.
    pub created: u64,
    pub model: String,
    pub choices: Vec<Choice>,
    #[serde(skip_serializing_if = "UsageField::is_absent")]
    pub usage: U,
}

/// The `usage` of a [`CompletionEnvelope`]: always written on whole
/// answers, written when present on chunks.
pub trait UsageField {
    fn is_absent(&self) -> bool;
}

impl UsageField for Usage {
    fn is_absent(&self) -> bool {
        false
    }
}

impl UsageField for Option<Usage> {
    fn is_absent(&self) -> bool {
        self.is_none()
    }
}

/// A non-streamed chat completion.
pub type ChatCompletionResponse = CompletionEnvelope<ChatCompletionObject, ChatChoice, Usage>;

/// What a stream chunk adds to a choice. The first chunk of a choice
/// carries the role; later ones text or tool-call fragments.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<AssistantRole>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// A thinking model's reasoning, split off the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// A fragment of a tool call: the first names it, later ones extend its
/// arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallDelta {
    pub index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<FunctionTag>,
    pub function: FunctionCallDelta,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FunctionCallDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// A choice in a stream chunk. `logprobs` and `finish_reason` are always
/// written, as null until set: clients test `finish_reason !== null`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<FinishReason>,
}

/// One `data:` event of a streamed chat completion. With
/// `stream_options.include_usage`, the last chunk has no choices and carries
/// `usage`; other chunks omit `usage`.
pub type ChatCompletionChunk =
    CompletionEnvelope<ChatCompletionChunkObject, ChunkChoice, Option<Usage>>;

/// Completion logprobs, in OpenAI's legacy column form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    /// Null for the first echoed prompt token (it has no logprob).
    pub token_logprobs: Vec<Option<f32>>,
    /// Per position, token → logprob, most likely first.
    pub top_logprobs: Vec<Option<RankedLogprobs>>,
    /// Character offset of each token in the returned text.
    pub text_offset: Vec<u32>,
}

/// Alternatives at one position, serialized as a JSON object whose key
/// order is the ranking (a map type would sort the tokens instead).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RankedLogprobs(pub Vec<(String, f32)>);

impl Serialize for RankedLogprobs {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(token, logprob)| (token, logprob)))
    }
}

impl<'de> Deserialize<'de> for RankedLogprobs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct RankedVisitor;

        impl<'de> Visitor<'de> for RankedVisitor {
            type Value = RankedLogprobs;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of token → logprob")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut ranked = Vec::new();
                while let Some(entry) = map.next_entry::<String, f32>()? {
                    ranked.push(entry);
                }
                Ok(RankedLogprobs(ranked))
            }
        }

        deserializer.deserialize_map(RankedVisitor)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<FinishReason>,
}

/// A non-streamed completion.
pub type CompletionResponse = CompletionEnvelope<TextCompletionObject, CompletionChoice, Usage>;

/// One `data:` event of a streamed completion (OpenAI tags these
/// `"text_completion"` too); `text` is the new text only.
pub type CompletionChunk =
    CompletionEnvelope<TextCompletionObject, CompletionChoice, Option<Usage>>;

/// One served model, for `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCard {
    pub id: String,
    pub object: ModelObject,
    pub created: u64,
    pub owned_by: String,
    /// The model's context length (SGLang's extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<u32>,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelList {
    pub object: ListObject,
    pub data: Vec<ModelCard>,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::engine::Sampling;
    use crate::error::ErrorCode;
    use serde_json::json;

    fn chat(body: Value) -> ChatCompletionRequest {
        serde_json::from_value(body).expect("a valid chat request")
    }

    fn completion(body: Value) -> CompletionRequest {
        serde_json::from_value(body).expect("a valid completion request")
    }

    fn assert_rejected(result: Result<GenerationSpec>, code: ErrorCode, param: &str) {
        let err = result.expect_err(param);
        assert_eq!(err.code, code, "{param}: {err}");
        assert_eq!(err.param.as_deref(), Some(param), "{err}");
    }

    /// What the OpenAI Python SDK sends for a vision + tools streaming call.
    fn sdk_chat_body() -> Value {
        json!({
            "model": "qwen2-vl",
            "messages": [
                {"role": "system", "content": "You are a careful assistant."},
                {"role": "user", "content": [
                    {"type": "text", "text": "What is in this image?"},
                    {"type": "image_url", "image_url": {
                        "url": "https://example.com/cat.png", "detail": "high"}},
                ]},
                {"role": "assistant", "content": null, "reasoning": "Look it up.",
                 "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "lookup", "arguments": "{\"q\":\"cat\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "a tabby cat"},
            ],
            "temperature": 0.2,
            "top_p": 0.95,
            "max_completion_tokens": 256,
            "max_tokens": 64,
            "stream": true,
            "stream_options": {"include_usage": true},
            "stop": ["\n\n", "END"],
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
            "logit_bias": {"50256": -100},
            "logprobs": true,
            "top_logprobs": 3,
            "seed": 42,
            "user": "user-1234",
            "tools": [{"type": "function", "function": {
                "name": "lookup", "description": "Search",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}
            }}],
            "tool_choice": "auto",
            "parallel_tool_calls": true,
            "response_format": {"type": "text"},
        })
    }

    #[test]
    fn sdk_chat_request_with_images_tools_and_stream_options_becomes_a_spec() {
        let request = chat(sdk_chat_body());
        assert_eq!(request.messages.len(), 4);
        assert_eq!(request.seed, Some(42));
        assert_eq!(request.user.as_deref(), Some("user-1234"));
        let spec = request
            .to_spec(&Limits {
                max_output_tokens: Some(4096),
            })
            .expect("valid");

        let Prompt::Chat(chat_prompt) = &spec.prompt else {
            panic!("chat requests give a chat prompt, got {:?}", spec.prompt);
        };
        let expected_messages = vec![
            json!({"role": "system", "content": "You are a careful assistant."}),
            json!({"role": "user", "content": [
                {"type": "text", "text": "What is in this image?"},
                {"type": "image_url", "image_url": {
                    "url": "https://example.com/cat.png", "detail": "high"}},
            ]}),
            // Past arguments reach the template as a mapping, as the Python
            // servers hand them to HF templates; null content is left out and
            // reasoning keeps the name it was sent by.
            json!({"role": "assistant", "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "lookup", "arguments": {"q": "cat"}}}
            ], "reasoning": "Look it up."}),
            json!({"role": "tool", "tool_call_id": "call_1", "content": "a tabby cat"}),
        ];
        assert_eq!(chat_prompt.messages, expected_messages);
        assert_eq!(
            chat_prompt.tools.definitions(),
            vec![json!({"type": "function", "function": {
                "name": "lookup", "description": "Search",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}
            }})]
        );
        assert_eq!(chat_prompt.tool_choice, spec::ToolChoice::Auto);
        assert!(chat_prompt.template_kwargs.is_empty());

        assert_eq!(spec.model.as_deref(), Some("qwen2-vl"));
        assert_eq!(spec.images, ["https://example.com/cat.png"]);
        assert_eq!(spec.stop_strings, ["\n\n", "END"]);
        assert!(spec.stream);
        assert!(spec.include_usage);
        assert_eq!(spec.logprobs, Some(3));
        assert!(!spec.echo);
        let expected_sampling = Sampling {
            temperature: Some(0.2),
            top_p: Some(0.95),
            presence_penalty: Some(0.5),
            frequency_penalty: Some(-0.5),
            max_new_tokens: Some(256),
            skip_special_tokens: true,
            spaces_between_special_tokens: true,
            n: 1,
            logit_bias: vec![("50256".into(), -100.0)],
            ..Sampling::default()
        };
        assert_eq!(spec.sampling, expected_sampling);
    }

    #[test]
    fn sglang_extensions_reach_the_engine_sampling() {
        let request = chat(json!({
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "top_k": 20, "min_p": 0.1, "repetition_penalty": 1.05,
            "min_tokens": 4, "max_tokens": 16, "ignore_eos": true,
            "skip_special_tokens": false, "spaces_between_special_tokens": false,
            "no_stop_trim": true, "stop_token_ids": [151645],
            "regex": "(yes|no)", "n": 2,
            "chat_template_kwargs": {"enable_thinking": false},
            "separate_reasoning": true,
        }));
        let spec = request.to_spec(&Limits::default()).expect("valid");
        let expected = Sampling {
            top_k: Some(20),
            min_p: Some(0.1),
            repetition_penalty: Some(1.05),
            max_new_tokens: Some(16),
            min_new_tokens: 4,
            stop_token_ids: vec![151645],
            ignore_eos: true,
            skip_special_tokens: false,
            spaces_between_special_tokens: false,
            no_stop_trim: true,
            n: 2,
            constraint: Some(Constraint::Regex("(yes|no)".into())),
            ..Sampling::default()
        };
        assert_eq!(spec.sampling, expected);
        let Prompt::Chat(chat_prompt) = spec.prompt else {
            panic!("chat prompt expected");
        };
        assert_eq!(
            chat_prompt.template_kwargs.get("enable_thinking"),
            Some(&json!(false))
        );
        assert!(!spec.stream && !spec.include_usage);
        assert_eq!(spec.logprobs, None);
    }

    #[test]
    fn output_token_limit_prefers_max_completion_tokens() {
        let base = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        let cases = [
            (json!({}), None),
            (json!({"max_tokens": 10}), Some(10)),
            (json!({"max_completion_tokens": 20}), Some(20)),
            (
                json!({"max_tokens": 10, "max_completion_tokens": 20}),
                Some(20),
            ),
        ];
        for (extra, expected) in cases {
            let mut body = base.clone();
            if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
                body.extend(extra.clone());
            }
            let spec = chat(body).to_spec(&Limits::default()).expect("valid");
            assert_eq!(spec.sampling.max_new_tokens, expected, "{extra}");
        }
    }

    #[test]
    fn response_formats_become_constraints() {
        // Raw bodies, not `json!`: a `Value` would already have sorted the
        // schema's keys, and their order is what this checks.
        let cases = [
            (r#"{"type": "text"}"#, None),
            (r#"{"type": "json_object"}"#, Some(r#"{"type":"object"}"#)),
            (
                r#"{"json_schema": {"name": "person", "strict": true, "schema":
                    {"type": "object", "properties": {"name": {"type": "string"},
                     "age": {"type": "integer"}}, "required": ["name", "age"]}},
                   "type": "json_schema"}"#,
                Some(
                    r#"{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"]}"#,
                ),
            ),
            (
                r#"{"type": "json_schema", "json_schema": {"name": "any"}}"#,
                Some(r#"{"type":"object"}"#),
            ),
        ];
        for (format, expected) in cases {
            let body = format!(
                r#"{{"model": "m", "messages": [{{"role": "user", "content": "hi"}}],
                    "response_format": {format}}}"#
            );
            let request: ChatCompletionRequest =
                serde_json::from_str(&body).expect("a valid chat request");
            let spec = request.to_spec(&Limits::default()).expect("valid");
            let expected = expected.map(|schema| Constraint::JsonSchema(schema.to_owned()));
            assert_eq!(spec.sampling.constraint, expected, "{format}");
        }
        for bad in [r#"{"type": "yaml"}"#, r#"{"json_schema": {"name": "x"}}"#] {
            let body = format!(r#"{{"model": "m", "messages": [], "response_format": {bad}}}"#);
            assert!(
                serde_json::from_str::<ChatCompletionRequest>(&body).is_err(),
                "{bad}"
            );
        }
        let ebnf = chat(json!({
            "model": "m", "messages": [{"role": "user", "content": "hi"}],
            "ebnf": "root ::= \"a\"",
        }));
        assert_eq!(
            ebnf.to_spec(&Limits::default())
                .expect("valid")
                .sampling
                .constraint,
            Some(Constraint::EbnfGrammar("root ::= \"a\"".into()))
        );
    }

    #[test]
    fn forced_tool_calls_are_constraints_and_conflict_with_response_format() {
        let tools = json!([{"type": "function", "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        }}]);
        let with = |extra: Value| {
            let mut body = json!({
                "model": "m", "messages": [{"role": "user", "content": "hi"}],
                "tools": tools,
            });
            if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
                body.extend(extra.clone());
            }
            chat(body).to_spec(&Limits::default())
        };
        let named = with(json!({"tool_choice":
            {"type": "function", "function": {"name": "get_weather"}}}))
        .expect("valid");
        assert_eq!(
            named.sampling.constraint,
            Some(Constraint::JsonSchema(
                r#"{"type":"object","properties":{"city":{"type":"string"}}}"#.into()
            ))
        );
        let required =
            with(json!({"tool_choice": "required", "parallel_tool_calls": false})).expect("valid");
        let Some(Constraint::JsonSchema(schema)) = required.sampling.constraint else {
            panic!("required sends a schema");
        };
        let schema: Value = serde_json::from_str(&schema).unwrap();
        assert_eq!(schema["maxItems"], 1);
        let auto = with(json!({"tool_choice": "auto", "response_format": {"type": "json_object"}}))
            .expect("auto forces nothing, so a format is fine");
        assert_eq!(
            auto.sampling.constraint,
            Some(Constraint::JsonSchema(ANY_JSON_OBJECT_SCHEMA.into()))
        );
        let clash =
            with(json!({"tool_choice": "required", "response_format": {"type": "json_object"}}))
                .unwrap_err();
        assert_eq!(clash.param.as_deref(), Some("response_format"));
        assert!(clash.message.contains("tool_choice"), "{}", clash.message);
        let unknown = with(json!({"tool_choice":
            {"type": "function", "function": {"name": "nope"}}}))
        .unwrap_err();
        assert_eq!(unknown.code.http_status(), 400);
        assert_eq!(unknown.param.as_deref(), Some("tool_choice"));
    }

    #[test]
    fn developer_messages_reach_the_template_as_system() {
        let request = chat(json!({
            "model": "m",
            "messages": [
                {"role": "developer", "content": "Answer in French."},
                {"role": "user", "content": "hello", "name": "ann"},
            ],
        }));
        let spec = request.to_spec(&Limits::default()).expect("valid");
        let Prompt::Chat(chat_prompt) = spec.prompt else {
            panic!("chat prompt expected");
        };
        assert_eq!(
            chat_prompt.messages,
            vec![
                json!({"role": "system", "content": "Answer in French."}),
                json!({"role": "user", "content": "hello", "name": "ann"}),
            ]
        );
        assert_eq!(chat_prompt.tool_choice, spec::ToolChoice::None);
    }

    #[test]
    fn invalid_chat_requests_name_the_parameter() {
        let user = json!({"role": "user", "content": "hi"});
        let tools = json!([{"type": "function", "function": {"name": "lookup"}}]);
        let cases = [
            (json!({"messages": []}), "messages"),
            (
                json!({"messages": [{"role": "tool", "content": "x"}]}),
                "messages[0].tool_call_id",
            ),
            (
                json!({"messages": [user, {"role": "user"}]}),
                "messages[1].content",
            ),
            (
                json!({"messages": [{"role": "assistant", "tool_calls": []}]}),
                "messages[0].content",
            ),
            (
                json!({"messages": [user], "top_logprobs": 2}),
                "top_logprobs",
            ),
            (
                json!({"messages": [user], "logprobs": true, "top_logprobs": 21}),
                "top_logprobs",
            ),
            (
                json!({"messages": [user], "tool_choice": "required"}),
                "tool_choice",
            ),
            (
                json!({"messages": [user], "tools": tools,
                       "tool_choice": {"type": "function", "function": {"name": "other"}}}),
                "tool_choice",
            ),
            (
                json!({"messages": [user], "response_format": {"type": "json_object"},
                       "regex": "a+"}),
                "regex",
            ),
            (
                json!({"messages": [user], "temperature": 2.5}),
                "temperature",
            ),
            (json!({"messages": [user], "stop": ""}), "stop"),
            (
                json!({"messages": [user], "max_completion_tokens": 0}),
                "max_completion_tokens",
            ),
            (json!({"messages": [user], "n": 129}), "n"),
            (
                json!({"messages": [user], "logit_bias": {"7": 101}}),
                "logit_bias",
            ),
        ];
        for (mut body, param) in cases {
            body["model"] = json!("m");
            let result = chat(body.clone()).to_spec(&Limits::default());
            assert_rejected(result, ErrorCode::InvalidParameter, param);
        }
    }

    #[test]
    fn usage_chunk_only_when_streaming_and_asked() {
        let asked = StreamOptions {
            include_usage: Some(true),
        };
        let declined = StreamOptions {
            include_usage: Some(false),
        };
        let cases = [
            (true, Some(&asked), true),
            (false, Some(&asked), false),
            (true, Some(&declined), false),
            (true, None, false),
        ];
        for (stream, options, expected) in cases {
            assert_eq!(
                wants_usage_chunk(stream, options),
                expected,
                "{stream} {options:?}"
            );
        }
    }

    #[test]
    fn named_tool_choice_is_resolved() {
        let request = chat(json!({
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "lookup"}}],
            "tool_choice": {"type": "function", "function": {"name": "lookup"}},
        }));
        let spec = request.to_spec(&Limits::default()).expect("valid");
        let Prompt::Chat(chat_prompt) = spec.prompt else {
            panic!("chat prompt expected");
        };
        assert_eq!(
            chat_prompt.tool_choice,
            spec::ToolChoice::Function("lookup".into())
        );
        let unknown_mode = serde_json::from_value::<ToolChoice>(json!("sometimes"));
        assert!(unknown_mode.is_err());
    }

    #[test]
    fn completion_prompts_in_token_form() {
        let cases = [
            (json!([1, 2, 3]), Prompt::TokenIds(vec![1, 2, 3])),
            (json!([[4, 5]]), Prompt::TokenIds(vec![4, 5])),
            (json!("Once upon"), Prompt::Text("Once upon".into())),
            (json!(["Once upon"]), Prompt::Text("Once upon".into())),
        ];
        for (prompt, expected) in cases {
            let request = completion(json!({
                "model": "m", "prompt": prompt, "max_tokens": 8,
                "echo": true, "logprobs": 2, "stream": true,
                "stream_options": {"include_usage": true},
            }));
            let spec = request.to_spec(&Limits::default()).expect("valid");
            assert_eq!(spec.prompt, expected, "{prompt}");
            assert!(spec.echo);
            assert_eq!(spec.logprobs, Some(2));
            assert!(spec.include_usage);
            assert_eq!(spec.sampling.max_new_tokens, Some(8));
            assert!(spec.images.is_empty());
        }
    }

    #[test]
    fn invalid_completion_requests_name_the_parameter() {
        let cases = [
            (json!({"prompt": [[1], [2]]}), "prompt"),
            (json!({"prompt": ["a", "b"]}), "prompt"),
            (json!({"prompt": []}), "prompt"),
            (json!({"prompt": ""}), "prompt"),
            (json!({"prompt": "a", "suffix": "z"}), "suffix"),
            (json!({"prompt": "a", "logprobs": 21}), "logprobs"),
            (json!({"prompt": "a", "top_p": 0}), "top_p"),
            (json!({"prompt": "a", "top_k": 0}), "top_k"),
        ];
        for (mut body, param) in cases {
            body["model"] = json!("m");
            let result = completion(body.clone()).to_spec(&Limits::default());
            assert_rejected(result, ErrorCode::InvalidParameter, param);
        }
        let empty_suffix = completion(json!({"model": "m", "prompt": "a", "suffix": ""}));
        empty_suffix
            .to_spec(&Limits::default())
            .expect("an empty suffix is no suffix");
    }

    #[test]
    fn chat_response_serializes_as_openai_does() {
        let response = ChatCompletionResponse {
            id: "chatcmpl-1".into(),
            object: ChatCompletionObject,
            created: 1_700_000_000,
            model: "qwen2-vl".into(),
            choices: vec![ChatChoice {
                index: 0,
                message: AssistantMessage {
                    role: AssistantRole,
                    content: Some("A cat.".into()),
                    reasoning_content: None,
                    tool_calls: None,
                },
                logprobs: None,
                finish_reason: Some(FinishReason::Stop),
            }],
            usage: Usage::new(20, 3, Some(16)),
        };
        let expected = json!({
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": "qwen2-vl",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": "A cat."},
                "logprobs": null,
                "finish_reason": "stop",
            }],
            "usage": {
                "prompt_tokens": 20, "completion_tokens": 3, "total_tokens": 23,
                "prompt_tokens_details": {"cached_tokens": 16},
            },
        });
        let actual = serde_json::to_value(&response).expect("serialize");
        assert_eq!(actual, expected);
        let back: ChatCompletionResponse = serde_json::from_value(actual).expect("parse back");
        assert_eq!(back, response);
    }

    #[test]
    fn tool_call_response_has_null_content() {
        let message = AssistantMessage {
            role: AssistantRole,
            content: None,
            reasoning_content: None,
            tool_calls: Some(vec![ToolCall {
                id: "call_9".into(),
                kind: FunctionTag,
                function: FunctionCall {
                    name: "lookup".into(),
                    arguments: "{}".into(),
                },
            }]),
        };
        assert_eq!(
            serde_json::to_value(&message).expect("serialize"),
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_9", "type": "function",
                 "function": {"name": "lookup", "arguments": "{}"}}
            ]})
        );
    }

    #[test]
    fn chat_chunks_serialize_as_openai_does() {
        let first = ChatCompletionChunk {
            id: "chatcmpl-1".into(),
            object: ChatCompletionChunkObject,
            created: 7,
            model: "m".into(),
            choices: vec![ChunkChoice {
                index: 0,
                delta: Delta {
                    role: Some(AssistantRole),
                    content: Some(String::new()),
                    reasoning_content: None,
                    tool_calls: None,
                },
                logprobs: None,
                finish_reason: None,
            }],
            usage: None,
        };
        assert_eq!(
            serde_json::to_value(&first).expect("serialize"),
            json!({
                "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7,
                "model": "m",
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                             "logprobs": null, "finish_reason": null}],
            })
        );

        let last = ChatCompletionChunk {
            choices: vec![ChunkChoice {
                index: 0,
                delta: Delta::default(),
                logprobs: None,
                finish_reason: Some(FinishReason::Length),
            }],
            ..first.clone()
        };
        assert_eq!(
            serde_json::to_value(&last).expect("serialize")["choices"],
            json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": "length"}])
        );

        let usage_chunk = ChatCompletionChunk {
            choices: Vec::new(),
            usage: Some(Usage::new(5, 2, None)),
            ..first
        };
        assert_eq!(
            serde_json::to_value(&usage_chunk).expect("serialize"),
            json!({
                "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7,
                "model": "m", "choices": [],
                "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
            })
        );
    }

    #[test]
    fn tool_call_deltas_serialize_fragments_only() {
        let named = ToolCallDelta {
            index: 0,
            id: Some("call_1".into()),
            kind: Some(FunctionTag),
            function: FunctionCallDelta {
                name: Some("lookup".into()),
                arguments: Some(String::new()),
            },
        };
        let fragment = ToolCallDelta {
            index: 0,
            id: None,
            kind: None,
            function: FunctionCallDelta {
                name: None,
                arguments: Some("{\"q\":".into()),
            },
        };
        assert_eq!(
            serde_json::to_value([named, fragment]).expect("serialize"),
            json!([
                {"index": 0, "id": "call_1", "type": "function",
                 "function": {"name": "lookup", "arguments": ""}},
                {"index": 0, "function": {"arguments": "{\"q\":"}},
            ])
        );
    }

    #[test]
    fn chat_logprobs_serialize_with_bytes_and_alternatives() {
        let logprobs = ChatLogprobs {
            content: vec![ChatTokenLogprob {
                token: "Hi".into(),
                logprob: -0.5,
                bytes: Some(vec![72, 105]),
                top_logprobs: vec![TopLogprob {
                    token: "Hi".into(),
                    logprob: -0.5,
                    bytes: None,
                }],
            }],
        };
        assert_eq!(
            serde_json::to_value(&logprobs).expect("serialize"),
            json!({"content": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105],
                "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": null}]}]})
        );
    }

    #[test]
    fn completion_response_and_chunk_serialize_as_openai_does() {
        let response = CompletionResponse {
            id: "cmpl-1".into(),
            object: TextCompletionObject,
            created: 9,
            model: "m".into(),
            choices: vec![CompletionChoice {
                index: 0,
                text: " there".into(),
                logprobs: Some(CompletionLogprobs {
                    tokens: vec!["Hi".into(), " there".into()],
                    token_logprobs: vec![None, Some(-1.5)],
                    top_logprobs: vec![
                        None,
                        Some(RankedLogprobs(vec![
                            (" there".into(), -1.5),
                            (" all".into(), -2.0),
                        ])),
                    ],
                    text_offset: vec![0, 2],
                }),
                finish_reason: Some(FinishReason::Length),
            }],
            usage: Usage::new(1, 1, None),
        };
        let text = serde_json::to_string(&response).expect("serialize");
        assert!(
            text.contains(r#"{" there":-1.5," all":-2.0}"#),
            "ranking order kept: {text}"
        );
        assert_eq!(
            serde_json::from_str::<Value>(&text).expect("json"),
            json!({
                "id": "cmpl-1", "object": "text_completion", "created": 9, "model": "m",
                "choices": [{
                    "index": 0, "text": " there",
                    "logprobs": {
                        "tokens": ["Hi", " there"],
                        "token_logprobs": [null, -1.5],
                        "top_logprobs": [null, {" there": -1.5, " all": -2.0}],
                        "text_offset": [0, 2],
                    },
                    "finish_reason": "length",
                }],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            })
        );
        let back: CompletionResponse = serde_json::from_str(&text).expect("parse back");
        assert_eq!(back, response);

        let chunk = CompletionChunk {
            id: "cmpl-1".into(),
            object: TextCompletionObject,
            created: 9,
            model: "m".into(),
            choices: vec![CompletionChoice {
                index: 0,
                text: " the".into(),
                logprobs: None,
                finish_reason: None,
            }],
            usage: None,
        };
        assert_eq!(
            serde_json::to_value(&chunk).expect("serialize"),
            json!({
                "id": "cmpl-1", "object": "text_completion", "created": 9, "model": "m",
                "choices": [{"index": 0, "text": " the", "logprobs": null, "finish_reason": null}],
            })
        );
        let back: CompletionChunk =
            serde_json::from_value(serde_json::to_value(&chunk).expect("serialize"))
                .expect("a chunk without usage parses back");
        assert_eq!(back, chunk);
    }

    #[test]
    fn model_list_serializes_as_openai_does() {
        let list = ModelList {
            object: ListObject,
            data: vec![ModelCard {
                id: "qwen2-vl".into(),
                object: ModelObject,
                created: 1,
                owned_by: "smg".into(),
                max_model_len: Some(32768),
            }],
        };
        assert_eq!(
            serde_json::to_value(&list).expect("serialize"),
            json!({"object": "list", "data": [{
                "id": "qwen2-vl", "object": "model", "created": 1, "owned_by": "smg",
                "max_model_len": 32768,
            }]})
        );
    }

    #[test]
    fn malformed_tools_name_the_field_at_fault_from_the_body_root() {
        let user = json!({"role": "user", "content": "hi"});
        for (tools, param) in [
            (
                json!([{"type": "function", "function": {"name": "a"}},
                       {"type": "function", "function": {"description": "no name"}}]),
                "tools[1].function.name",
            ),
            (
                json!([{"type": "function", "function": {"name": 7}}]),
                "tools[0].function.name",
            ),
            (json!({"name": "not a list"}), "tools"),
        ] {
            let err = chat(json!({"model": "m", "messages": [user], "tools": tools}))
                .to_spec(&Limits::default())
                .expect_err("malformed tools");
            assert_eq!(err.code, ErrorCode::InvalidRequest, "{err}");
            assert_eq!(err.param.as_deref(), Some(param), "{err}");
            assert!(err.message.starts_with(&format!("{param}: ")), "{err}");
        }
    }

    #[test]
    fn requests_with_the_same_tools_text_share_one_tool_set() {
        let body = |question: &str| {
            json!({"model": "m", "messages": [{"role": "user", "content": question}],
                   "tools": [{"type": "function", "function": {"name": "memo_probe_tool",
                       "parameters": {"type": "object"}}}]})
        };
        let tools = |spec: GenerationSpec| match spec.prompt {
            Prompt::Chat(chat) => chat.tools,
            other => panic!("not a chat prompt: {other:?}"),
        };
        let first = tools(chat(body("one")).to_spec(&Limits::default()).unwrap());
        let second = tools(chat(body("two")).to_spec(&Limits::default()).unwrap());
        assert!(first.shares_views_with(&second));
        assert_eq!(first.specs()[0].name, "memo_probe_tool");
        // Other text, other set (even when it means the same tools).
        let mut spaced = chat(body("three"));
        spaced.tools = Some(
            serde_json::from_str(
                r#"{"tools": [ {"type": "function", "function": {"name": "memo_probe_tool", "parameters": {"type": "object"}}} ]}"#,
            )
            .map(|wrapper: std::collections::HashMap<String, ToolsJson>| wrapper["tools"].clone())
            .unwrap(),
        );
        let third = tools(spaced.to_spec(&Limits::default()).unwrap());
        assert!(!third.shares_views_with(&first));
        assert_eq!(third, first);
    }
}
