//! A deployment's `release {}` hooks (spec §2.10.2, §7.12), once per release: `pre_command`
//! then `command` before any replica of the new spec is created, `post_command` once the
//! rollout has converged. Each runs once from the new spec's image, with its environment
//! (no replica identity), volumes and networks, labelled as voodu labels release steps
//! (`voodu.kind=job`, `voodu.name=<name>-release`, `voodu.role=release`): on containers a
//! one-shot container `<scope>-<name>-release.<id>[-pre|-post]`; under Docker Swarm a
//! `replicated-job` service `<scope>-<name>-release-<id>[-pre|-post]` (`swarm/runs.rs`: a
//! service name has no dot), owned by the deployment (its service labels name it, role
//! `release`), on whichever node Swarm picks. Only that run (`OneShot` → `Ran`) differs by
//! engine; everything else here is shared.
//!
//! Invariants: a stage that succeeded is never run again for that release (outcomes are kept
//! in the release's `hooks` record, so a restarted agent picks up where it stopped); no stage
//! runs for a release whose spec hash an earlier release of the resource already rolled out
//! with success (voodu's idempotent `release {}`: a `git revert` to a spec that ran its
//! migrations does not run them again); a failed
//! `pre_command` or `command` fails the release and the old replicas stay; a failed
//! `post_command` is recorded only; a run's container or service is removed once its
//! outcome is read (a leftover of the same name, from an interrupted pass, is removed
//! before it starts); shutdown interrupts the wait.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use super::container::{Identity, Launch};
use super::launch::{build_spec, remove_by_name, run_once};
use crate::manifest::spec::{Container as ContainerSpec, DeploymentSpec, ReleaseHooks};
use crate::model::{Kind, ResourceKey, parse_go_duration};
use crate::reconcile::{Ctx, Engine, Error, Result, blocking};
use crate::runtime::Runtime;
use crate::store::{FailureReason, RELEASE_HISTORY_LIMIT, Release, ReleasePhase};

/// voodu's per-command default.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
/// Lines of output kept with a hook's outcome.
const LOG_LINES: usize = 20;

/// One hook's run: what runs, and for how long at most.
pub(super) struct OneShot<'a> {
    /// Its container name, labels and role (`release`).
    pub(super) identity: Identity,
    pub(super) container: &'a ContainerSpec,
    /// Its environment and command.
    pub(super) launch: Launch,
    /// The release's spec hash (a Swarm service's `voodu.spec_hash`).
    pub(super) spec_hash: &'a str,
    /// The spec's asset digests (asset files a Swarm task mounts become configs).
    pub(super) asset_digests: &'a BTreeMap<String, String>,
    pub(super) timeout: Duration,
}

/// What a hook's run came to.
pub(super) struct Ran {
    /// `None`: it was still running after its timeout (and was removed).
    pub(super) exit_code: Option<i64>,
    /// The last `LOG_LINES` lines of its output (none after a timeout).
    pub(super) logs: String,
}

/// A deployment's release hooks and the environment they run with (the merged environment
/// without `VOODU_SCOPE`/`VOODU_NAME`, as voodu's release steps): what a `Replicated` kind
/// with hooks hands the replicated pass.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HookSet<'a> {
    pub(crate) key: &'a ResourceKey,
    pub(crate) spec: &'a DeploymentSpec,
    pub(crate) env: &'a [String],
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

/// Runs the stages before the rollout. `Ok(Some(Permanent))` when one fails: the release
/// fails and is halted; `Err` when a stage could not be run.
pub(crate) async fn before_rollout<R: Runtime>(
    ctx: &Ctx<R>,
    hooks: Option<HookSet<'_>>,
    release: &Release,
) -> Result<Option<Error>> {
    let Some(HookSet { key, spec, env }) = hooks.filter(|hooks| hooks.spec.release.is_some())
    else {
        return Ok(None);
    };
    if let Some(earlier) = succeeded_before(ctx, release).await? {
        tracing::info!(%key, release = release.id, earlier, "release hooks skipped: this spec already rolled out with success");
        return Ok(None);
    }
    let release_id = release.id;
    for stage in [Stage::Pre, Stage::Command] {
        if let Some(failure) = run_stage(ctx, key, spec, release, env, stage).await? {
            return Ok(Some(Error::Permanent {
                key: key.clone(),
                reason: FailureReason::Hook,
                message: format!(
                    "release #{release_id} failed in {}: {failure}; the previous replicas keep running",
                    stage.name()
                ),
            }));
        }
    }
    Ok(None)
}

/// Runs `post_command` after a converged rollout; a failure is logged and recorded only, and
/// returned as a note for the release's message (as is a skip).
pub(crate) async fn after_rollout<R: Runtime>(
    ctx: &Ctx<R>,
    hooks: Option<HookSet<'_>>,
    release: &Release,
) -> Result<String> {
    let Some(HookSet { key, spec, env }) = hooks.filter(|hooks| hooks.spec.release.is_some())
    else {
        return Ok(String::new());
    };
    if let Some(earlier) = succeeded_before(ctx, release).await? {
        return Ok(format!(
            "release hooks skipped: release #{earlier} already rolled out this spec"
        ));
    }
    let release_id = release.id;
    match run_stage(ctx, key, spec, release, env, Stage::Post).await? {
        Some(failure) => {
            tracing::warn!(%key, release = release_id, %failure, "post_command failed (recorded; the release stands)");
            Ok(format!("post_command failed: {failure}"))
        }
        None => Ok(String::new()),
    }
}

/// Runs one stage unless it has no command or already succeeded for this release. Returns a
/// description of the failure, if any.
async fn run_stage<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    spec: &DeploymentSpec,
    release: &Release,
    env: &[String],
    stage: Stage,
) -> Result<Option<String>> {
    let Some(hooks) = &spec.release else {
        return Ok(None);
    };
    let command = stage.command(hooks);
    if command.is_empty() {
        return Ok(None);
    }
    let release_id = release.id;
    let recorded = blocking(&ctx.store, move |store| store.release_hooks(release_id)).await?;
    if let Some(outcome) = recorded.get(stage.name()) {
        if outcome.get("exit_code").and_then(serde_json::Value::as_i64) == Some(0) {
            return Ok(None);
        }
        if stage != Stage::Post {
            return Ok(Some(describe(outcome)));
        }
    }
    let run = OneShot {
        identity: Identity {
            name: format!("{}-release.{release_id}{}", key.app_id(), stage.suffix()),
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
            ..Launch::default()
        },
        spec_hash: release.spec_hash.as_str(),
        asset_digests: &spec.asset_digests,
        timeout: parse_go_duration(&hooks.timeout)
            .filter(|timeout| !timeout.is_zero())
            .unwrap_or(DEFAULT_TIMEOUT),
    };
    tracing::info!(%key, release = release_id, stage = stage.name(), "running release hook");
    let ran = match ctx.options.engine {
        Engine::Containers => in_container(ctx, key, &run).await?,
        Engine::Swarm => super::swarm::runs::run_hook(ctx, key, &run, LOG_LINES).await?,
    };
    let outcome = json!({
        "exit_code": ran.exit_code,
        "timed_out": ran.exit_code.is_none(),
        "timeout_seconds": run.timeout.as_secs(),
        "logs": ran.logs,
        "at": crate::store::now_unix(),
    });
    let failure = (ran.exit_code != Some(0)).then(|| describe(&outcome));
    let stage_name = stage.name();
    blocking(&ctx.store, move |store| {
        store.record_release_hook(release_id, stage_name, outcome)
    })
    .await?;
    Ok(failure)
}

/// A hook's run on containers: a one-shot container (a leftover of the same name removed
/// first), waited for at most its timeout, its output read, then removed.
async fn in_container<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    run: &OneShot<'_>,
) -> Result<Ran> {
    let name = &run.identity.name;
    let container_spec = build_spec(ctx, key, &run.identity, run.container, &run.launch)?;
    remove_by_name(ctx, key, name).await?;
    let exit_code = run_once(ctx, key, &container_spec, run.timeout).await?;
    let logs = match exit_code {
        Some(_) => match ctx
            .runtime
            .list(&[(crate::runtime::labels::AGENT, ctx.agent_id.as_str())])
            .await
        {
            Ok(containers) => match containers.iter().find(|container| &container.name == name) {
                Some(container) => ctx
                    .runtime
                    .logs(&container.id, LOG_LINES)
                    .await
                    .unwrap_or_default(),
                None => String::new(),
            },
            Err(_) => String::new(),
        },
        None => String::new(),
    };
    remove_by_name(ctx, key, name).await?;
    Ok(Ran { exit_code, logs })
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
    match outcome.get("exit_code").and_then(serde_json::Value::as_i64) {
        Some(code) => format!("exit code {code}"),
        None => format!(
            "timed out after {}s",
            outcome
                .get("timeout_seconds")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0)
        ),
    }
}
