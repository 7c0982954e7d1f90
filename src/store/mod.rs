//! The SQLite journal: desired state, the append-only journal the reconciler tails, its cursor,
//! releases and per-resource status. The only state shared between the agent's tasks, the HTTP
//! side and the CLI.
//!
//! Invariants:
//! - one SQLite transaction per commit: `apply_commit` updates `desired`, appends the PUT/DELETE
//!   journal rows and records the commit together, or does nothing at all;
//! - a rejected commit adds one `commits` row and touches nothing else;
//! - every journal append wakes subscribers at once (`subscribe`), so nobody polls SQLite.
//!
//! Calls block: async callers run them on `spawn_blocking`. The connection sits behind a std
//! `Mutex` that is never held across an `.await`.

mod error;
mod schema;
mod secrets;

pub use error::{Error, Result};
pub use secrets::{Bucket, Buckets};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use tokio::sync::watch;

use crate::manifest::spec::Spec;
use crate::manifest::{Diagnostic, Diagnostics, Manifest};
use crate::model::{CommitSha, Kind, ResourceKey, SpecHash};

/// Handle on the state database. Cheap to share behind an `Arc`.
pub struct Store {
    connection: Mutex<Connection>,
    path: PathBuf,
    journal_head: watch::Sender<i64>,
}

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
    pub commit: CommitSha,
}

/// One resource's desired state as the last applied commit declared it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    pub key: ResourceKey,
    pub spec: Spec,
    pub spec_json: String,
    pub spec_hash: SpecHash,
    pub n_replicas: usize,
    /// Bumped each time the spec JSON changes.
    pub generation: i64,
    /// The commit that last changed this resource.
    pub commit: CommitSha,
}

/// What `apply_commit` changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplySummary {
    pub puts: Vec<ResourceKey>,
    pub deletes: Vec<ResourceKey>,
}

/// A commit the agent processed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitRecord {
    pub sha: CommitSha,
    pub applied: bool,
    pub errors: Vec<Diagnostic>,
    pub seen_at: i64,
}

/// The last seen, applied and rejected commits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommitSummary {
    pub last_seen: Option<CommitRecord>,
    pub last_applied: Option<CommitRecord>,
    pub last_rejected: Option<CommitRecord>,
}

/// Lifecycle of a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleasePhase {
    Progressing,
    Succeeded,
    Failed,
    RolledBack,
}

impl ReleasePhase {
    pub fn as_str(self) -> &'static str {
        match self {
            ReleasePhase::Progressing => "progressing",
            ReleasePhase::Succeeded => "succeeded",
            ReleasePhase::Failed => "failed",
            ReleasePhase::RolledBack => "rolled-back",
        }
    }

    fn parse(text: &str) -> Result<ReleasePhase> {
        Ok(match text {
            "progressing" => ReleasePhase::Progressing,
            "succeeded" => ReleasePhase::Succeeded,
            "failed" => ReleasePhase::Failed,
            "rolled-back" => ReleasePhase::RolledBack,
            other => return Err(Error::Corrupt(format!("release phase {other:?}"))),
        })
    }
}

/// One rollout of one resource, keyed to the commit that asked for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub id: i64,
    pub key: ResourceKey,
    pub commit: CommitSha,
    pub spec_hash: SpecHash,
    /// The desired spec JSON at the time of the rollout.
    pub snapshot: String,
    pub phase: ReleasePhase,
    pub started_at: i64,
    pub finished_at: Option<i64>,
    pub message: String,
}

/// What the reconciler last observed and did for one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceStatus {
    pub phase: String,
    pub message: String,
    pub desired_replicas: usize,
    pub running_replicas: usize,
    pub spec_hash: String,
    pub release_id: Option<i64>,
    pub updated_at: i64,
}

/// Seconds since the Unix epoch.
pub fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX)
        })
}

impl Store {
    /// Opens (creating if needed) the database at `path` and runs pending migrations.
    pub fn open(path: &Path) -> Result<Store> {
        let open_error = |source| Error::Open {
            path: path.to_owned(),
            source,
        };
        if let Some(parent) = path.parent() {
            // A missing parent shows up as an open error below, with the path in it.
            let _ = std::fs::create_dir_all(parent);
        }
        let mut connection = Connection::open(path).map_err(open_error)?;
        connection
            .execute_batch(
                "PRAGMA journal_mode = WAL;
                 PRAGMA synchronous = NORMAL;
                 PRAGMA foreign_keys = ON;",
            )
            .map_err(open_error)?;
        connection.busy_timeout(std::time::Duration::from_secs(5))?;
        migrate(&mut connection, path)?;
        let store = Store::from_connection(connection, path);
        store.agent_id()?;
        Ok(store)
    }

    /// Opens an existing database without writing to it (for `status` while the agent runs).
    pub fn open_read_only(path: &Path) -> Result<Store> {
        let connection = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|source| Error::Open {
                path: path.to_owned(),
                source,
            })?;
        connection.busy_timeout(std::time::Duration::from_secs(5))?;
        let version: i64 = connection.query_row("PRAGMA user_version", [], |row| row.get(0))?;
        check_version(version, path)?;
        Ok(Store::from_connection(connection, path))
    }

    fn from_connection(connection: Connection, path: &Path) -> Store {
        let head = connection
            .query_row("SELECT COALESCE(MAX(seq), 0) FROM journal", [], |row| {
                row.get(0)
            })
            .unwrap_or(0);
        let (journal_head, _) = watch::channel(head);
        Store {
            connection: Mutex::new(connection),
            path: path.to_owned(),
            journal_head,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn with<T>(&self, f: impl FnOnce(&mut Connection) -> Result<T>) -> Result<T> {
        let mut connection = self
            .connection
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut connection)
    }

    /// This data dir's agent id, made once: the `voodu.agent` label on every container this
    /// agent creates, so two agents (or a test and an agent) on one engine never touch each
    /// other's containers.
    pub fn agent_id(&self) -> Result<String> {
        self.with(|connection| {
            if let Some(id) = connection
                .query_row("SELECT value FROM meta WHERE key = 'agent_id'", [], |row| {
                    row.get::<_, String>(0)
                })
                .optional()?
            {
                return Ok(id);
            }
            let id = crate::model::random_hex(8);
            connection.execute(
                "INSERT INTO meta (key, value) VALUES ('agent_id', ?1)",
                params![id],
            )?;
            Ok(id)
        })
    }

    /// The agent id without creating one (for read-only stores). Empty when never set.
    pub fn agent_id_read_only(&self) -> Result<String> {
        self.with(|connection| {
            Ok(connection
                .query_row("SELECT value FROM meta WHERE key = 'agent_id'", [], |row| {
                    row.get::<_, String>(0)
                })
                .optional()?
                .unwrap_or_default())
        })
    }

    /// Receives the journal's highest seq after every append.
    pub fn subscribe(&self) -> watch::Receiver<i64> {
        self.journal_head.subscribe()
    }

    /// Applies one accepted commit in ONE transaction: diff against desired, upsert changed
    /// resources, delete vanished ones, append the journal rows, record the commit.
    pub fn apply_commit(&self, sha: &CommitSha, manifest: &Manifest) -> Result<ApplySummary> {
        let (summary, head) = self.with(|connection| {
            let tx = connection.transaction()?;
            let mut current: BTreeMap<ResourceKey, (String, i64)> = BTreeMap::new();
            {
                let mut statement = tx.prepare("SELECT kind, scope, name, spec, generation FROM desired")?;
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
            let mut summary = ApplySummary::default();
            let now = now_unix();
            for resource in &manifest.resources {
                let key = &resource.key;
                let spec_json = resource.spec.to_json();
                let generation = match current.remove(key) {
                    Some((old_spec, _)) if old_spec == spec_json => continue,
                    Some((_, generation)) => generation + 1,
                    None => 1,
                };
                tx.execute(
                    "INSERT INTO desired (kind, scope, name, spec, spec_hash, replicas, generation, commit_sha)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                     ON CONFLICT (kind, scope, name) DO UPDATE SET
                       spec = excluded.spec, spec_hash = excluded.spec_hash,
                       replicas = excluded.replicas, generation = excluded.generation,
                       commit_sha = excluded.commit_sha",
                    params![
                        key.kind.as_str(),
                        key.scope,
                        key.name,
                        spec_json,
                        resource.spec.spec_hash(key).as_str(),
                        i64::try_from(resource.spec.n_replicas()).unwrap_or(i64::MAX),
                        generation,
                        sha.as_str()
                    ],
                )?;
                append_journal(&tx, key, Op::Put, generation, sha)?;
                summary.puts.push(key.clone());
            }
            for (key, (_, generation)) in current {
                tx.execute(
                    "DELETE FROM desired WHERE kind = ?1 AND scope = ?2 AND name = ?3",
                    params![key.kind.as_str(), key.scope, key.name],
                )?;
                append_journal(&tx, &key, Op::Delete, generation + 1, sha)?;
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
            tx.execute(
                "INSERT INTO commits (sha, outcome, errors, seen_at) VALUES (?1, 'applied', NULL, ?2)",
                params![sha.as_str(), now],
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
                    "SELECT sha, outcome, errors, seen_at FROM commits {filter} ORDER BY seq DESC LIMIT 1"
                );
                let row = connection
                    .query_row(&sql, [], |row| {
                        Ok((
                            row.get::<_, String>(0)?,
                            row.get::<_, String>(1)?,
                            row.get::<_, Option<String>>(2)?,
                            row.get::<_, i64>(3)?,
                        ))
                    })
                    .optional()?;
                row.map(|(sha, outcome, errors, seen_at)| {
                    let errors = match errors {
                        Some(json) => serde_json::from_str(&json)
                            .map_err(|error| Error::Corrupt(format!("commit errors: {error}")))?,
                        None => Vec::new(),
                    };
                    Ok(CommitRecord {
                        sha: CommitSha::new(sha),
                        applied: outcome == "applied",
                        errors,
                        seen_at,
                    })
                })
                .transpose()
            };
            Ok(CommitSummary {
                last_seen: query("")?,
                last_applied: query("WHERE outcome = 'applied'")?,
                last_rejected: query("WHERE outcome = 'rejected'")?,
            })
        })
    }

    /// The desired state of one resource, if the last applied commit declares it.
    pub fn desired(&self, key: &ResourceKey) -> Result<Option<Desired>> {
        self.with(|connection| {
            let row = connection
                .query_row(
                    "SELECT spec, spec_hash, replicas, generation, commit_sha FROM desired
                     WHERE kind = ?1 AND scope = ?2 AND name = ?3",
                    params![key.kind.as_str(), key.scope, key.name],
                    |row| {
                        Ok((
                            row.get::<_, String>(0)?,
                            row.get::<_, String>(1)?,
                            row.get::<_, i64>(2)?,
                            row.get::<_, i64>(3)?,
                            row.get::<_, String>(4)?,
                        ))
                    },
                )
                .optional()?;
            row.map(|(spec_json, spec_hash, replicas, generation, commit)| {
                let spec = Spec::from_json(key.kind, &spec_json)
                    .map_err(|error| Error::Corrupt(format!("{key}: {error}")))?;
                Ok(Desired {
                    key: key.clone(),
                    spec,
                    spec_json,
                    spec_hash: SpecHash::new(spec_hash),
                    n_replicas: usize::try_from(replicas).unwrap_or(1),
                    generation,
                    commit: CommitSha::new(commit),
                })
            })
            .transpose()
        })
    }

    /// Every resource's desired state, ordered by key.
    pub fn desired_all(&self) -> Result<Vec<Desired>> {
        let keys = self.desired_keys()?;
        let mut all = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some(desired) = self.desired(&key)? {
                all.push(desired);
            }
        }
        Ok(all)
    }

    /// Every resource in desired, ordered by key.
    pub fn desired_keys(&self) -> Result<Vec<ResourceKey>> {
        self.with(|connection| {
            let mut statement = connection
                .prepare("SELECT kind, scope, name FROM desired ORDER BY kind, scope, name")?;
            let rows = statement.query_map([], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                ))
            })?;
            rows.map(|row| {
                let (kind, scope, name) = row?;
                key_from_row(&kind, scope, name)
            })
            .collect()
        })
    }

    /// Journal rows with `seq > after`, oldest first, at most `limit`.
    pub fn journal_after(&self, after: i64, limit: usize) -> Result<Vec<JournalEntry>> {
        self.with(|connection| {
            let mut statement = connection.prepare(
                "SELECT seq, kind, scope, name, op, generation, commit_sha FROM journal
                 WHERE seq > ?1 ORDER BY seq LIMIT ?2",
            )?;
            let rows = statement.query_map(
                params![after, i64::try_from(limit).unwrap_or(i64::MAX)],
                |row| {
                    Ok((
                        row.get::<_, i64>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, String>(2)?,
                        row.get::<_, String>(3)?,
                        row.get::<_, String>(4)?,
                        row.get::<_, i64>(5)?,
                        row.get::<_, String>(6)?,
                    ))
                },
            )?;
            rows.map(|row| {
                let (seq, kind, scope, name, op, generation, commit) = row?;
                let op = match op.as_str() {
                    "PUT" => Op::Put,
                    "DELETE" => Op::Delete,
                    other => return Err(Error::Corrupt(format!("journal op {other:?}"))),
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
                .query_row(
                    "SELECT seq FROM cursor WHERE consumer = ?1",
                    params![consumer],
                    |row| row.get(0),
                )
                .optional()?
                .unwrap_or(0))
        })
    }

    pub fn set_cursor(&self, consumer: &str, seq: i64) -> Result<()> {
        self.with(|connection| {
            connection.execute(
                "INSERT INTO cursor (consumer, seq) VALUES (?1, ?2)
                 ON CONFLICT (consumer) DO UPDATE SET seq = excluded.seq",
                params![consumer, seq],
            )?;
            Ok(())
        })
    }

    /// The newest release of a resource.
    pub fn latest_release(&self, key: &ResourceKey) -> Result<Option<Release>> {
        Ok(self.releases(key, 1)?.into_iter().next())
    }

    /// Releases of a resource, newest first, at most `limit`.
    pub fn releases(&self, key: &ResourceKey, limit: usize) -> Result<Vec<Release>> {
        self.with(|connection| {
            let mut statement = connection.prepare(
                "SELECT id, commit_sha, spec_hash, snapshot, phase, started_at, finished_at, message
                 FROM releases WHERE kind = ?1 AND scope = ?2 AND name = ?3 ORDER BY id DESC LIMIT ?4",
            )?;
            let rows = statement.query_map(
                params![key.kind.as_str(), key.scope, key.name, i64::try_from(limit).unwrap_or(i64::MAX)],
                |row| {
                    Ok((
                        row.get::<_, i64>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, String>(2)?,
                        row.get::<_, String>(3)?,
                        row.get::<_, String>(4)?,
                        row.get::<_, i64>(5)?,
                        row.get::<_, Option<i64>>(6)?,
                        row.get::<_, String>(7)?,
                    ))
                },
            )?;
            rows.map(|row| {
                let (id, commit, spec_hash, snapshot, phase, started_at, finished_at, message) = row?;
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
                })
            })
            .collect()
        })
    }

    /// Starts a progressing release for `desired`.
    pub fn begin_release(&self, desired: &Desired) -> Result<Release> {
        let key = &desired.key;
        let started_at = now_unix();
        let id = self.with(|connection| {
            connection.execute(
                "INSERT INTO releases (kind, scope, name, commit_sha, spec_hash, snapshot, phase, started_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'progressing', ?7)",
                params![
                    key.kind.as_str(),
                    key.scope,
                    key.name,
                    desired.commit.as_str(),
                    desired.spec_hash.as_str(),
                    desired.spec_json,
                    started_at
                ],
            )?;
            Ok(connection.last_insert_rowid())
        })?;
        Ok(Release {
            id,
            key: key.clone(),
            commit: desired.commit.clone(),
            spec_hash: desired.spec_hash.clone(),
            snapshot: desired.spec_json.clone(),
            phase: ReleasePhase::Progressing,
            started_at,
            finished_at: None,
            message: String::new(),
        })
    }

    /// Ends a release with its final phase.
    pub fn finish_release(&self, id: i64, phase: ReleasePhase, message: &str) -> Result<()> {
        self.with(|connection| {
            connection.execute(
                "UPDATE releases SET phase = ?2, finished_at = ?3, message = ?4 WHERE id = ?1",
                params![id, phase.as_str(), now_unix(), message],
            )?;
            Ok(())
        })
    }

    pub fn put_status(&self, key: &ResourceKey, status: &ResourceStatus) -> Result<()> {
        self.with(|connection| {
            connection.execute(
                "INSERT INTO status (kind, scope, name, phase, message, desired_replicas, running_replicas, spec_hash, release_id, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
                 ON CONFLICT (kind, scope, name) DO UPDATE SET
                   phase = excluded.phase, message = excluded.message,
                   desired_replicas = excluded.desired_replicas, running_replicas = excluded.running_replicas,
                   spec_hash = excluded.spec_hash, release_id = excluded.release_id, updated_at = excluded.updated_at",
                params![
                    key.kind.as_str(),
                    key.scope,
                    key.name,
                    status.phase,
                    status.message,
                    i64::try_from(status.desired_replicas).unwrap_or(i64::MAX),
                    i64::try_from(status.running_replicas).unwrap_or(i64::MAX),
                    status.spec_hash,
                    status.release_id,
                    status.updated_at
                ],
            )?;
            Ok(())
        })
    }

    pub fn delete_status(&self, key: &ResourceKey) -> Result<()> {
        self.with(|connection| {
            connection.execute(
                "DELETE FROM status WHERE kind = ?1 AND scope = ?2 AND name = ?3",
                params![key.kind.as_str(), key.scope, key.name],
            )?;
            Ok(())
        })
    }

    pub fn status(&self, key: &ResourceKey) -> Result<Option<ResourceStatus>> {
        Ok(self
            .statuses()?
            .into_iter()
            .find_map(|(status_key, status)| (&status_key == key).then_some(status)))
    }

    /// Every resource's status, ordered by key.
    pub fn statuses(&self) -> Result<Vec<(ResourceKey, ResourceStatus)>> {
        self.with(|connection| {
            let mut statement = connection.prepare(
                "SELECT kind, scope, name, phase, message, desired_replicas, running_replicas, spec_hash, release_id, updated_at
                 FROM status ORDER BY kind, scope, name",
            )?;
            let rows = statement.query_map([], |row| {
                Ok((
                    (row.get::<_, String>(0)?, row.get::<_, String>(1)?, row.get::<_, String>(2)?),
                    ResourceStatus {
                        phase: row.get(3)?,
                        message: row.get(4)?,
                        desired_replicas: usize::try_from(row.get::<_, i64>(5)?).unwrap_or(0),
                        running_replicas: usize::try_from(row.get::<_, i64>(6)?).unwrap_or(0),
                        spec_hash: row.get(7)?,
                        release_id: row.get(8)?,
                        updated_at: row.get(9)?,
                    },
                ))
            })?;
            rows.map(|row| {
                let ((kind, scope, name), status) = row?;
                Ok((key_from_row(&kind, scope, name)?, status))
            })
            .collect()
        })
    }
}

fn append_journal(
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

fn key_from_row(kind: &str, scope: String, name: String) -> Result<ResourceKey> {
    let kind = Kind::parse(kind).ok_or_else(|| Error::Corrupt(format!("kind {kind:?}")))?;
    Ok(ResourceKey { kind, scope, name })
}

fn check_version(found: i64, path: &Path) -> Result<()> {
    let known = i64::try_from(schema::MIGRATIONS.len()).unwrap_or(i64::MAX);
    if found > known {
        return Err(Error::SchemaTooNew {
            path: path.to_owned(),
            found,
            known,
        });
    }
    Ok(())
}

fn migrate(connection: &mut Connection, path: &Path) -> Result<()> {
    let version: i64 = connection.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    check_version(version, path)?;
    let start = usize::try_from(version).unwrap_or(0);
    for (index, migration) in schema::MIGRATIONS.iter().enumerate().skip(start) {
        let tx = connection.transaction()?;
        tx.execute_batch(migration)?;
        tx.pragma_update(
            None,
            "user_version",
            i64::try_from(index + 1).unwrap_or(i64::MAX),
        )?;
        tx.commit()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
