//! Fixtures for the XML-parameter formats: qwen_xml (qwen_coder), glm45_moe
//! and glm47_moe.

use crate::tool_common::{Fixture, check_all, default_tools, no_tools};

const QWEN_XML_MARKERS: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "<function=",
    "</function>",
    "<parameter=",
    "</parameter>",
];

fn qwen_xml_fixtures() -> Vec<Fixture> {
    vec![
        Fixture {
            name: "one call",
            text: "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
            content: "",
            calls: &[("get_weather", r#"{"city":"Paris"}"#)],
        },
        Fixture {
            name: "typed by schema: declared string stays a string",
            text: "<tool_call>\n<function=get_weather>\n<parameter=city>\n12345\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
            content: "",
            calls: &[("get_weather", r#"{"city":"12345","days":3}"#)],
        },
        Fixture {
            name: "declared object and boolean parsed; bad integer falls back to a string",
            text: "<tool_call>\n<function=search>\n<parameter=filters>\n{\"a\": [1, {\"b\": null}]}\n</parameter>\n<parameter=exact>\ntrue\n</parameter>\n<parameter=limit>\nmany\n</parameter>\n</function>\n</tool_call>",
            content: "",
            calls: &[(
                "search",
                r#"{"filters":{"a":[1,{"b":null}]},"exact":true,"limit":"many"}"#,
            )],
        },
        Fixture {
            name: "undeclared parameters are inferred",
            text: "<tool_call>\n<function=get_time>\n<parameter=n>\n-1.5\n</parameter>\n<parameter=flag>\nfalse\n</parameter>\n<parameter=tz>\nEurope/Paris\n</parameter>\n<parameter=list>\n[1, \"x\"]\n</parameter>\n<parameter=nothing>\nnull\n</parameter>\n<parameter=almost>\ntruex\n</parameter>\n</function>\n</tool_call>",
            content: "",
            calls: &[(
                "get_time",
                r#"{"n":-1.5,"flag":false,"tz":"Europe/Paris","list":[1,"x"],"nothing":null,"almost":"truex"}"#,
            )],
        },
        Fixture {
            name: "multi-line string with quotes, markup and html entities",
            text: "<tool_call>\n<function=send-message>\n<parameter=code>\nfn main() {\n    println!(\"<b>&amp;</b> \\n\");\n}\n\n</parameter>\n</function>\n</tool_call>",
            content: "",
            calls: &[(
                "send-message",
                "{\"code\":\"fn main() {\\n    println!(\\\"<b>&amp;</b> \\\\n\\\");\\n}\\n\"}",
            )],
        },
        Fixture {
            name: "closing tags inside a value only end it when complete",
            text: "<tool_call>\n<function=send-message>\n<parameter=text>\na </param b </parameter c\n</parameter>\n</function>\n</tool_call>",
            content: "",
            calls: &[("send-message", r#"{"text":"a </param b </parameter c"}"#)],
        },
        Fixture {
            name: "two calls with text before, between and after",
            text: "Let me look.\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>\nand\n<tool_call>\n<function=search>\n<parameter=query>\nrust 🦀\n</parameter>\n</function>\n</tool_call>\nDone.",
            content: "Let me look.\n\nand\n\nDone.",
            calls: &[("get_time", "{}"), ("search", r#"{"query":"rust 🦀"}"#)],
        },
        Fixture {
            name: "no wrapper, no newlines",
            text: "<function=get_weather><parameter=city>Oslo</parameter><parameter=unit>C</parameter></function> ok",
            content: " ok",
            calls: &[("get_weather", r#"{"city":"Oslo","unit":"C"}"#)],
        },
        Fixture {
            name: "unknown function is content",
            text: "a<tool_call>\n<function=rm>\n<parameter=path>\n/\n</parameter>\n</function>\n</tool_call>b",
            content: "a<tool_call>\n<function=rm>\n<parameter=path>\n/\n</parameter>\n</function>\n</tool_call>b",
            calls: &[],
        },
        Fixture {
            name: "missing </parameter>",
            text: "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</function>\n</tool_call>",
            content: "",
            calls: &[("get_weather", r#"{"city":"Rome"}"#)],
        },
        Fixture {
            name: "truncated inside a string value",
            text: "<tool_call>\n<function=send-message>\n<parameter=text>\nhello wor",
            content: "",
            calls: &[("send-message", r#"{"text":"hello wor"}"#)],
        },
        Fixture {
            name: "truncated before the function name",
            text: "hi <tool_call>\n<function=get_wea",
            content: "hi <tool_call>\n<function=get_wea",
            calls: &[],
        },
        Fixture {
            name: "malformed: no function tag",
            text: "<tool_call>\n{\"name\": \"x\"}\n</tool_call>",
            content: "<tool_call>\n{\"name\": \"x\"}\n</tool_call>",
            calls: &[],
        },
        Fixture {
            name: "empty string value",
            text: "<tool_call>\n<function=send-message>\n<parameter=text>\n</parameter>\n</function>\n</tool_call>",
            content: "",
            calls: &[("send-message", r#"{"text":""}"#)],
        },
    ]
}

#[test]
fn qwen_xml() {
    check_all(
        "qwen_xml",
        &default_tools(),
        &qwen_xml_fixtures(),
        QWEN_XML_MARKERS,
    );
}

#[test]
fn qwen_coder_is_an_alias() {
    check_all(
        "qwen_coder",
        &default_tools(),
        &qwen_xml_fixtures()[..3],
        QWEN_XML_MARKERS,
    );
}

#[test]
fn qwen_xml_without_tools_infers_every_value() {
    let fixtures = [Fixture {
        name: "inferred",
        text: "<tool_call>\n<function=anything>\n<parameter=city>\n12345\n</parameter>\n</function>\n</tool_call>",
        content: "",
        calls: &[("anything", r#"{"city":12345}"#)],
    }];
    check_all("qwen_xml", &no_tools(), &fixtures, QWEN_XML_MARKERS);
}

const GLM_MARKERS: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
];

fn glm_fixtures() -> Vec<Fixture> {
    vec![
        Fixture {
            name: "4.5 style with newlines",
            text: "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
            content: "",
            calls: &[("get_weather", r#"{"city":"Paris","days":2}"#)],
        },
        Fixture {
            name: "4.7 style without newlines",
            text: "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
            content: "",
            calls: &[("get_weather", r#"{"city":"Paris"}"#)],
        },
        Fixture {
            name: "zero-argument inline call",
            text: "<tool_call>get_time</tool_call>",
            content: "",
            calls: &[("get_time", "{}")],
        },
        Fixture {
            name: "zero-argument call with a newline, text around",
            text: "Checking\n<tool_call>get_time\n</tool_call>\nthen <tool_call>search<arg_key>query</arg_key><arg_value>a\nb</arg_value></tool_call>!",
            content: "Checking\n\nthen !",
            calls: &[("get_time", "{}"), ("search", r#"{"query":"a\nb"}"#)],
        },
        Fixture {
            name: "string values keep newlines and quotes",
            text: "<tool_call>send-message<arg_key>text</arg_key><arg_value>\n\"quoted\" </arg and </arg_valu\n</arg_value></tool_call>",
            content: "",
            calls: &[(
                "send-message",
                r#"{"text":"\n\"quoted\" </arg and </arg_valu\n"}"#,
            )],
        },
        Fixture {
            name: "declared object and inferred values",
            text: "<tool_call>search<arg_key>filters</arg_key><arg_value>{\"k\": [\"v\"]}</arg_value><arg_key>exact</arg_key><arg_value>false</arg_value><arg_key>extra</arg_key><arg_value>12.5</arg_value></tool_call>",
            content: "",
            calls: &[(
                "search",
                r#"{"filters":{"k":["v"]},"exact":false,"extra":12.5}"#,
            )],
        },
        Fixture {
            name: "unicode",
            text: "<tool_call>send-message<arg_key>text</arg_key><arg_value>こんにちは 🌸</arg_value></tool_call>",
            content: "",
            calls: &[("send-message", r#"{"text":"こんにちは 🌸"}"#)],
        },
        Fixture {
            name: "unknown name is content",
            text: "<tool_call>nope<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>x",
            content: "<tool_call>nope<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>x",
            calls: &[],
        },
        Fixture {
            name: "malformed: text instead of a name",
            text: "<tool_call>this is not a call</tool_call>",
            content: "<tool_call>this is not a call</tool_call>",
            calls: &[],
        },
        Fixture {
            name: "truncated value",
            text: "<tool_call>send-message<arg_key>text</arg_key><arg_value>partial</arg_v",
            content: "</arg_v",
            calls: &[("send-message", r#"{"text":"partial"}"#)],
        },
        Fixture {
            name: "garbage between arguments ends the call",
            text: "<tool_call>get_weather<arg_key>city</arg_key><arg_value>X</arg_value> junk </tool_call>",
            content: "junk </tool_call>",
            calls: &[("get_weather", r#"{"city":"X"}"#)],
        },
    ]
}

#[test]
fn glm45_moe() {
    check_all("glm45_moe", &default_tools(), &glm_fixtures(), GLM_MARKERS);
}

#[test]
fn glm47_moe() {
    check_all("glm47_moe", &default_tools(), &glm_fixtures(), GLM_MARKERS);
}
