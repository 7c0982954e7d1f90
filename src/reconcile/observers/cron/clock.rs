//! Cron's clocks: where "now" comes from (`Clock`), and when each cronjob fires next
//! (`CronTimes`), which its handler sets and the scheduler sleeps on. The reconciler's shared
//! context holds both; nothing here knows the context.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;

use crate::base::lock;
use crate::model::ResourceKey;

/// voodu-agent's default catch-up window for runs missed while it was not running.
pub const DEFAULT_CATCH_UP: Duration = Duration::from_secs(15 * 60);

/// Where cron's "now" comes from.
#[derive(Debug, Clone, Default)]
pub enum Clock {
    /// The system's wall clock.
    #[default]
    System,
    /// A wall time that advances with tokio's clock, so paused-time tests drive cron.
    Virtual {
        start: DateTime<Utc>,
        started: tokio::time::Instant,
    },
}

impl Clock {
    /// A clock reading `start` now and advancing with tokio's (possibly paused) time.
    pub fn starting_at(start: DateTime<Utc>) -> Clock {
        Clock::Virtual {
            start,
            started: tokio::time::Instant::now(),
        }
    }

    pub fn now(&self) -> DateTime<Utc> {
        match self {
            Clock::System => Utc::now(),
            Clock::Virtual { start, started } => {
                let elapsed =
                    chrono::Duration::from_std(started.elapsed()).unwrap_or(chrono::Duration::MAX);
                start.checked_add_signed(elapsed).unwrap_or(*start)
            }
        }
    }
}

/// When each cronjob fires next, as its handler last computed it: what the scheduler sleeps on.
#[derive(Debug, Default)]
pub(crate) struct CronTimes {
    next: Mutex<BTreeMap<ResourceKey, i64>>,
    pub(super) changed: Notify,
}

impl CronTimes {
    /// Records `key`'s next fire time (`None`: it has none, or left the repo).
    pub(crate) fn set(&self, key: &ResourceKey, next: Option<i64>) {
        let changed = {
            let mut times = lock(&self.next);
            match next {
                Some(next) => times.insert(key.clone(), next) != Some(next),
                None => times.remove(key).is_some(),
            }
        };
        if changed {
            self.changed.notify_one();
        }
    }

    pub(super) fn snapshot(&self) -> BTreeMap<ResourceKey, i64> {
        lock(&self.next).clone()
    }
}
