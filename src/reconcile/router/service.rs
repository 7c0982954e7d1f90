//! The ingress proxy under Docker Swarm (`--runtime swarm`): Caddy as a global service
//! (`voodu-caddy-<agent id>`, one task on every node) on the agents' overlay network, HTTP
//! and HTTPS published in host mode on each node (the routing mesh may be unavailable), its
//! whole config a Swarm config named after its digest and mounted at `CONFIG_TARGET`.
//! Routes resolve `tasks.<service>` of each deployment on the overlay network, every 2 s:
//! the addresses of the tasks that run (and pass their health check), over which Caddy
//! balances with the ingress's policy and checks (a service's virtual IP would need IPVS,
//! which not every host has). So the config changes only with the manifests, never with
//! task readiness.
//!
//! Invariants:
//! - a new config is a new Swarm config and a rolling update of the proxy service
//!   (stop-first: a host port cannot be shared; `failure_action rollback`): a config Caddy
//!   refuses makes Swarm roll the service back to the previous config, which keeps serving;
//!   the router then reports the rollback and does not send that config again;
//! - the routes are live once Swarm has finished the update and a task runs; until then
//!   the previous ones serve, and the router looks again every `CONVERGING`;
//! - once an update is done, the proxy's configs that neither the service nor its previous
//!   spec use (Swarm's rollback needs that one) are removed, once per config;
//! - Caddy's data (certificates) is the node-local volume `voodu-caddy-<agent id>-data`,
//!   which removing the service keeps; its admin API is off (the config is the only input);
//! - a listen address the service cannot honour (port 0, or an interface: host-mode ports
//!   are published on every interface) is refused with what to give instead.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use super::{IngressOptions, PassError, ProxyInfo, ROLE, Served, container_name};
use crate::manifest::spec::{DEFAULT_NETWORK, sha256_hex};
use crate::reconcile::context::Ctx;
use crate::reconcile::plan::SERVICE_DIGEST;
use crate::reconcile::router::routes::{HTTP_PORT, HTTPS_PORT, RouteTable, caddy_config};
use crate::runtime::service::overlay;
use crate::runtime::{
    ConfigMount, ContainerSpec, HostPort, Runtime, Service, ServiceMode, ServiceSpec, UpdateOrder,
    UpdatePolicy, UpdateState, labels,
};

/// Where the config is mounted in each task.
const CONFIG_TARGET: &str = "/etc/voodu/caddy.json";
/// How long a new proxy task must run before Swarm counts the update done.
const MONITOR: Duration = Duration::from_secs(5);
/// SIGTERM to SIGKILL for a proxy task (Caddy drains open connections).
const STOP_GRACE: Duration = Duration::from_secs(10);

/// The service proxy's state between passes.
pub(super) struct ServiceProxy {
    options: IngressOptions,
    /// The digest of the service spec last sent: when Swarm rolls it back, it is not sent
    /// again until the routes change.
    sent: Option<String>,
    /// The config whose rollout last cleared the older configs (once per config).
    cleaned_for: Option<String>,
}

/// The Swarm config holding a Caddy config whose digest is `digest`.
fn config_name(agent_id: &str, digest: &str) -> String {
    format!("{}-{}", container_name(agent_id), &digest[..12])
}

/// The node-local volume holding Caddy's data (certificates, ACME account).
pub(super) fn data_volume(agent_id: &str) -> String {
    format!("{}-data", container_name(agent_id))
}

fn owned(agent_id: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::AGENT.to_owned(), agent_id.to_owned()),
        (labels::ROLE.to_owned(), ROLE.to_owned()),
        (
            labels::CREATED_BY.to_owned(),
            labels::CREATED_BY_VALUE.to_owned(),
        ),
    ])
}

/// A listen address of the proxy (`flag`) that Swarm cannot honour, and what to give instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SwarmListenError {
    #[error(
        "{flag} {address}: under Swarm the proxy publishes a fixed port on every node; give one (0.0.0.0:80, 0.0.0.0:443, …)"
    )]
    NoFixedPort {
        flag: &'static str,
        address: SocketAddr,
    },
    #[error(
        "{flag} {address}: Swarm publishes a host-mode port on every interface of the node; give 0.0.0.0:{} (and firewall the port) instead of one address",
        address.port()
    )]
    OneInterface {
        flag: &'static str,
        address: SocketAddr,
    },
}

/// The port a listen address publishes on every node, or why it cannot be honoured.
pub(super) fn host_port(
    flag: &'static str,
    address: &SocketAddr,
) -> std::result::Result<u16, SwarmListenError> {
    let address = *address;
    if address.port() == 0 {
        return Err(SwarmListenError::NoFixedPort { flag, address });
    }
    if !address.ip().is_unspecified() {
        return Err(SwarmListenError::OneInterface { flag, address });
    }
    Ok(address.port())
}

/// The proxy service for a config already stored as the Swarm config `config`
/// (`(id, name)`), without its digest label. Pure.
pub(crate) fn proxy_service(
    options: &IngressOptions,
    agent_id: &str,
    config: (&str, &str),
) -> std::result::Result<ServiceSpec, SwarmListenError> {
    let http = host_port("--ingress-http", &options.http)?;
    let https = host_port("--ingress-https", &options.https)?;
    let name = container_name(agent_id);
    let volume = data_volume(agent_id);
    let task = ContainerSpec {
        name: name.clone(),
        image: options.image.clone(),
        command: Some(
            ["/usr/bin/caddy", "run", "--config", CONFIG_TARGET]
                .map(str::to_owned)
                .to_vec(),
        ),
        env: vec![
            "XDG_DATA_HOME=/data".to_owned(),
            "XDG_CONFIG_HOME=/config".to_owned(),
        ],
        labels: owned(agent_id),
        binds: vec![format!("{volume}:/data")],
        networks: vec![overlay(DEFAULT_NETWORK)],
        ..ContainerSpec::default()
    };
    let publish = |published: u16, target: u16| HostPort {
        published,
        target,
        protocol: "tcp".to_owned(),
    };
    Ok(ServiceSpec {
        name,
        labels: owned(agent_id),
        task,
        mode: ServiceMode::Global,
        update: UpdatePolicy {
            order: UpdateOrder::StopFirst,
            monitor: MONITOR,
            rollback_on_failure: true,
        },
        constraints: Vec::new(),
        configs: vec![ConfigMount {
            config_id: config.0.to_owned(),
            config_name: config.1.to_owned(),
            target: CONFIG_TARGET.to_owned(),
        }],
        published: vec![publish(http, HTTP_PORT), publish(https, HTTPS_PORT)],
        health: None,
        stop_grace: STOP_GRACE,
        restart_on_failure: true,
        volume_labels: BTreeMap::from([(volume, owned(agent_id))]),
    })
}

/// The Caddy config the service runs for `table`: the container proxy's, with the admin
/// API off.
pub(crate) fn service_config(table: &RouteTable) -> serde_json::Value {
    let mut config = caddy_config(table, "");
    config["admin"] = serde_json::json!({ "disabled": true });
    config
}

/// Removes this agent's proxy service and the configs it ran (its data volumes stay).
pub(super) async fn remove<R: Runtime>(runtime: &R, agent_id: &str) -> crate::runtime::Result<()> {
    let owner = [(labels::AGENT, agent_id), (labels::ROLE, ROLE)];
    for service in runtime.list_services(&owner).await? {
        tracing::info!(service = %service.name, "removing the ingress proxy service");
        runtime.remove_service(&service.id).await?;
    }
    for config in runtime.list_configs(&owner).await? {
        // A config is in use until the service's tasks are gone: the next removal takes it.
        if let Err(error) = runtime.remove_config(&config.id).await {
            tracing::debug!(config = %config.name, %error, "proxy config still in use");
        }
    }
    Ok(())
}

impl ServiceProxy {
    pub(super) fn new(options: IngressOptions) -> ServiceProxy {
        ServiceProxy {
            options,
            sent: None,
            cleaned_for: None,
        }
    }

    /// No ingress left: the service goes.
    pub(super) async fn remove_all<R: Runtime>(
        &mut self,
        ctx: &Ctx<R>,
    ) -> std::result::Result<(), PassError> {
        self.sent = None;
        remove(ctx.runtime.as_ref(), &ctx.agent_id)
            .await
            .map_err(|source| PassError::Runtime {
                name: container_name(&ctx.agent_id),
                source,
            })
    }

    /// Makes the service run `table`'s config: creates the config and the service, or
    /// updates the service, and says whether Swarm has rolled it out.
    pub(super) async fn serve<R: Runtime>(
        &mut self,
        ctx: &Ctx<R>,
        table: &RouteTable,
    ) -> std::result::Result<Served, PassError> {
        let agent_id = ctx.agent_id.as_str();
        let name = container_name(agent_id);
        let runtime = ctx.runtime.as_ref();
        let runtime_error = |source| PassError::Runtime {
            name: name.clone(),
            source,
        };
        let config =
            serde_json::to_vec(&service_config(table)).map_err(|error| PassError::Proxy {
                name: name.clone(),
                message: format!("cannot write its config: {error}"),
            })?;
        let config_name = config_name(agent_id, &sha256_hex(&config));
        let config_id = self.ensure_config(ctx, &config_name, &config).await?;
        let mut spec = proxy_service(&self.options, agent_id, (&config_id, &config_name)).map_err(
            |message| PassError::Proxy {
                name: name.clone(),
                message: message.to_string(),
            },
        )?;
        let digest = spec.digest(&[SERVICE_DIGEST]);
        spec.labels
            .insert(SERVICE_DIGEST.to_owned(), digest.clone());
        let current = the_one_service(runtime, agent_id, &name).await?;
        let info = ProxyInfo {
            container: name.clone(),
            http: Some(self.options.http.to_string()),
            https: Some(self.options.https.to_string()),
        };
        let Some(service) = current else {
            runtime
                .ensure_overlay(&overlay(DEFAULT_NETWORK))
                .await
                .map_err(runtime_error)?;
            self.ensure_image(ctx).await?;
            runtime
                .create_service(&spec, None)
                .await
                .map_err(runtime_error)?;
            tracing::info!(service = %name, image = %spec.task.image, "ingress proxy service created");
            self.sent = Some(digest);
            return Ok(Served {
                proxy: info,
                pushed: true,
                live: false,
            });
        };
        let update = service.update.as_ref();
        if update.is_some_and(|update| update.state.in_progress()) {
            return Ok(Served {
                proxy: info,
                pushed: false,
                live: false,
            });
        }
        if service.label(SERVICE_DIGEST) != Some(digest.as_str()) {
            let rolled_back = update.is_some_and(|update| {
                matches!(
                    update.state,
                    UpdateState::RollbackCompleted | UpdateState::RollbackPaused
                )
            });
            if rolled_back && self.sent.as_deref() == Some(digest.as_str()) {
                let why = update.map(|update| update.message.as_str()).unwrap_or("");
                return Err(PassError::Proxy {
                    name: name.clone(),
                    message: format!(
                        "Swarm rolled the proxy's new config back ({why}); the previous routes keep serving: see `docker service ps {name}`"
                    ),
                });
            }
            self.ensure_image(ctx).await?;
            runtime
                .update_service(&service.id, service.version, &spec, None)
                .await
                .map_err(runtime_error)?;
            tracing::info!(service = %name, ingresses = table.ingresses.len(), "ingress routes rolled out to the proxy service");
            self.sent = Some(digest);
            return Ok(Served {
                proxy: info,
                pushed: true,
                live: false,
            });
        }
        let running = self
            .tasks_running(ctx, &service, &name, config_name)
            .await?;
        Ok(Served {
            proxy: info,
            pushed: false,
            live: running,
        })
    }

    /// Whether a task of the proxy service runs (an error when none runs and the last one
    /// ended, with its reason); once one runs, configs of earlier routes are removed.
    async fn tasks_running<R: Runtime>(
        &mut self,
        ctx: &Ctx<R>,
        service: &Service,
        name: &str,
        config_name: String,
    ) -> std::result::Result<bool, PassError> {
        let runtime_error = |source| PassError::Runtime {
            name: name.to_owned(),
            source,
        };
        let runtime = ctx.runtime.as_ref();
        let tasks = runtime
            .list_tasks(&service.id)
            .await
            .map_err(runtime_error)?;
        let running = tasks
            .iter()
            .any(|task| task.state == crate::runtime::TaskState::Running);
        if !running
            && let Some(failed) = tasks
                .iter()
                .filter(|task| task.state.ended())
                .max_by_key(|task| task.since)
        {
            return Err(PassError::Proxy {
                name: name.to_owned(),
                message: format!(
                    "no task runs; the last one {}: {}; see `docker service ps {name}`",
                    failed.state.as_str(),
                    if failed.error.is_empty() {
                        &failed.message
                    } else {
                        &failed.error
                    }
                ),
            });
        }
        if running && self.cleaned_for.as_deref() != Some(config_name.as_str()) {
            self.remove_stale_configs(ctx, &config_name).await;
            self.cleaned_for = Some(config_name);
        }
        Ok(running)
    }

    /// The id of the Swarm config `name`, created with `data` when missing.
    async fn ensure_config<R: Runtime>(
        &self,
        ctx: &Ctx<R>,
        name: &str,
        data: &[u8],
    ) -> std::result::Result<String, PassError> {
        let agent_id = ctx.agent_id.as_str();
        let runtime_error = |source| PassError::Runtime {
            name: container_name(agent_id),
            source,
        };
        let owner = [(labels::AGENT, agent_id), (labels::ROLE, ROLE)];
        let find = |configs: Vec<crate::runtime::SwarmConfig>| {
            configs
                .into_iter()
                .find(|config| config.name == name)
                .map(|config| config.id)
        };
        let listed = ctx
            .runtime
            .list_configs(&owner)
            .await
            .map_err(runtime_error)?;
        if let Some(id) = find(listed) {
            return Ok(id);
        }
        match ctx
            .runtime
            .create_config(name, &owned(agent_id), data)
            .await
        {
            Ok(id) => Ok(id),
            // Made by an earlier pass that failed after it.
            Err(crate::runtime::Error::Conflict { .. }) => ctx
                .runtime
                .list_configs(&owner)
                .await
                .map_err(runtime_error)
                .and_then(|listed| {
                    find(listed).ok_or_else(|| PassError::Proxy {
                        name: container_name(agent_id),
                        message: format!("config {name} exists but is not this agent's"),
                    })
                }),
            Err(source) => Err(runtime_error(source)),
        }
    }

    /// Pulls the proxy image on this node when it has none (other nodes pull their own).
    async fn ensure_image<R: Runtime>(&self, ctx: &Ctx<R>) -> std::result::Result<(), PassError> {
        let runtime_error = |source| PassError::Runtime {
            name: container_name(&ctx.agent_id),
            source,
        };
        let present = ctx
            .runtime
            .image_present(&self.options.image)
            .await
            .map_err(runtime_error)?;
        if !present {
            tracing::info!(image = %self.options.image, "pulling the ingress proxy image");
            ctx.runtime
                .pull(&self.options.image, None)
                .await
                .map_err(runtime_error)?;
        }
        Ok(())
    }

    /// Removes the proxy's configs other than `current` (Swarm refuses one a task still
    /// uses: it goes at a later pass).
    async fn remove_stale_configs<R: Runtime>(&self, ctx: &Ctx<R>, current: &str) {
        let owner = [(labels::AGENT, ctx.agent_id.as_str()), (labels::ROLE, ROLE)];
        for config in ctx.runtime.list_configs(&owner).await.unwrap_or_default() {
            if config.name == current {
                continue;
            }
            match ctx.runtime.remove_config(&config.id).await {
                Ok(()) => tracing::info!(config = %config.name, "unused proxy config removed"),
                Err(error) => {
                    tracing::debug!(config = %config.name, %error, "proxy config still in use")
                }
            }
        }
    }
}

/// This agent's proxy service `name`, if it exists; any other service of this agent in the
/// proxy's role (a stray) is removed.
async fn the_one_service<R: Runtime>(
    runtime: &R,
    agent_id: &str,
    name: &str,
) -> std::result::Result<Option<Service>, PassError> {
    let runtime_error = |source| PassError::Runtime {
        name: name.to_owned(),
        source,
    };
    let owner = [(labels::AGENT, agent_id), (labels::ROLE, ROLE)];
    let mut current = None;
    for service in runtime.list_services(&owner).await.map_err(runtime_error)? {
        if service.name == name && current.is_none() {
            current = Some(service);
        } else {
            tracing::info!(service = %service.name, "removing a stray ingress proxy service");
            runtime
                .remove_service(&service.id)
                .await
                .map_err(runtime_error)?;
        }
    }
    Ok(current)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn options() -> IngressOptions {
        let mut options = IngressOptions::new(PathBuf::from("/var/lib/voodu/ingress"));
        options.image = "voodu-caddy:latest".to_owned();
        options
    }

    #[test]
    fn the_proxy_service_is_global_publishes_host_ports_and_mounts_its_config() {
        let spec = proxy_service(
            &options(),
            "a1b2",
            ("cfg1", "voodu-caddy-a1b2-0123456789ab"),
        )
        .expect("default ports map");
        assert_eq!(spec.name, "voodu-caddy-a1b2");
        assert_eq!(spec.mode, ServiceMode::Global);
        assert_eq!(spec.update.order, UpdateOrder::StopFirst);
        assert!(spec.update.rollback_on_failure);
        let published: Vec<(u16, u16)> = spec
            .published
            .iter()
            .map(|port| (port.published, port.target))
            .collect();
        assert_eq!(published, [(80, 80), (443, 443)]);
        assert_eq!(spec.configs.len(), 1);
        assert_eq!(spec.configs[0].target, CONFIG_TARGET);
        assert_eq!(
            spec.task.command.as_deref(),
            Some(
                ["/usr/bin/caddy", "run", "--config", CONFIG_TARGET]
                    .map(str::to_owned)
                    .as_slice()
            )
        );
        assert_eq!(spec.task.binds, ["voodu-caddy-a1b2-data:/data"]);
        assert_eq!(spec.task.networks, ["voodu0-swarm"]);
        assert_eq!(
            spec.labels.get(labels::ROLE).map(String::as_str),
            Some(ROLE)
        );
        // Another config is another spec: the digest tells them apart.
        let other = proxy_service(
            &options(),
            "a1b2",
            ("cfg2", "voodu-caddy-a1b2-ba9876543210"),
        )
        .expect("default ports map");
        assert_ne!(spec.digest(&[]), other.digest(&[]));
    }

    #[test]
    fn listen_addresses_swarm_cannot_honour_are_refused_with_what_to_give() {
        let mut loopback = options();
        loopback.http = "127.0.0.1:8080".parse().expect("address");
        let refused = proxy_service(&loopback, "a1b2", ("c", "n"))
            .expect_err("one interface")
            .to_string();
        assert!(
            refused.contains("--ingress-http 127.0.0.1:8080") && refused.contains("0.0.0.0:8080"),
            "{refused}"
        );
        let mut any = options();
        any.https = "0.0.0.0:0".parse().expect("address");
        let refused = proxy_service(&any, "a1b2", ("c", "n"))
            .expect_err("port 0")
            .to_string();
        assert!(refused.contains("--ingress-https 0.0.0.0:0"), "{refused}");
    }

    #[test]
    fn the_service_config_has_the_admin_api_off() {
        let config = service_config(&RouteTable::default());
        assert_eq!(config["admin"], serde_json::json!({ "disabled": true }));
    }
}
