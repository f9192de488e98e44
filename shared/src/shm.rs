//! The identity of a `/dev/shm` namespace.
//!
//! Two processes can hand each other tensors through `/dev/shm` files only when
//! they see the same tmpfs: same kernel boot and same device. Workers advertise
//! their identity as `"<boot_id>:<st_dev of /dev/shm>"` (the engines' format);
//! the gateway compares it with its own before choosing the shm lane.

use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Where the kernel publishes the boot id.
const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";
/// The tmpfs the shm lane writes into.
pub const SHM_DIR: &str = "/dev/shm";

/// A `/dev/shm` identity token, `"<boot_id>:<st_dev>"`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShmNamespace(String);

/// Why this host's shm identity could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ShmNamespaceError {
    #[error("cannot read the boot id from {path}: {source}")]
    BootId {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot stat {path}: {source}")]
    ShmDir {
        path: String,
        source: std::io::Error,
    },
}

impl ShmNamespace {
    /// The identity of this process's `/dev/shm`.
    pub fn current() -> Result<Self, ShmNamespaceError> {
        Self::read_from(Path::new(BOOT_ID_PATH), Path::new(SHM_DIR))
    }

    /// Reads the identity from an explicit boot-id file and shm directory.
    pub fn read_from(boot_id_file: &Path, shm_dir: &Path) -> Result<Self, ShmNamespaceError> {
        let boot_id =
            std::fs::read_to_string(boot_id_file).map_err(|source| ShmNamespaceError::BootId {
                path: boot_id_file.display().to_string(),
                source,
            })?;
        let device = std::fs::metadata(shm_dir)
            .map_err(|source| ShmNamespaceError::ShmDir {
                path: shm_dir.display().to_string(),
                source,
            })?
            .dev();
        Ok(Self::from_parts(boot_id.trim(), device))
    }

    /// Builds the token from its two parts.
    pub fn from_parts(boot_id: &str, device: u64) -> Self {
        Self(format!("{boot_id}:{device}"))
    }

    /// Wraps a token advertised by a peer, as-is.
    pub fn from_advertised(token: impl Into<String>) -> Self {
        Self(token.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ShmNamespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_joins_boot_id_and_device() {
        assert_eq!(
            ShmNamespace::from_parts("0f1e-22", 27).as_str(),
            "0f1e-22:27"
        );
    }

    #[test]
    fn current_matches_proc_and_stat() {
        let token = ShmNamespace::current().expect("this host has /proc and /dev/shm");
        let boot_id = std::fs::read_to_string(BOOT_ID_PATH).expect("boot id");
        let dev = std::fs::metadata(SHM_DIR).expect("/dev/shm").dev();
        assert_eq!(token.as_str(), format!("{}:{dev}", boot_id.trim()));
    }

    #[test]
    fn different_device_means_different_namespace() {
        let a = ShmNamespace::from_parts("boot", 1);
        let b = ShmNamespace::from_parts("boot", 2);
        assert_ne!(a, b);
    }

    #[test]
    fn missing_boot_id_is_a_clear_error() {
        let err = ShmNamespace::read_from(Path::new("/nonexistent/boot_id"), Path::new("/"))
            .expect_err("must fail");
        assert!(err.to_string().contains("/nonexistent/boot_id"), "{err}");
    }
}
