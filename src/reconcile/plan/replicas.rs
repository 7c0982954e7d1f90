//! `plan_replicas`: a deployment's replicas (interchangeable, named by random ids) → the steps
//! that converge them on a target count, spec hash and environment.
//!
//! A replacement surges (voodu 2026, `drain.mdx`) unless the target says it cannot (a pinned
//! host port): the successor is created first and the outdated replica stays, so the next
//! pass sees one replica more than wanted and plans `Retire` for an outdated one, which the
//! gate lets through once removing it leaves `n_replicas` ready.

use crate::manifest::spec::bounds::MAX_REPLICA_COUNT;
use crate::model::SpecHash;
use crate::runtime::labels;
use crate::runtime::{Container, ContainerState};

/// What a workload resource wants: `n_replicas` containers labelled with `spec_hash` (and,
/// when given, with `env_digest`: a replica whose environment changed is outdated too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target<'a> {
    pub(crate) spec_hash: &'a SpecHash,
    pub(crate) n_replicas: usize,
    pub(crate) env_digest: Option<&'a str>,
    /// When given, what the release's images run as (`voodu.images`): a replica of another
    /// resolution of the same spec is outdated too.
    pub(crate) images: Option<&'a str>,
    /// Whether a replacement starts the successor before the outdated replica goes.
    pub(crate) surge: bool,
}

impl Target<'_> {
    /// Whether `container` runs what the target wants.
    pub(crate) fn is_current(&self, container: &Container) -> bool {
        container.label(labels::MANIFEST_HASH) == Some(self.spec_hash.as_str())
            && self
                .env_digest
                .is_none_or(|digest| container.label(labels::ENV_DIGEST) == Some(digest))
            && self
                .images
                .is_none_or(|images| container.label(labels::IMAGES) == Some(images))
    }
}

/// One action on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Create and start a new replica.
    Create,
    /// Start a current replica that is not running (created, or stopped by hand).
    Start { id: String, name: String },
    /// Replace an outdated replica: remove it, then create and start its successor; with
    /// `surge`, only create and start the successor (the replica is retired later).
    Replace {
        id: String,
        name: String,
        surge: bool,
    },
    /// Remove an outdated replica whose successor runs (a surge's second half).
    Retire { id: String, name: String },
    /// Remove a replica that is no longer wanted.
    Remove { id: String, name: String },
}

/// Running replicas first, then by name (a container's name is unique on the host).
fn running_then_name(a: &&Container, b: &&Container) -> std::cmp::Ordering {
    (a.state != ContainerState::Running, &a.name)
        .cmp(&(b.state != ContainerState::Running, &b.name))
}

/// Steps for a replicated workload. `target == None` means the resource left the repo.
pub(crate) fn plan_replicas(target: Option<&Target<'_>>, actual: &[Container]) -> Vec<Step> {
    let mut actual: Vec<&Container> = actual.iter().collect();
    // Running replicas first, then by name: scale-down keeps running ones, and the order is
    // stable across calls.
    actual.sort_unstable_by(running_then_name);
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
    // Desired state an older agent stored unchecked may ask for any number; never plan (and
    // allocate) past the bound validation enforces.
    let n_replicas = target.n_replicas.min(MAX_REPLICA_COUNT);
    let keep = current.len().min(n_replicas);
    let mut removes: Vec<Step> = current[keep..].iter().map(remove).collect();
    let starts = starts(&current[..keep]);
    let missing = n_replicas - keep;
    let n_replace = missing.min(outdated.len());
    removes.extend(outdated[n_replace..].iter().map(|container| {
        if target.surge {
            Step::Retire {
                id: container.id.clone(),
                name: container.name.clone(),
            }
        } else {
            remove(container)
        }
    }));
    let creates = std::iter::repeat_n(Step::Create, missing - n_replace);
    let replaces = outdated[..n_replace].iter().map(|container| Step::Replace {
        id: container.id.clone(),
        name: container.name.clone(),
        surge: target.surge,
    });
    removes
        .into_iter()
        .chain(starts)
        .chain(creates)
        .chain(replaces)
        .collect()
}

/// Starts of the kept current replicas that are not running (a restarting one is the
/// engine's to bring back: its restart policy's back-off).
fn starts<'a>(kept: &'a [&'a Container]) -> impl Iterator<Item = Step> + 'a {
    kept.iter()
        .filter(|container| {
            !matches!(
                container.state,
                ContainerState::Running | ContainerState::Restarting
            )
        })
        .map(|container| Step::Start {
            id: container.id.clone(),
            name: container.name.clone(),
        })
}

/// Steps for a canary step (`canary {}`): `canary` replicas of the target version beside
/// the outdated (stable) ones, which are left as they are: the new version takes its share of
/// the requests by replica count. Current replicas past `canary` are removed (a smaller
/// step after an edit), a stopped current one is started. Never more than `n_replicas`.
pub(crate) fn plan_canary(target: &Target<'_>, actual: &[Container], canary: usize) -> Vec<Step> {
    let mut current: Vec<&Container> = actual
        .iter()
        .filter(|container| target.is_current(container))
        .collect();
    current.sort_unstable_by(running_then_name);
    let canary = canary.min(target.n_replicas).min(MAX_REPLICA_COUNT);
    let keep = current.len().min(canary);
    let removes = current[keep..].iter().map(|container| Step::Remove {
        id: container.id.clone(),
        name: container.name.clone(),
    });
    let starts = starts(&current[..keep]);
    let creates = std::iter::repeat_n(Step::Create, canary - keep);
    removes.chain(starts).chain(creates).collect()
}

#[cfg(test)]
mod tests {
    use super::super::{ResourcePlan, plan_resource, test_container as container, test_step_names};
    use super::*;
    use crate::manifest::spec::Spec;
    use crate::model::{Kind, ResourceKey};

    fn check(n_replicas: Option<usize>, actual: &[Container], expected: &[&str]) {
        check_with(false, n_replicas, actual, expected);
    }

    fn check_with(surge: bool, n_replicas: Option<usize>, actual: &[Container], expected: &[&str]) {
        let hash = SpecHash::new("new");
        let target = n_replicas.map(|n_replicas| Target {
            spec_hash: &hash,
            n_replicas,
            env_digest: None,
            images: None,
            surge,
        });
        let steps = plan_replicas(target.as_ref(), actual);
        assert_eq!(test_step_names(&steps), expected);
    }

    #[test]
    fn a_canary_step_adds_its_replicas_beside_the_stable_ones_and_never_touches_them() {
        let hash = SpecHash::new("new");
        let target = Target {
            spec_hash: &hash,
            n_replicas: 3,
            env_digest: None,
            images: None,
            surge: true,
        };
        let stable = [
            container("a", "old", Running),
            container("b", "old", Running),
            container("c", "old", Running),
        ];
        let names =
            |actual: &[Container], canary| test_step_names(&plan_canary(&target, actual, canary));
        assert_eq!(names(&stable, 1), ["create"]);
        let mut with_one = stable.to_vec();
        with_one.push(container("d", "new", Running));
        assert!(names(&with_one, 1).is_empty());
        assert_eq!(names(&with_one, 2), ["create"]);
        // A smaller step (an edit mid-rollout, an abort to 0) removes canary replicas only.
        assert_eq!(names(&with_one, 0), ["remove d"]);
        // Never past the deployment's count.
        assert_eq!(names(&with_one, 9), ["create", "create"]);
    }

    #[test]
    fn a_surge_creates_first_and_retires_once_the_successor_exists() {
        // (replicas, actual, plan): a roll of two, pass by pass; the gate decides when.
        let cases: &[(usize, &[Container], &[&str])] = &[
            (
                2,
                &[
                    container("a", "old", Running),
                    container("b", "old", Running),
                ],
                &["replace a", "replace b"],
            ),
            (
                2,
                &[
                    container("a", "old", Running),
                    container("b", "old", Running),
                    container("c", "new", Running),
                ],
                &["retire b", "replace a"],
            ),
            (
                2,
                &[
                    container("a", "old", Running),
                    container("c", "new", Running),
                ],
                &["replace a"],
            ),
            (
                2,
                &[
                    container("a", "old", Running),
                    container("c", "new", Running),
                    container("d", "new", Running),
                ],
                &["retire a"],
            ),
            // A scale-down during a roll retires outdated replicas too.
            (
                1,
                &[
                    container("a", "old", Running),
                    container("b", "old", Running),
                ],
                &["retire b", "replace a"],
            ),
        ];
        for (n_replicas, actual, expected) in cases {
            check_with(true, Some(*n_replicas), actual, expected);
        }
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
            images: None,
            surge: false,
        };
        assert_eq!(
            plan_replicas(Some(&target), std::slice::from_ref(&with_env)),
            [Step::Replace {
                id: "id-a".into(),
                name: "a".into(),
                surge: false,
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
        let kept = plan_resource(
            &key,
            Some(&spec(5)),
            Some(&spec(5)),
            None,
            &running,
            Some(4),
        );
        assert_eq!(text(&kept), Vec::<String>::new());
        // With `max` lowered to 3 (`autoscale` is hashed, so replicas of that spec), 3 run.
        let narrowed = plan_resource(
            &key,
            Some(&spec(3)),
            Some(&spec(3)),
            None,
            &running_at(3),
            Some(4),
        );
        assert_eq!(text(&narrowed), ["remove d"]);
        // Without the autoscaler's count, the manifest's replicas.
        let manifest = plan_resource(&key, Some(&spec(5)), Some(&spec(5)), None, &running, None);
        assert_eq!(text(&manifest), ["remove b", "remove c", "remove d"]);
    }
}
