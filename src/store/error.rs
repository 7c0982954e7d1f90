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
