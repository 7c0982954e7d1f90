//! Text from the repository, the engine or a client, made safe to print on a terminal: a file
//! name, a probe command or an error message holding ESC or BEL could clear the screen, set
//! the window title or forge lines of the output.
//!
//! Invariant: `escape` leaves no control character, no C1 control and no bidirectional
//! override in its result, and changes nothing else; a record printed through it is one line
//! (`\n` and `\t` in the data are escaped too). JSON outputs need none of this (serde escapes
//! control characters; bidi overrides are only shown by a terminal, not read by a parser).

use std::fmt;

/// `text` with every C0 control (tab and line feed included), DEL, C1 control (U+0080 to
/// U+009F) and Unicode bidi override or isolate (U+202A to U+202E, U+2066 to U+2069)
/// written as an escape: `\n`, `\t`, `\r`, `\x1b`, `\u{202e}`; a backslash stays as it is.
pub(crate) fn escape(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if u32::from(c) < 0x80 && needs_escape(c) => {
                out.push_str(&format!("\\x{:02x}", u32::from(c)));
            }
            c if needs_escape(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Prints `text` escaped (`escape`), keeping the width and alignment of the format
/// (`{:<16}`): `println!("{:<16} {}", Esc(&name), Esc(&message))`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Esc<'a>(pub(crate) &'a str);

impl fmt::Display for Esc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&escape(self.0))
    }
}

/// `text` cut to at most `max` bytes at a character boundary.
pub(crate) fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `bytes` as lower-case hex, two digits a byte.
pub(crate) fn hex(bytes: &[u8]) -> String {
    // A lookup, not `fmt`: spec hashes hex one digest per resource per plan.
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_overrides_are_escaped_and_nothing_else() {
        let cases = [
            ("plain text, ünïcödé ✓ \\ \"", "plain text, ünïcödé ✓ \\ \""),
            ("\x1b[2J\x07", "\\x1b[2J\\x07"),
            ("one\ntwo\tthree\r", "one\\ntwo\\tthree\\r"),
            ("\0 \x7f", "\\x00 \\x7f"),
            ("\u{85}\u{9b}31m", "\\u{85}\\u{9b}31m"),
            (
                "abc\u{202e}fed\u{2066}x\u{2069}",
                "abc\\u{202e}fed\\u{2066}x\\u{2069}",
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(escape(input), expected, "{input:?}");
        }
        let all: String = (0..=0x10ffff_u32).filter_map(char::from_u32).collect();
        let escaped = escape(&all);
        assert!(!escaped.chars().any(needs_escape));
        assert!(escaped.contains("\\u{202a}") && escaped.contains('A'));
    }

    #[test]
    fn the_display_keeps_the_width() {
        assert_eq!(format!("[{:<6}]", Esc("a\x07")), "[a\\x07 ]");
        assert_eq!(format!("[{:>4}]", Esc("ab")), "[  ab]");
    }
}
