//! Live drift: the host changed without a commit (a replica stopped, crashed, removed or
//! edited by hand, a labelled container left behind). Two signals queue the owning resource
//! for a repair pass: container events (`die`, `destroy`, `stop`, `oom`, `health_status`) at
//! once, and a periodic resync that compares every managed resource with one container list.
//!
//! Invariants: both only queue keys (handlers stay level-triggered and decide what to do);
//! only containers carrying this agent's `voodu.agent` label are ever considered, so anything
//! else on the host is left alone; the resync costs one container list plus a store read,
//! and queues only resources that differ (plus the kinds whose state is not in containers:
//! asset files and ingress routes); the probe manager keeps its runners in step from the
//! same list (`probes::Listed`), so a resync is one list in all.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use tokio_util::sync::CancellationToken;

use crate::model::{Kind, ResourceKey};
use crate::reconcile::run::timer::What;
use crate::reconcile::{context::Ctx, context::blocking};
use crate::runtime::{Container, ContainerState, Runtime, labels};
use crate::store::DesiredSummary;

/// The pause before subscribing again to a container event stream that broke or ended.
const RESUBSCRIBE: Duration = Duration::from_secs(1);

/// Container event actions that may mean drift.
const DRIFT_ACTIONS: &[&str] = &["die", "destroy", "stop", "oom"];

/// Runs until `shutdown`: container events (unless they are off) and a resync every `every`.
pub(crate) async fn run<R: Runtime>(
    ctx: Arc<Ctx<R>>,
    every: Duration,
    listed: tokio::sync::watch::Sender<crate::reconcile::observers::probes::Listed>,
    shutdown: CancellationToken,
) {
    let mut stream = crate::reconcile::context::owned_container_events(&ctx);
    let mut resync = ctx.timer.every(What::Resync, every, every);
    loop {
        tokio::select! {
            _ = resync.tick() => {
                if let Err(error) = resync_once(&ctx, &listed).await {
                    tracing::warn!(%error, "resync failed; next one in {every:?}");
                }
            }
            event = stream.next() => match event {
                Some(Ok(event)) => {
                    let own = ctx.memory.own_removals.is_own(&event.id, &event.action);
                    if let Some(key) = owner(&event.labels).filter(|_| is_drift(&event.action) && !own) {
                        tracing::debug!(%key, action = %event.action, container = %event.id, "container event");
                        ctx.metrics.record_drift(key.kind.as_str(), "event");
                        ctx.memory.drifted.mark(&key, "event");
                        ctx.timer.requeue(key);
                    }
                }
                Some(Err(error)) => {
                    tracing::debug!(%error, "container events interrupted; resubscribing");
                    ctx.timer.sleep(What::Resync, RESUBSCRIBE).await;
                    stream = crate::reconcile::context::owned_container_events(&ctx);
                    // Whatever happened meanwhile is found by comparing.
                    resync.reset_immediately();
                }
                None => {
                    ctx.timer.sleep(What::Resync, RESUBSCRIBE).await;
                    stream = crate::reconcile::context::owned_container_events(&ctx);
                    resync.reset_immediately();
                }
            },
            () = shutdown.cancelled() => return,
        }
    }
}

fn is_drift(action: &str) -> bool {
    DRIFT_ACTIONS.contains(&action) || action.starts_with("health_status")
}

/// The resource a container of this agent belongs to: deployment and statefulset replicas
/// only (init, release and job run containers come and go on purpose).
fn owner(container_labels: &BTreeMap<String, String>) -> Option<ResourceKey> {
    let label = |name: &str| container_labels.get(name).map(String::as_str);
    let kind = label(labels::KIND).and_then(Kind::parse)?;
    if !matches!(kind, Kind::Deployment | Kind::Statefulset)
        || label(labels::ROLE) != Some(kind.as_str())
    {
        return None;
    }
    Some(ResourceKey::new(
        kind,
        label(labels::SCOPE)?,
        label(labels::NAME)?,
    ))
}

/// One comparison of the host with desired state; queues what differs, and hands the list to
/// the probe manager (`listed`).
async fn resync_once<R: Runtime>(
    ctx: &Arc<Ctx<R>>,
    listed: &tokio::sync::watch::Sender<crate::reconcile::observers::probes::Listed>,
) -> crate::reconcile::error::Result<()> {
    let containers = crate::reconcile::context::owned_containers(ctx).await?;
    let alive: BTreeSet<&str> = containers
        .iter()
        .map(|container| container.id.as_str())
        .collect();
    ctx.memory.crash_loops.retain(|id| alive.contains(id));
    let desired = blocking(&ctx.store, |store| store.desired_summaries()).await?;
    let keys = drifted(&desired, &containers);
    for key in &keys {
        ctx.metrics.record_drift(key.kind.as_str(), "resync");
        ctx.memory.drifted.mark(key, "resync");
    }
    if !keys.is_empty() {
        tracing::info!(resources = keys.len(), "resync found drift; repairing");
    }
    for key in keys {
        ctx.timer.requeue(key);
    }
    // Files and routes are not containers: their handlers check them cheaply each resync.
    for desired in desired {
        if matches!(desired.key.kind, Kind::Asset | Kind::Ingress) {
            ctx.timer.requeue(desired.key);
        }
    }
    listed.send_replace(Arc::new(containers));
    Ok(())
}

/// Resources whose containers differ from desired state: replicated kinds with missing,
/// extra, stopped or hand-edited (spec-hash label mismatch) replicas, and any resource that
/// still has labelled containers but is no longer desired.
pub(super) fn drifted(
    desired: &[DesiredSummary],
    containers: &[Container],
) -> BTreeSet<ResourceKey> {
    let mut replicas: BTreeMap<ResourceKey, Vec<&Container>> = BTreeMap::new();
    let mut owned: BTreeSet<ResourceKey> = BTreeSet::new();
    for container in containers {
        let label = |name: &str| container.label(name);
        let (Some(kind), Some(scope), Some(name)) = (
            label(labels::KIND).and_then(Kind::parse),
            label(labels::SCOPE),
            label(labels::NAME),
        ) else {
            continue;
        };
        let key = ResourceKey::new(kind, scope, name);
        if label(labels::ROLE) == Some(kind.as_str()) {
            replicas.entry(key.clone()).or_default().push(container);
        }
        owned.insert(key);
    }
    let wanted: BTreeSet<&ResourceKey> = desired.iter().map(|desired| &desired.key).collect();
    let mut drifted: BTreeSet<ResourceKey> = owned
        .into_iter()
        .filter(|key| !wanted.contains(key) && !is_release_step(key, &wanted))
        .collect();
    for desired in desired {
        if !matches!(desired.key.kind, Kind::Deployment | Kind::Statefulset) {
            continue;
        }
        let mine = replicas.get(&desired.key).map_or(&[][..], Vec::as_slice);
        let healthy = mine
            .iter()
            .filter(|container| {
                container.label(labels::MANIFEST_HASH) == Some(desired.spec_hash.as_str())
                    && matches!(
                        container.state,
                        ContainerState::Running | ContainerState::Restarting
                    )
            })
            .count();
        if healthy != desired.n_replicas || mine.len() != desired.n_replicas {
            drifted.insert(desired.key.clone());
        }
    }
    drifted
}

/// Release hook containers are labelled `voodu.kind=job, voodu.name=<name>-release` as voodu
/// labels them; they belong to the deployment `<name>`, which is desired.
fn is_release_step(key: &ResourceKey, wanted: &BTreeSet<&ResourceKey>) -> bool {
    key.kind == Kind::Job
        && key.name.strip_suffix("-release").is_some_and(|name| {
            wanted.contains(&ResourceKey::new(
                Kind::Deployment,
                key.scope.as_str(),
                name,
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SpecHash;

    fn desired(kind: Kind, name: &str, hash: &str, n: usize) -> DesiredSummary {
        DesiredSummary {
            key: ResourceKey::new(kind, "shop", name),
            spec_hash: SpecHash::new(hash),
            n_replicas: n,
        }
    }

    fn container(
        kind: &str,
        name: &str,
        role: &str,
        hash: &str,
        state: ContainerState,
    ) -> Container {
        Container {
            id: format!("id-{name}-{hash}-{role}"),
            name: format!("shop-{name}.x"),
            image: "img".to_owned(),
            labels: BTreeMap::from([
                (labels::AGENT.to_owned(), "agent".to_owned()),
                (labels::KIND.to_owned(), kind.to_owned()),
                (labels::SCOPE.to_owned(), "shop".to_owned()),
                (labels::NAME.to_owned(), name.to_owned()),
                (labels::ROLE.to_owned(), role.to_owned()),
                (labels::MANIFEST_HASH.to_owned(), hash.to_owned()),
            ]),
            state,
        }
    }

    /// A replica of the deployment `name`.
    fn replica(name: &str, hash: &str, state: ContainerState) -> Container {
        container("deployment", name, "deployment", hash, state)
    }

    use ContainerState::{Exited, Restarting, Running};

    fn keys(set: &BTreeSet<ResourceKey>) -> Vec<String> {
        set.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_matching_host_has_no_drift() {
        let desired = [desired(Kind::Deployment, "web", "h1", 2)];
        let host = [
            replica("web", "h1", Running),
            replica("web", "h1", Restarting),
            // An init container of the same resource is not a replica.
            container("deployment", "web", "init", "h1", Exited),
        ];
        assert!(drifted(&desired, &host).is_empty());
    }

    #[test]
    fn missing_extra_stopped_and_edited_replicas_are_drift() {
        let desired = [desired(Kind::Deployment, "web", "h1", 2)];
        let web = |hash, state| replica("web", hash, state);
        for host in [
            vec![web("h1", Running)],
            vec![web("h1", Running), web("h1", Running), web("h1", Running)],
            vec![web("h1", Running), web("h1", Exited)],
            vec![web("h1", Running), web("hand-edited", Running)],
        ] {
            assert_eq!(
                keys(&drifted(&desired, &host)),
                ["deployment/shop/web"],
                "{host:?}"
            );
        }
    }

    #[test]
    fn leftovers_of_resources_no_longer_desired_are_drift_but_release_steps_are_not() {
        let desired = [desired(Kind::Deployment, "web", "h1", 1)];
        let host = [
            replica("web", "h1", Running),
            container("job", "web-release", "release", "release", Exited),
            replica("old", "h0", Running),
        ];
        assert_eq!(keys(&drifted(&desired, &host)), ["deployment/shop/old"]);
    }

    #[test]
    fn drift_events_are_the_ones_that_change_what_runs() {
        for action in ["die", "destroy", "stop", "oom", "health_status: unhealthy"] {
            assert!(is_drift(action), "{action}");
        }
        for action in ["start", "create", "exec_start: sh", "attach"] {
            assert!(!is_drift(action), "{action}");
        }
        let web = replica("web", "h1", Running);
        assert_eq!(
            owner(&web.labels).map(|key| key.to_string()).as_deref(),
            Some("deployment/shop/web")
        );
        let init = container("deployment", "web", "init", "h1", Running);
        assert_eq!(owner(&init.labels), None);
        let run = container("job", "migrate", "job", "", Exited);
        assert_eq!(owner(&run.labels), None);
    }
}
