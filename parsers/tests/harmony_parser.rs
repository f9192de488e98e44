//! The Harmony parser on hand-written gpt-oss outputs, each parsed whole and
//! streamed in every chunking (every two-chunk split, char by char, 2–3
//! chars, and the gpt-oss fixture tokenizer's own tokens, decoded with
//! special tokens kept as the gateway does): every chunking must give exactly
//! the whole parse, with names once, indexes 0..n-1 in order, no marker in
//! any output and nothing left after `finish`.

use std::sync::{Arc, OnceLock};

use smg_parsers::harmony::{
    HarmonyDelta, HarmonyOptions, HarmonyParser, MARKERS, MAX_HEADER_BYTES, ParsedHarmony,
    parse_complete,
};
use smg_parsers::tool::{ToolSpec, Tools};

#[derive(Debug, Clone, Copy)]
enum Mode {
    /// Tools get_weather and get_time offered, reasoning separated.
    Tools,
    /// `tool_choice: none` or no tools.
    NoCalls,
    /// `separate_reasoning: false`.
    Inline,
    /// Tools offered but the list is empty: any name is a call.
    AnyName,
}

fn options(mode: Mode) -> HarmonyOptions {
    let tools: Tools = ["get_weather", "get_time"]
        .into_iter()
        .map(|name| ToolSpec {
            name: name.to_owned(),
            parameters: None,
        })
        .collect::<Vec<_>>()
        .into();
    match mode {
        Mode::Tools => HarmonyOptions {
            separate_reasoning: true,
            calls: Some(tools),
        },
        Mode::NoCalls => HarmonyOptions {
            separate_reasoning: true,
            calls: None,
        },
        Mode::Inline => HarmonyOptions {
            separate_reasoning: false,
            calls: Some(tools),
        },
        Mode::AnyName => HarmonyOptions {
            separate_reasoning: true,
            calls: Some(Arc::from(Vec::new())),
        },
    }
}

struct Case {
    name: &'static str,
    mode: Mode,
    text: &'static str,
    reasoning: &'static str,
    content: &'static str,
    /// (name, arguments exactly as the body wrote them).
    calls: &'static [(&'static str, &'static str)],
}

const fn case(
    name: &'static str,
    text: &'static str,
    reasoning: &'static str,
    content: &'static str,
    calls: &'static [(&'static str, &'static str)],
) -> Case {
    Case {
        name,
        mode: Mode::Tools,
        text,
        reasoning,
        content,
        calls,
    }
}

const fn with(mode: Mode, base: Case) -> Case {
    Case { mode, ..base }
}

const CASES: &[Case] = &[
    case(
        "analysis then final, <|return|> hidden",
        "<|channel|>analysis<|message|>The user greets me.<|end|><|start|>assistant<|channel|>final<|message|>Hello! How can I help?",
        "The user greets me.",
        "Hello! How can I help?",
        &[],
    ),
    case(
        "analysis then final, <|return|> shown",
        "<|channel|>analysis<|message|>Short.<|end|><|start|>assistant<|channel|>final<|message|>Hi.<|return|>",
        "Short.",
        "Hi.",
        &[],
    ),
    case(
        "final only",
        "<|channel|>final<|message|>Just the answer.",
        "",
        "Just the answer.",
        &[],
    ),
    case(
        "analysis then a call, recipient after the channel, <|call|> hidden",
        "<|channel|>analysis<|message|>Need the weather in Paris.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}",
        "Need the weather in Paris.",
        "",
        &[("get_weather", "{\"city\":\"Paris\"}")],
    ),
    case(
        "recipient before the channel, bare content type, <|call|> shown",
        "<|channel|>analysis<|message|>Rome.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Rome\", \"unit\": \"celsius\"}<|call|>",
        "Rome.",
        "",
        &[("get_weather", "{\"city\": \"Rome\", \"unit\": \"celsius\"}")],
    ),
    case(
        "a call on the analysis channel, first message",
        "<|channel|>analysis to=functions.get_time <|constrain|>json<|message|>{\"city\":\"Oslo\"}<|call|>",
        "",
        "",
        &[("get_time", "{\"city\":\"Oslo\"}")],
    ),
    case(
        "a recipient in the implicit first header",
        " to=functions.get_time<|channel|>commentary <|constrain|>json<|message|>{}",
        "",
        "",
        &[("get_time", "{}")],
    ),
    case(
        "two calls, then the answer",
        "<|channel|>analysis<|message|>Both.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|><|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|><|start|>assistant<|channel|>final<|message|>Done.",
        "Both.",
        "Done.",
        &[
            ("get_weather", "{\"city\":\"Paris\"}"),
            ("get_time", "{\"city\":\"Paris\"}"),
        ],
    ),
    case(
        "a commentary preamble is content",
        "<|channel|>analysis<|message|>Tell them first.<|end|><|start|>assistant<|channel|>commentary<|message|>Checking the weather…<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Zürich\"}",
        "Tell them first.",
        "Checking the weather…",
        &[("get_weather", "{\"city\":\"Zürich\"}")],
    ),
    case(
        "a truncated call keeps its arguments as they are",
        "<|channel|>analysis<|message|>Go.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Par",
        "Go.",
        "",
        &[("get_weather", "{\"city\":\"Par")],
    ),
    case(
        "a call cut off at a partial marker keeps the partial text",
        "<|channel|>commentary to=functions.get_weather<|message|>{\"city\":\"Nice\"}<|ca",
        "",
        "",
        &[("get_weather", "{\"city\":\"Nice\"}<|ca")],
    ),
    case(
        "a call cut off right after its header is still a call",
        "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>",
        "",
        "",
        &[("get_time", "")],
    ),
    case(
        "a header cut off before its body is dropped",
        "<|channel|>analysis<|message|>Almost.<|end|><|start|>assistant<|channel|>fin",
        "Almost.",
        "",
        &[],
    ),
    case(
        "a truncated analysis is reasoning",
        "<|channel|>analysis<|message|>Let me think about <|en",
        "Let me think about <|en",
        "",
        &[],
    ),
    case(
        "plain text without Harmony is content",
        "Hello, world! 1 < 2 and <b>bold</b>.",
        "",
        "Hello, world! 1 < 2 and <b>bold</b>.",
        &[],
    ),
    case(
        "an unknown channel is content",
        "<|channel|>notes<|message|>Odd channel.<|end|>",
        "",
        "Odd channel.",
        &[],
    ),
    case(
        "a header without a channel is content",
        "<|message|>No channel.<|end|><|start|>assistant<|message|> Still none.",
        "",
        "No channel. Still none.",
        &[],
    ),
    case(
        "built-in python and browser messages are dropped",
        "<|channel|>analysis<|message|>Compute, then search.<|end|><|start|>assistant<|channel|>analysis to=python<|message|>print(2 + 2)<|call|><|start|>assistant to=browser.search<|channel|>commentary json<|message|>{\"query\":\"weather\"}<|end|><|start|>assistant<|channel|>commentary to=container.exec<|message|>ls<|call|><|start|>assistant<|channel|>final<|message|>4.",
        "Compute, then search.",
        "4.",
        &[],
    ),
    case(
        "a function that was not offered is content",
        "<|channel|>commentary to=functions.launch_rocket <|constrain|>json<|message|>{\"when\":\"now\"}<|call|><|start|>assistant<|channel|>final<|message|> no",
        "",
        "{\"when\":\"now\"} no",
        &[],
    ),
    with(
        Mode::AnyName,
        case(
            "with an empty tool list any function is a call",
            "<|channel|>commentary to=functions.launch_rocket <|constrain|>json<|message|>{\"when\":\"now\"}",
            "",
            "",
            &[("launch_rocket", "{\"when\":\"now\"}")],
        ),
    ),
    case(
        "an empty function name is not a call",
        "<|channel|>commentary to=functions. <|constrain|>json<|message|>{}",
        "",
        "{}",
        &[],
    ),
    with(
        Mode::NoCalls,
        case(
            "calls off: the call's body is content, reasoning still split",
            "<|channel|>analysis<|message|>Call it.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
            "Call it.",
            "{\"city\":\"Paris\"}",
            &[],
        ),
    ),
    with(
        Mode::Inline,
        case(
            "separate_reasoning false: analysis is content",
            "<|channel|>analysis<|message|>Thinking. <|end|><|start|>assistant<|channel|>final<|message|>Answer.",
            "",
            "Thinking. Answer.",
            &[],
        ),
    ),
    case(
        "stray markers inside a body are dropped",
        "<|channel|>final<|message|>a<|message|>b<|constrain|>c<|channel|>d",
        "",
        "abcd",
        &[],
    ),
    case(
        "a body ended by <|start|> without <|end|>",
        "<|channel|>analysis<|message|>r<|start|>assistant<|channel|>final<|message|>c",
        "r",
        "c",
        &[],
    ),
    case(
        "the model repeats <|start|>assistant",
        "<|start|>assistant<|channel|>final<|message|>ok",
        "",
        "ok",
        &[],
    ),
    case(
        "unknown special-looking text in a body is kept",
        "<|channel|>final<|message|>x <|y|> <|endoftext|> <| z",
        "",
        "x <|y|> <|endoftext|> <| z",
        &[],
    ),
    case(
        "Unicode and newlines",
        "<|channel|>analysis<|message|>Zürich → 21 °C ☀️\n\n<|end|><|start|>assistant<|channel|>final<|message|>Es ist sonnig. 晴れ。\n",
        "Zürich → 21 °C ☀️\n\n",
        "Es ist sonnig. 晴れ。\n",
        &[],
    ),
    case(
        "arguments with nested JSON and marker-like strings",
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"<|end\",\"opts\":{\"days\":[1,2]},\"q\":\"a\\\"b\"}<|call|>",
        "",
        "",
        &[(
            "get_weather",
            "{\"city\":\"<|end\",\"opts\":{\"days\":[1,2]},\"q\":\"a\\\"b\"}",
        )],
    ),
    case("an empty output", "", "", "", &[]),
];

/// A header over the cap is not a header: its text, markers removed, and
/// the rest of its message are content.
#[test]
fn a_header_over_the_cap_is_content() {
    let long = "x".repeat(MAX_HEADER_BYTES + 1);
    let text = format!(
        "<|channel|>{long}<|message|>body<|end|><|start|>assistant<|channel|>final<|message|>ok"
    );
    let expected = format!("{long}bodyok");
    check_text("a long header", Mode::Tools, &text, "", &expected, &[]);
    // At the cap exactly, it is still a header (an unknown channel: content).
    let at_cap = "y".repeat(MAX_HEADER_BYTES - "<|channel|>".len());
    let text = format!("<|channel|>{at_cap}<|message|>body");
    check_text("a header at the cap", Mode::Tools, &text, "", "body", &[]);
    // Plain text longer than the cap streams as content.
    let plain = "plain words ".repeat(40);
    check_text("long plain text", Mode::Tools, &plain, "", &plain, &[]);
}

#[test]
fn every_case_gives_the_same_result_in_every_chunking() {
    for case in CASES {
        check_text(
            case.name,
            case.mode,
            case.text,
            case.reasoning,
            case.content,
            case.calls,
        );
    }
}

#[test]
fn a_call_is_named_as_soon_as_its_header_ends_and_arguments_stream() {
    let mut parser = HarmonyParser::new(options(Mode::Tools));
    let first = parser.push("<|channel|>analysis<|message|>Hm");
    assert_eq!(first.reasoning, "Hm");
    let named = parser.push(
        ".<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
    );
    assert_eq!(named.reasoning, ".");
    assert_eq!(named.calls.len(), 1);
    assert_eq!(named.calls[0].name.as_deref(), Some("get_weather"));
    assert_eq!(named.calls[0].arguments, "");
    let piece = parser.push("{\"city\":");
    assert_eq!(piece.calls.len(), 1);
    assert_eq!(
        (piece.calls[0].index, piece.calls[0].name.as_deref()),
        (0, None)
    );
    assert_eq!(piece.calls[0].arguments, "{\"city\":");
    // A possible marker at the end is held back, then released as text.
    let held = parser.push("\"Paris\"}<|ca");
    assert_eq!(held.calls[0].arguments, "\"Paris\"}");
    assert!(parser.push("ll|>").is_empty());
    assert!(parser.finish().is_empty());
}

#[test]
fn a_partial_marker_is_held_back_until_the_next_chunk() {
    let mut parser = HarmonyParser::new(options(Mode::Tools));
    assert!(parser.push("<|chan").is_empty());
    assert!(parser.push("nel|>final<|mess").is_empty());
    let delta = parser.push("age|>Hi <|");
    assert_eq!(delta.content, "Hi ");
    let delta = parser.push("there");
    assert_eq!(delta.content, "<|there");
    assert!(parser.finish().is_empty());
}

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

fn check_text(
    name: &str,
    mode: Mode,
    text: &str,
    reasoning: &str,
    content: &str,
    calls: &[(&str, &str)],
) {
    let whole = parse_complete(options(mode), text);
    assert_eq!(whole.reasoning, reasoning, "{name}: reasoning");
    assert_eq!(whole.content, content, "{name}: content");
    let got: Vec<(&str, &str)> = whole
        .calls
        .iter()
        .map(|call| (call.name.as_str(), call.arguments.as_str()))
        .collect();
    assert_eq!(got, calls, "{name}: calls");
    for marker in MARKERS {
        let leaked = |out: &str, expected: &str| out.contains(marker) && !expected.contains(marker);
        assert!(
            !leaked(&whole.reasoning, reasoning),
            "{name}: {marker} in reasoning"
        );
        assert!(
            !leaked(&whole.content, content),
            "{name}: {marker} in content"
        );
        for (call, (_, expected)) in whole.calls.iter().zip(calls) {
            assert!(
                !leaked(&call.arguments, expected),
                "{name}: {marker} in arguments"
            );
        }
    }
    for (how, chunks) in chunkings(text) {
        let streamed = stream(mode, &chunks, &format!("{name} [{how}]"));
        assert_eq!(streamed, whole, "{name}: {how} differs; chunks {chunks:?}");
    }
}

/// Streams `chunks`, checking each delta's call invariants.
fn stream(mode: Mode, chunks: &[String], label: &str) -> ParsedHarmony {
    let mut parser = HarmonyParser::new(options(mode));
    let mut parsed = ParsedHarmony::default();
    let mut named = 0usize;
    let mut absorb = |delta: HarmonyDelta, parsed: &mut ParsedHarmony| {
        for call in &delta.calls {
            match call.name {
                Some(_) => {
                    assert_eq!(
                        call.index, named,
                        "{label}: a new call takes the next index"
                    );
                    named += 1;
                }
                None => assert!(
                    call.index + 1 == named,
                    "{label}: arguments of an earlier call"
                ),
            }
        }
        parsed.add(delta);
    };
    for chunk in chunks {
        absorb(parser.push(chunk), &mut parsed);
    }
    absorb(parser.finish(), &mut parsed);
    assert!(
        parser.finish().is_empty(),
        "{label}: text left after finish"
    );
    parsed
}

fn chunkings(text: &str) -> Vec<(String, Vec<String>)> {
    let mut all = vec![("whole".to_owned(), vec![text.to_owned()])];
    for (at, _) in text.char_indices().skip(1) {
        all.push((
            format!("split at {at}"),
            vec![text[..at].to_owned(), text[at..].to_owned()],
        ));
    }
    all.push((
        "char by char".to_owned(),
        text.chars().map(String::from).collect(),
    ));
    let chars: Vec<char> = text.chars().collect();
    let mut sized = Vec::new();
    let mut at = 0;
    for size in [2, 3].into_iter().cycle() {
        if at >= chars.len() {
            break;
        }
        let end = (at + size).min(chars.len());
        sized.push(chars[at..end].iter().collect());
        at = end;
    }
    all.push(("2-3 chars".to_owned(), sized));
    all.push(("gpt-oss tokens".to_owned(), token_chunks(text)));
    all
}

fn tokenizer() -> &'static tokenizers::Tokenizer {
    static TOKENIZER: OnceLock<tokenizers::Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/models/gpt-oss/tokenizer.json"
        );
        tokenizers::Tokenizer::from_file(path).expect("the gpt-oss fixture tokenizer")
    })
}

/// The text as the gateway's detokenizer streams it: the gpt-oss fixture's
/// ids (each Harmony marker one id), decoded with special tokens kept, new
/// text released once it is not an incomplete UTF-8 sequence.
fn token_chunks(text: &str) -> Vec<String> {
    let tokenizer = tokenizer();
    let ids = tokenizer
        .encode(text, false)
        .expect("encode")
        .get_ids()
        .to_vec();
    for marker in MARKERS {
        let id = tokenizer.token_to_id(marker).expect("a marker id");
        let count = ids.iter().filter(|&&i| i == id).count();
        assert_eq!(count, text.matches(marker).count(), "{marker} is one token");
    }
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
    assert_eq!(sent, text, "the fixture tokenizer round-trips the text");
    chunks
}
