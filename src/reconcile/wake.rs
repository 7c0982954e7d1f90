//! Ways for work outside the journal to ask for reconciles: `Requeue` (a key, now or after a
//! delay: cron ticks, readiness changes, runtime events) and `RouterWake` (the ingress router
//! rebuilds its routes when replicas of a routed deployment change, and reports back what the
//! proxy serves).
//!
//! Delayed requests are kept in `Delays`, one instant per key (the earliest asked for), so a
//! key that asks again on every pass keeps one timer, not a growing number of them.
//!
//! `OwnRemovals` keeps the other way round: containers the agent removed itself on purpose (a
//! replica whose start the engine refused), whose events are no drift to repair.
//!
//! Invariant: both only trigger; handlers stay level-triggered and read desired and actual
//! state themselves, so a request that arrives twice, late or for a deleted key is harmless.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::router::RouterReport;
use crate::model::ResourceKey;

/// A request: reconcile this key once this delay has passed.
type Request = (ResourceKey, Duration);

/// Asks the reconciler to reconcile a key (deduplicated by its queue like any other request).
#[derive(Debug, Clone)]
pub struct Requeue {
    sender: mpsc::UnboundedSender<Request>,
    receiver: Arc<Mutex<Option<mpsc::UnboundedReceiver<Request>>>>,
}

impl Default for Requeue {
    fn default() -> Requeue {
        let (sender, receiver) = mpsc::unbounded_channel();
        Requeue {
            sender,
            receiver: Arc::new(Mutex::new(Some(receiver))),
        }
    }
}

impl Requeue {
    /// Reconcile `key` soon.
    pub fn now(&self, key: ResourceKey) {
        self.after(key, Duration::ZERO);
    }

    /// Reconcile `key` once `delay` has passed.
    pub(crate) fn after(&self, key: ResourceKey, delay: Duration) {
        // The reconciler gone (shutdown) means nobody needs the request.
        let _ = self.sender.send((key, delay));
    }

    /// The receiving end, for the reconciler's run loop (taken once).
    pub(crate) fn take_receiver(&self) -> Option<mpsc::UnboundedReceiver<Request>> {
        self.receiver
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

/// Delayed requests not yet due: per key, the earliest instant asked for.
#[derive(Debug, Default)]
pub(crate) struct Delays {
    due: HashMap<ResourceKey, Instant>,
}

impl Delays {
    /// Adds a request; a key already waiting keeps the earlier of the two instants (the
    /// reconcile it triggers asks again if it still needs a later one).
    pub(crate) fn insert(&mut self, key: ResourceKey, at: Instant) {
        self.due
            .entry(key)
            .and_modify(|due| *due = (*due).min(at))
            .or_insert(at);
    }

    /// The next instant a request falls due.
    pub(crate) fn next(&self) -> Option<Instant> {
        self.due.values().min().copied()
    }

    /// Removes and returns the keys due at `now`.
    pub(crate) fn take_due(&mut self, now: Instant) -> Vec<ResourceKey> {
        let due: Vec<ResourceKey> = self
            .due
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(key, _)| key.clone())
            .collect();
        for key in &due {
            self.due.remove(key);
        }
        due
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Kind;

    #[test]
    fn a_key_asking_again_keeps_one_timer_at_the_earliest_instant() {
        let t0 = Instant::now();
        let web = ResourceKey::new(Kind::Deployment, "shop", "web");
        let api = ResourceKey::new(Kind::Deployment, "shop", "api");
        let mut delays = Delays::default();
        for seconds in [5, 2, 9, 2] {
            delays.insert(web.clone(), t0 + Duration::from_secs(seconds));
        }
        delays.insert(api.clone(), t0 + Duration::from_secs(3));
        assert_eq!(delays.due.len(), 2);
        assert_eq!(delays.next(), Some(t0 + Duration::from_secs(2)));
        assert_eq!(
            delays.take_due(t0 + Duration::from_secs(1)),
            Vec::<ResourceKey>::new()
        );
        assert_eq!(delays.take_due(t0 + Duration::from_secs(2)), vec![web]);
        assert_eq!(delays.next(), Some(t0 + Duration::from_secs(3)));
        assert_eq!(delays.take_due(t0 + Duration::from_secs(60)), vec![api]);
        assert_eq!(delays.next(), None);
    }
}

/// Containers the agent removed itself right after the engine refused to start them: their
/// `die`/`destroy` events are the agent's own doing, not drift. Without this, each refused
/// start would queue another pass through its destroy event, which creates, fails and
/// removes again: a retry storm outside the retry schedule.
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
        let mut ids = super::lock(&self.ids);
        if ids.len() >= OWN_REMOVALS_KEPT {
            ids.clear();
        }
        ids.insert(id.to_owned());
    }

    /// Whether an event `action` on container `id` comes from the agent's own removal; a
    /// `destroy` is the last event of a container, so its id is forgotten then.
    pub(crate) fn is_own(&self, id: &str, action: &str) -> bool {
        let mut ids = super::lock(&self.ids);
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
        let mut due = super::lock(&self.due);
        if due.len() >= OWN_REMOVALS_KEPT {
            due.clear();
        }
        due.insert(id.to_owned(), at);
    }

    /// Whether container `id` is marked and its replacement is due at `now`.
    pub(crate) fn is_due(&self, id: &str, now: Instant) -> bool {
        super::lock(&self.due).get(id).is_some_and(|at| *at <= now)
    }

    /// Forgets containers that are gone.
    pub(crate) fn retain(&self, alive: impl Fn(&str) -> bool) {
        super::lock(&self.due).retain(|id, _| alive(id));
    }
}
