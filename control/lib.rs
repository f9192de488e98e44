//! smg's control plane: everything that runs on the tokio runtime.
//!
//! It turns OpenAI/SGLang/Anthropic HTTP requests into engine RPCs: the HTTP
//! API (`api`), one router type per [`mode::Mode`] (`router`) running the
//! request pipeline (`pipeline`), routing policies and workers, the engine
//! clients (`engine`) and the tokenizer (chat templates, detokenization, stop
//! strings), and media intake (`media`: image references to raw bytes, under
//! an SSRF guard and byte caps). Per-byte work (images, tensors) belongs to
//! the `smg-dataplane` crate, reached only through the rings in `smg-shared`.
//!
//! No `unsafe` here: raw memory and syscalls belong to the data plane. The
//! one exception (`demo`'s `pre_exec`) is allowed where it stands.

#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(unreachable_pub)]

pub(crate) mod admission;
pub mod api;
pub mod cli;
pub mod config;
pub mod demo;
pub(crate) mod discovery;
pub mod engine;
pub mod error;
pub(crate) mod history;
pub(crate) mod lanes;
mod log_throttle;
pub mod logging;
pub mod mcp;
pub(crate) mod media;
pub(crate) mod memo;
pub mod metrics;
pub(crate) mod mode;
pub(crate) mod models;
pub(crate) mod offload;
pub(crate) mod pipeline;
pub mod policies;
pub mod proto;
pub(crate) mod router;
pub mod server;
pub(crate) mod shared_prefix;
pub(crate) mod shutdown;
pub(crate) mod startup;
pub(crate) mod tls;
pub mod tokenizer;
pub mod workers;

#[cfg(test)]
mod architecture;
