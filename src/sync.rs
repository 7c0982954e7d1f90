//! One sync: fetch the repo, and when the branch moved, read the commit, load its manifests
//! and write the outcome to the store.
//!
//! Invariants: an unchanged SHA ends the sync after the ref negotiation (no tree walk, no
//! store write); a commit is applied in one store transaction or recorded as rejected with
//! all its diagnostics, never half-applied. Blocking: run on a blocking thread.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use crate::git::Source;
use crate::manifest::{self, Diagnostics};
use crate::model::CommitSha;
use crate::store::{ApplySummary, Store};

/// What one sync did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncOutcome {
    /// The branch still points at the last processed commit.
    Unchanged(CommitSha),
    Applied {
        commit: CommitSha,
        summary: ApplySummary,
    },
    Rejected {
        commit: CommitSha,
        diagnostics: Diagnostics,
    },
}

/// Fetching or recording failed; the next sync tries again from scratch.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Git(#[from] crate::git::Error),
    #[error(transparent)]
    Store(#[from] crate::store::Error),
}

/// Carries a source and the store between syncs, remembering the last processed commit.
pub struct Syncer {
    source: Source,
    store: Arc<Store>,
    last_seen: Mutex<Option<CommitSha>>,
}

impl Syncer {
    /// Starts from the last commit the store recorded, so a restart does not re-read it.
    pub fn new(source: Source, store: Arc<Store>) -> Result<Syncer, Error> {
        let last_seen = store.commit_summary()?.last_seen.map(|record| record.sha);
        Ok(Syncer {
            source,
            store,
            last_seen: Mutex::new(last_seen),
        })
    }

    pub fn source(&self) -> &Source {
        &self.source
    }

    /// Runs one sync. Blocking.
    pub fn sync_once(&self, interrupt: &AtomicBool) -> Result<SyncOutcome, Error> {
        let commit = self.source.fetch(interrupt)?;
        let mut last_seen = self
            .last_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if last_seen.as_ref() == Some(&commit) {
            return Ok(SyncOutcome::Unchanged(commit));
        }
        let snapshot = self.source.read_snapshot(&commit)?;
        let outcome = match manifest::load(&snapshot) {
            Ok(manifest) => {
                let summary = self.store.apply_commit(&commit, &manifest)?;
                SyncOutcome::Applied {
                    commit: commit.clone(),
                    summary,
                }
            }
            Err(diagnostics) => {
                self.store.reject_commit(&commit, &diagnostics)?;
                SyncOutcome::Rejected {
                    commit: commit.clone(),
                    diagnostics,
                }
            }
        };
        *last_seen = Some(commit);
        Ok(outcome)
    }
}
