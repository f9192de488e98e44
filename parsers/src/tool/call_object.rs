//! A JSON call object, `{"name": "f", "arguments": {…}}`, read as it
//! streams.
//!
//! Why it exists: qwen, llama, mistral and json all write a call as this
//! object, and they must agree on it. The name is accepted (and sent) the
//! moment its closing quote arrives; the arguments (`arguments` or
//! `parameters`) then stream through [`JsonValue`] into the call. Other keys
//! (`"type": "function"`, which Llama 3.2 writes) are read and ignored.
//! Arguments written before the name are held by the stream until the name
//! arrives. An object with no arguments key has arguments `{}`.
//!
//! Text is read in runs ([`CallObject::push_run`]): a decision is made per
//! structural character, and the text between them (whitespace, the inside
//! of keys and strings) goes through as byte slices, so a call costs a few
//! steps, not one per character. The decisions are the same as one
//! character at a time, which is what keeps every chunking equal.

use std::borrow::Cow;

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

/// How a run of text ended for the call object ([`CallObject::push_run`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// All of the text was read; the object is not complete.
    More,
    /// The last character read closed the call's name: the caller commits
    /// [`CallObject::name`] before reading on.
    Name,
    /// The last character read was the object's closing `}`.
    Done,
    /// The text at the returned offset cannot continue the object.
    Malformed,
}

/// What one structural character did.
enum Structural {
    /// Read.
    Read,
    /// A value starts with this character: it is read again as the value's.
    Value,
    /// The object's closing `}`, read.
    Closed,
}

impl CallObject {
    /// Reads characters of `text` (leading whitespace before `{` is
    /// skipped) until the object closes, the name closes, the object turns
    /// out malformed or the text ends. Returns the bytes read and why it
    /// stopped. Values stream through [`JsonValue::push_run`] (the
    /// arguments into `args`); whitespace between tokens is skipped as a
    /// byte run. The decisions are those of reading one character at a
    /// time: where a run is cut never changes them.
    pub(crate) fn push_run(&mut self, text: &str, args: &mut String) -> (usize, Stop) {
        let mut read = 0;
        while read < text.len() {
            let rest = &text[read..];
            if matches!(self.state, State::Key | State::Value) {
                let target = match (self.state, self.field) {
                    (State::Value, Field::Arguments) => &mut *args,
                    _ => &mut self.scratch,
                };
                let (used, flow) = self.value.push_run(rest, target);
                read += used;
                let completed = match flow {
                    Ok(Flow::More) => continue,
                    // The completing character (a quote or bracket) is one
                    // byte: a failure is reported at it, unread.
                    Ok(Flow::Done) => read - 1,
                    Ok(Flow::DoneBefore) => read,
                    Err(Malformed) => return (read, Stop::Malformed),
                };
                match self.value_complete() {
                    Ok(Field::Name) => return (read, Stop::Name),
                    Ok(_) => continue,
                    Err(Malformed) => return (completed, Stop::Malformed),
                }
            }
            let space = rest
                .bytes()
                .position(|b| !(b.is_ascii() && char::from(b).is_whitespace()))
                .unwrap_or(rest.len());
            if space > 0 {
                read += space;
                continue;
            }
            let Some(c) = rest.chars().next() else {
                break;
            };
            match self.structural(c, args) {
                Ok(Structural::Read) => read += c.len_utf8(),
                Ok(Structural::Value) => {}
                Ok(Structural::Closed) => return (read + c.len_utf8(), Stop::Done),
                Err(Malformed) => return (read, Stop::Malformed),
            }
        }
        (read, Stop::More)
    }

    /// The name the object's `name` value holds, once [`Stop::Name`] was
    /// returned.
    pub(crate) fn name(&self) -> Result<Cow<'_, str>, Malformed> {
        decode_string(&self.scratch)
    }

    /// One character outside a value: punctuation, whitespace, or the
    /// first character of a key or value.
    fn structural(&mut self, c: char, args: &mut String) -> Result<Structural, Malformed> {
        if c.is_whitespace() {
            return Ok(Structural::Read);
        }
        match (self.state, c) {
            (State::Open, '{') => self.state = State::KeyOrClose,
            (State::KeyOrClose, '"') => {
                self.start_value();
                self.state = State::Key;
                return Ok(Structural::Value);
            }
            (State::KeyOrClose | State::CommaOrClose, '}') => {
                self.close(args)?;
                return Ok(Structural::Closed);
            }
            (State::Colon, ':') => self.state = State::ValueStart,
            (State::ValueStart, _) => {
                match (self.field, c) {
                    (Field::Name, '"') | (Field::Arguments, '{') | (Field::Other, _) => {}
                    _ => return Err(Malformed),
                }
                self.start_value();
                self.state = State::Value;
                return Ok(Structural::Value);
            }
            (State::CommaOrClose, ',') => self.state = State::KeyOrClose,
            _ => return Err(Malformed),
        }
        Ok(Structural::Read)
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

    /// The key or value in progress is complete: a key chooses the field;
    /// a name is checked (the caller commits it). Returns the field whose
    /// value completed (`Other` for a key).
    fn value_complete(&mut self) -> Result<Field, Malformed> {
        if self.state == State::Key {
            // `scratch` holds the key's canonical JSON text, and one string
            // has one canonical text: comparing it with the canonical text
            // of `name` compares the decoded keys, without decoding.
            self.field = match self.scratch.as_str() {
                "\"name\"" if !self.saw_name => Field::Name,
                "\"arguments\"" | "\"parameters\"" if !self.saw_arguments => Field::Arguments,
                "\"name\"" | "\"arguments\"" | "\"parameters\"" => return Err(Malformed),
                _ => Field::Other,
            };
            self.state = State::Colon;
            return Ok(Field::Other);
        }
        self.state = State::CommaOrClose;
        match self.field {
            Field::Name => {
                if !valid_name(&decode_string(&self.scratch)?) {
                    return Err(Malformed);
                }
                self.saw_name = true;
            }
            Field::Arguments => self.saw_arguments = true,
            Field::Other => {}
        }
        Ok(self.field)
    }

    fn close(&mut self, args: &mut String) -> Result<(), Malformed> {
        if !self.saw_name {
            return Err(Malformed);
        }
        if !self.saw_arguments {
            self.saw_arguments = true;
            args.push_str("{}");
        }
        Ok(())
    }
}

/// The string a canonical JSON string text (as [`JsonValue`] writes it)
/// stands for: borrowed from inside the quotes when it has no escape.
fn decode_string(canonical: &str) -> Result<Cow<'_, str>, Malformed> {
    match canonical
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
    {
        Some(inner) if !inner.contains('\\') => Ok(Cow::Borrowed(inner)),
        _ => serde_json::from_str::<String>(canonical)
            .map(Cow::Owned)
            .map_err(|_| Malformed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads `text` in runs cut at `cuts`, committing each name as the
    /// stream would: (arguments, names, bytes read, how it stopped).
    fn read(text: &str, cuts: &[usize]) -> (String, Vec<String>, usize, Stop) {
        let mut object = CallObject::default();
        let mut args = String::new();
        let mut names = Vec::new();
        let mut read = 0;
        for end in cuts.iter().copied().chain([text.len()]) {
            while read < end {
                let (used, stop) = object.push_run(&text[read..end], &mut args);
                read += used;
                match stop {
                    Stop::More => {}
                    Stop::Name => names.push(object.name().expect("a name").into_owned()),
                    Stop::Done | Stop::Malformed => return (args, names, read, stop),
                }
            }
        }
        (args, names, read, Stop::More)
    }

    #[test]
    fn an_object_reads_the_same_in_any_runs() {
        let cases = [
            r#"{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}"#,
            "\n {\u{a0}\"name\"\u{2028}:\n\"f\" ,\t\"parameters\" :{ \"a\" : [1, 2.50, true] } } tail",
            r#"{"arguments": {"q": "x\"y"}, "type": "function", "id": 5, "name": "f"}"#,
            r#"{"n\u0061me": "f", "argument\u0073": {}}"#,
            r#"{"name": "get\\weather"}"#,
            r#"{"name": "a b", "arguments": {}}"#,
            r#"{"name": "f", "name": "g"}"#,
            r#"{"arguments": {}}"#,
            r#"{"name": 5}"#,
            r#"{"name": "f", "arguments": [1]}"#,
            r#"{"name": "f", "extra": nul}"#,
            r#"{"name": "f", "arguments": {"a": "unfinished"#,
            "x{}",
        ];
        for text in cases {
            let whole = read(text, &[]);
            let chars: Vec<usize> = text.char_indices().map(|(at, _)| at).skip(1).collect();
            assert_eq!(read(text, &chars), whole, "char runs: {text}");
            for &cut in &chars {
                assert_eq!(read(text, &[cut]), whole, "cut at {cut}: {text}");
            }
        }
        let (args, names, used, stop) = read(cases[0], &[]);
        assert_eq!(
            (args.as_str(), names, used, stop),
            (
                r#"{"city":"Paris","unit":"celsius"}"#,
                vec!["get_weather".to_owned()],
                cases[0].len(),
                Stop::Done
            )
        );
        let (args, names, used, stop) = read(cases[1], &[]);
        assert_eq!(args, r#"{"a":[1,2.5,true]}"#);
        assert_eq!((names, stop), (vec!["f".to_owned()], Stop::Done));
        assert_eq!(&cases[1][used..], " tail");
        assert_eq!(read(cases[3], &[]).1, vec!["f".to_owned()], "escaped keys");
        assert_eq!(read(cases[4], &[]).1, vec!["get\\weather".to_owned()]);
        for malformed in &cases[5..11] {
            assert_eq!(read(malformed, &[]).3, Stop::Malformed, "{malformed}");
        }
        // A bad name is refused at its closing quote, which stays unread.
        let (_, names, used, _) = read(cases[5], &[]);
        assert!(names.is_empty());
        assert_eq!(&cases[5][used..used + 1], "\"");
    }
}
