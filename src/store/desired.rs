//! Desired state and the journal: the `desired` rows the last applied commit declares (with
//! the autoscaler's `replica_overrides`), the append-only `journal` the reconciler tails, and
//! each consumer's `cursor` in it.
//!
//! Invariants: a journal row is appended in the same transaction that changes its desired row
//! (`put_desired`, `apply_commit`, a rollback); every append by this process wakes
//! subscribers (`subscribe`); a desired row this agent cannot read is left out of the lists
//! (`desired_all`, `desired_of_kind`, `desired_of`; `desired_summaries` parses no spec it
//! need not, so only an unreadable key leaves a row out there) and reported by its own
//! `desired`. Each list is one
//! statement, so it reads one snapshot.

use rusqlite::{OptionalExtension, params};
use tokio::sync::watch;

use super::{Error, Result, Store, now_unix};
use crate::manifest::spec::Spec;
use crate::model::{CommitSha, Kind, ResourceKey, SpecHash};

/// A journal operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Put,
    Delete,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::Put => "PUT",
            Op::Delete => "DELETE",
        }
    }
}

/// One journal row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEntry {
    pub seq: i64,
    pub key: ResourceKey,
    pub op: Op,
    pub generation: i64,
    pub(crate) commit: CommitSha,
}

/// What a resync compares with the host: a resource's key, spec hash and replica count
/// (`Desired::n_replicas`), without its parsed spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DesiredSummary {
    pub(crate) key: ResourceKey,
    pub(crate) spec_hash: SpecHash,
    pub(crate) n_replicas: usize,
}

/// One resource's desired state as the last applied commit declared it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    pub key: ResourceKey,
    pub spec: Spec,
    pub spec_json: String,
    pub spec_hash: SpecHash,
    /// Replicas to run: the autoscaler's override while the spec has `autoscale {}` (clamped
    /// to its min and max), else the manifest's count.
    pub(crate) n_replicas: usize,
    /// The autoscaler's count, when it applies (`n_replicas` is then this value).
    pub replicas_override: Option<usize>,
    /// Bumped each time the spec JSON changes.
    pub(crate) generation: i64,
    /// The commit that last changed this resource.
    pub commit: CommitSha,
    /// Which life of the resource this is: a resource deleted from git and added again is a
    /// new incarnation, whose rollbacks never go back to a release of the deleted one.
    pub(crate) incarnation: i64,
}

impl Store {
    /// Receives the journal's highest seq after every append.
    pub(crate) fn subscribe(&self) -> watch::Receiver<i64> {
        self.shared.journal_head.subscribe()
    }

    /// Wakes subscribers when another process (the `rollback` or `unpin` command) appended
    /// journal rows this handle has not announced, or changed maintenance (`maintenance`).
    /// Two indexed reads in one statement, prepared once: called before every sync of every
    /// source (100 sources polled each second parsed it 200 times a second).
    pub fn notice_external_writes(&self) -> Result<()> {
        let (head, maintenance) = self.with(|connection| {
            Ok(connection
                .prepare_cached(
                    "SELECT (SELECT COALESCE(MAX(seq), 0) FROM journal),
                            (SELECT value FROM meta WHERE key = ?1)",
                )?
                .query_row(params![super::maintenance::VERSION_KEY], |row| {
                    Ok((row.get::<_, i64>(0)?, row.get::<_, Option<String>>(1)?))
                })?)
        })?;
        let maintenance = super::maintenance::parse_version(maintenance.as_deref());
        self.announce_maintenance(maintenance);
        self.shared.journal_head.send_if_modified(|current| {
            let newer = head > *current;
            if newer {
                *current = head;
            }
            newer
        });
        Ok(())
    }

    /// Asks the reconciler for a pass over `key` at once: appends a journal PUT of its
    /// desired row as it stands (its generation and commit; nothing else changes), as a
    /// rollback does. `promote` / `abort` (the command and `POST /api/rollouts/…`) call it after
    /// leaving their request, so the rollout moves now rather than at its next look. `false`
    /// when `key` is not in desired state (nothing is appended). Handlers are level-triggered:
    /// a pass more is harmless.
    pub fn queue_pass(&self, key: &ResourceKey) -> Result<bool> {
        let head = self.with(|connection| {
            let tx = connection.transaction()?;
            let row: Option<(i64, String)> = tx
                .query_row(
                    "SELECT generation, commit_sha FROM desired
                     WHERE kind = ?1 AND scope = ?2 AND name = ?3",
                    params![key.kind.as_str(), key.scope, key.name],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()?;
            let Some((generation, commit)) = row else {
                return Ok(None);
            };
            append_journal(&tx, key, Op::Put, generation, &CommitSha::new(commit))?;
            let head: i64 =
                tx.query_row("SELECT COALESCE(MAX(seq), 0) FROM journal", [], |row| {
                    row.get(0)
                })?;
            tx.commit()?;
            Ok(Some(head))
        })?;
        let Some(head) = head else {
            return Ok(false);
        };
        self.shared.journal_head.send_if_modified(|current| {
            let newer = head > *current;
            if newer {
                *current = head;
            }
            newer
        });
        Ok(true)
    }

    /// The desired state of one resource, if the last applied commit declares it.
    pub fn desired(&self, key: &ResourceKey) -> Result<Option<Desired>> {
        self.with(|connection| {
            let row = connection
                .prepare_cached(&format!(
                    "{DESIRED_SELECT} WHERE d.kind = ?1 AND d.scope = ?2 AND d.name = ?3"
                ))?
                .query_row(
                    params![key.kind.as_str(), key.scope, key.name],
                    DesiredRow::read,
                )
                .optional()?;
            row.map(DesiredRow::decode).transpose()
        })
    }

    /// Records the autoscaler's replica count for `key` (a deployment with `autoscale`).
    pub(crate) fn set_replicas_override(
        &self,
        key: &ResourceKey,
        replicas: usize,
        reason: &str,
    ) -> Result<()> {
        self.with(|connection| {
            connection.execute(
                "INSERT INTO replica_overrides (kind, scope, name, replicas, reason, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (kind, scope, name) DO UPDATE SET replicas = excluded.replicas,
                   reason = excluded.reason, updated_at = excluded.updated_at",
                params![
                    key.kind.as_str(),
                    key.scope,
                    key.name,
                    i64::try_from(replicas).unwrap_or(i64::MAX),
                    reason,
                    now_unix()
                ],
            )?;
            Ok(())
        })
    }

    /// The autoscaler's last decision for `key`: replicas, why, and when (Unix seconds).
    pub fn replicas_override(&self, key: &ResourceKey) -> Result<Option<(usize, String, i64)>> {
        self.with(|connection| {
            let row = connection
                .query_row(
                    "SELECT replicas, reason, updated_at FROM replica_overrides
                     WHERE kind = ?1 AND scope = ?2 AND name = ?3",
                    params![key.kind.as_str(), key.scope, key.name],
                    |row| <(i64, String, i64)>::try_from(row),
                )
                .optional()?;
            Ok(row
                .map(|(replicas, reason, at)| (usize::try_from(replicas).unwrap_or(1), reason, at)))
        })
    }

    /// Every resource's desired state, ordered by key, read by one statement (one snapshot,
    /// no query per row). A row this agent cannot read (a spec written by another version, a
    /// damaged row) is left out rather than failing the whole list: it must not stop every
    /// other resource (their env, routes, resync) with it. Its own reconcile reads it with
    /// `desired` and reports the error.
    pub fn desired_all(&self) -> Result<Vec<Desired>> {
        self.desired_where(
            &format!("{DESIRED_SELECT} ORDER BY d.kind, d.scope, d.name"),
            [],
        )
    }

    /// The desired state of every resource of `kind`, ordered by key (unreadable rows left
    /// out as in `desired_all`).
    pub(crate) fn desired_of_kind(&self, kind: Kind) -> Result<Vec<Desired>> {
        self.desired_where(
            &format!("{DESIRED_SELECT} WHERE d.kind = ?1 ORDER BY d.kind, d.scope, d.name"),
            [kind.as_str()],
        )
    }

    /// The statefulsets and deployments whose spec declares a `backup {}`, ordered by key:
    /// the backup schedules' look, which parses only these rows.
    pub(crate) fn desired_with_backup(&self) -> Result<Vec<Desired>> {
        self.desired_where(
            &format!(
                "{DESIRED_SELECT} WHERE d.kind IN ('statefulset', 'deployment')
                   AND instr(d.spec, '\"backup\":') > 0 ORDER BY d.kind, d.scope, d.name"
            ),
            [],
        )
    }

    /// Every resource's `DesiredSummary`, ordered by key, in one statement. A spec is parsed
    /// only where the autoscaler's count may apply (its bounds are in the spec), so a resync
    /// over thousands of resources parses almost no JSON; a row whose key is unreadable is
    /// left out, one whose spec is unreadable is not (its handler's own read reports it).
    pub(crate) fn desired_summaries(&self) -> Result<Vec<DesiredSummary>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(&format!(
                "{DESIRED_SELECT} ORDER BY d.kind, d.scope, d.name"
            ))?;
            let rows = statement.query_map([], DesiredRow::read)?;
            let mut all = Vec::new();
            for row in rows {
                let row = row?;
                let summary = if row.scaled.is_some() {
                    row.decode().map(|desired| DesiredSummary {
                        key: desired.key,
                        spec_hash: desired.spec_hash,
                        n_replicas: desired.n_replicas,
                    })
                } else {
                    key_from_row(&row.kind, row.scope, row.name).map(|key| DesiredSummary {
                        key,
                        spec_hash: SpecHash::new(row.spec_hash),
                        n_replicas: stored_replicas(row.replicas),
                    })
                };
                match summary {
                    Ok(summary) => all.push(summary),
                    Err(Error::Corrupt(_) | Error::Unknown { .. } | Error::Spec { .. }) => {}
                    Err(other) => return Err(other),
                }
            }
            Ok(all)
        })
    }

    /// The deployments whose spec JSON names `autoscale` (a superset of those that autoscale:
    /// the caller checks each decoded spec), ordered by key: the autoscaler's tick decodes
    /// only these, not every deployment.
    pub(crate) fn desired_autoscaling(&self) -> Result<Vec<Desired>> {
        self.desired_where(
            &format!(
                "{DESIRED_SELECT} WHERE d.kind = ?1 AND instr(d.spec, '\"autoscale\"') > 0
                 ORDER BY d.kind, d.scope, d.name"
            ),
            [Kind::Deployment.as_str()],
        )
    }

    /// The desired state of those of `keys` that are declared and readable, in `keys`' order,
    /// read in one transaction (one indexed lookup each): what one resource's environment
    /// refers to (`${ref.ingress.…}`), without reading the rest.
    pub fn desired_of(&self, keys: &[ResourceKey]) -> Result<Vec<Desired>> {
        self.with(|connection| {
            let tx = connection.transaction()?;
            let mut found = Vec::with_capacity(keys.len());
            {
                let mut statement = tx.prepare_cached(&format!(
                    "{DESIRED_SELECT} WHERE d.kind = ?1 AND d.scope = ?2 AND d.name = ?3"
                ))?;
                for key in keys {
                    let row = statement
                        .query_row(
                            params![key.kind.as_str(), key.scope, key.name],
                            DesiredRow::read,
                        )
                        .optional()?;
                    match row.map(DesiredRow::decode) {
                        Some(Ok(desired)) => found.push(desired),
                        None
                        | Some(Err(
                            Error::Corrupt(_) | Error::Unknown { .. } | Error::Spec { .. },
                        )) => {}
                        Some(Err(other)) => return Err(other),
                    }
                }
            }
            tx.commit()?;
            Ok(found)
        })
    }

    /// The readable rows `sql` (a `DESIRED_SELECT`) selects with `params`.
    fn desired_where<P: rusqlite::Params>(&self, sql: &str, params: P) -> Result<Vec<Desired>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(sql)?;
            let rows = statement.query_map(params, DesiredRow::read)?;
            let mut all = Vec::new();
            for row in rows {
                match row?.decode() {
                    Ok(desired) => all.push(desired),
                    Err(Error::Corrupt(_) | Error::Unknown { .. } | Error::Spec { .. }) => {}
                    Err(other) => return Err(other),
                }
            }
            Ok(all)
        })
    }

    /// Every resource in desired, ordered by key.
    pub fn desired_keys(&self) -> Result<Vec<ResourceKey>> {
        self.with(|connection| {
            let mut statement = connection
                .prepare("SELECT kind, scope, name FROM desired ORDER BY kind, scope, name")?;
            let rows = statement.query_map([], |row| <(String, String, String)>::try_from(row))?;
            rows.map(|row| {
                let (kind, scope, name) = row?;
                key_from_row(&kind, scope, name)
            })
            .collect()
        })
    }

    /// The desired `kind` resources applied by sources other than this handle's.
    pub(crate) fn keys_of_other_sources(&self, kind: Kind) -> Result<Vec<ResourceKey>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(
                "SELECT scope, name FROM desired WHERE kind = ?1 AND source <> ?2",
            )?;
            let rows = statement.query_map(params![kind.as_str(), self.source], |row| {
                Ok(ResourceKey::new(
                    kind,
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                ))
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    /// The source that applied each desired resource (`""`: the single `--repo` source).
    pub fn sources_of_desired(&self) -> Result<std::collections::BTreeMap<ResourceKey, String>> {
        self.with(|connection| {
            let mut statement =
                connection.prepare_cached("SELECT kind, scope, name, source FROM desired")?;
            let rows =
                statement.query_map([], |row| <(String, String, String, String)>::try_from(row))?;
            crate::model::try_map_of(rows.map(|row| {
                let (kind, scope, name, source) = row?;
                Ok((key_from_row(&kind, scope, name)?, source))
            }))
        })
    }

    /// Journal rows with `seq > after`, oldest first, at most `limit`.
    pub fn journal_after(&self, after: i64, limit: usize) -> Result<Vec<JournalEntry>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(
                "SELECT seq, kind, scope, name, op, generation, commit_sha FROM journal
                 WHERE seq > ?1 ORDER BY seq LIMIT ?2",
            )?;
            let rows = statement.query_map(
                params![after, i64::try_from(limit).unwrap_or(i64::MAX)],
                |row| <(i64, String, String, String, String, i64, String)>::try_from(row),
            )?;
            rows.map(|row| {
                let (seq, kind, scope, name, op, generation, commit) = row?;
                let op = match op.as_str() {
                    "PUT" => Op::Put,
                    "DELETE" => Op::Delete,
                    other => {
                        return Err(Error::Unknown {
                            column: "journal op",
                            text: other.to_owned(),
                        });
                    }
                };
                Ok(JournalEntry {
                    seq,
                    key: key_from_row(&kind, scope, name)?,
                    op,
                    generation,
                    commit: CommitSha::new(commit),
                })
            })
            .collect()
        })
    }

    /// The persisted position of a journal consumer (0 when it never committed one).
    pub fn cursor(&self, consumer: &str) -> Result<i64> {
        self.with(|connection| {
            Ok(connection
                .prepare_cached("SELECT seq FROM cursor WHERE consumer = ?1")?
                .query_row(params![consumer], |row| row.get(0))
                .optional()?
                .unwrap_or(0))
        })
    }

    pub(crate) fn set_cursor(&self, consumer: &str, seq: i64) -> Result<()> {
        self.with(|connection| {
            connection.execute(
                "INSERT INTO cursor (consumer, seq) VALUES (?1, ?2)
                 ON CONFLICT (consumer) DO UPDATE SET seq = excluded.seq",
                params![consumer, seq],
            )?;
            Ok(())
        })
    }
}

/// The columns every desired read selects (`DesiredRow::read` reads them in this order).
const DESIRED_SELECT: &str = "SELECT d.kind, d.scope, d.name, d.spec, d.spec_hash, d.replicas,
       d.generation, d.commit_sha, o.replicas, d.incarnation
     FROM desired d LEFT JOIN replica_overrides o
       ON o.kind = d.kind AND o.scope = d.scope AND o.name = d.name";

/// One `DESIRED_SELECT` row before its spec is parsed.
struct DesiredRow {
    kind: String,
    scope: String,
    name: String,
    spec_json: String,
    spec_hash: String,
    replicas: i64,
    generation: i64,
    commit: String,
    scaled: Option<i64>,
    incarnation: i64,
}

impl DesiredRow {
    fn read(row: &rusqlite::Row<'_>) -> rusqlite::Result<DesiredRow> {
        Ok(DesiredRow {
            kind: row.get(0)?,
            scope: row.get(1)?,
            name: row.get(2)?,
            spec_json: row.get(3)?,
            spec_hash: row.get(4)?,
            replicas: row.get(5)?,
            generation: row.get(6)?,
            commit: row.get(7)?,
            scaled: row.get(8)?,
            incarnation: row.get(9)?,
        })
    }

    fn decode(self) -> Result<Desired> {
        let key = key_from_row(&self.kind, self.scope, self.name)?;
        let spec = Spec::from_json(key.kind, &self.spec_json).map_err(|source| Error::Spec {
            key: key.clone(),
            source,
        })?;
        // The autoscaler's count applies only while the spec autoscales, within its current
        // bounds.
        let replicas_override = match (&spec, self.scaled) {
            (Spec::Deployment(deployment), Some(scaled)) if deployment.autoscale.is_some() => {
                let scaled = usize::try_from(scaled).unwrap_or(1);
                Some(deployment.effective_replicas(Some(scaled)))
            }
            _ => None,
        };
        Ok(Desired {
            key,
            // Clamped: an older agent may have stored any count unchecked.
            n_replicas: replicas_override.unwrap_or_else(|| stored_replicas(self.replicas)),
            replicas_override,
            spec,
            spec_json: self.spec_json,
            spec_hash: SpecHash::new(self.spec_hash),
            generation: self.generation,
            commit: CommitSha::new(self.commit),
            incarnation: self.incarnation,
        })
    }
}

/// A stored replica count, clamped: an older agent may have stored any count unchecked.
fn stored_replicas(replicas: i64) -> usize {
    usize::try_from(replicas)
        .unwrap_or(1)
        .min(crate::manifest::spec::bounds::MAX_REPLICA_COUNT)
}

/// Whether `spec` is a deployment with `autoscale {}`.
pub(super) fn has_autoscale(spec: &Spec) -> bool {
    matches!(spec, Spec::Deployment(deployment) if deployment.autoscale.is_some())
}

/// Forgets the autoscaler's count for `key` (its deployment no longer autoscales, or left).
pub(super) fn delete_override(tx: &rusqlite::Transaction<'_>, key: &ResourceKey) -> Result<()> {
    tx.execute(
        "DELETE FROM replica_overrides WHERE kind = ?1 AND scope = ?2 AND name = ?3",
        params![key.kind.as_str(), key.scope, key.name],
    )?;
    Ok(())
}

/// Writes `spec` as the desired state of `key` at `generation`, attributed to `commit`, and
/// appends its journal PUT (inside the caller's transaction). Returns the row's incarnation: an
/// existing row keeps its own; a new row (a first add, or a re-add after a delete) takes one
/// more than any release of `key`, so no release of an earlier incarnation shares it.
pub(super) fn put_desired(
    tx: &rusqlite::Transaction<'_>,
    key: &ResourceKey,
    spec: &Spec,
    spec_json: &str,
    generation: i64,
    commit: &CommitSha,
    source: &str,
) -> Result<i64> {
    tx.execute(
        "INSERT INTO desired (kind, scope, name, spec, spec_hash, replicas, generation, commit_sha, incarnation, source)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, (
           SELECT COALESCE(MAX(incarnation), 0) + 1 FROM releases
           WHERE kind = ?1 AND scope = ?2 AND name = ?3), ?9)
         ON CONFLICT (kind, scope, name) DO UPDATE SET
           spec = excluded.spec, spec_hash = excluded.spec_hash,
           replicas = excluded.replicas, generation = excluded.generation,
           commit_sha = excluded.commit_sha, source = excluded.source",
        params![
            key.kind.as_str(),
            key.scope,
            key.name,
            spec_json,
            spec.spec_hash(key).as_str(),
            i64::try_from(spec.n_replicas()).unwrap_or(i64::MAX),
            generation,
            commit.as_str(),
            source
        ],
    )?;
    append_journal(tx, key, Op::Put, generation, commit)?;
    Ok(tx.query_row(
        "SELECT incarnation FROM desired WHERE kind = ?1 AND scope = ?2 AND name = ?3",
        params![key.kind.as_str(), key.scope, key.name],
        |row| row.get(0),
    )?)
}

pub(super) fn append_journal(
    tx: &rusqlite::Transaction<'_>,
    key: &ResourceKey,
    op: Op,
    generation: i64,
    sha: &CommitSha,
) -> Result<()> {
    tx.execute(
        "INSERT INTO journal (kind, scope, name, op, generation, commit_sha) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![key.kind.as_str(), key.scope, key.name, op.as_str(), generation, sha.as_str()],
    )?;
    Ok(())
}

pub(crate) fn key_from_row(kind: &str, scope: String, name: String) -> Result<ResourceKey> {
    let kind = Kind::parse(kind).ok_or_else(|| Error::Unknown {
        column: "kind",
        text: kind.to_owned(),
    })?;
    Ok(ResourceKey { kind, scope, name })
}
