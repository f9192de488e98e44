//! The state every tool parser shares: the text not yet consumed, the call in
//! progress, and the [`ToolDelta`] being built for the current push.
//!
//! Why it exists: the rules that make parsers agree with each other live here
//! once instead of in each format. Markers are found with [`Stream::scan_text`]
//! (one `memchr` pass, see [`crate::scan`]), which holds back a chunk-final
//! prefix of a marker (on a UTF-8 boundary);
//! a call is opened with [`Stream::begin_call`], named with
//! [`Stream::commit_name`] (which applies the unknown-name policy), fed with
//! [`Stream::args`] and closed with [`Stream::end_call`] or
//! [`Stream::fail_call`] (which gives an uncommitted call's text back as
//! content). A grammar only decides *what* the text means.
//!
//! The text of a call is kept from its first byte until its name is accepted,
//! so that a call that never becomes valid can be returned verbatim; that
//! retained text is bounded by [`MAX_HELD_BYTES`].
//!
//! The buffers (the text, the argument output, the delta's content) keep
//! their capacity for the parser's life: a push hands out exact copies of
//! what it produced, one allocation each, instead of giving its buffers away
//! and growing new ones through 8, 16, 32… bytes on the next push.

use std::mem;

use super::{CallDelta, ToolDelta, Tools};
use crate::scan::{self, Found};

/// The most text a parser holds for one call before its name is accepted
/// (64 KiB). A call whose name has not been accepted within this many bytes is
/// malformed: its text so far is returned as content.
pub const MAX_HELD_BYTES: usize = 64 * 1024;

/// The longest function name accepted (bytes).
pub(crate) const MAX_NAME_BYTES: usize = 256;

/// The text buffer's first capacity: a typical call's text, so the buffer
/// does not regrow while the first call streams.
const INITIAL_BUF_BYTES: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CallStatus {
    /// Name not accepted yet: everything since `raw_start` is held.
    Pending,
    /// Name sent with this index; arguments stream.
    Committed(usize),
    /// The name is not one of the request's tools: the call's text goes to
    /// content as it is consumed.
    Rejected,
}

#[derive(Debug)]
struct OpenCall {
    raw_start: usize,
    /// Where the call's text starts if it is cut off: `raw_start`, or the
    /// opener of the calls section it is the first call of.
    cut_start: usize,
    status: CallStatus,
}

/// Result of looking for markers in free text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scan {
    /// Marker `n` starts at the current position (not consumed).
    Marker(usize),
    /// No complete marker: the text before any possible partial marker was
    /// sent as content.
    NeedMore,
}

/// Result of expecting a literal at the current position ([`peek`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Eat {
    Yes,
    /// The text so far is a proper prefix of the literal.
    Partial,
    No,
}

#[derive(Debug)]
pub(crate) struct Stream {
    buf: String,
    pos: usize,
    tools: Tools,
    delta: ToolDelta,
    next_index: usize,
    call: Option<OpenCall>,
    /// Where an open calls section's opener starts, until its first call
    /// claims it (or text between them is sent).
    section_start: Option<usize>,
    /// Canonical argument text of the current call not yet put in `delta`.
    pub(crate) args: String,
}

impl Stream {
    pub(crate) fn new(tools: Tools) -> Self {
        Self {
            buf: String::with_capacity(INITIAL_BUF_BYTES),
            pos: 0,
            tools,
            delta: ToolDelta::default(),
            next_index: 0,
            call: None,
            section_start: None,
            args: String::new(),
        }
    }

    pub(crate) fn tools(&self) -> &Tools {
        &self.tools
    }

    pub(crate) fn append(&mut self, chunk: &str) {
        self.buf.push_str(chunk);
    }

    /// The unconsumed text.
    pub(crate) fn rest(&self) -> &str {
        self.buf.get(self.pos..).unwrap_or("")
    }

    /// The unconsumed text and the argument output, borrowed together.
    pub(crate) fn rest_and_args(&mut self) -> (&str, &mut String) {
        (self.buf.get(self.pos..).unwrap_or(""), &mut self.args)
    }

    /// Consumes `n` bytes (a char boundary). A rejected call's text goes to
    /// content as it is consumed.
    pub(crate) fn consume(&mut self, n: usize) {
        let end = (self.pos + n).min(self.buf.len());
        if let Some(OpenCall {
            status: CallStatus::Rejected,
            ..
        }) = self.call
        {
            self.delta.content.push_str(&self.buf[self.pos..end]);
        }
        self.pos = end;
    }

    /// Sends `n` bytes of free text as content.
    pub(crate) fn content(&mut self, n: usize) {
        if n > 0 {
            self.section_start = None;
        }
        let end = (self.pos + n).min(self.buf.len());
        self.delta.content.push_str(&self.buf[self.pos..end]);
        self.pos = end;
    }

    /// Consumes leading whitespace.
    pub(crate) fn skip_whitespace(&mut self) {
        let rest = self.rest();
        let n = rest.len() - rest.trim_start().len();
        self.consume(n);
    }

    /// Sends free text as content up to the first of `markers`. With
    /// `at_end`, nothing is held back.
    pub(crate) fn scan_text(&mut self, markers: &[&str], at_end: bool) -> Scan {
        let rest = self.rest();
        match scan::find(rest, markers) {
            Found::Marker { at, index } => {
                self.content(at);
                Scan::Marker(index)
            }
            Found::Prefix { at } if !at_end => {
                self.content(at);
                Scan::NeedMore
            }
            Found::Prefix { .. } | Found::Nothing => {
                self.content(rest.len());
                Scan::NeedMore
            }
        }
    }

    /// Where the text up to the first of `terminators` ends, if one is in
    /// sight: `Ok(Some((len, terminator)))`; `Ok(None)` when more text is
    /// needed; `Err(())` when none appears within `max` bytes.
    pub(crate) fn find_within(
        &self,
        terminators: &[&str],
        max: usize,
    ) -> Result<Option<(usize, usize)>, ()> {
        let rest = self.rest();
        match scan::find(rest, terminators) {
            Found::Marker { at, index } if at <= max => Ok(Some((at, index))),
            Found::Marker { .. } => Err(()),
            Found::Prefix { .. } | Found::Nothing
                if rest.len() > max + terminators.iter().map(|t| t.len()).max().unwrap_or(0) =>
            {
                Err(())
            }
            Found::Prefix { .. } | Found::Nothing => Ok(None),
        }
    }

    /// A calls section's opener starts at the current position.
    pub(crate) fn open_section(&mut self) {
        self.section_start = Some(self.pos);
    }

    /// A call starts at the current position.
    pub(crate) fn begin_call(&mut self) {
        self.args.clear();
        self.call = Some(OpenCall {
            raw_start: self.pos,
            cut_start: self.section_start.take().unwrap_or(self.pos),
            status: CallStatus::Pending,
        });
    }

    /// A call is open and not rejected.
    pub(crate) fn call_in_progress(&self) -> bool {
        matches!(&self.call, Some(call) if call.status != CallStatus::Rejected)
    }

    /// The text ended inside the open call ([`ToolParser::finish_cut`]):
    /// everything from the call's start to the end of the text is content,
    /// and a committed call is withdrawn.
    ///
    /// [`ToolParser::finish_cut`]: super::ToolParser::finish_cut
    pub(crate) fn cut_off(&mut self) {
        let Some(call) = self.call.take() else {
            return;
        };
        if let CallStatus::Committed(index) = call.status {
            self.delta.calls.retain(|c| c.index != index);
            self.delta.cut_call = Some(index);
        }
        if call.status != CallStatus::Rejected {
            self.delta
                .content
                .push_str(self.buf.get(call.cut_start..).unwrap_or(""));
        }
        self.pos = self.buf.len();
        self.args.clear();
        self.section_start = None;
    }

    /// The call's name is complete. Returns false when the call is rejected
    /// (its name is not among the request's tools): its text so far goes to
    /// content, and so does the rest of it as it is consumed.
    pub(crate) fn commit_name(&mut self, name: &str) -> bool {
        let known = self.tools.is_empty() || self.tools.iter().any(|t| t.name == name);
        let Some(call) = self.call.as_mut() else {
            return false;
        };
        if call.status != CallStatus::Pending {
            return call.status != CallStatus::Rejected;
        }
        if !known {
            call.status = CallStatus::Rejected;
            let raw = &self.buf[call.raw_start..self.pos];
            self.delta.content.push_str(raw);
            self.args.clear();
            return false;
        }
        let index = self.next_index;
        self.next_index += 1;
        call.status = CallStatus::Committed(index);
        self.delta.calls.push(CallDelta {
            index,
            name: Some(name.to_owned()),
            arguments: take_copy(&mut self.args),
            content_before: self.delta.content.len(),
        });
        true
    }

    /// The current call was committed (its name and arguments were sent).
    pub(crate) fn call_committed(&self) -> bool {
        matches!(
            self.call,
            Some(OpenCall {
                status: CallStatus::Committed(_),
                ..
            })
        )
    }

    /// Bytes that can still be consumed before [`Stream::over_cap`] trips
    /// (unbounded unless a pending call is held).
    pub(crate) fn held_allowance(&self) -> usize {
        match &self.call {
            Some(call) if call.status == CallStatus::Pending => {
                MAX_HELD_BYTES.saturating_sub(self.pos - call.raw_start)
            }
            _ => usize::MAX,
        }
    }

    /// A pending call holds more than [`MAX_HELD_BYTES`].
    pub(crate) fn over_cap(&self) -> bool {
        match &self.call {
            Some(call) if call.status == CallStatus::Pending => {
                self.pos - call.raw_start > MAX_HELD_BYTES
            }
            _ => false,
        }
    }

    /// The current call ended well.
    pub(crate) fn end_call(&mut self) {
        self.flush_args();
        self.call = None;
    }

    /// The current call cannot continue at the current position. A pending
    /// call's text is returned as content; a committed call keeps what was
    /// sent (the grammar has closed its arguments).
    pub(crate) fn fail_call(&mut self) {
        if let Some(call) = &self.call
            && call.status == CallStatus::Pending
        {
            let raw = &self.buf[call.raw_start..self.pos];
            self.delta.content.push_str(raw);
            self.args.clear();
        }
        self.flush_args();
        self.call = None;
    }

    fn flush_args(&mut self) {
        match self.call.as_ref().map(|c| c.status) {
            Some(CallStatus::Pending) => return,
            Some(CallStatus::Committed(index)) if !self.args.is_empty() => {
                match self.delta.calls.last_mut() {
                    Some(last) if last.index == index => last.arguments.push_str(&self.args),
                    _ => self.delta.calls.push(CallDelta {
                        index,
                        name: None,
                        arguments: self.args.clone(),
                        content_before: self.delta.content.len(),
                    }),
                }
            }
            _ => {}
        }
        self.args.clear();
    }

    /// Everything produced since the last call; drops consumed text that is
    /// no longer needed.
    pub(crate) fn take_delta(&mut self) -> ToolDelta {
        self.flush_args();
        // An open call's text is kept from its start: a pending call may
        // be given back, and any call may be cut off by the end of the text.
        let keep_from = match &self.call {
            Some(call) if call.status != CallStatus::Rejected => call.cut_start,
            _ => self.section_start.unwrap_or(self.pos),
        };
        if keep_from > 0 {
            self.buf.drain(..keep_from);
            self.pos -= keep_from;
            if let Some(call) = self.call.as_mut() {
                call.raw_start = call.raw_start.saturating_sub(keep_from);
                call.cut_start = call.cut_start.saturating_sub(keep_from);
            }
            if let Some(start) = self.section_start.as_mut() {
                *start = start.saturating_sub(keep_from);
            }
        }
        ToolDelta {
            content: take_copy(&mut self.delta.content),
            calls: mem::take(&mut self.delta.calls),
            cut_call: self.delta.cut_call.take(),
        }
    }
}

/// `buffer`'s text, copied out (one exact allocation, none when empty);
/// `buffer` is emptied and keeps its capacity.
fn take_copy(buffer: &mut String) -> String {
    let copy = buffer.as_str().to_owned();
    buffer.clear();
    copy
}

/// Whether `text` starts with `literal` ([`Eat::Yes`]), is a proper prefix
/// of it ([`Eat::Partial`]: wait for more), or neither.
pub(crate) fn peek(text: &str, literal: &str) -> Eat {
    if text.starts_with(literal) {
        Eat::Yes
    } else if literal.starts_with(text) {
        Eat::Partial
    } else {
        Eat::No
    }
}

/// A function name as a header format writes it: non-empty, bounded, no
/// whitespace, control characters, quotes or markup.
pub(crate) fn valid_name(name: &str) -> bool {
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return false;
    }
    const MARKUP: [char; 7] = ['<', '>', '"', '{', '}', '[', ']'];
    // Nearly every name is ASCII: byte by byte, where "printable and not
    // space" is exactly "neither whitespace nor a control character".
    if name.is_ascii() {
        return name
            .bytes()
            .all(|b| b.is_ascii_graphic() && !MARKUP.contains(&char::from(b)));
    }
    !name
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || MARKUP.contains(&c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ascii_name_is_judged_as_its_characters_are() {
        // Every ASCII character, alone and inside a name, against the
        // character rule the non-ASCII path applies.
        for b in 0u8..0x80 {
            let c = char::from(b);
            let expected = !(c.is_whitespace() || c.is_control() || "<>\"{}[]".contains(c));
            assert_eq!(valid_name(&c.to_string()), expected, "{b:#x}");
            assert_eq!(valid_name(&format!("get{c}weather")), expected, "{b:#x}");
            assert_eq!(valid_name(&format!("é{c}")), expected, "{b:#x} non-ASCII");
        }
        assert!(valid_name("functions.get_weather"));
        assert!(!valid_name(""));
        assert!(valid_name(&"a".repeat(MAX_NAME_BYTES)));
        assert!(!valid_name(&"a".repeat(MAX_NAME_BYTES + 1)));
        assert!(!valid_name("caf\u{a0}e"));
        assert!(!valid_name("caf\u{2028}e"));
        assert!(valid_name("café"));
    }
}
