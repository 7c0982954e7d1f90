//! In-process state of one-shot runs (init container attempts, release hooks, job and cronjob
//! runs): which run units have a waiter in this process (and the `TaskTracker` those waiters
//! run on), which of them a waiter saw pass their deadline, how many attempts of each init
//! container were made, and when each cronjob fires next (what the cron scheduler sleeps on).
//!
//! Invariants: the engine and the store are the truth about runs (a run's container or
//! service, `job_runs`, a release's `hooks`); this state only says what this process is doing
//! about them, so a restarted agent starts empty and its handlers re-attach a waiter to every
//! unit still running. A unit id is attached at most once at a time; a waiter detaches only
//! after it finished its work (a job run's record, a deadline mark), so a handler that reads
//! the attached set before it looks at the unit never attaches a second waiter. Waiters never
//! create, stop or remove anything: they record and requeue the key, whose handler acts.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio_util::task::TaskTracker;

use crate::base::lock;
use crate::reconcile::observers::cron::clock::CronTimes;

/// Waiters of running one-shot units, and the cron scheduler's fire times (cheap to clone:
/// a waiter keeps a clone to mark and detach).
#[derive(Debug, Clone)]
pub(crate) struct Runs {
    inner: Arc<Inner>,
    tracker: TaskTracker,
}

#[derive(Debug, Default)]
struct Inner {
    /// Unit ids (a container's, or under Swarm a service's) with a waiter now.
    attached: Mutex<BTreeSet<String>>,
    /// Unit ids whose waiter saw the deadline pass before the unit ended.
    timed_out: Mutex<BTreeSet<String>>,
    /// Unit ids of init attempts whose used-up chain was reported as the pass's error.
    reported: Mutex<BTreeSet<String>>,
    /// When a pass first saw a unit ended (the pause between init attempts counts from it,
    /// on the same clock as the requeue that ends it).
    seen_ended: Mutex<BTreeMap<String, tokio::time::Instant>>,
    /// Attempts made of an init container, by its unit name (the unit's `voodu.attempt`
    /// label says the same after a restart, while the unit exists).
    attempts: Mutex<BTreeMap<String, u32>>,
    cron: CronTimes,
}

impl Runs {
    /// Waiters run on `tracker` (the reconciler's).
    pub(crate) fn new(tracker: TaskTracker) -> Runs {
        Runs {
            inner: Arc::default(),
            tracker,
        }
    }

    /// The cronjobs' next fire times.
    pub(crate) fn cron(&self) -> &CronTimes {
        &self.inner.cron
    }

    /// The unit ids that have a waiter now.
    pub(crate) fn attached(&self) -> BTreeSet<String> {
        lock(&self.inner.attached).clone()
    }

    /// Spawns `waiter` for unit `id` unless one is attached already; the waiter must call
    /// `detach` once its work is done (or it gives up at shutdown).
    pub(crate) fn attach<F>(&self, id: &str, waiter: F) -> bool
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if !lock(&self.inner.attached).insert(id.to_owned()) {
            return false;
        }
        self.tracker.spawn(waiter);
        true
    }

    pub(crate) fn detach(&self, id: &str) {
        lock(&self.inner.attached).remove(id);
    }

    /// A waiter saw unit `id` pass its deadline.
    pub(crate) fn mark_timed_out(&self, id: &str) {
        lock(&self.inner.timed_out).insert(id.to_owned());
    }

    /// Whether unit `id` passed its deadline; the mark goes with the unit (`forget`).
    pub(crate) fn timed_out(&self, id: &str) -> bool {
        lock(&self.inner.timed_out).contains(id)
    }

    /// True the first time it is asked for unit `id` (a used-up init chain is reported as
    /// the pass's error once; the error policy's retry then starts it afresh).
    pub(crate) fn report_once(&self, id: &str) -> bool {
        lock(&self.inner.reported).insert(id.to_owned())
    }

    /// How long ago a pass first saw unit `id` ended (zero the first time).
    pub(crate) fn ended_for(&self, id: &str) -> std::time::Duration {
        let now = tokio::time::Instant::now();
        let first = *lock(&self.inner.seen_ended)
            .entry(id.to_owned())
            .or_insert(now);
        now.saturating_duration_since(first)
    }

    /// Unit `id` was removed: nothing about it is kept.
    pub(crate) fn forget(&self, id: &str) {
        lock(&self.inner.timed_out).remove(id);
        lock(&self.inner.reported).remove(id);
        lock(&self.inner.seen_ended).remove(id);
    }

    /// Attempts made of the init container whose unit is called `name`.
    pub(crate) fn attempts(&self, name: &str) -> u32 {
        lock(&self.inner.attempts).get(name).copied().unwrap_or(0)
    }

    pub(crate) fn set_attempts(&self, name: &str, attempts: u32) {
        let mut all = lock(&self.inner.attempts);
        if attempts == 0 {
            all.remove(name);
        } else {
            all.insert(name.to_owned(), attempts);
        }
    }
}
