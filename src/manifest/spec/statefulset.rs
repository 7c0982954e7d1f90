//! `statefulset "scope" "name" { … }` (spec §2.3): stable ordinals, per-ordinal volume
//! claims, and voodu's statefulset spec hash.
//!
//! Invariant: the hash follows voodu's `statefulsetSpecHash` (spec §5.2): like the
//! deployment's but without `env_from` and `autoscale`, with `volume_claims` always present
//! (`null` when none, sorted by claim name) and `inits` before `probes`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::backup::Backup;
use super::common::{
    Container, Drain, Init, Logs, OnProbe, Probes, VolumeClaim, normalized_ports, replica_count,
    restart_or_default,
};
use super::deployment::asset_lines;
use super::hash::{HashedHostOptions, go_json_sha256, non_empty};
use super::plugin::PluginBlock;
use super::{KindSpec, image_text};
use crate::model::{ResourceKey, SpecHash};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatefulsetSpec {
    #[serde(flatten)]
    pub container: Container,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) restart: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) health_check: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_claims: Vec<VolumeClaim>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) inits: Vec<Init>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probes: Option<Box<Probes>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) on_probe: Option<OnProbe>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) drain: Option<Drain>,
    /// `backup {}` (an extension: voodu has none); never hashed, so the block never replaces
    /// a pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<Box<Backup>>,
    /// Plugin-owned nested blocks, in order (voodu 2026); never hashed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) plugin_blocks: Vec<PluginBlock>,
    /// The macro this statefulset was expanded from, which decides each pod's role when it
    /// starts (`Macro`); the agent's own field, never hashed.
    #[serde(rename = "_macro", default, skip_serializing_if = "Option::is_none")]
    pub(crate) expanded_from: Option<Macro>,
    #[serde(
        rename = "_asset_digests",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub asset_digests: BTreeMap<String, String>,
}

/// The plugin macros the agent expands itself into a statefulset with role-aware pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Macro {
    /// `postgres {}`: one primary, the other pods streaming standbys.
    Postgres,
    /// `redis {}`: one master, the other pods replicas.
    Redis,
    /// `redis { sentinel {} }`: a quorum of sentinels watching another redis.
    RedisSentinel,
}

impl StatefulsetSpec {
    /// What each pod of a macro's statefulset is, for `plan` (`None` for a plain one). The
    /// primary (master) is the ordinal the resource's config bucket names, 0 by default.
    pub fn roles(&self) -> Option<String> {
        let n = self.n_replicas();
        let others = |what: &str| match n {
            1 => String::new(),
            2 => format!(" and 1 {what} (pod 1)"),
            _ => format!(" and {} {what}s (pods 1–{})", n - 1, n - 1),
        };
        Some(match self.expanded_from? {
            Macro::Postgres => format!("postgres: primary pod 0{}", others("streaming standby")),
            Macro::Redis => format!("redis: master pod 0{}", others("replica")),
            Macro::RedisSentinel => {
                let env = |key: &str| self.container.env.get(key).map_or("", String::as_str);
                format!(
                    "redis sentinel: {n} sentinel(s), quorum {}, watching {}/{}",
                    n / 2 + 1,
                    env("VOODU_MONITOR_SCOPE"),
                    env("VOODU_MONITOR_NAME")
                )
            }
        })
    }

    /// Desired pod count: omitted or below 1 means 1.
    pub(crate) fn n_replicas(&self) -> usize {
        replica_count(self.replicas)
    }

    pub(crate) fn effective_restart(&self) -> &str {
        restart_or_default(&self.restart)
    }

    pub(crate) fn normalized_ports(&self) -> Vec<String> {
        normalized_ports(&self.ports)
    }
}

impl KindSpec for StatefulsetSpec {
    const HASHED: &'static [&'static str] =
        &["ports", "restart", "volume_claims", "inits", "probes"];
    const HASHES_CONTAINER: bool = true;

    /// voodu's statefulset spec hash.
    fn spec_hash(&self, key: &ResourceKey) -> SpecHash {
        let container = &self.container;
        let mut networks = container.effective_networks();
        networks.sort_unstable();
        let mut claims = self.volume_claims.clone();
        claims.sort_by(|a, b| a.name.cmp(&b.name));
        go_json_sha256(&HashedStatefulset {
            image: container.effective_image(key),
            command: container.command.clone(),
            ports: non_empty(&self.normalized_ports()),
            volumes: non_empty(&container.volumes),
            env: (!container.env.is_empty()).then(|| container.env.clone()),
            networks: non_empty(&networks),
            network_mode: container.network_mode.clone(),
            restart: self.effective_restart().to_owned(),
            host_options: HashedHostOptions::of(container),
            logs: Some(container.logs.clone()),
            volume_claims: non_empty(&claims),
            inits: non_empty(&self.inits),
            probes: self.probes.clone(),
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
        let roles = self.roles().map(|roles| format!("; {roles}"));
        let backup = self
            .backup
            .as_ref()
            .map(|backup| format!("; backup ({})", backup.mode.as_str()));
        format!(
            "{} pod(s) of {}, {} volume claim(s) each{}{}",
            self.n_replicas(),
            image_text(&self.container.image),
            self.volume_claims.len(),
            roles.unwrap_or_default(),
            backup.unwrap_or_default()
        )
    }
}

#[derive(Serialize)]
struct HashedStatefulset {
    image: String,
    command: Option<Vec<String>>,
    ports: Option<Vec<String>>,
    volumes: Option<Vec<String>>,
    env: Option<BTreeMap<String, String>>,
    networks: Option<Vec<String>>,
    network_mode: String,
    restart: String,
    #[serde(flatten)]
    host_options: HashedHostOptions,
    #[serde(skip_serializing_if = "Option::is_none")]
    logs: Option<Logs>,
    volume_claims: Option<Vec<VolumeClaim>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    inits: Option<Vec<Init>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    probes: Option<Box<Probes>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    assets: Option<Vec<String>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::spec::common::{ExecAction, Probe};
    use crate::manifest::spec::hash::check_hash_edits;
    use crate::model::Kind;

    fn key() -> ResourceKey {
        ResourceKey::new(Kind::Statefulset, "data", "pg")
    }

    fn base() -> StatefulsetSpec {
        let mut spec = StatefulsetSpec {
            replicas: Some(1),
            volume_claims: vec![VolumeClaim {
                name: "data".into(),
                mount_path: "/data".into(),
                size: String::new(),
            }],
            ..StatefulsetSpec::default()
        };
        spec.container.image = "postgres:16".into();
        spec
    }

    type Edit = fn(&mut StatefulsetSpec);

    const HASHED: &[(&str, Edit)] = &[
        ("ports", |s| s.ports = vec!["5432".into()]),
        ("restart", |s| s.restart = "always".into()),
        ("volume_claims", |s| {
            s.volume_claims[0].mount_path = "/var/lib/data".into()
        }),
        ("inits", |s| {
            s.inits = vec![Init {
                name: "seed".into(),
                command: vec!["true".into()],
                ..Init::default()
            }];
        }),
        ("probes", |s| {
            s.probes = Some(Box::new(Probes {
                liveness: Some(Probe {
                    exec: Some(ExecAction {
                        command: vec!["true".into()],
                    }),
                    ..Probe::default()
                }),
                ..Probes::default()
            }));
        }),
        ("_asset_digests", |s| {
            s.asset_digests = BTreeMap::from([("data.cfg.k".into(), "00".into())]);
        }),
    ];

    const NOT_HASHED: &[(&str, Edit)] = &[
        ("replicas", |s| s.replicas = Some(3)),
        ("health_check", |s| s.health_check = "/x".into()),
        ("_macro", |s| s.expanded_from = Some(super::Macro::Postgres)),
        ("env_from", |s| {
            s.container.env_from = vec!["data/shared".into()]
        }),
        ("on_probe", |s| s.on_probe = Some(OnProbe::default())),
        ("drain", |s| {
            s.drain = Some(Drain {
                grace: "60s".into(),
                timeout: String::new(),
            });
        }),
        ("backup", |s| {
            s.backup = Some(Box::new(Backup {
                repository: "/srv/backups/pg".into(),
                password_file: "/etc/voodu/pg.pass".into(),
                ..Backup::default()
            }));
        }),
        ("plugin_blocks", |s| {
            s.plugin_blocks = vec![crate::manifest::spec::PluginBlock {
                block_type: "trafik".into(),
                ..Default::default()
            }];
        }),
        ("depends_on.resources (start-up order)", |s| {
            s.container.depends_on = Some(crate::manifest::spec::DependsOn {
                resources: vec!["deployment/data/api".into()],
                ..Default::default()
            });
        }),
    ];

    #[test]
    fn hashed_fields_change_the_hash_and_operational_ones_do_not() {
        check_hash_edits(base, |spec| spec.spec_hash(&key()), HASHED, NOT_HASHED);
    }

    /// Only the `backup` block differs: voodu's hash (and so every pod) is untouched,
    /// whatever the block says.
    #[test]
    fn the_backup_block_never_changes_the_hash() {
        let without = base().spec_hash(&key());
        let mut spec = base();
        for backup in [
            Backup {
                repository: "/srv/backups/pg".into(),
                password_file: "/etc/voodu/pg.pass".into(),
                ..Backup::default()
            },
            Backup {
                repository: "s3:s3.amazonaws.com/bucket".into(),
                password_file: "/etc/voodu/other.pass".into(),
                schedule: "0 3 * * *".into(),
                mode: super::super::BackupMode::Exec,
                command: vec!["pg_dump".into()],
                restore_command: vec!["pg_restore".into()],
                before_release: true,
                verify: "daily".into(),
                timeout: "2h".into(),
                keep: Some(super::super::Keep::default()),
                ..Backup::default()
            },
        ] {
            spec.backup = Some(Box::new(backup));
            assert_eq!(spec.spec_hash(&key()), without);
        }
        assert!(
            spec.summary().ends_with("; backup (exec)"),
            "{}",
            spec.summary()
        );
    }

    #[test]
    fn claims_hash_sorted_by_name() {
        let claim = |name: &str| VolumeClaim {
            name: name.into(),
            mount_path: format!("/{name}"),
            size: String::new(),
        };
        let mut a = base();
        a.volume_claims = vec![claim("a"), claim("b")];
        let mut b = base();
        b.volume_claims = vec![claim("b"), claim("a")];
        assert_eq!(a.spec_hash(&key()), b.spec_hash(&key()));
    }
}
