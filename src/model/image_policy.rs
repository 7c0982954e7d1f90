//! Image update policies (`image_update { policy = … }`): which of a repository's tags is the
//! latest a resource should run. Pure: a list of tags in, one tag (or none) out.
//!
//! - `semver`: tags that are semantic versions (a leading `v` allowed), within `range` (Cargo's
//!   requirement syntax: `~1.4`, `^1`, `>=1.2, <2`; empty = any release). A pre-release tag is
//!   chosen only when the range itself names a pre-release of the same `major.minor.patch`
//!   (`>=2.0.0-rc.1`), as Cargo and Flux do.
//! - `numerical`: tags (or the part `extract` picks) that are numbers; the highest wins.
//! - `alphabetical`: the tag (or the extracted part) that sorts last by bytes (RFC 3339
//!   timestamps, `main-20260101T1200`).
//! - `digest`: one tag followed by the manifest digest it names (a mutable tag, `stable`,
//!   pinned in git as `name:tag@sha256:…` and moved when the registry's tag moves); the image
//!   scanner asks the registry for the tag's digest instead of listing tags.
//!
//! `filter` is a regular expression a tag must match; `extract` (`"$1"`, `"$ts"`) expands its
//! captures into the value that is ordered. A filter that matches nothing yields no tag.
//!
//! Invariants: never a downgrade (`update` offers a tag only when it orders above the current
//! one, or the current one does not fit the policy at all); ties between tags with equal values
//! (`v1.2.0`, `1.2.0`) break by the tag's bytes, so the choice does not depend on the order the
//! registry lists them in.

use std::cmp::Ordering;
use std::fmt;

/// How tags are ordered.
#[derive(Debug, Clone)]
enum Order {
    Semver(semver::VersionReq),
    Numerical,
    Alphabetical,
    Digest,
}

/// A checked policy: build it with `ImagePolicy::new`, ask it for `latest` or `update`.
#[derive(Debug, Clone)]
pub struct ImagePolicy {
    order: Order,
    filter: Option<regex_lite::Regex>,
    extract: String,
}

/// Why a policy's fields do not make a policy; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    /// `policy`, `range`, `filter` or `extract`.
    pub field: &'static str,
    pub message: String,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` {}", self.field, self.message)
    }
}

impl std::error::Error for PolicyError {}

/// The longest `filter` accepted, in bytes, and the compiled size it may reach.
const MAX_FILTER: usize = 1024;
const MAX_FILTER_PROGRAM: usize = 1 << 20;

/// A value a tag orders by.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Version(semver::Version),
    Number(f64),
    Text(String),
}

impl ImagePolicy {
    /// Checks the fields of an `image_update` block. `policy` is `semver` (the default when
    /// empty), `numerical` or `alphabetical`; `range` is for `semver` only; `extract` needs a
    /// `filter`.
    pub fn new(
        policy: &str,
        range: &str,
        filter: &str,
        extract: &str,
    ) -> Result<ImagePolicy, PolicyError> {
        let order = match policy {
            "" | "semver" => {
                let range = range.trim();
                let requirement = if range.is_empty() {
                    Ok(semver::VersionReq::STAR)
                } else {
                    semver::VersionReq::parse(range)
                };
                Order::Semver(requirement.map_err(|error| PolicyError {
                    field: "range",
                    message: format!(
                        "{range:?} is not a semver range ({error}): write e.g. \"~1.4\", \"^2\" or \">=1.2, <2\""
                    ),
                })?)
            }
            "numerical" | "alphabetical" if !range.is_empty() => {
                return Err(PolicyError {
                    field: "range",
                    message: format!(
                        "is for policy \"semver\" only; policy {policy:?} orders every tag the filter keeps"
                    ),
                });
            }
            "numerical" => Order::Numerical,
            "alphabetical" => Order::Alphabetical,
            "digest" if !range.is_empty() || !filter.is_empty() || !extract.is_empty() => {
                return Err(PolicyError {
                    field: if range.is_empty() { "filter" } else { "range" },
                    message: "is not for policy \"digest\": it follows the one tag the image names"
                        .to_owned(),
                });
            }
            "digest" => Order::Digest,
            other => {
                return Err(PolicyError {
                    field: "policy",
                    message: format!(
                        "{other:?} is not a policy: use \"semver\", \"numerical\", \"alphabetical\" or \"digest\""
                    ),
                });
            }
        };
        if filter.len() > MAX_FILTER {
            return Err(PolicyError {
                field: "filter",
                message: format!("is {} bytes, above the limit of {MAX_FILTER}", filter.len()),
            });
        }
        let filter = if filter.is_empty() {
            None
        } else {
            Some(
                regex_lite::RegexBuilder::new(filter)
                    .size_limit(MAX_FILTER_PROGRAM)
                    .build()
                    .map_err(|error| PolicyError {
                        field: "filter",
                        message: format!(
                            "{filter:?} is not a regular expression: {}",
                            one_line(&error.to_string())
                        ),
                    })?,
            )
        };
        if !extract.is_empty() {
            let Some(regex) = &filter else {
                return Err(PolicyError {
                    field: "extract",
                    message: "needs a `filter` whose groups it names (e.g. filter = \"^main-([0-9]+)$\", extract = \"$1\")".to_owned(),
                });
            };
            check_extract(regex, extract)?;
        }
        Ok(ImagePolicy {
            order,
            filter,
            extract: extract.to_owned(),
        })
    }

    /// Whether the policy follows its tag's digest (`digest`) rather than newer tags.
    pub fn follows_digest(&self) -> bool {
        matches!(self.order, Order::Digest)
    }

    /// The latest of `tags` under this policy, or `None` when no tag fits it.
    pub fn latest<'t>(&self, tags: &'t [String]) -> Option<&'t str> {
        let mut best: Option<(&'t str, Value)> = None;
        for tag in tags {
            let Some(value) = self.value(tag) else {
                continue;
            };
            let better = match &best {
                None => true,
                Some((best_tag, best_value)) => match compare(&value, best_value) {
                    Ordering::Greater => true,
                    Ordering::Equal => tag.as_str() > *best_tag,
                    Ordering::Less => false,
                },
            };
            if better {
                best = Some((tag, value));
            }
        }
        best.map(|(tag, _)| tag)
    }

    /// The tag to move to from `current`: the latest, when it orders above `current` (or
    /// `current` does not fit the policy). Never a downgrade, never the same tag.
    pub fn update<'t>(&self, current: &str, tags: &'t [String]) -> Option<&'t str> {
        let latest = self.latest(tags)?;
        if latest == current {
            return None;
        }
        let newer = match self.ordered_value(current) {
            None => true,
            Some(current) => self
                .value(latest)
                .is_some_and(|latest| compare(&latest, &current) == Ordering::Greater),
        };
        newer.then_some(latest)
    }

    /// The value `tag` orders by, when it passes the filter and fits the policy (for semver:
    /// within the range).
    fn value(&self, tag: &str) -> Option<Value> {
        let value = self.ordered_value(tag)?;
        match (&self.order, &value) {
            (Order::Semver(range), Value::Version(version)) => {
                range.matches(version).then_some(value)
            }
            _ => Some(value),
        }
    }

    /// The value `tag` orders by, range aside (a current tag outside the range still orders).
    fn ordered_value(&self, tag: &str) -> Option<Value> {
        let text = match &self.filter {
            None => tag.to_owned(),
            Some(regex) => {
                let captures = regex.captures(tag)?;
                if self.extract.is_empty() {
                    tag.to_owned()
                } else {
                    let mut out = String::new();
                    captures.expand(&self.extract, &mut out);
                    out
                }
            }
        };
        match &self.order {
            Order::Semver(_) => {
                let bare = text.strip_prefix('v').unwrap_or(&text);
                semver::Version::parse(bare).ok().map(Value::Version)
            }
            Order::Numerical => text
                .parse::<f64>()
                .ok()
                .filter(|number| number.is_finite())
                .map(Value::Number),
            Order::Alphabetical => (!text.is_empty()).then_some(Value::Text(text)),
            // Tags are not ordered: the scanner asks for the tag's digest.
            Order::Digest => None,
        }
    }
}

/// An image reference's repository and tag: `ghcr.io/acme/web:1.4.2` → (`ghcr.io/acme/web`,
/// `1.4.2`), `localhost:5000/app:2` → (`localhost:5000/app`, `2`). `None` without a tag (or
/// with a digest).
pub fn split_image(image: &str) -> Option<(&str, &str)> {
    if image.contains('@') {
        return None;
    }
    let last_slash = image.rfind('/').map_or(0, |at| at + 1);
    let colon = image[last_slash..].rfind(':')? + last_slash;
    let (repository, tag) = (&image[..colon], &image[colon + 1..]);
    (!repository.is_empty() && !tag.is_empty()).then_some((repository, tag))
}

/// The registry host of an image reference: its first path component when that looks like a
/// host (`ghcr.io/x`, `localhost:5000/x`), else Docker Hub.
pub fn registry_host(image: &str) -> &str {
    match image.split_once('/') {
        Some((first, _)) if first.contains('.') || first.contains(':') || first == "localhost" => {
            first
        }
        _ => "docker.io",
    }
}

/// Whether `tag` is a tag as the OCI distribution spec writes them
/// (`[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`): only such a tag is ever chosen, or written into a
/// manifest (a registry's answer is hostile: a quote or a `${` would be HCL).
pub fn is_valid_tag(tag: &str) -> bool {
    let mut chars = tag.chars();
    tag.len() <= 128
        && chars
            .next()
            .is_some_and(|first| first.is_ascii_alphanumeric() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// The tag of an image reference (see `split_image`).
pub fn image_tag(image: &str) -> Option<&str> {
    split_image(image).map(|(_, tag)| tag)
}

fn compare(a: &Value, b: &Value) -> Ordering {
    match (a, b) {
        (Value::Version(a), Value::Version(b)) => a.cmp(b),
        (Value::Number(a), Value::Number(b)) => a.total_cmp(b),
        (Value::Text(a), Value::Text(b)) => a.as_bytes().cmp(b.as_bytes()),
        // One policy yields one kind of value.
        _ => Ordering::Equal,
    }
}

/// Every `$name` / `${name}` / `$1` in `extract` names a group of `regex`.
fn check_extract(regex: &regex_lite::Regex, extract: &str) -> Result<(), PolicyError> {
    let mut rest = extract;
    while let Some(at) = rest.find('$') {
        rest = &rest[at + 1..];
        if let Some(after) = rest.strip_prefix('$') {
            rest = after;
            continue;
        }
        let (name, after) = if let Some(braced) = rest.strip_prefix('{') {
            match braced.split_once('}') {
                Some((name, after)) => (name, after),
                None => {
                    return Err(PolicyError {
                        field: "extract",
                        message: format!("{extract:?} has an unclosed `${{`"),
                    });
                }
            }
        } else {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            (&rest[..end], &rest[end..])
        };
        let known = match name.parse::<usize>() {
            Ok(index) => index < regex.captures_len(),
            Err(_) => !name.is_empty() && regex.capture_names().flatten().any(|n| n == name),
        };
        if !known {
            return Err(PolicyError {
                field: "extract",
                message: format!(
                    "{extract:?} names group `{name}`, which the filter does not have (it has {} numbered group(s))",
                    regex.captures_len().saturating_sub(1)
                ),
            });
        }
        rest = after;
    }
    Ok(())
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `(name, digest)` of a reference pinned by digest (`name[:tag]@sha256:…`), the tag dropped.
pub fn split_digest(image: &str) -> Option<(&str, &str)> {
    let (name, digest) = image.split_once('@')?;
    digest
        .starts_with("sha256:")
        .then(|| (repository_of(name), digest))
}

/// The repository of `name[:tag]` (a registry's port is not a tag).
pub fn repository_of(image: &str) -> &str {
    let image = image.split_once('@').map_or(image, |(name, _)| name);
    let last_slash = image.rfind('/').map_or(0, |at| at + 1);
    match image[last_slash..].rfind(':') {
        Some(colon) => &image[..last_slash + colon],
        None => image,
    }
}

/// The short form of what an image runs as, for `releases` and `status`: the first 12 hex
/// digits of its digest (`sha256:` dropped).
pub fn short_digest(pinned: &str) -> &str {
    let digest = pinned.rsplit_once('@').map_or(pinned, |(_, digest)| digest);
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    hex.get(..12).unwrap_or(hex)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(list: &str) -> Vec<String> {
        list.split_whitespace().map(str::to_owned).collect()
    }

    /// `(policy, range, filter, extract, tags, latest)`.
    type Case = (
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        Option<&'static str>,
    );

    #[test]
    fn latest_by_policy() -> Result<(), PolicyError> {
        let cases: &[Case] = &[
            // semver: ranges, pre-releases only when the range names one.
            (
                "semver",
                "~1.4",
                "",
                "",
                "1.4.2 1.4.3 1.5.0 2.0.0",
                Some("1.4.3"),
            ),
            (
                "semver",
                "^1",
                "",
                "",
                "1.4.2 1.4.3 1.5.0 2.0.0",
                Some("1.5.0"),
            ),
            (
                "semver",
                "",
                "",
                "",
                "1.4.2 2.0.0 latest 2.1.0-rc.1",
                Some("2.0.0"),
            ),
            ("semver", "~1.4", "", "", "1.4.2 1.4.4-rc.1", Some("1.4.2")),
            (
                "semver",
                ">=1.4.4-rc.1",
                "",
                "",
                "1.4.2 1.4.4-rc.1 1.4.4-rc.2",
                Some("1.4.4-rc.2"),
            ),
            (
                "semver",
                ">=1.4.4-rc.1",
                "",
                "",
                "1.4.4-rc.2 1.4.4",
                Some("1.4.4"),
            ),
            (
                "semver",
                ">=2.0.0-alpha",
                "",
                "",
                "2.0.0-alpha 2.0.0-beta.2 2.0.0-beta.11",
                Some("2.0.0-beta.11"),
            ),
            ("semver", "~1.4", "", "", "v1.4.2 1.4.2", Some("v1.4.2")),
            ("semver", "~3", "", "", "1.4.2 2.0.0", None),
            ("semver", "", "", "", "latest stable 1.4", None),
            (
                "semver",
                "",
                "^app-(.*)$",
                "$1",
                "app-1.2.0 app-1.10.0 other-9.0.0",
                Some("app-1.10.0"),
            ),
            // numerical with a filter and extract.
            ("numerical", "", "", "", "3 20 100 latest", Some("100")),
            // `\d` is an ASCII digit, as in Go's RE2 (Flux's filters): other scripts' digits
            // are not, so `main-٩` (Arabic-Indic nine, after `7` alphabetically) is filtered
            // out.
            (
                "alphabetical",
                "",
                r"^main-(\d+)$",
                "$1",
                "main-1 main-7 main-\u{669}",
                Some("main-7"),
            ),
            (
                "numerical",
                "",
                "^main-([0-9]+)$",
                "$1",
                "main-9 main-10 main-2 dev-99 main-x",
                Some("main-10"),
            ),
            (
                "numerical",
                "",
                "^main-(?P<n>[0-9]+)-[a-f0-9]+$",
                "$n",
                "main-7-abc main-12-def main-3-fff",
                Some("main-12-def"),
            ),
            (
                "numerical",
                "",
                "^build-(.*)$",
                "${1}",
                "build-1.5 build-1.25",
                Some("build-1.5"),
            ),
            // alphabetical.
            (
                "alphabetical",
                "",
                "",
                "",
                "2026-01-02 2026-01-10 2025-12-31",
                Some("2026-01-10"),
            ),
            (
                "alphabetical",
                "",
                "^main-",
                "",
                "main-a main-b zz",
                Some("main-b"),
            ),
            (
                "alphabetical",
                "",
                "^rel-(.*)$",
                "$1",
                "rel-b zzz rel-c",
                Some("rel-c"),
            ),
            // a filter that matches nothing.
            ("numerical", "", "^nightly-[0-9]+$", "", "1 2 3", None),
            ("semver", "", "^release/", "", "1.0.0 2.0.0", None),
            ("alphabetical", "", "^x", "", "", None),
        ];
        for (policy, range, filter, extract, list, want) in cases {
            let checked = ImagePolicy::new(policy, range, filter, extract)?;
            let list = tags(list);
            assert_eq!(
                checked.latest(&list),
                *want,
                "{policy} range={range:?} filter={filter:?} extract={extract:?} over {list:?}"
            );
        }
        Ok(())
    }

    #[test]
    fn images_split_into_repository_and_tag() {
        let cases: &[(&str, Option<(&str, &str)>)] = &[
            ("app:1.4.2", Some(("app", "1.4.2"))),
            (
                "ghcr.io/acme/web:1.4.2",
                Some(("ghcr.io/acme/web", "1.4.2")),
            ),
            ("localhost:5000/app:2", Some(("localhost:5000/app", "2"))),
            ("localhost:5000/app", None),
            ("nginx", None),
            ("nginx@sha256:abc", None),
            ("nginx:", None),
        ];
        for (image, want) in cases {
            assert_eq!(split_image(image), *want, "{image}");
        }
    }

    #[test]
    fn latest_does_not_depend_on_listing_order() -> Result<(), PolicyError> {
        let policy = ImagePolicy::new("semver", "", "", "")?;
        let mut list = tags("1.2.0 v1.2.0 1.1.0");
        let first = policy.latest(&list).map(str::to_owned);
        list.reverse();
        assert_eq!(policy.latest(&list).map(str::to_owned), first);
        assert_eq!(first.as_deref(), Some("v1.2.0"));
        Ok(())
    }

    /// `(policy, range, current, tags, update)`.
    #[test]
    fn updates_never_downgrade() -> Result<(), PolicyError> {
        let cases: &[(&str, &str, &str, &str, Option<&str>)] = &[
            (
                "semver",
                "~1.4",
                "1.4.2",
                "1.4.2 1.4.3 1.5.0",
                Some("1.4.3"),
            ),
            ("semver", "~1.4", "1.4.3", "1.4.2 1.4.3 1.5.0", None),
            ("semver", "~1.4", "1.5.0", "1.4.2 1.4.3", None),
            ("semver", "~1.4", "latest", "1.4.2 1.4.3", Some("1.4.3")),
            ("numerical", "", "20", "3 20 100", Some("100")),
            ("numerical", "", "100", "3 20", None),
            ("alphabetical", "", "b", "a b c", Some("c")),
        ];
        for (policy, range, current, list, want) in cases {
            let checked = ImagePolicy::new(policy, range, "", "")?;
            let list = tags(list);
            assert_eq!(
                checked.update(current, &list),
                *want,
                "{policy} {range} from {current} over {list:?}"
            );
        }
        Ok(())
    }

    /// `(policy, range, filter, extract, field, message part)`.
    #[test]
    fn bad_fields_are_named() {
        let cases: &[(&str, &str, &str, &str, &str, &str)] = &[
            ("newest", "", "", "", "policy", "is not a policy"),
            ("semver", "~x.4", "", "", "range", "is not a semver range"),
            (
                "numerical",
                "~1",
                "",
                "",
                "range",
                "for policy \"semver\" only",
            ),
            (
                "semver",
                "",
                "^(main",
                "",
                "filter",
                "is not a regular expression",
            ),
            ("numerical", "", "", "$1", "extract", "needs a `filter`"),
            (
                "numerical",
                "",
                "^main-[0-9]+$",
                "$1",
                "extract",
                "group `1`",
            ),
            (
                "numerical",
                "",
                "^(?P<n>[0-9]+)$",
                "$m",
                "extract",
                "group `m`",
            ),
            ("numerical", "", "^([0-9]+)$", "${1", "extract", "unclosed"),
        ];
        for (policy, range, filter, extract, field, part) in cases {
            match ImagePolicy::new(policy, range, filter, extract) {
                Ok(_) => panic!("{policy} {range} {filter} {extract} accepted"),
                Err(error) => {
                    assert_eq!(error.field, *field, "{error}");
                    assert!(error.message.contains(part), "{error}");
                }
            }
        }
        let long = "a".repeat(MAX_FILTER + 1);
        assert!(ImagePolicy::new("alphabetical", "", &long, "").is_err());
    }
}
