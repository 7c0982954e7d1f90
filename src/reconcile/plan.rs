//! Decide: desired state and the containers that exist → the ordered steps that converge
//! them (`plan_replicas` for deployments, `plan_statefulset` for statefulset pods), and, for
//! the `plan` command, what a new commit would do to each resource (`plan_resource`: create,
//! update which fields, replace because of which hashed field, delete, or leave). Pure, so the
//! handlers and `plan` cannot disagree, and the logic is tested without IO.
//!
//! Invariants: a container whose spec hash matches desired is never replaced (scaling never
//! churns survivors); replacements are separate steps, executed one slot at a time; the plan
//! is idempotent: planning again on the result yields no steps. Statefulset pods keep their
//! ordinals: surplus pods go highest ordinal first, missing (or stopped) ones come back
//! lowest ordinal first, outdated ones are replaced highest ordinal first (ordinal 0 last).

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

/// What a statefulset wants: pods `0..n_replicas`, each labelled with `spec_hash` and, when
/// known, with its own environment digest (`env_digests[ordinal]`: the identity variables
/// differ per pod, so each pod's digest does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatefulTarget<'a> {
    pub spec_hash: &'a SpecHash,
    pub n_replicas: usize,
    /// Indexed by ordinal; `None` when the environment is unknown (the `plan` command).
    pub env_digests: Option<&'a [String]>,
}

impl StatefulTarget<'_> {
    /// Whether `pod` runs what its ordinal wants (spec hash and environment digest).
    pub fn is_current(&self, ordinal: usize, pod: &Container) -> bool {
        Target {
            spec_hash: self.spec_hash,
            n_replicas: 1,
            env_digest: self
                .env_digests
                .and_then(|digests| digests.get(ordinal))
                .map(String::as_str),
        }
        .is_current(pod)
    }
}

/// One action on a statefulset's pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatefulStep {
    /// Create and start the pod of this ordinal (its volumes and init containers first).
    Create { ordinal: usize },
    /// Start a current pod that is not running (created, or stopped by hand).
    Start {
        ordinal: usize,
        id: String,
        name: String,
    },
    /// Replace an outdated pod: remove it, then create and start it again under the same
    /// name, with the same volumes.
    Replace {
        ordinal: usize,
        id: String,
        name: String,
    },
    /// Remove a pod that is not wanted (an ordinal past `n_replicas`, a duplicate of an
    /// ordinal, or a container without one). Its volumes stay.
    Remove {
        ordinal: Option<usize>,
        id: String,
        name: String,
    },
}

impl StatefulStep {
    /// The pod's ordinal (`None` for a container that carries none).
    pub fn ordinal(&self) -> Option<usize> {
        match self {
            StatefulStep::Create { ordinal }
            | StatefulStep::Start { ordinal, .. }
            | StatefulStep::Replace { ordinal, .. } => Some(*ordinal),
            StatefulStep::Remove { ordinal, .. } => *ordinal,
        }
    }
}

/// The ordinal a statefulset pod carries in its `voodu.replica_ordinal` label.
pub fn pod_ordinal(pod: &Container) -> Option<usize> {
    pod.label(labels::REPLICA_ORDINAL)?.parse().ok()
}

/// Steps for a statefulset's pods, in the order they must run. `target == None` means the
/// resource left the repo. Order: removals highest ordinal first (scale-down top-down);
/// then, lowest ordinal first, missing pods created and stopped current pods started
/// (scale-up bottom-up); then outdated pods replaced highest ordinal first (rolling
/// replacement top-down, ordinal 0 last).
pub fn plan_statefulset(
    target: Option<&StatefulTarget<'_>>,
    actual: &[Container],
) -> Vec<StatefulStep> {
    let n_replicas = target.map_or(0, |target| target.n_replicas);
    let is_current = |ordinal: usize, pod: &Container| {
        target.is_some_and(|target| target.is_current(ordinal, pod))
    };
    let mut by_ordinal: BTreeMap<usize, Vec<&Container>> = BTreeMap::new();
    let mut surplus: Vec<(Option<usize>, &Container)> = Vec::new();
    for pod in actual {
        match pod_ordinal(pod) {
            Some(ordinal) if ordinal < n_replicas => {
                by_ordinal.entry(ordinal).or_default().push(pod);
            }
            ordinal => surplus.push((ordinal, pod)),
        }
    }
    // One pod per ordinal: keep a current one, else a running one, else the first by name.
    let mut kept: BTreeMap<usize, &Container> = BTreeMap::new();
    for (ordinal, mut pods) in by_ordinal {
        pods.sort_by_key(|pod| {
            (
                !is_current(ordinal, pod),
                pod.state != ContainerState::Running,
                pod.name.clone(),
            )
        });
        kept.insert(ordinal, pods[0]);
        surplus.extend(pods[1..].iter().map(|pod| (Some(ordinal), *pod)));
    }
    // Highest ordinal first, containers without an ordinal last, by name within one ordinal.
    surplus.sort_by_key(|(ordinal, pod)| (std::cmp::Reverse(*ordinal), pod.name.clone()));
    let mut steps: Vec<StatefulStep> = surplus
        .into_iter()
        .map(|(ordinal, pod)| StatefulStep::Remove {
            ordinal,
            id: pod.id.clone(),
            name: pod.name.clone(),
        })
        .collect();
    for ordinal in 0..n_replicas {
        match kept.get(&ordinal) {
            None => steps.push(StatefulStep::Create { ordinal }),
            Some(pod) if is_current(ordinal, pod) && pod.state != ContainerState::Running => {
                steps.push(StatefulStep::Start {
                    ordinal,
                    id: pod.id.clone(),
                    name: pod.name.clone(),
                });
            }
            Some(_) => {}
        }
    }
    for (ordinal, pod) in kept.iter().rev() {
        if !is_current(*ordinal, pod) {
            steps.push(StatefulStep::Replace {
                ordinal: *ordinal,
                id: pod.id.clone(),
                name: pod.name.clone(),
            });
        }
    }
    steps
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
    /// Container steps of a deployment (or of any resource leaving the repo).
    pub steps: Vec<Step>,
    /// Pod steps of a statefulset, with their ordinals, in execution order.
    pub pod_steps: Vec<StatefulStep>,
}

/// Plans one resource: `current` is what the agent's desired state holds now, `next` what the
/// commit declares, `actual` the resource's containers (empty when unknown or none).
pub fn plan_resource(
    key: &ResourceKey,
    current: Option<&Spec>,
    next: Option<&Spec>,
    actual: &[Container],
    scaled: Option<usize>,
) -> ResourcePlan {
    let changes = diff_specs(key.kind, current, next);
    let (steps, pod_steps) = match next {
        Some(spec @ Spec::Deployment(deployment)) => {
            let hash = spec.spec_hash(key);
            let target = Target {
                spec_hash: &hash,
                n_replicas: deployment.effective_replicas(scaled),
                env_digest: None,
            };
            (plan_replicas(Some(&target), actual), Vec::new())
        }
        Some(spec @ Spec::Statefulset(_)) => {
            let hash = spec.spec_hash(key);
            let target = StatefulTarget {
                spec_hash: &hash,
                n_replicas: spec.n_replicas(),
                env_digests: None,
            };
            (Vec::new(), plan_statefulset(Some(&target), actual))
        }
        Some(_) => (Vec::new(), Vec::new()),
        None if key.kind == Kind::Statefulset => (Vec::new(), plan_statefulset(None, actual)),
        None => (plan_replicas(None, actual), Vec::new()),
    };
    let replaces = steps
        .iter()
        .any(|step| matches!(step, Step::Replace { .. }))
        || pod_steps
            .iter()
            .any(|step| matches!(step, StatefulStep::Replace { .. }));
    let action = match (current, next) {
        (None, None) if actual.is_empty() => Action::Unchanged,
        (_, None) => Action::Delete,
        (None, Some(_)) if actual.is_empty() => Action::Create,
        _ if replaces || changes.iter().any(|change| change.hashed) => Action::Replace,
        _ if !changes.is_empty()
            || !steps.is_empty()
            || !pod_steps.is_empty()
            || current.is_none() =>
        {
            Action::Update
        }
        _ => Action::Unchanged,
    };
    ResourcePlan {
        key: key.clone(),
        action,
        changes,
        steps,
        pod_steps,
    }
}

/// The plan of every resource in the commit or in the agent's desired state.
pub fn plan_all(
    manifest: &Manifest,
    current: &BTreeMap<ResourceKey, Spec>,
    actual: &BTreeMap<ResourceKey, Vec<Container>>,
    scaled: &BTreeMap<ResourceKey, usize>,
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
                scaled.get(key).copied(),
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

    fn pod(ordinal: usize, hash: &str, state: ContainerState) -> Container {
        let mut pod = container(&format!("db.{ordinal}"), hash, state);
        pod.labels
            .insert(labels::REPLICA_ORDINAL.to_owned(), ordinal.to_string());
        pod
    }

    fn pod_text(step: &StatefulStep) -> String {
        match step {
            StatefulStep::Create { ordinal } => format!("create {ordinal}"),
            StatefulStep::Start { name, .. } => format!("start {name}"),
            StatefulStep::Replace { name, .. } => format!("replace {name}"),
            StatefulStep::Remove { name, .. } => format!("remove {name}"),
        }
    }

    fn check_pods(n_replicas: Option<usize>, actual: &[Container], expected: &[&str]) {
        let hash = SpecHash::new("new");
        let target = n_replicas.map(|n_replicas| StatefulTarget {
            spec_hash: &hash,
            n_replicas,
            env_digests: None,
        });
        let steps: Vec<String> = plan_statefulset(target.as_ref(), actual)
            .iter()
            .map(pod_text)
            .collect();
        assert_eq!(steps, expected);
    }

    #[test]
    fn statefulset_pods_are_created_lowest_ordinal_first() {
        check_pods(Some(3), &[], &["create 0", "create 1", "create 2"]);
        check_pods(
            Some(4),
            &[pod(1, "new", Running), pod(0, "new", Running)],
            &["create 2", "create 3"],
        );
        check_pods(
            Some(3),
            &[pod(1, "new", Running)],
            &["create 0", "create 2"],
        );
    }

    #[test]
    fn statefulset_pods_are_removed_highest_ordinal_first() {
        let four = [
            pod(2, "new", Running),
            pod(0, "new", Running),
            pod(3, "new", Exited),
            pod(1, "new", Running),
        ];
        check_pods(
            Some(1),
            &four,
            &["remove db.3", "remove db.2", "remove db.1"],
        );
        check_pods(Some(3), &four, &["remove db.3"]);
        check_pods(
            None,
            &four,
            &["remove db.3", "remove db.2", "remove db.1", "remove db.0"],
        );
    }

    #[test]
    fn outdated_statefulset_pods_are_replaced_highest_ordinal_first() {
        let old = [
            pod(0, "old", Running),
            pod(2, "old", Running),
            pod(1, "old", Running),
        ];
        check_pods(
            Some(3),
            &old,
            &["replace db.2", "replace db.1", "replace db.0"],
        );
        // Scaling and a new spec together: surplus goes first, new ordinals are created
        // (with the new spec) before the survivors are replaced.
        check_pods(
            Some(4),
            &old,
            &["create 3", "replace db.2", "replace db.1", "replace db.0"],
        );
        check_pods(
            Some(1),
            &old,
            &["remove db.2", "remove db.1", "replace db.0"],
        );
        // A stopped outdated pod is replaced, not started.
        check_pods(Some(1), &[pod(0, "old", Exited)], &["replace db.0"]);
    }

    #[test]
    fn a_half_done_statefulset_rollout_resumes_without_duplicates() {
        // Stopped between removing pod 1 and creating it again.
        check_pods(
            Some(3),
            &[pod(0, "old", Running), pod(2, "new", Running)],
            &["create 1", "replace db.0"],
        );
        // Stopped between creating pod 1 and starting it.
        check_pods(
            Some(3),
            &[
                pod(0, "old", Running),
                pod(1, "new", Created),
                pod(2, "new", Running),
            ],
            &["start db.1", "replace db.0"],
        );
        // Only ordinal 0 left to do; then nothing.
        check_pods(
            Some(3),
            &[
                pod(0, "old", Running),
                pod(1, "new", Running),
                pod(2, "new", Running),
            ],
            &["replace db.0"],
        );
        check_pods(
            Some(3),
            &[
                pod(0, "new", Running),
                pod(1, "new", Running),
                pod(2, "new", Running),
            ],
            &[],
        );
    }

    #[test]
    fn stopped_statefulset_pods_are_started_in_ordinal_order() {
        check_pods(
            Some(3),
            &[pod(2, "new", Exited), pod(0, "new", Created)],
            &["start db.0", "create 1", "start db.2"],
        );
    }

    #[test]
    fn duplicates_and_pods_without_an_ordinal_are_removed() {
        let mut stray = container("stray", "new", Running);
        stray.labels.remove(labels::REPLICA_ORDINAL);
        let mut twin = pod(1, "old", Running);
        twin.name = "db.1-copy".into();
        twin.id = "id-twin".into();
        check_pods(
            Some(2),
            &[stray, twin, pod(1, "new", Exited), pod(0, "new", Running)],
            // The current copy of ordinal 1 stays (and is started), the outdated one goes.
            &["remove db.1-copy", "remove stray", "start db.1"],
        );
    }

    #[test]
    fn each_pod_is_current_for_its_own_environment() {
        let hash = SpecHash::new("new");
        let digests = ["env-0".to_owned(), "env-1".to_owned()];
        let target = StatefulTarget {
            spec_hash: &hash,
            n_replicas: 2,
            env_digests: Some(&digests),
        };
        let with_digest = |ordinal: usize, digest: &str| {
            let mut pod = pod(ordinal, "new", Running);
            pod.labels
                .insert(labels::ENV_DIGEST.to_owned(), digest.to_owned());
            pod
        };
        let steps: Vec<String> = plan_statefulset(
            Some(&target),
            &[with_digest(0, "env-0"), with_digest(1, "env-0")],
        )
        .iter()
        .map(pod_text)
        .collect();
        assert_eq!(steps, ["replace db.1"]);
        assert!(
            plan_statefulset(
                Some(&target),
                &[with_digest(0, "env-0"), with_digest(1, "env-1")]
            )
            .is_empty()
        );
    }

    /// Every host state of up to 4 ordinals (each absent, or current/outdated and
    /// running/created/exited) against every desired count 0..=4: executing the plan converges
    /// in one pass, touches each ordinal at most once, never touches a running current pod it
    /// keeps, and orders creates/starts upwards, removes and replaces downwards.
    #[test]
    fn statefulset_plans_converge_in_order_from_every_state() {
        const CHOICES: [Option<(&str, ContainerState)>; 7] = [
            None,
            Some(("new", Running)),
            Some(("new", Created)),
            Some(("new", Exited)),
            Some(("old", Running)),
            Some(("old", Created)),
            Some(("old", Exited)),
        ];
        let hash = SpecHash::new("new");
        let mut n_cases = 0;
        for n_replicas in 0..=4 {
            let target = StatefulTarget {
                spec_hash: &hash,
                n_replicas,
                env_digests: None,
            };
            for mut code in 0..CHOICES.len().pow(4) {
                let mut actual = Vec::new();
                for ordinal in 0..4 {
                    if let Some((hash, state)) = CHOICES[code % CHOICES.len()] {
                        actual.push(pod(ordinal, hash, state));
                    }
                    code /= CHOICES.len();
                }
                let steps = plan_statefulset(Some(&target), &actual);
                let context = format!("n={n_replicas} actual={actual:?} steps={steps:?}");
                // Each ordinal is touched at most once.
                let touched: Vec<Option<usize>> = steps.iter().map(StatefulStep::ordinal).collect();
                let distinct: BTreeSet<&Option<usize>> = touched.iter().collect();
                assert_eq!(distinct.len(), touched.len(), "{context}");
                // Phases in order: removes, then creates/starts, then replaces.
                let phase = |step: &StatefulStep| match step {
                    StatefulStep::Remove { .. } => 0,
                    StatefulStep::Create { .. } | StatefulStep::Start { .. } => 1,
                    StatefulStep::Replace { .. } => 2,
                };
                assert!(
                    steps
                        .windows(2)
                        .all(|pair| phase(&pair[0]) <= phase(&pair[1])),
                    "{context}"
                );
                for pair in steps.windows(2) {
                    if phase(&pair[0]) == phase(&pair[1]) {
                        let (a, b) = (pair[0].ordinal(), pair[1].ordinal());
                        if phase(&pair[0]) == 1 {
                            assert!(a < b, "bottom-up: {context}");
                        } else {
                            assert!(a > b, "top-down: {context}");
                        }
                    }
                }
                // Running current pods that stay are never touched.
                for pod in &actual {
                    let ordinal = pod_ordinal(pod).unwrap_or(usize::MAX);
                    if ordinal < n_replicas
                        && pod.state == Running
                        && target.is_current(ordinal, pod)
                    {
                        assert!(!touched.contains(&Some(ordinal)), "churn: {context}");
                    }
                }
                // Executing the steps converges: planning again yields nothing.
                let mut host: BTreeMap<usize, Container> = actual
                    .iter()
                    .map(|pod| (pod_ordinal(pod).unwrap_or(usize::MAX), pod.clone()))
                    .collect();
                for step in &steps {
                    match step {
                        StatefulStep::Remove { ordinal, .. } => {
                            host.remove(&ordinal.unwrap_or(usize::MAX));
                        }
                        StatefulStep::Create { ordinal }
                        | StatefulStep::Start { ordinal, .. }
                        | StatefulStep::Replace { ordinal, .. } => {
                            host.insert(*ordinal, pod(*ordinal, "new", Running));
                        }
                    }
                }
                let after: Vec<Container> = host.into_values().collect();
                assert_eq!(after.len(), n_replicas, "{context}");
                assert_eq!(plan_statefulset(Some(&target), &after), [], "{context}");
                n_cases += 1;
            }
        }
        assert_eq!(n_cases, 5 * 7usize.pow(4));
    }

    #[test]
    fn plan_resource_shows_statefulset_steps_with_ordinals() {
        let key = ResourceKey::new(Kind::Statefulset, "data", "db");
        let spec = |image: &str| {
            let mut spec = crate::manifest::spec::StatefulsetSpec {
                replicas: Some(2),
                ..Default::default()
            };
            spec.container.image = image.to_owned();
            Spec::Statefulset(spec)
        };
        let (old, new) = (spec("pg:16"), spec("pg:17"));
        let old_hash = old.spec_hash(&key);
        let pods: Vec<Container> = (0..3)
            .map(|ordinal| pod(ordinal, old_hash.as_str(), Running))
            .collect();
        let plan = plan_resource(&key, Some(&old), Some(&new), &pods, None);
        assert_eq!(plan.action, Action::Replace);
        assert!(plan.steps.is_empty());
        assert_eq!(
            plan.pod_steps.iter().map(pod_text).collect::<Vec<_>>(),
            ["remove db.2", "replace db.1", "replace db.0"]
        );
        let unchanged = plan_resource(&key, Some(&old), Some(&old), &pods[..2], None);
        assert_eq!(
            (unchanged.action, unchanged.pod_steps),
            (Action::Unchanged, vec![])
        );
        let gone = plan_resource(&key, Some(&old), None, &pods, None);
        assert_eq!(gone.action, Action::Delete);
        assert_eq!(
            gone.pod_steps.iter().map(pod_text).collect::<Vec<_>>(),
            ["remove db.2", "remove db.1", "remove db.0"]
        );
    }

    #[test]
    fn an_autoscaled_count_is_planned_within_the_new_bounds() {
        use crate::manifest::spec::{Autoscale, DeploymentSpec};
        let key = ResourceKey::new(Kind::Deployment, "shop", "web");
        let spec = |max: i64| {
            Spec::Deployment(DeploymentSpec {
                replicas: Some(1),
                autoscale: Some(Autoscale {
                    min: 1,
                    max,
                    cpu_target: 50,
                    ..Autoscale::default()
                }),
                ..DeploymentSpec::default()
            })
        };
        let running_at = |max: i64| -> Vec<Container> {
            let hash = spec(max).spec_hash(&key);
            ["a", "b", "c", "d"]
                .iter()
                .map(|name| container(name, hash.as_str(), ContainerState::Running))
                .collect()
        };
        let running = running_at(5);
        let text = |plan: &ResourcePlan| -> Vec<String> {
            plan.steps
                .iter()
                .map(|step| match step {
                    Step::Remove { name, .. } => format!("remove {name}"),
                    other => format!("{other:?}"),
                })
                .collect()
        };
        // The autoscaler runs 4: a commit that keeps `autoscale` keeps them.
        let kept = plan_resource(&key, Some(&spec(5)), Some(&spec(5)), &running, Some(4));
        assert_eq!(text(&kept), Vec::<String>::new());
        // With `max` lowered to 3 (`autoscale` is hashed, so replicas of that spec), 3 run.
        let narrowed = plan_resource(
            &key,
            Some(&spec(3)),
            Some(&spec(3)),
            &running_at(3),
            Some(4),
        );
        assert_eq!(text(&narrowed), ["remove d"]);
        // Without the autoscaler's count, the manifest's replicas.
        let manifest = plan_resource(&key, Some(&spec(5)), Some(&spec(5)), &running, None);
        assert_eq!(text(&manifest), ["remove b", "remove c", "remove d"]);
    }
}
