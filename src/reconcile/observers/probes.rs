//! Probes and readiness (spec §2.10.7, §7.7): one runner per managed replica (deployment and
//! statefulset containers of this agent), kept in step with the containers on the host.
//!
//! A runner runs the replica's `startup`, `readiness` and `liveness` probes (`http_get` from
//! the agent to the replica's address, `tcp_socket`, `exec` through the runtime), with voodu's
//! defaults and thresholds. A replica is ready when it runs, its startup probe (if any) has
//! passed, and its readiness probe (if any) is healthy; without a readiness probe, when it has
//! run for the settle time without restarting. Every change of readiness is written to the
//! store (`readiness`) and wakes the ingress router; a flip of it requeues the owning resource
//! (so a health-gated rollout waiting for it goes on): a new replica's first "not ready" is
//! what a pass assumes of a replica without a row, so it queues none. A liveness failure
//! marks the replica (`wake::LivenessFailures`, due after the liveness back-off) and requeues
//! its resource; the handler, holding the key, waits for the mark to fall due and replaces
//! the replica through the gated plan.
//!
//! The set of runners follows container events (unless they are off): a replica's `start`
//! starts its runner from what the event says (no list), `destroy` ends it. A list of every
//! container of this agent catches what events missed: its own at start and after the event
//! stream was interrupted, else the one each drift resync makes (`Listed`); nothing here
//! wakes on a timer.
//!
//! Invariants: one runner per container id; runners stop when their container goes or the
//! agent stops; probe results are level signals recomputed each period, never stored history;
//! nothing here creates, removes, starts or stops a container (only the handlers do).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::manifest::spec::{DEFAULT_NETWORK, Probe, Probes};
use crate::model::{Kind, ResourceKey, parse_go_duration};
use crate::reconcile::run::timer::What;
use crate::reconcile::{context::Ctx, context::blocking};
use crate::runtime::{Container, ContainerState, Runtime, labels};
use crate::store::{Readiness, now_unix};

/// voodu's probe defaults (spec §2.10.7).
/// The pause before subscribing again to a container event stream that broke or ended.
const RESUBSCRIBE: Duration = Duration::from_secs(1);
const DEFAULT_PERIOD: Duration = Duration::from_secs(10);
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
const DEFAULT_FAILURE_THRESHOLD: u32 = 3;
const DEFAULT_SUCCESS_THRESHOLD: u32 = 1;

/// What the manager tells a runner about its container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    /// Running; `starts` counts the (re)starts seen, so a restart is a change.
    Running {
        starts: u64,
    },
    Stopped,
}

struct RunnerHandle {
    cancel: CancellationToken,
    life: watch::Sender<Life>,
    starts: u64,
}

/// The probe runners, one per managed replica (by container id), with what starting one
/// takes.
struct Runners<'a, R: Runtime> {
    ctx: &'a Arc<Ctx<R>>,
    tracker: &'a TaskTracker,
    shutdown: &'a CancellationToken,
    /// The HTTP client every runner's `http_get` shares.
    client: &'a reqwest::Client,
    handles: HashMap<String, RunnerHandle>,
}

/// Every container of this agent, as the last drift resync listed them (shared with the probe
/// manager, so a resync costs one list).
pub(crate) type Listed = Arc<Vec<Container>>;

/// Runs until `shutdown`: keeps one probe runner per managed replica.
pub(crate) async fn run<R: Runtime>(
    ctx: Arc<Ctx<R>>,
    tracker: TaskTracker,
    mut listed: watch::Receiver<Listed>,
    shutdown: CancellationToken,
) {
    // Without container events the resync's lists alone keep the runners in step, as they
    // keep drift repair: a stopped replica is then seen at the next resync here too, not at
    // once through its readiness.
    let mut events = crate::reconcile::context::owned_container_events(&ctx);
    // One HTTP client (one connection pool, one TLS config) for every runner's `http_get`.
    let client = http_client();
    let mut runners = Runners {
        ctx: &ctx,
        tracker: &tracker,
        shutdown: &shutdown,
        client: &client,
        handles: HashMap::new(),
    };
    // Events keep the runners in step (a start starts one, a destroy ends it); a list of every
    // container catches what they missed: one of its own at start and after the event stream
    // was interrupted, else the list each drift resync makes (`listed`), never more often.
    let mut list_now = true;
    let mut drift_runs = true;
    loop {
        if std::mem::take(&mut list_now) {
            match crate::reconcile::context::owned_containers(&ctx).await {
                Ok(containers) => runners.sync(&containers).await,
                Err(error) => {
                    tracing::debug!(%error, "probe runners not synced; the next resync tries again");
                }
            }
        }
        let resynced = async {
            if drift_runs {
                listed.changed().await.is_ok()
            } else {
                std::future::pending().await
            }
        };
        tokio::select! {
            fresh = resynced => {
                if fresh {
                    let containers = listed.borrow_and_update().clone();
                    runners.sync(&containers).await;
                } else {
                    // The drift task has ended (the agent stops).
                    drift_runs = false;
                }
            }
            event = events.next() => match event {
                Some(Ok(event)) => {
                    list_now |= runners.follow_event(&event);
                }
                Some(Err(error)) => {
                    tracing::debug!(%error, "container events interrupted; resubscribing");
                    ctx.timer.sleep(What::Probe, RESUBSCRIBE).await;
                    events = crate::reconcile::context::owned_container_events(&ctx);
                    list_now = true;
                }
                None => {
                    ctx.timer.sleep(What::Probe, RESUBSCRIBE).await;
                    events = crate::reconcile::context::owned_container_events(&ctx);
                    list_now = true;
                }
            },
            () = shutdown.cancelled() => break,
        }
    }
    for runner in runners.handles.into_values() {
        runner.cancel.cancel();
    }
}

impl<R: Runtime> Runners<'_, R> {
    /// Keeps the runners in step with one container event: a start (re)starts a life or a
    /// new replica's runner, a stop ends the life, a destroy the runner. True when the event
    /// names no container and a list must tell what started.
    fn follow_event(&mut self, event: &crate::runtime::Event) -> bool {
        if let Some(runner) = self.handles.get_mut(&event.id) {
            match event.action.as_str() {
                "start" => {
                    runner.starts += 1;
                    runner.life.send_replace(Life::Running {
                        starts: runner.starts,
                    });
                }
                "die" | "stop" | "kill" | "oom" => {
                    runner.life.send_replace(Life::Stopped);
                }
                "destroy" => {
                    if let Some(runner) = self.handles.remove(&event.id) {
                        runner.cancel.cancel();
                    }
                }
                _ => {}
            }
        } else if event.action == "start" {
            // A new replica: its runner starts now, from what the event says; an
            // event without a name is looked up in a list at once instead.
            match started_replica(event) {
                Some((key, container)) => self.start(key, container),
                None if event.name.is_empty() => return true,
                None => {}
            }
        }
        false
    }

    /// Starts runners for new replicas, stops those of vanished containers, and drops the
    /// readiness rows of containers that are gone (also those removed while no runner
    /// watched).
    async fn sync(&mut self, containers: &[Container]) {
        let alive: BTreeSet<String> = containers
            .iter()
            .map(|container| container.id.clone())
            .collect();
        match blocking(&self.ctx.store, move |store| store.retain_readiness(&alive)).await {
            Ok(0) => {}
            Ok(_) => self.ctx.router.wake(),
            Err(error) => {
                tracing::debug!(%error, "stale readiness rows kept until the next resync")
            }
        }
        // By reference: a container is copied only when a runner starts for it.
        let replicas: Vec<&Container> = containers
            .iter()
            .filter(|container| is_replica(container))
            .collect();
        let live: std::collections::HashSet<&str> = replicas
            .iter()
            .map(|container| container.id.as_str())
            .collect();
        let gone: Vec<String> = self
            .handles
            .keys()
            .filter(|id| !live.contains(id.as_str()))
            .cloned()
            .collect();
        for id in gone {
            if let Some(runner) = self.handles.remove(&id) {
                runner.cancel.cancel();
            }
        }
        self.ctx
            .memory
            .liveness_failed
            .retain(|id| live.contains(id));
        for container in replicas {
            let running = container.state == ContainerState::Running;
            if let Some(runner) = self.handles.get_mut(&container.id) {
                let now = if running {
                    Life::Running {
                        starts: runner.starts,
                    }
                } else {
                    Life::Stopped
                };
                if *runner.life.borrow() != now {
                    runner.life.send_replace(now);
                }
                continue;
            }
            if let Some(key) = replica_key(container) {
                self.start(key, container.clone());
            }
        }
    }

    /// Starts the probe runner of one replica (none runs for its id yet).
    fn start(&mut self, key: ResourceKey, container: Container) {
        let running = container.state == ContainerState::Running;
        // A replica is probed as its own spec declared (`voodu.probes`, set at creation); a
        // container without the label has no probes.
        let probes: Option<Box<Probes>> = container
            .label(labels::PROBES)
            .and_then(|json| serde_json::from_str::<Probes>(json).ok())
            .filter(|probes| *probes != NO_PROBES)
            .map(Box::new);
        let replica = Replica::of(container);
        let cancel = self.shutdown.child_token();
        let (life, watcher) = watch::channel(if running {
            Life::Running { starts: 0 }
        } else {
            Life::Stopped
        });
        self.handles.insert(
            replica.id.clone(),
            RunnerHandle {
                cancel: cancel.clone(),
                life,
                starts: 0,
            },
        );
        self.tracker.spawn(runner(
            Arc::clone(self.ctx),
            key,
            replica,
            probes,
            self.client.clone(),
            watcher,
            cancel,
        ));
    }
}

/// A replica without probes (most): its runner holds no copy of this.
static NO_PROBES: Probes = Probes {
    liveness: None,
    readiness: None,
    startup: None,
};

/// A replica's runner as it is spawned: its probes until its container goes (`cancel`) or
/// the agent stops, then its readiness row removed, unless the agent is only stopping. The
/// probes come boxed, and only when the replica has some: taken inline, they were 624 bytes
/// of every runner for as long as its replica lived.
async fn runner<R: Runtime>(
    ctx: Arc<Ctx<R>>,
    key: ResourceKey,
    replica: Replica,
    probes: Option<Box<Probes>>,
    client: reqwest::Client,
    life: watch::Receiver<Life>,
    cancel: CancellationToken,
) {
    let probes = probes.as_deref().unwrap_or(&NO_PROBES);
    tokio::select! {
        () = run_replica(&ctx, &key, &replica, probes, &client, life) => {}
        () = cancel.cancelled() => {}
    }
    if !ctx.shutdown.is_cancelled() {
        let (name, id) = (replica.name.clone(), replica.id.clone());
        let _ = blocking(&ctx.store, move |store| {
            store.forget_readiness_of(&name, &id)
        })
        .await;
        ctx.router.wake();
    }
}

/// What a runner keeps of its container for as long as the replica lives: its id and name
/// (exec, inspection, readiness rows) and its scope label (the network `observe` reads its
/// address on). The other labels (a dozen, the probes' JSON among them) are read once, at
/// the start: kept, they were ≈ 2 KiB per replica, and a map of the one label 0.5 KiB.
struct Replica {
    id: String,
    name: String,
    scope: String,
}

impl Replica {
    fn of(container: Container) -> Replica {
        let Container {
            id,
            name,
            labels: mut held,
            ..
        } = container;
        let scope = held.remove(labels::SCOPE).unwrap_or_default();
        Replica { id, name, scope }
    }
}

/// Whether `replica_key` names this container's resource (without building the key).
fn is_replica(container: &Container) -> bool {
    container
        .label(labels::KIND)
        .and_then(Kind::parse)
        .is_some_and(|kind| {
            matches!(kind, Kind::Deployment | Kind::Statefulset)
                && container.label(labels::ROLE) == Some(kind.as_str())
                && container.label(labels::SCOPE).is_some()
                && container.label(labels::NAME).is_some()
        })
}

/// The replica a container of this agent is (deployment and statefulset replicas only: init,
/// release and job containers are not probed).
fn replica_key(container: &Container) -> Option<ResourceKey> {
    let kind = container.label(labels::KIND).and_then(Kind::parse)?;
    if !matches!(kind, Kind::Deployment | Kind::Statefulset)
        || container.label(labels::ROLE) != Some(kind.as_str())
    {
        return None;
    }
    Some(ResourceKey::new(
        kind,
        container.label(labels::SCOPE)?,
        container.label(labels::NAME)?,
    ))
}

/// The replica a `start` event is about, as the event describes it (its labels and name),
/// so a new replica's runner starts without a list of every container.
fn started_replica(event: &crate::runtime::Event) -> Option<(ResourceKey, Container)> {
    if event.name.is_empty() {
        return None;
    }
    let container = Container {
        id: event.id.clone(),
        name: event.name.clone(),
        image: event.labels.get("image").cloned().unwrap_or_default(),
        labels: event.labels.clone(),
        state: ContainerState::Running,
    };
    Some((replica_key(&container)?, container))
}

/// The state of one probe: consecutive results and whether it is healthy.
#[derive(Debug, Clone, Copy, Default)]
struct Verdict {
    successes: u32,
    failures: u32,
    healthy: Option<bool>,
}

impl Verdict {
    fn record(&mut self, passed: bool, probe: &Probe) -> Option<bool> {
        let (success_threshold, failure_threshold) = thresholds(probe);
        if passed {
            self.successes += 1;
            self.failures = 0;
            if self.successes >= success_threshold {
                self.healthy = Some(true);
            }
        } else {
            self.failures += 1;
            self.successes = 0;
            if self.failures >= failure_threshold {
                self.healthy = Some(false);
            }
        }
        self.healthy
    }
}

fn thresholds(probe: &Probe) -> (u32, u32) {
    let success = u32::try_from(probe.success_threshold)
        .ok()
        .filter(|n| *n > 0)
        .unwrap_or(DEFAULT_SUCCESS_THRESHOLD);
    let failure = u32::try_from(probe.failure_threshold)
        .ok()
        .filter(|n| *n > 0)
        .unwrap_or(DEFAULT_FAILURE_THRESHOLD);
    (success, failure)
}

fn duration(text: &str, default: Duration) -> Duration {
    parse_go_duration(text)
        .filter(|d| !d.is_zero())
        .unwrap_or(default)
}

/// Probes one replica until it goes (the caller cancels) and publishes its readiness.
async fn run_replica<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    container: &Replica,
    // By reference: 624 bytes inline, held (as argument and as local) by a future that
    // lives as long as the replica.
    probes: &Probes,
    client: &reqwest::Client,
    mut life: watch::Receiver<Life>,
) {
    // What an earlier runner (before an agent restart) published about this very container
    // instance: if it was ready and the container has not restarted since, it stays ready
    // until its probes say otherwise, so restarting the agent drops no route.
    let prior = {
        let key = key.clone();
        let (name, id) = (container.name.clone(), container.id.clone());
        blocking(&ctx.store, move |store| store.readiness(&key))
            .await
            .ok()
            .and_then(|rows| {
                rows.into_iter()
                    .find(|row| row.container == name && row.container_id == id)
            })
    };
    // This inspection also serves the first life's start (no second call for it).
    let mut seen = Some(observe(ctx, container).await);
    let running_for = seen
        .as_ref()
        .map_or(Duration::ZERO, |(_, running_for)| *running_for);
    let started_at = now_unix() - i64::try_from(running_for.as_secs()).unwrap_or(0);
    let mut prior_ready = prior
        .as_ref()
        .is_some_and(|row| row.ready && started_at <= row.updated_at);
    let mut published: Option<(bool, String, String)> =
        prior.map(|row| (row.ready, row.reason, row.address));
    loop {
        let current = *life.borrow_and_update();
        let Life::Running { .. } = current else {
            prior_ready = false;
            seen = None;
            publish(
                ctx,
                key,
                container,
                false,
                "not running",
                "",
                &mut published,
            )
            .await;
            if life.changed().await.is_err() {
                return;
            }
            continue;
        };
        let (address, running_for) = match seen.take() {
            Some(seen) => seen,
            None => observe(ctx, container).await,
        };
        if !prior_ready {
            publish(
                ctx,
                key,
                container,
                false,
                "starting",
                &address,
                &mut published,
            )
            .await;
        }
        let life_start = tokio::time::Instant::now()
            .checked_sub(running_for)
            .unwrap_or_else(tokio::time::Instant::now);
        let target = Target {
            container,
            address: &address,
            client,
        };
        // One life of the container: probes until it stops or restarts.
        let outcome = tokio::select! {
            outcome = probe_life(ctx, key, probes, target, (life_start, prior_ready), &mut published) => outcome,
            changed = life.changed() => {
                if changed.is_err() {
                    return;
                }
                prior_ready = false;
                continue;
            }
        };
        match outcome {
            LifeOutcome::Replace(reason) => {
                mark_for_replacement(ctx, key, target, &reason, &mut published).await;
                // Nothing more to probe: the replica goes once its handler replaces it.
                let _ = life.changed().await;
                return;
            }
        }
    }
}

enum LifeOutcome {
    /// Liveness failed: the replica must be replaced.
    Replace(String),
}

/// What a replica's probes reach: its container (exec), at its address (HTTP, TCP), with the
/// runners' HTTP client.
#[derive(Clone, Copy)]
struct Target<'a> {
    container: &'a Replica,
    address: &'a str,
    client: &'a reqwest::Client,
}

/// Runs the probes of one container life (which began at `life_start`); returns only when
/// liveness fails (otherwise it runs until the caller's select picks a life change or
/// cancellation). `prior_ready`: an earlier runner saw this life ready; it stays so until a
/// probe says otherwise.
async fn probe_life<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    probes: &Probes,
    target: Target<'_>,
    (life_start, prior_ready): (tokio::time::Instant, bool),
    published: &mut Option<(bool, String, String)>,
) -> LifeOutcome {
    // Startup first: until it passes, the replica is not ready and readiness is not probed
    // (liveness runs alongside, as voodu does: liveness is not gated by startup).
    let initial = if prior_ready {
        (true, String::new())
    } else {
        (false, "starting".to_owned())
    };
    let (readiness_tx, mut readiness_rx) = watch::channel::<(bool, String)>(initial);
    let liveness = liveness_until_failed(ctx, probes, target);
    let readiness = readiness_of_life(
        ctx,
        probes,
        target,
        (life_start, prior_ready),
        &readiness_tx,
    );
    let publisher = async {
        loop {
            let (ready, reason) = readiness_rx.borrow_and_update().clone();
            publish(
                ctx,
                key,
                target.container,
                ready,
                &reason,
                target.address,
                published,
            )
            .await;
            if readiness_rx.changed().await.is_err() {
                return std::future::pending::<LifeOutcome>().await;
            }
        }
    };
    tokio::select! {
        outcome = liveness => outcome,
        () = readiness => std::future::pending::<LifeOutcome>().await,
        outcome = publisher => outcome,
    }
}

/// Probes liveness (after its initial delay, every period) until it fails its threshold:
/// the replica must be replaced. Without a liveness probe it never returns.
async fn liveness_until_failed<R: Runtime>(
    ctx: &Ctx<R>,
    probes: &Probes,
    target: Target<'_>,
) -> LifeOutcome {
    let Some(probe) = &probes.liveness else {
        return std::future::pending::<LifeOutcome>().await;
    };
    initial_delay(ctx, probe).await;
    let mut verdict = Verdict::default();
    loop {
        let (passed, detail) = probe_once(ctx, target, probe).await;
        if verdict.record(passed, probe) == Some(false) {
            return LifeOutcome::Replace(format!(
                "liveness probe failed {} times: {detail}",
                verdict.failures
            ));
        }
        period(ctx, probe).await;
    }
}

/// Waits out a probe's `initial_delay` (none when unset or unreadable).
async fn initial_delay<R: Runtime>(ctx: &Ctx<R>, probe: &Probe) {
    ctx.timer
        .sleep(
            What::Probe,
            parse_go_duration(&probe.initial_delay).unwrap_or_default(),
        )
        .await;
}

/// Waits one probe `period` (10s when unset, zero or unreadable).
async fn period<R: Runtime>(ctx: &Ctx<R>, probe: &Probe) {
    ctx.timer
        .sleep(What::Probe, duration(&probe.period, DEFAULT_PERIOD))
        .await;
}

/// Sends the life's readiness on `readiness_tx` as its probes find it: startup first (unless
/// an earlier runner saw this life ready), then the readiness probe every period, or without
/// one, ready once the life has run for the settle time. Never returns.
async fn readiness_of_life<R: Runtime>(
    ctx: &Ctx<R>,
    probes: &Probes,
    target: Target<'_>,
    (life_start, prior_ready): (tokio::time::Instant, bool),
    readiness_tx: &watch::Sender<(bool, String)>,
) {
    if let Some(probe) = probes.startup.as_ref().filter(|_| !prior_ready) {
        initial_delay(ctx, probe).await;
        let mut verdict = Verdict::default();
        loop {
            let (passed, detail) = probe_once(ctx, target, probe).await;
            if verdict.record(passed, probe) == Some(true) {
                break;
            }
            let _ = readiness_tx.send((false, format!("startup probe not passed yet: {detail}")));
            period(ctx, probe).await;
        }
    }
    match &probes.readiness {
        Some(probe) => {
            if !prior_ready {
                initial_delay(ctx, probe).await;
            }
            let mut verdict = Verdict {
                healthy: prior_ready.then_some(true),
                ..Verdict::default()
            };
            loop {
                let (passed, detail) = probe_once(ctx, target, probe).await;
                let ready = verdict.record(passed, probe) == Some(true);
                let reason = if ready {
                    String::new()
                } else {
                    format!("readiness probe: {detail}")
                };
                let _ = readiness_tx.send((ready, reason));
                period(ctx, probe).await;
            }
        }
        None => {
            // No readiness probe: ready once it has run for the settle time (a restart
            // starts a new life, and a new settle).
            let settle = ctx.options.ready_settle;
            let waited = life_start.elapsed();
            if waited < settle {
                let _ = readiness_tx.send((
                    false,
                    format!("running for less than {}s", settle.as_secs()),
                ));
                ctx.timer.sleep(What::Probe, settle - waited).await;
            }
            let _ = readiness_tx.send((true, String::new()));
            std::future::pending::<()>().await;
        }
    }
}

/// A replica whose liveness failed: marked for replacement when its resource's liveness
/// back-off lets it be replaced, its readiness says so, and its resource is requeued.
async fn mark_for_replacement<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    target: Target<'_>,
    reason: &str,
    published: &mut Option<(bool, String, String)>,
) {
    let Target {
        container, address, ..
    } = target;
    // Replacements of one resource's replicas back off (at once, then 10s, 20s,
    // … 5m), so a version that turns unhealthy does not churn every period. The
    // runner only marks the replica, due at that instant, and asks for a pass; the
    // handler holding the key looks again when the mark falls due and replaces it
    // then (one writer per key).
    let label = key.to_string();
    let now = tokio::time::Instant::now();
    let due = match ctx.memory.liveness.try_start(&label, now) {
        Ok(_) => now,
        Err(wait) => {
            // Counted as a replacement at the instant it becomes due.
            let at = now + wait;
            let _ = ctx.memory.liveness.try_start(&label, at);
            at
        }
    };
    let held = if due > now {
        format!(
            "{reason}; replaced in {} (liveness back-off)",
            crate::reconcile::plan::gate::human(due - now)
        )
    } else {
        format!("{reason}; to be replaced")
    };
    tracing::warn!(%key, container = %container.name, %reason, "liveness failed; asking for the replica's replacement");
    publish(ctx, key, container, false, &held, address, published).await;
    ctx.memory.liveness_failed.mark(&container.id, due);
    // The pass asks for the wait until `due` itself (`LivenessFailures::wait`).
    ctx.timer.requeue(key.clone());
}

/// Writes a replica's readiness when it changed, then wakes the router, and requeues its
/// resource when the replica became ready or stopped being so. Boxed, as `probe_once`: the
/// row and the store call are held only while they run.
fn publish<'a, R: Runtime>(
    ctx: &'a Ctx<R>,
    key: &'a ResourceKey,
    container: &'a Replica,
    ready: bool,
    reason: &'a str,
    address: &'a str,
    published: &'a mut Option<(bool, String, String)>,
) -> BoxFuture<'a, ()> {
    Box::pin(async move {
        let now = (ready, reason.to_owned(), address.to_owned());
        if published.as_ref() == Some(&now) {
            return;
        }
        let row = Readiness {
            container: container.name.clone(),
            container_id: container.id.clone(),
            key: key.clone(),
            ready,
            reason: reason.to_owned(),
            address: address.to_owned(),
            updated_at: now_unix(),
        };
        if blocking(&ctx.store, move |store| store.put_readiness(&row))
            .await
            .is_ok()
        {
            // A replica nobody published for counts as not ready (`gate::waiting`): a first
            // "not ready" changes nothing a pass decides, so it queues none.
            let flipped = published.as_ref().is_some_and(|(was, _, _)| *was) != ready;
            *published = Some(now);
            ctx.router.wake();
            if flipped {
                ctx.timer.requeue(key.clone());
            }
        }
    })
}

/// The replica's address for `http_get` and `tcp_socket` (its IP on its source's network,
/// else on the shared one, else on its first network; loopback in host networking), and how long its current life has
/// lasted (zero when the engine does not say).
async fn observe<R: Runtime>(ctx: &Ctx<R>, container: &Replica) -> (String, Duration) {
    // Boxed, as `probe_once`: the engine call's state is on the heap only while it runs.
    match Box::pin(ctx.runtime.inspect(&container.id)).await {
        Ok(inspection) => {
            // Its source's network first (where the ingress proxy reaches it), then the
            // shared one (a replica made before sources had their own networks).
            let own = ctx.options.ownership.network_of(&container.scope);
            let address = inspection
                .ip_addresses
                .get(&own)
                .or_else(|| inspection.ip_addresses.get(DEFAULT_NETWORK))
                .or_else(|| inspection.ip_addresses.values().next())
                .cloned()
                .unwrap_or_else(|| "127.0.0.1".to_owned());
            let running_for = chrono::DateTime::parse_from_rfc3339(&inspection.started_at)
                .ok()
                .and_then(|started| {
                    (chrono::Utc::now() - started.with_timezone(&chrono::Utc))
                        .to_std()
                        .ok()
                })
                .unwrap_or_default();
            (address, running_for)
        }
        Err(_) => (String::new(), Duration::ZERO),
    }
}

/// The client of HTTP probes (and canary analyses): straight to a replica's address, no
/// redirects, any certificate.
pub(crate) fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap_or_else(|_| reqwest::Client::new())
}

/// One probe attempt: whether it passed, and what it saw. Boxed: a runner lives as long as
/// its replica, and a future is as large as its largest await, so the request's or the
/// exec's state inline made every runner 8.6 KiB (3.8 MiB with 500 replicas, heaptrack);
/// on the heap it is held only while the attempt runs.
fn probe_once<'a, R: Runtime>(
    ctx: &'a Ctx<R>,
    target: Target<'a>,
    probe: &'a Probe,
) -> BoxFuture<'a, (bool, String)> {
    let Target {
        container,
        address,
        client,
    } = target;
    Box::pin(async move {
        let timeout = duration(&probe.timeout, DEFAULT_TIMEOUT);
        if let Some(http) = &probe.http_get {
            let scheme = if http.scheme.is_empty() {
                "http"
            } else {
                http.scheme.as_str()
            };
            let url = format!("{scheme}://{address}:{}{}", http.port, http.path);
            let mut request = client.get(&url).timeout(timeout);
            for (name, value) in &http.http_headers {
                request = request.header(name.as_str(), value.as_str());
            }
            return match request.send().await {
                Ok(response) if (200..400).contains(&response.status().as_u16()) => {
                    (true, format!("HTTP {}", response.status().as_u16()))
                }
                Ok(response) => (
                    false,
                    format!(
                        "GET {} answered HTTP {}",
                        http.path,
                        response.status().as_u16()
                    ),
                ),
                Err(error) => (
                    false,
                    format!(
                        "GET {} failed: {}",
                        http.path,
                        if error.is_timeout() {
                            "timed out".to_owned()
                        } else {
                            "no answer".to_owned()
                        }
                    ),
                ),
            };
        }
        if let Some(tcp) = &probe.tcp_socket {
            let target = format!("{address}:{}", tcp.port);
            return match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(&target))
                .await
            {
                Ok(Ok(_)) => (true, format!("connected to port {}", tcp.port)),
                Ok(Err(_)) => (false, format!("port {} refused", tcp.port)),
                Err(_) => (
                    false,
                    format!(
                        "port {}: no answer within {}s",
                        tcp.port,
                        timeout.as_secs_f64()
                    ),
                ),
            };
        }
        if let Some(exec) = &probe.exec {
            return match tokio::time::timeout(
                timeout.max(Duration::from_secs(1)),
                ctx.runtime.exec(&container.id, &exec.command),
            )
            .await
            {
                Ok(Ok(outcome)) if outcome.exit_code == 0 => (true, "exit 0".to_owned()),
                Ok(Ok(outcome)) => (
                    false,
                    format!("`{}` exited {}", exec.command.join(" "), outcome.exit_code),
                ),
                Ok(Err(error)) => (false, format!("exec failed: {error}")),
                Err(_) => (false, "exec timed out".to_owned()),
            };
        }
        (true, String::new())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::DockerRuntime;

    /// The size of what the closure returns, without calling it.
    fn size_of_return<F>(_: &dyn Fn() -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// A runner lives as long as its replica, one per replica, and a future is as large as
    /// its largest await: the engine's and the HTTP client's calls are boxed, so a runner's
    /// own state stays small: 1,520 bytes here (debug build), 2,912 with the spec and a
    /// readiness write inline, and 8.6 KiB a replica in the release build before any of it
    /// was boxed (heaptrack over 500 replicas). The whole task is 1,960 bytes (2,016 when it
    /// held a `Container`); the probes taken inline would add their 624 bytes.
    #[test]
    #[allow(unreachable_code, unused_variables, clippy::diverging_sub_expression)]
    fn a_probe_runner_stays_small_between_probes() {
        let probes = size_of_return(&|| {
            let ctx: &Ctx<DockerRuntime> = unreachable!();
            let (key, container, client) = unreachable!();
            let life: watch::Receiver<Life> = unreachable!();
            run_replica(ctx, key, container, &NO_PROBES, client, life)
        });
        assert!(probes <= 2048, "a runner's probing is {probes} bytes");
        // The whole task, with what it owns and its end.
        let task = size_of_return(&|| {
            let ctx: Arc<Ctx<DockerRuntime>> = unreachable!();
            let (key, container, client, life, cancel) = unreachable!();
            runner(ctx, key, container, None, client, life, cancel)
        });
        assert!(task <= 2200, "a runner's task is {task} bytes");
    }
}
