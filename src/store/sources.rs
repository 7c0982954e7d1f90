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
pub(super) const PER_SOURCE_META: &[&str] = &[
    "trigger_base",
    "commit_trust",
    "host_policy",
    "host_selection",
    "scopes",
    "branch",
];

/// A source as the agent last ran with it (`META_SOURCES`), for `status` and `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SourceRecord {
    /// `""`: the single `--repo` source.
    pub name: String,
    pub url: String,
    pub branch: String,
    /// Its scope patterns as written (`shop-*`, `"" (unscoped)`).
    #[serde(default)]
    pub scopes: Vec<String>,
}

impl Store {
    /// Records the sources this run follows.
    pub(crate) fn record_sources(&self, sources: &[SourceRecord]) -> Result<()> {
        let json = serde_json::to_string(sources).expect("source records are strings");
        self.set_meta(META_SOURCES, Some(&json))
    }

    /// The named sources of `--sources` the agent last ran with; empty for the single
    /// `--repo` source.
    pub(crate) fn recorded_sources(&self) -> Result<Vec<SourceRecord>> {
        let Some(json) = self.meta(META_SOURCES)? else {
            return Ok(Vec::new());
        };
        let listed: Vec<SourceRecord> = serde_json::from_str(&json).unwrap_or_default();
        Ok(listed
            .into_iter()
            .filter(|source| !source.name.is_empty())
            .collect())
    }

    /// The names of `recorded_sources`.
    pub(crate) fn source_names(&self) -> Result<Vec<String>> {
        Ok(self
            .recorded_sources()?
            .into_iter()
            .map(|source| source.name)
            .collect())
    }

    /// How many desired resources each source applied.
    pub(crate) fn resources_by_source(&self) -> Result<Vec<(String, i64)>> {
        self.with(|connection| {
            let mut statement =
                connection.prepare("SELECT source, COUNT(*) FROM desired GROUP BY source")?;
            let rows = statement.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
            Ok(rows.collect::<rusqlite::Result<Vec<(String, i64)>>>()?)
        })
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
            for table in [
                "commits", "desired", "triggers", "blobs", "activity", "claims",
            ] {
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
