//! Decide: desired state and the containers that exist → the ordered steps that converge
//! them. Pure, so the deployment handler and the `plan` command cannot disagree, and the
//! logic is tested without IO.
//!
//! Invariants: a container whose spec hash matches desired is never replaced (scaling never
//! churns survivors); replacements are separate steps, executed one slot at a time; the plan
//! is idempotent: planning again on the result yields no steps.

use crate::model::SpecHash;
use crate::runtime::labels;
use crate::runtime::{Container, ContainerState};

/// What a workload resource wants: `n_replicas` containers labelled with `spec_hash`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target<'a> {
    pub spec_hash: &'a SpecHash,
    pub n_replicas: usize,
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
    let (current, outdated): (Vec<&Container>, Vec<&Container>) =
        actual.into_iter().partition(|container| {
            container.label(labels::MANIFEST_HASH) == Some(target.spec_hash.as_str())
        });
    let keep = current.len().min(target.n_replicas);
    let mut removes: Vec<Step> = current[keep..].iter().map(remove).collect();
    let starts = current[..keep]
        .iter()
        .filter(|container| container.state != ContainerState::Running)
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
