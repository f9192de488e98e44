//! The thinking switch of a chat template, and one request's preference.
//!
//! Hybrid models (Qwen3, GLM-4.5+, DeepSeek-V3.1, Kimi-K2.5) think or not
//! depending on a template variable the request sets through
//! `chat_template_kwargs`. When thinking is on, some templates end the
//! generation prompt with `<think>` (DeepSeek, Qwen3-Thinking): then the
//! output starts inside reasoning and never shows the start marker, and the
//! parser must be told. Others let the model write `<think>` itself (Qwen3,
//! GLM), which the parser sees. Reading that from the template text, rather
//! than from a per-model table, keeps a new checkpoint with the same
//! template working without a release.
//!
//! The template is read as text with a few patterns, not parsed: the
//! patterns are those the known families use (see [`thinking_toggle`]).

use serde_json::{Map, Value};

use super::families::family;

/// The template variable that switches thinking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToggleKey {
    /// `enable_thinking` (Qwen3, GLM, Nemotron).
    EnableThinking,
    /// `thinking` (DeepSeek-V3.1, Kimi-K2.5).
    Thinking,
}

impl ToggleKey {
    /// The variable's name, as the template and `chat_template_kwargs` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            ToggleKey::EnableThinking => "enable_thinking",
            ToggleKey::Thinking => "thinking",
        }
    }
}

/// What a chat template says about thinking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThinkingToggle {
    /// The variable that switches thinking; `None` when the template has none
    /// (the model always thinks, or never).
    pub key: Option<ToggleKey>,
    /// Thinking is on when the request does not set the variable. Meaningless
    /// without a key.
    pub default_on: bool,
    /// The generation prompt itself opens the think block (ends in an
    /// unclosed `<think>`) when thinking is on.
    pub prefills_think: bool,
}

/// Reads a chat template's thinking switch:
/// - the key is `enable_thinking` if the template names it, else `thinking`
///   if it tests or sets a variable of that name (`if thinking`,
///   `thinking is`, `thinking ==`, `set thinking`, `not thinking`);
/// - thinking is off by default when the template sets the variable to false
///   when undefined (`set thinking = false`, `thinking | default(false)`),
///   on otherwise;
/// - the generation prompt prefills `<think>` when an
///   `{% if add_generation_prompt %}` block writes a `<think>` not closed by a
///   `</think>` in the same string (Qwen3's thinking-off branch writes
///   `'<think>\n\n</think>\n\n'`, which is not a prefill).
pub fn thinking_toggle(chat_template: &str) -> ThinkingToggle {
    let key = if chat_template.contains("enable_thinking") {
        Some(ToggleKey::EnableThinking)
    } else if [
        "if thinking",
        "thinking is ",
        "thinking ==",
        "set thinking ",
        "not thinking",
    ]
    .iter()
    .any(|pattern| chat_template.contains(pattern))
    {
        Some(ToggleKey::Thinking)
    } else {
        None
    };
    let compact: String = chat_template
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let default_on = match key {
        Some(key) => {
            let name = key.as_str();
            !(compact.contains(&format!("set{name}=false"))
                || compact.contains(&format!("{name}|default(false)")))
        }
        None => false,
    };
    ThinkingToggle {
        key,
        default_on,
        prefills_think: generation_prompt_blocks(chat_template)
            .iter()
            .any(|block| opens_think(block)),
    }
}

/// One request's thinking preference, if it states one: the template's own
/// variable in `chat_template_kwargs` (a bool; another key, or a non-bool, is
/// ignored), else `reasoning_effort` `none` or `minimal` meaning off. `None`
/// when the template has no switch. The gateway passes the same value to the
/// template when rendering.
pub fn thinking_preference(
    toggle: &ThinkingToggle,
    chat_template_kwargs: Option<&Map<String, Value>>,
    reasoning_effort: Option<&str>,
) -> Option<bool> {
    let key = toggle.key?;
    chat_template_kwargs
        .and_then(|kwargs| kwargs.get(key.as_str()))
        .and_then(Value::as_bool)
        .or(match reasoning_effort {
            Some("none" | "minimal") => Some(false),
            _ => None,
        })
}

/// Whether parser `parser`'s output starts inside reasoning for this request
/// ([`super::ReasoningOptions::starts_in_reasoning`]): always for a model
/// that always thinks; otherwise when thinking is on (the preference, else
/// the template's default; a template without a switch counts as on) and the
/// generation prompt opens the think block. When the model writes `<think>`
/// itself the parser sees it, so this is false. An unknown parser or
/// `passthrough` gives false.
pub fn starts_in_reasoning(
    parser: &str,
    toggle: &ThinkingToggle,
    chat_template_kwargs: Option<&Map<String, Value>>,
    reasoning_effort: Option<&str>,
) -> bool {
    let Some(family) = family(parser) else {
        return false;
    };
    if family.markers.is_none() {
        return false;
    }
    if family.always_thinks {
        return true;
    }
    let thinking_on = match toggle.key {
        Some(_) => thinking_preference(toggle, chat_template_kwargs, reasoning_effort)
            .unwrap_or(toggle.default_on),
        None => true,
    };
    thinking_on && toggle.prefills_think
}

/// The text of each `{% if … add_generation_prompt … %}` branch (up to its
/// `else`, `elif` or `endif`, nested `if`s skipped).
fn generation_prompt_blocks(template: &str) -> Vec<&str> {
    let mut blocks = Vec::new();
    // (depth of nested ifs inside the block, where its text starts)
    let mut open: Option<(usize, usize)> = None;
    let mut at = 0;
    while let Some(tag_start) = template[at..].find("{%").map(|offset| at + offset) {
        let Some(tag_end) = template[tag_start..]
            .find("%}")
            .map(|offset| tag_start + offset + 2)
        else {
            break;
        };
        let statement = template[tag_start + 2..tag_end - 2]
            .trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        let word = statement.split_whitespace().next().unwrap_or("");
        match (&mut open, word) {
            (None, "if")
                if statement.contains("add_generation_prompt")
                    && !statement.contains("not add_generation_prompt") =>
            {
                open = Some((0, tag_end));
            }
            (Some((depth, _)), "if") => *depth += 1,
            (Some((0, text_start)), "endif" | "else" | "elif") => {
                blocks.push(&template[*text_start..tag_start]);
                open = None;
            }
            (Some((depth, _)), "endif") => *depth -= 1,
            _ => {}
        }
        at = tag_end;
    }
    blocks
}

/// Whether `block` writes a `<think>` that the same string does not close.
fn opens_think(block: &str) -> bool {
    block.match_indices("<think>").any(|(at, marker)| {
        let after = &block[at + marker.len()..];
        let string_end = ["'", "\"", "}}", "%}"]
            .iter()
            .filter_map(|end| after.find(end))
            .min()
            .unwrap_or(after.len());
        !after[..string_end].contains("</think>")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generation_prompt_branch_is_cut_at_its_else() {
        let template = "{% if x %}a{% endif %}{%- if add_generation_prompt -%}\
            {% if y %}b{% endif %}c{% else %}d{% endif %}";
        assert_eq!(
            generation_prompt_blocks(template),
            vec!["{% if y %}b{% endif %}c"]
        );
    }

    #[test]
    fn a_think_closed_in_the_same_string_is_not_a_prefill() {
        assert!(!opens_think("{{- '<think>\\n\\n</think>\\n\\n' }}"));
        assert!(opens_think("{{- '<|im_start|>assistant\\n<think>\\n' }}"));
        assert!(opens_think("{{ \"<think>\" }}"));
    }
}
