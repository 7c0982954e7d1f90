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
        "state database {path} has schema version {found}, newer than this agent knows ({known}); upgrade voodu-agent"
    )]
    SchemaTooNew {
        path: PathBuf,
        found: i64,
        known: i64,
    },
    /// The file is there but holds no usable state: empty, not SQLite, another program's
    /// database, or a voodu-agent database without its agent id. Never a fresh start.
    #[error(
        "state database {path} is unusable: {problem}; the agent's identity and state are in it, so it will not start afresh: restore the file from a backup, or move it aside and start the agent with --adopt to take over this data dir's containers (README: \"Identity and the data dir\")"
    )]
    Unusable { path: PathBuf, problem: String },
    #[error("state database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("state database holds an unreadable row: {0}")]
    Corrupt(String),
    #[error("cannot roll back {key}: {message}")]
    Rollback {
        key: crate::model::ResourceKey,
        message: String,
    },
    #[error("{key} is not pinned: nothing to unpin")]
    NotPinned { key: crate::model::ResourceKey },
}

/// The store's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
