//! Media intake: turning the image references a client sent into raw bytes.
//!
//! Clients name images as `data:` URLs, `http(s)://` URLs, `file://` URLs or
//! (SGLang's `/generate`) bare base64. Every one of these is untrusted input
//! that makes the gateway do something: decode megabytes, open connections
//! from inside the operator's network, read local files. This module does
//! that on the control plane under explicit limits (count, bytes, time,
//! where it may connect, which files it may read), and hands back only the
//! undecoded bytes and their content hash. Decoding the image format,
//! checking dimensions and producing tensors is the data plane's job.
//!
//! - [`intake`]: the [`MediaFetcher`] and its [`MediaConfig`]; the entry
//!   point, [`MediaFetcher::fetch_all`].
//! - [`guard`]: the SSRF guard (address classes, allow-list, the resolver
//!   that connects only to vetted addresses).
//! - [`inline`]: `data:` URLs and bare base64.
//! - [`remote`]: `http(s)` fetching with manual, re-vetted redirects.
//! - [`local`]: `file://` confined to allow-listed directories.

pub(crate) mod guard;
pub(crate) mod inline;
pub(crate) mod intake;
pub(crate) mod local;
pub(crate) mod remote;

use bytes::Bytes;

pub(crate) use guard::PrivateHostAllowance;
pub(crate) use intake::{FetchedMedia, MediaConfig, MediaFetcher};

/// Bytes with their blake3 hash, computed in the pass that produced them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HashedBytes {
    pub bytes: Bytes,
    pub content_hash: [u8; 32],
}
