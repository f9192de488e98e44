//! An HTTP/1 request head watched as its bytes arrive, before hyper reads
//! them: where it ends, which route its request line names, and whether it
//! is over what the gateway reads.
//!
//! Why it exists: hyper refuses a head it will not read (one still going at
//! the end of its read buffer, one with more header fields than it has
//! slots for, a request target over 64 KiB) by answering 431 or 414 itself,
//! without a body, and has no hook to answer otherwise. A client then
//! cannot parse the refusal, and an Anthropic client gets no Anthropic
//! error. So the listener (`api::listener`) feeds each HTTP/1 head through a
//! [`HeadScan`] on its way to hyper. The scan stops a head at hyper's bounds
//! or before them, and keeps the start of its request line, so the listener
//! answers the refusal itself: `431 headers_too_large` as JSON in the
//! dialect of the route the request line names. Heads within the bounds go
//! on to hyper untouched; past `--max-header-size` (but within twice it)
//! they are refused by `api::limits` with the route already known.
//!
//! The same reading of a request line names the route of a connection
//! refused at the connection cap ([`dialect_of_head_start`]).
//!
//! What it does not see: bytes that arrive while a request is in flight
//! are not scanned (the listener watches heads only between requests), so
//! a pipelined head sent before the previous response ended is bounded by
//! hyper alone, and may still get hyper's bodiless 431.

use super::dialect::ErrorDialect;
use crate::error::{Error, ErrorCode, bytes_text};

/// The most header fields a request head may have: hyper's own count of
/// header slots, set on the listener's builder so the two agree.
pub(crate) const MAX_HEAD_FIELDS: usize = 100;

/// The longest request target hyper reads (longer ones it answers 414).
const MAX_TARGET_BYTES: usize = u16::MAX as usize - 1;

/// How much of the request line is kept to find its route: the method, a
/// space and the target's first bytes, enough to tell `/v1/messages` from
/// every other route (also in the absolute form `http://host/v1/messages`).
pub(crate) const REQUEST_LINE_KEPT: usize = 256;

/// Why a head was refused before hyper saw all of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overflow {
    /// This many bytes arrived (twice `--max-header-size`) and the head
    /// had not ended: hyper's read buffer would have refused it.
    Bytes(usize),
    /// A header field past [`MAX_HEAD_FIELDS`] began.
    Fields,
    /// The request target is longer than hyper reads.
    Target,
}

impl Overflow {
    /// The refusal, naming what limits it; `max_header_bytes` is
    /// `--max-header-size`.
    pub(super) fn error(self, max_header_bytes: usize) -> Error {
        let message = match self {
            Overflow::Bytes(cap) => format!(
                "the request line and headers take more than {cap} bytes, over \
                 --max-header-size ({})",
                bytes_text(max_header_bytes as u64)
            ),
            Overflow::Fields => format!(
                "the request has more than {MAX_HEAD_FIELDS} header fields, the most the gateway \
                 reads"
            ),
            Overflow::Target => format!(
                "the request target is longer than {MAX_TARGET_BYTES} bytes, the most the \
                 gateway reads"
            ),
        };
        Error::new(ErrorCode::HeadersTooLarge, message)
    }
}

/// Where a head's scan is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scan {
    /// The head has not ended.
    Reading,
    /// The head ended within the bounds: hyper reads it.
    Ended,
    /// The head is refused.
    Refused(Overflow),
}

/// One HTTP/1 request head's bytes, scanned as they arrive.
#[derive(Debug, Clone)]
pub(crate) struct HeadScan {
    /// The bytes a head may take without ending.
    cap: usize,
    state: Scan,
    /// Bytes of this head so far (empty lines before it not counted, as
    /// hyper skips them).
    seen: usize,
    /// Still in the request line.
    in_request_line: bool,
    /// Spaces seen in the request line (the target follows the first).
    spaces: u8,
    /// Bytes of the request target so far.
    target: usize,
    /// Header fields begun.
    fields: usize,
    /// The last byte ended a line (a line that is empty ends the head).
    at_line_start: bool,
    /// The request line's first bytes.
    kept: [u8; REQUEST_LINE_KEPT],
    kept_len: usize,
}

impl HeadScan {
    /// A scan whose heads may take up to `cap` bytes without ending.
    pub(super) fn new(cap: usize) -> Self {
        Self {
            cap,
            state: Scan::Reading,
            seen: 0,
            in_request_line: true,
            spaces: 0,
            target: 0,
            fields: 0,
            at_line_start: false,
            kept: [0; REQUEST_LINE_KEPT],
            kept_len: 0,
        }
    }

    /// A new head begins.
    pub(super) fn restart(&mut self) {
        *self = Self::new(self.cap);
    }

    /// Where the scan is.
    pub(super) fn state(&self) -> Scan {
        self.state
    }

    /// Reads the head's next bytes (bytes after its end are not looked
    /// at). Returns where the scan is. Line ends are found with `memchr`;
    /// only the request line is looked at byte by byte.
    pub(super) fn feed(&mut self, bytes: &[u8]) -> Scan {
        let mut rest = bytes;
        while self.state == Scan::Reading && !rest.is_empty() {
            if self.seen == 0 {
                // Empty lines before the request line, skipped as hyper does.
                let blank = rest
                    .iter()
                    .position(|b| !matches!(b, b'\r' | b'\n'))
                    .unwrap_or(rest.len());
                rest = &rest[blank..];
                if rest.is_empty() {
                    break;
                }
            }
            if self.in_request_line {
                let end = memchr::memchr(b'\n', rest);
                let line = &rest[..end.unwrap_or(rest.len())];
                for &byte in line {
                    self.seen += 1;
                    self.request_line(byte);
                    if self.state != Scan::Reading {
                        return self.state;
                    }
                }
                rest = &rest[line.len()..];
                if end.is_some() {
                    self.seen += 1;
                    self.request_line(b'\n');
                    rest = &rest[1..];
                }
                continue;
            }
            if self.at_line_start {
                self.seen += 1;
                let byte = rest[0];
                rest = &rest[1..];
                match byte {
                    b'\n' => self.state = Scan::Ended,
                    b'\r' => {}
                    _ => {
                        self.at_line_start = false;
                        self.fields += 1;
                        if self.fields > MAX_HEAD_FIELDS {
                            self.state = Scan::Refused(Overflow::Fields);
                        }
                    }
                }
                continue;
            }
            // Inside a header field: on to its line's end.
            match memchr::memchr(b'\n', rest) {
                Some(at) => {
                    self.seen += at + 1;
                    rest = &rest[at + 1..];
                    self.at_line_start = true;
                }
                None => {
                    self.seen += rest.len();
                    rest = &[];
                }
            }
        }
        if self.state == Scan::Reading && self.seen >= self.cap {
            self.state = Scan::Refused(Overflow::Bytes(self.cap));
        }
        self.state
    }

    /// One byte of the request line.
    fn request_line(&mut self, byte: u8) {
        match byte {
            b'\n' => {
                self.in_request_line = false;
                self.at_line_start = true;
                return;
            }
            b'\r' => return,
            b' ' => self.spaces = self.spaces.saturating_add(1),
            _ if self.spaces == 1 => {
                self.target += 1;
                if self.target > MAX_TARGET_BYTES {
                    self.state = Scan::Refused(Overflow::Target);
                }
            }
            _ => {}
        }
        if self.kept_len < REQUEST_LINE_KEPT {
            self.kept[self.kept_len] = byte;
            self.kept_len += 1;
        }
    }

    /// The dialect of the route the request line names (OpenAI's when it
    /// names none).
    pub(super) fn dialect(&self) -> ErrorDialect {
        dialect_of_head_start(&self.kept[..self.kept_len])
    }
}

/// The dialect of the route named by the request line at the start of
/// `head` (its first bytes are enough): Anthropic's for `/v1/messages`,
/// OpenAI's for every other route and for bytes that name none.
pub(crate) fn dialect_of_head_start(head: &[u8]) -> ErrorDialect {
    let start = head
        .iter()
        .position(|b| !matches!(b, b'\r' | b'\n'))
        .unwrap_or(head.len());
    let line = &head[start..];
    let line = line
        .iter()
        .position(|b| matches!(b, b'\r' | b'\n'))
        .map_or(line, |end| &line[..end]);
    let mut words = line.split(|&b| b == b' ').filter(|word| !word.is_empty());
    let _method = words.next();
    let Some(target) = words.next().and_then(|word| std::str::from_utf8(word).ok()) else {
        return ErrorDialect::OpenAi;
    };
    // Origin form (`/v1/messages?x`) or absolute form (`http://h/v1/messages`).
    let path = if target.starts_with('/') {
        target
    } else if let Some((_, rest)) = target.split_once("://") {
        rest.find('/').map_or("/", |at| &rest[at..])
    } else {
        return ErrorDialect::OpenAi;
    };
    let path = path.split(['?', '#']).next().unwrap_or(path);
    ErrorDialect::of_path(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(cap: usize, pieces: &[&[u8]]) -> (Scan, HeadScan) {
        let mut scan = HeadScan::new(cap);
        let mut state = scan.state();
        for piece in pieces {
            state = scan.feed(piece);
        }
        (state, scan)
    }

    #[test]
    fn a_head_ends_at_its_empty_line_however_it_is_cut() {
        let head = b"POST /v1/messages HTTP/1.1\r\nhost: smg\r\nx-a: b\r\n\r\n{\"body\": 1}";
        for cut in 0..head.len() {
            let (state, scan) = scan(4096, &[&head[..cut], &head[cut..]]);
            assert_eq!(state, Scan::Ended, "cut at {cut}");
            assert_eq!(scan.dialect(), ErrorDialect::Anthropic, "cut at {cut}");
        }
        // Bare line feeds end lines too, and empty lines before the
        // request line are skipped (as hyper does).
        let (state, scan) = scan(4096, &[b"\r\n\r\nGET /x HTTP/1.1\nhost: smg\n\n"]);
        assert_eq!(state, Scan::Ended);
        assert_eq!(scan.dialect(), ErrorDialect::OpenAi);
    }

    #[test]
    fn a_head_still_going_at_the_cap_is_refused_one_that_ends_is_not() {
        let mut head = b"GET /liveness HTTP/1.1\r\nx-filler: ".to_vec();
        head.extend(std::iter::repeat_n(b'a', 200));
        let (state, _) = scan(100, &[&head[..60], &head[60..]]);
        assert_eq!(state, Scan::Refused(Overflow::Bytes(100)));
        // Its end in the same read: hyper reads it whole (and
        // `api::limits` judges its size with the route known).
        head.extend_from_slice(b"\r\n\r\n");
        let (state, _) = scan(100, &[&head]);
        assert_eq!(state, Scan::Ended);
        // Bytes after the end are the body's, not the head's.
        head.extend(std::iter::repeat_n(b'b', 1000));
        let (state, scan) = scan(4096, &[&head]);
        assert_eq!(state, Scan::Ended);
        assert_eq!(scan.seen, head.len() - 1000);
    }

    #[test]
    fn the_field_past_the_most_is_refused_when_it_begins() {
        let mut head = b"POST /v1/messages HTTP/1.1\r\n".to_vec();
        for n in 0..MAX_HEAD_FIELDS {
            head.extend_from_slice(format!("x-{n}: v\r\n").as_bytes());
        }
        let (state, _) = scan(1 << 20, &[&head, b"\r\n"]);
        assert_eq!(state, Scan::Ended, "{MAX_HEAD_FIELDS} fields are read");
        let (state, scan) = scan(1 << 20, &[&head, b"x"]);
        assert_eq!(state, Scan::Refused(Overflow::Fields));
        assert_eq!(scan.dialect(), ErrorDialect::Anthropic);
    }

    #[test]
    fn a_target_longer_than_hyper_reads_is_refused() {
        let mut head = b"GET /".to_vec();
        head.extend(std::iter::repeat_n(b'a', MAX_TARGET_BYTES - 1));
        let (state, _) = scan(1 << 20, &[&head, b" HTTP/1.1\r\n\r\n"]);
        assert_eq!(state, Scan::Ended, "a target of {MAX_TARGET_BYTES} bytes");
        let (state, _) = scan(1 << 20, &[&head, b"a"]);
        assert_eq!(state, Scan::Refused(Overflow::Target));
    }

    #[test]
    fn a_restarted_scan_reads_the_next_head() {
        let (_, mut scan) = scan(4096, &[b"POST /v1/messages HTTP/1.1\r\n\r\n"]);
        scan.restart();
        assert_eq!(scan.feed(b"GET /health HTTP/1.1\r\n"), Scan::Reading);
        assert_eq!(scan.dialect(), ErrorDialect::OpenAi);
    }

    #[test]
    fn the_route_of_a_request_line() {
        for (line, dialect) in [
            (
                &b"POST /v1/messages HTTP/1.1\r\n"[..],
                ErrorDialect::Anthropic,
            ),
            (
                b"POST /v1/messages?beta=1 HTTP/1.1",
                ErrorDialect::Anthropic,
            ),
            (b"POST /v1/messages/count_tokens", ErrorDialect::Anthropic),
            (
                b"POST http://gw:30000/v1/messages HTTP/1.1",
                ErrorDialect::Anthropic,
            ),
            (b"\r\nPOST /v1/messages HTTP/1.1", ErrorDialect::Anthropic),
            (b"POST /v1/messagesx HTTP/1.1", ErrorDialect::OpenAi),
            (b"POST /v1/chat/completions HTTP/1.1", ErrorDialect::OpenAi),
            (b"PRI * HTTP/2.0\r\n\r\nSM", ErrorDialect::OpenAi),
            (b"POST", ErrorDialect::OpenAi),
            (b"", ErrorDialect::OpenAi),
            (b"\xff\xfe /v1/messages", ErrorDialect::Anthropic),
            (b"GET \xff/v1/messages", ErrorDialect::OpenAi),
        ] {
            assert_eq!(
                dialect_of_head_start(line),
                dialect,
                "{:?}",
                String::from_utf8_lossy(line)
            );
        }
    }

    #[test]
    fn refusals_name_what_limits_them() {
        let err = Overflow::Bytes(8192).error(4096);
        assert_eq!(err.code, ErrorCode::HeadersTooLarge);
        assert!(err.message.contains("8192 bytes"), "{}", err.message);
        assert!(
            err.message.contains("--max-header-size (4 KiB)"),
            "{}",
            err.message
        );
        assert!(
            Overflow::Fields
                .error(4096)
                .message
                .contains("100 header fields")
        );
        assert!(Overflow::Target.error(4096).message.contains("65534 bytes"));
    }
}
