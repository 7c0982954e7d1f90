//! The engine seam for one-shot runs (`oneshot.rs`, `job.rs`): what a run is and how it
//! ended (`OneShot`, `Exit`), and its unit's lifecycle, a container or a `replicated-job`
//! service (`swarm/runs.rs`): prepare, create, start, find, list, how it ended, its output,
//! remove, wait. Every `match` on `Engine` about runs is here.

use std::collections::BTreeMap;
use std::time::Duration;

use super::super::container::{Identity, Launch};
use super::super::launch::{build_spec, images_of, ready_to_create};
use crate::manifest::spec::Container as ContainerSpec;
use crate::model::ResourceKey;
use crate::reconcile::{context::Ctx, context::Engine, error::Error, error::Result};
use crate::runtime::{Container, ContainerState, Runtime, labels};

/// One run: what runs, and for how long at most.
pub(in crate::reconcile::handlers) struct OneShot<'a> {
    /// Its unit name, labels and role (`init`, `release`, `job`, `cronjob`).
    pub(in crate::reconcile::handlers) identity: Identity,
    pub(in crate::reconcile::handlers) container: &'a ContainerSpec,
    /// Its environment and command.
    pub(in crate::reconcile::handlers) launch: Launch,
    /// The spec hash a Swarm service carries (`voodu.spec_hash`).
    pub(in crate::reconcile::handlers) spec_hash: &'a str,
    /// The spec's asset digests (asset files a Swarm task mounts become configs).
    pub(in crate::reconcile::handlers) asset_digests: &'a BTreeMap<String, String>,
    /// Labels the unit carries besides its identity's (an init's attempt).
    pub(in crate::reconcile::handlers) labels: BTreeMap<String, String>,
    pub(in crate::reconcile::handlers) timeout: Duration,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::reconcile::handlers) enum Exit {
    Code(i64),
    /// Still running at its deadline: the unit was removed.
    TimedOut,
    /// The engine could not run it (a Swarm task rejected: an image no node has, …).
    Failed(String),
}

impl Exit {
    pub(in crate::reconcile::handlers) fn succeeded(&self) -> bool {
        *self == Exit::Code(0)
    }

    pub(in crate::reconcile::handlers) fn code(&self) -> Option<i64> {
        match self {
            Exit::Code(code) => Some(*code),
            Exit::TimedOut | Exit::Failed(_) => None,
        }
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code(code) => write!(f, "exit code {code}"),
            Exit::TimedOut => f.write_str("timed out"),
            Exit::Failed(message) => write!(f, "could not run: {message}"),
        }
    }
}

/// Before a run's unit is created: its networks exist and its image is present (pulled
/// with the matching registry's credentials when missing).
pub(in crate::reconcile::handlers) async fn prepare_run<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    container: &ContainerSpec,
) -> Result<()> {
    match ctx.options.engine {
        Engine::Docker => {
            let images = images_of(key, container, &[], &ctx.assets_root);
            ready_to_create(ctx, key, container, &images).await
        }
        Engine::Swarm => super::super::swarm::runs::prepare(ctx, key, container).await,
    }
}

/// Creates `run`'s unit; returns its id. A container is only created (`start_unit` starts
/// it); a Swarm service starts its task as it is created.
pub(in crate::reconcile::handlers) async fn create_unit<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    run: &OneShot<'_>,
) -> Result<String> {
    match ctx.options.engine {
        Engine::Docker => {
            let mut spec = build_spec(ctx, key, &run.identity, run.container, &run.launch)?;
            spec.labels.extend(run.labels.clone());
            super::super::launch::create(ctx, key, &spec).await
        }
        Engine::Swarm => {
            super::super::swarm::runs::create(
                ctx,
                key,
                &run.identity,
                run.container,
                &run.launch,
                run.spec_hash,
                run.asset_digests,
            )
            .await
        }
    }
}

/// Starts a created unit (a no-op for a Swarm service, started as it was created).
pub(in crate::reconcile::handlers) async fn start_unit<R: Runtime>(
    ctx: &Ctx<R>,
    id: &str,
) -> crate::runtime::Result<()> {
    match ctx.options.engine {
        Engine::Docker => ctx.runtime.start(id).await,
        Engine::Swarm => Ok(()),
    }
}

/// This agent's run units of `key` in the resource's own role (a job's or cronjob's runs),
/// as containers named as their runs.
pub(in crate::reconcile::handlers) async fn list_runs<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
) -> Result<Vec<Container>> {
    match ctx.options.engine {
        Engine::Docker => super::super::replicas::list_replicas(ctx, key).await,
        Engine::Swarm => super::super::swarm::runs::list(ctx, key).await,
    }
}

/// This agent's unit of `key` called `name` (the run's container name), if any.
pub(in crate::reconcile::handlers) async fn find_unit<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    name: &str,
) -> Result<Option<Container>> {
    let filter = [
        (labels::AGENT, ctx.agent_id.as_str()),
        (labels::SCOPE, key.scope.as_str()),
    ];
    match ctx.options.engine {
        Engine::Docker => Ok(ctx
            .runtime
            .list(&filter)
            .await
            .map_err(Error::runtime(key))?
            .into_iter()
            .find(|container| container.name == name)),
        Engine::Swarm => super::super::swarm::runs::find(ctx, key, &filter, name).await,
    }
}

/// The release hook units of deployment `key`, as containers named as their runs:
/// containers labelled as voodu's release steps (`voodu.name=<name>-release`, role
/// `release`), or under Swarm the deployment's services in role `release`.
pub(in crate::reconcile::handlers) async fn release_units<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
) -> Result<Vec<Container>> {
    match ctx.options.engine {
        Engine::Docker => {
            let release_name = format!("{}-release", key.name);
            ctx.runtime
                .list(&[
                    (labels::AGENT, ctx.agent_id.as_str()),
                    (labels::SCOPE, key.scope.as_str()),
                    (labels::NAME, release_name.as_str()),
                    (labels::ROLE, "release"),
                ])
                .await
                .map_err(Error::runtime(key))
        }
        Engine::Swarm => super::super::swarm::runs::in_role(ctx, key, "release").await,
    }
}

/// How an ended unit exited.
pub(in crate::reconcile::handlers) async fn outcome<R: Runtime>(
    ctx: &Ctx<R>,
    id: &str,
) -> crate::runtime::Result<Exit> {
    Ok(match ctx.options.engine {
        Engine::Docker => ctx.runtime.inspect(id).await?.exit_code.map_or_else(
            || Exit::Failed("the engine reports no exit code".to_owned()),
            Exit::Code,
        ),
        Engine::Swarm => match super::super::swarm::runs::outcome(ctx.runtime.as_ref(), id).await {
            Ok(Some(code)) => Exit::Code(code),
            Ok(None) => Exit::Failed("its task has not ended".to_owned()),
            Err(error) => Exit::Failed(error.to_string()),
        },
    })
}

/// When the engine says a unit finished (Unix seconds), if it did.
pub(in crate::reconcile::handlers) async fn finished_at<R: Runtime>(
    ctx: &Ctx<R>,
    id: &str,
) -> Option<i64> {
    match ctx.options.engine {
        Engine::Docker => {
            let inspection = ctx.runtime.inspect(id).await.ok()?;
            let finished = chrono::DateTime::parse_from_rfc3339(&inspection.finished_at).ok()?;
            // An engine reports the zero time (year 1) for a container that never finished.
            Some(finished.timestamp()).filter(|unix| *unix > 0)
        }
        Engine::Swarm => super::super::swarm::runs::finished_at(ctx, id).await,
    }
}

/// The last `lines` lines of a unit's output; empty when the engine cannot say.
pub(in crate::reconcile::handlers) async fn logs<R: Runtime>(
    ctx: &Ctx<R>,
    id: &str,
    lines: usize,
) -> String {
    match ctx.options.engine {
        Engine::Docker => ctx.runtime.logs(id, lines).await,
        Engine::Swarm => super::super::swarm::runs::logs(ctx, id, lines).await,
    }
    .unwrap_or_default()
}

/// Removes a unit (its container, or its service); a missing one is removed.
pub(in crate::reconcile::handlers) async fn remove_unit<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    id: &str,
) -> Result<()> {
    match ctx.options.engine {
        Engine::Docker => {
            // Its destroy event is no drift.
            ctx.memory.own_removals.note(id);
            ctx.runtime.remove(id).await
        }
        Engine::Swarm => ctx.runtime.remove_service(id).await,
    }
    .map_err(Error::runtime(key))
}

/// The engine's wait for a unit to end: its exit code (a waiter's, never a pass's).
pub(in crate::reconcile::handlers) async fn wait_unit<R: Runtime>(
    runtime: &R,
    engine: Engine,
    timer: &crate::reconcile::run::timer::Timer,
    id: &str,
) -> crate::runtime::Result<i64> {
    match engine {
        Engine::Docker => runtime.wait(id).await,
        Engine::Swarm => super::super::swarm::runs::wait(runtime, timer, id).await,
    }
}

/// Whether a unit the engine lists as `state` still has to be started (a container created
/// by an agent stopped before it started it; a service's task starts by itself).
pub(in crate::reconcile::handlers) fn needs_start<R: Runtime>(
    ctx: &Ctx<R>,
    state: ContainerState,
) -> bool {
    match ctx.options.engine {
        Engine::Docker => state == ContainerState::Created,
        Engine::Swarm => false,
    }
}
