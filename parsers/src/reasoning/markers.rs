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
//! held-back `◁/thi` never splits a character.
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
    /// Markers that end reasoning and stay in the content (empty when the
    /// option is off).
    tool_markers: &'static [&'static str],
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
        Self {
            markers: family.markers,
            tool_markers: if options.tool_call_ends_reasoning {
                family.tool_markers
            } else {
                &[]
            },
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
                    match self.first_exit(markers.end) {
                        Some(Exit::End(at)) => {
                            out.reasoning.push_str(&self.pending[..at]);
                            self.pending.drain(..at + markers.end.len());
                            self.phase = Phase::Content;
                            self.after_end = true;
                        }
                        Some(Exit::ToolCall(at)) => {
                            out.reasoning.push_str(&self.pending[..at]);
                            self.pending.drain(..at);
                            self.phase = Phase::Content;
                        }
                        None => {
                            let held = self.partial_exit_len(markers.end);
                            let send = self.pending.len() - held;
                            out.reasoning.push_str(&self.pending[..send]);
                            self.pending.drain(..send);
                            return;
                        }
                    }
                }
            }
        }
    }

    /// The earliest complete end or tool-call marker in `pending`.
    fn first_exit(&self, end: &str) -> Option<Exit> {
        let mut first = self.pending.find(end).map(Exit::End);
        for marker in self.tool_markers {
            if let Some(at) = self.pending.find(marker)
                && first.is_none_or(|exit| at < exit.at())
            {
                first = Some(Exit::ToolCall(at));
            }
        }
        first
    }

    /// The length of the longest suffix of `pending` that is a proper prefix
    /// of the end marker or of a tool-call marker.
    fn partial_exit_len(&self, end: &str) -> usize {
        std::iter::once(&end)
            .chain(self.tool_markers)
            .map(|marker| partial_suffix_len(&self.pending, marker))
            .max()
            .unwrap_or(0)
    }
}

#[derive(Debug, Clone, Copy)]
enum Exit {
    /// The end marker at this byte offset: dropped.
    End(usize),
    /// A tool-call marker at this byte offset: kept as content.
    ToolCall(usize),
}

impl Exit {
    fn at(self) -> usize {
        match self {
            Exit::End(at) | Exit::ToolCall(at) => at,
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

/// The length of the longest suffix of `buffer`, starting at a character
/// boundary, that is a proper prefix of `marker` (0 if none).
pub(crate) fn partial_suffix_len(buffer: &str, marker: &str) -> usize {
    let longest = marker.len().saturating_sub(1).min(buffer.len());
    (1..=longest)
        .rev()
        .find(|&len| {
            let start = buffer.len() - len;
            buffer.is_char_boundary(start) && marker.starts_with(&buffer[start..])
        })
        .unwrap_or(0)
}

impl ReasoningParser for MarkerParser {
    fn push(&mut self, chunk: &str) -> ReasoningDelta {
        self.pending.push_str(chunk);
        let mut out = ReasoningDelta::default();
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
