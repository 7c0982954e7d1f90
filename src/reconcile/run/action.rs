//! What a reconcile asks for next: kube-runtime's `Action`. Every handler returns one, and the
//! error policy (`retry.rs`) maps every error to one, so the worker applies a single kind of
//! answer through a single timer (`timer::Timer::next_pass`, one pending instant per key, the
//! one the key's last pass asked for).

use std::time::Duration;

/// The outcome of one successful reconcile (or of the error policy for a failed one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Converged: nothing to do until something changes (the journal, the host, a probe).
    Done,
    /// Look again after this long (a rollout's deadline re-check, a back-off ending, a retry).
    RequeueAfter(Duration),
    /// Cannot get further until desired state changes (a permanent error, retries used up,
    /// a halted rollout): no timer, the next journal row or event queues the key.
    AwaitChange,
}

impl Action {
    /// The sooner of two requests for the same key (a pass that asks twice keeps one timer).
    pub fn sooner(self, other: Action) -> Action {
        match (self, other) {
            (Action::RequeueAfter(a), Action::RequeueAfter(b)) => Action::RequeueAfter(a.min(b)),
            (Action::RequeueAfter(delay), _) | (_, Action::RequeueAfter(delay)) => {
                Action::RequeueAfter(delay)
            }
            (Action::AwaitChange, _) | (_, Action::AwaitChange) => Action::AwaitChange,
            (Action::Done, Action::Done) => Action::Done,
        }
    }

    /// The delay this action asks for, if any.
    pub fn delay(self) -> Option<Duration> {
        match self {
            Action::RequeueAfter(delay) => Some(delay),
            Action::Done | Action::AwaitChange => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sooner_request_wins() {
        let s = Duration::from_secs;
        let cases = [
            (Action::Done, Action::Done, Action::Done),
            (Action::Done, Action::AwaitChange, Action::AwaitChange),
            (
                Action::AwaitChange,
                Action::RequeueAfter(s(5)),
                Action::RequeueAfter(s(5)),
            ),
            (
                Action::RequeueAfter(s(5)),
                Action::RequeueAfter(s(2)),
                Action::RequeueAfter(s(2)),
            ),
            (
                Action::RequeueAfter(s(1)),
                Action::Done,
                Action::RequeueAfter(s(1)),
            ),
        ];
        for (a, b, sooner) in cases {
            assert_eq!(a.sooner(b), sooner, "{a:?} vs {b:?}");
            assert_eq!(b.sooner(a), sooner, "{b:?} vs {a:?}");
        }
    }
}
