//! The service verbs of `DockerRuntime` (Docker Swarm): `runtime::service` types to and from
//! the engine's service, task, node and config API.
//!
//! Invariants: every service and config the runtime creates carries the runtime's stamp
//! labels (the data dir), as containers do; a task's labels are the container labels of the
//! spec it runs (so a task tells which version it is); a published port is host mode (the
//! routing mesh may be unavailable); a bind of an absolute path is a bind mount, any other
//! source a named volume.

use std::collections::{BTreeMap, HashMap};

use bollard::auth::DockerCredentials;
use bollard::models::{
    ConfigSpec, EndpointPortConfig, EndpointPortConfigProtocolEnum,
    EndpointPortConfigPublishModeEnum, EndpointSpec, EndpointSpecModeEnum, HealthConfig, Limit,
    Mount, MountType, MountVolumeOptions, NetworkAttachmentConfig, NetworkCreateRequest,
    ResourcesUlimits, ServiceSpecMode, ServiceSpecModeReplicated, ServiceSpecModeReplicatedJob,
    ServiceSpecRollbackConfig, ServiceSpecRollbackConfigFailureActionEnum,
    ServiceSpecRollbackConfigOrderEnum, ServiceSpecUpdateConfig,
    ServiceSpecUpdateConfigFailureActionEnum, ServiceSpecUpdateConfigOrderEnum, TaskSpec,
    TaskSpecContainerSpec, TaskSpecContainerSpecConfigs, TaskSpecContainerSpecDnsConfig,
    TaskSpecContainerSpecFile1, TaskSpecLogDriver, TaskSpecPlacement, TaskSpecResources,
    TaskSpecRestartPolicy, TaskSpecRestartPolicyConditionEnum,
};
use bollard::query_parameters::{LogsOptionsBuilder, UpdateServiceOptions};
use futures_util::StreamExt as _;

use super::docker::classify;
use super::docker_api;
use super::service::{
    Node, NodeState, Service, ServiceMode, ServiceSpec, SwarmConfig, SwarmNode, Task, TaskState,
    UpdateOrder, UpdateState, UpdateStatus,
};
use super::{DockerRuntime, Error, RegistryAuth, Result, Swarm};

fn nanos(duration: std::time::Duration) -> i64 {
    i64::try_from(duration.as_nanos()).unwrap_or(i64::MAX)
}

fn label_filters(filter: &[(&str, &str)]) -> String {
    docker_api::filters(&BTreeMap::from([(
        "label",
        filter
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect(),
    )]))
}

/// RFC 3339 (with nanoseconds, as the engine writes it) → Unix seconds; 0 when unreadable.
fn unix(text: Option<&str>) -> i64 {
    text.and_then(|text| chrono::DateTime::parse_from_rfc3339(text).ok())
        .map_or(0, |at| at.timestamp())
}

fn credentials(auth: Option<&RegistryAuth>) -> Option<DockerCredentials> {
    auth.map(|auth| DockerCredentials {
        username: Some(auth.username.clone()),
        password: Some(auth.password.clone()),
        serveraddress: Some(auth.server.clone()),
        ..DockerCredentials::default()
    })
}

/// `src:dst[:opts]` → a mount: an absolute `src` is a bind, anything else a named volume
/// (created with `volume_labels` of its name where the task runs, when missing).
fn mount(bind: &str, volume_labels: &BTreeMap<String, BTreeMap<String, String>>) -> Option<Mount> {
    let mut parts = bind.splitn(3, ':');
    let source = parts.next()?.to_owned();
    let target = parts.next()?.to_owned();
    let read_only = parts
        .next()
        .is_some_and(|options| options.split(',').any(|option| option == "ro"));
    let labels = volume_labels.get(&source).map(|labels| MountVolumeOptions {
        labels: Some(labels.clone().into_iter().collect()),
        ..MountVolumeOptions::default()
    });
    Some(Mount {
        typ: Some(if source.starts_with('/') {
            MountType::BIND
        } else {
            MountType::VOLUME
        }),
        volume_options: labels,
        source: Some(source),
        target: Some(target),
        read_only: Some(read_only).filter(|on| *on),
        ..Mount::default()
    })
}

/// `name:ip` extra hosts → Swarm's `ip name` lines (`host-gateway` has no Swarm form).
fn hosts(extra_hosts: &[String]) -> Vec<String> {
    extra_hosts
        .iter()
        .filter_map(|entry| {
            let (name, ip) = entry.split_once(':')?;
            (ip != "host-gateway").then(|| format!("{ip} {name}"))
        })
        .collect()
}

fn non_empty<T: Clone>(items: &[T]) -> Option<Vec<T>> {
    (!items.is_empty()).then(|| items.to_vec())
}

/// The engine's service spec for `spec`, with `stamp` added to its service and container
/// labels.
pub(super) fn service_body(
    spec: &ServiceSpec,
    stamp: &BTreeMap<String, String>,
) -> bollard::models::ServiceSpec {
    let job = matches!(spec.mode, ServiceMode::ReplicatedJob);
    bollard::models::ServiceSpec {
        name: Some(spec.name.clone()),
        labels: Some(stamped(stamp, &spec.labels)),
        task_template: Some(task_template(spec, stamp)),
        mode: Some(service_mode(&spec.mode)),
        // Jobs take no update or rollback configuration.
        update_config: (!job).then(|| update_config(spec)),
        rollback_config: (!job).then(|| rollback_config(spec)),
        endpoint_spec: Some(endpoint_spec(spec)),
        ..bollard::models::ServiceSpec::default()
    }
}

/// `labels` over the agent's `stamp`, as the engine takes labels.
fn stamped(
    stamp: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> HashMap<String, String> {
    stamp
        .iter()
        .chain(labels.iter())
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect()
}

/// The task template: its container, resources, restart policy, placement, networks and logs.
fn task_template(spec: &ServiceSpec, stamp: &BTreeMap<String, String>) -> TaskSpec {
    let task = &spec.task;
    let options = &task.options;
    let job = matches!(spec.mode, ServiceMode::ReplicatedJob);
    let networks: Vec<NetworkAttachmentConfig> = task
        .networks
        .iter()
        .map(|network| NetworkAttachmentConfig {
            target: Some(network.clone()),
            aliases: non_empty(&task.aliases),
            ..NetworkAttachmentConfig::default()
        })
        .collect();
    TaskSpec {
        container_spec: Some(container_spec(spec, stamp)),
        resources: (task.nano_cpus.is_some()
            || task.memory.is_some()
            || options.pids_limit.is_some())
        .then(|| TaskSpecResources {
            limits: Some(Limit {
                nano_cpus: task.nano_cpus,
                memory_bytes: task.memory,
                pids: options.pids_limit,
            }),
            ..TaskSpecResources::default()
        }),
        restart_policy: Some(TaskSpecRestartPolicy {
            condition: Some(if job || !spec.restart_on_failure {
                TaskSpecRestartPolicyConditionEnum::NONE
            } else {
                TaskSpecRestartPolicyConditionEnum::ANY
            }),
            delay: Some(nanos(std::time::Duration::from_secs(1))),
            ..TaskSpecRestartPolicy::default()
        }),
        placement: Some(TaskSpecPlacement {
            constraints: non_empty(&spec.constraints),
            ..TaskSpecPlacement::default()
        }),
        networks: non_empty(&networks),
        log_driver: Some(TaskSpecLogDriver {
            name: Some("json-file".to_owned()),
            options: Some(
                [
                    task.log_max_size
                        .clone()
                        .map(|size| ("max-size".to_owned(), size)),
                    task.log_max_files
                        .map(|files| ("max-file".to_owned(), files.to_string())),
                ]
                .into_iter()
                .flatten()
                .collect(),
            ),
        }),
        ..TaskSpec::default()
    }
}

/// The task template's container: what `docker run` would be given.
fn container_spec(spec: &ServiceSpec, stamp: &BTreeMap<String, String>) -> TaskSpecContainerSpec {
    let task = &spec.task;
    let options = &task.options;
    TaskSpecContainerSpec {
        image: Some(task.image.clone()),
        labels: Some(stamped(stamp, &task.labels)),
        // `docker run IMAGE cmd…` replaces CMD and keeps ENTRYPOINT: Swarm's `Args`.
        command: options.entrypoint.as_ref().map(|entrypoint| {
            if entrypoint.is_empty() {
                vec![String::new()]
            } else {
                vec![entrypoint.clone()]
            }
        }),
        args: task.command.clone(),
        hostname: options.hostname.clone(),
        env: Some(task.env.clone()),
        dir: options.workdir.clone(),
        user: options.user.clone(),
        groups: non_empty(&options.group_add),
        tty: Some(task.tty).filter(|on| *on),
        read_only: Some(options.read_only).filter(|on| *on),
        mounts: Some(
            task.binds
                .iter()
                .filter_map(|bind| mount(bind, &spec.volume_labels))
                .collect(),
        ),
        stop_signal: options.stop_signal.clone(),
        stop_grace_period: Some(nanos(spec.stop_grace)),
        health_check: spec.health.as_ref().map(|health| HealthConfig {
            test: Some(health.test.clone()),
            interval: Some(nanos(health.interval)),
            timeout: Some(nanos(health.timeout)),
            retries: i64::try_from(health.retries).ok(),
            start_period: Some(nanos(health.start_period)),
            ..HealthConfig::default()
        }),
        hosts: non_empty(&hosts(&task.extra_hosts)),
        dns_config: (!options.dns.is_empty()
            || !options.dns_search.is_empty()
            || !options.dns_options.is_empty())
        .then(|| TaskSpecContainerSpecDnsConfig {
            nameservers: non_empty(&options.dns),
            search: non_empty(&options.dns_search),
            options: non_empty(&options.dns_options),
        }),
        oom_score_adj: options.oom_score_adj,
        configs: Some(
            spec.configs
                .iter()
                .map(|config| TaskSpecContainerSpecConfigs {
                    file: Some(TaskSpecContainerSpecFile1 {
                        name: Some(config.target.clone()),
                        uid: Some("0".to_owned()),
                        gid: Some("0".to_owned()),
                        mode: Some(0o444),
                    }),
                    config_id: Some(config.config_id.clone()),
                    config_name: Some(config.config_name.clone()),
                    ..TaskSpecContainerSpecConfigs::default()
                })
                .collect(),
        )
        .filter(|configs: &Vec<_>| !configs.is_empty()),
        // As every managed container: a shell or `sleep` as PID 1 still stops on SIGTERM.
        init: Some(true),
        sysctls: Some(options.sysctls.clone().into_iter().collect())
            .filter(|sysctls: &HashMap<_, _>| !sysctls.is_empty()),
        capability_add: non_empty(&task.cap_add),
        ulimits: Some(
            task.ulimits
                .iter()
                .map(|(name, soft, hard)| ResourcesUlimits {
                    name: Some(name.clone()),
                    soft: Some(*soft),
                    hard: Some(*hard),
                })
                .collect(),
        )
        .filter(|ulimits: &Vec<_>| !ulimits.is_empty()),
        ..TaskSpecContainerSpec::default()
    }
}

fn service_mode(mode: &ServiceMode) -> ServiceSpecMode {
    match *mode {
        ServiceMode::Replicated { replicas } => ServiceSpecMode {
            replicated: Some(ServiceSpecModeReplicated {
                replicas: i64::try_from(replicas).ok(),
            }),
            ..ServiceSpecMode::default()
        },
        ServiceMode::Global => ServiceSpecMode {
            global: Some(HashMap::new()),
            ..ServiceSpecMode::default()
        },
        ServiceMode::ReplicatedJob => ServiceSpecMode {
            replicated_job: Some(ServiceSpecModeReplicatedJob {
                max_concurrent: Some(1),
                total_completions: Some(1),
            }),
            ..ServiceSpecMode::default()
        },
    }
}

/// A rolling update: one task at a time, monitored for `spec.update.monitor`.
fn update_config(spec: &ServiceSpec) -> ServiceSpecUpdateConfig {
    let order = match spec.update.order {
        UpdateOrder::StartFirst => ServiceSpecUpdateConfigOrderEnum::START_FIRST,
        UpdateOrder::StopFirst => ServiceSpecUpdateConfigOrderEnum::STOP_FIRST,
    };
    ServiceSpecUpdateConfig {
        parallelism: Some(1),
        delay: Some(0),
        failure_action: Some(if spec.update.rollback_on_failure {
            ServiceSpecUpdateConfigFailureActionEnum::ROLLBACK
        } else {
            ServiceSpecUpdateConfigFailureActionEnum::PAUSE
        }),
        monitor: Some(nanos(spec.update.monitor)),
        max_failure_ratio: Some(0.0),
        order: Some(order),
    }
}

fn rollback_config(spec: &ServiceSpec) -> ServiceSpecRollbackConfig {
    let rollback_order = match spec.update.order {
        UpdateOrder::StartFirst => ServiceSpecRollbackConfigOrderEnum::START_FIRST,
        UpdateOrder::StopFirst => ServiceSpecRollbackConfigOrderEnum::STOP_FIRST,
    };
    ServiceSpecRollbackConfig {
        parallelism: Some(1),
        delay: Some(0),
        failure_action: Some(ServiceSpecRollbackConfigFailureActionEnum::PAUSE),
        monitor: Some(nanos(spec.update.monitor)),
        max_failure_ratio: Some(0.0),
        order: Some(rollback_order),
    }
}

/// The published ports, by the virtual IP.
fn endpoint_spec(spec: &ServiceSpec) -> EndpointSpec {
    EndpointSpec {
        mode: Some(EndpointSpecModeEnum::VIP),
        ports: non_empty(
            &spec
                .published
                .iter()
                .map(|port| EndpointPortConfig {
                    protocol: Some(if port.protocol == "udp" {
                        EndpointPortConfigProtocolEnum::UDP
                    } else {
                        EndpointPortConfigProtocolEnum::TCP
                    }),
                    target_port: Some(i64::from(port.target)),
                    published_port: Some(i64::from(port.published)),
                    publish_mode: Some(EndpointPortConfigPublishModeEnum::HOST),
                    ..EndpointPortConfig::default()
                })
                .collect::<Vec<_>>(),
        ),
    }
}

fn service_of(service: docker_api::Service) -> Service {
    let spec = service.spec.unwrap_or_default();
    let (container, placement) = spec.task_template.map_or((None, None), |template| {
        (template.container_spec, template.placement)
    });
    let container = container.unwrap_or_default();
    let update = service.update_status.and_then(|status| {
        let state = UpdateState::parse(status.state.as_deref()?)?;
        Some(UpdateStatus {
            state,
            message: status.message.unwrap_or_default(),
            started_at: unix(status.started_at.as_deref()),
        })
    });
    Service {
        id: service.id.unwrap_or_default(),
        name: spec.name.unwrap_or_default(),
        version: service
            .version
            .and_then(|version| version.index)
            .unwrap_or_default(),
        labels: spec.labels.unwrap_or_default(),
        task_labels: container.labels.unwrap_or_default(),
        image: container.image.unwrap_or_default(),
        replicas: spec
            .mode
            .as_ref()
            .and_then(|mode| mode.replicated.as_ref())
            .and_then(|replicated| replicated.replicas)
            .and_then(|replicas| u64::try_from(replicas).ok()),
        update,
        constraints: placement
            .and_then(|placement| placement.constraints)
            .unwrap_or_default(),
    }
}

fn task_of(task: docker_api::Task) -> Task {
    let status = task.status.unwrap_or_default();
    let container = task
        .spec
        .and_then(|spec| spec.container_spec)
        .unwrap_or_default();
    let container_status = status.container_status.unwrap_or_default();
    Task {
        id: task.id.unwrap_or_default(),
        service_id: task.service_id.unwrap_or_default(),
        slot: task.slot.and_then(|slot| u64::try_from(slot).ok()),
        node_id: task.node_id.unwrap_or_default(),
        desired: task
            .desired_state
            .as_deref()
            .map_or(TaskState::Other, TaskState::parse),
        state: status
            .state
            .as_deref()
            .map_or(TaskState::Other, TaskState::parse),
        message: status.message.unwrap_or_default(),
        error: status.err.unwrap_or_default(),
        since: unix(status.timestamp.as_deref()),
        labels: container.labels.unwrap_or_default(),
        image: container.image.unwrap_or_default(),
        container_id: container_status.container_id.unwrap_or_default(),
        exit_code: container_status.exit_code,
    }
}

/// Standard base64 (configs travel base64-encoded).
fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

impl Swarm for DockerRuntime {
    async fn swarm_node(&self) -> Result<Option<SwarmNode>> {
        let info: docker_api::Info = self.api.get("/info", &[]).await?;
        let Some(swarm) = info.swarm else {
            return Ok(None);
        };
        let active = swarm
            .local_node_state
            .is_some_and(|state| state == "active");
        if !active {
            return Ok(None);
        }
        Ok(Some(SwarmNode {
            node_id: swarm.node_id.unwrap_or_default(),
            manager: swarm.control_available.unwrap_or(false),
        }))
    }

    async fn list_nodes(&self) -> Result<Vec<Node>> {
        let nodes: Vec<docker_api::Node> = self.api.get("/nodes", &[]).await?;
        Ok(nodes
            .into_iter()
            .map(|node| Node {
                id: node.id.unwrap_or_default(),
                hostname: node
                    .description
                    .and_then(|description| description.hostname)
                    .unwrap_or_default(),
                state: match node.status.and_then(|status| status.state).as_deref() {
                    Some("ready") => NodeState::Ready,
                    Some("down") => NodeState::Down,
                    _ => NodeState::Unknown,
                },
                availability: node
                    .spec
                    .and_then(|spec| spec.availability)
                    .unwrap_or_default(),
                manager: node.manager_status.is_some(),
            })
            .collect())
    }

    async fn ensure_overlay(&self, name: &str) -> Result<()> {
        let _serial = self.network_lock.lock().await;
        if !self.network_ids(name).await?.is_empty() {
            return Ok(());
        }
        let request = NetworkCreateRequest {
            name: name.to_owned(),
            driver: Some("overlay".to_owned()),
            attachable: Some(true),
            labels: Some(self.stamp.clone().into_iter().collect()),
            ..NetworkCreateRequest::default()
        };
        match self.docker.create_network(request).await {
            Ok(_) => Ok(()),
            // Created meanwhile by another agent: fine.
            Err(error) => match classify(error) {
                Error::Conflict { .. } => Ok(()),
                other => Err(other),
            },
        }
    }

    async fn list_services(&self, filter: &[(&str, &str)]) -> Result<Vec<Service>> {
        let filters = label_filters(filter);
        let services: Vec<docker_api::Service> =
            self.api.get("/services", &[("filters", &filters)]).await?;
        Ok(services.into_iter().map(service_of).collect())
    }

    async fn create_service(
        &self,
        spec: &ServiceSpec,
        auth: Option<&RegistryAuth>,
    ) -> Result<String> {
        let body = service_body(spec, &self.stamp);
        let created = self
            .docker
            .create_service(body, credentials(auth))
            .await
            .map_err(|error| match classify(error) {
                Error::Conflict { message, .. } => Error::Conflict {
                    name: spec.name.clone(),
                    message,
                },
                other => other,
            })?;
        Ok(created.id.unwrap_or_default())
    }

    async fn update_service(
        &self,
        id: &str,
        version: u64,
        spec: &ServiceSpec,
        auth: Option<&RegistryAuth>,
    ) -> Result<()> {
        let body = service_body(spec, &self.stamp);
        let options = UpdateServiceOptions {
            version: i32::try_from(version).unwrap_or(i32::MAX),
            ..UpdateServiceOptions::default()
        };
        self.docker
            .update_service(id, body, options, credentials(auth))
            .await
            .map_err(|error| match classify(error) {
                // "update out of sequence": someone updated it since it was read.
                Error::Invalid { message } if message.contains("out of sequence") => {
                    Error::Conflict {
                        name: spec.name.clone(),
                        message,
                    }
                }
                other => other,
            })?;
        Ok(())
    }

    async fn remove_service(&self, id: &str) -> Result<()> {
        match self.docker.delete_service(id).await.map_err(classify) {
            Ok(()) | Err(Error::NotFound { .. }) => Ok(()),
            Err(other) => Err(other),
        }
    }

    async fn list_tasks(&self, service_id: &str) -> Result<Vec<Task>> {
        let filters =
            docker_api::filters(&BTreeMap::from([("service", vec![service_id.to_owned()])]));
        let tasks: Vec<docker_api::Task> = self.api.get("/tasks", &[("filters", &filters)]).await?;
        Ok(tasks
            .into_iter()
            .map(task_of)
            // The engine's filter matches id prefixes and names too.
            .filter(|task| task.service_id == service_id)
            .collect())
    }

    async fn task_logs(&self, task_id: &str, tail: usize) -> Result<String> {
        let options = LogsOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .tail(&tail.to_string())
            .build();
        let mut stream = self.docker.task_logs(task_id, Some(options));
        let mut text = String::new();
        while let Some(chunk) = stream.next().await {
            text.push_str(&String::from_utf8_lossy(
                &chunk.map_err(classify)?.into_bytes(),
            ));
        }
        Ok(text)
    }

    async fn create_config(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        data: &[u8],
    ) -> Result<String> {
        let spec = ConfigSpec {
            name: Some(name.to_owned()),
            labels: Some(
                self.stamp
                    .iter()
                    .chain(labels.iter())
                    .map(|(key, value)| (key.clone(), value.clone()))
                    .collect(),
            ),
            data: Some(base64(data)),
            ..ConfigSpec::default()
        };
        let created =
            self.docker
                .create_config(spec)
                .await
                .map_err(|error| match classify(error) {
                    Error::Conflict { message, .. } => Error::Conflict {
                        name: name.to_owned(),
                        message,
                    },
                    other => other,
                })?;
        Ok(created.id)
    }

    async fn list_configs(&self, filter: &[(&str, &str)]) -> Result<Vec<SwarmConfig>> {
        let filters = label_filters(filter);
        let configs: Vec<docker_api::Config> =
            self.api.get("/configs", &[("filters", &filters)]).await?;
        Ok(configs
            .into_iter()
            .map(|config| {
                let spec = config.spec.unwrap_or_default();
                SwarmConfig {
                    id: config.id.unwrap_or_default(),
                    name: spec.name.unwrap_or_default(),
                    labels: spec.labels.unwrap_or_default(),
                }
            })
            .collect())
    }

    async fn remove_config(&self, id: &str) -> Result<()> {
        match self.docker.delete_config(id).await.map_err(classify) {
            Ok(()) | Err(Error::NotFound { .. }) => Ok(()),
            Err(other) => Err(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_the_standard_alphabet_with_padding() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&[0xff, 0xfe]), "//4=");
    }

    #[test]
    fn binds_become_bind_or_volume_mounts() {
        let none = BTreeMap::new();
        let bind = mount("/srv/data:/data:ro", &none).unwrap_or_default();
        assert_eq!(
            (
                bind.typ,
                bind.source.as_deref(),
                bind.target.as_deref(),
                bind.read_only
            ),
            (
                Some(MountType::BIND),
                Some("/srv/data"),
                Some("/data"),
                Some(true)
            )
        );
        let labelled = BTreeMap::from([(
            "voodu-s-db-data-0".to_owned(),
            BTreeMap::from([("voodu.claim".to_owned(), "data".to_owned())]),
        )]);
        let volume = mount("voodu-s-db-data-0:/var/lib/db", &labelled).unwrap_or_default();
        assert_eq!(volume.typ, Some(MountType::VOLUME));
        assert_eq!(volume.read_only, None);
        assert_eq!(
            volume
                .volume_options
                .and_then(|options| options.labels)
                .and_then(|labels| labels.get("voodu.claim").cloned())
                .as_deref(),
            Some("data")
        );
        assert!(mount("nothing", &none).is_none());
        assert_eq!(
            hosts(&[
                "db:10.0.0.5".into(),
                "host.docker.internal:host-gateway".into()
            ]),
            ["10.0.0.5 db"]
        );
    }
}
