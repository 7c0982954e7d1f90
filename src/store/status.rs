//! Per-resource status: what the reconciler last observed and did, read by `status`, the HTTP
//! side and `plan`.
//!
//! Invariants: one row per resource; a handler replaces the whole row, and `detail` holds the
//! kind-specific part as JSON (`detail::Detail`). The phase and the failure reason are closed enums stored by
//! their text (`as_str`); a row holding a text this agent does not know is reported as
//! `Error::Unknown`, never guessed at. The reason is set exactly when something failed (it
//! may stay set while a retry is pending); readers ask for it (`statuses_failed_with`)
//! instead of searching messages.

use rusqlite::{OptionalExtension, params};

use super::{Detail, Error, Result, Store, key_from_row, now_unix};
use crate::model::ResourceKey;

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
    pub(crate) fn failed(reason: FailureReason, message: impl Into<String>) -> ResourceStatus {
        ResourceStatus {
            reason: Some(reason),
            ..ResourceStatus::new(Phase::Failed, message)
        }
    }
}

/// Where a resource stands after its last reconcile, as `status` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// Converged: what git declares runs (and is ready).
    Ready,
    /// Working towards desired state (a rollout, a scale-up, replicas not ready yet).
    Progressing,
    /// Running, but below what is declared (a replica down, an upstream unhealthy).
    Degraded,
    /// Cannot converge until something changes (see the failure reason and message).
    Failed,
    /// Not started yet (a job waiting to run, a cronjob waiting on an error retry).
    Pending,
    /// A job or cronjob run is in progress.
    Running,
    /// A job's last run exited 0.
    Succeeded,
    /// A cronjob with `suspend = true`: no tick runs.
    Suspended,
    /// A cronjob waiting for its next tick.
    Scheduled,
    /// An ingress while the agent's proxy is off.
    Disabled,
}

impl Phase {
    pub(crate) const ALL: [Phase; 10] = [
        Phase::Ready,
        Phase::Progressing,
        Phase::Degraded,
        Phase::Failed,
        Phase::Pending,
        Phase::Running,
        Phase::Succeeded,
        Phase::Suspended,
        Phase::Scheduled,
        Phase::Disabled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Ready => "Ready",
            Phase::Progressing => "Progressing",
            Phase::Degraded => "Degraded",
            Phase::Failed => "Failed",
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Suspended => "Suspended",
            Phase::Scheduled => "Scheduled",
            Phase::Disabled => "Disabled",
        }
    }

    /// The phase stored as `text`; an unknown text is a row this agent cannot read.
    pub(crate) fn parse(text: &str) -> Result<Phase> {
        Phase::ALL
            .into_iter()
            .find(|phase| phase.as_str() == text)
            .ok_or_else(|| Error::Unknown {
                column: "status phase",
                text: text.to_owned(),
            })
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl PartialEq<str> for Phase {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Phase {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// Why a resource failed, by cause: what `status` filters and other handlers look up
/// (the registry handler retries `ImageMissing` and `PullFailed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FailureReason {
    /// The image is not on the host and nothing could pull it (creating the container said so).
    ImageMissing,
    /// Pulling the missing image failed (no registry declared for it, wrong credentials, …).
    PullFailed,
    /// A registry's credential helper could not give credentials.
    Credentials,
    /// The engine refused a request (a bad spec, a device or ulimit it will not grant).
    EngineRefused,
    /// The engine could not be reached or could not serve right now.
    EngineUnavailable,
    /// The containers' environment cannot be built (missing config buckets, unresolved refs).
    Environment,
    /// The spec cannot become a container, or is of another kind than its key.
    Spec,
    /// An init container failed or timed out.
    Init,
    /// A `release` hook failed.
    Hook,
    /// The rollout did not converge before its deadline.
    RolloutDeadline,
    /// A new replica kept crashing during the rollout.
    CrashLoop,
    /// A replica's health probe failed.
    Probe,
    /// The rollout failed and waits for desired state to change.
    Halted,
    /// A job run exited non-zero, timed out or could not start.
    RunFailed,
    /// A cronjob's schedule or policy cannot be used.
    Schedule,
    /// An asset's files cannot be written.
    Files,
    /// The ingress proxy cannot be configured.
    Proxy,
    /// The state database failed.
    Store,
    /// A plugin-owned block names a plugin that is not installed (the agent installs none).
    PluginNotInstalled,
    /// Docker Swarm rolled the rollout's service update back (its new tasks failed).
    SwarmRollback,
    /// The resource uses something Docker Swarm cannot run (`--runtime swarm`).
    SwarmUnsupported,
    /// The handler panicked.
    Panic,
    /// Shutting down, or a background task that could not finish.
    Interrupted,
    /// An image of a repository that requires a signature has no valid one for its digest.
    Unverified,
    /// A backup (`backup {}`) failed: a release it guards (`before_release`) is held.
    BackupFailed,
    /// A canary rollout was aborted: its analysis failed, or `voodu-agent abort`.
    RolloutAborted,
}

impl FailureReason {
    pub(crate) const ALL: [FailureReason; 26] = [
        FailureReason::ImageMissing,
        FailureReason::PullFailed,
        FailureReason::Credentials,
        FailureReason::EngineRefused,
        FailureReason::EngineUnavailable,
        FailureReason::Environment,
        FailureReason::Spec,
        FailureReason::Init,
        FailureReason::Hook,
        FailureReason::RolloutDeadline,
        FailureReason::CrashLoop,
        FailureReason::Probe,
        FailureReason::Halted,
        FailureReason::RunFailed,
        FailureReason::Schedule,
        FailureReason::Files,
        FailureReason::Proxy,
        FailureReason::Store,
        FailureReason::PluginNotInstalled,
        FailureReason::SwarmRollback,
        FailureReason::SwarmUnsupported,
        FailureReason::Panic,
        FailureReason::Interrupted,
        FailureReason::Unverified,
        FailureReason::BackupFailed,
        FailureReason::RolloutAborted,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FailureReason::ImageMissing => "ImageMissing",
            FailureReason::PullFailed => "PullFailed",
            FailureReason::Credentials => "Credentials",
            FailureReason::EngineRefused => "EngineRefused",
            FailureReason::EngineUnavailable => "EngineUnavailable",
            FailureReason::Environment => "Environment",
            FailureReason::Spec => "Spec",
            FailureReason::Init => "Init",
            FailureReason::Hook => "Hook",
            FailureReason::RolloutDeadline => "RolloutDeadline",
            FailureReason::CrashLoop => "CrashLoop",
            FailureReason::Probe => "Probe",
            FailureReason::Halted => "Halted",
            FailureReason::RunFailed => "RunFailed",
            FailureReason::Schedule => "Schedule",
            FailureReason::Files => "Files",
            FailureReason::Proxy => "Proxy",
            FailureReason::Store => "Store",
            FailureReason::PluginNotInstalled => "PluginNotInstalled",
            FailureReason::SwarmRollback => "SwarmRollback",
            FailureReason::SwarmUnsupported => "SwarmUnsupported",
            FailureReason::Panic => "Panic",
            FailureReason::Interrupted => "Interrupted",
            FailureReason::Unverified => "Unverified",
            FailureReason::BackupFailed => "BackupFailed",
            FailureReason::RolloutAborted => "RolloutAborted",
        }
    }

    /// The reason stored as `text`; an unknown text is a row this agent cannot read.
    pub(crate) fn parse(text: &str) -> Result<FailureReason> {
        FailureReason::ALL
            .into_iter()
            .find(|reason| reason.as_str() == text)
            .ok_or_else(|| Error::Unknown {
                column: "status reason",
                text: text.to_owned(),
            })
    }
}

impl std::fmt::Display for FailureReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

type StatusRow = (
    String,
    String,
    String,
    String,
    String,
    i64,
    i64,
    String,
    Option<i64>,
    i64,
    String,
    Option<String>,
);

const COLUMNS: &str = "kind, scope, name, phase, message, desired_replicas, running_replicas, spec_hash, release_id, updated_at, detail, reason";

fn status_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<StatusRow> {
    StatusRow::try_from(row)
}

fn from_row(row: StatusRow) -> Result<(ResourceKey, ResourceStatus)> {
    let (
        kind,
        scope,
        name,
        phase,
        message,
        desired,
        running,
        spec_hash,
        release_id,
        updated_at,
        detail,
        reason,
    ) = row;
    let key = key_from_row(&kind, scope, name)?;
    let detail = Detail::from_json(key.kind, &detail);
    Ok((
        key,
        ResourceStatus {
            phase: Phase::parse(&phase)?,
            reason: reason.as_deref().map(FailureReason::parse).transpose()?,
            message,
            desired_replicas: usize::try_from(desired).unwrap_or(0),
            running_replicas: usize::try_from(running).unwrap_or(0),
            spec_hash,
            release_id,
            updated_at,
            detail,
        },
    ))
}

impl Store {
    pub fn put_status(&self, key: &ResourceKey, status: &ResourceStatus) -> Result<()> {
        let detail = status.detail.to_json();
        let result = self.with(|connection| {
            connection.prepare_cached(
                "INSERT INTO status (kind, scope, name, phase, message, desired_replicas, running_replicas, spec_hash, release_id, updated_at, detail, reason)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
                 ON CONFLICT (kind, scope, name) DO UPDATE SET
                   phase = excluded.phase, message = excluded.message,
                   desired_replicas = excluded.desired_replicas, running_replicas = excluded.running_replicas,
                   spec_hash = excluded.spec_hash, release_id = excluded.release_id,
                   updated_at = excluded.updated_at, detail = excluded.detail,
                   reason = excluded.reason",
            )?.execute(
                params![
                    key.kind.as_str(),
                    key.scope,
                    key.name,
                    status.phase.as_str(),
                    status.message,
                    i64::try_from(status.desired_replicas).unwrap_or(i64::MAX),
                    i64::try_from(status.running_replicas).unwrap_or(i64::MAX),
                    status.spec_hash,
                    status.release_id,
                    status.updated_at,
                    detail,
                    status.reason.map(FailureReason::as_str)
                ],
            )?;
            Ok(())
        });
        self.mark_changed();
        result
    }

    pub fn delete_status(&self, key: &ResourceKey) -> Result<()> {
        let result = self.with(|connection| {
            connection.execute(
                "DELETE FROM status WHERE kind = ?1 AND scope = ?2 AND name = ?3",
                params![key.kind.as_str(), key.scope, key.name],
            )?;
            Ok(())
        });
        self.mark_changed();
        result
    }

    pub fn status(&self, key: &ResourceKey) -> Result<Option<ResourceStatus>> {
        self.with(|connection| {
            let row = connection
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM status WHERE kind = ?1 AND scope = ?2 AND name = ?3"
                ))?
                .query_row(params![key.kind.as_str(), key.scope, key.name], status_row)
                .optional()?;
            row.map(|row| from_row(row).map(|(_, status)| status))
                .transpose()
        })
    }

    /// The status a handler is about to replace: like `status`, but a row this agent cannot
    /// read (`Error::Unknown`: a newer agent's phase or reason) is `None`, since the write
    /// that follows replaces it; every other error stays an error.
    pub(crate) fn previous_status(&self, key: &ResourceKey) -> Result<Option<ResourceStatus>> {
        match self.status(key) {
            Err(Error::Unknown { .. }) => Ok(None),
            other => other,
        }
    }

    /// Every resource's status, ordered by key.
    pub fn statuses(&self) -> Result<Vec<(ResourceKey, ResourceStatus)>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM status ORDER BY kind, scope, name"
            ))?;
            let rows = statement.query_map([], status_row)?;
            rows.map(|row| from_row(row?)).collect()
        })
    }

    /// Every key the store holds per-resource state for: a status row, job runs, a cron
    /// position or readiness rows. The reconciler's boot replay visits them all, so a resource
    /// deleted while it was not running leaves nothing behind. Rows of a kind this agent does
    /// not know are skipped.
    pub(crate) fn state_keys(&self) -> Result<Vec<ResourceKey>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(
                "SELECT kind, scope, name FROM status
                 UNION SELECT kind, scope, name FROM job_runs
                 UNION SELECT 'cronjob', scope, name FROM cron_state
                 UNION SELECT kind, scope, name FROM readiness
                 ORDER BY 1, 2, 3",
            )?;
            let rows = statement.query_map([], |row| <(String, String, String)>::try_from(row))?;
            let mut keys = Vec::new();
            for row in rows {
                let (kind, scope, name) = row?;
                if let Ok(key) = key_from_row(&kind, scope, name) {
                    keys.push(key);
                }
            }
            Ok(keys)
        })
    }

    /// The keys whose status is `Failed` for one of `reasons`, ordered by key.
    pub(crate) fn statuses_failed_with(
        &self,
        reasons: &[FailureReason],
    ) -> Result<Vec<ResourceKey>> {
        let reasons: Vec<&str> = reasons.iter().map(|reason| reason.as_str()).collect();
        self.with(|connection| {
            let mut statement = connection.prepare_cached(
                "SELECT kind, scope, name, reason FROM status
                 WHERE phase = ?1 AND reason IS NOT NULL ORDER BY kind, scope, name",
            )?;
            let rows = statement.query_map(params![Phase::Failed.as_str()], |row| {
                <(String, String, String, String)>::try_from(row)
            })?;
            let mut keys = Vec::new();
            for row in rows {
                let (kind, scope, name, reason) = row?;
                if reasons.contains(&reason.as_str()) {
                    keys.push(key_from_row(&kind, scope, name)?);
                }
            }
            Ok(keys)
        })
    }
}
