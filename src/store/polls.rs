//! What a source's sync reads of the store at every poll, in one statement: the journal's head
//! and the maintenance version (another process's writes, announced here), the buckets'
//! config version, whether an approval is pending, and the source's hold.
//!
//! A poll that finds nothing new reads nothing else of the store. 100 sources polled each
//! second made this four statements a poll, each its own read transaction on the WAL (two
//! locks of its shared memory, a header check): a tenth of an unchanged poll (issue 54).
//!
//! Invariant: every value is read in one snapshot, and another process's journal rows and
//! maintenance change wake this handle's subscribers as `notice` did before the reads were one.

use rusqlite::params;

use super::{Hold, Result, Store};

/// What a sync of one source compares at every poll ([`Store::sync_view`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncView {
    /// Bumped by every bucket change: a commit is loaded again when it moved.
    pub config_version: i64,
    /// An approval of a commit a trigger of this source holds waits to be applied.
    pub approvals_pending: bool,
    /// The commit this source holds, if any.
    pub hold: Option<Hold>,
}

impl Store {
    /// Reads this handle's [`SyncView`] in one statement, prepared once, and wakes subscribers
    /// when another process (the `rollback` or `unpin` command) appended journal rows this
    /// handle has not announced, or changed maintenance (`maintenance`).
    pub fn sync_view(&self) -> Result<SyncView> {
        let (head, maintenance, view) = self.with(|connection| {
            Ok(connection
                .prepare_cached(
                    "SELECT (SELECT COALESCE(MAX(seq), 0) FROM journal),
                            (SELECT value FROM meta WHERE key = ?1),
                            (SELECT value FROM meta WHERE key = 'config_version'),
                            EXISTS (SELECT 1 FROM triggers WHERE source = ?2
                                    AND held_commit IS NOT NULL AND approved_at IS NOT NULL),
                            h.sha, h.since, h.until, h.reason, h.frozen, h.released_by,
                            h.released_at
                     FROM (SELECT 1) LEFT JOIN holds AS h ON h.source = ?2",
                )?
                .query_row(
                    params![super::maintenance::VERSION_KEY, self.source],
                    |row| {
                        let view = SyncView {
                            config_version: super::secrets::parse_config_version(
                                row.get::<_, Option<String>>(2)?.as_deref(),
                            ),
                            approvals_pending: row.get(3)?,
                            hold: super::holds::hold_at(row, 4)?,
                        };
                        Ok((
                            row.get::<_, i64>(0)?,
                            row.get::<_, Option<String>>(1)?,
                            view,
                        ))
                    },
                )?)
        })?;
        self.announce_maintenance(super::maintenance::parse_version(maintenance.as_deref()));
        self.shared.journal_head.send_if_modified(|current| {
            let newer = head > *current;
            if newer {
                *current = head;
            }
            newer
        });
        Ok(view)
    }
}
