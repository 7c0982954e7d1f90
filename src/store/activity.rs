//! The activity log: every change the agent made or was asked to make (a commit applied or
//! rejected, a trigger held or approved, a rollout, an automatic or operator rollback, a pin
//! or unpin, a config change), with when, what, where the request came from (`Origin`), who
//! where known, the commit, the resource and how it ended.
//!
//! Stored in state.db rather than in daily NDJSON files as voodu does: each row is written in
//! the transaction of the change it records, so an applied commit and its row cannot
//! disagree (a crash keeps both or neither); it is read by time through an index; it lives and
//! is backed up with the state it describes.
//!
//! Invariants: a config change records the key and a short keyed digest of the value
//! (HMAC-SHA256 with the agent's own key, the first 6 bytes in hex), never the value; an actor
//! is untrusted text (a webhook's pusher): control characters are dropped and it is cut to
//! [`MAX_ACTOR_CHARS`]; messages and data are bounded; rows older than [`RETENTION_SECS`] and
//! beyond [`MAX_ROWS`] are pruned by the insert that passes the bound, so the table stays
//! bounded whatever the rate.

use std::fmt;

use hmac::Mac;
use rusqlite::params;
use serde::Serialize;

use super::{ReleasePhase, Result, Store, now_unix};
use crate::model::CommitSha;
use crate::model::text::cut;

/// How long rows are kept: 30 days, as voodu's log.
pub const RETENTION_SECS: i64 = 30 * 24 * 3600;
/// Most rows kept, whatever their age.
pub const MAX_ROWS: i64 = 100_000;
/// Longest actor kept, in characters.
pub(super) const MAX_ACTOR_CHARS: usize = 64;
/// Longest message kept, in bytes.
const MAX_MESSAGE_BYTES: usize = 1024;
/// Most bytes of structured data kept per row.
const MAX_DATA_BYTES: usize = 16 * 1024;

/// Where a change, or the request for it, came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The agent's periodic poll saw a new commit.
    Poll,
    /// A git host's push webhook.
    Webhook,
    /// A change of the local repository's refs on disk.
    RefWatch,
    /// A `voodu-agent` command on this host (`config`, `rollback`, `approve`, `sync`, …).
    Cli,
    /// Another HTTP client of the webhook endpoint (a CI script's generic signed request).
    Http,
    /// The agent on its own: a rollout, an automatic rollback, a generated secret.
    Agent,
}

impl Origin {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Origin::Poll => "poll",
            Origin::Webhook => "webhook",
            Origin::RefWatch => "ref-watch",
            Origin::Cli => "cli",
            Origin::Http => "http",
            Origin::Agent => "agent",
        }
    }
}

/// How a logged change ended, stored in the `outcome` column and shown as [`Self::as_str`]
/// (`activity`, `GET /activity`, the dashboard). The texts are the ones rows have always been
/// written with, so rows of an older state.db read back as the same variant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActivityOutcome {
    Succeeded,
    Failed,
    /// A trigger held a commit.
    Held,
    /// An approval was asked for.
    Requested,
    /// A rollout started.
    Started,
    Superseded,
    /// A rollout that touched replicas failed and its release was halted.
    Halted,
    /// A release phase ([`ReleasePhase::Progressing`]) recorded as a rollout's end.
    Progressing,
    /// A release phase ([`ReleasePhase::RolledBack`]) recorded as a rollout's end.
    RolledBack,
    /// A text this build does not write (a row of another version of the agent): kept as read
    /// and shown as it is.
    Unknown(String),
}

impl ActivityOutcome {
    /// The stored and shown text.
    pub fn as_str(&self) -> &str {
        match self {
            ActivityOutcome::Succeeded => "succeeded",
            ActivityOutcome::Failed => "failed",
            ActivityOutcome::Held => "held",
            ActivityOutcome::Requested => "requested",
            ActivityOutcome::Started => "started",
            ActivityOutcome::Superseded => "superseded",
            ActivityOutcome::Halted => "halted",
            ActivityOutcome::Progressing => "progressing",
            ActivityOutcome::RolledBack => "rolled-back",
            ActivityOutcome::Unknown(text) => text,
        }
    }

    /// The outcome `text` stands for; a text no variant writes is [`ActivityOutcome::Unknown`].
    pub(crate) fn parse(text: &str) -> ActivityOutcome {
        match text {
            "succeeded" => ActivityOutcome::Succeeded,
            "failed" => ActivityOutcome::Failed,
            "held" => ActivityOutcome::Held,
            "requested" => ActivityOutcome::Requested,
            "started" => ActivityOutcome::Started,
            "superseded" => ActivityOutcome::Superseded,
            "halted" => ActivityOutcome::Halted,
            "progressing" => ActivityOutcome::Progressing,
            "rolled-back" => ActivityOutcome::RolledBack,
            other => ActivityOutcome::Unknown(other.to_owned()),
        }
    }
}

impl From<ReleasePhase> for ActivityOutcome {
    fn from(phase: ReleasePhase) -> ActivityOutcome {
        match phase {
            ReleasePhase::Progressing => ActivityOutcome::Progressing,
            ReleasePhase::Succeeded => ActivityOutcome::Succeeded,
            ReleasePhase::Failed => ActivityOutcome::Failed,
            ReleasePhase::RolledBack => ActivityOutcome::RolledBack,
            ReleasePhase::Superseded => ActivityOutcome::Superseded,
        }
    }
}

impl fmt::Display for ActivityOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ActivityOutcome {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// Who asks for the changes a store call records: the origin and, where known, the actor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Who {
    pub(crate) origin: Origin,
    pub(crate) actor: Option<String>,
}

impl Who {
    /// The agent acting on its own.
    pub(crate) const AGENT: Who = Who {
        origin: Origin::Agent,
        actor: None,
    };

    /// `origin` with `actor` made safe to keep and show: control characters dropped, cut to
    /// [`MAX_ACTOR_CHARS`], empty as none.
    pub fn new(origin: Origin, actor: Option<&str>) -> Who {
        let actor = actor
            .map(|actor| {
                actor
                    .chars()
                    .filter(|c| !c.is_control())
                    .take(MAX_ACTOR_CHARS)
                    .collect::<String>()
                    .trim()
                    .to_owned()
            })
            .filter(|actor| !actor.is_empty());
        Who { origin, actor }
    }
}

/// One row of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Activity {
    pub(crate) id: i64,
    /// Unix seconds.
    pub(crate) at: i64,
    /// `commit.apply`, `commit.reject`, `trigger.hold`, `approve`, `rollout`, `rollback`,
    /// `rollback.auto`, `pin`, `unpin`, `config.set`, `config.unset`.
    pub action: String,
    pub origin: String,
    pub actor: Option<String>,
    pub commit: Option<CommitSha>,
    /// `kind/scope/name`, `config/scope[/name]` or `trigger/NAME`.
    pub resource: Option<String>,
    pub outcome: ActivityOutcome,
    pub(crate) message: String,
    /// Structured detail (changed resources, config keys and digests, trigger verdicts).
    pub data: serde_json::Value,
    /// The source (repository) the row is about: the one whose commit it is, or the one that
    /// applied its resource; `""` for the single `--repo` source and for host-wide rows.
    pub source: String,
}

/// A row to append.
pub(super) struct Entry<'a> {
    pub(super) action: &'a str,
    pub(super) who: &'a Who,
    pub(super) commit: Option<&'a CommitSha>,
    pub(super) resource: Option<&'a str>,
    pub(super) outcome: ActivityOutcome,
    pub(super) message: &'a str,
    pub(super) data: serde_json::Value,
    /// `""`: the source that applied `resource`, if any.
    pub(super) source: &'a str,
}

impl<'a> Entry<'a> {
    pub(super) fn new(action: &'a str, who: &'a Who, outcome: ActivityOutcome) -> Entry<'a> {
        Entry {
            action,
            who,
            commit: None,
            resource: None,
            outcome,
            message: "",
            data: serde_json::Value::Null,
            source: "",
        }
    }
}

/// Appends `entry` in `tx`, pruning rows past the retention and count bounds.
pub(super) fn record(tx: &rusqlite::Transaction<'_>, entry: &Entry<'_>) -> rusqlite::Result<()> {
    let now = now_unix();
    let mut data = if entry.data.is_null() {
        "{}".to_owned()
    } else {
        entry.data.to_string()
    };
    if data.len() > MAX_DATA_BYTES {
        data = serde_json::json!({ "truncated": true, "bytes": data.len() }).to_string();
    }
    tx.execute(
        "INSERT INTO activity (at, action, origin, actor, commit_sha, resource, outcome, message, data, source)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, COALESCE(NULLIF(?10, ''),
           (SELECT source FROM desired WHERE ?6 <> '' AND kind || '/' || scope || '/' || name = ?6), ''))",
        params![
            now,
            entry.action,
            entry.who.origin.as_str(),
            entry.who.actor.as_deref().unwrap_or_default(),
            entry.commit.map(CommitSha::as_str).unwrap_or_default(),
            entry.resource.unwrap_or_default(),
            entry.outcome.as_str(),
            cut(entry.message, MAX_MESSAGE_BYTES),
            data,
            entry.source
        ],
    )?;
    let id = tx.last_insert_rowid();
    if let Some(event) = event_of(entry.action, &entry.outcome) {
        super::outbox::put(
            tx,
            &super::outbox::NewEvent {
                event,
                resource: entry.resource.unwrap_or_default(),
                commit: entry.commit,
                message: entry.message,
                data: entry.data.clone(),
                source: entry.source,
            },
        )?;
    }
    tx.execute(
        "DELETE FROM activity WHERE at < ?1 OR id <= ?2",
        params![now - RETENTION_SECS, id - MAX_ROWS],
    )?;
    Ok(())
}

/// The outbox event a logged change is told as (`outbox::EVENTS`), if people are told of it.
fn event_of(action: &str, outcome: &ActivityOutcome) -> Option<&'static str> {
    Some(match (action, outcome) {
        ("commit.apply", ActivityOutcome::Succeeded) => "commit.applied",
        ("commit.reject", _) => "commit.rejected",
        ("trigger.hold", _) => "commit.held",
        ("rollout", ActivityOutcome::Started) => "rollout.started",
        ("rollout", ActivityOutcome::Succeeded) => "rollout.succeeded",
        ("rollout", ActivityOutcome::Failed | ActivityOutcome::Halted) => "rollout.failed",
        ("rollback.auto", _) => "rollout.rolled_back",
        ("backup", ActivityOutcome::Failed) => "backup.failed",
        ("verify", ActivityOutcome::Failed) => "backup.verify_failed",
        ("restore", ActivityOutcome::Succeeded) => "backup.restored",
        ("restore", ActivityOutcome::Failed) => "backup.restore_failed",
        ("maintenance.on", _) => "maintenance.on",
        ("maintenance.off", _) => "maintenance.off",
        ("rollout.pause", _) => "rollout.paused",
        ("rollout.promote", _) => "rollout.promoted",
        ("rollout.abort", _) => "rollout.aborted",
        _ => return None,
    })
}

/// The short keyed digest a config change records instead of the value: the first 6 bytes
/// of HMAC-SHA256(agent key, value), in hex. It tells whether a value changed (or was set to
/// the same thing again) without being a dictionary-attackable hash of a short secret.
pub(super) fn config_digest(
    tx: &rusqlite::Transaction<'_>,
    value: &str,
) -> rusqlite::Result<String> {
    tx.execute(
        "INSERT OR IGNORE INTO meta (key, value) VALUES ('env_key', ?1)",
        params![crate::model::random_hex(32)],
    )?;
    let key: String = tx.query_row("SELECT value FROM meta WHERE key = 'env_key'", [], |row| {
        row.get(0)
    })?;
    let mut mac = crate::base::hmac_sha256(key.as_bytes());
    mac.update(b"voodu-agent activity config digest\0");
    mac.update(value.as_bytes());
    let bytes = mac.finalize().into_bytes();
    Ok(bytes[..6]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect())
}

impl Store {
    /// This handle, recording its changes (config, rollback, unpin, approve) as made by
    /// `who`. A handle the agent opens records them as the agent's own.
    #[must_use]
    pub fn acting_as(mut self, who: Who) -> Store {
        self.who = who;
        self
    }

    /// Rows at or after `since` (Unix seconds), oldest first: the newest `limit` of them,
    /// and whether older ones in the window were left out.
    pub fn activity(&self, since: i64, limit: usize) -> Result<(Vec<Activity>, bool)> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with(|connection| {
            let mut statement = connection.prepare(
                "SELECT id, at, action, origin, actor, commit_sha, resource, outcome, message, data, source
                 FROM activity WHERE at >= ?1 ORDER BY id DESC LIMIT ?2",
            )?;
            let rows = statement.query_map(params![since, limit.saturating_add(1)], activity_row)?;
            let mut entries = rows.collect::<rusqlite::Result<Vec<_>>>()?;
            let truncated = i64::try_from(entries.len()).unwrap_or(i64::MAX) > limit;
            entries.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
            entries.reverse();
            Ok((entries, truncated))
        })
    }
}

impl Store {
    /// The newest `limit` rows about `resource` (`kind/scope/name`), newest first: a
    /// resource's timeline (the dashboard's resource page).
    pub fn activity_of(&self, resource: &str, limit: usize) -> Result<Vec<Activity>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with(|connection| {
            let mut statement = connection.prepare(
                "SELECT id, at, action, origin, actor, commit_sha, resource, outcome, message, data, source
                 FROM activity WHERE resource = ?1 ORDER BY id DESC LIMIT ?2",
            )?;
            let rows = statement.query_map(params![resource, limit], activity_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }
}

/// One `activity` row, selected in the column order of [`Store::activity`].
fn activity_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Activity> {
    Ok(Activity {
        id: row.get(0)?,
        at: row.get(1)?,
        action: row.get(2)?,
        origin: row.get(3)?,
        actor: Some(row.get::<_, String>(4)?).filter(|text| !text.is_empty()),
        commit: Some(row.get::<_, String>(5)?)
            .filter(|text| !text.is_empty())
            .map(CommitSha::new),
        resource: Some(row.get::<_, String>(6)?).filter(|text| !text.is_empty()),
        outcome: ActivityOutcome::parse(&row.get::<_, String>(7)?),
        message: row.get(8)?,
        data: serde_json::from_str(&row.get::<_, String>(9)?).unwrap_or(serde_json::Value::Null),
        source: row.get(10)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actors_are_made_safe_text() {
        assert_eq!(
            Who::new(Origin::Webhook, Some("octocat")).actor.as_deref(),
            Some("octocat")
        );
        assert_eq!(
            Who::new(Origin::Webhook, Some("evil\u{1b}[31m\nname"))
                .actor
                .as_deref(),
            Some("evil[31mname")
        );
        assert_eq!(Who::new(Origin::Cli, Some(" \t ")).actor, None);
        let long = "x".repeat(500);
        assert_eq!(
            Who::new(Origin::Http, Some(&long))
                .actor
                .map(|actor| actor.len()),
            Some(MAX_ACTOR_CHARS)
        );
    }

    #[test]
    fn every_outcome_parses_back_from_its_text_and_a_release_phase_keeps_its_text() {
        let outcomes = [
            ActivityOutcome::Succeeded,
            ActivityOutcome::Failed,
            ActivityOutcome::Held,
            ActivityOutcome::Requested,
            ActivityOutcome::Started,
            ActivityOutcome::Superseded,
            ActivityOutcome::Halted,
            ActivityOutcome::Progressing,
            ActivityOutcome::RolledBack,
        ];
        for outcome in outcomes {
            assert_eq!(ActivityOutcome::parse(outcome.as_str()), outcome);
            assert_eq!(outcome.to_string(), outcome.as_str());
        }
        // A rollout's end was recorded as the phase's text: it still is.
        for phase in [
            ReleasePhase::Progressing,
            ReleasePhase::Succeeded,
            ReleasePhase::Failed,
            ReleasePhase::RolledBack,
            ReleasePhase::Superseded,
        ] {
            assert_eq!(ActivityOutcome::from(phase).as_str(), phase.as_str());
        }
        assert_eq!(
            ActivityOutcome::parse("").as_str(),
            "",
            "an empty text stays empty"
        );
    }

    #[test]
    fn messages_are_cut_at_a_character_boundary() {
        assert_eq!(cut("héllo", 2), "h");
        assert_eq!(cut("hello", 10), "hello");
    }
}
