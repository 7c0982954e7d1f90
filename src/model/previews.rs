//! Branch previews: the rules of a source's `previews { … }` block (or `--preview-*` flags)
//! and the pure decisions they make. A branch matching `branches` gets a preview named by its
//! slug; each resource's scope `shop` becomes `shop-pr-<slug>` (the separator is the
//! template's), an ingress host becomes the host template with `{slug}`, `{scope}` and
//! `{name}` filled in, and the preview's resources are those of an internal source
//! `<source>#<slug>` (`preview_source`), which owns exactly its mapped scopes
//! (`scopes::Ownership::allows`).
//!
//! Invariants: a slug is 1 to `MAX_SLUG` bytes of `[a-z0-9-]`, starts and ends with a letter
//! or digit, and never contains the template's separator; two different branches never get
//! one slug (a branch whose name is not already such a slug gets a hash of its name
//! appended); `decide` keeps at most `max` previews, the oldest first, and a newer branch is
//! refused, never an older preview removed to make room.

use std::time::Duration;

/// The separator between a source's name and a preview's slug in the preview's internal
/// source name (`shop#feat-x`); never in a source's own name.
pub const SOURCE_MARK: char = '#';
/// Longest slug.
pub const MAX_SLUG: usize = 24;
/// Most previews one source may declare (`max`).
pub const MAX_PREVIEWS: usize = 64;
/// Most matching branches one listing reads.
pub const MAX_LISTED: usize = 1000;
/// Longest host template.
const MAX_TEMPLATE: usize = 200;

/// The previews of one source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviewRules {
    /// The branches previewed: `preview/*` (a prefix) or one exact branch name.
    pub branches: String,
    /// What stands between a scope and the slug: `-pr-` for `{scope}-pr-{slug}`.
    pub separator: String,
    /// An ingress host's template: `{slug}.preview.example.com`.
    pub host: String,
    /// A preview without a push for this long is removed.
    pub ttl: Duration,
    /// At most this many previews at once.
    pub max: usize,
    /// The host policy of the previews (the agent's format): it narrows the agent's, never
    /// widens it (`Policy::narrowed`); `None`: the agent's.
    pub policy: Option<super::policy::Policy>,
    /// The resource caps of the previews' resources.
    pub caps: super::policy::Caps,
}

/// A preview as the store remembers it, for `decide`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Known {
    pub slug: String,
    pub branch: String,
    /// The commit it runs (or was refused for).
    pub commit: String,
    /// Unix seconds it was first seen and when its branch last moved.
    pub created: i64,
    pub pushed: i64,
    pub state: State,
}

/// Where a known preview stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Applied: its resources run.
    Live,
    /// Refused (over `max`): applied once a place frees, or its branch moves.
    Refused,
    /// Removed by its `ttl`: applied again only when its branch moves.
    Expired,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Live => "live",
            State::Refused => "refused",
            State::Expired => "expired",
        }
    }

    pub fn parse(text: &str) -> State {
        match text {
            "live" => State::Live,
            "refused" => State::Refused,
            _ => State::Expired,
        }
    }
}

/// What one poll does to the previews of a source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Create or update the preview of `branch` at `commit`.
    Apply {
        slug: String,
        branch: String,
        commit: String,
    },
    /// Refuse the preview: `max` previews run already.
    Refuse {
        slug: String,
        branch: String,
        commit: String,
        message: String,
    },
    /// Remove everything of the preview; `expired`: its ttl ran out (its branch is there).
    Remove {
        slug: String,
        why: String,
        expired: bool,
    },
}

impl PreviewRules {
    /// Checks the rules; the message names what to write.
    pub fn check(&self) -> Result<(), String> {
        let stem = self.branches.strip_suffix('*').unwrap_or(&self.branches);
        if self.branches.is_empty()
            || self.branches.len() > 200
            || stem.contains('*')
            || !stem
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-'))
            || stem.contains("..")
        {
            return Err(format!(
                "previews: branches {:?}: write a branch name or a prefix ending in `*` (letters, digits, `/`, `.`, `_`, `-`), e.g. \"preview/*\"",
                self.branches
            ));
        }
        if self.separator.is_empty()
            || self.separator.len() > 8
            || !self
                .separator
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        {
            return Err(format!(
                "previews: scope {:?}: write `{{scope}}` then 1 to 8 of `a-z`, `0-9`, `-`, then `{{slug}}`, e.g. \"{{scope}}-pr-{{slug}}\"",
                format!("{{scope}}{}{{slug}}", self.separator)
            ));
        }
        if self.host.len() > MAX_TEMPLATE
            || !self.host.contains("{slug}")
            || self
                .host
                .replace("{slug}", "a")
                .replace("{scope}", "a")
                .replace("{name}", "a")
                .chars()
                .any(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'))
        {
            return Err(format!(
                "previews: host {:?}: write a host name holding `{{slug}}` (and optionally `{{scope}}`, `{{name}}`), e.g. \"{{slug}}.preview.example.com\"",
                self.host
            ));
        }
        if self.max == 0 || self.max > MAX_PREVIEWS {
            return Err(format!(
                "previews: max {}: from 1 to {MAX_PREVIEWS}",
                self.max
            ));
        }
        if self.ttl < Duration::from_secs(1) {
            return Err("previews: ttl: at least 1s, e.g. \"72h\"".to_owned());
        }
        Ok(())
    }

    /// Parses a scope template `{scope}SEP{slug}` into its separator.
    pub fn separator_of(template: &str) -> Result<String, String> {
        template
            .strip_prefix("{scope}")
            .and_then(|rest| rest.strip_suffix("{slug}"))
            .map(str::to_owned)
            .ok_or_else(|| {
                format!(
                    "previews: scope {template:?}: write `{{scope}}`, a separator, then `{{slug}}`, e.g. \"{{scope}}-pr-{{slug}}\""
                )
            })
    }

    /// The part of `branch` the pattern matched, when it matches.
    fn matched<'a>(&self, branch: &'a str) -> Option<&'a str> {
        match self.branches.strip_suffix('*') {
            Some(prefix) => branch.strip_prefix(prefix).filter(|rest| !rest.is_empty()),
            None => (branch == self.branches).then_some(branch),
        }
    }

    /// The slug of `branch`, when the pattern matches it.
    pub fn slug(&self, branch: &str) -> Option<String> {
        self.matched(branch)
            .map(|matched| slug_of(matched, &self.separator))
    }

    /// The scope `scope` becomes in the preview `slug`; `None` for the unscoped `""`.
    pub fn map_scope(&self, scope: &str, slug: &str) -> Option<String> {
        (!scope.is_empty()).then(|| format!("{scope}{}{slug}", self.separator))
    }

    /// The slug of the preview owning `scope`, when `scope` is a preview scope.
    pub fn slug_of_scope<'a>(&self, scope: &'a str) -> Option<&'a str> {
        let at = scope.rfind(self.separator.as_str())?;
        let slug = &scope[at + self.separator.len()..];
        (at > 0 && is_slug(slug, &self.separator)).then_some(slug)
    }

    /// The host an ingress `scope/name` answers at in the preview `slug`.
    pub fn map_host(&self, slug: &str, scope: &str, name: &str) -> String {
        self.host
            .replace("{slug}", slug)
            .replace("{scope}", scope)
            .replace("{name}", name)
    }
}

/// `base#slug`: the internal source of a preview.
pub fn preview_source(base: &str, slug: &str) -> String {
    format!("{base}{SOURCE_MARK}{slug}")
}

/// `(base, slug)` of a preview's internal source name.
pub fn split_source(source: &str) -> Option<(&str, &str)> {
    source.split_once(SOURCE_MARK)
}

fn is_slug(text: &str, separator: &str) -> bool {
    !text.is_empty()
        && text.len() <= MAX_SLUG
        && text
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !text.starts_with('-')
        && !text.ends_with('-')
        && !text.contains(separator)
}

/// The slug of the matched part of a branch name: itself when it is already a slug, else its
/// letters and digits lowercased, runs of anything else as one `-`, cut short, with the first
/// 6 hex digits of its name's SHA-256 appended (so two branches never share one).
pub fn slug_of(matched: &str, separator: &str) -> String {
    if is_slug(matched, separator) {
        return matched.to_owned();
    }
    use sha2::{Digest as _, Sha256};
    let digest = Sha256::digest(matched.as_bytes());
    let hash: String = digest[..3].iter().map(|b| format!("{b:02x}")).collect();
    let mut cleaned = String::new();
    for c in matched.chars() {
        if c.is_ascii_alphanumeric() {
            cleaned.push(c.to_ascii_lowercase());
        } else if !cleaned.ends_with('-') {
            cleaned.push('-');
        }
    }
    let mut cleaned = cleaned.replace(separator, "-");
    cleaned.truncate(MAX_SLUG - hash.len() - 1);
    let cleaned = cleaned.trim_matches('-');
    if cleaned.is_empty() {
        format!("b-{hash}")
    } else {
        format!("{cleaned}-{hash}")
    }
}

/// What a poll does, given the previews known, the matching branches listed with their tips
/// (`(branch, commit)`), the time (`now`, unix seconds) and the rules: a moved or new branch
/// is applied, unless `max` live previews exist (then refused, the oldest kept); a branch gone
/// or a preview whose last push is older than `ttl` is removed.
pub fn decide(
    rules: &PreviewRules,
    known: &[Known],
    listed: &[(String, String)],
    now: i64,
) -> Vec<Step> {
    let ttl = i64::try_from(rules.ttl.as_secs()).unwrap_or(i64::MAX);
    let tip_of = |branch: &str| {
        listed
            .iter()
            .find(|(listed, _)| listed == branch)
            .map(|(_, commit)| commit)
    };
    let mut steps = Vec::new();
    let mut live: usize = 0;
    for preview in known {
        match tip_of(&preview.branch) {
            None => steps.push(Step::Remove {
                slug: preview.slug.clone(),
                why: format!("branch {} deleted", preview.branch),
                expired: false,
            }),
            Some(tip)
                if preview.state == State::Live
                    && *tip == preview.commit
                    && now.saturating_sub(preview.pushed) >= ttl =>
            {
                steps.push(Step::Remove {
                    slug: preview.slug.clone(),
                    why: format!(
                        "no push to {} for {}",
                        preview.branch,
                        humantime::format_duration(rules.ttl)
                    ),
                    expired: true,
                });
            }
            Some(_) if preview.state == State::Live => live += 1,
            Some(_) => {}
        }
    }
    // New branches and moved tips: the previews already live first, then the refused ones
    // oldest first, then new branches by name.
    let mut candidates: Vec<(&String, &String, Option<&Known>)> = listed
        .iter()
        .filter_map(|(branch, commit)| {
            let known = known.iter().find(|preview| preview.branch == *branch);
            let settled = known.is_some_and(|preview| {
                preview.commit == *commit && preview.state != State::Refused
            });
            (!settled).then_some((branch, commit, known))
        })
        .collect();
    candidates.sort_unstable_by_key(|(branch, _, known)| {
        (
            !known.is_some_and(|preview| preview.state == State::Live),
            known.map_or(i64::MAX, |preview| preview.created),
            (*branch).clone(),
        )
    });
    for (branch, commit, known) in candidates {
        let Some(slug) = rules.slug(branch) else {
            continue;
        };
        let apply = Step::Apply {
            slug: slug.clone(),
            branch: branch.clone(),
            commit: commit.clone(),
        };
        match known {
            Some(preview) if preview.state == State::Live => steps.push(apply),
            _ if live < rules.max => {
                live += 1;
                steps.push(apply);
            }
            Some(preview) if preview.commit == *commit => {}
            _ => steps.push(Step::Refuse {
                slug,
                branch: branch.clone(),
                commit: commit.clone(),
                message: format!(
                    "not previewed: {} previews run already (max = {}); delete one of their branches",
                    rules.max, rules.max
                ),
            }),
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(max: usize) -> PreviewRules {
        PreviewRules {
            branches: "preview/*".to_owned(),
            separator: "-pr-".to_owned(),
            host: "{slug}.preview.example.com".to_owned(),
            ttl: Duration::from_secs(100),
            max,
            policy: None,
            caps: crate::model::policy::Caps::default(),
        }
    }

    #[test]
    fn a_slug_is_dns_safe_bounded_and_never_shared() {
        let rules = rules(5);
        assert_eq!(rules.slug("preview/feat-x").as_deref(), Some("feat-x"));
        assert_eq!(rules.slug("main"), None);
        assert_eq!(rules.slug("preview/"), None);
        let odd = rules.slug("preview/Feat_X").unwrap_or_default();
        assert!(
            odd.starts_with("feat-x-") && odd.len() == "feat-x-".len() + 6,
            "{odd}"
        );
        let other = rules.slug("preview/feat_x").unwrap_or_default();
        assert_ne!(odd, other);
        assert_ne!(other, "feat-x");
        let long = rules
            .slug(&format!("preview/{}", "a".repeat(200)))
            .unwrap_or_default();
        assert!(long.len() <= MAX_SLUG, "{long}");
        let symbols = rules.slug("preview/___").unwrap_or_default();
        assert!(symbols.starts_with("b-"), "{symbols}");
        // The separator never appears in a slug: the scope's slug reads back.
        let tricky = rules.slug("preview/my-pr-fix").unwrap_or_default();
        assert!(!tricky.contains("-pr-"), "{tricky}");
        for slug in [odd, other, long, symbols, tricky] {
            assert!(is_slug(&slug, "-pr-"), "{slug}");
            let scope = rules.map_scope("shop", &slug).unwrap_or_default();
            assert_eq!(rules.slug_of_scope(&scope), Some(slug.as_str()));
        }
    }

    #[test]
    fn scopes_and_hosts_map_by_the_templates() {
        let mut rules = rules(5);
        assert_eq!(
            rules.map_scope("shop", "feat-x").as_deref(),
            Some("shop-pr-feat-x")
        );
        assert_eq!(rules.map_scope("", "feat-x"), None);
        assert_eq!(
            rules.map_host("feat-x", "shop", "web"),
            "feat-x.preview.example.com"
        );
        rules.host = "{name}-{slug}.{scope}.test".to_owned();
        assert_eq!(
            rules.map_host("feat-x", "shop", "web"),
            "web-feat-x.shop.test"
        );
        assert_eq!(rules.slug_of_scope("shop-pr-feat-x"), Some("feat-x"));
        assert_eq!(rules.slug_of_scope("shop"), None);
        assert_eq!(rules.slug_of_scope("-pr-x"), None);
        assert_eq!(
            PreviewRules::separator_of("{scope}-pr-{slug}").as_deref(),
            Ok("-pr-")
        );
        assert!(PreviewRules::separator_of("pr-{slug}").is_err());
        assert!(rules.check().is_ok());
        rules.host = "preview.example.com".to_owned();
        assert!(rules.check().is_err());
        let mut bad = self::rules(0);
        assert!(bad.check().is_err());
        bad.max = 1;
        bad.branches = "pre*view/*".to_owned();
        assert!(bad.check().is_err());
        bad.branches = "preview:x/*".to_owned();
        assert!(bad.check().is_err());
        bad.branches = "release/v1.2".to_owned();
        assert!(bad.check().is_ok());
    }

    fn known(slug: &str, commit: &str, created: i64, pushed: i64, live: bool) -> Known {
        let state = if live { State::Live } else { State::Refused };
        Known {
            slug: slug.to_owned(),
            branch: format!("preview/{slug}"),
            commit: commit.to_owned(),
            created,
            pushed,
            state,
        }
    }

    fn listed(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(slug, commit)| (format!("preview/{slug}"), (*commit).to_owned()))
            .collect()
    }

    #[test]
    fn a_push_applies_an_unchanged_branch_does_nothing_a_deleted_one_is_removed() {
        let rules = rules(5);
        let none = decide(&rules, &[], &listed(&[("a", "1")]), 10);
        assert_eq!(
            none,
            vec![Step::Apply {
                slug: "a".into(),
                branch: "preview/a".into(),
                commit: "1".into()
            }]
        );
        let running = [known("a", "1", 10, 10, true)];
        assert!(decide(&rules, &running, &listed(&[("a", "1")]), 20).is_empty());
        assert!(matches!(
            decide(&rules, &running, &listed(&[("a", "2")]), 20).as_slice(),
            [Step::Apply { commit, .. }] if commit == "2"
        ));
        assert!(matches!(
            decide(&rules, &running, &[], 20).as_slice(),
            [Step::Remove { slug, why, expired: false }] if slug == "a" && why.contains("deleted")
        ));
    }

    #[test]
    fn max_keeps_the_oldest_and_refuses_the_newest() {
        let rules = rules(2);
        let running = [known("a", "1", 10, 10, true), known("b", "1", 11, 11, true)];
        let steps = decide(
            &rules,
            &running,
            &listed(&[("a", "1"), ("b", "1"), ("c", "1")]),
            20,
        );
        assert!(
            matches!(steps.as_slice(), [Step::Refuse { slug, message, .. }] if slug == "c" && message.contains("max = 2")),
            "{steps:?}"
        );
        // Refused once, not again for the same commit; taken once a place frees.
        let refused = [
            running[0].clone(),
            running[1].clone(),
            known("c", "1", 12, 12, false),
        ];
        assert!(
            decide(
                &rules,
                &refused,
                &listed(&[("a", "1"), ("b", "1"), ("c", "1")]),
                20
            )
            .is_empty()
        );
        let steps = decide(&rules, &refused, &listed(&[("a", "1"), ("c", "1")]), 20);
        assert!(steps.contains(&Step::Apply {
            slug: "c".into(),
            branch: "preview/c".into(),
            commit: "1".into()
        }));
        assert!(matches!(steps[0], Step::Remove { ref slug, .. } if slug == "b"));
    }

    #[test]
    fn ttl_removes_a_preview_without_a_push_and_a_push_renews_it() {
        let rules = rules(5);
        let running = [known("a", "1", 10, 10, true)];
        assert!(decide(&rules, &running, &listed(&[("a", "1")]), 109).is_empty());
        assert!(matches!(
            decide(&rules, &running, &listed(&[("a", "1")]), 110).as_slice(),
            [Step::Remove { why, expired: true, .. }] if why.contains("no push")
        ));
        // Once removed it stays so; a push after the ttl ran out is a new life.
        let expired = [Known {
            state: State::Expired,
            ..running[0].clone()
        }];
        assert!(decide(&rules, &expired, &listed(&[("a", "1")]), 500).is_empty());
        assert!(matches!(
            decide(&rules, &expired, &listed(&[("a", "2")]), 500).as_slice(),
            [Step::Apply { commit, .. }] if commit == "2"
        ));
    }
}
