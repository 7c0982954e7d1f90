//! The SQLite journal: desired state, the append-only journal the reconciler tails, its cursor,
//! releases and per-resource status. The only state shared between the agent's tasks, the HTTP
//! side and the CLI.
//!
//! Invariants:
//! - one SQLite transaction per commit: `apply_commit` updates `desired`, appends the PUT/DELETE
//!   journal rows and records the commit together, or does nothing at all;
//! - a rejected commit adds one `commits` row and touches nothing else;
//! - a pinned resource (`releases.rs`: an operator rollback) keeps its desired row while git
//!   declares what it declared at pin time; the first commit that changes the resource in git
//!   clears the pin in the same transaction that applies the change;
//! - every journal append by this process wakes subscribers at once (`subscribe`), so nobody
//!   polls SQLite; appends by another process (the `rollback` command) are noticed by
//!   `notice_external_writes`, which the sync loop calls before each sync.
//!
//! Calls block: async callers run them on `spawn_blocking`. The connection sits behind a std
//! `Mutex` that is never held across an `.await`.

mod detail;
mod error;
mod health;
mod releases;
mod runs;
mod schema;
mod secrets;
mod status;

pub use detail::{
    AssetDetail, AssetFileDetail, CronjobDetail, DeploymentDetail, Detail, HealthCheckDetail,
    IngressDetail, JobDetail, PodDetail, ProxyDetail, RegistryDetail, ReplicaDetail, RouteDetail,
    RunDetail, SkipDetail, StatefulsetDetail, TlsDetail, VolumeDetail,
};
pub use error::{Error, Result};
pub use health::{HEALTH_ENGINE, HEALTH_FETCH, Health};
pub use releases::{
    AutoRollback, HALT_MARK, Pin, RELEASE_HISTORY_LIMIT, RollbackOutcome, UnpinOutcome,
};
pub use runs::{CronState, JobRun, Readiness, RunStatus};
pub use secrets::{Bucket, Buckets};
pub use status::{FailureReason, Phase};

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
    /// Replicas to run: the autoscaler's override while the spec has `autoscale {}` (clamped
    /// to its min and max), else the manifest's count.
    pub n_replicas: usize,
    /// The autoscaler's count, when it applies (`n_replicas` is then this value).
    pub replicas_override: Option<usize>,
    /// Bumped each time the spec JSON changes.
    pub generation: i64,
    /// The commit that last changed this resource.
    pub commit: CommitSha,
    /// Which life of the resource this is: a resource deleted from git and added again is a
    /// new incarnation, whose rollbacks never go back to a release of the deleted one.
    pub incarnation: i64,
}

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
    pub key: ResourceKey,
    pub commit: CommitSha,
    pub spec_hash: SpecHash,
    /// The desired spec JSON at the time of the rollout.
    pub snapshot: String,
    pub phase: ReleasePhase,
    pub started_at: i64,
    pub finished_at: Option<i64>,
    pub message: String,
    /// For a rollback release: the release that was current when the operator rolled back.
    pub rolled_back_from: Option<i64>,
    /// The incarnation of the resource the release belongs to (`Desired::incarnation`).
    pub incarnation: i64,
}

/// What the reconciler last observed and did for one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceStatus {
    pub phase: Phase,
    /// Why it failed; `None` unless something failed (a retry in flight may keep it).
    pub reason: Option<FailureReason>,
    pub message: String,
    pub desired_replicas: usize,
    pub running_replicas: usize,
    pub spec_hash: String,
    pub release_id: Option<i64>,
    pub updated_at: i64,
    /// Kind-specific status (replicas, routes, schedule, files, …).
    pub detail: Detail,
}

impl ResourceStatus {
    /// An empty status in `phase`, stamped now.
    pub fn new(phase: Phase, message: impl Into<String>) -> ResourceStatus {
        ResourceStatus {
            phase,
            reason: None,
            message: message.into(),
            desired_replicas: 0,
            running_replicas: 0,
            spec_hash: String::new(),
            release_id: None,
            updated_at: now_unix(),
            detail: Detail::None,
        }
    }

    /// A `Failed` status for `reason`, stamped now.
    pub fn failed(reason: FailureReason, message: impl Into<String>) -> ResourceStatus {
        ResourceStatus {
            reason: Some(reason),
            ..ResourceStatus::new(Phase::Failed, message)
        }
    }
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
    /// Opens the database at `path` and runs pending migrations; when no file is there, first
    /// creates one whole (schema and agent id) under a temporary name and links it into place,
    /// so a `state.db` on disk is always a complete database.
    ///
    /// A file that is there but unusable (empty, zeroed, garbage, another program's database,
    /// no agent id) is `Error::Unusable`, never a fresh start: the agent's identity is in it.
    pub fn open(path: &Path) -> Result<Store> {
        let open_error = |source| Error::Open {
            path: path.to_owned(),
            source,
        };
        if let Some(parent) = path.parent() {
            // A missing parent shows up as an open error below, with the path in it.
            let _ = std::fs::create_dir_all(parent);
        }
        if !path.exists() {
            create_whole(path)?;
        }
        check_not_empty(path)?;
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut connection = Connection::open_with_flags(path, flags).map_err(open_error)?;
        // The timeout first: another handle may hold the lock the pragmas need.
        connection.busy_timeout(std::time::Duration::from_secs(5))?;
        // The version before the pragmas: switching another program's database to WAL would
        // change its file.
        let version: i64 = connection
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .map_err(|source| unusable_or(path, source))?;
        if version == 0 {
            return Err(no_schema(&connection, path));
        }
        connection
            .execute_batch(
                "PRAGMA journal_mode = WAL;
                 PRAGMA synchronous = NORMAL;
                 PRAGMA foreign_keys = ON;",
            )
            .map_err(|source| unusable_or(path, source))?;
        migrate(&mut connection, path).map_err(|error| match error {
            Error::Sqlite(source) => unusable_or(path, source),
            other => other,
        })?;
        let store = Store::from_connection(connection, path);
        store.agent_id()?;
        Ok(store)
    }

    /// Opens an existing database without writing to it (for `status` while the agent runs).
    pub fn open_read_only(path: &Path) -> Result<Store> {
        check_not_empty(path)?;
        let connection = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|source| Error::Open {
                path: path.to_owned(),
                source,
            })?;
        connection.busy_timeout(std::time::Duration::from_secs(5))?;
        let version: i64 = connection
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .map_err(|source| unusable_or(path, source))?;
        if version == 0 {
            return Err(no_schema(&connection, path));
        }
        check_version(version, path)?;
        let store = Store::from_connection(connection, path);
        store.agent_id()?;
        Ok(store)
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

    /// This data dir's agent id, made with the database (`open`): the `voodu.agent` label on
    /// every container this agent creates, so two agents (or a test and an agent) on one
    /// engine never touch each other's containers. A database without one has lost its
    /// identity: `Error::Unusable`, never a new id.
    pub fn agent_id(&self) -> Result<String> {
        let found = self.with(|connection| {
            Ok(connection
                .query_row("SELECT value FROM meta WHERE key = 'agent_id'", [], |row| {
                    row.get::<_, String>(0)
                })
                .optional())
        })?;
        match found {
            Ok(Some(id)) if !id.is_empty() => Ok(id),
            Ok(_) => Err(Error::Unusable {
                path: self.path.clone(),
                problem: "it holds no agent id".to_owned(),
            }),
            Err(source) => Err(unusable_or(&self.path, source)),
        }
    }

    /// Takes over another identity (`voodu-agent --adopt`): the agent id, and the digest key
    /// when it is known, so the adopted containers count as this agent's own and, with the
    /// key, as current.
    pub fn adopt_identity(&self, agent_id: &str, env_key: Option<&str>) -> Result<()> {
        self.with(|connection| {
            let tx = connection.transaction()?;
            let upsert = "INSERT INTO meta (key, value) VALUES (?1, ?2)
                          ON CONFLICT (key) DO UPDATE SET value = excluded.value";
            tx.execute(upsert, params!["agent_id", agent_id])?;
            if let Some(env_key) = env_key {
                tx.execute(upsert, params!["env_key", env_key])?;
            }
            tx.commit()?;
            Ok(())
        })
    }

    /// The key of this agent's keyed digests (`voodu.env_digest`), made once per data dir.
    pub fn env_key(&self) -> Result<String> {
        self.with(|connection| {
            connection.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('env_key', ?1)",
                params![crate::model::random_hex(32)],
            )?;
            Ok(
                connection.query_row(
                    "SELECT value FROM meta WHERE key = 'env_key'",
                    [],
                    |row| row.get(0),
                )?,
            )
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

    /// A value of the `meta` table (the agent's id, its HTTP address, …).
    pub fn meta(&self, key: &str) -> Result<Option<String>> {
        self.with(|connection| {
            Ok(connection
                .query_row(
                    "SELECT value FROM meta WHERE key = ?1",
                    params![key],
                    |row| row.get(0),
                )
                .optional()?)
        })
    }

    /// Sets (or, with `None`, removes) a value of the `meta` table.
    pub fn set_meta(&self, key: &str, value: Option<&str>) -> Result<()> {
        self.with(|connection| {
            match value {
                Some(value) => connection.execute(
                    "INSERT INTO meta (key, value) VALUES (?1, ?2)
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    params![key, value],
                )?,
                None => connection.execute("DELETE FROM meta WHERE key = ?1", params![key])?,
            };
            Ok(())
        })
    }

    /// Wakes subscribers when another process (the `rollback` or `unpin` command) appended
    /// journal rows this handle has not announced. One indexed read; cheap enough to call
    /// before every sync.
    pub fn notice_external_writes(&self) -> Result<()> {
        let head: i64 = self.with(|connection| {
            Ok(
                connection.query_row("SELECT COALESCE(MAX(seq), 0) FROM journal", [], |row| {
                    row.get(0)
                })?,
            )
        })?;
        self.journal_head.send_if_modified(|current| {
            let newer = head > *current;
            if newer {
                *current = head;
            }
            newer
        });
        Ok(())
    }

    /// The desired state of one resource, if the last applied commit declares it.
    pub fn desired(&self, key: &ResourceKey) -> Result<Option<Desired>> {
        self.with(|connection| {
            let row = connection
                .query_row(
                    "SELECT d.spec, d.spec_hash, d.replicas, d.generation, d.commit_sha, o.replicas,
                       d.incarnation
                     FROM desired d LEFT JOIN replica_overrides o
                       ON o.kind = d.kind AND o.scope = d.scope AND o.name = d.name
                     WHERE d.kind = ?1 AND d.scope = ?2 AND d.name = ?3",
                    params![key.kind.as_str(), key.scope, key.name],
                    |row| {
                        Ok((
                            row.get::<_, String>(0)?,
                            row.get::<_, String>(1)?,
                            row.get::<_, i64>(2)?,
                            row.get::<_, i64>(3)?,
                            row.get::<_, String>(4)?,
                            row.get::<_, Option<i64>>(5)?,
                            row.get::<_, i64>(6)?,
                        ))
                    },
                )
                .optional()?;
            row.map(
                |(spec_json, spec_hash, replicas, generation, commit, scaled, incarnation)| {
                    let spec =
                        Spec::from_json(key.kind, &spec_json).map_err(|source| Error::Spec {
                            key: key.clone(),
                            source,
                        })?;
                    // The autoscaler's count applies only while the spec autoscales, within
                    // its current bounds.
                    let replicas_override = match (&spec, scaled) {
                        (Spec::Deployment(deployment), Some(scaled))
                            if deployment.autoscale.is_some() =>
                        {
                            let scaled = usize::try_from(scaled).unwrap_or(1);
                            Some(deployment.effective_replicas(Some(scaled)))
                        }
                        _ => None,
                    };
                    Ok(Desired {
                        key: key.clone(),
                        // Clamped: an older agent may have stored any count unchecked.
                        n_replicas: replicas_override.unwrap_or_else(|| {
                            usize::try_from(replicas)
                                .unwrap_or(1)
                                .min(crate::manifest::spec::bounds::MAX_REPLICA_COUNT)
                        }),
                        replicas_override,
                        spec,
                        spec_json,
                        spec_hash: SpecHash::new(spec_hash),
                        generation,
                        commit: CommitSha::new(commit),
                        incarnation,
                    })
                },
            )
            .transpose()
        })
    }

    /// Records the autoscaler's replica count for `key` (a deployment with `autoscale`).
    pub fn set_replicas_override(
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
                    |row| {
                        Ok((
                            row.get::<_, i64>(0)?,
                            row.get::<_, String>(1)?,
                            row.get::<_, i64>(2)?,
                        ))
                    },
                )
                .optional()?;
            Ok(row
                .map(|(replicas, reason, at)| (usize::try_from(replicas).unwrap_or(1), reason, at)))
        })
    }

    /// Every resource's desired state, ordered by key. A row this agent cannot read (a spec
    /// written by another version, a damaged row) is left out rather than failing the whole
    /// list: it must not stop every other resource (their env, routes, resync) with it. Its
    /// own reconcile reads it with `desired` and reports the error.
    pub fn desired_all(&self) -> Result<Vec<Desired>> {
        let keys = self.desired_keys()?;
        let mut all = Vec::with_capacity(keys.len());
        for key in keys {
            match self.desired(&key) {
                Ok(Some(desired)) => all.push(desired),
                Ok(None) | Err(Error::Corrupt(_) | Error::Unknown { .. } | Error::Spec { .. }) => {}
                Err(other) => return Err(other),
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

/// Whether `spec` is a deployment with `autoscale {}`.
fn has_autoscale(spec: &Spec) -> bool {
    matches!(spec, Spec::Deployment(deployment) if deployment.autoscale.is_some())
}

/// Forgets the autoscaler's count for `key` (its deployment no longer autoscales, or left).
fn delete_override(tx: &rusqlite::Transaction<'_>, key: &ResourceKey) -> Result<()> {
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
fn put_desired(
    tx: &rusqlite::Transaction<'_>,
    key: &ResourceKey,
    spec: &Spec,
    spec_json: &str,
    generation: i64,
    commit: &CommitSha,
) -> Result<i64> {
    tx.execute(
        "INSERT INTO desired (kind, scope, name, spec, spec_hash, replicas, generation, commit_sha, incarnation)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, (
           SELECT COALESCE(MAX(incarnation), 0) + 1 FROM releases
           WHERE kind = ?1 AND scope = ?2 AND name = ?3))
         ON CONFLICT (kind, scope, name) DO UPDATE SET
           spec = excluded.spec, spec_hash = excluded.spec_hash,
           replicas = excluded.replicas, generation = excluded.generation,
           commit_sha = excluded.commit_sha",
        params![
            key.kind.as_str(),
            key.scope,
            key.name,
            spec_json,
            spec.spec_hash(key).as_str(),
            i64::try_from(spec.n_replicas()).unwrap_or(i64::MAX),
            generation,
            commit.as_str()
        ],
    )?;
    append_journal(tx, key, Op::Put, generation, commit)?;
    Ok(tx.query_row(
        "SELECT incarnation FROM desired WHERE kind = ?1 AND scope = ?2 AND name = ?3",
        params![key.kind.as_str(), key.scope, key.name],
        |row| row.get(0),
    )?)
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

pub(crate) fn key_from_row(kind: &str, scope: String, name: String) -> Result<ResourceKey> {
    let kind = Kind::parse(kind).ok_or_else(|| Error::Unknown {
        column: "kind",
        text: kind.to_owned(),
    })?;
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

/// Makes a new database whole under a temporary name (schema, agent id, digest key) and
/// links it to `path` unless another handle got there first. A database is never visible
/// half made, so an empty or id-less `state.db` always means lost state.
fn create_whole(path: &Path) -> Result<()> {
    let wal = sidecar(path, "-wal");
    if std::fs::metadata(&wal).is_ok_and(|metadata| metadata.len() > 0) {
        // SQLite would replay the old database's log into the new one.
        return Err(Error::Unusable {
            path: path.to_owned(),
            problem: format!(
                "the file is missing but its write-ahead log {} remains",
                wal.display()
            ),
        });
    }
    let temporary = sidecar(path, &format!(".new-{}", crate::model::random_hex(6)));
    let result = (|| {
        let mut connection = Connection::open(&temporary).map_err(|source| Error::Open {
            path: temporary.clone(),
            source,
        })?;
        migrate(&mut connection, &temporary)?;
        connection.execute(
            "INSERT INTO meta (key, value) VALUES ('agent_id', ?1), ('env_key', ?2)",
            params![crate::model::random_hex(8), crate::model::random_hex(32)],
        )?;
        drop(connection);
        match std::fs::hard_link(&temporary, path) {
            Ok(()) => Ok(()),
            // Another handle created it meanwhile: theirs is as good as ours.
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            // A file system without hard links: rename (no longer atomic against a racer).
            Err(_) => std::fs::rename(&temporary, path).map_err(|source| Error::Unusable {
                path: path.to_owned(),
                problem: format!("cannot create it: {source}"),
            }),
        }
    })();
    let _ = std::fs::remove_file(&temporary);
    result
}

/// `state.db` + `suffix`, beside it.
fn sidecar(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// A zero-length file: SQLite would take it for a new, empty database.
fn check_not_empty(path: &Path) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(metadata) if metadata.is_file() && metadata.len() == 0 => Err(Error::Unusable {
            path: path.to_owned(),
            problem: "the file is empty (0 bytes)".to_owned(),
        }),
        _ => Ok(()),
    }
}

/// Version 0: no voodu-agent schema; says whether it is another program's database.
fn no_schema(connection: &Connection, path: &Path) -> Error {
    let n_tables: i64 = connection
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'",
            [],
            |row| row.get(0),
        )
        .unwrap_or(0);
    Error::Unusable {
        path: path.to_owned(),
        problem: if n_tables > 0 {
            format!("it is not a voodu-agent database ({n_tables} tables, no schema version)")
        } else {
            "it is an empty SQLite database (no schema, no agent id)".to_owned()
        },
    }
}

/// A damaged file (`file is not a database`, a malformed image, a missing table) is
/// `Unusable`; anything else (a lock timeout, a full disk) stays an SQLite error.
fn unusable_or(path: &Path, source: rusqlite::Error) -> Error {
    use rusqlite::ErrorCode;
    let damaged = source.to_string().contains("no such table")
        || matches!(
            &source,
            rusqlite::Error::SqliteFailure(failure, _)
                if matches!(failure.code, ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt)
        );
    if damaged {
        Error::Unusable {
            path: path.to_owned(),
            problem: source.to_string(),
        }
    } else {
        Error::Sqlite(source)
    }
}

/// Runs pending migrations, each in a write transaction that reads the version first: two
/// handles opening one database at once (the agent and a `rollback` command) never run a
/// migration twice.
fn migrate(connection: &mut Connection, path: &Path) -> Result<()> {
    loop {
        let tx = connection.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let version: i64 = tx.query_row("PRAGMA user_version", [], |row| row.get(0))?;
        check_version(version, path)?;
        let Some(migration) = schema::MIGRATIONS.get(usize::try_from(version).unwrap_or(0)) else {
            return Ok(());
        };
        tx.execute_batch(migration)?;
        tx.pragma_update(None, "user_version", version + 1)?;
        tx.commit()?;
    }
}

#[cfg(test)]
mod tests;
