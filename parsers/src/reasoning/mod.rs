//! Reasoning parsers (filled in by the reasoning parser work).
