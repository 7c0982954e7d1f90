//! Image automation's state (issue 27): each followed repository's last scan (its tags, what
//! of the registry's listing was left out, when, its error, the registry's Retry-After), and per resource with `image_update` the tag its
//! policy chose and what committing it did. Read by `status`, `images`, `/metrics`.
//!
//! Invariants: a failed scan keeps the tags of the last good one (a registry outage never makes
//! an update disappear, nor invents one); the per-resource rows are replaced whole by each
//! decision pass, so a resource whose block was removed leaves no row; a newly available tag
//! and every commit attempt are written to the activity log in the same transaction as the row.

use rusqlite::params;

use super::activity::{self, ActivityOutcome, Entry, Who};
use super::{Result, Store};
use crate::model::text::cut;
use crate::model::{CommitSha, Kind, ResourceKey};

/// Longest error kept, in bytes.
const MAX_ERROR_BYTES: usize = 1024;

/// Most tags kept per repository (a registry listing more is cut, newest listing order kept).
pub(crate) const MAX_STORED_TAGS: usize = 20_000;

/// One repository's last scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageScan {
    /// `host/path` as images name it (`127.0.0.1:5000/app`, `docker.io/library/redis`).
    pub repository: String,
    /// Unix seconds of the last attempt.
    pub scanned_at: i64,
    /// The tags of the last successful scan.
    pub tags: Vec<String>,
    /// What of that scan's listing was left out (`registry listed more than 20000 tags; the
    /// first 20000 were considered`), empty when nothing was.
    pub note: String,
    /// Unix seconds of the last successful scan.
    pub tags_at: Option<i64>,
    /// The last attempt's error, empty when it succeeded.
    pub error: String,
    /// No scan before this (unix seconds): the registry's Retry-After.
    pub not_before: i64,
}

/// What a resource's policy chose, and what committing it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageUpdateRow {
    pub key: ResourceKey,
    /// The image desired state runs (`app:1.4.2`).
    pub image: String,
    pub repository: String,
    /// `semver ~1.4`, `numerical ^main-([0-9]+)$ → $1`, …
    pub policy: String,
    /// `commit` or `report`.
    pub mode: String,
    /// The newer tag the policy chose, empty when the image is current.
    pub latest: String,
    /// Unix seconds of the decision.
    pub checked_at: i64,
    /// The commit that wrote `latest` (commit mode), empty before one.
    pub commit_sha: String,
    /// Why the last commit attempt failed (a conflict, a refused push), empty otherwise.
    pub commit_error: String,
}

impl Store {
    /// The last scan of every repository, by name.
    pub fn image_scans(&self) -> Result<Vec<ImageScan>> {
        self.with(|connection| {
            let mut statement = connection.prepare(
                "SELECT repository, scanned_at, tags, tags_at, error, not_before, note FROM image_scans ORDER BY repository",
            )?;
            let rows = statement.query_map([], |row| {
                let tags: String = row.get(2)?;
                Ok(ImageScan {
                    repository: row.get(0)?,
                    scanned_at: row.get(1)?,
                    tags: serde_json::from_str(&tags).unwrap_or_default(),
                    tags_at: row.get(3)?,
                    error: row.get(4)?,
                    not_before: row.get(5)?,
                    note: row.get(6)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    /// Records a scan of `repository` at `now`: its tags and what of the listing was left out
    /// (`note`, empty when nothing was), or its error (keeping the last good tags and their
    /// note) and, for a rate limit, the instant before which it must not be scanned again.
    pub fn record_image_scan(
        &self,
        repository: &str,
        outcome: std::result::Result<(&[String], &str), &str>,
        not_before: i64,
        now: i64,
    ) -> Result<()> {
        self.with(|connection| {
            match outcome {
                Ok((tags, note)) => {
                    let kept = &tags[..tags.len().min(MAX_STORED_TAGS)];
                    let note = if note.is_empty() && kept.len() < tags.len() {
                        format!(
                            "more than {MAX_STORED_TAGS} tags; the first {MAX_STORED_TAGS} were kept"
                        )
                    } else {
                        cut(note, MAX_ERROR_BYTES).to_owned()
                    };
                    let tags = serde_json::to_string(kept).unwrap_or_else(|_| "[]".to_owned());
                    connection.execute(
                        "INSERT INTO image_scans (repository, scanned_at, tags, tags_at, error, not_before, note)
                         VALUES (?1, ?2, ?3, ?2, '', ?4, ?5)
                         ON CONFLICT (repository) DO UPDATE SET scanned_at = ?2, tags = ?3, tags_at = ?2, error = '', not_before = ?4, note = ?5",
                        params![repository, now, tags, not_before, note],
                    )?;
                }
                Err(error) => {
                    connection.execute(
                        "INSERT INTO image_scans (repository, scanned_at, error, not_before) VALUES (?1, ?2, ?3, ?4)
                         ON CONFLICT (repository) DO UPDATE SET scanned_at = ?2, error = ?3, not_before = ?4",
                        params![repository, now, cut(error, MAX_ERROR_BYTES), not_before],
                    )?;
                }
            }
            Ok(())
        })?;
        // The dashboard's Images table follows the scans.
        self.mark_changed();
        Ok(())
    }

    /// Forgets the scans of repositories no resource follows any more.
    pub fn retain_image_scans(&self, followed: &[String]) -> Result<()> {
        self.with(|connection| {
            let tx = connection.transaction()?;
            let known: Vec<String> = {
                let mut statement = tx.prepare("SELECT repository FROM image_scans")?;
                let rows = statement.query_map([], |row| row.get(0))?;
                rows.collect::<rusqlite::Result<Vec<String>>>()?
            };
            for repository in known.iter().filter(|known| !followed.contains(known)) {
                tx.execute(
                    "DELETE FROM image_scans WHERE repository = ?1",
                    [repository],
                )?;
            }
            tx.commit()?;
            Ok(())
        })
    }

    /// Every resource's image decision, by key.
    pub fn image_updates(&self) -> Result<Vec<ImageUpdateRow>> {
        self.with(|connection| read_updates(connection))
    }

    /// Replaces the decisions with `rows` (one per resource with `image_update`), keeping each
    /// resource's commit outcome while its chosen tag stays the same, and logging every newly
    /// available tag (`image.available`).
    pub fn record_image_updates(&self, rows: &[ImageUpdateRow]) -> Result<()> {
        self.with(|connection| {
            let tx = connection.transaction()?;
            let before = read_updates(&tx)?;
            tx.execute("DELETE FROM image_updates", [])?;
            for row in rows {
                let previous = before.iter().find(|previous| previous.key == row.key);
                let (commit_sha, commit_error) = match previous {
                    Some(previous) if previous.latest == row.latest => {
                        (previous.commit_sha.as_str(), previous.commit_error.as_str())
                    }
                    _ => ("", ""),
                };
                tx.execute(
                    "INSERT INTO image_updates (kind, scope, name, image, repository, policy, mode, latest, checked_at, commit_sha, commit_error)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                    params![
                        row.key.kind.as_str(),
                        row.key.scope,
                        row.key.name,
                        row.image,
                        row.repository,
                        row.policy,
                        row.mode,
                        row.latest,
                        row.checked_at,
                        commit_sha,
                        commit_error
                    ],
                )?;
                let newly = !row.latest.is_empty()
                    && previous.is_none_or(|previous| previous.latest != row.latest);
                if newly {
                    let resource = row.key.to_string();
                    let message = format!(
                        "{}:{} is available ({}; mode {})",
                        row.repository, row.latest, row.policy, row.mode
                    );
                    let mut entry =
                        Entry::new("image.available", &Who::AGENT, ActivityOutcome::Requested);
                    entry.resource = Some(&resource);
                    entry.message = &message;
                    entry.data = serde_json::json!({
                        "image": row.image,
                        "latest": format!("{}:{}", row.repository, row.latest),
                        "mode": row.mode,
                    });
                    activity::record(&tx, &entry)?;
                }
            }
            tx.commit()?;
            Ok(())
        })?;
        self.mark_changed();
        Ok(())
    }

    /// Records a commit attempt of image bumps for `keys`: the pushed commit, or why not.
    pub fn record_image_commit(
        &self,
        keys: &[ResourceKey],
        outcome: std::result::Result<&CommitSha, &str>,
        message: &str,
    ) -> Result<()> {
        self.with(|connection| {
            let tx = connection.transaction()?;
            let (sha, error) = match outcome {
                Ok(sha) => (sha.as_str(), ""),
                Err(error) => ("", error),
            };
            for key in keys {
                tx.execute(
                    "UPDATE image_updates SET commit_sha = ?4, commit_error = ?5 WHERE kind = ?1 AND scope = ?2 AND name = ?3",
                    params![
                        key.kind.as_str(),
                        key.scope,
                        key.name,
                        sha,
                        cut(error, MAX_ERROR_BYTES)
                    ],
                )?;
            }
            let shown = match outcome {
                Ok(_) => message.to_owned(),
                Err(error) => format!("{message}: {error}"),
            };
            let resources: Vec<String> = keys.iter().map(ToString::to_string).collect();
            let resource = resources.join(", ");
            let mut entry = Entry::new(
                "image.commit",
                &Who::AGENT,
                if outcome.is_ok() {
                    ActivityOutcome::Succeeded
                } else {
                    ActivityOutcome::Failed
                },
            );
            let commit = outcome.ok().cloned();
            entry.commit = commit.as_ref();
            entry.resource = Some(&resource);
            entry.message = &shown;
            activity::record(&tx, &entry)?;
            tx.commit()?;
            Ok(())
        })
    }
}

fn read_updates(connection: &rusqlite::Connection) -> Result<Vec<ImageUpdateRow>> {
    let mut statement = connection.prepare(
        "SELECT kind, scope, name, image, repository, policy, mode, latest, checked_at, commit_sha, commit_error
         FROM image_updates ORDER BY kind, scope, name",
    )?;
    let rows = statement.query_map([], |row| {
        let kind: String = row.get(0)?;
        Ok((
            kind,
            ImageUpdateRow {
                key: ResourceKey::new(
                    Kind::Deployment,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                ),
                image: row.get(3)?,
                repository: row.get(4)?,
                policy: row.get(5)?,
                mode: row.get(6)?,
                latest: row.get(7)?,
                checked_at: row.get(8)?,
                commit_sha: row.get(9)?,
                commit_error: row.get(10)?,
            },
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (kind, mut update) = row?;
        // A kind this build does not know (another version's row) is skipped.
        let Some(kind) = Kind::parse(&kind) else {
            continue;
        };
        update.key.kind = kind;
        out.push(update);
    }
    Ok(out)
}

/// When `repository` may be scanned next: `interval` after its last attempt, and not before
/// the registry's Retry-After. `None`: never scanned.
pub fn next_scan(scan: Option<&ImageScan>, interval_secs: i64) -> Option<i64> {
    scan.map(|scan| (scan.scanned_at + interval_secs).max(scan.not_before))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, latest: &str) -> ImageUpdateRow {
        ImageUpdateRow {
            key: ResourceKey::new(Kind::Deployment, "shop", name),
            image: "app:1.4.2".into(),
            repository: "app".into(),
            policy: "semver ~1.4".into(),
            mode: "commit".into(),
            latest: latest.into(),
            checked_at: 1,
            commit_sha: String::new(),
            commit_error: String::new(),
        }
    }

    #[test]
    fn scans_keep_the_last_good_tags_and_updates_log_once() -> Result<()> {
        let dir = tempfile::tempdir().expect("a temp dir");
        let store = Store::open(&dir.path().join("state.db"))?;
        let tags = vec!["1.4.2".to_owned(), "1.4.3".to_owned()];
        store.record_image_scan("app", Ok((&tags, "a note")), 0, 100)?;
        store.record_image_scan("app", Err("registry unreachable"), 160, 130)?;
        let scans = store.image_scans()?;
        assert_eq!(scans.len(), 1);
        assert_eq!(
            (
                &scans[0].tags,
                scans[0].tags_at,
                scans[0].error.as_str(),
                scans[0].note.as_str()
            ),
            (&tags, Some(100), "registry unreachable", "a note")
        );
        assert_eq!(next_scan(scans.first(), 60), Some(190));
        assert_eq!(next_scan(None, 60), None);
        store.record_image_updates(&[row("web", "1.4.3"), row("api", "")])?;
        store.record_image_updates(&[row("web", "1.4.3"), row("api", "")])?;
        let sha = CommitSha::new("a".repeat(40));
        let web = ResourceKey::new(Kind::Deployment, "shop", "web");
        store.record_image_commit(std::slice::from_ref(&web), Ok(&sha), "bump")?;
        store.record_image_updates(&[row("web", "1.4.3")])?;
        let updates = store.image_updates()?;
        assert_eq!(updates.len(), 1, "api's row went with its block");
        assert_eq!(
            updates[0].commit_sha,
            sha.as_str(),
            "kept while the tag stays"
        );
        let actions: Vec<String> = store
            .activity(0, 100)?
            .0
            .into_iter()
            .map(|activity| format!("{} {}", activity.action, activity.outcome))
            .collect();
        assert_eq!(
            actions
                .iter()
                .filter(|a| a.starts_with("image.available"))
                .count(),
            1,
            "{actions:?}"
        );
        assert!(
            actions.contains(&"image.commit succeeded".to_owned()),
            "{actions:?}"
        );
        store.retain_image_scans(&[])?;
        assert!(store.image_scans()?.is_empty());
        Ok(())
    }
}
