//! The two Python behaviours chat templates lean on that minijinja does not
//! provide: `transformers`' `tojson` filter, which is Python's `json.dumps`,
//! and its `strftime_now` global, which is `datetime.strftime`.
//!
//! minijinja's own `tojson` escapes `<`, `>`, `&` and `'` for HTML and uses
//! serde's number formatting; Python's does neither, and tool definitions in
//! prompts must match what the model was trained on byte for byte.

use std::fmt::{self, Write as _};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Enumerator, Kwargs, Object, ObjectRepr, Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// `x | tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False)`:
/// `json.dumps` with those arguments, as `transformers` defines the filter.
pub(super) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    // `tool | tojson`, as templates write it for every tool of every
    // request: the dump made when the tool set was first seen, shared.
    if kwargs.args().next().is_none()
        && let Some(dumped) = value.downcast_object_ref::<DumpedMap>()
    {
        return Ok(dumped.dumped.clone());
    }
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let indent = kwargs
        .get::<Option<Value>>("indent")?
        .map(|indent| indent_unit(&indent))
        .transpose()?;
    let separators = kwargs.get::<Option<Vec<String>>>("separators")?;
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    kwargs.assert_all_used()?;

    // Python's defaults: no trailing space before a newline when indenting.
    let (item_separator, key_separator) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson separators must be (item_separator, key_separator)",
            ));
        }
        None if indent.is_some() => (",".to_owned(), DEFAULT_KEY_SEPARATOR.to_owned()),
        None => (
            DEFAULT_ITEM_SEPARATOR.to_owned(),
            DEFAULT_KEY_SEPARATOR.to_owned(),
        ),
    };
    let mut writer = JsonWriter {
        ensure_ascii,
        indent,
        item_separator,
        key_separator,
        sort_keys,
        out: String::new(),
    };
    writer.write_value(value, 0)?;
    Ok(Value::from(writer.out))
}

/// `json.dumps(value)` with every argument at its default.
fn dumps(value: &Value) -> Result<String, Error> {
    let mut writer = JsonWriter {
        ensure_ascii: false,
        indent: None,
        item_separator: DEFAULT_ITEM_SEPARATOR.to_owned(),
        key_separator: DEFAULT_KEY_SEPARATOR.to_owned(),
        sort_keys: false,
        out: String::new(),
    };
    writer.write_value(value, 0)?;
    Ok(writer.out)
}

const DEFAULT_ITEM_SEPARATOR: &str = ", ";
const DEFAULT_KEY_SEPARATOR: &str = ": ";

/// A mapping that carries its own `tojson` text (default arguments),
/// written once when the mapping is made: tool schemas, which templates
/// dump on every request and which repeat across requests. To a template
/// it is the mapping it wraps (lookups, iteration, `items()`, `length`,
/// printing); only [`tojson`] looks inside, and only with default arguments
/// (any other spelling walks the mapping as usual).
#[derive(Debug)]
pub(super) struct DumpedMap {
    map: Value,
    keys: Vec<Value>,
    /// Its `json.dumps` text, as a template string (shared, not copied,
    /// when handed out).
    dumped: Value,
}

impl DumpedMap {
    /// `value` with its dump attached, or `value` itself when it is not a
    /// mapping (or cannot be dumped, which `tojson` then reports).
    pub(super) fn wrap(value: Value) -> Value {
        if value.kind() != ValueKind::Map {
            return value;
        }
        let (Ok(keys), Ok(dumped)) = (value.try_iter(), dumps(&value)) else {
            return value;
        };
        let keys = keys.collect();
        Value::from_object(Self {
            map: value,
            keys,
            dumped: Value::from(dumped),
        })
    }
}

impl Object for DumpedMap {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.map
            .get_item(key)
            .ok()
            .filter(|value| !value.is_undefined())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.keys.clone())
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.keys.len())
    }

    fn render(self: &Arc<Self>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.map, f)
    }
}

/// Python accepts an indent as a count of spaces or as the string to repeat.
fn indent_unit(indent: &Value) -> Result<String, Error> {
    if let Some(unit) = indent.as_str() {
        return Ok(unit.to_owned());
    }
    match indent.as_i64() {
        Some(spaces) => Ok(" ".repeat(usize::try_from(spaces).unwrap_or(0))),
        None => Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson indent must be an integer or a string",
        )),
    }
}

struct JsonWriter {
    ensure_ascii: bool,
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
    out: String,
}

impl JsonWriter {
    /// Whether this writer spells JSON as `json.dumps` does by default.
    fn writes_defaults(&self) -> bool {
        !self.ensure_ascii
            && self.indent.is_none()
            && !self.sort_keys
            && self.item_separator == DEFAULT_ITEM_SEPARATOR
            && self.key_separator == DEFAULT_KEY_SEPARATOR
    }

    fn write_value(&mut self, value: &Value, depth: usize) -> Result<(), Error> {
        if let Some(dumped) = value.downcast_object_ref::<DumpedMap>()
            && self.writes_defaults()
        {
            self.out
                .push_str(dumped.dumped.as_str().unwrap_or_default());
            return Ok(());
        }
        match value.kind() {
            ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self
                .out
                .push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => self.out.push_str(&number_text(value)?),
            ValueKind::String => {
                let text = value.as_str().unwrap_or_default();
                self.write_string(text);
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.write_container('[', ']', items.len(), depth, |writer, index| {
                    writer.write_value(&items[index], depth + 1)
                })?;
            }
            ValueKind::Map => {
                let mut entries = Vec::new();
                for key in value.try_iter()? {
                    let item = value.get_item(&key)?;
                    entries.push((key_text(&key)?, item));
                }
                if self.sort_keys {
                    entries.sort_by(|(a, _), (b, _)| a.cmp(b));
                }
                self.write_container('{', '}', entries.len(), depth, |writer, index| {
                    let (key, item) = &entries[index];
                    writer.write_string(key);
                    writer.out.push_str(&writer.key_separator);
                    writer.write_value(item, depth + 1)
                })?;
            }
            // Undefined, bytes, plain objects: Python's json.dumps refuses them too.
            _ => return Err(not_serializable(value)),
        }
        Ok(())
    }

    /// Writes `open`, the items (each via `write_item`) and `close`, with
    /// Python's layout: `[]` when empty, one item per line when indenting.
    fn write_container(
        &mut self,
        open: char,
        close: char,
        len: usize,
        depth: usize,
        mut write_item: impl FnMut(&mut Self, usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        self.out.push(open);
        if len == 0 {
            self.out.push(close);
            return Ok(());
        }
        let item_indent = self.indent.as_ref().map(|unit| unit.repeat(depth + 1));
        for index in 0..len {
            if index > 0 {
                self.out.push_str(&self.item_separator);
            }
            if let Some(item_indent) = &item_indent {
                self.out.push('\n');
                self.out.push_str(item_indent);
            }
            write_item(self, index)?;
        }
        if let Some(unit) = &self.indent {
            self.out.push('\n');
            self.out.push_str(&unit.repeat(depth));
        }
        self.out.push(close);
        Ok(())
    }

    fn write_string(&mut self, text: &str) {
        self.out.push('"');
        for character in text.chars() {
            match character {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{08}' => self.out.push_str("\\b"),
                '\u{0c}' => self.out.push_str("\\f"),
                ' '..='~' => self.out.push(character),
                _ if (character as u32) < 0x20 || self.ensure_ascii => {
                    let mut units = [0u16; 2];
                    for unit in character.encode_utf16(&mut units) {
                        // Writing to a String cannot fail.
                        let _ = write!(self.out, "\\u{unit:04x}");
                    }
                }
                _ => self.out.push(character),
            }
        }
        self.out.push('"');
    }
}

/// Python converts non-string keys: numbers and literals to their JSON text.
fn key_text(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_owned()),
        ValueKind::None => Ok("null".to_owned()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_owned()),
        ValueKind::Number => number_text(key),
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "keys must be str, int, float, bool or None, not {}",
                key.kind()
            ),
        )),
    }
}

fn number_text(value: &Value) -> Result<String, Error> {
    if value.is_integer() {
        return Ok(i128::try_from(value.clone())?.to_string());
    }
    Ok(python_float_repr(f64::try_from(value.clone())?))
}

/// Python's `repr(float)`: the shortest digits that round-trip, in plain
/// notation for exponents -4..16 (always with a fractional part) and as
/// `1e+16` / `1e-05` outside it. `json.dumps` writes non-finite values as
/// `NaN` and `Infinity`.
fn python_float_repr(number: f64) -> String {
    if number.is_nan() {
        return "NaN".to_owned();
    }
    if number.is_infinite() {
        return if number > 0.0 {
            "Infinity"
        } else {
            "-Infinity"
        }
        .to_owned();
    }
    // Rust's `{:e}` gives the same shortest round-trip digits, e.g. "-1.25e-7".
    let scientific = format!("{number:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(unsigned) => ("-", unsigned),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();

    if !(-4..16).contains(&exponent) {
        let (first, rest) = digits.split_at(1);
        let fraction = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let exponent_sign = if exponent < 0 { '-' } else { '+' };
        return format!(
            "{sign}{first}{fraction}e{exponent_sign}{:02}",
            exponent.unsigned_abs()
        );
    }
    // The decimal point sits `exponent + 1` digits into `digits`.
    let point = exponent + 1;
    let plain = if point <= 0 {
        let zeros = "0".repeat(point.unsigned_abs() as usize);
        format!("0.{zeros}{digits}")
    } else {
        let point = point as usize;
        if digits.len() <= point {
            format!("{digits}{}.0", "0".repeat(point - digits.len()))
        } else {
            format!("{}.{}", &digits[..point], &digits[point..])
        }
    };
    format!("{sign}{plain}")
}

fn not_serializable(value: &Value) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("Object of type {} is not JSON serializable", value.kind()),
    )
}

/// `strftime_now(format)`: the current time formatted like Python's
/// `datetime.now().strftime(format)`, in UTC.
pub(super) fn strftime_now(format: &str) -> Result<String, Error> {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|_| Error::new(ErrorKind::InvalidOperation, "the clock is before 1970"))?;
    Ok(format_utc(format, since_epoch.as_secs()))
}

const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// A UTC calendar time. Months, days and weekdays count from 0 here.
struct CalendarTime {
    year: u64,
    month: usize,
    day_of_month: u64,
    day_of_year: u64,
    weekday: usize,
    hour: u64,
    minute: u64,
    second: u64,
}

impl CalendarTime {
    fn from_unix_seconds(seconds: u64) -> Self {
        const SECONDS_PER_DAY: u64 = 86_400;
        let mut days = seconds / SECONDS_PER_DAY;
        let time_of_day = seconds % SECONDS_PER_DAY;
        // 1970-01-01 was a Thursday.
        let weekday = ((days + 3) % 7) as usize;
        let mut year = 1970;
        while days >= days_in_year(year) {
            days -= days_in_year(year);
            year += 1;
        }
        let day_of_year = days;
        let mut month = 0;
        while days >= days_in_month(year, month) {
            days -= days_in_month(year, month);
            month += 1;
        }
        Self {
            year,
            month,
            day_of_month: days,
            day_of_year,
            weekday,
            hour: time_of_day / 3600,
            minute: time_of_day % 3600 / 60,
            second: time_of_day % 60,
        }
    }
}

fn is_leap_year(year: u64) -> bool {
    (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400)
}

fn days_in_year(year: u64) -> u64 {
    if is_leap_year(year) { 366 } else { 365 }
}

fn days_in_month(year: u64, month: usize) -> u64 {
    match month {
        1 if is_leap_year(year) => 29,
        1 => 28,
        3 | 5 | 8 | 10 => 30,
        _ => 31,
    }
}

/// The C89 `strftime` directives Python documents; anything else is copied
/// through unchanged.
fn format_utc(format: &str, unix_seconds: u64) -> String {
    let time = CalendarTime::from_unix_seconds(unix_seconds);
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(character) = chars.next() {
        if character != '%' {
            out.push(character);
            continue;
        }
        let Some(directive) = chars.next() else {
            out.push('%');
            break;
        };
        let hour12 = match time.hour % 12 {
            0 => 12,
            hour => hour,
        };
        // Writing to a String cannot fail.
        let _ = match directive {
            'Y' => write!(out, "{}", time.year),
            'y' => write!(out, "{:02}", time.year % 100),
            'm' => write!(out, "{:02}", time.month + 1),
            'B' => write!(out, "{}", MONTHS[time.month]),
            'b' => write!(out, "{}", &MONTHS[time.month][..3]),
            'd' => write!(out, "{:02}", time.day_of_month + 1),
            'j' => write!(out, "{:03}", time.day_of_year + 1),
            'A' => write!(out, "{}", WEEKDAYS[time.weekday]),
            'a' => write!(out, "{}", &WEEKDAYS[time.weekday][..3]),
            'H' => write!(out, "{:02}", time.hour),
            'I' => write!(out, "{hour12:02}"),
            'p' => write!(out, "{}", if time.hour < 12 { "AM" } else { "PM" }),
            'M' => write!(out, "{:02}", time.minute),
            'S' => write!(out, "{:02}", time.second),
            '%' => write!(out, "%"),
            other => write!(out, "%{other}"),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use minijinja::value::Serde;
    use serde_json::json;

    #[test]
    fn floats_are_written_as_python_repr() {
        // Expected values typed from CPython's json.dumps.
        let cases = [
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (0.0001, "0.0001"),
            (1e-5, "1e-05"),
            (1.5, "1.5"),
            (-0.0, "-0.0"),
            (123_456_789.125, "123456789.125"),
            (1e300, "1e+300"),
            (2.5e-10, "2.5e-10"),
            (-3.0, "-3.0"),
            (0.1, "0.1"),
            (f64::INFINITY, "Infinity"),
            (f64::NAN, "NaN"),
        ];
        for (number, expected) in cases {
            assert_eq!(python_float_repr(number), expected, "{number:e}");
        }
    }

    /// Renders `template` with the filter installed and `x` bound to `value`.
    fn render(template: &str, value: serde_json::Value) -> Result<String, Error> {
        let mut environment = minijinja::Environment::new();
        environment.add_filter("tojson", tojson);
        environment.render_str(template, minijinja::context! { x => Serde(value) })
    }

    #[test]
    fn strings_escape_like_python() {
        let text = json!("tab\t \"q\" \\ \u{1} \u{7f} é 😀 <&>");
        let keep_unicode = render("{{ x | tojson }}", text.clone()).expect("serializes");
        assert_eq!(
            keep_unicode,
            "\"tab\\t \\\"q\\\" \\\\ \\u0001 \u{7f} é 😀 <&>\""
        );
        let ascii = render("{{ x | tojson(ensure_ascii=true) }}", text).expect("serializes");
        assert_eq!(
            ascii,
            r#""tab\t \"q\" \\ \u0001 \u007f \u00e9 \ud83d\ude00 <&>""#
        );
    }

    #[test]
    fn nested_values_with_python_default_separators() {
        let value = json!({"a": [1, -2, 0.5, null, false], "b": {}, "c": "x"});
        let compact = render("{{ x | tojson }}", value.clone()).expect("serializes");
        assert_eq!(
            compact,
            r#"{"a": [1, -2, 0.5, null, false], "b": {}, "c": "x"}"#
        );
        let explicit_none = render("{{ x | tojson(indent=none) }}", value).expect("serializes");
        assert_eq!(explicit_none, compact);
        let zero_indent =
            render("{{ x | tojson(indent=0) }}", json!([1, [2]])).expect("serializes");
        assert_eq!(zero_indent, "[\n1,\n[\n2\n]\n]");
    }

    #[test]
    fn custom_separators_and_string_indent() {
        let text = render(
            "{{ x | tojson(separators=[',', ':'], indent='\t') }}",
            json!({"a": [1, 2]}),
        )
        .expect("serializes");
        assert_eq!(text, "{\n\t\"a\":[\n\t\t1,\n\t\t2\n\t]\n}");
    }

    #[test]
    fn template_built_maps_keep_their_order_and_non_string_keys_convert() {
        let text = render(
            "{{ {'z': 1, 'a': 2, 3: 'three', none: 0} | tojson }}",
            json!(null),
        )
        .expect("serializes");
        assert_eq!(text, r#"{"z": 1, "a": 2, "3": "three", "null": 0}"#);
    }

    #[test]
    fn undefined_is_not_serializable() {
        let err = render("{{ missing | tojson }}", json!(null)).expect_err("undefined");
        assert!(err.to_string().contains("not JSON serializable"), "{err}");
    }

    #[test]
    fn unknown_keyword_is_refused() {
        render("{{ x | tojson(indnet=2) }}", json!(1))
            .expect_err("a misspelt keyword must not pass silently");
    }

    #[test]
    fn utc_times_format_like_python_strftime() {
        // Expected values typed from CPython's datetime.utcfromtimestamp(...).strftime(...).
        assert_eq!(
            format_utc(
                "%Y-%m-%d %H:%M:%S %a %A %b %B %j %I %p %y %%",
                1_709_211_909
            ),
            "2024-02-29 13:05:09 Thu Thursday Feb February 060 01 PM 24 %"
        );
        assert_eq!(
            format_utc("%d %b %Y %a %j %I %p", 0),
            "01 Jan 1970 Thu 001 12 AM"
        );
        assert_eq!(
            format_utc("%d %b %Y %a %j", 4_102_444_800),
            "01 Jan 2100 Fri 001"
        );
        assert_eq!(format_utc("%Q and %", 0), "%Q and %");
    }

    /// Every use chat templates make of a tool renders the same whether the
    /// tool is the plain mapping or carries its dump.
    #[test]
    fn a_dumped_map_reads_like_the_mapping_it_wraps() {
        let tool = json!({"type": "function", "function": {
            "name": "get_weather", "description": "Météo <du> jour",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string"}, "days": {"type": "integer", "maximum": 1.5e16}},
                "required": ["city"]}}});
        let template = "{% for tool in tools %}{{ tool | tojson }}|{{ tool.function.name }}|\
            {{ tool['type'] }}|{{ tool | length }}|{{ 'function' in tool }}|{{ tool is mapping }}|\
            {% for key, value in tool.items() %}{{ key }}={{ value | tojson }};{% endfor %}|\
            {% for key in tool.function.parameters.properties %}{{ key }},{% endfor %}|\
            {{ tool | tojson(indent=2) }}|{{ tool | tojson(sort_keys=true) }}|\
            {{ tool | tojson(ensure_ascii=true) }}|{{ tool.missing is defined }}|\
            {{ tool.function.parameters.properties.days.maximum }}{% endfor %}|\
            {{ tools | tojson }}|{{ tools | tojson(separators=(',', ':')) }}";
        let mut environment = minijinja::Environment::new();
        environment.add_filter("tojson", tojson);
        environment
            .set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        let render = |tools: Vec<Value>| {
            environment
                .render_str(template, minijinja::context! { tools => tools })
                .expect("renders")
        };
        let plain = Value::from(Serde(&tool));
        let dumped = DumpedMap::wrap(plain.clone());
        assert!(dumped.downcast_object_ref::<DumpedMap>().is_some());
        let expected = render(vec![plain]);
        assert!(
            expected
                .starts_with("{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"")
        );
        assert_eq!(render(vec![dumped]), expected);
    }

    #[test]
    fn only_mappings_are_wrapped() {
        for value in [json!([1, 2]), json!("text"), json!(3)] {
            let wrapped = DumpedMap::wrap(Value::from(Serde(&value)));
            assert!(
                wrapped.downcast_object_ref::<DumpedMap>().is_none(),
                "{value}"
            );
        }
    }
}
