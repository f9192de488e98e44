//! What travels through the rings: the work a job asks for, what it produces,
//! and how it can fail, with stable codes.
//!
//! Why a file of its own: these are the data plane's API as the control plane
//! sees it. They stay plain data (no references into the core's state), so a
//! job can cross threads by value and its result can be handed to whichever
//! future is waiting for it.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use smg_shared::tensor::DType;
use tokio::sync::oneshot;

pub use super::inline::{Base64Decode, Base64Error};
use crate::lanes::{LaneChoice, LaneError, SealedTensor};
use crate::preprocess::{ImagePlan, PreprocessError, PreprocessedImage, Qwen2VlImageProcessor};

/// One unit of work for a data-plane core.
#[derive(Debug)]
pub enum Work {
    /// Nothing: a job that only measures the hand-off (submit, core, reactor,
    /// waiter) and proves a core is alive.
    Ping,
    /// Occupy the core until the test releases it, then answer like
    /// [`Work::Ping`]: a stand-in for a heavy job in backpressure and
    /// shutdown tests (see [`super::testing::hold`]).
    #[cfg(feature = "testing")]
    Hold(super::testing::Hold),
    /// Read a whole regular file (already vetted by the caller's allow-list)
    /// and hash it.
    ReadFile(FileRead),
    /// Decode an inline (base64) image payload and hash it; answers like
    /// [`Work::ReadFile`].
    DecodeBase64(Base64Decode),
    /// Decode an image and write its encoder input tensor into a destination.
    Image(ImageJob),
}

impl Work {
    /// Work that occupies the core for a while: the loop lets queued I/O
    /// move before taking the next job.
    pub(crate) fn is_heavy(&self) -> bool {
        match self {
            Work::Image(_) | Work::DecodeBase64(_) => true,
            #[cfg(feature = "testing")]
            Work::Hold(_) => true,
            Work::Ping | Work::ReadFile(_) => false,
        }
    }
}

/// Read a whole file, at most `max_bytes`.
#[derive(Debug)]
pub struct FileRead {
    pub source: FileSource,
    pub max_bytes: usize,
}

/// Which file a [`FileRead`] reads.
#[derive(Debug)]
pub enum FileSource {
    /// A path opened on the core (the final component is not followed if it
    /// is a symlink; earlier ones are).
    Path(PathBuf),
    /// A file the caller already opened (the control plane's confined
    /// `openat2` beneath an allowed directory): nothing is resolved again,
    /// so no path can be swapped between the caller's check and the read.
    Opened(OwnedFd),
}

/// Preprocess `bytes` with `processor` into `destination` as `dtype`.
#[derive(Debug)]
pub struct ImageJob {
    pub processor: Arc<Qwen2VlImageProcessor>,
    pub bytes: Bytes,
    pub dtype: DType,
    pub destination: Destination,
}

/// The buffer the kernel writes the tensor into, once.
#[derive(Debug, Clone)]
pub enum Destination {
    /// A buffer of exactly the planned size, returned as an owned
    /// [`PreprocessedImage`] ([`Output::Image`]).
    Inline,
    /// A buffer from the lane's share on the core that runs the job; the
    /// tensor comes back sealed on its lane ([`Output::LaneImage`]).
    Lane(LaneChoice),
}

/// What a job produced.
#[derive(Debug)]
pub enum Output {
    Pong,
    File(FileContents),
    Image(PreprocessedImage),
    LaneImage(LaneImage),
}

/// An image whose tensor was written into a lane.
#[derive(Debug)]
pub struct LaneImage {
    pub plan: ImagePlan,
    pub tensor: SealedTensor,
}

/// A file's bytes and their blake3 hash, computed on the core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileContents {
    pub bytes: Bytes,
    pub content_hash: [u8; 32],
}

/// Why a file could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileReadError {
    #[error("no such file")]
    NotFound,
    #[error("permission denied")]
    PermissionDenied,
    #[error("is a symlink")]
    Symlink,
    #[error("not a regular file")]
    NotRegular,
    #[error("has {len} bytes, over the limit of {max_bytes}")]
    TooLarge { len: u64, max_bytes: usize },
    #[error("is empty")]
    Empty,
    #[error("{0}")]
    Io(String),
}

impl FileReadError {
    /// Maps an errno from open/statx/read.
    pub(crate) fn from_errno(errno: i32) -> Self {
        match errno {
            libc::ENOENT | libc::ENOTDIR => FileReadError::NotFound,
            libc::EACCES | libc::EPERM => FileReadError::PermissionDenied,
            libc::ELOOP => FileReadError::Symlink,
            other => FileReadError::Io(std::io::Error::from_raw_os_error(other).to_string()),
        }
    }
}

/// Why a job did not produce its output.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// Every core's job ring stayed full for the whole submit deadline.
    #[error("the data plane is busy: every job ring stayed full for {waited_ms} ms")]
    Busy { waited_ms: u64 },
    /// The data plane is shutting down (or has shut down).
    #[error("the data plane is shutting down")]
    ShuttingDown,
    #[error(transparent)]
    Image(#[from] PreprocessError),
    #[error("{0}")]
    File(#[from] FileReadError),
    /// An inline payload that is not valid base64, or decodes too large.
    #[error("{0}")]
    Base64(#[from] Base64Error),
    /// The lane could not publish a written tensor.
    #[error("the tensor lane failed: {0}")]
    Lane(#[from] LaneError),
    /// The work panicked on the core (a bug); the core keeps serving.
    #[error("the data-plane job panicked: {0}")]
    Panicked(String),
}

impl JobError {
    /// A stable snake_case code for logs and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            JobError::Busy { .. } => "dataplane_busy",
            JobError::ShuttingDown => "dataplane_unavailable",
            JobError::Image(error) => error.code(),
            JobError::File(_) => "file_read_failed",
            JobError::Base64(_) => "invalid_base64",
            JobError::Lane(_) => "tensor_lane_failed",
            JobError::Panicked(_) => "dataplane_panic",
        }
    }
}

/// What a job resolves to.
pub type JobResult = Result<Output, JobError>;

/// A job inside the data plane: the work and where its result goes. The
/// reply sender travels core-ward and back untouched by the core; only the
/// control-plane reactor completes it.
#[derive(Debug)]
pub(crate) struct Job {
    pub work: Work,
    pub reply: oneshot::Sender<JobResult>,
}

/// A finished job on its way back to the reactor.
#[derive(Debug)]
pub(crate) struct Completion {
    pub reply: oneshot::Sender<JobResult>,
    pub result: JobResult,
}
