//! The driver that turns a [`Grammar`] into a [`ToolParser`].
//!
//! Why it exists: every format is written as a grammar that makes progress
//! on the unconsumed text of a [`Stream`]; the driver owns the loop, the
//! buffer cap and the end of stream, so those rules cannot differ between
//! formats. A grammar's decisions depend only on the text it has seen (never
//! on where a chunk ended), which is what makes every chunking of a response
//! produce the same content and calls.

use std::fmt;

use super::stream::Stream;
use super::{ToolDelta, ToolParser, Tools};

/// One tool-call format.
pub(crate) trait Grammar: Send + fmt::Debug {
    /// Makes progress on the unconsumed text. Returns false when nothing more
    /// can be done until more text arrives (with `at_end`, until the frame in
    /// progress is abandoned).
    fn step(&mut self, stream: &mut Stream, at_end: bool) -> bool;
    /// The frame in progress cannot finish (the text ended, or a pending call
    /// outgrew the cap): complete a committed call's arguments, give a
    /// pending call's text back as content, and return to free text.
    fn abandon(&mut self, stream: &mut Stream);
    /// True when no frame is in progress.
    fn in_text(&self) -> bool;
    /// True when the open call's arguments are complete and only its
    /// closing markup (a trailer, a separator) is still to come.
    fn call_closed(&self) -> bool;
}

/// A [`ToolParser`] made of a grammar and the shared stream state.
#[derive(Debug)]
pub(crate) struct Engine<G> {
    stream: Stream,
    grammar: G,
}

impl<G: Grammar> Engine<G> {
    pub(crate) fn new(tools: Tools, grammar: G) -> Self {
        Self {
            stream: Stream::new(tools),
            grammar,
        }
    }

    fn run(&mut self, at_end: bool) {
        while self.grammar.step(&mut self.stream, at_end) {
            if self.stream.over_cap() {
                self.grammar.abandon(&mut self.stream);
            }
        }
    }
}

impl<G: Grammar> ToolParser for Engine<G> {
    fn push(&mut self, chunk: &str) -> ToolDelta {
        self.stream.append(chunk);
        self.run(false);
        self.stream.take_delta()
    }

    fn finish(&mut self) -> ToolDelta {
        loop {
            self.run(true);
            if self.grammar.in_text() && self.stream.rest().is_empty() {
                break;
            }
            self.grammar.abandon(&mut self.stream);
        }
        self.stream.take_delta()
    }

    fn finish_cut(&mut self) -> ToolDelta {
        if self.stream.call_in_progress() && !self.grammar.call_closed() {
            self.stream.cut_off();
            // No call is open any more: this only returns to free text.
            self.grammar.abandon(&mut self.stream);
        }
        self.finish()
    }
}
