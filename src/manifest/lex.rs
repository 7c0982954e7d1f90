//! The pre-pass that runs before HCL parsing: marks every real `${…}` interpolation inside
//! string literals and heredocs, so that the decoder, not the HCL parser, resolves it.
//!
//! voodu substitutes `${VAR}` textually over the whole file (comments included) and escapes
//! dotted refs to `$${…}` before parsing (spec §1.3). The agent instead keeps comments inert
//! and resolves interpolations itself: the `$` of each interpolation start is replaced by
//! [`MARK`], a private-use character. HCL then sees plain text (so `${VAR:-default}` and
//! `${asset.s.pg-config.key}`, which are not HCL expressions, parse), and the decoder finds the
//! marks in decoded strings. It also keeps from the HCL parser the files it could spend hours
//! on, which hold operators or template expressions (see [`mark_interpolations`]).
//!
//! Invariants: the output has exactly the same characters per line as the input (one char
//! replaced by one char), so line and column numbers computed on it are the input's; an
//! escaped `$${` is left alone (it decodes to a literal `${`); nothing in a comment changes.

use std::ops::Range;

/// Stands in for the `$` of an interpolation start. From the Unicode private-use area, so it
/// cannot clash with text a manifest means literally (a file containing it is refused).
pub(crate) const MARK: char = '\u{E000}';

/// A problem found by the pre-pass, at a byte range of the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LexError {
    pub(crate) span: Range<usize>,
    pub(crate) message: String,
    /// Set when the file must not reach the HCL parser (see [`mark_interpolations`]).
    pub(crate) blocks_parse: bool,
}

/// Returns the marked text and the problems found. The text is still parsed when there are
/// problems (every problem is reported, and the commit is rejected), unless one of them
/// `blocks_parse`: an operator outside strings, or a `${…}` or `%{…}` template expression
/// the pre-pass cannot mark. hcl-edit's expression parser backtracks exponentially on some
/// invalid input built from those (a 633-byte file took 32 s to fail), and a manifest that
/// holds one is rejected anyway, as manifest values are literals. Outside them, this pre-pass
/// sees strings, comments and heredocs where HCL does, so every operator HCL would parse is
/// one this pre-pass reports.
pub(crate) fn mark_interpolations(text: &str) -> (String, Vec<LexError>) {
    let mut marked = Marked::new(text);
    let bytes = text.as_bytes();
    let mut i = 0;
    // Whether the last token outside strings and comments ends an operand, so that an operator
    // character after it is a binary operator (`a - 1`), not a sign (`= -1`).
    let mut after_operand = false;
    while i < bytes.len() {
        match bytes[i] {
            b'#' => i = skip_line(bytes, i),
            b'/' if bytes.get(i + 1) == Some(&b'/') => i = skip_line(bytes, i),
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i = match text[i + 2..].find("*/") {
                    Some(end) => i + 2 + end + 2,
                    None => bytes.len(),
                };
            }
            b'"' => {
                i = marked.quoted_string(i);
                after_operand = true;
            }
            b'+' | b'-' | b'*' | b'/' | b'%' | b'<' | b'>' | b'&' | b'|' | b'!'
                if after_operand =>
            {
                let len = match (bytes[i], bytes.get(i + 1)) {
                    (b'<' | b'>' | b'!', Some(b'=')) | (b'&', Some(b'&')) | (b'|', Some(b'|')) => 2,
                    _ => 1,
                };
                marked.errors.push(operator_error(text, i..i + len));
                i += len;
                after_operand = false;
            }
            b'=' => {
                match bytes.get(i + 1) {
                    Some(b'=') if after_operand => {
                        marked.errors.push(operator_error(text, i..i + 2));
                        i += 2;
                    }
                    // `=>` of a for expression.
                    Some(b'>') => i += 2,
                    _ => i += 1,
                }
                after_operand = false;
            }
            b'<' if bytes.get(i + 1) == Some(&b'<') => match heredoc_body(text, i) {
                Some((body, end)) => {
                    marked.heredoc(body);
                    i = end;
                    after_operand = true;
                }
                None => i += 2,
            },
            // A splat (`[*]`, `.*`) stands for an operand.
            b'*' => {
                i += 1;
                after_operand = true;
            }
            // Signs, `!`, and what HCL refuses where an operand must start.
            b'+' | b'-' | b'/' | b'%' | b'<' | b'>' | b'&' | b'|' | b'!' => i += 1,
            b'0'..=b'9' => {
                i = number_end(bytes, i);
                after_operand = true;
            }
            b')' | b']' | b'}' => {
                i += 1;
                after_operand = true;
            }
            b'(' | b'[' | b'{' | b',' | b':' | b'?' | b'.' => {
                i += 1;
                after_operand = false;
            }
            b' ' | b'\t' | b'\r' | b'\n' => i += 1,
            _ => {
                i = operand_end(text, i);
                after_operand = true;
            }
        }
    }
    marked.finish()
}

/// The marked text as it is built, and the problems found so far.
struct Marked<'t> {
    text: &'t str,
    out: String,
    /// How much of `text` is in `out`.
    copied: usize,
    errors: Vec<LexError>,
}

impl<'t> Marked<'t> {
    fn new(text: &'t str) -> Marked<'t> {
        let mut errors = Vec::new();
        if let Some(offset) = text.find(MARK) {
            errors.push(LexError {
                span: offset..offset + MARK.len_utf8(),
                message:
                    "the file contains U+E000, a private-use character this agent reserves; remove it"
                        .to_owned(),
                blocks_parse: false,
            });
        }
        Marked {
            text,
            out: String::with_capacity(text.len() + 16),
            copied: 0,
            errors,
        }
    }

    fn finish(mut self) -> (String, Vec<LexError>) {
        self.out.push_str(&self.text[self.copied..]);
        (self.out, self.errors)
    }

    /// Replaces the `$` at `at` with the mark.
    fn mark_at(&mut self, at: usize) {
        self.out.push_str(&self.text[self.copied..at]);
        self.out.push(MARK);
        self.copied = at + 1;
    }

    /// Marks the `${` at `at`, which may reach as far as `within` (the text up to the end of
    /// its string or heredoc body); returns where scanning goes on.
    fn interpolation(&mut self, within: usize, at: usize, in_string: bool) -> usize {
        match interpolation_end(&self.text[..within], at, in_string) {
            Ok(end) => {
                self.mark_at(at);
                end
            }
            Err(error) => {
                // Marked anyway, so the parser does not report it again.
                self.mark_at(at);
                let end = error.span.end;
                self.errors.push(error);
                end
            }
        }
    }

    /// The quoted string opening at `start`: its interpolations marked; returns where it ends.
    fn quoted_string(&mut self, start: usize) -> usize {
        let bytes = self.text.as_bytes();
        let mut i = start + 1;
        while i < bytes.len() {
            match bytes[i] {
                // A backslash before a newline escapes nothing: HCL ends the string there.
                b'\\' if bytes.get(i + 1) != Some(&b'\n') => i += 2,
                b'"' | b'\n' => {
                    i += 1;
                    break;
                }
                b'$' | b'%' if bytes.get(i + 1) == Some(&bytes[i]) => {
                    // `$${` / `%%{` are HCL escapes for a literal `${` / `%{`.
                    i += 2;
                }
                b'$' if bytes.get(i + 1) == Some(&b'{') => {
                    i = self.interpolation(self.text.len(), i, true);
                }
                b'%' if bytes.get(i + 1) == Some(&b'{') => {
                    self.errors.push(directive_error(i));
                    i += 2;
                }
                _ => i += 1,
            }
        }
        i
    }

    /// A heredoc's body: its interpolations marked.
    fn heredoc(&mut self, body: Range<usize>) {
        let bytes = self.text.as_bytes();
        let mut j = body.start;
        while j < body.end {
            match bytes[j] {
                b'$' | b'%' if bytes.get(j + 1) == Some(&bytes[j]) => j += 2,
                b'$' if bytes.get(j + 1) == Some(&b'{') => {
                    j = self.interpolation(body.end, j, false);
                }
                b'%' if bytes.get(j + 1) == Some(&b'{') => {
                    self.errors.push(directive_error(j));
                    j += 2;
                }
                _ => j += 1,
            }
        }
    }
}

/// Where the identifier or other operand starting at `start` ends. An identifier may hold `-`
/// after its first character (`X-Probe`). Anything else counts as an operand too, so that no
/// operator after it goes unreported.
fn operand_end(text: &str, start: usize) -> usize {
    let rest = &text[start..];
    let starts_identifier = rest
        .chars()
        .next()
        .is_some_and(|first| first.is_alphabetic() || first == '_');
    start
        + if starts_identifier {
            rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-'))
                .unwrap_or(rest.len())
        } else {
            rest.chars().next().map_or(1, char::len_utf8)
        }
}

fn operator_error(text: &str, span: Range<usize>) -> LexError {
    LexError {
        message: format!(
            "operator `{}` is not supported: manifest values are literals (strings, numbers, bools, lists and maps)",
            &text[span.clone()]
        ),
        span,
        blocks_parse: true,
    }
}

fn directive_error(at: usize) -> LexError {
    LexError {
        span: at..at + 2,
        message: "template directives (`%{…}`) are not supported: manifests interpolate only ${VAR}, ${VAR:-default}, ${asset.…} and ${ref.…} (write `%%{` for a literal `%{`)".to_owned(),
        blocks_parse: true,
    }
}

/// The offset just past the number starting at `start`: digits and dots, then an optional
/// exponent whose sign is part of the number (`1e-5`), not an operator.
fn number_end(bytes: &[u8], start: usize) -> usize {
    let mut i = start;
    while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'.') {
        i += 1;
    }
    if matches!(bytes.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(bytes.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
    }
    i
}

fn skip_line(bytes: &[u8], from: usize) -> usize {
    bytes[from..]
        .iter()
        .position(|&byte| byte == b'\n')
        .map_or(bytes.len(), |newline| from + newline + 1)
}

const UNTERMINATED: &str = "unterminated `${`: close it with `}` (write `$${` for a literal `${`)";

/// The byte offset just past the `}` closing the interpolation that starts at `start`.
/// voodu's interpolations are names and dotted refs: the first `}` closes them. A quote first
/// means an HCL expression (a function call, a nested string) the agent does not evaluate; it
/// is reported here, so the HCL parser never sees it (template expressions can make hcl-edit
/// 0.10 parse for exponential time).
fn interpolation_end(text: &str, start: usize, quoted: bool) -> Result<usize, LexError> {
    let rest = &text[start + 2..];
    let mut len = 0;
    for (offset, ch) in rest.char_indices() {
        match ch {
            '}' => return Ok(start + 2 + offset + 1),
            '"' if quoted => {
                // `${lower("X")}`: an expression; `"x${SET"`: the string ends first.
                let message = if rest[..offset].contains('(') {
                    "`${…}` holding a string or a function call is not supported: manifests interpolate only ${VAR}, ${VAR:-default}, ${asset.…} and ${ref.…}"
                } else {
                    UNTERMINATED
                };
                return Err(LexError {
                    span: start..start + 2 + offset,
                    message: message.to_owned(),
                    blocks_parse: true,
                });
            }
            '\n' => break,
            _ => len = offset + ch.len_utf8(),
        }
    }
    Err(LexError {
        span: start..start + 2 + len,
        message: UNTERMINATED.to_owned(),
        blocks_parse: true,
    })
}

/// For a heredoc starting at `start` (`<<EOT` or `<<-EOT` then a newline): the byte range of
/// its body and the offset just past its closing delimiter. As in HCL, the delimiter closes
/// the heredoc on a line where only spaces and tabs precede it and no identifier character
/// follows it (`  EOT`, `EOT]`); what follows it on that line is code again.
fn heredoc_body(text: &str, start: usize) -> Option<(Range<usize>, usize)> {
    let after = &text[start + 2..];
    let after = after.strip_prefix('-').unwrap_or(after);
    let header_start = text.len() - after.len();
    let ident_len = after
        .char_indices()
        .find(|(_, ch)| !(ch.is_alphanumeric() || *ch == '_' || *ch == '-'))
        .map_or(after.len(), |(offset, _)| offset);
    if ident_len == 0 {
        return None;
    }
    let delimiter = &after[..ident_len];
    let header_end = header_start + ident_len;
    let body_start = match text[header_end..].strip_prefix("\r\n") {
        Some(_) => header_end + 2,
        None => text[header_end..]
            .strip_prefix('\n')
            .map(|_| header_end + 1)?,
    };
    let mut line_start = body_start;
    while line_start < text.len() {
        let line_end = text[line_start..]
            .find('\n')
            .map_or(text.len(), |newline| line_start + newline);
        let line = &text[line_start..line_end];
        let indent = line.len() - line.trim_start_matches([' ', '\t']).len();
        let closes = line[indent..].strip_prefix(delimiter).is_some_and(|after| {
            !after.starts_with(|c: char| c.is_alphanumeric() || c == '_' || c == '-')
        });
        if closes {
            return Some((
                body_start..line_start,
                line_start + indent + delimiter.len(),
            ));
        }
        line_start = line_end + 1;
    }
    Some((body_start..text.len(), text.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expected: &str) {
        let (out, errors) = mark_interpolations(input);
        assert_eq!(errors, [], "{input}");
        assert_eq!(out.replace(MARK, "§"), expected);
        assert_eq!(
            out.chars().count(),
            input.chars().count(),
            "char counts must match"
        );
    }

    #[test]
    fn marks_interpolations_in_strings_only() {
        check(r#"a = "x${A}y""#, r#"a = "x§{A}y""#);
        check(
            r#"a = "${A:-d} ${asset.s.pg-x.k}""#,
            r#"a = "§{A:-d} §{asset.s.pg-x.k}""#,
        );
        check(
            "# ${A}\n// ${B}\n/* ${C} */ a = 1",
            "# ${A}\n// ${B}\n/* ${C} */ a = 1",
        );
        check(r#"a = "$${A}""#, r#"a = "$${A}""#);
        check(r#"a = "\"${A}""#, r#"a = "\"§{A}""#);
        check(r#"a = "${A}" # "${B}""#, r#"a = "§{A}" # "${B}""#);
    }

    #[test]
    fn marks_interpolations_in_heredocs() {
        check(
            "a = <<-EOT\n  x ${A}\n  $${B}\n  EOT\nb = \"${C}\"\n",
            "a = <<-EOT\n  x §{A}\n  $${B}\n  EOT\nb = \"§{C}\"\n",
        );
    }

    /// The spans of the errors that keep `input` from the HCL parser.
    fn blocking(input: &str) -> Vec<&str> {
        let (_, errors) = mark_interpolations(input);
        errors
            .iter()
            .filter(|error| error.blocks_parse)
            .map(|error| &input[error.span.clone()])
            .collect()
    }

    #[test]
    fn operators_and_template_expressions_keep_the_file_from_the_parser() {
        for (input, expected) in [
            ("a = 1 + 2", &["+"][..]),
            (
                "a = x == y && b != c || d >= e",
                &["==", "&&", "!=", "||", ">="],
            ),
            ("a = {\nm % 1 % {\n", &["%", "%"]),
            ("a = \"x\" - [1]", &["-"]),
            ("a = [1]\n-2", &["-"]),
            ("a = (1)*2", &["*"]),
            ("a = x <2", &["<"]),
            ("a = <<EOT\nx\nEOT % 1\n", &["%"]),
            ("a = \"%{ if x }y%{ endif }\"", &["%{", "%{"]),
            ("a = <<EOT\n%{ for x in y }\nEOT\n", &["%{"]),
            ("a = \"${f(\"x\")}\"", &["${f("]),
            ("a = \"${x\n", &["${x"]),
            // A backslash before a newline does not carry the string on to the next line.
            ("a = \"x\\\nb = 1 + 2\n", &["+"]),
        ] {
            assert_eq!(blocking(input), expected, "{input:?}");
        }
    }

    #[test]
    fn signs_identifiers_and_text_are_not_operators() {
        for input in [
            "a = -1\nb = [-1, !true, - 2]\nc = { n = -2.5e-3, m = 1E+3 }\n",
            "h = { X-Probe = \"1\", a-b-c = \"x - y\" }\n",
            "# a - b\n// a * b\n/* a % b */ a = \"a/b % c\"\n",
            "a = <<EOT\nx - y ${A} $${B} %%{C}\n  EOT\nb = <<-EOT\n  1 + 2\n  EOT\n",
            "a = [<<EOT\nx\nEOT\n, \"y\"]\nb = x.y[*].z\n",
            "a = { for k, v in x : k => v }\n",
            "deployment \"s\" \"n\" {\n  image = \"x:1.2-alpine\"\n}\n",
        ] {
            assert_eq!(blocking(input), Vec::<&str>::new(), "{input:?}");
        }
    }

    #[test]
    fn a_heredoc_ends_where_hcl_ends_it() {
        // The closing delimiter may be indented and followed by a non-identifier character;
        // `EOTX` and `x EOT` do not close it.
        check(
            "a = [<<EOT\n${A}\nEOTX\nx EOT\n  EOT, \"${B}\"]\n",
            "a = [<<EOT\n§{A}\nEOTX\nx EOT\n  EOT, \"§{B}\"]\n",
        );
    }

    #[test]
    fn reports_what_it_cannot_handle() {
        // An expression (a function call) is reported here, never handed to the parser.
        let (_, errors) = mark_interpolations(r#"a = "${lower("X")}""#);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].span, 5..13);
        assert!(
            errors[0]
                .message
                .contains("holding a string or a function call")
        );
        let (_, errors) = mark_interpolations("a = \"${A\"\n");
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].span, 5..8);
        let (_, errors) = mark_interpolations("a = \"\u{E000}\"");
        assert_eq!(errors.len(), 1);
    }
}
