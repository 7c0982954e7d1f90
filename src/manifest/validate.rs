//! Checks across resources, once every file is decoded: duplicate identities, references
//! (`${asset.…}`, `depends_on.assets`, `${ref.…}`), overlapping ingress routes; and the
//! stamping of asset digests into their consumers (`_asset_digests`, spec §5.3).
//!
//! A resource declared twice in one file is an error (as in voodu). Declared in two files, the
//! later file in path order wins, as `voodu apply` on a directory does, and a warning names
//! both places: voodu's own example folders hold such alternatives, and every one of them must
//! load. Two ingresses routing the same host and path is a warning too: the first by key wins,
//! deterministically, as voodu's own examples route one host from several ingresses.
//!
//! The agent reads a whole repo at a commit, so (unlike voodu, which also consults what an
//! earlier apply left on the server) a reference resolves only against this commit: an asset
//! that is not declared here would be pruned anyway.
//!
//! Invariant: a reference that does not resolve is an error at the line that wrote it.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use super::decode::{Decoded, Resource};
use super::diagnostic::Diagnostic;
use super::interpolate::Reference;
use super::spec::{AssetFile, Macro, Spec};
use crate::model::{Kind, ResourceKey};

/// Names become parts of container names, DNS aliases and file paths: one charset for all.
pub(crate) fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("must not be empty");
    }
    if name.len() > crate::model::names::MAX_NAME {
        return Err("is longer than 63 characters (it becomes a DNS label and a directory name)");
    }
    if name.contains("..") || name.contains('/') || name.contains('\0') {
        return Err("must not contain `..`, `/` or NUL");
    }
    let first_ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric());
    if !first_ok
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
    {
        return Err(
            "must start with a letter or digit and use only letters, digits, `_`, `.` and `-`",
        );
    }
    Ok(())
}

/// Drops duplicates (reporting each), resolves references and stamps asset digests.
/// Returns the accepted resources; every problem is pushed to `errors`. References to
/// `failed` resources (declared, but with errors already reported) are not reported again.
///
/// It reads the decoded files in place (a cached file's decode is shared) and shares the
/// resources it accepts (`Decoded::stamped`: one copy per decode and stamp, not per load).
pub(crate) fn check(
    decoded: Vec<&Decoded>,
    failed: &BTreeSet<ResourceKey>,
    errors: &mut Vec<Diagnostic>,
    warnings: &mut Vec<Diagnostic>,
) -> Vec<Arc<Resource>> {
    // Sorted by key, not inserted into a map (10,000 resources: most of a cached load's
    // checks): stable, so a key's declarations stay in declaration order, side by side.
    let mut decoded = decoded;
    decoded.sort_by(|a, b| a.resource.key.cmp(&b.resource.key));
    // Each key once, with the declaration that wins, in key order.
    let mut by_key: Vec<(&ResourceKey, &Decoded)> = Vec::with_capacity(decoded.len());
    for item in decoded {
        let key = &item.resource.key;
        let first = match by_key.last_mut() {
            Some((seen, first)) if *seen == key => first,
            _ => {
                by_key.push((key, item));
                continue;
            }
        };
        let at = first.resource.origin.clone();
        if at.path == item.resource.origin.path {
            errors.push(Diagnostic {
                message: format!(
                    "duplicate identity {key}: declared more than once in this file (also at line {}); check `app` blocks and standalone {} blocks for collisions",
                    at.line, key.kind
                ),
                ..item.resource.origin.clone()
            });
            continue;
        }
        let message = if first.resource.spec == item.resource.spec {
            format!(
                "{key} is also declared, identically, at {}:{}:{}; one copy is used",
                at.path, at.line, at.col
            )
        } else {
            format!(
                "{key} is also declared at {}:{}:{}; this later file wins (as `voodu apply` on the directory does) and that declaration is ignored",
                at.path, at.line, at.col
            )
        };
        warnings.push(Diagnostic {
            message,
            ..item.resource.origin.clone()
        });
        *first = item;
    }
    let declared = |wanted: &ResourceKey| {
        by_key
            .binary_search_by(|(key, _)| (*key).cmp(wanted))
            .is_ok()
    };

    // The assets by `(scope, name)`: taken in `by_key`'s order, which within one kind is
    // `(scope, name)` order, so they are searched by halves, with nothing hashed or copied.
    let assets: Vec<((&str, &str), AssetFiles<'_>)> = by_key
        .iter()
        .filter_map(|(key, item)| match &item.resource.spec {
            Spec::Asset(asset) => Some(((key.scope.as_str(), key.name.as_str()), &asset.files)),
            _ => None,
        })
        .collect();
    let asset_files = |scope: &str, name: &str| {
        assets
            .binary_search_by(|(at, _)| (*at).cmp(&(scope, name)))
            .ok()
            .map(|index| assets[index].1)
    };

    // `host + path` → the ingress that routes it first.
    let mut routes: BTreeMap<String, (ResourceKey, Diagnostic)> = BTreeMap::new();
    // Data redises a sentinel quorum may watch.
    let redises: HashSet<(&str, &str)> = by_key
        .iter()
        .filter(|(_, item)| {
            matches!(&item.resource.spec, Spec::Statefulset(spec) if spec.expanded_from == Some(Macro::Redis))
        })
        .map(|(key, _)| (key.scope.as_str(), key.name.as_str()))
        .collect();
    let mut accepted: Vec<Arc<Resource>> = Vec::with_capacity(by_key.len());
    let mut accepted_items: Vec<&Decoded> = Vec::with_capacity(by_key.len());
    // The digest each asset reference of the item resolves to, in order (one buffer).
    let mut resolved: Vec<&str> = Vec::new();
    for &(key, item) in &by_key {
        let mut ok = true;
        resolved.clear();
        for (reference, at) in &item.references {
            match reference {
                Reference::Asset {
                    scope,
                    name,
                    key: file,
                } => {
                    let asset_key =
                        || ResourceKey::new(Kind::Asset, scope.clone().unwrap_or_default(), name);
                    let shown =
                        || Reference::asset_ref(scope.as_deref(), name.as_str(), file.as_str());
                    let files = asset_files(scope.as_deref().unwrap_or_default(), name);
                    match files.map(|files| files.get(file)) {
                        Some(Some(asset_file)) => resolved.push(asset_file.digest.as_str()),
                        Some(None) => {
                            let shown = shown();
                            let keys: Vec<&str> = files
                                .map(|files| files.keys().map(String::as_str).collect())
                                .unwrap_or_default();
                            errors.push(at_location(at, format!(
                                "unresolved asset reference \"{shown}\": asset {} has no key `{file}` (keys: {})",
                                display_asset(&asset_key()), keys.join(", ")
                            )));
                            ok = false;
                        }
                        None if failed.contains(&asset_key()) => ok = false,
                        None => {
                            let shown = shown();
                            let hint = if scope.is_none() {
                                " (a 2-part reference names an unscoped asset: `asset \"name\" { … }`)"
                            } else {
                                ""
                            };
                            errors.push(at_location(at, format!(
                                "unresolved asset reference \"{shown}\": no asset {} in this commit{hint}",
                                display_asset(&asset_key())
                            )));
                            ok = false;
                        }
                    }
                }
                Reference::Resource { kind, name, field } => {
                    if kind != &Kind::Ingress {
                        errors.push(at_location(at, format!(
                            "unresolved reference {kind}.{name}.{field}: only ${{ref.ingress.<name>.<field>}} resolves (an ingress's host, service, port or url)"
                        )));
                        ok = false;
                        continue;
                    }
                    if !matches!(field.as_str(), "host" | "service" | "port" | "url") {
                        errors.push(at_location(at, format!(
                            "unresolved reference {kind}.{name}.{field}: an ingress has host, service, port and url"
                        )));
                        ok = false;
                    }
                    // Whether the ingress exists is checked below, once every key is known.
                }
            }
        }
        let resource = ok.then(|| item.stamped(&resolved));
        if let Spec::Ingress(ingress) = &item.resource.spec {
            let paths: Vec<&str> = if ingress.locations.is_empty() {
                vec!["/"]
            } else {
                ingress
                    .locations
                    .iter()
                    .map(|location| location.path.as_str())
                    .collect()
            };
            for path in paths {
                let route = format!("{}{}", ingress.host, path);
                match routes.get(&route) {
                    Some((first_key, first)) => warnings.push(Diagnostic {
                        message: format!(
                            "route {route} is also declared by {first_key} at {}:{}:{}; requests go to {first_key} (the first by kind/scope/name)",
                            first.path, first.line, first.col
                        ),
                        ..item.resource.origin.clone()
                    }),
                    None => {
                        routes.insert(route, (key.clone(), item.resource.origin.clone()));
                    }
                }
            }
            let service = ingress.effective_service(&key.name);
            // Looked up among the keys (a few ingresses) rather than a set of every
            // deployment built for them (thousands).
            if !declared(&ResourceKey::new(
                Kind::Deployment,
                key.scope.clone(),
                service,
            )) {
                warnings.push(Diagnostic {
                    message: format!(
                        "ingress routes to deployment {service:?} of scope {:?}, which this commit does not declare; it stays unrouted until one exists",
                        key.scope
                    ),
                    ..item.resource.origin.clone()
                });
            }
        }
        if let Spec::Statefulset(spec) = &item.resource.spec
            && spec.expanded_from == Some(Macro::RedisSentinel)
        {
            let env = |name: &str| spec.container.env.get(name).cloned().unwrap_or_default();
            let (scope, name) = (env("VOODU_MONITOR_SCOPE"), env("VOODU_MONITOR_NAME"));
            if !redises.contains(&(scope.as_str(), name.as_str())) {
                warnings.push(Diagnostic {
                    message: format!(
                        "sentinel watches redis {name:?} of scope {scope:?}, which this commit does not declare; its pods wait for that redis's config bucket"
                    ),
                    ..item.resource.origin.clone()
                });
            }
        }
        if let Some(resource) = resource {
            accepted.push(resource);
            accepted_items.push(item);
        }
    }
    // Resource references need the full set of keys, known only now (a commit without any
    // needs no set).
    let any_resource_reference = accepted_items.iter().any(|item| {
        item.references
            .iter()
            .any(|(reference, _)| matches!(reference, Reference::Resource { .. }))
    });
    if !any_resource_reference {
        return accepted;
    }
    let keys: HashSet<&ResourceKey> = accepted.iter().map(|resource| &resource.key).collect();
    let resolves: Vec<bool> = accepted_items
        .iter()
        .map(|item| {
            let mut ok = true;
            for (reference, at) in &item.references {
                if let Reference::Resource { kind: Kind::Ingress, name, field } = reference {
                    let target = ResourceKey::new(Kind::Ingress, item.resource.key.scope.clone(), name);
                    if failed.contains(&target) {
                        ok = false;
                    } else if !keys.contains(&target) {
                        errors.push(at_location(at, format!(
                            "unresolved reference ingress.{name}.{field}: no ingress {name:?} in scope {:?} in this commit",
                            item.resource.key.scope
                        )));
                        ok = false;
                    }
                }
            }
            ok
        })
        .collect();
    let mut resolves = resolves.into_iter();
    accepted.retain(|_| resolves.next().unwrap_or(true));
    accepted
}

/// An asset's files, by key.
type AssetFiles<'a> = &'a BTreeMap<String, AssetFile>;

fn display_asset(key: &ResourceKey) -> String {
    if key.scope.is_empty() {
        format!("{:?}", key.name)
    } else {
        format!("{:?} {:?}", key.scope, key.name)
    }
}

fn at_location(at: &Diagnostic, message: String) -> Diagnostic {
    Diagnostic {
        message,
        ..at.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::check_name;

    #[test]
    fn names_are_confined() {
        assert!(check_name("web-1").is_ok());
        assert!(check_name("api_http").is_ok());
        for bad in ["", "a/b", "..", "a..b", "-x", "a b", "a\0"] {
            assert!(check_name(bad).is_err(), "{bad:?} must be refused");
        }
    }
}
