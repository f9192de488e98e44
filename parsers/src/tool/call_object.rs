//! A JSON call object, `{"name": "f", "arguments": {…}}`, read one character
//! at a time.
//!
//! Why it exists: qwen, llama, mistral and json all write a call as this
//! object, and they must agree on it. The name is accepted (and sent) the
//! moment its closing quote arrives; the arguments (`arguments` or
//! `parameters`) then stream through [`JsonValue`] into the call. Other keys
//! (`"type": "function"`, which Llama 3.2 writes) are read and ignored.
//! Arguments written before the name are held by the stream until the name
//! arrives. An object with no arguments key has arguments `{}`.

use super::json_value::{Dialect, Flow, JsonValue, Malformed};
use super::stream::{Stream, valid_name};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    KeyOrClose,
    Key,
    Colon,
    ValueStart,
    Value,
    CommaOrClose,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Name,
    Arguments,
    Other,
}

#[derive(Debug)]
pub(crate) struct CallObject {
    state: State,
    value: JsonValue,
    field: Field,
    scratch: String,
    saw_name: bool,
    saw_arguments: bool,
}

impl Default for CallObject {
    fn default() -> Self {
        Self {
            state: State::Open,
            value: JsonValue::new(Dialect::Json),
            field: Field::Other,
            scratch: String::new(),
            saw_name: false,
            saw_arguments: false,
        }
    }
}

impl CallObject {
    /// Reads one character (leading whitespace before `{` is skipped).
    /// `Flow::Done` when the object's `}` was read.
    pub(crate) fn push(&mut self, c: char, stream: &mut Stream) -> Result<Flow, Malformed> {
        match self.state {
            State::Open => match c {
                '{' => {
                    self.state = State::KeyOrClose;
                    Ok(Flow::More)
                }
                c if c.is_whitespace() => Ok(Flow::More),
                _ => Err(Malformed),
            },
            State::KeyOrClose => match c {
                '"' => {
                    self.start_value();
                    self.state = State::Key;
                    self.value.push(c, &mut self.scratch)
                }
                '}' => self.close(stream),
                c if c.is_whitespace() => Ok(Flow::More),
                _ => Err(Malformed),
            },
            State::Key => {
                if self.value.push(c, &mut self.scratch)? == Flow::Done {
                    let key: String = serde_json::from_str(&self.scratch).map_err(|_| Malformed)?;
                    self.field = match key.as_str() {
                        "name" if !self.saw_name => Field::Name,
                        "arguments" | "parameters" if !self.saw_arguments => Field::Arguments,
                        "name" | "arguments" | "parameters" => return Err(Malformed),
                        _ => Field::Other,
                    };
                    self.state = State::Colon;
                }
                Ok(Flow::More)
            }
            State::Colon => match c {
                ':' => {
                    self.state = State::ValueStart;
                    Ok(Flow::More)
                }
                c if c.is_whitespace() => Ok(Flow::More),
                _ => Err(Malformed),
            },
            State::ValueStart => {
                if c.is_whitespace() {
                    return Ok(Flow::More);
                }
                match (self.field, c) {
                    (Field::Name, '"') | (Field::Arguments, '{') | (Field::Other, _) => {}
                    _ => return Err(Malformed),
                }
                self.start_value();
                self.state = State::Value;
                self.value_char(c, stream)
            }
            State::Value => self.value_char(c, stream),
            State::CommaOrClose => match c {
                ',' => {
                    self.state = State::KeyOrClose;
                    Ok(Flow::More)
                }
                '}' => self.close(stream),
                c if c.is_whitespace() => Ok(Flow::More),
                _ => Err(Malformed),
            },
        }
    }

    /// Reads the plain inside of a string value in one go (see
    /// [`JsonValue::push_plain`]), at most `limit` bytes. Returns the bytes
    /// read; 0 when the next character needs [`CallObject::push`].
    pub(crate) fn push_plain(&mut self, text: &str, limit: usize, args: &mut String) -> usize {
        if self.state != State::Value {
            return 0;
        }
        let mut end = limit.min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let target = match self.field {
            Field::Arguments => args,
            Field::Name | Field::Other => &mut self.scratch,
        };
        self.value.push_plain(&text[..end], target)
    }

    /// The text ended inside the object: complete a committed call's
    /// arguments.
    pub(crate) fn close_truncated(&mut self, stream: &mut Stream) {
        if self.state == State::Value && self.field == Field::Arguments {
            self.value.close_truncated(&mut stream.args);
            self.saw_arguments = true;
        }
        if !self.saw_arguments {
            stream.args.push_str("{}");
        }
    }

    fn start_value(&mut self) {
        self.value = JsonValue::new(Dialect::Json);
        self.scratch.clear();
    }

    fn value_char(&mut self, c: char, stream: &mut Stream) -> Result<Flow, Malformed> {
        let target = match self.field {
            Field::Arguments => &mut stream.args,
            Field::Name | Field::Other => &mut self.scratch,
        };
        match self.value.push(c, target)? {
            Flow::More => Ok(Flow::More),
            Flow::Done => {
                self.value_complete(stream)?;
                Ok(Flow::More)
            }
            Flow::DoneBefore => {
                self.value_complete(stream)?;
                self.push(c, stream)
            }
        }
    }

    fn value_complete(&mut self, stream: &mut Stream) -> Result<(), Malformed> {
        self.state = State::CommaOrClose;
        match self.field {
            Field::Name => {
                let name: String = serde_json::from_str(&self.scratch).map_err(|_| Malformed)?;
                if !valid_name(&name) {
                    return Err(Malformed);
                }
                self.saw_name = true;
                stream.commit_name(&name);
            }
            Field::Arguments => self.saw_arguments = true,
            Field::Other => {}
        }
        Ok(())
    }

    fn close(&mut self, stream: &mut Stream) -> Result<Flow, Malformed> {
        if !self.saw_name {
            return Err(Malformed);
        }
        if !self.saw_arguments {
            self.saw_arguments = true;
            stream.args.push_str("{}");
        }
        Ok(Flow::Done)
    }
}
