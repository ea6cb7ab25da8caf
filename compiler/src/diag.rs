//! Diagnostics: located errors about a spec, a configuration, a checkpoint or a profile.
//!
//! Every stage of the compiler reports through `Diagnostic` (a file, a byte span and a
//! message) and hands back all it found as `Diagnostics`, sorted by position. Line and column
//! are computed from the source text the span points into, once, when a diagnostic is made.
//! This module must not decide what is an error; it only says where and prints it.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};

/// A byte range in a source text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

impl Span {
    pub fn new(start: usize, end: usize) -> Span {
        Span { start, end }
    }
}

/// One error, located.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Diagnostic {
    pub file: PathBuf,
    /// 1-based line; 0 when the error has no position in a file (a whole-file problem).
    pub line: usize,
    /// 1-based column in characters; 0 with `line` 0.
    pub column: usize,
    pub message: String,
}

impl Diagnostic {
    /// A diagnostic at `span` of `source` (the text of `file`).
    pub fn at(file: &Path, source: &str, span: Span, message: impl Into<String>) -> Diagnostic {
        let (line, column) = line_column(source, span.start);
        Diagnostic { file: file.to_path_buf(), line, column, message: message.into() }
    }

    /// A diagnostic about a file as a whole (it could not be read, it lacks a section).
    pub fn whole(file: &Path, message: impl Into<String>) -> Diagnostic {
        Diagnostic { file: file.to_path_buf(), line: 0, column: 0, message: message.into() }
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: error: {}", self.file.display(), self.message)
        } else {
            write!(f, "{}:{}:{}: error: {}", self.file.display(), self.line, self.column, self.message)
        }
    }
}

/// 1-based line and column (in characters) of byte `offset` of `source`.
pub fn line_column(source: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(source.len());
    let before = &source[..floor_char_boundary(source, offset)];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map(|p| p + 1).unwrap_or(0);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// All the errors a stage found, in file and position order. Never empty when returned as an error.
/// An error pushed twice is kept once (a set lookup, so a stage may report thousands).
#[derive(Clone, Debug, Default, thiserror::Error)]
pub struct Diagnostics(pub Vec<Diagnostic>, HashSet<Diagnostic>);

impl PartialEq for Diagnostics {
    fn eq(&self, other: &Diagnostics) -> bool {
        self.0 == other.0
    }
}

impl Eq for Diagnostics {}

impl Diagnostics {
    pub fn new() -> Diagnostics {
        Diagnostics::default()
    }
    pub fn one(d: Diagnostic) -> Diagnostics {
        let mut all = Diagnostics::new();
        all.push(d);
        all
    }
    pub fn push(&mut self, d: Diagnostic) {
        if self.1.insert(d.clone()) {
            self.0.push(d);
        }
    }
    pub fn extend(&mut self, other: Diagnostics) {
        for d in other.0 {
            self.push(d);
        }
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn iter(&self) -> impl Iterator<Item = &Diagnostic> {
        self.0.iter()
    }
    /// Sorts by file, line and column (stable: same-position errors keep their order).
    pub fn sorted(mut self) -> Diagnostics {
        self.0.sort_by(|a, b| (&a.file, a.line, a.column).cmp(&(&b.file, b.line, b.column)));
        self
    }
    /// `Ok(value)` when nothing was reported, else the sorted diagnostics.
    pub fn into_result<T>(self, value: T) -> Result<T, Diagnostics> {
        if self.is_empty() {
            Ok(value)
        } else {
            Err(self.sorted())
        }
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column_count_characters() {
        let s = "ab\ncé d\n";
        assert_eq!(line_column(s, 0), (1, 1));
        assert_eq!(line_column(s, 3), (2, 1));
        // 'é' is two bytes; the space after it is the third character of line 2.
        assert_eq!(line_column(s, 6), (2, 3));
    }

    #[test]
    fn a_diagnostic_pushed_twice_is_kept_once_and_many_push_in_linear_time() {
        let mut d = Diagnostics::new();
        let e = |i: usize| Diagnostic::whole(Path::new("x.ron"), format!("error {i}"));
        d.push(e(1));
        d.push(e(1));
        assert_eq!(d.len(), 1);
        // 200,000 distinct errors: a scan of the earlier ones per push would take minutes.
        for i in 0..200_000 {
            d.push(e(i));
        }
        assert_eq!(d.len(), 200_000);
    }
}
