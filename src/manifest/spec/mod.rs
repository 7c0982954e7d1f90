//! Per-kind spec types: what a resource asks of the host, after decoding and parser defaults,
//! in voodu's wire JSON shape (spec §1.9, §2).
//!
//! Invariant: a `Spec` round-trips through JSON unchanged; that JSON is what the store keeps
//! as desired state, compares to decide what changed, and snapshots in releases.

mod asset;
pub(crate) mod backup;
pub(crate) mod bounds;
mod common;
mod deployment;
pub(crate) mod hash;
mod image_update;
mod ingress;
mod job;
mod plugin;
mod registry;
pub(crate) mod rollout;
pub(crate) mod schedule;
mod statefulset;

pub(crate) use asset::{AssetFile, AssetSpec};
pub(crate) use backup::{Backup, BackupMode, Keep};
pub(crate) use common::{
    Autoscale, Build, Container, DEFAULT_NETWORK, DEPENDABLE, DependsOn, Drain, EncryptedEnv,
    ExecAction, HttpGet, Init, Lang, Limits, Logs, OnDeploy, OnProbe, Probe, Probes, ReleaseHooks,
    Resources, TcpSocket, VolumeClaim, WebhookTarget, container_port, normalize_port,
    parse_dependency,
};
pub(crate) use deployment::DeploymentSpec;
pub use hash::sha256_hex;
pub use image_update::{
    DEFAULT_INTERVAL as DEFAULT_IMAGE_SCAN_INTERVAL, ImageUpdate,
    MIN_INTERVAL as MIN_IMAGE_SCAN_INTERVAL,
};
pub(crate) use ingress::{IngressSpec, LoadBalancing, Location, Tls};
pub use job::{CronjobSpec, JobSpec};
pub(crate) use plugin::{PluginBlock, plugin_refusal};
pub use registry::RegistrySpec;
pub(crate) use rollout::Strategy;
pub(crate) use statefulset::{Macro, StatefulsetSpec};

use std::collections::BTreeMap;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::model::{Kind, ResourceKey, SpecHash};

/// The kind table: one row a kind, `module: Variant(SpecType)`. `Variant` is the kind's
/// `model::Kind` and `Spec` variant; `module` names the kind's file in the rooms that have one
/// per kind, `manifest/decode/kinds/` and `reconcile/handlers/`, which declare their modules
/// and dispatch from this table (`for_each_kind!(their_macro)` hands it the rows). Adding a
/// kind is a row here; ARCHITECTURE.md's "Adding a kind" lists the rest.
macro_rules! for_each_kind {
    ($then:ident) => {
        $then! {
            asset: Asset(AssetSpec),
            cronjob: Cronjob(CronjobSpec),
            deployment: Deployment(DeploymentSpec),
            ingress: Ingress(IngressSpec),
            job: Job(JobSpec),
            registry: Registry(RegistrySpec),
            statefulset: Statefulset(StatefulsetSpec),
        }
    };
}
pub(crate) use for_each_kind;

/// What every kind's spec type answers; `Spec` hands each question to its variant's type.
pub(crate) trait KindSpec: Serialize + DeserializeOwned {
    /// Its own top-level JSON fields that feed its spec hash (`Spec::is_hashed_field`).
    const HASHED: &'static [&'static str];
    /// Whether its container's fields stand at its root and feed its hash too
    /// (`CONTAINER_HASHED`).
    const HASHES_CONTAINER: bool;

    /// The hash that decides whether its containers (or run) must be replaced.
    fn spec_hash(&self, key: &ResourceKey) -> SpecHash;

    /// Its container's fields. A kind that runs one answers it (and `asset_digests_mut`): the
    /// host claims of its ports and volumes, the SOPS env files kept for it and the asset
    /// digests stamped into it are read from there; `None` for a kind that runs none.
    fn container(&self) -> Option<&Container> {
        None
    }

    /// Its `_asset_digests`, for kinds whose containers read assets.
    fn asset_digests_mut(&mut self) -> Option<&mut BTreeMap<String, String>> {
        None
    }

    /// One line for `plan`: what it asks of the host.
    fn summary(&self) -> String;
}

/// The image as `plan` names it: a build's image is the one built for the resource.
pub(crate) fn image_text(image: &str) -> &str {
    if image.is_empty() {
        "the built image (<scope>-<name>:latest)"
    } else {
        image
    }
}

/// Makes `Spec` from the kind table: the enum, and each question of `KindSpec` handed to the
/// variant's type.
macro_rules! spec_enum {
    ($($module:ident: $variant:ident($spec:ident)),* $(,)?) => {
        /// The decoded spec of one resource. Closed: a new kind adds a row to the kind table
        /// and the compiler shows every place that must handle it.
        #[derive(Debug, Clone, PartialEq, Eq)]
        // `allow`, not `expect`: whether the lint fires depends on how close the two largest
        // specs are in size. Their large optional blocks (probes, backup, strategy) are boxed
        // instead: the decode cache keeps each resource's spec for as long as its file is
        // unchanged (`tests::a_spec_keeps_its_optional_blocks_out_of_line`).
        #[allow(
            clippy::large_enum_variant,
            reason = "the variants' own sizes are what a cached resource costs; boxing a variant would add an allocation to each"
        )]
        pub enum Spec {
            $($variant($spec),)*
        }

        impl Spec {
            pub fn kind(&self) -> Kind {
                match self {
                    $(Spec::$variant(_) => Kind::$variant,)*
                }
            }

            /// Canonical JSON: the store compares these strings to decide what changed.
            pub(crate) fn to_json(&self) -> String {
                let result = match self {
                    $(Spec::$variant(spec) => serde_json::to_string(spec),)*
                };
                result.expect("spec types hold only strings, numbers and maps with string keys")
            }

            /// `to_json` as a JSON value, without the text in between.
            pub(crate) fn to_json_value(&self) -> serde_json::Value {
                let result = match self {
                    $(Spec::$variant(spec) => serde_json::to_value(spec),)*
                };
                result.expect("spec types hold only strings, numbers and maps with string keys")
            }

            pub(crate) fn from_json(kind: Kind, json: &str) -> Result<Spec, SpecDecodeError> {
                let wrap = |source| SpecDecodeError { kind, source };
                match kind {
                    $(Kind::$variant => serde_json::from_str(json).map(Spec::$variant),)*
                }
                .map_err(wrap)
            }

            /// The hash that decides whether a resource's containers (or run) must be replaced.
            pub(crate) fn spec_hash(&self, key: &ResourceKey) -> SpecHash {
                match self {
                    $(Spec::$variant(spec) => spec.spec_hash(key),)*
                }
            }

            /// Whether `field`, a top-level JSON field of this kind, feeds its spec hash: a
            /// change to one that does replaces containers (or re-runs a job); a change to any
            /// other does not. The unit tests of each kind prove the same split.
            pub(crate) fn is_hashed_field(kind: Kind, field: &str) -> bool {
                let (own, container) = match kind {
                    $(Kind::$variant => (<$spec as KindSpec>::HASHED, <$spec as KindSpec>::HASHES_CONTAINER),)*
                };
                own.contains(&field) || (container && CONTAINER_HASHED.contains(&field))
            }

            /// The container fields of container kinds.
            pub fn container(&self) -> Option<&Container> {
                match self {
                    $(Spec::$variant(spec) => spec.container(),)*
                }
            }

            /// The `_asset_digests` of consumer kinds.
            pub(crate) fn asset_digests_mut(&mut self) -> Option<&mut BTreeMap<String, String>> {
                match self {
                    $(Spec::$variant(spec) => spec.asset_digests_mut(),)*
                }
            }

            /// One line for `plan`: what the resource asks of the host.
            pub(crate) fn summary(&self) -> String {
                match self {
                    $(Spec::$variant(spec) => spec.summary(),)*
                }
            }
        }
    };
}
for_each_kind!(spec_enum);

/// A stored spec that cannot be read back (a schema change or a hand-edited database).
#[derive(Debug, thiserror::Error)]
#[error("stored {kind} spec is not readable: {source}")]
pub struct SpecDecodeError {
    pub(crate) kind: Kind,
    #[source]
    pub(crate) source: serde_json::Error,
}

impl Spec {
    /// Replicas the spec asks for (1 for kinds without replicas).
    pub(crate) fn n_replicas(&self) -> usize {
        match self {
            Spec::Deployment(spec) => spec.n_replicas(),
            Spec::Statefulset(spec) => spec.n_replicas(),
            _ => 1,
        }
    }

    /// Its `backup {}` (a statefulset's claims, or a named volume a deployment mounts).
    /// A deployment's progressive-delivery strategy (`canary {}` / `blue_green {}`), if any.
    pub fn strategy(&self) -> Option<&Strategy> {
        match self {
            Spec::Deployment(spec) => spec.strategy.as_deref(),
            _ => None,
        }
    }

    pub fn backup(&self) -> Option<&Backup> {
        match self {
            Spec::Deployment(spec) => spec.backup.as_deref(),
            Spec::Statefulset(spec) => spec.backup.as_deref(),
            _ => None,
        }
    }

    /// What this spec takes on the host that only one source may hold (`--sources`): its
    /// ingress host (lower case, without a trailing dot: every path under it comes with it),
    /// the host ports it publishes (`tcp/8080`: one per protocol and port, whatever the
    /// address), and the named volumes it mounts (a statefulset's claims are named after its
    /// scope, so they are the scope's already). Pure; the store records them first come.
    pub fn claims(&self) -> Vec<Claim> {
        let mut claims = Vec::new();
        if let Spec::Ingress(ingress) = self {
            claims.push(Claim {
                what: ClaimKind::Host,
                value: normalize_host(&ingress.host),
            });
        }
        let ports = match self {
            Spec::Deployment(spec) => spec.normalized_ports(),
            Spec::Statefulset(spec) => spec.normalized_ports(),
            _ => Vec::new(),
        };
        for mapping in ports
            .iter()
            .filter_map(|port| crate::model::parse_ports(port))
            .flatten()
        {
            if let Some(host_port) = mapping.host_port {
                claims.push(Claim {
                    what: ClaimKind::Port,
                    value: format!("{}/{host_port}", mapping.protocol),
                });
            }
        }
        if let Some(container) = self.container() {
            for volume in &container.volumes {
                let source = crate::model::policy::bind_source_text(volume);
                if !source.is_empty() && !source.starts_with('/') && !source.contains("${") {
                    claims.push(Claim {
                        what: ClaimKind::Volume,
                        value: source.to_owned(),
                    });
                }
            }
        }
        claims.sort_unstable();
        claims.dedup();
        claims
    }

    /// The digests of the SOPS env files the container reads (their blobs must be kept).
    pub(crate) fn sealed_digests(&self) -> Vec<&str> {
        self.container()
            .map(|container| {
                container
                    .env_sealed
                    .iter()
                    .map(|sealed| sealed.digest.as_str())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The top-level fields every container kind (deployment, statefulset, job) hashes: the
/// container's own, but `env_from` (not in voodu's statefulset hash), and the asset digests.
const CONTAINER_HASHED: &[&str] = &[
    "image",
    "command",
    "volumes",
    "env",
    "network",
    "networks",
    "network_mode",
    "extra_hosts",
    "cap_add",
    "ulimits",
    "docker_options",
    "resources",
    "logs",
    "_asset_digests",
];

/// What one source holds on the host alone (`Spec::claims`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Claim {
    pub what: ClaimKind,
    pub value: String,
}

/// The kinds of claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ClaimKind {
    /// An ingress host, with every path under it.
    Host,
    /// A published host port, `proto/port`.
    Port,
    /// A named volume.
    Volume,
}

impl ClaimKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimKind::Host => "host",
            ClaimKind::Port => "port",
            ClaimKind::Volume => "volume",
        }
    }

    pub fn parse(text: &str) -> Option<ClaimKind> {
        match text {
            "host" => Some(ClaimKind::Host),
            "port" => Some(ClaimKind::Port),
            "volume" => Some(ClaimKind::Volume),
            _ => None,
        }
    }
}

impl std::fmt::Display for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.what {
            ClaimKind::Host => write!(f, "ingress host {}", self.value),
            ClaimKind::Port => {
                let (protocol, port) = self.value.split_once('/').unwrap_or(("tcp", &self.value));
                write!(f, "host port {port}/{protocol}")
            }
            ClaimKind::Volume => write!(f, "volume {}", self.value),
        }
    }
}

impl Claim {
    /// Whether `self` and `other` cannot be held by two sources: the same value, or for hosts
    /// a wildcard (`*.example.com`) that covers the other host.
    pub fn collides(&self, other: &Claim) -> bool {
        if self.what != other.what {
            return false;
        }
        if self.value == other.value {
            return true;
        }
        self.what == ClaimKind::Host
            && (wildcard_covers(&self.value, &other.value)
                || wildcard_covers(&other.value, &self.value))
    }
}

/// Whether the host pattern `wildcard` (`*.example.com`) matches `host` (one label in place of
/// the `*`, as Caddy matches it).
fn wildcard_covers(wildcard: &str, host: &str) -> bool {
    let Some(suffix) = wildcard.strip_prefix('*') else {
        return false;
    };
    host.strip_suffix(suffix)
        .is_some_and(|label| !label.is_empty() && !label.contains('.'))
}

/// A host as the proxy compares it: lower case, without a trailing dot.
pub fn normalize_host(host: &str) -> String {
    host.trim().trim_end_matches('.').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deployment or statefulset without probes, backup or strategy (most of them) pays 8
    /// bytes for each, not the block: the decode cache holds each resource's spec for as long
    /// as its file is unchanged, so at 1,000 deployments the 1,072 bytes boxed away are
    /// ≈ 1 MiB of the agent's memory.
    #[test]
    fn a_spec_keeps_its_optional_blocks_out_of_line() {
        let spec = std::mem::size_of::<Spec>();
        assert!(
            spec <= 1400,
            "a spec is {spec} bytes (2,376 with its blocks inline)"
        );
    }

    /// Removes each top-level field of a fully populated spec in turn: the spec hash must
    /// change exactly for the fields `is_hashed_field` names, so `plan`'s "replace because …"
    /// names the same fields the hash covers.
    fn check_hashed_fields(kind: Kind, full: &str) {
        let key = ResourceKey::new(kind, "s", "n");
        let spec = Spec::from_json(kind, full).expect("the full spec is valid");
        let before = spec.spec_hash(&key);
        let serde_json::Value::Object(map) =
            serde_json::from_str::<serde_json::Value>(full).expect("json")
        else {
            panic!("an object");
        };
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&spec.to_json()).expect("json"),
            serde_json::Value::Object(map.clone()),
            "the fixture sets every field it names, in canonical form"
        );
        for field in map.keys() {
            let mut without = map.clone();
            without.remove(field);
            let json = serde_json::Value::Object(without).to_string();
            let Ok(changed) = Spec::from_json(kind, &json) else {
                continue; // a required field: cannot be removed
            };
            let hashed = Spec::is_hashed_field(kind, field);
            assert_eq!(
                changed.spec_hash(&key) != before,
                hashed,
                "{kind}: removing `{field}` {} the hash",
                if hashed {
                    "must change"
                } else {
                    "must not change"
                }
            );
        }
    }

    #[test]
    fn hashed_fields_match_what_the_hashes_cover() {
        let container = r#""image":"img","command":["run"],"env":{"A":"1"},"env_from":["s/shared"],"volumes":["/a:/a"],"networks":["n"],"extra_hosts":["h:1.1.1.1"],"cap_add":["NET_ADMIN"],"ulimits":{"nofile":"1:1"},"docker_options":["--shm-size=1g"],"depends_on":{"assets":["a.b"]},"resources":{"limits":{"cpu":"1"}},"logs":{"max_size":"1m","max_files":2}"#;
        let probes = r#""probes":{"readiness":{"tcp_socket":{"port":80}}}"#;
        let inits = r#""inits":[{"name":"i","command":["true"]}]"#;
        check_hashed_fields(
            Kind::Deployment,
            &format!(
                r#"{{{container},"replicas":2,"ports":["80"],"restart":"always","health_check":"/up","post_deploy":["x"],"keep_releases":3,"release":{{"command":["m"]}},"autoscale":{{"min":1,"max":2,"cpu_target":50}},"on_deploy":{{"success":[{{"url":"http://x"}}]}},"on_probe":{{"failure":[{{"url":"http://x"}}]}},{probes},{inits},"_asset_digests":{{"a.b":"00"}}}}"#
            ),
        );
        check_hashed_fields(
            Kind::Statefulset,
            &format!(
                r#"{{{container},"replicas":2,"ports":["80"],"restart":"always","health_check":"/up","volume_claims":[{{"name":"d","mount_path":"/d"}}],{inits},{probes},"on_probe":{{"failure":[{{"url":"http://x"}}]}},"backup":{{"repository":"/srv/b","password_file":"/etc/p","schedule":"0 3 * * *","mode":"exec","command":["dump"],"restore_command":["load"],"before_release":true,"verify":"weekly","timeout":"2h","keep":{{"last":7,"daily":0,"weekly":0,"monthly":0}}}},"_asset_digests":{{"a.b":"00"}}}}"#
            ),
        );
        check_hashed_fields(
            Kind::Job,
            &format!(
                r#"{{{container},"timeout":"1m","successful_history_limit":5,"failed_history_limit":2,"_asset_digests":{{"a.b":"00"}}}}"#
            ),
        );
    }

    #[test]
    fn every_kind_round_trips_through_json() {
        let mut deployment = DeploymentSpec::default();
        deployment.container.image = "busybox".into();
        deployment.asset_digests.insert("a.b".into(), "00".into());
        let specs = [
            Spec::Asset(AssetSpec::default()),
            Spec::Cronjob(CronjobSpec {
                schedule: "@daily".into(),
                ..CronjobSpec::default()
            }),
            Spec::Deployment(deployment),
            Spec::Ingress(IngressSpec {
                host: "x.example".into(),
                ..IngressSpec::default()
            }),
            Spec::Job(JobSpec::default()),
            Spec::Registry(RegistrySpec {
                url: "ghcr.io".into(),
                ..RegistrySpec::default()
            }),
            Spec::Statefulset(StatefulsetSpec::default()),
        ];
        for spec in specs {
            let json = spec.to_json();
            let back = Spec::from_json(spec.kind(), &json).expect("reads back");
            assert_eq!(back, spec, "{json}");
            assert_eq!(back.to_json(), json);
        }
    }
}
