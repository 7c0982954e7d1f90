//! A deployment's `release {}` hooks (spec §2.10.2, §7.12), once per release: `pre_command`
//! then `command` before any replica of the new spec is created, `post_command` once the
//! rollout has converged. Each runs in a fresh one-shot container from the new spec's image,
//! with its environment, volumes and networks, named `<scope>-<name>-release.<id>[-pre|-post]`
//! and labelled as voodu labels release steps (`voodu.kind=job`, `voodu.name=<name>-release`).
//!
//! Invariants: a stage that succeeded is never run again for that release (outcomes are kept
//! in the release's `hooks` record, so a restarted agent picks up where it stopped); no stage
//! runs for a release whose spec hash an earlier release of the resource already rolled out
//! with success (voodu's idempotent `release {}`: a `git revert` to a spec that ran its
//! migrations does not run them again); a failed
//! `pre_command` or `command` fails the release and the old replicas stay; a failed
//! `post_command` is recorded only.

use std::time::Duration;

use serde_json::json;

use super::container::{Identity, Launch};
use super::launch::{build_spec, remove_by_name, run_once};
use crate::manifest::spec::{DeploymentSpec, ReleaseHooks};
use crate::model::{Kind, ResourceKey, parse_go_duration};
use crate::reconcile::{Ctx, Error, Result, blocking};
use crate::runtime::Runtime;
use crate::store::{FailureReason, RELEASE_HISTORY_LIMIT, Release, ReleasePhase};

/// voodu's per-command default.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);
/// Lines of output kept with a hook's outcome.
const LOG_LINES: usize = 20;

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
    key: &ResourceKey,
    spec: &DeploymentSpec,
    release: &Release,
    env: &[String],
) -> Result<Option<Error>> {
    if spec.release.is_none() {
        return Ok(None);
    }
    if let Some(earlier) = succeeded_before(ctx, release).await? {
        tracing::info!(%key, release = release.id, earlier, "release hooks skipped: this spec already rolled out with success");
        return Ok(None);
    }
    let release_id = release.id;
    for stage in [Stage::Pre, Stage::Command] {
        if let Some(failure) = run_stage(ctx, key, spec, release_id, env, stage).await? {
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
    key: &ResourceKey,
    spec: &DeploymentSpec,
    release: &Release,
    env: &[String],
) -> Result<String> {
    if spec.release.is_none() {
        return Ok(String::new());
    }
    if let Some(earlier) = succeeded_before(ctx, release).await? {
        return Ok(format!(
            "release hooks skipped: release #{earlier} already rolled out this spec"
        ));
    }
    let release_id = release.id;
    match run_stage(ctx, key, spec, release_id, env, Stage::Post).await? {
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
    release_id: i64,
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
    let recorded = blocking(&ctx.store, move |store| store.release_hooks(release_id)).await?;
    if let Some(outcome) = recorded.get(stage.name()) {
        if outcome.get("exit_code").and_then(serde_json::Value::as_i64) == Some(0) {
            return Ok(None);
        }
        if stage != Stage::Post {
            return Ok(Some(describe(outcome)));
        }
    }
    let name = format!("{}-release.{release_id}{}", key.app_id(), stage.suffix());
    let identity = Identity {
        name: name.clone(),
        kind: Kind::Job,
        role: "release".to_owned(),
        name_label: format!("{}-release", key.name),
        replica_id: format!("{release_id}{}", stage.suffix()),
        ordinal: None,
        spec_hash: Some("release".to_owned()),
        release_id: Some(release_id.to_string()),
        aliases: Vec::new(),
    };
    let launch = Launch {
        env: env.to_vec(),
        command: Some(command.to_vec()),
        tty: true,
        default_ulimits: ctx.default_ulimits.clone(),
        ..Launch::default()
    };
    let container_spec = build_spec(ctx, key, &identity, &spec.container, &launch)?;
    let timeout = parse_go_duration(&hooks.timeout)
        .filter(|timeout| !timeout.is_zero())
        .unwrap_or(DEFAULT_TIMEOUT);
    tracing::info!(%key, release = release_id, stage = stage.name(), "running release hook");
    remove_by_name(ctx, key, &name).await?;
    let exit_code = run_once(ctx, key, &container_spec, timeout).await?;
    let logs = match exit_code {
        Some(_) => match ctx
            .runtime
            .list(&[(crate::runtime::labels::AGENT, ctx.agent_id.as_str())])
            .await
        {
            Ok(containers) => match containers.iter().find(|container| container.name == name) {
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
    remove_by_name(ctx, key, &name).await?;
    let outcome = json!({
        "exit_code": exit_code,
        "timed_out": exit_code.is_none(),
        "timeout_seconds": timeout.as_secs(),
        "logs": logs,
        "at": crate::store::now_unix(),
    });
    let failure = (exit_code != Some(0)).then(|| describe(&outcome));
    let stage_name = stage.name();
    blocking(&ctx.store, move |store| {
        store.record_release_hook(release_id, stage_name, outcome)
    })
    .await?;
    Ok(failure)
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
