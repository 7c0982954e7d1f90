//! Health of what the agent depends on outside the repo's content: the remote it fetches
//! (`fetch`) and the container engine (`engine`). Each check records its outcome here, so
//! `status` and `GET /status` say what goes wrong and since when.
//!
//! Invariant: one row per subject; `failing_since` is the time of the first failure of the
//! current streak (kept while failures repeat, cleared by the next success), and
//! `last_success_at` survives failures.

use rusqlite::{OptionalExtension, params};

use super::outbox::{NewEvent, put};
use super::{Result, Store, now_unix};

/// How long a subject fails before people are told: a fetch may fail for a while (a git
/// host's blip), an engine that does not answer is an outage at once.
fn threshold(subject: &str) -> i64 {
    if subject == HEALTH_ENGINE { 60 } else { 300 }
}

/// The events of `subject` failing past its threshold and coming back.
fn events(subject: &str) -> (&'static str, &'static str) {
    if subject == HEALTH_ENGINE {
        ("engine.unreachable", "engine.back")
    } else {
        ("fetch.failing", "fetch.recovered")
    }
}

/// Tells of a failing streak once it passed the subject's threshold, and of its end once
/// it was told, in the transaction of the check.
fn announce(
    tx: &rusqlite::Transaction<'_>,
    subject: &str,
    outcome: Result<(), &str>,
    announced: bool,
    now: i64,
) -> rusqlite::Result<()> {
    let (failing, back) = events(subject);
    match outcome {
        Ok(()) if announced => {
            tx.execute(
                "UPDATE health SET announced = 0 WHERE subject = ?1",
                params![subject],
            )?;
            put(
                tx,
                &NewEvent {
                    event: back,
                    resource: "",
                    commit: None,
                    message: &format!("{subject}: working again"),
                    data: serde_json::json!({ "subject": subject }),
                    source: subject_source(subject),
                },
            )
        }
        Err(error) if !announced => {
            let since: Option<i64> = tx.query_row(
                "SELECT failing_since FROM health WHERE subject = ?1",
                params![subject],
                |row| row.get(0),
            )?;
            let Some(since) = since.filter(|since| now - since >= threshold(subject)) else {
                return Ok(());
            };
            tx.execute(
                "UPDATE health SET announced = 1 WHERE subject = ?1",
                params![subject],
            )?;
            put(
                tx,
                &NewEvent {
                    event: failing,
                    resource: "",
                    commit: None,
                    message: &format!("{subject}: failing for {}s: {error}", now - since),
                    data: serde_json::json!({ "subject": subject, "failing_since": since }),
                    source: subject_source(subject),
                },
            )
        }
        _ => Ok(()),
    }
}

/// The source a health subject is about: `NAME` of `fetch:NAME` (`Store::source_key`), `""`
/// for the single `--repo` source's and the host's (`engine`).
fn subject_source(subject: &str) -> &str {
    subject.split_once(':').map_or("", |(_, source)| source)
}

/// The subject of fetches of the watched remote.
pub const HEALTH_FETCH: &str = "fetch";
/// The subject of probes of the container engine.
pub const HEALTH_ENGINE: &str = "engine";

/// The last check of one subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub(crate) ok: bool,
    /// The whole error chain of the last failure; empty when the last check succeeded.
    pub(crate) error: String,
    /// When the current streak of failures began; `None` while the subject is fine.
    pub(crate) failing_since: Option<i64>,
    pub(crate) checked_at: i64,
    pub last_success_at: Option<i64>,
}

impl Health {
    /// Whether the last check succeeded.
    pub fn is_ok(&self) -> bool {
        self.ok
    }
}

impl Store {
    /// Records one check of `subject`: `Ok(())` or the error it failed with.
    pub(crate) fn record_health(&self, subject: &str, outcome: Result<(), &str>) -> Result<()> {
        self.record_health_at(subject, outcome, now_unix())
    }

    /// `record_health` at a given time (a sync's clock, tests).
    pub(crate) fn record_health_at(
        &self,
        subject: &str,
        outcome: Result<(), &str>,
        now: i64,
    ) -> Result<()> {
        let result = self.with(|connection| {
            let tx = connection.transaction()?;
            let announced: bool = tx
                .query_row(
                    "SELECT announced FROM health WHERE subject = ?1",
                    params![subject],
                    |row| row.get::<_, i64>(0),
                )
                .optional()?
                .is_some_and(|announced| announced != 0);
            let connection = &tx;
            match outcome {
                Ok(()) => connection.execute(
                    "INSERT INTO health (subject, ok, error, failing_since, checked_at, last_success_at)
                     VALUES (?1, 1, '', NULL, ?2, ?2)
                     ON CONFLICT (subject) DO UPDATE SET ok = 1, error = '', failing_since = NULL,
                       checked_at = excluded.checked_at, last_success_at = excluded.last_success_at",
                    params![subject, now],
                )?,
                Err(error) => connection.execute(
                    "INSERT INTO health (subject, ok, error, failing_since, checked_at, last_success_at)
                     VALUES (?1, 0, ?2, ?3, ?3, NULL)
                     ON CONFLICT (subject) DO UPDATE SET ok = 0, error = excluded.error,
                       failing_since = COALESCE(health.failing_since, excluded.failing_since),
                       checked_at = excluded.checked_at",
                    params![subject, error, now],
                )?,
            };
            announce(&tx, subject, outcome, announced, now)?;
            tx.commit()?;
            Ok(())
        });
        self.mark_changed();
        result
    }

    /// The last check of `subject`, if there was one.
    pub fn health(&self, subject: &str) -> Result<Option<Health>> {
        self.with(|connection| {
            Ok(connection
                .query_row(
                    "SELECT ok, error, failing_since, checked_at, last_success_at FROM health
                     WHERE subject = ?1",
                    params![subject],
                    |row| {
                        Ok(Health {
                            ok: row.get::<_, i64>(0)? != 0,
                            error: row.get(1)?,
                            failing_since: row.get(2)?,
                            checked_at: row.get(3)?,
                            last_success_at: row.get(4)?,
                        })
                    },
                )
                .optional()?)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    /// A streak of failures keeps its start; a success clears it and is remembered through
    /// the next streak.
    #[test]
    fn failing_since_is_the_start_of_the_current_streak() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Store::open(&dir.path().join("state.db"))?;
        // (outcome, at, expected failing_since, expected last_success_at, expected error)
        type Step = (
            Result<(), &'static str>,
            i64,
            Option<i64>,
            Option<i64>,
            &'static str,
        );
        let steps: &[Step] = &[
            (Err("boom"), 10, Some(10), None, "boom"),
            (Err("bang"), 20, Some(10), None, "bang"),
            (Ok(()), 30, None, Some(30), ""),
            (Err("again"), 40, Some(40), Some(30), "again"),
            (Ok(()), 50, None, Some(50), ""),
        ];
        assert_eq!(store.health(HEALTH_FETCH)?, None);
        for (outcome, at, failing_since, last_success_at, error) in steps {
            store.record_health_at(HEALTH_FETCH, *outcome, *at)?;
            let health = store.health(HEALTH_FETCH)?.ok_or("no row")?;
            assert_eq!(
                health,
                Health {
                    ok: outcome.is_ok(),
                    error: (*error).to_owned(),
                    failing_since: *failing_since,
                    checked_at: *at,
                    last_success_at: *last_success_at,
                },
                "after {outcome:?} at {at}"
            );
        }
        assert_eq!(store.health(HEALTH_ENGINE)?, None, "subjects are apart");
        Ok(())
    }

    /// A failing streak is announced once it passed its threshold (5 min for fetches, 1 min
    /// for the engine), once, and its end only after it was announced.
    #[test]
    fn a_long_failure_and_its_end_are_told_once() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Store::open(&dir.path().join("state.db"))?;
        let events =
            |store: &Store| -> std::result::Result<Vec<String>, Box<dyn std::error::Error>> {
                Ok(store
                    .events_after(0, 100)?
                    .into_iter()
                    .map(|event| event.event)
                    .collect())
            };
        store.record_health_at(HEALTH_FETCH, Err("blip"), 1000)?;
        store.record_health_at(HEALTH_FETCH, Ok(()), 1100)?;
        assert!(
            events(&store)?.is_empty(),
            "a short blip is not told, nor its end"
        );
        for at in [2000, 2200, 2300, 2400] {
            store.record_health_at(HEALTH_FETCH, Err("refused"), at)?;
        }
        store.record_health_at(HEALTH_ENGINE, Err("no socket"), 2300)?;
        store.record_health_at(HEALTH_ENGINE, Err("no socket"), 2360)?;
        store.record_health_at(HEALTH_FETCH, Ok(()), 2500)?;
        store.record_health_at(HEALTH_FETCH, Ok(()), 2600)?;
        assert_eq!(
            events(&store)?,
            ["fetch.failing", "engine.unreachable", "fetch.recovered"]
        );
        let failing = &store.events_after(0, 1)?[0];
        assert_eq!(failing.message, "fetch: failing for 300s: refused");
        Ok(())
    }
}
