//! gpt-oss's Harmony format: one parser turns the model's messages into
//! reasoning, answer text and tool calls.
//!
//! Why a parser of its own: Harmony is not "text with a think block and call
//! markup" but a sequence of messages, each with a header naming its channel
//! and, for a tool call, its recipient:
//!
//! ```text
//! <|channel|>analysis<|message|>Need the weather.<|end|>
//! <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>
//! ```
//!
//! Reasoning and calls are decided by the same header, so one state machine
//! does both; the text reasoning + tool parser pair cannot.
//!
//! # Input
//!
//! The decoded text with special tokens kept. Each marker (`<|start|>`,
//! `<|channel|>`, `<|constrain|>`, `<|message|>`, `<|end|>`, `<|call|>`,
//! `<|return|>`) is one special token of gpt-oss's tokenizer, so finding it
//! in the text is finding the token; a chunk-final prefix of a marker is held
//! back until the next chunk decides it. The output begins inside the first
//! header: the prompt ends with `<|start|>assistant`. `<|call|>` and
//! `<|return|>` are end-of-sequence tokens that a gateway may hide from the
//! text, so a message ended by the end of the text is complete.
//!
//! # Where a message goes
//!
//! | header | body goes to |
//! |---|---|
//! | `to=functions.NAME`, any channel | a call to NAME; the body streams as its arguments |
//! | `to=functions.NAME`, calls off or NAME not offered | content |
//! | another recipient (`python`, `browser.*`, `container.*`, …) | dropped |
//! | channel `analysis` | reasoning (content with `separate_reasoning: false`) |
//! | channel `final`, `commentary` (a preamble), or unknown | content |
//!
//! - **Built-in tools are dropped**: the gateway advertises only the
//!   request's functions, so a `python` or `browser.search` message is a call
//!   to a tool nobody will run; its body (code, a query) is neither the
//!   answer nor a function call the client can answer.
//! - **Calls off** (`tool_choice: none`, or no tools): a function message is
//!   the model's answer in the only form it gave, so its body is content,
//!   without markers; likewise when NAME is not one of the offered tools
//!   (the text parsers' unknown-name policy).
//! - **Arguments** are the message body as the model wrote it (Harmony
//!   constrains it to JSON with `<|constrain|>json`), streamed as it arrives;
//!   a call cut off by the end of the text keeps what it has.
//! - **Text outside Harmony**: text that begins a message but never reaches
//!   `<|message|>` is plain content when it holds no header marker (a model
//!   answering without Harmony); a header that was begun (`<|start|>`,
//!   `<|channel|>`) but cut off before its body is dropped, so a truncated
//!   `<|start|>assistant<|channel|>final` never shows as `assistantfinal`.
//!   A header longer than [`MAX_HEADER_BYTES`] is not a header: it and the
//!   rest of its message are content.
//! - A message ends at `<|end|>`, `<|call|>`, `<|return|>` or the next
//!   `<|start|>`; a stray `<|channel|>`, `<|constrain|>` or `<|message|>`
//!   inside a body is dropped. No marker ever reaches reasoning, content or
//!   arguments.
//!
//! The parser's decisions depend only on the text, never on where chunks
//! end, so any chunking gives the same result as one push of the whole text.

mod header;
mod markers;

use std::mem;

pub use markers::MARKERS;
use markers::{Found, Marker, scan};

use crate::tool::{CallDelta, ToolCall, Tools};

/// The longest header (the text between a message's start and
/// `<|message|>`, in bytes) read as one; real headers are well under 100.
pub const MAX_HEADER_BYTES: usize = 256;

/// Whether a model speaks Harmony: its id names gpt-oss, or its chat
/// template writes channels (`<|channel|>`, which no other family uses).
pub fn detect(model: &str, template: Option<&str>) -> bool {
    model.to_ascii_lowercase().contains("gpt-oss")
        || template.is_some_and(|template| template.contains(Marker::Channel.text()))
}

/// How one response is read.
#[derive(Debug, Clone, PartialEq)]
pub struct HarmonyOptions {
    /// `analysis` is reasoning; `false`: it is content.
    pub separate_reasoning: bool,
    /// Messages to `functions.NAME` are calls, NAME one of these tools (any
    /// name when empty); `None`: calls are off and such bodies are content.
    pub calls: Option<Tools>,
}

/// What one chunk (or the end of the text) produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HarmonyDelta {
    /// `analysis` text.
    pub reasoning: String,
    /// `final` text and everything else shown as the answer.
    pub content: String,
    /// Call fragments in order: a call's first fragment carries its name.
    pub calls: Vec<CallDelta>,
}

impl HarmonyDelta {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty() && self.calls.is_empty()
    }
}

/// A whole response, parsed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParsedHarmony {
    pub reasoning: String,
    pub content: String,
    pub calls: Vec<ToolCall>,
}

impl ParsedHarmony {
    /// Appends the next delta of the same response.
    pub fn add(&mut self, delta: HarmonyDelta) {
        self.reasoning.push_str(&delta.reasoning);
        self.content.push_str(&delta.content);
        for call in delta.calls {
            if let Some(name) = call.name {
                self.calls.push(ToolCall {
                    name,
                    arguments: String::new(),
                });
            }
            if let Some(whole) = self.calls.get_mut(call.index) {
                whole.arguments.push_str(&call.arguments);
            }
        }
    }
}

/// Where a message's body goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Reasoning,
    Content,
    /// Arguments of the call with this index.
    Call(usize),
    Dropped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a header, which starts at the beginning of the buffer.
    /// `opened`: a `<|start|>` began it (otherwise it is the output's first
    /// message, or text after a message's end).
    Header { opened: bool },
    /// Reading a body.
    Body(Route),
}

/// The streaming parser of one response.
#[derive(Debug)]
pub struct HarmonyParser {
    options: HarmonyOptions,
    /// Text not consumed yet; in [`State::Header`] it starts at the header.
    buf: String,
    state: State,
    calls_begun: usize,
    delta: HarmonyDelta,
}

impl HarmonyParser {
    pub fn new(options: HarmonyOptions) -> Self {
        Self {
            options,
            buf: String::new(),
            state: State::Header { opened: false },
            calls_begun: 0,
            delta: HarmonyDelta::default(),
        }
    }

    /// Feeds the next chunk; returns what can be sent now.
    pub fn push(&mut self, chunk: &str) -> HarmonyDelta {
        self.buf.push_str(chunk);
        while self.step(false) {}
        mem::take(&mut self.delta)
    }

    /// The text ended: what was held back goes out, a call in progress ends
    /// with the arguments it has, an unfinished header is resolved.
    pub fn finish(&mut self) -> HarmonyDelta {
        while self.step(true) {}
        mem::take(&mut self.delta)
    }

    /// Makes progress on the buffer; false when it needs more text.
    fn step(&mut self, at_end: bool) -> bool {
        match self.state {
            State::Header { opened } => self.header(opened, at_end),
            State::Body(route) => self.body(route, at_end),
        }
    }

    fn header(&mut self, opened: bool, at_end: bool) -> bool {
        let mut from = 0;
        let mut marked = opened;
        loop {
            let found = scan(&self.buf, from, at_end);
            let known = match found {
                Found::Marker(at, _) | Found::Partial(at) => at,
                Found::Nothing => self.buf.len(),
            };
            if known > MAX_HEADER_BYTES {
                // Not a header: it and the rest of its message are content.
                self.state = State::Body(Route::Content);
                return true;
            }
            match found {
                Found::Marker(at, marker @ (Marker::Channel | Marker::Constrain)) => {
                    marked = true;
                    from = at + marker.len();
                }
                Found::Marker(at, Marker::Message) => {
                    let header = self.consume(at, Marker::Message.len());
                    self.state = State::Body(self.route(&header));
                    return true;
                }
                Found::Marker(0, Marker::Start) => {
                    self.buf.drain(..Marker::Start.len());
                    self.state = State::Header { opened: true };
                    return true;
                }
                Found::Marker(_, _) => {
                    // Ended before its body: the body reader consumes the
                    // text up to the marker, then the marker itself.
                    self.state = State::Body(fallback(marked));
                    return true;
                }
                Found::Partial(_) => return false,
                Found::Nothing if at_end && !self.buf.is_empty() => {
                    self.state = State::Body(fallback(marked));
                    return true;
                }
                Found::Nothing => return false,
            }
        }
    }

    fn body(&mut self, route: Route, at_end: bool) -> bool {
        match scan(&self.buf, 0, at_end) {
            Found::Marker(at, marker) => {
                let text = self.consume(at, marker.len());
                self.emit(route, &text);
                match marker {
                    Marker::Start => self.state = State::Header { opened: true },
                    Marker::End | Marker::Call | Marker::Return => {
                        self.state = State::Header { opened: false };
                    }
                    Marker::Channel | Marker::Constrain | Marker::Message => {}
                }
                true
            }
            Found::Partial(at) if at > 0 => {
                let text = self.consume(at, 0);
                self.emit(route, &text);
                false
            }
            Found::Partial(_) => false,
            Found::Nothing if self.buf.is_empty() => false,
            Found::Nothing => {
                let text = mem::take(&mut self.buf);
                self.emit(route, &text);
                false
            }
        }
    }

    /// Removes the buffer's first `at` bytes and returns them, then drops
    /// `skip` more (a marker).
    fn consume(&mut self, at: usize, skip: usize) -> String {
        let text = self.buf[..at].to_owned();
        self.buf.drain(..at + skip);
        text
    }

    /// Where the body of a message with this header goes.
    fn route(&mut self, header: &str) -> Route {
        let header = header::read(header);
        match header.recipient {
            Some(recipient) => match recipient.strip_prefix("functions.") {
                Some(name) if self.accepts(name) => {
                    let index = self.calls_begun;
                    self.calls_begun += 1;
                    self.delta.calls.push(CallDelta {
                        index,
                        name: Some(name.to_owned()),
                        arguments: String::new(),
                        content_before: self.delta.content.len(),
                    });
                    Route::Call(index)
                }
                Some(_) => Route::Content,
                None => Route::Dropped,
            },
            None if header.channel == Some("analysis") && self.options.separate_reasoning => {
                Route::Reasoning
            }
            None => Route::Content,
        }
    }

    fn accepts(&self, name: &str) -> bool {
        match &self.options.calls {
            None => false,
            Some(tools) => {
                !name.is_empty() && (tools.is_empty() || tools.iter().any(|t| t.name == name))
            }
        }
    }

    fn emit(&mut self, route: Route, text: &str) {
        if text.is_empty() {
            return;
        }
        match route {
            Route::Reasoning => self.delta.reasoning.push_str(text),
            Route::Content => self.delta.content.push_str(text),
            Route::Dropped => {}
            Route::Call(index) => match self.delta.calls.last_mut() {
                Some(last) if last.index == index => last.arguments.push_str(text),
                _ => self.delta.calls.push(CallDelta {
                    index,
                    name: None,
                    arguments: text.to_owned(),
                    content_before: self.delta.content.len(),
                }),
            },
        }
    }
}

/// Where the text of a header that never reached `<|message|>` goes: a
/// begun header (a marker in it) is dropped, plain text is content.
fn fallback(marked: bool) -> Route {
    if marked {
        Route::Dropped
    } else {
        Route::Content
    }
}

/// Parses a whole response: one push, then finish.
pub fn parse_complete(options: HarmonyOptions, text: &str) -> ParsedHarmony {
    let mut parser = HarmonyParser::new(options);
    let mut parsed = ParsedHarmony::default();
    parsed.add(parser.push(text));
    parsed.add(parser.finish());
    parsed
}
