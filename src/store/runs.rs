//! Run-time records of the kinds that are not plain replicas: job runs (jobs and cronjob
//! ticks) with their exit code and log tail, each cronjob's schedule position, and the
//! readiness of every replica (which the ingress routes follow and rollouts wait for), and
//! the outbox events of a replica's probe verdict turning (`probe.failing`,
//! `probe.recovered`), written with the readiness row, on the transition only and bounded.
//!
//! Invariants: a job run is written as `running` before its container starts and finished
//! once, so a killed agent finds the runs it must still wait for; history is trimmed to the
//! limits the caller gives, newest kept, running runs never trimmed.

use rusqlite::{OptionalExtension, params};

use super::{Error, Result, Store, now_unix};
use crate::model::ResourceKey;

/// How a job run ended (or that it has not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    Running,
    Succeeded,
    Failed,
}

impl RunStatus {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
        }
    }

    fn parse(text: &str) -> RunStatus {
        match text {
            "succeeded" => RunStatus::Succeeded,
            "failed" => RunStatus::Failed,
            _ => RunStatus::Running,
        }
    }
}

/// One run of a job or cronjob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRun {
    pub(crate) id: i64,
    pub(crate) key: ResourceKey,
    pub run_id: String,
    pub spec_hash: String,
    pub container: String,
    pub started_at: i64,
    pub ended_at: Option<i64>,
    pub exit_code: Option<i64>,
    pub status: RunStatus,
    pub error: String,
    pub logs_tail: String,
}

/// A cronjob's position in its schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronState {
    /// The schedule (and time zone) the position belongs to; a change starts afresh.
    pub(crate) schedule: String,
    /// The last scheduled time handled (fired, skipped or missed), Unix seconds.
    pub last_scheduled: Option<i64>,
    pub next_run: Option<i64>,
}

/// Whether one replica is ready, as the agent last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// The container's name.
    pub container: String,
    /// The container instance the row is about; a row whose id is not the container's now
    /// (it was re-created under the same name) says nothing about it.
    pub container_id: String,
    pub key: ResourceKey,
    pub ready: bool,
    pub reason: String,
    /// `ip` on the shared network, for routes.
    pub address: String,
    pub updated_at: i64,
}

const RUN_COLUMNS: &str =
    "id, run_id, spec_hash, container, started_at, ended_at, exit_code, status, error, logs_tail";

impl Store {
    /// Records a run that is starting; returns its row id.
    pub(crate) fn begin_job_run(
        &self,
        key: &ResourceKey,
        run_id: &str,
        spec_hash: &str,
        container: &str,
    ) -> Result<i64> {
        self.with(|connection| {
            connection.execute(
                "INSERT INTO job_runs (kind, scope, name, run_id, spec_hash, container, started_at, status)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'running')",
                params![key.kind.as_str(), key.scope, key.name, run_id, spec_hash, container, now_unix()],
            )?;
            Ok(connection.last_insert_rowid())
        })
    }

    /// Finishes a run that ended at `ended_at` (Unix seconds; the engine's own end time when
    /// it has one). Once: a finished run is left as it is, and the answer says whether this
    /// call finished it.
    pub(crate) fn finish_job_run(
        &self,
        id: i64,
        status: RunStatus,
        exit_code: Option<i64>,
        error: &str,
        logs_tail: &str,
        ended_at: i64,
    ) -> Result<bool> {
        self.with(|connection| {
            let changed = connection.execute(
                "UPDATE job_runs SET status = ?2, exit_code = ?3, error = ?4, logs_tail = ?5, ended_at = ?6
                 WHERE id = ?1 AND status = 'running'",
                params![id, status.as_str(), exit_code, error, logs_tail, ended_at],
            )?;
            Ok(changed > 0)
        })
    }

    /// A resource's runs, newest first.
    pub fn job_runs(&self, key: &ResourceKey) -> Result<Vec<JobRun>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(&format!(
                "SELECT {RUN_COLUMNS} FROM job_runs WHERE kind = ?1 AND scope = ?2 AND name = ?3 ORDER BY id DESC"
            ))?;
            let rows = statement.query_map(params![key.kind.as_str(), key.scope, key.name], |row| {
                Ok(JobRun {
                    id: row.get(0)?,
                    key: key.clone(),
                    run_id: row.get(1)?,
                    spec_hash: row.get(2)?,
                    container: row.get(3)?,
                    started_at: row.get(4)?,
                    ended_at: row.get(5)?,
                    exit_code: row.get(6)?,
                    status: RunStatus::parse(&row.get::<_, String>(7)?),
                    error: row.get(8)?,
                    logs_tail: row.get(9)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    /// Keeps the newest `succeeded` and `failed` runs up to the limits (running runs stay);
    /// returns the container names of the runs dropped.
    pub(crate) fn trim_job_runs(
        &self,
        key: &ResourceKey,
        keep_succeeded: usize,
        keep_failed: usize,
    ) -> Result<Vec<String>> {
        let runs = self.job_runs(key)?;
        let mut dropped = Vec::new();
        let (mut succeeded, mut failed) = (0, 0);
        let mut ids = Vec::new();
        for run in runs {
            let keep = match run.status {
                RunStatus::Running => true,
                RunStatus::Succeeded => {
                    succeeded += 1;
                    succeeded <= keep_succeeded
                }
                RunStatus::Failed => {
                    failed += 1;
                    failed <= keep_failed
                }
            };
            if !keep {
                ids.push(run.id);
                dropped.push(run.container);
            }
        }
        self.with(|connection| {
            for id in ids {
                connection.execute("DELETE FROM job_runs WHERE id = ?1", params![id])?;
            }
            Ok(())
        })?;
        Ok(dropped)
    }

    /// Removes every run record of a resource.
    pub(crate) fn delete_job_runs(&self, key: &ResourceKey) -> Result<()> {
        self.with(|connection| {
            connection.execute(
                "DELETE FROM job_runs WHERE kind = ?1 AND scope = ?2 AND name = ?3",
                params![key.kind.as_str(), key.scope, key.name],
            )?;
            Ok(())
        })
    }

    pub fn cron_state(&self, scope: &str, name: &str) -> Result<Option<CronState>> {
        self.with(|connection| {
            Ok(connection
                .query_row(
                    "SELECT schedule, last_scheduled, next_run FROM cron_state WHERE scope = ?1 AND name = ?2",
                    params![scope, name],
                    |row| {
                        Ok(CronState {
                            schedule: row.get(0)?,
                            last_scheduled: row.get(1)?,
                            next_run: row.get(2)?,
                        })
                    },
                )
                .optional()?)
        })
    }

    pub(crate) fn put_cron_state(&self, scope: &str, name: &str, state: &CronState) -> Result<()> {
        self.with(|connection| {
            connection.execute(
                "INSERT INTO cron_state (scope, name, schedule, last_scheduled, next_run) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (scope, name) DO UPDATE SET schedule = excluded.schedule,
                   last_scheduled = excluded.last_scheduled, next_run = excluded.next_run",
                params![scope, name, state.schedule, state.last_scheduled, state.next_run],
            )?;
            Ok(())
        })
    }

    pub(crate) fn delete_cron_state(&self, scope: &str, name: &str) -> Result<()> {
        self.with(|connection| {
            connection.execute(
                "DELETE FROM cron_state WHERE scope = ?1 AND name = ?2",
                params![scope, name],
            )?;
            Ok(())
        })
    }

    /// Records one replica's readiness. A probe's verdict turning (a ready replica whose
    /// readiness or liveness probe now fails; one that failed so passing again) is also an
    /// outbox event, `probe.failing` / `probe.recovered` (the resource's timeline, the
    /// sinks), on the transition only and at most one `probe.failing` per resource per
    /// [`PROBE_EVENT_GAP`]: a recovery is told only of the replica whose failing was told.
    pub fn put_readiness(&self, readiness: &Readiness) -> Result<()> {
        let key = &readiness.key;
        let told = self.with(|connection| {
            let tx = connection.transaction()?;
            let before: Option<(String, bool, String)> = tx
                .query_row(
                    "SELECT container_id, ready, reason FROM readiness WHERE container = ?1",
                    params![readiness.container],
                    |row| <(String, bool, String)>::try_from(row),
                )
                .optional()?;
            tx.prepare_cached(
                "INSERT INTO readiness (container, container_id, kind, scope, name, ready, reason, address, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
                 ON CONFLICT (container) DO UPDATE SET container_id = excluded.container_id,
                   kind = excluded.kind, scope = excluded.scope, name = excluded.name,
                   ready = excluded.ready, reason = excluded.reason,
                   address = excluded.address, updated_at = excluded.updated_at",
            )?.execute(
                params![
                    readiness.container,
                    readiness.container_id,
                    key.kind.as_str(),
                    key.scope,
                    key.name,
                    readiness.ready,
                    readiness.reason,
                    readiness.address,
                    readiness.updated_at
                ],
            )?;
            let before = before
                .as_ref()
                .filter(|(id, ..)| *id == readiness.container_id)
                .map(|(_, ready, reason)| (*ready, reason.as_str()));
            let told = match probe_turn(before, readiness.ready, &readiness.reason) {
                Some(event) => tell_probe_turn(&tx, event, readiness)?,
                None => false,
            };
            tx.commit()?;
            Ok(told)
        })?;
        if told {
            self.mark_changed();
        }
        Ok(())
    }

    /// Readiness of a resource's replicas.
    pub fn readiness(&self, key: &ResourceKey) -> Result<Vec<Readiness>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(
                "SELECT container, container_id, ready, reason, address, updated_at FROM readiness
                 WHERE kind = ?1 AND scope = ?2 AND name = ?3 ORDER BY container",
            )?;
            let rows =
                statement.query_map(params![key.kind.as_str(), key.scope, key.name], |row| {
                    Ok(Readiness {
                        container: row.get(0)?,
                        container_id: row.get(1)?,
                        key: key.clone(),
                        ready: row.get(2)?,
                        reason: row.get(3)?,
                        address: row.get(4)?,
                        updated_at: row.get(5)?,
                    })
                })?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    /// Forgets the readiness row of one container instance (a row the name's next container
    /// already rewrote is kept).
    pub(crate) fn forget_readiness_of(&self, container: &str, container_id: &str) -> Result<()> {
        self.with(|connection| {
            connection.execute(
                "DELETE FROM readiness WHERE container = ?1 AND container_id = ?2",
                params![container, container_id],
            )?;
            Ok(())
        })
    }

    /// Keeps only the rows of containers in `alive` (ids); returns how many went. Rows of
    /// containers removed while no runner watched them (agent down, a failed delete) go here.
    pub(crate) fn retain_readiness(
        &self,
        alive: &std::collections::BTreeSet<String>,
    ) -> Result<usize> {
        self.with(|connection| {
            let tx = connection.transaction()?;
            let rows: Vec<(String, String)> = {
                let mut statement =
                    tx.prepare_cached("SELECT container, container_id FROM readiness")?;
                let rows = statement.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            let mut gone = 0;
            for (container, id) in rows {
                if !alive.contains(&id) {
                    gone += tx.execute(
                        "DELETE FROM readiness WHERE container = ?1 AND container_id = ?2",
                        params![container, id],
                    )?;
                }
            }
            tx.commit()?;
            Ok(gone)
        })
    }

    /// Forgets the readiness of containers that no longer exist.
    pub(crate) fn forget_readiness(&self, containers: &[String]) -> Result<()> {
        self.with(|connection| {
            for container in containers {
                connection.execute(
                    "DELETE FROM readiness WHERE container = ?1",
                    params![container],
                )?;
            }
            Ok(())
        })
    }
}

impl Store {
    /// What the images of `key`'s spec `spec_hash` run as, when one of its runs resolved them.
    pub(crate) fn run_images(
        &self,
        key: &ResourceKey,
        spec_hash: &str,
    ) -> Result<Option<std::collections::BTreeMap<String, String>>> {
        let text: Option<String> = self.with(|connection| {
            Ok(connection
                .query_row(
                    "SELECT images FROM run_images WHERE kind = ?1 AND scope = ?2 AND name = ?3 AND spec_hash = ?4",
                    rusqlite::params![key.kind.as_str(), key.scope, key.name, spec_hash],
                    |row| row.get(0),
                )
                .optional()?)
        })?;
        text.map(|text| {
            serde_json::from_str(&text)
                .map_err(|error| Error::Corrupt(format!("run images {text:?}: {error}")))
        })
        .transpose()
    }

    /// Records what the images of `key`'s spec `spec_hash` run as, once (the first run's
    /// resolution stays); returns what is recorded. Older specs' records of the key go.
    pub(crate) fn record_run_images(
        &self,
        key: &ResourceKey,
        spec_hash: &str,
        images: &std::collections::BTreeMap<String, String>,
    ) -> Result<std::collections::BTreeMap<String, String>> {
        let json = serde_json::to_string(images).expect("a map of strings serialises");
        self.with(|connection| {
            let tx = connection.transaction()?;
            tx.execute(
                "INSERT OR IGNORE INTO run_images (kind, scope, name, spec_hash, images, resolved_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                rusqlite::params![key.kind.as_str(), key.scope, key.name, spec_hash, json, super::now_unix()],
            )?;
            // A key keeps the resolutions of its last few specs (a revert reuses one).
            tx.execute(
                "DELETE FROM run_images WHERE kind = ?1 AND scope = ?2 AND name = ?3 AND spec_hash NOT IN (
                   SELECT spec_hash FROM run_images WHERE kind = ?1 AND scope = ?2 AND name = ?3
                   ORDER BY resolved_at DESC, rowid DESC LIMIT 10)",
                rusqlite::params![key.kind.as_str(), key.scope, key.name],
            )?;
            tx.commit()?;
            Ok(())
        })?;
        Ok(self
            .run_images(key, spec_hash)?
            .unwrap_or_else(|| images.clone()))
    }
}

/// The fewest seconds between two `probe.failing` events of one resource.
pub(crate) const PROBE_EVENT_GAP: i64 = 60;

/// A reason the probe runner gives when a probe's verdict is the cause (not a start, a
/// settle time or a stop).
fn probe_reason(reason: &str) -> bool {
    reason.starts_with("readiness probe") || reason.starts_with("liveness probe")
}

/// The event a replica's readiness change is (pure): `before` is what the same container
/// instance had recorded (ready, reason), if anything.
pub(crate) fn probe_turn(
    before: Option<(bool, &str)>,
    ready: bool,
    reason: &str,
) -> Option<&'static str> {
    match before {
        Some((true, _)) if !ready && probe_reason(reason) => Some("probe.failing"),
        Some((false, was)) if ready && probe_reason(was) => Some("probe.recovered"),
        _ => None,
    }
}

/// Appends `event` for `readiness`'s replica unless the bounds say not (see
/// [`Store::put_readiness`]); whether it did.
fn tell_probe_turn(
    tx: &rusqlite::Transaction<'_>,
    event: &str,
    readiness: &Readiness,
) -> rusqlite::Result<bool> {
    let resource = readiness.key.to_string();
    let tell = if event == "probe.failing" {
        !tx.query_row(
            "SELECT EXISTS (SELECT 1 FROM outbox
               WHERE resource = ?1 AND event = 'probe.failing' AND at > ?2)",
            params![resource, now_unix() - PROBE_EVENT_GAP],
            |row| row.get::<_, bool>(0),
        )?
    } else {
        let last: Option<(String, String)> = tx
            .query_row(
                "SELECT event, data FROM outbox
                 WHERE resource = ?1 AND event IN ('probe.failing', 'probe.recovered')
                 ORDER BY id DESC LIMIT 1",
                params![resource],
                |row| <(String, String)>::try_from(row),
            )
            .optional()?;
        last.is_some_and(|(last, data)| {
            last == "probe.failing"
                && serde_json::from_str::<serde_json::Value>(&data).is_ok_and(|data| {
                    data["container"].as_str() == Some(readiness.container.as_str())
                })
        })
    };
    if tell {
        let message = if event == "probe.failing" {
            format!(
                "replica {} is failing: {}",
                readiness.container, readiness.reason
            )
        } else {
            format!("replica {} passes its probes again", readiness.container)
        };
        super::outbox::put(
            tx,
            &super::outbox::NewEvent {
                event,
                resource: &resource,
                commit: None,
                message: &message,
                data: serde_json::json!({ "container": readiness.container }),
                source: "",
            },
        )?;
    }
    Ok(tell)
}
