//! Decide the start-up order (`depends_on { resources = [...] }`): whether a replicated
//! resource waits for what it depends on before it starts. Pure: the dependencies' recorded
//! states are passed in, so the handler (`handlers/replicated.rs`), `plan` and the tests
//! cannot disagree.
//!
//! Invariants: a dependency is ready only when its recorded status is `Ready` for the spec
//! hash its desired state holds now (a `Ready` left from its previous spec is not: on a commit
//! that changes both, the dependency rolls first). Only a start waits: the first replica of a
//! resource, or the first replacement of a rollout (no replica of the target version yet).
//! Once one exists, a dependency that becomes unready later holds nothing: the resource's
//! repairs, scale-ups and the rest of its rollout go on.

use crate::model::ResourceKey;
use crate::store::Phase;

/// Where one dependency stands, as the store records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DependencyState {
    /// No desired state declares it (yet).
    Undeclared,
    /// Declared, with no status recorded yet.
    NoStatus,
    /// Its recorded status: the phase, and whether it was recorded for its current spec.
    Recorded { phase: Phase, current: bool },
}

impl DependencyState {
    /// The state from what the store holds: the dependency's desired spec hash, if declared,
    /// and its recorded status (phase and the spec hash it was recorded for), if any.
    pub(crate) fn of(desired_hash: Option<&str>, status: Option<(Phase, &str)>) -> DependencyState {
        match (desired_hash, status) {
            (None, _) => DependencyState::Undeclared,
            (Some(_), None) => DependencyState::NoStatus,
            (Some(desired), Some((phase, recorded))) => DependencyState::Recorded {
                phase,
                current: desired == recorded,
            },
        }
    }

    /// Whether a dependent may start: `Ready` for its current spec.
    pub(crate) fn ready(&self) -> bool {
        matches!(
            self,
            DependencyState::Recorded {
                phase: Phase::Ready,
                current: true
            }
        )
    }

    /// How status shows it, in the parentheses of "waiting for …".
    fn shown(&self) -> &'static str {
        match self {
            DependencyState::Undeclared => "not declared yet",
            DependencyState::NoStatus => "absent",
            DependencyState::Recorded {
                phase: Phase::Ready,
                current: false,
            } => "Ready for its previous spec",
            DependencyState::Recorded { phase, .. } => phase.as_str(),
        }
    }
}

/// What a resource that must wait is waiting for: the status message and the keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wait {
    /// `waiting for statefulset/shop/db (Progressing), …`.
    pub(crate) message: String,
    /// The dependencies not ready, whose becoming ready should look at the resource again.
    pub(crate) on: Vec<ResourceKey>,
}

/// Whether a resource that is `starting` (about to create its first replica, or the first
/// replica of a rollout) waits for `dependencies`, and what for; `None` when it goes on.
pub(crate) fn wait(
    starting: bool,
    dependencies: &[(ResourceKey, DependencyState)],
) -> Option<Wait> {
    if !starting {
        return None;
    }
    let unready: Vec<&(ResourceKey, DependencyState)> = dependencies
        .iter()
        .filter(|(_, state)| !state.ready())
        .collect();
    if unready.is_empty() {
        return None;
    }
    let shown: Vec<String> = unready
        .iter()
        .map(|(key, state)| format!("{key} ({})", state.shown()))
        .collect();
    Some(Wait {
        message: format!("waiting for {}", shown.join(", ")),
        on: unready.into_iter().map(|(key, _)| key.clone()).collect(),
    })
}

/// Whether a replicated resource is starting, from what its pass saw: steps that create or
/// replace a replica (`touches`) while no replica of the target version exists (`current`),
/// and either none at all exists (`any`: its first replica) or the steps replace one
/// (`replaces`: a rollout's first).
pub(crate) fn starting(touches: bool, replaces: bool, any: bool, current: bool) -> bool {
    touches && !current && (!any || replaces)
}

/// What `plan` shows a resource the commit creates or replaces (`starting`) waiting for:
/// each dependency the same commit creates or replaces (`rolls`), which must be Ready for
/// its new spec first. Others the agent checks when it applies the commit.
pub(crate) fn waits_in_plan(
    starting: bool,
    dependencies: &[(ResourceKey, bool)],
) -> Vec<ResourceKey> {
    if !starting {
        return Vec::new();
    }
    dependencies
        .iter()
        .filter(|(_, rolls)| *rolls)
        .map(|(key, _)| key.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Kind;

    fn db() -> ResourceKey {
        ResourceKey::new(Kind::Statefulset, "shop", "db")
    }

    #[test]
    fn only_ready_for_the_current_spec_lets_a_start_go() {
        let cases = [
            (
                DependencyState::of(None, None),
                Some("waiting for statefulset/shop/db (not declared yet)"),
            ),
            (
                DependencyState::of(Some("h1"), None),
                Some("waiting for statefulset/shop/db (absent)"),
            ),
            (
                DependencyState::of(Some("h1"), Some((Phase::Progressing, "h1"))),
                Some("waiting for statefulset/shop/db (Progressing)"),
            ),
            (
                DependencyState::of(Some("h2"), Some((Phase::Ready, "h1"))),
                Some("waiting for statefulset/shop/db (Ready for its previous spec)"),
            ),
            (
                DependencyState::of(Some("h1"), Some((Phase::Failed, "h1"))),
                Some("waiting for statefulset/shop/db (Failed)"),
            ),
            (
                DependencyState::of(Some("h1"), Some((Phase::Ready, "h1"))),
                None,
            ),
        ];
        for (state, expected) in cases {
            let waited = wait(true, &[(db(), state.clone())]);
            assert_eq!(
                waited.as_ref().map(|wait| wait.message.as_str()),
                expected,
                "{state:?}"
            );
            if let Some(waited) = waited {
                assert_eq!(waited.on, vec![db()]);
            }
            // A resource that is not starting never waits.
            assert_eq!(wait(false, &[(db(), state)]), None);
        }
    }

    #[test]
    fn every_unready_dependency_is_named_in_order() {
        let api = ResourceKey::new(Kind::Deployment, "shop", "api");
        let cache = ResourceKey::new(Kind::Statefulset, "shop", "cache");
        let waited = wait(
            true,
            &[
                (
                    db(),
                    DependencyState::of(Some("h"), Some((Phase::Progressing, "h"))),
                ),
                (
                    cache,
                    DependencyState::of(Some("h"), Some((Phase::Ready, "h"))),
                ),
                (api.clone(), DependencyState::of(Some("h"), None)),
            ],
        );
        assert_eq!(
            waited,
            Some(Wait {
                message:
                    "waiting for statefulset/shop/db (Progressing), deployment/shop/api (absent)"
                        .to_owned(),
                on: vec![db(), api],
            })
        );
        assert_eq!(wait(true, &[]), None);
    }

    #[test]
    fn a_plan_shows_the_dependencies_the_same_commit_rolls() {
        let api = ResourceKey::new(Kind::Deployment, "shop", "api");
        let dependencies = [(db(), true), (api, false)];
        assert_eq!(waits_in_plan(true, &dependencies), vec![db()]);
        assert_eq!(
            waits_in_plan(false, &dependencies),
            Vec::<ResourceKey>::new()
        );
    }

    #[test]
    fn a_first_replica_or_a_rollouts_first_is_a_start() {
        // (touches, replaces, any replica, any of the target version) → starting
        let cases = [
            ((true, false, false, false), true),   // first deploy
            ((true, true, true, false), true),     // a rollout's first replacement
            ((true, true, true, true), false),     // a rollout under way
            ((true, false, true, false), false),   // a repair or scale-up of old replicas
            ((true, false, true, true), false),    // a scale-up
            ((false, false, false, false), false), // nothing to do
        ];
        for ((touches, replaces, any, current), expected) in cases {
            assert_eq!(
                starting(touches, replaces, any, current),
                expected,
                "{touches} {replaces} {any} {current}"
            );
        }
    }
}
