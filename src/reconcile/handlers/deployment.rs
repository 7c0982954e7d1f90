//! Deployment handler: converge `<scope>-<name>.<rid>` containers on the desired replica
//! count (the autoscaler's, while `autoscale {}` is set), spec hash and environment, by
//! executing the health-gated steps of `plan::plan_replicas` through the runtime. A replica is
//! current when both its spec hash and its environment digest match, so a config bucket
//! change rolls the replicas the way a spec change does.
//!
//! Each pass is level-triggered: observe (replicas, their readiness), decide (`plan` then
//! `gate`), act, observe again, record. A rollout therefore spans passes: a pass replaces one
//! slot and returns; the new replica's readiness (published by the probes) queues the next
//! pass, which replaces the next slot. A newer commit simply makes the next pass work towards
//! the newer spec (its release supersedes the one in flight).
//!
//! Invariants: replacements go one slot at a time and only once every current replica is
//! ready (`gate`); missing replicas (first deploy, scale-up) are created and started together,
//! at most `create_concurrency` at once; every replica runs its init containers first; a
//! rollout (a spec hash the latest release does not have) opens a release keyed to the desired
//! commit, runs its `release` hooks once before touching replicas, and ends succeeded once
//! converged with every replica ready, or failed on its deadline, a crash-looping new replica
//! or a permanent error, and is then rolled back automatically (`rollout`); a crashed replica
//! is started again with a back-off (`gate::CrashLoops`), and status says so.

use std::collections::BTreeSet;

use futures_util::StreamExt as _;

use super::container::{Identity, Launch, aliases};
use super::hooks;
use super::launch::{
    EnvSource, build_spec, create_and_start, identity_vars, images_of, ready_to_create,
    run_init_chain,
};
use super::replicas::{
    BackingOff, Observed, fail_rollout, inspect_waiting, not_done, observe, put_status,
    rollout_failure, start_again,
};
use super::rollout::{self, Report};
use crate::manifest::spec::{DeploymentSpec, Spec};
use crate::model::{Kind, ResourceKey, random_hex};
use crate::reconcile::gate;
use crate::reconcile::plan::{Step, Target, plan_replicas};
use crate::reconcile::{Ctx, Error, Result, blocking};
use crate::runtime::{Container, ContainerState, Runtime, labels};
use crate::store::{
    DeploymentDetail, Desired, Detail, FailureReason, Phase, Release, ReleasePhase, ReplicaDetail,
    ResourceStatus,
};

/// What one reconcile works with.
struct Work<'a> {
    desired: &'a Desired,
    spec: &'a DeploymentSpec,
    release: &'a Release,
    launch: Launch,
}

pub(super) async fn reconcile<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey) -> Result<()> {
    let desired = super::desired_of(ctx, key).await?;
    let Some(desired) = desired else {
        return remove_everything(ctx, key).await;
    };
    let Spec::Deployment(spec) = &desired.spec else {
        return Err(super::wrong_kind(key, &desired.spec));
    };
    let env_source = EnvSource::load(ctx, &key.scope).await?;
    let (env, env_digest) = env_source.env(ctx, key, &spec.container, identity_vars(key))?;
    let target = Target {
        spec_hash: &desired.spec_hash,
        n_replicas: desired.n_replicas,
        env_digest: Some(&env_digest),
    };
    let is_current = |container: &Container| target.is_current(container);
    let report = Report {
        key,
        on_deploy: spec.on_deploy.as_ref(),
        image: spec.container.effective_image(key),
    };
    let mut release = rollout::current_release(ctx, &desired).await?;
    let observed = observe(ctx, key, is_current).await?;
    let steps = plan_replicas(Some(&target), &observed.actual);
    let touches_replicas = steps
        .iter()
        .any(|step| matches!(step, Step::Create | Step::Replace { .. }));
    let mut status = ResourceStatus {
        desired_replicas: desired.n_replicas,
        spec_hash: desired.spec_hash.to_string(),
        release_id: Some(release.id),
        ..ResourceStatus::new(Phase::Progressing, "")
    };
    let halted = rollout::halted(ctx, &release, &desired).await?;
    if release.phase == ReleasePhase::Failed && !halted && touches_replicas {
        // It failed before touching replicas (its image): another attempt once the image can
        // be had; until then the old replicas run on and nothing new is recorded.
        match rollout::retry_failed(ctx, &release, &desired, &spec.container, &spec.inits).await {
            Ok(retry) => {
                release = retry;
                status.release_id = Some(release.id);
            }
            Err(error) => {
                status.phase = Phase::Failed;
                status.reason = Some(error.reason());
                status.message = error.to_string();
                put_status(ctx, key, with_detail(status, &observed, &target, &desired)).await?;
                return if error.is_transient() {
                    Err(error)
                } else {
                    Ok(())
                };
            }
        }
    }
    let progressing = release.phase == ReleasePhase::Progressing;

    // Before the first replica of a rollout is touched: the image, then the release hooks.
    if progressing && touches_replicas {
        let prepared = async {
            let images = images_of(key, &spec.container, &spec.inits, &ctx.assets_root);
            ready_to_create(ctx, key, &spec.container, &images).await?;
            let hook_env = env_source.env(ctx, key, &spec.container, Vec::new())?.0;
            hooks::before_rollout(ctx, key, spec, release.id, &hook_env).await
        }
        .await;
        if let Err(error) = prepared {
            status.message = error.to_string();
            let status = with_detail(status, &observed, &target, &desired);
            if error.is_transient() {
                put_status(ctx, key, status).await?;
                return Err(error);
            }
            rollout::fail_before_rollout(ctx, &release, &error.to_string(), &report).await?;
            return put_status(
                ctx,
                key,
                ResourceStatus {
                    phase: Phase::Failed,
                    reason: Some(error.reason()),
                    ..status
                },
            )
            .await;
        }
    }

    // A rollout that ran out of time, or whose new replica keeps crashing, is rolled back.
    let new_replicas = inspect_waiting(ctx, &observed, &release).await;
    if let Some((failure, reason)) =
        rollout_failure(ctx, &release, steps.is_empty(), &observed, &new_replicas)
    {
        let status = with_detail(status, &observed, &target, &desired);
        return fail_rollout(ctx, &release, (failure, &reason), &report, status).await;
    }

    // Act on what the health gate lets through; a halted resource is repaired (removals,
    // starts, creates) but never rolled.
    let mut now_steps = gate::gate(
        steps,
        &observed.waiting,
        &observed.ready_names(),
        desired.n_replicas,
    );
    if halted {
        now_steps.retain(|step| !matches!(step, Step::Replace { .. }));
    }
    let launch = Launch {
        env,
        env_digest: env_digest.clone(),
        ports: spec.ports.clone(),
        restart: spec.effective_restart().to_owned(),
        default_ulimits: ctx.default_ulimits.clone(),
        probes: spec.probes.clone(),
        ..Launch::default()
    };
    let work = Work {
        desired: &desired,
        spec,
        release: &release,
        launch,
    };
    let taken: BTreeSet<String> = observed
        .actual
        .iter()
        .map(|container| container.name.clone())
        .collect();
    let mut backing_off = BackingOff::new();
    let result = execute(ctx, &work, &now_steps, taken, &mut backing_off).await;
    let observed = observe(ctx, key, is_current).await?;
    ctx.router.wake();
    if let Err(error) = result {
        status.message = error.to_string();
        if progressing {
            ctx.memory
                .rollouts
                .note_error(release.id, status.message.clone());
        }
        let status = with_detail(status, &observed, &target, &desired);
        if !error.is_transient() && progressing {
            return fail_rollout(
                ctx,
                &release,
                (error.reason(), &error.to_string()),
                &report,
                status,
            )
            .await;
        }
        let phase = if error.is_transient() {
            Phase::Progressing
        } else {
            Phase::Failed
        };
        put_status(
            ctx,
            key,
            ResourceStatus {
                phase,
                reason: Some(error.reason()),
                ..status
            },
        )
        .await?;
        return Err(error);
    }
    let converged = plan_replicas(Some(&target), &observed.actual).is_empty();
    if !halted && converged && observed.waiting.is_empty() {
        status.phase = Phase::Ready;
        if release.rolled_back_from.is_some() {
            // Running a rollback (automatic or the operator's): status keeps saying why.
            status.message.clone_from(&release.message);
        }
        if progressing {
            let hook_env = env_source.env(ctx, key, &spec.container, Vec::new())?.0;
            let note = hooks::after_rollout(ctx, key, spec, release.id, &hook_env).await?;
            rollout::succeed(ctx, &release, &report, &note).await?;
        }
    } else {
        not_done(
            ctx,
            key,
            &mut status,
            &observed,
            &new_replicas,
            &backing_off,
            progressing && !halted,
        );
        if halted {
            // Halted until desired state changes: repaired (removals, starts, creates), never
            // rolled, and status says why.
            status.phase = Phase::Failed;
            status.reason = Some(FailureReason::Halted);
            status.message.clone_from(&release.message);
        }
    }
    put_status(ctx, key, with_detail(status, &observed, &target, &desired)).await
}

/// `status` with the replica counts and readiness of `observed` (`running_replicas`: current
/// ones running) and, while autoscaled, the autoscaler's count.
fn with_detail(
    mut status: ResourceStatus,
    observed: &Observed,
    target: &Target<'_>,
    desired: &Desired,
) -> ResourceStatus {
    status.running_replicas = observed
        .actual
        .iter()
        .filter(|container| {
            target.is_current(container) && container.state == ContainerState::Running
        })
        .count();
    let replicas: Vec<ReplicaDetail> = observed
        .actual
        .iter()
        .map(|container| ReplicaDetail {
            name: container.name.clone(),
            current: target.is_current(container),
            state: format!("{:?}", container.state).to_lowercase(),
            ready: observed.is_ready(container),
            reason: observed.reason(container).to_owned(),
        })
        .collect();
    let ready = observed
        .actual
        .iter()
        .filter(|container| observed.is_ready(container))
        .count();
    status.detail = Detail::Deployment(DeploymentDetail {
        autoscaled_replicas: desired.replicas_override,
        ready_replicas: ready,
        replicas,
    });
    status
}

/// The resource left the repo: every container of it goes (replicas, init and release
/// containers), then its status.
async fn remove_everything<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey) -> Result<()> {
    let runtime_error = |source| Error::Runtime {
        key: key.clone(),
        source,
    };
    let release_name = format!("{}-release", key.name);
    let mut owned = ctx
        .runtime
        .list(&[
            (labels::AGENT, ctx.agent_id.as_str()),
            (labels::KIND, key.kind.as_str()),
            (labels::SCOPE, key.scope.as_str()),
            (labels::NAME, key.name.as_str()),
        ])
        .await
        .map_err(runtime_error)?;
    owned.extend(
        ctx.runtime
            .list(&[
                (labels::AGENT, ctx.agent_id.as_str()),
                (labels::SCOPE, key.scope.as_str()),
                (labels::NAME, release_name.as_str()),
                (labels::ROLE, "release"),
            ])
            .await
            .map_err(runtime_error)?,
    );
    for container in &owned {
        tracing::info!(%key, container = %container.name, "removing: resource left the repo");
        ctx.runtime
            .remove(&container.id)
            .await
            .map_err(runtime_error)?;
    }
    let key = key.clone();
    let names: Vec<String> = owned.into_iter().map(|container| container.name).collect();
    blocking(&ctx.store, move |store| {
        store.forget_readiness(&names)?;
        store.delete_status(&key)
    })
    .await?;
    ctx.router.wake();
    Ok(())
}

/// Runs the gated steps. Crashed replicas whose back-off is still running are skipped and
/// listed in `backing_off`.
async fn execute<R: Runtime>(
    ctx: &Ctx<R>,
    work: &Work<'_>,
    steps: &[Step],
    mut taken: BTreeSet<String>,
    backing_off: &mut BackingOff,
) -> Result<()> {
    let key = &work.desired.key;
    let runtime_error = |source| Error::Runtime {
        key: key.clone(),
        source,
    };
    let n_creates = steps
        .iter()
        .filter(|step| matches!(step, Step::Create))
        .count();
    let mut creates_done = false;
    for step in steps {
        match step {
            // The plan lists creates together; they run as one batch at the first of them.
            Step::Create if creates_done => {}
            Step::Create => {
                creates_done = true;
                let names = create_replicas(ctx, work, n_creates, &mut taken).await?;
                tracing::info!(%key, containers = ?names, "replicas created");
            }
            Step::Start { id, name } => start_again(ctx, key, id, name, backing_off).await?,
            Step::Replace { id, name } => {
                ctx.runtime.remove(id).await.map_err(runtime_error)?;
                let new_name = create_replicas(ctx, work, 1, &mut taken)
                    .await?
                    .into_iter()
                    .next()
                    .unwrap_or_default();
                tracing::info!(%key, old = %name, new = %new_name, "replica replaced");
            }
            Step::Remove { id, name } => {
                ctx.runtime.remove(id).await.map_err(runtime_error)?;
                tracing::info!(%key, container = %name, "replica removed");
            }
        }
    }
    Ok(())
}

/// Creates and starts `n` new replicas concurrently (at most `create_concurrency` at once),
/// each after its init containers; their readiness is the gate's business. Replica ids are
/// unique among `taken` names, which grows by the new ones. Returns the new names; on
/// failure, the first error after every create has ended (replicas that did start stay and
/// count next pass).
async fn create_replicas<R: Runtime>(
    ctx: &Ctx<R>,
    work: &Work<'_>,
    n: usize,
    taken: &mut BTreeSet<String>,
) -> Result<Vec<String>> {
    let key = &work.desired.key;
    let mut identities = Vec::with_capacity(n);
    while identities.len() < n {
        let replica_id = random_hex(2);
        let name = format!("{}.{replica_id}", key.app_id());
        if taken.insert(name.clone()) {
            identities.push(Identity {
                name,
                kind: Kind::Deployment,
                role: Kind::Deployment.as_str().to_owned(),
                name_label: key.name.clone(),
                replica_id,
                ordinal: None,
                spec_hash: Some(work.desired.spec_hash.to_string()),
                release_id: Some(work.release.id.to_string()),
                aliases: aliases(key, None),
            });
        }
    }
    // Collected first: a lazy `map` closure inside the stream makes the handler future's
    // lifetimes too general for `spawn`.
    let creates: Vec<_> = identities
        .iter()
        .map(|identity| create_replica(ctx, work, identity))
        .collect();
    let results: Vec<Result<String>> = futures_util::stream::iter(creates)
        .buffer_unordered(ctx.options.create_concurrency.max(1))
        .collect()
        .await;
    let mut names = Vec::with_capacity(n);
    let mut first_error = None;
    for result in results {
        match result {
            Ok(name) => names.push(name),
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    if let Some(error) = first_error {
        return Err(error);
    }
    Ok(names)
}

/// Runs one replica's init containers, then creates and starts it; a container that cannot
/// start is removed again.
async fn create_replica<R: Runtime>(
    ctx: &Ctx<R>,
    work: &Work<'_>,
    identity: &Identity,
) -> Result<String> {
    let key = &work.desired.key;
    run_init_chain(
        ctx,
        key,
        identity,
        &work.spec.container,
        &work.launch,
        &work.spec.inits,
    )
    .await?;
    let container = build_spec(ctx, key, identity, &work.spec.container, &work.launch)?;
    create_and_start(ctx, key, &container).await?;
    Ok(container.name)
}
