//! Tool-parser fixtures, one module per format, each run through the
//! split-invariance harness in `tool_common`.

mod tool_common;

#[path = "tool_parsers/json_family.rs"]
mod json_family;

#[path = "tool_parsers/xml_family.rs"]
mod xml_family;

#[path = "tool_parsers/pythonic.rs"]
mod pythonic;

#[path = "tool_parsers/cut_off.rs"]
mod cut_off;
