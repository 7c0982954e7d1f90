//! Maintenance mode: the deployments whose ingress routes answer 503 with a maintenance page
//! (`voodu-agent maintenance on|off`) while their replicas keep running. One row per
//! deployment (scope, name): the message, the `Retry-After` seconds, since when and who.
//!
//! Invariants: a change is one transaction with its activity row (`maintenance.on`,
//! `maintenance.off`; told to the notification sinks) and a bump of
//! `meta.maintenance_version`, which `Store::notice_external_writes` compares so the running
//! agent's router sees another process's change (`subscribe_maintenance`); the message is
//! kept to [`MAX_MESSAGE_BYTES`] and the retry-after to [`MAX_RETRY_AFTER_SECS`], whatever
//! the caller passed. It is store state only: the router recomputes the same proxy config
//! from it after a restart, and no container is touched.

use rusqlite::{OptionalExtension as _, params};
use serde::Serialize;

use super::activity::{self, Entry};
use super::{ActivityOutcome, Result, Store, now_unix};
use crate::model::text::cut;

/// Longest message kept, in bytes.
pub(crate) const MAX_MESSAGE_BYTES: usize = 1024;
/// The page's message when none is given.
pub(crate) const DEFAULT_MESSAGE: &str = "This service is down for maintenance.";
/// `Retry-After` when none is given: five minutes.
const DEFAULT_RETRY_AFTER_SECS: u64 = 300;
/// Longest `Retry-After` kept: a day.
pub(crate) const MAX_RETRY_AFTER_SECS: u64 = 24 * 3600;
/// The `meta` key bumped by every change.
pub(super) const VERSION_KEY: &str = "maintenance_version";

/// One deployment in maintenance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Maintenance {
    pub scope: String,
    /// The deployment's name.
    pub name: String,
    pub message: String,
    /// Seconds the page's `Retry-After` header says.
    pub retry_after: u64,
    /// Unix seconds.
    pub since: i64,
    /// Where the request came from (`cli`).
    pub origin: String,
    /// Who asked, where known.
    pub actor: Option<String>,
}

/// The stored version counter (0 before any change).
pub(super) fn version(connection: &rusqlite::Connection) -> rusqlite::Result<i64> {
    let value = connection
        .query_row(
            "SELECT value FROM meta WHERE key = ?1",
            params![VERSION_KEY],
            |row| row.get::<_, String>(0),
        )
        .optional()?;
    Ok(parse_version(value.as_deref()))
}

/// The version counter as stored in `meta` (`None`: never changed, 0).
pub(super) fn parse_version(value: Option<&str>) -> i64 {
    value.and_then(|value| value.parse().ok()).unwrap_or(0)
}

fn bump(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<i64> {
    let next = version(tx)?.saturating_add(1);
    tx.execute(
        "INSERT INTO meta (key, value) VALUES (?1, ?2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        params![VERSION_KEY, next.to_string()],
    )?;
    Ok(next)
}

impl Store {
    /// Puts deployment `scope/name` in maintenance (or changes its message and retry-after),
    /// recorded in the activity log as this handle's `who`. Returns the stored row.
    pub fn maintenance_on(
        &self,
        scope: &str,
        name: &str,
        message: &str,
        retry_after: u64,
    ) -> Result<Maintenance> {
        let row = Maintenance {
            scope: scope.to_owned(),
            name: name.to_owned(),
            message: cut(message, MAX_MESSAGE_BYTES).to_owned(),
            retry_after: retry_after.clamp(1, MAX_RETRY_AFTER_SECS),
            since: now_unix(),
            origin: self.who.origin.as_str().to_owned(),
            actor: self.who.actor.clone(),
        };
        let who = self.who.clone();
        let version = self.with(|connection| {
            let tx = connection.transaction()?;
            tx.execute(
                "INSERT INTO maintenance (scope, name, message, retry_after, since, origin, actor)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (scope, name) DO UPDATE SET message = excluded.message,
                   retry_after = excluded.retry_after, since = excluded.since,
                   origin = excluded.origin, actor = excluded.actor",
                params![
                    row.scope,
                    row.name,
                    row.message,
                    i64::try_from(row.retry_after).unwrap_or(i64::MAX),
                    row.since,
                    row.origin,
                    row.actor.as_deref().unwrap_or_default()
                ],
            )?;
            let resource = format!("deployment/{scope}/{name}");
            let mut entry = Entry::new("maintenance.on", &who, ActivityOutcome::Succeeded);
            entry.resource = Some(&resource);
            entry.message = &row.message;
            entry.data = serde_json::json!({ "retry_after": row.retry_after });
            activity::record(&tx, &entry)?;
            let version = bump(&tx)?;
            tx.commit()?;
            Ok(version)
        })?;
        self.announce_maintenance(version);
        Ok(row)
    }

    /// Takes deployment `scope/name` out of maintenance; `false` when it was not in it
    /// (nothing is recorded then).
    pub fn maintenance_off(&self, scope: &str, name: &str) -> Result<bool> {
        let who = self.who.clone();
        let version = self.with(|connection| {
            let tx = connection.transaction()?;
            let removed = tx.execute(
                "DELETE FROM maintenance WHERE scope = ?1 AND name = ?2",
                params![scope, name],
            )?;
            if removed == 0 {
                return Ok(None);
            }
            let resource = format!("deployment/{scope}/{name}");
            let mut entry = Entry::new("maintenance.off", &who, ActivityOutcome::Succeeded);
            entry.resource = Some(&resource);
            entry.message = "traffic is routed to the replicas again";
            activity::record(&tx, &entry)?;
            let version = bump(&tx)?;
            tx.commit()?;
            Ok(Some(version))
        })?;
        if let Some(version) = version {
            self.announce_maintenance(version);
        }
        Ok(version.is_some())
    }

    /// Every deployment in maintenance, by scope and name.
    pub fn maintenance_all(&self) -> Result<Vec<Maintenance>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(
                "SELECT scope, name, message, retry_after, since, origin, actor
                 FROM maintenance ORDER BY scope, name",
            )?;
            let rows = statement
                .query_map([], |row| {
                    let actor: String = row.get(6)?;
                    Ok(Maintenance {
                        scope: row.get(0)?,
                        name: row.get(1)?,
                        message: row.get(2)?,
                        retry_after: u64::try_from(row.get::<_, i64>(3)?)
                            .unwrap_or(DEFAULT_RETRY_AFTER_SECS),
                        since: row.get(4)?,
                        origin: row.get(5)?,
                        actor: (!actor.is_empty()).then_some(actor),
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
    }

    /// Receives the maintenance version after each change this process makes or notices
    /// (`notice_external_writes`): the router rebuilds its routes then.
    pub(crate) fn subscribe_maintenance(&self) -> tokio::sync::watch::Receiver<i64> {
        self.shared.maintenance.subscribe()
    }

    /// Tells subscribers of a version newer than the last they saw.
    pub(super) fn announce_maintenance(&self, version: i64) {
        let newer = self.shared.maintenance.send_if_modified(|current| {
            let newer = version > *current;
            if newer {
                *current = version;
            }
            newer
        });
        if newer {
            self.mark_changed();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Origin, Who};

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    #[test]
    fn on_and_off_are_recorded_bounded_and_noticed_by_the_agents_handle() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("state.db");
        let agent = Store::open(&path)?;
        let mut seen = agent.subscribe_maintenance();
        seen.borrow_and_update();
        // The command opens its own handle, as another process does.
        let command = Store::open(&path)?.acting_as(Who::new(Origin::Cli, Some("ops")));
        let long = "é".repeat(MAX_MESSAGE_BYTES);
        let row = command.maintenance_on("shop", "web", &long, 10 * MAX_RETRY_AFTER_SECS)?;
        assert!(row.message.len() <= MAX_MESSAGE_BYTES && row.message.len() > 1000);
        assert_eq!(row.retry_after, MAX_RETRY_AFTER_SECS);
        assert_eq!(
            (row.origin.as_str(), row.actor.as_deref()),
            ("cli", Some("ops"))
        );
        assert!(
            !seen.has_changed()?,
            "another handle's change is not announced here"
        );
        agent.notice_external_writes()?;
        assert!(seen.has_changed()?);
        seen.borrow_and_update();
        agent.notice_external_writes()?;
        assert!(!seen.has_changed()?, "nothing new, no wake-up");
        assert_eq!(agent.maintenance_all()?, [row]);

        assert!(command.maintenance_off("shop", "web")?);
        assert!(!command.maintenance_off("shop", "web")?, "already off");
        agent.notice_external_writes()?;
        assert!(seen.has_changed()?);
        assert!(agent.maintenance_all()?.is_empty());
        let (rows, _) = agent.activity(0, 10)?;
        let actions: Vec<&str> = rows.iter().map(|row| row.action.as_str()).collect();
        assert_eq!(actions, ["maintenance.on", "maintenance.off"]);
        assert_eq!(rows[0].resource.as_deref(), Some("deployment/shop/web"));
        // Both are told to the notification sinks.
        let events: Vec<String> = agent
            .events_after(0, 10)?
            .into_iter()
            .map(|event| event.event)
            .collect();
        assert_eq!(events, ["maintenance.on", "maintenance.off"]);
        Ok(())
    }
}
