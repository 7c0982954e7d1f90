//! The SQLite journal: desired state, the append-only journal the reconciler tails, its cursor,
//! releases and per-resource status. The only state shared between the agent's tasks, the HTTP
//! side and the CLI.
//!
//! Invariants live with their tables (`commits.rs`, `desired.rs`, `releases.rs`, …); this
//! file's own: `state.db` is created whole, and a damaged one is `Error::Unusable`, never a
//! fresh start (`Store::open`).
//!
//! The tables come in families, one file each: `meta.rs` (identity), `commits.rs` (what each
//! commit did), `desired.rs` (desired state, the journal, cursors), `releases.rs` (releases,
//! rollback, pins), `status.rs` and `detail.rs` (per-resource status), `runs.rs` (job runs,
//! cron state, readiness), `secrets.rs` (config buckets, blobs), `health.rs` (the agent's own
//! health), `triggers.rs` (deploy triggers: firings, holds, approvals), `holds.rs` (deploy windows' and
//! freezes' held commits, freezes), `maintenance.rs`
//! (deployments whose ingress serves a maintenance page), `rollouts.rs` (canary and
//! blue/green rollouts' steps, analysis and requests), `activity.rs` (the
//! activity log, written in the transaction of the change it records); this file opens the database and runs `schema.rs`'s migrations.
//!
//! Calls block: async callers run them on `spawn_blocking`. The connection sits behind a std
//! `Mutex` that is never held across an `.await`.

mod activity;
mod backups;
mod claims;
mod commits;
mod desired;
mod detail;
mod error;
mod health;
mod holds;
mod images;
mod maintenance;
mod meta;
mod outbox;
mod previews;
mod releases;
mod rollouts;
mod runs;
mod schema;
mod secrets;
mod sources;
mod status;
mod triggers;

/// What the store remembers of a deploy trigger (the manifest stage's type).
pub(crate) use crate::manifest::triggers::TriggerState;
pub use activity::{
    Activity, ActivityOutcome, MAX_ROWS as MAX_ACTIVITY_ROWS, Origin,
    RETENTION_SECS as ACTIVITY_RETENTION_SECS, Who,
};
pub(crate) use backups::HISTORY as DATA_RUN_HISTORY;
pub use backups::{BackupFigures, DataReason, DataRun, DataState, DataWhat, NewDataRun};
pub use claims::{ClaimConflict, ClaimHolder};
pub use commits::{ApplySummary, CommitContext, CommitRecord, CommitSummary};
pub(crate) use desired::key_from_row;
pub(crate) use desired::{Desired, DesiredSummary, Op};
pub use detail::{
    AssetDetail, AssetFileDetail, CronjobDetail, DeploymentDetail, Detail, HealthCheckDetail,
    IngressDetail, JobDetail, PodDetail, ProxyDetail, RegistryDetail, ReplicaDetail, RouteDetail,
    RunDetail, SkipDetail, StatefulsetDetail, TlsDetail, VolumeDetail,
};
pub(crate) use error::{Error, Result};
pub use health::{HEALTH_ENGINE, HEALTH_FETCH, Health};
pub use holds::{EVERY_SOURCE, FreezeRecord, Hold, Released};
pub use images::{ImageScan, ImageUpdateRow, next_scan};
pub use maintenance::Maintenance;
pub(crate) use maintenance::{
    DEFAULT_MESSAGE as MAINTENANCE_MESSAGE, MAX_MESSAGE_BYTES as MAX_MAINTENANCE_MESSAGE,
    MAX_RETRY_AFTER_SECS,
};
pub(crate) use meta::{META_HOST_SELECTION, META_RUNTIME};
pub use outbox::{EVENTS, Event, SinkState};
pub use previews::PreviewRow;
pub use releases::{
    AutoRollback, HALT_MARK, Pin, RELEASE_HISTORY_LIMIT, Release, ReleasePhase, RollbackOutcome,
    UnpinOutcome,
};
pub use rollouts::{RolloutEvent, RolloutPhase, RolloutRequest, RolloutState};
pub use runs::{CronState, JobRun, Readiness, RunStatus};
pub(crate) use secrets::Buckets;
pub(crate) use sources::META_REPO_URL;
pub use sources::SourceRecord;
pub use status::{FailureReason, Phase, ResourceStatus};

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OpenFlags, params};
use tokio::sync::watch;

/// Prepared statements kept per connection: more than the distinct statements of a pass.
const STATEMENT_CACHE: usize = 64;

/// Handle on the state database. Cheap to share behind an `Arc`; `for_source` makes another
/// handle on the same connection that records and reads one source's commits.
pub struct Store {
    shared: Arc<Shared>,
    /// Who the changes this handle makes are recorded as made by (`acting_as`).
    who: Who,
    /// The source (repository) whose commits, triggers and fetches this handle reads and
    /// writes (`for_source`); `""` is the single `--repo` source.
    source: String,
}

/// What every handle on one database shares.
struct Shared {
    connection: Mutex<Connection>,
    path: PathBuf,
    journal_head: watch::Sender<i64>,
    /// Bumped after each write a reader may show (status, commits, releases, health), so
    /// live views wait for a change instead of polling.
    changes: watch::Sender<u64>,
    /// The maintenance version last seen (`maintenance.rs`).
    maintenance: watch::Sender<i64>,
    /// Turns of the blocking threads that run store work for async code (`blocking`).
    threads: Arc<tokio::sync::Semaphore>,
}

/// Blocking threads that run store work for async code at once. The store has one
/// connection, so a third only waits for its lock, on a thread of its own that tokio's
/// blocking pool starts for it: while 500 replicas were created (each pass and each new
/// replica's probe runner reading and writing rows) the pool grew to 40–52 threads, each
/// with its stack and its allocator's pages, and the agent's RSS with them (57–81 MiB).
/// Two: one runs while the next is ready to take the lock.
const STORE_THREADS: usize = 2;

/// Seconds since the Unix epoch.
pub fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX)
        })
}

/// Runs `f` with `store` on a blocking thread, in one of the store's thread turns
/// (`STORE_THREADS`): how async code reads and writes the store (its calls block; see the
/// module docs).
pub(crate) async fn blocking<T: Send + 'static>(
    store: &Arc<Store>,
    f: impl FnOnce(&Store) -> Result<T> + Send + 'static,
) -> Result<T> {
    in_turn(store, f).await?
}

/// Runs `f` with `store` on a blocking thread (`crate::pool`) once one of the store's thread turns
/// (`STORE_THREADS`) is free, held while `f` runs; the task's own outcome (a panic in `f` is
/// the caller's to resume or report).
pub(crate) async fn in_turn<T: Send + 'static>(
    store: &Arc<Store>,
    f: impl FnOnce(&Store) -> T + Send + 'static,
) -> std::result::Result<T, tokio::task::JoinError> {
    // The semaphore is never closed; were it, the work would go on without a turn.
    let turn = Arc::clone(&store.shared.threads).acquire_owned().await.ok();
    let store = Arc::clone(store);
    crate::pool::run_as_task(move || {
        let _turn = turn;
        f(&store)
    })
    .await
}

impl Store {
    /// Opens the database at `path` and runs pending migrations; when no file is there, first
    /// creates one whole (schema and agent id) under a temporary name and links it into place,
    /// so a `state.db` on disk is always a complete database.
    ///
    /// A file that is there but unusable (empty, zeroed, garbage, another program's database,
    /// no agent id) is `Error::Unusable`, never a fresh start: the agent's identity is in it.
    pub fn open(path: &Path) -> Result<Store> {
        if let Some(parent) = path.parent() {
            // A missing parent shows up as an open error below, with the path in it.
            let _ = std::fs::create_dir_all(parent);
        }
        if !path.exists() {
            create_whole(path)?;
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        // The version before the pragmas: switching another program's database to WAL would
        // change its file.
        let (mut connection, version) = connect(path, flags)?;
        connection
            .execute_batch(
                "PRAGMA journal_mode = WAL;
                 PRAGMA synchronous = NORMAL;
                 PRAGMA foreign_keys = ON;",
            )
            .map_err(|source| unusable_or(path, source))?;
        backup_before_migrating(&connection, path, version)?;
        migrate(&mut connection, path).map_err(|error| match error {
            Error::Sqlite(source) => unusable_or(path, source),
            other => other,
        })?;
        // Every transaction takes the write lock when it begins, waiting for it under the
        // busy timeout: a deferred one that read first would fail at once with "database is
        // locked" when another process (the agent, a command) wrote meanwhile, since WAL
        // cannot upgrade a read that another write made stale.
        connection.set_transaction_behavior(rusqlite::TransactionBehavior::Immediate);
        let store = Store::from_connection(connection, path);
        store.agent_id()?;
        Ok(store)
    }

    /// Opens an existing database without writing to it (for `status` while the agent runs).
    pub fn open_read_only(path: &Path) -> Result<Store> {
        let (connection, version) = connect(path, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
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
        let maintenance = maintenance::version(&connection).unwrap_or(0);
        Store {
            shared: Arc::new(Shared {
                connection: Mutex::new(connection),
                path: path.to_owned(),
                journal_head,
                changes: watch::channel(0).0,
                maintenance: watch::channel(maintenance).0,
                threads: Arc::new(tokio::sync::Semaphore::new(STORE_THREADS)),
            }),
            who: Who::AGENT,
            source: String::new(),
        }
    }

    /// A handle on the same database for source `name`: its commits, triggers, approvals
    /// and fetches are this source's, the resources it applies are recorded as its own, and
    /// only those are pruned by its commits (README "Several repositories").
    pub fn for_source(&self, name: &str) -> Store {
        Store {
            shared: self.shared.clone(),
            who: self.who.clone(),
            source: name.to_owned(),
        }
    }

    /// The source this handle acts for; `""` is the single `--repo` source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The `meta` key or health subject `base` of this handle's source: `base` itself for
    /// the single `--repo` source, `base:NAME` for a named one.
    pub(crate) fn source_key(&self, base: &str) -> String {
        source_key(base, &self.source)
    }

    /// Receives a new value after each write a status view shows: a resource's status, a
    /// commit's outcome, a release's start or end, a health check (writes of this handle
    /// only; another process's are not seen).
    pub(crate) fn subscribe_changes(&self) -> watch::Receiver<u64> {
        self.shared.changes.subscribe()
    }

    fn mark_changed(&self) {
        self.shared
            .changes
            .send_modify(|count| *count = count.wrapping_add(1));
    }

    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Frees SQLite's page cache of this connection (it refills on demand): after a commit's
    /// load, beside the allocator's give-back, so that a stream of large commits, each writing
    /// thousands of diagnostics, does not leave the cache's pages resident.
    pub(crate) fn shrink_memory(&self) -> Result<()> {
        self.with(|connection| Ok(connection.execute_batch("PRAGMA shrink_memory")?))
    }

    fn with<T>(&self, f: impl FnOnce(&mut Connection) -> Result<T>) -> Result<T> {
        let mut connection = crate::base::lock(&self.shared.connection);
        f(&mut connection)
    }
}

/// The `meta` key or health subject `base` of source `source` (`Store::source_key`).
pub(crate) fn source_key(base: &str, source: &str) -> String {
    if source.is_empty() {
        base.to_owned()
    } else {
        format!("{base}:{source}")
    }
}

/// Opens the non-empty database at `path` with `flags`, under a busy timeout and with the
/// statement cache, and reads its schema version; one without a schema (version 0) is refused.
fn connect(path: &Path, flags: OpenFlags) -> Result<(Connection, i64)> {
    check_not_empty(path)?;
    let connection = Connection::open_with_flags(path, flags).map_err(|source| Error::Open {
        path: path.to_owned(),
        source,
    })?;
    // The timeout first: another handle may hold the lock the pragmas need.
    connection.busy_timeout(std::time::Duration::from_secs(5))?;
    // Every statement of a pass is prepared once per connection, not at each call (parsing
    // SQL was a tenth of the agent's CPU per reconcile; benches/overhead.rs).
    connection.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    let version: i64 = connection
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(|source| unusable_or(path, source))?;
    if version == 0 {
        return Err(no_schema(&connection, path));
    }
    Ok((connection, version))
}

fn check_version(found: i64, path: &Path) -> Result<()> {
    let known = newest_version();
    if found > known {
        let backup = schema_backup(path, known);
        return Err(Error::SchemaTooNew {
            path: path.to_owned(),
            found,
            known,
            back: if backup.is_file() {
                format!(
                    "; a newer voodu-agent migrated it and kept it as it was at schema {known} in {backup}: to go back to this version, stop the agent and run `rm -f {path}-wal {path}-shm && cp {backup} {path}` (the agent id is the same, so its containers stay its own; what was recorded since the upgrade is lost), or upgrade voodu-agent",
                    backup = backup.display(),
                    path = path.display(),
                )
            } else {
                "; upgrade voodu-agent".to_owned()
            },
        });
    }
    Ok(())
}

/// Where the copy of `path` at schema `version`, kept before migrating it, lives:
/// `state.db.schema-<version>.bak` beside it.
pub(crate) fn schema_backup(path: &Path, version: i64) -> PathBuf {
    sidecar(path, &format!(".schema-{version}.bak"))
}

/// Before migrating an existing database from `version`, keeps a whole, consistent copy of it
/// (`VACUUM INTO`, the write-ahead log included) named after that version, so a downgrade can
/// go back to it; a copy already there (an earlier upgrade from the same version) is kept.
fn backup_before_migrating(connection: &Connection, path: &Path, version: i64) -> Result<()> {
    let known = newest_version();
    if version >= known {
        return Ok(());
    }
    let backup = schema_backup(path, version);
    if backup.exists() {
        return Ok(());
    }
    let target = backup.to_str().ok_or_else(|| Error::Unusable {
        path: path.to_owned(),
        problem: format!(
            "cannot keep a copy before migrating: {} is not UTF-8",
            backup.display()
        ),
    })?;
    match connection.execute("VACUUM INTO ?1", [target]) {
        Ok(_) => {
            tracing::info!(
                from = version,
                to = known,
                backup = %backup.display(),
                "migrating the state database; kept a copy of it as it was"
            );
            Ok(())
        }
        // Another handle opening the same database made it meanwhile.
        Err(_) if backup.exists() => Ok(()),
        Err(source) => Err(Error::Sqlite(source)),
    }
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
        // Nobody sees the file before it is linked, and a crash leaves only a temporary to
        // remove: no journal on disk and no sync per migration (fifteen of them, four syncs
        // each), one sync of the whole file below instead.
        connection.execute_batch("PRAGMA journal_mode = MEMORY; PRAGMA synchronous = OFF;")?;
        match newest_schema() {
            Some(schema) => {
                let tx = connection.transaction()?;
                tx.execute_batch(schema)?;
                tx.pragma_update(None, "user_version", newest_version())?;
                tx.commit()?;
            }
            None => migrate(&mut connection, &temporary)?,
        }
        connection.execute(
            "INSERT INTO meta (key, value) VALUES ('agent_id', ?1), ('env_key', ?2)",
            params![crate::model::random_hex(8), crate::model::random_hex(32)],
        )?;
        drop(connection);
        let synced = std::fs::File::open(&temporary).and_then(|file| file.sync_all());
        synced.map_err(|source| Error::Unusable {
            path: path.to_owned(),
            problem: format!("cannot create it: {source}"),
        })?;
        let linked = match std::fs::hard_link(&temporary, path) {
            Ok(()) => Ok(()),
            // Another handle created it meanwhile: theirs is as good as ours.
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            // A file system without hard links: rename (no longer atomic against a racer).
            Err(_) => std::fs::rename(&temporary, path).map_err(|source| Error::Unusable {
                path: path.to_owned(),
                problem: format!("cannot create it: {source}"),
            }),
        };
        // The new name is durable before anything is recorded under it.
        if let Some(parent) = path
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty())
        {
            let _ = std::fs::File::open(parent).and_then(|dir| dir.sync_all());
        }
        linked
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

/// The newest schema as one script of `CREATE` statements, for a new database: the migrations
/// run once per process on an empty in-memory database, and what they made is read back from
/// its `sqlite_master` (tables, then indexes). The migrations stay the one definition of the
/// schema; a new file is made in one transaction instead of one per migration (a table
/// rebuilt by a later migration is made once, in its last form). `None`, and every new file
/// migrated, if that ever fails or if the migrations leave rows behind (seed data would not
/// be in the script).
fn newest_schema() -> Option<&'static str> {
    static SCHEMA: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    SCHEMA
        .get_or_init(|| schema_script().ok().flatten())
        .as_deref()
}

/// `newest_schema`'s script, made afresh; `None` when the migrations leave a row behind.
fn schema_script() -> rusqlite::Result<Option<String>> {
    let connection = Connection::open_in_memory()?;
    for migration in schema::MIGRATIONS {
        connection.execute_batch(migration)?;
    }
    let mut statement = connection.prepare(
        "SELECT type, name, sql FROM sqlite_master
         WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'
         ORDER BY type = 'table' DESC, rowid",
    )?;
    let objects = statement
        .query_map([], |row| <(String, String, String)>::try_from(row))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut script = String::new();
    for (kind, name, sql) in &objects {
        if kind == "table" {
            let quoted = name.replace('"', "\"\"");
            let empty: bool = connection.query_row(
                &format!("SELECT NOT EXISTS (SELECT 1 FROM \"{quoted}\")"),
                [],
                |row| row.get(0),
            )?;
            if !empty {
                return Ok(None);
            }
        }
        script.push_str(sql);
        script.push_str(";\n");
    }
    Ok(Some(script))
}

/// The schema version the newest migration leaves (`PRAGMA user_version`).
fn newest_version() -> i64 {
    i64::try_from(schema::MIGRATIONS.len()).unwrap_or(i64::MAX)
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
