//! The run loop: tails the store's journal, replays every key once at boot, and hands keys to
//! workers, one key at a time (`queue`), each pass's error through one policy (`retry`), each
//! delayed pass in the one timer (`timer`); `wake` carries what other tasks tell the loop.

pub(crate) mod action;
pub(crate) mod queue;
pub(crate) mod retry;
pub mod timer;
pub mod wake;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::base::lock;
use crate::model::{Kind, ResourceKey};
use crate::reconcile::context::{Ctx, Deps, Engine, ReconcileOptions, blocking, owned_containers};
use crate::reconcile::observers::image_scan::committer::ImageCommitter;
use crate::reconcile::observers::{autoscale, backups, cron, drift, image_scan, probes};
use crate::reconcile::{error::Error, error::Result, handlers, router};
use crate::runtime::{Runtime, labels};
use crate::store::{FailureReason, Phase, ResourceStatus, now_unix};
use action::Action;
use queue::KeyedQueue;
use wake::RegistryPushes;

/// The journal consumer name under which the cursor is persisted.
pub const CURSOR: &str = "reconciler";

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

/// Runs the reconciler until `shutdown` fires. Every task it starts runs on `deps.tracker`;
/// in-flight reconciles finish their current step sequence once the caller waits for it.
///
/// Only a failure to read the agent id ends it early: a store error in the journal tail or
/// the boot replay is logged and tried again on the retry schedule, like a worker's.
pub async fn run<R: Runtime>(
    deps: Deps<R>,
    options: ReconcileOptions,
    shutdown: CancellationToken,
) -> Result<()> {
    let agent_id = blocking(&deps.store, |store| store.agent_id()).await?;
    let tracker = deps.tracker.clone();
    let image_committer = deps.handles.image_committer.0.clone();
    let registry_pushes = deps.handles.registry_pushes.clone();
    let ctx = Arc::new(Ctx::new(deps, agent_id, options, shutdown.clone()));
    let mut journal = ctx.store.subscribe();
    let shared = Arc::new(Shared {
        ctx: ctx.clone(),
        queue: KeyedQueue::default(),
        failures: Mutex::new(HashMap::new()),
        read_seq: Mutex::new(0),
        tracker: tracker.clone(),
        shutdown: shutdown.clone(),
    });
    // The one timer, first: the boot replay's back-off waits in it too.
    let pushes = shared.clone();
    if let Some(timer) = ctx.timer.serve(
        move |key| pushes.queue.push(key, None),
        ctx.metrics.clone(),
        shutdown.clone(),
    ) {
        tracker.spawn(timer);
    }
    // The boot replay covers every journal row up to the current head, so the tail starts
    // there; the replayed keys carry the head's seq, so the cursor only moves past it once the
    // replay is done. Rows between the persisted cursor and the head need no second pass.
    let mut failures = 0;
    loop {
        match boot(&shared, &mut journal).await {
            Ok(()) => break,
            Err(error) => {
                failures += 1;
                let delay = ctx.options.retry.backoff(failures);
                ctx.metrics.record_journal_error("boot");
                tracing::warn!(%error, retry_in = ?delay, "boot replay failed; will retry");
                tokio::select! {
                    () = ctx.timer.sleep(timer::What::Store, delay) => {}
                    () = shutdown.cancelled() => return Ok(()),
                }
            }
        }
    }
    for _ in 0..ctx.options.concurrency.max(1) {
        tracker.spawn(worker(shared.clone()));
    }
    spawn_observers(&ctx, &tracker, image_committer, registry_pushes, &shutdown);
    // A failed tail is read again after the retry schedule's delay (or at the next journal
    // change): one store error, such as SQLITE_BUSY past the busy timeout, never stops the
    // agent.
    let mut failures = 0;
    loop {
        let retry = match tail(&shared).await {
            Ok(()) => {
                failures = 0;
                None
            }
            Err(error) => {
                failures += 1;
                let delay = ctx.options.retry.backoff(failures);
                ctx.metrics.record_journal_error("tail");
                tracing::warn!(%error, retry_in = ?delay, "cannot read the journal; will retry");
                Some(delay)
            }
        };
        let retry_due = async {
            match retry {
                Some(delay) => ctx.timer.sleep(timer::What::Store, delay).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = journal.changed() => {
                if changed.is_err() {
                    break;
                }
            }
            () = retry_due => {}
            () = shutdown.cancelled() => break,
        }
    }
    Ok(())
}

/// The stage's tasks beside the workers, on the caller's tracker: the probe manager (not under
/// Swarm, which runs the health checks of its tasks itself), the autoscaler, drift, cron, image
/// automation, and the router (or, with the ingress off, the removal of an earlier run's proxy).
fn spawn_observers<R: Runtime>(
    ctx: &Arc<Ctx<R>>,
    tracker: &TaskTracker,
    image_committer: Option<Arc<dyn ImageCommitter>>,
    registry_pushes: RegistryPushes,
    shutdown: &CancellationToken,
) {
    // Each drift resync's list of every container is the probe manager's too. Swarm runs the
    // health checks of its tasks itself (probes become health checks): no probe manager.
    let (listed, listed_by_probes) = tokio::sync::watch::channel(probes::Listed::default());
    if ctx.options.engine == Engine::Docker {
        tracker.spawn(probes::run(
            ctx.clone(),
            tracker.clone(),
            listed_by_probes,
            shutdown.clone(),
        ));
    }
    tracker.spawn(autoscale::run(
        ctx.clone(),
        ctx.options.autoscale_interval,
        shutdown.clone(),
    ));
    tracker.spawn(drift::run(
        ctx.clone(),
        ctx.options.resync,
        listed,
        shutdown.clone(),
    ));
    tracker.spawn(cron::schedule(ctx.clone(), shutdown.clone()));
    tracker.spawn(backups::run(ctx.clone(), shutdown.clone()));
    tracker.spawn(image_scan::run(
        ctx.clone(),
        image_committer,
        registry_pushes,
        shutdown.clone(),
    ));
    match ctx.options.ingress.clone() {
        Some(ingress) if ingress.run_router => {
            tracker.spawn(router::run(ctx.clone(), ingress, shutdown.clone()));
        }
        Some(_) => {}
        None => {
            // Off: a proxy left from an earlier run with the ingress on would keep serving
            // stale routes.
            let ctx = ctx.clone();
            tracker.spawn(async move {
                if let Err(error) =
                    router::remove_proxy(ctx.runtime.as_ref(), &ctx.agent_id, ctx.options.engine)
                        .await
                {
                    tracing::warn!(%error, "cannot remove the ingress proxy of an earlier run");
                }
            });
        }
    }
}

/// Queues every key of the boot replay and sets where the tail starts.
async fn boot<R: Runtime>(
    shared: &Arc<Shared<R>>,
    journal: &mut tokio::sync::watch::Receiver<i64>,
) -> Result<()> {
    let ctx = &shared.ctx;
    let head = *journal.borrow_and_update();
    let cursor = blocking(&ctx.store, |store| store.cursor(CURSOR)).await?;
    let start = cursor.max(head);
    let boot_seq = (start > cursor).then_some(start);
    for key in boot_keys(ctx).await? {
        shared.queue.push(key, boot_seq);
    }
    *lock(&shared.read_seq) = start;
    Ok(())
}

/// Desired keys, keys the store still holds state for (status, job runs, cron position,
/// readiness) and keys of containers this agent still owns: a resource deleted while the
/// agent was down is found this way, and its handler removes what is left of it.
async fn boot_keys<R: Runtime>(ctx: &Arc<Ctx<R>>) -> Result<BTreeSet<ResourceKey>> {
    let mut keys: BTreeSet<ResourceKey> = blocking(&ctx.store, |store| {
        let mut keys = store.desired_keys()?;
        keys.extend(store.state_keys()?);
        Ok(keys)
    })
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
            Ok(Ok(_)) => "success",
            Ok(Err(_)) => "error",
            Err(_) => "panic",
        };
        shared
            .ctx
            .metrics
            .record_reconcile(key.kind.as_str(), result, started.elapsed());
        let action = match outcome {
            Ok(Ok(action)) => {
                lock(&shared.failures).remove(&key);
                if action.delay().is_none() {
                    tell_repaired(&shared.ctx, &key).await;
                }
                action
            }
            Ok(Err(error)) => error_policy(&shared, &key, &error).await,
            Err(join_error) => {
                let message = match join_error.try_into_panic() {
                    Ok(payload) => panic_message(payload.as_ref()),
                    Err(other) => other.to_string(),
                };
                tracing::error!(%key, %message, "handler panicked; recorded on the resource");
                record_panic(&shared, &key, &message).await;
                Action::AwaitChange
            }
        };
        // This pass's answer replaces whatever delayed pass an earlier one asked for.
        shared.ctx.timer.next_pass(key.clone(), action.delay());
        shared.queue.done(&key);
        if let Err(error) = persist_cursor(&shared).await {
            tracing::warn!(%error, "cannot persist the journal cursor; it will be retried");
        }
    }
}

/// After a converged pass of a key that had drifted: the `drift.repaired` event.
async fn tell_repaired<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey) {
    let Some(source) = ctx.memory.drifted.repaired(key) else {
        return;
    };
    let resource = key.to_string();
    let message = format!("the host drifted (seen by {source}) and was brought back to git");
    let recorded = blocking(&ctx.store, move |store| {
        store.record_event(
            "drift.repaired",
            &resource,
            &message,
            serde_json::json!({ "seen_by": source }),
        )
    })
    .await;
    if let Err(error) = recorded {
        tracing::warn!(%key, %error, "cannot record a drift repair event");
    }
}

/// Maps a failed reconcile to its `Action` (`RetryPolicy::error_policy`) and records the
/// error on the resource's status: a retry keeps the phase the handler wrote (or `Pending`),
/// anything else is `Failed`; either way the status carries the error's typed reason.
async fn error_policy<R: Runtime>(
    shared: &Arc<Shared<R>>,
    key: &ResourceKey,
    error: &Error,
) -> Action {
    let failures = {
        let mut failures = lock(&shared.failures);
        let count = failures.entry(key.clone()).or_insert(0);
        *count += 1;
        *count
    };
    let action = shared.ctx.options.retry.error_policy(error, failures);
    match action {
        Action::RequeueAfter(delay) => {
            tracing::warn!(%key, %error, retry_in = ?delay, attempt = failures, "reconcile failed; will retry");
        }
        Action::Done | Action::AwaitChange => {
            tracing::error!(%key, %error, "reconcile failed; waiting for the next change");
            lock(&shared.failures).remove(key);
        }
    }
    let retrying = action.delay().is_some();
    let (key_for_store, message, reason) = (key.clone(), error.to_string(), error.reason());
    let recorded = blocking(&shared.ctx.store, move |store| {
        let Some(desired) = store.desired(&key_for_store)? else {
            // Gone from desired state: no status to record it on.
            return Ok(());
        };
        let previous = store.previous_status(&key_for_store)?;
        let phase = match &previous {
            _ if !retrying => Phase::Failed,
            Some(status) => status.phase,
            None => Phase::Pending,
        };
        let status = ResourceStatus {
            message,
            updated_at: now_unix(),
            ..previous.unwrap_or_else(|| ResourceStatus {
                spec_hash: desired.spec_hash.to_string(),
                ..ResourceStatus::new(phase, "")
            })
        };
        let status = ResourceStatus {
            phase,
            reason: Some(reason),
            ..status
        };
        store.put_status(&key_for_store, &status)
    })
    .await;
    if let Err(error) = recorded {
        tracing::warn!(%key, %error, "cannot record a reconcile error on the status");
    }
    action
}

async fn record_panic<R: Runtime>(shared: &Arc<Shared<R>>, key: &ResourceKey, message: &str) {
    let key = key.clone();
    let message = format!("handler panicked: {message}");
    let result = blocking(&shared.ctx.store, move |store| {
        let previous = store.previous_status(&key)?;
        let status = ResourceStatus {
            phase: Phase::Failed,
            reason: Some(FailureReason::Panic),
            message,
            updated_at: now_unix(),
            ..previous.unwrap_or_else(|| ResourceStatus::new(Phase::Failed, ""))
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
