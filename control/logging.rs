//! Where and how the gateway logs: stderr, text or JSON lines, coloured
//! only for a person at a terminal; with `--log-dir`, into a file a day as
//! well.
//!
//! Why it exists: log lines go to journald, container logs and files far
//! more often than to a terminal, and ANSI colour codes there are noise
//! that breaks `grep` and log parsers. `--log-color auto` (the default)
//! colours only when stderr is a terminal and `NO_COLOR` is unset;
//! `always` and `never` decide regardless. SMG launch scripts that give
//! `--log-dir DIR` expect the log in `DIR/smg.YYYY-MM-DD` (a new file each
//! UTC day, as SMG's daily appender names them), so [`DailyFiles`] writes
//! the same lines there too, never coloured.

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::field::{MakeVisitor, VisitFmt, VisitOutput};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::{DefaultVisitor, Writer};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// `--log-color`: when log lines carry ANSI colour codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogColor {
    /// When stderr is a terminal and `NO_COLOR` is unset.
    #[default]
    Auto,
    Always,
    Never,
}

impl FromStr for LogColor {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "auto" => Ok(LogColor::Auto),
            "always" => Ok(LogColor::Always),
            "never" => Ok(LogColor::Never),
            other => Err(format!("{other:?} is not auto, always or never")),
        }
    }
}

impl LogColor {
    /// Whether to colour, given whether stderr is a terminal and whether
    /// `NO_COLOR` is set (to anything but the empty string).
    pub fn colours(self, terminal: bool, no_color: bool) -> bool {
        match self {
            LogColor::Always => true,
            LogColor::Never => false,
            LogColor::Auto => terminal && !no_color,
        }
    }
}

/// The log files of `--log-dir`: `smg.YYYY-MM-DD` for each UTC day, opened
/// for appending on the day's first line.
#[derive(Debug)]
pub struct DailyFiles {
    dir: PathBuf,
    /// The day (since the Unix epoch) whose file is open, and the file.
    open: Mutex<Option<(u64, File)>>,
}

impl DailyFiles {
    /// Creates `dir` if need be and opens today's file, so a directory
    /// that cannot be written fails at start-up, not silently later.
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let files = Self {
            dir: dir.to_owned(),
            open: Mutex::new(None),
        };
        files.write_at(b"", SystemTime::now())?;
        Ok(files)
    }

    /// The file of the UTC day that `at` falls in.
    pub fn path_at(&self, at: SystemTime) -> PathBuf {
        let (year, month, day) = date_of_day(day_number(at));
        self.dir.join(format!("smg.{year:04}-{month:02}-{day:02}"))
    }

    /// Writes `bytes` to the file of the day `now` falls in, opening it
    /// (and closing the previous day's) when the day has changed.
    fn write_at(&self, bytes: &[u8], now: SystemTime) -> std::io::Result<usize> {
        let today = day_number(now);
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let file = match &mut *open {
            Some((day, file)) if *day == today => file,
            stale => {
                let file = File::options()
                    .create(true)
                    .append(true)
                    .open(self.path_at(now))?;
                &mut stale.insert((today, file)).1
            }
        };
        file.write(bytes)
    }
}

/// One log line's way into [`DailyFiles`].
#[derive(Debug)]
pub struct DailyWriter<'a>(&'a DailyFiles);

impl Write for DailyWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.write_at(bytes, SystemTime::now())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for DailyFiles {
    type Writer = DailyWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        DailyWriter(self)
    }
}

/// Days since the Unix epoch at `at` (UTC).
fn day_number(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs() / 86_400)
}

/// The calendar date (year, month, day) of day `days` since 1970-01-01.
/// Computed once a day, so counting whole years and months is fast enough.
fn date_of_day(mut days: u64) -> (u64, u32, u64) {
    let leap = |year: u64| {
        year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400))
    };
    let mut year = 1970;
    loop {
        let length = if leap(year) { 366 } else { 365 };
        if days < length {
            break;
        }
        days -= length;
        year += 1;
    }
    let february = if leap(year) { 29 } else { 28 };
    let mut month = 1;
    for length in [31, february, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31] {
        if days < length {
            break;
        }
        days -= length;
        month += 1;
    }
    (year, month, days + 1)
}

/// Installs the global subscriber: `level` is a `tracing` filter
/// (`RUST_LOG`, when set, wins), `json` writes JSON lines, `dir`
/// (`--log-dir`) adds [`DailyFiles`] there to stderr. Call once, first
/// thing. (The gateway's `config::LogConfig` carries the four.) Fails only
/// when `dir` cannot be created or written.
pub fn init(level: &str, json: bool, color: LogColor, dir: Option<&Path>) -> std::io::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty());
    let ansi = color.colours(std::io::stderr().is_terminal(), no_color);
    let files = dir.map(DailyFiles::open).transpose()?;
    // Each output is text or JSON: the other is `None`, a layer that does
    // nothing. (Layers of fixed types, under the filter, keep the callsites
    // the filter disables free of any check at run time.)
    let stderr_text = (!json).then(|| {
        tracing_subscriber::fmt::layer()
            .fmt_fields(PlainFields)
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
    });
    let stderr_json = json.then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
    });
    let (files_text, files_json) = match (files, json) {
        (None, _) => (None, None),
        (Some(files), false) => (
            Some(
                tracing_subscriber::fmt::layer()
                    .fmt_fields(PlainFields)
                    .with_writer(files)
                    .with_ansi(false),
            ),
            None,
        ),
        (Some(files), true) => (
            None,
            Some(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(files)
                    .with_ansi(false),
            ),
        ),
    };
    // The outputs are joined into one layer before they go on the
    // subscriber: each layer put on a subscriber separately is a level that
    // every span exit and close walks, looking for the registry, once per
    // level below it.
    let outputs = Layer::and_then(stderr_text, stderr_json)
        .and_then(files_text)
        .and_then(files_json);
    tracing_subscriber::registry()
        .with(filter)
        .with(outputs)
        .init();
    Ok(())
}

/// The text outputs' fields: exactly what `tracing_subscriber`'s
/// `DefaultFields` writes (`name=value`, space separated), but a plain
/// field without colour is written directly rather than through the
/// default visitor's ANSI styling, which costs about a thousand
/// instructions a request even with colour off (the request span's fields
/// are formatted when it is opened and when its tenant is recorded).
/// Messages, errors and everything coloured go to the default visitor, so
/// its escaping of control characters in messages still applies.
#[derive(Debug, Clone, Copy, Default)]
struct PlainFields;

impl<'w> MakeVisitor<Writer<'w>> for PlainFields {
    type Visitor = PlainVisitor<'w>;

    fn make_visitor(&self, writer: Writer<'w>) -> Self::Visitor {
        PlainVisitor {
            writer,
            is_empty: true,
            result: Ok(()),
        }
    }
}

/// [`PlainFields`]' visitor.
#[derive(Debug)]
struct PlainVisitor<'w> {
    writer: Writer<'w>,
    /// No field written yet (so none needs a space before it).
    is_empty: bool,
    result: std::fmt::Result,
}

impl PlainVisitor<'_> {
    /// The default visitor, for what this one does not write itself.
    fn default_visitor(&mut self) -> DefaultVisitor<'_> {
        let is_empty = std::mem::replace(&mut self.is_empty, false);
        DefaultVisitor::new(self.writer.by_ref(), is_empty)
    }

    /// Whether `name` is written as the default visitor writes it.
    fn delegates(&self, name: &str) -> bool {
        self.writer.has_ansi_escapes() || name == "message"
    }
}

impl Visit for PlainVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if self.result.is_err() || is_log_metadata(field) {
            return;
        }
        if self.delegates(field.name()) {
            let mut default = self.default_visitor();
            default.record_str(field, value);
            self.result = default.finish();
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        if self.result.is_err() || is_log_metadata(field) {
            return;
        }
        let mut default = self.default_visitor();
        default.record_error(field, value);
        self.result = default.finish();
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if self.result.is_err() || is_log_metadata(field) {
            return;
        }
        let name = field.name();
        if self.delegates(name) {
            let mut default = self.default_visitor();
            default.record_debug(field, value);
            self.result = default.finish();
            return;
        }
        let name = name.strip_prefix("r#").unwrap_or(name);
        let pad = if std::mem::replace(&mut self.is_empty, false) {
            ""
        } else {
            " "
        };
        self.result = write!(self.writer, "{pad}{name}={value:?}");
    }
}

/// Metadata of an event from the `log` crate, written with the event's
/// target, not as a field (the default visitor skips it too).
fn is_log_metadata(field: &Field) -> bool {
    field.name().starts_with("log.")
}

impl VisitOutput<std::fmt::Result> for PlainVisitor<'_> {
    fn finish(self) -> std::fmt::Result {
        self.result
    }
}

impl VisitFmt for PlainVisitor<'_> {
    fn writer(&mut self) -> &mut dyn std::fmt::Write {
        &mut self.writer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_for_a_terminal_unless_told() {
        // (mode, terminal, NO_COLOR) -> colours
        let table = [
            (LogColor::Auto, true, false, true),
            (LogColor::Auto, false, false, false),
            (LogColor::Auto, true, true, false),
            (LogColor::Always, false, true, true),
            (LogColor::Never, true, false, false),
        ];
        for (mode, terminal, no_color, expected) in table {
            assert_eq!(
                mode.colours(terminal, no_color),
                expected,
                "{mode:?} {terminal} {no_color}"
            );
        }
        assert_eq!("auto".parse(), Ok(LogColor::Auto));
        assert_eq!("never".parse(), Ok(LogColor::Never));
        assert!("yes".parse::<LogColor>().is_err());
    }

    /// Log lines written through `fmt_fields` as a text output writes them
    /// (no time, no colour).
    fn lines_with<N>(fields: N, colour: bool) -> String
    where
        N: for<'w> tracing_subscriber::fmt::FormatFields<'w> + Send + Sync + 'static,
    {
        #[derive(Clone, Default)]
        struct Buffer(std::sync::Arc<Mutex<Vec<u8>>>);
        impl Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .fmt_fields(fields)
                .without_time()
                .with_ansi(colour)
                .with_writer(move || writer.clone()),
        );
        tracing::subscriber::with_default(subscriber, || {
            let id = "0f3c";
            let span = tracing::info_span!(
                "request",
                request_id = %id,
                method = "POST",
                r#type = 3,
                tenant = tracing::field::Empty,
            );
            let _entered = span.enter();
            span.record("tenant", "team-a");
            let error = std::io::Error::other("no route");
            tracing::info!(status = 200, ok = true, "answered \x1b[31m in {}ms", 12);
            tracing::warn!(error = &error as &dyn std::error::Error, kind = ?"slow");
            tracing::info!(path = %"/v1/chat/completions", "with a message last");
        });
        let bytes = buffer
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        String::from_utf8(bytes).expect("utf-8")
    }

    #[test]
    fn plain_fields_write_what_the_default_fields_write() {
        for colour in [false, true] {
            let plain = lines_with(PlainFields, colour);
            let default = lines_with(
                tracing_subscriber::fmt::format::DefaultFields::new(),
                colour,
            );
            assert_eq!(plain, default, "colour {colour}");
        }
        let plain = lines_with(PlainFields, false);
        assert!(
            plain.contains("request{request_id=0f3c method=\"POST\" type=3 tenant=\"team-a\"}: "),
            "{plain}"
        );
        assert!(
            plain.contains("\\x1b[31m"),
            "messages are still escaped: {plain}"
        );
    }

    #[test]
    fn days_are_named_by_their_utc_date() {
        for (days, date) in [
            (0, (1970, 1, 1)),
            (58, (1970, 2, 28)),
            (59, (1970, 3, 1)),
            (789, (1972, 2, 29)),
            (11_016, (2000, 2, 29)),
            (11_017, (2000, 3, 1)),
            (19_722, (2023, 12, 31)),
            (19_723, (2024, 1, 1)),
            (20_819, (2027, 1, 1)),
        ] {
            assert_eq!(date_of_day(days), date, "day {days}");
        }
    }

    #[test]
    fn each_day_gets_its_own_file_and_lines_are_appended() {
        let dir = tempfile::tempdir().expect("a directory");
        let logs = dir.path().join("logs");
        let files = DailyFiles::open(&logs).expect("created");
        let day = |n: u64| UNIX_EPOCH + std::time::Duration::from_secs(n * 86_400 + 3_600);
        files.write_at(b"one\n", day(19_722)).expect("written");
        files.write_at(b"two\n", day(19_722)).expect("written");
        files.write_at(b"three\n", day(19_723)).expect("written");
        let read = |name: &str| std::fs::read_to_string(logs.join(name)).expect(name);
        assert_eq!(read("smg.2023-12-31"), "one\ntwo\n");
        assert_eq!(read("smg.2024-01-01"), "three\n");
        // Opened again (a restart), the day's file is appended to.
        let again = DailyFiles::open(&logs).expect("opened");
        again.write_at(b"four\n", day(19_723)).expect("written");
        assert_eq!(read("smg.2024-01-01"), "three\nfour\n");
        assert_eq!(files.path_at(day(19_723)), logs.join("smg.2024-01-01"));
    }

    #[test]
    fn a_log_dir_that_cannot_be_made_fails_at_once() {
        let dir = tempfile::tempdir().expect("a directory");
        let file = dir.path().join("a-file");
        std::fs::write(&file, b"").expect("written");
        assert!(DailyFiles::open(&file.join("logs")).is_err());
    }
}
