//! The thinking switch read from chat templates written in each family's
//! style, and the per-request resolution of where the output starts.

use serde_json::{Map, Value, json};
use smg_parsers::reasoning::{
    ThinkingToggle, ToggleKey, starts_in_reasoning, thinking_preference, thinking_toggle,
};

/// Qwen3 hybrid: `enable_thinking`, on by default; off writes an empty think
/// block into the prompt; on lets the model write `<think>`.
const QWEN3_STYLE: &str = "{%- for message in messages %}<|im_start|>{{ message.role }}\n\
    {{ message.content }}<|im_end|>\n{%- endfor %}\
    {%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}\
    {%- if enable_thinking is defined and enable_thinking is false %}\
    {{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}";

/// Qwen3-Thinking-2507: no switch; the prompt ends in `<think>`.
const QWEN3_THINKING_STYLE: &str = "{%- for message in messages %}{{ message.content }}{%- endfor %}\
    {%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}";

/// DeepSeek-V3.1: `thinking`, off unless set; on, the prompt ends in `<think>`.
const DEEPSEEK_V31_STYLE: &str = "{%- if not thinking is defined %}{%- set thinking = false %}{%- endif %}\
    {%- for message in messages %}{{ message.content }}{%- endfor %}\
    {%- if add_generation_prompt %}{%- if thinking %}{{ '<｜Assistant｜><think>' }}\
    {%- else %}{{ '<｜Assistant｜></think>' }}{%- endif %}{%- endif %}";

/// DeepSeek-R1-0528: no switch; always `<think>\n` after the assistant tag.
const DEEPSEEK_R1_STYLE: &str = "{% for message in messages %}{{ message.content }}{% endfor %}\
    {% if add_generation_prompt %}{{ '<｜Assistant｜><think>\\n' }}{% endif %}";

/// GLM-4.5: `enable_thinking`, on by default; off writes `<think></think>`.
const GLM45_STYLE: &str = "{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}{%- endfor %}\
    {%- if add_generation_prompt -%}<|assistant|>\
    {%- if enable_thinking is defined and not enable_thinking -%}\n<think></think>{%- endif -%}\
    {%- endif -%}";

/// Llama 3: no reasoning at all.
const LLAMA3_STYLE: &str = "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\
    \n\n{{ m.content }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}\
    <|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";

#[test]
fn each_family_template_gives_its_switch() {
    let table: &[(&str, &str, ThinkingToggle)] = &[
        (
            "qwen3",
            QWEN3_STYLE,
            ThinkingToggle {
                key: Some(ToggleKey::EnableThinking),
                default_on: true,
                prefills_think: false,
            },
        ),
        (
            "qwen3 thinking",
            QWEN3_THINKING_STYLE,
            ThinkingToggle {
                key: None,
                default_on: false,
                prefills_think: true,
            },
        ),
        (
            "deepseek v3.1",
            DEEPSEEK_V31_STYLE,
            ThinkingToggle {
                key: Some(ToggleKey::Thinking),
                default_on: false,
                prefills_think: true,
            },
        ),
        (
            "deepseek r1",
            DEEPSEEK_R1_STYLE,
            ThinkingToggle {
                key: None,
                default_on: false,
                prefills_think: true,
            },
        ),
        (
            "glm45",
            GLM45_STYLE,
            ThinkingToggle {
                key: Some(ToggleKey::EnableThinking),
                default_on: true,
                prefills_think: false,
            },
        ),
        (
            "llama3",
            LLAMA3_STYLE,
            ThinkingToggle {
                key: None,
                default_on: false,
                prefills_think: false,
            },
        ),
    ];
    for (family, template, toggle) in table {
        assert_eq!(thinking_toggle(template), *toggle, "{family}");
    }
}

#[test]
fn a_default_false_filter_means_off_by_default() {
    let template = "{% if thinking | default(false) %}x{% endif %}";
    let toggle = thinking_toggle(template);
    assert_eq!(toggle.key, Some(ToggleKey::Thinking));
    assert!(!toggle.default_on);
}

fn kwargs(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

#[test]
fn the_preference_reads_the_template_key_then_reasoning_effort() {
    let qwen3 = thinking_toggle(QWEN3_STYLE);
    let v31 = thinking_toggle(DEEPSEEK_V31_STYLE);
    let off = kwargs(json!({"enable_thinking": false}));
    let on_other_key = kwargs(json!({"thinking": true}));
    let not_a_bool = kwargs(json!({"enable_thinking": "no"}));
    assert_eq!(thinking_preference(&qwen3, Some(&off), None), Some(false));
    // The other family's key is ignored.
    assert_eq!(thinking_preference(&qwen3, Some(&on_other_key), None), None);
    assert_eq!(
        thinking_preference(&v31, Some(&on_other_key), None),
        Some(true)
    );
    assert_eq!(thinking_preference(&qwen3, Some(&not_a_bool), None), None);
    assert_eq!(thinking_preference(&qwen3, None, Some("none")), Some(false));
    assert_eq!(
        thinking_preference(&qwen3, None, Some("minimal")),
        Some(false)
    );
    assert_eq!(thinking_preference(&qwen3, None, Some("high")), None);
    // kwargs win over reasoning_effort.
    let on = kwargs(json!({"enable_thinking": true}));
    assert_eq!(
        thinking_preference(&qwen3, Some(&on), Some("none")),
        Some(true)
    );
    // No switch, no preference.
    let r1 = thinking_toggle(DEEPSEEK_R1_STYLE);
    assert_eq!(thinking_preference(&r1, Some(&off), Some("none")), None);
}

/// (parser, template switch, chat_template_kwargs, reasoning_effort, starts inside)
type StartCase<'a> = (
    &'a str,
    &'a ThinkingToggle,
    Option<&'a Map<String, Value>>,
    Option<&'a str>,
    bool,
);

#[test]
fn where_the_output_starts_for_each_request() {
    let qwen3 = thinking_toggle(QWEN3_STYLE);
    let v31 = thinking_toggle(DEEPSEEK_V31_STYLE);
    let r1 = thinking_toggle(DEEPSEEK_R1_STYLE);
    let thinking_style = thinking_toggle(QWEN3_THINKING_STYLE);
    let llama = thinking_toggle(LLAMA3_STYLE);
    let v31_on = kwargs(json!({"thinking": true}));
    let v31_off = kwargs(json!({"thinking": false}));
    let table: &[StartCase] = &[
        // Qwen3 writes <think> itself: the parser sees it, never starts inside.
        ("qwen3", &qwen3, None, None, false),
        // DeepSeek-V3.1: off by default; on, the prompt opened the block.
        ("deepseek_v31", &v31, None, None, false),
        ("deepseek_v31", &v31, Some(&v31_on), None, true),
        ("deepseek_v31", &v31, Some(&v31_on), Some("none"), true),
        ("deepseek_v31", &v31, Some(&v31_off), None, false),
        ("deepseek_v31", &v31, None, Some("high"), false),
        // Models that always think start inside whatever the request says.
        ("deepseek_r1", &r1, None, None, true),
        ("deepseek_r1", &r1, None, Some("none"), true),
        ("qwen3_thinking", &thinking_style, None, None, true),
        ("kimi_thinking", &llama, None, None, true),
        // A prefilled <think> with no switch: thinking is on.
        ("qwen3", &thinking_style, None, None, true),
        ("passthrough", &r1, None, None, false),
        ("no_such_parser", &r1, None, None, false),
        ("glm45", &llama, None, None, false),
    ];
    for (parser, toggle, kwargs, effort, starts) in table {
        assert_eq!(
            starts_in_reasoning(parser, toggle, *kwargs, *effort),
            *starts,
            "{parser} {toggle:?} {kwargs:?} {effort:?}"
        );
    }
}

/// The family fixtures' own templates (tests/fixtures/models, written by
/// tests/fixtures/make_family_models.py) give their documented switches.
#[test]
fn the_family_fixture_templates_give_their_switches() {
    let off = ThinkingToggle {
        key: None,
        default_on: false,
        prefills_think: false,
    };
    let table: &[(&str, ThinkingToggle)] = &[
        (
            "qwen3",
            ThinkingToggle {
                key: Some(ToggleKey::EnableThinking),
                default_on: true,
                prefills_think: false,
            },
        ),
        ("qwen3-coder", off),
        ("llama3", off),
        ("mistral", off),
        (
            "deepseek-r1",
            ThinkingToggle {
                key: None,
                default_on: false,
                prefills_think: true,
            },
        ),
        (
            "deepseek-v3.1",
            ThinkingToggle {
                key: Some(ToggleKey::Thinking),
                default_on: false,
                prefills_think: true,
            },
        ),
        ("kimi-k2", off),
        (
            "glm45",
            ThinkingToggle {
                key: Some(ToggleKey::EnableThinking),
                default_on: true,
                prefills_think: false,
            },
        ),
    ];
    let models = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models");
    for (family, toggle) in table {
        let path = models.join(family).join("tokenizer_config.json");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
        let config: Value = serde_json::from_str(&text).expect("tokenizer_config.json is JSON");
        let template = config["chat_template"].as_str().expect("a chat template");
        assert_eq!(thinking_toggle(template), *toggle, "{family}");
    }
}
