//! The pre-pass that runs before HCL parsing: marks every real `${…}` interpolation inside
//! string literals and heredocs, so that the decoder, not the HCL parser, resolves it.
//!
//! voodu substitutes `${VAR}` textually over the whole file (comments included) and escapes
//! dotted refs to `$${…}` before parsing (spec §1.3). The agent instead keeps comments inert
//! and resolves interpolations itself: the `$` of each interpolation start is replaced by
//! [`MARK`], a private-use character. HCL then sees plain text (so `${VAR:-default}` and
//! `${asset.s.pg-config.key}`, which are not HCL expressions, parse), and the decoder finds the
//! marks in decoded strings.
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
}

/// Returns the marked text and the problems found (the text is still usable for parsing when
/// there are problems: every problem is also reported, and the commit is rejected).
pub(crate) fn mark_interpolations(text: &str) -> (String, Vec<LexError>) {
    let mut errors = Vec::new();
    if let Some(offset) = text.find(MARK) {
        errors.push(LexError {
            span: offset..offset + MARK.len_utf8(),
            message:
                "the file contains U+E000, a private-use character this agent reserves; remove it"
                    .to_owned(),
        });
    }
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len() + 16);
    let mut i = 0;
    let mut copied = 0;
    let mark_at = |at: usize, out: &mut String, copied: &mut usize| {
        out.push_str(&text[*copied..at]);
        out.push(MARK);
        *copied = at + 1;
    };
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
                i += 1;
                while i < bytes.len() {
                    match bytes[i] {
                        b'\\' => i += 2,
                        b'"' | b'\n' => {
                            i += 1;
                            break;
                        }
                        b'$' | b'%' if bytes.get(i + 1) == Some(&bytes[i]) => {
                            // `$${` / `%%{` are HCL escapes for a literal `${` / `%{`.
                            i += 2;
                        }
                        b'$' if bytes.get(i + 1) == Some(&b'{') => {
                            match interpolation_end(text, i, true) {
                                Ok(Some(end)) => {
                                    mark_at(i, &mut out, &mut copied);
                                    i = end;
                                }
                                Ok(None) => i += 2,
                                Err(error) => {
                                    // Marked anyway, so the parser does not report it again.
                                    mark_at(i, &mut out, &mut copied);
                                    i = error.span.end;
                                    errors.push(error);
                                }
                            }
                        }
                        _ => i += 1,
                    }
                }
            }
            b'<' if bytes.get(i + 1) == Some(&b'<') => match heredoc_body(text, i) {
                Some((body, end)) => {
                    let mut j = body.start;
                    while j < body.end {
                        match bytes[j] {
                            b'$' | b'%' if bytes.get(j + 1) == Some(&bytes[j]) => j += 2,
                            b'$' if bytes.get(j + 1) == Some(&b'{') => {
                                match interpolation_end(&text[..body.end], j, false) {
                                    Ok(Some(end)) => {
                                        mark_at(j, &mut out, &mut copied);
                                        j = end;
                                    }
                                    Ok(None) => j += 2,
                                    Err(error) => {
                                        mark_at(j, &mut out, &mut copied);
                                        j = error.span.end;
                                        errors.push(error);
                                    }
                                }
                            }
                            _ => j += 1,
                        }
                    }
                    i = end;
                }
                None => i += 2,
            },
            _ => i += 1,
        }
    }
    out.push_str(&text[copied..]);
    (out, errors)
}

fn skip_line(bytes: &[u8], from: usize) -> usize {
    bytes[from..]
        .iter()
        .position(|&byte| byte == b'\n')
        .map_or(bytes.len(), |newline| from + newline + 1)
}

/// The byte offset just past the `}` closing the interpolation that starts at `start`, or
/// `Ok(None)` for an interpolation holding a quote (a function call or a nested string): that
/// is left to the HCL parser, and the decoder reports the expression where it finds it.
/// voodu's interpolations are names and dotted refs: the first `}` closes them.
fn interpolation_end(text: &str, start: usize, quoted: bool) -> Result<Option<usize>, LexError> {
    let rest = &text[start + 2..];
    let mut len = 0;
    for (offset, ch) in rest.char_indices() {
        match ch {
            '}' => return Ok(Some(start + 2 + offset + 1)),
            '"' if quoted && rest[..offset].contains('(') => return Ok(None),
            '"' | '\n' => break,
            _ => len = offset + ch.len_utf8(),
        }
    }
    Err(LexError {
        span: start..start + 2 + len,
        message: "unterminated `${`: close it with `}` (write `$${` for a literal `${`)".to_owned(),
    })
}

/// For a heredoc starting at `start` (`<<EOT` or `<<-EOT` then a newline): the byte range of
/// its body and the offset just past its closing delimiter line.
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
        if text[line_start..line_end].trim() == delimiter {
            return Some((body_start..line_start, line_end));
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

    #[test]
    fn reports_what_it_cannot_handle() {
        let (out, errors) = mark_interpolations(r#"a = "${lower("X")}""#);
        assert_eq!(
            errors,
            [],
            "an expression is left to the parser and the decoder"
        );
        assert!(!out.contains(MARK));
        let (_, errors) = mark_interpolations("a = \"${A\"\n");
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].span, 5..8);
        let (_, errors) = mark_interpolations("a = \"\u{E000}\"");
        assert_eq!(errors.len(), 1);
    }
}
