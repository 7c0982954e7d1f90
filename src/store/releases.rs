//! Releases, rollback and pins.
//!
//! A release is one rollout of one resource, keyed to the commit that asked for it, with the
//! spec snapshot it rolled out. History is capped at `RELEASE_HISTORY_LIMIT` records per
//! resource, as voodu caps its release records; the oldest go first.
//!
//! Rollback is the emergency path (`git revert` is the GitOps one): `rollback` re-applies a stored snapshot as
//! desired state and pins the resource, and `unpin` hands it back to git. Invariants:
//! - a rollback or unpin is ONE transaction: the release records, the desired row, the
//!   journal row and the pin change together or not at all;
//! - while pinned, `desired` holds the snapshot and `pins.git_spec` what git declared when
//!   the pin was made (NULL: git did not declare the resource); `apply_commit` keeps the pin
//!   while git declares exactly that, and clears it (git wins) on the first commit that
//!   changes the resource in git;
//! - `finish_release` only closes a progressing release, so a reconcile that finishes after
//!   an operator rolled back cannot turn a `rolled-back` release into `succeeded`;
//! - every release carries the incarnation of its resource (a delete from git and a re-add
//!   make a new one); a rollback without `--to`, automatic or the operator's, only goes back
//!   to a release of the current incarnation, so a deleted resource's spec is never
//!   resurrected by default.

use std::collections::BTreeMap;

use rusqlite::{OptionalExtension, Transaction, params};

use super::activity::{self, ActivityOutcome, Entry, Who};
use super::desired::append_journal;
use super::{Desired, Error, Result, Store, key_from_row, now_unix};
use crate::manifest::spec::Spec;
use crate::model::{CommitSha, ResourceKey, SpecHash};

/// Lifecycle of a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleasePhase {
    Progressing,
    Succeeded,
    Failed,
    RolledBack,
    /// A newer commit changed the resource before this rollout finished.
    Superseded,
}

impl ReleasePhase {
    pub fn as_str(self) -> &'static str {
        match self {
            ReleasePhase::Progressing => "progressing",
            ReleasePhase::Succeeded => "succeeded",
            ReleasePhase::Failed => "failed",
            ReleasePhase::RolledBack => "rolled-back",
            ReleasePhase::Superseded => "superseded",
        }
    }

    fn parse(text: &str) -> Result<ReleasePhase> {
        Ok(match text {
            "progressing" => ReleasePhase::Progressing,
            "succeeded" => ReleasePhase::Succeeded,
            "failed" => ReleasePhase::Failed,
            "rolled-back" => ReleasePhase::RolledBack,
            "superseded" => ReleasePhase::Superseded,
            other => {
                return Err(Error::Unknown {
                    column: "release phase",
                    text: other.to_owned(),
                });
            }
        })
    }
}

/// One rollout of one resource, keyed to the commit that asked for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub id: i64,
    pub(crate) key: ResourceKey,
    pub commit: CommitSha,
    pub spec_hash: SpecHash,
    /// The desired spec JSON at the time of the rollout.
    pub(crate) snapshot: String,
    pub phase: ReleasePhase,
    pub(crate) started_at: i64,
    pub(crate) finished_at: Option<i64>,
    pub message: String,
    /// For a rollback release: the release that was current when the operator rolled back.
    pub rolled_back_from: Option<i64>,
    /// The incarnation of the resource the release belongs to (`Desired::incarnation`).
    pub(crate) incarnation: i64,
    /// What each image the release names runs as (`name:tag` → `name@sha256:…`, or the image
    /// id of a local-only image), resolved once when it started, or taken over from the
    /// release whose spec it re-applies (a rollback, a revert); `None` until resolved.
    pub images: Option<BTreeMap<String, String>>,
    /// Recorded by an agent that did not resolve images (before digests were recorded): its
    /// containers run the tag, "digest unknown", until the next rollout.
    pub legacy: bool,
}

/// Release records kept per resource (voodu keeps 10 and drops the oldest).
pub const RELEASE_HISTORY_LIMIT: usize = 10;

/// A resource the operator rolled back: auto-sync is paused for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    pub key: ResourceKey,
    /// The rollback release that made the pin.
    pub(crate) release_id: i64,
    /// The commit of the release rolled back to.
    pub(crate) commit: CommitSha,
    pub(crate) spec_hash: SpecHash,
    /// The spec JSON git declared for the resource when it was pinned (`None`: not declared).
    pub(crate) git_spec: Option<String>,
    /// The commit that last set `git_spec`.
    pub(crate) git_commit: Option<CommitSha>,
    pub(crate) pinned_at: i64,
}

/// What `rollback` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollbackOutcome {
    /// The new, progressing release that re-applies the target's snapshot.
    pub(crate) release: Release,
    /// The release whose snapshot is re-applied.
    pub(crate) target: Release,
    /// True when git declares something else for the resource than the snapshot.
    pub(crate) git_differs: bool,
}

/// What `auto_rollback` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AutoRollback {
    Done(Box<RollbackOutcome>),
    /// The release failed and is halted, with nothing to go back to.
    Halted,
    /// Desired state no longer is the failed release's (a newer commit came in).
    Superseded,
}

/// Who rolls back: the operator (`voodu-agent rollback`) or the agent after a failed rollout.
#[derive(Debug, Clone, Copy)]
enum Trigger<'a> {
    Operator,
    Automatic {
        failed: &'a Release,
        reason: &'a str,
    },
}

/// What `unpin` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnpinOutcome {
    /// The commit git's version comes from (`None`: git does not declare the resource, so
    /// it is deleted).
    pub(crate) git_commit: Option<CommitSha>,
    /// True when desired state changed (a journal row was appended).
    pub(crate) changed: bool,
}

const RELEASE_COLUMNS: &str = "id, commit_sha, spec_hash, snapshot, phase, started_at, finished_at, message, rolled_back_from, incarnation, images, legacy";

type ReleaseRow = (
    i64,
    String,
    String,
    String,
    String,
    i64,
    Option<i64>,
    String,
    Option<i64>,
    i64,
    Option<String>,
    i64,
);

fn release_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ReleaseRow> {
    ReleaseRow::try_from(row)
}

fn release_from_row(key: &ResourceKey, row: ReleaseRow) -> Result<Release> {
    let (
        id,
        commit,
        spec_hash,
        snapshot,
        phase,
        started_at,
        finished_at,
        message,
        rolled_back_from,
        incarnation,
        images,
        legacy,
    ) = row;
    Ok(Release {
        id,
        key: key.clone(),
        commit: CommitSha::new(commit),
        spec_hash: SpecHash::new(spec_hash),
        snapshot,
        phase: ReleasePhase::parse(&phase)?,
        started_at,
        finished_at,
        message,
        rolled_back_from,
        incarnation,
        images: images_of(images.as_deref())?,
        legacy: legacy != 0,
    })
}

/// A release's `images` column: a JSON object of image → what it runs as.
fn images_of(text: Option<&str>) -> Result<Option<BTreeMap<String, String>>> {
    text.map(|text| {
        serde_json::from_str(text)
            .map_err(|error| Error::Corrupt(format!("release images {text:?}: {error}")))
    })
    .transpose()
}

/// Releases of `key`, newest first, at most `limit`, read inside any connection or
/// transaction.
fn read_releases(
    connection: &rusqlite::Connection,
    key: &ResourceKey,
    limit: usize,
) -> Result<Vec<Release>> {
    let mut statement = connection.prepare_cached(&format!(
        "SELECT {RELEASE_COLUMNS} FROM releases WHERE kind = ?1 AND scope = ?2 AND name = ?3
         ORDER BY id DESC LIMIT ?4"
    ))?;
    let rows = statement.query_map(
        params![
            key.kind.as_str(),
            key.scope,
            key.name,
            i64::try_from(limit).unwrap_or(i64::MAX)
        ],
        release_row,
    )?;
    rows.map(|row| release_from_row(key, row?)).collect()
}

/// Where a new release stands in its resource's history.
#[derive(Debug, Clone, Copy)]
struct Lineage<'a> {
    /// For a rollback release: the release current when it was rolled back.
    rolled_back_from: Option<i64>,
    /// The incarnation of the resource it runs in.
    incarnation: i64,
    /// What its images run as, taken over from the release whose spec it re-applies (a
    /// rollback, a revert: "back to what ran"); `None`: resolved anew when it starts.
    images: Option<&'a BTreeMap<String, String>>,
}

/// `insert_release` of `desired`'s spec, in its incarnation.
fn insert_desired_release(
    tx: &Transaction<'_>,
    desired: &Desired,
    message: &str,
    rolled_back_from: Option<i64>,
    images: Option<&BTreeMap<String, String>>,
) -> Result<Release> {
    insert_release(
        tx,
        &desired.key,
        &desired.commit,
        &desired.spec_hash,
        &desired.spec_json,
        message,
        Lineage {
            rolled_back_from,
            incarnation: desired.incarnation,
            images,
        },
    )
}

fn insert_release(
    tx: &Transaction<'_>,
    key: &ResourceKey,
    commit: &CommitSha,
    spec_hash: &SpecHash,
    snapshot: &str,
    message: &str,
    lineage: Lineage,
) -> Result<Release> {
    let Lineage {
        rolled_back_from,
        incarnation,
        images,
    } = lineage;
    let started_at = now_unix();
    let images_json =
        images.map(|images| serde_json::to_string(images).expect("a map of strings serialises"));
    tx.execute(
        "INSERT INTO releases (kind, scope, name, commit_sha, spec_hash, snapshot, phase, started_at, message, rolled_back_from, incarnation, images)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'progressing', ?7, ?8, ?9, ?10, ?11)",
        params![
            key.kind.as_str(),
            key.scope,
            key.name,
            commit.as_str(),
            spec_hash.as_str(),
            snapshot,
            started_at,
            message,
            rolled_back_from,
            incarnation,
            images_json
        ],
    )?;
    let id = tx.last_insert_rowid();
    // Retention: keep the newest RELEASE_HISTORY_LIMIT records of this resource.
    tx.execute(
        "DELETE FROM releases WHERE kind = ?1 AND scope = ?2 AND name = ?3 AND id NOT IN (
           SELECT id FROM releases WHERE kind = ?1 AND scope = ?2 AND name = ?3
           ORDER BY id DESC LIMIT ?4)",
        params![
            key.kind.as_str(),
            key.scope,
            key.name,
            i64::try_from(RELEASE_HISTORY_LIMIT).unwrap_or(i64::MAX)
        ],
    )?;
    Ok(Release {
        id,
        key: key.clone(),
        commit: commit.clone(),
        spec_hash: spec_hash.clone(),
        snapshot: snapshot.to_owned(),
        phase: ReleasePhase::Progressing,
        started_at,
        finished_at: None,
        message: message.to_owned(),
        rolled_back_from,
        incarnation,
        images: images.cloned(),
        legacy: false,
    })
}

/// The parts of a desired row that rollback and unpin need.
struct DesiredRow {
    spec: String,
    spec_hash: String,
    generation: i64,
    commit: String,
    incarnation: i64,
}

/// For an automatic rollback: `Superseded` when desired state moved on since `failed`;
/// else `failed` is marked failed and halted, and `Halted` when it was itself a rollback
/// (nothing to go back to). `None`: go on with the rollback.
fn settle_failure(
    tx: &Transaction<'_>,
    trigger: Trigger<'_>,
    latest: &Release,
    current: Option<&DesiredRow>,
) -> Result<Option<AutoRollback>> {
    let Trigger::Automatic { failed, reason } = trigger else {
        return Ok(None);
    };
    let still_desired = current.is_some_and(|row| row.spec_hash == failed.spec_hash.as_str());
    if !still_desired || latest.id != failed.id {
        return Ok(Some(AutoRollback::Superseded));
    }
    // The failure and the halt mark go with the rollback, or alone when there is
    // nothing to go back to: either way the commit is not retried on its own.
    halt_release(tx, failed.id, reason)?;
    record_rollout(
        tx,
        &Who::AGENT,
        "rollout",
        failed.id,
        ActivityOutcome::Failed,
        reason,
    )?;
    Ok(failed
        .rolled_back_from
        .is_some()
        .then_some(AutoRollback::Halted))
}

/// An operator's rollback past `latest`: a release that never finished is not one that ran,
/// so it ends superseded (no later rollback takes it for a good one); a finished one ends
/// rolled back.
fn end_latest(tx: &Transaction<'_>, latest: &Release, target: &Release, now: i64) -> Result<()> {
    if latest.id != target.id
        && matches!(
            latest.phase,
            ReleasePhase::Progressing | ReleasePhase::Succeeded
        )
    {
        let note = format!("rolled back to release #{} by the operator", target.id);
        tx.execute(
            "UPDATE releases SET
               phase = CASE WHEN phase = 'progressing' THEN 'superseded' ELSE 'rolled-back' END,
               finished_at = ?2,
               message = CASE WHEN message = '' THEN ?3 ELSE message || '; ' || ?3 END
             WHERE id = ?1",
            params![latest.id, now, note],
        )?;
    }
    Ok(())
}

/// The rollback release's message: what it went back to, and why.
fn rollback_message(trigger: Trigger<'_>, target: &Release) -> String {
    match trigger {
        Trigger::Operator => format!(
            "rollback to release #{} (commit {}); auto-sync paused until git changes it or `voodu-agent unpin`",
            target.id,
            target.commit.short()
        ),
        Trigger::Automatic { failed, reason } => format!(
            "automatic rollback to release #{} (commit {}): release #{} (commit {}) failed: {reason}; commit {} stays paused for this resource until git changes it or `voodu-agent unpin`",
            target.id,
            target.commit.short(),
            failed.id,
            failed.commit.short(),
            failed.commit.short()
        ),
    }
}

/// Pins `key` to release `release_id` (running `target`'s snapshot), keeping git's version
/// (`git_spec`, `git_commit`) of a first pin.
fn pin_release(
    tx: &Transaction<'_>,
    key: &ResourceKey,
    release_id: i64,
    target: &Release,
    (git_spec, git_commit): (&Option<String>, &Option<String>),
    now: i64,
) -> Result<()> {
    tx.execute(
        "INSERT INTO pins (kind, scope, name, release_id, commit_sha, spec_hash, git_spec, git_commit, pinned_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
         ON CONFLICT (kind, scope, name) DO UPDATE SET
           release_id = excluded.release_id, commit_sha = excluded.commit_sha,
           spec_hash = excluded.spec_hash, pinned_at = excluded.pinned_at",
        params![
            key.kind.as_str(),
            key.scope,
            key.name,
            release_id,
            target.commit.as_str(),
            target.spec_hash.as_str(),
            git_spec,
            git_commit,
            now
        ],
    )?;
    Ok(())
}

/// The rollback in the activity log: by the operator, a rollback and a pin; automatic, one
/// `rollback.auto`.
fn record_rollback(
    tx: &Transaction<'_>,
    who: &Who,
    trigger: Trigger<'_>,
    release_id: i64,
    message: &str,
) -> Result<()> {
    match trigger {
        Trigger::Operator => {
            record_rollout(
                tx,
                who,
                "rollback",
                release_id,
                ActivityOutcome::Succeeded,
                message,
            )?;
            record_rollout(
                tx,
                who,
                "pin",
                release_id,
                ActivityOutcome::Succeeded,
                "auto-sync paused for it until git changes it or `voodu-agent unpin`",
            )?;
        }
        Trigger::Automatic { .. } => {
            record_rollout(
                tx,
                &Who::AGENT,
                "rollback.auto",
                release_id,
                ActivityOutcome::Succeeded,
                message,
            )?;
        }
    }
    Ok(())
}

fn desired_row(tx: &Transaction<'_>, key: &ResourceKey) -> Result<Option<DesiredRow>> {
    Ok(tx
        .query_row(
            "SELECT spec, spec_hash, generation, commit_sha, incarnation FROM desired
             WHERE kind = ?1 AND scope = ?2 AND name = ?3",
            params![key.kind.as_str(), key.scope, key.name],
            |row| {
                Ok(DesiredRow {
                    spec: row.get(0)?,
                    spec_hash: row.get(1)?,
                    generation: row.get(2)?,
                    commit: row.get(3)?,
                    incarnation: row.get(4)?,
                })
            },
        )
        .optional()?)
}

/// The key of a release's `hooks` record that says why its rollout failed after it touched
/// replicas (a record only: whether a release is halted is its `halted` column).
pub const HALT_MARK: &str = "rollout";

/// Ends a progressing release as failed with `reason`, halts it, and records why.
/// The activity row of release `id`'s rollout (its key and commit read from the row).
fn record_rollout(
    tx: &Transaction<'_>,
    who: &Who,
    action: &str,
    id: i64,
    outcome: ActivityOutcome,
    message: &str,
) -> Result<()> {
    let Some((kind, scope, name, commit)) = tx
        .query_row(
            "SELECT kind, scope, name, commit_sha FROM releases WHERE id = ?1",
            params![id],
            |row| <(String, String, String, String)>::try_from(row),
        )
        .optional()?
    else {
        return Ok(());
    };
    let key = key_from_row(&kind, scope, name)?;
    let resource = key.to_string();
    let commit = CommitSha::new(commit);
    let mut entry = Entry::new(action, who, outcome);
    entry.commit = Some(&commit);
    entry.resource = Some(&resource);
    entry.message = message;
    entry.data = serde_json::json!({ "release": id });
    activity::record(tx, &entry)?;
    Ok(())
}

fn halt_release(tx: &Transaction<'_>, id: i64, reason: &str) -> Result<()> {
    let text: String = tx.query_row(
        "SELECT hooks FROM releases WHERE id = ?1",
        params![id],
        |row| row.get(0),
    )?;
    let mut hooks = match serde_json::from_str(&text) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    let now = now_unix();
    hooks.insert(
        HALT_MARK.to_owned(),
        serde_json::json!({ "failed": reason, "at": now }),
    );
    tx.execute(
        "UPDATE releases SET hooks = ?2, phase = 'failed', halted = 1, finished_at = ?3,
           message = CASE WHEN message = '' THEN ?4 ELSE message || '; ' || ?4 END
         WHERE id = ?1 AND phase = 'progressing'",
        params![
            id,
            serde_json::Value::Object(hooks).to_string(),
            now,
            reason
        ],
    )?;
    Ok(())
}

/// `(git_spec, git_commit)` of the pin of `key`, if pinned.
fn pinned_git_version(
    tx: &Transaction<'_>,
    key: &ResourceKey,
) -> Result<Option<(Option<String>, Option<String>)>> {
    Ok(tx
        .query_row(
            "SELECT git_spec, git_commit FROM pins WHERE kind = ?1 AND scope = ?2 AND name = ?3",
            params![key.kind.as_str(), key.scope, key.name],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()?)
}

/// Writes a stored spec JSON (a snapshot, or git's version kept by a pin) as desired state,
/// with its journal PUT; returns the desired row's incarnation.
fn put_desired(
    tx: &Transaction<'_>,
    key: &ResourceKey,
    spec_json: &str,
    generation: i64,
    commit: &CommitSha,
) -> Result<i64> {
    let spec = Spec::from_json(key.kind, spec_json).map_err(|source| Error::Spec {
        key: key.clone(),
        source,
    })?;
    // The resource stays its source's: the one that applied it, else the one whose commit
    // the snapshot is from.
    let source: String = tx.query_row(
        "SELECT COALESCE(
           (SELECT source FROM desired WHERE kind = ?1 AND scope = ?2 AND name = ?3),
           (SELECT source FROM commits WHERE sha = ?4 ORDER BY seq DESC LIMIT 1), '')",
        params![key.kind.as_str(), key.scope, key.name, commit.as_str()],
        |row| row.get(0),
    )?;
    super::desired::put_desired(tx, key, &spec, spec_json, generation, commit, &source)
}

/// `git_spec` of every pin, for `apply_commit`.
pub(super) fn git_specs_of_pins(
    tx: &Transaction<'_>,
) -> Result<BTreeMap<ResourceKey, Option<String>>> {
    let mut statement = tx.prepare_cached("SELECT kind, scope, name, git_spec FROM pins")?;
    let rows = statement.query_map([], |row| {
        <(String, String, String, Option<String>)>::try_from(row)
    })?;
    crate::model::try_map_of(rows.map(|row| {
        let (kind, scope, name, git_spec) = row?;
        Ok((key_from_row(&kind, scope, name)?, git_spec))
    }))
}

pub(super) fn delete_pin(tx: &Transaction<'_>, key: &ResourceKey) -> Result<()> {
    tx.execute(
        "DELETE FROM pins WHERE kind = ?1 AND scope = ?2 AND name = ?3",
        params![key.kind.as_str(), key.scope, key.name],
    )?;
    Ok(())
}

/// The desired row as the choice of a rollback target sees it.
#[derive(Debug, Clone, Copy)]
struct Current<'a> {
    spec_hash: &'a str,
    incarnation: i64,
}

/// Why a rollback has no target.
#[derive(Debug, Clone, PartialEq, Eq)]
enum NoTarget {
    /// The default choice found nothing: an automatic rollback halts the failed release, the
    /// operator is told why.
    NothingToGoBackTo(String),
    /// `--to` names no release that can be gone back to.
    Refused(String),
}

/// The release a rollback re-applies, from `history` (newest first), for the resource whose
/// desired row is `current` (`None`: git no longer declares it).
///
/// `to` (a commit SHA or a prefix of at least 4 hex digits) may name any kept release that ran
/// (succeeded, or succeeded and was later rolled back), of any incarnation: the operator asks
/// for it by name. Without `to`, the target is the newest release that ran with a spec other
/// than the desired one, in the CURRENT incarnation only: a resource deleted from git and
/// added again starts afresh, and its first rollout has nothing to go back to (a release of
/// the deleted incarnation is never resurrected by default).
fn rollback_target<'a>(
    history: &'a [Release],
    current: Option<Current<'_>>,
    to: Option<&str>,
) -> std::result::Result<&'a Release, NoTarget> {
    let ran = |release: &Release| {
        matches!(
            release.phase,
            ReleasePhase::Succeeded | ReleasePhase::RolledBack
        )
    };
    let Some(prefix) = to else {
        let Some(current) = current else {
            return Err(NoTarget::NothingToGoBackTo(
                "git does not declare it any more; pass --to SHA to bring back one of its releases"
                    .to_owned(),
            ));
        };
        let differs =
            |release: &&Release| ran(release) && release.spec_hash.as_str() != current.spec_hash;
        if let Some(release) = history
            .iter()
            .filter(differs)
            .find(|release| release.incarnation == current.incarnation)
        {
            return Ok(release);
        }
        let message = if history.iter().any(|release| differs(&release)) {
            "no release that ran since it was last added to git has a different spec (releases from before it was deleted are only gone back to with --to SHA)"
        } else {
            "no earlier release that ran has a different spec; pass --to SHA"
        };
        return Err(NoTarget::NothingToGoBackTo(message.to_owned()));
    };
    // `#N`: release N itself (`rollback --release N`).
    if let Some(number) = prefix.trim().strip_prefix('#') {
        let id: i64 = number.parse().map_err(|_| {
            NoTarget::Refused(format!("--release {number:?} is not a release number"))
        })?;
        return match history.iter().find(|release| release.id == id) {
            Some(release) if ran(release) => Ok(release),
            Some(release) => Err(NoTarget::Refused(format!(
                "release #{id} never ran (it is {}): only a release that ran is gone back to",
                release.phase.as_str()
            ))),
            None => Err(NoTarget::Refused(format!(
                "no release #{id} is recorded for it (`voodu-agent releases` lists them)"
            ))),
        };
    }
    let prefix = prefix.trim().to_ascii_lowercase();
    if prefix.len() < 4 {
        return Err(NoTarget::Refused(format!(
            "--to {prefix:?} is too short: give at least 4 hex digits of a commit SHA"
        )));
    }
    let matching: Vec<&Release> = history
        .iter()
        .filter(|release| release.commit.as_str().starts_with(&prefix))
        .collect();
    let commits: std::collections::BTreeSet<&str> = matching
        .iter()
        .map(|release| release.commit.as_str())
        .collect();
    if commits.len() > 1 {
        return Err(NoTarget::Refused(format!(
            "--to {prefix} matches releases of {} commits; give more digits",
            commits.len()
        )));
    }
    let Some(newest) = matching.first() else {
        return Err(NoTarget::Refused(format!(
            "no kept release has commit {prefix} (see `voodu-agent releases`)"
        )));
    };
    matching
        .iter()
        .find(|release| ran(release))
        .copied()
        .ok_or_else(|| {
            NoTarget::Refused(format!(
                "release #{} of commit {} is {}: only a release that ran can be rolled back to",
                newest.id,
                newest.commit.short(),
                newest.phase.as_str()
            ))
        })
}

fn short(text: &str) -> &str {
    text.get(..12).unwrap_or(text)
}

impl Store {
    /// The newest release of a resource.
    pub fn latest_release(&self, key: &ResourceKey) -> Result<Option<Release>> {
        Ok(self.releases(key, 1)?.into_iter().next())
    }

    /// Records what release `id`'s images run as, once: a release resolves its images when it
    /// starts, and keeps them (a second resolution of the same release changes nothing).
    /// Returns what the release runs as afterwards.
    pub(crate) fn record_release_images(
        &self,
        id: i64,
        images: &BTreeMap<String, String>,
    ) -> Result<BTreeMap<String, String>> {
        let json = serde_json::to_string(images).expect("a map of strings serialises");
        let stored = self.with(|connection| {
            connection.execute(
                "UPDATE releases SET images = ?2 WHERE id = ?1 AND images IS NULL",
                params![id, json],
            )?;
            let stored: Option<String> = connection
                .query_row(
                    "SELECT images FROM releases WHERE id = ?1",
                    params![id],
                    |row| row.get(0),
                )
                .optional()?
                .flatten();
            Ok(stored)
        })?;
        self.mark_changed();
        Ok(images_of(stored.as_deref())?.unwrap_or_else(|| images.clone()))
    }

    /// `voodu-agent redeploy`: a new release of what `key` declares now, whose images are
    /// resolved anew (a tag that moved runs its new bytes; the spec is unchanged), in one
    /// transaction with the journal row that wakes the reconciler. A rollout in flight is
    /// superseded by it.
    pub fn redeploy(&self, key: &ResourceKey) -> Result<Release> {
        let who = self.who.clone();
        let (release, head) = self.with(|connection| {
            let tx = connection.transaction()?;
            let Some(current) = desired_row(&tx, key)? else {
                return Err(Error::Rollback {
                    key: key.clone(),
                    message: "it is not in desired state: nothing to redeploy".to_owned(),
                });
            };
            let commit = CommitSha::new(current.commit.clone());
            tx.execute(
                "UPDATE releases SET phase = 'superseded', finished_at = ?4,
                   message = CASE WHEN message = '' THEN ?5 ELSE message || '; ' || ?5 END
                 WHERE kind = ?1 AND scope = ?2 AND name = ?3 AND phase = 'progressing'",
                params![
                    key.kind.as_str(),
                    key.scope,
                    key.name,
                    now_unix(),
                    "superseded by a redeploy"
                ],
            )?;
            let message = format!(
                "redeploy of commit {}: images resolved anew",
                commit.short()
            );
            let release = insert_release(
                &tx,
                key,
                &commit,
                &SpecHash::new(current.spec_hash.clone()),
                &current.spec,
                &message,
                Lineage {
                    rolled_back_from: None,
                    incarnation: current.incarnation,
                    images: None,
                },
            )?;
            record_rollout(
                &tx,
                &who,
                "redeploy",
                release.id,
                ActivityOutcome::Succeeded,
                &message,
            )?;
            append_journal(&tx, key, super::Op::Put, current.generation, &commit)?;
            let head: i64 =
                tx.query_row("SELECT COALESCE(MAX(seq), 0) FROM journal", [], |row| {
                    row.get(0)
                })?;
            tx.commit()?;
            Ok((release, head))
        })?;
        self.shared.journal_head.send_replace(head);
        self.mark_changed();
        Ok(release)
    }

    /// Each resource's newest release that resolved its images: `(key, image, what it runs
    /// as)` for every image (what the image scanner watches for a moved tag).
    pub(crate) fn running_images(&self) -> Result<Vec<(ResourceKey, String, String)>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(
                "SELECT r.kind, r.scope, r.name, r.images FROM releases r
                 WHERE r.images IS NOT NULL AND r.legacy = 0
                   AND r.id = (SELECT MAX(id) FROM releases x
                               WHERE x.kind = r.kind AND x.scope = r.scope AND x.name = r.name)",
            )?;
            let rows =
                statement.query_map([], |row| <(String, String, String, String)>::try_from(row))?;
            let mut out = Vec::new();
            for row in rows {
                let (kind, scope, name, images) = row?;
                let key = key_from_row(&kind, scope, name)?;
                for (image, runs) in images_of(Some(&images))?.unwrap_or_default() {
                    out.push((key.clone(), image, runs));
                }
            }
            Ok(out)
        })
    }

    /// Releases of a resource, newest first, at most `limit`.
    pub fn releases(&self, key: &ResourceKey, limit: usize) -> Result<Vec<Release>> {
        self.with(|connection| read_releases(connection, key, limit))
    }

    /// Starts a progressing release for `desired`, keyed to the commit that last changed it.
    /// When an earlier release that ran (succeeded or later rolled back) had the same spec
    /// hash, as after a `git revert`, the message says so.
    pub fn begin_release(&self, desired: &Desired) -> Result<Release> {
        let result = self.with(|connection| {
            let tx = connection.transaction()?;
            let earlier = tx
                .query_row(
                    "SELECT id, commit_sha, images FROM releases
                     WHERE kind = ?1 AND scope = ?2 AND name = ?3 AND spec_hash = ?4
                       AND phase IN ('succeeded', 'rolled-back')
                     ORDER BY id DESC LIMIT 1",
                    params![
                        desired.key.kind.as_str(),
                        desired.key.scope,
                        desired.key.name,
                        desired.spec_hash.as_str()
                    ],
                    |row| <(i64, String, Option<String>)>::try_from(row),
                )
                .optional()?;
            // The spec of a release that ran (a `git revert`): back to what ran, its images.
            let images = match &earlier {
                Some((_, _, images)) => images_of(images.as_deref())?,
                None => None,
            };
            let message = earlier.map_or_else(String::new, |(id, commit, _)| {
                format!("same spec as release #{id} (commit {})", short(&commit))
            });
            // A rollout still in flight is cancelled by this one: it ends as superseded. One of
            // another commit tells that commit's status it will not end
            // (`rollout.superseded`, notify's commit statuses).
            let superseded: Vec<(i64, String)> = {
                let mut statement = tx.prepare_cached(
                    "SELECT id, commit_sha FROM releases
                     WHERE kind = ?1 AND scope = ?2 AND name = ?3 AND phase = 'progressing'
                       AND commit_sha <> ?4",
                )?;
                let rows = statement.query_map(
                    params![
                        desired.key.kind.as_str(),
                        desired.key.scope,
                        desired.key.name,
                        desired.commit.as_str()
                    ],
                    |row| <(i64, String)>::try_from(row),
                )?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            for (id, commit) in &superseded {
                super::outbox::put(
                    &tx,
                    &super::outbox::NewEvent {
                        event: "rollout.superseded",
                        resource: &desired.key.to_string(),
                        commit: Some(&CommitSha::new(commit.clone())),
                        message: &format!(
                            "release #{id} superseded by commit {} before its rollout ended",
                            desired.commit.short()
                        ),
                        data: serde_json::json!({
                            "release": id,
                            "superseded_by": desired.commit.as_str(),
                        }),
                        source: "",
                    },
                )?;
            }
            tx.execute(
                "UPDATE releases SET phase = 'superseded', finished_at = ?4,
                   message = CASE WHEN message = '' THEN ?5 ELSE message || '; ' || ?5 END
                 WHERE kind = ?1 AND scope = ?2 AND name = ?3 AND phase = 'progressing'",
                params![
                    desired.key.kind.as_str(),
                    desired.key.scope,
                    desired.key.name,
                    now_unix(),
                    format!("superseded by commit {}", desired.commit.short())
                ],
            )?;
            let release = insert_desired_release(&tx, desired, &message, None, images.as_ref())?;
            record_rollout(
                &tx,
                &Who::AGENT,
                "rollout",
                release.id,
                ActivityOutcome::Started,
                &message,
            )?;
            tx.commit()?;
            Ok(release)
        });
        self.mark_changed();
        result
    }

    /// Ends a progressing release as failed and halted before it touched replicas (a
    /// `pre_command` or `command` failed): the reconciler leaves it alone until desired state
    /// changes. `message` is appended to what the release already says.
    pub(crate) fn halt_release(&self, id: i64, message: &str) -> Result<()> {
        self.with(|connection| {
            let tx = connection.transaction()?;
            let ended = tx.execute(
                "UPDATE releases SET phase = 'failed', halted = 1, finished_at = ?2,
                   message = CASE WHEN message = '' THEN ?3 ELSE message || '; ' || ?3 END
                 WHERE id = ?1 AND phase = 'progressing'",
                params![id, now_unix(), message],
            )?;
            if ended > 0 {
                record_rollout(
                    &tx,
                    &Who::AGENT,
                    "rollout",
                    id,
                    ActivityOutcome::Halted,
                    message,
                )?;
            }
            tx.commit()?;
            Ok(())
        })
    }

    /// Whether a release is halted: it failed, and the reconciler leaves the resource alone
    /// until desired state changes.
    pub(crate) fn release_halted(&self, id: i64) -> Result<bool> {
        self.with(|connection| {
            Ok(connection.query_row(
                "SELECT halted FROM releases WHERE id = ?1",
                params![id],
                |row| row.get(0),
            )?)
        })
    }

    /// The recorded outcomes of a release's hooks, by stage (`pre_command`, `command`,
    /// `post_command`).
    pub fn release_hooks(&self, id: i64) -> Result<serde_json::Map<String, serde_json::Value>> {
        self.with(|connection| {
            let text: String = connection.query_row(
                "SELECT hooks FROM releases WHERE id = ?1",
                params![id],
                |row| row.get(0),
            )?;
            Ok(match serde_json::from_str(&text) {
                Ok(serde_json::Value::Object(map)) => map,
                _ => serde_json::Map::new(),
            })
        })
    }

    /// Records the outcome of one hook stage of a release.
    pub(crate) fn record_release_hook(
        &self,
        id: i64,
        stage: &str,
        outcome: serde_json::Value,
    ) -> Result<()> {
        let mut hooks = self.release_hooks(id)?;
        hooks.insert(stage.to_owned(), outcome);
        let text = serde_json::Value::Object(hooks).to_string();
        self.with(|connection| {
            connection.execute(
                "UPDATE releases SET hooks = ?2 WHERE id = ?1",
                params![id, text],
            )?;
            Ok(())
        })
    }

    /// Another attempt at `failed` (a rollout that failed before touching replicas, now able
    /// to go on): a new progressing release for `desired`, keeping what `failed` rolled back
    /// from (a retried rollback is still a rollback).
    pub(crate) fn retry_release(&self, failed: &Release, desired: &Desired) -> Result<Release> {
        self.with(|connection| {
            let tx = connection.transaction()?;
            let release = insert_desired_release(
                &tx,
                desired,
                &format!("another attempt after release #{}", failed.id),
                failed.rolled_back_from,
                failed.images.as_ref(),
            )?;
            tx.commit()?;
            Ok(release)
        })
    }

    /// Ends a progressing release with its final phase. `message` is appended to what the
    /// release already says. A release that is no longer progressing (an operator rolled
    /// back meanwhile) is left as it is.
    pub fn finish_release(&self, id: i64, phase: ReleasePhase, message: &str) -> Result<()> {
        let result = self.with(|connection| {
            let tx = connection.transaction()?;
            let ended = tx.execute(
                "UPDATE releases SET phase = ?2, finished_at = ?3,
                   message = CASE WHEN ?4 = '' THEN message
                                  WHEN message = '' THEN ?4
                                  ELSE message || '; ' || ?4 END
                 WHERE id = ?1 AND phase = 'progressing'",
                params![id, phase.as_str(), now_unix(), message],
            )?;
            if ended > 0 {
                record_rollout(&tx, &Who::AGENT, "rollout", id, phase.into(), message)?;
            }
            tx.commit()?;
            Ok(())
        });
        self.mark_changed();
        result
    }

    /// The pin of a resource, if the operator rolled it back.
    pub fn pin(&self, key: &ResourceKey) -> Result<Option<Pin>> {
        Ok(self.pins()?.into_iter().find(|pin| &pin.key == key))
    }

    /// Every pin, ordered by key.
    pub fn pins(&self) -> Result<Vec<Pin>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(
                "SELECT kind, scope, name, release_id, commit_sha, spec_hash, git_spec, git_commit, pinned_at
                 FROM pins ORDER BY kind, scope, name",
            )?;
            let rows = statement.query_map([], |row| {
                Ok((
                    (
                        row.get::<_, String>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, String>(2)?,
                    ),
                    row.get::<_, i64>(3)?,
                    row.get::<_, String>(4)?,
                    row.get::<_, String>(5)?,
                    row.get::<_, Option<String>>(6)?,
                    row.get::<_, Option<String>>(7)?,
                    row.get::<_, i64>(8)?,
                ))
            })?;
            rows.map(|row| {
                let ((kind, scope, name), release_id, commit, spec_hash, git_spec, git_commit, pinned_at) =
                    row?;
                Ok(Pin {
                    key: key_from_row(&kind, scope, name)?,
                    release_id,
                    commit: CommitSha::new(commit),
                    spec_hash: SpecHash::new(spec_hash),
                    git_spec,
                    git_commit: git_commit.map(CommitSha::new),
                    pinned_at,
                })
            })
            .collect()
        })
    }

    /// Every resource the store knows by `scope` and `name`, of any kind: in desired state,
    /// with releases, or pinned. Used to resolve `SCOPE/NAME` on the command line.
    pub(crate) fn keys_named(&self, scope: &str, name: &str) -> Result<Vec<ResourceKey>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(
                "SELECT kind FROM desired WHERE scope = ?1 AND name = ?2
                 UNION SELECT kind FROM releases WHERE scope = ?1 AND name = ?2
                 UNION SELECT kind FROM pins WHERE scope = ?1 AND name = ?2
                 ORDER BY 1",
            )?;
            let rows = statement.query_map(params![scope, name], |row| row.get::<_, String>(0))?;
            rows.map(|kind| key_from_row(&kind?, scope.to_owned(), name.to_owned()))
                .collect()
        })
    }

    /// Re-applies the snapshot of an earlier release and pins the resource, in one
    /// transaction.
    ///
    /// `to` selects the release by commit SHA (a prefix will do; the newest release of that
    /// commit wins), of any incarnation. Without it, the target is the newest release that
    /// ran (succeeded, or succeeded and was later rolled back) with a spec other than the
    /// current desired one, in the current incarnation: what an operator means by "go back"
    /// (`rollback_target`). Failed and progressing releases never ran to completion and are
    /// refused.
    pub fn rollback(&self, key: &ResourceKey, to: Option<&str>) -> Result<RollbackOutcome> {
        match self.roll_back(key, to, Trigger::Operator)? {
            AutoRollback::Done(outcome) => Ok(*outcome),
            AutoRollback::Halted | AutoRollback::Superseded => Err(Error::Rollback {
                key: key.clone(),
                message: "nothing to roll back to".to_owned(),
            }),
        }
    }

    /// The release `rollback(key, to)` would re-apply now (its id), changing nothing.
    pub fn rollback_target_of(&self, key: &ResourceKey, to: Option<&str>) -> Result<i64> {
        let refuse = |message: String| Error::Rollback {
            key: key.clone(),
            message,
        };
        self.with(|connection| {
            let tx = connection.transaction()?;
            let history = read_releases(&tx, key, usize::MAX)?;
            let current = desired_row(&tx, key)?;
            let now_desired = current.as_ref().map(|row| Current {
                spec_hash: &row.spec_hash,
                incarnation: row.incarnation,
            });
            match rollback_target(&history, now_desired, to) {
                Ok(target) => Ok(target.id),
                Err(NoTarget::NothingToGoBackTo(message) | NoTarget::Refused(message)) => {
                    Err(refuse(message))
                }
            }
        })
    }

    /// The automatic rollback of a rollout that failed (`failed`, still the desired spec), in
    /// one transaction: `failed` ends as failed with `reason` and a halt mark (its commit is
    /// not retried for this resource until git changes the resource again), then, as
    /// `rollback` without `--to`, the newest release that ran with another spec in the current
    /// incarnation is re-applied and pinned. `Halted` when there is nothing to go back to (no
    /// earlier release of this incarnation ran — a first rollout, also the first after a
    /// delete and re-add — or `failed` was itself a rollback); `Superseded`, with nothing changed, when desired state
    /// moved on meanwhile.
    pub(crate) fn auto_rollback(&self, failed: &Release, reason: &str) -> Result<AutoRollback> {
        self.roll_back(&failed.key, None, Trigger::Automatic { failed, reason })
    }

    fn roll_back(
        &self,
        key: &ResourceKey,
        to: Option<&str>,
        trigger: Trigger<'_>,
    ) -> Result<AutoRollback> {
        let refuse = |message: String| Error::Rollback {
            key: key.clone(),
            message,
        };
        let who = self.who.clone();
        let (outcome, head) = self.with(|connection| {
            let tx = connection.transaction()?;
            let history = read_releases(&tx, key, usize::MAX)?;
            let Some(latest) = history.first().cloned() else {
                return Err(refuse("no releases are recorded for it".to_owned()));
            };
            let current = desired_row(&tx, key)?;
            if let Some(settled) = settle_failure(&tx, trigger, &latest, current.as_ref())? {
                if settled == AutoRollback::Halted {
                    tx.commit()?;
                }
                return Ok((settled, None));
            }
            let now_desired = current.as_ref().map(|row| Current {
                spec_hash: &row.spec_hash,
                incarnation: row.incarnation,
            });
            let target = match rollback_target(&history, now_desired, to) {
                Ok(target) => target.clone(),
                Err(NoTarget::NothingToGoBackTo(_))
                    if matches!(trigger, Trigger::Automatic { .. }) =>
                {
                    tx.commit()?;
                    return Ok((AutoRollback::Halted, None));
                }
                Err(NoTarget::NothingToGoBackTo(message) | NoTarget::Refused(message)) => {
                    return Err(refuse(message));
                }
            };
            // Already pinned: desired holds a snapshot and the pin keeps git's version.
            // Otherwise desired is git's version.
            let (git_spec, git_commit) = match pinned_git_version(&tx, key)? {
                Some(git_version) => git_version,
                None => (
                    current.as_ref().map(|row| row.spec.clone()),
                    current.as_ref().map(|row| row.commit.clone()),
                ),
            };
            let now = now_unix();
            if matches!(trigger, Trigger::Operator) {
                end_latest(&tx, &latest, &target, now)?;
            }
            let message = rollback_message(trigger, &target);
            // Desired first: a resource git no longer declares comes back as a new
            // incarnation, and the rollback release belongs to it.
            let generation = current.as_ref().map_or(1, |row| row.generation + 1);
            let incarnation = put_desired(&tx, key, &target.snapshot, generation, &target.commit)?;
            let release = insert_release(
                &tx,
                key,
                &target.commit,
                &target.spec_hash,
                &target.snapshot,
                &message,
                Lineage {
                    rolled_back_from: Some(latest.id),
                    incarnation,
                    // Rollback is the old bytes: what the target ran, not what its tag
                    // names now.
                    images: target.images.as_ref(),
                },
            )?;
            pin_release(&tx, key, release.id, &target, (&git_spec, &git_commit), now)?;
            record_rollback(&tx, &who, trigger, release.id, &message)?;
            let head: i64 =
                tx.query_row("SELECT COALESCE(MAX(seq), 0) FROM journal", [], |row| {
                    row.get(0)
                })?;
            tx.commit()?;
            let git_differs = git_spec.as_deref() != Some(target.snapshot.as_str());
            Ok((
                AutoRollback::Done(Box::new(RollbackOutcome {
                    release,
                    target,
                    git_differs,
                })),
                Some(head),
            ))
        })?;
        if let Some(head) = head {
            self.shared.journal_head.send_replace(head);
        }
        Ok(outcome)
    }

    /// Clears the pin of `key` and gives desired state back to git, in one transaction:
    /// git's version of the resource is written (or, if git does not declare it, the
    /// resource is deleted), with its journal row.
    pub(crate) fn unpin(&self, key: &ResourceKey) -> Result<UnpinOutcome> {
        let who = self.who.clone();
        let (outcome, head) = self.with(|connection| {
            let tx = connection.transaction()?;
            let Some((git_spec, git_commit)) = pinned_git_version(&tx, key)? else {
                return Err(Error::NotPinned { key: key.clone() });
            };
            delete_pin(&tx, key)?;
            let current = desired_row(&tx, key)?;
            let git_commit = git_commit.map(CommitSha::new);
            let changed = match (&git_spec, &current) {
                (Some(git_spec), Some(row)) if *git_spec == row.spec => false,
                (Some(git_spec), current) => {
                    let generation = current.as_ref().map_or(1, |row| row.generation + 1);
                    // git_spec and git_commit come from one desired row: both or neither.
                    let commit = git_commit.clone().ok_or_else(|| {
                        Error::Corrupt(format!("pin of {key} has a git spec but no git commit"))
                    })?;
                    put_desired(&tx, key, git_spec, generation, &commit)?;
                    true
                }
                (None, Some(row)) => {
                    tx.execute(
                        "DELETE FROM desired WHERE kind = ?1 AND scope = ?2 AND name = ?3",
                        params![key.kind.as_str(), key.scope, key.name],
                    )?;
                    append_journal(
                        &tx,
                        key,
                        super::Op::Delete,
                        row.generation + 1,
                        &CommitSha::new(row.commit.clone()),
                    )?;
                    true
                }
                (None, None) => false,
            };
            let resource = key.to_string();
            let mut entry = Entry::new("unpin", &who, ActivityOutcome::Succeeded);
            entry.commit = git_commit.as_ref();
            entry.resource = Some(&resource);
            entry.message = if changed {
                "the resource follows git again"
            } else {
                "the resource follows git again (git declares what runs)"
            };
            activity::record(&tx, &entry)?;
            let head: i64 =
                tx.query_row("SELECT COALESCE(MAX(seq), 0) FROM journal", [], |row| {
                    row.get(0)
                })?;
            tx.commit()?;
            Ok((
                UnpinOutcome {
                    git_commit,
                    changed,
                },
                head,
            ))
        })?;
        self.shared.journal_head.send_replace(head);
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Kind;

    /// A release of `deployment/s/web`: id, commit number, spec hash, phase, incarnation.
    fn release(id: i64, commit: u32, hash: &str, phase: ReleasePhase, incarnation: i64) -> Release {
        Release {
            id,
            key: ResourceKey::new(Kind::Deployment, "s", "web"),
            commit: CommitSha::new(sha_text(commit)),
            spec_hash: SpecHash::new(hash),
            snapshot: String::new(),
            phase,
            started_at: 0,
            finished_at: None,
            message: String::new(),
            rolled_back_from: None,
            incarnation,
            images: None,
            legacy: false,
        }
    }

    /// The target's id, or `nothing: …` / `refused: …` with the message.
    fn check(history: &[Release], current: Option<(&str, i64)>, to: Option<&str>, expected: &str) {
        let current = current.map(|(spec_hash, incarnation)| Current {
            spec_hash,
            incarnation,
        });
        let got = match rollback_target(history, current, to) {
            Ok(release) => format!("#{}", release.id),
            Err(NoTarget::NothingToGoBackTo(message)) => format!("nothing: {message}"),
            Err(NoTarget::Refused(message)) => format!("refused: {message}"),
        };
        assert_eq!(got, expected, "current {current:?}, --to {to:?}");
    }

    #[test]
    fn a_rollback_goes_back_within_the_current_incarnation_unless_told_a_commit() {
        use ReleasePhase::{Failed, Progressing, RolledBack, Succeeded, Superseded};
        const OLDER_ONLY: &str = "nothing: no release that ran since it was last added to git has a different spec (releases from before it was deleted are only gone back to with --to SHA)";
        const NONE_RAN: &str =
            "nothing: no earlier release that ran has a different spec; pass --to SHA";
        // Deployed twice (incarnation 1), deleted from git, re-added with `c` (incarnation 2).
        let readded = [
            release(3, 3, "c", Progressing, 2),
            release(2, 2, "b", Succeeded, 1),
            release(1, 1, "a", Succeeded, 1),
        ];
        let (b, c) = (sha_text(2), sha_text(3));
        type Case<'a> = (
            &'a [Release],
            Option<(&'a str, i64)>,
            Option<&'a str>,
            &'a str,
        );
        let cases: &[Case<'_>] = &[
            // The resurrect case: the deleted incarnation's `b` is not gone back to.
            (&readded, Some(("c", 2)), None, OLDER_ONLY),
            // The operator may still name it.
            (&readded, Some(("c", 2)), Some(b.as_str()), "#2"),
            (&readded, Some(("c", 2)), Some(&b[..6]), "#2"),
            // Within one incarnation: the newest that ran with another spec.
            (&readded[1..], Some(("b", 1)), None, "#1"),
            (
                &[
                    release(4, 4, "d", Failed, 1),
                    release(3, 3, "c", Superseded, 1),
                    release(2, 2, "b", RolledBack, 1),
                    release(1, 1, "a", Succeeded, 1),
                ],
                Some(("d", 1)),
                None,
                "#2",
            ),
            // A first rollout: nothing ran before.
            (
                &[release(1, 1, "a", Progressing, 1)],
                Some(("a", 1)),
                None,
                NONE_RAN,
            ),
            // Only the same spec ran.
            (
                &[release(1, 1, "a", Succeeded, 1)],
                Some(("a", 1)),
                None,
                NONE_RAN,
            ),
            // Two deletes: incarnation 3 sees neither 1 nor 2.
            (
                &[
                    release(3, 3, "c", Failed, 3),
                    release(2, 2, "b", Succeeded, 2),
                    release(1, 1, "a", Succeeded, 1),
                ],
                Some(("c", 3)),
                None,
                OLDER_ONLY,
            ),
            // Rows from before incarnations were recorded (0) keep going back among themselves.
            (
                &[
                    release(2, 2, "b", Failed, 0),
                    release(1, 1, "a", Succeeded, 0),
                ],
                Some(("b", 0)),
                None,
                "#1",
            ),
            // Not declared in git (deleted): only --to brings a release back.
            (
                &readded[1..],
                None,
                None,
                "nothing: git does not declare it any more; pass --to SHA to bring back one of its releases",
            ),
            (&readded[1..], None, Some(b.as_str()), "#2"),
            // --to refusals.
            (
                &readded,
                Some(("c", 2)),
                Some(c.as_str()),
                "refused: release #3 of commit 300000000000 is progressing: only a release that ran can be rolled back to",
            ),
            (
                &readded,
                Some(("c", 2)),
                Some("abc"),
                "refused: --to \"abc\" is too short: give at least 4 hex digits of a commit SHA",
            ),
            (
                &readded,
                Some(("c", 2)),
                Some("ffff"),
                "refused: no kept release has commit ffff (see `voodu-agent releases`)",
            ),
        ];
        for (history, current, to, expected) in cases {
            check(history, *current, *to, expected);
        }
    }

    /// A commit SHA starting with the hex digit `n` (< 16), so prefixes tell commits apart.
    fn sha_text(n: u32) -> String {
        format!("{n:x}{n:039x}")
    }
}
