//! Reconcile stage: tail the store's journal and converge each changed resource through the
//! runtime, one key at a time.
//!
//! Invariants:
//! - on boot every desired resource, every resource the store still holds state for, and
//!   every resource this agent still has containers for, is reconciled once (a synthetic
//!   PUT), then the journal is tailed from the head it had at boot (or the persisted cursor,
//!   if further); the store wakes the tail at once, nothing polls SQLite;
//! - the cursor only moves past a journal row once its key's reconcile has finished;
//! - one key is never reconciled by two workers at once (`queue`); different keys proceed in
//!   parallel, up to `ReconcileOptions::concurrency`; their container creates share one pool
//!   of slots (`ReconcileOptions::create_concurrency`), so the engine stays as busy as that
//!   while any key has a replica to create (a pass waits for a slot, never for time);
//! - every handler returns an `Action`; every error goes through one error policy
//!   (`retry::RetryPolicy::error_policy`), which maps it to an `Action` and records it on the
//!   resource's status; a panicking handler is recorded the same way and the loop goes on;
//! - every delayed pass (a retry, a rollout re-check, a back-off) and every periodic or
//!   paused task of the stage waits in one timer (`timer`), one instant per key, the one
//!   its last pass asked for; each pass re-reads desired state;
//! - only a handler holding a key creates, starts, stops or removes that key's containers:
//!   probes, drift, the autoscaler, the cron scheduler, job waiters and the router report and
//!   requeue (the router owns only the proxy container, which belongs to no key);
//! - a store error in the boot replay or the journal tail is retried on the same schedule,
//!   never fatal.

mod action;
mod autoscale;
mod cron;
mod drift;
mod env;
mod error;
pub(crate) mod gate;
mod handlers;
pub mod image_scan;
mod images;
pub(crate) mod notify;
pub(crate) mod pins;
pub mod plan;
mod probes;
mod queue;
pub mod requests;
mod retry;
mod rollout_state;
pub mod router;
mod routes;
mod runs;
pub mod timer;
pub mod wake;

pub use action::Action;
pub use cron::{Clock, DEFAULT_CATCH_UP as DEFAULT_CRON_CATCH_UP};
pub use error::{Error, HelperError, Result};
pub use retry::RetryPolicy;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;
use crate::model::{Kind, ResourceKey};
use crate::runtime::{Runtime, labels};
use crate::store::{FailureReason, Phase, ResourceStatus, Store, now_unix};
use queue::KeyedQueue;
use runs::Runs;

/// The journal consumer name under which the cursor is persisted.
pub const CURSOR: &str = "reconciler";

/// Which engine runs the workloads (`--runtime`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Engine {
    /// Containers on the local engine (the default).
    #[default]
    Containers,
    /// Docker Swarm services on a manager's engine (`handlers/swarm`).
    Swarm,
}

/// Tunables of the reconcile loop.
#[derive(Debug, Clone)]
pub struct ReconcileOptions {
    /// Which engine runs the workloads.
    pub engine: Engine,
    /// Resources reconciled in parallel (each key still one at a time).
    pub concurrency: usize,
    pub retry: RetryPolicy,
    /// Replicas and statefulset pods created and started at once, all resources together
    /// (first deploy, scale-up, re-creations; voodu creates a resource's missing replicas
    /// with no pause; one-shot units, which a pass starts and never waits for, take none):
    /// each create waits for one of these slots, so the engine is kept as busy as this
    /// while passes of many keys have replicas to create, and a pass that is finishing its
    /// last create no longer leaves slots idle. A rollout's replacements stay one slot of
    /// the rollout at a time regardless.
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
    /// Ulimits every container gets under its manifest's own; `None`: voodu's platform
    /// defaults clamped to what this host can grant (`host_default_ulimits`, read when the
    /// reconciler starts, never in `Default`).
    pub default_ulimits: Option<Vec<(String, i64, i64)>>,
    /// How old the most recent cronjob tick missed while the agent was not running may be
    /// and still run once (`--cron-catch-up`); older ones are reported as missed.
    pub cron_catch_up: Duration,
    /// Where cron's "now" comes from (the wall clock; tests pass a virtual one).
    pub clock: Clock,
    /// The age identities SOPS env files are decrypted with when a container is created.
    pub keyring: Arc<crate::assets::sops::Keyring>,
    /// The ingress proxy; `None` turns ingresses off (their status says so). The agent
    /// runs the router only when set.
    pub ingress: Option<router::IngressOptions>,
    /// Where image automation's registry scans may connect (`--allow-url-host`, as `url()`;
    /// never link-local, never the agent's own HTTP address).
    pub registry_access: crate::assets::registry::RegistryAccess,
    /// Which source owns which scope (`--sources`): a container joins its source's network,
    /// reads only its source's config buckets, and the ingress routes a host only for the
    /// source that holds it.
    pub ownership: Arc<crate::model::scopes::Ownership>,
    /// Where `on_deploy` webhooks may connect (`--allow-url-host`, as `url()`; never the
    /// agent's own HTTP address).
    pub webhooks: crate::assets::url_guard::Outbound,
    /// The repositories whose images run only with a trusted cosign signature, and the keys
    /// (`--require-signature`).
    pub signatures: Arc<crate::assets::cosign::Signatures>,
}

impl Default for ReconcileOptions {
    fn default() -> Self {
        ReconcileOptions {
            engine: Engine::Containers,
            concurrency: 8,
            retry: RetryPolicy::default(),
            create_concurrency: 16,
            ready_settle: Duration::from_secs(3),
            rollout_deadline: Duration::from_secs(300),
            resync: Duration::from_secs(300),
            container_events: true,
            autoscale_interval: Duration::from_secs(15),
            default_ulimits: None,
            cron_catch_up: cron::DEFAULT_CATCH_UP,
            clock: Clock::System,
            keyring: Arc::default(),
            ingress: None,
            registry_access: crate::assets::registry::RegistryAccess::default(),
            ownership: Arc::new(crate::model::scopes::Ownership::single()),
            webhooks: crate::assets::url_guard::Outbound::default(),
            signatures: Arc::default(),
        }
    }
}

/// voodu's platform ulimits (`nofile=65536:65536`, `nproc=4096:4096`), each clamped to this
/// process's own hard limit: an engine started in the same environment cannot grant more, and
/// asking for more makes every container fail to start.
pub(crate) fn host_default_ulimits() -> Vec<(String, i64, i64)> {
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

/// What the reconciler is built from, apart from its options: the parts the agent shares
/// with other stages, and the handles others keep to wake it or to watch the router.
pub struct Deps<R: Runtime> {
    pub store: Arc<Store>,
    pub runtime: Arc<R>,
    /// Where reconciles are counted and timed.
    pub metrics: Arc<Metrics>,
    /// `<data-dir>/assets`: where `${asset.…}` references point on the host.
    pub assets_root: std::path::PathBuf,
    /// Every task of the reconciler (workers, probes, drift, autoscaler, cron, router, job
    /// waiters, webhook deliveries) runs on this tracker; the caller closes and waits for it
    /// after `run` returns.
    pub tracker: TaskTracker,
    pub handles: Handles,
}

/// Ways into a running reconciler from outside it (cheap to clone; `Default` makes fresh
/// ones).
#[derive(Debug, Clone, Default)]
pub struct Handles {
    /// The one timer: asks for keys to be reconciled from outside the journal (cron ticks,
    /// events), now or later, and wakes the stage's periodic tasks.
    pub timer: timer::Timer,
    /// Wakes the ingress router and carries its reports.
    pub router: wake::RouterWake,
    /// Where `image_update` commit-mode bumps go (the agent's git writer); none: report only.
    pub image_committer: ImageCommitterHandle,
    /// Repositories a registry notification named: scanned at once.
    pub registry_pushes: wake::RegistryPushes,
}

/// The optional `image_scan::ImageCommitter` (a handle so `Handles` stays `Debug + Default`).
#[derive(Clone, Default)]
pub struct ImageCommitterHandle(pub Option<Arc<dyn image_scan::ImageCommitter>>);

impl std::fmt::Debug for ImageCommitterHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "ImageCommitter"
        } else {
            "None"
        })
    }
}

/// What every handler needs; built once by `run` (`Ctx::new`), its fields private to the
/// reconcile stage.
pub(crate) struct Ctx<R: Runtime> {
    store: Arc<Store>,
    runtime: Arc<R>,
    /// The `voodu.agent` label value of this agent's containers.
    agent_id: String,
    /// `<data-dir>/assets`: where `${asset.…}` references point on the host.
    assets_root: std::path::PathBuf,
    options: ReconcileOptions,
    /// `options.default_ulimits`, resolved against this host.
    default_ulimits: Vec<(String, i64, i64)>,
    metrics: Arc<Metrics>,
    /// Where release outcomes go for their `on_deploy` webhooks.
    notifier: notify::Notifier,
    timer: timer::Timer,
    router: wake::RouterWake,
    /// Fires when the agent stops: the waiters of one-shot runs give up on it (their units
    /// go on, for the next start to pick up).
    shutdown: CancellationToken,
    /// Waiters of running one-shot units (inits, hooks, job runs), and the cronjobs' next
    /// fire times.
    runs: Runs,
    /// What handlers remember between passes (rollout clocks, crash-loop back-offs); lost on
    /// restart by design, rebuilt from the store and the host.
    memory: Memory,
    /// `options.create_concurrency` slots, one per container being created and started.
    creates: tokio::sync::Semaphore,
}

impl<R: Runtime> Ctx<R> {
    /// The context of one reconciler run; spawns the webhook deliveries on `deps.tracker`.
    fn new(
        deps: Deps<R>,
        agent_id: String,
        options: ReconcileOptions,
        shutdown: CancellationToken,
    ) -> Ctx<R> {
        let (notifier, deliveries) = notify::Notifier::new(
            notify::Sealed {
                outbound: options.webhooks.clone(),
                assets_root: deps.assets_root.clone(),
                ownership: options.ownership.clone(),
            },
            deps.handles.timer.clone(),
            shutdown.clone(),
        );
        deps.tracker.spawn(deliveries);
        let default_ulimits = options
            .default_ulimits
            .clone()
            .unwrap_or_else(host_default_ulimits);
        Ctx {
            store: deps.store,
            runtime: deps.runtime,
            agent_id,
            assets_root: deps.assets_root,
            default_ulimits,
            metrics: deps.metrics,
            notifier,
            timer: deps.handles.timer,
            router: deps.handles.router,
            shutdown,
            runs: Runs::new(deps.tracker),
            memory: Memory::default(),
            creates: tokio::sync::Semaphore::new(
                options
                    .create_concurrency
                    .clamp(1, tokio::sync::Semaphore::MAX_PERMITS),
            ),
            options,
        }
    }
}

/// In-memory handler state (see `Ctx::memory`).
#[derive(Debug, Default)]
pub(crate) struct Memory {
    pub(crate) rollouts: gate::RolloutClock,
    /// Starts of crashed replicas by the agent, by container id.
    pub(crate) crash_loops: gate::CrashLoops,
    /// Liveness replacements, by resource: they back off the same way.
    pub(crate) liveness: gate::CrashLoops,
    /// Containers the agent removed after a refused start: their events are not drift.
    pub(crate) own_removals: wake::OwnRemovals,
    /// Replicas whose liveness failed, to be replaced by their handler.
    pub(crate) liveness_failed: wake::LivenessFailures,
    /// Resources queued because the host drifted, until a pass of theirs converges.
    pub(crate) drifted: wake::Drifted,
    /// Under which release each resource's superseded hook units were last removed.
    pub(crate) superseded: wake::Superseded,
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
        Err(join_error) => Err(Error::Task(join_error)),
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
    // Each drift resync's list of every container is the probe manager's too. Swarm runs the
    // health checks of its tasks itself (probes become health checks): no probe manager.
    let (listed, listed_by_probes) = tokio::sync::watch::channel(probes::Listed::default());
    if ctx.options.engine == Engine::Containers {
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

/// This agent's container events, for the drift watcher and the probe manager alike; a stream
/// that never yields when they are off (`--no-container-events`): both then follow the
/// resync's lists only.
pub(crate) fn owned_container_events<R: Runtime>(ctx: &Ctx<R>) -> crate::runtime::Events {
    if ctx.options.container_events {
        ctx.runtime
            .events(&[(labels::AGENT, ctx.agent_id.as_str())])
    } else {
        Box::pin(futures_util::stream::pending())
    }
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
            serde_json::json!({ "source": source }),
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
