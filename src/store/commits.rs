//! Commits: `apply_commit` (one transaction per accepted commit: desired, journal, blobs and
//! the commit record) and `reject_commit`, and the records `status` reads back.
//!
//! Invariants: an accepted commit changes desired, appends its journal rows and records
//! itself together or not at all; a rejected one adds one `commits` row and touches nothing
//! else.

use std::collections::BTreeMap;

use rusqlite::{OptionalExtension, params};

use super::desired::{
    Op, append_journal, delete_override, has_autoscale, key_from_row, put_desired,
};
use super::{Error, Result, Store, now_unix, releases};
use crate::manifest::spec::Spec;
use crate::manifest::{Diagnostic, Diagnostics, Manifest};
use crate::model::{CommitSha, ResourceKey};

/// What `apply_commit` changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplySummary {
    pub puts: Vec<ResourceKey>,
    pub deletes: Vec<ResourceKey>,
    /// Pinned resources whose pin this commit cleared, because git changed them.
    pub unpinned: Vec<ResourceKey>,
}

/// A commit the agent processed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitRecord {
    /// Position in the `commits` table: later records have larger numbers.
    pub seq: i64,
    pub sha: CommitSha,
    pub applied: bool,
    pub errors: Vec<Diagnostic>,
    /// The warnings an applied commit was accepted with (a resource declared twice, …).
    pub warnings: Vec<Diagnostic>,
    pub seen_at: i64,
}

/// The last seen, applied and rejected commits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommitSummary {
    pub last_seen: Option<CommitRecord>,
    pub last_applied: Option<CommitRecord>,
    pub last_rejected: Option<CommitRecord>,
}

impl Store {
    /// Applies one accepted commit in ONE transaction: diff against desired, upsert changed
    /// resources, delete vanished ones, append the journal rows, record the commit.
    pub fn apply_commit(&self, sha: &CommitSha, manifest: &Manifest) -> Result<ApplySummary> {
        let (summary, head) = self.with(|connection| {
            let tx = connection.transaction()?;
            let mut current: BTreeMap<ResourceKey, (String, i64)> = BTreeMap::new();
            {
                let mut statement = tx.prepare_cached("SELECT kind, scope, name, spec, generation FROM desired")?;
                let rows = statement.query_map([], |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, String>(2)?,
                        row.get::<_, String>(3)?,
                        row.get::<_, i64>(4)?,
                    ))
                })?;
                for row in rows {
                    let (kind, scope, name, spec, generation) = row?;
                    current.insert(key_from_row(&kind, scope, name)?, (spec, generation));
                }
            }
            let pins = releases::git_specs_of_pins(&tx)?;
            let mut summary = ApplySummary::default();
            let now = now_unix();
            for resource in &manifest.resources {
                let key = &resource.key;
                let spec_json = resource.spec.to_json();
                let current_row = current.remove(key);
                if let Some(git_spec) = pins.get(key) {
                    if git_spec.as_deref() == Some(spec_json.as_str()) {
                        // Git still declares what it declared at pin time: the pin holds.
                        continue;
                    }
                    releases::delete_pin(&tx, key)?;
                    summary.unpinned.push(key.clone());
                }
                let generation = match current_row {
                    Some((old_spec, _)) if old_spec == spec_json => continue,
                    Some((_, generation)) => generation + 1,
                    None => 1,
                };
                put_desired(&tx, key, &resource.spec, &spec_json, generation, sha)?;
                if !has_autoscale(&resource.spec) {
                    delete_override(&tx, key)?;
                }
                summary.puts.push(key.clone());
            }
            for (key, (_, generation)) in current {
                if let Some(git_spec) = pins.get(&key) {
                    if git_spec.is_none() {
                        // Pinned while absent from git, and git still does not declare it.
                        continue;
                    }
                    releases::delete_pin(&tx, &key)?;
                    summary.unpinned.push(key.clone());
                }
                tx.execute(
                    "DELETE FROM desired WHERE kind = ?1 AND scope = ?2 AND name = ?3",
                    params![key.kind.as_str(), key.scope, key.name],
                )?;
                append_journal(&tx, &key, Op::Delete, generation + 1, sha)?;
                delete_override(&tx, &key)?;
                summary.deletes.push(key);
            }
            // Asset bytes travel with the commit; bytes no desired asset uses any more go.
            for (digest, bytes) in &manifest.blobs {
                tx.execute(
                    "INSERT OR IGNORE INTO blobs (digest, bytes) VALUES (?1, ?2)",
                    params![digest, bytes],
                )?;
            }
            tx.execute("CREATE TEMP TABLE IF NOT EXISTS live_blobs (digest TEXT PRIMARY KEY)", [])?;
            tx.execute("DELETE FROM live_blobs", [])?;
            for digest in manifest.resources.iter().filter_map(|resource| match &resource.spec {
                Spec::Asset(asset) => Some(asset.files.values().map(|file| file.digest.as_str())),
                _ => None,
            }).flatten() {
                tx.execute("INSERT OR IGNORE INTO live_blobs (digest) VALUES (?1)", params![digest])?;
            }
            tx.execute("DELETE FROM blobs WHERE digest NOT IN (SELECT digest FROM live_blobs)", [])?;
            let warnings = (!manifest.warnings.is_empty()).then(|| {
                serde_json::to_string(&manifest.warnings).expect("diagnostics are strings and numbers")
            });
            tx.execute(
                "INSERT INTO commits (sha, outcome, errors, seen_at, warnings) VALUES (?1, 'applied', NULL, ?2, ?3)",
                params![sha.as_str(), now, warnings],
            )?;
            let head: i64 = tx.query_row("SELECT COALESCE(MAX(seq), 0) FROM journal", [], |row| row.get(0))?;
            tx.commit()?;
            Ok((summary, head))
        })?;
        // Wake the reconciler only when rows were appended.
        self.journal_head.send_if_modified(|current| {
            let moved = *current != head;
            *current = head;
            moved
        });
        Ok(summary)
    }

    /// Records a rejected commit with its diagnostics; desired and the journal stay as they are.
    pub fn reject_commit(&self, sha: &CommitSha, diagnostics: &Diagnostics) -> Result<()> {
        let errors =
            serde_json::to_string(&diagnostics.0).expect("diagnostics are strings and numbers");
        self.with(|connection| {
            connection.execute(
                "INSERT INTO commits (sha, outcome, errors, seen_at) VALUES (?1, 'rejected', ?2, ?3)",
                params![sha.as_str(), errors, now_unix()],
            )?;
            Ok(())
        })
    }

    /// The last seen, applied and rejected commits.
    pub fn commit_summary(&self) -> Result<CommitSummary> {
        self.with(|connection| {
            let query = |filter: &str| -> Result<Option<CommitRecord>> {
                let sql = format!(
                    "SELECT seq, sha, outcome, errors, seen_at, warnings FROM commits {filter} ORDER BY seq DESC LIMIT 1"
                );
                connection
                    .query_row(&sql, [], commit_row)
                    .optional()?
                    .map(commit_record)
                    .transpose()
            };
            Ok(CommitSummary {
                last_seen: query("")?,
                last_applied: query("WHERE outcome = 'applied'")?,
                last_rejected: query("WHERE outcome = 'rejected'")?,
            })
        })
    }

    /// The newest record of commit `sha`, if the agent processed it.
    pub fn commit_record(&self, sha: &CommitSha) -> Result<Option<CommitRecord>> {
        self.with(|connection| {
            connection
                .query_row(
                    "SELECT seq, sha, outcome, errors, seen_at, warnings FROM commits WHERE sha = ?1
                     ORDER BY seq DESC LIMIT 1",
                    params![sha.as_str()],
                    commit_row,
                )
                .optional()?
                .map(commit_record)
                .transpose()
        })
    }
}

type CommitRow = (i64, String, String, Option<String>, i64, Option<String>);

fn commit_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<CommitRow> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
    ))
}

fn diagnostics_of(json: Option<String>, what: &'static str) -> Result<Vec<Diagnostic>> {
    match json {
        Some(json) => {
            serde_json::from_str(&json).map_err(|source| Error::Diagnostics { what, source })
        }
        None => Ok(Vec::new()),
    }
}

fn commit_record(
    (seq, sha, outcome, errors, seen_at, warnings): CommitRow,
) -> Result<CommitRecord> {
    Ok(CommitRecord {
        seq,
        sha: CommitSha::new(sha),
        applied: outcome == "applied",
        errors: diagnostics_of(errors, "errors")?,
        warnings: diagnostics_of(warnings, "warnings")?,
        seen_at,
    })
}
