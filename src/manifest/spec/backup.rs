//! `backup {}` inside a `statefulset` (an extension: voodu has no such block): where a
//! statefulset's data is backed up with restic, how, when, and how long snapshots are kept.
//!
//! Invariant: never part of the statefulset's spec hash (voodu's): adding, editing or
//! removing the block never replaces a pod. The decoder (`decode/kinds/backup.rs`) has
//! checked every field, so the accessors here only read them.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::common::is_false;
use crate::model::parse_go_duration;

/// `timeout` when the block leaves it out.
pub(crate) const DEFAULT_BACKUP_TIMEOUT: Duration = Duration::from_secs(3600);

/// The restic backends a `repository` may name by prefix (`sftp:host:/path`); a repository
/// with none of them is a local path.
pub(crate) const REPOSITORY_BACKENDS: &[&str] =
    &["sftp", "s3", "rest", "b2", "azure", "gs", "swift", "rclone"];

/// A statefulset's `backup {}` block, or a deployment's (for a named volume it mounts).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backup {
    /// The restic repository: an absolute local path, or `<backend>:…`.
    pub repository: String,
    /// The host file holding the repository's password.
    pub password_file: String,
    /// A cron schedule, as a cronjob's; empty: only on demand (and `before_release`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub schedule: String,
    /// The schedule's IANA time zone; empty: the host's.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub timezone: String,
    #[serde(default)]
    pub mode: BackupMode,
    /// `exec` mode: run in the pod, its stdout is the backup.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// `exec` mode: run in the pod, reads the backup on stdin.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restore_command: Vec<String>,
    /// Back up before a release replaces the pods.
    #[serde(default, skip_serializing_if = "is_false")]
    pub before_release: bool,
    /// `""`, `"daily"` or `"weekly"`: how often the repository is checked.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub verify: String,
    /// A Go duration of at most 24h; empty: one hour.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub timeout: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<Keep>,
    /// A deployment's: the named volume (one it mounts) that is backed up; a statefulset
    /// backs up its claims and leaves it empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub volume: String,
}

/// How a backup reads the data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackupMode {
    /// Stop the pods, back up their claims' volumes, start them again.
    #[default]
    Stop,
    /// Run `command` in the pod and back up its stdout.
    Exec,
    /// Back up the claims' volumes while the pods run.
    Live,
}

impl BackupMode {
    /// The name as written in a manifest.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            BackupMode::Stop => "stop",
            BackupMode::Exec => "exec",
            BackupMode::Live => "live",
        }
    }
}

/// `keep {}`: restic's `forget` policy; each 0..=1000, 0 meaning not set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Keep {
    #[serde(default)]
    pub last: u32,
    #[serde(default)]
    pub daily: u32,
    #[serde(default)]
    pub weekly: u32,
    #[serde(default)]
    pub monthly: u32,
}

impl Backup {
    /// The timeout as a Duration (default 1 h).
    pub fn deadline(&self) -> Duration {
        if self.timeout.is_empty() {
            return DEFAULT_BACKUP_TIMEOUT;
        }
        parse_go_duration(&self.timeout).unwrap_or(DEFAULT_BACKUP_TIMEOUT)
    }

    /// The verify period: None, Some(1 day), Some(7 days).
    pub fn verify_every(&self) -> Option<Duration> {
        const DAY: Duration = Duration::from_secs(24 * 3600);
        match self.verify.as_str() {
            "daily" => Some(DAY),
            "weekly" => Some(DAY * 7),
            _ => None,
        }
    }

    /// Whether `repository` is a local path (no backend prefix).
    pub fn is_local(&self) -> bool {
        backend_of(&self.repository).is_none()
    }
}

/// The backend a repository names by prefix (`s3` of `s3:host/bucket`), if any.
pub(crate) fn backend_of(repository: &str) -> Option<&'static str> {
    let (prefix, _) = repository.split_once(':')?;
    REPOSITORY_BACKENDS
        .iter()
        .copied()
        .find(|backend| *backend == prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accessors_read_the_fields_with_their_defaults() {
        let mut backup = Backup {
            repository: "/srv/backups/db".into(),
            ..Backup::default()
        };
        assert_eq!(backup.deadline(), Duration::from_secs(3600));
        assert_eq!(backup.verify_every(), None);
        assert!(backup.is_local());
        backup.timeout = "1h30m".into();
        backup.verify = "weekly".into();
        backup.repository = "s3:s3.amazonaws.com/bucket".into();
        assert_eq!(backup.deadline(), Duration::from_secs(5400));
        assert_eq!(
            backup.verify_every(),
            Some(Duration::from_secs(7 * 24 * 3600))
        );
        assert!(!backup.is_local());
        backup.verify = "daily".into();
        assert_eq!(backup.verify_every(), Some(Duration::from_secs(24 * 3600)));
        for local in ["/srv/a:b", "relative", "file:/x"] {
            backup.repository = local.into();
            assert!(backup.is_local(), "{local}");
        }
    }

    #[test]
    fn round_trips_through_json_with_lowercase_modes() -> Result<(), serde_json::Error> {
        let backup = Backup {
            repository: "sftp:user@host:/srv/restic".into(),
            password_file: "/etc/voodu/pass".into(),
            schedule: "0 3 * * *".into(),
            timezone: "Europe/Paris".into(),
            mode: BackupMode::Exec,
            command: vec!["pg_dump".into()],
            restore_command: vec!["pg_restore".into()],
            before_release: true,
            verify: "weekly".into(),
            timeout: "2h".into(),
            keep: Some(Keep {
                last: 7,
                daily: 7,
                weekly: 4,
                monthly: 6,
            }),
            volume: String::new(),
        };
        let json = serde_json::to_string(&backup)?;
        assert!(json.contains(r#""mode":"exec""#), "{json}");
        assert_eq!(serde_json::from_str::<Backup>(&json)?, backup);
        let least: Backup = serde_json::from_str(r#"{"repository":"/r","password_file":"/p"}"#)?;
        assert_eq!(least.mode, BackupMode::Stop);
        assert_eq!(
            serde_json::to_string(&least)?,
            r#"{"repository":"/r","password_file":"/p","mode":"stop"}"#
        );
        Ok(())
    }
}
