//! Runtime: the container verbs the handlers need, in the crate's own types, so no bollard
//! type leaks past this module. `docker` drives a real engine, `fake` keeps containers in
//! memory for fast tests; the contract suite (tests/it/contract.rs) runs the same checks on
//! both.
//!
//! Invariant: every container created through a `Runtime` carries its labels from birth;
//! `list` filters by labels on the engine side and returns stopped containers too.

pub mod docker;
#[doc(hidden)]
pub mod fake;
pub mod labels;

use std::collections::BTreeMap;
use std::future::Future;

pub use crate::model::{PortMapping, parse_ports};
pub use docker::DockerRuntime;
pub use fake::FakeRuntime;

/// What a container is doing, reduced to what reconcile decisions need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerState {
    Created,
    Running,
    Restarting,
    Exited,
    Other,
}

/// A container as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    pub id: String,
    pub name: String,
    pub image: String,
    pub labels: BTreeMap<String, String>,
    pub state: ContainerState,
}

impl Container {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }
}

/// Everything needed to create one container.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerSpec {
    pub name: String,
    pub image: String,
    /// Replaces the image's CMD; the ENTRYPOINT is kept (as `docker run IMAGE cmd…`).
    pub command: Option<Vec<String>>,
    /// `KEY=VALUE` entries.
    pub env: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub ports: Vec<PortMapping>,
    /// Bind and volume mounts in `docker -v` syntax.
    pub binds: Vec<String>,
    pub restart: String,
    /// Networks to join, the first as primary, each with these DNS aliases.
    pub networks: Vec<String>,
    pub aliases: Vec<String>,
    pub extra_hosts: Vec<String>,
    pub cap_add: Vec<String>,
}

/// Runtime failures, classified for the retry policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("image {image} is not present on this host and cannot be pulled: {message}")]
    ImageMissing { image: String, message: String },
    #[error("container {name}: {message}")]
    Conflict { name: String, message: String },
    #[error("{what} not found")]
    NotFound { what: String },
    #[error("the engine refused the request: {message}")]
    Invalid { message: String },
    #[error("container engine unavailable: {message}")]
    Unavailable { message: String },
}

impl Error {
    /// True when trying again later can help (engine down, a name still being released).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Unavailable { .. } | Error::Conflict { .. } | Error::NotFound { .. }
        )
    }
}

/// The runtime's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The verbs handlers use. Futures are `Send` so handlers can run on any worker.
pub trait Runtime: Send + Sync + 'static {
    /// Containers (running or not) whose labels include every `(key, value)` in `filter`.
    fn list(&self, filter: &[(&str, &str)]) -> impl Future<Output = Result<Vec<Container>>> + Send;
    /// Creates (does not start) a container; returns its id.
    fn create(&self, spec: &ContainerSpec) -> impl Future<Output = Result<String>> + Send;
    fn start(&self, id: &str) -> impl Future<Output = Result<()>> + Send;
    /// Stops (SIGTERM, then SIGKILL after the grace period) and removes. Removing a container
    /// that is already gone succeeds.
    fn remove(&self, id: &str) -> impl Future<Output = Result<()>> + Send;
    /// Creates a bridge network when none by that name exists.
    fn ensure_network(&self, name: &str) -> impl Future<Output = Result<()>> + Send;
}
