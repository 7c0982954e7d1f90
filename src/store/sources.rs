//! Sources (issue 26): which repository brought each commit, resource, trigger and asset
//! blob (the `source` columns of migration 13), and moving the single `--repo` source's
//! history to a named source when an agent switches to `--sources`.
//!
//! Invariant: a history moves whole in one transaction (commits, desired rows, triggers,
//! blobs, activity, its meta keys and fetch health), and no journal row is written: a
//! resource keeps its spec, generation and containers.

use rusqlite::params;

use super::{Result, Store, source_key};

/// `meta` key of the sources the agent follows (JSON: name, url, branch, scopes), for
/// `status`.
pub(crate) const META_SOURCES: &str = "sources";
/// `meta` key of the URL the single `--repo` source follows (what `--sources` adopts).
pub(crate) const META_REPO_URL: &str = "repo_url";

/// The `meta` keys and health subjects that carry a source's name (`Store::source_key`).
const PER_SOURCE_META: &[&str] = &[
    "trigger_base",
    "commit_trust",
    "host_policy",
    "host_selection",
    "scopes",
    "branch",
];

impl Store {
    /// The names of the sources of `--sources` the agent last ran with; empty for the single
    /// `--repo` source.
    pub(crate) fn source_names(&self) -> Result<Vec<String>> {
        let Some(json) = self.meta(META_SOURCES)? else {
            return Ok(Vec::new());
        };
        let listed: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap_or_default();
        Ok(listed
            .iter()
            .filter_map(|source| source.get("name")?.as_str())
            .filter(|name| !name.is_empty())
            .map(ToOwned::to_owned)
            .collect())
    }

    /// Whether any source applied a commit.
    pub(crate) fn any_commit_applied(&self) -> Result<bool> {
        self.with(|connection| {
            Ok(connection.query_row(
                "SELECT EXISTS (SELECT 1 FROM commits WHERE outcome = 'applied')",
                [],
                |row| row.get(0),
            )?)
        })
    }

    /// Whether `source` processed a commit or applied a resource.
    pub(crate) fn has_source_history(&self, source: &str) -> Result<bool> {
        self.with(|connection| {
            Ok(connection.query_row(
                "SELECT EXISTS (SELECT 1 FROM commits WHERE source = ?1)
                     OR EXISTS (SELECT 1 FROM desired WHERE source = ?1)",
                params![source],
                |row| row.get(0),
            )?)
        })
    }

    /// The scopes of the resources `source` applied.
    pub(crate) fn scopes_of_source(&self, source: &str) -> Result<Vec<String>> {
        self.with(|connection| {
            let mut statement =
                connection.prepare("SELECT DISTINCT scope FROM desired WHERE source = ?1")?;
            let rows = statement.query_map(params![source], |row| row.get(0))?;
            Ok(rows.collect::<rusqlite::Result<Vec<String>>>()?)
        })
    }

    /// Makes everything of source `from` source `to`'s, in one transaction.
    pub(crate) fn adopt_source_history(&self, from: &str, to: &str) -> Result<()> {
        self.with(|connection| {
            let tx = connection.transaction()?;
            for table in ["commits", "desired", "triggers", "blobs", "activity"] {
                tx.execute(
                    &format!("UPDATE {table} SET source = ?2 WHERE source = ?1"),
                    params![from, to],
                )?;
            }
            for base in PER_SOURCE_META {
                tx.execute(
                    "INSERT INTO meta (key, value) SELECT ?2, value FROM meta WHERE key = ?1
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    params![source_key(base, from), source_key(base, to)],
                )?;
                tx.execute(
                    "DELETE FROM meta WHERE key = ?1",
                    params![source_key(base, from)],
                )?;
            }
            tx.execute(
                "DELETE FROM health WHERE subject = ?1",
                params![source_key(super::HEALTH_FETCH, to)],
            )?;
            tx.execute(
                "UPDATE health SET subject = ?2 WHERE subject = ?1",
                params![
                    source_key(super::HEALTH_FETCH, from),
                    source_key(super::HEALTH_FETCH, to)
                ],
            )?;
            tx.commit()?;
            Ok(())
        })?;
        Ok(())
    }
}
