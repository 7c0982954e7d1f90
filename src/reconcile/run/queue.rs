//! A keyed work queue: pending keys are deduplicated, and a key that is being reconciled is
//! never handed out again until its worker calls `done` (a request arriving meanwhile is held
//! and re-queued then).
//!
//! Each entry also carries the highest journal seq that asked for it, so the reconciler can
//! tell which journal rows are fully handled (`low_watermark`) before moving its cursor.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use tokio::sync::Notify;

use crate::model::ResourceKey;

#[derive(Default)]
pub(crate) struct KeyedQueue {
    state: Mutex<QueueState>,
    notify: Notify,
}

#[derive(Default)]
struct QueueState {
    ready: VecDeque<ResourceKey>,
    /// Keys in `ready`, with the highest journal seq that asked for them.
    queued: HashMap<ResourceKey, Option<i64>>,
    /// Keys a worker holds now.
    running: HashMap<ResourceKey, Option<i64>>,
    /// Keys asked for again while running.
    dirty: HashMap<ResourceKey, Option<i64>>,
}

fn merge(slot: &mut Option<i64>, seq: Option<i64>) {
    *slot = (*slot).max(seq);
}

impl KeyedQueue {
    /// Asks for `key` to be reconciled, on behalf of journal row `seq` if any.
    pub(crate) fn push(&self, key: ResourceKey, seq: Option<i64>) {
        let mut state = self.lock();
        if state.running.contains_key(&key) {
            merge(state.dirty.entry(key).or_default(), seq);
            return;
        }
        if let Some(slot) = state.queued.get_mut(&key) {
            merge(slot, seq);
            return;
        }
        state.queued.insert(key.clone(), seq);
        state.ready.push_back(key);
        drop(state);
        self.notify.notify_one();
    }

    /// Waits for the next key no worker holds, and marks it held.
    pub(crate) async fn next(&self) -> ResourceKey {
        loop {
            let notified = self.notify.notified();
            {
                let mut state = self.lock();
                if let Some(key) = state.ready.pop_front() {
                    let seq = state.queued.remove(&key).flatten();
                    state.running.insert(key.clone(), seq);
                    let more = !state.ready.is_empty();
                    drop(state);
                    if more {
                        // Let another idle worker pick up the rest.
                        self.notify.notify_one();
                    }
                    return key;
                }
            }
            notified.await;
        }
    }

    /// Releases a key after its reconcile; a request that came in meanwhile is queued now.
    pub(crate) fn done(&self, key: &ResourceKey) {
        let mut state = self.lock();
        state.running.remove(key);
        if let Some(seq) = state.dirty.remove(key) {
            state.queued.insert(key.clone(), seq);
            state.ready.push_back(key.clone());
            drop(state);
            self.notify.notify_one();
        }
    }

    /// The lowest journal seq still queued, running or held; `None` when all are handled.
    pub(crate) fn low_watermark(&self) -> Option<i64> {
        let state = self.lock();
        state
            .queued
            .values()
            .chain(state.running.values())
            .chain(state.dirty.values())
            .flatten()
            .min()
            .copied()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Kind;

    fn key(name: &str) -> ResourceKey {
        ResourceKey::new(Kind::Deployment, "s", name)
    }

    #[tokio::test]
    async fn pending_keys_are_deduplicated() {
        let queue = KeyedQueue::default();
        queue.push(key("a"), Some(1));
        queue.push(key("b"), Some(2));
        queue.push(key("a"), Some(3));
        assert_eq!(queue.next().await, key("a"));
        assert_eq!(queue.next().await, key("b"));
        assert!(queue.lock().ready.is_empty(), "a was queued once");
    }

    #[tokio::test]
    async fn a_running_key_is_held_until_done() {
        let queue = KeyedQueue::default();
        queue.push(key("a"), Some(1));
        let running = queue.next().await;
        queue.push(key("a"), Some(2));
        assert!(
            queue.lock().ready.is_empty(),
            "a must not be handed out twice"
        );
        assert_eq!(queue.low_watermark(), Some(1));
        queue.done(&running);
        assert_eq!(queue.low_watermark(), Some(2));
        assert_eq!(queue.next().await, key("a"));
        queue.done(&key("a"));
        assert_eq!(queue.low_watermark(), None);
    }
}
