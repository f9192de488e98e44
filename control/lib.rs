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

pub mod admission;
pub mod api;
pub mod cli;
pub mod config;
pub mod demo;
pub mod discovery;
pub mod engine;
pub mod error;
pub mod history;
pub mod lanes;
mod log_throttle;
pub mod logging;
pub mod mcp;
pub mod media;
pub mod memo;
pub mod metrics;
pub mod mode;
pub mod models;
pub mod offload;
pub mod pipeline;
pub mod policies;
pub mod proto;
pub mod router;
pub mod server;
pub mod shutdown;
pub mod startup;
pub mod tls;
pub mod tokenizer;
pub mod workers;

#[cfg(test)]
mod architecture;
