//! The Docker Swarm side of the handlers (`--runtime swarm`, ARCHITECTURE.md "Docker
//! Swarm"): a deployment is a replicated service, a statefulset one service per ordinal, a
//! job run a `replicated-job` service. Each kind implements the same `Replicated` trait as
//! on containers, so the one replicated pass (releases, the rollout state machine, pins,
//! automatic rollback, status) drives them; this module holds what the Swarm kinds share:
//! the service a container spec becomes, its configs, and tasks observed as replicas.
//!
//! Invariants: a service is built from the same create request as a container
//! (`container::build`), so names, labels, environment and its digest, limits and
//! `docker_options` follow one mapping; the task template carries no value that changes
//! from pass to pass (no creation time, no release id: those are service labels), so
//! planning again on an unchanged spec sends nothing; a resource with something Swarm
//! cannot run (`plan::swarm_gaps`) is refused before anything is touched.

/// The `Replicated` methods the Swarm kinds share: the wrapped kind's pins, report, images
/// and status detail (which says the nodes that are down and, `lost_nodes`, what that means
/// for the kind); the images and networks before a rollout (`prepare` of the wrapped kind's
/// container), the steps carried out by the kind module's own `execute` (no waits are
/// listed), and how a kind follows Swarm converging on its own: the new tasks still waiting,
/// when to look again, and whether Swarm gave up on the rollout, each judged by the kind's
/// `task_is_current` (a task's labels are of the target).
macro_rules! swarm_kind {
    (lost_nodes: $then:expr) => {
        pins_in!(inner.pins);

        fn report(&self) -> Report<'_> {
            Replicated::<R>::report(&self.inner)
        }

        fn images(&self) -> (&ContainerSpec, &[Init]) {
            Replicated::<R>::images(&self.inner)
        }

        async fn detail(
            &self,
            ctx: &Ctx<R>,
            status: ResourceStatus,
            observed: &Observed,
        ) -> Result<ResourceStatus> {
            let mut status = Replicated::<R>::detail(&self.inner, ctx, status, observed).await?;
            super::say_lost_nodes(&mut status, observed, $then);
            Ok(status)
        }

        async fn execute(
            &self,
            ctx: &Ctx<R>,
            steps: &[Self::Step],
            observed: &Observed,
            _waits: &mut Waits,
        ) -> Result<()> {
            execute(ctx, self, steps, observed).await
        }

        async fn prepare(&self, ctx: &Ctx<R>, key: &ResourceKey) -> Result<()> {
            super::prepare(ctx, key, &self.inner.spec.container).await
        }

        async fn new_replicas(
            &self,
            _ctx: &Ctx<R>,
            observed: &Observed,
            release: &Release,
        ) -> Vec<NewReplica> {
            super::deployment::new_replicas(observed, release, |labels| {
                self.task_is_current(labels)
            })
        }

        fn look_again(&self, observed: &Observed) -> Option<std::time::Duration> {
            super::look_again(&<Self as Replicated<R>>::plan(self, observed), observed)
        }

        fn gave_up(
            &self,
            observed: &Observed,
            release: &Release,
        ) -> Option<(FailureReason, String)> {
            super::deployment::swarm_gave_up(observed, release, |labels| {
                self.task_is_current(labels)
            })
        }
    };
}

pub(super) mod deployment;
pub(super) mod runs;
pub(super) mod statefulset;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use super::container::{Identity, Launch};
use super::launch::build_or_refuse;
use super::replicas::Observed;
use crate::manifest::spec::{Container, Drain, Probe, Probes, Spec};
use crate::model::{Kind, ResourceKey, UNSCOPED_ASSETS};
use crate::reconcile::plan::gate::{self, ReplicaReadiness};
use crate::reconcile::plan::{SERVICE_DIGEST, swarm_gaps};
use crate::reconcile::{context::Ctx, error::Error, error::Result};
use crate::runtime::{
    ConfigMount, ContainerState, HealthCheck, HostPort, Runtime, ServiceMode, ServiceSpec, Task,
    TaskState, UpdateOrder, UpdatePolicy, labels,
};
use crate::store::{Desired, FailureReason, ResourceStatus, now_unix};

pub(crate) use super::replicas::SwarmSeen;

use crate::runtime::service::overlay;

/// Before a rollout: the overlay networks exist and the image is on this node (pulled with
/// the registry's credentials when missing; other nodes pull it with the credentials sent
/// with the service).
pub(super) async fn prepare<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    container: &Container,
) -> Result<()> {
    for network in container.effective_networks() {
        ctx.runtime
            .ensure_overlay(&overlay(&network))
            .await
            .map_err(Error::runtime(key))?;
    }
    let image = crate::model::resolve_asset_refs(&container.effective_image(key), &ctx.assets_root);
    crate::reconcile::handlers::images::ensure_image(ctx, key, &image).await
}

/// The credentials of the `registry` for `image`'s registry host, sent with the service so
/// every node can pull it.
async fn registry_auth<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    image: &str,
) -> Result<Option<crate::runtime::RegistryAuth>> {
    crate::reconcile::handlers::images::auth_for(ctx, key, image).await
}

/// The desired state of `key`, a Swarm kind, once refused when it cannot be applied or
/// Swarm cannot run it (before anything is touched); `None` when it left the repo and
/// `remove` ran.
pub(super) async fn desired_to_apply<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    remove: impl Future<Output = Result<()>>,
) -> Result<Option<Desired>> {
    let Some(desired) = super::desired_or_remove(ctx, key, remove).await? else {
        return Ok(None);
    };
    super::refuse_unappliable(key, &desired.spec)?;
    refuse_gaps(key, &desired.spec)?;
    Ok(Some(desired))
}

/// Refuses a resource Swarm cannot run, with every reason.
pub(super) fn refuse_gaps(key: &ResourceKey, spec: &Spec) -> Result<()> {
    let gaps = swarm_gaps(spec);
    if gaps.is_empty() {
        return Ok(());
    }
    Err(Error::Permanent {
        key: key.clone(),
        reason: FailureReason::SwarmUnsupported,
        message: format!("cannot run under Docker Swarm: {}", gaps.join("; ")),
    })
}

/// Labels that select this agent's services of one resource in its own role: a
/// deployment's or statefulset's replicas, a job's runs (never a deployment's release hook
/// services, whose role is `release`): the containers' filter.
pub(super) use super::replicas::replica_filter as service_filter;

/// Labels that select every service this agent made for one resource, whatever its role
/// (with a deployment's, a release hook service an interrupted pass left behind).
pub(super) use super::replicas::owned_filter;

/// The services of `key` that `filter` selects, for a resource that left the repo.
async fn list_leftovers<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    filter: &[(&str, &str)],
) -> Result<Vec<crate::runtime::Service>> {
    ctx.runtime
        .list_services(filter)
        .await
        .map_err(Error::runtime(key))
}

/// The resource left the repo: `services` go in their order (Swarm stops the tasks with
/// their grace), each logged with `what`, then its status.
async fn remove_leftovers<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    services: Vec<crate::runtime::Service>,
    what: &str,
) -> Result<()> {
    for service in services {
        tracing::info!(%key, service = %service.name, "{what}");
        ctx.runtime
            .remove_service(&service.id)
            .await
            .map_err(Error::runtime(key))?;
    }
    let key = key.clone();
    crate::reconcile::context::blocking(&ctx.store, move |store| store.delete_status(&key)).await
}

/// A config a task mounts: an asset file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct AssetConfig {
    pub(super) name: String,
    /// The asset file on this host (`<data-dir>/assets/…`).
    pub(super) path: std::path::PathBuf,
    /// The asset's key, for the config's labels.
    pub(super) asset: ResourceKey,
}

/// What a kind asks of its service besides the container spec.
pub(super) struct Shape<'a> {
    pub(super) mode: ServiceMode,
    pub(super) probes: Option<&'a Probes>,
    pub(super) drain: Option<&'a Drain>,
    /// Stop-first even without a pinned host port (a statefulset's node-local volumes).
    pub(super) stop_first: bool,
    pub(super) constraints: Vec<String>,
    pub(super) asset_digests: &'a BTreeMap<String, String>,
    /// Extra service labels (a statefulset's ordinal).
    pub(super) labels: BTreeMap<String, String>,
    /// Labels of the named volumes the task mounts, by name.
    pub(super) volume_labels: BTreeMap<String, BTreeMap<String, String>>,
}

/// A service spec ready to send but for its configs' ids, the asset files it mounts, and
/// its digest (also its `voodu.service_digest` label).
#[derive(Debug, Clone)]
pub(super) struct Built {
    pub(super) spec: ServiceSpec,
    pub(super) assets: Vec<AssetConfig>,
    pub(super) digest: String,
}

/// Labels that change without the task changing: never in the digest.
const VOLATILE: [&str; 2] = [labels::RELEASE_ID, SERVICE_DIGEST];

/// A Swarm config name for an asset file: `<scope>-<name>-<key>-<digest8>`, within Swarm's
/// 64 characters of `[a-zA-Z0-9_.-]`.
pub(super) fn config_name(asset: &ResourceKey, file: &str, digest: &str) -> String {
    let clean = |text: &str| -> String {
        text.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                    c
                } else {
                    '-'
                }
            })
            .collect()
    };
    let short: String = digest
        .trim_start_matches("sha256:")
        .chars()
        .take(8)
        .collect();
    let mut stem = clean(&format!("{}-{file}", asset.app_id()));
    stem.truncate(64 - 1 - short.len());
    format!("{stem}-{short}")
}

/// The health check Swarm runs for `probes`: the readiness probe, else the liveness probe.
fn health_check(probes: Option<&Probes>) -> Option<HealthCheck> {
    let probes = probes?;
    let probe: &Probe = probes.readiness.as_ref().or(probes.liveness.as_ref())?;
    let duration = |text: &str, default: u64| {
        crate::model::parse_go_duration(text)
            .filter(|duration| !duration.is_zero())
            .unwrap_or(Duration::from_secs(default))
    };
    let timeout = duration(&probe.timeout, 1);
    let test = if let Some(exec) = &probe.exec {
        std::iter::once("CMD".to_owned())
            .chain(exec.command.iter().cloned())
            .collect()
    } else if let Some(http) = &probe.http_get {
        let scheme = if http.scheme.is_empty() {
            "http"
        } else {
            http.scheme.as_str()
        };
        let path = if http.path.is_empty() {
            "/"
        } else {
            &http.path
        };
        vec![
            "CMD".to_owned(),
            "wget".to_owned(),
            "-q".to_owned(),
            "-O".to_owned(),
            "/dev/null".to_owned(),
            "-T".to_owned(),
            timeout.as_secs().max(1).to_string(),
            format!("{}://127.0.0.1:{}{path}", scheme.to_lowercase(), http.port),
        ]
    } else if let Some(tcp) = &probe.tcp_socket {
        vec![
            "CMD".to_owned(),
            "nc".to_owned(),
            "-z".to_owned(),
            "127.0.0.1".to_owned(),
            tcp.port.to_string(),
        ]
    } else {
        return None;
    };
    Some(HealthCheck {
        test,
        interval: duration(&probe.period, 10),
        timeout,
        retries: u64::try_from(probe.failure_threshold)
            .ok()
            .filter(|n| *n > 0)
            .unwrap_or(3),
        start_period: crate::model::parse_go_duration(&probe.initial_delay).unwrap_or_default(),
    })
}

/// Builds the service of `identity` (its name is the service's) from the container spec
/// the container engine would get.
pub(super) fn build_service<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    identity: &Identity,
    container: &Container,
    launch: &Launch,
    shape: Shape<'_>,
) -> Result<Built> {
    let mut task = build_or_refuse(ctx, key, "", identity, container, launch)?;
    // Values that change from pass to pass belong on the service, never in the template.
    task.labels.remove(labels::CREATED_AT);
    task.labels.remove(labels::RELEASE_ID);
    task.networks = task
        .networks
        .iter()
        .map(|network| overlay(network))
        .collect();
    let (binds, assets) = asset_mounts(&ctx.assets_root, &task.binds, shape.asset_digests);
    task.binds = binds;
    let published: Vec<HostPort> = task
        .ports
        .iter()
        .map(|port| HostPort {
            published: port.host_port.unwrap_or(0),
            target: port.container_port,
            protocol: port.protocol.clone(),
        })
        .collect();
    let pinned_port = task.ports.iter().any(|port| port.host_port.is_some());
    task.ports.clear();
    let mut service_labels = BTreeMap::from([
        (
            labels::CREATED_BY.to_owned(),
            labels::CREATED_BY_VALUE.to_owned(),
        ),
        (labels::AGENT.to_owned(), ctx.agent_id.clone()),
        (labels::KIND.to_owned(), key.kind.as_str().to_owned()),
        (labels::SCOPE.to_owned(), key.scope.clone()),
        (labels::NAME.to_owned(), key.name.clone()),
        (labels::ROLE.to_owned(), identity.role.clone()),
    ]);
    service_labels.extend(shape.labels);
    let mut spec = ServiceSpec {
        name: identity.name.clone(),
        labels: service_labels,
        task,
        mode: shape.mode,
        update: UpdatePolicy {
            order: if shape.stop_first || pinned_port {
                UpdateOrder::StopFirst
            } else {
                UpdateOrder::StartFirst
            },
            monitor: ctx.options.ready_settle.max(Duration::from_secs(1)),
            rollback_on_failure: true,
        },
        constraints: shape.constraints,
        configs: assets
            .iter()
            .map(|(asset, target)| ConfigMount {
                config_id: String::new(),
                config_name: asset.name.clone(),
                target: target.clone(),
            })
            .collect(),
        published,
        health: health_check(shape.probes),
        stop_grace: Drain::grace_of(shape.drain),
        restart_on_failure: true,
        volume_labels: shape.volume_labels,
    };
    let digest = spec.digest(&VOLATILE);
    spec.labels
        .insert(SERVICE_DIGEST.to_owned(), digest.clone());
    Ok(Built {
        spec,
        assets: assets.into_iter().map(|(asset, _)| asset).collect(),
        digest,
    })
}

/// Splits `binds` into the ones that stay mounts and the asset files (under
/// `assets_root`) that become configs, each with its target path.
fn asset_mounts(
    assets_root: &Path,
    binds: &[String],
    digests: &BTreeMap<String, String>,
) -> (Vec<String>, Vec<(AssetConfig, String)>) {
    let mut kept = Vec::new();
    let mut configs = Vec::new();
    for bind in binds {
        let mut parts = bind.splitn(3, ':');
        let (Some(source), Some(target)) = (parts.next(), parts.next()) else {
            kept.push(bind.clone());
            continue;
        };
        let Some(relative) = Path::new(source)
            .strip_prefix(assets_root)
            .ok()
            .and_then(|relative| relative.to_str())
        else {
            kept.push(bind.clone());
            continue;
        };
        let segments: Vec<&str> = relative.split('/').collect();
        let [scope, name, file] = segments.as_slice() else {
            kept.push(bind.clone());
            continue;
        };
        let (scope, reference) = if *scope == UNSCOPED_ASSETS {
            ("", format!("{name}.{file}"))
        } else {
            (*scope, format!("{scope}.{name}.{file}"))
        };
        let asset = ResourceKey::new(Kind::Asset, scope, *name);
        // The digest validate stamped; a stored spec without one names the file by path.
        let digest = digests.get(&reference).cloned().unwrap_or_else(|| {
            use sha2::Digest as _;
            let hash = sha2::Sha256::digest(relative.as_bytes());
            hash.iter().map(|byte| format!("{byte:02x}")).collect()
        });
        configs.push((
            AssetConfig {
                name: config_name(&asset, file, &digest),
                path: Path::new(source).to_owned(),
                asset,
            },
            target.to_owned(),
        ));
    }
    (kept, configs)
}

/// Creates the service `built` becomes (`sent`); its id.
pub(super) async fn create_service<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    built: &Built,
) -> Result<(ServiceSpec, String)> {
    let (spec, auth) = sent(ctx, key, built).await?;
    let id = ctx
        .runtime
        .create_service(&spec, auth.as_ref())
        .await
        .map_err(Error::runtime(key))?;
    Ok((spec, id))
}

/// Updates `service` to what `built` becomes (`sent`).
pub(super) async fn update_service<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    service: &crate::runtime::Service,
    built: &Built,
) -> Result<ServiceSpec> {
    let (spec, auth) = sent(ctx, key, built).await?;
    ctx.runtime
        .update_service(&service.id, service.version, &spec, auth.as_ref())
        .await
        .map_err(Error::runtime(key))?;
    Ok(spec)
}

/// What Swarm is sent for `built`: its spec with its configs (`with_configs`), and the
/// registry's credentials for its image, so every node can pull it.
async fn sent<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    built: &Built,
) -> Result<(ServiceSpec, Option<crate::runtime::RegistryAuth>)> {
    let spec = with_configs(ctx, key, built).await?;
    let auth = registry_auth(ctx, key, &spec.task.image).await?;
    Ok((spec, auth))
}

/// `built`'s spec with the ids of its configs, creating the configs that do not exist yet
/// from the asset files; then removes the earlier configs of the same assets that no
/// service uses any more.
async fn with_configs<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    built: &Built,
) -> Result<ServiceSpec> {
    let mut spec = built.spec.clone();
    if built.assets.is_empty() {
        return Ok(spec);
    }
    let runtime_error = Error::runtime(key);
    let existing = ctx
        .runtime
        .list_configs(&[(labels::AGENT, ctx.agent_id.as_str())])
        .await
        .map_err(&runtime_error)?;
    let mut ids: BTreeMap<String, String> = crate::model::map_of(
        existing
            .iter()
            .map(|config| (config.name.clone(), config.id.clone())),
    );
    for asset in &built.assets {
        if ids.contains_key(&asset.name) {
            continue;
        }
        let data = read_asset(key, &asset.path).await?;
        let config_labels = BTreeMap::from([
            (labels::AGENT.to_owned(), ctx.agent_id.clone()),
            (labels::KIND.to_owned(), Kind::Asset.as_str().to_owned()),
            (labels::SCOPE.to_owned(), asset.asset.scope.clone()),
            (labels::NAME.to_owned(), asset.asset.name.clone()),
        ]);
        let id = match ctx
            .runtime
            .create_config(&asset.name, &config_labels, &data)
            .await
        {
            Ok(id) => id,
            // Created meanwhile (another consumer of the same asset): read its id.
            Err(crate::runtime::Error::Conflict { .. }) => ctx
                .runtime
                .list_configs(&[(labels::AGENT, ctx.agent_id.as_str())])
                .await
                .map_err(&runtime_error)?
                .into_iter()
                .find(|config| config.name == asset.name)
                .map(|config| config.id)
                .ok_or_else(|| Error::Runtime {
                    key: key.clone(),
                    source: crate::runtime::Error::Conflict {
                        name: asset.name.clone(),
                        message: "created and gone again".to_owned(),
                    },
                })?,
            Err(source) => return Err(runtime_error(source)),
        };
        tracing::info!(%key, config = %asset.name, "asset config created");
        ids.insert(asset.name.clone(), id);
    }
    for config in &mut spec.configs {
        if let Some(id) = ids.get(&config.config_name) {
            config.config_id.clone_from(id);
        }
    }
    Ok(spec)
}

/// Removes the configs of `assets` other than their current ones that no service uses
/// (Swarm refuses to remove one in use: it is tried again after the next change).
pub(super) async fn remove_stale_configs<R: Runtime>(ctx: &Ctx<R>, assets: &[AssetConfig]) {
    let current: BTreeSet<&str> = assets.iter().map(|asset| asset.name.as_str()).collect();
    let keys: BTreeSet<&ResourceKey> = assets.iter().map(|asset| &asset.asset).collect();
    for asset in keys {
        remove_stale_configs_of(ctx, asset, &current).await;
    }
}

/// Removes the configs of `asset` not named in `current` that no service uses.
async fn remove_stale_configs_of<R: Runtime>(
    ctx: &Ctx<R>,
    asset: &ResourceKey,
    current: &BTreeSet<&str>,
) {
    let listed = ctx
        .runtime
        .list_configs(&[
            (labels::AGENT, ctx.agent_id.as_str()),
            (labels::KIND, Kind::Asset.as_str()),
            (labels::SCOPE, asset.scope.as_str()),
            (labels::NAME, asset.name.as_str()),
        ])
        .await
        .unwrap_or_default();
    for config in listed {
        if current.contains(config.name.as_str()) {
            continue;
        }
        match ctx.runtime.remove_config(&config.id).await {
            Ok(()) => tracing::info!(config = %config.name, "unused asset config removed"),
            Err(error) => {
                tracing::debug!(config = %config.name, %error, "asset config still in use")
            }
        }
    }
}

/// An asset left the repo: its configs that no service uses go.
pub(super) async fn remove_asset_configs<R: Runtime>(ctx: &Ctx<R>, asset: &ResourceKey) {
    remove_stale_configs_of(ctx, asset, &BTreeSet::new()).await;
}

/// The asset's configs but `current` that no service uses go.
pub(super) async fn remove_asset_configs_but<R: Runtime>(
    ctx: &Ctx<R>,
    asset: &ResourceKey,
    current: &[String],
) {
    let current: BTreeSet<&str> = current.iter().map(String::as_str).collect();
    remove_stale_configs_of(ctx, asset, &current).await;
}

/// An asset file's bytes, at most a config's size.
async fn read_asset(key: &ResourceKey, path: &Path) -> Result<Vec<u8>> {
    let owned = path.to_owned();
    let read = tokio::task::spawn_blocking(move || std::fs::read(owned))
        .await
        .unwrap_or_else(|error| Err(std::io::Error::other(error.to_string())));
    let data = read.map_err(|error| Error::Permanent {
        key: key.clone(),
        reason: FailureReason::Files,
        message: format!("cannot read asset file {}: {error}", path.display()),
    })?;
    if data.len() > crate::runtime::service::MAX_CONFIG_BYTES {
        return Err(Error::Permanent {
            key: key.clone(),
            reason: FailureReason::SwarmUnsupported,
            message: format!(
                "asset file {} is {} bytes; a Swarm config holds at most {} bytes",
                path.display(),
                data.len(),
                crate::runtime::service::MAX_CONFIG_BYTES
            ),
        });
    }
    Ok(data)
}

/// The key's services, their tasks and the swarm's nodes.
pub(super) async fn observe_services<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
) -> Result<SwarmSeen> {
    let runtime_error = Error::runtime(key);
    let services = ctx
        .runtime
        .list_services(&service_filter(&ctx.agent_id, key))
        .await
        .map_err(&runtime_error)?;
    let mut tasks = Vec::new();
    for service in &services {
        tasks.extend(
            ctx.runtime
                .list_tasks(&service.id)
                .await
                .map_err(&runtime_error)?,
        );
    }
    let nodes = ctx.runtime.list_nodes().await.map_err(&runtime_error)?;
    Ok(SwarmSeen {
        services,
        tasks,
        nodes,
    })
}

fn container_state(state: TaskState) -> ContainerState {
    match state {
        TaskState::Starting => ContainerState::Created,
        TaskState::Running => ContainerState::Running,
        TaskState::Complete | TaskState::Shutdown | TaskState::Failed | TaskState::Rejected => {
            ContainerState::Exited
        }
        TaskState::Other => ContainerState::Other,
    }
}

/// The live tasks (wanted running, or still running while Swarm replaces them) as replicas
/// named by `name_of`, ready once running for `settle` (Swarm reports a task with a health
/// check running only once it is healthy); `is_current` tells the target version.
pub(super) fn observed(
    seen: SwarmSeen,
    settle: Duration,
    name_of: impl Fn(&Task) -> String,
    is_current: impl Fn(&crate::runtime::Container) -> bool,
) -> Observed {
    let now = now_unix();
    let settle = i64::try_from(settle.as_secs()).unwrap_or(i64::MAX);
    // A task's state is what its node last reported: on a node that is down it is unknown.
    let down: BTreeSet<&str> = seen
        .nodes
        .iter()
        .filter(|node| node.state != crate::runtime::NodeState::Ready)
        .map(|node| node.id.as_str())
        .collect();
    let mut actual = Vec::new();
    let mut readiness = BTreeMap::new();
    for task in &seen.tasks {
        let lost = !task.node_id.is_empty() && down.contains(task.node_id.as_str());
        // Swarm replaced it (or stops it): not a replica any more, whatever it last said.
        if lost && task.desired != TaskState::Running {
            continue;
        }
        let state = if lost { TaskState::Other } else { task.state };
        let live =
            (task.desired == TaskState::Running && !state.ended()) || state == TaskState::Running;
        if !live {
            continue;
        }
        let name = name_of(task);
        let ready = state == TaskState::Running && now - task.since >= settle;
        let reason = if ready {
            String::new()
        } else if lost {
            format!("its node {} is down", task.node_id)
        } else if state == TaskState::Running {
            "running, settling".to_owned()
        } else {
            let why = if task.error.is_empty() {
                &task.message
            } else {
                &task.error
            };
            format!("task {}: {why}", task.state.as_str())
        };
        readiness.insert(name.clone(), ReplicaReadiness { ready, reason });
        actual.push(crate::runtime::Container {
            id: task.id.clone(),
            name,
            image: task.image.clone(),
            labels: task.labels.clone(),
            state: container_state(state),
        });
    }
    actual.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    let waiting = gate::waiting(&actual, is_current, &readiness);
    Observed {
        actual,
        readiness,
        waiting,
        inits: Vec::new(),
        swarm: Some(seen),
    }
}

/// How soon a pass looks again while Swarm converges by itself: tasks it starts or replaces
/// send no event the agent waits for.
const CONVERGING: Duration = Duration::from_secs(2);
/// How often a converged Swarm resource is looked at again: a node lost, a task
/// rescheduled on another node, send the agent's engine no container event.
const WATCH: Duration = Duration::from_secs(15);

/// `CONVERGING` while the plan waits for Swarm or a replica is not ready yet, else `WATCH`.
pub(super) fn look_again<S>(steps: &[S], observed: &Observed) -> Option<Duration> {
    Some(if !steps.is_empty() || !observed.waiting.is_empty() {
        CONVERGING
    } else {
        WATCH
    })
}

/// A status with no message of its own says which nodes are down and `then`, what that
/// means for the kind's tasks.
pub(super) fn say_lost_nodes(status: &mut ResourceStatus, observed: &Observed, then: &str) {
    let Some(seen) = &observed.swarm else {
        return;
    };
    let lost = lost_nodes(seen);
    if !lost.is_empty() && status.message.is_empty() {
        status.message = format!("node(s) down: {}; {then}", lost.join(", "));
    }
}

/// The nodes that are down and ran (or were to run) tasks of `seen`: `hostname (id)`.
fn lost_nodes(seen: &SwarmSeen) -> Vec<String> {
    let used: BTreeSet<&str> = seen
        .tasks
        .iter()
        .map(|task| task.node_id.as_str())
        .collect();
    seen.nodes
        .iter()
        .filter(|node| {
            node.state != crate::runtime::NodeState::Ready && used.contains(node.id.as_str())
        })
        .map(|node| format!("{} ({})", node.hostname, &node.id[..node.id.len().min(12)]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node that is down reports nothing: its replaced task is no replica any more, and a
    /// task Swarm still wants there (a pinned pod) is down, not running as last reported.
    #[test]
    fn tasks_of_a_node_that_is_down_are_not_counted_running() {
        let task = |id: &str, node: &str, desired: TaskState| Task {
            id: id.to_owned(),
            service_id: "svc".to_owned(),
            slot: Some(1),
            node_id: node.to_owned(),
            desired,
            state: TaskState::Running,
            message: "started".to_owned(),
            error: String::new(),
            since: 0,
            labels: BTreeMap::new(),
            image: "busybox".to_owned(),
            container_id: String::new(),
            exit_code: None,
        };
        let node = |id: &str, state: crate::runtime::NodeState| crate::runtime::Node {
            id: id.to_owned(),
            hostname: id.to_owned(),
            state,
            availability: "active".to_owned(),
            manager: false,
        };
        let seen = SwarmSeen {
            services: Vec::new(),
            tasks: vec![
                task("a", "n1", TaskState::Running),
                task("replaced", "n3", TaskState::Shutdown),
                task("pinned", "n3", TaskState::Running),
            ],
            nodes: vec![
                node("n1", crate::runtime::NodeState::Ready),
                node("n3", crate::runtime::NodeState::Down),
            ],
        };
        let observed = observed(seen, Duration::ZERO, |task| task.id.clone(), |_| true);
        let names: Vec<&str> = observed.actual.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["a", "pinned"]);
        assert_eq!(
            observed.actual[1].state,
            crate::runtime::ContainerState::Other
        );
        assert!(observed.readiness["a"].ready);
        assert!(!observed.readiness["pinned"].ready);
        assert_eq!(observed.readiness["pinned"].reason, "its node n3 is down");
    }

    #[test]
    fn asset_binds_become_configs_named_after_their_digest() {
        let root = Path::new("/data/assets");
        let digests = BTreeMap::from([(
            "shop.cfg.nginx.conf".to_owned(),
            "0123456789abcdef".to_owned(),
        )]);
        let (kept, configs) = asset_mounts(
            root,
            &[
                "/data/assets/shop/cfg/nginx.conf:/etc/nginx/nginx.conf:ro".to_owned(),
                "/srv/data:/data".to_owned(),
                "vol:/var/lib".to_owned(),
            ],
            &digests,
        );
        assert_eq!(kept, ["/srv/data:/data", "vol:/var/lib"]);
        assert_eq!(configs.len(), 1);
        let (config, target) = &configs[0];
        assert_eq!(config.name, "shop-cfg-nginx.conf-01234567");
        assert_eq!(target, "/etc/nginx/nginx.conf");
        assert_eq!(config.asset, ResourceKey::new(Kind::Asset, "shop", "cfg"));
        let long = config_name(
            &ResourceKey::new(Kind::Asset, "s", "n".repeat(80)),
            "k",
            "ffffffffff",
        );
        assert!(long.len() <= 64 && long.ends_with("-ffffffff"), "{long}");
    }

    #[test]
    fn probes_become_a_health_check() {
        let probe =
            |json: serde_json::Value| -> Option<Probes> { serde_json::from_value(json).ok() };
        let http = probe(
            serde_json::json!({"readiness": {"http_get": {"path": "/up", "port": 8080}, "period": "2s", "failure_threshold": 2}}),
        );
        let check = health_check(http.as_ref())
            .map(|check| (check.test.join(" "), check.interval, check.retries));
        assert_eq!(
            check,
            Some((
                "CMD wget -q -O /dev/null -T 1 http://127.0.0.1:8080/up".to_owned(),
                Duration::from_secs(2),
                2
            ))
        );
        let exec =
            probe(serde_json::json!({"liveness": {"exec": {"command": ["test", "-f", "/ok"]}}}));
        assert_eq!(
            health_check(exec.as_ref()).map(|check| check.test),
            Some(vec!["CMD".into(), "test".into(), "-f".into(), "/ok".into()])
        );
        assert_eq!(health_check(None), None);
    }
}
