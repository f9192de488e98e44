//! Parsers that turn a model's generated text into what an API client reads:
//! tool calls (`tool`), reasoning (`reasoning`), and both at once for
//! gpt-oss's Harmony messages (`harmony`).
//!
//! In gRPC mode the engines return token ids only, so everything an agent
//! framework needs from the text (OpenAI `tool_calls`, `reasoning_content`,
//! Anthropic `tool_use` and `thinking` blocks) is recovered here. The crate is
//! pure: no I/O, no async, no gateway types. A parser is driven with text
//! chunks as the detokenizer produces them and answers with what is safe to
//! send so far; the same fixtures therefore test it streamed at every split
//! point and parsed whole.

#![deny(unsafe_code)]

pub mod harmony;
pub mod reasoning;
mod scan;
pub mod tool;
