//! A response cut off by `max_tokens` inside tool-call markup
//! ([`ToolParser::finish_cut`]): held-back marker prefixes come out as
//! content, a call with unfinished arguments is no call and its text (from
//! its first marker byte) is content, and a call whose arguments were
//! complete stays a call. Every chunking gives the same result.

use smg_parsers::tool::{Collector, ParsedTools, ToolParser, create, parse_cut};

use crate::tool_common::default_tools;

struct Cut {
    parser: &'static str,
    text: &'static str,
    content: &'static str,
    /// (name, arguments as canonical JSON).
    calls: &'static [(&'static str, &'static str)],
}

/// The whole text cut as `text` says, for each parser.
const CUTS: &[Cut] = &[
    Cut {
        parser: "qwen",
        text: "Let me check <tool_ca",
        content: "Let me check <tool_ca",
        calls: &[],
    },
    Cut {
        parser: "qwen",
        text: "Sure.<tool_call>\n{\"name\": \"get_wea",
        content: "Sure.<tool_call>\n{\"name\": \"get_wea",
        calls: &[],
    },
    Cut {
        parser: "qwen",
        text: "Sure.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",
        content: "Sure.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",
        calls: &[],
    },
    Cut {
        parser: "qwen",
        text: "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n\
               <tool_call>\n{\"name\": \"search\", \"arguments\": {\"limit\": 1",
        content: "\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"limit\": 1",
        calls: &[("get_time", "{}")],
    },
    Cut {
        // The arguments are whole; only the closing tag is missing (the
        // whitespace before it is the call's, as in a whole call).
        parser: "qwen",
        text: "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_",
        content: "</tool_",
        calls: &[("get_time", "{}")],
    },
    Cut {
        parser: "llama",
        text: "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Pa",
        content: "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Pa",
        calls: &[],
    },
    Cut {
        parser: "llama",
        text: "Checking. <|python_ta",
        content: "Checking. <|python_ta",
        calls: &[],
    },
    Cut {
        parser: "mistral",
        text: "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa",
        content: "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa",
        calls: &[],
    },
    Cut {
        parser: "mistral",
        text: "[TOOL_CALLS]get_weather[ARGS]{\"city\": ",
        content: "[TOOL_CALLS]get_weather[ARGS]{\"city\": ",
        calls: &[],
    },
    Cut {
        parser: "deepseek",
        text: "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n\
               ```json\n{\"city\": \"Pa",
        content: "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n\
                  ```json\n{\"city\": \"Pa",
        calls: &[],
    },
    Cut {
        parser: "deepseek",
        text: "Let me look.<｜tool▁calls▁be",
        content: "Let me look.<｜tool▁calls▁be",
        calls: &[],
    },
    Cut {
        parser: "kimik2",
        text: "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0\
               <|tool_call_argument_begin|>{\"city\": \"Pa",
        content: "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0\
                  <|tool_call_argument_begin|>{\"city\": \"Pa",
        calls: &[],
    },
    Cut {
        // The second call of a section is cut: the section's opener
        // belongs to the first, which is whole.
        parser: "kimik2",
        text: "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0\
               <|tool_call_argument_begin|>{}<|tool_call_end|><|tool_call_begin|>\
               functions.get_weather:1<|tool_call_argument_begin|>{\"city\"",
        content: "<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{\"city\"",
        calls: &[("get_time", "{}")],
    },
    Cut {
        parser: "glm45_moe",
        text: "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par",
        content: "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Par",
        calls: &[],
    },
    Cut {
        // A whole parameter, but the call may have more: unfinished.
        parser: "glm45_moe",
        text: "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n",
        content: "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n",
        calls: &[],
    },
    Cut {
        parser: "qwen_xml",
        text: "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
        content: "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
        calls: &[],
    },
    Cut {
        parser: "qwen_xml",
        text: "Hi <tool_call>\n<funct",
        content: "Hi <tool_call>\n<funct",
        calls: &[],
    },
    Cut {
        parser: "pythonic",
        text: "[get_weather(city='Pa",
        content: "[get_weather(city='Pa",
        calls: &[],
    },
];

/// Streams `chunks` and ends with `finish_cut`, as the gateway does on a
/// `length` finish.
fn stream_cut(parser: &mut dyn ToolParser, chunks: &[&str]) -> ParsedTools {
    let mut collector = Collector::default();
    for chunk in chunks {
        collector.add(parser.push(chunk));
    }
    collector.add(parser.finish_cut());
    collector.finish()
}

fn calls_of(parsed: &ParsedTools) -> Vec<(&str, &str)> {
    parsed
        .calls
        .iter()
        .map(|c| (c.name.as_str(), c.arguments.as_str()))
        .collect()
}

#[test]
fn a_cut_off_call_is_content_and_a_whole_one_stays_a_call_at_every_split() {
    for cut in CUTS {
        let make = || create(cut.parser, default_tools()).expect("known parser");
        let label = format!("{}: {:?}", cut.parser, cut.text);
        let whole = parse_cut(make().as_mut(), cut.text);
        assert_eq!(whole.content, cut.content, "{label}");
        assert_eq!(calls_of(&whole), cut.calls, "{label}");

        let boundaries: Vec<usize> = (0..=cut.text.len())
            .filter(|&at| cut.text.is_char_boundary(at))
            .collect();
        for &at in &boundaries {
            let split = stream_cut(make().as_mut(), &[&cut.text[..at], &cut.text[at..]]);
            assert_eq!(split, whole, "{label} split at {at}");
        }
        let chars: Vec<String> = cut.text.chars().map(String::from).collect();
        let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(
            stream_cut(make().as_mut(), &chars),
            whole,
            "{label} char by char"
        );
    }
}

#[test]
fn a_normal_end_still_completes_the_call_in_progress() {
    // The contrast with a cut: `finish` closes what the model opened.
    let mut parser = create("qwen", default_tools()).expect("known parser");
    let parsed = smg_parsers::tool::parse_complete(
        parser.as_mut(),
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",
    );
    assert_eq!(calls_of(&parsed), [("get_weather", "{\"city\":\"Par\"}")]);
    assert_eq!(parsed.content, "");
}
