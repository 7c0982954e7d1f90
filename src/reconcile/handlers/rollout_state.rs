//! The rollout state machine of the replicated kinds, as one pure function: given the phase of
//! the release a pass works under and what the pass saw, the release's next phase and what the
//! pass does about it (`handlers/replicated.rs` carries it out).
//!
//! Invariants: pure, no IO; a rollout ends once (succeeded, failed or rolled back); only a
//! rollout in flight reacts to an error itself — any other error goes to the error policy
//! (`retry.rs`), which alone decides on retries; a halted release is repaired, never rolled.

use crate::reconcile::run::retry::ErrorClass;
use crate::store::{Release, ReleasePhase};

/// Where a release stands, as the pass sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RolloutPhase {
    Progressing,
    /// Failed, and left alone until desired state changes (a failed release hook, or a rollout
    /// that failed after touching replicas).
    Halted,
    /// Failed before touching replicas (its image, its environment): tried again once that
    /// can be had.
    Failed,
    RolledBack,
    Superseded,
    Succeeded,
}

impl RolloutPhase {
    /// The phase of `release`; `halted` as `handlers::rollout::halted` found it.
    pub(crate) fn of(release: &Release, halted: bool) -> RolloutPhase {
        match release.phase {
            ReleasePhase::Progressing => RolloutPhase::Progressing,
            ReleasePhase::Failed if halted => RolloutPhase::Halted,
            ReleasePhase::Failed => RolloutPhase::Failed,
            ReleasePhase::RolledBack => RolloutPhase::RolledBack,
            ReleasePhase::Superseded => RolloutPhase::Superseded,
            ReleasePhase::Succeeded => RolloutPhase::Succeeded,
        }
    }
}

/// Where in the pass an error arose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Before any replica is touched: the environment, the image.
    Prepare,
    /// A release hook (`pre_command`, `command`) failed, before any replica is touched.
    Hooks,
    /// While creating, replacing, starting or removing replicas.
    Replicas,
}

/// What one pass saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    /// An error of the pass, its class and stage.
    pub(crate) error: Option<(ErrorClass, Stage)>,
    /// The rollout ran out of time with work left, or a new replica keeps crashing.
    pub(crate) gave_up: bool,
    /// No step left: every replica is of the target version, in the desired number.
    pub(crate) converged: bool,
    /// Every replica of the target version is ready.
    pub(crate) all_ready: bool,
}

/// What the pass does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Hand the error to the error policy (after writing status).
    ReturnError,
    /// End the release failed; nothing was touched, so nothing is rolled back.
    FailBeforeRollout,
    /// End the release failed and halted; nothing was touched, so nothing is rolled back.
    FailAndHalt,
    /// End the release failed, halt it and roll back to the newest release that ran.
    FailAndRollBack,
    /// End the release succeeded (post hook, `on_deploy`): the resource is `Ready`.
    Succeed,
    /// A rollout in flight: `Progressing`, look again soon.
    KeepWaiting,
    /// Halted: repaired but never rolled, `Failed` until desired state changes.
    StayHalted,
    /// Not rolling: `Ready`.
    Ready,
    /// Not rolling, replicas being repaired: `Degraded`.
    Repair,
}

/// The next phase of the release and what the pass does about it.
pub(crate) fn next(phase: RolloutPhase, seen: Seen) -> (RolloutPhase, Effect) {
    use RolloutPhase::{Failed, Halted, Progressing, RolledBack, Succeeded};
    match (phase, seen.error) {
        (Progressing, Some((ErrorClass::Transient, _))) => (Progressing, Effect::ReturnError),
        (Progressing, Some((ErrorClass::Permanent, Stage::Prepare))) => {
            (Failed, Effect::FailBeforeRollout)
        }
        (Progressing, Some((ErrorClass::Permanent, Stage::Hooks))) => (Halted, Effect::FailAndHalt),
        (Progressing, Some((ErrorClass::Permanent, Stage::Replicas))) => {
            (RolledBack, Effect::FailAndRollBack)
        }
        (phase, Some(_)) => (phase, Effect::ReturnError),
        (Progressing, None) if seen.gave_up => (RolledBack, Effect::FailAndRollBack),
        (Progressing, None) if seen.converged && seen.all_ready => (Succeeded, Effect::Succeed),
        (Progressing, None) => (Progressing, Effect::KeepWaiting),
        (Halted, None) => (Halted, Effect::StayHalted),
        (phase, None) if seen.converged && seen.all_ready => (phase, Effect::Ready),
        (phase, None) => (phase, Effect::Repair),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_phase_and_observation_has_one_next_step() {
        use Effect::*;
        use ErrorClass::{Permanent, Transient};
        use RolloutPhase::*;
        let seen = Seen::default();
        let error = |class, stage| Seen {
            error: Some((class, stage)),
            ..seen
        };
        let (transient_prepare, transient_replicas, transient_hooks) = (
            error(Transient, Stage::Prepare),
            error(Transient, Stage::Replicas),
            error(Transient, Stage::Hooks),
        );
        let (prepare, hooks, replicas) = (
            error(Permanent, Stage::Prepare),
            error(Permanent, Stage::Hooks),
            error(Permanent, Stage::Replicas),
        );
        let gave_up = Seen {
            gave_up: true,
            ..seen
        };
        let gave_up_and_prepare = Seen {
            gave_up: true,
            ..prepare
        };
        let done = Seen {
            converged: true,
            all_ready: true,
            ..seen
        };
        let unready = Seen {
            converged: true,
            ..seen
        };
        let cases = [
            // A rollout in flight reacts to what it saw.
            (Progressing, seen, Progressing, KeepWaiting),
            (Progressing, unready, Progressing, KeepWaiting),
            (Progressing, done, Succeeded, Succeed),
            (Progressing, gave_up, RolledBack, FailAndRollBack),
            (Progressing, transient_prepare, Progressing, ReturnError),
            (Progressing, transient_hooks, Progressing, ReturnError),
            (Progressing, transient_replicas, Progressing, ReturnError),
            (Progressing, prepare, Failed, FailBeforeRollout),
            (Progressing, hooks, Halted, FailAndHalt),
            (Progressing, replicas, RolledBack, FailAndRollBack),
            // An error wins over giving up.
            (Progressing, gave_up_and_prepare, Failed, FailBeforeRollout),
            // Halted: repaired, never rolled, never succeeded; errors are the error policy's.
            (Halted, seen, Halted, StayHalted),
            (Halted, done, Halted, StayHalted),
            (Halted, gave_up, Halted, StayHalted),
            (Halted, replicas, Halted, ReturnError),
            (Halted, hooks, Halted, ReturnError),
            // Not rolling: errors are the error policy's; the rest is Ready or a repair.
            (Succeeded, done, Succeeded, Ready),
            (Succeeded, seen, Succeeded, Repair),
            (Succeeded, gave_up, Succeeded, Repair),
            (Succeeded, prepare, Succeeded, ReturnError),
            (Succeeded, transient_replicas, Succeeded, ReturnError),
            (Failed, prepare, Failed, ReturnError),
            (Failed, done, Failed, Ready),
            (Failed, seen, Failed, Repair),
            (RolledBack, done, RolledBack, Ready),
            (RolledBack, replicas, RolledBack, ReturnError),
            (Superseded, seen, Superseded, Repair),
        ];
        for (phase, seen, next_phase, effect) in cases {
            assert_eq!(
                next(phase, seen),
                (next_phase, effect),
                "{phase:?} with {seen:?}"
            );
        }
    }
}
