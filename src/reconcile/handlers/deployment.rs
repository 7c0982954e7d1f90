//! Deployment handler: converge `<scope>-<name>.<rid>` containers on the desired replica
//! count, spec hash and environment, by executing `plan::plan_replicas` steps through the
//! runtime. A replica is current when both its spec hash and its environment digest match,
//! so a config bucket change rolls the replicas the way a spec change does.
//!
//! Invariants: replacements go one slot at a time: a replacement removes one outdated
//! replica, then creates and starts its successor and checks it runs before the next step;
//! missing replicas (first deploy, scale-up) are created and started together, as voodu does
//! (no pause between them), at most `create_concurrency` at once, then checked after one
//! settle time; every replica runs its init containers first; a rollout (a spec hash the
//! latest release does not have) opens a release keyed to the desired commit, runs its
//! `release` hooks once, and closes as succeeded once converged or failed on a permanent
//! error, firing `on_deploy`; a release whose hooks failed is not retried until a newer commit.

use std::collections::BTreeSet;

use futures_util::StreamExt as _;

use super::container::{Identity, Launch, aliases};
use super::hooks;
use super::launch::{
    EnvSource, build_spec, identity_vars, images_of, ready_to_create, run_init_chain, start_error,
};
use crate::manifest::spec::{DeploymentSpec, Spec};
use crate::model::{Kind, ResourceKey, random_hex};
use crate::reconcile::notify::Outcome;
use crate::reconcile::plan::{Step, Target, plan_replicas};
use crate::reconcile::{Ctx, Error, Result, blocking};
use crate::runtime::{Container, ContainerState, Runtime, labels};
use crate::store::{Desired, Release, ReleasePhase, ResourceStatus, now_unix};

use super::container::rfc3339_seconds;

/// Labels that select this agent's replicas of one resource (not its init or release
/// containers, which carry the same kind, scope and name).
pub(super) fn container_filter<'a>(
    agent_id: &'a str,
    key: &'a ResourceKey,
) -> [(&'a str, &'a str); 5] {
    [
        (labels::AGENT, agent_id),
        (labels::KIND, key.kind.as_str()),
        (labels::SCOPE, key.scope.as_str()),
        (labels::NAME, key.name.as_str()),
        (labels::ROLE, key.kind.as_str()),
    ]
}

/// What one reconcile works with.
struct Work<'a> {
    desired: &'a Desired,
    spec: &'a DeploymentSpec,
    release: &'a Release,
    launch: Launch,
}

pub(super) async fn reconcile<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey) -> Result<()> {
    let desired = {
        let key = key.clone();
        blocking(&ctx.store, move |store| store.desired(&key)).await?
    };
    let Some(desired) = desired else {
        return remove_everything(ctx, key).await;
    };
    let Spec::Deployment(spec) = &desired.spec else {
        return Err(Error::Permanent {
            key: key.clone(),
            message: format!("stored spec is a {}, not a deployment", desired.spec.kind()),
        });
    };
    let env_source = EnvSource::load(ctx, &key.scope).await?;
    let (env, env_digest) = env_source.env(ctx, key, &spec.container, identity_vars(key))?;
    let actual = list_replicas(ctx, key).await?;
    let target = Target {
        spec_hash: &desired.spec_hash,
        n_replicas: desired.n_replicas,
        env_digest: Some(&env_digest),
    };
    let steps = plan_replicas(Some(&target), &actual);
    let release = current_release(ctx, &desired).await?;
    let mut status = ResourceStatus {
        phase: "Progressing".to_owned(),
        message: String::new(),
        desired_replicas: desired.n_replicas,
        running_replicas: count_running(&actual, &target),
        spec_hash: desired.spec_hash.to_string(),
        release_id: Some(release.id),
        updated_at: now_unix(),
        detail: serde_json::Value::Null,
    };
    let rollout = steps
        .iter()
        .any(|step| matches!(step, Step::Create | Step::Replace { .. }));
    let mut release = release;
    if release.phase == ReleasePhase::Failed {
        let release_id = release.id;
        let hooks = blocking(&ctx.store, move |store| store.release_hooks(release_id)).await?;
        if hooks::failed_before_rollout(&hooks) {
            // Its hooks failed: the old replicas keep running until a newer commit.
            status.phase = "Failed".to_owned();
            status.message = release.message.clone();
            let key = key.clone();
            return blocking(&ctx.store, move |store| store.put_status(&key, &status)).await;
        }
        if rollout {
            // Another attempt at a rollout that failed (a registry appeared, the agent
            // restarted): a release of its own, so history shows both.
            let retry = desired.clone();
            release = blocking(&ctx.store, move |store| store.begin_release(&retry)).await?;
            status.release_id = Some(release.id);
        }
    }
    let launch = Launch {
        env,
        env_digest: env_digest.clone(),
        ports: spec.ports.clone(),
        restart: spec.effective_restart().to_owned(),
        default_ulimits: ctx.options.default_ulimits.clone(),
        ..Launch::default()
    };
    let work = Work {
        desired: &desired,
        spec,
        release: &release,
        launch,
    };
    let result = async {
        if !rollout && steps.is_empty() {
            return Ok(());
        }
        if rollout {
            let images = images_of(key, &spec.container, &spec.inits, &ctx.assets_root);
            ready_to_create(ctx, key, &spec.container, &images).await?;
            if release.phase == ReleasePhase::Progressing {
                let hook_env = env_source.env(ctx, key, &spec.container, Vec::new())?.0;
                hooks::before_rollout(ctx, key, spec, release.id, &hook_env).await?;
            }
        }
        let taken: BTreeSet<String> = actual
            .iter()
            .map(|container| container.name.clone())
            .collect();
        execute(ctx, &work, &steps, taken, &target, &mut status).await
    }
    .await;
    let actual = list_replicas(ctx, key).await?;
    status.running_replicas = count_running(&actual, &target);
    status.updated_at = now_unix();
    let converged = plan_replicas(Some(&target), &actual).is_empty();
    ctx.router.wake();
    let release_end = match &result {
        Ok(()) if converged => {
            status.phase = "Ready".to_owned();
            status.message.clear();
            (release.phase == ReleasePhase::Progressing)
                .then_some((ReleasePhase::Succeeded, String::new()))
        }
        Ok(()) => {
            status.phase = "Degraded".to_owned();
            status.message = "replicas changed while reconciling; another pass follows".to_owned();
            None
        }
        Err(error) => {
            status.phase = if error.is_transient() {
                "Progressing"
            } else {
                "Failed"
            }
            .to_owned();
            status.message = error.to_string();
            (!error.is_transient() && release.phase == ReleasePhase::Progressing)
                .then(|| (ReleasePhase::Failed, error.to_string()))
        }
    };
    let finished = release_end.clone();
    {
        let key = key.clone();
        let release_id = release.id;
        blocking(&ctx.store, move |store| {
            if let Some((phase, message)) = release_end {
                store.finish_release(release_id, phase, &message)?;
            }
            store.put_status(&key, &status)
        })
        .await?;
    }
    if let Some((phase, message)) = finished {
        if phase == ReleasePhase::Succeeded {
            let hook_env = env_source.env(ctx, key, &spec.container, Vec::new())?.0;
            hooks::after_rollout(ctx, key, spec, release.id, &hook_env).await?;
        }
        let targets = spec.on_deploy.as_ref().map_or_else(Vec::new, |on_deploy| {
            if phase == ReleasePhase::Succeeded {
                on_deploy.success.clone()
            } else {
                on_deploy.failure.clone()
            }
        });
        ctx.notifier.notify(
            Outcome {
                key: key.clone(),
                success: phase == ReleasePhase::Succeeded,
                release_id: release.id.to_string(),
                image: spec.container.effective_image(key),
                started_at: rfc3339_seconds(release.started_at),
                completed_at: rfc3339_seconds(now_unix()),
                error: message,
            },
            targets,
        );
    }
    if converged && result.is_ok() {
        Ok(())
    } else {
        result.and(Err(Error::Transient {
            key: key.clone(),
            message: "not converged yet".to_owned(),
        }))
    }
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

pub(super) async fn list_replicas<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
) -> Result<Vec<Container>> {
    ctx.runtime
        .list(&container_filter(&ctx.agent_id, key))
        .await
        .map_err(|source| Error::Runtime {
            key: key.clone(),
            source,
        })
}

/// The release this reconcile works under: the latest one when it has the desired spec hash,
/// else a new progressing release keyed to the desired commit.
pub(super) async fn current_release<R: Runtime>(
    ctx: &Ctx<R>,
    desired: &Desired,
) -> Result<Release> {
    let desired = desired.clone();
    blocking(&ctx.store, move |store| {
        match store.latest_release(&desired.key)? {
            Some(latest) if latest.spec_hash == desired.spec_hash => Ok(latest),
            _ => {
                let release = store.begin_release(&desired)?;
                tracing::info!(
                    key = %desired.key,
                    commit = desired.commit.short(),
                    spec_hash = desired.spec_hash.short(),
                    release = release.id,
                    "rollout started"
                );
                Ok(release)
            }
        }
    })
    .await
}

async fn execute<R: Runtime>(
    ctx: &Ctx<R>,
    work: &Work<'_>,
    steps: &[Step],
    mut taken: BTreeSet<String>,
    target: &Target<'_>,
    status: &mut ResourceStatus,
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
    for (index, step) in steps.iter().enumerate() {
        match step {
            // The plan lists creates together; they run as one batch at the first of them.
            Step::Create if creates_done => continue,
            Step::Create => {
                creates_done = true;
                let names = create_replicas(ctx, work, n_creates, &mut taken).await?;
                tracing::info!(%key, containers = ?names, "replicas created");
            }
            Step::Start { id, name } => {
                ctx.runtime.start(id).await.map_err(runtime_error)?;
                check_running(ctx, key, std::slice::from_ref(name)).await?;
                tracing::info!(%key, container = %name, "replica started");
            }
            Step::Replace { id, name } => {
                ctx.runtime.remove(id).await.map_err(runtime_error)?;
                let new_name = create_replicas(ctx, work, 1, &mut taken)
                    .await?
                    .into_iter()
                    .next()
                    .unwrap_or_default();
                tracing::info!(%key, old = %name, new = %new_name, slot = index, "replica replaced");
            }
            Step::Remove { id, name } => {
                ctx.runtime.remove(id).await.map_err(runtime_error)?;
                tracing::info!(%key, container = %name, "replica removed");
            }
        }
        // Keep status live during long rollouts: `status` shows progress slot by slot.
        let actual = list_replicas(ctx, key).await?;
        status.running_replicas = count_running(&actual, target);
        status.updated_at = now_unix();
        let snapshot = status.clone();
        let key = key.clone();
        blocking(&ctx.store, move |store| store.put_status(&key, &snapshot)).await?;
    }
    Ok(())
}

/// Creates and starts `n` new replicas concurrently (at most `create_concurrency` at once),
/// each after its init containers, then, after one settle time, checks that each still runs.
/// Replica ids are unique among `taken` names, which grows by the new ones. Returns the new
/// names; on failure, the first error after every create has ended (replicas that did start
/// stay and count next pass).
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
        .map(|identity| create_and_start(ctx, work, identity))
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
    check_running(ctx, key, &names).await?;
    Ok(names)
}

/// Runs one replica's init containers, then creates and starts it; a container that cannot
/// start is removed again.
async fn create_and_start<R: Runtime>(
    ctx: &Ctx<R>,
    work: &Work<'_>,
    identity: &Identity,
) -> Result<String> {
    let key = &work.desired.key;
    let runtime_error = |source| Error::Runtime {
        key: key.clone(),
        source,
    };
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
    let id = ctx
        .runtime
        .create(&container)
        .await
        .map_err(|error| match error {
            crate::runtime::Error::ImageMissing { .. } => Error::Permanent {
                key: key.clone(),
                message: format!("{error}; build or load it on this host"),
            },
            other => runtime_error(other),
        })?;
    if let Err(error) = ctx.runtime.start(&id).await {
        // A created-but-unstartable container would count as a replica: take it away.
        let _ = ctx.runtime.remove(&id).await;
        return Err(start_error(key, &container.name, error));
    }
    Ok(container.name)
}

/// After starts, give the processes `start_settle` to fail fast, then require each running.
pub(super) async fn check_running<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    names: &[String],
) -> Result<()> {
    if !ctx.options.start_settle.is_zero() {
        tokio::time::sleep(ctx.options.start_settle).await;
    }
    let actual = list_replicas(ctx, key).await?;
    for name in names {
        match actual.iter().find(|container| &container.name == name) {
            Some(container) if container.state == ContainerState::Running => {}
            Some(container) => {
                return Err(Error::Transient {
                    key: key.clone(),
                    message: format!(
                        "replica {name} is {:?} right after start; check its command and image",
                        container.state
                    ),
                });
            }
            None => {
                return Err(Error::Transient {
                    key: key.clone(),
                    message: format!("replica {name} vanished right after start"),
                });
            }
        }
    }
    Ok(())
}

fn count_running(actual: &[Container], target: &Target<'_>) -> usize {
    actual
        .iter()
        .filter(|container| {
            container.state == ContainerState::Running && target.is_current(container)
        })
        .count()
}
