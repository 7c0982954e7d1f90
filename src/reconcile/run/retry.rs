//! The error policy (kube-runtime's `error_policy`): the one place a reconcile error becomes an
//! `Action`. Transient errors are retried after 1, 2, 4, 8, 16 and 30 s (six retries); each
//! retry re-reads desired state, so a fix or a delete pushed meanwhile wins. Other errors, and
//! transient ones past the schedule, wait for the next change. The worker records the outcome
//! on the resource's status (`crate::reconcile::record_error`); no handler classifies errors itself.
//!
//! The ingress router, which is no resource, waits between failed passes on the same schedule
//! (`RetryPolicy::backoff`), repeating its last step instead of giving up.

use std::time::Duration;

use crate::reconcile::{error::Error, run::action::Action};

/// How an error is handled: the one classification every error goes through (the error
/// policy below, and the rollout state machine, `rollout_state::next`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorClass {
    /// Worth another try on the retry schedule.
    Transient,
    /// Retrying cannot help until desired state changes.
    Permanent,
}

/// The class of `error`.
pub(crate) fn class(error: &Error) -> ErrorClass {
    if error.is_transient() {
        ErrorClass::Transient
    } else {
        ErrorClass::Permanent
    }
}

/// The retry schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    pub(crate) delays: Vec<Duration>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            delays: [1, 2, 4, 8, 16, 30]
                .into_iter()
                .map(Duration::from_secs)
                .collect(),
        }
    }
}

impl RetryPolicy {
    /// The delay before retry number `failures` (1-based), or `None` when the error is not
    /// transient or the retries are used up.
    pub(crate) fn next_delay(&self, error: &Error, failures: usize) -> Option<Duration> {
        if class(error) == ErrorClass::Permanent || failures == 0 {
            return None;
        }
        self.delays.get(failures - 1).copied()
    }

    /// What a key whose reconcile failed for the `failures`-th time in a row does next.
    pub(crate) fn error_policy(&self, error: &Error, failures: usize) -> Action {
        self.next_delay(error, failures)
            .map_or(Action::AwaitChange, Action::RequeueAfter)
    }

    /// The wait after the `failures`-th failure in a row of a loop that never gives up (the
    /// ingress router): the schedule, then its last step again and again.
    pub(crate) fn backoff(&self, failures: usize) -> Duration {
        let last = self.delays.len().saturating_sub(1);
        self.delays
            .get(failures.saturating_sub(1).min(last))
            .copied()
            .unwrap_or(Duration::from_secs(30))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Kind, ResourceKey};

    #[test]
    fn transient_errors_follow_the_schedule_then_stop() {
        let policy = RetryPolicy::default();
        let transient = Error::Runtime {
            key: ResourceKey::new(Kind::Deployment, "s", "n"),
            source: crate::runtime::Error::Unavailable {
                message: "down".into(),
            },
        };
        let delays: Vec<u64> = (1..=7)
            .filter_map(|failures| policy.next_delay(&transient, failures))
            .map(|delay| delay.as_secs())
            .collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30]);
        let permanent = Error::Permanent {
            key: ResourceKey::new(Kind::Deployment, "s", "n"),
            reason: crate::store::FailureReason::Spec,
            message: "bad port".into(),
        };
        assert_eq!(policy.next_delay(&permanent, 1), None);
    }

    #[test]
    fn every_error_maps_to_one_action() {
        let policy = RetryPolicy::default();
        let key = ResourceKey::new(Kind::Deployment, "s", "n");
        let transient = Error::Init {
            key: key.clone(),
            init: "migrate".into(),
            attempts: 1,
            exit_code: Some(1),
            timeout: Duration::from_secs(60),
        };
        let permanent = Error::Permanent {
            key,
            reason: crate::store::FailureReason::Spec,
            message: "bad port".into(),
        };
        let s = Duration::from_secs;
        let cases = [
            (&transient, 1, Action::RequeueAfter(s(1))),
            (&transient, 6, Action::RequeueAfter(s(30))),
            (&transient, 7, Action::AwaitChange),
            (&permanent, 1, Action::AwaitChange),
        ];
        for (error, failures, action) in cases {
            assert_eq!(
                policy.error_policy(error, failures),
                action,
                "{error} #{failures}"
            );
        }
    }

    #[test]
    fn the_router_backs_off_on_the_same_schedule_and_keeps_trying() {
        let policy = RetryPolicy::default();
        let waits: Vec<u64> = (1..=8).map(|n| policy.backoff(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
    }
}
