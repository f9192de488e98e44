//! The reasoning families: each parser name with its markers, whether the
//! model always thinks, and the tool-call markers that may end its reasoning;
//! and which family a model id belongs to.
//!
//! Detection is a case-insensitive substring test where the **longest
//! pattern wins** (so `Kimi-K2-Thinking` is `kimi_thinking`, not `kimi`, and
//! `Qwen3-30B-A3B-Thinking-2507` is `qwen3_thinking`, not `qwen3`), whatever
//! the order of the table. A `*` in a pattern stands for any text, because
//! Qwen puts the size between the family and `Thinking`.

/// One row of the table.
#[derive(Debug)]
pub(crate) struct Family {
    pub(crate) name: &'static str,
    /// `None` for `passthrough`: no markers, everything is content.
    pub(crate) markers: Option<ThinkMarkers>,
    /// The model always thinks and its prompt opens the think block (or the
    /// model may omit `<think>`): the parser starts in reasoning regardless
    /// of [`super::ReasoningOptions::starts_in_reasoning`].
    pub(crate) always_thinks: bool,
    /// Markers of this family's tool-call syntax. One of them inside
    /// reasoning ends it (see [`super::ReasoningOptions`]).
    pub(crate) tool_markers: &'static [&'static str],
    /// Whether the gateway turns that cut on for this family: only where
    /// models are known to open a tool section without closing their think
    /// block. Elsewhere markup inside a think block stays reasoning, so a
    /// call the model only thought about is never made.
    pub(crate) cut_by_default: bool,
}

/// The strings that open and close a think block.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ThinkMarkers {
    pub(crate) start: &'static str,
    pub(crate) end: &'static str,
}

const THINK: ThinkMarkers = ThinkMarkers {
    start: "<think>",
    end: "</think>",
};

/// Kimi-VL and Kimi-K1.5 think between these (U+25C1 and U+25B7).
const KIMI_TRIANGLES: ThinkMarkers = ThinkMarkers {
    start: "\u{25c1}think\u{25b7}",
    end: "\u{25c1}/think\u{25b7}",
};

/// Hermes-style (`<tool_call>{…}`) and Qwen3-Coder XML (`<tool_call><function=…>`)
/// both open with this; so does GLM-4.5 (`<tool_call>NAME<arg_key>…`).
const TOOL_CALL_TAG: &[&str] = &["<tool_call>"];
/// DeepSeek V3, R1-0528 and V3.1 open their calls section with this (full-width
/// bars, U+2581 between words).
const DEEPSEEK_TOOL_CALLS: &[&str] = &["<\u{ff5c}tool\u{2581}calls\u{2581}begin\u{ff5c}>"];
/// Kimi-K2 opens a calls section with this; some checkpoints write the
/// singular spelling.
const KIMI_TOOL_SECTION: &[&str] = &[
    "<|tool_calls_section_begin|>",
    "<|tool_call_section_begin|>",
];

/// The table. The order is the order of [`PARSER_NAMES`].
pub(crate) const FAMILIES: &[Family] = &[
    Family {
        // Qwen3 hybrid models: `<think>` written by the model when thinking is
        // on (`enable_thinking`, on by default); off, the prompt carries an
        // empty think block and the output is all content.
        name: "qwen3",
        markers: Some(THINK),
        always_thinks: false,
        cut_by_default: false,
        tool_markers: TOOL_CALL_TAG,
    },
    Family {
        // Qwen3-*-Thinking-2507: the prompt ends in `<think>`; the output
        // starts in reasoning and only `</think>` appears.
        name: "qwen3_thinking",
        markers: Some(THINK),
        always_thinks: true,
        cut_by_default: false,
        tool_markers: TOOL_CALL_TAG,
    },
    Family {
        // DeepSeek-R1 (and R1-0528): always thinks; the template prefills
        // `<think>\n` (older ones let the model write it).
        name: "deepseek_r1",
        markers: Some(THINK),
        always_thinks: true,
        cut_by_default: false,
        tool_markers: DEEPSEEK_TOOL_CALLS,
    },
    Family {
        // DeepSeek-V3.1 (and V3.2): thinking is the template's `thinking`
        // switch, off by default; on, the prompt ends in `<think>`.
        name: "deepseek_v31",
        markers: Some(THINK),
        always_thinks: false,
        cut_by_default: false,
        tool_markers: DEEPSEEK_TOOL_CALLS,
    },
    Family {
        // GLM-4.5/4.6/4.7/5: the model writes `<think>`; `enable_thinking`
        // off prefills an empty think block.
        name: "glm45",
        markers: Some(THINK),
        always_thinks: false,
        cut_by_default: false,
        tool_markers: TOOL_CALL_TAG,
    },
    Family {
        // Kimi-VL / K1.5 thinking: `◁think▷…◁/think▷`, written by the model.
        name: "kimi",
        markers: Some(KIMI_TRIANGLES),
        always_thinks: false,
        cut_by_default: true,
        tool_markers: KIMI_TOOL_SECTION,
    },
    Family {
        // Kimi-K2-Thinking: always thinks, `<think>` markers; its tool-call
        // section sometimes opens without `</think>` (MoonshotAI/Kimi-K2#89).
        name: "kimi_thinking",
        markers: Some(THINK),
        always_thinks: true,
        cut_by_default: true,
        tool_markers: KIMI_TOOL_SECTION,
    },
    Family {
        // Kimi-K2.5: `<think>` markers behind the template's thinking switch.
        name: "kimi_k25",
        markers: Some(THINK),
        always_thinks: false,
        cut_by_default: true,
        tool_markers: KIMI_TOOL_SECTION,
    },
    Family {
        // No reasoning: everything is content.
        name: "passthrough",
        markers: None,
        always_thinks: false,
        cut_by_default: false,
        tool_markers: &[],
    },
];

/// Every name [`super::create`] accepts.
pub const PARSER_NAMES: &[&str] = &[
    "qwen3",
    "qwen3_thinking",
    "deepseek_r1",
    "deepseek_v31",
    "glm45",
    "kimi",
    "kimi_thinking",
    "kimi_k25",
    "passthrough",
];

/// Model-id patterns (lower case; `*` is any text) and the parser each means.
const MODEL_PATTERNS: &[(&str, &str)] = &[
    ("deepseek-r1", "deepseek_r1"),
    ("deepseek-v3.1", "deepseek_v31"),
    ("deepseek-v3-1", "deepseek_v31"),
    ("deepseek-v3.2", "deepseek_v31"),
    ("qwen3", "qwen3"),
    ("qwen3*-thinking", "qwen3_thinking"),
    ("glm-4.5", "glm45"),
    ("glm-4.6", "glm45"),
    ("glm-4.7", "glm45"),
    ("glm-5", "glm45"),
    ("glm45", "glm45"),
    ("glm47", "glm45"),
    ("kimi", "kimi"),
    ("kimi-k2-thinking", "kimi_thinking"),
    ("kimi-k2.5", "kimi_k25"),
];

pub(crate) fn family(name: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|family| family.name == name)
}

/// Whether a tool-call marker should end reasoning for parser `name` when
/// the caller has no reason to choose ([`super::ReasoningOptions::tool_call_ends_reasoning`]):
/// true for the Kimi families (MoonshotAI/Kimi-K2#89), false elsewhere.
pub fn tool_call_ends_reasoning(name: &str) -> bool {
    family(name).is_some_and(|family| family.cut_by_default)
}

/// The tool-call markers that end reasoning for parser `name` (empty for an
/// unknown name or `passthrough`).
pub fn tool_markers(name: &str) -> &'static [&'static str] {
    family(name).map_or(&[], |family| family.tool_markers)
}

/// The reasoning parser for a model id, if its family is known: the longest
/// matching pattern wins (case-insensitive substring; `*` matches any text).
pub fn detect(model_id: &str) -> Option<&'static str> {
    let id = model_id.to_lowercase();
    MODEL_PATTERNS
        .iter()
        .filter(|(pattern, _)| pattern_matches(pattern, &id))
        .max_by_key(|(pattern, _)| pattern.replace('*', "").len())
        .map(|&(_, parser)| parser)
}

/// Whether each `*`-separated piece of `pattern` occurs in `id`, in order.
fn pattern_matches(pattern: &str, id: &str) -> bool {
    let mut rest = id;
    for piece in pattern.split('*') {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_and_the_table_agree() {
        let table: Vec<&str> = FAMILIES.iter().map(|family| family.name).collect();
        assert_eq!(table, PARSER_NAMES);
        for (_, parser) in MODEL_PATTERNS {
            assert!(PARSER_NAMES.contains(parser), "{parser}");
        }
    }

    #[test]
    fn a_star_matches_any_text_in_between() {
        assert!(pattern_matches(
            "qwen3*-thinking",
            "qwen/qwen3-30b-a3b-thinking-2507"
        ));
        assert!(pattern_matches("qwen3*-thinking", "qwen3-thinking"));
        assert!(!pattern_matches("qwen3*-thinking", "thinking-qwen3"));
    }
}
