//! Reading a vetted local file: the rules both backends apply, and the
//! blocking implementation the plain backend uses.
//!
//! Why it exists: the control plane decides *whether* a `file://` URL may be
//! read (its allow-list, which also opens the file: `control/media/local.rs`
//! hands over an open descriptor, so nothing is resolved twice); the data
//! plane does the read, which is per-byte work. The rules: a path (tests and
//! other callers) has its final component opened without following a
//! symlink and without blocking (a FIFO must not stall the core), only a
//! regular file is read, never more than the cap (a file that grows while
//! being read is caught), an empty file is an error, and the bytes are hashed
//! with blake3 in the same place. The io_uring backend (`uring.rs`) follows
//! the same steps with queued operations and ends in [`finish_read`].

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;

use bytes::Bytes;

use super::job::{FileContents, FileRead, FileReadError, FileSource};

/// Flags for opening a vetted path (O_NONBLOCK is cleared once the file is
/// known to be regular).
pub(crate) const OPEN_FLAGS: i32 =
    libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;

/// Checks a file's type and declared size before reading.
pub(crate) fn check_metadata(
    is_regular: bool,
    len: u64,
    max_bytes: usize,
) -> Result<(), FileReadError> {
    if !is_regular {
        return Err(FileReadError::NotRegular);
    }
    if len > max_bytes as u64 {
        return Err(FileReadError::TooLarge { len, max_bytes });
    }
    Ok(())
}

/// Turns the bytes read into the job's output.
pub(crate) fn finish_read(
    contents: Vec<u8>,
    max_bytes: usize,
) -> Result<FileContents, FileReadError> {
    if contents.len() > max_bytes {
        return Err(FileReadError::TooLarge {
            len: contents.len() as u64,
            max_bytes,
        });
    }
    if contents.is_empty() {
        return Err(FileReadError::Empty);
    }
    let content_hash = *blake3::hash(&contents).as_bytes();
    Ok(FileContents {
        bytes: Bytes::from(contents),
        content_hash,
    })
}

fn io_error(error: &std::io::Error) -> FileReadError {
    match error.raw_os_error() {
        Some(errno) => FileReadError::from_errno(errno),
        None => FileReadError::Io(error.to_string()),
    }
}

/// The plain backend's read: blocking calls on the core's own thread.
pub(crate) fn read_blocking(request: FileRead) -> Result<FileContents, FileReadError> {
    let file = match request.source {
        FileSource::Path(path) => OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
            .map_err(|error| io_error(&error))?,
        FileSource::Opened(fd) => File::from(fd),
    };
    let metadata = file.metadata().map_err(|error| io_error(&error))?;
    check_metadata(metadata.is_file(), metadata.len(), request.max_bytes)?;
    let mut contents = Vec::with_capacity((metadata.len() as usize).saturating_add(1));
    file.take((request.max_bytes as u64).saturating_add(1))
        .read_to_end(&mut contents)
        .map_err(|error| io_error(&error))?;
    finish_read(contents, request.max_bytes)
}
