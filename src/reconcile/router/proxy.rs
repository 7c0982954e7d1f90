//! The ingress proxy as the rest of the stage sees it: how it runs on this host
//! (`IngressOptions`), its name and role, and what the router last did (`RouterReport`,
//! `ProxyInfo`). The shared context and the wake-ups hold these; nothing here knows either.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::model::ResourceKey;

/// The proxy image when none is given: Caddy 2, the proxy voodu drives.
pub(crate) const DEFAULT_IMAGE: &str = "caddy:2";
/// `voodu.role` of the proxy container or service.
pub const ROLE: &str = "ingress";

/// How the ingress proxy runs on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IngressOptions {
    /// The Caddy 2 image (`caddy:2`; `scripts/docker-setup` builds `voodu-caddy:latest` from
    /// Debian's package, for hosts without a registry).
    pub image: String,
    /// Host address publishing Caddy's HTTP listener (port 0: the engine picks one).
    pub http: SocketAddr,
    /// Host address publishing Caddy's HTTPS listener (port 0: the engine picks one).
    pub https: SocketAddr,
    /// `<data-dir>/ingress`, absolute: Caddy's data (certificates, ACME account) and config,
    /// bind-mounted into the container.
    pub state_dir: PathBuf,
    /// A full pass, including a check of Caddy's live config, at least this often.
    pub resync: Duration,
    /// Run the router task (the default). Off, ingresses are planned and report that the
    /// proxy has not loaded their routes yet: the handler alone, for tests on the fake
    /// runtime, which has no proxy to talk to.
    pub run_router: bool,
}

impl IngressOptions {
    /// voodu's defaults: `caddy:2` on every interface's ports 80 and 443.
    pub fn new(state_dir: PathBuf) -> IngressOptions {
        IngressOptions {
            image: DEFAULT_IMAGE.to_owned(),
            http: SocketAddr::from(([0, 0, 0, 0], 80)),
            https: SocketAddr::from(([0, 0, 0, 0], 443)),
            state_dir,
            resync: Duration::from_secs(30),
            run_router: true,
        }
    }
}

/// What the router last did, for ingress statuses (and tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouterReport {
    /// Passes finished, successful or not.
    pub passes: u64,
    /// Configs Caddy accepted through `POST /load` (under Swarm: proxy service updates).
    pub pushes: u64,
    /// Per ingress, a fingerprint of the routes Caddy serves for it now (see `fingerprint`).
    pub(crate) live: BTreeMap<ResourceKey, u64>,
    /// Why the last pass failed; `None` after a successful one.
    pub error: Option<String>,
    /// The proxy while it runs.
    pub proxy: Option<ProxyInfo>,
    /// The router wake generation the pass started from (`RouterWake::wake_generation`).
    pub(crate) served_wake: u64,
}

/// The proxy (its container, or under Swarm its service) and where it is published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyInfo {
    pub(crate) container: String,
    /// `ip:port` on the host of Caddy's HTTP listener (under Swarm, on every node running
    /// a task of the proxy service).
    pub http: Option<String>,
    /// `ip:port` on the host of Caddy's HTTPS listener.
    pub(crate) https: Option<String>,
}

/// The proxy container's (or service's) name for this agent.
pub fn container_name(agent_id: &str) -> String {
    format!("voodu-caddy-{agent_id}")
}
