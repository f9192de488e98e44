//! Where a tokenizer's files come from: a model directory on disk, or the zip
//! archive a worker's `GetTokenizer` RPC returns.
//!
//! Both sources hold the same Hugging Face files, so they are read into one
//! [`ModelFiles`] and everything after that (special tokens, EOS ids, the
//! chat template) is decided in one place, whatever the source. Archives are
//! read in memory: nothing is unpacked to disk.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::{Cursor, Read};
use std::path::Path;

use serde_json::Value;
use zip::ZipArchive;

use crate::error::{Error, Result};

const TOKENIZER_JSON: &str = "tokenizer.json";
const TOKENIZER_CONFIG: &str = "tokenizer_config.json";
const SPECIAL_TOKENS_MAP: &str = "special_tokens_map.json";
const GENERATION_CONFIG: &str = "generation_config.json";
const MODEL_CONFIG: &str = "config.json";
const CHAT_TEMPLATE_JINJA: &str = "chat_template.jinja";

/// Every file the loader looks for.
const WANTED_FILES: [&str; 6] = [
    TOKENIZER_JSON,
    TOKENIZER_CONFIG,
    SPECIAL_TOKENS_MAP,
    GENERATION_CONFIG,
    MODEL_CONFIG,
    CHAT_TEMPLATE_JINJA,
];

/// The largest file accepted from an archive. Real `tokenizer.json` files
/// stay well under 50 MiB; the cap stops a corrupt or hostile archive from
/// inflating into gigabytes.
const MAX_ARCHIVE_FILE_BYTES: u64 = 256 * 1024 * 1024;

/// The files a tokenizer is built from. Only `tokenizer.json` is required.
#[derive(Debug)]
pub(super) struct ModelFiles {
    pub tokenizer_json: Vec<u8>,
    pub tokenizer_config: Option<Value>,
    pub special_tokens_map: Option<Value>,
    pub generation_config: Option<Value>,
    pub model_config: Option<Value>,
    pub chat_template_jinja: Option<String>,
}

impl ModelFiles {
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let origin = format!("model directory {}", dir.display());
        Self::collect(&origin, |name| {
            let path = dir.join(name);
            match std::fs::read(&path) {
                Ok(bytes) => Ok(Some(bytes)),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(err) => Err(Error::internal(format!(
                    "cannot read {}: {err}",
                    path.display()
                ))),
            }
        })
    }

    /// Reads the archive in memory. Files may sit at the root or in a
    /// folder; when a name appears more than once the shallowest copy wins.
    pub fn from_archive(archive_bytes: &[u8]) -> Result<Self> {
        let origin = "tokenizer archive";
        let mut archive = ZipArchive::new(Cursor::new(archive_bytes))
            .map_err(|err| Error::internal(format!("{origin} is not a readable zip: {err}")))?;
        let entries = locate_wanted_entries(&mut archive)?;
        Self::collect(origin, |name| match entries.get(name) {
            Some(&index) => read_archive_entry(&mut archive, index).map(Some),
            None => Ok(None),
        })
    }

    /// Reads each wanted file through `read` (which answers `None` for a
    /// missing file) and parses the JSON ones.
    fn collect(
        origin: &str,
        mut read: impl FnMut(&str) -> Result<Option<Vec<u8>>>,
    ) -> Result<Self> {
        let tokenizer_json = read(TOKENIZER_JSON)?
            .ok_or_else(|| Error::internal(format!("{origin} has no {TOKENIZER_JSON}")))?;
        let chat_template_jinja = read(CHAT_TEMPLATE_JINJA)?
            .map(|bytes| {
                String::from_utf8(bytes).map_err(|_| {
                    Error::internal(format!("{CHAT_TEMPLATE_JINJA} in {origin} is not UTF-8"))
                })
            })
            .transpose()?;
        Ok(Self {
            tokenizer_json,
            tokenizer_config: read_json(origin, TOKENIZER_CONFIG, &mut read)?,
            special_tokens_map: read_json(origin, SPECIAL_TOKENS_MAP, &mut read)?,
            generation_config: read_json(origin, GENERATION_CONFIG, &mut read)?,
            model_config: read_json(origin, MODEL_CONFIG, &mut read)?,
            chat_template_jinja,
        })
    }
}

fn read_json(
    origin: &str,
    name: &str,
    read: &mut impl FnMut(&str) -> Result<Option<Vec<u8>>>,
) -> Result<Option<Value>> {
    let Some(bytes) = read(name)? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|err| Error::internal(format!("{name} in {origin} is not valid JSON: {err}")))
}

/// Maps each wanted file name to the index of its shallowest archive entry.
/// Entries whose paths escape the archive root are ignored.
fn locate_wanted_entries(
    archive: &mut ZipArchive<Cursor<&[u8]>>,
) -> Result<HashMap<&'static str, usize>> {
    let mut chosen: HashMap<&'static str, (usize, usize)> = HashMap::new();
    for index in 0..archive.len() {
        let entry = archive
            .by_index(index)
            .map_err(|err| Error::internal(format!("tokenizer archive entry {index}: {err}")))?;
        if !entry.is_file() {
            continue;
        }
        let Some(path) = entry.enclosed_name() else {
            continue;
        };
        let Some(file_name) = path.file_name().and_then(OsStr::to_str) else {
            continue;
        };
        let Some(wanted) = WANTED_FILES.iter().find(|wanted| **wanted == file_name) else {
            continue;
        };
        let depth = path.components().count();
        let shallower = chosen
            .get(wanted)
            .is_none_or(|&(_, chosen_depth)| depth < chosen_depth);
        if shallower {
            chosen.insert(wanted, (index, depth));
        }
    }
    Ok(chosen
        .into_iter()
        .map(|(name, (index, _))| (name, index))
        .collect())
}

fn read_archive_entry(archive: &mut ZipArchive<Cursor<&[u8]>>, index: usize) -> Result<Vec<u8>> {
    let entry = archive
        .by_index(index)
        .map_err(|err| Error::internal(format!("tokenizer archive entry {index}: {err}")))?;
    let name = entry
        .name()
        .map(|name| name.into_owned())
        .unwrap_or_default();
    let too_large = || {
        Error::internal(format!(
            "{name} in the tokenizer archive exceeds {MAX_ARCHIVE_FILE_BYTES} bytes"
        ))
    };
    if entry.size() > MAX_ARCHIVE_FILE_BYTES {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    // Trust the decompressed byte count, not the header's claim.
    entry
        .take(MAX_ARCHIVE_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|err| {
            Error::internal(format!(
                "cannot unpack {name} from the tokenizer archive: {err}"
            ))
        })?;
    if bytes.len() as u64 > MAX_ARCHIVE_FILE_BYTES {
        return Err(too_large());
    }
    Ok(bytes)
}
