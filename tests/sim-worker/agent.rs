//! `--agent`: a simulated model that plays its part in a tool loop, so an
//! agent framework or an SDK can be pointed at a simulated fleet (`smg demo`)
//! with tools and prompts of its own, not ones a script was written for.
//!
//! Why it reads the prompt: a gRPC engine gets token ids only. The tools,
//! the conversation and the thinking switch reach it the way they reach a
//! real model, rendered by the chat template; so the worker decodes the
//! prompt (special tokens kept) and reads them back from a ChatML prompt
//! (`<|im_start|>ROLE\n…<|im_end|>`, the bundled model and the Qwen family)
//! whose template lists tools in a Hermes `<tools>` block, one JSON object a
//! line. The rules, first match wins:
//!
//! 1. The request carries a JSON-schema constraint (`tool_choice` required
//!    or a named function, `response_format`): the completion is JSON that
//!    matches the schema ([`value_for_schema`]), as a grammar-constrained
//!    engine would write. No think block: the gateway parses it as JSON.
//! 2. The prompt renders tools and its last turn is the user's: a Hermes
//!    call `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>` of the
//!    tool the user's text points to ([`most_relevant_tool`]: named outright,
//!    else sharing the most words with its name and description), else the
//!    first tool, with arguments built from that tool's schema.
//! 3. The prompt renders tools and its last turn holds tool results (a
//!    `tool` turn, or `<tool_response>` blocks in a user turn, Qwen3 style):
//!    plain text quoting them, `The tool said: …`.
//! 4. Anything else: `None`, and the worker's usual digest output.
//!
//! In 2 and 3 a model whose tokenizer has `<think>` and `</think>` as single
//! tokens first writes a short think block, unless the prompt already closed
//! one (thinking switched off); a prompt that ends inside `<think>` gets the
//! rest of the block only. The text is encoded with the model's tokenizer and
//! streamed like `--script`'s.

use serde_json::{Map, Value, json};

use crate::model::ModelFacts;

const TURN_START: &str = "<|im_start|>";
const TURN_END: &str = "<|im_end|>";
const THINK_START: &str = "<think>";
const THINK_END: &str = "</think>";

/// Schemas nested deeper than this (a recursive `$ref`, say) give `null`.
const MAX_SCHEMA_DEPTH: usize = 12;

/// A string argument when the user's text offers no word to use.
const FALLBACK_WORD: &str = "demo";

/// Words never taken as a string argument.
const STOP_WORDS: &[&str] = &[
    "a", "an", "and", "any", "are", "can", "could", "do", "does", "for", "from", "get", "give",
    "how", "in", "into", "is", "it", "its", "me", "my", "of", "on", "or", "our", "please", "show",
    "tell", "that", "the", "then", "this", "to", "use", "using", "was", "what", "what's", "whats",
    "when", "where", "which", "who", "why", "will", "with", "would", "you", "your",
];

/// The agentic simulated model of one worker.
#[derive(Debug)]
pub struct AgentModel {
    /// The tokenizer has `<think>` and `</think>` as tokens of their own.
    thinks: bool,
}

/// One tool the prompt lists: its name and its arguments schema.
#[derive(Debug, Clone, PartialEq)]
struct Tool {
    name: String,
    description: String,
    parameters: Value,
}

/// What the last turn before the generation prompt is.
#[derive(Debug, Clone, PartialEq)]
enum LastTurn {
    User(String),
    ToolResults(Vec<String>),
    Other,
}

/// Where the generation prompt leaves a thinking model.
#[derive(Debug, Clone, Copy, PartialEq)]
enum ThinkState {
    /// Nothing written yet: a thinking model opens a block.
    Free,
    /// The prompt opened `<think>`: write the rest of the block.
    Inside,
    /// The prompt holds an empty, closed block: thinking is off.
    Closed,
}

/// The parts of a ChatML prompt the agent acts on.
#[derive(Debug, Clone, PartialEq)]
struct Conversation {
    tools: Vec<Tool>,
    last_turn: LastTurn,
    /// The text of the last user turn that is not only tool results.
    user_text: String,
    think: ThinkState,
}

impl AgentModel {
    pub fn new(model: &ModelFacts) -> Self {
        let single = |marker| model.tokenizer.token_to_id(marker).is_some();
        Self {
            thinks: single(THINK_START) && single(THINK_END),
        }
    }

    /// The completion for `prompt` (decoded with special tokens kept), or
    /// `None` for the worker's usual output; `json_schema` is the request's
    /// JSON-schema constraint, if any.
    pub fn completion_for(&self, prompt: &str, json_schema: Option<&str>) -> Option<String> {
        let conversation = Conversation::read(prompt);
        if let Some(schema) = json_schema {
            let schema: Value = serde_json::from_str(schema).ok()?;
            let hints = conversation
                .as_ref()
                .map(Hints::from_conversation)
                .unwrap_or_default();
            return serde_json::to_string(&value_for_schema(&schema, &hints)).ok();
        }
        let conversation = conversation?;
        if conversation.tools.is_empty() {
            return None;
        }
        let hints = Hints::from_conversation(&conversation);
        let (thought, answer) = match &conversation.last_turn {
            LastTurn::User(_) => {
                let tool = conversation
                    .tools
                    .iter()
                    .find(|tool| Some(&tool.name) == hints.preferred_tool.as_ref())
                    .or_else(|| conversation.tools.first())?;
                let call = json!({
                    "name": tool.name,
                    "arguments": value_for_schema(&tool.parameters, &hints),
                });
                (
                    format!("The user needs {}: I will call it.", tool.name),
                    format!("<tool_call>\n{call}\n</tool_call>"),
                )
            }
            LastTurn::ToolResults(results) => {
                let said = match results.as_slice() {
                    [one] => format!("The tool said: {one}"),
                    many => format!("The tools said: {}", many.join("; ")),
                };
                ("The results are in: I will answer.".to_owned(), said)
            }
            LastTurn::Other => return None,
        };
        Some(match (self.thinks, conversation.think) {
            (true, ThinkState::Free) => {
                format!("{THINK_START}\n{thought}\n{THINK_END}\n\n{answer}")
            }
            (true, ThinkState::Inside) => format!("{thought}\n{THINK_END}\n\n{answer}"),
            _ => answer,
        })
    }
}

impl Conversation {
    /// Reads a ChatML prompt that ends with the assistant's generation
    /// prompt; `None` for any other text.
    fn read(prompt: &str) -> Option<Self> {
        let mut turns: Vec<(&str, &str)> = Vec::new();
        let mut generation = None;
        for segment in prompt.split(TURN_START).skip(1) {
            let (role, rest) = segment.split_once('\n')?;
            match rest.split_once(TURN_END) {
                Some((content, _)) => turns.push((role.trim(), content)),
                None => generation = Some((role.trim(), rest)),
            }
        }
        let (role, tail) = generation?;
        if role != "assistant" {
            return None;
        }
        let tail = tail.trim();
        let think = if tail.ends_with(THINK_END) {
            ThinkState::Closed
        } else if tail.ends_with(THINK_START) {
            ThinkState::Inside
        } else {
            ThinkState::Free
        };
        let tools = turns
            .iter()
            .find(|(role, _)| *role == "system")
            .map(|(_, content)| tools_in(content))
            .unwrap_or_default();
        let last_turn = match turns.last() {
            Some(&("tool", _)) => LastTurn::ToolResults(
                turns
                    .iter()
                    .rev()
                    .take_while(|(role, _)| *role == "tool")
                    .map(|(_, content)| (*content).to_owned())
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect(),
            ),
            Some(&("user", content)) => match tool_responses_in(content) {
                Some(results) => LastTurn::ToolResults(results),
                None => LastTurn::User(content.to_owned()),
            },
            _ => LastTurn::Other,
        };
        let user_text = turns
            .iter()
            .rev()
            .find(|(role, content)| *role == "user" && tool_responses_in(content).is_none())
            .map(|(_, content)| (*content).to_owned())
            .unwrap_or_default();
        Some(Self {
            tools,
            last_turn,
            user_text,
            think,
        })
    }
}

/// The tools of a Hermes `<tools>` block: one JSON object a line, OpenAI's
/// shape (`{"type": "function", "function": {…}}`) or the bare function.
/// The first block that lists any counts (instructions may name the tags,
/// as Qwen3's "listed between <tools></tools>" does).
fn tools_in(system: &str) -> Vec<Tool> {
    system
        .split("<tools>")
        .skip(1)
        .map(|after| {
            let block = after
                .split_once("</tools>")
                .map_or(after, |(block, _)| block);
            block
                .lines()
                .filter_map(|line| serde_json::from_str::<Value>(line.trim()).ok())
                .filter_map(|tool| {
                    let function = tool.get("function").unwrap_or(&tool);
                    Some(Tool {
                        name: function.get("name")?.as_str()?.to_owned(),
                        description: function
                            .get("description")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                        parameters: function
                            .get("parameters")
                            .filter(|schema| !schema.is_null())
                            .cloned()
                            .unwrap_or_else(|| json!({"type": "object"})),
                    })
                })
                .collect::<Vec<_>>()
        })
        .find(|tools| !tools.is_empty())
        .unwrap_or_default()
}

/// The results of a user turn made of `<tool_response>` blocks (how Qwen3's
/// template renders `tool` messages); `None` when it holds none.
fn tool_responses_in(content: &str) -> Option<Vec<String>> {
    let mut results = Vec::new();
    let mut rest = content;
    while let Some((_, after)) = rest.split_once("<tool_response>") {
        let (result, next) = after.split_once("</tool_response>").unwrap_or((after, ""));
        results.push(result.trim_matches('\n').to_owned());
        rest = next;
    }
    (!results.is_empty()).then_some(results)
}

/// What a call is made from: the tool the user's text points to, and words
/// of theirs for string values.
#[derive(Debug, Clone, Default, PartialEq)]
struct Hints {
    preferred_tool: Option<String>,
    words: SalientWords,
}

impl Hints {
    fn from_conversation(conversation: &Conversation) -> Self {
        let text = &conversation.user_text;
        Self {
            preferred_tool: most_relevant_tool(&conversation.tools, text)
                .map(|tool| tool.name.clone()),
            words: SalientWords::of(text),
        }
    }

    /// The string for property `property` (`None`: an array item, a bare
    /// schema): a word with digits for an id-like name, else a name-like
    /// word (the `names_taken`-th in the text, so `origin` and `destination`
    /// get the two places the user named, in order; the last once they run
    /// out), else any salient word, else [`FALLBACK_WORD`]; and whether the
    /// word is one of the names.
    fn word_for(&self, property: Option<&str>, names_taken: usize) -> (&str, bool) {
        let words = &self.words;
        let wants_digits = property.is_some_and(|name| {
            let lower = name.to_lowercase();
            lower == "id"
                || lower.ends_with("_id")
                || name.ends_with("Id")
                || ID_LIKE_NAMES.iter().any(|part| lower.contains(part))
        });
        let name = words
            .capitalised
            .get(names_taken)
            .or(words.capitalised.last());
        let (digits, plain) = (words.with_digits.as_ref(), words.plain.as_ref());
        let ordered = if wants_digits {
            [(digits, false), (name, true), (plain, false)]
        } else {
            [(name, true), (plain, false), (digits, false)]
        };
        ordered
            .into_iter()
            .find_map(|(word, is_name)| Some((word?.as_str(), is_name)))
            .unwrap_or((FALLBACK_WORD, false))
    }
}

/// The tool the user's text points to: the first it names outright, else
/// the one whose name and description share the most words with it (a name
/// word counts twice; `flight` matches `flights`), the first on a tie;
/// `None` when no tool shares a word.
fn most_relevant_tool<'t>(tools: &'t [Tool], text: &str) -> Option<&'t Tool> {
    if let Some(named) = tools.iter().find(|tool| text.contains(&tool.name)) {
        return Some(named);
    }
    let user_words = content_words(text);
    let shared = |words: Vec<String>| {
        words
            .iter()
            .filter(|word| user_words.iter().any(|user| same_word(user, word)))
            .count()
    };
    let mut best: Option<(&Tool, usize)> = None;
    for tool in tools {
        let score = 2 * shared(content_words(&split_identifier(&tool.name)))
            + shared(content_words(&tool.description));
        if score > 0 && best.is_none_or(|(_, top)| score > top) {
            best = Some((tool, score));
        }
    }
    best.map(|(tool, _)| tool)
}

/// The distinct lowercase words of `text` of three or more characters that
/// are not stop words.
fn content_words(text: &str) -> Vec<String> {
    let mut words: Vec<String> = Vec::new();
    for word in text.split(|c: char| !c.is_alphanumeric()) {
        let word = word.to_lowercase();
        if word.chars().count() >= 3
            && !STOP_WORDS.contains(&word.as_str())
            && !words.contains(&word)
        {
            words.push(word);
        }
    }
    words
}

/// `get_weather`, `getWeather` and `get-weather` as `get weather`.
fn split_identifier(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    let mut previous_lower = false;
    for c in name.chars() {
        if c.is_uppercase() && previous_lower {
            out.push(' ');
        }
        previous_lower = c.is_lowercase();
        out.push(if c.is_alphanumeric() { c } else { ' ' });
    }
    out
}

/// Equal, or one a prefix of the other when both have four or more
/// characters (`flight`, `flights`; `book`, `booking`).
fn same_word(a: &str, b: &str) -> bool {
    a == b || (a.len().min(b.len()) >= 4 && (a.starts_with(b) || b.starts_with(a)))
}

/// Parts of a property name that ask for a number-like string.
const ID_LIKE_NAMES: &[&str] = &["number", "code", "zip", "phone", "sku"];

/// The words of the user's text a string argument most plausibly wants.
#[derive(Debug, Clone, Default, PartialEq)]
struct SalientWords {
    /// Capitalised words that do not open a sentence (places, names), each
    /// once, in the order of the text.
    capitalised: Vec<String>,
    /// The last word with a digit in it: an id, a number.
    with_digits: Option<String>,
    /// The last word of three or more characters that is not a stop word.
    plain: Option<String>,
}

impl SalientWords {
    fn of(text: &str) -> Self {
        let mut words = Self::default();
        let mut opens_sentence = true;
        for raw in text.split_whitespace() {
            let word = raw.trim_matches(|c: char| !c.is_alphanumeric());
            if !word.is_empty() {
                let starts_upper = word.chars().next().is_some_and(char::is_uppercase);
                if starts_upper
                    && !opens_sentence
                    && word != "I"
                    && !words.capitalised.iter().any(|known| known == word)
                {
                    words.capitalised.push(word.to_owned());
                }
                if word.chars().any(|c| c.is_ascii_digit()) {
                    words.with_digits = Some(word.to_owned());
                }
                let lower = word.to_lowercase();
                if word.chars().count() >= 3 && !STOP_WORDS.contains(&lower.as_str()) {
                    words.plain = Some(word.to_owned());
                }
            }
            opens_sentence = raw.ends_with(['.', '?', '!', ':']);
        }
        words
    }
}

/// A value that satisfies `schema` (the common JSON-schema keywords: `$ref`
/// into `$defs`/`definitions`, `const`, `enum`, `anyOf`/`oneOf`/`allOf`,
/// `type` and its bounds). Objects get their required properties (the first
/// property when none is required); arrays `minItems` items, at least one.
fn value_for_schema(schema: &Value, hints: &Hints) -> Value {
    SchemaWalk {
        root: schema,
        hints,
        names_taken: std::cell::Cell::new(0),
    }
    .value(schema, 0, None)
}

struct SchemaWalk<'a> {
    root: &'a Value,
    hints: &'a Hints,
    /// How many names string values have taken so far (see
    /// [`Hints::word_for`]).
    names_taken: std::cell::Cell<usize>,
}

impl SchemaWalk<'_> {
    fn value(&self, schema: &Value, depth: usize, property: Option<&str>) -> Value {
        if depth > MAX_SCHEMA_DEPTH {
            return Value::Null;
        }
        let Some(object) = schema.as_object() else {
            // `true` (anything) or `false` (nothing can match).
            return match schema {
                Value::Bool(true) => Value::String(self.word_for(property)),
                _ => Value::Null,
            };
        };
        if let Some(target) = object.get("$ref").and_then(Value::as_str) {
            let resolved = target
                .strip_prefix('#')
                .and_then(|pointer| self.root.pointer(pointer));
            return resolved.map_or(Value::Null, |schema| {
                self.value(schema, depth + 1, property)
            });
        }
        if let Some(value) = object.get("const") {
            return value.clone();
        }
        if let Some(first) = object
            .get("enum")
            .and_then(Value::as_array)
            .and_then(|values| values.first())
        {
            return first.clone();
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(chosen) = object
                .get(key)
                .and_then(Value::as_array)
                .and_then(|alternatives| self.choose(alternatives))
            {
                return self.value(chosen, depth + 1, property);
            }
        }
        if let Some(parts) = object.get("allOf").and_then(Value::as_array) {
            return self.value(&merge_all_of(object, parts), depth + 1, property);
        }
        match schema_type(object) {
            "object" => self.object(object, depth),
            "array" => {
                let wanted = object
                    .get("minItems")
                    .and_then(Value::as_u64)
                    .unwrap_or(1)
                    .max(1);
                let allowed = object
                    .get("maxItems")
                    .and_then(Value::as_u64)
                    .unwrap_or(u64::MAX);
                let items = object.get("items").unwrap_or(&Value::Bool(true));
                (0..wanted.min(allowed))
                    .map(|_| self.value(items, depth + 1, None))
                    .collect()
            }
            "integer" => Value::from(bounded_number(object, 1.0).ceil() as i64),
            "number" => json_number(bounded_number(object, 1.0)),
            "boolean" => Value::Bool(true),
            "null" => Value::Null,
            _ => Value::String(self.string(object, property)),
        }
    }

    /// The alternative to follow: the one that names the preferred tool
    /// (`tool_choice: required` lists one per tool), else the first that
    /// is not `null`.
    fn choose<'s>(&self, alternatives: &'s [Value]) -> Option<&'s Value> {
        let names_preferred = |alternative: &&Value| {
            let name = alternative.pointer("/properties/name/enum/0");
            name.is_some() && name.and_then(Value::as_str) == self.hints.preferred_tool.as_deref()
        };
        alternatives
            .iter()
            .find(names_preferred)
            .or_else(|| {
                alternatives
                    .iter()
                    .find(|alternative| alternative.get("type") != Some(&json!("null")))
            })
            .or_else(|| alternatives.first())
    }

    fn word_for(&self, property: Option<&str>) -> String {
        let taken = self.names_taken.get();
        let (word, is_name) = self.hints.word_for(property, taken);
        if is_name {
            self.names_taken.set(taken + 1);
        }
        word.to_owned()
    }

    fn object(&self, object: &Map<String, Value>, depth: usize) -> Value {
        let empty = Map::new();
        let properties = object
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let mut names: Vec<&str> = object
            .get("required")
            .and_then(Value::as_array)
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if names.is_empty() {
            names.extend(properties.keys().map(String::as_str).take(1));
        }
        let mut out = Map::new();
        for name in names {
            let schema = properties.get(name).unwrap_or(&Value::Bool(true));
            out.insert(name.to_owned(), self.value(schema, depth + 1, Some(name)));
        }
        Value::Object(out)
    }

    fn string(&self, object: &Map<String, Value>, property: Option<&str>) -> String {
        let text = match object.get("format").and_then(Value::as_str) {
            Some("date") => "2025-01-01".to_owned(),
            Some("date-time") => "2025-01-01T00:00:00Z".to_owned(),
            Some("time") => "12:00:00".to_owned(),
            Some("email") => "demo@example.com".to_owned(),
            Some("uri" | "url") => "https://example.com/".to_owned(),
            Some("uuid") => "00000000-0000-4000-8000-000000000000".to_owned(),
            _ => self.word_for(property),
        };
        let length = |key| {
            object
                .get(key)
                .and_then(Value::as_u64)
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
        };
        let mut text: String = match length("maxLength") {
            Some(max) => text.chars().take(max).collect(),
            None => text,
        };
        if let Some(min) = length("minLength") {
            while text.chars().count() < min {
                text.push('x');
            }
        }
        text
    }
}

/// The schema's type: `type` (the first that is not `null` of a list),
/// else what its keywords imply.
fn schema_type(object: &Map<String, Value>) -> &str {
    match object.get("type") {
        Some(Value::String(name)) => name,
        Some(Value::Array(names)) => names
            .iter()
            .filter_map(Value::as_str)
            .find(|name| *name != "null")
            .unwrap_or("null"),
        _ if object.contains_key("properties") || object.contains_key("required") => "object",
        _ if object.contains_key("items") => "array",
        _ => "string",
    }
}

/// `allOf`'s parts folded into one schema: properties and required names
/// united, other keywords from the first part that has them.
fn merge_all_of(object: &Map<String, Value>, parts: &[Value]) -> Value {
    let mut merged = object.clone();
    merged.remove("allOf");
    let mut properties = Map::new();
    let mut required = Vec::new();
    for part in std::iter::once(&Value::Object(object.clone())).chain(parts) {
        let Some(part) = part.as_object() else {
            continue;
        };
        if let Some(own) = part.get("properties").and_then(Value::as_object) {
            properties.extend(own.clone());
        }
        if let Some(own) = part.get("required").and_then(Value::as_array) {
            required.extend(own.iter().cloned());
        }
        for (key, value) in part {
            if key != "properties" && key != "required" && key != "allOf" {
                merged.entry(key.clone()).or_insert_with(|| value.clone());
            }
        }
    }
    if !properties.is_empty() {
        merged.insert("properties".to_owned(), Value::Object(properties));
    }
    if !required.is_empty() {
        merged.insert("required".to_owned(), Value::Array(required));
    }
    Value::Object(merged)
}

/// `preferred` moved inside the schema's `minimum`/`maximum` (exclusive
/// bounds by one).
fn bounded_number(object: &Map<String, Value>, preferred: f64) -> f64 {
    let bound = |key| object.get(key).and_then(Value::as_f64);
    let mut value = preferred;
    if let Some(min) = bound("minimum") {
        value = value.max(min);
    }
    if let Some(min) = bound("exclusiveMinimum") {
        value = value.max(min + 1.0);
    }
    if let Some(max) = bound("maximum") {
        value = value.min(max);
    }
    if let Some(max) = bound("exclusiveMaximum") {
        value = value.min(max - 1.0);
    }
    value
}

/// A whole number as a JSON integer (`1`, not `1.0`), anything else as is.
fn json_number(value: f64) -> Value {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        Value::from(value as i64)
    } else {
        serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(thinks: bool) -> AgentModel {
        AgentModel { thinks }
    }

    const TOOLS_LINE: &str = r#"{"type": "function", "function": {"name": "find_order", "description": "An order by id", "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}, "count": {"type": "integer", "minimum": 3}, "express": {"type": "boolean"}, "channel": {"enum": ["web", "shop"]}, "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "number"}}, "required": ["city", "zip"]}}, "required": ["order_id", "count", "express", "channel", "address"]}}}"#;
    const SECOND_TOOL: &str =
        r#"{"type": "function", "function": {"name": "cancel_order", "parameters": null}}"#;

    /// A prompt as the bundled model's template renders it.
    fn bundled_prompt(turns: &[(&str, &str)]) -> String {
        let mut prompt = format!(
            "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n\nYou can call the \
             functions below.\n\n<tools>\n{TOOLS_LINE}\n{SECOND_TOOL}\n</tools><|im_end|>\n"
        );
        for (role, content) in turns {
            prompt.push_str(&format!("<|im_start|>{role}\n{content}<|im_end|>\n"));
        }
        prompt.push_str("<|im_start|>assistant\n");
        prompt
    }

    #[test]
    fn a_user_turn_with_tools_gets_a_call_of_the_first_tool_built_from_its_schema() {
        let prompt = bundled_prompt(&[("user", "Where is my parcel to Lisbon?")]);
        let text = agent(false).completion_for(&prompt, None).expect("a call");
        let body = text
            .strip_prefix("<tool_call>\n")
            .and_then(|rest| rest.strip_suffix("\n</tool_call>"))
            .expect("a Hermes call");
        let call: Value = serde_json::from_str(body).expect("JSON");
        assert_eq!(
            call,
            json!({"name": "find_order", "arguments": {
                "order_id": "Lisbon", "count": 3, "express": true, "channel": "web",
                "address": {"city": "Lisbon", "zip": 1}}})
        );
    }

    #[test]
    fn a_tool_the_user_names_is_the_one_called() {
        let prompt = bundled_prompt(&[("user", "please cancel_order now")]);
        let text = agent(false).completion_for(&prompt, None).expect("a call");
        assert_eq!(
            text,
            "<tool_call>\n{\"name\":\"cancel_order\",\"arguments\":{}}\n</tool_call>"
        );
    }

    #[test]
    fn the_tool_the_text_points_to_is_the_one_called() {
        let tool = |name: &str, description: &str| Tool {
            name: name.to_owned(),
            description: description.to_owned(),
            parameters: json!({"type": "object"}),
        };
        let tools = [
            tool("get_time", "The current time"),
            tool("getWeather", "Current weather for a location"),
            tool("search_flights", "Finds flights between two cities"),
        ];
        let pick = |text| most_relevant_tool(&tools, text).map(|tool| tool.name.as_str());
        assert_eq!(
            pick("What's the weather like in Boston today?"),
            Some("getWeather")
        );
        assert_eq!(
            pick("Any flight from Lisbon to Oslo?"),
            Some("search_flights")
        );
        assert_eq!(pick("Use getWeather, not the time"), Some("getWeather"));
        assert_eq!(pick("Hello there"), None);
        // A tie goes to the first tool.
        assert_eq!(pick("the current thing"), Some("get_time"));
    }

    #[test]
    fn tool_results_are_quoted_in_plain_text() {
        let prompt = bundled_prompt(&[
            ("user", "Where is it?"),
            ("assistant", ""),
            ("tool", "{\"status\": \"shipped\"}"),
        ]);
        assert_eq!(
            agent(false).completion_for(&prompt, None).as_deref(),
            Some("The tool said: {\"status\": \"shipped\"}")
        );
        let two = bundled_prompt(&[
            ("user", "Where is it?"),
            ("assistant", ""),
            ("tool", "one"),
            ("tool", "two"),
        ]);
        assert_eq!(
            agent(false).completion_for(&two, None).as_deref(),
            Some("The tools said: one; two")
        );
    }

    #[test]
    fn qwen3_style_results_and_the_thinking_switch() {
        // Qwen3's instructions name the tags before the block itself.
        let system = format!(
            "<|im_start|>system\n# Tools\n\nlisted between <tools></tools>, one a line:\n\
             <tools>\n{TOOLS_LINE}\n</tools>\n<|im_end|>\n"
        );
        let user = "<|im_start|>user\nFind order 8812<|im_end|>\n";
        let thinking = format!("{system}{user}<|im_start|>assistant\n");
        let text = agent(true).completion_for(&thinking, None).expect("a call");
        assert!(
            text.starts_with("<think>\nThe user needs find_order"),
            "{text}"
        );
        assert!(
            text.contains("</think>\n\n<tool_call>\n{\"name\":\"find_order\""),
            "{text}"
        );
        assert!(text.contains("\"order_id\":\"8812\""), "{text}");

        let off = format!("{thinking}<think>\n\n</think>\n\n");
        let text = agent(true).completion_for(&off, None).expect("a call");
        assert!(text.starts_with("<tool_call>"), "{text}");
        let inside = format!("{thinking}<think>\n");
        let text = agent(true).completion_for(&inside, None).expect("a call");
        assert!(text.starts_with("The user needs") && text.contains("\n</think>\n\n<tool_call>"));

        let results = format!(
            "{system}{user}<|im_start|>assistant\n<tool_call>\n{{}}\n</tool_call><|im_end|>\n\
             <|im_start|>user\n<tool_response>\nshipped\n</tool_response>\n<tool_response>\n\
             late\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            agent(true).completion_for(&results, None).as_deref(),
            Some(
                "<think>\nThe results are in: I will answer.\n</think>\n\nThe tools said: shipped; late"
            )
        );
        // The model without think markers never writes a block.
        assert_eq!(
            agent(false).completion_for(&results, None).as_deref(),
            Some("The tools said: shipped; late")
        );
    }

    #[test]
    fn prompts_without_tools_or_chat_turns_keep_the_usual_output() {
        let plain = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n\
                     <|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n";
        assert_eq!(agent(true).completion_for(plain, None), None);
        assert_eq!(agent(true).completion_for("just some text", None), None);
        let ends_with_assistant = bundled_prompt(&[("user", "hi"), ("assistant", "hello")]);
        // The last turn is the assistant's: nothing to act on.
        assert_eq!(
            agent(false).completion_for(&ends_with_assistant, None),
            None
        );
    }

    #[test]
    fn a_json_schema_constraint_gets_matching_json() {
        let prompt = bundled_prompt(&[("user", "cancel_order for Oslo")]);
        // tool_choice "required": the array of named calls.
        let required = json!({"type": "array", "minItems": 1, "maxItems": 1, "items": {"anyOf": [
            {"type": "object", "properties": {"name": {"type": "string", "enum": ["find_order"]},
             "parameters": {"type": "object", "properties": {"id": {"$ref": "#/$defs/id"}},
                            "required": ["id"]}}, "required": ["name", "parameters"]},
            {"type": "object", "properties": {"name": {"type": "string", "enum": ["cancel_order"]},
             "parameters": {"type": "object"}}, "required": ["name", "parameters"]}]},
            "$defs": {"id": {"type": "string", "minLength": 8}}});
        let text = agent(false)
            .completion_for(&prompt, Some(&required.to_string()))
            .expect("JSON");
        assert_eq!(
            serde_json::from_str::<Value>(&text).expect("JSON"),
            json!([{"name": "cancel_order", "parameters": {}}])
        );
        let plain = bundled_prompt(&[("user", "for Oslo")]);
        let text = agent(false)
            .completion_for(&plain, Some(&required.to_string()))
            .expect("JSON");
        assert_eq!(
            serde_json::from_str::<Value>(&text).expect("JSON"),
            json!([{"name": "find_order", "parameters": {"id": "Osloxxxx"}}])
        );
        // A named function: its arguments object; any prompt will do.
        let named = json!({"type": "object", "properties": {
            "when": {"type": "string", "format": "date"},
            "ratio": {"type": ["number", "null"], "exclusiveMaximum": 0.5},
            "tags": {"type": "array", "items": {"type": "string"}},
            "note": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 2}]},
            "both": {"allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                               {"properties": {"b": {"const": "x"}}, "required": ["b"]}]}},
            "required": ["when", "ratio", "tags", "note", "both"]});
        let text = agent(false)
            .completion_for("no chat here", Some(&named.to_string()))
            .expect("JSON");
        assert_eq!(
            serde_json::from_str::<Value>(&text).expect("JSON"),
            json!({"when": "2025-01-01", "ratio": -0.5, "tags": ["demo"], "note": "de",
                   "both": {"a": 1, "b": "x"}})
        );
    }

    #[test]
    fn string_arguments_take_the_users_words() {
        let hints = |text| Hints {
            preferred_tool: None,
            words: SalientWords::of(text),
        };
        let paris = hints("What's the weather in Paris today?");
        assert_eq!(paris.word_for(Some("city"), 0).0, "Paris");
        assert_eq!(paris.word_for(Some("country"), 1).0, "Paris");
        let order = hints("Look up order 8812 for Alice");
        assert_eq!(order.word_for(Some("order_id"), 0).0, "8812");
        assert_eq!(order.word_for(Some("orderId"), 0).0, "8812");
        assert_eq!(order.word_for(Some("customer"), 0).0, "Alice");
        assert_eq!(order.word_for(None, 0).0, "Alice");
        let trip = hints("Fly me from Lisbon to Oslo, then Lisbon again.");
        assert_eq!(trip.word_for(Some("origin"), 0).0, "Lisbon");
        assert_eq!(trip.word_for(Some("destination"), 1).0, "Oslo");
        assert_eq!(trip.word_for(Some("stopover"), 2).0, "Oslo");
        assert_eq!(
            hints("Look up the orders").word_for(Some("query"), 0).0,
            "orders"
        );
        assert_eq!(
            hints("What is it?").word_for(Some("city"), 0).0,
            FALLBACK_WORD
        );
        assert_eq!(
            hints("Hello. Weather please").word_for(None, 0).0,
            "Weather"
        );

        // An id takes no name: the two places go to the two place fields.
        let trip = hints("Rebook 77A from Lisbon to Oslo");
        let schema = json!({"type": "object", "required": ["booking_id", "origin", "destination"],
            "properties": {"booking_id": {"type": "string"}, "origin": {"type": "string"},
                           "destination": {"type": "string"}}});
        assert_eq!(
            value_for_schema(&schema, &trip),
            json!({"booking_id": "77A", "origin": "Lisbon", "destination": "Oslo"})
        );
    }
}
