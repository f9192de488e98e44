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
//! This module decides *whether* a path may be read ([`FileRoots::resolve`]);
//! the read itself (open without following the last component, regular files
//! only, the byte cap, hashing) is per-byte work and runs on the data plane
//! (`smg_dataplane::runtime::DataPlane::read_file`, through io_uring).
//!
//! Refusals quote the path as the client wrote it (bounded, see
//! `crate::error::excerpt`) and nothing else: not where a symlink leads, not
//! the canonical path, not the allowed directories, not the OS's error text.
//! Those would tell a client about files it may not read; they go to the log.
//!
//! What remains trusted: whoever can rename directories inside an allowed
//! tree between the check and the open could swap one for a symlink. Those
//! directories belong to the operator.

use std::io;
use std::path::{Component, Path, PathBuf};

use reqwest::Url;

use crate::error::excerpt;

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

    /// The fully resolved path a `file://` URL may be read from, within the
    /// rules above. Touches the file system (resolving links): run it off
    /// the async runtime.
    pub fn resolve(&self, url: &Url) -> Result<PathBuf, FileProblem> {
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
                shown(&path)
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
            tracing::warn!(
                path = %path.display(),
                resolved = %resolved.display(),
                "a file URL leads outside the allowed file directories"
            );
            return Err(FileProblem::Forbidden(format!(
                "{} leads outside the allowed file directories (through a symlink)",
                shown(&path)
            )));
        }
        Ok(resolved)
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
            shown(&path)
        )));
    }
    Ok(path)
}

fn unreadable(path: &Path, error: &io::Error) -> FileProblem {
    let reason = match error.kind() {
        io::ErrorKind::NotFound => "no such file",
        io::ErrorKind::PermissionDenied => "permission denied",
        _ if error.raw_os_error() == Some(libc::ELOOP) => "is a symlink",
        _ => {
            tracing::warn!(path = %path.display(), %error, "a file URL cannot be resolved");
            "cannot be read"
        }
    };
    FileProblem::Unreadable(format!("{}: {reason}", shown(path)))
}

/// A path the client wrote, as a message quotes it.
pub(crate) fn shown(path: &Path) -> String {
    excerpt(&path.to_string_lossy()).to_string()
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

        let resolved = roots(allowed.path())
            .resolve(&file_url(&image))
            .expect("inside the allowed dir");
        assert_eq!(resolved, image.canonicalize().expect("exists"));
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
            match roots.resolve(&url) {
                Err(FileProblem::Forbidden(text)) => assert!(text.contains("outside"), "{text}"),
                other => panic!("{url}: {other:?}"),
            }
        }
        // Refused without looking: a missing file outside is just as forbidden.
        let missing = outside.path().join("nothing-here.png");
        assert!(matches!(
            roots.resolve(&file_url(&missing)),
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
            match roots.resolve(&url) {
                Err(FileProblem::Forbidden(text)) => {
                    assert!(text.contains("leads outside"), "{text}");
                    assert!(
                        !text.contains(&outside.path().display().to_string()),
                        "the target stays in the log: {text}"
                    );
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
        let resolved = roots(allowed.path())
            .resolve(&file_url(&link))
            .expect("the link stays inside");
        assert_eq!(resolved, image.canonicalize().expect("exists"));
    }

    #[test]
    fn refuses_when_no_dir_is_configured() {
        let dir = tempfile::tempdir().expect("tempdir");
        let image = dir.path().join("a.png");
        std::fs::write(&image, b"a").expect("write image");
        match FileRoots::default().resolve(&file_url(&image)) {
            Err(FileProblem::Forbidden(text)) => assert!(text.contains("disabled"), "{text}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_missing_file_is_unreadable_and_a_directory_resolves() {
        let allowed = tempfile::tempdir().expect("tempdir");
        let roots = roots(allowed.path());
        let missing = allowed.path().join("missing.png");
        match roots.resolve(&file_url(&missing)) {
            Err(FileProblem::Unreadable(text)) => assert!(text.contains("no such file"), "{text}"),
            other => panic!("{other:?}"),
        }
        // What the path is (directory, FIFO, empty, too big) is the data
        // plane's read to find out; resolving only confines it.
        let sub = allowed.path().join("sub");
        std::fs::create_dir(&sub).expect("mkdir");
        assert!(roots.resolve(&file_url(&sub)).is_ok());
    }

    #[test]
    fn refuses_file_urls_with_a_host() {
        let allowed = tempfile::tempdir().expect("tempdir");
        let url = Url::parse("file://fileserver/share/a.png").expect("parses");
        assert!(matches!(
            roots(allowed.path()).resolve(&url),
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
