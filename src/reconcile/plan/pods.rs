//! `plan_statefulset`: a statefulset's pods (named by ordinal, each with its own environment
//! digest) → the steps that converge them, in Kubernetes' order: surplus pods highest ordinal
//! first, missing or stopped ones lowest first, outdated ones highest first (ordinal 0 last).

use std::collections::BTreeMap;

use super::replicas::Target;
use crate::manifest::spec::bounds::MAX_REPLICA_COUNT;
use crate::model::SpecHash;
use crate::runtime::labels;
use crate::runtime::{Container, ContainerState};

/// What a statefulset wants: pods `0..n_replicas`, each labelled with `spec_hash` and, when
/// known, with its own environment digest (`env_digests[ordinal]`: the identity variables
/// differ per pod, so each pod's digest does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StatefulTarget<'a> {
    pub(crate) spec_hash: &'a SpecHash,
    pub(crate) n_replicas: usize,
    /// Indexed by ordinal; `None` when the environment is unknown (the `plan` command).
    pub(crate) env_digests: Option<&'a [String]>,
    /// What the release's images run as (`Target::images`).
    pub(crate) images: Option<&'a str>,
}

impl StatefulTarget<'_> {
    /// Whether `pod` runs what its ordinal wants (spec hash and environment digest).
    pub(crate) fn is_current(&self, ordinal: usize, pod: &Container) -> bool {
        Target {
            spec_hash: self.spec_hash,
            n_replicas: 1,
            env_digest: self
                .env_digests
                .and_then(|digests| digests.get(ordinal))
                .map(String::as_str),
            images: self.images,
            // Pods never surge: one volume per ordinal.
            surge: false,
        }
        .is_current(pod)
    }
}

/// One action on a statefulset's pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StatefulStep {
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
    pub(crate) fn ordinal(&self) -> Option<usize> {
        match self {
            StatefulStep::Create { ordinal }
            | StatefulStep::Start { ordinal, .. }
            | StatefulStep::Replace { ordinal, .. } => Some(*ordinal),
            StatefulStep::Remove { ordinal, .. } => *ordinal,
        }
    }
}

/// The ordinal a statefulset pod carries in its `voodu.replica_ordinal` label.
pub(crate) fn pod_ordinal(pod: &Container) -> Option<usize> {
    pod.label(labels::REPLICA_ORDINAL)?.parse().ok()
}

/// Steps for a statefulset's pods, in the order they must run. `target == None` means the
/// resource left the repo. Order: removals highest ordinal first (scale-down top-down);
/// then, lowest ordinal first, missing pods created and stopped current pods started
/// (scale-up bottom-up); then outdated pods replaced highest ordinal first (rolling
/// replacement top-down, ordinal 0 last).
pub(crate) fn plan_statefulset(
    target: Option<&StatefulTarget<'_>>,
    actual: &[Container],
) -> Vec<StatefulStep> {
    // Clamped as in `plan_replicas`: a stored count past the bound never drives allocation.
    let n_replicas = target.map_or(0, |target| target.n_replicas.min(MAX_REPLICA_COUNT));
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
        pods.sort_unstable_by_key(|pod| {
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
    surplus.sort_unstable_by_key(|(ordinal, pod)| (std::cmp::Reverse(*ordinal), pod.name.clone()));
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
            // A restarting pod is the engine's to bring back (its restart policy's back-off).
            Some(pod)
                if is_current(ordinal, pod)
                    && !matches!(
                        pod.state,
                        ContainerState::Running | ContainerState::Restarting
                    ) =>
            {
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

#[cfg(test)]
mod tests {
    use super::super::{Action, plan_resource, test_container as container};
    use super::*;
    use crate::manifest::spec::Spec;
    use crate::model::{Kind, ResourceKey};
    use ContainerState::{Created, Exited, Running};
    use std::collections::BTreeSet;

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
            images: None,
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
            images: None,
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
                images: None,
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
        let plan = plan_resource(&key, Some(&old), Some(&new), None, &pods, None);
        assert_eq!(plan.action, Action::Replace);
        assert!(plan.steps.is_empty());
        assert_eq!(
            plan.pod_steps.iter().map(pod_text).collect::<Vec<_>>(),
            ["remove db.2", "replace db.1", "replace db.0"]
        );
        let unchanged = plan_resource(&key, Some(&old), Some(&old), None, &pods[..2], None);
        assert_eq!(
            (unchanged.action, unchanged.pod_steps),
            (Action::Unchanged, vec![])
        );
        let gone = plan_resource(&key, Some(&old), None, None, &pods, None);
        assert_eq!(gone.action, Action::Delete);
        assert_eq!(
            gone.pod_steps.iter().map(pod_text).collect::<Vec<_>>(),
            ["remove db.2", "remove db.1", "remove db.0"]
        );
    }
}
