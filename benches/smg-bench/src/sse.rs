//! An incremental Server-Sent Events parser over raw bytes.
//!
//! Bytes arrive in arbitrary pieces (a frame may hold half an event or ten of
//! them). Lines end in `\n` or `\r\n`; `data:` lines accumulate (joined with
//! `\n`) until a blank line dispatches the event; comments (`:`) and other
//! fields (`event:`, `id:`, `retry:`) are skipped, since OpenAI-style streams
//! carry everything in `data`. Only the tail of an unfinished line is ever
//! copied between pieces.

#[derive(Debug, Default)]
pub struct SseParser {
    /// An unfinished line carried over from the previous piece.
    partial: Vec<u8>,
    /// `data` of the event being assembled.
    data: Vec<u8>,
    has_data: bool,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one piece; calls `on_event` with each completed event's data.
    pub fn feed(&mut self, mut piece: &[u8], on_event: &mut impl FnMut(&[u8])) {
        if !self.partial.is_empty() {
            match memchr::memchr(b'\n', piece) {
                None => {
                    self.partial.extend_from_slice(piece);
                    return;
                }
                Some(end) => {
                    let mut line = std::mem::take(&mut self.partial);
                    line.extend_from_slice(&piece[..end]);
                    self.line(&line, on_event);
                    line.clear();
                    self.partial = line;
                    piece = &piece[end + 1..];
                }
            }
        }
        while let Some(end) = memchr::memchr(b'\n', piece) {
            self.line(&piece[..end], on_event);
            piece = &piece[end + 1..];
        }
        self.partial.extend_from_slice(piece);
    }

    /// Ends the stream: an event without its closing blank line is still
    /// delivered (servers that omit it are common enough).
    pub fn finish(&mut self, on_event: &mut impl FnMut(&[u8])) {
        if !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            self.line(&line, on_event);
        }
        self.dispatch(on_event);
    }

    fn line(&mut self, line: &[u8], on_event: &mut impl FnMut(&[u8])) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            self.dispatch(on_event);
            return;
        }
        if let Some(value) = line.strip_prefix(b"data:") {
            let value = value.strip_prefix(b" ").unwrap_or(value);
            if self.has_data {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(value);
            self.has_data = true;
        }
    }

    fn dispatch(&mut self, on_event: &mut impl FnMut(&[u8])) {
        if self.has_data {
            on_event(&self.data);
            self.data.clear();
            self.has_data = false;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn events_of(pieces: &[&[u8]]) -> Vec<String> {
        let mut parser = SseParser::new();
        let mut out = Vec::new();
        let mut push = |d: &[u8]| out.push(String::from_utf8(d.to_vec()).unwrap());
        for p in pieces {
            parser.feed(p, &mut push);
        }
        parser.finish(&mut push);
        out
    }

    #[test]
    fn events_split_anywhere_come_out_whole() {
        let stream =
            b"data: {\"a\":1}\n\n: comment\nevent: x\ndata: {\"b\":2}\r\n\r\ndata: [DONE]\n\n";
        let expected = vec!["{\"a\":1}", "{\"b\":2}", "[DONE]"];
        assert_eq!(events_of(&[stream]), expected);
        for cut in 1..stream.len() {
            assert_eq!(
                events_of(&[&stream[..cut], &stream[cut..]]),
                expected,
                "cut {cut}"
            );
        }
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(events_of(&bytes), expected);
    }

    #[test]
    fn multi_line_data_joins_and_a_missing_final_blank_line_still_dispatches() {
        assert_eq!(events_of(&[b"data: a\ndata:b\n\n"]), vec!["a\nb"]);
        assert_eq!(events_of(&[b"data: [DONE]"]), vec!["[DONE]"]);
        assert_eq!(
            events_of(&[b"\n\n: only comments\n\n"]),
            Vec::<String>::new()
        );
    }
}
