//! `deployment "scope" "name" { … }` (spec §2.1): the decoded spec, voodu's controller
//! defaults, and voodu's deployment spec hash.
//!
//! Invariant: the spec hash follows voodu's `deploymentSpecHash` (spec §5.2): the same JSON
//! keys in the same order, computed after controller defaults and before asset refs are
//! resolved; `replicas`, `health_check`, `release`, `post_deploy`, `keep_releases`,
//! `on_deploy`, `on_probe`, `depends_on` and `build` stay out of it, so scaling never replaces
//! a running replica.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::common::{
    Autoscale, Container, Drain, Init, Logs, OnDeploy, OnProbe, Probes, ReleaseHooks,
    clamp_replicas, is_zero, normalized_ports, replica_count, restart_or_default,
};
use super::hash::{HashedHostOptions, go_json_sha256, non_empty};
use super::plugin::PluginBlock;
use super::{KindSpec, image_text};
use crate::model::{ResourceKey, SpecHash};

/// A decoded deployment, as stored in desired state and in release snapshots.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentSpec {
    #[serde(flatten)]
    pub container: Container,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) ports: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) restart: String,
    /// voodu's parser default is `"/"`; only ingress health checks read it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) health_check: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) post_deploy: Vec<String>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) keep_releases: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) release: Option<ReleaseHooks>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) autoscale: Option<Autoscale>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) on_deploy: Option<OnDeploy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) on_probe: Option<OnProbe>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) probes: Option<Box<Probes>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) inits: Vec<Init>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<Drain>,
    /// `backup {}` of a named volume it mounts (an extension); never hashed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<Box<super::Backup>>,
    /// `canary {}` or `blue_green {}` (an extension); never hashed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<Box<super::Strategy>>,
    /// Plugin-owned nested blocks, in order (voodu 2026); never hashed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plugin_blocks: Vec<PluginBlock>,
    /// `ref → sha256` of every asset this spec refers to, stamped at sync time (spec §5.3).
    #[serde(
        rename = "_asset_digests",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub asset_digests: BTreeMap<String, String>,
}

impl DeploymentSpec {
    /// Desired replica count: omitted or below 1 means 1, as voodu's controller does.
    pub(crate) fn n_replicas(&self) -> usize {
        replica_count(self.replicas)
    }

    /// Replicas to run given the autoscaler's count (`scaled`): that count within the
    /// current `autoscale` bounds while `autoscale` is set, else `n_replicas`.
    pub(crate) fn effective_replicas(&self, scaled: Option<usize>) -> usize {
        match (&self.autoscale, scaled) {
            (Some(autoscale), Some(scaled)) => {
                let low = clamp_replicas(autoscale.min);
                let high = clamp_replicas(autoscale.max).max(low);
                scaled.clamp(low, high)
            }
            _ => self.n_replicas(),
        }
    }

    pub(crate) fn effective_restart(&self) -> &str {
        restart_or_default(&self.restart)
    }

    /// Whether a replacement starts the successor before the outdated replica goes (voodu
    /// 2026 `drain.mdx`): yes, unless a host port is pinned (`"3000:8080"`: two replicas
    /// cannot bind it at once) or the container shares the host's network (every port it
    /// listens on is the host's).
    pub(crate) fn surges(&self) -> bool {
        self.container.network_mode != "host"
            && !self
                .normalized_ports()
                .iter()
                .any(|port| pins_host_port(port))
    }

    /// Ports after voodu's loopback normalisation (spec §6.4); none in host/none mode.
    pub(crate) fn normalized_ports(&self) -> Vec<String> {
        normalized_ports(&self.ports)
    }
}

impl KindSpec for DeploymentSpec {
    const HASHED: &'static [&'static str] = &[
        "ports",
        "env_from",
        "restart",
        "autoscale",
        "probes",
        "inits",
    ];
    const HASHES_CONTAINER: bool = true;

    /// voodu's deployment spec hash.
    fn spec_hash(&self, key: &ResourceKey) -> SpecHash {
        let container = &self.container;
        let mut networks = container.effective_networks();
        networks.sort_unstable();
        go_json_sha256(&HashedDeployment {
            image: container.effective_image(key),
            command: container.command.clone(),
            ports: non_empty(&self.normalized_ports()),
            volumes: non_empty(&container.volumes),
            env: (!container.env.is_empty()).then(|| container.env.clone()),
            env_from: non_empty(&container.env_from),
            networks: non_empty(&networks),
            network_mode: container.network_mode.clone(),
            restart: self.effective_restart().to_owned(),
            host_options: HashedHostOptions::of(container),
            autoscale: self.autoscale.clone(),
            logs: Some(container.logs.clone()),
            probes: self.probes.clone(),
            inits: non_empty(&self.inits),
            assets: asset_lines(&self.asset_digests),
        })
    }

    fn container(&self) -> Option<&Container> {
        Some(&self.container)
    }

    fn asset_digests_mut(&mut self) -> Option<&mut BTreeMap<String, String>> {
        Some(&mut self.asset_digests)
    }

    fn summary(&self) -> String {
        format!(
            "{} replica(s) of {}",
            self.n_replicas(),
            image_text(&self.container.image)
        )
    }
}

/// Whether a normalised `ports` entry (`ip:host:container[/proto]`) names a host port.
fn pins_host_port(port: &str) -> bool {
    let address = port.split('/').next().unwrap_or(port);
    let mut parts = address.rsplitn(3, ':');
    let _container = parts.next();
    parts.next().is_some_and(|host| !host.is_empty())
}

/// `["<ref>=<sha256>", …]` sorted, `None` when there are none (spec §5.2 #20).
pub(crate) fn asset_lines(digests: &BTreeMap<String, String>) -> Option<Vec<String>> {
    let mut lines: Vec<String> = digests
        .iter()
        .map(|(reference, digest)| format!("{reference}={digest}"))
        .collect();
    lines.sort_unstable();
    non_empty(&lines)
}

/// The JSON voodu hashes, field order included (Go marshals in declaration order).
#[derive(Serialize)]
struct HashedDeployment {
    image: String,
    command: Option<Vec<String>>,
    ports: Option<Vec<String>>,
    volumes: Option<Vec<String>>,
    env: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    env_from: Option<Vec<String>>,
    networks: Option<Vec<String>>,
    network_mode: String,
    restart: String,
    #[serde(flatten)]
    host_options: HashedHostOptions,
    #[serde(skip_serializing_if = "Option::is_none")]
    autoscale: Option<Autoscale>,
    #[serde(skip_serializing_if = "Option::is_none")]
    logs: Option<Logs>,
    #[serde(skip_serializing_if = "Option::is_none")]
    probes: Option<Box<Probes>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    inits: Option<Vec<Init>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    assets: Option<Vec<String>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::spec::common::{
        DEFAULT_NETWORK, DEFAULT_RESTART, HttpGet, OnDeploy, Probe, WebhookTarget,
    };
    use crate::manifest::spec::hash::check_hash_edits;
    use crate::model::Kind;

    fn key() -> ResourceKey {
        ResourceKey::new(Kind::Deployment, "shop", "web")
    }

    fn base() -> DeploymentSpec {
        let mut spec = DeploymentSpec {
            replicas: Some(2),
            ..DeploymentSpec::default()
        };
        spec.container.image = "busybox".into();
        spec.container.command = Some(vec!["sleep".into(), "1000".into()]);
        spec.container.env = BTreeMap::from([("A".into(), "1".into())]);
        spec
    }

    type Edit = fn(&mut DeploymentSpec);

    /// Every field of voodu's hash input, one edit each (spec §5.2).
    const HASHED: &[(&str, Edit)] = &[
        ("ports", |s| s.ports = vec!["80".into()]),
        ("env_from", |s| {
            s.container.env_from = vec!["shop/shared".into()]
        }),
        ("restart", |s| s.restart = "always".into()),
        ("autoscale", |s| {
            s.autoscale = Some(Autoscale {
                min: 1,
                max: 3,
                cpu_target: 50,
                ..Autoscale::default()
            });
        }),
        ("probes", |s| {
            s.probes = Some(Box::new(Probes {
                readiness: Some(Probe {
                    http_get: Some(HttpGet {
                        path: "/".into(),
                        port: 80,
                        ..HttpGet::default()
                    }),
                    ..Probe::default()
                }),
                ..Probes::default()
            }));
        }),
        ("inits", |s| {
            s.inits = vec![Init {
                name: "migrate".into(),
                command: vec!["true".into()],
                ..Init::default()
            }];
        }),
        ("_asset_digests", |s| {
            s.asset_digests = BTreeMap::from([("shop.cfg.k".into(), "ab".into())]);
        }),
    ];

    /// Fields voodu leaves out of the hash.
    const NOT_HASHED: &[(&str, Edit)] = &[
        ("replicas", |s| s.replicas = Some(7)),
        ("health_check", |s| s.health_check = "/up".into()),
        ("post_deploy", |s| s.post_deploy = vec!["x".into()]),
        ("keep_releases", |s| s.keep_releases = 9),
        ("release", |s| {
            s.release = Some(ReleaseHooks {
                command: vec!["migrate".into()],
                ..ReleaseHooks::default()
            });
        }),
        ("on_deploy", |s| {
            s.on_deploy = Some(OnDeploy {
                success: vec![WebhookTarget {
                    url: "http://x".into(),
                    ..WebhookTarget::default()
                }],
                ..OnDeploy::default()
            });
        }),
        ("on_probe", |s| s.on_probe = Some(OnProbe::default())),
        ("strategy", |s| {
            s.strategy = Some(Box::new(super::super::Strategy::BlueGreen(
                super::super::rollout::BlueGreen {
                    preview_host: "next.example.com".into(),
                    ..Default::default()
                },
            )));
        }),
        ("drain", |s| {
            s.drain = Some(Drain {
                grace: "60s".into(),
                timeout: "30m".into(),
            });
        }),
        ("plugin_blocks", |s| {
            s.plugin_blocks = vec![crate::manifest::spec::PluginBlock {
                block_type: "trafik".into(),
                ..Default::default()
            }];
        }),
        ("depends_on", |s| {
            s.container.depends_on = Some(crate::manifest::spec::common::DependsOn {
                assets: vec!["a.b".into()],
                resources: vec!["statefulset/s/db".into()],
            });
        }),
        ("build", |s| {
            s.container.build = Some(crate::manifest::spec::common::Build {
                context: "apps/x".into(),
                ..Default::default()
            });
        }),
        ("env_file (folded into env before hashing)", |_| {}),
    ];

    #[test]
    fn hashed_fields_change_the_hash_and_operational_ones_do_not() {
        check_hash_edits(base, |spec| spec.spec_hash(&key()), HASHED, NOT_HASHED);
    }

    #[test]
    fn defaults_hash_like_their_explicit_values() {
        let mut explicit = base();
        explicit.restart = DEFAULT_RESTART.into();
        explicit.container.networks = vec![DEFAULT_NETWORK.into()];
        assert_eq!(explicit.spec_hash(&key()), base().spec_hash(&key()));
        let mut image_default = base();
        image_default.container.image = String::new();
        let mut image_explicit = base();
        image_explicit.container.image = "shop-web:latest".into();
        assert_eq!(
            image_default.spec_hash(&key()),
            image_explicit.spec_hash(&key())
        );
    }

    #[test]
    fn sorted_lists_hash_regardless_of_order() {
        let mut a = base();
        a.container.cap_add = vec!["A".into(), "B".into()];
        a.container.networks = vec!["x".into(), "y".into()];
        let mut b = base();
        b.container.cap_add = vec!["B".into(), "A".into()];
        b.container.networks = vec!["y".into(), "x".into()];
        assert_eq!(a.spec_hash(&key()), b.spec_hash(&key()));
        let mut c = base();
        c.container.volumes = vec!["/a:/a".into(), "/b:/b".into()];
        let mut d = base();
        d.container.volumes = vec!["/b:/b".into(), "/a:/a".into()];
        assert_ne!(
            c.spec_hash(&key()),
            d.spec_hash(&key()),
            "volume order is kept"
        );
    }

    #[test]
    fn the_hash_input_is_voodus_json() {
        let spec = base();
        let container = &spec.container;
        let hashed = HashedDeployment {
            image: container.effective_image(&key()),
            command: container.command.clone(),
            ports: None,
            volumes: None,
            env: Some(container.env.clone()),
            env_from: None,
            networks: Some(vec![DEFAULT_NETWORK.into()]),
            network_mode: String::new(),
            restart: DEFAULT_RESTART.into(),
            host_options: HashedHostOptions {
                extra_hosts: None,
                cap_add: None,
                ulimits: None,
                docker_options: None,
                resources: None,
            },
            autoscale: None,
            logs: Some(Logs::default()),
            probes: None,
            inits: None,
            assets: None,
        };
        assert_eq!(
            serde_json::to_string(&hashed).expect("serialises"),
            r#"{"image":"busybox","command":["sleep","1000"],"ports":null,"volumes":null,"env":{"A":"1"},"networks":["voodu0"],"network_mode":"","restart":"unless-stopped","logs":{"max_size":"10m","max_files":3}}"#
        );
        assert_eq!(spec.spec_hash(&key()), go_json_sha256(&hashed));
    }
}
