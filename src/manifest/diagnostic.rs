//! `Diagnostic`: one problem in one manifest file, located by `path:line:col`.
//!
//! Invariant: every problem the manifest stage reports has a location; whole-file problems
//! point at `1:1`. Display is exactly `path:line:col: message`, the format editors and CI
//! annotators understand.

use std::fmt;
use std::ops::Range;

/// One problem, with the file and 1-based line and column it points at.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Diagnostic {
    pub path: String,
    pub line: usize,
    pub col: usize,
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Line 0: a problem of the commit as a whole (its signature), not of a place in a file.
        if self.line == 0 {
            return write!(f, "{}: {}", self.path, self.message);
        }
        write!(
            f,
            "{}:{}:{}: {}",
            self.path, self.line, self.col, self.message
        )
    }
}

/// Every problem found in one commit, in file order. Non-empty when returned as an error.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, diagnostic) in self.0.iter().enumerate() {
            if index > 0 {
                writeln!(f)?;
            }
            write!(f, "{diagnostic}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

/// Maps byte offsets of one source text to 1-based line and column (columns count chars).
pub(crate) struct LineIndex<'a> {
    text: &'a str,
    line_starts: Vec<usize>,
}

impl<'a> LineIndex<'a> {
    pub(crate) fn new(text: &'a str) -> LineIndex<'a> {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(offset, _)| offset + 1));
        LineIndex { text, line_starts }
    }

    pub(crate) fn line_col(&self, offset: usize) -> (usize, usize) {
        let mut offset = offset.min(self.text.len());
        // An offset inside a multi-byte character (hcl-edit reports some) points at that
        // character; counting its bytes as columns would point past the end of the line.
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let line = match self.line_starts.binary_search(&offset) {
            Ok(exact) => exact,
            Err(next) => next - 1,
        };
        let start = self.line_starts[line];
        let col = self.text[start..offset].chars().count();
        (line + 1, col + 1)
    }

    pub(crate) fn at(&self, path: &str, span: Option<Range<usize>>, message: String) -> Diagnostic {
        let (line, col) = self.line_col(span.map_or(0, |range| range.start));
        Diagnostic {
            path: path.to_owned(),
            line,
            col,
            message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_map_to_one_based_line_and_char_column() {
        let index = LineIndex::new("ab\ncdé\nx");
        assert_eq!(index.line_col(0), (1, 1));
        assert_eq!(index.line_col(3), (2, 1));
        assert_eq!(index.line_col(6), (2, 3), "inside `é`: the column of `é`");
        assert_eq!(index.line_col(7), (2, 4));
        assert_eq!(index.line_col(8), (3, 1));
    }
}
