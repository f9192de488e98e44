//! Request bodies to request types, with errors a client can act on.
//!
//! Two different mistakes must read differently: a body that is not JSON
//! (`invalid_json`, with line and column) and JSON of the wrong shape
//! (`invalid_request`, naming the field, e.g. `messages[1].role`). serde_json
//! reports where a shape error happened as a line and column but not which
//! field that is, so on that (rare) path [`parse_json`] rescans the body and
//! finds the innermost value around the reported position: its path is the
//! field at fault. The good path is one `serde_json::from_slice`.

use serde::de::{DeserializeOwned, IgnoredAny};
use serde_json::error::Category;

use crate::error::{EXCERPT_CHARS, Error, ErrorCode, Result, bounded, excerpt};

/// Parses a request body.
///
/// - not JSON (or cut short) → `invalid_json`, message with line and column;
/// - JSON of the wrong shape → `invalid_request`, with `param` set to the
///   path of the offending field when there is one (a missing field's path
///   ends with its name).
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T> {
    let err = match serde_json::from_slice(body) {
        Ok(value) => return Ok(value),
        Err(err) => err,
    };
    match err.classify() {
        Category::Syntax | Category::Eof | Category::Io => Err(invalid_json(&err)),
        Category::Data => {
            // A shape error can come before a syntax error further on; the
            // body is only "the wrong shape" if it is JSON at all.
            if let Err(syntax) = serde_json::from_slice::<IgnoredAny>(body) {
                return Err(invalid_json(&syntax));
            }
            Err(shape_error(body, &err))
        }
    }
}

/// Parses the JSON text of one field of a request (kept raw until now),
/// reporting shape errors as [`parse_json`] would have for the whole body:
/// `param` and the message name the path from the body's root
/// (`tools[1].function.name`).
pub fn parse_json_field<T: DeserializeOwned>(field: &str, text: &str) -> Result<T> {
    parse_json(text.as_bytes()).map_err(|mut err| {
        let inner = err.param.take();
        let reason = match &inner {
            Some(inner) => err
                .message
                .strip_prefix(inner.as_str())
                .and_then(|rest| rest.strip_prefix(": "))
                .unwrap_or(&err.message),
            None => &err.message,
        };
        let path = match inner.as_deref() {
            None | Some("") => field.to_owned(),
            Some(inner) if inner.starts_with('[') => format!("{field}{inner}"),
            Some(inner) => format!("{field}.{inner}"),
        };
        err.message = format!("{path}: {reason}");
        err.param = Some(path);
        err
    })
}

fn invalid_json(err: &serde_json::Error) -> Error {
    Error::new(
        ErrorCode::InvalidJson,
        format!("request body is not valid JSON: {err}"),
    )
}

fn shape_error(body: &[u8], err: &serde_json::Error) -> Error {
    let full = err.to_string();
    let serde_reason = full
        .strip_suffix(&format!(" at line {} column {}", err.line(), err.column()))
        .unwrap_or(&full);
    let reason = &excerpt_quotes(serde_reason);
    let mut path = if err.line() == 0 {
        String::new()
    } else {
        let last_read = byte_offset(body, err.line(), err.column()).checked_sub(1);
        last_read.map_or_else(String::new, |offset| path_at(body, offset))
    };
    if let Some(field) = named_field(reason) {
        push_key(&mut path, field);
    }
    if path.is_empty() {
        Error::invalid_request(reason)
    } else {
        Error::invalid_request(format!("{path}: {reason}")).with_param(path)
    }
}

/// serde's reason with every value it quotes cut to an [`excerpt`]: serde
/// writes client input into its messages whole (``unknown variant `…` ``,
/// `invalid type: string "…"`). Every run between two quote characters
/// (backticks or double quotes) is excerpted, serde's own words included
/// (they are short and pass unchanged), so a quote inside the client's
/// value cannot make the rest of it pass as serde's text; a value of many
/// quotes makes many short runs, so the whole is cut at four excerpts'
/// length.
fn excerpt_quotes(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len().min(1024));
    for piece in reason.split_inclusive(['`', '"']) {
        let (run, quote) = match piece.strip_suffix(['`', '"']) {
            Some(run) => (run, &piece[run.len()..]),
            None => (piece, ""),
        };
        out.push_str(&excerpt(run).to_string());
        out.push_str(quote);
    }
    bounded(&out, 4 * EXCERPT_CHARS)
}

/// The field named by serde's "missing field `x`" / "duplicate field `x`":
/// the error is reported at the enclosing object, the field is in the text.
fn named_field(reason: &str) -> Option<&str> {
    let rest = reason
        .strip_prefix("missing field `")
        .or_else(|| reason.strip_prefix("duplicate field `"))?;
    rest.split('`').next()
}

/// The byte offset serde_json means by (line, column): lines count from 1,
/// the column counts the bytes read on that line, so the offset is that of
/// the next unread byte.
fn byte_offset(body: &[u8], line: usize, column: usize) -> usize {
    let line_start = if line <= 1 {
        0
    } else {
        body.iter()
            .enumerate()
            .filter(|&(_, &byte)| byte == b'\n')
            .nth(line - 2)
            .map_or(body.len(), |(newline, _)| newline + 1)
    };
    (line_start + column).min(body.len())
}

fn push_key(path: &mut String, key: &str) {
    if !path.is_empty() {
        path.push('.');
    }
    path.push_str(key);
}

/// The path (`messages[1].content[0].text`) of the innermost value of
/// `body` that contains byte `offset`; empty for the whole document.
///
/// The walk keeps its own stack instead of recursing: serde_json bounds the
/// nesting of the values it builds, but it skips unknown fields without any
/// bound, so a small body can nest far deeper than a thread's stack allows.
fn path_at(body: &[u8], offset: usize) -> String {
    let found = Scanner { body, pos: 0 }.find(offset).unwrap_or_default();
    let mut path = String::new();
    for segment in found {
        match segment {
            Segment::Key(key) => push_key(&mut path, &excerpt(&key).to_string()),
            Segment::Index(index) => path.push_str(&format!("[{index}]")),
        }
    }
    path
}

#[derive(Debug, Clone, PartialEq)]
enum Segment {
    Key(String),
    Index(usize),
}

/// An object or array the walk is inside of.
struct Open {
    /// Where its opening bracket is.
    start: usize,
    /// `None` for an object, the next element's index for an array.
    next_index: Option<usize>,
    /// How its parent names it (`None` for the whole document).
    segment: Option<Segment>,
}

/// A minimal walker over well-formed JSON that tracks the path to each
/// value it passes.
struct Scanner<'a> {
    body: &'a [u8],
    pos: usize,
}

impl Scanner<'_> {
    fn peek(&self) -> Option<u8> {
        self.body.get(self.pos).copied()
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    /// Walks the document; returns the path of the innermost value that
    /// contains `offset`. Values are checked as they end, children before
    /// their parents, so the first match is the innermost.
    fn find(&mut self, offset: usize) -> Option<Vec<Segment>> {
        let mut open: Vec<Open> = Vec::new();
        // The segment of the value about to be read; `Some` once the walk is
        // positioned at a value (the document itself is `None`).
        let mut pending: Option<Option<Segment>> = Some(None);
        let path_of = |open: &[Open], last: Option<Segment>| -> Vec<Segment> {
            open.iter()
                .filter_map(|frame| frame.segment.clone())
                .chain(last)
                .collect()
        };
        loop {
            self.skip_whitespace();
            if let Some(segment) = pending.take() {
                let start = self.pos;
                match self.peek() {
                    Some(b'{') | Some(b'[') => {
                        let is_array = self.peek() == Some(b'[');
                        self.pos += 1;
                        open.push(Open {
                            start,
                            next_index: is_array.then_some(0),
                            segment,
                        });
                        continue;
                    }
                    Some(b'"') => {
                        self.string();
                    }
                    Some(_) => {
                        // A number, true, false or null.
                        while !matches!(
                            self.peek(),
                            None | Some(b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r')
                        ) {
                            self.pos += 1;
                        }
                    }
                    None => return None,
                }
                if (start..self.pos).contains(&offset) {
                    return Some(path_of(&open, segment));
                }
                if open.is_empty() {
                    return None;
                }
                continue;
            }
            let frame = open.last_mut()?;
            match (self.peek(), frame.next_index.as_mut()) {
                (Some(b','), _) => {
                    self.pos += 1;
                    continue;
                }
                (Some(b'"'), None) => {
                    let key = self.string();
                    self.skip_whitespace();
                    if self.peek() == Some(b':') {
                        self.pos += 1;
                    }
                    pending = Some(Some(Segment::Key(key)));
                    continue;
                }
                (Some(byte), Some(index)) if byte != b']' => {
                    pending = Some(Some(Segment::Index(*index)));
                    *index += 1;
                    continue;
                }
                _ => {}
            }
            // The closing bracket (or the end of a cut-short body).
            self.pos += 1;
            let frame = open.pop()?;
            if (frame.start..self.pos).contains(&offset) {
                return Some(path_of(&open, frame.segment));
            }
            if open.is_empty() {
                return None;
            }
        }
    }

    /// Reads the string at `pos` (which is its opening quote) and returns it
    /// unescaped.
    fn string(&mut self) -> String {
        let start = self.pos;
        self.pos += 1;
        while let Some(byte) = self.peek() {
            self.pos += 1;
            match byte {
                b'\\' => self.pos += 1,
                b'"' => break,
                _ => {}
            }
        }
        let raw = &self.body[start..self.pos.min(self.body.len())];
        serde_json::from_slice(raw)
            .unwrap_or_else(|_| String::from_utf8_lossy(raw).trim_matches('"').to_owned())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::types::anthropic::MessagesRequest;
    use crate::api::types::embeddings::EmbeddingRequest;
    use crate::api::types::openai::{ChatCompletionRequest, CompletionRequest};
    use crate::api::types::sglang::GenerateRequest;

    fn assert_shape_error<T: DeserializeOwned + std::fmt::Debug>(
        body: &str,
        param: Option<&str>,
        reason_contains: &str,
    ) {
        let err = parse_json::<T>(body.as_bytes()).expect_err(body);
        assert_eq!(err.code, ErrorCode::InvalidRequest, "{body}: {err}");
        assert_eq!(err.param.as_deref(), param, "{body}: {err}");
        assert!(
            err.message.contains(reason_contains),
            "{body}: {:?} lacks {reason_contains:?}",
            err.message
        );
    }

    #[test]
    fn malformed_json_is_invalid_json_with_its_position() {
        let cases = [
            ("{\"model\": \"m\",\n \"messages\": [}", "line 2 column 15"),
            ("", "line 1 column 0"),
            ("{\"model\": \"m\"", "EOF"),
            ("{\"model\": 'm'}", "line 1 column 11"),
            ("{\"model\": \"m\"} trailing", "trailing characters"),
        ];
        for (body, expected) in cases {
            let err = parse_json::<ChatCompletionRequest>(body.as_bytes()).expect_err(body);
            assert_eq!(err.code, ErrorCode::InvalidJson, "{body}: {err}");
            assert_eq!(err.param, None);
            assert!(err.message.contains(expected), "{body}: {}", err.message);
        }
    }

    #[test]
    fn client_values_in_serde_reasons_and_paths_are_excerpts() {
        let long = "r".repeat(100_000);
        let ticks = format!("`{}`", "`x".repeat(50_000));
        for value in [&long, &ticks] {
            for body in [
                // Quoted by serde in backticks, in double quotes (Debug),
                // and a map key on the path to a wrong value.
                json!({"model": "m", "messages": [{"role": value, "content": "hi"}]}),
                json!({"model": "m", "messages": [], "temperature": value}),
                json!({"model": "m", "messages": [], "logit_bias": {value: "x"}}),
            ] {
                let body = body.to_string();
                let err = parse_json::<ChatCompletionRequest>(body.as_bytes()).expect_err("bad");
                assert_eq!(err.code, ErrorCode::InvalidRequest, "{err}");
                let message = err.client_message(None);
                assert!(message.chars().count() < 600, "{message}");
                assert!(message.contains("… ("), "{message}");
                let param = err.param.unwrap_or_default();
                assert!(param.chars().count() < 300, "{param}");
            }
        }
        // Short values read as serde wrote them.
        assert_eq!(
            excerpt_quotes("unknown variant `robot`, expected one of `user`, `system`"),
            "unknown variant `robot`, expected one of `user`, `system`"
        );
        assert_eq!(
            excerpt_quotes(r#"invalid type: string "say \"hi\"", expected f32"#),
            r#"invalid type: string "say \"hi\"", expected f32"#
        );
    }

    #[test]
    fn wrong_shape_before_a_syntax_error_is_still_invalid_json() {
        // The type error at `temperature` comes first, but the body is not
        // JSON at all.
        let body = r#"{"model": "m", "messages": [], "temperature": "hot", }"#;
        let err = parse_json::<ChatCompletionRequest>(body.as_bytes()).expect_err("bad");
        assert_eq!(err.code, ErrorCode::InvalidJson, "{err}");
    }

    #[test]
    fn wrong_shapes_name_the_field_path() {
        assert_shape_error::<ChatCompletionRequest>(
            r#"{"messages": [{"role": "user", "content": "hi"}]}"#,
            Some("model"),
            "missing field `model`",
        );
        assert_shape_error::<ChatCompletionRequest>(
            r#"{"model": "m", "messages": [{"content": "hi"}]}"#,
            Some("messages[0].role"),
            "missing field `role`",
        );
        assert_shape_error::<ChatCompletionRequest>(
            r#"{"model": "m", "messages": [
                {"role": "user", "content": "hi"},
                {"role": "robot", "content": "beep"}
            ]}"#,
            Some("messages[1].role"),
            "unknown variant `robot`",
        );
        assert_shape_error::<ChatCompletionRequest>(
            r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}],
                "temperature": "hot"}"#,
            Some("temperature"),
            "invalid type: string \"hot\"",
        );
        assert_shape_error::<ChatCompletionRequest>(
            r#"{"model": "m", "messages": [{"role": "user", "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": 42}}
            ]}]}"#,
            Some("messages[0].content[1]"),
            "invalid type: integer `42`",
        );
        assert_shape_error::<ChatCompletionRequest>(
            r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": -5}"#,
            Some("max_tokens"),
            "invalid value: integer `-5`",
        );
        assert_shape_error::<ChatCompletionRequest>(
            r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}],
                "stop": ["a", 3]}"#,
            Some("stop[1]"),
            "invalid type: integer `3`",
        );
        assert_shape_error::<CompletionRequest>(
            r#"{"model": "m", "prompt": [1, 2, -3]}"#,
            Some("prompt[2]"),
            "integer `-3`",
        );
        assert_shape_error::<CompletionRequest>(
            r#"{"model": "m", "prompt": ["a", 2]}"#,
            Some("prompt"),
            "mixes strings",
        );
        assert_shape_error::<GenerateRequest>(
            r#"{"text": "a", "sampling_params": {"max_new_tokens": "many"}}"#,
            Some("sampling_params.max_new_tokens"),
            "invalid type: string \"many\"",
        );
        assert_shape_error::<MessagesRequest>(
            r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#,
            Some("max_tokens"),
            "missing field `max_tokens`",
        );
        assert_shape_error::<MessagesRequest>(
            r#"{"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}"#,
            Some("messages[0].role"),
            "unknown variant `system`",
        );
        assert_shape_error::<EmbeddingRequest>(
            r#"{"model": "m", "input": {"text": "a"}}"#,
            Some("input"),
            "invalid type: map",
        );
        assert_shape_error::<ChatCompletionRequest>(
            r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}],
                "response_format": {"type": "json_schema"}, "n": 1}"#,
            Some("response_format.json_schema"),
            "missing field `json_schema`",
        );
        assert_shape_error::<ChatCompletionRequest>(
            r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}],
                "tool_choice": {"type": "function", "function": {}}}"#,
            Some("tool_choice.function.name"),
            "missing field `name`",
        );
        assert_shape_error::<MessagesRequest>(
            r#"{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
                {"type": "text", "text": "see"},
                {"type": "image", "source": {"type": "file", "path": "/etc/passwd"}},
                {"type": "text", "text": "?"}
            ]}]}"#,
            Some("messages[0].content[1]"),
            "unknown variant `file`",
        );
        assert_shape_error::<ChatCompletionRequest>("42", None, "invalid type: integer `42`");
    }

    #[test]
    fn escaped_and_unicode_keys_are_reported_unescaped() {
        let body = "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"h\u{e9}\"}],\
                    \"logit_bias\": {\"1\": 1, \"caf\\u00e9\": \"x\"}}";
        assert_shape_error::<ChatCompletionRequest>(
            body,
            Some("logit_bias.caf\u{e9}"),
            "invalid type: string \"x\"",
        );
    }

    #[test]
    fn well_formed_bodies_parse() {
        let request: ChatCompletionRequest = parse_json(
            br#"{"model": "m", "messages": [{"role": "user", "content": "hi"}], "unknown": 1}"#,
        )
        .expect("unknown fields are ignored");
        assert_eq!(request.model, "m");
    }

    #[test]
    fn deeply_nested_skipped_fields_do_not_exhaust_the_stack() {
        // serde_json skips unknown fields without a depth limit, so the
        // shape error after them sends the path finder through 200,000
        // levels of nesting (this crashed the process when it recursed).
        let depth = 200_000;
        let mut body = String::from(r#"{"model": "m", "x": "#);
        body.push_str(&"[".repeat(depth));
        body.push_str(&"]".repeat(depth));
        body.push_str(r#", "messages": [{"role": "user", "content": "hi"}], "n": "two"}"#);
        assert_shape_error::<ChatCompletionRequest>(&body, Some("n"), "invalid type: string");

        let mut objects = String::from(r#"{"model": "m", "messages": [], "extra": "#);
        objects.push_str(&r#"{"a": "#.repeat(depth));
        objects.push('1');
        objects.push_str(&"}".repeat(depth));
        objects.push_str(r#", "max_tokens": -1}"#);
        assert_shape_error::<ChatCompletionRequest>(&objects, Some("max_tokens"), "integer `-1`");
    }

    #[test]
    fn a_shape_error_inside_deep_nesting_names_its_full_path() {
        let depth = 50_000;
        let mut body = String::from(r#"{"model": "m", "messages": [], "logit_bias": {"1": "#);
        body.push_str(&"[".repeat(depth));
        body.push_str(&"]".repeat(depth));
        body.push_str("}}");
        let err = parse_json::<ChatCompletionRequest>(body.as_bytes()).expect_err("nested");
        assert_eq!(err.code, ErrorCode::InvalidRequest, "{err}");
        assert!(
            err.param
                .as_deref()
                .is_some_and(|p| p.starts_with("logit_bias")),
            "{err:?}"
        );
    }

    #[test]
    fn byte_offsets_follow_serde_json_positions() {
        let body = b"ab\ncde\nf";
        assert_eq!(byte_offset(body, 1, 2), 2);
        assert_eq!(byte_offset(body, 2, 0), 3);
        assert_eq!(byte_offset(body, 2, 3), 6);
        assert_eq!(byte_offset(body, 3, 1), 8);
    }

    #[test]
    fn paths_are_found_for_any_offset() {
        let body = br#"{"a": [10, {"b": "xy"}], "c": null}"#;
        let cases = [
            (0, ""),
            (7, "a[0]"),
            (12, "a[1]"),
            (18, "a[1].b"),
            (20, "a[1].b"),
            (21, "a[1]"),
            (22, "a"),
            (31, "c"),
        ];
        for (offset, expected) in cases {
            assert_eq!(path_at(body, offset), expected, "offset {offset}");
        }
    }
}
