//! The split-invariance harness every tool-parser fixture runs through.
//!
//! A fixture is a model output, the tools of the request, and the content and
//! calls a whole-response parse must give (written by hand). The harness then
//! streams the same text in every chunking we can think of (every two-chunk
//! split, char by char, 2–3 chars, "strategic" breaks after JSON punctuation,
//! a real BPE tokenizer's tokens, whole) and checks each gives exactly the
//! same content and calls, with the streaming invariants of `ToolDelta`.

#![allow(dead_code)]

use std::sync::{Arc, OnceLock};

use serde_json::Value;
use smg_parsers::tool::{
    Collector, ParsedTools, ToolParser, ToolSpec, Tools, create, parse_complete,
};

/// One hand-written case.
pub struct Fixture {
    pub name: &'static str,
    pub text: &'static str,
    pub content: &'static str,
    /// (name, arguments as JSON text).
    pub calls: &'static [(&'static str, &'static str)],
}

/// Tools with a JSON schema per tool: `(name, schema)`.
pub fn tools(specs: &[(&str, &str)]) -> Tools {
    specs
        .iter()
        .map(|(name, schema)| ToolSpec {
            name: (*name).to_owned(),
            parameters: if schema.is_empty() {
                None
            } else {
                Some(serde_json::from_str(schema).expect("schema fixture"))
            },
        })
        .collect::<Vec<_>>()
        .into()
}

/// The tools most fixtures use.
pub fn default_tools() -> Tools {
    tools(&[
        (
            "get_weather",
            r#"{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string"},"days":{"type":"integer"}}}"#,
        ),
        (
            "search",
            r#"{"type":"object","properties":{"query":{"type":"string"},"limit":{"type":"integer"},"filters":{"type":"object"},"exact":{"type":"boolean"}}}"#,
        ),
        ("get_time", ""),
        (
            "send-message",
            r#"{"type":"object","properties":{"text":{"type":"string"},"code":{"type":"string"}}}"#,
        ),
    ])
}

/// Runs every fixture of a parser through every chunking.
pub fn check_all(parser: &str, tools: &Tools, fixtures: &[Fixture], markers: &[&str]) {
    for fixture in fixtures {
        check(parser, tools, fixture, markers);
    }
}

pub fn check(parser: &str, tools: &Tools, fixture: &Fixture, markers: &[&str]) {
    let make = || create(parser, tools.clone()).expect("known parser");
    let label = format!("{parser}/{}", fixture.name);
    let whole = parse_complete(make().as_mut(), fixture.text);
    assert_eq!(whole.content, fixture.content, "{label}: content");
    let names: Vec<&str> = whole.calls.iter().map(|c| c.name.as_str()).collect();
    let expected_names: Vec<&str> = fixture.calls.iter().map(|c| c.0).collect();
    assert_eq!(names, expected_names, "{label}: call names");
    for (call, (_, expected)) in whole.calls.iter().zip(fixture.calls) {
        let got: Value = serde_json::from_str(&call.arguments).unwrap_or_else(|e| {
            panic!("{label}: arguments {:?} are not JSON: {e}", call.arguments)
        });
        let expected: Value = serde_json::from_str(expected).expect("fixture arguments");
        assert_eq!(got, expected, "{label}: arguments");
        let canonical = serde_json::to_string(&got).expect("print");
        assert_eq!(
            call.arguments, canonical,
            "{label}: arguments are canonical"
        );
        for marker in markers {
            if !expected.to_string().contains(marker) {
                assert!(
                    !call.arguments.contains(marker),
                    "{label}: marker {marker} in arguments"
                );
            }
        }
    }
    if !markers.iter().any(|m| fixture.content.contains(m)) {
        for marker in markers {
            assert!(
                !whole.content.contains(marker),
                "{label}: marker {marker} in content"
            );
        }
    }
    for (how, chunks) in chunkings(fixture.text) {
        let streamed = stream(make().as_mut(), &chunks, &format!("{label} [{how}]"));
        assert_eq!(
            streamed, whole,
            "{label}: {how} differs from the whole parse; chunks {chunks:?}"
        );
    }
}

/// Streams `chunks`, checking the delta invariants, and collects the result.
pub fn stream(parser: &mut dyn ToolParser, chunks: &[String], label: &str) -> ParsedTools {
    let mut collector = Collector::default();
    let mut named = 0usize;
    let mut check_delta = |delta: &smg_parsers::tool::ToolDelta| {
        for call in &delta.calls {
            match &call.name {
                Some(_) => {
                    assert_eq!(
                        call.index, named,
                        "{label}: a new call must take the next index"
                    );
                    named += 1;
                }
                None => assert!(
                    call.index < named,
                    "{label}: arguments before the call's name"
                ),
            }
        }
    };
    for chunk in chunks {
        let delta = parser.push(chunk);
        check_delta(&delta);
        collector.add(delta);
    }
    let delta = parser.finish();
    check_delta(&delta);
    collector.add(delta);
    let again = parser.finish();
    assert!(
        again.content.is_empty() && again.calls.is_empty(),
        "{label}: text left after finish"
    );
    collector.finish()
}

/// Every chunking the harness tries, with a label.
pub fn chunkings(text: &str) -> Vec<(String, Vec<String>)> {
    let mut all = vec![("whole".to_owned(), vec![text.to_owned()])];
    let boundaries: Vec<usize> = text.char_indices().map(|(i, _)| i).skip(1).collect();
    for &at in &boundaries {
        all.push((
            format!("split at {at}"),
            vec![text[..at].to_owned(), text[at..].to_owned()],
        ));
    }
    all.push((
        "char by char".to_owned(),
        text.chars().map(String::from).collect(),
    ));
    all.push(("2-3 chars".to_owned(), sized_chunks(text, &[2, 3])));
    all.push(("3-1-4 chars".to_owned(), sized_chunks(text, &[3, 1, 4])));
    all.push(("strategic".to_owned(), strategic_chunks(text)));
    all.push(("tokenizer".to_owned(), token_chunks(text)));
    all
}

fn sized_chunks(text: &str, sizes: &[usize]) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut chunks = Vec::new();
    let mut at = 0;
    for size in sizes.iter().cycle() {
        if at >= chars.len() {
            break;
        }
        let end = (at + size).min(chars.len());
        chunks.push(chars[at..end].iter().collect());
        at = end;
    }
    chunks
}

/// Breaks after `"`, `:`, `,`, braces, brackets and `>`, at most 5 chars.
fn strategic_chunks(text: &str) -> Vec<String> {
    let mut chunks = Vec::new();
    let mut current = String::new();
    for c in text.chars() {
        current.push(c);
        if matches!(
            c,
            '"' | ':' | ',' | '{' | '}' | '[' | ']' | '>' | '(' | ')' | '='
        ) || current.chars().count() >= 5
        {
            chunks.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    chunks
}

fn tokenizer() -> &'static tokenizers::Tokenizer {
    static TOKENIZER: OnceLock<tokenizers::Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/model/tokenizer.json"
        );
        tokenizers::Tokenizer::from_file(path).expect("the repository's test tokenizer")
    })
}

/// The text as a detokenizer streams it: encode, then decode token by token,
/// sending new text once it is no longer an incomplete UTF-8 sequence.
pub fn token_chunks(text: &str) -> Vec<String> {
    let tokenizer = tokenizer();
    let ids = tokenizer
        .encode(text, false)
        .expect("encode")
        .get_ids()
        .to_vec();
    let mut chunks = Vec::new();
    let mut sent = String::new();
    for end in 1..=ids.len() {
        let decoded = tokenizer.decode(&ids[..end], false).expect("decode");
        if decoded.ends_with('\u{FFFD}') || decoded.len() <= sent.len() {
            continue;
        }
        assert!(decoded.starts_with(&sent), "detokenization is a prefix");
        chunks.push(decoded[sent.len()..].to_owned());
        sent = decoded;
    }
    assert_eq!(sent, text, "the test tokenizer round-trips the fixture");
    chunks
}

/// Shorthand for an `Arc` of tools in tests that need none.
pub fn no_tools() -> Tools {
    Arc::from(Vec::new())
}
