//! The start-up order's checks (`depends_on { resources = [...] }`, an extension): each entry
//! names a deployment or a statefulset this commit declares, in a scope of this source (the
//! host policy's seal refuses another source's, at the entry: `policy::check`); no resource
//! waits for itself through a cycle; only a deployment or a statefulset waits (a job or a
//! cronjob does not). Each refusal is at the entry that writes it.
//!
//! Invariant: the rule reads only the keys it pushes to `reads` (every key its walk looks at,
//! declared or not, and the keys a "did you mean" names), so the index's incremental checks
//! equal a fresh run over every key.

use std::collections::{BTreeMap, BTreeSet};

use super::super::decode::Decoded;
use super::super::diagnostic::Diagnostic;
use super::super::interpolate::Reference;
use super::super::spec::DEPENDABLE;
use super::rules::{Keys, Note, Stage, at_location, error};
use crate::model::ResourceKey;

/// One `depends_on.resources` entry of a declaration: the key it names (its scope resolved
/// against the dependent's), as written, and where.
struct Entry<'a> {
    target: ResourceKey,
    written_scope: bool,
    entry: &'a str,
    at: &'a Diagnostic,
}

/// The `depends_on.resources` entries `item` (a resource of `scope`) makes, in order.
fn entries<'a>(scope: &str, item: &'a Decoded) -> Vec<Entry<'a>> {
    item.references
        .iter()
        .filter_map(|(reference, at)| match reference {
            Reference::Dependency {
                kind,
                scope: written,
                name,
                entry,
            } => Some(Entry {
                target: ResourceKey::new(*kind, written.as_deref().unwrap_or(scope), name),
                written_scope: written.is_some(),
                entry,
                at,
            }),
            _ => None,
        })
        .collect()
}

/// The keys `key`'s winner depends on, in order (none when it is not declared).
pub(super) fn dependencies(key: &ResourceKey, keys: &impl Keys) -> Vec<ResourceKey> {
    keys.winner(key)
        .map(|item| {
            entries(&key.scope, item)
                .into_iter()
                .map(|entry| entry.target)
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `item`'s (`key`'s winner) dependencies hold: declared, not foreign (refused by
/// the policy), no cycle back to `key`; a job or a cronjob has none. Every key read is
/// pushed to `reads`.
pub(super) fn check(
    key: &ResourceKey,
    item: &Decoded,
    keys: &impl Keys,
    notes: &mut Vec<Note>,
    reads: &mut Vec<ResourceKey>,
) -> bool {
    let entries = entries(&key.scope, item);
    if entries.is_empty() {
        return true;
    }
    if !DEPENDABLE.contains(&key.kind) {
        for entry in &entries {
            notes.push(error(Stage::Check, at_location(entry.at, format!(
                "depends_on.resources {:?}: a {} does not wait for other resources; only a deployment or a statefulset starts after what it depends on (remove the entry, or make the {} a deployment)",
                entry.entry, key.kind, key.kind
            ))));
        }
        return false;
    }
    let mut ok = true;
    for entry in &entries {
        let target = &entry.target;
        reads.push(target.clone());
        if keys.foreign(&target.scope) {
            // The policy's seal refuses it at this entry, naming the owner.
            continue;
        }
        if target == key {
            notes.push(error(Stage::Check, at_location(entry.at, format!(
                "depends_on.resources {:?}: {key} depends on itself; a resource cannot start after itself: remove the entry",
                entry.entry
            ))));
            ok = false;
            continue;
        }
        if keys.winner(target).is_some() {
            continue;
        }
        ok = false;
        if keys.failed(target) {
            // Reported at its own place.
            continue;
        }
        let hint = near(key, entry, keys, reads)
            .map(|near| format!(" (did you mean `{near}`?)"))
            .unwrap_or_default();
        notes.push(error(
            Stage::Check,
            at_location(
                entry.at,
                format!(
                    "unresolved dependency {:?}: no {} {:?} in scope {:?} in this commit{hint}",
                    entry.entry, target.kind, target.name, target.scope
                ),
            ),
        ));
    }
    if let Some((entry, cycle)) = cycle(key, &entries, keys, reads) {
        let shown: Vec<String> = cycle.iter().map(ToString::to_string).collect();
        notes.push(error(Stage::Check, at_location(entry.at, format!(
            "depends_on.resources {:?}: a cycle: {}; none of these could start first: remove one of the dependencies",
            entry.entry,
            shown.join(" → ")
        ))));
        ok = false;
    }
    ok
}

/// A declared resource close to what `entry` names: the other dependable kind of the same
/// scope and name, or (an entry that wrote its scope) the same kind and name in the
/// dependent's own scope. Each key looked at is pushed to `reads`.
fn near(
    key: &ResourceKey,
    entry: &Entry<'_>,
    keys: &impl Keys,
    reads: &mut Vec<ResourceKey>,
) -> Option<String> {
    let target = &entry.target;
    let mut candidates: Vec<ResourceKey> = DEPENDABLE
        .iter()
        .filter(|kind| **kind != target.kind)
        .map(|kind| ResourceKey::new(*kind, target.scope.clone(), target.name.clone()))
        .collect();
    if entry.written_scope && target.scope != key.scope {
        candidates.extend(
            DEPENDABLE
                .iter()
                .map(|kind| ResourceKey::new(*kind, key.scope.clone(), target.name.clone())),
        );
    }
    let found = candidates
        .iter()
        .find(|candidate| *candidate != key && keys.winner(candidate).is_some())
        .map(ToString::to_string);
    reads.extend(candidates);
    found
}

/// The first of `entries` (`key`'s) from which the dependencies lead back to `key`, and that
/// cycle from `key` to `key`. The walk visits each key once; each is pushed to `reads`.
fn cycle<'e, 'a>(
    key: &ResourceKey,
    entries: &'e [Entry<'a>],
    keys: &impl Keys,
    reads: &mut Vec<ResourceKey>,
) -> Option<(&'e Entry<'a>, Vec<ResourceKey>)> {
    // Key → the key it was reached from.
    let mut from: BTreeMap<ResourceKey, ResourceKey> = BTreeMap::new();
    let mut seen: BTreeSet<ResourceKey> = BTreeSet::new();
    for entry in entries {
        let start = &entry.target;
        if start == key || !seen.insert(start.clone()) {
            continue;
        }
        let mut todo = vec![start.clone()];
        while let Some(at) = todo.pop() {
            reads.push(at.clone());
            if keys.foreign(&at.scope) {
                continue;
            }
            for next in dependencies(&at, keys) {
                if next == *key {
                    let mut path = vec![key.clone(), at.clone()];
                    let mut back = &at;
                    while let Some(previous) = from.get(back) {
                        path.push(previous.clone());
                        back = previous;
                    }
                    // `key`, then from `start` to `at` read backwards.
                    path[1..].reverse();
                    path.push(key.clone());
                    return Some((entry, path));
                }
                if seen.insert(next.clone()) {
                    from.insert(next.clone(), at.clone());
                    todo.push(next);
                }
            }
        }
    }
    None
}
