//! smg's control plane: everything that runs on the tokio runtime.
//!
//! It turns OpenAI/SGLang/Anthropic HTTP requests into engine RPCs. Today it
//! holds the engines' wire protocols; the HTTP API, router, pipelines and
//! policies land on top of them. Per-byte work (images, tensors) belongs to
//! the `smg-dataplane` crate, reached only through the rings in `smg-shared`.

pub mod api;
pub mod engine;
pub mod error;
pub mod proto;
