//! What a client sees *while* a response streams: arguments arrive as the
//! model writes them (long strings included), the name comes first and
//! once, closing tags are held back, and hostile output is bounded. Also the
//! registry: names, errors and model detection.

mod tool_common;

use smg_parsers::tool::{MAX_HELD_BYTES, PARSER_NAMES, ToolDelta, create, detect};
use tool_common::{default_tools, no_tools};

fn args_of(delta: &ToolDelta) -> String {
    delta.calls.iter().map(|c| c.arguments.as_str()).collect()
}

/// Streams `head`, then `piece` ten times, and checks every piece's text
/// came out as an argument fragment before the value was closed.
fn assert_string_value_streams(parser: &str, head: &str, piece: &str, escaped_piece: &str) {
    let mut p = create(parser, default_tools()).expect("known parser");
    let first = p.push(head);
    assert_eq!(
        first.calls.len(),
        1,
        "{parser}: the name is sent when complete"
    );
    assert!(
        first.calls[0].name.is_some(),
        "{parser}: name on the first fragment"
    );
    let mut streamed = args_of(&first);
    for n in 0..10 {
        let delta = p.push(piece);
        assert!(
            delta.calls.iter().all(|c| c.name.is_none()),
            "{parser}: name sent once"
        );
        streamed.push_str(&args_of(&delta));
        assert_eq!(
            streamed.matches(escaped_piece).count(),
            n + 1,
            "{parser}: piece {n} not streamed yet: {streamed:?}"
        );
    }
}

#[test]
fn long_string_arguments_stream_as_they_arrive_in_every_format() {
    // Raw text in XML values; the same text JSON-escaped in JSON formats.
    let escaped = "line \\\"q\\\" ok\\t;";
    let cases = [
        (
            "qwen",
            "<tool_call>{\"name\": \"send-message\", \"arguments\": {\"text\": \"",
        ),
        (
            "qwen_xml",
            "<tool_call>\n<function=send-message>\n<parameter=text>\n",
        ),
        (
            "glm45_moe",
            "<tool_call>send-message\n<arg_key>text</arg_key>\n<arg_value>",
        ),
        (
            "glm47_moe",
            "<tool_call>send-message<arg_key>text</arg_key><arg_value>",
        ),
        (
            "deepseek31",
            "<｜tool▁call▁begin｜>send-message<｜tool▁sep｜>{\"text\": \"",
        ),
        (
            "kimik2",
            "<|tool_call_begin|>functions.send-message:0<|tool_call_argument_begin|>{\"text\": \"",
        ),
        ("mistral", "[TOOL_CALLS]send-message[ARGS]{\"text\": \""),
        (
            "llama",
            "<|python_tag|>{\"name\": \"send-message\", \"parameters\": {\"text\": \"",
        ),
        (
            "json",
            "[{\"name\": \"send-message\", \"arguments\": {\"text\": \"",
        ),
        (
            "deepseek",
            "<｜tool▁call▁begin｜>function<｜tool▁sep｜>send-message\n```json\n{\"text\": \"",
        ),
    ];
    for (parser, head) in cases {
        let piece = if parser.contains("xml") || parser.starts_with("glm") {
            "line \"q\" ok\t;"
        } else {
            escaped
        };
        assert_string_value_streams(parser, head, piece, escaped);
    }
    // pythonic: a single-quoted Python string.
    assert_string_value_streams(
        "pythonic",
        "[send-message(text='",
        "line \\'q\\' ok\\t;",
        "line 'q' ok\\t;",
    );
}

#[test]
fn a_possible_closing_tag_is_held_back_and_nothing_else() {
    let mut p = create("qwen_xml", default_tools()).expect("known parser");
    p.push("<tool_call>\n<function=send-message>\n<parameter=text>\n");
    assert_eq!(args_of(&p.push("abc</para")), "abc");
    // It was not a closing tag after all: the held text is sent.
    assert_eq!(args_of(&p.push("graph>")), "</paragraph>");
    assert_eq!(
        args_of(&p.push("\n")),
        "",
        "the newline before </parameter> is held"
    );
    assert_eq!(args_of(&p.push("\nx")), "\\n\\nx");
    let end = p.push("\n</parameter>\n</function>\n</tool_call>tail");
    assert_eq!(args_of(&end), "\"}");
    assert_eq!(end.content, "tail");
}

#[test]
fn the_name_comes_before_the_arguments_are_complete() {
    let mut p = create("qwen", default_tools()).expect("known parser");
    let delta = p.push("Hi<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa");
    assert_eq!(delta.content, "Hi");
    assert_eq!(delta.calls.len(), 1);
    assert_eq!(delta.calls[0].name.as_deref(), Some("get_weather"));
    assert_eq!(delta.calls[0].arguments, "{\"city\":\"Pa");
    let delta = p.push("ris\", \"days\": 1");
    assert_eq!(
        args_of(&delta),
        "ris\"",
        "a number is sent once complete, with its key"
    );
    let delta = p.push("0}}</tool_call>");
    assert_eq!(args_of(&delta), ",\"days\":10}");
    assert_eq!(p.finish(), ToolDelta::default());
}

#[test]
fn an_incomplete_name_is_never_sent() {
    let mut p = create("qwen", no_tools()).expect("known parser");
    for chunk in ["<tool_call>{\"name\": \"", "get_", "weather"] {
        assert!(
            p.push(chunk).calls.is_empty(),
            "no name before its closing quote"
        );
    }
    let delta = p.push("\", ");
    assert_eq!(delta.calls[0].name.as_deref(), Some("get_weather"));
}

#[test]
fn a_call_with_no_name_within_the_cap_comes_back_as_content() {
    let mut p = create("qwen", default_tools()).expect("known parser");
    let head = "<tool_call>{\"note\": \"";
    let mut sent = p.push(head).content;
    let piece = "x".repeat(1024);
    let mut total = head.len();
    for _ in 0..100 {
        sent.push_str(&p.push(&piece).content);
        total += piece.len();
        assert!(
            total - sent.len() <= MAX_HELD_BYTES + piece.len(),
            "held text is bounded by the cap"
        );
    }
    assert!(
        !sent.is_empty(),
        "the held call was given back once over the cap"
    );
    sent.push_str(&p.finish().content);
    assert_eq!(sent, format!("{head}{}", piece.repeat(100)));
}

/// A held call (no name yet) is given back on the character that takes it
/// past the cap, however the text is chunked and however the parser reads
/// it in runs: a call written right after that character is parsed; a call
/// whose `<` is that character is not.
#[test]
fn the_cap_trips_on_the_same_character_in_any_chunking() {
    let call = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>";
    // The held call starts at byte 0: the character holding byte
    // MAX_HELD_BYTES takes it past the cap.
    let crossing = MAX_HELD_BYTES;
    let up_to = |head: &str, fill: char, last: char| {
        let mut text = head.to_owned();
        while text.len() + last.len_utf8() <= crossing {
            text.push(fill);
        }
        text.push(last);
        text
    };
    let cases = [
        // (text, calls): the crossing character is the last one before `call`.
        // A string argument held before the name; the crossing character
        // straddles the cap.
        (up_to("<tool_call>{\"arguments\": {\"a\": \"", 'x', 'é'), 1),
        // Another key's string value.
        (up_to("<tool_call>{\"note\": \"", 'x', 'é'), 1),
        // Whitespace between tokens (a non-ASCII space crossing).
        (up_to("<tool_call>{", ' ', '\u{a0}'), 1),
        // The crossing character is the call's own `<`: read into the held
        // call, so no call.
        (up_to("<tool_call>{\"arguments\": {\"a\": \"", 'x', 'x'), 0),
        (up_to("<tool_call>{\"note\": \"", 'x', 'x'), 0),
    ];
    for (index, (head, calls)) in cases.into_iter().enumerate() {
        let head = if calls == 0 {
            head[..head.len() - 1].to_owned()
        } else {
            head
        };
        let text = format!("{head}{call}");
        let mut chunkings: Vec<(String, Vec<&str>)> = vec![("whole".to_owned(), vec![&text])];
        for at in [1, 4096, crossing - 1, crossing, crossing + 1, crossing + 2] {
            if text.is_char_boundary(at) {
                chunkings.push((format!("split at {at}"), vec![&text[..at], &text[at..]]));
            }
        }
        for size in [7, 4096] {
            let mut chunks = Vec::new();
            let mut start = 0;
            while start < text.len() {
                let mut end = (start + size).min(text.len());
                while !text.is_char_boundary(end) {
                    end += 1;
                }
                chunks.push(&text[start..end]);
                start = end;
            }
            chunkings.push((format!("{size}-byte chunks"), chunks));
        }
        let chars: Vec<&str> = text
            .char_indices()
            .map(|(at, c)| &text[at..at + c.len_utf8()])
            .collect();
        chunkings.push(("char by char".to_owned(), chars));
        for (how, chunks) in chunkings {
            let mut p = create("qwen", default_tools()).expect("known parser");
            let mut collector = smg_parsers::tool::Collector::default();
            for chunk in chunks {
                collector.add(p.push(chunk));
            }
            collector.add(p.finish());
            let parsed = collector.finish();
            assert_eq!(parsed.calls.len(), calls, "case {index}, {how}: calls");
            let given_back = if calls == 1 {
                head.as_str()
            } else {
                text.as_str()
            };
            assert_eq!(parsed.content, given_back, "case {index}, {how}: content");
        }
    }
}

#[test]
fn deep_nesting_is_malformed_not_unbounded() {
    let mut p = create("json", no_tools()).expect("known parser");
    let text = format!("{{\"name\": \"f\", \"arguments\": {}", "[".repeat(10_000));
    let mut collector = smg_parsers::tool::Collector::default();
    collector.add(p.push(&text));
    collector.add(p.finish());
    let parsed = collector.finish();
    assert_eq!(parsed.calls.len(), 1);
    assert_eq!(parsed.calls[0].name, "f");
    let args: serde_json::Value =
        serde_json::from_str(&parsed.calls[0].arguments).expect("closed JSON");
    assert!(args.is_object() || args.is_array());
}

#[test]
fn every_listed_name_creates_a_parser_and_others_are_refused() {
    for name in PARSER_NAMES {
        assert!(create(name, default_tools()).is_ok(), "{name}");
    }
    let err = create("hermes", default_tools()).expect_err("unknown");
    let message = err.to_string();
    assert!(message.contains("\"hermes\""), "{message}");
    for name in PARSER_NAMES {
        assert!(message.contains(name), "{message} lists {name}");
    }
}

#[test]
fn detection_by_model_id_takes_the_longest_pattern() {
    let table = [
        ("Qwen/Qwen2.5-7B-Instruct", Some("qwen")),
        ("Qwen/Qwen3-30B-A3B", Some("qwen")),
        ("Qwen/Qwen3-Next-80B-A3B-Instruct", Some("qwen")),
        ("Qwen/Qwen3-Coder-30B-A3B-Instruct", Some("qwen_xml")),
        ("Qwen/Qwen3.5-72B", Some("qwen_xml")),
        ("meta-llama/Llama-3.1-8B-Instruct", Some("llama")),
        ("meta-llama/Llama-3.2-1B-Instruct", Some("llama")),
        ("meta-llama/Meta-Llama-3-70B", Some("llama")),
        (
            "meta-llama/Llama-4-Scout-17B-16E-Instruct",
            Some("pythonic"),
        ),
        ("mistralai/Mistral-7B-Instruct-v0.3", Some("mistral")),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", Some("mistral")),
        ("mistralai/Devstral-Small-2505", Some("mistral")),
        ("deepseek-ai/DeepSeek-V3-0324", Some("deepseek")),
        ("deepseek-ai/DeepSeek-R1-0528", Some("deepseek")),
        ("deepseek-ai/DeepSeek-V3.1-Terminus", Some("deepseek31")),
        ("deepseek-ai/DeepSeek-V3.2-Exp", Some("deepseek31")),
        ("moonshotai/Kimi-K2-Instruct", Some("kimik2")),
        ("zai-org/GLM-4.5-Air", Some("glm45_moe")),
        ("zai-org/GLM-4.6", Some("glm45_moe")),
        ("zai-org/GLM-4.7", Some("glm47_moe")),
        ("zai-org/GLM-5", Some("glm47_moe")),
        ("google/gemma-3-27b-it", None),
        ("my-finetune", None),
    ];
    for (id, expected) in table {
        assert_eq!(detect(id, None), expected, "{id}");
    }
}

#[test]
fn detection_falls_back_to_the_chat_template() {
    let table = [
        (
            "{% if tools %}<tool_call>\n{{ tool | tojson }}\n</tool_call>{% endif %}",
            Some("qwen"),
        ),
        (
            "<tool_call>\n<function={{ name }}>\n<parameter=",
            Some("qwen_xml"),
        ),
        (
            "<tool_call>{{ name }}<arg_key>{{ k }}</arg_key>",
            Some("glm45_moe"),
        ),
        ("{{ '<|python_tag|>' }}", Some("llama")),
        ("<|python_start|>[func()]<|python_end|>", Some("pythonic")),
        ("[TOOL_CALLS] [", Some("mistral")),
        (
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{{ n }}\n```json\n",
            Some("deepseek"),
        ),
        (
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{{ n }}<｜tool▁sep｜>",
            Some("deepseek31"),
        ),
        ("<|tool_calls_section_begin|>", Some("kimik2")),
        ("{{ messages }}", None),
    ];
    for (template, expected) in table {
        assert_eq!(
            detect("my-finetune", Some(template)),
            expected,
            "{template}"
        );
    }
    // The id wins over the template.
    assert_eq!(
        detect("Qwen3-Coder-480B", Some("<tool_call>")),
        Some("qwen_xml")
    );
}
