//! The reconcile stage's error type.

use crate::model::ResourceKey;

/// A reconcile of one resource failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] crate::store::Error),
    #[error("{key}: {source}")]
    Runtime {
        key: ResourceKey,
        #[source]
        source: crate::runtime::Error,
    },
    /// Retrying cannot help until desired state changes.
    #[error("{key}: {message}")]
    Permanent { key: ResourceKey, message: String },
    /// A blocking store task could not complete (the runtime is shutting down).
    #[error("background task failed: {0}")]
    Task(String),
    /// Worth another try soon (a replica that died right after start, say).
    #[error("{key}: {message}")]
    Transient { key: ResourceKey, message: String },
}

impl Error {
    /// True when the retry schedule applies.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Store(_) | Error::Task(_) | Error::Transient { .. } => true,
            Error::Runtime { source, .. } => source.is_transient(),
            Error::Permanent { .. } => false,
        }
    }
}

/// The reconcile stage's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
