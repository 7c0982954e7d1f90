//! Which source (repository) may deploy which scope: each source of `--sources` lists the
//! scopes it owns, as names or prefix patterns (`shop`, `shop-*`, `*`), and `""` for the
//! unscoped resources (registries, unscoped assets). The single `--repo` source owns every
//! scope.
//!
//! Invariant: no scope is owned by two sources; `Ownership::new` refuses patterns that
//! overlap, so every scope has at most one owner and `owner_of` is unambiguous.

use std::fmt;

/// One entry of a source's `scopes`: an exact scope, a prefix (`shop-*`), or everything (`*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScopePattern {
    Exact(String),
    /// Scopes starting with this text (not the unscoped `""`).
    Prefix(String),
    /// Every scope, the unscoped one included.
    Any,
}

/// Longest pattern accepted (a scope is at most 63 bytes).
const MAX_PATTERN_BYTES: usize = 64;

impl ScopePattern {
    /// `shop`, `shop-*`, `*` or `""`; a `*` anywhere but at the end is refused.
    pub fn parse(text: &str) -> Result<ScopePattern, String> {
        if text.len() > MAX_PATTERN_BYTES {
            return Err(format!(
                "scope pattern of {} bytes: at most {MAX_PATTERN_BYTES}",
                text.len()
            ));
        }
        if text == "*" {
            return Ok(ScopePattern::Any);
        }
        let (stem, prefix) = match text.strip_suffix('*') {
            Some(stem) => (stem, true),
            None => (text, false),
        };
        if let Some(bad) = stem
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        {
            return Err(format!(
                "scope pattern {text:?}: {bad:?} is not allowed (write a scope name, a prefix ending in `*` such as `shop-*`, `*` for every scope, or \"\" for unscoped resources)"
            ));
        }
        Ok(if prefix {
            ScopePattern::Prefix(stem.to_owned())
        } else {
            ScopePattern::Exact(stem.to_owned())
        })
    }

    pub fn matches(&self, scope: &str) -> bool {
        match self {
            ScopePattern::Exact(exact) => exact == scope,
            ScopePattern::Prefix(prefix) => !scope.is_empty() && scope.starts_with(prefix.as_str()),
            ScopePattern::Any => true,
        }
    }

    /// Whether some scope matches both patterns.
    fn overlaps(&self, other: &ScopePattern) -> bool {
        match (self, other) {
            (ScopePattern::Any, _) | (_, ScopePattern::Any) => true,
            (ScopePattern::Exact(exact), pattern) | (pattern, ScopePattern::Exact(exact)) => {
                pattern.matches(exact)
            }
            (ScopePattern::Prefix(one), ScopePattern::Prefix(two)) => {
                one.starts_with(two.as_str()) || two.starts_with(one.as_str())
            }
        }
    }
}

impl fmt::Display for ScopePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScopePattern::Exact(exact) if exact.is_empty() => f.write_str("\"\" (unscoped)"),
            ScopePattern::Exact(exact) => f.write_str(exact),
            ScopePattern::Prefix(prefix) => write!(f, "{prefix}*"),
            ScopePattern::Any => f.write_str("*"),
        }
    }
}

/// The scopes each source owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ownership {
    sources: Vec<(String, Vec<ScopePattern>)>,
}

impl Ownership {
    /// The single `--repo` source (`""`) owning every scope.
    pub fn single() -> Ownership {
        Ownership {
            sources: vec![(String::new(), vec![ScopePattern::Any])],
        }
    }

    /// Each source with its patterns; refused when two sources' patterns overlap (the error
    /// names both sources and patterns).
    pub fn new(sources: Vec<(String, Vec<ScopePattern>)>) -> Result<Ownership, String> {
        for (index, (one, patterns)) in sources.iter().enumerate() {
            for (two, others) in &sources[index + 1..] {
                for pattern in patterns {
                    if let Some(other) = others.iter().find(|other| pattern.overlaps(other)) {
                        return Err(format!(
                            "sources {one:?} and {two:?} may both deploy scope {pattern} / {other}: a scope has one owner; give each source its own scopes"
                        ));
                    }
                }
            }
        }
        Ok(Ownership { sources })
    }

    /// The source that owns `scope`, if any.
    pub fn owner_of(&self, scope: &str) -> Option<&str> {
        self.sources
            .iter()
            .find(|(_, patterns)| patterns.iter().any(|pattern| pattern.matches(scope)))
            .map(|(name, _)| name.as_str())
    }

    /// Whether `source` may deploy `scope`.
    pub fn allows(&self, source: &str, scope: &str) -> bool {
        self.owner_of(scope) == Some(source)
    }

    /// The patterns of `source`, as written (`shop, shop-*`).
    pub fn patterns_of(&self, source: &str) -> String {
        self.sources
            .iter()
            .find(|(name, _)| name == source)
            .map(|(_, patterns)| {
                patterns
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patterns(texts: &[&str]) -> Result<Vec<ScopePattern>, String> {
        texts.iter().map(|text| ScopePattern::parse(text)).collect()
    }

    #[test]
    fn patterns_match_names_prefixes_everything_and_the_unscoped() -> Result<(), String> {
        let cases: &[(&str, &str, bool)] = &[
            ("shop", "shop", true),
            ("shop", "shop-a", false),
            ("shop-*", "shop-a", true),
            ("shop-*", "shop", false),
            ("shop-*", "", false),
            ("*", "anything", true),
            ("*", "", true),
            ("", "", true),
            ("", "shop", false),
        ];
        for (pattern, scope, expected) in cases {
            assert_eq!(
                ScopePattern::parse(pattern)?.matches(scope),
                *expected,
                "{pattern} against {scope:?}"
            );
        }
        for bad in ["sh*p", "a b", "../x", "x/y", &"s".repeat(65)] {
            assert!(ScopePattern::parse(bad).is_err(), "{bad} accepted");
        }
        Ok(())
    }

    #[test]
    fn two_sources_allowed_one_scope_is_refused_naming_both() -> Result<(), String> {
        let refused = [
            (vec!["shop"], vec!["shop"]),
            (vec!["shop-*"], vec!["shop-a"]),
            (vec!["shop-*"], vec!["shop-a-*"]),
            (vec!["*"], vec![""]),
            (vec!["a", "b"], vec!["c", "b"]),
        ];
        for (one, two) in refused {
            let error = Ownership::new(vec![
                ("platform".to_owned(), patterns(&one)?),
                ("shop".to_owned(), patterns(&two)?),
            ])
            .err()
            .ok_or(format!("{one:?} and {two:?} both accepted"))?;
            assert!(
                error.contains("\"platform\"") && error.contains("\"shop\""),
                "{error}"
            );
        }
        let ownership = Ownership::new(vec![
            ("platform".to_owned(), patterns(&["ingress", ""])?),
            ("shop".to_owned(), patterns(&["shop-*"])?),
            ("blog".to_owned(), patterns(&["blog", "shopping"])?),
        ])?;
        assert_eq!(ownership.owner_of("shop-web"), Some("shop"));
        assert_eq!(ownership.owner_of("shopping"), Some("blog"));
        assert_eq!(ownership.owner_of(""), Some("platform"));
        assert_eq!(ownership.owner_of("other"), None);
        assert!(ownership.allows("platform", "ingress"));
        assert!(!ownership.allows("shop", "ingress"));
        assert_eq!(
            ownership.patterns_of("platform"),
            "ingress, \"\" (unscoped)"
        );
        assert!(Ownership::single().allows("", "anything"));
        Ok(())
    }
}
