//! Interpolation: `${VAR}` / `${VAR:-default}` resolved while decoding, `${asset.…}` and
//! `${ref.…}` kept literal (resolved on the host at reconcile time, as voodu does) but recorded
//! so the commit can be checked and asset digests stamped (spec §3).
//!
//! Where `${VAR}` values come from, later layers winning (spec §3.1, adapted to a host-side
//! agent): the config buckets a file's blocks read through `env_from` (a bare `x` is scope
//! bucket `x`, `a/b` is app bucket `b` of scope `a`), then each two-label block's own app
//! bucket, then `Vars::globals` (the agent's `--allow-env` list, or `--var` for
//! validate/plan). Never the agent's whole environment.
//!
//! Invariant: this module does no IO; it only reads the values it is given.

use std::collections::BTreeMap;

use hcl::edit::expr::Expression;
use hcl::edit::structure::{BlockLabel, Body, Structure};

use crate::model::Kind;

/// Every `${VAR}` value source for one load.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Vars {
    /// Config buckets by `(scope, name)`; `name` is empty for a scope-level bucket.
    pub(crate) buckets: BTreeMap<(String, String), BTreeMap<String, String>>,
    /// Values that win over buckets: the agent's allow-listed environment, or `--var`.
    pub globals: BTreeMap<String, String>,
}

/// A reference a spec makes to something else, kept literal in the spec.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Reference {
    /// `${asset.<scope>.<name>.<key>}` or `${asset.<name>.<key>}` (unscoped asset).
    Asset {
        scope: Option<String>,
        name: String,
        key: String,
    },
    /// `${ref.<kind>.<name>.<field>}`: a field of another resource's status, same scope.
    Resource {
        kind: Kind,
        name: String,
        field: String,
    },
    /// A `depends_on.resources` entry (an extension): a deployment or statefulset, of
    /// `scope` (`None`: the dependent's own), as `entry` writes it.
    Dependency {
        kind: Kind,
        scope: Option<String>,
        name: String,
        entry: String,
    },
}

impl Reference {
    /// The digest key voodu stamps into `_asset_digests`: `scope.name.key` or `name.key`.
    pub(crate) fn asset_ref(scope: Option<&str>, name: &str, key: &str) -> String {
        match scope {
            Some(scope) => format!("{scope}.{name}.{key}"),
            None => format!("{name}.{key}"),
        }
    }
}

/// What one `${…}` resolved to.
pub(crate) enum Resolved {
    /// Text to insert (a variable's value, or a reference's own literal `${…}`).
    Text(String),
    Reference(Reference, String),
}

/// Why a `${…}` does not resolve. Display is the reason alone; `DecodeCx::interpolate` reports it
/// at the `${…}`'s `path:line:col`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum InterpolateError {
    /// `how` is the load's hint for supplying the variable, with its name filled in.
    #[error("undefined variable `{name}`: {how} or write `${{{name}:-default}}`")]
    UndefinedVariable { name: String, how: String },
    #[error(
        "malformed asset reference `{0}`: write ${{asset.<scope>.<name>.<key>}} or ${{asset.<name>.<key>}} (letters, digits, `_`, `-`)"
    )]
    MalformedAsset(String),
    #[error(
        "malformed resource reference `{0}`: write ${{ref.<kind>.<name>.<field>}}, e.g. ${{ref.ingress.web.host}}"
    )]
    MalformedResource(String),
    #[error(
        "unsupported interpolation `{0}`: manifests interpolate ${{VAR}}, ${{VAR:-default}}, ${{asset.…}} and ${{ref.…}} (write `$${{` for a literal `${{`)"
    )]
    Unsupported(String),
}

/// Resolves `${…}` contents against one file's variables.
pub(crate) struct Interpolator<'a> {
    vars: BTreeMap<&'a str, &'a str>,
    /// The hint shown for an undefined variable.
    missing_hint: &'a str,
}

impl<'a> Interpolator<'a> {
    /// The variables visible to one file (see the module docs for the layering).
    pub(crate) fn for_file(vars: &'a Vars, body: &Body, missing_hint: &'a str) -> Interpolator<'a> {
        let mut buckets: Vec<(String, String)> = Vec::new();
        let mut own: Vec<(String, String)> = Vec::new();
        for structure in body.iter() {
            let Structure::Block(block) = structure else {
                continue;
            };
            let labels: Vec<&str> = block
                .labels
                .iter()
                .map(|label| match label {
                    BlockLabel::String(text) => text.as_str(),
                    BlockLabel::Ident(ident) => ident.as_str(),
                })
                .collect();
            if let [scope, name] = labels.as_slice() {
                own.push(((*scope).to_owned(), (*name).to_owned()));
            }
            for inner in block.body.iter() {
                let Structure::Attribute(attribute) = inner else {
                    continue;
                };
                if attribute.key.as_str() != "env_from" {
                    continue;
                }
                let Expression::Array(items) = &attribute.value else {
                    continue;
                };
                for item in items.iter() {
                    if let Expression::String(text) = item {
                        buckets.push(bucket_of(text.as_str()));
                    }
                }
            }
        }
        let mut visible: BTreeMap<&'a str, &'a str> = BTreeMap::new();
        for bucket in buckets.iter().chain(own.iter()) {
            if let Some(values) = vars.buckets.get(bucket) {
                visible.extend(values.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            }
        }
        visible.extend(vars.globals.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        Interpolator {
            vars: visible,
            missing_hint,
        }
    }

    /// Resolves the text between `${` and `}`.
    pub(crate) fn resolve(&self, content: &str) -> Result<Resolved, InterpolateError> {
        if let Some((name, default)) = parse_var(content) {
            return match (self.vars.get(name), default) {
                (Some(value), _) => Ok(Resolved::Text((*value).to_owned())),
                (None, Some(default)) => Ok(Resolved::Text(default.to_owned())),
                (None, None) => Err(InterpolateError::UndefinedVariable {
                    name: name.to_owned(),
                    how: self.missing_hint.replace("{var}", name),
                }),
            };
        }
        let literal = format!("${{{content}}}");
        if let Some(rest) = content.strip_prefix("asset.") {
            let segments: Vec<&str> = rest.split('.').collect();
            let valid = segments.iter().all(|segment| is_ref_segment(segment));
            return match segments.as_slice() {
                [scope, name, key] if valid => Ok(Resolved::Reference(
                    Reference::Asset {
                        scope: Some((*scope).to_owned()),
                        name: (*name).to_owned(),
                        key: (*key).to_owned(),
                    },
                    literal,
                )),
                [name, key] if valid => Ok(Resolved::Reference(
                    Reference::Asset {
                        scope: None,
                        name: (*name).to_owned(),
                        key: (*key).to_owned(),
                    },
                    literal,
                )),
                _ => Err(InterpolateError::MalformedAsset(literal)),
            };
        }
        if let Some(rest) = content.strip_prefix("ref.") {
            let segments: Vec<&str> = rest.split('.').collect();
            if let [kind, name, field] = segments.as_slice() {
                let kind_known =
                    Kind::parse(kind).or_else(|| kind.strip_suffix('s').and_then(Kind::parse));
                let field_ok = field
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic())
                    && field.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if let Some(kind) = kind_known.filter(|_| is_ref_segment(name) && field_ok) {
                    return Ok(Resolved::Reference(
                        Reference::Resource {
                            kind,
                            name: (*name).to_owned(),
                            field: (*field).to_owned(),
                        },
                        literal,
                    ));
                }
            }
            return Err(InterpolateError::MalformedResource(literal));
        }
        Err(InterpolateError::Unsupported(literal))
    }
}

/// `x` → scope bucket `(x, "")`; `a/b` → app bucket `(a, b)`.
pub(crate) fn bucket_of(reference: &str) -> (String, String) {
    match reference.split_once('/') {
        Some((scope, name)) => (scope.to_owned(), name.to_owned()),
        None => (reference.to_owned(), String::new()),
    }
}

/// voodu's `\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}` on the text between the braces.
fn parse_var(content: &str) -> Option<(&str, Option<&str>)> {
    let (name, default) = match content.split_once(":-") {
        Some((name, default)) => (name, Some(default)),
        None => (content, None),
    };
    let mut chars = name.chars();
    let first = chars.next()?;
    let valid = (first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    valid.then_some((name, default))
}

/// `[A-Za-z0-9][A-Za-z0-9_-]*`: an asset scope, name or key, or a ref name, in a reference.
pub(crate) fn is_ref_segment(segment: &str) -> bool {
    crate::model::is_ref_segment(segment)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interpolator(vars: &Vars, source: &str) -> Interpolator<'static> {
        let body = hcl::edit::parser::parse_body(source).expect("parses");
        let vars: &'static Vars = Box::leak(Box::new(vars.clone()));
        Interpolator::for_file(vars, &body, "set {var}")
    }

    fn text(resolved: Result<Resolved, InterpolateError>) -> Result<String, String> {
        resolved
            .map(|resolved| match resolved {
                Resolved::Text(text) | Resolved::Reference(_, text) => text,
            })
            .map_err(|error| error.to_string())
    }

    #[test]
    fn variables_layer_buckets_then_own_bucket_then_globals() {
        let mut vars = Vars::default();
        let bucket = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        vars.buckets.insert(
            ("shared".into(), String::new()),
            bucket(&[("A", "scope"), ("B", "scope")]),
        );
        vars.buckets.insert(
            ("prod".into(), "web".into()),
            bucket(&[("B", "own"), ("C", "own")]),
        );
        vars.buckets
            .insert(("other".into(), "x".into()), bucket(&[("D", "unread")]));
        vars.globals.insert("C".into(), "global".into());
        let source = "deployment \"prod\" \"web\" {\n  env_from = [\"shared\"]\n}\n";
        let interpolator = interpolator(&vars, source);
        assert_eq!(text(interpolator.resolve("A")), Ok("scope".into()));
        assert_eq!(text(interpolator.resolve("B")), Ok("own".into()));
        assert_eq!(text(interpolator.resolve("C")), Ok("global".into()));
        assert_eq!(text(interpolator.resolve("D:-dflt")), Ok("dflt".into()));
        assert_eq!(text(interpolator.resolve("E:-")), Ok(String::new()));
        let missing = text(interpolator.resolve("D")).expect_err("D is in a bucket no block reads");
        assert!(
            missing.starts_with("undefined variable `D`: set D"),
            "{missing}"
        );
    }

    #[test]
    fn references_stay_literal_and_are_recognised() {
        let interpolator = interpolator(&Vars::default(), "");
        match interpolator.resolve("asset.data.pg-config.postgresql_conf") {
            Ok(Resolved::Reference(Reference::Asset { scope, name, key }, literal)) => {
                assert_eq!(
                    (scope.as_deref(), name.as_str(), key.as_str()),
                    (Some("data"), "pg-config", "postgresql_conf")
                );
                assert_eq!(literal, "${asset.data.pg-config.postgresql_conf}");
            }
            _ => panic!("expected an asset reference"),
        }
        assert!(matches!(
            interpolator.resolve("asset.ca.pem"),
            Ok(Resolved::Reference(Reference::Asset { scope: None, .. }, _))
        ));
        assert!(matches!(
            interpolator.resolve("ref.ingress.web.host"),
            Ok(Resolved::Reference(
                Reference::Resource {
                    kind: Kind::Ingress,
                    ..
                },
                _
            ))
        ));
        for (bad, why) in [
            (
                "asset.a.b.c.d",
                "malformed asset reference `${asset.a.b.c.d}`",
            ),
            ("asset.a", "malformed asset reference"),
            (
                "ref.pod.x.y",
                "malformed resource reference `${ref.pod.x.y}`",
            ),
            ("var.x", "unsupported interpolation `${var.x}`"),
            ("a b", "unsupported interpolation"),
            ("1X", "unsupported interpolation"),
        ] {
            match interpolator.resolve(bad) {
                Err(error) => assert!(error.to_string().starts_with(why), "{bad}: {error}"),
                Ok(_) => panic!("{bad} must be refused"),
            }
        }
    }
}
