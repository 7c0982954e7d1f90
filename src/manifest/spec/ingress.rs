//! `ingress "scope" "name"` (spec §2.4), and the ingress half of `app` (spec §2.2).
//!
//! voodu has no spec hash for ingresses; the agent hashes the whole spec, so any change to a
//! route is a new release of it.

use serde::{Deserialize, Serialize};

use super::KindSpec;
use super::common::{is_false, is_zero};
use super::hash::go_json_sha256;
use crate::model::{ResourceKey, SpecHash};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IngressSpec {
    /// One host per ingress; wildcards (`*.example.com`) are passed through.
    pub host: String,
    /// The deployment (same scope) it routes to; empty means the ingress's own name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service: String,
    /// 0 means the deployment's first container port, else 80 (spec §7.14).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub port: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tls: Option<Tls>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) locations: Vec<Location>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) lb: Option<LoadBalancing>,
}

impl IngressSpec {
    /// The deployment this ingress routes to.
    pub(crate) fn effective_service<'a>(&'a self, name: &'a str) -> &'a str {
        if self.service.is_empty() {
            name
        } else {
            &self.service
        }
    }
}

impl KindSpec for IngressSpec {
    const HASHED: &'static [&'static str] = &["host", "service", "port", "tls", "locations", "lb"];
    const HASHES_CONTAINER: bool = false;

    fn spec_hash(&self, _: &ResourceKey) -> SpecHash {
        go_json_sha256(self)
    }

    fn summary(&self) -> String {
        let service = if self.service.is_empty() {
            "of the same name"
        } else {
            &self.service
        };
        format!("route {} to deployment {service}", self.host)
    }
}

/// `tls {}`: `enabled` defaults to true when the block is present.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Tls {
    pub(crate) enabled: bool,
    /// `letsencrypt` (default) or `internal`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) provider: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) email: String,
    #[serde(default, skip_serializing_if = "is_false")]
    pub(crate) on_demand: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) ask: String,
}

/// `location {}`: a path prefix, optionally stripped before proxying.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Location {
    pub(crate) path: String,
    #[serde(default, skip_serializing_if = "is_false")]
    pub(crate) strip: bool,
}

/// `lb {}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LoadBalancing {
    /// `round_robin` (default), `random`, `least_conn`, `ip_hash`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) policy: String,
    /// Active health-check interval (Go duration); empty means none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) interval: String,
}
