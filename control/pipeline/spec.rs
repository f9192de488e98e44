//! The protocol-neutral generation request the pipeline consumes.
//!
//! Four endpoints generate text (`/v1/chat/completions`, `/v1/completions`,
//! `/generate`, `/v1/messages`), each with its own wire shape and names.
//! After parsing, each request's `to_spec` validates it and produces one
//! [`GenerationSpec`]; the pipeline's stages read only this type, so they
//! never match on the dialect the client spoke. Only the response stage
//! goes back to the dialect's own response types.

use serde_json::Value;

pub use super::tool_set::ToolSet;

use crate::engine::Sampling;

/// One prompt of a batch (embeddings, classification, `/generate` and
/// completions batches): text to tokenize, or token ids as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputItem {
    Text(String),
    TokenIds(Vec<u32>),
}

impl InputItem {
    pub fn is_empty(&self) -> bool {
        match self {
            InputItem::Text(text) => text.is_empty(),
            InputItem::TokenIds(ids) => ids.is_empty(),
        }
    }
}

/// One validated generation request, whatever endpoint it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationSpec {
    /// The model the client named; `None` for SGLang's `/generate`, which
    /// names none (the gateway's default model serves it).
    pub model: Option<String>,
    pub prompt: Prompt,
    /// The request's images in prompt order, as the client referenced them:
    /// `http(s)` URLs, `data:` URLs, or (from `/generate`'s `image_data`)
    /// whatever SGLang accepts there, including bare base64. Fetching and
    /// decoding them, and refusing schemes such as local paths, is the
    /// media stage's job.
    pub images: Vec<String>,
    /// What the engine samples with; validated.
    pub sampling: Sampling,
    /// Stop strings the gateway matches and trims itself (engines run
    /// without a tokenizer and take only `sampling.stop_token_ids`).
    pub stop_strings: Vec<String>,
    pub stream: bool,
    /// OpenAI streams only: end the stream with a chunk carrying `usage`
    /// (`stream_options.include_usage`).
    pub include_usage: bool,
    /// `Some(k)`: return each output token's logprob with `k` alternatives
    /// (`k` may be 0); `None`: no logprobs.
    pub logprobs: Option<u32>,
    /// Completions only: put the prompt before the generated text.
    pub echo: bool,
    /// A request id the client chose (SGLang's `rid`); the gateway mints one
    /// when `None`.
    pub request_id: Option<String>,
}

/// What to feed the model.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Raw text: tokenize as is (no chat template).
    Text(String),
    /// Token ids the client tokenized itself.
    TokenIds(Vec<u32>),
    /// A conversation for the chat template.
    Chat(ChatPrompt),
}

/// A conversation in the OpenAI message shape, ready for a chat template.
///
/// Messages are JSON objects `{"role", "content", ...}` where `content` is a
/// string, a list of parts (`{"type": "text", "text"}`,
/// `{"type": "image_url", "image_url": {"url"}}`) or absent; assistant
/// messages may carry OpenAI `tool_calls` (with `function.arguments` as a JSON
/// string) and tool results are `{"role": "tool", "tool_call_id", "content"}`.
/// Anthropic requests are converted to this same shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatPrompt {
    pub messages: Vec<Value>,
    /// Tool definitions in OpenAI's shape:
    /// `{"type": "function", "function": {"name", "description", "parameters"}}`.
    pub tools: ToolSet,
    pub tool_choice: ToolChoice,
    /// False: at most one call (`parallel_tool_calls`).
    pub parallel_tool_calls: bool,
    /// Extra variables for the chat template (`chat_template_kwargs`, e.g.
    /// `{"enable_thinking": false}`, and `reasoning_effort`).
    pub template_kwargs: serde_json::Map<String, Value>,
    /// OpenAI's `reasoning_effort`: `"none"`/`"minimal"` turn thinking off
    /// where the model's template can.
    pub reasoning_effort: Option<String>,
    /// Reasoning goes to its own field (`reasoning_content`, Anthropic
    /// `thinking` blocks) rather than into the answer text.
    pub separate_reasoning: bool,
}

/// Whether and which tool the model should call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Never call a tool.
    None,
    /// The model decides (the default when tools are given).
    Auto,
    /// The model must call some tool.
    Required,
    /// The model must call this function.
    Function(String),
}

/// The name of an OpenAI-shaped tool (`{"type": "function", "function":
/// {"name", ...}}`).
pub fn tool_name(tool: &Value) -> Option<&str> {
    tool.get("function")?.get("name")?.as_str()
}

/// The tool `tool_choice` names, or the request's error (400 naming
/// `tool_choice`) when `tools` has no function of that name.
pub fn named_tool<'a>(tools: &'a [Value], name: &str) -> crate::error::Result<&'a Value> {
    tools
        .iter()
        .find(|tool| tool_name(tool) == Some(name))
        .ok_or_else(|| {
            crate::error::Error::invalid_parameter(
                "tool_choice",
                format!(
                    "names function {:?}, which is not in tools",
                    crate::error::excerpt(name)
                ),
            )
        })
}

/// The arguments schema of an OpenAI-shaped tool; any object when absent.
pub fn tool_parameters(tool: &Value) -> Value {
    tool.get("function")
        .and_then(|function| function.get("parameters"))
        .filter(|schema| !schema.is_null())
        .cloned()
        .unwrap_or_else(|| serde_json::json!({"type": "object"}))
}

/// The image URLs of OpenAI-shaped messages, in order: every
/// `{"type": "image_url", "image_url": {"url"}}` part.
pub(crate) fn image_urls(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .filter_map(|message| message.get("content")?.as_array())
        .flatten()
        .filter(|part| part.get("type").and_then(Value::as_str) == Some("image_url"))
        .filter_map(|part| part.get("image_url")?.get("url")?.as_str())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn image_urls_are_collected_in_prompt_order() {
        let messages = vec![
            json!({"role": "system", "content": "be brief"}),
            json!({"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "https://a/1.png"}},
                {"type": "text", "text": "and"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ]}),
            json!({"role": "assistant", "content": "ok"}),
            json!({"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "https://a/2.png", "detail": "low"}},
            ]}),
        ];
        assert_eq!(
            image_urls(&messages),
            [
                "https://a/1.png",
                "data:image/png;base64,AAAA",
                "https://a/2.png"
            ]
        );
    }
}
