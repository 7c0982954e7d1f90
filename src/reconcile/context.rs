//! The reconciler's shared context: its options (`ReconcileOptions`), what it is built from
//! (`Deps`, `Handles`), and `Ctx`, what every handler and observer of one reconciler run
//! reads: the store, the runtime, the agent id, the timer, the memory handlers keep between
//! passes, the create slots. Also the few helpers every room of the stage uses: `blocking`
//! (a store call off the async threads), `lock`, and this agent's containers and events.
//!
//! Invariant: `Ctx`'s fields are private to the reconcile stage (`pub(super)`); the rest of
//! the crate builds a reconciler from `Deps` and `ReconcileOptions` only.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;
use crate::model::{Kind, ResourceKey};
use crate::reconcile::handlers::on_deploy;
use crate::reconcile::handlers::runs::Runs;
use crate::reconcile::observers::cron::clock::{Clock, DEFAULT_CATCH_UP};
use crate::reconcile::observers::image_scan::committer::ImageCommitter;
use crate::reconcile::plan::gate;
use crate::reconcile::router::proxy::IngressOptions;
use crate::reconcile::run::{timer, wake};
use crate::reconcile::{error::Error, error::Result, run::retry::RetryPolicy};
use crate::runtime::{Runtime, labels};
use crate::store::Store;

/// Which engine runs the workloads (`--runtime`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Engine {
    /// Containers on the local Docker engine (`--runtime docker`, the default).
    #[default]
    Docker,
    /// Docker Swarm services on a manager's engine (`--runtime swarm`, `handlers/swarm`).
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
    pub ingress: Option<IngressOptions>,
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
    /// The restic executable backups run (`--restic`; found on `PATH` by default).
    pub restic: std::path::PathBuf,
    /// The host policy and the agent's own paths: every host path a backup hands restic is
    /// judged with them when it is used (the agent sets them; none: not judged).
    pub host_paths: Option<(
        crate::model::policy::Policy,
        crate::model::policy::OwnedPaths,
    )>,
}

impl Default for ReconcileOptions {
    fn default() -> Self {
        ReconcileOptions {
            engine: Engine::Docker,
            concurrency: 8,
            retry: RetryPolicy::default(),
            create_concurrency: 16,
            ready_settle: Duration::from_secs(3),
            rollout_deadline: Duration::from_secs(300),
            resync: Duration::from_secs(300),
            container_events: true,
            autoscale_interval: Duration::from_secs(15),
            default_ulimits: None,
            cron_catch_up: DEFAULT_CATCH_UP,
            clock: Clock::System,
            keyring: Arc::default(),
            ingress: None,
            registry_access: crate::assets::registry::RegistryAccess::default(),
            ownership: Arc::new(crate::model::scopes::Ownership::single()),
            webhooks: crate::assets::url_guard::Outbound::default(),
            signatures: Arc::default(),
            restic: std::path::PathBuf::from("restic"),
            host_paths: None,
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

/// The optional `image_scan::committer::ImageCommitter` (a handle so `Handles` stays `Debug + Default`).
#[derive(Clone, Default)]
pub struct ImageCommitterHandle(pub Option<Arc<dyn ImageCommitter>>);

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
    pub(super) store: Arc<Store>,
    pub(super) runtime: Arc<R>,
    /// The `voodu.agent` label value of this agent's containers.
    pub(super) agent_id: String,
    /// `<data-dir>/assets`: where `${asset.…}` references point on the host.
    pub(super) assets_root: std::path::PathBuf,
    pub(super) options: ReconcileOptions,
    /// `options.default_ulimits`, resolved against this host.
    pub(super) default_ulimits: Vec<(String, i64, i64)>,
    pub(super) metrics: Arc<Metrics>,
    /// Where release outcomes go for their `on_deploy` webhooks.
    pub(super) notifier: on_deploy::Notifier,
    pub(super) timer: timer::Timer,
    pub(super) router: wake::RouterWake,
    /// Fires when the agent stops: the waiters of one-shot runs give up on it (their units
    /// go on, for the next start to pick up).
    pub(super) shutdown: CancellationToken,
    /// Waiters of running one-shot units (inits, hooks, job runs), and the cronjobs' next
    /// fire times.
    pub(super) runs: Runs,
    /// What handlers remember between passes (rollout clocks, crash-loop back-offs); lost on
    /// restart by design, rebuilt from the store and the host.
    pub(super) memory: Memory,
    /// `options.create_concurrency` slots, one per container being created and started.
    pub(super) creates: tokio::sync::Semaphore,
    /// The restic executable the data runs use, with its cache under the data dir.
    restic: crate::restic::Restic,
}

impl<R: Runtime> Ctx<R> {
    /// The context of one reconciler run; spawns the webhook deliveries on `deps.tracker`.
    pub(super) fn new(
        deps: Deps<R>,
        agent_id: String,
        options: ReconcileOptions,
        shutdown: CancellationToken,
    ) -> Ctx<R> {
        let (notifier, deliveries) = on_deploy::Notifier::new(
            on_deploy::Reach {
                outbound: options.webhooks.clone(),
                assets_root: deps.assets_root.clone(),
                ownership: options.ownership.clone(),
            },
            deps.handles.timer.clone(),
            shutdown.clone(),
        );
        deps.tracker.spawn(deliveries);
        let mut restic = crate::restic::Restic::new(
            options.restic.clone(),
            data_dir(&deps.assets_root).join("restic-cache"),
        );
        if let Some((policy, owned)) = options.host_paths.clone() {
            restic = restic.guarded(policy, owned);
        }
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
            restic,
            creates: tokio::sync::Semaphore::new(
                options
                    .create_concurrency
                    .clamp(1, tokio::sync::Semaphore::MAX_PERMITS),
            ),
            options,
        }
    }
}

impl<R: Runtime> Ctx<R> {
    /// The restic executable the data runs use.
    pub(super) fn restic(&self) -> crate::restic::Restic {
        self.restic.clone()
    }

    /// The data runs' units that ended and wait for a pass to read them.
    pub(super) fn data_units(&self) -> &crate::reconcile::handlers::data::Units {
        &self.memory.data_units
    }

    /// The agent's data dir (the assets' parent).
    pub(super) fn data_dir(&self) -> std::path::PathBuf {
        data_dir(&self.assets_root)
    }
}

/// The data dir that holds `assets_root` (`<data-dir>/assets`).
fn data_dir(assets_root: &std::path::Path) -> std::path::PathBuf {
    assets_root
        .parent()
        .map_or_else(|| assets_root.to_owned(), std::path::Path::to_owned)
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
    /// Data runs' units that ended, until a pass reads them.
    pub(crate) data_units: crate::reconcile::handlers::data::Units,
    /// Resources waiting for their dependencies to become ready, by dependency.
    pub(crate) dependents: wake::Dependents,
    /// Replicas the router leaves out while they are drained.
    pub(crate) draining: wake::Draining,
    /// The header value of a canary's own route (its `http` analysis).
    pub(crate) canary_token: wake::CanaryToken,
}

/// Runs a blocking store call off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    store: &Arc<Store>,
    f: impl FnOnce(&Store) -> crate::store::Result<T> + Send + 'static,
) -> Result<T> {
    // In one of the store's thread turns: passes and probe runners by the hundred would
    // otherwise each hold a blocking thread of their own, waiting for the one connection.
    match crate::store::in_turn(store, f).await {
        Ok(result) => result.map_err(Error::Store),
        Err(join_error) if join_error.is_panic() => {
            std::panic::resume_unwind(join_error.into_panic())
        }
        Err(join_error) => Err(Error::Task(join_error)),
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
