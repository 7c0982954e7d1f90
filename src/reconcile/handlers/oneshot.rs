//! The one run mechanism: a one-shot unit — a container, or under Docker Swarm a
//! `replicated-job` service (`swarm/runs.rs`) — that a pass starts and never waits for. Init
//! container attempts, release hooks, job runs and cronjob runs all go through it: the pass
//! starts the unit (`start`), a waiter on `ctx.runs` watches it (`watch`), and the pass
//! returns; the unit's exit or its deadline makes the waiter requeue the key, and the next
//! pass reads where the run stands (`stand`) and moves on. Which engine runs the unit is the
//! engine seam's business (`engine.rs`).
//!
//! Invariants: a worker is held for engine calls only, never for a unit's life; waiters never
//! create, stop or remove a unit (the pass holding the key does: a unit past its deadline is
//! removed by the next pass, `stand`); a unit's deadline is counted from its
//! `voodu.created_at` label, so an agent restarted in the middle of a run gives it only
//! what is left; a leftover unit of the same name is removed before a new one starts.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::engine::units as engine;
pub(super) use super::engine::units::{Exit, OneShot};
use crate::model::ResourceKey;
use crate::reconcile::run::timer::{Timer, What};
use crate::reconcile::{context::Ctx, context::Engine, error::Error, error::Result};
use crate::runtime::{ContainerState, Runtime, labels};
use crate::store::now_unix;

/// Pause before asking an unavailable engine again about a unit.
const ENGINE_RETRY: Duration = Duration::from_secs(2);

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

/// Starts `run`'s unit (a leftover of the same name removed first) and watches it for
/// `run.timeout`; returns its id. Does not wait for it. A unit the engine will not start is
/// removed again, and the error says why.
pub(super) async fn start<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    run: &OneShot<'_>,
) -> Result<String> {
    let name = &run.identity.name;
    remove_named(ctx, key, name).await?;
    let id = engine::create_unit(ctx, key, run).await?;
    if let Err(error) = engine::start_unit(ctx, &id).await {
        // Its destroy event is no drift: a pass it queued would create, fail and remove again.
        let _ = remove(ctx, key, &id).await;
        return Err(super::launch::start_error(key, name, error));
    }
    watch(ctx, key, &id, Some(run.timeout));
    Ok(id)
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
    let Some(unit) = engine::find_unit(ctx, key, name).await? else {
        return Ok(None);
    };
    let attempt = unit
        .label(labels::ATTEMPT)
        .and_then(|attempt| attempt.parse().ok())
        .unwrap_or(1);
    let ended = |exit| {
        Ok(Some(Stand::Ended {
            id: unit.id.clone(),
            exit,
            attempt,
        }))
    };
    if unit.state == ContainerState::Exited {
        let exit = engine::outcome(ctx, &unit.id)
            .await
            .map_err(|source| Error::Runtime {
                key: key.clone(),
                source,
            })?;
        return ended(exit);
    }
    if ctx.runs.timed_out(&unit.id) {
        tracing::info!(%key, unit = name, "removing a run that passed its deadline");
        remove(ctx, key, &unit.id).await?;
        return ended(Exit::TimedOut);
    }
    if engine::needs_start(ctx, unit.state) {
        engine::start_unit(ctx, &unit.id)
            .await
            .map_err(|error| super::launch::start_error(key, name, error))?;
    }
    let created = unit
        .label(labels::CREATED_AT)
        .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
        .map_or_else(now_unix, |at| at.timestamp());
    let elapsed = Duration::from_secs(u64::try_from(now_unix() - created).unwrap_or(0));
    watch(ctx, key, &unit.id, Some(timeout.saturating_sub(elapsed)));
    Ok(Some(Stand::Running))
}

/// Removes a unit (its container, or its service), and what this process kept about it; a
/// missing one is removed.
pub(super) async fn remove<R: Runtime>(ctx: &Ctx<R>, key: &ResourceKey, id: &str) -> Result<()> {
    ctx.runs.forget(id);
    engine::remove_unit(ctx, key, id).await
}

/// Removes this agent's unit of `key` called `name`, if any.
pub(super) async fn remove_named<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    name: &str,
) -> Result<()> {
    if let Some(unit) = engine::find_unit(ctx, key, name).await? {
        remove(ctx, key, &unit.id).await?;
    }
    Ok(())
}

/// The release hook units of deployment `key`, as (id, run name).
pub(super) async fn release_units<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
) -> Result<Vec<(String, String)>> {
    Ok(engine::release_units(ctx, key)
        .await?
        .into_iter()
        .map(|unit| (unit.id, unit.name))
        .collect())
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
    let timer = ctx.timer.clone();
    let key = key.clone();
    let unit = id.to_owned();
    ctx.runs.attach(id, async move {
        match wait_end(
            runtime.as_ref(),
            engine,
            &timer,
            &unit,
            remaining,
            &shutdown,
        )
        .await
        {
            // The unit goes on; the next start of the agent watches it again.
            None => {
                runs.detach(&unit);
                return;
            }
            Some(End::TimedOut) => runs.mark_timed_out(&unit),
            Some(End::Exited(_) | End::Vanished(_)) => {}
        }
        runs.detach(&unit);
        timer.requeue(key);
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
    timer: &Timer,
    id: &str,
    remaining: Option<Duration>,
    shutdown: &CancellationToken,
) -> Option<End> {
    let deadline = async {
        match remaining {
            Some(remaining) => timer.sleep(What::Unit, remaining).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        exited = wait_exit(runtime, engine, timer, id) => Some(match exited {
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
    timer: &Timer,
    id: &str,
) -> crate::runtime::Result<i64> {
    loop {
        match engine::wait_unit(runtime, engine, timer, id).await {
            Err(crate::runtime::Error::Unavailable { message }) => {
                tracing::debug!(unit = id, %message, "engine unavailable while waiting for a run");
                timer.sleep(What::Unit, ENGINE_RETRY).await;
            }
            other => return other,
        }
    }
}
