//! The JSON family: formats whose arguments are a JSON object, framed by the
//! model's own markers.
//!
//! | syntax | a call looks like |
//! |---|---|
//! | `json` | `{"name": …, "arguments"/"parameters": {…}}`, or a `[…]` of them |
//! | `qwen` | `<tool_call>{call object}</tool_call>` (newlines optional) |
//! | `llama` | `<|python_tag|>` or a bare `{call object}`; more calls after `;` |
//! | `mistral` | `[TOOL_CALLS] [{call object}, …]`, or `[TOOL_CALLS]NAME[ARGS]{…}` repeated (an optional `[CALL_ID]id` before `[ARGS]`) |
//! | `deepseek` | `<｜tool▁calls▁begin｜>` then `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{…}\n```<｜tool▁call▁end｜>` … `<｜tool▁calls▁end｜>` |
//! | `deepseek31` | the same section with `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜>`; `<｜end▁of▁sentence｜>` is removed |
//! | `kimik2` | `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{…}<|tool_call_end|>…<|tool_calls_section_end|>` |
//!
//! Why it exists: these seven differ only in their framing, so one grammar
//! with a [`Syntax`] switch serves them all: the call object is read by
//! [`CallObject`], bare arguments by [`JsonValue`], and the name, arguments,
//! unknown-name and fallback rules are the [`Stream`]'s. Whitespace between
//! calls inside a section (and around a call inside its markers) is dropped;
//! any other text outside calls is content.

use super::call_object::{CallObject, Stop};
use super::engine::Grammar;
use super::json_value::{Dialect, Flow, JsonValue};
use super::stream::{Eat, MAX_NAME_BYTES, Scan, Stream, peek, valid_name};

/// Which framing the grammar reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Syntax {
    Json,
    Qwen,
    Llama,
    Mistral,
    DeepSeek,
    DeepSeek31,
    KimiK2,
}

const QWEN_BEGIN: &str = "<tool_call>";
const QWEN_END: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";
const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
const MISTRAL_ARGS: &str = "[ARGS]";
const MISTRAL_CALL_ID: &str = "[CALL_ID]";
const DS_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const DS_CALLS_END: &str = "<｜tool▁calls▁end｜>";
const DS_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const DS_CALL_END: &str = "<｜tool▁call▁end｜>";
const DS_SEP: &str = "<｜tool▁sep｜>";
const DS_EOS: &str = "<｜end▁of▁sentence｜>";
const KIMI_SECTION_BEGIN: &str = "<|tool_calls_section_begin|>";
const KIMI_SECTION_END: &str = "<|tool_calls_section_end|>";
const KIMI_CALL_BEGIN: &str = "<|tool_call_begin|>";
const KIMI_CALL_END: &str = "<|tool_call_end|>";
const KIMI_ARGS_BEGIN: &str = "<|tool_call_argument_begin|>";

/// What follows a call object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum After {
    /// The format's end marker (qwen).
    Trailer,
    /// Possibly `;` and another object (llama).
    Chain,
    /// `,` and another object, or `]`.
    Array,
    /// Free text.
    Text,
}

#[derive(Debug)]
enum State {
    Text,
    /// Inside a calls section, between calls.
    Section,
    Object(CallObject, After),
    /// After `[`: the first call object.
    ArrayFirst,
    /// After a call object in an array.
    ArrayNext,
    /// After `[TOOL_CALLS]`: an array, an object or `NAME[ARGS]`.
    MistralBody,
    /// The type word before `<｜tool▁sep｜>` (deepseek).
    HeaderType,
    /// The function name (or kimi's id).
    HeaderName,
    /// After mistral's `[CALL_ID]`.
    CallId,
    /// deepseek's code fence before the arguments.
    Fence,
    ArgsStart,
    Args(JsonValue),
    /// After the arguments (or the object): the end marker; `fence_seen` for
    /// deepseek's closing fence.
    Trailer {
        fence_seen: bool,
    },
    /// After a llama call: `;` and another call, or free text.
    Chain,
}

#[derive(Debug)]
pub(crate) struct JsonCalls {
    syntax: Syntax,
    state: State,
    in_section: bool,
    /// Inside a section, the current run of text has a non-whitespace char.
    section_run_has_text: bool,
}

impl JsonCalls {
    pub(crate) fn new(syntax: Syntax) -> Self {
        Self {
            syntax,
            state: State::Text,
            in_section: false,
            section_run_has_text: false,
        }
    }

    fn text_markers(&self) -> &'static [&'static str] {
        match self.syntax {
            Syntax::Json => &["{", "["],
            Syntax::Qwen => &[QWEN_BEGIN],
            Syntax::Llama => &[PYTHON_TAG, "{"],
            Syntax::Mistral => &[MISTRAL_CALLS],
            Syntax::DeepSeek => &[DS_CALLS_BEGIN, DS_CALL_BEGIN],
            Syntax::DeepSeek31 => &[DS_CALLS_BEGIN, DS_CALL_BEGIN, DS_EOS],
            Syntax::KimiK2 => &[KIMI_SECTION_BEGIN, KIMI_CALL_BEGIN],
        }
    }

    /// (call begin, section end, marker removed wherever it appears).
    fn section_markers(&self) -> (&'static str, &'static str, Option<&'static str>) {
        match self.syntax {
            Syntax::KimiK2 => (KIMI_CALL_BEGIN, KIMI_SECTION_END, None),
            Syntax::DeepSeek31 => (DS_CALL_BEGIN, DS_CALLS_END, Some(DS_EOS)),
            _ => (DS_CALL_BEGIN, DS_CALLS_END, None),
        }
    }

    fn free_state(&self) -> State {
        if self.in_section {
            State::Section
        } else {
            State::Text
        }
    }

    /// The call cannot continue here: close what a committed call opened,
    /// give a pending call back as content, resume free text at this point.
    fn fail(&mut self, stream: &mut Stream) {
        if stream.call_committed() {
            match &mut self.state {
                State::Object(object, _) => object.close_truncated(stream),
                State::Args(value) => {
                    value.close_truncated(&mut stream.args);
                }
                State::ArgsStart | State::Fence | State::CallId => stream.args.push_str("{}"),
                _ => {}
            }
        }
        stream.fail_call();
        self.state = self.free_state();
    }

    fn step_text(&mut self, stream: &mut Stream, at_end: bool) -> bool {
        let markers = self.text_markers();
        let Scan::Marker(n) = stream.scan_text(markers, at_end) else {
            return false;
        };
        let marker = markers[n];
        match (self.syntax, marker) {
            (Syntax::Json | Syntax::Llama, "{") => {
                stream.begin_call();
                self.state = State::Object(CallObject::default(), self.after_object());
            }
            (Syntax::Json, "[") => {
                stream.begin_call();
                stream.consume(1);
                self.state = State::ArrayFirst;
            }
            (_, QWEN_BEGIN | PYTHON_TAG) => {
                stream.begin_call();
                stream.consume(marker.len());
                self.state = State::Object(CallObject::default(), self.after_object());
            }
            (_, MISTRAL_CALLS) => {
                stream.begin_call();
                stream.consume(marker.len());
                self.state = State::MistralBody;
            }
            (_, DS_CALLS_BEGIN | KIMI_SECTION_BEGIN) => {
                stream.open_section();
                stream.consume(marker.len());
                self.in_section = true;
                self.state = State::Section;
            }
            (_, DS_CALL_BEGIN | KIMI_CALL_BEGIN) => self.begin_header_call(stream, marker),
            _ => stream.consume(marker.len()),
        }
        true
    }

    fn after_object(&self) -> After {
        match self.syntax {
            Syntax::Qwen => After::Trailer,
            Syntax::Llama => After::Chain,
            _ => After::Text,
        }
    }

    fn begin_header_call(&mut self, stream: &mut Stream, marker: &str) {
        stream.begin_call();
        stream.consume(marker.len());
        self.state = match self.syntax {
            Syntax::DeepSeek => State::HeaderType,
            _ => State::HeaderName,
        };
    }

    /// Inside a calls section: a run of text between markers that is only
    /// whitespace is dropped; any other run is content, whitespace included.
    fn step_section(&mut self, stream: &mut Stream, at_end: bool) -> bool {
        let (call_begin, section_end, removed) = self.section_markers();
        let markers = [call_begin, section_end, removed.unwrap_or(section_end)];
        if !self.section_run_has_text {
            let rest = stream.rest();
            let trimmed = rest.trim_start();
            let skipped = rest.len() - trimmed.len();
            if trimmed.is_empty() {
                if at_end {
                    stream.consume(skipped);
                }
                return false;
            }
            match markers.map(|m| peek(trimmed, m)) {
                eats if eats.contains(&Eat::Yes) => stream.consume(skipped),
                eats if eats.contains(&Eat::Partial) && !at_end => return false,
                _ => self.section_run_has_text = true,
            }
        }
        let Scan::Marker(n) = stream.scan_text(&markers, at_end) else {
            return false;
        };
        self.section_run_has_text = false;
        let marker = markers[n];
        if marker == call_begin {
            self.begin_header_call(stream, marker);
        } else {
            stream.consume(marker.len());
            if marker == section_end {
                self.in_section = false;
                self.state = State::Text;
            }
        }
        true
    }

    fn step_object(&mut self, stream: &mut Stream) -> bool {
        let State::Object(object, after) = &mut self.state else {
            return false;
        };
        let after = *after;
        let (used, stop) = {
            // One run, never past the held-text cap: the run stops at the
            // cap, and the character that passes it is read alone, so the
            // driver's check after this step trips on the same character
            // as if every character were a step.
            let limit = stream.held_allowance();
            let (rest, args) = stream.rest_and_args();
            let mut capped = limit.min(rest.len());
            while !rest.is_char_boundary(capped) {
                capped -= 1;
            }
            let (mut used, mut stop) = object.push_run(&rest[..capped], args);
            if stop == Stop::More && used < rest.len() {
                let next = rest[used..].chars().next().map_or(0, char::len_utf8);
                let (one, one_stop) = object.push_run(&rest[used..used + next], args);
                used += one;
                stop = one_stop;
            }
            (used, stop)
        };
        stream.consume(used);
        match stop {
            Stop::More => return used > 0,
            Stop::Name => {
                let named = object.name().map(|name| stream.commit_name(&name));
                if named.is_err() {
                    self.fail(stream);
                }
            }
            Stop::Done => {
                self.state = match after {
                    After::Trailer => State::Trailer { fence_seen: true },
                    // The separator after the object still belongs to this
                    // call (a rejected call returns it as content).
                    After::Chain => State::Chain,
                    After::Array => State::ArrayNext,
                    After::Text => {
                        stream.end_call();
                        self.free_state()
                    }
                };
            }
            Stop::Malformed => self.fail(stream),
        }
        true
    }

    fn step_args(&mut self, stream: &mut Stream) -> bool {
        let State::Args(value) = &mut self.state else {
            return false;
        };
        let (rest, args) = stream.rest_and_args();
        let (used, flow) = value.push_run(rest, args);
        stream.consume(used);
        match flow {
            Ok(Flow::More) => return used > 0,
            Ok(Flow::Done) => {
                self.state = if self.syntax == Syntax::Mistral {
                    stream.end_call();
                    State::Text
                } else {
                    State::Trailer { fence_seen: false }
                };
            }
            Ok(Flow::DoneBefore) | Err(_) => self.fail(stream),
        }
        true
    }

    /// Reads a name (or id) up to one of `terminators`; consumes both.
    /// `Err` when the text is not a name.
    fn read_until(
        stream: &mut Stream,
        terminators: &[&str],
        max: usize,
    ) -> Result<Option<(String, usize)>, ()> {
        let Some((len, n)) = stream.find_within(terminators, max)? else {
            return Ok(None);
        };
        let text = stream.rest()[..len].trim().to_owned();
        stream.consume(len + terminators[n].len());
        Ok(Some((text, n)))
    }

    fn step_header_name(&mut self, stream: &mut Stream) -> bool {
        let terminators: &[&str] = match self.syntax {
            Syntax::DeepSeek => &["\n"],
            Syntax::KimiK2 => &[KIMI_ARGS_BEGIN],
            Syntax::Mistral => &[MISTRAL_ARGS, MISTRAL_CALL_ID],
            _ => &[DS_SEP],
        };
        let (text, terminator) = match Self::read_until(stream, terminators, MAX_NAME_BYTES) {
            Ok(Some(found)) => found,
            Ok(None) => return false,
            Err(()) => {
                self.fail(stream);
                return true;
            }
        };
        let name = match self.syntax {
            Syntax::KimiK2 => kimi_name(&text),
            _ => text.as_str(),
        };
        if !valid_name(name) {
            self.fail(stream);
            return true;
        }
        stream.commit_name(name);
        self.state = match (self.syntax, terminators[terminator]) {
            (Syntax::DeepSeek, _) => State::Fence,
            (_, MISTRAL_CALL_ID) => State::CallId,
            _ => State::ArgsStart,
        };
        true
    }

    /// After a call: whitespace, deepseek's closing fence, deepseek31's
    /// end-of-sentence, then the end marker. Anything else ends the call and
    /// is free text.
    fn step_trailer(&mut self, stream: &mut Stream, fence_seen: bool) -> bool {
        stream.skip_whitespace();
        let end = match self.syntax {
            Syntax::Qwen => QWEN_END,
            Syntax::KimiK2 => KIMI_CALL_END,
            _ => DS_CALL_END,
        };
        let optional = match self.syntax {
            Syntax::DeepSeek if !fence_seen => Some("```"),
            Syntax::DeepSeek31 => Some(DS_EOS),
            _ => None,
        };
        let rest = stream.rest();
        let end_eat = peek(rest, end);
        let optional_eat = optional.map_or(Eat::No, |m| peek(rest, m));
        if end_eat == Eat::Partial || optional_eat == Eat::Partial {
            return false;
        }
        if let (Eat::Yes, Some(marker)) = (optional_eat, optional) {
            stream.consume(marker.len());
            if self.syntax == Syntax::DeepSeek {
                self.state = State::Trailer { fence_seen: true };
            }
            return true;
        }
        if end_eat == Eat::Yes {
            stream.consume(end.len());
        }
        stream.end_call();
        self.state = self.free_state();
        true
    }
}

/// `functions.get_weather:0` → `get_weather` (the prefix and index are
/// optional).
fn kimi_name(id: &str) -> &str {
    let id = id.strip_prefix("functions.").unwrap_or(id);
    match id.rsplit_once(':') {
        Some((name, index)) if index.chars().all(|c| c.is_ascii_digit()) => name,
        _ => id,
    }
}

impl Grammar for JsonCalls {
    fn step(&mut self, stream: &mut Stream, at_end: bool) -> bool {
        match &self.state {
            State::Text => self.step_text(stream, at_end),
            State::Section => self.step_section(stream, at_end),
            State::Object(..) => self.step_object(stream),
            State::Args(_) => self.step_args(stream),
            State::ArrayFirst => {
                stream.skip_whitespace();
                match stream.rest().chars().next() {
                    None => false,
                    Some('{') => {
                        self.state = State::Object(CallObject::default(), After::Array);
                        true
                    }
                    Some(_) => {
                        self.fail(stream);
                        true
                    }
                }
            }
            State::ArrayNext => {
                let rest = stream.rest();
                let trimmed = rest.trim_start();
                let skipped = rest.len() - trimmed.len();
                match trimmed.chars().next() {
                    None if !at_end => false,
                    Some(',') => {
                        stream.consume(skipped + 1);
                        stream.end_call();
                        stream.begin_call();
                        self.state = State::ArrayFirst;
                        true
                    }
                    Some(']') => {
                        stream.consume(skipped + 1);
                        stream.end_call();
                        self.state = State::Text;
                        true
                    }
                    _ => {
                        stream.end_call();
                        self.state = State::Text;
                        true
                    }
                }
            }
            State::MistralBody => {
                stream.skip_whitespace();
                match stream.rest().chars().next() {
                    None => false,
                    Some('[') => {
                        stream.consume(1);
                        self.state = State::ArrayFirst;
                        true
                    }
                    Some('{') => {
                        self.state = State::Object(CallObject::default(), After::Text);
                        true
                    }
                    Some(_) => {
                        self.state = State::HeaderName;
                        true
                    }
                }
            }
            State::HeaderType => match Self::read_until(stream, &[DS_SEP], 32) {
                Ok(Some(_)) => {
                    self.state = State::HeaderName;
                    true
                }
                Ok(None) => false,
                Err(()) => {
                    self.fail(stream);
                    true
                }
            },
            State::HeaderName => self.step_header_name(stream),
            State::CallId => match Self::read_until(stream, &[MISTRAL_ARGS], MAX_NAME_BYTES) {
                Ok(Some(_)) => {
                    self.state = State::ArgsStart;
                    true
                }
                Ok(None) => false,
                Err(()) => {
                    self.fail(stream);
                    true
                }
            },
            State::Fence => {
                stream.skip_whitespace();
                let rest = stream.rest();
                let fence = match (peek(rest, "```json"), peek(rest, "```")) {
                    (Eat::Partial, _) | (_, Eat::Partial) => return false,
                    (Eat::Yes, _) => "```json".len(),
                    (_, Eat::Yes) => "```".len(),
                    _ => 0,
                };
                stream.consume(fence);
                self.state = State::ArgsStart;
                true
            }
            State::ArgsStart => {
                stream.skip_whitespace();
                match stream.rest().chars().next() {
                    None => false,
                    Some('{') => {
                        self.state = State::Args(JsonValue::new(Dialect::Json));
                        true
                    }
                    Some(_) => {
                        self.fail(stream);
                        true
                    }
                }
            }
            State::Trailer { fence_seen } => {
                let fence_seen = *fence_seen;
                self.step_trailer(stream, fence_seen)
            }
            State::Chain => {
                let rest = stream.rest();
                let trimmed = rest.trim_start();
                let Some(after_semicolon) = trimmed.strip_prefix(';') else {
                    if trimmed.is_empty() && !at_end {
                        return false;
                    }
                    stream.end_call();
                    self.state = State::Text;
                    return true;
                };
                let next = after_semicolon.trim_start();
                if next.starts_with('{') {
                    let skip = rest.len() - next.len();
                    stream.consume(skip);
                    stream.end_call();
                    stream.begin_call();
                    self.state = State::Object(CallObject::default(), After::Chain);
                    return true;
                }
                if next.is_empty() && !at_end {
                    return false;
                }
                stream.end_call();
                self.state = State::Text;
                true
            }
        }
    }

    fn abandon(&mut self, stream: &mut Stream) {
        if matches!(self.state, State::Text | State::Section) {
            self.in_section = false;
            self.state = State::Text;
            return;
        }
        self.fail(stream);
        self.in_section = false;
        if matches!(self.state, State::Section) {
            self.state = State::Text;
        }
    }

    fn in_text(&self) -> bool {
        matches!(self.state, State::Text)
    }

    fn call_closed(&self) -> bool {
        matches!(
            self.state,
            State::Trailer { .. } | State::Chain | State::ArrayNext
        )
    }
}
