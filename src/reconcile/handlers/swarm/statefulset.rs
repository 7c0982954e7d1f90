//! A statefulset under Docker Swarm: one single-replica service per ordinal,
//! `<scope>-<name>-<n>`, placed on one node (`node.id==…`, chosen when the ordinal's service
//! is created and kept in its `voodu.node` label: its volumes
//! `voodu-<scope>-<name>-<claim>-<n>` are local to that node).
//!
//! Each ordinal's live task is observed as the pod `<scope>-<name>.<n>`, so the container
//! statefulset's own planner and ordered gate decide (`plan_statefulset`,
//! `gate::gate_ordered`: one ordinal at a time, top-down, each replaced only once every
//! other is ready), its pods, environment and detail are built by the same code
//! (`statefulset.rs`), and this module only carries the steps out on services: create an
//! ordinal's service, update it (stop-first: its volumes are node-local), remove an ordinal
//! past `replicas`. A pod whose node is down is pending in Swarm: observed as not running,
//! reported down (the gate waits), never moved.
//!
//! Invariants: volumes are never removed (as on containers); an ordinal's node never
//! changes once chosen; a `Start` step is Swarm's own (it restarts tasks).

use std::collections::BTreeMap;

use super::super::launch::EnvSource;
use super::super::replicas::{Observed, Waits};
use super::super::replicated::{self, Replicated};
use super::super::rollout::Report;
use super::super::statefulset::Statefulset;
use super::{Shape, build_service, observe_services, observed};
use crate::manifest::spec::{Container as ContainerSpec, Init};
use crate::model::ResourceKey;
use crate::reconcile::plan::StatefulStep;
use crate::reconcile::plan::gate::NewReplica;
use crate::reconcile::{context::Ctx, error::Error, error::Result, run::action::Action};
use crate::runtime::{Container, NodeState, Runtime, Service, ServiceMode, TaskState, labels};
use crate::store::{FailureReason, Release, ResourceStatus};

/// The service label holding the node an ordinal runs on.
const NODE: &str = "voodu.node";

pub(in crate::reconcile::handlers) async fn reconcile<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
) -> Result<Action> {
    let Some(desired) = super::desired_to_apply(ctx, key, remove(ctx, key)).await? else {
        return Ok(Action::Done);
    };
    let spec = spec_of!(key, desired, Statefulset);
    let statefulset = SwarmStatefulset {
        inner: Statefulset {
            desired: &desired,
            spec,
            pods: Vec::new(),
            digests: Vec::new(),
            pins: None,
        },
        release_id: 0,
    };
    replicated::pass(ctx, &desired, statefulset).await
}

/// The statefulset left the repo: its services go, highest ordinal first; its volumes stay.
async fn remove<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey) -> Result<()> {
    let mut services =
        super::list_leftovers(ctx, key, &super::service_filter(&ctx.agent_id, key)).await?;
    services.sort_by_key(|service| std::cmp::Reverse(ordinal_of(service)));
    super::remove_leftovers(
        ctx,
        key,
        services,
        "removing the pod's service: resource left the repo; its volumes are kept",
    )
    .await
}

fn ordinal_of(service: &Service) -> Option<usize> {
    service.label(labels::REPLICA_ORDINAL)?.parse().ok()
}

struct SwarmStatefulset<'a> {
    inner: Statefulset<'a>,
    release_id: i64,
}

impl SwarmStatefulset<'_> {
    fn key(&self) -> &ResourceKey {
        &self.inner.desired.key
    }

    /// Whether a task (or the service's template) with `task_labels` runs the desired spec.
    fn task_is_current(&self, task_labels: &BTreeMap<String, String>) -> bool {
        task_labels.get(labels::MANIFEST_HASH).map(String::as_str)
            == Some(self.inner.desired.spec_hash.as_str())
    }

    /// The service of `ordinal`, from its pod, built to run on `node`.
    fn service<R: Runtime>(
        &self,
        ctx: &Ctx<R>,
        ordinal: usize,
        node: &str,
    ) -> Result<super::Built> {
        let key = self.key();
        let pod = self
            .inner
            .pods
            .get(ordinal)
            .ok_or_else(|| Error::Permanent {
                key: key.clone(),
                reason: FailureReason::Spec,
                message: format!("no pod {ordinal} in the plan"),
            })?;
        let mut identity = pod.identity.clone();
        identity.name = format!("{}-{ordinal}", key.app_id());
        let mut launch = pod.launch.clone();
        launch.restart = String::new();
        let spec = self.inner.spec;
        let mut built = build_service(
            ctx,
            key,
            &identity,
            &spec.container,
            &launch,
            Shape {
                mode: ServiceMode::Replicated { replicas: 1 },
                probes: spec.probes.as_deref(),
                drain: spec.drain.as_ref(),
                stop_first: true,
                constraints: vec![format!("node.id=={node}")],
                asset_digests: &spec.asset_digests,
                labels: BTreeMap::from([
                    (labels::REPLICA_ORDINAL.to_owned(), ordinal.to_string()),
                    (NODE.to_owned(), node.to_owned()),
                ]),
                volume_labels: crate::model::map_of(
                    pod.volumes
                        .iter()
                        .map(|(name, labels, _)| (name.clone(), labels.clone())),
                ),
            },
        )?;
        built
            .spec
            .labels
            .insert(labels::RELEASE_ID.to_owned(), self.release_id.to_string());
        Ok(built)
    }
}

impl<R: Runtime> Replicated<R> for SwarmStatefulset<'_> {
    type Step = StatefulStep;

    fn build(&mut self, ctx: &Ctx<R>, env_source: &EnvSource) -> Result<()> {
        <Statefulset<'_> as Replicated<R>>::build(&mut self.inner, ctx, env_source)
    }

    fn set_release(&mut self, release: &Release) {
        self.release_id = release.id;
    }

    fn is_current(&self, pod: &Container) -> bool {
        <Statefulset<'_> as Replicated<R>>::is_current(&self.inner, pod)
    }

    async fn observe(&self, ctx: &Ctx<R>, key: &ResourceKey) -> Result<Observed> {
        let mut seen = observe_services(ctx, key).await?;
        // One live task per ordinal service: while Swarm replaces it (stop-first) the
        // newest counts, so the planner never sees a duplicate pod.
        let mut newest: BTreeMap<&str, (i64, &str)> = BTreeMap::new();
        for task in &seen.tasks {
            let live = task.desired == TaskState::Running && !task.state.ended();
            if live {
                let entry = newest
                    .entry(&task.service_id)
                    .or_insert((task.since, &task.id));
                if task.since > entry.0 {
                    *entry = (task.since, &task.id);
                }
            }
        }
        let keep: std::collections::BTreeSet<String> =
            newest.values().map(|(_, id)| (*id).to_owned()).collect();
        seen.tasks
            .retain(|task| keep.contains(&task.id) || task.state.ended());
        // A pending task of a node that is down is reported as such.
        let down: Vec<String> = seen
            .nodes
            .iter()
            .filter(|node| node.state != NodeState::Ready)
            .map(|node| node.id.clone())
            .collect();
        let node_of: BTreeMap<String, String> = seen
            .services
            .iter()
            .filter_map(|service| Some((service.id.clone(), service.label(NODE)?.to_owned())))
            .collect();
        for task in &mut seen.tasks {
            if let Some(node) = node_of.get(&task.service_id)
                && down.contains(node)
                && task.state != TaskState::Running
            {
                task.error = format!(
                    "its node {node} is down; the pod stays pinned there (its volumes are local to it) and is not moved"
                );
            }
        }
        let app = key.app_id();
        Ok(observed(
            seen,
            ctx.options.ready_settle,
            |task| {
                let ordinal = task
                    .labels
                    .get(labels::REPLICA_ORDINAL)
                    .map_or("?", String::as_str);
                format!("{app}.{ordinal}")
            },
            |pod| <Self as Replicated<R>>::is_current(self, pod),
        ))
    }

    fn plan(&self, observed: &Observed) -> Vec<StatefulStep> {
        <Statefulset<'_> as Replicated<R>>::plan(&self.inner, observed)
    }

    fn touches(step: &StatefulStep) -> bool {
        <Statefulset<'_> as Replicated<R>>::touches(step)
    }

    fn is_replace(step: &StatefulStep) -> bool {
        <Statefulset<'_> as Replicated<R>>::is_replace(step)
    }

    fn gate(&self, steps: Vec<StatefulStep>, observed: &Observed) -> Vec<StatefulStep> {
        <Statefulset<'_> as Replicated<R>>::gate(&self.inner, steps, observed)
    }

    swarm_kind!(lost_nodes: "pods pinned there are down and wait for it");
}

/// The node a new ordinal's service runs on: the ready, active nodes in hostname order,
/// taken round-robin by ordinal.
fn node_for(observed: &Observed, ordinal: usize) -> Option<String> {
    let seen = observed.swarm.as_ref()?;
    let mut nodes: Vec<&crate::runtime::Node> = seen
        .nodes
        .iter()
        .filter(|node| node.state == NodeState::Ready && node.availability == "active")
        .collect();
    nodes.sort_unstable_by(|a, b| a.hostname.cmp(&b.hostname).then(a.id.cmp(&b.id)));
    let node = nodes.get(ordinal % nodes.len().max(1))?;
    Some(node.id.clone())
}

/// Creates the service of pod `ordinal`, placed on its node.
async fn create_pod<R: Runtime>(
    ctx: &Ctx<R>,
    work: &SwarmStatefulset<'_>,
    ordinal: usize,
    observed: &Observed,
) -> Result<()> {
    let key = work.key();
    let node = node_for(observed, ordinal).ok_or_else(|| Error::Runtime {
        key: key.clone(),
        source: crate::runtime::Error::Unavailable {
            message: "no ready, active swarm node to place the pod on".to_owned(),
        },
    })?;
    let built = work.service(ctx, ordinal, &node)?;
    let (spec, _) = super::create_service(ctx, key, &built).await?;
    tracing::info!(%key, service = %spec.name, ordinal, node, "pod service created");
    Ok(())
}

async fn execute<R: Runtime>(
    ctx: &Ctx<R>,
    work: &SwarmStatefulset<'_>,
    steps: &[StatefulStep],
    observed: &Observed,
) -> Result<()> {
    let key = work.key();
    let runtime_error = Error::runtime(key);
    let services: &[Service] = observed
        .swarm
        .as_ref()
        .map_or(&[], |seen| seen.services.as_slice());
    let service_of = |ordinal: usize| {
        services
            .iter()
            .find(|service| ordinal_of(service) == Some(ordinal))
    };
    for step in steps {
        match step {
            StatefulStep::Create { ordinal } => {
                if service_of(*ordinal).is_some() {
                    // Its task is starting (or pending on its node): Swarm's to bring up.
                    continue;
                }
                create_pod(ctx, work, *ordinal, observed).await?;
            }
            // Swarm restarts a stopped task itself.
            StatefulStep::Start { .. } => {}
            StatefulStep::Replace { ordinal, name, .. } => {
                let Some(service) = service_of(*ordinal) else {
                    continue;
                };
                let node = service
                    .label(NODE)
                    .map(ToOwned::to_owned)
                    .or_else(|| node_for(observed, *ordinal))
                    .unwrap_or_default();
                let built = work.service(ctx, *ordinal, &node)?;
                super::update_service(ctx, key, service, &built).await?;
                tracing::info!(%key, pod = %name, ordinal, "pod service updated (stop-first, same node, same volumes)");
                super::remove_stale_configs(ctx, &built.assets).await;
            }
            StatefulStep::Remove { ordinal, name, .. } => {
                // A duplicate task of a wanted ordinal is Swarm's (one replica per service);
                // an ordinal past `replicas` loses its service, never its volumes.
                let wanted = ordinal.is_some_and(|ordinal| ordinal < work.inner.desired.n_replicas);
                let Some(service) = ordinal.and_then(service_of).filter(|_| !wanted) else {
                    continue;
                };
                ctx.runtime
                    .remove_service(&service.id)
                    .await
                    .map_err(&runtime_error)?;
                tracing::info!(%key, pod = %name, ordinal = ?ordinal, "pod service removed; its volumes are kept");
            }
        }
    }
    // A service past `replicas` whose tasks all ended shows no pod to the planner: it goes
    // here (a wanted ordinal's such service is `Create`'s, kept above).
    let live: std::collections::BTreeSet<&str> = observed
        .actual
        .iter()
        .filter_map(|pod| {
            let seen = observed.swarm.as_ref()?;
            let task = seen.tasks.iter().find(|task| task.id == pod.id)?;
            Some(task.service_id.as_str())
        })
        .collect();
    for service in services {
        let surplus =
            ordinal_of(service).is_none_or(|ordinal| ordinal >= work.inner.desired.n_replicas);
        if surplus && !live.contains(service.id.as_str()) {
            ctx.runtime
                .remove_service(&service.id)
                .await
                .map_err(&runtime_error)?;
            tracing::info!(%key, service = %service.name, "surplus pod service removed; its volumes are kept");
        }
    }
    Ok(())
}
