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

use super::spec::tool_name;
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

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
