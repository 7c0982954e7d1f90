//! The outbox: events people are told about (`--notify`), and how far each sink got.
//!
//! An event is written in the transaction of the change it reports (`put`, called by
//! `activity::record` for commits, holds and rollouts, and by `record_health` for a fetch or
//! an engine failing past its threshold and coming back), so a crash keeps both or neither
//! and a sink that was down reads what it missed. Drift repairs are recorded on their own
//! (`record_event`): the repair is engine work, not a store change.
//!
//! Every event's data carries its `source`: the repository (`--sources` name) whose commit or
//! resource it is about (`""` for the single `--repo` source and for host-wide events), so a
//! receiver of several agents' or sources' events can tell them apart.
//!
//! A sink's delivery records which events its requests told (`deliveries`: event id, sink),
//! for a resource's timeline ("sent to"); those rows go when their event leaves the outbox.
//!
//! Invariants: event names are [`EVENTS`]; messages and data are bounded like the activity
//! log's; the table keeps at most [`MAX_EVENTS`] rows and [`RETENTION_SECS`] of them (an
//! event pruned before a sink read it is counted as dropped for that sink when it sees the
//! gap); a sink's `done_id` only moves forward.

use rusqlite::{OptionalExtension, Transaction, params};
use serde::Serialize;

use super::{Result, Store, now_unix};
use crate::model::CommitSha;
use crate::model::text::cut;

/// Every event the agent emits, with its stable name.
pub const EVENTS: &[&str] = &[
    "commit.applied",
    "commit.rejected",
    "commit.held",
    "rollout.started",
    "rollout.succeeded",
    "rollout.failed",
    "rollout.rolled_back",
    "rollout.superseded",
    "commit.superseded",
    "drift.repaired",
    "probe.failing",
    "probe.recovered",
    "fetch.failing",
    "fetch.recovered",
    "engine.unreachable",
    "engine.back",
    "signature.refused",
    "image.unverified",
    "image.tag_moved",
    "image.pulled",
    "notify.test",
    "backup.failed",
    "backup.verify_failed",
    "backup.restored",
    "backup.restore_failed",
    "maintenance.on",
    "maintenance.off",
    "rollout.paused",
    "rollout.promoted",
    "rollout.aborted",
];

/// Most events kept.
pub(super) const MAX_EVENTS: i64 = 10_000;
/// [`MAX_EVENTS`] as a count of items.
const MAX_EVENTS_USIZE: usize = 10_000;
/// How long events are kept: a week.
pub(super) const RETENTION_SECS: i64 = 7 * 24 * 3600;
/// Longest message kept, in bytes.
const MAX_MESSAGE_BYTES: usize = 2048;
/// Most bytes of data kept per event.
const MAX_DATA_BYTES: usize = 16 * 1024;

/// One event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    pub id: i64,
    /// Unix seconds.
    pub at: i64,
    pub event: String,
    /// The scope of the resource, when the event is about one.
    pub scope: String,
    /// `kind/scope/name`, when the event is about one resource.
    pub resource: String,
    pub commit: String,
    pub message: String,
    pub data: serde_json::Value,
}

/// What a sink has done so far.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SinkState {
    pub name: String,
    /// The last event id it is done with.
    pub done_id: i64,
    pub last_success: Option<i64>,
    pub last_error: String,
    pub last_error_at: Option<i64>,
    pub delivered: i64,
    pub dropped: i64,
    /// Events after `done_id` (some may not be for this sink: it has not looked yet).
    pub backlog: i64,
}

/// An event to append.
pub(super) struct NewEvent<'a> {
    pub(super) event: &'a str,
    pub(super) resource: &'a str,
    pub(super) commit: Option<&'a CommitSha>,
    pub(super) message: &'a str,
    pub(super) data: serde_json::Value,
    /// The source the event is about; `""`: the one that applied `resource`, if any.
    pub(super) source: &'a str,
}

/// Appends `event` in `tx` and prunes past the bounds.
pub(super) fn put(tx: &Transaction<'_>, event: &NewEvent<'_>) -> rusqlite::Result<()> {
    let now = now_unix();
    let mut data = if event.data.is_null() {
        "{}".to_owned()
    } else {
        event.data.to_string()
    };
    if data.len() > MAX_DATA_BYTES {
        data = serde_json::json!({ "truncated": true, "bytes": data.len() }).to_string();
    }
    let source = if event.source.is_empty() && !event.resource.is_empty() {
        tx.query_row(
            "SELECT source FROM desired WHERE kind || '/' || scope || '/' || name = ?1",
            params![event.resource],
            |row| row.get::<_, String>(0),
        )
        .optional()?
        .unwrap_or_default()
    } else {
        event.source.to_owned()
    };
    let data = match serde_json::from_str::<serde_json::Value>(&data) {
        Ok(serde_json::Value::Object(mut object)) => {
            object.insert("source".to_owned(), serde_json::Value::String(source));
            serde_json::Value::Object(object).to_string()
        }
        _ => serde_json::json!({ "source": source, "value": data }).to_string(),
    };
    // `kind/scope/name`: the scope is the middle part.
    let scope = event.resource.split('/').nth(1).unwrap_or_default();
    tx.execute(
        "INSERT INTO outbox (at, event, scope, resource, commit_sha, message, data)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            now,
            event.event,
            scope,
            event.resource,
            event.commit.map(CommitSha::as_str).unwrap_or_default(),
            cut(event.message, MAX_MESSAGE_BYTES),
            data
        ],
    )?;
    let id = tx.last_insert_rowid();
    tx.execute(
        "DELETE FROM outbox WHERE at < ?1 OR id <= ?2",
        params![now - RETENTION_SECS, id - MAX_EVENTS],
    )?;
    Ok(())
}

/// Most earlier commits looked at when a commit is applied ([`supersede_unfinished`]).
const OPEN_COMMITS_LOOKED_AT: usize = 20;

/// When commit `sha` of `source` is applied, changing or deleting `touched`: each earlier
/// commit of the source still waiting for a rollout that now never comes (a workload it
/// changed that `sha` changes too, with no release of its own yet) gets a
/// `commit.superseded` event, so its commit status ends (`error`) instead of staying
/// `pending`. A commit with a release in flight hears of it by `rollout.superseded`; one
/// whose every release ended, or that was already told, is left alone.
pub(super) fn supersede_unfinished(
    tx: &Transaction<'_>,
    source: &str,
    sha: &CommitSha,
    touched: &[String],
) -> rusqlite::Result<()> {
    let earlier: Vec<(String, String)> = {
        let mut statement = tx.prepare_cached(
            "SELECT commit_sha, data FROM outbox
             WHERE event = 'commit.applied' AND commit_sha <> ?1 AND commit_sha <> ''
             ORDER BY id DESC LIMIT ?2",
        )?;
        let rows = statement.query_map(
            params![
                sha.as_str(),
                i64::try_from(OPEN_COMMITS_LOOKED_AT * 4).unwrap_or(i64::MAX)
            ],
            |row| <(String, String)>::try_from(row),
        )?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    let mut seen = std::collections::HashSet::new();
    for (commit, data) in earlier {
        if !seen.insert(commit.clone()) || seen.len() > OPEN_COMMITS_LOOKED_AT {
            continue;
        }
        let data: serde_json::Value = serde_json::from_str(&data).unwrap_or_default();
        if data["source"].as_str().unwrap_or_default() != source {
            continue;
        }
        let ended: bool = tx.query_row(
            "SELECT EXISTS (SELECT 1 FROM outbox WHERE commit_sha = ?1 AND event IN
               ('commit.superseded', 'rollout.superseded', 'rollout.failed', 'commit.rejected'))",
            params![commit],
            |row| row.get(0),
        )?;
        if ended {
            continue;
        }
        let never_rolled = data["changed"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(serde_json::Value::as_str)
            .filter(|key| key.starts_with("deployment/") || key.starts_with("statefulset/"))
            .filter(|key| touched.iter().any(|touched| touched == key))
            .map(|key| {
                tx.query_row(
                    "SELECT NOT EXISTS (SELECT 1 FROM releases
                       WHERE kind || '/' || scope || '/' || name = ?1 AND commit_sha = ?2)",
                    params![key, commit],
                    |row| row.get::<_, bool>(0),
                )
            })
            .collect::<rusqlite::Result<Vec<bool>>>()?
            .into_iter()
            .any(|never| never);
        if !never_rolled {
            continue;
        }
        let commit = CommitSha::new(commit);
        put_superseded(tx, source, &commit, sha, "before its rollout started")?;
    }
    Ok(())
}

/// A `commit.superseded` event: `commit` of `source` will never end, `by` replaced it.
pub(super) fn put_superseded(
    tx: &Transaction<'_>,
    source: &str,
    commit: &CommitSha,
    by: &CommitSha,
    when: &str,
) -> rusqlite::Result<()> {
    put(
        tx,
        &NewEvent {
            event: "commit.superseded",
            resource: "",
            commit: Some(commit),
            message: &format!(
                "commit {} superseded by commit {} {when}",
                commit.short(),
                by.short()
            ),
            data: serde_json::json!({ "superseded_by": by.as_str() }),
            source,
        },
    )
}

impl Store {
    /// Appends an event that reports no store change of its own (a drift repair, a test).
    pub(crate) fn record_event(
        &self,
        event: &str,
        resource: &str,
        message: &str,
        data: serde_json::Value,
    ) -> Result<()> {
        let result = self.with(|connection| {
            let tx = connection.transaction()?;
            put(
                &tx,
                &NewEvent {
                    event,
                    resource,
                    commit: None,
                    message,
                    data,
                    source: "",
                },
            )?;
            tx.commit()?;
            Ok(())
        });
        self.mark_changed();
        result
    }

    /// Up to `limit` events after id `after`, oldest first.
    pub fn events_after(&self, after: i64, limit: usize) -> Result<Vec<Event>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(
                "SELECT id, at, event, scope, resource, commit_sha, message, data FROM outbox
                 WHERE id > ?1 ORDER BY id LIMIT ?2",
            )?;
            let rows = statement.query_map(
                params![after, i64::try_from(limit).unwrap_or(i64::MAX)],
                event_row,
            )?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    /// The newest `limit` events about `resource` named in `names`, newest first (of its
    /// newest 500 events).
    pub fn events_of(&self, resource: &str, names: &[&str], limit: usize) -> Result<Vec<Event>> {
        let events = self.with(|connection| {
            let mut statement = connection.prepare_cached(
                "SELECT id, at, event, scope, resource, commit_sha, message, data FROM outbox
                 WHERE resource = ?1 ORDER BY id DESC LIMIT 500",
            )?;
            let rows = statement.query_map(params![resource], event_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })?;
        Ok(events
            .into_iter()
            .filter(|event| names.contains(&event.event.as_str()))
            .take(limit)
            .collect())
    }

    /// The newest `limit` events about `resource` some sink delivered, newest first, each
    /// with the sinks that did (by name).
    pub fn sent_of(&self, resource: &str, limit: usize) -> Result<Vec<(Event, Vec<String>)>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(
                "SELECT o.id, o.at, o.event, o.scope, o.resource, o.commit_sha, o.message, o.data,
                   group_concat(d.sink, char(10))
                 FROM outbox o JOIN deliveries d ON d.event_id = o.id
                 WHERE o.resource = ?1 GROUP BY o.id ORDER BY o.id DESC LIMIT ?2",
            )?;
            let rows = statement.query_map(
                params![resource, i64::try_from(limit).unwrap_or(i64::MAX)],
                |row| {
                    let sinks: String = row.get(8)?;
                    let mut sinks: Vec<String> = sinks.split('\n').map(str::to_owned).collect();
                    sinks.sort_unstable();
                    Ok((event_row(row)?, sinks))
                },
            )?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    /// The newest event id (0 when there is none).
    pub(crate) fn outbox_head(&self) -> Result<i64> {
        self.with(|connection| {
            Ok(
                connection.query_row("SELECT coalesce(max(id), 0) FROM outbox", [], |row| {
                    row.get(0)
                })?,
            )
        })
    }

    /// The sink `name`'s state; a sink seen for the first time starts at `start` (events
    /// from before it existed are not sent).
    pub(crate) fn sink_state(&self, name: &str, start: i64) -> Result<SinkState> {
        self.with(|connection| {
            connection.execute(
                "INSERT INTO sinks (name, done_id) VALUES (?1, ?2) ON CONFLICT (name) DO NOTHING",
                params![name, start],
            )?;
            Ok(connection.query_row(
                "SELECT name, done_id, last_success, last_error, last_error_at, delivered, dropped,
                   (SELECT count(*) FROM outbox WHERE id > sinks.done_id)
                 FROM sinks WHERE name = ?1",
                params![name],
                sink_row,
            )?)
        })
    }

    /// Forgets the sinks not named in `names` (removed from the notify file): `status` shows
    /// the sinks the agent runs.
    pub(crate) fn keep_sinks(&self, names: &[String]) -> Result<()> {
        self.with(|connection| {
            let tx = connection.transaction()?;
            let known: Vec<String> = {
                let mut statement = tx.prepare("SELECT name FROM sinks")?;
                let rows = statement.query_map([], |row| row.get(0))?;
                rows.collect::<rusqlite::Result<Vec<String>>>()?
            };
            for name in known.iter().filter(|name| !names.contains(name)) {
                tx.execute("DELETE FROM sinks WHERE name = ?1", params![name])?;
            }
            tx.commit()?;
            Ok(())
        })
    }

    /// Every sink's state, by name.
    pub fn sink_states(&self) -> Result<Vec<SinkState>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(
                "SELECT name, done_id, last_success, last_error, last_error_at, delivered, dropped,
                   (SELECT count(*) FROM outbox WHERE id > sinks.done_id)
                 FROM sinks ORDER BY name",
            )?;
            let rows = statement.query_map([], sink_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    /// Sink `name` is done with every event up to `done_id`: `delivered` of them were sent
    /// (now, `at`), `dropped` expired unsent; `sent` are the ids of the events its requests
    /// told (the timeline's "sent to"), kept while the outbox keeps them.
    pub(crate) fn sink_done(
        &self,
        name: &str,
        done_id: i64,
        (delivered, dropped): (i64, i64),
        at: i64,
        sent: &[i64],
    ) -> Result<()> {
        let result = self.with(|connection| {
            let tx = connection.transaction()?;
            tx.execute(
                "UPDATE sinks SET done_id = max(done_id, ?2), delivered = delivered + ?3,
                   dropped = dropped + ?4,
                   last_success = CASE WHEN ?3 > 0 THEN ?5 ELSE last_success END
                 WHERE name = ?1",
                params![name, done_id, delivered, dropped, at],
            )?;
            for id in sent.iter().take(MAX_EVENTS_USIZE) {
                tx.execute(
                    "INSERT OR IGNORE INTO deliveries (event_id, sink, at) VALUES (?1, ?2, ?3)",
                    params![id, name, at],
                )?;
            }
            tx.execute(
                "DELETE FROM deliveries WHERE event_id < (SELECT coalesce(min(id), 0) FROM outbox)",
                [],
            )?;
            tx.commit()?;
            Ok(())
        });
        self.mark_changed();
        result
    }

    /// Sink `name` failed to deliver (now, `at`); `error` never carries a secret.
    pub(crate) fn sink_failed(&self, name: &str, error: &str, at: i64) -> Result<()> {
        let result = self.with(|connection| {
            connection.execute(
                "UPDATE sinks SET last_error = ?2, last_error_at = ?3 WHERE name = ?1",
                params![name, cut(error, MAX_MESSAGE_BYTES), at],
            )?;
            Ok(())
        });
        self.mark_changed();
        result
    }

    /// The phases of the releases commit `sha` opened, by resource.
    pub(crate) fn release_phases_of_commit(&self, sha: &str) -> Result<Vec<(String, String)>> {
        self.with(|connection| {
            let mut statement = connection.prepare_cached(
                "SELECT kind || '/' || scope || '/' || name, phase FROM releases
                 WHERE commit_sha = ?1 AND rolled_back_from IS NULL ORDER BY id",
            )?;
            let rows = statement.query_map(params![sha], |row| Ok((row.get(0)?, row.get(1)?)))?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    /// The data of the `commit.applied` event of `sha`, if one is still kept.
    pub(crate) fn applied_data(&self, sha: &str) -> Result<Option<serde_json::Value>> {
        self.with(|connection| {
            let data: Option<String> = connection
                .query_row(
                    "SELECT data FROM outbox WHERE event = 'commit.applied' AND commit_sha = ?1
                     ORDER BY id DESC LIMIT 1",
                    params![sha],
                    |row| row.get(0),
                )
                .optional()?;
            Ok(data.and_then(|data| serde_json::from_str(&data).ok()))
        })
    }
}

/// One `outbox` row, selected as [`Store::events_after`] does.
fn event_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Event> {
    let data: String = row.get(7)?;
    Ok(Event {
        id: row.get(0)?,
        at: row.get(1)?,
        event: row.get(2)?,
        scope: row.get(3)?,
        resource: row.get(4)?,
        commit: row.get(5)?,
        message: row.get(6)?,
        data: serde_json::from_str(&data).unwrap_or(serde_json::Value::Null),
    })
}

fn sink_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<SinkState> {
    Ok(SinkState {
        name: row.get(0)?,
        done_id: row.get(1)?,
        last_success: row.get(2)?,
        last_error: row.get(3)?,
        last_error_at: row.get(4)?,
        delivered: row.get(5)?,
        dropped: row.get(6)?,
        backlog: row.get(7)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sinks start where they are told to, move only forward, and those no longer
    /// configured are forgotten.
    #[test]
    fn sinks_keep_their_position_and_removed_ones_are_forgotten()
    -> std::result::Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Store::open(&dir.path().join("state.db"))?;
        for n in 0..3 {
            store.record_event(
                "drift.repaired",
                &format!("deployment/shop/w{n}"),
                "",
                serde_json::Value::Null,
            )?;
        }
        let head = store.outbox_head()?;
        assert_eq!(
            store.sink_state("chat", head)?.backlog,
            0,
            "a new sink starts at the head"
        );
        assert_eq!(store.sink_state("ci", 0)?.backlog, 3);
        store.sink_done("ci", 2, (2, 0), 100, &[1, 2])?;
        store.sink_done("ci", 1, (0, 0), 101, &[])?;
        store.sink_done("chat", head, (1, 0), 102, &[1])?;
        // Which sinks told each event (the timeline's "sent to").
        let sent = store.sent_of("deployment/shop/w0", 10)?;
        assert_eq!(sent.len(), 1);
        assert_eq!(
            (sent[0].0.id, sent[0].1.as_slice()),
            (1, &["chat".to_owned(), "ci".to_owned()][..])
        );
        assert_eq!(store.sent_of("deployment/shop/w1", 10)?[0].1, ["ci"]);
        assert!(store.sent_of("deployment/shop/w2", 10)?.is_empty());
        let ci = store.sink_state("ci", 0)?;
        assert_eq!(
            (ci.done_id, ci.delivered, ci.backlog, ci.last_success),
            (2, 2, 1, Some(100))
        );
        assert_eq!(store.events_after(2, 10)?[0].scope, "shop");
        store.keep_sinks(&["ci".to_owned()])?;
        let names: Vec<String> = store
            .sink_states()?
            .into_iter()
            .map(|sink| sink.name)
            .collect();
        assert_eq!(names, ["ci"]);
        Ok(())
    }
}
