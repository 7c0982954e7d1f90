//! Glob patterns of trigger files, with GitHub Actions' meaning: `*` matches within one path
//! segment, `**` across segments (`**/` also matches no directory at all), `?` one character
//! other than `/`, `[abc]` / `[a-z]` / `[!a]` / `[^a]` one character of a class, `\x` a
//! literal `x`. Branch patterns use the same matcher on the branch name.
//!
//! Invariant: matching is a dynamic programme over pattern tokens × text characters, so its
//! cost is bounded by their product whatever the pattern (no exponential backtracking).

/// Longest pattern accepted, in bytes.
pub(super) const MAX_PATTERN_BYTES: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(char),
    /// `?`
    One,
    /// `*`
    Star,
    /// `**` not followed by `/`
    GlobStar,
    /// `**/`: zero or more whole directories
    Dirs,
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

/// Why a pattern does not compile. Display is the reason; the trigger parser reports it at
/// the pattern's `path:line:col`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum GlobError {
    #[error("an empty pattern matches nothing")]
    Empty,
    #[error("a pattern is at most {MAX_PATTERN_BYTES} bytes")]
    TooLong,
    #[error(
        "{0:?}: negated patterns (`!…`) are not supported (voodu would match the `!` literally, so it would never match)"
    )]
    Negated(String),
    #[error("{0:?} ends with a lone `\\`")]
    LoneBackslash(String),
    #[error("{0:?} has a `[` without its `]`")]
    UnclosedClass(String),
}

/// A compiled pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Glob {
    tokens: Vec<Token>,
}

impl Glob {
    /// Compiles `pattern`, or says what is wrong with it.
    pub(super) fn new(pattern: &str) -> Result<Glob, GlobError> {
        if pattern.is_empty() {
            return Err(GlobError::Empty);
        }
        if pattern.len() > MAX_PATTERN_BYTES {
            return Err(GlobError::TooLong);
        }
        if pattern.starts_with('!') {
            return Err(GlobError::Negated(pattern.to_owned()));
        }
        let chars: Vec<char> = pattern.chars().collect();
        let mut tokens = Vec::new();
        let mut index = 0;
        while index < chars.len() {
            match chars[index] {
                '*' if chars.get(index + 1) == Some(&'*') => {
                    if chars.get(index + 2) == Some(&'/') {
                        tokens.push(Token::Dirs);
                        index += 3;
                    } else {
                        tokens.push(Token::GlobStar);
                        index += 2;
                        // `***` is `**` followed by `*`: the same set.
                        while chars.get(index) == Some(&'*') {
                            index += 1;
                        }
                    }
                }
                '*' => {
                    tokens.push(Token::Star);
                    index += 1;
                }
                '?' => {
                    tokens.push(Token::One);
                    index += 1;
                }
                '\\' => {
                    let escaped = chars
                        .get(index + 1)
                        .ok_or_else(|| GlobError::LoneBackslash(pattern.to_owned()))?;
                    tokens.push(Token::Literal(*escaped));
                    index += 2;
                }
                '[' => {
                    let (token, next) = class(&chars, index)
                        .ok_or_else(|| GlobError::UnclosedClass(pattern.to_owned()))?;
                    tokens.push(token);
                    index = next;
                }
                other => {
                    tokens.push(Token::Literal(other));
                    index += 1;
                }
            }
        }
        Ok(Glob { tokens })
    }

    /// Whether `text` (a repo path with `/` separators, or a branch name) matches.
    pub(super) fn matches(&self, text: &str) -> bool {
        let text: Vec<char> = text.chars().collect();
        let n_text = text.len();
        // matched[j]: the tokens from `i` on match text[j..]; computed for i from the end.
        let mut matched = vec![false; n_text + 1];
        matched[n_text] = true;
        for token in self.tokens.iter().rev() {
            let mut next = vec![false; n_text + 1];
            // For `**/`: whether some `/` at or after j is followed by a match.
            let mut slash_then_match = false;
            for j in (0..=n_text).rev() {
                if j < n_text && text[j] == '/' && matched[j + 1] {
                    slash_then_match = true;
                }
                next[j] = match token {
                    Token::Literal(c) => j < n_text && text[j] == *c && matched[j + 1],
                    Token::One => j < n_text && text[j] != '/' && matched[j + 1],
                    Token::Class { negated, ranges } => {
                        j < n_text
                            && text[j] != '/'
                            && ranges
                                .iter()
                                .any(|(low, high)| (*low..=*high).contains(&text[j]))
                                != *negated
                            && matched[j + 1]
                    }
                    // Zero characters, or one more (not `/`) and still this token.
                    Token::Star => matched[j] || (j < n_text && text[j] != '/' && next[j + 1]),
                    Token::GlobStar => matched[j] || (j < n_text && next[j + 1]),
                    // No directory, or any run of characters ending in `/`.
                    Token::Dirs => matched[j] || slash_then_match,
                };
            }
            matched = next;
        }
        matched[0]
    }
}

/// Parses a class starting at `chars[start] == '['`: the token and the index after `]`.
fn class(chars: &[char], start: usize) -> Option<(Token, usize)> {
    let mut index = start + 1;
    let negated = matches!(chars.get(index), Some('!' | '^'));
    if negated {
        index += 1;
    }
    let mut ranges = Vec::new();
    let mut first = true;
    loop {
        let c = *chars.get(index)?;
        if c == ']' && !first {
            return Some((Token::Class { negated, ranges }, index + 1));
        }
        first = false;
        let low = if c == '\\' {
            index += 1;
            *chars.get(index)?
        } else {
            c
        };
        if chars.get(index + 1) == Some(&'-') && chars.get(index + 2).is_some_and(|c| *c != ']') {
            let high = *chars.get(index + 2)?;
            ranges.push((low, high));
            index += 3;
        } else {
            ranges.push((low, low));
            index += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(pattern: &str, yes: &[&str], no: &[&str]) {
        let glob = Glob::new(pattern).expect("a valid pattern");
        for text in yes {
            assert!(glob.matches(text), "{pattern} should match {text}");
        }
        for text in no {
            assert!(!glob.matches(text), "{pattern} should not match {text}");
        }
    }

    #[test]
    fn patterns_match_as_in_github_actions() {
        check(
            "apps/api/**",
            &["apps/api/main.go", "apps/api/src/deep/x.ts"],
            &["apps/web/main.go", "apps/api", "apps/apiv2/x", "README.md"],
        );
        check(
            "apps/*/src/**",
            &["apps/api/src/a.rs", "apps/web/src/b/c.rs"],
            &["apps/src/a.rs", "apps/a/b/src/c"],
        );
        check(
            "**/*.hcl",
            &["voodu.hcl", "deploy/web.hcl", "a/b/c.hcl"],
            &["voodu.hcl.bak", "hcl"],
        );
        check("**.md", &["README.md", "docs/x/y.md"], &["README.txt"]);
        check("*.md", &["README.md"], &["docs/README.md"]);
        check(
            "docs/**/README.md",
            &["docs/README.md", "docs/a/b/README.md"],
            &["docs/a/README.mdx"],
        );
        check("src/?.rs", &["src/a.rs"], &["src/ab.rs", "src//.rs"]);
        check("v[0-9].*", &["v1.2", "v9.x"], &["va.1", "v1/2"]);
        check("[!a]*", &["b", "bcd"], &["a", "abc"]);
        check(
            "release-*",
            &["release-2", "release-"],
            &["release/2", "main"],
        );
        check("main", &["main"], &["main2", "mai"]);
        check(
            "feature/**",
            &["feature/a", "feature/a/b"],
            &["feature", "features/a"],
        );
        check("a\\*b", &["a*b"], &["axb"]);
        check("**", &["anything/at/all", "x"], &[]);
    }

    #[test]
    fn globstar_slash_matches_no_directory() {
        let glob = Glob::new("**/*.hcl").expect("valid");
        assert_eq!(glob.tokens.len(), 6, "{:?}", glob.tokens);
        assert!(glob.matches("voodu.hcl"));
    }

    #[test]
    fn bad_patterns_say_why() {
        for (pattern, expected) in [
            ("", "an empty pattern matches nothing"),
            (
                "!apps/**",
                "\"!apps/**\": negated patterns (`!…`) are not supported (voodu would match the `!` literally, so it would never match)",
            ),
            ("apps/[ab", "\"apps/[ab\" has a `[` without its `]`"),
            ("x\\", "\"x\\\\\" ends with a lone `\\`"),
        ] {
            assert_eq!(
                Glob::new(pattern)
                    .err()
                    .map(|error| error.to_string())
                    .as_deref(),
                Some(expected),
                "{pattern}"
            );
        }
        assert_eq!(
            Glob::new(&"a".repeat(MAX_PATTERN_BYTES + 1)),
            Err(GlobError::TooLong)
        );
    }

    #[test]
    fn many_stars_stay_polynomial() {
        // A backtracking matcher takes exponential time on this; the table does not.
        let glob = Glob::new(&"*a".repeat(40)).expect("valid");
        assert!(!glob.matches(&format!("{}b", "a".repeat(2000))));
    }
}
