//! The one timer: every instant the reconciler waits for is kept here, by one task.
//!
//! Two kinds of entry, one clock:
//! - a **pass** of a key after a delay: what the key's last pass asked for (`next_pass`: an
//!   `Action::RequeueAfter`, a rollout re-check, a back-off, a retry, a liveness replacement
//!   due later), one instant per key (`Delays`). Each pass decides anew from what it saw, so
//!   its answer replaces the instant an earlier pass asked for: a rollout that converged on a
//!   readiness change before its re-check leaves no re-check behind;
//! - a **wake** of a task that has no key (`sleep`, `every`): the drift resync, the
//!   autoscaler's samples, the router's resync and back-off, each probe's period, the cron
//!   scheduler's next fire, a one-shot unit's deadline, a Swarm run's next look, the pauses
//!   between `on_deploy` attempts and after a store error.
//!
//! Each entry says what it waits for (`What`); `/metrics` shows how many of each are pending
//! (`voodu_timer_waits`), so what the agent waits on is one list, not a dozen private timers.
//!
//! Invariants:
//! - only `serve` sleeps on tokio's clock in the reconcile stage (`tests/it/tidy.rs`); every
//!   other wait there is a `Sleep` this task resolves, or an engine call;
//! - a `Sleep` dropped before it is due (its `select!` took another branch) costs nothing
//!   but its entry, removed once it is due or when closed entries outnumber live ones;
//! - once the task is gone (shutdown), a `Sleep` never resolves: every waiter selects on
//!   shutdown too, so nothing spins;
//! - a pass asked for with no delay goes straight to the queue: the timer never delays a
//!   key's first pass;
//! - only a key's passes ask for its delayed passes (everything else asks for a pass now, and
//!   that pass asks for the wait it still needs), so no request is lost when a pass replaces
//!   the key's instant.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::model::ResourceKey;

/// What an entry of the timer waits for: the label of `voodu_timer_waits`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum What {
    /// A key's delayed pass.
    Pass,
    /// The drift resync, and the pause before resubscribing to a broken event stream.
    Resync,
    /// The autoscaler's next sample.
    Autoscale,
    /// The router's resync, a converging proxy's next look, a failed pass's back-off, the
    /// proxy's admin API coming up.
    Router,
    /// A probe's initial delay or period, or a replica's settle time.
    Probe,
    /// The cron scheduler's next fire time, and the backup schedules' next look.
    Cron,
    /// A one-shot unit's deadline, or the next look at a Swarm run or an engine that was
    /// unavailable while a unit was waited for.
    Unit,
    /// The pause between `on_deploy` delivery attempts.
    Notify,
    /// The back-off after a store error in the boot replay or the journal tail.
    Store,
    /// Image automation's next look at the followed repositories.
    Image,
}

impl What {
    const ALL: [What; 10] = [
        What::Pass,
        What::Resync,
        What::Autoscale,
        What::Router,
        What::Probe,
        What::Cron,
        What::Unit,
        What::Notify,
        What::Store,
        What::Image,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            What::Pass => "pass",
            What::Resync => "resync",
            What::Autoscale => "autoscale",
            What::Router => "router",
            What::Probe => "probe",
            What::Cron => "cron",
            What::Unit => "unit",
            What::Notify => "notify",
            What::Store => "store",
            What::Image => "image",
        }
    }
}

/// A request to the timer task.
#[derive(Debug)]
enum Request {
    /// Reconcile this key now.
    Pass(ResourceKey),
    /// A pass of this key ended asking for the next after this long (`None`: none).
    Next(ResourceKey, Option<Duration>),
    /// Resolve this sender at this instant.
    Wake(What, Instant, oneshot::Sender<()>),
}

/// The handle: asks for passes of keys and for wakes. Cheap to clone; `Default` makes a
/// fresh one whose task `serve` runs (the reconciler's run loop takes its receiver once).
#[derive(Debug, Clone)]
pub struct Timer {
    sender: mpsc::UnboundedSender<Request>,
    receiver: Arc<Mutex<Option<mpsc::UnboundedReceiver<Request>>>>,
}

impl Default for Timer {
    fn default() -> Timer {
        let (sender, receiver) = mpsc::unbounded_channel();
        Timer {
            sender,
            receiver: Arc::new(Mutex::new(Some(receiver))),
        }
    }
}

impl Timer {
    /// Reconcile `key` soon (deduplicated by the queue like any other request).
    pub fn requeue(&self, key: ResourceKey) {
        // The reconciler gone (shutdown) means nobody needs the request.
        let _ = self.sender.send(Request::Pass(key));
    }

    /// A pass of `key` ended asking for the next one after `delay` (`None`: no delayed pass):
    /// this replaces the delayed pass an earlier pass of the key asked for. Only the worker
    /// that ran the pass calls this (module invariant).
    pub(crate) fn next_pass(&self, key: ResourceKey, delay: Option<Duration>) {
        let _ = self.sender.send(Request::Next(key, delay));
    }

    /// Resolves once `delay` has passed.
    pub(crate) fn sleep(&self, what: What, delay: Duration) -> Sleep {
        self.sleep_until(what, Instant::now() + delay)
    }

    /// Resolves at `at`.
    pub(crate) fn sleep_until(&self, what: What, at: Instant) -> Sleep {
        let (wake, woken) = oneshot::channel();
        // If the task is gone the sender is dropped with the request, and the sleep never
        // resolves (module invariant).
        let _ = self.sender.send(Request::Wake(what, at, wake));
        Sleep { woken: Some(woken) }
    }

    /// Periodic wakes: the first after `first`, then one `period` after each, counted from
    /// the instant the previous one was due (a slow consumer delays the next tick, it never
    /// gets a burst of missed ones).
    pub(crate) fn every(&self, what: What, first: Duration, period: Duration) -> Ticks {
        Ticks {
            next: Some(self.sleep(what, first)),
            timer: self.clone(),
            what,
            period,
        }
    }

    /// The receiving end, for the reconciler's run loop (taken once).
    fn take_receiver(&self) -> Option<mpsc::UnboundedReceiver<Request>> {
        self.receiver
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    /// Runs the timer until `shutdown`: due passes go to `push`, due wakes are resolved.
    /// `None` when another task already serves this timer.
    pub(crate) fn serve(
        &self,
        push: impl Fn(ResourceKey) + Send + 'static,
        metrics: Arc<Metrics>,
        shutdown: CancellationToken,
    ) -> Option<impl Future<Output = ()> + Send + 'static> {
        let requests = self.take_receiver()?;
        Some(serve(requests, push, metrics, shutdown))
    }
}

/// A wait the timer task resolves; never resolves once that task is gone.
#[derive(Debug)]
pub(crate) struct Sleep {
    woken: Option<oneshot::Receiver<()>>,
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(woken) = self.woken.as_mut() else {
            return Poll::Pending;
        };
        match Pin::new(woken).poll(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(()),
            Poll::Ready(Err(_)) => {
                // The timer task is gone (shutdown): stay pending for good.
                self.woken = None;
                Poll::Pending
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Periodic wakes of one task (`Timer::every`). `tick` is cancel-safe: a `select!` that takes
/// another branch keeps the pending tick.
#[derive(Debug)]
pub(crate) struct Ticks {
    timer: Timer,
    what: What,
    period: Duration,
    next: Option<Sleep>,
}

impl Ticks {
    /// Waits for the next tick.
    pub(crate) async fn tick(&mut self) {
        let (timer, what) = (&self.timer, self.what);
        let period = self.period;
        let next = self.next.get_or_insert_with(|| timer.sleep(what, period));
        next.await;
        self.next = Some(self.timer.sleep(self.what, self.period));
    }

    /// The next tick at once (the periods go on from it).
    pub(crate) fn reset_immediately(&mut self) {
        self.next = Some(self.timer.sleep(self.what, Duration::ZERO));
    }
}

/// Delayed passes not yet due: per key, the instant its last pass asked for.
#[derive(Debug, Default)]
pub(crate) struct Delays {
    due: HashMap<ResourceKey, Instant>,
}

impl Delays {
    /// The key's next delayed pass is at `at` (`None`: it has none), whatever an earlier
    /// pass asked for.
    pub(crate) fn set(&mut self, key: ResourceKey, at: Option<Instant>) {
        match at {
            Some(at) => {
                self.due.insert(key, at);
            }
            None => {
                self.due.remove(&key);
            }
        }
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

    fn len(&self) -> usize {
        self.due.len()
    }
}

/// Pending wakes, earliest first.
#[derive(Debug, Default)]
struct Wakes {
    order: BinaryHeap<Reverse<(Instant, u64)>>,
    entries: HashMap<u64, (What, oneshot::Sender<()>)>,
    seq: u64,
    /// Entries kept after the last sweep of closed ones: the next sweep runs at twice this.
    swept_at: usize,
}

impl Wakes {
    fn insert(&mut self, what: What, at: Instant, wake: oneshot::Sender<()>) {
        self.seq = self.seq.wrapping_add(1);
        self.order.push(Reverse((at, self.seq)));
        self.entries.insert(self.seq, (what, wake));
        if self.entries.len() > self.swept_at.max(64).saturating_mul(2) {
            self.sweep();
        }
    }

    /// Forgets wakes nobody waits for any more (their `Sleep` was dropped).
    fn sweep(&mut self) {
        self.entries.retain(|_, (_, wake)| !wake.is_closed());
        let entries = &self.entries;
        self.order
            .retain(|Reverse((_, seq))| entries.contains_key(seq));
        self.swept_at = self.entries.len();
    }

    fn next(&self) -> Option<Instant> {
        self.order.peek().map(|Reverse((at, _))| *at)
    }

    /// Resolves every wake due at `now`.
    fn fire(&mut self, now: Instant) {
        while let Some(Reverse((at, seq))) = self.order.peek().copied() {
            if at > now {
                break;
            }
            self.order.pop();
            if let Some((_, wake)) = self.entries.remove(&seq) {
                // A dropped `Sleep` no longer listens: nothing to do.
                let _ = wake.send(());
            }
        }
    }

    /// Pending wakes somebody still waits for, by what they wait for (one pass).
    fn counts(&self) -> HashMap<What, usize> {
        let mut counts = HashMap::new();
        for (what, wake) in self.entries.values() {
            if !wake.is_closed() {
                *counts.entry(*what).or_default() += 1;
            }
        }
        counts
    }
}

async fn serve(
    mut requests: mpsc::UnboundedReceiver<Request>,
    push: impl Fn(ResourceKey),
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let mut passes = Delays::default();
    let mut wakes = Wakes::default();
    loop {
        let next = match (passes.next(), wakes.next()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let due = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            request = requests.recv() => match request {
                Some(Request::Pass(key)) => push(key),
                Some(Request::Next(key, Some(delay))) if delay.is_zero() => {
                    passes.set(key.clone(), None);
                    push(key);
                }
                Some(Request::Next(key, delay)) => {
                    passes.set(key, delay.map(|delay| Instant::now() + delay));
                }
                Some(Request::Wake(what, at, wake)) => wakes.insert(what, at, wake),
                None => return,
            },
            () = due => {
                let now = Instant::now();
                for key in passes.take_due(now) {
                    push(key);
                }
                wakes.fire(now);
            }
            () = shutdown.cancelled() => return,
        }
        let waiting = wakes.counts();
        let counts: Vec<(&'static str, usize)> = What::ALL
            .iter()
            .map(|what| {
                let n = match what {
                    What::Pass => passes.len(),
                    other => waiting.get(other).copied().unwrap_or(0),
                };
                (what.as_str(), n)
            })
            .collect();
        metrics.set_timer_waits(&counts);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Kind;

    #[test]
    fn a_key_keeps_one_timer_at_the_instant_its_last_pass_asked_for() {
        let t0 = Instant::now();
        let web = ResourceKey::new(Kind::Deployment, "shop", "web");
        let api = ResourceKey::new(Kind::Deployment, "shop", "api");
        let gone = ResourceKey::new(Kind::Deployment, "shop", "gone");
        let mut delays = Delays::default();
        for seconds in [5, 9, 2] {
            delays.set(web.clone(), Some(t0 + Duration::from_secs(seconds)));
        }
        delays.set(api.clone(), Some(t0 + Duration::from_secs(3)));
        // A pass that converged asks for none: its earlier re-check goes.
        delays.set(gone.clone(), Some(t0 + Duration::from_secs(1)));
        delays.set(gone, None);
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

    /// A timer served on a paused clock; what it pushed is in the returned list.
    fn served() -> (
        Timer,
        Arc<Mutex<Vec<ResourceKey>>>,
        Arc<Metrics>,
        CancellationToken,
    ) {
        let timer = Timer::default();
        let pushed = Arc::new(Mutex::new(Vec::new()));
        let metrics = Arc::new(Metrics::new());
        let shutdown = CancellationToken::new();
        let into = pushed.clone();
        let task = timer
            .serve(
                move |key| into.lock().expect("not poisoned").push(key),
                metrics.clone(),
                shutdown.clone(),
            )
            .expect("the first serve takes the receiver");
        assert!(
            timer
                .serve(|_| {}, metrics.clone(), shutdown.clone())
                .is_none(),
            "a timer is served once"
        );
        tokio::spawn(task);
        (timer, pushed, metrics, shutdown)
    }

    #[tokio::test(start_paused = true)]
    async fn sleeps_and_passes_fall_due_in_order_on_one_clock() {
        let (timer, pushed, _metrics, _shutdown) = served();
        let web = ResourceKey::new(Kind::Deployment, "shop", "web");
        let t0 = Instant::now();
        timer.next_pass(web.clone(), Some(Duration::from_secs(5)));
        timer.requeue(ResourceKey::new(Kind::Job, "shop", "now"));
        // Another key's re-check, superseded by its next pass, which converged.
        let api = ResourceKey::new(Kind::Deployment, "shop", "api");
        timer.next_pass(api.clone(), Some(Duration::from_secs(4)));
        timer.next_pass(api, None);
        timer.sleep(What::Probe, Duration::from_secs(3)).await;
        assert_eq!(Instant::now() - t0, Duration::from_secs(3));
        assert_eq!(
            pushed.lock().expect("not poisoned").len(),
            1,
            "only the undelayed pass"
        );
        timer.sleep(What::Probe, Duration::from_secs(3)).await;
        assert_eq!(
            *pushed.lock().expect("not poisoned"),
            [ResourceKey::new(Kind::Job, "shop", "now"), web],
            "the delayed pass came due at 5 s; the superseded re-check never"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn ticks_keep_their_period_and_survive_a_select_that_took_another_branch() {
        let (timer, _pushed, _metrics, _shutdown) = served();
        let t0 = Instant::now();
        let mut ticks = timer.every(What::Resync, Duration::ZERO, Duration::from_secs(10));
        ticks.tick().await;
        assert_eq!(
            Instant::now() - t0,
            Duration::ZERO,
            "the first tick at once"
        );
        // Another branch wins at 4 s; the pending tick is kept, not re-armed.
        tokio::select! {
            () = ticks.tick() => panic!("the tick is due at 10 s"),
            () = timer.sleep(What::Probe, Duration::from_secs(4)) => {}
        }
        ticks.tick().await;
        assert_eq!(Instant::now() - t0, Duration::from_secs(10));
        ticks.reset_immediately();
        ticks.tick().await;
        assert_eq!(Instant::now() - t0, Duration::from_secs(10));
        ticks.tick().await;
        assert_eq!(Instant::now() - t0, Duration::from_secs(20));
    }

    #[tokio::test(start_paused = true)]
    async fn metrics_count_what_waits_and_dropped_sleeps_are_swept() {
        let (timer, _pushed, metrics, shutdown) = served();
        let held: Vec<Sleep> = (0..3)
            .map(|_| timer.sleep(What::Probe, Duration::from_secs(60)))
            .collect();
        for _ in 0..500 {
            drop(timer.sleep(What::Cron, Duration::from_secs(3600)));
        }
        timer.next_pass(
            ResourceKey::new(Kind::Deployment, "shop", "web"),
            Some(Duration::from_secs(30)),
        );
        timer.sleep(What::Unit, Duration::from_millis(1)).await;
        let mut text = String::new();
        metrics.render(&mut text);
        assert!(
            text.contains("voodu_timer_waits{what=\"probe\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("voodu_timer_waits{what=\"pass\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("voodu_timer_waits{what=\"cron\"} 0"),
            "{text}"
        );
        let mut wakes = Wakes::default();
        for _ in 0..500 {
            let (wake, woken) = oneshot::channel();
            wakes.insert(What::Cron, Instant::now() + Duration::from_secs(60), wake);
            drop(woken);
        }
        assert!(
            wakes.entries.len() <= 128,
            "dropped sleeps are swept, {} kept",
            wakes.entries.len()
        );
        assert_eq!(wakes.order.len(), wakes.entries.len());
        drop(held);
        // Once the task is gone a sleep never resolves.
        shutdown.cancel();
        tokio::task::yield_now().await;
        let late = tokio::time::timeout(
            Duration::from_secs(3600),
            timer.sleep(What::Probe, Duration::ZERO),
        )
        .await;
        assert!(late.is_err(), "a sleep after shutdown stays pending");
    }
}
