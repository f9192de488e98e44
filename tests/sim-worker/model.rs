//! The model directory a sim worker serves: its tokenizer and the facts a real
//! worker reports about its model (vocabulary, special ids, context length,
//! vision support), read from the same Hugging Face files a real one reads.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokenizers::Tokenizer;

/// Files a worker ships to a gateway that asks for its tokenizer.
const TOKENIZER_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "config.json",
    "generation_config.json",
    "preprocessor_config.json",
    "chat_template.jinja",
];

/// What a sim worker knows about the model it pretends to run.
#[derive(Debug)]
pub struct ModelFacts {
    pub model_path: PathBuf,
    pub served_model_name: String,
    pub tokenizer: Tokenizer,
    /// The gateway's own tokenizer over the same files, for decoding
    /// prompts: its byte table decodes the text `tokenizer` would, several
    /// times faster, so a script matched against long (tool) prompts does
    /// not make the worker the slowest process of a benchmark. `None` when
    /// it does not load; `tokenizer` decodes then.
    prompt_decoder: Option<smg::tokenizer::Tokenizer>,
    pub model_type: String,
    pub architectures: Vec<String>,
    pub vocab_size: u32,
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: u32,
    pub pad_token_id: u32,
    pub max_context_length: u32,
    pub supports_vision: bool,
    pub hidden_size: u32,
    /// A zip of the tokenizer files and the hex sha256 of that zip.
    pub tokenizer_zip: (Vec<u8>, String),
}

impl ModelFacts {
    pub fn load(model_path: &Path, served_model_name: Option<String>) -> Result<Self> {
        let model_path = model_path
            .canonicalize()
            .with_context(|| format!("model path {} does not exist", model_path.display()))?;
        let tokenizer_file = model_path.join("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&tokenizer_file)
            .map_err(|err| anyhow::anyhow!("cannot load {}: {err}", tokenizer_file.display()))?;
        let config = read_json(&model_path.join("config.json"))?;
        let generation = read_json(&model_path.join("generation_config.json")).ok();

        let id = |value: Option<&Value>| value.and_then(Value::as_u64).map(|v| v as u32);
        let ids = |value: Option<&Value>| -> Vec<u32> {
            match value {
                Some(Value::Array(items)) => items.iter().filter_map(|v| id(Some(v))).collect(),
                other => id(other).into_iter().collect(),
            }
        };
        let mut eos_token_ids = ids(generation.as_ref().and_then(|g| g.get("eos_token_id")));
        if eos_token_ids.is_empty() {
            eos_token_ids = ids(config.get("eos_token_id"));
        }
        if eos_token_ids.is_empty() {
            bail!("{} names no eos_token_id", model_path.display());
        }
        let vocab_size =
            id(config.get("vocab_size")).unwrap_or_else(|| tokenizer.get_vocab_size(true) as u32);
        let served_model_name = served_model_name.unwrap_or_else(|| {
            model_path
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
                .unwrap_or_else(|| "model".to_owned())
        });
        let tokenizer_zip = zip_tokenizer_files(&model_path)?;
        Ok(Self {
            served_model_name,
            model_type: config
                .get("model_type")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_owned(),
            architectures: config
                .get("architectures")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
            vocab_size,
            bos_token_id: id(config.get("bos_token_id")).unwrap_or(eos_token_ids[0]),
            pad_token_id: id(config.get("pad_token_id")).unwrap_or(eos_token_ids[0]),
            eos_token_ids,
            max_context_length: id(config.get("max_position_embeddings")).unwrap_or(32768),
            supports_vision: config.get("vision_config").is_some(),
            hidden_size: id(config.get("hidden_size")).unwrap_or(64),
            tokenizer,
            prompt_decoder: smg::tokenizer::Tokenizer::from_model_dir(&model_path).ok(),
            tokenizer_zip,
            model_path,
        })
    }

    /// The text of prompt `ids` with special tokens kept, as the model's
    /// Hugging Face tokenizer decodes it.
    pub fn decode_prompt(&self, ids: &[u32]) -> Option<String> {
        match &self.prompt_decoder {
            Some(decoder) => decoder.decode(ids, false).ok(),
            None => self.tokenizer.decode(ids, false).ok(),
        }
    }

    /// Token ids of `text`, without special tokens.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self
            .tokenizer
            .encode(text, false)
            .map_err(|err| anyhow::anyhow!("cannot tokenize {text:?}: {err}"))?
            .get_ids()
            .to_vec())
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

fn zip_tokenizer_files(model_path: &Path) -> Result<(Vec<u8>, String)> {
    let mut archive = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    for name in TOKENIZER_FILES {
        let path = model_path.join(name);
        if !path.is_file() {
            continue;
        }
        let bytes =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        archive.start_file(*name, options)?;
        archive.write_all(&bytes)?;
    }
    let bytes = archive.finish()?.into_inner();
    let sha = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok((bytes, sha))
}
