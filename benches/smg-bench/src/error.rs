//! Setup errors: everything that stops a run before it starts (bad flags,
//! unreadable datasets, unreachable servers), each with a stable snake_case
//! code printed as `error[code]: message` and a non-zero exit status.
//!
//! Failures of individual requests during a run are not errors of this kind:
//! they are counted by class in the report (see [`crate::record::ErrorClass`]).

use thiserror::Error;

#[derive(Debug, Error)]
pub enum SetupError {
    /// A flag's value or a combination of flags makes no sense.
    #[error("{0}")]
    InvalidArgument(String),
    /// `--base-url` or `--metrics-url` is not an `http://host:port` URL.
    #[error("{0}")]
    InvalidUrl(String),
    /// The dataset file cannot be read or is not in the expected format.
    #[error("{0}")]
    InvalidDataset(String),
    /// The tokenizer file cannot be loaded.
    #[error("{0}")]
    InvalidTokenizer(String),
    /// The requested workload cannot be expressed on this endpoint.
    #[error("{0}")]
    UnsupportedWorkload(String),
    /// `--wait-ready`: the server did not answer `/readiness` 200 in time.
    #[error("{0}")]
    ServerNotReady(String),
    /// The model could not be discovered from `GET /v1/models`.
    #[error("{0}")]
    ModelDiscoveryFailed(String),
    /// Generating or writing images, or writing an output file, failed.
    #[error("{0}")]
    Io(String),
}

impl SetupError {
    /// The stable code printed with the message.
    pub fn code(&self) -> &'static str {
        match self {
            SetupError::InvalidArgument(_) => "invalid_argument",
            SetupError::InvalidUrl(_) => "invalid_url",
            SetupError::InvalidDataset(_) => "invalid_dataset",
            SetupError::InvalidTokenizer(_) => "invalid_tokenizer",
            SetupError::UnsupportedWorkload(_) => "unsupported_workload",
            SetupError::ServerNotReady(_) => "server_not_ready",
            SetupError::ModelDiscoveryFailed(_) => "model_discovery_failed",
            SetupError::Io(_) => "io_error",
        }
    }
}

pub type SetupResult<T> = Result<T, SetupError>;
