//! An arbitrary chat template source compiled and rendered in the gateway's
//! template environment (`smg::tokenizer::ChatTemplate`: `transformers`'
//! Jinja settings, `tojson`, `raise_exception`, Python string methods) over
//! a small fixed conversation with a tool. Templates come from model files
//! a worker may serve, so compile and render errors are fine; a panic is
//! not. Keep inputs small (`-max_len`) and run with `-timeout`: without
//! minijinja's fuel a template can loop for a long time, which libFuzzer
//! then reports as a timeout.

use std::sync::OnceLock;

use serde_json::{Map, Value, json};
use smg::tokenizer::{ChatTemplate, ChatTemplateOptions, RenderBudget, TemplateTools};

struct Fixed {
    special_tokens: Map<String, Value>,
    messages: Vec<Value>,
    plain: ChatTemplateOptions,
    with_tools: ChatTemplateOptions,
}

fn fixed() -> &'static Fixed {
    static FIXED: OnceLock<Fixed> = OnceLock::new();
    FIXED.get_or_init(|| {
        let special_tokens = json!({"eos_token": "<|im_end|>", "bos_token": "<s>"});
        let messages = json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {"role": "assistant", "content": null, "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}
            }]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
            {"role": "user", "content": "Thanks"}
        ]);
        let tools = [json!({"type": "function", "function": {
            "name": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}
        }})];
        let mut extra = Map::new();
        extra.insert("enable_thinking".to_owned(), Value::Bool(false));
        Fixed {
            special_tokens: special_tokens.as_object().cloned().unwrap_or_default(),
            messages: messages.as_array().cloned().unwrap_or_default(),
            plain: ChatTemplateOptions::default(),
            with_tools: ChatTemplateOptions {
                add_generation_prompt: true,
                tools: Some(TemplateTools::new(&tools)),
                extra,
            },
        }
    })
}

/// One input, as the fuzz target runs it.
pub fn run(data: &[u8]) {
    let Ok(source) = std::str::from_utf8(data) else {
        return;
    };
    let fixed = fixed();
    let Ok(template) = ChatTemplate::compile(source.to_owned(), &fixed.special_tokens) else {
        return;
    };
    for options in [&fixed.plain, &fixed.with_tools] {
        if let Ok(prompt) = template.render_within(&fixed.messages, options, RenderBudget::Full) {
            let _ = prompt.len();
        }
    }
}
