//! Decide: desired state and the containers that exist → the ordered steps that converge
//! them (`plan_replicas`), and, for the `plan` command, what a new commit would do to each
//! resource (`plan_resource`: create, update which fields, replace because of which hashed
//! field, delete, or leave). Pure, so the handlers and `plan` cannot disagree, and the logic
//! is tested without IO.
//!
//! Invariants: a container whose spec hash matches desired is never replaced (scaling never
//! churns survivors); replacements are separate steps, executed one slot at a time; the plan
//! is idempotent: planning again on the result yields no steps.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::manifest::Manifest;
use crate::manifest::spec::Spec;
use crate::model::{Kind, ResourceKey, SpecHash};
use crate::runtime::labels;
use crate::runtime::{Container, ContainerState};

/// What a workload resource wants: `n_replicas` containers labelled with `spec_hash` (and,
/// when given, with `env_digest`: a replica whose environment changed is outdated too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target<'a> {
    pub spec_hash: &'a SpecHash,
    pub n_replicas: usize,
    pub env_digest: Option<&'a str>,
}

impl Target<'_> {
    /// Whether `container` runs what the target wants.
    pub fn is_current(&self, container: &Container) -> bool {
        container.label(labels::MANIFEST_HASH) == Some(self.spec_hash.as_str())
            && self
                .env_digest
                .is_none_or(|digest| container.label(labels::ENV_DIGEST) == Some(digest))
    }
}

/// One action on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Create and start a new replica.
    Create,
    /// Start a current replica that is not running (created, or stopped by hand).
    Start { id: String, name: String },
    /// Replace an outdated replica: remove it, then create and start its successor.
    Replace { id: String, name: String },
    /// Remove a replica that is no longer wanted.
    Remove { id: String, name: String },
}

/// Steps for a replicated workload. `target == None` means the resource left the repo.
pub fn plan_replicas(target: Option<&Target<'_>>, actual: &[Container]) -> Vec<Step> {
    let mut actual: Vec<&Container> = actual.iter().collect();
    // Running replicas first, then by name: scale-down keeps running ones, and the order is
    // stable across calls.
    actual.sort_by(|a, b| {
        (a.state != ContainerState::Running, &a.name)
            .cmp(&(b.state != ContainerState::Running, &b.name))
    });
    let remove = |container: &&Container| Step::Remove {
        id: container.id.clone(),
        name: container.name.clone(),
    };
    let Some(target) = target else {
        return actual.iter().map(remove).collect();
    };
    let (current, outdated): (Vec<&Container>, Vec<&Container>) = actual
        .into_iter()
        .partition(|container| target.is_current(container));
    let keep = current.len().min(target.n_replicas);
    let mut removes: Vec<Step> = current[keep..].iter().map(remove).collect();
    // A restarting container is the engine's to bring back (its restart policy's back-off).
    let starts = current[..keep]
        .iter()
        .filter(|container| {
            !matches!(
                container.state,
                ContainerState::Running | ContainerState::Restarting
            )
        })
        .map(|container| Step::Start {
            id: container.id.clone(),
            name: container.name.clone(),
        });
    let missing = target.n_replicas - keep;
    let n_replace = missing.min(outdated.len());
    removes.extend(outdated[n_replace..].iter().map(remove));
    let creates = std::iter::repeat_n(Step::Create, missing - n_replace);
    let replaces = outdated[..n_replace].iter().map(|container| Step::Replace {
        id: container.id.clone(),
        name: container.name.clone(),
    });
    removes
        .into_iter()
        .chain(starts)
        .chain(creates)
        .chain(replaces)
        .collect()
}

/// What applying a commit does to one resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    Create,
    /// Containers are replaced (or a job runs again): a hashed field changed, or the running
    /// containers are outdated.
    Replace,
    /// Desired state changes without replacing containers (scaling, hooks, routes, files).
    Update,
    Delete,
    Unchanged,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Create => "create",
            Action::Replace => "replace",
            Action::Update => "update",
            Action::Delete => "delete",
            Action::Unchanged => "unchanged",
        }
    }
}

/// One changed top-level field of a spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldChange {
    pub field: String,
    /// In the spec hash: changing it replaces containers.
    pub hashed: bool,
    /// Short renderings of the old and new value (`None`: absent). Secret-bearing fields
    /// (`env`, `token`) show which keys changed, never values.
    pub before: Option<String>,
    pub after: Option<String>,
}

/// What a commit would do to one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourcePlan {
    pub key: ResourceKey,
    pub action: Action,
    pub changes: Vec<FieldChange>,
    /// Container steps, for replicated kinds whose containers are known.
    pub steps: Vec<Step>,
}

/// Plans one resource: `current` is what the agent's desired state holds now, `next` what the
/// commit declares, `actual` the resource's containers (empty when unknown or none).
pub fn plan_resource(
    key: &ResourceKey,
    current: Option<&Spec>,
    next: Option<&Spec>,
    actual: &[Container],
) -> ResourcePlan {
    let changes = diff_specs(key.kind, current, next);
    let steps = match next {
        Some(spec @ Spec::Deployment(_)) => {
            let hash = spec.spec_hash(key);
            plan_replicas(
                Some(&Target {
                    spec_hash: &hash,
                    n_replicas: spec.n_replicas(),
                    env_digest: None,
                }),
                actual,
            )
        }
        Some(_) => Vec::new(),
        None => plan_replicas(None, actual),
    };
    let action = match (current, next) {
        (None, None) if actual.is_empty() => Action::Unchanged,
        (_, None) => Action::Delete,
        (None, Some(_)) if actual.is_empty() => Action::Create,
        _ if steps
            .iter()
            .any(|step| matches!(step, Step::Replace { .. }))
            || changes.iter().any(|change| change.hashed) =>
        {
            Action::Replace
        }
        _ if !changes.is_empty() || !steps.is_empty() || current.is_none() => Action::Update,
        _ => Action::Unchanged,
    };
    ResourcePlan {
        key: key.clone(),
        action,
        changes,
        steps,
    }
}

/// The plan of every resource in the commit or in the agent's desired state.
pub fn plan_all(
    manifest: &Manifest,
    current: &BTreeMap<ResourceKey, Spec>,
    actual: &BTreeMap<ResourceKey, Vec<Container>>,
) -> Vec<ResourcePlan> {
    let next: BTreeMap<&ResourceKey, &Spec> = manifest
        .resources
        .iter()
        .map(|resource| (&resource.key, &resource.spec))
        .collect();
    let keys: BTreeSet<&ResourceKey> = next
        .keys()
        .copied()
        .chain(current.keys())
        .chain(actual.keys())
        .collect();
    keys.into_iter()
        .map(|key| {
            plan_resource(
                key,
                current.get(key),
                next.get(key).copied(),
                actual.get(key).map_or(&[][..], Vec::as_slice),
            )
        })
        .collect()
}

/// The top-level fields that differ between two specs of one kind.
fn diff_specs(kind: Kind, current: Option<&Spec>, next: Option<&Spec>) -> Vec<FieldChange> {
    let (Some(current), Some(next)) = (current, next) else {
        return Vec::new();
    };
    let as_object = |spec: &Spec| -> serde_json::Map<String, Value> {
        match serde_json::from_str(&spec.to_json()) {
            Ok(Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        }
    };
    let before = as_object(current);
    let after = as_object(next);
    let fields: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    let hashed = Spec::hashed_fields(kind);
    fields
        .into_iter()
        .filter(|field| before.get(*field) != after.get(*field))
        .map(|field| {
            let secret = matches!(field.as_str(), "env" | "token" | "headers");
            let (before_text, after_text) = if secret {
                secret_change(before.get(field), after.get(field))
            } else {
                (before.get(field).map(render), after.get(field).map(render))
            };
            FieldChange {
                field: field.clone(),
                hashed: hashed.contains(&field.as_str()),
                before: before_text,
                after: after_text,
            }
        })
        .collect()
}

/// For fields that may hold secrets: which keys were added, removed or changed, no values.
fn secret_change(
    before: Option<&Value>,
    after: Option<&Value>,
) -> (Option<String>, Option<String>) {
    let keys = |value: Option<&Value>| -> Vec<(String, String)> {
        match value {
            Some(Value::Object(map)) => map
                .iter()
                .map(|(k, v)| (k.clone(), v.to_string()))
                .collect(),
            Some(_) => vec![(String::new(), "set".to_owned())],
            None => Vec::new(),
        }
    };
    let old = keys(before);
    let new = keys(after);
    let mut changed = Vec::new();
    for (key, value) in &new {
        match old.iter().find(|(old_key, _)| old_key == key) {
            None => changed.push(format!("+{key}")),
            Some((_, old_value)) if old_value != value => changed.push(format!("~{key}")),
            Some(_) => {}
        }
    }
    for (key, _) in &old {
        if !new.iter().any(|(new_key, _)| new_key == key) {
            changed.push(format!("-{key}"));
        }
    }
    let summary = format!("(values hidden) {}", changed.join(" "));
    (
        before.map(|_| "(values hidden)".to_owned()),
        after.map(|_| summary),
    )
}

/// A short one-line rendering of a JSON value.
fn render(value: &Value) -> String {
    const MAX: usize = 80;
    let text = value.to_string();
    if text.chars().count() <= MAX {
        text
    } else {
        let cut: String = text.chars().take(MAX - 1).collect();
        format!("{cut}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn container(name: &str, hash: &str, state: ContainerState) -> Container {
        Container {
            id: format!("id-{name}"),
            name: name.to_owned(),
            image: "img".to_owned(),
            labels: BTreeMap::from([(labels::MANIFEST_HASH.to_owned(), hash.to_owned())]),
            state,
        }
    }

    fn check(n_replicas: Option<usize>, actual: &[Container], expected: &[&str]) {
        let hash = SpecHash::new("new");
        let target = n_replicas.map(|n_replicas| Target {
            spec_hash: &hash,
            n_replicas,
            env_digest: None,
        });
        let steps: Vec<String> = plan_replicas(target.as_ref(), actual)
            .into_iter()
            .map(|step| match step {
                Step::Create => "create".to_owned(),
                Step::Start { name, .. } => format!("start {name}"),
                Step::Replace { name, .. } => format!("replace {name}"),
                Step::Remove { name, .. } => format!("remove {name}"),
            })
            .collect();
        assert_eq!(steps, expected);
    }

    use ContainerState::{Created, Exited, Running};

    #[test]
    fn creates_what_is_missing() {
        check(Some(2), &[], &["create", "create"]);
    }

    #[test]
    fn converged_plans_nothing() {
        check(
            Some(2),
            &[
                container("a", "new", Running),
                container("b", "new", Running),
            ],
            &[],
        );
    }

    #[test]
    fn scaling_up_and_down_keeps_survivors() {
        let two = [
            container("a", "new", Running),
            container("b", "new", Running),
        ];
        check(Some(3), &two, &["create"]);
        check(Some(1), &two, &["remove b"]);
    }

    #[test]
    fn scale_down_prefers_removing_stopped_replicas() {
        check(
            Some(1),
            &[
                container("a", "new", Exited),
                container("b", "new", Running),
            ],
            &["remove a"],
        );
    }

    #[test]
    fn outdated_replicas_are_replaced_one_step_each() {
        let old = [
            container("a", "old", Running),
            container("b", "old", Running),
        ];
        check(Some(2), &old, &["replace a", "replace b"]);
        check(Some(3), &old, &["create", "replace a", "replace b"]);
        check(Some(1), &old, &["remove b", "replace a"]);
    }

    #[test]
    fn a_half_done_rollout_resumes_without_duplicates() {
        let mixed = [
            container("a", "new", Running),
            container("b", "old", Running),
            container("c", "new", Created),
        ];
        check(Some(2), &mixed, &["remove b", "start c"]);
        check(Some(3), &mixed, &["start c", "replace b"]);
    }

    #[test]
    fn a_changed_environment_makes_replicas_outdated() {
        let hash = SpecHash::new("new");
        let mut with_env = container("a", "new", Running);
        with_env
            .labels
            .insert(labels::ENV_DIGEST.to_owned(), "old-env".to_owned());
        let target = Target {
            spec_hash: &hash,
            n_replicas: 1,
            env_digest: Some("new-env"),
        };
        assert_eq!(
            plan_replicas(Some(&target), std::slice::from_ref(&with_env)),
            [Step::Replace {
                id: "id-a".into(),
                name: "a".into()
            }]
        );
        with_env
            .labels
            .insert(labels::ENV_DIGEST.to_owned(), "new-env".to_owned());
        assert_eq!(plan_replicas(Some(&target), &[with_env]), []);
    }

    #[test]
    fn removal_takes_everything() {
        check(
            None,
            &[
                container("a", "old", Running),
                container("b", "new", Exited),
            ],
            &["remove a", "remove b"],
        );
    }
}
