//! Deploy triggers as the agent remembers them between commits: per trigger file, the commit
//! it last fired at and the file it applied, a held commit and its approval (`approve`), and
//! why it never fires on this host; and the commit changed paths are diffed from.
//!
//! Invariants: the table is replaced whole, with the base commit, in the transaction that
//! applies a commit (`commits.rs`), so the remembered firings always describe desired state;
//! `approve` only marks held rows (the agent applies them at its next sync); an approval is
//! consumed by the sync that applies or refuses it.

use rusqlite::params;

use super::activity::{self, ActivityOutcome, Entry};
use super::{Error, Result, Store, now_unix};
use crate::manifest::triggers::{Applied, Approval, Held, TriggerState};
use crate::model::CommitSha;

/// The `meta` key of the commit the next commit's changed paths are diffed from.
pub(crate) const META_TRIGGER_BASE: &str = "trigger_base";

/// One hold an `approve` marked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovedHold {
    /// The source whose trigger holds it (`""`: the single `--repo` source).
    pub(crate) source: String,
    pub(crate) trigger: String,
    pub(crate) path: String,
    pub(crate) commit: CommitSha,
    pub(crate) file: String,
}

impl Store {
    /// The remembered triggers, in path order.
    pub fn trigger_states(&self) -> Result<Vec<TriggerState>> {
        let states = self.with(|connection| read_states(connection, Some(&self.source)))?;
        Ok(states.into_iter().map(|(_, state)| state).collect())
    }

    /// The last applied commit of a repository with trigger files.
    pub(crate) fn trigger_base(&self) -> Result<Option<CommitSha>> {
        Ok(self
            .meta(&self.source_key(META_TRIGGER_BASE))?
            .map(CommitSha::new))
    }

    /// Whether an approval waits for the agent.
    pub fn approvals_pending(&self) -> Result<bool> {
        self.with(|connection| {
            // Read by every poll: prepared once.
            Ok(connection
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM triggers WHERE source = ?1 AND held_commit IS NOT NULL AND approved_at IS NOT NULL)",
                )?
                .query_row(params![self.source], |row| row.get(0))?)
        })
    }

    /// Approves the held commit `sha` (full, or a prefix of at least 7 hex digits) of every
    /// trigger holding it, of any source, recording the request; the agent applies it at its
    /// next sync of that source.
    /// `Error::NotHeld` when no trigger holds such a commit.
    pub fn approve(&self, sha: &str) -> Result<Vec<ApprovedHold>> {
        let sha = sha.trim().to_ascii_lowercase();
        let hex = sha.len() >= 7 && sha.len() <= 64 && sha.chars().all(|c| c.is_ascii_hexdigit());
        let who = self.who.clone();
        self.with(|connection| {
            let tx = connection.transaction()?;
            let held: Vec<ApprovedHold> = read_states(&tx, None)?
                .into_iter()
                .filter_map(|(source, state)| {
                    let held = state.held?;
                    (hex && held.commit.as_str().starts_with(&sha)).then_some(ApprovedHold {
                        source,
                        trigger: state.name,
                        path: state.path,
                        commit: held.commit,
                        file: held.file,
                    })
                })
                .collect();
            if held.is_empty() {
                let holds: Vec<String> = read_states(&tx, None)?
                    .into_iter()
                    .filter_map(|(_, state)| {
                        let held = state.held?;
                        Some(format!("{} ({})", held.commit.short(), state.name))
                    })
                    .collect();
                return Err(Error::NotHeld {
                    sha: sha.clone(),
                    held: if holds.is_empty() {
                        "no commit is held".to_owned()
                    } else {
                        format!("held: {}", holds.join(", "))
                    },
                });
            }
            let commits: std::collections::BTreeSet<&str> =
                held.iter().map(|hold| hold.commit.as_str()).collect();
            if commits.len() > 1 {
                return Err(Error::NotHeld {
                    sha: sha.clone(),
                    held: format!(
                        "the prefix names several held commits ({}); give more digits",
                        commits.into_iter().collect::<Vec<_>>().join(", ")
                    ),
                });
            }
            let now = now_unix();
            for hold in &held {
                tx.execute(
                    "UPDATE triggers SET approved_by = ?2, approved_at = ?3 WHERE path = ?1 AND source = ?4",
                    params![hold.path, who.actor.as_deref().unwrap_or_default(), now, hold.source],
                )?;
                let resource = format!("trigger/{}", hold.trigger);
                let mut entry = Entry::new("approve", &who, ActivityOutcome::Requested);
                entry.commit = Some(&hold.commit);
                entry.source = &hold.source;
                entry.resource = Some(&resource);
                entry.message = "approved; the agent applies it at its next sync";
                entry.data = serde_json::json!({ "file": hold.file, "trigger_file": hold.path });
                activity::record(&tx, &entry)?;
            }
            tx.commit()?;
            Ok(held)
        })
    }
}

/// The triggers of `source` (`None`: of every source, each with its source's name).
fn read_states(
    connection: &rusqlite::Connection,
    source: Option<&str>,
) -> Result<Vec<(String, TriggerState)>> {
    let mut statement = connection.prepare(
        "SELECT path, name, applied_commit, applied_file, applied_seq, held_commit, held_file,
                held_since, approved_by, approved_at, inactive, source
         FROM triggers WHERE ?1 IS NULL OR source = ?1 ORDER BY source, path",
    )?;
    let rows = statement.query_map(params![source], |row| {
        let applied = match (
            row.get::<_, Option<String>>(2)?,
            row.get::<_, Option<String>>(3)?,
            row.get::<_, Option<i64>>(4)?,
        ) {
            (Some(commit), Some(file), Some(seq)) => Some(Applied {
                commit: CommitSha::new(commit),
                file,
                seq,
            }),
            _ => None,
        };
        let held = match (
            row.get::<_, Option<String>>(5)?,
            row.get::<_, Option<String>>(6)?,
        ) {
            (Some(commit), Some(file)) => Some(Held {
                commit: CommitSha::new(commit),
                file,
                since: row.get::<_, Option<i64>>(7)?.unwrap_or_default(),
                approval: row.get::<_, Option<i64>>(9)?.map(|at| Approval {
                    by: row
                        .get::<_, Option<String>>(8)
                        .ok()
                        .flatten()
                        .unwrap_or_default(),
                    at,
                }),
            }),
            _ => None,
        };
        Ok((
            row.get(11)?,
            TriggerState {
                path: row.get(0)?,
                name: row.get(1)?,
                applied,
                held,
                inactive: row.get(10)?,
            },
        ))
    })?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

/// Replaces the remembered triggers with `states` and the diff base with `base`.
pub(super) fn save_states(
    tx: &rusqlite::Transaction<'_>,
    source: &str,
    states: &[TriggerState],
    base: Option<&CommitSha>,
) -> rusqlite::Result<()> {
    // An approval written while the commit was being decided (`approve` does not wait for
    // the sync in flight) is not in `states`: kept for the hold of the same commit, so the
    // next sync applies it, never lost to this rewrite.
    let approvals: Vec<(String, String, String, i64)> = {
        let mut statement = tx.prepare(
            "SELECT path, held_commit, approved_by, approved_at FROM triggers
             WHERE source = ?1 AND held_commit IS NOT NULL AND approved_at IS NOT NULL",
        )?;
        let rows = statement.query_map(params![source], |row| {
            Ok((
                row.get(0)?,
                row.get(1)?,
                row.get::<_, Option<String>>(2)?.unwrap_or_default(),
                row.get(3)?,
            ))
        })?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    tx.execute("DELETE FROM triggers WHERE source = ?1", params![source])?;
    for state in states {
        let applied = state.applied.as_ref();
        let held = state.held.as_ref();
        let since_decided = held
            .filter(|held| held.approval.is_none())
            .and_then(|held| {
                approvals
                    .iter()
                    .find(|(path, commit, _, _)| {
                        *path == state.path && commit == held.commit.as_str()
                    })
                    .map(|(_, _, by, at)| Approval {
                        by: by.clone(),
                        at: *at,
                    })
            });
        let approval = held
            .and_then(|held| held.approval.as_ref())
            .or(since_decided.as_ref());
        tx.execute(
            "INSERT INTO triggers (path, name, applied_commit, applied_file, applied_seq,
                held_commit, held_file, held_since, approved_by, approved_at, inactive, source)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            params![
                state.path,
                state.name,
                applied.map(|applied| applied.commit.as_str()),
                applied.map(|applied| applied.file.as_str()),
                applied.map(|applied| applied.seq),
                held.map(|held| held.commit.as_str()),
                held.map(|held| held.file.as_str()),
                held.map(|held| held.since),
                approval.map(|approval| approval.by.as_str()),
                approval.map(|approval| approval.at),
                state.inactive,
                source
            ],
        )?;
    }
    let base_key = super::source_key(META_TRIGGER_BASE, source);
    match base {
        Some(base) => tx.execute(
            "INSERT INTO meta (key, value) VALUES (?1, ?2)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            params![base_key, base.as_str()],
        )?,
        None => tx.execute("DELETE FROM meta WHERE key = ?1", params![base_key])?,
    };
    Ok(())
}

/// Clears the approvals of `source`'s holds of `commit` (an approval the agent refused):
/// the holds stay, waiting for another approval or a newer push.
pub(super) fn clear_approvals(
    tx: &rusqlite::Transaction<'_>,
    source: &str,
    commit: &CommitSha,
) -> rusqlite::Result<()> {
    tx.execute(
        "UPDATE triggers SET approved_by = NULL, approved_at = NULL WHERE held_commit = ?1 AND source = ?2",
        params![commit.as_str(), source],
    )?;
    Ok(())
}
