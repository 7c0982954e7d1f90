//! `DockerRuntime`: the `Runtime` verbs on a real engine through bollard (unix socket,
//! `DOCKER_HOST` honoured when it is `unix://…`), with the API version negotiated at connect;
//! the requests that only read, decoded into the fields read, through `docker_api`.
//!
//! Invariants: managed containers run with `init = true`, so a busybox `sleep` as the command
//! still stops on SIGTERM instead of waiting out the grace period (a PID 1 without a handler
//! ignores SIGTERM). A network `ensure_network` made sure of is remembered as existing
//! (`known_networks`), so the next call costs no engine request; the memory is dropped
//! whenever the engine answers that a network is missing or ambiguous (a create, connect or
//! start naming one removed by hand, or made twice by another process), and the next
//! `ensure_network` asks the engine again (and removes the duplicate).

use std::collections::HashMap;

use bollard::Docker;

/// Most bytes of a piped exec's stderr kept for its outcome.
const EXEC_ERROR_TAIL: usize = 8 * 1024;
use std::collections::BTreeMap;

use bollard::auth::DockerCredentials;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::{
    ContainerCreateBody, DeviceMapping, DeviceRequest, EndpointSettings, ExecConfig, HostConfig,
    HostConfigLogConfig, NetworkConnectRequest, NetworkCreateRequest, NetworkingConfig,
    PortBinding, ResourcesUlimits, RestartPolicy, RestartPolicyNameEnum, VolumeCreateRequest,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, KillContainerOptionsBuilder,
    LogsOptionsBuilder, RemoveContainerOptionsBuilder, RemoveVolumeOptions,
    StopContainerOptionsBuilder,
};
use futures_util::StreamExt as _;

use super::docker_api;
use super::{
    Container, ContainerSpec, ContainerState, Containers, Error, ExecOutcome, ImageInfo,
    Inspection, PublishedPort, RegistryAuth, Result, Volume,
};

/// Seconds a container gets between SIGTERM and SIGKILL when the agent removes it.
const STOP_GRACE_SECONDS: i32 = 10;

/// A connected Docker engine.
#[derive(Clone)]
pub struct DockerRuntime {
    pub(super) docker: Docker,
    /// The requests whose answers are decoded here, into the fields read (`docker_api`).
    pub(super) api: super::docker_api::Api,
    /// Serialises network creation: the engine accepts two networks with one name, so two
    /// concurrent "inspect, then create" would make the name ambiguous.
    pub(super) network_lock: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// Networks `ensure_network` made sure of, until the engine says one is missing.
    pub(super) known_networks: std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
    /// Labels every container, volume, service and config this runtime creates carries
    /// (`with_labels`).
    pub(super) stamp: BTreeMap<String, String>,
}

impl DockerRuntime {
    /// Ids of the networks named exactly `name` (the engine's name filter also matches
    /// substrings).
    pub(super) async fn network_ids(&self, name: &str) -> Result<Vec<String>> {
        let filters = docker_api::filters(&BTreeMap::from([("name", vec![name.to_owned()])]));
        let networks: Vec<docker_api::NetworkSummary> =
            self.api.get("/networks", &[("filters", &filters)]).await?;
        Ok(networks
            .into_iter()
            .filter(|network| network.name.as_deref() == Some(name))
            .filter_map(|network| network.id)
            .collect())
    }

    /// Connects with the local defaults (`DOCKER_HOST` or `/var/run/docker.sock`) and
    /// negotiates the API version the engine speaks.
    pub async fn connect() -> Result<DockerRuntime> {
        let docker = Docker::connect_with_local_defaults().map_err(classify)?;
        let docker = docker.negotiate_version().await.map_err(classify)?;
        let api = super::docker_api::Api::new(&docker.client_version())?;
        Ok(DockerRuntime {
            docker,
            api,
            network_lock: std::sync::Arc::default(),
            known_networks: std::sync::Arc::default(),
            stamp: BTreeMap::new(),
        })
    }

    /// Adds `labels` to every container and volume created from now on (the agent's
    /// `voodu.data_dir`); a label the spec sets itself wins.
    pub(crate) fn with_labels(mut self, labels: BTreeMap<String, String>) -> DockerRuntime {
        self.stamp.extend(labels);
        self
    }

    fn networks(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<String>> {
        self.known_networks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `result`, forgetting every network known to exist when it says a network is missing or
    /// ambiguous.
    fn noting_networks<T>(&self, result: Result<T>) -> Result<T> {
        if let Err(error) = &result {
            let text = error.to_string();
            // Missing (removed by hand), or ambiguous (another process made a second one).
            if text.contains("network")
                && ["not found", "No such", "ambiguous"]
                    .iter()
                    .any(|what| text.contains(what))
            {
                self.networks().clear();
            }
        }
        result
    }

    /// Containers (running or not) that `filters` select, as the engine's filters read.
    async fn list_filtered(&self, filters: BTreeMap<&str, Vec<String>>) -> Result<Vec<Container>> {
        let filters = docker_api::filters(&filters);
        let summaries: Vec<docker_api::ContainerSummary> = self
            .api
            .get(
                "/containers/json",
                &[("all", "true"), ("filters", &filters)],
            )
            .await?;
        Ok(summaries
            .into_iter()
            .map(|summary| Container {
                id: summary.id.unwrap_or_default(),
                name: summary
                    .names
                    .and_then(|names| names.into_iter().next())
                    .map(|name| name.trim_start_matches('/').to_owned())
                    .unwrap_or_default(),
                image: summary.image.unwrap_or_default(),
                labels: summary.labels.unwrap_or_default(),
                state: state_of(summary.state.as_deref()),
            })
            .collect())
    }

    /// An exec's exit code once it ended (-1 when the engine has none).
    async fn exec_exit_code(&self, exec_id: &str) -> Result<i64> {
        let path = format!("/exec/{}/json", docker_api::segment(exec_id)?);
        let inspected: docker_api::ExecInspect = self.api.get(&path, &[]).await?;
        Ok(inspected.exit_code.unwrap_or(-1))
    }

    /// `GET /images/{image}/json`.
    async fn inspect_image(&self, image: &str) -> Result<docker_api::ImageInspect> {
        let path = format!("/images/{}/json", docker_api::segment(image)?);
        self.api.get(&path, &[]).await
    }

    fn stamped(&self, labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut stamped = self.stamp.clone();
        stamped.extend(
            labels
                .iter()
                .map(|(key, value)| (key.clone(), value.clone())),
        );
        stamped
    }
}

/// A container on a network that does not exist, as an engine in a swarm says it (a 500,
/// where a standalone engine answers 404): the same missing network, so the same `NotFound`
/// (the agent creates the network and tries again) rather than a permanent refusal.
fn swarm_network_missing(message: &str) -> bool {
    message.starts_with("Could not attach to network") && message.contains("not found")
}

/// Turns a bollard error into a runtime error, classified for the retry policy.
///
/// Transient (`Unavailable`, `Conflict`, `NotFound`): failures to reach the engine at all
/// (socket missing, connection refused or reset, timeouts: every error that is not an engine
/// answer), a 502/503/504, and a 500 whose message is about availability
/// (`about_availability`: containerd unreachable, a deadline exceeded, the host out of
/// space…); 404 and 409 keep their own meanings (gone meanwhile, a name still being
/// released). Permanent (`Invalid`, with the engine's message): every other answer — a 4xx
/// (400 invalid parameter, 401/403 refused, e.g. by an authorization plugin) and the 500s
/// that report a bad spec (a device it cannot add, a user the image lacks, caps it may not
/// apply, an OCI runtime refusal): retrying the same spec cannot help.
pub(super) fn classify(error: bollard::errors::Error) -> Error {
    match error {
        bollard::errors::Error::DockerResponseServerError {
            status_code,
            message,
        } => classify_answer(status_code, message),
        other => Error::Unavailable {
            message: other.to_string(),
        },
    }
}

/// An engine's error answer, `status_code` with its `message`, classified as `classify` says.
pub(super) fn classify_answer(status_code: u16, message: String) -> Error {
    match status_code {
        404 => Error::NotFound { what: message },
        400..=599 if swarm_network_missing(&message) => Error::NotFound { what: message },
        409 => Error::Conflict {
            name: String::new(),
            message,
        },
        500 if about_availability(&message) => Error::Unavailable {
            message: format!("HTTP {status_code}: {message}"),
        },
        502..=504 => Error::Unavailable {
            message: format!("HTTP {status_code}: {message}"),
        },
        400..=599 => Error::Invalid { message },
        _ => Error::Unavailable {
            message: format!("HTTP {status_code}: {message}"),
        },
    }
}

/// Whether an engine's HTTP 500 is about the engine or the host being unable to serve right
/// now (its containerd, the network to a registry, disk space, a lock), rather than about
/// the request: the engine answers 500 for both.
fn about_availability(message: &str) -> bool {
    const AVAILABILITY: [&str; 22] = [
        "connection refused",
        "connection reset",
        "broken pipe",
        "timeout",
        "timed out",
        "deadline exceeded",
        "context canceled",
        "no such host",
        "network is unreachable",
        "temporary failure",
        "temporarily unavailable",
        "code = unavailable",
        "service unavailable",
        "transport is closing",
        "error while dialing",
        "ttrpc: closed",
        "is shutting down",
        "no space left on device",
        "too many open files",
        "toomanyrequests",
        "too many requests",
        "xtables lock",
    ];
    let message = message.to_lowercase();
    AVAILABILITY.iter().any(|marker| message.contains(marker))
}

fn state_of(state: Option<&str>) -> ContainerState {
    match state {
        Some("created") => ContainerState::Created,
        Some("running") => ContainerState::Running,
        Some("restarting") => ContainerState::Restarting,
        Some("exited" | "dead") => ContainerState::Exited,
        _ => ContainerState::Other,
    }
}

fn restart_policy(name: &str) -> RestartPolicy {
    let name = match name {
        "" | "no" => RestartPolicyNameEnum::NO,
        "always" => RestartPolicyNameEnum::ALWAYS,
        text if text.starts_with("on-failure") => RestartPolicyNameEnum::ON_FAILURE,
        _ => RestartPolicyNameEnum::UNLESS_STOPPED,
    };
    RestartPolicy {
        name: Some(name),
        maximum_retry_count: None,
    }
}

/// `repo[:tag]` (a `@digest` stays in the repository part) → `(repository, tag)`.
fn split_image(image: &str) -> (&str, &str) {
    if image.contains('@') {
        return (image, "");
    }
    match image.rsplit_once(':') {
        Some((repository, tag)) if !tag.contains('/') => (repository, tag),
        _ => (image, "latest"),
    }
}

/// The endpoint settings for every network a container joins: its DNS aliases.
fn endpoint(spec: &ContainerSpec) -> EndpointSettings {
    EndpointSettings {
        aliases: Some(spec.aliases.clone()).filter(|aliases| !aliases.is_empty()),
        ..EndpointSettings::default()
    }
}

/// The create request for `spec`: voodu's `docker run` flags (spec §6.5) as API fields.
fn create_body(spec: &ContainerSpec) -> ContainerCreateBody {
    let options = &spec.options;
    let bridge = spec.network_mode.is_empty();
    let primary = spec.networks.first().cloned();
    let (port_bindings, exposed_ports) = ports(spec);
    let mut env = spec.env.clone();
    env.extend(options.env.iter().cloned());
    let mut labels: HashMap<String, String> = options.labels.clone().into_iter().collect();
    labels.extend(spec.labels.clone());
    ContainerCreateBody {
        image: Some(spec.image.clone()),
        cmd: spec.command.clone(),
        entrypoint: options.entrypoint.as_ref().map(|entrypoint| {
            if entrypoint.is_empty() {
                vec![String::new()]
            } else {
                vec![entrypoint.clone()]
            }
        }),
        env: Some(env),
        labels: Some(labels),
        exposed_ports: Some(exposed_ports).filter(|ports| !ports.is_empty() && bridge),
        tty: Some(spec.tty).filter(|on| *on),
        user: options.user.clone(),
        working_dir: options.workdir.clone(),
        hostname: options.hostname.clone(),
        stop_signal: options.stop_signal.clone(),
        stop_timeout: options.stop_timeout,
        host_config: Some(host_config(spec, port_bindings)),
        networking_config: primary.filter(|_| bridge).map(|network| NetworkingConfig {
            endpoints_config: Some(HashMap::from([(network, endpoint(spec))])),
        }),
        ..ContainerCreateBody::default()
    }
}

/// The published ports: their bindings, by `port/protocol`, and the ports to expose.
fn ports(spec: &ContainerSpec) -> (HashMap<String, Option<Vec<PortBinding>>>, Vec<String>) {
    let mut port_bindings: HashMap<String, Option<Vec<PortBinding>>> = HashMap::new();
    let mut exposed_ports = Vec::new();
    for port in &spec.ports {
        let container_port = format!("{}/{}", port.container_port, port.protocol);
        exposed_ports.push(container_port.clone());
        port_bindings
            .entry(container_port)
            .or_insert_with(|| Some(Vec::new()))
            .get_or_insert_with(Vec::new)
            .push(PortBinding {
                host_ip: Some(port.host_ip.clone()).filter(|ip| !ip.is_empty()),
                host_port: Some(port.host_port.map(|p| p.to_string()).unwrap_or_default()),
            });
    }
    (port_bindings, exposed_ports)
}

/// The host side of the request: mounts, ports, restart policy, networking, limits and the
/// `docker_options` flags.
fn host_config(
    spec: &ContainerSpec,
    port_bindings: HashMap<String, Option<Vec<PortBinding>>>,
) -> HostConfig {
    let options = &spec.options;
    let bridge = spec.network_mode.is_empty();
    let primary = spec.networks.first().cloned();
    let mut extra_hosts = Vec::new();
    if bridge {
        extra_hosts.push("host.docker.internal:host-gateway".to_owned());
        extra_hosts.extend(spec.extra_hosts.iter().cloned());
        extra_hosts.extend(options.add_hosts.iter().cloned());
    }
    let mut cap_add = spec.cap_add.clone();
    cap_add.extend(options.cap_add.iter().cloned());
    let non_empty = |items: &[String]| (!items.is_empty()).then(|| items.to_vec());
    HostConfig {
        binds: non_empty(&spec.binds),
        port_bindings: Some(port_bindings).filter(|ports| !ports.is_empty() && bridge),
        restart_policy: Some(restart_policy(&spec.restart)),
        init: Some(true),
        extra_hosts: Some(extra_hosts).filter(|hosts| !hosts.is_empty()),
        cap_add: non_empty(&cap_add),
        cap_drop: non_empty(&options.cap_drop),
        network_mode: if bridge {
            primary.clone()
        } else {
            Some(spec.network_mode.clone())
        },
        ulimits: Some(
            spec.ulimits
                .iter()
                .map(|(name, soft, hard)| ResourcesUlimits {
                    name: Some(name.clone()),
                    soft: Some(*soft),
                    hard: Some(*hard),
                })
                .collect::<Vec<_>>(),
        )
        .filter(|ulimits| !ulimits.is_empty()),
        nano_cpus: spec.nano_cpus,
        memory: spec.memory,
        log_config: log_config(spec),
        shm_size: options.shm_size,
        sysctls: Some(options.sysctls.clone().into_iter().collect())
            .filter(|s: &HashMap<_, _>| !s.is_empty()),
        pids_limit: options.pids_limit,
        privileged: Some(options.privileged).filter(|on| *on),
        devices: devices(options),
        device_requests: options.gpus.map(|count| {
            vec![DeviceRequest {
                count: Some(count),
                capabilities: Some(vec![vec!["gpu".to_owned()]]),
                ..DeviceRequest::default()
            }]
        }),
        security_opt: non_empty(&options.security_opt),
        readonly_rootfs: Some(options.read_only).filter(|on| *on),
        tmpfs: Some(options.tmpfs.clone().into_iter().collect())
            .filter(|t: &HashMap<_, _>| !t.is_empty()),
        ipc_mode: options.ipc.clone(),
        pid_mode: options.pid.clone(),
        memory_swap: options.memory_swap,
        memory_reservation: options.memory_reservation,
        cpuset_cpus: options.cpuset_cpus.clone(),
        cpu_shares: options.cpu_shares,
        oom_score_adj: options.oom_score_adj,
        oom_kill_disable: Some(options.oom_kill_disable).filter(|on| *on),
        dns: non_empty(&options.dns),
        dns_search: non_empty(&options.dns_search),
        dns_options: non_empty(&options.dns_options),
        group_add: non_empty(&options.group_add),
        ..HostConfig::default()
    }
}

/// `--log-driver` and `--log-opt`, else json-file rotation when the spec asks for it.
fn log_config(spec: &ContainerSpec) -> Option<HostConfigLogConfig> {
    let options = &spec.options;
    match &options.log_driver {
        Some(driver) => Some(HostConfigLogConfig {
            typ: Some(driver.clone()),
            config: Some(options.log_opts.clone().into_iter().collect())
                .filter(|c: &HashMap<_, _>| !c.is_empty()),
        }),
        None => {
            let mut config: HashMap<String, String> =
                options.log_opts.clone().into_iter().collect();
            if let Some(size) = &spec.log_max_size {
                config.insert("max-size".to_owned(), size.clone());
            }
            if let Some(files) = spec.log_max_files {
                config.insert("max-file".to_owned(), files.to_string());
            }
            (!config.is_empty()).then(|| HostConfigLogConfig {
                typ: Some("json-file".to_owned()),
                config: Some(config),
            })
        }
    }
}

/// `--device host[:container[:permissions]]`.
fn devices(options: &super::DockerOptions) -> Option<Vec<DeviceMapping>> {
    Some(
        options
            .devices
            .iter()
            .map(|device| {
                let mut parts = device.splitn(3, ':');
                let host = parts.next().unwrap_or_default().to_owned();
                let container = parts.next().map_or_else(|| host.clone(), ToOwned::to_owned);
                DeviceMapping {
                    path_on_host: Some(host),
                    path_in_container: Some(container),
                    cgroup_permissions: Some(parts.next().unwrap_or("rwm").to_owned()),
                }
            })
            .collect::<Vec<_>>(),
    )
    .filter(|devices| !devices.is_empty())
}

/// Ids per `list_by_id` request.
const LIST_BY_ID_CHUNK: usize = 100;

impl Containers for DockerRuntime {
    async fn list(&self, filter: &[(&str, &str)]) -> Result<Vec<Container>> {
        let labels: Vec<String> = filter
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect();
        self.list_filtered(BTreeMap::from([("label", labels)]))
            .await
    }

    async fn list_by_id(&self, ids: &[String]) -> Result<Vec<Container>> {
        let mut found = Vec::new();
        // A bounded query string per request (a full id is 64 characters).
        for chunk in ids.chunks(LIST_BY_ID_CHUNK) {
            found.extend(
                self.list_filtered(BTreeMap::from([("id", chunk.to_vec())]))
                    .await?,
            );
        }
        Ok(found)
    }

    async fn create(&self, spec: &ContainerSpec) -> Result<String> {
        // When each create is asked of the engine (`--log warn,voodu_agent::runtime=debug`):
        // what `benches/mttp.rs` times a change and a drift repair to.
        tracing::debug!(container = %spec.name, "creating a container");
        let body = if self.stamp.is_empty() {
            create_body(spec)
        } else {
            create_body(&ContainerSpec {
                labels: self.stamped(&spec.labels),
                ..spec.clone()
            })
        };
        let options = CreateContainerOptionsBuilder::default()
            .name(&spec.name)
            .build();
        let created = self.noting_networks(
            self.docker
                .create_container(Some(options), body)
                .await
                .map_err(|error| match classify(error) {
                    // Newer engines also answer 404 for a missing network at create (20.10 waits
                    // for start): that is not a missing image.
                    Error::NotFound { what }
                        if what.contains("network") && !what.contains("image") =>
                    {
                        Error::NotFound { what }
                    }
                    Error::NotFound { what } => Error::ImageMissing {
                        image: spec.image.clone(),
                        message: what,
                    },
                    Error::Conflict { message, .. } => Error::Conflict {
                        name: spec.name.clone(),
                        message,
                    },
                    other => other,
                }),
        )?;
        for network in spec.networks.iter().skip(1) {
            let request = NetworkConnectRequest {
                container: created.id.clone(),
                endpoint_config: Some(endpoint(spec)),
            };
            if let Err(error) = self.docker.connect_network(network, request).await {
                // A container half-attached would differ from its spec: take it away again.
                let _ = self.remove(&created.id).await;
                return self.noting_networks(Err(classify(error)));
            }
        }
        Ok(created.id)
    }

    async fn start(&self, id: &str) -> Result<()> {
        self.noting_networks(
            self.docker
                .start_container(id, None)
                .await
                .map_err(classify),
        )
    }

    async fn remove(&self, id: &str) -> Result<()> {
        let stop = StopContainerOptionsBuilder::default()
            .t(STOP_GRACE_SECONDS)
            .build();
        // Any stop answer (gone, already stopped) is fine: the forced removal settles it.
        let _ = self.docker.stop_container(id, Some(stop)).await;
        let options = RemoveContainerOptionsBuilder::default().force(true).build();
        match self
            .docker
            .remove_container(id, Some(options))
            .await
            .map_err(classify)
        {
            Ok(()) | Err(Error::NotFound { .. }) => Ok(()),
            Err(other) => Err(other),
        }
    }

    async fn stop(&self, id: &str, grace: std::time::Duration) -> Result<()> {
        // TERM, our own wait, then KILL (what `docker stop -t` does), so a long grace never
        // holds one HTTP request open past the client's timeout.
        let signal = |name: &str| KillContainerOptionsBuilder::default().signal(name).build();
        match self
            .docker
            .kill_container(id, Some(signal("SIGTERM")))
            .await
            .map_err(classify)
        {
            Ok(()) => {}
            // Gone (404) or not running (409): nothing to stop.
            Err(Error::NotFound { .. } | Error::Conflict { .. }) => return Ok(()),
            Err(other) => return Err(other),
        }
        if tokio::time::timeout(grace, self.wait(id)).await.is_ok() {
            return Ok(());
        }
        match self
            .docker
            .kill_container(id, Some(signal("SIGKILL")))
            .await
            .map_err(classify)
        {
            Ok(()) | Err(Error::NotFound { .. } | Error::Conflict { .. }) => Ok(()),
            Err(other) => Err(other),
        }
    }

    async fn ensure_network(&self, name: &str) -> Result<()> {
        if self.networks().contains(name) {
            return Ok(());
        }
        let _guard = self.network_lock.lock().await;
        let mut ids = self.network_ids(name).await?;
        if ids.is_empty() {
            let request = NetworkCreateRequest {
                name: name.to_owned(),
                driver: Some("bridge".to_owned()),
                ..NetworkCreateRequest::default()
            };
            match self.docker.create_network(request).await.map_err(classify) {
                Ok(_) | Err(Error::Conflict { .. }) => {}
                Err(other) => return Err(other),
            }
            ids = self.network_ids(name).await?;
        }
        // The engine keys networks by id: two agents (processes) creating the same name at
        // once both succeed, and every later use of the name is then "ambiguous". Every agent
        // keeps the network with the smallest id and removes the others, so racing agents
        // converge on the same one; removing one in use fails and is left for the next call.
        ids.sort_unstable();
        for extra in ids.iter().skip(1) {
            if let Err(error) = self.docker.remove_network(extra).await {
                tracing::debug!(network = name, id = %extra, %error, "duplicate network kept for now");
            }
        }
        self.networks().insert(name.to_owned());
        Ok(())
    }

    async fn inspect(&self, id: &str) -> Result<Inspection> {
        let response: docker_api::ContainerInspect = self
            .api
            .get(
                &format!("/containers/{}/json", docker_api::segment(id)?),
                &[],
            )
            .await?;
        let state = response.state.unwrap_or_default();
        let settings = response.network_settings.unwrap_or_default();
        let mut published_ports: Vec<PublishedPort> = settings
            .ports
            .unwrap_or_default()
            .into_iter()
            .flat_map(|(port, bindings)| {
                let (number, protocol) = port.split_once('/').unwrap_or((&port, "tcp"));
                let container_port = number.parse::<u16>().ok();
                let protocol = protocol.to_owned();
                bindings
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(move |binding| {
                        Some(PublishedPort {
                            container_port: container_port?,
                            protocol: protocol.clone(),
                            host_ip: binding.host_ip.unwrap_or_default(),
                            host_port: binding.host_port?.parse().ok()?,
                        })
                    })
            })
            .collect();
        // Sorted: for one port the engine lists `0.0.0.0` and `::`; digits sort before `:`,
        // so IPv4 bindings come first.
        published_ports.sort_unstable();
        let ip_addresses = settings
            .networks
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(network, endpoint)| {
                endpoint
                    .ip_address
                    .filter(|ip| !ip.is_empty())
                    .map(|ip| (network, ip))
            })
            .collect();
        Ok(Inspection {
            id: response.id.unwrap_or_default(),
            name: response
                .name
                .unwrap_or_default()
                .trim_start_matches('/')
                .to_owned(),
            running: state.running.unwrap_or(false),
            exit_code: (!state.running.unwrap_or(false))
                .then_some(state.exit_code)
                .flatten(),
            oom_killed: state.oom_killed.unwrap_or(false),
            restart_count: response.restart_count.unwrap_or(0),
            started_at: state.started_at.unwrap_or_default(),
            finished_at: state.finished_at.unwrap_or_default(),
            ip_addresses,
            labels: response
                .config
                .and_then(|config| config.labels)
                .unwrap_or_default(),
            published_ports,
        })
    }

    async fn wait(&self, id: &str) -> Result<i64> {
        let mut stream = self.docker.wait_container(id, None);
        match stream.next().await {
            Some(Ok(response)) => Ok(response.status_code),
            // bollard reports a non-zero exit as an error carrying the code.
            Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => Ok(code),
            Some(Err(error)) => Err(classify(error)),
            None => Err(Error::Unavailable {
                message: format!("the engine closed the wait on {id} without an answer"),
            }),
        }
    }

    async fn logs(&self, id: &str, tail: usize) -> Result<String> {
        let options = LogsOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .tail(&tail.to_string())
            .build();
        let mut stream = self.docker.logs(id, Some(options));
        let mut text = String::new();
        while let Some(chunk) = stream.next().await {
            text.push_str(&String::from_utf8_lossy(
                &chunk.map_err(classify)?.into_bytes(),
            ));
        }
        Ok(text)
    }

    fn log_stream(&self, id: &str, options: super::LogOptions) -> super::LogChunks {
        let since = options
            .since
            .map_or(0, |since| i32::try_from(since.max(0)).unwrap_or(i32::MAX));
        let tail = options
            .tail
            .map_or_else(|| "all".to_owned(), |tail| tail.to_string());
        let query = LogsOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .follow(options.follow)
            .since(since)
            .tail(&tail)
            .build();
        Box::pin(
            self.docker
                .logs(id, Some(query))
                .map(|chunk| Ok(chunk.map_err(classify)?.into_bytes().to_vec())),
        )
    }

    async fn exec(&self, id: &str, command: &[String]) -> Result<ExecOutcome> {
        let created = self
            .docker
            .create_exec(
                id,
                ExecConfig {
                    cmd: Some(command.to_vec()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..ExecConfig::default()
                },
            )
            .await
            .map_err(classify)?;
        let mut output = String::new();
        if let StartExecResults::Attached {
            output: mut stream, ..
        } = self
            .docker
            .start_exec(&created.id, None::<StartExecOptions>)
            .await
            .map_err(classify)?
        {
            while let Some(chunk) = stream.next().await {
                output.push_str(&String::from_utf8_lossy(
                    &chunk.map_err(classify)?.into_bytes(),
                ));
            }
        }
        Ok(ExecOutcome {
            exit_code: self.exec_exit_code(&created.id).await?,
            output,
        })
    }

    async fn exec_piped(
        &self,
        id: &str,
        command: &[String],
        stdin: Option<super::ExecInput>,
        stdout: Option<super::ExecOutput>,
    ) -> Result<ExecOutcome> {
        use tokio::io::AsyncWriteExt as _;
        let created = self
            .docker
            .create_exec(
                id,
                ExecConfig {
                    cmd: Some(command.to_vec()),
                    attach_stdin: Some(stdin.is_some()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..ExecConfig::default()
                },
            )
            .await
            .map_err(classify)?;
        let mut errors: Vec<u8> = Vec::new();
        if let StartExecResults::Attached {
            output: mut stream,
            mut input,
        } = self
            .docker
            .start_exec(&created.id, None::<StartExecOptions>)
            .await
            .map_err(classify)?
        {
            // stdin is copied beside the output stream (a command reading all of its input
            // before writing, or writing before reading, both go on), then closed.
            let feed = async move {
                if let Some(mut reader) = stdin {
                    let copied = tokio::io::copy(&mut reader, &mut input).await;
                    let _ = input.shutdown().await;
                    copied.map(|_| ())
                } else {
                    let _ = input.shutdown().await;
                    Ok(())
                }
            };
            let drain = async {
                let mut stdout = stdout;
                while let Some(chunk) = stream.next().await {
                    match chunk.map_err(classify)? {
                        bollard::container::LogOutput::StdOut { message } => {
                            if let Some(out) = stdout.as_mut() {
                                out.write_all(&message).await.map_err(|error| Error::Pipe {
                                    what: format!("writing the output of exec in {id}"),
                                    message: error.to_string(),
                                })?;
                            }
                        }
                        other => {
                            errors.extend_from_slice(&other.into_bytes());
                            let excess = errors.len().saturating_sub(EXEC_ERROR_TAIL);
                            errors.drain(..excess);
                        }
                    }
                }
                if let Some(out) = stdout.as_mut() {
                    out.shutdown().await.map_err(|error| Error::Pipe {
                        what: format!("closing the output of exec in {id}"),
                        message: error.to_string(),
                    })?;
                }
                Ok::<(), Error>(())
            };
            let (fed, drained) = tokio::join!(feed, drain);
            drained?;
            fed.map_err(|error| Error::Pipe {
                what: format!("feeding the input of exec in {id}"),
                message: error.to_string(),
            })?;
        }
        Ok(ExecOutcome {
            exit_code: self.exec_exit_code(&created.id).await?,
            output: String::from_utf8_lossy(&errors).into_owned(),
        })
    }

    async fn volume_path(&self, name: &str) -> Result<Option<std::path::PathBuf>> {
        let path = format!("/volumes/{}", docker_api::segment(name)?);
        match self.api.get::<docker_api::Volume>(&path, &[]).await {
            Ok(volume) => Ok(Some(std::path::PathBuf::from(volume.mountpoint))),
            Err(Error::NotFound { .. }) => Ok(None),
            Err(other) => Err(other),
        }
    }

    async fn ensure_volume(&self, name: &str, labels: &BTreeMap<String, String>) -> Result<Volume> {
        // Creating an existing volume is a no-op on the engine: it answers with the volume
        // as it is, its own labels kept.
        let request = VolumeCreateRequest {
            name: Some(name.to_owned()),
            labels: Some(self.stamped(labels).into_iter().collect()),
            ..VolumeCreateRequest::default()
        };
        let body = serde_json::to_vec(&request).map_err(|error| Error::Invalid {
            message: error.to_string(),
        })?;
        let volume: docker_api::Volume = self.api.post("/volumes/create", body).await?;
        Ok(Volume {
            name: volume.name,
            labels: volume.labels.unwrap_or_default(),
        })
    }

    async fn list_volumes(&self, filter: &[(&str, &str)]) -> Result<Vec<Volume>> {
        let labels: Vec<String> = filter
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect();
        let filters = docker_api::filters(&BTreeMap::from([("label", labels)]));
        let response: docker_api::VolumeList =
            self.api.get("/volumes", &[("filters", &filters)]).await?;
        Ok(response
            .volumes
            .unwrap_or_default()
            .into_iter()
            .map(|volume| Volume {
                name: volume.name,
                labels: volume.labels.unwrap_or_default(),
            })
            .collect())
    }

    async fn connect_network(&self, id: &str, name: &str) -> Result<()> {
        let request = NetworkConnectRequest {
            container: id.to_owned(),
            endpoint_config: None,
        };
        let result = self
            .docker
            .connect_network(name, request)
            .await
            .map_err(classify);
        match self.noting_networks(result) {
            Ok(()) => Ok(()),
            // Joined already.
            Err(Error::Conflict { .. }) => Ok(()),
            Err(Error::Invalid { message }) if message.contains("already exists") => Ok(()),
            Err(other) => Err(other),
        }
    }

    async fn remove_network(&self, name: &str) -> Result<()> {
        let _guard = self.network_lock.lock().await;
        self.networks().remove(name);
        for id in self.network_ids(name).await? {
            let inspected = match self
                .api
                .get::<docker_api::NetworkInspect>(
                    &format!("/networks/{}", docker_api::segment(&id)?),
                    &[],
                )
                .await
            {
                Ok(inspected) => inspected,
                Err(Error::NotFound { .. }) => continue,
                Err(other) => return Err(other),
            };
            for container in inspected.containers.unwrap_or_default().into_keys() {
                let request = bollard::models::NetworkDisconnectRequest {
                    container,
                    force: Some(true),
                };
                match self
                    .docker
                    .disconnect_network(&id, request)
                    .await
                    .map_err(classify)
                {
                    Ok(()) | Err(Error::NotFound { .. }) => {}
                    Err(other) => return Err(other),
                }
            }
            match self.docker.remove_network(&id).await.map_err(classify) {
                Ok(()) | Err(Error::NotFound { .. }) => {}
                Err(other) => return Err(other),
            }
        }
        Ok(())
    }

    async fn remove_volume(&self, name: &str) -> Result<()> {
        match self
            .docker
            .remove_volume(name, None::<RemoveVolumeOptions>)
            .await
            .map_err(classify)
        {
            Ok(()) | Err(Error::NotFound { .. }) => Ok(()),
            Err(other) => Err(other),
        }
    }

    async fn image_present(&self, image: &str) -> Result<bool> {
        match self.inspect_image(image).await {
            Ok(_) => Ok(true),
            Err(Error::NotFound { .. }) => Ok(false),
            Err(other) => Err(other),
        }
    }

    async fn image_info(&self, image: &str) -> Result<Option<ImageInfo>> {
        match self.inspect_image(image).await {
            Ok(found) => Ok(Some(ImageInfo {
                id: found.id.unwrap_or_default(),
                repo_digests: found.repo_digests.unwrap_or_default(),
            })),
            Err(Error::NotFound { .. }) => Ok(None),
            Err(other) => Err(other),
        }
    }

    async fn pull(&self, image: &str, auth: Option<&RegistryAuth>) -> Result<Option<String>> {
        let (repository, tag) = split_image(image);
        let options = CreateImageOptionsBuilder::default()
            .from_image(repository)
            .tag(tag)
            .build();
        let credentials = auth.map(|auth| DockerCredentials {
            username: Some(auth.username.clone()),
            password: Some(auth.password.clone()),
            serveraddress: Some(auth.server.clone()),
            ..DockerCredentials::default()
        });
        let mut stream = self.docker.create_image(Some(options), None, credentials);
        let mut digest = None;
        while let Some(progress) = stream.next().await {
            // The engine names the manifest it pulled: `Digest: sha256:…`.
            if let Ok(info) = &progress
                && let Some(found) = info
                    .status
                    .as_deref()
                    .and_then(|status| status.strip_prefix("Digest: "))
            {
                digest = Some(found.trim().to_owned());
            }
            if let Err(error) = progress {
                return Err(match classify(error) {
                    Error::NotFound { what } | Error::Invalid { message: what } => {
                        Error::ImageMissing {
                            image: image.to_owned(),
                            message: what,
                        }
                    }
                    Error::Unavailable { message } if registry_refused(&message) => {
                        Error::ImageMissing {
                            image: image.to_owned(),
                            message,
                        }
                    }
                    other => other,
                });
            }
        }
        Ok(digest)
    }

    fn events(&self, filter: &[(&str, &str)]) -> super::Events {
        let mut labels: Vec<String> = filter
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect();
        labels.sort_unstable();
        let filters = HashMap::from([
            ("type".to_owned(), vec!["container".to_owned()]),
            ("label".to_owned(), labels),
        ]);
        // The request goes out at the first poll: `since` = now makes the stream start at
        // the subscription, so nothing between subscribing and polling is lost.
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs());
        let options = bollard::query_parameters::EventsOptionsBuilder::default()
            .since(&since.to_string())
            .filters(&filters)
            .build();
        let stream = self.docker.events(Some(options)).map(|message| {
            let message = message.map_err(classify)?;
            let actor = message.actor.unwrap_or_default();
            let labels: BTreeMap<String, String> =
                crate::model::map_of(actor.attributes.unwrap_or_default());
            Ok(super::Event {
                id: actor.id.unwrap_or_default(),
                // The engine puts the name beside the labels in the event's attributes.
                name: labels.get("name").cloned().unwrap_or_default(),
                action: message.action.unwrap_or_default(),
                labels,
            })
        });
        Box::pin(stream)
    }

    async fn cpu_percent(&self, id: &str) -> Result<f64> {
        let path = format!("/containers/{}/stats", docker_api::segment(id)?);
        let sample: docker_api::Stats = self
            .api
            .get(&path, &[("stream", "false"), ("one-shot", "false")])
            .await?;
        let usage = |stats: &Option<docker_api::CpuStats>| {
            let stats = stats.as_ref();
            (
                stats
                    .and_then(|stats| stats.cpu_usage.as_ref())
                    .and_then(|usage| usage.total_usage)
                    .unwrap_or(0),
                stats.and_then(|stats| stats.system_cpu_usage).unwrap_or(0),
                stats.and_then(|stats| stats.online_cpus).unwrap_or(0),
            )
        };
        let (total, system, cpus) = usage(&sample.cpu_stats);
        let (previous_total, previous_system, _) = usage(&sample.precpu_stats);
        // docker stats' formula: the container's share of the host's CPU time, times cores.
        let container_delta = total.saturating_sub(previous_total) as f64;
        let system_delta = system.saturating_sub(previous_system) as f64;
        if system_delta <= 0.0 {
            return Ok(0.0);
        }
        Ok(container_delta / system_delta * f64::from(cpus.max(1)) * 100.0)
    }
}

/// Whether a failed pull is the registry's answer (no such image, or credentials missing or
/// refused) rather than an engine or network fault: the engine reports both as HTTP 500, with
/// the registry's words in the message (engine 20.10 says `no basic auth credentials` when a
/// registry asks for credentials the pull did not bring).
fn registry_refused(message: &str) -> bool {
    const REFUSALS: [&str; 7] = [
        "denied",
        "unauthorized",
        "authentication required",
        "no basic auth credentials",
        "manifest unknown",
        "not found",
        "does not exist",
    ];
    let message = message.to_lowercase();
    REFUSALS.iter().any(|refusal| message.contains(refusal))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `classify` makes of an engine answer: the variant and whether it is retried.
    fn check(status_code: u16, message: &str, expected: &str) {
        let error = classify(bollard::errors::Error::DockerResponseServerError {
            status_code,
            message: message.to_owned(),
        });
        let variant = match &error {
            Error::ImageMissing { .. } => "image-missing",
            Error::Conflict { .. } => "conflict",
            Error::NotFound { .. } => "not-found",
            Error::Invalid { .. } => "invalid",
            Error::Refused { .. } => "refused",
            Error::Unavailable { .. } => "unavailable",
            Error::Pipe { .. } => "pipe",
        };
        let retried = if error.is_transient() {
            "transient"
        } else {
            "permanent"
        };
        assert_eq!(
            format!("{variant} {retried}"),
            expected,
            "HTTP {status_code}: {message}"
        );
        assert!(
            error.to_string().contains(message),
            "the engine's message is kept: {error}"
        );
    }

    #[test]
    fn engine_answers_about_a_bad_spec_are_permanent_and_outages_transient() {
        // Messages as Docker 20.10 answers them (see tests/it/refusal_docker.rs).
        let cases: &[(u16, &str, &str)] = &[
            // A bad spec: 4xx, and the 500s that report one.
            (
                400,
                "Minimum memory limit allowed is 6MB",
                "invalid permanent",
            ),
            (
                400,
                "invalid CapAdd: unknown capability: \"CAP_NOT_A_CAP\"",
                "invalid permanent",
            ),
            (
                400,
                "failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: exec: \"/nope\": stat /nope: no such file or directory: unknown",
                "invalid permanent",
            ),
            (401, "unauthorized", "invalid permanent"),
            (
                403,
                "authorization denied by plugin opa-docker-authz: privileged containers are not allowed",
                "invalid permanent",
            ),
            (
                500,
                "error gathering device information while adding custom device \"/dev/nonexistent\": no such file or directory",
                "invalid permanent",
            ),
            (
                500,
                "failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: unable to apply caps: operation not permitted: unknown",
                "invalid permanent",
            ),
            (
                500,
                "unable to find user nosuchuser: no matching entries in passwd file",
                "invalid permanent",
            ),
            (
                500,
                "failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: error setting rlimits for ready process: error setting rlimit type 7: invalid argument: unknown",
                "invalid permanent",
            ),
            (
                500,
                "driver failed programming external connectivity on endpoint x: Bind for 0.0.0.0:80 failed: port is already allocated",
                "invalid permanent",
            ),
            (501, "not implemented", "invalid permanent"),
            // Availability: the engine or the host cannot serve right now.
            (
                500,
                "failed to create task for container: connection error: desc = \"transport: Error while dialing dial unix /run/containerd/containerd.sock: connect: connection refused\": unavailable",
                "unavailable transient",
            ),
            (
                500,
                "rpc error: code = Unavailable desc = transport is closing",
                "unavailable transient",
            ),
            (500, "context deadline exceeded", "unavailable transient"),
            (
                500,
                "Get \"https://registry-1.docker.io/v2/\": net/http: request canceled while waiting for connection (Client.Timeout exceeded while awaiting headers)",
                "unavailable transient",
            ),
            (
                500,
                "write /var/lib/docker/tmp/x: no space left on device",
                "unavailable transient",
            ),
            (
                500,
                "toomanyrequests: You have reached your pull rate limit",
                "unavailable transient",
            ),
            (502, "bad gateway", "unavailable transient"),
            (503, "the engine is starting", "unavailable transient"),
            (504, "gateway timeout", "unavailable transient"),
            // Their own meanings, retried: gone meanwhile, a name still being released.
            (404, "No such container: abc", "not-found transient"),
            // A missing network, as an engine in a swarm answers it.
            (
                500,
                "Could not attach to network t1-net: rpc error: code = NotFound desc = network t1-net not found",
                "not-found transient",
            ),
            (
                409,
                "Conflict. The container name \"/x\" is already in use",
                "conflict transient",
            ),
        ];
        for (status_code, message, expected) in cases {
            check(*status_code, message, expected);
        }
    }

    #[test]
    fn failures_to_reach_the_engine_are_transient() {
        for error in [
            bollard::errors::Error::SocketNotFoundError("/var/run/docker.sock".to_owned()),
            bollard::errors::Error::RequestTimeoutError,
            bollard::errors::Error::IOError {
                err: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
            },
            bollard::errors::Error::IOError {
                err: std::io::Error::from(std::io::ErrorKind::ConnectionReset),
            },
        ] {
            let classified = classify(error);
            assert!(
                matches!(classified, Error::Unavailable { .. }) && classified.is_transient(),
                "{classified:?}"
            );
        }
    }

    #[test]
    fn registry_refusals_are_told_from_engine_and_network_faults() {
        for refused in [
            "Head \"http://127.0.0.1:5000/v2/acme/web/manifests/1\": no basic auth credentials",
            "unauthorized: authentication required",
            "pull access denied for acme/web, repository does not exist or may require 'docker login'",
            "manifest for ghcr.io/acme/web:9 not found: manifest unknown: manifest unknown",
        ] {
            assert!(registry_refused(refused), "{refused}");
        }
        for fault in [
            "Get \"https://ghcr.io/v2/\": dial tcp: lookup ghcr.io: no such host",
            "Get \"http://127.0.0.1:5000/v2/\": dial tcp 127.0.0.1:5000: connect: connection refused",
            "context deadline exceeded",
        ] {
            assert!(!registry_refused(fault), "{fault}");
        }
    }
}
