//! Tool-parser cost per generated token.
//!
//! Each parser streams a realistic response in its own format (a sentence of
//! text, then two calls whose arguments are ~500 bytes of JSON each) in
//! token-sized chunks of ~4 bytes, as the detokenizer would feed it. The
//! throughput is reported in chunks, so `1e9 / (elements per second)` is the
//! parser's cost in ns per generated token.
//!
//! `chat_answer_stream/qwen3+qwen` is the answer of `benches/tool_calls.rs`
//! (the gateway's tool-chat scenario: a think block, a sentence, two short
//! Hermes calls) through the qwen3 reasoning parser and then the qwen tool
//! parser, as the gateway chains them, in the same ~4-byte chunks;
//! `qwen3+qwen/16B` pushes ~16 bytes at a time, as the gateway did in that
//! scenario (~21 pushes for ~330 bytes), and is reported per ~4-byte token
//! too.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use smg_parsers::reasoning::{self, ReasoningOptions};
use smg_parsers::tool::{ToolSpec, Tools, create};

const INTRO: &str = "Sure, let me look that up for you before answering the question in detail. ";

fn tools() -> Tools {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "limit": {"type": "integer"},
            "filters": {"type": "object"},
        }
    });
    Arc::from(vec![
        ToolSpec {
            name: "search".to_owned(),
            parameters: Some(schema.clone()),
        },
        ToolSpec {
            name: "get_weather".to_owned(),
            parameters: Some(schema),
        },
    ])
}

/// ~500 bytes of arguments: a long string, a number and a nested object.
fn query(n: usize) -> String {
    format!(
        "call {n}: the quick brown fox jumps over the lazy dog while \\\"quoting\\\" things; ünïcödé text and more words to make this a realistic long argument that a model would write when asked to search the web for recent news about rust parsers, streaming gateways and tool calling formats across many model families"
    )
}

fn json_args(n: usize) -> String {
    format!(
        "{{\"query\": \"{}\", \"limit\": 25, \"filters\": {{\"lang\": \"en\", \"tags\": [\"rust\", \"llm\", \"streaming\"], \"recent\": true}}}}",
        query(n)
    )
}

/// The XML formats write raw values (no JSON escapes).
fn raw_query(n: usize) -> String {
    query(n).replace("\\\"", "\"")
}

fn response(parser: &str) -> String {
    let names = ["search", "get_weather"];
    let calls: Vec<String> = (0..2)
        .map(|n| {
            let name = names[n];
            let args = json_args(n);
            match parser {
                "json" => format!("{{\"name\": \"{name}\", \"arguments\": {args}}}"),
                "qwen" => format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {args}}}\n</tool_call>\n"),
                "llama" => format!("{{\"name\": \"{name}\", \"parameters\": {args}}}"),
                "mistral" => format!("[TOOL_CALLS]{name}[ARGS]{args}"),
                "deepseek" => format!("<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>"),
                "deepseek31" => format!("<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>"),
                "kimik2" => format!("<|tool_call_begin|>functions.{name}:{n}<|tool_call_argument_begin|>{args}<|tool_call_end|>"),
                "pythonic" => format!(
                    "{name}(query=\"{}\", limit=25, filters={{'lang': 'en', 'tags': ['rust', 'llm', 'streaming'], 'recent': True}})",
                    query(n)
                ),
                "qwen_xml" => format!(
                    "<tool_call>\n<function={name}>\n<parameter=query>\n{}\n</parameter>\n<parameter=limit>\n25\n</parameter>\n<parameter=filters>\n{{\"lang\": \"en\", \"tags\": [\"rust\", \"llm\", \"streaming\"], \"recent\": true}}\n</parameter>\n</function>\n</tool_call>\n",
                    raw_query(n)
                ),
                "glm45_moe" => format!(
                    "<tool_call>{name}\n<arg_key>query</arg_key>\n<arg_value>{}</arg_value>\n<arg_key>limit</arg_key>\n<arg_value>25</arg_value>\n<arg_key>filters</arg_key>\n<arg_value>{{\"lang\": \"en\", \"tags\": [\"rust\", \"llm\", \"streaming\"], \"recent\": true}}</arg_value>\n</tool_call>",
                    raw_query(n)
                ),
                _ => format!("{{\"name\": \"{name}\", \"arguments\": {args}}}"),
            }
        })
        .collect();
    match parser {
        "json" => format!("[{}]", calls.join(", ")),
        "llama" => format!("{INTRO}<|python_tag|>{}", calls.join("; ")),
        "pythonic" => format!("{INTRO}[{}]", calls.join(", ")),
        "deepseek" | "deepseek31" => format!(
            "{INTRO}<｜tool▁calls▁begin｜>{}<｜tool▁calls▁end｜>",
            calls.join("\n")
        ),
        "kimik2" => format!(
            "{INTRO}<|tool_calls_section_begin|>{}<|tool_calls_section_end|>",
            calls.join("")
        ),
        "passthrough" => format!("{INTRO}{}", calls.join("")),
        _ => format!("{INTRO}{}", calls.join("")),
    }
}

/// ~4-byte chunks on char boundaries.
fn chunks(text: &str) -> Vec<&str> {
    chunks_of(text, 4)
}

/// ~`size`-byte chunks on char boundaries.
fn chunks_of(text: &str, size: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let mut end = (start + size).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        out.push(&text[start..end]);
        start = end;
    }
    out
}

fn bench(c: &mut Criterion) {
    let tools = tools();
    let mut group = c.benchmark_group("tool_parser_stream");
    for parser in [
        "passthrough",
        "json",
        "qwen",
        "llama",
        "mistral",
        "deepseek",
        "deepseek31",
        "kimik2",
        "pythonic",
        "qwen_xml",
        "glm45_moe",
    ] {
        let text = response(parser);
        let pieces = chunks(&text);
        // The fixture must really contain two calls for this parser.
        let mut check = create(parser, tools.clone()).expect("known parser");
        let parsed = smg_parsers::tool::parse_complete(check.as_mut(), &text);
        if parser != "passthrough" {
            assert_eq!(parsed.calls.len(), 2, "{parser}: {text}");
        }
        group.throughput(Throughput::Elements(pieces.len() as u64));
        group.bench_function(parser, |b| {
            b.iter(|| {
                let mut p = create(parser, tools.clone()).expect("known parser");
                for piece in &pieces {
                    black_box(p.push(black_box(piece)));
                }
                black_box(p.finish());
            })
        });
    }
    group.finish();
    chat_answer(c);
}

/// The gateway's tool-chat answer (`benches/tool_calls.rs`).
const TOOL_ANSWER: &str = "<think>\nThe user wants the weather in two cities, so I will call \
    get_weather once for each of them.\n</think>\n\nLet me check both cities.\n<tool_call>\n\
    {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n\
    </tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \
    \"unit\": \"celsius\"}}\n</tool_call>";

fn chat_answer(c: &mut Criterion) {
    let tools = tools();
    let options = ReasoningOptions {
        starts_in_reasoning: false,
        tool_call_ends_reasoning: reasoning::tool_call_ends_reasoning("qwen3"),
    };
    let tokens = chunks(TOOL_ANSWER).len() as u64;
    let named = |delta: smg_parsers::tool::ToolDelta| {
        delta
            .calls
            .iter()
            .filter(|call| call.name.is_some())
            .count()
    };
    let run = |pieces: &[&str]| {
        let mut thinking = reasoning::create("qwen3", options).expect("known parser");
        let mut calls = create("qwen", tools.clone()).expect("known parser");
        let mut made = 0;
        for piece in pieces {
            let delta = thinking.push(black_box(piece));
            if !delta.content.is_empty() {
                made += named(calls.push(&delta.content));
            }
            black_box(delta.reasoning);
        }
        let delta = thinking.finish();
        made += named(calls.push(&delta.content));
        made += named(calls.finish());
        made
    };
    let mut group = c.benchmark_group("chat_answer_stream");
    group.throughput(Throughput::Elements(tokens));
    for (label, size) in [("qwen3+qwen", 4), ("qwen3+qwen/16B", 16)] {
        let pieces = chunks_of(TOOL_ANSWER, size);
        assert_eq!(run(&pieces), 2, "the answer's two calls are parsed");
        group.bench_function(label, |b| b.iter(|| black_box(run(&pieces))));
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
