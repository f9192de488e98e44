//! `passthrough`: no tool calls; every byte is content.
//!
//! Why it exists: the default when no parser is configured or detected, so
//! the gateway can drive every response through the same interface.

use super::{ToolDelta, ToolParser};

#[derive(Debug, Default)]
pub(crate) struct Passthrough;

impl ToolParser for Passthrough {
    fn push(&mut self, chunk: &str) -> ToolDelta {
        ToolDelta {
            content: chunk.to_owned(),
            ..ToolDelta::default()
        }
    }

    fn finish(&mut self) -> ToolDelta {
        ToolDelta::default()
    }
}
