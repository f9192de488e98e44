//! Chat templates, rendered the way Hugging Face's `apply_chat_template`
//! renders them.
//!
//! A model ships its prompt format as a Jinja template, and the engine only
//! sees the rendered string: a prompt that differs by one newline from what
//! `transformers` would produce is a different prompt to the model. So this
//! file reproduces the Jinja environment `transformers` builds: `trim_blocks`
//! and `lstrip_blocks` on, `keep_trailing_newline` off, `raise_exception`,
//! HF's own `tojson`, `strftime_now`, Python string methods, and the same
//! variables (`messages`, `tools`, `documents`, `add_generation_prompt`, the
//! special tokens by name, and the request's `chat_template_kwargs`), with
//! the messages changed as `apply_chat_template` changes them (see
//! [`as_transformers_passes`]). The reference is the `transformers` version
//! pinned in `scripts/hf_chat_templates.sh`, which checks the family
//! fixtures' renderings against it.
//!
//! Templates are compiled once, when the tokenizer loads; rendering a request
//! only runs the compiled template.
//!
//! A template is a program, and it runs on what the client sent: a template
//! that loops far beyond what the conversation needs (by design, by
//! accident, or driven there by the request's messages, tools or
//! `chat_template_kwargs`) would hold a thread for as long as it likes. So
//! every rendering runs on a budget of minijinja *fuel* (about one unit per
//! instruction and per 64 bytes of data produced; see [`TemplateBudget`]),
//! and one that runs out fails with `chat_template_budget_exceeded` naming
//! `--chat-template-fuel`. Recursion is capped too (minijinja's own depth
//! limit, set explicitly so that it cannot silently grow).
//!
//! Each template is compiled into two environments that differ only in
//! fuel: the full budget, and a small one for a first try on the request's
//! own thread (see `crate::offload`): a template that needs more than the
//! small budget is rendered again, off the request threads, with the full
//! one.

use std::borrow::Cow;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Serde, Value as JinjaValue, merge_maps};
use minijinja::{Environment, ErrorKind, Template};
use serde_json::{Map, Value};

use super::python_compat;
use crate::error::{Error, ErrorCode, Result};

/// The template used when a model lists several (and the one name a single
/// template is stored under).
const DEFAULT_TEMPLATE: &str = "default";
/// The template Hugging Face prefers when the request carries tools and the
/// model lists one under this name.
const TOOL_USE_TEMPLATE: &str = "tool_use";

/// What a request adds to the messages when rendering its prompt.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatTemplateOptions {
    /// End the prompt with the header of an assistant turn.
    pub add_generation_prompt: bool,
    /// The tool schemas, exposed to the template as `tools` (`none` when absent).
    pub tools: Option<TemplateTools>,
    /// `chat_template_kwargs`: extra variables. They cannot replace
    /// `messages`, `tools` or `add_generation_prompt`, but do override a
    /// special token of the same name, as in `transformers`.
    pub extra: Map<String, Value>,
}

/// A request's tools as chat templates read them: a list of mappings,
/// converted once, each carrying its `tojson` text (see
/// [`python_compat::DumpedMap`]). Cheap to clone; one value serves every
/// request that sends the same tools.
#[derive(Debug, Clone, PartialEq)]
pub struct TemplateTools(JinjaValue, usize);

impl TemplateTools {
    /// `tools`: OpenAI-shaped tool definitions.
    pub fn new(tools: &[Value]) -> Self {
        let items: Vec<JinjaValue> = tools
            .iter()
            .map(|tool| python_compat::DumpedMap::wrap(JinjaValue::from(Serde(tool))))
            .collect();
        let text_bytes = tools.iter().map(json_text_bytes).sum();
        Self(JinjaValue::from(items), text_bytes)
    }

    /// The bytes of text in them (see [`json_text_bytes`]).
    pub fn text_bytes(&self) -> usize {
        self.1
    }
}

/// What one rendering of a chat template may spend, in minijinja fuel:
/// about one unit per instruction executed and per 64 bytes of data the
/// template produces or processes (its output included). A budget bounds
/// both the time a rendering takes and the memory it allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateBudget {
    /// The fuel of one rendering (`--chat-template-fuel`).
    pub fuel: u64,
}

impl TemplateBudget {
    /// `--chat-template-fuel`'s default. The bundled family templates spend
    /// 60 to 1200 fuel per message of an agent conversation with tools (200
    /// messages: 11 000 to 230 000) and, on long text, about 1 per 16 to
    /// 20 bytes of it (each template reads, trims and writes the text a few
    /// times): an 8 MB message takes 330 000 to 440 000. 20 million leaves
    /// room for prompts of about 300 MB, and a template that only loops
    /// spends it in well under a second of one core (about 30 million fuel
    /// a second on the machine `BENCHMARKS.md` describes).
    pub const DEFAULT_FUEL: u64 = 20_000_000;

    /// The fuel of the first try on a request's own thread, about 3 ms of
    /// looping at most: an ordinary conversation fits (200 messages with
    /// tools take 11 000 to 20 000 with most families); a template that
    /// needs more is rendered again off the request threads on the full
    /// budget.
    pub const INLINE_FUEL: u64 = 100_000;
}

impl Default for TemplateBudget {
    fn default() -> Self {
        Self {
            fuel: Self::DEFAULT_FUEL,
        }
    }
}

/// The deepest a template may recurse (macros calling macros, nested
/// loops): minijinja's own default and its safe maximum without growing
/// the stack, set explicitly.
const RECURSION_LIMIT: usize = 500;

/// Which budget a rendering runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenderBudget {
    /// [`TemplateBudget::INLINE_FUEL`] (or the full budget when that is
    /// smaller): running out is not the client's fault yet, only a sign
    /// that the rendering belongs off the request threads.
    Inline,
    /// The full [`TemplateBudget`].
    Full,
}

/// The bytes of text in a JSON value: its strings and keys, 8 per number,
/// 4 per `null` or boolean, punctuation not counted. What sizes a template's
/// input (see `crate::offload`) without serializing it.
pub fn json_text_bytes(value: &Value) -> usize {
    match value {
        Value::Null | Value::Bool(_) => 4,
        Value::Number(_) => 8,
        Value::String(text) => text.len(),
        Value::Array(items) => items.iter().map(json_text_bytes).sum(),
        Value::Object(map) => map
            .iter()
            .map(|(key, value)| key.len() + json_text_bytes(value))
            .sum(),
    }
}

/// A model's compiled chat template(s).
///
/// Public (re-exported from `tokenizer`) so that the fuzz target
/// `chat_template` (`fuzz/`) can compile and render arbitrary template
/// sources in exactly this environment; the gateway itself reaches it only
/// through [`Tokenizer`](super::Tokenizer).
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    /// Runs on the full budget.
    environment: Environment<'static>,
    /// The same templates on the inline budget.
    inline: Environment<'static>,
    budget: TemplateBudget,
    /// `bos_token`, `eos_token`, ... as template variables.
    special_tokens: JinjaValue,
    /// The templates' sources, for reading a model's conventions off them
    /// (its tool-call markup, its thinking switch).
    sources: String,
    /// Whether one is named `tool_use` (known once, not asked of the
    /// environment on every request with tools: a failed lookup builds an
    /// error).
    has_tool_use: bool,
}

/// The error `raise_exception` fails rendering with, so that its message can
/// be told apart from the template engine's own errors.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct RaisedByTemplate(String);

impl ChatTemplate {
    /// Compiles one template, e.g. the contents of `chat_template.jinja`.
    pub fn compile(source: String, special_tokens: &Map<String, Value>) -> Result<Self> {
        Self::compile_named(vec![(DEFAULT_TEMPLATE.to_owned(), source)], special_tokens)
    }

    /// Compiles `tokenizer_config.json`'s `chat_template` field: a template
    /// string, or a list of `{"name": ..., "template": ...}`.
    pub fn from_config_field(field: &Value, special_tokens: &Map<String, Value>) -> Result<Self> {
        let malformed = || {
            Error::internal(
                "tokenizer_config.json's chat_template must be a string or a list of \
                 {\"name\", \"template\"} objects",
            )
        };
        let named = match field {
            Value::String(source) => vec![(DEFAULT_TEMPLATE.to_owned(), source.clone())],
            Value::Array(entries) => entries
                .iter()
                .map(|entry| {
                    let name = entry.get("name").and_then(Value::as_str);
                    let source = entry.get("template").and_then(Value::as_str);
                    match (name, source) {
                        (Some(name), Some(source)) => Ok((name.to_owned(), source.to_owned())),
                        _ => Err(malformed()),
                    }
                })
                .collect::<Result<_>>()?,
            _ => return Err(malformed()),
        };
        Self::compile_named(named, special_tokens)
    }

    fn compile_named(
        named_sources: Vec<(String, String)>,
        special_tokens: &Map<String, Value>,
    ) -> Result<Self> {
        let mut environment = huggingface_environment()?;
        let sources = named_sources
            .iter()
            .map(|(_, source)| source.as_str())
            .collect::<Vec<_>>()
            .join("\n");
        let has_tool_use = named_sources
            .iter()
            .any(|(name, _)| name == TOOL_USE_TEMPLATE);
        for (name, source) in named_sources {
            environment
                .add_template_owned(name.clone(), source)
                .map_err(|err| {
                    Error::internal(format!("chat template {name:?} does not compile: {err}"))
                })?;
        }
        let budget = TemplateBudget::default();
        Ok(Self {
            inline: environment.clone(),
            environment,
            budget,
            special_tokens: JinjaValue::from(Serde(special_tokens)),
            sources,
            has_tool_use,
        }
        .with_budget(budget))
    }

    /// The same templates with `budget`.
    pub fn with_budget(mut self, budget: TemplateBudget) -> Self {
        self.budget = budget;
        self.environment.set_fuel(Some(budget.fuel));
        self.inline
            .set_fuel(Some(budget.fuel.min(TemplateBudget::INLINE_FUEL)));
        self
    }

    /// The budget of one rendering.
    pub fn budget(&self) -> TemplateBudget {
        self.budget
    }

    /// Every template's source text, joined.
    pub fn sources(&self) -> &str {
        &self.sources
    }

    /// Renders the prompt for `messages`. A template that refuses the
    /// conversation (`raise_exception`, or a failure on the request's data)
    /// is the client's problem: [`ErrorCode::InvalidRequest`] carrying the
    /// template's own message.
    ///
    /// A rendering that runs out of `budget` fails with
    /// [`ErrorCode::ChatTemplateBudgetExceeded`].
    ///
    /// [`ErrorCode::InvalidRequest`]: crate::error::ErrorCode::InvalidRequest
    /// [`ErrorCode::ChatTemplateBudgetExceeded`]: crate::error::ErrorCode::ChatTemplateBudgetExceeded
    #[cfg(test)]
    pub fn render(&self, messages: &[Value], options: &ChatTemplateOptions) -> Result<String> {
        self.render_within(messages, options, RenderBudget::Full)
    }

    /// [`ChatTemplate::render`] on `budget`.
    pub fn render_within(
        &self,
        messages: &[Value],
        options: &ChatTemplateOptions,
        budget: RenderBudget,
    ) -> Result<String> {
        let environment = match budget {
            RenderBudget::Inline => &self.inline,
            RenderBudget::Full => &self.environment,
        };
        let template = Self::select(environment, self.has_tool_use && options.tools.is_some())?;
        let fixed = minijinja::context! {
            messages => Serde(as_transformers_passes(messages)),
            tools => options.tools.as_ref().map(|tools| tools.0.clone()),
            // `transformers` always passes it (RAG documents); smg has none.
            documents => (),
            add_generation_prompt => options.add_generation_prompt,
        };
        // The last map that has a name wins.
        let context = merge_maps([
            self.special_tokens.clone(),
            JinjaValue::from(Serde(&options.extra)),
            fixed,
        ]);
        template.render(context).map_err(|err| {
            if err.kind() == ErrorKind::OutOfFuel {
                return Error::new(
                    ErrorCode::ChatTemplateBudgetExceeded,
                    format!(
                        "rendering the chat template for this request took more than its \
                         budget of {} fuel (--chat-template-fuel)",
                        environment.fuel().unwrap_or(self.budget.fuel)
                    ),
                )
                .with_param("messages");
            }
            match raised_message(&err) {
                Some(message) => Error::invalid_request(message),
                None => Error::invalid_request(format!("the chat template failed: {err}")),
            }
        })
    }

    /// `tool_use` when the request has tools and the model has that
    /// template, else `default`, as `transformers` chooses.
    fn select<'env>(
        environment: &'env Environment<'static>,
        tool_use: bool,
    ) -> Result<Template<'env, 'env>> {
        if tool_use && let Ok(template) = environment.get_template(TOOL_USE_TEMPLATE) {
            return Ok(template);
        }
        environment.get_template(DEFAULT_TEMPLATE).map_err(|_| {
            let names: Vec<&str> = environment.templates().map(|(name, _)| name).collect();
            Error::invalid_request(format!(
                "the model lists chat templates {names:?} but none named {DEFAULT_TEMPLATE:?}"
            ))
        })
    }
}

/// The names a message's reasoning arrives under, in the order
/// `transformers` takes the first one set.
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// The messages as `transformers`' `apply_chat_template` hands them to the
/// template: a key whose value is null is left out (OpenAI clients send
/// `"content": null` beside `tool_calls`, `"tool_calls": null`, ...; to a
/// template that is `undefined`, not `none`), and a message's reasoning,
/// under whichever of [`REASONING_FIELDS`] it came, is also given as
/// `reasoning_content` (what most templates read) and `thinking` (what
/// gpt-oss's reads), in `transformers`' key order. Messages that need
/// neither are passed as they are, uncopied.
fn as_transformers_passes(messages: &[Value]) -> Vec<Cow<'_, Value>> {
    messages
        .iter()
        .map(|message| match message {
            Value::Object(fields) if needs_changes(fields) => {
                Cow::Owned(Value::Object(transformers_message(fields)))
            }
            _ => Cow::Borrowed(message),
        })
        .collect()
}

fn needs_changes(fields: &Map<String, Value>) -> bool {
    fields.values().any(Value::is_null) || reasoning_of(fields).is_some()
}

/// The first of [`REASONING_FIELDS`] that is set (not null).
fn reasoning_of(fields: &Map<String, Value>) -> Option<&Value> {
    REASONING_FIELDS
        .iter()
        .find_map(|name| fields.get(*name).filter(|value| !value.is_null()))
}

fn transformers_message(fields: &Map<String, Value>) -> Map<String, Value> {
    let set = fields.iter().filter(|(_, value)| !value.is_null());
    let Some(reasoning) = reasoning_of(fields) else {
        return set
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
    };
    // `{"thinking": reasoning, **message, "reasoning_content": reasoning}`:
    // a `thinking` of the message's own keeps the first place and its value.
    let mut message = Map::with_capacity(fields.len() + 2);
    message.insert("thinking".to_owned(), reasoning.clone());
    message.extend(set.map(|(key, value)| (key.clone(), value.clone())));
    message.insert("reasoning_content".to_owned(), reasoning.clone());
    message
}

/// The Jinja environment `transformers` renders chat templates in.
fn huggingface_environment() -> Result<Environment<'static>> {
    let mut environment = Environment::new();
    let syntax = SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(false)
        .build()
        .map_err(|err| Error::internal(format!("chat template syntax: {err}")))?;
    environment.set_syntax(syntax);
    environment.set_recursion_limit(RECURSION_LIMIT);
    environment.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    environment.add_filter("tojson", python_compat::tojson);
    environment.add_function("strftime_now", python_compat::strftime_now);
    environment.add_function("raise_exception", raise_exception);
    Ok(environment)
}

fn raise_exception(message: String) -> Result<JinjaValue, minijinja::Error> {
    Err(
        minijinja::Error::new(ErrorKind::InvalidOperation, message.clone())
            .with_source(RaisedByTemplate(message)),
    )
}

/// The message of a `raise_exception` call anywhere in the error's chain.
fn raised_message(err: &minijinja::Error) -> Option<String> {
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        if let Some(raised) = cause.downcast_ref::<RaisedByTemplate>() {
            return Some(raised.0.clone());
        }
        source = cause.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
    use serde_json::json;

    fn fixture_template() -> ChatTemplate {
        let config: Value = serde_json::from_str(include_str!(
            "../../tests/fixtures/model/tokenizer_config.json"
        ))
        .expect("the fixture tokenizer_config.json is JSON");
        ChatTemplate::from_config_field(&config["chat_template"], &fixture_special_tokens())
            .expect("the fixture template compiles")
    }

    fn fixture_special_tokens() -> Map<String, Value> {
        let mut tokens = Map::new();
        tokens.insert("eos_token".into(), json!("<|im_end|>"));
        tokens.insert("pad_token".into(), json!("<|endoftext|>"));
        tokens
    }

    fn hand_written(source: &str) -> ChatTemplate {
        ChatTemplate::compile(source.to_owned(), &fixture_special_tokens())
            .expect("the test template compiles")
    }

    fn with_generation_prompt() -> ChatTemplateOptions {
        ChatTemplateOptions {
            add_generation_prompt: true,
            ..ChatTemplateOptions::default()
        }
    }

    #[test]
    fn fixture_plain_text_gets_the_default_system_prompt() {
        let messages = [json!({"role": "user", "content": "Hi there"})];
        let prompt = fixture_template()
            .render(&messages, &ChatTemplateOptions::default())
            .expect("renders");
        assert_eq!(
            prompt,
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n\
             <|im_start|>user\nHi there<|im_end|>\n"
        );
    }

    #[test]
    fn fixture_generation_prompt_opens_an_assistant_turn() {
        let messages = [json!({"role": "user", "content": "Hi"})];
        let template = fixture_template();
        let with = template
            .render(&messages, &with_generation_prompt())
            .expect("renders");
        let without = template
            .render(&messages, &ChatTemplateOptions::default())
            .expect("renders");
        assert_eq!(with, format!("{without}<|im_start|>assistant\n"));
        assert!(!without.contains("<|im_start|>assistant"), "{without:?}");
    }

    #[test]
    fn fixture_system_message_replaces_the_default() {
        let messages = [
            json!({"role": "system", "content": "Be terse."}),
            json!({"role": "user", "content": "Hi"}),
            json!({"role": "assistant", "content": "Hello."}),
        ];
        let prompt = fixture_template()
            .render(&messages, &ChatTemplateOptions::default())
            .expect("renders");
        assert_eq!(
            prompt,
            "<|im_start|>system\nBe terse.<|im_end|>\n\
             <|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\nHello.<|im_end|>\n"
        );
    }

    #[test]
    fn fixture_image_part_becomes_vision_placeholders() {
        let messages = [json!({"role": "user", "content": [
            {"type": "text", "text": "What is this? "},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "text", "text": " Answer briefly."},
        ]})];
        let prompt = fixture_template()
            .render(&messages, &with_generation_prompt())
            .expect("renders");
        assert_eq!(
            prompt,
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n\
             <|im_start|>user\nWhat is this? <|vision_start|><|image_pad|><|vision_end|> \
             Answer briefly.<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn fixture_tools_are_listed_as_json_in_the_system_turn() {
        let tools = json!([{"type": "function", "function": {"name": "get_weather", "description": "Météo du jour"}}]);
        let options = ChatTemplateOptions {
            tools: Some(TemplateTools::new(tools.as_array().expect("a list"))),
            ..ChatTemplateOptions::default()
        };
        let messages = [json!({"role": "user", "content": "Weather?"})];
        let prompt = fixture_template()
            .render(&messages, &options)
            .expect("renders");
        // serde_json keeps object keys sorted, hence "function" before "type";
        // non-ASCII stays as is (ensure_ascii=False).
        assert_eq!(
            prompt,
            "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n\n\
             You can call the functions described below. To call one, answer with a JSON \
             object holding \"name\" and \"arguments\", wrapped in <tool_call></tool_call> tags.\n\n\
             <tools>\n\
             {\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Météo du jour\"}}\n\
             </tools><|im_end|>\n\
             <|im_start|>user\nWeather?<|im_end|>\n"
        );
    }

    #[test]
    fn fixture_bad_role_is_an_invalid_request_with_the_templates_message() {
        let messages = [json!({"role": "narrator", "content": "Once upon a time"})];
        let err = fixture_template()
            .render(&messages, &ChatTemplateOptions::default())
            .expect_err("the template refuses the role");
        assert_eq!(err.code, ErrorCode::InvalidRequest);
        assert_eq!(
            err.message,
            "Unsupported message role: narrator. Roles must be system, user, assistant or tool."
        );
    }

    #[test]
    fn raise_exception_inside_a_macro_keeps_its_message() {
        let template = hand_written(
            "{% macro check(m) %}{{ raise_exception('bad: ' ~ m.role) }}{% endmacro %}{{ check(messages[0]) }}",
        );
        let err = template
            .render(&[json!({"role": "x"})], &ChatTemplateOptions::default())
            .expect_err("raises");
        assert_eq!(err.code, ErrorCode::InvalidRequest);
        assert_eq!(err.message, "bad: x");
    }

    #[test]
    fn engine_errors_are_invalid_requests_naming_the_failure() {
        let template = hand_written("{{ messages[0].content.strip() }}");
        let err = template
            .render(
                &[json!({"role": "user", "content": 5})],
                &ChatTemplateOptions::default(),
            )
            .expect_err("an integer has no strip()");
        assert_eq!(err.code, ErrorCode::InvalidRequest);
        assert!(
            err.message.starts_with("the chat template failed: "),
            "{}",
            err.message
        );
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let template = hand_written(
            "{{ messages[0].data | tojson }}|{{ messages[0].data | tojson(indent=2) }}|\
             {{ 'é\"\\n' | tojson }}|{{ 'é' | tojson(ensure_ascii=true) }}|{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}",
        );
        let messages =
            [json!({"data": {"list": [1, 2.5, null, true], "empty": [], "text": "<b>&'"}})];
        let rendered = template
            .render(&messages, &ChatTemplateOptions::default())
            .expect("renders");
        let expected = [
            r#"{"list": [1, 2.5, null, true], "empty": [], "text": "<b>&'"}"#,
            "{\n  \"list\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"empty\": [],\n  \"text\": \"<b>&'\"\n}",
            r#""é\"\n""#,
            r#""\u00e9""#,
            r#"{"a": 2, "b": 1}"#,
        ]
        .join("|");
        assert_eq!(rendered, expected);
    }

    #[test]
    fn python_string_methods_and_loop_last_work() {
        let template = hand_written(
            "{% for m in messages %}{{ m.content.strip().upper() }}\
             {% if m.content.strip().startswith('b') %}!{% endif %}\
             {% if not loop.last %}, {% endif %}{% endfor %}|{{ 'a,b'.split(',') | length }}",
        );
        let messages = [
            json!({"content": "  alpha "}),
            json!({"content": "\tbeta\n"}),
        ];
        let rendered = template
            .render(&messages, &ChatTemplateOptions::default())
            .expect("renders");
        assert_eq!(rendered, "ALPHA, BETA!|2");
    }

    #[test]
    fn block_whitespace_is_trimmed_like_transformers() {
        // trim_blocks drops the newline after a block tag, lstrip_blocks the
        // indentation before it, and the template's final newline is dropped.
        let template = hand_written(
            "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\n",
        );
        let messages = [
            json!({"role": "user", "content": "a"}),
            json!({"role": "user", "content": "b"}),
        ];
        let rendered = template
            .render(&messages, &ChatTemplateOptions::default())
            .expect("renders");
        assert_eq!(rendered, "[a]\n[b]\n");
    }

    #[test]
    fn special_tokens_and_kwargs_are_variables() {
        let template = hand_written(
            "{{ eos_token }}/{{ pad_token }}/{{ bos_token }}/{{ enable_thinking }}/{{ messages | length }}",
        );
        let mut extra = Map::new();
        extra.insert("enable_thinking".into(), json!(false));
        extra.insert("pad_token".into(), json!("<pad-override>"));
        extra.insert("messages".into(), json!("cannot replace messages"));
        let options = ChatTemplateOptions {
            extra,
            ..ChatTemplateOptions::default()
        };
        let rendered = template
            .render(&[json!({"role": "user"})], &options)
            .expect("renders");
        // bos_token is unset in this model, so it is undefined (renders empty).
        // Booleans print as Python does.
        assert_eq!(rendered, "<|im_end|>/<pad-override>//False/1");
    }

    #[test]
    fn tools_are_none_when_absent() {
        let template = hand_written("{{ tools is none }}|{{ add_generation_prompt }}");
        let rendered = template
            .render(&[], &with_generation_prompt())
            .expect("renders");
        assert_eq!(rendered, "True|True");
    }

    #[test]
    fn list_form_picks_default_or_tool_use() {
        let field = json!([
            {"name": "tool_use", "template": "TOOLS {{ tools | length }}"},
            {"name": "default", "template": "PLAIN {{ messages | length }}"},
        ]);
        let template =
            ChatTemplate::from_config_field(&field, &Map::new()).expect("the list compiles");
        let plain = template
            .render(&[json!({})], &ChatTemplateOptions::default())
            .expect("renders");
        assert_eq!(plain, "PLAIN 1");
        let options = ChatTemplateOptions {
            tools: Some(TemplateTools::new(&[json!({}), json!({})])),
            ..ChatTemplateOptions::default()
        };
        let with_tools = template.render(&[], &options).expect("renders");
        assert_eq!(with_tools, "TOOLS 2");
    }

    #[test]
    fn list_form_without_default_is_refused_at_render() {
        let field = json!([{"name": "rag", "template": "x"}]);
        let template = ChatTemplate::from_config_field(&field, &Map::new()).expect("compiles");
        let err = template
            .render(&[], &ChatTemplateOptions::default())
            .expect_err("no default");
        assert_eq!(err.code, ErrorCode::InvalidRequest);
        assert!(err.message.contains("\"rag\""), "{}", err.message);
    }

    #[test]
    fn malformed_templates_fail_at_load() {
        let not_jinja = ChatTemplate::compile("{% for %}".into(), &Map::new())
            .expect_err("a for without a target does not compile");
        assert_eq!(not_jinja.code, ErrorCode::InternalError);
        let wrong_shape =
            ChatTemplate::from_config_field(&json!([{"name": "default"}]), &Map::new())
                .expect_err("an entry without a template");
        assert_eq!(wrong_shape.code, ErrorCode::InternalError);
        let wrong_type = ChatTemplate::from_config_field(&json!(7), &Map::new())
            .expect_err("a number is no template");
        assert_eq!(wrong_type.code, ErrorCode::InternalError);
    }

    #[test]
    fn a_template_looping_past_its_budget_fails_with_the_budget_code() {
        let budget = TemplateBudget { fuel: 50_000 };
        // A loop of ten billion steps, and a cubic loop over a thousand
        // messages: both stop once the fuel is spent.
        let endless = hand_written(
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        )
        .with_budget(budget);
        let cubic = hand_written(
            "{% for a in messages %}{% for b in messages %}{% for c in messages %}\
             {{ c.content }}{% endfor %}{% endfor %}{% endfor %}",
        )
        .with_budget(budget);
        let messages = vec![json!({"role": "user", "content": "x"}); 1000];
        for (template, messages) in [(&endless, &[][..]), (&cubic, &messages[..])] {
            let err = template
                .render(messages, &ChatTemplateOptions::default())
                .expect_err("out of fuel");
            assert_eq!(err.code, ErrorCode::ChatTemplateBudgetExceeded);
            assert_eq!(err.code.http_status(), 400);
            assert!(err.message.contains("50000 fuel"), "{}", err.message);
            assert!(
                err.message.contains("--chat-template-fuel"),
                "{}",
                err.message
            );
        }
    }

    #[test]
    fn the_inline_budget_is_the_smaller_one() {
        // About 200 000 fuel of looping: over the inline budget, within
        // the default.
        let template = hand_written(
            "{% for i in range(1000) %}{% for j in range(100) %}{% endfor %}{% endfor %}done",
        );
        assert_eq!(template.budget(), TemplateBudget::default());
        let inline = template
            .render_within(&[], &ChatTemplateOptions::default(), RenderBudget::Inline)
            .expect_err("over the inline budget");
        assert_eq!(inline.code, ErrorCode::ChatTemplateBudgetExceeded);
        let full = template
            .render_within(&[], &ChatTemplateOptions::default(), RenderBudget::Full)
            .expect("within the full budget");
        assert_eq!(full, "done");
        // A full budget below the inline one caps both.
        let small = template.with_budget(TemplateBudget { fuel: 10 });
        let err = small
            .render_within(&[], &ChatTemplateOptions::default(), RenderBudget::Inline)
            .expect_err("over 10 fuel");
        assert!(err.message.contains("budget of 10 fuel"), "{}", err.message);
    }

    #[test]
    fn endless_recursion_is_refused_not_a_crash() {
        let template =
            hand_written("{% macro down(n) %}{{ down(n + 1) }}{% endmacro %}{{ down(0) }}");
        let err = template
            .render(&[], &ChatTemplateOptions::default())
            .expect_err("recursion is capped");
        assert_eq!(err.code, ErrorCode::InvalidRequest);
        assert!(err.message.contains("recursion"), "{}", err.message);
    }

    /// As `transformers`' `apply_chat_template`: null keys are left out
    /// (undefined, not none), reasoning under any of its names is also
    /// `thinking` (first) and `reasoning_content`, and `documents` is none.
    #[test]
    fn messages_reach_the_template_as_transformers_hands_them() {
        let template = hand_written(
            "{% for m in messages %}{{ m | tojson }}|\
             {{ 'set' if m.content is defined else 'undefined' }}\n{% endfor %}\
             {{ documents | tojson }}",
        );
        let messages = [
            json!({"role": "user", "content": "hi", "name": null}),
            json!({"role": "assistant", "content": null, "reasoning": "r", "tool_calls": []}),
            json!({"role": "assistant", "content": "a", "thinking": "t", "reasoning_content": "c"}),
        ];
        let rendered = template
            .render(&messages, &ChatTemplateOptions::default())
            .expect("renders");
        // What transformers 5.23.0 renders for the same call.
        assert_eq!(
            rendered,
            "{\"role\": \"user\", \"content\": \"hi\"}|set\n\
             {\"thinking\": \"r\", \"role\": \"assistant\", \"reasoning\": \"r\", \
             \"tool_calls\": [], \"reasoning_content\": \"r\"}|undefined\n\
             {\"thinking\": \"t\", \"role\": \"assistant\", \"content\": \"a\", \
             \"reasoning_content\": \"c\"}|set\n\
             null"
        );
    }

    #[test]
    fn strftime_now_renders_the_current_year() {
        let template = hand_written("{{ strftime_now('%Y') }}");
        let rendered = template
            .render(&[], &ChatTemplateOptions::default())
            .expect("renders");
        let year: i32 = rendered.parse().expect("a year");
        assert!((2024..3000).contains(&year), "{rendered}");
    }
}
