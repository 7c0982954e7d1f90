//! Data runs: the backups, restores and verifies of a statefulset's claims (`backup {}`), one
//! row each, from asked for to ended, with the snapshots they took or restored.
//!
//! A run is asked for (`pending`: by the schedule, by a release with `before_release`, by the
//! operator's `backup`, `restore` or `rollback --with-data`), moved on by the resource's
//! handler pass by pass (`running`, the ordinal it is at and its step there), and ended once
//! (`succeeded`, `failed` or `superseded`), in the transaction that writes its activity row and
//! outbox event.
//!
//! Invariants: a snapshot is recorded only once restic reported it finished (a run whose agent
//! was killed holds none of the snapshots its unfinished step was taking); one run per
//! resource is open (pending or running) at a time, the oldest first; a run ends once; at most
//! [`HISTORY`] ended runs are kept per resource (a run a release's `before_release` took is
//! kept while its release is); snapshot maps and messages are bounded.

use std::collections::BTreeMap;

use rusqlite::{OptionalExtension, params};

use super::activity::{self, ActivityOutcome, Entry, Who};
use super::{Result, Store, now_unix};
use crate::model::ResourceKey;
use crate::model::text::cut;

/// Ended runs kept per resource.
pub(crate) const HISTORY: usize = 50;
/// Longest message kept, in bytes.
const MAX_MESSAGE_BYTES: usize = 1024;

/// What a run does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataWhat {
    /// Snapshots every claim (or the exec command's output) of every pod.
    Backup,
    /// Puts snapshots back into the claims (or feeds a dump to the restore command).
    Restore,
    /// Restores the newest snapshots into a scratch directory and compares them.
    Verify,
}

impl DataWhat {
    pub fn as_str(self) -> &'static str {
        match self {
            DataWhat::Backup => "backup",
            DataWhat::Restore => "restore",
            DataWhat::Verify => "verify",
        }
    }

    fn parse(text: &str) -> DataWhat {
        match text {
            "restore" => DataWhat::Restore,
            "verify" => DataWhat::Verify,
            _ => DataWhat::Backup,
        }
    }
}

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataState {
    Pending,
    Running,
    Succeeded,
    Failed,
    /// The resource left the repo, or a newer request replaced it.
    Superseded,
}

impl DataState {
    pub fn as_str(self) -> &'static str {
        match self {
            DataState::Pending => "pending",
            DataState::Running => "running",
            DataState::Succeeded => "succeeded",
            DataState::Failed => "failed",
            DataState::Superseded => "superseded",
        }
    }

    fn parse(text: &str) -> DataState {
        match text {
            "running" => DataState::Running,
            "succeeded" => DataState::Succeeded,
            "failed" => DataState::Failed,
            "superseded" => DataState::Superseded,
            _ => DataState::Pending,
        }
    }

    /// Whether the run has ended.
    pub fn ended(self) -> bool {
        matches!(
            self,
            DataState::Succeeded | DataState::Failed | DataState::Superseded
        )
    }
}

/// Why a run was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataReason {
    /// The backup's `schedule` (or `verify` period) came round.
    Schedule,
    /// A release with `before_release = true` is about to touch its pods.
    BeforeRelease,
    /// The operator: `backup`, `restore`.
    Manual,
    /// `rollback --with-data`.
    Rollback,
}

impl DataReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DataReason::Schedule => "schedule",
            DataReason::BeforeRelease => "before_release",
            DataReason::Manual => "manual",
            DataReason::Rollback => "rollback",
        }
    }

    fn parse(text: &str) -> DataReason {
        match text {
            "schedule" => DataReason::Schedule,
            "before_release" => DataReason::BeforeRelease,
            "rollback" => DataReason::Rollback,
            _ => DataReason::Manual,
        }
    }
}

/// One data run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataRun {
    pub id: i64,
    pub key: ResourceKey,
    pub what: DataWhat,
    pub reason: DataReason,
    /// The release a `before_release` backup guards.
    pub release_id: Option<i64>,
    pub state: DataState,
    /// The ordinal the run is at (pods are taken in ordinal order).
    pub ordinal: i64,
    /// Where the run is within its ordinal (the handler's own words, e.g. `stopped`).
    pub step: String,
    /// A restore of one ordinal only.
    pub only_ordinal: Option<i64>,
    /// Snapshot ids by the claim volume (or `<pod>.dump`) they hold: what a backup took, what
    /// a restore puts back.
    pub snapshots: BTreeMap<String, String>,
    /// Bytes read by the backup (restic's `total_bytes_processed`), or restored.
    pub bytes: i64,
    pub message: String,
    pub requested_at: i64,
    pub started_at: Option<i64>,
    pub ended_at: Option<i64>,
}

/// What `/metrics` shows of one resource's backups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupFigures {
    /// `kind/scope/name`.
    pub resource: String,
    /// When the newest successful backup ended (Unix seconds).
    pub last_success: Option<i64>,
    /// Its bytes read and seconds taken.
    pub bytes: i64,
    pub seconds: i64,
    /// When the newest successful verify ended.
    pub last_verified: Option<i64>,
    /// Whether the newest ended backup failed.
    pub failing: bool,
}

/// A run to ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDataRun {
    pub what: DataWhat,
    pub reason: DataReason,
    pub release_id: Option<i64>,
    pub only_ordinal: Option<i64>,
    pub snapshots: BTreeMap<String, String>,
}

const COLUMNS: &str = "id, kind, scope, name, what, reason, release_id, state, ordinal, step, \
     only_ordinal, snapshots, bytes, message, requested_at, started_at, ended_at";

fn run_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Option<DataRun>> {
    let kind: String = row.get(1)?;
    let Some(kind) = crate::model::Kind::parse(&kind) else {
        return Ok(None);
    };
    let snapshots: String = row.get(11)?;
    Ok(Some(DataRun {
        id: row.get(0)?,
        key: ResourceKey::new(kind, row.get::<_, String>(2)?, row.get::<_, String>(3)?),
        what: DataWhat::parse(&row.get::<_, String>(4)?),
        reason: DataReason::parse(&row.get::<_, String>(5)?),
        release_id: row.get(6)?,
        state: DataState::parse(&row.get::<_, String>(7)?),
        ordinal: row.get(8)?,
        step: row.get(9)?,
        only_ordinal: row.get(10)?,
        snapshots: serde_json::from_str(&snapshots).unwrap_or_default(),
        bytes: row.get(12)?,
        message: row.get(13)?,
        requested_at: row.get(14)?,
        started_at: row.get(15)?,
        ended_at: row.get(16)?,
    }))
}

fn snapshots_text(snapshots: &BTreeMap<String, String>) -> String {
    serde_json::to_string(snapshots).unwrap_or_else(|_| "{}".to_owned())
}

impl Store {
    /// Asks for a run of `key`; returns its id. A manual request is recorded in the activity
    /// log (who asked) in the same transaction.
    pub fn request_data_run(&self, key: &ResourceKey, run: &NewDataRun) -> Result<i64> {
        let who = self.who.clone();
        let result = self.with(|connection| {
            let tx = connection.transaction()?;
            tx.execute(
                "INSERT INTO data_runs (kind, scope, name, what, reason, release_id, state,
                     only_ordinal, snapshots, requested_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'pending', ?7, ?8, ?9)",
                params![
                    key.kind.as_str(),
                    key.scope,
                    key.name,
                    run.what.as_str(),
                    run.reason.as_str(),
                    run.release_id,
                    run.only_ordinal,
                    snapshots_text(&run.snapshots),
                    now_unix()
                ],
            )?;
            let id = tx.last_insert_rowid();
            if matches!(run.reason, DataReason::Manual | DataReason::Rollback) {
                let resource = key.to_string();
                let message = format!("{} asked for (run #{id})", run.what.as_str());
                let mut entry = Entry::new(run.what.as_str(), &who, ActivityOutcome::Requested);
                entry.resource = Some(&resource);
                entry.message = &message;
                entry.data = serde_json::json!({ "run": id, "snapshots": run.snapshots });
                activity::record(&tx, &entry)?;
            }
            tx.commit()?;
            Ok(id)
        });
        self.mark_changed();
        result
    }

    /// The resources with a run asked for and not started yet (one indexed query).
    pub(crate) fn pending_data_runs(&self) -> Result<Vec<ResourceKey>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(
                "SELECT DISTINCT kind, scope, name FROM data_runs WHERE state = 'pending'",
            )?;
            let rows = statement.query_map([], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                ))
            })?;
            let mut keys = Vec::new();
            for row in rows {
                let (kind, scope, name) = row?;
                if let Some(kind) = crate::model::Kind::parse(&kind) {
                    keys.push(ResourceKey::new(kind, scope, name));
                }
            }
            Ok(keys)
        })
    }

    /// The run `key`'s handler works on now: the oldest open one.
    pub(crate) fn open_data_run(&self, key: &ResourceKey) -> Result<Option<DataRun>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM data_runs
                 WHERE kind = ?1 AND scope = ?2 AND name = ?3 AND state IN ('pending', 'running')
                 ORDER BY id LIMIT 1"
            ))?;
            Ok(statement
                .query_row(params![key.kind.as_str(), key.scope, key.name], run_row)
                .optional()?
                .flatten())
        })
    }

    /// Run `id`.
    pub fn data_run(&self, id: i64) -> Result<Option<DataRun>> {
        self.with(|connection| {
            let mut statement = connection
                .prepare_cached(&format!("SELECT {COLUMNS} FROM data_runs WHERE id = ?1"))?;
            Ok(statement
                .query_row(params![id], run_row)
                .optional()?
                .flatten())
        })
    }

    /// `key`'s runs, newest first, at most `limit`.
    pub fn data_runs(&self, key: &ResourceKey, limit: usize) -> Result<Vec<DataRun>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM data_runs WHERE kind = ?1 AND scope = ?2 AND name = ?3
                 ORDER BY id DESC LIMIT ?4"
            ))?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let rows = statement.query_map(
                params![key.kind.as_str(), key.scope, key.name, limit],
                run_row,
            )?;
            let mut runs = Vec::new();
            for row in rows {
                runs.extend(row?);
            }
            Ok(runs)
        })
    }

    /// The newest run of `what` for `key` asked for by `reason` (any state), if any.
    pub(crate) fn last_data_run(
        &self,
        key: &ResourceKey,
        what: DataWhat,
        reason: Option<DataReason>,
    ) -> Result<Option<DataRun>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM data_runs
                 WHERE kind = ?1 AND scope = ?2 AND name = ?3 AND what = ?4
                   AND (?5 IS NULL OR reason = ?5)
                 ORDER BY id DESC LIMIT 1"
            ))?;
            Ok(statement
                .query_row(
                    params![
                        key.kind.as_str(),
                        key.scope,
                        key.name,
                        what.as_str(),
                        reason.map(DataReason::as_str)
                    ],
                    run_row,
                )
                .optional()?
                .flatten())
        })
    }

    /// The newest succeeded backup of `key`, if any.
    pub fn last_good_backup(&self, key: &ResourceKey) -> Result<Option<DataRun>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM data_runs
                 WHERE kind = ?1 AND scope = ?2 AND name = ?3 AND what = 'backup'
                   AND state = 'succeeded'
                 ORDER BY id DESC LIMIT 1"
            ))?;
            Ok(statement
                .query_row(params![key.kind.as_str(), key.scope, key.name], run_row)
                .optional()?
                .flatten())
        })
    }

    /// The `before_release` backup of release `release_id`, if one was asked for.
    pub fn release_backup(&self, release_id: i64) -> Result<Option<DataRun>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM data_runs
                 WHERE release_id = ?1 AND what = 'backup' AND reason = 'before_release'
                 ORDER BY id DESC LIMIT 1"
            ))?;
            Ok(statement
                .query_row(params![release_id], run_row)
                .optional()?
                .flatten())
        })
    }

    /// The successful `before_release` backup of the first release of `key` after release
    /// `release_id` that has one: what the data was before that release rolled out
    /// (`rollback --with-data` to `release_id`).
    pub fn backup_after_release(
        &self,
        key: &ResourceKey,
        release_id: i64,
    ) -> Result<Option<DataRun>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM data_runs
                 WHERE kind = ?1 AND scope = ?2 AND name = ?3 AND what = 'backup'
                   AND reason = 'before_release' AND state = 'succeeded' AND release_id > ?4
                 ORDER BY release_id, id LIMIT 1"
            ))?;
            Ok(statement
                .query_row(
                    params![key.kind.as_str(), key.scope, key.name, release_id],
                    run_row,
                )
                .optional()?
                .flatten())
        })
    }

    /// Per resource with any data run: its backups' figures for `/metrics`, in one
    /// statement.
    pub fn backup_figures(&self) -> Result<Vec<BackupFigures>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(
                "SELECT k.kind, k.scope, k.name,
                   (SELECT ended_at FROM data_runs b WHERE b.kind = k.kind AND b.scope = k.scope
                      AND b.name = k.name AND b.what = 'backup' AND b.state = 'succeeded'
                      ORDER BY b.id DESC LIMIT 1),
                   (SELECT bytes FROM data_runs b WHERE b.kind = k.kind AND b.scope = k.scope
                      AND b.name = k.name AND b.what = 'backup' AND b.state = 'succeeded'
                      ORDER BY b.id DESC LIMIT 1),
                   (SELECT ended_at - started_at FROM data_runs b WHERE b.kind = k.kind
                      AND b.scope = k.scope AND b.name = k.name AND b.what = 'backup'
                      AND b.state = 'succeeded' ORDER BY b.id DESC LIMIT 1),
                   (SELECT ended_at FROM data_runs b WHERE b.kind = k.kind AND b.scope = k.scope
                      AND b.name = k.name AND b.what = 'verify' AND b.state = 'succeeded'
                      ORDER BY b.id DESC LIMIT 1),
                   (SELECT state FROM data_runs b WHERE b.kind = k.kind AND b.scope = k.scope
                      AND b.name = k.name AND b.what = 'backup'
                      AND b.state IN ('succeeded', 'failed') ORDER BY b.id DESC LIMIT 1)
                 FROM (SELECT DISTINCT kind, scope, name FROM data_runs) k
                 ORDER BY k.kind, k.scope, k.name",
            )?;
            let rows = statement.query_map([], |row| {
                Ok(BackupFigures {
                    resource: format!(
                        "{}/{}/{}",
                        row.get::<_, String>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, String>(2)?
                    ),
                    last_success: row.get(3)?,
                    bytes: row.get::<_, Option<i64>>(4)?.unwrap_or(0),
                    seconds: row.get::<_, Option<i64>>(5)?.unwrap_or(0),
                    last_verified: row.get(6)?,
                    failing: row.get::<_, Option<String>>(7)?.as_deref() == Some("failed"),
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    /// Moves run `id` on: running, at `ordinal` and `step`, with the snapshots and bytes so
    /// far. A run that ended is left as it is.
    pub(crate) fn advance_data_run(
        &self,
        id: i64,
        ordinal: i64,
        step: &str,
        snapshots: &BTreeMap<String, String>,
        bytes: i64,
    ) -> Result<()> {
        let result =
            self.with(|connection| {
                connection.execute(
                "UPDATE data_runs SET state = 'running', ordinal = ?2, step = ?3, snapshots = ?4,
                     bytes = ?5, started_at = COALESCE(started_at, ?6)
                 WHERE id = ?1 AND state IN ('pending', 'running')",
                params![id, ordinal, step, snapshots_text(snapshots), bytes, now_unix()],
            )?;
                Ok(())
            });
        self.mark_changed();
        result
    }

    /// Ends run `id` as `state` with `message`, once, with its activity row (and outbox event:
    /// a failed backup or verify, a restore's end); returns whether this call ended it. Ended
    /// runs past [`HISTORY`] are dropped, except those a kept release's backup is.
    pub(crate) fn finish_data_run(&self, id: i64, state: DataState, message: &str) -> Result<bool> {
        let who = Who::AGENT;
        let result = self.with(|connection| {
            let tx = connection.transaction()?;
            let changed = tx.execute(
                "UPDATE data_runs SET state = ?2, message = ?3, ended_at = ?4,
                     started_at = COALESCE(started_at, ?4)
                 WHERE id = ?1 AND state IN ('pending', 'running')",
                params![
                    id,
                    state.as_str(),
                    cut(message, MAX_MESSAGE_BYTES),
                    now_unix()
                ],
            )?;
            if changed == 0 {
                return Ok(false);
            }
            let run = tx
                .query_row(
                    &format!("SELECT {COLUMNS} FROM data_runs WHERE id = ?1"),
                    params![id],
                    run_row,
                )?
                .ok_or(rusqlite::Error::QueryReturnedNoRows)?;
            let outcome = match state {
                DataState::Succeeded => ActivityOutcome::Succeeded,
                DataState::Superseded => ActivityOutcome::Superseded,
                _ => ActivityOutcome::Failed,
            };
            let resource = run.key.to_string();
            let mut entry = Entry::new(run.what.as_str(), &who, outcome);
            entry.resource = Some(&resource);
            entry.message = message;
            entry.data = serde_json::json!({
                "run": id,
                "reason": run.reason.as_str(),
                "release": run.release_id,
                "snapshots": run.snapshots,
                "bytes": run.bytes,
            });
            activity::record(&tx, &entry)?;
            tx.execute(
                "DELETE FROM data_runs
                 WHERE kind = ?1 AND scope = ?2 AND name = ?3
                   AND state IN ('succeeded', 'failed', 'superseded')
                   AND (release_id IS NULL OR release_id NOT IN (SELECT id FROM releases))
                   AND id NOT IN (
                     SELECT id FROM data_runs WHERE kind = ?1 AND scope = ?2 AND name = ?3
                     ORDER BY id DESC LIMIT ?4)",
                params![
                    run.key.kind.as_str(),
                    run.key.scope,
                    run.key.name,
                    i64::try_from(HISTORY).unwrap_or(i64::MAX)
                ],
            )?;
            tx.commit()?;
            Ok(true)
        });
        self.mark_changed();
        result
    }

    /// Every open run of `key` ends as superseded (the resource left the repo); returns how
    /// many.
    pub(crate) fn supersede_data_runs(&self, key: &ResourceKey, message: &str) -> Result<usize> {
        let open: Vec<i64> = self.with(|connection| {
            let mut statement = connection.prepare_cached(
                "SELECT id FROM data_runs WHERE kind = ?1 AND scope = ?2 AND name = ?3
                   AND state IN ('pending', 'running')",
            )?;
            let ids = statement
                .query_map(params![key.kind.as_str(), key.scope, key.name], |row| {
                    row.get(0)
                })?
                .collect::<rusqlite::Result<Vec<i64>>>()?;
            Ok(ids)
        })?;
        let mut ended = 0;
        for id in open {
            if self.finish_data_run(id, DataState::Superseded, message)? {
                ended += 1;
            }
        }
        Ok(ended)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Kind;

    fn key() -> ResourceKey {
        ResourceKey::new(Kind::Statefulset, "shop", "db")
    }

    fn backup(reason: DataReason) -> NewDataRun {
        NewDataRun {
            what: DataWhat::Backup,
            reason,
            release_id: None,
            only_ordinal: None,
            snapshots: BTreeMap::new(),
        }
    }

    #[test]
    fn a_run_moves_from_pending_to_one_end_with_its_snapshots() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let store = Store::open(&dir.path().join("state.db"))?;
        let first = store.request_data_run(&key(), &backup(DataReason::Manual))?;
        let second = store.request_data_run(&key(), &backup(DataReason::Schedule))?;
        // The oldest open run is worked on first.
        assert_eq!(store.open_data_run(&key())?.map(|run| run.id), Some(first));
        let snapshots = BTreeMap::from([("voodu-shop-db-data-0".to_owned(), "abc".to_owned())]);
        store.advance_data_run(first, 1, "stopped", &snapshots, 42)?;
        let run = store.data_run(first)?.expect("the run");
        assert_eq!(
            (run.state, run.ordinal, run.step.as_str(), run.bytes),
            (DataState::Running, 1, "stopped", 42)
        );
        assert_eq!(run.snapshots, snapshots);
        assert!(store.finish_data_run(first, DataState::Succeeded, "2 snapshots")?);
        // Once: a second end changes nothing.
        assert!(!store.finish_data_run(first, DataState::Failed, "late")?);
        assert_eq!(
            store.data_run(first)?.map(|run| run.state),
            Some(DataState::Succeeded)
        );
        assert_eq!(store.open_data_run(&key())?.map(|run| run.id), Some(second));
        // An ended run is not moved on.
        store.advance_data_run(first, 5, "again", &BTreeMap::new(), 0)?;
        assert_eq!(store.data_run(first)?.map(|run| run.ordinal), Some(1));
        assert_eq!(
            store.last_good_backup(&key())?.map(|run| run.id),
            Some(first)
        );
        assert_eq!(store.supersede_data_runs(&key(), "left the repo")?, 1);
        assert_eq!(store.open_data_run(&key())?, None);
        Ok(())
    }

    #[test]
    fn a_failed_backup_is_an_outbox_event_and_history_is_bounded() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let store = Store::open(&dir.path().join("state.db"))?;
        let id = store.request_data_run(&key(), &backup(DataReason::Schedule))?;
        store.finish_data_run(id, DataState::Failed, "wrong password")?;
        let events = store.events_after(0, 100)?;
        assert!(
            events
                .iter()
                .any(|event| event.event == "backup.failed" && event.message == "wrong password"),
            "{events:?}"
        );
        for _ in 0..HISTORY + 5 {
            let id = store.request_data_run(&key(), &backup(DataReason::Schedule))?;
            store.finish_data_run(id, DataState::Succeeded, "ok")?;
        }
        assert_eq!(store.data_runs(&key(), 1000)?.len(), HISTORY);
        Ok(())
    }
}
