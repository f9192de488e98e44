//! Reasoning parsers: split a thinking model's output into reasoning
//! (`<think>…</think>` and its relatives) and the answer.
//!
//! Like the tool parsers, one mechanism serves streaming and whole
//! responses: [`ReasoningParser::push`] per chunk, [`ReasoningParser::finish`]
//! at the end; a whole response is one push and a finish. Reasoning is parsed
//! before tool calls: only [`ReasoningDelta::content`] goes on to the tool
//! parser, so markup inside reasoning is never a call.
//!
//! Module map:
//! - [`markers`]: the one state machine every family shares (a start and an
//!   end marker, partial markers held back, tool markers that end reasoning);
//! - [`families`]: the table of parser names, their markers and defaults, and
//!   model-id detection;
//! - [`toggle`]: reading a chat template's thinking switch and resolving one
//!   request's preference into [`ReasoningOptions::starts_in_reasoning`].
//!
//! Why one state machine and a table rather than a file per model: every
//! family in scope differs only in its marker strings, whether the prompt
//! already opened the think block, and which tool-call marker may cut a think
//! block short. A table states those differences where they can be compared.

use std::fmt;

mod families;
mod markers;
mod toggle;

pub use families::{PARSER_NAMES, detect, tool_call_ends_reasoning, tool_markers};
pub use toggle::{
    ThinkingToggle, ToggleKey, starts_in_reasoning, thinking_preference, thinking_toggle,
};

/// What a parser produced from one chunk (or from the end of the stream).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReasoningDelta {
    /// Text of the reasoning (`reasoning_content`), markers removed.
    pub reasoning: String,
    /// Text of the answer (`content`), markers removed.
    pub content: String,
}

impl ReasoningDelta {
    /// Nothing to send.
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty()
    }

    /// Appends `other` (the next delta of the same stream) to this one.
    pub fn append(&mut self, other: ReasoningDelta) {
        self.reasoning.push_str(&other.reasoning);
        self.content.push_str(&other.content);
    }
}

/// A streaming reasoning parser for one choice of one response.
pub trait ReasoningParser: Send + fmt::Debug {
    /// Feeds the next chunk of generated text; returns what can be sent now.
    fn push(&mut self, chunk: &str) -> ReasoningDelta;
    /// The stream ended: flush anything held back.
    fn finish(&mut self) -> ReasoningDelta;
}

/// How one response's parser starts, decided by the gateway per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningOptions {
    /// The prompt already opened the think block (the template's generation
    /// prompt ends in `<think>`), so the output begins inside reasoning and
    /// its first `</think>` ends it. A `<think>` the model writes anyway
    /// before any reasoning text is dropped. Parsers of models that always
    /// think (`deepseek_r1`, `qwen3_thinking`, `kimi_thinking`) start in
    /// reasoning whatever this says. See [`starts_in_reasoning`] for the
    /// per-request resolution.
    pub starts_in_reasoning: bool,
    /// A tool-call marker of the parser's family ([`tool_markers`]) seen
    /// inside reasoning, before any end marker, ends reasoning: the marker and
    /// everything after it are content, for the tool parser. Models such as
    /// Kimi-K2 sometimes open a tool-call section without closing their think
    /// block; with this off, the call would be read as reasoning and lost.
    /// On by default. Off means markup inside a think block stays reasoning
    /// until the end marker, whatever it looks like.
    pub tool_call_ends_reasoning: bool,
}

impl Default for ReasoningOptions {
    fn default() -> Self {
        Self {
            starts_in_reasoning: false,
            tool_call_ends_reasoning: true,
        }
    }
}

/// A parser name that [`create`] does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown reasoning parser {name:?} (known: {known})", known = PARSER_NAMES.join(", "))]
pub struct UnknownParser {
    /// The name asked for.
    pub name: String,
}

/// A fresh parser for one choice of one response, by name ([`PARSER_NAMES`]).
pub fn create(
    name: &str,
    options: ReasoningOptions,
) -> Result<Box<dyn ReasoningParser>, UnknownParser> {
    match families::family(name) {
        Some(family) => Ok(Box::new(markers::MarkerParser::new(family, options))),
        None => Err(UnknownParser {
            name: name.to_owned(),
        }),
    }
}

/// Parses a whole response: one push, then finish.
pub fn parse_complete(parser: &mut dyn ReasoningParser, text: &str) -> ReasoningDelta {
    let mut whole = parser.push(text);
    whole.append(parser.finish());
    whole
}
