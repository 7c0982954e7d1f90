//! The one run mechanism: a one-shot unit — a container, or under Docker Swarm a
//! `replicated-job` service (`swarm/runs.rs`) — that a pass starts and never waits for. Init
//! container attempts, release hooks, job runs and cronjob runs all go through it: the pass
//! starts the unit (`start`), a waiter on `ctx.runs` watches it (`watch`), and the pass
//! returns; the unit's exit or its deadline makes the waiter requeue the key, and the next
//! pass reads where the run stands (`stand`) and moves on. Only this file (and
//! `swarm/runs.rs` under it) knows which engine runs the unit.
//!
//! Invariants: a worker is held for engine calls only, never for a unit's life; waiters never
//! create, stop or remove a unit (the pass holding the key does: a unit past its deadline is
//! removed by the next pass, `stand`); a unit's deadline is counted from its
//! `voodu.created_at` label, so an agent restarted in the middle of a run gives it only
//! what is left; a leftover unit of the same name is removed before a new one starts.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::container::{Identity, Launch};
use super::launch::{build_spec, create_and_start};
use crate::manifest::spec::Container as ContainerSpec;
use crate::model::ResourceKey;
use crate::reconcile::{Ctx, Engine, Error, Result};
use crate::runtime::{ContainerState, Runtime, labels};
use crate::store::now_unix;

/// Pause before asking an unavailable engine again about a unit.
const ENGINE_RETRY: Duration = Duration::from_secs(2);

/// One run: what runs, and for how long at most.
pub(super) struct OneShot<'a> {
    /// Its unit name, labels and role (`init`, `release`, `job`, `cronjob`).
    pub(super) identity: Identity,
    pub(super) container: &'a ContainerSpec,
    /// Its environment and command.
    pub(super) launch: Launch,
    /// The spec hash a Swarm service carries (`voodu.spec_hash`).
    pub(super) spec_hash: &'a str,
    /// The spec's asset digests (asset files a Swarm task mounts become configs).
    pub(super) asset_digests: &'a BTreeMap<String, String>,
    /// Labels the unit carries besides its identity's (an init's attempt).
    pub(super) labels: BTreeMap<String, String>,
    pub(super) timeout: Duration,
}

/// Where a run stands, as its unit says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Stand {
    /// It runs; its waiter requeues the key when it ends or its deadline passes.
    Running,
    /// It ended; its unit is still there (output can be read) unless it timed out.
    Ended {
        id: String,
        exit: Exit,
        /// The unit's `voodu.attempt` label (1 when it has none).
        attempt: u32,
    },
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Exit {
    Code(i64),
    /// Still running at its deadline: the unit was removed.
    TimedOut,
    /// The engine could not run it (a Swarm task rejected: an image no node has, …).
    Failed(String),
}

impl Exit {
    pub(super) fn succeeded(&self) -> bool {
        *self == Exit::Code(0)
    }

    pub(super) fn code(&self) -> Option<i64> {
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

fn runtime_error(key: &ResourceKey) -> impl Fn(crate::runtime::Error) -> Error + '_ {
    move |source| Error::Runtime {
        key: key.clone(),
        source,
    }
}

/// Starts `run`'s unit (a leftover of the same name removed first) and watches it for
/// `run.timeout`; returns its id. Does not wait for it.
pub(super) async fn start<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    run: &OneShot<'_>,
) -> Result<String> {
    let name = &run.identity.name;
    remove_named(ctx, key, name).await?;
    let id = match ctx.options.engine {
        Engine::Containers => {
            let mut spec = build_spec(ctx, key, &run.identity, run.container, &run.launch)?;
            spec.labels.extend(run.labels.clone());
            create_and_start(ctx, key, &spec).await?
        }
        Engine::Swarm => {
            super::swarm::runs::create(
                ctx,
                key,
                &run.identity,
                run.container,
                &run.launch,
                run.spec_hash,
                run.asset_digests,
            )
            .await?
        }
    };
    watch(ctx, key, &id, Some(run.timeout));
    Ok(id)
}

/// A unit as found by name.
struct Unit {
    id: String,
    state: ContainerState,
    labels: BTreeMap<String, String>,
}

/// This agent's unit of `key` called `name` (under Swarm, the run's service).
async fn find<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey, name: &str) -> Result<Option<Unit>> {
    let filter = [
        (labels::AGENT, ctx.agent_id.as_str()),
        (labels::SCOPE, key.scope.as_str()),
    ];
    Ok(match ctx.options.engine {
        Engine::Containers => ctx
            .runtime
            .list(&filter)
            .await
            .map_err(runtime_error(key))?
            .into_iter()
            .find(|container| container.name == name)
            .map(|container| Unit {
                id: container.id,
                state: container.state,
                labels: container.labels,
            }),
        Engine::Swarm => super::swarm::runs::find(ctx, key, &filter, name)
            .await?
            .map(|container| Unit {
                id: container.id,
                state: container.state,
                labels: container.labels,
            }),
    })
}

/// The release hook units of deployment `key`, as (id, run name): containers labelled as
/// voodu's release steps (`voodu.name=<name>-release`, role `release`), or under Swarm the
/// deployment's services in role `release`.
pub(super) async fn release_units<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
) -> Result<Vec<(String, String)>> {
    Ok(match ctx.options.engine {
        Engine::Containers => {
            let release_name = format!("{}-release", key.name);
            ctx.runtime
                .list(&[
                    (labels::AGENT, ctx.agent_id.as_str()),
                    (labels::SCOPE, key.scope.as_str()),
                    (labels::NAME, release_name.as_str()),
                    (labels::ROLE, "release"),
                ])
                .await
                .map_err(runtime_error(key))?
                .into_iter()
                .map(|unit| (unit.id, unit.name))
                .collect()
        }
        Engine::Swarm => super::swarm::runs::in_role(ctx, key, "release")
            .await?
            .into_iter()
            .map(|unit| (unit.id, unit.name))
            .collect(),
    })
}

/// Where the run whose unit is called `name` stands; `None` when there is no such unit. A
/// unit that runs is watched (what is left of `timeout`, counted from its creation); one its
/// waiter saw pass the deadline is removed here (`Exit::TimedOut`); one only created (the
/// agent stopped between create and start) is started.
pub(super) async fn stand<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    name: &str,
    timeout: Duration,
) -> Result<Option<Stand>> {
    let Some(unit) = find(ctx, key, name).await? else {
        return Ok(None);
    };
    let attempt = unit
        .labels
        .get(labels::ATTEMPT)
        .and_then(|attempt| attempt.parse().ok())
        .unwrap_or(1);
    let ended = |exit| {
        Ok(Some(Stand::Ended {
            id: unit.id.clone(),
            exit,
            attempt,
        }))
    };
    match unit.state {
        ContainerState::Exited => {
            let exit = outcome(ctx, &unit.id).await.map_err(runtime_error(key))?;
            return ended(exit);
        }
        _ if ctx.runs.timed_out(&unit.id) => {
            tracing::info!(%key, unit = name, "removing a run that passed its deadline");
            remove(ctx, key, &unit.id).await?;
            return ended(Exit::TimedOut);
        }
        ContainerState::Created if ctx.options.engine == Engine::Containers => {
            ctx.runtime
                .start(&unit.id)
                .await
                .map_err(|error| super::launch::start_error(key, name, error))?;
        }
        _ => {}
    }
    let created = unit
        .labels
        .get(labels::CREATED_AT)
        .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
        .map_or_else(now_unix, |at| at.timestamp());
    let elapsed = Duration::from_secs(u64::try_from(now_unix() - created).unwrap_or(0));
    watch(ctx, key, &unit.id, Some(timeout.saturating_sub(elapsed)));
    Ok(Some(Stand::Running))
}

/// How an ended unit exited.
async fn outcome<R: Runtime>(ctx: &Ctx<R>, id: &str) -> crate::runtime::Result<Exit> {
    Ok(match ctx.options.engine {
        Engine::Containers => ctx.runtime.inspect(id).await?.exit_code.map_or_else(
            || Exit::Failed("the engine reports no exit code".to_owned()),
            Exit::Code,
        ),
        Engine::Swarm => match super::swarm::runs::outcome(ctx.runtime.as_ref(), id).await {
            Ok(Some(code)) => Exit::Code(code),
            Ok(None) => Exit::Failed("its task has not ended".to_owned()),
            Err(error) => Exit::Failed(error.to_string()),
        },
    })
}

/// When the engine says a unit finished (Unix seconds), if it did.
pub(super) async fn finished_at<R: Runtime>(ctx: &Ctx<R>, id: &str) -> Option<i64> {
    if ctx.options.engine == Engine::Swarm {
        return super::swarm::runs::finished_at(ctx, id).await;
    }
    let inspection = ctx.runtime.inspect(id).await.ok()?;
    let finished = chrono::DateTime::parse_from_rfc3339(&inspection.finished_at).ok()?;
    // An engine reports the zero time (year 1) for a container that never finished.
    Some(finished.timestamp()).filter(|unix| *unix > 0)
}

/// The last `lines` lines of a unit's output; empty when the engine cannot say.
pub(super) async fn logs<R: Runtime>(ctx: &Ctx<R>, id: &str, lines: usize) -> String {
    match ctx.options.engine {
        Engine::Containers => ctx.runtime.logs(id, lines).await,
        Engine::Swarm => super::swarm::runs::logs(ctx, id, lines).await,
    }
    .unwrap_or_default()
}

/// Removes a unit (its container, or under Swarm its service); a missing one is removed.
pub(super) async fn remove<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey, id: &str) -> Result<()> {
    ctx.runs.forget(id);
    match ctx.options.engine {
        Engine::Containers => {
            // Its destroy event is no drift.
            ctx.memory.own_removals.note(id);
            ctx.runtime.remove(id).await
        }
        Engine::Swarm => ctx.runtime.remove_service(id).await,
    }
    .map_err(runtime_error(key))
}

/// Removes this agent's unit of `key` called `name`, if any.
pub(super) async fn remove_named<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    name: &str,
) -> Result<()> {
    if let Some(unit) = find(ctx, key, name).await? {
        remove(ctx, key, &unit.id).await?;
    }
    Ok(())
}

/// Hands unit `id` of `key` to a waiter (unless one has it): once the unit ends, or
/// `remaining` passes (the deadline is then marked on `ctx.runs`), the key is requeued.
pub(super) fn watch<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    id: &str,
    remaining: Option<Duration>,
) {
    let runs = ctx.runs.clone();
    let runtime = ctx.runtime.clone();
    let engine = ctx.options.engine;
    let shutdown = ctx.shutdown.clone();
    let requeue = ctx.requeue.clone();
    let key = key.clone();
    let unit = id.to_owned();
    ctx.runs.attach(id, async move {
        match wait_end(runtime.as_ref(), engine, &unit, remaining, &shutdown).await {
            // The unit goes on; the next start of the agent watches it again.
            None => {
                runs.detach(&unit);
                return;
            }
            Some(End::TimedOut) => runs.mark_timed_out(&unit),
            Some(End::Exited(_) | End::Vanished(_)) => {}
        }
        runs.detach(&unit);
        requeue.now(key);
    });
}

/// How a watched unit ended.
pub(super) enum End {
    Exited(i64),
    TimedOut,
    Vanished(crate::runtime::Error),
}

/// Waits until unit `id` ends or `remaining` passes (an exit seen together with the deadline
/// counts as the exit); `None` at shutdown. The waiters' one wait, off the workers.
pub(super) async fn wait_end<R: Runtime>(
    runtime: &R,
    engine: Engine,
    id: &str,
    remaining: Option<Duration>,
    shutdown: &CancellationToken,
) -> Option<End> {
    let deadline = async {
        match remaining {
            Some(remaining) => tokio::time::sleep(remaining).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        exited = wait_exit(runtime, engine, id) => Some(match exited {
            Ok(code) => End::Exited(code),
            Err(error) => End::Vanished(error),
        }),
        () = shutdown.cancelled() => None,
        () = deadline => Some(End::TimedOut),
    }
}

/// The engine's wait for a unit, asked again while the engine is unavailable.
async fn wait_exit<R: Runtime>(
    runtime: &R,
    engine: Engine,
    id: &str,
) -> crate::runtime::Result<i64> {
    loop {
        let waited = match engine {
            Engine::Containers => runtime.wait(id).await,
            Engine::Swarm => super::swarm::runs::wait(runtime, id).await,
        };
        match waited {
            Err(crate::runtime::Error::Unavailable { message }) => {
                tracing::debug!(unit = id, %message, "engine unavailable while waiting for a run");
                tokio::time::sleep(ENGINE_RETRY).await;
            }
            other => return other,
        }
    }
}
