//! Statefulset handler (spec §7.4): converge the pods `<scope>-<name>.<n>` (unscoped
//! `<name>.<n>`), `n` in `0..replicas`, on the desired spec hash and each pod's environment,
//! by executing `plan::plan_statefulset` steps through the runtime. `postgres` and `redis`
//! arrive here too: the manifest stage expands them into statefulsets.
//!
//! Invariants:
//! - a pod's name, ordinal, DNS aliases (`<name>-<n>.<scope>` first) and volumes
//!   (`voodu-<scope>-<name>-<claim>-<n>`, one per `volume_claim`) follow from its ordinal
//!   alone, so a pod re-created for any reason (replacement, scale-up after a scale-down, the
//!   resource re-added to the repo) gets the same volumes back;
//! - each pod's environment carries `VOODU_REPLICA_ORDINAL` and `VOODU_REPLICA_ID`, so each
//!   pod has its own environment digest, and a pod is current when its spec hash and its own
//!   digest match;
//! - each pass is the one replicated pass (`replicated.rs`), as the deployment's: surplus pods are removed
//!   highest ordinal first, then one pod at a time is created (lowest missing ordinal first)
//!   or replaced (highest outdated ordinal first, ordinal 0 last), and only once every current
//!   pod is ready (`gate::gate_ordered`); the pod's readiness queues the next pass. A replaced
//!   pod runs its init chain again before its main container; a stopped pod is started again
//!   under the crash-loop back-off;
//! - volumes are created (idempotently) before a pod's init chain and never removed by the
//!   agent: not on scale-down, not on replacement, not when the resource leaves the repo;
//! - a rollout (a spec hash the latest release does not have) opens a release keyed to the
//!   desired commit and closes it as succeeded once converged with every pod ready; on its
//!   deadline, a crash-looping new pod or a permanent error it fails and is rolled back as a
//!   deployment's is (`rollout`); statefulsets have no release hooks and no `on_deploy`
//!   (voodu has none).

use std::collections::{BTreeMap, BTreeSet};

use super::container::{Identity, Launch, aliases};
use super::inits::{Inits, advance_inits, drop_inits, inits_in_flight};
use super::launch::{EnvSource, build_spec, create_and_start, identity_vars};
use super::replicas::{Observed, Waits, list_replicas, start_again};
use super::replicated::{self, Replicated, drain_and_remove};
use super::rollout::Report;
use crate::manifest::spec::{Container as ContainerSpec, Drain, Init, StatefulsetSpec};
use crate::model::{Kind, ResourceKey};
use crate::reconcile::plan::{StatefulStep, StatefulTarget, plan_statefulset, pod_ordinal};
use crate::reconcile::{
    context::Ctx, error::Error, error::Result, plan::gate, run::action::Action,
};
use crate::runtime::{Container, ContainerState, Runtime, Volume, labels};
use crate::store::{
    Desired, Detail, FailureReason, PodDetail, Release, ResourceStatus, StatefulsetDetail,
    VolumeDetail,
};

/// One pod's name, labels, environment and mounts.
pub(super) struct Pod {
    pub(super) identity: Identity,
    pub(super) launch: Launch,
    /// `(volume name, labels, mount path)` per claim, in declaration order.
    pub(super) volumes: Vec<(String, BTreeMap<String, String>, String)>,
}

/// One pass of a statefulset on containers (`engine::statefulset` chooses it).
pub(super) async fn reconcile<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey) -> Result<Action> {
    let Some(desired) = super::desired_or_remove(ctx, key, remove_everything(ctx, key)).await?
    else {
        return Ok(Action::Done);
    };
    let spec = spec_of!(key, desired, Statefulset);
    super::refuse_unappliable(key, &desired.spec)?;
    let statefulset = Statefulset {
        desired: &desired,
        spec,
        pods: Vec::new(),
        digests: Vec::new(),
        pins: None,
    };
    replicated::pass(ctx, &desired, statefulset).await
}

/// A statefulset in one pass: pods with an ordinal each, their own environment and volumes.
pub(super) struct Statefulset<'a> {
    pub(super) desired: &'a Desired,
    pub(super) spec: &'a StatefulsetSpec,
    /// Indexed by ordinal, `0..n_replicas`; set by `build`.
    pub(super) pods: Vec<Pod>,
    /// Each pod's environment digest, by ordinal; set by `build`.
    pub(super) digests: Vec<String>,
    /// What the release's images run as; set by `set_pins`.
    pub(super) pins: Option<std::sync::Arc<crate::reconcile::handlers::pins::Pins>>,
}

impl Statefulset<'_> {
    pub(super) fn target(&self) -> StatefulTarget<'_> {
        StatefulTarget {
            spec_hash: &self.desired.spec_hash,
            n_replicas: self.desired.n_replicas,
            env_digests: Some(&self.digests),
            images: self
                .pins
                .as_deref()
                .map(crate::reconcile::handlers::pins::Pins::label),
        }
    }
}

impl<R: Runtime> Replicated<R> for Statefulset<'_> {
    type Step = StatefulStep;

    fn data_subject(&self) -> Option<(&crate::manifest::spec::Backup, super::data::Subject<'_>)> {
        let backup = self.spec.backup.as_ref()?;
        Some((
            backup,
            super::data::Subject::Pods {
                replicas: self.spec.n_replicas(),
                claims: self
                    .spec
                    .volume_claims
                    .iter()
                    .map(|claim| claim.name.as_str())
                    .collect(),
            },
        ))
    }

    fn build(&mut self, ctx: &Ctx<R>, env_source: &EnvSource) -> Result<()> {
        let mut pods = Vec::with_capacity(self.desired.n_replicas);
        for ordinal in 0..self.desired.n_replicas {
            let mut pod = pod(ctx, env_source, self.desired, self.spec, ordinal)?;
            pod.launch.pins.clone_from(&self.pins);
            pods.push(pod);
        }
        self.digests = pods
            .iter()
            .map(|pod| pod.launch.env_digest.clone())
            .collect();
        self.pods = pods;
        Ok(())
    }

    fn set_release(&mut self, release: &Release) {
        for pod in &mut self.pods {
            pod.identity.release_id = Some(release.id.to_string());
        }
    }

    pins_in!(pins);

    fn report(&self) -> Report<'_> {
        let key = &self.desired.key;
        Report {
            key,
            on_deploy: None,
            image: self.spec.container.effective_image(key),
        }
    }

    fn images(&self) -> (&ContainerSpec, &[Init]) {
        (&self.spec.container, &self.spec.inits)
    }

    fn is_current(&self, pod: &Container) -> bool {
        let target = self.target();
        pod_ordinal(pod)
            .is_some_and(|ordinal| ordinal < target.n_replicas && target.is_current(ordinal, pod))
    }

    fn plan(&self, observed: &Observed) -> Vec<StatefulStep> {
        plan_statefulset(Some(&self.target()), &observed.actual)
    }

    fn touches(step: &StatefulStep) -> bool {
        matches!(
            step,
            StatefulStep::Create { .. } | StatefulStep::Replace { .. }
        )
    }

    fn is_replace(step: &StatefulStep) -> bool {
        matches!(step, StatefulStep::Replace { .. })
    }

    /// The ordered gate: one pod at a time, each ready first.
    fn gate(&self, steps: Vec<StatefulStep>, observed: &Observed) -> Vec<StatefulStep> {
        let n_replicas = self.desired.n_replicas;
        let unready: BTreeSet<usize> = observed
            .actual
            .iter()
            .filter(|pod| !observed.is_ready(pod))
            .filter_map(pod_ordinal)
            .filter(|ordinal| *ordinal < n_replicas)
            .collect();
        let down: BTreeSet<usize> = observed
            .actual
            .iter()
            .filter(|pod| pod.state != ContainerState::Running)
            .filter_map(pod_ordinal)
            .filter(|ordinal| unready.contains(ordinal))
            .collect();
        gate::gate_ordered(steps, &unready, &down)
    }

    async fn execute(
        &self,
        ctx: &Ctx<R>,
        steps: &[StatefulStep],
        observed: &Observed,
        waits: &mut Waits,
    ) -> Result<()> {
        execute(ctx, self, steps, observed, waits).await
    }

    async fn detail(
        &self,
        ctx: &Ctx<R>,
        status: ResourceStatus,
        observed: &Observed,
    ) -> Result<ResourceStatus> {
        with_detail(ctx, &self.desired.key, status, observed, &self.target()).await
    }
}

/// The pod of one ordinal: identity (its release id is set once the release is known),
/// environment (with its ordinal) and volumes.
fn pod<R: Runtime>(
    ctx: &Ctx<R>,
    env_source: &EnvSource,
    desired: &Desired,
    spec: &StatefulsetSpec,
    ordinal: usize,
) -> Result<Pod> {
    let key = &desired.key;
    let mut identity_env = identity_vars(key);
    identity_env.push(("VOODU_REPLICA_ORDINAL".to_owned(), ordinal.to_string()));
    identity_env.push(("VOODU_REPLICA_ID".to_owned(), ordinal.to_string()));
    let (env, env_digest) = env_source.env(ctx, key, &spec.container, identity_env)?;
    let volumes: Vec<(String, BTreeMap<String, String>, String)> = spec
        .volume_claims
        .iter()
        .map(|claim| {
            (
                volume_name(key, &claim.name, ordinal),
                volume_labels(&ctx.agent_id, key, &claim.name, ordinal),
                claim.mount_path.clone(),
            )
        })
        .collect();
    Ok(Pod {
        identity: Identity {
            name: format!("{}.{ordinal}", key.app_id()),
            kind: Kind::Statefulset,
            role: Kind::Statefulset.as_str().to_owned(),
            name_label: key.name.clone(),
            replica_id: ordinal.to_string(),
            ordinal: Some(ordinal),
            spec_hash: Some(desired.spec_hash.to_string()),
            release_id: None,
            aliases: aliases(key, Some(ordinal)),
        },
        launch: Launch {
            env,
            env_digest,
            ports: spec.ports.clone(),
            restart: spec.effective_restart().to_owned(),
            extra_binds: volumes
                .iter()
                .map(|(name, _, mount_path)| format!("{name}:{mount_path}"))
                .collect(),
            default_ulimits: ctx.default_ulimits.clone(),
            probes: spec.probes.as_deref().cloned(),
            ..Launch::default()
        },
        volumes,
    })
}

/// voodu's volume name of one claim of one pod (spec §6.1).
fn volume_name(key: &ResourceKey, claim: &str, ordinal: usize) -> String {
    crate::model::names::claim_volume(key, claim, ordinal)
}

/// voodu's volume labels (spec §6.2) plus this agent's ownership marker.
fn volume_labels(
    agent_id: &str,
    key: &ResourceKey,
    claim: &str,
    ordinal: usize,
) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            labels::CREATED_BY.to_owned(),
            labels::CREATED_BY_VALUE.to_owned(),
        ),
        (
            labels::KIND.to_owned(),
            Kind::Statefulset.as_str().to_owned(),
        ),
        (labels::SCOPE.to_owned(), key.scope.clone()),
        (labels::NAME.to_owned(), key.name.clone()),
        (labels::REPLICA_ORDINAL.to_owned(), ordinal.to_string()),
        (labels::CLAIM.to_owned(), claim.to_owned()),
        (labels::AGENT.to_owned(), agent_id.to_owned()),
    ])
}

/// Runs the gated steps; a crashed pod whose back-off still runs is skipped and listed in
/// `waits`, as is a pod whose init containers run.
async fn execute<R: Runtime>(
    ctx: &Ctx<R>,
    work: &Statefulset<'_>,
    steps: &[StatefulStep],
    observed: &Observed,
    waits: &mut Waits,
) -> Result<()> {
    let key = &work.desired.key;
    let grace = Drain::grace_of(work.spec.drain.as_ref());
    let creates = steps.iter().any(|step| {
        matches!(
            step,
            StatefulStep::Create { .. } | StatefulStep::Replace { .. }
        )
    });
    // Init units of a superseded spec, or of a pod that exists, go, and so do those of an
    // ordinal no longer wanted (scaled down while its inits ran); a pod's own chain goes on
    // under its ordinal.
    if creates || !work.spec.inits.is_empty() {
        let pods: BTreeSet<&str> = observed
            .actual
            .iter()
            .filter_map(|pod| pod.label(labels::REPLICA_ID))
            .collect();
        let in_flight = inits_in_flight(
            ctx,
            key,
            &observed.inits,
            work.desired.spec_hash.as_str(),
            |replica| pods.contains(replica),
        )
        .await?;
        for (ordinal, ids) in in_flight {
            let wanted = ordinal
                .parse::<usize>()
                .is_ok_and(|ordinal| ordinal < work.desired.n_replicas);
            if !wanted {
                drop_inits(ctx, key, &ordinal, &ids).await?;
            }
        }
    }
    for step in steps {
        match step {
            StatefulStep::Create { ordinal } => {
                if let Some(name) = create_pod(ctx, work, *ordinal, waits).await? {
                    tracing::info!(%key, pod = %name, ordinal, "pod created");
                }
            }
            StatefulStep::Start { id, name, .. } => {
                start_again(ctx, key, id, name, waits).await?;
            }
            StatefulStep::Replace { ordinal, id, name } => {
                drain_and_remove(ctx, key, id, grace).await?;
                create_pod(ctx, work, *ordinal, waits).await?;
                tracing::info!(%key, pod = %name, ordinal, "pod replaced");
            }
            StatefulStep::Remove { ordinal, id, name } => {
                drain_and_remove(ctx, key, id, grace).await?;
                tracing::info!(%key, pod = %name, ordinal = ?ordinal, "pod removed; its volumes are kept");
            }
        }
    }
    Ok(())
}

/// Creates the pod of `ordinal`: its volumes, its init chain, then the container, started
/// (`None` while its init containers run: listed in `waits`, created by a later pass). A
/// container that cannot start is removed again.
async fn create_pod<R: Runtime>(
    ctx: &Ctx<R>,
    work: &Statefulset<'_>,
    ordinal: usize,
    waits: &mut Waits,
) -> Result<Option<String>> {
    let key = &work.desired.key;
    let runtime_error = |source| Error::Runtime {
        key: key.clone(),
        source,
    };
    let pod = work.pods.get(ordinal).ok_or_else(|| Error::Permanent {
        key: key.clone(),
        reason: FailureReason::Spec,
        message: format!("no pod {ordinal} in the plan"),
    })?;
    for (name, volume_labels, _) in &pod.volumes {
        ctx.runtime
            .ensure_volume(name, volume_labels)
            .await
            .map_err(runtime_error)?;
    }
    let inits = &work.spec.inits;
    if let Inits::Waiting(what, wait) = advance_inits(
        ctx,
        key,
        &pod.identity,
        &work.spec.container,
        &pod.launch,
        inits,
    )
    .await?
    {
        waits.inits.push((what, wait));
        return Ok(None);
    }
    let container = build_spec(ctx, key, &pod.identity, &work.spec.container, &pod.launch)?;
    create_and_start(ctx, key, &container).await?;
    Ok(Some(container.name))
}

/// The resource left the repo: its pods go highest ordinal first, then any other container of
/// it (init leftovers), then its status. Its volumes stay; the log says how to remove them.
async fn remove_everything<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey) -> Result<()> {
    let pods = list_replicas(ctx, key).await?;
    let first: Vec<(String, String)> = plan_statefulset(None, &pods)
        .into_iter()
        .filter_map(|step| match step {
            StatefulStep::Remove { id, name, .. } => Some((id, name)),
            _ => None,
        })
        .collect();
    replicated::remove_everything(ctx, key, first).await?;
    let volumes = list_volumes(ctx, key).await?;
    if !volumes.is_empty() {
        let volume_names: Vec<&str> = volumes.iter().map(|volume| volume.name.as_str()).collect();
        tracing::info!(
            %key,
            volumes = ?volume_names,
            "statefulset volumes are kept; remove them by hand when the data is no longer needed: docker volume rm {}",
            volume_names.join(" ")
        );
    }
    Ok(())
}

/// This agent's volumes of the statefulset, by name.
async fn list_volumes<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey) -> Result<Vec<Volume>> {
    let mut volumes = ctx
        .runtime
        .list_volumes(&[
            (labels::AGENT, ctx.agent_id.as_str()),
            (labels::KIND, key.kind.as_str()),
            (labels::SCOPE, key.scope.as_str()),
            (labels::NAME, key.name.as_str()),
        ])
        .await
        .map_err(|source| Error::Runtime {
            key: key.clone(),
            source,
        })?;
    volumes.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    Ok(volumes)
}

/// `status` with `running_replicas` (current pods running) and its `detail`: each pod with
/// its state, readiness and volumes, and every volume of the statefulset, those of ordinals
/// past `replicas` marked as kept.
async fn with_detail<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    mut status: ResourceStatus,
    observed: &Observed,
    target: &StatefulTarget<'_>,
) -> Result<ResourceStatus> {
    let actual = &observed.actual;
    status.running_replicas = count_running(actual, target);
    let volumes = list_volumes(ctx, key).await?;
    let volume_ordinal = |volume: &Volume| -> Option<usize> {
        volume.labels.get(labels::REPLICA_ORDINAL)?.parse().ok()
    };
    let mut pods: Vec<(Option<usize>, &Container)> =
        actual.iter().map(|pod| (pod_ordinal(pod), pod)).collect();
    pods.sort_unstable_by_key(|(ordinal, pod)| (*ordinal, pod.name.clone()));
    let pods: Vec<PodDetail> = pods
        .into_iter()
        .map(|(ordinal, pod)| PodDetail {
            ordinal,
            name: pod.name.clone(),
            state: format!("{:?}", pod.state).to_lowercase(),
            current: ordinal.is_some_and(|ordinal| target.is_current(ordinal, pod)),
            ready: observed.is_ready(pod),
            reason: observed.reason(pod).to_owned(),
            volumes: volumes
                .iter()
                .filter(|volume| ordinal.is_some() && volume_ordinal(volume) == ordinal)
                .map(|volume| volume.name.clone())
                .collect(),
        })
        .collect();
    let volumes: Vec<VolumeDetail> = volumes
        .iter()
        .map(|volume| {
            let ordinal = volume_ordinal(volume);
            VolumeDetail {
                name: volume.name.clone(),
                claim: volume.labels.get(labels::CLAIM).cloned(),
                ordinal,
                kept: ordinal.is_none_or(|ordinal| ordinal >= target.n_replicas),
            }
        })
        .collect();
    let ready = actual.iter().filter(|pod| observed.is_ready(pod)).count();
    status.detail = Detail::Statefulset(StatefulsetDetail {
        pods,
        ready_replicas: ready,
        volumes,
    });
    Ok(status)
}

fn count_running(actual: &[Container], target: &StatefulTarget<'_>) -> usize {
    actual
        .iter()
        .filter(|pod| {
            pod.state == ContainerState::Running
                && pod_ordinal(pod).is_some_and(|ordinal| {
                    ordinal < target.n_replicas && target.is_current(ordinal, pod)
                })
        })
        .count()
}
