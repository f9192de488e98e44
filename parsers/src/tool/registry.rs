//! Parser names, construction and detection from the model.
//!
//! Why it exists: the gateway knows a parser by the name an operator writes
//! (`--tool-call-parser qwen`) or by the model it serves; this module maps
//! both to a parser, so the names and the detection table live in one place.
//!
//! # Detection
//!
//! [`detect`] first looks in the model id for the patterns below, without
//! regard to case; when several match, the **longest pattern wins** (so
//! `deepseek-v3.1` beats `deepseek-v3`, and `qwen3-coder` beats `qwen`).
//!
//! | pattern in the model id | parser |
//! |---|---|
//! | `qwen` | `qwen` |
//! | `qwen3-coder`, `qwen3_coder`, `qwen3coder`, `qwen3.5`, `qwen3_5`, `qwen3-5` | `qwen_xml` |
//! | `llama-3`, `llama3` | `llama` |
//! | `llama-4`, `llama4` | `pythonic` |
//! | `mistral`, `mixtral`, `ministral`, `magistral`, `devstral` | `mistral` |
//! | `deepseek-v3`, `deepseek-r1`, `deepseek_r1` | `deepseek` |
//! | `deepseek-v3.1`, `deepseek-v3-1`, `deepseek-v3.2-exp` | `deepseek31` |
//! | `kimi-k2`, `kimi_k2` | `kimik2` |
//! | `glm-4.5`, `glm-4.6`, `glm4.5`, `glm4.6`, `glm45`, `glm46` | `glm45_moe` |
//! | `glm-4.7`, `glm4.7`, `glm47`, `glm-5`, `glm5` | `glm47_moe` |
//!
//! When the id matches nothing, the chat template's text is searched for a
//! format's markers, the first row that matches winning:
//!
//! | the template mentions | parser |
//! |---|---|
//! | `<arg_key>` | `glm45_moe` |
//! | `<function=` | `qwen_xml` |
//! | `<tool_call>` | `qwen` |
//! | `<|tool_calls_section_begin|>` | `kimik2` |
//! | `<｜tool▁calls▁begin｜>` and `` ```json `` | `deepseek` |
//! | `<｜tool▁calls▁begin｜>` | `deepseek31` |
//! | `[TOOL_CALLS]` | `mistral` |
//! | `<|python_start|>` | `pythonic` |
//! | `<|python_tag|>` | `llama` |
//!
//! Otherwise [`detect`] returns `None` (the gateway's default is
//! `passthrough`). DeepSeek-V3.2/V4 (DSML) is not supported yet: its ids match
//! `deepseek-v3`, whose markers it does not write, so its output stays
//! content.

use super::engine::Engine;
use super::json_calls::{JsonCalls, Syntax};
use super::passthrough::Passthrough;
use super::pythonic::Pythonic;
use super::xml_calls::{XmlCalls, XmlSyntax};
use super::{ToolParser, Tools};

/// Every name [`create`] accepts (`qwen_coder` is an alias of `qwen_xml`).
pub const PARSER_NAMES: &[&str] = &[
    "passthrough",
    "json",
    "qwen",
    "qwen_xml",
    "qwen_coder",
    "llama",
    "pythonic",
    "mistral",
    "deepseek",
    "deepseek31",
    "kimik2",
    "glm45_moe",
    "glm47_moe",
];

/// [`create`] was given a name it does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown tool-call parser {name:?}; known parsers: {}", PARSER_NAMES.join(", "))]
pub struct UnknownParser {
    pub name: String,
}

/// A fresh parser for one choice of one response.
pub fn create(name: &str, tools: Tools) -> Result<Box<dyn ToolParser>, UnknownParser> {
    let json = |syntax| -> Box<dyn ToolParser> {
        Box::new(Engine::new(tools.clone(), JsonCalls::new(syntax)))
    };
    Ok(match name {
        "passthrough" => Box::new(Passthrough),
        "json" => json(Syntax::Json),
        "qwen" => json(Syntax::Qwen),
        "llama" => json(Syntax::Llama),
        "mistral" => json(Syntax::Mistral),
        "deepseek" => json(Syntax::DeepSeek),
        "deepseek31" => json(Syntax::DeepSeek31),
        "kimik2" => json(Syntax::KimiK2),
        "qwen_xml" | "qwen_coder" => {
            Box::new(Engine::new(tools, XmlCalls::new(XmlSyntax::QwenXml)))
        }
        "glm45_moe" | "glm47_moe" => Box::new(Engine::new(tools, XmlCalls::new(XmlSyntax::Glm))),
        "pythonic" => Box::new(Engine::new(tools, Pythonic::new())),
        _ => {
            return Err(UnknownParser {
                name: name.to_owned(),
            });
        }
    })
}

/// Model-id patterns (lowercase) and the parser each selects.
const ID_PATTERNS: &[(&str, &str)] = &[
    ("qwen", "qwen"),
    ("qwen3-coder", "qwen_xml"),
    ("qwen3_coder", "qwen_xml"),
    ("qwen3coder", "qwen_xml"),
    ("qwen3.5", "qwen_xml"),
    ("qwen3_5", "qwen_xml"),
    ("qwen3-5", "qwen_xml"),
    ("llama-3", "llama"),
    ("llama3", "llama"),
    ("llama-4", "pythonic"),
    ("llama4", "pythonic"),
    ("mistral", "mistral"),
    ("mixtral", "mistral"),
    ("ministral", "mistral"),
    ("magistral", "mistral"),
    ("devstral", "mistral"),
    ("deepseek-v3", "deepseek"),
    ("deepseek-r1", "deepseek"),
    ("deepseek_r1", "deepseek"),
    ("deepseek-v3.1", "deepseek31"),
    ("deepseek-v3-1", "deepseek31"),
    ("deepseek-v3.2-exp", "deepseek31"),
    ("kimi-k2", "kimik2"),
    ("kimi_k2", "kimik2"),
    ("glm-4.5", "glm45_moe"),
    ("glm-4.6", "glm45_moe"),
    ("glm4.5", "glm45_moe"),
    ("glm4.6", "glm45_moe"),
    ("glm45", "glm45_moe"),
    ("glm46", "glm45_moe"),
    ("glm-4.7", "glm47_moe"),
    ("glm4.7", "glm47_moe"),
    ("glm47", "glm47_moe"),
    ("glm-5", "glm47_moe"),
    ("glm5", "glm47_moe"),
];

/// Chat-template markers (all must appear) and the parser each selects; the
/// first row that matches wins.
const TEMPLATE_MARKERS: &[(&[&str], &str)] = &[
    (&["<arg_key>"], "glm45_moe"),
    (&["<function="], "qwen_xml"),
    (&["<tool_call>"], "qwen"),
    (&["<|tool_calls_section_begin|>"], "kimik2"),
    (&["<｜tool▁calls▁begin｜>", "```json"], "deepseek"),
    (&["<｜tool▁calls▁begin｜>"], "deepseek31"),
    (&["[TOOL_CALLS]"], "mistral"),
    (&["<|python_start|>"], "pythonic"),
    (&["<|python_tag|>"], "llama"),
];

/// The parser for a model: by its id (longest matching pattern), else by
/// its chat template's markers, else `None`.
pub fn detect(model_id: &str, chat_template: Option<&str>) -> Option<&'static str> {
    let id = model_id.to_lowercase();
    let by_id = ID_PATTERNS
        .iter()
        .filter(|(pattern, _)| id.contains(pattern))
        .max_by_key(|(pattern, _)| pattern.len())
        .map(|&(_, parser)| parser);
    by_id.or_else(|| {
        let template = chat_template?;
        TEMPLATE_MARKERS
            .iter()
            .find(|(markers, _)| markers.iter().all(|m| template.contains(m)))
            .map(|&(_, parser)| parser)
    })
}
