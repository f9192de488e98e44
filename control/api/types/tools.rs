//! Tool calling on the request side, the same for every dialect: how a
//! `tool_choice` that forces a call becomes an engine constraint, and how
//! past calls in the conversation reach the chat template.
//!
//! Why it exists: OpenAI's chat and Anthropic's messages (and the Responses
//! API after them) all end in one [`ChatPrompt`](super::spec::ChatPrompt)
//! with OpenAI-shaped tools; forcing a call is the engine's job (grammar-
//! constrained decoding) and must not depend on the model's own markup, so
//! the constraint is built here from the tools' schemas alone:
//!
//! - `required`: the model writes a JSON array of one or more
//!   `{"name": <one of the tools>, "parameters": <its arguments>}` objects
//!   (one item at most when `parallel_tool_calls` is false), which the
//!   gateway parses with the `json` tool parser;
//! - a named function: the model writes that function's arguments object,
//!   which the gateway returns as the one call.
//!
//! A forced call is a structured-output constraint like `response_format`,
//! `regex` and `ebnf`; the engines take one, so asking for two is a 400
//! naming both (see [`super::validate::single_constraint`]).

use std::fmt;
use std::sync::LazyLock;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use super::spec::{ToolChoice, ToolSet};
pub use super::spec::{named_tool, tool_name, tool_parameters};
use crate::engine::Constraint;
use crate::error::{Error, Result, excerpt};
use crate::memo::Memo;

/// A request's `tools` array as the client wrote it: kept as text until
/// [`memoized`] turns it into a [`ToolSet`], once per distinct text.
#[derive(Clone)]
pub struct ToolsJson(Box<RawValue>);

impl ToolsJson {
    /// The JSON text of `tools` (tools a gateway builds itself, e.g. the
    /// Responses API's function tools in chat shape).
    pub fn from_definitions<T: Serialize + ?Sized>(tools: &T) -> Result<Self> {
        serde_json::value::to_raw_value(tools)
            .map(Self)
            .map_err(|err| Error::internal(format!("tools do not serialize: {err}")))
    }

    pub fn text(&self) -> &str {
        self.0.get()
    }
}

impl<'de> Deserialize<'de> for ToolsJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        Box::<RawValue>::deserialize(deserializer).map(Self)
    }
}

impl Serialize for ToolsJson {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl PartialEq for ToolsJson {
    fn eq(&self, other: &Self) -> bool {
        self.text() == other.text()
    }
}

impl fmt::Debug for ToolsJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text())
    }
}

/// The request shape a `tools` text is written in: the same text means
/// different tools in different dialects, so each has its own memo.
#[derive(Debug, Clone, Copy)]
pub enum ToolDialect {
    /// `[{"type": "function", "function": {...}}]` (chat completions, and
    /// the Responses API's tools once in that shape).
    OpenAi,
    /// `[{"name", "description", "input_schema"}]` (`/v1/messages`).
    Anthropic,
}

/// What each dialect's memo of tool sets may hold. A set holds its
/// definitions, the template's copy with each tool's JSON text and the
/// parsers' schemas: about [`SET_BYTES_PER_TEXT_BYTE`] times its text.
const TOOL_SET_MEMO_BYTES: usize = 32 * 1024 * 1024;
const SET_BYTES_PER_TEXT_BYTE: usize = 12;

/// Tool sets by the exact text of the `tools` they came from, one memo per
/// dialect. Process-wide because the mapping is a pure function of the
/// text (every model and listener would build the same set); nothing
/// behaves differently on a hit except the time it takes.
static TOOL_SETS: LazyLock<[Memo<ToolSet>; 2]> = LazyLock::new(|| {
    [
        Memo::new(TOOL_SET_MEMO_BYTES),
        Memo::new(TOOL_SET_MEMO_BYTES),
    ]
});

/// The [`ToolSet`] for a `tools` text of `dialect`: remembered from an
/// earlier request with the same text, else `convert`ed (OpenAI-shaped
/// definitions, or the request's error, which is not remembered).
pub fn memoized(
    dialect: ToolDialect,
    text: &str,
    convert: impl FnOnce(&str) -> Result<Vec<Value>>,
) -> Result<ToolSet> {
    let memo = &TOOL_SETS[dialect as usize];
    if let Some(tools) = memo.get(text) {
        return Ok(tools);
    }
    let tools = ToolSet::new(convert(text)?);
    memo.insert(text, tools.clone(), text.len() * SET_BYTES_PER_TEXT_BYTE);
    Ok(tools)
}

/// The engine constraint that enforces `choice`, or `None` when the model
/// is free (`none`, `auto`).
pub fn tool_constraint(
    choice: &ToolChoice,
    tools: &[Value],
    parallel_tool_calls: bool,
) -> Result<Option<Constraint>> {
    let schema = match choice {
        ToolChoice::None | ToolChoice::Auto => return Ok(None),
        ToolChoice::Function(name) => {
            let tool = named_tool(tools, name)?;
            tool_parameters(tool)
        }
        ToolChoice::Required => required_call_schema(tools, parallel_tool_calls)?,
    };
    Ok(Some(Constraint::JsonSchema(schema.to_string())))
}

/// `[{"name": <tool>, "parameters": <its schema>}, ...]`, one or more items
/// (exactly one when parallel calls are off). Each tool's `$defs` move to the
/// root so its `#/$defs/...` references still resolve; two tools defining
/// the same name differently cannot share one root and are refused.
fn required_call_schema(tools: &[Value], parallel_tool_calls: bool) -> Result<Value> {
    let mut defs = Map::new();
    let mut alternatives = Vec::with_capacity(tools.len());
    for (index, tool) in tools.iter().enumerate() {
        let name = tool_name(tool).ok_or_else(|| {
            Error::invalid_parameter(&format!("tools[{index}].function.name"), "is required")
        })?;
        let mut parameters = tool_parameters(tool);
        if let Some(Value::Object(own)) = parameters
            .as_object_mut()
            .and_then(|schema| schema.remove("$defs"))
        {
            for (def_name, def) in own {
                match defs.get(&def_name) {
                    Some(existing) if existing != &def => {
                        return Err(Error::invalid_parameter(
                            &format!(
                                "tools[{index}].function.parameters.$defs.{}",
                                excerpt(&def_name)
                            ),
                            "is defined differently by another tool; tool_choice \"required\" \
                             needs one meaning per $defs name",
                        ));
                    }
                    _ => {
                        defs.insert(def_name, def);
                    }
                }
            }
        }
        alternatives.push(json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [name]},
                "parameters": parameters,
            },
            "required": ["name", "parameters"],
        }));
    }
    let mut schema = json!({
        "type": "array",
        "minItems": 1,
        "items": {"anyOf": alternatives},
    });
    if !parallel_tool_calls {
        schema["maxItems"] = Value::from(1);
    }
    if !defs.is_empty() {
        schema["$defs"] = Value::Object(defs);
    }
    Ok(schema)
}

/// Rewrites past calls for the chat template: `function.arguments` arrives
/// as JSON text (OpenAI's shape) but chat templates read it as a mapping
/// (`tool_call.arguments | tojson`, `arguments.items()`), which is what the
/// Python servers hand them; text that is not a JSON object stays text.
pub fn arguments_as_objects(messages: &mut [Value]) {
    let calls = messages
        .iter_mut()
        .filter_map(|message| message.get_mut("tool_calls")?.as_array_mut())
        .flatten();
    for call in calls {
        let Some(arguments) = call
            .get_mut("function")
            .and_then(|function| function.get_mut("arguments"))
        else {
            continue;
        };
        if let Some(Ok(parsed @ Value::Object(_))) =
            arguments.as_str().map(serde_json::from_str::<Value>)
        {
            *arguments = parsed;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!({"type": "function", "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]},
        }})
    }

    fn schema_of(constraint: Option<Constraint>) -> Value {
        match constraint {
            Some(Constraint::JsonSchema(text)) => serde_json::from_str(&text).unwrap(),
            other => panic!("expected a JSON schema, got {other:?}"),
        }
    }

    #[test]
    fn free_choices_send_no_constraint() {
        for choice in [ToolChoice::None, ToolChoice::Auto] {
            assert_eq!(tool_constraint(&choice, &[weather()], true).unwrap(), None);
        }
    }

    #[test]
    fn a_named_function_is_constrained_to_its_arguments() {
        let choice = ToolChoice::Function("get_weather".into());
        let schema = schema_of(tool_constraint(&choice, &[weather()], true).unwrap());
        assert_eq!(schema, weather()["function"]["parameters"]);
        let unknown = ToolChoice::Function("nope".into());
        let err = tool_constraint(&unknown, &[weather()], true).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("tool_choice"));
    }

    #[test]
    fn required_is_an_array_of_named_calls() {
        let bare = json!({"type": "function", "function": {"name": "now"}});
        let schema =
            schema_of(tool_constraint(&ToolChoice::Required, &[weather(), bare], true).unwrap());
        assert_eq!(schema["type"], "array");
        assert_eq!(schema["minItems"], 1);
        assert!(schema.get("maxItems").is_none());
        let alternatives = schema["items"]["anyOf"].as_array().unwrap();
        assert_eq!(
            alternatives[0]["properties"]["name"]["enum"],
            json!(["get_weather"])
        );
        assert_eq!(
            alternatives[0]["properties"]["parameters"],
            weather()["function"]["parameters"]
        );
        assert_eq!(
            alternatives[1]["properties"]["parameters"],
            json!({"type": "object"})
        );
        let single =
            schema_of(tool_constraint(&ToolChoice::Required, &[weather()], false).unwrap());
        assert_eq!(single["maxItems"], 1);
    }

    #[test]
    fn defs_move_to_the_root_and_conflicts_are_refused() {
        let with_defs = |name: &str, unit: &str| {
            json!({"type": "function", "function": {"name": name, "parameters": {
                "type": "object",
                "properties": {"t": {"$ref": "#/$defs/Temp"}},
                "$defs": {"Temp": {"type": "string", "enum": [unit]}},
            }}})
        };
        let tools = [with_defs("a", "C"), with_defs("b", "C")];
        let schema = schema_of(tool_constraint(&ToolChoice::Required, &tools, true).unwrap());
        assert_eq!(schema["$defs"]["Temp"]["enum"], json!(["C"]));
        let first = &schema["items"]["anyOf"][0]["properties"]["parameters"];
        assert!(first.get("$defs").is_none());
        let clash = [with_defs("a", "C"), with_defs("b", "F")];
        let err = tool_constraint(&ToolChoice::Required, &clash, true).unwrap_err();
        assert_eq!(
            err.param.as_deref(),
            Some("tools[1].function.parameters.$defs.Temp")
        );
    }

    #[test]
    fn past_arguments_reach_the_template_as_objects() {
        let mut messages = vec![
            json!({"role": "assistant", "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                {"id": "call_2", "type": "function",
                 "function": {"name": "get_weather", "arguments": "not json"}},
            ]}),
            json!({"role": "tool", "tool_call_id": "call_1", "content": "sunny"}),
        ];
        arguments_as_objects(&mut messages);
        let calls = &messages[0]["tool_calls"];
        assert_eq!(calls[0]["function"]["arguments"], json!({"city": "Paris"}));
        assert_eq!(calls[1]["function"]["arguments"], "not json");
    }
}
