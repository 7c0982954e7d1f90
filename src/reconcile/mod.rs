//! Reconcile stage: tail the store's journal and converge each changed resource through the
//! runtime, one key at a time.
//!
//! Invariants:
//! - on boot every desired resource, and every resource this agent still has containers for,
//!   is reconciled once (a synthetic PUT), then the journal is tailed from the head it had at
//!   boot (or the persisted cursor, if further); the store wakes the tail at once, nothing
//!   polls SQLite;
//! - the cursor only moves past a journal row once its key's reconcile has finished;
//! - one key is never reconciled by two workers at once (`queue`); different keys proceed in
//!   parallel, up to `ReconcileOptions::concurrency`;
//! - a panicking handler is recorded on its resource's status and the loop goes on;
//! - transient errors are retried on the `retry` schedule; each try re-reads desired state;
//! - the cron scheduler (`cron::schedule`) and the job-run waiters (`jobs`) only requeue keys:
//!   every change to the host still goes through a handler holding its key.

mod autoscale;
mod cron;
mod drift;
mod env;
mod error;
pub mod gate;
mod handlers;
mod images;
mod jobs;
pub mod notify;
pub mod plan;
mod probes;
mod queue;
mod retry;
pub mod router;
mod routes;
pub mod wake;

pub use cron::{Clock, DEFAULT_CATCH_UP as DEFAULT_CRON_CATCH_UP};
pub use error::{Error, Result};
pub use jobs::Jobs;
pub use retry::RetryPolicy;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;
use crate::model::{Kind, ResourceKey};
use crate::runtime::{Runtime, labels};
use crate::store::{ResourceStatus, Store, now_unix};
use queue::KeyedQueue;

/// The journal consumer name under which the cursor is persisted.
pub const CURSOR: &str = "reconciler";

/// Tunables of the reconcile loop.
#[derive(Debug, Clone)]
pub struct ReconcileOptions {
    /// Resources reconciled in parallel (each key still one at a time).
    pub concurrency: usize,
    pub retry: RetryPolicy,
    /// Missing replicas of one resource created at once (scale-up, first deploy); voodu
    /// creates them with no pause. Replacements stay one slot at a time regardless.
    pub create_concurrency: usize,
    /// Without a readiness probe, a replica is ready once it has run this long without
    /// restarting.
    pub ready_settle: Duration,
    /// How long a rollout may take, from its release's start, before it is failed and rolled
    /// back (`--rollout-deadline`).
    pub rollout_deadline: Duration,
    /// How often every managed resource is compared with the host, besides container events
    /// (`--resync`).
    pub resync: Duration,
    /// Repair on container events at once (else only at the resync).
    pub container_events: bool,
    /// How often the autoscaler samples CPU (voodu: 15s).
    pub autoscale_interval: Duration,
    /// Ulimits every container gets under its manifest's own: voodu's platform defaults,
    /// clamped to what this host can grant (`host_default_ulimits`).
    pub default_ulimits: Vec<(String, i64, i64)>,
    /// How old the most recent cronjob tick missed while the agent was not running may be
    /// and still run once (`--cron-catch-up`); older ones are reported as missed.
    pub cron_catch_up: Duration,
    /// Where cron's "now" comes from (the wall clock; tests pass a virtual one).
    pub clock: Clock,
    /// The ingress proxy; `None` turns ingresses off (their status says so). The agent
    /// runs the router only when set.
    pub ingress: Option<router::IngressOptions>,
}

impl Default for ReconcileOptions {
    fn default() -> Self {
        ReconcileOptions {
            concurrency: 4,
            retry: RetryPolicy::default(),
            create_concurrency: 16,
            ready_settle: Duration::from_secs(3),
            rollout_deadline: Duration::from_secs(300),
            resync: Duration::from_secs(300),
            container_events: true,
            autoscale_interval: Duration::from_secs(15),
            default_ulimits: host_default_ulimits(),
            cron_catch_up: cron::DEFAULT_CATCH_UP,
            clock: Clock::System,
            ingress: None,
        }
    }
}

/// voodu's platform ulimits (`nofile=65536:65536`, `nproc=4096:4096`), each clamped to this
/// process's own hard limit: an engine started in the same environment cannot grant more, and
/// asking for more makes every container fail to start.
pub fn host_default_ulimits() -> Vec<(String, i64, i64)> {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let hard = |label: &str| -> Option<i64> {
        let line = limits.lines().find(|line| line.starts_with(label))?;
        let fields: Vec<&str> = line[label.len()..].split_whitespace().collect();
        fields.get(1)?.parse().ok()
    };
    [
        ("nofile", 65_536, "Max open files"),
        ("nproc", 4_096, "Max processes"),
    ]
    .into_iter()
    .map(|(name, wanted, label)| {
        let value = hard(label).map_or(wanted, |hard| wanted.min(hard));
        (name.to_owned(), value, value)
    })
    .collect()
}

/// What every handler needs.
pub struct Ctx<R: Runtime> {
    pub store: Arc<Store>,
    pub runtime: Arc<R>,
    /// The `voodu.agent` label value of this agent's containers.
    pub agent_id: String,
    /// `<data-dir>/assets`: where `${asset.…}` references point on the host.
    pub assets_root: std::path::PathBuf,
    pub options: ReconcileOptions,
    /// Where reconciles are counted and timed.
    pub metrics: Arc<Metrics>,
    /// Where release outcomes go for their `on_deploy` webhooks.
    pub notifier: notify::Notifier,
    /// Asks for keys to be reconciled from outside the journal (cron ticks, events).
    pub requeue: wake::Requeue,
    /// Tells the ingress router to rebuild its routes.
    pub router: wake::RouterWake,
    /// Fires when the agent stops: long waits in handlers (init containers, jobs, hooks)
    /// give up on it.
    pub shutdown: CancellationToken,
    /// Waiters of running job runs and the cronjobs' next fire times (`Jobs::default()`).
    pub jobs: Jobs,
    /// What handlers remember between passes (rollout clocks, crash-loop back-offs); lost on
    /// restart by design, rebuilt from the store and the host.
    pub memory: Memory,
}

/// In-memory handler state (see `Ctx::memory`).
#[derive(Debug, Default)]
pub struct Memory {
    pub rollouts: gate::RolloutClock,
    /// Starts of crashed replicas by the agent, by container id.
    pub crash_loops: gate::CrashLoops,
    /// Liveness replacements, by resource: they back off the same way.
    pub liveness: gate::CrashLoops,
    /// Containers the agent removed after a refused start: their events are not drift.
    pub own_removals: wake::OwnRemovals,
}

/// Runs a blocking store call off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    store: &Arc<Store>,
    f: impl FnOnce(&Store) -> crate::store::Result<T> + Send + 'static,
) -> Result<T> {
    let store = store.clone();
    match tokio::task::spawn_blocking(move || f(&store)).await {
        Ok(result) => result.map_err(Error::Store),
        Err(join_error) if join_error.is_panic() => {
            std::panic::resume_unwind(join_error.into_panic())
        }
        Err(join_error) => Err(Error::Task(join_error.to_string())),
    }
}

/// Shared between the tail, the workers and the retry timers.
struct Shared<R: Runtime> {
    ctx: Arc<Ctx<R>>,
    queue: KeyedQueue,
    /// Consecutive failures per key, for the retry schedule.
    failures: Mutex<HashMap<ResourceKey, usize>>,
    /// The highest journal seq read so far.
    read_seq: Mutex<i64>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
}

/// Runs the reconciler until `shutdown` fires; in-flight reconciles finish their current step
/// sequence before it returns.
pub async fn run<R: Runtime>(ctx: Arc<Ctx<R>>, shutdown: CancellationToken) -> Result<()> {
    let mut journal = ctx.store.subscribe();
    // The boot replay covers every journal row up to the current head, so the tail starts
    // there; the replayed keys carry the head's seq, so the cursor only moves past it once the
    // replay is done. Rows between the persisted cursor and the head need no second pass.
    let head = *journal.borrow_and_update();
    let cursor = blocking(&ctx.store, |store| store.cursor(CURSOR)).await?;
    let start = cursor.max(head);
    let shared = Arc::new(Shared {
        ctx: ctx.clone(),
        queue: KeyedQueue::default(),
        failures: Mutex::new(HashMap::new()),
        read_seq: Mutex::new(start),
        tracker: TaskTracker::new(),
        shutdown: shutdown.clone(),
    });

    let boot_seq = (start > cursor).then_some(start);
    for key in boot_keys(&ctx).await? {
        shared.queue.push(key, boot_seq);
    }
    for _ in 0..ctx.options.concurrency.max(1) {
        let shared = shared.clone();
        shared.tracker.clone().spawn(worker(shared));
    }
    shared.tracker.spawn(probes::run(
        ctx.clone(),
        shared.tracker.clone(),
        shutdown.clone(),
    ));
    shared.tracker.spawn(autoscale::run(
        ctx.clone(),
        ctx.options.autoscale_interval,
        shutdown.clone(),
    ));
    shared.tracker.spawn(drift::run(
        ctx.clone(),
        ctx.options.resync,
        ctx.options.container_events,
        shutdown.clone(),
    ));
    shared
        .tracker
        .spawn(cron::schedule(ctx.clone(), shutdown.clone()));
    if let Some(requests) = ctx.requeue.take_receiver() {
        shared.tracker.spawn(requeues(shared.clone(), requests));
    }
    loop {
        tail(&shared).await?;
        tokio::select! {
            changed = journal.changed() => {
                if changed.is_err() {
                    break;
                }
            }
            () = shutdown.cancelled() => break,
        }
    }
    shared.tracker.close();
    shared.tracker.wait().await;
    ctx.jobs.wait().await;
    Ok(())
}

/// Turns `Requeue` requests into queue pushes: at once, or when their delay runs out (one
/// pending instant per key, `wake::Delays`), until shutdown.
async fn requeues<R: Runtime>(
    shared: Arc<Shared<R>>,
    mut requests: tokio::sync::mpsc::UnboundedReceiver<(ResourceKey, Duration)>,
) {
    let mut delays = wake::Delays::default();
    loop {
        let next = delays.next();
        let due = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            request = requests.recv() => match request {
                Some((key, delay)) if delay.is_zero() => shared.queue.push(key, None),
                Some((key, delay)) => delays.insert(key, tokio::time::Instant::now() + delay),
                None => return,
            },
            () = due => {
                for key in delays.take_due(tokio::time::Instant::now()) {
                    shared.queue.push(key, None);
                }
            }
            () = shared.shutdown.cancelled() => return,
        }
    }
}

/// Every container carrying this agent's `voodu.agent` label (and nothing else on the host).
pub(crate) async fn owned_containers<R: Runtime>(
    ctx: &Ctx<R>,
) -> Result<Vec<crate::runtime::Container>> {
    ctx.runtime
        .list(&[(labels::AGENT, ctx.agent_id.as_str())])
        .await
        .map_err(|source| Error::Runtime {
            key: ResourceKey::new(Kind::Deployment, "", "*"),
            source,
        })
}

/// Desired keys plus keys of containers this agent still owns (a resource deleted while the
/// agent was down is found this way).
async fn boot_keys<R: Runtime>(ctx: &Arc<Ctx<R>>) -> Result<BTreeSet<ResourceKey>> {
    let mut keys: BTreeSet<ResourceKey> = blocking(&ctx.store, |store| store.desired_keys())
        .await?
        .into_iter()
        .collect();
    for container in owned_containers(ctx).await? {
        let kind = container.label(labels::KIND).and_then(Kind::parse);
        if let (Some(kind), Some(scope), Some(name)) = (
            kind,
            container.label(labels::SCOPE),
            container.label(labels::NAME),
        ) {
            keys.insert(ResourceKey::new(kind, scope, name));
        }
    }
    Ok(keys)
}

/// Reads journal rows past what was read and queues their keys.
async fn tail<R: Runtime>(shared: &Arc<Shared<R>>) -> Result<()> {
    loop {
        let after = *lock(&shared.read_seq);
        let rows = blocking(&shared.ctx.store, move |store| {
            store.journal_after(after, 1000)
        })
        .await?;
        let Some(last) = rows.last().map(|row| row.seq) else {
            break;
        };
        for row in rows {
            // A new event starts a fresh retry budget.
            lock(&shared.failures).remove(&row.key);
            shared.queue.push(row.key, Some(row.seq));
        }
        *lock(&shared.read_seq) = last;
    }
    persist_cursor(shared).await
}

async fn persist_cursor<R: Runtime>(shared: &Arc<Shared<R>>) -> Result<()> {
    let read = *lock(&shared.read_seq);
    let handled = shared
        .queue
        .low_watermark()
        .map_or(read, |lowest| lowest - 1);
    blocking(&shared.ctx.store, move |store| {
        if store.cursor(CURSOR)? != handled {
            store.set_cursor(CURSOR, handled)?;
        }
        Ok(())
    })
    .await
}

async fn worker<R: Runtime>(shared: Arc<Shared<R>>) {
    loop {
        let key = tokio::select! {
            key = shared.queue.next() => key,
            () = shared.shutdown.cancelled() => return,
        };
        let started = std::time::Instant::now();
        let outcome = shared
            .tracker
            .spawn(handlers::reconcile(shared.ctx.clone(), key.clone()))
            .await;
        let result = match &outcome {
            Ok(Ok(())) => "success",
            Ok(Err(_)) => "error",
            Err(_) => "panic",
        };
        shared
            .ctx
            .metrics
            .record_reconcile(key.kind.as_str(), result, started.elapsed());
        match outcome {
            Ok(Ok(())) => {
                lock(&shared.failures).remove(&key);
            }
            Ok(Err(error)) => on_error(&shared, &key, &error),
            Err(join_error) => {
                let message = match join_error.try_into_panic() {
                    Ok(payload) => panic_message(payload.as_ref()),
                    Err(other) => other.to_string(),
                };
                tracing::error!(%key, %message, "handler panicked; recorded on the resource");
                record_panic(&shared, &key, &message).await;
            }
        }
        shared.queue.done(&key);
        if let Err(error) = persist_cursor(&shared).await {
            tracing::warn!(%error, "cannot persist the journal cursor; it will be retried");
        }
    }
}

fn on_error<R: Runtime>(shared: &Arc<Shared<R>>, key: &ResourceKey, error: &Error) {
    let failures = {
        let mut failures = lock(&shared.failures);
        let count = failures.entry(key.clone()).or_insert(0);
        *count += 1;
        *count
    };
    match shared.ctx.options.retry.next_delay(error, failures) {
        Some(delay) => {
            tracing::warn!(%key, %error, retry_in = ?delay, attempt = failures, "reconcile failed; will retry");
            let shared_for_timer = shared.clone();
            let key = key.clone();
            shared.tracker.spawn(async move {
                tokio::select! {
                    () = tokio::time::sleep(delay) => shared_for_timer.queue.push(key, None),
                    () = shared_for_timer.shutdown.cancelled() => {}
                }
            });
        }
        None => {
            tracing::error!(%key, %error, "reconcile failed; waiting for the next change");
            lock(&shared.failures).remove(key);
        }
    }
}

async fn record_panic<R: Runtime>(shared: &Arc<Shared<R>>, key: &ResourceKey, message: &str) {
    let key = key.clone();
    let message = format!("handler panicked: {message}");
    let result = blocking(&shared.ctx.store, move |store| {
        let previous = store.status(&key)?;
        let status = ResourceStatus {
            phase: "Failed".to_owned(),
            message,
            updated_at: now_unix(),
            ..previous.unwrap_or_else(|| ResourceStatus::new("Failed", ""))
        };
        store.put_status(&key, &status)
    })
    .await;
    if let Err(error) = result {
        tracing::warn!(%error, "cannot record a handler panic");
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|text| (*text).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

/// Locks a mutex whose data stays consistent even if a holder panicked (every critical
/// section here is a single map or counter update).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_ulimits_are_voodus_within_this_hosts_limits() {
        let defaults = host_default_ulimits();
        let names: Vec<&str> = defaults.iter().map(|(name, _, _)| name.as_str()).collect();
        assert_eq!(names, ["nofile", "nproc"]);
        for (name, soft, hard) in &defaults {
            assert_eq!(soft, hard, "{name}");
            assert!(*soft > 0, "{name}");
        }
        assert!(defaults[0].1 <= 65_536 && defaults[1].1 <= 4_096);
    }
}
