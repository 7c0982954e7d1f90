//! Decide the next move of a blue/green rollout (`blue_green {}`): the new release comes up
//! whole beside the old one and answers at the preview host; `promote` (or `auto_promote`)
//! switches every request to it at once; the old release is kept for `keep_old`, during which
//! `abort` switches back; then the old replicas are retired.
//!
//! Invariants: pure (the handler acts, the tests read the same answer); an abort request wins
//! over everything but a finished rollout; the switch is the router's (`router::mod`, by the
//! stored `green` replicas and the phase), so a move here never removes a replica that still
//! takes requests: the old ones are retired only once every host routes to the new ones, the
//! new ones after an abort only once the hosts route to the old ones again (`SWITCH`).

use std::time::Duration;

use crate::manifest::spec::rollout::BlueGreen;
use crate::store::RolloutPhase;

/// How long a switch (promote, abort) is given to reach the proxy before the replicas it
/// turned away from are removed; the router also keeps a switch this long past its end
/// (`KEPT_APART`).
pub(crate) const SWITCH: Duration = Duration::from_secs(2);

/// What the decision reads of the stored rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct State {
    pub(crate) phase: RolloutPhase,
    /// Promoted: when `keep_old` ends; aborted: when the switch back is through.
    pub(crate) until: Option<i64>,
    pub(crate) promote_requested: bool,
    pub(crate) abort_requested: bool,
}

/// What the handler observed this pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    /// Every replica of the new release runs and is ready.
    pub(crate) new_ready: bool,
    /// Replicas of the old release are still there.
    pub(crate) old_left: bool,
    /// Unix seconds.
    pub(crate) now: i64,
}

/// The next move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Bring the new release up whole beside the old one (behind the preview host).
    Scale,
    /// The new release is ready: record its replicas and wait for `promote`.
    BeginPause,
    /// Waiting for `promote`.
    Wait,
    /// Switch every host to the new release; the old stays up until `keep_until`.
    Promote { keep_until: i64 },
    /// Promoted: the old release is kept until `until` (abort switches back meanwhile).
    Keep { until: i64 },
    /// `keep_old` is over: the ordinary rollout retires the old replicas.
    RetireOld,
    /// Switch the hosts back to the old release; its replicas are removed once `until`.
    SwitchBack { until: i64 },
    /// The hosts route to the old release again (or never left it): remove the new
    /// replicas and fail the release.
    Abort { reason: String },
    /// Nothing to do: the rollout is over.
    Done,
}

fn after(now: i64, wait: Duration) -> i64 {
    now.saturating_add(i64::try_from(wait.as_secs()).unwrap_or(i64::MAX))
}

/// The next move of `blue_green` from `state` and what was `seen`.
pub(crate) fn decide(blue_green: &BlueGreen, state: State, seen: Seen) -> Decision {
    match state.phase {
        RolloutPhase::Aborted => match state.until {
            // Switching back: the new replicas go once the proxy routes to the old ones.
            Some(until) if seen.now < until => Decision::SwitchBack { until },
            _ => Decision::Abort {
                reason: "switched back by `voodu-agent abort`".to_owned(),
            },
        },
        RolloutPhase::Promoted => {
            if state.abort_requested
                && let Some(until) = state.until
                && seen.now < until
            {
                return Decision::SwitchBack {
                    until: after(seen.now, SWITCH),
                };
            }
            match state.until {
                Some(until) if seen.now < until => Decision::Keep { until },
                _ if seen.old_left => Decision::RetireOld,
                _ => Decision::Done,
            }
        }
        RolloutPhase::Progressing | RolloutPhase::Paused if state.abort_requested => {
            // The hosts never left the old release: the new one goes at once.
            Decision::Abort {
                reason: "aborted by `voodu-agent abort` before promote".to_owned(),
            }
        }
        _ if !seen.new_ready => Decision::Scale,
        RolloutPhase::Progressing if blue_green.auto_promote => Decision::Promote {
            keep_until: after(seen.now, blue_green.keep_old()),
        },
        RolloutPhase::Progressing => Decision::BeginPause,
        _ if state.promote_requested => Decision::Promote {
            keep_until: after(seen.now, blue_green.keep_old()),
        },
        _ => Decision::Wait,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blue_green(auto_promote: bool) -> BlueGreen {
        BlueGreen {
            preview_host: "preview.example.com".to_owned(),
            auto_promote,
            keep_old: "10m".to_owned(),
        }
    }

    fn state(phase: RolloutPhase) -> State {
        State {
            phase,
            until: None,
            promote_requested: false,
            abort_requested: false,
        }
    }

    fn seen(new_ready: bool, old_left: bool, now: i64) -> Seen {
        Seen {
            new_ready,
            old_left,
            now,
        }
    }

    use RolloutPhase::{Aborted, Paused, Progressing, Promoted};

    #[test]
    fn the_new_release_comes_up_waits_for_promote_is_kept_apart_then_retires_the_old() {
        let manual = blue_green(false);
        assert_eq!(
            decide(&manual, state(Progressing), seen(false, true, 0)),
            Decision::Scale
        );
        assert_eq!(
            decide(&manual, state(Progressing), seen(true, true, 0)),
            Decision::BeginPause
        );
        assert_eq!(
            decide(&manual, state(Paused), seen(true, true, 5)),
            Decision::Wait
        );
        // A new replica lost while paused is brought back first.
        assert_eq!(
            decide(&manual, state(Paused), seen(false, true, 5)),
            Decision::Scale
        );
        let promote = State {
            promote_requested: true,
            ..state(Paused)
        };
        assert_eq!(
            decide(&manual, promote, seen(true, true, 10)),
            Decision::Promote { keep_until: 610 }
        );
        let kept = State {
            until: Some(610),
            ..state(Promoted)
        };
        assert_eq!(
            decide(&manual, kept, seen(true, true, 100)),
            Decision::Keep { until: 610 }
        );
        assert_eq!(
            decide(&manual, kept, seen(true, true, 610)),
            Decision::RetireOld
        );
        assert_eq!(
            decide(&manual, kept, seen(true, false, 620)),
            Decision::Done
        );
    }

    #[test]
    fn auto_promote_switches_once_ready() {
        assert_eq!(
            decide(&blue_green(true), state(Progressing), seen(true, true, 0)),
            Decision::Promote { keep_until: 600 }
        );
    }

    #[test]
    fn abort_before_promote_removes_the_new_release_at_once_and_after_switches_back_first() {
        let manual = blue_green(false);
        let before = State {
            abort_requested: true,
            ..state(Paused)
        };
        assert!(matches!(
            decide(&manual, before, seen(true, true, 5)),
            Decision::Abort { .. }
        ));
        let after_promote = State {
            abort_requested: true,
            until: Some(610),
            ..state(Promoted)
        };
        assert_eq!(
            decide(&manual, after_promote, seen(true, true, 100)),
            Decision::SwitchBack { until: 102 }
        );
        let switching = State {
            until: Some(102),
            ..state(Aborted)
        };
        assert_eq!(
            decide(&manual, switching, seen(true, true, 101)),
            Decision::SwitchBack { until: 102 }
        );
        assert!(matches!(
            decide(&manual, switching, seen(true, true, 102)),
            Decision::Abort { .. }
        ));
        // Past keep_old, abort no longer switches back (the old release is being retired).
        let late = State {
            abort_requested: true,
            until: Some(610),
            ..state(Promoted)
        };
        assert_eq!(
            decide(&manual, late, seen(true, true, 700)),
            Decision::RetireOld
        );
    }
}
