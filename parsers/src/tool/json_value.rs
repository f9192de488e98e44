//! The incremental JSON re-serializer every parser streams arguments through.
//!
//! Why it exists: a model writes arguments as JSON (or Python literals) a few
//! bytes at a time, and the client must receive them as they arrive, yet the
//! concatenated fragments must be exactly the arguments a whole-response parse
//! gives. [`JsonValue`] consumes one character at a time, validates as it goes
//! and writes the *canonical* form of what it has read so far: compact, key
//! order preserved, strings re-escaped and numbers re-printed the way
//! `serde_json` prints them. Because the output depends only on the characters
//! read (never on where a chunk ended), any chunking gives the same bytes.
//!
//! Nothing is written that a later character could contradict: a `,` or a key
//! is written only together with the start of the value that follows it, and a
//! number or literal only once it is complete. So at any moment the output is a
//! prefix of the final text, and [`JsonValue::close_truncated`] can complete a
//! truncated value by closing the open string and containers only.

use std::str::FromStr;

/// Which literal syntax the input uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// JSON (lenient: trailing commas and raw control characters in strings
    /// are accepted; the output is always strict JSON).
    Json,
    /// Python literals as `pythonic` calls write them: `'…'` strings,
    /// `True`/`False`/`None`.
    Python,
}

/// The input can no longer be a value of the dialect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Malformed;

/// What one character did to the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Consumed; the value is not complete yet.
    More,
    /// Consumed, and it completed the value.
    Done,
    /// The value (a bare number or literal) was complete before this
    /// character, which was *not* consumed.
    DoneBefore,
}

/// Nesting deeper than this is treated as malformed (bounds the stack).
const MAX_DEPTH: usize = 64;
/// A number or literal longer than this is malformed (bounds the token).
const MAX_SCALAR_BYTES: usize = 512;
/// A key longer than this is malformed (keys are held until their value starts).
const MAX_KEY_BYTES: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Container {
    Object,
    Array,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// A value (the top level, or after `:`).
    Value,
    /// After `{` or `,` in an object: a key, or `}`.
    KeyOrClose,
    /// After a key.
    Colon,
    /// After `[` or `,` in an array: a value, or `]`.
    ValueOrClose,
    /// After a value inside a container.
    CommaOrClose,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Escape {
    None,
    Backslash,
    /// `digits` hex digits still to read into `code`; `high` is a pending
    /// high surrogate when this is the second half of a pair.
    Hex {
        digits: u8,
        code: u32,
        high: Option<u32>,
    },
    /// A high surrogate was read; a `\` must follow.
    LowBackslash(u32),
    /// A high surrogate and `\` were read; a `u` must follow.
    LowU(u32),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    None,
    Str {
        quote: char,
        key: bool,
        escape: Escape,
    },
    Scalar(String),
}

/// One JSON (or Python-literal) value being read.
#[derive(Debug, Clone)]
pub(crate) struct JsonValue {
    dialect: Dialect,
    stack: Vec<Container>,
    expect: Expect,
    token: Token,
    /// A `,` and/or `"key":` read but not yet written: they are written with
    /// the first output of the value that follows.
    held: String,
}

impl JsonValue {
    pub(crate) fn new(dialect: Dialect) -> Self {
        Self::with_prefix(dialect, String::new())
    }

    /// A value whose output starts with `prefix` (e.g. `,"key":`), written only
    /// once the value itself starts.
    pub(crate) fn with_prefix(dialect: Dialect, prefix: String) -> Self {
        Self {
            dialect,
            stack: Vec::new(),
            expect: Expect::Value,
            token: Token::None,
            held: prefix,
        }
    }

    /// True once any character of the value itself has been read.
    pub(crate) fn started(&self) -> bool {
        !self.stack.is_empty() || self.token != Token::None
    }

    /// Reads one character, writing canonical output to `out`.
    pub(crate) fn push(&mut self, c: char, out: &mut String) -> Result<Flow, Malformed> {
        match &mut self.token {
            Token::Str { .. } => self.string_char(c, out),
            Token::Scalar(text) => {
                if is_scalar_char(c) {
                    if text.len() >= MAX_SCALAR_BYTES {
                        return Err(Malformed);
                    }
                    text.push(c);
                    return Ok(Flow::More);
                }
                self.end_scalar(out)?;
                if self.stack.is_empty() {
                    return Ok(Flow::DoneBefore);
                }
                self.structural(c, out)
            }
            Token::None => self.structural(c, out),
        }
    }

    /// Reads characters of `text` until the value completes or fails, or the
    /// text ends. Returns the bytes read and how the run stopped:
    /// `Ok(Flow::More)`, all of `text` was read; `Ok(Flow::Done)`, the last
    /// character read completed the value (a closing quote or bracket:
    /// always one ASCII byte); `Ok(Flow::DoneBefore)`, the value was complete
    /// before `text[read..]`, which was not read; `Err(Malformed)`,
    /// `text[read..]` starts with a character that cannot continue it.
    ///
    /// The output and the answer are exactly those of [`JsonValue::push`]
    /// one character at a time, which this falls back to. Runs in which
    /// `push` would make no decision (the plain inside of a string or key,
    /// whitespace between tokens, the characters of a number or literal) are
    /// read as byte slices instead: that is where nearly all of a model's
    /// argument text goes.
    pub(crate) fn push_run(
        &mut self,
        text: &str,
        out: &mut String,
    ) -> (usize, Result<Flow, Malformed>) {
        let mut read = 0;
        while read < text.len() {
            let rest = &text[read..];
            let run = self.plain_run(rest, out);
            if run > 0 {
                read += run;
                continue;
            }
            let Some(c) = rest.chars().next() else {
                break;
            };
            match self.push(c, out) {
                Ok(Flow::More) => read += c.len_utf8(),
                Ok(Flow::Done) => return (read + c.len_utf8(), Ok(Flow::Done)),
                stop => return (read, stop),
            }
        }
        (read, Ok(Flow::More))
    }

    /// Reads the longest prefix of `text` that [`JsonValue::push`] would
    /// take one character at a time without a decision, with the same
    /// effect; returns its length (0 when the next character needs `push`).
    /// Every stop is an ASCII byte, so a run ends on a char boundary.
    fn plain_run(&mut self, text: &str, out: &mut String) -> usize {
        let bytes = text.as_bytes();
        match &mut self.token {
            // Written as they are (`push_escaped` changes only quotes,
            // backslashes and control characters); a key within its bound.
            Token::Str {
                quote,
                key,
                escape: Escape::None,
            } => {
                let quote = *quote as u32;
                let len = bytes
                    .iter()
                    .position(|&b| b < 0x20 || b == b'"' || b == b'\\' || u32::from(b) == quote)
                    .unwrap_or(bytes.len());
                if *key {
                    if self.held.len() + len > MAX_KEY_BYTES {
                        return 0;
                    }
                    self.held.push_str(&text[..len]);
                } else {
                    out.push_str(&text[..len]);
                }
                len
            }
            Token::Str { .. } => 0,
            // A number or literal within its bound.
            Token::Scalar(scalar) => {
                let len = bytes
                    .iter()
                    .position(|&b| !is_scalar_char(char::from(b)))
                    .unwrap_or(bytes.len());
                if scalar.len() + len > MAX_SCALAR_BYTES {
                    return 0;
                }
                scalar.push_str(&text[..len]);
                len
            }
            // Whitespace between tokens is skipped in every state.
            Token::None => bytes
                .iter()
                .position(|&b| !(b.is_ascii() && char::from(b).is_whitespace()))
                .unwrap_or(bytes.len()),
        }
    }

    /// The input ended inside the value: write what completes it (close an
    /// open string and the open containers; drop a half-read key, escape or
    /// literal). Returns `false` when nothing of the value had been written.
    pub(crate) fn close_truncated(&mut self, out: &mut String) -> bool {
        let started = self.started();
        match std::mem::replace(&mut self.token, Token::None) {
            Token::Str { key: false, .. } => out.push('"'),
            Token::Scalar(text) => {
                if let Ok(canonical) = canonical_scalar(self.dialect, &text) {
                    out.push_str(&self.held);
                    out.push_str(&canonical);
                }
            }
            Token::Str { key: true, .. } | Token::None => {}
        }
        self.held.clear();
        while let Some(container) = self.stack.pop() {
            out.push(closer(container));
        }
        started
    }

    fn structural(&mut self, c: char, out: &mut String) -> Result<Flow, Malformed> {
        if c.is_whitespace() {
            return Ok(Flow::More);
        }
        match self.expect {
            Expect::Value | Expect::ValueOrClose => {
                if self.expect == Expect::ValueOrClose && c == ']' {
                    return Ok(self.close(Container::Array, out));
                }
                self.start_value(c, out)
            }
            Expect::KeyOrClose => match c {
                '}' => Ok(self.close(Container::Object, out)),
                _ if self.is_quote(c) => {
                    self.held.push('"');
                    self.token = Token::Str {
                        quote: c,
                        key: true,
                        escape: Escape::None,
                    };
                    Ok(Flow::More)
                }
                _ => Err(Malformed),
            },
            Expect::Colon => {
                if c != ':' {
                    return Err(Malformed);
                }
                self.held.push(':');
                self.expect = Expect::Value;
                Ok(Flow::More)
            }
            Expect::CommaOrClose => match (c, self.stack.last()) {
                (',', Some(Container::Object)) => {
                    self.held.push(',');
                    self.expect = Expect::KeyOrClose;
                    Ok(Flow::More)
                }
                (',', Some(Container::Array)) => {
                    self.held.push(',');
                    self.expect = Expect::ValueOrClose;
                    Ok(Flow::More)
                }
                ('}', Some(Container::Object)) => Ok(self.close(Container::Object, out)),
                (']', Some(Container::Array)) => Ok(self.close(Container::Array, out)),
                _ => Err(Malformed),
            },
        }
    }

    fn start_value(&mut self, c: char, out: &mut String) -> Result<Flow, Malformed> {
        let container = match c {
            '{' => Some(Container::Object),
            '[' => Some(Container::Array),
            _ => None,
        };
        if let Some(container) = container {
            if self.stack.len() >= MAX_DEPTH {
                return Err(Malformed);
            }
            self.flush_held(out);
            out.push(c);
            self.stack.push(container);
            self.expect = match container {
                Container::Object => Expect::KeyOrClose,
                Container::Array => Expect::ValueOrClose,
            };
            return Ok(Flow::More);
        }
        if self.is_quote(c) {
            self.flush_held(out);
            out.push('"');
            self.token = Token::Str {
                quote: c,
                key: false,
                escape: Escape::None,
            };
            return Ok(Flow::More);
        }
        if is_scalar_char(c) {
            self.token = Token::Scalar(c.to_string());
            return Ok(Flow::More);
        }
        Err(Malformed)
    }

    fn close(&mut self, container: Container, out: &mut String) -> Flow {
        // A held `,` here was a trailing comma: dropped.
        self.held.clear();
        self.stack.pop();
        out.push(closer(container));
        self.value_done()
    }

    fn value_done(&mut self) -> Flow {
        if self.stack.is_empty() {
            Flow::Done
        } else {
            self.expect = Expect::CommaOrClose;
            Flow::More
        }
    }

    fn flush_held(&mut self, out: &mut String) {
        if !self.held.is_empty() {
            out.push_str(&self.held);
            self.held.clear();
        }
    }

    fn is_quote(&self, c: char) -> bool {
        c == '"' || (self.dialect == Dialect::Python && c == '\'')
    }

    fn end_scalar(&mut self, out: &mut String) -> Result<(), Malformed> {
        let Token::Scalar(text) = std::mem::replace(&mut self.token, Token::None) else {
            return Ok(());
        };
        let canonical = canonical_scalar(self.dialect, &text)?;
        self.flush_held(out);
        out.push_str(&canonical);
        self.value_done();
        Ok(())
    }

    fn string_char(&mut self, c: char, out: &mut String) -> Result<Flow, Malformed> {
        let Token::Str { quote, key, escape } = &mut self.token else {
            return Err(Malformed);
        };
        let (quote, key) = (*quote, *key);
        let decoded: Option<char> = match escape {
            Escape::None => {
                if c == quote {
                    self.token = Token::None;
                    if key {
                        self.held.push('"');
                        self.expect = Expect::Colon;
                        return Ok(Flow::More);
                    }
                    out.push('"');
                    return Ok(self.value_done());
                }
                if c == '\\' {
                    *escape = Escape::Backslash;
                    None
                } else {
                    Some(c)
                }
            }
            Escape::Backslash => {
                *escape = Escape::None;
                match (c, self.dialect) {
                    ('"' | '\\' | '/', _) => Some(c),
                    ('b', _) => Some('\u{8}'),
                    ('f', _) => Some('\u{c}'),
                    ('n', _) => Some('\n'),
                    ('r', _) => Some('\r'),
                    ('t', _) => Some('\t'),
                    ('u', _) => {
                        *escape = Escape::Hex {
                            digits: 4,
                            code: 0,
                            high: None,
                        };
                        None
                    }
                    ('\'', Dialect::Python) => Some('\''),
                    ('x', Dialect::Python) => {
                        *escape = Escape::Hex {
                            digits: 2,
                            code: 0,
                            high: None,
                        };
                        None
                    }
                    ('U', Dialect::Python) => {
                        *escape = Escape::Hex {
                            digits: 8,
                            code: 0,
                            high: None,
                        };
                        None
                    }
                    ('v', Dialect::Python) => Some('\u{b}'),
                    ('a', Dialect::Python) => Some('\u{7}'),
                    ('0', Dialect::Python) => Some('\0'),
                    ('\n', Dialect::Python) => None,
                    (other, Dialect::Python) => {
                        // Python keeps an unknown escape as written.
                        let target = if key { &mut self.held } else { &mut *out };
                        push_escaped(target, '\\');
                        Some(other)
                    }
                    (_, Dialect::Json) => return Err(Malformed),
                }
            }
            Escape::Hex { digits, code, high } => {
                let digit = c.to_digit(16).ok_or(Malformed)?;
                *code = *code * 16 + digit;
                *digits -= 1;
                if *digits > 0 {
                    None
                } else {
                    let (code, high) = (*code, *high);
                    *escape = Escape::None;
                    match (high, code) {
                        (None, 0xD800..=0xDBFF) => {
                            *escape = Escape::LowBackslash(code);
                            None
                        }
                        (None, 0xDC00..=0xDFFF) => return Err(Malformed),
                        (None, _) => Some(char::from_u32(code).ok_or(Malformed)?),
                        (Some(high), 0xDC00..=0xDFFF) => {
                            let joined = 0x10000 + ((high - 0xD800) << 10) + (code - 0xDC00);
                            Some(char::from_u32(joined).ok_or(Malformed)?)
                        }
                        (Some(_), _) => return Err(Malformed),
                    }
                }
            }
            Escape::LowBackslash(high) => {
                if c != '\\' {
                    return Err(Malformed);
                }
                *escape = Escape::LowU(*high);
                None
            }
            Escape::LowU(high) => {
                if c != 'u' {
                    return Err(Malformed);
                }
                *escape = Escape::Hex {
                    digits: 4,
                    code: 0,
                    high: Some(*high),
                };
                None
            }
        };
        if let Some(decoded) = decoded {
            if key {
                if self.held.len() >= MAX_KEY_BYTES {
                    return Err(Malformed);
                }
                push_escaped(&mut self.held, decoded);
            } else {
                push_escaped(out, decoded);
            }
        }
        Ok(Flow::More)
    }
}

fn closer(container: Container) -> char {
    match container {
        Container::Object => '}',
        Container::Array => ']',
    }
}

fn is_scalar_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '+' | '.')
}

/// The canonical text of a complete number or literal.
fn canonical_scalar(dialect: Dialect, text: &str) -> Result<String, Malformed> {
    let literal = match (dialect, text) {
        (_, "true") | (Dialect::Python, "True") => Some("true"),
        (_, "false") | (Dialect::Python, "False") => Some("false"),
        (_, "null") | (Dialect::Python, "None") => Some("null"),
        _ => None,
    };
    if let Some(literal) = literal {
        return Ok(literal.to_owned());
    }
    let number = serde_json::Number::from_str(text).map_err(|_| Malformed)?;
    Ok(number.to_string())
}

/// Appends `c` as it appears inside a JSON string in canonical form (the
/// escapes `serde_json` writes; everything else verbatim).
pub(crate) fn push_escaped(out: &mut String, c: char) {
    match c {
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\u{8}' => out.push_str("\\b"),
        '\u{c}' => out.push_str("\\f"),
        c if (c as u32) < 0x20 => {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            let code = c as usize;
            out.push_str("\\u00");
            out.push(char::from(HEX[code >> 4]));
            out.push(char::from(HEX[code & 0xF]));
        }
        c => out.push(c),
    }
}

/// Appends `text` escaped as the inside of a JSON string, as
/// [`push_escaped`] one character at a time would: the runs between
/// characters that need an escape (quotes, backslashes, control characters,
/// all ASCII) are copied as slices.
pub(crate) fn push_escaped_str(out: &mut String, text: &str) {
    let mut rest = text;
    while let Some(at) = rest
        .bytes()
        .position(|b| b < 0x20 || b == b'"' || b == b'\\')
    {
        out.push_str(&rest[..at]);
        push_escaped(out, char::from(rest.as_bytes()[at]));
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reserialize(dialect: Dialect, text: &str) -> Result<String, Malformed> {
        let mut value = JsonValue::new(dialect);
        let mut out = String::new();
        for c in text.chars() {
            match value.push(c, &mut out)? {
                Flow::More => {}
                Flow::Done | Flow::DoneBefore => return Ok(out),
            }
        }
        value.close_truncated(&mut out);
        Ok(out)
    }

    #[test]
    fn output_is_what_serde_json_prints() {
        let cases = [
            r#"{ "a" : 1 , "b":[true, false,null], "c": {"d": "x\"y\\z"} }"#,
            r#"{"n": 1.0, "e": 1e3, "neg": -0.5, "big": 12345678901234567890}"#,
            r#"{"u": "\u00e9\ud83d\ude00 caf\u00e9 \/ \b\f\n\r\t\u0001", "raw": "é😀"}"#,
            r#"{"empty": {}, "list": [], "nested": [[[]], {"a": [{}]}]}"#,
            r#"{"z": 1, "a": 2, "m": 3}"#,
        ];
        for case in cases {
            let expected: serde_json::Value = serde_json::from_str(case).expect("fixture");
            let expected = serde_json::to_string(&expected).expect("print");
            assert_eq!(reserialize(Dialect::Json, case), Ok(expected), "{case}");
        }
    }

    #[test]
    fn python_literals_become_json() {
        assert_eq!(
            reserialize(
                Dialect::Python,
                r#"{'a': True, 'b': [None, False, 'it\'s'], "c": 1.5,}"#
            ),
            Ok(r#"{"a":true,"b":[null,false,"it's"],"c":1.5}"#.to_owned())
        );
    }

    #[test]
    fn malformed_input_is_rejected() {
        for case in [
            r#"{"a" 1}"#,
            r#"{"a": tru}"#,
            r#"{"a": "\x"}"#,
            r#"{"a": "\udc00"}"#,
            "}",
            r#"{"a":1]"#,
        ] {
            assert_eq!(reserialize(Dialect::Json, case), Err(Malformed), "{case}");
        }
    }

    /// Feeds `text` one character at a time through [`JsonValue::push`]:
    /// (output, bytes read, how it stopped), as `push_run` reports them.
    fn one_at_a_time(dialect: Dialect, text: &str) -> (String, usize, Result<Flow, Malformed>) {
        let mut value = JsonValue::new(dialect);
        let mut out = String::new();
        for (at, c) in text.char_indices() {
            match value.push(c, &mut out) {
                Ok(Flow::More) => {}
                Ok(Flow::Done) => return (out, at + c.len_utf8(), Ok(Flow::Done)),
                stop => return (out, at, stop),
            }
        }
        (out, text.len(), Ok(Flow::More))
    }

    /// Feeds `text` as runs cut at `cuts` through [`JsonValue::push_run`].
    fn in_runs(
        dialect: Dialect,
        text: &str,
        cuts: &[usize],
    ) -> (String, usize, Result<Flow, Malformed>) {
        let mut value = JsonValue::new(dialect);
        let mut out = String::new();
        let mut read = 0;
        for end in cuts.iter().copied().chain([text.len()]) {
            let (used, stop) = value.push_run(&text[read..end], &mut out);
            read += used;
            if stop != Ok(Flow::More) {
                return (out, read, stop);
            }
        }
        (out, read, Ok(Flow::More))
    }

    #[test]
    fn runs_read_exactly_as_one_character_at_a_time() {
        let long = "x".repeat(5000);
        let key = |n: usize| format!("{{\"{}\": 1}}", "k".repeat(n));
        let number = |n: usize| format!("{{\"n\": {}}}", "1".repeat(n));
        let mut cases: Vec<(Dialect, String)> = [
            r#"{ "a" : 1 , "b":[true, false,null], "c": {"d": "x\"y\\z"} }"#,
            r#"{"u": "\u00e9\ud83d\ude00 caf\u00e9 \/ \b\f\n\r\t\u0001", "raw": "é😀"}"#,
            "{\"ctl\": \"tab\there\u{1}\nline\", \"ws\":\u{b}\u{c}\r\n 1,\u{a0}\"nb\"\u{2028}: 2}",
            r#"{"empty": {}, "list": [], "nested": [[[]], {"a": [{}]}], "t": [1,],}"#,
            r#"{"e": 1e3, "neg": -0.5, "big": 12345678901234567890, "z": 0}"#,
            r#"{"city": "Paris", "unit": "celsius"} and then text"#,
            "  123 rest",
            "true,",
            "\"a top-level string\" after",
            r#"{"a" 1}"#,
            r#"{"a": "\x"}"#,
            r#"{"a": tru}"#,
            r#"{"a": "\udc00"}"#,
            r#"{"a":1]"#,
            r#"{"a": "unterminated"#,
        ]
        .iter()
        .map(|text| (Dialect::Json, (*text).to_owned()))
        .collect();
        cases.push((Dialect::Json, format!("{{\"long\": \"{long}\\n{long}\"}}")));
        // Keys and numbers at their bounds: the run stops before the bound
        // and the last characters are judged one at a time.
        for n in MAX_KEY_BYTES - 3..=MAX_KEY_BYTES + 1 {
            cases.push((Dialect::Json, key(n)));
        }
        for n in MAX_SCALAR_BYTES - 2..=MAX_SCALAR_BYTES + 1 {
            cases.push((Dialect::Json, number(n)));
        }
        for text in [
            r#"{'a': True, 'b': [None, False, 'it\'s'], "c": 1.5,}"#,
            r#"{'q': 'he said "hi" \x41\q', "d": "it's"}"#,
        ] {
            cases.push((Dialect::Python, text.to_owned()));
        }
        for (dialect, text) in &cases {
            let expected = one_at_a_time(*dialect, text);
            let label = &text[..text.len().min(60)];
            assert_eq!(in_runs(*dialect, text, &[]), expected, "whole: {label}");
            // Every cut of a short case; ~40 cuts of a long one.
            let step = (text.len() / 40).max(1);
            for cut in (0..text.len())
                .step_by(step)
                .filter(|&at| text.is_char_boundary(at))
            {
                assert_eq!(
                    in_runs(*dialect, text, &[cut]),
                    expected,
                    "cut at {cut}: {label}"
                );
            }
            let chars: Vec<usize> = text.char_indices().map(|(at, _)| at).skip(1).collect();
            assert_eq!(
                in_runs(*dialect, text, &chars),
                expected,
                "char runs: {label}"
            );
        }
    }

    #[test]
    fn a_string_is_escaped_as_its_characters_are() {
        let mut every_ascii: String = (0u8..0x80).map(char::from).collect();
        every_ascii.push_str("é😀 \u{2028} plain run \\ \" end");
        for text in ["", "plain", "\"", "a\\b", "\n\t\u{0}x", &every_ascii] {
            let mut expected = String::new();
            for c in text.chars() {
                push_escaped(&mut expected, c);
            }
            let mut got = String::new();
            push_escaped_str(&mut got, text);
            assert_eq!(got, expected, "{text:?}");
        }
    }

    #[test]
    fn truncation_closes_only_what_was_opened() {
        let cases = [
            (r#"{"a": "hel"#, r#"{"a":"hel"}"#),
            (r#"{"a": 12"#, r#"{"a":12}"#),
            (r#"{"a": tr"#, "{}"),
            (r#"{"a": 1, "b"#, r#"{"a":1}"#),
            (r#"{"a": [1, {"b": "\u00"#, r#"{"a":[1,{"b":""}]}"#),
        ];
        for (input, expected) in cases {
            assert_eq!(
                reserialize(Dialect::Json, input).as_deref(),
                Ok(expected),
                "{input}"
            );
        }
    }
}
