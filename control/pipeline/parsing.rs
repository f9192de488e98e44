//! Output parsing: a sequence's decoded text becomes reasoning, answer text
//! and tool calls, for every dialect at once.
//!
//! Why it exists: in gRPC mode the engines send token ids only, so a
//! thinking model's `<think>…</think>` and a tool-calling model's markup come
//! back as plain text; recovering `reasoning_content` and `tool_calls` is the
//! gateway's job. It is done once, in ResponseProcessing, on the
//! dialect-neutral output stream, so OpenAI chat, Anthropic messages (and
//! the Responses API) format the same parsed events and cannot disagree.
//!
//! Per model the parsers are chosen once ([`ModelParsers::resolve`]): an
//! explicit per-model flag, else the global flag, else detection from the
//! model id and chat template (`smg_parsers::*::detect`). Per request
//! ([`OutputParsing::for_request`]):
//!
//! - reasoning is split off when the model has a reasoning parser and the
//!   request did not ask to keep it inline (`separate_reasoning: false`);
//!   whether the output starts inside a think block follows the template's
//!   thinking switch and the request's preference;
//! - tool calls are parsed when the request offers tools and `tool_choice`
//!   is not `none`: with the model's parser under `auto`, with the `json`
//!   parser under `required` (the engine was constrained to a JSON array of
//!   calls), and under a named function the whole output *is* the call's
//!   arguments (constrained to its schema). Without `parallel_tool_calls`
//!   only the first call is kept.
//!
//! Reasoning is parsed first and only its answer text reaches the tool
//! parser, so markup inside reasoning is never a call (Kimi's parsers
//! excepted: a tool section opened inside an unclosed think block ends it). One rule gives the
//! finish reason, streamed or not: a sequence that made a call and stopped
//! normally finished with `tool_calls` ([`SequenceParser::made_calls`]).
//!
//! A sequence that ran out of tokens (`length`) ends with
//! [`SequenceParser::finish_cut`]: a call it was still writing is not a
//! call (its markup and arguments so far are content, the same streamed or
//! not), held-back text is content and an unclosed think block is
//! reasoning. The finish reason stays `length`.
//!
//! # gpt-oss (Harmony)
//!
//! A model whose id names gpt-oss or whose template writes `<|channel|>`
//! ([`smg_parsers::harmony::detect`]) speaks Harmony: its output is a series
//! of messages whose headers say both what is reasoning and what is a call,
//! so one parser ([`smg_parsers::harmony`]) does both instead of the text
//! reasoning + tool pair. A per-model `--model-tool-call-parser` or
//! `--model-reasoning-parser` for the model overrides the detection (then
//! the text parsers apply as for any model; `passthrough` leaves the text
//! raw); the global flags do not, since they name text formats.
//!
//! Per request: `analysis` is reasoning (content with `separate_reasoning:
//! false`), `final` and preambles are content, and a message to
//! `functions.NAME` is a call (ids minted as for every model) when the
//! request offers tools and `tool_choice` is `auto`. With `tool_choice:
//! none` or no tools, such a message's body is content, without markers.
//! Messages to built-in tools (`python`, `browser.*`, `container.*`) are
//! dropped: the gateway never offered them. Unlike the text families, a
//! Harmony model's output is always parsed: raw, it is protocol, not text.
//! `required` and a named function are held by a structural tag over the
//! model's own format (a `commentary` message to one of the allowed
//! functions, its body in that function's schema, at least one; one for a
//! named function), so their output is read by the Harmony parser too.

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::Value;
use smg_parsers::harmony::{self, HarmonyOptions, HarmonyParser};
use smg_parsers::reasoning::{self, ReasoningOptions, ReasoningParser, ThinkingToggle};
use smg_parsers::tool::{self, CallDelta, ToolParser, Tools};

use super::request_context::push_low_hex;
use super::spec::{ChatPrompt, ToolChoice};

/// The parsers a model's output goes through, decided once per model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelParsers {
    /// The tool-call parser under `tool_choice: auto`; `None`: calls stay
    /// in the text.
    pub tool: Option<String>,
    /// The reasoning parser; `None`: reasoning stays in the text.
    pub reasoning: Option<String>,
    /// The chat template's thinking switch.
    pub toggle: ThinkingToggle,
    /// The model speaks Harmony (gpt-oss): one parser reads reasoning and
    /// calls, and `tool`/`reasoning` are `None`.
    pub harmony: bool,
}

/// A template without a thinking switch.
const NO_TOGGLE: ThinkingToggle = ThinkingToggle {
    key: None,
    default_on: true,
    prefills_think: false,
};

impl Default for ModelParsers {
    fn default() -> Self {
        Self {
            tool: None,
            reasoning: None,
            toggle: NO_TOGGLE,
            harmony: false,
        }
    }
}

/// Which parsers read chat output (`--tool-call-parser`,
/// `--model-tool-call-parser`, `--reasoning-parser`,
/// `--model-reasoning-parser`); names are checked at start-up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParserSettings {
    pub tool_call_parser: Option<String>,
    pub reasoning_parser: Option<String>,
    /// Served model name → tool-call parser, over the global choice.
    pub model_tool_call_parsers: std::collections::HashMap<String, String>,
    /// Served model name → reasoning parser, over the global choice.
    pub model_reasoning_parsers: std::collections::HashMap<String, String>,
}

impl ModelParsers {
    /// The parsers of model `name` whose chat template is `template`: the
    /// per-model flag, else the global flag, else detection. `passthrough`
    /// chosen explicitly turns parsing off. A Harmony model gets the Harmony
    /// parser unless a per-model flag names its parsers.
    pub fn resolve(settings: &ParserSettings, name: &str, template: Option<&str>) -> Self {
        let overridden = settings.model_tool_call_parsers.contains_key(name)
            || settings.model_reasoning_parsers.contains_key(name);
        if !overridden && harmony::detect(name, template) {
            return Self {
                harmony: true,
                ..Self::default()
            };
        }
        let chosen = |per_model: &std::collections::HashMap<String, String>,
                      global: &Option<String>,
                      detected: Option<&'static str>| {
            per_model
                .get(name)
                .cloned()
                .or_else(|| global.clone())
                .or_else(|| detected.map(str::to_owned))
                .filter(|parser| parser != "passthrough")
        };
        Self {
            tool: chosen(
                &settings.model_tool_call_parsers,
                &settings.tool_call_parser,
                tool::detect(name, template),
            ),
            reasoning: chosen(
                &settings.model_reasoning_parsers,
                &settings.reasoning_parser,
                reasoning::detect(name),
            ),
            toggle: template.map_or(NO_TOGGLE, reasoning::thinking_toggle),
            harmony: false,
        }
    }
}

/// How calls are read from one request's output.
#[derive(Debug, Clone, PartialEq)]
enum CallMode {
    /// Parse the model's markup with this parser.
    Parser(String),
    /// The output is the arguments of this one function.
    Arguments(String),
}

/// How calls are named for the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CallIds {
    /// `call_` and 24 random hex digits (OpenAI's shape).
    Random,
    /// `functions.NAME:N`, N counting every call of the conversation from
    /// `first` (Kimi-K2 reads its own ids back in the next turn's prompt).
    Kimi { first: usize },
}

/// One request's parsing, built in Preparation; each sequence gets fresh
/// parsers from it ([`OutputParsing::sequence`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OutputParsing {
    reasoning: Option<(String, ReasoningOptions)>,
    calls: Option<(CallMode, Tools)>,
    /// Harmony output: this replaces `reasoning` and `calls`.
    harmony: Option<HarmonyOptions>,
    call_ids: CallIds,
    parallel_tool_calls: bool,
}

impl OutputParsing {
    /// The parsing `chat` asks of a model with `parsers`; `None` when the
    /// output is plain text.
    pub(crate) fn for_request(parsers: &ModelParsers, chat: &ChatPrompt) -> Option<Self> {
        // A Harmony model's forced call is held to its own format (a
        // structural tag, `harmony_tool_constraint`), so its parser reads
        // every choice; the text parsers read a forced call as JSON.
        if parsers.harmony {
            let calls = (chat.tool_choice != ToolChoice::None && !chat.tools.is_empty())
                .then(|| chat.tools.specs());
            return Some(Self {
                reasoning: None,
                calls: None,
                harmony: Some(HarmonyOptions {
                    separate_reasoning: chat.separate_reasoning,
                    calls,
                }),
                call_ids: CallIds::Random,
                parallel_tool_calls: chat.parallel_tool_calls,
            });
        }
        let reasoning = parsers
            .reasoning
            .as_ref()
            .filter(|_| chat.separate_reasoning)
            .map(|name| {
                let options = ReasoningOptions {
                    starts_in_reasoning: reasoning::starts_in_reasoning(
                        name,
                        &parsers.toggle,
                        Some(&chat.template_kwargs),
                        chat.reasoning_effort.as_deref(),
                    ),
                    // Markup inside a think block is never a call, except
                    // where the family table says models open a tool
                    // section without closing their think block (Kimi).
                    tool_call_ends_reasoning: reasoning::tool_call_ends_reasoning(name),
                };
                (name.clone(), options)
            });
        let mode = match &chat.tool_choice {
            ToolChoice::None => None,
            _ if chat.tools.is_empty() => None,
            ToolChoice::Auto => parsers.tool.clone().map(CallMode::Parser),
            ToolChoice::Required => Some(CallMode::Parser("json".to_owned())),
            ToolChoice::Function(name) => Some(CallMode::Arguments(name.clone())),
        };
        let call_ids = match &mode {
            Some(CallMode::Parser(name)) if name == "kimik2" => CallIds::Kimi {
                first: past_calls(&chat.messages),
            },
            _ => CallIds::Random,
        };
        let calls = mode.map(|mode| (mode, chat.tools.specs()));
        (reasoning.is_some() || calls.is_some()).then(|| Self {
            reasoning,
            calls,
            harmony: None,
            call_ids,
            parallel_tool_calls: chat.parallel_tool_calls,
        })
    }

    /// Fresh parsers for one sequence. A name the parser crates do not know
    /// was refused at start-up, so a failure here only drops that parser.
    pub(crate) fn sequence(&self) -> SequenceParser {
        let reader = match &self.harmony {
            Some(options) => Reader::Harmony(HarmonyParser::new(options.clone())),
            None => self.text_reader(),
        };
        SequenceParser {
            reader,
            call_ids: self.call_ids,
            single_call: !self.parallel_tool_calls,
            calls_made: 0,
            cut_call: None,
        }
    }

    fn text_reader(&self) -> Reader {
        let reasoning = self.reasoning.as_ref().and_then(|(name, options)| {
            reasoning::create(name, *options)
                .inspect_err(|err| tracing::error!(%err, "reasoning parsing is off"))
                .ok()
        });
        let calls = self.calls.as_ref().and_then(|(mode, tools)| match mode {
            CallMode::Parser(name) => tool::create(name, Arc::clone(tools))
                .inspect_err(|err| tracing::error!(%err, "tool-call parsing is off"))
                .ok()
                .map(Calls::Parsed),
            CallMode::Arguments(name) => Some(Calls::Arguments {
                name: name.clone(),
                started: false,
            }),
        });
        Reader::Text { reasoning, calls }
    }
}

/// The calls earlier assistant turns made.
fn past_calls(messages: &[Value]) -> usize {
    messages
        .iter()
        .filter_map(|message| message.get("tool_calls")?.as_array())
        .map(Vec::len)
        .sum()
}

/// A fresh OpenAI-style call id.
fn random_call_id() -> String {
    call_id(rand::random())
}

/// `call_` and the low 96 bits of `bits` as 24 hex digits, as
/// `format!("call_{:024x}", bits & mask)` writes it, by hand: `format!`'s
/// `u128` hex costs several times more, on every call a tool chat makes.
fn call_id(bits: u128) -> String {
    let mut id = String::with_capacity("call_".len() + 24);
    id.push_str("call_");
    push_low_hex(&mut id, bits, 24);
    id
}

/// A fragment of one tool call: the first fragment of a call carries its
/// id and name, later ones append to its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallDelta {
    /// The call's position in the sequence's output: 0, 1, ...
    pub index: usize,
    pub id: Option<String>,
    pub name: Option<String>,
    /// JSON text to append to the call's arguments.
    pub arguments: String,
}

/// What one piece of a sequence's text turned out to be.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ParsedText {
    pub reasoning: String,
    pub content: String,
    pub calls: Vec<ToolCallDelta>,
}

impl ParsedText {
    pub(crate) fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty() && self.calls.is_empty()
    }
}

#[derive(Debug)]
enum Calls {
    Parsed(Box<dyn ToolParser>),
    /// Every byte of the output is the named function's arguments.
    Arguments {
        name: String,
        started: bool,
    },
}

/// What reads one sequence's text.
#[derive(Debug)]
enum Reader {
    /// The text families: reasoning split off first, its answer text read
    /// for calls.
    Text {
        reasoning: Option<Box<dyn ReasoningParser>>,
        calls: Option<Calls>,
    },
    /// gpt-oss: one parser for reasoning, answer and calls.
    Harmony(HarmonyParser),
}

/// The parsers of one sequence.
#[derive(Debug)]
pub(crate) struct SequenceParser {
    reader: Reader,
    call_ids: CallIds,
    single_call: bool,
    /// Calls whose first fragment went out.
    calls_made: usize,
    /// The call a cut-off end withdrew.
    cut_call: Option<usize>,
}

/// How a sequence's text ended, for the call parser.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Normal,
    /// Out of tokens: an unfinished call is content, not a call.
    Cut,
}

impl SequenceParser {
    /// Parses the next piece of text as one delta (text before calls):
    /// the tests' view of a stream, piece by piece.
    #[cfg(test)]
    pub(crate) fn push(&mut self, text: &str) -> ParsedText {
        let (parsed, calls) = self.read(text);
        self.with_ids(parsed, calls)
    }

    /// Parses the next piece of text, of any length, into deltas in the
    /// order the text had them: each delta's text comes before its calls,
    /// and text written after a call starts the next delta (as it would
    /// have streamed). Reasoning goes with the first delta.
    pub(crate) fn push_in_order(&mut self, text: &str) -> Vec<ParsedText> {
        let (parsed, calls) = self.read(text);
        in_text_order(parsed, calls)
            .into_iter()
            .map(|(parsed, calls)| self.with_ids(parsed, calls))
            .collect()
    }

    fn read(&mut self, text: &str) -> (ParsedText, Vec<CallDelta>) {
        match &mut self.reader {
            Reader::Harmony(parser) => harmony_parsed(parser.push(text)),
            Reader::Text { reasoning, calls } => {
                // The answer text is borrowed when nothing split it off.
                let (reasoning, answer) = match reasoning {
                    Some(parser) => {
                        let delta = parser.push(text);
                        (delta.reasoning, Cow::Owned(delta.content))
                    }
                    None => (String::new(), Cow::Borrowed(text)),
                };
                let (parsed, calls, _) = answer_calls(calls, reasoning, answer, None);
                (parsed, calls)
            }
        }
    }

    /// The text ended: flush what the parsers held back.
    pub(crate) fn finish(&mut self) -> ParsedText {
        self.finish_as(false)
    }

    /// The text ended because the model ran out of tokens (finish reason
    /// `length`): as [`SequenceParser::finish`], except that a call cut off
    /// before its arguments were complete is no call: its text is content,
    /// and [`SequenceParser::cut_call`] names it if its first fragment went
    /// out. Unfinished reasoning stays reasoning.
    pub(crate) fn finish_cut(&mut self) -> ParsedText {
        self.finish_as(true)
    }

    /// The call [`SequenceParser::finish_cut`] withdrew, if its first
    /// fragment had gone out: collectors drop it (a stream cannot).
    pub(crate) fn cut_call(&self) -> Option<usize> {
        self.cut_call
    }

    fn finish_as(&mut self, cut: bool) -> ParsedText {
        let (parsed, calls) = match &mut self.reader {
            Reader::Harmony(parser) => harmony_parsed(parser.finish()),
            Reader::Text { reasoning, calls } => {
                let (reasoning, answer) = match reasoning {
                    Some(parser) => {
                        let delta = parser.finish();
                        (delta.reasoning, Cow::Owned(delta.content))
                    }
                    None => (String::new(), Cow::Borrowed("")),
                };
                let end = if cut { End::Cut } else { End::Normal };
                let (parsed, calls, cut_call) = answer_calls(calls, reasoning, answer, Some(end));
                self.cut_call = cut_call.filter(|&index| !self.single_call || index == 0);
                (parsed, calls)
            }
        };
        self.with_ids(parsed, calls)
    }

    /// Whether any call went out: the finish reason becomes `tool_calls`.
    pub(crate) fn made_calls(&self) -> bool {
        self.calls_made > 0
    }

    /// Keeps only the first call without `parallel_tool_calls`, and gives
    /// each call its id on its first fragment.
    fn with_ids(&mut self, mut parsed: ParsedText, mut calls: Vec<CallDelta>) -> ParsedText {
        if self.single_call {
            calls.retain(|call| call.index == 0);
        }
        parsed.calls = calls
            .into_iter()
            .map(|call| {
                let id = call.name.as_ref().map(|name| {
                    self.calls_made += 1;
                    match self.call_ids {
                        CallIds::Random => random_call_id(),
                        CallIds::Kimi { first } => {
                            format!("functions.{name}:{}", first + call.index)
                        }
                    }
                });
                ToolCallDelta {
                    index: call.index,
                    id,
                    name: call.name,
                    arguments: call.arguments,
                }
            })
            .collect();
        parsed
    }
}

/// `parsed`'s text and `calls` as deltas in text order (see
/// [`SequenceParser::push_in_order`]), split where text follows a call.
/// Text before every call, the usual case, is moved, not copied.
fn in_text_order(parsed: ParsedText, calls: Vec<CallDelta>) -> Vec<(ParsedText, Vec<CallDelta>)> {
    let ParsedText {
        reasoning, content, ..
    } = parsed;
    if calls
        .iter()
        .all(|call| call.content_before >= content.len())
    {
        let parsed = ParsedText {
            reasoning,
            content,
            calls: Vec::new(),
        };
        return vec![(parsed, calls)];
    }
    let mut deltas = Vec::new();
    let mut current = (
        ParsedText {
            reasoning,
            ..ParsedText::default()
        },
        Vec::new(),
    );
    let mut written = 0;
    for call in calls {
        let at = call.content_before.min(content.len());
        if at > written && content.is_char_boundary(at) {
            if !current.1.is_empty() {
                deltas.push(std::mem::take(&mut current));
            }
            current.0.content.push_str(&content[written..at]);
            written = at;
        }
        current.1.push(call);
    }
    if written < content.len() {
        if !current.1.is_empty() {
            deltas.push(std::mem::take(&mut current));
        }
        current.0.content.push_str(&content[written..]);
    }
    deltas.push(current);
    deltas
}

/// A Harmony delta as text and call fragments.
fn harmony_parsed(delta: harmony::HarmonyDelta) -> (ParsedText, Vec<CallDelta>) {
    let parsed = ParsedText {
        reasoning: delta.reasoning,
        content: delta.content,
        calls: Vec::new(),
    };
    (parsed, delta.calls)
}

/// Runs answer text through the call parser (`last`: the text ended, and
/// how). Also returns the call a cut-off end withdrew. Answer text that
/// becomes content or arguments as it is is moved there, not copied.
fn answer_calls(
    parser: &mut Option<Calls>,
    reasoning: String,
    answer: Cow<'_, str>,
    last: Option<End>,
) -> (ParsedText, Vec<CallDelta>, Option<usize>) {
    let mut cut_call = None;
    let mut parsed = ParsedText {
        reasoning,
        ..ParsedText::default()
    };
    let mut calls: Vec<CallDelta> = Vec::new();
    match parser {
        None => parsed.content = answer.into_owned(),
        Some(Calls::Parsed(parser)) => {
            let mut delta = if answer.is_empty() {
                tool::ToolDelta::default()
            } else {
                parser.push(&answer)
            };
            if let Some(end) = last {
                let tail = match end {
                    End::Normal => parser.finish(),
                    End::Cut => parser.finish_cut(),
                };
                let before = delta.content.len();
                delta.content.push_str(&tail.content);
                delta
                    .calls
                    .extend(tail.calls.into_iter().map(|call| CallDelta {
                        content_before: before + call.content_before,
                        ..call
                    }));
                cut_call = tail.cut_call;
            }
            parsed.content = delta.content;
            calls = delta.calls;
        }
        Some(Calls::Arguments { name, started }) => {
            if !answer.is_empty() || (last.is_some() && !*started) {
                calls.push(CallDelta {
                    index: 0,
                    name: (!std::mem::replace(started, true)).then(|| name.clone()),
                    arguments: answer.into_owned(),
                    content_before: 0,
                });
            }
        }
    }
    (parsed, calls, cut_call)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_call_id_is_the_low_96_bits_in_24_hex_digits() {
        for bits in [
            0,
            1,
            0xabc,
            u128::MAX,
            1 << 95,
            1 << 96,
            0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
        ] {
            let mask = (1u128 << 96) - 1;
            assert_eq!(
                call_id(bits),
                format!("call_{:024x}", bits & mask),
                "{bits:#x}"
            );
        }
    }

    fn chat(tools: Value, choice: ToolChoice) -> ChatPrompt {
        ChatPrompt {
            messages: vec![json!({"role": "user", "content": "hi"})],
            tools: tools.as_array().cloned().unwrap_or_default().into(),
            tool_choice: choice,
            parallel_tool_calls: true,
            template_kwargs: serde_json::Map::new(),
            reasoning_effort: None,
            separate_reasoning: true,
        }
    }

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
    }

    fn qwen3() -> ModelParsers {
        ModelParsers {
            tool: Some("qwen".into()),
            reasoning: Some("qwen3".into()),
            toggle: NO_TOGGLE,
            harmony: false,
        }
    }

    /// Everything a sequence produced, chunk by chunk, then finished.
    fn run(parser: &mut SequenceParser, chunks: &[&str]) -> ParsedText {
        let mut all = ParsedText::default();
        let mut absorb = |part: ParsedText| {
            all.reasoning.push_str(&part.reasoning);
            all.content.push_str(&part.content);
            all.calls.extend(part.calls);
        };
        for chunk in chunks {
            absorb(parser.push(chunk));
        }
        absorb(parser.finish());
        all
    }

    /// (text, names of the calls that begin after it) per delta.
    fn order_of(deltas: &[ParsedText]) -> Vec<(String, Vec<String>)> {
        deltas
            .iter()
            .map(|delta| {
                let names = delta.calls.iter().filter_map(|c| c.name.clone()).collect();
                (delta.content.clone(), names)
            })
            .collect()
    }

    #[test]
    fn a_whole_text_in_one_push_keeps_text_before_between_and_after_calls_in_order() {
        let tools = json!([
            {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
            {"type": "function", "function": {"name": "b", "parameters": {"type": "object"}}}]);
        let parsing = OutputParsing::for_request(&qwen3(), &chat(tools, ToolChoice::Auto)).unwrap();
        let text = "<think>why</think>Før 東京\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": \"é\"}}\n</tool_call>\
                    between<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>\
                    <tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>after é";
        let mut whole = parsing.sequence();
        let mut deltas = whole.push_in_order(text);
        deltas.push(whole.finish());
        assert_eq!(deltas[0].reasoning, "why");
        let expected = vec![
            ("Før 東京\n".to_owned(), vec!["a".to_owned()]),
            ("between".to_owned(), vec!["b".to_owned(), "a".to_owned()]),
            ("after é".to_owned(), vec![]),
        ];
        let mut order = order_of(&deltas);
        order.retain(|(text, names)| !text.is_empty() || !names.is_empty());
        assert_eq!(order, expected);
        // The same text streamed a character at a time comes out in the same order.
        let mut streamed = parsing.sequence();
        let mut pieces: Vec<ParsedText> = text
            .char_indices()
            .map(|(at, c)| streamed.push(&text[at..at + c.len_utf8()]))
            .collect();
        pieces.push(streamed.finish());
        let mut merged: Vec<(String, Vec<String>)> = Vec::new();
        for (text, names) in order_of(&pieces) {
            match merged.last_mut() {
                Some(last) if last.1.is_empty() => {
                    last.0.push_str(&text);
                    last.1 = names;
                }
                _ if text.is_empty() && names.is_empty() => {}
                Some(last) if text.is_empty() => last.1.extend(names),
                _ => merged.push((text, names)),
            }
        }
        assert_eq!(merged, expected);
        // Arguments and ids are whole: one id per call, on its first fragment.
        let calls: Vec<&ToolCallDelta> = deltas.iter().flat_map(|d| &d.calls).collect();
        let ids = calls.iter().filter(|c| c.id.is_some()).count();
        assert_eq!(ids, 3);
        let first: String = calls
            .iter()
            .filter(|c| c.index == 0)
            .map(|c| c.arguments.as_str())
            .collect();
        assert_eq!(first, "{\"x\":\"é\"}");
    }

    #[test]
    fn explicit_choices_beat_detection_and_passthrough_turns_parsing_off() {
        let detected = ModelParsers::resolve(&ParserSettings::default(), "Qwen/Qwen3-8B", None);
        assert_eq!(detected.tool.as_deref(), Some("qwen"));
        assert_eq!(detected.reasoning.as_deref(), Some("qwen3"));
        let settings = ParserSettings {
            tool_call_parser: Some("llama".into()),
            model_tool_call_parsers: [("Qwen/Qwen3-8B".to_owned(), "passthrough".to_owned())]
                .into(),
            ..ParserSettings::default()
        };
        let off = ModelParsers::resolve(&settings, "Qwen/Qwen3-8B", None);
        assert_eq!(off.tool, None);
        let global = ModelParsers::resolve(&settings, "other", None);
        assert_eq!(global.tool.as_deref(), Some("llama"));
        let unknown = ModelParsers::resolve(&ParserSettings::default(), "model", None);
        assert_eq!((unknown.tool, unknown.reasoning), (None, None));
    }

    #[test]
    fn reasoning_then_calls_and_markup_inside_reasoning_is_not_a_call() {
        let parsing =
            OutputParsing::for_request(&qwen3(), &chat(weather(), ToolChoice::Auto)).unwrap();
        let mut parser = parsing.sequence();
        let out = run(
            &mut parser,
            &[
                "<think>maybe <tool_call>{\"name\": \"x\"}</tool_call>",
                "</think>Sure.<tool_call>\n{\"name\": \"get_weather\", ",
                "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            ],
        );
        assert_eq!(
            out.reasoning,
            "maybe <tool_call>{\"name\": \"x\"}</tool_call>"
        );
        assert_eq!(out.content, "Sure.");
        assert_eq!(out.calls[0].name.as_deref(), Some("get_weather"));
        let arguments: String = out.calls.iter().map(|c| c.arguments.as_str()).collect();
        assert_eq!(
            serde_json::from_str::<Value>(&arguments).unwrap(),
            json!({"city": "Paris"})
        );
        assert!(parser.made_calls());
    }

    /// What a sequence cut off by `max_tokens` gives when its text arrives
    /// as `chunks`: (reasoning, content, call names kept by a collector).
    fn run_cut(chat: &ChatPrompt, chunks: &[&str]) -> (String, String, Vec<String>) {
        let parsing = OutputParsing::for_request(&qwen3(), chat).unwrap();
        let mut parser = parsing.sequence();
        let mut out = ParsedText::default();
        for chunk in chunks {
            let part = parser.push(chunk);
            out.reasoning.push_str(&part.reasoning);
            out.content.push_str(&part.content);
            out.calls.extend(part.calls);
        }
        let tail = parser.finish_cut();
        out.reasoning.push_str(&tail.reasoning);
        out.content.push_str(&tail.content);
        out.calls.extend(tail.calls);
        let mut names: Vec<String> = out.calls.into_iter().filter_map(|c| c.name).collect();
        if let Some(cut) = parser.cut_call() {
            names.truncate(cut);
        }
        (out.reasoning, out.content, names)
    }

    #[test]
    fn a_cut_off_sequence_keeps_reasoning_as_reasoning_and_an_unfinished_call_as_content() {
        let tools = chat(weather(), ToolChoice::Auto);
        let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa";
        let whole_call =
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>";
        let no_tools = chat(json!([]), ToolChoice::Auto);
        let cases: Vec<(&ChatPrompt, String, [String; 2], Vec<&str>)> = vec![
            // Inside the think block, a possible end marker held back.
            (
                &tools,
                "<think>still thinking</thi".into(),
                ["still thinking</thi".into(), String::new()],
                vec![],
            ),
            // Inside the think block, tool markup is reasoning.
            (
                &tools,
                format!("<think>try {call}"),
                [format!("try {call}"), String::new()],
                vec![],
            ),
            // After it, a held-back marker prefix.
            (
                &tools,
                "<think>r</think>\n\nLet me <tool_ca".into(),
                ["r".into(), "Let me <tool_ca".into()],
                vec![],
            ),
            // An unfinished call after a finished one.
            (
                &tools,
                format!("<think>r</think>\n\n{whole_call}\n{call}"),
                ["r".into(), format!("\n{call}")],
                vec!["get_weather"],
            ),
            // No tools: only reasoning is parsed.
            (
                &no_tools,
                format!("<think>r</think>A{call}"),
                ["r".into(), format!("A{call}")],
                vec![],
            ),
        ];
        for (chat, text, [reasoning, content], names) in cases {
            let whole = run_cut(chat, &[&text]);
            assert_eq!(whole.0, reasoning, "{text:?}");
            assert_eq!(whole.1, content, "{text:?}");
            assert_eq!(whole.2, names, "{text:?}");
            for at in (0..=text.len()).filter(|&at| text.is_char_boundary(at)) {
                let split = run_cut(chat, &[&text[..at], &text[at..]]);
                assert_eq!(split, whole, "{text:?} split at {at}");
            }
        }
    }

    #[test]
    fn none_and_no_tools_leave_markup_as_content() {
        for prompt in [
            chat(weather(), ToolChoice::None),
            chat(json!([]), ToolChoice::Auto),
        ] {
            let parsing = OutputParsing::for_request(&qwen3(), &prompt).unwrap();
            let mut parser = parsing.sequence();
            let out = run(
                &mut parser,
                &["<tool_call>{\"name\": \"get_weather\"}</tool_call>"],
            );
            assert_eq!(
                out.content,
                "<tool_call>{\"name\": \"get_weather\"}</tool_call>"
            );
            assert!(out.calls.is_empty());
            assert!(!parser.made_calls());
        }
        let plain = ModelParsers::default();
        assert_eq!(
            OutputParsing::for_request(&plain, &chat(json!([]), ToolChoice::None)),
            None
        );
    }

    #[test]
    fn a_named_function_turns_the_whole_output_into_its_arguments() {
        let prompt = chat(weather(), ToolChoice::Function("get_weather".into()));
        let parsing = OutputParsing::for_request(&ModelParsers::default(), &prompt).unwrap();
        let mut parser = parsing.sequence();
        let out = run(&mut parser, &["{\"city\": ", "\"Paris\"}"]);
        assert_eq!(out.content, "");
        assert_eq!(out.calls.len(), 2);
        assert_eq!(out.calls[0].name.as_deref(), Some("get_weather"));
        assert_eq!(out.calls[1].name, None);
        let arguments: String = out.calls.iter().map(|c| c.arguments.as_str()).collect();
        assert_eq!(arguments, "{\"city\": \"Paris\"}");
        // Even an empty output names the call once.
        let mut empty = parsing.sequence();
        let out = run(&mut empty, &[]);
        assert_eq!(out.calls.len(), 1);
        assert!(empty.made_calls());
    }

    #[test]
    fn required_reads_the_constrained_array_and_parallel_off_keeps_one_call() {
        let mut prompt = chat(weather(), ToolChoice::Required);
        let array = "[{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}, \
                     {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}]";
        let parsing = OutputParsing::for_request(&ModelParsers::default(), &prompt).unwrap();
        let out = run(&mut parsing.sequence(), &[array]);
        let names = out.calls.iter().filter(|c| c.name.is_some()).count();
        assert_eq!(names, 2);
        prompt.parallel_tool_calls = false;
        let parsing = OutputParsing::for_request(&ModelParsers::default(), &prompt).unwrap();
        let out = run(&mut parsing.sequence(), &[array]);
        assert!(out.calls.iter().all(|c| c.index == 0));
        assert_eq!(out.calls.iter().filter(|c| c.name.is_some()).count(), 1);
    }

    #[test]
    fn calls_get_ids_once_openai_style_or_kimi_style() {
        let parsing =
            OutputParsing::for_request(&qwen3(), &chat(weather(), ToolChoice::Auto)).unwrap();
        let out = run(
            &mut parsing.sequence(),
            &["<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"],
        );
        let ids: Vec<&str> = out.calls.iter().filter_map(|c| c.id.as_deref()).collect();
        assert_eq!(ids.len(), 1);
        assert!(
            ids[0].starts_with("call_") && ids[0].len() == 5 + 24,
            "{}",
            ids[0]
        );
        let kimi = ModelParsers {
            tool: Some("kimik2".into()),
            ..ModelParsers::default()
        };
        let mut prompt = chat(weather(), ToolChoice::Auto);
        prompt
            .messages
            .push(json!({"role": "assistant", "tool_calls": [
            {"id": "functions.get_weather:0", "type": "function",
             "function": {"name": "get_weather", "arguments": {}}}]}));
        let parsing = OutputParsing::for_request(&kimi, &prompt).unwrap();
        let out = run(
            &mut parsing.sequence(),
            &[
                "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:1\
               <|tool_call_argument_begin|>{\"city\": \"Rome\"}<|tool_call_end|>\
               <|tool_calls_section_end|>",
            ],
        );
        assert_eq!(out.calls[0].id.as_deref(), Some("functions.get_weather:1"));
    }

    #[test]
    fn separate_reasoning_false_keeps_the_think_block_in_the_text() {
        let mut prompt = chat(json!([]), ToolChoice::None);
        prompt.separate_reasoning = false;
        assert_eq!(OutputParsing::for_request(&qwen3(), &prompt), None);
    }

    fn gpt_oss() -> ModelParsers {
        ModelParsers::resolve(&ParserSettings::default(), "openai/gpt-oss-20b", None)
    }

    const HARMONY_CALL: &str = "<|channel|>analysis<|message|>Need the weather.<|end|>\
        <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json\
        <|message|>{\"city\":\"Paris\"}";

    #[test]
    fn gpt_oss_is_detected_by_id_or_template_and_per_model_flags_override_it() {
        let by_id = gpt_oss();
        assert!(by_id.harmony);
        assert_eq!((by_id.tool, by_id.reasoning), (None, None));
        let by_template = ModelParsers::resolve(
            &ParserSettings::default(),
            "my-model",
            Some("{{- '<|start|>assistant<|channel|>final<|message|>' -}}"),
        );
        assert!(by_template.harmony);
        // The global flags name text formats: they do not turn Harmony off.
        let global = ParserSettings {
            tool_call_parser: Some("qwen".into()),
            reasoning_parser: Some("qwen3".into()),
            ..ParserSettings::default()
        };
        assert!(ModelParsers::resolve(&global, "openai/gpt-oss-120b", None).harmony);
        let per_model = ParserSettings {
            model_tool_call_parsers: [("openai/gpt-oss-20b".to_owned(), "passthrough".to_owned())]
                .into(),
            ..ParserSettings::default()
        };
        let off = ModelParsers::resolve(&per_model, "openai/gpt-oss-20b", None);
        assert!(!off.harmony);
        assert_eq!(off.tool, None);
        assert!(!ModelParsers::resolve(&ParserSettings::default(), "Qwen/Qwen3-8B", None).harmony);
    }

    #[test]
    fn harmony_gives_reasoning_and_calls_with_minted_ids() {
        let parsing =
            OutputParsing::for_request(&gpt_oss(), &chat(weather(), ToolChoice::Auto)).unwrap();
        let mut parser = parsing.sequence();
        // The call ends with the text: <|call|> is an EOS id the gateway hides.
        let (head, tail) = HARMONY_CALL.split_at(HARMONY_CALL.len() - 9);
        let out = run(&mut parser, &[head, tail]);
        assert_eq!(out.reasoning, "Need the weather.");
        assert_eq!(out.content, "");
        assert_eq!(out.calls[0].name.as_deref(), Some("get_weather"));
        let id = out.calls[0].id.as_deref().unwrap();
        assert!(id.starts_with("call_") && id.len() == 29, "{id}");
        assert!(
            out.calls[1..]
                .iter()
                .all(|c| c.id.is_none() && c.name.is_none())
        );
        let arguments: String = out.calls.iter().map(|c| c.arguments.as_str()).collect();
        assert_eq!(arguments, "{\"city\":\"Paris\"}");
        assert!(parser.made_calls());
    }

    #[test]
    fn harmony_without_calls_or_separate_reasoning_still_hides_the_markers() {
        let mut none = chat(weather(), ToolChoice::None);
        let out = run(
            &mut OutputParsing::for_request(&gpt_oss(), &none)
                .unwrap()
                .sequence(),
            &[HARMONY_CALL],
        );
        assert_eq!(out.reasoning, "Need the weather.");
        assert_eq!(out.content, "{\"city\":\"Paris\"}");
        assert!(out.calls.is_empty());
        none.separate_reasoning = false;
        let mut parser = OutputParsing::for_request(&gpt_oss(), &none)
            .unwrap()
            .sequence();
        let out = run(&mut parser, &[HARMONY_CALL]);
        assert_eq!(out.reasoning, "");
        assert_eq!(out.content, "Need the weather.{\"city\":\"Paris\"}");
        assert!(!parser.made_calls());
        // No tools: still parsed (raw Harmony is protocol, not text).
        let plain = chat(json!([]), ToolChoice::Auto);
        let out = run(
            &mut OutputParsing::for_request(&gpt_oss(), &plain)
                .unwrap()
                .sequence(),
            &[
                "<|channel|>analysis<|message|>Hi?<|end|><|start|>assistant<|channel|>final<|message|>Hello.",
            ],
        );
        assert_eq!(
            (out.reasoning.as_str(), out.content.as_str()),
            ("Hi?", "Hello.")
        );
    }

    #[test]
    fn harmony_under_a_forced_choice_reads_its_own_format_and_parallel_off_keeps_one_call() {
        // Forced calls are held to Harmony's own format (a structural
        // tag), so the Harmony parser reads them, not the JSON one.
        for forced in [
            ToolChoice::Required,
            ToolChoice::Function("get_weather".to_owned()),
        ] {
            let required = chat(weather(), forced);
            let out = run(
                &mut OutputParsing::for_request(&gpt_oss(), &required)
                    .unwrap()
                    .sequence(),
                &[HARMONY_CALL],
            );
            assert_eq!(out.calls[0].name.as_deref(), Some("get_weather"));
            assert_eq!(out.reasoning, "Need the weather.");
            assert_eq!(out.content, "");
        }
        let mut single = chat(weather(), ToolChoice::Auto);
        single.parallel_tool_calls = false;
        let two = format!(
            "{HARMONY_CALL}<|call|><|start|>assistant<|channel|>commentary \
             to=functions.get_weather <|constrain|>json<|message|>{{\"city\":\"Rome\"}}"
        );
        let out = run(
            &mut OutputParsing::for_request(&gpt_oss(), &single)
                .unwrap()
                .sequence(),
            &[&two],
        );
        assert!(out.calls.iter().all(|c| c.index == 0));
        assert_eq!(out.calls.iter().filter(|c| c.name.is_some()).count(), 1);
    }
}
