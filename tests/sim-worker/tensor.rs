//! Reading the tensors a request carries, the way real engine workers do.
//!
//! A tensor arrives inline in the gRPC message, as a `/dev/shm` name (opened
//! `O_RDONLY|O_NOFOLLOW`, regular files only, read with `pread`, then
//! unlinked, as TokenSpeed workers do) or as a remote handle (the RDMA lane's
//! loopback transport, see `remote`). Size, shape and dtype must agree or the request fails with
//! INVALID_ARGUMENT. With `--record-dir`, every tensor read is written out
//! with a JSON sidecar so people can inspect what the gateway sent.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use smg_shared::shm::SHM_DIR;
use smg_shared::tensor::DType;
use tonic::Status;

/// Where a tensor's bytes came from; recorded with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    Inline,
    Shm,
    Remote,
}

impl Lane {
    pub fn name(self) -> &'static str {
        match self {
            Lane::Inline => "inline",
            Lane::Shm => "shm",
            Lane::Remote => "remote",
        }
    }
}

/// A tensor's payload as the protocol delivered it.
#[derive(Debug)]
pub enum Payload<'a> {
    Inline(&'a [u8]),
    Shm {
        name: &'a str,
        offset: u64,
        nbytes: u64,
    },
    Remote {
        transport: &'a str,
        descriptor: &'a [u8],
        nbytes: u64,
    },
}

/// A tensor the worker has read into memory.
#[derive(Debug, Clone)]
pub struct ReceivedTensor {
    pub dtype: String,
    pub shape: Vec<u32>,
    pub bytes: Vec<u8>,
    pub lane: Lane,
}

impl ReceivedTensor {
    pub fn digest(&self) -> [u8; 32] {
        crate::digest::tensor_digest(&self.dtype, &self.shape, &self.bytes)
    }
}

/// How a worker takes tensors in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Intake {
    /// Leave shm names in place (a fault: a worker that never unlinks).
    pub keep_shm_names: bool,
    /// Check each tensor's size against its shape and consume its shm name,
    /// but neither read nor keep its bytes, so its digest covers dtype and
    /// shape only. For benchmarks on small machines: a real engine copies
    /// the bytes to its GPU on cores of its own, which the worker's read and
    /// hash would otherwise take from the gateway under test.
    pub size_only: bool,
}

/// Reads a tensor from its payload and checks it against its shape and dtype.
pub fn read_tensor(
    dtype: &str,
    shape: &[u32],
    payload: Payload<'_>,
    intake: Intake,
) -> Result<ReceivedTensor, Status> {
    let parsed: DType = dtype
        .parse()
        .map_err(|err: smg_shared::tensor::UnknownDType| {
            Status::invalid_argument(err.to_string())
        })?;
    let expected = parsed.tensor_bytes(shape).ok_or_else(|| {
        Status::invalid_argument(format!(
            "tensor shape {shape:?} overflows the address space"
        ))
    })?;
    let (bytes, len, lane) = match payload {
        Payload::Inline(bytes) if intake.size_only => (Vec::new(), bytes.len(), Lane::Inline),
        Payload::Inline(bytes) => (bytes.to_vec(), bytes.len(), Lane::Inline),
        Payload::Shm {
            name,
            offset,
            nbytes,
        } => {
            let (bytes, len) = read_shm(name, offset, nbytes, intake)?;
            (bytes, len, Lane::Shm)
        }
        Payload::Remote {
            transport,
            descriptor,
            nbytes,
        } => {
            let bytes = crate::remote::read_remote(transport, descriptor, nbytes)?;
            let len = bytes.len();
            let bytes = if intake.size_only { Vec::new() } else { bytes };
            (bytes, len, Lane::Remote)
        }
    };
    if len != expected {
        return Err(Status::invalid_argument(format!(
            "tensor of {len} bytes does not match shape {shape:?} and dtype {dtype} ({expected} bytes)"
        )));
    }
    Ok(ReceivedTensor {
        dtype: dtype.to_owned(),
        shape: shape.to_vec(),
        bytes,
        lane,
    })
}

/// Where shm names live: `/dev/shm` unless `--shm-dir` named another tmpfs
/// (tests give the gateway and its workers a small one of their own).
static SHM_ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Resolves shm names in `dir` instead of `/dev/shm` (set once, at start-up).
pub fn set_shm_dir(dir: PathBuf) {
    let _ = SHM_ROOT.set(dir);
}

/// The path of a shm name; names are single path components in `/dev/shm`
/// (an optional leading '/' as `shm_open` spells them).
/// The directory shm names (and the RDMA loopback arena) live in.
pub fn shm_root() -> &'static Path {
    SHM_ROOT.get().map_or(Path::new(SHM_DIR), PathBuf::as_path)
}

fn shm_path(name: &str) -> Result<PathBuf, Status> {
    let bare = name.strip_prefix('/').unwrap_or(name);
    if bare.is_empty() || bare.contains('/') || bare == "." || bare == ".." {
        return Err(Status::invalid_argument(format!(
            "shm name {name:?} is not a single name in {SHM_DIR}"
        )));
    }
    Ok(shm_root().join(bare))
}

/// Where `--pause-shm-read` signals and waits, and whether the one pause
/// it makes has happened.
static SHM_PAUSE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
static SHM_PAUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The file the worker writes (holding the shm name) when it stops before
/// its first shm read.
pub const PAUSED_FILE: &str = "paused";
/// The file a test creates to let the paused read go on.
pub const RESUME_FILE: &str = "resume";

/// Stops before opening the first shm tensor until `dir/resume` exists,
/// after writing the name it is about to open to `dir/paused` (set once,
/// at start-up). Lets a test act on the gateway's files between the
/// gateway publishing a tensor and the worker reading it.
pub fn pause_first_shm_read(dir: PathBuf) {
    let _ = SHM_PAUSE.set(dir);
}

/// The `--pause-shm-read` stop, once per process.
fn pause_before_reading(name: &str) -> Result<(), Status> {
    let Some(dir) = SHM_PAUSE.get() else {
        return Ok(());
    };
    if SHM_PAUSED.swap(true, Ordering::AcqRel) {
        return Ok(());
    }
    // Written whole, then renamed: a test never reads half a name.
    let staged = dir.join(format!("{PAUSED_FILE}.partial"));
    std::fs::write(&staged, name)
        .and_then(|()| std::fs::rename(&staged, dir.join(PAUSED_FILE)))
        .map_err(|err| Status::internal(format!("cannot signal the pause: {err}")))?;
    tracing::info!(name, "paused before reading a shm tensor");
    let resume = dir.join(RESUME_FILE);
    // The call's thread waits; the runtime moves its other tasks away.
    let wait = || {
        while !resume.exists() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(_) => tokio::task::block_in_place(wait),
        Err(_) => wait(),
    }
    Ok(())
}

/// The bytes (none when `intake.size_only`) and their length.
fn read_shm(
    name: &str,
    offset: u64,
    nbytes: u64,
    intake: Intake,
) -> Result<(Vec<u8>, usize), Status> {
    let path = shm_path(name)?;
    pause_before_reading(name)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|err| {
            Status::invalid_argument(format!("cannot open shm tensor {}: {err}", path.display()))
        })?;
    let result = read_opened(&file, &path, offset, nbytes, intake.size_only);
    // Like a real worker: once opened, the name is consumed whatever the read
    // found, so a bad request cannot leak it.
    if !intake.keep_shm_names
        && let Err(err) = std::fs::remove_file(&path)
    {
        tracing::warn!(path = %path.display(), %err, "could not unlink shm tensor");
    }
    result
}

fn read_opened(
    file: &File,
    path: &Path,
    offset: u64,
    nbytes: u64,
    size_only: bool,
) -> Result<(Vec<u8>, usize), Status> {
    let meta = file
        .metadata()
        .map_err(|err| Status::internal(format!("cannot stat {}: {err}", path.display())))?;
    if !meta.file_type().is_file() {
        return Err(Status::invalid_argument(format!(
            "shm tensor {} is not a regular file",
            path.display()
        )));
    }
    let end = offset
        .checked_add(nbytes)
        .filter(|&end| end <= meta.len())
        .ok_or_else(|| {
            Status::invalid_argument(format!(
                "shm tensor {} holds {} bytes, handle asks for {nbytes} at offset {offset}",
                path.display(),
                meta.len()
            ))
        })?;
    let len = usize::try_from(end - offset)
        .map_err(|_| Status::invalid_argument("shm tensor larger than memory"))?;
    if size_only {
        return Ok((Vec::new(), len));
    }
    let mut bytes = vec![0u8; len];
    file.read_exact_at(&mut bytes, offset)
        .map_err(|err| Status::internal(format!("cannot read {}: {err}", path.display())))?;
    Ok((bytes, len))
}

/// Writes every received tensor to a directory, with a JSON sidecar.
#[derive(Debug)]
pub struct Recorder {
    dir: PathBuf,
    sequence: AtomicU64,
}

/// What a recorded tensor was part of.
#[derive(Debug, Clone, Copy)]
pub struct RecordContext<'a> {
    pub request_id: &'a str,
    pub role: &'a str,
    pub item_index: usize,
    pub name: &'a str,
}

impl Recorder {
    pub fn new(dir: PathBuf) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        Ok(Self {
            dir,
            sequence: AtomicU64::new(0),
        })
    }

    pub fn record(&self, context: RecordContext<'_>, tensor: &ReceivedTensor) {
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        let safe_id: String = context
            .request_id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .take(64)
            .collect();
        let stem = format!(
            "{sequence:06}-{safe_id}-{}-{}",
            context.item_index, context.name
        );
        let sidecar = serde_json::json!({
            "request_id": context.request_id,
            "role": context.role,
            "item_index": context.item_index,
            "name": context.name,
            "lane": tensor.lane.name(),
            "shape": tensor.shape,
            "dtype": tensor.dtype,
            "nbytes": tensor.bytes.len(),
        });
        let written =
            std::fs::write(self.dir.join(format!("{stem}.bin")), &tensor.bytes).and_then(|()| {
                std::fs::write(self.dir.join(format!("{stem}.json")), sidecar.to_string())
            });
        if let Err(err) = written {
            tracing::warn!(dir = %self.dir.display(), %err, "could not record tensor");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn shm_file(bytes: &[u8]) -> (String, PathBuf) {
        let name = format!(
            "smg-sim-test-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        );
        let path = Path::new(SHM_DIR).join(&name);
        let mut file = std::fs::File::create(&path).expect("create shm file");
        file.write_all(bytes).expect("write");
        (name, path)
    }

    #[test]
    fn inline_tensor_must_match_its_shape() {
        let ok = read_tensor(
            "bfloat16",
            &[2, 2],
            Payload::Inline(&[0; 8]),
            Intake::default(),
        );
        assert_eq!(ok.expect("8 bytes is 2x2 bf16").lane, Lane::Inline);
        let err = read_tensor(
            "bfloat16",
            &[2, 3],
            Payload::Inline(&[0; 8]),
            Intake::default(),
        )
        .expect_err("size mismatch");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        let err = read_tensor("fp8", &[1], Payload::Inline(&[0]), Intake::default())
            .expect_err("bad dtype");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn shm_tensor_is_read_then_unlinked() {
        let bytes: Vec<u8> = (0..64).collect();
        let (name, path) = shm_file(&bytes);
        let payload = Payload::Shm {
            name: &name,
            offset: 16,
            nbytes: 32,
        };
        let tensor = read_tensor("float32", &[8], payload, Intake::default()).expect("read");
        assert_eq!(tensor.bytes, bytes[16..48]);
        assert!(!path.exists(), "the worker unlinks the name it read");
    }

    #[test]
    fn size_only_intake_checks_the_size_and_consumes_the_name() {
        let size_only = Intake {
            size_only: true,
            ..Intake::default()
        };
        let (name, path) = shm_file(&[7; 32]);
        let payload = Payload::Shm {
            name: &name,
            offset: 0,
            nbytes: 32,
        };
        let tensor = read_tensor("float32", &[8], payload, size_only).expect("size matches");
        assert!(tensor.bytes.is_empty(), "no bytes are read");
        assert!(!path.exists(), "the name is consumed all the same");
        let (name, path) = shm_file(&[7; 16]);
        let payload = Payload::Shm {
            name: &name,
            offset: 0,
            nbytes: 16,
        };
        let err = read_tensor("float32", &[8], payload, size_only).expect_err("16 != 32");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(!path.exists());
        let err = read_tensor("bfloat16", &[2, 3], Payload::Inline(&[0; 8]), size_only)
            .expect_err("inline size is checked too");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn shm_mismatch_is_rejected_and_still_unlinked() {
        let (name, path) = shm_file(&[0; 16]);
        let payload = Payload::Shm {
            name: &name,
            offset: 0,
            nbytes: 16,
        };
        let err = read_tensor("float32", &[8], payload, Intake::default()).expect_err("32 != 16");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(!path.exists());
    }

    #[test]
    fn shm_symlinks_and_paths_are_refused() {
        let (target_name, target) = shm_file(&[0; 4]);
        let link_name = format!("{target_name}-link");
        let link = Path::new(SHM_DIR).join(&link_name);
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        let payload = Payload::Shm {
            name: &link_name,
            offset: 0,
            nbytes: 4,
        };
        let err = read_tensor("float32", &[1], payload, Intake::default()).expect_err("O_NOFOLLOW");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        std::fs::remove_file(&link).expect("cleanup link");
        std::fs::remove_file(&target).expect("cleanup target");

        let payload = Payload::Shm {
            name: "../etc/passwd",
            offset: 0,
            nbytes: 4,
        };
        let err =
            read_tensor("float32", &[1], payload, Intake::default()).expect_err("not a shm name");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn remote_verbs_is_unimplemented_and_garbage_is_invalid() {
        let payload = |transport| Payload::Remote {
            transport,
            descriptor: &[0; 68],
            nbytes: 4,
        };
        let err =
            read_tensor("float32", &[1], payload("rdma"), Intake::default()).expect_err("no NIC");
        assert_eq!(err.code(), tonic::Code::Unimplemented);
        let err = read_tensor("float32", &[1], payload("loopback"), Intake::default())
            .expect_err("garbage");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(
            err.message().contains("rdma_descriptor_malformed"),
            "{err:?}"
        );
    }
}
