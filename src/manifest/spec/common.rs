//! Fields and sub-blocks shared by the container kinds (deployment, statefulset, job,
//! cronjob): voodu's §2.0 container fields and the §2.10 blocks, in voodu's wire JSON shape.
//!
//! Invariant: these types hold decoded values after parser defaults (spec §2.1 `logs`,
//! `build.context`) but before controller defaults; the `effective_*` methods apply the
//! controller defaults, and the spec hash is computed from them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{Kind, ResourceKey};

pub(crate) use crate::model::DEFAULT_NETWORK;
/// voodu's controller default restart policy.
pub(crate) const DEFAULT_RESTART: &str = "unless-stopped";

/// An `env_file` encrypted with SOPS: its repo path, the sha256 of its (encrypted) bytes, and
/// the variables it supplies.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct EncryptedEnv {
    pub(crate) path: String,
    pub(crate) digest: String,
    pub(crate) keys: Vec<String>,
}

/// voodu's §2.0 container fields, common to every container kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Container {
    /// Empty means voodu's build mode; the controller default is `<AppID>:latest`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// The manifest's `env`, with `env_file` contents merged under it (spec §4.1).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// `env_file`s encrypted with SOPS, and the variables each supplies after the merge (a
    /// key `env` or a later file sets is not listed). Their values are never in the spec:
    /// the encrypted file travels by digest (`Manifest::blobs`) and is decrypted when a
    /// container is created (agent extension; out of voodu's spec hash, covered by the
    /// keyed `voodu.env_digest` as config buckets are).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) env_sealed: Vec<EncryptedEnv>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_from: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) network: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) networks: Vec<String>,
    /// `""`, `host` or `none`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) network_mode: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) extra_hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) cap_add: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) ulimits: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub docker_options: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) build: Option<Build>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) depends_on: Option<DependsOn>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) resources: Option<Resources>,
    /// Always present after the parser default (`max_size = "10m"`, `max_files = 3`).
    #[serde(default)]
    pub(crate) logs: Logs,
    /// `image_update { … }` (agent extension): follow the image's tags; out of the spec hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_update: Option<super::ImageUpdate>,
}

impl Container {
    /// The image to run: the manifest's, or voodu's build-mode default `<AppID>:latest`.
    pub(crate) fn effective_image(&self, key: &ResourceKey) -> String {
        if self.image.is_empty() {
            format!("{}:latest", key.app_id())
        } else {
            self.image.clone()
        }
    }

    /// Bridge mode: `networks` (or the legacy `network`) with `voodu0` appended when absent;
    /// the first entry is the primary network. Host or none mode: no networks.
    pub(crate) fn effective_networks(&self) -> Vec<String> {
        if !self.network_mode.is_empty() {
            return Vec::new();
        }
        let mut networks = if self.networks.is_empty() {
            (!self.network.is_empty())
                .then(|| self.network.clone())
                .into_iter()
                .collect::<Vec<_>>()
        } else {
            self.networks.clone()
        };
        if !networks.iter().any(|network| network == DEFAULT_NETWORK) {
            networks.push(DEFAULT_NETWORK.to_owned());
        }
        networks
    }
}

/// `build {}` (spec §2.10.1). The agent does not build images: a build-mode resource runs
/// `<AppID>:latest`, which must already exist on the host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Build {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) context: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) dockerfile: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) path: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) args: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) lang: Option<Lang>,
}

/// `build { lang {} }`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Lang {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) entrypoint: String,
}

/// `depends_on { assets = [...] }` (spec §2.10.3): `name.key` or `scope.name.key`; and
/// `resources = [...]` (an extension: start-up order), `kind/scope/name` or `kind/name` (the
/// dependent's own scope), each a deployment or a statefulset. Out of every spec hash.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DependsOn {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) assets: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) resources: Vec<String>,
}

/// The kinds `depends_on.resources` may name: those with a `Ready` state to wait for.
pub(crate) const DEPENDABLE: [Kind; 2] = [Kind::Deployment, Kind::Statefulset];

/// Why a `depends_on.resources` entry cannot name a resource: a form that is not
/// `kind/scope/name` or `kind/name`, a kind that is not one, or one that has no `Ready`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DependencyError {
    Form(usize),
    UnknownKind(String),
    NotDependable(Kind),
    Name(String, &'static str),
}

impl std::fmt::Display for DependencyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DependencyError::Form(n) => write!(
                f,
                "expected `kind/scope/name` or `kind/name` (its own scope), got {n} segment(s) separated by '/'"
            ),
            DependencyError::UnknownKind(kind) => {
                let near =
                    crate::manifest::decode::reader::closest(kind, &["deployment", "statefulset"]);
                let hint = match kind.as_str() {
                    "postgres" | "redis" => " (a postgres or redis block declares a statefulset: write `statefulset/<scope>/<name>`)".to_owned(),
                    "app" => " (an app block declares a deployment: write `deployment/<scope>/<name>`)".to_owned(),
                    _ => near.map(|near| format!(" (did you mean `{near}`?)")).unwrap_or_default(),
                };
                write!(
                    f,
                    "`{kind}` is not a kind that can be waited for: write `deployment/…` or `statefulset/…`{hint}"
                )
            }
            DependencyError::NotDependable(kind) => write!(
                f,
                "a {kind} has no Ready state to wait for: only a deployment or a statefulset can be depended on"
            ),
            DependencyError::Name(name, why) => write!(f, "name {name:?} {why}"),
        }
    }
}

/// The resource a `depends_on.resources` entry names, for a dependent of `scope` (a
/// `kind/name` entry names one of that scope).
pub(crate) fn parse_dependency(entry: &str, scope: &str) -> Result<ResourceKey, DependencyError> {
    let segments: Vec<&str> = entry.split('/').collect();
    let (kind, written, name) = match segments.as_slice() {
        [kind, written, name] => (*kind, Some(*written), *name),
        [kind, name] => (*kind, None, *name),
        _ => return Err(DependencyError::Form(segments.len())),
    };
    let kind = Kind::ALL
        .into_iter()
        .find(|known| known.as_str() == kind)
        .ok_or_else(|| DependencyError::UnknownKind(kind.to_owned()))?;
    if !DEPENDABLE.contains(&kind) {
        return Err(DependencyError::NotDependable(kind));
    }
    for part in written.into_iter().chain([name]) {
        crate::manifest::validate::check_name(part)
            .map_err(|why| DependencyError::Name(part.to_owned(), why))?;
    }
    Ok(ResourceKey::new(kind, written.unwrap_or(scope), name))
}

impl DependsOn {
    /// The resources `resources` names, for a dependent of `scope`, in order (an entry that
    /// does not parse, which validation refused, is skipped).
    pub(crate) fn resource_keys(&self, scope: &str) -> Vec<ResourceKey> {
        self.resources
            .iter()
            .filter_map(|entry| parse_dependency(entry, scope).ok())
            .collect()
    }
}

/// `resources { limits { cpu, memory } }` (spec §2.10.4).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Resources {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) limits: Option<Limits>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Limits {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) cpu: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) memory: String,
}

/// `logs {}` (spec §2.10.6) after parser defaults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Logs {
    pub(crate) max_size: String,
    pub(crate) max_files: i64,
}

impl Default for Logs {
    fn default() -> Logs {
        Logs {
            max_size: "10m".to_owned(),
            max_files: 3,
        }
    }
}

/// `probes {}` (spec §2.10.7).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probes {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) liveness: Option<Probe>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<Probe>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) startup: Option<Probe>,
}

/// One probe: exactly one action plus timing. Durations are kept as written (Go syntax);
/// absent timing fields take voodu's defaults at run time.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) http_get: Option<HttpGet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tcp_socket: Option<TcpSocket>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecAction>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) initial_delay: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) period: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) timeout: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) failure_threshold: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) success_threshold: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HttpGet {
    pub(crate) path: String,
    pub(crate) port: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) scheme: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) http_headers: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TcpSocket {
    pub(crate) port: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecAction {
    pub command: Vec<String>,
}

/// `init "name" {}` (spec §2.10.8), in declaration order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Init {
    pub(crate) name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) image: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) command: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) timeout: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) retries: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) resources: Option<Resources>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) ulimits: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) docker_options: Vec<String>,
}

/// `autoscale {}` (spec §2.10.5).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Autoscale {
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) min: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) max: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) cpu_target: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) cooldown_up: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) cooldown_down: String,
}

/// `release {}` (spec §2.10.2).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ReleaseHooks {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) command: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) pre_command: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) post_command: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) timeout: String,
}

/// `drain { grace, timeout }` on a deployment or statefulset (voodu 2026, `drain.mdx`): how
/// a replica is stopped when it is replaced, scaled away or pruned. Not in the spec hash: it
/// says how replicas stop, not what runs, so changing it replaces nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drain {
    /// The SIGTERM → SIGKILL gap (`docker stop -t`); empty = Docker's 10 s.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub grace: String,
    /// How long to wait for the replica to go quiet once it stops receiving work; only
    /// meaningful where something reports "quiet" (validated, carried, not acted on here).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub timeout: String,
}

/// Docker's own stop grace, used when `drain.grace` is unset or zero (never 0).
pub(crate) const DEFAULT_STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

impl Drain {
    /// The SIGTERM → SIGKILL gap of a replica of a resource with `drain` (or none).
    pub(crate) fn grace_of(drain: Option<&Drain>) -> std::time::Duration {
        drain
            .and_then(|drain| crate::model::parse_go_duration(&drain.grace))
            .filter(|grace| !grace.is_zero())
            .unwrap_or(DEFAULT_STOP_GRACE)
    }
}

/// `on_deploy {}`: webhook targets fired after a rollout (spec §2.10.9).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OnDeploy {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) success: Vec<WebhookTarget>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) failure: Vec<WebhookTarget>,
}

/// `on_probe {}`: webhook targets fired on probe transitions (spec §2.10.9).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OnProbe {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) failure: Vec<WebhookTarget>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) recovery: Vec<WebhookTarget>,
}

/// One webhook target.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WebhookTarget {
    pub(crate) url: String,
    /// Upper-cased; empty means POST.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) method: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) headers: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) body: Option<serde_json::Value>,
    /// An `${asset.…}` reference to a JSON template.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) file: String,
}

/// `volume_claim "name" {}` (spec §2.3).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeClaim {
    pub(crate) name: String,
    pub mount_path: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) size: String,
}

pub(crate) fn is_zero(value: &i64) -> bool {
    *value == 0
}

pub(crate) fn is_false(value: &bool) -> bool {
    !*value
}

/// A replica count as voodu's controller reads it: omitted or below 1 means 1. Clamped to
/// `MAX_REPLICAS`: validation refuses more, but desired state an older agent stored may hold
/// any number, and planning allocates per replica.
pub(crate) fn replica_count(replicas: Option<i64>) -> usize {
    replicas.map_or(1, |replicas| clamp_replicas(replicas.max(1)))
}

/// `n` within `1..=MAX_REPLICAS`.
pub(crate) fn clamp_replicas(n: i64) -> usize {
    usize::try_from(n.clamp(1, super::bounds::MAX_REPLICAS)).unwrap_or(1)
}

/// A restart policy, voodu's default when the manifest leaves it out.
pub(crate) fn restart_or_default(restart: &str) -> &str {
    if restart.is_empty() {
        DEFAULT_RESTART
    } else {
        restart
    }
}

/// Ports after voodu's loopback normalisation (`normalize_port` each).
pub(crate) fn normalized_ports(ports: &[String]) -> Vec<String> {
    ports.iter().map(|port| normalize_port(port)).collect()
}

/// voodu's `normalizePort`: `[…` unchanged; no `:` → `127.0.0.1::<p>`; one `:` →
/// `127.0.0.1:<p>`; two or more → unchanged (spec §6.4).
pub(crate) fn normalize_port(port: &str) -> String {
    if port.starts_with('[') {
        return port.to_owned();
    }
    match port.matches(':').count() {
        0 => format!("127.0.0.1::{port}"),
        1 => format!("127.0.0.1:{port}"),
        _ => port.to_owned(),
    }
}

/// The container port of a raw `ports` entry (after `/proto`, the part after the last `:`),
/// as voodu's ingress resolves it (spec §7.14).
pub(crate) fn container_port(port: &str) -> Option<u16> {
    let address = port.split('/').next().unwrap_or(port);
    address.rsplit(':').next()?.parse().ok()
}
