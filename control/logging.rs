//! Where and how the gateway logs: stderr, text or JSON lines, coloured
//! only for a person at a terminal.
//!
//! Why it exists: log lines go to journald, container logs and files far
//! more often than to a terminal, and ANSI colour codes there are noise
//! that breaks `grep` and log parsers. `--log-color auto` (the default)
//! colours only when stderr is a terminal and `NO_COLOR` is unset;
//! `always` and `never` decide regardless.

use std::io::IsTerminal;
use std::str::FromStr;

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

/// Installs the global subscriber: `level` is a `tracing` filter
/// (`RUST_LOG`, when set, wins), `json` writes JSON lines. Call once, first
/// thing. (The gateway's `config::LogConfig` carries the three.)
pub fn init(level: &str, json: bool, color: LogColor) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty());
    let ansi = color.colours(std::io::stderr().is_terminal(), no_color);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    if json {
        builder.json().init();
    } else {
        builder.init();
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
}
