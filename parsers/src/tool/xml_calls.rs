//! The XML-parameter family: formats that write each argument as a tagged
//! value instead of JSON.
//!
//! | syntax | a call looks like |
//! |---|---|
//! | `qwen_xml` | `<tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n</function>\n</tool_call>` (the wrapper is optional) |
//! | `glm45_moe`, `glm47_moe` | `<tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n</tool_call>`; 4.7 and 5 drop the newlines, and `<tool_call>NAME</tool_call>` is a call with no arguments |
//!
//! Why it exists: a value here is raw text, so its JSON type comes from the
//! tool's schema. A parameter declared `string` streams as it arrives, as
//! JSON-escaped fragments, holding back only a possible closing tag (and, for
//! qwen_xml, the one newline before it). A parameter of another declared type
//! is held until its closing tag and parsed as JSON, falling back to a string
//! when it does not parse. An undeclared parameter is inferred: it is held
//! only while it could still be a JSON number, `true`/`false`/`null`, object
//! or array, and streams as a string from the first character that rules
//! that out. A held value is bounded by [`MAX_HELD_BYTES`]; past it, it
//! streams as a string.

use serde_json::Value;

use super::engine::Grammar;
use super::json_value::push_escaped_str;
use super::stream::peek;
use super::stream::{Eat, MAX_HELD_BYTES, MAX_NAME_BYTES, Scan, Stream, valid_name};
use crate::scan::{self, Found};

/// Which tags the grammar reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum XmlSyntax {
    QwenXml,
    Glm,
}

const CALL_BEGIN: &str = "<tool_call>";
const CALL_END: &str = "</tool_call>";
const FUNCTION_BEGIN: &str = "<function=";
const FUNCTION_END: &str = "</function>";
const PARAMETER_BEGIN: &str = "<parameter=";
const PARAMETER_END: &str = "</parameter>";
const ARG_KEY_BEGIN: &str = "<arg_key>";
const ARG_KEY_END: &str = "</arg_key>";
const ARG_VALUE_BEGIN: &str = "<arg_value>";
const ARG_VALUE_END: &str = "</arg_value>";

/// How a parameter's value is typed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Typing {
    /// Declared `string`: streamed.
    String,
    /// Declared another type: held, parsed as JSON.
    Declared,
    /// Not declared: held while it could be a non-string JSON value.
    Infer,
}

#[derive(Debug)]
enum HeldValue {
    /// Writing a JSON string; the opening quote is written.
    Streaming,
    /// Held text (the key prefix is not written yet).
    Held { text: String, typing: Typing },
}

#[derive(Debug)]
enum State {
    Text,
    /// After `<tool_call>` (qwen_xml): `<function=`.
    FunctionOpen,
    Name,
    /// Between parameters.
    Params,
    Key,
    /// glm: after `</arg_key>`, the `<arg_value>` tag.
    ValueOpen {
        key: String,
    },
    /// qwen_xml: the newline right after `<parameter=K>`.
    ValueLead {
        key: String,
    },
    Value {
        prefix: String,
        value: HeldValue,
    },
    /// qwen_xml: after `</function>`, the wrapper's `</tool_call>`.
    FunctionClosed,
}

#[derive(Debug)]
pub(crate) struct XmlCalls {
    syntax: XmlSyntax,
    state: State,
    /// The call started with `<tool_call>`.
    wrapped: bool,
    /// The call's tool (an index into the stream's tools), for typing.
    tool: Option<usize>,
    params_written: usize,
}

impl XmlCalls {
    pub(crate) fn new(syntax: XmlSyntax) -> Self {
        Self {
            syntax,
            state: State::Text,
            wrapped: false,
            tool: None,
            params_written: 0,
        }
    }

    fn value_terminators(&self) -> &'static [&'static str] {
        match self.syntax {
            XmlSyntax::QwenXml => &[PARAMETER_END, FUNCTION_END, CALL_END],
            XmlSyntax::Glm => &[ARG_VALUE_END],
        }
    }

    fn typing(&self, stream: &Stream, key: &str) -> Typing {
        let declared = self
            .tool
            .and_then(|i| stream.tools().get(i))
            .and_then(|tool| tool.parameters.as_ref())
            .and_then(|schema| schema.get("properties"))
            .and_then(|properties| properties.get(key))
            .and_then(|property| property.get("type"));
        let kind = match declared {
            Some(Value::String(kind)) => Some(kind.as_str()),
            Some(Value::Array(kinds)) => kinds
                .iter()
                .filter_map(Value::as_str)
                .find(|k| *k != "null"),
            _ => None,
        };
        match kind {
            Some("string") => Typing::String,
            Some(_) => Typing::Declared,
            None => Typing::Infer,
        }
    }

    fn key_prefix(&mut self, key: &str) -> String {
        let mut prefix = String::new();
        if self.params_written > 0 {
            prefix.push(',');
        }
        self.params_written += 1;
        prefix.push('"');
        push_escaped_str(&mut prefix, key);
        prefix.push_str("\":");
        prefix
    }

    fn start_value(&mut self, stream: &mut Stream, key: String) {
        let typing = self.typing(stream, &key);
        let prefix = self.key_prefix(&key);
        let value = if typing == Typing::String {
            stream.args.push_str(&prefix);
            stream.args.push('"');
            HeldValue::Streaming
        } else {
            HeldValue::Held {
                text: String::new(),
                typing,
            }
        };
        self.state = State::Value { prefix, value };
    }

    /// Appends value text: escaped when streaming; held otherwise, switching
    /// to streaming once it can only be a string (or outgrows the cap).
    fn feed_value(&mut self, args: &mut String, part: &str) {
        let State::Value { prefix, value } = &mut self.state else {
            return;
        };
        match value {
            HeldValue::Streaming => push_escaped_str(args, part),
            HeldValue::Held { text, typing } => {
                text.push_str(part);
                let stream_now = text.len() > MAX_HELD_BYTES
                    || (*typing == Typing::Infer && !could_be_non_string(text));
                if stream_now {
                    args.push_str(prefix);
                    args.push('"');
                    push_escaped_str(args, text);
                    *value = HeldValue::Streaming;
                }
            }
        }
    }

    /// The value's text is complete: write what is still owed.
    fn complete_value(&mut self, stream: &mut Stream) {
        let State::Value { prefix, value } = &mut self.state else {
            return;
        };
        match value {
            HeldValue::Streaming => stream.args.push('"'),
            HeldValue::Held { text, typing } => {
                stream.args.push_str(prefix);
                let parsed = serde_json::from_str::<Value>(text)
                    .ok()
                    .filter(|v| !v.is_string())
                    .filter(|_| *typing == Typing::Declared || could_be_non_string(text));
                match parsed.and_then(|v| serde_json::to_string(&v).ok()) {
                    Some(json) => stream.args.push_str(&json),
                    None => {
                        stream.args.push('"');
                        push_escaped_str(&mut stream.args, text);
                        stream.args.push('"');
                    }
                }
            }
        }
        self.state = State::Params;
    }

    /// Closes the arguments object and the call.
    fn close_call(&mut self, stream: &mut Stream) {
        stream.args.push('}');
        stream.end_call();
    }

    /// The call cannot continue here: complete a committed call's arguments,
    /// give a pending call back as content, resume free text.
    fn fail(&mut self, stream: &mut Stream) {
        if stream.call_committed() {
            match self.state {
                State::Value { .. } => {
                    self.complete_value(stream);
                    stream.args.push('}');
                }
                State::FunctionClosed => {}
                _ => stream.args.push('}'),
            }
        }
        stream.fail_call();
        self.state = State::Text;
    }

    fn step_text(&mut self, stream: &mut Stream, at_end: bool) -> bool {
        let markers: &[&str] = match self.syntax {
            XmlSyntax::QwenXml => &[CALL_BEGIN, FUNCTION_BEGIN],
            XmlSyntax::Glm => &[CALL_BEGIN],
        };
        let Scan::Marker(n) = stream.scan_text(markers, at_end) else {
            return false;
        };
        stream.begin_call();
        stream.consume(markers[n].len());
        self.wrapped = markers[n] == CALL_BEGIN;
        self.params_written = 0;
        self.tool = None;
        self.state = match self.syntax {
            XmlSyntax::QwenXml if self.wrapped => State::FunctionOpen,
            _ => State::Name,
        };
        true
    }

    fn step_name(&mut self, stream: &mut Stream) -> bool {
        let terminators: &[&str] = match self.syntax {
            XmlSyntax::QwenXml => &[">"],
            XmlSyntax::Glm => &["\n", ARG_KEY_BEGIN, CALL_END],
        };
        let (len, n) = match stream.find_within(terminators, MAX_NAME_BYTES) {
            Ok(Some(found)) => found,
            Ok(None) => return false,
            Err(()) => {
                self.fail(stream);
                return true;
            }
        };
        let name = stream.rest()[..len].trim().to_owned();
        if !valid_name(&name) {
            self.fail(stream);
            return true;
        }
        // qwen_xml's `>` belongs to the name; glm's terminators are read next.
        let used = if self.syntax == XmlSyntax::QwenXml {
            len + terminators[n].len()
        } else {
            len
        };
        stream.consume(used);
        if stream.commit_name(&name) {
            self.tool = stream.tools().iter().position(|t| t.name == name);
        }
        stream.args.push('{');
        self.state = State::Params;
        true
    }

    fn step_params(&mut self, stream: &mut Stream) -> bool {
        stream.skip_whitespace();
        let candidates: &[&str] = match self.syntax {
            XmlSyntax::QwenXml => &[PARAMETER_BEGIN, FUNCTION_END, CALL_END],
            XmlSyntax::Glm => &[ARG_KEY_BEGIN, CALL_END],
        };
        let rest = stream.rest();
        let eats: Vec<Eat> = candidates.iter().map(|c| peek(rest, c)).collect();
        if eats.contains(&Eat::Partial) {
            return false;
        }
        let Some(n) = eats.iter().position(|e| *e == Eat::Yes) else {
            self.fail(stream);
            return true;
        };
        stream.consume(candidates[n].len());
        match candidates[n] {
            PARAMETER_BEGIN | ARG_KEY_BEGIN => self.state = State::Key,
            FUNCTION_END => {
                stream.args.push('}');
                self.state = State::FunctionClosed;
            }
            _ => {
                self.close_call(stream);
                self.state = State::Text;
            }
        }
        true
    }

    fn step_key(&mut self, stream: &mut Stream) -> bool {
        let terminator = match self.syntax {
            XmlSyntax::QwenXml => ">",
            XmlSyntax::Glm => ARG_KEY_END,
        };
        let len = match stream.find_within(&[terminator], MAX_NAME_BYTES) {
            Ok(Some((len, _))) => len,
            Ok(None) => return false,
            Err(()) => {
                self.fail(stream);
                return true;
            }
        };
        let key = stream.rest()[..len].trim().to_owned();
        if key.is_empty() {
            self.fail(stream);
            return true;
        }
        stream.consume(len + terminator.len());
        self.state = match self.syntax {
            XmlSyntax::QwenXml => State::ValueLead { key },
            XmlSyntax::Glm => State::ValueOpen { key },
        };
        true
    }

    fn step_value(&mut self, stream: &mut Stream, at_end: bool) -> bool {
        let terminators = self.value_terminators();
        let strip_newline = self.syntax == XmlSyntax::QwenXml;
        let (rest, args) = stream.rest_and_args();
        let found = scan::find(rest, terminators);
        if let Found::Marker { at, index: n } = found {
            let mut part = &rest[..at];
            if strip_newline {
                part = part.strip_suffix('\n').unwrap_or(part);
            }
            self.feed_value(args, part);
            self.complete_value(stream);
            // A missing `</parameter>` (the value ran into `</function>`) is
            // tolerated: the closing tag is read as the next element.
            let used = if terminators[n] == PARAMETER_END || terminators[n] == ARG_VALUE_END {
                at + terminators[n].len()
            } else {
                at
            };
            stream.consume(used);
            return true;
        }
        if at_end {
            return false;
        }
        let mut safe = match found {
            Found::Prefix { at } => at,
            _ => rest.len(),
        };
        if strip_newline && rest[..safe].ends_with('\n') {
            safe -= 1;
        }
        if safe == 0 {
            return false;
        }
        self.feed_value(args, &rest[..safe]);
        stream.consume(safe);
        true
    }
}

/// Whether `text` could still become (or is) a JSON number, `true`, `false`,
/// `null`, object or array. True for every prefix of such a text, so the
/// answer never depends on how the text was chunked.
fn could_be_non_string(text: &str) -> bool {
    if text.starts_with('{') || text.starts_with('[') {
        return true;
    }
    ["true", "false", "null"]
        .iter()
        .any(|literal| literal.starts_with(text))
        || text
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '-' | '+' | '.' | 'e' | 'E'))
}

impl Grammar for XmlCalls {
    fn step(&mut self, stream: &mut Stream, at_end: bool) -> bool {
        match &mut self.state {
            State::Text => self.step_text(stream, at_end),
            State::FunctionOpen => {
                stream.skip_whitespace();
                match peek(stream.rest(), FUNCTION_BEGIN) {
                    Eat::Yes => {
                        stream.consume(FUNCTION_BEGIN.len());
                        self.state = State::Name;
                    }
                    Eat::Partial => return false,
                    Eat::No => self.fail(stream),
                }
                true
            }
            State::Name => self.step_name(stream),
            State::Params => self.step_params(stream),
            State::Key => self.step_key(stream),
            State::ValueOpen { key } => {
                let key = std::mem::take(key);
                stream.skip_whitespace();
                match peek(stream.rest(), ARG_VALUE_BEGIN) {
                    Eat::Yes => {
                        stream.consume(ARG_VALUE_BEGIN.len());
                        self.start_value(stream, key);
                    }
                    Eat::Partial => {
                        self.state = State::ValueOpen { key };
                        return false;
                    }
                    Eat::No => self.fail(stream),
                }
                true
            }
            State::ValueLead { key } => {
                let key = std::mem::take(key);
                match stream.rest().chars().next() {
                    None => {
                        self.state = State::ValueLead { key };
                        return false;
                    }
                    Some('\n') => stream.consume(1),
                    Some(_) => {}
                }
                self.start_value(stream, key);
                true
            }
            State::Value { .. } => self.step_value(stream, at_end),
            State::FunctionClosed => {
                if self.wrapped {
                    stream.skip_whitespace();
                    match peek(stream.rest(), CALL_END) {
                        Eat::Yes => stream.consume(CALL_END.len()),
                        Eat::Partial => return false,
                        Eat::No => {}
                    }
                }
                stream.end_call();
                self.state = State::Text;
                true
            }
        }
    }

    fn abandon(&mut self, stream: &mut Stream) {
        if !matches!(self.state, State::Text) {
            self.fail(stream);
        }
    }

    fn in_text(&self) -> bool {
        matches!(self.state, State::Text)
    }

    fn call_closed(&self) -> bool {
        matches!(self.state, State::FunctionClosed)
    }
}
