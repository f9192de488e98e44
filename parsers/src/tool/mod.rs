//! Tool-call parsers: find the calls a model wrote in its own markup
//! (`<tool_call>{…}</tool_call>`, `[TOOL_CALLS]…`, `<｜tool▁call▁begin｜>…`) and
//! turn them into OpenAI-shaped calls, streamed as the text arrives.
//!
//! One mechanism serves both streaming and whole responses: a parser is fed
//! chunks with [`ToolParser::push`] and closed with [`ToolParser::finish`];
//! [`parse_complete`] is just one push of the whole text followed by finish.
//! So the split-invariance property (any chunking gives the same content and
//! calls as the whole text) is the only contract a parser has to keep.
//!
//! # Module map
//! - `registry`: [`create`], [`PARSER_NAMES`] and [`detect`] (its doc has the
//!   detection table).
//! - `engine` and `stream`: the driver and the state all formats share
//!   (marker hold-back, call bookkeeping, the policies below).
//! - `json_value`: the incremental JSON re-serializer arguments stream
//!   through; `call_object`: the `{"name", "arguments"}` object.
//! - `json_calls` (json, qwen, llama, mistral, deepseek, deepseek31, kimik2),
//!   `xml_calls` (qwen_xml, glm45_moe, glm47_moe), `pythonic`, `passthrough`.
//!
//! # Streaming rules (every parser)
//! - Arguments stream as they arrive, string values included (XML values
//!   too); only a possible closing marker is held back. A number or literal
//!   is sent once complete.
//! - Arguments are canonical in both modes: compact JSON, keys in the order
//!   written, strings and numbers printed as `serde_json` prints them. The
//!   fragments of a call concatenate to exactly its final arguments; nothing
//!   is sent that a later byte could contradict.
//! - A call's name is sent once, on its first fragment, when it is complete
//!   and accepted.
//! - Text outside calls is content, in order; a chunk-final prefix of a
//!   marker is held back until the next chunk decides it.
//! - At [`ToolParser::finish`], held-back text is content, and a call in
//!   progress is completed by closing its open string and containers (the
//!   same happens in a whole-response parse, so the two agree).
//!
//! # A response cut off by `max_tokens`
//! A model that runs out of tokens stops wherever it is, often inside its
//! markup. Completing a half-written call there would hand the client a
//! call the model never finished (and `{"a": 1` closed as `{"a":1}` is a
//! guess), so [`ToolParser::finish_cut`] is used when the finish reason is
//! `length`:
//! - held-back text that never became a marker (`…<tool_ca`) is content;
//! - a call whose arguments are unfinished is not a call: its text, from its
//!   first marker byte (a calls section's opener included, when it is the
//!   section's first call) to the end, is content, and
//!   [`ToolDelta::cut_call`] tells collectors to drop what they gathered of
//!   it. A stream cannot take back the fragments it already sent;
//! - a call whose arguments are complete but whose closing marker is missing
//!   is a call, as at any end.
//!
//! # Unknown names, malformed calls, the buffer cap
//! - **Unknown name** (tools non-empty and the name is not one of them): no
//!   call is produced; the call's original text, markers included, is
//!   returned as content, in place. With no tools, any name is accepted.
//! - **Malformed before the name is accepted**: the text read since the
//!   call's first byte is returned as content, and parsing resumes at the
//!   character that broke it.
//! - **Malformed after the name was sent**: the call is kept with the
//!   arguments read so far (their open strings and containers closed), and
//!   the text from the offending character on is parsed as free text.
//! - **Cap**: a call is held (not sent) only until its name is accepted; one
//!   whose name is not accepted within [`MAX_HELD_BYTES`] is malformed. XML
//!   values held for typing stream as strings past the same cap. Numbers,
//!   keys and names have their own small bounds, and JSON nesting is limited
//!   to 64 levels, so hostile output cannot grow a parser's memory without
//!   limit.

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
    /// Set only by [`ToolParser::finish_cut`]: the call with this index was
    /// cut off before its arguments were complete. It is not a call: forget
    /// its fragments (its text is in `content`).
    pub cut_call: Option<usize>,
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
    /// How many bytes of the same delta's `content` were written before
    /// this fragment: where the call stands in the text, for a reader that
    /// parses a long text in one push and keeps its order.
    pub content_before: usize,
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
    /// The stream ended because the model ran out of tokens (finish reason
    /// `length`): like [`ToolParser::finish`], except that a call whose
    /// arguments are unfinished is not completed. Its text, from its first
    /// marker byte to the end, is returned as content, and
    /// [`ToolDelta::cut_call`] names it when its name had been sent.
    fn finish_cut(&mut self) -> ToolDelta {
        self.finish()
    }
}

/// Accumulates [`ToolDelta`]s into a [`ParsedTools`].
#[derive(Debug, Default)]
pub struct Collector {
    parsed: ParsedTools,
}

impl Collector {
    pub fn add(&mut self, delta: ToolDelta) {
        if let Some(index) = delta.cut_call
            && index < self.parsed.calls.len()
        {
            self.parsed.calls.truncate(index);
        }
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

/// Parses a whole response the model ended by running out of tokens: one
/// push, then [`ToolParser::finish_cut`].
pub fn parse_cut(parser: &mut dyn ToolParser, text: &str) -> ParsedTools {
    let mut collector = Collector::default();
    collector.add(parser.push(text));
    collector.add(parser.finish_cut());
    collector.finish()
}

/// The tools a parser may call; shared by every parser of one request.
pub type Tools = Arc<[ToolSpec]>;
