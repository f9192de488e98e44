//! `file://` images, confined to directories the operator allow-lists.
//!
//! Reading local files on a client's say-so is arbitrary file disclosure
//! (`file:///etc/shadow`, a model's weights) unless it is confined. The
//! confinement: no allowed directory means no file URLs at all; a path must
//! be under an allowed directory as written (checked before touching the
//! file system, so refusals do not reveal which files exist elsewhere) and
//! again after every symlink and `..` is resolved (so a link inside the
//! directory cannot lead out of it); the final component is opened without
//! following symlinks, and only regular files are read (a FIFO or a device
//! would block or never end).
//!
//! What remains trusted: whoever can rename directories inside an allowed
//! tree between the check and the open could swap one for a symlink. Those
//! directories belong to the operator.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use bytes::Bytes;
use reqwest::Url;

use super::HashedBytes;

/// Why a `file://` image was refused or could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileProblem {
    /// The URL is not a usable local file URL.
    Malformed(String),
    /// The path is not under an allowed directory, or not a regular file.
    Forbidden(String),
    TooLarge {
        len: u64,
    },
    /// The file is missing or unreadable.
    Unreadable(String),
}

/// One allow-listed directory, as configured and fully resolved.
#[derive(Debug, Clone)]
struct AllowedDir {
    configured: PathBuf,
    canonical: PathBuf,
}

/// The directories `file://` URLs may read from.
#[derive(Debug, Clone, Default)]
pub struct FileRoots {
    dirs: Vec<AllowedDir>,
}

impl FileRoots {
    /// Resolves each directory once; a missing directory is a configuration
    /// error, reported with its path.
    pub fn new(dirs: &[PathBuf]) -> Result<Self, (PathBuf, io::Error)> {
        let dirs = dirs
            .iter()
            .map(|dir| {
                let canonical = dir.canonicalize().map_err(|error| (dir.clone(), error))?;
                if !canonical.is_dir() {
                    let error = io::Error::other("not a directory");
                    return Err((dir.clone(), error));
                }
                Ok(AllowedDir {
                    configured: dir.clone(),
                    canonical,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { dirs })
    }

    /// Reads the file a `file://` URL names, within the rules above. Blocks:
    /// run it off the async runtime.
    pub fn read(&self, url: &Url, max_bytes: usize) -> Result<HashedBytes, FileProblem> {
        if self.dirs.is_empty() {
            return Err(FileProblem::Forbidden(
                "file:// URLs are disabled (no allowed file directories are configured)".to_owned(),
            ));
        }
        let path = local_path(url)?;
        let written_inside = self
            .dirs
            .iter()
            .any(|dir| path.starts_with(&dir.configured) || path.starts_with(&dir.canonical));
        if !written_inside {
            return Err(FileProblem::Forbidden(format!(
                "{} is outside the allowed file directories",
                path.display()
            )));
        }
        let resolved = path
            .canonicalize()
            .map_err(|error| unreadable(&path, &error))?;
        if !self
            .dirs
            .iter()
            .any(|dir| resolved.starts_with(&dir.canonical))
        {
            return Err(FileProblem::Forbidden(format!(
                "{} resolves to {}, outside the allowed file directories",
                path.display(),
                resolved.display()
            )));
        }
        read_regular_file(&resolved, max_bytes)
    }
}

/// The absolute local path of a `file://` URL, which may name no host other
/// than `localhost`. The URL parser has already removed `.` and `..`
/// segments; a remaining `..` is refused outright.
fn local_path(url: &Url) -> Result<PathBuf, FileProblem> {
    let path = url.to_file_path().map_err(|()| {
        FileProblem::Malformed(
            "a file URL must be file:///absolute/path, naming no host but localhost".to_owned(),
        )
    })?;
    if path.components().any(|part| part == Component::ParentDir) {
        return Err(FileProblem::Forbidden(format!(
            "{} climbs out with '..'",
            path.display()
        )));
    }
    Ok(path)
}

fn read_regular_file(path: &Path, max_bytes: usize) -> Result<HashedBytes, FileProblem> {
    // O_NOFOLLOW: the last component must not have become a symlink since it
    // was resolved. O_NONBLOCK: opening a FIFO must not wait for a writer.
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|error| unreadable(path, &error))?;
    let metadata = file.metadata().map_err(|error| unreadable(path, &error))?;
    if !metadata.is_file() {
        return Err(FileProblem::Forbidden(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    let max_len = u64::try_from(max_bytes).unwrap_or(u64::MAX);
    if metadata.len() > max_len {
        return Err(FileProblem::TooLarge {
            len: metadata.len(),
        });
    }
    let read = read_capped(file, metadata.len(), max_len).map_err(|problem| match problem {
        ReadCapped::Io(error) => unreadable(path, &error),
        ReadCapped::Grew(len) => FileProblem::TooLarge { len },
    })?;
    if read.bytes.is_empty() {
        return Err(FileProblem::Unreadable(format!(
            "{} is empty",
            path.display()
        )));
    }
    Ok(read)
}

enum ReadCapped {
    Io(io::Error),
    /// The file grew past the cap while being read.
    Grew(u64),
}

fn read_capped(file: File, expected_len: u64, max_len: u64) -> Result<HashedBytes, ReadCapped> {
    let capacity = usize::try_from(expected_len).unwrap_or(0);
    let mut contents = Vec::with_capacity(capacity);
    file.take(max_len.saturating_add(1))
        .read_to_end(&mut contents)
        .map_err(ReadCapped::Io)?;
    let len = u64::try_from(contents.len()).unwrap_or(u64::MAX);
    if len > max_len {
        return Err(ReadCapped::Grew(len));
    }
    let content_hash = *blake3::hash(&contents).as_bytes();
    Ok(HashedBytes {
        bytes: Bytes::from(contents),
        content_hash,
    })
}

fn unreadable(path: &Path, error: &io::Error) -> FileProblem {
    let reason = match error.kind() {
        io::ErrorKind::NotFound => "no such file".to_owned(),
        io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
        _ if error.raw_os_error() == Some(libc::ELOOP) => "is a symlink".to_owned(),
        _ => error.to_string(),
    };
    FileProblem::Unreadable(format!("{}: {reason}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn file_url(path: &Path) -> Url {
        Url::from_file_path(path).expect("absolute test path")
    }

    fn roots(dir: &Path) -> FileRoots {
        FileRoots::new(&[dir.to_path_buf()]).expect("test dir exists")
    }

    #[test]
    fn reads_a_file_inside_the_allowed_dir() {
        let allowed = tempfile::tempdir().expect("tempdir");
        let nested = allowed.path().join("sub");
        std::fs::create_dir(&nested).expect("mkdir");
        let image = nested.join("cat.png");
        std::fs::write(&image, b"cat pixels").expect("write image");

        let read = roots(allowed.path())
            .read(&file_url(&image), 1024)
            .expect("inside the allowed dir");
        assert_eq!(read.bytes.as_ref(), b"cat pixels");
        assert_eq!(read.content_hash, *blake3::hash(b"cat pixels").as_bytes());
    }

    #[test]
    fn refuses_files_outside_and_dot_dot_escapes() {
        let allowed = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        let secret = outside.path().join("secret.png");
        std::fs::write(&secret, b"secret").expect("write secret");
        let roots = roots(allowed.path());

        let escape = format!(
            "file://{}/../{}/secret.png",
            allowed.path().display(),
            outside
                .path()
                .file_name()
                .expect("tempdir has a name")
                .to_string_lossy()
        );
        let escape = Url::parse(&escape).expect("file URL parses");
        for url in [file_url(&secret), escape] {
            match roots.read(&url, 1024) {
                Err(FileProblem::Forbidden(text)) => assert!(text.contains("outside"), "{text}"),
                other => panic!("{url}: {other:?}"),
            }
        }
        // Refused without looking: a missing file outside is just as forbidden.
        let missing = outside.path().join("nothing-here.png");
        assert!(matches!(
            roots.read(&file_url(&missing), 1024),
            Err(FileProblem::Forbidden(_))
        ));
    }

    #[test]
    fn refuses_a_symlink_leading_out() {
        let allowed = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        let secret = outside.path().join("secret.png");
        std::fs::write(&secret, b"secret").expect("write secret");
        let link = allowed.path().join("innocent.png");
        symlink(&secret, &link).expect("symlink");
        let dir_link = allowed.path().join("dir");
        symlink(outside.path(), &dir_link).expect("symlink");

        let roots = roots(allowed.path());
        for url in [file_url(&link), file_url(&dir_link.join("secret.png"))] {
            match roots.read(&url, 1024) {
                Err(FileProblem::Forbidden(text)) => {
                    assert!(text.contains("resolves to"), "{text}")
                }
                other => panic!("{url}: {other:?}"),
            }
        }
    }

    #[test]
    fn follows_a_symlink_that_stays_inside() {
        let allowed = tempfile::tempdir().expect("tempdir");
        let image = allowed.path().join("real.png");
        std::fs::write(&image, b"real").expect("write image");
        let link = allowed.path().join("alias.png");
        symlink(&image, &link).expect("symlink");
        let read = roots(allowed.path())
            .read(&file_url(&link), 1024)
            .expect("the link stays inside");
        assert_eq!(read.bytes.as_ref(), b"real");
    }

    #[test]
    fn refuses_when_no_dir_is_configured() {
        let dir = tempfile::tempdir().expect("tempdir");
        let image = dir.path().join("a.png");
        std::fs::write(&image, b"a").expect("write image");
        match FileRoots::default().read(&file_url(&image), 1024) {
            Err(FileProblem::Forbidden(text)) => assert!(text.contains("disabled"), "{text}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn missing_oversized_and_special_files() {
        let allowed = tempfile::tempdir().expect("tempdir");
        let roots = roots(allowed.path());

        let missing = allowed.path().join("missing.png");
        match roots.read(&file_url(&missing), 1024) {
            Err(FileProblem::Unreadable(text)) => assert!(text.contains("no such file"), "{text}"),
            other => panic!("{other:?}"),
        }

        let big = allowed.path().join("big.png");
        std::fs::write(&big, vec![7u8; 2048]).expect("write big");
        assert_eq!(
            roots.read(&file_url(&big), 2047),
            Err(FileProblem::TooLarge { len: 2048 })
        );
        assert_eq!(
            roots
                .read(&file_url(&big), 2048)
                .expect("at the cap")
                .bytes
                .len(),
            2048
        );

        let empty = allowed.path().join("empty.png");
        std::fs::write(&empty, b"").expect("write empty");
        assert!(matches!(
            roots.read(&file_url(&empty), 1024),
            Err(FileProblem::Unreadable(text)) if text.ends_with("empty.png is empty")
        ));

        let sub = allowed.path().join("sub");
        std::fs::create_dir(&sub).expect("mkdir");
        assert!(matches!(
            roots.read(&file_url(&sub), 1024),
            Err(FileProblem::Forbidden(text)) if text.contains("not a regular file")
        ));
    }

    #[test]
    fn refuses_file_urls_with_a_host() {
        let allowed = tempfile::tempdir().expect("tempdir");
        let url = Url::parse("file://fileserver/share/a.png").expect("parses");
        assert!(matches!(
            roots(allowed.path()).read(&url, 1024),
            Err(FileProblem::Malformed(_))
        ));
    }

    #[test]
    fn a_missing_allowed_dir_is_a_configuration_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("nope");
        let (path, _) = FileRoots::new(std::slice::from_ref(&missing)).expect_err("missing dir");
        assert_eq!(path, missing);
    }
}
