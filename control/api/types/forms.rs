//! JSON shapes that several dialects share.
//!
//! OpenAI, SGLang and Anthropic all accept "a string or a list" somewhere
//! (message content, stop sequences, system prompts, image data), OpenAI's
//! completions and embeddings take a prompt in four forms, and every response
//! carries constant tags (`"object": "list"`, `"type": "message"`).
//!
//! The string-or-list types are parsed by hand-written visitors rather than
//! `#[serde(untagged)]`: untagged enums fail with "data did not match any
//! variant", losing what and where the problem is. Elements and
//! internally-tagged values (`{"type": "image_url", ...}`) are read through
//! [`Buffered`], so an error inside one is reported at that element's own
//! path (`messages[0].content[1]`, see [`super::parse`]).

pub use crate::pipeline::spec::InputItem;
use std::fmt;
use std::marker::PhantomData;

use serde::Serialize;
use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{self, Deserialize, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// Declares a unit type that serializes as one constant string and accepts
/// only that string: OpenAI's `object` values, Anthropic's `type`/`role`.
/// A response built with it cannot carry the wrong tag.
macro_rules! literal_tag {
    ($(#[$doc:meta])* $name:ident = $value:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $name;

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str($value)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = <String as serde::Deserialize>::deserialize(deserializer)?;
                if text == $value {
                    Ok($name)
                } else {
                    Err(serde::de::Error::invalid_value(
                        serde::de::Unexpected::Str(&text),
                        &$value,
                    ))
                }
            }
        }
    };
}
pub(crate) use literal_tag;

literal_tag!(
    /// `"list"`: the `object` of OpenAI list responses (models, embeddings,
    /// classifications).
    ListObject = "list"
);

/// A string, or a list of `T`: `"content": "hi"` or `"content": [{...}]`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum TextOrList<T> {
    Text(String),
    List(Vec<T>),
}

/// A string or a list of strings (`"stop": "\n"` or `"stop": ["\n", "END"]`).
pub type StringOrList = TextOrList<String>;

impl StringOrList {
    /// The strings, whichever form was sent.
    pub fn as_slice(&self) -> &[String] {
        match self {
            TextOrList::Text(text) => std::slice::from_ref(text),
            TextOrList::List(items) => items,
        }
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for TextOrList<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextOrListVisitor<T>(PhantomData<T>);

        impl<'de, T: DeserializeOwned> Visitor<'de> for TextOrListVisitor<T> {
            type Value = TextOrList<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or a list")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
                Ok(TextOrList::Text(text.to_owned()))
            }

            fn visit_string<E: de::Error>(self, text: String) -> Result<Self::Value, E> {
                Ok(TextOrList::Text(text))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::new();
                while let Some(Buffered(item)) = seq.next_element()? {
                    items.push(item);
                }
                Ok(TextOrList::List(items))
            }
        }

        deserializer.deserialize_any(TextOrListVisitor(PhantomData))
    }
}

/// A `T` read in one step from one whole JSON value.
///
/// serde_json records where an error happened when one of its own parse
/// calls returns it. Internally tagged enums (`{"type": ...}`) first buffer
/// their object and fail only afterwards, outside that call, so serde_json
/// would place the error at the end of whatever encloses the value.
/// `Buffered` collects the value into a [`Value`] and builds `T` from it
/// *inside* the value's own parse call, so the error lands on the value.
/// `Value` sorts object keys: never buffer what must keep its key order
/// (schemas are [`JsonText`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Buffered<T>(pub T);

impl<'de, T: DeserializeOwned> Deserialize<'de> for Buffered<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct BufferedVisitor<T>(PhantomData<T>);

        impl<T: DeserializeOwned> BufferedVisitor<T> {
            fn build<E: de::Error>(value: Value) -> Result<Buffered<T>, E> {
                T::deserialize(value).map(Buffered).map_err(E::custom)
            }
        }

        impl<'de, T: DeserializeOwned> Visitor<'de> for BufferedVisitor<T> {
            type Value = Buffered<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }

            fn visit_bool<E: de::Error>(self, value: bool) -> Result<Self::Value, E> {
                Self::build(Value::from(value))
            }

            fn visit_i64<E: de::Error>(self, value: i64) -> Result<Self::Value, E> {
                Self::build(Value::from(value))
            }

            fn visit_u64<E: de::Error>(self, value: u64) -> Result<Self::Value, E> {
                Self::build(Value::from(value))
            }

            fn visit_f64<E: de::Error>(self, value: f64) -> Result<Self::Value, E> {
                Self::build(Value::from(value))
            }

            fn visit_str<E: de::Error>(self, value: &str) -> Result<Self::Value, E> {
                Self::build(Value::from(value))
            }

            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Self::build(Value::Null)
            }

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                Self::build(Value::deserialize(SeqAccessDeserializer::new(seq))?)
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                Self::build(Value::deserialize(MapAccessDeserializer::new(map))?)
            }
        }

        deserializer.deserialize_any(BufferedVisitor(PhantomData))
    }
}

/// For `#[serde(default, deserialize_with = "buffered_option")]` on an
/// optional internally tagged field: [`Buffered`] for `Option<T>`.
pub(crate) fn buffered_option<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    Option::<Buffered<T>>::deserialize(deserializer).map(|value| value.map(|Buffered(inner)| inner))
}

/// A JSON value kept as compact JSON text, with object keys in the order
/// the client wrote them.
///
/// `serde_json::Value` sorts object keys here (serde_json's
/// `preserve_order` is not enabled), and order matters for a JSON schema
/// handed to constrained decoding: the engine emits properties in schema
/// order. So schemas are re-encoded as they stream in, never through
/// `Value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonText(String);

impl JsonText {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Serialize for JsonText {
    /// Written as the JSON value it holds (through `Value`, so keys come out
    /// sorted; only requests built by clients and tests serialize this).
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serde_json::from_str::<Value>(&self.0)
            .map_err(serde::ser::Error::custom)?
            .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for JsonText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct JsonTextVisitor;

        /// `text` as a JSON string literal.
        fn quoted<E: de::Error>(text: &str) -> Result<String, E> {
            serde_json::to_string(text).map_err(E::custom)
        }

        impl<'de> Visitor<'de> for JsonTextVisitor {
            type Value = JsonText;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }

            fn visit_bool<E: de::Error>(self, value: bool) -> Result<Self::Value, E> {
                Ok(JsonText(value.to_string()))
            }

            fn visit_i64<E: de::Error>(self, value: i64) -> Result<Self::Value, E> {
                Ok(JsonText(value.to_string()))
            }

            fn visit_u64<E: de::Error>(self, value: u64) -> Result<Self::Value, E> {
                Ok(JsonText(value.to_string()))
            }

            fn visit_f64<E: de::Error>(self, value: f64) -> Result<Self::Value, E> {
                Ok(JsonText(Value::from(value).to_string()))
            }

            fn visit_str<E: de::Error>(self, value: &str) -> Result<Self::Value, E> {
                quoted(value).map(JsonText)
            }

            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(JsonText("null".to_owned()))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut text = String::from("[");
                while let Some(JsonText(element)) = seq.next_element()? {
                    if text.len() > 1 {
                        text.push(',');
                    }
                    text.push_str(&element);
                }
                text.push(']');
                Ok(JsonText(text))
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut text = String::from("{");
                while let Some((key, JsonText(value))) = map.next_entry::<String, JsonText>()? {
                    if text.len() > 1 {
                        text.push(',');
                    }
                    text.push_str(&quoted::<A::Error>(&key)?);
                    text.push(':');
                    text.push_str(&value);
                }
                text.push('}');
                Ok(JsonText(text))
            }
        }

        deserializer.deserialize_any(JsonTextVisitor)
    }
}

/// A prompt or input as OpenAI's completions and embeddings take it: a
/// string, a list of strings, a list of token ids, or a list of token-id
/// lists. `[]` parses as an empty [`PromptInput::TextBatch`]; validation
/// rejects empty inputs with the endpoint's parameter name.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    TextBatch(Vec<String>),
    TokenIds(Vec<u32>),
    TokenIdBatch(Vec<Vec<u32>>),
}

impl PromptInput {
    /// The prompts, one item each (a batch gives several).
    pub fn to_items(&self) -> Vec<InputItem> {
        match self {
            PromptInput::Text(text) => vec![InputItem::Text(text.clone())],
            PromptInput::TextBatch(texts) => texts.iter().cloned().map(InputItem::Text).collect(),
            PromptInput::TokenIds(ids) => vec![InputItem::TokenIds(ids.clone())],
            PromptInput::TokenIdBatch(batch) => {
                batch.iter().cloned().map(InputItem::TokenIds).collect()
            }
        }
    }
}

/// One element of a prompt list, before the list's form is known.
enum PromptElement {
    Text(String),
    TokenId(u32),
    TokenIds(Vec<u32>),
}

impl<'de> Deserialize<'de> for PromptElement {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PromptElementVisitor;

        impl<'de> Visitor<'de> for PromptElementVisitor {
            type Value = PromptElement;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, a token id or a list of token ids")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
                Ok(PromptElement::Text(text.to_owned()))
            }

            fn visit_u64<E: de::Error>(self, id: u64) -> Result<Self::Value, E> {
                u32::try_from(id)
                    .map(PromptElement::TokenId)
                    .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(id), &"a u32 token id"))
            }

            fn visit_i64<E: de::Error>(self, id: i64) -> Result<Self::Value, E> {
                u32::try_from(id)
                    .map(PromptElement::TokenId)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(id), &"a u32 token id"))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut ids = Vec::new();
                while let Some(id) = seq.next_element::<u32>()? {
                    ids.push(id);
                }
                Ok(PromptElement::TokenIds(ids))
            }
        }

        deserializer.deserialize_any(PromptElementVisitor)
    }
}

impl<'de> Deserialize<'de> for PromptInput {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PromptInputVisitor;

        impl<'de> Visitor<'de> for PromptInputVisitor {
            type Value = PromptInput;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a string, a list of strings, a list of token ids or a list of token-id lists",
                )
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
                Ok(PromptInput::Text(text.to_owned()))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mixed = || {
                    de::Error::custom(
                        "mixes strings, token ids and token-id lists; use one form per request",
                    )
                };
                let Some(first) = seq.next_element::<PromptElement>()? else {
                    return Ok(PromptInput::TextBatch(Vec::new()));
                };
                let mut input = match first {
                    PromptElement::Text(text) => PromptInput::TextBatch(vec![text]),
                    PromptElement::TokenId(id) => PromptInput::TokenIds(vec![id]),
                    PromptElement::TokenIds(ids) => PromptInput::TokenIdBatch(vec![ids]),
                };
                while let Some(element) = seq.next_element::<PromptElement>()? {
                    match (&mut input, element) {
                        (PromptInput::TextBatch(texts), PromptElement::Text(text)) => {
                            texts.push(text)
                        }
                        (PromptInput::TokenIds(ids), PromptElement::TokenId(id)) => ids.push(id),
                        (PromptInput::TokenIdBatch(batch), PromptElement::TokenIds(ids)) => {
                            batch.push(ids)
                        }
                        _ => return Err(mixed()),
                    }
                }
                Ok(input)
            }
        }

        deserializer.deserialize_any(PromptInputVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The macro declares a `pub` type, as the API's tags are.
    #[allow(unreachable_pub)]
    mod tag {
        literal_tag!(
            /// A tag for the tests.
            ExampleTag = "example"
        );
    }
    use tag::ExampleTag;

    #[test]
    fn prompt_input_parses_all_four_forms() {
        let cases = [
            (r#""hello""#, PromptInput::Text("hello".into())),
            (
                r#"["a", "b"]"#,
                PromptInput::TextBatch(vec!["a".into(), "b".into()]),
            ),
            ("[1, 2, 3]", PromptInput::TokenIds(vec![1, 2, 3])),
            (
                "[[1, 2], [3]]",
                PromptInput::TokenIdBatch(vec![vec![1, 2], vec![3]]),
            ),
            ("[]", PromptInput::TextBatch(Vec::new())),
        ];
        for (json, expected) in cases {
            let parsed: PromptInput = serde_json::from_str(json).expect(json);
            assert_eq!(parsed, expected, "{json}");
        }
    }

    #[test]
    fn prompt_input_rejects_mixed_and_out_of_range_elements() {
        for json in [r#"["a", 1]"#, "[1, [2]]", "[-1]", "[4294967296]", "[1.5]"] {
            let err = serde_json::from_str::<PromptInput>(json).expect_err(json);
            assert!(err.is_data(), "{json}: {err}");
        }
        let err = serde_json::from_str::<PromptInput>(r#"["a", 1]"#).expect_err("mixed");
        assert!(err.to_string().contains("mixes strings"), "{err}");
    }

    #[test]
    fn prompt_input_items_flatten_batches() {
        let batch = PromptInput::TokenIdBatch(vec![vec![1], vec![2, 3]]);
        assert_eq!(
            batch.to_items(),
            vec![
                InputItem::TokenIds(vec![1]),
                InputItem::TokenIds(vec![2, 3])
            ]
        );
        assert!(InputItem::Text(String::new()).is_empty());
        assert!(!InputItem::TokenIds(vec![0]).is_empty());
    }

    #[test]
    fn string_or_list_accepts_both_forms_and_round_trips() {
        let one: StringOrList = serde_json::from_str(r#""\n""#).expect("string form");
        assert_eq!(one.as_slice(), ["\n".to_string()]);
        let many: StringOrList = serde_json::from_str(r#"["a", "b"]"#).expect("list form");
        assert_eq!(many.as_slice(), ["a".to_string(), "b".to_string()]);
        assert_eq!(
            serde_json::to_string(&many).expect("serialize"),
            r#"["a","b"]"#
        );
        assert_eq!(serde_json::to_string(&one).expect("serialize"), r#""\n""#);
        assert!(serde_json::from_str::<StringOrList>("3").is_err());
    }

    #[test]
    fn literal_tags_serialize_and_check_their_value() {
        assert_eq!(
            serde_json::to_string(&ExampleTag).expect("serialize"),
            r#""example""#
        );
        assert_eq!(
            serde_json::from_str::<ExampleTag>(r#""example""#).expect("the tag"),
            ExampleTag
        );
        let err = serde_json::from_str::<ExampleTag>(r#""other""#).expect_err("wrong tag");
        assert!(err.to_string().contains("expected example"), "{err}");
    }

    #[test]
    fn json_text_keeps_key_order_and_escapes() {
        let body = r#"{"type": "object", "properties": {"name": {"type": "string"},
            "age": {"type": "integer", "minimum": 0.5, "maximum": -3}},
            "required": ["name", "age"], "x\"y": null, "ok": true}"#;
        let text: JsonText = serde_json::from_str(body).expect("any JSON");
        assert_eq!(
            text.as_str(),
            r#"{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0.5,"maximum":-3}},"required":["name","age"],"x\"y":null,"ok":true}"#
        );
        let reparsed: Value = serde_json::from_str(text.as_str()).expect("valid JSON text");
        let original: Value = serde_json::from_str(body).expect("valid JSON");
        assert_eq!(reparsed, original);
        assert_eq!(serde_json::to_value(&text).expect("serialize"), original);
    }
}
