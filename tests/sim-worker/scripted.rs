//! `--script FILE`: canned completions, so a test can make the simulated
//! model "say" a tool call or a think block and watch the gateway's parsers
//! handle it end to end, through real processes and real token ids.
//!
//! The file holds JSON lines `{"when": "<text>", "text": "<completion>"}`.
//! A request whose prompt, decoded with the model's tokenizer (special tokens
//! kept, so `<|im_start|>user` can be matched), contains `when` gets `text`
//! as its completion: the first matching line wins; an empty `when` matches
//! every prompt. A prompt no line matches gets the usual digest-and-filler
//! output. The text is encoded with the same tokenizer, so a family marker
//! such as `<tool_call>` is the one token the real model would emit, and is
//! streamed a few tokens per event (see [`TOKENS_PER_EVENT`]), then ends with
//! EOS like a natural stop.
//!
//! A file that cannot be read, a line that is not such an object (unknown
//! fields included, to catch a misspelt key), or a file with no lines stops
//! the worker at start-up: a test must never pass on the fallback output
//! because its script was silently ignored.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use crate::model::ModelFacts;

/// How many tokens each streamed event of a scripted completion carries, in
/// turn: one at a time and in small groups, as engines with a stream interval
/// or speculative decoding send them, so parsers see both.
pub const TOKENS_PER_EVENT: &[usize] = &[1, 2, 3];

/// One line of the file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    when: String,
    text: String,
}

#[derive(Debug)]
struct Entry {
    when: String,
    tokens: Arc<[u32]>,
}

/// The parsed script, its texts already encoded.
#[derive(Debug)]
pub struct CompletionScript {
    entries: Vec<Entry>,
}

impl CompletionScript {
    /// Reads and encodes `path`; the error names the file and the line.
    pub fn load(path: &Path, model: &ModelFacts) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--script {}: cannot read it", path.display()))?;
        let mut entries = Vec::new();
        for (index, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let number = index + 1;
            // serde would also read a struct from an array (`["a", "b"]`).
            if !line.trim_start().starts_with('{') {
                bail!(
                    "--script {} line {number}: not a {{\"when\": …, \"text\": …}} object",
                    path.display()
                );
            }
            let Line { when, text } = serde_json::from_str(line).map_err(|err| {
                // serde_json counts lines within this one line: give the
                // file's line and the column alone.
                let position = format!(" at line {} column {}", err.line(), err.column());
                let reason = err.to_string();
                anyhow::anyhow!(
                    "--script {} line {number} column {}: not a {{\"when\": …, \"text\": …}} \
                     object: {}",
                    path.display(),
                    err.column(),
                    reason.strip_suffix(&position).unwrap_or(&reason)
                )
            })?;
            let tokens = model.encode(&text).with_context(|| {
                format!(
                    "--script {} line {number}: cannot encode the text",
                    path.display()
                )
            })?;
            entries.push(Entry {
                when,
                tokens: tokens.into(),
            });
        }
        if entries.is_empty() {
            bail!("--script {}: no lines", path.display());
        }
        Ok(Self { entries })
    }

    /// The tokens of the first line whose `when` the prompt contains.
    pub fn completion_for(&self, prompt: &str) -> Option<Arc<[u32]>> {
        self.entries
            .iter()
            .find(|entry| prompt.contains(&entry.when))
            .map(|entry| Arc::clone(&entry.tokens))
    }
}
