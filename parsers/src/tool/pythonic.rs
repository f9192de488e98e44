//! `pythonic`: calls written as a Python list, `[f(a=1, b="x"), g()]`, as
//! Llama 4 does (optionally between `<|python_start|>` and `<|python_end|>`,
//! which are removed).
//!
//! Why it exists: keyword values are Python literals (`'…'` strings,
//! `True`/`False`/`None`, nested lists and dicts), so they stream through
//! [`JsonValue`] in its Python dialect, which writes them as JSON. A call's
//! name is accepted at its `(`, then each `kw=value` streams as `"kw":value`.
//! Indexes are global across lists (the stream numbers every call it
//! accepts). A `[` that is not followed by `name(` is ordinary text.

use super::engine::Grammar;
use super::json_value::{Dialect, Flow, JsonValue, push_escaped_str};
use super::stream::{MAX_NAME_BYTES, Scan, Stream};

const PYTHON_START: &str = "<|python_start|>";
const PYTHON_END: &str = "<|python_end|>";

#[derive(Debug)]
enum State {
    Text,
    /// After `[` or `,`: the function name and `(`.
    Name,
    /// After `(` or `,`: a keyword or `)`.
    Keyword {
        first: bool,
    },
    /// After a keyword: `=`.
    Equals {
        prefix: String,
    },
    Value(JsonValue),
    /// After a value: `,` or `)`.
    KeywordNext,
    /// After `)`: `,` and another call, or `]`.
    ListNext,
}

#[derive(Debug)]
pub(crate) struct Pythonic {
    state: State,
}

impl Pythonic {
    pub(crate) fn new() -> Self {
        Self { state: State::Text }
    }

    fn fail(&mut self, stream: &mut Stream) {
        if stream.call_committed() {
            match &mut self.state {
                State::Value(value) => {
                    value.close_truncated(&mut stream.args);
                    stream.args.push('}');
                }
                State::ListNext => {}
                _ => stream.args.push('}'),
            }
        }
        stream.fail_call();
        self.state = State::Text;
    }

    /// Reads an identifier followed by `stop`; `Ok(None)` until it is known.
    fn identifier(stream: &Stream) -> Result<Option<(String, usize)>, ()> {
        let rest = stream.rest();
        let len = rest
            .find(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | '.' | '-')))
            .unwrap_or(rest.len());
        if len > MAX_NAME_BYTES {
            return Err(());
        }
        if len == rest.len() {
            return Ok(None);
        }
        let name = &rest[..len];
        match name.chars().next() {
            Some(c) if c.is_alphabetic() || c == '_' => Ok(Some((name.to_owned(), len))),
            _ => Err(()),
        }
    }

    fn close_call(&mut self, stream: &mut Stream) {
        stream.consume(1);
        stream.args.push('}');
        self.state = State::ListNext;
    }
}

impl Grammar for Pythonic {
    fn step(&mut self, stream: &mut Stream, at_end: bool) -> bool {
        match &mut self.state {
            State::Text => {
                let markers = ["[", PYTHON_START, PYTHON_END];
                let Scan::Marker(n) = stream.scan_text(&markers, at_end) else {
                    return false;
                };
                if n == 0 {
                    stream.begin_call();
                    self.state = State::Name;
                }
                stream.consume(markers[n].len());
                true
            }
            State::Name => {
                stream.skip_whitespace();
                match Self::identifier(stream) {
                    Ok(None) => false,
                    Ok(Some((name, len))) if stream.rest()[len..].starts_with('(') => {
                        stream.consume(len + 1);
                        stream.commit_name(&name);
                        stream.args.push('{');
                        self.state = State::Keyword { first: true };
                        true
                    }
                    Ok(Some(_)) | Err(()) => {
                        self.fail(stream);
                        true
                    }
                }
            }
            State::Keyword { first } => {
                let first = *first;
                stream.skip_whitespace();
                if stream.rest().starts_with(')') {
                    self.close_call(stream);
                    return true;
                }
                match Self::identifier(stream) {
                    Ok(None) => false,
                    Ok(Some((keyword, len))) => {
                        stream.consume(len);
                        let mut prefix = String::from(if first { "\"" } else { ",\"" });
                        push_escaped_str(&mut prefix, &keyword);
                        prefix.push_str("\":");
                        self.state = State::Equals { prefix };
                        true
                    }
                    Err(()) => {
                        self.fail(stream);
                        true
                    }
                }
            }
            State::Equals { prefix } => {
                let prefix = std::mem::take(prefix);
                stream.skip_whitespace();
                match stream.rest().chars().next() {
                    None => {
                        self.state = State::Equals { prefix };
                        false
                    }
                    Some('=') => {
                        stream.consume(1);
                        self.state = State::Value(JsonValue::with_prefix(Dialect::Python, prefix));
                        true
                    }
                    Some(_) => {
                        self.fail(stream);
                        true
                    }
                }
            }
            State::Value(value) => {
                let (rest, args) = stream.rest_and_args();
                let (used, flow) = value.push_run(rest, args);
                stream.consume(used);
                match flow {
                    Ok(Flow::More) => used > 0,
                    Ok(Flow::Done | Flow::DoneBefore) => {
                        self.state = State::KeywordNext;
                        true
                    }
                    Err(_) => {
                        self.fail(stream);
                        true
                    }
                }
            }
            State::KeywordNext => {
                stream.skip_whitespace();
                match stream.rest().chars().next() {
                    None => false,
                    Some(',') => {
                        stream.consume(1);
                        self.state = State::Keyword { first: false };
                        true
                    }
                    Some(')') => {
                        self.close_call(stream);
                        true
                    }
                    Some(_) => {
                        self.fail(stream);
                        true
                    }
                }
            }
            State::ListNext => {
                let rest = stream.rest();
                let trimmed = rest.trim_start();
                let skipped = rest.len() - trimmed.len();
                match trimmed.chars().next() {
                    None if !at_end => false,
                    Some(',') => {
                        // A trailing comma before `]` ends the list.
                        let after = trimmed[1..].trim_start();
                        if after.is_empty() && !at_end {
                            return false;
                        }
                        if after.starts_with(']') {
                            stream.consume(rest.len() - after.len() + 1);
                            stream.end_call();
                            self.state = State::Text;
                            return true;
                        }
                        stream.consume(skipped + 1);
                        stream.end_call();
                        stream.begin_call();
                        self.state = State::Name;
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
        matches!(self.state, State::ListNext)
    }
}
