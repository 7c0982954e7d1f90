//! Error policy: which reconcile errors are retried, and when.
//!
//! The one place errors are classified (kube's `error_policy`). Transient errors are retried
//! after 1, 2, 4, 8, 16 and 30 s (six retries); each retry re-reads desired state, so a fix
//! or a delete pushed meanwhile wins. Other errors wait for the next event.

use std::time::Duration;

use super::Error;

/// The retry schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    pub delays: Vec<Duration>,
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
    pub fn next_delay(&self, error: &Error, failures: usize) -> Option<Duration> {
        if !error.is_transient() || failures == 0 {
            return None;
        }
        self.delays.get(failures - 1).copied()
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
            message: "bad port".into(),
        };
        assert_eq!(policy.next_delay(&permanent, 1), None);
    }
}
