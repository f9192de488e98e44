//! A request's tools, held once for everything that reads them.
//!
//! Why it exists: the tool schemas of a request are read three ways — the
//! chat template lists them (as Jinja values, most often through `tojson`),
//! the tool-call parsers check names and type arguments against them, and
//! a forced `tool_choice` becomes a constraint built from them — and an
//! agent sends the same tools again on every turn. Copying and converting
//! the schemas for each reader was most of what tools cost the gateway. A
//! [`ToolSet`] holds the OpenAI-shaped definitions once, behind an `Arc`,
//! and builds each reader's view the first time it is asked for; the
//! dialects keep sets by the exact text of a request's `tools`
//! (`api::types::tools::memoized`), so a repeated array costs one lookup
//! and every view is built once per distinct array, not once per request.

use std::fmt;
use std::sync::{Arc, OnceLock};

use serde_json::Value;
use smg_parsers::tool::{ToolSpec, Tools};

use serde_json::json;

use super::spec::{ToolChoice, named_tool, tool_name, tool_parameters};
use crate::engine::Constraint;
use crate::error::{Error, Result};
use crate::tokenizer::{TemplateTools, json_text_bytes};

/// OpenAI-shaped tool definitions
/// (`{"type": "function", "function": {"name", "description", "parameters"}}`)
/// and the views built from them. Cloning shares them.
#[derive(Clone, Default)]
pub struct ToolSet(Arc<Views>);

#[derive(Default)]
struct Views {
    definitions: Vec<Value>,
    /// The bytes of text in the definitions (see [`json_text_bytes`]).
    text_bytes: usize,
    /// Names and argument schemas, as the tool-call parsers take them.
    specs: OnceLock<Tools>,
    /// The list a chat template iterates, with each tool's JSON text.
    template: OnceLock<TemplateTools>,
}

impl ToolSet {
    pub fn new(definitions: Vec<Value>) -> Self {
        Self(Arc::new(Views {
            text_bytes: definitions.iter().map(json_text_bytes).sum(),
            definitions,
            ..Views::default()
        }))
    }

    /// The definitions, in request order.
    pub fn definitions(&self) -> &[Value] {
        &self.0.definitions
    }

    pub fn is_empty(&self) -> bool {
        self.0.definitions.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.definitions.len()
    }

    /// The bytes of text in the definitions: what building a view costs is
    /// proportional to it, so it decides whether that happens on a request
    /// thread (see `crate::offload`).
    pub fn text_bytes(&self) -> usize {
        self.0.text_bytes
    }

    /// The tools as the tool-call parsers know them: every named tool with
    /// its `parameters` schema.
    pub fn specs(&self) -> Tools {
        let specs = self.0.specs.get_or_init(|| {
            self.0
                .definitions
                .iter()
                .filter_map(|tool| {
                    Some(ToolSpec {
                        name: tool_name(tool)?.to_owned(),
                        parameters: tool
                            .get("function")
                            .and_then(|function| function.get("parameters"))
                            .cloned(),
                    })
                })
                .collect()
        });
        Arc::clone(specs)
    }

    /// Whether `other` is this very set (one memo entry), not just equal.
    pub fn shares_views_with(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The tools as a chat template reads them.
    pub fn template(&self) -> TemplateTools {
        self.0
            .template
            .get_or_init(|| TemplateTools::new(&self.0.definitions))
            .clone()
    }
}

impl PartialEq for ToolSet {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.definitions == other.0.definitions
    }
}

impl fmt::Debug for ToolSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.0.definitions).finish()
    }
}

impl From<Vec<Value>> for ToolSet {
    fn from(definitions: Vec<Value>) -> Self {
        Self::new(definitions)
    }
}

/// Where a gpt-oss (Harmony) answer turns into a call: a `commentary`
/// message opened mid-answer (after reasoning) or as the answer's first
/// message.
const HARMONY_TRIGGERS: [&str; 2] = [
    "<|start|>assistant<|channel|>commentary",
    "<|channel|>commentary",
];

/// The engine constraint that enforces a forced `choice` on a Harmony
/// (gpt-oss) model, or `None` when the model is free (`none`, `auto`).
///
/// A JSON schema over the whole output would take the model's channels
/// away (no reasoning, no headers, only JSON). Instead the engine gets an
/// xgrammar structural tag that leaves the output free until a
/// `commentary` message starts, then holds the header to one of the
/// allowed functions (`to=functions.NAME <|constrain|>json<|message|>`)
/// and the body to that function's parameters schema; `at_least_one`
/// makes a call mandatory, and a named function (or `parallel_tool_calls:
/// false`) stops after the first. Each tool gets a tag per trigger, so
/// the call may follow reasoning or open the answer.
pub(crate) fn harmony_tool_constraint(
    choice: &ToolChoice,
    tools: &[Value],
    parallel_tool_calls: bool,
) -> Result<Option<Constraint>> {
    let allowed: Vec<&Value> = match choice {
        ToolChoice::None | ToolChoice::Auto => return Ok(None),
        ToolChoice::Function(name) => {
            let tool = named_tool(tools, name)?;
            vec![tool]
        }
        ToolChoice::Required => tools.iter().collect(),
    };
    let mut tags = Vec::with_capacity(allowed.len() * HARMONY_TRIGGERS.len());
    for tool in allowed {
        let name = tool_name(tool)
            .ok_or_else(|| Error::invalid_parameter("tools", "a tool has no function name"))?;
        for trigger in HARMONY_TRIGGERS {
            tags.push(json!({
                "type": "tag",
                "begin": format!("{trigger} to=functions.{name} <|constrain|>json<|message|>"),
                "content": {"type": "json_schema", "json_schema": tool_parameters(tool)},
                "end": "",
            }));
        }
    }
    let one_call = matches!(choice, ToolChoice::Function(_)) || !parallel_tool_calls;
    let tag = json!({
        "type": "structural_tag",
        "format": {
            "type": "triggered_tags",
            "triggers": HARMONY_TRIGGERS,
            "tags": tags,
            "at_least_one": true,
            "stop_after_first": one_call,
        },
    });
    Ok(Some(Constraint::StructuralTag(tag.to_string())))
}

/// Where a gpt-oss answer's final message starts: after reasoning, or as
/// the answer's first message.
const HARMONY_FINAL_TRIGGERS: [&str; 2] =
    ["<|start|>assistant<|channel|>final", "<|channel|>final"];

/// The engine constraint for `response_format` (or the Responses API's
/// `text.format`) on a Harmony model, given the JSON schema other models
/// get over their whole output: the same schema over the body of the
/// `final` message only (header `final<|constrain|>json`), so reasoning
/// keeps its `analysis` channel. Exactly one final message is required.
pub(crate) fn harmony_format_constraint(schema: &str) -> Result<Constraint> {
    let schema: Value = serde_json::from_str(schema)
        .map_err(|err| Error::invalid_parameter("response_format", err.to_string()))?;
    let tags: Vec<Value> = HARMONY_FINAL_TRIGGERS
        .iter()
        .map(|trigger| {
            json!({
                "type": "tag",
                "begin": format!("{trigger}<|constrain|>json<|message|>"),
                "content": {"type": "json_schema", "json_schema": schema},
                "end": "",
            })
        })
        .collect();
    let tag = json!({
        "type": "structural_tag",
        "format": {
            "type": "triggered_tags",
            "triggers": HARMONY_FINAL_TRIGGERS,
            "tags": tags,
            "at_least_one": true,
            "stop_after_first": true,
        },
    });
    Ok(Constraint::StructuralTag(tag.to_string()))
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

    /// The `begin` of each tag of a `triggered_tags` format.
    fn begins_of(format: &Value) -> Vec<&str> {
        format["tags"]
            .as_array()
            .unwrap()
            .iter()
            .map(|tag| tag["begin"].as_str().unwrap())
            .collect()
    }

    fn tag_of(constraint: Option<Constraint>) -> Value {
        match constraint {
            Some(Constraint::StructuralTag(text)) => serde_json::from_str(&text).unwrap(),
            other => panic!("expected a structural tag, got {other:?}"),
        }
    }

    #[test]
    fn a_harmony_response_format_holds_only_the_final_message_body() {
        let schema =
            r#"{"type":"object","properties":{"answer":{"type":"string"}},"required":["answer"]}"#;
        let tag = tag_of(Some(harmony_format_constraint(schema).unwrap()));
        assert_eq!(tag["type"], "structural_tag");
        let format = &tag["format"];
        assert_eq!(format["type"], "triggered_tags");
        assert_eq!(
            format["triggers"],
            json!(["<|start|>assistant<|channel|>final", "<|channel|>final"])
        );
        let begins = begins_of(format);
        assert_eq!(
            begins,
            [
                "<|start|>assistant<|channel|>final<|constrain|>json<|message|>",
                "<|channel|>final<|constrain|>json<|message|>",
            ]
        );
        for tag in format["tags"].as_array().unwrap() {
            assert_eq!(tag["content"]["type"], "json_schema");
            assert_eq!(tag["content"]["json_schema"]["required"], json!(["answer"]));
            assert_eq!(tag["end"], "");
        }
        assert_eq!(format["at_least_one"], true);
        assert_eq!(format["stop_after_first"], true);
        let err = harmony_format_constraint("{not json").unwrap_err();
        assert_eq!(err.param.as_deref(), Some("response_format"));
    }

    #[test]
    fn a_forced_harmony_call_is_a_structural_tag_over_commentary_messages() {
        let bare = json!({"type": "function", "function": {"name": "get_time"}});
        let tools = [weather(), bare];
        for choice in [ToolChoice::None, ToolChoice::Auto] {
            assert_eq!(
                harmony_tool_constraint(&choice, &tools, true).unwrap(),
                None
            );
        }
        let required =
            tag_of(harmony_tool_constraint(&ToolChoice::Required, &tools, true).unwrap());
        assert_eq!(required["type"], "structural_tag");
        let format = &required["format"];
        assert_eq!(format["type"], "triggered_tags");
        assert_eq!(
            format["triggers"],
            json!([
                "<|start|>assistant<|channel|>commentary",
                "<|channel|>commentary"
            ])
        );
        assert_eq!(format["at_least_one"], true);
        assert_eq!(format["stop_after_first"], false);
        let begins = begins_of(format);
        assert_eq!(
            begins,
            [
                "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
                "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
                "<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>",
                "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>",
            ]
        );
        // Each tag's body is its function's schema (any object without one),
        // and every begin starts with one of the triggers.
        let tags = format["tags"].as_array().unwrap();
        assert_eq!(
            tags[0]["content"]["json_schema"],
            weather()["function"]["parameters"]
        );
        assert_eq!(tags[0]["content"]["type"], "json_schema");
        assert_eq!(tags[0]["end"], "");
        assert_eq!(tags[2]["content"]["json_schema"], json!({"type": "object"}));
        // One call: a named function, or parallel calls off.
        let named = ToolChoice::Function("get_time".to_owned());
        let named = tag_of(harmony_tool_constraint(&named, &tools, true).unwrap());
        assert_eq!(named["format"]["stop_after_first"], true);
        assert_eq!(named["format"]["tags"].as_array().unwrap().len(), 2);
        let single = tag_of(harmony_tool_constraint(&ToolChoice::Required, &tools, false).unwrap());
        assert_eq!(single["format"]["stop_after_first"], true);
        let unknown = ToolChoice::Function("nope".to_owned());
        let err = harmony_tool_constraint(&unknown, &tools, true).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("tool_choice"));
    }

    #[test]
    fn views_are_built_once_and_shared_by_clones() {
        let tools = ToolSet::new(vec![
            json!({"type": "function", "function": {"name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}),
            json!({"type": "function", "function": {}}),
        ]);
        let copy = tools.clone();
        let specs = tools.specs();
        // The unnamed tool has no spec; the named one keeps its schema.
        assert_eq!(specs.len(), 1);
        assert_eq!(specs[0].name, "get_weather");
        assert_eq!(
            specs[0].parameters.as_ref().unwrap()["properties"]["city"]["type"],
            "string"
        );
        assert!(Arc::ptr_eq(&specs, &copy.specs()));
        assert_eq!(copy, tools);
        assert_eq!(tools.len(), 2);
        assert!(ToolSet::default().is_empty());
    }
}
