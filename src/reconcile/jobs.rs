//! In-process state of jobs and cronjobs: which job runs have a waiter in this process (and
//! the `TaskTracker` those waiters run on), and when each cronjob fires next (what the cron
//! scheduler sleeps on).
//!
//! Invariants: the store is the truth about runs (`job_runs`); this state only says what this
//! process is doing about them, so a restarted agent starts empty and its handlers re-attach
//! a waiter to every run the store says is running. A run id is attached at most once at a
//! time; a waiter detaches only after it finished its run's record, so a handler that reads
//! the attached set before reading the store never attaches a second waiter.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Mutex;

use tokio_util::task::TaskTracker;

use super::cron::CronTimes;
use super::lock;

/// Waiters of running job runs, and the cron scheduler's fire times.
#[derive(Debug)]
pub(crate) struct Jobs {
    attached: Mutex<BTreeSet<i64>>,
    tracker: TaskTracker,
    pub(crate) cron: CronTimes,
}

impl Jobs {
    /// Waiters run on `tracker` (the reconciler's).
    pub(crate) fn new(tracker: TaskTracker) -> Jobs {
        Jobs {
            attached: Mutex::default(),
            tracker,
            cron: CronTimes::default(),
        }
    }

    /// The run ids that have a waiter now.
    pub(crate) fn attached(&self) -> BTreeSet<i64> {
        lock(&self.attached).clone()
    }

    /// Spawns `waiter` for run `run_id` unless one is attached already; the waiter must call
    /// `detach` once the run's record is final (or it gives up at shutdown).
    pub(crate) fn attach<F>(&self, run_id: i64, waiter: F) -> bool
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if !lock(&self.attached).insert(run_id) {
            return false;
        }
        self.tracker.spawn(waiter);
        true
    }

    pub(crate) fn detach(&self, run_id: i64) {
        lock(&self.attached).remove(&run_id);
    }
}
