//! The HTTP wire types of smg's public API, and the one path from a request
//! body to what the pipeline consumes.
//!
//! Clients speak four dialects: OpenAI (`/v1/chat/completions`,
//! `/v1/completions`, `/v1/embeddings`, `/v1/models`), SGLang's native
//! `/generate`, Anthropic's `/v1/messages`, and SGLang's `/v1/classify`.
//! Each dialect's shapes live in its own file; every generation request goes
//! the same way:
//!
//! 1. [`parse::parse_json`] turns the body into the request type, telling
//!    malformed JSON (`invalid_json`) from a wrong shape (`invalid_request`,
//!    with the field path as `param`);
//! 2. the request's `to_spec(&Limits)` checks every parameter with the shared
//!    rules in [`validate`] (`invalid_parameter`, named as the client spelled
//!    it) and returns a protocol-neutral [`spec::GenerationSpec`];
//! 3. the pipeline reads only the spec; the response types of the request's
//!    dialect carry the result back.

pub mod anthropic;
pub mod embeddings;
pub mod forms;
pub mod openai;
pub mod parse;
pub mod responses;
pub mod sglang;
pub mod tokenize;
pub mod tools;
pub use crate::pipeline::spec;
pub mod validate;
