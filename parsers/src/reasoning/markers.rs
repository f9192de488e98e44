//! The state machine every reasoning family shares.
//!
//! A response goes through at most three phases:
//! - **opening**: nothing but whitespace seen yet and the prompt did not open
//!   a think block; a start marker here opens one. Any other text means the
//!   model answered without thinking: the rest is content.
//! - **reasoning**: text is reasoning until the end marker (dropped) or, when
//!   [`ReasoningOptions::tool_call_ends_reasoning`] is on, a tool-call marker
//!   of the family (kept, as the first content, for the tool parser). A start
//!   marker before any reasoning text is dropped (the model repeating what
//!   the prompt opened).
//! - **content**: everything else, verbatim, including any later marker text:
//!   a response has one think block, at its start.
//!
//! Streaming never changes the result: text is sent as soon as no marker can
//! begin inside it, so only a suffix of the buffer that is a proper prefix of
//! a marker the phase is looking for is held back (`abc</thi` sends `abc`
//! and keeps `</thi`). Suffixes are taken at character boundaries, so a
//! held-back `◁/thi` never splits a character. The end marker and the
//! tool-call markers are looked for together, in one pass over the text
//! ([`crate::scan`]), and the answer passes through without being held.
//!
//! The whitespace right after the end marker is dropped: Qwen3 and
//! DeepSeek-R1 write `</think>\n\n` before their answer, and an answer that
//! starts with two blank lines is an artifact of the format, not text the
//! client wants (SGLang's parsers drop it too). Streamed, that whitespace may
//! come in later chunks than the marker, so it is dropped until the first
//! other character, whatever the chunking (`</think>\n\nanswer` and
//! `</think>`, `\n`, `\nanswer` both give content `answer`); whitespace
//! anywhere else is kept, and so is the text after a tool-call marker that
//! ended reasoning (it is the tool parser's). Without a reasoning parser
//! (`separate_reasoning: false`) nothing is touched. At the end of the
//! stream a held-back partial marker is text of the phase it was held in, and
//! a think block that never closed is all reasoning (a truncated response).

use super::families::{Family, ThinkMarkers};
use super::{ReasoningDelta, ReasoningOptions, ReasoningParser};
use crate::scan::{self, Found};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Opening,
    Reasoning,
    Content,
}

/// A parser for one family (see the module docs).
#[derive(Debug)]
pub(crate) struct MarkerParser {
    /// `None`: passthrough, everything is content.
    markers: Option<ThinkMarkers>,
    /// What ends reasoning: the end marker first (dropped), then the
    /// tool-call markers (kept as content; none when the option is off),
    /// searched for together in one pass.
    exits: Vec<&'static str>,
    phase: Phase,
    /// In reasoning, nothing but whitespace seen yet: a start marker here is
    /// the model repeating the prompt's, and is dropped.
    start_still_droppable: bool,
    /// Text held back: a possible partial marker at the end of what came.
    pending: String,
    /// The end marker was just seen and no answer text yet: leading
    /// whitespace is dropped.
    after_end: bool,
}

impl MarkerParser {
    pub(crate) fn new(family: &'static Family, options: ReasoningOptions) -> Self {
        let phase = match family.markers {
            None => Phase::Content,
            Some(_) if family.always_thinks || options.starts_in_reasoning => Phase::Reasoning,
            Some(_) => Phase::Opening,
        };
        let tool_markers = if options.tool_call_ends_reasoning {
            family.tool_markers
        } else {
            &[]
        };
        let exits = family
            .markers
            .iter()
            .map(|markers| markers.end)
            .chain(tool_markers.iter().copied())
            .collect();
        Self {
            markers: family.markers,
            exits,
            phase,
            start_still_droppable: phase == Phase::Reasoning,
            pending: String::new(),
            after_end: false,
        }
    }

    /// Moves as much of `pending` into `out` as is decided.
    fn drain(&mut self, out: &mut ReasoningDelta) {
        loop {
            match self.phase {
                Phase::Content => {
                    if self.after_end {
                        let answer = self.pending.trim_start().len();
                        self.pending.drain(..self.pending.len() - answer);
                        if self.pending.is_empty() {
                            return;
                        }
                        self.after_end = false;
                    }
                    out.content.push_str(&self.pending);
                    self.pending.clear();
                    return;
                }
                Phase::Opening => {
                    let Some(markers) = self.markers else {
                        self.phase = Phase::Content;
                        continue;
                    };
                    match leading_marker(&self.pending, markers.start) {
                        Leading::Found { whitespace } => {
                            out.content.push_str(&self.pending[..whitespace]);
                            self.pending.drain(..whitespace + markers.start.len());
                            self.phase = Phase::Reasoning;
                            self.start_still_droppable = false;
                        }
                        Leading::Undecided { whitespace } => {
                            out.content.push_str(&self.pending[..whitespace]);
                            self.pending.drain(..whitespace);
                            return;
                        }
                        Leading::Absent => self.phase = Phase::Content,
                    }
                }
                Phase::Reasoning => {
                    let Some(markers) = self.markers else {
                        self.phase = Phase::Content;
                        continue;
                    };
                    if self.start_still_droppable {
                        match leading_marker(&self.pending, markers.start) {
                            Leading::Found { whitespace } => {
                                out.reasoning.push_str(&self.pending[..whitespace]);
                                self.pending.drain(..whitespace + markers.start.len());
                                self.start_still_droppable = false;
                            }
                            Leading::Undecided { whitespace } => {
                                out.reasoning.push_str(&self.pending[..whitespace]);
                                self.pending.drain(..whitespace);
                                return;
                            }
                            Leading::Absent => self.start_still_droppable = false,
                        }
                        continue;
                    }
                    match scan::find(&self.pending, &self.exits) {
                        Found::Marker { at, index } => {
                            out.reasoning.push_str(&self.pending[..at]);
                            if index == 0 {
                                // The end marker: dropped.
                                self.pending.drain(..at + markers.end.len());
                                self.after_end = true;
                            } else {
                                // A tool-call marker: the first content.
                                self.pending.drain(..at);
                            }
                            self.phase = Phase::Content;
                        }
                        Found::Prefix { at } => {
                            out.reasoning.push_str(&self.pending[..at]);
                            self.pending.drain(..at);
                            return;
                        }
                        Found::Nothing => {
                            out.reasoning.push_str(&self.pending);
                            self.pending.clear();
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// Where a marker stands at the start of a buffer, after leading whitespace.
enum Leading {
    /// The marker follows `whitespace` bytes of whitespace.
    Found { whitespace: usize },
    /// After `whitespace` bytes of whitespace the buffer is empty or a proper
    /// prefix of the marker: more text will tell.
    Undecided { whitespace: usize },
    /// Something else comes first.
    Absent,
}

fn leading_marker(buffer: &str, marker: &str) -> Leading {
    let rest = buffer.trim_start();
    let whitespace = buffer.len() - rest.len();
    if rest.starts_with(marker) {
        Leading::Found { whitespace }
    } else if marker.starts_with(rest) {
        Leading::Undecided { whitespace }
    } else {
        Leading::Absent
    }
}

impl ReasoningParser for MarkerParser {
    fn push(&mut self, chunk: &str) -> ReasoningDelta {
        let mut out = ReasoningDelta::default();
        if self.phase == Phase::Content && !self.after_end {
            // Nothing is held in the answer (`drain` leaves `pending`
            // empty there): the chunk is content as it is, copied once.
            out.content.push_str(chunk);
            return out;
        }
        self.pending.push_str(chunk);
        self.drain(&mut out);
        out
    }

    fn finish(&mut self) -> ReasoningDelta {
        let mut out = ReasoningDelta::default();
        self.drain(&mut out);
        let rest = std::mem::take(&mut self.pending);
        match self.phase {
            Phase::Reasoning => out.reasoning.push_str(&rest),
            Phase::Opening | Phase::Content => out.content.push_str(&rest),
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the parser holds back of `buffer` while looking for `marker`.
    fn partial_suffix_len(buffer: &str, marker: &str) -> usize {
        match scan::find(buffer, &[marker]) {
            Found::Prefix { at } => buffer.len() - at,
            Found::Marker { .. } | Found::Nothing => 0,
        }
    }

    #[test]
    fn a_partial_marker_is_held_back_only_as_a_suffix_at_a_character_boundary() {
        assert_eq!(partial_suffix_len("abc</thi", "</think>"), 5);
        assert_eq!(partial_suffix_len("abc<", "</think>"), 1);
        assert_eq!(partial_suffix_len("</think", "</think>"), 7);
        // A whole marker is not a partial one.
        assert_eq!(partial_suffix_len("x</think>", "</think>"), 0);
        assert_eq!(partial_suffix_len("abc", "</think>"), 0);
        assert_eq!(partial_suffix_len("", "</think>"), 0);
        let kimi_end = "\u{25c1}/think\u{25b7}";
        assert_eq!(
            partial_suffix_len("é\u{25c1}/th", kimi_end),
            "\u{25c1}/th".len()
        );
        assert_eq!(partial_suffix_len("\u{25c1}", kimi_end), "\u{25c1}".len());
    }
}
