//! A deployment under Docker Swarm: one replicated service `<scope>-<name>`, driven by the
//! one replicated pass (`replicated.rs`) through the `Replicated` trait, as the container
//! deployment is.
//!
//! Plan (`plan::plan_service`): create; update when the spec changed (Swarm's rolling update
//! replaces one task at a time: start-first, stop-first with a pinned host port, each new
//! task monitored for the readiness window, a failed one rolled back by Swarm); scale when
//! only `replicas` differs (no task replaced); wait while Swarm converges. The service's
//! live tasks are the replicas (current: their spec hash and env digest match), ready once
//! running for the settle time. When Swarm rolls the update of this release back, the pass
//! gives up: the release fails with Swarm's reason and the failed task's error, and the
//! automatic rollback to the last succeeded release runs as on containers.
//!
//! Release hooks run as on containers (`hooks.rs`), each as a `replicated-job` service of
//! the deployment in role `release` (`runs::run_hook`): `pre_command` and `command` before
//! the service is created or updated, `post_command` once the update converged.
//!
//! Invariants: one service per deployment, found by its labels and role (a hook service is
//! never a replica); the release id is a service label, never in the task template, so a
//! new release with the same spec replaces no task; `on_deploy`, releases and pins are the
//! pass's, unchanged.

use super::super::container::{Identity, aliases};
use super::super::deployment::Deployment;
use super::super::hooks::HookSet;
use super::super::launch::EnvSource;
use super::super::replicas::{Observed, Waits};
use super::super::replicated::{self, Replicated};
use super::super::rollout::Report;
use super::{Built, Shape, build_service, observe_services, observed};
use crate::manifest::spec::{Container as ContainerSpec, Init};
use crate::model::{Kind, ResourceKey};
use crate::reconcile::plan::gate::NewReplica;
use crate::reconcile::plan::{ServiceStep, ServiceTarget, plan_service};
use crate::reconcile::{context::Ctx, error::Result, run::action::Action};
use crate::runtime::{Container, Runtime, ServiceMode, TaskState, labels};
use crate::store::{FailureReason, Release, ResourceStatus};

pub(in crate::reconcile::handlers) async fn reconcile<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
) -> Result<Action> {
    let Some(desired) = super::desired_to_apply(ctx, key, remove(ctx, key)).await? else {
        return Ok(Action::Done);
    };
    let spec = spec_of!(key, desired, Deployment);
    let deployment = SwarmDeployment {
        inner: Deployment::new(&desired, spec),
        built: None,
    };
    replicated::pass(ctx, &desired, deployment).await
}

/// The deployment left the repo: its service goes (Swarm stops the tasks with their grace),
/// with any release hook service left behind, then its status.
async fn remove<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey) -> Result<()> {
    let services =
        super::list_leftovers(ctx, key, &super::owned_filter(&ctx.agent_id, key)).await?;
    super::remove_leftovers(
        ctx,
        key,
        services,
        "removing the service: resource left the repo",
    )
    .await
}

/// The container deployment (environment, target, report, hooks) and the service it
/// becomes.
struct SwarmDeployment<'a> {
    inner: Deployment<'a>,
    /// Set by `build`.
    built: Option<Built>,
}

impl SwarmDeployment<'_> {
    fn built(&self) -> Option<&Built> {
        self.built.as_ref()
    }

    fn service_target(&self) -> Option<ServiceTarget<'_>> {
        let built = self.built()?;
        Some(ServiceTarget {
            digest: &built.digest,
            replicas: u64::try_from(self.inner.desired.n_replicas).unwrap_or(0),
            spec_hash: self.inner.desired.spec_hash.as_str(),
            env_digest: &self.inner.launch.env_digest,
        })
    }

    /// Whether a task (or the service's template) with `labels` is of the target.
    fn task_is_current(&self, labels: &std::collections::BTreeMap<String, String>) -> bool {
        self.service_target()
            .is_some_and(|target| target.is_current(labels))
    }
}

impl<R: Runtime> Replicated<R> for SwarmDeployment<'_> {
    type Step = ServiceStep;

    fn build(&mut self, ctx: &Ctx<R>, env_source: &EnvSource) -> Result<()> {
        <Deployment<'_> as Replicated<R>>::build(&mut self.inner, ctx, env_source)?;
        // Swarm restarts a replica's task whatever its exit (`restart` is not sent).
        self.inner.launch.restart.clear();
        let (desired, spec) = (self.inner.desired, self.inner.spec);
        let key = &desired.key;
        let container = &spec.container;
        let identity = Identity {
            name: key.app_id(),
            kind: Kind::Deployment,
            role: Kind::Deployment.as_str().to_owned(),
            name_label: key.name.clone(),
            replica_id: "swarm".to_owned(),
            ordinal: None,
            spec_hash: Some(desired.spec_hash.to_string()),
            release_id: None,
            aliases: aliases(key, None),
        };
        let replicas = u64::try_from(desired.n_replicas).unwrap_or(0);
        self.built = Some(build_service(
            ctx,
            key,
            &identity,
            container,
            &self.inner.launch,
            Shape {
                mode: ServiceMode::Replicated { replicas },
                probes: spec.probes.as_deref(),
                drain: spec.drain.as_ref(),
                stop_first: false,
                constraints: Vec::new(),
                asset_digests: &spec.asset_digests,
                labels: std::collections::BTreeMap::new(),
                volume_labels: std::collections::BTreeMap::new(),
            },
        )?);
        Ok(())
    }

    fn set_release(&mut self, release: &Release) {
        if let Some(built) = &mut self.built {
            built
                .spec
                .labels
                .insert(labels::RELEASE_ID.to_owned(), release.id.to_string());
        }
    }

    fn is_current(&self, container: &Container) -> bool {
        self.service_target()
            .is_some_and(|target| target.is_current(&container.labels))
    }

    async fn observe(&self, ctx: &Ctx<R>, key: &ResourceKey) -> Result<Observed> {
        let seen = observe_services(ctx, key).await?;
        let app = key.app_id();
        Ok(observed(
            seen,
            ctx.options.ready_settle,
            |task| {
                format!(
                    "{app}.{}.{}",
                    task.slot.unwrap_or(0),
                    &task.id[..task.id.len().min(8)]
                )
            },
            |container| <Self as Replicated<R>>::is_current(self, container),
        ))
    }

    fn plan(&self, observed: &Observed) -> Vec<ServiceStep> {
        let Some(target) = self.service_target() else {
            return Vec::new();
        };
        let seen = observed.swarm.as_ref();
        plan_service(
            &target,
            seen.and_then(|seen| seen.services.first()),
            seen.map_or(&[][..], |seen| &seen.tasks),
        )
    }

    fn touches(step: &ServiceStep) -> bool {
        matches!(step, ServiceStep::Create | ServiceStep::Update)
    }

    fn is_replace(step: &ServiceStep) -> bool {
        matches!(step, ServiceStep::Update)
    }

    fn gate(&self, steps: Vec<ServiceStep>, _observed: &Observed) -> Vec<ServiceStep> {
        // Swarm gates its own rolling update (parallelism 1, the monitor window).
        steps
    }

    fn release_hooks(&self) -> Option<HookSet<'_>> {
        <Deployment<'_> as Replicated<R>>::release_hooks(&self.inner)
    }

    swarm_kind!(lost_nodes: "Swarm reschedules their tasks");
}

/// The current tasks still waiting, each with the failed tasks of its slot of this
/// release's version as restarts.
pub(super) fn new_replicas(
    observed: &Observed,
    release: &Release,
    is_current: impl Fn(&std::collections::BTreeMap<String, String>) -> bool,
) -> Vec<NewReplica> {
    let Some(seen) = &observed.swarm else {
        return Vec::new();
    };
    observed
        .waiting
        .iter()
        .filter_map(|waiting| {
            let container = observed
                .actual
                .iter()
                .find(|container| container.name == waiting.name)?;
            let task = seen.tasks.iter().find(|task| task.id == container.id)?;
            let restarts = seen
                .tasks
                .iter()
                .filter(|other| {
                    other.service_id == task.service_id
                        && other.slot == task.slot
                        && other.state == TaskState::Failed
                        && is_current(&other.labels)
                        && other.since >= release.started_at
                })
                .count();
            Some(NewReplica {
                name: waiting.name.clone(),
                this_release: task.since >= release.started_at,
                restarts: u32::try_from(restarts).unwrap_or(u32::MAX),
                last_exit_code: None,
            })
        })
        .collect()
}

/// Whether Swarm gave up on an update made for `release`: rolled back (or paused) after the
/// release began, away from what the release runs (a rollback release that Swarm's own
/// rollback already brought back is not failed by it). The reason names Swarm's state and
/// message and the failed task's error.
pub(super) fn swarm_gave_up(
    observed: &Observed,
    release: &Release,
    is_current: impl Fn(&std::collections::BTreeMap<String, String>) -> bool,
) -> Option<(FailureReason, String)> {
    let seen = observed.swarm.as_ref()?;
    let (service, update) = seen.services.iter().find_map(|service| {
        let update = service.update.as_ref()?;
        (update.state.failed()
            && update.started_at >= release.started_at
            && !is_current(&service.task_labels))
        .then_some((service, update))
    })?;
    let failed = seen
        .tasks
        .iter()
        .filter(|task| {
            task.service_id == service.id
                && matches!(task.state, TaskState::Failed | TaskState::Rejected)
                && is_current(&task.labels)
        })
        .max_by_key(|task| task.since);
    let task = failed.map_or_else(String::new, |task| {
        format!(
            "; task {} {}: {}",
            task.slot
                .map_or_else(String::new, |slot| format!("slot {slot}")),
            task.state.as_str(),
            if task.error.is_empty() {
                &task.message
            } else {
                &task.error
            }
        )
    });
    Some((
        FailureReason::SwarmRollback,
        format!(
            "Docker Swarm gave up on the update of service {} ({}: {}){task}",
            service.name,
            update.state.as_str(),
            update.message
        ),
    ))
}

async fn execute<R: Runtime>(
    ctx: &Ctx<R>,
    work: &SwarmDeployment<'_>,
    steps: &[ServiceStep],
    observed: &Observed,
) -> Result<()> {
    let key = &work.inner.desired.key;
    let Some(built) = work.built() else {
        return Ok(());
    };
    let service = observed
        .swarm
        .as_ref()
        .and_then(|seen| seen.services.first());
    for step in steps {
        match (step, service) {
            (ServiceStep::Wait(_), _) => {}
            (ServiceStep::Create, _) => {
                let (spec, _) = super::create_service(ctx, key, built).await?;
                tracing::info!(%key, service = %spec.name, "service created");
            }
            (ServiceStep::Update | ServiceStep::Scale { .. }, Some(service)) => {
                let spec = super::update_service(ctx, key, service, built).await?;
                match step {
                    ServiceStep::Scale { from, to } => {
                        tracing::info!(%key, service = %spec.name, from, to, "service scaled");
                    }
                    _ => {
                        tracing::info!(%key, service = %spec.name, "service updated: Swarm rolls its tasks")
                    }
                }
                super::remove_stale_configs(ctx, &built.assets).await;
            }
            (ServiceStep::Update | ServiceStep::Scale { .. }, None) => {}
        }
    }
    Ok(())
}
