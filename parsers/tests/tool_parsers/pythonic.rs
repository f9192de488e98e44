//! Fixtures for `pythonic` (Llama 4).

use crate::tool_common::{Fixture, check_all, default_tools};

const MARKERS: &[&str] = &["<|python_start|>", "<|python_end|>"];

#[test]
fn pythonic() {
    let fixtures = [
        Fixture {
            name: "one call",
            text: "[get_weather(city=\"Paris\", days=3)]",
            content: "",
            calls: &[("get_weather", r#"{"city":"Paris","days":3}"#)],
        },
        Fixture {
            name: "two calls, python literals, nesting",
            text: "[search(query='it\\'s', filters={'tags': ['a', [1]], 'ok': True, 'none': None}, exact=False), get_time()]",
            content: "",
            calls: &[
                (
                    "search",
                    r#"{"query":"it's","filters":{"tags":["a",[1]],"ok":true,"none":null},"exact":false}"#,
                ),
                ("get_time", "{}"),
            ],
        },
        Fixture {
            name: "markers removed, text around",
            text: "Sure! <|python_start|>[get_time()]<|python_end|> done",
            content: "Sure!  done",
            calls: &[("get_time", "{}")],
        },
        Fixture {
            name: "global indexes across lists",
            text: "[get_time()] then [search(query=\"a\"), get_weather(city=\"b\")]",
            content: " then ",
            calls: &[
                ("get_time", "{}"),
                ("search", r#"{"query":"a"}"#),
                ("get_weather", r#"{"city":"b"}"#),
            ],
        },
        Fixture {
            name: "brackets and parens in strings",
            text: "[send-message(text=\"a ] b ) c [ d(\", code='x=\"1\"')]",
            content: "",
            calls: &[(
                "send-message",
                r#"{"text":"a ] b ) c [ d(","code":"x=\"1\""}"#,
            )],
        },
        Fixture {
            name: "unicode and numbers",
            text: "[search(query=\"café ☕\", limit=-2, filters={\"x\": 1.5e3, \"y\": [None, True]})]",
            content: "",
            calls: &[(
                "search",
                r#"{"query":"café ☕","limit":-2,"filters":{"x":1500.0,"y":[null,true]}}"#,
            )],
        },
        Fixture {
            name: "ordinary brackets are content",
            text: "see [1] and [link](http://x) or [a, b]",
            content: "see [1] and [link](http://x) or [a, b]",
            calls: &[],
        },
        Fixture {
            name: "unknown name is content",
            text: "[delete_all(force=True)]",
            content: "[delete_all(force=True)]",
            calls: &[],
        },
        Fixture {
            name: "trailing comma and whitespace",
            text: "[ get_weather( city = 'X', ) , ]",
            content: "",
            calls: &[("get_weather", r#"{"city":"X"}"#)],
        },
        Fixture {
            name: "truncated",
            text: "[search(query=\"abc",
            content: "",
            calls: &[("search", r#"{"query":"abc"}"#)],
        },
        Fixture {
            name: "positional argument ends the call",
            text: "[search(\"x\")]",
            content: "\"x\")]",
            calls: &[("search", "{}")],
        },
    ];
    check_all("pythonic", &default_tools(), &fixtures, MARKERS);
}
