//! A reader for the subset of RON the specs and profiles use, keeping the byte span of every
//! value so that later errors can name a line and column.
//!
//! Accepted: `//` and `/* */` comments; integers (with `_`, `0x`), floats, `"strings"` with
//! escapes, `true`/`false`; `[lists]`, `{maps}`, `(tuples)`, `(field: value, ...)` structs,
//! `Ident`, `Ident(...)` enum and struct forms; trailing commas. Not accepted: raw strings,
//! chars, bytes and `#![enable]` attributes. Values nest at most `limits::RON_DEPTH` deep (the
//! reader descends recursively, and so do the readers of its `Node`s). This module must not know
//! any spec type: it produces `Node`s, and `de` turns them into types.

use crate::diag::Span;
use crate::limits;

/// A value of the file with its span.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub span: Span,
    pub kind: NodeKind,
}

#[derive(Clone, Debug, PartialEq)]
pub enum NodeKind {
    Int(i64),
    Float(f64),
    Str(String),
    Bool(bool),
    List(Vec<Node>),
    Map(Vec<(Node, Node)>),
    /// `Ident`, `Ident(...)` or `(...)`: a struct, a tuple or an enum value.
    Named {
        name: Option<(String, Span)>,
        body: Body,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub enum Body {
    /// A bare identifier: a unit variant (`Silu`, `None`).
    Unit,
    /// `(a, b)`.
    Tuple(Vec<Node>),
    /// `(key: value, ...)`; each key with its span.
    Fields(Vec<(String, Span, Node)>),
}

/// A syntax error: where and what was expected.
#[derive(Clone, Debug, PartialEq)]
pub struct SyntaxError {
    pub span: Span,
    pub message: String,
}

/// Parses one value (the whole file).
pub fn parse(src: &str) -> Result<Node, SyntaxError> {
    let mut p = Parser { src, pos: 0, depth: 0 };
    let node = p.value()?;
    p.skip_ws()?;
    if p.pos < src.len() {
        return Err(p.err_here("expected the end of the file after the value"));
    }
    Ok(node)
}

struct Parser<'a> {
    src: &'a str,
    pos: usize,
    /// Values open around the one being read.
    depth: usize,
}

impl<'a> Parser<'a> {
    fn bytes(&self) -> &'a [u8] {
        self.src.as_bytes()
    }

    fn peek(&self) -> Option<u8> {
        self.bytes().get(self.pos).copied()
    }

    fn err_here(&self, message: &str) -> SyntaxError {
        let end = (self.pos + 1).min(self.src.len());
        SyntaxError { span: Span::new(self.pos, end), message: message.to_string() }
    }

    fn skip_ws(&mut self) -> Result<(), SyntaxError> {
        loop {
            match self.peek() {
                Some(c) if c.is_ascii_whitespace() => self.pos += 1,
                Some(b'/') if self.bytes().get(self.pos + 1) == Some(&b'/') => {
                    while let Some(c) = self.peek() {
                        if c == b'\n' {
                            break;
                        }
                        self.pos += 1;
                    }
                }
                Some(b'/') if self.bytes().get(self.pos + 1) == Some(&b'*') => {
                    let start = self.pos;
                    match self.src[self.pos + 2..].find("*/") {
                        Some(off) => self.pos += 2 + off + 2,
                        None => {
                            return Err(SyntaxError {
                                span: Span::new(start, start + 2),
                                message: "unterminated block comment".into(),
                            })
                        }
                    }
                }
                _ => return Ok(()),
            }
        }
    }

    fn eat(&mut self, c: u8) -> Result<bool, SyntaxError> {
        self.skip_ws()?;
        if self.peek() == Some(c) {
            self.pos += 1;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// One value, at most `limits::RON_DEPTH` values deep.
    fn value(&mut self) -> Result<Node, SyntaxError> {
        self.skip_ws()?;
        if self.depth >= limits::RON_DEPTH.max {
            return Err(self.err_here(&format!("values nest too deep here ({})", limits::RON_DEPTH)));
        }
        self.depth += 1;
        let r = self.value_here();
        self.depth -= 1;
        r
    }

    fn value_here(&mut self) -> Result<Node, SyntaxError> {
        let start = self.pos;
        match self.peek() {
            None => Err(self.err_here("expected a value, found the end of the file")),
            Some(b'"') => {
                let s = self.string()?;
                Ok(Node { span: Span::new(start, self.pos), kind: NodeKind::Str(s) })
            }
            Some(b'[') => {
                self.pos += 1;
                let mut items = Vec::new();
                loop {
                    if self.eat(b']')? {
                        break;
                    }
                    items.push(self.value()?);
                    if !self.eat(b',')? {
                        if self.eat(b']')? {
                            break;
                        }
                        return Err(self.err_here("expected `,` or `]` in a list"));
                    }
                }
                Ok(Node { span: Span::new(start, self.pos), kind: NodeKind::List(items) })
            }
            Some(b'{') => {
                self.pos += 1;
                let mut entries = Vec::new();
                loop {
                    if self.eat(b'}')? {
                        break;
                    }
                    let k = self.value()?;
                    if !self.eat(b':')? {
                        return Err(self.err_here("expected `:` after a map key"));
                    }
                    let v = self.value()?;
                    entries.push((k, v));
                    if !self.eat(b',')? {
                        if self.eat(b'}')? {
                            break;
                        }
                        return Err(self.err_here("expected `,` or `}` in a map"));
                    }
                }
                Ok(Node { span: Span::new(start, self.pos), kind: NodeKind::Map(entries) })
            }
            Some(b'(') => {
                let body = self.paren_body()?;
                Ok(Node { span: Span::new(start, self.pos), kind: NodeKind::Named { name: None, body } })
            }
            Some(c) if c == b'-' || c == b'+' || c == b'.' || c.is_ascii_digit() => self.number(),
            Some(c) if c.is_ascii_alphabetic() || c == b'_' => {
                let ident = self.ident();
                let ident_span = Span::new(start, self.pos);
                match ident.as_str() {
                    "true" => return Ok(Node { span: ident_span, kind: NodeKind::Bool(true) }),
                    "false" => return Ok(Node { span: ident_span, kind: NodeKind::Bool(false) }),
                    _ => {}
                }
                // `Ident(` directly or after whitespace: an enum or struct with a body.
                let save = self.pos;
                self.skip_ws()?;
                let body = if self.peek() == Some(b'(') {
                    self.paren_body()?
                } else {
                    self.pos = save;
                    Body::Unit
                };
                Ok(Node {
                    span: Span::new(start, self.pos),
                    kind: NodeKind::Named { name: Some((ident, ident_span)), body },
                })
            }
            Some(_) => Err(self.err_here("expected a value (a number, a string, `[`, `{`, `(` or a name)")),
        }
    }

    fn ident(&mut self) -> String {
        let start = self.pos;
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || c == b'_' {
                self.pos += 1;
            } else {
                break;
            }
        }
        self.src[start..self.pos].to_string()
    }

    /// `( ... )`: fields when the first item is `ident :` (not `::`), else a tuple.
    fn paren_body(&mut self) -> Result<Body, SyntaxError> {
        self.pos += 1; // '('
        self.skip_ws()?;
        if self.eat(b')')? {
            return Ok(Body::Tuple(Vec::new()));
        }
        if self.looks_like_field() {
            let mut fields = Vec::new();
            loop {
                if self.eat(b')')? {
                    break;
                }
                self.skip_ws()?;
                let kstart = self.pos;
                if !matches!(self.peek(), Some(c) if c.is_ascii_alphabetic() || c == b'_') {
                    return Err(self.err_here("expected a field name"));
                }
                let key = self.ident();
                let kspan = Span::new(kstart, self.pos);
                if !self.eat(b':')? {
                    return Err(self.err_here("expected `:` after a field name"));
                }
                let v = self.value()?;
                fields.push((key, kspan, v));
                if !self.eat(b',')? {
                    if self.eat(b')')? {
                        break;
                    }
                    return Err(self.err_here("expected `,` or `)` after a field"));
                }
            }
            Ok(Body::Fields(fields))
        } else {
            let mut items = Vec::new();
            loop {
                if self.eat(b')')? {
                    break;
                }
                items.push(self.value()?);
                if !self.eat(b',')? {
                    if self.eat(b')')? {
                        break;
                    }
                    return Err(self.err_here("expected `,` or `)` in a tuple"));
                }
            }
            Ok(Body::Tuple(items))
        }
    }

    fn looks_like_field(&self) -> bool {
        let b = self.bytes();
        let mut i = self.pos;
        if !matches!(b.get(i), Some(c) if c.is_ascii_alphabetic() || *c == b'_') {
            return false;
        }
        while matches!(b.get(i), Some(c) if c.is_ascii_alphanumeric() || *c == b'_') {
            i += 1;
        }
        while matches!(b.get(i), Some(c) if c.is_ascii_whitespace()) {
            i += 1;
        }
        b.get(i) == Some(&b':') && b.get(i + 1) != Some(&b':')
    }

    fn number(&mut self) -> Result<Node, SyntaxError> {
        let start = self.pos;
        if matches!(self.peek(), Some(b'-') | Some(b'+')) {
            self.pos += 1;
        }
        let body_start = self.pos;
        let hex = self.src[self.pos..].starts_with("0x");
        if hex {
            self.pos += 2;
        }
        while let Some(c) = self.peek() {
            let more = c.is_ascii_alphanumeric()
                || c == b'_'
                || c == b'.'
                || ((c == b'-' || c == b'+') && !hex && matches!(self.bytes()[self.pos - 1], b'e' | b'E'));
            if !more {
                break;
            }
            self.pos += 1;
        }
        let span = Span::new(start, self.pos);
        let text: String = self.src[start..self.pos].chars().filter(|&c| c != '_').collect();
        let neg = text.starts_with('-');
        let body: String = self.src[body_start..self.pos].chars().filter(|&c| c != '_').collect();
        let bad = || SyntaxError { span, message: format!("`{}` is not a number", &self.src[start..span.end]) };
        if hex {
            let v = i64::from_str_radix(&body[2..], 16).map_err(|_| bad())?;
            return Ok(Node { span, kind: NodeKind::Int(if neg { -v } else { v }) });
        }
        if text.contains(['.', 'e', 'E']) || text.ends_with("inf") || text.ends_with("NaN") {
            let v: f64 = text.parse().map_err(|_| bad())?;
            Ok(Node { span, kind: NodeKind::Float(v) })
        } else {
            let v: i64 = text.parse().map_err(|_| bad())?;
            Ok(Node { span, kind: NodeKind::Int(v) })
        }
    }

    fn string(&mut self) -> Result<String, SyntaxError> {
        let start = self.pos;
        self.pos += 1; // opening quote
        let mut out = String::new();
        loop {
            let rest = &self.src[self.pos..];
            let Some(c) = rest.chars().next() else {
                return Err(SyntaxError { span: Span::new(start, start + 1), message: "unterminated string".into() });
            };
            self.pos += c.len_utf8();
            match c {
                '"' => return Ok(out),
                '\\' => {
                    let e = self.src[self.pos..].chars().next();
                    let esc_start = self.pos - 1;
                    self.pos += e.map(char::len_utf8).unwrap_or(0);
                    match e {
                        Some('n') => out.push('\n'),
                        Some('t') => out.push('\t'),
                        Some('r') => out.push('\r'),
                        Some('0') => out.push('\0'),
                        Some('\\') => out.push('\\'),
                        Some('"') => out.push('"'),
                        Some('\'') => out.push('\''),
                        _ => {
                            return Err(SyntaxError {
                                span: Span::new(esc_start, self.pos),
                                message: "unknown escape in a string (known: \\n \\t \\r \\0 \\\\ \\\")".into(),
                            })
                        }
                    }
                }
                c => out.push(c),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_nested_values_with_spans() {
        let src = "Spec(a: [1, 2.5, \"x\"], b: {\"k\": Some(Foo(x: -3))}, c: (1, true), d: None)";
        let n = parse(src).unwrap();
        let NodeKind::Named { name: Some((name, _)), body: Body::Fields(fields) } = &n.kind else { panic!() };
        assert_eq!(name, "Spec");
        assert_eq!(fields.len(), 4);
        let (_, kspan, v) = &fields[0];
        assert_eq!(&src[kspan.start..kspan.end], "a");
        let NodeKind::List(items) = &v.kind else { panic!() };
        assert_eq!(items[1].kind, NodeKind::Float(2.5));
        assert_eq!(&src[items[2].span.start..items[2].span.end], "\"x\"");
    }

    #[test]
    fn reports_position_of_a_syntax_error() {
        let src = "Spec(\n  a: [1 2],\n)";
        let e = parse(src).unwrap_err();
        assert_eq!(crate::diag::line_column(src, e.span.start), (2, 9));
    }

    #[test]
    fn nesting_past_the_limit_is_an_error_not_a_stack_overflow() {
        let ok = format!("{}{}", "[".repeat(128), "]".repeat(128));
        assert!(parse(&ok).is_ok());
        let deep = format!("{}{}", "[".repeat(20_000), "]".repeat(20_000));
        let e = parse(&deep).unwrap_err();
        assert_eq!(e.span.start, 128, "{e:?}");
        assert!(e.message.contains("values nest too deep here (at most 128 levels of nesting"), "{e:?}");
        let deep = format!("{}1{}", "Some(".repeat(500), ")".repeat(500));
        assert!(parse(&deep).is_err());
    }

    #[test]
    fn comments_are_skipped() {
        let n = parse("// hi\n[1, /* two */ 2,]").unwrap();
        assert!(matches!(n.kind, NodeKind::List(ref v) if v.len() == 2));
    }
}
