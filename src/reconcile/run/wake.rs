//! Ways for work outside the journal to ask for reconciles besides the timer's requeues
//! (`timer::Timer`): `RouterWake` (the ingress router rebuilds its routes when replicas of a
//! routed deployment change, and reports back what the proxy serves).
//!
//! `Dependents` remembers which resources wait for which to become ready (start-up order),
//! so the pass recording a dependency `Ready` queues them.
//!
//! `OwnRemovals` keeps the other way round: containers the agent removed itself on purpose (a
//! replica whose start the engine refused), whose events are no drift to repair.
//!
//! Invariant: they only trigger; handlers stay level-triggered and read desired and actual
//! state themselves, so a request that arrives twice, late or for a deleted key is harmless.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio::time::Instant;

use crate::model::ResourceKey;
use crate::reconcile::router::proxy::RouterReport;

/// Image repositories a registry said were pushed to (`POST /hooks/registry`): the image
/// scanner scans them and looks at their running tags at once instead of at its interval.
#[derive(Debug, Clone, Default)]
pub struct RegistryPushes {
    pushed: Arc<(
        Mutex<std::collections::BTreeSet<String>>,
        tokio::sync::Notify,
    )>,
}

/// Most repositories held between two looks of the scanner (a flood of notifications
/// cannot grow memory without bound; the rest wait for the interval).
pub(crate) const MAX_PUSHED: usize = 256;

impl RegistryPushes {
    /// `repository` (`registry.example/team/app`) was pushed to.
    pub fn push(&self, repository: &str) {
        let (pushed, notify) = &*self.pushed;
        {
            let mut pushed = pushed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if pushed.len() < MAX_PUSHED {
                pushed.insert(repository.to_owned());
            }
        }
        notify.notify_one();
    }

    /// The repositories pushed to since the last call, once there is one.
    pub(crate) async fn next(&self) -> std::collections::BTreeSet<String> {
        let (pushed, notify) = &*self.pushed;
        loop {
            let taken = std::mem::take(
                &mut *pushed
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
            if !taken.is_empty() {
                return taken;
            }
            notify.notified().await;
        }
    }
}

/// Tells the ingress router that the replicas it routes to may have changed, and carries the
/// router's report back (what the proxy serves now), which ingress statuses are built from.
#[derive(Debug, Clone)]
pub struct RouterWake {
    sender: watch::Sender<u64>,
    report: watch::Sender<Arc<RouterReport>>,
}

impl Default for RouterWake {
    fn default() -> RouterWake {
        RouterWake {
            sender: watch::channel(0).0,
            report: watch::channel(Arc::new(RouterReport::default())).0,
        }
    }
}

impl RouterWake {
    pub fn wake(&self) {
        self.sender
            .send_modify(|generation| *generation = generation.wrapping_add(1));
    }

    /// Wakes the router and gives the wake's generation: a report whose `served_wake` is at
    /// least it was built after the wake (`drain_and_remove` waits for one).
    pub(crate) fn wake_generation(&self) -> u64 {
        self.wake();
        *self.sender.borrow()
    }

    /// A receiver of the router's reports.
    pub(crate) fn subscribe_report(&self) -> watch::Receiver<Arc<RouterReport>> {
        self.report.subscribe()
    }

    /// A receiver that sees every later `wake`.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.sender.subscribe()
    }

    /// The router's latest report.
    pub fn report(&self) -> Arc<RouterReport> {
        self.report.borrow().clone()
    }

    /// Publishes the router's report (the router only).
    pub(crate) fn publish(&self, report: RouterReport) {
        self.report.send_replace(Arc::new(report));
    }
}

/// The value of the header (`X-Voodu-Canary`) that routes a request to a canary's own
/// replicas (its `http` analysis): random per agent process, never shown.
#[derive(Debug)]
pub(crate) struct CanaryToken(String);

impl Default for CanaryToken {
    fn default() -> CanaryToken {
        CanaryToken(crate::model::random_hex(16))
    }
}

impl CanaryToken {
    pub(crate) fn value(&self) -> &str {
        &self.0
    }
}

/// Replicas being drained (by container id): the router leaves them out of every route
/// before they are stopped, so no request is sent to a replica that is going away.
#[derive(Debug, Default)]
pub(crate) struct Draining {
    ids: Mutex<HashSet<String>>,
}

impl Draining {
    fn ids_mut(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.ids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn insert(&self, id: &str) {
        self.ids_mut().insert(id.to_owned());
    }

    pub(crate) fn remove(&self, id: &str) {
        self.ids_mut().remove(id);
    }

    pub(crate) fn ids(&self) -> HashSet<String> {
        self.ids_mut().clone()
    }
}

/// Containers the agent removes itself (right after the engine refused to start them, and
/// replicas it drains: a replacement, a retirement, a scale-down): their `stop`/`die`/
/// `destroy` events are the agent's own doing, not drift. Without this, each refused start
/// would queue another pass through its destroy event, which creates, fails and removes
/// again (a retry storm outside the retry schedule), and every replica a rollout retires
/// would queue a pass and be reported as drift repaired.
#[derive(Debug, Default)]
pub(crate) struct OwnRemovals {
    ids: Mutex<HashSet<String>>,
}

/// Ids remembered at most; an id whose `destroy` event never came (the agent missed it) is
/// forgotten with the rest when the set is full.
const OWN_REMOVALS_KEPT: usize = 1024;

impl OwnRemovals {
    /// Remembers that the agent is about to remove container `id` itself.
    pub(crate) fn note(&self, id: &str) {
        let mut ids = crate::base::lock(&self.ids);
        if ids.len() >= OWN_REMOVALS_KEPT {
            ids.clear();
        }
        ids.insert(id.to_owned());
    }

    /// Whether an event `action` on container `id` comes from the agent's own removal; a
    /// `destroy` is the last event of a container, so its id is forgotten then.
    pub(crate) fn is_own(&self, id: &str, action: &str) -> bool {
        let mut ids = crate::base::lock(&self.ids);
        if action == "destroy" {
            ids.remove(id)
        } else {
            ids.contains(id)
        }
    }
}

/// Replicas whose liveness probe failed, by container id, with the instant from which they
/// are to be replaced (the liveness back-off). The probe runner only marks and requeues; the
/// handler holding the key observes a due replica as outdated (`handlers::replicas::observe`)
/// and replaces it through its plan's gated Replace step, so one writer changes a key's
/// containers and "ready never below replicas − 1" holds for liveness replacements too.
#[derive(Debug, Default)]
pub(crate) struct LivenessFailures {
    due: Mutex<HashMap<String, Instant>>,
}

impl LivenessFailures {
    /// Marks container `id` for replacement from `at` on.
    pub(crate) fn mark(&self, id: &str, at: Instant) {
        let mut due = crate::base::lock(&self.due);
        if due.len() >= OWN_REMOVALS_KEPT {
            due.clear();
        }
        due.insert(id.to_owned(), at);
    }

    /// Whether container `id` is marked and its replacement is due at `now`.
    pub(crate) fn is_due(&self, id: &str, now: Instant) -> bool {
        crate::base::lock(&self.due)
            .get(id)
            .is_some_and(|at| *at <= now)
    }

    /// How long until the first of `ids` marked but not due yet falls due: the pass of
    /// their resource asks for its next pass then (the probe runner only asks for one now).
    pub(crate) fn wait<'a>(
        &self,
        ids: impl IntoIterator<Item = &'a str>,
        now: Instant,
    ) -> Option<std::time::Duration> {
        let due = crate::base::lock(&self.due);
        ids.into_iter()
            .filter_map(|id| due.get(id).copied())
            .filter(|at| *at > now)
            .map(|at| at - now)
            .min()
    }

    /// Forgets containers that are gone.
    pub(crate) fn retain(&self, alive: impl Fn(&str) -> bool) {
        crate::base::lock(&self.due).retain(|id, _| alive(id));
    }
}

/// Resources queued because the host drifted (an event or a resync), until a pass of theirs
/// converges: that pass is the repair people are told of (`drift.repaired`). Bounded like
/// `OwnRemovals`.
#[derive(Debug, Default)]
pub(crate) struct Drifted {
    keys: Mutex<HashMap<ResourceKey, &'static str>>,
}

impl Drifted {
    /// `key` drifted; `source` is how it was seen (`event`, `resync`).
    pub(crate) fn mark(&self, key: &ResourceKey, source: &'static str) {
        let mut keys = crate::base::lock(&self.keys);
        if keys.len() >= OWN_REMOVALS_KEPT {
            keys.clear();
        }
        keys.entry(key.clone()).or_insert(source);
    }

    /// How `key` was seen drifting, if it was and is now repaired (the mark is cleared).
    pub(crate) fn repaired(&self, key: &ResourceKey) -> Option<&'static str> {
        crate::base::lock(&self.keys).remove(key)
    }
}

/// The release under which each resource's hook units of older releases were last looked
/// for and removed (`handlers::hooks::supersede`). Only a pass of a key's current release
/// starts that key's hooks, so once none of an older release is left under release R, none
/// appears while R stays current: the passes after the first of a release skip that list.
/// Forgotten when the agent restarts (the first pass looks again). Bounded like `OwnRemovals`.
#[derive(Debug, Default)]
pub(crate) struct Superseded {
    releases: Mutex<HashMap<ResourceKey, i64>>,
}

impl Superseded {
    /// Whether `key`'s older hook units were removed under `release_id` already.
    pub(crate) fn done(&self, key: &ResourceKey, release_id: i64) -> bool {
        crate::base::lock(&self.releases).get(key) == Some(&release_id)
    }

    /// `key`'s older hook units are removed under `release_id`.
    pub(crate) fn mark(&self, key: &ResourceKey, release_id: i64) {
        let mut releases = crate::base::lock(&self.releases);
        if releases.len() >= OWN_REMOVALS_KEPT {
            releases.clear();
        }
        releases.insert(key.clone(), release_id);
    }
}

/// Most dependencies with waiting dependents remembered (beyond, a waiting resource relies on
/// its own re-check, `handlers::replicated`'s `DEPENDENCY_RECHECK`).
const DEPENDENCIES_KEPT: usize = 10_000;

/// Resources waiting for a dependency to become ready before they start (`depends_on {
/// resources }`), by dependency: the pass that records the dependency `Ready` queues them at
/// once, instead of their waiting for their own re-check.
#[derive(Debug, Default)]
pub(crate) struct Dependents {
    waiting: Mutex<HashMap<ResourceKey, std::collections::BTreeSet<ResourceKey>>>,
}

impl Dependents {
    /// `dependent` waits for each of `dependencies`.
    pub(crate) fn wait(&self, dependent: &ResourceKey, dependencies: &[ResourceKey]) {
        let mut waiting = crate::base::lock(&self.waiting);
        for dependency in dependencies {
            if waiting.len() >= DEPENDENCIES_KEPT && !waiting.contains_key(dependency) {
                continue;
            }
            waiting
                .entry(dependency.clone())
                .or_default()
                .insert(dependent.clone());
        }
    }

    /// The resources waiting for `dependency`, forgotten here: it became ready.
    pub(crate) fn take(&self, dependency: &ResourceKey) -> Vec<ResourceKey> {
        crate::base::lock(&self.waiting)
            .remove(dependency)
            .map(|dependents| dependents.into_iter().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_dependency_becoming_ready_hands_over_its_waiters_once() {
        use crate::model::Kind;
        let dependents = Dependents::default();
        let db = ResourceKey::new(Kind::Statefulset, "shop", "db");
        let cache = ResourceKey::new(Kind::Statefulset, "shop", "cache");
        let web = ResourceKey::new(Kind::Deployment, "shop", "web");
        let api = ResourceKey::new(Kind::Deployment, "shop", "api");
        dependents.wait(&web, &[db.clone(), cache.clone()]);
        dependents.wait(&api, std::slice::from_ref(&db));
        dependents.wait(&web, std::slice::from_ref(&db));
        assert_eq!(dependents.take(&db), vec![api, web.clone()]);
        assert!(dependents.take(&db).is_empty(), "handed over once");
        assert_eq!(dependents.take(&cache), vec![web]);
    }

    #[test]
    fn superseded_hooks_are_looked_for_once_per_release() {
        use crate::model::Kind;
        let superseded = Superseded::default();
        let web = ResourceKey::new(Kind::Deployment, "shop", "web");
        let api = ResourceKey::new(Kind::Deployment, "shop", "api");
        assert!(!superseded.done(&web, 1));
        superseded.mark(&web, 1);
        assert!(superseded.done(&web, 1));
        assert!(!superseded.done(&api, 1), "per resource");
        assert!(!superseded.done(&web, 2), "a new release looks again");
        superseded.mark(&web, 2);
        assert!(!superseded.done(&web, 1), "the last release only");
    }

    #[test]
    fn a_liveness_mark_not_due_yet_is_the_wait_of_its_resource() {
        let failures = LivenessFailures::default();
        let now = Instant::now();
        failures.mark("due", now);
        failures.mark("later", now + Duration::from_secs(20));
        failures.mark("soon", now + Duration::from_secs(10));
        failures.mark("elsewhere", now + Duration::from_secs(1));
        assert!(failures.is_due("due", now));
        assert!(!failures.is_due("soon", now));
        // A due mark is the pass's to act on now; the first of the others is when to look.
        assert_eq!(
            failures.wait(["due", "later", "soon", "unmarked"], now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(failures.wait(["due", "unmarked"], now), None);
        assert_eq!(
            failures.wait(["soon"], now + Duration::from_secs(10)),
            None,
            "due at that instant"
        );
    }
}
