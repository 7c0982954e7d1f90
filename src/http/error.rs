//! The HTTP stage's error type.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Setting up the HTTP side failed. Requests themselves never fail this way: each is
/// answered with a status code and a JSON reason.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "refusing to listen on {address} without a webhook secret: anyone who can reach it could trigger syncs; pass --webhook-secret-file FILE, or listen on a loopback address"
    )]
    InsecureListen { address: SocketAddr },
    #[error("cannot listen on {address}: {source}")]
    Bind {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read webhook secret file {path}: {source}")]
    SecretFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("webhook secret file {path} is empty")]
    EmptySecret { path: PathBuf },
}

/// The HTTP stage's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
