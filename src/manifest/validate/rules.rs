//! What the checks across files say about one key: which of its declarations wins, whether
//! the winner's references resolve, what its routes and its sentinel's redis find. Each rule
//! reads the other keys through `Keys` and says which keys it read, so the index
//! (`super::index`) can run them again for the keys a change touches alone.

use std::sync::Arc;

use super::super::decode::{Decoded, Resource};
use super::super::diagnostic::Diagnostic;
use super::super::interpolate::Reference;
use super::super::policy;
use super::super::spec::{IngressSpec, Macro, Spec, StatefulsetSpec};
use crate::model::{Kind, Policy, ResourceKey};

/// What the rules read of the other keys.
pub(super) trait Keys {
    /// The declaration of `key` that wins, if it is declared.
    fn winner(&self, key: &ResourceKey) -> Option<&Decoded>;
    /// Whether a file reports that `key` failed to decode.
    fn failed(&self, key: &ResourceKey) -> bool;
    /// Whether `key`'s winner passed its own checks (`check_one`).
    fn passed(&self, key: &ResourceKey) -> bool;
    /// The ingress that routes `route` (host + path) first: the least key among the winners.
    fn first_route(&self, route: &str) -> Option<&ResourceKey>;
    /// Whether `scope` belongs to another source than the one this load checks (the host
    /// policy's seal refuses what points there, at its own place).
    fn foreign(&self, scope: &str) -> bool;
}

/// When a note was made: the order of the load's diagnostics (before their sort by place).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Stage {
    Policy,
    Duplicate,
    Check,
    Reference,
}

impl Stage {
    pub(super) const ALL: [Stage; 4] = [
        Stage::Policy,
        Stage::Duplicate,
        Stage::Check,
        Stage::Reference,
    ];
}

/// One diagnostic a rule made, an error (rejects the commit) or a warning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Note {
    pub(super) stage: Stage,
    pub(super) error: bool,
    pub(super) diagnostic: Diagnostic,
}

pub(super) fn error(stage: Stage, diagnostic: Diagnostic) -> Note {
    Note {
        stage,
        error: true,
        diagnostic,
    }
}

fn warning(stage: Stage, diagnostic: Diagnostic) -> Note {
    Note {
        stage,
        error: false,
        diagnostic,
    }
}

/// Which of `key`'s declarations (`decls`, in load order, at least one) wins, as an index.
/// Twice in one file is an error (the first stays); in a later file, a warning, and the later
/// file wins (as `voodu apply` on a directory does).
pub(super) fn winner(key: &ResourceKey, decls: &[&Decoded], notes: &mut Vec<Note>) -> usize {
    let mut first = 0;
    for (index, item) in decls.iter().enumerate().skip(1) {
        let at = &decls[first].resource.origin;
        if at.path == item.resource.origin.path {
            notes.push(error(
                Stage::Duplicate,
                Diagnostic {
                    message: format!(
                        "duplicate identity {key}: declared more than once in this file (also at line {}); check `app` blocks and standalone {} blocks for collisions",
                        at.line, key.kind
                    ),
                    ..item.resource.origin.clone()
                },
            ));
            continue;
        }
        let message = if decls[first].resource.spec == item.resource.spec {
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
        notes.push(warning(
            Stage::Duplicate,
            Diagnostic {
                message,
                ..item.resource.origin.clone()
            },
        ));
        first = index;
    }
    first
}

/// The host policy's refusals of `item`, a key's last declaration (the one a later file makes
/// win), each at the field that asks for more than the policy allows.
pub(super) fn refusals(policy: &Policy, item: &Decoded, notes: &mut Vec<Note>) {
    notes.extend(
        policy::check(policy, &item.resource, &item.locations, &item.references)
            .into_iter()
            .map(|diagnostic| error(Stage::Policy, diagnostic)),
    );
}

/// The routes (host + path) an ingress declares, in its order; none for other kinds.
pub(super) fn routes(item: &Decoded) -> Vec<String> {
    let Spec::Ingress(ingress) = &item.resource.spec else {
        return Vec::new();
    };
    // Hosts as the proxy compares them.
    let host = super::super::spec::normalize_host(&ingress.host);
    if ingress.locations.is_empty() {
        return vec![format!("{host}/")];
    }
    ingress
        .locations
        .iter()
        .map(|location| format!("{host}{}", location.path))
        .collect()
}

/// The winner's own checks: its asset references resolve (and their digests are stamped into
/// it), its resource references name an ingress field; an ingress's routes and deployment, a
/// sentinel's redis. Returns the resource if it passed, with every key it read pushed to
/// `reads`.
pub(super) fn check_one(
    key: &ResourceKey,
    item: &Decoded,
    keys: &impl Keys,
    notes: &mut Vec<Note>,
    reads: &mut Vec<ResourceKey>,
) -> Option<Arc<Resource>> {
    let (ok, resolved) = resolve_references(item, keys, notes, reads);
    let ok = ok & super::depends::check(key, item, keys, notes, reads);
    let resource = ok.then(|| item.stamped(&resolved));
    if let Spec::Ingress(ingress) = &item.resource.spec {
        check_routes(key, item, ingress, keys, notes, reads);
    }
    if let Spec::Statefulset(spec) = &item.resource.spec
        && spec.expanded_from == Some(Macro::RedisSentinel)
    {
        check_sentinel(item, spec, keys, notes, reads);
    }
    resource
}

/// Resolves `item`'s references: whether they all do, and the digest each asset reference
/// resolves to, in order.
fn resolve_references<'k>(
    item: &Decoded,
    keys: &'k impl Keys,
    notes: &mut Vec<Note>,
    reads: &mut Vec<ResourceKey>,
) -> (bool, Vec<&'k str>) {
    let mut ok = true;
    // The digest each asset reference resolves to, in order.
    let mut resolved: Vec<&str> = Vec::new();
    for (reference, at) in &item.references {
        match reference {
            Reference::Asset {
                scope,
                name,
                key: file,
            } => {
                let asset_key =
                    ResourceKey::new(Kind::Asset, scope.clone().unwrap_or_default(), name);
                let shown = || Reference::asset_ref(scope.as_deref(), name.as_str(), file.as_str());
                let files = keys
                    .winner(&asset_key)
                    .and_then(|asset| match &asset.resource.spec {
                        Spec::Asset(asset) => Some(&asset.files),
                        _ => None,
                    });
                match files.map(|files| files.get(file)) {
                    Some(Some(asset_file)) => resolved.push(asset_file.digest.as_str()),
                    Some(None) => {
                        let keys: Vec<&str> = files
                            .map(|files| files.keys().map(String::as_str).collect())
                            .unwrap_or_default();
                        notes.push(error(Stage::Check, at_location(at, format!(
                            "unresolved asset reference \"{}\": asset {} has no key `{file}` (keys: {})",
                            shown(), display_asset(&asset_key), keys.join(", ")
                        ))));
                        ok = false;
                    }
                    None if keys.failed(&asset_key) => ok = false,
                    None => {
                        let hint = if scope.is_none() {
                            " (a 2-part reference names an unscoped asset: `asset \"name\" { … }`)"
                        } else {
                            ""
                        };
                        notes.push(error(Stage::Check, at_location(at, format!(
                            "unresolved asset reference \"{}\": no asset {} in this commit{hint}",
                            shown(), display_asset(&asset_key)
                        ))));
                        ok = false;
                    }
                }
                reads.push(asset_key);
            }
            // `depends::check`'s.
            Reference::Dependency { .. } => {}
            Reference::Resource { kind, name, field } => {
                if kind != &Kind::Ingress {
                    notes.push(error(Stage::Check, at_location(at, format!(
                        "unresolved reference {kind}.{name}.{field}: only ${{ref.ingress.<name>.<field>}} resolves (an ingress's host, service, port or url)"
                    ))));
                    ok = false;
                    continue;
                }
                if !matches!(field.as_str(), "host" | "service" | "port" | "url") {
                    notes.push(error(Stage::Check, at_location(at, format!(
                        "unresolved reference {kind}.{name}.{field}: an ingress has host, service, port and url"
                    ))));
                    ok = false;
                }
                // Whether the ingress exists is `check_references`'s, once every key passed
                // or failed its own checks.
            }
        }
    }
    (ok, resolved)
}

/// An ingress's routes (one declared before by another ingress warns) and the deployment it
/// routes to.
fn check_routes(
    key: &ResourceKey,
    item: &Decoded,
    ingress: &IngressSpec,
    keys: &impl Keys,
    notes: &mut Vec<Note>,
    reads: &mut Vec<ResourceKey>,
) {
    let mut seen: Vec<String> = Vec::new();
    for route in routes(item) {
        // The first by key routes it; an ingress naming one route twice warns of itself.
        let first = keys.first_route(&route).filter(|first| *first != key);
        let first = match first {
            Some(first) => Some(first),
            None if seen.contains(&route) => Some(key),
            None => None,
        };
        if let Some(first) = first
            && let Some(at) = keys.winner(first).map(|first| &first.resource.origin)
        {
            notes.push(warning(Stage::Check, Diagnostic {
                message: format!(
                    "route {route} is also declared by {first} at {}:{}:{}; requests go to {first} (the first by kind/scope/name)",
                    at.path, at.line, at.col
                ),
                ..item.resource.origin.clone()
            }));
        }
        seen.push(route);
    }
    let service = ingress.effective_service(&key.name);
    let deployment = ResourceKey::new(Kind::Deployment, key.scope.clone(), service);
    if keys.winner(&deployment).is_none() {
        notes.push(warning(Stage::Check, Diagnostic {
            message: format!(
                "ingress routes to deployment {service:?} of scope {:?}, which this commit does not declare; it stays unrouted until one exists",
                key.scope
            ),
            ..item.resource.origin.clone()
        }));
    }
    reads.push(deployment);
}

/// A sentinel's redis: declared in this commit, or the sentinel warns.
fn check_sentinel(
    item: &Decoded,
    spec: &StatefulsetSpec,
    keys: &impl Keys,
    notes: &mut Vec<Note>,
    reads: &mut Vec<ResourceKey>,
) {
    let env = |name: &str| spec.container.env.get(name).cloned().unwrap_or_default();
    let (scope, name) = (env("VOODU_MONITOR_SCOPE"), env("VOODU_MONITOR_NAME"));
    let redis = ResourceKey::new(Kind::Statefulset, scope.clone(), name.clone());
    let is_redis = keys.winner(&redis).is_some_and(|redis| {
        matches!(&redis.resource.spec, Spec::Statefulset(spec) if spec.expanded_from == Some(Macro::Redis))
    });
    if !is_redis {
        notes.push(warning(Stage::Check, Diagnostic {
            message: format!(
                "sentinel watches redis {name:?} of scope {scope:?}, which this commit does not declare; its pods wait for that redis's config bucket"
            ),
            ..item.resource.origin.clone()
        }));
    }
    reads.push(redis);
}

/// Whether `item` makes a `${ref.ingress.…}` (which `check_references` checks).
pub(super) fn references_an_ingress(item: &Decoded) -> bool {
    item.references.iter().any(|(reference, _)| {
        matches!(
            reference,
            Reference::Resource {
                kind: Kind::Ingress,
                ..
            }
        )
    })
}

/// Whether each `${ref.ingress.…}` of a winner that passed its own checks names an ingress
/// of its scope that passed its own (a failed one is reported at its own place).
pub(super) fn check_references(
    key: &ResourceKey,
    item: &Decoded,
    keys: &impl Keys,
    notes: &mut Vec<Note>,
    reads: &mut Vec<ResourceKey>,
) -> bool {
    let mut ok = true;
    for (reference, at) in &item.references {
        if let Reference::Resource {
            kind: Kind::Ingress,
            name,
            field,
        } = reference
        {
            let target = ResourceKey::new(Kind::Ingress, key.scope.clone(), name);
            if keys.failed(&target) {
                ok = false;
            } else if !keys.passed(&target) {
                notes.push(error(Stage::Reference, at_location(at, format!(
                    "unresolved reference ingress.{name}.{field}: no ingress {name:?} in scope {:?} in this commit",
                    key.scope
                ))));
                ok = false;
            }
            reads.push(target);
        }
    }
    ok
}

fn display_asset(key: &ResourceKey) -> String {
    if key.scope.is_empty() {
        format!("{:?}", key.name)
    } else {
        format!("{:?} {:?}", key.scope, key.name)
    }
}

pub(super) fn at_location(at: &Diagnostic, message: String) -> Diagnostic {
    Diagnostic {
        message,
        ..at.clone()
    }
}
