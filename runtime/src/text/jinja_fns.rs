//! The helpers transformers adds to its Jinja environment for chat templates, re-made for
//! minijinja: `raise_exception(msg)`, `strftime_now(format)` and a `tojson` filter that writes
//! what Python's `json.dumps` writes (`", "` and `": "` separators, no HTML escaping, Python's
//! float spelling, `indent`/`sort_keys`/`ensure_ascii`/`separators` keywords), and an output
//! formatter that prints values as Jinja2 does (Python's `str`: `None`, `True`, `['a', 1.0]`).
//!
//! These are pure functions of their arguments (and, for `strftime_now`, of the UTC clock);
//! they never panic on odd values and never reach outside the process.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Output, State, Value};

/// `raise_exception(message)`: fails the render with `message`.
pub(crate) fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// Writes `{{ value }}` the way Jinja2 does: strings as they are, undefined as nothing,
/// everything else as Python's `str()` would.
pub(crate) fn py_formatter(out: &mut Output, _state: &State, value: &Value) -> Result<(), Error> {
    let text = match value.kind() {
        ValueKind::Undefined => return Ok(()),
        ValueKind::String => return out.write_str(value.as_str().unwrap_or_default()).map_err(write_err),
        _ => {
            let mut s = String::new();
            py_repr(value, 0, &mut s)?;
            s
        }
    };
    out.write_str(&text).map_err(write_err)
}

fn write_err(e: std::fmt::Error) -> Error {
    Error::new(ErrorKind::WriteFailure, "cannot write template output").with_source(e)
}

/// Python's `repr()` of a value (what `str()` of a list or dict shows for its items).
fn py_repr(v: &Value, depth: usize, out: &mut String) -> Result<(), Error> {
    if depth > 256 {
        return Err(Error::new(ErrorKind::InvalidOperation, "value nested too deeply to print"));
    }
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number if v.is_integer() => out.push_str(&v.to_string()),
        ValueKind::Number => out.push_str(&py_float(f64::try_from(v.clone()).unwrap_or(f64::NAN))),
        ValueKind::String if depth == 0 => out.push_str(v.as_str().unwrap_or_default()),
        ValueKind::String => py_str_repr(v.as_str().unwrap_or_default(), out),
        ValueKind::Seq => {
            out.push('[');
            for (i, item) in v.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr(&item, depth + 1, out)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, k) in v.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr(&k, depth + 1, out)?;
                out.push_str(": ");
                py_repr(&v.get_item(&k)?, depth + 1, out)?;
            }
            out.push('}');
        }
        _ => out.push_str(&v.to_string()),
    }
    Ok(())
}

/// Python's `repr()` of a string: single quotes unless only double quotes avoid escaping.
fn py_str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// `strftime_now(format)`: the current UTC time, formatted like C's `strftime` (the common
/// conversions: `%Y %y %m %d %e %H %I %M %S %p %b %B %a %A %j %%`, and `%-d`-style unpadded
/// numbers). Unknown conversions are copied through.
pub(crate) fn strftime_now(format: String) -> String {
    let secs =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    strftime(&format, secs)
}

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
const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

/// Days since 1970-01-01 to (year, month 1-12, day 1-31), proleptic Gregorian.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    // Shift to a calendar whose years start on March 1st, in 400-year eras of 146097 days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

pub(crate) fn strftime(format: &str, unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let sod = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (sod / 3600, sod % 3600 / 60, sod % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[month as usize - 1] + day as i64 + i64::from(month > 2 && is_leap(year));
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };

    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let unpadded = chars.peek() == Some(&'-');
        if unpadded {
            chars.next();
        }
        let num = |n: i64, width: usize| if unpadded { n.to_string() } else { format!("{n:0width$}") };
        match chars.next() {
            Some('Y') => out += &year.to_string(),
            Some('y') => out += &num(year.rem_euclid(100), 2),
            Some('m') => out += &num(month as i64, 2),
            Some('d') => out += &num(day as i64, 2),
            Some('e') => out += &format!("{day:>2}"),
            Some('H') => out += &num(hour, 2),
            Some('I') => out += &num(hour12, 2),
            Some('M') => out += &num(minute, 2),
            Some('S') => out += &num(second, 2),
            Some('j') => out += &num(yday, 3),
            Some('p') => out += if hour < 12 { "AM" } else { "PM" },
            Some('B') => out += MONTHS[month as usize - 1],
            Some('b') | Some('h') => out += &MONTHS[month as usize - 1][..3],
            Some('A') => out += DAYS[weekday],
            Some('a') => out += &DAYS[weekday][..3],
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Options of Python's `json.dumps` that templates pass to `tojson`.
struct JsonOpts {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

/// The `tojson` filter, as transformers defines it (Python's `json.dumps`).
pub(crate) fn tojson(value: Value, kwargs: Kwargs) -> Result<String, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_i64() {
            Some(n) => " ".repeat(n.clamp(0, 64) as usize),
            None => v.as_str().map(str::to_string).unwrap_or_default(),
        }),
    };
    let (mut item_sep, mut key_sep) = (if indent.is_some() { "," } else { ", " }.to_string(), ": ".to_string());
    if let Some(seps) = kwargs.get::<Option<Value>>("separators")?.filter(|v| !v.is_none()) {
        let parts: Vec<Value> = seps.try_iter()?.collect();
        if let [a, b] = &parts[..] {
            item_sep = a.as_str().unwrap_or(",").to_string();
            key_sep = b.as_str().unwrap_or(":").to_string();
        } else {
            return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be a pair"));
        }
    }
    let opts = JsonOpts {
        indent,
        item_sep,
        key_sep,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    dump(&value, &opts, 0, &mut out)?;
    Ok(out)
}

fn newline(opts: &JsonOpts, depth: usize, out: &mut String) {
    if let Some(ind) = &opts.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(ind);
        }
    }
}

fn dump(v: &Value, opts: &JsonOpts, depth: usize, out: &mut String) -> Result<(), Error> {
    if depth > 256 {
        return Err(Error::new(ErrorKind::InvalidOperation, "tojson: value nested too deeply"));
    }
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number if v.is_integer() => out.push_str(&v.to_string()),
        ValueKind::Number => out.push_str(&py_float(f64::try_from(v.clone()).unwrap_or(f64::NAN))),
        ValueKind::String | ValueKind::Plain | ValueKind::Bytes | ValueKind::Invalid => {
            json_string(&v.to_string(), opts.ensure_ascii, out)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline(opts, depth + 1, out);
                dump(item, opts, depth + 1, out)?;
            }
            newline(opts, depth, out);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if opts.sort_keys {
                keys.sort();
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline(opts, depth + 1, out);
                let key = match k.kind() {
                    ValueKind::String => k.to_string(),
                    ValueKind::None => "null".into(),
                    ValueKind::Bool => if k.is_true() { "true" } else { "false" }.into(),
                    ValueKind::Number if !k.is_integer() => py_float(f64::try_from(k.clone()).unwrap_or(f64::NAN)),
                    _ => k.to_string(),
                };
                json_string(&key, opts.ensure_ascii, out);
                out.push_str(&opts.key_sep);
                dump(&v.get_item(k)?, opts, depth + 1, out)?;
            }
            newline(opts, depth, out);
            out.push('}');
        }
        _ => json_string(&v.to_string(), opts.ensure_ascii, out),
    }
    Ok(())
}

fn json_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && !c.is_ascii() => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)` (which `json.dumps` uses): shortest round-trip digits, positional
/// for exponents -4..16, otherwise `d.ddde+XX`.
pub(crate) fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sci = format!("{:e}", f.abs());
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mant.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if f.is_sign_negative() { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let body = if exp < 0 {
            format!("0.{}{}", "0".repeat((-exp - 1) as usize), digits)
        } else {
            let point = exp as usize + 1;
            if digits.len() > point {
                format!("{}.{}", &digits[..point], &digits[point..])
            } else {
                format!("{}{}.0", digits, "0".repeat(point - digits.len()))
            }
        };
        format!("{sign}{body}")
    } else {
        format!("{sign}{mant}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_floats() {
        for (f, s) in [
            (1.0, "1.0"),
            (2.5, "2.5"),
            (0.1, "0.1"),
            (-0.0, "-0.0"),
            (1e16, "1e+16"),
            (1.5e-7, "1.5e-07"),
            (123456789.125, "123456789.125"),
            (0.0001, "0.0001"),
            (1e-5, "1e-05"),
            (1234.5e20, "1.2345e+23"),
            (f64::INFINITY, "Infinity"),
        ] {
            assert_eq!(py_float(f), s, "{f}");
        }
    }

    #[test]
    fn dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", t), "2024-02-29 13:05:09");
        assert_eq!(
            strftime("%d %b %Y, %A %a %B %j %I%p %-d/%-m %y %% %Q", t),
            "29 Feb 2024, Thursday Thu February 060 01PM 29/2 24 % %Q"
        );
        assert_eq!(strftime("%Y-%m-%d", 0), "1970-01-01");
        assert_eq!(strftime("%Y-%m-%d %a", -86_400), "1969-12-31 Wed");
        assert_eq!(strftime("%Y-%m-%d", 4_102_444_800), "2100-01-01");
    }
}
