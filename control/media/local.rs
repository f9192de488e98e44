//! `file://` images, confined to directories the operator allow-lists.
//!
//! Reading local files on a client's say-so is arbitrary file disclosure
//! (`file:///etc/shadow`, a model's weights) unless it is confined. The
//! confinement: no allowed directory means no file URLs at all; a path must
//! be under an allowed directory as written (checked before touching the
//! file system, so refusals do not reveal which files exist elsewhere); then
//! the rest of the path is opened *relative to a descriptor of that
//! directory* (held since start-up) with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`, so the kernel refuses any
//! symlink and anything that would leave the directory in the same call that
//! opens the file. Only a regular file is accepted (`fstat` on the opened
//! descriptor; a FIFO or a device would block or never end), and the
//! descriptor itself goes to the data plane
//! (`smg_dataplane::runtime::DataPlane::read_opened`, through io_uring), so
//! nothing is resolved twice.
//!
//! Why not "canonicalize, check the prefix, then open the path": between the
//! check and the open, a directory inside the allowed tree can be renamed
//! away and a symlink to anywhere put in its place (a probe read a file
//! outside in 413 of 1,500 tries). Resolving and opening in one call leaves
//! no such window.
//!
//! Symlinks are not followed at all, even ones that stay inside the allowed
//! directory: telling a harmless link from a swapped one needs exactly the
//! two-step resolution this avoids. Kernels without `openat2` (before 5.6,
//! `ENOSYS`) get the same rules by walking the path one component at a time
//! with `openat(O_NOFOLLOW)`, each directory opened relative to the previous
//! one's descriptor.
//!
//! Refusals quote the path as the client wrote it (bounded, see
//! `crate::error::excerpt`) and nothing else: not the canonical path, not the
//! allowed directories, not the OS's error text. Those would tell a client
//! about files it may not read; they go to the log.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{Mode, SFlag};
use reqwest::Url;

use crate::error::excerpt;

/// Why a `file://` image was refused or could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FileProblem {
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

/// One allow-listed directory, as configured and fully resolved, and held
/// open (every file URL under it is opened relative to this descriptor).
#[derive(Debug, Clone)]
struct AllowedDir {
    configured: PathBuf,
    canonical: PathBuf,
    fd: Arc<OwnedFd>,
}

/// The directories `file://` URLs may read from.
#[derive(Debug, Clone, Default)]
pub(crate) struct FileRoots {
    dirs: Vec<AllowedDir>,
}

/// A confined file, opened and known to be regular.
#[derive(Debug)]
pub(crate) struct OpenedFile {
    /// The path as the URL wrote it (for messages).
    pub path: PathBuf,
    pub file: OwnedFd,
}

/// How the file itself is opened: read-only, never blocking (a FIFO), not
/// inherited by child processes.
const FILE_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_NONBLOCK)
    .union(OFlag::O_CLOEXEC);

/// How often an `openat2` that the kernel asks to retry (`EAGAIN`: a rename
/// raced the resolution) is tried again before giving up.
const OPEN_ATTEMPTS: usize = 4;

impl FileRoots {
    /// Resolves and opens each directory once; a missing directory is a
    /// configuration error, reported with its path.
    pub(crate) fn new(dirs: &[PathBuf]) -> Result<Self, (PathBuf, io::Error)> {
        let dirs = dirs
            .iter()
            .map(|dir| {
                let canonical = dir.canonicalize().map_err(|error| (dir.clone(), error))?;
                let fd = nix::fcntl::open(
                    &canonical,
                    OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|errno| {
                    let error = if errno == Errno::ENOTDIR {
                        io::Error::other("not a directory")
                    } else {
                        io::Error::from(errno)
                    };
                    (dir.clone(), error)
                })?;
                Ok(AllowedDir {
                    configured: dir.clone(),
                    canonical,
                    fd: Arc::new(fd),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { dirs })
    }

    /// Opens the file a `file://` URL names, within the rules above.
    /// Blocking file-system calls: run it off the async runtime.
    pub(crate) fn open(&self, url: &Url) -> Result<OpenedFile, FileProblem> {
        if self.dirs.is_empty() {
            return Err(FileProblem::Forbidden(
                "file:// URLs are disabled (no allowed file directories are configured)".to_owned(),
            ));
        }
        let path = local_path(url)?;
        let Some((dir, relative)) = self.dirs.iter().find_map(|dir| {
            let relative = path
                .strip_prefix(&dir.configured)
                .or_else(|_| path.strip_prefix(&dir.canonical))
                .ok()?;
            Some((dir, relative))
        }) else {
            return Err(FileProblem::Forbidden(format!(
                "{} is outside the allowed file directories",
                shown(&path)
            )));
        };
        let file = open_beneath(dir.fd.as_fd(), relative).map_err(|errno| match errno {
            Errno::ELOOP => FileProblem::Forbidden(format!(
                "{} is or passes through a symlink, which file:// URLs do not follow",
                shown(&path)
            )),
            Errno::EXDEV => FileProblem::Forbidden(format!(
                "{} leads outside the allowed file directories",
                shown(&path)
            )),
            other => unreadable(&path, &io::Error::from(other)),
        })?;
        let stat = nix::sys::stat::fstat(&file)
            .map_err(|errno| unreadable(&path, &io::Error::from(errno)))?;
        if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
            return Err(FileProblem::Forbidden(format!(
                "{} is not a regular file",
                shown(&path)
            )));
        }
        Ok(OpenedFile { path, file })
    }
}

/// Opens `relative` beneath `dir` without following any symlink or leaving
/// `dir`: one `openat2` call, or a component-by-component walk where the
/// kernel has no `openat2`.
fn open_beneath(dir: BorrowedFd<'_>, relative: &Path) -> Result<OwnedFd, Errno> {
    let target = if relative.as_os_str().is_empty() {
        Path::new(".")
    } else {
        relative
    };
    let how = OpenHow::new().flags(FILE_FLAGS).resolve(
        ResolveFlag::RESOLVE_BENEATH
            | ResolveFlag::RESOLVE_NO_SYMLINKS
            | ResolveFlag::RESOLVE_NO_MAGICLINKS,
    );
    for _ in 0..OPEN_ATTEMPTS {
        match nix::fcntl::openat2(dir, target, how) {
            Err(Errno::EAGAIN) => continue,
            Err(Errno::ENOSYS) => return open_walking(dir, relative),
            other => return other,
        }
    }
    Err(Errno::EAGAIN)
}

/// [`open_beneath`] without `openat2`: every directory on the way is opened
/// with `O_NOFOLLOW | O_DIRECTORY` relative to the one before (a symlink
/// fails, reported as `ELOOP`), and the file last with `O_NOFOLLOW`. Only plain
/// components reach here (`..` is refused before).
fn open_walking(dir: BorrowedFd<'_>, relative: &Path) -> Result<OwnedFd, Errno> {
    let names: Vec<&OsStr> = relative
        .components()
        .map(|part| match part {
            Component::Normal(name) => Ok(Some(name)),
            Component::CurDir => Ok(None),
            _ => Err(Errno::EXDEV),
        })
        .filter_map(Result::transpose)
        .collect::<Result<_, _>>()?;
    let Some((last, parents)) = names.split_last() else {
        return nix::fcntl::openat(dir, ".", FILE_FLAGS, Mode::empty());
    };
    let walk_flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut current: Option<OwnedFd> = None;
    for name in parents {
        let parent = current.as_ref().map_or(dir, AsFd::as_fd);
        let next =
            nix::fcntl::openat(parent, *name, walk_flags, Mode::empty()).map_err(|errno| {
                // O_DIRECTORY reports a symlink as "not a directory"; say what
                // openat2 would.
                let is_link = nix::sys::stat::fstatat(parent, *name, AtFlags::AT_SYMLINK_NOFOLLOW)
                    .is_ok_and(|stat| {
                        SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK
                    });
                if errno == Errno::ENOTDIR && is_link {
                    Errno::ELOOP
                } else {
                    errno
                }
            })?;
        current = Some(next);
    }
    let parent = current.as_ref().map_or(dir, AsFd::as_fd);
    nix::fcntl::openat(parent, *last, FILE_FLAGS, Mode::empty())
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
    use std::io::Read;
    use std::os::unix::fs::symlink;

    fn file_url(path: &Path) -> Url {
        Url::from_file_path(path).expect("absolute test path")
    }

    fn roots(dir: &Path) -> FileRoots {
        FileRoots::new(&[dir.to_path_buf()]).expect("test dir exists")
    }

    fn contents(opened: OpenedFile) -> Vec<u8> {
        let mut bytes = Vec::new();
        std::fs::File::from(opened.file)
            .read_to_end(&mut bytes)
            .expect("read the opened file");
        bytes
    }

    fn forbidden(outcome: Result<OpenedFile, FileProblem>, fragment: &str) {
        match outcome {
            Err(FileProblem::Forbidden(text)) => assert!(text.contains(fragment), "{text}"),
            other => panic!("expected Forbidden({fragment:?}), got {other:?}"),
        }
    }

    #[test]
    fn opens_a_file_inside_the_allowed_dir() {
        let allowed = tempfile::tempdir().expect("tempdir");
        let nested = allowed.path().join("sub");
        std::fs::create_dir(&nested).expect("mkdir");
        let image = nested.join("cat.png");
        std::fs::write(&image, b"cat pixels").expect("write image");

        let opened = roots(allowed.path())
            .open(&file_url(&image))
            .expect("inside the allowed dir");
        assert_eq!(opened.path, image);
        assert_eq!(contents(opened), b"cat pixels");
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
            forbidden(roots.open(&url), "outside");
        }
        // Refused without looking: a missing file outside is just as forbidden.
        let missing = outside.path().join("nothing-here.png");
        forbidden(roots.open(&file_url(&missing)), "outside");
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
            forbidden(roots.open(&url), "symlink");
        }
    }

    /// A symlink that stays inside was followed before the confinement
    /// became one `openat2`; it is refused now: telling it from a swapped
    /// one needs the check-then-open this module no longer does.
    #[test]
    fn refuses_even_a_symlink_that_stays_inside() {
        let allowed = tempfile::tempdir().expect("tempdir");
        let image = allowed.path().join("real.png");
        std::fs::write(&image, b"real").expect("write image");
        let link = allowed.path().join("alias.png");
        symlink(&image, &link).expect("symlink");
        std::fs::create_dir(allowed.path().join("d")).expect("mkdir");
        std::fs::write(allowed.path().join("d/in.png"), b"in").expect("write");
        symlink(allowed.path().join("d"), allowed.path().join("d-alias")).expect("symlink");
        let roots = roots(allowed.path());
        forbidden(roots.open(&file_url(&link)), "symlink");
        forbidden(
            roots.open(&file_url(&allowed.path().join("d-alias/in.png"))),
            "symlink",
        );
        assert_eq!(
            contents(roots.open(&file_url(&image)).expect("the target itself")),
            b"real"
        );
    }

    /// The fallback for kernels without `openat2` keeps the same rules.
    #[test]
    fn the_component_walk_refuses_symlinks_and_opens_plain_paths() {
        let allowed = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("secret.png"), b"secret").expect("write");
        std::fs::create_dir_all(allowed.path().join("a/b")).expect("mkdir");
        std::fs::write(allowed.path().join("a/b/img.png"), b"img").expect("write");
        symlink(outside.path(), allowed.path().join("a/out")).expect("symlink");
        symlink(
            outside.path().join("secret.png"),
            allowed.path().join("a/b/leaf.png"),
        )
        .expect("symlink");
        let dir = nix::fcntl::open(
            allowed.path(),
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .expect("open the dir");
        let opened = open_walking(dir.as_fd(), Path::new("a/./b/img.png")).expect("plain path");
        let mut bytes = Vec::new();
        std::fs::File::from(opened)
            .read_to_end(&mut bytes)
            .expect("read");
        assert_eq!(bytes, b"img");
        for through_a_link in ["a/out/secret.png", "a/b/leaf.png"] {
            assert_eq!(
                open_walking(dir.as_fd(), Path::new(through_a_link)).map(drop),
                Err(Errno::ELOOP),
                "{through_a_link}"
            );
        }
        assert_eq!(
            open_walking(dir.as_fd(), Path::new("a/missing.png")).map(drop),
            Err(Errno::ENOENT)
        );
    }

    #[test]
    fn refuses_when_no_dir_is_configured() {
        let dir = tempfile::tempdir().expect("tempdir");
        let image = dir.path().join("a.png");
        std::fs::write(&image, b"a").expect("write image");
        forbidden(FileRoots::default().open(&file_url(&image)), "disabled");
    }

    #[test]
    fn a_missing_file_is_unreadable_and_a_directory_is_not_a_regular_file() {
        let allowed = tempfile::tempdir().expect("tempdir");
        let roots = roots(allowed.path());
        let missing = allowed.path().join("missing.png");
        match roots.open(&file_url(&missing)) {
            Err(FileProblem::Unreadable(text)) => assert!(text.contains("no such file"), "{text}"),
            other => panic!("{other:?}"),
        }
        let sub = allowed.path().join("sub");
        std::fs::create_dir(&sub).expect("mkdir");
        forbidden(roots.open(&file_url(&sub)), "not a regular file");
        forbidden(roots.open(&file_url(allowed.path())), "not a regular file");
    }

    #[test]
    fn refuses_file_urls_with_a_host() {
        let allowed = tempfile::tempdir().expect("tempdir");
        let url = Url::parse("file://fileserver/share/a.png").expect("parses");
        assert!(matches!(
            roots(allowed.path()).open(&url),
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
