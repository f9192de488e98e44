//! Where a tokenizer's files come from: a model directory on disk, or the zip
//! archive a worker's `GetTokenizer` RPC returns.
//!
//! Both sources hold the same Hugging Face files, so they are read into one
//! [`ModelFiles`] and everything after that (special tokens, EOS ids, the
//! chat template) is decided in one place, whatever the source. Archives are
//! read in memory: nothing is unpacked to disk.
//!
//! Both sources may come from a worker (an archive, or a directory path it
//! advertises), so reading is bounded: the files together may hold at most
//! [`MAX_TOKENIZER_FILES_BYTES`] (counted as read, not as declared), an
//! archive at most [`MAX_ARCHIVE_ENTRIES`] entries, and only regular files
//! are read. A directory's files are checked with `lstat` and opened
//! `O_NONBLOCK`, then checked again on the open descriptor, so a FIFO
//! (which would block the reading thread forever) or a device (which never
//! ends) is refused, never read. A directory a worker advertises is read
//! without following symlinks ([`Links::Refuse`]): a link could lead
//! anywhere on the gateway's machine. The operator's own directory
//! ([`Links::Follow`]) may be a Hugging Face cache snapshot, whose files are
//! links into its blob store.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::{Cursor, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
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
/// Vision preprocessing: read with the tokenizer's files, so a model whose
/// tokenizer comes from its workers (their directory or archive) takes its
/// image settings from there too.
const PREPROCESSOR_CONFIG: &str = "preprocessor_config.json";

/// Every file the loader looks for.
const WANTED_FILES: [&str; 7] = [
    TOKENIZER_JSON,
    TOKENIZER_CONFIG,
    SPECIAL_TOKENS_MAP,
    GENERATION_CONFIG,
    MODEL_CONFIG,
    CHAT_TEMPLATE_JINJA,
    PREPROCESSOR_CONFIG,
];

/// The most bytes the wanted files may hold together, from a directory or
/// unpacked from an archive. Real `tokenizer.json` files stay well under
/// 50 MiB and the other files are small; the cap stops a corrupt or hostile
/// source from inflating into gigabytes.
pub(super) const MAX_TOKENIZER_FILES_BYTES: u64 = 256 * 1024 * 1024;

/// The most entries an archive may list. A tokenizer archive holds a
/// handful of files; every listed entry costs the zip reader memory before
/// any is read.
pub(super) const MAX_ARCHIVE_ENTRIES: usize = 4096;

/// Whether a model directory's files may be symlinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Links {
    /// The operator's directory (`--model-path`, `--tokenizer-path`): links
    /// are followed (a Hugging Face cache snapshot is made of them), to
    /// regular files only.
    Follow,
    /// A directory a worker advertises: a link is refused.
    Refuse,
}

/// The files a tokenizer is built from. Only `tokenizer.json` is required.
#[derive(Debug)]
pub(super) struct ModelFiles {
    pub tokenizer_json: Vec<u8>,
    pub tokenizer_config: Option<Value>,
    pub special_tokens_map: Option<Value>,
    pub generation_config: Option<Value>,
    pub model_config: Option<Value>,
    pub chat_template_jinja: Option<String>,
    /// `preprocessor_config.json`, as text (the data plane parses it).
    pub preprocessor_config: Option<String>,
}

impl ModelFiles {
    pub(super) fn from_dir(dir: &Path, links: Links) -> Result<Self> {
        Self::from_dir_within(dir, links, MAX_TOKENIZER_FILES_BYTES)
    }

    fn from_dir_within(dir: &Path, links: Links, limit: u64) -> Result<Self> {
        let origin = format!("model directory {}", dir.display());
        let mut budget = Budget::new(&origin, limit);
        Self::collect(&origin, |name| {
            read_regular_file(&dir.join(name), links, &mut budget)
        })
    }

    /// Reads the archive in memory. Files may sit at the root or in a
    /// folder; when a name appears more than once the shallowest copy wins.
    pub(super) fn from_archive(archive_bytes: &[u8]) -> Result<Self> {
        Self::from_archive_within(archive_bytes, MAX_TOKENIZER_FILES_BYTES)
    }

    fn from_archive_within(archive_bytes: &[u8], limit: u64) -> Result<Self> {
        let origin = "tokenizer archive";
        let mut archive = ZipArchive::new(Cursor::new(archive_bytes))
            .map_err(|err| Error::internal(format!("{origin} is not a readable zip: {err}")))?;
        if archive.len() > MAX_ARCHIVE_ENTRIES {
            return Err(Error::internal(format!(
                "{origin} lists {} entries; at most {MAX_ARCHIVE_ENTRIES} are accepted",
                archive.len()
            )));
        }
        let entries = locate_wanted_entries(&mut archive)?;
        let mut budget = Budget::new(origin, limit);
        Self::collect(origin, |name| match entries.get(name) {
            Some(&index) => read_archive_entry(&mut archive, index, &mut budget).map(Some),
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
        let mut text = |name: &str| -> Result<Option<String>> {
            read(name)?
                .map(|bytes| {
                    String::from_utf8(bytes)
                        .map_err(|_| Error::internal(format!("{name} in {origin} is not UTF-8")))
                })
                .transpose()
        };
        let chat_template_jinja = text(CHAT_TEMPLATE_JINJA)?;
        let preprocessor_config = text(PREPROCESSOR_CONFIG)?;
        Ok(Self {
            tokenizer_json,
            tokenizer_config: read_json(origin, TOKENIZER_CONFIG, &mut read)?,
            special_tokens_map: read_json(origin, SPECIAL_TOKENS_MAP, &mut read)?,
            generation_config: read_json(origin, GENERATION_CONFIG, &mut read)?,
            model_config: read_json(origin, MODEL_CONFIG, &mut read)?,
            chat_template_jinja,
            preprocessor_config,
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

/// What is left of the byte budget ([`MAX_TOKENIZER_FILES_BYTES`]) while
/// one source's files are read.
struct Budget<'a> {
    origin: &'a str,
    limit: u64,
    left: u64,
}

impl<'a> Budget<'a> {
    fn new(origin: &'a str, limit: u64) -> Self {
        Self {
            origin,
            limit,
            left: limit,
        }
    }

    fn exceeded(&self, name: &str) -> Error {
        Error::internal(format!(
            "the files of the {} pass {} bytes together (at {name})",
            self.origin, self.limit
        ))
    }

    /// Reads all of `source` within what is left (trusting the bytes read,
    /// not any declared size), and charges it.
    fn read(&mut self, name: &str, source: impl Read) -> Result<Vec<u8>> {
        let mut bytes = Vec::new();
        source
            .take(self.left.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|err| {
                Error::internal(format!(
                    "cannot read {name} from the {}: {err}",
                    self.origin
                ))
            })?;
        let read = bytes.len() as u64;
        if read > self.left {
            return Err(self.exceeded(name));
        }
        self.left -= read;
        Ok(bytes)
    }
}

/// Reads `path` if it is a regular file (`None` if it does not exist),
/// within `budget`. Never blocks on a FIFO and never reads a device.
fn read_regular_file(
    path: &Path,
    links: Links,
    budget: &mut Budget<'_>,
) -> Result<Option<Vec<u8>>> {
    let refuse = |why: String| Error::internal(format!("cannot read {}: {why}", path.display()));
    // The type as named, before anything is opened.
    let named = match links {
        Links::Follow => std::fs::metadata(path),
        Links::Refuse => std::fs::symlink_metadata(path),
    };
    let named = match named {
        Ok(metadata) => metadata,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(refuse(err.to_string())),
    };
    if !named.file_type().is_file() {
        return Err(refuse(describe(named.file_type())));
    }
    // Swapped since the check? The open neither follows a link (when
    // refused) nor waits for a FIFO's writer, and the descriptor is checked
    // again.
    let mut flags = libc::O_NONBLOCK | libc::O_NOCTTY;
    if links == Links::Refuse {
        flags |= libc::O_NOFOLLOW;
    }
    let file: File = OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|err| match err.raw_os_error() {
            Some(libc::ELOOP) => refuse("is a symlink".to_owned()),
            _ => refuse(err.to_string()),
        })?;
    let opened = file.metadata().map_err(|err| refuse(err.to_string()))?;
    if !opened.file_type().is_file() {
        return Err(refuse(describe(opened.file_type())));
    }
    let name = path
        .file_name()
        .map_or_else(String::new, |name| name.to_string_lossy().into_owned());
    if opened.len() > budget.left {
        return Err(budget.exceeded(&name));
    }
    budget.read(&name, file).map(Some)
}

/// What a file that is not a regular file is, for an error message.
fn describe(file_type: std::fs::FileType) -> String {
    let kind = if file_type.is_symlink() {
        "a symlink"
    } else if file_type.is_dir() {
        "a directory"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_char_device() || file_type.is_block_device() {
        "a device"
    } else if file_type.is_socket() {
        "a socket"
    } else {
        "a special file"
    };
    format!("is {kind}, not a regular file")
}

/// The Unix file type bits of an archive entry's mode.
const S_IFMT: u32 = 0o170_000;
const S_IFREG: u32 = 0o100_000;
const S_IFDIR: u32 = 0o040_000;
const S_IFLNK: u32 = 0o120_000;

/// Maps each wanted file name to the index of its shallowest archive entry.
/// Entries whose paths escape the archive root, and directories, are
/// ignored; a wanted name that is a symlink or special file refuses the
/// archive.
fn locate_wanted_entries(
    archive: &mut ZipArchive<Cursor<&[u8]>>,
) -> Result<HashMap<&'static str, usize>> {
    let mut chosen: HashMap<&'static str, (usize, usize)> = HashMap::new();
    for index in 0..archive.len() {
        let entry = archive
            .by_index(index)
            .map_err(|err| Error::internal(format!("tokenizer archive entry {index}: {err}")))?;
        if entry.is_dir() {
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
        // No mode (an archive from a non-Unix tool) means a plain file.
        match entry.unix_mode().map_or(S_IFREG, |mode| mode & S_IFMT) {
            S_IFREG | 0 => {}
            S_IFDIR => continue,
            kind => {
                let what = if kind == S_IFLNK {
                    "a symlink"
                } else {
                    "a special file"
                };
                return Err(Error::internal(format!(
                    "{file_name} in the tokenizer archive is {what}, not a regular file"
                )));
            }
        }
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

fn read_archive_entry(
    archive: &mut ZipArchive<Cursor<&[u8]>>,
    index: usize,
    budget: &mut Budget<'_>,
) -> Result<Vec<u8>> {
    let entry = archive
        .by_index(index)
        .map_err(|err| Error::internal(format!("tokenizer archive entry {index}: {err}")))?;
    let name = entry
        .name()
        .map(|name| name.into_owned())
        .unwrap_or_default();
    if entry.size() > budget.left {
        return Err(budget.exceeded(&name));
    }
    // Trust the decompressed byte count, not the header's claim.
    budget.read(&name, entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::symlink;
    use std::time::Duration;

    fn fixture(name: &str) -> Vec<u8> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/model");
        std::fs::read(dir.join(name)).expect("fixture file")
    }

    /// A directory holding the fixture's tokenizer.json under `name`
    /// (`tokenizer.json` unless a test puts something else there).
    fn model_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join(TOKENIZER_JSON), fixture(TOKENIZER_JSON)).expect("write");
        dir
    }

    fn mkfifo(path: &Path) {
        nix::unistd::mkfifo(
            path,
            nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
        )
        .unwrap_or_else(|err| panic!("mkfifo {}: {err}", path.display()));
    }

    /// Runs `read` on a thread and fails the test if it blocks.
    fn unblocked<T: Send + 'static>(read: impl FnOnce() -> T + Send + 'static) -> T {
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = sender.send(read());
        });
        receiver
            .recv_timeout(Duration::from_secs(10))
            .expect("the read returned instead of blocking")
    }

    #[test]
    fn a_fifo_in_the_directory_is_refused_without_blocking() {
        let dir = tempfile::tempdir().expect("temp dir");
        mkfifo(&dir.path().join(TOKENIZER_JSON));
        for links in [Links::Refuse, Links::Follow] {
            let path = dir.path().to_owned();
            let err = unblocked(move || ModelFiles::from_dir(&path, links)).expect_err("a FIFO");
            assert!(err.message.contains("a FIFO, not a regular file"), "{err}");
        }
        // Also where an optional file would be: a config, not only tokenizer.json.
        let dir = model_dir();
        mkfifo(&dir.path().join(GENERATION_CONFIG));
        let path = dir.path().to_owned();
        let err = unblocked(move || ModelFiles::from_dir(&path, Links::Refuse)).expect_err("FIFO");
        assert!(err.message.contains(GENERATION_CONFIG), "{err}");
    }

    #[test]
    fn a_symlink_out_of_a_worker_directory_is_refused() {
        let outside = tempfile::tempdir().expect("temp dir");
        std::fs::write(outside.path().join("secret.json"), fixture(TOKENIZER_JSON)).expect("w");
        let dir = tempfile::tempdir().expect("temp dir");
        symlink(
            outside.path().join("secret.json"),
            dir.path().join(TOKENIZER_JSON),
        )
        .expect("ln");
        let err = ModelFiles::from_dir(dir.path(), Links::Refuse).expect_err("a link");
        assert!(err.message.contains("a symlink"), "{err}");
        // The operator's own directory may be a cache of links.
        ModelFiles::from_dir(dir.path(), Links::Follow).expect("followed to a regular file");
    }

    #[test]
    fn a_link_to_a_device_is_never_read() {
        let dir = tempfile::tempdir().expect("temp dir");
        symlink("/dev/zero", dir.path().join(TOKENIZER_JSON)).expect("ln");
        let path = dir.path().to_owned();
        let err = unblocked(move || ModelFiles::from_dir(&path, Links::Follow)).expect_err("dev");
        assert!(
            err.message.contains("a device, not a regular file"),
            "{err}"
        );
        let err = ModelFiles::from_dir(dir.path(), Links::Refuse).expect_err("a link");
        assert!(err.message.contains("a symlink"), "{err}");
    }

    #[test]
    fn a_directory_in_place_of_a_file_is_refused() {
        let dir = model_dir();
        std::fs::create_dir(dir.path().join(MODEL_CONFIG)).expect("mkdir");
        let err = ModelFiles::from_dir(dir.path(), Links::Refuse).expect_err("a directory");
        assert!(
            err.message.contains("a directory, not a regular file"),
            "{err}"
        );
    }

    #[test]
    fn regular_files_load_and_missing_optional_ones_are_none() {
        let dir = model_dir();
        let files = ModelFiles::from_dir(dir.path(), Links::Refuse).expect("loads");
        assert_eq!(files.tokenizer_json, fixture(TOKENIZER_JSON));
        assert!(files.model_config.is_none());
    }

    /// `{}` padded with spaces to 4 KiB: valid JSON of a known size.
    fn padded_config() -> Vec<u8> {
        let mut config = b"{}".to_vec();
        config.resize(4096, b' ');
        config
    }

    #[test]
    fn the_files_share_one_byte_budget() {
        let dir = model_dir();
        std::fs::write(dir.path().join(MODEL_CONFIG), padded_config()).expect("write");
        let tokenizer = fixture(TOKENIZER_JSON).len() as u64;
        let err = ModelFiles::from_dir_within(dir.path(), Links::Refuse, tokenizer + 100)
            .expect_err("over budget");
        assert!(err.message.contains("bytes together"), "{err}");
        assert!(err.message.contains(MODEL_CONFIG), "{err}");
        ModelFiles::from_dir_within(dir.path(), Links::Refuse, tokenizer - 1)
            .expect_err("tokenizer.json alone is over");

        let archive = zip(&[
            (TOKENIZER_JSON, fixture(TOKENIZER_JSON)),
            (MODEL_CONFIG, padded_config()),
        ]);
        let err = ModelFiles::from_archive_within(&archive, tokenizer + 100).expect_err("over");
        assert!(err.message.contains("bytes together"), "{err}");
        ModelFiles::from_archive_within(&archive, tokenizer + 4096).expect("exactly fits");
    }

    fn zip(files: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let mut archive = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        for (name, contents) in files {
            archive.start_file(*name, options).expect("entry");
            archive.write_all(contents).expect("written");
        }
        archive.finish().expect("finishes").into_inner()
    }

    #[test]
    fn an_archive_with_too_many_entries_is_refused() {
        let mut archive = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        for index in 0..=MAX_ARCHIVE_ENTRIES {
            archive
                .start_file(format!("junk/{index}"), options)
                .expect("entry");
        }
        let bytes = archive.finish().expect("finishes").into_inner();
        let err = ModelFiles::from_archive(&bytes).expect_err("too many entries");
        assert!(err.message.contains("entries"), "{err}");
    }

    #[test]
    fn a_symlink_entry_in_an_archive_is_refused() {
        let mut archive = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default();
        archive
            .add_symlink(TOKENIZER_JSON, "/etc/passwd", options)
            .expect("a link entry");
        let bytes = archive.finish().expect("finishes").into_inner();
        let err = ModelFiles::from_archive(&bytes).expect_err("a link");
        assert!(
            err.message.contains("is a symlink, not a regular file"),
            "{err}"
        );
    }

    #[test]
    fn an_inflating_entry_is_refused_past_the_budget() {
        // 1 MiB of zeros deflates to about a kilobyte.
        let archive = zip(&[(TOKENIZER_JSON, vec![0; 1 << 20])]);
        assert!(archive.len() < 16 * 1024, "{}", archive.len());
        let err = ModelFiles::from_archive_within(&archive, 64 * 1024).expect_err("inflates");
        assert!(err.message.contains("bytes together"), "{err}");
    }

    #[test]
    fn reading_stops_at_the_budget_whatever_a_source_claims() {
        // An endless source (a header that lies, a file that grows) is read
        // one byte past what is left, never more.
        let mut budget = Budget::new("test source", 1000);
        let err = budget
            .read("endless", std::io::repeat(7))
            .expect_err("endless");
        assert!(err.message.contains("1000 bytes together"), "{err}");

        let mut budget = Budget::new("test source", 1000);
        assert_eq!(budget.read("a", &[1u8; 600][..]).expect("fits").len(), 600);
        assert_eq!(budget.read("b", &[1u8; 400][..]).expect("fits").len(), 400);
        budget.read("c", &[1u8][..]).expect_err("nothing left");
    }
}
