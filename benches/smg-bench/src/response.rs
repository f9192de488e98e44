//! Reading what the server sent back: one shape covers a non-streaming body
//! and a stream chunk of all three endpoints, borrowing strings from the
//! received bytes (no copy unless they contain escapes).
//!
//! - chat: `choices[].message.content` or `choices[].delta.content` (and
//!   `reasoning_content`), `usage`
//! - completions: `choices[].text`, `usage`
//! - generate (SGLang): top-level `text` (cumulative in streams) and
//!   `meta_info.{prompt_tokens, completion_tokens}`
//! - any: `error` (an object or a string)

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Deserialize)]
pub struct Payload<'a> {
    #[serde(borrow, default)]
    pub choices: Vec<Choice<'a>>,
    #[serde(default)]
    pub usage: Option<Usage>,
    #[serde(borrow, default)]
    pub text: Option<Cow<'a, str>>,
    #[serde(default)]
    pub meta_info: Option<Usage>,
    #[serde(default)]
    pub error: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct Choice<'a> {
    #[serde(borrow, default)]
    pub delta: Option<Message<'a>>,
    #[serde(borrow, default)]
    pub message: Option<Message<'a>>,
    #[serde(borrow, default)]
    pub text: Option<Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
pub struct Message<'a> {
    #[serde(borrow, default)]
    pub content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub reasoning_content: Option<Cow<'a, str>>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: Option<u32>,
    #[serde(default)]
    pub completion_tokens: Option<u32>,
}

impl<'a> Payload<'a> {
    pub fn parse(bytes: &'a [u8]) -> Option<Self> {
        serde_json::from_slice(bytes).ok()
    }

    /// Generated text in `choices` (not the generate endpoint's `text`).
    pub fn for_each_choice_text(&self, mut f: impl FnMut(&str)) {
        for choice in &self.choices {
            for message in [&choice.delta, &choice.message].into_iter().flatten() {
                if let Some(text) = &message.reasoning_content {
                    f(text);
                }
                if let Some(text) = &message.content {
                    f(text);
                }
            }
            if let Some(text) = &choice.text {
                f(text);
            }
        }
    }

    /// Server-reported (prompt, completion) tokens, from `usage` or `meta_info`.
    pub fn usage(&self) -> Option<Usage> {
        self.usage.or(self.meta_info)
    }
}

/// An error object's code (or type), for counting HTTP errors by cause.
pub fn error_code(body: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let error = value.get("error").unwrap_or(&value);
    let pick = |key: &str| match error.get(key) {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    pick("code").or_else(|| pick("type"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn texts(json: &str) -> Vec<String> {
        let p = Payload::parse(json.as_bytes()).unwrap();
        let mut out = Vec::new();
        p.for_each_choice_text(|t| out.push(t.to_string()));
        out
    }

    #[test]
    fn every_endpoint_shape_is_read() {
        assert_eq!(
            texts(r#"{"choices":[{"delta":{"role":"assistant"}}]}"#),
            Vec::<String>::new()
        );
        assert_eq!(
            texts(r#"{"choices":[{"delta":{"content":"a\nb"}}]}"#),
            vec!["a\nb"]
        );
        assert_eq!(
            texts(r#"{"choices":[{"message":{"content":"x","reasoning_content":"r"}}]}"#),
            vec!["r", "x"]
        );
        assert_eq!(
            texts(r#"{"choices":[{"text":"t","logprobs":null}]}"#),
            vec!["t"]
        );
        let g = Payload::parse(
            br#"{"text":"abc","meta_info":{"prompt_tokens":3,"completion_tokens":2}}"#,
        )
        .unwrap();
        assert_eq!(g.text.as_deref(), Some("abc"));
        assert_eq!(g.usage().unwrap().completion_tokens, Some(2));
        let u = Payload::parse(br#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}"#)
            .unwrap();
        assert_eq!(u.usage().unwrap().prompt_tokens, Some(5));
        assert!(Payload::parse(b"{not json").is_none());
    }

    #[test]
    fn error_codes_come_from_the_error_object() {
        assert_eq!(
            error_code(br#"{"error":{"message":"m","type":"t","code":"overloaded"}}"#).as_deref(),
            Some("overloaded")
        );
        assert_eq!(
            error_code(br#"{"error":{"type":"server_error","code":null}}"#).as_deref(),
            Some("server_error")
        );
        assert_eq!(error_code(br#"{"code":503}"#).as_deref(), Some("503"));
        assert_eq!(error_code(b"<html>"), None);
    }
}
