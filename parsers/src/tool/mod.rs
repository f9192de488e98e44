//! Tool-call parsers: find the calls a model wrote in its own markup
//! (`<tool_call>{…}</tool_call>`, `[TOOL_CALLS]…`, `<｜tool▁call▁begin｜>…`) and
//! turn them into OpenAI-shaped calls, streamed as the text arrives.
//!
//! One mechanism serves both streaming and whole responses: a parser is fed
//! chunks with [`ToolParser::push`] and closed with [`ToolParser::finish`];
//! [`parse_complete`] is just one push of the whole text followed by finish.
//! So the split-invariance property (any chunking gives the same content and
//! calls as the whole text) is the only contract a parser has to keep.

use std::fmt;
use std::sync::Arc;

mod call_object;
mod engine;
mod json_calls;
mod json_value;
mod passthrough;
mod pythonic;
mod registry;
mod stream;
mod xml_calls;

pub use registry::{PARSER_NAMES, UnknownParser, create, detect};
pub use stream::MAX_HELD_BYTES;

/// One function the request offered (`tools[i].function`).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// The function name the model must use.
    pub name: String,
    /// The JSON schema of the arguments (`parameters`), when given; XML-style
    /// parsers use it to type values (`"5"` stays a string only if declared
    /// `string`).
    pub parameters: Option<serde_json::Value>,
}

/// What a parser produced from one chunk (or from the end of the stream).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolDelta {
    /// Text outside any call, safe to send to the client as `content`.
    pub content: String,
    /// Call fragments, in order.
    pub calls: Vec<CallDelta>,
}

/// A fragment of one call: the first fragment of a call carries its name;
/// later fragments append to its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct CallDelta {
    /// The call's position in the response: 0, 1, … with no gaps.
    pub index: usize,
    /// Set exactly once per call, on its first fragment.
    pub name: Option<String>,
    /// JSON text to append to the call's `arguments` (may be empty).
    pub arguments: String,
}

/// A whole call, as a non-streaming response carries it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as JSON text (an object).
    pub arguments: String,
}

/// A whole response, parsed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParsedTools {
    pub content: String,
    pub calls: Vec<ToolCall>,
}

/// A streaming tool-call parser for one choice of one response.
pub trait ToolParser: Send + fmt::Debug {
    /// Feeds the next chunk of generated text; returns what can be sent now.
    /// Text that may still turn out to be a marker is held back.
    fn push(&mut self, chunk: &str) -> ToolDelta;
    /// The stream ended: flush held-back text as content, complete the
    /// arguments of a call in progress (or give its text back as content
    /// when it never became a valid call).
    fn finish(&mut self) -> ToolDelta;
}

/// Accumulates [`ToolDelta`]s into a [`ParsedTools`].
#[derive(Debug, Default)]
pub struct Collector {
    parsed: ParsedTools,
}

impl Collector {
    pub fn add(&mut self, delta: ToolDelta) {
        self.parsed.content.push_str(&delta.content);
        for call in delta.calls {
            if let Some(name) = call.name {
                self.parsed.calls.push(ToolCall {
                    name,
                    arguments: String::new(),
                });
            }
            if let Some(last) = self.parsed.calls.get_mut(call.index) {
                last.arguments.push_str(&call.arguments);
            }
        }
    }

    pub fn finish(self) -> ParsedTools {
        self.parsed
    }
}

/// Parses a whole response with a fresh parser: one push, then finish.
pub fn parse_complete(parser: &mut dyn ToolParser, text: &str) -> ParsedTools {
    let mut collector = Collector::default();
    collector.add(parser.push(text));
    collector.add(parser.finish());
    collector.finish()
}

/// The tools a parser may call; shared by every parser of one request.
pub type Tools = Arc<[ToolSpec]>;
