//! Reasoning parsers: split a thinking model's output into reasoning
//! (`<think>…</think>` and its relatives) and the answer.
//!
//! Like the tool parsers, one mechanism serves streaming and whole
//! responses: [`ReasoningParser::push`] per chunk, [`ReasoningParser::finish`]
//! at the end; a whole response is one push and a finish. Reasoning is parsed
//! before tool calls: only [`ReasoningDelta::content`] goes on to the tool
//! parser, so markup inside reasoning is never a call.

use std::fmt;

/// What a parser produced from one chunk (or from the end of the stream).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReasoningDelta {
    /// Text of the reasoning (`reasoning_content`), markers removed.
    pub reasoning: String,
    /// Text of the answer (`content`), markers removed.
    pub content: String,
}

/// A streaming reasoning parser for one choice of one response.
pub trait ReasoningParser: Send + fmt::Debug {
    /// Feeds the next chunk of generated text; returns what can be sent now.
    fn push(&mut self, chunk: &str) -> ReasoningDelta;
    /// The stream ended: flush anything held back.
    fn finish(&mut self) -> ReasoningDelta;
}
