//! Deploy windows and freezes as the agent remembers them: per source, the accepted commit a
//! window or a freeze holds (`holds`: since when, until when, why, and `approve --now`'s
//! release), and the freezes in force (`freezes`: one per source, or `*` for every source).
//!
//! Invariants: one hold per source, the newest accepted commit (a newer one replaces it, and
//! the activity log says so once per held commit); `freeze`, `unfreeze` and `approve --now`
//! each write their row and its activity-log row in one transaction; a hold is cleared in
//! the transaction that applies a commit of its source, recording what released it; reasons are cut to
//! [`MAX_REASON_BYTES`].

use rusqlite::{OptionalExtension as _, params};

use super::activity::{self, ActivityOutcome, Entry};
use super::{Result, Store, now_unix};
use crate::manifest::window::{Freeze, MAX_REASON_BYTES};
use crate::model::CommitSha;

/// The freeze target meaning every source.
pub const EVERY_SOURCE: &str = "*";

/// The commit a source holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub commit: CommitSha,
    /// Unix time it was first held.
    pub since: i64,
    /// When the window opens or the freeze ends, if known.
    pub until: Option<i64>,
    pub reason: String,
    /// Held by a freeze (`unfreeze` ends it).
    pub frozen: bool,
    /// `approve --now`: who released it (applied at the next sync whatever the windows say).
    pub released_by: Option<String>,
}

/// One freeze row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreezeRecord {
    /// A source's name (`""`: the single `--repo` source) or [`EVERY_SOURCE`].
    pub target: String,
    pub until: Option<i64>,
    pub reason: String,
    pub by: String,
    pub at: i64,
}

/// A held commit `approve --now` released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    pub source: String,
    pub commit: CommitSha,
}

fn cut(reason: &str) -> String {
    crate::model::text::cut(reason, MAX_REASON_BYTES).to_owned()
}

impl Store {
    /// Freezes `target` (a source's name or [`EVERY_SOURCE`]) until `until` (`None`: until
    /// `unfreeze`) for `reason`; replaces a freeze of the same target.
    pub fn freeze(&self, target: &str, until: Option<i64>, reason: &str) -> Result<()> {
        let who = self.who.clone();
        let reason = cut(reason);
        self.with(|connection| {
            let tx = connection.transaction()?;
            tx.execute(
                "INSERT INTO freezes (target, until, reason, by, at) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (target) DO UPDATE SET until = excluded.until,
                    reason = excluded.reason, by = excluded.by, at = excluded.at",
                params![
                    target,
                    until,
                    reason,
                    who.actor.as_deref().unwrap_or_default(),
                    now_unix()
                ],
            )?;
            let mut entry = Entry::new("freeze", &who, ActivityOutcome::Succeeded);
            entry.message = &reason;
            entry.source = if target == EVERY_SOURCE { "" } else { target };
            entry.data = serde_json::json!({ "target": target, "until": until });
            activity::record(&tx, &entry)?;
            tx.commit()?;
            Ok(())
        })
    }

    /// Lifts the freeze of `target`; false when there was none.
    pub fn unfreeze(&self, target: &str) -> Result<bool> {
        let who = self.who.clone();
        self.with(|connection| {
            let tx = connection.transaction()?;
            let removed = tx.execute("DELETE FROM freezes WHERE target = ?1", params![target])?;
            if removed > 0 {
                let mut entry = Entry::new("unfreeze", &who, ActivityOutcome::Succeeded);
                entry.message = "freeze lifted; held commits apply at once";
                entry.source = if target == EVERY_SOURCE { "" } else { target };
                entry.data = serde_json::json!({ "target": target });
                activity::record(&tx, &entry)?;
            }
            tx.commit()?;
            Ok(removed > 0)
        })
    }

    /// Every freeze row, ended or not, by target.
    pub fn freezes(&self) -> Result<Vec<FreezeRecord>> {
        self.with(|connection| {
            let mut statement = connection
                .prepare("SELECT target, until, reason, by, at FROM freezes ORDER BY target")?;
            let rows = statement.query_map([], |row| {
                Ok(FreezeRecord {
                    target: row.get(0)?,
                    until: row.get(1)?,
                    reason: row.get(2)?,
                    by: row.get(3)?,
                    at: row.get(4)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    /// The freeze in force for this handle's source at `now`: its own or every source's, the
    /// one lasting longest (no end first).
    pub fn freeze_in_force(&self, now: i64) -> Result<Option<Freeze>> {
        let source = self.source.clone();
        Ok(self
            .freezes()?
            .into_iter()
            .filter(|freeze| freeze.target == source || freeze.target == EVERY_SOURCE)
            .filter(|freeze| freeze.until.is_none_or(|until| now < until))
            .max_by_key(|freeze| freeze.until.unwrap_or(i64::MAX))
            .map(|freeze| Freeze {
                until: freeze.until,
                reason: freeze.reason,
            }))
    }

    /// The commit this handle's source holds, if any.
    pub fn hold(&self) -> Result<Option<Hold>> {
        self.with(|connection| Ok(read_hold(connection, &self.source)?))
    }

    /// Holds `commit` for this handle's source (replacing an older hold), recorded in the
    /// activity log when it is newly held; true then.
    pub(crate) fn record_hold(
        &self,
        commit: &CommitSha,
        until: Option<i64>,
        reason: &str,
        frozen: bool,
    ) -> Result<bool> {
        let who = self.who.clone();
        let reason = cut(reason);
        let before = self.hold()?;
        let same = before.as_ref().is_some_and(|hold| &hold.commit == commit);
        self.with(|connection| {
            let tx = connection.transaction()?;
            if same {
                tx.execute(
                    "UPDATE holds SET until = ?2, reason = ?3, frozen = ?4 WHERE source = ?1",
                    params![self.source, until, reason, frozen],
                )?;
            } else {
                tx.execute(
                    "INSERT INTO holds (source, sha, since, until, reason, frozen)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                     ON CONFLICT (source) DO UPDATE SET sha = excluded.sha,
                        since = excluded.since, until = excluded.until, reason = excluded.reason,
                        frozen = excluded.frozen, released_by = NULL, released_at = NULL",
                    params![
                        self.source,
                        commit.as_str(),
                        now_unix(),
                        until,
                        reason,
                        frozen
                    ],
                )?;
                let message = match until {
                    Some(until) => format!(
                        "held until {}: {reason}",
                        crate::manifest::window::rfc3339(until)
                    ),
                    None => format!("held: {reason}"),
                };
                let mut entry = Entry::new("commit.hold", &who, ActivityOutcome::Held);
                entry.commit = Some(commit);
                entry.source = &self.source;
                entry.message = &message;
                entry.data = serde_json::json!({
                    "until": until,
                    "replaces": before.as_ref().map(|hold| hold.commit.to_string()),
                });
                activity::record(&tx, &entry)?;
            }
            tx.commit()?;
            Ok(!same)
        })
    }

    /// Every source's held commit, as `(source, commit)`.
    pub fn held_commits(&self) -> Result<Vec<Released>> {
        self.with(|connection| {
            let mut statement =
                connection.prepare("SELECT source, sha FROM holds ORDER BY source")?;
            let rows = statement.query_map([], |row| {
                Ok(Released {
                    source: row.get(0)?,
                    commit: CommitSha::new(row.get::<_, String>(1)?),
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    /// Forgets this source's hold without applying it: the branch's tip was rejected, so the
    /// held commit (older, or that very one) is no longer what would apply.
    pub(crate) fn drop_hold(&self) -> Result<()> {
        self.with(|connection| {
            connection.execute("DELETE FROM holds WHERE source = ?1", params![self.source])?;
            Ok(())
        })
    }

    /// `approve --now SHA`: releases the held commit `sha` (full, or a prefix of at least 7
    /// hex digits) of every source holding it; the agent applies it at its next sync whatever
    /// the windows or a freeze say. Empty when no source holds such a commit.
    pub fn release_hold(&self, sha: &str) -> Result<Vec<Released>> {
        let sha = sha.trim().to_ascii_lowercase();
        if sha.len() < 7 || sha.len() > 64 || !sha.chars().all(|c| c.is_ascii_hexdigit()) {
            return Ok(Vec::new());
        }
        let who = self.who.clone();
        self.with(|connection| {
            let tx = connection.transaction()?;
            let held: Vec<Released> = {
                let mut statement = tx.prepare("SELECT source, sha FROM holds ORDER BY source")?;
                let rows = statement.query_map([], |row| {
                    Ok(Released {
                        source: row.get(0)?,
                        commit: CommitSha::new(row.get::<_, String>(1)?),
                    })
                })?;
                rows.collect::<rusqlite::Result<Vec<_>>>()?
                    .into_iter()
                    .filter(|held| held.commit.as_str().starts_with(&sha))
                    .collect()
            };
            for released in &held {
                tx.execute(
                    "UPDATE holds SET released_by = ?2, released_at = ?3 WHERE source = ?1",
                    params![
                        released.source,
                        who.actor.as_deref().unwrap_or_default(),
                        now_unix()
                    ],
                )?;
                let mut entry = Entry::new("approve", &who, ActivityOutcome::Requested);
                entry.commit = Some(&released.commit);
                entry.source = &released.source;
                entry.message =
                    "approved --now: applied at the next sync, even outside its window or during a freeze";
                activity::record(&tx, &entry)?;
            }
            tx.commit()?;
            Ok(held)
        })
    }
}

/// Forgets `source`'s hold in the transaction that applies `applied`; recorded in the
/// activity log as what let the held commit through when it is that commit.
pub(super) fn clear_in(
    tx: &rusqlite::Transaction<'_>,
    source: &str,
    applied: &CommitSha,
    who: &super::Who,
) -> rusqlite::Result<()> {
    let Some(hold) = read_hold(tx, source)? else {
        return Ok(());
    };
    tx.execute("DELETE FROM holds WHERE source = ?1", params![source])?;
    if &hold.commit != applied {
        return Ok(());
    }
    let message = match &hold.released_by {
        Some(by) if by.is_empty() => "held commit applied: approve --now".to_owned(),
        Some(by) => format!("held commit applied: approve --now by {by}"),
        None if hold.frozen => "held commit applied: the freeze ended".to_owned(),
        None => "held commit applied: its deploy window opened".to_owned(),
    };
    let mut entry = Entry::new("commit.release", who, ActivityOutcome::Succeeded);
    entry.commit = Some(applied);
    entry.source = source;
    entry.message = &message;
    entry.data = serde_json::json!({ "held_since": hold.since, "held_for": hold.reason });
    activity::record(tx, &entry)
}

/// `source`'s hold as stored.
fn read_hold(connection: &rusqlite::Connection, source: &str) -> rusqlite::Result<Option<Hold>> {
    // Read by every poll (`Syncer::hold_due`): prepared once.
    connection
        .prepare_cached(
            "SELECT sha, since, until, reason, frozen, released_by, released_at
             FROM holds WHERE source = ?1",
        )?
        .query_row(params![source], |row| {
            Ok(Hold {
                commit: CommitSha::new(row.get::<_, String>(0)?),
                since: row.get(1)?,
                until: row.get(2)?,
                reason: row.get(3)?,
                frozen: row.get(4)?,
                released_by: row
                    .get::<_, Option<i64>>(6)?
                    .map(|_| row.get::<_, Option<String>>(5))
                    .transpose()?
                    .map(Option::unwrap_or_default),
            })
        })
        .optional()
}
