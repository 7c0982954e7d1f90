//! What the replicated kinds (deployment, statefulset) share in a pass: observing the
//! replicas with their published readiness and restart counts, starting a crashed replica
//! again under its back-off, failing a rollout, and ending a pass that is not done yet (the
//! status message, and when to look again).
//!
//! Invariant: nothing here decides which replica changes (`plan` and `gate` do); these are the
//! observations and reports around those decisions, identical for both kinds.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::launch::start_error;
use super::rollout::{self, Report};
use crate::model::ResourceKey;
use crate::reconcile::plan::gate::{self, NewReplica, ReplicaReadiness, Waiting};
use crate::reconcile::{context::Ctx, context::blocking, error::Error, error::Result};
use crate::runtime::{Container, ContainerState, Runtime, labels};
use crate::store::{FailureReason, Phase, Release, ReleasePhase, ResourceStatus, now_unix};

/// While a rollout waits, the pass after this long re-checks its deadline even if no replica
/// changed (readiness changes and container events queue passes sooner).
const RECHECK: Duration = Duration::from_secs(5);

/// Labels that select this agent's replicas of one resource (not its init or release
/// containers); under Swarm, its services in its own role.
pub(super) fn replica_filter<'a>(
    agent_id: &'a str,
    key: &'a ResourceKey,
) -> [(&'a str, &'a str); 5] {
    let [agent, kind, scope, name] = owned_filter(agent_id, key);
    [agent, kind, scope, name, (labels::ROLE, key.kind.as_str())]
}

/// Labels that select every container (under Swarm, service) this agent made for one
/// resource, whatever its role.
pub(super) fn owned_filter<'a>(agent_id: &'a str, key: &'a ResourceKey) -> [(&'a str, &'a str); 4] {
    [
        (labels::AGENT, agent_id),
        (labels::KIND, key.kind.as_str()),
        (labels::SCOPE, key.scope.as_str()),
        (labels::NAME, key.name.as_str()),
    ]
}

pub(super) async fn list_replicas<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
) -> Result<Vec<Container>> {
    list_of(ctx, key, &replica_filter(&ctx.agent_id, key)).await
}

/// `key`'s containers `filter` selects (an engine error is the key's).
pub(super) async fn list_of<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    filter: &[(&str, &str)],
) -> Result<Vec<Container>> {
    ctx.runtime
        .list(filter)
        .await
        .map_err(|source| Error::Runtime {
            key: key.clone(),
            source,
        })
}

/// What a pass of a Swarm kind saw besides its replicas.
#[derive(Debug, Clone, Default)]
pub(crate) struct SwarmSeen {
    /// The kind's services (one for a deployment, one per ordinal for a statefulset).
    pub(crate) services: Vec<crate::runtime::Service>,
    /// Their tasks, every state.
    pub(crate) tasks: Vec<crate::runtime::Task>,
    pub(crate) nodes: Vec<crate::runtime::Node>,
}

/// The replicas as one observation sees them.
pub(super) struct Observed {
    pub(super) actual: Vec<Container>,
    /// The key's init containers, from the same list (none under Swarm).
    pub(super) inits: Vec<Container>,
    pub(super) readiness: BTreeMap<String, ReplicaReadiness>,
    /// Replicas of the target version that are not ready.
    pub(super) waiting: Vec<Waiting>,
    /// Under Docker Swarm: the services, tasks and nodes the replicas were read from.
    pub(super) swarm: Option<SwarmSeen>,
}

impl Observed {
    /// Whether `container` runs and is published ready.
    pub(super) fn is_ready(&self, container: &Container) -> bool {
        container.state == ContainerState::Running
            && self
                .readiness
                .get(&container.name)
                .is_some_and(|row| row.ready)
    }

    /// The replicas (any version) running and ready.
    pub(super) fn ready_names(&self) -> BTreeSet<String> {
        self.actual
            .iter()
            .filter(|container| self.is_ready(container))
            .map(|container| container.name.clone())
            .collect()
    }

    /// The published reason a replica is not ready ("" when ready or unknown).
    pub(super) fn reason(&self, container: &Container) -> &str {
        self.readiness
            .get(&container.name)
            .map_or("", |row| row.reason.as_str())
    }
}

/// Lists the replicas and their published readiness; `is_current` tells the target version.
/// A replica marked by its probe runner as failing liveness counts as outdated. One list of
/// the key's containers gives the replicas and the init containers (their roles).
pub(super) async fn observe<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    is_current: impl Fn(&Container) -> bool,
) -> Result<Observed> {
    let (mut actual, mut inits) = (Vec::new(), Vec::new());
    for container in list_of(ctx, key, &owned_filter(&ctx.agent_id, key)).await? {
        match container.label(labels::ROLE) {
            Some(role) if role == key.kind.as_str() => actual.push(container),
            Some(super::container::INIT_ROLE) => inits.push(container),
            _ => {}
        }
    }
    // A replica whose liveness failed (and whose back-off ran out) is observed without its
    // spec hash: every planner then sees it as outdated and replaces it through the gated
    // Replace step, never below `replicas - 1` ready.
    let now = tokio::time::Instant::now();
    for container in &mut actual {
        if ctx.memory.liveness_failed.is_due(&container.id, now) {
            container.labels.remove(labels::MANIFEST_HASH);
        }
    }
    let rows = {
        let key = key.clone();
        blocking(&ctx.store, move |store| store.readiness(&key)).await?
    };
    // A row counts only for the container instance it was written about (a pod re-created
    // under the same name starts without one).
    let instances: BTreeSet<(&str, &str)> = actual
        .iter()
        .map(|container| (container.name.as_str(), container.id.as_str()))
        .collect();
    let readiness: BTreeMap<String, ReplicaReadiness> = crate::model::map_of(
        rows.into_iter()
            .filter(|row| instances.contains(&(row.container.as_str(), row.container_id.as_str())))
            .map(|row| {
                (
                    row.container,
                    ReplicaReadiness {
                        ready: row.ready,
                        reason: row.reason,
                    },
                )
            }),
    );
    let waiting = gate::waiting(&actual, is_current, &readiness);
    Ok(Observed {
        actual,
        readiness,
        waiting,
        inits,
        swarm: None,
    })
}

/// Restart counts of the replicas still waiting (the engine's, or the agent's own starts).
pub(super) async fn inspect_waiting<R: Runtime>(
    ctx: &Ctx<R>,
    observed: &Observed,
    release: &Release,
) -> Vec<NewReplica> {
    let release_id = release.id.to_string();
    let now = tokio::time::Instant::now();
    let mut replicas = Vec::with_capacity(observed.waiting.len());
    for waiting in &observed.waiting {
        let Some(container) = observed
            .actual
            .iter()
            .find(|container| container.name == waiting.name)
        else {
            continue;
        };
        let (engine_restarts, last_exit_code) = match ctx.runtime.inspect(&container.id).await {
            Ok(inspection) => (
                u32::try_from(inspection.restart_count).unwrap_or(0),
                inspection.exit_code.filter(|_| !inspection.running),
            ),
            Err(_) => (0, None),
        };
        replicas.push(NewReplica {
            name: waiting.name.clone(),
            this_release: container.label(labels::RELEASE_ID) == Some(release_id.as_str()),
            restarts: engine_restarts.max(ctx.memory.crash_loops.restarts(&container.id, now)),
            last_exit_code,
        });
    }
    replicas
}

/// Why the rollout of `release` has failed, if it is in flight and has: its deadline passed
/// with work left (`converged`: no steps left), or a new replica keeps crashing; with the last
/// error a pass of it met, if any.
pub(super) fn rollout_failure<R: Runtime>(
    ctx: &Ctx<R>,
    release: &Release,
    converged: bool,
    observed: &Observed,
    new_replicas: &[NewReplica],
) -> Option<(FailureReason, String)> {
    if release.phase != ReleasePhase::Progressing {
        return None;
    }
    let elapsed = ctx
        .memory
        .rollouts
        .elapsed(release.id, tokio::time::Instant::now());
    let reason = gate::rollout_failure(
        elapsed,
        ctx.options.rollout_deadline,
        converged,
        &observed.waiting,
        new_replicas,
    )?;
    let failure = if gate::crash_looping(new_replicas).is_some() {
        FailureReason::CrashLoop
    } else {
        FailureReason::RolloutDeadline
    };
    Some((
        failure,
        match ctx.memory.rollouts.last_error(release.id) {
            Some(error) => format!("{reason}; last error: {error}"),
            None => reason,
        },
    ))
}

/// What a pass's steps left waiting, besides readiness.
#[derive(Debug, Default)]
pub(super) struct Waits {
    /// Crashed replicas whose back-off still runs: (name, starts so far, wait).
    pub(super) crash: Vec<(String, u32, Duration)>,
    /// Replicas whose init containers run (or pause between attempts): what they wait for,
    /// and when to look again (`None`: the run's end queues the pass).
    pub(super) inits: Vec<(String, Option<Duration>)>,
}

/// Starts a stopped replica again, unless its crash-loop back-off still runs (then it is
/// listed in `waits`).
pub(super) async fn start_again<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    id: &str,
    name: &str,
    waits: &mut Waits,
) -> Result<()> {
    let now = tokio::time::Instant::now();
    match ctx.memory.crash_loops.try_start(id, now) {
        Ok(starts) => {
            ctx.runtime
                .start(id)
                .await
                .map_err(|error| start_error(key, name, error))?;
            tracing::info!(%key, container = %name, starts, "replica started again");
        }
        Err(wait) => {
            let starts = ctx.memory.crash_loops.restarts(id, now);
            waits.crash.push((name.to_owned(), starts, wait));
        }
    }
    Ok(())
}

/// Phase and message of a pass that is not done, and when to look again: when a back-off
/// or a pause between init attempts ends, and (during a rollout) to re-check the deadline.
pub(super) fn not_done(
    status: &mut ResourceStatus,
    observed: &Observed,
    new_replicas: &[NewReplica],
    waits: &Waits,
    progressing: bool,
) -> Option<Duration> {
    status.phase = if progressing {
        Phase::Progressing
    } else {
        Phase::Degraded
    };
    status.message = describe_wait(observed, new_replicas, waits, progressing);
    waits
        .crash
        .iter()
        .map(|(_, _, wait)| *wait)
        .chain(waits.inits.iter().filter_map(|(_, wait)| *wait))
        .chain(progressing.then_some(RECHECK))
        .min()
}

/// The status message of a pass that is not done: the first replica awaited and why.
fn describe_wait(
    observed: &Observed,
    new_replicas: &[NewReplica],
    waits: &Waits,
    progressing: bool,
) -> String {
    if let Some((name, restarts, wait)) = waits.crash.first() {
        return format!(
            "replica {name} is crash-looping (started again {restarts} times); next start in {}",
            gate::human(*wait)
        );
    }
    if let Some((what, _)) = waits.inits.first() {
        return what.clone();
    }
    if let Some(crashing) = new_replicas.iter().find(|replica| replica.restarts > 0) {
        return format!(
            "replica {} is restarting (restarted {} times)",
            crashing.name, crashing.restarts
        );
    }
    match observed.waiting.first() {
        Some(first) if progressing => format!(
            "rolling out: waiting for {} to be ready ({})",
            first.name, first.reason
        ),
        Some(first) => format!("replica {} is not ready: {}", first.name, first.reason),
        None if progressing => "rolling out: replacing the next replica".to_owned(),
        None => "repairing replicas".to_owned(),
    }
}

/// Fails the rollout of `release` (and rolls back), then writes `status` saying so (its
/// `detail` set by the caller). Nothing is written when desired state moved on meanwhile.
pub(super) async fn fail_rollout<R: Runtime>(
    ctx: &Ctx<R>,
    release: &Release,
    (failure, reason): (FailureReason, &str),
    report: &Report<'_>,
    mut status: ResourceStatus,
) -> Result<()> {
    if let Some(message) = rollout::fail(ctx, release, reason, report).await? {
        status.phase = Phase::Failed;
        status.reason = Some(failure);
        status.message = message;
        put_status(ctx, report.key, status).await?;
    }
    Ok(())
}

/// Writes `status`, stamped now.
pub(super) async fn put_status<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    mut status: ResourceStatus,
) -> Result<()> {
    status.updated_at = now_unix();
    let ready = status.phase == Phase::Ready;
    let owner = key.clone();
    blocking(&ctx.store, move |store| store.put_status(&owner, &status)).await?;
    // Resources waiting to start after this one look again now (start-up order).
    if ready {
        for dependent in ctx.memory.dependents.take(key) {
            ctx.timer.requeue(dependent);
        }
    }
    Ok(())
}
