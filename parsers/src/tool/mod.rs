//! Tool-call parsers (filled in by the tool-call parser work).
