//! The text rules a Compose file follows and the HCL text the converter writes: Compose's
//! `${VAR}` interpolation, `.env` files, shell-style word splitting of `command` strings,
//! byte sizes, and HCL string quoting.
//!
//! Invariants: pure; every loop is bounded by its input (nested `${…}` defaults by
//! [`MAX_NESTING`]); a quoted HCL string decodes to exactly the text given (the agent's `${`
//! and `%{` are escaped, so nothing written is interpolated again).

use std::collections::BTreeMap;

/// Deepest `${A:-${B:-…}}` nesting read.
const MAX_NESTING: usize = 8;

/// What interpolating one value found: the text, and the variables it used that were unset
/// (Compose warns and substitutes an empty string).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Interpolated {
    pub(super) text: String,
    pub(super) unset: Vec<String>,
}

/// Compose's interpolation of one scalar: `$$` is a literal `$`; `$VAR`, `${VAR}`,
/// `${VAR:-default}` (unset or empty), `${VAR-default}` (unset), `${VAR:+alt}`, `${VAR+alt}`,
/// `${VAR:?message}` and `${VAR?message}` (an error). The error is the message to show.
pub(super) fn interpolate(
    text: &str,
    vars: &BTreeMap<String, String>,
) -> Result<Interpolated, String> {
    let mut out = Interpolated::default();
    expand(text, vars, 0, &mut out)?;
    Ok(out)
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn expand(
    text: &str,
    vars: &BTreeMap<String, String>,
    depth: usize,
    out: &mut Interpolated,
) -> Result<(), String> {
    if depth > MAX_NESTING {
        return Err(format!("`${{…}}` nested deeper than {MAX_NESTING} levels"));
    }
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c != '$' {
            out.text.push(c);
            i += 1;
            continue;
        }
        match chars.get(i + 1) {
            Some('$') => {
                out.text.push('$');
                i += 2;
            }
            Some('{') => {
                // The matching `}`, counting nested `${`.
                let mut level = 1;
                let mut j = i + 2;
                while j < chars.len() {
                    match chars[j] {
                        '{' if chars.get(j.wrapping_sub(1)) == Some(&'$') => level += 1,
                        '}' => {
                            level -= 1;
                            if level == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
                if j >= chars.len() {
                    return Err(format!(
                        "`{}` has no closing `}}` (write `$$` for a literal `$`)",
                        chars[i..].iter().collect::<String>()
                    ));
                }
                let inner: String = chars[i + 2..j].iter().collect();
                braced(&inner, vars, depth, out)?;
                i = j + 1;
            }
            Some(&next) if is_name_start(next) => {
                let mut j = i + 1;
                while j < chars.len() && is_name_char(chars[j]) {
                    j += 1;
                }
                let name: String = chars[i + 1..j].iter().collect();
                lookup(&name, vars, out);
                i = j;
            }
            _ => {
                out.text.push('$');
                i += 1;
            }
        }
    }
    Ok(())
}

fn lookup(name: &str, vars: &BTreeMap<String, String>, out: &mut Interpolated) {
    match vars.get(name) {
        Some(value) => out.text.push_str(value),
        None => {
            if !out.unset.iter().any(|seen| seen == name) {
                out.unset.push(name.to_owned());
            }
        }
    }
}

fn braced(
    inner: &str,
    vars: &BTreeMap<String, String>,
    depth: usize,
    out: &mut Interpolated,
) -> Result<(), String> {
    let name_end = inner
        .char_indices()
        .find(|(_, c)| !is_name_char(*c))
        .map_or(inner.len(), |(at, _)| at);
    let name = &inner[..name_end];
    if name.is_empty() || !name.starts_with(is_name_start) {
        return Err(format!("`${{{inner}}}` is not a variable reference"));
    }
    let rest = &inner[name_end..];
    let value = vars.get(name);
    if rest.is_empty() {
        lookup(name, vars, out);
        return Ok(());
    }
    let (operator, word) = ["-", ":-", "+", ":+", "?", ":?"]
        .iter()
        .filter_map(|op| rest.strip_prefix(op).map(|word| (*op, word)))
        .max_by_key(|(op, _)| op.len())
        .ok_or_else(|| format!("`${{{inner}}}`: unknown operator {rest:?}"))?;
    let set = value.is_some();
    let non_empty = value.is_some_and(|v| !v.is_empty());
    let use_word = match operator {
        ":-" => !non_empty,
        "-" => !set,
        ":+" => non_empty,
        "+" => set,
        ":?" | "?" => {
            let missing = if operator == ":?" { !non_empty } else { !set };
            if missing {
                let mut message = Interpolated::default();
                expand(word, vars, depth + 1, &mut message)?;
                return Err(format!(
                    "required variable {name} is missing a value: {}",
                    message.text
                ));
            }
            false
        }
        _ => false,
    };
    if use_word {
        expand(word, vars, depth + 1, out)
    } else {
        if operator.ends_with('+') {
            return Ok(());
        }
        out.text.push_str(value.map_or("", String::as_str));
        Ok(())
    }
}

/// The variables of a `.env` file (Compose's rules): `KEY=value` lines, `export` allowed,
/// `#` comments and blank lines skipped; a value in single quotes is literal, in double quotes
/// keeps `\n` escapes, unquoted loses a trailing ` #comment`. Lines without `=` are skipped.
pub(crate) fn dotenv(text: &str) -> BTreeMap<String, String> {
    let mut vars = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line).trim_start();
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim();
        if key.is_empty() || !key.chars().all(|c| is_name_char(c) || c == '.' || c == '-') {
            continue;
        }
        let value = value.trim();
        let value = if let Some(inner) = value.strip_prefix('\'').and_then(|v| v.strip_suffix('\''))
        {
            inner.to_owned()
        } else if let Some(inner) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
            inner
                .replace("\\n", "\n")
                .replace("\\\"", "\"")
                .replace("\\\\", "\\")
        } else {
            match value.find(" #") {
                Some(at) => value[..at].trim_end().to_owned(),
                None => value.to_owned(),
            }
        };
        vars.insert(key.to_owned(), value);
    }
    vars
}

/// Splits a command string into words as a POSIX shell would (quotes and backslashes; no
/// expansion), as Compose splits a string `command` or `entrypoint`. `None`: an unclosed
/// quote.
pub(super) fn shell_words(text: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' | '\n' | '\r' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '\'' => break,
                        other => word.push(other),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '"' => break,
                        '\\' => match chars.next()? {
                            escaped @ ('"' | '\\' | '$' | '`') => word.push(escaped),
                            '\n' => {}
                            other => {
                                word.push('\\');
                                word.push(other);
                            }
                        },
                        other => word.push(other),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some('\n') | None => {}
                    Some(other) => word.push(other),
                }
            }
            other => {
                in_word = true;
                word.push(other);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Some(words)
}

/// A Docker byte size (`512m`, `1gb`, `2048`, `1.5g`; units 1024-based as Docker reads them)
/// in bytes.
pub(super) fn bytes(text: &str) -> Option<u64> {
    let lower = text.trim().to_ascii_lowercase();
    let digits_end = lower
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(lower.len());
    let (number, unit) = lower.split_at(digits_end);
    let number: f64 = number.parse().ok()?;
    let scale: u64 = match unit.trim() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    let value = number * scale as f64;
    (0.0..1e18).contains(&value).then_some(value as u64)
}

/// `bytes` as the agent's memory sizes read them: `Gi`/`Mi`/`Ki` when exact, else bytes.
pub(super) fn memory(bytes: u64) -> String {
    for (unit, scale) in [("Gi", 1u64 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)] {
        if bytes >= scale && bytes.is_multiple_of(scale) {
            return format!("{}{unit}", bytes / scale);
        }
    }
    bytes.to_string()
}

/// `text` as an HCL quoted string whose decoded value is exactly `text`: quotes, backslashes
/// and control characters escaped, and `${`/`%{` doubled so the agent does not interpolate.
pub(super) fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '$' | '%' if chars.peek() == Some(&'{') => {
                out.push(c);
                out.push(c);
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `items` as an HCL list of quoted strings.
pub(super) fn list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|item| quote(item)).collect();
    format!("[{}]", quoted.join(", "))
}

/// `key` as an HCL object key: bare when it is an identifier, quoted otherwise.
pub(super) fn key(text: &str) -> String {
    let bare = text.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare { text.to_owned() } else { quote(text) }
}

/// Compose's project name rule (v1): lower-cased, only `a-z`, `0-9`, `_` and `-` kept, and
/// what must start with a letter or digit.
pub(crate) fn project_name(text: &str) -> String {
    let kept: String = text
        .to_ascii_lowercase()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .collect();
    kept.trim_start_matches(['_', '-']).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> BTreeMap<String, String> {
        BTreeMap::from([
            ("SET".to_owned(), "v".to_owned()),
            ("EMPTY".to_owned(), String::new()),
        ])
    }

    fn expanded(text: &str) -> String {
        match interpolate(text, &vars()) {
            Ok(i) => format!("{}|{}", i.text, i.unset.join(",")),
            Err(error) => format!("error: {error}"),
        }
    }

    #[test]
    fn interpolation_follows_composes_rules() {
        assert_eq!(expanded("a ${SET} $SET b"), "a v v b|");
        assert_eq!(expanded("${UNSET}x"), "x|UNSET");
        assert_eq!(expanded("${UNSET:-d} ${EMPTY:-d} ${EMPTY-d}"), "d d |");
        assert_eq!(
            expanded("${SET:+alt}|${EMPTY:+alt}|${EMPTY+alt}"),
            "alt||alt|"
        );
        assert_eq!(expanded("${UNSET:-${SET}}"), "v|");
        assert_eq!(expanded("$$HOME $$(cat x) 5$"), "$HOME $(cat x) 5$|");
        assert!(expanded("${UNSET:?say why}").contains("say why"));
        assert!(expanded("${EMPTY?x}").starts_with('|'));
        assert!(expanded("${oops").starts_with("error"));
        assert!(expanded("${1X}").starts_with("error"));
        let deep = format!("{}x{}", "${A:-".repeat(20), "}".repeat(20));
        assert!(expanded(&deep).contains("nested deeper"));
    }

    #[test]
    fn dotenv_files() {
        let vars = dotenv("# c\nA=1\nexport B='x y'\nC=\"l\\n2\"\nD=v #c\nbad line\n=x\n");
        assert_eq!(vars.get("A").map(String::as_str), Some("1"));
        assert_eq!(vars.get("B").map(String::as_str), Some("x y"));
        assert_eq!(vars.get("C").map(String::as_str), Some("l\n2"));
        assert_eq!(vars.get("D").map(String::as_str), Some("v"));
        assert_eq!(vars.len(), 4);
    }

    #[test]
    fn words_split_like_a_shell() {
        assert_eq!(
            shell_words(r#"sh -c 'echo "a b"' "x\"y" z\ w"#),
            Some(vec![
                "sh".to_owned(),
                "-c".to_owned(),
                "echo \"a b\"".to_owned(),
                "x\"y".to_owned(),
                "z w".to_owned()
            ])
        );
        assert_eq!(shell_words("a 'open"), None);
        assert_eq!(shell_words("  "), Some(vec![]));
    }

    #[test]
    fn sizes_and_quoting() {
        assert_eq!(bytes("512m"), Some(512 << 20));
        assert_eq!(bytes("1gb"), Some(1 << 30));
        assert_eq!(bytes("1.5G"), Some(3 << 29));
        assert_eq!(bytes("12x"), None);
        assert_eq!(memory(512 << 20), "512Mi");
        assert_eq!(memory(1000), "1000");
        assert_eq!(quote("a\"b\\${X}%{y}\n$Z"), r#""a\"b\\$${X}%%{y}\n$Z""#);
        assert_eq!(key("POSTGRES_DB"), "POSTGRES_DB");
        assert_eq!(key("a.b"), "\"a.b\"");
        assert_eq!(project_name("My App.v2"), "myappv2");
    }
}
