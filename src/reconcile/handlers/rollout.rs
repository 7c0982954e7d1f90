//! A rollout's release, from start to end, for the replicated kinds: the release a pass works
//! under, whether it is halted, and how it ends — succeeded (post hook, `on_deploy` success)
//! or failed (rolled back automatically to the last release that ran, reported in status,
//! metrics and the `on_deploy` failure hook).
//!
//! Invariants: a release ends once (the store only closes progressing releases); a failure
//! after replicas were touched goes back to the newest release that ran, in the same store
//! transaction that fails and halts the bad one, so its commit is not retried for this
//! resource until git changes the resource (the rollback pins it, as an operator rollback
//! does); a rollback that itself fails is halted, never rolled back further.

use crate::manifest::spec::{Container, Init, OnDeploy};
use crate::model::ResourceKey;
use crate::reconcile::handlers::on_deploy::Outcome;
use crate::reconcile::{context::Ctx, context::blocking, error::Result};
use crate::runtime::Runtime;
use crate::store::{AutoRollback, Desired, Release, ReleasePhase, now_unix};

use super::launch::{images_of, ready_to_create};
use crate::base::rfc3339_seconds;

/// The release this pass works under: the latest one when it has the desired spec hash and
/// incarnation, else a new progressing release keyed to the desired commit (which supersedes
/// one in flight). A resource deleted from git and added again with the very spec it had is a
/// new rollout, not the deleted incarnation's release.
pub(super) async fn current_release<R: Runtime>(
    ctx: &Ctx<R>,
    desired: &Desired,
) -> Result<Release> {
    let desired = desired.clone();
    let (release, first) = blocking(&ctx.store, move |store| {
        match store.latest_release(&desired.key)? {
            Some(latest)
                if latest.spec_hash == desired.spec_hash
                    && latest.incarnation == desired.incarnation =>
            {
                Ok((latest, false))
            }
            latest => {
                let release = store.begin_release(&desired)?;
                tracing::info!(
                    key = %desired.key,
                    commit = desired.commit.short(),
                    spec_hash = desired.spec_hash.short(),
                    release = release.id,
                    "rollout started"
                );
                Ok((release, latest.is_none()))
            }
        }
    })
    .await?;
    if first {
        // The key's first release: no hook unit of another release can run, so there is
        // nothing for `hooks::supersede` to look for (one list fewer per new resource).
        ctx.memory.superseded.mark(&release.key, release.id);
    }
    Ok(release)
}

/// Whether the pass must not replace replicas: the release for the desired spec failed and is
/// halted (its `pre_command`/`command` failed, or its rollout failed after touching replicas),
/// and desired state has not changed since (a newer commit that changes the resource, even
/// only its `replicas`, or a re-add after a delete, tries again).
pub(super) async fn halted<R: Runtime>(
    ctx: &Ctx<R>,
    release: &Release,
    desired: &Desired,
) -> Result<bool> {
    if release.phase != ReleasePhase::Failed || release.commit != desired.commit {
        return Ok(false);
    }
    let id = release.id;
    blocking(&ctx.store, move |store| store.release_halted(id)).await
}

/// For a release that failed before touching replicas (its image could not be had) and is
/// not halted: when the image can be had now, another attempt as a release of its own
/// (`Ok(Some)`); when it still cannot, `Err` with why, and nothing recorded (no new release,
/// no `on_deploy`), so a resync or a registry change simply tries again later.
pub(super) async fn retry_failed<R: Runtime>(
    ctx: &Ctx<R>,
    release: &Release,
    desired: &Desired,
    container: &Container,
    inits: &[Init],
) -> Result<Release> {
    let key = &desired.key;
    let images = images_of(key, container, inits, &ctx.assets_root);
    ready_to_create(ctx, key, container, &images).await?;
    let (failed, desired) = (release.clone(), desired.clone());
    let retry = blocking(&ctx.store, move |store| {
        store.retry_release(&failed, &desired)
    })
    .await?;
    tracing::info!(%key, failed = release.id, release = retry.id, "rollout retried: its image can be had now");
    Ok(retry)
}

/// What the end of a release reports to `on_deploy`.
pub(super) struct Report<'a> {
    pub key: &'a ResourceKey,
    pub on_deploy: Option<&'a OnDeploy>,
    pub image: String,
}

/// Ends a progressing release as succeeded (`note` appended to its message) and reports it.
pub(super) async fn succeed<R: Runtime>(
    ctx: &Ctx<R>,
    release: &Release,
    report: &Report<'_>,
    note: &str,
) -> Result<()> {
    let (id, note) = (release.id, note.to_owned());
    blocking(&ctx.store, move |store| {
        store.finish_release(id, ReleasePhase::Succeeded, &note)
    })
    .await?;
    tracing::info!(key = %report.key, release = id, "rollout succeeded");
    ended(ctx, release, report, ReleasePhase::Succeeded, String::new());
    Ok(())
}

/// Ends a progressing release whose rollout failed after touching replicas: fails and halts
/// it and, unless it was a rollback itself, rolls back to the newest release that ran.
/// Returns the status message that says what happened.
pub(super) async fn fail<R: Runtime>(
    ctx: &Ctx<R>,
    release: &Release,
    reason: &str,
    report: &Report<'_>,
) -> Result<Option<String>> {
    let failed = release.clone();
    let why = reason.to_owned();
    let outcome = blocking(&ctx.store, move |store| store.auto_rollback(&failed, &why)).await?;
    let key = report.key;
    let message = match outcome {
        AutoRollback::Superseded => {
            ctx.memory.rollouts.finish(release.id);
            return Ok(None);
        }
        AutoRollback::Done(rollback) => {
            ctx.metrics.record_rollback(key.kind.as_str());
            tracing::warn!(
                %key,
                release = release.id,
                commit = release.commit.short(),
                to = rollback.target.id,
                %reason,
                "rollout failed; rolling back automatically"
            );
            format!(
                "release #{} (commit {}) failed: {reason}; rolled back automatically to release #{} (commit {}); the resource is pinned until git changes it or `voodu-agent unpin`",
                release.id,
                release.commit.short(),
                rollback.target.id,
                rollback.target.commit.short()
            )
        }
        AutoRollback::Halted => {
            tracing::error!(%key, release = release.id, %reason, "rollout failed; no earlier release to go back to");
            // Only releases since the resource was (last) added to git count: a first
            // rollout, also the first after a delete and re-add, stays failed. Incarnation 1
            // is a resource's first; a later one had releases before it was deleted.
            let rollback = if release.rolled_back_from.is_some() {
                "it was a rollback itself, so nothing further is rolled back"
            } else if release.incarnation > 1 {
                "it was deleted from git and added again, and no release ran since, so there is nothing to roll back to (`voodu-agent rollback --to SHA` can bring back a release from before the delete)"
            } else {
                "no earlier release ran, so there is nothing to roll back to"
            };
            format!(
                "release #{} (commit {}) failed: {reason}; {rollback}; a new commit retries",
                release.id,
                release.commit.short()
            )
        }
    };
    ended(
        ctx,
        release,
        report,
        ReleasePhase::Failed,
        reason.to_owned(),
    );
    Ok(Some(message))
}

/// Ends a progressing release as failed before any replica was touched (its image cannot be
/// had, or a `pre_command`/`command` failed): the old replicas run on; nothing to roll back.
/// `halt` (a `pre_command` or `command` failed): it is halted too, and not tried again until
/// desired state changes.
pub(super) async fn fail_before_rollout<R: Runtime>(
    ctx: &Ctx<R>,
    release: &Release,
    message: &str,
    report: &Report<'_>,
    halt: bool,
) -> Result<()> {
    let (id, text) = (release.id, message.to_owned());
    blocking(&ctx.store, move |store| {
        if halt {
            store.halt_release(id, &text)
        } else {
            store.finish_release(id, ReleasePhase::Failed, &text)
        }
    })
    .await?;
    ended(
        ctx,
        release,
        report,
        ReleasePhase::Failed,
        message.to_owned(),
    );
    Ok(())
}

/// A release the store ended as `phase`: no longer in flight, counted, and reported to
/// `on_deploy` (`error` empty on success).
fn ended<R: Runtime>(
    ctx: &Ctx<R>,
    release: &Release,
    report: &Report<'_>,
    phase: ReleasePhase,
    error: String,
) {
    ctx.memory.rollouts.finish(release.id);
    ctx.metrics
        .record_release(report.key.kind.as_str(), phase.as_str());
    notify(
        ctx,
        release,
        report,
        phase == ReleasePhase::Succeeded,
        error,
    );
}

fn notify<R: Runtime>(
    ctx: &Ctx<R>,
    release: &Release,
    report: &Report<'_>,
    success: bool,
    error: String,
) {
    let targets = report.on_deploy.map_or_else(Vec::new, |on_deploy| {
        if success {
            on_deploy.success.clone()
        } else {
            on_deploy.failure.clone()
        }
    });
    ctx.notifier.notify(
        Outcome {
            key: report.key.clone(),
            success,
            release_id: release.id.to_string(),
            image: report.image.clone(),
            started_at: rfc3339_seconds(release.started_at),
            completed_at: rfc3339_seconds(now_unix()),
            error,
        },
        targets,
    );
}
