//! Ways for work outside the journal to ask for reconciles: `Requeue` (a key, now or after a
//! delay: cron ticks, readiness changes, runtime events) and `RouterWake` (the ingress router
//! rebuilds its routes when replicas of a routed deployment change, and reports back what the
//! proxy serves).
//!
//! Invariant: both only trigger; handlers stay level-triggered and read desired and actual
//! state themselves, so a request that arrives twice, late or for a deleted key is harmless.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, watch};

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
    pub fn after(&self, key: ResourceKey, delay: Duration) {
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

    /// A receiver that sees every later report.
    pub fn subscribe_report(&self) -> watch::Receiver<Arc<RouterReport>> {
        self.report.subscribe()
    }

    /// Publishes the router's report (the router only).
    pub(crate) fn publish(&self, report: RouterReport) {
        self.report.send_replace(Arc::new(report));
    }
}
