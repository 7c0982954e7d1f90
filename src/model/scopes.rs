//! Which source (repository) may deploy which scope: each source of `--sources` lists the
//! scopes it owns, as names or prefix patterns (`shop`, `shop-*`, `*`), and `""` for the
//! unscoped resources (registries, unscoped assets). The single `--repo` source owns every
//! scope.
//!
//! Ownership reaches past the resource keys: everything a resource points at (config buckets,
//! asset files, volumes, networks, ingress hosts, published ports) belongs to one source, and
//! `Seal` is what one source's commits may point at. The manifest stage judges references with
//! it for `path:line:col`; the runtime's guard and the reconcile stage judge the final values.
//!
//! Invariants: no scope is owned by two sources; `Ownership::new` refuses patterns that
//! overlap, so every scope has at most one owner and `owner_of` is unambiguous. Names the agent
//! derives as `<scope>-<name>` (containers, claims) cannot collide across sources:
//! `Ownership::new` also refuses two sources where a scope of one could be a scope of the
//! other followed by `-` (`shop` and `shop-api`), so `owner_of_derived` is unambiguous too.

use std::fmt;
use std::sync::Arc;

use super::DEFAULT_NETWORK;
use super::host_paths::OwnedPaths;

/// One entry of a source's `scopes`: an exact scope, a prefix (`shop-*`), or everything (`*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScopePattern {
    Exact(String),
    /// Scopes starting with this text (not the unscoped `""`).
    Prefix(String),
    /// Every scope, the unscoped one included.
    Any,
}

/// Why a scope pattern, or the ownership of sources, is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    #[error("scope pattern of {n_bytes} bytes: at most {max}", max = MAX_PATTERN_BYTES)]
    PatternTooLong { n_bytes: usize },
    #[error(
        "scope pattern {pattern:?}: {bad:?} is not allowed (write a scope name, a prefix ending in `*` such as `shop-*`, `*` for every scope, or \"\" for unscoped resources)"
    )]
    BadCharacter { pattern: String, bad: char },
    /// Two sources' patterns `pattern` and `other` can name one scope.
    #[error(
        "sources {one:?} and {two:?} may both deploy scope {pattern} / {other}: a scope has one owner; give each source its own scopes"
    )]
    Overlap {
        one: String,
        two: String,
        pattern: ScopePattern,
        other: ScopePattern,
    },
    /// A scope of one source followed by `-` can be a scope of the other.
    #[error(
        "sources {one:?} and {two:?} own scopes {pattern} and {other}, where one scope can be the other followed by `-` (`shop` and `shop-api`): the agent names containers and volumes `<scope>-<name>`, so `shop-api`/`db` and `shop`/`api-db` would be one name across two sources; give the sources scopes that do not start with another source's scope and `-`"
    )]
    DerivedNames {
        one: String,
        two: String,
        pattern: ScopePattern,
        other: ScopePattern,
    },
}

/// Longest pattern accepted (a scope is at most 63 bytes).
const MAX_PATTERN_BYTES: usize = 64;

impl ScopePattern {
    /// `shop`, `shop-*`, `*` or `""`; a `*` anywhere but at the end is refused.
    pub fn parse(text: &str) -> Result<ScopePattern, ScopeError> {
        if text.len() > MAX_PATTERN_BYTES {
            return Err(ScopeError::PatternTooLong {
                n_bytes: text.len(),
            });
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
            return Err(ScopeError::BadCharacter {
                pattern: text.to_owned(),
                bad,
            });
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

    /// Whether a scope `a` of `self` and a scope `b` of `other` can make one derived name,
    /// `a-x` = `b-y`: one of them is the other followed by `-` and more (`shop`, `shop-api`).
    fn derives_into(&self, other: &ScopePattern) -> bool {
        // Some scope of `self`, followed by `-`, starts some scope of `other`.
        let extends = |one: &ScopePattern, two: &ScopePattern| match (one, two) {
            (ScopePattern::Any, _) | (_, ScopePattern::Any) => true,
            (ScopePattern::Exact(a), ScopePattern::Exact(b)) => {
                !a.is_empty() && b.starts_with(&format!("{a}-"))
            }
            (ScopePattern::Exact(a), ScopePattern::Prefix(p)) => {
                let dashed = format!("{a}-");
                !a.is_empty() && (p.starts_with(&dashed) || dashed.starts_with(p.as_str()))
            }
            (ScopePattern::Prefix(p), ScopePattern::Exact(b)) => {
                // Some `p…` with `-` after it starts `b`: `b` has a `-` at or past `p`'s end.
                b.starts_with(p.as_str()) && b[p.len()..].contains('-')
                    || (p.is_empty() && b.contains('-'))
            }
            (ScopePattern::Prefix(p), ScopePattern::Prefix(q)) => {
                p.starts_with(q.as_str()) || q.starts_with(p.as_str())
            }
        };
        extends(self, other) || extends(other, self)
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
    /// Sources whose containers join the shared `voodu0` network (`network = "shared"` in
    /// the sources file) instead of their own.
    shared_network: Vec<String>,
    /// Sources with branch previews, each with its scope separator (`-pr-`): a scope it owns
    /// shaped `<scope><separator><slug>` is its preview's (`super::previews`).
    previews: Vec<(String, String)>,
}

impl Ownership {
    /// The single `--repo` source (`""`) owning every scope.
    pub fn single() -> Ownership {
        Ownership {
            sources: vec![(String::new(), vec![ScopePattern::Any])],
            shared_network: Vec::new(),
            previews: Vec::new(),
        }
    }

    /// Whether one source owns every scope (the single `--repo` source): then nothing can
    /// cross from one source to another, and the rules only about sources change nothing.
    pub fn is_single(&self) -> bool {
        self.sources.len() == 1
    }

    /// Each source with its patterns; refused when two sources' patterns overlap (the error
    /// names both sources and patterns).
    pub fn new(sources: Vec<(String, Vec<ScopePattern>)>) -> Result<Ownership, ScopeError> {
        for (index, (one, patterns)) in sources.iter().enumerate() {
            for (two, others) in &sources[index + 1..] {
                for pattern in patterns {
                    if let Some(other) = others.iter().find(|other| pattern.overlaps(other)) {
                        return Err(ScopeError::Overlap {
                            one: one.clone(),
                            two: two.clone(),
                            pattern: pattern.clone(),
                            other: other.clone(),
                        });
                    }
                    if let Some(other) = others.iter().find(|other| pattern.derives_into(other)) {
                        return Err(ScopeError::DerivedNames {
                            one: one.clone(),
                            two: two.clone(),
                            pattern: pattern.clone(),
                            other: other.clone(),
                        });
                    }
                }
            }
        }
        Ok(Ownership {
            sources,
            shared_network: Vec::new(),
            previews: Vec::new(),
        })
    }

    /// The same ownership, with branch previews for `previews` (source, scope separator).
    pub fn with_previews(mut self, previews: Vec<(String, String)>) -> Ownership {
        self.previews = previews;
        self
    }

    /// The slug of the preview whose scope `scope` is, with its source's name: `scope`'s
    /// owner has previews and `scope` is `<scope><separator><slug>`.
    fn preview_of<'a>(&'a self, scope: &'a str) -> Option<(&'a str, &'a str)> {
        let owner = self.owner_of(scope)?;
        let (_, separator) = self.previews.iter().find(|(name, _)| name == owner)?;
        let at = scope.rfind(separator.as_str())?;
        let slug = &scope[at + separator.len()..];
        (at > 0 && !slug.is_empty()).then_some((owner, slug))
    }

    /// The source whose resources `scope` holds: its owner, or for a preview scope the
    /// preview's internal source (`shop#feat-x`, `previews::preview_source`).
    pub fn source_of(&self, scope: &str) -> Option<String> {
        match self.preview_of(scope) {
            Some((owner, slug)) => Some(super::previews::preview_source(owner, slug)),
            None => self.owner_of(scope).map(str::to_owned),
        }
    }

    /// The same ownership, with `sources` on the shared `voodu0` network.
    pub fn with_shared_network(mut self, sources: Vec<String>) -> Ownership {
        self.shared_network = sources;
        self
    }

    /// Whether `one` and `two` are scopes of the same source (`false` when either has none).
    pub fn same_owner(&self, one: &str, two: &str) -> bool {
        match (self.owner_of(one), self.owner_of(two)) {
            (Some(a), Some(b)) => a == b,
            _ => false,
        }
    }

    /// The network the containers of `scope` join in place of `voodu0`: their source's own
    /// (`voodu0-<source>`), or `voodu0` itself for the single source, a source that shares
    /// it, and a scope no source owns.
    /// A preview's scope joins its preview's own network (`preview_network`), never its base
    /// source's.
    pub fn network_of(&self, scope: &str) -> String {
        if let Some((owner, slug)) = self.preview_of(scope) {
            return preview_network(owner, slug);
        }
        match self.owner_of(scope) {
            Some(source)
                if !self.is_single() && !self.shared_network.iter().any(|s| s == source) =>
            {
                source_network(source)
            }
            _ => DEFAULT_NETWORK.to_owned(),
        }
    }

    /// Every network the sources' containers join (the ingress proxy joins them all).
    pub fn networks(&self) -> Vec<String> {
        let mut networks = vec![DEFAULT_NETWORK.to_owned()];
        if !self.is_single() {
            networks.extend(
                self.sources
                    .iter()
                    .filter(|(name, _)| !self.shared_network.contains(name))
                    .map(|(name, _)| source_network(name)),
            );
        }
        networks
    }

    /// The source whose network `network` is, when it is a source's own network or a
    /// preview's (then the preview's internal source, `shop#feat-x`).
    pub fn network_owner(&self, network: &str) -> Option<String> {
        let name = network.strip_prefix(SOURCE_NETWORK_PREFIX)?;
        let preview = match name.strip_prefix(PREVIEW_NETWORK_MARK.trim_start_matches('.')) {
            Some(slug) => Some(("", slug)),
            None => name.split_once(PREVIEW_NETWORK_MARK),
        };
        if let Some((base, slug)) = preview {
            return self
                .previews
                .iter()
                .any(|(source, _)| source == base)
                .then(|| super::previews::preview_source(base, slug));
        }
        self.sources
            .iter()
            .map(|(source, _)| source.as_str())
            .find(|source| *source == name)
            .map(str::to_owned)
    }

    /// The network of `source`'s containers: a preview's own, its source's own, or `voodu0`.
    pub fn network_of_source(&self, source: &str) -> String {
        if let Some((base, slug)) = super::previews::split_source(source) {
            return preview_network(base, slug);
        }
        self.networks()
            .into_iter()
            .find(|network| self.network_owner(network).as_deref() == Some(source))
            .unwrap_or_else(|| DEFAULT_NETWORK.to_owned())
    }

    /// The source a name the agent derives as `voodu-<scope>-…` (a statefulset's claim) or
    /// `<scope>-…` belongs to, read from `rest` (the name without `voodu-`): the owner of the
    /// scope it starts with. Unambiguous across sources (see the module docs); `None` when
    /// no source owns such a scope.
    pub fn owner_of_derived(&self, rest: &str) -> Option<&str> {
        self.sources
            .iter()
            .find(|(_, patterns)| {
                patterns.iter().any(|pattern| match pattern {
                    ScopePattern::Exact(scope) => {
                        !scope.is_empty() && rest.starts_with(&format!("{scope}-"))
                    }
                    ScopePattern::Prefix(prefix) => {
                        rest.starts_with(prefix.as_str()) && rest[prefix.len()..].contains('-')
                    }
                    ScopePattern::Any => true,
                })
            })
            .map(|(name, _)| name.as_str())
    }

    /// The source that owns `scope`, if any.
    pub fn owner_of(&self, scope: &str) -> Option<&str> {
        self.sources
            .iter()
            .find(|(_, patterns)| patterns.iter().any(|pattern| pattern.matches(scope)))
            .map(|(name, _)| name.as_str())
    }

    /// Whether `source` may deploy `scope`: a preview's internal source only its own
    /// preview scopes, a source with previews none of its previews' scopes.
    pub fn allows(&self, source: &str, scope: &str) -> bool {
        self.source_of(scope).as_deref() == Some(source)
    }

    /// The patterns of `source`, as written (`shop, shop-*`); for a preview's internal
    /// source, the shape of its scopes (`*-pr-feat-x`).
    pub fn patterns_of(&self, source: &str) -> String {
        if let Some((base, slug)) = super::previews::split_source(source) {
            let separator = self
                .previews
                .iter()
                .find(|(name, _)| name == base)
                .map_or("", |(_, separator)| separator.as_str());
            return format!("<scope>{separator}{slug}, of {}", self.patterns_of(base));
        }
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

/// What a source's own network is named after: `voodu0-<source>`.
pub const SOURCE_NETWORK_PREFIX: &str = "voodu0-";

fn source_network(source: &str) -> String {
    format!("{SOURCE_NETWORK_PREFIX}{source}")
}

/// What stands between a source's name and a preview's slug in the preview's network name;
/// a source's name never holds a `.`, so the two never meet.
const PREVIEW_NETWORK_MARK: &str = ".pr.";

/// The own network of the preview `slug` of `source`: `voodu0-shop.pr.feat-x` (for the single
/// `--repo` source `voodu0-pr.feat-x`); at most 7 + 32 + 4 + `previews::MAX_SLUG` bytes.
pub fn preview_network(source: &str, slug: &str) -> String {
    if source.is_empty() {
        format!(
            "{SOURCE_NETWORK_PREFIX}{}{slug}",
            PREVIEW_NETWORK_MARK.trim_start_matches('.')
        )
    } else {
        format!("{SOURCE_NETWORK_PREFIX}{source}{PREVIEW_NETWORK_MARK}{slug}")
    }
}

/// Whether `network` is a preview's own network (`preview_network`).
pub fn is_preview_network(network: &str) -> bool {
    network
        .strip_prefix(SOURCE_NETWORK_PREFIX)
        .is_some_and(|name| {
            name.starts_with(PREVIEW_NETWORK_MARK.trim_start_matches('.'))
                || name.contains(PREVIEW_NETWORK_MARK)
        })
}

/// What the commits of one source may point at: the scopes `source` owns under `ownership`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seal {
    pub source: String,
    pub ownership: Arc<Ownership>,
}

impl Seal {
    pub fn new(source: &str, ownership: Arc<Ownership>) -> Seal {
        Seal {
            source: source.to_owned(),
            ownership,
        }
    }

    /// Whether this source may point at what belongs to `scope`.
    pub fn owns(&self, scope: &str) -> bool {
        self.ownership.allows(&self.source, scope)
    }

    /// Whether a name the agent derives as `<scope>-…` from `rest` (a statefulset's claim
    /// without `voodu-`) is of a scope this source owns: its owner is this source, or for a
    /// preview's source, its base and `rest` holds the preview's slug as a scope's end.
    pub fn owns_derived(&self, rest: &str) -> bool {
        let owner = self.ownership.owner_of_derived(rest);
        match super::previews::split_source(&self.source) {
            Some((base, slug)) => {
                owner == Some(base)
                    && self
                        .ownership
                        .previews
                        .iter()
                        .find(|(name, _)| name == base)
                        .is_some_and(|(_, separator)| rest.contains(&format!("{separator}{slug}-")))
            }
            None => owner == Some(self.source.as_str()),
        }
    }

    /// Why `what` (e.g. "config bucket shop/web"), which belongs to `scope`, may not be
    /// pointed at by this source; `None` when it may.
    pub fn refusal(&self, what: &str, scope: &str) -> Option<String> {
        if self.owns(scope) {
            return None;
        }
        Some(foreign(what, &self.source, self.ownership.owner_of(scope)))
    }
}

impl Seal {
    /// Why a bind of `path` (its final form: references resolved, folded, and at the sink
    /// with its symlinks resolved) reaches an asset file of a scope this source does not own.
    pub(crate) fn bind_refusal(&self, path: &str, owned: &OwnedPaths) -> Option<String> {
        let scope = owned.asset_scope(path)?;
        self.refusal(&format!("asset file {path}"), scope)
    }
}

/// What the runtime's guard reads of the store: who holds the named volumes (its claims) and
/// which image digests were verified under which keys.
pub trait Ledger: Send + Sync {
    /// The source holding volume `name` and whether it was adopted from the state that
    /// predates claims (see `store/claims.rs`); `None` when no source declared it.
    fn holder(&self, name: &str) -> Result<Option<(String, bool)>, LedgerError>;
    /// Whether `digest` carries a signature verified under the keys whose fingerprint is
    /// `keys` (`assets::cosign::fingerprint`).
    fn verified(&self, digest: &str, keys: &str) -> Result<bool, LedgerError>;
}

/// Why a `Ledger` could not answer: the implementation's own error (the store's), boxed
/// because the model knows nothing of the store.
pub type LedgerError = Box<dyn std::error::Error + Send + Sync>;

/// "`what` belongs to source `owner`; a source points only at what its own scopes hold".
pub fn foreign(what: &str, source: &str, owner: Option<&str>) -> String {
    let owner = match owner {
        Some("") => "the single repository (--repo)".to_owned(),
        Some(owner) => format!("source `{owner}`"),
        None => "no source of --sources".to_owned(),
    };
    format!(
        "{what} belongs to {owner}, not to source `{source}`: a source's resources point only at what its own scopes hold"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patterns(texts: &[&str]) -> Result<Vec<ScopePattern>, String> {
        texts
            .iter()
            .map(|text| ScopePattern::parse(text).map_err(|error| error.to_string()))
            .collect()
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
                ScopePattern::parse(pattern)
                    .map_err(|error| error.to_string())?
                    .matches(scope),
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
                error.to_string().contains("\"platform\"")
                    && error.to_string().contains("\"shop\""),
                "{error}"
            );
        }
        let ownership = Ownership::new(vec![
            ("platform".to_owned(), patterns(&["ingress", ""])?),
            ("shop".to_owned(), patterns(&["shop-*"])?),
            ("blog".to_owned(), patterns(&["blog", "shopping"])?),
        ])
        .map_err(|error| error.to_string())?;
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

    #[test]
    fn scopes_that_could_derive_one_name_across_sources_are_refused() -> Result<(), String> {
        let refused = [
            (vec!["shop"], vec!["shop-api"]),
            (vec!["shop"], vec!["shop-*"]),
            (vec!["shop"], vec!["sho*"]),
            (vec!["a-*"], vec!["a-b-c"]),
            (vec!["shop-*"], vec!["shop-api-*"]),
        ];
        for (one, two) in refused {
            let error = Ownership::new(vec![
                ("one".to_owned(), patterns(&one)?),
                ("two".to_owned(), patterns(&two)?),
            ])
            .err()
            .ok_or(format!("{one:?} and {two:?} both accepted"))?;
            assert!(
                error.to_string().contains("followed by `-`")
                    || error.to_string().contains("may both deploy"),
                "{error}"
            );
        }
        for (one, two) in [
            (vec!["shop"], vec!["shopping"]),
            (vec!["shop"], vec!["blog-*"]),
            (vec!["shop-*"], vec!["shopping"]),
            (vec!["shop", ""], vec!["blog"]),
        ] {
            Ownership::new(vec![
                ("one".to_owned(), patterns(&one)?),
                ("two".to_owned(), patterns(&two)?),
            ])
            .map_err(|error| format!("{one:?} and {two:?}: {error}"))?;
        }
        // One source may hold both: a name it makes twice is its own to untangle.
        Ownership::new(vec![("one".to_owned(), patterns(&["shop", "shop-api"])?)])
            .map_err(|error| error.to_string())?;
        Ok(())
    }

    #[test]
    fn a_preview_source_owns_only_its_own_preview_scopes() -> Result<(), ScopeError> {
        let shop = vec![
            ScopePattern::parse("shop")?,
            ScopePattern::parse("shop-pr-*")?,
        ];
        let ownership = Ownership::new(vec![
            ("shop".to_owned(), shop),
            ("blog".to_owned(), vec![ScopePattern::parse("blog")?]),
        ])?
        .with_previews(vec![("shop".to_owned(), "-pr-".to_owned())]);
        assert!(ownership.allows("shop#feat-x", "shop-pr-feat-x"));
        assert!(!ownership.allows("shop#feat-x", "shop"));
        assert!(!ownership.allows("shop#feat-x", "shop-pr-other"));
        assert!(!ownership.allows("shop#feat-x", "blog"));
        // The base deploys its own scopes, not its previews'.
        assert!(ownership.allows("shop", "shop"));
        assert!(!ownership.allows("shop", "shop-pr-feat-x"));
        assert_eq!(
            ownership.source_of("shop-pr-feat-x").as_deref(),
            Some("shop#feat-x")
        );
        // Claims: a preview's own, never the base's.
        let seal = Seal::new("shop#feat-x", Arc::new(ownership.clone()));
        assert!(seal.owns_derived("shop-pr-feat-x-db-data-0"));
        assert!(!seal.owns_derived("shop-db-data-0"));
        assert!(Seal::new("shop", Arc::new(ownership.clone())).owns_derived("shop-db-data-0"));
        // Networks: a preview's own, never its base's.
        assert_eq!(
            ownership.network_of("shop-pr-feat-x"),
            "voodu0-shop.pr.feat-x"
        );
        assert_eq!(ownership.network_of("shop"), "voodu0-shop");
        assert_eq!(
            ownership.network_owner("voodu0-shop.pr.feat-x").as_deref(),
            Some("shop#feat-x")
        );
        assert_eq!(ownership.network_owner("voodu0-blog.pr.feat-x"), None);
        assert_eq!(
            ownership.network_of_source("shop#feat-x"),
            "voodu0-shop.pr.feat-x"
        );
        assert_eq!(ownership.network_of_source("shop"), "voodu0-shop");
        assert!(is_preview_network("voodu0-shop.pr.feat-x"));
        assert!(!is_preview_network("voodu0-shop"));
        let single = Ownership::single().with_previews(vec![(String::new(), "-pr-".to_owned())]);
        assert_eq!(single.network_of("web-pr-feat-x"), "voodu0-pr.feat-x");
        assert_eq!(single.network_of("web"), "voodu0");
        assert_eq!(
            single.network_owner("voodu0-pr.feat-x").as_deref(),
            Some("#feat-x")
        );
        assert!(is_preview_network("voodu0-pr.feat-x"));
        assert!(!single.networks().iter().any(|n| is_preview_network(n)));
        Ok(())
    }

    #[test]
    fn derived_names_networks_and_seals_follow_the_owner() -> Result<(), String> {
        let ownership = Arc::new(
            Ownership::new(vec![
                ("shop".to_owned(), patterns(&["shop", "shop2-*"])?),
                ("blog".to_owned(), patterns(&["blog"])?),
                ("ops".to_owned(), patterns(&["ops", ""])?),
            ])
            .map_err(|error| error.to_string())?
            .with_shared_network(vec!["ops".to_owned()]),
        );
        assert_eq!(ownership.owner_of_derived("shop-db-data-0"), Some("shop"));
        assert_eq!(
            ownership.owner_of_derived("shop2-x-db-data-0"),
            Some("shop")
        );
        assert_eq!(ownership.owner_of_derived("blog-db-data-0"), Some("blog"));
        assert_eq!(ownership.owner_of_derived("other-db-data-0"), None);
        assert_eq!(ownership.network_of("shop"), "voodu0-shop");
        assert_eq!(ownership.network_of("ops"), "voodu0");
        assert_eq!(ownership.network_of("nobody"), "voodu0");
        assert_eq!(
            ownership.networks(),
            ["voodu0", "voodu0-shop", "voodu0-blog"]
        );
        assert_eq!(
            ownership.network_owner("voodu0-blog").as_deref(),
            Some("blog")
        );
        assert_eq!(
            ownership.network_owner("voodu0-ops").as_deref(),
            Some("ops")
        );
        assert_eq!(ownership.network_owner("voodu0"), None);
        let seal = Seal::new("blog", ownership.clone());
        assert!(seal.owns("blog") && !seal.owns("shop") && !seal.owns(""));
        let owned = OwnedPaths::for_data_dir("/data");
        assert_eq!(seal.bind_refusal("/data/assets/blog/a/k", &owned), None);
        assert!(
            seal.bind_refusal("/data/assets/shop/a/k", &owned)
                .is_some_and(|refusal| refusal.contains("source `shop`"))
        );
        assert!(
            seal.bind_refusal("/data/assets/_unscoped/a/k", &owned)
                .is_some_and(|refusal| refusal.contains("source `ops`"))
        );
        assert_eq!(seal.bind_refusal("/srv/elsewhere", &owned), None);
        // The single source owns everything and has no network of its own.
        let single = Ownership::single();
        assert!(single.is_single() && single.same_owner("a", "b"));
        assert_eq!(single.networks(), ["voodu0"]);
        Ok(())
    }
}
