//! The git stage's error type.

use std::path::PathBuf;

/// Fetching the repo or reading a commit failed. Each variant names what it was working on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open or create the local mirror at {path}: {message}")]
    Mirror { path: PathBuf, message: String },
    #[error("fetch from {url} failed: {message}")]
    Fetch { url: String, message: String },
    #[error("branch {branch:?} does not exist in {url}; check --branch")]
    BranchNotFound { url: String, branch: String },
    #[error("{rev:?} is not a branch, tag or full commit SHA of {url}")]
    RevNotFound { url: String, rev: String },
    #[error("cannot read token file {path}: {source}")]
    TokenFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "a token would go to {url} in clear text: use an https:// URL, or drop --git-token-file"
    )]
    TokenOverHttp { url: String },
    #[error("--git-ca-file {path}: {message}")]
    CaFile { path: PathBuf, message: String },
    #[error("ssh key file {path}: {message}")]
    SshKeyFile { path: PathBuf, message: String },
    #[error("cannot read commit {sha}: {message}")]
    Read { sha: String, message: String },
    #[error("cannot use trusted keys {path}: {message}")]
    TrustedKeys { path: PathBuf, message: String },
    #[error("fetch interrupted")]
    Interrupted,
}

/// The git stage's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
