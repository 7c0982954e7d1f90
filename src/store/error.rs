//! The store's error type.

use std::path::PathBuf;

/// Everything that can go wrong reading or writing the SQLite journal.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open state database {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "state database {path} has schema version {found}, newer than this agent knows ({known}){back}"
    )]
    SchemaTooNew {
        path: PathBuf,
        found: i64,
        known: i64,
        /// How to go back: the copy kept before the upgrade, or "upgrade voodu-agent".
        back: String,
    },
    /// The file is there but holds no usable state: empty, not SQLite, another program's
    /// database, or a voodu-agent database without its agent id. Never a fresh start.
    #[error(
        "state database {path} is unusable: {problem}; the agent's identity and state are in it, so it will not start afresh: restore the file from a backup, or move it aside and start the agent with --adopt to take over this data dir's containers (README: \"Identity and the data dir\")"
    )]
    Unusable { path: PathBuf, problem: String },
    #[error("state database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The blocking task of [`super::blocking`] panicked or was cancelled.
    #[error("store task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("state database holds an unreadable row: {0}")]
    Corrupt(String),
    /// A closed set's column (a phase, a reason, a kind, a journal op) holds a text this
    /// agent does not know: a newer agent's row, or damage.
    #[error("state database holds an unreadable row: {column} {text:?}")]
    Unknown { column: &'static str, text: String },
    /// A stored spec no longer decodes (written by another version, or damaged).
    #[error("state database holds an unreadable row: {key}: {source}")]
    Spec {
        key: crate::model::ResourceKey,
        #[source]
        source: crate::manifest::spec::SpecDecodeError,
    },
    /// A commit's stored diagnostics (`errors` or `warnings`) no longer decode.
    #[error("state database holds an unreadable row: commit {what}: {source}")]
    Diagnostics {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot roll back {key}: {message}")]
    Rollback {
        key: crate::model::ResourceKey,
        message: String,
    },
    /// A commit claims what another source holds (`store/claims.rs`): rejected whole.
    #[error("{} claim(s) held by another source", .0.len())]
    Claimed(Vec<super::ClaimConflict>),
    #[error("{key} is not pinned: nothing to unpin")]
    NotPinned { key: crate::model::ResourceKey },
    #[error("no trigger holds a commit {sha:?} ({held}); see `voodu-agent status`")]
    NotHeld { sha: String, held: String },
}

/// The store's result type.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;
