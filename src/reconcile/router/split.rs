//! Which of a deployment's ready replicas each host reaches while a progressive rollout keeps
//! its releases apart. Blue/green (`blue_green {}`): before promote the ingress's hosts reach
//! the old release and the preview host the new one; after promote every host reaches the new
//! one while the old is kept; after an abort the hosts reach the old one while the new goes.
//! Canary (`canary {}`): the hosts reach every replica (the share is the replica count), and
//! the canary's own replicas are also reachable alone, for its `http` analysis (`canary`).
//!
//! Invariants: pure; decided from the stored rollout (its phase, its `green` replicas, the end
//! of its keep or switch window) and the clock; a rollout that no longer keeps anything apart
//! (done, or a window over by `KEPT_APART`) splits nothing, so a stale row never hides a
//! replica; only a deployment whose spec still says `blue_green {}` is split.

use crate::store::{RolloutPhase, RolloutState};

/// How long past its window's end a promote or an abort still keeps the releases apart
/// (the replicas turned away from are removed meanwhile, at the window's end).
pub(crate) const KEPT_APART: i64 = 600;

/// `(name, address)` of the ready replicas, split.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Split {
    /// What the ingress's own hosts reach.
    pub(crate) main: Vec<String>,
    /// What the preview host reaches (`None`: no preview route).
    pub(crate) preview: Option<Vec<String>>,
    /// A canary in flight: its own replicas (the analysis's route).
    pub(crate) canary: Option<Vec<String>>,
}

/// Splits `ready` (`(container name, address)`) by `state`, at unix time `now`.
pub(crate) fn split(ready: &[(String, String)], state: Option<&RolloutState>, now: i64) -> Split {
    let all = || ready.iter().map(|(_, address)| address.clone()).collect();
    let green = |state: &RolloutState, want: bool| -> Vec<String> {
        ready
            .iter()
            .filter(|(name, _)| state.green.contains(name) == want)
            .map(|(_, address)| address.clone())
            .collect()
    };
    let Some(state) = state.filter(|state| state.strategy == "blue_green") else {
        let canary = state.filter(|state| {
            state.strategy == "canary"
                && matches!(
                    state.phase,
                    RolloutPhase::Progressing | RolloutPhase::Paused
                )
                && !state.green.is_empty()
        });
        return Split {
            main: all(),
            preview: None,
            canary: canary.map(|state| green(state, true)),
        };
    };
    let green = |want: bool| green(state, want);
    let within = state
        .paused_until
        .is_some_and(|until| now < until.saturating_add(KEPT_APART));
    match state.phase {
        RolloutPhase::Progressing | RolloutPhase::Paused => Split {
            main: green(false),
            preview: Some(green(true)),
            canary: None,
        },
        RolloutPhase::Promoted if within => Split {
            main: green(true),
            preview: Some(green(true)),
            canary: None,
        },
        RolloutPhase::Aborted if within => Split {
            main: green(false),
            preview: None,
            canary: None,
        },
        _ => Split {
            main: all(),
            preview: None,
            canary: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready() -> Vec<(String, String)> {
        vec![
            ("web.a".to_owned(), "10.0.0.1".to_owned()),
            ("web.b".to_owned(), "10.0.0.2".to_owned()),
            ("web.n".to_owned(), "10.0.0.3".to_owned()),
        ]
    }

    fn state(phase: RolloutPhase, until: Option<i64>) -> RolloutState {
        let mut state = RolloutState::start("s", "web", "2", "blue_green");
        state.phase = phase;
        state.paused_until = until;
        state.green = vec!["web.n".to_owned()];
        state
    }

    #[test]
    fn before_promote_the_hosts_reach_the_old_release_and_the_preview_the_new() {
        let split = split(&ready(), Some(&state(RolloutPhase::Paused, None)), 0);
        assert_eq!(split.main, ["10.0.0.1", "10.0.0.2"]);
        assert_eq!(split.preview, Some(vec!["10.0.0.3".to_owned()]));
    }

    #[test]
    fn promote_switches_every_host_and_abort_switches_back_each_for_its_window() {
        let promoted = state(RolloutPhase::Promoted, Some(100));
        assert_eq!(split(&ready(), Some(&promoted), 50).main, ["10.0.0.3"]);
        // Well past the window: nothing is kept apart any more.
        assert_eq!(
            split(&ready(), Some(&promoted), 100 + KEPT_APART)
                .main
                .len(),
            3
        );
        let aborted = state(RolloutPhase::Aborted, Some(100));
        let back = split(&ready(), Some(&aborted), 101);
        assert_eq!(back.main, ["10.0.0.1", "10.0.0.2"]);
        assert_eq!(back.preview, None);
    }

    #[test]
    fn a_canary_splits_nothing_of_the_hosts_and_has_its_own_replicas_apart() {
        let mut canary = state(RolloutPhase::Paused, None);
        canary.strategy = "canary".to_owned();
        let parts = split(&ready(), Some(&canary), 0);
        assert_eq!(parts.main.len(), 3);
        assert_eq!(parts.canary, Some(vec!["10.0.0.3".to_owned()]));
        canary.phase = RolloutPhase::Aborted;
        assert_eq!(split(&ready(), Some(&canary), 0).canary, None);
        assert_eq!(split(&ready(), None, 0).main.len(), 3);
    }
}
