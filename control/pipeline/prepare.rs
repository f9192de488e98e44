//! The Preparation stage: from a validated [`GenerationSpec`] to the token ids
//! and engine sampling every later stage uses. It resolves the model, renders
//! the chat template, tokenizes, checks the context length and turns stop
//! strings that are single tokens into `stop_token_ids` (engines reject string
//! stops; the gateway still trims the text itself). For a vision model, the
//! client's text is neutralized before it is rendered and tokenized, and the
//! prompt's multimodal tokens are counted against the attached images after
//! (see `super::media`, "Placeholders belong to the gateway").

use super::request_context::push_hex_u128;
use super::spec::{ChatPrompt, GenerationSpec, Prompt, ToolChoice};
use crate::engine::{Constraint, MediaItem, Sampling};
use crate::error::{Error, ErrorCode, Result, excerpt};
use crate::lanes::LaneDecision;
use crate::offload::Offload;
use crate::tokenizer::{ChatTemplateOptions, RenderBudget, Tokenizer, json_text_bytes};
use smg_dataplane::lanes::TensorLease;

use super::Endpoint;
use super::media::{MediaPlanner, Placeholders};
use super::parsing::{ModelParsers, OutputParsing};

/// The model a router serves, as clients name it.
#[derive(Debug, Clone)]
pub struct ServedModel {
    pub name: String,
    pub max_context_length: u32,
    pub vocab_size: u32,
    /// How its chat output is parsed into reasoning and tool calls.
    pub parsers: ModelParsers,
}

/// A request after Preparation.
#[derive(Debug, Clone)]
pub(crate) struct PreparedRequest {
    pub model: String,
    /// The id clients see; engine calls get `<id>-<attempt>`, after the
    /// client's own id when it sent one (see [`super::request_context`]).
    pub request_id: String,
    /// The client's request id (`x-request-id`), the engine ids' prefix.
    pub client_request_id: Option<std::sync::Arc<str>>,
    pub input_ids: Vec<u32>,
    pub prompt_text: String,
    pub media: Vec<MediaItem>,
    /// Per media item, the lease on its tensor's lane resources: held while
    /// attempts may still send it.
    pub leases: Vec<Option<TensorLease>>,
    pub sampling: Sampling,
    /// Tokens each sequence may have: `max_tokens` when asked, else what the
    /// context holds after the prompt. The engine client holds the worker's
    /// answer to it (`GenerateRequest::output_budget`).
    pub output_budget: u32,
    pub stop_strings: Vec<String>,
    pub stream: bool,
    pub logprobs: Option<u32>,
    /// How the output is split into reasoning, text and tool calls; `None`
    /// for plain text.
    pub parsing: Option<OutputParsing>,
    /// `X-SMG-Routing-Key`, for sticky policies.
    pub routing_key: Option<String>,
}

/// Prefix of the ids minted per endpoint, as OpenAI and Anthropic spell them.
fn id_prefix(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::ChatCompletions => "chatcmpl",
        Endpoint::Completions => "cmpl",
        Endpoint::Generate => "gen",
        Endpoint::Messages => "msg",
        Endpoint::Responses => "resp",
        Endpoint::Embeddings => "embd",
        Endpoint::Classify => "classify",
    }
}

/// A fresh request id for `endpoint`.
pub(crate) fn mint_request_id(endpoint: Endpoint) -> String {
    let prefix = id_prefix(endpoint);
    let mut id = String::with_capacity(prefix.len() + 33);
    id.push_str(prefix);
    id.push('-');
    push_hex_u128(&mut id, rand::random());
    id
}

/// Runs Preparation.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn prepare(
    endpoint: Endpoint,
    mut spec: GenerationSpec,
    model: &ServedModel,
    tokenizer: &Tokenizer,
    offload: &Offload,
    media: Option<&MediaPlanner>,
    lane: impl FnOnce() -> LaneDecision,
    routing_key: Option<String>,
) -> Result<PreparedRequest> {
    if let Some(asked) = spec.model.as_deref()
        && asked != model.name
    {
        return Err(Error::new(
            ErrorCode::ModelNotFound,
            format!(
                "model {:?} is not served here (serving {:?})",
                excerpt(asked),
                model.name
            ),
        )
        .with_param("model"));
    }
    let planner = match (spec.images.is_empty(), media) {
        (true, _) => None,
        (false, Some(planner)) => Some(planner),
        (false, None) => {
            return Err(Error::new(
                ErrorCode::UnsupportedMedia,
                "this model takes no images (the gateway has no vision preprocessing for it)",
            )
            .with_param("messages"));
        }
    };
    // A vision model's multimodal tokens, whatever the request attaches.
    let placeholders = media.map(MediaPlanner::placeholders);
    // The prompt is taken out of the spec: a chat's own work (its tools'
    // views, rendering, tokenizing) and the freeing of what it holds happen
    // where [`prepare_chat`] runs them.
    let prompt = std::mem::replace(&mut spec.prompt, Prompt::TokenIds(Vec::new()));
    let mut harmony_constraint = None;
    let (prompt_text, input_ids, parsing) = match prompt {
        Prompt::Text(text) => {
            // A raw prompt with images is written in the model's markup;
            // without, its placeholders are only text.
            let neutralize = placeholders.filter(|_| spec.images.is_empty());
            if Offload::is_small(text.len()) {
                let ids = encode_text(tokenizer, neutralize, &text)?;
                (text, ids, None)
            } else {
                let tokenizer = tokenizer.clone();
                let neutralize = neutralize.cloned();
                offload
                    .run(move || {
                        let ids = encode_text(&tokenizer, neutralize.as_ref(), &text)?;
                        Ok((text, ids, None))
                    })
                    .await?
            }
        }
        Prompt::TokenIds(ids) => {
            if let Some(bad) = ids.iter().find(|&&id| id >= model.vocab_size) {
                return Err(Error::invalid_parameter(
                    "prompt",
                    format!(
                        "token id {bad} is outside the vocabulary of {}",
                        model.vocab_size
                    ),
                ));
            }
            (String::new(), ids, None)
        }
        Prompt::Chat(chat) => {
            // A forced call or a response format on a Harmony model is held
            // by a structural tag over its own format, not the JSON schema
            // over the whole output other models get. (A chat's JSON schema
            // constraint comes only from those two: `single_constraint`
            // allowed one.)
            if model.parsers.harmony {
                harmony_constraint = super::tool_set::harmony_tool_constraint(
                    &chat.tool_choice,
                    chat.tools.definitions(),
                    chat.parallel_tool_calls,
                )?;
                if harmony_constraint.is_none()
                    && let Some(Constraint::JsonSchema(schema)) = &spec.sampling.constraint
                {
                    harmony_constraint = Some(super::tool_set::harmony_format_constraint(schema)?);
                }
            }
            prepare_chat(tokenizer, offload, placeholders, &model.parsers, chat).await?
        }
    };
    if let Some(placeholders) = placeholders {
        placeholders.check(&input_ids, spec.images.len())?;
    }
    let (input_ids, media_items, leases) = match planner {
        Some(planner) => {
            let planned = planner.plan(&spec.images, input_ids, &lane()).await?;
            (planned.input_ids, planned.items, planned.leases)
        }
        None => (input_ids, Vec::new(), Vec::new()),
    };
    if input_ids.is_empty() {
        return Err(Error::invalid_request("the prompt is empty").with_param("prompt"));
    }
    let wanted = input_ids.len() as u64 + u64::from(spec.sampling.max_new_tokens.unwrap_or(0));
    if input_ids.len() as u64 >= u64::from(model.max_context_length)
        || wanted > u64::from(model.max_context_length)
    {
        return Err(Error::new(
            ErrorCode::ContextLengthExceeded,
            format!(
                "the prompt has {} tokens and asks for {} more; the model's context holds {}",
                input_ids.len(),
                spec.sampling.max_new_tokens.unwrap_or(0),
                model.max_context_length
            ),
        )
        .with_param("max_tokens"));
    }
    let output_budget = output_budget(
        spec.sampling.max_new_tokens,
        model.max_context_length,
        input_ids.len(),
    );
    let mut sampling = spec.sampling;
    if harmony_constraint.is_some() {
        sampling.constraint = harmony_constraint;
    }
    for stop in &spec.stop_strings {
        if let Some(id) = tokenizer.single_token(stop)
            && !sampling.stop_token_ids.contains(&id)
        {
            sampling.stop_token_ids.push(id);
        }
    }
    sampling.n = sampling.n.max(1);
    Ok(PreparedRequest {
        model: model.name.clone(),
        request_id: spec.request_id.unwrap_or_else(|| mint_request_id(endpoint)),
        client_request_id: super::request_context::client_request_id(),
        input_ids,
        prompt_text,
        media: media_items,
        leases,
        sampling,
        output_budget,
        stop_strings: spec.stop_strings,
        stream: spec.stream,
        logprobs: spec.logprobs,
        parsing,
        routing_key,
    })
}

/// The ids of a raw prompt, its multimodal markup neutralized when given.
fn encode_text(
    tokenizer: &Tokenizer,
    neutralize: Option<&Placeholders>,
    text: &str,
) -> Result<Vec<u32>> {
    match neutralize {
        Some(placeholders) => tokenizer.encode(&placeholders.neutralize(text), true),
        None => tokenizer.encode(text, true),
    }
}

/// What a chat's template renders, and what its output is parsed by.
struct ChatInput {
    chat: ChatPrompt,
}

impl ChatInput {
    /// The text the template is handed, in bytes (strings and keys of the
    /// messages, the kwargs and the tools): what converting it for the
    /// template engine (the tools' view included), and the rendering's
    /// share proportional to it, cost.
    fn text_bytes(&self) -> usize {
        let chat = &self.chat;
        let tools = if self.template_has_tools() {
            chat.tools.text_bytes()
        } else {
            0
        };
        chat.messages.iter().map(json_text_bytes).sum::<usize>()
            + chat
                .template_kwargs
                .iter()
                .map(|(key, value)| key.len() + json_text_bytes(value))
                .sum::<usize>()
            + tools
    }

    /// `tool_choice: "none"` means no call: the model is not told about
    /// tools, so it writes no call markup to leak.
    fn template_has_tools(&self) -> bool {
        !self.chat.tools.is_empty() && self.chat.tool_choice != ToolChoice::None
    }

    /// What the template is handed besides the messages. The tools' view is
    /// built here, on the thread that renders, the first time a set is
    /// rendered.
    fn options(&self) -> ChatTemplateOptions {
        ChatTemplateOptions {
            add_generation_prompt: true,
            tools: self
                .template_has_tools()
                .then(|| self.chat.tools.template()),
            extra: self.chat.template_kwargs.clone(),
        }
    }

    /// Renders the prompt on `budget`; a vision model's placeholders are
    /// neutralized in the client's text first.
    fn render(
        &self,
        tokenizer: &Tokenizer,
        placeholders: Option<&Placeholders>,
        budget: RenderBudget,
    ) -> Result<String> {
        let mut options = self.options();
        match placeholders {
            Some(placeholders) => {
                let mut messages = self.chat.messages.clone();
                messages
                    .iter_mut()
                    .for_each(|message| placeholders.neutralize_json(message));
                options
                    .extra
                    .values_mut()
                    .for_each(|value| placeholders.neutralize_json(value));
                tokenizer.apply_chat_template_within(&messages, &options, budget)
            }
            None => tokenizer.apply_chat_template_within(&self.chat.messages, &options, budget),
        }
    }

    /// How the output of this chat is parsed (the tool-call parsers read
    /// the tools' schemas, built here on first use).
    fn parsing(&self, parsers: &ModelParsers) -> Option<OutputParsing> {
        OutputParsing::for_request(parsers, &self.chat)
    }
}

/// A chat's prompt text and ids, and how its output is parsed. A small
/// conversation (messages, kwargs and tools) is rendered on the request's
/// thread on the inline budget and, if that suffices and the prompt is
/// small, tokenized there too; anything larger, or a template needing more
/// than the inline budget, is rendered (again) and tokenized off the
/// request threads on the full budget (see `crate::offload`), where the
/// tools' views are built and the chat is freed as well.
async fn prepare_chat(
    tokenizer: &Tokenizer,
    offload: &Offload,
    placeholders: Option<&Placeholders>,
    parsers: &ModelParsers,
    chat: ChatPrompt,
) -> Result<(String, Vec<u32>, Option<OutputParsing>)> {
    let input = ChatInput { chat };
    if Offload::is_small(input.text_bytes()) {
        match input.render(tokenizer, placeholders, RenderBudget::Inline) {
            Ok(text) => {
                let parsing = input.parsing(parsers);
                return if Offload::is_small(text.len()) {
                    let ids = tokenizer.encode(&text, false)?;
                    Ok((text, ids, parsing))
                } else {
                    let tokenizer = tokenizer.clone();
                    offload
                        .run(move || {
                            let ids = tokenizer.encode(&text, false)?;
                            Ok((text, ids, parsing))
                        })
                        .await
                };
            }
            Err(err) if err.code == ErrorCode::ChatTemplateBudgetExceeded => {}
            Err(err) => return Err(err),
        }
    }
    let tokenizer = tokenizer.clone();
    let placeholders = placeholders.cloned();
    let parsers = parsers.clone();
    offload
        .run(move || {
            let text = input.render(&tokenizer, placeholders.as_ref(), RenderBudget::Full)?;
            let ids = tokenizer.encode(&text, false)?;
            let parsing = input.parsing(&parsers);
            Ok((text, ids, parsing))
        })
        .await
}

/// How many tokens each sequence may have: `max_tokens` when asked, else
/// what a context of `context` tokens holds after a prompt of `prompt`.
fn output_budget(max_tokens: Option<u32>, context: u32, prompt: usize) -> u32 {
    max_tokens.unwrap_or_else(|| {
        let left = u64::from(context).saturating_sub(prompt as u64);
        u32::try_from(left).unwrap_or(u32::MAX)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::error::ErrorCode;
    use serde_json::json;

    /// The fixture model's tokenizer with `template` as its chat template.
    fn with_template(template: &str) -> Tokenizer {
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/model");
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::copy(
            fixture.join("tokenizer.json"),
            dir.path().join("tokenizer.json"),
        )
        .expect("copied");
        std::fs::write(dir.path().join("chat_template.jinja"), template).expect("written");
        Tokenizer::from_model_dir(dir.path()).expect("loads")
    }

    fn chat(content: &str) -> ChatPrompt {
        ChatPrompt {
            messages: vec![json!({"role": "user", "content": content})],
            tools: super::super::tool_set::ToolSet::default(),
            tool_choice: ToolChoice::Auto,
            parallel_tool_calls: true,
            template_kwargs: serde_json::Map::new(),
            reasoning_effort: None,
            separate_reasoning: false,
        }
    }

    #[tokio::test]
    async fn a_template_past_the_inline_budget_is_rendered_again_on_the_full_one() {
        // About 200 000 fuel: more than a first try on the request's thread
        // may spend, well within the default budget.
        let tokenizer = with_template(
            "{% for i in range(1000) %}{% for j in range(100) %}{% endfor %}{% endfor %}\
             {{ messages[0].content }}",
        );
        let offload = Offload::new(1);
        let parsers = ModelParsers::default();
        let (text, ids, _) = prepare_chat(&tokenizer, &offload, None, &parsers, chat("hello"))
            .await
            .expect("rendered off the request thread");
        assert_eq!(text, "hello");
        assert_eq!(ids, tokenizer.encode("hello", false).expect("encodes"));

        // Past the full budget it is the client's error.
        let small =
            tokenizer.with_template_budget(crate::tokenizer::TemplateBudget { fuel: 150_000 });
        let err = prepare_chat(&small, &offload, None, &parsers, chat("hello"))
            .await
            .expect_err("over 150 000 fuel");
        assert_eq!(err.code, ErrorCode::ChatTemplateBudgetExceeded);
        assert!(err.message.contains("150000"), "{}", err.message);
        assert_eq!(offload.running() + offload.waiting(), 0);
    }

    #[tokio::test]
    async fn large_chats_and_small_ones_give_the_same_ids_as_rendering_directly() {
        let tokenizer = with_template("<{{ messages[0].content }}>");
        let offload = Offload::new(1);
        let parsers = ModelParsers::default();
        for content in [
            "short".to_owned(),
            "long text ".repeat(Offload::INLINE_BYTES / 5),
        ] {
            let (text, ids, _) = prepare_chat(&tokenizer, &offload, None, &parsers, chat(&content))
                .await
                .expect("renders");
            assert_eq!(text, format!("<{content}>"));
            assert_eq!(ids, tokenizer.encode(&text, false).expect("encodes"));
        }
    }

    #[test]
    fn the_output_budget_is_max_tokens_else_the_context_left() {
        assert_eq!(output_budget(Some(16), 4096, 100), 16);
        assert_eq!(output_budget(None, 4096, 100), 3996);
        assert_eq!(output_budget(None, 4096, 5000), 0);
    }
}
