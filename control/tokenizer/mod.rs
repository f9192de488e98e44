//! The gateway's tokenizer: text to ids and back, the chat template, and the
//! per-sequence state that turns generated ids into client text.
//!
//! Engines take token ids and return token ids, so everything textual about
//! a request happens here, loaded from the same Hugging Face files the model
//! ships (a model directory, or the archive a worker's `GetTokenizer` RPC
//! returns). A [`Tokenizer`] is loaded once per model and shared by every
//! request; per-sequence state lives in an [`IncrementalDecoder`] and a
//! [`StopMatcher`].
//!
//! - `files.rs` reads the files from a directory or an archive, bounded
//!   (regular files only, a byte and entry budget): a worker may supply
//!   either.
//! - `chat_template.rs` renders prompts the way `transformers` does.
//! - `python_compat.rs` supplies the Python behaviours templates rely on.
//! - `detokenizer.rs` streams ids back to text without splitting characters.
//! - `segments.rs` tokenizes prompts piece by piece between added tokens,
//!   caching the pieces (system prompts, role headers) that recur.
//! - `byte_level_bpe.rs` encodes those pieces directly for byte-level BPE
//!   tokenizers (GPT-2, Qwen2, Llama 3 style), with `tokenizers`' ids.
//! - `byte_decode.rs` decodes ids for byte-level BPE tokenizers from a
//!   table of each id's bytes, exactly as `tokenizers` does but without its
//!   per-token allocations.
//! - `stop.rs` finds and trims stop strings in the streamed text.

mod byte_decode;
mod byte_level;
mod byte_level_bpe;
mod chat_template;
mod detokenizer;
mod files;
mod python_compat;
mod segments;
mod split;
mod stop;

pub use chat_template::{
    ChatTemplate, ChatTemplateOptions, RenderBudget, TemplateBudget, TemplateTools, json_text_bytes,
};
pub use detokenizer::IncrementalDecoder;
pub use stop::{StopMatcher, StopOutcome};

use std::collections::HashSet;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use serde_json::{Map, Value};
use tokenizers::PostProcessor;

use crate::error::{Error, Result};
use byte_decode::ByteLevelTable;
use files::{Links, ModelFiles};
use segments::SegmentEncoder;

/// The special tokens `transformers` exposes to chat templates by name (its
/// `special_tokens_map`; since version 5 that no longer holds
/// `additional_special_tokens`, so templates are not given them).
const SPECIAL_TOKEN_NAMES: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// A model's tokenizer and chat template. Cloning is cheap: clones share one
/// loaded tokenizer.
#[derive(Clone)]
pub struct Tokenizer {
    loaded: Arc<Loaded>,
    /// Beside `loaded` so that its budget can be set after loading.
    chat_template: Option<Arc<ChatTemplate>>,
}

struct Loaded {
    tokenizer: tokenizers::Tokenizer,
    /// The cached piece-by-piece path, when it reproduces `tokenizer`.
    segments: Option<SegmentEncoder>,
    /// Whether `add_special_tokens` adds nothing (no post-processor that
    /// inserts tokens), so both settings may use `segments`.
    adds_no_special_tokens: bool,
    eos_token_ids: Vec<u32>,
    /// Ids of added tokens flagged `special` (what `skip_special_tokens` drops).
    special_ids: HashSet<u32>,
    /// Ids of every added token (their content is plain text).
    added_ids: HashSet<u32>,
    /// Whether vocabulary entries spell bytes in the byte-level alphabet.
    byte_level: bool,
    /// Every id's bytes, when the decoder is byte-level alone: `decode`
    /// without `tokenizers`.
    byte_table: Option<ByteLevelTable>,
    /// The vision preprocessing files found beside the tokenizer's.
    vision: Option<VisionFiles>,
    /// `bos_token`, `eos_token`, ... by name: the variables a chat template
    /// given later ([`Tokenizer::with_chat_template`]) is compiled with.
    special_tokens: Map<String, Value>,
}

/// A model's vision preprocessing settings, as found with its tokenizer
/// (a model directory, a worker's directory or its `GetTokenizer`
/// archive): `preprocessor_config.json` and `config.json`, as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VisionFiles {
    pub preprocessor_config: String,
    pub model_config: Option<String>,
}

impl Tokenizer {
    /// Loads `tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja`,
    /// `special_tokens_map.json`, `generation_config.json` and `config.json`
    /// from a model directory. Only `tokenizer.json` is required.
    /// Symlinks are followed (to regular files only): this is the
    /// operator's directory.
    pub fn from_model_dir(dir: &Path) -> Result<Self> {
        Self::from_files(ModelFiles::from_dir(dir, Links::Follow)?)
    }

    /// Loads the same files from a directory a worker advertised (its
    /// `tokenizer_path`): regular files only, no symlinks, size-capped,
    /// never blocking on a FIFO. Blocking file I/O: run it off the async
    /// runtime.
    pub fn from_worker_dir(dir: &Path) -> Result<Self> {
        Self::from_files(ModelFiles::from_dir(dir, Links::Refuse)?)
    }

    /// Loads the same files from a zip archive (what a worker's
    /// `GetTokenizer` returns), in memory.
    pub fn from_archive(archive: &[u8]) -> Result<Self> {
        Self::from_files(ModelFiles::from_archive(archive)?)
    }

    fn from_files(files: ModelFiles) -> Result<Self> {
        let tokenizer = tokenizers::Tokenizer::from_bytes(&files.tokenizer_json)
            .map_err(|err| Error::internal(format!("tokenizer.json does not load: {err}")))?;
        let special_tokens = special_tokens(&files);
        // As in `transformers`, a chat_template.jinja file replaces the
        // template in tokenizer_config.json.
        let chat_template = match (&files.chat_template_jinja, &files.tokenizer_config) {
            (Some(source), _) => Some(ChatTemplate::compile(source.clone(), &special_tokens)?),
            (None, Some(config)) => match config.get("chat_template") {
                Some(field) if !field.is_null() => {
                    Some(ChatTemplate::from_config_field(field, &special_tokens)?)
                }
                _ => None,
            },
            (None, None) => None,
        };
        let eos_token_ids = eos_token_ids(&files, &tokenizer, &special_tokens);
        let added_tokens = tokenizer.get_added_tokens_decoder();
        let special_ids = added_tokens
            .iter()
            .filter(|(_, token)| token.special)
            .map(|(id, _)| *id)
            .collect();
        let added_ids = added_tokens.into_keys().collect();
        let byte_level = matches!(
            tokenizer.get_decoder(),
            Some(tokenizers::DecoderWrapper::ByteLevel(_))
        );
        let byte_table = ByteLevelTable::build(&tokenizer);
        let segments = SegmentEncoder::for_tokenizer(&tokenizer);
        if segments.is_none() {
            tracing::debug!("this tokenizer's added tokens are not cut verbatim: no piece cache");
        }
        let adds_no_special_tokens = tokenizer
            .get_post_processor()
            .is_none_or(|processor| processor.added_tokens(false) == 0);
        let vision = files
            .preprocessor_config
            .map(|preprocessor_config| VisionFiles {
                preprocessor_config,
                model_config: files.model_config.as_ref().map(ToString::to_string),
            });
        Ok(Self {
            chat_template: chat_template.map(Arc::new),
            loaded: Arc::new(Loaded {
                tokenizer,
                segments,
                adds_no_special_tokens,
                eos_token_ids,
                special_ids,
                added_ids,
                byte_level,
                byte_table,
                vision,
                special_tokens,
            }),
        })
    }

    /// The same tokenizer with `source` as its chat template, replacing the
    /// one it was loaded with (`--chat-template`). The template sees this
    /// tokenizer's special tokens and keeps its rendering budget.
    pub fn with_chat_template(mut self, source: &str) -> Result<Self> {
        let budget = self.template_budget().unwrap_or_default();
        let template = ChatTemplate::compile(source.to_owned(), &self.loaded.special_tokens)?
            .with_budget(budget);
        self.chat_template = Some(Arc::new(template));
        Ok(self)
    }

    /// The same tokenizer, its chat template rendering on `budget` (the
    /// default is [`TemplateBudget::default`]).
    pub fn with_template_budget(mut self, budget: TemplateBudget) -> Self {
        if let Some(template) = &self.chat_template {
            self.chat_template = Some(Arc::new(template.as_ref().clone().with_budget(budget)));
        }
        self
    }

    /// The budget one chat template rendering runs on; `None` without a
    /// template.
    pub fn template_budget(&self) -> Option<TemplateBudget> {
        self.chat_template.as_deref().map(ChatTemplate::budget)
    }

    /// The vision preprocessing files found with the tokenizer, if any.
    pub fn vision_files(&self) -> Option<&VisionFiles> {
        self.loaded.vision.as_ref()
    }

    /// The ids of `text`; `add_special_tokens` applies the tokenizer's
    /// post-processor (e.g. a BOS token).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let loaded = &*self.loaded;
        let failed = |err| Error::internal(format!("cannot tokenize the text: {err}"));
        match &loaded.segments {
            Some(segments) if !add_special_tokens || loaded.adds_no_special_tokens => {
                segments.encode(&loaded.tokenizer, text).map_err(failed)
            }
            _ => loaded
                .tokenizer
                .encode_fast(text, add_special_tokens)
                .map(|encoding| encoding.get_ids().to_vec())
                .map_err(failed),
        }
    }

    /// The text of `ids`. Ids outside the vocabulary are ignored; bytes that
    /// do not form UTF-8 come out as U+FFFD. Byte-level BPE tokenizers
    /// decode from a table with the same result (`byte_decode.rs`); others
    /// through `tokenizers`, whose errors fail with `internal_error`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        if let Some(table) = &self.loaded.byte_table {
            return Ok(table.decode(ids, skip_special_tokens));
        }
        self.loaded
            .tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(|err| Error::internal(format!("cannot decode token ids: {err}")))
    }

    /// The exact bytes token `id` stands for (what logprobs report): with a
    /// byte-level vocabulary these may be part of a UTF-8 character. Empty
    /// for ids outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let loaded = &*self.loaded;
        if let Some(entry) = loaded.tokenizer.id_to_token(id) {
            if loaded.added_ids.contains(&id) {
                return entry.into_bytes();
            }
            if loaded.byte_level
                && let Some(bytes) = byte_level::token_bytes(&entry)
            {
                return bytes;
            }
        }
        self.decode(&[id], false)
            .map(String::into_bytes)
            .unwrap_or_default()
    }

    /// The id of a vocabulary entry or added token, e.g. `"<|im_end|>"`.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.loaded.tokenizer.token_to_id(token)
    }

    /// The number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.loaded.tokenizer.get_vocab_size(true)
    }

    /// The ids that end generation: `generation_config.json`'s
    /// `eos_token_id`, else `config.json`'s, else the id of the
    /// `eos_token`. Empty when none is known.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.loaded.eos_token_ids
    }

    /// Whether `id` is a special token (dropped by `skip_special_tokens`).
    pub fn is_special(&self, id: u32) -> bool {
        self.loaded.special_ids.contains(&id)
    }

    /// The id `text` is, when it encodes to exactly one token that decodes
    /// back to exactly `text`: such a stop string can be a stop token id.
    pub fn single_token(&self, text: &str) -> Option<u32> {
        match self.encode(text, false).ok()?.as_slice() {
            [id] if self.decode(&[*id], false).ok()? == text => Some(*id),
            _ => None,
        }
    }

    /// The chat template's source text (all named templates, joined), if the
    /// model has one.
    pub fn chat_template_source(&self) -> Option<&str> {
        self.chat_template.as_deref().map(ChatTemplate::sources)
    }

    /// Renders the prompt for `messages` (OpenAI-style message objects) with
    /// the model's chat template. Fails with `invalid_request` when the model
    /// has no template or the template refuses the conversation, and with
    /// `chat_template_budget_exceeded` when rendering runs out of its
    /// budget.
    pub fn apply_chat_template(
        &self,
        messages: &[Value],
        options: &ChatTemplateOptions,
    ) -> Result<String> {
        self.apply_chat_template_within(messages, options, RenderBudget::Full)
    }

    /// [`Tokenizer::apply_chat_template`] on `budget`.
    pub fn apply_chat_template_within(
        &self,
        messages: &[Value],
        options: &ChatTemplateOptions,
        budget: RenderBudget,
    ) -> Result<String> {
        match &self.chat_template {
            Some(template) => template.render_within(messages, options, budget),
            None => Err(Error::invalid_request(
                "this model has no chat template; send a prompt instead of messages",
            )),
        }
    }
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("eos_token_ids", &self.loaded.eos_token_ids)
            .field("has_chat_template", &self.chat_template.is_some())
            .finish()
    }
}

/// The special tokens by name, as strings, for chat templates: from
/// tokenizer_config.json, else special_tokens_map.json. A token may be
/// written as a string or as an `{"content": ...}` object.
fn special_tokens(files: &ModelFiles) -> Map<String, Value> {
    let sources = [&files.tokenizer_config, &files.special_tokens_map];
    let lookup = |name: &str| {
        sources
            .iter()
            .filter_map(|source| source.as_ref()?.get(name))
            .find(|value| !value.is_null())
    };
    let mut tokens = Map::new();
    for name in SPECIAL_TOKEN_NAMES {
        if let Some(content) = lookup(name).and_then(token_content) {
            tokens.insert(name.to_owned(), Value::from(content));
        }
    }
    tokens
}

fn token_content(value: &Value) -> Option<&str> {
    match value {
        Value::String(content) => Some(content),
        Value::Object(token) => token.get("content")?.as_str(),
        _ => None,
    }
}

fn eos_token_ids(
    files: &ModelFiles,
    tokenizer: &tokenizers::Tokenizer,
    special_tokens: &Map<String, Value>,
) -> Vec<u32> {
    let configured = [&files.generation_config, &files.model_config]
        .into_iter()
        .filter_map(|config| ids_of(config.as_ref()?.get("eos_token_id")?))
        .find(|ids| !ids.is_empty());
    configured.unwrap_or_else(|| {
        special_tokens
            .get("eos_token")
            .and_then(Value::as_str)
            .and_then(|token| tokenizer.token_to_id(token))
            .into_iter()
            .collect()
    })
}

/// An id or a list of ids, without duplicates, in order.
fn ids_of(value: &Value) -> Option<Vec<u32>> {
    let as_id = |value: &Value| value.as_u64().and_then(|id| u32::try_from(id).ok());
    let candidates = match value {
        Value::Array(values) => values.iter().map(as_id).collect::<Option<Vec<u32>>>()?,
        single => vec![as_id(single)?],
    };
    let mut ids = Vec::with_capacity(candidates.len());
    for id in candidates {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    Some(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
    use serde_json::json;
    use std::io::Write;
    use std::path::PathBuf;

    fn fixture_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/model")
    }

    fn fixture() -> Tokenizer {
        Tokenizer::from_model_dir(&fixture_dir()).expect("the fixture model loads")
    }

    fn fixture_file(name: &str) -> Vec<u8> {
        std::fs::read(fixture_dir().join(name)).expect("fixture file exists")
    }

    /// A zip holding `files` (path, contents), as a worker would send it.
    fn zip_of(files: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let mut archive = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        for (path, contents) in files {
            archive
                .start_file(*path, options)
                .expect("zip entry starts");
            archive.write_all(contents).expect("zip entry written");
        }
        archive.finish().expect("zip finishes").into_inner()
    }

    fn json_bytes(value: Value) -> Vec<u8> {
        serde_json::to_vec(&value).expect("serializes")
    }

    /// The fixture's tokenizer.json with the given configs, from an archive.
    fn with_configs(configs: &[(&str, Value)]) -> Tokenizer {
        let mut files = vec![("tokenizer.json", fixture_file("tokenizer.json"))];
        files.extend(
            configs
                .iter()
                .map(|(name, value)| (*name, json_bytes(value.clone()))),
        );
        Tokenizer::from_archive(&zip_of(&files)).expect("the archive loads")
    }

    #[test]
    fn fixture_loads_its_vocabulary_and_special_tokens() {
        let tokenizer = fixture();
        assert_eq!(tokenizer.vocab_size(), 4007);
        assert_eq!(tokenizer.eos_token_ids(), [4002, 4000]);
        let special = [
            ("<|endoftext|>", 4000),
            ("<|im_start|>", 4001),
            ("<|im_end|>", 4002),
            ("<|vision_start|>", 4003),
            ("<|vision_end|>", 4004),
            ("<|image_pad|>", 4005),
            ("<|video_pad|>", 4006),
        ];
        for (token, id) in special {
            assert_eq!(tokenizer.token_id(token), Some(id), "{token}");
            assert!(tokenizer.is_special(id), "{token}");
        }
        assert!(!tokenizer.is_special(3352), "an ordinary word");
        assert_eq!(tokenizer.token_id("<|not_a_token|>"), None);
    }

    #[test]
    fn encode_and_decode_round_trip() {
        let tokenizer = fixture();
        let ids = tokenizer
            .encode("<|im_start|>user\nHello world<|im_end|>", false)
            .expect("encodes");
        assert_eq!(ids.first(), Some(&4001));
        assert_eq!(ids.last(), Some(&4002));
        assert_eq!(
            tokenizer.decode(&ids, false).expect("decodes"),
            "<|im_start|>user\nHello world<|im_end|>"
        );
        assert_eq!(
            tokenizer.decode(&ids, true).expect("decodes"),
            "user\nHello world"
        );
        // Known ids from the fixture's vocabulary.
        assert_eq!(
            tokenizer.encode("Hello world", false).expect("encodes"),
            [39, 415, 78, 1009]
        );
    }

    #[test]
    fn token_bytes_are_exact_even_inside_a_character() {
        let tokenizer = fixture();
        for text in ["Hello world", "naïve 日本語 🙂", "\n\t  x"] {
            let ids = tokenizer.encode(text, false).expect("encodes");
            let bytes: Vec<u8> = ids
                .iter()
                .flat_map(|&id| tokenizer.token_bytes(id))
                .collect();
            assert_eq!(bytes, text.as_bytes(), "{text:?}");
        }
        // Characters the fixture never saw split into single-byte tokens.
        let ids = tokenizer.encode("ꙮ𝔘", false).expect("encodes");
        assert!(
            ids.iter()
                .any(|&id| std::str::from_utf8(&tokenizer.token_bytes(id)).is_err())
        );
        assert_eq!(tokenizer.token_bytes(4002), b"<|im_end|>");
        assert!(tokenizer.token_bytes(999_999).is_empty());
    }

    #[test]
    fn single_token_accepts_only_exact_one_token_strings() {
        let tokenizer = fixture();
        assert_eq!(tokenizer.single_token("<|im_end|>"), Some(4002));
        assert_eq!(tokenizer.single_token(" the"), Some(344));
        assert_eq!(tokenizer.single_token("STOP"), None, "four tokens");
        assert_eq!(tokenizer.single_token(""), None);
    }

    #[test]
    fn fixture_chat_template_renders_through_the_tokenizer() {
        let prompt = fixture()
            .apply_chat_template(
                &[json!({"role": "user", "content": "Hi"})],
                &ChatTemplateOptions {
                    add_generation_prompt: true,
                    ..ChatTemplateOptions::default()
                },
            )
            .expect("renders");
        assert_eq!(
            prompt,
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n\
             <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn archive_loads_the_same_tokenizer_as_the_directory() {
        let names = [
            "tokenizer.json",
            "tokenizer_config.json",
            "config.json",
            "generation_config.json",
        ];
        let files: Vec<(&str, Vec<u8>)> = names
            .iter()
            .map(|name| (*name, fixture_file(name)))
            .collect();
        let from_archive = Tokenizer::from_archive(&zip_of(&files)).expect("loads");
        let from_dir = fixture();
        let text = "Hello 👋 世界";
        assert_eq!(
            from_archive.encode(text, false).expect("encodes"),
            from_dir.encode(text, false).expect("encodes")
        );
        assert_eq!(from_archive.eos_token_ids(), from_dir.eos_token_ids());
        let messages = [json!({"role": "user", "content": text})];
        let options = ChatTemplateOptions::default();
        assert_eq!(
            from_archive
                .apply_chat_template(&messages, &options)
                .expect("renders"),
            from_dir
                .apply_chat_template(&messages, &options)
                .expect("renders")
        );
    }

    #[test]
    fn archive_files_may_sit_in_a_folder_and_the_shallowest_wins() {
        let tokenizer = Tokenizer::from_archive(&zip_of(&[
            ("model/tokenizer.json", fixture_file("tokenizer.json")),
            (
                "model/old/tokenizer_config.json",
                json_bytes(json!({"chat_template": "OLD"})),
            ),
            (
                "model/tokenizer_config.json",
                json_bytes(json!({"chat_template": "NEW"})),
            ),
        ]))
        .expect("loads");
        assert_eq!(tokenizer.vocab_size(), 4007);
        let prompt = tokenizer
            .apply_chat_template(&[], &ChatTemplateOptions::default())
            .expect("renders");
        assert_eq!(prompt, "NEW");
    }

    #[test]
    fn broken_sources_fail_with_internal_errors() {
        let not_zip = Tokenizer::from_archive(b"not a zip").expect_err("garbage");
        assert_eq!(not_zip.code, ErrorCode::InternalError);
        let no_tokenizer =
            Tokenizer::from_archive(&zip_of(&[("tokenizer_config.json", json_bytes(json!({})))]))
                .expect_err("no tokenizer.json");
        assert!(
            no_tokenizer.message.contains("has no tokenizer.json"),
            "{}",
            no_tokenizer.message
        );
        let bad_json = Tokenizer::from_archive(&zip_of(&[
            ("tokenizer.json", fixture_file("tokenizer.json")),
            ("generation_config.json", b"{ nope".to_vec()),
        ]))
        .expect_err("bad generation_config.json");
        assert!(
            bad_json.message.contains("generation_config.json"),
            "{}",
            bad_json.message
        );
        let missing_dir = Tokenizer::from_model_dir(Path::new("/nonexistent/model"))
            .expect_err("no such directory");
        assert_eq!(missing_dir.code, ErrorCode::InternalError);
    }

    #[test]
    fn eos_ids_fall_back_from_generation_config_to_config_to_eos_token() {
        let all = with_configs(&[
            ("generation_config.json", json!({"eos_token_id": 4000})),
            ("config.json", json!({"eos_token_id": [4001]})),
            ("tokenizer_config.json", json!({"eos_token": "<|im_end|>"})),
        ]);
        assert_eq!(all.eos_token_ids(), [4000]);
        let from_config = with_configs(&[
            ("generation_config.json", json!({"temperature": 0.7})),
            ("config.json", json!({"eos_token_id": [4001, 4002, 4001]})),
        ]);
        assert_eq!(from_config.eos_token_ids(), [4001, 4002]);
        let from_token = with_configs(&[(
            "tokenizer_config.json",
            json!({"eos_token": {"content": "<|im_end|>", "special": true}}),
        )]);
        assert_eq!(from_token.eos_token_ids(), [4002]);
        assert_eq!(with_configs(&[]).eos_token_ids(), [] as [u32; 0]);
    }

    #[test]
    fn special_tokens_may_be_objects_or_come_from_the_special_tokens_map() {
        let tokenizer = with_configs(&[
            (
                "tokenizer_config.json",
                json!({
                    "bos_token": {"content": "<|endoftext|>", "lstrip": false},
                    "eos_token": null,
                    "chat_template": "{{ bos_token }}|{{ eos_token }}|{{ additional_special_tokens is defined }}",
                }),
            ),
            (
                "special_tokens_map.json",
                json!({"eos_token": "<|im_end|>", "additional_special_tokens": ["<|im_start|>", {"content": "<|im_end|>"}]}),
            ),
        ]);
        let rendered = tokenizer
            .apply_chat_template(&[], &ChatTemplateOptions::default())
            .expect("renders");
        // `transformers` 5 gives templates the named tokens only.
        assert_eq!(rendered, "<|endoftext|>|<|im_end|>|False");
    }

    #[test]
    fn chat_template_jinja_replaces_the_config_template() {
        let dir = tempfile::tempdir().expect("temp dir");
        for name in ["tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(fixture_dir().join(name), dir.path().join(name)).expect("copies");
        }
        std::fs::write(
            dir.path().join("chat_template.jinja"),
            "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{{ eos_token }}\n",
        )
        .expect("writes");
        let tokenizer = Tokenizer::from_model_dir(dir.path()).expect("loads");
        let rendered = tokenizer
            .apply_chat_template(
                &[json!({"role": "user", "content": "hi"})],
                &ChatTemplateOptions::default(),
            )
            .expect("renders");
        assert_eq!(rendered, "[user] hi\n<|im_end|>");
    }

    #[test]
    fn list_form_template_in_tokenizer_config_uses_default() {
        let tokenizer = with_configs(&[(
            "tokenizer_config.json",
            json!({"chat_template": [
                {"name": "rag", "template": "RAG"},
                {"name": "default", "template": "{{ messages[0].content | upper }}"},
            ]}),
        )]);
        let rendered = tokenizer
            .apply_chat_template(&[json!({"content": "hi"})], &ChatTemplateOptions::default())
            .expect("renders");
        assert_eq!(rendered, "HI");
    }

    #[test]
    fn a_model_without_a_template_refuses_messages() {
        let err = with_configs(&[])
            .apply_chat_template(
                &[json!({"role": "user", "content": "hi"})],
                &ChatTemplateOptions::default(),
            )
            .expect_err("no template");
        assert_eq!(err.code, ErrorCode::InvalidRequest);
    }

    #[test]
    fn clones_share_one_loaded_tokenizer() {
        let tokenizer = fixture();
        let clone = tokenizer.clone();
        assert!(Arc::ptr_eq(&tokenizer.loaded, &clone.loaded));
    }
}
