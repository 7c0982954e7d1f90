//! `DockerRuntime`: the `Runtime` verbs on a real engine through bollard (unix socket,
//! `DOCKER_HOST` honoured), with the API version negotiated at connect.
//!
//! Invariant: managed containers run with `init = true`, so a busybox `sleep` as the command
//! still stops on SIGTERM instead of waiting out the grace period (CRATES.md).

use std::collections::HashMap;

use bollard::Docker;
use bollard::models::{
    ContainerCreateBody, EndpointSettings, HostConfig, NetworkConnectRequest, NetworkCreateRequest,
    NetworkingConfig, PortBinding, RestartPolicy, RestartPolicyNameEnum,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
    StopContainerOptionsBuilder,
};

use super::{Container, ContainerSpec, ContainerState, Error, Result, Runtime};

/// Seconds a container gets between SIGTERM and SIGKILL when the agent removes it.
const STOP_GRACE_SECONDS: i32 = 10;

/// A connected Docker engine.
#[derive(Clone)]
pub struct DockerRuntime {
    docker: Docker,
    /// Serialises network creation: the engine accepts two networks with one name, so two
    /// concurrent "inspect, then create" would make the name ambiguous.
    network_lock: std::sync::Arc<tokio::sync::Mutex<()>>,
}

impl DockerRuntime {
    /// Connects with the local defaults (`DOCKER_HOST` or `/var/run/docker.sock`) and
    /// negotiates the API version the engine speaks.
    pub async fn connect() -> Result<DockerRuntime> {
        let docker = Docker::connect_with_local_defaults().map_err(classify)?;
        let docker = docker.negotiate_version().await.map_err(classify)?;
        Ok(DockerRuntime {
            docker,
            network_lock: std::sync::Arc::default(),
        })
    }
}

fn classify(error: bollard::errors::Error) -> Error {
    use bollard::errors::Error as Bollard;
    match error {
        Bollard::DockerResponseServerError {
            status_code,
            message,
        } => match status_code {
            404 => Error::NotFound { what: message },
            409 => Error::Conflict {
                name: String::new(),
                message,
            },
            400 => Error::Invalid { message },
            _ => Error::Unavailable {
                message: format!("HTTP {status_code}: {message}"),
            },
        },
        other => Error::Unavailable {
            message: other.to_string(),
        },
    }
}

fn state_of(state: Option<bollard::models::ContainerSummaryStateEnum>) -> ContainerState {
    use bollard::models::ContainerSummaryStateEnum as S;
    match state {
        Some(S::CREATED) => ContainerState::Created,
        Some(S::RUNNING) => ContainerState::Running,
        Some(S::RESTARTING) => ContainerState::Restarting,
        Some(S::EXITED) | Some(S::DEAD) => ContainerState::Exited,
        _ => ContainerState::Other,
    }
}

fn restart_policy(name: &str) -> RestartPolicy {
    let name = match name {
        "no" => RestartPolicyNameEnum::NO,
        "always" => RestartPolicyNameEnum::ALWAYS,
        text if text.starts_with("on-failure") => RestartPolicyNameEnum::ON_FAILURE,
        _ => RestartPolicyNameEnum::UNLESS_STOPPED,
    };
    RestartPolicy {
        name: Some(name),
        maximum_retry_count: None,
    }
}

impl Runtime for DockerRuntime {
    async fn list(&self, filter: &[(&str, &str)]) -> Result<Vec<Container>> {
        let labels: Vec<String> = filter
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect();
        let filters = HashMap::from([("label".to_owned(), labels)]);
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let summaries = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(classify)?;
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
                labels: summary.labels.unwrap_or_default().into_iter().collect(),
                state: state_of(summary.state),
            })
            .collect())
    }

    async fn create(&self, spec: &ContainerSpec) -> Result<String> {
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
        let primary = spec.networks.first().cloned();
        let mut extra_hosts = vec!["host.docker.internal:host-gateway".to_owned()];
        extra_hosts.extend(spec.extra_hosts.iter().cloned());
        let endpoint = || EndpointSettings {
            aliases: Some(spec.aliases.clone()).filter(|aliases| !aliases.is_empty()),
            ..EndpointSettings::default()
        };
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            cmd: spec.command.clone(),
            env: Some(spec.env.clone()),
            labels: Some(spec.labels.clone().into_iter().collect()),
            exposed_ports: Some(exposed_ports).filter(|ports| !ports.is_empty()),
            host_config: Some(HostConfig {
                binds: Some(spec.binds.clone()).filter(|binds| !binds.is_empty()),
                port_bindings: Some(port_bindings).filter(|ports| !ports.is_empty()),
                restart_policy: Some(restart_policy(&spec.restart)),
                init: Some(true),
                extra_hosts: Some(extra_hosts),
                cap_add: Some(spec.cap_add.clone()).filter(|caps| !caps.is_empty()),
                network_mode: primary.clone(),
                ..HostConfig::default()
            }),
            networking_config: primary.as_ref().map(|network| NetworkingConfig {
                endpoints_config: Some(HashMap::from([(network.clone(), endpoint())])),
            }),
            ..ContainerCreateBody::default()
        };
        let options = CreateContainerOptionsBuilder::default()
            .name(&spec.name)
            .build();
        let created = self
            .docker
            .create_container(Some(options), body)
            .await
            .map_err(|error| match classify(error) {
                // Newer engines also answer 404 for a missing network at create (20.10 waits
                // for start): that is not a missing image.
                Error::NotFound { what } if what.contains("network") && !what.contains("image") => {
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
            })?;
        for network in spec.networks.iter().skip(1) {
            let request = NetworkConnectRequest {
                container: created.id.clone(),
                endpoint_config: Some(endpoint()),
            };
            if let Err(error) = self.docker.connect_network(network, request).await {
                // A container half-attached would differ from its spec: take it away again.
                let _ = self.remove(&created.id).await;
                return Err(classify(error));
            }
        }
        Ok(created.id)
    }

    async fn start(&self, id: &str) -> Result<()> {
        self.docker
            .start_container(id, None)
            .await
            .map_err(classify)
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

    async fn ensure_network(&self, name: &str) -> Result<()> {
        let _guard = self.network_lock.lock().await;
        match self
            .docker
            .inspect_network(name, None)
            .await
            .map_err(classify)
        {
            Ok(_) => return Ok(()),
            Err(Error::NotFound { .. }) => {}
            Err(other) => return Err(other),
        }
        let request = NetworkCreateRequest {
            name: name.to_owned(),
            driver: Some("bridge".to_owned()),
            ..NetworkCreateRequest::default()
        };
        match self.docker.create_network(request).await.map_err(classify) {
            Ok(_) | Err(Error::Conflict { .. }) => Ok(()),
            Err(other) => Err(other),
        }
    }
}
