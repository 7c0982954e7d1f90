//! Per-kind spec types: what a resource asks of the host, after decoding and defaults.
//!
//! Invariant: a `Spec` round-trips through JSON unchanged; that JSON is what the store keeps
//! as desired state and what a release snapshots.

mod deployment;

pub use deployment::{DEFAULT_NETWORK, DEFAULT_RESTART, DeploymentSpec, normalize_port};

use crate::model::{Kind, ResourceKey, SpecHash};

/// The decoded spec of one resource. Closed: a new kind adds a variant and the compiler
/// shows every place that must handle it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spec {
    Deployment(DeploymentSpec),
}

/// A stored spec that cannot be read back (a schema change or a hand-edited database).
#[derive(Debug, thiserror::Error)]
#[error("stored {kind} spec is not readable: {source}")]
pub struct SpecDecodeError {
    pub kind: Kind,
    #[source]
    pub source: serde_json::Error,
}

impl Spec {
    pub fn kind(&self) -> Kind {
        match self {
            Spec::Deployment(_) => Kind::Deployment,
        }
    }

    /// Canonical JSON: the store compares these strings to decide what changed.
    pub fn to_json(&self) -> String {
        let result = match self {
            Spec::Deployment(spec) => serde_json::to_string(spec),
        };
        result.expect("spec types hold only strings, numbers and maps with string keys")
    }

    pub fn from_json(kind: Kind, json: &str) -> Result<Spec, SpecDecodeError> {
        let wrap = |source| SpecDecodeError { kind, source };
        match kind {
            Kind::Deployment => serde_json::from_str(json)
                .map(Spec::Deployment)
                .map_err(wrap),
            other => Err(wrap(serde::de::Error::custom(format!(
                "kind {other} has no spec type yet"
            )))),
        }
    }

    pub fn spec_hash(&self, key: &ResourceKey) -> SpecHash {
        match self {
            Spec::Deployment(spec) => spec.spec_hash(key),
        }
    }

    pub fn n_replicas(&self) -> usize {
        match self {
            Spec::Deployment(spec) => spec.n_replicas(),
        }
    }
}
