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

pub(crate) mod blue_green;
pub(crate) mod canary;
pub(crate) mod depends;
pub(crate) mod gate;
mod pods;
mod replicas;
mod service;

pub(crate) use pods::{StatefulStep, StatefulTarget, plan_statefulset, pod_ordinal};
pub(crate) use replicas::{Step, Target, plan_canary, plan_replicas};
pub use service::{
    SERVICE_DIGEST, ServiceStep, ServiceTarget, plan_service, swarm_gaps, swarm_notes,
};

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::manifest::spec::{Spec, plugin_refusal};
use crate::manifest::{Manifest, Resource};
use crate::model::{Kind, ResourceKey, SpecHash};
use crate::runtime::Container;

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
    /// The resource fails when applied, before any of its containers is touched (a plugin
    /// block whose plugin is not installed): its containers stay as they are.
    Fail,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Create => "create",
            Action::Replace => "replace",
            Action::Update => "update",
            Action::Delete => "delete",
            Action::Unchanged => "unchanged",
            Action::Fail => "fail",
        }
    }
}

/// One changed top-level field of a spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldChange {
    pub(crate) field: String,
    /// In the spec hash: changing it replaces containers.
    pub(crate) hashed: bool,
    /// Short renderings of the old and new value (`None`: absent). Secret-bearing fields
    /// (`env`, `token`) show which keys changed, never values.
    pub(crate) before: Option<String>,
    pub(crate) after: Option<String>,
}

/// What a commit would do to one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourcePlan {
    pub key: ResourceKey,
    pub action: Action,
    pub(crate) changes: Vec<FieldChange>,
    /// Container steps of a deployment (or of any resource leaving the repo).
    pub(crate) steps: Vec<Step>,
    /// Pod steps of a statefulset, with their ordinals, in execution order.
    pub(crate) pod_steps: Vec<StatefulStep>,
    /// Why applying fails (`Action::Fail`): the message the resource's status will carry.
    pub failure: Option<String>,
}

/// Why applying `spec` fails before any container of `key` is touched, as the handler
/// records it: a plugin-owned block, since the agent installs no plugins.
pub(crate) fn apply_failure(key: &ResourceKey, spec: &Spec) -> Option<String> {
    let blocks = match spec {
        Spec::Deployment(deployment) => &deployment.plugin_blocks,
        Spec::Statefulset(statefulset) => &statefulset.plugin_blocks,
        _ => return None,
    };
    plugin_refusal(key, blocks)
}

/// A resource's spec as the agent's desired state holds it, with its canonical JSON: the form
/// the store keeps and compares (two specs are equal exactly when their JSON is), so a plan
/// tells an unchanged resource by one string comparison instead of walking both specs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentSpec {
    pub spec: Spec,
    json: String,
}

impl CurrentSpec {
    /// `spec` with its JSON made here.
    pub fn new(spec: Spec) -> CurrentSpec {
        let json = spec.to_json();
        CurrentSpec { spec, json }
    }

    /// A spec and the JSON the store kept for it (`Desired::spec_json`), which the store wrote
    /// from it. JSON an older version wrote differently only sends the comparison down the
    /// field-by-field path (`diff_specs`), which reads the specs: the plan is the same.
    pub(crate) fn stored(spec: Spec, json: String) -> CurrentSpec {
        CurrentSpec { spec, json }
    }
}

/// Plans one resource: `current` is what the agent's desired state holds now, `next` what the
/// commit declares, `equal` whether the two are equal when that is already known (`None`:
/// compare them), `actual` the resource's containers (empty when unknown or none).
pub(crate) fn plan_resource(
    key: &ResourceKey,
    current: Option<&Spec>,
    next: Option<&Spec>,
    equal: Option<bool>,
    actual: &[Container],
    scaled: Option<usize>,
) -> ResourcePlan {
    let changes = diff_specs(key.kind, current, next, equal);
    if let Some(failure) = next.and_then(|spec| apply_failure(key, spec)) {
        return ResourcePlan {
            key: key.clone(),
            action: Action::Fail,
            changes,
            steps: Vec::new(),
            pod_steps: Vec::new(),
            failure: Some(failure),
        };
    }
    // The spec hash is only ever compared with containers' labels: with no container, it is
    // never read, and not computed (serialising and hashing is most of a plan's cost).
    let hash_of = |spec: &Spec| {
        if actual.is_empty() {
            SpecHash::new(String::new())
        } else {
            spec.spec_hash(key)
        }
    };
    let (steps, pod_steps) = match next {
        Some(spec @ Spec::Deployment(deployment)) => {
            let hash = hash_of(spec);
            let target = Target {
                spec_hash: &hash,
                n_replicas: deployment.effective_replicas(scaled),
                env_digest: None,
                // `plan` compares specs; what a release's images run as is the host's.
                images: None,
                // Read only when a container is replaced or retired: with none, not worked out.
                surge: !actual.is_empty() && deployment.surges(),
            };
            (plan_replicas(Some(&target), actual), Vec::new())
        }
        Some(spec @ Spec::Statefulset(_)) => {
            let hash = hash_of(spec);
            let target = StatefulTarget {
                spec_hash: &hash,
                n_replicas: spec.n_replicas(),
                env_digests: None,
                images: None,
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
        failure: None,
    }
}

/// The plan of every resource in the commit or in the agent's desired state, by key.
pub fn plan_all(
    manifest: &Manifest,
    current: &BTreeMap<ResourceKey, CurrentSpec>,
    actual: &BTreeMap<ResourceKey, Vec<Container>>,
    scaled: &BTreeMap<ResourceKey, usize>,
) -> Vec<ResourcePlan> {
    let plan = |key: &ResourceKey,
                current: Option<&CurrentSpec>,
                next: Option<&Resource>,
                actual: Option<&Vec<Container>>| {
        // Equal JSON, equal specs: most of a commit is told apart without walking a spec.
        let equal = current
            .zip(next)
            .map(|(current, next)| current.json == next.spec_json());
        plan_resource(
            key,
            current.map(|current| &current.spec),
            next.map(|next| &next.spec),
            equal,
            actual.map_or(&[][..], Vec::as_slice),
            scaled.get(key).copied(),
        )
    };
    // A loaded manifest is ordered by key, each key once: walked beside the sorted maps, no
    // key set is built and nothing looked up by key (10,000 resources: most of a plan).
    if !manifest.resources.is_sorted_by(|a, b| a.key < b.key) {
        let next: BTreeMap<&ResourceKey, &Resource> = manifest
            .resources
            .iter()
            .map(|resource| (&resource.key, &**resource))
            .collect();
        let keys: BTreeSet<&ResourceKey> = next
            .keys()
            .copied()
            .chain(current.keys())
            .chain(actual.keys())
            .collect();
        return keys
            .into_iter()
            .map(|key| {
                let next = next.get(key).copied();
                plan(key, current.get(key), next, actual.get(key))
            })
            .collect();
    }
    let mut next = manifest.resources.iter().peekable();
    let mut current = current.iter().peekable();
    let mut actual = actual.iter().peekable();
    let mut plans = Vec::with_capacity(manifest.resources.len().max(current.len()));
    loop {
        let key = [
            next.peek().map(|resource| &resource.key),
            current.peek().map(|(key, _)| *key),
            actual.peek().map(|(key, _)| *key),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(key) = key else {
            break;
        };
        let current = current
            .next_if(|(other, _)| *other == key)
            .map(|(_, spec)| spec);
        let actual = actual
            .next_if(|(other, _)| *other == key)
            .map(|(_, containers)| containers);
        let resource = next
            .next_if(|resource| resource.key == *key)
            .map(|resource| &**resource);
        plans.push(plan(key, current, resource, actual));
    }
    plans
}

/// The top-level fields that differ between two specs of one kind.
fn diff_specs(
    kind: Kind,
    current: Option<&Spec>,
    next: Option<&Spec>,
    equal: Option<bool>,
) -> Vec<FieldChange> {
    let (Some(current), Some(next)) = (current, next) else {
        return Vec::new();
    };
    if equal.unwrap_or_else(|| current == next) {
        // Equal specs serialise equally: no field differs (most of a commit, most of the time).
        return Vec::new();
    }
    let as_object = |spec: &Spec| -> serde_json::Map<String, Value> {
        match spec.to_json_value() {
            Value::Object(map) => map,
            _ => serde_json::Map::new(),
        }
    };
    let before = as_object(current);
    let after = as_object(next);
    let fields: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
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
                hashed: Spec::is_hashed_field(kind, field),
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

/// Each step in a word or two (`create`, `replace <name>`), for the planners' tests.
#[cfg(test)]
fn test_step_names(steps: &[Step]) -> Vec<String> {
    steps
        .iter()
        .map(|step| match step {
            Step::Create => "create".to_owned(),
            Step::Start { name, .. } => format!("start {name}"),
            Step::Replace { name, .. } => format!("replace {name}"),
            Step::Remove { name, .. } => format!("remove {name}"),
            Step::Retire { name, .. } => format!("retire {name}"),
        })
        .collect()
}

/// A container labelled with `hash`, for the planners' tests.
#[cfg(test)]
fn test_container(name: &str, hash: &str, state: crate::runtime::ContainerState) -> Container {
    Container {
        id: format!("id-{name}"),
        name: name.to_owned(),
        image: "img".to_owned(),
        labels: BTreeMap::from([(
            crate::runtime::labels::MANIFEST_HASH.to_owned(),
            hash.to_owned(),
        )]),
        state,
    }
}

#[cfg(test)]
mod bounds_tests {
    use super::*;
    use crate::manifest::spec::bounds::MAX_REPLICA_COUNT;
    use crate::model::SpecHash;

    /// Issue 10: desired state an older agent stored unchecked (`replicas = 1e12`) never makes
    /// planning allocate in proportion: every count is clamped to `MAX_REPLICAS`, in the spec
    /// (what the store records and reads) and again in the planners.
    #[test]
    fn a_stored_count_past_the_bound_plans_at_most_the_bound() -> Result<(), String> {
        let hash = SpecHash::new("new");
        for n_replicas in [1_000_000_000_000, usize::MAX] {
            let target = Target {
                spec_hash: &hash,
                n_replicas,
                env_digest: None,
                images: None,
                surge: false,
            };
            assert_eq!(plan_replicas(Some(&target), &[]).len(), MAX_REPLICA_COUNT);
            let pods = StatefulTarget {
                spec_hash: &hash,
                n_replicas,
                env_digests: None,
                images: None,
            };
            assert_eq!(plan_statefulset(Some(&pods), &[]).len(), MAX_REPLICA_COUNT);
        }
        for (kind, json, scaled, expected) in [
            (
                Kind::Deployment,
                r#"{"replicas":1000000000000}"#,
                None,
                1000,
            ),
            (
                Kind::Statefulset,
                r#"{"replicas":9223372036854775807}"#,
                None,
                1000,
            ),
            (
                Kind::Deployment,
                r#"{"autoscale":{"min":1,"max":1000000000000,"cpu_target":50}}"#,
                Some(usize::MAX),
                1000,
            ),
            (
                Kind::Deployment,
                r#"{"autoscale":{"min":1000000000000,"max":1000000000000,"cpu_target":50}}"#,
                Some(1),
                1000,
            ),
        ] {
            let spec = Spec::from_json(kind, json).map_err(|error| error.to_string())?;
            let n = match (&spec, scaled) {
                (Spec::Deployment(deployment), Some(scaled)) => {
                    deployment.effective_replicas(Some(scaled))
                }
                _ => spec.n_replicas(),
            };
            assert_eq!(n, expected, "{json}");
        }
        Ok(())
    }
}

#[cfg(test)]
mod failure_tests {
    use super::*;
    use crate::manifest::spec::{DeploymentSpec, PluginBlock};
    use crate::runtime::ContainerState;

    /// Issue 12: a workload with a plugin block plans as `Fail` with the message its status
    /// will carry and no step at all, whatever its containers: they are kept as they are.
    #[test]
    fn a_plugin_block_plans_a_failure_and_no_step() -> Result<(), String> {
        let key = ResourceKey::new(Kind::Deployment, "prod", "esl");
        let mut old = DeploymentSpec::default();
        old.container.image = "esl:1".into();
        let mut new = old.clone();
        new.container.image = "esl:2".into();
        new.replicas = Some(3);
        new.plugin_blocks = vec![PluginBlock {
            block_type: "trafik".into(),
            at: "esl.hcl:13:3".into(),
            ..PluginBlock::default()
        }];
        let old_hash = Spec::Deployment(old.clone()).spec_hash(&key);
        let running = [test_container(
            "prod-esl.ab12",
            old_hash.as_str(),
            ContainerState::Running,
        )];
        let plan = plan_resource(
            &key,
            Some(&Spec::Deployment(old)),
            Some(&Spec::Deployment(new)),
            None,
            &running,
            None,
        );
        assert_eq!(plan.action, Action::Fail);
        assert!(plan.steps.is_empty() && plan.pod_steps.is_empty());
        assert_eq!(
            plan.failure.as_deref(),
            Some(
                "deployment/prod/esl: block \"trafik\" belongs to a plugin named \"trafik\", which is not installed — run `vd plugins:install <source>` or remove the block (at esl.hcl:13:3; voodu-agent installs no plugins)"
            )
        );
        let fields: Vec<&str> = plan.changes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, ["image", "plugin_blocks", "replicas"]);
        Ok(())
    }
}

#[cfg(test)]
mod walk_tests {
    use std::sync::Arc;

    use super::*;
    use crate::manifest::{Diagnostic, Resource};
    use crate::runtime::ContainerState;

    fn deployment(image: &str) -> Result<Spec, String> {
        Spec::from_json(Kind::Deployment, &format!(r#"{{"image":"{image}"}}"#))
            .map_err(|error| error.to_string())
    }

    fn key(name: &str) -> ResourceKey {
        ResourceKey::new(Kind::Deployment, "s", name)
    }

    /// `plan_all` walks a sorted manifest beside the maps; an unsorted one (never loaded so)
    /// goes through the key set. Both plan every key of the three inputs once, in key order,
    /// the same way: created, changed, unchanged with a current container, deleted, orphaned.
    #[test]
    fn the_sorted_walk_plans_as_the_key_set_does() -> Result<(), String> {
        let resource = |name: &str, image: &str| -> Result<Arc<Resource>, String> {
            Ok(Arc::new(Resource {
                key: key(name),
                spec: deployment(image)?,
                origin: Diagnostic {
                    path: "f.hcl".into(),
                    line: 1,
                    col: 1,
                    message: String::new(),
                },
                json: Default::default(),
            }))
        };
        let mut manifest = Manifest {
            resources: vec![
                resource("a", "a:1")?,
                resource("b", "b:2")?,
                resource("c", "c:1")?,
                resource("x", "x:1")?,
            ],
            ..Manifest::default()
        };
        let current = BTreeMap::from([
            (key("b"), CurrentSpec::new(deployment("b:1")?)),
            (key("c"), CurrentSpec::new(deployment("c:1")?)),
            (key("z"), CurrentSpec::new(deployment("z:1")?)),
        ]);
        let hash = deployment("c:1")?.spec_hash(&key("c"));
        let actual = BTreeMap::from([
            (
                key("c"),
                vec![test_container(
                    "s-c.1",
                    hash.as_str(),
                    ContainerState::Running,
                )],
            ),
            (
                key("y"),
                vec![test_container("s-y.1", "old", ContainerState::Running)],
            ),
        ]);
        let scaled = BTreeMap::new();
        let walked = plan_all(&manifest, &current, &actual, &scaled);
        manifest.resources.reverse();
        let by_set = plan_all(&manifest, &current, &actual, &scaled);
        assert_eq!(walked, by_set);
        let seen: Vec<(&str, Action)> = walked
            .iter()
            .map(|plan| (plan.key.name.as_str(), plan.action))
            .collect();
        assert_eq!(
            seen,
            [
                ("a", Action::Create),
                ("b", Action::Replace),
                ("c", Action::Unchanged),
                ("x", Action::Create),
                ("y", Action::Delete),
                ("z", Action::Delete),
            ]
        );
        Ok(())
    }
}
