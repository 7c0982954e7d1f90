//! A deployment's `release {}` hooks (spec §2.10.2, §7.12), once per release: `pre_command`
//! then `command` before any replica of the new spec is created, `post_command` once the
//! rollout has converged. Each runs once from the new spec's image, with its environment
//! (no replica identity), volumes and networks, labelled as voodu labels release steps
//! (`voodu.kind=job`, `voodu.name=<name>-release`, `voodu.role=release`): a one-shot unit
//! (`oneshot.rs`) `<scope>-<name>-release.<id>[-pre|-post]`, a container or under Docker
//! Swarm a `replicated-job` service (`-` for the dot). A pass starts a stage and returns
//! (`Stand::Running`); the stage's end requeues the key, and the next pass records it.
//!
//! Invariants: a stage that ended is never run again for that release (outcomes are kept
//! in the release's `hooks` record, so a restarted agent picks up where it stopped, and a
//! stage still running when it stopped is watched again, not started twice); no stage
//! runs for a release whose spec hash an earlier release of the resource already rolled out
//! with success (voodu's idempotent `release {}`: a `git revert` to a spec that ran its
//! migrations does not run them again); a failed `pre_command` or `command` fails the
//! release and the old replicas stay; a failed `post_command` is recorded only; a stage's
//! unit is removed once its outcome is recorded; a newer release (a new spec) or the
//! resource's deletion supersedes a stage still running: its unit is removed.

use std::time::Duration;

use serde_json::json;

use super::container::{Identity, Launch};
use super::oneshot::{self, Exit, OneShot, Stand};
use crate::manifest::spec::{DeploymentSpec, ReleaseHooks};
use crate::model::{Kind, ResourceKey, parse_go_duration};
use crate::reconcile::{context::Ctx, context::blocking, error::Error, error::Result};
use crate::runtime::Runtime;
use crate::store::{FailureReason, RELEASE_HISTORY_LIMIT, Release, ReleasePhase};

/// voodu's per-command default.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
/// Lines of output kept with a hook's outcome.
const LOG_LINES: usize = 20;

/// A deployment's release hooks and the environment they run with (the merged environment
/// without `VOODU_SCOPE`/`VOODU_NAME`, as voodu's release steps): what a `Replicated` kind
/// with hooks hands the replicated pass.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HookSet<'a> {
    pub(crate) key: &'a ResourceKey,
    pub(crate) spec: &'a DeploymentSpec,
    pub(crate) env: &'a [String],
    /// What the release's images run as: a hook runs the release's bytes, as its replicas.
    pub(crate) pins: Option<&'a std::sync::Arc<crate::reconcile::handlers::pins::Pins>>,
}

/// One hook stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    Pre,
    Command,
    Post,
}

impl Stage {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Stage::Pre => "pre_command",
            Stage::Command => "command",
            Stage::Post => "post_command",
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Stage::Pre => "-pre",
            Stage::Command => "",
            Stage::Post => "-post",
        }
    }

    fn command(self, hooks: &ReleaseHooks) -> &[String] {
        match self {
            Stage::Pre => &hooks.pre_command,
            Stage::Command => &hooks.command,
            Stage::Post => &hooks.post_command,
        }
    }
}

/// Where the stages before a rollout stand.
#[derive(Debug)]
pub(crate) enum Before {
    /// None left to run (none declared, all succeeded, or skipped): replicas may be touched.
    Done,
    /// `stage` runs; its end requeues the key.
    Running(Stage),
    /// A stage failed: the release fails and is halted (a permanent error).
    Failed(Error),
}

/// Where `post_command` stands after a converged rollout.
#[derive(Debug)]
pub(crate) enum After {
    /// Nothing left to run: a note for the release's message (a failure, a skip), maybe empty.
    Done(String),
    /// It runs; its end requeues the key.
    Running,
}

/// Whether the release hooks of `release` run.
enum Due<'a> {
    /// The kind has no hooks, or the spec declares no `release {}`.
    Undeclared,
    /// Release #`earlier` of `key` already rolled this spec out with success: skipped.
    RanIn { key: &'a ResourceKey, earlier: i64 },
    /// They run.
    Run(HookSet<'a>),
}

/// Whether `hooks` (a kind's, maybe none) run for `release`.
async fn due<'a, R: Runtime>(
    ctx: &Ctx<R>,
    hooks: Option<HookSet<'a>>,
    release: &Release,
) -> Result<Due<'a>> {
    let Some(hooks) = hooks.filter(|hooks| hooks.spec.release.is_some()) else {
        return Ok(Due::Undeclared);
    };
    Ok(match succeeded_before(ctx, release).await? {
        Some(earlier) => Due::RanIn {
            key: hooks.key,
            earlier,
        },
        None => Due::Run(hooks),
    })
}

/// Moves the stages before the rollout on: starts the next one, or records the one that
/// ended. `Err` when a stage could not be run.
pub(crate) async fn before_rollout<R: Runtime>(
    ctx: &Ctx<R>,
    hooks: Option<HookSet<'_>>,
    release: &Release,
) -> Result<Before> {
    let hooks = match due(ctx, hooks, release).await? {
        Due::Run(hooks) => hooks,
        Due::Undeclared => return Ok(Before::Done),
        Due::RanIn { key, earlier } => {
            tracing::info!(%key, release = release.id, earlier, "release hooks skipped: this spec already rolled out with success");
            return Ok(Before::Done);
        }
    };
    let release_id = release.id;
    for stage in [Stage::Pre, Stage::Command] {
        match run_stage(ctx, hooks, release, stage).await? {
            StageStand::Ended(None) => {}
            StageStand::Running => return Ok(Before::Running(stage)),
            StageStand::Ended(Some(failure)) => {
                return Ok(Before::Failed(Error::Permanent {
                    key: hooks.key.clone(),
                    reason: FailureReason::Hook,
                    message: format!(
                        "release #{release_id} failed in {}: {failure}; the previous replicas keep running",
                        stage.name()
                    ),
                }));
            }
        }
    }
    Ok(Before::Done)
}

/// Moves `post_command` on after a converged rollout; a failure is logged and recorded only,
/// and returned as a note for the release's message (as is a skip).
pub(crate) async fn after_rollout<R: Runtime>(
    ctx: &Ctx<R>,
    hooks: Option<HookSet<'_>>,
    release: &Release,
) -> Result<After> {
    let hooks = match due(ctx, hooks, release).await? {
        Due::Run(hooks) => hooks,
        Due::Undeclared => return Ok(After::Done(String::new())),
        Due::RanIn { earlier, .. } => {
            return Ok(After::Done(format!(
                "release hooks skipped: release #{earlier} already rolled out this spec"
            )));
        }
    };
    let release_id = release.id;
    Ok(match run_stage(ctx, hooks, release, Stage::Post).await? {
        StageStand::Running => After::Running,
        StageStand::Ended(Some(failure)) => {
            tracing::warn!(key = %hooks.key, release = release_id, %failure, "post_command failed (recorded; the release stands)");
            After::Done(format!("post_command failed: {failure}"))
        }
        StageStand::Ended(None) => After::Done(String::new()),
    })
}

/// Removes the hook units of `key` that belong to another release than `release` (a newer
/// spec superseded them while they ran): the pass of every kind with hooks calls it. Once
/// per release (`wake::Superseded`): later passes of the same release skip the list.
pub(crate) async fn supersede<R: Runtime>(
    ctx: &Ctx<R>,
    hooks: Option<HookSet<'_>>,
    release: &Release,
) -> Result<()> {
    let Some(HookSet { key, .. }) = hooks else {
        return Ok(());
    };
    if ctx.memory.superseded.done(key, release.id) {
        return Ok(());
    }
    let current: Vec<String> = [Stage::Pre, Stage::Command, Stage::Post]
        .into_iter()
        .map(|stage| unit_name(key, release.id, stage))
        .collect();
    for (id, name) in oneshot::release_units(ctx, key).await? {
        if !current.contains(&name) {
            tracing::info!(%key, unit = %name, release = release.id, "removing a release hook superseded by a newer release");
            oneshot::remove(ctx, key, &id).await?;
        }
    }
    ctx.memory.superseded.mark(key, release.id);
    Ok(())
}

/// The unit name of `stage` of release `release_id`.
fn unit_name(key: &ResourceKey, release_id: i64, stage: Stage) -> String {
    format!("{}-release.{release_id}{}", key.app_id(), stage.suffix())
}

/// Where one stage stands.
enum StageStand {
    Running,
    /// It ended (or has nothing to run): `Some(description)` of a failure.
    Ended(Option<String>),
}

/// Moves one stage on, unless it has no command or already ended for this release: starts
/// it, or records how it ended and removes its unit.
async fn run_stage<R: Runtime>(
    ctx: &Ctx<R>,
    hooks: HookSet<'_>,
    release: &Release,
    stage: Stage,
) -> Result<StageStand> {
    let HookSet {
        key,
        spec,
        env,
        pins,
    } = hooks;
    let Some(declared) = &spec.release else {
        return Ok(StageStand::Ended(None));
    };
    let command = stage.command(declared);
    if command.is_empty() {
        return Ok(StageStand::Ended(None));
    }
    let release_id = release.id;
    let recorded = blocking(&ctx.store, move |store| store.release_hooks(release_id)).await?;
    if let Some(outcome) = recorded.get(stage.name()) {
        if outcome.get("exit_code").and_then(serde_json::Value::as_i64) == Some(0) {
            return Ok(StageStand::Ended(None));
        }
        return Ok(StageStand::Ended(Some(describe(outcome))));
    }
    let timeout = parse_go_duration(&declared.timeout)
        .filter(|timeout| !timeout.is_zero())
        .unwrap_or(DEFAULT_TIMEOUT);
    let name = unit_name(key, release_id, stage);
    let (id, exit) = match oneshot::stand(ctx, key, &name, timeout).await? {
        Some(Stand::Running) => return Ok(StageStand::Running),
        Some(Stand::Ended { id, exit, .. }) => (id, exit),
        None => {
            let run = OneShot {
                identity: Identity {
                    name,
                    kind: Kind::Job,
                    role: "release".to_owned(),
                    name_label: format!("{}-release", key.name),
                    replica_id: format!("{release_id}{}", stage.suffix()),
                    ordinal: None,
                    spec_hash: Some("release".to_owned()),
                    release_id: Some(release_id.to_string()),
                    aliases: Vec::new(),
                },
                container: &spec.container,
                launch: Launch {
                    env: env.to_vec(),
                    command: Some(command.to_vec()),
                    tty: true,
                    default_ulimits: ctx.default_ulimits.clone(),
                    pins: pins.cloned(),
                    ..Launch::default()
                },
                spec_hash: release.spec_hash.as_str(),
                asset_digests: &spec.asset_digests,
                labels: std::collections::BTreeMap::new(),
                timeout,
            };
            tracing::info!(%key, release = release_id, stage = stage.name(), "running release hook");
            oneshot::start(ctx, key, &run).await?;
            return Ok(StageStand::Running);
        }
    };
    let logs = match exit {
        Exit::TimedOut => String::new(),
        Exit::Code(_) | Exit::Failed(_) => super::engine::units::logs(ctx, &id, LOG_LINES).await,
    };
    let outcome = json!({
        "exit_code": exit.code(),
        "timed_out": exit == Exit::TimedOut,
        "timeout_seconds": timeout.as_secs(),
        "error": match &exit { Exit::Failed(message) => message.as_str(), _ => "" },
        "logs": logs,
        "at": crate::store::now_unix(),
    });
    let failure = (!exit.succeeded()).then(|| describe(&outcome));
    let stage_name = stage.name();
    blocking(&ctx.store, move |store| {
        store.record_release_hook(release_id, stage_name, outcome)
    })
    .await?;
    oneshot::remove(ctx, key, &id).await?;
    Ok(StageStand::Ended(failure))
}

/// The newest other release of the same resource and incarnation that succeeded with
/// `release`'s spec hash, if any (within the kept history).
async fn succeeded_before<R: Runtime>(ctx: &Ctx<R>, release: &Release) -> Result<Option<i64>> {
    let release = release.clone();
    blocking(&ctx.store, move |store| {
        Ok(store
            .releases(&release.key, RELEASE_HISTORY_LIMIT)?
            .into_iter()
            .find(|other| {
                other.id != release.id
                    && other.phase == ReleasePhase::Succeeded
                    && other.spec_hash == release.spec_hash
                    && other.incarnation == release.incarnation
            })
            .map(|other| other.id))
    })
    .await
}

fn describe(outcome: &serde_json::Value) -> String {
    let error = outcome
        .get("error")
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default();
    match outcome.get("exit_code").and_then(serde_json::Value::as_i64) {
        Some(code) => format!("exit code {code}"),
        None if !error.is_empty() => format!("could not run: {error}"),
        None => format!(
            "timed out after {}s",
            outcome
                .get("timeout_seconds")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0)
        ),
    }
}
