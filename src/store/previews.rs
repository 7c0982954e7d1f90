//! Branch previews (`model::previews`): one row per preview a source knows, live, refused
//! (over `max`) or expired (its `ttl` ran out), with its branch, commit, slug, host and
//! times, for the preview task's decisions and for `status`.
//!
//! Invariant: a row is written only by its source's preview task, and removed once
//! everything of the preview is gone (its branch deleted) or kept as `expired` so that an
//! unchanged branch is not previewed again.

use rusqlite::params;

use super::{Result, Store};

/// One preview, as `status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PreviewRow {
    /// The source it previews (`""`: the single `--repo` source).
    pub source: String,
    pub slug: String,
    pub branch: String,
    pub commit: String,
    /// `live`, `refused` or `expired` (`model::previews::State`).
    pub state: String,
    /// Why it is refused or was removed; what its last commit's outcome was.
    pub message: String,
    /// The hosts its ingresses answer at, and its scopes, comma-separated.
    pub hosts: String,
    pub scopes: String,
    pub created: i64,
    pub pushed: i64,
    /// When its `ttl` removes it without a push (unix seconds).
    pub expires: i64,
}

impl Store {
    /// Records (or replaces) a preview's row.
    pub(crate) fn record_preview(&self, row: &PreviewRow) -> Result<()> {
        self.with(|connection| {
            connection.execute(
                "INSERT OR REPLACE INTO previews
                 (source, slug, branch, sha, state, message, hosts, scopes, created, pushed, expires)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                params![
                    row.source,
                    row.slug,
                    row.branch,
                    row.commit,
                    row.state,
                    row.message,
                    row.hosts,
                    row.scopes,
                    row.created,
                    row.pushed,
                    row.expires
                ],
            )?;
            Ok(())
        })?;
        self.mark_changed();
        Ok(())
    }

    /// Forgets a preview.
    pub(crate) fn forget_preview(&self, source: &str, slug: &str) -> Result<()> {
        self.with(|connection| {
            connection.execute(
                "DELETE FROM previews WHERE source = ?1 AND slug = ?2",
                params![source, slug],
            )?;
            Ok(())
        })?;
        self.mark_changed();
        Ok(())
    }

    /// Forgets what a removed preview's internal source kept beside its history: its
    /// per-source `meta` keys and its fetch health (its commits and activity stay).
    pub(crate) fn forget_source_state(&self, source: &str) -> Result<()> {
        self.with(|connection| {
            let tx = connection.transaction()?;
            for base in super::sources::PER_SOURCE_META {
                tx.execute(
                    "DELETE FROM meta WHERE key = ?1",
                    params![super::source_key(base, source)],
                )?;
            }
            tx.execute(
                "DELETE FROM health WHERE subject = ?1",
                params![super::source_key(super::HEALTH_FETCH, source)],
            )?;
            tx.commit()?;
            Ok(())
        })
    }

    /// Every preview (of `source` when given), by source and slug.
    pub fn previews(&self, source: Option<&str>) -> Result<Vec<PreviewRow>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(
                "SELECT source, slug, branch, sha, state, message, hosts, scopes, created, pushed, expires
                 FROM previews WHERE ?1 IS NULL OR source = ?1 ORDER BY source, slug",
            )?;
            let rows = statement
                .query_map(params![source], |row| {
                    Ok(PreviewRow {
                        source: row.get(0)?,
                        slug: row.get(1)?,
                        branch: row.get(2)?,
                        commit: row.get(3)?,
                        state: row.get(4)?,
                        message: row.get(5)?,
                        hosts: row.get(6)?,
                        scopes: row.get(7)?,
                        created: row.get(8)?,
                        pushed: row.get(9)?,
                        expires: row.get(10)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
    }
}
