//! The family test models under `tests/fixtures/models/` load with the
//! gateway's tokenizer code, keep each family marker as one token, and render
//! their chat templates exactly as Hugging Face `transformers`'
//! `apply_chat_template` did when the fixtures were generated
//! (`example.json`, written by `tests/fixtures/make_family_models.py`; CI
//! checks it against `transformers` again with
//! `scripts/hf_chat_templates.sh`), on conversations with tools, tool calls
//! (parallel ones, arguments as objects and as JSON text), tool results,
//! reasoning under its several names, null fields and no tools, for every
//! `chat_template_kwargs` setting. Each example is also rendered through a
//! probe template that prints what it was given (every message key, the
//! special tokens, `tools`, `documents`, the kwargs), so a difference in
//! what reaches a template shows even where a family's template would
//! hide it.

use std::path::PathBuf;

use serde_json::{Map, Value};
use smg::tokenizer::{ChatTemplateOptions, RenderBudget, TemplateBudget, TemplateTools, Tokenizer};

/// Every family directory the generator writes (hand-typed: a family that
/// goes missing fails here).
const FAMILIES: &[&str] = &[
    "qwen3",
    "qwen3-coder",
    "llama3",
    "mistral",
    "deepseek-r1",
    "deepseek-v3.1",
    "kimi-k2",
    "glm45",
    "gpt-oss",
];

/// Families whose templates write tool-call arguments as one JSON text (the
/// others write them key by key).
const JSON_ARGUMENT_FAMILIES: &[&str] = &[
    "qwen3",
    "llama3",
    "mistral",
    "deepseek-r1",
    "deepseek-v3.1",
    "kimi-k2",
    "gpt-oss",
];

fn family_dir(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/models")
        .join(family)
}

fn read_json(family: &str, file: &str) -> Value {
    let path = family_dir(family).join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
    serde_json::from_str(&text)
        .unwrap_or_else(|err| panic!("{} is not JSON: {err}", path.display()))
}

fn load(family: &str) -> Tokenizer {
    Tokenizer::from_model_dir(&family_dir(family))
        .unwrap_or_else(|err| panic!("{family} does not load: {err:?}"))
}

/// The probe template: prints what it is given instead of a prompt.
fn probe_template() -> String {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/probe_chat_template.jinja");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()))
}

/// The conversations every example.json holds (hand-typed: one that goes
/// missing fails here).
const CONVERSATIONS: &[&str] = &[
    "agent_step",
    "follow_up",
    "parallel_text_arguments",
    "no_tools",
    "reasoning_named_reasoning",
];

/// Where smg's rendering parts from `transformers`', for a readable failure.
fn first_difference(smg: &str, transformers: &str) -> String {
    let (ours, theirs): (Vec<&str>, Vec<&str>) =
        (smg.lines().collect(), transformers.lines().collect());
    let line = ours
        .iter()
        .zip(&theirs)
        .position(|(a, b)| a != b)
        .unwrap_or(ours.len().min(theirs.len()));
    format!(
        "line {}: smg {:?}, transformers {:?}",
        line + 1,
        ours.get(line),
        theirs.get(line)
    )
}

fn options(tools: &Value, kwargs: &Value) -> ChatTemplateOptions {
    ChatTemplateOptions {
        add_generation_prompt: true,
        tools: tools.as_array().map(|tools| TemplateTools::new(tools)),
        extra: kwargs.as_object().cloned().unwrap_or_default(),
    }
}

fn messages_of(conversation: &Value) -> Vec<Value> {
    conversation["messages"]
        .as_array()
        .expect("example messages are a list")
        .clone()
}

#[test]
fn every_family_renders_its_examples_as_transformers_did() {
    let probe_source = probe_template();
    for family in FAMILIES {
        let tokenizer = load(family);
        let probe = tokenizer
            .clone()
            .with_chat_template(&probe_source)
            .expect("the probe template compiles");
        let example = read_json(family, "example.json");
        let conversations = example["conversations"].as_array().expect("conversations");
        let names: Vec<&str> = conversations
            .iter()
            .map(|conversation| conversation["name"].as_str().expect("a name"))
            .collect();
        assert_eq!(names, CONVERSATIONS, "{family}");
        for conversation in conversations {
            let messages = messages_of(conversation);
            let tools = if conversation["with_tools"] == Value::Bool(true) {
                &example["tools"]
            } else {
                &Value::Null
            };
            let renderings = conversation["renderings"].as_array().expect("renderings");
            assert!(
                renderings.len() >= 2,
                "{family}: the default and a custom kwarg"
            );
            for rendering in renderings {
                let options = options(tools, &rendering["chat_template_kwargs"]);
                let what = format!(
                    "{family} {} {}",
                    conversation["name"], rendering["chat_template_kwargs"]
                );
                let prompt = tokenizer
                    .apply_chat_template(&messages, &options)
                    .unwrap_or_else(|err| panic!("{what} does not render: {err:?}"));
                let expected = rendering["prompt"].as_str().expect("a prompt");
                assert!(
                    prompt == expected,
                    "{what}: {}",
                    first_difference(&prompt, expected)
                );
                let given = probe
                    .apply_chat_template(&messages, &options)
                    .unwrap_or_else(|err| panic!("{what}: the probe does not render: {err:?}"));
                let expected = rendering["probe"].as_str().expect("a probe rendering");
                assert!(
                    given == expected,
                    "{what}, what the template is given: {}",
                    first_difference(&given, expected)
                );
            }
        }
    }
}

/// OpenAI clients send a call's arguments as a JSON string: every template
/// renders that too; JSON-style families write it verbatim.
#[test]
fn arguments_sent_as_json_text_render_too() {
    for family in FAMILIES {
        let tokenizer = load(family);
        let example = read_json(family, "example.json");
        let conversation = &example["conversations"][1];
        let mut messages = messages_of(conversation);
        let mut texts = Vec::new();
        for message in &mut messages {
            let Some(calls) = message.get_mut("tool_calls").and_then(Value::as_array_mut) else {
                continue;
            };
            for call in calls {
                let arguments = &mut call["function"]["arguments"];
                let text = serde_json::to_string(arguments).expect("serializes");
                *arguments = Value::String(text.clone());
                texts.push(text);
            }
        }
        assert!(!texts.is_empty(), "{family}: the example has tool calls");
        let prompt = tokenizer
            .apply_chat_template(&messages, &options(&example["tools"], &Value::Null))
            .unwrap_or_else(|err| panic!("{family} does not render string arguments: {err:?}"));
        if JSON_ARGUMENT_FAMILIES.contains(family) {
            for text in &texts {
                assert!(
                    prompt.contains(text.as_str()),
                    "{family}: {text} in {prompt}"
                );
            }
        }
    }
}

#[test]
fn every_added_token_is_one_id_and_prompts_round_trip() {
    for family in FAMILIES {
        let tokenizer = load(family);
        let config = read_json(family, "tokenizer_config.json");
        let added: &Map<String, Value> = config["added_tokens_decoder"]
            .as_object()
            .expect("added_tokens_decoder");
        assert!(!added.is_empty(), "{family}");
        for (id, token) in added {
            let id: u32 = id.parse().expect("a numeric id");
            let content = token["content"].as_str().expect("content");
            assert_eq!(tokenizer.token_id(content), Some(id), "{family} {content}");
            assert_eq!(
                tokenizer.encode(content, false).expect("encodes"),
                vec![id],
                "{family}: {content} is one token"
            );
            assert_eq!(
                tokenizer.is_special(id),
                token["special"] == Value::Bool(true),
                "{family} {content}"
            );
        }
        assert!(!tokenizer.eos_token_ids().is_empty(), "{family}");
        let example = read_json(family, "example.json");
        for conversation in example["conversations"].as_array().expect("conversations") {
            for rendering in conversation["renderings"].as_array().expect("renderings") {
                let prompt = rendering["prompt"].as_str().expect("a prompt");
                let ids = tokenizer.encode(prompt, false).expect("encodes");
                assert_eq!(
                    tokenizer.decode(&ids, false).expect("decodes"),
                    prompt,
                    "{family}"
                );
            }
        }
    }
}

/// A message the template does not know is refused with the template's own
/// words, not a crash.
#[test]
fn an_unknown_role_is_refused_by_every_template() {
    for family in FAMILIES {
        let tokenizer = load(family);
        let messages = vec![
            serde_json::json!({"role": "user", "content": "hi"}),
            serde_json::json!({"role": "narrator", "content": "meanwhile"}),
        ];
        let err = tokenizer
            .apply_chat_template(&messages, &ChatTemplateOptions::default())
            .expect_err("an unknown role is refused");
        assert!(format!("{err:?}").contains("narrator"), "{family}: {err:?}");
    }
}

/// The default `--chat-template-fuel` leaves every family template ample
/// headroom: a 200-message agent conversation with tools, and one 8 MB
/// message, each render on a twentieth of it; the example conversations
/// fit the budget of a first try on the request's thread.
#[test]
fn every_family_renders_large_conversations_well_within_the_default_budget() {
    let twentieth = TemplateBudget {
        fuel: TemplateBudget::DEFAULT_FUEL / 20,
    };
    for family in FAMILIES {
        let tokenizer = load(family).with_template_budget(twentieth);
        let example = read_json(family, "example.json");
        let options = options(&example["tools"], &Value::Null);
        let turns: Vec<Value> = messages_of(&example["conversations"][1])
            .into_iter()
            .filter(|message| message["role"] != "system")
            .collect();
        let long: Vec<Value> = turns.iter().cycle().take(200).cloned().collect();
        let prompt = tokenizer
            .apply_chat_template(&long, &options)
            .unwrap_or_else(|err| panic!("{family}: 200 messages: {err:?}"));
        assert!(prompt.len() > 10_000, "{family}");
        let huge = vec![serde_json::json!({
            "role": "user",
            "content": "lorem ipsum dolor sit amet ".repeat((8 << 20) / 27),
        })];
        let prompt = tokenizer
            .apply_chat_template(&huge, &options)
            .unwrap_or_else(|err| panic!("{family}: an 8 MB message: {err:?}"));
        assert!(prompt.len() > 8 << 20, "{family}");
        for conversation in example["conversations"].as_array().expect("conversations") {
            tokenizer
                .apply_chat_template_within(
                    &messages_of(conversation),
                    &options,
                    RenderBudget::Inline,
                )
                .unwrap_or_else(|err| panic!("{family} on the inline budget: {err:?}"));
        }
    }
}

/// A template that loops for ever fails with the budget's code once its
/// fuel is spent, whatever family's files it comes with.
#[test]
fn a_looping_template_runs_out_of_fuel() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for file in ["tokenizer.json", "tokenizer_config.json", "config.json"] {
        std::fs::copy(family_dir("qwen3").join(file), dir.path().join(file)).expect("copied");
    }
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ j }}{% endfor %}{% endfor %}",
    )
    .expect("written");
    let tokenizer = Tokenizer::from_model_dir(dir.path())
        .expect("loads")
        .with_template_budget(TemplateBudget { fuel: 100_000 });
    let err = tokenizer
        .apply_chat_template(&[], &ChatTemplateOptions::default())
        .expect_err("out of fuel");
    assert_eq!(err.code, smg::error::ErrorCode::ChatTemplateBudgetExceeded);
    assert!(
        err.message.contains("--chat-template-fuel"),
        "{}",
        err.message
    );
}
