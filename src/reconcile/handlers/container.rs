//! The one place a container's create request is built from a spec, for every kind and role
//! (replica, statefulset pod, job run, init, release step): voodu's `docker run` flags
//! (spec §6.5) with its names, labels and DNS aliases (spec §6), `${asset.…}` resolved to host
//! paths, ulimits over voodu's platform defaults, limits, log rotation and `docker_options`.
//!
//! Invariant: pure. Every container gets `createdby`, `voodu.kind`, `voodu.scope`, `voodu.name`,
//! `voodu.replica_id`, `voodu.role`, `voodu.created_at`, this agent's `voodu.agent` and the
//! `voodu.env_digest` of the environment it was given; replicas with probes carry them in
//! `voodu.probes`.

use std::collections::BTreeMap;
use std::path::Path;

use crate::manifest::spec::{Container, normalize_port};
use crate::model::{
    DockerOptions, Kind, ResourceKey, parse_cpus, parse_memory, parse_ports, parse_ulimit,
    resolve_asset_refs,
};
use crate::runtime::{ContainerSpec, labels};

/// The role label of a replica's init containers (they carry its kind, scope and name).
pub(super) const INIT_ROLE: &str = "init";

/// Who a container is: its name and the labels and aliases that follow from its role.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub(crate) name: String,
    /// The `voodu.kind` label: the owning resource's kind, or `job` for release steps.
    pub(crate) kind: Kind,
    /// `voodu.role`: the kind for the main containers, `init` or `release` otherwise.
    pub(crate) role: String,
    /// `voodu.name` (`<name>-release` for release steps, as voodu labels them).
    pub(crate) name_label: String,
    pub(crate) replica_id: String,
    pub(crate) ordinal: Option<usize>,
    /// `voodu.manifest_hash`, absent for jobs.
    pub(crate) spec_hash: Option<String>,
    pub(crate) release_id: Option<String>,
    /// DNS aliases on every network (none for jobs and release steps).
    pub(crate) aliases: Vec<String>,
}

/// What a container gets besides the shared container fields.
#[derive(Debug, Clone, Default)]
pub(crate) struct Launch {
    /// The merged environment (`reconcile::handlers::env`), `KEY=VALUE` sorted by key.
    pub(crate) env: Vec<String>,
    pub(crate) env_digest: String,
    /// Ports as written in the manifest (normalised here).
    pub(crate) ports: Vec<String>,
    /// Docker restart policy; empty for one-shot containers.
    pub(crate) restart: String,
    /// Mounts added after the manifest's `volumes` (statefulset claims).
    pub(crate) extra_binds: Vec<String>,
    /// Ulimits under the manifest's own (the host's clamped voodu defaults).
    pub(crate) default_ulimits: Vec<(String, i64, i64)>,
    /// Replaces the spec's image and command (init and release containers).
    pub(crate) image: Option<String>,
    pub(crate) command: Option<Vec<String>>,
    pub(crate) tty: bool,
    /// The replica's probes, kept on the container (`voodu.probes`) so a replica is always
    /// probed as its own spec says, not as a newer commit's.
    pub(crate) probes: Option<crate::manifest::spec::Probes>,
    /// What the release's images run as: the container is created from its image's pin
    /// (`name@sha256:…`, an image id) and labelled `voodu.images`; `None` (a legacy release):
    /// from the tag.
    pub(crate) pins: Option<std::sync::Arc<crate::reconcile::handlers::pins::Pins>>,
}

/// Why a spec cannot become a container (the manifest stage checks all of these; a stored
/// spec from an older agent could still hold one).
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("docker_options: {0}")]
    DockerOptions(#[from] crate::model::DockerOptionsError),
    #[error("port {0:?} is not `[ip:][host_port:]container_port[/proto]`")]
    Port(String),
    #[error("ulimit {name}={value:?} is not soft:hard")]
    Ulimit { name: String, value: String },
    #[error("cpu limit {0:?} is not a CPU amount")]
    Cpu(String),
    #[error("memory limit {0:?} is not a size")]
    Memory(String),
    #[error("probes: {0}")]
    Probes(serde_json::Error),
}

/// Builds the create request of one container.
pub(crate) fn build(
    key: &ResourceKey,
    agent_id: &str,
    assets_root: &Path,
    created_at: &str,
    identity: &Identity,
    container: &Container,
    launch: &Launch,
) -> Result<ContainerSpec, BuildError> {
    let resolve = |text: &str| resolve_asset_refs(text, assets_root);
    let options = DockerOptions::parse(&container.docker_options)?;
    let bridge = container.network_mode.is_empty();
    let mut ports = Vec::new();
    if bridge {
        for port in &launch.ports {
            let normalized = resolve(&normalize_port(port));
            ports.extend(parse_ports(&normalized).ok_or_else(|| BuildError::Port(port.clone()))?);
        }
    }
    let ulimits = ulimits_of(container, launch)?;
    let (nano_cpus, memory) = limits_of(container)?;
    let mut binds: Vec<String> = container
        .volumes
        .iter()
        .map(|volume| resolve(volume))
        .collect();
    binds.extend(launch.extra_binds.iter().cloned());
    let mut container_labels = labels_of(key, agent_id, created_at, identity, launch)?;
    let image = resolve(
        &launch
            .image
            .clone()
            .unwrap_or_else(|| container.effective_image(key)),
    );
    let image = match &launch.pins {
        Some(pins) => {
            container_labels.insert(labels::IMAGES.to_owned(), pins.label().to_owned());
            pins.pin(&image).to_owned()
        }
        None => image,
    };
    let command = launch.command.clone().or_else(|| container.command.clone());
    Ok(ContainerSpec {
        name: identity.name.clone(),
        image,
        command: command.map(|command| command.iter().map(|part| resolve(part)).collect()),
        env: launch.env.clone(),
        labels: container_labels,
        ports,
        binds,
        restart: launch.restart.clone(),
        networks: container.effective_networks(),
        aliases: if bridge {
            identity.aliases.clone()
        } else {
            Vec::new()
        },
        network_mode: container.network_mode.clone(),
        extra_hosts: if bridge {
            container.extra_hosts.clone()
        } else {
            Vec::new()
        },
        cap_add: container.cap_add.clone(),
        ulimits,
        nano_cpus,
        memory,
        log_max_size: Some(container.logs.max_size.clone()),
        log_max_files: Some(container.logs.max_files),
        tty: launch.tty,
        options,
    })
}

/// The container's ulimits: the host's defaults (`Launch::default_ulimits`), each overridden
/// by the spec's `ulimits`.
fn ulimits_of(
    container: &Container,
    launch: &Launch,
) -> Result<Vec<(String, i64, i64)>, BuildError> {
    let mut ulimits: BTreeMap<String, (i64, i64)> = crate::model::map_of(
        launch
            .default_ulimits
            .iter()
            .map(|(name, soft, hard)| (name.clone(), (*soft, *hard))),
    );
    for (name, value) in &container.ulimits {
        let limits = parse_ulimit(value).ok_or_else(|| BuildError::Ulimit {
            name: name.clone(),
            value: value.clone(),
        })?;
        ulimits.insert(name.clone(), limits);
    }
    Ok(ulimits
        .into_iter()
        .map(|(name, (soft, hard))| (name, soft, hard))
        .collect())
}

/// The CPU (in nano CPUs) and memory (in bytes) limits of `resources.limits`, if set.
fn limits_of(container: &Container) -> Result<(Option<i64>, Option<i64>), BuildError> {
    let limits = container
        .resources
        .as_ref()
        .and_then(|resources| resources.limits.as_ref());
    let nano_cpus = match limits
        .map(|limits| limits.cpu.as_str())
        .filter(|cpu| !cpu.is_empty())
    {
        Some(cpu) => Some(parse_cpus(cpu).ok_or_else(|| BuildError::Cpu(cpu.to_owned()))?),
        None => None,
    };
    let memory = match limits
        .map(|limits| limits.memory.as_str())
        .filter(|memory| !memory.is_empty())
    {
        Some(memory) => {
            Some(parse_memory(memory).ok_or_else(|| BuildError::Memory(memory.to_owned()))?)
        }
        None => None,
    };
    Ok((nano_cpus, memory))
}

/// The labels every container of this agent carries: who created it, its resource, replica,
/// role, creation time, agent, environment digest, and where set its spec hash, release,
/// ordinal and probes.
fn labels_of(
    key: &ResourceKey,
    agent_id: &str,
    created_at: &str,
    identity: &Identity,
    launch: &Launch,
) -> Result<BTreeMap<String, String>, BuildError> {
    let mut container_labels = BTreeMap::from([
        (
            labels::CREATED_BY.to_owned(),
            labels::CREATED_BY_VALUE.to_owned(),
        ),
        (labels::KIND.to_owned(), identity.kind.as_str().to_owned()),
        (labels::SCOPE.to_owned(), key.scope.clone()),
        (labels::NAME.to_owned(), identity.name_label.clone()),
        (labels::REPLICA_ID.to_owned(), identity.replica_id.clone()),
        (labels::ROLE.to_owned(), identity.role.clone()),
        (labels::CREATED_AT.to_owned(), created_at.to_owned()),
        (labels::AGENT.to_owned(), agent_id.to_owned()),
        (labels::ENV_DIGEST.to_owned(), launch.env_digest.clone()),
    ]);
    if let Some(hash) = &identity.spec_hash {
        container_labels.insert(labels::MANIFEST_HASH.to_owned(), hash.clone());
    }
    if let Some(release) = &identity.release_id {
        container_labels.insert(labels::RELEASE_ID.to_owned(), release.clone());
    }
    if let Some(ordinal) = identity.ordinal {
        container_labels.insert(labels::REPLICA_ORDINAL.to_owned(), ordinal.to_string());
    }
    if let Some(probes) = &launch.probes {
        let json = serde_json::to_string(probes).map_err(BuildError::Probes)?;
        container_labels.insert(labels::PROBES.to_owned(), json);
    }
    Ok(container_labels)
}

/// `networks` with `voodu0` standing for the source's own network `own`
/// (`Ownership::network_of`: `voodu0` itself unless the source has its own).
pub(crate) fn on_own_network(networks: Vec<String>, own: &str) -> Vec<String> {
    networks
        .into_iter()
        .map(|network| {
            if network == crate::model::policy::DEFAULT_NETWORK {
                own.to_owned()
            } else {
                network
            }
        })
        .collect()
}

/// voodu's DNS aliases of a deployment or statefulset (spec §6.3), lower-cased; statefulset
/// pods first get their own `<name>-<n>.<scope>` names.
pub(crate) fn aliases(key: &ResourceKey, ordinal: Option<usize>) -> Vec<String> {
    let mut aliases = Vec::new();
    let mut both = |host: String| {
        if key.scope.is_empty() {
            aliases.push(host.to_lowercase());
            aliases.push(format!("{host}.voodu").to_lowercase());
        } else {
            aliases.push(format!("{host}.{}", key.scope).to_lowercase());
            aliases.push(format!("{host}.{}.voodu", key.scope).to_lowercase());
        }
    };
    if let Some(ordinal) = ordinal {
        both(format!("{}-{ordinal}", key.name));
    }
    both(key.name.clone());
    aliases
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::spec::{Limits, Resources};

    fn identity() -> Identity {
        Identity {
            name: "shop-web.ab12".into(),
            kind: Kind::Deployment,
            role: "deployment".into(),
            name_label: "web".into(),
            replica_id: "ab12".into(),
            ordinal: None,
            spec_hash: Some("hash".into()),
            release_id: Some("7".into()),
            aliases: aliases(&ResourceKey::new(Kind::Deployment, "shop", "web"), None),
        }
    }

    #[test]
    fn a_replica_gets_voodus_flags_labels_and_aliases() -> Result<(), BuildError> {
        let key = ResourceKey::new(Kind::Deployment, "shop", "web");
        let mut container = Container {
            image: "app:${asset.shop.cfg.tag}".into(),
            command: Some(vec!["run".into(), "--config=${asset.shop.cfg.conf}".into()]),
            volumes: vec!["${asset.shop.cfg.conf}:/etc/app.conf:ro".into()],
            ulimits: BTreeMap::from([("nofile".into(), "1024:2048".into())]),
            docker_options: vec!["--shm-size=1g".into()],
            resources: Some(Resources {
                limits: Some(Limits {
                    cpu: "500m".into(),
                    memory: "256Mi".into(),
                }),
            }),
            ..Container::default()
        };
        container.logs.max_files = 5;
        let launch = Launch {
            env: vec!["A=1".into()],
            env_digest: "digest".into(),
            ports: vec!["8080".into()],
            restart: "unless-stopped".into(),
            default_ulimits: vec![
                ("nofile".into(), 65_536, 65_536),
                ("nproc".into(), 4_096, 4_096),
            ],
            ..Launch::default()
        };
        let spec = build(
            &key,
            "agent",
            Path::new("/data/assets"),
            "2026-01-01T00:00:00Z",
            &identity(),
            &container,
            &launch,
        )?;
        assert_eq!(spec.image, "app:/data/assets/shop/cfg/tag");
        assert_eq!(
            spec.command,
            Some(vec![
                "run".into(),
                "--config=/data/assets/shop/cfg/conf".into()
            ])
        );
        assert_eq!(spec.binds, ["/data/assets/shop/cfg/conf:/etc/app.conf:ro"]);
        assert_eq!(spec.networks, ["voodu0"]);
        assert_eq!(spec.aliases, ["web.shop", "web.shop.voodu"]);
        assert_eq!(
            (spec.ports.len(), spec.ports[0].host_ip.as_str()),
            (1, "127.0.0.1")
        );
        assert_eq!(
            spec.ulimits,
            [("nofile".into(), 1024, 2048), ("nproc".into(), 4096, 4096)]
        );
        assert_eq!(
            (spec.nano_cpus, spec.memory),
            (Some(500_000_000), Some(256 << 20))
        );
        assert_eq!(
            (spec.log_max_size.as_deref(), spec.log_max_files),
            (Some("10m"), Some(5))
        );
        assert_eq!(spec.options.shm_size, Some(1 << 30));
        for (label, value) in [
            ("createdby", "voodu"),
            ("voodu.kind", "deployment"),
            ("voodu.scope", "shop"),
            ("voodu.name", "web"),
            ("voodu.replica_id", "ab12"),
            ("voodu.role", "deployment"),
            ("voodu.manifest_hash", "hash"),
            ("voodu.release_id", "7"),
            ("voodu.agent", "agent"),
            ("voodu.env_digest", "digest"),
            ("voodu.created_at", "2026-01-01T00:00:00Z"),
        ] {
            assert_eq!(
                spec.labels.get(label).map(String::as_str),
                Some(value),
                "{label}"
            );
        }
        Ok(())
    }

    #[test]
    fn host_networking_publishes_nothing_and_joins_no_network() -> Result<(), BuildError> {
        let key = ResourceKey::new(Kind::Deployment, "shop", "web");
        let container = Container {
            network_mode: "host".into(),
            extra_hosts: vec!["a:1.2.3.4".into()],
            ..Container::default()
        };
        let launch = Launch {
            ports: vec!["8080".into()],
            ..Launch::default()
        };
        let spec = build(
            &key,
            "agent",
            Path::new("/a"),
            "t",
            &identity(),
            &container,
            &launch,
        )?;
        assert_eq!(
            spec.image, "shop-web:latest",
            "build mode runs <AppID>:latest"
        );
        assert!(spec.networks.is_empty() && spec.aliases.is_empty() && spec.ports.is_empty());
        assert!(spec.extra_hosts.is_empty());
        assert_eq!(spec.network_mode, "host");
        Ok(())
    }

    #[test]
    fn statefulset_pods_get_their_own_names_first() {
        let key = ResourceKey::new(Kind::Statefulset, "data", "PG");
        assert_eq!(
            aliases(&key, Some(1)),
            ["pg-1.data", "pg-1.data.voodu", "pg.data", "pg.data.voodu"]
        );
        let unscoped = ResourceKey::new(Kind::Deployment, "", "web");
        assert_eq!(aliases(&unscoped, None), ["web", "web.voodu"]);
    }
}
