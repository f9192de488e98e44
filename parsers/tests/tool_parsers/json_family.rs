//! Fixtures for the JSON-argument formats: qwen, json, llama, mistral,
//! deepseek, deepseek31, kimik2.

use crate::tool_common::{Fixture, check_all, default_tools, no_tools};

const QWEN_MARKERS: &[&str] = &["<tool_call>", "</tool_call>"];

#[test]
fn qwen() {
    let fixtures = [
        Fixture {
            name: "one call with newlines",
            text: "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            content: "",
            calls: &[("get_weather", r#"{"city":"Paris"}"#)],
        },
        Fixture {
            name: "no newlines, text before and after",
            text: "Let me check.<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\",\"days\":3}}</tool_call> Done.",
            content: "Let me check. Done.",
            calls: &[("get_weather", r#"{"city":"Oslo","days":3}"#)],
        },
        Fixture {
            name: "two calls with text between",
            text: "A<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\nB\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"rust\", \"limit\": 5}}\n</tool_call>",
            content: "A\nB\n",
            calls: &[
                ("get_time", "{}"),
                ("search", r#"{"query":"rust","limit":5}"#),
            ],
        },
        Fixture {
            name: "parameters key and no arguments key",
            text: "<tool_call>{\"name\": \"search\", \"parameters\": {\"query\": \"x\"}}</tool_call><tool_call>{\"name\": \"get_time\"}</tool_call>",
            content: "",
            calls: &[("search", r#"{"query":"x"}"#), ("get_time", "{}")],
        },
        Fixture {
            name: "nested arguments",
            text: "<tool_call>{\"name\": \"search\", \"arguments\": {\"filters\": {\"tags\": [\"a\", [\"b\"], {}], \"n\": null, \"ok\": true, \"x\": -1.5e2}}}</tool_call>",
            content: "",
            calls: &[(
                "search",
                r#"{"filters":{"tags":["a",["b"],{}],"n":null,"ok":true,"x":-150.0}}"#,
            )],
        },
        Fixture {
            name: "escaped quotes, braces and markers inside strings",
            text: "<tool_call>{\"name\": \"send-message\", \"arguments\": {\"text\": \"say \\\"hi\\\" }]} </tool_call> <tool_call>\", \"code\": \"a\\\\b\\n\"}}</tool_call>",
            content: "",
            calls: &[(
                "send-message",
                r#"{"text":"say \"hi\" }]} </tool_call> <tool_call>","code":"a\\b\n"}"#,
            )],
        },
        Fixture {
            name: "unicode and escapes re-printed canonically",
            text: "Météo ☀ <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"S\\u00e3o Paulo 🌧\", \"unit\": \"\\u00b0C\\/\\ud83d\\ude00\"}}</tool_call>",
            content: "Météo ☀ ",
            calls: &[("get_weather", r#"{"city":"São Paulo 🌧","unit":"°C/😀"}"#)],
        },
        Fixture {
            name: "type key and arguments before name",
            text: "<tool_call>{\"type\": \"function\", \"arguments\": {\"city\": \"Rome\"}, \"name\": \"get_weather\"}</tool_call>",
            content: "",
            calls: &[("get_weather", r#"{"city":"Rome"}"#)],
        },
        Fixture {
            name: "unknown tool name is returned as content",
            text: "x<tool_call>{\"name\": \"rm_rf\", \"arguments\": {\"path\": \"/\"}}</tool_call>y",
            content: "x<tool_call>{\"name\": \"rm_rf\", \"arguments\": {\"path\": \"/\"}}</tool_call>y",
            calls: &[],
        },
        Fixture {
            name: "unknown then known",
            text: "<tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>",
            content: "<tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call>",
            calls: &[("get_time", "{}")],
        },
        Fixture {
            name: "malformed call falls back to content",
            text: "a<tool_call>not json</tool_call>b",
            content: "a<tool_call>not json</tool_call>b",
            calls: &[],
        },
        Fixture {
            name: "malformed after a good call",
            text: "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call> and <tool_call>{\"oops\"</tool_call>",
            content: " and <tool_call>{\"oops\"</tool_call>",
            calls: &[("get_time", "{}")],
        },
        Fixture {
            name: "truncated marker at the end is content",
            text: "hello <tool_ca",
            content: "hello <tool_ca",
            calls: &[],
        },
        Fixture {
            name: "truncated call before the name is content",
            text: "hi <tool_call>{\"name\": \"get_wea",
            content: "hi <tool_call>{\"name\": \"get_wea",
            calls: &[],
        },
        Fixture {
            name: "truncated arguments are completed",
            text: "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",
            content: "",
            calls: &[("get_weather", r#"{"city":"Par"}"#)],
        },
        Fixture {
            name: "committed call broken mid-arguments",
            text: "<tool_call>{\"name\": \"search\", \"arguments\": {\"limit\": 3 oops}}</tool_call>z",
            content: "oops}}</tool_call>z",
            calls: &[("search", r#"{"limit":3}"#)],
        },
        Fixture {
            name: "a lone closing tag and angle brackets are content",
            text: "1 < 2 and </tool_call> <tool> <tool_cal",
            content: "1 < 2 and </tool_call> <tool> <tool_cal",
            calls: &[],
        },
    ];
    check_all("qwen", &default_tools(), &fixtures, QWEN_MARKERS);
}

#[test]
fn qwen_without_tools_accepts_any_name() {
    let fixtures = [Fixture {
        name: "any name",
        text: "<tool_call>{\"name\": \"whatever\", \"arguments\": {\"a\": 1}}</tool_call>",
        content: "",
        calls: &[("whatever", r#"{"a":1}"#)],
    }];
    check_all("qwen", &no_tools(), &fixtures, QWEN_MARKERS);
}

#[test]
fn json() {
    let fixtures = [
        Fixture {
            name: "one object",
            text: "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
            content: "",
            calls: &[("get_weather", r#"{"city":"Paris"}"#)],
        },
        Fixture {
            name: "an array with parameters",
            text: "[{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}, {\"name\": \"get_time\", \"parameters\": {}}]",
            content: "",
            calls: &[("get_weather", r#"{"city":"Paris"}"#), ("get_time", "{}")],
        },
        Fixture {
            name: "whitespace around an array",
            text: " \n[ {\"name\":\"search\",\"arguments\":{\"query\":\"a]b}\"}} ]\n",
            content: " \n\n",
            calls: &[("search", r#"{"query":"a]b}"}"#)],
        },
        Fixture {
            name: "text around an object",
            text: "Sure: {\"name\": \"get_time\", \"arguments\": {}} ok",
            content: "Sure:  ok",
            calls: &[("get_time", "{}")],
        },
        Fixture {
            name: "plain braces are content",
            text: "use {x} and [1, 2] or {\"a\": 1}",
            content: "use {x} and [1, 2] or {\"a\": 1}",
            calls: &[],
        },
        Fixture {
            name: "empty array is content",
            text: "[]",
            content: "[]",
            calls: &[],
        },
        Fixture {
            name: "unknown name in an array",
            text: "[{\"name\": \"nope\", \"arguments\": {}}]",
            content: "[{\"name\": \"nope\", \"arguments\": {}}]",
            calls: &[],
        },
        Fixture {
            name: "nested and unicode",
            text: "{\"name\": \"search\", \"arguments\": {\"query\": \"日本語 \\\"q\\\"\", \"filters\": {\"a\": [1, 2.5, {\"b\": false}]}}}",
            content: "",
            calls: &[(
                "search",
                r#"{"query":"日本語 \"q\"","filters":{"a":[1,2.5,{"b":false}]}}"#,
            )],
        },
        Fixture {
            name: "truncated array",
            text: "[{\"name\": \"search\", \"arguments\": {\"query\": \"ab",
            content: "",
            calls: &[("search", r#"{"query":"ab"}"#)],
        },
        Fixture {
            name: "name without arguments is not enough to start",
            text: "{\"name\"",
            content: "{\"name\"",
            calls: &[],
        },
    ];
    check_all("json", &default_tools(), &fixtures, &[]);
}

const LLAMA_MARKERS: &[&str] = &["<|python_tag|>"];

#[test]
fn llama() {
    let fixtures = [
        Fixture {
            name: "python tag",
            text: "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
            content: "",
            calls: &[("get_weather", r#"{"city":"Paris"}"#)],
        },
        Fixture {
            name: "bare object with type",
            text: "{\"type\": \"function\", \"name\": \"get_time\", \"parameters\": {}}",
            content: "",
            calls: &[("get_time", "{}")],
        },
        Fixture {
            name: "several calls separated by semicolons",
            text: "<|python_tag|>{\"name\": \"get_time\", \"parameters\": {}}; {\"name\": \"search\", \"parameters\": {\"query\": \"a;b\"}};{\"name\": \"get_weather\", \"arguments\": {\"city\": \"X\"}}",
            content: "",
            calls: &[
                ("get_time", "{}"),
                ("search", r#"{"query":"a;b"}"#),
                ("get_weather", r#"{"city":"X"}"#),
            ],
        },
        Fixture {
            name: "text before and after",
            text: "Calling now {\"name\": \"get_time\", \"parameters\": {}} and done; really",
            content: "Calling now  and done; really",
            calls: &[("get_time", "{}")],
        },
        Fixture {
            name: "semicolon then text",
            text: "{\"name\": \"get_time\", \"parameters\": {}}; bye",
            content: "; bye",
            calls: &[("get_time", "{}")],
        },
        Fixture {
            name: "non-call JSON is content",
            text: "{\"answer\": 42}",
            content: "{\"answer\": 42}",
            calls: &[],
        },
        Fixture {
            name: "python tag arriving in parts with nested args",
            text: "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"filters\": {\"k\": [\"}\", \"{\"]}}}",
            content: "",
            calls: &[("search", r#"{"filters":{"k":["}","{"]}}"#)],
        },
        Fixture {
            name: "unknown tool",
            text: "{\"name\": \"delete\", \"parameters\": {\"id\": 1}}",
            content: "{\"name\": \"delete\", \"parameters\": {\"id\": 1}}",
            calls: &[],
        },
        Fixture {
            name: "tag then garbage",
            text: "<|python_tag|>print('hi')",
            content: "<|python_tag|>print('hi')",
            calls: &[],
        },
        Fixture {
            name: "unicode",
            text: "{\"name\": \"send-message\", \"parameters\": {\"text\": \"héllo 👋 \\u4e16\"}}",
            content: "",
            calls: &[("send-message", r#"{"text":"héllo 👋 世"}"#)],
        },
    ];
    check_all("llama", &default_tools(), &fixtures, LLAMA_MARKERS);
}

const MISTRAL_MARKERS: &[&str] = &["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"];

#[test]
fn mistral() {
    let fixtures = [
        Fixture {
            name: "array form",
            text: "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]",
            content: "",
            calls: &[("get_weather", r#"{"city":"Paris"}"#)],
        },
        Fixture {
            name: "array form, two calls, text before",
            text: "Ok. [TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {}}, {\"name\": \"search\", \"arguments\": {\"query\": \"[x]\"}}]",
            content: "Ok. ",
            calls: &[("get_time", "{}"), ("search", r#"{"query":"[x]"}"#)],
        },
        Fixture {
            name: "bracket in text after the tools",
            text: "[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": {}}] see [1]",
            content: " see [1]",
            calls: &[("get_time", "{}")],
        },
        Fixture {
            name: "new form",
            text: "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"days\": 2}",
            content: "",
            calls: &[("get_weather", r#"{"city":"Paris","days":2}"#)],
        },
        Fixture {
            name: "new form repeated",
            text: "[TOOL_CALLS]get_time[ARGS]{}[TOOL_CALLS]search[ARGS]{\"query\": \"a}b\"}",
            content: "",
            calls: &[("get_time", "{}"), ("search", r#"{"query":"a}b"}"#)],
        },
        Fixture {
            name: "new form with call id",
            text: "[TOOL_CALLS]search[CALL_ID]abc123XYZ[ARGS]{\"query\": \"q\"}",
            content: "",
            calls: &[("search", r#"{"query":"q"}"#)],
        },
        Fixture {
            name: "new form unknown name",
            text: "[TOOL_CALLS]nope[ARGS]{\"a\": 1} tail",
            content: "[TOOL_CALLS]nope[ARGS]{\"a\": 1} tail",
            calls: &[],
        },
        Fixture {
            name: "garbage after the marker",
            text: "[TOOL_CALLS] hello world",
            content: "[TOOL_CALLS] hello world",
            calls: &[],
        },
        Fixture {
            name: "nested and unicode in the array form",
            text: "[TOOL_CALLS] [{\"name\": \"search\", \"arguments\": {\"filters\": {\"q\": [\"é\", {\"x\": null}]}}}]",
            content: "",
            calls: &[("search", r#"{"filters":{"q":["é",{"x":null}]}}"#)],
        },
        Fixture {
            name: "partial marker at the end",
            text: "text [TOOL_CAL",
            content: "text [TOOL_CAL",
            calls: &[],
        },
    ];
    check_all("mistral", &default_tools(), &fixtures, MISTRAL_MARKERS);
}

const DS_MARKERS: &[&str] = &[
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜end▁of▁sentence｜>",
];

#[test]
fn deepseek() {
    let fixtures = [
        Fixture {
            name: "one call",
            text: "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            content: "",
            calls: &[("get_weather", r#"{"city":"Paris"}"#)],
        },
        Fixture {
            name: "two calls, text before and after",
            text: "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n{\"query\": \"```\", \"limit\": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>Done.",
            content: "Checking.Done.",
            calls: &[
                ("get_time", "{}"),
                ("search", r#"{"query":"```","limit":2}"#),
            ],
        },
        Fixture {
            name: "unicode and nested",
            text: "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n{\"filters\": {\"lang\": \"中文\", \"tags\": [\"<｜tool▁call▁end｜>\"]}}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            content: "",
            calls: &[(
                "search",
                r#"{"filters":{"lang":"中文","tags":["<｜tool▁call▁end｜>"]}}"#,
            )],
        },
        Fixture {
            name: "unknown name",
            text: "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>nope\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            content: "<｜tool▁call▁begin｜>function<｜tool▁sep｜>nope\n```json\n{}\n```<｜tool▁call▁end｜>",
            calls: &[],
        },
        Fixture {
            name: "malformed arguments",
            text: "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\nnot json\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            content: "not json\n```<｜tool▁call▁end｜>",
            calls: &[("get_time", "{}")],
        },
        Fixture {
            name: "truncated",
            text: "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Pa",
            content: "",
            calls: &[("get_weather", r#"{"city":"Pa"}"#)],
        },
        Fixture {
            name: "text inside the section",
            text: "<｜tool▁calls▁begin｜> oops <｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜> \n<｜tool▁calls▁end｜>",
            content: " oops ",
            calls: &[("get_time", "{}")],
        },
        Fixture {
            name: "no section, fence without a json tag",
            text: "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```\n{}\n```<｜tool▁call▁end｜>",
            content: "",
            calls: &[("get_time", "{}")],
        },
        Fixture {
            name: "escaped quotes and backslashes",
            text: "<｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n{\"query\": \"a \\\"b\\\" \\\\ c\"}\n```<｜tool▁call▁end｜>",
            content: "",
            calls: &[("search", r#"{"query":"a \"b\" \\ c"}"#)],
        },
        Fixture {
            name: "partial marker",
            text: "a <｜tool▁ca",
            content: "a <｜tool▁ca",
            calls: &[],
        },
    ];
    check_all("deepseek", &default_tools(), &fixtures, DS_MARKERS);
}

#[test]
fn deepseek31() {
    let fixtures = [
        Fixture {
            name: "one call",
            text: "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            content: "",
            calls: &[("get_weather", r#"{"city":"Paris"}"#)],
        },
        Fixture {
            name: "two calls and end of sentence",
            text: "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{\"query\": \"x\\\"y\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
            content: "Sure.",
            calls: &[("get_time", "{}"), ("search", r#"{"query":"x\"y"}"#)],
        },
        Fixture {
            name: "end of sentence before the end marker",
            text: "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜end▁of▁sentence｜><｜tool▁call▁end｜>",
            content: "",
            calls: &[("get_time", "{}")],
        },
        Fixture {
            name: "end of sentence in text",
            text: "Hello<｜end▁of▁sentence｜>",
            content: "Hello",
            calls: &[],
        },
        Fixture {
            name: "unicode, nested, markers in strings",
            text: "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>send-message<｜tool▁sep｜>{\"text\": \"<｜tool▁sep｜> ✓\", \"code\": \"{[(\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            content: "",
            calls: &[(
                "send-message",
                r#"{"text":"<｜tool▁sep｜> ✓","code":"{[("}"#,
            )],
        },
        Fixture {
            name: "unknown name",
            text: "<｜tool▁call▁begin｜>nope<｜tool▁sep｜>{\"a\": [1]}<｜tool▁call▁end｜>",
            content: "<｜tool▁call▁begin｜>nope<｜tool▁sep｜>{\"a\": [1]}<｜tool▁call▁end｜>",
            calls: &[],
        },
        Fixture {
            name: "empty name is content",
            text: "<｜tool▁call▁begin｜><｜tool▁sep｜>{}<｜tool▁call▁end｜>",
            content: "<｜tool▁call▁begin｜><｜tool▁sep｜>{}<｜tool▁call▁end｜>",
            calls: &[],
        },
        Fixture {
            name: "malformed arguments",
            text: "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>oops<｜tool▁call▁end｜>",
            content: "oops<｜tool▁call▁end｜>",
            calls: &[("get_time", "{}")],
        },
        Fixture {
            name: "text after the section",
            text: "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>\n\nThat's it.",
            content: "\n\nThat's it.",
            calls: &[("get_time", "{}")],
        },
        Fixture {
            name: "truncated before arguments",
            text: "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>",
            content: "",
            calls: &[("get_time", "{}")],
        },
    ];
    check_all("deepseek31", &default_tools(), &fixtures, DS_MARKERS);
}

const KIMI_MARKERS: &[&str] = &[
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_end|>",
    "<|tool_call_argument_begin|>",
];

#[test]
fn kimik2() {
    let fixtures = [
        Fixture {
            name: "one call",
            text: "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|>",
            content: "",
            calls: &[("get_weather", r#"{"city":"Paris"}"#)],
        },
        Fixture {
            name: "two calls, dash in name, text around",
            text: "Hi <|tool_calls_section_begin|>\n<|tool_call_begin|>functions.send-message:0<|tool_call_argument_begin|>{\"text\": \"a\"}<|tool_call_end|>\n<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}<|tool_call_end|>\n<|tool_calls_section_end|> bye",
            content: "Hi  bye",
            calls: &[("send-message", r#"{"text":"a"}"#), ("get_time", "{}")],
        },
        Fixture {
            name: "id without prefix",
            text: "<|tool_calls_section_begin|><|tool_call_begin|>search:3<|tool_call_argument_begin|>{\"query\": \"<|tool_call_end|>\"}<|tool_call_end|><|tool_calls_section_end|>",
            content: "",
            calls: &[("search", r#"{"query":"<|tool_call_end|>"}"#)],
        },
        Fixture {
            name: "unknown name",
            text: "<|tool_calls_section_begin|><|tool_call_begin|>functions.nope:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
            content: "<|tool_call_begin|>functions.nope:0<|tool_call_argument_begin|>{}<|tool_call_end|>",
            calls: &[],
        },
        Fixture {
            name: "nested unicode",
            text: "<|tool_calls_section_begin|><|tool_call_begin|>functions.search:0<|tool_call_argument_begin|>{\"filters\": {\"q\": [\"ü\", 1e2]}}<|tool_call_end|><|tool_calls_section_end|>",
            content: "",
            calls: &[("search", r#"{"filters":{"q":["ü",100.0]}}"#)],
        },
        Fixture {
            name: "call without a section",
            text: "<|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>{}<|tool_call_end|> ok",
            content: " ok",
            calls: &[("get_time", "{}")],
        },
        Fixture {
            name: "malformed arguments",
            text: "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>nope<|tool_call_end|><|tool_calls_section_end|>",
            content: "nope<|tool_call_end|>",
            calls: &[("get_time", "{}")],
        },
        Fixture {
            name: "text between calls inside the section",
            text: "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>{}<|tool_call_end|> note <|tool_call_begin|>functions.search:1<|tool_call_argument_begin|>{\"query\": \"q\"}<|tool_call_end|><|tool_calls_section_end|>",
            content: " note ",
            calls: &[("get_time", "{}"), ("search", r#"{"query":"q"}"#)],
        },
        Fixture {
            name: "partial marker at the end",
            text: "x <|tool_calls_sec",
            content: "x <|tool_calls_sec",
            calls: &[],
        },
        Fixture {
            name: "truncated section",
            text: "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>{",
            content: "",
            calls: &[("get_time", "{}")],
        },
    ];
    check_all("kimik2", &default_tools(), &fixtures, KIMI_MARKERS);
}
