//! What image automation asks of git: a `Bump` (one tag change), and the `ImageCommitter`
//! that writes bumps as a commit (the agent implements it with `git`). The shared context
//! holds the committer; nothing here knows the context.

use std::future::Future;
use std::pin::Pin;

use crate::model::{CommitSha, ResourceKey};

/// One tag change commit mode asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bump {
    pub key: ResourceKey,
    /// The source (repository) whose manifest declares the resource (`""`: the `--repo` one).
    pub source: String,
    /// The image without its tag, as the manifest writes it (`127.0.0.1:5000/app`).
    pub repository: String,
    pub from_tag: String,
    pub to_tag: String,
    /// `image_update.push_branch`, empty for the watched branch.
    pub push_branch: String,
}

/// The result of one commit of bumps.
pub type CommitResult = Result<CommitSha, CommitError>;

/// Why a commit of bumps was not made: the committer's own error (git is not this stage's),
/// recorded and shown as it is.
pub type CommitError = Box<dyn std::error::Error + Send + Sync>;

/// Writes bumps to git (the agent implements it with `git`); one call per source and target
/// branch (every bump of a call has the same `source` and `push_branch`).
pub trait ImageCommitter: Send + Sync {
    fn commit(&self, bumps: Vec<Bump>) -> Pin<Box<dyn Future<Output = CommitResult> + Send + '_>>;
}
